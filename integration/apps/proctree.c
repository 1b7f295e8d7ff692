/*
 * A process tree three levels deep: the root, two workers, a helper under
 * each worker, and a child that exits at once and is waited for only at
 * the end (a zombie across every checkpoint).
 *
 * Each step the root sends a token down a pipe to each worker (several
 * steps ahead, so bytes sit in the pipes), the worker passes it on to its
 * helper and back, and the answer comes back up.  Everyone counts in three
 * kinds of shared memory: anonymous MAP_SHARED, a /dev/shm file, and a
 * /dev/shm file unlinked while mapped.  At the end every process checks
 * its parent, process group and session, and the root checks every
 * child's exit status through waitpid().
 */
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include "zdtm.h"

#define WORKERS 2
#define AHEAD 8

struct shared {
	_Atomic long steps_done[3];	/* anon, /dev/shm, unlinked /dev/shm */
};

static struct shared *shm[3];

static void count_step(void)
{
	for (int i = 0; i < 3; i++)
		atomic_fetch_add(&shm[i]->steps_done[i], 1);
}

static void xfer(int fd, void *buf, size_t len, int writing, const char *what)
{
	ssize_t n = writing ? write(fd, buf, len) : read(fd, buf, len);

	zdtm_check(n == (ssize_t)len, "%s: %zd of %zu bytes", what, n, len);
}

/* The helper: answers each token with a mix of it. */
static void helper(int in, int out)
{
	uint64_t token;

	while (read(in, &token, sizeof(token)) == sizeof(token)) {
		token = zdtm_mix(token, 0x5eed);
		count_step();
		xfer(out, &token, sizeof(token), 1, "helper answer");
	}
	_exit(0);
}

static void check_family(pid_t want_ppid, pid_t want_pgid, pid_t want_sid, const char *who)
{
	zdtm_check(getppid() == want_ppid, "%s: parent %d, expected %d", who, getppid(), want_ppid);
	zdtm_check(getpgid(0) == want_pgid, "%s: group %d, expected %d", who, getpgid(0),
		   want_pgid);
	zdtm_check(getsid(0) == want_sid, "%s: session %d, expected %d", who, getsid(0),
		   want_sid);
}

/* A worker: tokens from the root, through its helper, back to the root. */
static void worker(int id, int in, int out, pid_t root, pid_t sid)
{
	int down[2], up[2];
	uint64_t token, hash = id;
	pid_t h, self_group;
	int status;

	if (id == 1)
		zdtm_check(setpgid(0, 0) == 0, "setpgid");	/* a group of its own */
	self_group = getpgid(0);
	zdtm_check(pipe(down) == 0 && pipe(up) == 0, "pipe");
	h = fork();
	zdtm_check(h >= 0, "fork");
	if (h == 0) {
		close(down[1]);
		close(up[0]);
		close(in);
		close(out);
		helper(down[0], up[1]);
	}
	close(down[0]);
	close(up[1]);
	while (read(in, &token, sizeof(token)) == sizeof(token)) {
		xfer(down[1], &token, sizeof(token), 1, "to helper");
		xfer(up[0], &token, sizeof(token), 0, "from helper");
		hash = zdtm_mix(hash, token);
		count_step();
		xfer(out, &hash, sizeof(hash), 1, "to root");
	}
	close(down[1]);
	zdtm_check(waitpid(h, &status, 0) == h && WIFEXITED(status) && !WEXITSTATUS(status),
		   "worker %d: helper status %x", id, status);
	check_family(root, self_group, sid, "worker");
	_exit((int)(hash & 0x7f));
}

static void *shared_map(int i, const char *dir)
{
	char path[256];
	void *p;
	int fd;

	if (i == 0)
		return mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	snprintf(path, sizeof(path), "%s/ckpt-proctree-%d-%d", dir, getpid(), i);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	zdtm_check(fd >= 0 && ftruncate(fd, 4096) == 0, "create %s", path);
	p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (i == 2)
		unlink(path);	/* mapped, but gone from /dev/shm */
	return p;
}

int main(int argc, char **argv)
{
	long steps = 200, pace = 10;
	int down[WORKERS][2], up[WORKERS][2];
	pid_t workers[WORKERS], quick, root = getpid(), sid = getsid(0);
	uint64_t token = 1, hash[WORKERS] = { 0 }, answer, total = 0;
	long sent = 0;
	int status;

	zdtm_args(argc, argv, &steps, &pace);
	for (int i = 0; i < 3; i++) {
		shm[i] = shared_map(i, "/dev/shm");
		zdtm_check(shm[i] != MAP_FAILED, "shared map %d", i);
	}
	quick = fork();
	if (quick == 0)
		_exit(42);		/* a zombie until the very end */
	for (int w = 0; w < WORKERS; w++) {
		zdtm_check(pipe(down[w]) == 0 && pipe(up[w]) == 0, "pipe");
		workers[w] = fork();
		zdtm_check(workers[w] >= 0, "fork");
		if (workers[w] == 0) {
			for (int o = 0; o < w; o++) {	/* earlier workers' pipes */
				close(down[o][1]);
				close(up[o][0]);
			}
			close(down[w][1]);
			close(up[w][0]);
			worker(w, down[w][0], up[w][1], root, sid);
		}
		close(down[w][0]);
		close(up[w][1]);
	}
	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		/* keep AHEAD tokens in each pipe */
		for (; sent < steps && sent < step + AHEAD; sent++) {
			token = zdtm_mix(token, sent);
			for (int w = 0; w < WORKERS; w++)
				xfer(down[w][1], &token, sizeof(token), 1, "to worker");
		}
		for (int w = 0; w < WORKERS; w++) {
			xfer(up[w][0], &answer, sizeof(answer), 0, "from worker");
			hash[w] = answer;
		}
		count_step();
		zdtm_pace(pace);
	}
	zdtm_hold();
	for (int w = 0; w < WORKERS; w++) {
		close(down[w][1]);
		zdtm_check(waitpid(workers[w], &status, 0) == workers[w] && WIFEXITED(status),
			   "worker %d wait", w);
		zdtm_check(WEXITSTATUS(status) == (int)(hash[w] & 0x7f),
			   "worker %d exit status %d, expected %d", w, WEXITSTATUS(status),
			   (int)(hash[w] & 0x7f));
		total = zdtm_mix(total, hash[w]);
	}
	zdtm_check(waitpid(quick, &status, 0) == quick && WIFEXITED(status) &&
		   WEXITSTATUS(status) == 42, "zombie child status %x", status);
	for (int i = 0; i < 3; i++)	/* root, 2 workers and 2 helpers per step */
		zdtm_check(atomic_load(&shm[i]->steps_done[i]) == steps * (1 + 2 * WORKERS),
			   "shared memory %d counted %ld steps", i,
			   atomic_load(&shm[i]->steps_done[i]));
	check_family(getppid(), getpgid(0), sid, "root");
	{
		char path[256];

		snprintf(path, sizeof(path), "/dev/shm/ckpt-proctree-%d-1", getpid());
		unlink(path);
	}
	zdtm_pass("%016llx", (unsigned long long)total);
	return 0;
}
