/*
 * inotify watches, as file-watching daemons hold them: one instance
 * watches a file (IN_MODIFY) and a directory (IN_CREATE | IN_DELETE), with
 * a gap in its watch numbers (a watch removed in between, a relative
 * path); another instance, non-blocking, watches a second file.  Each step
 * changes the watched things and checks that each event comes with the
 * watch number the program was given.
 *
 * Events queued at a checkpoint are kept (inotify_queued checks them in
 * order): every step's event must come.
 *
 *   inotify_watch [steps] [ms-per-step] [dir]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include "zdtm.h"

static void touch(const char *name)
{
	int fd = open(name, O_WRONLY | O_CREAT | O_APPEND, 0600);

	zdtm_check(fd >= 0 && write(fd, "x", 1) == 1, "write %s: %s", name, strerror(errno));
	close(fd);
}

struct instance {
	int fd;
	int wds[2];		/* its watches */
	char buf[4096] __attribute__((aligned(8)));
	ssize_t len, off;
};

/* The next event within a second: its watch and mask, or 0. */
static int next_event(struct instance *in, int *wd, uint32_t *mask)
{
	struct pollfd p = { .fd = in->fd, .events = POLLIN };
	struct inotify_event *e;

	if (in->off >= in->len) {
		if (poll(&p, 1, 1000) != 1)
			return 0;
		in->len = read(in->fd, in->buf, sizeof(in->buf));
		in->off = 0;
		if (in->len <= 0)
			return 0;
	}
	e = (struct inotify_event *)(in->buf + in->off);
	in->off += sizeof(*e) + e->len;
	*wd = e->wd;
	*mask = e->mask;
	return 1;
}

/* `make`, then an event of watch want with one of bits must come; every
 * event read must be for one of the instance's watches. */
static void expect(struct instance *in, int want, uint32_t bits, void (*make)(void),
		   const char *what, long step)
{
	int wd;
	uint32_t mask;

	make();
	while (next_event(in, &wd, &mask)) {
		zdtm_check(wd == in->wds[0] || wd == in->wds[1],
			   "step %ld: %s: event for watch %d", step, what, wd);
		if (wd == want && (mask & bits))
			return;
	}
	zdtm_fail("step %ld: %s: no event", step, what);
}

static void modify_a(void) { touch("a.txt"); }
static void modify_b(void) { touch("b.txt"); }
static void create_delete(void)
{
	touch("d/new");
	unlink("d/new");
}

int main(int argc, char **argv)
{
	long steps = 300, pace = 10;
	static struct instance one, two;
	int wd_a, wd_d, wd_b, wd;
	uint32_t mask;

	zdtm_args(argc, argv, &steps, &pace);
	if (argc > 3)
		zdtm_check(chdir(argv[3]) == 0, "chdir");
	mkdir("d", 0700);
	touch("a.txt");
	touch("b.txt");
	touch("gone.txt");
	one.fd = inotify_init1(0);
	two.fd = inotify_init1(IN_NONBLOCK);
	zdtm_check(one.fd >= 0 && two.fd >= 0, "inotify_init1: %s", strerror(errno));
	wd_a = inotify_add_watch(one.fd, "a.txt", IN_MODIFY);
	zdtm_check(inotify_rm_watch(one.fd, inotify_add_watch(one.fd, "gone.txt", IN_MODIFY)) == 0,
		   "inotify_rm_watch");
	wd_d = inotify_add_watch(one.fd, "d", IN_CREATE | IN_DELETE);
	wd_b = inotify_add_watch(two.fd, "b.txt", IN_MODIFY);
	zdtm_check(wd_a > 0 && wd_d > wd_a + 1 && wd_b > 0, "watches %d %d %d", wd_a, wd_d, wd_b);
	zdtm_check(next_event(&one, &wd, &mask) && (mask & IN_IGNORED),
		   "no IN_IGNORED for the removed watch");
	one.wds[0] = wd_a;
	one.wds[1] = wd_d;
	two.wds[0] = two.wds[1] = wd_b;
	printf("READY\n");
	fflush(stdout);
	for (long s = 1; s <= steps; s++) {
		expect(&one, wd_a, IN_MODIFY, modify_a, "a.txt", s);
		expect(&one, wd_d, IN_CREATE, create_delete, "d/", s);
		expect(&two, wd_b, IN_MODIFY, modify_b, "b.txt", s);
		zdtm_pace(pace);
	}
	zdtm_hold();
	/* once more: a restart during the hold must have kept the watches */
	expect(&one, wd_a, IN_MODIFY, modify_a, "a.txt", steps + 1);
	expect(&two, wd_b, IN_MODIFY, modify_b, "b.txt", steps + 1);
	zdtm_pass("watches %d %d %d kept", wd_a, wd_d, wd_b);
	return 0;
}
