/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz harness: the wire validator and the appliance's receive path (pbox_wire_decode,
 * pbox_wire_validate, pbox_engine_rx / pbox_engine_rx_iov) on a small simulated appliance.
 *
 * One input is one session from a fresh state: its first bytes choose the job (mode,
 * deterministic summing, synchronisation model, credits, 1..65 ranks, 1..2 cores,
 * fragment size, ranks without a cookie), then a sequence of events follows, each chosen
 * by one byte:
 *  - a structured datagram: the harness writes a header that passes validation (magic,
 *    version, job, the sender's cookie, chunk_len, a fragment on the grid, its CRC32C) and
 *    lets the input choose the type, flags (LAST ends a send round; a PULL may carry a
 *    fragment bitmap of the result it holds), sender, chunk, fragment, iteration (relative
 *    to the chunk's version, so the window logic is reached), payload and delivery (one
 *    buffer, or pieces split anywhere); a "corrupt" bit instead lets the input overwrite
 *    any field or byte, so near-valid headers reach every drop reason;
 *  - a raw datagram: bytes exactly as given;
 *  - membership changes (a rank leaves: pboxd's new table), a job abort.
 * A second job (aggregate, 2 ranks) is always in the table, so lookups and cross-job
 * cookies are exercised too. Job A has DVF (pushes may be blocks; its aggregates are
 * filtered and sent as blocks); job B has not (blocks are refused). A structured push may
 * carry its payload as a DVF block (bit 6 of its selector; one more byte chooses the
 * threshold, the codec and the index coding), which the corrupt bits then damage like
 * any other bytes, so malformed blocks reach the decoder.
 *
 * Invariants checked beyond the sanitizers: every datagram the engine sends passes the
 * worker's validation for the rank it is addressed to (a DVF result also its block
 * decoder); a header that decodes re-encodes
 * to the same 64 bytes and its payload lies inside the datagram; chunk versions never go
 * back; held pulls never exceed the ranks.
 */
#include <arpa/inet.h>
#include <errno.h>

#include "common/crc.h"
#include "common/log.h"
#include "dvf/dvf_job.h"
#include "engine/encoding.h"
#include "engine/engine.h"
#include "fuzz.h"
#include "harness.h"

#define NCORES_MAX 2
#define NRANKS_MAX 65
#define JOB_A      42
#define JOB_B      7
#define RANK_PORT  20000 /* rank r sends from port RANK_PORT + r */
#define ELSEWHERE  30000 /* or from ELSEWHERE + r (it moved, or someone spoofs it) */
#define MAX_DGRAM  (PBOX_WIRE_HDR_LEN + 1024)

struct fjob {
	struct pbox_jobdesc desc;
	struct pbox_job job;
	uint64_t cookies[NRANKS_MAX];
	uint64_t live[2];
};

struct fix {
	uint32_t ncores;
	struct fjob a, b;
	struct pbox_jobtab *tab;
	struct pbox_engine eng[NCORES_MAX];
	struct pbox_core_stats stats[NCORES_MAX];
	uint64_t queued[NCORES_MAX];
	uint32_t *last_version;       /* per (job A chunk): version seen last */
	struct pbox_dvf_scratch *dvf; /* encodes the harness's blocks, checks the results' */
};

static struct fix *g_fix; /* for the transport callbacks */
/* The DVF scratches (codec contexts: costly to make) outlive an input: the engines' and
 * the harness's own, handed from one input to the next (they hold no state between
 * calls). */
static struct pbox_enc_core *g_enc[NCORES_MAX];
static struct pbox_dvf_scratch *g_dvf;

/* ---- the transport: checks every reply ------------------------------------------------ */

static const struct fjob *job_by_id(const struct fix *x, uint32_t id)
{
	return id == JOB_A ? &x->a : (id == JOB_B ? &x->b : NULL);
}

static int tx_send(void *ctx, const struct pbox_peer *to, const struct pbox_wire_hdr *hdr,
		   const void *payload, uint32_t len)
{
	struct fix *x = g_fix;
	uint32_t core = (uint32_t)(uintptr_t)ctx;
	uint8_t buf[PBOX_WIRE_HDR_LEN + PBOX_WIRE_MAX_PAYLOAD];
	uint32_t rank = ntohs(to->port) % 10000; /* RANK_PORT + r or ELSEWHERE + r */
	struct pbox_wire_job wj;
	const struct fjob *j;
	struct pbox_msg m;
	enum pbox_drop_reason r;
	uint64_t cookie;

	FUZZ_CHECK(len <= PBOX_WIRE_MAX_PAYLOAD, "core %u sent a %u-byte payload", core, len);
	memcpy(buf, hdr, PBOX_WIRE_HDR_LEN);
	if (len != 0) {
		/* Read every payload byte: ASan reports a reply pointing outside chunk memory. */
		memcpy(buf + PBOX_WIRE_HDR_LEN, payload, len);
	}
	r = pbox_wire_decode(buf, PBOX_WIRE_HDR_LEN + len, &m);
	FUZZ_CHECK(r == PBOX_DROP_NONE, "core %u sent an undecodable reply: %s", core,
		   pbox_drop_reason_name(r));
	j = job_by_id(x, m.job);
	FUZZ_CHECK(j != NULL, "core %u replied for job %u", core, m.job);
	FUZZ_CHECK(rank < j->desc.nworkers, "core %u replied to port %u", core, ntohs(to->port));
	/* What the worker of that rank would check. A rank whose cookie was withdrawn (it
	 * left) may still be sent what was owed to it: with cookie 0, which no worker accepts,
	 * so only the cookie is checked then. */
	cookie = j->cookies[rank];
	FUZZ_CHECK(m.cookie == cookie, "job %u core %u: reply to rank %u with another cookie",
		   m.job, core, rank);
	wj = j->job.wire;
	wj.cookies = &cookie;
	wj.accepts_dvf = pbox_enc_job_filters_results(&j->job); /* as libpbox's node */
	r = cookie != 0 ? pbox_wire_check(&m, &wj, PBOX_ROLE_WORKER) : PBOX_DROP_NONE;
	FUZZ_CHECK(r == PBOX_DROP_NONE,
		   "job %u core %u: reply type %u to rank %u fails the "
		   "worker's check: %s",
		   m.job, core, m.type, rank, pbox_drop_reason_name(r));
	FUZZ_CHECK(m.chunk < j->desc.nchunks && j->desc.chunks[m.chunk].core == core,
		   "core %u answered for chunk %u of core %u", core, m.chunk,
		   j->desc.chunks[m.chunk].core);
	if (m.encoding == PBOX_ENC_DVF) {
		struct pbox_dvf_view v;
		enum pbox_dvf_reject why = PBOX_DVF_OK;
		uint32_t n = pbox_frag_len(&j->desc, j->desc.chunks[m.chunk].bytes,
					   m.frag_off / j->desc.frag_bytes) /
			     4;

		FUZZ_CHECK(pbox_dvf_decode(x->dvf, m.payload, m.frag_len, n, &v, &why) == 0 &&
				   v.n == n,
			   "job %u core %u: a result block the worker rejects: %s", m.job, core,
			   pbox_dvf_reject_name(why));
	}
	x->queued[core] += len != 0;
	return 0;
}

static uint64_t tx_queued(void *ctx)
{
	return g_fix->queued[(uintptr_t)ctx];
}

static uint64_t tx_reclaim(void *ctx, uint64_t upto)
{
	uint64_t q = g_fix->queued[(uintptr_t)ctx];

	FUZZ_CHECK(upto <= q, "reclaim of %llu datagrams, only %llu queued",
		   (unsigned long long)upto, (unsigned long long)q);
	return q;
}

static const struct pbox_tx_ops g_tx = {
	.send = tx_send,
	.flush = pbox_test_tx_flush,
	.queued = tx_queued,
	.reclaim = tx_reclaim,
};

/* ---- set-up ------------------------------------------------------------------------------ */

static void build_job(struct fjob *j, uint32_t id, uint32_t nranks, uint32_t ncores,
		      uint32_t frag_bytes, const struct pbox_keyspec *keys, uint32_t nkeys)
{
	char err[256];

	if (pbox_jobdesc_build(&j->desc, keys, nkeys, nranks, ncores, 256, frag_bytes, NULL, err,
			       sizeof(err)) != 0) {
		fprintf(stderr, "fuzz_engine: %s\n", err);
		abort();
	}
	for (uint32_t r = 0; r < nranks; r++) {
		j->cookies[r] = 0x1000 + (uint64_t)id * 65537 + r * 7919;
	}
	for (uint32_t r = 0; r < nranks; r++) {
		j->live[r / 64] |= 1ull << (r % 64);
	}
	j->job.wire.id = id;
	j->job.wire.desc = &j->desc;
	j->job.wire.cookies = j->cookies;
	j->job.live = j->live;
	j->job.nlive = nranks;
	j->job.generation = 1;
	j->job.abort_errno = ECONNABORTED;
}

/* The fuzzer's job A (from the input's first three bytes) and the fixed job B. */
static void setup(struct fix *x, struct fz *in)
{
	static const uint32_t rank_choices[4] = { 1, 2, 3, NRANKS_MAX };
	static const char *const opts[] = { "sgd", "momentum", "nag", "adam", "adamw" };
	static const struct pbox_keyspec keys_a[] = { { 3, 100 }, { 9, 16 } };
	static const struct pbox_keyspec keys_b[] = { { 0, 64 } };
	uint8_t c0 = fz_u8(in), c1 = fz_u8(in), c2 = fz_u8(in);
	struct pbox_job *a = &x->a.job, *b = &x->b.job;
	uint32_t nranks = rank_choices[c1 & 3];
	uint32_t frag = 64u << ((c1 >> 2) & 1); /* 64 or 128 bytes */

	x->ncores = 1 + ((c1 >> 3) & 1);
	build_job(&x->a, JOB_A, nranks, x->ncores, frag, keys_a, 2);
	a->mode = (c0 & 1) ? PBOX_MODE_SERVER_OPT : PBOX_MODE_AGGREGATE;
	a->wire.accepts_init = a->mode == PBOX_MODE_SERVER_OPT;
	a->deterministic = (c0 >> 1) & 1;
	pbox_sync_cfg_defaults(&a->sync_cfg, nranks);
	a->sync_cfg.model = (enum pbox_sync_model)(((c0 >> 2) & 7) % 6);
	a->sync_cfg.staleness = (c2 & 3);
	a->sync_cfg.quorum = 1 + (uint32_t)((c2 >> 2) & 3) % nranks;
	a->sync_cfg.eager = (c0 >> 5) & 1;
	a->sync_cfg.probability = 0.5;
	a->sync = pbox_sync_ops(a->sync_cfg.model);
	a->verify_crc = (c0 >> 6) & 1;
	a->reduce = (c0 >> 7) ? PBOX_REDUCE_MEAN : PBOX_REDUCE_SUM;
	/* As pboxd's configuration allows: models that fold late pushes take one credit. */
	a->credits = a->sync->folds_late ? 1 : 1 + ((c1 >> 4) & 1) + ((c1 >> 5) & 1);
	if (a->mode == PBOX_MODE_AGGREGATE && a->sync_cfg.eager) {
		/* Eager release is server-optimizer only: the bit picks a broadcast job, under
		 * bsp or ssp as pboxd allows. */
		a->mode = PBOX_MODE_BROADCAST;
		a->sync_cfg.eager = false;
		if (a->sync_cfg.model != PBOX_SYNC_BSP) {
			a->sync_cfg.model = PBOX_SYNC_SSP;
			a->sync = pbox_sync_ops(PBOX_SYNC_SSP);
			a->credits = 1 + ((c1 >> 4) & 1) + ((c1 >> 5) & 1);
		}
	}
	a->window = pbox_job_min_window(a->mode, a->sync, &a->sync_cfg, a->credits);
	a->window += (c2 >> 4) & 1;
	a->opt = pbox_optimizer_find(opts[((c2 >> 5) & 7) % 5]);
	a->opt_params = (struct pbox_opt_params){ .lr = 0.1f,
						  .momentum = 0.9f,
						  .wd = 1e-4f,
						  .rescale = 1.0f,
						  .clip = (c1 >> 6) & 1 ? 1.0f : 0.0f,
						  .beta1 = 0.9f,
						  .beta2 = 0.999f,
						  .eps = 1e-8f };
	if ((c1 >> 7) && nranks > 1) {
		/* A rank that never registered (pboxd publishes cookie 0 for it). */
		x->a.cookies[nranks - 1] = 0;
	}

	build_job(&x->b, JOB_B, 2, x->ncores, 64, keys_b, 1);
	b->mode = PBOX_MODE_AGGREGATE;
	pbox_sync_cfg_defaults(&b->sync_cfg, 2);
	b->sync = pbox_sync_ops(PBOX_SYNC_BSP);
	b->credits = 1;
	b->window = PBOX_DEFAULT_WINDOW;
	b->opt = pbox_optimizer_find("sgd");

	/* DVF on job A (thresholds that keep some of the harness's -3..3 values). */
	pbox_dvf_job_default(&a->dvf);
	a->dvf.params.delta_low = 1.0f;
	a->dvf.params.delta_up = 2.0f;
	a->dvf.link = (c2 & 1) ? PBOX_DVF_LINK_INSUFFICIENT : PBOX_DVF_LINK_SUFFICIENT;
	a->wire.accepts_dvf = true;
	if (g_dvf == NULL) {
		g_dvf = pbox_dvf_scratch_new(64);
	}
	x->dvf = g_dvf;
	FUZZ_CHECK(x->dvf != NULL, "dvf scratch");

	a->state = pbox_job_state_create(a);
	b->state = pbox_job_state_create(b);
	FUZZ_CHECK(a->state != NULL && b->state != NULL, "job state allocation failed");
	x->tab = calloc(1, sizeof(*x->tab) + 2 * sizeof(x->tab->jobs[0]));
	x->last_version = calloc(x->a.desc.nchunks, sizeof(*x->last_version));
	FUZZ_CHECK(x->tab != NULL && x->last_version != NULL, "out of memory");
	x->tab->generation = 1;
	x->tab->njobs = 2;
	x->tab->jobs[0] = b; /* sorted by id */
	x->tab->jobs[1] = a;
	for (uint32_t k = 0; k < x->ncores; k++) {
		x->eng[k].core = k;
		x->eng[k].kern = pbox_kernels_get();
		x->eng[k].tx = &g_tx;
		x->eng[k].tx_ctx = (void *)(uintptr_t)k;
		x->eng[k].stats = &x->stats[k];
		x->eng[k].enc = g_enc[k];
	}
}

static void teardown(struct fix *x)
{
	for (uint32_t k = 0; k < x->ncores; k++) {
		g_enc[k] = x->eng[k].enc; /* the next input's (see g_enc) */
	}
	pbox_job_state_free(x->a.job.state);
	pbox_job_state_free(x->b.job.state);
	pbox_jobdesc_free(&x->a.desc);
	pbox_jobdesc_free(&x->b.desc);
	free(x->tab);
	free(x->last_version);
}

/* ---- events ------------------------------------------------------------------------------ */

static const struct pbox_chunk_state *chunk_state(const struct fjob *j, uint32_t c)
{
	const struct pbox_chunk_desc *cd = &j->desc.chunks[c];

	return &j->job.state->core[cd->core].chunks[cd->local];
}

/* Check what decoding promises about a datagram that passed it. */
static void check_decode(const uint8_t *buf, size_t len)
{
	struct pbox_msg m;
	struct pbox_wire_hdr h;

	if (pbox_wire_decode(buf, len, &m) != PBOX_DROP_NONE) {
		return;
	}
	FUZZ_CHECK(m.frag_len == len - PBOX_WIRE_HDR_LEN, "frag_len %u in a %zu-byte datagram",
		   m.frag_len, len);
	FUZZ_CHECK(m.payload == NULL || ((const uint8_t *)m.payload == buf + PBOX_WIRE_HDR_LEN &&
					 (uint64_t)m.frag_off + m.frag_len <= m.chunk_len),
		   "payload outside the datagram or the chunk");
	pbox_wire_encode(&m, &h);
	FUZZ_CHECK(memcmp(&h, buf, PBOX_WIRE_HDR_LEN) == 0, "decode/encode is not the identity");
}

static void deliver(struct fix *x, struct fz *in, uint32_t core, const uint8_t *buf, size_t len,
		    const struct pbox_peer *from)
{
	struct pbox_engine *e = &x->eng[core];
	uint8_t mode = fz_u8(in);

	check_decode(buf, len);
	if ((mode & 3) != 3 || len == 0) {
		pbox_engine_rx(e, x->tab, buf, len, from);
	} else {
		/* In pieces, split where the input says (a DPDK multi-segment mbuf). */
		struct pbox_iov seg[4];
		unsigned nseg = 0;
		size_t off = 0;

		while (off < len && nseg < 3) {
			size_t piece = 1 + fz_below(in, 96);

			piece = PBOX_MIN(piece, len - off);
			seg[nseg].base = buf + off;
			seg[nseg++].len = (uint32_t)piece;
			off += piece;
		}
		if (off < len) {
			seg[nseg].base = buf + off;
			seg[nseg++].len = (uint32_t)(len - off);
		}
		pbox_engine_rx_iov(e, x->tab, seg, nseg, from);
	}
	if (mode & 4) {
		pbox_engine_flush(e);
	}
}

/* The sender field of a datagram's header (at least 16 bytes), as a rank for from_rank. */
static uint32_t header_sender(const uint8_t *buf)
{
	uint32_t sender = (uint32_t)buf[12] << 24 | (uint32_t)buf[13] << 16 |
			  (uint32_t)buf[14] << 8 | buf[15];

	return sender < 10000 ? sender : 0;
}

static void from_rank(struct pbox_peer *p, uint32_t rank, bool elsewhere)
{
	memset(p, 0, sizeof(*p));
	p->ip = htonl(0x7f000001);
	p->port = htons((uint16_t)((elsewhere ? ELSEWHERE : RANK_PORT) + rank));
}

/*
 * Re-encode the payload of m (dense floats at pay) as a DVF block when one is smaller:
 * one input byte gives the threshold (0..3: the values are mostly -3..3), the codec and
 * the index coding. The residual starts at zero for every block.
 */
static void dvf_payload(struct fix *x, struct fz *in, uint8_t *pay, struct pbox_msg *m)
{
	static const char *const codecs[4] = { "none", "lz4", "snappy", "zstd:1" };
	uint8_t dv = fz_u8(in);
	uint32_t n = m->frag_len / 4;
	float g[64], resid[64] = { 0 }, out[64];
	struct pbox_dvf_enc_cfg cfg;
	struct pbox_dvf_enc_info info;
	bool dense;
	int len;

	pbox_dvf_enc_cfg_default(&cfg);
	if (pbox_dvf_codec_parse(codecs[(dv >> 2) & 3], &cfg.codec, &cfg.level) != 0) {
		abort();
	}
	cfg.idx_mode = (enum pbox_dvf_idx_mode)(((dv >> 4) & 3) % 3);
	cfg.dense_bitmap = !((dv >> 6) & 1);
	memcpy(g, pay, m->frag_len);
	len = pbox_dvf_encode_frag(x->dvf, &cfg, pbox_dvf_kernels_get(), resid, g, n,
				   (float)(dv & 3), out, &dense, &info);
	if (len > 0 && !dense) {
		memcpy(pay, out, (size_t)len);
		m->encoding = PBOX_ENC_DVF;
		m->frag_len = (uint32_t)len;
	}
}

/* A datagram the harness keeps valid except where the input says otherwise. */
static void structured(struct fix *x, struct fz *in)
{
	static const uint8_t types[8] = { PBOX_MSG_PUSH, PBOX_MSG_PUSH, PBOX_MSG_PUSH,
					  PBOX_MSG_PULL, PBOX_MSG_PULL, PBOX_MSG_INIT,
					  PBOX_MSG_DATA, PBOX_MSG_ACK };
	uint8_t buf[MAX_DGRAM];
	uint8_t sel = fz_u8(in), bits = fz_u8(in);
	const struct fjob *j = (sel & 7) == 7 ? &x->b : &x->a;
	const struct pbox_jobdesc *d = &j->desc;
	struct pbox_msg m = { 0 };
	struct pbox_peer from;
	uint32_t c, f, core;
	int8_t delta;

	m.type = types[(sel >> 3) & 7];
	m.flags = (uint16_t)(fz_u8(in) & PBOX_F_ALL);
	if (m.type == PBOX_MSG_PUSH || m.type == PBOX_MSG_INIT) {
		m.flags &= (uint16_t)(PBOX_F_WANT_REPLY | PBOX_F_RETRANSMIT | PBOX_F_CRC |
				      PBOX_F_LAST);
		if (m.type == PBOX_MSG_INIT) {
			m.flags &= (uint16_t)~PBOX_F_WANT_REPLY;
		}
	} else if (m.type == PBOX_MSG_PULL) {
		m.flags &= PBOX_F_RETRANSMIT | PBOX_F_SACK;
	}
	m.job = j->job.wire.id;
	m.sender = fz_below(in, d->nworkers);
	m.cookie = j->cookies[m.sender];
	c = fz_below(in, d->nchunks);
	m.chunk = c;
	m.chunk_len = d->chunks[c].bytes;
	/* The iteration relative to the chunk's version: inside, just behind and just beyond
	 * the window. */
	delta = (int8_t)fz_u8(in);
	m.iter = chunk_state(j, c)->version + (uint32_t)(int32_t)(delta % 8);
	if (bits & 1) {
		m.iter = (uint32_t)(int32_t)delta; /* absolute: 0, small, or near UINT32_MAX */
	}
	m.seq = fz_u8(in);
	if (m.type == PBOX_MSG_PULL && (m.flags & PBOX_F_SACK)) {
		/* Which result fragments the worker holds: a base on the grid, a map within
		 * the chunk, the label they belong to (near the request). */
		uint32_t base = fz_below(in, d->chunks[c].nfrags);
		uint32_t left = d->chunks[c].nfrags - base;

		m.frag_off = base * d->frag_bytes;
		m.sack = fz_u64(in);
		if (left < PBOX_SACK_BITS) {
			m.sack &= (1ull << left) - 1;
		}
		m.arg0 = m.iter - (uint32_t)(fz_u8(in) % 3);
	}
	if (m.type == PBOX_MSG_PUSH || m.type == PBOX_MSG_INIT || m.type == PBOX_MSG_DATA) {
		f = fz_below(in, d->chunks[c].nfrags);
		m.encoding = PBOX_ENC_F32;
		m.frag_off = f * d->frag_bytes;
		m.frag_len = pbox_frag_len(d, d->chunks[c].bytes, f);
		/* Gradients: what the input gives (NaN and Inf included), then small values. */
		for (uint32_t i = 0; i < m.frag_len / 4; i++) {
			float v = (float)((i + m.sender) % 7) - 3.0f;

			memcpy(buf + PBOX_WIRE_HDR_LEN + 4 * i, &v, 4);
		}
		fz_bytes(in, buf + PBOX_WIRE_HDR_LEN, (bits & 2) ? m.frag_len : 0);
		if (sel & 0x40) {
			dvf_payload(x, in, buf + PBOX_WIRE_HDR_LEN, &m);
		}
		if (m.flags & PBOX_F_CRC) {
			m.arg1 = pbox_crc32c(buf + PBOX_WIRE_HDR_LEN, m.frag_len, PBOX_CRC_INIT);
		}
	}
	if (bits & 4) {
		/* Corrupt: the input overwrites one field, or a few bytes anywhere. */
		switch (fz_u8(in) % 8) {
		case 0:
			m.cookie = fz_bool(in) ? fz_u64(in) : j->cookies[fz_below(in, d->nworkers)];
			break;
		case 1:
			m.sender = fz_u32(in);
			break;
		case 2:
			m.chunk = fz_u32(in);
			break;
		case 3:
			m.frag_off = fz_u32(in);
			break;
		case 4:
			m.chunk_len = fz_u32(in);
			break;
		case 5:
			m.job = fz_u32(in);
			break;
		case 6:
			m.arg1 = fz_u32(in);
			break;
		default:
			m.type = fz_u8(in);
			break;
		}
	}
	pbox_wire_encode(&m, (struct pbox_wire_hdr *)(void *)buf);
	if (bits & 8) {
		fz_scribble(in, buf, PBOX_WIRE_HDR_LEN + m.frag_len);
	}
	/* Usually from the rank's own address, sometimes from another one (port 0: nowhere to
	 * answer). Replies go to port % 10000 = the rank whose cookie they must carry: the
	 * sender the header names once the input changed it. */
	from_rank(&from, header_sender(buf), (bits & 16) != 0);
	if ((bits & 0x60) == 0x60) {
		from.port = 0;
	}
	core = d->chunks[c].core;
	if (bits & 0x80) {
		core = fz_below(in, x->ncores); /* maybe misdirected */
	}
	deliver(x, in, core, buf, PBOX_WIRE_HDR_LEN + m.frag_len, &from);
}

static void raw(struct fix *x, struct fz *in)
{
	uint8_t buf[MAX_DGRAM];
	size_t len = fz_below(in, MAX_DGRAM + 1);
	struct pbox_peer from;
	uint32_t core = fz_below(in, x->ncores);

	len = fz_bytes(in, buf, len);
	/* From the address of the rank the header names (replies are checked against it). */
	from_rank(&from, len >= 16 ? header_sender(buf) : 0, len >= 16 && fz_bool(in));
	deliver(x, in, core, buf, len, &from);
}

/* A rank leaves the job (pboxd: a new table where its live bit and maybe its cookie are
 * cleared); the cores see it at once or at their next datagram. */
static void leave(struct fix *x, struct fz *in)
{
	struct fjob *j = fz_bool(in) ? &x->b : &x->a;
	uint32_t r = fz_below(in, j->desc.nworkers);
	uint8_t how = fz_u8(in);

	if ((j->live[r / 64] >> (r % 64) & 1) && j->job.nlive > 1) {
		j->live[r / 64] &= ~(1ull << (r % 64));
		j->job.nlive--;
		j->job.generation++;
	}
	if (how & 1) {
		j->cookies[r] = 0;
	}
	x->tab->generation++;
	if (how & 2) {
		for (uint32_t k = 0; k < x->ncores; k++) {
			pbox_engine_observe_table(&x->eng[k], x->tab);
		}
	}
}

static void check_state(const struct fix *x)
{
	const struct fjob *j = &x->a;

	for (uint32_t c = 0; c < j->desc.nchunks; c++) {
		const struct pbox_chunk_state *cs = chunk_state(j, c);

		FUZZ_CHECK(cs->version >= x->last_version[c],
			   "chunk %u went back from version %u "
			   "to %u",
			   c, x->last_version[c], cs->version);
		FUZZ_CHECK(cs->nheld <= j->desc.nworkers, "chunk %u holds %u pulls of %u ranks", c,
			   cs->nheld, j->desc.nworkers);
		x->last_version[c] = cs->version;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static bool once;
	struct fix x;
	struct fz in;
	unsigned events = 0;

	if (!once) {
		/* Every message is formatted (format bugs surface) and discarded. */
		pbox_log_set_level(PBOX_LOGC_COUNT, PBOX_LOG_LVL_DEBUG);
		pbox_log_set_sink(pbox_test_log_silent, NULL);
		once = true;
	}
	if (size < 3) {
		return 0;
	}
	memset(&x, 0, sizeof(x));
	g_fix = &x;
	fz_init(&in, data, size);
	setup(&x, &in);
	/* A bound on events keeps each input cheap whatever its size. */
	while (!fz_empty(&in) && events++ < 4096) {
		uint8_t ev = fz_u8(&in);

		switch (ev % 16) {
		case 12:
		case 13:
			raw(&x, &in);
			break;
		case 14:
			leave(&x, &in);
			break;
		case 15:
			if ((ev >> 4) == 15) {
				x.a.job.run = PBOX_JOB_ABORTED;
			} else {
				pbox_engine_flush(&x.eng[fz_below(&in, x.ncores)]);
			}
			break;
		default:
			structured(&x, &in);
			break;
		}
		check_state(&x);
	}
	if (getenv("PBOX_FUZZ_VERBOSE") != NULL) {
		/* What the input reached, to check that seeds go deep. */
		uint64_t it = 0, agg = 0, tx = 0, drops[PBOX_DROP_COUNT] = { 0 };

		for (uint32_t k = 0; k < x.ncores; k++) {
			it += x.stats[k].iterations;
			agg += x.stats[k].agg_frags;
			tx += x.stats[k].tx_pkts;
			for (unsigned r = 0; r < PBOX_DROP_COUNT; r++) {
				drops[r] += x.stats[k].drops[r];
			}
		}
		fprintf(stderr, "%u events: %llu iterations, %llu fragments added, %llu sent;",
			events, (unsigned long long)it, (unsigned long long)agg,
			(unsigned long long)tx);
		for (unsigned r = 1; r < PBOX_DROP_COUNT; r++) {
			if (drops[r] != 0) {
				fprintf(stderr, " %s %llu",
					pbox_drop_reason_name((enum pbox_drop_reason)r),
					(unsigned long long)drops[r]);
			}
		}
		fputc('\n', stderr);
	}
	teardown(&x);
	g_fix = NULL;
	return 0;
}
