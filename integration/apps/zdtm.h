/*
 * Helpers of the self-verifying test programs (in the spirit of CRIU's
 * zdtm suite): each program does deterministic work in small paced steps,
 * so the harness can checkpoint, kill and restart it anywhere, then checks
 * its own state and prints "RESULT <value>" and "PASS" or "FAIL <reason>".
 * The harness compares RESULT with an uninterrupted run.
 */
#ifndef ZDTM_H
#define ZDTM_H

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static inline void zdtm_fail(const char *fmt, ...)
{
	va_list ap;

	printf("FAIL ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	exit(1);
}

#define zdtm_check(cond, ...) do { if (!(cond)) zdtm_fail(__VA_ARGS__); } while (0)

/* Sleep for ms milliseconds of wall time, even if a restart cut a sleep short. */
static inline void zdtm_pace(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

/* Wait while the file named by $ZDTM_HOLD exists: the harness holds a
 * program after its steps, before its final checks, until the test's
 * checkpoints are done (on a loaded machine they may take longer than the
 * program's steps).  Every program calls it once. */
static inline void zdtm_hold(void)
{
	const char *path = getenv("ZDTM_HOLD");

	while (path && access(path, F_OK) == 0)
		zdtm_pace(10);
}

static inline uint64_t zdtm_mix(uint64_t h, uint64_t v)
{
	h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
	return h * 0xff51afd7ed558ccdULL;
}

/* A hash over steps, each step paced (pace 0: at once, for the value a
 * child should have sent). */
static inline uint64_t zdtm_steps_hash(uint64_t seed, long steps, long pace)
{
	uint64_t hash = seed;

	for (long step = 0; step < steps; step++) {
		hash = zdtm_mix(hash, step);
		if (pace)
			zdtm_pace(pace);
	}
	return hash;
}

static inline uint64_t zdtm_xorshift(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

/* Steps and pace come from the command line: prog [steps] [ms-per-step]. */
static inline void zdtm_args(int argc, char **argv, long *steps, long *pace_ms)
{
	if (argc > 1)
		*steps = atol(argv[1]);
	if (argc > 2)
		*pace_ms = atol(argv[2]);
}

/* The result, once the program checked itself (after its hold: a
 * restart during the hold is checked too). */
static inline void zdtm_pass(const char *fmt, ...)
{
	va_list ap;

	printf("RESULT ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\nPASS\n");
	fflush(stdout);
}

/* The Anonymous: bytes smaps shows for the region at addr (a private
 * file map's pages the process copied on write). */
static inline long zdtm_anonymous_bytes(const void *addr)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	char line[512];
	unsigned long start, end, at = (unsigned long)addr;
	long kb = -1;
	int inside = 0;

	zdtm_check(f != NULL, "/proc/self/smaps: %m");
	while (kb < 0 && fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%lx-%lx ", &start, &end) == 2)
			inside = start <= at && at < end;
		else if (inside)
			sscanf(line, "Anonymous: %ld kB", &kb);
	}
	fclose(f);
	zdtm_check(kb >= 0, "no region at %p in /proc/self/smaps", addr);
	return kb * 1024;
}

#endif
