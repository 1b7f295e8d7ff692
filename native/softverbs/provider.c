/*
 * softverbs: libibverbs' private provider interface (IBVERBS_PRIVATE_34).
 *
 * rdma-core's provider libraries (libmlx5.so.1, libmlx4.so.1, libefa.so.1,
 * ...) link against these symbols, and libraries such as UCX's libuct_ib
 * link against a provider, so they only load if softverbs exports them.
 * softverbs behaves like rdma-core on a machine whose HCA belongs to a
 * different provider: a provider that registers is remembered but matches
 * no device (softverbs' devices are its own), so nothing that needs a
 * matched device -- a provider context, kernel commands -- is ever reached
 * through libibverbs.  A provider that calls those entry points anyway gets
 * an error, never a fake success: softverbs has no kernel uverbs device to
 * send commands to.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sv.h"

/*
 * Laid out like rdma-core's struct verbs_device_ops (driver.h).  Providers
 * only compare a device's ops pointer with their own table; softverbs'
 * table names softverbs and has no provider callbacks.
 */
struct sv_provider_ops {
	const char *name;
	uint32_t match_min_abi_version;
	uint32_t match_max_abi_version;
	const void *match_table;
	const void **static_providers;
	void *match_device;
	void *alloc_context;
	void *import_context;
	void *alloc_device;
	void *uninit_device;
};

const struct sv_provider_ops sv_provider_ops = { .name = "softverbs" };

#define SV_MAX_PROVIDERS	32

static const struct sv_provider_ops *sv_providers[SV_MAX_PROVIDERS];
static int sv_nproviders;
static pthread_mutex_t sv_providers_lock = PTHREAD_MUTEX_INITIALIZER;

/* rdma-core: a provider library's constructor registers its ops table.
 * Registration only records it: matching happens against sysfs devices of
 * the provider's kernel driver, and softverbs' devices have none. */
SV_EXPORT void verbs_register_driver_34(const struct sv_provider_ops *ops)
{
	pthread_mutex_lock(&sv_providers_lock);
	if (sv_nproviders < SV_MAX_PROVIDERS)
		sv_providers[sv_nproviders++] = ops;
	pthread_mutex_unlock(&sv_providers_lock);
	sv_debug("softverbs: provider %s registered; it matches no softverbs "
		 "device\n", ops && ops->name ? ops->name : "?");
}

/* Set by providers' tests in rdma-core; read by nobody here. */
SV_EXPORT bool verbs_allow_disassociate_destroy;

/*
 * Opening a device with provider-private attributes (mlx5dv_open_device
 * after its own is_mlx5_dev check).  softverbs' devices take no provider
 * attributes.
 */
SV_EXPORT struct ibv_context *verbs_open_device(struct ibv_device *device,
						void *private_data)
{
	if (!sv_is_device(device) || private_data) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	return ibv_open_device(device);
}

/* A provider's alloc_context: only called for a matched device. */
SV_EXPORT void *_verbs_init_and_alloc_context(struct ibv_device *device,
					      int cmd_fd, size_t alloc_size,
					      struct verbs_context *context_offset,
					      uint32_t driver_id)
{
	(void)device; (void)alloc_size; (void)context_offset; (void)driver_id;
	(void)cmd_fd;
	errno = EOPNOTSUPP;
	return NULL;
}

/* These three work on a provider's own context, which it can only get from
 * _verbs_init_and_alloc_context above: there is none to act on. */
SV_EXPORT void verbs_uninit_context(struct verbs_context *context)
{
	(void)context;
}

SV_EXPORT void verbs_set_ops(struct verbs_context *vctx, const void *ops)
{
	(void)vctx; (void)ops;
}

SV_EXPORT void verbs_init_cq(struct ibv_cq *cq, struct ibv_context *context,
			     struct ibv_comp_channel *channel, void *cq_context)
{
	(void)cq; (void)context; (void)channel; (void)cq_context;
}

/* Provider log lines, shown like rdma-core's at VERBS_LOG_LEVEL >= level
 * (1 error ... 4 debug). */
SV_EXPORT void __verbs_log(struct verbs_context *ctx, uint32_t level,
			   const char *fmt, ...)
{
	const char *env = getenv("VERBS_LOG_LEVEL");
	va_list ap;

	(void)ctx;
	if (!env || level > strtoul(env, NULL, 0))
		return;
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
}

/* Kernel command buffers: softverbs has no uverbs char device.  Links only
 * exist in provider commands, which execute_ioctl refuses. */
SV_EXPORT unsigned int __ioctl_final_num_attrs(unsigned int num_attrs,
					       void *link)
{
	(void)link;
	return num_attrs;
}

SV_EXPORT int execute_ioctl(struct ibv_context *context, void *cmd)
{
	(void)context; (void)cmd;
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

/*
 * ibv_cmd_*: the kernel command wrappers providers build their verbs on.
 * Each returns an errno value like rdma-core's.  Their arguments are never
 * looked at, so each is defined without parameters; the x86-64 and aarch64
 * calling conventions make that safe for callers passing any.
 */
#define SV_NO_KERNEL_CMD(name)				\
	SV_EXPORT int name(void);			\
	int name(void)					\
	{						\
		errno = EOPNOTSUPP;			\
		return EOPNOTSUPP;			\
	}

SV_NO_KERNEL_CMD(ibv_cmd_advise_mr)
SV_NO_KERNEL_CMD(ibv_cmd_alloc_dm)
SV_NO_KERNEL_CMD(ibv_cmd_alloc_mw)
SV_NO_KERNEL_CMD(ibv_cmd_alloc_pd)
SV_NO_KERNEL_CMD(ibv_cmd_attach_mcast)
SV_NO_KERNEL_CMD(ibv_cmd_close_xrcd)
SV_NO_KERNEL_CMD(ibv_cmd_create_ah)
SV_NO_KERNEL_CMD(ibv_cmd_create_counters)
SV_NO_KERNEL_CMD(ibv_cmd_create_cq)
SV_NO_KERNEL_CMD(ibv_cmd_create_cq_ex)
SV_NO_KERNEL_CMD(ibv_cmd_create_flow)
SV_NO_KERNEL_CMD(ibv_cmd_create_flow_action_esp)
SV_NO_KERNEL_CMD(ibv_cmd_create_qp)
SV_NO_KERNEL_CMD(ibv_cmd_create_qp_ex)
SV_NO_KERNEL_CMD(ibv_cmd_create_qp_ex2)
SV_NO_KERNEL_CMD(ibv_cmd_create_rwq_ind_table)
SV_NO_KERNEL_CMD(ibv_cmd_create_srq)
SV_NO_KERNEL_CMD(ibv_cmd_create_srq_ex)
SV_NO_KERNEL_CMD(ibv_cmd_create_wq)
SV_NO_KERNEL_CMD(ibv_cmd_dealloc_mw)
SV_NO_KERNEL_CMD(ibv_cmd_dealloc_pd)
SV_NO_KERNEL_CMD(ibv_cmd_dereg_mr)
SV_NO_KERNEL_CMD(ibv_cmd_destroy_ah)
SV_NO_KERNEL_CMD(ibv_cmd_destroy_counters)
SV_NO_KERNEL_CMD(ibv_cmd_destroy_cq)
SV_NO_KERNEL_CMD(ibv_cmd_destroy_flow)
SV_NO_KERNEL_CMD(ibv_cmd_destroy_flow_action)
SV_NO_KERNEL_CMD(ibv_cmd_destroy_qp)
SV_NO_KERNEL_CMD(ibv_cmd_destroy_rwq_ind_table)
SV_NO_KERNEL_CMD(ibv_cmd_destroy_srq)
SV_NO_KERNEL_CMD(ibv_cmd_destroy_wq)
SV_NO_KERNEL_CMD(ibv_cmd_detach_mcast)
SV_NO_KERNEL_CMD(ibv_cmd_free_dm)
SV_NO_KERNEL_CMD(ibv_cmd_get_context)
SV_NO_KERNEL_CMD(ibv_cmd_modify_cq)
SV_NO_KERNEL_CMD(ibv_cmd_modify_flow_action_esp)
SV_NO_KERNEL_CMD(ibv_cmd_modify_qp)
SV_NO_KERNEL_CMD(ibv_cmd_modify_qp_ex)
SV_NO_KERNEL_CMD(ibv_cmd_modify_srq)
SV_NO_KERNEL_CMD(ibv_cmd_modify_wq)
SV_NO_KERNEL_CMD(ibv_cmd_open_qp)
SV_NO_KERNEL_CMD(ibv_cmd_open_xrcd)
SV_NO_KERNEL_CMD(ibv_cmd_poll_cq)
SV_NO_KERNEL_CMD(ibv_cmd_post_recv)
SV_NO_KERNEL_CMD(ibv_cmd_post_send)
SV_NO_KERNEL_CMD(ibv_cmd_post_srq_recv)
SV_NO_KERNEL_CMD(ibv_cmd_query_context)
SV_NO_KERNEL_CMD(ibv_cmd_query_device_any)
SV_NO_KERNEL_CMD(ibv_cmd_query_mr)
SV_NO_KERNEL_CMD(ibv_cmd_query_port)
SV_NO_KERNEL_CMD(ibv_cmd_query_qp)
SV_NO_KERNEL_CMD(ibv_cmd_query_srq)
SV_NO_KERNEL_CMD(ibv_cmd_read_counters)
SV_NO_KERNEL_CMD(ibv_cmd_reg_dm_mr)
SV_NO_KERNEL_CMD(ibv_cmd_reg_dmabuf_mr)
SV_NO_KERNEL_CMD(ibv_cmd_reg_mr)
SV_NO_KERNEL_CMD(ibv_cmd_req_notify_cq)
SV_NO_KERNEL_CMD(ibv_cmd_rereg_mr)
SV_NO_KERNEL_CMD(ibv_cmd_resize_cq)
