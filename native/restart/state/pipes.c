/*
 * Pipes and FIFOs of the job (saved by native/shim/state/fds.c): pid 1 of
 * the restart namespace makes each pipe once, refilled with the bytes its
 * readers had not read, before any restored process exists.  A pipe with
 * an end outside the job is not recreated.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <linux/filter.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <stdlib.h>
#include <termios.h>
#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <linux/if_packet.h>
#include <linux/netlink.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include "ckpt_sockopts.h"
#include "restart.h"
#include "sys.h"

struct shared_pipe {
	uint64_t id;
	int end[2];			/* read, write */
};

static struct shared_pipe *pipes;
static unsigned npipes;

static int is_pipe(const struct loaded_fd *lf)
{
	return lf->f.dup_of < 0 &&
	       (lf->f.kind == CKPT_FD_PIPE_READ || lf->f.kind == CKPT_FD_PIPE_WRITE);
}

static int job_has_end(struct image *imgs, unsigned n, uint64_t id, uint32_t kind)
{
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < imgs[i].nfds; j++)
			if (imgs[i].fds[j].f.kind == kind && imgs[i].fds[j].f.object_id == id)
				return 1;
	return 0;
}

/* A pipe whose writers had all closed it: its readers saw so. */
static int writers_gone(struct image *imgs, unsigned n, uint64_t id)
{
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < imgs[i].nfds; j++)
			if (imgs[i].fds[j].f.kind == CKPT_FD_PIPE_READ &&
			    imgs[i].fds[j].f.object_id == id && imgs[i].fds[j].f.value[0] == 1)
				return 1;
	return 0;
}

static struct shared_pipe *find_pipe(uint64_t id)
{
	for (unsigned i = 0; i < npipes; i++)
		if (pipes[i].id == id)
			return &pipes[i];
	return NULL;
}

/* Pair of copy_one (native/shim/state/fds.c) in packet mode: each packet in a
 * write of its own, through an end in packet mode. */
static void refill_packets(int end, const struct loaded_fd *lf)
{
	const char *p = lf->data, *stop = lf->data + lf->f.data_size;

	if (fcntl(end, F_SETFL, O_DIRECT))
		die("cannot put a pipe in packet mode: %s", strerror(errno));
	while (stop - p >= 4) {
		uint32_t len;

		memcpy(&len, p, 4);
		if (len > (uint64_t)(stop - p - 4))
			die("a pipe's saved packets are damaged");
		write_all(end, p + 4, len, "a pipe");
		p += 4 + len;
	}
	fcntl(end, F_SETFL, 0);
}

/* The pipe's bytes, from the first reader that saved them. */
static void refill_pipe(struct image *imgs, unsigned n, const struct shared_pipe *sp)
{
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < imgs[i].nfds; j++) {
			const struct loaded_fd *lf = &imgs[i].fds[j];

			if (lf->f.kind != CKPT_FD_PIPE_READ || lf->f.object_id != sp->id ||
			    !lf->f.data_size)
				continue;
			if (lf->f.value[1])
				refill_packets(sp->end[1], lf);
			else
				write_all(sp->end[1], lf->data, lf->f.data_size, "a pipe");
			return;
		}
}

/*
 * A FIFO with bytes in it: the restart holds it open (read and write) and
 * puts the bytes back once; every process of the job inherits that fd and
 * keeps it until it has opened the FIFO by name itself.
 */
void fifos_create(struct image *imgs, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < imgs[i].nfds; j++) {
			const struct loaded_fd *lf = &imgs[i].fds[j];
			struct shared_pipe *sp;
			int fd;

			if (lf->f.kind != CKPT_FD_FIFO || !lf->f.data_size || find_pipe(lf->f.object_id))
				continue;
			make_fifo_again(lf);
			fd = open(lf->path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
			if (fd < 0)
				die("cannot reopen fifo %s: %s", lf->path, strerror(errno));
			sp = &pipes[npipes++];
			sp->id = lf->f.object_id;
			sp->end[0] = move_high(fd, "a fifo");
			sp->end[1] = fcntl(sp->end[0], F_DUPFD_CLOEXEC, sp->end[0]);
			write_all(sp->end[0], lf->data, lf->f.data_size, "a fifo");
		}
}

void pipes_create(struct image *imgs, unsigned n)
{
	unsigned total = 0;

	for (unsigned i = 0; i < n; i++)
		total += imgs[i].nfds;
	pipes = arena_alloc(sizeof(*pipes) * (total + 1));
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < imgs[i].nfds; j++) {
			const struct loaded_fd *lf = &imgs[i].fds[j];
			struct shared_pipe *sp;
			int p[2];

			if (!is_pipe(lf) || find_pipe(lf->f.object_id) ||
			    !job_has_end(imgs, n, lf->f.object_id, CKPT_FD_PIPE_READ) ||
			    (!job_has_end(imgs, n, lf->f.object_id, CKPT_FD_PIPE_WRITE) &&
			     !writers_gone(imgs, n, lf->f.object_id)))
				continue;
			if (pipe2(p, O_CLOEXEC))
				die("cannot recreate a pipe: %s", strerror(errno));
			sp = &pipes[npipes++];
			sp->id = lf->f.object_id;
			sp->end[0] = move_high(p[0], "a pipe");
			sp->end[1] = move_high(p[1], "a pipe");
			if (lf->f.offset > 0)	/* the saved capacity */
				fcntl(sp->end[1], F_SETPIPE_SZ, (int)lf->f.offset);
			refill_pipe(imgs, n, sp);
			if (!job_has_end(imgs, n, lf->f.object_id, CKPT_FD_PIPE_WRITE)) {
				/* no writer: the readers find EOF after the bytes */
				close(sp->end[1]);
				sp->end[1] = fcntl(sp->end[0], F_DUPFD_CLOEXEC, sp->end[0]);
			}
		}
}

int shared_pipe_end(uint64_t id, int write_end)
{
	const struct shared_pipe *sp = find_pipe(id);

	return sp ? sp->end[write_end] : -1;
}

unsigned pipe_fds(int *out, unsigned max)
{
	unsigned k = 0;

	for (unsigned i = 0; i < npipes && k + 2 <= max; i++) {
		out[k++] = pipes[i].end[0];
		out[k++] = pipes[i].end[1];
	}
	return k;
}

void pipes_close(void)
{
	for (unsigned i = 0; i < npipes; i++) {
		close(pipes[i].end[0]);
		close(pipes[i].end[1]);
	}
}
