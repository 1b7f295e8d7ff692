/*
 * The process tree of a restart.  pid 1 of the namespace creates the
 * roots (processes whose parent is not in the job); each restored process
 * first takes its session and process group, then creates its own
 * children and its unwaited-for zombies, all with their original pids
 * (clone3 set_tid), and only then restores itself.  So parents, sessions
 * and process groups come back as they were, and waitpid() works.
 *
 * A process that fails to restore says why on stderr, reports its status
 * to pid 1 on a pipe and kills the namespace's other processes: pid 1
 * then ends the restart with that status.
 *
 * The job lives as long as any of its processes: when the root exits while
 * others run (daemons, orphans), pid 1 says so on the status fd and goes
 * on until the last one is gone.  A job whose launcher's child had already
 * exited at the checkpoint has no main root: each root's session is made
 * by a stand-in, as a daemon's is, and pid 1 is their parent.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "restart.h"
#include "sys.h"

static struct image *images;
static unsigned nimages;
static int (*restore_one)(void *);
static int report[2] = { -1, -1 };
static struct image *root;		/* the launcher's child, or NULL */
static pid_t root_pid;			/* whose status is the job's */
static int status_fd = -1;		/* "exited N" once the root is gone */

static struct image *image_of(pid_t pid)
{
	for (unsigned i = 0; i < nimages; i++)
		if (images[i].hdr.pid == pid)
			return &images[i];
	return NULL;
}

int tree_has_process(pid_t pid)
{
	return image_of(pid) != NULL;
}

const struct image *tree_image(pid_t pid)
{
	return image_of(pid);
}

static int outside(pid_t pid);

/*
 * A root (its parent outside the job) in a session that is neither the
 * main root's nor the job's: a daemon (fork, setsid, fork), whose
 * session's leader exited.  A stand-in with the session's pid makes the
 * session again, creates such roots in it and exits, as that leader did.
 */
static int detached_root(const struct image *img)
{
	pid_t sid = img->proc->sid;

	return !image_of(img->proc->ppid) && sid > 1 && outside(sid) &&
	       (!root || sid != root->proc->sid);
}

/* A stand-in's pid: what the main root or a detached root had outside the
 * job (parent, session, group). */
static int stand_in_pid(pid_t pid)
{
	if (!outside(pid))
		return 0;
	if (root && (pid == root->proc->sid || pid == root->proc->pgid ||
		     pid == root->proc->ppid))
		return 1;
	for (unsigned i = 0; i < nimages; i++)
		if (detached_root(&images[i]) &&
		    (pid == images[i].proc->sid || pid == images[i].proc->pgid))
			return 1;
	return 0;
}

/* Whether pid is one the restart gives to a process or thread of the job
 * or to a stand-in. */
int tree_pid_taken(pid_t pid)
{
	if (stand_in_pid(pid))
		return 1;
	for (unsigned i = 0; i < nimages; i++) {
		const struct image *img = &images[i];

		if (img->hdr.pid == pid)
			return 1;
		for (unsigned t = 0; t < img->nthreads; t++)
			if (img->threads[t].tid == pid)
				return 1;
		for (unsigned z = 0; z < img->proc->nzombies && z < CKPT_MAX_ZOMBIES; z++)
			if (img->proc->zombies[z].pid == pid)
				return 1;
	}
	return 0;
}

static pid_t spawn(pid_t pid, void *stack_top, int (*fn)(void *), void *arg)
{
	struct clone_args ca;
	long r;

	memset(&ca, 0, sizeof(ca));
	ca.exit_signal = SIGCHLD;
	if (stack_top) {
		ca.stack = (uint64_t)stack_top - ZONE_STACK_SIZE;
		ca.stack_size = ZONE_STACK_SIZE;
	}
	ca.set_tid = (uint64_t)&pid;
	ca.set_tid_size = 1;
	r = clone3_run(&ca, sizeof(ca), fn, arg);
	if (r < 0)
		die("cannot create process %d (clone3 set_tid): %s", pid, strerror(-r));
	return r;
}

/* A child that exited before the checkpoint, never waited for: it exits
 * again the same way and stays a zombie until its parent waits. */
static int zombie_main(void *arg)
{
	const struct ckpt_zombie *z = arg;
	struct rlimit no_core = { 0, 0 };
	sigset_t none;

	if (!WIFSIGNALED(z->status))
		return WEXITSTATUS(z->status);
	setrlimit(RLIMIT_CORE, &no_core);
	signal(WTERMSIG(z->status), SIG_DFL);
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	/* raw: glibc's raise() would use the parent's cached tid */
	sys2(SYS_kill, sys0(SYS_getpid), WTERMSIG(z->status));
	return 128 + WTERMSIG(z->status);
}

static void restore_failed(int status);

/*
 * Join process group pgid, led by another restored process or stand-in.
 * Its leader makes the group on its own schedule, without waiting for
 * anyone, so until it has, setpgid fails with EPERM: try again.
 */
static void join_group(pid_t pgid)
{
	struct timespec pause_1ms = { 0, 1000000 };

	for (int tries = 0; setpgid(0, pgid) < 0; tries++) {
		if (errno != EPERM || tries == 10000)
			die("cannot join process group %d: %s", pgid, strerror(errno));
		nanosleep(&pause_1ms, NULL);
	}
}

static void take_session_and_group(const struct ckpt_process *p, pid_t pid)
{
	if (p->sid == pid)
		setsid();
	else if (p->pgid == pid)
		setpgid(0, 0);
}

void tree_enter(struct image *img)
{
	pid_t pid = img->hdr.pid;
	const struct ckpt_process *p = img->proc;

	set_failure_hook(restore_failed);
	take_session_and_group(p, pid);
	pty_take_controlling(p, pid);
	dev_ttys_open(img);	/* for the children to inherit */
	for (unsigned i = 0; i < nimages; i++)
		if (images[i].proc->ppid == pid && &images[i] != img)
			spawn(images[i].hdr.pid, NULL, restore_one, &images[i]);
	for (unsigned i = 0; i < p->nzombies && i < CKPT_MAX_ZOMBIES; i++)
		if (!image_of(p->zombies[i].pid))
			spawn(p->zombies[i].pid, NULL, zombie_main, (void *)&p->zombies[i]);
	/* a group led by another process of the job, or the root's group */
	if (p->pgid > 0 && p->pgid != pid && getpgid(0) != p->pgid &&
	    (image_of(p->pgid) || (root && p->pgid == root->proc->pgid) || detached_root(img)))
		join_group(p->pgid);
}

struct report {
	int32_t pid;
	int32_t status;			/* 0: reached its point of no return */
};

static void send_report(int32_t pid, int32_t status)
{
	struct report r = { pid, status };

	sys3(SYS_write, report[1], &r, sizeof(r));
}

/* Raw system calls: this may run after the point of no return. */
static void restore_failed(int status)
{
	send_report(sys0(SYS_getpid), status);
	sys2(SYS_kill, -1, SIGKILL);	/* every process of the namespace but pid 1 */
}

void tree_report_restored(struct image *img)
{
	send_report(img->hdr.pid, 0);
}

int tree_report_fd(void)
{
	return report[1];
}

/* The first failure reported, or 0. */
static int failure_reported(void)
{
	struct report r;

	while (read(report[0], &r, sizeof(r)) == sizeof(r))
		if (r.status)
			return r.status;
	return 0;
}

static int exit_status(int status)
{
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	return 128 + WTERMSIG(status);
}

static void forward_signal(int sig)
{
	if (root_pid > 0)
		kill(root_pid, sig);
}

/* The launcher's child: the first image whose parent is outside the job
 * and not pid 1 (the manifest lists it first).  NULL when it had exited
 * before the checkpoint and its orphans went to init. */
static struct image *root_image(void)
{
	int any = 0;

	for (unsigned i = 0; i < nimages; i++) {
		if (image_of(images[i].proc->ppid))
			continue;
		any = 1;
		if (images[i].proc->ppid > 1)
			return &images[i];
	}
	if (!any)
		die("the images form no process tree (every parent is in the job)");
	return NULL;
}

void tree_init(struct image *imgs, unsigned n, int (*restorer)(void *), int fd)
{
	images = imgs;
	nimages = n;
	restore_one = restorer;
	status_fd = fd;
	root = root_image();
	root_pid = root ? root->hdr.pid : images[0].hdr.pid;
	if (pipe2(report, O_CLOEXEC))
		die("cannot create a pipe: %s", strerror(errno));
	report[0] = move_high(report[0], "the restart's report pipe");
	report[1] = move_high(report[1], "the restart's report pipe");
}

/*
 * Stand-ins for what the job's root had outside the job: its parent (the
 * launcher), its session and its process group.  Each is a process with
 * that pid, so getppid(), getsid() and getpgid() in the job answer as
 * before, and kill(-pgid) reaches the same processes.  The session's
 * stand-in holds the group's, which sleeps, and the parent's, which
 * creates the roots and exits with the first one's status.
 */
static int outside(pid_t pid)
{
	return pid > 1 && !image_of(pid);
}

static int wait_for(pid_t pid)
{
	int status;

	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return EXIT_RESTORE_FAILED;
	return exit_status(status);
}

/* A subreaper's wait: every child, until pid's status. */
static int reap_until(pid_t pid)
{
	int status;

	for (;;) {
		pid_t got = waitpid(-1, &status, 0);

		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0)
			return EXIT_RESTORE_FAILED;
		if (got == pid)
			return exit_status(status);
	}
}

/* The roots (parent outside the job) whose parent is, or is not, ppid. */
static void spawn_roots(void *stack, pid_t ppid, int is_parent)
{
	for (unsigned i = 0; i < nimages; i++) {
		pid_t pp = images[i].proc->ppid;

		if (!image_of(pp) && (pp == ppid) == is_parent && !detached_root(&images[i]))
			spawn(images[i].hdr.pid, stack, restore_one, &images[i]);
	}
}

/* What the stand-in of a detached session is to create (set before the
 * fork-like spawn, so the stand-in has its own copy). */
static struct {
	pid_t sid, ppid;
	int is_parent;
	void *stack;
} detached;

static int detached_in(const struct image *img, pid_t sid)
{
	return detached_root(img) && img->proc->sid == sid &&
	       (img->proc->ppid == detached.ppid) == detached.is_parent;
}

static int group_stand_in(void *unused);
static void stand_in_drop_fds(void);

static int detached_session_stand_in(void *unused)
{
	(void)unused;
	setsid();
	for (unsigned i = 0; i < nimages; i++) {
		pid_t pgid = images[i].proc->pgid;

		if (!detached_in(&images[i], detached.sid))
			continue;
		if (pgid != detached.sid && outside(pgid) && getpgid(pgid) != pgid) {
			spawn(pgid, NULL, group_stand_in, NULL);
			setpgid(pgid, pgid);
		}
		spawn(images[i].hdr.pid, detached.stack, restore_one, &images[i]);
	}
	stand_in_drop_fds();
	return 0;
}

/* The detached roots whose parent is, or is not, ppid: one stand-in for
 * each of their sessions. */
static void spawn_detached_sessions(void *stack, pid_t ppid, int is_parent)
{
	detached.ppid = ppid;
	detached.is_parent = is_parent;
	detached.stack = stack;
	for (unsigned i = 0; i < nimages; i++) {
		pid_t sid = images[i].proc->sid;
		int first = detached_in(&images[i], sid);

		for (unsigned j = 0; j < i && first; j++)
			first = !detached_in(&images[j], sid);
		if (!first)
			continue;
		detached.sid = sid;
		spawn(sid, NULL, detached_session_stand_in, NULL);
	}
}

/* A stand-in holds none of the job's pipes, or they would never end, nor
 * its shared memory, which would outlive the job's last map of it. */
static void stand_in_drop_fds(void)
{
	shared_close_shms();
	syscall(SYS_close_range, 3, ~0U, 0);
}

static int group_stand_in(void *unused)
{
	(void)unused;
	stand_in_drop_fds();
	setpgid(0, 0);
	for (;;)
		pause();
	return 0;
}

static int parent_stand_in(void *stack)
{
	pid_t self = getpid(), sid = root->proc->sid, pgid = root->proc->pgid;

	if (sid == self)
		setsid();
	else if (pgid == self)
		setpgid(0, 0);
	else if (outside(pgid) && getpgid(pgid) == pgid)
		join_group(pgid);	/* the group's stand-in */
	else if (image_of(pgid) == root)
		setpgid(0, pgid);	/* may fail: then the group is ours */
	/* the launcher adopts orphans (ckpt launch is a subreaper): so does
	 * its stand-in, daemons whose session's stand-in exits included */
	prctl(PR_SET_CHILD_SUBREAPER, 1);
	spawn_roots(stack, self, 1);
	spawn_detached_sessions(stack, self, 1);
	stand_in_drop_fds();
	return reap_until(root_pid);
}

/* The root's group, when none of the job's processes nor the parent's
 * stand-in leads it: it exists before its members come. */
static void spawn_group_stand_in(void)
{
	pid_t pgid = root->proc->pgid;

	if (outside(pgid) && pgid != getpid() && pgid != root->proc->ppid) {
		spawn(pgid, NULL, group_stand_in, NULL);
		setpgid(pgid, pgid);
	}
}

static int session_stand_in(void *stack)
{
	pid_t child;

	setsid();
	spawn_group_stand_in();
	child = spawn(root->proc->ppid, NULL, parent_stand_in, stack);
	stand_in_drop_fds();
	return wait_for(child);
}

/* A process of the job still runs: one in this namespace that is
 * neither pid 1, nor a stand-in, nor a zombie (its fresh /proc is ours). */
static int process_alive(int dfd, const char *name, uint64_t ino, void *arg)
{
	pid_t pid = atoi(name);
	struct ckpt_proc_stat st;

	if (pid <= 1 || stand_in_pid(pid) || ckpt_stat_read_pid(pid, &st))
		return 0;
	return st.state != 'Z' && st.state != 'X';
}

static int job_alive(void)
{
	return ckpt_dir_walk("/proc", process_alive, NULL) > 0;
}

static void wake_up(int sig)
{
	(void)sig;	/* only interrupts waitpid */
}

/* The root exited, others of the job run on: say so, and look again for
 * them every half second. */
static void root_exited(int status)
{
	struct itimerval every = { { 0, 500000 }, { 0, 500000 } };
	struct sigaction sa;
	char line[32];
	int n = snprintf(line, sizeof(line), "exited %d\n", status);

	if (status_fd >= 0) {
		ssize_t w = write(status_fd, line, n);

		(void)w;	/* the restart manager is gone: nobody to tell */
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = wake_up;	/* no SA_RESTART */
	sigaction(SIGALRM, &sa, NULL);
	setitimer(ITIMER_REAL, &every, NULL);
}

/* pid 1 of the namespace: creates the stand-ins and the roots, reaps, and
 * exits with the root's status once no process of the job is left, or the
 * status of a process that failed to restore. */
int tree_run(void)
{
	void *stack = zone_stack(0);
	pid_t parent = -1, top = -1;
	int status, job_status = -1;

	if (!stack)
		die("cannot allocate a stack in the restart range");
	if (root) {
		pid_t sid = root->proc->sid;

		parent = root->proc->ppid;
		/*
		 * A session or group the job saw as 0 was outside its pid
		 * namespace (a container's exec, say): pid 1's are too, so it
		 * keeps them.  One the job saw as 1 was its namespace's init:
		 * pid 1 takes its place.
		 */
		if (sid == 1)
			setsid();
		else if (root->proc->pgid == 1)
			setpgid(0, 0);
		if (outside(parent) && outside(sid) && sid != parent) {
			top = spawn(sid, NULL, session_stand_in, stack);
		} else {
			if (!outside(sid))
				spawn_group_stand_in();	/* in pid 1's session */
			top = outside(parent) ? spawn(parent, NULL, parent_stand_in, stack) : -1;
		}
		if (top < 0)
			parent = -1;
	}
	/* the roots under the parent's stand-in are its to create */
	spawn_roots(stack, parent, 0);
	spawn_detached_sessions(stack, parent, 0);
	if (top < 0)
		top = root_pid;
	close(report[1]);
	/* held on to, they would keep the job's pipes from ever ending */
	shared_close_pipes();
	shared_close_shms();
	fcntl(report[0], F_SETFL, O_NONBLOCK);
	signal(SIGINT, forward_signal);
	signal(SIGTERM, forward_signal);
	signal(SIGHUP, forward_signal);
	for (;;) {
		pid_t got = waitpid(-1, &status, 0);
		int failed;

		if (got < 0 && errno == EINTR) {
			if (job_status >= 0 && !job_alive())
				return job_status;
			continue;
		}
		if (got < 0)	/* no child left at all */
			return job_status >= 0 ? job_status : EXIT_RESTORE_FAILED;
		failed = failure_reported();	/* the process said why on stderr */
		if (failed)
			return failed;
		if (got == top && job_status < 0) {
			job_status = exit_status(status);
			if (!job_alive())
				return job_status;
			root_exited(job_status);
		}
	}
}
