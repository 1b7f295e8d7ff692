/*
 * libckpt.so: loaded with LD_PRELOAD into every process of a job.  Its
 * constructor reserves the address range ckpt-restart will run in,
 * installs the parking signal and starts the checkpoint thread, which
 * connects to the coordinator named in $CKPT_COORD.  Without $CKPT_COORD
 * the shim does nothing.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "shim.h"

static int reserve_restart_range(void)
{
	void *p = shim_mmap((void *)CKPT_RESERVE_START, CKPT_RESERVE_SIZE, PROT_NONE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE,
		       -1, 0);

	if (p == MAP_FAILED)
		return errno;
	return 0;
}

__attribute__((constructor)) static void shim_init(void)
{
	const char *coord = getenv("CKPT_COORD");
	int err;

	if (!coord || !*coord)
		return;
	err = reserve_restart_range();
	if (err && err != EEXIST)	/* EEXIST: inherited across fork */
		shim_log("cannot reserve the restart address range: %s", shim_strerror(err));
	err = signals_init(quiesce_handler);
	if (err) {
		shim_log("cannot install the checkpoint signal: %s", shim_strerror(err));
		return;
	}
	syscall_sites_init();
	seccomp_init();
	fds_plugin_init();
	err = checkpointer_start(coord);
	if (err) {
		shim_log("cannot start the checkpoint thread: %s", shim_strerror(err));
		return;
	}
	exec_follow_init();
	err = checkpointer_follow_forks();
	if (err)
		shim_log("cannot follow forked children: %s", shim_strerror(err));
}
