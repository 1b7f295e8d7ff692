/*
 * Pseudo-terminals with both ends in the job (saved by the shim's
 * ptys.c): made new before the process tree, so that every restored
 * process finds both ends, with the slave's settings, window size and
 * queued bytes of the master's record.  A session leader takes its pty
 * back as controlling terminal, and the leader of the group that was in
 * its foreground puts that group there again.  A slave whose master is
 * outside the job is the restarter's terminal (fds.c); /dev/tty of a
 * process whose controlling terminal is a pty of the job is that pty.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>
#include "ckpt_pty.h"
#include "restart.h"

struct shared_pty {
	uint64_t id;			/* the old pty's number */
	int master, slave;
};

static struct shared_pty *ptys;
static unsigned nptys;

static struct shared_pty *find_pty(uint64_t id)
{
	for (unsigned i = 0; i < nptys; i++)
		if (ptys[i].id == id)
			return &ptys[i];
	return NULL;
}

static int holds_end(struct image *imgs, unsigned n, uint64_t id, uint32_t kind)
{
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < imgs[i].nfds; j++)
			if (imgs[i].fds[j].f.kind == kind && imgs[i].fds[j].f.object_id == id)
				return 1;
	return 0;
}

/* Whether the pty is the controlling terminal of a process (which may
 * hold its slave through /dev/tty only). */
static int controls_a_process(struct image *imgs, unsigned n, uint64_t id)
{
	for (unsigned i = 0; i < n; i++)
		if (imgs[i].proc->ctty_pty && imgs[i].proc->ctty_pty - 1 == id)
			return 1;
	return 0;
}

/* The master's record that carries the pty's state (dups carry none). */
static const struct loaded_fd *pty_state_record(struct image *imgs, unsigned n, uint64_t id,
						const struct image **img)
{
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < imgs[i].nfds; j++) {
			const struct loaded_fd *lf = &imgs[i].fds[j];

			if (lf->f.kind == CKPT_FD_PTY_MASTER && lf->f.object_id == id &&
			    lf->f.data_size) {
				*img = &imgs[i];
				return lf;
			}
		}
	return NULL;
}

static const struct ckpt_pty *checked_state(const struct image *img, const struct loaded_fd *lf)
{
	const struct ckpt_pty *p = (const void *)lf->data;

	if (lf->f.data_size < sizeof(*p) ||
	    lf->f.data_size != sizeof(*p) + (uint64_t)p->output_len + p->input_len)
		die("%s: corrupt pseudo-terminal record (fd %d)", img->file, lf->f.fd);
	return p;
}

/* The slave's settings, window size and queued bytes, as they were. */
static void restore_state(const struct image *img, const struct loaded_fd *lf, int m, int s)
{
	const struct ckpt_pty *p = checked_state(img, lf);
	const char *output = lf->data + sizeof(*p);
	struct termios t;
	struct winsize w;
	int err;

	if (tcgetattr(s, &t))
		die("cannot read a new pseudo-terminal's settings: %s", strerror(errno));
	ckpt_pty_settings_load(p, &t, &w);
	if (ioctl(s, TIOCSWINSZ, &w))
		die("cannot set a pseudo-terminal's window size: %s", strerror(errno));
	err = ckpt_pty_put_back(m, s, &t, output, p->output_len, output + p->output_len,
				p->input_len);
	if (err)
		die("cannot put a pseudo-terminal's settings and queued bytes back: %s",
		    strerror(err));
}

static void open_pty(struct shared_pty *p)
{
	int m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
	const char *name;
	int s;

	if (m < 0 || grantpt(m) || unlockpt(m) || !(name = ptsname(m)))
		die("cannot create a pseudo-terminal: %s", strerror(errno));
	s = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (s < 0)
		die("cannot open %s: %s", name, strerror(errno));
	p->master = move_high(m, "a pseudo-terminal");
	p->slave = move_high(s, "a pseudo-terminal");
}

/* A terminal device of the host, reopened: its saved settings (the shim's
 * tty_settings_describe), if it has them. */
void tty_settings_restore(int fd, const struct loaded_fd *lf)
{
	const struct ckpt_pty *p = (const void *)lf->data;
	struct termios t;
	struct winsize w;

	if (lf->f.data_size != sizeof(*p) || p->output_len || p->input_len || !isatty(fd))
		return;
	if (tcgetattr(fd, &t))
		die("cannot read the settings of %s: %s", lf->path, strerror(errno));
	ckpt_pty_settings_load(p, &t, &w);
	if (tcsetattr(fd, TCSANOW, &t) || ioctl(fd, TIOCSWINSZ, &w))
		die("cannot give %s its settings back: %s", lf->path, strerror(errno));
}

void ptys_create(struct image *imgs, unsigned n)
{
	unsigned total = 0;

	for (unsigned i = 0; i < n; i++)
		total += imgs[i].nfds;
	ptys = arena_alloc(sizeof(*ptys) * (total + 1));
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < imgs[i].nfds; j++) {
			const struct ckpt_fd *f = &imgs[i].fds[j].f;
			struct shared_pty *p = &ptys[nptys];
			const struct loaded_fd *state;
			const struct image *img;

			if (f->kind != CKPT_FD_PTY_MASTER || find_pty(f->object_id))
				continue;
			p->id = f->object_id;
			p->master = p->slave = -1;
			nptys++;
			if (!holds_end(imgs, n, p->id, CKPT_FD_PTY_SLAVE) &&
			    !controls_a_process(imgs, n, p->id))
				continue;	/* a master alone: a slave nobody holds */
			open_pty(p);
			state = pty_state_record(imgs, n, p->id, &img);
			if (state)
				restore_state(img, state, p->master, p->slave);
		}
}

int pty_end(uint64_t id, int master)
{
	const struct shared_pty *p = find_pty(id);

	return !p ? -1 : master ? p->master : p->slave;
}

unsigned pty_fds(int *out, unsigned max)
{
	unsigned k = 0;

	for (unsigned i = 0; i < nptys && k + 2 <= max; i++) {
		out[k++] = ptys[i].master;
		out[k++] = ptys[i].slave;
	}
	return k;
}

void ptys_close(void)
{
	for (unsigned i = 0; i < nptys; i++) {
		close(ptys[i].master);
		close(ptys[i].slave);
	}
}

/*
 * In the new session of pid (its leader), before its children exist: the
 * pty is its controlling terminal again.  In the group pid leads, once
 * made: the group is in the foreground again (SIGTTOU blocked, which a
 * group in the background would get for asking).  A group leader that is
 * not the session leader's descendant may come first: it waits for the
 * session to have its terminal (ENOTTY until then).
 */
void pty_take_controlling(const struct ckpt_process *p, pid_t pid)
{
	const struct shared_pty *t = p->ctty_pty ? find_pty(p->ctty_pty - 1) : NULL;
	sigset_t ttou, saved;

	if (!t || t->slave < 0)
		return;		/* not a pty of the job's */
	if (p->sid == pid && ioctl(t->slave, TIOCSCTTY, 0))
		die("cannot make pty %u the controlling terminal again: %s", p->ctty_pty - 1,
		    strerror(errno));
	if (p->pgid != pid || p->ctty_foreground != pid || getsid(0) != p->sid)
		return;
	sigemptyset(&ttou);
	sigaddset(&ttou, SIGTTOU);
	sigprocmask(SIG_BLOCK, &ttou, &saved);
	for (int tries = 0; tcsetpgrp(t->slave, pid) && errno == ENOTTY && tries < 10000; tries++)
		usleep(1000);
	if (tcgetpgrp(t->slave) != pid)
		die("cannot put process group %d in the foreground of pty %u again: %s", pid,
		    p->ctty_pty - 1, strerror(errno));
	sigprocmask(SIG_SETMASK, &saved, NULL);
}
