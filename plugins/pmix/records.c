/*
 * What the rank put and what libpmix answered it, as text: the material
 * of its answers after a restart.  A record is complete before it is
 * linked in, so the checkpoint thread may walk a list at any time.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "pmix_plugin.h"

struct pmix_record *volatile pmix_puts;
struct pmix_record *volatile pmix_answers;
static pthread_mutex_t adding = PTHREAD_MUTEX_INITIALIZER;

const struct pmix_record *pmix_find(struct pmix_record *list, pmix_rank_t rank,
				    const char *key)
{
	for (const struct pmix_record *r = list; r; r = r->next)
		if (r->rank == rank && !strcmp(r->key, key))
			return r;
	return NULL;
}

/* A newer value of the same key comes first, so pmix_find finds it.
 * 0, or why the value could not be kept (ENOTSUP, ENOSPC, ENOMEM). */
int pmix_record(struct pmix_record *volatile *list, pmix_rank_t rank, const char *key,
		const pmix_value_t *v)
{
	static char text[PMIX_TEXT_MAX];	/* under the lock */
	struct pmix_record *r = NULL;
	int err;

	pthread_mutex_lock(&adding);
	err = pmix_value_to_text(v, text, sizeof(text));
	if (!err && !(r = calloc(1, sizeof(*r))))
		err = ENOMEM;
	if (!err) {
		r->rank = rank;
		r->key = strdup(key);
		r->text = strdup(text);
		if (r->key && r->text) {
			r->next = *list;
			__atomic_store_n(list, r, __ATOMIC_RELEASE);
		} else {
			free(r->key);
			free(r->text);
			free(r);
			err = ENOMEM;
		}
	}
	pthread_mutex_unlock(&adding);
	return err;
}
