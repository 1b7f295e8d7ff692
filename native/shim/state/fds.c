/*
 * File descriptors: the fd records of the image, and the built-in "fds"
 * plugin that copies the bytes in each pipe the process reads from (DRAIN,
 * with tee(2): nothing is consumed).  ckpt-restart refills each pipe once,
 * from the first image that carries it.
 *
 * The checkpoint thread has an fd table of its own (checkpointer.c), so it
 * reaches the application's fds through /proc/<pid>/fd and fdinfo: opening
 * /proc/<pid>/fd/N gives a new open file on the same file or pipe.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <poll.h>
#include <sys/syscall.h>
#include <linux/kcmp.h>
#include <unistd.h>
#include "shim.h"

#define MAX_FDS 4096
#define MAX_PIPES 256
#define COPY_CHUNK (1 << 20)

/* The application's fd, opened anew from our own fd table. */
static int app_open(pid_t pid, int fd, int flags)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, fd);
	return open(path, flags | O_CLOEXEC | O_NOCTTY);
}

int app_stat(int fd, struct stat *st)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	return stat(path, st);
}

#define FDINFO_TEXT 4096	/* room for a few lock lines */

/* Offset and open flags (O_CLOEXEC standing for FD_CLOEXEC) from fdinfo,
 * whose text stays in buf (FDINFO_TEXT bytes). */
static int read_fdinfo(int fd, char *buf, long long *pos, int *flags)
{
	char path[64], *p;
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	n = ckpt_read_file(path, buf, FDINFO_TEXT - 1);
	if (n <= 0)
		return n < 0 ? -n : EIO;
	buf[n] = '\0';
	p = strstr(buf, "pos:");
	*pos = p ? strtoll(p + 4, NULL, 10) : 0;
	p = strstr(buf, "flags:");
	*flags = p ? (int)strtol(p + 6, NULL, 8) : 0;
	return 0;
}

static int app_fdinfo(int fd, long long *pos, int *flags)
{
	char buf[FDINFO_TEXT];

	return read_fdinfo(fd, buf, pos, flags);
}

/* An active lease through fd: its kind, and the signal that says it is
 * being broken.  One being broken is not kept: the open that breaks it
 * goes on once the holder is gone. */
static int file_lease(int fd, const char *line, unsigned long long *start, char *end)
{
	char state[16], mode[16];
	int ours, sig = 0;

	if (sscanf(line, "lock: %*d: LEASE %15s %15s", state, mode) != 2 ||
	    strcmp(state, "ACTIVE"))
		return 0;
	ours = app_getfd(fd);
	if (ours >= 0) {
		sig = fcntl(ours, F_GETSIG);
		close(ours);
	}
	*start = sig > 0 ? sig : 0;
	strcpy(end, "EOF");
	return CKPT_LOCK_LEASE | (!strcmp(mode, "WRITE") ? CKPT_LOCK_WRITE : 0);
}

/* The locks fdinfo shows held through fd, into rec->value (ckpt_image.h);
 * POSIX ones are the process's, FLOCK, OFD ones and leases its open file's. */
static void file_locks(int fd, const char *fdinfo, struct ckpt_fd *rec)
{
	char kind[16], mode[16], end[32];
	unsigned long long start;

	for (const char *l = strstr(fdinfo, "lock:"); l; l = strstr(l + 5, "lock:")) {
		uint64_t k, i = rec->value[0];

		k = file_lease(fd, l, &start, end);
		if (!k && sscanf(l, "lock: %*d: %15s ADVISORY %15s %*d %*s %llu %31s", kind, mode,
				 &start, end) == 4) {
			k = !strcmp(kind, "POSIX") ? CKPT_LOCK_POSIX : !strcmp(kind, "FLOCK") ?
			    CKPT_LOCK_FLOCK : !strcmp(kind, "OFDLCK") ? CKPT_LOCK_OFD : 0;
			if (k && !strcmp(mode, "WRITE"))
				k |= CKPT_LOCK_WRITE;
		}
		if (!k)
			continue;	/* MANDATORY, DELEG: not taken again */
		if (i == CKPT_FD_LOCKS) {
			ckpt_warn("fd %d holds more than %d locks: the others are not taken again",
				  fd, CKPT_FD_LOCKS);
			break;
		}
		rec->value[1 + 2 * i] = (start & CKPT_LOCK_START_MASK) | k << 56;
		rec->value[2 + 2 * i] = !strcmp(end, "EOF") ? UINT64_MAX : strtoull(end, NULL, 10);
		rec->value[0] = i + 1;
	}
}

/* Terminals: the pty and console majors, or a terminal's device name. */
static int app_is_tty(const struct stat *st, const char *path)
{
	unsigned maj = major(st->st_rdev);

	if (!S_ISCHR(st->st_mode))
		return 0;
	return maj == 4 || maj == 5 || (maj >= 136 && maj <= 143) ||
	       !strncmp(path, "/dev/tty", 8) || !strncmp(path, "/dev/pts/", 9) ||
	       !strncmp(path, "/dev/hvc", 8) || !strcmp(path, "/dev/console");
}

/* The terminal the job runs on (its stdio, or /dev/tty: its controlling
 * terminal), which a restart replaces by its own; a virtual console, a
 * serial line or the system console held beside it is a device of the
 * host, reopened by name. */
static int job_terminal(int fd, const struct stat *st, const char *path)
{
	return app_is_tty(st, path) && (fd <= 2 || st->st_rdev == makedev(5, 0));
}

/*
 * A job's scratch files (an MPI library's session directory under /tmp,
 * say) are removed when the job ends: restarting an older image later
 * must find them again.  Their contents are saved, up to a size, and the
 * restart recreates the ones that are gone.
 */
#define SCRATCH_MAX (64ULL << 20)

int shim_is_scratch_path(const char *path)
{
	static const char *const dirs[] = { "/tmp/", "/var/tmp/", "/dev/shm/" };

	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
		if (!strncmp(path, dirs[i], strlen(dirs[i])))
			return 1;
	return 0;
}

/* ---- the fd table ---- */

struct fd_info {
	struct ckpt_fd rec;
	uint64_t dev, ino;
	uint64_t file_size;
	int save_contents;		/* deleted, or a small scratch file */
	int held;			/* ours, to read the contents, or -1 */
	struct fd_payload payload;	/* socket queue, epoll interest list */
	char path[CKPT_PATH_MAX];
};

/* Taken while the process is stopped: a forked writer saves this, not the
 * fd state of the running process (offsets move). */
struct fd_table {
	int n;
	struct fd_info fi[MAX_FDS];
};

struct pipe_copy {
	uint64_t ino;
	int read_fd;
	int packets;		/* packet mode (O_DIRECT): data is packets, each
				 * after its uint32_t length */
	char *data;
	size_t len, cap, mapped;
};

static struct pipe_copy pipes[MAX_PIPES];
static int npipes;

struct fd_list {
	int *fds;
	int n, max;
};

static int list_fd(int dfd, const char *name, uint64_t ino, void *arg)
{
	struct fd_list *l = arg;
	char *end;
	long fd = strtol(name, &end, 10);

	/* not even the walker's dfd is skipped: it is in this thread's fd
	 * table, and /proc/self/fd lists the application's */
	if (*end || end == name)
		return 0;
	if (l->n < l->max)
		l->fds[l->n++] = fd;
	return 0;
}

int app_list_fds(int *fds, int max)
{
	struct fd_list l = { fds, 0, max };
	int err = ckpt_dir_walk("/proc/self/fd", list_fd, &l);	/* the app's */
	int n = l.n;

	if (err < 0)
		return err;
	/* ascending, so a dup always refers to a lower, earlier fd */
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && fds[j - 1] > fds[j]; j--) {
			int t = fds[j];

			fds[j] = fds[j - 1];
			fds[j - 1] = t;
		}
	return n;
}

/* Signal-driven I/O (O_ASYNC): the owner the signal goes to and which
 * signal it is, the open file's (restore_async_owners, native/restart/state/fds.c). */
static void async_owner(int fd, struct ckpt_fd *rec)
{
	struct f_owner_ex owner = { 0 };
	int ours = app_getfd(fd);

	if (ours < 0)
		return;
	if (fcntl(ours, F_GETOWN_EX, &owner) == 0) {
		rec->owner_type = owner.type;
		rec->owner_pid = owner.pid;
	}
	rec->async_signal = fcntl(ours, F_GETSIG);
	if (rec->async_signal < 0)
		rec->async_signal = 0;
	close(ours);
}

static int describe_fd(int fd, struct fd_info *fi, struct stat *st)
{
	char link[64], fdinfo[FDINFO_TEXT];
	ssize_t n;

	long long pos;
	int flags;

	memset(&fi->rec, 0, sizeof(fi->rec));
	fi->rec.fd = fd;
	fi->rec.dup_of = -1;
	if (app_stat(fd, st) || read_fdinfo(fd, fdinfo, &pos, &flags))
		return errno ? errno : EIO;
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, fi->path, sizeof(fi->path) - 1);
	if (n < 0)
		return errno;
	fi->path[n] = '\0';
	fi->rec.flags = flags & ~O_CLOEXEC;
	fi->rec.fd_flags = flags & O_CLOEXEC ? FD_CLOEXEC : 0;
	fi->rec.offset = pos;
	fi->rec.mode = st->st_mode;
	fi->dev = st->st_dev;
	fi->ino = st->st_ino;
	if (S_ISREG(st->st_mode))
		file_locks(fd, fdinfo, &fi->rec);
	if (flags & O_ASYNC)
		async_owner(fd, &fi->rec);
	return 0;
}

/* The pipe's capacity (F_SETPIPE_SZ may have changed it). */
/* A pipe's read end whose writers are all closed: EOF after its bytes. */
static int pipe_writers_gone(int fd)
{
	struct pollfd pfd = { .events = POLLIN };
	int gone;

	pfd.fd = app_getfd(fd);
	if (pfd.fd < 0)
		return 0;
	gone = syscall(SYS_poll, &pfd, 1, 0) == 1 && (pfd.revents & POLLHUP);
	close(pfd.fd);
	return gone;
}

/* A pipe's write end whose readers are all closed: each write fails with
 * EPIPE.  poll says so with POLLERR. */
static int pipe_readers_gone(int fd)
{
	struct pollfd pfd = { .events = POLLOUT };
	int gone;

	pfd.fd = app_getfd(fd);
	if (pfd.fd < 0)
		return 0;
	gone = syscall(SYS_poll, &pfd, 1, 0) == 1 && (pfd.revents & POLLERR);
	close(pfd.fd);
	return gone;
}

static long pipe_size(pid_t pid, int fd)
{
	int f = app_open(pid, fd, O_RDONLY | O_NONBLOCK);
	long size;

	if (f < 0)
		return 0;
	size = fcntl(f, F_GETPIPE_SZ);
	close(f);
	return size > 0 ? size : 0;
}

static struct pipe_copy *find_pipe(uint64_t ino)
{
	for (int i = 0; i < npipes; i++)
		if (pipes[i].ino == ino)
			return &pipes[i];
	return NULL;
}

/* A file at the root of its filesystem ("/name"), as a message queue's
 * link reads: only such a file can be one (a cheap test first). */
static int at_a_root(const char *path)
{
	return path[0] == '/' && !strchr(path + 1, '/');
}

/*
 * A memfd's seals (F_GET_SEALS), given back at restart.  ckpt-restart
 * seals a memfd that only fds hold; one that is also mapped is made
 * before the mappings and sealed after them, by the shim once the job
 * resumes (a write seal would refuse the writable shared maps it had
 * before it was sealed): the seals of each fd are kept here, in memory
 * the image saves.
 */
#define MAX_SEALED 64

static struct {
	int fd, seals;
} sealed[MAX_SEALED];
static int nsealed;

static uint64_t memfd_seals(int fd)
{
	int ours = app_getfd(fd), seals = -1;

	if (ours >= 0) {
		seals = fcntl(ours, F_GET_SEALS);
		close(ours);
	}
	if (seals > 0 && nsealed < MAX_SEALED)
		sealed[nsealed++] = (typeof(sealed[0])){ fd, seals };
	return seals > 0 ? (uint64_t)seals : 0;
}

/* After a restart, with every process's memory back: the seals a memfd
 * does not have yet (F_SEAL_SEAL refuses even none). */
static void seal_memfds_again(void)
{
	for (int i = 0; i < nsealed; i++) {
		int ours = app_getfd(sealed[i].fd), now, missing;

		if (ours < 0)
			continue;
		now = fcntl(ours, F_GET_SEALS);
		missing = now < 0 ? 0 : sealed[i].seals & ~now;
		if (missing && fcntl(ours, F_ADD_SEALS, missing))
			ckpt_warn("fd %d (memfd): its seals %#x could not be given back: %s",
				  sealed[i].fd, missing, shim_strerror(errno));
		close(ours);
	}
}

/*
 * A file unlinked under the name an fd shows but linked under another
 * (path: "<dir>/<name> (deleted)", name_len bytes without the suffix):
 * another name in the same directory, as a rename-over leaves it, put in
 * path.  Unprivileged, names elsewhere cannot be found.
 */
struct same_inode {
	const struct stat *st;
	const char *dir, *sep;
	char *path;
};

/* The entry that is st's inode: path becomes dir/name. */
static int is_same_inode(int dfd, const char *name, uint64_t ino, void *arg)
{
	struct same_inode *s = arg;
	struct stat other;

	if (ino != s->st->st_ino || fstatat(dfd, name, &other, AT_SYMLINK_NOFOLLOW) ||
	    other.st_dev != s->st->st_dev || other.st_ino != s->st->st_ino)
		return 0;
	return snprintf(s->path, CKPT_PATH_MAX, "%s%s%s", s->dir, s->sep, name) < CKPT_PATH_MAX;
}

static int name_beside(char *path, size_t name_len, const struct stat *st)
{
	char dir[CKPT_PATH_MAX];
	char *slash;
	struct same_inode s = { st, dir, "/", path };

	snprintf(dir, sizeof(dir), "%.*s", (int)name_len, path);
	slash = strrchr(dir, '/');
	if (!slash)
		return 0;
	if (slash == dir)
		s.sep = "";
	*(slash == dir ? slash + 1 : slash) = '\0';
	return ckpt_dir_walk(dir, is_same_inode, &s) > 0;
}

static void classify_fd(struct fd_info *fi, const struct stat *st, unsigned seq)
{
	size_t len = strlen(fi->path);
	int fd = fi->rec.fd;
	int err = 0;

	if (S_ISREG(st->st_mode) && at_a_root(fi->path) && is_mqueue(fd)) {
		if (len > 10 && !strcmp(fi->path + len - 10, " (deleted)")) {
			fi->path[len - 10] = '\0';
			fi->rec.value[3] = 1;	/* unlinked, still open */
		}
		err = mqueue_describe(fd, seq, &fi->rec, &fi->payload);
		if (!err)
			return;
		fi->rec.kind = CKPT_FD_EXTERNAL;
		ckpt_warn("fd %d (message queue %s): %s: it will be /dev/null after restart",
			  fd, fi->path, shim_strerror(err));
	} else if (S_ISREG(st->st_mode)) {
		int unlinked = len > 10 && !strcmp(fi->path + len - 10, " (deleted)");

		if (unlinked && st->st_nlink > 0 && name_beside(fi->path, len - 10, st))
			unlinked = 0;		/* reopened under its other name */
		else if (unlinked && st->st_nlink > 0)
			ckpt_warn("fd %d (%s): its other names are not in that directory: a copy "
				  "of the file comes back, not the file", fd, fi->path);
		fi->rec.kind = unlinked || st->st_nlink == 0 ? CKPT_FD_DELETED_FILE : CKPT_FD_FILE;
		if (unlinked)
			fi->path[len - 10] = '\0';
		if (fi->rec.kind == CKPT_FD_DELETED_FILE && !strncmp(fi->path, "/memfd:", 7))
			fi->rec.value[0] = memfd_seals(fd);
		fi->file_size = st->st_size;
		fi->save_contents = fi->rec.kind == CKPT_FD_DELETED_FILE ||
			(shim_is_scratch_path(fi->path) && fi->file_size <= SCRATCH_MAX);
		/* a memfd may also be mapped */
		fi->rec.object_id = shim_object_id(st->st_dev, st->st_ino);
	} else if (S_ISDIR(st->st_mode)) {
		fi->rec.kind = CKPT_FD_DIRECTORY;
	} else if (S_ISLNK(st->st_mode) && (fi->rec.flags & O_PATH)) {
		fi->rec.kind = CKPT_FD_FILE;	/* O_PATH | O_NOFOLLOW: the link itself */
	} else if (S_ISCHR(st->st_mode) && pty_describe(fd, st, &fi->rec, &fi->payload, seq) == 0) {
		return;
	} else if (S_ISCHR(st->st_mode)) {
		fi->rec.kind = job_terminal(fd, st, fi->path) ? CKPT_FD_TTY : CKPT_FD_DEVICE;
		if (fi->rec.kind == CKPT_FD_DEVICE && app_is_tty(st, fi->path))
			tty_settings_describe(fd, &fi->payload);	/* else as the device is */
	} else if (S_ISFIFO(st->st_mode) && fi->path[0] == '/') {
		fi->rec.kind = CKPT_FD_FIFO;	/* reopened by name */
		fi->rec.object_id = st->st_ino;
		fi->rec.offset = pipe_size(getpid(), fd);
		if ((fi->rec.flags & O_ACCMODE) == O_WRONLY)
			fi->rec.value[0] = pipe_readers_gone(fd);
	} else if (S_ISFIFO(st->st_mode) && !strncmp(fi->path, "pipe:", 5)) {
		/* whether the other end is in the job, the restart decides from
		 * all the images; a stdio pipe to outside is the restarter's */
		fi->rec.kind = (fi->rec.flags & O_ACCMODE) == O_RDONLY ?
			CKPT_FD_PIPE_READ : CKPT_FD_PIPE_WRITE;
		fi->rec.object_id = st->st_ino;
		fi->rec.offset = pipe_size(getpid(), fd);
		fi->rec.stdio_fd = fd <= 2 ? fd : -1;
		fi->rec.value[0] = fi->rec.kind == CKPT_FD_PIPE_READ ?
				   pipe_writers_gone(fd) : pipe_readers_gone(fd);
	} else if (S_ISSOCK(st->st_mode) &&
		   !(err = socket_describe(fd, st->st_ino, &fi->rec, &fi->payload,
					  fi->path, sizeof(fi->path)))) {
		return;
	} else if (!strncmp(fi->path, "anon_inode:", 11) &&
		   !(err = event_fd_describe(fd, fi->path, &fi->rec, &fi->payload))) {
		return;
	} else if (fd <= 2) {
		fi->rec.kind = CKPT_FD_INHERIT;	/* stdio from outside the job */
		fi->rec.stdio_fd = fd;
	} else {
		fi->rec.kind = CKPT_FD_EXTERNAL;
		if (err == ECANCELED)	/* the user was told why */
			;
		else if (err)
			ckpt_warn("fd %d (%s): %s: it will be /dev/null after restart",
				  fd, fi->path, shim_strerror(err));
		else
			ckpt_warn("fd %d (%s) is not supported yet: it will be /dev/null after restart",
				  fd, fi->path);
	}
}

/* `prog >log 2>&1`: fds 1 and 2 share one open file (one offset); the
 * restart must make one open and dup it, not two opens. */
static void find_dup(struct fd_table *t, struct fd_info *fi)
{
	pid_t pid = getpid();

	for (int i = 0; i < t->n; i++) {
		const struct fd_info *o = &t->fi[i];

		if (o->dev == fi->dev && o->ino == fi->ino && o->rec.dup_of < 0 &&
		    syscall(SYS_kcmp, pid, pid, KCMP_FILE, o->rec.fd, fi->rec.fd) == 0) {
			fi->rec.dup_of = o->rec.fd;
			fi->rec.kind = o->rec.kind;
			fi->rec.object_id = o->rec.object_id;
			fi->rec.stdio_fd = o->rec.stdio_fd;
			return;
		}
	}
}

/* The file's bytes, for the image: read (pread, the offset stays) through
 * the program's own open file where it can be, since opening the file
 * again would break a lease it holds (the open waits for the holder,
 * which is stopped) and show it an inotify IN_OPEN. */
static int hold_contents(const struct fd_info *fi)
{
	if ((fi->rec.flags & O_ACCMODE) != O_WRONLY && !(fi->rec.flags & O_DIRECT))
		return app_getfd(fi->rec.fd);
	return app_open(getpid(), fi->rec.fd, O_RDONLY);
}

#define SHARED_OPEN_SLOTS 64

static int shares_open_files(const struct fd_info *fi)
{
	return fi->rec.kind == CKPT_FD_FILE || fi->rec.kind == CKPT_FD_DEVICE ||
	       fi->rec.kind == CKPT_FD_PIPE_READ || fi->rec.kind == CKPT_FD_PIPE_WRITE ||
	       (fi->rec.kind == CKPT_FD_TTY && !strcmp(fi->path, "/dev/tty"));
}

/*
 * An open file inherited across fork is one open file (one offset, one
 * set of flags) in several processes; a file or a pipe end opened again
 * (through /proc/self/fd/N, or a second open()) is another one.  Which
 * are the same only kcmp can tell, so the open files that look alike
 * (file or pipe end, offset, flags) take numbered slots: each claims the
 * first slot whose owner is not the same open file by kcmp, or shares
 * the owner's (share_pid, share_fd) when it is.
 */
static void find_shared_open_file(struct fd_info *fi)
{
	char key[180], value[32], owner[64];
	int opid, ofd;

	if (!shares_open_files(fi) || fi->rec.dup_of >= 0)
		return;
	snprintf(value, sizeof(value), "%d %d", getpid(), fi->rec.fd);
	for (unsigned slot = 0; slot < SHARED_OPEN_SLOTS; slot++) {
		snprintf(key, sizeof(key), "file:%s:%llu:%llu:%d:%lld:%d:%u", shim_hostname(),
			 (unsigned long long)fi->dev, (unsigned long long)fi->ino, fi->rec.kind,
			 (long long)fi->rec.offset, fi->rec.flags, slot);
		if (kv_claim(key, value, owner, sizeof(owner)) != EEXIST ||
		    sscanf(owner, "%d %d", &opid, &ofd) != 2)
			return;		/* its own: the first of its kind, or no coordinator */
		if (opid != getpid() &&
		    syscall(SYS_kcmp, getpid(), opid, KCMP_FILE, fi->rec.fd, ofd) == 0) {
			fi->rec.share_pid = opid;
			fi->rec.share_fd = ofd;
			return;
		}
	}
}

/* The message queues this process created that no fd holds: entries of
 * their own (fd -1), after the fds, saved as CKPT_REC_MQUEUE records. */
static void collect_named_mqueues(struct fd_table *t, unsigned seq)
{
	const char *name;

	for (unsigned i = 0; (name = mqueue_created(i)) && t->n < MAX_FDS; i++) {
		struct fd_info *fi = &t->fi[t->n];
		int err;

		if (!name[0])
			continue;
		memset(fi, 0, sizeof(*fi));
		fi->rec.fd = -1;
		fi->rec.dup_of = -1;
		fi->held = -1;
		snprintf(fi->path, sizeof(fi->path), "%s", name);
		err = mqueue_describe_name(name, seq, &fi->rec, &fi->payload);
		if (!err) {
			t->n++;
			continue;
		}
		if (fi->payload.data)
			scratch_unmap(fi->payload.data, fi->payload.cap);
		if (err != ENOENT && err != EEXIST)
			ckpt_warn("message queue %s (no fd holds it): %s: it is not saved",
				  name, shim_strerror(err));
	}
}

/*
 * An executable that was deleted, or a memfd run by fexecve: only
 * /proc/self/exe reaches its bytes, which the restart maps the program's
 * text from and makes /proc/self/exe again.  An entry of its own (fd -1),
 * saved as CKPT_REC_EXE.
 */
#define EXE_MAX (1ULL << 30)

static void collect_deleted_exe(struct fd_table *t)
{
	struct fd_info *fi = &t->fi[t->n];
	ssize_t n = readlink("/proc/self/exe", fi->path, sizeof(fi->path) - 1);
	struct stat st;

	if (n <= 10 || t->n == MAX_FDS)
		return;
	fi->path[n] = '\0';
	if (strcmp(fi->path + n - 10, " (deleted)"))
		return;
	fi->path[n - 10] = '\0';
	fi->held = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
	if (fi->held < 0 || fstat(fi->held, &st) || (uint64_t)st.st_size > EXE_MAX) {
		ckpt_warn("the executable %s was deleted and %s: /proc/self/exe will name "
			  "ckpt-restart after a restart", fi->path,
			  fi->held < 0 ? "cannot be read" : "is larger than 1 GiB");
		if (fi->held >= 0)
			close(fi->held);
		return;
	}
	memset(&fi->rec, 0, sizeof(fi->rec));
	fi->rec.fd = -1;
	fi->rec.dup_of = -1;
	fi->rec.kind = CKPT_FD_DELETED_FILE;
	fi->rec.flags = O_RDONLY;
	fi->rec.mode = st.st_mode;
	fi->rec.object_id = shim_object_id(st.st_dev, st.st_ino);
	fi->dev = st.st_dev;
	fi->ino = st.st_ino;
	fi->file_size = st.st_size;
	fi->save_contents = 1;
	fi->payload = (struct fd_payload){ 0 };
	t->n++;
}

/*
 * Pair of the restart's reopening of a /proc file of the process itself
 * (/proc/<pid>/smaps, say) at its offset: ckpt-restart sought there before
 * the process had its memory and its reserve back, and a /proc file's
 * offset is a place in what the kernel listed at the seek.  Sought again
 * from the start now, it is the same place in the same listing, and a
 * program reading its maps across the checkpoint reads on where it was.
 */
static void reseek_proc_file(int fd, const char *own)
{
	char link[64], target[64];
	ssize_t n;
	off_t pos;
	int ours;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, target, sizeof(target) - 1);
	if (n <= 0)
		return;
	target[n] = '\0';
	if (strncmp(target, own, strlen(own)) || (ours = app_getfd(fd)) < 0)
		return;
	pos = lseek(ours, 0, SEEK_CUR);
	if (pos > 0 && lseek(ours, 0, SEEK_SET) == 0)
		lseek(ours, pos, SEEK_SET);
	close(ours);
}

/* On the stack, not in a scratch map: a mapping made now would be in the
 * listings (the checkpoint thread's stack is 1 MiB). */
void fds_reseek_proc_files(void)
{
	int fds[MAX_FDS], nfds = app_list_fds(fds, MAX_FDS);
	char own[32];

	snprintf(own, sizeof(own), "/proc/%d/", (int)getpid());
	for (int i = 0; i < nfds; i++)
		reseek_proc_file(fds[i], own);
}

struct fd_table *fds_collect(unsigned seq)
{
	struct fd_table *t = scratch_map(sizeof(*t));
	int *fds = scratch_map(MAX_FDS * sizeof(int));
	int nfds;

	if (!t || !fds)
		goto fail;
	nfds = app_list_fds(fds, MAX_FDS);
	if (nfds < 0)
		goto fail;
	mqueues_collect_begin();
	nsealed = 0;
	t->n = 0;
	for (int i = 0; i < nfds; i++) {
		struct fd_info *fi = &t->fi[t->n];
		struct stat st;

		if (describe_fd(fds[i], fi, &st))
			continue;	/* closed meanwhile */
		fi->held = -1;
		fi->save_contents = 0;
		fi->payload = (struct fd_payload){ 0 };
		find_dup(t, fi);
		if (fi->rec.dup_of < 0) {
			classify_fd(fi, &st, seq);
			find_shared_open_file(fi);
		}
		/* held now: a forked writer reads it after the job moved on */
		if (fi->save_contents && fi->rec.dup_of < 0)
			fi->held = hold_contents(fi);
		t->n++;
	}
	collect_named_mqueues(t, seq);
	collect_deleted_exe(t);
	scratch_unmap(fds, MAX_FDS * sizeof(int));
	return t;
fail:
	if (fds)
		scratch_unmap(fds, MAX_FDS * sizeof(int));
	if (t)
		scratch_unmap(t, sizeof(*t));
	return NULL;
}

void fds_release(struct fd_table *t)
{
	if (!t)
		return;
	for (int i = 0; i < t->n; i++) {
		if (t->fi[i].held >= 0)
			close(t->fi[i].held);
		if (t->fi[i].payload.data)
			scratch_unmap(t->fi[i].payload.data, t->fi[i].payload.cap);
	}
	scratch_unmap(t, sizeof(*t));
}

static int save_file_contents(struct image_writer *w, int fd, uint64_t size)
{
	char *buf = scratch_map(COPY_CHUNK);
	uint64_t off = 0;
	int err = 0;

	if (fd < 0 || !buf) {
		if (buf)
			scratch_unmap(buf, COPY_CHUNK);
		return fd < 0 ? EBADF : ENOMEM;
	}
	while (!err && off < size) {
		size_t want = size - off < COPY_CHUNK ? size - off : COPY_CHUNK;
		ssize_t n = pread(fd, buf, want, off);

		if (n <= 0) {		/* shrank meanwhile: pad with zeros */
			memset(buf, 0, want);
			n = want;
		}
		err = iw_append(w, buf, n);
		off += n;
	}
	scratch_unmap(buf, COPY_CHUNK);
	return err;
}

static int save_one_fd(struct image_writer *w, struct fd_info *fi)
{
	struct ckpt_record rec = { .type = fi->rec.fd >= 0 ? CKPT_REC_FD :
					   fi->rec.kind == CKPT_FD_MQUEUE ? CKPT_REC_MQUEUE :
					   CKPT_REC_EXE };
	struct pipe_copy *p = NULL;
	int err;

	fi->rec.path_len = strlen(fi->path);
	if (fi->save_contents && fi->rec.dup_of < 0) {
		fi->rec.data_size = fi->file_size;
		fi->rec.contents_saved = 1;
	}
	if (fi->rec.kind == CKPT_FD_PIPE_READ || fi->rec.kind == CKPT_FD_FIFO) {
		p = find_pipe(fi->rec.object_id);
		/* one read end carries the bytes; dups of it carry none */
		if (p && p->read_fd == fi->rec.fd) {
			fi->rec.data_size = p->len;
			fi->rec.value[1] = p->packets;
		}
	}
	if (fi->payload.len)
		fi->rec.data_size = fi->payload.len;
	rec.size = sizeof(fi->rec) + fi->rec.path_len + fi->rec.data_size;
	err = iw_append(w, &rec, sizeof(rec));
	if (!err)
		err = iw_append(w, &fi->rec, sizeof(fi->rec));
	if (!err)
		err = iw_append(w, fi->path, fi->rec.path_len);
	if (!err && fi->save_contents && fi->rec.data_size)
		err = save_file_contents(w, fi->held, fi->rec.data_size);
	if (!err && fi->rec.data_size && p)
		err = iw_append(w, p->data, p->len);
	if (!err && fi->payload.len)
		err = iw_append(w, fi->payload.data, fi->payload.len);
	return err;
}

int save_fds(struct image_writer *w, struct fd_table *t)
{
	int err = 0;

	for (int i = 0; !err && i < t->n; i++)
		err = save_one_fd(w, &t->fi[i]);
	return err;
}

/* ---- the fds plugin: a copy of what is in each pipe ---- */

/* tee(2) copies a pipe's bytes into our own pipe without consuming them:
 * the job's pipes are left exactly as they were.  The copy keeps each
 * packet's flag (a pipe written in packet mode, O_DIRECT), and a read ends
 * at a packet's end: each read is kept after its length, and a pipe that
 * took more than one read is saved as packets. */
static int copy_one(struct pipe_copy *p)
{
	int src = app_open(getpid(), p->read_fd, O_RDONLY | O_NONBLOCK);
	int tmp[2] = { -1, -1 }, reads = 0;
	int err = 0;
	ssize_t got, copied = 0;

	if (src < 0)
		return errno;
	p->cap = fcntl(src, F_GETPIPE_SZ);
	if ((int)p->cap <= 0)
		p->cap = 1 << 16;
	/* a packet takes a page of the pipe at least, and 4 bytes more here */
	p->mapped = p->cap + 4 * (p->cap / 4096 + 1);
	p->data = scratch_map(p->mapped);
	if (!p->data || pipe2(tmp, O_CLOEXEC | O_NONBLOCK)) {
		err = p->data ? errno : ENOMEM;
		goto out;
	}
	if (fcntl(tmp[1], F_SETPIPE_SZ, (int)p->cap) < (int)p->cap) {
		err = errno ? errno : ENOSPC;
		goto out;
	}
	got = tee(src, tmp[1], p->cap, SPLICE_F_NONBLOCK);
	if (got < 0 && errno != EAGAIN) {
		err = errno;
		goto out;
	}
	while (got > 0 && copied < got) {
		ssize_t n = read(tmp[0], p->data + p->len + 4, got - copied);
		uint32_t len32 = n;

		if (n <= 0) {
			err = n < 0 ? errno : EIO;
			break;
		}
		memcpy(p->data + p->len, &len32, 4);
		p->len += 4 + n;
		copied += n;
		reads++;
	}
	p->packets = reads > 1;
	if (reads == 1) {	/* plain bytes */
		memmove(p->data, p->data + 4, copied);
		p->len = copied;
	}
out:
	if (tmp[0] >= 0) {
		close(tmp[0]);
		close(tmp[1]);
	}
	close(src);
	return err;
}

static void release_pipes(void)
{
	for (int i = 0; i < npipes; i++)
		if (pipes[i].data)
			scratch_unmap(pipes[i].data, pipes[i].mapped);
	npipes = 0;
}

/* Whether an fd of the process had the file (dev, ino) open when it
 * stopped (the checkpointer's own fd table is not the app's). */
int fds_hold(const struct fd_table *t, uint64_t dev, uint64_t ino)
{
	for (int i = 0; t && i < t->n; i++)
		if (t->fi[i].dev == dev && t->fi[i].ino == ino)
			return 1;
	return 0;
}

/* Whether an fd of the process holds the unlinked file (dev, ino), whose
 * contents it saves. */
int fds_hold_deleted(const struct fd_table *t, uint64_t dev, uint64_t ino)
{
	for (int i = 0; t && i < t->n; i++)
		if (t->fi[i].dev == dev && t->fi[i].ino == ino &&
		    t->fi[i].rec.kind == CKPT_FD_DELETED_FILE)
			return 1;
	return 0;
}

/* The first read end of each pipe carries the pipe's bytes in the image. */
static int copy_pipes(void)
{
	int fds[MAX_FDS];
	int nfds = app_list_fds(fds, MAX_FDS);
	int err = 0;

	release_pipes();
	for (int i = 0; i < nfds && !err; i++) {
		struct stat st;
		long long pos;
		int acc;

		/* a FIFO may be open for reading and writing */
		if (app_stat(fds[i], &st) || !S_ISFIFO(st.st_mode) ||
		    app_fdinfo(fds[i], &pos, &acc) || (acc & O_ACCMODE) == O_WRONLY ||
		    find_pipe(st.st_ino))
			continue;
		if (npipes == MAX_PIPES)
			return EMFILE;
		pipes[npipes] = (struct pipe_copy){ .ino = st.st_ino, .read_fd = fds[i] };
		err = copy_one(&pipes[npipes++]);
	}
	return err;
}

static int list_sockets(int *socks)
{
	int fds[MAX_FDS];
	int nfds = app_list_fds(fds, MAX_FDS), n = 0;

	for (int i = 0; i < nfds; i++) {
		struct stat st;

		if (!app_stat(fds[i], &st) && S_ISSOCK(st.st_mode))
			socks[n++] = fds[i];
	}
	return n;
}

/* Sockets: the user hears of each connection that leads outside the
 * job; TCP bytes on their way land in their receive queue first, except
 * on the connections inside the job, which FLUSH empties. */
static int settle_sockets(void)
{
	int socks[MAX_FDS], peers[MAX_FDS], settle[MAX_FDS];
	int n = list_sockets(socks), nsettle, err;
	char why[200] = "";

	for (int i = 0; i < n; i++)
		peers[i] = socket_peer(socks[i], 1);
	nsettle = tcp_flush_choose(socks, peers, n, settle);
	if (nsettle < 0) {
		ckpt_hook_fail("cannot choose the TCP connections to flush: %s",
			       shim_strerror(-nsettle));
		return -nsettle;
	}
	err = sockets_settle(settle, nsettle, why, sizeof(why));
	if (err)
		ckpt_hook_fail("%s", why);
	return err;
}

static int fds_hook(const struct ckpt_hook_ctx *ctx, void *arg)
{
	(void)arg;
	switch (ctx->phase) {
	case CKPT_PHASE_SUSPEND: {
		int socks[MAX_FDS];
		int n = list_sockets(socks);

		return socket_peers_publish(socks, n) ?: backlog_note_holders(ctx->seq, socks, n);
	}
	case CKPT_PHASE_DRAIN: {
		int socks[MAX_FDS];

		return copy_pipes() ?: backlog_take(ctx->seq, socks, list_sockets(socks)) ?:
		       settle_sockets();
	}
	case CKPT_PHASE_FLUSH: {
		char why[200] = "";
		int err = tcp_flush(ctx->arg, why, sizeof(why));

		if (err)
			ckpt_hook_fail("%s", why);
		return err;
	}
	case CKPT_PHASE_TERMINATE: {
		int socks[MAX_FDS];

		sockets_reset_on_close(socks, list_sockets(socks));
		return 0;
	}
	case CKPT_PHASE_RESUME:
		tcp_flush_give_back(ctx->restarted);
		if (ctx->restarted) {
			seal_memfds_again();
			npipes = 0;	/* the buffers belonged to the old process */
			backlog_restarted();
			sockopt_buffers_renew();
		} else
			release_pipes();
		return 0;
	default:
		return 0;
	}
}

void fds_plugin_init(void)
{
	static const struct ckpt_plugin fds_plugin = { .name = "fds", .hook = fds_hook };

	ckpt_plugin_register(&fds_plugin);
}
