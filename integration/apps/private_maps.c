/*
 * Memory whose bytes come from several places: private (copy-on-write)
 * maps of a file, of a file changed on disk after it was mapped, of a
 * memfd and of a file unlinked after it was mapped; shared maps of a memfd
 * and of an unlinked file; a map longer than its file; an anonymous region
 * with MADV_DONTNEED'd pages, an unmapped hole and PROT_NONE pages; and
 * regions moved or grown by mremap.  Every step writes some pages, then
 * checks all of them: a written page of a private map holds the process's
 * bytes, an untouched one the file's, and nothing the process wrote
 * through a private map reaches the file.
 *
 * What Linux leaves open is not checked: whether an untouched page of a
 * private map shows a change made to the file afterwards (POSIX: either).
 * Here that page must hold one of the two whole, and keep what it showed
 * before the checkpoint (the file does not change after READY).
 *
 *   private_maps [steps] [ms-per-step] [dir]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include "zdtm.h"

#define PS 4096L

static sigjmp_buf fault_jmp;
static volatile sig_atomic_t fault_sig;

static void on_fault(int sig)
{
	fault_sig = sig;
	siglongjmp(fault_jmp, 1);
}

/* The signal reading p raises, or 0. */
static int read_fault(volatile char *p)
{
	fault_sig = 0;
	if (sigsetjmp(fault_jmp, 1) == 0)
		(void)*p;
	return fault_sig;
}

/* Bytes a file (or memfd) holds at page pg: a pattern per salt. */
static unsigned char file_byte(int salt, long pg, long i)
{
	return (unsigned char)(salt * 31 + pg * 7 + (i / 512) * 3 + 1);
}

/* Bytes the process writes at step into page pg. */
static unsigned char proc_byte(int salt, long step, long pg, long i)
{
	return (unsigned char)(0x80 ^ (salt * 17 + step * 5 + pg * 11 + (i / 512)));
}

static void fill_page(char *p, unsigned char (*byte)(int, long, long), int salt, long pg)
{
	for (long i = 0; i < PS; i++)
		p[i] = byte(salt, pg, i);
}

static unsigned char file_b(int salt, long pg, long i) { return file_byte(salt, pg, i); }

static void write_proc(char *p, int salt, long step, long pg)
{
	for (long i = 0; i < PS; i++)
		p[i] = proc_byte(salt, step, pg, i);
}

static void check_proc(const char *what, const char *p, int salt, long step, long pg)
{
	for (long i = 0; i < PS; i += 256)
		zdtm_check((unsigned char)p[i] == proc_byte(salt, step, pg, i),
			   "%s page %ld step %ld: %02x, not the process's %02x", what, pg, step,
			   (unsigned char)p[i], proc_byte(salt, step, pg, i));
}

static void check_file(const char *what, const char *p, int salt, long pg, long len)
{
	for (long i = 0; i < len; i += 256)
		zdtm_check((unsigned char)p[i] == file_byte(salt, pg, i),
			   "%s page %ld: %02x, not the file's %02x", what, pg,
			   (unsigned char)p[i], file_byte(salt, pg, i));
}

static void check_zero(const char *what, const char *p, long from, long len)
{
	for (long i = from; i < len; i++)
		zdtm_check(p[i] == 0, "%s: byte %ld is %02x, not 0", what, i, (unsigned char)p[i]);
}

/* A file of len bytes of file_byte(salt); its fd. */
static int make_file(const char *dir, const char *name, int salt, long len)
{
	char path[4096], page[PS];
	int fd;

	snprintf(path, sizeof(path), "%s/private_maps.%d.%s", dir, (int)getpid(), name);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	zdtm_check(fd >= 0, "open %s", path);
	for (long pg = 0; pg * PS < len; pg++) {
		long n = len - pg * PS < PS ? len - pg * PS : PS;

		fill_page(page, file_b, salt, pg);
		zdtm_check(pwrite(fd, page, n, pg * PS) == n, "write %s", path);
	}
	return fd;
}

static void unlink_file(const char *dir, const char *name)
{
	char path[4096];

	snprintf(path, sizeof(path), "%s/private_maps.%d.%s", dir, (int)getpid(), name);
	zdtm_check(unlink(path) == 0, "unlink %s", path);
}

static int make_memfd(const char *name, int salt, long pages)
{
	char page[PS];
	int fd = memfd_create(name, 0);

	zdtm_check(fd >= 0, "memfd_create");
	for (long pg = 0; pg < pages; pg++) {
		fill_page(page, file_b, salt, pg);
		zdtm_check(pwrite(fd, page, PS, pg * PS) == PS, "write memfd");
	}
	return fd;
}

static char *map(long pages, int prot, int flags, int fd)
{
	char *m = mmap(NULL, pages * PS, prot, flags, fd, 0);

	zdtm_check(m != MAP_FAILED, "mmap: %s", strerror(errno));
	return m;
}

/* The file's bytes at page pg, by pread: what the process never wrote
 * through a private map. */
static void check_file_unchanged(const char *what, int fd, int salt, long pg)
{
	char page[PS];

	zdtm_check(pread(fd, page, PS, pg * PS) == PS, "pread %s", what);
	check_file(what, page, salt, pg, PS);
}

/* Whether [p, p + len) is mapped, as mincore sees it (ENOMEM: a hole). */
static int is_mapped(void *p, long len)
{
	unsigned char vec[64];

	return mincore(p, len, vec) == 0 || errno != ENOMEM;
}

/* The length of the /proc/self/maps line that starts at p, or 0. */
static long maps_length(void *p)
{
	char line[512];
	FILE *f = fopen("/proc/self/maps", "r");
	long len = 0;

	zdtm_check(f != NULL, "/proc/self/maps");
	while (!len && fgets(line, sizeof(line), f)) {
		unsigned long s, e;

		if (sscanf(line, "%lx-%lx", &s, &e) == 2 && s == (unsigned long)p)
			len = e - s;
	}
	fclose(f);
	return len;
}

enum {
	F_PAGES = 8, C_PAGES = 4, M_PAGES = 4, D_PAGES = 4, E_LEN = PS + PS / 2, E_PAGES = 4,
	A_PAGES = 16, R_PAGES = 4, R_GROWN = 8,
};

/* anonymous region: pages 3-4 MADV_DONTNEED'd, 8-9 unmapped, 12-13 PROT_NONE */
static int anon_kind(long pg)
{
	if (pg == 3 || pg == 4)
		return 'z';
	if (pg == 8 || pg == 9)
		return 'h';
	if (pg == 12 || pg == 13)
		return 'n';
	return 'd';
}

struct maps {
	int f_fd, c_fd, pm_fd, sm_fd, ds_fd, e_fd;
	char *f, *c, *pm, *sm, *dp, *ds, *dk, *e, *ed, *a, *r, *rf;
	int c0_new;			/* what page 0 of the changed file's map shows */
};

static void setup(struct maps *m, const char *dir)
{
	char page[PS];
	int fd;

	/* a file mapped privately: pages 1, 3, 5 written, 0, 2, 4 read, 6, 7 never */
	m->f_fd = make_file(dir, "file", 1, F_PAGES * PS);
	m->f = map(F_PAGES, PROT_READ | PROT_WRITE, MAP_PRIVATE, m->f_fd);

	/* a file changed after it was mapped privately: page 1 written before */
	m->c_fd = make_file(dir, "changed", 2, C_PAGES * PS);
	m->c = map(C_PAGES, PROT_READ | PROT_WRITE, MAP_PRIVATE, m->c_fd);
	check_file("changed file map", m->c, 2, 0, PS);
	write_proc(m->c + PS, 2, 0, 1);
	for (long pg = 0; pg < 2; pg++) {
		fill_page(page, file_b, 12, pg);
		zdtm_check(pwrite(m->c_fd, page, PS, pg * PS) == PS, "change the file");
	}
	m->c0_new = (unsigned char)m->c[0] == file_byte(12, 0, 0);

	/* memfds: one mapped privately, one shared */
	m->pm_fd = make_memfd("private", 3, M_PAGES);
	m->pm = map(M_PAGES, PROT_READ | PROT_WRITE, MAP_PRIVATE, m->pm_fd);
	m->sm_fd = make_memfd("shared", 4, M_PAGES);
	m->sm = map(M_PAGES, PROT_READ | PROT_WRITE, MAP_SHARED, m->sm_fd);

	/* files unlinked after being mapped: privately (fd closed), shared (fd kept) */
	fd = make_file(dir, "deleted-private", 5, D_PAGES * PS);
	m->dp = map(D_PAGES, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd);
	close(fd);
	unlink_file(dir, "deleted-private");
	m->ds_fd = make_file(dir, "deleted-shared", 6, D_PAGES * PS);
	m->ds = map(D_PAGES, PROT_READ | PROT_WRITE, MAP_SHARED, m->ds_fd);
	/* and privately too, its fd kept */
	m->dk = map(D_PAGES, PROT_READ | PROT_WRITE, MAP_PRIVATE, m->ds_fd);
	memset(m->dk, 0, PS);		/* a private copy of zeros */
	unlink_file(dir, "deleted-shared");
	/* a page of an unlinked library's text */
	zdtm_check(mprotect(m->dp + 3 * PS, PS, PROT_READ | PROT_EXEC) == 0, "mprotect exec");

	/* maps longer than their file (1.5 pages of 4): one kept, one unlinked */
	m->e_fd = make_file(dir, "short", 7, E_LEN);
	m->e = map(E_PAGES, PROT_READ | PROT_WRITE, MAP_PRIVATE, m->e_fd);
	fd = make_file(dir, "short-deleted", 8, E_LEN);
	m->ed = map(E_PAGES, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd);
	close(fd);
	unlink_file(dir, "short-deleted");

	/* an anonymous region with holes of every kind */
	m->a = map(A_PAGES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1);
	for (long pg = 0; pg < A_PAGES; pg++)
		write_proc(m->a + pg * PS, 9, 0, pg);
	zdtm_check(madvise(m->a + 3 * PS, 2 * PS, MADV_DONTNEED) == 0, "MADV_DONTNEED");
	zdtm_check(munmap(m->a + 8 * PS, 2 * PS) == 0, "munmap");
	zdtm_check(mprotect(m->a + 12 * PS, 2 * PS, PROT_NONE) == 0, "mprotect");

	/* mremap: an anonymous region grown (maybe moved), a private file map moved */
	m->r = map(R_PAGES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1);
	for (long pg = 0; pg < R_PAGES; pg++)
		write_proc(m->r + pg * PS, 10, 0, pg);
	m->r = mremap(m->r, R_PAGES * PS, R_GROWN * PS, MREMAP_MAYMOVE);
	zdtm_check(m->r != MAP_FAILED, "mremap grow");
	{
		char *old = map(F_PAGES, PROT_READ | PROT_WRITE, MAP_PRIVATE, m->f_fd);
		char *to = map(F_PAGES + 2, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1);

		write_proc(old + 2 * PS, 11, 0, 2);
		/* moved, and a page shorter: pages 0-6 of the file at to + 1 page */
		m->rf = mremap(old, (F_PAGES - 1) * PS, (F_PAGES - 1) * PS,
			       MREMAP_MAYMOVE | MREMAP_FIXED, to + PS);
		zdtm_check(m->rf == to + PS, "mremap move");
		munmap(old + (F_PAGES - 1) * PS, PS);
		munmap(to, PS);
		munmap(to + F_PAGES * PS, 2 * PS);
		/* PROT_NONE over a private copy, and over an untouched file page */
		zdtm_check(mprotect(m->rf + 2 * PS, PS, PROT_NONE) == 0 &&
			   mprotect(m->f + 6 * PS, PS, PROT_NONE) == 0, "mprotect file map");
	}
}

static void step_write(struct maps *m, long step)
{
	for (long pg = 1; pg < 6; pg += 2)
		write_proc(m->f + pg * PS, 1, step, pg);
	write_proc(m->pm + 2 * PS, 3, step, 2);
	write_proc(m->sm + PS, 4, step, 1);
	write_proc(m->dp, 5, step, 0);
	write_proc(m->ds + PS, 6, step, 1);
	write_proc(m->dk + 2 * PS, 6, step, 2);
	memset(m->e + PS + PS / 2, (int)(step | 1) & 0xff, PS / 2);	/* past EOF, same page */
	write_proc(m->e, 7, step, 0);
	write_proc(m->ed, 8, step, 0);
	for (long pg = 0; pg < A_PAGES; pg++)
		if (anon_kind(pg) == 'd')
			write_proc(m->a + pg * PS, 9, step, pg);
	for (long pg = 0; pg < R_GROWN; pg += 2)
		write_proc(m->r + pg * PS, 10, step, pg);
	write_proc(m->rf + 4 * PS, 11, step, 4);
}

static void step_check(struct maps *m, long step)
{
	char page[PS];

	for (long pg = 0; pg < F_PAGES; pg++) {
		if (pg % 2 && pg < 6)
			check_proc("private file map", m->f + pg * PS, 1, step, pg);
		else if (pg < 6)	/* 6 and 7 are never touched before the end */
			check_file("private file map", m->f + pg * PS, 1, pg, PS);
	}
	/* the changed file: page 1 the process's, page 0 what it showed */
	check_proc("changed file map", m->c + PS, 2, 0, 1);
	check_file("changed file map", m->c, m->c0_new ? 12 : 2, 0, PS);
	check_file("changed file map", m->c + 2 * PS, 2, 2, PS);

	for (long pg = 0; pg < M_PAGES; pg++) {
		if (pg == 2)
			check_proc("private memfd map", m->pm + pg * PS, 3, step, pg);
		else
			check_file("private memfd map", m->pm + pg * PS, 3, pg, PS);
		if (pg == 1)
			check_proc("shared memfd map", m->sm + pg * PS, 4, step, pg);
		else
			check_file("shared memfd map", m->sm + pg * PS, 4, pg, PS);
	}
	check_file_unchanged("memfd behind a private map", m->pm_fd, 3, 2);
	zdtm_check(pread(m->sm_fd, page, PS, PS) == PS, "pread shared memfd");
	check_proc("shared memfd, read", page, 4, step, 1);

	for (long pg = 0; pg < D_PAGES; pg++) {
		if (pg == 0)
			check_proc("private map of an unlinked file", m->dp, 5, step, 0);
		else
			check_file("private map of an unlinked file", m->dp + pg * PS, 5, pg, PS);
		if (pg == 1)
			check_proc("shared map of an unlinked file", m->ds + PS, 6, step, 1);
		else
			check_file("shared map of an unlinked file", m->ds + pg * PS, 6, pg, PS);
	}
	/* page 1 is the shared map's: what the private one shows there is open */
	check_proc("private map of an unlinked file, fd kept", m->dk + 2 * PS, 6, step, 2);
	check_zero("private map of an unlinked file, fd kept, zeroed", m->dk, 0, PS);
	check_file("private map of an unlinked file, fd kept", m->dk + 3 * PS, 6, 3, PS);
	zdtm_check(pread(m->ds_fd, page, PS, PS) == PS, "pread unlinked file");
	check_proc("unlinked file under a shared map, read", page, 6, step, 1);

	check_proc("map longer than its file", m->e, 7, step, 0);
	check_file("map longer than its file", m->e + PS, 7, 1, PS / 2);
	for (long i = PS / 2; i < PS; i += 256)
		zdtm_check((unsigned char)m->e[PS + i] == ((step | 1) & 0xff),
			   "map longer than its file, past the end: %02x", (unsigned char)m->e[PS + i]);
	check_proc("map longer than its unlinked file", m->ed, 8, step, 0);
	check_file("map longer than its unlinked file", m->ed + PS, 8, 1, PS / 2);

	for (long pg = 0; pg < A_PAGES; pg++) {
		switch (anon_kind(pg)) {
		case 'd':
			check_proc("anonymous region", m->a + pg * PS, 9, step, pg);
			break;
		case 'z':
			check_zero("MADV_DONTNEED'd page", m->a + pg * PS, 0, PS);
			break;
		case 'h':
			zdtm_check(!is_mapped(m->a + pg * PS, PS), "hole page %ld is mapped", pg);
			break;
		}
	}
	for (long pg = 0; pg < R_GROWN; pg++) {
		if (pg % 2 == 0)
			check_proc("grown region", m->r + pg * PS, 10, step, pg);
		else if (pg < R_PAGES)
			check_proc("grown region", m->r + pg * PS, 10, 0, pg);
		else
			check_zero("grown region", m->r + pg * PS, 0, PS);
	}
	for (long pg = 0; pg < F_PAGES - 1; pg++) {
		if (pg == 4)
			check_proc("moved file map", m->rf + pg * PS, 11, step, pg);
		else if (pg != 2)
			check_file("moved file map", m->rf + pg * PS, 1, pg, PS);
	}
	zdtm_check(!is_mapped(m->rf - PS, PS) && !is_mapped(m->rf + (F_PAGES - 1) * PS, PS),
		   "the moved map's neighbours are mapped");
}

/* After the last step: what may fault, and that private stays private. */
static void final_check(struct maps *m, long steps)
{
	struct sigaction sa;
	char page[PS];

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_fault;
	sa.sa_flags = SA_NODEFER;
	zdtm_check(sigaction(SIGSEGV, &sa, NULL) == 0 && sigaction(SIGBUS, &sa, NULL) == 0,
		   "sigaction");

	/* PROT_NONE pages of file maps: fault, then the copy or the file's bytes */
	zdtm_check(read_fault(m->rf + 2 * PS) == SIGSEGV && read_fault(m->f + 6 * PS) == SIGSEGV,
		   "a PROT_NONE page of a file map can be read");
	zdtm_check(mprotect(m->rf + 2 * PS, PS, PROT_READ) == 0 &&
		   mprotect(m->f + 6 * PS, PS, PROT_READ | PROT_WRITE) == 0, "mprotect back");
	check_proc("PROT_NONE copy in a file map", m->rf + 2 * PS, 11, 0, 2);
	/* pages never touched come from the file */
	check_file("private file map, untouched", m->f + 6 * PS, 1, 6, PS);
	check_file("private file map, untouched", m->f + 7 * PS, 1, 7, PS);
	/* written through every private map now: nothing reaches the file */
	for (long pg = 0; pg < F_PAGES; pg++)
		write_proc(m->f + pg * PS, 13, steps, pg);
	for (long pg = 0; pg < E_PAGES - 2; pg++)
		write_proc(m->e + pg * PS, 13, steps, pg);
	write_proc(m->pm, 13, steps, 0);
	write_proc(m->c, 13, steps, 0);
	for (long pg = 0; pg < F_PAGES; pg++)
		check_file_unchanged("file behind a private map", m->f_fd, 1, pg);
	/* private copies dropped: the file's (memfd's) bytes again (madvise(2)) */
	zdtm_check(madvise(m->f, F_PAGES * PS, MADV_DONTNEED) == 0, "MADV_DONTNEED file map");
	for (long pg = 0; pg < F_PAGES; pg++)
		check_file("private file map after MADV_DONTNEED", m->f + pg * PS, 1, pg, PS);
	zdtm_check(madvise(m->pm, M_PAGES * PS, MADV_DONTNEED) == 0, "MADV_DONTNEED memfd map");
	for (long pg = 0; pg < M_PAGES; pg++)
		check_file("private memfd map after MADV_DONTNEED", m->pm + pg * PS, 3, pg, PS);
	zdtm_check(madvise(m->dk + 2 * PS, PS, MADV_DONTNEED) == 0 &&
		   madvise(m->dk, PS, MADV_DONTNEED) == 0, "MADV_DONTNEED unlinked");
	check_file("private map of an unlinked file after MADV_DONTNEED", m->dk, 6, 0, PS);
	check_file("private map of an unlinked file after MADV_DONTNEED", m->dk + 2 * PS, 6, 2, PS);
	zdtm_check(madvise(m->e, PS, MADV_DONTNEED) == 0, "MADV_DONTNEED short map");
	check_file("map longer than its file after MADV_DONTNEED", m->e, 7, 0, PS);
	check_file_unchanged("memfd behind a private map", m->pm_fd, 3, 0);
	check_file_unchanged("memfd behind a private map", m->pm_fd, 3, 2);
	check_file_unchanged("changed file behind a private map", m->c_fd, 12, 0);
	check_file_unchanged("changed file behind a private map", m->c_fd, 2, 2);
	zdtm_check(pread(m->e_fd, page, PS, 0) == PS, "pread short file");
	check_file("short file behind a private map", page, 7, 0, PS);
	zdtm_check(lseek(m->e_fd, 0, SEEK_END) == E_LEN, "the short file's length changed");

	/* past the end of the file: SIGBUS, the map as long as it was */
	zdtm_check(read_fault(m->e + 2 * PS) == SIGBUS, "no SIGBUS past the end of the file");
	zdtm_check(read_fault(m->e + 3 * PS) == SIGBUS, "no SIGBUS past the end of the file");
	zdtm_check(read_fault(m->ed + 2 * PS) == SIGBUS,
		   "no SIGBUS past the end of the unlinked file");
	zdtm_check(maps_length(m->e) == E_PAGES * PS,
		   "the map longer than its file is %ld bytes long", maps_length(m->e));
	zdtm_check(maps_length(m->ed) == E_PAGES * PS,
		   "the map longer than its unlinked file is %ld bytes long", maps_length(m->ed));

	check_file("unlinked library text", m->dp + 3 * PS, 5, 3, PS);
	zdtm_check(maps_length(m->pm) == M_PAGES * PS && maps_length(m->dp) == 3 * PS,
		   "a private map of a memfd or an unlinked file changed length");

	/* PROT_NONE pages fault, and hold what was written before */
	zdtm_check(read_fault(m->a + 12 * PS) == SIGSEGV, "a PROT_NONE page can be read");
	zdtm_check(mprotect(m->a + 12 * PS, 2 * PS, PROT_READ) == 0, "mprotect back");
	check_proc("PROT_NONE page", m->a + 12 * PS, 9, 0, 12);
	check_proc("PROT_NONE page", m->a + 13 * PS, 9, 0, 13);
	zdtm_check(read_fault(m->a + 8 * PS) == SIGSEGV, "the hole can be read");
}

int main(int argc, char **argv)
{
	long steps = 300, pace = 10;
	const char *dir = argc > 3 ? argv[3] : ".";
	struct maps m;

	zdtm_args(argc, argv, &steps, &pace);
	setup(&m, dir);
	printf("READY\n");
	fflush(stdout);
	for (long step = 1; step <= steps; step++) {
		step_write(&m, step);
		zdtm_pace(pace);
		step_check(&m, step);
	}
	zdtm_hold();
	final_check(&m, steps);
	zdtm_pass("steps=%ld", steps);
	return 0;
}
