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
	const char *name;		/* a memfd's path, "/memfd:NAME (deleted)" */
	int fd;				/* -1 for a System V segment */
	int sysv;
	int sysv_id;
};

/* A range of a shm object already filled from some image. */
struct filled {
	uint64_t id, lo, hi;
};

struct shared_socket {
	uint64_t id;
	const struct loaded_fd *rec;	/* the record with its queue, else its first */
	const struct image *img;	/* and the image that has it */
	int fd;
	int ghosted;			/* its queue came from a stand-in peer */
};

static struct shared_pipe *pipes;
static unsigned npipes;
static struct shared_shm *shms;
static unsigned nshms;
static struct shared_socket *socks;
static unsigned nsocks;

/* An open file inherited across fork: one open file, one offset. */
struct shared_file {
	int32_t pid, fd;		/* the process and fd that own it */
	int file;
};

static struct shared_file *files;
static unsigned nfiles;

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

/* Pair of copy_one (native/shim/fds.c) in packet mode: each packet in a
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
static void create_fifos(struct image *imgs, unsigned n)
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

static void fill_from(struct image *img, const struct loaded_vma *lv, const struct shared_shm *s)
{
	const struct ckpt_vma *v = &lv->v;
	uint64_t len = v->end - v->start;
	char *p;

	if (s->sysv) {
		p = shmat(s->sysv_id, NULL, 0);
		if (p == (void *)-1)
			die("cannot fill System V segment %d: %s", s->sysv_id, strerror(errno));
		read_region_at(img, lv, p + v->pgoff);
		shmdt(p);
		return;
	}
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, v->pgoff);
	if (p == MAP_FAILED)
		die("cannot fill shared memory: %s", strerror(errno));
	read_region_at(img, lv, p);
	munmap(p, len);
}

/* A System V segment with its old id, in the restart's IPC namespace. */
static void create_sysv(struct shared_shm *s, const struct ckpt_vma *v)
{
	char id[16];
	int fd = open("/proc/sys/kernel/shm_next_id", O_WRONLY | O_CLOEXEC);
	int got;

	snprintf(id, sizeof(id), "%d", v->sysv_id);
	if (fd < 0 || write(fd, id, strlen(id)) != (ssize_t)strlen(id))
		die("cannot choose the System V segment id %d: %s", v->sysv_id, strerror(errno));
	close(fd);
	got = shmget(v->sysv_key ? v->sysv_key : IPC_PRIVATE, v->sysv_size,
		     IPC_CREAT | IPC_EXCL | (v->sysv_mode & 0777));
	if (got < 0)
		die("cannot recreate System V segment %d: %s", v->sysv_id, strerror(errno));
	if (got != v->sysv_id)
		die("System V segment %d came back as %d", v->sysv_id, got);
	s->sysv = 1;
	s->sysv_id = got;
	s->fd = -1;
}

static int is_shared_memory(const struct ckpt_vma *v)
{
	return v->shm_id && (v->kind == CKPT_VMA_SHARED_ANON ||
			     v->kind == CKPT_VMA_SHARED_MEMFILE || v->kind == CKPT_VMA_SYSV_SHM);
}

/* A memfd; or the /dev/shm file, at its checkpointed size, whose pages
 * are then written back. */
static int open_shm_object(const struct shared_shm *s)
{
	int fd;

	if (!s->file) {
		char name[MEMFD_NAME_MAX] = "ckpt-shared";	/* MAP_SHARED | MAP_ANONYMOUS */

		if (s->name && !strncmp(s->name, "/memfd:", 7))
			memfd_name_of(s->name, name);
		/* its seals are the shim's to add, once it is mapped */
		fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
		if (fd < 0 || ftruncate(fd, s->size))
			die("cannot recreate shared memory: %s", strerror(errno));
		return fd;
	}
	make_parent_dirs(s->file->path);	/* a scratch file's may be gone */
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
				memset(s, 0, sizeof(*s));
				s->id = v->shm_id;
				s->file = v->kind == CKPT_VMA_SHARED_MEMFILE ? &imgs[i].vmas[j] : NULL;
				s->name = imgs[i].vmas[j].path;
				if (v->kind == CKPT_VMA_SYSV_SHM)
					create_sysv(s, v);
			}
			if (v->pgoff + (v->end - v->start) > s->size)
				s->size = v->pgoff + (v->end - v->start);
		}
	for (unsigned i = 0; i < nshms; i++)
		if (!shms[i].sysv)
			shms[i].fd = move_high(open_shm_object(&shms[i]), "shared memory");
	/* fill each range once, from the process that saved it */
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < imgs[i].nvmas; j++) {
			const struct loaded_vma *lv = &imgs[i].vmas[j];
			uint64_t lo = lv->v.pgoff, hi = lo + (lv->v.end - lv->v.start);

			if (!is_shared_memory(&lv->v) || (lv->v.flags & CKPT_VMA_PAGES_ELSEWHERE) ||
			    already_filled(done, ndone, lv->v.shm_id, lo, hi))
				continue;
			fill_from(&imgs[i], lv, find_shm(lv->v.shm_id));
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

/*
 * An address in the given family (AF_INET or AF_INET6): a dual-stack IPv6
 * socket talks IPv4 through IPv4-mapped addresses (::ffff:a.b.c.d), so one
 * end of a connection may see the other's address either way.
 */
static void in_family(struct ckpt_sockaddr *a, int family)
{
	struct sockaddr_in in;
	struct sockaddr_in6 in6;

	memcpy(&in, a->addr, sizeof(in));
	memcpy(&in6, a->addr, sizeof(in6));
	if (family == AF_INET && a->len >= sizeof(in6) && in6.sin6_family == AF_INET6 &&
	    IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr)) {
		in = (struct sockaddr_in){ .sin_family = AF_INET, .sin_port = in6.sin6_port };
		memcpy(&in.sin_addr, &in6.sin6_addr.s6_addr[12], 4);
		memset(a->addr, 0, sizeof(a->addr));
		memcpy(a->addr, &in, sizeof(in));
		a->len = sizeof(in);
	} else if (family == AF_INET6 && a->len >= sizeof(in) && in.sin_family == AF_INET) {
		in6 = (struct sockaddr_in6){ .sin6_family = AF_INET6, .sin6_port = in.sin_port };
		in6.sin6_addr.s6_addr[10] = in6.sin6_addr.s6_addr[11] = 0xff;
		memcpy(&in6.sin6_addr.s6_addr[12], &in.sin_addr, 4);
		memset(a->addr, 0, sizeof(a->addr));
		memcpy(a->addr, &in6, sizeof(in6));
		a->len = sizeof(in6);
	}
}

int same_addr(const struct ckpt_sockaddr *a, const struct ckpt_sockaddr *b)
{
	struct ckpt_sockaddr x = *a, y = *b;

	in_family(&x, AF_INET);
	in_family(&y, AF_INET);
	return x.len && x.len == y.len && !memcmp(x.addr, y.addr, x.len);
}

static int is_tcp(const struct ckpt_fd *f)
{
	return (f->sock_domain == AF_INET || f->sock_domain == AF_INET6) &&
	       f->sock_type == SOCK_STREAM;
}

static const struct sockaddr *sa(const struct ckpt_sockaddr *a)
{
	return (const struct sockaddr *)a->addr;
}

/* Why socket() may refuse what the application could make: its privileges. */
static const char *privilege_needed(const struct ckpt_fd *f)
{
	if (f->sock_domain == AF_PACKET || f->sock_type == SOCK_RAW)
		return ": a raw or packet socket needs CAP_NET_RAW";
	if (f->sock_protocol == IPPROTO_ICMP || f->sock_protocol == IPPROTO_ICMPV6)
		return ": an ICMP socket needs a group within net.ipv4.ping_group_range";
	return "";
}

int restart_socket(const struct ckpt_fd *f)
{
	int s = socket(f->sock_domain, f->sock_type | SOCK_CLOEXEC, f->sock_protocol);
	int one = 1;

	if (s < 0)
		die("fd %d: cannot recreate a socket: %s%s", f->fd, strerror(errno),
		    errno == EPERM || errno == EACCES ? privilege_needed(f) : "");
	if (f->sock_domain == AF_INET || f->sock_domain == AF_INET6)
		setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	sockopts_apply(s, f);
	return move_high(s, "a socket");
}

const char *sockaddr_text(const struct ckpt_sockaddr *a, char *buf, size_t size)
{
	const struct sockaddr_in *in = (const void *)a->addr;
	const struct sockaddr_in6 *in6 = (const void *)a->addr;
	char host[INET6_ADDRSTRLEN] = "?";

	if (in->sin_family == AF_INET)
		inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
	else if (in->sin_family == AF_INET6)
		inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
	snprintf(buf, size, "%s:%u", host, ntohs(in->sin_port));
	return buf;
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

/* TIME_WAIT of connections that a socket without SO_REUSEADDR closed
 * first (a job that ended on this host a moment ago: MPI libraries
 * number their listeners from the same first port) holds the port for a
 * minute: ended where we may (time_wait.c), else waited for, once,
 * rather than fail the restart. */
#define TIME_WAIT_SECONDS 65

static int bind_after_time_wait(int s, const struct ckpt_fd *f, const char *at)
{
	static time_t deadline;	/* one minute for all of them: they ended together */
	struct timespec pause = { 0, 250 * 1000 * 1000 };
	int ended;

	if (f->sock_type == SOCK_STREAM && (ended = end_time_wait(sa(&f->sock_local))) > 0) {
		warn("port %s was held by %d connection%s in TIME_WAIT (a job that just ended "
		     "here?): ended", at, ended, ended == 1 ? "" : "s");
		if (!bind(s, sa(&f->sock_local), f->sock_local.len))
			return 1;
		if (errno != EADDRINUSE)
			return 0;
	}
	if (!deadline) {
		warn("port %s is taken, by the TIME_WAIT of a job that just ended here?: "
		     "waiting up to %d s for it", at, TIME_WAIT_SECONDS);
		deadline = time(NULL) + TIME_WAIT_SECONDS;
	}
	while (time(NULL) < deadline) {
		nanosleep(&pause, NULL);
		if (!bind(s, sa(&f->sock_local), f->sock_local.len))
			return 1;
		if (errno != EADDRINUSE)
			return 0;
	}
	return 0;
}

/*
 * The address to bind again (pair of is_bound, native/shim/sockets.c): a
 * netlink socket's groups with a port id the kernel chooses (the old one
 * may be taken), a packet socket's interface by name.
 */
static struct ckpt_sockaddr address_to_bind(const struct loaded_fd *lf)
{
	struct ckpt_sockaddr at = lf->f.sock_local;
	struct sockaddr_nl *nl = (struct sockaddr_nl *)at.addr;
	struct sockaddr_ll *ll = (struct sockaddr_ll *)at.addr;

	if (lf->f.sock_domain == AF_NETLINK) {
		nl->nl_pid = 0;
	} else if (lf->f.sock_domain == AF_PACKET) {
		ll->sll_ifindex = if_nametoindex(lf->path);
		if (!ll->sll_ifindex)
			die("fd %d: its packet socket was bound to interface %s, which this host "
			    "does not have", lf->f.fd, lf->path);
		at.len = sizeof(*ll);	/* getsockname gives less; bind wants it all */
	}
	return at;
}

static void bind_as_before(int s, const struct shared_socket *ss)
{
	const struct ckpt_fd *f = &ss->rec->f;
	const struct ckpt_sockaddr local = address_to_bind(ss->rec);

	/* a relative socket file name is relative to the process's cwd */
	if (f->sock_domain == AF_UNIX && chdir(ss->img->proc->cwd))
		die("cannot bind socket %s: %s: %s", f->sock_local.addr + 2, ss->img->proc->cwd,
		    strerror(errno));
	unlink_stale_name(f);
	if (bind(s, sa(&local), local.len)) {
		char at[128];

		if (f->sock_domain == AF_UNIX)
			snprintf(at, sizeof(at), "%s", f->sock_local.addr + 2);
		else
			sockaddr_text(&f->sock_local, at, sizeof(at));
		if (errno == EADDRINUSE && f->sock_domain != AF_UNIX && bind_after_time_wait(s, f, at))
			return;
		if (errno == EADDRINUSE && f->sock_domain != AF_UNIX)
			die("cannot bind a socket to %s again: it is in use (for longer than "
			    "connections that ended stay in TIME_WAIT)", at);
		if (errno == EADDRNOTAVAIL)
			die("cannot bind a socket to %s again: this host does not have that "
			    "address (the program did not ask for IP_FREEBIND)", at);
		die("cannot bind a socket to %s again: %s", at, strerror(errno));
	}
}

/* The record of the other end of a connection inside the job. */
static const struct loaded_fd *peer_record(const struct loaded_fd *lf)
{
	const struct ckpt_fd *f = &lf->f;

	for (unsigned i = 0; i < nsocks; i++) {
		const struct ckpt_fd *o = &socks[i].rec->f;

		/* an IPv4 end may be connected to an IPv6 one (same_addr) */
		if (o == f || !(o->sock_flags & CKPT_SOCK_CONNECTED) ||
		    (o->sock_domain == AF_UNIX) != (f->sock_domain == AF_UNIX) ||
		    o->sock_type != f->sock_type)
			continue;
		if (f->sock_domain == AF_UNIX ? (f->peer_id && o->object_id == f->peer_id) :
		    (same_addr(&o->sock_local, &f->sock_peer) &&
		     same_addr(&o->sock_peer, &f->sock_local)))
			return socks[i].rec;
	}
	return NULL;
}

/*
 * A queue larger than a new connection holds (bytes its sender had held,
 * which FLUSH saved) needs a receive buffer that is large before the
 * connection opens its window, and a large send buffer at the sender.
 */
#define LARGE_QUEUE (512 << 10)

static void make_room(int s, int opt, uint64_t bytes)
{
	if (bytes > LARGE_QUEUE)
		ckpt_raise_socket_buffer(s, opt, bytes);
}

/* A listener of a moment at b's address (or any port of it), the other
 * end bound to a's (or not): 0, or errno. */
static int tcp_connect_through(const struct ckpt_fd *a, const struct ckpt_fd *b, int keep_ports,
			       int *fa, int *fb)
{
	struct ckpt_sockaddr at = b->sock_local;
	socklen_t len = sizeof(at.addr);
	int l = restart_socket(b), err = 0;

	make_room(l, SO_RCVBUF, b->data_size);	/* the accepted socket inherits it */
	if (!keep_ports)
		((struct sockaddr_in *)at.addr)->sin_port = 0;	/* same for IPv6 */
	*fa = -1;
	if (bind(l, sa(&at), at.len) || listen(l, 1) ||
	    getsockname(l, (struct sockaddr *)at.addr, &len)) {
		err = errno;
		goto out;
	}
	*fa = restart_socket(a);
	in_family(&at, a->sock_domain);
	make_room(*fa, SO_RCVBUF, a->data_size);
	make_room(*fa, SO_SNDBUF, b->data_size);
	if ((keep_ports && bind(*fa, sa(&a->sock_local), a->sock_local.len)) ||
	    connect(*fa, sa(&at), at.len)) {
		err = errno;
		close(*fa);
		goto out;
	}
	*fb = accept4(l, NULL, NULL, SOCK_CLOEXEC);
	if (*fb < 0) {
		err = errno;
		close(*fa);
		goto out;
	}
	*fb = move_high(*fb, "a socket");
	sockopts_apply(*fb, b);	/* it has the listener's, of a moment */
	make_room(*fb, SO_RCVBUF, b->data_size);
	make_room(*fb, SO_SNDBUF, a->data_size);
out:
	close(l);
	return err;
}

/* A TCP connection with both ends in the job: on its old ports if they
 * are free; a restart on the same host soon after finds them taken by
 * the old connection's TIME_WAIT, and then new ports do (as in DMTCP:
 * the application keeps its fds, only getsockname() tells). */
static void tcp_pair(const struct ckpt_fd *a, const struct ckpt_fd *b, int *fa, int *fb)
{
	char la[64], lb[64];
	int err = tcp_connect_through(a, b, 1, fa, fb);

	if (err == EADDRINUSE)
		err = tcp_connect_through(a, b, 0, fa, fb);
	if (err)
		die("cannot reconnect TCP %s-%s: %s", sockaddr_text(&a->sock_local, la, sizeof(la)),
		    sockaddr_text(&b->sock_local, lb, sizeof(lb)), strerror(err));
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
	sockopts_apply(a->fd, &a->rec->f);
	sockopts_apply(b->fd, &b->rec->f);
}

/* Connected to an address that is not a socket of the job: connect
 * again (a listener of the job, or a server that is still there). */
static int reconnect(const struct loaded_fd *lf)
{
	const struct ckpt_fd *f = &lf->f;
	int s = restart_socket(f);

	if (f->sock_domain != AF_UNIX && (f->sock_flags & CKPT_SOCK_BOUND)) {
		struct ckpt_sockaddr local = address_to_bind(lf);

		bind(s, sa(&local), local.len);
	}
	if (!f->sock_peer.len || connect(s, sa(&f->sock_peer), f->sock_peer.len))
		warn("a socket connected outside the job (%s) could not be reconnected: %s",
		     f->sock_domain == AF_UNIX ? ((const struct sockaddr_un *)f->sock_peer.addr)->sun_path :
		     is_tcp(f) ? "TCP" : "not a stream", strerror(errno));
	return s;
}

#define REFILL_GROWTHS 4

/*
 * The peer end sends the bytes again.  They fit in the receiver's queue
 * and the sender's, as they did in the old connection, unless the sender
 * held many (FLUSH saved them): its buffer then grows, as it had grown.
 */
static void send_all(int s, const char *p, size_t len)
{
	int growths = 0;

	while (len) {
		ssize_t n = send(s, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
		struct pollfd pfd = { .fd = s, .events = POLLOUT };

		if (n > 0) {
			p += n;
			len -= n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno != EAGAIN)
			die("cannot refill a socket: %s", strerror(errno));
		if (poll(&pfd, 1, 200) > 0)
			continue;
		if (growths++ == REFILL_GROWTHS)
			die("%zu bytes queued on a socket do not fit in a new connection (its "
			    "buffers are capped by net.core.wmem_max and rmem_max)", len);
		ckpt_grow_send_buffer(s, len);
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

/*
 * A TCP end whose peer had shut down writing or closed, and is in no
 * image (it closed, or is outside the job): a stand-in peer of a moment,
 * on loopback, sends its queue again and its FIN, and closes.  Reads then
 * give the bytes and EOF, and writes end in a reset, as they would have.
 */
static void connect_to_ghost(struct shared_socket *ss)
{
	const struct ckpt_fd *f = &ss->rec->f;
	struct ckpt_sockaddr at = { .len = f->sock_domain == AF_INET6 ?
					   sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in) };
	struct sockaddr_in *in = (struct sockaddr_in *)at.addr;
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)at.addr;
	socklen_t len = sizeof(at.addr);
	int l = socket(f->sock_domain, SOCK_STREAM | SOCK_CLOEXEC, 0), g;

	if (f->sock_domain == AF_INET6) {
		in6->sin6_family = AF_INET6;
		in6->sin6_addr = in6addr_loopback;
	} else {
		in->sin_family = AF_INET;
		in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	}
	if (l < 0 || bind(l, sa(&at), at.len) || listen(l, 1) ||
	    getsockname(l, (struct sockaddr *)at.addr, &len))
		die("cannot make a stand-in for a closed TCP peer: %s", strerror(errno));
	ss->fd = restart_socket(f);
	make_room(ss->fd, SO_RCVBUF, f->data_size);
	/* its old port, if the old connection's TIME_WAIT leaves it free */
	if (f->sock_flags & CKPT_SOCK_BOUND)
		bind(ss->fd, sa(&f->sock_local), f->sock_local.len);
	if (connect(ss->fd, sa(&at), at.len) || (g = accept4(l, NULL, NULL, SOCK_CLOEXEC)) < 0)
		die("cannot connect a TCP socket to a stand-in for its closed peer: %s",
		    strerror(errno));
	close(l);
	make_room(g, SO_SNDBUF, f->data_size);
	refill_socket(ss->rec, g);
	shutdown(g, SHUT_WR);
	close(g);
	ss->ghosted = 1;
}

/* Datagrams waiting on a named socket (from whoever sent them): sent to
 * its name again, from a socket of a moment. */
static void refill_by_name(const struct loaded_fd *lf)
{
	const char *p = lf->data, *end = lf->data + lf->f.data_size;
	int s = socket(lf->f.sock_domain, lf->f.sock_type | SOCK_CLOEXEC, 0);

	if (s < 0)
		die("cannot refill a socket: %s", strerror(errno));
	while (p + 4 <= end) {
		uint32_t len;

		memcpy(&len, p, 4);
		if (p + 4 + len > end)
			die("corrupt socket queue record");
		if (sendto(s, p + 4, len, MSG_NOSIGNAL, sa(&lf->f.sock_local),
			   lf->f.sock_local.len) != (ssize_t)len)
			die("cannot refill a socket: %s", strerror(errno));
		p += 4 + len;
	}
	close(s);
}

/*
 * Unix and TCP sockets shut down, once their queues are refilled (a
 * socket shut for writing sends nothing more).  A stream end shut for
 * writing shuts its peer for reading too, as the kernel did; its own
 * SHUT_RD is that side of its peer's SHUT_WR (for TCP, unless the peer
 * sent no FIN: then the end shut itself).  A datagram socket's bits are
 * its own.
 */
static int how_to_shut(const struct ckpt_fd *f)
{
	int rd = f->sock_flags & CKPT_SOCK_SHUT_RD, wr = f->sock_flags & CKPT_SOCK_SHUT_WR;

	if (is_tcp(f) && (f->sock_flags & CKPT_SOCK_PEER_FIN))
		rd = 0;
	else if (f->sock_domain == AF_UNIX && f->sock_type != SOCK_DGRAM)
		rd = 0;
	else if (!is_tcp(f) && f->sock_domain != AF_UNIX)
		return -1;
	return rd && wr ? SHUT_RDWR : rd ? SHUT_RD : wr ? SHUT_WR : -1;
}

/* Pair of save_filter (native/shim/sockets.c): once the queue is back,
 * which the filter let through already (refilled datagrams come from
 * other addresses, which it might not). */
static void attach_filters(void)
{
	for (unsigned i = 0; i < nsocks; i++) {
		const struct loaded_fd *lf = socks[i].rec;
		struct sock_fprog prog = { lf->f.sock_filter_len, (void *)lf->sock_filter };
		int one = 1;

		if (!lf->sock_filter)
			continue;
		if (setsockopt(socks[i].fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof(prog)))
			die("pid %d: fd %d: cannot attach its socket filter again: %s",
			    socks[i].img->hdr.pid, lf->f.fd, strerror(errno));
		if ((lf->f.sock_flags & CKPT_SOCK_FILTER_LOCKED) &&
		    setsockopt(socks[i].fd, SOL_SOCKET, SO_LOCK_FILTER, &one, sizeof(one)))
			die("pid %d: fd %d: cannot lock its socket filter again: %s",
			    socks[i].img->hdr.pid, lf->f.fd, strerror(errno));
	}
}

static void shut_down_as_before(void)
{
	for (unsigned i = 0; i < nsocks; i++) {
		const struct ckpt_fd *f = &socks[i].rec->f;
		int how = how_to_shut(f);

		if (how >= 0 && shutdown(socks[i].fd, how) && errno != ENOTCONN)
			warn("a socket could not be shut down again: %s", strerror(errno));
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
			struct shared_socket *known;

			if (lf->f.kind != CKPT_FD_SOCKET || lf->f.dup_of >= 0)
				continue;
			/* of a socket shared by several processes, the one that
			 * flushed it carries its queue (tcp_flush.c) */
			known = find_socket(lf->f.object_id);
			if (known && !known->rec->f.data_size && lf->f.data_size)
				*known = (struct shared_socket){ lf->f.object_id, lf, &imgs[i], -1, 0 };
			if (!known)
				socks[nsocks++] = (struct shared_socket){ lf->f.object_id, lf, &imgs[i], -1, 0 };
		}
}

/* TCP connections to processes of the job on other hosts, met through
 * the coordinator (cross_host.c); their far ends' queues sent again. */
static struct cross_end *cross_ends;
static unsigned ncross;

static void connect_other_hosts(const char *coord)
{
	cross_ends = arena_alloc(sizeof(*cross_ends) * (nsocks + 1));
	for (unsigned i = 0; i < nsocks; i++) {
		const struct loaded_fd *far;

		if (socks[i].fd >= 0 || !(far = cross_host_peer(&socks[i].rec->f)))
			continue;
		cross_ends[ncross++] = (struct cross_end){ &socks[i].rec->f, far, -1, i };
	}
	cross_host_connect(cross_ends, ncross, coord);
	for (unsigned k = 0; k < ncross; k++)
		socks[cross_ends[k].index].fd = cross_ends[k].fd;
}

static void refill_from_other_hosts(void)
{
	for (unsigned k = 0; k < ncross; k++)
		if (cross_ends[k].far->f.data_size)
			refill_socket(cross_ends[k].far, cross_ends[k].fd);
}

/* Connections inside the job first (TCP ones need their ports before
 * any listener takes them; on this host, then with other hosts), then
 * listeners and named sockets, then connections to those, then the rest. */
static void create_sockets(struct image *imgs, unsigned n, const char *coord)
{
	collect_sockets(imgs, n);
	for (unsigned i = 0; i < nsocks; i++) {
		const struct ckpt_fd *f = &socks[i].rec->f;
		const struct loaded_fd *peer;

		/* a connected UDP (ICMP, raw...) socket only names its default
		 * peer: it is bound and connected again below, like one
		 * connected outside */
		if (socks[i].fd >= 0 || !(f->sock_flags & CKPT_SOCK_CONNECTED) ||
		    (f->sock_domain != AF_UNIX && !is_tcp(f)))
			continue;
		peer = peer_record(socks[i].rec);
		if (peer)
			connect_pair(&socks[i], find_socket(peer->f.object_id));
	}
	connect_other_hosts(coord);
	for (unsigned i = 0; i < nsocks; i++)
		if (socks[i].fd < 0 && is_tcp(&socks[i].rec->f) &&
		    (socks[i].rec->f.sock_flags & CKPT_SOCK_PEER_FIN))
			connect_to_ghost(&socks[i]);
	for (unsigned i = 0; i < nsocks; i++) {
		const struct ckpt_fd *f = &socks[i].rec->f;

		if (socks[i].fd >= 0 || (f->sock_flags & CKPT_SOCK_CONNECTED) ||
		    !(f->sock_flags & (CKPT_SOCK_BOUND | CKPT_SOCK_LISTENING)))
			continue;
		socks[i].fd = restart_socket(f);
		bind_as_before(socks[i].fd, &socks[i]);
		if ((f->sock_flags & CKPT_SOCK_LISTENING) && listen(socks[i].fd, f->sock_backlog))
			die("cannot listen again: %s", strerror(errno));
	}
	for (unsigned i = 0; i < nsocks; i++)
		if (socks[i].fd < 0)
			socks[i].fd = socks[i].rec->f.sock_flags & CKPT_SOCK_CONNECTED ?
				reconnect(socks[i].rec) : restart_socket(&socks[i].rec->f);
	for (unsigned i = 0; i < nsocks; i++) {
		const struct loaded_fd *lf = socks[i].rec, *peer;

		sockopts_finish(socks[i].fd, &lf->f);
		if (!lf->f.data_size || socks[i].ghosted)
			continue;
		peer = peer_record(lf);
		if (peer)
			refill_socket(lf, find_socket(peer->f.object_id)->fd);
		else if (cross_host_peer(&lf->f))
			continue;	/* the other host sends it */
		else if (lf->f.sock_type != SOCK_STREAM && (lf->f.sock_flags & CKPT_SOCK_BOUND))
			refill_by_name(lf);
		else
			warn("%zu bytes queued on a socket from outside the job are dropped",
			     (size_t)lf->f.data_size);
	}
	refill_from_other_hosts();
	attach_filters();
	shut_down_as_before();
}

/* ---- open files shared between processes ---- */

static struct shared_file *find_file(int32_t pid, int32_t fd)
{
	for (unsigned i = 0; i < nfiles; i++)
		if (files[i].pid == pid && files[i].fd == fd)
			return &files[i];
	return NULL;
}

static const struct loaded_fd *fd_record(struct image *imgs, unsigned n, int32_t pid, int32_t fd)
{
	for (unsigned i = 0; i < n; i++)
		if (imgs[i].hdr.pid == pid)
			for (unsigned j = 0; j < imgs[i].nfds; j++)
				if (imgs[i].fds[j].f.fd == fd)
					return &imgs[i].fds[j];
	return NULL;
}

static void create_files(struct image *imgs, unsigned n)
{
	unsigned total = 0;

	for (unsigned i = 0; i < n; i++)
		total += imgs[i].nfds;
	files = arena_alloc(sizeof(*files) * (total + 1));
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < imgs[i].nfds; j++) {
			const struct ckpt_fd *f = &imgs[i].fds[j].f;
			const struct loaded_fd *owner;
			int fd;

			if (f->kind != CKPT_FD_FILE || !f->share_pid ||
			    find_file(f->share_pid, f->share_fd))
				continue;
			owner = fd_record(imgs, n, f->share_pid, f->share_fd);
			if (!owner || owner->f.kind != CKPT_FD_FILE)
				continue;	/* its owner is gone: opened on its own */
			fd = open_file_again(owner);
			if (fd < 0 || lseek(fd, owner->f.offset, SEEK_SET) < 0)
				die("cannot reopen %s: %s", owner->path, strerror(errno));
			files[nfiles++] = (struct shared_file){ f->share_pid, f->share_fd,
								move_high(fd, owner->path) };
		}
}

/* The open file a FILE record shares with other processes, or -1. */
int shared_file_fd(int32_t pid, const struct ckpt_fd *f)
{
	const struct shared_file *sf = f->share_pid ? find_file(f->share_pid, f->share_fd) :
					find_file(pid, f->fd);

	return sf ? sf->file : -1;
}

void shared_create(struct image *imgs, unsigned n, const char *coord)
{
	recreate_gone_scratch_files(imgs, n);
	create_pipes(imgs, n);
	create_fifos(imgs, n);
	create_shms(imgs, n);
	create_sockets(imgs, n, coord);
	ptys_create(imgs, n);
	create_files(imgs, n);
	mqueues_create(imgs, n);
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

/* The System V id of a segment of the job, or -1. */
int shared_sysv_id(uint64_t id)
{
	const struct shared_shm *s = id ? find_shm(id) : NULL;

	return s && s->sysv ? s->sysv_id : -1;
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
		if (shms[i].fd >= 0)
			out[k++] = shms[i].fd;
	for (unsigned i = 0; i < nsocks && k < max; i++)
		out[k++] = socks[i].fd;
	k += pty_fds(out + k, max - k);
	for (unsigned i = 0; i < nfiles && k < max; i++)
		out[k++] = files[i].file;
	return k + mqueue_fds(out + k, max - k);
}

/* Pipes, sockets, ptys, shared open files and message queues: once the
 * fds are in place. */
void shared_close_pipes(void)
{
	for (unsigned i = 0; i < npipes; i++) {
		close(pipes[i].end[0]);
		close(pipes[i].end[1]);
	}
	for (unsigned i = 0; i < nsocks; i++)
		close(socks[i].fd);
	ptys_close();
	for (unsigned i = 0; i < nfiles; i++)
		close(files[i].file);
	mqueues_close();
}

/* After the memory is back: raw system calls only. */
void shared_close_shms(void)
{
	for (unsigned i = 0; i < nshms; i++)
		if (shms[i].fd >= 0)
			sys1(SYS_close, shms[i].fd);
}
