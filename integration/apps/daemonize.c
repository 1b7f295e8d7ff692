/*
 * Children of every kind a launcher makes: one by vfork() and exec (a
 * helper run from this same program), a daemon by the classic double
 * fork (fork, setsid, fork, the middle process exits), so that it lives
 * in a session whose leader is gone and has a parent outside the job, and
 * an orphan (fork, fork, the middle process exits) left in this session
 * and process group.  Each does paced work and sends a tagged result up a
 * pipe; the daemon and the orphan check that their session, group and pid
 * never changed; the parent checks the results and the helper's status.
 */
#define _GNU_SOURCE
#include <string.h>
#include <sys/wait.h>
#include "zdtm.h"

enum { HELPER = 1, DAEMON = 2, ORPHAN = 3 };

static long steps = 300, pace = 10;

static uint64_t work(uint64_t seed)
{
	return zdtm_steps_hash(seed, steps, pace);
}

static uint64_t expected(uint64_t seed)
{
	return zdtm_steps_hash(seed, steps, 0);
}

static void send_result(int fd, uint64_t tag, uint64_t value)
{
	uint64_t msg[2] = { tag, value };

	if (write(fd, msg, sizeof(msg)) != sizeof(msg))
		_exit(100);
}

static void grandchild_main(int fd, uint64_t tag, pid_t middle)
{
	pid_t pid = getpid(), sid = getsid(0), pgid = getpgid(0), ppid;
	uint64_t value;

	while ((ppid = getppid()) == middle)	/* adopted once the middle ends */
		zdtm_pace(1);
	value = work(tag);
	if (getpid() != pid || getsid(0) != sid || getpgid(0) != pgid || getppid() != ppid) {
		fprintf(stderr, "FAIL %s: pid %d sid %d pgid %d ppid %d, were %d %d %d %d\n",
			tag == DAEMON ? "daemon" : "orphan", (int)getpid(), (int)getsid(0),
			(int)getpgid(0), (int)getppid(), (int)pid, (int)sid, (int)pgid, (int)ppid);
		value = 0;
	}
	send_result(fd, tag, value);
	_exit(0);
}

/* fork, [setsid,] fork: the middle process ends at once */
static void start_grandchild(int fd, uint64_t tag)
{
	int status = 0;
	pid_t middle = fork();

	zdtm_check(middle >= 0, "fork");
	if (middle == 0) {
		pid_t self = getpid();

		if (tag == DAEMON && setsid() < 0)
			_exit(101);
		if (fork() == 0)
			grandchild_main(fd, tag, self);
		_exit(0);
	}
	zdtm_check(waitpid(middle, &status, 0) == middle && WIFEXITED(status) &&
		   WEXITSTATUS(status) == 0, "middle process: status %#x", status);
}

int main(int argc, char **argv)
{
	char steps_arg[32], pace_arg[32], fd_arg[32];
	uint64_t got[4] = { 0, 0, 0, 0 };
	int fds[2], status = 0;
	pid_t helper;

	if (argc == 5 && !strcmp(argv[1], "--helper")) {
		steps = atol(argv[2]);
		pace = atol(argv[3]);
		send_result(atoi(argv[4]), HELPER, work(HELPER));
		return 7;
	}
	zdtm_args(argc, argv, &steps, &pace);
	zdtm_check(pipe(fds) == 0, "pipe");
	snprintf(steps_arg, sizeof(steps_arg), "%ld", steps);
	snprintf(pace_arg, sizeof(pace_arg), "%ld", pace);
	snprintf(fd_arg, sizeof(fd_arg), "%d", fds[1]);
	helper = vfork();
	if (helper == 0) {
		execl("/proc/self/exe", argv[0], "--helper", steps_arg, pace_arg, fd_arg,
		      (char *)NULL);
		_exit(127);
	}
	zdtm_check(helper > 0, "vfork");
	start_grandchild(fds[1], DAEMON);
	start_grandchild(fds[1], ORPHAN);
	printf("READY\n");
	fflush(stdout);
	for (int i = 0; i < 3; i++) {
		uint64_t msg[2];

		zdtm_check(read(fds[0], msg, sizeof(msg)) == sizeof(msg), "read result %d", i);
		zdtm_check(msg[0] >= HELPER && msg[0] <= ORPHAN, "bad tag %llu",
			   (unsigned long long)msg[0]);
		got[msg[0]] = msg[1];
	}
	/* the children's work is done; the helper waits to be reaped */
	zdtm_hold();
	zdtm_check(got[HELPER] == expected(HELPER), "helper sent %llx",
		   (unsigned long long)got[HELPER]);
	zdtm_check(got[DAEMON] == expected(DAEMON), "daemon sent %llx",
		   (unsigned long long)got[DAEMON]);
	zdtm_check(got[ORPHAN] == expected(ORPHAN), "orphan sent %llx",
		   (unsigned long long)got[ORPHAN]);
	zdtm_check(waitpid(helper, &status, 0) == helper && WIFEXITED(status) &&
		   WEXITSTATUS(status) == 7, "helper: status %#x", status);
	zdtm_pass("%016llx", (unsigned long long)(got[HELPER] ^ got[DAEMON] ^ got[ORPHAN]));
	return 0;
}
