/* The real libibverbs, found behind the plugin with dlvsym(RTLD_NEXT). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include "ib.h"

struct ib_real ib_real;

/*
 * Behind the plugin in the global scope when the program links libibverbs;
 * otherwise the library was loaded by dlopen() with a library that needs
 * it (UCX's libuct_ib), in that library's local scope: found by its name.
 */
static void *find(const char *name, const char *version)
{
	static void *local;
	void *f = dlvsym(RTLD_NEXT, name, version);

	if (!f)
		f = dlsym(RTLD_NEXT, name);
	if (f)
		return f;
	if (!local)
		local = dlopen("libibverbs.so.1", RTLD_LAZY | RTLD_NOLOAD);
	if (!local)
		return NULL;
	f = dlvsym(local, name, version);
	return f ? f : dlsym(local, name);
}

#define LOAD(field, name, version) \
	(ib_real.field = (__typeof__(ib_real.field))find(name, version))

static int load_all(void)
{
	LOAD(get_device_list, "ibv_get_device_list", "IBVERBS_1.1");
	LOAD(free_device_list, "ibv_free_device_list", "IBVERBS_1.1");
	LOAD(open_device, "ibv_open_device", "IBVERBS_1.1");
	LOAD(close_device, "ibv_close_device", "IBVERBS_1.1");
	LOAD(get_device_name, "ibv_get_device_name", "IBVERBS_1.1");
	LOAD(query_device, "ibv_query_device", "IBVERBS_1.1");
	LOAD(query_port, "ibv_query_port", "IBVERBS_1.1");
	LOAD(query_gid, "ibv_query_gid", "IBVERBS_1.1");
	LOAD(query_pkey, "ibv_query_pkey", "IBVERBS_1.1");
	LOAD(alloc_pd, "ibv_alloc_pd", "IBVERBS_1.1");
	LOAD(dealloc_pd, "ibv_dealloc_pd", "IBVERBS_1.1");
	LOAD(reg_mr, "ibv_reg_mr", "IBVERBS_1.1");
	LOAD(dereg_mr, "ibv_dereg_mr", "IBVERBS_1.1");
	LOAD(reg_mr_iova2, "ibv_reg_mr_iova2", "IBVERBS_1.8");
	LOAD(rereg_mr, "ibv_rereg_mr", "IBVERBS_1.1");
	LOAD(create_comp_channel, "ibv_create_comp_channel", "IBVERBS_1.0");
	LOAD(destroy_comp_channel, "ibv_destroy_comp_channel", "IBVERBS_1.0");
	LOAD(create_cq, "ibv_create_cq", "IBVERBS_1.1");
	LOAD(destroy_cq, "ibv_destroy_cq", "IBVERBS_1.1");
	LOAD(resize_cq, "ibv_resize_cq", "IBVERBS_1.1");
	LOAD(get_cq_event, "ibv_get_cq_event", "IBVERBS_1.1");
	LOAD(ack_cq_events, "ibv_ack_cq_events", "IBVERBS_1.1");
	LOAD(create_srq, "ibv_create_srq", "IBVERBS_1.1");
	LOAD(modify_srq, "ibv_modify_srq", "IBVERBS_1.1");
	LOAD(query_srq, "ibv_query_srq", "IBVERBS_1.1");
	LOAD(destroy_srq, "ibv_destroy_srq", "IBVERBS_1.1");
	LOAD(create_qp, "ibv_create_qp", "IBVERBS_1.1");
	LOAD(modify_qp, "ibv_modify_qp", "IBVERBS_1.1");
	LOAD(query_qp, "ibv_query_qp", "IBVERBS_1.1");
	LOAD(destroy_qp, "ibv_destroy_qp", "IBVERBS_1.1");
	LOAD(create_ah, "ibv_create_ah", "IBVERBS_1.1");
	LOAD(destroy_ah, "ibv_destroy_ah", "IBVERBS_1.1");
	LOAD(init_ah_from_wc, "ibv_init_ah_from_wc", "IBVERBS_1.1");
	LOAD(get_async_event, "ibv_get_async_event", "IBVERBS_1.1");
	LOAD(ack_async_event, "ibv_ack_async_event", "IBVERBS_1.1");
	/* the ones every verbs program needs; the rest are checked on use */
	return ib_real.get_device_list && ib_real.open_device && ib_real.close_device &&
	       ib_real.alloc_pd && ib_real.reg_mr && ib_real.create_cq && ib_real.create_qp &&
	       ib_real.modify_qp ? 0 : ENOSYS;
}

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static bool loaded;

/* Tried again until it works: a library dlopen()ed later may bring the
 * real libibverbs along. */
int ib_real_load(void)
{
	int err = 0;

	if (__atomic_load_n(&loaded, __ATOMIC_ACQUIRE))
		return 0;
	pthread_mutex_lock(&load_lock);
	if (!loaded) {
		err = load_all();
		if (!err)
			__atomic_store_n(&loaded, true, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&load_lock);
	return err;
}
