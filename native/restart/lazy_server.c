/*
 * The page server of a lazy restore (lazy.c): one process per host,
 * outside the job, serving every restored process's userfaultfd.  A page
 * a process touches is served at once with the rest of its unit (the
 * reader's unit: a checksum block, checked before any page of it is
 * handed out, a compressed chunk, decompressed once); meanwhile the
 * remaining units stream in image order.  Pages the process dropped or
 * unmapped while they were on their way (MADV_DONTNEED, munmap) are not
 * filled again; a page with no data, or touched again after it was
 * dropped, gets a zero page.  Memory moved (mremap) gets its pages where
 * it went; a child forked meanwhile is served as its parent is.  Any error ends the server with one line;
 * ckpt-restart then ends the job (run_init()).
 *
 * On the status fd: "lazy-left BYTES" now and then, "lazy-done BYTES NS"
 * once the last page is in.  While the file $CKPT_LAZY_PAUSE names exists
 * the stream waits (touched pages are served): the tests' hold on a lazy
 * restart half way, as CKPT_PAUSE_BEFORE is for a checkpoint's phases.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#define ZSTD_STATIC_LINKING_ONLY
#include "pages.h"
#include "fast_hash.h"
#include "sys.h"

#define LAZY_PIECE (1UL << 20)		/* a raw unit's most */
#define BLOCK_BUF CKPT_CHECKSUM_BLOCK	/* a checked block's pieces */
#define MAX_CLIENTS 4096
#define MAX_GONE 65536
#define MAX_MOVES 4096
#define MAX_FAULTS 8192			/* more than one per thread waiting */
#define REPORT_NS 100000000L

struct extent {				/* a unit's pages at [start, end) */
	uint64_t start, end;
	unsigned unit;
};

struct range {
	uint64_t start, end;
};

struct move {				/* [from, from + len) went to to */
	uint64_t from, to, len;
};

struct client {				/* one restored process */
	const struct image *img;
	int uffd;
	int dead;			/* its memory is gone (exited) */
	struct piece *pieces;
	struct unit *units;
	uint64_t *unit_bytes;
	uint8_t *done;
	unsigned nunits, next;
	struct extent *extents;
	unsigned nextents;
	struct range *gone;		/* dropped or unmapped before they came */
	unsigned ngone;
	struct move *moves;		/* mremap()s, in order */
	unsigned nmoves;
	uint64_t *faults;		/* pages waited for, read with other events */
	unsigned nfaults;
};

static struct image *images;
static struct client *clients;
static void adopt_child(const struct client *parent, int uffd);
static unsigned nclients, expected;
static int requests, keeper, keeper_send, status_fd;
static unsigned received;		/* processes that sent their userfaultfd */
static struct unpacker unpacker;
static char *buf;			/* a unit's bytes, as read */
static uint64_t total, left;
static long t_start, t_report;
static const char *pause_path;

static long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void *map(size_t size)
{
	void *p = mmap(NULL, size ? size : 1, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	if (p == MAP_FAILED)
		die("page server: out of memory (%zu bytes)", size);
	return p;
}

/* The status pipe, opened again without blocking (an open file of our
 * own: the flag would be ckpt-restart's too): a reader that stopped
 * reading costs a line, never a page a process waits for. */
static int own_status_fd(int fd)
{
	char path[64];
	int own;

	if (fd < 0)
		return -1;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	own = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
	close(fd);
	return own;
}

static void status_line(const char *word, uint64_t a, long b)
{
	char line[80];
	int n;

	if (status_fd < 0)
		return;
	n = b < 0 ? snprintf(line, sizeof(line), "%s %llu\n", word, (unsigned long long)a)
		  : snprintf(line, sizeof(line), "%s %llu %ld\n", word, (unsigned long long)a, b);
	if (write(status_fd, line, n) < 0 && errno != EAGAIN)
		status_fd = -1;	/* nobody reads: the restart goes on */
}

/* ---- events: pages waited for, ranges gone ---- */

static void add_gone(struct client *c, uint64_t start, uint64_t end)
{
	if (c->ngone == MAX_GONE)
		die("page server: pid %d dropped memory in more than %d places while its pages "
		    "were arriving", c->img->hdr.pid, MAX_GONE);
	c->gone[c->ngone++] = (struct range){ start, end };
}

static int send_fd(int sock, int32_t index, int fd)
{
	char control[CMSG_SPACE(sizeof(int))] = { 0 };
	struct iovec iov = { &index, sizeof(index) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
			      .msg_controllen = sizeof(control) };
	struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);

	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	return sendmsg(sock, &msg, MSG_DONTWAIT) < 0 ? -errno : 0;
}

/*
 * A process forked while its pages were arriving: the child's copies of
 * the lazy regions come with a userfaultfd of their own.  Its pages are
 * the parent's at the fork: what the parent had then (units done) the
 * child has too; the rest it gets from the image as the parent does.  A
 * unit the parent was filling at the fork is filled again in the child,
 * but for the pages it had (they exist already).
 */
static void adopt_child(const struct client *parent, int uffd)
{
	struct client *c;
	int err;

	if (nclients == MAX_CLIENTS)
		die("--lazy: more than %d processes wait for pages", MAX_CLIENTS);
	c = &clients[nclients];
	*c = *parent;
	c->uffd = uffd;
	c->done = map(c->nunits);
	memcpy(c->done, parent->done, c->nunits);
	c->gone = map(MAX_GONE * sizeof(*c->gone));
	memcpy(c->gone, parent->gone, parent->ngone * sizeof(*c->gone));
	c->moves = map(MAX_MOVES * sizeof(*c->moves));
	memcpy(c->moves, parent->moves, parent->nmoves * sizeof(*c->moves));
	c->faults = map(MAX_FAULTS * sizeof(*c->faults));
	c->nfaults = 0;
	for (unsigned u = 0; u < c->nunits; u++)
		if (!c->done[u]) {
			total += c->unit_bytes[u];
			left += c->unit_bytes[u];
		}
	/* as the processes' own: kept if the server dies (lazy.c) */
	if ((err = send_fd(keeper_send, c->img - images, uffd)) < 0)
		die("page server: cannot keep a forked child's userfaultfd: %s", strerror(-err));
	nclients++;
}

/* Memory moved (mremap): its pages still to come go to the new place,
 * and so do the ranges of it that were gone. */
static void add_move(struct client *c, uint64_t from, uint64_t to, uint64_t len)
{
	unsigned n = c->ngone;

	if (c->nmoves == MAX_MOVES)
		die("--lazy: pid %d moved memory more than %d times while its pages were arriving",
		    c->img->hdr.pid, MAX_MOVES);
	c->moves[c->nmoves++] = (struct move){ from, to, len };
	for (unsigned i = 0; i < n; i++) {
		uint64_t lo = c->gone[i].start > from ? c->gone[i].start : from;
		uint64_t hi = c->gone[i].end < from + len ? c->gone[i].end : from + len;

		if (lo < hi)
			add_gone(c, to + (lo - from), to + (hi - from));
	}
}

/* Where a page now at addr was at the restart. */
static uint64_t moved_from(const struct client *c, uint64_t addr)
{
	for (unsigned k = c->nmoves; k-- > 0;) {
		const struct move *m = &c->moves[k];

		if (addr >= m->to && addr < m->to + m->len)
			addr = m->from + (addr - m->to);
	}
	return addr;
}

static void on_event(struct client *c, const struct uffd_msg *m)
{
	switch (m->event) {
	case UFFD_EVENT_PAGEFAULT:
		if (c->nfaults == MAX_FAULTS)
			die("page server: pid %d waits for more than %d pages", c->img->hdr.pid,
			    MAX_FAULTS);
		c->faults[c->nfaults++] = m->arg.pagefault.address & ~(CKPT_PAGE_SIZE - 1);
		break;
	case UFFD_EVENT_REMOVE:
	case UFFD_EVENT_UNMAP:
		add_gone(c, m->arg.remove.start, m->arg.remove.end);
		break;
	case UFFD_EVENT_FORK:
		adopt_child(c, (int)m->arg.fork.ufd);
		break;
	case UFFD_EVENT_REMAP:
		add_move(c, m->arg.remap.from, m->arg.remap.to, m->arg.remap.len);
		break;
	default:
		die("page server: unknown userfaultfd event %u", m->event);
	}
}

/* Every message waiting on c's userfaultfd. */
static void read_events(struct client *c)
{
	struct uffd_msg msgs[64];

	for (;;) {
		ssize_t n = read(c->uffd, msgs, sizeof(msgs));

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return;	/* EAGAIN: none left */
		for (ssize_t i = 0; i < n / (ssize_t)sizeof(msgs[0]); i++)
			on_event(c, &msgs[i]);
	}
}

/* ---- filling pages ---- */

/* How much of [addr, addr + len) from addr on is gone (*gone set) or not. */
static uint64_t gone_run(const struct client *c, uint64_t addr, uint64_t len, int *gone)
{
	uint64_t n = len;

	*gone = 0;
	for (unsigned i = 0; i < c->ngone; i++) {
		const struct range *g = &c->gone[i];

		if (g->start <= addr && addr < g->end) {
			*gone = 1;
			return g->end - addr < len ? g->end - addr : len;
		}
		if (g->start > addr && g->start - addr < n)
			n = g->start - addr;
	}
	return n;
}

/* UFFDIO_COPY of n bytes; -EAGAIN once events were read (the gone ranges
 * may have changed), -ESRCH if the process is gone. */
static long copy_pages(struct client *c, uint64_t addr, const char *src, uint64_t n)
{
	while (n) {
		struct uffdio_copy uc = { .dst = addr, .src = (uint64_t)src, .len = n };
		long r = sys3(SYS_ioctl, c->uffd, UFFDIO_COPY, &uc);
		uint64_t did = r == 0 ? n : uc.copy > 0 ? (uint64_t)uc.copy : 0;

		if (!did && (r == -EEXIST || r == -ENOENT))
			did = CKPT_PAGE_SIZE;	/* there already, or no longer mapped */
		if (!did && r == -EAGAIN) {
			read_events(c);
			return -EAGAIN;
		}
		if (!did)
			return r;
		addr += did;
		src += did;
		n -= did;
	}
	return 0;
}

/* len bytes at src belong at addr in c's memory, but where gone. */
static long put_here(struct client *c, uint64_t addr, const char *src, uint64_t len)
{
	unsigned moves = c->nmoves;

	while (len) {
		int gone;
		uint64_t n = gone_run(c, addr, len, &gone);
		long err = gone ? 0 : copy_pages(c, addr, src, n);

		if (err == -EAGAIN && c->nmoves != moves)
			return err;	/* put() starts again where things are now */
		if (err == -EAGAIN)
			continue;
		if (err)
			return err;
		addr += n;
		src += n;
		len -= n;
	}
	return 0;
}

/* len bytes at src were at addr at the restart: through the moves from
 * the k-th on, to where they are now. */
static long put_moved(struct client *c, uint64_t addr, const char *src, uint64_t len, unsigned k)
{
	for (; k < c->nmoves && len; k++) {
		const struct move *m = &c->moves[k];
		uint64_t n;
		long err;

		if (addr + len <= m->from || addr >= m->from + m->len)
			continue;
		if (addr < m->from) {	/* before the move: on as it is */
			n = m->from - addr;
			if ((err = put_moved(c, addr, src, n, k + 1)))
				return err;
			addr += n;
			src += n;
			len -= n;
		}
		n = m->from + m->len - addr < len ? m->from + m->len - addr : len;
		if ((err = put_moved(c, m->to + (addr - m->from), src, n, k + 1)))
			return err;
		addr += n;
		src += n;
		len -= n;
	}
	return len ? put_here(c, addr, src, len) : 0;
}

static long put(struct client *c, uint64_t addr, const char *src, uint64_t len)
{
	long err;

	/* an mremap() seen while copying moves what is left */
	do {
		unsigned moves = c->nmoves;

		err = put_moved(c, addr, src, len, 0);
		if (err != -EAGAIN || c->nmoves == moves)
			return err;
	} while (1);
}

/* A checked block: every piece read and the block hashed before any
 * page of it is handed out. */
static long fetch_block(struct client *c, const struct piece *p, unsigned count)
{
	uint64_t at = p->block_lo, o = 0;
	long err = 0;

	XXH3_64bits_reset(&unpacker.block_hash);
	for (unsigned i = 0; i < count && !err; i++) {
		const struct piece *q = &p[i];

		err = hash_gap(q->fd, at, q->off, &unpacker);
		if (!err)
			err = read_at(q->fd, (uint64_t)buf + o, q->len, q->off);
		if (!err)
			fast_xxh3_64_update(&unpacker.block_hash, buf + o, q->len);
		at = q->off + q->len;
		o += q->len;
	}
	if (!err)
		err = hash_gap(p->fd, at, p->block_hi, &unpacker);
	if (!err && XXH3_64bits_digest(&unpacker.block_hash) != *p->block_sum)
		err = -EILSEQ;
	for (unsigned i = 0, o = 0; i < count && !err; o += p[i].len, i++)
		err = put(c, p[i].addr, buf + o, p[i].len);
	return err;
}

/* A chunk of a compressed region: decompressed, then its runs' pages. */
static long fetch_chunk(struct client *c, const struct piece *p)
{
	const struct loaded_vma *lv = p->lv;
	const char *src = unpacker.out;
	uint64_t len = p->len, into, r;
	long err;

	if (p->format == CKPT_CHUNK_RAW) {
		err = read_at(p->fd, (uint64_t)unpacker.out, p->len, p->off);
	} else {
		err = read_at(p->fd, (uint64_t)unpacker.in, p->stored, p->off);
		if (!err && ZSTD_decompressDCtx(unpacker.dctx, unpacker.out, p->len, unpacker.in,
						p->stored) != p->len)
			err = -EBADMSG;
	}
	for (r = run_of(lv, p->pos, &into); !err && len && r < lv->v.nruns; r++, into = 0) {
		uint64_t n = lv->runs[r].npages * CKPT_PAGE_SIZE - into;

		if (n > len)
			n = len;
		err = put(c, lv->v.start + lv->runs[r].offset + into, src, n);
		src += n;
		len -= n;
	}
	return err;
}

/* Pages of an earlier image's zstd chunk (incremental). */
static long fetch_ref_chunk(struct client *c, const struct piece *p)
{
	const struct ckpt_page_ref *r = p->ref;
	long err = read_at(p->fd, (uint64_t)unpacker.in, r->stored, r->off);

	if (!err && ZSTD_decompressDCtx(unpacker.dctx, unpacker.out, r->chunk_len, unpacker.in,
					r->stored) != r->chunk_len)
		err = -EBADMSG;
	return err ? err : put(c, p->addr, unpacker.out + r->into, p->len);
}

static long fetch_unit(struct client *c, const struct unit *u)
{
	const struct piece *p = &c->pieces[u->first];
	long err;

	if (p->block_sum)
		return fetch_block(c, p, u->count);
	if (p->lv)
		return fetch_chunk(c, p);
	if (p->ref)
		return fetch_ref_chunk(c, p);
	err = read_at(p->fd, (uint64_t)buf, p->len, p->off);
	return err ? err : put(c, p->addr, buf, p->len);
}

static void serve_unit(struct client *c, unsigned u)
{
	long err;

	if (c->done[u] || c->dead)
		return;
	err = fetch_unit(c, &c->units[u]);
	if (err == -ESRCH) {	/* the process exited: nothing more to fill */
		c->dead = 1;
		return;
	}
	if (err == -EBADMSG)
		die("--lazy: pid %d: a compressed chunk of page data in %s is corrupt",
		    c->img->hdr.pid, c->img->file);
	if (err == -EILSEQ)
		die("--lazy: pid %d: image checksum mismatch in the page data of %s (corrupt image)",
		    c->img->hdr.pid, c->img->file);
	if (err)
		die("--lazy: pid %d: cannot read its pages from %s (or an earlier image of it): %s",
		    c->img->hdr.pid, c->img->file, strerror(-err));
	c->done[u] = 1;
	left -= c->unit_bytes[u];
}

/* ---- where a page is ---- */

static unsigned piece_extents(const struct piece *p, unsigned unit, struct extent *out)
{
	uint64_t len = p->len, into, r;
	unsigned n = 0;

	if (!p->lv) {
		if (out)
			out[0] = (struct extent){ p->addr, p->addr + p->len, unit };
		return 1;
	}
	for (r = run_of(p->lv, p->pos, &into); len && r < p->lv->v.nruns; r++, into = 0) {
		uint64_t k = p->lv->runs[r].npages * CKPT_PAGE_SIZE - into;
		uint64_t at = p->lv->v.start + p->lv->runs[r].offset + into;

		if (k > len)
			k = len;
		if (out)
			out[n] = (struct extent){ at, at + k, unit };
		n++;
		len -= k;
	}
	return n;
}

static int by_start(const void *a, const void *b)
{
	const struct extent *x = a, *y = b;

	return x->start < y->start ? -1 : x->start > y->start;
}

static void index_units(struct client *c)
{
	unsigned n = 0;

	for (unsigned u = 0; u < c->nunits; u++)
		for (unsigned i = 0; i < c->units[u].count; i++)
			n += piece_extents(&c->pieces[c->units[u].first + i], u, NULL);
	c->extents = map(n * sizeof(*c->extents));
	for (unsigned u = 0; u < c->nunits; u++)
		for (unsigned i = 0; i < c->units[u].count; i++)
			c->nextents += piece_extents(&c->pieces[c->units[u].first + i], u,
						     c->extents + c->nextents);
	qsort(c->extents, c->nextents, sizeof(*c->extents), by_start);
}

/* The unit holding the page at addr, or -1. */
static long unit_at(const struct client *c, uint64_t addr)
{
	unsigned lo = 0, hi = c->nextents;

	while (lo < hi) {
		unsigned mid = (lo + hi) / 2;

		if (c->extents[mid].end <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < c->nextents && c->extents[lo].start <= addr)
		return c->extents[lo].unit;
	return -1;
}

/* The page a thread waits for: its unit, then a zero page if the unit
 * left it empty; the waiter is woken either way. */
static void serve_fault(struct client *c, uint64_t addr)
{
	long u = unit_at(c, moved_from(c, addr)), r;

	if (u >= 0)
		serve_unit(c, u);
	while (!c->dead) {
		struct uffdio_zeropage z = { .range = { addr, CKPT_PAGE_SIZE } };
		struct uffdio_range w = { addr, CKPT_PAGE_SIZE };

		r = sys3(SYS_ioctl, c->uffd, UFFDIO_ZEROPAGE, &z);
		if (r == -EAGAIN) {
			read_events(c);
			continue;
		}
		if (r == -EEXIST)
			r = sys3(SYS_ioctl, c->uffd, UFFDIO_WAKE, &w);
		if (r == -ESRCH)
			c->dead = 1;
		else if (r < 0 && r != -ENOENT)
			die("--lazy: pid %d: cannot hand out the page at %#llx: %s", c->img->hdr.pid,
			    (unsigned long long)addr, strerror(-r));
		return;
	}
}

static void serve_faults(struct client *c)
{
	while (c->nfaults && !c->dead)
		serve_fault(c, c->faults[--c->nfaults]);
}

/* ---- the processes ---- */

static void plan_client(struct client *c)
{
	const struct image *img = c->img;
	int compressed;
	unsigned room = reader_room(img, &compressed, LAZY_PIECE) + 1;
	uint64_t bytes;

	c->pieces = map(room * sizeof(*c->pieces));
	c->units = map(room * sizeof(*c->units));
	reader_plan_into(c->pieces, c->units, room, LAZY_PIECE);
	for (unsigned i = 0; i < img->nvmas; i++)
		if (lazy_region(&img->vmas[i]))
			memory_add_pages(img, &img->vmas[i]);
	c->nunits = reader_plan_units(&bytes);
	c->done = map(c->nunits);
	c->unit_bytes = map(c->nunits * sizeof(uint64_t));
	for (unsigned u = 0; u < c->nunits; u++)
		for (unsigned i = 0; i < c->units[u].count; i++)
			c->unit_bytes[u] += c->pieces[c->units[u].first + i].len;
	c->gone = map(MAX_GONE * sizeof(*c->gone));
	c->moves = map(MAX_MOVES * sizeof(*c->moves));
	c->faults = map(MAX_FAULTS * sizeof(*c->faults));
	index_units(c);
	total += bytes;
	left += bytes;
}

/* First what each thread touches first: its stack top and its TLS. */
static void working_set(struct client *c)
{
	for (unsigned t = 0; t < c->img->nthreads && !c->dead; t++) {
		const struct ckpt_thread *th = &c->img->threads[t];
		uint64_t at[] = { th->regs.rsp, th->fs_base };

		for (unsigned i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
			long u = unit_at(c, at[i] & ~(CKPT_PAGE_SIZE - 1));

			if (u >= 0)
				serve_unit(c, u);
		}
	}
}

static int receive_fd(int sock, int32_t *index)
{
	char control[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { index, sizeof(*index) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
			      .msg_controllen = sizeof(control) };
	struct cmsghdr *cm;
	int fd;
	ssize_t n;

	do
		n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	cm = CMSG_FIRSTHDR(&msg);
	if (n != sizeof(*index) || !cm || cm->cmsg_type != SCM_RIGHTS)
		return -1;
	memcpy(&fd, CMSG_DATA(cm), sizeof(fd));
	return fd;
}

static void receive_client(void)
{
	int32_t index;
	int fd = receive_fd(requests, &index);
	struct client *c;

	if (fd < 0)
		die("page server: lost a restored process's userfaultfd");
	if (index < 0 || index >= MAX_IMAGES || nclients == MAX_CLIENTS)
		die("page server: a bad request");
	received++;
	c = &clients[nclients++];
	c->img = &images[index];
	c->uffd = fd;
	plan_client(c);
	working_set(c);
}

/* Whether a process still waits for a unit. */
static int units_left(void)
{
	for (unsigned k = 0; k < nclients; k++) {
		struct client *c = &clients[k];

		while (c->next < c->nunits && c->done[c->next])
			c->next++;
		if (!c->dead && c->next < c->nunits)
			return 1;
	}
	return 0;
}

/* The next unit in image order of the next process that has one. */
static int stream_one(void)
{
	static unsigned turn;

	for (unsigned k = 0; k < nclients; k++) {
		struct client *c = &clients[(turn + k) % nclients];

		while (c->next < c->nunits && c->done[c->next])
			c->next++;
		if (c->dead || c->next == c->nunits)
			continue;
		serve_unit(c, c->next);
		turn = (turn + k + 1) % nclients;
		return 1;
	}
	return 0;
}

static void report(int force)
{
	long now = now_ns();

	if (force || now - t_report >= REPORT_NS) {
		status_line("lazy-left", left, -1);
		t_report = now;
	}
}

/* Every page is in: the keeper's copies go, and with them the
 * registrations; the processes' memory is theirs alone. */
static void finish(void)
{
	int32_t index;
	int fd;

	while ((fd = receive_fd(keeper, &index)) >= 0)
		close(fd);
	for (unsigned i = 0; i < nclients; i++)
		close(clients[i].uffd);
	status_line("lazy-done", total, now_ns() - t_start);
	_exit(0);
}

static volatile sig_atomic_t job_over;	/* SIGTERM: ckpt-restart saw the job end */

static void on_term(int sig)
{
	(void)sig;
	job_over = 1;
}

/* The job ended: what it never touched is no longer wanted. */
static void job_ended(void)
{
	int32_t index;
	int fd;

	while ((fd = receive_fd(keeper, &index)) >= 0)
		close(fd);
	_exit(0);
}

static void poll_once(int busy)
{
	static struct pollfd pfd[MAX_CLIENTS + 1];
	unsigned n = 0;

	pfd[n++] = (struct pollfd){ received < expected ? requests : -1, POLLIN, 0 };
	for (unsigned i = 0; i < nclients; i++)
		pfd[n++] = (struct pollfd){ clients[i].dead ? -1 : clients[i].uffd, POLLIN, 0 };
	if (poll(pfd, n, busy ? 0 : (int)(REPORT_NS / 1000000)) < 0 && errno != EINTR)
		die("page server: poll: %s", strerror(errno));
	if (pfd[0].revents & POLLIN)
		receive_client();
	else if (pfd[0].revents & (POLLHUP | POLLERR))
		die("page server: the restart ended before every process was back");
	for (unsigned i = 0; i < nclients && i + 1 < n; i++)
		if (pfd[i + 1].revents)
			read_events(&clients[i]);
	for (unsigned i = 0; i < nclients; i++)
		serve_faults(&clients[i]);
}

int lazy_serve(struct image *imgs, unsigned want, int req, int keep, int keep_send, int sfd)
{
	int busy = 1;

	images = imgs;
	expected = want;
	requests = req;
	keeper = keep;
	status_fd = own_status_fd(sfd);
	pause_path = getenv("CKPT_LAZY_PAUSE");
	keeper_send = keep_send;
	t_start = now_ns();
	clients = map(MAX_CLIENTS * sizeof(*clients));
	buf = map(BLOCK_BUF);
	unpacker_init(&unpacker);
	unpacker.gap = map(1UL << 20);
	prctl(PR_SET_NAME, "ckpt-pageserver");
	signal(SIGPIPE, SIG_IGN);	/* a status fd nobody reads */
	signal(SIGTERM, on_term);
	for (;;) {
		int paused = pause_path && access(pause_path, F_OK) == 0;

		if (job_over)
			job_ended();
		poll_once(busy && !paused);
		busy = paused ? units_left() : stream_one();
		report(0);
		if (received == expected && !busy) {
			report(1);
			finish();
		}
	}
}
