/*
 * A worker thread in seccomp strict mode (only read, write, exit), or
 * with a seccomp filter, serves the main thread over pipes for the first
 * half of the steps, then exits; the main thread goes on alone and says
 * PHASE2.  A checkpoint must not kill the worker: while it lives the
 * checkpoint is refused (the job goes on untouched); after, it works.
 *
 *   seccomp_thread strict|filter [steps] [ms-per-step]
 */
#define _GNU_SOURCE
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <stddef.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include "zdtm.h"

static long steps = 300, pace = 10;
static int to_worker[2], from_worker[2];
static int strict;

static void serve(long n)
{
	for (long i = 0; i < n; i++) {
		unsigned char c;

		if (read(to_worker[0], &c, 1) != 1)
			break;
		c = (unsigned char)(c * 3 + 1);
		if (write(from_worker[1], &c, 1) != 1)
			break;
	}
}

static void *worker(void *arg)
{
	/* allows everything but uname, which fails with EPERM */
	struct sock_filter filter[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_uname, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = { sizeof(filter) / sizeof(filter[0]), filter };

	if (strict) {
		if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT) != 0)
			return (void *)1;
		serve(steps / 2);
		syscall(SYS_exit, 0);	/* strict mode: no glibc exit path */
	}
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ||
	    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
		return (void *)1;
	serve(steps / 2);
	return arg;
}

int main(int argc, char **argv)
{
	pthread_t th;
	uint64_t h = 3;
	void *ret = NULL;

	strict = argc > 1 && !strcmp(argv[1], "strict");
	if (argc > 2)
		steps = atol(argv[2]);
	if (argc > 3)
		pace = atol(argv[3]);
	zdtm_check(pipe(to_worker) == 0 && pipe(from_worker) == 0, "pipe");
	zdtm_check(pthread_create(&th, NULL, worker, NULL) == 0, "pthread_create");
	printf("READY\n");
	fflush(stdout);
	for (long s = 0; s < steps; s++) {
		unsigned char c = (unsigned char)s, got;

		if (s < steps / 2) {
			zdtm_check(write(to_worker[1], &c, 1) == 1 &&
				   read(from_worker[0], &got, 1) == 1, "worker gone at %ld", s);
			zdtm_check(got == (unsigned char)(c * 3 + 1), "worker answered %u", got);
		} else if (s == steps / 2) {
			zdtm_check(pthread_join(th, &ret) == 0 && ret == NULL, "worker failed");
			printf("PHASE2\n");
			fflush(stdout);
		}
		h = zdtm_mix(h, s);
		zdtm_pace(pace);
	}
	zdtm_hold();
	/* the worker's mode stayed the worker's: the main thread has none */
	struct utsname u;

	zdtm_check(uname(&u) == 0, "uname in the main thread: %s", strerror(errno));
	zdtm_check(prctl(PR_GET_SECCOMP) == 0, "the main thread is in seccomp mode %d",
		   prctl(PR_GET_SECCOMP));
	zdtm_pass("%016llx %s", (unsigned long long)h, strict ? "strict" : "filter");
	return 0;
}
