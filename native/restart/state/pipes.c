/*
 * Pipes and FIFOs of the job (saved by native/shim/state/fds.c): pid 1 of
 * the restart namespace makes each pipe once, refilled with the bytes its
 * readers had not read, before any restored process exists.  A pipe with
 * an end outside the job is not recreated; one whose other side had all
 * closed (no writer: EOF; no reader: EPIPE) is.
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

/* An open file of a pipe end: the one pipe() made (file -1: the end
 * itself), or another, opened again through /proc (the program had done
 * so); named by the fd of the process that owns it, which the processes
 * that inherited it name as theirs (share_pid, share_fd). */
struct pipe_open {
	int32_t pid, fd;
	uint64_t id;
	int write_end;
	int file;
};

static struct shared_pipe *pipes;
static unsigned npipes;
static struct pipe_open *opens;
static unsigned nopens;

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

/* A pipe whose readers had all closed it: its writers saw so. */
static int readers_gone(struct image *imgs, unsigned n, uint64_t id)
{
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < imgs[i].nfds; j++)
			if (imgs[i].fds[j].f.kind == CKPT_FD_PIPE_WRITE &&
			    imgs[i].fds[j].f.object_id == id && imgs[i].fds[j].f.value[0] == 1)
				return 1;
	return 0;
}

/* A pipe made again: both its ends in the job, or one end whose other side
 * was all closed (not one to outside the job). */
static int pipe_of_job(struct image *imgs, unsigned n, uint64_t id)
{
	int readers = job_has_end(imgs, n, id, CKPT_FD_PIPE_READ);
	int writers = job_has_end(imgs, n, id, CKPT_FD_PIPE_WRITE);

	if (readers)
		return writers || writers_gone(imgs, n, id);
	return writers && readers_gone(imgs, n, id);
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

static struct pipe_open *find_open(int32_t pid, int32_t fd)
{
	for (unsigned i = 0; i < nopens; i++)
		if (opens[i].pid == pid && opens[i].fd == fd)
			return &opens[i];
	return NULL;
}

static int end_opened(uint64_t id, int write_end)
{
	for (unsigned i = 0; i < nopens; i++)
		if (opens[i].id == id && opens[i].write_end == write_end)
			return 1;
	return 0;
}

/* A new open file on the pipe end: what open("/proc/self/fd/N") gave the
 * program. */
static int open_end_again(const struct shared_pipe *sp, int write_end)
{
	char path[64];
	int fd;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", sp->end[write_end]);
	fd = open(path, (write_end ? O_WRONLY : O_RDONLY) | O_CLOEXEC);
	if (fd < 0)
		die("cannot open a pipe end again: %s", strerror(errno));
	return move_high(fd, "a pipe end");
}

/* Each open file of each pipe end, once: the first is the end itself. */
static void create_opens(struct image *imgs, unsigned n, unsigned total)
{
	opens = arena_alloc(sizeof(*opens) * (total + 1));
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < imgs[i].nfds; j++) {
			const struct loaded_fd *lf = &imgs[i].fds[j];
			const struct shared_pipe *sp = is_pipe(lf) ? find_pipe(lf->f.object_id) : NULL;
			int32_t pid = lf->f.share_pid ? lf->f.share_pid : imgs[i].hdr.pid;
			int32_t fd = lf->f.share_pid ? lf->f.share_fd : lf->f.fd;
			int we = lf->f.kind == CKPT_FD_PIPE_WRITE;

			if (!sp || find_open(pid, fd))
				continue;
			/* a write end with no writer in the job is the read end */
			opens[nopens++] = (struct pipe_open){
				pid, fd, sp->id, we,
				end_opened(sp->id, we) &&
				(!we || job_has_end(imgs, n, sp->id, CKPT_FD_PIPE_WRITE)) ?
				open_end_again(sp, we) : -1 };
		}
}

/* The open file of the pipe end an fd record names, if it is not the
 * pipe's own: -1 then. */
int pipe_open_of(int32_t pid, const struct ckpt_fd *f)
{
	const struct pipe_open *o = f->share_pid ? find_open(f->share_pid, f->share_fd) :
				    find_open(pid, f->fd);

	return o ? o->file : -1;
}

/*
 * A pipe with no reader in the job, whose readers had all closed: its read
 * end goes once the other open files of its write end are made (opening
 * one needs a reader), so that writes fail with EPIPE as they did; the
 * read end's slot keeps the write end.
 */
static void close_orphan_readers(struct image *imgs, unsigned n)
{
	for (unsigned i = 0; i < npipes; i++) {
		struct shared_pipe *sp = &pipes[i];

		if (job_has_end(imgs, n, sp->id, CKPT_FD_PIPE_READ) ||
		    !readers_gone(imgs, n, sp->id))
			continue;
		close(sp->end[0]);
		sp->end[0] = fcntl(sp->end[1], F_DUPFD_CLOEXEC, sp->end[1]);
		if (sp->end[0] < 0)
			die("cannot keep a pipe's write end: %s", strerror(errno));
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
			    !pipe_of_job(imgs, n, lf->f.object_id))
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
	create_opens(imgs, n, total);
	close_orphan_readers(imgs, n);
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
	for (unsigned i = 0; i < nopens && k < max; i++)
		if (opens[i].file >= 0)
			out[k++] = opens[i].file;
	return k;
}

void pipes_close(void)
{
	for (unsigned i = 0; i < npipes; i++) {
		close(pipes[i].end[0]);
		close(pipes[i].end[1]);
	}
	for (unsigned i = 0; i < nopens; i++)
		if (opens[i].file >= 0)
			close(opens[i].file);
}
