/*
 * Recreating the threads.  Each gets its original tid with clone3's
 * set_tid (we are in a fresh pid namespace), its TLS base, its
 * clear_child_tid address, robust list and rseq area, and then continues
 * at the point where it parked in the shim (ckpt_resume_context with 1).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <linux/ioprio.h>
#include <linux/sched.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/rseq.h>
#include <sys/syscall.h>
#include <asm/prctl.h>
#include <linux/prctl.h>
#include <linux/capability.h>
#include "restart.h"
#include "sys.h"

void ckpt_resume_context(const struct ckpt_regs *regs, long ret) __attribute__((noreturn));

static void become(const struct ckpt_thread *t) __attribute__((noreturn));

/*
 * The thread's scheduling (saved by fill_scheduling, native/shim/engine/quiesce.c)
 * as far as the kernel lets it here: a nice value, a real-time policy or
 * I/O class ckpt-restart may not take unprivileged, or CPUs this host does
 * not have, leave the thread as ckpt-restart's.
 */
static void restore_scheduling(const struct ckpt_thread *t)
{
	int sched_priority = t->sched_priority;	/* the kernel's struct sched_param */
	uint64_t any = 0;

	for (unsigned i = 0; i < sizeof(t->cpu_affinity) / sizeof(t->cpu_affinity[0]); i++)
		any |= t->cpu_affinity[i];
	if (any)
		sys3(SYS_sched_setaffinity, 0, sizeof(t->cpu_affinity), t->cpu_affinity);
	if (t->policy >= 0)
		sys3(SYS_sched_setscheduler, 0, t->policy, &sched_priority);
	sys3(SYS_setpriority, PRIO_PROCESS, 0, t->nice);
	if (IOPRIO_PRIO_CLASS(t->ioprio) != IOPRIO_CLASS_NONE)	/* real-time: privileged */
		sys3(SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, t->ioprio);
	sys5(SYS_personality, t->personality, 0, 0, 0, 0);
	if (t->timer_slack_ns)	/* 0 would mean the default */
		sys5(SYS_prctl, PR_SET_TIMERSLACK, t->timer_slack_ns, 0, 0, 0);
	sys5(SYS_prctl, PR_SET_PDEATHSIG, t->pdeath_signal, 0, 0, 0);
	if (t->no_new_privs)
		sys5(SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
}

static int read_own_capabilities(uint64_t *effective, uint64_t *permitted)
{
	struct __user_cap_header_struct hdr = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];

	if (sys2(SYS_capget, &hdr, data) < 0)
		return -1;
	*effective = data[0].effective | (uint64_t)data[1].effective << 32;
	*permitted = data[0].permitted | (uint64_t)data[1].permitted << 32;
	return 0;
}

#define CAP_SETPCAP_BIT (1ULL << 8)
/* the lock bits of <linux/securebits.h>: a locked bit never changes again */
#define SECBITS_LOCKED 0xaa

/* This thread's bounding set, up to the kernel's last capability. */
static uint64_t read_bounding_set(void)
{
	uint64_t bounding = 0;

	for (int cap = 0; cap < 64; cap++) {
		long r = sys5(SYS_prctl, PR_CAPBSET_READ, cap, 0, 0, 0);

		if (r < 0)
			break;
		bounding |= (uint64_t)r << cap;
	}
	return bounding;
}

/*
 * Before the point of no return: a thread gets back no capability this
 * restart does not hold, and a bounding set can only shrink with
 * CAP_SETPCAP.  Otherwise the restart is refused, saying so.
 */
void check_capabilities(const struct image *img)
{
	uint64_t effective, permitted, bounding = read_bounding_set();
	long r = sys5(SYS_prctl, PR_GET_SECUREBITS, 0, 0, 0, 0);
	uint32_t securebits = r > 0 ? r : 0, locked = securebits & SECBITS_LOCKED;

	if (read_own_capabilities(&effective, &permitted))
		die("cannot read this restart's capabilities: %s", strerror(errno));
	for (unsigned i = 0; i < img->nthreads; i++) {
		const struct ckpt_thread *t = &img->threads[i];

		if (!t->caps_read)
			continue;
		if (t->cap_permitted & ~permitted)
			die("thread %d of process %d held capabilities (%#llx) this restart does not "
			    "have: restart it as a user who holds them", t->tid, img->hdr.pid,
			    (unsigned long long)(t->cap_permitted & ~permitted));
		if ((bounding & ~t->cap_bounding) && !(effective & CAP_SETPCAP_BIT))
			die("thread %d of process %d had a smaller capability bounding set, which only "
			    "CAP_SETPCAP can give back", t->tid, img->hdr.pid);
		if (t->securebits == securebits || (t->flags & CKPT_THREAD_CHECKPOINTER))
			continue;
		if (!(effective & CAP_SETPCAP_BIT))
			die("thread %d of process %d had securebits %#x (these are %#x), which only "
			    "CAP_SETPCAP can set", t->tid, img->hdr.pid, t->securebits, securebits);
		if ((t->securebits ^ securebits) & (locked | locked >> 1))
			die("thread %d of process %d had securebits %#x: this restart's are locked "
			    "(%#x)", t->tid, img->hdr.pid, t->securebits, securebits);
	}
}

#define CAP_SETGID_BIT (1ULL << 6)

/* Whether thread t's group credentials are this thread's already. */
static int same_credentials(const struct ckpt_thread *t)
{
	uint32_t gids[4], groups[CKPT_MAX_GROUPS];
	long n = sys2(SYS_getgroups, CKPT_MAX_GROUPS, groups);

	sys3(SYS_getresgid, &gids[0], &gids[1], &gids[2]);
	gids[3] = sys1(SYS_setfsgid, -1);
	return !memcmp(gids, t->gids, sizeof(gids)) &&
	       (t->ngroups > CKPT_MAX_GROUPS || namespace_denies_setgroups() ||
		(n == t->ngroups && !memcmp(groups, t->groups, n * sizeof(groups[0]))));
}

/* Before the point of no return: the threads' group ids and groups are
 * this restart's, or it may set them (CAP_SETGID). */
void check_credentials(const struct image *img)
{
	uint64_t effective, permitted;

	if (read_own_capabilities(&effective, &permitted))
		die("cannot read this restart's capabilities: %s", strerror(errno));
	for (unsigned i = 0; i < img->nthreads; i++) {
		const struct ckpt_thread *t = &img->threads[i];

		if (t->ngroups > CKPT_MAX_GROUPS && !namespace_denies_setgroups())
			warn("thread %d of process %d had %u supplementary groups, more than the %d "
			     "an image keeps: it gets this restart's", t->tid, img->hdr.pid,
			     t->ngroups, CKPT_MAX_GROUPS);
		if (!same_credentials(t) &&
		    (!(effective & CAP_SETGID_BIT) || namespace_denies_setgroups()))
			die("thread %d of process %d ran with group ids %u/%u/%u/%u and groups this "
			    "restart may not take (it needs CAP_SETGID): restart it as that user",
			    t->tid, img->hdr.pid, t->gids[0], t->gids[1], t->gids[2], t->gids[3]);
	}
}

/* Pair of fill_credentials (native/shim/engine/quiesce.c): the groups first,
 * then the ids, while the thread still has ckpt-restart's CAP_SETGID. */
static void restore_credentials(const struct ckpt_thread *t)
{
	long r = 0;

	if (same_credentials(t))
		return;
	if (t->ngroups <= CKPT_MAX_GROUPS && !namespace_denies_setgroups())
		r = sys2(SYS_setgroups, t->ngroups, t->groups);
	if (!r)
		r = sys3(SYS_setresgid, t->gids[0], t->gids[1], t->gids[2]);
	if (r < 0)
		fatal("restoring the thread's group credentials", r);
	sys1(SYS_setfsgid, t->gids[3]);
}

/* Pair of fill_capabilities (native/shim/engine/quiesce.c), after every step that
 * may need ckpt-restart's privileges: the bounding set first (dropping
 * needs CAP_SETPCAP), then the three sets, then the ambient set (which
 * needs its capabilities permitted and inheritable). */
static void restore_capabilities(const struct ckpt_thread *t)
{
	struct __user_cap_header_struct hdr = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {
		{ (uint32_t)t->cap_effective, (uint32_t)t->cap_permitted,
		  (uint32_t)t->cap_inheritable },
		{ (uint32_t)(t->cap_effective >> 32), (uint32_t)(t->cap_permitted >> 32),
		  (uint32_t)(t->cap_inheritable >> 32) },
	};
	uint64_t extra;
	long r;

	/* the shim's checkpoint thread needs ours a little longer: its fixups
	 * after a restart (/proc/self/exe) are privileged; it then gives them
	 * up itself (drop_restart_capabilities, native/shim/engine/quiesce.c) */
	if (!t->caps_read || (t->flags & CKPT_THREAD_CHECKPOINTER))
		return;
	extra = read_bounding_set() & ~t->cap_bounding;
	for (int cap = 0; cap < 64; cap++)
		if ((extra & (1ULL << cap)) &&
		    (r = sys5(SYS_prctl, PR_CAPBSET_DROP, cap, 0, 0, 0)) < 0)
			fatal("dropping a capability from the bounding set", r);
	/* before capset, which may give up the CAP_SETPCAP it needs */
	if (t->securebits != (uint32_t)sys5(SYS_prctl, PR_GET_SECUREBITS, 0, 0, 0, 0) &&
	    (r = sys5(SYS_prctl, PR_SET_SECUREBITS, t->securebits, 0, 0, 0)) < 0)
		fatal("restoring the thread's securebits", r);
	r = sys2(SYS_capset, &hdr, data);
	if (r < 0)
		fatal("restoring the thread's capabilities", r);
	sys5(SYS_prctl, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
	for (int cap = 0; cap < 64; cap++)
		if ((t->cap_ambient & (1ULL << cap)) &&
		    (r = sys5(SYS_prctl, PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0)) < 0)
			fatal("raising an ambient capability", r);
}

/* The image whose threads are being made: become() reads it. */
static const struct image *restoring;

/* 0 until the main thread has the fds that needed the threads
 * (restore_task_fds): the other threads wait for it before running. */
static uint32_t threads_go;

static void wait_for_go(void)
{
	while (!__atomic_load_n(&threads_go, __ATOMIC_ACQUIRE))
		sys6(SYS_futex, (long)&threads_go, FUTEX_WAIT_PRIVATE, 0, 0, 0, 0);
}

static void let_threads_go(void)
{
	__atomic_store_n(&threads_go, 1, __ATOMIC_RELEASE);
	sys6(SYS_futex, (long)&threads_go, FUTEX_WAKE_PRIVATE, INT32_MAX, 0, 0, 0);
}

/* Runs on a zone stack with the image's TLS: raw system calls only. */
static void become(const struct ckpt_thread *t)
{
	long r;

	wait_for_go();
	restore_thread_pending(restoring, t);	/* only the thread may queue them */
	restore_scheduling(t);
	restore_credentials(t);
	restore_capabilities(t);
	sys5(SYS_prctl, PR_SET_NAME, t->comm, 0, 0, 0);	/* ps and pthread_getname_np */
	sys1(SYS_set_tid_address, t->clear_child_tid);
	if (t->robust_list)
		sys2(SYS_set_robust_list, t->robust_list, t->robust_len);
	if (t->rseq_addr) {
		r = sys4(SYS_rseq, t->rseq_addr, t->rseq_len, 0, t->rseq_sig);
		if (r < 0)
			fatal("registering the thread's rseq area", r);
	}
	sys4(SYS_rt_sigprocmask, SIG_SETMASK, &t->sigmask, NULL, 8);
	ckpt_resume_context(&t->regs, 1);
}

static int thread_main(void *arg)
{
	become(arg);
}

static void spawn_thread(const struct ckpt_thread *t, unsigned index)
{
	pid_t tid = t->tid;
	void *stack_top = zone_stack(index);
	struct clone_args ca;
	long r;

	if (!stack_top)
		fatal("allocating a thread stack", -12);
	memset(&ca, 0, sizeof(ca));
	ca.flags = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD |
		   CLONE_SYSVSEM | CLONE_SETTLS;
	if (t->flags & CKPT_THREAD_CHECKPOINTER)
		ca.flags &= ~CLONE_FILES;	/* it keeps an fd table of its own */
	ca.stack = (uint64_t)stack_top - ZONE_STACK_SIZE;
	ca.stack_size = ZONE_STACK_SIZE;
	ca.tls = t->fs_base;
	ca.set_tid = (uint64_t)&tid;
	ca.set_tid_size = 1;
	r = clone3_run(&ca, sizeof(ca), thread_main, (void *)t);
	if (r < 0)
		fatal("recreating a thread with its tid (clone3)", r);
}

/* ckpt-restart's own rseq registration, inherited from its parent, must go
 * before the image's area can be registered. */
static void unregister_own_rseq(void)
{
	uint64_t tp;

	if (!__rseq_size)
		return;
	__asm__ volatile("mov %%fs:0, %0" : "=r"(tp));
	sys4(SYS_rseq, tp + __rseq_offset, __rseq_size > 32 ? __rseq_size : 32,
	     RSEQ_FLAG_UNREGISTER, RSEQ_SIG);
}

void restore_threads(struct image *img)
{
	const struct ckpt_thread *leader = NULL;
	unsigned stacks = 1;		/* stack 0 is this process's own */

	restoring = img;
	unregister_own_rseq();
	close_restart_fds();
	for (unsigned i = 0; i < img->nthreads; i++) {
		const struct ckpt_thread *t = &img->threads[i];

		if (t->tid == img->hdr.pid) {
			leader = t;
			continue;
		}
		spawn_thread(t, stacks++);
	}
	if (!leader)
		fatal("the image has no main thread", -22);
	restore_task_fds(img);
	let_threads_go();
	restore_async_owners(img);
	restore_posix_timers(img->proc);
	sys2(SYS_arch_prctl, ARCH_SET_FS, leader->fs_base);
	become(leader);
}
