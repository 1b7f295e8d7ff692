/*
 * Issue 37, shape 5 without an fd: private maps of an unlinked file or a
 * memfd whose fd the process closed.  A page the process wrote through
 * the map (copied on write) is its own; every other page is still the
 * file's, and must stay so after a restart: a later write to the file
 * (through a shared map, or through another process's fd) shows in it.
 *
 *  - a memfd mapped privately whole and shared over its first half only,
 *    its fd closed; one page written through the private map;
 *  - an unlinked file mapped privately, its fd closed here but kept by a
 *    forked child (which wrote a page of its own copy of the map);
 *  - a memfd only mapped privately, twice (two ranges), nothing else.
 *
 * At the end each private map holds as many anonymous pages (smaps) as
 * the process wrote, each page reads as it should, and writes to the
 * file after the checkpoint show in the pages that are the file's.
 *
 *   unlinked_maps_no_fd [steps] [ms-per-step] [dir]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include "zdtm.h"

#define PAGES 8
#define PS 4096L

static int to_child[2], from_child[2];

static unsigned char file_byte(int object, long page, long i, int version)
{
	return (unsigned char)(object * 61 + page * 17 + i * 3 + version * 101 + 5);
}

static unsigned char own_byte(int object, long page, long i)
{
	return (unsigned char)(object * 37 + page * 29 + i + 200);
}

static void fill_file(int fd, int object)
{
	unsigned char page[PS];

	for (long p = 0; p < PAGES; p++) {
		for (long i = 0; i < PS; i++)
			page[i] = file_byte(object, p, i, 0);
		zdtm_check(pwrite(fd, page, PS, p * PS) == PS, "pwrite: %m");
	}
}

static void write_own(unsigned char *map, int object, long page)
{
	for (long i = 0; i < PS; i++)
		map[page * PS + i] = own_byte(object, page, i);
}

static void touch(const unsigned char *map, long page)
{
	volatile unsigned char sum = map[page * PS + 11];

	(void)sum;
}

/* Page p of a private map: the process's own bytes if own, else the
 * file's of that version. */
static void check_page(const char *what, const unsigned char *map, int object, long p, int own,
		       int version)
{
	for (long i = 0; i < PS; i++) {
		unsigned char want = own ? own_byte(object, p, i) : file_byte(object, p, i, version);

		zdtm_check(map[p * PS + i] == want, "%s: page %ld (%s) byte %ld is %u, expected %u",
			   what, p, own ? "written" : "the file's", i, map[p * PS + i], want);
	}
}

static void new_version(unsigned char *shared, int object, long p)
{
	for (long i = 0; i < PS; i++)
		shared[p * PS + i] = file_byte(object, p, i, 1);
}

/* The memfd mapped shared over its first half: pages 0-3.  Page 1 was
 * written through the private map; the file's page under it, which the
 * shared map shows, comes back when the process drops its copy. */
static void check_half_shared(unsigned char *priv, unsigned char *shared)
{
	const char *what = "memfd mapped shared over half";

	zdtm_check(zdtm_anonymous_bytes(priv) == PS, "%s: %ld bytes of the private map are the "
		   "process's own (smaps Anonymous), expected the page it wrote", what,
		   zdtm_anonymous_bytes(priv));
	for (long p = 0; p < PAGES; p++)
		check_page(what, priv, 1, p, p == 1, 0);
	new_version(shared, 1, 0);
	new_version(shared, 1, 1);
	new_version(shared, 1, 2);
	for (long p = 0; p < PAGES; p++)
		check_page(what, priv, 1, p, p == 1, p == 0 || p == 2);
	zdtm_check(madvise(priv + PS, PS, MADV_DONTNEED) == 0, "madvise: %m");
	check_page("memfd mapped shared over half, its written page dropped", priv, 1, 1, 0, 1);
	zdtm_check(zdtm_anonymous_bytes(priv) == 0, "%s: anonymous pages left", what);
}

/* The child keeps the unlinked file's fd; page 5 of its copy of the map
 * is its own.  On 'w' it writes pages 0, 3 and 5 of the file through the
 * fd and checks its map; it answers 'k' or why not. */
static void child(int fd, unsigned char *priv)
{
	static const long changed[] = { 0, 3, 5 };
	unsigned char page[PS], cmd, answer = 'k';

	close(to_child[1]);
	close(from_child[0]);
	write_own(priv, 2, 5);
	while (read(to_child[0], &cmd, 1) == 1 && cmd == 'w') {
		for (unsigned k = 0; k < 3; k++) {
			for (long i = 0; i < PS; i++)
				page[i] = file_byte(2, changed[k], i, 1);
			if (pwrite(fd, page, PS, changed[k] * PS) != PS)
				answer = 'p';
		}
		for (long p = 0; p < PAGES && answer == 'k'; p++)
			for (long i = 0; i < PS; i++)
				if (priv[p * PS + i] != (p == 5 ? own_byte(2, p, i) :
							 file_byte(2, p, i, p == 0 || p == 3)))
					answer = '0' + p;
		if (answer == 'k' && zdtm_anonymous_bytes(priv) != PS)
			answer = 'a';
		if (write(from_child[1], &answer, 1) != 1)
			_exit(2);
	}
	_exit(0);
}

/* The unlinked file: the parent closed its fd, the child writes to it. */
static void check_child_writes(unsigned char *priv, pid_t pid)
{
	const char *what = "unlinked file kept open by a child";
	unsigned char cmd = 'w', answer = 0;
	int status;

	zdtm_check(zdtm_anonymous_bytes(priv) == 0, "%s: %ld bytes of the private map are the "
		   "process's own (smaps Anonymous); it wrote none", what, zdtm_anonymous_bytes(priv));
	for (long p = 0; p < PAGES; p++)
		check_page(what, priv, 2, p, 0, 0);
	zdtm_check(write(to_child[1], &cmd, 1) == 1 && read(from_child[0], &answer, 1) == 1,
		   "%s: the child does not answer", what);
	zdtm_check(answer == 'k', "%s: the child's map after its writes: %c", what, answer);
	for (long p = 0; p < PAGES; p++)
		check_page(what, priv, 2, p, 0, p == 0 || p == 3 || p == 5);
	close(to_child[1]);
	zdtm_check(waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
		   WEXITSTATUS(status) == 0, "%s: the child ended badly", what);
}

/* A memfd only mapped privately, twice, nothing else holding it: its
 * pages are the file's, none the process's own. */
static void check_private_only(const unsigned char *whole, const unsigned char *tail)
{
	const char *what = "memfd only mapped privately";

	zdtm_check(zdtm_anonymous_bytes(whole) == 0 && zdtm_anonymous_bytes(tail) == 0,
		   "%s: %ld and %ld bytes of its maps are the process's own (smaps Anonymous); "
		   "it wrote none", what, zdtm_anonymous_bytes(whole), zdtm_anonymous_bytes(tail));
	for (long p = 0; p < PAGES; p++)
		check_page(what, whole, 3, p, 0, 0);
	for (long p = 0; p < PAGES / 2; p++)
		check_page(what, tail - PAGES / 2 * PS, 3, p + PAGES / 2, 0, 0);
}

static unsigned char *map_private(int fd, long pages, long first)
{
	unsigned char *p = mmap(NULL, pages * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd,
				first * PS);

	zdtm_check(p != MAP_FAILED, "mmap private: %m");
	return p;
}

int main(int argc, char **argv)
{
	long steps = 100, pace = 10;
	const char *dir = argc > 3 ? argv[3] : ".";
	unsigned char *half_priv, *half_shared, *kept_priv, *only_whole, *only_tail;
	char path[4096];
	uint64_t hash = 0;
	pid_t pid;
	int fd;

	zdtm_args(argc, argv, &steps, &pace);
	zdtm_check(pipe(to_child) == 0 && pipe(from_child) == 0, "pipes: %m");

	/* the unlinked file, kept open by the child only */
	snprintf(path, sizeof(path), "%s/unlinked_maps_no_fd.%d", dir, getpid());
	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	zdtm_check(fd >= 0 && unlink(path) == 0, "open %s: %m", path);
	fill_file(fd, 2);
	kept_priv = map_private(fd, PAGES, 0);
	touch(kept_priv, 1);
	touch(kept_priv, 3);
	pid = fork();
	zdtm_check(pid >= 0, "fork: %m");
	if (pid == 0)
		child(fd, kept_priv);
	close(fd);
	close(to_child[0]);
	close(from_child[1]);

	/* a memfd mapped shared over half of it */
	fd = memfd_create("no-fd-half-shared", MFD_CLOEXEC);
	zdtm_check(fd >= 0, "memfd_create: %m");
	fill_file(fd, 1);
	half_priv = map_private(fd, PAGES, 0);
	half_shared = mmap(NULL, PAGES / 2 * PS, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	zdtm_check(half_shared != MAP_FAILED, "mmap shared: %m");
	close(fd);
	write_own(half_priv, 1, 1);
	touch(half_priv, 2);
	touch(half_priv, 6);

	/* a memfd nothing but private maps hold */
	fd = memfd_create("no-fd-private-only", MFD_CLOEXEC);
	zdtm_check(fd >= 0, "memfd_create: %m");
	fill_file(fd, 3);
	only_whole = map_private(fd, PAGES, 0);
	only_tail = map_private(fd, PAGES / 2, PAGES / 2);
	close(fd);
	touch(only_whole, 0);
	touch(only_whole, 5);
	touch(only_tail, 1);

	printf("READY\n");
	fflush(stdout);
	hash = zdtm_steps_hash(hash, steps, pace);
	zdtm_hold();
	check_private_only(only_whole, only_tail);
	check_half_shared(half_priv, half_shared);
	check_child_writes(kept_priv, pid);
	for (long p = 0; p < PAGES; p++)
		hash = zdtm_mix(hash, half_priv[p * PS + 7] ^ kept_priv[p * PS + 9] ^
				      only_whole[p * PS + 3]);
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
