/*
 * Alternate signal stacks (sigaltstack), as language runtimes set them up
 * to handle a stack overflow (Rust's and Go's threads, the JVM's): the
 * main thread and a second thread each have one of their own (the
 * second's disarmed while a handler runs on it, SS_AUTODISARM), and a
 * SA_ONSTACK handler checks at every step, in each thread, that it runs on
 * its thread's stack.  After a restart both must still be there (ckpt
 * saves no record of them: each thread is parked in a signal handler, and
 * the kernel takes the stack back from that handler's frame when it
 * returns, as any sigreturn does).
 *
 *   altstacks [steps] [ms-per-step]
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "zdtm.h"

#ifndef SS_AUTODISARM
#define SS_AUTODISARM (1U << 31)	/* the kernel's; glibc 2.36 does not name it */
#endif

struct altstack {
	void *base;
	size_t size;
	unsigned flags;		/* as set: 0 or SS_AUTODISARM */
};

static __thread struct altstack *mine;
static __thread volatile int handled_on_it;
static volatile int done;

static void on_signal(int sig)
{
	char here;
	uintptr_t at = (uintptr_t)&here, base = (uintptr_t)mine->base;
	stack_t now;

	(void)sig;
	handled_on_it = at >= base && at < base + mine->size;
	/* while a handler runs on it, an SS_AUTODISARM stack is disarmed */
	if (sigaltstack(NULL, &now) == 0 && (mine->flags & SS_AUTODISARM))
		handled_on_it &= (now.ss_flags & SS_DISABLE) != 0;
}

static void set_up(struct altstack *s)
{
	stack_t ss = { .ss_sp = s->base, .ss_size = s->size, .ss_flags = s->flags };

	zdtm_check(s->base != MAP_FAILED, "mmap");
	zdtm_check(sigaltstack(&ss, NULL) == 0, "sigaltstack: %s", strerror(errno));
	mine = s;
}

static void check(const char *who)
{
	stack_t ss;

	zdtm_check(sigaltstack(NULL, &ss) == 0 && ss.ss_sp == mine->base &&
		   ss.ss_size == mine->size && (ss.ss_flags & SS_AUTODISARM) == (unsigned)mine->flags &&
		   !(ss.ss_flags & SS_DISABLE),
		   "%s: alternate stack is %p+%zu flags %#x, was %p+%zu", who, ss.ss_sp,
		   ss.ss_size, ss.ss_flags, mine->base, mine->size);
	handled_on_it = 0;
	pthread_kill(pthread_self(), SIGUSR1);
	zdtm_check(handled_on_it, "%s: the handler did not run on the alternate stack", who);
}

static void *other_thread(void *arg)
{
	set_up(arg);
	while (!done) {
		check("the other thread");
		zdtm_pace(5);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	long steps = 100, pace = 10;
	struct sigaction sa = { .sa_handler = on_signal, .sa_flags = SA_ONSTACK };
	struct altstack main_stack = { .size = 64 << 10 }, other_stack = { .size = 40 << 10 };
	uint64_t hash = 0;
	pthread_t other;

	zdtm_args(argc, argv, &steps, &pace);
	main_stack.base = mmap(NULL, main_stack.size, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	other_stack.base = mmap(NULL, other_stack.size, PROT_READ | PROT_WRITE,
				MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	other_stack.flags = SS_AUTODISARM;
	sigemptyset(&sa.sa_mask);
	zdtm_check(sigaction(SIGUSR1, &sa, NULL) == 0, "sigaction");
	set_up(&main_stack);
	zdtm_check(pthread_create(&other, NULL, other_thread, &other_stack) == 0, "pthread_create");
	printf("READY\n");
	fflush(stdout);
	for (long step = 0; step < steps; step++) {
		check("the main thread");
		hash = zdtm_mix(hash, step);
		zdtm_pace(pace);
	}
	zdtm_hold();
	check("the main thread");
	done = 1;
	pthread_join(other, NULL);
	zdtm_pass("%016llx", (unsigned long long)hash);
	return 0;
}
