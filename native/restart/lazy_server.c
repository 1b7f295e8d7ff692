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
#include <pthread.h>
#include <sys/eventfd.h>
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
/* a checked block's pieces, or a chunk decompressed */
#define UNIT_BUF (CKPT_CHECKSUM_BLOCK > CKPT_CHUNK_SIZE ? CKPT_CHECKSUM_BLOCK : CKPT_CHUNK_SIZE)
#define SLOTS 4				/* units the streamer reads ahead */
#define AHEAD_UNITS 16			/* and asks the disk for */
#define MAX_CLIENTS 4096
#define MAX_GONE 65536
#define MAX_MOVES 4096
#define MAX_FAULTS 8192			/* more than one per thread waiting */
#define REPORT_NS 100000000L

/*
 * Two threads: the streamer reads (and checks, decompresses) units in
 * image order into slots; the main thread hands them to the processes
 * (UFFDIO_COPY), serves the pages they wait for, and follows their
 * events.  A unit is taken by one of them (TAKEN); a page waited for in a
 * unit the streamer has taken is handed out from its slot once read.
 */
enum unit_state { UNIT_TODO, UNIT_TAKEN, UNIT_DONE };

struct slot {
	int busy;			/* the streamer fills it */
	int full;			/* read, to be handed out */
	struct client *c;
	unsigned unit;
	long err;
	const char *data;		/* the unit's bytes, in buf */
	char *buf;
};

/* What a thread reads a unit with. */
struct loader {
	struct unpacker u;
	char *buf;
};

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
	uint8_t *state;			/* of each unit: enum unit_state (atomic) */
	unsigned nunits, ndone;
	unsigned next, ahead;		/* the streamer's: to read, to ask the disk for */
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
static struct loader own;		/* the main thread's */
static struct loader streamer;
static struct slot slots[SLOTS];
static pthread_mutex_t slot_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t slot_freed = PTHREAD_COND_INITIALIZER, slot_filled = PTHREAD_COND_INITIALIZER;
static int slot_event;			/* an eventfd: a slot is full */
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
	c->state = map(c->nunits);
	c->ndone = c->next = c->ahead = 0;
	for (unsigned u = 0; u < c->nunits; u++) {
		c->state[u] = __atomic_load_n(&parent->state[u], __ATOMIC_ACQUIRE) == UNIT_DONE ?
			      UNIT_DONE : UNIT_TODO;
		c->ndone += c->state[u] == UNIT_DONE;
	}
	c->gone = map(MAX_GONE * sizeof(*c->gone));
	memcpy(c->gone, parent->gone, parent->ngone * sizeof(*c->gone));
	c->moves = map(MAX_MOVES * sizeof(*c->moves));
	memcpy(c->moves, parent->moves, parent->nmoves * sizeof(*c->moves));
	c->faults = map(MAX_FAULTS * sizeof(*c->faults));
	c->nfaults = 0;
	for (unsigned u = 0; u < c->nunits; u++)
		if (c->state[u] != UNIT_DONE) {
			total += c->unit_bytes[u];
			left += c->unit_bytes[u];
		}
	/* as the processes' own: kept if the server dies (lazy.c) */
	if ((err = send_fd(keeper_send, c->img - images, uffd)) < 0)
		die("page server: cannot keep a forked child's userfaultfd: %s", strerror(-err));
	__atomic_store_n(&nclients, nclients + 1, __ATOMIC_RELEASE);	/* the streamer's too */
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

/* A checked block: every piece read into buf and the block hashed
 * before any page of it is handed out. */
static long load_block(const struct piece *p, unsigned count, struct loader *l)
{
	uint64_t at = p->block_lo, o = 0;
	long err = 0;

	XXH3_64bits_reset(&l->u.block_hash);
	for (unsigned i = 0; i < count && !err; i++) {
		const struct piece *q = &p[i];

		err = hash_gap(q->fd, at, q->off, &l->u);
		if (!err)
			err = read_at(q->fd, (uint64_t)l->buf + o, q->len, q->off);
		if (!err)
			fast_xxh3_64_update(&l->u.block_hash, l->buf + o, q->len);
		at = q->off + q->len;
		o += q->len;
	}
	if (!err)
		err = hash_gap(p->fd, at, p->block_hi, &l->u);
	if (!err && XXH3_64bits_digest(&l->u.block_hash) != *p->block_sum)
		err = -EILSEQ;
	return err;
}

/* A chunk of a compressed region, decompressed into buf. */
static long load_chunk(const struct piece *p, struct loader *l)
{
	if (p->format == CKPT_CHUNK_RAW)
		return read_at(p->fd, (uint64_t)l->buf, p->len, p->off);
	if (read_at(p->fd, (uint64_t)l->u.in, p->stored, p->off))
		return -EIO;
	if (ZSTD_decompressDCtx(l->u.dctx, l->buf, p->len, l->u.in, p->stored) != p->len)
		return -EBADMSG;
	return 0;
}

/* Pages of an earlier image's zstd chunk (incremental): the whole chunk. */
static long load_ref_chunk(const struct piece *p, struct loader *l)
{
	const struct ckpt_page_ref *r = p->ref;
	long err = read_at(p->fd, (uint64_t)l->u.in, r->stored, r->off);

	if (!err && ZSTD_decompressDCtx(l->u.dctx, l->buf, r->chunk_len, l->u.in,
					r->stored) != r->chunk_len)
		err = -EBADMSG;
	return err;
}

/* A unit's bytes, read (checked, decompressed) with l: *data, where they
 * start in l->buf.  Either thread; touches nothing of the processes. */
static long load_unit(const struct client *c, unsigned unit, struct loader *l,
		      const char **data)
{
	const struct unit *u = &c->units[unit];
	const struct piece *p = &c->pieces[u->first];

	*data = l->buf;
	if (p->block_sum)
		return load_block(p, u->count, l);
	if (p->lv)
		return load_chunk(p, l);
	if (p->ref) {
		*data = l->buf + p->ref->into;
		return load_ref_chunk(p, l);
	}
	return read_at(p->fd, (uint64_t)l->buf, p->len, p->off);
}

/* A unit's bytes at data into the process (the main thread's). */
static long put_unit(struct client *c, unsigned unit, const char *data)
{
	const struct unit *u = &c->units[unit];
	const struct piece *p = &c->pieces[u->first];
	uint64_t len = p->len, into, r;
	long err = 0;

	if (p->block_sum) {
		for (unsigned i = 0; i < u->count && !err; data += p[i].len, i++)
			err = put(c, p[i].addr, data, p[i].len);
		return err;
	}
	if (!p->lv)
		return put(c, p->addr, data, p->len);
	for (r = run_of(p->lv, p->pos, &into); !err && len && r < p->lv->v.nruns; r++, into = 0) {
		uint64_t n = p->lv->runs[r].npages * CKPT_PAGE_SIZE - into;

		if (n > len)
			n = len;
		err = put(c, p->lv->v.start + p->lv->runs[r].offset + into, data, n);
		data += n;
		len -= n;
	}
	return err;
}

/* A unit read and handed out (err: how it went): done, or the end. */
static void unit_done(struct client *c, unsigned u, long err)
{
	if (err == -ESRCH) {	/* the process exited: nothing more to fill */
		c->dead = 1;
		err = 0;
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
	__atomic_store_n(&c->state[u], UNIT_DONE, __ATOMIC_RELEASE);
	c->ndone++;
	left -= c->unit_bytes[u];
}

/* A full slot's unit into its process; the slot is free again. */
static void empty_slot(struct slot *s)
{
	struct client *c = s->c;
	long err = c->dead ? 0 : s->err;

	if (!err && !c->dead)
		err = put_unit(c, s->unit, s->data);
	unit_done(c, s->unit, err);
	pthread_mutex_lock(&slot_lock);
	s->full = s->busy = 0;
	pthread_cond_signal(&slot_freed);
	pthread_mutex_unlock(&slot_lock);
}

/* The slot the streamer fills or filled with unit u of c, once full. */
static struct slot *slot_of(const struct client *c, unsigned u)
{
	pthread_mutex_lock(&slot_lock);
	for (;;) {
		for (unsigned i = 0; i < SLOTS; i++)
			if (slots[i].full && slots[i].c == c && slots[i].unit == u) {
				slots[i].full = 0;	/* ours to empty */
				pthread_mutex_unlock(&slot_lock);
				return &slots[i];
			}
		pthread_cond_wait(&slot_filled, &slot_lock);
	}
}

/* Every unit the streamer has read, handed out. */
static void empty_slots(void)
{
	uint64_t n;

	if (read(slot_event, &n, sizeof(n)) < 0 && errno != EAGAIN)
		die("page server: reading its eventfd: %s", strerror(errno));
	for (;;) {
		struct slot *s = NULL;

		pthread_mutex_lock(&slot_lock);
		for (unsigned i = 0; i < SLOTS && !s; i++)
			if (slots[i].full)
				s = &slots[i];
		if (s)
			s->full = 0;
		pthread_mutex_unlock(&slot_lock);
		if (!s)
			return;
		empty_slot(s);
	}
}

/* Unit u of c now: read here, or from the streamer's slot if it has it. */
static void serve_unit(struct client *c, unsigned u)
{
	uint8_t todo = UNIT_TODO;
	const char *data;
	long err;

	if (c->dead)
		return;
	if (__atomic_compare_exchange_n(&c->state[u], &todo, UNIT_TAKEN, 0, __ATOMIC_ACQ_REL,
					__ATOMIC_ACQUIRE)) {
		err = load_unit(c, u, &own, &data);
		if (!err)
			err = put_unit(c, u, data);
		unit_done(c, u, err);
	} else if (todo == UNIT_TAKEN) {
		empty_slot(slot_of(c, u));
	}
}

/* ---- the streamer ---- */

static void loader_init(struct loader *l)
{
	unpacker_init(&l->u);
	l->u.gap = map(1UL << 20);
	l->buf = map(UNIT_BUF);
}

static int paused(void)
{
	return pause_path && access(pause_path, F_OK) == 0;
}

/* The next unit in image order of the next process that has one, taken;
 * the disk asked for those after it. */
static int take_next(struct client **cp, unsigned *up)
{
	static unsigned turn;
	unsigned n = __atomic_load_n(&nclients, __ATOMIC_ACQUIRE);

	for (unsigned k = 0; k < n; k++) {
		struct client *c = &clients[(turn + k) % n];

		for (; c->next < c->nunits && !__atomic_load_n(&c->dead, __ATOMIC_RELAXED); c->next++) {
			uint8_t todo = UNIT_TODO;

			if (!__atomic_compare_exchange_n(&c->state[c->next], &todo, UNIT_TAKEN, 0,
							 __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
				continue;
			for (; c->ahead < c->nunits && c->ahead <= c->next + AHEAD_UNITS; c->ahead++)
				reader_advise(c->pieces, &c->units[c->ahead]);
			*cp = c;
			*up = c->next++;
			turn = (turn + k + 1) % n;
			return 1;
		}
	}
	return 0;
}

static void *stream(void *unused)
{
	const struct timespec idle = { 0, 2000000 };
	uint64_t one = 1;

	(void)unused;
	for (;;) {
		struct slot *s = NULL;
		struct client *c;
		unsigned u;

		pthread_mutex_lock(&slot_lock);
		while (!s) {
			for (unsigned i = 0; i < SLOTS && !s; i++)
				if (!slots[i].busy)
					s = &slots[i];
			if (!s)
				pthread_cond_wait(&slot_freed, &slot_lock);
		}
		s->busy = 1;
		pthread_mutex_unlock(&slot_lock);
		while (paused() || !take_next(&c, &u))
			nanosleep(&idle, NULL);
		streamer.buf = s->buf;
		s->err = load_unit(c, u, &streamer, &s->data);
		pthread_mutex_lock(&slot_lock);
		s->c = c;
		s->unit = u;
		s->full = 1;
		pthread_cond_broadcast(&slot_filled);
		pthread_mutex_unlock(&slot_lock);
		/* EAGAIN alone can fail it: the count is high, the main thread awake */
		(void)!write(slot_event, &one, sizeof(one));
	}
	return NULL;
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
	c->state = map(c->nunits);
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

/* The units of the pages in [lo, hi), now. */
static void serve_range(struct client *c, uint64_t lo, uint64_t hi)
{
	for (uint64_t at = lo & ~(CKPT_PAGE_SIZE - 1); at < hi && !c->dead; at += CKPT_PAGE_SIZE) {
		long u = unit_at(c, at);

		if (u >= 0)
			serve_unit(c, u);
	}
}

/*
 * First what each thread touches first: its stack top and its TLS; and
 * the process's arguments and environment, which /proc/PID/cmdline and
 * environ read from its memory without waiting for a missing page (the
 * kernel's remote access gives up on a userfaultfd page at once): ps and
 * the like see the process while its pages arrive.
 */
static void working_set(struct client *c)
{
	const struct ckpt_process *p = c->img->proc;

	for (unsigned t = 0; t < c->img->nthreads && !c->dead; t++) {
		const struct ckpt_thread *th = &c->img->threads[t];

		serve_range(c, th->regs.rsp, th->regs.rsp + 1);
		serve_range(c, th->fs_base, th->fs_base + 1);
	}
	serve_range(c, p->arg_start, p->arg_end);
	serve_range(c, p->env_start, p->env_end);
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
	c = &clients[nclients];
	c->img = &images[index];
	c->uffd = fd;
	plan_client(c);
	__atomic_store_n(&nclients, nclients + 1, __ATOMIC_RELEASE);	/* the streamer's too */
	working_set(c);
}

/* Whether a process still waits for a unit. */
static int units_left(void)
{
	for (unsigned k = 0; k < nclients; k++)
		if (!clients[k].dead && clients[k].ndone < clients[k].nunits)
			return 1;
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

static void poll_once(void)
{
	static struct pollfd pfd[MAX_CLIENTS + 2];
	unsigned n = 0;

	pfd[n++] = (struct pollfd){ slot_event, POLLIN, 0 };
	pfd[n++] = (struct pollfd){ received < expected ? requests : -1, POLLIN, 0 };
	for (unsigned i = 0; i < nclients; i++)
		pfd[n++] = (struct pollfd){ clients[i].dead ? -1 : clients[i].uffd, POLLIN, 0 };
	if (poll(pfd, n, (int)(REPORT_NS / 1000000)) < 0 && errno != EINTR)
		die("page server: poll: %s", strerror(errno));
	if (pfd[1].revents & POLLIN)
		receive_client();
	else if (pfd[1].revents & (POLLHUP | POLLERR))
		die("page server: the restart ended before every process was back");
	for (unsigned i = 0; i < nclients && i + 2 < n; i++)
		if (pfd[i + 2].revents)
			read_events(&clients[i]);
	for (unsigned i = 0; i < nclients; i++)
		serve_faults(&clients[i]);
	empty_slots();
}

int lazy_serve(struct image *imgs, unsigned want, int req, int keep, int keep_send, int sfd)
{
	pthread_t thread;
	sigset_t term;
	int err;

	images = imgs;
	expected = want;
	requests = req;
	keeper = keep;
	status_fd = own_status_fd(sfd);
	pause_path = getenv("CKPT_LAZY_PAUSE");
	keeper_send = keep_send;
	t_start = now_ns();
	clients = map(MAX_CLIENTS * sizeof(*clients));
	loader_init(&own);
	loader_init(&streamer);
	for (unsigned i = 0; i < SLOTS; i++)
		slots[i].buf = map(UNIT_BUF);
	slot_event = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (slot_event < 0)
		die("page server: eventfd: %s", strerror(errno));
	prctl(PR_SET_NAME, "ckpt-pageserver");
	signal(SIGPIPE, SIG_IGN);	/* a status fd nobody reads */
	signal(SIGTERM, on_term);
	/* SIGTERM for the main thread alone: it wakes its poll() */
	sigemptyset(&term);
	sigaddset(&term, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &term, NULL);
	err = pthread_create(&thread, NULL, stream, NULL);
	pthread_sigmask(SIG_UNBLOCK, &term, NULL);
	if (err)
		die("page server: cannot start its streamer: %s", strerror(err));
	for (;;) {
		if (job_over)
			job_ended();
		poll_once();
		report(0);
		if (received == expected && !units_left()) {
			report(1);
			finish();
		}
	}
}
