/*
 * A pseudo-terminal as a terminal emulator and the shell under it hold
 * one: both ends in the job, the slave in raw mode with special
 * characters, a speed and a window size of its own, bytes queued both
 * ways and not read yet, and a child that made the slave its controlling
 * terminal in a session of its own (its process group in the foreground).
 * At the end everything is as it was, and the pair still carries bytes
 * both ways.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include "zdtm.h"

#define TO_PROGRAM "typed ahead\r"
#define TO_TERMINAL "printed, not shown yet\n"

static struct termios wanted_termios(int fd)
{
	struct termios t;

	zdtm_check(tcgetattr(fd, &t) == 0, "tcgetattr: %s", strerror(errno));
	cfmakeraw(&t);
	t.c_iflag |= IXON;
	t.c_lflag |= ISIG;
	t.c_cc[VMIN] = 1;
	t.c_cc[VTIME] = 7;
	t.c_cc[VINTR] = 0x05;
	t.c_cc[VSUSP] = 0x11;
	cfsetispeed(&t, B9600);
	cfsetospeed(&t, B9600);
	return t;
}

static void termios_is(int fd, const struct termios *want, const char *who)
{
	struct termios t;

	zdtm_check(tcgetattr(fd, &t) == 0, "%s: tcgetattr: %s", who, strerror(errno));
	zdtm_check(t.c_iflag == want->c_iflag && t.c_oflag == want->c_oflag &&
		   t.c_cflag == want->c_cflag && t.c_lflag == want->c_lflag,
		   "%s: termios flags %o %o %o %o, not %o %o %o %o", who, t.c_iflag, t.c_oflag,
		   t.c_cflag, t.c_lflag, want->c_iflag, want->c_oflag, want->c_cflag,
		   want->c_lflag);
	zdtm_check(!memcmp(t.c_cc, want->c_cc, sizeof(t.c_cc)), "%s: special characters", who);
	zdtm_check(cfgetospeed(&t) == B9600, "%s: speed", who);
}

/* Exactly what, with nothing after it for a moment. */
static void reads(int fd, const char *what, const char *who)
{
	char buf[128];
	size_t len = strlen(what), got = 0;
	struct pollfd p = { .fd = fd, .events = POLLIN };

	while (got < len && poll(&p, 1, 2000) == 1) {
		ssize_t n = read(fd, buf + got, sizeof(buf) - got);

		zdtm_check(n > 0, "%s: read: %s", who, n ? strerror(errno) : "EOF");
		got += n;
	}
	zdtm_check(got == len && !memcmp(buf, what, len), "%s: read %zu bytes \"%.*s\", not \"%s\"",
		   who, got, (int)got, buf, what);
	zdtm_check(poll(&p, 1, 100) == 0, "%s: more bytes than were queued", who);
}

/* The child: a session whose controlling terminal is the slave. */
static int session_leader(int slave, long steps, long pace)
{
	int fd;

	if (setsid() < 0 || ioctl(slave, TIOCSCTTY, 0) || tcsetpgrp(slave, getpid()))
		return 2;
	zdtm_steps_hash(0, steps, pace);
	fd = open("/dev/tty", O_RDWR);
	if (fd < 0)
		return 3;	/* no controlling terminal any more */
	if (tcgetsid(fd) != getpid() || tcgetsid(slave) != getpid())
		return 4;	/* another one, or the slave is not this session's */
	if (tcgetpgrp(slave) != getpid())
		return 5;	/* another group in the foreground */
	return 0;
}

int main(int argc, char **argv)
{
	long steps = 100, pace = 10;
	struct winsize size = { .ws_row = 33, .ws_col = 101, .ws_xpixel = 909, .ws_ypixel = 594 };
	struct winsize got;
	struct termios want;
	int master, slave, status;
	const char *name;
	pid_t child;
	uint64_t hash;

	zdtm_args(argc, argv, &steps, &pace);
	master = posix_openpt(O_RDWR | O_NOCTTY);
	zdtm_check(master >= 0 && grantpt(master) == 0 && unlockpt(master) == 0 &&
		   (name = ptsname(master)), "posix_openpt: %s", strerror(errno));
	slave = open(name, O_RDWR | O_NOCTTY);
	zdtm_check(slave >= 0, "%s: %s", name, strerror(errno));
	want = wanted_termios(slave);
	zdtm_check(tcsetattr(slave, TCSANOW, &want) == 0 && ioctl(slave, TIOCSWINSZ, &size) == 0,
		   "setting the terminal up: %s", strerror(errno));
	zdtm_check(write(master, TO_PROGRAM, strlen(TO_PROGRAM)) == (ssize_t)strlen(TO_PROGRAM) &&
		   write(slave, TO_TERMINAL, strlen(TO_TERMINAL)) == (ssize_t)strlen(TO_TERMINAL),
		   "queueing bytes: %s", strerror(errno));
	child = fork();
	zdtm_check(child >= 0, "fork");
	if (!child)
		_exit(session_leader(slave, steps, pace));
	printf("READY\n");
	fflush(stdout);
	hash = zdtm_steps_hash(0, steps, pace);
	zdtm_hold();
	zdtm_check(waitpid(child, &status, 0) == child && WIFEXITED(status),
		   "the session leader did not end normally");
	zdtm_check(WEXITSTATUS(status) == 0, "the session leader's terminal: check %d failed",
		   WEXITSTATUS(status));
	termios_is(slave, &want, "slave");
	termios_is(master, &want, "master");
	zdtm_check(ioctl(master, TIOCGWINSZ, &got) == 0 && !memcmp(&got, &size, sizeof(got)),
		   "window size %ux%u, not %ux%u", got.ws_col, got.ws_row, size.ws_col, size.ws_row);
	reads(slave, TO_PROGRAM, "the bytes typed ahead");
	reads(master, TO_TERMINAL, "the bytes printed");
	zdtm_check(write(master, "x", 1) == 1, "write to the master");
	reads(slave, "x", "the pair after");
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
