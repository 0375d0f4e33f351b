/* SPDX-License-Identifier: BSD-3-Clause */
/* The per-core chunk engine (see engine.h for the protocol rules). */
#include "engine.h"

#include <errno.h>
#include <string.h>

#include "common/bitmap.h"
#include "common/log.h"

/* Everything one datagram's handling needs, resolved once. */
struct ctx {
	struct pbox_engine *e;
	const struct pbox_job *job;
	const struct pbox_jobdesc *d;
	struct pbox_core_job *cj;
	struct pbox_chunk_state *cs;
	const struct pbox_chunk_desc *cd;
	const struct pbox_msg *m;
	const struct pbox_iov *pay; /* payload pieces: one for contiguous datagrams */
	unsigned npay;
};

static void drop(struct pbox_engine *e, enum pbox_drop_reason r)
{
	PBOX_STAT_ADD(e->stats, drops[r], 1);
}

/* Before writing chunk memory last referenced by reply number ref: make sure the
 * transport has let go of it. Cheap when it already has (the common case). */
static void reclaim(struct pbox_engine *e, uint64_t ref)
{
	if (ref > e->released) {
		e->released = e->tx->reclaim(e->tx_ctx, ref);
	}
}

void pbox_engine_flush(struct pbox_engine *e)
{
	e->tx->flush(e->tx_ctx);
}

static void xmit(struct ctx *x, uint32_t rank, struct pbox_msg *m, const void *payload)
{
	const struct pbox_peer *to = &x->cj->peers[rank];
	struct pbox_wire_hdr h;

	if (to->port == 0) {
		/* The rank never reached this core, so there is nowhere to answer. */
		PBOX_STAT_ADD(x->e->stats, tx_errors, 1);
		return;
	}
	m->job = x->job->wire.id;
	m->sender = PBOX_SENDER_APPLIANCE;
	m->cookie = x->job->wire.cookies[rank];
	m->chunk = x->cs->id;
	m->chunk_len = x->cd->bytes;
	pbox_wire_encode(m, &h);
	if (x->e->tx->send(x->e->tx_ctx, to, &h, payload, m->frag_len) != 0) {
		PBOX_STAT_ADD(x->e->stats, tx_errors, 1);
		return;
	}
	PBOX_STAT_ADD(x->e->stats, tx_pkts, 1);
	PBOX_STAT_ADD(x->e->stats, tx_bytes, PBOX_WIRE_HDR_LEN + m->frag_len);
}

static void send_ack(struct ctx *x, uint32_t rank, uint32_t iter, uint32_t ndone)
{
	struct pbox_msg m = {
		.type = PBOX_MSG_ACK,
		.encoding = PBOX_ENC_NONE,
		.iter = iter,
		.arg0 = x->m->seq,
		.arg1 = ndone,
	};

	xmit(x, rank, &m, NULL);
	PBOX_STAT_ADD(x->e->stats, acks, 1);
}

static void send_error(struct ctx *x, int err)
{
	struct pbox_msg m = {
		.type = PBOX_MSG_ERROR,
		.encoding = PBOX_ENC_NONE,
		.iter = x->m->iter,
		.arg0 = (uint32_t)err,
		.arg1 = x->m->type,
	};

	xmit(x, x->m->sender, &m, NULL);
	PBOX_STAT_ADD(x->e->stats, errors_sent, 1);
}

/* Send the whole result buffer of the chunk to rank, labelled with iter/version; *ref
 * records the transport reference of the last datagram pointing into buf. */
static void send_result(struct ctx *x, uint32_t rank, uint32_t label, const float *buf,
			uint64_t *ref, bool resend)
{
	const uint8_t *p = (const uint8_t *)buf;

	for (uint32_t f = 0; f < x->cd->nfrags; f++) {
		struct pbox_msg m = {
			.type = PBOX_MSG_DATA,
			.encoding = PBOX_ENC_F32,
			.flags = resend ? PBOX_F_RETRANSMIT : 0,
			.iter = label,
			.frag_off = f * x->d->frag_bytes,
			.frag_len = pbox_frag_len(x->d, x->cd->bytes, f),
			.arg0 = x->d->nworkers,
		};

		xmit(x, rank, &m, p + m.frag_off);
	}
	*ref = x->e->tx->queued(x->e->tx_ctx);
	if (resend) {
		PBOX_STAT_ADD(x->e->stats, replies_resent, 1);
	}
}

static bool server_opt(const struct ctx *x)
{
	return x->job->mode == PBOX_MODE_SERVER_OPT;
}

/* The result that answers requests for the current version / a completed slot. */
static void send_current(struct ctx *x, uint32_t rank, struct pbox_slot *sl, bool resend)
{
	struct pbox_chunk_state *cs = x->cs;

	if (server_opt(x)) {
		send_result(x, rank, cs->version, cs->model[cs->version & 1],
			    &cs->model_ref[cs->version & 1], resend);
	} else {
		send_result(x, rank, sl->iter, sl->acc, &sl->acc_ref, resend);
	}
}

/*
 * Finalise fragment f of slot sl (the chunk's current iteration): reduce the sources and
 * either run the optimizer into the model (server-optimizer) or write the sum / mean into
 * the accumulator (aggregate). src are the fragment-local source pointers.
 */
static void finalize_frag(struct ctx *x, struct pbox_slot *sl, uint32_t f, const float *const *src,
			  unsigned nsrc)
{
	uint32_t off = f * x->d->frag_bytes / 4;
	uint32_t n = pbox_frag_len(x->d, x->cd->bytes, f) / 4;

	if (server_opt(x)) {
		struct pbox_opt_step st;
		struct pbox_chunk_state *cs = x->cs;
		uint32_t in = cs->version & 1, out = in ^ 1;

		/* Version v + 1 is written over version v - 1, which replies may still
		 * reference on a zero-copy transport. */
		reclaim(x->e, cs->model_ref[out]);
		x->job->opt->prepare(&x->job->opt_params, (uint64_t)cs->version + 1, &st);
		x->job->opt->kernel(x->e->kern)(cs->model[out] + off, cs->model[in] + off,
						cs->s0 ? cs->s0 + off : NULL,
						cs->s1 ? cs->s1 + off : NULL, src, nsrc, n,
						&x->job->opt_params, &st);
	} else {
		float div = x->job->reduce == PBOX_REDUCE_MEAN ? (float)x->d->nworkers : 1.0f;

		x->e->kern->reduce(sl->acc + off, src, nsrc, n, div);
	}
	sl->fcnt[f] = PBOX_FCNT_FINAL;
	sl->nfinal++;
}

/* Finalise, from stored sums, every fragment of the current slot that has all its
 * contributions (used when an iteration becomes current after its data arrived). */
static void finalize_ready(struct ctx *x, struct pbox_slot *sl)
{
	const float *src[1];
	uint32_t nw = x->d->nworkers;

	for (uint32_t f = 0; f < x->cd->nfrags; f++) {
		uint32_t off = f * x->d->frag_bytes / 4;

		if (sl->fcnt[f] != nw) {
			continue;
		}
		if (x->job->deterministic) {
			const float *stage[PBOX_MAX_WORKERS];

			for (uint32_t w = 0; w < nw; w++) {
				stage[w] = sl->stage[w] + off;
			}
			finalize_frag(x, sl, f, stage, nw);
		} else {
			src[0] = sl->acc + off;
			finalize_frag(x, sl, f, src, 1);
		}
	}
}

static void answer_held_pulls(struct ctx *x, struct pbox_slot *sl)
{
	struct pbox_chunk_state *cs = x->cs;

	if (cs->nheld == 0) {
		return;
	}
	for (uint32_t w = 0; w < x->d->nworkers; w++) {
		uint32_t want = cs->pull_want[w];
		bool ready;

		if (want == PBOX_PULL_NONE) {
			continue;
		}
		ready = server_opt(x) ? cs->initialized && want <= cs->version
				      : sl != NULL && want == sl->iter;
		if (ready) {
			send_current(x, w, sl, false);
			cs->pull_want[w] = PBOX_PULL_NONE;
			cs->nheld--;
		}
	}
}

/* Complete iterations in order while the current one has every fragment final. */
static void advance(struct ctx *x)
{
	struct pbox_chunk_state *cs = x->cs;

	for (;;) {
		struct pbox_slot *sl = &cs->slot[cs->version % x->job->window];
		uint32_t w;

		if (!sl->open || sl->iter != cs->version) {
			return;
		}
		if (sl->nfinal != x->cd->nfrags) {
			finalize_ready(x, sl);
			if (sl->nfinal != x->cd->nfrags) {
				return;
			}
		}
		cs->version++;
		PBOX_STAT_ADD(x->e->stats, iterations, 1);
		PBOX_BIT_FOREACH(w, sl->want, x->d->nworkers)
		{
			send_current(x, w, sl, false);
		}
		answer_held_pulls(x, sl);
	}
}

static void slot_open(struct ctx *x, struct pbox_slot *sl, uint32_t iter)
{
	uint32_t nw = x->d->nworkers;
	size_t fwords = pbox_bitmap_words(x->cd->nfrags);

	/* The slot's accumulator may still be the result of iter - window, referenced by
	 * replies. */
	reclaim(x->e, sl->acc_ref);
	sl->iter = iter;
	sl->ndone = 0;
	sl->nfinal = 0;
	sl->open = true;
	memset(sl->bits, 0, nw * fwords * sizeof(uint64_t));
	memset(sl->wcnt, 0, nw * sizeof(uint16_t));
	memset(sl->fcnt, 0, x->cd->nfrags * sizeof(uint16_t));
	pbox_bitmap_zero(sl->done, nw);
	pbox_bitmap_zero(sl->want, nw);
}

/* Copy the payload pieces to dst. */
static void gather_copy(const struct ctx *x, void *dst)
{
	uint8_t *d = dst;

	for (unsigned i = 0; i < x->npay; i++) {
		memcpy(d, x->pay[i].base, x->pay[i].len);
		d += x->pay[i].len;
	}
}

/* acc[i] += payload[i] over pieces; a float split between two pieces is reassembled and
 * added with the same single IEEE addition the kernels use. */
static void gather_add(const struct ctx *x, float *acc)
{
	uint8_t carry[4];
	uint32_t ncarry = 0;
	size_t i = 0;

	for (unsigned s = 0; s < x->npay; s++) {
		const uint8_t *p = x->pay[s].base;
		uint32_t len = x->pay[s].len, nf;

		if (ncarry != 0) {
			uint32_t take = PBOX_MIN(4 - ncarry, len);

			memcpy(carry + ncarry, p, take);
			ncarry += take;
			p += take;
			len -= take;
			if (ncarry == 4) {
				float g;

				memcpy(&g, carry, sizeof(g));
				acc[i] = acc[i] + g;
				i++;
				ncarry = 0;
			}
		}
		nf = len / 4;
		if (nf != 0) {
			x->e->kern->add(acc + i, (const float *)(const void *)p, nf);
			i += nf;
			p += (size_t)nf * 4;
			len -= nf * 4;
		}
		if (len != 0) {
			memcpy(carry, p, len);
			ncarry = len;
		}
	}
}

/* Multi-piece payloads: gather into the accumulator (or the rank's stage), then finalise
 * from there; (acc + g) stored and re-read is the same float as fused in registers. */
static void aggregate_pieces(struct ctx *x, struct pbox_slot *sl, uint32_t f)
{
	const struct pbox_msg *m = x->m;
	uint32_t off = m->frag_off / 4, nw = x->d->nworkers;
	uint16_t cnt;

	if (x->job->deterministic) {
		gather_copy(x, sl->stage[m->sender] + off);
	}
	cnt = ++sl->fcnt[f];
	PBOX_STAT_ADD(x->e->stats, agg_frags, 1);
	PBOX_STAT_ADD(x->e->stats, agg_bytes, m->frag_len);
	if (!x->job->deterministic) {
		if (cnt == 1) {
			gather_copy(x, sl->acc + off);
		} else {
			gather_add(x, sl->acc + off);
		}
	}
	if (cnt == nw && sl->iter == x->cs->version) {
		finalize_ready(x, sl);
	}
}

/* Add one fragment into the slot; finalise it at once if it is the last one needed and
 * the slot is the chunk's current iteration (the optimizer fused with the last add). */
static void aggregate(struct ctx *x, struct pbox_slot *sl, uint32_t f)
{
	const struct pbox_msg *m = x->m;
	uint32_t off = m->frag_off / 4, n = m->frag_len / 4, nw = x->d->nworkers;
	const float *g = x->pay[0].base;
	uint16_t cnt;
	bool final_now;

	if (x->npay != 1) {
		aggregate_pieces(x, sl, f);
		return;
	}
	if (x->job->deterministic) {
		memcpy(sl->stage[m->sender] + off, g, m->frag_len);
	}
	cnt = ++sl->fcnt[f];
	final_now = cnt == nw && sl->iter == x->cs->version;
	PBOX_STAT_ADD(x->e->stats, agg_frags, 1);
	PBOX_STAT_ADD(x->e->stats, agg_bytes, m->frag_len);
	if (x->job->deterministic) {
		if (final_now) {
			const float *stage[PBOX_MAX_WORKERS];

			for (uint32_t w = 0; w < nw; w++) {
				stage[w] = sl->stage[w] + off;
			}
			finalize_frag(x, sl, f, stage, nw);
		}
		return;
	}
	if (final_now) {
		/* Payloads are read in place (they may be unaligned; kernels allow that). */
		const float *src[2] = { sl->acc + off, g };

		if (cnt == 1) {
			finalize_frag(x, sl, f, &src[1], 1);
		} else {
			finalize_frag(x, sl, f, src, 2);
		}
		return;
	}
	if (cnt == 1) {
		memcpy(sl->acc + off, g, m->frag_len);
	} else {
		x->e->kern->add(sl->acc + off, g, n);
	}
}

/* A push for an iteration the chunk has already completed: answer once per round. */
static void push_old(struct ctx *x, uint32_t f)
{
	const struct pbox_msg *m = x->m;
	struct pbox_chunk_state *cs = x->cs;
	struct pbox_slot *sl = &cs->slot[m->iter % x->job->window];
	bool retained;

	PBOX_STAT_ADD(x->e->stats, dups, 1);
	/* Answer a worker's retransmission round (flagged), once, on its last fragment; a
	 * duplicate made by the network carries no flag and is only counted. */
	if (!(m->flags & PBOX_F_RETRANSMIT) || f != x->cd->nfrags - 1) {
		return;
	}
	retained = server_opt(x) ? m->iter + 1 == cs->version
				 : sl->open && sl->iter == m->iter && sl->nfinal == x->cd->nfrags;
	if (!retained) {
		drop(x->e, PBOX_DROP_STALE_ITER);
		send_error(x, ESTALE);
		return;
	}
	if (m->flags & PBOX_F_WANT_REPLY) {
		send_current(x, m->sender, sl, true);
	} else {
		send_ack(x, m->sender, m->iter, x->d->nworkers);
	}
}

static void on_push(struct ctx *x)
{
	const struct pbox_msg *m = x->m;
	struct pbox_chunk_state *cs = x->cs;
	uint32_t f = m->frag_off / x->d->frag_bytes, w = m->sender, t = m->iter;
	size_t fwords = pbox_bitmap_words(x->cd->nfrags);
	struct pbox_slot *sl;
	uint64_t *row;

	if (!cs->initialized) {
		drop(x->e, PBOX_DROP_NOT_READY);
		send_error(x, EAGAIN);
		return;
	}
	if (t < cs->version) {
		push_old(x, f);
		return;
	}
	if (t - cs->version >= x->job->window) {
		drop(x->e, PBOX_DROP_FUTURE_ITER);
		return;
	}
	sl = &cs->slot[t % x->job->window];
	if (!sl->open || sl->iter != t) {
		slot_open(x, sl, t);
	}
	if (m->flags & PBOX_F_WANT_REPLY) {
		pbox_bit_set(sl->want, w);
	}
	row = sl->bits + (size_t)w * fwords;
	if (pbox_bit_test(row, f)) {
		PBOX_STAT_ADD(x->e->stats, dups, 1);
		/* A whole retransmission round of a contribution we already have: the ACK
		 * was lost. Answer once, on the last fragment. */
		if (sl->wcnt[w] == x->cd->nfrags && f == x->cd->nfrags - 1 &&
		    (m->flags & PBOX_F_RETRANSMIT)) {
			send_ack(x, w, t, sl->ndone);
		}
		return;
	}
	pbox_bit_set(row, f);
	sl->wcnt[w]++;
	aggregate(x, sl, f);
	if (sl->wcnt[w] != x->cd->nfrags) {
		return;
	}
	pbox_bit_set(sl->done, w);
	sl->ndone++;
	advance(x);
	/* If the iteration completed just now, a rank that asked for the result has it. */
	if (!(cs->version > t && pbox_bit_test(sl->want, w))) {
		send_ack(x, w, t, sl->ndone);
	}
}

/* Whether a pull for t (not yet answerable) will be answered by the result this rank
 * asked for with its push of the iteration that produces t. */
static bool pull_covered(struct ctx *x, uint32_t t)
{
	uint32_t it = server_opt(x) ? t - 1 : t;
	const struct pbox_slot *sl = &x->cs->slot[it % x->job->window];

	if (server_opt(x) && t == 0) {
		return false;
	}
	return sl->open && sl->iter == it && pbox_bit_test(sl->want, x->m->sender);
}

static void on_pull(struct ctx *x)
{
	const struct pbox_msg *m = x->m;
	struct pbox_chunk_state *cs = x->cs;
	uint32_t t = m->iter, w = m->sender;

	if (server_opt(x)) {
		if (cs->initialized && cs->version >= t) {
			send_current(x, w, NULL, (m->flags & PBOX_F_RETRANSMIT) != 0);
			return;
		}
	} else if (t < cs->version) {
		struct pbox_slot *sl = &cs->slot[t % x->job->window];

		if (sl->open && sl->iter == t && sl->nfinal == x->cd->nfrags) {
			send_current(x, w, sl, (m->flags & PBOX_F_RETRANSMIT) != 0);
		} else {
			drop(x->e, PBOX_DROP_STALE_ITER);
			send_error(x, ESTALE);
		}
		return;
	} else if (t - cs->version >= x->job->window) {
		drop(x->e, PBOX_DROP_FUTURE_ITER);
		return;
	}
	if (m->flags & PBOX_F_RETRANSMIT) {
		/* A worker's probe while it waits: tell it how far the iteration got. */
		uint32_t it = server_opt(x) ? t - 1 : t;
		const struct pbox_slot *sl = &cs->slot[it % x->job->window];

		send_ack(x, w, it, sl->open && sl->iter == it ? sl->ndone : 0);
	}
	if (pull_covered(x, t)) {
		return; /* the result goes to this rank anyway: it asked with its push */
	}
	if (cs->pull_want[w] == PBOX_PULL_NONE) {
		cs->nheld++;
		PBOX_STAT_ADD(x->e->stats, pulls_held, 1);
	}
	cs->pull_want[w] = t;
}

static void on_init(struct ctx *x)
{
	const struct pbox_msg *m = x->m;
	struct pbox_chunk_state *cs = x->cs;
	uint32_t f = m->frag_off / x->d->frag_bytes;

	if (cs->initialized || pbox_bit_test(cs->init_bits, f)) {
		PBOX_STAT_ADD(x->e->stats, dups, 1);
		if (cs->initialized && f == x->cd->nfrags - 1) {
			send_ack(x, 0, 0, 1);
		}
		return;
	}
	if (cs->version != 0) {
		drop(x->e, PBOX_DROP_NOT_ALLOWED);
		return;
	}
	pbox_bit_set(cs->init_bits, f);
	gather_copy(x, (uint8_t *)cs->model[0] + m->frag_off);
	if (++cs->init_nrecv != x->cd->nfrags) {
		return;
	}
	cs->initialized = true;
	send_ack(x, 0, 0, 1);
	answer_held_pulls(x, NULL);
}

/* Validate and dispatch one datagram whose header is hdr (contiguous, total bytes len)
 * and whose payload is in pay[0..npay). */
static void rx_one(struct pbox_engine *e, const struct pbox_jobtab *tab, const void *hdr,
		   size_t len, struct pbox_iov *pay, unsigned npay, const struct pbox_peer *from)
{
	const struct pbox_wire_job *wj = NULL;
	enum pbox_drop_reason r;
	struct pbox_msg m;
	struct ctx x;

	PBOX_STAT_ADD(e->stats, rx_pkts, 1);
	PBOX_STAT_ADD(e->stats, rx_bytes, len);
	r = pbox_wire_validate(hdr, len, PBOX_ROLE_APPLIANCE, pbox_jobtab_lookup, (void *)tab, &m,
			       &wj);
	if (pbox_unlikely(r != PBOX_DROP_NONE)) {
		drop(e, r);
		return;
	}
	if (npay == 1 && pay[0].base == NULL) {
		pay[0].base = m.payload; /* contiguous: just past the header */
	}
	x.e = e;
	x.m = &m;
	x.pay = pay;
	x.npay = npay;
	x.job = pbox_container_of(wj, struct pbox_job, wire);
	x.d = wj->desc;
	x.cd = &x.d->chunks[m.chunk];
	if (pbox_unlikely(x.cd->core != e->core)) {
		drop(e, PBOX_DROP_MISDIRECTED);
		return;
	}
	x.cj = &x.job->state->core[e->core];
	x.cs = &x.cj->chunks[x.cd->local];
	/* Authenticated by its cookie: this is where the rank's replies go now. */
	x.cj->peers[m.sender] = *from;
	if (m.flags & PBOX_F_RETRANSMIT) {
		PBOX_STAT_ADD(e->stats, rx_retransmits, 1);
	}
	if (pbox_unlikely(x.job->run == PBOX_JOB_ABORTED)) {
		drop(e, PBOX_DROP_JOB_ABORTED);
		send_error(&x, x.job->abort_errno);
		return;
	}
	switch (m.type) {
	case PBOX_MSG_PUSH:
		on_push(&x);
		break;
	case PBOX_MSG_PULL:
		on_pull(&x);
		break;
	case PBOX_MSG_INIT:
		on_init(&x);
		break;
	default:
		drop(e, PBOX_DROP_UNEXPECTED);
		break;
	}
}

void pbox_engine_rx(struct pbox_engine *e, const struct pbox_jobtab *tab, const void *pkt,
		    size_t len, const struct pbox_peer *from)
{
	struct pbox_iov pay = { NULL, len > PBOX_WIRE_HDR_LEN ? (uint32_t)(len - PBOX_WIRE_HDR_LEN) : 0 };

	rx_one(e, tab, pkt, len, &pay, 1, from);
}

void pbox_engine_rx_iov(struct pbox_engine *e, const struct pbox_jobtab *tab,
			const struct pbox_iov *seg, unsigned nseg, const struct pbox_peer *from)
{
	struct pbox_iov pay[PBOX_ENGINE_MAX_SEGS];
	uint8_t hdr[PBOX_WIRE_HDR_LEN];
	unsigned npay = 0;
	size_t total = 0, need = PBOX_WIRE_HDR_LEN;

	if (nseg == 1) {
		pbox_engine_rx(e, tab, seg[0].base, seg[0].len, from);
		return;
	}
	if (pbox_unlikely(nseg == 0 || nseg > PBOX_ENGINE_MAX_SEGS)) {
		PBOX_STAT_ADD(e->stats, rx_pkts, 1);
		drop(e, PBOX_DROP_TRUNCATED);
		return;
	}
	/* The header may itself straddle pieces: copy its 64 bytes; the payload pieces are
	 * the rest, referenced in place. */
	for (unsigned i = 0; i < nseg; i++) {
		const uint8_t *p = seg[i].base;
		uint32_t l = seg[i].len;

		total += l;
		if (need != 0) {
			uint32_t take = (uint32_t)PBOX_MIN(need, l);

			memcpy(hdr + PBOX_WIRE_HDR_LEN - need, p, take);
			need -= take;
			p += take;
			l -= take;
		}
		if (l != 0) {
			pay[npay].base = p;
			pay[npay].len = l;
			npay++;
		}
	}
	if (need != 0 || npay == 0) {
		/* Header only (or less): validate what there is as one buffer. */
		rx_one(e, tab, hdr, total, pay, 0, from);
		return;
	}
	/* With exactly one payload piece the fused fast path applies. */
	rx_one(e, tab, hdr, total, pay, npay, from);
}
