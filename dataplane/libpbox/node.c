/* SPDX-License-Identifier: BSD-3-Clause */
/* The worker's data-plane node (see node.h for the reliability rules). */
#include "node.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "common/bitmap.h"
#include "common/compiler.h"
#include "common/crc.h"
#include "common/log.h"
#include "common/stream.h"
#include "dvf_push.h"
#include "relay.h"

enum phase {
	PH_IDLE = 0,
	PH_QUEUED, /* waiting for a free in-flight slot */
	PH_SEND,   /* data (or the pull request) sent, nothing acknowledged yet */
	PH_WAIT,   /* contribution acknowledged, waiting for the result */
};

/* One chunk of one lane. */
struct wchunk {
	uint8_t phase;
	uint16_t tries;      /* sends of the current phase (Karn: RTT sampled only at 1) */
	uint64_t tmo_ns;     /* current timeout of the phase (backs off) */
	uint64_t sent_ns;    /* first send of the contribution (RTT sample); in PH_WAIT,
				when the wait began */
	uint64_t order;      /* send_order of its last send */
	uint64_t due_ns;     /* next retransmission / probe */
	uint32_t rlabel;     /* label of the result being collected */
	uint32_t rgot;       /* fragments of it received */
	uint32_t ndone_seen; /* contributions the appliance reported in its last ACK */
	uint32_t stale_seen; /* label of the last result ignored as too stale */
	uint64_t *rbits;
	uint64_t *sacked;     /* fragments of the contribution the appliance said it holds */
	uint32_t round_seq;   /* seq of the last datagram of the latest send round */
	uint32_t tmo_seq;     /* seq of the first datagram the timer sent (tmo_sent) */
	uint8_t tmo_sent;     /* the timer re-sent or probed; not yet judged (judge_timer) */
	uint64_t tmo_base;    /* when the timer's current round began (its delay's origin) */
	uint32_t *crc;        /* per fragment version word (crc mode) */
	uint32_t next_queued; /* FIFO link (wchunk index + 1, 0 = end) */
	uint32_t next_active; /* active list link (wchunk index + 1, 0 = end) */
	uint32_t prev_active;
};

/* An operation's state in one lane of its key. A plain push's lane outlives its op (the
 * op completed when the data was sent; the lane still resends until acknowledged). */
struct lane {
	enum pbox_op_kind kind;
	uint32_t iter;
	const float *src; /* the caller's buffer, or `copy` in plain flow */
	float *dst;
	struct pbox_op *op; /* NULL once the caller's op has completed early (plain flow) */
	uint32_t chunks_left;
	uint32_t chunks_unsent;
	uint64_t start_ns;
	uint64_t deadline_ns;
	float *copy;
	size_t copy_cap;
};

struct pbox_node {
	struct pbox_node_cfg cfg;
	const struct pbox_jobdesc *d;
	struct pbox_wire_job wire;
	uint64_t cookie_store[1];
	uint32_t nlanes;
	struct wchunk *ch;  /* nchunks * nlanes, chunk-major */
	struct lane *lanes; /* nkeys * nlanes, key-major */
	uint64_t *bits_arena;
	uint32_t *crc_arena;
	const uint64_t *rx_gen; /* pbox_node_rx_split: the payload's generation word */
	uint64_t rx_gen_want;
	struct pbox_op **pending_head; /* per key: plain pushes waiting for a free lane */
	struct pbox_op **pending_tail;
	uint32_t nops;           /* lanes busy */
	uint32_t inflight;       /* wchunks in PH_SEND */
	uint64_t inflight_bytes; /* their bytes */
	uint32_t q_head, q_tail; /* queued wchunks, index + 1 */
	uint32_t active_head;    /* wchunks in PH_SEND / PH_WAIT, index + 1 (newest first) */
	uint32_t active_tail;    /* the oldest of them */
	uint32_t place_next;     /* receive placement: chunk after the last result + 1 */
	uint32_t place_core;     /* the core that sent it */
	uint32_t place_n;        /* places worth offering: the recent runs of hits */
	uint32_t seq;
	uint64_t next_due; /* lower bound of every active chunk's due_ns */
	/* Congestion control and timers (see node.h). Times in ns, sizes in bytes. */
	uint64_t cwnd;
	uint64_t ssthresh;
	uint64_t unit;         /* one full chunk: the least window, the backlog unit */
	uint64_t mss;          /* additive increase per RTT: one fragment */
	uint64_t srtt, rttvar; /* RFC 6298; srtt 0: no sample yet */
	uint64_t wsrtt, wvar;  /* an acknowledged contribution's wait for its result */
	uint64_t rto;          /* current RTO (before a chunk's own back-off) */
	uint64_t rto_min, rto_max;
	uint64_t pto_min; /* floor of the tail-loss probe (cfg.pto_min_ms) */
	/* Spurious timeouts (judge_timer()): the tail-loss probe's floor raised to the
	 * delays that proved timers too eager, decayed when timers prove right; the window
	 * before the last timeout's reduction, to undo when it proves spurious (0: none). */
	uint64_t pto_adapt;
	uint64_t pto_adapt_t; /* when pto_adapt last rose or decayed (floor_decay()) */
	uint64_t undo_cwnd, undo_ssthresh;
	uint64_t min_rtt; /* windowed minimum: min(min_prev, min_cur) */
	uint64_t min_prev, min_cur, min_epoch;
	uint64_t standing; /* least RTT sample of the last srtt / 2 (0: none yet) */
	uint64_t standing_cur, standing_start;
	uint64_t recover_until; /* no second window reduction before this (one per RTT) */
	uint64_t last_delivery; /* last time a contribution was acknowledged */
	uint64_t send_order;    /* counts contribution sends (first sends and resends) */
	/* Per appliance core (its own queue: cores run as threads that are descheduled
	 * independently, so one core's acknowledgements say nothing about another's queue):
	 * the highest send_order acknowledged unambiguously (Karn), and when. */
	uint64_t *core_acked, *core_delivery;
	/* The same for results (a waiting chunk's first result fragment: its send_order and
	 * when). When the core's last timer probe for a contribution / a result went while
	 * the core answered nothing (timers: one chunk probes, as F-RTO sends one datagram,
	 * the next after twice the interval). */
	uint64_t *core_res, *core_res_t, *core_quiet_send, *core_quiet_probe;
	uint64_t *core_quiet_gap, *core_quiet_sgap; /* the intervals of those probes (they
						       double; 0: none yet) */
	uint64_t pace_next;                         /* earliest start of the next queued chunk */
	bool pace_wait;                             /* start_queued stopped for the pacer */
	uint32_t ss_high;       /* RTT samples in a row above the slow-start exit threshold */
	uint64_t next_deadline; /* lower bound of every busy lane's deadline_ns */
	int failed;
	char failmsg[256];
	struct pbox_relay *relay; /* TSB: NULL unless the session has a broadcast tree */
	struct pbox_node_stats stats;
	struct pbox_dvf_push *dvf; /* NULL: the job has no DVF */
};

uint64_t pbox_clock_ns(void *arg)
{
	struct timespec ts;

	(void)arg;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t now(struct pbox_node *n)
{
	return n->cfg.now_ns(n->cfg.now_arg);
}

static void cc_init(struct pbox_node *n);
static void pace(struct pbox_node *n, uint64_t bytes, uint64_t t);

static const struct pbox_wire_job *lookup(void *arg, uint32_t id)
{
	struct pbox_node *n = arg;

	return id == n->wire.id ? &n->wire : NULL;
}

/* wchunk index <-> (chunk, lane) */
static uint32_t wc_index(const struct pbox_node *n, uint32_t c, uint32_t lane)
{
	return c * n->nlanes + lane;
}

static uint32_t wc_chunk(const struct pbox_node *n, uint32_t i)
{
	return i / n->nlanes;
}

static struct lane *wc_lane(struct pbox_node *n, uint32_t i)
{
	uint32_t c = wc_chunk(n, i);

	return &n->lanes[n->d->chunks[c].key * n->nlanes + i % n->nlanes];
}

struct pbox_node *pbox_node_create(const struct pbox_node_cfg *cfg)
{
	struct pbox_node *n = calloc(1, sizeof(*n));
	size_t words = 0, crcs = 0;

	if (n == NULL) {
		goto oom;
	}
	n->cfg = *cfg;
	if (n->cfg.now_ns == NULL) {
		n->cfg.now_ns = pbox_clock_ns;
	}
	if (n->cfg.rto_ms == 0) {
		n->cfg.rto_ms = 50;
	}
	if (n->cfg.rto_max_ms == 0) {
		n->cfg.rto_max_ms = 1000;
	}
	if (n->cfg.rto_min_ms == 0) {
		n->cfg.rto_min_ms = 10;
	}
	n->cfg.rto_min_ms = PBOX_MIN(n->cfg.rto_min_ms, n->cfg.rto_ms);
	n->cfg.rto_max_ms = PBOX_MAX(n->cfg.rto_max_ms, n->cfg.rto_ms);
	if (n->cfg.timeout_ms == 0) {
		n->cfg.timeout_ms = 30000;
	}
	if (n->cfg.max_inflight == 0) {
		n->cfg.max_inflight = 256;
	}
	if (n->cfg.window_bytes == 0) {
		n->cfg.window_bytes = 4u << 20;
	}
	n->nlanes = n->cfg.credits ? n->cfg.credits : 1;
	n->d = cfg->desc;
	cc_init(n);
	n->next_due = UINT64_MAX;
	n->next_deadline = UINT64_MAX;
	n->cookie_store[0] = cfg->cookie;
	n->wire.id = cfg->job;
	n->wire.desc = cfg->desc;
	n->wire.cookies = n->cookie_store;
	if (cfg->dvf != NULL && cfg->dvf->enabled) {
		/* Aggregate results are filtered by the appliance: they may come as blocks. */
		n->wire.accepts_dvf = !cfg->server_opt;
		n->dvf = pbox_dvf_push_create(cfg->desc, n->cfg.credits ? n->cfg.credits : 1,
					      cfg->dvf);
		if (n->dvf == NULL) {
			goto oom;
		}
	}
	n->ch = calloc((size_t)n->d->nchunks * n->nlanes, sizeof(*n->ch));
	n->lanes = calloc((size_t)n->d->nkeys * n->nlanes, sizeof(*n->lanes));
	n->pending_head = calloc(n->d->nkeys, sizeof(*n->pending_head));
	n->pending_tail = calloc(n->d->nkeys, sizeof(*n->pending_tail));
	n->core_acked = calloc(8 * (size_t)PBOX_MAX(n->d->ncores, 1u), sizeof(uint64_t));
	if (n->core_acked != NULL) {
		size_t nc = PBOX_MAX(n->d->ncores, 1u);

		n->core_delivery = n->core_acked + nc;
		n->core_res = n->core_acked + 2 * nc;
		n->core_res_t = n->core_acked + 3 * nc;
		n->core_quiet_probe = n->core_acked + 4 * nc;
		n->core_quiet_send = n->core_acked + 5 * nc;
		n->core_quiet_gap = n->core_acked + 6 * nc;
		n->core_quiet_sgap = n->core_acked + 7 * nc;
	}
	for (uint32_t c = 0; c < n->d->nchunks; c++) {
		words += pbox_bitmap_words(n->d->chunks[c].nfrags) * n->nlanes;
		crcs += (size_t)n->d->chunks[c].nfrags * n->nlanes;
	}
	n->bits_arena = calloc(words ? 2 * words : 1, sizeof(uint64_t));
	n->crc_arena = n->cfg.crc || n->cfg.sampled_words
			       ? calloc(crcs ? crcs : 1, sizeof(uint32_t))
			       : NULL;
	if (n->ch == NULL || n->lanes == NULL || n->bits_arena == NULL || n->pending_head == NULL ||
	    n->pending_tail == NULL || n->core_acked == NULL ||
	    (n->crc_arena == NULL && (n->cfg.crc || n->cfg.sampled_words))) {
		goto oom;
	}
	words = 0;
	crcs = 0;
	for (uint32_t c = 0; c < n->d->nchunks; c++) {
		for (uint32_t l = 0; l < n->nlanes; l++) {
			struct wchunk *w = &n->ch[wc_index(n, c, l)];

			w->rbits = n->bits_arena + words;
			words += pbox_bitmap_words(n->d->chunks[c].nfrags);
			w->sacked = n->bits_arena + words;
			words += pbox_bitmap_words(n->d->chunks[c].nfrags);
			if (n->crc_arena != NULL) {
				w->crc = n->crc_arena + crcs;
				crcs += n->d->chunks[c].nfrags;
			}
		}
	}
	return n;
oom:
	PBOX_LOG_ERR(CLIENT, "out of memory for the worker node");
	pbox_node_destroy(n);
	return NULL;
}

void pbox_node_destroy(struct pbox_node *n)
{
	if (n == NULL) {
		return;
	}
	for (size_t i = 0; n->lanes != NULL && i < (size_t)n->d->nkeys * n->nlanes; i++) {
		free(n->lanes[i].copy);
	}
	free(n->ch);
	free(n->lanes);
	free(n->pending_head);
	free(n->pending_tail);
	free(n->core_acked);
	free(n->bits_arena);
	free(n->crc_arena);
	pbox_dvf_push_destroy(n->dvf);
	if (n->relay != NULL) {
		pbox_relay_fini(n->relay);
	}
	free(n->relay);
	free(n);
}

const struct pbox_node_stats *pbox_node_stats(const struct pbox_node *n)
{
	return &n->stats;
}

struct pbox_dvf_push *pbox_node_dvf(const struct pbox_node *n)
{
	return n->dvf;
}

/* Whether the wchunk's contribution goes through the DVF filter (pushes of a DVF job). */
static bool dvf_push(const struct pbox_node *n, const struct lane *ln)
{
	return n->dvf != NULL && (ln->kind == PBOX_OP_PUSH || ln->kind == PBOX_OP_PUSH_PULL);
}

uint32_t pbox_node_inflight(const struct pbox_node *n)
{
	return n->nops;
}

static const char *kind_name(enum pbox_op_kind k)
{
	switch (k) {
	case PBOX_OP_PUSH:
		return "push";
	case PBOX_OP_PULL:
		return "pull";
	case PBOX_OP_PUSH_PULL:
		return "push-pull";
	case PBOX_OP_INIT:
		return "init";
	default:
		return "none";
	}
}

/* ---- active list / queue ---------------------------------------------------------- */

static void active_add(struct pbox_node *n, uint32_t i)
{
	struct wchunk *w = &n->ch[i];

	w->prev_active = 0;
	w->next_active = n->active_head;
	if (n->active_head) {
		n->ch[n->active_head - 1].prev_active = i + 1;
	} else {
		n->active_tail = i + 1;
	}
	n->active_head = i + 1;
}

static void active_del(struct pbox_node *n, uint32_t i)
{
	struct wchunk *w = &n->ch[i];

	if (w->prev_active) {
		n->ch[w->prev_active - 1].next_active = w->next_active;
	} else {
		n->active_head = w->next_active;
	}
	if (w->next_active) {
		n->ch[w->next_active - 1].prev_active = w->prev_active;
	} else {
		n->active_tail = w->prev_active;
	}
	w->next_active = w->prev_active = 0;
}

/* ---- sending ------------------------------------------------------------------------ */

static void xmit(struct pbox_node *n, uint32_t c, struct pbox_msg *m, const void *payload)
{
	const struct pbox_chunk_desc *cd = &n->d->chunks[c];
	struct pbox_wire_hdr h;

	m->job = n->cfg.job;
	m->sender = n->cfg.rank;
	m->cookie = n->cfg.cookie;
	m->chunk = c;
	m->chunk_len = cd->bytes;
	m->seq = n->seq++;
	pbox_wire_encode(m, &h);
	if (n->cfg.tx->send(n->cfg.tx_ctx, &n->cfg.cores[cd->core], &h, payload, m->frag_len) ==
	    0) {
		n->stats.tx_pkts++;
		n->stats.tx_bytes += PBOX_WIRE_HDR_LEN + m->frag_len;
	}
}

static void lane_fail(struct pbox_node *n, struct lane *ln, int err, const char *fmt, ...)
	PBOX_PRINTF(4, 5);

/* A PULL (request or probe) for a result already partly received says which fragments of
 * that result (label w->rlabel) the worker holds, so the appliance repeats only the rest. */
static void add_result_sack(const struct pbox_node *n, uint32_t c, const struct wchunk *w,
			    struct pbox_msg *m)
{
	uint32_t base;

	if (w->rlabel == UINT32_MAX || w->rgot == 0) {
		return;
	}
	pbox_sack_build(w->rbits, n->d->chunks[c].nfrags, &base, &m->sack);
	m->flags |= PBOX_F_SACK;
	m->arg0 = w->rlabel;
	m->frag_off = base * n->d->frag_bytes;
}

/*
 * The sampled version word (cfg.sampled_words, node.h): a 32-bit mix of the fragment's
 * first and last 8 bytes and of one 8-byte word every SAMPLE_STRIDE bytes. It touches
 * one cache line in 16 of a 32 KB fragment and no byte is read twice, so the first send
 * costs no pass over the payload (the kernel's copy is the only one); the resend that
 * needs it recomputes it the same way.
 */
#define SAMPLE_STRIDE 1024u

static uint32_t sampled_word(const uint8_t *p, uint32_t len)
{
	uint64_t h = 0x9e3779b97f4a7c15ull ^ len, w;

	if (len < 8) {
		w = 0;
		memcpy(&w, p, len);
		h = (h ^ w) * 0xff51afd7ed558ccdull;
	} else {
		for (uint32_t off = 0; off + 8 <= len; off += SAMPLE_STRIDE) {
			memcpy(&w, p + off, 8);
			h = (h ^ w) * 0xff51afd7ed558ccdull;
			h ^= h >> 29;
		}
		memcpy(&w, p + len - 8, 8);
		h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
	}
	h ^= h >> 32;
	return (uint32_t)h;
}

enum send_mode {
	SEND_FIRST,   /* every fragment */
	SEND_MISSING, /* the fragments the appliance has not said it holds */
	SEND_PROBE,   /* only the last of those: a tail-loss probe that asks for a NACK */
};

/* Send the chunk's contribution or its pull request. Returns false if the lane failed (a
 * resend found its buffer changed). */
static bool send_chunk(struct pbox_node *n, uint32_t i, enum send_mode mode)
{
	bool again = mode != SEND_FIRST;
	uint32_t c = wc_chunk(n, i);
	const struct pbox_chunk_desc *cd = &n->d->chunks[c];
	struct wchunk *w = &n->ch[i];
	struct lane *ln = wc_lane(n, i);
	uint16_t rflag = again ? PBOX_F_RETRANSMIT : 0;
	uint32_t last, nsent = 0, bytes = 0;

	if (ln->kind == PBOX_OP_PULL) {
		struct pbox_msg m = { .type = PBOX_MSG_PULL, .flags = rflag, .iter = ln->iter };

		add_result_sack(n, c, w, &m);
		xmit(n, c, &m, NULL);
		if (again) {
			n->stats.retransmits++;
		}
		return true;
	}
	/* Selective repeat: a resend sends only the fragments the appliance has not said it
	 * holds; the round's last datagram asks for a NACK if something is still missing. */
	last = cd->nfrags - 1;
	while (again && last > 0 && pbox_bit_test(w->sacked, last)) {
		last--;
	}
	if (again && pbox_bit_test(w->sacked, last)) {
		/* Said to hold everything yet no ACK: trust nothing, send it all again. */
		pbox_bitmap_zero(w->sacked, cd->nfrags);
		last = cd->nfrags - 1;
	}
	for (uint32_t f = mode == SEND_PROBE ? last : 0; f <= last; f++) {
		const uint8_t *src = (const uint8_t *)(ln->src + cd->elem_off);
		struct pbox_msg m = {
			.type = ln->kind == PBOX_OP_INIT ? PBOX_MSG_INIT : PBOX_MSG_PUSH,
			.encoding = PBOX_ENC_F32,
			.flags = rflag,
			.iter = ln->kind == PBOX_OP_INIT ? 0 : ln->iter,
			.frag_off = f * n->d->frag_bytes,
			.frag_len = pbox_frag_len(n->d, cd->bytes, f),
		};

		if (again && pbox_bit_test(w->sacked, f)) {
			continue;
		}
		const uint8_t *pl = src + m.frag_off;

		if (dvf_push(n, ln)) {
			/* The bytes encoded when the contribution started: a resend is the
			 * same datagram, the residual is not applied again. */
			pl = pbox_dvf_push_frag(n->dvf, c, i % n->nlanes, f, &m.frag_len,
						&m.encoding);
		}
		if (ln->kind == PBOX_OP_PUSH_PULL) {
			m.flags |= PBOX_F_WANT_REPLY;
		}
		if (f == last) {
			m.flags |= PBOX_F_LAST;
		}
		if (w->crc != NULL) {
			uint32_t crc = n->cfg.crc ? pbox_crc32c(pl, m.frag_len, PBOX_CRC_INIT)
						  : sampled_word(pl, m.frag_len);

			if (!again) {
				w->crc[f] = crc;
			} else if (crc != w->crc[f]) {
				lane_fail(n, ln, -EILSEQ,
					  "%s of key %u (iteration %u): the gradient buffer "
					  "changed while "
					  "its push was in flight (chunk %u fragment %u no longer "
					  "matches "
					  "its version word); the buffer must not be modified "
					  "before the "
					  "operation completes",
					  kind_name(ln->kind), n->d->keys[cd->key].id, ln->iter, c,
					  f);
				return false;
			}
			if (n->cfg.crc) {
				m.flags |= PBOX_F_CRC;
				m.arg1 = crc;
			}
		}
		xmit(n, c, &m, pl);
		w->round_seq = m.seq;
		nsent++;
		bytes += m.frag_len;
	}
	if (again) {
		n->stats.retransmits += nsent;
		n->stats.retransmit_bytes += bytes;
		w->order = ++n->send_order;
		pace(n, bytes, now(n));
	}
	return true;
}

/* What a lane asks the appliance for: a model version (server-optimizer push-pulls: the
 * one after the iteration), an iteration's result, or for broadcast jobs the aggregate
 * result_lag iterations back (pbox_node_submit keeps iter >= result_lag). */
static uint32_t lane_want(const struct pbox_node *n, const struct lane *ln)
{
	if (ln->kind != PBOX_OP_PUSH_PULL) {
		return ln->iter;
	}
	return n->cfg.server_opt ? ln->iter + 1 : ln->iter - n->cfg.result_lag;
}

/* The label a result must have to answer the lane: not older than the staleness bound
 * allows (server-optimizer), or the very iteration (aggregate). */
static bool label_ok(const struct pbox_node *n, const struct lane *ln, uint32_t label)
{
	uint32_t want;

	if (ln->kind != PBOX_OP_PUSH_PULL && ln->kind != PBOX_OP_PULL) {
		return false;
	}
	want = lane_want(n, ln);
	if (!n->cfg.server_opt) {
		return label == want || (n->cfg.accept_newer && label > want);
	}
	return n->cfg.staleness == UINT32_MAX || (uint64_t)label + n->cfg.staleness >= want;
}

/* The PULL that asks the appliance to repeat a possibly lost result. */
static void send_probe(struct pbox_node *n, uint32_t i)
{
	struct lane *ln = wc_lane(n, i);
	struct pbox_msg m = {
		.type = PBOX_MSG_PULL,
		.flags = PBOX_F_RETRANSMIT,
		.iter = lane_want(n, ln),
	};

	add_result_sack(n, wc_chunk(n, i), &n->ch[i], &m);
	n->stats.probes++;
	if (n->relay != NULL && n->ch[i].rgot > 0 && n->ch[i].tries == 1 &&
	    pbox_relay_has_parent(n->relay)) {
		/* TSB: part of the result came down the tree and the rest not within an RTO: ask
		 * the parent's repair cache first; the next request goes to the appliance. */
		m.sender = n->cfg.rank;
		m.chunk = wc_chunk(n, i);
		m.chunk_len = n->d->chunks[m.chunk].bytes;
		m.seq = n->seq++;
		if (pbox_relay_ask_parent(n->relay, &m, n->cfg.tx, n->cfg.tx_ctx) == 0) {
			n->stats.tsb_parent_pulls++;
		}
		return;
	}
	xmit(n, wc_chunk(n, i), &m, NULL);
}

static void arm(struct pbox_node *n, struct wchunk *w, uint64_t t)
{
	w->due_ns = t + w->tmo_ns;
	n->next_due = PBOX_MIN(n->next_due, w->due_ns);
}

/* ---- congestion control and RTO (node.h explains the choice) -------------------------- */

#define MS_NS            1000000ull
#define PTO_MIN_NS       (2ull * MS_NS)     /* the tail-loss probe's default floor */
#define MIN_RTT_EPOCH_NS (10000ull * MS_NS) /* the minimum RTT forgets after 10-20 s */
#define RTO_CLOCK_NS     (1ull * MS_NS)     /* RFC 6298's G: the progress loop sleeps in ms */
#define PACE_SLACK_NS    (2ull * MS_NS)     /* a late wake-up may catch up this much */

static void cc_init(struct pbox_node *n)
{
	uint64_t iw = PBOX_MAX(64u << 10, n->d->chunk_bytes);

	n->unit = PBOX_MAX(n->d->chunk_bytes, 1u);
	n->mss = PBOX_MAX(PBOX_MIN(n->d->frag_bytes, n->d->chunk_bytes), 1u);
	n->cwnd = PBOX_MIN(iw, (uint64_t)n->cfg.window_bytes);
	n->ssthresh = UINT64_MAX;
	n->rto = (uint64_t)n->cfg.rto_ms * MS_NS;
	n->rto_min = (uint64_t)n->cfg.rto_min_ms * MS_NS;
	n->pto_min = n->cfg.pto_min_ms != 0 ? (uint64_t)n->cfg.pto_min_ms * MS_NS : PTO_MIN_NS;
	n->rto_max = (uint64_t)n->cfg.rto_max_ms * MS_NS;
	n->stats.cwnd = n->cwnd;
	n->stats.rto_us = n->rto / 1000;
	n->min_rtt = n->min_prev = n->min_cur = UINT64_MAX;
	n->standing_cur = UINT64_MAX;
}

/* A round-trip time sample r (RFC 6298 section 2; Karn: callers only pass samples of
 * contributions sent once). */
static void rtt_sample(struct pbox_node *n, uint64_t r, uint64_t t)
{
	if (n->srtt == 0) {
		n->srtt = PBOX_MAX(r, 1u);
		n->rttvar = r / 2;
	} else {
		uint64_t d = r > n->srtt ? r - n->srtt : n->srtt - r;

		n->rttvar = (3 * n->rttvar + d) / 4;
		n->srtt = PBOX_MAX((7 * n->srtt + r) / 8, 1u);
	}
	n->rto = n->srtt + PBOX_MAX(RTO_CLOCK_NS, 4 * n->rttvar);
	n->rto = PBOX_MIN(PBOX_MAX(n->rto, PBOX_MAX(n->rto_min, n->pto_adapt)), n->rto_max);
	if (t >= n->min_epoch + MIN_RTT_EPOCH_NS) {
		n->min_prev = n->min_cur;
		n->min_cur = UINT64_MAX;
		n->min_epoch = t;
	}
	n->min_cur = PBOX_MIN(n->min_cur, r);
	n->min_rtt = PBOX_MIN(n->min_prev, n->min_cur);
	if (t >= n->standing_start + n->srtt / 2) {
		n->standing = n->standing_cur != UINT64_MAX ? PBOX_MIN(n->standing_cur, r) : r;
		n->standing_cur = UINT64_MAX;
		n->standing_start = t;
	}
	n->standing_cur = PBOX_MIN(n->standing_cur, r);
	/* Slow start ends when a queue starts to build (HyStart's delay test: three samples
	 * in a row a quarter above the minimum, so one late wake-up of a busy CPU does not
	 * end it), not only at the first loss, which would come after a queue overflowed. */
	if (n->cwnd < n->ssthresh && r > n->min_rtt + PBOX_MAX(n->min_rtt / 4, RTO_CLOCK_NS)) {
		if (++n->ss_high >= 3) {
			n->ssthresh = n->cwnd;
			n->stats.ss_exits++;
		}
	} else {
		n->ss_high = 0;
	}
	n->stats.srtt_us = n->srtt / 1000;
	n->stats.rto_us = n->rto / 1000;
}

/* Bytes of ours queued on the path (Vegas: window x (1 - min RTT / RTT)), with the
 * standing RTT, the least sample of the last half round trip, not the smoothed one:
 * a progress thread or pboxd descheduled for a few ms on a busy machine delays some
 * acknowledgements, not all of them, and must not read as a queue (Copa's filter). */
static uint64_t backlog(const struct pbox_node *n)
{
	uint64_t r = n->standing;

	/* Below HyStart's threshold (a quarter above the minimum, at least 1 ms) is no queue:
	 * on a path whose minimum RTT is 30 us (netlab: a tbf with tokens passes a chunk at
	 * once) a progress thread's or a rate limiter's 0.3 ms read as 90% of the window
	 * queued, and every random loss halved the window, to one chunk at 5% loss (netlab,
	 * 1 Gbit/s: 1050 reductions by 16 KB on average, test_cc_loss: mixed keys). */
	if (r == 0 || n->min_rtt == UINT64_MAX ||
	    r <= n->min_rtt + PBOX_MAX(n->min_rtt / 4, RTO_CLOCK_NS)) {
		return 0;
	}
	return n->cwnd * (r - n->min_rtt) / r;
}

/* bytes of contributions were acknowledged; inflight_before: bytes in flight before. */
static void cc_delivered(struct pbox_node *n, uint64_t bytes, uint64_t inflight_before, uint64_t t)
{
	n->last_delivery = t;
	/* Grow only while the window is what limits sending; an application that submits
	 * little must not inflate it into a burst later (RFC 7661's idea). */
	if (inflight_before + n->unit < PBOX_MIN(n->cwnd, (uint64_t)n->cfg.window_bytes)) {
		return;
	}
	if (n->cwnd < n->ssthresh) {
		n->cwnd += bytes;
	} else {
		n->cwnd += PBOX_MAX(bytes * n->mss / n->cwnd, 1u);
	}
	n->cwnd = PBOX_MIN(n->cwnd, (uint64_t)n->cfg.window_bytes + n->unit);
	n->stats.cwnd = n->cwnd;
}

/*
 * A loss: a contribution timed out, or the appliance reported fragments missing. At most
 * one reduction per round trip (NewReno's recovery). The window shrinks by the bytes the
 * RTT shows queued on the path (Westwood's cwnd = bandwidth x minimum RTT, read as
 * window - backlog), at most by half: a loss with no queue (random loss) costs no rate, a
 * queue overflow drains the queue. (TCP Veno's x0.8 on a random loss, used before, pinned
 * the window near one chunk at 1% loss on a 1 Gbit/s path: 1.4x the loss-free time.)
 * Unlike TCP, a timeout does not restart from one chunk: each chunk has its own timer, the
 * others' acknowledgements keep the ACK clock, and on a busy CPU a late progress thread
 * would otherwise collapse the window for nothing.
 */
static void cc_loss(struct pbox_node *n, uint64_t t, bool timeout)
{
	if (!timeout) {
		n->undo_cwnd = 0; /* the appliance said what is missing: a loss for sure */
	}
	if (t < n->recover_until) {
		return;
	}
	if (timeout && n->undo_cwnd == 0) {
		/* A timer's guess: undone if it proves spurious (judge_timer). */
		n->undo_cwnd = n->cwnd;
		n->undo_ssthresh = n->ssthresh;
	}
	n->cwnd -= PBOX_MIN(backlog(n), n->cwnd / 2);
	n->cwnd = PBOX_MAX(n->cwnd, n->unit);
	n->ssthresh = n->cwnd;
	n->recover_until = t + PBOX_MAX(n->srtt, n->rto_min);
	n->stats.loss_events++;
	n->stats.cwnd = n->cwnd;
}

/* Pacing: bytes leave at gain x cwnd / srtt (2 in slow start, 1.25 after), so a window
 * does not hit a rate limiter's queue as one burst. No pacing before an RTT sample. */
static void pace(struct pbox_node *n, uint64_t bytes, uint64_t t)
{
	uint64_t gain4 = n->cwnd < n->ssthresh ? 8 : 5; /* gain in quarters */
	uint64_t dt;

	if (n->srtt == 0) {
		return;
	}
	dt = bytes * n->srtt * 4 / (n->cwnd * gain4);
	n->pace_next = PBOX_MAX(n->pace_next, t > PACE_SLACK_NS ? t - PACE_SLACK_NS : 0) + dt;
}

/* The first timeout of a send round or of a result that has started to arrive: a tail-loss
 * probe (RFC 8985 section 7) after max(2 SRTT, 2 ms), within the RTO. What it sends is
 * small (the round's last fragment, which asks for a NACK, or a PULL saying which result
 * fragments are here), so a spurious one costs a datagram; each later expiry doubles
 * the timeout. With the RTO's 10 ms floor alone, every lost last fragment or result fragment
 * stalled a chunk for 10 ms where the RTT is 0.5 ms (1 Gbit/s: 5% loss cost 5x). The
 * floor is PTO_MIN_NS unless the transport sets its own (cfg.pto_min_ms: shm). */

static uint64_t pto(const struct pbox_node *n)
{
	if (n->srtt == 0) {
		return PBOX_MAX(n->rto, n->pto_adapt);
	}
	return PBOX_MAX(PBOX_MIN(n->rto, PBOX_MAX(2 * n->srtt, n->pto_min)), n->pto_adapt);
}

/* The same for a result: not with a broadcast tree (TSB), whose relays forward results
 * later than the appliance would send them; there a probe within 2 SRTT asked the
 * appliance for what was still on its way down the tree (test_tsb: the appliance sent
 * 0.7 bytes per byte received instead of 0.35). */
static uint64_t result_pto(const struct pbox_node *n)
{
	return n->relay != NULL ? n->rto : pto(n);
}

/* ---- completion --------------------------------------------------------------------- */

static void op_finish(struct pbox_node *n, struct pbox_op *op)
{
	if (op->status == 0) {
		n->stats.ops_done++;
	} else {
		n->stats.ops_failed++;
	}
	if (n->cfg.done != NULL) {
		n->cfg.done(op, n->cfg.done_arg);
	}
}

static int start_op(struct pbox_node *n, struct pbox_op *op);

/* The lane is finished (all chunks done or failed): free it, complete its op, and give it
 * to the oldest plain push of the same key waiting for one. A waiting push that cannot
 * start (the node has failed, or there is no memory for its copy) fails with the reason,
 * and the next one gets the lane: none is left waiting for a lane no one will free. */
static void lane_finish(struct pbox_node *n, struct lane *ln)
{
	uint32_t key = (uint32_t)(ln - n->lanes) / n->nlanes;
	struct pbox_op *op = ln->op;

	ln->kind = PBOX_OP_NONE;
	ln->op = NULL;
	n->nops--;
	if (op != NULL) {
		op_finish(n, op);
	}
	/* Re-read the list after the callback: it may have queued another push. */
	while (n->pending_head[key] != NULL && ln->kind == PBOX_OP_NONE) {
		struct pbox_op *next = n->pending_head[key];
		int rc;

		n->pending_head[key] = next->next_pending;
		if (n->pending_head[key] == NULL) {
			n->pending_tail[key] = NULL;
		}
		n->nops--; /* start_op counts it again */
		rc = n->failed != 0 ? n->failed : start_op(n, next);
		if (rc != 0) {
			next->status = rc;
			if (next->errmsg[0] == '\0') {
				snprintf(next->errmsg, sizeof(next->errmsg), "%s", n->failmsg);
			}
			op_finish(n, next);
		}
	}
}

/* Leave the wchunk's phase (it no longer needs the network). */
static void chunk_idle(struct pbox_node *n, uint32_t i)
{
	struct wchunk *w = &n->ch[i];

	if (w->phase == PH_SEND) {
		n->inflight--;
		n->inflight_bytes -= n->d->chunks[wc_chunk(n, i)].bytes;
	}
	if (w->phase == PH_SEND || w->phase == PH_WAIT) {
		active_del(n, i);
	}
	w->phase = PH_IDLE;
}

static void chunk_done(struct pbox_node *n, uint32_t i)
{
	struct lane *ln = wc_lane(n, i);

	chunk_idle(n, i);
	if (--ln->chunks_left == 0) {
		lane_finish(n, ln);
	}
}

static void unqueue_lane(struct pbox_node *n, const struct lane *ln)
{
	uint32_t prev = 0, q;

	for (q = n->q_head; q != 0;) {
		uint32_t i = q - 1, next = n->ch[i].next_queued;

		if (wc_lane(n, i) == ln) {
			if (prev) {
				n->ch[prev - 1].next_queued = next;
			} else {
				n->q_head = next;
			}
			if (n->q_tail == q) {
				n->q_tail = prev;
			}
			n->ch[i].next_queued = 0;
		} else {
			prev = q;
		}
		q = next;
	}
}

/* Fail the lane: every one of its wchunks leaves the network, queued ones included. If its
 * op already completed (plain push), the failure can no longer be reported to it: the node
 * fails as a whole, so the next operation reports it. */
static void lane_fail(struct pbox_node *n, struct lane *ln, int err, const char *fmt, ...)
{
	uint32_t key = (uint32_t)(ln - n->lanes) / n->nlanes;
	uint32_t lane = (uint32_t)(ln - n->lanes) % n->nlanes;
	const struct pbox_key *k = &n->d->keys[key];
	char msg[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	for (uint32_t c = k->first_chunk; c < k->first_chunk + k->nchunks; c++) {
		chunk_idle(n, wc_index(n, c, lane));
	}
	unqueue_lane(n, ln);
	if (ln->op != NULL) {
		ln->op->status = err;
		snprintf(ln->op->errmsg, sizeof(ln->op->errmsg), "%s", msg);
	} else if (n->failed == 0) {
		n->failed = err;
		snprintf(n->failmsg, sizeof(n->failmsg), "%s", msg);
		PBOX_LOG_ERR(CLIENT, "%s", msg);
	}
	lane_finish(n, ln);
}

void pbox_node_fail(struct pbox_node *n, int err, const char *msg)
{
	if (n->failed == 0) {
		n->failed = err;
		snprintf(n->failmsg, sizeof(n->failmsg), "%s", msg);
	}
	for (uint32_t k = 0; k < n->d->nkeys; k++) {
		while (n->pending_head[k] != NULL) {
			struct pbox_op *op = n->pending_head[k];

			n->pending_head[k] = op->next_pending;
			n->nops--;
			op->status = err;
			snprintf(op->errmsg, sizeof(op->errmsg), "%s", msg);
			op_finish(n, op);
		}
		n->pending_tail[k] = NULL;
	}
	for (size_t i = 0; i < (size_t)n->d->nkeys * n->nlanes; i++) {
		if (n->lanes[i].kind != PBOX_OP_NONE) {
			lane_fail(n, &n->lanes[i], err, "%s", msg);
		}
	}
}

/* Plain flow: a push is complete for its caller once every chunk has been sent. */
static void maybe_complete_early(struct pbox_node *n, struct lane *ln)
{
	if (n->cfg.plain && ln->kind == PBOX_OP_PUSH && ln->op != NULL && ln->chunks_unsent == 0) {
		struct pbox_op *op = ln->op;

		ln->op = NULL;
		op_finish(n, op);
	}
}

static void start_chunk(struct pbox_node *n, uint32_t i, uint64_t t)
{
	struct wchunk *w = &n->ch[i];
	struct lane *ln = wc_lane(n, i);

	w->phase = PH_SEND;
	w->tries = 1;
	w->tmo_ns = pto(n);
	w->sent_ns = t;
	w->tmo_base = t;
	w->tmo_sent = 0;
	w->order = ++n->send_order;
	w->rgot = 0;
	w->ndone_seen = 0;
	w->stale_seen = UINT32_MAX;
	w->rlabel = UINT32_MAX;
	pbox_bitmap_zero(w->rbits, n->d->chunks[wc_chunk(n, i)].nfrags);
	pbox_bitmap_zero(w->sacked, n->d->chunks[wc_chunk(n, i)].nfrags);
	n->inflight++;
	n->inflight_bytes += n->d->chunks[wc_chunk(n, i)].bytes;
	active_add(n, i);
	arm(n, w, t);
	if (dvf_push(n, ln)) {
		/* Filter once, now: U = R + g, what is not sent stays in R (dvf_push.h). */
		pbox_dvf_push_encode(n->dvf, wc_chunk(n, i), i % n->nlanes,
				     ln->src + n->d->chunks[wc_chunk(n, i)].elem_off, ln->iter);
	}
	send_chunk(n, i, SEND_FIRST);
	ln->chunks_unsent--;
	maybe_complete_early(n, ln);
}

static void start_queued(struct pbox_node *n)
{
	uint64_t t = 0;

	n->pace_wait = false;
	while (n->q_head && n->inflight < n->cfg.max_inflight) {
		uint32_t i = n->q_head - 1;
		uint32_t bytes = n->d->chunks[wc_chunk(n, i)].bytes;

		/* As TCP sends while in flight < cwnd: the window may be passed by less than
		 * one chunk, or a window of 2.9 chunks would only ever carry 2. The
		 * configured cap window_bytes is not passed (one chunk always may). */
		if (n->inflight > 0 && (n->inflight_bytes >= n->cwnd ||
					n->inflight_bytes + bytes > n->cfg.window_bytes)) {
			break;
		}
		if (t == 0) {
			t = now(n);
		}
		if (t < n->pace_next) {
			n->pace_wait = true; /* pbox_node_next_timer wakes us then */
			break;
		}
		n->q_head = n->ch[i].next_queued;
		if (n->q_head == 0) {
			n->q_tail = 0;
		}
		n->ch[i].next_queued = 0;
		start_chunk(n, i, t);
		pace(n, bytes, t);
	}
}

int pbox_node_submit(struct pbox_node *n, struct pbox_op *op)
{
	if (n->failed) {
		op->status = n->failed;
		snprintf(op->errmsg, sizeof(op->errmsg), "%s", n->failmsg);
		return n->failed;
	}
	if (op->key >= n->d->nkeys || op->kind == PBOX_OP_NONE || op->kind > PBOX_OP_INIT) {
		snprintf(op->errmsg, sizeof(op->errmsg), "bad key index %u or operation %d",
			 op->key, op->kind);
		return -EINVAL;
	}
	if (op->kind == PBOX_OP_INIT && !n->cfg.server_opt) {
		snprintf(op->errmsg, sizeof(op->errmsg),
			 "init: job %u aggregates gradients; it keeps no model to initialise",
			 n->cfg.job);
		return -EINVAL;
	}
	if (op->kind == PBOX_OP_PUSH_PULL && op->iter < n->cfg.result_lag) {
		snprintf(op->errmsg, sizeof(op->errmsg),
			 "push-pull of iteration %u: job %u answers iteration t with the "
			 "aggregate of t - %u; push iterations before %u without a pull",
			 op->iter, n->cfg.job, n->cfg.result_lag, n->cfg.result_lag);
		return -EINVAL;
	}
	if (op->kind == PBOX_OP_INIT && n->cfg.rank != 0) {
		snprintf(op->errmsg, sizeof(op->errmsg),
			 "init: only rank 0 supplies initial values (this is rank %u)",
			 n->cfg.rank);
		return -EINVAL;
	}
	return start_op(n, op);
}

/* Start op in a free lane of its key. In plain flow a push that finds every lane busy
 * (its predecessors were sent but are not yet acknowledged) waits for one; otherwise a
 * busy key is -EBUSY. */
static int start_op(struct pbox_node *n, struct pbox_op *op)
{
	const struct pbox_key *k = &n->d->keys[op->key];
	struct lane *ln = NULL;
	uint32_t lane = 0;
	uint64_t t;

	for (lane = 0; lane < n->nlanes; lane++) {
		ln = &n->lanes[op->key * n->nlanes + lane];
		if (ln->kind == PBOX_OP_NONE) {
			break;
		}
	}
	if (lane == n->nlanes && n->cfg.plain && op->kind == PBOX_OP_PUSH) {
		op->status = 0;
		op->errmsg[0] = '\0';
		op->next_pending = NULL;
		if (n->pending_tail[op->key] != NULL) {
			n->pending_tail[op->key]->next_pending = op;
		} else {
			n->pending_head[op->key] = op;
		}
		n->pending_tail[op->key] = op;
		n->nops++;
		return 0;
	}
	if (lane == n->nlanes) {
		ln = &n->lanes[op->key * n->nlanes];
		snprintf(
			op->errmsg, sizeof(op->errmsg),
			"key %u already has %u operation(s) in flight (e.g. a %s of iteration %u); "
			"the job allows %u unacknowledged contribution(s) per chunk: wait first",
			k->id, n->nlanes, kind_name(ln->kind), ln->iter, n->nlanes);
		return -EBUSY;
	}
	if (n->cfg.plain && op->kind == PBOX_OP_PUSH) {
		size_t bytes = k->nelem * sizeof(float);

		/* Plain pushes complete once sent: resends come from the node's copy. */
		if (ln->copy_cap < bytes) {
			float *nc = realloc(ln->copy, bytes);

			if (nc == NULL) {
				snprintf(op->errmsg, sizeof(op->errmsg),
					 "out of memory copying key %u for a plain push", k->id);
				return -ENOMEM;
			}
			ln->copy = nc;
			ln->copy_cap = bytes;
		}
		memcpy(ln->copy, op->src, bytes);
	}
	t = now(n);
	op->lane = lane;
	op->status = 0;
	op->errmsg[0] = '\0';
	op->chunks_left = k->nchunks;
	op->label = UINT32_MAX;
	op->start_ns = t;
	op->deadline_ns = t + (uint64_t)n->cfg.timeout_ms * 1000000ull;
	ln->kind = op->kind;
	ln->iter = op->iter;
	ln->src = n->cfg.plain && op->kind == PBOX_OP_PUSH ? ln->copy : op->src;
	ln->dst = op->dst;
	ln->op = op;
	ln->chunks_left = k->nchunks;
	ln->chunks_unsent = k->nchunks;
	ln->start_ns = t;
	ln->deadline_ns = op->deadline_ns;
	n->next_deadline = PBOX_MIN(n->next_deadline, ln->deadline_ns);
	n->nops++;
	for (uint32_t c = k->first_chunk; c < k->first_chunk + k->nchunks; c++) {
		uint32_t i = wc_index(n, c, lane);
		struct wchunk *w = &n->ch[i];

		w->phase = PH_QUEUED;
		w->next_queued = 0;
		if (n->q_tail) {
			n->ch[n->q_tail - 1].next_queued = i + 1;
		} else {
			n->q_head = i + 1;
		}
		n->q_tail = i + 1;
	}
	start_queued(n);
	return 0;
}

/* ---- receiving ---------------------------------------------------------------------- */

/* The contribution of wchunk i (in PH_SEND) is acknowledged, by an ACK or by the first
 * fragment of its result: feed the congestion window and, if it was sent once, the RTT. */
static void delivered(struct pbox_node *n, uint32_t i, uint64_t t)
{
	struct wchunk *w = &n->ch[i];
	uint32_t core = n->d->chunks[wc_chunk(n, i)].core;

	if (w->tries == 1 && t >= w->sent_ns) {
		rtt_sample(n, t - w->sent_ns, t);
	}
	if (w->tries == 1) {
		n->core_acked[core] = PBOX_MAX(n->core_acked[core], w->order);
	}
	n->core_delivery[core] = t;
	n->core_quiet_sgap[core] = 0;
	cc_delivered(n, n->d->chunks[wc_chunk(n, i)].bytes, n->inflight_bytes, t);
}

/* The interval of probes for a result that waits for slower peers, not for a loss: the
 * wait measured so far (from the ACK to the result's first fragment, smoothed as RFC
 * 6298 smooths RTTs) plus max(4 x its variation, one tail-loss probe timeout), at most
 * four RTOs or four initial RTOs, whichever is more (a slow peer raises the measured
 * wait; the timers probe only overtaken chunks, or one chunk at a time while the core
 * sends nothing: thousands of chunks may wait for a slow peer). Before the measured
 * wait, a lost single-fragment result (a small tensor) stalled its exchange 200 ms: 5%
 * loss cost 5.5x at 1 Gbit/s in netlab. */
static uint64_t probe_slow(const struct pbox_node *n)
{
	return PBOX_MIN(4 * PBOX_MAX(n->rto, (uint64_t)n->cfg.rto_ms * MS_NS), n->rto_max);
}

static uint64_t probe_tmo(const struct pbox_node *n)
{
	uint64_t slow = probe_slow(n);

	if (n->wsrtt == 0 || n->relay != NULL) {
		return slow; /* TSB: see result_pto() */
	}
	return PBOX_MIN(slow, n->wsrtt + PBOX_MAX(4 * n->wvar, pto(n)));
}

/* The first fragment of a result came d ns after its contribution was acknowledged. */
static void wait_sample(struct pbox_node *n, uint64_t d)
{
	if (n->wsrtt == 0) {
		n->wsrtt = PBOX_MAX(d, 1u);
		n->wvar = d / 2;
		return;
	}
	n->wvar = (3 * n->wvar + (d > n->wsrtt ? d - n->wsrtt : n->wsrtt - d)) / 4;
	n->wsrtt = PBOX_MAX((7 * n->wsrtt + d) / 8, 1u);
}

/*
 * The raised probe floor (pto_adapt) decays by a quarter every PTO_DECAY_NS without a new
 * spurious timeout, and at every loss the appliance reports (a NACK). A timer that proves
 * right lowers it too (judge_timer), but a push-pull's contribution is answered by its
 * result, which cannot tell a right timer from a spurious one, so there the floor one
 * scheduling hiccup raised stayed for the job's life, and every later lost tail waited
 * for it (up to rto_max / 4). A stall that recurs raises it again, at the cost of one
 * probe per quiet core (test_cc_loss test_floor_decays_after_stall).
 */
#define PTO_DECAY_NS (100ull * 1000 * 1000)

static void floor_decay(struct pbox_node *n, uint64_t t)
{
	if (n->pto_adapt == 0) {
		return;
	}
	if (t - n->pto_adapt_t >= PTO_DECAY_NS) {
		n->pto_adapt -= n->pto_adapt / 4;
		if (n->pto_adapt < n->pto_min) {
			n->pto_adapt = 0; /* below the floor every probe has anyway */
		}
		n->pto_adapt_t = t;
		n->stats.pto_floor_us = n->pto_adapt / 1000;
	}
}

/* wchunk.tmo_sent: what the timer sent, to be judged by the answer (judge_timer) */
#define TMO_SENT  1 /* a resend or a probe after the chunk's own timeout */
#define TMO_QUIET 2 /* a probe while the chunk's core answered nothing (timers) */

/*
 * Spurious timeouts (node.h). The timer of wchunk i re-sent or probed (tmo_sent) and an
 * answer came: to the original (the timer fired too early: a descheduled thread, a queue,
 * a peer's wait, nothing lost) or to what the timer sent? verdict > 0: spurious, 0: the
 * timer was right, < 0: cannot tell. result: the answer is a waiting chunk's first result
 * fragment (its probes are paced by the timers' per-core rules, not by a floor: a peer's
 * wait says nothing about the path, and a floor raised by it delays the recovery of lost
 * results; test_cc_loss small keys: 25 -> 38 ms per exchange at 5% loss).
 */
static void judge_timer(struct pbox_node *n, uint32_t i, int verdict, uint64_t t, bool result)
{
	struct wchunk *w = &n->ch[i];
	uint32_t core = n->d->chunks[wc_chunk(n, i)].core;
	uint8_t sent = w->tmo_sent;

	if (sent == 0) {
		return;
	}
	w->tmo_sent = 0;
	if (verdict < 0) {
		return;
	}
	if (result) {
		if (verdict > 0) {
			n->stats.spurious_probes++;
		} else if (sent == TMO_QUIET) {
			/* It recovered a lost result: the core's quiet was a loss, the next
			 * quiet probe may go at once. */
			n->core_quiet_probe[core] = 0;
			n->core_quiet_gap[core] = 0;
		}
		return;
	}
	if (verdict > 0) {
		uint64_t d = t > w->tmo_base ? t - w->tmo_base : 0;

		/* Eifel (RFC 3522, response RFC 4015): the original was answered, so the
		 * timeout came from delay. Cover the delay seen with a quarter of margin
		 * (RACK's reordering window grows in quarters), at most a quarter of rto_max,
		 * and give back the window the timeout took. */
		n->pto_adapt = PBOX_MIN(PBOX_MAX(n->pto_adapt, d + d / 4), n->rto_max / 4);
		n->pto_adapt_t = t;
		n->rto = PBOX_MAX(n->rto, n->pto_adapt); /* and the RTO (RFC 4015's response) */
		n->stats.rto_us = n->rto / 1000;
		n->stats.spurious_retx++;
		if (n->undo_cwnd != 0) {
			n->cwnd = PBOX_MAX(n->cwnd, n->undo_cwnd);
			n->ssthresh = PBOX_MAX(n->ssthresh, n->undo_ssthresh);
			n->recover_until = 0;
			n->undo_cwnd = 0;
			n->stats.loss_undone++;
			n->stats.cwnd = n->cwnd;
		}
	} else {
		/* A loss the timer recovered: the floor decays (RACK shrinks its reordering
		 * window again after recoveries without DSACKs). The answer is the resend's:
		 * what was sent before it and is still unanswered is overtaken (timers), and
		 * after a quiet core's probe the next may go at once. */
		n->pto_adapt -= n->pto_adapt / 4;
		n->undo_cwnd = 0;
		if (w->phase == PH_SEND) {
			n->core_acked[core] = PBOX_MAX(n->core_acked[core], w->order);
		}
		if (sent == TMO_QUIET) {
			n->core_quiet_send[core] = 0;
			n->core_quiet_sgap[core] = 0;
		}
	}
	n->stats.pto_floor_us = n->pto_adapt / 1000;
}

/* A push-pull's contribution is known consumed: stop sending its data (the wchunk leaves
 * the in-flight window) and from now on only probe, after tmo, for a lost result. */
static void enter_wait(struct pbox_node *n, uint32_t i, uint64_t tmo)
{
	struct wchunk *w = &n->ch[i];

	n->inflight--;
	n->inflight_bytes -= n->d->chunks[wc_chunk(n, i)].bytes;
	w->phase = PH_WAIT;
	w->tries = 0;
	w->tmo_ns = tmo;
	w->sent_ns = now(n); /* the wait starts: wait_sample() */
	w->tmo_base = w->sent_ns;
	w->tmo_sent = 0;
	arm(n, w, w->sent_ns);
}

/* A NACK for wchunk i (in PH_SEND): note what the appliance holds and, if it answers the
 * latest send round, re-send the rest now (a loss for the window). Returns false if the
 * lane failed (its buffer changed). */
static bool on_nack(struct pbox_node *n, uint32_t i, const struct pbox_msg *m)
{
	struct wchunk *w = &n->ch[i];
	uint32_t nf = n->d->chunks[wc_chunk(n, i)].nfrags;
	uint32_t base = m->frag_off / n->d->frag_bytes;
	uint64_t t = now(n);

	for (uint32_t f = 0; f < nf; f++) {
		if (pbox_sack_has(base, m->sack, f)) {
			pbox_bit_set(w->sacked, f);
		}
	}
	if (m->arg0 != w->round_seq) {
		return true; /* answers an older round; the latest one is still on its way */
	}
	n->stats.nacks++;
	judge_timer(n, i, 0, t, false); /* fragments were missing: not spurious */
	/* a loss the appliance proved: the path drops data, timers are not too eager */
	n->pto_adapt -= n->pto_adapt / 4;
	n->stats.pto_floor_us = n->pto_adapt / 1000;
	cc_loss(n, t, false);
	w->tries++; /* Karn: no RTT sample from this contribution */
	w->tmo_ns = pto(n);
	w->tmo_base = t;
	arm(n, w, t);
	return send_chunk(n, i, SEND_MISSING);
}

static void on_ack(struct pbox_node *n, uint32_t c, const struct pbox_msg *m)
{
	for (uint32_t l = 0; l < n->nlanes; l++) {
		uint32_t i = wc_index(n, c, l);
		struct wchunk *w = &n->ch[i];
		struct lane *ln = wc_lane(n, i);

		if (w->phase != PH_SEND && w->phase != PH_WAIT) {
			continue;
		}
		if (m->flags & PBOX_F_RETRY) {
			/* The appliance's window moved: a refused push may go now. */
			if (w->phase == PH_SEND && ln->kind != PBOX_OP_PULL) {
				w->tmo_ns = n->rto;
				w->tries++; /* Karn: no RTT sample from this contribution */
				w->tmo_base = now(n);
				w->tmo_sent = 0;
				arm(n, w, w->tmo_base);
				n->stats.retry_hints++;
				if (!send_chunk(n, i, SEND_MISSING)) {
					break; /* the lane failed; queued chunks may go below */
				}
			}
			continue;
		}
		if (ln->kind == PBOX_OP_PULL || m->iter != ln->iter ||
		    (ln->kind == PBOX_OP_INIT) != ((m->flags & PBOX_F_OF_INIT) != 0)) {
			continue; /* not this lane's contribution */
		}
		w->ndone_seen = m->arg1;
		if (m->flags & PBOX_F_SACK) {
			if (w->phase == PH_SEND && !on_nack(n, i, m)) {
				break; /* the lane failed */
			}
			continue;
		}
		if (w->phase == PH_WAIT || (m->flags & PBOX_F_STATUS)) {
			continue; /* the answer to a probe: only the count is news */
		}
		/* arg0 echoes the seq of the datagram that completed the contribution (0: not
		 * said): one sent before the timer's is the original (Eifel's timestamp). */
		judge_timer(n, i,
			    m->arg0 == 0                          ? -1
			    : (int32_t)(m->arg0 - w->tmo_seq) < 0 ? 1
								  : 0,
			    now(n), false);
		delivered(n, i, now(n));
		if (ln->kind == PBOX_OP_PUSH_PULL) {
			/* The data is in; from now on only probe for a lost result. */
			enter_wait(n, i, probe_tmo(n));
			continue;
		}
		chunk_done(n, i);
	}
	start_queued(n);
}

/* After copying an in-place payload: whether its memory was not rewritten meanwhile. */
static bool rx_gen_still(const struct pbox_node *n)
{
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	return __atomic_load_n(n->rx_gen, __ATOMIC_RELAXED) == n->rx_gen_want;
}

/*
 * Copy a result fragment into the caller's buffer. Results go to a buffer far larger
 * than the caches (a model's gradient), which the caller reads after the whole exchange:
 * an ordinary copy first reads every destination line it is about to overwrite (the
 * cache's read-for-ownership), non-temporal stores do not, so large fragments are
 * streamed (PBOX_RESULT_STREAM=0: ordinary copies).
 */
#define STREAM_MIN 4096u

static bool g_stream_off;
static bool g_stream_init;

static void result_copy(uint8_t *to, const uint8_t *from, uint32_t len)
{
#ifdef __SSE2__
	if (!g_stream_init) {
		const char *v = getenv("PBOX_RESULT_STREAM");

		g_stream_off = v != NULL && strcmp(v, "0") == 0;
		g_stream_init = true;
	}
	if (len >= STREAM_MIN && !g_stream_off) {
		pbox_copy_stream(to, from, len);
		_mm_sfence(); /* ordered before the completion that hands the buffer over */
		return;
	}
#endif
	memcpy(to, from, len);
}

static void on_data(struct pbox_node *n, uint32_t c, const struct pbox_msg *m)
{
	const struct pbox_chunk_desc *cd = &n->d->chunks[c];
	uint32_t f = m->frag_off / n->d->frag_bytes;
	bool asked = false;
	struct pbox_dvf_view v;

	if (m->encoding == PBOX_ENC_DVF) {
		/* A filtered result: validated in full before any lane takes it. */
		enum pbox_dvf_reject why;

		if (pbox_dvf_push_decode(n->dvf, m->payload, m->frag_len,
					 pbox_frag_len(n->d, cd->bytes, f) / 4, &v, &why) != 0) {
			n->stats.drops[PBOX_DROP_BAD_BLOCK]++;
			return;
		}
	}

	/* Did another request of ours (an acknowledged push-pull, or a pull) ask for a result
	 * this label answers? Then it may not answer a push-pull still sending (below). */
	for (uint32_t l = 0; l < n->nlanes; l++) {
		uint32_t i = wc_index(n, c, l);
		const struct lane *ln = wc_lane(n, i);
		uint8_t ph = n->ch[i].phase;

		if ((ph == PH_WAIT || (ph == PH_SEND && ln->kind == PBOX_OP_PULL)) &&
		    label_ok(n, ln, m->iter)) {
			asked = true;
		}
	}
	for (uint32_t l = 0; l < n->nlanes; l++) {
		uint32_t i = wc_index(n, c, l);
		struct wchunk *w = &n->ch[i];
		struct lane *ln = wc_lane(n, i);
		bool unacked;
		int respun;

		if (w->phase != PH_SEND && w->phase != PH_WAIT) {
			continue;
		}
		if (!label_ok(n, ln, m->iter)) {
			if (ln->kind == PBOX_OP_PUSH_PULL || ln->kind == PBOX_OP_PULL) {
				n->stats.stale_results++;
				w->stale_seen = m->iter;
			}
			continue;
		}
		/*
		 * A result for a push-pull whose data is not acknowledged: the last contributor
		 * of an iteration gets the result instead of an ACK. The appliance answers a
		 * push only once it holds all of the push's fragments, a push-pull asks with
		 * a PULL only after its ACK, and a held request is forgotten once answered
		 * (engine answer()), so the first fragment of a result
		 * acknowledges the data: from then on the node never reads or resends the
		 * source again and only probes for fragments still missing. This is what
		 * makes an in-place push-pull (src == dst) safe under loss: result fragments
		 * overwrite the source, and a resend from it would send a mix of gradient and
		 * result (or, with version words, fail with EILSEQ). Staging results (or
		 * copying the source) when src == dst would cost a copy of every key per
		 * iteration for a case the protocol already rules out.
		 * Exception: while another lane of ours asked for this label, the fragment
		 * may answer that request instead; this lane then keeps its source intact
		 * (takes nothing) and gets its own answer when it resends.
		 */
		unacked = w->phase == PH_SEND && ln->kind == PBOX_OP_PUSH_PULL;
		if (unacked && asked) {
			continue;
		}
		if (m->iter != w->rlabel) {
			/* A newer version than the one being collected: start over with it.
			 * Older ones are ignored so a late duplicate cannot mix versions. */
			if (w->rlabel != UINT32_MAX && m->iter < w->rlabel) {
				continue;
			}
			w->rlabel = m->iter;
			w->rgot = 0;
			pbox_bitmap_zero(w->rbits, cd->nfrags);
		}
		if (pbox_bit_test(w->rbits, f)) {
			n->stats.dup_frags++;
			continue;
		}
		/* The appliance flags what it sends again for a resend or a probe: a result
		 * that is not flagged answers the original request, so a timer that fired
		 * before it was spurious. */
		respun = (m->flags & PBOX_F_RETRANSMIT) ? 0 : 1;
		n->core_res_t[cd->core] = now(n);
		n->core_quiet_gap[cd->core] = 0;
		if (unacked) {
			/* The rest of the result is on its way: a probe is due after one
			 * retransmission timeout, not after the slower probe pace. An
			 * unflagged result says nothing here: a resend that found the push
			 * complete is held like the original and released unflagged. */
			judge_timer(n, i, -1, now(n), false);
			delivered(n, i, now(n));
			enter_wait(n, i, result_pto(n));
		} else if (w->phase == PH_WAIT && w->rgot == 0) {
			/* The result has started to arrive: the rest follows within about an
			 * RTT, so a fragment lost on the way is asked for after one RTO, not
			 * after the probe pace meant for results that wait for peers. */
			judge_timer(n, i, respun, now(n), true);
			n->core_res[cd->core] = PBOX_MAX(n->core_res[cd->core], w->order);
			wait_sample(n, now(n) - w->sent_ns); /* probes or not: a lost one
								  only raises it */
			w->tries = 0;
			w->tmo_ns = result_pto(n);
			w->tmo_base = now(n);
			arm(n, w, now(n));
			w->ndone_seen = n->d->nworkers; /* a result: the iteration had its quorum */
		} else if (w->phase == PH_WAIT) {
			judge_timer(n, i, respun, now(n), false); /* the rest of a result */
		}
		pbox_bit_set(w->rbits, f);
		if (m->encoding == PBOX_ENC_DVF) {
			pbox_dvf_push_expand(n->dvf, &v, ln->dst + cd->elem_off + m->frag_off / 4);
		} else {
			uint8_t *to = (uint8_t *)(ln->dst + cd->elem_off) + m->frag_off;

			/* Received in place (pbox_node_rx_burst): nothing to copy. */
			if (to != m->payload) {
				result_copy(to, m->payload, m->frag_len);
			}
			if (pbox_unlikely(n->rx_gen != NULL) && !rx_gen_still(n)) {
				pbox_bit_clear(w->rbits, f); /* torn: not received */
				n->stats.torn_frags++;
				continue;
			}
		}
		n->place_next = c + 1; /* the next results are expected from here on */
		n->place_core = cd->core;
		if (++w->rgot == cd->nfrags) {
			if (ln->op != NULL) {
				ln->op->label = m->iter;
			}
			chunk_done(n, i);
		}
	}
	start_queued(n);
}

static void on_error(struct pbox_node *n, uint32_t c, const struct pbox_msg *m)
{
	int err = (int)m->arg0;
	const char *why;

	switch (err) {
	case ECONNABORTED:
		why = "the appliance aborted the job (see pboxd's log; a worker may have left)";
		break;
	case EAGAIN:
		why = "the model has not been initialised yet (rank 0 must call pbox_init for "
		      "every key before anyone pushes)";
		break;
	case ESTALE:
		why = "the appliance no longer keeps that result (the request is too old)";
		break;
	case EDOM:
		/* Only contributions are checked: the lanes failed below are pushes or
		 * inits; what holds the values is named per lane. */
		why = " holds NaN or Inf and the job rejects non-finite values (non_finite = "
		      "\"reject\")";
		break;
	case EOVERFLOW:
		why = "the job reached the appliance's iteration limit (PBOX_ITER_LIMIT, about "
		      "2^32 iterations or model versions per session)";
		break;
	default:
		why = strerror(err);
		break;
	}
	if (err <= 0 || err > 4095) {
		err = EPROTO;
	}
	for (uint32_t l = 0; l < n->nlanes; l++) {
		uint32_t i = wc_index(n, c, l);
		struct wchunk *w = &n->ch[i];
		struct lane *ln = wc_lane(n, i);

		if ((w->phase != PH_SEND && w->phase != PH_WAIT) ||
		    (m->iter != ln->iter && err != ECONNABORTED)) {
			continue;
		}
		lane_fail(n, ln, -err,
			  "%s of key %u (chunk %u, iteration %u) refused by the appliance: %s%s",
			  kind_name(ln->kind), n->d->keys[n->d->chunks[c].key].id, c, ln->iter,
			  err != EDOM                ? ""
			  : ln->kind == PBOX_OP_INIT ? "the initial model"
						     : "the gradient",
			  why);
	}
}

/* Whether from is the data-plane endpoint (address and port) of appliance core `core`, or
 * of any of its cores (core UINT32_MAX). A worker sends each chunk to the core that owns
 * it, and that core answers from the same endpoint. */
static bool from_appliance(const struct pbox_node *n, const struct pbox_peer *from, uint32_t core)
{
	if (from == NULL) {
		return false;
	}
	for (uint32_t k = core == UINT32_MAX ? 0 : core;
	     k < (core == UINT32_MAX ? n->d->ncores : core + 1); k++) {
		/* An appliance announced as 0.0.0.0 (a local test set-up) answers from
		 * whichever local address routing picks: only the port can be checked. */
		if ((n->cfg.cores[k].ip == from->ip || n->cfg.cores[k].ip == 0) &&
		    n->cfg.cores[k].port == from->port) {
			return true;
		}
	}
	return false;
}

int pbox_node_tsb_key(struct pbox_node *n, const struct pbox_tsb_key *key)
{
	if (n->relay == NULL) {
		n->relay = calloc(1, sizeof(*n->relay));
		if (n->relay == NULL) {
			return -ENOMEM;
		}
	} else {
		pbox_relay_fini(n->relay);
	}
	if (pbox_relay_init(n->relay, n->cfg.job, n->d, key, n->cfg.relay_cache_bytes) != 0) {
		free(n->relay);
		n->relay = NULL;
		return -ENOMEM;
	}
	/* DVF-filtered results come down the tree as the appliance's blocks. */
	n->relay->wire.accepts_dvf = n->wire.accepts_dvf;
	return 0;
}

int pbox_node_tsb_position(struct pbox_node *n, const struct pbox_tsb_pos *pos)
{
	if (n->relay == NULL) {
		return -EINVAL;
	}
	if (pbox_relay_set_position(n->relay, pos) != 0) {
		PBOX_LOG_WARN(CLIENT,
			      "rank %u: no memory for the relay's repair cache: its children "
			      "repair from the appliance",
			      n->cfg.rank);
	}
	return 0;
}

/* A broadcast fragment (relay.h): check it, forward it to the children, then take our
 * own copy as any result fragment. */
static void tree_rx(struct pbox_node *n, const void *pkt, uint32_t len,
		    const struct pbox_peer *from)
{
	enum pbox_drop_reason r;
	struct pbox_msg m;

	r = pbox_relay_check(n->relay, pkt, len, &m);
	if (r != PBOX_DROP_NONE) {
		n->stats.drops[r]++;
		return;
	}
	if (!pbox_relay_from_parent(n->relay, from) &&
	    !from_appliance(n, from, n->d->chunks[m.chunk].core)) {
		n->stats.tsb_not_parent++;
		return;
	}
	if (!pbox_relay_verify(n->relay, pkt, len)) {
		n->stats.tsb_bad_mac++;
		return;
	}
	n->stats.tsb_rx++;
	n->stats.tsb_fwd += pbox_relay_forward(n->relay, pkt, len, n->cfg.tx, n->cfg.tx_ctx);
	pbox_relay_keep(n->relay, pkt, len, &m);
	on_data(n, m.chunk, &m);
}

/* pbox_node_rx; payload, if not NULL, is where the datagram's payload is (received in
 * place), pkt being its header. */
static void node_rx(struct pbox_node *n, const void *pkt, uint32_t len,
		    const struct pbox_peer *from, const void *payload)
{
	const struct pbox_wire_job *j;
	enum pbox_drop_reason r;
	struct pbox_msg m;

	n->stats.rx_pkts++;
	n->stats.rx_bytes += len;
	if (n->relay != NULL && pbox_relay_is_tree(pkt, len)) {
		tree_rx(n, pkt, len, from);
		return;
	}
	if (n->relay != NULL && len >= PBOX_WIRE_HDR_LEN &&
	    ((const struct pbox_wire_hdr *)pkt)->type == PBOX_MSG_PULL) {
		/* A child asks for a repair (relay.h). */
		enum pbox_drop_reason why;
		int k = pbox_relay_serve(n->relay, pkt, len, from, n->cfg.tx, n->cfg.tx_ctx, &why);

		if (k >= 0) {
			n->stats.tsb_served += (uint64_t)k;
		} else if (why != PBOX_DROP_NONE) {
			n->stats.drops[why]++;
		} else {
			n->stats.foreign++;
		}
		return;
	}
	/* Only the appliance talks to a worker: anything from elsewhere is dropped unread
	 * (then, once the chunk is known, anything not from the core that owns it). */
	if (!from_appliance(n, from, UINT32_MAX)) {
		n->stats.foreign++;
		return;
	}
	r = pbox_wire_validate(pkt, len, PBOX_ROLE_WORKER, lookup, n, &m, &j);
	if (r != PBOX_DROP_NONE) {
		n->stats.drops[r]++;
		return;
	}
	if (payload != NULL && m.payload != NULL) {
		m.payload = payload;
	}
	if (!from_appliance(n, from, n->d->chunks[m.chunk].core)) {
		n->stats.foreign++;
		return;
	}
	switch (m.type) {
	case PBOX_MSG_ACK:
		on_ack(n, m.chunk, &m);
		break;
	case PBOX_MSG_DATA:
		on_data(n, m.chunk, &m);
		break;
	case PBOX_MSG_ERROR:
		on_error(n, m.chunk, &m);
		break;
	default:
		n->stats.drops[PBOX_DROP_UNEXPECTED]++;
		break;
	}
}

void pbox_node_rx_split(struct pbox_node *n, const void *hdr, const void *payload, uint32_t len,
			const uint64_t *gen, uint64_t want, const struct pbox_peer *from)
{
	const struct pbox_wire_job *j;
	enum pbox_drop_reason r;
	struct pbox_msg m;

	n->stats.rx_pkts++;
	n->stats.rx_bytes += PBOX_WIRE_HDR_LEN + (uint64_t)len;
	if (!from_appliance(n, from, UINT32_MAX)) {
		n->stats.foreign++;
		return;
	}
	/* Decoding reads the header only; the payload is set below. */
	r = pbox_wire_validate(hdr, PBOX_WIRE_HDR_LEN + (size_t)len, PBOX_ROLE_WORKER, lookup, n,
			       &m, &j);
	if (r != PBOX_DROP_NONE) {
		n->stats.drops[r]++;
		return;
	}
	if (!from_appliance(n, from, n->d->chunks[m.chunk].core)) {
		n->stats.foreign++;
		return;
	}
	if (m.type != PBOX_MSG_DATA || (n->relay != NULL && (m.flags & PBOX_F_TREE))) {
		n->stats.drops[PBOX_DROP_UNEXPECTED]++;
		return;
	}
	m.payload = payload;
	n->rx_gen = gen;
	n->rx_gen_want = want;
	on_data(n, m.chunk, &m);
	n->rx_gen = NULL;
}

void pbox_node_rx(struct pbox_node *n, const void *pkt, uint32_t len, const struct pbox_peer *from)
{
	node_rx(n, pkt, len, from, NULL);
}

/* ---- receive placement (node.h) -------------------------------------------------------- */

#define PLACE_MAX   64u  /* places offered per receive, at most */
#define PLACE_SCAN  512u /* chunks looked at per receive to find them */
#define PLACE_BURST 256u /* datagrams per pbox_node_rx_burst that can be placed */

/* Whether lane ln's result slots are dead until filled: a pull, or a push-pull whose
 * source cannot be read again (acknowledged) or does not overlap its dst. */
static bool lane_dst_dead(const struct pbox_node *n, const struct lane *ln, const struct wchunk *w,
			  uint32_t c)
{
	size_t bytes;

	if (ln->dst == NULL || (ln->kind != PBOX_OP_PULL && ln->kind != PBOX_OP_PUSH_PULL)) {
		return false;
	}
	if (ln->kind == PBOX_OP_PULL || w->phase == PH_WAIT) {
		return true;
	}
	bytes = (size_t)n->d->keys[n->d->chunks[c].key].nelem * sizeof(float);
	return (const uint8_t *)ln->src >= (const uint8_t *)ln->dst + bytes ||
	       (const uint8_t *)ln->dst >= (const uint8_t *)ln->src + bytes;
}

/* Offer chunk c's missing result fragments (of the first lane that collects one into a
 * dead buffer). */
static unsigned place_chunk(struct pbox_node *n, uint32_t c, struct pbox_node_place *out,
			    unsigned k, unsigned want)
{
	const struct pbox_chunk_desc *cd = &n->d->chunks[c];

	for (uint32_t l = 0; l < n->nlanes; l++) {
		uint32_t i = wc_index(n, c, l);
		struct wchunk *w = &n->ch[i];
		struct lane *ln = wc_lane(n, i);
		unsigned k0 = k;

		if ((w->phase != PH_SEND && w->phase != PH_WAIT) || !lane_dst_dead(n, ln, w, c)) {
			continue;
		}
		for (uint32_t f = 0; f < cd->nfrags && k < want; f++) {
			if (w->rgot > 0 && pbox_bit_test(w->rbits, f)) {
				continue;
			}
			out[k].frag_off = f * n->d->frag_bytes;
			out[k].len = pbox_frag_len(n->d, cd->bytes, f);
			out[k].chunk = c;
			out[k].dst = (uint8_t *)(ln->dst + cd->elem_off) + out[k].frag_off;
			k++;
		}
		if (k > k0) {
			break; /* one lane per chunk: the others' slots stay untouched */
		}
	}
	return k;
}

/*
 * Which results come next: an appliance core sends its results about in the order the
 * chunks were pushed (their index order), and the socket sees long runs from one core
 * (its sendmmsg bursts). So the places are the chunks after the last result accepted, of
 * the same core, in index order; before the first, the oldest outstanding chunks.
 */
/* A miss costs about what a hit saves (the kernel writes a cold slot of the caller's
 * buffer that the right fragment overwrites later): ask for about as many places as
 * recent bursts' runs of hits were long (pbox_node_rx_burst adapts place_n). */
unsigned pbox_node_rx_place_want(const struct pbox_node *n)
{
	return PBOX_MAX(n->place_n, 1u);
}

unsigned pbox_node_rx_places(struct pbox_node *n, struct pbox_node_place *out, unsigned max)
{
	unsigned k = 0, want;
	uint32_t nc = n->d->nchunks, core;

	if (n->wire.accepts_dvf || n->relay != NULL || n->failed || n->active_tail == 0) {
		return 0; /* results may come encoded or down the tree; or none is due */
	}
	if (n->place_next == 0) {
		uint32_t c = wc_chunk(n, n->active_tail - 1);

		n->place_next = c + 1;
		n->place_core = n->d->chunks[c].core;
	}
	want = PBOX_MIN(max, PLACE_MAX);
	core = n->place_core;
	/* That core's run first; if it has fewer results due, the other cores' next. */
	for (int pass = 0; pass < 2 && k < want; pass++) {
		for (uint32_t s = 0, c = (n->place_next - 1) % nc;
		     s < PBOX_MIN(nc, PLACE_SCAN) && k < want; s++, c = c + 1 == nc ? 0 : c + 1) {
			if ((n->d->chunks[c].core == core) == (pass == 0)) {
				k = place_chunk(n, c, out, k, want);
			}
		}
	}
	return k;
}

/* Whether a header decodes as a plain (F32, not tree) result fragment. */
static bool plain_data(const struct pbox_rx_pkt *p, struct pbox_msg *m)
{
	return pbox_wire_decode(p->data, p->len, m) == PBOX_DROP_NONE && m->type == PBOX_MSG_DATA &&
	       m->encoding == PBOX_ENC_F32 && !(m->flags & PBOX_F_TREE);
}

void pbox_node_rx_burst(struct pbox_node *n, const struct pbox_rx_pkt *pkts, unsigned count,
			const struct pbox_node_place *place, unsigned nplace, int16_t *placed)
{
	/*
	 * Before anything is accepted: a placed datagram goes back behind its header, whole,
	 * if it is not a plain result fragment, or if another datagram of the burst carries
	 * its place's fragment (that one could be accepted into the place while this payload
	 * still sits there). Every other placed datagram is handled where it is: the one its
	 * place expects is taken with no copy; another one (a miss) is copied from the place
	 * to where it belongs, one copy as without placement, and leaves the place dead.
	 */
	uint64_t frag[PLACE_BURST]; /* per datagram: chunk << 32 | frag_off, or ~0 */
	bool any = false;

	for (unsigned k = 0; placed != NULL && k < count; k++) {
		any |= placed[k] >= 0;
	}
	for (unsigned k = 0; any && k < count && k < PLACE_BURST; k++) {
		struct pbox_msg m;

		frag[k] = pbox_wire_decode(pkts[k].data, pkts[k].len, &m) == PBOX_DROP_NONE &&
					  m.type == PBOX_MSG_DATA
				  ? (uint64_t)m.chunk << 32 | m.frag_off
				  : UINT64_MAX;
	}
	for (unsigned k = 0; any && k < count; k++) {
		const struct pbox_node_place *pl;
		struct pbox_msg m;
		uint64_t want;
		bool ok;

		if (placed[k] < 0) {
			continue;
		}
		pl = (unsigned)placed[k] < nplace ? &place[placed[k]] : NULL;
		/* (A burst longer than the table is handled whole, unplaced.) */
		ok = pl != NULL && count <= PLACE_BURST && plain_data(&pkts[k], &m) &&
		     m.frag_len == pl->len;
		want = pl != NULL ? (uint64_t)pl->chunk << 32 | pl->frag_off : 0;
		for (unsigned j = 0; ok && j < count; j++) {
			if (j != k && frag[j] == want) {
				ok = false;
			}
		}
		if (!ok) {
			if (pl != NULL && pkts[k].len > PBOX_WIRE_HDR_LEN) {
				memcpy((uint8_t *)pkts[k].data + PBOX_WIRE_HDR_LEN, pl->dst,
				       PBOX_MIN(pkts[k].len - PBOX_WIRE_HDR_LEN, pl->len));
			}
			placed[k] = -1;
			n->stats.rx_unplaced++;
		} else if (frag[k] == want) {
			n->stats.rx_placed++;
		} else {
			n->stats.rx_unplaced++;
		}
	}
	if (placed != NULL && nplace > 0 && count > 0) {
		/* The run of hits from the first place on (a miss shifts every later datagram
		 * off its place): grow while all hit, else move half way to the run. */
		unsigned h = 0, filled = PBOX_MIN(nplace, count);

		while (h < filled && placed[h] == (int16_t)h &&
		       frag[h] == ((uint64_t)place[h].chunk << 32 | place[h].frag_off)) {
			h++;
		}
		if (h == filled && filled == nplace) {
			n->place_n = PBOX_MIN(n->place_n + n->place_n / 2 + 1, PLACE_MAX);
		} else if (h < filled) {
			n->place_n = (n->place_n + h) / 2;
		}
	}
	for (unsigned k = 0; k < count; k++) {
		node_rx(n, pkts[k].data, pkts[k].len, &pkts[k].from,
			placed != NULL && placed[k] >= 0 ? place[placed[k]].dst : NULL);
	}
}

/* ---- timers ------------------------------------------------------------------------- */

/* Whether wchunk i sends a contribution (its timeouts are losses), not a pull request. */
static bool ln_kind_sends_data(struct pbox_node *n, uint32_t i)
{
	return wc_lane(n, i)->kind != PBOX_OP_PULL;
}

static void timeout_lane(struct pbox_node *n, struct lane *ln, uint64_t t)
{
	uint32_t key = (uint32_t)(ln - n->lanes) / n->nlanes;
	uint32_t lane = (uint32_t)(ln - n->lanes) % n->nlanes;
	const struct pbox_key *k = &n->d->keys[key];
	uint32_t queued = 0, sending = 0, waiting = 0, minseen = UINT32_MAX, stale = UINT32_MAX;
	double secs = (double)(t - ln->start_ns) / 1e9;
	char peer[64] = "";

	for (uint32_t c = k->first_chunk; c < k->first_chunk + k->nchunks; c++) {
		struct wchunk *w = &n->ch[wc_index(n, c, lane)];

		if (w->phase == PH_QUEUED) {
			queued++;
		} else if (w->phase == PH_SEND) {
			sending++;
		} else if (w->phase == PH_WAIT) {
			waiting++;
			minseen = PBOX_MIN(minseen, w->ndone_seen);
		}
		if (w->phase != PH_IDLE && w->stale_seen != UINT32_MAX) {
			stale = w->stale_seen;
		}
		if (w->phase != PH_IDLE && peer[0] == '\0') {
			const struct pbox_peer *p = &n->cfg.cores[n->d->chunks[c].core];
			const uint8_t *ip = (const uint8_t *)&p->ip;

			snprintf(peer, sizeof(peer), "%u.%u.%u.%u:%u", ip[0], ip[1], ip[2], ip[3],
				 (unsigned)__builtin_bswap16(p->port));
		}
	}
	if (stale != UINT32_MAX) {
		lane_fail(n, ln, -ETIMEDOUT,
			  "%s of key %u (iteration %u) timed out after %.1f s: the appliance only "
			  "offered model version %u, staler than the job's bound of %u iterations "
			  "allows",
			  kind_name(ln->kind), k->id, ln->iter, secs, stale, n->cfg.staleness);
	} else if (sending > 0 && waiting == 0 && ln->chunks_left == k->nchunks &&
		   ln->kind != PBOX_OP_PULL) {
		lane_fail(n, ln, -ETIMEDOUT,
			  "%s of key %u (iteration %u) timed out after %.1f s: no answer from the "
			  "appliance at %s for any of its %u chunks (is pboxd running and "
			  "reachable?)",
			  kind_name(ln->kind), k->id, ln->iter, secs, peer, k->nchunks);
	} else if (waiting > 0) {
		lane_fail(
			n, ln, -ETIMEDOUT,
			"%s of key %u (iteration %u) timed out after %.1f s: the appliance has our "
			"contribution for %u of %u chunks but the iteration did not complete; when "
			"last asked, %u of %u workers had contributed: a peer is slow, stopped or "
			"gone",
			kind_name(ln->kind), k->id, ln->iter, secs,
			waiting + (k->nchunks - ln->chunks_left), k->nchunks, minseen,
			n->d->nworkers);
	} else {
		lane_fail(
			n, ln, -ETIMEDOUT,
			"%s of key %u (iteration %u) timed out after %.1f s: %u of %u chunks done, "
			"%u unanswered by %s, %u not yet sent",
			kind_name(ln->kind), k->id, ln->iter, secs, k->nchunks - ln->chunks_left,
			k->nchunks, sending + waiting, peer, queued);
	}
}

/*
 * The turn of a core that answers nothing (pbox_node_timers; F-RTO, RFC 5682): chunk w's
 * timer may send now if the core has been quiet for pt since its last answer
 * (last_answer) and the last quiet probe (*last_probe) is *gap ago; the gap then doubles,
 * up to cap (the first is pt). Otherwise w is re-armed: after wait_ns while the core
 * still answers, else when the next quiet probe is due. Returns whether w may send.
 */
static bool quiet_turn(struct pbox_node *n, struct wchunk *w, uint64_t t, uint64_t pt,
		       uint64_t last_answer, uint64_t wait_ns, uint64_t *last_probe, uint64_t *gap,
		       uint64_t cap)
{
	bool flowing = t - last_answer < pt;

	if (flowing || t - *last_probe < *gap) {
		n->stats.timer_waits++;
		w->tmo_ns = flowing ? wait_ns : PBOX_MAX(pt, *last_probe + *gap - t);
		arm(n, w, t);
		return false;
	}
	*last_probe = t;
	*gap = *gap != 0 ? PBOX_MIN(2 * *gap, cap) : pt;
	return true;
}

void pbox_node_timers(struct pbox_node *n)
{
	uint64_t t = now(n);
	uint32_t a, core;

	floor_decay(n, t);

	/* Deadlines first: a failed lane takes its chunks off the active list. The scans run
	 * only when the cached lower bound says something may be due. */
	if (t >= n->next_deadline) {
		n->next_deadline = UINT64_MAX;
		for (size_t i = 0; i < (size_t)n->d->nkeys * n->nlanes && n->nops; i++) {
			struct lane *ln = &n->lanes[i];

			if (ln->kind == PBOX_OP_NONE) {
				continue;
			}
			if (t >= ln->deadline_ns) {
				timeout_lane(n, ln, t);
			} else {
				n->next_deadline = PBOX_MIN(n->next_deadline, ln->deadline_ns);
			}
		}
	}
	if (t >= n->next_due) {
		n->next_due = UINT64_MAX;
		for (a = n->active_head; a != 0;) {
			uint32_t i = a - 1;
			struct wchunk *w = &n->ch[i];
			bool quiet = false;

			a = w->next_active;
			if (t < w->due_ns) {
				n->next_due = PBOX_MIN(n->next_due, w->due_ns);
				continue;
			}
			core = n->d->chunks[wc_chunk(n, i)].core;
			if (w->phase == PH_SEND && ln_kind_sends_data(n, i) &&
			    n->core_acked[core] < w->order) {
				/* Acknowledgements of this core still arrive, but none yet for
				 * anything sent at or after this contribution: it waits in the
				 * core's queue, as everything sent after it does; it is not
				 * lost. (TCP's one timer restarts on every ACK for the same
				 * reason; a loss is known once something sent later is
				 * acknowledged, as in RACK, RFC 8985.) Per core: another core's
				 * thread may run while this one is descheduled. When the core
				 * has answered nothing for a tail-loss probe's time, one chunk
				 * probes (RACK's TLP), the next after twice that, and so on, the
				 * rest wait for the answer (F-RTO, RFC 5682: a spurious timeout
				 * costs one datagram per core, not one per chunk in flight). */
				if (!quiet_turn(n, w, t, pto(n), n->core_delivery[core], n->rto,
						&n->core_quiet_send[core],
						&n->core_quiet_sgap[core], n->rto_max)) {
					continue;
				}
				quiet = true;
			}
			if (w->phase == PH_WAIT && w->rgot == 0 && n->relay == NULL &&
			    n->core_res[core] < w->order) {
				/* No result has come for anything acknowledged after this chunk:
				 * it is not overtaken, so not known lost (RACK). While the core
				 * still sends results, ours waits in its queue (or for a peer);
				 * when it has sent none for the probe interval, one chunk of the
				 * core probes, then the next after twice the interval, and so on
				 * until results come again (a stalled peer leaves every chunk
				 * waiting: R6, perf/README.md section 4). */
				uint64_t pt = probe_tmo(n);

				if (!quiet_turn(n, w, t, pt, n->core_res_t[core], pt,
						&n->core_quiet_probe[core],
						&n->core_quiet_gap[core], probe_slow(n))) {
					continue;
				}
				quiet = true;
			}
			w->tmo_ns = PBOX_MIN(w->tmo_ns * 2, n->rto_max);
			w->tries++;
			arm(n, w, t);
			if (!w->tmo_sent) {
				/* judged by the answer (judge_timer) */
				w->tmo_sent = quiet ? TMO_QUIET : TMO_SENT;
				w->tmo_seq = n->seq;
			}
			if (w->phase == PH_SEND && ln_kind_sends_data(n, i)) {
				cc_loss(n, t, true);
			}
			if (w->phase == PH_SEND) {
				/* Nothing heard at all: the data (or pull) may be lost; send
				 * again. For a push-pull the result doubles as the ACK, so a
				 * lost result also brings us here, and the appliance answers
				 * the resend with it. A failed resend unlinks this lane's
				 * chunks: restart the walk. */
				if (!send_chunk(n, i, SEND_PROBE)) {
					a = n->active_head;
				}
			} else {
				if (w->rgot > 0 && w->tries == 1) {
					/* Part of the result came, the rest not within an RTO: lost
					 * on the way back. Results are sent at the pace of the
					 * workers' pushes, so slowing ours is what relieves the
					 * appliance's link and our own downlink. */
					cc_loss(n, t, true);
				}
				send_probe(n, i);
			}
		}
	}
	start_queued(n);
}

uint64_t pbox_node_next_timer(struct pbox_node *n)
{
	uint64_t t = now(n), next = PBOX_MIN(n->next_due, n->next_deadline);

	if (n->pace_wait) {
		next = PBOX_MIN(next, n->pace_next);
	}

	if (next == UINT64_MAX) {
		return UINT64_MAX;
	}
	return next > t ? next - t : 0;
}

void pbox_node_flush(struct pbox_node *n)
{
	n->cfg.tx->flush(n->cfg.tx_ctx);
}

/* Read-only: the same rate pace() spaces chunks at (gain in quarters). */
uint64_t pbox_node_pace_rate(const struct pbox_node *n, uint32_t *frag_bytes)
{
	*frag_bytes = (uint32_t)n->mss;
	if (n->srtt == 0) {
		return 0;
	}
	return n->cwnd * (n->cwnd < n->ssthresh ? 8 : 5) * 1000000000ull / (4 * n->srtt);
}
