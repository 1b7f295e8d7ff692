/*
 * What the processes of one restart share: pipes (pipes.c), shared memory
 * (shm.c), sockets (sockets.c), ptys (ptys.c), open files (files.c) and
 * message queues (mqueues.c).  pid 1 of the restart namespace creates each
 * one once, filled with its saved contents, before any restored process
 * exists: every process inherits them, above every fd number of the
 * images, and takes the ones its image names.
 */
#define _GNU_SOURCE
#include "restart.h"

void shared_create(struct image *imgs, unsigned n, const char *coord)
{
	recreate_gone_scratch_files(imgs, n);
	pipes_create(imgs, n);
	fifos_create(imgs, n);
	shms_create(imgs, n);
	sockets_create(imgs, n, coord);
	ptys_create(imgs, n);
	files_create(imgs, n);
	mqueues_create(imgs, n);
}

/* The fds a restored process keeps while it restores. */
unsigned shared_fds(int *out, unsigned max)
{
	unsigned k = 0;

	k += pipe_fds(out + k, max - k);
	k += shm_fds(out + k, max - k);
	k += socket_fds(out + k, max - k);
	k += pty_fds(out + k, max - k);
	k += open_file_fds(out + k, max - k);
	k += dev_tty_fds(out + k, max - k);
	return k + mqueue_fds(out + k, max - k);
}

/* Pipes, sockets, ptys, shared open files and message queues: once the
 * fds are in place. */
void shared_close_pipes(void)
{
	pipes_close();
	sockets_close();
	ptys_close();
	files_close();
	mqueues_close();
}

/* After the memory is back: raw system calls only. */
void shared_close_shms(void)
{
	shms_close();
}
