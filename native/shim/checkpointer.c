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
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>
#include "shim.h"

#define SUSPEND_TIMEOUT_MS 30000
#define RESTORE_TIMEOUT_MS 30000

enum { SESSION_EOF = -1, SESSION_RESTARTED = -2 };

struct ckpt_restart_info shim_restart_info;	/* filled by ckpt-restart */

static char coord_path[108];
static struct ckpt_thread self_rec;
static int64_t suspended_at;
static int restarting;

static const char *hostname(void)
{
	static struct utsname u;

	if (!u.nodename[0] && uname(&u))
		strcpy(u.nodename, "localhost");
	return u.nodename;
}

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
	return coord_send("HELLO %d %d %s %d", getpid(), restored, hostname(),
			  CKPT_PROTOCOL_VERSION);
}

static void reply(enum ckpt_phase phase, int err, const char *detail)
{
	if (err)
		coord_send("FAIL %s %d %s", ckpt_phase_name(phase), err,
			   detail && *detail ? detail : strerror(err));
	else
		coord_send("DONE %s 0%s%s", ckpt_phase_name(phase),
			   detail && *detail ? " " : "", detail ? detail : "");
}

static void write_image(char *dir, int forked)
{
	char detail[600];
	int err = EAGAIN;

	unescape(dir);
	if (forked)
		err = image_write_forked(dir, &self_rec, detail, sizeof(detail));
	if (err == EAGAIN)	/* not forked, or not possible: write in place */
		err = image_write_now(dir, &self_rec, detail, sizeof(detail));
	reply(CKPT_PHASE_WRITE, err, detail);
}

/* A restarted process returns from here a second time, with 1. */
static int __attribute__((noinline)) phase_write(char *dir, int forked)
{
	thread_fill_record(&self_rec);
	self_rec.flags = CKPT_THREAD_CHECKPOINTER;
	if (ckpt_save_context(&self_rec.regs))
		return SESSION_RESTARTED;
	write_image(dir, forked);
	return 0;
}

static void phase_sync(void)
{
	char detail[600];
	int err = image_write_wait(detail, sizeof(detail));

	reply(CKPT_PHASE_SYNC, err, detail);
}

static int run_hooks(enum ckpt_phase phase, unsigned seq, int aborted)
{
	struct ckpt_hook_ctx ctx = {
		.phase = phase, .seq = seq, .restarted = restarting, .aborted = aborted,
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
	char detail[64];
	int err;

	suspended_at = shim_now_ns();
	err = quiesce_suspend(SUSPEND_TIMEOUT_MS);
	if (err) {
		reply(CKPT_PHASE_SUSPEND, err, err == ETIMEDOUT ?
		      "a thread did not stop (is the checkpoint signal blocked?)" : NULL);
		return;
	}
	if (run_hooks(CKPT_PHASE_SUSPEND, seq, 0))
		return;
	snprintf(detail, sizeof(detail), "threads=%u", quiesce_count() + 1);
	reply(CKPT_PHASE_SUSPEND, 0, detail);
}

static void phase_resume(unsigned seq, const char *arg)
{
	char detail[64];

	int aborted = arg && !strcmp(arg, "abort");

	if (aborted)
		image_write_cancel();
	run_hooks(CKPT_PHASE_RESUME, seq, aborted);
	quiesce_resume();
	snprintf(detail, sizeof(detail), "stopped_ns=%lld",
		 restarting ? 0LL : (long long)(shim_now_ns() - suspended_at));
	restarting = 0;
	reply(CKPT_PHASE_RESUME, 0, detail);
}

static int handle_phase(char *name, unsigned seq, char *arg, char *mode)
{
	if (!strcmp(name, "SUSPEND"))
		phase_suspend(seq);
	else if (!strcmp(name, "WRITE") && arg)
		return phase_write(arg, mode && !strcmp(mode, "fork"));
	else if (!strcmp(name, "SYNC"))
		phase_sync();
	else if (!strcmp(name, "RESUME"))
		phase_resume(seq, arg);
	else if (!strcmp(name, "DRAIN") && !run_hooks(CKPT_PHASE_DRAIN, seq, 0))
		reply(CKPT_PHASE_DRAIN, 0, NULL);
	else if (!strcmp(name, "REBUILD") && !run_hooks(CKPT_PHASE_REBUILD, seq, 0))
		reply(CKPT_PHASE_REBUILD, 0, NULL);
	else if (!strcmp(name, "REFILL") && !run_hooks(CKPT_PHASE_REFILL, seq, 0))
		reply(CKPT_PHASE_REFILL, 0, NULL);
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
		mode = strtok_r(NULL, " ", &save);
		if (!name || !seq)
			continue;
		if (handle_phase(name, strtoul(seq, NULL, 10), arg, mode) == SESSION_RESTARTED)
			return SESSION_RESTARTED;
	}
	return SESSION_EOF;
}

/* Back from an image: the fds and buffers of the old process are gone. */
static int after_restart(void)
{
	int err;

	coord_forget();
	shim_fd_forget_all();
	scratch_forget();
	image_writer_forget();
	restarting = 1;
	err = quiesce_wait_restored(RESTORE_TIMEOUT_MS);
	if (err) {
		shim_log("restart: threads did not come back: %s", strerror(err));
		return err;
	}
	/* ckpt-restart's code is no longer used: reserve its range again */
	mmap((void *)CKPT_RESERVE_START, CKPT_RESERVE_SIZE, PROT_NONE,
	     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
	err = coord_connect(shim_restart_info.coord_path);
	if (err) {
		shim_log("restart: cannot reach coordinator %s: %s",
			 shim_restart_info.coord_path, strerror(err));
		return err;
	}
	return hello(1);
}

static void *checkpointer_main(void *arg)
{
	int err;

	(void)arg;
	err = coord_connect(coord_path);
	if (err) {
		shim_log("cannot reach coordinator %s: %s; not checkpointable",
			 coord_path, strerror(err));
		return NULL;
	}
	hello(0);
	while (run_session() == SESSION_RESTARTED) {
		if (after_restart()) {
			/* nobody will say RESUME: let the application run */
			quiesce_resume();
			break;
		}
	}
	coord_close();
	return NULL;
}

int checkpointer_start(const char *path)
{
	pthread_attr_t attr;
	sigset_t all, old;
	pthread_t tid;
	int err;

	snprintf(coord_path, sizeof(coord_path), "%s", path);
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);	/* inherited by the thread */
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	err = pthread_create(&tid, &attr, checkpointer_main, NULL);
	pthread_attr_destroy(&attr);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return err;
}
