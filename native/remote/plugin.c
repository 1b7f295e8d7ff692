/*
 * While the remote side is being started, the job has an ssh session (or
 * an srun step) in flight that no image can hold (an ssh process outside
 * the job, pipes to sshd): a checkpoint then fails cleanly and the job goes
 * on; the next one finds every connection between job processes.  STOP
 * refuses early;
 * SUSPEND, whose hooks run with the process parked, catches a launch
 * that began after STOP.  An srun task whose PMI cannot be answered after
 * a restart refuses at the same points; at REBUILD its PMI proxy starts
 * answering by itself (pmi_proxy.c).
 */
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include "ckpt_plugin.h"
#include "remote.h"

static volatile sig_atomic_t starting;
static void (*hook_fail)(const char *fmt, ...);

static int hook(const struct ckpt_hook_ctx *ctx, void *arg)
{
	char why[300];
	int err;

	if (ctx->phase == CKPT_PHASE_REBUILD && ctx->restarted) {
		err = pmi_proxy_restarted(ctx->seq, why, sizeof(why));
		if (err && hook_fail)
			hook_fail("%s", why);
		return err;
	}
	if (ctx->phase != CKPT_PHASE_STOP && ctx->phase != CKPT_PHASE_SUSPEND)
		return 0;
	if (pmi_proxy_unsupported()) {
		if (hook_fail)
			hook_fail("%s: a restart could not answer its PMI requests", pmi_proxy_unsupported());
		return ENOTSUP;
	}
	if (!starting)
		return 0;
	if (hook_fail)
		hook_fail("a remote command is being started through ssh, rsh or srun; try again");
	return EBUSY;
}

/* Without the shim (run by hand) there is nothing to register with. */
void remote_plugin_init(void)
{
	static const struct ckpt_plugin plugin = { .name = "remote", .hook = hook };
	int (*reg)(const struct ckpt_plugin *) =
		(int (*)(const struct ckpt_plugin *))dlsym(RTLD_DEFAULT, "ckpt_plugin_register");

	hook_fail = (void (*)(const char *, ...))dlsym(RTLD_DEFAULT, "ckpt_hook_fail");
	if (reg)
		reg(&plugin);
}

void remote_set_starting(int value)
{
	starting = value;
}
