/*
 * Helper tasks: work that the kernel does per page (hashing an image from
 * the page cache, faulting in and filling the restored memory) runs on
 * every CPU the restart may use, not on one.
 *
 * A helper shares the caller's memory and fd table (CLONE_VM|CLONE_FILES)
 * but is a process, not a thread: it is waited for, so its pid is free
 * again when helpers_run() returns.  Inside the job's pid namespace its pid
 * is chosen with clone3's set_tid from the top of the range, where it can
 * be none of the job's (helpers_pick_pids).
 *
 * helpers_init() and helpers_pick_pids() run before the point of no
 * return; helpers_run() uses raw system calls only.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "restart.h"
#include "sys.h"

#define MAX_HELPERS (HELPERS_MAX_TASKS - 1)
#define PID_CANDIDATES 64

static unsigned nhelpers;
static void *stack_top[MAX_HELPERS];
static int in_namespace;		/* helpers need pids of their own */
static pid_t candidates[PID_CANDIDATES];
static unsigned ncandidates;

static unsigned cpus_available(void)
{
	cpu_set_t set;

	if (sched_getaffinity(0, sizeof(set), &set))
		return 1;
	return CPU_COUNT(&set);
}

void helpers_init(void)
{
	unsigned want = cpus_available() - 1;

	if (want > MAX_HELPERS)
		want = MAX_HELPERS;
	for (nhelpers = 0; nhelpers < want; nhelpers++)
		if (!(stack_top[nhelpers] = zone_stack(ZONE_MAX_STACKS - 1 - nhelpers)))
			break;
}

static long pid_max(void)
{
	char buf[32] = "";
	int fd = open("/proc/sys/kernel/pid_max", O_RDONLY | O_CLOEXEC);
	long n;

	if (fd < 0)
		return 32768;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	return n > 0 ? atol(buf) : 32768;
}

/* From here on helpers are in the job's pid namespace. */
void helpers_pick_pids(void)
{
	in_namespace = 1;
	for (long pid = pid_max() - 1; pid > 300 && ncandidates < PID_CANDIDATES; pid--)
		if (!tree_pid_taken(pid))
			candidates[ncandidates++] = pid;
}

/* One helper running fn(arg); 0 if none could start. */
static pid_t start_helper(unsigned index, int (*fn)(void *), void *arg)
{
	struct clone_args ca;

	for (;;) {
		pid_t pid = 0;
		long r;

		if (in_namespace && !ncandidates)
			return 0;
		if (in_namespace)
			pid = candidates[--ncandidates];
		memset(&ca, 0, sizeof(ca));
		ca.flags = CLONE_VM | CLONE_FILES | CLONE_FS;
		ca.stack = (uint64_t)stack_top[index] - ZONE_STACK_SIZE;
		ca.stack_size = ZONE_STACK_SIZE;
		if (pid) {
			ca.set_tid = (uint64_t)&pid;
			ca.set_tid_size = 1;
		}
		r = clone3_run(&ca, sizeof(ca), fn, arg);
		if (r > 0)
			return r;
		if (r != -EEXIST || !pid)	/* EEXIST: another process's helper has it */
			return 0;
	}
}

/* fn(arg) on this task and every helper at once; returns when all are done.
 * fn takes its work from a shared counter, so fewer helpers only slow it. */
void helpers_run(int (*fn)(void *), void *arg)
{
	pid_t helper[MAX_HELPERS];
	unsigned started = 0;

	for (unsigned i = 0; i < nhelpers; i++)
		if ((helper[started] = start_helper(i, fn, arg)) > 0)
			started++;
	fn(arg);
	for (unsigned i = 0; i < started; i++)
		while (sys4(SYS_wait4, helper[i], 0, __WALL, 0) == -EINTR)
			;
}
