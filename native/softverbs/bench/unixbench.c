/*
 * Baseline for softverbs_bench.py: the same ping-pong and burst patterns
 * as svbench.c over a plain AF_UNIX socket pair between two processes
 * (blocking I/O).
 *   unixbench <stream|dgram> <size> <iters> <window>
 * window == 0: prints "lat_us <one-way usec>"; else "bw_MBps <MB/s>".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DIE(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

static int stream;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void xsend(int fd, char *b, size_t n)
{
	while (n) {
		ssize_t k = write(fd, b, n);
		if (k <= 0)
			DIE("write");
		if (!stream)
			return;
		b += k;
		n -= k;
	}
}

static void xrecv(int fd, char *b, size_t n)
{
	while (n) {
		ssize_t k = read(fd, b, n);
		if (k <= 0)
			DIE("read");
		if (!stream)
			return;
		b += k;
		n -= k;
	}
}

int main(int argc, char **argv)
{
	if (argc != 5)
		DIE("usage");
	stream = !strcmp(argv[1], "stream");
	size_t size = strtoul(argv[2], NULL, 0);
	int iters = atoi(argv[3]), window = atoi(argv[4]);
	int sv[2], sz = 4 << 20;
	char *buf = malloc(size + 64);

	memset(buf, 0x5a, size + 64);
	if (socketpair(AF_UNIX, stream ? SOCK_STREAM : SOCK_DGRAM, 0, sv))
		DIE("socketpair");
	for (int i = 0; i < 2; i++) {
		setsockopt(sv[i], SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
		setsockopt(sv[i], SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
	}
	int warm = iters / 10 + 1;
	pid_t pid = fork();
	int fd = pid ? sv[0] : sv[1];
	double t0 = 0;

	for (int i = 0; i < iters + warm; i++) {
		if (i == warm)
			t0 = now();
		if (window == 0) {
			if (pid) {
				xsend(fd, buf, size);
				xrecv(fd, buf, size);
			} else {
				xrecv(fd, buf, size);
				xsend(fd, buf, size);
			}
		} else if (pid) {
			for (int w = 0; w < window; w++)
				xsend(fd, buf, size);
			xrecv(fd, buf, 8);
		} else {
			for (int w = 0; w < window; w++)
				xrecv(fd, buf, size);
			xsend(fd, buf, 8);
		}
	}
	if (!pid)
		return 0;
	double t = now() - t0;
	waitpid(pid, NULL, 0);
	if (window == 0)
		printf("lat_us %.3f\n", t * 1e6 / iters / 2);
	else
		printf("bw_MBps %.1f\n", (double)size * window * iters / t / 1e6);
	return 0;
}
