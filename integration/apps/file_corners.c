/*
 * Files in the corners programs leave them in: a memfd with seals, a
 * memfd mapped shared and writable, then sealed against later writes, an
 * O_PATH fd of a file, an O_PATH | O_NOFOLLOW fd of a symbolic link (the
 * link itself), a directory removed while open, and a file unlinked under
 * the name it was opened by but still linked under another (as a
 * rename-over leaves it).  After the steps each must be what it was: the
 * seals and bytes, O_PATH and the same inode, the link and its target, an
 * empty directory with no links, and writes through the fd seen under
 * the other name.
 *
 *   file_corners [steps] [ms-per-step] [dir]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include "zdtm.h"

#define SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
#define MAPPED_SEALS (F_SEAL_FUTURE_WRITE | F_SEAL_SHRINK | F_SEAL_GROW)

int main(int argc, char **argv)
{
	long steps = 300, pace = 10;
	int memfd, mapped_memfd, opath, olink, removed, hard, other;
	char *map;
	struct stat file_st, link_st, st;
	uint64_t hash = 0;
	char buf[64];

	zdtm_args(argc, argv, &steps, &pace);
	if (argc > 3)
		zdtm_check(chdir(argv[3]) == 0, "chdir %s: %m", argv[3]);
	memfd = memfd_create("sealed", MFD_ALLOW_SEALING);
	zdtm_check(memfd >= 0 && write(memfd, "sealed bytes", 12) == 12 &&
		   fcntl(memfd, F_ADD_SEALS, SEALS) == 0, "a sealed memfd: %m");
	/* the map stays writable: it was made before the seal */
	mapped_memfd = memfd_create("sealed-mapped", MFD_ALLOW_SEALING);
	zdtm_check(mapped_memfd >= 0 && ftruncate(mapped_memfd, 4096) == 0, "a memfd: %m");
	map = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, mapped_memfd, 0);
	zdtm_check(map != MAP_FAILED && fcntl(mapped_memfd, F_ADD_SEALS, MAPPED_SEALS) == 0,
		   "a mapped memfd sealed: %m");
	close(open("fc-target", O_CREAT | O_WRONLY, 0600));
	unlink("fc-link");
	zdtm_check(symlink("fc-target", "fc-link") == 0, "symlink: %m");
	opath = open("fc-target", O_PATH);
	olink = open("fc-link", O_PATH | O_NOFOLLOW);
	zdtm_check(opath >= 0 && olink >= 0 && fstat(opath, &file_st) == 0 &&
		   fstat(olink, &link_st) == 0 && S_ISLNK(link_st.st_mode), "O_PATH fds: %m");
	rmdir("fc-removed");
	zdtm_check(mkdir("fc-removed", 0700) == 0, "mkdir: %m");
	removed = open("fc-removed", O_RDONLY | O_DIRECTORY);
	zdtm_check(removed >= 0 && rmdir("fc-removed") == 0, "a directory removed while open: %m");
	unlink("fc-old");
	unlink("fc-new");
	hard = open("fc-old", O_CREAT | O_RDWR, 0600);
	zdtm_check(hard >= 0 && link("fc-old", "fc-new") == 0 && unlink("fc-old") == 0,
		   "a file linked under another name: %m");
	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		hash = zdtm_mix(hash, step);
		zdtm_pace(pace);
	}
	zdtm_hold();

	zdtm_check(fcntl(memfd, F_GET_SEALS) == SEALS, "memfd seals %#x, not %#x",
		   fcntl(memfd, F_GET_SEALS), SEALS);
	zdtm_check(pread(memfd, buf, 12, 0) == 12 && !memcmp(buf, "sealed bytes", 12),
		   "the memfd's bytes");
	zdtm_check(ftruncate(memfd, 1) < 0 && errno == EPERM, "a sealed memfd shrinks");
	zdtm_check(fcntl(mapped_memfd, F_GET_SEALS) == MAPPED_SEALS, "mapped memfd seals %#x, not %#x",
		   fcntl(mapped_memfd, F_GET_SEALS), MAPPED_SEALS);
	memcpy(map, "through the map", 15);
	zdtm_check(pread(mapped_memfd, buf, 15, 0) == 15 && !memcmp(buf, "through the map", 15),
		   "the mapped memfd's map");
	zdtm_check(pwrite(mapped_memfd, "x", 1, 0) < 0 && errno == EPERM,
		   "a write to the mapped memfd after its seal");
	zdtm_check((fcntl(opath, F_GETFL) & O_PATH) && fstat(opath, &st) == 0 &&
		   st.st_ino == file_st.st_ino, "the O_PATH fd: flags %#x", fcntl(opath, F_GETFL));
	zdtm_check(fstat(olink, &st) == 0 && S_ISLNK(st.st_mode) && st.st_ino == link_st.st_ino &&
		   readlinkat(olink, "", buf, sizeof(buf)) == 9 && !memcmp(buf, "fc-target", 9),
		   "the O_PATH | O_NOFOLLOW fd is not the link: mode %o", st.st_mode);
	zdtm_check(fstat(removed, &st) == 0 && S_ISDIR(st.st_mode) && st.st_nlink == 0,
		   "the removed directory: mode %o, %lu links", st.st_mode,
		   (unsigned long)st.st_nlink);
	zdtm_check(pwrite(hard, "via fd", 6, 0) == 6, "write through the fd: %m");
	other = open("fc-new", O_RDONLY);
	zdtm_check(other >= 0 && read(other, buf, 6) == 6 && !memcmp(buf, "via fd", 6),
		   "the file's other name does not see the fd's write");
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
