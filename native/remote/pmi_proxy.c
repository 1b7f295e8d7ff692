/*
 * The PMI proxy of an srun task (srun --mpi=pmi2; MPICH speaks PMI-1's
 * wire protocol over it).  Slurm's step daemon hands each task a connected
 * socket (PMI_FD) to its PMI server, outside the job and gone after a
 * requeue.  So the task server stands between: the rank gets one end of a
 * socketpair under the same fd number, and the server relays each line to
 * slurmstepd, recording what the rank put, what it was answered and which
 * barriers it passed.  After a restart nothing is relayed any more: the
 * server answers from its records and from ckpt's name service, where
 * every task published its puts at REBUILD, and barriers are counters of
 * the name service (INCR/AWAIT) over the job's new nodes.
 *
 * A checkpoint may park the server anywhere.  Whatever it reads is
 * handled, and the answers it owes are queued in memory, with every
 * signal blocked (a few microseconds): a line is never half taken.  The
 * queue is written out afterwards and is part of the image.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "ckpt_kv.h"
#include "remote.h"

#define LINE_MAX_PMI 4096
#define BUF_MAX (4 * LINE_MAX_PMI)
#define AWAIT_SLICE_S 5		/* a barrier's wait, in slices: the task may die */
#define WHY_MAX 200

struct record {
	char *key, *value;
};

struct records {
	struct record *r;
	unsigned n, cap;
};

struct line_buffer {
	char b[BUF_MAX];
	size_t len;
};

static struct {
	int active;
	int app;			/* our end of the rank's PMI socketpair */
	int real;			/* slurmstepd's PMI connection; -1 after a restart */
	int kv;				/* the name service, after a restart */
	int local;			/* answering ourselves (after a restart) */
	int raw;			/* PMI-2's wire protocol: bytes relayed unread */
	int restarted;			/* for the main thread: drop the old connections */
	int app_eof, real_eof;
	char step[64];			/* "<job>.<step>": the keys' namespace */
	unsigned epoch;			/* the checkpoint restarted from, in keys */
	unsigned rank, ntasks;
	struct line_buffer from_app, from_real, to_app, to_real;
	char pending[LINE_MAX_PMI];	/* the rank's request not answered yet */
	unsigned barriers_done;
	unsigned counted_epoch;		/* the epoch the pending barrier was counted in, +1 */
	struct records puts;		/* key -> value the rank put */
	struct records got;		/* key -> value the rank was answered */
	struct records asked;		/* other requests -> their answers */
	char unsupported[WHY_MAX];	/* why a checkpoint is refused, or "" */
} pmi = { .app = -1, .real = -1, .kv = -1 };

static int trace_fd = -1;	/* CKPT_PMI_TRACE=FILE: every line, for diagnosis */

/* "MICROSECONDS RANK DIRECTION LINE": the clock is CLOCK_MONOTONIC's, for
 * the time a request waited for its answer (bench/slurm_bench.py) */
static void trace(const char *dir, const char *line)
{
	char buf[LINE_MAX_PMI + 64];
	struct timespec now;
	int n;

	if (trace_fd < 0)
		return;
	clock_gettime(CLOCK_MONOTONIC, &now);
	n = snprintf(buf, sizeof(buf), "%lld %u %s %s%s",
		     (long long)now.tv_sec * 1000000 + now.tv_nsec / 1000, pmi.rank, dir, line,
		     line[0] && line[strlen(line) - 1] == '\n' ? "" : "\n");
	if (write(trace_fd, buf, n) < 0)
		trace_fd = -1;
}

/* Looked up by the main thread: the checkpoint thread never calls dlsym. */
static const char *(*coordinator_path)(void);
static void (*left_outside)(int fd, int left);

static void mark_left_outside(int fd, int left)
{
	if (left_outside && fd >= 0)
		left_outside(fd, left);
}

/* ---- critical sections: a checkpoint never parks inside one ---- */

static void block_signals(sigset_t *old)
{
	sigset_t all;

	sigfillset(&all);
	/* raw: glibc keeps the checkpoint signal (its SIGSETXID) unblockable */
	syscall(SYS_rt_sigprocmask, SIG_SETMASK, &all, old, _NSIG / 8);
}

static void restore_signals(const sigset_t *old)
{
	syscall(SYS_rt_sigprocmask, SIG_SETMASK, old, NULL, _NSIG / 8);
}

/* ---- records ---- */

static struct record *find(struct records *rs, const char *key)
{
	for (unsigned i = 0; i < rs->n; i++)
		if (!strcmp(rs->r[i].key, key))
			return &rs->r[i];
	return NULL;
}

static void remember(struct records *rs, const char *key, const char *value)
{
	struct record *r = find(rs, key);
	char *v = strdup(value);

	if (!v)
		die("out of memory for the PMI records");
	if (r) {
		free(r->value);
		r->value = v;
		return;
	}
	if (rs->n == rs->cap) {
		unsigned cap = rs->cap ? 2 * rs->cap : 64;
		struct record *grown = realloc(rs->r, cap * sizeof(*grown));

		if (!grown)
			die("out of memory for the PMI records");
		rs->r = grown;
		rs->cap = cap;
	}
	rs->r[rs->n].key = strdup(key);
	rs->r[rs->n].value = v;
	if (!rs->r[rs->n].key)
		die("out of memory for the PMI records");
	rs->n++;
}

/* ---- PMI-1 lines: "cmd=NAME k=v k=v\n" ---- */

/* The value of field name in line (up to the next space), or "". */
static void field(const char *line, const char *name, char *out, size_t size)
{
	size_t len = strlen(name);
	const char *p = line;

	out[0] = '\0';
	while ((p = strstr(p, name))) {
		if ((p == line || p[-1] == ' ') && p[len] == '=') {
			size_t n = strcspn(p + len + 1, " \n");

			snprintf(out, size, "%.*s", (int)n, p + len + 1);
			return;
		}
		p += len;
	}
}

static int is_cmd(const char *line, const char *cmd)
{
	size_t len = strlen(cmd);

	return !strncmp(line, "cmd=", 4) && !strncmp(line + 4, cmd, len) &&
	       (line[4 + len] == ' ' || line[4 + len] == '\n' || !line[4 + len]);
}

/* Name-service keys and values have no spaces: %XX for those bytes. */
static void encode(const char *in, char *out, size_t size)
{
	size_t n = 0;

	for (; *in && n + 4 < size; in++)
		n += (unsigned char)*in <= ' ' || *in == '%' ?
		     (size_t)snprintf(out + n, size - n, "%%%02x", (unsigned char)*in) :
		     (size_t)(out[n] = *in, 1);
	out[n] = '\0';
}

static void decode(const char *in, char *out, size_t size)
{
	size_t n = 0;

	for (; *in && n + 1 < size; n++) {
		unsigned v;

		if (in[0] == '%' && sscanf(in + 1, "%2x", &v) == 1) {
			out[n] = (char)v;
			in += 3;
		} else {
			out[n] = *in++;
		}
	}
	out[n] = '\0';
}

static void append(struct line_buffer *lb, const char *text)
{
	size_t len = strlen(text);

	if (lb->len + len > sizeof(lb->b))
		die("PMI: too much to send at once");
	memcpy(lb->b + lb->len, text, len);
	lb->len += len;
}

/* The next whole line of lb into line (with its newline), or 0. */
static int take_line(struct line_buffer *lb, char *line, size_t size)
{
	char *nl = memchr(lb->b, '\n', lb->len);
	size_t len;

	if (!nl) {
		if (lb->len == sizeof(lb->b))
			die("PMI: a line longer than %d bytes", BUF_MAX);
		return 0;
	}
	len = nl + 1 - lb->b;
	if (len >= size)
		die("PMI: a line longer than %zu bytes", size);
	memcpy(line, lb->b, len);
	line[len] = '\0';
	lb->len -= len;
	memmove(lb->b, nl + 1, lb->len);
	return 1;
}

/* What stops a restart from answering this rank: the first reason kept. */
static void refuse(const char *why)
{
	if (!pmi.unsupported[0])
		snprintf(pmi.unsupported, sizeof(pmi.unsupported), "%s", why);
}

/* ---- relaying, before any restart ---- */

/* A request of the rank, on its way to slurmstepd. */
static void note_request(const char *line)
{
	char key[LINE_MAX_PMI], value[LINE_MAX_PMI];

	if (!strncmp(line, "mcmd=spawn", 10))
		refuse("an MPI rank spawned processes (MPI_Comm_spawn)");
	else if (is_cmd(line, "publish_name") || is_cmd(line, "lookup_name"))
		refuse("an MPI rank published or looked up a port name (MPI_Comm_connect/accept)");
	if (is_cmd(line, "put")) {
		field(line, "key", key, sizeof(key));
		field(line, "value", value, sizeof(value));
		remember(&pmi.puts, key, value);
	}
	if (!strncmp(line, "cmd=", 4) && !is_cmd(line, "abort"))
		snprintf(pmi.pending, sizeof(pmi.pending), "%s", line);
}

/* slurmstepd's answer to the pending request. */
static void note_answer(const char *line)
{
	char key[LINE_MAX_PMI], value[LINE_MAX_PMI], rc[16];

	if (is_cmd(pmi.pending, "get") && is_cmd(line, "get_result")) {
		field(line, "rc", rc, sizeof(rc));
		field(pmi.pending, "key", key, sizeof(key));
		field(line, "value", value, sizeof(value));
		if (!strcmp(rc, "0"))
			remember(&pmi.got, key, value);
	} else if (is_cmd(pmi.pending, "barrier_in") && is_cmd(line, "barrier_out")) {
		pmi.barriers_done++;
	} else if (pmi.pending[0] && !is_cmd(pmi.pending, "put")) {
		remember(&pmi.asked, pmi.pending, line);
	}
	pmi.pending[0] = '\0';
}

/* PMI-2's wire protocol starts with a 6-digit length: relayed, not read. */
static int pmi2_wire(const struct line_buffer *lb)
{
	for (int i = 0; i < 6; i++)
		if (i >= (int)lb->len || lb->b[i] < '0' || lb->b[i] > '9')
			return 0;
	return 1;
}

/* 0, or 1 at the end of the connection (or an error other than a wait). */
static int read_into(int fd, struct line_buffer *lb)
{
	ssize_t n = sizeof(lb->b) > lb->len ? read(fd, lb->b + lb->len, sizeof(lb->b) - lb->len) : 0;

	if (n > 0)
		lb->len += n;
	return n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
}

/* ---- answering, after a restart ---- */

/* The main thread's own name-service connection, made when first needed
 * and kept out of the images (a restart's coordinator is another). */
static void drop_old_connections(void);

static const struct kv_client *kv(void)
{
	static struct kv_client client = { kv_fd_request, &pmi.kv };

	drop_old_connections();
	if (pmi.kv < 0 && coordinator_path) {
		pmi.kv = kv_connect(coordinator_path());
		mark_left_outside(pmi.kv, 1);
	}
	return &client;
}

static void kv_drop(void)
{
	mark_left_outside(pmi.kv, 0);
	if (pmi.kv >= 0)
		close(pmi.kv);
	pmi.kv = -1;
}

/*
 * After a restart, in the main thread: slurmstepd's connection and the old
 * coordinator's came back unconnected.  Not closed by the REBUILD hook:
 * the checkpoint thread has an fd table of its own, where these numbers
 * are other files.
 */
static void drop_old_connections(void)
{
	if (!pmi.restarted)
		return;
	pmi.restarted = 0;
	if (pmi.real >= 0) {
		mark_left_outside(pmi.real, 0);
		close(pmi.real);
		pmi.real = -1;
	}
	kv_drop();
}

/* A request to the name service; the connection is made again when it
 * broke (a restart in the middle): 0 or errno. */
static int kv_retry(int (*call)(const char *, const char *, char *, size_t),
		    const char *a, const char *b, char *out, size_t size)
{
	for (int tries = 0; tries < 2; tries++) {
		int err;

		kv();
		if (pmi.kv < 0)
			return ENOTCONN;
		err = call(a, b, out, size);
		if (err != EPIPE && err != ENOTCONN && err != ECONNRESET && err != EMSGSIZE)
			return err;
		kv_drop();
	}
	return ENOTCONN;
}

static int call_put(const char *key, const char *value, char *out, size_t size)
{
	return kv_client_put(kv(), key, value);
}

static int call_get(const char *key, const char *unused, char *out, size_t size)
{
	return kv_client_get(kv(), key, out, size);
}

static int call_incr(const char *key, const char *unused, char *out, size_t size)
{
	return kv_client_incr(kv(), key, NULL);
}

static int call_await(const char *key, const char *n, char *out, size_t size)
{
	return kv_client_await(kv(), AWAIT_SLICE_S, key, atol(n));
}

static void job_key(char *out, size_t size, const char *what, const char *name)
{
	char enc[1024];	/* PMI keys are short (keylen_max, 64 in Slurm) */

	encode(name, enc, sizeof(enc));
	snprintf(out, size, "pmi:%s:%u:%s:%s", pmi.step, pmi.epoch, what, enc);
}

static void barrier_key(char *out, size_t size, unsigned k)
{
	snprintf(out, size, "pmi:%s:%u:barrier:%u", pmi.step, pmi.epoch, k);
}

static void answer_put(const char *line, char *reply, size_t size)
{
	char key[LINE_MAX_PMI], value[LINE_MAX_PMI], k[LINE_MAX_PMI + 64], v[3 * LINE_MAX_PMI];
	int err;

	field(line, "key", key, sizeof(key));
	field(line, "value", value, sizeof(value));
	remember(&pmi.puts, key, value);
	job_key(k, sizeof(k), "kv", key);
	encode(value, v, sizeof(v));
	err = kv_retry(call_put, k, v, NULL, 0);
	snprintf(reply, size, "cmd=put_result rc=%d%s\n", err ? -1 : 0,
		 err ? " msg=ckpt_name_service_failed" : "");
}

static void answer_get(const char *line, char *reply, size_t size)
{
	char key[LINE_MAX_PMI], k[LINE_MAX_PMI + 64], v[3 * LINE_MAX_PMI], value[LINE_MAX_PMI];
	struct record *r;

	field(line, "key", key, sizeof(key));
	r = find(&pmi.puts, key);
	if (!r)
		r = find(&pmi.got, key);
	if (r) {
		snprintf(reply, size, "cmd=get_result rc=0 value=%s\n", r->value);
		return;
	}
	job_key(k, sizeof(k), "kv", key);
	if (kv_retry(call_get, k, NULL, v, sizeof(v))) {
		snprintf(reply, size, "cmd=get_result rc=-1 msg=key_%s_not_found\n", key);
		return;
	}
	decode(v, value, sizeof(value));
	remember(&pmi.got, key, value);
	snprintf(reply, size, "cmd=get_result rc=0 value=%s\n", value);
}

/* Barrier k among the tasks: each counts itself in once per epoch; the
 * tasks that had passed it when checkpointed counted themselves at
 * REBUILD.  0, or -1 if the task died meanwhile. */
static int barrier(pid_t task)
{
	char key[128], n[16];
	unsigned k = pmi.barriers_done + 1;

	snprintf(n, sizeof(n), "%u", pmi.ntasks);
	for (;;) {
		int err;

		barrier_key(key, sizeof(key), k);
		if (pmi.counted_epoch != pmi.epoch + 1) {	/* a restart came meanwhile */
			if (kv_retry(call_incr, key, NULL, NULL, 0))
				die("PMI barrier %u: the name service failed", k);
			pmi.counted_epoch = pmi.epoch + 1;
		}
		err = kv_retry(call_await, key, n, NULL, 0);
		if (!err)
			return 0;
		if (err != ETIMEDOUT)
			die("PMI barrier %u: the name service failed: %s", k, strerror(err));
		if (kill(task, 0) && errno == ESRCH)
			return -1;
	}
}

/* The answer to the pending request, from records and the name service;
 * queued with the state it changes, in one critical section. */
static void answer_locally(pid_t task)
{
	char reply[2 * LINE_MAX_PMI] = "";
	struct record *r;
	sigset_t old;
	int passed = 0;

	if (is_cmd(pmi.pending, "put"))
		answer_put(pmi.pending, reply, sizeof(reply));
	else if (is_cmd(pmi.pending, "get"))
		answer_get(pmi.pending, reply, sizeof(reply));
	else if (is_cmd(pmi.pending, "barrier_in"))
		passed = barrier(task) == 0;
	else if (is_cmd(pmi.pending, "finalize"))
		snprintf(reply, sizeof(reply), "cmd=finalize_ack\n");
	else if ((r = find(&pmi.asked, pmi.pending)))
		snprintf(reply, sizeof(reply), "%s", r->value);
	else if (is_cmd(pmi.pending, "init"))
		snprintf(reply, sizeof(reply),
			 "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n");
	else
		snprintf(reply, sizeof(reply), "cmd=%.*s_result rc=-1 msg=not_after_a_restart\n",
			 (int)strcspn(pmi.pending + 4, " \n"), pmi.pending + 4);
	trace("<<local", passed ? "cmd=barrier_out" : reply);
	block_signals(&old);
	if (passed) {
		pmi.barriers_done++;
		pmi.counted_epoch = 0;	/* the next barrier is counted anew */
		append(&pmi.to_app, "cmd=barrier_out\n");
	}
	append(&pmi.to_app, reply);
	pmi.pending[0] = '\0';
	restore_signals(&old);
}

/* ---- the server's side ---- */

/*
 * Before the task's command starts: if slurmstepd gave it a PMI fd, that
 * number becomes one end of a socketpair (the command inherits it) and
 * slurmstepd's connection moves to a number of the server's own.
 */
void pmi_proxy_prepare(unsigned rank, unsigned ntasks)
{
	const char *fd_text = getenv("PMI_FD");
	int pair[2], number;

	coordinator_path = (const char *(*)(void))dlsym(RTLD_DEFAULT, "ckpt_coordinator_path");
	left_outside = (void (*)(int, int))dlsym(RTLD_DEFAULT, "ckpt_fd_left_outside");
	snprintf(pmi.step, sizeof(pmi.step), "%s.%s", getenv("SLURM_JOB_ID") ?: "0",
		 getenv("SLURM_STEP_ID") ?: "0");
	/* Open MPI's PMIx is answered by plugins/pmix in the ranks, where it
	 * was built (it needs PMIx's headers) */
	if ((getenv("PMIX_NAMESPACE") || getenv("PMIX_SERVER_URI2") || getenv("PMIX_SERVER_URI3")) &&
	    !strstr(getenv("LD_PRELOAD") ?: "", "libckpt_pmix.so"))
		refuse("srun --mpi=pmix: the PMIx plugin (plugins/pmix) is not built here, so "
		       "the ranks' PMIx connection to slurmstepd cannot be restored");
	if (getenv("CKPT_PMI_TRACE"))
		trace_fd = open(getenv("CKPT_PMI_TRACE"), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC,
				0600);
	if (!fd_text || !*fd_text)
		return;
	number = atoi(fd_text);
	if (number < 3 || fcntl(number, F_GETFD) < 0)
		return;
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair))
		die("PMI: socketpair: %s", strerror(errno));
	pmi.real = fcntl(number, F_DUPFD_CLOEXEC, 100);
	if (pmi.real < 0 || dup2(pair[1], number) != number)	/* the command inherits it */
		die("PMI: cannot move fd %d: %s", number, strerror(errno));
	close(pair[1]);
	pmi.app = pair[0];
	fcntl(pmi.app, F_SETFL, O_NONBLOCK);
	fcntl(pmi.real, F_SETFL, O_NONBLOCK);
	pmi.rank = rank;
	pmi.ntasks = ntasks;
	pmi.active = number + 1;
	mark_left_outside(pmi.real, 1);
}

/* Once the command runs: its end is its own. */
void pmi_proxy_started(void)
{
	if (pmi.active)
		close(pmi.active - 1);
}

int pmi_proxy_pollfds(struct pollfd *p)
{
	int n = 0;

	if (!pmi.active)
		return 0;
	drop_old_connections();
	if (!pmi.app_eof || pmi.to_app.len)
		p[n++] = (struct pollfd){ .fd = pmi.app, .events = (pmi.app_eof ? 0 : POLLIN) |
						 (pmi.to_app.len ? POLLOUT : 0) };
	if (pmi.real >= 0 && !pmi.local && (!pmi.real_eof || pmi.to_real.len))
		p[n++] = (struct pollfd){ .fd = pmi.real, .events = (pmi.real_eof ? 0 : POLLIN) |
						  (pmi.to_real.len ? POLLOUT : 0) };
	return n;
}

static void flush(int fd, struct line_buffer *lb)
{
	ssize_t n = fd >= 0 && lb->len ? write(fd, lb->b, lb->len) : 0;

	if (n > 0) {
		lb->len -= n;
		memmove(lb->b, lb->b + n, lb->len);
	}
}

/* Bytes of one buffer to the end of another (PMI-2's wire protocol). */
static void move_all(struct line_buffer *from, struct line_buffer *to)
{
	size_t n = sizeof(to->b) - to->len < from->len ? sizeof(to->b) - to->len : from->len;

	memcpy(to->b + to->len, from->b, n);
	to->len += n;
	from->len -= n;
	memmove(from->b, from->b + n, from->len);
}

/* What the rank sent: relayed and noted before a restart; after one,
 * kept for pmi_proxy_serve to answer. */
static void from_app(void)
{
	char line[LINE_MAX_PMI];
	sigset_t old;

	block_signals(&old);
	pmi.app_eof = read_into(pmi.app, &pmi.from_app);
	if (!pmi.local && !pmi.raw && pmi2_wire(&pmi.from_app)) {
		refuse("the MPI library speaks PMI-2's wire protocol, which ckpt cannot answer "
		       "after a restart yet");
		pmi.raw = 1;
	}
	if (pmi.raw)
		move_all(&pmi.from_app, &pmi.to_real);
	while (!pmi.local && !pmi.raw && take_line(&pmi.from_app, line, sizeof(line))) {
		note_request(line);
		trace("app>", line);
		append(&pmi.to_real, line);
	}
	restore_signals(&old);
}

static void from_real(void)
{
	char line[LINE_MAX_PMI];
	sigset_t old;

	block_signals(&old);
	pmi.real_eof = read_into(pmi.real, &pmi.from_real);
	if (pmi.raw)
		move_all(&pmi.from_real, &pmi.to_app);
	while (!pmi.raw && take_line(&pmi.from_real, line, sizeof(line))) {
		note_answer(line);
		trace("<real", line);
		append(&pmi.to_app, line);
	}
	restore_signals(&old);
}

/* After a restart: the rank's next request, answered. */
static void serve_locally(pid_t task)
{
	char line[LINE_MAX_PMI];
	sigset_t old;

	block_signals(&old);
	if (!pmi.pending[0] && take_line(&pmi.from_app, line, sizeof(line))) {
		snprintf(pmi.pending, sizeof(pmi.pending), "%s", line);
		trace("app>>", line);
	}
	restore_signals(&old);
	if (!strncmp(pmi.pending, "cmd=abort", 9)) {
		kill(-task, SIGKILL);	/* PMI_Abort: the job ends */
		pmi.pending[0] = '\0';
	} else if (pmi.pending[0]) {
		answer_locally(task);
	}
}

void pmi_proxy_serve(const struct pollfd *p, int n, pid_t task)
{
	if (!pmi.active)
		return;
	for (int i = 0; i < n; i++) {
		if (p[i].fd == pmi.app && (p[i].revents & (POLLIN | POLLHUP | POLLERR)))
			from_app();
		if (p[i].fd == pmi.real && !pmi.local && (p[i].revents & (POLLIN | POLLHUP | POLLERR)))
			from_real();
	}
	if (pmi.local)
		serve_locally(task);
	flush(pmi.app, &pmi.to_app);
	if (!pmi.local)
		flush(pmi.real, &pmi.to_real);
}

/* More to answer without waiting for the rank (serve again at once). */
int pmi_proxy_busy(void)
{
	return pmi.active && pmi.local && memchr(pmi.from_app.b, '\n', pmi.from_app.len);
}

/* ---- the plugin's hooks (remote/plugin.c) ---- */

const char *pmi_proxy_unsupported(void)
{
	return pmi.unsupported[0] ? pmi.unsupported : NULL;
}

/*
 * REBUILD after a restart (the server is parked): from now on answer
 * locally.  Publish what this rank put and was answered, and count it in
 * at the last barrier it passed, under this restart's epoch.  The hook
 * runs on the checkpoint thread: no malloc; its own name-service
 * connection, made and closed here.
 */
int pmi_proxy_restarted(unsigned seq, char *why, size_t size)
{
	struct kv_client client;
	int fd, err = 0;

	if (!pmi.active)
		return 0;
	pmi.local = 1;
	pmi.epoch = seq;
	pmi.restarted = 1;	/* the main thread drops the old connections */
	pmi.to_real.len = 0;
	pmi.from_real.len = 0;
	pmi.raw = 0;
	fd = coordinator_path ? kv_connect(coordinator_path()) : -ENOTCONN;
	if (fd < 0) {
		snprintf(why, size, "PMI: cannot reach the name service: %s", strerror(-fd));
		return -fd;
	}
	client = (struct kv_client){ kv_fd_request, &fd };
	for (int pass = 0; pass < 2 && !err; pass++) {
		const struct records *rs = pass ? &pmi.got : &pmi.puts;

		for (unsigned i = 0; i < rs->n && !err; i++) {
			static char k[LINE_MAX_PMI + 64], v[3 * LINE_MAX_PMI];

			job_key(k, sizeof(k), "kv", rs->r[i].key);
			encode(rs->r[i].value, v, sizeof(v));
			err = kv_client_put(&client, k, v);
		}
	}
	if (!err && pmi.barriers_done) {
		char key[128];

		barrier_key(key, sizeof(key), pmi.barriers_done);
		err = kv_client_incr(&client, key, NULL);
	}
	close(fd);
	if (err)
		snprintf(why, size, "PMI: publishing rank %u's keys failed: %s", pmi.rank,
			 strerror(err));
	return err;
}
