/*
 * Virtual ids and their real values now.  A virtual id is the real id the
 * object had when it was created; the job's processes publish, at every
 * rebuild, what their virtual ids are now, under keys of that rebuild's
 * epoch (docs/IB.md lists the keys).  Peers' ids are looked up on first
 * use and cached until the next rebuild.  Until the job's first rebuild
 * (remap == 0) every id is its own real value.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>
#include "ib.h"

struct ib_ids ib_ids = {
	.qp_by_real = IB_IDMAP_INIT,
	.lkeys = IB_IDMAP_INIT,
	.remote_qpn = IB_IDMAP_INIT,
	.remote_lid = IB_IDMAP_INIT,
	.back = IB_IDMAP_INIT,
	.gid_lock = PTHREAD_MUTEX_INITIALIZER,
};

/* Values are stored +1 so that a real id 0 is not the empty slot. */
static int cached(struct ib_idmap *map, uint64_t key, uint64_t *value)
{
	uint64_t v;

	if (!ib_idmap_get(map, key + 1, &v))
		return 0;
	*value = v;
	return 1;
}

static void cache(struct ib_idmap *map, uint64_t key, uint64_t value)
{
	ib_idmap_put(map, key + 1, value);
}

/* "ib:<epoch>:<what>" into key; 0 if the name service has it. */
static int lookup(char *value, size_t size, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int lookup(char *value, size_t size, const char *fmt, ...)
{
	char key[160], what[128];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	snprintf(key, sizeof(key), "ib:%u:%s", ib_ids.epoch, what);
	return ib_kv_get(key, value, size);
}

uint32_t ib_real_qpn(uint32_t vqpn)
{
	char value[128];
	unsigned lid, qpn;
	uint64_t v;

	if (!atomic_load_explicit(&ib_ids.remap, memory_order_relaxed))
		return vqpn;
	if (cached(&ib_ids.remote_qpn, vqpn, &v))
		return (uint32_t)v;
	if (lookup(value, sizeof(value), "qp:%u", vqpn) == 0 &&
	    sscanf(value, "%u.%u", &lid, &qpn) == 2)
		v = qpn;
	else
		v = vqpn;		/* not a QP of the job: its id is real */
	cache(&ib_ids.remote_qpn, vqpn, v);
	ib_debug("remote QP %#x is %#x", vqpn, (unsigned)v);
	return (uint32_t)v;
}

uint16_t ib_real_lid(uint16_t vlid)
{
	char value[64];
	uint64_t v;

	if (!atomic_load_explicit(&ib_ids.remap, memory_order_relaxed))
		return vlid;
	if (cached(&ib_ids.remote_lid, vlid, &v))
		return (uint16_t)v;
	v = vlid;
	if (lookup(value, sizeof(value), "lid:%u", vlid) == 0)
		v = strtoul(value, NULL, 10);
	cache(&ib_ids.remote_lid, vlid, v);
	return (uint16_t)v;
}

static void gid_hex(const union ibv_gid *gid, char *out)
{
	for (int i = 0; i < 16; i++)
		sprintf(out + 2 * i, "%02x", gid->raw[i]);
}

/*
 * GIDs: a port's GID 0 as it was when the context was opened is the
 * virtual one; each rebuild publishes what it is now.  A few GIDs per
 * job, so a small table under a lock, both ways.
 */
static int gid_cached(const union ibv_gid *from, union ibv_gid *table_from,
		      union ibv_gid *table_to, union ibv_gid *to)
{
	int hit = 0;

	pthread_mutex_lock(&ib_ids.gid_lock);
	for (unsigned i = 0; i < ib_ids.ngids && !hit; i++)
		if (!memcmp(&table_from[i], from, sizeof(*from))) {
			*to = table_to[i];
			hit = 1;
		}
	pthread_mutex_unlock(&ib_ids.gid_lock);
	return hit;
}

static void gid_cache(const union ibv_gid *vgid, const union ibv_gid *gid)
{
	pthread_mutex_lock(&ib_ids.gid_lock);
	if (ib_ids.ngids < sizeof(ib_ids.gid_virtual) / sizeof(ib_ids.gid_virtual[0])) {
		ib_ids.gid_virtual[ib_ids.ngids] = *vgid;
		ib_ids.gid_real[ib_ids.ngids++] = *gid;
	}
	pthread_mutex_unlock(&ib_ids.gid_lock);
}

static void parse_gid(const char *hex, union ibv_gid *gid)
{
	for (int i = 0; i < 16 && hex[2 * i] && hex[2 * i + 1]; i++) {
		char byte[3] = { hex[2 * i], hex[2 * i + 1], 0 };

		gid->raw[i] = (uint8_t)strtoul(byte, NULL, 16);
	}
}

/* to_real: the application's GID to the real one now; else back. */
static void translate_gid(union ibv_gid *gid, int to_real)
{
	union ibv_gid *from = to_real ? ib_ids.gid_virtual : ib_ids.gid_real;
	union ibv_gid *to = to_real ? ib_ids.gid_real : ib_ids.gid_virtual;
	union ibv_gid out = *gid;
	char hex[40], value[64];

	if (!atomic_load_explicit(&ib_ids.remap, memory_order_relaxed))
		return;
	if (!gid_cached(gid, from, to, &out)) {
		gid_hex(gid, hex);
		if (lookup(value, sizeof(value), "%s:%s", to_real ? "gid" : "rgid", hex) == 0)
			parse_gid(value, &out);
		if (to_real)
			gid_cache(gid, &out);
		else
			gid_cache(&out, gid);
	}
	*gid = out;
}

void ib_real_gid(union ibv_gid *gid)
{
	translate_gid(gid, 1);
}

void ib_virtual_gid(union ibv_gid *gid)
{
	translate_gid(gid, 0);
}

/* An address vector the device must see. */
void ib_real_ah_attr(struct ibv_ah_attr *attr)
{
	attr->dlid = ib_real_lid(attr->dlid);
	if (attr->is_global)
		ib_real_gid(&attr->grh.dgid);
}

/*
 * A UD receive with a GRH: the 40 bytes at the start of the receive
 * buffer hold the real GIDs of both ends; the application must see the
 * virtual ones (it may make an AH from them).  Called before the receive
 * leaves the log: its first buffer is known.
 */
void ib_virtual_grh(struct ib_qp *qp, const struct ibv_wc *wc)
{
	const struct ib_recv *r = NULL;
	struct ibv_grh *grh;

	if (!(wc->wc_flags & IBV_WC_GRH) || !atomic_load(&ib_ids.remap))
		return;
	if (qp->init.srq) {
		struct ib_recv_log *log = &((struct ib_srq *)qp->init.srq)->posted;

		for (unsigned i = 0; i < ib_recv_log_count(log) && !r; i++)
			if (ib_recv_log_at(log, i)->wr_id == wc->wr_id)
				r = ib_recv_log_at(log, i);
	} else if (ib_recv_log_count(&qp->posted)) {
		r = ib_recv_log_at(&qp->posted, 0);
	}
	if (!r || r->num_sge < 1 || r->sge[0].length < sizeof(*grh))
		return;
	grh = (struct ibv_grh *)(uintptr_t)r->sge[0].addr;
	ib_virtual_gid(&grh->sgid);
	ib_virtual_gid(&grh->dgid);
}

/* A receive completion names its sender by real LID and QPN. */
void ib_virtual_source(uint16_t *slid, uint32_t *src_qp)
{
	uint64_t key = (uint64_t)*slid << 24 | (*src_qp & 0xffffff), v;
	char value[64];
	unsigned vlid, vqpn;

	if (!cached(&ib_ids.back, key, &v)) {
		v = key;
		if (lookup(value, sizeof(value), "src:%u.%u", *slid, *src_qp) == 0 &&
		    sscanf(value, "%u.%u", &vlid, &vqpn) == 2)
			v = (uint64_t)vlid << 24 | vqpn;
		cache(&ib_ids.back, key, v);
	}
	*slid = (uint16_t)(v >> 24);
	*src_qp = (uint32_t)(v & 0xffffff);
}

uint32_t ib_real_lkey(uint32_t vlkey)
{
	uint64_t v;

	if (!atomic_load_explicit(&ib_ids.remap, memory_order_relaxed) &&
	    !atomic_load_explicit(&ib_ids.lkeys_moved, memory_order_relaxed))
		return vlkey;
	return cached(&ib_ids.lkeys, vlkey, &v) ? (uint32_t)v : vlkey;
}

uint32_t ib_real_rkey(struct ib_qp *qp, uint32_t vrkey)
{
	char value[64];
	uint64_t v;

	if (!atomic_load_explicit(&ib_ids.remap, memory_order_relaxed) || !qp->peer_owner[0])
		return vrkey;
	if (cached(&qp->rkeys, vrkey, &v))
		return (uint32_t)v;
	v = vrkey;
	if (lookup(value, sizeof(value), "mr:%s:%u", qp->peer_owner, vrkey) == 0)
		v = strtoul(value, NULL, 10);
	cache(&qp->rkeys, vrkey, v);
	ib_debug("remote rkey %#x of %s is %#x", vrkey, qp->peer_owner, (unsigned)v);
	return (uint32_t)v;
}

static uint16_t port_lid(struct ib_ctx *ctx, uint8_t port, int real)
{
	if (port < 1 || port > ctx->nports)
		port = 1;
	return real ? ctx->lid[port] : ctx->vlid[port];
}

static uint8_t qp_port(struct ib_qp *qp)
{
	for (unsigned i = 0; i < qp->nhistory; i++)
		if (qp->history[i].mask & IBV_QP_PORT)
			return qp->history[i].attr.port_num;
	return 1;
}

int ib_publish_qp(struct ib_ctx *ctx, struct ib_qp *qp, struct ib_kv_batch *b)
{
	char key[96], value[128];
	uint8_t port = qp_port(qp);
	unsigned vlid = port_lid(ctx, port, 0), lid = port_lid(ctx, port, 1);

	snprintf(key, sizeof(key), "ib:%u:qp:%u", ib_ids.epoch, qp->ibv.qp_num);
	snprintf(value, sizeof(value), "%u.%u.%s", lid, qp->real->qp_num, ib_ids.owner);
	ib_kv_batch_put(b, key, value);
	snprintf(key, sizeof(key), "ib:%u:src:%u.%u", ib_ids.epoch, lid, qp->real->qp_num);
	snprintf(value, sizeof(value), "%u.%u", vlid, qp->ibv.qp_num);
	ib_kv_batch_put(b, key, value);
	snprintf(key, sizeof(key), "ib:%u:lid:%u", ib_ids.epoch, vlid);
	snprintf(value, sizeof(value), "%u", lid);
	ib_kv_batch_put(b, key, value);
	snprintf(key, sizeof(key), "ib:vqpn:%u", qp->ibv.qp_num);
	ib_kv_batch_put(b, key, ib_ids.owner);
	return b->err;
}

int ib_publish_gids(struct ib_ctx *ctx, struct ib_kv_batch *b)
{
	char key[96], vhex[40], hex[40];

	for (uint8_t p = 1; p <= ctx->nports; p++) {
		gid_hex(&ctx->vgid[p], vhex);
		gid_hex(&ctx->gid[p], hex);
		snprintf(key, sizeof(key), "ib:%u:gid:%s", ib_ids.epoch, vhex);
		ib_kv_batch_put(b, key, hex);
		snprintf(key, sizeof(key), "ib:%u:rgid:%s", ib_ids.epoch, hex);
		ib_kv_batch_put(b, key, vhex);
	}
	return b->err;
}

int ib_publish_mr(struct ib_mr *mr, struct ib_kv_batch *b)
{
	char key[128], value[32];

	snprintf(key, sizeof(key), "ib:%u:mr:%s:%u", ib_ids.epoch, ib_ids.owner, mr->ibv.rkey);
	snprintf(value, sizeof(value), "%u", mr->real->rkey);
	ib_kv_batch_put(b, key, value);
	return b->err;
}

/*
 * The virtual QPN of a new QP: its real QPN, unless another QP of the job
 * has that virtual number already (real numbers are reused by the new
 * adapters after a restart): then another, free one.
 */
uint32_t ib_claim_qpn(uint32_t real_qpn)
{
	char key[64];
	uint32_t vqpn = real_qpn;

	for (int tries = 0; tries < 64; tries++) {
		snprintf(key, sizeof(key), "ib:vqpn:%u", vqpn);
		if (ib_kv_claim(key, ib_ids.owner) != EEXIST)
			return vqpn;	/* ours, or no coordinator: nobody to collide with */
		if (getrandom(&vqpn, sizeof(vqpn), 0) != sizeof(vqpn))
			vqpn = (uint32_t)random();
		vqpn = (vqpn & 0xffffff) | 2;
	}
	return vqpn;
}

/* A process that opens a device after the job's first rebuild learns
 * which epoch the job's ids are in. */
void ib_ids_epoch_from_job(void)
{
	char value[32];

	if (!ib_ids.owner[0]) {
		char host[64];

		gethostname(host, sizeof(host));
		host[sizeof(host) - 1] = '\0';
		for (char *c = host; *c; c++)
			if (*c == ' ' || *c == ':' || *c == '.')
				*c = '-';
		snprintf(ib_ids.owner, sizeof(ib_ids.owner), "%s-%d", host, getpid());
	}
	if (!atomic_load(&ib_ids.remap) && ib_kv_get("ib:epoch", value, sizeof(value)) == 0) {
		ib_ids.epoch = strtoul(value, NULL, 10);
		atomic_store(&ib_ids.remap, 1);
	}
}
