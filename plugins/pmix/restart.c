/*
 * The plugin's side of checkpoints and restarts: a checkpoint is refused
 * while libpmix owes an answer (it would never come) or after a call no
 * restart could answer; at REBUILD after a restart the rank publishes its
 * puts to ckpt's name service, counts itself in at the last fence it
 * passed, and libpmix's connections to its gone server become sockets on
 * which nothing ever happens (listening, on loopback), so that libpmix's
 * progress thread never hears of a lost connection.  From then on the
 * application threads' calls are answered from here.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>
#include "ckpt_kv.h"
#include "ckpt_plugin.h"
#include "pmix_plugin.h"

#define CHUNK 2000		/* text characters per name-service value */
#define AWAIT_SLICE_S 5
#define KEY_MAX 1400		/* PMIx keys: 511 characters, hex-encoded */

struct pmix_state pmix_state;

/* Looked up at start-up: hooks must never call dlsym. */
static const char *(*coordinator_path)(void);
static void (*left_outside)(int fd, int left);
static void (*hook_fail)(const char *fmt, ...);

/* ---- libpmix's connections to its server ---- */

void pmix_open_fds(unsigned char *bits, size_t nbits)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;

	memset(bits, 0, nbits / 8);
	while (d && (e = readdir(d))) {
		long fd = strtol(e->d_name, NULL, 10);

		if (e->d_name[0] != '.' && fd >= 0 && (size_t)fd < nbits)
			bits[fd / 8] |= 1 << (fd % 8);
	}
	if (d)
		closedir(d);
}

void pmix_note_server_fds(const unsigned char *before, size_t nbits)
{
	unsigned char *after = calloc(1, nbits / 8);

	if (!after)
		return;
	pmix_open_fds(after, nbits);
	for (size_t fd = 0; fd < nbits && pmix_state.nserver_fds < 4; fd++) {
		struct sockaddr_storage peer;
		socklen_t len = sizeof(peer);
		struct stat st;

		if (!(after[fd / 8] & ~before[fd / 8] & (1 << (fd % 8))))
			continue;
		if (fstat((int)fd, &st) || !S_ISSOCK(st.st_mode) ||
		    getpeername((int)fd, (struct sockaddr *)&peer, &len))
			continue;
		pmix_state.server_fds[pmix_state.nserver_fds++] = (int)fd;
		if (left_outside)	/* the checkpoint says nothing of it */
			left_outside((int)fd, 1);
	}
	free(after);
}

/* The application's fd (the checkpoint thread has an fd table of its own)
 * made a listening socket on loopback: never readable, never hung up. */
static int quiet(int fd)
{
	int pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
	int s = pidfd < 0 ? -1 : (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0);
	int domain = -1, err = 0;
	socklen_t len = sizeof(domain);

	if (s < 0 || getsockopt(s, SOL_SOCKET, SO_DOMAIN, &domain, &len))
		err = errno;
	else if (domain == AF_UNIX) {
		struct sockaddr_un sa = { .sun_family = AF_UNIX };	/* an abstract name */

		if (bind(s, (struct sockaddr *)&sa, sizeof(sa_family_t)) || listen(s, 0))
			err = errno;
	} else if (domain == AF_INET) {
		struct sockaddr_in sa = { .sin_family = AF_INET,
					  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };

		if (bind(s, (struct sockaddr *)&sa, sizeof(sa)) || listen(s, 0))
			err = errno;
	} else if (domain == AF_INET6) {
		struct sockaddr_in6 sa = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT };

		if (bind(s, (struct sockaddr *)&sa, sizeof(sa)) || listen(s, 0))
			err = errno;
	}
	if (s >= 0)
		close(s);
	if (pidfd >= 0)
		close(pidfd);
	return err;
}

/* ---- name-service keys ---- */

/* "pmix:<nspace>:<epoch>:<rank>:<key>#<chunk>", names in hex; a key too
 * long for its room is an error, never cut short (two keys would meet). */
static int value_key(char *out, size_t size, pmix_rank_t rank, const char *key, unsigned chunk)
{
	char ns[2 * PMIX_MAX_NSLEN + 3], k[KEY_MAX];
	const char *nspace = pmix_state.me.nspace;
	int err;

	err = pmix_to_hex(nspace, strnlen(nspace, PMIX_MAX_NSLEN), ns, sizeof(ns));
	if (!err)
		err = pmix_to_hex(key, strlen(key), k, sizeof(k));
	if (!err && snprintf(out, size, "pmix:%s:%u:%u:%s#%u", ns, pmix_state.epoch, rank, k,
			     chunk) >= (int)size)
		err = ENOSPC;
	return err;
}

static void fence_key(char *out, size_t size, unsigned k)
{
	char ns[2 * PMIX_MAX_NSLEN + 3];
	const char *nspace = pmix_state.me.nspace;

	/* cannot fail: ns holds the longest namespace */
	pmix_to_hex(nspace, strnlen(nspace, PMIX_MAX_NSLEN), ns, sizeof(ns));
	snprintf(out, size, "pmix:%s:%u:fence:%u", ns, pmix_state.epoch, k);
}

/* Room for one name-service key and one chunk: the caller's (the hook's
 * stack, or static under kv_lock), never shared between the two. */
struct put_room {
	char k[2 * PMIX_MAX_NSLEN + KEY_MAX + 64];
	char v[CHUNK + 16];
};

/* A value's text in chunks: chunk 0 is "<count>/<text>". */
static int put_text(const struct kv_client *kv, struct put_room *room, pmix_rank_t rank,
		    const char *key, const char *text)
{
	char *k = room->k, *v = room->v;
	size_t len = strlen(text);
	unsigned count = (unsigned)((len + CHUNK - 1) / CHUNK), i;
	int err = 0;

	if (!count)
		count = 1;
	for (i = 0; i < count && !err; i++) {
		int n = i ? 0 : snprintf(v, sizeof(room->v), "%u/", count);

		snprintf(v + n, sizeof(room->v) - n, "%.*s", CHUNK, text + (size_t)i * CHUNK);
		err = value_key(k, sizeof(room->k), rank, key, i);
		if (!err)
			err = kv_client_put(kv, k, v);
	}
	return err;
}

/* ---- the application threads' connection to the name service ---- */

static pthread_mutex_t kv_lock = PTHREAD_MUTEX_INITIALIZER;
static int kv_fd = -1;
static unsigned kv_epoch;	/* the epoch kv_fd was made in, + 1 */

static int request(void *conn, const char *line, char *answer, size_t size)
{
	int err;

	if (kv_fd >= 0 && kv_epoch != pmix_state.epoch + 1) {	/* another restart */
		if (left_outside)
			left_outside(kv_fd, 0);
		close(kv_fd);
		kv_fd = -1;
	}
	if (kv_fd < 0) {
		kv_fd = coordinator_path ? kv_connect(coordinator_path()) : -ENOTCONN;
		if (kv_fd < 0) {
			err = -kv_fd;
			kv_fd = -1;
			return err;
		}
		kv_epoch = pmix_state.epoch + 1;
		if (left_outside)
			left_outside(kv_fd, 1);
	}
	err = kv_fd_request(&kv_fd, line, answer, size);
	if (err) {
		if (left_outside)
			left_outside(kv_fd, 0);
		close(kv_fd);
		kv_fd = -1;
	}
	return err;
}

static const struct kv_client app_kv = { request, NULL };

pmix_status_t pmix_publish(const char *key, const pmix_value_t *val)
{
	static char text[PMIX_TEXT_MAX];	/* under kv_lock */
	static struct put_room room;
	int err;

	pthread_mutex_lock(&kv_lock);
	err = pmix_value_to_text(val, text, sizeof(text));
	if (!err)
		err = put_text(&app_kv, &room, pmix_state.me.rank, key, text);
	pthread_mutex_unlock(&kv_lock);
	return err == ENOTSUP ? PMIX_ERR_NOT_SUPPORTED : err ? PMIX_ERROR : PMIX_SUCCESS;
}

int pmix_published_get(pmix_rank_t rank, const char *key, pmix_value_t **value)
{
	static char k[2 * PMIX_MAX_NSLEN + KEY_MAX + 64], v[CHUNK + 16], text[PMIX_TEXT_MAX];	/* under kv_lock */
	unsigned count = 1;
	size_t len = 0;
	int err = 0;

	pthread_mutex_lock(&kv_lock);
	for (unsigned i = 0; i < count && !err; i++) {
		const char *part = v;

		err = value_key(k, sizeof(k), rank, key, i);
		if (!err)
			err = kv_client_get(&app_kv, k, v, sizeof(v));
		if (err)
			break;
		if (!i) {
			count = (unsigned)strtoul(v, (char **)&part, 10);
			if (*part++ != '/' || !count || count > PMIX_TEXT_MAX / CHUNK) {
				err = EPROTO;
				break;
			}
		}
		len += (size_t)snprintf(text + len, sizeof(text) - len, "%s", part);
	}
	if (!err) {
		*value = malloc(sizeof(**value));
		err = !*value ? ENOMEM : pmix_value_from_text(text, *value);
		if (err && *value) {
			free(*value);
			*value = NULL;
		}
	}
	pthread_mutex_unlock(&kv_lock);
	return err;
}

unsigned pmix_job_size(void)
{
	const struct pmix_record *r = pmix_find(pmix_answers, PMIX_RANK_WILDCARD, PMIX_JOB_SIZE);
	pmix_value_t v;
	unsigned size = 0;

	if (r && !pmix_value_from_text(r->text, &v) && v.type == PMIX_UINT32)
		size = v.data.uint32;
	if (!size && getenv("SLURM_NTASKS"))
		size = (unsigned)atoi(getenv("SLURM_NTASKS"));
	return size;
}

/* Fence k: each rank counts itself in once per epoch (the ranks that had
 * passed it when checkpointed counted themselves at REBUILD).  A failed
 * request is asked again only where that cannot count the rank twice: a
 * restart came meanwhile (a new epoch, counted anew), or it was a wait.
 * 0, or EIO if the name service keeps failing. */
int pmix_local_fence(void)
{
	unsigned k = pmix_state.fences_done + 1, counted = 0, failures = 0;
	long n = pmix_job_size();
	char key[2 * PMIX_MAX_NSLEN + 64];
	int err = 0;

	if (n <= 0)
		return EINVAL;
	pthread_mutex_lock(&kv_lock);
	for (;;) {
		unsigned epoch = pmix_state.epoch;

		fence_key(key, sizeof(key), k);
		if (counted != epoch + 1) {	/* first, or a restart came meanwhile */
			err = kv_client_incr(&app_kv, key, NULL);
			if (err && pmix_state.epoch == epoch)
				break;		/* the count may or may not have taken it */
			if (err)
				continue;
			counted = epoch + 1;
		}
		err = kv_client_await(&app_kv, AWAIT_SLICE_S, key, n);
		if (!err || (err != ETIMEDOUT && pmix_state.epoch == epoch && ++failures > 5))
			break;
		if (err != ETIMEDOUT && pmix_state.epoch == epoch)
			sleep(1);
	}
	if (!err)
		pmix_state.fences_done = k;
	pthread_mutex_unlock(&kv_lock);
	return err ? EIO : 0;
}

/* ---- hooks ---- */

/* REBUILD after a restart, on the checkpoint thread (no malloc): its own
 * name-service connection, made and closed here. */
static int restarted(unsigned seq)
{
	struct put_room room;	/* the checkpoint thread's stack: no malloc here */
	struct kv_client kv;
	int fd, err = 0;

	pmix_state.epoch = seq;
	__atomic_store_n(&pmix_state.local, 1, __ATOMIC_SEQ_CST);
	for (int i = 0; i < pmix_state.nserver_fds && !err; i++)
		err = quiet(pmix_state.server_fds[i]);
	if (err) {
		hook_fail("PMIx: cannot stand in for the server's connection: %s", strerror(err));
		return err;
	}
	fd = coordinator_path ? kv_connect(coordinator_path()) : -ENOTCONN;
	if (fd < 0) {
		hook_fail("PMIx: cannot reach the name service: %s", strerror(-fd));
		return -fd;
	}
	kv = (struct kv_client){ kv_fd_request, &fd };
	for (const struct pmix_record *r = pmix_puts; r && !err; r = r->next)
		if (!pmix_find(pmix_puts, r->rank, r->key) || pmix_find(pmix_puts, r->rank, r->key) == r)
			err = put_text(&kv, &room, r->rank, r->key, r->text);	/* the newest value */
	if (!err && pmix_state.fences_done) {
		char key[2 * PMIX_MAX_NSLEN + 64];

		fence_key(key, sizeof(key), pmix_state.fences_done);
		err = kv_client_incr(&kv, key, NULL);
	}
	close(fd);
	if (err)
		hook_fail("PMIx: publishing rank %u's keys failed: %s", pmix_state.me.rank,
			  strerror(err));
	return err;
}

static int hook(const struct ckpt_hook_ctx *ctx, void *arg)
{
	int owed = __atomic_load_n(&pmix_state.in_flight, __ATOMIC_SEQ_CST);

	if (ctx->phase == CKPT_PHASE_REBUILD && ctx->restarted)
		return pmix_state.initialized ? restarted(ctx->seq) : 0;
	if (ctx->phase != CKPT_PHASE_STOP && ctx->phase != CKPT_PHASE_SUSPEND)
		return 0;
	if (pmix_state.initialized && pmix_state.unsupported[0]) {
		hook_fail("srun --mpi=pmix: %s", pmix_state.unsupported);
		return ENOTSUP;
	}
	if (owed && !pmix_state.local) {	/* PMIx_Init counts before it is done */
		hook_fail("srun --mpi=pmix: a PMIx call to slurmstepd is under way (a fence or "
			  "a peer's key); try again");
		return EBUSY;
	}
	return 0;
}

/* Without the shim (run by hand) there is nothing to register with. */
__attribute__((constructor)) static void pmix_plugin_init(void)
{
	static const struct ckpt_plugin plugin = { .name = "pmix", .hook = hook };
	int (*reg)(const struct ckpt_plugin *) =
		(int (*)(const struct ckpt_plugin *))dlsym(RTLD_DEFAULT, "ckpt_plugin_register");

	coordinator_path = (const char *(*)(void))dlsym(RTLD_DEFAULT, "ckpt_coordinator_path");
	left_outside = (void (*)(int, int))dlsym(RTLD_DEFAULT, "ckpt_fd_left_outside");
	hook_fail = (void (*)(const char *, ...))dlsym(RTLD_DEFAULT, "ckpt_hook_fail");
	if (reg && hook_fail)
		reg(&plugin);
}
