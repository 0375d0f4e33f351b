/* SPDX-License-Identifier: BSD-3-Clause */
/* The worker's data-plane node (see node.h for the reliability rules). */
#include "node.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/bitmap.h"
#include "common/compiler.h"
#include "common/log.h"

enum phase {
	PH_IDLE = 0,
	PH_QUEUED, /* waiting for a free in-flight slot */
	PH_SEND,   /* data (or the pull request) sent, nothing acknowledged yet */
	PH_WAIT,   /* contribution acknowledged, waiting for the result */
};

struct wchunk {
	uint8_t phase;
	uint16_t tries;	     /* sends of the current phase */
	uint32_t rto_ms;
	uint64_t due_ns;     /* next retransmission / probe */
	uint32_t rlabel;     /* label of the result being collected */
	uint32_t rgot;	     /* fragments of it received */
	uint32_t ndone_seen; /* contributions the appliance reported in its last ACK */
	uint64_t *rbits;
	uint32_t next_queued; /* FIFO link (chunk id + 1, 0 = end) */
	uint32_t next_active; /* active list link (chunk id + 1, 0 = end) */
	uint32_t prev_active;
};

struct pbox_node {
	struct pbox_node_cfg cfg;
	const struct pbox_jobdesc *d;
	struct pbox_wire_job wire;
	uint64_t cookie_store[1];
	struct wchunk *ch;
	uint64_t *bits_arena;
	struct pbox_op **key_op; /* per key: operation in flight or NULL */
	uint32_t nops;
	uint32_t inflight;    /* chunks in PH_SEND */
	uint32_t q_head, q_tail; /* queued chunks, id + 1 */
	uint32_t active_head;	 /* chunks in PH_SEND / PH_WAIT, id + 1 */
	uint32_t seq;
	uint64_t next_due;	/* lower bound of every active chunk's due_ns */
	uint64_t next_deadline; /* lower bound of every op's deadline_ns */
	int failed;
	char failmsg[256];
	struct pbox_node_stats stats;
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

static const struct pbox_wire_job *lookup(void *arg, uint32_t id)
{
	struct pbox_node *n = arg;

	return id == n->wire.id ? &n->wire : NULL;
}

struct pbox_node *pbox_node_create(const struct pbox_node_cfg *cfg)
{
	struct pbox_node *n = calloc(1, sizeof(*n));
	size_t words = 0;

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
	if (n->cfg.timeout_ms == 0) {
		n->cfg.timeout_ms = 30000;
	}
	if (n->cfg.max_inflight == 0) {
		n->cfg.max_inflight = 256;
	}
	n->d = cfg->desc;
	n->next_due = UINT64_MAX;
	n->next_deadline = UINT64_MAX;
	n->cookie_store[0] = cfg->cookie;
	n->wire.id = cfg->job;
	n->wire.desc = cfg->desc;
	n->wire.cookies = n->cookie_store;
	n->ch = calloc(n->d->nchunks, sizeof(*n->ch));
	n->key_op = calloc(n->d->nkeys, sizeof(*n->key_op));
	for (uint32_t c = 0; c < n->d->nchunks; c++) {
		words += pbox_bitmap_words(n->d->chunks[c].nfrags);
	}
	n->bits_arena = calloc(words ? words : 1, sizeof(uint64_t));
	if (n->ch == NULL || n->key_op == NULL || n->bits_arena == NULL) {
		goto oom;
	}
	words = 0;
	for (uint32_t c = 0; c < n->d->nchunks; c++) {
		n->ch[c].rbits = n->bits_arena + words;
		words += pbox_bitmap_words(n->d->chunks[c].nfrags);
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
	free(n->ch);
	free(n->key_op);
	free(n->bits_arena);
	free(n);
}

const struct pbox_node_stats *pbox_node_stats(const struct pbox_node *n)
{
	return &n->stats;
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

static void active_add(struct pbox_node *n, uint32_t c)
{
	struct wchunk *w = &n->ch[c];

	w->prev_active = 0;
	w->next_active = n->active_head;
	if (n->active_head) {
		n->ch[n->active_head - 1].prev_active = c + 1;
	}
	n->active_head = c + 1;
}

static void active_del(struct pbox_node *n, uint32_t c)
{
	struct wchunk *w = &n->ch[c];

	if (w->prev_active) {
		n->ch[w->prev_active - 1].next_active = w->next_active;
	} else {
		n->active_head = w->next_active;
	}
	if (w->next_active) {
		n->ch[w->next_active - 1].prev_active = w->prev_active;
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
	if (n->cfg.tx->send(n->cfg.tx_ctx, &n->cfg.cores[cd->core], &h, payload, m->frag_len) == 0) {
		n->stats.tx_pkts++;
		n->stats.tx_bytes += PBOX_WIRE_HDR_LEN + m->frag_len;
	}
}

static struct pbox_op *chunk_op(struct pbox_node *n, uint32_t c)
{
	return n->key_op[n->d->chunks[c].key];
}

/* Send the chunk's contribution (all fragments) or its pull request. */
static void send_chunk(struct pbox_node *n, uint32_t c, bool again)
{
	const struct pbox_chunk_desc *cd = &n->d->chunks[c];
	struct pbox_op *op = chunk_op(n, c);
	uint16_t rflag = again ? PBOX_F_RETRANSMIT : 0;

	if (op->kind == PBOX_OP_PULL) {
		struct pbox_msg m = { .type = PBOX_MSG_PULL, .flags = rflag, .iter = op->iter };

		xmit(n, c, &m, NULL);
	} else {
		const uint8_t *src = (const uint8_t *)(op->src + cd->elem_off);

		for (uint32_t f = 0; f < cd->nfrags; f++) {
			struct pbox_msg m = {
				.type = op->kind == PBOX_OP_INIT ? PBOX_MSG_INIT : PBOX_MSG_PUSH,
				.encoding = PBOX_ENC_F32,
				.flags = rflag,
				.iter = op->kind == PBOX_OP_INIT ? 0 : op->iter,
				.frag_off = f * n->d->frag_bytes,
				.frag_len = pbox_frag_len(n->d, cd->bytes, f),
			};

			if (op->kind == PBOX_OP_PUSH_PULL) {
				m.flags |= PBOX_F_WANT_REPLY;
			}
			xmit(n, c, &m, src + m.frag_off);
		}
	}
	if (again) {
		n->stats.retransmits += op->kind == PBOX_OP_PULL ? 1 : cd->nfrags;
	}
}

/* The label a result must have to answer op. */
static bool label_ok(const struct pbox_node *n, const struct pbox_op *op, uint32_t label)
{
	switch (op->kind) {
	case PBOX_OP_PUSH_PULL:
		return n->cfg.server_opt ? label >= op->iter + 1 : label == op->iter;
	case PBOX_OP_PULL:
		return n->cfg.server_opt ? label >= op->iter : label == op->iter;
	default:
		return false;
	}
}

/* The PULL that asks the appliance to repeat a possibly lost result. */
static void send_probe(struct pbox_node *n, uint32_t c)
{
	struct pbox_op *op = chunk_op(n, c);
	struct pbox_msg m = {
		.type = PBOX_MSG_PULL,
		.flags = PBOX_F_RETRANSMIT,
		.iter = n->cfg.server_opt && op->kind == PBOX_OP_PUSH_PULL ? op->iter + 1 : op->iter,
	};

	xmit(n, c, &m, NULL);
	n->stats.probes++;
}

static void arm(struct pbox_node *n, struct wchunk *w, uint64_t t)
{
	w->due_ns = t + (uint64_t)w->rto_ms * 1000000ull;
	n->next_due = PBOX_MIN(n->next_due, w->due_ns);
}

static void start_chunk(struct pbox_node *n, uint32_t c, uint64_t t)
{
	struct wchunk *w = &n->ch[c];

	w->phase = PH_SEND;
	w->tries = 1;
	w->rto_ms = n->cfg.rto_ms;
	w->rgot = 0;
	w->ndone_seen = 0;
	w->rlabel = UINT32_MAX;
	pbox_bitmap_zero(w->rbits, n->d->chunks[c].nfrags);
	n->inflight++;
	active_add(n, c);
	arm(n, w, t);
	send_chunk(n, c, false);
}

static void start_queued(struct pbox_node *n)
{
	uint64_t t = 0;

	while (n->q_head && n->inflight < n->cfg.max_inflight) {
		uint32_t c = n->q_head - 1;

		n->q_head = n->ch[c].next_queued;
		if (n->q_head == 0) {
			n->q_tail = 0;
		}
		n->ch[c].next_queued = 0;
		if (t == 0) {
			t = now(n);
		}
		start_chunk(n, c, t);
	}
}

/* ---- completion --------------------------------------------------------------------- */

static void op_finish(struct pbox_node *n, struct pbox_op *op)
{
	n->key_op[op->key] = NULL;
	n->nops--;
	if (op->status == 0) {
		n->stats.ops_done++;
	} else {
		n->stats.ops_failed++;
	}
	if (n->cfg.done != NULL) {
		n->cfg.done(op, n->cfg.done_arg);
	}
}

/* Leave the chunk's phase (it no longer needs the network). */
static void chunk_idle(struct pbox_node *n, uint32_t c)
{
	struct wchunk *w = &n->ch[c];

	if (w->phase == PH_SEND) {
		n->inflight--;
	}
	if (w->phase == PH_SEND || w->phase == PH_WAIT) {
		active_del(n, c);
	}
	w->phase = PH_IDLE;
}

static void chunk_done(struct pbox_node *n, uint32_t c)
{
	struct pbox_op *op = chunk_op(n, c);

	chunk_idle(n, c);
	if (--op->chunks_left == 0) {
		op_finish(n, op);
	}
}

/* Fail op: every chunk of its key leaves the network, queued ones included. */
static void op_fail(struct pbox_node *n, struct pbox_op *op, int err, const char *fmt, ...)
	PBOX_PRINTF(4, 5);

static void op_fail(struct pbox_node *n, struct pbox_op *op, int err, const char *fmt, ...)
{
	const struct pbox_key *k = &n->d->keys[op->key];
	uint32_t prev = 0, q;
	va_list ap;

	for (uint32_t c = k->first_chunk; c < k->first_chunk + k->nchunks; c++) {
		chunk_idle(n, c);
	}
	/* Unlink this key's chunks from the queue. */
	for (q = n->q_head; q != 0;) {
		uint32_t c = q - 1, next = n->ch[c].next_queued;

		if (n->d->chunks[c].key == op->key) {
			if (prev) {
				n->ch[prev - 1].next_queued = next;
			} else {
				n->q_head = next;
			}
			if (n->q_tail == q) {
				n->q_tail = prev;
			}
			n->ch[c].next_queued = 0;
		} else {
			prev = q;
		}
		q = next;
	}
	op->status = err;
	va_start(ap, fmt);
	vsnprintf(op->errmsg, sizeof(op->errmsg), fmt, ap);
	va_end(ap);
	op_finish(n, op);
}

void pbox_node_fail(struct pbox_node *n, int err, const char *msg)
{
	if (n->failed == 0) {
		n->failed = err;
		snprintf(n->failmsg, sizeof(n->failmsg), "%s", msg);
	}
	for (uint32_t k = 0; k < n->d->nkeys; k++) {
		if (n->key_op[k] != NULL) {
			op_fail(n, n->key_op[k], err, "%s", msg);
		}
	}
}

int pbox_node_submit(struct pbox_node *n, struct pbox_op *op)
{
	const struct pbox_key *k;
	uint64_t t;

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
	if (n->key_op[op->key] != NULL) {
		snprintf(op->errmsg, sizeof(op->errmsg),
			 "key %u already has a %s in flight (iteration %u); wait for it first",
			 n->d->keys[op->key].id, kind_name(n->key_op[op->key]->kind),
			 n->key_op[op->key]->iter);
		return -EBUSY;
	}
	if (op->kind == PBOX_OP_INIT && !n->cfg.server_opt) {
		snprintf(op->errmsg, sizeof(op->errmsg),
			 "init: job %u aggregates gradients; it keeps no model to initialise",
			 n->cfg.job);
		return -EINVAL;
	}
	if (op->kind == PBOX_OP_INIT && n->cfg.rank != 0) {
		snprintf(op->errmsg, sizeof(op->errmsg),
			 "init: only rank 0 supplies initial values (this is rank %u)", n->cfg.rank);
		return -EINVAL;
	}
	k = &n->d->keys[op->key];
	t = now(n);
	op->status = 0;
	op->errmsg[0] = '\0';
	op->chunks_left = k->nchunks;
	op->label = UINT32_MAX;
	op->start_ns = t;
	op->deadline_ns = t + (uint64_t)n->cfg.timeout_ms * 1000000ull;
	n->next_deadline = PBOX_MIN(n->next_deadline, op->deadline_ns);
	n->key_op[op->key] = op;
	n->nops++;
	for (uint32_t c = k->first_chunk; c < k->first_chunk + k->nchunks; c++) {
		struct wchunk *w = &n->ch[c];

		w->phase = PH_QUEUED;
		w->next_queued = 0;
		if (n->q_tail) {
			n->ch[n->q_tail - 1].next_queued = c + 1;
		} else {
			n->q_head = c + 1;
		}
		n->q_tail = c + 1;
	}
	start_queued(n);
	return 0;
}

/* ---- receiving ---------------------------------------------------------------------- */

static void on_ack(struct pbox_node *n, uint32_t c, const struct pbox_msg *m)
{
	struct wchunk *w = &n->ch[c];
	struct pbox_op *op = chunk_op(n, c);

	if (op->kind != PBOX_OP_INIT && m->iter != op->iter) {
		return; /* ACK of an older contribution */
	}
	if (w->phase == PH_WAIT) {
		/* The appliance's answer to a probe: how many contributions it has. */
		w->ndone_seen = m->arg1;
		return;
	}
	if (w->phase != PH_SEND || op->kind == PBOX_OP_PULL) {
		return; /* late or duplicate ACK */
	}
	w->ndone_seen = m->arg1;
	if (op->kind == PBOX_OP_PUSH_PULL) {
		/* The data is in; from now on only probe for a lost result. */
		n->inflight--;
		w->phase = PH_WAIT;
		w->tries = 0;
		w->rto_ms = n->cfg.rto_ms;
		arm(n, w, now(n));
		start_queued(n);
		return;
	}
	chunk_done(n, c);
	start_queued(n);
}

static void on_data(struct pbox_node *n, uint32_t c, const struct pbox_msg *m)
{
	const struct pbox_chunk_desc *cd = &n->d->chunks[c];
	struct wchunk *w = &n->ch[c];
	struct pbox_op *op = chunk_op(n, c);
	uint32_t f = m->frag_off / n->d->frag_bytes;

	if ((w->phase != PH_SEND && w->phase != PH_WAIT) || !label_ok(n, op, m->iter)) {
		return; /* not wanted (any more) */
	}
	if (m->iter != w->rlabel) {
		/* A newer version than the one being collected: start over with it. Older
		 * ones are ignored so a late duplicate cannot mix versions. */
		if (w->rlabel != UINT32_MAX && m->iter < w->rlabel) {
			return;
		}
		w->rlabel = m->iter;
		w->rgot = 0;
		pbox_bitmap_zero(w->rbits, cd->nfrags);
	}
	if (pbox_bit_test(w->rbits, f)) {
		n->stats.dup_frags++;
		return;
	}
	pbox_bit_set(w->rbits, f);
	memcpy((uint8_t *)(op->dst + cd->elem_off) + m->frag_off, m->payload, m->frag_len);
	if (++w->rgot == cd->nfrags) {
		op->label = m->iter;
		chunk_done(n, c);
		start_queued(n);
	}
}

static void on_error(struct pbox_node *n, uint32_t c, const struct pbox_msg *m)
{
	struct wchunk *w = &n->ch[c];
	struct pbox_op *op = chunk_op(n, c);
	int err = (int)m->arg0;
	const char *why;

	if (w->phase != PH_SEND && w->phase != PH_WAIT) {
		return;
	}
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
	default:
		why = strerror(err);
		break;
	}
	if (err <= 0 || err > 4095) {
		err = EPROTO;
	}
	op_fail(n, op, -err, "%s of key %u (chunk %u, iteration %u) refused: %s",
		kind_name(op->kind), n->d->keys[op->key].id, c, op->iter, why);
}

void pbox_node_rx(struct pbox_node *n, const void *pkt, uint32_t len, const struct pbox_peer *from)
{
	const struct pbox_wire_job *j;
	enum pbox_drop_reason r;
	struct pbox_msg m;

	(void)from;
	n->stats.rx_pkts++;
	n->stats.rx_bytes += len;
	r = pbox_wire_validate(pkt, len, PBOX_ROLE_WORKER, lookup, n, &m, &j);
	if (r != PBOX_DROP_NONE) {
		n->stats.drops[r]++;
		return;
	}
	if (n->ch[m.chunk].phase == PH_IDLE || n->ch[m.chunk].phase == PH_QUEUED ||
	    chunk_op(n, m.chunk) == NULL) {
		n->stats.drops[PBOX_DROP_UNEXPECTED]++;
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

/* ---- timers ------------------------------------------------------------------------- */

static void timeout_op(struct pbox_node *n, struct pbox_op *op, uint64_t t)
{
	const struct pbox_key *k = &n->d->keys[op->key];
	uint32_t queued = 0, sending = 0, waiting = 0, minseen = UINT32_MAX;
	char peer[64] = "";

	for (uint32_t c = k->first_chunk; c < k->first_chunk + k->nchunks; c++) {
		struct wchunk *w = &n->ch[c];

		if (w->phase == PH_QUEUED) {
			queued++;
		} else if (w->phase == PH_SEND) {
			sending++;
		} else if (w->phase == PH_WAIT) {
			waiting++;
			minseen = PBOX_MIN(minseen, w->ndone_seen);
		}
		if (w->phase != PH_IDLE && peer[0] == '\0') {
			const struct pbox_peer *p = &n->cfg.cores[n->d->chunks[c].core];
			const uint8_t *ip = (const uint8_t *)&p->ip;

			snprintf(peer, sizeof(peer), "%u.%u.%u.%u:%u", ip[0], ip[1], ip[2], ip[3],
				 (unsigned)__builtin_bswap16(p->port));
		}
	}
	if (sending > 0 && waiting == 0 && op->chunks_left == k->nchunks &&
	    op->kind != PBOX_OP_PULL) {
		op_fail(n, op, -ETIMEDOUT,
			"%s of key %u (iteration %u) timed out after %.1f s: no answer from the "
			"appliance at %s for any of its %u chunks (is pboxd running and reachable?)",
			kind_name(op->kind), k->id, op->iter, (double)(t - op->start_ns) / 1e9, peer,
			k->nchunks);
	} else if (waiting > 0) {
		op_fail(n, op, -ETIMEDOUT,
			"%s of key %u (iteration %u) timed out after %.1f s: the appliance has our "
			"contribution for %u of %u chunks but the iteration did not complete; when "
			"last asked, %u of %u workers had contributed: a peer is slow, stopped or gone",
			kind_name(op->kind), k->id, op->iter, (double)(t - op->start_ns) / 1e9,
			waiting + (k->nchunks - op->chunks_left), k->nchunks, minseen,
			n->d->nworkers);
	} else {
		op_fail(n, op, -ETIMEDOUT,
			"%s of key %u (iteration %u) timed out after %.1f s: %u of %u chunks done, "
			"%u unanswered by %s, %u not yet sent",
			kind_name(op->kind), k->id, op->iter, (double)(t - op->start_ns) / 1e9,
			k->nchunks - op->chunks_left, k->nchunks, sending + waiting, peer, queued);
	}
}

void pbox_node_timers(struct pbox_node *n)
{
	uint64_t t = now(n);
	uint32_t a;

	/* Deadlines first: a failed op takes its chunks off the active list. The scans run
	 * only when the cached lower bound says something may be due. */
	if (t >= n->next_deadline) {
		n->next_deadline = UINT64_MAX;
		for (uint32_t k = 0; k < n->d->nkeys && n->nops; k++) {
			struct pbox_op *op = n->key_op[k];

			if (op == NULL) {
				continue;
			}
			if (t >= op->deadline_ns) {
				timeout_op(n, op, t);
			} else {
				n->next_deadline = PBOX_MIN(n->next_deadline, op->deadline_ns);
			}
		}
	}
	if (t >= n->next_due) {
		n->next_due = UINT64_MAX;
		for (a = n->active_head; a != 0;) {
			uint32_t c = a - 1;
			struct wchunk *w = &n->ch[c];

			a = w->next_active;
			if (t < w->due_ns) {
				n->next_due = PBOX_MIN(n->next_due, w->due_ns);
				continue;
			}
			w->rto_ms = PBOX_MIN(w->rto_ms * 2, n->cfg.rto_max_ms);
			w->tries++;
			arm(n, w, t);
			if (w->phase == PH_SEND) {
				/* Nothing heard at all: the data (or pull) may be lost; send
				 * again. For a push-pull the result doubles as the ACK, so a
				 * lost result also brings us here, and the appliance answers
				 * the resend with it. */
				send_chunk(n, c, true);
			} else {
				send_probe(n, c);
			}
		}
	}
	start_queued(n);
}

uint64_t pbox_node_next_timer(struct pbox_node *n)
{
	uint64_t t = now(n), next = PBOX_MIN(n->next_due, n->next_deadline);

	if (next == UINT64_MAX) {
		return UINT64_MAX;
	}
	return next > t ? next - t : 0;
}

void pbox_node_flush(struct pbox_node *n)
{
	n->cfg.tx->flush(n->cfg.tx_ctx);
}
