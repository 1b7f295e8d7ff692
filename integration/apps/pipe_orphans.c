/*
 * Issue 37: pipe ends whose other side is all closed.  A write end whose
 * readers all closed fails each write with EPIPE and raises SIGPIPE; a read
 * end whose writers all closed gives the bytes still queued, then EOF.
 * Shapes: a blocking and an O_NONBLOCK write end, a write end dup'ed and
 * inherited by a forked child (one open file description: a flag set
 * through one fd shows through the others, in both processes), a read end
 * with bytes queued and an empty one, the write end of a FIFO whose reader
 * closed.  Some are made before the steps, some halfway through them
 * (after a checkpoint, often).
 *
 *   pipe_orphans [steps] [ms-per-step] [dir]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include "zdtm.h"

static volatile sig_atomic_t sigpipes;

static void on_sigpipe(int sig)
{
	(void)sig;
	sigpipes++;
}

struct orphans {
	int w, w_nb, w_dup, w_dup2;	/* write ends, no reader */
	int r_bytes, r_empty;		/* read ends, no writer */
	int fifo_w;			/* a FIFO's write end, no reader */
	char fifo[64];
	pid_t child;			/* holds w_dup's open file */
	int go, done;			/* the child's orders, its answer */
};

static const char queued[] = "bytes left in a pipe whose writer closed";

static int write_end_orphan(int flags)
{
	int p[2];

	zdtm_check(pipe2(p, flags) == 0, "pipe2: %m");
	close(p[0]);
	return p[1];
}

static int read_end_orphan(const char *bytes)
{
	int p[2];

	zdtm_check(pipe(p) == 0, "pipe: %m");
	if (bytes)
		zdtm_check(write(p[1], bytes, strlen(bytes)) == (ssize_t)strlen(bytes),
			   "write: %m");
	close(p[1]);
	return p[0];
}

static void check_epipe(int fd, const char *what)
{
	sig_atomic_t before = sigpipes;

	zdtm_check(write(fd, "x", 1) == -1 && errno == EPIPE,
		   "%s: a write did not fail with EPIPE: %m", what);
	zdtm_check(sigpipes == before + 1, "%s: no SIGPIPE for the write", what);
}

static void check_nonblock(int fd, int want, const char *what)
{
	int fl = fcntl(fd, F_GETFL);

	zdtm_check(fl >= 0, "%s: F_GETFL: %m", what);
	zdtm_check(!!(fl & O_NONBLOCK) == want, "%s: O_NONBLOCK is %s", what,
		   fl & O_NONBLOCK ? "set" : "clear");
	zdtm_check((fl & O_ACCMODE) == O_WRONLY, "%s: not a write end (flags %#x)", what, fl);
}

/* The child keeps the shared write end; told to, it checks the flag the
 * parent set through its own fd, and a write. */
static void child_holds(int fd, int go, int done)
{
	char c;
	int ok;

	zdtm_check(read(go, &c, 1) == 1, "child: read: %m");
	ok = (fcntl(fd, F_GETFL) & O_NONBLOCK) && write(fd, "x", 1) == -1 && errno == EPIPE &&
	     sigpipes == 1;
	zdtm_check(write(done, ok ? "y" : "n", 1) == 1, "child: write: %m");
	_exit(ok ? 0 : 1);
}

static void make_writers(struct orphans *o)
{
	int go[2], done[2];

	o->w = write_end_orphan(0);
	o->w_dup = write_end_orphan(0);
	zdtm_check(pipe(go) == 0 && pipe(done) == 0, "pipe: %m");
	o->child = fork();
	zdtm_check(o->child >= 0, "fork: %m");
	if (o->child == 0) {
		close(go[1]);
		close(done[0]);
		child_holds(o->w_dup, go[0], done[1]);
	}
	close(go[0]);
	close(done[1]);
	o->go = go[1];
	o->done = done[0];
	o->w_dup2 = dup(o->w_dup);	/* two fds of the parent too */
	zdtm_check(o->w_dup2 >= 0, "dup: %m");
	o->r_bytes = read_end_orphan(queued);
}

static int fifo_writer_orphan(char *name, size_t size)
{
	int r, w;

	snprintf(name, size, "fifo-orphan-%d", (int)getpid());
	unlink(name);
	zdtm_check(mkfifo(name, 0600) == 0, "mkfifo: %m");
	r = open(name, O_RDONLY | O_NONBLOCK);
	zdtm_check(r >= 0, "open %s: %m", name);
	w = open(name, O_WRONLY);
	zdtm_check(w >= 0, "open %s: %m", name);
	close(r);
	return w;
}

/* made halfway through the steps */
static void make_later(struct orphans *o)
{
	o->w_nb = write_end_orphan(O_NONBLOCK);
	o->r_empty = read_end_orphan(NULL);
	o->fifo_w = fifo_writer_orphan(o->fifo, sizeof(o->fifo));
}

static void check_readers(const struct orphans *o)
{
	char buf[128];
	ssize_t n = read(o->r_bytes, buf, sizeof(buf));

	zdtm_check(n == (ssize_t)strlen(queued) && !memcmp(buf, queued, n),
		   "read end with bytes: read gave %zd bytes (%m)", n);
	zdtm_check(read(o->r_bytes, buf, sizeof(buf)) == 0,
		   "read end with bytes: no EOF after them (%m)");
	zdtm_check(read(o->r_empty, buf, sizeof(buf)) == 0, "empty read end: no EOF (%m)");
}

static void check_writers(const struct orphans *o)
{
	int status;
	char c;

	check_nonblock(o->w, 0, "blocking write end");
	check_epipe(o->w, "blocking write end");
	check_nonblock(o->w_nb, 1, "non-blocking write end");
	check_epipe(o->w_nb, "non-blocking write end");
	check_nonblock(o->w_dup, 0, "shared write end");
	check_nonblock(o->w_dup2, 0, "shared write end, dup");
	zdtm_check(fcntl(o->w_dup, F_SETFL, O_NONBLOCK) == 0, "F_SETFL: %m");
	check_nonblock(o->w_dup2, 1, "shared write end, dup, after F_SETFL on the first");
	check_epipe(o->w_dup2, "shared write end");
	check_nonblock(o->fifo_w, 0, "FIFO's write end");
	check_epipe(o->fifo_w, "FIFO's write end");
	zdtm_check(write(o->go, "g", 1) == 1, "write to the child: %m");
	zdtm_check(read(o->done, &c, 1) == 1, "read from the child: %m");
	zdtm_check(waitpid(o->child, &status, 0) == o->child, "waitpid: %m");
	zdtm_check(c == 'y' && WIFEXITED(status) && WEXITSTATUS(status) == 0,
		   "the child's copy of the shared write end is not the same open file "
		   "(O_NONBLOCK set by the parent, or EPIPE, not seen)");
}

int main(int argc, char **argv)
{
	struct sigaction sa = { .sa_handler = on_sigpipe };
	long steps = 100, pace = 10;
	struct orphans o;
	uint64_t hash;

	zdtm_args(argc, argv, &steps, &pace);
	/* names relative to it: a test's directory may be too long for one */
	zdtm_check(chdir(argc > 3 ? argv[3] : ".") == 0, "chdir: %m");
	zdtm_check(sigaction(SIGPIPE, &sa, NULL) == 0, "sigaction: %m");
	make_writers(&o);
	printf("READY\n");
	fflush(stdout);
	hash = zdtm_steps_hash(0, steps / 2, pace);
	make_later(&o);
	hash = zdtm_steps_hash(hash, steps - steps / 2, pace);
	zdtm_hold();
	check_readers(&o);
	check_writers(&o);
	unlink(o.fifo);
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
