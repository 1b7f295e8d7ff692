/* Which XXH3 build this CPU runs (include/fast_hash.h). */
#define XXH_INLINE_ALL
#include <xxhash.h>
#include "fast_hash.h"

#define HIDDEN __attribute__((visibility("hidden")))

static int has_avx2(void)
{
	static int known = -1;

	if (known < 0) {
		__builtin_cpu_init();
		known = __builtin_cpu_supports("avx2");
	}
	return known;
}

HIDDEN uint64_t fast_xxh3_64(const void *p, size_t len)
{
	return has_avx2() ? avx2_xxh3_64(p, len) : XXH3_64bits(p, len);
}

HIDDEN XXH128_hash_t fast_xxh3_128(const void *p, size_t len)
{
	return has_avx2() ? avx2_xxh3_128(p, len) : XXH3_128bits(p, len);
}

HIDDEN void fast_xxh3_64_update(XXH3_state_t *state, const void *p, size_t len)
{
	if (has_avx2())
		avx2_xxh3_64_update(state, p, len);
	else
		XXH3_64bits_update(state, p, len);
}
