/*
 * Pseudo-terminals (restored by ckpt-restart's ptys.c).  Both ends may
 * be in the job: a terminal emulator or mpirun holds the master, a shell
 * or the ranks the slave.  The pty's number pairs the ends in the image;
 * the master's record carries the slave's settings, its window size and
 * the bytes queued in each direction, which the kernel lets us read but
 * not peek at: they are taken out while the job is stopped and put back
 * at once (ckpt_pty.h).  A session whose controlling terminal is a pty
 * records its number and foreground group in the process record.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <termios.h>
#include <unistd.h>
#include "ckpt_pty.h"
#include "shim.h"

#define PTY_QUEUE_MAX 65536	/* more than a pty queues each way */

static int is_pty_master(const struct stat *st)
{
	return major(st->st_rdev) == 5 && minor(st->st_rdev) == 2;	/* /dev/ptmx */
}

/* /dev/pts/N: its number, or -1 */
static long pty_slave_number(dev_t rdev)
{
	unsigned maj = major(rdev);

	return maj >= 136 && maj <= 143 ? (long)(maj - 136) * 256 + minor(rdev) : -1;
}

/* Up to max bytes, exactly what FIONREAD says is there (the master is
 * the program's open file: its O_NONBLOCK is not ours to set). */
static size_t read_queued(int fd, char *buf, size_t max)
{
	size_t got = 0;
	int avail;

	while (got < max && !ioctl(fd, FIONREAD, &avail) && avail > 0) {
		ssize_t n = read(fd, buf + got, (size_t)avail < max - got ? (size_t)avail : max - got);

		if (n <= 0)
			break;
		got += n;
	}
	return got;
}

/* Everything the slave would read, partial lines too: read as raw bytes
 * (slave is our own open file, O_NONBLOCK). */
static size_t read_input(int slave, const struct termios *t, char *buf, size_t max)
{
	struct termios raw = ckpt_pty_transparent(t);
	size_t got = 0;

	raw.c_lflag &= ~ICANON;
	raw.c_cc[VMIN] = 0;
	raw.c_cc[VTIME] = 0;
	if (tcsetattr(slave, TCSANOW, &raw))
		return 0;
	while (got < max) {
		ssize_t n = read(slave, buf + got, max - got);

		if (n <= 0)
			break;
		got += n;
	}
	return got;
}

/* A terminal's settings (also in t) and window size into p. */
static int read_settings(int fd, struct ckpt_pty *p, struct termios *t)
{
	struct winsize w = { 0 };

	if (tcgetattr(fd, t))
		return errno;
	ioctl(fd, TIOCGWINSZ, &w);
	ckpt_pty_settings_save(p, t, &w);
	return 0;
}

/* The slave's settings and both queues into q, the queues put back. */
static int take_pty_state(int master, struct fd_payload *q)
{
	struct ckpt_pty p = { 0 };
	struct termios t;
	int slave, packet = 0, off = 0, err;
	char *out, *in;

	slave = ioctl(master, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
	if (slave < 0)
		return errno;	/* still locked (no unlockpt): no slave to hold */
	err = read_settings(slave, &p, &t);
	if (err)
		goto out;
	q->cap = sizeof(p) + 2 * PTY_QUEUE_MAX;
	q->data = scratch_map(q->cap);
	if (!q->data) {
		err = ENOMEM;
		goto out;
	}
	out = q->data + sizeof(p);
	/* packet mode puts a status byte before each read's bytes */
	if (!ioctl(master, TIOCGPKT, &packet) && packet)
		ioctl(master, TIOCPKT, &off);
	p.output_len = read_queued(master, out, PTY_QUEUE_MAX);
	in = out + p.output_len;
	p.input_len = read_input(slave, &t, in, PTY_QUEUE_MAX);
	err = ckpt_pty_put_back(master, slave, &t, out, p.output_len, in, p.input_len);
	if (packet)
		ioctl(master, TIOCPKT, &packet);
	memcpy(q->data, &p, sizeof(p));
	q->len = sizeof(p) + p.output_len + p.input_len;
out:
	close(slave);
	return err;
}

/* One process of those that hold the master (forked children inherit
 * it) takes the pty's state: they would take each other's settings. */
static int state_is_mine(unsigned n, unsigned seq)
{
	char key[128];

	snprintf(key, sizeof(key), "pty:%u:%s:%u", seq, shim_hostname(), n);
	return kv_claim_mine(key);
}

int pty_describe(int fd, const struct stat *st, struct ckpt_fd *rec, struct fd_payload *q,
		 unsigned seq)
{
	long slave_number = pty_slave_number(st->st_rdev);
	unsigned n = 0;
	int ours, err;

	if (slave_number >= 0) {
		rec->kind = CKPT_FD_PTY_SLAVE;
		rec->object_id = slave_number;
		rec->stdio_fd = fd;
		return 0;
	}
	if (!is_pty_master(st))
		return ENOTTY;
	ours = app_getfd(fd);
	if (ours < 0)
		return ENOTTY;
	if (ioctl(ours, TIOCGPTN, &n)) {
		close(ours);
		return ENOTTY;
	}
	rec->kind = CKPT_FD_PTY_MASTER;
	rec->object_id = n;
	err = state_is_mine(n, seq) ? take_pty_state(ours, q) : 0;
	close(ours);
	if (err && err != EIO)
		ckpt_warn("fd %d (pty %u): its settings and queued bytes: %s", fd, n,
			  shim_strerror(err));
	return 0;
}

/* A terminal device of the host held beside the job's own (a virtual
 * console, a serial line): its settings, which its last close resets,
 * for the restart to give back once it reopened it (no queued bytes). */
int tty_settings_describe(int fd, struct fd_payload *q)
{
	struct ckpt_pty p = { 0 };
	struct termios t;
	int ours = app_getfd(fd), err;

	if (ours < 0)
		return EBADF;
	err = read_settings(ours, &p, &t);
	close(ours);
	if (err)
		return err;
	q->cap = sizeof(p);
	q->data = scratch_map(q->cap);
	if (!q->data)
		return ENOMEM;
	memcpy(q->data, &p, sizeof(p));
	q->len = sizeof(p);
	return 0;
}

/* /proc/self/stat's tty_nr and tpgid (fields 7 and 8). */
void pty_controlling_terminal(struct ckpt_process *p)
{
	struct ckpt_proc_stat st;
	long number;

	p->ctty_pty = 0;
	p->ctty_foreground = 0;
	if (ckpt_stat_read("/proc/self/stat", &st) || st.last_field < 8)
		return;
	number = pty_slave_number(makedev((st.tty_nr >> 8) & 0xfff,
					  (st.tty_nr & 0xff) | ((st.tty_nr >> 12) & 0xfff00)));
	if (number < 0)
		return;
	p->ctty_pty = (uint32_t)number + 1;
	p->ctty_foreground = st.tpgid;
}
