/*
 * XXH3 with the widest vector unit the CPU has: AVX2 where there is one
 * (twice SSE2's speed on page-sized inputs), else xxhash's SSE2 default.
 * Same values either way.  Used by the shim (image checksums, page hashes)
 * and by ckpt-restart (checking images).
 */
#ifndef CKPT_FAST_HASH_H
#define CKPT_FAST_HASH_H

#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

uint64_t fast_xxh3_64(const void *p, size_t len);
XXH128_hash_t fast_xxh3_128(const void *p, size_t len);
void fast_xxh3_64_update(XXH3_state_t *state, const void *p, size_t len);

/* the AVX2 builds (common/xxh_avx2.c) */
uint64_t avx2_xxh3_64(const void *p, size_t len);
XXH128_hash_t avx2_xxh3_128(const void *p, size_t len);
void avx2_xxh3_64_update(XXH3_state_t *state, const void *p, size_t len);

#endif
