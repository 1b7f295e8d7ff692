/*
 * A map from 64-bit ids to 64-bit values: open addressing, readers take no
 * lock (the data path looks up every virtual id it translates), writers
 * serialize on a mutex.  Key 0 is the empty slot: callers never store it.
 * It only grows; ib_idmap_clear() empties it while no reader runs (the
 * plugin's gate is closed then).
 */
#ifndef CKPT_IB_IDMAP_H
#define CKPT_IB_IDMAP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

struct ib_idmap_slot {
	_Atomic uint64_t key;
	_Atomic uint64_t value;
};

struct ib_idmap_table {
	uint32_t mask;			/* capacity - 1, a power of two */
	struct ib_idmap_slot slot[];
};

struct ib_idmap {
	struct ib_idmap_table *_Atomic table;
	uint32_t used;
	pthread_mutex_t lock;
};

#define IB_IDMAP_INIT { NULL, 0, PTHREAD_MUTEX_INITIALIZER }

/* 1 and *value set if key is there, else 0. */
int ib_idmap_get(struct ib_idmap *map, uint64_t key, uint64_t *value);
/* Insert or replace; 0 or ENOMEM (or EINVAL for key 0). */
int ib_idmap_put(struct ib_idmap *map, uint64_t key, uint64_t value);
/* Remove every entry (capacity kept). */
void ib_idmap_clear(struct ib_idmap *map);
void ib_idmap_free(struct ib_idmap *map);

#endif
