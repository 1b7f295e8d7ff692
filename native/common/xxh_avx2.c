/* xxhash's XXH3, compiled for AVX2: called only where the CPU has it
 * (fast_hash.c).  Its own file: the vector unit is chosen when xxhash.h
 * is read. */
#pragma GCC target("avx2")
#define XXH_INLINE_ALL
#include <xxhash.h>
#include "fast_hash.h"

__attribute__((visibility("hidden"))) uint64_t avx2_xxh3_64(const void *p, size_t len)
{
	return XXH3_64bits(p, len);
}

__attribute__((visibility("hidden"))) XXH128_hash_t avx2_xxh3_128(const void *p, size_t len)
{
	return XXH3_128bits(p, len);
}

__attribute__((visibility("hidden"))) void avx2_xxh3_64_update(XXH3_state_t *state,
							       const void *p, size_t len)
{
	XXH3_64bits_update(state, p, len);
}
