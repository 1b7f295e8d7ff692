/*
 * The kinds of process state the engine asks at fixed moments of a
 * checkpoint, in one table: a new kind that must refuse a checkpoint, take
 * something out of the kernel while the threads are parked, or act after a
 * restart adds a line here (its record is written by writer.c; state kept
 * per fd goes through the built-in fds plugin, state/fds.c).
 */
#define _GNU_SOURCE
#include <stddef.h>
#include "shim.h"

struct state_kind {
	const char *name;
	/* before the threads are parked: 0, or an errno with why */
	int (*before_parking)(char *why, size_t size);
	/* once they are (no thread reads /proc/self/maps meanwhile) */
	int (*parked)(char *why, size_t size);
	/* SUSPEND succeeded, plugins included */
	void (*suspended)(void);
	/* RESUME after a restart, once the coordinator has the answer */
	void (*restarted)(void);
};

static const struct state_kind kinds[] = {
	{ "seccomp", seccomp_check_threads, NULL, NULL, NULL },
	{ "memory", NULL, memory_unsupported, NULL, NULL },
	{ "aio", NULL, aio_requests_unsupported, NULL, NULL },
	{ "task files", task_files_unsupported, NULL, NULL, NULL },
	{ "stopped children", NULL, NULL, stopped_children_note, stopped_children_restore },
	{ "inotify", NULL, inotify_take_queued, NULL, inotify_taken_restarted },
};

#define NKINDS (sizeof(kinds) / sizeof(kinds[0]))

int state_kinds_before_parking(char *why, size_t size)
{
	for (size_t i = 0; i < NKINDS; i++) {
		int err = kinds[i].before_parking ? kinds[i].before_parking(why, size) : 0;

		if (err)
			return err;
	}
	return 0;
}

int state_kinds_parked(char *why, size_t size)
{
	for (size_t i = 0; i < NKINDS; i++) {
		int err = kinds[i].parked ? kinds[i].parked(why, size) : 0;

		if (err)
			return err;
	}
	return 0;
}

void state_kinds_suspended(void)
{
	for (size_t i = 0; i < NKINDS; i++)
		if (kinds[i].suspended)
			kinds[i].suspended();
}

void state_kinds_restarted(void)
{
	for (size_t i = 0; i < NKINDS; i++)
		if (kinds[i].restarted)
			kinds[i].restarted();
}
