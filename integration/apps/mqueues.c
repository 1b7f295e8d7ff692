/*
 * POSIX message queues: a named queue (read-write, and a second,
 * write-only, non-blocking fd on it) that always holds the last three
 * steps' messages at three priorities, and an unlinked queue shared with
 * a child, which sends a numbered message every step for the parent to
 * take in order, and a mailbox queue that no fd holds between steps:
 * each step opens it by name, takes the oldest of its two messages,
 * leaves a new one and closes it.  After a restart the attributes, the
 * access modes, the order (priority, then age), the unlinked queue's
 * privacy and the mailbox with its messages hold.  The named queues'
 * names go to <dir>/mqueues.name, for the test to remove a killed run's.
 *
 *   mqueues [steps] [ms-per-step] [dir]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <mqueue.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include "zdtm.h"

#define WINDOW 3
#define SIZE 64

static void send_step(mqd_t q, long s)
{
	char text[SIZE];

	snprintf(text, sizeof(text), "step %ld", s);
	zdtm_check(mq_send(q, text, strlen(text) + 1, 1) == 0, "mq_send");
}

/* The mailbox keeps the last two steps' letters; nobody holds it open. */
static void make_mailbox(const char *name, struct mq_attr *attr)
{
	mqd_t m = mq_open(name, O_WRONLY | O_CREAT | O_EXCL, 0600, attr);

	zdtm_check(m >= 0 && mq_send(m, "letter -1", 10, 0) == 0 &&
		   mq_send(m, "letter 0", 9, 0) == 0 && mq_close(m) == 0, "mailbox");
}

static void visit_mailbox(const char *name, long s)
{
	mqd_t m = mq_open(name, O_RDWR | O_NONBLOCK);
	char text[SIZE], want[SIZE];

	zdtm_check(m >= 0, "step %ld: the mailbox %s is gone: %m", s, name);
	zdtm_check(mq_receive(m, text, SIZE, NULL) > 0, "step %ld: the mailbox is empty", s);
	snprintf(want, sizeof(want), "letter %ld", s - 2);
	zdtm_check(!strcmp(text, want), "step %ld: the mailbox held \"%s\", not \"%s\"", s,
		   text, want);
	snprintf(text, sizeof(text), "letter %ld", s);
	zdtm_check(mq_send(m, text, strlen(text) + 1, 0) == 0 && mq_close(m) == 0, "mailbox");
}

int main(int argc, char **argv)
{
	long steps = 300, pace = 10, taken = 0;
	const char *dir = argc > 3 ? argv[3] : ".";
	struct mq_attr attr = { .mq_maxmsg = 8, .mq_msgsize = SIZE }, now;
	char name[64], mailbox[64], path[4096], text[SIZE];
	mqd_t q, q_wo, priv;
	unsigned prio;
	pid_t child;
	FILE *f;

	zdtm_args(argc, argv, &steps, &pace);
	snprintf(name, sizeof(name), "/ckpt-test-mq-%d", getpid());
	snprintf(mailbox, sizeof(mailbox), "/ckpt-test-mailbox-%d", getpid());
	q = mq_open(name, O_RDWR | O_CREAT | O_EXCL, 0640, &attr);
	q_wo = mq_open(name, O_WRONLY | O_NONBLOCK);
	snprintf(path, sizeof(path), "%s/mqueues.name", dir);
	f = fopen(path, "w");
	zdtm_check(q >= 0 && q_wo >= 0 && f && fprintf(f, "%s\n%s\n", name, mailbox) > 0 &&
		   fclose(f) == 0, "mq_open");
	make_mailbox(mailbox, &attr);
	snprintf(text, sizeof(text), "/ckpt-test-private-%d", getpid());
	priv = mq_open(text, O_RDWR | O_CREAT | O_EXCL, 0600, &attr);
	zdtm_check(priv >= 0 && mq_unlink(text) == 0, "private queue");
	for (long s = 1 - WINDOW; s <= 0; s++)
		send_step(q, s);
	child = fork();
	zdtm_check(child >= 0, "fork");
	if (child == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);	/* a failing parent ends the test */
		for (long s = 1;; s++) {
			snprintf(text, sizeof(text), "child %ld", s);
			if (mq_send(priv, text, strlen(text) + 1, 0))
				_exit(1);
			zdtm_pace(pace);
		}
	}
	printf("READY\n");
	fflush(stdout);
	for (long s = 1; s <= steps; s++) {
		char want[SIZE];

		/* a high-priority message jumps the queue; the oldest comes next */
		zdtm_check(mq_send(q_wo, "urgent", 7, 5) == 0, "mq_send on the write-only fd");
		send_step(q, s);
		zdtm_check(mq_receive(q, text, SIZE, &prio) > 0 && !strcmp(text, "urgent") && prio == 5,
			   "step %ld: the urgent message did not come first", s);
		zdtm_check(mq_receive(q, text, SIZE, &prio) > 0 && prio == 1, "mq_receive");
		snprintf(want, sizeof(want), "step %ld", s - WINDOW);
		zdtm_check(!strcmp(text, want), "step %ld took \"%s\", not \"%s\"", s, text, want);
		/* the child's, in order, none lost or repeated */
		while (mq_getattr(priv, &now) == 0 && now.mq_curmsgs > 0) {
			zdtm_check(mq_receive(priv, text, SIZE, NULL) > 0, "the child's message");
			snprintf(want, sizeof(want), "child %ld", ++taken);
			zdtm_check(!strcmp(text, want), "took \"%s\", not \"%s\"", text, want);
		}
		visit_mailbox(mailbox, s);
		zdtm_pace(pace);
	}
	/* the child goes on sending until the private queue is full, then blocks */
	zdtm_hold();
	zdtm_check(mq_getattr(q, &now) == 0 && now.mq_maxmsg == 8 && now.mq_msgsize == SIZE &&
		   now.mq_curmsgs == WINDOW && !(now.mq_flags & O_NONBLOCK), "attributes changed");
	zdtm_check(mq_getattr(q_wo, &now) == 0 && (now.mq_flags & O_NONBLOCK), "O_NONBLOCK lost");
	zdtm_check(mq_receive(q_wo, text, SIZE, NULL) < 0 && errno == EBADF,
		   "the write-only fd can read");
	zdtm_check(taken > 0, "the child sent nothing");
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	mq_unlink(name);
	mq_unlink(mailbox);
	zdtm_pass("message queues in order");
	return 0;
}
