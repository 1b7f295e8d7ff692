/*
 * A parent's view of its stopped children, kept across a restart.
 *
 * A stopped child is checkpointed stopped (the coordinator thaws it
 * through a tracer, ckpt/thaw.py) and stops itself again at the end of its
 * restart, which tells the parent anew: a stop it can collect with
 * waitpid(WUNTRACED), and a SIGCHLD.  At SUSPEND the parent notes which
 * of its children are stopped, whether it had collected their stop, and
 * whether SIGCHLD was pending; at the restart's RESUME, before its
 * application runs, it waits for each child's new stop and takes back what
 * it had not seen before: the stop it had already collected, the SIGCHLD
 * it had already had.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include "shim.h"

#define MAX_STOPPED 64
#define RESTOP_WAIT_MS 5000

static struct {
	pid_t pid;
	int collected;			/* the parent had taken its stop */
} stopped[MAX_STOPPED];
static unsigned nstopped;
static int sigchld_was_pending;

static int child_is_stopped(pid_t pid)
{
	struct ckpt_proc_stat st;

	/* 't': the coordinator's tracer holds it for this checkpoint */
	return !ckpt_stat_read_pid(pid, &st) && (st.state == 'T' || st.state == 't');
}

/* Its stop is there to be collected (nothing is consumed). */
static int stop_waitable(pid_t pid)
{
	siginfo_t si;

	memset(&si, 0, sizeof(si));
	return waitid(P_PID, pid, &si, WSTOPPED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid;
}

static void note_children_of(const char *tid)
{
	char path[96], buf[4096], *p, *end;
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/self/task/%s/children", tid);
	n = ckpt_read_file(path, buf, sizeof(buf) - 1);
	if (n <= 0)
		return;
	buf[n] = '\0';
	for (p = buf; nstopped < MAX_STOPPED; p = end) {
		pid_t pid = strtol(p, &end, 10);

		if (end == p)
			break;
		if (child_is_stopped(pid)) {
			stopped[nstopped].pid = pid;
			stopped[nstopped].collected = !stop_waitable(pid);
			nstopped++;
		}
	}
}

static int note_task(int dfd, const char *name, uint64_t ino, void *arg)
{
	if (name[0] >= '1' && name[0] <= '9')
		note_children_of(name);
	return 0;
}

void stopped_children_note(void)
{
	uint64_t pending = 0;

	nstopped = 0;
	ckpt_dir_walk("/proc/self/task", note_task, NULL);
	syscall(SYS_rt_sigpending, &pending, sizeof(pending));
	sigchld_was_pending = (pending >> (SIGCHLD - 1)) & 1;
}

/* Until pid's new stop can be collected; 0 if it never comes. */
static int wait_restop(pid_t pid)
{
	struct timespec ms = { 0, 1000000 };

	for (int i = 0; i < RESTOP_WAIT_MS; i++) {
		if (stop_waitable(pid))
			return 1;
		nanosleep(&ms, NULL);
	}
	return 0;
}

void stopped_children_restore(void)
{
	int told = 0;

	for (unsigned i = 0; i < nstopped; i++) {
		siginfo_t si;

		if (!wait_restop(stopped[i].pid)) {
			ckpt_warn("stopped child %d did not stop again after the restart",
				  stopped[i].pid);
			continue;
		}
		told = 1;
		if (stopped[i].collected)	/* taken before: not twice */
			waitid(P_PID, stopped[i].pid, &si, WSTOPPED | WNOHANG);
	}
	if (told && !sigchld_was_pending) {
		uint64_t chld = 1ULL << (SIGCHLD - 1);
		struct timespec none = { 0, 0 };
		siginfo_t si;

		syscall(SYS_rt_sigtimedwait, &chld, &si, &none, sizeof(chld));
	}
	nstopped = 0;
}
