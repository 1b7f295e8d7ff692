/*
 * A program that runs from a memfd, as packers, JITs and some launchers
 * do: it copies its own executable into a memfd and fexecve()s it, so its
 * text and /proc/self/exe are a file no directory holds.  After a restart
 * it still runs its own code, and /proc/self/exe is still a memfd with
 * the program's bytes.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include "zdtm.h"

#define NAME "zdtm-exe"

static void exe_is_the_memfd(const char *when)
{
	char link[256];
	ssize_t n = readlink("/proc/self/exe", link, sizeof(link) - 1);

	zdtm_check(n > 0, "%s: /proc/self/exe: %s", when, strerror(errno));
	link[n] = '\0';
	zdtm_check(!strncmp(link, "/memfd:" NAME, strlen("/memfd:" NAME)),
		   "%s: /proc/self/exe is %s", when, link);
}

/* The running executable has the bytes it was made from: its ELF header. */
static void exe_holds_an_elf(void)
{
	char head[4];
	int fd = open("/proc/self/exe", O_RDONLY);

	zdtm_check(fd >= 0 && read(fd, head, 4) == 4 && !memcmp(head, "\177ELF", 4),
		   "/proc/self/exe does not read as an ELF file");
	close(fd);
}

static void exec_from_a_memfd(char **argv)
{
	int exe = open("/proc/self/exe", O_RDONLY), mfd = memfd_create(NAME, MFD_CLOEXEC);
	char *args[] = { argv[0], argv[1], argv[2], "from-memfd", NULL };
	struct stat st;

	zdtm_check(exe >= 0 && mfd >= 0 && fstat(exe, &st) == 0, "memfd: %s", strerror(errno));
	zdtm_check(sendfile(mfd, exe, NULL, st.st_size) == st.st_size, "copying the executable");
	close(exe);
	fexecve(mfd, args, environ);
	zdtm_fail("fexecve: %s", strerror(errno));
}

int main(int argc, char **argv)
{
	long steps = 100, pace = 10;
	uint64_t hash;

	zdtm_args(argc, argv, &steps, &pace);
	if (argc < 4 || strcmp(argv[3], "from-memfd")) {
		char s[24], p[24];

		snprintf(s, sizeof(s), "%ld", steps);
		snprintf(p, sizeof(p), "%ld", pace);
		exec_from_a_memfd((char *[]){ argv[0], s, p, NULL });
	}
	exe_is_the_memfd("at the start");
	printf("READY\n");
	fflush(stdout);
	hash = zdtm_steps_hash(0, steps, pace);
	zdtm_hold();
	exe_is_the_memfd("at the end");
	exe_holds_an_elf();
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
