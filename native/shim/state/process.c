/* The process record (kernel state that memory does not carry) and the
 * thread records. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <linux/prctl.h>
#include <linux/membarrier.h>
#include "linux_compat.h"
#include "shim.h"

/* The mm fields of /proc/self/stat (fields 26-28 and 45-51, see proc(5)). */
static int read_mm_fields(struct ckpt_process *p)
{
	struct ckpt_proc_stat st;
	int err = ckpt_stat_read("/proc/self/stat", &st);

	if (err)
		return err < 0 ? -err : err;
	p->start_code = st.start_code;
	p->end_code = st.end_code;
	p->start_stack = st.start_stack;
	p->start_data = st.start_data;
	p->end_data = st.end_data;
	p->start_brk = st.start_brk;
	p->arg_start = st.arg_start;
	p->arg_end = st.arg_end;
	p->env_start = st.env_start;
	p->env_end = st.env_end;
	p->brk = (uint64_t)syscall(SYS_brk, 0);
	return 0;
}

static void read_sigactions(struct ckpt_process *p)
{
	for (int sig = 1; sig < CKPT_NSIG; sig++) {
		if (sig == SIGKILL || sig == SIGSTOP)
			continue;
		syscall(SYS_rt_sigaction, sig, NULL, &p->sigactions[sig], 8);
	}
}

static void read_limits_and_timers(struct ckpt_process *p)
{
	static const int which[3] = { ITIMER_REAL, ITIMER_VIRTUAL, ITIMER_PROF };

	for (int i = 0; i < 3; i++) {
		struct itimerval it;

		if (getitimer(which[i], &it))
			continue;
		p->itimers[i].interval_sec = it.it_interval.tv_sec;
		p->itimers[i].interval_usec = it.it_interval.tv_usec;
		p->itimers[i].value_sec = it.it_value.tv_sec;
		p->itimers[i].value_usec = it.it_value.tv_usec;
	}
	for (int r = 0; r < CKPT_NRLIMITS && r < RLIM_NLIMITS; r++) {
		struct rlimit rl;

		if (getrlimit(r, &rl) == 0) {
			p->rlimits[r].cur = rl.rlim_cur;
			p->rlimits[r].max = rl.rlim_max;
		}
	}
}

/*
 * POSIX timers, from /proc/self/timers ("ID:", "signal: SIG/SIGVAL",
 * "notify: signal|none/pid|tid.N", "ClockID:" per timer) and each one's
 * timer_gettime.  Restored by restore_posix_timers (native/restart/state/process.c).
 */
static int parse_timer(char *block, struct ckpt_posix_timer *t)
{
	char how[16], whom[8];
	unsigned long long sigval;
	long long nr;
	char *l;

	memset(t, 0, sizeof(*t));
	if (sscanf(block, "ID: %d", &t->id) != 1 || !(l = strstr(block, "\nsignal: ")) ||
	    sscanf(l, "\nsignal: %d/%llx", &t->signo, &sigval) != 2 ||
	    !(l = strstr(block, "\nnotify: ")) ||
	    sscanf(l, "\nnotify: %15[a-z]/%7[a-z].%lld", how, whom, &nr) != 3 ||
	    !(l = strstr(block, "\nClockID: ")) || sscanf(l, "\nClockID: %d", &t->clockid) != 1)
		return EINVAL;
	t->sigval = sigval;
	if (!strcmp(how, "none"))
		t->notify = SIGEV_NONE;
	else if (!strcmp(how, "signal"))
		t->notify = strcmp(whom, "tid") ? SIGEV_SIGNAL : SIGEV_THREAD_ID;
	else
		return ENOTSUP;	/* the kernel's own SIGEV_THREAD: glibc never asks for it */
	if (t->notify == SIGEV_THREAD_ID)
		t->tid = (int32_t)nr;
	return 0;
}

static int read_posix_timers(struct ckpt_process *p)
{
	char buf[CKPT_MAX_TIMERS * 128], *block, *next;
	ssize_t n = ckpt_read_file("/proc/self/timers", buf, sizeof(buf) - 1);

	if (n < 0)
		return 0;	/* a kernel without it: no timers to see */
	if (n == (ssize_t)sizeof(buf) - 1)
		return E2BIG;
	buf[n] = '\0';
	/* one block per timer, each from its "ID:" line ("ClockID:" is not one) */
	for (block = strncmp(buf, "ID: ", 4) ? NULL : buf; block; block = next) {
		struct ckpt_posix_timer *t = &p->timers[p->ntimers];
		struct itimerspec its;
		int err;

		next = strstr(block, "\nID: ");
		if (next)
			*next++ = '\0';
		if (p->ntimers == CKPT_MAX_TIMERS)
			return E2BIG;
		err = parse_timer(block, t);
		if (err)
			return err;
		if (syscall(SYS_timer_gettime, t->id, &its))
			return errno;
		t->interval_ns = its.it_interval.tv_sec * 1000000000LL + its.it_interval.tv_nsec;
		t->value_ns = its.it_value.tv_sec * 1000000000LL + its.it_value.tv_nsec;
		p->ntimers++;
	}
	return 0;
}

/* Attributes set with prctl; restored by restore_prctl_attributes
 * (native/restart/state/process.c).  Raw calls: the shim's prctl() may dlsym. */
static void read_prctl_attributes(struct ckpt_process *p)
{
	int subreaper = 0;

	p->dumpable = syscall(SYS_prctl, PR_GET_DUMPABLE, 0, 0, 0, 0);
	if (syscall(SYS_prctl, PR_GET_CHILD_SUBREAPER, &subreaper, 0, 0, 0) == 0)
		p->child_subreaper = subreaper != 0;
	p->thp_disable = syscall(SYS_prctl, PR_GET_THP_DISABLE, 0, 0, 0, 0) == 1;
	p->mdwe = syscall(SYS_prctl, PR_GET_MDWE, 0, 0, 0, 0);	/* < 0: not offered */
	if ((int32_t)p->mdwe < 0)
		p->mdwe = 0;
}

/* Which private expedited membarrier() commands the process registered
 * for: a command it did not register for fails with EPERM, so each is
 * tried (a barrier on threads that are all parked).  Restored by
 * restore_membarrier (native/restart/state/process.c). */
static void read_membarrier(struct ckpt_process *p)
{
	static const struct {
		int cmd;
		uint32_t bit;
	} tried[] = {
		{ MEMBARRIER_CMD_PRIVATE_EXPEDITED, CKPT_MEMBARRIER_PRIVATE_EXPEDITED },
		{ MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE, CKPT_MEMBARRIER_SYNC_CORE },
		{ MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ, CKPT_MEMBARRIER_RSEQ },
	};

	p->membarrier = 0;
	for (unsigned i = 0; i < sizeof(tried) / sizeof(tried[0]); i++)
		if (syscall(SYS_membarrier, tried[i].cmd, 0, 0) == 0)
			p->membarrier |= tried[i].bit;
}

/* The executable as it was at the last checkpoint: a restarted process
 * finds it here (this variable is part of the image). */
static char checkpointed_exe[CKPT_PATH_MAX];

/* One /proc/<pid>/stat: is it our child?  Its state, and for a zombie its
 * exit status.  (No /proc/<pid>/task/<tid>/children on every kernel: we
 * look at every process.) */
static int our_child(pid_t pid, pid_t self, char *state, int *status)
{
	struct ckpt_proc_stat st;

	if (ckpt_stat_read_pid(pid, &st) || st.ppid != self)
		return 0;
	*state = st.state;
	*status = st.exit_code;
	return st.state != 'Z' || st.last_field >= 52;
}

struct child_walk {
	void (*fn)(pid_t, char, int, void *);
	void *arg;
	pid_t self;
};

static int visit_child(int dfd, const char *name, uint64_t ino, void *arg)
{
	struct child_walk *w = arg;
	pid_t pid = (pid_t)strtol(name, NULL, 10);
	int status = 0;
	char state = 0;

	if (pid > 0 && our_child(pid, w->self, &state, &status))
		w->fn(pid, state, status, w->arg);
	return 0;
}

/* Calls fn(pid, state, status, arg) for each child of this process. */
static void for_each_child(void (*fn)(pid_t, char, int, void *), void *arg)
{
	struct child_walk w = { fn, arg, getpid() };

	ckpt_dir_walk("/proc", visit_child, &w);
}

static void add_zombie(pid_t pid, char state, int status, void *arg)
{
	struct ckpt_process *p = arg;

	if (state != 'Z' || p->nzombies == CKPT_MAX_ZOMBIES)
		return;
	p->zombies[p->nzombies].pid = pid;
	p->zombies[p->nzombies].status = status;
	p->nzombies++;
}

/* Children that exited and were not waited for: a restart recreates them
 * as zombies, so the parent's waitpid() still gets their status. */
static void collect_zombies(struct ckpt_process *p)
{
	for_each_child(add_zombie, p);
}

/* Whether the file at path contains needle (read in pieces that overlap). */
static int proc_file_contains(const char *path, const char *needle)
{
	char buf[8192 + 1];
	size_t keep = strlen(needle) - 1, have = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC), found = 0;
	ssize_t n;

	if (fd < 0)
		return 0;
	while (!found && (n = read(fd, buf + have, sizeof(buf) - 1 - have)) > 0) {
		have += n;
		buf[have] = '\0';
		found = strstr(buf, needle) != NULL;
		if (have > keep) {
			memmove(buf, buf + have - keep, keep);
			have = keep;
		}
	}
	close(fd);
	return found;
}

struct children_list {
	char *out;
	size_t size, len;
	const char *shim;
};

static void add_job_child(pid_t pid, char state, int status, void *arg)
{
	struct children_list *l = arg;
	char path[64];
	int n;

	if (state == 'Z')
		return;
	snprintf(path, sizeof(path), "/proc/%d/maps", pid);
	if (!proc_file_contains(path, l->shim))
		return;
	n = snprintf(l->out + l->len, l->size - l->len, "%s%d", l->len ? "," : "", (int)pid);
	if (n > 0 && (size_t)n < l->size - l->len)
		l->len += n;
	else
		l->out[l->len] = '\0';	/* no half pid */
}

/*
 * The live children that have the shim: each is in the job, or is about
 * to say so (forked just before SUSPEND, its HELLO may still be on its
 * way).  The coordinator waits for those it does not know yet.
 */
void process_job_children(char *out, size_t size)
{
	struct children_list l = { out, size, 0, exec_shim_name() };

	out[0] = '\0';
	if (l.shim[0])
		for_each_child(add_job_child, &l);
}

/* Collected in the process itself: a forked writer has no itimers. */
int collect_process(struct ckpt_process *p, char *detail, size_t size)
{
	ssize_t n;
	int err;

	memset(p, 0, sizeof(*p));
	p->umask = umask(022);
	umask(p->umask);
	p->pgid = getpgid(0);
	p->sid = getsid(0);
	p->ppid = getppid();
	pty_controlling_terminal(p);
	err = read_mm_fields(p);
	if (err) {
		snprintf(detail, size, "reading process state: %s", shim_strerror(err));
		return err;
	}
	n = ckpt_read_file("/proc/self/auxv", (char *)p->auxv, sizeof(p->auxv));
	p->auxv_words = n > 0 ? n / 8 : 0;
	read_sigactions(p);
	read_limits_and_timers(p);
	read_prctl_attributes(p);
	read_membarrier(p);
	err = read_posix_timers(p);
	if (err == E2BIG)
		snprintf(detail, size, "more than %d POSIX timers: not supported", CKPT_MAX_TIMERS);
	else if (err)
		snprintf(detail, size, "reading its POSIX timers: %s", shim_strerror(err));
	if (err)
		return err;
	/* an interval timer's SIGALRM that is pending (blocked while we
	 * park) is also not re-armed yet */
	p->shared_pending = shim_status_mask("/proc/self/status", "ShdPnd:");
	queued_signals_take_process(p);
	collect_zombies(p);
	if (!getcwd(p->cwd, sizeof(p->cwd))) {
		err = errno;
		snprintf(detail, size, "its working directory: %s", shim_strerror(err));
		return err;
	}
	n = readlink("/proc/self/exe", p->exe, sizeof(p->exe) - 1);
	if (n > 0)
		p->exe[n] = '\0';
	memcpy(checkpointed_exe, p->exe, sizeof(checkpointed_exe));
	return 0;
}

/* The file mapped at addr, opened through /proc/self/map_files (which
 * takes CAP_SYS_ADMIN, as PR_SET_MM_MAP does); -1 if none. */
static int open_mapped_file(uint64_t addr)
{
	size_t size = 1 << 20;		/* the program's text is near the start */
	char *buf = scratch_map(size), path[64];
	unsigned long long start, end;
	int fd = -1;

	if (!buf)
		return -1;
	if (ckpt_read_file("/proc/self/maps", buf, size - 1) > 0)
		for (char *line = buf; line && *line; line = strchr(line, '\n'), line += !!line)
			if (sscanf(line, "%llx-%llx", &start, &end) == 2 && addr >= start &&
			    addr < end) {
				snprintf(path, sizeof(path), "/proc/self/map_files/%llx-%llx", start,
					 end);
				fd = open(path, O_RDONLY | O_CLOEXEC);
				break;
			}
	scratch_unmap(buf, size);
	return fd;
}

/*
 * After a restart /proc/self/exe names ckpt-restart: the kernel lets
 * PR_SET_MM_MAP replace it only once ckpt-restart's file is no longer
 * mapped, which is the case once the checkpoint thread gave the reserved
 * range back.  Needs CAP_SYS_ADMIN in our user namespace, which the
 * restarted process has (nobody exec'd since the namespace was made).  An
 * executable that was deleted, or a memfd, is the file its text is
 * mapped from now (a copy the restart made).
 */
int restore_exe_link(void)
{
	struct ckpt_process *p = scratch_map(sizeof(*p));
	struct prctl_mm_map map;
	ssize_t n;
	int fd = -1, err = 0;

	if (!p)
		return ENOMEM;
	if (read_mm_fields(p)) {
		err = EIO;
		goto out;
	}
	fd = checkpointed_exe[0] ? open(checkpointed_exe, O_RDONLY | O_CLOEXEC) : -1;
	if (fd < 0)	/* a deleted executable, or a memfd: its restored text */
		fd = open_mapped_file(p->start_code);
	if (fd < 0) {
		err = ENOENT;
		goto out;
	}
	n = ckpt_read_file("/proc/self/auxv", (char *)p->auxv, sizeof(p->auxv));
	map = (struct prctl_mm_map){
		.start_code = p->start_code, .end_code = p->end_code,
		.start_data = p->start_data, .end_data = p->end_data,
		.start_brk = p->start_brk, .brk = p->brk, .start_stack = p->start_stack,
		.arg_start = p->arg_start, .arg_end = p->arg_end,
		.env_start = p->env_start, .env_end = p->env_end,
		.auxv = (__u64 *)p->auxv, .auxv_size = n > 0 ? n : 0, .exe_fd = fd,
	};
	if (syscall(SYS_prctl, PR_SET_MM, PR_SET_MM_MAP, &map, sizeof(map), 0))
		err = errno;
out:
	if (fd >= 0)
		close(fd);
	scratch_unmap(p, sizeof(*p));
	return err;
}

int save_threads(struct image_writer *w, const struct ckpt_thread *self)
{
	int err = iw_record(w, CKPT_REC_THREAD, self, sizeof(*self));

	for (unsigned i = 0; !err && i < quiesce_count(); i++) {
		const struct parked_thread *t = quiesce_thread(i);

		if (t)
			err = iw_record(w, CKPT_REC_THREAD, &t->rec, sizeof(t->rec));
	}
	return err;
}
