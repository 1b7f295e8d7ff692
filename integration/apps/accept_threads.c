/*
 * Several threads accept() on one blocking TCP listener while bursts of
 * clients connect, more than the threads take at once, so a checkpoint
 * finds connections waiting in the backlog (the shim takes them and
 * leaves tokens) and threads blocked in accept at the same time (they
 * race with the shim for its tokens).  Every client sends its number and
 * must get it back doubled, from a connection that is really its own.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include "zdtm.h"

#define ACCEPTORS 3
#define BURST 8

static int listener;
static struct sockaddr_in at = { .sin_family = AF_INET };

static void *acceptor(void *arg)
{
	(void)arg;
	for (;;) {
		int s = accept(listener, NULL, NULL);
		uint32_t n;

		zdtm_check(s >= 0, "accept: %s", strerror(errno));
		zdtm_check(recv(s, &n, sizeof(n), MSG_WAITALL) == sizeof(n),
			   "a connection nobody made, or its bytes lost (%s)", strerror(errno));
		n *= 2;
		zdtm_check(send(s, &n, sizeof(n), MSG_NOSIGNAL) == sizeof(n), "send: %s",
			   strerror(errno));
		zdtm_pace(5);	/* slower than the bursts: the backlog fills */
		close(s);
	}
	return NULL;
}

/* BURST clients connect and send; then each reads its answer. */
static void burst(uint32_t first)
{
	int c[BURST];

	for (int i = 0; i < BURST; i++) {
		uint32_t n = first + i;

		c[i] = socket(AF_INET, SOCK_STREAM, 0);
		zdtm_check(c[i] >= 0 && connect(c[i], (struct sockaddr *)&at, sizeof(at)) == 0 &&
			   send(c[i], &n, sizeof(n), MSG_NOSIGNAL) == sizeof(n),
			   "client %u: %s", n, strerror(errno));
	}
	for (int i = 0; i < BURST; i++) {
		uint32_t n = 0;

		zdtm_check(recv(c[i], &n, sizeof(n), MSG_WAITALL) == sizeof(n) &&
			   n == 2 * (first + i), "client %u: answer %u", first + i, n);
		close(c[i]);
	}
}

int main(int argc, char **argv)
{
	long steps = 200, pace = 10;
	socklen_t len = sizeof(at);
	uint64_t hash = 0;
	pthread_t t;

	zdtm_args(argc, argv, &steps, &pace);
	at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	listener = socket(AF_INET, SOCK_STREAM, 0);
	zdtm_check(setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &(int){ 1 }, sizeof(int)) == 0 &&
		   bind(listener, (struct sockaddr *)&at, sizeof(at)) == 0 &&
		   listen(listener, 64) == 0 &&
		   getsockname(listener, (struct sockaddr *)&at, &len) == 0, "listener");
	for (int i = 0; i < ACCEPTORS; i++)
		zdtm_check(pthread_create(&t, NULL, acceptor, NULL) == 0, "thread");
	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		burst(step * BURST);
		hash = zdtm_mix(hash, step);
		zdtm_pace(pace);
	}
	zdtm_hold();
	burst(steps * BURST);	/* the listener and its threads, as restored */
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
