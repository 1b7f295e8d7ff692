/*
 * A pseudo-terminal's settings and queued bytes (struct ckpt_pty), shared
 * by the shim, which takes the bytes out at a checkpoint and puts them
 * back, and ckpt-restart, which puts them into a new pty.
 *
 * The kernel lets a tty's queues be read, never peeked at, and bytes
 * written go through the line discipline again: echoed, turned into
 * signals, mapped (CR to NL), expanded (NL to CR NL).  So they go back
 * with the settings made transparent for the moment, the line mode
 * (ICANON) kept, so that a partial line stays partial.
 */
#ifndef CKPT_PTY_H
#define CKPT_PTY_H

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>
#include "ckpt_image.h"
#include "ckpt_io.h"

static inline void ckpt_pty_settings_save(struct ckpt_pty *p, const struct termios *t,
					  const struct winsize *w)
{
	p->iflag = t->c_iflag;
	p->oflag = t->c_oflag;
	p->cflag = t->c_cflag;
	p->lflag = t->c_lflag;
	p->line = t->c_line;
	memcpy(p->cc, t->c_cc, sizeof(p->cc) < sizeof(t->c_cc) ? sizeof(p->cc) : sizeof(t->c_cc));
	p->ispeed = cfgetispeed(t);
	p->ospeed = cfgetospeed(t);
	p->rows = w->ws_row;
	p->cols = w->ws_col;
	p->xpixel = w->ws_xpixel;
	p->ypixel = w->ws_ypixel;
}

static inline void ckpt_pty_settings_load(const struct ckpt_pty *p, struct termios *t,
					  struct winsize *w)
{
	t->c_iflag = p->iflag;
	t->c_oflag = p->oflag;
	t->c_cflag = p->cflag;
	t->c_lflag = p->lflag;
	t->c_line = p->line;
	memcpy(t->c_cc, p->cc, sizeof(p->cc) < sizeof(t->c_cc) ? sizeof(p->cc) : sizeof(t->c_cc));
	cfsetispeed(t, p->ispeed);
	cfsetospeed(t, p->ospeed);
	*w = (struct winsize){ .ws_row = p->rows, .ws_col = p->cols,
			       .ws_xpixel = p->xpixel, .ws_ypixel = p->ypixel };
}

/* t, but bytes written to either end land in the other's queue as they
 * are: no echo, signals, flow control, mapping or output processing, and
 * no character that edits a line. */
static inline struct termios ckpt_pty_transparent(const struct termios *t)
{
	static const int editing[] = { VERASE, VKILL, VWERASE, VREPRINT, VLNEXT, VEOF };
	struct termios raw = *t;

	raw.c_lflag &= ~(ECHO | ECHOE | ECHOK | ECHONL | ECHOCTL | ECHOPRT | ECHOKE | ISIG |
			 IEXTEN);
	raw.c_iflag &= ~(IXON | IXOFF | ICRNL | INLCR | IGNCR | IUCLC | ISTRIP | BRKINT | INPCK |
			 PARMRK);
	raw.c_oflag &= ~OPOST;
	for (size_t i = 0; i < sizeof(editing) / sizeof(editing[0]); i++)
		raw.c_cc[editing[i]] = _POSIX_VDISABLE;
	return raw;
}

/*
 * The queued bytes back where they were: input (for the slave to read)
 * written to the master, output (for the master to read) written to the
 * slave, both under transparent settings, then the settings t.  A write
 * to the master reaches the slave's queue through the kernel's flip
 * buffer work; a poll of the slave waits for that work when the bytes
 * are not all there yet, so that t does not apply to them (one tty
 * buffer's worth, 2 KiB and more, may be processed in two goes).
 */
static inline int ckpt_pty_put_back(int master, int slave, const struct termios *t,
				    const char *output, size_t output_len, const char *input,
				    size_t input_len)
{
	struct termios raw = ckpt_pty_transparent(t);
	struct pollfd p = { .fd = slave, .events = POLLIN };
	int err = 0;

	if ((input_len || output_len) && tcsetattr(slave, TCSANOW, &raw))
		return errno;
	if (input_len) {
		err = ckpt_write_all(master, input, input_len);
		poll(&p, 1, 0);
	}
	if (!err && output_len)
		err = ckpt_write_all(slave, output, output_len);
	if (tcsetattr(slave, TCSANOW, t) && !err)
		err = errno;
	return err;
}

#endif
