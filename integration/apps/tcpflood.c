/*
 * A TCP connection on 127.0.0.1 kept full in both directions: parent and
 * child each write their stream as fast as the connection takes it and
 * read the other's slowly (one chunk per paced step).  So at any moment
 * each sender holds bytes its receiver has no room for, and a checkpoint
 * must save those too.  Each side checks every 64-bit word it receives
 * (the i-th word of a stream is a known function of i) and hashes the
 * stream; the parent prints both hashes.
 *
 * tcpflood [steps] [ms-per-step] [chunk KiB]
 */
#include <fcntl.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include "zdtm.h"

static size_t chunk = 64 << 10;

static uint64_t word(int stream, uint64_t i)
{
	return zdtm_mix(stream + 1, i);
}

/* Writes all the connection takes now of stream's bytes [*sent, total). */
static void write_ahead(int s, int stream, uint64_t *sent, uint64_t total)
{
	static uint64_t buf[(1 << 20) / 8 + 2];

	while (*sent < total) {
		size_t want = chunk < total - *sent ? chunk : total - *sent;
		uint64_t first = *sent / 8;
		ssize_t n;

		for (size_t i = 0; i < want / 8 + 2; i++)
			buf[i] = word(stream, first + i);
		n = send(s, (char *)buf + *sent % 8, want, MSG_DONTWAIT);
		zdtm_check(n > 0 || errno == EAGAIN, "send: %s", strerror(errno));
		if (n <= 0)
			return;
		*sent += n;
	}
}

/* Reads one chunk of the peer's stream and checks it. */
static uint64_t read_chunk(int s, int stream, uint64_t *got, uint64_t hash)
{
	static uint64_t buf[(1 << 20) / 8];
	size_t have = 0;

	while (have < chunk) {
		ssize_t n = recv(s, (char *)buf + have, chunk - have, 0);

		zdtm_check(n > 0, "stream %d ended early at byte %llu: %zd %s", stream,
			   (unsigned long long)(*got + have), n, n < 0 ? strerror(errno) : "");
		have += n;
	}
	for (size_t i = 0; i < chunk / 8; i++) {
		uint64_t idx = *got / 8 + i;

		zdtm_check(buf[i] == word(stream, idx), "stream %d: word %llu is %016llx", stream,
			   (unsigned long long)idx, (unsigned long long)buf[i]);
		hash = zdtm_mix(hash, buf[i]);
	}
	*got += chunk;
	return hash;
}

/* One side: writes stream `mine`, reads stream `theirs`, step by step. */
static uint64_t flood(int s, int mine, long steps, long pace)
{
	uint64_t total = (uint64_t)steps * chunk, sent = 0, got = 0, hash = mine;

	for (long step = 0; step < steps; step++) {
		write_ahead(s, mine, &sent, total);
		hash = read_chunk(s, !mine, &got, hash);
		zdtm_pace(pace);
	}
	while (sent < total) {	/* the peer reads the rest */
		write_ahead(s, mine, &sent, total);
		zdtm_pace(1);
	}
	return hash;
}

int main(int argc, char **argv)
{
	long steps = 200, pace = 10;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int l, s, status;
	uint64_t hash;
	pid_t pid;

	zdtm_args(argc, argv, &steps, &pace);
	if (argc > 3)
		chunk = (size_t)atol(argv[3]) << 10;
	zdtm_check(chunk >= 8 && chunk <= (1 << 20) && chunk % 8 == 0, "chunk of 1 KiB to 1 MiB");
	l = socket(AF_INET, SOCK_STREAM, 0);
	zdtm_check(l >= 0 && bind(l, (struct sockaddr *)&a, len) == 0 && listen(l, 1) == 0 &&
		   getsockname(l, (struct sockaddr *)&a, &len) == 0, "listen");
	pid = fork();
	zdtm_check(pid >= 0, "fork");
	if (pid == 0) {
		close(l);
		s = socket(AF_INET, SOCK_STREAM, 0);
		zdtm_check(s >= 0 && connect(s, (struct sockaddr *)&a, len) == 0, "connect");
		hash = flood(s, 1, steps, pace);
		close(s);
		_exit((int)(hash % 127) + 1);
	}
	s = accept(l, NULL, NULL);
	zdtm_check(s >= 0, "accept");
	close(l);
	printf("READY\n");
	fflush(stdout);
	hash = flood(s, 0, steps, pace);
	zdtm_hold();
	zdtm_check(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) > 0,
		   "child status %x", status);
	close(s);
	zdtm_pass("%016llx %d", (unsigned long long)hash, WEXITSTATUS(status));
	return 0;
}
