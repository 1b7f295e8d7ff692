/*
 * Issue 37, shape 8: a file deleted inside nested temporary directories
 * that were removed after it (as a test runner's or a compiler's scratch
 * tree is), still open.  At the end the fd still reads its bytes at its
 * offset, is still unlinked under the same name, takes writes, and the
 * directories are still gone.
 *
 *   deleted_in_removed_dir [steps] [ms-per-step] [dir]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include "zdtm.h"

#define CONTENTS "the bytes of a file whose directories are gone\n"
#define OFFSET 9

static char outer[PATH_MAX + 32], inner[PATH_MAX + 64], file[PATH_MAX + 96];

static void still_unlinked(int fd)
{
	char link[64], target[PATH_MAX + 128], want[PATH_MAX + 128];
	struct stat st;
	ssize_t n;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, target, sizeof(target) - 1);
	zdtm_check(n > 0, "readlink %s: %m", link);
	target[n] = '\0';
	snprintf(want, sizeof(want), "%s (deleted)", file);
	zdtm_check(!strcmp(target, want), "the fd names %s, not %s", target, want);
	zdtm_check(fstat(fd, &st) == 0 && st.st_nlink == 0 && S_ISREG(st.st_mode),
		   "the file is no longer an unlinked regular file");
	zdtm_check(access(outer, F_OK) && errno == ENOENT, "%s is there again", outer);
}

int main(int argc, char **argv)
{
	long steps = 100, pace = 10;
	const char *dir = argc > 3 ? argv[3] : ".";
	char buf[128], base[PATH_MAX];
	uint64_t hash;
	int fd;

	zdtm_args(argc, argv, &steps, &pace);
	zdtm_check(realpath(dir, base) != NULL, "realpath %s: %m", dir);
	snprintf(outer, sizeof(outer), "%s/removed.%d", base, getpid());
	snprintf(inner, sizeof(inner), "%s/nested", outer);
	snprintf(file, sizeof(file), "%s/file", inner);
	zdtm_check(mkdir(outer, 0700) == 0 && mkdir(inner, 0700) == 0, "mkdir: %m");
	fd = open(file, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	zdtm_check(fd >= 0, "open %s: %m", file);
	zdtm_check(write(fd, CONTENTS, strlen(CONTENTS)) == (ssize_t)strlen(CONTENTS), "write: %m");
	zdtm_check(lseek(fd, OFFSET, SEEK_SET) == OFFSET, "lseek: %m");
	zdtm_check(unlink(file) == 0 && rmdir(inner) == 0 && rmdir(outer) == 0,
		   "removing the file and its directories: %m");
	printf("READY\n");
	fflush(stdout);
	hash = zdtm_steps_hash(0, steps, pace);
	zdtm_hold();
	still_unlinked(fd);
	zdtm_check(lseek(fd, 0, SEEK_CUR) == OFFSET, "the offset moved");
	zdtm_check(read(fd, buf, strlen(CONTENTS) - OFFSET) == (ssize_t)(strlen(CONTENTS) - OFFSET) &&
		   !memcmp(buf, CONTENTS + OFFSET, strlen(CONTENTS) - OFFSET),
		   "the bytes after the offset differ");
	zdtm_check(pwrite(fd, "more", 4, 0) == 4 && pread(fd, buf, 4, 0) == 4 &&
		   !memcmp(buf, "more", 4), "the file does not take writes");
	for (size_t i = 0; i < strlen(CONTENTS); i++)
		hash = zdtm_mix(hash, (unsigned char)CONTENTS[i]);
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
