/*
 * Kernel AIO (io_setup, io_submit, io_getevents), as databases use it
 * through libaio: one context; each step submits a write of its block of a
 * file and a read of the block before, and takes the two completions of
 * the step before last, so the ring always holds completed events nobody
 * has taken yet.  Every completion must come once, in order, with its
 * result, and every read must find what was written.  After a restart the
 * context is the same number and its ring still holds those events.
 * A second context always has a poll request (IOCB_CMD_POLL) on a pipe
 * submitted: in flight while the step sleeps, or (every third step)
 * completed in the ring already; the next step makes the pipe readable if
 * it was not and must reap exactly that poll's completion, once.
 *
 *   aio_context [steps] [ms-per-step] [dir]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/aio_abi.h>
#include <poll.h>
#include <string.h>
#include <sys/syscall.h>
#include "zdtm.h"

#define BLOCK 64
#define KEEP 2				/* steps whose completions wait in the ring */
#define BUFS (KEEP + 2)

static aio_context_t ctx, poll_ctx;
static int fd, pipe_fds[2];
static struct iocb poll_cb;
static int poll_ready;			/* the pipe holds a byte */
static struct iocb cbs[BUFS][2];
static char wbuf[BUFS][BLOCK], rbuf[BUFS][BLOCK];

static void pattern(char *p, long step)
{
	uint64_t s = zdtm_mix(step + 7, 0xa10);

	for (int i = 0; i < BLOCK; i += 8) {
		uint64_t v = zdtm_xorshift(&s);

		memcpy(p + i, &v, 8);
	}
}

static void submit_step(long step)
{
	struct iocb *w = &cbs[step % BUFS][0], *r = &cbs[step % BUFS][1];
	struct iocb *list[2] = { w, r };

	pattern(wbuf[step % BUFS], step);
	*w = (struct iocb){ .aio_data = step * 2, .aio_lio_opcode = IOCB_CMD_PWRITE,
			    .aio_fildes = fd, .aio_buf = (uint64_t)(uintptr_t)wbuf[step % BUFS],
			    .aio_nbytes = BLOCK, .aio_offset = step * BLOCK };
	/* the block of the step before: written by its own submission */
	*r = (struct iocb){ .aio_data = step * 2 + 1, .aio_lio_opcode = IOCB_CMD_PREAD,
			    .aio_fildes = fd, .aio_buf = (uint64_t)(uintptr_t)rbuf[step % BUFS],
			    .aio_nbytes = BLOCK, .aio_offset = (step - 1) * BLOCK };
	zdtm_check(syscall(SYS_io_submit, ctx, 2, list) == 2, "step %ld: io_submit: %m", step);
}

/* The two completions of a step, the oldest in the ring. */
static uint64_t take_step(long step, uint64_t hash)
{
	struct io_event ev[2];
	char want[BLOCK];

	zdtm_check(syscall(SYS_io_getevents, ctx, 2, 2, ev, NULL) == 2,
		   "step %ld: io_getevents: %m", step);
	for (int i = 0; i < 2; i++)
		zdtm_check(ev[i].data == (uint64_t)(step * 2 + i) && ev[i].res == BLOCK,
			   "step %ld: completion %llu (result %lld), not %ld", step,
			   (unsigned long long)ev[i].data, (long long)ev[i].res, step * 2 + i);
	pattern(want, step - 1);
	zdtm_check(!memcmp(rbuf[step % BUFS], want, BLOCK),
		   "step %ld: the read found other bytes than step %ld wrote", step, step - 1);
	return zdtm_mix(hash, want[step % BLOCK]);
}

static void submit_poll(long step)
{
	struct iocb *list[1] = { &poll_cb };

	poll_cb = (struct iocb){ .aio_data = step, .aio_lio_opcode = IOCB_CMD_POLL,
				 .aio_fildes = pipe_fds[0], .aio_buf = POLLIN };
	zdtm_check(syscall(SYS_io_submit, poll_ctx, 1, list) == 1, "step %ld: poll submit: %m",
		   step);
	if (step % 3 == 0) {		/* completed before the step sleeps */
		zdtm_check(write(pipe_fds[1], "p", 1) == 1, "step %ld: pipe write: %m", step);
		poll_ready = 1;
	}
}

/* The completion of the poll submitted at step, and no other. */
static uint64_t take_poll(long step, uint64_t hash)
{
	struct timespec wait = { 10, 0 }, none = { 0, 0 };
	struct io_event ev[2];
	char byte;
	long n;

	if (!poll_ready)
		zdtm_check(write(pipe_fds[1], "p", 1) == 1, "step %ld: pipe write: %m", step);
	n = syscall(SYS_io_getevents, poll_ctx, 1, 1, ev, &wait);
	zdtm_check(n == 1, "step %ld: the poll's completion did not come (%ld): %m", step, n);
	zdtm_check(ev[0].data == (uint64_t)step && ev[0].obj == (uint64_t)(uintptr_t)&poll_cb &&
		   (ev[0].res & POLLIN), "step %ld: poll completion %llu (result %lld)", step,
		   (unsigned long long)ev[0].data, (long long)ev[0].res);
	n = syscall(SYS_io_getevents, poll_ctx, 0, 2, ev, &none);
	zdtm_check(n == 0, "step %ld: %ld more poll completions (one came twice?)", step, n);
	zdtm_check(read(pipe_fds[0], &byte, 1) == 1 && byte == 'p', "step %ld: pipe read: %m",
		   step);
	poll_ready = 0;
	return zdtm_mix(hash, (uint64_t)ev[0].res + step);
}

int main(int argc, char **argv)
{
	long steps = 300, pace = 10;
	const char *dir = argc > 3 ? argv[3] : ".";
	aio_context_t first;
	uint64_t hash = 0;
	char path[4096];

	zdtm_args(argc, argv, &steps, &pace);
	snprintf(path, sizeof(path), "%s/aio_context.data", dir);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	zdtm_check(fd >= 0, "open %s: %m", path);
	pattern(wbuf[0], 0);		/* step 1 reads it */
	zdtm_check(pwrite(fd, wbuf[0], BLOCK, 0) == BLOCK, "write block 0: %m");
	zdtm_check(syscall(SYS_io_setup, 8, &ctx) == 0, "io_setup: %m");
	zdtm_check(syscall(SYS_io_setup, 4, &poll_ctx) == 0, "io_setup: %m");
	zdtm_check(pipe(pipe_fds) == 0, "pipe: %m");
	submit_poll(0);
	first = ctx;
	printf("READY\n");
	fflush(stdout);
	for (long step = 1; step <= steps; step++) {
		submit_step(step);
		if (step > KEEP)
			hash = take_step(step - KEEP, hash);
		hash = take_poll(step - 1, hash);
		submit_poll(step);
		zdtm_pace(pace);
	}
	zdtm_hold();
	hash = take_poll(steps, hash);
	for (long step = steps - KEEP + 1; step <= steps; step++)
		hash = take_step(step, hash);
	zdtm_check(ctx == first, "the context changed");
	zdtm_check(syscall(SYS_io_destroy, ctx) == 0, "io_destroy: %m");
	zdtm_check(syscall(SYS_io_destroy, poll_ctx) == 0, "io_destroy: %m");
	zdtm_pass("%ld steps, %016llx", steps, (unsigned long long)hash);
	return 0;
}
