/*
 * inotify events queued and not read yet, as a file-watching daemon that
 * is busy elsewhere leaves them: each step creates a file in a watched
 * directory and then reads the event of the step before, so that one
 * step's event always waits in the queue (two, every fifth step).  One
 * instance is read after poll() (it must be readable while its events
 * wait), the other, non-blocking, straight away.  Every event must come
 * once, in order, with its watch and its name; none may be extra.  A new
 * watch added at the end must work too.
 *
 *   inotify_queued [steps] [ms-per-step] [dir]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include "zdtm.h"

struct instance {
	const char *dir;
	int fd, wd;
	int polled;		/* poll() before each read */
	char buf[4096] __attribute__((aligned(8)));
	ssize_t len, off;
	long next;		/* the step whose event comes next */
};

static void create(const struct instance *in, long step)
{
	char name[256];
	int fd;

	snprintf(name, sizeof(name), "%s/e%ld", in->dir, step);
	fd = open(name, O_WRONLY | O_CREAT | O_EXCL, 0600);
	zdtm_check(fd >= 0, "step %ld: create %s: %m", step, name);
	close(fd);
	unlink(name);
}

static const struct inotify_event *next_event(struct instance *in, long step)
{
	const struct inotify_event *e;

	if (in->off >= in->len) {
		if (in->polled) {
			struct pollfd p = { .fd = in->fd, .events = POLLIN };

			zdtm_check(poll(&p, 1, 10000) == 1, "step %ld: %s: not readable with "
				   "events queued", step, in->dir);
		}
		in->len = read(in->fd, in->buf, sizeof(in->buf));
		in->off = 0;
		zdtm_check(in->len > 0, "step %ld: %s: read: %zd %m", step, in->dir, in->len);
	}
	e = (const void *)(in->buf + in->off);
	in->off += sizeof(*e) + e->len;
	return e;
}

/* The events of every step before `upto`, each once, in order. */
static uint64_t take_until(struct instance *in, long upto, uint64_t hash)
{
	while (in->next < upto) {
		const struct inotify_event *e = next_event(in, upto);
		char want[32];

		snprintf(want, sizeof(want), "e%ld", in->next);
		zdtm_check(e->wd == in->wd && (e->mask & IN_CREATE) && e->len &&
			   !strcmp(e->name, want), "step %ld: %s: event %x for watch %d (%s), "
			   "not the creation of %s", upto, in->dir, e->mask, e->wd,
			   e->len ? e->name : "", want);
		hash = zdtm_mix(hash, (uint64_t)in->next * 31 + e->wd);
		in->next++;
	}
	return hash;
}

static void no_more(struct instance *in, long step)
{
	struct pollfd p = { .fd = in->fd, .events = POLLIN };
	ssize_t n;

	zdtm_check(in->off >= in->len, "step %ld: %s: an extra event", step, in->dir);
	if (poll(&p, 1, 0) != 1)
		return;
	/* readable without a real event left: nothing (or EAGAIN) to read */
	fcntl(in->fd, F_SETFL, fcntl(in->fd, F_GETFL) | O_NONBLOCK);
	n = read(in->fd, in->buf, sizeof(in->buf));
	zdtm_check(n < 0 && errno == EAGAIN, "step %ld: %s: %zd bytes of extra events", step,
		   in->dir, n);
	if (in->polled)
		fcntl(in->fd, F_SETFL, fcntl(in->fd, F_GETFL) & ~O_NONBLOCK);
}

static void open_instance(struct instance *in, const char *dir, int flags, int polled)
{
	mkdir(dir, 0700);
	in->dir = dir;
	in->polled = polled;
	in->fd = inotify_init1(flags);
	zdtm_check(in->fd >= 0, "inotify_init1: %m");
	in->wd = inotify_add_watch(in->fd, dir, IN_CREATE);
	zdtm_check(in->wd > 0, "inotify_add_watch %s: %m", dir);
	in->next = 1;
}

int main(int argc, char **argv)
{
	long steps = 300, pace = 10;
	static struct instance polled, direct;
	uint64_t hash = 0;
	int late;

	zdtm_args(argc, argv, &steps, &pace);
	if (argc > 3)
		zdtm_check(chdir(argv[3]) == 0, "chdir %s: %m", argv[3]);
	open_instance(&polled, "watched-p", 0, 1);
	open_instance(&direct, "watched-d", IN_NONBLOCK, 0);
	printf("READY\n");
	fflush(stdout);
	for (long s = 1; s <= steps; s++) {
		create(&polled, s);
		create(&direct, s);
		if (s % 5) {		/* every fifth step leaves two queued */
			hash = take_until(&polled, s, hash);
			hash = take_until(&direct, s, hash);
		}
		zdtm_pace(pace);
	}
	/* with the last steps' events still queued */
	zdtm_hold();
	hash = take_until(&polled, steps + 1, hash);
	hash = take_until(&direct, steps + 1, hash);
	no_more(&polled, steps);
	no_more(&direct, steps);
	late = inotify_add_watch(polled.fd, ".", IN_CREATE);
	zdtm_check(late > 0, "a new watch: %m");
	create(&(struct instance){ .dir = "." }, steps + 1);
	{
		const struct inotify_event *e = next_event(&polled, steps + 1);
		char want[32];

		snprintf(want, sizeof(want), "e%ld", steps + 1);
		zdtm_check(e->wd == late && e->len && !strcmp(e->name, want),
			   "the new watch's event: watch %d, not %d", e->wd, late);
	}
	zdtm_pass("%ld steps, %016llx", steps, (unsigned long long)hash);
	return 0;
}
