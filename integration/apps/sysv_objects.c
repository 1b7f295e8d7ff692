/*
 * System V semaphores and a message queue: a set of three semaphores
 * (one counts the steps, one counts down, one stays at 2) and a keyed
 * queue that always holds the last three steps' messages, of three
 * types.  Each step checks the values and takes the oldest message,
 * which must be the one sent three steps before; the ids the program
 * holds must still name its objects, with their permissions.  Their ids
 * go to <dir>/sysv_objects.ids, for the test to remove a killed run's.
 *
 *   sysv_objects [steps] [ms-per-step] [dir]
 */
#define _GNU_SOURCE
#include <string.h>
#include <sys/msg.h>
#include <sys/sem.h>
#include <unistd.h>
#include "zdtm.h"

#define WINDOW 3

struct message {
	long type;
	char text[32];
};

static long type_of(long s)
{
	return ((s % 3) + 3) % 3 + 1;
}

static void send_step(int q, long s)
{
	struct message m = { .type = type_of(s) };

	snprintf(m.text, sizeof(m.text), "step %ld", s);
	zdtm_check(msgsnd(q, &m, strlen(m.text) + 1, IPC_NOWAIT) == 0, "msgsnd");
}

static void check_sem(int sem, long counted, long steps)
{
	unsigned short v[3];

	zdtm_check(semctl(sem, 0, GETALL, v) == 0, "semctl GETALL: the set's id no longer names it");
	zdtm_check(v[0] == counted && v[1] == steps - counted && v[2] == 2,
		   "semaphores %u %u %u after %ld steps", v[0], v[1], v[2], counted);
}

int main(int argc, char **argv)
{
	long steps = 300, pace = 10;
	const char *dir = argc > 3 ? argv[3] : ".";
	unsigned short start[3];
	struct msqid_ds qs;
	struct semid_ds ss;
	char path[4096];
	key_t key = (key_t)(0x5a000000 | (getpid() & 0xffffff));
	int sem, q;
	FILE *ids;

	zdtm_args(argc, argv, &steps, &pace);
	start[0] = 0;
	start[1] = steps;
	start[2] = 2;
	sem = semget(IPC_PRIVATE, 3, IPC_CREAT | 0640);
	q = msgget(key, IPC_CREAT | IPC_EXCL | 0620);
	zdtm_check(sem >= 0 && q >= 0, "semget/msgget");
	zdtm_check(semctl(sem, 0, SETALL, start) == 0, "SETALL");
	snprintf(path, sizeof(path), "%s/sysv_objects.ids", dir);
	ids = fopen(path, "w");
	zdtm_check(ids && fprintf(ids, "%d %d\n", sem, q) > 0 && fclose(ids) == 0, "ids file");
	for (long s = 1 - WINDOW; s <= 0; s++)
		send_step(q, s);
	printf("READY\n");
	fflush(stdout);
	for (long s = 1; s <= steps; s++) {
		struct sembuf ops[2] = { { 0, 1, 0 }, { 1, -1, 0 } };
		struct message m;
		char want[32];

		zdtm_check(semop(sem, ops, 2) == 0, "semop");
		check_sem(sem, s, steps);
		send_step(q, s);
		memset(&m, 0, sizeof(m));
		zdtm_check(msgrcv(q, &m, sizeof(m.text), 0, IPC_NOWAIT) > 0, "msgrcv at step %ld", s);
		snprintf(want, sizeof(want), "step %ld", s - WINDOW);
		zdtm_check(!strcmp(m.text, want) && m.type == type_of(s - WINDOW),
			   "step %ld took \"%s\" (type %ld), not \"%s\"", s, m.text, m.type, want);
		zdtm_pace(pace);
	}
	zdtm_hold();
	zdtm_check(msgget(key, 0) == q, "the queue's key no longer finds it");
	zdtm_check(msgctl(q, IPC_STAT, &qs) == 0 && qs.msg_qnum == WINDOW &&
		   (qs.msg_perm.mode & 0777) == 0620, "the queue's state or permissions changed");
	zdtm_check(semctl(sem, 0, IPC_STAT, &ss) == 0 && (ss.sem_perm.mode & 0777) == 0640,
		   "the semaphore set's permissions changed");
	semctl(sem, 0, IPC_RMID);
	msgctl(q, IPC_RMID, NULL);
	zdtm_pass("semaphores and %d messages in order", (int)steps);
	return 0;
}
