/*
 * The checkpoint thread: connects to the coordinator, and runs each phase
 * the coordinator names (docs/PROTOCOL.md) by calling the quiesce code, the
 * image writer and the plugins' hooks.
 *
 * A restarted process comes back to life inside phase_write(), where
 * ckpt_save_context() then returns 1: the thread reconnects to the new
 * coordinator named in shim_restart_info and runs the restart phases.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <asm/prctl.h>
#include "shim.h"

#define SUSPEND_TIMEOUT_MS 30000
#define RESTORE_TIMEOUT_MS 30000
#define CHECKPOINTER_STACK (1 << 20)

enum { SESSION_EOF = -1, SESSION_RESTARTED = -2 };

struct ckpt_restart_info shim_restart_info;	/* filled by ckpt-restart */

static char coord_path[108];
static pid_t checkpointer_tid;	/* the checkpoint thread, for shim_log */
static struct ckpt_thread self_rec;
static int64_t suspended_at;
static int restarting;
/* From STOP to RESUME: the checkpoint this process is in (its number + 1),
 * so that a coordinator that dies meanwhile does not leave it parked. */
static unsigned in_checkpoint;
/* The process was stopped (SIGSTOP) when checkpointed: the coordinator
 * thawed it through a tracer.  In memory, so that a restart finds it. */
static int stopped_in_image;

static void unescape(char *s)
{
	char *out = s;

	for (; *s; s++) {
		if (s[0] == '%' && s[1] && s[2]) {
			char hex[3] = { s[1], s[2], 0 };

			*out++ = (char)strtol(hex, NULL, 16);
			s += 2;
		} else {
			*out++ = *s;
		}
	}
	*out = '\0';
}

static int hello(int restored)
{
	return coord_send("HELLO %d %d %s %d", getpid(), restored, shim_hostname(),
			  CKPT_PROTOCOL_VERSION);
}

static void reply(enum ckpt_phase phase, int err, const char *detail)
{
	if (err)
		coord_send("FAIL %s %d %s", ckpt_phase_name(phase), err,
			   detail && *detail ? detail : shim_strerror(err));
	else
		coord_send("DONE %s 0%s%s", ckpt_phase_name(phase),
			   detail && *detail ? " " : "", detail ? detail : "");
}

/* Whether word is one of the space-separated words of list. */
static int has_word(const char *list, const char *word)
{
	size_t n = strlen(word);

	for (const char *p = list; p && (p = strstr(p, word)); p += n)
		if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0'))
			return 1;
	return 0;
}

/* The value of WRITE's word name=value, unescaped in place, or NULL. */
static char *word_value(char *words, const char *name)
{
	size_t n = strlen(name);

	for (char *p = words; p && (p = strstr(p, name)); p += n)
		if ((p == words || p[-1] == ' ') && p[n] == '=') {
			p[n + 1 + strcspn(p + n + 1, " ")] = '\0';
			unescape(p + n + 1);
			return p + n + 1;
		}
	return NULL;
}

static void write_image(char *dir, unsigned seq, char *words)
{
	char detail[1024];
	int err = EAGAIN;
	struct write_mode mode = {
		.compression = has_word(words, "zstd") ? CKPT_COMPRESSION_ZSTD :
			       has_word(words, "auto") ? CKPT_COMPRESSION_AUTO :
							 CKPT_COMPRESSION_NONE,
		.incremental = has_word(words, "incremental"),
	};
	int forked = has_word(words, "fork");

	/* values are cut out in place: the last word first (docs/PROTOCOL.md) */
	mode.parent_dir = word_value(words, "parent");
	mode.stage_dir = word_value(words, "stage");
	unescape(dir);
	if (forked)
		err = image_write_forked(dir, seq, &self_rec, &mode, detail, sizeof(detail));
	if (err == EAGAIN)	/* not forked, or not possible: write in place */
		err = image_write_now(dir, seq, &self_rec, &mode, detail, sizeof(detail));
	reply(CKPT_PHASE_WRITE, err, detail);
}

/* Whether the coordinator thawed this stopped process for checkpoint seq. */
static int thawed_for(unsigned seq)
{
	char key[160], value[8];

	snprintf(key, sizeof(key), "stopped:%u:%s:%d", seq, shim_hostname(), getpid());
	return ckpt_kv_get(key, value, sizeof(value)) == 0;
}

/* A restarted process returns from here a second time, with 1. */
/* mode: WRITE's words (docs/PROTOCOL.md) */
static int __attribute__((noinline)) phase_write(char *dir, unsigned seq, char *mode)
{
	stopped_in_image = thawed_for(seq);
	thread_fill_record(&self_rec);
	/* a bare clone: no TLS, rseq area or robust list of its own */
	self_rec.flags = CKPT_THREAD_CHECKPOINTER;
	self_rec.rseq_addr = 0;
	self_rec.robust_list = 0;
	self_rec.clear_child_tid = 0;
	if (ckpt_save_context(&self_rec.regs))
		return SESSION_RESTARTED;
	write_image(dir, seq, mode);
	return 0;
}

static void phase_sync(void)
{
	char detail[1024];
	int err = image_write_wait(detail, sizeof(detail));

	reply(CKPT_PHASE_SYNC, err, detail);
}

static int run_hooks(enum ckpt_phase phase, unsigned seq, int aborted, const char *arg)
{
	struct ckpt_hook_ctx ctx = {
		.phase = phase, .seq = seq, .restarted = restarting, .aborted = aborted, .arg = arg,
	};
	char why[300];
	int err = plugins_run(&ctx, why, sizeof(why));

	if (err && phase != CKPT_PHASE_RESUME)
		reply(phase, err, why);
	else if (err)
		ckpt_warn("%s", why);
	return err;
}

static void phase_suspend(unsigned seq)
{
	char detail[CKPT_LINE_MAX / 2], children[CKPT_LINE_MAX / 2 - 64];
	int err;

	suspended_at = shim_now_ns();
	err = state_kinds_before_parking(detail, sizeof(detail));
	if (err) {
		reply(CKPT_PHASE_SUSPEND, err, detail);
		return;
	}
	if (quiesce_leader_gone()) {
		reply(CKPT_PHASE_SUSPEND, ENOTSUP,
		      "the main thread has exited (pthread_exit): not supported yet");
		return;
	}
	err = quiesce_suspend(SUSPEND_TIMEOUT_MS);
	if (err) {
		reply(CKPT_PHASE_SUSPEND, err, err == ETIMEDOUT ?
		      "a thread did not stop (is the checkpoint signal blocked?)" : NULL);
		return;
	}
	/* once the threads are parked: its scratch map is not to move the
	 * memory map under a thread reading /proc/self/maps */
	err = state_kinds_parked(detail, sizeof(detail));
	if (err) {
		reply(CKPT_PHASE_SUSPEND, err, detail);
		return;
	}
	if (run_hooks(CKPT_PHASE_SUSPEND, seq, 0, NULL))
		return;
	state_kinds_suspended();
	process_job_children(children, sizeof(children));
	snprintf(detail, sizeof(detail), "threads=%u%s%s", quiesce_count() + 1,
		 children[0] ? " children=" : "", children);
	reply(CKPT_PHASE_SUSPEND, 0, detail);
}

static void phase_resume(unsigned seq, const char *arg)
{
	char detail[64];

	int aborted = arg && !strcmp(arg, "abort");

	if (aborted)
		image_write_cancel();
	run_hooks(CKPT_PHASE_RESUME, seq, aborted, NULL);
	snprintf(detail, sizeof(detail), "stopped_ns=%lld",
		 restarting ? 0LL : (long long)(shim_now_ns() - suspended_at));
	/* the answer first: an application that exits as soon as it runs must
	 * not look to the coordinator like a process that died before RESUME */
	reply(CKPT_PHASE_RESUME, 0, detail);
	if (restarting)
		state_kinds_restarted();
	/* stopped when checkpointed: stopped again, its threads still parked
	 * until a SIGCONT, and its parent told as the kernel tells */
	if (restarting && stopped_in_image && !aborted)
		kill(getpid(), SIGSTOP);
	stopped_in_image = 0;
	restarting = 0;
	in_checkpoint = 0;
	quiesce_resume();
}

/* The restart's coordinator went away before RESUME: the restart never
 * finished (connections not refilled, plugins not rebuilt), so the
 * process ends rather than run on half restored. */
static void end_unfinished_restart(void)
{
	shim_log("the coordinator went away before the restart finished: the process ends");
	syscall(SYS_exit_group, 70);
}

/* The coordinator went away in the middle of a checkpoint (killed, its
 * host gone): nobody will say RESUME, so abort as RESUME abort would
 * (plugins take back what they released) and let the application run on,
 * no longer checkpointable. */
static void abandon_orphaned_checkpoint(void)
{
	unsigned seq = in_checkpoint - 1;

	shim_log("the coordinator went away during checkpoint %u: the application goes on", seq);
	image_write_cancel();
	run_hooks(CKPT_PHASE_RESUME, seq, 1, NULL);
	in_checkpoint = 0;
	quiesce_resume();
}

static int phase_from_name(const char *name)
{
	for (int p = 0; p < CKPT_PHASE_COUNT; p++)
		if (!strcmp(name, ckpt_phase_name(p)))
			return p;
	return -1;
}

/* A phase that is only the plugins' hooks (DRAIN, STOP, REBUILD, ...). */
static void phase_hooks_only(enum ckpt_phase phase, unsigned seq, const char *arg)
{
	if (phase == CKPT_PHASE_STOP)
		in_checkpoint = seq + 1;
	if (!run_hooks(phase, seq, 0, phase == CKPT_PHASE_FLUSH ? arg : NULL))
		reply(phase, 0, NULL);
}

static int handle_phase(char *name, unsigned seq, char *arg, char *mode)
{
	int phase = phase_from_name(name);

	switch (phase) {
	case CKPT_PHASE_SUSPEND:
		phase_suspend(seq);
		break;
	case CKPT_PHASE_WRITE:
		return arg ? phase_write(arg, seq, mode) : 0;
	case CKPT_PHASE_SYNC:
		phase_sync();
		break;
	case CKPT_PHASE_RESUME:
		phase_resume(seq, arg);
		break;
	case -1:
		break;		/* a phase this shim does not know: the coordinator times out */
	default:
		phase_hooks_only(phase, seq, arg);
	}
	return 0;
}

static int run_session(void)
{
	char line[CKPT_LINE_MAX];

	while (coord_recv(line, sizeof(line)) == 0) {
		char *save = NULL;
		char *word = strtok_r(line, " ", &save);
		char *name, *seq, *arg, *mode;

		if (!word || strcmp(word, "PHASE"))
			continue;	/* WELCOME and anything unknown */
		name = strtok_r(NULL, " ", &save);
		seq = strtok_r(NULL, " ", &save);
		arg = strtok_r(NULL, " ", &save);
		mode = save;	/* the rest: WRITE's words */
		if (!name || !seq)
			continue;
		if (handle_phase(name, strtoul(seq, NULL, 10), arg, mode) == SESSION_RESTARTED)
			return SESSION_RESTARTED;
	}
	return SESSION_EOF;
}

/* Our fd table is a copy of the application's: drop the copies, stderr
 * too (a daemon that lets go of its stderr must not keep a pipe open
 * through us: shim_log reopens the application's).  /dev/null holds 0-2,
 * so that nothing this thread opens gets a stdio number. */
static void close_copied_fds(void)
{
	syscall(SYS_close_range, 0, ~0U, 0);
	if (open("/dev/null", O_RDWR) == 0) {
		dup2(0, 1);
		dup2(0, 2);
	}
}

/* The tracer that thaws a stopped process finds this thread by its name
 * (ckpt/thaw.py). */
static void name_checkpoint_thread(void)
{
	syscall(SYS_prctl, PR_SET_NAME, "ckpt", 0, 0, 0);
}

/* Back from an image: the fds and buffers of the old process are gone. */
static int after_restart(void)
{
	int err, exe_err;

	coord_forget();
	in_checkpoint = 0;	/* the checkpoint it came from; the restart's own follows */
	close_copied_fds();	/* ckpt-restart gave us a copy of the restored table */
	scratch_forget();
	queued_signals_forget();
	image_writer_forget();
	restarting = 1;
	name_checkpoint_thread();
	err = quiesce_wait_restored(RESTORE_TIMEOUT_MS);
	if (err) {
		shim_log("restart: threads did not come back: %s", shim_strerror(err));
		return err;
	}
	mqueues_restarted();	/* after close_copied_fds, which dropped them */
	/* ckpt-restart's code is no longer used: reserve its range again */
	shim_mmap((void *)CKPT_RESERVE_START, CKPT_RESERVE_SIZE, PROT_NONE,
	     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
	fds_reseek_proc_files();	/* now that the maps are as they were */
	exe_err = restore_exe_link();
	err = drop_restart_capabilities(&self_rec);
	if (err)
		shim_log("restart: cannot give up the restart's capabilities: %s", shim_strerror(err));
	net_addresses_restarted(shim_restart_info.addr_moves, shim_restart_info.naddr_moves);
	shim_hostname_forget();		/* the host it runs on now */
	/* children forked from now on join the new coordinator */
	snprintf(coord_path, sizeof(coord_path), "%s", shim_restart_info.coord_path);
	err = coord_connect(coord_path);
	if (err) {
		shim_log("restart: cannot reach coordinator %s: %s",
			 shim_restart_info.coord_path, shim_strerror(err));
		return err;
	}
	err = hello(1);
	if (exe_err)
		ckpt_warn("/proc/self/exe names ckpt-restart: %s", shim_strerror(exe_err));
	return err;
}

static int checkpointer_main(void *arg)
{
	int err;

	(void)arg;
	checkpointer_tid = syscall(SYS_gettid);
	name_checkpoint_thread();
	close_copied_fds();
	err = coord_connect(coord_path);
	if (err) {
		shim_log("cannot reach coordinator %s: %s; not checkpointable",
			 coord_path, shim_strerror(err));
		return 0;
	}
	hello(0);
	while (run_session() == SESSION_RESTARTED) {
		if (after_restart()) {
			/* nobody will say RESUME: let the application run */
			quiesce_resume();
			coord_close();
			return 0;
		}
	}
	if (restarting)
		end_unfinished_restart();
	if (in_checkpoint)
		abandon_orphaned_checkpoint();
	coord_close();
	return 0;
}

/*
 * The checkpoint thread's thread pointer: a copy of the main thread's
 * static TLS and thread control block.  With a TLS of its own, errno and
 * glibc's per-thread state (cancellation flags around syscalls) are its
 * own, so nothing it does changes the application's threads, whose memory
 * it is writing out.  TLS blocks sit below the thread pointer on x86-64;
 * glibc's TCB (struct pthread) above it is smaller than TCB_COPY.
 */
#define TCB_COPY 4096

typedef void (*tls_info_fn)(size_t *size, size_t *align);

/* Memory the checkpoint thread writes to while it saves the image. */
static uint64_t own_ranges[2][2];

int checkpointer_memory(uint64_t start, uint64_t end)
{
	for (int i = 0; i < 2; i++)
		if (start < own_ranges[i][1] && end > own_ranges[i][0])
			return 1;
	return 0;
}

/* Looked up at the first start: a clone() child must not call dlsym, whose
 * loader lock another thread of its parent may have held (fork resets it,
 * clone does not). */
static tls_info_fn tls_info;

static void *copy_main_tls(void)
{
	tls_info_fn info = tls_info;
	size_t size = 0, align = 64, below, total;
	uint64_t fs = 0;
	char *block, *tp;

	if (!info || syscall(SYS_arch_prctl, ARCH_GET_FS, &fs))
		return NULL;
	info(&size, &align);
	if (align < 64)
		align = 64;
	below = (size + align - 1) & ~(align - 1);
	total = below + TCB_COPY + align;
	block = shim_mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (block == MAP_FAILED)
		return NULL;
	tp = (char *)(((uint64_t)block + below + align - 1) & ~(uint64_t)(align - 1));
	own_ranges[0][0] = (uint64_t)block;
	own_ranges[0][1] = (uint64_t)block + total;
	/* in pieces: the bytes around the main thread's block may be unmapped;
	 * the TCB's head (guards, locale, errno just below) must be there */
	for (size_t off = 0; off < below + TCB_COPY; off += 512) {
		struct iovec dst = { tp - below + off, 512 };
		struct iovec src = { (char *)fs - below + off, 512 };
		int vital = off + 512 > below - 512 && off < below + 512;

		if (process_vm_readv(getpid(), &dst, 1, &src, 1, 0) != 512 && vital) {
			shim_munmap(block, total);
			return NULL;
		}
	}
	((uint64_t *)tp)[0] = (uint64_t)tp;	/* tcbhead_t.tcb */
	((uint64_t *)tp)[2] = (uint64_t)tp;	/* tcbhead_t.self */
	return tp;
}

/*
 * The checkpoint thread is a bare clone(), not a pthread, with its own
 * copy of the TLS (above) and an fd table of its own (it reaches the
 * application's fds through /proc, fds.c).  The kernel and glibc then see
 * an application that is as single-threaded as it was: its fd syscalls
 * keep fdget's fast path and glibc keeps its single-thread fast paths.
 * The thread must not use malloc, stdio or pthread calls.
 */
int checkpointer_start(const char *path)
{
	/* no CLONE_FILES: a shared fd table makes every fd syscall of the
	 * application take a reference count (fdget's slow path) */
	int flags = CLONE_VM | CLONE_FS | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM |
		    CLONE_SETTLS;
	sigset_t all, old;
	char *stack;
	void *tls;
	int tid;

	if (path != coord_path)
		snprintf(coord_path, sizeof(coord_path), "%s", path);
	if (!tls_info)
		tls_info = (tls_info_fn)dlsym(RTLD_DEFAULT, "_dl_get_tls_static_info");
	tls = copy_main_tls();
	if (!tls)
		return ENOSYS;
	stack = shim_mmap(NULL, CHECKPOINTER_STACK, PROT_READ | PROT_WRITE,
		     MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
	if (stack == MAP_FAILED)
		return errno;
	shim_mprotect(stack, 4096, PROT_NONE);		/* guard page */
	own_ranges[1][0] = (uint64_t)stack;
	own_ranges[1][1] = (uint64_t)stack + CHECKPOINTER_STACK;
	/* inherited by the thread: every signal, the parking one too (not
	 * through our pthread_sigmask, which keeps that one unblocked) */
	sigfillset(&all);
	syscall(SYS_rt_sigprocmask, SIG_SETMASK, &all, &old, sizeof(uint64_t));
	tid = clone(checkpointer_main, stack + CHECKPOINTER_STACK, flags, NULL, NULL, tls, NULL);
	syscall(SYS_rt_sigprocmask, SIG_SETMASK, &old, NULL, sizeof(uint64_t));
	return tid < 0 ? errno : 0;
}

/*
 * fork() copies only the calling thread: the child needs a checkpoint
 * thread of its own.  The parent's checkpoint thread's stack and TLS are
 * dead copies here, and its connection, scratch buffers and forked writer
 * belong to the parent.
 */
void checkpointer_atfork_child(void)
{
	int err;

	for (int i = 0; i < 2; i++)
		if (own_ranges[i][1])
			shim_munmap((void *)own_ranges[i][0], own_ranges[i][1] - own_ranges[i][0]);
	memset(own_ranges, 0, sizeof(own_ranges));
	coord_forget();
	scratch_forget();
	image_writer_forget();
	restarting = 0;
	err = checkpointer_start(coord_path);
	if (err)
		shim_log("forked child %d: cannot start the checkpoint thread: %s",
			 getpid(), shim_strerror(err));
}

/* Whether the caller is the checkpoint thread (fd table of its own). */
int checkpointer_is_current(void)
{
	return checkpointer_tid && syscall(SYS_gettid) == checkpointer_tid;
}

/* The coordinator this process talks to (a new one after a restart). */
const char *checkpointer_coord_path(void)
{
	return coord_path;
}

SHIM_EXPORT const char *ckpt_coordinator_path(void)
{
	return coord_path;
}

int checkpointer_follow_forks(void)
{
	return pthread_atfork(NULL, NULL, checkpointer_atfork_child);
}
