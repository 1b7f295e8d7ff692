/* Memory and files the process did not touch itself: a MAP_SHARED
 * anonymous region, a memfd written with pwrite and mapped shared, a
 * private map of a file unlinked afterwards and only partly read, and two
 * fds sharing one open file (dup) with one offset.  And shared memory that
 * changes at every step, in step with the stack: an image must hold it as
 * it was when the process stopped, not as a writer finds it later. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include "zdtm.h"

#define MIB (1 << 20)
#define PAGES 4
#define STAMPED (32 * MIB)

/* Every page of the stamped region holds the last step, checked first. */
static void stamp(char *region, long step)
{
	for (size_t off = 0; off < STAMPED; off += 4096) {
		long *slot = (long *)(region + off);

		zdtm_check(*slot == step - 1, "shared page %zu holds step %ld at step %ld", off / 4096,
			   *slot, step);
		*slot = step;
	}
}

static void fill(char *p, size_t len, uint64_t seed)
{
	for (size_t i = 0; i < len; i += 8) {
		uint64_t v = zdtm_xorshift(&seed);

		memcpy(p + i, &v, 8);
	}
}

static int same(const char *p, size_t len, uint64_t seed)
{
	char *want = malloc(len);
	int ok;

	fill(want, len, seed);
	ok = !memcmp(p, want, len);
	free(want);
	return ok;
}

int main(int argc, char **argv)
{
	long steps = 200, pace = 10;
	char *shared, *memfd_map, *deleted_map, *stamped, buf[PAGES * 4096];
	int memfd, f, log, log2;
	uint64_t hash = 0;

	zdtm_args(argc, argv, &steps, &pace);
	if (argc > 3)
		zdtm_check(chdir(argv[3]) == 0, "chdir");
	shared = mmap(NULL, 8 * MIB, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	fill(shared, 4 * MIB, 1);		/* half touched, half never */
	stamped = mmap(NULL, STAMPED, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	zdtm_check(stamped != MAP_FAILED, "mmap stamped");
	for (size_t off = 0; off < STAMPED; off += 4096)
		*(long *)(stamped + off) = -1;

	memfd = memfd_create("ckpt-test", 0);
	fill(buf, sizeof(buf), 2);
	zdtm_check(memfd >= 0 && ftruncate(memfd, 4 * MIB) == 0, "memfd");
	for (int i = 0; i < 4 * MIB; i += sizeof(buf))
		zdtm_check(pwrite(memfd, buf, sizeof(buf), i) == sizeof(buf), "pwrite memfd");
	memfd_map = mmap(NULL, 4 * MIB, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);

	f = open("mapped.tmp", O_RDWR | O_CREAT | O_TRUNC, 0600);
	fill(buf, sizeof(buf), 3);
	zdtm_check(write(f, buf, sizeof(buf)) == sizeof(buf), "write mapped file");
	deleted_map = mmap(NULL, sizeof(buf), PROT_READ, MAP_PRIVATE, f, 0);
	close(f);
	unlink("mapped.tmp");
	hash = zdtm_mix(hash, deleted_map[0]);	/* only the first page is read */

	log = open("dup.log", O_WRONLY | O_CREAT | O_TRUNC, 0600);
	log2 = dup(log);
	zdtm_check(shared != MAP_FAILED && memfd_map != MAP_FAILED && deleted_map != MAP_FAILED &&
		   log >= 0 && log2 >= 0, "setup");
	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		char rec[32];

		snprintf(rec, sizeof(rec), "%015ld\n", step);
		zdtm_check(write(step % 2 ? log2 : log, rec, 16) == 16, "write log");
		shared[4 * MIB + step] = (char)step;	/* the untouched half, a bit */
		stamp(stamped, step);
		zdtm_pace(pace);
	}
	zdtm_hold();
	zdtm_check(lseek(log, 0, SEEK_CUR) == steps * 16 && lseek(log2, 0, SEEK_CUR) == steps * 16,
		   "dup'd fds do not share one offset any more");
	zdtm_check(same(shared, 4 * MIB, 1), "shared anonymous memory differs");
	for (long step = 0; step < steps; step++)
		zdtm_check(shared[4 * MIB + step] == (char)step, "shared byte %ld", step);
	for (int i = 0; i < 4 * MIB; i += sizeof(buf))
		zdtm_check(same(memfd_map + i, sizeof(buf), 2), "memfd mapping differs at %d", i);
	zdtm_check(same(deleted_map, sizeof(buf), 3), "map of the unlinked file differs");
	{
		char link[64], name[64];
		ssize_t n;

		snprintf(link, sizeof(link), "/proc/self/fd/%d", memfd);
		n = readlink(link, name, sizeof(name) - 1);
		name[n > 0 ? n : 0] = '\0';
		zdtm_check(!strcmp(name, "/memfd:ckpt-test (deleted)"), "the memfd is named %s", name);
	}
	{
		char all[4096 * 4];
		int r = open("dup.log", O_RDONLY);

		zdtm_check(read(r, all, sizeof(all)) == steps * 16 || steps * 16 > (long)sizeof(all),
			   "dup.log length");
		for (long step = 0; step < steps && step * 16 < (long)sizeof(all); step++)
			zdtm_check(atol(all + step * 16) == step, "dup.log record %ld", step);
	}
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
