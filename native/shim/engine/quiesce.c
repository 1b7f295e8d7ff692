/*
 * Parking the application's threads.
 *
 * The checkpoint thread sends CKPT_SIGNAL to every other thread with
 * rt_tgsigqueueinfo, carrying the index of the thread's slot.  The handler
 * records the thread's kernel state (TLS base, clear_child_tid, rseq area,
 * signal mask), saves its callee-saved registers and waits on a futex until
 * the resume generation changes.  The interrupted user context stays in the
 * signal frame on the thread's own stack, so the image holds it for free.
 *
 * At restart ckpt-restart recreates each thread and resumes it at the save
 * point inside this handler (ckpt_save_context returns 1): the thread marks
 * itself restored and waits again, and returns from the handler (sigreturn
 * restores the interrupted context) when the coordinator says RESUME.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <linux/ioprio.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/rseq.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <asm/prctl.h>
#include <linux/capability.h>
#include "shim.h"

enum park_state {
	SLOT_SIGNALLED = 1,
	SLOT_PARKED = 2,
	SLOT_RESTORED = 3,
	SLOT_GONE = 4,
};

static struct parked_thread slots[CKPT_MAX_THREADS];
static unsigned nslots;
static _Atomic unsigned resume_gen;	/* parked threads wait on this */
static _Atomic unsigned state_changes;	/* the checkpoint thread waits on this */

static long futex(void *addr, int op, unsigned val, const struct timespec *ts)
{
	return syscall(SYS_futex, addr, op, val, ts, NULL, 0);
}

static void slot_set_state(struct parked_thread *t, int state)
{
	atomic_store(&t->state, state);
	atomic_fetch_add(&state_changes, 1);
	futex(&state_changes, FUTEX_WAKE_PRIVATE, INT_MAX, NULL);
}

/* The thread's own scheduling, I/O priority, personality, timer slack and
 * no_new_privs: restored by restore_scheduling (native/restart/threads.c).
 * Raw calls: this runs in a signal handler. */
static void fill_scheduling(struct ckpt_thread *rec)
{
	struct sched_param sp = { 0 };
	long prio = syscall(SYS_getpriority, PRIO_PROCESS, 0);	/* 20 - nice */
	long slack;
	int sig = 0;

	rec->nice = prio > 0 ? 20 - (int)prio : 0;
	rec->policy = syscall(SYS_sched_getscheduler, 0);
	if (syscall(SYS_sched_getparam, 0, &sp) == 0)
		rec->sched_priority = sp.sched_priority;
	if (syscall(SYS_prctl, PR_GET_PDEATHSIG, &sig, 0, 0, 0) == 0)
		rec->pdeath_signal = sig;
	rec->no_new_privs = syscall(SYS_prctl, PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1;
	/* fails (all 0: not read) where the kernel has more than 1024 CPUs */
	syscall(SYS_sched_getaffinity, 0, sizeof(rec->cpu_affinity), rec->cpu_affinity);
	rec->personality = syscall(SYS_personality, 0xffffffff);	/* asks, changes nothing */
	slack = syscall(SYS_prctl, PR_GET_TIMERSLACK, 0, 0, 0, 0);
	rec->timer_slack_ns = slack > 0 && slack <= UINT32_MAX ? slack : 0;
	rec->ioprio = syscall(SYS_ioprio_get, IOPRIO_WHO_PROCESS, 0);
	if (rec->ioprio < 0)
		rec->ioprio = IOPRIO_PRIO_VALUE(IOPRIO_CLASS_NONE, 0);
}

/* The thread's capability sets and securebits: restored by restore_capabilities
 * (native/restart/threads.c).  Raw prctl, as above; the loops end at the
 * kernel's last capability, where prctl says EINVAL. */
static void fill_capabilities(struct ckpt_thread *rec)
{
	struct __user_cap_header_struct hdr = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];
	long r;

	rec->caps_read = 0;
	if (syscall(SYS_capget, &hdr, data))
		return;
	rec->cap_effective = data[0].effective | (uint64_t)data[1].effective << 32;
	rec->cap_permitted = data[0].permitted | (uint64_t)data[1].permitted << 32;
	rec->cap_inheritable = data[0].inheritable | (uint64_t)data[1].inheritable << 32;
	rec->cap_ambient = rec->cap_bounding = 0;
	for (int cap = 0; cap < 64; cap++) {
		r = syscall(SYS_prctl, PR_CAPBSET_READ, cap, 0, 0, 0);
		if (r < 0)
			break;
		rec->cap_bounding |= (uint64_t)r << cap;
		if (syscall(SYS_prctl, PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, cap, 0, 0) == 1)
			rec->cap_ambient |= 1ULL << cap;
	}
	r = syscall(SYS_prctl, PR_GET_SECUREBITS, 0, 0, 0, 0);
	rec->securebits = r > 0 ? r : 0;
	rec->caps_read = 1;
}

/* Restored by restore_credentials (native/restart/threads.c). */
static void fill_credentials(struct ckpt_thread *rec)
{
	uint32_t groups[CKPT_MAX_GROUPS];
	long n;

	syscall(SYS_getresgid, &rec->gids[0], &rec->gids[1], &rec->gids[2]);
	rec->gids[3] = syscall(SYS_setfsgid, -1);	/* -1: only says which */
	n = syscall(SYS_getgroups, CKPT_MAX_GROUPS, groups);
	if (n < 0)	/* EINVAL: more than CKPT_MAX_GROUPS */
		n = syscall(SYS_getgroups, 0, NULL);
	rec->ngroups = n > 0 ? n : 0;
	if (n > 0 && n <= CKPT_MAX_GROUPS)
		memcpy(rec->groups, groups, n * sizeof(groups[0]));
}

/* The checkpoint thread, after its fixups of a restart, takes back the
 * capabilities it had (ckpt-restart left it its own for them).  Its
 * bounding and ambient sets only matter to an execve, which it never
 * does. */
int drop_restart_capabilities(const struct ckpt_thread *rec)
{
	struct __user_cap_header_struct hdr = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {
		{ (uint32_t)rec->cap_effective, (uint32_t)rec->cap_permitted,
		  (uint32_t)rec->cap_inheritable },
		{ (uint32_t)(rec->cap_effective >> 32), (uint32_t)(rec->cap_permitted >> 32),
		  (uint32_t)(rec->cap_inheritable >> 32) },
	};

	if (!rec->caps_read)
		return 0;
	return syscall(SYS_capset, &hdr, data) ? errno : 0;
}

void thread_fill_record(struct ckpt_thread *rec)
{
	uint64_t fs = 0, ctid = 0, mask = 0;

	rec->tid = syscall(SYS_gettid);
	syscall(SYS_arch_prctl, ARCH_GET_FS, &fs);
	rec->fs_base = fs;
	/* raw: the shim's prctl() may call dlsym, unsafe in a signal handler */
	if (syscall(SYS_prctl, PR_GET_TID_ADDRESS, &ctid, 0, 0, 0) == 0)
		rec->clear_child_tid = ctid;
	rec->rseq_addr = 0;
	if (__rseq_size && fs) {	/* glibc 2.35 or later */
		uint64_t area = fs + __rseq_offset;
		int32_t cpu_id = *(volatile int32_t *)(area + 4);

		if (cpu_id != RSEQ_CPU_ID_REGISTRATION_FAILED) {
			rec->rseq_addr = area;
			/* glibc registers the original 32-byte struct rseq */
			rec->rseq_len = __rseq_size > 32 ? __rseq_size : 32;
			rec->rseq_sig = RSEQ_SIG;
		}
	}
	if (!rec->rseq_addr)
		rseq_own_area(rec);	/* one the program registered itself */
	syscall(SYS_get_robust_list, 0, &rec->robust_list, &rec->robust_len);
	syscall(SYS_rt_sigprocmask, SIG_BLOCK, NULL, &mask, sizeof(mask));
	rec->sigmask = mask;
	rec->flags = rec->tid == getpid() ? CKPT_THREAD_LEADER : 0;
	syscall(SYS_prctl, PR_GET_NAME, rec->comm, 0, 0, 0);
	/* for it alone; restored by restore_thread_pending (native/restart/state/process.c) */
	rec->pending = queued_signals_own_pending();
	fill_scheduling(rec);
	fill_capabilities(rec);
	fill_credentials(rec);
}

/*
 * Work that must be done in the application's fd table, which the
 * checkpoint thread does not share (checkpointer.c): a parked thread of
 * the application does it, woken without being resumed.  Raw calls only,
 * as in any signal handler.
 */
static void (*_Atomic app_work)(void *);
static void *app_work_arg;
static _Atomic unsigned app_work_slot, app_work_done;

static void run_app_work(unsigned idx)
{
	void (*fn)(void *) = atomic_load(&app_work);

	if (!fn || atomic_load(&app_work_slot) != idx)
		return;
	fn(app_work_arg);
	atomic_store(&app_work, NULL);
	atomic_fetch_add(&app_work_done, 1);
	futex(&app_work_done, FUTEX_WAKE_PRIVATE, INT_MAX, NULL);
}

#define APP_WORK_TIMEOUT_MS 5000

int quiesce_run_in_app(void (*fn)(void *), void *arg)
{
	unsigned done = atomic_load(&app_work_done);
	struct timespec nap = { 0, 10 * 1000000 };
	int idx = -1;

	/* the main thread if it can: others may run under seccomp filters of
	 * their own, or on small stacks */
	for (unsigned i = 0; i < nslots && (idx < 0 || slots[idx].rec.tid != getpid()); i++)
		if (atomic_load(&slots[i].state) == SLOT_PARKED ||
		    atomic_load(&slots[i].state) == SLOT_RESTORED)
			if (idx < 0 || slots[i].rec.tid == getpid())
				idx = i;
	if (idx < 0)
		return ESRCH;
	app_work_arg = arg;
	atomic_store(&app_work_slot, idx);
	atomic_store(&app_work, fn);
	/* woken again and again: it may have checked for work just before
	 * this and gone to sleep after our wake */
	for (int waited = 0; atomic_load(&app_work_done) == done; waited += 10) {
		if (waited >= APP_WORK_TIMEOUT_MS) {
			atomic_store(&app_work, NULL);
			return ETIMEDOUT;
		}
		futex(&resume_gen, FUTEX_WAKE_PRIVATE, INT_MAX, NULL);
		futex(&app_work_done, FUTEX_WAIT_PRIVATE, done, &nap);
	}
	return 0;
}

void quiesce_handler(int sig, siginfo_t *si, void *uc)
{
	int saved_errno = errno;
	unsigned idx = (unsigned)si->si_value.sival_int;
	struct parked_thread *t;
	int64_t parked_ns;
	int restored;
	unsigned gen;

	if (si->si_code != SI_QUEUE || si->si_pid != getpid() || idx >= nslots) {
		signals_chain(sig, si, uc);	/* glibc's set*id broadcast */
		goto out;
	}
	t = &slots[idx];
	if (t->rec.tid != syscall(SYS_gettid) ||
	    atomic_load(&t->state) != SLOT_SIGNALLED)
		goto out;		/* late signal of an aborted suspend */
	gen = t->gen;
	parked_ns = shim_now_ns();
	thread_fill_record(&t->rec);
	syscall_just_returned(uc, t->returned_call);
	if (t->rec.pending)
		queued_signals_take_thread(idx, t->rec.pending);
	restored = ckpt_save_context(&t->rec.regs) != 0;
	slot_set_state(&slots[idx], restored ? SLOT_RESTORED : SLOT_PARKED);
	while (atomic_load(&resume_gen) == gen) {
		run_app_work(idx);
		futex(&resume_gen, FUTEX_WAIT_PRIVATE, gen, NULL);
	}
	syscall_restart_resume(uc, parked_ns, restored);
out:
	errno = saved_errno;
}

static int signal_thread(pid_t tid)
{
	struct parked_thread *t;
	siginfo_t si;

	if (nslots == CKPT_MAX_THREADS)
		return EMFILE;
	t = &slots[nslots];
	memset(t, 0, sizeof(*t));
	t->rec.tid = tid;
	t->gen = atomic_load(&resume_gen);
	atomic_store(&t->state, SLOT_SIGNALLED);
	nslots++;

	memset(&si, 0, sizeof(si));
	si.si_signo = CKPT_SIGNAL;
	si.si_code = SI_QUEUE;
	si.si_pid = getpid();
	si.si_uid = getuid();
	si.si_value.sival_int = (int)(t - slots);
	if (syscall(SYS_rt_tgsigqueueinfo, getpid(), tid, CKPT_SIGNAL, &si)) {
		if (errno != ESRCH)
			return errno;
		atomic_store(&t->state, SLOT_GONE);	/* exited meanwhile */
	}
	return 0;
}

static int slot_known(pid_t tid)
{
	for (unsigned i = 0; i < nslots; i++)
		if (slots[i].rec.tid == tid)
			return 1;
	return 0;
}

struct new_threads {
	pid_t self;
	int added;
};

static int signal_if_new(int dfd, const char *name, uint64_t ino, void *arg)
{
	struct new_threads *nt = arg;
	pid_t tid = atoi(name);
	int err;

	if (tid <= 0 || tid == nt->self || slot_known(tid))
		return 0;
	err = signal_thread(tid);
	if (!err)
		nt->added++;
	return err;
}

/* Signal the threads of /proc/self/task not signalled yet (ckpt_dir_walk:
 * opendir mallocs). Returns how many, or -errno. */
static int signal_new_threads(void)
{
	struct new_threads nt = { (pid_t)syscall(SYS_gettid), 0 };
	int err = ckpt_dir_walk("/proc/self/task", signal_if_new, &nt);

	if (err)
		return err < 0 ? err : -err;
	return nt.added;
}

static int thread_is_zombie(pid_t tid)
{
	char path[64];
	struct ckpt_proc_stat st;

	snprintf(path, sizeof(path), "/proc/self/task/%d/stat", tid);
	return !ckpt_stat_read(path, &st) && (st.state == 'Z' || st.state == 'X');
}

static int all_parked(void)
{
	for (unsigned i = 0; i < nslots; i++) {
		struct parked_thread *t = &slots[i];

		if (atomic_load(&t->state) != SLOT_SIGNALLED)
			continue;
		/* a thread that exits before handling the signal never parks,
		 * nor does a main thread that called pthread_exit (a zombie) */
		if ((syscall(SYS_tgkill, getpid(), t->rec.tid, 0) && errno == ESRCH) ||
		    thread_is_zombie(t->rec.tid)) {
			atomic_store(&t->state, SLOT_GONE);
			continue;
		}
		return 0;
	}
	return 1;
}

static int wait_until(int (*done)(void), int64_t deadline)
{
	for (;;) {
		unsigned seen = atomic_load(&state_changes);
		struct timespec ts = { 0, 20 * 1000 * 1000 };

		if (done())
			return 0;
		if (shim_now_ns() > deadline)
			return ETIMEDOUT;
		/* short waits: a thread that exits while signalled wakes nobody */
		futex(&state_changes, FUTEX_WAIT_PRIVATE, seen, &ts);
	}
}

int quiesce_suspend(int timeout_ms)
{
	int64_t deadline = shim_now_ns() + (int64_t)timeout_ms * 1000000;
	int added, err;

	nslots = 0;
	do {
		/* glibc puts its SIGSETXID handler in at its first pthread_create */
		err = signals_reclaim();
		if (err)
			return err;
		added = signal_new_threads();
		if (added < 0)
			return -added;
		err = wait_until(all_parked, deadline);
		if (err)
			return err;
	} while (added > 0);	/* a thread may have been starting */
	return 0;
}

void quiesce_resume(void)
{
	queued_signals_release();
	atomic_fetch_add(&resume_gen, 1);
	futex(&resume_gen, FUTEX_WAKE_PRIVATE, INT_MAX, NULL);
}

static int all_restored(void)
{
	for (unsigned i = 0; i < nslots; i++)
		if (atomic_load(&slots[i].state) == SLOT_PARKED)
			return 0;
	return 1;
}

/* The main thread called pthread_exit: /proc/self then shows no memory and
 * no fds, and a restart has no main thread to recreate. */
int quiesce_leader_gone(void)
{
	return thread_is_zombie(getpid());
}

int quiesce_wait_restored(int timeout_ms)
{
	return wait_until(all_restored, shim_now_ns() + (int64_t)timeout_ms * 1000000);
}

unsigned quiesce_count(void)
{
	return nslots;
}

/* The i-th slot, or NULL if that thread is not parked (it exited). */
const struct parked_thread *quiesce_thread(unsigned i)
{
	if (i >= nslots || atomic_load(&slots[i].state) != SLOT_PARKED)
		return NULL;
	return &slots[i];
}
