/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz harness: the worker's receive path (dataplane/libpbox/node.c: pbox_node_rx and the
 * state it drives), since workers decode untrusted datagrams too (anyone can send to a
 * worker's port).
 *
 * One input is one worker from a fresh state: its first bytes choose the job (mode,
 * credits, plain or NOTIFY-ACK flow, staleness, 1..2 cores, fragment size, rank), then
 * events follow, each chosen by one byte:
 *  - submit an operation (push, pull, push-pull, init; in place or not) on a key;
 *  - a structured datagram "from the appliance": the harness writes a header that passes
 *    the worker's validation (sender = appliance, the worker's cookie, chunk_len, a
 *    fragment on the grid) and lets the input choose the type (DATA, ACK, ERROR; an ACK
 *    may be a NACK with a fragment bitmap on the grid), flags,
 *    chunk, fragment, label (relative to an operation in flight), arguments and payload;
 *    a "corrupt" bit lets the input overwrite fields or bytes;
 *  - a raw datagram;
 *  - (event bytes 12..15 of 16) a structured datagram delivered as the UDP transport's
 *    receive placement does: its payload in the place the node offered, whatever it is;
 *  - the virtual clock advances and the node's timers run (retransmissions, probes,
 *    deadlines);
 *  - the node fails as a whole (pbox_node_fail).
 * A job byte of 3 in its two low bits (otherwise unused) makes a 2-worker aggregate or
 * server-optimizer job with DVF: pushes go through the worker's filter and, for aggregate
 * jobs, a DATA may carry its payload as a DVF block (bit 7 of its bits; one more byte
 * chooses the threshold, the codec and the index coding), which the corrupt bits damage
 * like any other bytes.
 *
 * Invariants checked beyond the sanitizers: every datagram the node sends passes the
 * appliance's validation; each accepted operation completes exactly once, and never
 * before it was submitted; a completed pull or push-pull has a result the node may accept
 * (the iteration asked for, or a version within the staleness bound); no timer is due
 * right after the timers ran.
 */
#include <arpa/inet.h>
#include <errno.h>

#include "common/log.h"
#include "dvf/dvf_job.h"
#include "fuzz.h"
#include "harness.h"
#include "libpbox/dvf_push.h"
#include "libpbox/node.h"

#define NOPS      8
#define MAX_ELEM  100
#define COOKIE    0x5eed5eed12345678ull
#define JOB       42
#define MAX_DGRAM (PBOX_WIRE_HDR_LEN + 1024)

struct fop {
	struct pbox_op op;
	bool busy; /* submitted, not completed */
	float src[MAX_ELEM];
	float dst[MAX_ELEM];
};

struct fix {
	struct pbox_jobdesc desc;
	struct pbox_node *node;
	struct pbox_peer cores[2];
	uint32_t ncores, rank;
	bool server_opt;
	bool accept_newer;
	uint32_t staleness;
	uint32_t result_lag; /* broadcast jobs: push-pulls of t want t - lag */
	uint64_t now_ns;
	struct fop ops[NOPS];
	struct pbox_dvf_job dvf;      /* enabled: the job has DVF */
	struct pbox_dvf_scratch *enc; /* encodes the harness's result blocks */
};

/* ---- the transport: checks every datagram the worker sends ----------------------------- */

static int tx_send(void *ctx, const struct pbox_peer *to, const struct pbox_wire_hdr *hdr,
		   const void *payload, uint32_t len)
{
	struct fix *x = ctx;
	uint8_t buf[PBOX_WIRE_HDR_LEN + PBOX_WIRE_MAX_PAYLOAD];
	uint64_t cookies[4] = { 0 };
	struct pbox_wire_job wj = { .id = JOB,
				    .desc = &x->desc,
				    .cookies = cookies,
				    .accepts_init = x->server_opt,
				    .accepts_dvf = x->dvf.enabled };
	struct pbox_msg m;
	enum pbox_drop_reason r;
	uint32_t core = ntohs(to->port) - 10000u;

	FUZZ_CHECK(len <= PBOX_WIRE_MAX_PAYLOAD, "a %u-byte payload", len);
	memcpy(buf, hdr, PBOX_WIRE_HDR_LEN);
	if (len != 0) {
		memcpy(buf + PBOX_WIRE_HDR_LEN, payload, len); /* ASan: a payload out of bounds */
	}
	cookies[x->rank] = COOKIE;
	r = pbox_wire_decode(buf, PBOX_WIRE_HDR_LEN + len, &m);
	FUZZ_CHECK(r == PBOX_DROP_NONE, "the worker sent an undecodable datagram: %s",
		   pbox_drop_reason_name(r));
	r = pbox_wire_check(&m, &wj, PBOX_ROLE_APPLIANCE);
	FUZZ_CHECK(r == PBOX_DROP_NONE,
		   "the worker sent type %u for chunk %u that the "
		   "appliance drops: %s",
		   m.type, m.chunk, pbox_drop_reason_name(r));
	FUZZ_CHECK(core < x->ncores && x->desc.chunks[m.chunk].core == core,
		   "chunk %u sent to core %u", m.chunk, core);
	return 0;
}

static const struct pbox_tx_ops g_tx = {
	.send = tx_send,
	.flush = pbox_test_tx_flush,
	.queued = pbox_test_tx_queued,
	.reclaim = pbox_test_tx_reclaim,
};

static void on_done(struct pbox_op *op, void *arg)
{
	struct fix *x = arg;
	struct fop *o = (struct fop *)(void *)op; /* op is the first member */

	FUZZ_CHECK(o >= x->ops && o < x->ops + NOPS, "completion of an unknown op");
	FUZZ_CHECK(o->busy, "op %u completed twice (or before it was submitted)",
		   (unsigned)(o - x->ops));
	o->busy = false;
	if (op->status == 0 && (op->kind == PBOX_OP_PULL || op->kind == PBOX_OP_PUSH_PULL)) {
		/* The result is one the node may accept (UINT32_MAX is a label like any other:
		 * iteration counters wrap). */
		uint32_t want = op->kind != PBOX_OP_PUSH_PULL ? op->iter
				: x->server_opt               ? op->iter + 1
							      : op->iter - x->result_lag;

		if (x->server_opt) {
			FUZZ_CHECK(x->staleness == UINT32_MAX ||
					   (uint64_t)op->label + x->staleness >= want,
				   "op %u: version %u, wanted %u within %u", (unsigned)(o - x->ops),
				   op->label, want, x->staleness);
		} else {
			FUZZ_CHECK(op->label == want || (x->accept_newer && op->label > want),
				   "op %u: the result of iteration %u, wanted %u",
				   (unsigned)(o - x->ops), op->label, want);
		}
	}
	FUZZ_CHECK(op->status <= 0, "status %d", op->status);
}

/* ---- set-up ------------------------------------------------------------------------------ */

static void setup(struct fix *x, struct fz *in)
{
	static const struct pbox_keyspec keys[] = { { 3, MAX_ELEM }, { 9, 16 } };
	uint8_t c0 = fz_u8(in), c1 = fz_u8(in);
	uint32_t nworkers = (c0 & 3) == 3 ? 2 : 1 + (c0 & 3);
	uint32_t credits = 1 + ((c0 >> 2) & 1);
	char err[256];
	struct pbox_node_cfg nc;

	x->ncores = 1 + ((c0 >> 3) & 1);
	x->rank = (c1 & 3) % nworkers;
	x->server_opt = (c0 >> 4) & 1;
	x->now_ns = 1000000000ull;
	x->staleness = (c1 >> 5) & 1 ? UINT32_MAX : (uint32_t)(c1 >> 6);
	x->accept_newer = (c0 >> 6) & 1;
	if (!x->server_opt && x->accept_newer && x->staleness != UINT32_MAX) {
		/* Newer results are for folding models, whose staleness is unbounded: this
		 * combination picks a broadcast job instead (results lag by the staleness). */
		x->accept_newer = false;
		x->result_lag = x->staleness;
	}
	if (pbox_jobdesc_build(&x->desc, keys, 2, nworkers, x->ncores, 256, 64u << ((c0 >> 5) & 1),
			       NULL, err, sizeof(err)) != 0) {
		fprintf(stderr, "fuzz_node: %s\n", err);
		abort();
	}
	for (uint32_t k = 0; k < x->ncores; k++) {
		x->cores[k].ip = htonl(0x7f000001);
		x->cores[k].port = htons((uint16_t)(10000 + k));
	}
	nc = (struct pbox_node_cfg){
		.desc = &x->desc,
		.job = JOB,
		.rank = x->rank,
		.cookie = COOKIE,
		.server_opt = x->server_opt,
		.cores = x->cores,
		.tx = &g_tx,
		.tx_ctx = x,
		.now_ns = pbox_test_clock,
		.now_arg = &x->now_ns,
		.rto_ms = 10,
		.rto_max_ms = 80,
		.timeout_ms = 2000,
		.max_inflight = 1 + (c1 >> 2) % 4,
		.window_bytes = (c1 >> 4) & 1 ? 512 : 0,
		.staleness = x->staleness,
		.accept_newer = x->accept_newer,
		.result_lag = x->result_lag,
		.credits = credits,
		.plain = (c0 >> 7) & 1,
		.crc = true,
		.dvf = &x->dvf,
		.done = on_done,
		.done_arg = x,
	};
	if ((c0 & 3) == 3) {
		pbox_dvf_job_default(&x->dvf);
		x->dvf.params.delta_low = 0.5f;
		x->dvf.params.delta_up = 1.0f;
		x->enc = pbox_dvf_scratch_new(64);
		FUZZ_CHECK(x->enc != NULL, "dvf scratch");
	}
	x->node = pbox_node_create(&nc);
	FUZZ_CHECK(x->node != NULL, "pbox_node_create failed");
}

/* ---- events ------------------------------------------------------------------------------ */

static void submit(struct fix *x, struct fz *in)
{
	static const enum pbox_op_kind kinds[4] = { PBOX_OP_PUSH, PBOX_OP_PULL, PBOX_OP_PUSH_PULL,
						    PBOX_OP_INIT };
	struct fop *o = &x->ops[fz_below(in, NOPS)];
	uint8_t sel = fz_u8(in);
	int rc;

	if (o->busy) {
		return; /* the caller owns it until it completes */
	}
	memset(&o->op, 0, sizeof(o->op));
	o->op.kind = kinds[sel & 3];
	o->op.key = (sel >> 2) & 1;
	o->op.iter = fz_u8(in) % 8;
	for (uint32_t i = 0; i < MAX_ELEM; i++) {
		o->src[i] = (float)(i % 5);
	}
	o->op.src = o->src;
	/* In place (the Python hook's way) or into another buffer. */
	o->op.dst = (sel >> 3) & 1 ? o->src : o->dst;
	if ((sel >> 4) == 15) {
		o->op.kind = (enum pbox_op_kind)fz_u8(in); /* nonsense kind */
	}
	o->busy = true; /* the callback may run inside submit */
	rc = pbox_node_submit(x->node, &o->op);
	if (rc != 0) {
		FUZZ_CHECK(rc < 0 && o->busy, "submit returned %d after completing", rc);
		o->busy = false;
	}
}

/* The label a reply should carry to concern op o, give or take the input's delta. */
static uint32_t label_near(const struct fix *x, const struct fop *o, int8_t delta)
{
	uint32_t want = o->op.iter;

	if (x->server_opt && o->op.kind == PBOX_OP_PUSH_PULL) {
		want++;
	}
	return want + (uint32_t)(int32_t)(delta % 4);
}

/* Re-encode a DATA payload (dense floats at pay) as a DVF block when one is smaller: one
 * input byte gives the threshold, the codec and the index coding (zero residual). */
static void dvf_payload(struct fix *x, struct fz *in, uint8_t *pay, struct pbox_msg *m)
{
	static const char *const codecs[4] = { "none", "lz4", "snappy", "zstd:1" };
	uint8_t dv = fz_u8(in);
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
	len = pbox_dvf_encode_frag(x->enc, &cfg, pbox_dvf_kernels_get(), resid, g, m->frag_len / 4,
				   (float)(dv & 3) * 0.25f, out, &dense, &info);
	if (len > 0 && !dense) {
		memcpy(pay, out, (size_t)len);
		m->encoding = PBOX_ENC_DVF;
		m->frag_len = (uint32_t)len;
	}
}

/*
 * Deliver a datagram the way the UDP transport's receive placement does (udp.h,
 * node.h): if the node offers a place, the payload goes there (the kernel writes it
 * whatever the datagram is) and the header to a scratch buffer; one of another length
 * comes back whole behind its header. Every place must lie in the dst (or in-place src)
 * of an operation in flight: memory the caller does not own until it completes.
 */
static void deliver_placed(struct fix *x, const uint8_t *buf, uint32_t len,
			   const struct pbox_peer *from)
{
	static uint8_t scratch[MAX_DGRAM];
	struct pbox_node_place pl;
	struct pbox_rx_pkt p = { .data = scratch, .len = len, .from = *from };
	uint32_t pay = len > PBOX_WIRE_HDR_LEN ? len - PBOX_WIRE_HDR_LEN : 0;
	unsigned np = pbox_node_rx_places(x->node, &pl, 1);
	int16_t placed = -1;

	memcpy(scratch, buf, len < PBOX_WIRE_HDR_LEN ? len : PBOX_WIRE_HDR_LEN);
	if (np == 1) {
		bool owned = false;

		for (unsigned i = 0; i < NOPS; i++) {
			const uint8_t *d = (const uint8_t *)x->ops[i].op.dst;

			owned |= x->ops[i].busy && d != NULL && (const uint8_t *)pl.dst >= d &&
				 (const uint8_t *)pl.dst + pl.len <= d + sizeof(x->ops[i].dst);
		}
		FUZZ_CHECK(owned, "a place outside every operation's buffer in flight");
		memcpy(pl.dst, buf + PBOX_WIRE_HDR_LEN, pay < pl.len ? pay : pl.len);
		if (pay == pl.len) {
			placed = 0;
		}
	}
	if (placed < 0) {
		memcpy(scratch + PBOX_WIRE_HDR_LEN, buf + PBOX_WIRE_HDR_LEN, pay);
	}
	pbox_node_rx_burst(x->node, &p, 1, &pl, np, &placed);
}

static void structured(struct fix *x, struct fz *in, bool place)
{
	static const uint8_t types[4] = { PBOX_MSG_DATA, PBOX_MSG_DATA, PBOX_MSG_ACK,
					  PBOX_MSG_ERROR };
	static const uint32_t errs[8] = { ECONNABORTED, EAGAIN,     ESTALE, EINVAL, 0,
					  4096,         UINT32_MAX, ENOMEM };
	uint8_t buf[MAX_DGRAM];
	uint8_t sel = fz_u8(in), bits = fz_u8(in);
	const struct fop *o = &x->ops[fz_below(in, NOPS)];
	const struct pbox_key *k = &x->desc.keys[o->op.key < 2 ? o->op.key : 0];
	struct pbox_msg m = { 0 };
	struct pbox_peer from = x->cores[0];
	uint32_t c, f;

	m.type = types[sel & 3];
	m.flags = (uint16_t)((sel >> 2) & PBOX_F_ALL);
	if (m.type == PBOX_MSG_DATA) {
		m.flags &= PBOX_F_RETRANSMIT;
	} else if (m.type == PBOX_MSG_ERROR) {
		m.flags = 0;
	} else {
		m.flags &= (uint16_t)(PBOX_F_RETRY | PBOX_F_OF_INIT | PBOX_F_STATUS);
	}
	m.job = JOB;
	m.sender = PBOX_SENDER_APPLIANCE;
	m.cookie = COOKIE;
	/* Usually a chunk of the chosen op's key, sometimes any. */
	c = (bits & 1) ? fz_below(in, x->desc.nchunks) : k->first_chunk + fz_below(in, k->nchunks);
	m.chunk = c;
	m.chunk_len = x->desc.chunks[c].bytes;
	m.iter = label_near(x, o, (int8_t)fz_u8(in));
	m.arg0 = m.type == PBOX_MSG_ERROR ? errs[fz_u8(in) % 8] : fz_u8(in);
	m.arg1 = fz_u8(in);
	if (m.type == PBOX_MSG_ACK && (bits & 64)) {
		/* A NACK: the fragments held, from a base on the grid. */
		uint32_t base = fz_below(in, x->desc.chunks[c].nfrags);
		uint32_t left = x->desc.chunks[c].nfrags - base;

		m.flags |= PBOX_F_SACK;
		m.frag_off = base * x->desc.frag_bytes;
		m.sack = fz_u64(in);
		if (left < PBOX_SACK_BITS) {
			m.sack &= (1ull << left) - 1;
		}
	}
	if (m.type == PBOX_MSG_DATA) {
		f = fz_below(in, x->desc.chunks[c].nfrags);
		m.encoding = PBOX_ENC_F32;
		m.frag_off = f * x->desc.frag_bytes;
		m.frag_len = pbox_frag_len(&x->desc, x->desc.chunks[c].bytes, f);
		memset(buf + PBOX_WIRE_HDR_LEN, 0, m.frag_len);
		fz_bytes(in, buf + PBOX_WIRE_HDR_LEN, (bits & 2) ? m.frag_len : 0);
		if ((bits & 128) && x->enc != NULL) {
			dvf_payload(x, in, buf + PBOX_WIRE_HDR_LEN, &m);
		}
	}
	if (bits & 4) {
		switch (fz_u8(in) % 6) {
		case 0:
			m.cookie = fz_u64(in);
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
			m.iter = fz_u32(in);
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
	if (bits & 16) {
		from.port = htons(fz_u16(in)); /* a stranger's address */
	}
	if (place) {
		deliver_placed(x, buf, PBOX_WIRE_HDR_LEN + m.frag_len, &from);
	} else {
		pbox_node_rx(x->node, buf, PBOX_WIRE_HDR_LEN + m.frag_len, &from);
	}
	if (bits & 32) {
		pbox_node_flush(x->node);
	}
}

static void raw(struct fix *x, struct fz *in)
{
	uint8_t buf[MAX_DGRAM];
	size_t len = fz_bytes(in, buf, fz_below(in, MAX_DGRAM + 1));

	pbox_node_rx(x->node, buf, (uint32_t)len, &x->cores[0]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static bool once;
	static struct fix x; /* static: the op buffers are large for a stack */
	struct fz in;
	unsigned events = 0;

	if (!once) {
		pbox_log_set_level(PBOX_LOGC_COUNT, PBOX_LOG_LVL_DEBUG);
		pbox_log_set_sink(pbox_test_log_silent, NULL);
		once = true;
	}
	if (size < 2) {
		return 0;
	}
	memset(&x, 0, sizeof(x));
	fz_init(&in, data, size);
	setup(&x, &in);
	while (!fz_empty(&in) && events++ < 4096) {
		uint8_t ev = fz_u8(&in);

		switch (ev % 16) {
		case 0:
		case 1:
		case 2:
			submit(&x, &in);
			break;
		case 3:
			raw(&x, &in);
			break;
		case 4:
		case 5:
			/* Time passes: 1 ms .. ~4 s, past rto, rto_max and the deadline. */
			x.now_ns += (uint64_t)(1 + fz_u8(&in)) *
				    ((ev >> 4) & 1 ? 16000000ull : 1000000ull);
			pbox_node_timers(x.node);
			pbox_node_flush(x.node);
			/* Otherwise libpbox's progress thread would spin. */
			FUZZ_CHECK(pbox_node_next_timer(x.node) > 0,
				   "a timer is still due right after the timers ran");
			break;
		case 6:
			if ((ev >> 4) == 15) {
				pbox_node_fail(x.node, -ECONNABORTED,
					       "the appliance aborted the job");
			}
			break;
		default:
			/* Events 12..15: through receive placement. */
			structured(&x, &in, ev % 16 >= 12);
			break;
		}
	}
	if (getenv("PBOX_FUZZ_VERBOSE") != NULL) {
		const struct pbox_node_stats *st = pbox_node_stats(x.node);

		fprintf(stderr, "%u events: %llu ops done, %llu failed, %llu sent, %llu resent\n",
			events, (unsigned long long)st->ops_done,
			(unsigned long long)st->ops_failed, (unsigned long long)st->tx_pkts,
			(unsigned long long)st->retransmits);
		if (pbox_node_dvf(x.node) != NULL) {
			const struct pbox_dvf_push_stats *d =
				pbox_dvf_push_stats(pbox_node_dvf(x.node));

			fprintf(stderr,
				"dvf: %llu fragments filtered (%llu blocks), %llu result "
				"blocks, %llu bad blocks\n",
				(unsigned long long)d->frags, (unsigned long long)d->blocks,
				(unsigned long long)d->results,
				(unsigned long long)st->drops[PBOX_DROP_BAD_BLOCK]);
		}
	}
	pbox_node_destroy(x.node);
	pbox_dvf_scratch_free(x.enc);
	pbox_jobdesc_free(&x.desc);
	return 0;
}
