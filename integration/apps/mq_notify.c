/*
 * mq_notify registrations on POSIX message queues: an empty queue whose
 * first message signals SIGUSR1 with a value, and a queue holding a
 * message, registered for SIGUSR2 (it fires only once the queue is
 * empty and a message comes).  Neither may fire before the program sends
 * its messages at the end (a checkpoint that takes a queue's messages
 * and sends them back must not set it off), and then each fires once,
 * with its signal, value and SI_MESGQ.
 *
 *   mq_notify [steps] [ms-per-step]
 */
#include <fcntl.h>
#include <mqueue.h>
#include <signal.h>
#include <string.h>
#include "zdtm.h"

static volatile sig_atomic_t fired[2], value[2], code[2];

static void on_signal(int sig, siginfo_t *si, void *uc)
{
	int i = sig == SIGUSR2;

	(void)uc;
	fired[i]++;
	value[i] = si->si_value.sival_int;
	code[i] = si->si_code;
}

static mqd_t make_queue(const char *name, int sig, int val)
{
	struct mq_attr a = { .mq_maxmsg = 4, .mq_msgsize = 32 };
	struct sigevent sev = { .sigev_notify = SIGEV_SIGNAL, .sigev_signo = sig };
	mqd_t q = mq_open(name, O_RDWR | O_CREAT | O_EXCL | O_NONBLOCK, 0600, &a);

	zdtm_check(q != (mqd_t)-1, "mq_open %s: %s", name, strerror(errno));
	mq_unlink(name);	/* nothing left behind; the restart makes it again */
	if (sig == SIGUSR2)
		zdtm_check(mq_send(q, "waiting", 7, 0) == 0, "mq_send: %s", strerror(errno));
	sev.sigev_value.sival_int = val;
	zdtm_check(mq_notify(q, &sev) == 0, "mq_notify: %s", strerror(errno));
	return q;
}

static void fires_once(mqd_t q, int i, int val, const char *what)
{
	char buf[32];

	zdtm_check(!fired[i], "%s: fired before a message came (%d)", what, fired[i]);
	zdtm_check(mq_send(q, "now", 3, 0) == 0, "%s: mq_send: %s", what, strerror(errno));
	zdtm_check(fired[i] == 1 && value[i] == val && code[i] == SI_MESGQ,
		   "%s: fired %d times, value %d, code %d", what, fired[i], value[i], code[i]);
	zdtm_check(mq_receive(q, buf, sizeof(buf), NULL) == 3, "%s: mq_receive", what);
}

int main(int argc, char **argv)
{
	struct sigaction sa = { .sa_sigaction = on_signal, .sa_flags = SA_SIGINFO | SA_RESTART };
	long steps = 100, pace = 10;
	uint64_t hash = 0;
	char name[2][64], buf[32];
	mqd_t empty, holding;

	zdtm_args(argc, argv, &steps, &pace);
	sigaction(SIGUSR1, &sa, NULL);
	sigaction(SIGUSR2, &sa, NULL);
	for (int i = 0; i < 2; i++)
		snprintf(name[i], sizeof(name[i]), "/ckpt-mq-notify-%d-%d", getpid(), i);
	empty = make_queue(name[0], SIGUSR1, 1111);
	holding = make_queue(name[1], SIGUSR2, 2222);

	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		hash = zdtm_mix(hash, step);
		zdtm_pace(pace);
	}
	zdtm_hold();

	fires_once(empty, 0, 1111, "the empty queue");
	/* the other fires once emptied and sent to */
	zdtm_check(mq_receive(holding, buf, sizeof(buf), NULL) == 7, "the waiting message");
	fires_once(holding, 1, 2222, "the queue that held a message");
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
