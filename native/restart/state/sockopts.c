/*
 * Socket options the application had changed (docs/IMAGE.md), set again
 * on the new socket before it is bound or connected, as the application
 * set them.  One that cannot be set (SO_MARK and a high SO_PRIORITY need
 * CAP_NET_ADMIN) is reported and the restart goes on.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include "ckpt_sockopts.h"
#include "restart.h"

static const struct ckpt_sockopt *saved_option(const struct ckpt_fd *f, int level, int name)
{
	for (unsigned i = 0; i < f->nsock_opts && i < CKPT_SOCK_OPTS; i++)
		if (f->sock_opts[i].level == level && f->sock_opts[i].name == name)
			return &f->sock_opts[i];
	return NULL;
}

void sockopts_apply(int s, const struct ckpt_fd *f)
{
	for (unsigned i = 0; i < f->nsock_opts && i < CKPT_SOCK_OPTS; i++) {
		const struct ckpt_sockopt *o = &f->sock_opts[i];
		const char *text = ckpt_sockopt_text(o->level, o->name);

		/* the moment's listener that makes a connection must not wait
		 * for data to accept */
		if (o->level == IPPROTO_TCP && o->name == TCP_DEFER_ACCEPT &&
		    !(f->sock_flags & CKPT_SOCK_LISTENING))
			continue;
		if (o->len > sizeof(o->value) ||
		    setsockopt(s, o->level, o->name, o->value, o->len) == 0)
			continue;
		if (text)
			warn("fd %d: socket option %s could not be set again: %s", f->fd, text,
			     strerror(errno));
		else
			warn("fd %d: socket option %d/%d could not be set again: %s", f->fd,
			     o->level, o->name, strerror(errno));
	}
}

/* The restart binds with SO_REUSEADDR (the old socket's port may still be
 * in TIME_WAIT); once bound, the socket gets the application's setting. */
void sockopts_finish(int s, const struct ckpt_fd *f)
{
	const struct ckpt_sockopt *o = saved_option(f, SOL_SOCKET, SO_REUSEADDR);
	int zero = 0;

	if (f->sock_domain != AF_UNIX && !o)
		setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &zero, sizeof(zero));
}
