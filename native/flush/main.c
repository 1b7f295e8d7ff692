/*
 * ckpt-flush: copies one process's staged image from node-local storage
 * (--stage-dir) into its checkpoint's directory on the shared filesystem,
 * checks the copy's source against the image's checksum, fsyncs it, and
 * reports as a forked writer does (writer.c): "DONE <keys>" on fd 3, the
 * same keys in <image>.done beside the copy (fd 4: <image>.done.tmp,
 * locked by the shim before it started us; the lock goes when we exit).
 *
 *   ckpt-flush STAGE_DIR DEST_DIR KEYS IMAGE [OTHER_FILE...]
 *
 * KEYS are the writer's DONE keys (file=, size=, xxh3=, ...).  The shim
 * execs us in place of its forked writer, so that the copy-on-write
 * snapshot of the application is let go as soon as the fast local write
 * is done.  On success the older staged copies of the same files are
 * removed: a node keeps the newest staged copy of each image.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "ckpt_image.h"
#include "ckpt_io.h"
#define XXH_INLINE_ALL
#include <xxhash.h>
#include "fast_hash.h"

#define REPORT_FD 3
#define RESULT_FD 4
#define MAX_BLOCKS (1 << 20)	/* 64 TiB of image */

static char failure[1024];

static int fail(int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(failure, sizeof(failure), fmt, ap);
	va_end(ap);
	return err;
}

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/*
 * Copy block by block (the image checksum's blocks), hashing each as it
 * goes out: the bytes copied are the bytes the writer checksummed.
 * *xxh3 gets the image checksum of what was copied.
 */
static int copy_blocks(int in, int out, uint64_t size, uint64_t *xxh3)
{
	uint64_t nblocks = (size + CKPT_CHECKSUM_BLOCK - 1) / CKPT_CHECKSUM_BLOCK;
	uint64_t *digests;
	const char *src;
	int err = 0;

	if (nblocks > MAX_BLOCKS)
		return EFBIG;
	if (!size) {
		*xxh3 = XXH3_64bits(NULL, 0);
		return 0;
	}
	src = mmap(NULL, size, PROT_READ, MAP_PRIVATE, in, 0);
	if (src == MAP_FAILED)
		return errno;
	digests = malloc(nblocks * sizeof(*digests));
	if (!digests) {
		munmap((void *)src, size);
		return ENOMEM;
	}
	for (uint64_t i = 0; i < nblocks && !err; i++) {
		uint64_t off = i * CKPT_CHECKSUM_BLOCK;
		size_t len = size - off < CKPT_CHECKSUM_BLOCK ? size - off : CKPT_CHECKSUM_BLOCK;

		digests[i] = fast_xxh3_64(src + off, len);
		err = ckpt_write_all(out, src + off, len);
		/* the disk starts on each block while the next is read */
		if (!err)
			sync_file_range(out, off, len, SYNC_FILE_RANGE_WRITE);
	}
	*xxh3 = XXH3_64bits(digests, nblocks * sizeof(*digests));	/* x86: little-endian */
	free(digests);
	munmap((void *)src, size);
	return err;
}

/* STAGE/name -> DEST/name, fsynced; want_xxh3: checked if nonzero. */
static int copy_file(int stage, int dest, const char *stage_dir, const char *dest_dir,
		     const char *name, uint64_t want_xxh3)
{
	struct stat st;
	uint64_t got = 0;
	int in, out, err;

	in = openat(stage, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (in < 0 || fstat(in, &st)) {
		err = errno;
		if (in >= 0)
			close(in);
		return fail(err, "reading %s/%s: %s", stage_dir, name, strerror(err));
	}
	out = openat(dest, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (out < 0) {
		err = errno;
		close(in);
		return fail(err, "creating %s/%s: %s", dest_dir, name, strerror(err));
	}
	err = copy_blocks(in, out, st.st_size, &got);
	if (!err && fsync(out))
		err = errno;
	if (close(out) && !err)
		err = errno;
	close(in);
	if (err) {
		unlinkat(dest, name, 0);	/* the space goes back at once */
		return fail(err, "copying %s/%s to %s: %s", stage_dir, name, dest_dir,
			    strerror(err));
	}
	if (want_xxh3 && got != want_xxh3) {
		unlinkat(dest, name, 0);
		return fail(EIO, "%s/%s changed after it was written (checksum mismatch)",
			    stage_dir, name);
	}
	return 0;
}

/* The value of key in "a=1 b=2", or NULL. */
static const char *key_value(const char *keys, const char *key)
{
	size_t n = strlen(key);

	for (const char *p = keys; (p = strstr(p, key)); p += n)
		if ((p == keys || p[-1] == ' ') && p[n] == '=')
			return p + n + 1;
	return NULL;
}

/*
 * Older staged copies of name, in the other directories beside STAGE_DIR:
 * a staged checkpoint's parent is its job's stage directory, which holds
 * nothing but that job's staged checkpoints (ckpt/paths.py staged_dir).
 * Only the newest copy stays.
 */
static void drop_older_copies(const char *stage_dir, const char *name)
{
	char parent[PATH_MAX], path[PATH_MAX * 2 + 2];
	const char *slash = strrchr(stage_dir, '/');
	const char *own = slash ? slash + 1 : stage_dir;
	struct dirent *e;
	DIR *d;

	snprintf(parent, sizeof(parent), "%.*s", slash ? (int)(slash - stage_dir) : 1,
		 slash ? stage_dir : ".");
	d = opendir(parent);
	if (!d)
		return;
	while ((e = readdir(d))) {
		if ((e->d_type != DT_DIR && e->d_type != DT_UNKNOWN) || e->d_name[0] == '.' ||
		    !strcmp(e->d_name, own))
			continue;
		snprintf(path, sizeof(path), "%s/%s/%s", parent, e->d_name, name);
		unlink(path);
		snprintf(path, sizeof(path), "%s/%s", parent, e->d_name);
		rmdir(path);	/* once its last image is gone */
	}
	closedir(d);
}

static void report(const char *line)
{
	if (ckpt_write_all(REPORT_FD, line, strlen(line)))
		exit(1);
}

/* <image>.done.tmp (fd 4) gets the keys and becomes <image>.done. */
static void leave_result(int dest, const char *image, const char *keys)
{
	char tmp[NAME_MAX + 16], done[NAME_MAX + 16];

	snprintf(tmp, sizeof(tmp), "%s.done.tmp", image);
	snprintf(done, sizeof(done), "%s.done", image);
	if (ckpt_write_all(RESULT_FD, keys, strlen(keys)) || renameat(dest, tmp, dest, done))
		unlinkat(dest, tmp, 0);
}

int main(int argc, char **argv)
{
	const char *stage_dir, *dest_dir, *keys, *sum;
	char line[2048], done[2000];
	int64_t t0 = now_ns();
	int stage, dest, err = 0;

	if (argc < 5) {
		fprintf(stderr, "usage: ckpt-flush STAGE_DIR DEST_DIR KEYS IMAGE [FILE...]\n"
				"(started by the checkpoint shim, not by hand)\n");
		return 2;
	}
	stage_dir = argv[1];
	dest_dir = argv[2];
	keys = argv[3];
	sum = key_value(keys, "xxh3");
	stage = open(stage_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	dest = open(dest_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (stage < 0 || dest < 0)
		err = fail(errno, "cannot open %s: %s", stage < 0 ? stage_dir : dest_dir,
			   strerror(errno));
	for (int i = 4; i < argc && !err; i++)
		err = copy_file(stage, dest, stage_dir, dest_dir, argv[i],
				i == 4 && sum ? strtoull(sum, NULL, 16) : 0);
	if (err) {
		for (int i = 4; i < argc; i++)	/* a partial checkpoint holds nothing */
			unlinkat(dest, argv[i], 0);
		snprintf(line, sizeof(line), "FAIL %d %s\n", err, failure);
		report(line);
		return 1;
	}
	snprintf(done, sizeof(done), "%s flush_ns=%lld", keys, (long long)(now_ns() - t0));
	leave_result(dest, argv[4], done);
	snprintf(line, sizeof(line), "DONE %s\n", done);
	report(line);
	for (int i = 4; i < argc; i++)
		drop_older_copies(stage_dir, argv[i]);
	return 0;
}
