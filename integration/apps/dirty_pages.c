/* Memory that changes a little at every step, as incremental checkpoints
 * meet it, checked page by page against what it must hold at the end:
 *   - a region of MiB megabytes, half a smooth field (compresses), half
 *     pseudo-random words (does not), where each step rewrites a few
 *     pages with the step's stamp;
 *   - a page dropped (MADV_DONTNEED) every step, which reads as zeros
 *     afterwards although no write touched it;
 *   - a window unmapped and mapped again at the same address every
 *     tenth step, with other bytes;
 *   - heap blocks freed and allocated again;
 *   - a private map of a file whose pages are written in turn, every
 *     other time with zeros (a zero page there is not the file's).
 * Arguments: steps pace MiB. */
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include "zdtm.h"

#define PAGE 4096
#define STAMPED_PER_STEP 5
#define WINDOW_PAGES 16
#define HEAP_BLOCKS 64
#define FILE_PAGES 1024		/* each written once: a zero page stays */
#define FILE_BYTE 0xab

static size_t npages;

static uint64_t page_word(size_t page, size_t i)
{
	uint64_t seed = page * 1000003 + i + 1;

	return zdtm_xorshift(&seed);
}

/* The region before any step: field in the first half, random after. */
static void fill_page(char *p, size_t page)
{
	if (page < npages / 2) {
		double *d = (double *)p;

		for (size_t i = 0; i < PAGE / sizeof(double); i++)
			d[i] = (double)((page * 512 + i) % 4096) / 4096.0;
	} else {
		for (size_t i = 0; i < PAGE / 8; i++)
			((uint64_t *)p)[i] = page_word(page, i);
	}
}

/* The pages step s rewrites, and the one it drops. */
static size_t stamped(long s, int k)
{
	return ((size_t)s * 7919 + (size_t)k * 104729) % npages;
}

static size_t dropped(long s)
{
	return ((size_t)s * 15485863 + 3) % npages;
}

static void stamp(char *p, long s, int k)
{
	for (size_t i = 0; i < PAGE / 8; i++)
		((uint64_t *)p)[i] = zdtm_mix((uint64_t)s, (uint64_t)k * 4096 + i);
}

static void fill_window(char *w, long generation)
{
	for (size_t i = 0; i < WINDOW_PAGES * PAGE / 8; i++)
		((uint64_t *)w)[i] = zdtm_mix((uint64_t)generation, i);
}

/* What page `page` of the region must hold after `steps` steps. */
static void expected(char *out, size_t page, long steps)
{
	fill_page(out, page);
	for (long s = 0; s < steps; s++) {
		if (dropped(s) == page)
			memset(out, 0, PAGE);
		for (int k = 0; k < STAMPED_PER_STEP; k++)
			if (stamped(s, k) == page)
				stamp(out, s, k);
	}
}

static char *map_file(void)
{
	char path[64], page[PAGE];
	char *map;
	int fd;

	snprintf(path, sizeof(path), "dirty_pages.%d.map", (int)getpid());
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	zdtm_check(fd >= 0, "open %s", path);
	memset(page, FILE_BYTE, PAGE);
	for (int i = 0; i < FILE_PAGES; i++)
		zdtm_check(write(fd, page, PAGE) == PAGE, "write %s", path);
	map = mmap(NULL, FILE_PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	zdtm_check(map != MAP_FAILED, "mmap %s", path);
	close(fd);
	return map;
}

/* Step s writes one page of the file's map: zeros or its own byte. */
static int file_byte(long s)
{
	return s % 2 ? (int)(s & 0x7f) | 1 : 0;
}

/* The step < steps that last wrote page p of the file's map, or -1. */
static long last_step(long steps, long p, long period)
{
	long last = steps - 1 - ((steps - 1 - p) % period + period) % period;

	return last >= 0 && last % period == p ? last : -1;
}

int main(int argc, char **argv)
{
	long steps = 200, pace = 10, mib = 32;
	char *mem, *window, *want, *heap[HEAP_BLOCKS], *fmap;
	uint64_t sum = 0;

	zdtm_args(argc, argv, &steps, &pace);
	if (argc > 3)
		mib = atol(argv[3]);
	npages = ((size_t)mib << 20) / PAGE;
	mem = mmap(NULL, npages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	window = mmap(NULL, WINDOW_PAGES * PAGE, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	zdtm_check(mem != MAP_FAILED && window != MAP_FAILED, "mmap %ld MiB", mib);
	for (size_t p = 0; p < npages; p++)
		fill_page(mem + p * PAGE, p);
	fill_window(window, 0);
	fmap = map_file();
	for (int b = 0; b < HEAP_BLOCKS; b++) {
		heap[b] = malloc(3000);
		zdtm_check(heap[b] != NULL, "malloc");
		memset(heap[b], b, 3000);
	}
	printf("READY\n");
	fflush(stdout);
	for (long s = 0; s < steps; s++) {
		int b = s % HEAP_BLOCKS;

		zdtm_check(madvise(mem + dropped(s) * PAGE, PAGE, MADV_DONTNEED) == 0, "madvise");
		for (int k = 0; k < STAMPED_PER_STEP; k++)
			stamp(mem + stamped(s, k) * PAGE, s, k);
		if (s % 10 == 9) {
			long generation = s / 10 + 1;
			char *again;

			zdtm_check(munmap(window, WINDOW_PAGES * PAGE) == 0, "munmap");
			again = mmap(window, WINDOW_PAGES * PAGE, PROT_READ | PROT_WRITE,
				     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
			zdtm_check(again == window, "mmap the window again");
			/* half of it written, half left as fresh zero pages */
			fill_window(window, generation);
			memset(window + WINDOW_PAGES / 2 * PAGE, 0, WINDOW_PAGES / 2 * PAGE);
		}
		memset(fmap + s % FILE_PAGES * PAGE, file_byte(s), PAGE);
		free(heap[b]);
		heap[b] = malloc(3000);
		zdtm_check(heap[b] != NULL, "malloc");
		memset(heap[b], (int)(s & 0x7f) + b, 3000);
		zdtm_pace(pace);
	}
	zdtm_hold();
	want = malloc(WINDOW_PAGES * PAGE);
	zdtm_check(want != NULL, "malloc");
	for (size_t p = 0; p < npages; p++) {
		expected(want, p, steps);
		zdtm_check(!memcmp(mem + p * PAGE, want, PAGE), "page %zu differs", p);
		for (size_t i = 0; i < PAGE / 8; i += 64)
			sum = zdtm_mix(sum, ((uint64_t *)(mem + p * PAGE))[i]);
	}
	fill_window(want, steps / 10);
	if (steps >= 10)
		memset(want + WINDOW_PAGES / 2 * PAGE, 0, WINDOW_PAGES / 2 * PAGE);
	zdtm_check(!memcmp(window, want, WINDOW_PAGES * PAGE), "the mapped-again window differs");
	for (long p = 0; p < FILE_PAGES; p++) {
		long last = last_step(steps, p, FILE_PAGES);

		memset(want, last < 0 ? FILE_BYTE : file_byte(last), PAGE);
		zdtm_check(!memcmp(fmap + p * PAGE, want, PAGE), "page %ld of the file's map differs",
			   p);
	}
	for (int b = 0; b < HEAP_BLOCKS; b++) {
		long last = last_step(steps, b, HEAP_BLOCKS);
		int value = last >= 0 ? (int)(last & 0x7f) + b : b;

		for (int i = 0; i < 3000; i++)
			zdtm_check(heap[b][i] == (char)value, "heap block %d holds %d, not %d", b,
				   heap[b][i], value);
		sum = zdtm_mix(sum, (uint64_t)value);
	}
	zdtm_pass("%016llx", (unsigned long long)sum);
	return 0;
}
