/*
 * Plugin hooks of the shim.  A plugin (built in, like the fd plugin, or a
 * separate LD_PRELOAD library such as plugins/ib) registers one hook table;
 * the checkpoint thread calls every plugin's hook for each phase named in
 * ckpt_protocol.h, in registration order (reverse order for RESUME).
 *
 * Hooks run in the checkpoint thread while every other thread of the
 * process is parked: they must not take locks the application may hold
 * (no malloc, no stdio, no __thread variables).  That thread has an fd
 * table of its own: the application's fd N is /proc/<pid>/fd/N there.  A hook returns 0 or a positive errno, and may
 * set a one-line message with ckpt_hook_fail().
 */
#ifndef CKPT_PLUGIN_H
#define CKPT_PLUGIN_H

#include <stddef.h>
#include "ckpt_protocol.h"

struct ckpt_hook_ctx {
	enum ckpt_phase phase;
	unsigned seq;			/* checkpoint number */
	int restarted;			/* 1 in the restart phases */
	int aborted;			/* RESUME after a failed checkpoint */
	const char *arg;		/* the phase's argument (FLUSH: the marker), or NULL */
};

struct ckpt_plugin {
	const char *name;
	int (*hook)(const struct ckpt_hook_ctx *ctx, void *arg);
	void *arg;
};

/* Register a plugin; returns 0 or ENOSPC.  Call from a constructor. */
__attribute__((visibility("default")))
int ckpt_plugin_register(const struct ckpt_plugin *plugin);

/* Name service of the coordinator, for exchanging new real ids on restart.
 * Keys and values are printable and contain no spaces. */
__attribute__((visibility("default")))
int ckpt_kv_put(const char *key, const char *value);
__attribute__((visibility("default")))
int ckpt_kv_get(const char *key, char *value, size_t size);	/* ENOENT if absent */

/* The coordinator's socket, for a plugin thread that opens a connection
 * of its own ("KV" first line: name service only, see docs/PROTOCOL.md). */
__attribute__((visibility("default")))
const char *ckpt_coordinator_path(void);

/*
 * A plugin that rebuilds the files behind application fds after RESUME,
 * once the threads run (plugins/ib), holds the waits the checkpoint
 * interrupted (poll, select, epoll_wait and their kin) until it is done:
 * entered again on a placeholder they would wake at once, or sleep on a
 * file about to be replaced and never hear of the new one.  Hold from the
 * RESUME hook, before the threads run; release from any thread.
 */
__attribute__((visibility("default")))
void ckpt_resume_waits_hold(void);
__attribute__((visibility("default")))
void ckpt_resume_waits_release(void);

/*
 * A connected socket the plugin keeps to something outside the job on
 * purpose and does without after a restart (ckpt-remote's connection to
 * Slurm's PMI server): the checkpoint says nothing of it and the restart
 * gives it back unconnected.  left 0 undoes it.
 */
__attribute__((visibility("default")))
void ckpt_fd_left_outside(int fd, int left);

/* Report a one-line problem to the coordinator (printed to the user). */
void ckpt_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2), visibility("default")));

/* Reason for the failure a hook is about to return. */
void ckpt_hook_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), visibility("default")));

#endif
