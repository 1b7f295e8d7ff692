/*
 * The gate every verbs call passes (ib.h: ib_enter/ib_leave): two atomic
 * operations on the fast path, no lock, no system call.  The agent closes
 * it before it touches the real objects behind the application's back.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "ib.h"

_Atomic int ib_gate_closed;
_Atomic long ib_gate_users;
_Atomic unsigned ib_releases;
pthread_mutex_t ib_control_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;

void ib_gate_wait(void)
{
	while (atomic_load(&ib_gate_closed))
		syscall(SYS_futex, &ib_gate_closed, FUTEX_WAIT_PRIVATE, 1, NULL, NULL, 0);
}

void ib_gate_close(void)
{
	atomic_store(&ib_gate_closed, 1);
	while (atomic_load(&ib_gate_users) > 0)
		sched_yield();
}

void ib_gate_open(void)
{
	atomic_store(&ib_gate_closed, 0);
	syscall(SYS_futex, &ib_gate_closed, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}
