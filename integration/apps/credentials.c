/*
 * A root program that changed its group credentials, as a service does
 * before it serves: supplementary groups of its own, and real, effective,
 * saved and filesystem group ids that all differ.  Two threads: each must
 * have them all back (credentials are a thread's own in the kernel).  A
 * file it creates at the end gets its filesystem group, a real check that
 * the kernel, not only getresgid(), sees them.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include "zdtm.h"

static const gid_t groups[] = { 4242, 4343, 4444, 4545 };
#define REAL 4601
#define EFFECTIVE 4602
#define SAVED 4603
#define FILESYSTEM 4604

static void credentials_are_back(const char *who)
{
	gid_t r, e, s, got[16];
	int n = getgroups(16, got);

	zdtm_check(n == (int)(sizeof(groups) / sizeof(groups[0])) &&
		   !memcmp(got, groups, sizeof(groups)), "%s: %d supplementary groups, first %d",
		   who, n, n > 0 ? (int)got[0] : -1);
	zdtm_check(getresgid(&r, &e, &s) == 0 && r == REAL && e == EFFECTIVE && s == SAVED,
		   "%s: group ids %u %u %u", who, r, e, s);
	zdtm_check(setfsgid(-1) == FILESYSTEM, "%s: filesystem group %d", who, setfsgid(-1));
}

static long steps = 100, pace = 10;

static void *second_thread(void *arg)
{
	(void)arg;
	zdtm_steps_hash(0, steps, pace);
	credentials_are_back("second thread");
	return NULL;
}

int main(int argc, char **argv)
{
	char path[64];
	struct stat st;
	pthread_t t;
	uint64_t hash;
	int fd;

	zdtm_args(argc, argv, &steps, &pace);
	zdtm_check(getuid() == 0, "needs root");
	/* glibc makes every thread take each change */
	zdtm_check(setgroups(sizeof(groups) / sizeof(groups[0]), groups) == 0 &&
		   setresgid(REAL, EFFECTIVE, SAVED) == 0, "setting groups: %s", strerror(errno));
	setfsgid(FILESYSTEM);
	zdtm_check(pthread_create(&t, NULL, second_thread, NULL) == 0, "pthread_create");
	printf("READY\n");
	fflush(stdout);
	hash = zdtm_steps_hash(0, steps, pace);
	zdtm_hold();
	pthread_join(t, NULL);
	credentials_are_back("main thread");
	snprintf(path, sizeof(path), "/tmp/credentials-%d", getpid());
	fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0600);
	zdtm_check(fd >= 0 && fstat(fd, &st) == 0, "creating %s: %s", path, strerror(errno));
	unlink(path);
	zdtm_check(st.st_gid == FILESYSTEM, "a new file's group is %u", st.st_gid);
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
