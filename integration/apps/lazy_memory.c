/* Memory a lazy restart (--lazy) brings in on demand, checked page by
 * page after the hold: a region of MiB filled with a pattern (every
 * fourth page left zero), cut into one slice per thread, each thread
 * checking its own at once; into the middle of each slice a read() from a
 * pipe lands before any touch (a kernel-side fault on a lazy page), and a
 * write() from a later untouched page goes out through the pipe.  With
 * children > 0 the process forks that many children first, each with a
 * region of its own (sharing nothing), checked the same way.  With
 * "churn", an 8 MiB region more, after the hold and before any touch of it:
 * a child forked reads all of it, 1 MiB is dropped (MADV_DONTNEED: zeros),
 * 4 MiB moved elsewhere (mremap), each part checked where it is.
 * Arguments: steps pace MiB threads children [churn]. */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include "zdtm.h"

#define PAGE 4096UL

struct slice {
	uint64_t *base;
	size_t pages, first;		/* first: its first page's index in the region */
	uint64_t sum;
	int pipe_fd[2];
};

static uint64_t word_of(size_t page, size_t i)
{
	return zdtm_mix(page * 4099 + 7, i);
}

static void fill(uint64_t *base, size_t pages)
{
	for (size_t p = 0; p < pages; p++)
		for (size_t i = 0; p % 4 != 3 && i < PAGE / 8; i++)
			base[p * PAGE / 8 + i] = word_of(p, i);
}

static void check_page(const uint64_t *w, size_t page)
{
	for (size_t i = 0; i < PAGE / 8; i++)
		zdtm_check(w[i] == (page % 4 == 3 ? 0 : word_of(page, i)),
			   "page %zu word %zu is %016llx", page, i, (unsigned long long)w[i]);
}

/* read() into an untouched page, write() out of another: the kernel
 * touches them first. */
static void syscalls_touch(struct slice *s)
{
	size_t mid = s->pages / 2, out = s->pages - 1;
	uint64_t want[PAGE / 8], got[PAGE / 8];
	char *dst = (char *)(s->base + mid * PAGE / 8);

	if (s->pages < 2)
		return;
	zdtm_check(pipe(s->pipe_fd) == 0, "pipe");
	for (size_t i = 0; i < PAGE / 8; i++)
		want[i] = (s->first + mid) % 4 == 3 ? 0 : word_of(s->first + mid, i);
	zdtm_check(write(s->pipe_fd[1], want, PAGE) == (ssize_t)PAGE, "write to the pipe");
	zdtm_check(read(s->pipe_fd[0], dst, PAGE) == (ssize_t)PAGE, "read into a lazy page");
	zdtm_check(write(s->pipe_fd[1], s->base + out * PAGE / 8, PAGE) == (ssize_t)PAGE,
		   "write from a lazy page");
	zdtm_check(read(s->pipe_fd[0], got, PAGE) == (ssize_t)PAGE, "read back");
	check_page(got, s->first + out);
	close(s->pipe_fd[0]);
	close(s->pipe_fd[1]);
}

static void *check_slice(void *arg)
{
	struct slice *s = arg;

	syscalls_touch(s);
	for (size_t p = 0; p < s->pages; p++) {
		const uint64_t *w = s->base + p * PAGE / 8;

		check_page(w, s->first + p);
		for (size_t i = 0; i < PAGE / 8; i += 64)
			s->sum = zdtm_mix(s->sum, w[i]);
	}
	return NULL;
}

/* One process's part: its region, its threads, its result. */
static uint64_t run(long steps, long pace, size_t mib, long nthreads)
{
	size_t pages = mib * (1 << 20) / PAGE;
	uint64_t *base = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE,
			      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct slice slices[64];
	pthread_t tids[64];
	uint64_t sum = 0;

	zdtm_check(base != MAP_FAILED, "mmap %zu MiB", mib);
	fill(base, pages);
	zdtm_steps_hash(pages, steps, pace);	/* checkpoints come meanwhile */
	zdtm_hold();
	for (long t = 0; t < nthreads; t++) {
		slices[t] = (struct slice){ .base = base + t * (pages / nthreads) * PAGE / 8,
					    .pages = pages / nthreads,
					    .first = t * (pages / nthreads) };
		zdtm_check(pthread_create(&tids[t], NULL, check_slice, &slices[t]) == 0,
			   "pthread_create");
	}
	for (long t = 0; t < nthreads; t++) {
		pthread_join(tids[t], NULL);
		sum = zdtm_mix(sum, slices[t].sum);
	}
	return sum;
}

#define CHURN_PAGES 2048UL		/* 8 MiB */
#define CHURN_FIRST 1000000UL		/* its pages' pattern indices */

static uint64_t *churn_region(void)
{
	uint64_t *b = mmap(NULL, CHURN_PAGES * PAGE, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	zdtm_check(b != MAP_FAILED, "mmap the churn region");
	for (size_t p = 0; p < CHURN_PAGES; p++)
		for (size_t i = 0; i < PAGE / 8; i++)
			b[p * PAGE / 8 + i] = word_of(CHURN_FIRST + p, i);
	return b;
}

static void check_churn_page(const uint64_t *w, size_t page)
{
	for (size_t i = 0; i < PAGE / 8; i++)
		zdtm_check(w[i] == word_of(CHURN_FIRST + page, i), "churn page %zu word %zu", page, i);
}

static void churn(uint64_t *b)
{
	size_t drop = 256, move = 1024;	/* pages: [0, drop) dropped, [drop, drop + move) moved */
	char *to = mmap(NULL, move * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	pid_t child = fork();
	int status;
	uint64_t *moved;

	zdtm_check(child >= 0 && to != MAP_FAILED, "fork, mmap");
	if (child == 0) {
		for (size_t p = 0; p < CHURN_PAGES; p++)
			check_churn_page(b + p * PAGE / 8, p);
		_exit(0);
	}
	zdtm_check(madvise(b, drop * PAGE, MADV_DONTNEED) == 0, "madvise");
	moved = mremap(b + drop * PAGE / 8, move * PAGE, move * PAGE, MREMAP_MAYMOVE | MREMAP_FIXED,
		       to);
	zdtm_check(moved == (uint64_t *)to, "mremap");
	for (size_t i = 0; i < drop * PAGE / 8; i++)
		zdtm_check(b[i] == 0, "a dropped page reads %016llx", (unsigned long long)b[i]);
	for (size_t p = 0; p < move; p++)
		check_churn_page(moved + p * PAGE / 8, drop + p);
	for (size_t p = drop + move; p < CHURN_PAGES; p++)
		check_churn_page(b + p * PAGE / 8, p);
	zdtm_check(waitpid(child, &status, 0) == child && WIFEXITED(status) &&
		   WEXITSTATUS(status) == 0, "the forked child's check");
}

int main(int argc, char **argv)
{
	long steps = 200, pace = 10, mib = 64, nthreads = 4, children = 0;
	pid_t kids[16];
	uint64_t sum;

	zdtm_args(argc, argv, &steps, &pace);
	if (argc > 3)
		mib = atol(argv[3]);
	if (argc > 4)
		nthreads = atol(argv[4]);
	if (argc > 5)
		children = atol(argv[5]);
	zdtm_check(nthreads >= 1 && nthreads <= 64 && children >= 0 && children <= 16, "arguments");
	uint64_t *churned = argc > 6 && !strcmp(argv[6], "churn") ? churn_region() : NULL;
	for (long k = 0; k < children; k++) {
		kids[k] = fork();
		zdtm_check(kids[k] >= 0, "fork");
		if (kids[k] == 0) {
			setvbuf(stdout, NULL, _IONBF, 0);
			run(steps, pace, mib, nthreads);	/* a FAIL line and exit 1 if wrong */
			_exit(0);
		}
	}
	printf("READY\n");
	fflush(stdout);
	sum = run(steps, pace, mib, nthreads);
	if (churned)
		churn(churned);
	for (long k = 0; k < children; k++) {
		int status;

		zdtm_check(waitpid(kids[k], &status, 0) == kids[k] && WIFEXITED(status) &&
			   WEXITSTATUS(status) == 0, "child %ld failed its check", k);
	}
	zdtm_pass("%016llx", (unsigned long long)sum);
	return 0;
}
