/*
 * Issue 37, shape 1: open file descriptions of a pipe.  A pipe end opened
 * a second time through /proc/self/fd/N has an open file description of
 * its own, with flags of its own; a dup shares the original's.  O_NONBLOCK
 * is set on the original write end only (so on its dup too, not on the
 * reopened write end), and the read end and its reopened twin stay
 * blocking.  At the end each fd has its flags as before, the reopened ends
 * are still ends of the same pipe, and changing the flags of one
 * description leaves the other's alone.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include "zdtm.h"

static int reopen(int fd, int flags)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	return open(path, flags);
}

static void nonblock_is(int fd, int want, const char *what)
{
	int fl = fcntl(fd, F_GETFL);

	zdtm_check(fl >= 0 && !!(fl & O_NONBLOCK) == want, "%s (fd %d): O_NONBLOCK %s, expected %s",
		   what, fd, fl >= 0 && (fl & O_NONBLOCK) ? "set" : "clear", want ? "set" : "clear");
}

int main(int argc, char **argv)
{
	long steps = 100, pace = 10;
	int p[2], wdup, w2, r2, fl;
	char buf[16];
	uint64_t hash = 0;

	zdtm_args(argc, argv, &steps, &pace);
	zdtm_check(pipe(p) == 0, "pipe");
	wdup = dup(p[1]);
	w2 = reopen(p[1], O_WRONLY);
	r2 = reopen(p[0], O_RDONLY);
	zdtm_check(wdup >= 0 && w2 >= 0 && r2 >= 0, "dup and reopen through /proc/self/fd");
	fl = fcntl(p[1], F_GETFL);
	zdtm_check(fl >= 0 && fcntl(p[1], F_SETFL, fl | O_NONBLOCK) == 0, "O_NONBLOCK on the write end");
	nonblock_is(wdup, 1, "the write end's dup, before");
	nonblock_is(w2, 0, "the reopened write end, before");
	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		hash = zdtm_mix(hash, step);
		zdtm_pace(pace);
	}
	zdtm_hold();
	nonblock_is(p[1], 1, "the write end");
	nonblock_is(wdup, 1, "the write end's dup");
	nonblock_is(w2, 0, "the write end reopened through /proc");
	nonblock_is(p[0], 0, "the read end");
	nonblock_is(r2, 0, "the read end reopened through /proc");
	/* still one pipe: what one writer writes, either reader reads */
	zdtm_check(write(w2, "abc", 3) == 3 && read(r2, buf, 3) == 3 && !memcmp(buf, "abc", 3),
		   "the reopened ends are one pipe");
	zdtm_check(write(p[1], "de", 2) == 2 && read(p[0], buf, 2) == 2 && !memcmp(buf, "de", 2),
		   "the original ends are the same pipe");
	/* two descriptions: clearing O_NONBLOCK on the reopened write end
	 * (set first) leaves the original's set */
	zdtm_check(fcntl(w2, F_SETFL, O_NONBLOCK) == 0 && fcntl(w2, F_SETFL, 0) == 0, "F_SETFL");
	nonblock_is(p[1], 1, "the write end, once the reopened one changed");
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
