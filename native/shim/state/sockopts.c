/*
 * Socket buffer sizes the application set.  TCP grows a buffer nobody
 * set (autotuning) and the kernel tells no one whether a size was set or
 * grown: this setsockopt() wrapper remembers each socket whose SO_SNDBUF
 * or SO_RCVBUF the application set, so that a restart sets just those.
 *
 * Sockets are known by inode (a checkpoint asks by inode, whatever fd
 * the socket has then) and by fd: a restart keeps the fds and makes new
 * inodes, so after one each entry takes its fd's new inode.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include "shim.h"

#define MAX_SOCKETS 256

typedef int (*setsockopt_fn)(int, int, int, const void *, socklen_t);

struct buffers_set {
	int fd;
	uint64_t ino;
	unsigned which;			/* SOCKOPT_SET_* */
};

static struct buffers_set table[MAX_SOCKETS];
static unsigned ntable;
static char table_lock;		/* app threads only; the checkpoint thread reads
				 * while they are parked */

static struct buffers_set *entry_for(int fd, uint64_t ino)
{
	for (unsigned i = 0; i < ntable; i++)
		if (table[i].fd == fd || table[i].ino == ino)
			return &table[i];
	return ntable < MAX_SOCKETS ? &table[ntable++] : NULL;
}

static void remember(int fd, unsigned which)
{
	struct buffers_set *e;
	struct stat st;

	if (fstat(fd, &st))
		return;
	while (__atomic_test_and_set(&table_lock, __ATOMIC_ACQUIRE))
		;
	e = entry_for(fd, st.st_ino);
	if (e) {
		if (e->fd != fd || e->ino != st.st_ino)
			e->which = 0;	/* a closed socket's fd or inode, reused */
		e->fd = fd;
		e->ino = st.st_ino;
		e->which |= which;
	}
	__atomic_clear(&table_lock, __ATOMIC_RELEASE);
}

static setsockopt_fn real_setsockopt;

/* Looked up at load: the checkpoint thread, whose own setsockopt calls
 * come here too, must not call dlsym (the loader lock may be held by a
 * parked thread). */
__attribute__((constructor)) static void find_setsockopt(void)
{
	real_setsockopt = (setsockopt_fn)dlsym(RTLD_NEXT, "setsockopt");
}

static unsigned buffer_option(int level, int name)
{
	if (level != SOL_SOCKET)
		return 0;
	if (name == SO_SNDBUF || name == SO_SNDBUFFORCE)
		return SOCKOPT_SET_SNDBUF;
	if (name == SO_RCVBUF || name == SO_RCVBUFFORCE)
		return SOCKOPT_SET_RCVBUF;
	return 0;
}

SHIM_EXPORT int setsockopt(int fd, int level, int name, const void *value, socklen_t len)
{
	unsigned which = buffer_option(level, name);
	int ret;

	if (!real_setsockopt)	/* called from a constructor that ran before ours */
		find_setsockopt();
	ret = real_setsockopt(fd, level, name, value, len);
	/* the checkpoint thread's sockets are its own; and it must not wait
	 * for the lock a parked thread may hold */
	if (ret == 0 && which && !checkpointer_is_current())
		remember(fd, which);
	return ret;
}

/* Which buffer sizes the application set on the socket with inode ino. */
unsigned sockopt_buffers_set(uint64_t ino)
{
	for (unsigned i = 0; i < ntable; i++)
		if (table[i].ino == ino)
			return table[i].which;
	return 0;
}

/* After a restart (checkpoint thread, application parked): the sockets
 * are new, on the same fds. */
void sockopt_buffers_renew(void)
{
	for (unsigned i = 0; i < ntable; i++) {
		struct stat st;

		if (app_stat(table[i].fd, &st) || !S_ISSOCK(st.st_mode))
			table[i].which = 0;
		else
			table[i].ino = st.st_ino;
	}
}
