/*
 * The PMIx calls Open MPI makes, in front of libpmix (found behind the
 * plugin with dlsym(RTLD_NEXT)).  Before a restart every call goes
 * through, counted while libpmix owes its answer (a checkpoint then is
 * refused: the answer would never come), and what the rank put and was
 * answered is recorded.  After a restart none reaches libpmix, whose
 * server is gone: the plugin answers (restart.c).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <pmix.h>
#include "pmix_plugin.h"

#define EXPORT __attribute__((visibility("default")))
#define FD_BITS 4096

/* The real function: looked up in an application thread, never in a hook. */
#define REAL(name) ((__typeof__(&name))real_function(#name))

static void *real_function(const char *name)
{
	void *f = dlsym(RTLD_NEXT, name);

	if (!f) {
		fprintf(stderr, "ckpt: PMIx plugin: %s not found behind it\n", name);
		abort();
	}
	return f;
}

static void owed(int n)
{
	__atomic_add_fetch(&pmix_state.in_flight, n, __ATOMIC_SEQ_CST);
}

static void unsupported(const char *call)
{
	if (!pmix_state.unsupported[0])
		snprintf(pmix_state.unsupported, sizeof(pmix_state.unsupported),
			 "the rank called %s (MPI_Comm_spawn, MPI_Comm_connect or name "
			 "publishing), which a restart could not answer", call);
}

/* A value the plugin cannot keep (a type it does not write down, or too
 * long): a restart could not give it back. */
static void unsupported_value(const char *key)
{
	if (!pmix_state.unsupported[0])
		snprintf(pmix_state.unsupported, sizeof(pmix_state.unsupported),
			 "a PMIx value of key %.80s cannot be kept for a restart", key ? key : "?");
}

static int is_rank(pmix_rank_t rank)
{
	return rank != PMIX_RANK_WILDCARD && rank != PMIX_RANK_UNDEF &&
	       rank != PMIX_RANK_LOCAL_NODE && rank != PMIX_RANK_INVALID;
}

/* What pmix_value_t's release does (PMIX_VALUE_RELEASE), for the values
 * the plugin made. */
static void release_value(pmix_value_t *v)
{
	if (!v)
		return;
	if (v->type == PMIX_STRING)
		free(v->data.string);
	else if (v->type == PMIX_BYTE_OBJECT)
		free(v->data.bo.bytes);
	else if (v->type == PMIX_PROC)
		free(v->data.proc);
	free(v);
}

/*
 * Slurm's step daemon serves the ranks of `srun --mpi=pmix`: it is outside
 * the job.  A rank started by Open MPI's own daemon (mpirun, also inside
 * a Slurm job) has its server in the job, restored with it: the plugin
 * then stays out of the way.
 */
static int server_outside_job(void)
{
	const char *mpi = getenv("SLURM_MPI_TYPE");

	return mpi && !strncmp(mpi, "pmix", 4) && !getenv("OMPI_MCA_orte_local_daemon_uri");
}

EXPORT pmix_status_t PMIx_Init(pmix_proc_t *proc, pmix_info_t info[], size_t ninfo)
{
	static unsigned char before[FD_BITS / 8];
	pmix_status_t rc;

	if (pmix_state.local) {
		if (proc)
			*proc = pmix_state.me;
		return PMIX_SUCCESS;
	}
	if (!server_outside_job())
		return REAL(PMIx_Init)(proc, info, ninfo);
	pmix_trace_open();
	pmix_open_fds(before, FD_BITS);
	owed(1);
	rc = REAL(PMIx_Init)(proc, info, ninfo);
	if (rc == PMIX_SUCCESS && proc && !pmix_state.initialized) {
		pmix_state.me = *proc;
		pmix_note_server_fds(before, FD_BITS);
		pmix_state.initialized = 1;
	}
	owed(-1);
	return rc;
}

/*
 * Whether a call goes to libpmix: counted first, then the restart checked,
 * so that a checkpoint either sees the call owed (and is refused) or the
 * call, parked before it counted itself, sees the restart afterwards and
 * is answered by the plugin.
 */
static int enter_libpmix(void)
{
	owed(1);
	if (!__atomic_load_n(&pmix_state.local, __ATOMIC_SEQ_CST))
		return 1;
	owed(-1);
	return 0;
}

EXPORT pmix_status_t PMIx_Finalize(const pmix_info_t info[], size_t ninfo)
{
	pmix_status_t rc;

	if (!pmix_state.initialized)	/* the server is in the job (mpirun) */
		return REAL(PMIx_Finalize)(info, ninfo);
	if (!enter_libpmix())
		return PMIX_SUCCESS;
	rc = REAL(PMIx_Finalize)(info, ninfo);
	owed(-1);
	return rc;
}

EXPORT pmix_status_t PMIx_Abort(int status, const char msg[], pmix_proc_t procs[], size_t nprocs)
{
	if (!pmix_state.initialized || enter_libpmix())
		return REAL(PMIx_Abort)(status, msg, procs, nprocs);	/* ends the job */
	fprintf(stderr, "ckpt: PMIx_Abort after a restart: %s\n", msg ? msg : "");
	_exit(status ? status : 1);
}

EXPORT pmix_status_t PMIx_Put(pmix_scope_t scope, const char key[], pmix_value_t *val)
{
	pmix_status_t rc;

	if (!pmix_state.initialized)
		return REAL(PMIx_Put)(scope, key, val);
	if (pmix_record(&pmix_puts, pmix_state.me.rank, key, val))
		unsupported_value(key);
	if (!enter_libpmix())
		return pmix_publish(key, val);
	rc = REAL(PMIx_Put)(scope, key, val);
	owed(-1);
	return rc;
}

EXPORT pmix_status_t PMIx_Commit(void)
{
	pmix_status_t rc;

	if (!pmix_state.initialized)
		return REAL(PMIx_Commit)();
	if (!enter_libpmix())
		return PMIX_SUCCESS;	/* puts are published as they come */
	rc = REAL(PMIx_Commit)();
	owed(-1);
	return rc;
}

/* A fence of the whole job: the only kind answered after a restart. */
static int whole_job(const pmix_proc_t procs[], size_t nprocs)
{
	return !procs || !nprocs || (nprocs == 1 && procs[0].rank == PMIX_RANK_WILDCARD);
}

static pmix_status_t local_fence(const pmix_proc_t procs[], size_t nprocs)
{
	if (!whole_job(procs, nprocs))
		return PMIX_ERR_NOT_SUPPORTED;
	return pmix_local_fence() ? PMIX_ERROR : PMIX_SUCCESS;
}

EXPORT pmix_status_t PMIx_Fence(const pmix_proc_t procs[], size_t nprocs,
				const pmix_info_t info[], size_t ninfo)
{
	long long start = pmix_trace_now();
	pmix_status_t rc;

	if (!pmix_state.initialized)
		return REAL(PMIx_Fence)(procs, nprocs, info, ninfo);
	if (!enter_libpmix()) {
		rc = local_fence(procs, nprocs);
		pmix_trace("fence", 1, start, rc);
		return rc;
	}
	rc = REAL(PMIx_Fence)(procs, nprocs, info, ninfo);
	if (rc == PMIX_SUCCESS && whole_job(procs, nprocs))
		pmix_state.fences_done++;
	owed(-1);
	pmix_trace("fence", 0, start, rc);
	return rc;
}

struct fence_call {
	pmix_op_cbfunc_t cbfunc;
	void *cbdata;
	int whole_job;
	long long start;	/* for the trace */
};

static void fence_done(pmix_status_t status, void *cbdata)
{
	struct fence_call call = *(struct fence_call *)cbdata;

	free(cbdata);
	if (status == PMIX_SUCCESS && call.whole_job)
		pmix_state.fences_done++;
	owed(-1);
	pmix_trace("fence", 0, call.start, status);
	if (call.cbfunc)
		call.cbfunc(status, call.cbdata);
}

EXPORT pmix_status_t PMIx_Fence_nb(const pmix_proc_t procs[], size_t nprocs,
				   const pmix_info_t info[], size_t ninfo,
				   pmix_op_cbfunc_t cbfunc, void *cbdata)
{
	long long start = pmix_trace_now();
	struct fence_call *call;
	pmix_status_t rc;

	if (!pmix_state.initialized)
		return REAL(PMIx_Fence_nb)(procs, nprocs, info, ninfo, cbfunc, cbdata);
	if (!enter_libpmix()) {
		rc = local_fence(procs, nprocs);
		pmix_trace("fence", 1, start, rc);
		if (rc == PMIX_SUCCESS && cbfunc)
			cbfunc(rc, cbdata);
		return rc;
	}
	call = malloc(sizeof(*call));
	if (!call) {
		owed(-1);
		return PMIX_ERR_NOMEM;
	}
	*call = (struct fence_call){ cbfunc, cbdata, whole_job(procs, nprocs), start };
	rc = REAL(PMIx_Fence_nb)(procs, nprocs, info, ninfo, fence_done, call);
	if (rc != PMIX_SUCCESS) {
		owed(-1);
		free(call);
	}
	return rc;
}

/* After a restart: the value of a rank's key, or a job's. */
static pmix_status_t answer_get(const pmix_proc_t *proc, const char *key, pmix_value_t **val)
{
	pmix_rank_t rank = proc ? proc->rank : pmix_state.me.rank;
	const struct pmix_record *r = NULL;
	pmix_value_t *v;
	int err;

	if (rank == pmix_state.me.rank)
		r = pmix_find(pmix_puts, rank, key);
	if (!r)
		r = pmix_find(pmix_answers, rank, key);
	if (!r) {
		if (!is_rank(rank))
			return PMIX_ERR_NOT_FOUND;
		err = pmix_published_get(rank, key, val);
		return err == 0 ? PMIX_SUCCESS : err == ENOENT ? PMIX_ERR_NOT_FOUND : PMIX_ERROR;
	}
	v = malloc(sizeof(*v));
	if (!v)
		return PMIX_ERR_NOMEM;
	if (pmix_value_from_text(r->text, v)) {
		release_value(v);
		return PMIX_ERROR;
	}
	*val = v;
	return PMIX_SUCCESS;
}

EXPORT pmix_status_t PMIx_Get(const pmix_proc_t *proc, const char key[],
			      const pmix_info_t info[], size_t ninfo, pmix_value_t **val)
{
	long long start = pmix_trace_now();
	pmix_status_t rc;

	if (!pmix_state.initialized)
		return REAL(PMIx_Get)(proc, key, info, ninfo, val);
	if (!enter_libpmix()) {
		rc = answer_get(proc, key, val);
		pmix_trace("get", 1, start, rc);
		return rc;
	}
	rc = REAL(PMIx_Get)(proc, key, info, ninfo, val);
	pmix_trace("get", 0, start, rc);
	/* an answer that cannot be kept is asked for again after a restart,
	 * and not found then (a put that cannot be kept refuses checkpoints) */
	if (rc == PMIX_SUCCESS && val && *val && key)
		pmix_record(&pmix_answers, proc ? proc->rank : pmix_state.me.rank, key, *val);
	owed(-1);
	return rc;
}

struct get_call {
	pmix_value_cbfunc_t cbfunc;
	void *cbdata;
	pmix_rank_t rank;
	char key[PMIX_MAX_KEYLEN + 1];
	long long start;	/* for the trace */
};

static void get_done(pmix_status_t status, pmix_value_t *val, void *cbdata)
{
	struct get_call *call = cbdata;

	if (status == PMIX_SUCCESS && val)
		pmix_record(&pmix_answers, call->rank, call->key, val);
	owed(-1);
	pmix_trace("get", 0, call->start, status);
	if (call->cbfunc)
		call->cbfunc(status, val, call->cbdata);
	free(call);
}

EXPORT pmix_status_t PMIx_Get_nb(const pmix_proc_t *proc, const char key[],
				 const pmix_info_t info[], size_t ninfo,
				 pmix_value_cbfunc_t cbfunc, void *cbdata)
{
	long long start = pmix_trace_now();
	struct get_call *call;
	pmix_status_t rc;

	if (!pmix_state.initialized)
		return REAL(PMIx_Get_nb)(proc, key, info, ninfo, cbfunc, cbdata);
	if (!enter_libpmix()) {
		pmix_value_t *val = NULL;

		rc = answer_get(proc, key, &val);
		pmix_trace("get", 1, start, rc);
		if (cbfunc)
			cbfunc(rc, val, cbdata);
		release_value(val);
		return PMIX_SUCCESS;
	}
	call = calloc(1, sizeof(*call));
	if (!call) {
		owed(-1);
		return PMIX_ERR_NOMEM;
	}
	*call = (struct get_call){ .cbfunc = cbfunc, .cbdata = cbdata,
				   .rank = proc ? proc->rank : pmix_state.me.rank, .start = start };
	snprintf(call->key, sizeof(call->key), "%s", key ? key : "");
	rc = REAL(PMIx_Get_nb)(proc, key, info, ninfo, get_done, call);
	if (rc != PMIX_SUCCESS) {
		owed(-1);
		free(call);
	}
	return rc;
}

/* Handlers of events: after a restart none can come from a server.  The
 * blocking form (no cbfunc) returns the handler's reference. */
EXPORT pmix_status_t PMIx_Register_event_handler(pmix_status_t codes[], size_t ncodes,
						 pmix_info_t info[], size_t ninfo,
						 pmix_notification_fn_t evhdlr,
						 pmix_hdlr_reg_cbfunc_t cbfunc, void *cbdata)
{
	static size_t next_ref = 1000;
	size_t ref;

	if (!pmix_state.local)
		return REAL(PMIx_Register_event_handler)(codes, ncodes, info, ninfo, evhdlr,
							 cbfunc, cbdata);
	ref = __atomic_fetch_add(&next_ref, 1, __ATOMIC_SEQ_CST);
	if (!cbfunc)
		return (pmix_status_t)ref;
	cbfunc(PMIX_SUCCESS, ref, cbdata);
	return PMIX_SUCCESS;
}

EXPORT pmix_status_t PMIx_Deregister_event_handler(size_t evhdlr_ref, pmix_op_cbfunc_t cbfunc,
						   void *cbdata)
{
	if (!pmix_state.local)
		return REAL(PMIx_Deregister_event_handler)(evhdlr_ref, cbfunc, cbdata);
	if (cbfunc)
		cbfunc(PMIX_SUCCESS, cbdata);
	return PMIX_SUCCESS;
}

/* ---- calls whose effects live in the server: a checkpoint refuses ---- */

EXPORT pmix_status_t PMIx_Spawn(const pmix_info_t job_info[], size_t ninfo,
				const pmix_app_t apps[], size_t napps, pmix_nspace_t nspace)
{
	unsupported("PMIx_Spawn");
	return pmix_state.local ? PMIX_ERR_NOT_SUPPORTED :
	       REAL(PMIx_Spawn)(job_info, ninfo, apps, napps, nspace);
}

EXPORT pmix_status_t PMIx_Spawn_nb(const pmix_info_t job_info[], size_t ninfo,
				   const pmix_app_t apps[], size_t napps,
				   pmix_spawn_cbfunc_t cbfunc, void *cbdata)
{
	unsupported("PMIx_Spawn_nb");
	return pmix_state.local ? PMIX_ERR_NOT_SUPPORTED :
	       REAL(PMIx_Spawn_nb)(job_info, ninfo, apps, napps, cbfunc, cbdata);
}

EXPORT pmix_status_t PMIx_Connect(const pmix_proc_t procs[], size_t nprocs,
				  const pmix_info_t info[], size_t ninfo)
{
	unsupported("PMIx_Connect");
	return pmix_state.local ? PMIX_ERR_NOT_SUPPORTED :
	       REAL(PMIx_Connect)(procs, nprocs, info, ninfo);
}

EXPORT pmix_status_t PMIx_Connect_nb(const pmix_proc_t procs[], size_t nprocs,
				     const pmix_info_t info[], size_t ninfo,
				     pmix_op_cbfunc_t cbfunc, void *cbdata)
{
	unsupported("PMIx_Connect_nb");
	return pmix_state.local ? PMIX_ERR_NOT_SUPPORTED :
	       REAL(PMIx_Connect_nb)(procs, nprocs, info, ninfo, cbfunc, cbdata);
}

EXPORT pmix_status_t PMIx_Publish(const pmix_info_t info[], size_t ninfo)
{
	unsupported("PMIx_Publish");
	return pmix_state.local ? PMIX_ERR_NOT_SUPPORTED : REAL(PMIx_Publish)(info, ninfo);
}

EXPORT pmix_status_t PMIx_Lookup(pmix_pdata_t data[], size_t ndata,
				 const pmix_info_t info[], size_t ninfo)
{
	unsupported("PMIx_Lookup");
	return pmix_state.local ? PMIX_ERR_NOT_SUPPORTED :
	       REAL(PMIx_Lookup)(data, ndata, info, ninfo);
}

EXPORT pmix_status_t PMIx_Publish_nb(const pmix_info_t info[], size_t ninfo,
				     pmix_op_cbfunc_t cbfunc, void *cbdata)
{
	unsupported("PMIx_Publish_nb");
	return pmix_state.local ? PMIX_ERR_NOT_SUPPORTED :
	       REAL(PMIx_Publish_nb)(info, ninfo, cbfunc, cbdata);
}

EXPORT pmix_status_t PMIx_Lookup_nb(char **keys, const pmix_info_t info[], size_t ninfo,
				    pmix_lookup_cbfunc_t cbfunc, void *cbdata)
{
	unsupported("PMIx_Lookup_nb");
	return pmix_state.local ? PMIX_ERR_NOT_SUPPORTED :
	       REAL(PMIx_Lookup_nb)(keys, info, ninfo, cbfunc, cbdata);
}

/* ---- calls that reach the server, answered "not supported" after a
 * restart rather than left waiting on a server that is gone (lookups that
 * libpmix answers from what it holds, PMIx_Resolve_peers and the like,
 * still go to it) ---- */

#define AFTER_RESTART_NOT_SUPPORTED(real_call)                                  \
	do {                                                                    \
		pmix_status_t rc;                                               \
		if (!pmix_state.initialized)                                    \
			return real_call;                                       \
		if (!enter_libpmix())                                           \
			return PMIX_ERR_NOT_SUPPORTED;                          \
		rc = real_call;                                                 \
		owed(-1);                                                       \
		return rc;                                                      \
	} while (0)

/* The non-blocking ones are owed only until libpmix took them: their
 * answers come later, to callbacks that a restart simply never calls. */
EXPORT pmix_status_t PMIx_Query_info_nb(pmix_query_t queries[], size_t nqueries,
					pmix_info_cbfunc_t cbfunc, void *cbdata)
{
	AFTER_RESTART_NOT_SUPPORTED(REAL(PMIx_Query_info_nb)(queries, nqueries, cbfunc, cbdata));
}

EXPORT pmix_status_t PMIx_Log_nb(const pmix_info_t data[], size_t ndata,
				 const pmix_info_t directives[], size_t ndirs,
				 pmix_op_cbfunc_t cbfunc, void *cbdata)
{
	AFTER_RESTART_NOT_SUPPORTED(REAL(PMIx_Log_nb)(data, ndata, directives, ndirs, cbfunc,
						      cbdata));
}

EXPORT pmix_status_t PMIx_Job_control_nb(const pmix_proc_t targets[], size_t ntargets,
					 const pmix_info_t directives[], size_t ndirs,
					 pmix_info_cbfunc_t cbfunc, void *cbdata)
{
	AFTER_RESTART_NOT_SUPPORTED(REAL(PMIx_Job_control_nb)(targets, ntargets, directives,
							      ndirs, cbfunc, cbdata));
}

EXPORT pmix_status_t PMIx_Notify_event(pmix_status_t status, const pmix_proc_t *source,
				       pmix_data_range_t range, const pmix_info_t info[],
				       size_t ninfo, pmix_op_cbfunc_t cbfunc, void *cbdata)
{
	AFTER_RESTART_NOT_SUPPORTED(REAL(PMIx_Notify_event)(status, source, range, info, ninfo,
							    cbfunc, cbdata));
}
