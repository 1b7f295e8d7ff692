/*
 * A child stopped with SIGSTOP for the middle third of the run.  Its
 * parent has collected the stop with waitpid(WUNTRACED) ("collected") or
 * not yet ("pending").  While stopped, the child must not run (its
 * counter in shared memory stays put), the parent must not be told
 * anything new (no SIGCHLD, no second stop), and in "pending" mode the
 * stop is still there to collect, once.  Then SIGCONT: the child counts
 * on and exits 0.
 *
 *   stopped_child collected|pending [steps] [ms-per-step]
 */
#define _GNU_SOURCE
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include "zdtm.h"

static volatile sig_atomic_t sigchlds;

static void on_chld(int sig)
{
	(void)sig;
	sigchlds++;
}

static char state_of(pid_t pid)
{
	char path[64], buf[256], *c;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	f = fopen(path, "r");
	if (!f)
		return '?';
	c = fgets(buf, sizeof(buf), f) ? strrchr(buf, ')') : NULL;
	fclose(f);
	return c ? c[2] : '?';
}

int main(int argc, char **argv)
{
	long steps = 300, pace = 10;
	int collected = argc > 1 && !strcmp(argv[1], "collected");
	volatile long *counter;
	struct sigaction sa;
	long frozen_at = 0, chlds_at = 0;
	siginfo_t si;
	int status;
	pid_t child;

	if (argc > 2)
		steps = atol(argv[2]);
	if (argc > 3)
		pace = atol(argv[3]);
	counter = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	zdtm_check(counter != MAP_FAILED, "mmap");
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_chld;
	sa.sa_flags = SA_RESTART;
	zdtm_check(sigaction(SIGCHLD, &sa, NULL) == 0, "sigaction");
	child = fork();
	zdtm_check(child >= 0, "fork");
	if (child == 0) {
		for (long i = 0; i < 2 * steps; i++) {
			(*counter)++;
			zdtm_pace(pace / 2 + 1);
		}
		_exit(0);
	}
	printf("READY\n");
	fflush(stdout);
	for (long s = 0; s < steps; s++) {
		if (s == steps / 3) {
			zdtm_check(kill(child, SIGSTOP) == 0, "SIGSTOP");
			while (state_of(child) != 'T')
				zdtm_pace(1);
			if (collected)
				zdtm_check(waitpid(child, &status, WUNTRACED) == child &&
					   WIFSTOPPED(status), "collect the stop");
			zdtm_pace(20);	/* its SIGCHLD has come */
			frozen_at = *counter;
			chlds_at = sigchlds;
			printf("STOPPED\n");
			fflush(stdout);
		}
		if (s > steps / 3 && s < 2 * steps / 3) {
			/* 't' while a checkpoint's tracer holds it */
			char st = state_of(child);
			zdtm_check(st == 'T' || st == 't',
				   "child not stopped at step %ld (state %c)", s, st);
			zdtm_check(*counter == frozen_at, "the stopped child ran");
			zdtm_check(sigchlds == chlds_at, "SIGCHLD while nothing happened");
		}
		if (s == 2 * steps / 3) {
			memset(&si, 0, sizeof(si));
			zdtm_check(waitid(P_PID, child, &si, WSTOPPED | WNOHANG) == 0, "waitid");
			if (collected)
				zdtm_check(si.si_pid == 0, "the stop reported twice");
			else
				zdtm_check(si.si_pid == child && si.si_code == CLD_STOPPED,
					   "the stop was lost");
			memset(&si, 0, sizeof(si));
			waitid(P_PID, child, &si, WSTOPPED | WNOHANG);
			zdtm_check(si.si_pid == 0, "a second stop to collect");
			zdtm_check(kill(child, SIGCONT) == 0, "SIGCONT");
		}
		zdtm_pace(pace);
	}
	/* before the wait: the child counts on and exits (a zombie) meanwhile */
	zdtm_hold();
	zdtm_check(waitpid(child, &status, 0) == child && WIFEXITED(status) &&
		   WEXITSTATUS(status) == 0, "child status %x", status);
	zdtm_check(*counter == 2 * steps, "child counted %ld", *counter);
	zdtm_pass("%s counter=%ld", collected ? "collected" : "pending", *counter);
	return 0;
}
