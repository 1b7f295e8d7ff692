/*
 * The PMIx plugin: Open MPI's ranks under `srun --mpi=pmix` talk PMIx to
 * slurmstepd, outside the job and gone after a requeue.  The plugin is
 * LD_PRELOADed after libckpt.so and stands in front of libpmix: before a
 * restart each call goes through and the plugin records what the rank put
 * and was answered; after a restart the plugin answers by itself, from
 * those records and from ckpt's name service, where every rank published
 * its puts at REBUILD, and fences are counters of the name service.
 */
#ifndef CKPT_PMIX_PLUGIN_H
#define CKPT_PMIX_PLUGIN_H

#include <pmix_common.h>
#include <stddef.h>

#define PMIX_TEXT_MAX (64 * 1024)	/* a value as text, at most */

/* ---- values.c: a pmix_value_t as printable text and back ---- */

/* "TYPE:HEX" into out: 0, or ENOTSUP (a type not kept) or ENOSPC. */
int pmix_value_to_text(const pmix_value_t *v, char *out, size_t size);
/* A value made as libpmix would (PMIX_VALUE_RELEASE frees it): 0 or errno. */
int pmix_value_from_text(const char *text, pmix_value_t *v);
int pmix_to_hex(const void *p, size_t n, char *out, size_t size);

/* ---- records.c: what the rank put and was answered ---- */

/* Append-only lists, lock-free to read: a hook may walk them while an
 * application thread was parked adding to them. */
struct pmix_record {
	struct pmix_record *next;
	pmix_rank_t rank;	/* whose key */
	char *key;
	char *text;		/* the value, pmix_value_to_text's */
};

extern struct pmix_record *volatile pmix_puts;	/* this rank's own */
extern struct pmix_record *volatile pmix_answers;	/* what libpmix answered */

int pmix_record(struct pmix_record *volatile *list, pmix_rank_t rank, const char *key,
		const pmix_value_t *v);
const struct pmix_record *pmix_find(struct pmix_record *list, pmix_rank_t rank,
				    const char *key);

/* ---- restart.c: answers after a restart ---- */

struct pmix_state {
	int initialized;		/* PMIx_Init went through */
	pmix_proc_t me;
	int local;			/* restarted: answer without libpmix */
	unsigned epoch;			/* the checkpoint restarted from, in keys */
	unsigned fences_done;
	volatile int in_flight;		/* calls (and callbacks) owed by libpmix */
	int server_fds[4];		/* libpmix's connections to its server */
	int nserver_fds;
	char unsupported[200];		/* a call no restart could answer, or "" */
};

extern struct pmix_state pmix_state;

/* The job's size: from PMIX_JOB_SIZE as libpmix answered it. */
unsigned pmix_job_size(void);
/* After a restart: a peer's key, from the name service.  0, ENOENT or errno. */
int pmix_published_get(pmix_rank_t rank, const char *key, pmix_value_t **value);
/* After a restart: a put of this rank, published at once.  A PMIx status. */
pmix_status_t pmix_publish(const char *key, const pmix_value_t *val);
/* After a restart: the next fence among the job's ranks.  0 or errno. */
int pmix_local_fence(void);
/* libpmix's connections to its server, opened by PMIx_Init: fds that
 * were not there before (before: a bitmap of the fds open then). */
void pmix_note_server_fds(const unsigned char *before, size_t nbits);
void pmix_open_fds(unsigned char *bits, size_t nbits);
void pmix_plugin_register(void);

/* ---- trace.c: CKPT_PMIX_TRACE=FILE, a line per fence and get ---- */

void pmix_trace_open(void);
/* CLOCK_MONOTONIC in microseconds, or 0 when there is no trace. */
long long pmix_trace_now(void);
/* A call answered: by the plugin (local) or by libpmix. */
void pmix_trace(const char *call, int local, long long start_us, int status);

#endif
