/*
 * The subject of the state fuzzer (integration/state_fuzz.py): an
 * interpreter of a short program of operations on kernel state, read from
 * a file.  It runs the operations before the file's "gate" line, prints
 * READY and waits (zdtm_hold: the harness checkpoints and kills it there,
 * then restarts it), prints an observation of its state, runs the
 * operations after the gate, and prints a second observation.
 *
 *     statefuzz PROGRAM_FILE
 *
 * Everything printed is the same on every run of the same program in
 * the same kind of directory: no fd numbers, pids, addresses or inode
 * numbers, only structure (which slot shares an open file description,
 * a pipe or a socket pair with which), so an uninterrupted run and a
 * checkpointed, killed and restarted one must print the same text.
 *
 * Operations name their objects by slot (an index into the program's
 * table of fds, maps or children, taken modulo the table's size), so
 * every list of operations is a valid program: an operation that does not
 * apply logs its errno, which must be the same in both runs too.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <linux/kcmp.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <pty.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <linux/sockios.h>
#include <termios.h>
#include "zdtm.h"

#define MAX_SLOTS 64
#define MAX_MAPS 12
#define MAX_CHILDREN 4
#define PAGE 4096
#define NFILES 3

static char base[4096];
static int slots[MAX_SLOTS], nslots;
static struct map { char *addr; size_t len; int kind; } maps[MAX_MAPS];
static int nmaps;
static struct child { pid_t pid; int fds[MAX_SLOTS]; int nfds; int nmaps; } children[MAX_CHILDREN];
static int nchildren;
static long opno;

static const int SIGS[] = { SIGUSR1, SIGUSR2, SIGWINCH, 0 /* SIGRTMIN+2 */ };
#define NSIGS 4
static volatile sig_atomic_t caught[2][NSIGS];

static int sig_at(long i)
{
	return i % NSIGS == 3 ? SIGRTMIN + 2 : SIGS[i % NSIGS];
}

static int sig_index(int sig)
{
	for (int i = 0; i < NSIGS; i++)
		if (sig_at(i) == sig)
			return i;
	return 0;
}

static void h1(int sig) { caught[0][sig_index(sig)]++; }
static void h2(int sig) { caught[1][sig_index(sig)]++; }

static uint64_t hash_bytes(const void *p, size_t n)
{
	const unsigned char *b = p;
	uint64_t h = 1469598103934665603ULL;

	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 1099511628211ULL;
	return h;
}

static void logr(const char *name, long r)
{
	if (r < 0)
		printf("op %ld %s -> %s\n", opno, name, strerrorname_np(errno) ?: "?");
	else
		printf("op %ld %s -> %ld\n", opno, name, r);
}

static int slot_fd(long s)
{
	return nslots ? slots[s % nslots] : -1;
}

static void add_slot(int fd)
{
	if (fd < 0)
		return;
	for (int i = 0; i < nslots; i++)	/* dup2 over a slot's fd */
		if (slots[i] == fd) {
			memmove(&slots[i], &slots[i + 1], (nslots - i - 1) * sizeof(int));
			nslots--;
			break;
		}
	if (nslots == MAX_SLOTS) {
		close(fd);
		return;
	}
	slots[nslots++] = fd;
}

static void drop_slot(long s)
{
	s %= nslots;
	memmove(&slots[s], &slots[s + 1], (nslots - s - 1) * sizeof(int));
	nslots--;
}

static void file_name(char *out, size_t n, long f)
{
	snprintf(out, n, "%s/f%ld", base, f % NFILES);
}

static const int OPEN_MODES[] = { O_RDWR, O_RDWR | O_APPEND, O_RDONLY, O_WRONLY | O_APPEND };

/* fill a buffer with a pattern of this operation */
static char *pattern(size_t n)
{
	static char buf[1 << 17];

	if (n > sizeof(buf))
		n = sizeof(buf);
	for (size_t i = 0; i < n; i++)
		buf[i] = (char)('a' + (opno * 7 + i) % 26);
	return buf;
}

/* an I/O call that never blocks: O_NONBLOCK for just this call */
static int nonblock_begin(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl >= 0 && !(fl & O_NONBLOCK))
		fcntl(fd, F_SETFL, fl | O_NONBLOCK);
	return fl;
}

static void nonblock_end(int fd, int fl)
{
	if (fl >= 0 && !(fl & O_NONBLOCK))
		fcntl(fd, F_SETFL, fl);
}

static void child_loop(void)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);	/* never outlives a failed run */
	if (getppid() == 1)
		_exit(0);
	for (;;)
		pause();
}

/* ---- more kinds of state: threads, memfds, ptys, epoll, eventfd,
 * timerfd, signalfd, TCP ---- */

/* A thread that holds state of its own: a signal mask, a TLS value, a
 * name, and a read blocked on its command pipe.  Each command it reads
 * is answered with a report of that state, seen from inside the thread
 * (its TLS through its own fs base, its mask through pthread_sigmask). */
#define MAX_THREADS 4
struct thread_cmd { long op, arg; };
struct thread_report { long tls; int mask, eintr; char name[16]; };
static struct sfthread {
	pthread_t t;
	pid_t tid;
	int cmd[2], reply[2];
	long *tls;
	int mask;		/* the 4 signals' bits, as the thread set them */
} threads[MAX_THREADS];
static int nthreads;
static __thread long tls_value;

static int mask_bits(const sigset_t *set)
{
	int bits = 0;

	for (int i = 0; i < NSIGS; i++)
		if (sigismember(set, sig_at(i)))
			bits |= 1 << i;
	return bits;
}

static void mask_of_bits(int bits, sigset_t *set)
{
	sigemptyset(set);
	for (int i = 0; i < NSIGS; i++)
		if (bits & (1 << i))
			sigaddset(set, sig_at(i));
}

static void *thread_main(void *arg)
{
	struct sfthread *me = arg;
	struct thread_cmd c;
	struct thread_report rep = { 0 };
	sigset_t set;
	int eintr = 0;

	me->tid = gettid();
	me->tls = &tls_value;
	tls_value = 1000 + (me - threads);
	snprintf(rep.name, sizeof(rep.name), "sf-thread%d", (int)(me - threads));
	prctl(PR_SET_NAME, rep.name);
	mask_of_bits(me->mask, &set);
	pthread_sigmask(SIG_SETMASK, &set, NULL);
	for (;;) {
		ssize_t n = read(me->cmd[0], &c, sizeof(c));

		if (n < 0 && errno == EINTR) {
			eintr++;
			continue;
		}
		if (n != sizeof(c))
			return NULL;
		if (c.op == 0 || c.op == 1) {		/* block, unblock a signal */
			sigemptyset(&set);
			sigaddset(&set, sig_at(c.arg));
			pthread_sigmask(c.op ? SIG_UNBLOCK : SIG_BLOCK, &set, NULL);
		} else if (c.op == 2) {			/* a new name */
			snprintf(rep.name, sizeof(rep.name), "sf-t%d-%ld", (int)(me - threads), c.arg % 8);
			prctl(PR_SET_NAME, rep.name);
		} else if (c.op == 3) {			/* a new TLS value */
			tls_value = 2000 + c.arg;
		}
		pthread_sigmask(SIG_BLOCK, NULL, &set);
		rep.tls = tls_value;
		rep.mask = mask_bits(&set);
		rep.eintr = eintr;
		prctl(PR_GET_NAME, rep.name);
		if (write(me->reply[1], &rep, sizeof(rep)) != sizeof(rep))
			return NULL;
	}
}

/* a command to a thread and its report (op 4: a ping, nothing changes) */
static int thread_call(struct sfthread *t, long op, long arg, struct thread_report *rep)
{
	struct thread_cmd c = { op, arg };
	ssize_t n;

	if (write(t->cmd[1], &c, sizeof(c)) != sizeof(c))
		return -1;
	while ((n = read(t->reply[0], rep, sizeof(*rep))) < 0 && errno == EINTR)
		;
	if (n != sizeof(*rep))
		return -1;
	t->mask = rep->mask;
	return 0;
}

static void op_thread(long a)
{
	struct sfthread *t = &threads[nthreads];
	struct thread_report rep;

	if (nthreads == MAX_THREADS) {
		logr("thread", 0);
		return;
	}
	if (pipe2(t->cmd, O_CLOEXEC) || pipe2(t->reply, O_CLOEXEC))
		zdtm_fail("thread pipes: %m");
	t->mask = a % 16;
	if (pthread_create(&t->t, NULL, thread_main, t))
		zdtm_fail("pthread_create");
	nthreads++;
	logr("thread", thread_call(t, 4, 0, &rep));
}

static void op_tcmd(long a, long b, long c)
{
	struct thread_report rep;

	if (!nthreads) {
		logr("tcmd", 0);
		return;
	}
	logr("tcmd", thread_call(&threads[a % nthreads], b % 4, c, &rep));
	printf("  thread tls %ld mask %x eintr %d name %s\n", rep.tls, rep.mask, rep.eintr, rep.name);
}

/* a signal to one thread: only one it blocks or one with a handler */
static void op_tkill(long a, long b)
{
	struct sigaction sa;
	struct sfthread *t;
	int sig = sig_at(b);

	if (!nthreads) {
		logr("tkill", 0);
		return;
	}
	t = &threads[a % nthreads];
	sigaction(sig, NULL, &sa);
	if (!(t->mask & (1 << (b % NSIGS))) && sa.sa_handler == SIG_DFL && sig != SIGWINCH)
		logr("tkill", 0);
	else
		logr("tkill", syscall(SYS_tgkill, getpid(), t->tid, sig));
}

static void op_pname(long a)
{
	char name[16];

	snprintf(name, sizeof(name), "sf-main%ld", a % 4);
	logr("pname", prctl(PR_SET_NAME, name));
}

/* memfds: a named memfd of 1 to 4 pages that allows seals, its first
 * bytes written */
static void op_memfd(long a, long b)
{
	char name[16];
	int fd;

	snprintf(name, sizeof(name), "sf-mem%ld", a % 3);
	fd = memfd_create(name, MFD_ALLOW_SEALING | (b & 4 ? MFD_CLOEXEC : 0));
	if (fd >= 0 && (ftruncate(fd, (1 + b % 4) * PAGE) || pwrite(fd, pattern(100), 100, 0) != 100))
		zdtm_fail("memfd: %m");
	logr("memfd", fd < 0 ? -1 : 0);
	add_slot(fd);
}

/* a map of a slot's file (a memfd or a file): shared (kind 4) or private
 * (kind 5), of as many pages as the file has, at most 4 */
static void op_mmap_fd(const char *name, long a, int shared)
{
	struct stat st;
	size_t len;
	char *p;
	int fd = slot_fd(a);

	if (nmaps == MAX_MAPS) {
		logr(name, 0);
		return;
	}
	if (fstat(fd, &st) < 0) {
		logr(name, -1);
		return;
	}
	if (!S_ISREG(st.st_mode) || st.st_size == 0) {
		logr(name, 1);
		return;
	}
	len = (st.st_size + PAGE - 1) / PAGE * PAGE;
	if (len > 4 * PAGE)
		len = 4 * PAGE;
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, shared ? MAP_SHARED : MAP_PRIVATE, fd, 0);
	logr(name, p == MAP_FAILED ? -1 : 0);
	if (p != MAP_FAILED)
		maps[nmaps++] = (struct map){ p, len, shared ? 4 : 5 };
}

static void op_seal(long a, long b)
{
	static const int SEALS[] = { F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_WRITE, F_SEAL_FUTURE_WRITE,
				     F_SEAL_SEAL };

	logr("seal", fcntl(slot_fd(a), F_ADD_SEALS, SEALS[b % 5]));
}

static void op_fchmod(long a, long b)
{
	logr("fchmod", fchmod(slot_fd(a), (mode_t[]){ 0600, 0640, 0755, 0444 }[b % 4]));
}

/* ptys: a pair of master and slave, in one of four terminal settings */
static void termios_variant(struct termios *t, long v)
{
	switch (v % 6) {
	case 0: t->c_lflag ^= ECHO; break;
	case 1: t->c_lflag ^= ICANON; break;
	case 2: cfmakeraw(t); break;
	case 3: cfsetspeed(t, t->c_cflag & B9600 ? B115200 : B9600); break;
	case 4: t->c_cc[VMIN] = 1 + t->c_cc[VMIN] % 4; t->c_cc[VTIME] = v % 3; break;
	case 5: t->c_oflag ^= OPOST; t->c_iflag ^= ICRNL; break;
	}
}

/* a pty pair: by glibc's openpty (the slave from TIOCGPTPEER), or with
 * a % 8 >= 4 by posix_openpt and an open of the slave's path */
static int open_pty_pair(long a, int *m, int *s, struct winsize *ws)
{
	if (a % 8 < 4)
		return openpty(m, s, NULL, NULL, ws);
	*m = posix_openpt(O_RDWR | O_NOCTTY);
	if (*m < 0 || grantpt(*m) || unlockpt(*m) ||
	    (*s = open(ptsname(*m), O_RDWR | O_NOCTTY)) < 0)
		return -1;
	return ioctl(*s, TIOCSWINSZ, ws);
}

static void op_openpty(long a)
{
	struct termios t;
	struct winsize ws = { .ws_row = 24 + a % 4, .ws_col = 80 };
	int m, s, r;

	r = open_pty_pair(a, &m, &s, &ws);
	if (!r && a % 4) {
		tcgetattr(s, &t);
		termios_variant(&t, a % 4 - 1);
		tcsetattr(s, TCSANOW, &t);
	}
	logr("openpty", r);
	if (!r) {
		add_slot(m);
		add_slot(s);
	}
}

static void op_termios(long a, long b)
{
	struct termios t;
	int fd = slot_fd(a);

	if (tcgetattr(fd, &t) < 0) {
		logr("termios", -1);
		return;
	}
	termios_variant(&t, b);
	logr("termios", tcsetattr(fd, TCSANOW, &t));
}

static void op_winsize(long a, long b)
{
	struct winsize ws = { .ws_row = 30 + b % 4, .ws_col = 100 + b % 4 };

	logr("winsize", ioctl(slot_fd(a), TIOCSWINSZ, &ws));
}

/* epoll: a set, fds added, modified and removed with six kinds of
 * events, and waits that never block (their events logged) */
static const unsigned EPOLL_EVENTS[] = {
	EPOLLIN, EPOLLOUT, EPOLLIN | EPOLLOUT, EPOLLIN | EPOLLET, EPOLLIN | EPOLLONESHOT,
	EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
};

static void op_epoll_ctl(long a, long b, long c)
{
	struct epoll_event ev = { .events = EPOLL_EVENTS[(c / 3) % 6], .data.u64 = 1000 + opno };

	logr("epoll_ctl", epoll_ctl(slot_fd(a), (int[]){ EPOLL_CTL_ADD, EPOLL_CTL_MOD, EPOLL_CTL_DEL }[c % 3],
				    slot_fd(b), &ev));
}

static void op_epoll_wait(long a, long b)
{
	struct epoll_event evs[4];
	int n = epoll_wait(slot_fd(a), evs, 1 + b % 4, 0);

	logr("epoll_wait", n);
	for (int i = 0; i < n; i++)
		printf("  event %llu %x\n", (unsigned long long)evs[i].data.u64, evs[i].events);
}

/* timerfd: disarmed, expired once, armed for an hour, or an hour with an
 * hour's interval: nothing that ticks while the program runs */
static void op_timerfd(long a, long b)
{
	struct itimerspec its = { 0 };
	int fd = timerfd_create((int[]){ CLOCK_REALTIME, CLOCK_MONOTONIC, CLOCK_BOOTTIME }[a % 3], 0);

	if (fd >= 0) {
		if (b % 4 == 1)
			its.it_value.tv_nsec = 1;
		else if (b % 4 >= 2)
			its.it_value.tv_sec = 3600;
		if (b % 4 == 3)
			its.it_interval.tv_sec = 3600;
		if (timerfd_settime(fd, 0, &its, NULL))
			zdtm_fail("timerfd_settime: %m");
		if (b % 4 == 1)		/* expired: its tick is there */
			poll(&(struct pollfd){ fd, POLLIN, 0 }, 1, -1);
	}
	logr("timerfd", fd < 0 ? -1 : 0);
	add_slot(fd);
}

static void op_signalfd(long a, long b)
{
	sigset_t set;
	int fd;

	sigemptyset(&set);
	sigaddset(&set, sig_at(a));
	if (b & 1)
		sigaddset(&set, sig_at(a + 1));
	fd = signalfd(-1, &set, b & 2 ? SFD_CLOEXEC : 0);
	logr("signalfd", fd < 0 ? -1 : 0);
	add_slot(fd);
}

/* a read of a signalfd: the signals, not the bytes (they hold pids) */
static int print_signalfd_read(int fd, const char *buf, ssize_t n)
{
	char path[64], t[64];
	ssize_t len;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	len = readlink(path, t, sizeof(t) - 1);
	if (len < 0 || (t[len] = 0, strcmp(t, "anon_inode:[signalfd]")))
		return 0;
	for (ssize_t off = 0; off + (ssize_t)sizeof(struct signalfd_siginfo) <= n;
	     off += sizeof(struct signalfd_siginfo)) {
		const struct signalfd_siginfo *si = (const void *)(buf + off);

		printf("  siginfo %d code %d\n", sig_index(si->ssi_signo), si->ssi_code);
	}
	return 1;
}

/* TCP on loopback: a connected pair (kind 0), a listener with a
 * connection it has not accepted (kind 1), a listener alone (kind 2) */
static int tcp_listener(struct sockaddr_in *addr)
{
	socklen_t l = sizeof(*addr);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	*addr = (struct sockaddr_in){ .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	if (fd < 0 || bind(fd, (void *)addr, sizeof(*addr)) || listen(fd, 4) ||
	    getsockname(fd, (void *)addr, &l))
		zdtm_fail("tcp listener: %m");
	return fd;
}

static void op_tcp(long a)
{
	struct sockaddr_in addr;
	int lfd = tcp_listener(&addr), cfd = -1, afd;

	if (a % 3 != 2) {
		cfd = socket(AF_INET, SOCK_STREAM, 0);
		if (cfd < 0 || connect(cfd, (void *)&addr, sizeof(addr)))
			zdtm_fail("tcp connect: %m");
	}
	logr("tcp", 0);
	if (a % 3 == 0) {
		afd = accept(lfd, NULL, NULL);
		close(lfd);
		add_slot(cfd);
		add_slot(afd);
	} else {
		add_slot(lfd);
		add_slot(cfd);
	}
}

static void op_accept(long a)
{
	int fd = slot_fd(a), fl = nonblock_begin(fd);
	int got = accept(fd, NULL, NULL);

	logr("accept", got < 0 ? -1 : 0);
	nonblock_end(fd, fl);
	add_slot(got);
}

/* A tty's input is moved by a kernel worker after a write returned, and
 * how much a write takes depends on how far it got.  So the bytes that a
 * write to a tty takes are kept well below what the tty buffers (4 KiB a
 * line discipline, 64 KiB a pty's flip buffer): at most TTY_WRITE an
 * operation, so that no write is ever short; and the worker is waited for
 * (poll runs its pending work when no input is there yet; then until the
 * queues stay the same for a few ms: for echoes, and input that was there). */
#define TTY_WRITE 300

static void tty_settle(void)
{
	uint64_t last = 1;

	for (int same = 0, tries = 0; same < 3 && tries < 1000; tries++) {
		uint64_t h = 0;
		int any = 0;

		for (int i = 0; i < nslots; i++) {
			int in = -1, out = -1;

			if (!isatty(slots[i]))
				continue;
			any = 1;
			poll(&(struct pollfd){ slots[i], POLLIN, 0 }, 1, 0);
			ioctl(slots[i], FIONREAD, &in);
			ioctl(slots[i], TIOCOUTQ, &out);
			h = zdtm_mix(zdtm_mix(h, in), out);
		}
		if (!any)
			return;
		same = h == last ? same + 1 : 0;
		last = h;
		zdtm_pace(1);
	}
}

static ssize_t sf_write(int fd, const char *buf, size_t n)
{
	ssize_t r;

	if (!isatty(fd))
		return write(fd, buf, n);
	r = write(fd, buf, n < TTY_WRITE ? n : TTY_WRITE);
	tty_settle();
	return r;
}

/* the operations of these kinds; 0 if name is none of them */
static int op_more(const char *name, long a, long b, long c)
{
	if (!strcmp(name, "thread"))
		op_thread(a);
	else if (!strcmp(name, "tcmd"))
		op_tcmd(a, b, c);
	else if (!strcmp(name, "tkill"))
		op_tkill(a, b);
	else if (!strcmp(name, "pname"))
		op_pname(a);
	else if (!strcmp(name, "memfd"))
		op_memfd(a, b);
	else if (!strcmp(name, "mmap_fd_shared") || !strcmp(name, "mmap_fd_private"))
		op_mmap_fd(name, a, name[8] == 's');
	else if (!strcmp(name, "seal"))
		op_seal(a, b);
	else if (!strcmp(name, "fchmod"))
		op_fchmod(a, b);
	else if (!strcmp(name, "openpty"))
		op_openpty(a);
	else if (!strcmp(name, "termios"))
		op_termios(a, b);
	else if (!strcmp(name, "winsize"))
		op_winsize(a, b);
	else if (!strcmp(name, "epoll")) {
		int fd = epoll_create1(a % 2 ? EPOLL_CLOEXEC : 0);

		logr(name, fd < 0 ? -1 : 0);
		add_slot(fd);
	} else if (!strcmp(name, "epoll_ctl"))
		op_epoll_ctl(a, b, c);
	else if (!strcmp(name, "epoll_wait"))
		op_epoll_wait(a, b);
	else if (!strcmp(name, "eventfd")) {
		int fd = eventfd(5 * (a % 3), (b & 1 ? EFD_SEMAPHORE : 0) | (b & 2 ? EFD_NONBLOCK : 0));

		logr(name, fd < 0 ? -1 : 0);
		add_slot(fd);
	} else if (!strcmp(name, "evwrite")) {
		uint64_t v = (uint64_t[]){ 1, 2, 7 }[b % 3];
		int fd = slot_fd(a), fl = nonblock_begin(fd);

		logr(name, write(fd, &v, sizeof(v)));
		nonblock_end(fd, fl);
	} else if (!strcmp(name, "timerfd"))
		op_timerfd(a, b);
	else if (!strcmp(name, "signalfd"))
		op_signalfd(a, b);
	else if (!strcmp(name, "tcp"))
		op_tcp(a);
	else if (!strcmp(name, "accept"))
		op_accept(a);
	else
		return 0;
	return 1;
}

/* Wait for what the kernel finishes after a call returned, so that an
 * observation sees the same in every run: a tty's input (poll runs its
 * pending work; twice around, for echoes), a thread's signals (handled
 * when it answers a ping), TCP segments on loopback (every byte sent
 * acknowledged, no state changing). */
static int tcp_sample(int fd, uint64_t *h)
{
	struct tcp_info ti;
	socklen_t l = sizeof(ti);
	int proto = 0, outq = 0, nsd = 0;
	socklen_t pl = sizeof(proto);

	if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &pl) || proto != IPPROTO_TCP ||
	    getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &l))
		return 0;
	ioctl(fd, SIOCOUTQ, &outq);
	ioctl(fd, SIOCOUTQNSD, &nsd);
	*h = zdtm_mix(zdtm_mix(*h, ti.tcpi_state), zdtm_mix(outq, nsd));
	return ti.tcpi_state != TCP_LISTEN && outq != nsd;	/* bytes in flight */
}

static void settle(void)
{
	struct thread_report rep;
	uint64_t last = 1;

	tty_settle();
	for (int i = 0; i < nthreads; i++)
		thread_call(&threads[i], 4, 0, &rep);
	for (int tries = 0; tries < 2000; tries++) {
		uint64_t h = 0;
		int flying = 0;

		for (int i = 0; i < nslots; i++)
			flying |= tcp_sample(slots[i], &h);
		if (!flying && h == last)
			break;
		last = h;
		zdtm_pace(1);
	}
}

/* the observation of these kinds */
static void observe_threads(void)
{
	char comm[32] = "";
	FILE *f = fopen("/proc/self/comm", "re");

	if (f && fgets(comm, sizeof(comm), f))
		comm[strcspn(comm, "\n")] = 0;
	if (f)
		fclose(f);
	printf("comm %s\n", comm);
	for (int i = 0; i < nthreads; i++) {
		char path[64], line[256], sys[32] = "";
		char name[32] = "?", state = '?';
		unsigned long long pnd = 0, blk = 0;

		/* back in its read after a ping or a restart */
		snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", threads[i].tid);
		for (int tries = 0; tries < 5000; tries++) {
			f = fopen(path, "re");
			if (f && !fgets(sys, sizeof(sys), f))
				sys[0] = 0;
			if (f)
				fclose(f);
			if (!strncmp(sys, "0 ", 2))
				break;
			zdtm_pace(1);
		}
		snprintf(path, sizeof(path), "/proc/self/task/%d/status", threads[i].tid);
		f = fopen(path, "re");
		while (f && fgets(line, sizeof(line), f)) {
			sscanf(line, "Name: %31s", name);
			sscanf(line, "State: %c", &state);
			sscanf(line, "SigPnd: %llx", &pnd);
			sscanf(line, "SigBlk: %llx", &blk);
		}
		if (f)
			fclose(f);
		sys[strcspn(sys, " \n")] = 0;
		printf("thread %d name %s state %c syscall %s sigpnd %llx sigblk %llx tls %ld\n",
		       i, name, state, sys, pnd, blk, *threads[i].tls);
	}
}

static int slot_of_fd(int fd)
{
	for (int i = 0; i < nslots; i++)
		if (slots[i] == fd)
			return i;
	return -1;
}

static int cmp_lines(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* an epoll set's entries, by slot (the kernel lists them in the order of
 * their files' addresses: sorted here) */
static void observe_epoll(int i)
{
	char path[64], line[512], *lines[64];
	int n = 0, tfd;
	unsigned events;
	unsigned long long data;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", slots[i]);
	f = fopen(path, "re");
	while (f && fgets(line, sizeof(line), f) && n < 64)
		if (sscanf(line, "tfd: %d events: %x data: %llx", &tfd, &events, &data) == 3 &&
		    asprintf(&lines[n], "epoll %d slot %d events %x data %llu\n", i, slot_of_fd(tfd),
			     events, data) > 0)
			n++;
	if (f)
		fclose(f);
	qsort(lines, n, sizeof(char *), cmp_lines);
	for (int j = 0; j < n; j++) {
		fputs(lines[j], stdout);
		free(lines[j]);
	}
}

/* the fdinfo lines of an eventfd, a timerfd or a signalfd that do not
 * change while the program runs (a timer's time left: only whether it is
 * armed) */
static void observe_anon_fdinfo(int i, const char *kind)
{
	char path[64], line[256];
	long long sec, nsec;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", slots[i]);
	f = fopen(path, "re");
	printf("%s %d", kind, i);
	while (f && fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = 0;
		if ((!strncmp(line, "eventfd-", 8) && strncmp(line, "eventfd-id:", 11)) ||
		    !strncmp(line, "clockid:", 8) ||
		    !strncmp(line, "ticks:", 6) || !strncmp(line, "settime flags:", 14) ||
		    !strncmp(line, "it_interval:", 12) || !strncmp(line, "sigmask:", 8))
			printf(" [%s]", line);
		else if (sscanf(line, "it_value: (%lld, %lld)", &sec, &nsec) == 2)
			printf(" [armed %d]", sec || nsec);
	}
	if (f)
		fclose(f);
	printf("\n");
}

/* a pty's number (master: TIOCGPTN; slave: its path), -1 for no pty */
static int pty_number(int fd)
{
	char path[64], t[64];
	ssize_t len;
	int n = -1;

	if (!ioctl(fd, TIOCGPTN, &n))
		return n;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	len = readlink(path, t, sizeof(t) - 1);
	if (len < 0 || (t[len] = 0, sscanf(t, "/dev/pts/%d", &n) != 1))
		return -1;
	return n;
}

/* a tty's settings and queue, and the first slot before it on the same
 * pty (its numbers differ between runs) */
static void observe_tty(int i)
{
	struct termios t;
	struct winsize ws = { 0 };
	int outq = -1, n = pty_number(slots[i]), pair = -1;

	if (tcgetattr(slots[i], &t) < 0)
		return;
	ioctl(slots[i], TIOCGWINSZ, &ws);
	ioctl(slots[i], TIOCOUTQ, &outq);
	for (int j = 0; j < i && n >= 0 && pair < 0; j++)
		if (pty_number(slots[j]) == n)
			pair = j;
	printf("tty %d pty-as #%d iflag %x oflag %x cflag %x lflag %x vmin %d vtime %d speed %d %d "
	       "rows %d cols %d outq %d\n", i, pair, t.c_iflag, t.c_oflag, t.c_cflag, t.c_lflag,
	       t.c_cc[VMIN], t.c_cc[VTIME], (int)cfgetispeed(&t), (int)cfgetospeed(&t), ws.ws_row,
	       ws.ws_col, outq);
}

/* a TCP socket: state, bytes not yet acknowledged, the listener's queue
 * of connections, and which slot its peer is (by address) */
static void observe_tcp(int i)
{
	struct tcp_info ti;
	struct sockaddr_in me, peer, other;
	socklen_t l = sizeof(ti), ml = sizeof(me), pl = sizeof(peer);
	int proto = 0, outq = 0, nsd = 0, inq = 0, pj = -1;
	socklen_t protol = sizeof(proto);

	if (getsockopt(slots[i], SOL_SOCKET, SO_PROTOCOL, &proto, &protol) || proto != IPPROTO_TCP ||
	    getsockopt(slots[i], IPPROTO_TCP, TCP_INFO, &ti, &l))
		return;
	ioctl(slots[i], SIOCOUTQ, &outq);
	ioctl(slots[i], SIOCOUTQNSD, &nsd);
	if (ti.tcpi_state != TCP_LISTEN)
		ioctl(slots[i], SIOCINQ, &inq);
	getsockname(slots[i], (void *)&me, &ml);
	if (!getpeername(slots[i], (void *)&peer, &pl))
		for (int j = 0; j < nslots; j++) {
			socklen_t ol = sizeof(other);

			if (j != i && !getsockname(slots[j], (void *)&other, &ol) &&
			    other.sin_family == AF_INET && other.sin_port == peer.sin_port) {
				pj = j;
				break;
			}
		}
	printf("tcp %d state %d outq %d notsent %d inq %d %s %u peer-slot %d\n", i, ti.tcpi_state,
	       outq, nsd, inq, ti.tcpi_state == TCP_LISTEN ? "backlog" : "unacked",
	       ti.tcpi_unacked, pj);
}

/* memfds: mode, size, seals */
static void observe_memfd(int i)
{
	struct stat st;
	int seals = fcntl(slots[i], F_GET_SEALS);

	if (fstat(slots[i], &st) < 0)
		return;
	printf("memfd %d mode %o size %lld nlink %ld seals %x\n", i, st.st_mode & 07777,
	       (long long)st.st_size, (long)st.st_nlink, seals);
}

static void observe_more(void)
{
	observe_threads();
	for (int i = 0; i < nslots; i++) {
		char path[64], t[256];
		ssize_t len;

		snprintf(path, sizeof(path), "/proc/self/fd/%d", slots[i]);
		len = readlink(path, t, sizeof(t) - 1);
		if (len < 0)
			continue;
		t[len] = 0;
		if (!strcmp(t, "anon_inode:[eventpoll]"))
			observe_epoll(i);
		else if (!strcmp(t, "anon_inode:[eventfd]"))
			observe_anon_fdinfo(i, "eventfd");
		else if (!strcmp(t, "anon_inode:[timerfd]"))
			observe_anon_fdinfo(i, "timerfd");
		else if (!strcmp(t, "anon_inode:[signalfd]"))
			observe_anon_fdinfo(i, "signalfd");
		else if (!strncmp(t, "/memfd:", 7))
			observe_memfd(i);
		else if (!strncmp(t, "socket:", 7))
			observe_tcp(i);
		else
			observe_tty(i);
	}
}

static void op(char *line)
{
	char name[32];
	long a = 0, b = 0, c = 0;
	int fd, r, fl;

	if (sscanf(line, "%31s %ld %ld %ld", name, &a, &b, &c) < 1)
		return;
	if (!strcmp(name, "open")) {
		char path[4200];

		file_name(path, sizeof(path), a);
		fd = open(path, OPEN_MODES[b % 4] | ((b % 4) == 2 ? 0 : O_CREAT), 0644);
		logr(name, fd < 0 ? -1 : 0);
		add_slot(fd);
	} else if (!strcmp(name, "reopen")) {
		char path[64];

		snprintf(path, sizeof(path), "/proc/self/fd/%d", slot_fd(a));
		fd = open(path, (int[]){ O_RDONLY, O_WRONLY, O_RDWR }[b % 3]);
		logr(name, fd < 0 ? -1 : 0);
		add_slot(fd);
	} else if (!strcmp(name, "write")) {
		fd = slot_fd(a);
		fl = nonblock_begin(fd);
		r = sf_write(fd, pattern(b), b % (1 << 17));
		logr(name, r);
		nonblock_end(fd, fl);
	} else if (!strcmp(name, "read")) {
		static char buf[1 << 17];

		fd = slot_fd(a);
		fl = nonblock_begin(fd);
		r = read(fd, buf, b < (long)sizeof(buf) ? b : (long)sizeof(buf));
		logr(name, r);
		if (r > 0 && !print_signalfd_read(fd, buf, r))
			printf("  data %016llx\n", (unsigned long long)hash_bytes(buf, r));
		nonblock_end(fd, fl);
	} else if (!strcmp(name, "fill")) {
		long total = 0;

		fd = slot_fd(a);
		fl = nonblock_begin(fd);
		for (int i = 0; i < (isatty(fd) ? 1 : 64) && (r = sf_write(fd, pattern(4096), 4096)) > 0; i++)
			total += r;
		logr(name, total);
		nonblock_end(fd, fl);
	} else if (!strcmp(name, "lseek")) {
		logr(name, lseek(slot_fd(a), b, (int[]){ SEEK_SET, SEEK_CUR, SEEK_END }[c % 3]));
	} else if (!strcmp(name, "dup")) {
		fd = dup(slot_fd(a));
		logr(name, fd < 0 ? -1 : 0);
		add_slot(fd);
	} else if (!strcmp(name, "dup2")) {
		fd = dup2(slot_fd(a), 40 + b % 8);
		logr(name, fd < 0 ? -1 : 0);
		if (fd >= 0 && fd != slot_fd(a))
			add_slot(fd);
	} else if (!strcmp(name, "dupfd")) {
		fd = fcntl(slot_fd(a), c % 2 ? F_DUPFD_CLOEXEC : F_DUPFD, 50 + b % 8);
		logr(name, fd < 0 ? -1 : 0);
		add_slot(fd);
	} else if (!strcmp(name, "close")) {
		if (!nslots) {
			logr(name, 0);
			return;
		}
		logr(name, close(slot_fd(a)));
		drop_slot(a);
	} else if (!strcmp(name, "pipe")) {
		int p[2];

		r = pipe2(p, a % 2 ? O_NONBLOCK : 0);
		logr(name, r);
		if (!r) {
			add_slot(p[0]);
			add_slot(p[1]);
		}
	} else if (!strcmp(name, "socketpair")) {
		int p[2];

		r = socketpair(AF_UNIX, (int[]){ SOCK_STREAM, SOCK_DGRAM, SOCK_SEQPACKET }[a % 3], 0, p);
		logr(name, r);
		if (!r) {
			add_slot(p[0]);
			add_slot(p[1]);
		}
	} else if (!strcmp(name, "shutdown")) {
		logr(name, shutdown(slot_fd(a), (int[]){ SHUT_RD, SHUT_WR, SHUT_RDWR }[b % 3]));
	} else if (!strcmp(name, "setfl")) {
		fd = slot_fd(a);
		fl = fcntl(fd, F_GETFL);
		if (fl >= 0) {
			fl = (fl & ~(O_NONBLOCK | O_APPEND)) | (b % 2 ? O_NONBLOCK : 0) | (c % 2 ? O_APPEND : 0);
			fl = fcntl(fd, F_SETFL, fl);
		}
		logr(name, fl);
	} else if (!strcmp(name, "setfd")) {
		logr(name, fcntl(slot_fd(a), F_SETFD, b % 2 ? FD_CLOEXEC : 0));
	} else if (!strcmp(name, "fork")) {
		pid_t pid;

		if (nchildren == MAX_CHILDREN) {
			logr(name, 0);
			return;
		}
		fflush(stdout);
		pid = fork();
		if (pid == 0)
			child_loop();
		logr(name, pid < 0 ? -1 : 0);
		if (pid > 0) {
			struct child *ch = &children[nchildren++];

			ch->pid = pid;
			ch->nfds = nslots;
			memcpy(ch->fds, slots, sizeof(slots));
			ch->nmaps = nmaps;
		}
	} else if (!strcmp(name, "childwrite")) {
		/* a child writes to a slot, closes everything and ends */
		pid_t pid;
		int status;

		fd = slot_fd(a);
		fflush(stdout);
		pid = fork();
		if (pid == 0) {
			fl = nonblock_begin(fd);
			r = sf_write(fd, pattern(b), b % (1 << 17));
			nonblock_end(fd, fl);
			_exit(r < 0 ? 100 : 0);
		}
		waitpid(pid, &status, 0);
		logr(name, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
	} else if (!strcmp(name, "sendfd")) {
		/* slot b's fd in flight over socket slot a */
		char cbuf[CMSG_SPACE(sizeof(int))] = { 0 }, byte = 'F';
		struct iovec iov = { &byte, 1 };
		struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
				    .msg_controllen = sizeof(cbuf) };
		struct cmsghdr *cm = CMSG_FIRSTHDR(&m);

		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		fd = slot_fd(b);
		memcpy(CMSG_DATA(cm), &fd, sizeof(int));
		logr(name, sendmsg(slot_fd(a), &m, MSG_DONTWAIT));
	} else if (!strcmp(name, "recvfd")) {
		char cbuf[CMSG_SPACE(sizeof(int) * 4)], byte;
		struct iovec iov = { &byte, 1 };
		struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
				    .msg_controllen = sizeof(cbuf) };
		struct cmsghdr *cm;
		int got = 0;

		r = recvmsg(slot_fd(a), &m, MSG_DONTWAIT);
		if (r >= 0)
			for (cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm))
				if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
					for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
						memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
						add_slot(fd);
						got++;
					}
		logr(name, r < 0 ? -1 : r * 100 + got);
	} else if (!strcmp(name, "mmap") || !strcmp(name, "mmap_shared_anon")) {
		int kind = name[4] ? 1 : a % 4, f = -1;
		size_t len = (1 + (name[4] ? a : b) % 4) * PAGE;
		char *p;

		if (nmaps == MAX_MAPS) {
			logr(name, 0);
			return;
		}
		if (kind >= 2) {
			char path[4200];
			struct stat st;

			file_name(path, sizeof(path), c);
			f = open(path, O_RDWR | O_CREAT, 0644);
			if (f >= 0 && !fstat(f, &st) && st.st_size < (off_t)len)
				r = ftruncate(f, len);
		}
		p = mmap(NULL, len, PROT_READ | PROT_WRITE,
			 (kind == 1 || kind == 2 ? MAP_SHARED : MAP_PRIVATE) | (kind < 2 ? MAP_ANONYMOUS : 0),
			 f, 0);
		if (f >= 0)
			close(f);
		logr(name, p == MAP_FAILED ? -1 : 0);
		if (p != MAP_FAILED)
			maps[nmaps++] = (struct map){ p, len, kind };
	} else if (!strcmp(name, "mwrite")) {
		struct map *m;

		if (!nmaps) {
			logr(name, 0);
			return;
		}
		m = &maps[a % nmaps];
		memset(m->addr + (b * PAGE) % m->len + 64 * (opno % 16), (int)('A' + c % 26), 64);
		logr(name, 0);
	} else if (!strcmp(name, "pwrite")) {
		/* the file under a file map changes, through an fd of its own */
		char path[4200];

		file_name(path, sizeof(path), a);
		fd = open(path, O_RDWR | O_CREAT, 0644);
		r = pwrite(fd, pattern(64), 64, (b % 4) * PAGE + 64 * (opno % 16));
		logr(name, r);
		close(fd);
	} else if (!strcmp(name, "unlink")) {
		char path[4200];

		file_name(path, sizeof(path), a);
		logr(name, unlink(path));
	} else if (!strcmp(name, "sigblock")) {
		sigset_t set;

		struct sigaction sa;
		sigset_t pending;

		sigemptyset(&set);
		sigaddset(&set, sig_at(a));
		sigpending(&pending);
		sigaction(sig_at(a), NULL, &sa);
		/* a pending signal let through to its default action would end us */
		if (!(b % 2) && sigismember(&pending, sig_at(a)) && sa.sa_handler == SIG_DFL &&
		    sig_at(a) != SIGWINCH)
			logr(name, 0);
		else
			logr(name, sigprocmask(b % 2 ? SIG_BLOCK : SIG_UNBLOCK, &set, NULL));
	} else if (!strcmp(name, "sigaction")) {
		struct sigaction sa = { 0 };

		sa.sa_handler = (void (*[])(int)){ SIG_DFL, SIG_IGN, h1, h2 }[b % 4];
		sa.sa_flags = (c & 1 ? SA_RESTART : 0) | (c & 2 ? SA_NODEFER : 0);
		sigemptyset(&sa.sa_mask);
		if (c & 4)
			sigaddset(&sa.sa_mask, sig_at(a + 1));
		logr(name, sigaction(sig_at(a), &sa, NULL));
	} else if (!strcmp(name, "raise")) {
		/* only a signal that is blocked or has a handler: no default action */
		struct sigaction sa;
		sigset_t cur;
		int sig = sig_at(a);

		sigprocmask(SIG_BLOCK, NULL, &cur);
		sigaction(sig, NULL, &sa);
		if (!sigismember(&cur, sig) && sa.sa_handler == SIG_DFL && sig != SIGWINCH)
			logr(name, 0);
		else
			logr(name, kill(getpid(), sig));
	} else if (!strcmp(name, "umask")) {
		logr(name, umask((mode_t)(a & 0777)));
	} else if (!strcmp(name, "chdir")) {
		char path[4200];

		snprintf(path, sizeof(path), a % 3 ? "%s/d%ld" : "%s", base, a % 3);
		logr(name, chdir(path));
	} else if (!strcmp(name, "rlimit")) {
		static const int RES[] = { RLIMIT_CORE, RLIMIT_NOFILE, RLIMIT_MSGQUEUE, RLIMIT_SIGPENDING };
		struct rlimit rl;
		int res = RES[a % 4];

		getrlimit(res, &rl);
		rl.rlim_cur = res == RLIMIT_NOFILE ? 256 + 64 * (b % 8) : 4096 * (b % 8);
		if (rl.rlim_max != RLIM_INFINITY && rl.rlim_cur > rl.rlim_max)
			rl.rlim_cur = rl.rlim_max;
		if (c % 2 && res != RLIMIT_NOFILE)
			rl.rlim_max = rl.rlim_cur;
		logr(name, setrlimit(res, &rl));
	} else if (!op_more(name, a, b, c)) {
		printf("op %ld %s -> unknown\n", opno, name);
	}
}

/* ---- the observation ---- */

struct unix_peer { unsigned ino, peer; };
static struct unix_peer upeers[4096];
static int nupeers;

/* every Unix socket's peer inode, from sock_diag */
static void read_unix_peers(void)
{
	int nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
	struct { struct nlmsghdr nh; struct unix_diag_req r; } req = {
		.nh = { .nlmsg_len = sizeof(req), .nlmsg_type = SOCK_DIAG_BY_FAMILY,
			.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP },
		.r = { .sdiag_family = AF_UNIX, .udiag_states = -1, .udiag_show = UDIAG_SHOW_PEER },
	};
	static char buf[1 << 16];

	nupeers = 0;
	if (nl < 0 || send(nl, &req, sizeof(req), 0) < 0)
		goto out;
	for (;;) {
		ssize_t n = recv(nl, buf, sizeof(buf), 0);
		struct nlmsghdr *h;

		if (n <= 0)
			goto out;
		for (h = (void *)buf; NLMSG_OK(h, n); h = NLMSG_NEXT(h, n)) {
			struct unix_diag_msg *m = NLMSG_DATA(h);
			struct rtattr *a;
			int len;

			if (h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR)
				goto out;
			len = h->nlmsg_len - NLMSG_LENGTH(sizeof(*m));
			for (a = (void *)(m + 1); RTA_OK(a, len); a = RTA_NEXT(a, len))
				if (a->rta_type == UNIX_DIAG_PEER && nupeers < 4096)
					upeers[nupeers++] = (struct unix_peer){ m->udiag_ino, *(unsigned *)RTA_DATA(a) };
		}
	}
out:
	if (nl >= 0)
		close(nl);
}

static unsigned unix_peer_of(unsigned ino)
{
	for (int i = 0; i < nupeers; i++)
		if (upeers[i].ino == ino)
			return upeers[i].peer;
	return 0;
}

static void fdinfo(pid_t pid, int fd, long *pos, long *flags)
{
	char path[64], line[256];
	FILE *f;

	*pos = *flags = -1;
	snprintf(path, sizeof(path), "/proc/%d/fdinfo/%d", pid, fd);
	if (!(f = fopen(path, "re")))
		return;
	while (fgets(line, sizeof(line), f)) {
		sscanf(line, "pos: %ld", pos);
		sscanf(line, "flags: %lo", flags);
	}
	fclose(f);
}

/* the fd's target with the base directory as "@" and ids as "#" */
static void target(pid_t pid, int fd, char *out, size_t n, unsigned long *ino)
{
	char path[64], t[4200];
	ssize_t len;
	size_t bl = strlen(base);

	*ino = 0;
	snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, fd);
	len = readlink(path, t, sizeof(t) - 1);
	if (len < 0) {
		snprintf(out, n, "closed");
		return;
	}
	t[len] = 0;
	if (sscanf(t, "pipe:[%lu]", ino) == 1)
		snprintf(out, n, "pipe");
	else if (sscanf(t, "socket:[%lu]", ino) == 1)
		snprintf(out, n, "socket");
	else if (!strncmp(t, "/dev/pts/", 9))	/* its number differs between runs */
		snprintf(out, n, "/dev/pts/#");
	else if (!strncmp(t, base, bl) && (t[bl] == '/' || !t[bl]))
		snprintf(out, n, "@%s", t + bl);
	else
		snprintf(out, n, "%s", t);
}

struct seen { pid_t pid; int fd; unsigned long ino; char kind[8]; };

static void observe(const char *tag)
{
	static struct seen all[MAX_SLOTS * (MAX_CHILDREN + 1)];
	int nall = 0;
	struct rlimit rl;
	sigset_t set;
	char cwd[4200];
	mode_t um = umask(0);
	static const int RES[] = { RLIMIT_CORE, RLIMIT_NOFILE, RLIMIT_MSGQUEUE, RLIMIT_SIGPENDING };

	umask(um);
	settle();
	printf("OBSERVE %s\n", tag);
	printf("umask %03o\n", um);
	if (!getcwd(cwd, sizeof(cwd)))
		snprintf(cwd, sizeof(cwd), "?%s", strerrorname_np(errno));
	printf("cwd %s\n", !strncmp(cwd, base, strlen(base)) ? cwd + strlen(base) : cwd);
	for (int i = 0; i < 4; i++) {
		getrlimit(RES[i], &rl);
		printf("rlimit %d %lld %lld\n", RES[i], (long long)rl.rlim_cur, (long long)rl.rlim_max);
	}
	sigprocmask(SIG_BLOCK, NULL, &set);
	printf("sigmask");
	for (int s = 1; s < 65; s++)
		if (sigismember(&set, s))
			printf(" %d", s);
	sigpending(&set);
	printf("\nsigpending");
	for (int s = 1; s < 65; s++)
		if (sigismember(&set, s))
			printf(" %d", s);
	printf("\n");
	for (int i = 0; i < NSIGS; i++) {
		struct sigaction sa;
		int sig = sig_at(i);
		const char *h;

		sigaction(sig, NULL, &sa);
		h = sa.sa_handler == SIG_DFL ? "dfl" : sa.sa_handler == SIG_IGN ? "ign" :
		    sa.sa_handler == h1 ? "h1" : sa.sa_handler == h2 ? "h2" : "other";
		printf("signal %d %s flags %x mask%s caught %d %d\n", i, h,
		       sa.sa_flags & ~0x04000000 /* SA_RESTORER */,
		       sigismember(&sa.sa_mask, sig_at(i + 1)) ? " next" : "",
		       caught[0][i], caught[1][i]);
	}

	read_unix_peers();
	for (int p = 0; p <= nchildren; p++) {
		pid_t pid = p ? children[p - 1].pid : getpid();
		int n = p ? children[p - 1].nfds : nslots;
		int *fds = p ? children[p - 1].fds : slots;

		for (int i = 0; i < n; i++) {
			struct seen *s = &all[nall++];
			char what[4300];

			s->pid = pid;
			s->fd = fds[i];
			target(pid, fds[i], what, sizeof(what), &s->ino);
			snprintf(s->kind, sizeof(s->kind), "%.7s", what);
		}
	}
	for (int p = 0, k = 0; p <= nchildren; p++) {
		pid_t pid = p ? children[p - 1].pid : getpid();
		int n = p ? children[p - 1].nfds : nslots;
		int *fds = p ? children[p - 1].fds : slots;

		for (int i = 0; i < n; i++, k++) {
			struct seen *s = &all[k];
			char what[4300];
			long pos, flags;
			unsigned long ino;

			target(pid, fds[i], what, sizeof(what), &ino);
			fdinfo(pid, fds[i], &pos, &flags);
			printf("fd %d.%d %s pos %ld flags %lo", p, i, what, pos, flags);
			if (p == 0) {
				struct pollfd pfd = { fds[i], POLLIN | POLLOUT, 0 };
				int q = -1, fdfl = fcntl(fds[i], F_GETFD);

				poll(&pfd, 1, 0);
				if (ioctl(fds[i], FIONREAD, &q) < 0)
					q = -errno;
				printf(" fd_flags %d poll %x inq %d", fdfl, pfd.revents, q);
			}
			if (!strcmp(s->kind, "socket")) {
				int type = 0, err = 0;
				socklen_t l = sizeof(int);
				struct sockaddr_un sun;
				socklen_t sl = sizeof(sun);
				unsigned peer = unix_peer_of(s->ino);
				int pj = -1;

				if (p == 0) {
					getsockopt(fds[i], SOL_SOCKET, SO_TYPE, &type, &l);
					l = sizeof(int);
					getsockopt(fds[i], SOL_SOCKET, SO_ERROR, &err, &l);
					printf(" type %d so_error %d peername %s", type, err,
					       getpeername(fds[i], (void *)&sun, &sl) ? strerrorname_np(errno) : "ok");
				}
				for (int j = 0; j < nall && peer; j++)
					if (all[j].ino == peer && !strcmp(all[j].kind, "socket")) {
						pj = j;
						break;
					}
				/* the peer: the first fd seen of it, else inside the job or not at all */
				if (pj >= 0)
					printf(" peer-of #%d", pj);
				else
					printf(" peer %s", peer ? "elsewhere" : "none");
			}
			if (p == 0 && (!strcmp(s->kind, "socket") || !strcmp(s->kind, "pipe"))) {
				static char buf[1 << 17];
				ssize_t got;

				if (!strcmp(s->kind, "socket")) {
					got = recv(fds[i], buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT);
				} else {	/* a pipe's bytes, through tee, left in place */
					int t[2];

					got = -1;
					if (!pipe2(t, O_NONBLOCK)) {
						fcntl(t[1], F_SETPIPE_SZ, 1 << 20);
						got = tee(fds[i], t[1], sizeof(buf), SPLICE_F_NONBLOCK);
						if (got > 0)
							got = read(t[0], buf, got);
						close(t[0]);
						close(t[1]);
					}
				}
				if (got < 0)
					printf(" peek %s", strerrorname_np(errno));
				else
					printf(" peek %zd %016llx", got, (unsigned long long)hash_bytes(buf, got));
			}
			/* the same open file description as an fd before it (kcmp),
			 * the same pipe as one before it (inode) */
			for (int j = 0; j < k; j++)
				if (!syscall(SYS_kcmp, pid, all[j].pid, KCMP_FILE, fds[i], all[j].fd)) {
					printf(" same-file-as #%d", j);
					break;
				}
			for (int j = 0; j < k; j++)
				if (s->ino && all[j].ino == s->ino && !strcmp(all[j].kind, s->kind)) {
					printf(" same-object-as #%d", j);
					break;
				}
			printf("\n");
		}
	}

	for (int p = 0; p <= nchildren; p++) {
		pid_t pid = p ? children[p - 1].pid : getpid();
		int n = p ? children[p - 1].nmaps : nmaps;

		for (int i = 0; i < n; i++) {
			static char buf[4 * PAGE];
			struct iovec local = { buf, maps[i].len }, remote = { maps[i].addr, maps[i].len };
			ssize_t got = p ? process_vm_readv(pid, &local, 1, &remote, 1, 0)
				      : (memcpy(buf, maps[i].addr, maps[i].len), (ssize_t)maps[i].len);

			printf("map %d.%d kind %d", p, i, maps[i].kind);
			if (got != (ssize_t)maps[i].len)
				printf(" read %s\n", strerrorname_np(errno));
			else
				printf(" %016llx\n", (unsigned long long)hash_bytes(buf, got));
		}
	}
	/* the maps' protections and backing, as /proc/self/maps shows them */
	for (int i = 0; i < nmaps; i++) {
		char line[4400], perms[8] = "?", path[4300] = "";
		unsigned long lo, hi;
		FILE *f = fopen("/proc/self/maps", "re");

		while (f && fgets(line, sizeof(line), f)) {
			path[0] = 0;
			if (sscanf(line, "%lx-%lx %7s %*s %*s %*s %4299[^\n]", &lo, &hi, perms, path) >= 3 &&
			    lo <= (unsigned long)maps[i].addr && (unsigned long)maps[i].addr < hi)
				break;
			strcpy(perms, "?");
		}
		if (f)
			fclose(f);
		printf("maprange %d %s %s\n", i, perms,
		       !strncmp(path, base, strlen(base)) ? path + strlen(base) : path);
	}
	for (int f = 0; f < NFILES; f++) {
		char path[4200], buf[1 << 16];
		int fd;
		ssize_t n;
		uint64_t h = 0;
		long size = 0;

		file_name(path, sizeof(path), f);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0) {
			printf("file %d absent\n", f);
			continue;
		}
		while ((n = read(fd, buf, sizeof(buf))) > 0) {
			h = zdtm_mix(h, hash_bytes(buf, n));
			size += n;
		}
		close(fd);
		printf("file %d size %ld %016llx\n", f, size, (unsigned long long)h);
	}
	observe_more();
	printf("END %s\n", tag);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	static char line[256];
	FILE *prog;
	int after = 0;

	if (argc < 2 || !(prog = fopen(argv[1], "re")))
		zdtm_fail("usage: statefuzz PROGRAM_FILE");
	if (!getcwd(base, sizeof(base)))
		zdtm_fail("getcwd");
	mkdir("d1", 0755);
	mkdir("d2", 0755);
	/* what the run starts with is the same under ckpt as without it */
	umask(022);
	signal(SIGPIPE, SIG_IGN);	/* writes to a closed pipe log EPIPE */
	for (opno = 0; fgets(line, sizeof(line), prog); opno++) {
		if (!strncmp(line, "gate", 4)) {
			observe("gate");	/* before the checkpoint */
			printf("READY\n");
			fflush(stdout);
			zdtm_hold();
			observe("restart");
			after = 1;
			continue;
		}
		op(line);
		settle();
		fflush(stdout);
	}
	fclose(prog);
	if (!after)
		zdtm_fail("no gate line");
	observe("end");
	for (int i = 0; i < nchildren; i++) {
		kill(children[i].pid, SIGKILL);
		waitpid(children[i].pid, NULL, 0);
	}
	zdtm_pass("done");
	return 0;
}
