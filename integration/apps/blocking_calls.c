/*
 * One thread per interruptible blocking call, each blocking in it again
 * and again.  A checkpoint must be invisible to all of them: the program
 * fails at the first EINTR it did not cause itself and at the first call
 * that returns before its timeout.
 *
 *   blocking_calls [rounds] [ms] [kinds]
 *
 * Each thread makes `rounds` calls that wait `ms` milliseconds (calls
 * without a timeout are woken by a waker thread every `ms`).  kinds is a
 * comma-separated list (default: all); "restartable" names those whose
 * kernel objects a restart brings back (System V semaphores and message
 * queues and AIO contexts are not saved yet).
 */
#define _GNU_SOURCE
#include <linux/aio_abi.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/select.h>
#include <sys/sem.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include "zdtm.h"

static long rounds = 200, wait_ms = 20;
static int pipe_fds[2], wake_pipe[2], sock_fds[2], epfd, semid = -1, msqid = -1;
static aio_context_t aio_ctx;
static uint32_t futex_word;

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static struct timespec wait_ts(void)
{
	struct timespec ts = { wait_ms / 1000, (wait_ms % 1000) * 1000000L };

	return ts;
}

/* A timed call: it must time out, not fail and not end early (by more
 * than slack_ms: the kernel counts SO_RCVTIMEO in jiffies, so a receive
 * may end up to one jiffy early, with or without a checkpoint). */
#define TIMED_SLACK(name, slack_ms, expect_ok, call) do {			\
	int64_t start = now_ns();						\
	long r = (call);							\
	int err = errno;							\
	zdtm_check(r != -1 || err != EINTR, "%s: EINTR", name);		\
	zdtm_check(expect_ok, "%s: returned %ld (%s)", name, r, strerror(err));	\
	zdtm_check(now_ns() - start >= (wait_ms - (slack_ms)) * 1000000L,	\
		   "%s: returned after %lld ns of %ld ms", name,		\
		   (long long)(now_ns() - start), wait_ms);			\
} while (0)
#define TIMED(name, expect_ok, call) TIMED_SLACK(name, 0, expect_ok, call)
#define JIFFY_MS 10		/* HZ=100 at worst */

static void call_poll(void)
{
	struct pollfd p = { pipe_fds[0], POLLIN, 0 };

	TIMED("poll", r == 0, poll(&p, 1, wait_ms));
}

static void call_ppoll(void)
{
	struct pollfd p = { pipe_fds[0], POLLIN, 0 };
	struct timespec ts = wait_ts();

	TIMED("ppoll", r == 0, ppoll(&p, 1, &ts, NULL));
}

static void call_select(void)
{
	struct timeval tv = { wait_ms / 1000, (wait_ms % 1000) * 1000 };
	fd_set set;

	FD_ZERO(&set);
	FD_SET(pipe_fds[0], &set);
	TIMED("select", r == 0, select(pipe_fds[0] + 1, &set, NULL, NULL, &tv));
}

static void call_pselect(void)
{
	struct timespec ts = wait_ts();
	fd_set set;

	FD_ZERO(&set);
	FD_SET(pipe_fds[0], &set);
	TIMED("pselect", r == 0, pselect(pipe_fds[0] + 1, &set, NULL, NULL, &ts, NULL));
}

static void call_epoll_wait(void)
{
	struct epoll_event ev;

	TIMED("epoll_wait", r == 0, epoll_wait(epfd, &ev, 1, wait_ms));
}

static void call_epoll_pwait(void)
{
	struct epoll_event ev;
	sigset_t none;

	sigemptyset(&none);
	TIMED("epoll_pwait", r == 0, epoll_pwait(epfd, &ev, 1, wait_ms, &none));
}

static void call_nanosleep(void)
{
	struct timespec ts = wait_ts();

	TIMED("nanosleep", r == 0, nanosleep(&ts, NULL));
}

static void call_clock_nanosleep(void)
{
	struct timespec ts = wait_ts();

	TIMED("clock_nanosleep", r == 0, clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, NULL));
}

static void call_clock_nanosleep_abs(void)
{
	struct timespec ts;
	int64_t deadline = now_ns() + wait_ms * 1000000L;

	ts.tv_sec = deadline / 1000000000;
	ts.tv_nsec = deadline % 1000000000;
	TIMED("clock_nanosleep abs", r == 0,
	      clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL));
}

static void call_sigtimedwait(void)
{
	struct timespec ts = wait_ts();
	sigset_t set;

	sigemptyset(&set);
	sigaddset(&set, SIGUSR2);		/* blocked, never sent */
	TIMED("sigtimedwait", r == -1 && err == EAGAIN, sigtimedwait(&set, NULL, &ts));
}

static void call_rcvtimeo(void)
{
	char c;

	TIMED_SLACK("recv SO_RCVTIMEO", JIFFY_MS, r == -1 && (err == EAGAIN || err == EWOULDBLOCK),
	      recv(sock_fds[0], &c, 1, 0));
}

static void call_futex(void)
{
	struct timespec ts = wait_ts();

	TIMED("futex", r == -1 && err == ETIMEDOUT,
	      syscall(SYS_futex, &futex_word, FUTEX_WAIT_PRIVATE, 0, &ts, NULL, 0));
}

static void call_semtimedop(void)
{
	struct sembuf op = { 0, -1, 0 };
	struct timespec ts = wait_ts();

	TIMED("semtimedop", r == -1 && err == EAGAIN, semtimedop(semid, &op, 1, &ts));
}

static void call_io_getevents(void)
{
	struct io_event ev;
	struct timespec ts = wait_ts();

	TIMED("io_getevents", r == 0,
	      syscall(SYS_io_getevents, aio_ctx, 1, 1, &ev, &ts));
}

/* Calls without a timeout, woken every wait_ms by the waker thread. */
static volatile sig_atomic_t usr1_seen;
static long usr1_used;
static pthread_t pause_thread;

static void on_usr1(int sig)
{
	(void)sig;
	usr1_seen++;
}

static void call_pause(void)
{
	int r = pause();

	zdtm_check(r == -1 && errno == EINTR, "pause returned %d", r);
	/* pause ends only when the application's own signal came */
	zdtm_check(usr1_seen > usr1_used, "pause: EINTR without SIGUSR1");
	usr1_used = usr1_seen;
}

static void call_semop(void)
{
	struct sembuf op = { 1, -1, 0 };
	int r = semop(semid, &op, 1);

	zdtm_check(r == 0, "semop: %d (%s)", r, strerror(errno));
}

static void call_msgrcv(void)
{
	struct { long type; char text[8]; } m;
	ssize_t r = msgrcv(msqid, &m, sizeof(m.text), 1, 0);

	zdtm_check(r == 5 && !memcmp(m.text, "tick", 5), "msgrcv: %zd (%s)", r, strerror(errno));
}

static void call_read(void)
{
	char c;
	ssize_t r = read(wake_pipe[0], &c, 1);

	zdtm_check(r == 1 && c == 'w', "read: %zd (%s)", r, strerror(errno));
}

struct kind {
	const char *name;
	void (*call)(void);
	int restartable;	/* its kernel objects come back at restart */
	int woken;		/* no timeout: the waker wakes it */
};

static const struct kind kinds[] = {
	{ "poll", call_poll, 1, 0 },
	{ "ppoll", call_ppoll, 1, 0 },
	{ "select", call_select, 1, 0 },
	{ "pselect", call_pselect, 1, 0 },
	{ "epoll_wait", call_epoll_wait, 1, 0 },
	{ "epoll_pwait", call_epoll_pwait, 1, 0 },
	{ "nanosleep", call_nanosleep, 1, 0 },
	{ "clock_nanosleep", call_clock_nanosleep, 1, 0 },
	{ "clock_nanosleep_abs", call_clock_nanosleep_abs, 1, 0 },
	{ "sigtimedwait", call_sigtimedwait, 1, 0 },
	{ "rcvtimeo", call_rcvtimeo, 1, 0 },
	{ "futex", call_futex, 1, 0 },
	{ "pause", call_pause, 1, 1 },
	{ "read", call_read, 1, 1 },
	{ "semtimedop", call_semtimedop, 0, 0 },
	{ "io_getevents", call_io_getevents, 0, 0 },
	{ "semop", call_semop, 0, 1 },
	{ "msgrcv", call_msgrcv, 0, 1 },
};
#define NKINDS (sizeof(kinds) / sizeof(kinds[0]))

static int chosen[NKINDS];
static long done[NKINDS];
static volatile int finished;

static void *run_kind(void *arg)
{
	long i = (long)arg;

	if (!strcmp(kinds[i].name, "pause"))
		pause_thread = pthread_self();
	for (long r = 0; r < rounds; r++) {
		kinds[i].call();
		done[i]++;
	}
	return NULL;
}

static int chosen_kind(const char *name)
{
	for (unsigned i = 0; i < NKINDS; i++)
		if (chosen[i] && !strcmp(kinds[i].name, name))
			return 1;
	return 0;
}

/* Wakes the calls without a timeout, one wake-up per round each, and a
 * few more at the end so that none is left waiting. */
static void *waker(void *arg)
{
	struct { long type; char text[8]; } m = { 1, "tick" };
	struct sembuf post = { 1, 1, 0 };

	(void)arg;
	for (long r = 0; r < rounds + 2 && (chosen_kind("read") || chosen_kind("semop") ||
					     chosen_kind("msgrcv")); r++) {
		zdtm_pace(wait_ms);
		if (chosen_kind("read"))
			zdtm_check(write(wake_pipe[1], "w", 1) == 1, "wake write");
		if (chosen_kind("semop"))
			zdtm_check(semop(semid, &post, 1) == 0, "sem post");
		if (chosen_kind("msgrcv"))
			zdtm_check(msgsnd(msqid, &m, 5, 0) == 0, "msgsnd");
	}
	/* pause: signals until it is done (a signal between two pauses is
	 * taken by the handler and only counts once) */
	while (chosen_kind("pause") && !finished) {
		if (pause_thread)
			pthread_kill(pause_thread, SIGUSR1);
		zdtm_pace(wait_ms);
	}
	return NULL;
}

static void choose(const char *list)
{
	for (unsigned i = 0; i < NKINDS; i++) {
		char buf[256], *tok, *save;

		snprintf(buf, sizeof(buf), "%s", list);
		for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
			if (!strcmp(tok, "all") || !strcmp(tok, kinds[i].name) ||
			    (!strcmp(tok, "restartable") && kinds[i].restartable))
				chosen[i] = 1;
	}
}

static void setup(void)
{
	struct timeval tv = { wait_ms / 1000, (wait_ms % 1000) * 1000 };
	struct epoll_event ev = { EPOLLIN, { 0 } };
	struct sigaction sa;
	sigset_t usr2;

	zdtm_check(pipe(pipe_fds) == 0 && pipe(wake_pipe) == 0, "pipe");
	zdtm_check(socketpair(AF_UNIX, SOCK_STREAM, 0, sock_fds) == 0, "socketpair");
	zdtm_check(setsockopt(sock_fds[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0,
		   "SO_RCVTIMEO");
	epfd = epoll_create1(0);
	zdtm_check(epfd >= 0 && epoll_ctl(epfd, EPOLL_CTL_ADD, pipe_fds[0], &ev) == 0, "epoll");
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_usr1;	/* no SA_RESTART: pause ends with EINTR */
	zdtm_check(sigaction(SIGUSR1, &sa, NULL) == 0, "sigaction");
	sigemptyset(&usr2);
	sigaddset(&usr2, SIGUSR2);
	zdtm_check(pthread_sigmask(SIG_BLOCK, &usr2, NULL) == 0, "block SIGUSR2");
	if (chosen_kind("semtimedop") || chosen_kind("semop")) {
		semid = semget(IPC_PRIVATE, 2, 0600);
		zdtm_check(semid >= 0, "semget: %s", strerror(errno));
	}
	if (chosen_kind("msgrcv")) {
		msqid = msgget(IPC_PRIVATE, 0600);
		zdtm_check(msqid >= 0, "msgget: %s", strerror(errno));
	}
	if (chosen_kind("io_getevents"))
		zdtm_check(syscall(SYS_io_setup, 4, &aio_ctx) == 0, "io_setup: %s", strerror(errno));
}

static void cleanup(void)
{
	if (semid >= 0)
		semctl(semid, 0, IPC_RMID);
	if (msqid >= 0)
		msgctl(msqid, IPC_RMID, NULL);
}

int main(int argc, char **argv)
{
	pthread_t threads[NKINDS], wake;
	uint64_t hash = 0;

	if (argc > 1)
		rounds = atol(argv[1]);
	if (argc > 2)
		wait_ms = atol(argv[2]);
	choose(argc > 3 ? argv[3] : "all");
	setup();
	atexit(cleanup);
	printf("READY\n");
	fflush(stdout);
	for (unsigned i = 0; i < NKINDS; i++)
		if (chosen[i])
			zdtm_check(pthread_create(&threads[i], NULL, run_kind, (void *)(long)i) == 0,
				   "pthread_create");
	zdtm_check(pthread_create(&wake, NULL, waker, NULL) == 0, "pthread_create");
	for (unsigned i = 0; i < NKINDS; i++) {
		if (!chosen[i])
			continue;
		pthread_join(threads[i], NULL);
		zdtm_check(done[i] == rounds, "%s: %ld of %ld calls", kinds[i].name, done[i], rounds);
		hash = zdtm_mix(hash, i * 1000003 + done[i]);
	}
	finished = 1;
	pthread_join(wake, NULL);
	/* after the joins and the waker's end: until finished the waker signals
	 * the pause thread, which must not be joined meanwhile */
	zdtm_hold();
	zdtm_pass("%016llx calls=%ld", (unsigned long long)hash, rounds);
	return 0;
}
