/*
 * softverbs: configuration, device enumeration, adapter incarnations,
 * open/close and the query verbs.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_proc.h"
#include "sv.h"

struct sv_config sv_cfg;
static struct sv_device sv_devices[SV_MAX_DEVICES];
static pthread_once_t sv_once = PTHREAD_ONCE_INIT;

uint64_t sv_mix64(uint64_t x)
{
	/* splitmix64 finalizer: cheap, well distributed */
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

uint64_t sv_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static uint64_t hash_str(const char *s)
{
	uint64_t h = 1469598103934665603ull;	/* FNV-1a */

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

static void add_device_name(const char *name)
{
	if (sv_cfg.ndev >= SV_MAX_DEVICES || !*name)
		return;
	snprintf(sv_cfg.names[sv_cfg.ndev++], IBV_SYSFS_NAME_MAX, "%s", name);
}

static void parse_device_list(const char *list)
{
	char buf[512], *tok, *save;

	snprintf(buf, sizeof(buf), "%s", list);
	sv_cfg.ndev = 0;
	for (tok = strtok_r(buf, ", []\t", &save); tok;
	     tok = strtok_r(NULL, ", []\t", &save))
		add_device_name(tok);
}

static char *strip(char *s)
{
	char *e;

	while (isspace((unsigned char)*s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = 0;
	/* drop surrounding quotes */
	if (e - s >= 2 && (*s == '"' || *s == '\'') && e[-1] == *s) {
		e[-1] = 0;
		s++;
	}
	return s;
}

/*
 * A deliberately small YAML subset:
 *   dir: /path          seed: 42
 *   devices: [sv0, sv1]   or   devices:\n  - sv0\n  - name: sv1
 */
static void parse_yaml(const char *path)
{
	char line[512];
	bool in_devices = false;
	FILE *f = fopen(path, "r");

	if (!f) {
		fprintf(stderr, "softverbs: cannot open SOFTVERBS_CONFIG %s: %m\n",
			path);
		return;
	}
	while (fgets(line, sizeof(line), f)) {
		char *hash = strchr(line, '#'), *s, *colon;

		if (hash)
			*hash = 0;
		s = strip(line);
		if (!*s)
			continue;
		if (in_devices && *s == '-') {
			s = strip(s + 1);
			if (!strncmp(s, "name:", 5))
				s = strip(s + 5);
			add_device_name(s);
			continue;
		}
		in_devices = false;
		colon = strchr(s, ':');
		if (!colon)
			continue;
		*colon = 0;
		char *key = strip(s), *val = strip(colon + 1);

		if (!strcmp(key, "devices")) {
			sv_cfg.ndev = 0;
			if (*val)
				parse_device_list(val);
			else
				in_devices = true;
		} else if (!strcmp(key, "seed") && *val) {
			sv_cfg.have_seed = true;
			sv_cfg.seed = strtoull(val, NULL, 0);
		} else if (!strcmp(key, "dir") && *val) {
			snprintf(sv_cfg.dir, sizeof(sv_cfg.dir), "%s", val);
		}
	}
	fclose(f);
}

/* The host's address names the device (GUID, GID): prefer the address of
 * the host name, then any non-loopback interface, then loopback. */
static uint32_t host_ipv4(void)
{
	struct addrinfo hints = { .ai_family = AF_INET }, *res;
	struct ifaddrs *ifa, *i;
	char host[256];
	uint32_t ip = htonl(INADDR_LOOPBACK);

	if (!gethostname(host, sizeof(host)) &&
	    !getaddrinfo(host, NULL, &hints, &res)) {
		ip = ((struct sockaddr_in *)res->ai_addr)->sin_addr.s_addr;
		freeaddrinfo(res);
		if (ip != htonl(INADDR_LOOPBACK) && (ntohl(ip) >> 24) != 127)
			return ip;
	}
	if (getifaddrs(&ifa))
		return ip;
	for (i = ifa; i; i = i->ifa_next) {
		if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET ||
		    (i->ifa_flags & IFF_LOOPBACK))
			continue;
		ip = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
		break;
	}
	freeifaddrs(ifa);
	return ip;
}

static void mkdirs(const char *path)
{
	char buf[256], *p;

	snprintf(buf, sizeof(buf), "%s", path);
	for (p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		mkdir(buf, 0700);
		*p = '/';
	}
	mkdir(buf, 0700);
}

static void write_attr_file(const char *dir, const char *name, const char *val)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "w");
	if (f) {
		fputs(val, f);
		fclose(f);
	}
}

static void init_device(int i)
{
	struct sv_device *d = &sv_devices[i];
	uint32_t ip = ntohl(sv_cfg.ipv4);
	char val[64];

	d->index = i;
	d->ops = &sv_provider_ops;
	/* 02:53:56 ("SV", locally administered), device index, IPv4 */
	d->node_guid = (0x025356ull << 40) | ((uint64_t)(i & 0xff) << 32) | ip;
	d->ibdev.node_type = IBV_NODE_CA;
	d->ibdev.transport_type = IBV_TRANSPORT_IB;
	snprintf(d->ibdev.name, sizeof(d->ibdev.name), "%s", sv_cfg.names[i]);
	snprintf(d->ibdev.dev_name, sizeof(d->ibdev.dev_name), "uverbs%d", i);
	/* A tiny sysfs look-alike, laid out as /sys is (ibv_get_sysfs_path()
	 * names its root), so ibv_read_sysfs_file() users find the usual
	 * attribute files and Open MPI finds class/infiniband. */
	snprintf(d->ibdev.ibdev_path, sizeof(d->ibdev.ibdev_path),
		 "%.180s/sysfs/class/infiniband/%.40s", sv_cfg.dir, sv_cfg.names[i]);
	snprintf(d->ibdev.dev_path, sizeof(d->ibdev.dev_path),
		 "%.180s/sysfs/class/infiniband_verbs/uverbs%d", sv_cfg.dir, i);
	mkdirs(d->ibdev.ibdev_path);
	mkdirs(d->ibdev.dev_path);
	write_attr_file(d->ibdev.ibdev_path, "node_type", "1: CA\n");
	write_attr_file(d->ibdev.ibdev_path, "board_id", "SOFTVERBS_0001\n");
	write_attr_file(d->ibdev.ibdev_path, "fw_ver", "1.0.0\n");
	snprintf(val, sizeof(val), "%04x:%04x:%04x:%04x\n",
		 (unsigned)(d->node_guid >> 48) & 0xffff,
		 (unsigned)(d->node_guid >> 32) & 0xffff,
		 (unsigned)(d->node_guid >> 16) & 0xffff,
		 (unsigned)d->node_guid & 0xffff);
	write_attr_file(d->ibdev.ibdev_path, "node_guid", val);
	write_attr_file(d->ibdev.dev_path, "ibdev", d->ibdev.name);
	write_attr_file(d->ibdev.dev_path, "abi_version", "1\n");
}

static void config_once(void)
{
	char path[300];
	const char *v;

	add_device_name("sv0");
	v = getenv("SOFTVERBS_CONFIG");
	if (v && *v)
		parse_yaml(v);
	v = getenv("SOFTVERBS_DEVICES");
	if (v && *v)
		parse_device_list(v);
	v = getenv("SOFTVERBS_SEED");
	if (v && *v) {
		sv_cfg.have_seed = true;
		sv_cfg.seed = strtoull(v, NULL, 0);
	}
	v = getenv("SOFTVERBS_DIR");
	if (v && *v)
		snprintf(sv_cfg.dir, sizeof(sv_cfg.dir), "%s", v);
	if (!sv_cfg.dir[0]) {
		v = getenv("XDG_RUNTIME_DIR");
		if (v && *v)
			snprintf(sv_cfg.dir, sizeof(sv_cfg.dir),
				 "%s/softverbs", v);
		else
			snprintf(sv_cfg.dir, sizeof(sv_cfg.dir),
				 "/tmp/softverbs-%u", (unsigned)getuid());
	}
	mkdirs(sv_cfg.dir);
	sv_cfg.fabric = hash_str(sv_cfg.dir) & 0xffffffffffffull;
	v = getenv("SOFTVERBS_ADDR");
	if (!v || inet_pton(AF_INET, v, &sv_cfg.ipv4) != 1)
		sv_cfg.ipv4 = host_ipv4();
	inet_ntop(AF_INET, &sv_cfg.ipv4, sv_cfg.host, sizeof(sv_cfg.host));
	snprintf(path, sizeof(path), "%s/qp", sv_cfg.dir);
	mkdir(path, 0700);
	for (int i = 0; i < sv_cfg.ndev; i++)
		init_device(i);
}

void sv_config_load(void)
{
	pthread_once(&sv_once, config_once);
}

/* ---- adapter incarnations ---- */

#define SV_STATE_MAGIC	0x3174617473767321ull
#define SV_STATE_PIDS	1024

struct sv_state_pid {
	int32_t pid;
	uint32_t pad;
	uint64_t start;			/* /proc start time: guards pid reuse */
};

struct sv_state_file {
	uint64_t magic;
	uint64_t number;		/* incarnation counter */
	uint64_t key;
	uint32_t lid;
	uint32_t qpn_counter;
	uint32_t npids;
	uint32_t pad;
	struct sv_state_pid pids[SV_STATE_PIDS];
};

static uint64_t proc_start_time(pid_t pid)
{
	struct ckpt_proc_stat st;

	return ckpt_stat_read_pid(pid, &st) || st.last_field < 22 ? 0 : st.starttime;
}

static bool pid_alive(const struct sv_state_pid *e)
{
	if (kill(e->pid, 0) && errno == ESRCH)
		return false;
	return proc_start_time(e->pid) == e->start;
}

static int state_open_locked(const struct sv_device *dev)
{
	char path[512];
	int fd;

	snprintf(path, sizeof(path), "%s/%s@%s.state", sv_cfg.dir,
		 dev->ibdev.name, sv_cfg.host);
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	if (flock(fd, LOCK_EX)) {
		close(fd);
		return -1;
	}
	return fd;
}

static void state_read(int fd, struct sv_state_file *st)
{
	memset(st, 0, sizeof(*st));
	if (pread(fd, st, sizeof(*st), 0) != sizeof(*st) ||
	    st->magic != SV_STATE_MAGIC) {
		memset(st, 0, sizeof(*st));
		st->magic = SV_STATE_MAGIC;
	}
}

static int state_write(int fd, const struct sv_state_file *st)
{
	return pwrite(fd, st, sizeof(*st), 0) == sizeof(*st) ? 0 : -1;
}

/* Is the LID taken by any other device of the fabric (every state file in
 * the dir: other devices of this host, and other hosts sharing the dir)? */
static bool lid_in_use_elsewhere(const struct sv_device *self, uint16_t lid)
{
	char mine[300];
	struct dirent *e;
	bool used = false;
	DIR *d = opendir(sv_cfg.dir);

	if (!d)
		return false;
	snprintf(mine, sizeof(mine), "%s@%s.state", self->ibdev.name,
		 sv_cfg.host);
	while (!used && (e = readdir(d))) {
		struct sv_state_file st;
		size_t n = strlen(e->d_name);
		int fd;

		if (n < 6 || strcmp(e->d_name + n - 6, ".state") ||
		    !strcmp(e->d_name, mine))
			continue;
		fd = openat(dirfd(d), e->d_name, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		state_read(fd, &st);
		close(fd);
		used = st.lid == lid;
	}
	closedir(d);
	return used;
}

/* Registry entries of a finished incarnation are garbage. */
static void forget_routes(uint16_t lid)
{
	char dir[300], prefix[16];
	struct dirent *e;
	DIR *d;

	if (!lid)
		return;
	snprintf(dir, sizeof(dir), "%s/qp", sv_cfg.dir);
	snprintf(prefix, sizeof(prefix), "%04x.", lid);
	d = opendir(dir);
	if (!d)
		return;
	while ((e = readdir(d)))
		if (!strncmp(e->d_name, prefix, strlen(prefix)))
			unlinkat(dirfd(d), e->d_name, 0);
	closedir(d);
}

static void new_incarnation(const struct sv_device *dev,
			    struct sv_state_file *st)
{
	uint64_t r;

	forget_routes((uint16_t)st->lid);
	st->number++;
	if (sv_cfg.have_seed)
		st->key = sv_mix64(sv_cfg.seed ^ sv_mix64(st->number) ^
				   hash_str(dev->ibdev.name));
	else if (getrandom(&r, sizeof(r), 0) == sizeof(r))
		st->key = r;
	else
		st->key = sv_mix64(sv_now_ns() ^ getpid());
	st->qpn_counter = 0;
	/* unicast LIDs are 0x0001-0xbfff */
	for (uint64_t k = st->key;; k = sv_mix64(k)) {
		st->lid = 1 + (uint32_t)(sv_mix64(k) % 0xbfff);
		if (!lid_in_use_elsewhere(dev, st->lid))
			break;
	}
}

/*
 * Join the device's current incarnation, starting a new one (fresh LID and
 * QPN sequence, like a power-cycled HCA) if no live process is using the
 * device.  Processes of one job that overlap in time therefore agree.
 */
int sv_incarnation_join(struct sv_device *dev, struct sv_incarnation *inc)
{
	struct sv_state_file st;
	uint32_t live = 0;
	int fd = state_open_locked(dev);

	if (fd < 0)
		return errno;
	state_read(fd, &st);
	for (uint32_t i = 0; i < st.npids && i < SV_STATE_PIDS; i++)
		if (pid_alive(&st.pids[i]))
			st.pids[live++] = st.pids[i];
	st.npids = live;
	if (!live)
		new_incarnation(dev, &st);
	if (st.npids < SV_STATE_PIDS) {
		st.pids[st.npids].pid = getpid();
		st.pids[st.npids].start = proc_start_time(getpid());
		st.npids++;
	}
	inc->number = st.number;
	inc->key = st.key;
	inc->lid = st.lid;
	state_write(fd, &st);
	close(fd);		/* drops the lock */
	return 0;
}

void sv_incarnation_leave(struct sv_device *dev)
{
	struct sv_state_file st;
	int fd = state_open_locked(dev);
	pid_t me = getpid();

	if (fd < 0)
		return;
	state_read(fd, &st);
	/* remove one registration of this process (it may hold several) */
	for (uint32_t i = 0; i < st.npids && i < SV_STATE_PIDS; i++) {
		if (st.pids[i].pid != me)
			continue;
		st.pids[i] = st.pids[--st.npids];
		break;
	}
	state_write(fd, &st);
	close(fd);
}

/* Next QPN of the incarnation: a keyed permutation of a shared counter,
 * so numbers look random but never repeat within an incarnation. */
uint32_t sv_draw_qpn(struct sv_device *dev, const struct sv_incarnation *inc)
{
	struct sv_state_file st;
	uint32_t n, qpn;
	int fd = state_open_locked(dev);

	if (fd < 0)
		return 0;
	state_read(fd, &st);
	n = st.qpn_counter++;
	state_write(fd, &st);
	close(fd);
	/* avoid QP0/QP1 and the multicast QPN 0xffffff */
	qpn = (uint32_t)(sv_mix64(inc->key ^ sv_mix64(n)) % 0xfffffd) + 2;
	return qpn;
}

/* ---- device list ---- */

bool sv_is_device(const struct ibv_device *device)
{
	const struct sv_device *d = (const struct sv_device *)device;

	return d >= sv_devices && d < sv_devices + sv_cfg.ndev;
}

SV_EXPORT struct ibv_device **ibv_get_device_list(int *num)
{
	struct ibv_device **list;

	sv_config_load();
	list = calloc(sv_cfg.ndev + 1, sizeof(*list));
	if (!list) {
		errno = ENOMEM;
		return NULL;
	}
	for (int i = 0; i < sv_cfg.ndev; i++)
		list[i] = &sv_devices[i].ibdev;
	if (num)
		*num = sv_cfg.ndev;
	return list;
}

SV_EXPORT void ibv_free_device_list(struct ibv_device **list)
{
	free(list);
}

SV_EXPORT const char *ibv_get_device_name(struct ibv_device *device)
{
	return device->name;
}

SV_EXPORT __be64 ibv_get_device_guid(struct ibv_device *device)
{
	return htobe64(((struct sv_device *)device)->node_guid);
}

SV_EXPORT int ibv_get_device_index(struct ibv_device *device)
{
	return ((struct sv_device *)device)->index;
}

/* ---- query verbs ---- */

static int sv_query_device_attr(struct ibv_context *ibctx,
				struct ibv_device_attr *a)
{
	struct sv_device *dev = (struct sv_device *)ibctx->device;

	memset(a, 0, sizeof(*a));
	snprintf(a->fw_ver, sizeof(a->fw_ver), "1.0.0");
	a->node_guid = htobe64(dev->node_guid);
	a->sys_image_guid = htobe64(dev->node_guid);
	a->max_mr_size = UINT64_MAX;
	a->page_size_cap = 0xfffff000;
	a->vendor_id = 0x5356;		/* "SV" */
	a->vendor_part_id = 1;
	a->hw_ver = 1;
	a->max_qp = SV_MAX_QP;
	a->max_qp_wr = SV_MAX_QP_WR;
	a->device_cap_flags = IBV_DEVICE_PORT_ACTIVE_EVENT |
			      IBV_DEVICE_RC_RNR_NAK_GEN |
			      IBV_DEVICE_SRQ_RESIZE |
			      IBV_DEVICE_CHANGE_PHY_PORT;
	a->max_sge = SV_MAX_SGE;
	a->max_sge_rd = SV_MAX_SGE;
	a->max_cq = 1 << 16;
	a->max_cqe = SV_MAX_CQE;
	a->max_mr = SV_MAX_MR;
	a->max_pd = 1 << 16;
	a->max_qp_rd_atom = SV_MAX_RD_ATOMIC;
	a->max_qp_init_rd_atom = SV_MAX_RD_ATOMIC;
	a->max_res_rd_atom = SV_MAX_RD_ATOMIC * SV_MAX_QP;
	a->atomic_cap = IBV_ATOMIC_NONE;
	a->max_ah = 1 << 20;
	a->max_srq = 1 << 16;
	a->max_srq_wr = SV_MAX_QP_WR;
	a->max_srq_sge = SV_MAX_SGE;
	a->max_pkeys = 1;
	a->local_ca_ack_delay = 15;
	a->phys_port_cnt = 1;
	return 0;
}

SV_EXPORT int ibv_query_device(struct ibv_context *ctx,
			       struct ibv_device_attr *attr)
{
	return sv_query_device_attr(ctx, attr);
}

static int sv_query_device_ex(struct ibv_context *ctx,
			      const struct ibv_query_device_ex_input *input,
			      struct ibv_device_attr_ex *attr, size_t attr_size)
{
	(void)input;
	if (attr_size < sizeof(attr->orig_attr))
		return EINVAL;
	memset(attr, 0, attr_size);
	return sv_query_device_attr(ctx, &attr->orig_attr);
}

static void fill_port_attr(struct sv_context *ctx, struct ibv_port_attr *p)
{
	memset(p, 0, sizeof(*p));
	p->state = IBV_PORT_ACTIVE;
	p->max_mtu = IBV_MTU_4096;
	p->active_mtu = IBV_MTU_4096;
	p->gid_tbl_len = 1;
	p->port_cap_flags = IBV_PORT_CM_SUP;
	p->max_msg_sz = SV_MAX_MSG;
	p->bad_pkey_cntr = 0;
	p->qkey_viol_cntr = 0;
	p->pkey_tbl_len = 1;
	p->lid = ctx->inc.lid;
	p->sm_lid = ctx->inc.lid;
	p->lmc = 0;
	p->max_vl_num = 1;
	p->sm_sl = 0;
	p->subnet_timeout = 18;
	p->init_type_reply = 0;
	p->active_width = 2;		/* 4x */
	p->active_speed = 32;		/* EDR */
	p->phys_state = 5;		/* LinkUp */
	p->link_layer = IBV_LINK_LAYER_INFINIBAND;
	p->flags = 0;
}

static int sv_query_port_ex(struct ibv_context *ibctx, uint8_t port,
			    struct ibv_port_attr *attr, size_t len)
{
	struct ibv_port_attr full;

	if (port != 1)
		return EINVAL;
	fill_port_attr(to_sctx(ibctx), &full);
	memcpy(attr, &full, len < sizeof(full) ? len : sizeof(full));
	return 0;
}

/* The exported symbol receives the old, shorter struct layout from
 * binaries that have no extended context op; it is a prefix of the new. */
struct _compat_ibv_port_attr;
#undef ibv_query_port
SV_EXPORT int ibv_query_port(struct ibv_context *ctx, uint8_t port,
			     struct _compat_ibv_port_attr *attr)
{
	return sv_query_port_ex(ctx, port, (struct ibv_port_attr *)attr,
				offsetof(struct ibv_port_attr, link_layer) +
				sizeof(uint8_t));
}

static void port_gid(struct sv_context *ctx, union ibv_gid *gid)
{
	gid->global.subnet_prefix = htobe64(SV_SUBNET_PREFIX);
	gid->global.interface_id = htobe64(ctx->dev->node_guid);
}

SV_EXPORT int ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index,
			    union ibv_gid *gid)
{
	if (port != 1 || index != 0) {
		errno = EINVAL;
		return -1;
	}
	port_gid(to_sctx(ctx), gid);
	return 0;
}

SV_EXPORT int _ibv_query_gid_ex(struct ibv_context *ctx, uint32_t port,
				uint32_t index, struct ibv_gid_entry *entry,
				uint32_t flags, size_t entry_size)
{
	if (flags || entry_size < sizeof(*entry))
		return EINVAL;
	if (port != 1 || index != 0)
		return ENODATA;
	memset(entry, 0, sizeof(*entry));
	port_gid(to_sctx(ctx), &entry->gid);
	entry->gid_index = 0;
	entry->port_num = 1;
	entry->gid_type = IBV_GID_TYPE_IB;
	return 0;
}

SV_EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *ctx,
				       struct ibv_gid_entry *entries,
				       size_t max, uint32_t flags,
				       size_t entry_size)
{
	int ret;

	if (max < 1)
		return -EINVAL;
	ret = _ibv_query_gid_ex(ctx, 1, 0, entries, flags, entry_size);
	return ret ? -ret : 1;
}

/* enum ibv_gid_type_sysfs lives in the provider header; 0 = IB/RoCE v1 */
SV_EXPORT int ibv_query_gid_type(struct ibv_context *ctx, uint8_t port,
				 unsigned int index, int *type)
{
	(void)ctx;
	if (port != 1 || index != 0) {
		errno = EINVAL;
		return -1;
	}
	*type = 0;
	return 0;
}

SV_EXPORT int ibv_query_pkey(struct ibv_context *ctx, uint8_t port, int index,
			     __be16 *pkey)
{
	(void)ctx;
	if (port != 1 || index != 0) {
		errno = EINVAL;
		return -1;
	}
	*pkey = htobe16(0xffff);	/* default full-member partition */
	return 0;
}

SV_EXPORT int ibv_get_pkey_index(struct ibv_context *ctx, uint8_t port,
				 __be16 pkey)
{
	(void)ctx;
	if (port != 1 || (be16toh(pkey) & 0x7fff) != 0x7fff)
		return -1;
	return 0;
}

/* ---- open / close ---- */

static struct ibv_qp *sv_create_qp_ex_op(struct ibv_context *ctx,
					 struct ibv_qp_init_attr_ex *attr);

SV_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	struct sv_device *dev = (struct sv_device *)device;
	struct sv_context *ctx;
	struct ibv_context *ib;
	int err;

	sv_config_load();
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx) {
		errno = ENOMEM;
		return NULL;
	}
	ctx->dev = dev;
	err = sv_incarnation_join(dev, &ctx->inc);
	if (err)
		goto err_free;
	pthread_mutex_init(&ctx->lock, NULL);
	ctx->rxbuf_len = 256 + SV_PKT_PAYLOAD;
	ctx->rxbuf = malloc(ctx->rxbuf_len * SV_RX_BATCH);
	if (!ctx->rxbuf) {
		err = ENOMEM;
		goto err_leave;
	}

	ib = &ctx->vctx.context;
	ib->device = device;
	ib->ops.poll_cq = sv_poll_cq;
	ib->ops.req_notify_cq = sv_req_notify_cq;
	ib->ops.post_send = sv_post_send;
	ib->ops.post_recv = sv_post_recv;
	ib->ops.post_srq_recv = sv_post_srq_recv;
	ib->cmd_fd = -1;
	ib->async_fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
	ib->num_comp_vectors = 1;
	pthread_mutex_init(&ib->mutex, NULL);
	/* Mark the context extended so verbs.h inline helpers use the ops
	 * below; sz tells them which ops exist. */
	ib->abi_compat = __VERBS_ABI_IS_EXTENDED;
	ctx->vctx.sz = sizeof(struct verbs_context);
	ctx->vctx.query_port = sv_query_port_ex;
	ctx->vctx.query_device_ex = sv_query_device_ex;
	ctx->vctx.create_qp_ex = sv_create_qp_ex_op;
	if (ib->async_fd < 0) {
		err = errno;
		goto err_buf;
	}
	err = sv_progress_start(ctx);
	if (err)
		goto err_fd;
	return ib;

err_fd:
	close(ib->async_fd);
err_buf:
	free(ctx->rxbuf);
err_leave:
	sv_incarnation_leave(dev);
err_free:
	free(ctx);
	errno = err;
	return NULL;
}

/* SOFTVERBS_DEBUG=1: to stderr; =<path>: appended to that file, opened
 * anew each time (a restarted process's stderr may be anywhere). */
void sv_debug(const char *fmt, ...)
{
	const char *dest = getenv("SOFTVERBS_DEBUG");
	FILE *f = stderr;
	va_list ap;

	if (!dest || !*dest)
		return;
	if (strchr(dest, '/') && !(f = fopen(dest, "ae")))
		return;
	va_start(ap, fmt);
	vfprintf(f, fmt, ap);
	va_end(ap);
	if (f != stderr)
		fclose(f);
}

SV_EXPORT int ibv_close_device(struct ibv_context *ibctx)
{
	struct sv_context *ctx = to_sctx(ibctx);

	sv_progress_stop(ctx);
	sv_debug("softverbs %s pid %d: timeouts %llu rnr_naks %llu "
		 "dup_reqs %llu ooo_drops %llu state_drops %llu "
		 "rc_wrs %llu rc_bytes %llu uc_wrs %llu uc_bytes %llu "
		 "ud_wrs %llu ud_bytes %llu\n",
		 ctx->dev->ibdev.name, (int)getpid(),
		 (unsigned long long)ctx->stats.timeouts,
		 (unsigned long long)ctx->stats.rnr_naks,
		 (unsigned long long)ctx->stats.dup_reqs,
		 (unsigned long long)ctx->stats.ooo_drops,
		 (unsigned long long)ctx->stats.state_drops,
		 (unsigned long long)ctx->stats.rc_wrs,
		 (unsigned long long)ctx->stats.rc_bytes,
		 (unsigned long long)ctx->stats.uc_wrs,
		 (unsigned long long)ctx->stats.uc_bytes,
		 (unsigned long long)ctx->stats.ud_wrs,
		 (unsigned long long)ctx->stats.ud_bytes);
	close(ibctx->async_fd);
	sv_incarnation_leave(ctx->dev);
	free(ctx->mrs);
	free(ctx->routes);
	free(ctx->aq);
	free(ctx->rxbuf);
	free(ctx);
	return 0;
}

static struct ibv_qp *sv_create_qp_ex_op(struct ibv_context *ibctx,
					 struct ibv_qp_init_attr_ex *ax)
{
	struct ibv_qp_init_attr a = {
		.qp_context = ax->qp_context,
		.send_cq = ax->send_cq,
		.recv_cq = ax->recv_cq,
		.srq = ax->srq,
		.cap = ax->cap,
		.qp_type = ax->qp_type,
		.sq_sig_all = ax->sq_sig_all,
	};
	struct ibv_qp *qp;

	(void)ibctx;
	/* Only the classic attributes are supported: no new-style send ops,
	 * XRC, RSS or creation flags. */
	if (!(ax->comp_mask & IBV_QP_INIT_ATTR_PD) ||
	    (ax->comp_mask & ~IBV_QP_INIT_ATTR_PD) || ax->create_flags) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	qp = ibv_create_qp(ax->pd, &a);
	if (qp)
		ax->cap = a.cap;
	return qp;
}
