/*
 * Rebuilding the fd table of the image, before the point of no return (so
 * glibc is still usable).  New files are opened at whatever number the
 * kernel gives, moved above every number of the image, and only then
 * dup2()ed into place: no restored fd can clobber another.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/file.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <sys/inotify.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "ckpt_io.h"
#include "restart.h"
#include "sys.h"

#ifndef TFD_IOC_SET_TICKS
#define TFD_IOC_SET_TICKS _IOW('T', 0, uint64_t)	/* <linux/timerfd.h> */
#endif

static int stdio_fds[3] = { -1, -1, -1 };	/* the restarter's own stdio */
static int exited_pidfd = -1;		/* of a process that has exited */
static int image_fd = -1;
static const struct image *restoring;	/* its earlier images' fds are kept too */
static int fd_base = 3;			/* above every fd number of the image */

int restart_fd_base(void)
{
	return fd_base;
}

/* Every fd ckpt-restart holds lives at or above fd_base, out of the way of
 * the numbers it restores; the fd limit must leave room for them. */
static void choose_fd_base(struct image *imgs, unsigned n)
{
	struct rlimit rl;
	unsigned long need = 16, files = 0;
	int highest = 2;

	for (unsigned i = 0; i < n; i++) {
		for (unsigned j = 0; j < imgs[i].nfds; j++)
			if (imgs[i].fds[j].f.fd > highest)
				highest = imgs[i].fds[j].f.fd;
		files += mapped_file_fds(&imgs[i]);
		need += 3 * imgs[i].nfds + 1 + imgs[i].nsources;
	}
	need += files;
	fd_base = highest + 1;
	if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur < (rlim_t)fd_base + need)
		die("the restart needs %lu fds above fd %d, the images' highest (for their fds "
		    "and %lu mapped files), and RLIMIT_NOFILE is %llu: raise it (ulimit -n)",
		    need, highest, files, (unsigned long long)rl.rlim_cur);
}

int move_high(int fd, const char *what)
{
	int high;

	if (fd < 0)
		die("cannot restore fd for %s: %s", what, strerror(errno));
	if (fd >= fd_base)
		return fd;
	high = fcntl(fd, F_DUPFD_CLOEXEC, fd_base);
	if (high < 0)
		die("cannot restore fd for %s: %s", what, strerror(errno));
	close(fd);
	return high;
}

static void keep_stdio(void)
{
	for (int i = 0; i < 3; i++)
		stdio_fds[i] = fcntl(i, F_DUPFD_CLOEXEC, fd_base);
	set_error_fd(stdio_fds[2] >= 0 ? stdio_fds[2] : 2);
}

/* Everything inherited from whoever ran us goes, other images' fds too,
 * but what this process restores from. */
static void close_others(void)
{
	unsigned max = 9 + MAX_SOURCES + MAX_FDS * 3, nkeep = 0, lo = 0;
	int *keep = arena_alloc(sizeof(int) * max);

	keep[nkeep++] = image_fd;
	for (unsigned i = 0; i < restoring->nsources; i++)
		keep[nkeep++] = restoring->sources[i].fd;
	keep[nkeep++] = tree_report_fd();
	keep[nkeep++] = exited_pidfd;
	for (int i = 0; i < 3; i++)
		keep[nkeep++] = stdio_fds[i];
	nkeep += shared_fds(keep + nkeep, max - nkeep);
	nkeep += lazy_fds(keep + nkeep, max - nkeep);
	for (unsigned i = 1; i < nkeep; i++)	/* sort, then close the gaps */
		for (unsigned j = i; j > 0 && keep[j - 1] > keep[j]; j--) {
			int t = keep[j];

			keep[j] = keep[j - 1];
			keep[j - 1] = t;
		}
	for (unsigned i = 0; i < nkeep; i++) {
		if (keep[i] < 0 || (unsigned)keep[i] < lo)
			continue;
		if ((unsigned)keep[i] > lo)
			syscall(SYS_close_range, lo, keep[i] - 1, 0);
		lo = keep[i] + 1;
	}
	syscall(SYS_close_range, lo, ~0U, 0);
}

void write_all(int fd, const char *p, size_t len, const char *what)
{
	int err = ckpt_write_all(fd, p, len);

	if (err)
		die("cannot refill %s: %s", what, strerror(err));
}

/* Pair of memfd_seals (native/shim/state/fds.c), for a memfd nothing maps (a
 * mapped one is made in shared.c and sealed by the shim once it is mapped
 * again). */
static void seal_memfd(int fd, const struct loaded_fd *lf)
{
	int seals = (int)lf->f.value[0];

	if (seals && fcntl(fd, F_ADD_SEALS, seals) < 0)
		die("cannot seal memfd %s again (%#x): %s", lf->path, seals, strerror(errno));
}

/* A memfd: a new one of the same name and contents (a file named
 * "/memfd:..." in / would need root), opened again with the fd's flags. */
static int open_memfd(const struct loaded_fd *lf)
{
	char path[64];
	int mfd, fd;

	mfd = memfd_create(lf->path + 7, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (mfd < 0)
		die("cannot recreate memfd %s: %s", lf->path, strerror(errno));
	write_all(mfd, lf->data, lf->f.data_size, lf->path);
	if (ftruncate(mfd, lf->f.data_size) < 0)
		die("cannot recreate memfd %s: %s", lf->path, strerror(errno));
	seal_memfd(mfd, lf);
	snprintf(path, sizeof(path), "/proc/self/fd/%d", mfd);
	fd = open(path, (lf->f.flags & ~(O_CREAT | O_EXCL | O_TRUNC | O_NOFOLLOW)) | O_CLOEXEC);
	close(mfd);
	return fd;
}

/* The n innermost directories of path, made by make_parent_dirs: gone
 * again, as they were. */
static void remove_dirs(const char *path, int n)
{
	char dir[CKPT_PATH_MAX];

	snprintf(dir, sizeof(dir), "%s", path);
	for (char *slash; n-- > 0 && (slash = strrchr(dir, '/')) && slash != dir;) {
		*slash = '\0';
		rmdir(dir);
	}
}

/* An unlinked file: recreate it with its contents, open it, unlink it
 * (and the directories it was in, if they were removed too). */
static int open_deleted(const struct loaded_fd *lf)
{
	char tmp[CKPT_PATH_MAX + 32], dir[CKPT_PATH_MAX];
	int flags = lf->f.flags & ~(O_CREAT | O_EXCL | O_TRUNC);
	/* the directories this process made (another process of the host may
	 * be recreating the same ones: it removes only its own) */
	int fd, wfd, made = make_parent_dirs(lf->path);

	snprintf(dir, sizeof(dir), "%s", lf->path);
	snprintf(tmp, sizeof(tmp), "%s", lf->path);
	wfd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, lf->f.mode & 07777);
	if (wfd < 0 && errno == ENOENT) {	/* another's removed them meanwhile */
		made += make_parent_dirs(lf->path);
		wfd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, lf->f.mode & 07777);
	}
	if (wfd < 0 && !made) {		/* the name is taken again: use another */
		snprintf(tmp, sizeof(tmp), "%s/.ckpt-restored-%d-%d", dirname(dir),
			 getpid(), lf->f.fd);
		wfd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, lf->f.mode & 07777);
	}
	if (wfd < 0)
		die("cannot recreate deleted file %s: %s", lf->path, strerror(errno));
	write_all(wfd, lf->data, lf->f.data_size, lf->path);
	fd = open(tmp, flags | O_CLOEXEC);
	unlink(tmp);
	remove_dirs(lf->path, made);
	close(wfd);
	return fd;
}

/* mkdir -p of path's directory: a scratch file's directory went with it.
 * How many directories it made (the innermost ones). */
int make_parent_dirs(const char *path)
{
	char dir[CKPT_PATH_MAX];
	int made = 0;

	snprintf(dir, sizeof(dir), "%s", path);
	for (char *slash = strchr(dir + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
		*slash = '\0';
		if (!mkdir(dir, 0700))	/* EEXIST is what we want */
			made++;
		*slash = '/';
	}
	return made;
}

/* A scratch file that is gone (its job ended and cleaned up): made again
 * with the saved contents.  Another restored process may race us to it. */
static void recreate_scratch(const struct loaded_fd *lf)
{
	int wfd;

	make_parent_dirs(lf->path);
	wfd = open(lf->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, lf->f.mode & 07777);
	if (wfd < 0 && errno == EEXIST)
		return;
	if (wfd < 0)
		die("cannot recreate %s: %s", lf->path, strerror(errno));
	write_all(wfd, lf->data, lf->f.data_size, lf->path);
	close(wfd);
}

/*
 * Every scratch file gone since the checkpoint, made again before any
 * process restores its fds: an inotify watch on its directory, restored
 * first, would see it created.  It existed when the job was stopped.
 */
void recreate_gone_scratch_files(const struct image *imgs, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < imgs[i].nfds; j++) {
			const struct loaded_fd *lf = &imgs[i].fds[j];

			if (lf->f.kind == CKPT_FD_FILE && lf->f.contents_saved)
				recreate_scratch(lf);
		}
}

/* A named pipe that is gone (with its directories) made again. */
void make_fifo_again(const struct loaded_fd *lf)
{
	make_parent_dirs(lf->path);
	if (mkfifo(lf->path, lf->f.mode & 07777) && errno != EEXIST)
		die("cannot recreate fifo %s: %s", lf->path, strerror(errno));
}

/* A regular file opened again by its path (a gone scratch file was made
 * again by recreate_gone_scratch_files). */
int open_file_again(const struct loaded_fd *lf)
{
	/* a session leader opening a terminal would take it as its own */
	int flags = (lf->f.flags & ~(O_CREAT | O_EXCL | O_TRUNC)) | O_NOCTTY;

	return open(lf->path, flags | O_CLOEXEC);
}

/* A directory removed while open: one made and removed again, beside
 * where it was when that still exists (else in /tmp), opened in between.
 * Empty and unlinked as it was; it has no offset to go back to. */
static int open_removed_directory(const struct loaded_fd *lf)
{
	char tmp[PATH_MAX], *slash;
	int fd;

	snprintf(tmp, sizeof(tmp), "%s", lf->path);
	slash = strrchr(tmp, '/');
	if (slash && slash != tmp)
		snprintf(slash, sizeof(tmp) - (slash - tmp), "/.ckpt-removed-XXXXXX");
	if (!slash || slash == tmp || !mkdtemp(tmp)) {
		snprintf(tmp, sizeof(tmp), "/tmp/.ckpt-removed-XXXXXX");
		if (!mkdtemp(tmp))
			die("cannot make removed directory %s again: %s", lf->path, strerror(errno));
	}
	fd = open(tmp, (lf->f.flags & ~(O_CREAT | O_EXCL | O_TRUNC)) | O_CLOEXEC);
	rmdir(tmp);
	if (fd < 0)
		die("cannot make removed directory %s again: %s", lf->path, strerror(errno));
	return fd;
}

static int removed(const char *path)
{
	size_t len = strlen(path);

	return len > 10 && !strcmp(path + len - 10, " (deleted)");
}

/* The pid of /proc/<pid> or /proc/<pid>/..., else 0. */
pid_t proc_path_pid(const char *path)
{
	char *end;
	long pid;

	if (strncmp(path, "/proc/", 6) || path[6] < '1' || path[6] > '9')
		return 0;
	pid = strtol(path + 6, &end, 10);
	return (*end == '/' || *end == '\0') && pid > 0 && pid < (1L << 22) ? (pid_t)pid : 0;
}

#define PROC_WAIT_MS 10000

/*
 * A file under /proc/<pid> of another process of the job: that process
 * may not exist yet (a sibling whose parent has not made it yet), and
 * will soon: every process is made before any restores its fds past its
 * own children, and nothing holds that up.
 */
static void wait_for_process(const char *path)
{
	pid_t pid = proc_path_pid(path);
	struct timespec pause_1ms = { 0, 1000000 };
	char dir[32];

	if (!pid || pid == getpid() || !tree_has_process(pid))
		return;
	snprintf(dir, sizeof(dir), "/proc/%d", pid);
	for (int ms = 0; ms < PROC_WAIT_MS && access(dir, F_OK); ms++)
		nanosleep(&pause_1ms, NULL);
}

static int open_path(const struct loaded_fd *lf)
{
	int fd;

	wait_for_process(lf->path);
	fd = open_file_again(lf);

	if (fd < 0)
		die("cannot reopen fd %d (%s): %s", lf->f.fd, lf->path, strerror(errno));
	return fd;
}

static int restarter_stdio(int which)
{
	int src = stdio_fds[which >= 0 && which <= 2 ? which : 2];

	if (src < 0)
		return open("/dev/null", O_RDWR | O_CLOEXEC);
	return fcntl(src, F_DUPFD_CLOEXEC, 0);
}

/* /dev/tty of a process whose controlling terminal is a pty of the job
 * (tree.c made it the session's terminal again before the fds). */
int is_job_dev_tty(const struct image *img, const struct loaded_fd *lf)
{
	uint32_t ctty = img->proc->ctty_pty;

	return !strcmp(lf->path, "/dev/tty") && ctty && pty_end(ctty - 1, 0) >= 0;
}

/* /dev/tty again: that pty, through the open file it shares across fork
 * (files.c), else an open file of its own. */
static int open_dev_tty(const struct image *img, const struct loaded_fd *lf)
{
	int shared = dev_tty_fd(img->hdr.pid, &lf->f);
	int fd;

	if (shared >= 0)
		return fcntl(shared, F_DUPFD_CLOEXEC, 0);
	fd = open("/dev/tty", (lf->f.flags & ~(O_CREAT | O_EXCL | O_TRUNC)) | O_CLOEXEC);

	if (fd < 0)
		die("fd %d: cannot open /dev/tty, pty %u, the process's controlling terminal, "
		    "again: %s", lf->f.fd, img->proc->ctty_pty - 1, strerror(errno));
	return fd;
}

/* A memfd (or other shared memory object) held as an fd: a new open file
 * on the object that the restart shares with every mapping of it. */
static int open_shm(const struct loaded_fd *lf, int shm)
{
	char path[64];
	int fd;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", shm);
	/* through a /proc link: shm_open()'s O_NOFOLLOW would refuse it */
	fd = open(path, (lf->f.flags & ~(O_CREAT | O_EXCL | O_TRUNC | O_NOFOLLOW)) | O_CLOEXEC);
	if (fd < 0 || lseek(fd, lf->f.offset, SEEK_SET) < 0)
		die("cannot reopen shared memory %s: %s", lf->path, strerror(errno));
	return fd;
}

/* An end of a pipe of the job (its own open file, or the one this fd
 * shares: pipes.c), or, for a pipe to outside the job, what the restarter
 * has (stdio) or /dev/null. */
static int open_pipe_end(const struct image *img, const struct loaded_fd *lf)
{
	int end = pipe_open_of(img->hdr.pid, &lf->f);

	if (end < 0)		/* the pipe's own open file */
		end = shared_pipe_end(lf->f.object_id, lf->f.kind == CKPT_FD_PIPE_WRITE);

	if (end >= 0)
		return fcntl(end, F_DUPFD_CLOEXEC, 0);
	if (lf->f.stdio_fd >= 0)
		return restarter_stdio(lf->f.stdio_fd);
	return open("/dev/null", O_RDWR | O_CLOEXEC);
}

/* The write end of a named pipe whose readers had all closed: opened
 * O_WRONLY while a reader of our own is there for a moment, so that its
 * writes fail with EPIPE as they did. */
static int open_fifo_orphan_writer(const struct loaded_fd *lf, int flags)
{
	int reader = open(lf->path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	int fd;

	if (reader < 0)
		die("cannot reopen fifo %s: %s", lf->path, strerror(errno));
	fd = open(lf->path, flags | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		die("cannot reopen fifo %s for writing: %s", lf->path, strerror(errno));
	close(reader);
	return fd;
}

/* A named pipe, made again if it is gone; opened without blocking (no
 * reader or writer is there yet), its blocking mode set back after. */
static int open_fifo(const struct loaded_fd *lf)
{
	int flags = lf->f.flags & ~(O_CREAT | O_EXCL | O_TRUNC);
	int fd;

	make_fifo_again(lf);
	if ((flags & O_ACCMODE) == O_WRONLY && lf->f.value[0])
		return open_fifo_orphan_writer(lf, flags);
	if ((flags & O_ACCMODE) == O_WRONLY)	/* O_WRONLY alone: ENXIO without a reader */
		flags = (flags & ~O_ACCMODE) | O_RDWR;
	fd = open(lf->path, flags | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		die("cannot reopen fifo %s: %s", lf->path, strerror(errno));
	return fd;
}

/* eventfd, timerfd, signalfd, and an empty epoll set (filled once every
 * fd is in place). */
static int open_event_fd(const struct ckpt_fd *f)
{
	int fd = -1;

	switch (f->kind) {
	case CKPT_FD_EVENTFD:
		fd = eventfd(f->value[0] > 0xffffffffULL ? 0 : (unsigned)f->value[0],
			     EFD_CLOEXEC | (f->value[1] ? EFD_SEMAPHORE : 0));
		if (fd >= 0 && f->value[0] > 0xffffffffULL) {
			uint64_t v = f->value[0];

			if (write(fd, &v, sizeof(v)) != sizeof(v))
				die("cannot restore an eventfd count: %s", strerror(errno));
		}
		break;
	case CKPT_FD_TIMERFD: {
		struct itimerspec its = {
			.it_interval = { f->value[2] / 1000000000, f->value[2] % 1000000000 },
			.it_value = { f->value[3] / 1000000000, f->value[3] % 1000000000 },
		};

		uint64_t ticks = f->value[4];

		/* expired and not read yet (it_value reads 0): it re-arms on
		 * read, one interval on */
		if (!f->value[3] && f->value[2])
			its.it_value = its.it_interval;
		fd = timerfd_create((int)f->value[0], TFD_CLOEXEC);
		/* the time left, relative: an absolute deadline would have
		 * been given on the clock of the old host */
		if (fd >= 0 && timerfd_settime(fd, 0, &its, NULL))
			die("cannot restore a timerfd: %s", strerror(errno));
		if (fd >= 0 && ticks && ioctl(fd, TFD_IOC_SET_TICKS, &ticks))
			warn("fd %d: %llu timer expirations not read yet are lost: %s", f->fd,
			     (unsigned long long)ticks, strerror(errno));
		break;
	}
	case CKPT_FD_SIGNALFD: {
		sigset_t mask;

		sigemptyset(&mask);
		for (int sig = 1; sig < CKPT_NSIG; sig++)
			if (f->value[0] & (1ULL << (sig - 1)))
				sigaddset(&mask, sig);
		fd = signalfd(-1, &mask, SFD_CLOEXEC);
		break;
	}
	case CKPT_FD_EPOLL:
		fd = epoll_create1(EPOLL_CLOEXEC);
		break;
	}
	if (fd < 0)
		die("cannot recreate fd %d: %s", f->fd, strerror(errno));
	return fd;
}

/*
 * pidfds (saved by describe_pidfd, native/shim/state/event_fds.c): one of a
 * process of the job once it exists (the tree is being made: it may come
 * a moment later); one of a process that had exited, a copy of
 * exited_pidfd.
 */
#define PIDFD_WAIT_MS 10000

static int open_pidfd(const struct image *img, const struct ckpt_fd *f)
{
	pid_t pid = (pid_t)f->value[0];
	struct timespec nap = { 0, 1000000 };

	if (!pid)
		return fcntl(exited_pidfd, F_DUPFD_CLOEXEC, 0);
	for (int waited = 0; waited < PIDFD_WAIT_MS; waited++) {
		int fd = syscall(SYS_pidfd_open, pid, 0);

		if (fd >= 0 || errno != ESRCH)
			return fd;
		nanosleep(&nap, NULL);
	}
	die("pid %d: fd %d is a pidfd of process %d, which is not part of the job",
	    img->hdr.pid, f->fd, pid);
}

static int need_exited_pidfd;

static void note_exited_pidfds(struct image *imgs, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < imgs[i].nfds; j++)
			need_exited_pidfd |= imgs[i].fds[j].f.kind == CKPT_FD_PIDFD &&
					     !imgs[i].fds[j].f.value[0];
}

/* In pid 1 of the job's namespace (a pidfd of another namespace's process
 * cannot be signalled from it, not even to hear ESRCH), before the tree:
 * a child that exits at once, reaped, so that its pid is free again. */
void make_exited_pidfd(void)
{
	pid_t child;
	int fd;

	if (!need_exited_pidfd)
		return;
	child = fork();
	if (child < 0)
		die("cannot fork: %s", strerror(errno));
	if (child == 0)
		_exit(0);
	fd = syscall(SYS_pidfd_open, child, 0);
	waitpid(child, NULL, 0);
	exited_pidfd = move_high(fd, "a pidfd of an exited process");
}

/* Another watch on "/" and its removal: the instance's next watch number
 * is one higher (the kernel hands them out in a cycle). */
static int burn_watch_number(int fd)
{
	int wd = inotify_add_watch(fd, "/", IN_ATTRIB);

	if (wd >= 0)
		inotify_rm_watch(fd, wd);
	return wd;
}

/* Pair of inotify_describe (native/shim/state/inotify_watches.c): the watches
 * again, each with its number, in increasing order. */
static int open_inotify(const struct image *img, const struct loaded_fd *lf)
{
	int fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK), last = 0;	/* flags: restore_fds */
	char events[4096];

	if (fd < 0)
		die("cannot recreate inotify fd %d: %s", lf->f.fd, strerror(errno));
	for (;;) {
		const struct ckpt_inotify_watch *next = NULL;
		char path[PATH_MAX];
		int wd;

		for (uint64_t off = 0; off + sizeof(*next) <= lf->f.data_size;) {
			const struct ckpt_inotify_watch *w = (const void *)(lf->data + off);

			if (w->path_len >= PATH_MAX || w->path_len > lf->f.data_size - off - sizeof(*w))
				die("%s: corrupt inotify watch of fd %d", img->file, lf->f.fd);
			if (w->wd > last && (!next || w->wd < next->wd))
				next = w;
			off += sizeof(*w) + w->path_len;
		}
		if (!next) {	/* the IN_IGNORED of the numbers burnt are not the program's */
			while (read(fd, events, sizeof(events)) > 0)
				;
			return fd;
		}
		while (last + 1 < next->wd && (last = burn_watch_number(fd)) >= 0)
			;
		snprintf(path, sizeof(path), "%.*s", (int)next->path_len, (const char *)(next + 1));
		wd = inotify_add_watch(fd, path, next->mask);
		if (wd < 0 && errno == ENOENT) {	/* gone since: its number stays unused */
			warn("pid %d: inotify fd %d: %s is gone: watch %d is not there again",
			     img->hdr.pid, lf->f.fd, path, next->wd);
			wd = burn_watch_number(fd);
		}
		if (wd != next->wd)
			die("pid %d: inotify fd %d: cannot watch %s again as watch %d: %s", img->hdr.pid,
			    lf->f.fd, path, next->wd, wd < 0 ? strerror(errno) : "another number");
		last = wd;
	}
}

static int open_one(const struct image *img, const struct loaded_fd *lf)
{
	int shared = lf->f.kind == CKPT_FD_FILE || lf->f.kind == CKPT_FD_DEVICE ?
		     shared_file_fd(img->hdr.pid, &lf->f) : -1;

	if (shared >= 0)	/* inherited across fork: the one open file */
		return fcntl(shared, F_DUPFD_CLOEXEC, 0);
	switch (lf->f.kind) {
	case CKPT_FD_DIRECTORY:
		if (removed(lf->path))
			return open_removed_directory(lf);
		/* fall through */
	case CKPT_FD_FILE:
	case CKPT_FD_DEVICE: {
		int fd = open_path(lf);

		/* an O_PATH fd has no offset (and no seek) */
		if (lf->f.kind != CKPT_FD_DEVICE && !(lf->f.flags & O_PATH) &&
		    lseek(fd, lf->f.offset, SEEK_SET) < 0)
			die("cannot seek fd %d (%s): %s", lf->f.fd, lf->path, strerror(errno));
		if (lf->f.kind == CKPT_FD_DEVICE)
			tty_settings_restore(fd, lf);
		return fd;
	}
	case CKPT_FD_DELETED_FILE: {
		int shm = shared_shm_fd(lf->f.object_id);
		int fd = shm >= 0 ? open_shm(lf, shm) :
			 !strncmp(lf->path, "/memfd:", 7) ? open_memfd(lf) : open_deleted(lf);

		if (fd < 0 || lseek(fd, lf->f.offset, SEEK_SET) < 0)
			die("cannot restore deleted file %s: %s", lf->path, strerror(errno));
		/* a memfd's mode (fchmod), mapped or not; after the open: 0444
		 * would refuse O_RDWR */
		if (!strncmp(lf->path, "/memfd:", 7) && lf->f.mode &&
		    fchmod(fd, lf->f.mode & 07777) < 0)
			die("cannot give memfd %s its mode %o: %s", lf->path, lf->f.mode & 07777,
			    strerror(errno));
		return fd;
	}
	case CKPT_FD_TTY:
		if (is_job_dev_tty(img, lf))
			return open_dev_tty(img, lf);
		/* fall through */
	case CKPT_FD_INHERIT:
		return restarter_stdio(lf->f.kind == CKPT_FD_TTY ? lf->f.fd : lf->f.stdio_fd);
	case CKPT_FD_PIPE_READ:
	case CKPT_FD_PIPE_WRITE:
		return open_pipe_end(img, lf);
	case CKPT_FD_SOCKET: {
		int s = shared_socket_fd(lf->f.object_id);

		return s >= 0 ? fcntl(s, F_DUPFD_CLOEXEC, 0) : open("/dev/null", O_RDWR | O_CLOEXEC);
	}
	case CKPT_FD_PTY_MASTER:
	case CKPT_FD_PTY_SLAVE: {
		int end = pty_end(lf->f.object_id, lf->f.kind == CKPT_FD_PTY_MASTER);

		if (end >= 0)
			return fcntl(end, F_DUPFD_CLOEXEC, 0);
		/* a terminal outside the job: the restarter's */
		return restarter_stdio(lf->f.kind == CKPT_FD_PTY_SLAVE ? lf->f.stdio_fd : 2);
	}
	case CKPT_FD_FIFO:
		return open_fifo(lf);
	case CKPT_FD_PIDFD:
		return open_pidfd(img, &lf->f);
	case CKPT_FD_MQUEUE:
		return open_mqueue(&lf->f);
	case CKPT_FD_INOTIFY:
		return open_inotify(img, lf);
	case CKPT_FD_EVENTFD:
	case CKPT_FD_TIMERFD:
	case CKPT_FD_SIGNALFD:
	case CKPT_FD_EPOLL:
		return open_event_fd(&lf->f);
	default:
		return open("/dev/null", O_RDWR | O_CLOEXEC);
	}
}

/* The interest lists, now that the fds they name are in place. */
static void fill_epoll_sets(struct image *img)
{
	for (unsigned i = 0; i < img->nfds; i++) {
		const struct loaded_fd *lf = &img->fds[i];
		const struct ckpt_epoll_entry *e = (const void *)lf->data;
		size_t n = lf->f.data_size / sizeof(*e);

		if (lf->f.kind != CKPT_FD_EPOLL || lf->f.dup_of >= 0)
			continue;
		for (size_t k = 0; k < n; k++) {
			struct epoll_event ev = { .events = e[k].events, .data.u64 = e[k].data };

			if (epoll_ctl(lf->f.fd, EPOLL_CTL_ADD, e[k].fd, &ev))
				warn("pid %d: epoll fd %d cannot watch fd %d again: %s",
				     img->hdr.pid, lf->f.fd, e[k].fd, strerror(errno));
		}
	}
}

static int keeps_file_flags(uint32_t kind)
{
	return kind == CKPT_FD_PIPE_READ || kind == CKPT_FD_PIPE_WRITE || kind == CKPT_FD_FIFO ||
	       kind == CKPT_FD_SOCKET || kind == CKPT_FD_EVENTFD || kind == CKPT_FD_TIMERFD ||
	       kind == CKPT_FD_SIGNALFD || kind == CKPT_FD_EPOLL || kind == CKPT_FD_PIDFD ||
	       kind == CKPT_FD_INOTIFY;
}

/*
 * Files of threads (/proc/<pid>/task/<tid>/...) wait until the threads
 * exist: one of the process's own threads other than its main one is made
 * after the fds (threads.c), and another process's may be made after this
 * one's.  Until restore_task_fds reopens them the fds hold /dev/null.
 */
enum task_file {
	NOT_DEFERRED,
	OWN_THREAD,		/* of one of the process's other threads */
	OTHER_PROCESS,		/* of a thread of another process of the job */
};

static enum task_file task_file_kind(const struct image *img, const struct loaded_fd *lf,
				     long *pid_out, long *tid_out)
{
	long pid, tid;

	if (lf->f.kind != CKPT_FD_FILE || !ckpt_task_path(lf->path, &pid, &tid))
		return NOT_DEFERRED;
	if (pid_out)
		*pid_out = pid;
	if (tid_out)
		*tid_out = tid;
	if (pid == img->hdr.pid)
		return tid != pid ? OWN_THREAD : NOT_DEFERRED;
	return tree_has_process(pid) ? OTHER_PROCESS : NOT_DEFERRED;
}

/* How restore_task_fds reopens fd idx: as a file of a thread, or as a dup
 * of one. */
static enum task_file task_fd_deferred(const struct image *img, unsigned idx)
{
	int32_t of = img->fds[idx].f.dup_of;

	if (of < 0)
		return task_file_kind(img, &img->fds[idx], NULL, NULL);
	for (unsigned j = 0; j < idx; j++)
		if (img->fds[j].f.fd == of)
			return task_file_kind(img, &img->fds[j], NULL, NULL);
	return NOT_DEFERRED;
}

/* The fd of process pid that is the same open file as lf (inherited
 * across fork: one owner, the others share_pid, share_fd), or -1. */
static int same_open_file_in(const struct image *img, const struct loaded_fd *lf, pid_t pid)
{
	const struct image *other = tree_image(pid);
	int32_t owner_pid = lf->f.share_pid ? lf->f.share_pid : img->hdr.pid;
	int32_t owner_fd = lf->f.share_pid ? lf->f.share_fd : lf->f.fd;

	for (unsigned j = 0; other && j < other->nfds; j++) {
		const struct ckpt_fd *f = &other->fds[j].f;

		if (f->dup_of < 0 && f->kind == CKPT_FD_FILE &&
		    ((pid == owner_pid && f->fd == owner_fd) ||
		     (f->share_pid == owner_pid && f->share_fd == owner_fd)))
			return f->fd;
	}
	return -1;
}

#define TASK_WAIT_MS 60000

/*
 * The open file of another process's thread that this fd shares (forked
 * with it): taken from that process (pidfd_getfd) once it has reopened it
 * in its own restore_task_fds, which waits for nothing.
 */
static int take_from(const struct loaded_fd *lf, pid_t pid, int fd)
{
	struct timespec pause_1ms = { 0, 1000000 };
	long pidfd = sys2(SYS_pidfd_open, pid, 0);

	if (pidfd < 0)
		die("fd %d (%s): no process %d to share it with: %s", lf->f.fd, lf->path, pid,
		    strerror(-pidfd));
	for (int ms = 0; ms < TASK_WAIT_MS; ms++) {
		char link[64], path[CKPT_PATH_MAX];
		long got = sys3(SYS_pidfd_getfd, pidfd, fd, 0), n;

		if (got < 0 && got != -EBADF)
			die("fd %d (%s): cannot share it with process %d: %s", lf->f.fd, lf->path,
			    pid, strerror(-got));
		if (got >= 0) {
			snprintf(link, sizeof(link), "/proc/self/fd/%ld", got);
			n = sys3(SYS_readlink, link, path, sizeof(path) - 1);
			if (n == (long)strlen(lf->path) && !memcmp(path, lf->path, n)) {
				sys1(SYS_close, pidfd);
				return got;
			}
			sys1(SYS_close, got);	/* still its /dev/null */
		}
		sys2(SYS_nanosleep, &pause_1ms, NULL);
	}
	die("fd %d (%s): process %d did not reopen it", lf->f.fd, lf->path, pid);
}

/* A file of another process's thread: the same open file as that
 * process's fd if it has one, else opened once the thread exists. */
static int open_other_task_file(const struct image *img, const struct loaded_fd *lf)
{
	struct timespec pause_1ms = { 0, 1000000 };
	char task[64];
	long pid = 0, tid = 0;
	int fd;

	task_file_kind(img, lf, &pid, &tid);
	fd = same_open_file_in(img, lf, pid);
	if (fd >= 0)
		return take_from(lf, pid, fd);
	snprintf(task, sizeof(task), "/proc/%ld/task/%ld", pid, tid);
	for (int ms = 0; ms < TASK_WAIT_MS && sys2(SYS_access, task, F_OK) < 0; ms++)
		sys2(SYS_nanosleep, &pause_1ms, NULL);
	return open_one(img, lf);
}

static void place_task_fds(struct image *img, enum task_file which)
{
	for (unsigned i = 0; i < img->nfds; i++) {
		const struct loaded_fd *lf = &img->fds[i];
		int cloexec = (lf->f.fd_flags & FD_CLOEXEC) ? O_CLOEXEC : 0;
		int fd;

		if (task_fd_deferred(img, i) != which)
			continue;
		fd = lf->f.dup_of >= 0 ? lf->f.dup_of :
		     which == OTHER_PROCESS ? open_other_task_file(img, lf) : open_one(img, lf);
		if (dup3(fd, lf->f.fd, cloexec) < 0)
			die("cannot place fd %d (%s): %s", lf->f.fd, lf->path, strerror(errno));
		if (fd != lf->f.dup_of)
			close(fd);
	}
}

/* Once the threads exist (restore_threads), before any of them runs: the
 * files of threads, reopened in their fds (over the /dev/null they held),
 * dups after the fd they are a dup of.  The process's own first: another
 * process may be waiting to share one of them. */
void restore_task_fds(struct image *img)
{
	place_task_fds(img, OWN_THREAD);
	place_task_fds(img, OTHER_PROCESS);
}

/* Another fd on the open file of a lower fd (fds 1 and 2 of `>log 2>&1`). */
static int dup_placed(struct image *img, const int *placed, unsigned idx)
{
	for (unsigned j = 0; j < idx; j++)
		if (img->fds[j].f.fd == img->fds[idx].f.dup_of)
			return fcntl(placed[j], F_DUPFD_CLOEXEC, fd_base);
	die("%s: fd %d is a dup of fd %d, which is not in the image", img->file,
	    img->fds[idx].f.fd, img->fds[idx].f.dup_of);
}

/* In ckpt-restart itself, before anything is created: every fd it holds
 * from now on lives above every fd number of every image. */
void prepare_fds(struct image *imgs, unsigned n)
{
	choose_fd_base(imgs, n);
	for (unsigned i = 0; i < n; i++) {
		imgs[i].fd = move_high(imgs[i].fd, "an image");
		for (unsigned j = 0; j < imgs[i].nsources; j++)
			imgs[i].sources[j].fd = move_high(imgs[i].sources[j].fd, "an earlier image");
	}
	keep_stdio();
	note_exited_pidfds(imgs, n);
}

/*
 * The file locks each fd held (ckpt_image.h), taken again: flock and OFD
 * locks belong to the open file, once it is in place; POSIX ones to the
 * process, and closing any fd of the file drops them, so they come last,
 * after the memory's files are closed (raw calls: past the point of no
 * return; one that fails is not taken).
 */
/* A lease, and the signal that says it is being broken (0: SIGIO). */
static long restore_lease(int fd, int write, uint64_t sig)
{
	long r = sig ? sys3(SYS_fcntl, fd, F_SETSIG, sig) : 0;

	return r < 0 ? r : sys3(SYS_fcntl, fd, F_SETLEASE, write ? F_WRLCK : F_RDLCK);
}

void restore_locks(struct image *img, int posix)
{
	for (unsigned i = 0; i < img->nfds; i++) {
		const struct ckpt_fd *f = &img->fds[i].f;

		if (f->kind != CKPT_FD_FILE && f->kind != CKPT_FD_DELETED_FILE)
			continue;
		for (uint64_t k = 0; k < f->value[0] && k < CKPT_FD_LOCKS; k++) {
			uint64_t word = f->value[1 + 2 * k], last = f->value[2 + 2 * k];
			unsigned kind = (word >> 56) & 3;
			int excl = (word >> 56) & CKPT_LOCK_WRITE;
			int lease = (word >> 56) & CKPT_LOCK_LEASE;
			struct flock fl = {
				.l_type = excl ? F_WRLCK : F_RDLCK, .l_whence = SEEK_SET,
				.l_start = word & CKPT_LOCK_START_MASK,
			};
			long r;

			if ((!kind && !lease) || (kind == CKPT_LOCK_POSIX) != posix)
				continue;
			fl.l_len = last == UINT64_MAX ? 0 : last - fl.l_start + 1;
			if (lease)
				r = restore_lease(f->fd, excl, word & CKPT_LOCK_START_MASK);
			else if (kind == CKPT_LOCK_FLOCK)
				r = sys2(SYS_flock, f->fd, (excl ? LOCK_EX : LOCK_SH) | LOCK_NB);
			else
				r = sys3(SYS_fcntl, f->fd, kind == CKPT_LOCK_OFD ? F_OFD_SETLK : F_SETLK, &fl);
			if (r < 0 && !posix)
				warn("pid %d: fd %d (%s): its lock cannot be taken again: %s",
				     img->hdr.pid, f->fd, img->fds[i].path, strerror((int)-r));
		}
	}
}

/* Pair of async_owner (native/shim/state/fds.c): once the threads exist, since
 * the owner may be one of them (F_OWNER_TID); raw calls (restore_threads). */
void restore_async_owners(const struct image *img)
{
	for (unsigned i = 0; i < img->nfds; i++) {
		const struct ckpt_fd *f = &img->fds[i].f;
		struct f_owner_ex owner = { f->owner_type, f->owner_pid };
		long r = 0;

		if (!(f->flags & O_ASYNC) || f->dup_of >= 0)
			continue;
		if (f->async_signal)
			r = sys3(SYS_fcntl, f->fd, F_SETSIG, f->async_signal);
		if (!r && f->owner_pid)
			r = sys3(SYS_fcntl, f->fd, F_SETOWN_EX, &owner);
		if (r < 0)
			fatal("giving an O_ASYNC fd its owner again", r);
	}
}

void restore_fds(struct image *img)
{
	int *placed = arena_alloc(sizeof(int) * (img->nfds + 1));

	image_fd = img->fd;
	restoring = img;
	close_others();
	for (unsigned i = 0; i < img->nfds; i++)
		placed[i] = move_high(task_fd_deferred(img, i) != NOT_DEFERRED ?
				      open("/dev/null", O_RDONLY | O_CLOEXEC) :
				      img->fds[i].f.dup_of >= 0 ? dup_placed(img, placed, i) :
				      open_one(img, &img->fds[i]), img->fds[i].path);
	for (unsigned i = 0; i < img->nfds; i++) {
		const struct ckpt_fd *f = &img->fds[i].f;

		if (dup3(placed[i], f->fd, (f->fd_flags & FD_CLOEXEC) ? O_CLOEXEC : 0) < 0)
			die("cannot place fd %d: %s", f->fd, strerror(errno));
		if (keeps_file_flags(f->kind))	/* O_NONBLOCK */
			fcntl(f->fd, F_SETFL, f->flags);
		close(placed[i]);
	}
	fill_epoll_sets(img);
	shared_close_pipes();
	dev_ttys_close();
	restore_mq_notify(img);
	restore_locks(img, 0);
}

/* Just before jumping into the image: the restarter's own fds go away. */
void close_restart_fds(void)
{
	for (int i = 0; i < 3; i++)
		if (stdio_fds[i] >= 0)
			syscall(SYS_close, stdio_fds[i]);
	syscall(SYS_close, image_fd);
	for (unsigned i = 0; restoring && i < restoring->nsources; i++)
		syscall(SYS_close, restoring->sources[i].fd);
	syscall(SYS_close, tree_report_fd());
	if (exited_pidfd >= 0)
		syscall(SYS_close, exited_pidfd);
}
