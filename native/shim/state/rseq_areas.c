/*
 * rseq areas a program registers itself (glibc's own off, as with
 * GLIBC_TUNABLES=glibc.pthread.rseq=0, or a runtime doing its own): the
 * kernel tells nobody but ptrace where a thread's area is, so the shim's
 * syscall() notes each registration that succeeds, per thread.  The
 * parking handler saves it when glibc has none (thread_fill_record,
 * quiesce.c); ckpt-restart registers it again as the thread becomes
 * itself (become, native/restart/threads.c).  A registration made by an
 * inline `syscall` instruction is not seen.
 */
#define _GNU_SOURCE
#include <sys/rseq.h>
#include <sys/syscall.h>
#include "shim.h"

struct rseq_area {
	uint64_t addr;			/* 0: none noted */
	uint32_t len;
	uint32_t sig;
};

/* initial-exec: read in a signal handler, where a dynamic TLS lookup
 * could allocate */
static __thread struct rseq_area own __attribute__((tls_model("initial-exec")));

void rseq_note_call(long nr, const long *args, long result)
{
	if (nr != SYS_rseq || result != 0)
		return;
	if (args[2] & RSEQ_FLAG_UNREGISTER) {
		own.addr = 0;
		return;
	}
	own.addr = (uint64_t)args[0];
	own.len = (uint32_t)args[1];
	own.sig = (uint32_t)args[3];
}

int rseq_own_area(struct ckpt_thread *rec)
{
	if (!own.addr)
		return 0;
	rec->rseq_addr = own.addr;
	rec->rseq_len = own.len;
	rec->rseq_sig = own.sig;
	return 1;
}
