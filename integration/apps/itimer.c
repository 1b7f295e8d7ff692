/* A SIGALRM interval timer with a handler: ticks keep coming after the
 * restart, and the handler and the interval are still in place. */
#include <signal.h>
#include <string.h>
#include <sys/time.h>
#include "zdtm.h"

static volatile sig_atomic_t ticks;

static void on_alarm(int sig)
{
	(void)sig;
	ticks++;
}

int main(int argc, char **argv)
{
	long steps = 300, pace = 10;
	struct itimerval it = { { 0, 10000 }, { 0, 10000 } };
	struct sigaction sa, now;
	sigset_t none;

	zdtm_args(argc, argv, &steps, &pace);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_alarm;
	sigemptyset(&none);
	zdtm_check(sigaction(SIGALRM, &sa, NULL) == 0, "sigaction");
	zdtm_check(setitimer(ITIMER_REAL, &it, NULL) == 0, "setitimer");
	printf("READY\n");
	fflush(stdout);
	while (ticks < steps)
		sigsuspend(&none);
	/* after the tick count; only the interval, not the time left, is checked after */
	zdtm_hold();
	zdtm_check(getitimer(ITIMER_REAL, &it) == 0 && it.it_interval.tv_sec == 0 &&
		   it.it_interval.tv_usec == 10000, "interval changed");
	zdtm_check(sigaction(SIGALRM, NULL, &now) == 0 && now.sa_handler == on_alarm,
		   "handler lost");
	zdtm_pass("ticks>=%ld", steps);
	return 0;
}
