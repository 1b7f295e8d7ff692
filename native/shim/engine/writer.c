/*
 * Writing the image of this process, in the checkpoint thread or, for a
 * forked checkpoint, in a copy-on-write child: the child holds the memory
 * as it was at fork time and writes it while the application runs again.
 *
 * The child is made with a bare clone() whose exit signal is 0, so the
 * application gets no SIGCHLD and its wait() calls never see it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "shim.h"


static pid_t writer_pid;		/* forked writer still running, or 0 */
static pid_t child_pid;		/* in a writer or copier: its own pid (a flag
					 * would come back set from its image) */
static int writer_pipe = -1;		/* its report: WARN lines, then DONE/FAIL */
static int writer_staged;		/* it writes to, or copies from, a stage dir */

static void fill_header(struct ckpt_image_header *h, pid_t pid)
{
	struct timespec ts;
	unsigned nthreads = 1;

	for (unsigned i = 0; i < quiesce_count(); i++)
		nthreads += quiesce_thread(i) != NULL;
	clock_gettime(CLOCK_REALTIME, &ts);
	memset(h, 0, sizeof(*h));
	h->magic = CKPT_IMAGE_MAGIC;
	h->format_version = CKPT_IMAGE_VERSION;
	h->arch = CKPT_ARCH_X86_64;
	h->page_size = CKPT_PAGE_SIZE;
	h->header_size = CKPT_HEADER_SIZE;
	snprintf(h->engine_version, sizeof(h->engine_version), "%s", CKPT_ENGINE_VERSION);
	snprintf(h->hostname, sizeof(h->hostname), "%s", shim_hostname());
	h->pid = pid;
	h->nthreads = nthreads;
	h->restart_info = (uint64_t)&shim_restart_info;
	h->reserve_start = CKPT_RESERVE_START;
	h->reserve_end = CKPT_RESERVE_END;
	h->time_ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
	h->header_xxh = shim_xxh3(h, sizeof(*h));
}

/* What is taken while the process is stopped, for the file to hold. */
struct snapshot {
	pid_t pid;
	struct ckpt_process *proc;
	struct fd_table *fds;
	const struct ckpt_thread *self;
	struct shm_snapshot *shm;	/* forked: the shared memory to save */
	struct sysv_snapshot *sysv;	/* System V IPC, if this process saves it */
	struct vma_advice_table *advice;	/* mlock and madvise state */
	struct write_mode mode;
};

static int write_records(struct image_writer *w, const struct snapshot *snap,
			 const char *shared_key, struct increments *inc)
{
	static const char end_marker[8];
	char page[CKPT_HEADER_SIZE] = { 0 };
	int err;

	fill_header((struct ckpt_image_header *)page, snap->pid);
	err = iw_append(w, page, sizeof(page));
	if (!err)
		err = iw_record(w, CKPT_REC_PROCESS, snap->proc, sizeof(*snap->proc));
	if (!err)
		err = save_threads(w, snap->self);
	if (!err)
		err = queued_signals_write(w);
	if (!err)
		err = aio_requests_write(w);
	if (!err)
		err = save_fds(w, snap->fds);
	if (!err)
		err = save_memory(w, shared_key, snap->fds, snap->shm, snap->advice,
				  snap->mode.compression, inc);
	if (!err)
		err = increments_write_sources(inc, w);
	if (!err)
		err = sysv_ipc_write(w, snap->sysv);
	if (!err)
		err = iw_record(w, CKPT_REC_END, end_marker, sizeof(end_marker));
	return err;
}

static void image_name(char *name, size_t size, pid_t pid)
{
	snprintf(name, size, "%s-%d.img", shim_hostname(), pid);
}

/* Write <dir>/<host>-<pid>.img; detail gets the DONE keys or the error. */
static int write_file(const char *dir, const struct snapshot *snap, const char *shared_key,
		      char *detail, size_t size)
{
	struct image_writer *w;
	struct increments *inc = NULL;
	uint64_t bytes = 0, xxh = 0;
	int64_t t0 = shim_now_ns();
	char name[128], keys[768] = "";	/* up to 64 sources */
	int dirfd, err;

	image_name(name, sizeof(name), snap->pid);
	dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dirfd < 0) {
		err = errno;
		snprintf(detail, size, "cannot open %s: %s", dir, shim_strerror(err));
		return err;
	}
	w = iw_open(dirfd, name);
	if (w && snap->mode.incremental) {
		inc = increments_begin(dirfd, name, snap->mode.parent_dir, &err);
		if (!inc) {
			iw_abort(w, dirfd, name);
			errno = err;
			w = NULL;
		}
	}
	if (!w) {
		err = errno;
		snprintf(detail, size, "cannot create %s/%s: %s", dir, name, shim_strerror(err));
		goto out;
	}
	err = write_records(w, snap, shared_key, inc);
	if (err) {
		iw_abort(w, dirfd, name);
	} else {
		err = iw_finish(w, &bytes, &xxh);
		if (!err && inc) {
			err = increments_finish(inc, dirfd, name, bytes, xxh, keys, sizeof(keys));
			inc = NULL;	/* finished, or removed if it failed */
		}
		if (err) {
			char sums[140];

			iw_sums_name(sums, sizeof(sums), name);
			unlinkat(dirfd, name, 0);
			unlinkat(dirfd, sums, 0);
		}
	}
	increments_abort(inc, dirfd);
	if (err)
		snprintf(detail, size, "writing %s/%s: %s", dir, name, shim_strerror(err));
	else
		snprintf(detail, size, "file=%s size=%llu xxh3=%016llx write_ns=%lld%s", name,
			 (unsigned long long)bytes, (unsigned long long)xxh,
			 (long long)(shim_now_ns() - t0), keys);
out:
	close(dirfd);
	return err;
}

/* advice: read already (a forked write looks at it first), or NULL */
static int take_snapshot(struct snapshot *snap, unsigned seq, const struct ckpt_thread *self,
			 struct vma_advice_table *advice, char *detail, size_t size)
{
	int err = 0;

	snap->pid = getpid();
	snap->self = self;
	snap->fds = NULL;
	snap->shm = NULL;
	snap->sysv = NULL;
	snap->advice = advice ? advice : vma_advice_read(&err);
	if (!snap->advice) {
		snprintf(detail, size, "reading /proc/self/smaps: %s", shim_strerror(err));
		return err;
	}
	snap->proc = scratch_map(sizeof(*snap->proc));
	if (!snap->proc) {
		vma_advice_free(snap->advice);
		return ENOMEM;
	}
	err = collect_process(snap->proc, detail, size);	/* timers do not survive fork */
	snap->proc->future_locks = vma_advice_future(snap->advice);
	if (!err)
		err = sysv_ipc_snapshot(seq, &snap->sysv, detail, size);
	if (!err) {
		snap->fds = fds_collect(seq);
		if (!snap->fds) {
			err = ENOMEM;
			snprintf(detail, size, "reading the fd table failed");
		}
	}
	if (err) {
		sysv_ipc_free(snap->sysv);
		scratch_unmap(snap->proc, sizeof(*snap->proc));
		vma_advice_free(snap->advice);
	}
	return err;
}

static void drop_snapshot(struct snapshot *snap)
{
	vma_advice_free(snap->advice);
	shm_snapshot_free(snap->shm);
	sysv_ipc_free(snap->sysv);
	fds_release(snap->fds);
	scratch_unmap(snap->proc, sizeof(*snap->proc));
}

/* Shared memory is saved once per host and checkpoint: by the process
 * that claims it under this key (state/memory.c). */
static void shared_key(char *key, size_t size, unsigned seq)
{
	snprintf(key, size, "shm:%u:%s", seq, shim_hostname());
}

/* mkdir -p, the directories made private (another user's job may stage
 * on the same node). */
static int make_dirs(char *path)
{
	for (char *p = path + 1;; p++) {
		char c = *p;

		if (c != '/' && c != '\0')
			continue;
		*p = '\0';
		if (mkdir(path, 0700) && errno != EEXIST) {
			*p = c;
			return errno;
		}
		*p = c;
		if (!c)
			return 0;
	}
}

/*
 * A link to the job's stage directory (<stage>/<job>) in the job's
 * node-local directory, when it has one (CKPT_RUNTIME_DIR, under Slurm):
 * the epilog removes the staged copies it points to once the job ended
 * on the node.  Best effort: without it the copies only stay longer.
 */
static void stage_link(const char *stage_dir)
{
	const char *runtime = getenv("CKPT_RUNTIME_DIR");
	char job_dir[PATH_MAX], link[PATH_MAX];
	char *slash;

	if (!runtime || !*runtime)
		return;
	snprintf(job_dir, sizeof(job_dir), "%s", stage_dir);
	slash = strrchr(job_dir, '/');		/* <stage>/<job>/ckpt-NNNN */
	if (!slash || slash == job_dir)
		return;
	*slash = '\0';
	slash = strrchr(job_dir, '/');
	if (!slash || snprintf(link, sizeof(link), "%s/stage-%s", runtime, slash + 1) >=
		      (int)sizeof(link))
		return;
	if (symlink(job_dir, link) && errno != EEXIST)
		ckpt_warn("cannot link the stage directory into %s: %s", runtime,
			  shim_strerror(errno));
}

/* The node-local directory of a staged checkpoint, without a copy left
 * there by an earlier attempt at the same checkpoint. */
static int stage_prepare(const char *stage_dir, pid_t pid, char *detail, size_t size)
{
	char path[PATH_MAX], name[128];
	int err;

	if (snprintf(path, sizeof(path), "%s", stage_dir) >= (int)sizeof(path))
		err = ENAMETOOLONG;
	else
		err = make_dirs(path);
	if (err) {
		snprintf(detail, size, "cannot make stage directory %s: %s", stage_dir,
			 shim_strerror(err));
		return err;
	}
	stage_link(stage_dir);
	image_name(name, sizeof(name), pid);
	snprintf(path, sizeof(path), "%s/%s", stage_dir, name);
	unlink(path);
	snprintf(path, sizeof(path), "%s/%s.pages", stage_dir, name);
	unlink(path);
	snprintf(path, sizeof(path), "%s/%s.sum", stage_dir, name);
	unlink(path);
	return 0;
}

/*
 * Become ckpt-flush (native/flush/), which copies the staged image to
 * dir and reports on `report` as a writer does.  exec lets go of the
 * copy-on-write snapshot; the program runs without the shim (its only
 * environment is the Slurm job id, by which the epilog finds a copier
 * the job left behind).  Returns only on failure.
 */
static int flush_exec(const char *dir, const struct write_mode *mode, pid_t pid,
		      const char *keys, int report, int result, char *detail, size_t size)
{
	char name[128], sums[140], pages[140];
	const char *argv[] = { "ckpt-flush", mode->stage_dir, dir, keys, name, sums,
			       mode->incremental ? pages : NULL, NULL };
	const char *slurm_job = getenv("SLURM_JOB_ID");
	char job_var[64];
	const char *envp[] = { slurm_job ? job_var : NULL, NULL };
	sigset_t none;
	int r = fcntl(report, F_DUPFD_CLOEXEC, 10), s = fcntl(result, F_DUPFD_CLOEXEC, 10);
	int null = open("/dev/null", O_RDWR | O_CLOEXEC);

	image_name(name, sizeof(name), pid);
	iw_sums_name(sums, sizeof(sums), name);
	snprintf(pages, sizeof(pages), "%s.pages", name);
	if (slurm_job)
		snprintf(job_var, sizeof(job_var), "SLURM_JOB_ID=%s", slurm_job);
	/* none of the application's fds stays open in it: not even stdio,
	 * whose reader would wait for the copy to end to see EOF */
	if (r < 0 || s < 0 || null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0 ||
	    dup2(null, 2) < 0 || dup2(r, 3) < 0 || dup2(s, 4) < 0) {
		snprintf(detail, size, "starting the flush: %s", shim_strerror(errno));
		return errno;
	}
	syscall(SYS_close_range, 5, ~0U, 0);
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	execve(exec_flusher_path(), (char **)argv, (char **)envp);
	snprintf(detail, size, "cannot run %s: %s", exec_flusher_path(), shim_strerror(errno));
	/* close_range took the report's own number: fd 3 is the pipe now */
	if (dup2(3, report) < 0)
		return EIO;
	return ENOEXEC;
}

/* The image goes to the stage directory when there is one (made ready
 * first), else straight to dir; detail gets the DONE keys or the error. */
static int write_first_copy(const char *dir, const struct snapshot *snap, const char *shared_key,
			    char *detail, size_t size)
{
	int err = 0;

	if (snap->mode.stage_dir)
		err = stage_prepare(snap->mode.stage_dir, snap->pid, detail, size);
	if (!err)
		err = write_file(snap->mode.stage_dir ? snap->mode.stage_dir : dir, snap, shared_key,
				 detail, size);
	return err;
}

/*
 * The writer's result, for when its process is gone before SYNC (it
 * exited, execed or was killed once resumed): the image is complete all
 * the same.  <image>.done.tmp is made and locked (flock) before the fork;
 * the writer holds the lock until it exits, having written its DONE keys
 * there and renamed it <image>.done.  The coordinator reads that, or sees
 * the lock free and no result: the writer died.
 */
static void result_paths(const char *dir, pid_t pid, char *path, char *tmp, size_t size)
{
	char name[128];

	image_name(name, sizeof(name), pid);
	snprintf(path, size, "%s/%s.done", dir, name);
	snprintf(tmp, size, "%s/%s.done.tmp", dir, name);
}

static int result_open(const char *dir, pid_t pid)
{
	char path[PATH_MAX], tmp[PATH_MAX];
	int fd;

	result_paths(dir, pid, path, tmp, sizeof(path));
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB)) {
		close(fd);
		return -1;
	}
	return fd;
}

static void result_leave(int fd, const char *dir, pid_t pid, const char *line, size_t len)
{
	char path[PATH_MAX], tmp[PATH_MAX];

	result_paths(dir, pid, path, tmp, sizeof(path));
	if (write(fd, line, len) != (ssize_t)len || rename(tmp, path))
		unlink(tmp);
}

static void writer_child(const char *dir, const void *arg, int report, int result)
{
	const struct snapshot *snap = arg;
	char detail[1024], line[1100];
	int err, n;

	warnings_to_fd(report);
	/* no claims from here: the control connection is the parent's, which
	 * claimed and copied the shared memory to save */
	err = write_first_copy(dir, snap, NULL, detail, sizeof(detail));
	if (!err && snap->mode.stage_dir) {	/* the copy replaces this process */
		char keys[1024];

		snprintf(keys, sizeof(keys), "%s", detail);
		err = flush_exec(dir, &snap->mode, snap->pid, keys, report, result, detail,
				 sizeof(detail));
	}
	n = err ? snprintf(line, sizeof(line), "FAIL %d %s\n", err, detail) :
		  snprintf(line, sizeof(line), "DONE %s\n", detail);
	if (!err)
		result_leave(result, dir, snap->pid, line + 5, n - 5);
	if (write(report, line, n) != n)
		err = EIO;
	syscall(SYS_exit_group, err ? 1 : 0);
}

/*
 * A child that reports on a pipe (WARN lines, then DONE or FAIL) and holds
 * <image>.done.tmp locked: run(dir, arg, pipe, result fd) in it, which
 * never returns.  A bare clone: exit signal 0.  Returns the child's pid,
 * the one SYNC waits for, or -1 with *err.
 */
static long start_reporter(const char *dir,
			   void (*run)(const char *, const void *, int, int),
			   const void *arg, int *err)
{
	int p[2], result = result_open(dir, getpid());
	long child;

	if (result < 0 || pipe2(p, O_CLOEXEC)) {
		*err = errno;
		if (result >= 0)
			close(result);
		return -1;
	}
	child = syscall(SYS_clone, 0L, 0L, NULL, NULL, 0L);
	if (child == 0) {
		child_pid = syscall(SYS_getpid);
		close(p[0]);
		run(dir, arg, p[1], result);
	}
	*err = child < 0 ? errno : 0;
	close(p[1]);
	close(result);	/* the child's copy holds the lock */
	if (child < 0) {
		close(p[0]);
		return -1;
	}
	writer_pid = child;
	writer_pipe = p[0];
	return child;
}

/* Whether this process is a forked writer (or a copier before its exec). */
int image_writer_process(void)
{
	return child_pid && child_pid == syscall(SYS_getpid);
}

/*
 * Snapshot now, write in a child.  Returns 0 with the child running, or
 * EAGAIN when a forked write is not possible here (the caller writes in
 * place), or another errno.
 */
int image_write_forked(const char *dir, unsigned seq, const struct ckpt_thread *self,
		       const struct write_mode *mode, char *detail, size_t size)
{
	struct snapshot snap;
	char key[128];
	uint64_t copied;
	struct vma_advice_table *advice;
	int err;
	long child;

	advice = vma_advice_read(&err);
	/* Memory a child would not see (MADV_DONTFORK, MADV_WIPEONFORK, as
	 * RDMA libraries use for registered buffers) rules out a forked
	 * write.  (Shared memory, which would change under its feet, is
	 * copied for it.) */
	if (!advice || vma_advice_unforkable(advice)) {
		vma_advice_free(advice);
		return EAGAIN;
	}
	err = take_snapshot(&snap, seq, self, advice, detail, size);
	if (err)
		return err;
	snap.mode = *mode;
	shared_key(key, sizeof(key), seq);
	snap.shm = snapshot_shared_memory(key, &err);
	if (!snap.shm) {	/* too much shared memory to copy: in place */
		drop_snapshot(&snap);
		return EAGAIN;
	}
	child = start_reporter(dir, writer_child, &snap, &err);
	writer_staged = mode->stage_dir != NULL;
	copied = shm_snapshot_bytes(snap.shm);
	drop_snapshot(&snap);
	if (child < 0) {
		snprintf(detail, size, "forked write: %s", shim_strerror(err));
		return err;
	}
	image_name(key, sizeof(key), getpid());
	snprintf(detail, size, "forked=%ld file=%s shm_copied=%llu", child, key,
		 (unsigned long long)copied);
	return 0;
}

struct flush_start {
	const struct write_mode *mode;
	pid_t pid;			/* the application's */
	const char *keys;
};

static void flusher_child(const char *dir, const void *arg, int report, int result)
{
	const struct flush_start *f = arg;
	char detail[512], line[600];
	int err = flush_exec(dir, f->mode, f->pid, f->keys, report, result, detail,
			     sizeof(detail));
	int n = snprintf(line, sizeof(line), "FAIL %d %s\n", err, detail);

	if (write(report, line, n) != n)
		syscall(SYS_exit_group, 2);
	syscall(SYS_exit_group, 1);
}

/* In place and staged: a child becomes ckpt-flush while the job resumes;
 * SYNC waits for it as for a forked writer. */
static int start_flusher(const char *dir, const struct write_mode *mode, const char *keys,
			 char *detail, size_t size)
{
	struct flush_start f = { mode, getpid(), keys };
	char name[128];
	int err;
	long child = start_reporter(dir, flusher_child, &f, &err);

	writer_staged = 1;
	if (child < 0) {
		snprintf(detail, size, "starting the flush: %s", shim_strerror(err));
		return err;
	}
	image_name(name, sizeof(name), getpid());
	snprintf(detail, size, "flushing=%ld file=%s", child, name);
	return 0;
}

int image_write_now(const char *dir, unsigned seq, const struct ckpt_thread *self,
		    const struct write_mode *mode, char *detail, size_t size)
{
	struct snapshot snap;
	char key[128];
	int err = take_snapshot(&snap, seq, self, NULL, detail, size);

	if (err)
		return err;
	snap.mode = *mode;
	shared_key(key, sizeof(key), seq);
	err = write_first_copy(dir, &snap, key, detail, size);
	drop_snapshot(&snap);
	if (!err && mode->stage_dir) {	/* the copy runs on once the job resumed */
		char keys[1024];

		snprintf(keys, sizeof(keys), "%s", detail);
		err = start_flusher(dir, mode, keys, detail, size);
	}
	return err;
}

static void writer_reap(void)
{
	int status;

	while (waitpid(writer_pid, &status, __WALL) < 0 && errno == EINTR)
		;
	close(writer_pipe);
	writer_pid = 0;
	writer_pipe = -1;
}

static void writer_line(char *line, int *err, char *detail, size_t size)
{
	if (!strncmp(line, "WARN ", 5)) {
		ckpt_warn("%s", line + 5);
	} else if (!strncmp(line, "DONE ", 5)) {
		snprintf(detail, size, "%s", line + 5);
		*err = 0;
	} else if (!strncmp(line, "FAIL ", 5)) {
		char *msg = strchr(line + 5, ' ');

		*err = atoi(line + 5);
		snprintf(detail, size, "%s", msg ? msg + 1 : "forked write failed");
	}
}

/* SYNC: wait for the forked writer: its report, line by line until it
 * closes the pipe, then reap it.  Without a forked writer there is
 * nothing to wait for. */
int image_write_wait(char *detail, size_t size)
{
	char buf[4096];
	size_t len = 0;
	int err = EIO;

	detail[0] = '\0';
	if (!writer_pid)
		return 0;
	snprintf(detail, size, "%s", writer_staged ? "the writer or copier of its staged image died"
						   : "its forked writer died");
	for (;;) {
		ssize_t n = read(writer_pipe, buf + len, sizeof(buf) - 1 - len);
		char *line, *nl;

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += n;
		buf[len] = '\0';
		for (line = buf; (nl = strchr(line, '\n')); line = nl + 1) {
			*nl = '\0';
			writer_line(line, &err, detail, size);
		}
		len -= line - buf;
		memmove(buf, line, len);
		if (len == sizeof(buf) - 1)
			len = 0;	/* an overlong line: drop it */
	}
	writer_reap();
	return err;
}

/* An aborted checkpoint: the child's file is about to be deleted. */
void image_write_cancel(void)
{
	if (!writer_pid)
		return;
	kill(writer_pid, SIGKILL);
	writer_reap();
}

/* After a restart or a fork: the writer belonged to the old process. */
void image_writer_forget(void)
{
	writer_pid = 0;
	writer_pipe = -1;
	warnings_to_fd(-1);
}
