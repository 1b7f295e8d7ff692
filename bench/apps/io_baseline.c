/* Baselines on the same filesystem, same bytes:
 *   io_baseline write FILE MIB   sequential write of incompressible data + fsync
 *   io_baseline read FILE        read the file into fresh anonymous memory
 *   io_baseline copy FILE        the file's bytes, already in memory, copied by
 *                                one memcpy into fresh anonymous memory (page
 *                                faults included, as a restore has them),
 *                                then again into the same, now touched, memory
 * Prints the seconds taken (the data generation is not timed). */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (64UL << 20)

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int do_write(const char *path, size_t mib)
{
	size_t len = mib << 20;
	uint64_t x = 88172645463325252ULL, *mem = mmap(NULL, len, PROT_READ | PROT_WRITE,
						       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int fd;
	double t;

	for (size_t i = 0; i < len / 8; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		mem[i] = x;
	}
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0)
		return 1;
	t = now();
	for (size_t off = 0; off < len; off += CHUNK)
		if (write(fd, (char *)mem + off, len - off < CHUNK ? len - off : CHUNK) < 0)
			return 1;
	fsync(fd);
	close(fd);
	printf("%.6f\n", now() - t);
	return 0;
}

static int do_read(const char *path)
{
	int fd = open(path, O_RDONLY);
	struct stat st;
	char *mem;
	double t;
	ssize_t n;
	size_t off = 0;

	if (fd < 0 || fstat(fd, &st))
		return 1;
	t = now();
	mem = mmap(NULL, st.st_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	while ((n = read(fd, mem + off, CHUNK)) > 0)
		off += n;
	printf("%.6f\n", now() - t);
	return 0;
}

/* Prints "fresh touched": the seconds of each copy. */
static int do_copy(const char *path)
{
	int fd = open(path, O_RDONLY);
	struct stat st;
	char *src, *dst;
	double t, fresh;
	size_t off = 0;
	ssize_t n;

	if (fd < 0 || fstat(fd, &st))
		return 1;
	src = mmap(NULL, st.st_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	dst = mmap(NULL, st.st_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (src == MAP_FAILED || dst == MAP_FAILED)
		return 1;
	while ((n = read(fd, src + off, CHUNK)) > 0)
		off += n;
	t = now();
	memcpy(dst, src, off);
	fresh = now() - t;
	t = now();
	memcpy(dst, src, off);
	printf("%.6f %.6f\n", fresh, now() - t);
	return dst[off / 2] != src[off / 2];
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "copy"))
		return do_copy(argv[2]);
	if (argc == 4 && !strcmp(argv[1], "write"))
		return do_write(argv[2], atol(argv[3]));
	if (argc == 3 && !strcmp(argv[1], "read"))
		return do_read(argv[2]);
	fprintf(stderr, "usage: io_baseline write FILE MIB | read FILE | copy FILE\n");
	return 2;
}
