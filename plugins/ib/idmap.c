/* See idmap.h.  A table that was outgrown is never freed while the map
 * lives: a reader may still be walking it. */
#include <errno.h>
#include <stdlib.h>
#include "idmap.h"

static uint64_t hash64(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdULL;
	k ^= k >> 33;
	return k;
}

int ib_idmap_get(struct ib_idmap *map, uint64_t key, uint64_t *value)
{
	struct ib_idmap_table *t = atomic_load_explicit(&map->table, memory_order_acquire);

	if (!t || !key)
		return 0;
	for (uint32_t i = hash64(key) & t->mask;; i = (i + 1) & t->mask) {
		uint64_t k = atomic_load_explicit(&t->slot[i].key, memory_order_acquire);

		if (k == key) {
			*value = atomic_load_explicit(&t->slot[i].value, memory_order_relaxed);
			return 1;
		}
		if (!k)
			return 0;
	}
}

/* 1 if key is new.  The caller holds the lock and left room. */
static int store(struct ib_idmap_table *t, uint64_t key, uint64_t value)
{
	for (uint32_t i = hash64(key) & t->mask;; i = (i + 1) & t->mask) {
		uint64_t k = atomic_load_explicit(&t->slot[i].key, memory_order_relaxed);

		if (k == key) {
			atomic_store_explicit(&t->slot[i].value, value, memory_order_relaxed);
			return 0;
		}
		if (!k) {
			/* value first: a reader that sees the key sees its value */
			atomic_store_explicit(&t->slot[i].value, value, memory_order_relaxed);
			atomic_store_explicit(&t->slot[i].key, key, memory_order_release);
			return 1;
		}
	}
}

static int grow(struct ib_idmap *map)
{
	struct ib_idmap_table *old = map->table, *t;
	uint32_t cap = old ? (old->mask + 1) * 2 : 64;

	t = calloc(1, sizeof(*t) + cap * sizeof(t->slot[0]));
	if (!t)
		return ENOMEM;
	t->mask = cap - 1;
	for (uint32_t i = 0; old && i <= old->mask; i++)
		if (old->slot[i].key)
			store(t, old->slot[i].key, old->slot[i].value);
	atomic_store_explicit(&map->table, t, memory_order_release);
	return 0;
}

int ib_idmap_put(struct ib_idmap *map, uint64_t key, uint64_t value)
{
	int err = 0;

	if (!key)
		return EINVAL;
	pthread_mutex_lock(&map->lock);
	if (!map->table || (map->used + 1) * 4 > (map->table->mask + 1) * 3)
		err = grow(map);
	if (!err)
		map->used += store(map->table, key, value);
	pthread_mutex_unlock(&map->lock);
	return err;
}

void ib_idmap_clear(struct ib_idmap *map)
{
	struct ib_idmap_table *t;

	pthread_mutex_lock(&map->lock);
	t = map->table;
	for (uint32_t i = 0; t && i <= t->mask; i++) {
		atomic_store_explicit(&t->slot[i].key, 0, memory_order_relaxed);
		atomic_store_explicit(&t->slot[i].value, 0, memory_order_relaxed);
	}
	map->used = 0;
	pthread_mutex_unlock(&map->lock);
}

void ib_idmap_free(struct ib_idmap *map)
{
	free(map->table);
	map->table = NULL;
	map->used = 0;
}
