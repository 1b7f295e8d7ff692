/*
 * Issue 37, shape 5: private maps of a memfd and of an unlinked file,
 * each still open, and of an unlinked file that only a shared map keeps,
 * with pages the process wrote (copied on write), pages it only read and
 * pages it never touched; the memfd is mapped shared too.  At the end the written pages hold the process's bytes and are
 * its only anonymous memory there (smaps), the others are still the
 * file's: a write through the fd, or through the shared map, shows in
 * them; and the files hold what they held.
 *
 *   unlinked_private_maps [steps] [ms-per-step] [dir]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include "zdtm.h"

#define PAGES 8
#define PS 4096L

struct object {
	const char *what;
	int fd;
	unsigned char *priv;		/* MAP_PRIVATE of all of it */
	unsigned char *shared;		/* MAP_SHARED, or NULL */
};

static int written(long page)		/* through the private map */
{
	return page == 1 || page == 4;
}

static int only_read(long page)
{
	return page == 2 || page == 6;
}

static unsigned char file_byte(long page, long i, int version)
{
	return (unsigned char)(page * 17 + i * 3 + version * 101 + 5);
}

static unsigned char own_byte(long page, long i)
{
	return (unsigned char)(page * 29 + i + 200);
}

static void fill_file(int fd)
{
	unsigned char page[PS];

	for (long p = 0; p < PAGES; p++) {
		for (long i = 0; i < PS; i++)
			page[i] = file_byte(p, i, 0);
		zdtm_check(pwrite(fd, page, PS, p * PS) == PS, "pwrite: %m");
	}
}

static void map_object(struct object *o, int shared_too)
{
	volatile unsigned char sum = 0;

	fill_file(o->fd);
	o->priv = mmap(NULL, PAGES * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE, o->fd, 0);
	zdtm_check(o->priv != MAP_FAILED, "%s: mmap private: %m", o->what);
	if (shared_too) {
		o->shared = mmap(NULL, PAGES * PS, PROT_READ | PROT_WRITE, MAP_SHARED, o->fd, 0);
		zdtm_check(o->shared != MAP_FAILED, "%s: mmap shared: %m", o->what);
	}
	for (long p = 0; p < PAGES; p++) {
		if (written(p))
			for (long i = 0; i < PS; i++)
				o->priv[p * PS + i] = own_byte(p, i);
		else if (only_read(p))
			sum += o->priv[p * PS];
	}
	(void)sum;
}

static void check_page(const struct object *o, long p, int version, const char *when)
{
	for (long i = 0; i < PS; i++) {
		unsigned char want = written(p) ? own_byte(p, i) : file_byte(p, i, version);

		zdtm_check(o->priv[p * PS + i] == want, "%s: page %ld (%s) byte %ld is %u, expected "
			   "%u %s", o->what, p, written(p) ? "written" : only_read(p) ? "read" :
			   "untouched", i, o->priv[p * PS + i], want, when);
	}
}

/* What the file holds: version 0, but the pages changed (a bit each). */
static void check_file(const struct object *o, unsigned changed)
{
	unsigned char page[PS];

	for (long p = 0; p < PAGES; p++) {
		int version = changed >> p & 1;

		if (o->fd >= 0)
			zdtm_check(pread(o->fd, page, PS, p * PS) == PS, "%s: pread: %m", o->what);
		else
			memcpy(page, o->shared + p * PS, PS);
		for (long i = 0; i < PS; i++)
			zdtm_check(page[i] == file_byte(p, i, version), "%s: the file's page %ld "
				   "byte %ld is %u, expected %u", o->what, p, i, page[i],
				   file_byte(p, i, version));
	}
}

static void write_page(const struct object *o, long p, int through_map)
{
	unsigned char page[PS];

	for (long i = 0; i < PS; i++)
		page[i] = file_byte(p, i, 1);
	if (through_map || o->fd < 0)
		memcpy(o->shared + p * PS, page, PS);
	else
		zdtm_check(pwrite(o->fd, page, PS, p * PS) == PS, "%s: pwrite: %m", o->what);
}

static uint64_t check_object(const struct object *o, uint64_t hash)
{
	long anon = zdtm_anonymous_bytes(o->priv);

	zdtm_check(anon == 2 * PS, "%s: %ld bytes of the private map are the process's own "
		   "(smaps Anonymous), expected the 2 pages it wrote", o->what, anon);
	for (long p = 0; p < PAGES; p++)
		check_page(o, p, 0, "before the file changed");
	check_file(o, 0);
	/* the file changes under a read page, an untouched one and a written one */
	write_page(o, 2, 0);
	write_page(o, 0, o->shared != NULL);
	write_page(o, 1, 0);
	for (long p = 0; p < PAGES; p++)
		check_page(o, p, p == 0 || p == 2 || p == 1, "after the file changed");
	check_file(o, 1 << 0 | 1 << 1 | 1 << 2);
	zdtm_check(zdtm_anonymous_bytes(o->priv) == 2 * PS, "%s: more anonymous pages", o->what);
	for (long p = 0; p < PAGES; p++)
		hash = zdtm_mix(hash, o->priv[p * PS + 7]);
	return hash;
}

int main(int argc, char **argv)
{
	long steps = 100, pace = 10;
	const char *dir = argc > 3 ? argv[3] : ".";
	char path[4096];
	uint64_t hash = 0;
	struct object memfd = { "memfd", -1, NULL, NULL }, unlinked = { "unlinked file", -1, NULL, NULL };
	struct object no_fd = { "unlinked file mapped shared, not open", -1, NULL, NULL };

	zdtm_args(argc, argv, &steps, &pace);
	memfd.fd = memfd_create("shape5", MFD_CLOEXEC);
	zdtm_check(memfd.fd >= 0, "memfd_create: %m");
	map_object(&memfd, 1);
	snprintf(path, sizeof(path), "%s/unlinked_private_maps.%d", dir, getpid());
	unlinked.fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	zdtm_check(unlinked.fd >= 0, "open %s: %m", path);
	zdtm_check(unlink(path) == 0, "unlink: %m");
	map_object(&unlinked, 0);
	snprintf(path, sizeof(path), "%s/unlinked_private_maps.%d.shared", dir, getpid());
	no_fd.fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	zdtm_check(no_fd.fd >= 0, "open %s: %m", path);
	zdtm_check(unlink(path) == 0, "unlink: %m");
	map_object(&no_fd, 1);
	close(no_fd.fd);	/* its shared map keeps it */
	no_fd.fd = -1;
	printf("READY\n");
	fflush(stdout);
	hash = zdtm_steps_hash(hash, steps, pace);
	zdtm_hold();
	hash = check_object(&memfd, hash);
	hash = check_object(&unlinked, hash);
	hash = check_object(&no_fd, hash);
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
