/*
 * Lazy restore (--lazy): a restored process maps its private anonymous
 * regions empty, registers them with a userfaultfd and hands that to the
 * page server (lazy_server.c) before it resumes; the server fills a page
 * the process touches from the image at once and streams the rest.
 *
 * The server is forked by ckpt-restart before the job's namespaces, so it
 * is no process of the job.  Every userfaultfd is sent twice: to the
 * server, and to a "keeper" socket that ckpt-restart never reads: its
 * queued copies keep the userfaultfd open if the server dies, so that a
 * process waits on its page (and is killed with the job: run_init()) and
 * never sees an empty page instead.  The server drains the keeper when
 * the last page is in, which ends the registrations.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include "restart.h"
#include "sys.h"

#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC_NEW _IO(0xAA, 0x00)
#endif

#define LAZY_FEATURES (UFFD_FEATURE_EVENT_FORK | UFFD_FEATURE_EVENT_REMAP | \
		       UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_UNMAP)

static int lazy_on;
static int dev_fd = -1;			/* /dev/userfaultfd, if we may open it */
static int requests[2] = { -1, -1 };	/* processes -> server */
static int keeper[2] = { -1, -1 };	/* processes -> nobody */
static pid_t server_pid;
static struct image *images;
static unsigned nimages;

/* Whether the page server fills this region (else the reader does). */
int lazy_region(const struct loaded_vma *lv)
{
	const struct ckpt_vma *v = &lv->v;

	if (!lazy_on || (!v->nruns && !v->nrefs) || v->shared || v->nguards)
		return 0;
	/* a child's copy of a wipe-on-fork region is empty, not the image's */
	if (v->advice & (CKPT_ADVICE_LOCKED | CKPT_ADVICE_DROPPABLE | CKPT_ADVICE_WIPEONFORK))
		return 0;
	return v->kind == CKPT_VMA_ANON || v->kind == CKPT_VMA_HEAP || v->kind == CKPT_VMA_STACK;
}

/* A new userfaultfd of the calling process's memory, or -errno. */
int lazy_new_uffd(void)
{
	if (dev_fd >= 0)
		return sys3(SYS_ioctl, dev_fd, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK);
	return sys1(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
}

static long uffd_api(int fd)
{
	struct uffdio_api api = { .api = UFFD_API, .features = LAZY_FEATURES };

	return sys3(SYS_ioctl, fd, UFFDIO_API, &api);
}

/* Before anything starts: refused in one line without the privileges. */
static void check_userfaultfd(void)
{
	int fd;
	long r;

	dev_fd = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
	fd = lazy_new_uffd();
	if (fd < 0)
		die("--lazy needs userfaultfd, which this user may not use: an administrator can "
		    "allow it by running the restart as root, setting vm.unprivileged_userfaultfd=1, "
		    "or giving read-write access to /dev/userfaultfd");
	r = uffd_api(fd);
	close(fd);
	if (r == -EPERM)
		die("--lazy needs userfaultfd's fork events, which need CAP_SYS_PTRACE: an "
		    "administrator can allow it by running the restart as root");
	if (r < 0)
		die("--lazy: this kernel's userfaultfd lacks the events a lazy restore needs "
		    "(fork, mremap, madvise, munmap): %s", strerror(-r));
	if (dev_fd >= 0)
		dev_fd = move_high(dev_fd, "/dev/userfaultfd");
}

static unsigned lazy_processes(void)
{
	unsigned n = 0;

	for (unsigned i = 0; i < nimages; i++) {
		int any = 0;

		for (unsigned v = 0; !images[i].peer && v < images[i].nvmas && !any; v++)
			any = lazy_region(&images[i].vmas[v]);
		n += any;
	}
	return n;
}

void lazy_init(struct image *imgs, unsigned n)
{
	int size = 4 << 20;

	lazy_on = 1;
	images = imgs;
	nimages = n;
	check_userfaultfd();
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, requests) ||
	    socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, keeper))
		die("--lazy: cannot make the page server's sockets: %s", strerror(errno));
	/* a message each process: room for the largest job, never blocked */
	setsockopt(keeper[1], SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
	setsockopt(requests[1], SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
	for (int i = 0; i < 2; i++) {
		requests[i] = move_high(requests[i], "the page server's socket");
		keeper[i] = move_high(keeper[i], "the page server's socket");
	}
}

unsigned lazy_fds(int *out, unsigned max)
{
	unsigned n = 0;

	if (!lazy_on || max < 3)
		return 0;
	out[n++] = dev_fd;
	out[n++] = requests[1];
	out[n++] = keeper[1];
	return n;
}

pid_t lazy_server_pid(void)
{
	return server_pid;
}

void lazy_server_forget(void)		/* reaped */
{
	server_pid = 0;
}

void lazy_close_requests(void)
{
	if (requests[1] >= 0)
		close(requests[1]);
	requests[1] = -1;
}

/* The job is over (every process of its namespace is gone): the server
 * says its last word if it has one, and ends. */
void lazy_server_wait(void)
{
	int status;

	if (server_pid <= 0)
		return;
	kill(server_pid, SIGTERM);
	while (waitpid(server_pid, &status, 0) < 0 && errno == EINTR)
		;
	server_pid = 0;
}

/* Forked before the namespaces: ckpt-restart's child, outside the job. */
void lazy_server_start(int status_fd)
{
	unsigned expected;
	pid_t pid;

	if (!lazy_on)
		return;
	expected = lazy_processes();
	pid = fork();
	if (pid < 0)
		die("--lazy: cannot fork the page server: %s", strerror(errno));
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		close(requests[1]);
		lazy_serve(images, expected, requests[0], keeper[0], keeper[1], status_fd);
	}
	server_pid = pid;
	close(requests[0]);	/* the server's alone */
	requests[0] = -1;
}

static long send_uffd(int sock, int32_t index, int uffd)
{
	char control[CMSG_SPACE(sizeof(int))] = { 0 };
	struct iovec iov = { &index, sizeof(index) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
			      .msg_controllen = sizeof(control) };
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
	long r;

	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &uffd, sizeof(int));
	do
		r = sys3(SYS_sendmsg, sock, &msg, 0);
	while (r == -EINTR);
	return r < 0 ? r : 0;
}

static void register_region(int uffd, const struct ckpt_vma *v)
{
	struct uffdio_register reg = {
		.range = { .start = v->start, .len = v->end - v->start },
		.mode = UFFDIO_REGISTER_MODE_MISSING,
	};
	long r = sys3(SYS_ioctl, uffd, UFFDIO_REGISTER, &reg);

	if (r < 0)
		fatal("--lazy: registering a region with userfaultfd", r);
}

static void close_lazy_fds(void)
{
	if (dev_fd >= 0)
		sys1(SYS_close, dev_fd);
	sys1(SYS_close, requests[1]);
	sys1(SYS_close, keeper[1]);
}

/*
 * After the point of no return, once every region is mapped: the lazy
 * regions (still empty) are registered, and their userfaultfd goes to the
 * server.  From here on a touch of one of them waits for the server.
 */
void lazy_attach(struct image *img)
{
	int uffd = -1;
	long r;

	if (!lazy_on)
		return;
	for (unsigned i = 0; i < img->nvmas; i++) {
		if (!lazy_region(&img->vmas[i]))
			continue;
		if (uffd < 0) {
			uffd = lazy_new_uffd();
			if (uffd < 0)
				fatal("--lazy: creating a userfaultfd", uffd);
			if ((r = uffd_api(uffd)) < 0)
				fatal("--lazy: enabling userfaultfd's events", r);
		}
		register_region(uffd, &img->vmas[i].v);
	}
	if (uffd >= 0) {
		if ((r = send_uffd(keeper[1], img - images, uffd)) < 0 ||
		    (r = send_uffd(requests[1], img - images, uffd)) < 0)
			fatal("--lazy: handing the userfaultfd to the page server", r);
		sys1(SYS_close, uffd);
	}
	close_lazy_fds();
}
