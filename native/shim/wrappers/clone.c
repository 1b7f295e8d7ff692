/*
 * clone() used as fork (a new process with its own memory) runs no
 * pthread_atfork handlers: the child gets its checkpoint thread here, as a
 * forked child does, before the caller's function runs.  Threads
 * (CLONE_THREAD) are found at every SUSPEND anyway, and a child sharing
 * the memory (CLONE_VM, as vfork) can only exec or exit.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sched.h>
#include <stdarg.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "shim.h"

typedef int (*clone_fn)(int (*)(void *), void *, int, void *, ...);

struct clone_call {
	int (*fn)(void *);
	void *arg;
};

/* Runs in the child, on the caller's stack, in its own copy of memory:
 * the parent's clone_call is there too. */
static int clone_child(void *p)
{
	struct clone_call *call = p;

	checkpointer_atfork_child();
	/* glibc's clone ends the child with exit(), which ends only this
	 * thread: the checkpoint thread would keep the process alive */
	syscall(SYS_exit_group, call->fn(call->arg));
	return 0;
}

SHIM_EXPORT int clone(int (*fn)(void *), void *stack, int flags, void *arg, ...)
{
	static clone_fn real;
	struct clone_call call = { fn, arg };
	pid_t *parent_tid, *child_tid;
	void *tls;
	va_list ap;

	if (!real)
		real = (clone_fn)dlsym(RTLD_NEXT, "clone");
	/* the optional arguments: read whatever is there, used only if the
	 * flags say so */
	va_start(ap, arg);
	parent_tid = va_arg(ap, pid_t *);
	tls = va_arg(ap, void *);
	child_tid = va_arg(ap, pid_t *);
	va_end(ap);
	if (flags & (CLONE_VM | CLONE_THREAD) || !checkpointer_coord_path()[0])
		return real(fn, stack, flags, arg, parent_tid, tls, child_tid);
	return real(clone_child, stack, flags, &call, parent_tid, tls, child_tid);
}
