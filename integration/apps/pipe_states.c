/*
 * Pipes as a process holds them: both ends of one pipe in this process
 * with bytes in it, O_NONBLOCK on one end only (fcntl after pipe()), a
 * pipe made with pipe2(O_NONBLOCK) on both ends, a read end whose
 * writer is closed (EOF after the bytes), and a pipe in packet mode
 * (pipe2(O_DIRECT)) holding three packets, each read alone.  At the end
 * each end has its flags and its bytes as before.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <string.h>
#include "zdtm.h"

static void flags_are(int fd, int nonblock, const char *what)
{
	int fl = fcntl(fd, F_GETFL);

	zdtm_check(fl >= 0 && !!(fl & O_NONBLOCK) == nonblock, "%s: O_NONBLOCK %s", what,
		   fl & O_NONBLOCK ? "set" : "clear");
}

int main(int argc, char **argv)
{
	long steps = 100, pace = 10;
	static const char *const packet[] = { "one", "second", "third!!" };
	int both[2], one_side[2], nb[2], eof[2], packets[2];
	char buf[32];
	uint64_t hash = 0;

	zdtm_args(argc, argv, &steps, &pace);
	zdtm_check(pipe(both) == 0 && write(both[1], "in both", 7) == 7, "pipe");
	zdtm_check(pipe(one_side) == 0 && fcntl(one_side[0], F_SETFL, O_NONBLOCK) == 0, "one side");
	zdtm_check(pipe2(nb, O_NONBLOCK) == 0 && write(nb[1], "nb", 2) == 2, "pipe2");
	zdtm_check(pipe(eof) == 0 && write(eof[1], "bye", 3) == 3 && close(eof[1]) == 0, "eof");
	zdtm_check(pipe2(packets, O_DIRECT) == 0, "pipe2(O_DIRECT)");
	for (int i = 0; i < 3; i++)
		zdtm_check(write(packets[1], packet[i], strlen(packet[i])) == (ssize_t)strlen(packet[i]),
			   "packet %d", i);
	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		hash = zdtm_mix(hash, step);
		zdtm_pace(pace);
	}
	zdtm_hold();
	flags_are(both[0], 0, "read end");
	flags_are(both[1], 0, "write end");
	flags_are(one_side[0], 1, "non-blocking read end");
	flags_are(one_side[1], 0, "its blocking write end");
	flags_are(nb[0], 1, "pipe2 read end");
	flags_are(nb[1], 1, "pipe2 write end");
	zdtm_check(read(both[0], buf, sizeof(buf)) == 7 && !memcmp(buf, "in both", 7),
		   "bytes of a pipe with both ends here");
	zdtm_check(write(both[1], "again", 5) == 5 && read(both[0], buf, 5) == 5, "that pipe works");
	zdtm_check(read(one_side[0], buf, 1) == -1 && errno == EAGAIN, "an empty non-blocking pipe");
	zdtm_check(read(nb[0], buf, sizeof(buf)) == 2, "pipe2 bytes");
	zdtm_check(read(eof[0], buf, sizeof(buf)) == 3 && !memcmp(buf, "bye", 3), "bytes before EOF");
	zdtm_check(read(eof[0], buf, sizeof(buf)) == 0, "EOF once the writer is gone");
	for (int i = 0; i < 3; i++) {
		ssize_t n = read(packets[0], buf, sizeof(buf));

		zdtm_check(n == (ssize_t)strlen(packet[i]) && !memcmp(buf, packet[i], n),
			   "packet %d read as %zd bytes", i, n);
	}
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
