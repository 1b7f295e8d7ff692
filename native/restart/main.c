/*
 * ckpt-restart: restores the process images of one host, as one process
 * tree in one fresh pid namespace (docs/PROTOCOL.md, "ckpt-restart").
 *
 *   ckpt-restart --coord SOCKET --job-id ID [--status-fd FD] [--addr-map OLD=NEW]...
 *                [--peer-image FILE]... [--staged-dir DIR] [--lazy] [--xxh3 HEX]... IMAGE...
 *
 * The n-th --xxh3 is the checksum of the n-th image; an image of the same
 * name in --staged-dir with that checksum is read instead (--stage-dir).  On --status-fd it
 * writes "exited N" when the job's root exits while other processes of the
 * job still run; it then goes on until they are gone.  --peer-image names
 * the images of the job's other hosts, and --addr-map a host that moved
 * (cross_host.c).  --lazy: private memory is filled on demand after the
 * processes resume (lazy.c).
 *
 * Statically linked at CKPT_RESERVE_START, a range every checkpointed
 * process keeps free, so it can replace the whole address space around
 * itself.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "restart.h"
#include "sys.h"

static struct image imgs[MAX_IMAGES];
static struct restart_args args;
static char coord_copy[108];
static char job_copy[64];

static void usage(void)
{
	die("usage: ckpt-restart --coord SOCKET --job-id ID [--status-fd FD] [--addr-map OLD=NEW]... "
	    "[--peer-image FILE]... [--staged-dir DIR] [--lazy] [--xxh3 HEX]... IMAGE...");
}

static void parse_args(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "coord", required_argument, NULL, 'c' },
		{ "job-id", required_argument, NULL, 'j' },
		{ "xxh3", required_argument, NULL, 'x' },
		{ "status-fd", required_argument, NULL, 's' },
		{ "addr-map", required_argument, NULL, 'a' },
		{ "peer-image", required_argument, NULL, 'p' },
		{ "staged-dir", required_argument, NULL, 'S' },
		{ "lazy", no_argument, NULL, 'L' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	args.status_fd = -1;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'c': args.coord = optarg; break;
		case 'j': args.job_id = optarg; break;
		case 's':
			args.status_fd = atoi(optarg);
			if (args.status_fd < 0 || fcntl(args.status_fd, F_GETFD) < 0)
				die("--status-fd %s: not an open fd", optarg);
			break;
		case 'a': addr_map_add(optarg); break;
		case 'S': args.staged_dir = optarg; break;
		case 'L': args.lazy = 1; break;
		case 'p':
			if (args.npeer_images == MAX_IMAGES)
				die("too many --peer-image");
			args.peer_image[args.npeer_images++] = optarg;
			break;
		case 'x':
			if (args.nxxh3 == MAX_IMAGES)
				die("too many --xxh3");
			args.xxh3[args.nxxh3++] = optarg;
			break;
		default: usage();
		}
	}
	if (optind == argc || !args.coord || !args.job_id)
		usage();
	if (argc - optind > MAX_IMAGES)
		die("too many images (at most %d)", MAX_IMAGES);
	if (args.nxxh3 && args.nxxh3 != (unsigned)(argc - optind))
		die("%u checksums for %d images", args.nxxh3, argc - optind);
	if (strlen(args.coord) >= sizeof(((struct ckpt_restart_info *)0)->coord_path))
		die("coordinator socket path too long: %s", args.coord);
	for (int i = optind; i < argc; i++)
		args.image[args.nimages++] = argv[i];
	/* argv lives on the old stack, which restore_memory() unmaps */
	snprintf(coord_copy, sizeof(coord_copy), "%s", args.coord);
	snprintf(job_copy, sizeof(job_copy), "%s", args.job_id);
	args.coord = coord_copy;
	args.job_id = job_copy;
}

/* Room for the fds we keep above the image's while restoring. */
static void raise_fd_limit(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

/* With $CKPT_RESTART_TIMING set, phase times go to stderr (for benchmarks). */
static int timing;
static long t_start_ns;

static long now_ns(void)
{
	struct timespec ts;

	sys2(SYS_clock_gettime, CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void mark(const char *what)
{
	char line[96];
	long ms10;
	int n = 0;

	if (!timing)
		return;
	ms10 = (now_ns() - t_start_ns) / 100000;	/* tenths of ms, no printf */
	line[n++] = ' ';
	for (const char *p = "ckpt-restart: "; *p; p++)
		line[n++] = *p;
	for (; *what && n < 60; what++)
		line[n++] = *what;
	line[n++] = ' ';
	char digits[24];
	int k = 0;
	do
		digits[k++] = '0' + ms10 % 10;
	while ((ms10 /= 10) && k < 20);
	while (k > 1)
		line[n++] = digits[--k];
	line[n++] = '.';
	line[n++] = digits[0];
	line[n++] = ' ';
	line[n++] = 'm';
	line[n++] = 's';
	line[n++] = '\n';
	sys3(SYS_write, get_error_fd(), line + 1, n - 1);
}

/* A restored process, born with its original pid. */
static int restorer(void *arg)
{
	struct image *img = arg;
	/* every signal, glibc's own two as well (sigfillset leaves them
	 * out): the threads made later start with this mask, and a timer's
	 * signal that arrived at one of them before it took its own mask
	 * would be lost if the job ignored it (as posix_spawn's children
	 * ignore glibc's SIGCANCEL, the timer thread's signal) */
	uint64_t all = ~0ULL;

	mark("in the new namespace");
	tree_enter(img);
	restore_process_early(img);
	restore_fds(img);
	prepare_memory(img);
	check_capabilities(img);
	check_credentials(img);
	tree_report_restored(img);
	sys4(SYS_rt_sigprocmask, SIG_SETMASK, &all, NULL, 8);
	/* point of no return */
	restore_memory(img);
	shared_close_shms();
	restore_locks(img, 1);
	mark("memory restored");
	restore_process_late(img, &args);
	relock_memory(img);
	restore_threads(img);
}

static void check_pids(struct image *imgs, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		if (imgs[i].hdr.pid <= 1)
			die("%s: cannot restore pid %d", imgs[i].file, imgs[i].hdr.pid);
		for (unsigned j = 0; j < i; j++)
			if (imgs[j].hdr.pid == imgs[i].hdr.pid)
				die("%s and %s: both are pid %d", imgs[j].file, imgs[i].file,
				    imgs[i].hdr.pid);
	}
}

/* pid 1 of the job's pid namespace */
static int init_main(void)
{
	make_exited_pidfd();
	return tree_run();
}

int main(int argc, char **argv)
{
	int err, status_fd;

	timing = getenv("CKPT_RESTART_TIMING") != NULL;
	t_start_ns = now_ns();
	parse_args(argc, argv);
	err = arena_init();
	if (err)
		die("the restart address range is in use: %s", strerror(err));
	raise_fd_limit();
	helpers_init();
	for (unsigned i = 0; i < args.nimages; i++)
		image_load(&imgs[i], args.image[i], args.nxxh3 ? args.xxh3[i] : NULL,
			   args.staged_dir);
	addr_map_apply(imgs, args.nimages);
	cross_host_load(args.peer_image, args.npeer_images);
	check_pids(imgs, args.nimages);
	mark("images checked and loaded");
	prepare_fds(imgs, args.nimages);
	if (args.lazy)		/* its fds above the image's (prepare_fds) */
		lazy_init(imgs, args.nimages);
	status_fd = args.status_fd < 0 ? -1 : move_high(args.status_fd, "the status fd");
	tree_init(imgs, args.nimages, restorer, status_fd);
	lazy_server_start(status_fd);
	helpers_pick_pids();
	enter_namespaces();
	shared_create(imgs, args.nimages, args.coord);	/* System V segments: in the new IPC namespace */
	sysv_ipc_create(imgs, args.nimages);
	mark("shared objects created");
	return run_init(init_main);
}
