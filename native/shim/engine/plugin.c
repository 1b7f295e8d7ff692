/* The plugin hook table and the services plugins call. */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "shim.h"

#define MAX_PLUGINS 16

static struct ckpt_plugin plugins[MAX_PLUGINS];
static unsigned nplugins;
static char failure[256];
static int warn_fd = -1;		/* a forked writer sends warnings here */

void warnings_to_fd(int fd)
{
	warn_fd = fd;
}

/* Plugins still rebuilding, whose fds the interrupted waits watch. */
static _Atomic unsigned rebuilding;

void ckpt_resume_waits_hold(void)
{
	atomic_fetch_add(&rebuilding, 1);
}

void ckpt_resume_waits_release(void)
{
	if (atomic_fetch_sub(&rebuilding, 1) == 1)
		syscall(SYS_futex, &rebuilding, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Called in the parking handler: async-signal-safe. */
void plugins_wait_rebuilt(void)
{
	unsigned n;

	while ((n = atomic_load(&rebuilding)))
		syscall(SYS_futex, &rebuilding, FUTEX_WAIT_PRIVATE, n, NULL, NULL, 0);
}

int ckpt_plugin_register(const struct ckpt_plugin *plugin)
{
	if (nplugins == MAX_PLUGINS)
		return ENOSPC;
	plugins[nplugins++] = *plugin;
	return 0;
}

void ckpt_hook_fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(failure, sizeof(failure), fmt, ap);
	va_end(ap);
}

void plugins_clear_failure(void)
{
	failure[0] = '\0';
}

/* Run every plugin's hook for ctx->phase: in registration order, except
 * RESUME which unwinds in reverse.  Stops at the first failure. */
int plugins_run(const struct ckpt_hook_ctx *ctx, char *why, size_t why_size)
{
	int reverse = ctx->phase == CKPT_PHASE_RESUME;

	for (unsigned k = 0; k < nplugins; k++) {
		const struct ckpt_plugin *p = &plugins[reverse ? nplugins - 1 - k : k];
		int err;

		if (!p->hook)
			continue;
		failure[0] = '\0';
		err = p->hook(ctx, p->arg);
		if (err) {
			snprintf(why, why_size, "plugin %s: %s", p->name,
				 failure[0] ? failure : shim_strerror(err));
			return err;
		}
	}
	return 0;
}

void ckpt_warn(const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	for (char *c = msg; *c; c++)
		if (*c == '\n')
			*c = ' ';
	if (warn_fd >= 0) {
		char line[520];
		int n = snprintf(line, sizeof(line), "WARN %s\n", msg);

		if (write(warn_fd, line, n) == n)
			return;
	}
	if (coord_fd() < 0 || coord_send("WARN %s", msg))
		shim_log("warning: %s", msg);
}

int ckpt_kv_put(const char *key, const char *value)
{
	return kv_client_put(coord_kv(), key, value);
}

int ckpt_kv_get(const char *key, char *value, size_t size)
{
	return kv_client_get(coord_kv(), key, value, size);
}

/* The first process to claim key owns it: 0; else EEXIST, owner filled. */
int kv_claim(const char *key, const char *value, char *owner, size_t size)
{
	return kv_client_claim(coord_kv(), key, value, owner, size);
}

/* Whether this process owns key: it claimed it first (or the
 * coordinator cannot say, and the process acts alone). */
int kv_claim_mine(const char *key)
{
	char value[16], owner[64];

	snprintf(value, sizeof(value), "%d", getpid());
	return !(kv_claim(key, value, owner, sizeof(owner)) == EEXIST && atoi(owner) != getpid());
}

/* Until key is there (0), or `seconds` have passed (ETIMEDOUT). */
int kv_wait(const char *key, int seconds)
{
	return kv_client_mwait(coord_kv(), seconds, key, NULL, 0);
}
