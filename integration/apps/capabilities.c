/*
 * A program that gives up privileges, each thread its own way: the main
 * thread keeps a few capabilities effective, one more only permitted, one
 * inheritable and ambient, and drops CAP_SYS_BOOT from its bounding set;
 * a worker keeps only CAP_KILL permitted.  Each thread checks its sets at
 * every step; they must be the same after a restart (which runs as root).
 *
 *   capabilities [steps] [ms-per-step]      (as root)
 */
#define _GNU_SOURCE
#include <linux/capability.h>
#include <pthread.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include "zdtm.h"

#define BIT(cap) (1ULL << (cap))

struct caps {
	uint64_t effective, permitted, inheritable, ambient;
};

static volatile int done;

static void set_caps(const struct caps *c)
{
	struct __user_cap_header_struct hdr = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct data[2] = {
		{ (uint32_t)c->effective, (uint32_t)c->permitted, (uint32_t)c->inheritable },
		{ (uint32_t)(c->effective >> 32), (uint32_t)(c->permitted >> 32),
		  (uint32_t)(c->inheritable >> 32) },
	};

	zdtm_check(syscall(SYS_capset, &hdr, data) == 0, "capset: %s", strerror(errno));
	for (int cap = 0; cap < 64; cap++)
		if (c->ambient & BIT(cap))
			zdtm_check(prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0) == 0,
				   "PR_CAP_AMBIENT_RAISE %d: %s", cap, strerror(errno));
}

static void check_caps(const struct caps *c, const char *who, long step)
{
	struct __user_cap_header_struct hdr = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct data[2];
	uint64_t ambient = 0;

	zdtm_check(syscall(SYS_capget, &hdr, data) == 0, "capget: %s", strerror(errno));
	zdtm_check((data[0].effective | (uint64_t)data[1].effective << 32) == c->effective,
		   "%s, step %ld: effective set changed", who, step);
	zdtm_check((data[0].permitted | (uint64_t)data[1].permitted << 32) == c->permitted,
		   "%s, step %ld: permitted set changed", who, step);
	zdtm_check((data[0].inheritable | (uint64_t)data[1].inheritable << 32) == c->inheritable,
		   "%s, step %ld: inheritable set changed", who, step);
	for (int cap = 0; cap < 64; cap++)
		if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, cap, 0, 0) == 1)
			ambient |= BIT(cap);
	zdtm_check(ambient == c->ambient, "%s, step %ld: ambient set changed", who, step);
	zdtm_check(prctl(PR_CAPBSET_READ, CAP_SYS_BOOT) == 0,
		   "%s, step %ld: CAP_SYS_BOOT is back in the bounding set", who, step);
	zdtm_check(prctl(PR_CAPBSET_READ, CAP_KILL) == 1,
		   "%s, step %ld: CAP_KILL left the bounding set", who, step);
}

static const struct caps main_caps = {
	.effective = BIT(CAP_CHOWN) | BIT(CAP_NET_BIND_SERVICE) | BIT(CAP_KILL),
	.permitted = BIT(CAP_CHOWN) | BIT(CAP_NET_BIND_SERVICE) | BIT(CAP_KILL) |
		     BIT(CAP_SYS_NICE),
	.inheritable = BIT(CAP_NET_BIND_SERVICE),
	.ambient = BIT(CAP_NET_BIND_SERVICE),
};
static const struct caps worker_caps = { .permitted = BIT(CAP_KILL) };

static void *worker(void *arg)
{
	long step = 0;

	(void)arg;
	set_caps(&worker_caps);
	while (!done) {
		check_caps(&worker_caps, "worker", ++step);
		zdtm_pace(5);
	}
	check_caps(&worker_caps, "worker", ++step);
	return NULL;
}

int main(int argc, char **argv)
{
	long steps = 300, pace = 10;
	pthread_t th;

	zdtm_args(argc, argv, &steps, &pace);
	zdtm_check(getuid() == 0, "run as root");
	zdtm_check(prctl(PR_CAPBSET_DROP, CAP_SYS_BOOT) == 0, "PR_CAPBSET_DROP: %s",
		   strerror(errno));
	zdtm_check(pthread_create(&th, NULL, worker, NULL) == 0, "pthread_create");
	set_caps(&main_caps);
	printf("READY\n");
	fflush(stdout);
	for (long s = 1; s <= steps; s++) {
		check_caps(&main_caps, "main thread", s);
		zdtm_pace(pace);
	}
	zdtm_hold();
	done = 1;
	pthread_join(th, NULL);
	zdtm_pass("capabilities kept");
	return 0;
}
