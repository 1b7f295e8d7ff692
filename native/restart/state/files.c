/*
 * Open files and devices shared between processes (one open file, one
 * offset, inherited across fork; saved by native/shim/state/fds.c): opened once by
 * pid 1 of the restart namespace, at the owner's offset, and inherited by
 * every process whose image shares it.  /dev/tty on a pty of the job can
 * only be opened by a process of that terminal's session: the first
 * process of the tree that has it opens it (dev_ttys_open), and its
 * children inherit it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <linux/filter.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <stdlib.h>
#include <termios.h>
#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <linux/if_packet.h>
#include <linux/netlink.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include "ckpt_sockopts.h"
#include "restart.h"
#include "sys.h"

/* An open file inherited across fork: one open file, one offset. */
struct shared_file {
	int32_t pid, fd;		/* the process and fd that own it */
	int file;
};

static struct shared_file *files;
static unsigned nfiles;

static struct shared_file *files;
static unsigned nfiles;

static struct shared_file *find_file(int32_t pid, int32_t fd)
{
	for (unsigned i = 0; i < nfiles; i++)
		if (files[i].pid == pid && files[i].fd == fd)
			return &files[i];
	return NULL;
}

/* The record of fd of process pid among the images, or NULL. */
const struct loaded_fd *job_fd_record(struct image *imgs, unsigned n, int32_t pid, int32_t fd)
{
	for (unsigned i = 0; i < n; i++)
		if (imgs[i].hdr.pid == pid)
			for (unsigned j = 0; j < imgs[i].nfds; j++)
				if (imgs[i].fds[j].f.fd == fd)
					return &imgs[i].fds[j];
	return NULL;
}

void files_create(struct image *imgs, unsigned n)
{
	unsigned total = 0;

	for (unsigned i = 0; i < n; i++)
		total += imgs[i].nfds;
	files = arena_alloc(sizeof(*files) * (total + 1));
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < imgs[i].nfds; j++) {
			const struct ckpt_fd *f = &imgs[i].fds[j].f;
			const struct loaded_fd *owner;
			int fd;

			if ((f->kind != CKPT_FD_FILE && f->kind != CKPT_FD_DEVICE) || !f->share_pid ||
			    find_file(f->share_pid, f->share_fd))
				continue;
			owner = job_fd_record(imgs, n, f->share_pid, f->share_fd);
			if (!owner || owner->f.kind != f->kind)
				continue;	/* its owner is gone: opened on its own */
			if (proc_path_pid(owner->path))
				continue;	/* of a process not made yet: each opens its own */
			fd = open_file_again(owner);
			/* a device or an O_PATH fd has no offset to go back to */
			if (fd < 0 || (f->kind == CKPT_FD_FILE && !(owner->f.flags & O_PATH) &&
				       lseek(fd, owner->f.offset, SEEK_SET) < 0))
				die("cannot reopen %s: %s", owner->path, strerror(errno));
			if (f->kind == CKPT_FD_DEVICE)
				tty_settings_restore(fd, owner);
			files[nfiles++] = (struct shared_file){ f->share_pid, f->share_fd,
								move_high(fd, owner->path) };
		}
}

/* The open file a FILE or DEVICE record shares with other processes, or -1. */
int shared_file_fd(int32_t pid, const struct ckpt_fd *f)
{
	const struct shared_file *sf = f->share_pid ? find_file(f->share_pid, f->share_fd) :
					find_file(pid, f->fd);

	return sf ? sf->file : -1;
}

unsigned open_file_fds(int *out, unsigned max)
{
	unsigned k = 0;

	for (unsigned i = 0; i < nfiles && k < max; i++)
		out[k++] = files[i].file;
	return k;
}

void files_close(void)
{
	for (unsigned i = 0; i < nfiles; i++)
		close(files[i].file);
}

/* /dev/tty on a pty of the job, by its owner (share_pid, share_fd, or
 * the fd itself); static, so that children made by clone have the
 * table as they have the fds. */
#define MAX_DEV_TTYS 16

static struct shared_file dev_ttys[MAX_DEV_TTYS];
static unsigned ndev_ttys;

static struct shared_file *find_dev_tty(int32_t pid, const struct ckpt_fd *f)
{
	int32_t opid = f->share_pid ? f->share_pid : pid, ofd = f->share_pid ? f->share_fd : f->fd;

	for (unsigned i = 0; i < ndev_ttys; i++)
		if (dev_ttys[i].pid == opid && dev_ttys[i].fd == ofd)
			return &dev_ttys[i];
	return NULL;
}

/*
 * In a restored process, once its session has its terminal and before it
 * makes its children: its /dev/tty files that no ancestor opened, opened
 * here, so that every child that shares one inherits it (one open file,
 * one set of flags, as fork left it).  An open that fails is left to
 * open_dev_tty, which says why.
 */
void dev_ttys_open(const struct image *img)
{
	for (unsigned i = 0; i < img->nfds && ndev_ttys < MAX_DEV_TTYS; i++) {
		const struct loaded_fd *lf = &img->fds[i];
		const struct ckpt_fd *f = &lf->f;
		int fd;

		if (f->kind != CKPT_FD_TTY || f->dup_of >= 0 || !is_job_dev_tty(img, lf) ||
		    find_dev_tty(img->hdr.pid, f))
			continue;
		fd = open("/dev/tty", (f->flags & ~(O_CREAT | O_EXCL | O_TRUNC)) | O_CLOEXEC);
		if (fd < 0)
			continue;
		dev_ttys[ndev_ttys++] = (struct shared_file){
			f->share_pid ? f->share_pid : img->hdr.pid,
			f->share_pid ? f->share_fd : f->fd, move_high(fd, "/dev/tty") };
	}
}

/* The /dev/tty file a TTY record has from dev_ttys_open, or -1. */
int dev_tty_fd(int32_t pid, const struct ckpt_fd *f)
{
	const struct shared_file *t = find_dev_tty(pid, f);

	return t ? t->file : -1;
}

unsigned dev_tty_fds(int *out, unsigned max)
{
	unsigned k = 0;

	for (unsigned i = 0; i < ndev_ttys && k < max; i++)
		out[k++] = dev_ttys[i].file;
	return k;
}

void dev_ttys_close(void)
{
	for (unsigned i = 0; i < ndev_ttys; i++)
		close(dev_ttys[i].file);
	ndev_ttys = 0;
}
