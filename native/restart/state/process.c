/* Kernel state of the process that memory does not carry. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <linux/prctl.h>
#include <linux/membarrier.h>
#include "restart.h"
#include "sys.h"
#include "linux_compat.h"

/* Before the point of no return: these may fail cleanly. */
void restore_process_early(struct image *img)
{
	const struct ckpt_process *p = img->proc;

	if (chdir(p->cwd))
		die("cannot enter the saved working directory %s: %s", p->cwd, strerror(errno));
	umask(p->umask);
	if (p->ntimers && prctl(PR_TIMER_CREATE_RESTORE_IDS, 2, 0, 0, 0) < 0)
		die("the process has POSIX timers, whose ids this kernel cannot give back "
		    "(PR_TIMER_CREATE_RESTORE_IDS: Linux 6.17 or later): %s", strerror(errno));
	if (p->membarrier) {
		long offered = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);

		if (offered < 0 || !(offered & MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED))
			die("the process registered for membarrier(), which this kernel does not "
			    "offer");
	}
}

static void restore_rlimits(const struct ckpt_process *p)
{
	for (int r = 0; r < CKPT_NRLIMITS && r < RLIM_NLIMITS; r++) {
		struct rlimit rl = { p->rlimits[r].cur, p->rlimits[r].max };

		/* a hard limit above ours cannot be raised unprivileged: keep ours */
		if (sys4(SYS_prlimit64, 0, r, &rl, NULL) < 0) {
			struct rlimit now;

			if (sys4(SYS_prlimit64, 0, r, NULL, &now) == 0) {
				rl.rlim_max = now.rlim_max;
				if (rl.rlim_cur > rl.rlim_max)
					rl.rlim_cur = rl.rlim_max;
				sys4(SYS_prlimit64, 0, r, &rl, NULL);
			}
		}
	}
}

static void restore_signals(const struct ckpt_process *p)
{
	for (int sig = 1; sig < CKPT_NSIG; sig++) {
		if (sig == SIGKILL || sig == SIGSTOP)
			continue;
		sys4(SYS_rt_sigaction, sig, &p->sigactions[sig], NULL, 8);
	}
}

static void restore_itimers(const struct ckpt_process *p)
{
	static const int which[3] = { ITIMER_REAL, ITIMER_VIRTUAL, ITIMER_PROF };

	for (int i = 0; i < 3; i++) {
		struct itimerval it = {
			{ p->itimers[i].interval_sec, p->itimers[i].interval_usec },
			{ p->itimers[i].value_sec, p->itimers[i].value_usec },
		};

		/* expired, its signal still pending: it re-arms on delivery,
		 * which now is the re-raised signal's */
		if (!it.it_value.tv_sec && !it.it_value.tv_usec)
			it.it_value = it.it_interval;
		if (it.it_value.tv_sec || it.it_value.tv_usec)
			sys3(SYS_setitimer, which[i], &it, NULL);
	}
}

/* Code, data, brk, stack, args, env and auxv of mm_struct: brk must be
 * exact or the next malloc breaks; PR_SET_MM_MAP needs no privilege. */
static void restore_mm(const struct ckpt_process *p)
{
	struct prctl_mm_map map = {
		.start_code = p->start_code, .end_code = p->end_code,
		.start_data = p->start_data, .end_data = p->end_data,
		.start_brk = p->start_brk, .brk = p->brk,
		.start_stack = p->start_stack,
		.arg_start = p->arg_start, .arg_end = p->arg_end,
		.env_start = p->env_start, .env_end = p->env_end,
		.auxv = (__u64 *)p->auxv, .auxv_size = p->auxv_words * 8,
		.exe_fd = (uint32_t)-1,
	};
	long r = sys5(SYS_prctl, PR_SET_MM, PR_SET_MM_MAP, &map, sizeof(map), 0);

	if (r < 0)
		fatal("restoring brk and the mm fields (PR_SET_MM_MAP)", r);
}

static void restore_posix_timer(const struct ckpt_posix_timer *t)
{
	struct itimerspec its = {
		{ t->interval_ns / 1000000000, t->interval_ns % 1000000000 },
		{ t->value_ns / 1000000000, t->value_ns % 1000000000 },
	};
	struct sigevent ev;
	int id = t->id;		/* the id it asks for */
	long r;

	memset(&ev, 0, sizeof(ev));
	ev.sigev_value.sival_ptr = (void *)t->sigval;
	ev.sigev_signo = t->signo;
	ev.sigev_notify = t->notify;
	if (t->notify == SIGEV_THREAD_ID)
		ev._sigev_un._tid = t->tid;
	r = sys3(SYS_timer_create, t->clockid, (long)&ev, (long)&id);
	if (r < 0)
		fatal("recreating a POSIX timer", r);
	if (id != t->id)
		fatal("recreating a POSIX timer with its id", -EBUSY);
	if (t->value_ns > 0) {
		r = sys4(SYS_timer_settime, id, 0, (long)&its, 0);
		if (r < 0)
			fatal("arming a POSIX timer again", r);
	}
}

/*
 * POSIX timers (saved by read_posix_timers, native/shim/state/process.c),
 * each with its id, which the application holds.  Once the threads exist:
 * a timer may signal one of them.  Their signals wait: every thread
 * blocks all of them until it resumes.
 */
void restore_posix_timers(const struct ckpt_process *p)
{
	long r;

	if (!p->ntimers)
		return;
	r = sys2(SYS_prctl, PR_TIMER_CREATE_RESTORE_IDS, 1);
	if (r < 0)
		fatal("giving POSIX timers their ids back (PR_TIMER_CREATE_RESTORE_IDS, "
		      "Linux 6.17 or later)", r);
	for (unsigned i = 0; i < p->ntimers && i < CKPT_MAX_TIMERS; i++)
		restore_posix_timer(&p->timers[i]);
	sys2(SYS_prctl, PR_TIMER_CREATE_RESTORE_IDS, 0);
}

/* The one timer that signals sig to the process (tid 0) or to the thread
 * tid, or NULL. */
static const struct ckpt_posix_timer *timer_of_signal(const struct ckpt_process *p, int sig,
						      int32_t tid)
{
	int notify = tid ? SIGEV_THREAD_ID : SIGEV_SIGNAL;
	const struct ckpt_posix_timer *found = NULL;

	for (unsigned i = 0; i < p->ntimers && i < CKPT_MAX_TIMERS; i++) {
		const struct ckpt_posix_timer *t = &p->timers[i];

		if (t->notify != notify || t->signo != sig || (tid && t->tid != tid))
			continue;
		if (found)
			return NULL;
		found = t;
	}
	return found;
}

/* A pending signal of timer t, with the siginfo a handler may look at (and
 * glibc's SIGEV_THREAD helper needs: anything else ends that thread). */
static void queue_timer_signal(long pid, long tid, const struct ckpt_posix_timer *t)
{
	siginfo_t si;

	memset(&si, 0, sizeof(si));
	si.si_signo = t->signo;
	si.si_code = SI_TIMER;
	si.si_timerid = t->id;
	si.si_value.sival_ptr = (void *)t->sigval;
	if (tid)
		sys4(SYS_rt_tgsigqueueinfo, pid, tid, t->signo, (long)&si);
	else
		sys3(SYS_rt_sigqueueinfo, pid, t->signo, (long)&si);
}

static int never_pending(int sig)
{
	return sig == SIGKILL || sig == SIGSTOP || sig == CKPT_PARKING_SIGNAL;
}

/* The siginfos saved of the queue of thread tid, or of the process (tid
 * 0), or NULL (queued_signals.c, native/shim). */
static const struct ckpt_signal_queue *saved_queue(const struct image *img, int32_t tid)
{
	for (unsigned i = 0; i < img->nsignal_queues; i++)
		if (img->signal_queues[i]->tid == tid)
			return img->signal_queues[i];
	return NULL;
}

static const siginfo_t *queue_entry(const struct ckpt_signal_queue *q, uint32_t i)
{
	return (const siginfo_t *)(q + 1) + i;
}

static int saved_with_siginfo(const struct ckpt_signal_queue *q, int sig)
{
	for (uint32_t i = 0; q && i < q->count; i++)
		if (queue_entry(q, i)->si_signo == sig)
			return 1;
	return 0;
}

/*
 * The signals pending in one queue come back pending (every thread
 * blocks them all until it resumes), oldest first, with their siginfo:
 * queued by the thread itself, or for the process by the main thread,
 * as the kernel asks of whoever queues a kill()'s or its own siginfo.
 * A signal saved without one (a timer's, SIGALRM) is sent again: a
 * timer's with the siginfo a handler may look at.
 */
static void restore_queue(const struct image *img, uint64_t pending, int32_t tid)
{
	const struct ckpt_signal_queue *q = saved_queue(img, tid);
	long pid = sys0(SYS_getpid), r;

	for (uint32_t i = 0; q && i < q->count; i++) {
		const siginfo_t *si = queue_entry(q, i);

		if (never_pending(si->si_signo))
			continue;
		r = tid ? sys4(SYS_rt_tgsigqueueinfo, pid, tid, si->si_signo, (long)si) :
			  sys3(SYS_rt_sigqueueinfo, pid, si->si_signo, (long)si);
		if (r < 0)
			fatal("queueing a pending signal again", r);
	}
	for (int sig = 1; sig < CKPT_NSIG; sig++) {
		const struct ckpt_posix_timer *t = timer_of_signal(img->proc, sig, tid);

		if (!((pending >> (sig - 1)) & 1) || never_pending(sig) ||
		    saved_with_siginfo(q, sig))
			continue;
		if (t)
			queue_timer_signal(pid, tid, t);
		else if (tid)
			sys3(SYS_tgkill, pid, tid, sig);
		else
			sys2(SYS_kill, pid, sig);
	}
}

/* Run by the main thread before it makes the others. */
static void restore_pending(const struct image *img)
{
	restore_queue(img, img->proc->shared_pending, 0);
}

/* Signals pending for one thread alone: run by that thread, in become()
 * (threads.c). */
void restore_thread_pending(const struct image *img, const struct ckpt_thread *thread)
{
	restore_queue(img, thread->pending, thread->tid);
}

/* Saved by read_prctl_attributes (native/shim/state/process.c).  Dumpable
 * only as 0 or 1 (2, suid_dumpable's, cannot be asked for). */
static void restore_prctl_attributes(const struct ckpt_process *p)
{
	sys5(SYS_prctl, PR_SET_THP_DISABLE, p->thp_disable, 0, 0, 0);
	sys5(SYS_prctl, PR_SET_CHILD_SUBREAPER, p->child_subreaper, 0, 0, 0);
	if (p->dumpable == 0 || p->dumpable == 1)
		sys5(SYS_prctl, PR_SET_DUMPABLE, p->dumpable, 0, 0, 0);
	/* memory-deny-write-execute: the code is mapped by now, and it cannot
	 * be taken back once set */
	if (p->mdwe && sys5(SYS_prctl, PR_SET_MDWE, p->mdwe, 0, 0, 0) < 0)
		warn("memory-deny-write-execute could not be set again");
}

/* Pair of read_membarrier (native/shim/state/process.c). */
static void restore_membarrier(const struct ckpt_process *p)
{
	static const struct {
		uint32_t bit;
		int cmd;
	} registrations[] = {
		{ CKPT_MEMBARRIER_PRIVATE_EXPEDITED, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED },
		{ CKPT_MEMBARRIER_SYNC_CORE, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE },
		{ CKPT_MEMBARRIER_RSEQ, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ },
	};

	for (unsigned i = 0; i < sizeof(registrations) / sizeof(registrations[0]); i++) {
		long r;

		if ((p->membarrier & registrations[i].bit) &&
		    (r = sys3(SYS_membarrier, registrations[i].cmd, 0, 0)) < 0)
			fatal("registering for membarrier() again", r);
	}
}

void restore_process_late(struct image *img, const struct restart_args *args)
{
	const struct ckpt_process *p = img->proc;
	struct ckpt_restart_info *info = (void *)img->hdr.restart_info;

	restore_mm(p);
	restore_prctl_attributes(p);
	restore_membarrier(p);
	restore_rlimits(p);
	restore_signals(p);
	restore_itimers(p);
	restore_pending(img);
	aio_submit_again(img);
	/* tell the shim where its new coordinator is */
	info->generation++;
	memset(info->coord_path, 0, sizeof(info->coord_path));
	memset(info->job_id, 0, sizeof(info->job_id));
	for (size_t i = 0; args->coord[i] && i < sizeof(info->coord_path) - 1; i++)
		info->coord_path[i] = args->coord[i];
	for (size_t i = 0; args->job_id[i] && i < sizeof(info->job_id) - 1; i++)
		info->job_id[i] = args->job_id[i];
	info->naddr_moves = addr_map_get(info->addr_moves, CKPT_ADDR_MOVES_MAX);
}
