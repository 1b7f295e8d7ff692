/*
 * Guard pages (madvise MADV_GUARD_INSTALL, Linux 6.13+): any access to
 * them faults.  In an anonymous region between data pages and in a
 * private file mapping whose other pages the program changed.  After
 * every step the data pages hold their values; at the end the guard
 * pages still fault, and MADV_GUARD_REMOVE turns them back into
 * ordinary pages (zero, or the file's bytes).
 *
 *   guard_pages [steps] [ms-per-step] [dir]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include "zdtm.h"

#ifndef MADV_GUARD_INSTALL
#define MADV_GUARD_INSTALL 102
#define MADV_GUARD_REMOVE 103
#endif

#define PS 4096L
#define ANON_PAGES 32
#define FILE_PAGES 8

static const int anon_guards[] = { 0, 8, 9, 20, 31 };
static const int file_guards[] = { 3 };

static sigjmp_buf fault_jmp;
static volatile sig_atomic_t faults;

static void on_segv(int sig)
{
	(void)sig;
	faults++;
	siglongjmp(fault_jmp, 1);
}

static int is_guard(const int *guards, int n, int page)
{
	for (int i = 0; i < n; i++)
		if (guards[i] == page)
			return 1;
	return 0;
}

/* Whether reading p faults. */
static int faults_on_read(volatile char *p)
{
	int before = faults;

	if (sigsetjmp(fault_jmp, 1) == 0)
		(void)*p;
	return faults != before;
}

static void fill(char *base, int npages, const int *guards, int ng, long step, int salt)
{
	for (int pg = 0; pg < npages; pg++)
		if (!is_guard(guards, ng, pg))
			memset(base + pg * PS, (int)((step * 7 + pg * 13 + salt) & 0xff), PS);
}

static void check(const char *what, char *base, int npages, const int *guards, int ng,
		  long step, int salt)
{
	for (int pg = 0; pg < npages; pg++) {
		unsigned char want = (step * 7 + pg * 13 + salt) & 0xff;

		if (is_guard(guards, ng, pg))
			continue;
		for (long i = 0; i < PS; i += 512)
			zdtm_check((unsigned char)base[pg * PS + i] == want,
				   "%s page %d step %ld: %02x, not %02x", what, pg, step,
				   (unsigned char)base[pg * PS + i], want);
	}
}

static char *file_mapping(const char *dir)
{
	char path[4096], page[PS];
	char *m;
	int fd;

	snprintf(path, sizeof(path), "%s/guard_pages.data", dir);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	zdtm_check(fd >= 0, "open %s", path);
	for (int pg = 0; pg < FILE_PAGES; pg++) {
		memset(page, 'a' + pg, sizeof(page));
		zdtm_check(write(fd, page, PS) == PS, "write");
	}
	m = mmap(NULL, FILE_PAGES * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	zdtm_check(m != MAP_FAILED, "mmap file");
	close(fd);
	return m;
}

int main(int argc, char **argv)
{
	long steps = 300, pace = 10;
	const char *dir = argc > 3 ? argv[3] : ".";
	int nag = sizeof(anon_guards) / sizeof(anon_guards[0]);
	int nfg = sizeof(file_guards) / sizeof(file_guards[0]);
	struct sigaction sa;
	char *anon, *file;
	int file_guarded;

	zdtm_args(argc, argv, &steps, &pace);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_segv;
	sa.sa_flags = SA_NODEFER;
	zdtm_check(sigaction(SIGSEGV, &sa, NULL) == 0, "sigaction");
	anon = mmap(NULL, ANON_PAGES * PS, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	zdtm_check(anon != MAP_FAILED, "mmap");
	fill(anon, ANON_PAGES, anon_guards, nag, 0, 1);
	for (int i = 0; i < nag; i++)
		zdtm_check(madvise(anon + anon_guards[i] * PS, PS, MADV_GUARD_INSTALL) == 0,
			   "MADV_GUARD_INSTALL: %s", strerror(errno));
	file = file_mapping(dir);
	/* guards in file mappings came later (6.15): take them where they exist */
	file_guarded = madvise(file + file_guards[0] * PS, PS, MADV_GUARD_INSTALL) == 0;
	printf("READY\n");
	fflush(stdout);
	for (long step = 1; step <= steps; step++) {
		fill(anon, ANON_PAGES, anon_guards, nag, step, 1);
		fill(file, FILE_PAGES, file_guards, file_guarded ? nfg : 0, step, 2);
		zdtm_pace(pace);
		check("anon", anon, ANON_PAGES, anon_guards, nag, step, 1);
		check("file", file, FILE_PAGES, file_guards, file_guarded ? nfg : 0, step, 2);
	}
	zdtm_hold();
	for (int i = 0; i < nag; i++)
		zdtm_check(faults_on_read(anon + anon_guards[i] * PS),
			   "anon guard page %d does not fault", anon_guards[i]);
	zdtm_check(!faults_on_read(anon + PS), "anon page 1 faults");
	if (file_guarded)
		zdtm_check(faults_on_read(file + file_guards[0] * PS), "file guard page faults not");
	/* removed, a guard page is an ordinary page again */
	zdtm_check(madvise(anon + 8 * PS, 2 * PS, MADV_GUARD_REMOVE) == 0, "MADV_GUARD_REMOVE");
	zdtm_check(!faults_on_read(anon + 8 * PS) && anon[8 * PS] == 0, "removed guard page");
	if (file_guarded) {
		zdtm_check(madvise(file + file_guards[0] * PS, PS, MADV_GUARD_REMOVE) == 0,
			   "MADV_GUARD_REMOVE file");
		zdtm_check(!faults_on_read(file + file_guards[0] * PS) &&
			   file[file_guards[0] * PS] == 'a' + file_guards[0], "removed file guard");
	}
	zdtm_pass("guards=%d file_guards=%d steps=%ld", nag, file_guarded ? nfg : 0, steps);
	return 0;
}
