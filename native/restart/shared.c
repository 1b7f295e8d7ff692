/*
 * What the processes of one restart share: pipes, sockets and shared
 * memory objects (MAP_SHARED anonymous memory, memfds, /dev/shm files).
 * pid 1 of the restart namespace creates each one once, filled with its
 * saved contents, before any restored process exists: every process
 * inherits them, above every fd number of the images, and takes the ones
 * its image names.  A pipe with an end outside the job is not recreated.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>
#include "restart.h"
#include "sys.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

struct shared_pipe {
	uint64_t id;
	int end[2];			/* read, write */
};

struct shared_shm {
	uint64_t id;
	uint64_t size;
	const struct loaded_vma *file;	/* a /dev/shm file, or NULL: a memfd */
	int fd;
};

/* A range of a shm object already filled from some image. */
struct filled {
	uint64_t id, lo, hi;
};

struct shared_socket {
	uint64_t id;
	const struct loaded_fd *rec;	/* its first record */
	const struct image *img;	/* and the image that has it */
	int fd;
};

static struct shared_pipe *pipes;
static unsigned npipes;
static struct shared_shm *shms;
static unsigned nshms;
static struct shared_socket *socks;
static unsigned nsocks;

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

static struct shared_pipe *find_pipe(uint64_t id)
{
	for (unsigned i = 0; i < npipes; i++)
		if (pipes[i].id == id)
			return &pipes[i];
	return NULL;
}

/* The pipe's bytes, from the first reader that saved them. */
static void refill_pipe(struct image *imgs, unsigned n, const struct shared_pipe *sp)
{
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < imgs[i].nfds; j++) {
			const struct loaded_fd *lf = &imgs[i].fds[j];

			if (lf->f.kind == CKPT_FD_PIPE_READ && lf->f.object_id == sp->id &&
			    lf->f.data_size) {
				write_all(sp->end[1], lf->data, lf->f.data_size, "a pipe");
				return;
			}
		}
}

static void create_pipes(struct image *imgs, unsigned n)
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
			    !job_has_end(imgs, n, lf->f.object_id, CKPT_FD_PIPE_WRITE))
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
		}
}

static struct shared_shm *find_shm(uint64_t id)
{
	for (unsigned i = 0; i < nshms; i++)
		if (shms[i].id == id)
			return &shms[i];
	return NULL;
}

static int already_filled(const struct filled *done, unsigned ndone, uint64_t id,
			  uint64_t lo, uint64_t hi)
{
	for (unsigned i = 0; i < ndone; i++)
		if (done[i].id == id && done[i].lo <= lo && done[i].hi >= hi)
			return 1;
	return 0;
}

/* One region's saved pages, read straight into the object. */
static void fill_from(struct image *img, const struct loaded_vma *lv, int fd)
{
	const struct ckpt_vma *v = &lv->v;
	uint64_t len = v->end - v->start;
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, v->pgoff);
	uint64_t off = v->data_offset;

	if (p == MAP_FAILED)
		die("cannot fill shared memory: %s", strerror(errno));
	for (uint64_t r = 0; r < v->nruns; r++) {
		uint64_t bytes = lv->runs[r].npages * CKPT_PAGE_SIZE;

		madvise(p + lv->runs[r].offset, bytes, MADV_POPULATE_WRITE);
		read_exact_at(img, p + lv->runs[r].offset, bytes, off);
		off += bytes;
	}
	munmap(p, len);
}

static int is_shared_memory(const struct ckpt_vma *v)
{
	return v->shm_id &&
	       (v->kind == CKPT_VMA_SHARED_ANON || v->kind == CKPT_VMA_SHARED_MEMFILE);
}

/* A memfd; or the /dev/shm file, at its checkpointed size, whose pages
 * are then written back. */
static int open_shm_object(const struct shared_shm *s)
{
	int fd;

	if (!s->file) {
		fd = memfd_create("ckpt-shared", MFD_CLOEXEC);
		if (fd < 0 || ftruncate(fd, s->size))
			die("cannot recreate shared memory: %s", strerror(errno));
		return fd;
	}
	fd = open(s->file->path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0 || ftruncate(fd, s->file->v.file_size > s->size ? s->file->v.file_size : s->size))
		die("cannot restore shared file %s: %s", s->file->path, strerror(errno));
	return fd;
}

static void create_shms(struct image *imgs, unsigned n)
{
	unsigned total = 0, ndone = 0;
	struct filled *done;

	for (unsigned i = 0; i < n; i++)
		total += imgs[i].nvmas;
	shms = arena_alloc(sizeof(*shms) * (total + 1));
	done = arena_alloc(sizeof(*done) * (total + 1));
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < imgs[i].nvmas; j++) {
			const struct ckpt_vma *v = &imgs[i].vmas[j].v;
			struct shared_shm *s;

			if (!is_shared_memory(v))
				continue;
			s = find_shm(v->shm_id);
			if (!s) {
				s = &shms[nshms++];
				s->id = v->shm_id;
				s->size = 0;
				s->file = v->kind == CKPT_VMA_SHARED_MEMFILE ? &imgs[i].vmas[j] : NULL;
			}
			if (v->pgoff + (v->end - v->start) > s->size)
				s->size = v->pgoff + (v->end - v->start);
		}
	for (unsigned i = 0; i < nshms; i++)
		shms[i].fd = move_high(open_shm_object(&shms[i]), "shared memory");
	/* every process saved what it mapped: fill each range once */
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < imgs[i].nvmas; j++) {
			const struct loaded_vma *lv = &imgs[i].vmas[j];
			uint64_t lo = lv->v.pgoff, hi = lo + (lv->v.end - lv->v.start);

			if (!is_shared_memory(&lv->v) ||
			    already_filled(done, ndone, lv->v.shm_id, lo, hi))
				continue;
			fill_from(&imgs[i], lv, find_shm(lv->v.shm_id)->fd);
			done[ndone++] = (struct filled){ lv->v.shm_id, lo, hi };
		}
}

/* ---- sockets ---- */

static struct shared_socket *find_socket(uint64_t id)
{
	for (unsigned i = 0; i < nsocks; i++)
		if (socks[i].id == id)
			return &socks[i];
	return NULL;
}

static int same_addr(const struct ckpt_sockaddr *a, const struct ckpt_sockaddr *b)
{
	return a->len && a->len == b->len && !memcmp(a->addr, b->addr, a->len);
}

static const struct sockaddr *sa(const struct ckpt_sockaddr *a)
{
	return (const struct sockaddr *)a->addr;
}

static int new_socket(const struct ckpt_fd *f)
{
	int s = socket(f->sock_domain, f->sock_type | SOCK_CLOEXEC, 0);
	int one = 1;

	if (s < 0)
		die("cannot recreate a socket: %s", strerror(errno));
	if (f->sock_domain != AF_UNIX)
		setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	return move_high(s, "a socket");
}

/* A Unix socket file left by the checkpointed process is in the way. */
static void unlink_stale_name(const struct ckpt_fd *f)
{
	const struct sockaddr_un *un = (const void *)f->sock_local.addr;
	struct stat st;

	if (f->sock_domain == AF_UNIX && un->sun_path[0] && stat(un->sun_path, &st) == 0 &&
	    S_ISSOCK(st.st_mode))
		unlink(un->sun_path);
}

static void bind_as_before(int s, const struct shared_socket *ss)
{
	const struct ckpt_fd *f = &ss->rec->f;

	/* a relative socket file name is relative to the process's cwd */
	if (f->sock_domain == AF_UNIX && chdir(ss->img->proc->cwd))
		die("cannot bind socket %s: %s: %s", f->sock_local.addr + 2, ss->img->proc->cwd,
		    strerror(errno));
	unlink_stale_name(f);
	if (bind(s, sa(&f->sock_local), f->sock_local.len))
		die("cannot bind a socket to its address again: %s", strerror(errno));
}

/* The record of the other end of a connection inside the job. */
static const struct loaded_fd *peer_record(const struct loaded_fd *lf)
{
	const struct ckpt_fd *f = &lf->f;

	for (unsigned i = 0; i < nsocks; i++) {
		const struct ckpt_fd *o = &socks[i].rec->f;

		if (o == f || !(o->sock_flags & CKPT_SOCK_CONNECTED) ||
		    o->sock_domain != f->sock_domain || o->sock_type != f->sock_type)
			continue;
		if (f->sock_domain == AF_UNIX ? (f->peer_id && o->object_id == f->peer_id) :
		    (same_addr(&o->sock_local, &f->sock_peer) &&
		     same_addr(&o->sock_peer, &f->sock_local)))
			return socks[i].rec;
	}
	return NULL;
}

/* A TCP connection with both ends in the job, on the same ports: through
 * a listener of a moment on the accepting end's address. */
static void tcp_pair(const struct ckpt_fd *a, const struct ckpt_fd *b, int *fa, int *fb)
{
	int l = new_socket(b);

	if (bind(l, sa(&b->sock_local), b->sock_local.len) || listen(l, 1))
		die("cannot reconnect a TCP connection (port in use?): %s", strerror(errno));
	*fa = new_socket(a);
	if (bind(*fa, sa(&a->sock_local), a->sock_local.len) ||
	    connect(*fa, sa(&b->sock_local), b->sock_local.len))
		die("cannot reconnect a TCP connection: %s", strerror(errno));
	*fb = accept4(l, NULL, NULL, SOCK_CLOEXEC);
	if (*fb < 0)
		die("cannot reconnect a TCP connection: %s", strerror(errno));
	*fb = move_high(*fb, "a socket");
	close(l);
}

static void connect_pair(struct shared_socket *a, struct shared_socket *b)
{
	int sv[2];

	if (a->rec->f.sock_domain != AF_UNIX) {
		tcp_pair(&a->rec->f, &b->rec->f, &a->fd, &b->fd);
		return;
	}
	if (socketpair(AF_UNIX, a->rec->f.sock_type | SOCK_CLOEXEC, 0, sv))
		die("cannot recreate a socket pair: %s", strerror(errno));
	a->fd = move_high(sv[0], "a socket");
	b->fd = move_high(sv[1], "a socket");
}

/* Connected to an address that is not a socket of the job: connect
 * again (a listener of the job, or a server that is still there). */
static int reconnect(const struct ckpt_fd *f)
{
	int s = new_socket(f);

	if (f->sock_domain != AF_UNIX && (f->sock_flags & CKPT_SOCK_BOUND))
		bind(s, sa(&f->sock_local), f->sock_local.len);
	if (!f->sock_peer.len || connect(s, sa(&f->sock_peer), f->sock_peer.len))
		warn("a socket connected outside the job (%s) could not be reconnected: %s",
		     f->sock_domain == AF_UNIX ? ((const struct sockaddr_un *)f->sock_peer.addr)->sun_path :
		     "TCP", strerror(errno));
	return s;
}

static void send_all(int s, const char *p, size_t len)
{
	while (len) {
		ssize_t n = send(s, p, len, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			die("cannot refill a socket: %s", strerror(errno));
		p += n;
		len -= n;
	}
}

/* The saved receive queue of rec, sent again by its peer end. */
static void refill_socket(const struct loaded_fd *lf, int peer)
{
	const char *p = lf->data, *end = lf->data + lf->f.data_size;

	if (lf->f.sock_type == SOCK_STREAM) {
		send_all(peer, p, end - p);
		return;
	}
	while (p + 4 <= end) {
		uint32_t len;

		memcpy(&len, p, 4);
		if (p + 4 + len > end)
			die("corrupt socket queue record");
		if (send(peer, p + 4, len, MSG_NOSIGNAL) != (ssize_t)len)
			die("cannot refill a socket: %s", strerror(errno));
		p += 4 + len;
	}
}

static void collect_sockets(struct image *imgs, unsigned n)
{
	unsigned total = 0;

	for (unsigned i = 0; i < n; i++)
		total += imgs[i].nfds;
	socks = arena_alloc(sizeof(*socks) * (total + 1));
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < imgs[i].nfds; j++) {
			const struct loaded_fd *lf = &imgs[i].fds[j];

			if (lf->f.kind != CKPT_FD_SOCKET || lf->f.dup_of >= 0 ||
			    find_socket(lf->f.object_id))
				continue;
			socks[nsocks++] = (struct shared_socket){ lf->f.object_id, lf, &imgs[i], -1 };
		}
}

/* Connections inside the job first (TCP ones need their ports before
 * any listener takes them), then listeners and named sockets, then
 * connections to those, then the rest. */
static void create_sockets(struct image *imgs, unsigned n)
{
	collect_sockets(imgs, n);
	for (unsigned i = 0; i < nsocks; i++) {
		const struct loaded_fd *peer;

		if (socks[i].fd >= 0 || !(socks[i].rec->f.sock_flags & CKPT_SOCK_CONNECTED))
			continue;
		peer = peer_record(socks[i].rec);
		if (peer)
			connect_pair(&socks[i], find_socket(peer->f.object_id));
	}
	for (unsigned i = 0; i < nsocks; i++) {
		const struct ckpt_fd *f = &socks[i].rec->f;

		if (socks[i].fd >= 0 || (f->sock_flags & CKPT_SOCK_CONNECTED) ||
		    !(f->sock_flags & (CKPT_SOCK_BOUND | CKPT_SOCK_LISTENING)))
			continue;
		socks[i].fd = new_socket(f);
		bind_as_before(socks[i].fd, &socks[i]);
		if ((f->sock_flags & CKPT_SOCK_LISTENING) && listen(socks[i].fd, f->sock_backlog))
			die("cannot listen again: %s", strerror(errno));
	}
	for (unsigned i = 0; i < nsocks; i++)
		if (socks[i].fd < 0)
			socks[i].fd = socks[i].rec->f.sock_flags & CKPT_SOCK_CONNECTED ?
				reconnect(&socks[i].rec->f) : new_socket(&socks[i].rec->f);
	for (unsigned i = 0; i < nsocks; i++) {
		const struct loaded_fd *lf = socks[i].rec, *peer;

		if (!lf->f.data_size)
			continue;
		peer = peer_record(lf);
		if (peer)
			refill_socket(lf, find_socket(peer->f.object_id)->fd);
		else
			warn("%zu bytes queued on a socket from outside the job are dropped",
			     (size_t)lf->f.data_size);
	}
}

void shared_create(struct image *imgs, unsigned n)
{
	create_pipes(imgs, n);
	create_shms(imgs, n);
	create_sockets(imgs, n);
}

int shared_socket_fd(uint64_t id)
{
	const struct shared_socket *s = find_socket(id);

	return s ? s->fd : -1;
}

int shared_pipe_end(uint64_t id, int write_end)
{
	const struct shared_pipe *sp = find_pipe(id);

	return sp ? sp->end[write_end] : -1;
}

int shared_shm_fd(uint64_t id)
{
	const struct shared_shm *s = id ? find_shm(id) : NULL;

	return s ? s->fd : -1;
}

/* The fds a restored process keeps while it restores. */
unsigned shared_fds(int *out, unsigned max)
{
	unsigned k = 0;

	for (unsigned i = 0; i < npipes && k + 2 <= max; i++) {
		out[k++] = pipes[i].end[0];
		out[k++] = pipes[i].end[1];
	}
	for (unsigned i = 0; i < nshms && k < max; i++)
		out[k++] = shms[i].fd;
	for (unsigned i = 0; i < nsocks && k < max; i++)
		out[k++] = socks[i].fd;
	return k;
}

/* Pipes and sockets: once the fds are in place. */
void shared_close_pipes(void)
{
	for (unsigned i = 0; i < npipes; i++) {
		close(pipes[i].end[0]);
		close(pipes[i].end[1]);
	}
	for (unsigned i = 0; i < nsocks; i++)
		close(socks[i].fd);
}

/* After the memory is back: raw system calls only. */
void shared_close_shms(void)
{
	for (unsigned i = 0; i < nshms; i++)
		sys1(SYS_close, shms[i].fd);
}
