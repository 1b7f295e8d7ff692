/*
 * Work shared out to every CPU by the image writer (compression, page
 * hashes).  The writer may be a bare clone of a process whose parked
 * threads hold locks (malloc's among them): no malloc, no pthreads.  The
 * helpers are CLONE_VM tasks on scratch stacks, with no exit signal (the
 * application's SIGCHLD and wait() never see them), and none under
 * seccomp (a filter might kill the process on clone3).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/sched.h>
#include <sched.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include "shim.h"

#define MAX_TASKS 8
#define TASK_STACK (256 << 10)

long clone3_run(void *args, size_t size, int (*fn)(void *), void *arg);

struct cpu_tasks {
	unsigned count;			/* the caller is task 0 */
	char *stack[MAX_TASKS];
};

static unsigned cpus_available(void)
{
	cpu_set_t set;

	if (sched_getaffinity(0, sizeof(set), &set))
		return 1;
	return CPU_COUNT(&set);
}

struct cpu_tasks *cpu_tasks_new(int *err)
{
	struct cpu_tasks *t = scratch_map(sizeof(*t));
	unsigned want = cpus_available();

	*err = 0;
	if (!t) {
		*err = ENOMEM;
		return NULL;
	}
	t->count = want > MAX_TASKS ? MAX_TASKS : want ? want : 1;
	if (seccomp_here())
		t->count = 1;
	for (unsigned i = 1; i < t->count; i++) {
		t->stack[i] = scratch_map(TASK_STACK);
		if (!t->stack[i]) {
			*err = ENOMEM;
			cpu_tasks_free(t);
			return NULL;
		}
	}
	return t;
}

void cpu_tasks_free(struct cpu_tasks *t)
{
	if (!t)
		return;
	for (unsigned i = 1; i < MAX_TASKS; i++)
		if (t->stack[i])
			scratch_unmap(t->stack[i], TASK_STACK);
	scratch_unmap(t, sizeof(*t));
}

unsigned cpu_tasks_count(const struct cpu_tasks *t)
{
	return t ? t->count : 1;
}

/*
 * fn(arg) on up to `want` tasks at once, this one among them once it has
 * done own(own_arg) (when given); returns when all are done.  A helper
 * that cannot start (no pids) leaves its share to the others: fn takes
 * work until none is left.
 */
void cpu_tasks_run_beside(struct cpu_tasks *t, unsigned want, int (*fn)(void *), void *arg,
			  int (*own)(void *), void *own_arg)
{
	pid_t pid[MAX_TASKS];
	unsigned started = 0;

	for (unsigned i = 1; t && i < t->count && i < want; i++) {
		struct clone_args ca;
		long r;

		memset(&ca, 0, sizeof(ca));
		ca.flags = CLONE_VM | CLONE_FS | CLONE_FILES;
		ca.stack = (uint64_t)t->stack[i];
		ca.stack_size = TASK_STACK;
		r = clone3_run(&ca, sizeof(ca), fn, arg);
		if (r > 0)
			pid[started++] = r;
	}
	if (own)
		own(own_arg);
	fn(arg);
	for (unsigned i = 0; i < started; i++)
		while (syscall(SYS_wait4, pid[i], NULL, __WALL, NULL) < 0 && errno == EINTR)
			;
}

void cpu_tasks_run(struct cpu_tasks *t, unsigned want, int (*fn)(void *), void *arg)
{
	cpu_tasks_run_beside(t, want, fn, arg, NULL, NULL);
}
