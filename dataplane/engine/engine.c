/* SPDX-License-Identifier: BSD-3-Clause */
/* The per-core chunk engine (see engine.h for the protocol rules, sync.h for the models). */
#include "engine.h"

#include <errno.h>
#include <string.h>

#include "bcast.h"
#include "common/bitmap.h"
#include "common/crc.h"
#include "common/log.h"
#include "encoding.h"

struct pbox_mode_ops;

/* Everything one datagram's handling needs, resolved once. */
struct ctx {
	struct pbox_engine *e;
	const struct pbox_job *job;
	const struct pbox_mode_ops *mode; /* the job's */
	const struct pbox_jobdesc *d;
	struct pbox_core_job *cj;
	struct pbox_chunk_state *cs;
	const struct pbox_chunk_desc *cd;
	const struct pbox_msg *m;
	const struct pbox_iov *pay; /* payload pieces: one for contiguous datagrams */
	unsigned npay;
	bool fused;     /* PUSH whose non-finite check is fused into its data pass */
	bool data_done; /* that pass (push_data) has summed the payload into the slot */
	/* A payload that is not dense f32 (encoding.h): its ops and decoded form. */
	const struct pbox_enc_ops *enc;
	struct pbox_enc_msg em;
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

/*
 * What a job mode does with its chunks' iterations (LAYOUT.md seam 3): what a pull or a
 * push-pull asks for, when it can be answered and with what, and what finalising a
 * fragment computes. One table per enum pbox_job_mode (mode_ops[], below the handlers);
 * the handlers call through it instead of testing the mode.
 */
struct pbox_mode_ops {
	const char *name;
	/* What a push-pull of iteration t asks for: the model version after t
	 * (server-optimizer), t's own result (aggregate), or the aggregate of t - s
	 * (broadcast under SSP(s)); PBOX_PULL_NONE: nothing (an ACK only). */
	uint32_t (*push_wants)(const struct ctx *x, uint32_t t);
	/* A request for want is complete with iteration want - want_step: 1 when wants are
	 * model versions (server-optimizer), 0 when they are iterations. A probe for want
	 * reports on that iteration. */
	uint32_t want_step;
	/* Answers are iterations' results kept in the window's slots, gone once the window
	 * moves past them (a request for one no longer or not yet in the window fails), rather
	 * than the chunk's current model. */
	bool slot_results;
	/* Held pulls may be released at the next advance whatever they want (the sync
	 * model's soft barrier, release = "eager"). */
	bool eager_release;
	/* May a request for `want` from rank be answered now (the sync model's condition)? */
	bool (*ready)(const struct ctx *x, uint32_t rank, uint32_t want);
	/* Is want's own iteration complete (the lazy release of a held pull)? */
	bool (*complete)(const struct ctx *x, uint32_t want);
	/* Send rank the answer to a ready request for want. */
	void (*answer)(struct ctx *x, uint32_t rank, uint32_t want, bool resend);
	/* Finalise fragment f of slot sl (the current iteration) from its nsrc
	 * fragment-local sources (see finalize_frag). */
	void (*finalize)(struct ctx *x, struct pbox_slot *sl, uint32_t f, const float *const *src,
			 unsigned nsrc);
};

static struct pbox_slot *slot_of(const struct ctx *x, uint32_t iter)
{
	return &x->cs->slot[iter % x->job->window];
}

static bool slot_holds(const struct pbox_slot *sl, uint32_t iter)
{
	return sl->open && sl->iter == iter;
}

/* ---- sending ----------------------------------------------------------------------- */

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

static void send_ack(struct ctx *x, uint32_t rank, uint32_t iter, uint32_t ndone, uint16_t flags)
{
	struct pbox_msg m = {
		.type = PBOX_MSG_ACK,
		.encoding = PBOX_ENC_NONE,
		.flags = flags,
		.iter = iter,
		/* seq echoed only to the sender of the message being handled */
		.arg0 = x->m != NULL && x->m->sender == rank && !(flags & PBOX_F_RETRY) ? x->m->seq
											: 0,
		.arg1 = ndone,
	};

	xmit(x, rank, &m, NULL);
	PBOX_STAT_ADD(x->e->stats, acks, 1);
}

/* A NACK: rank's contribution (or INIT, flags PBOX_F_OF_INIT) of iteration iter is
 * incomplete; row (one bit per fragment) says which fragments are held. Answers the last
 * datagram of the rank's send round (PBOX_F_LAST), so it re-sends only what is missing. */
static void send_nack(struct ctx *x, uint32_t rank, uint32_t iter, const uint64_t *row,
		      uint32_t ndone, uint16_t flags)
{
	uint32_t base;
	struct pbox_msg m = {
		.type = PBOX_MSG_ACK,
		.encoding = PBOX_ENC_NONE,
		.flags = PBOX_F_SACK | flags,
		.iter = iter,
		.arg0 = x->m->seq,
		.arg1 = ndone,
	};

	pbox_sack_build(row, x->cd->nfrags, &base, &m.sack);
	if (pbox_unlikely(base >= x->cd->nfrags)) {
		return; /* complete after all: the ACK or the result says so */
	}
	m.frag_off = base * x->d->frag_bytes;
	xmit(x, rank, &m, NULL);
	PBOX_STAT_ADD(x->e->stats, acks, 1);
	PBOX_STAT_ADD(x->e->stats, nacks, 1);
}

/* Whether the message being handled ends its sender's send round (the worker flags the
 * last datagram of every round; fragment nfrags - 1 ends every full one). */
static bool ends_round(const struct ctx *x, uint32_t f)
{
	return (x->m->flags & PBOX_F_LAST) || f == x->cd->nfrags - 1;
}

static void send_error(struct ctx *x, uint32_t rank, uint32_t iter, int err)
{
	struct pbox_msg m = {
		.type = PBOX_MSG_ERROR,
		.encoding = PBOX_ENC_NONE,
		.iter = iter,
		.arg0 = (uint32_t)err,
		.arg1 = x->m != NULL && x->m->sender == rank ? x->m->type : 0,
	};

	xmit(x, rank, &m, NULL);
	PBOX_STAT_ADD(x->e->stats, errors_sent, 1);
}

/* Send the whole result buffer of the chunk to rank, labelled with iter/version; *ref
 * records the transport reference of the last datagram pointing into buf. rsl: the slot
 * whose accumulator buf is (its result may go encoded: encoding.h), or NULL. */
static void send_result(struct ctx *x, uint32_t rank, uint32_t label, const float *buf,
			uint64_t *ref, bool resend, const struct pbox_slot *rsl)
{
	const uint8_t *p = (const uint8_t *)buf;
	/* A pull that says which fragments of this very result the rank already holds gets
	 * only the others (selective repeat of results). */
	bool sack = x->m != NULL && x->m->type == PBOX_MSG_PULL && x->m->sender == rank &&
		    (x->m->flags & PBOX_F_SACK) && x->m->arg0 == label;
	uint32_t base = sack ? x->m->frag_off / x->d->frag_bytes : 0;

	for (uint32_t f = 0; f < x->cd->nfrags; f++) {
		if (sack && pbox_sack_has(base, x->m->sack, f)) {
			continue;
		}
		struct pbox_msg m = {
			.type = PBOX_MSG_DATA,
			.encoding = PBOX_ENC_F32,
			.flags = resend ? PBOX_F_RETRANSMIT : 0,
			.iter = label,
			.frag_off = f * x->d->frag_bytes,
			.frag_len = pbox_frag_len(x->d, x->cd->bytes, f),
			.arg0 = x->job->nlive,
		};
		const void *pl = rsl == NULL ? p + m.frag_off
					     : pbox_enc_result_frag(x->job, rsl, f, m.frag_off,
								    &m.frag_len, &m.encoding);

		xmit(x, rank, &m, pl);
	}
	*ref = x->e->tx->queued(x->e->tx_ctx);
	if (resend) {
		PBOX_STAT_ADD(x->e->stats, replies_resent, 1);
	}
}

/* ---- pulls --------------------------------------------------------------------------- */

/* Whether a request for `want` (server-optimizer: a model version; aggregate: the result
 * of an iteration) can be answered now under the job's synchronisation model. */
static bool want_ready(const struct ctx *x, uint32_t rank, uint32_t want)
{
	return x->mode->ready(x, rank, want);
}

/* Server-optimizer: want is a model version, gated by the sync model. */
static bool ready_model(const struct ctx *x, uint32_t rank, uint32_t want)
{
	const struct pbox_chunk_state *cs = x->cs;

	return cs->initialized &&
	       x->job->sync->ready(&x->job->sync_cfg, x->job->wire.id, rank, want, cs->version);
}

static bool complete_model(const struct ctx *x, uint32_t want)
{
	return x->cs->initialized && want <= x->cs->version;
}

/* Aggregate: want is an iteration, whose result exists once it is complete. */
static bool complete_result(const struct ctx *x, uint32_t want)
{
	return want < x->cs->version;
}

static bool ready_result(const struct ctx *x, uint32_t rank, uint32_t want)
{
	(void)rank;
	return complete_result(x, want);
}

/* Answer a ready request (mode ops' answer). */
static void answer(struct ctx *x, uint32_t rank, uint32_t want, bool resend)
{
	struct pbox_chunk_state *cs = x->cs;

	/* A held pull for this very want is answered now (a probe or a resend found it
	 * ready first): forget it, or its later release would send the rank an unasked
	 * result that a newer push-pull of the rank could take for its own answer and stop
	 * sending data the appliance may still miss (a stall under loss). */
	if (want != PBOX_PULL_NONE && cs->pull_want[rank] == want) {
		cs->pull_want[rank] = PBOX_PULL_NONE;
		cs->nheld--;
	}
	x->mode->answer(x, rank, want, resend);
}

/* Server-optimizer: the current model. */
static void answer_model(struct ctx *x, uint32_t rank, uint32_t want, bool resend)
{
	struct pbox_chunk_state *cs = x->cs;

	(void)want;
	send_result(x, rank, cs->version, cs->model[cs->version & 1],
		    &cs->model_ref[cs->version & 1], resend, NULL);
}

/* Aggregate: the retained result of iteration want (the newest one, for drop-stragglers,
 * if want's is no longer kept). */
static void answer_result(struct ctx *x, uint32_t rank, uint32_t want, bool resend)
{
	struct pbox_chunk_state *cs = x->cs;
	struct pbox_slot *sl;

	sl = slot_of(x, want);
	if (!slot_holds(sl, want) && x->job->sync->folds_late && cs->version > 0) {
		want = cs->version - 1;
		sl = slot_of(x, want);
	}
	if (!slot_holds(sl, want)) {
		drop(x->e, PBOX_DROP_STALE_ITER);
		send_error(x, rank, want, ESTALE);
		return;
	}
	send_result(x, rank, sl->iter, sl->acc, &sl->acc_ref, resend, sl);
}

static void hold(struct ctx *x, uint32_t rank, uint32_t want)
{
	struct pbox_chunk_state *cs = x->cs;

	if (pbox_unlikely(want == PBOX_PULL_NONE)) {
		/* The one value pull_want cannot record (it means "no pull held"): counting it
		 * would leave nheld above the pulls held, for good. Never a version a chunk
		 * reaches in a session; the worker asks again. */
		drop(x->e, PBOX_DROP_FUTURE_ITER);
		return;
	}
	if (cs->pull_want[rank] == PBOX_PULL_NONE) {
		cs->nheld++;
		PBOX_STAT_ADD(x->e->stats, pulls_held, 1);
		cs->pull_want[rank] = want;
	} else if (want < cs->pull_want[rank]) {
		cs->pull_want[rank] = want;
	}
}

/* ---- TSB: results down the job's broadcast tree (bcast.h) ---------------------------- */

/* Whether the job's results are broadcasts sent down its tree: BSP answers every live
 * rank with the same result of each iteration, at the advance. */
static bool tree_on(const struct ctx *x)
{
	return x->job->tsb != NULL && x->job->sync_cfg.model == PBOX_SYNC_BSP &&
	       !x->job->sync_cfg.eager;
}

/* Whether `want` is the result the last advance sent down the tree. */
static bool tree_sent(const struct ctx *x, uint32_t want)
{
	return x->cs->version > 0 && want == x->cs->version - 1 + x->mode->want_step;
}

/* The chunk just advanced: send its result once down the tree, and forget the held pulls
 * it answers (every live rank gets it from its parent or from the appliance). */
static void tree_broadcast(struct ctx *x, struct pbox_slot *sl)
{
	struct pbox_chunk_state *cs = x->cs;
	/* The result the advance produced: the slot's (results kept in slots) or the new
	 * model version. */
	bool in_slot = x->mode->slot_results;
	uint32_t label = in_slot ? sl->iter : cs->version;
	const uint8_t *p = (const uint8_t *)(in_slot ? sl->acc : cs->model[cs->version & 1]);

	for (uint32_t f = 0; f < x->cd->nfrags; f++) {
		struct pbox_msg m = {
			.type = PBOX_MSG_DATA,
			.encoding = PBOX_ENC_F32,
			.job = x->job->wire.id,
			.chunk = cs->id,
			.chunk_len = x->cd->bytes,
			.iter = label,
			.frag_off = f * x->d->frag_bytes,
			.frag_len = pbox_frag_len(x->d, x->cd->bytes, f),
			.arg0 = x->job->nlive,
		};

		/* With DVF, the very bytes a star reply sends: the fragment filtered once at
		 * its finalisation (encoding.h); a repair resends them too. */
		const void *pl = in_slot ? pbox_enc_result_frag(x->job, sl, f, m.frag_off,
								&m.frag_len, &m.encoding)
					 : p + m.frag_off;

		pbox_tsb_send_frag(x->job->tsb, x->e->core, x->job->live, x->cj->peers, x->e->tx,
				   x->e->tx_ctx, &m, pl, x->e->stats);
	}
	if (in_slot) {
		sl->acc_ref = x->e->tx->queued(x->e->tx_ctx);
	} else {
		cs->model_ref[cs->version & 1] = x->e->tx->queued(x->e->tx_ctx);
	}
	for (uint32_t w = 0; w < x->d->nworkers && cs->nheld > 0; w++) {
		if (cs->pull_want[w] == label && pbox_bit_test(x->job->live, w)) {
			cs->pull_want[w] = PBOX_PULL_NONE;
			cs->nheld--;
		}
	}
}

/* After an advance: answer held pulls whose condition now holds (lazy: their own
 * iteration is complete; eager: every held pull, at the first advance). */
static void release_held(struct ctx *x)
{
	struct pbox_chunk_state *cs = x->cs;
	bool eager = x->job->sync_cfg.eager && x->mode->eager_release;

	for (uint32_t w = 0; w < x->d->nworkers && cs->nheld > 0; w++) {
		uint32_t want = cs->pull_want[w];

		if (want == PBOX_PULL_NONE) {
			continue;
		}
		if ((eager && cs->initialized) || x->mode->complete(x, want)) {
			cs->pull_want[w] = PBOX_PULL_NONE;
			cs->nheld--;
			answer(x, w, want, false);
		}
	}
}

/* Pushes refused because the window was full: tell those ranks to resend now. */
static void unblock(struct ctx *x)
{
	uint32_t w;

	PBOX_BIT_FOREACH(w, x->cs->blocked, x->d->nworkers)
	{
		send_ack(x, w, x->cs->version, 0, PBOX_F_RETRY);
	}
	pbox_bitmap_zero(x->cs->blocked, x->d->nworkers);
}

/* ---- aggregation and finalisation ------------------------------------------------------ */

/*
 * Finalise fragment f of slot sl (the chunk's current iteration): reduce the sources and
 * either run the optimizer into the next model version (server-optimizer) or write the
 * sum / mean into the accumulator (aggregate). src are the fragment-local sources.
 */
static void finalize_frag(struct ctx *x, struct pbox_slot *sl, uint32_t f, const float *const *src,
			  unsigned nsrc)
{
	x->mode->finalize(x, sl, f, src, nsrc);
	sl->need[f] = PBOX_FRAG_FINAL;
	sl->nfinal++;
}

/* Server-optimizer: run the optimizer into the next model version. */
static void finalize_opt(struct ctx *x, struct pbox_slot *sl, uint32_t f, const float *const *src,
			 unsigned nsrc)
{
	struct pbox_opt_step st;
	struct pbox_chunk_state *cs = x->cs;
	uint32_t in = cs->version & 1, out = in ^ 1;
	uint32_t off = f * x->d->frag_bytes / 4;
	uint32_t n = pbox_frag_len(x->d, x->cd->bytes, f) / 4;
	const float *sum[1] = { sl->acc + off };

	if (nsrc > 4) {
		/* Deterministic mode, many workers: sum the staged copies first with the
		 * reduce kernel, which reads them source by source (the optimizer
		 * kernels read every source for every vector: a cache and TLB miss
		 * each). The same additions in the same order: bit-identical. The
		 * accumulator is free: deterministic slots sum only in the stage. */
		x->e->kern->reduce(sl->acc + off, src, nsrc, n, 1.0f);
		src = sum;
		nsrc = 1;
	}

	/* Version v + 1 is written over version v - 1, which replies may still
	 * reference on a zero-copy transport. */
	reclaim(x->e, cs->model_ref[out]);
	pbox_res_gen_bump(cs->model_gen[out]); /* shm workers may still read version v - 1 */
	x->job->opt->prepare(&x->job->opt_params, (uint64_t)cs->version + 1, &st);
	x->job->opt->kernel(x->e->kern)(cs->model[out] + off, cs->model[in] + off,
					cs->s0 ? cs->s0 + off : NULL, cs->s1 ? cs->s1 + off : NULL,
					src, nsrc, n, &x->job->opt_params, &st);
}

/* Aggregate: write the sum / mean into the accumulator. */
static void finalize_reduce(struct ctx *x, struct pbox_slot *sl, uint32_t f,
			    const float *const *src, unsigned nsrc)
{
	uint32_t off = f * x->d->frag_bytes / 4;
	uint32_t n = pbox_frag_len(x->d, x->cd->bytes, f) / 4;
	float div = x->job->reduce == PBOX_REDUCE_MEAN ? (float)PBOX_MAX(sl->fcnt[f], 1) : 1.0f;

	x->e->kern->reduce(sl->acc + off, src, nsrc, n, div);
	if (sl->enc != NULL) {
		pbox_enc_result_final(x->e, x->job, x->cs, sl, f, off * 4, n);
	}
}

/* Deterministic mode: the staged copies of the ranks that contributed fragment f, in rank
 * order. Returns their count. */
static unsigned staged_sources(const struct ctx *x, const struct pbox_slot *sl, uint32_t f,
			       const float **src)
{
	size_t fwords = pbox_bitmap_words(x->cd->nfrags);
	uint32_t off = f * x->d->frag_bytes / 4;
	unsigned n = 0;

	for (uint32_t w = 0; w < x->d->nworkers; w++) {
		if (pbox_bit_test(sl->bits + (size_t)w * fwords, f)) {
			src[n++] = sl->stage[w] + off;
		}
	}
	return n;
}

/* Finalise, from stored sums, every fragment of the current slot that needs nothing more
 * (used when an iteration becomes current after its data arrived, or after a member
 * left). */
static void finalize_ready(struct ctx *x, struct pbox_slot *sl)
{
	for (uint32_t f = 0; f < x->cd->nfrags; f++) {
		uint32_t off = f * x->d->frag_bytes / 4;

		if (sl->need[f] != 0) {
			continue;
		}
		if (x->job->deterministic) {
			const float *stage[PBOX_MAX_WORKERS];
			unsigned n = staged_sources(x, sl, f, stage);

			if (n != 0) {
				finalize_frag(x, sl, f, stage, n);
				continue;
			}
			/* Every contributor left before sending it: a zero gradient. */
		}
		{
			const float *src[1] = { sl->acc + off };

			if (sl->fcnt[f] == 0) {
				memset(sl->acc + off, 0, pbox_frag_len(x->d, x->cd->bytes, f));
			}
			finalize_frag(x, sl, f, src, 1);
		}
	}
}

/* Complete iterations in order while the current one has every fragment final. */
static void advance(struct ctx *x)
{
	struct pbox_chunk_state *cs = x->cs;
	bool moved = false;

	for (;;) {
		struct pbox_slot *sl = slot_of(x, cs->version);

		if (!slot_holds(sl, cs->version)) {
			break;
		}
		if (sl->nfinal != x->cd->nfrags) {
			finalize_ready(x, sl);
			if (sl->nfinal != x->cd->nfrags) {
				break;
			}
		}
		/* The only writer; pboxd's stats read it from another thread. */
		__atomic_store_n(&cs->version, cs->version + 1, __ATOMIC_RELEASE);
		pbox_chunk_snap(x->job, x->cd, cs); /* a checkpoint wants this version? */
		moved = true;
		PBOX_STAT_ADD(x->e->stats, iterations, 1);
		if (tree_on(x)) {
			tree_broadcast(x, sl);
		}
		release_held(x);
	}
	if (moved && pbox_bit_next(cs->blocked, 0, x->d->nworkers) < x->d->nworkers) {
		unblock(x);
	}
}

static void slot_open(struct ctx *x, struct pbox_slot *sl, uint32_t iter)
{
	uint32_t nw = x->d->nworkers, q;
	size_t fwords = pbox_bitmap_words(x->cd->nfrags);

	/* The slot's accumulator may still be the result of iter - window, referenced by
	 * replies. */
	reclaim(x->e, sl->acc_ref);
	pbox_res_gen_bump(sl->acc_gen); /* shm workers may still read iter - window */
	if (sl->open && x->job->sync->folds_late) {
		/* A straggler's partial contribution to the iteration leaving the window keeps
		 * its fragment bitmap, so its retransmissions are not counted twice. */
		for (uint32_t w = 0; w < nw; w++) {
			if (sl->wcnt[w] != 0 && sl->wcnt[w] != x->cd->nfrags &&
			    x->cs->late_iter[w] != sl->iter) {
				x->cs->late_iter[w] = sl->iter;
				x->cs->late_cnt[w] = sl->wcnt[w];
				memcpy(x->cs->late_bits + (size_t)w * fwords,
				       sl->bits + (size_t)w * fwords, fwords * 8);
			}
		}
	}
	q = x->job->sync->quorum(&x->job->sync_cfg, x->job->nlive);
	sl->quorum = q;
	sl->iter = iter;
	sl->ndone = 0;
	sl->nfinal = 0;
	sl->open = true;
	memset(sl->bits, 0, nw * fwords * sizeof(uint64_t));
	memset(sl->wcnt, 0, nw * sizeof(uint16_t));
	memset(sl->fcnt, 0, x->cd->nfrags * sizeof(uint16_t));
	for (uint32_t f = 0; f < x->cd->nfrags; f++) {
		sl->need[f] = (uint16_t)q;
	}
	pbox_bitmap_zero(sl->done, nw);
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

/* Add the payload into acc at fragment f (copy if it is the first data there). */
static void accumulate(struct ctx *x, struct pbox_slot *sl, uint32_t f)
{
	float *acc = sl->acc + x->m->frag_off / 4;

	if (x->data_done) {
		/* push_data already copied / added it, with the non-finite check */
	} else if (x->enc != NULL) {
		if (sl->fcnt[f] == 0) {
			x->enc->copy(x->e, &x->em, acc, pbox_frag_len(x->d, x->cd->bytes, f) / 4);
		} else {
			x->enc->add(x->e, &x->em, acc);
		}
	} else if (sl->fcnt[f] == 0) {
		gather_copy(x, acc);
	} else if (x->npay == 1) {
		x->e->kern->add(acc, x->pay[0].base, x->m->frag_len / 4);
	} else {
		gather_add(x, acc);
	}
	sl->fcnt[f]++;
}

/* Drop-stragglers: a fragment that arrived after its iteration no longer needed it is
 * added to the first later iteration whose fragment is still open: never lost. */
static void fold(struct ctx *x, uint32_t iter, uint32_t f)
{
	struct pbox_chunk_state *cs = x->cs;
	uint32_t u = PBOX_MAX(iter + 1, cs->version);

	for (; u < cs->version + x->job->window; u++) {
		struct pbox_slot *sl = slot_of(x, u);

		if (!slot_holds(sl, u)) {
			slot_open(x, sl, u);
		}
		if (sl->need[f] == PBOX_FRAG_FINAL) {
			continue;
		}
		accumulate(x, sl, f);
		PBOX_STAT_ADD(x->e->stats, folded_frags, 1);
		return;
	}
	/* The window has no open iteration after `iter`: cannot happen while window >= 3
	 * (the next iteration is always inside it); counted if it ever does. */
	drop(x->e, PBOX_DROP_STALE_ITER);
}

/*
 * One new fragment of rank w's contribution to slot sl. If it completes the fragment for
 * the chunk's current iteration, the optimizer (or the final reduce) runs at once, fused
 * with this last add.
 */
static void aggregate(struct ctx *x, struct pbox_slot *sl, uint32_t f)
{
	const struct pbox_msg *m = x->m;
	uint32_t off = m->frag_off / 4;
	bool final_now;

	PBOX_STAT_ADD(x->e->stats, agg_frags, 1);
	PBOX_STAT_ADD(x->e->stats, agg_bytes, m->frag_len);
	if (sl->need[f] == 0 || sl->need[f] == PBOX_FRAG_FINAL) {
		/* The fragment already has its quorum: a straggler's part. */
		fold(x, sl->iter, f);
		return;
	}
	sl->need[f]--;
	final_now = sl->need[f] == 0 && sl->iter == x->cs->version;
	if (x->job->deterministic) {
		if (x->enc != NULL) {
			x->enc->copy(x->e, &x->em, sl->stage[m->sender] + off,
				     pbox_frag_len(x->d, x->cd->bytes, f) / 4);
		} else if (!x->data_done) {
			gather_copy(x, sl->stage[m->sender] + off);
		}
		sl->fcnt[f]++;
		if (final_now) {
			const float *stage[PBOX_MAX_WORKERS];

			finalize_frag(x, sl, f, stage, staged_sources(x, sl, f, stage));
		}
		return;
	}
	if (final_now && x->data_done) {
		/* push_data summed it in its final form (final_fusable): the rest of
		 * finalize_reduce, without reading the payload again */
		sl->fcnt[f]++;
		if (sl->enc != NULL) {
			pbox_enc_result_final(x->e, x->job, x->cs, sl, f, off * 4,
					      pbox_frag_len(x->d, x->cd->bytes, f) / 4);
		}
		sl->need[f] = PBOX_FRAG_FINAL;
		sl->nfinal++;
		return;
	}
	if (final_now && x->npay == 1 && x->enc == NULL) {
		/* Payloads are read in place (they may be unaligned; kernels allow that). */
		const float *src[2] = { sl->acc + off, x->pay[0].base };

		sl->fcnt[f]++;
		if (sl->fcnt[f] == 1) {
			finalize_frag(x, sl, f, &src[1], 1);
		} else {
			finalize_frag(x, sl, f, src, 2);
		}
		return;
	}
	accumulate(x, sl, f);
	if (final_now) {
		/* Multi-piece payload: summed into acc above; (acc + g) stored and read back
		 * is the same float as fused in registers. */
		const float *src[1] = { sl->acc + off };

		finalize_frag(x, sl, f, src, 1);
	}
}

/* ---- message handlers ----------------------------------------------------------------- */

static uint32_t want_of_push(const struct ctx *x, uint32_t iter)
{
	return x->mode->push_wants(x, iter);
}

/* Server-optimizer: the model version after iteration t. */
static uint32_t push_wants_next(const struct ctx *x, uint32_t t)
{
	(void)x;
	return t + 1;
}

/* Aggregate: iteration t's own result. */
static uint32_t push_wants_same(const struct ctx *x, uint32_t t)
{
	(void)x;
	return t;
}

/* Broadcast: the aggregate the blocking rule makes the worker wait for (engine.h). */
static uint32_t push_wants_lagged(const struct ctx *x, uint32_t t)
{
	uint32_t s = x->job->sync->worker_staleness(&x->job->sync_cfg);

	return t >= s ? t - s : PBOX_PULL_NONE;
}

/* Rank w's contribution is complete and consumed: answer its pull or acknowledge it. */
static void contribution_done(struct ctx *x, uint32_t w, uint32_t iter, uint32_t ndone)
{
	uint32_t want = want_of_push(x, iter);

	if (want == PBOX_PULL_NONE) {
		send_ack(x, w, iter, ndone, 0); /* nothing asked for yet (broadcast, t < s) */
		return;
	}
	if ((x->m->flags & PBOX_F_WANT_REPLY) && want_ready(x, w, want)) {
		if (tree_on(x) && tree_sent(x, want)) {
			send_ack(x, w, iter, ndone, 0); /* the result comes down the tree */
			return;
		}
		answer(x, w, want, false);
		return;
	}
	send_ack(x, w, iter, ndone, 0);
	if (x->m->flags & PBOX_F_WANT_REPLY) {
		hold(x, w, want);
	}
}

/* A fragment the appliance already has. If it ends a worker's retransmission round (the
 * flagged last fragment; network duplicates carry no flag) of a contribution that is
 * complete, the ACK (or result) was lost: answer again, once. If the contribution is
 * still incomplete (row: its fragments held), the round's end is answered with a NACK. */
static void push_duplicate(struct ctx *x, uint32_t f, bool complete, uint32_t ndone,
			   const uint64_t *row)
{
	const struct pbox_msg *m = x->m;

	PBOX_STAT_ADD(x->e->stats, dups, 1);
	if (!complete && row != NULL && (m->flags & PBOX_F_LAST)) {
		send_nack(x, m->sender, m->iter, row, ndone, 0);
		return;
	}
	if (!complete || !(m->flags & PBOX_F_RETRANSMIT) || !ends_round(x, f)) {
		return;
	}
	if ((m->flags & PBOX_F_WANT_REPLY) && want_of_push(x, m->iter) != PBOX_PULL_NONE) {
		uint32_t want = want_of_push(x, m->iter);

		if (want_ready(x, m->sender, want)) {
			answer(x, m->sender, want, true);
			return;
		}
		hold(x, m->sender, want);
	}
	send_ack(x, m->sender, m->iter, ndone, 0);
}

/* Contributions of rank w that are started but not complete (NOTIFY-ACK credits). */
static uint32_t outstanding(const struct ctx *x, uint32_t w)
{
	const struct pbox_chunk_state *cs = x->cs;
	uint32_t n = 0;

	for (uint32_t s = 0; s < x->job->window; s++) {
		const struct pbox_slot *sl = &cs->slot[s];

		n += sl->open && sl->wcnt[w] != 0 && sl->wcnt[w] != x->cd->nfrags;
	}
	if (x->job->sync->folds_late) {
		n += cs->late_cnt[w] != 0 && cs->late_cnt[w] != x->cd->nfrags;
	}
	return n;
}

/* Drop-stragglers, ASP: a push for an iteration already complete is folded forward. */
static void push_late(struct ctx *x, uint32_t f)
{
	const struct pbox_msg *m = x->m;
	struct pbox_chunk_state *cs = x->cs;
	uint32_t w = m->sender, t = m->iter;
	size_t fwords = pbox_bitmap_words(x->cd->nfrags);
	struct pbox_slot *sl = slot_of(x, t);
	bool in_window = slot_holds(sl, t), complete;
	uint64_t *row;
	uint16_t *cnt;

	/* A contribution not started yet takes a credit; the rest of a started one (in t's
	 * slot while t is in the window, in late_* after slot_open moved it) does not. */
	if ((in_window ? sl->wcnt[w] == 0 : cs->late_iter[w] != t) &&
	    outstanding(x, w) >= x->job->credits) {
		drop(x->e, PBOX_DROP_CREDIT);
		return;
	}
	if (in_window) {
		row = sl->bits + (size_t)w * fwords;
		cnt = &sl->wcnt[w];
	} else {
		row = cs->late_bits + (size_t)w * fwords;
		cnt = &cs->late_cnt[w];
		if (cs->late_iter[w] != t) {
			cs->late_iter[w] = t;
			memset(row, 0, fwords * 8);
			*cnt = 0;
		}
	}
	if (pbox_bit_test(row, f)) {
		push_duplicate(x, f, *cnt == x->cd->nfrags, 0, row);
		return;
	}
	/* Counted before folding: fold may open t + window in t's slot, which moves this
	 * contribution (bits and count) to late_* if it is still partial. */
	pbox_bit_set(row, f);
	complete = ++*cnt == x->cd->nfrags;
	PBOX_STAT_ADD(x->e->stats, agg_frags, 1);
	PBOX_STAT_ADD(x->e->stats, agg_bytes, m->frag_len);
	fold(x, t, f);
	if (complete) {
		PBOX_STAT_ADD(x->e->stats, late_contribs, 1);
		contribution_done(x, w, t, 0);
	} else if (m->flags & PBOX_F_LAST) {
		/* row may have moved to late_* in fold(): describe the current one */
		send_nack(x, w, t,
			  slot_holds(sl, t) ? sl->bits + (size_t)w * fwords
					    : cs->late_bits + (size_t)w * fwords,
			  0, 0);
	}
}

/*
 * Count n NaN / Inf values found in a PUSH or INIT payload and apply the job's policy:
 * under non_finite = "reject" the datagram is dropped, counted, and answered with
 * PBOX_MSG_ERROR(EDOM) so the worker's operation fails with the cause (the iteration
 * cannot complete without that rank's finite contribution; nothing is silently lost or
 * poisoned). Returns whether to go on.
 */
static bool nonfinite_found(struct ctx *x, size_t n)
{
	PBOX_STAT_ADD(x->e->stats, nonfinite, n);
	PBOX_STAT_ADD(x->cj, nonfinite, n);
	if (x->job->non_finite == PBOX_NON_FINITE_PROPAGATE) {
		return true;
	}
	drop(x->e, PBOX_DROP_NON_FINITE);
	send_error(x, x->m->sender, x->m->iter, EDOM);
	return false;
}

/*
 * Whether the final arrival of a fragment can be summed with its check fused in: an
 * aggregate job (the final reduce is a sum or mean into the accumulator) under
 * "propagate", where nothing is refused and so nothing would need undoing (sum2_nonfinite
 * in push_data). Under "reject" the final sum overwrites the accumulator, so the payload is
 * checked first, apart, and then summed from cache. The exact one-pass forms were
 * measured against that (perf/engine/README.md, "reject" in one pass; pbox-bench-reject):
 * the sum written to a core-local stage then copied, or beside the accumulator (a second
 * accumulator per slot), or in place after copying the accumulator's fragment aside (put
 * back if refused). On the 8 KB and 32 KB fragments of MTU 9000 / 65535 none beat
 * check-then-sum except the undo copy at <= 8 KB in a kernel loop, and that one, built
 * into the engine, was no faster warm and 9-15 % slower with payloads from DRAM: every
 * exact form stores the fragment once more, which costs what the second read saves.
 */
static bool final_fusable(const struct ctx *x)
{
	return x->job->mode == PBOX_MODE_AGGREGATE &&
	       x->job->non_finite == PBOX_NON_FINITE_PROPAGATE;
}

/*
 * Whether on_push will take this PUSH straight to accumulate() of its slot, with no
 * effect before that data pass other than marking it received (and, under "propagate",
 * opening the slot): a contiguous payload (the fast path of every transport), an iteration
 * in the window, credit available, not a duplicate, and a fragment that does not fold
 * (quorum reached) and, unless in deterministic mode or final_fusable(), does not finalise
 * now (the optimizer / final reduce reads the payload while writing the model or the
 * result, so its check must come first; deterministic mode copies the payload to the rank's
 * stage before finalising; an aggregate job under "propagate" refuses nothing). Then the
 * non-finite check is fused into that pass (push_data) instead of a separate scan of the
 * payload; every other PUSH is scanned first by finite_ok(), as INIT is. Side-effect free;
 * mirrors on_push's and aggregate()'s tests in their order (test_engine checks the
 * counters of both routes).
 */
static bool push_fusable(const struct ctx *x)
{
	const struct pbox_msg *m = x->m;
	const struct pbox_chunk_state *cs = x->cs;
	uint32_t w = m->sender, t = m->iter, f;
	const struct pbox_slot *sl;

	if (x->npay != 1 || t >= PBOX_ITER_LIMIT || !cs->initialized || t < cs->version ||
	    t - cs->version >= x->job->window) {
		return false;
	}
	sl = slot_of(x, t);
	if (!slot_holds(sl, t)) {
		/* The slot's first datagram: on_push opens the slot before the data pass, which
		 * only a check that refuses nothing may follow ("propagate": the counts come
		 * out the same either side of slot_open); the fragment is then empty, a first
		 * arrival (copy_nonfinite), a final one only where that is fusable too. */
		return x->job->non_finite == PBOX_NON_FINITE_PROPAGATE &&
		       (x->job->deterministic || final_fusable(x)) &&
		       outstanding(x, w) < x->job->credits;
	}
	if (sl->wcnt[w] == 0 && outstanding(x, w) >= x->job->credits) {
		return false;
	}
	f = m->frag_off / x->d->frag_bytes;
	if (pbox_bit_test(sl->bits + (size_t)w * pbox_bitmap_words(x->cd->nfrags), f)) {
		return false;
	}
	return sl->need[f] != 0 && sl->need[f] != PBOX_FRAG_FINAL &&
	       (x->job->deterministic || !(sl->need[f] == 1 && t == cs->version) ||
		final_fusable(x));
}

/*
 * The data pass of a PUSH that push_fusable() admitted, with its non-finite check fused
 * in, made before on_push marks anything; aggregate() then does the bookkeeping only.
 *   First data of the fragment (fcnt 0): copy and count in one pass (copy_nonfinite).
 *   Refused, it leaves the fragment of the accumulator holding the copied bytes, but the
 *   fragment stays empty (fcnt 0, bits, wcnt, need unchanged), and an empty fragment's
 *   bytes are never read: the next data there is copied over them (accumulate, here),
 *   a fragment finalised empty is zeroed first (finalize_ready), the fused final add
 *   with fcnt 1 reads the payload only (aggregate), and results are sent only from
 *   completed iterations (answer: want < version), which this slot is not.
 *   Deterministic mode: copy and count into the rank's stage (copy_nonfinite), before
 *   aggregate() finalises. Refused, the staged bytes are never read: staged_sources()
 *   lists only ranks whose fragment bit is set, which it is not, and the rank's next
 *   copy of the fragment overwrites them.
 *   Final data of an aggregate fragment under "propagate" (final_fusable): the final sum
 *   or mean and the count in one pass (sum2_nonfinite); aggregate() then only marks the
 *   fragment final (and encodes the result where the slot has a result encoding).
 *   Later data under "propagate": add and count in one pass (add_nonfinite).
 *   Later data under "reject": nothing may be added before all of it is checked (an
 *   addition cannot be undone bit-exactly): add_finite checks the fragment, then adds
 *   it from L1 (a datagram, <= 9 KB); the accumulator is untouched if refused.
 * The counts, drop reasons and answers are those of finite_ok() followed by on_push:
 * nothing before this point counted or answered anything. Returns whether to go on.
 */
static bool push_data(struct ctx *x, struct pbox_slot *sl, uint32_t f)
{
	const struct pbox_kernels *k = x->e->kern;
	float *acc = sl->acc + x->m->frag_off / 4;
	const float *g = x->pay[0].base;
	size_t nf = x->pay[0].len / 4, n; /* frag_len, a multiple of 4 (wire.c) */

	if (x->job->deterministic) {
		n = k->copy_nonfinite(sl->stage[x->m->sender] + x->m->frag_off / 4, g, nf);
	} else if (sl->fcnt[f] == 0) {
		/* also a final arrival that is the fragment's only data: its sum / mean (mean
		 * of one: / 1) is the payload itself */
		n = k->copy_nonfinite(acc, g, nf);
	} else if (sl->need[f] == 1 && sl->iter == x->cs->version) {
		/* the final arrival (final_fusable): the final reduce of aggregate() */
		float div = x->job->reduce == PBOX_REDUCE_MEAN ? (float)(sl->fcnt[f] + 1) : 1.0f;

		n = k->sum2_nonfinite(acc, acc, g, nf, div);
	} else if (x->job->non_finite == PBOX_NON_FINITE_PROPAGATE) {
		n = k->add_nonfinite(acc, g, nf);
	} else {
		n = k->add_finite(acc, g, nf);
	}
	if (pbox_likely(n == 0)) {
		x->data_done = true;
		return true;
	}
	x->data_done = nonfinite_found(x, n);
	return x->data_done;
}

static void on_push(struct ctx *x)
{
	const struct pbox_msg *m = x->m;
	struct pbox_chunk_state *cs = x->cs;
	uint32_t f = m->frag_off / x->d->frag_bytes, w = m->sender, t = m->iter, want;
	size_t fwords = pbox_bitmap_words(x->cd->nfrags);
	struct pbox_slot *sl;
	uint64_t *row;
	bool fresh;

	if (pbox_unlikely(t >= PBOX_ITER_LIMIT)) {
		drop(x->e, PBOX_DROP_ITER_LIMIT);
		send_error(x, w, t, EOVERFLOW);
		return;
	}
	if (!cs->initialized) {
		drop(x->e, PBOX_DROP_NOT_READY);
		send_error(x, w, t, EAGAIN);
		return;
	}
	if (t < cs->version) {
		if (x->job->sync->folds_late) {
			push_late(x, f);
			return;
		}
		/* Every member completed t: this is a retransmission. Retained or not, the
		 * answer (current model / ACK) does not depend on the old data. */
		want = want_of_push(x, t);
		if (x->mode->slot_results && (m->flags & PBOX_F_WANT_REPLY) &&
		    want != PBOX_PULL_NONE && !slot_holds(slot_of(x, want), want)) {
			PBOX_STAT_ADD(x->e->stats, dups, 1);
			drop(x->e, PBOX_DROP_STALE_ITER);
			if ((m->flags & PBOX_F_RETRANSMIT) && ends_round(x, f)) {
				send_error(x, w, t, ESTALE);
			}
			return;
		}
		push_duplicate(x, f, true, x->job->nlive, NULL);
		return;
	}
	if (t - cs->version >= x->job->window) {
		/* Too far ahead: the worker resends when told the window moved. */
		drop(x->e, PBOX_DROP_FUTURE_ITER);
		pbox_bit_set(cs->blocked, w);
		return;
	}
	sl = slot_of(x, t);
	fresh = !slot_holds(sl, t);
	if ((fresh || sl->wcnt[w] == 0) && outstanding(x, w) >= x->job->credits) {
		/* NOTIFY-ACK: an unacknowledged contribution is still incomplete; a second
		 * one must not start before the first is consumed. */
		drop(x->e, PBOX_DROP_CREDIT);
		return;
	}
	if (fresh) {
		slot_open(x, sl, t);
	}
	row = sl->bits + (size_t)w * fwords;
	if (pbox_bit_test(row, f)) {
		push_duplicate(x, f, sl->wcnt[w] == x->cd->nfrags, sl->ndone, row);
		return;
	}
	if (x->fused && !push_data(x, sl, f)) {
		return; /* refused: nothing of the slot changed (see push_data) */
	}
	pbox_bit_set(row, f);
	sl->wcnt[w]++;
	aggregate(x, sl, f);
	if (sl->wcnt[w] != x->cd->nfrags) {
		if (m->flags & PBOX_F_LAST) {
			send_nack(x, w, t, row, sl->ndone, 0);
		}
		return;
	}
	pbox_bit_set(sl->done, w);
	sl->ndone++;
	advance(x);
	contribution_done(x, w, t, sl->ndone);
}

static void on_pull(struct ctx *x)
{
	const struct pbox_msg *m = x->m;
	struct pbox_chunk_state *cs = x->cs;
	uint32_t want = m->iter, w = m->sender;
	bool probe = (m->flags & PBOX_F_RETRANSMIT) != 0;

	if (pbox_unlikely(want > PBOX_ITER_LIMIT)) {
		drop(x->e, PBOX_DROP_ITER_LIMIT);
		send_error(x, w, want, EOVERFLOW);
		return;
	}
	if (want_ready(x, w, want)) {
		if (tree_on(x) && tree_sent(x, want)) {
			/* A result sent down the tree is asked for: a loss, or a stalled relay. */
			pbox_tsb_note_repair(x->job->tsb, x->e->core, x->job->live, w, want,
					     (m->flags & PBOX_F_SACK) && m->arg0 == want);
		}
		answer(x, w, want, probe);
		return;
	}
	if (x->mode->slot_results && want >= cs->version + x->job->window) {
		drop(x->e, PBOX_DROP_FUTURE_ITER);
		return;
	}
	if (probe) {
		/* A worker's probe while it waits: tell it how far the iteration got. */
		uint32_t it = want - x->mode->want_step;
		const struct pbox_slot *sl = slot_of(x, it);

		send_ack(x, w, it, slot_holds(sl, it) ? sl->ndone : 0, PBOX_F_STATUS);
	}
	hold(x, w, want);
}

static void on_init(struct ctx *x)
{
	const struct pbox_msg *m = x->m;
	struct pbox_chunk_state *cs = x->cs;
	uint32_t f = m->frag_off / x->d->frag_bytes;

	if (cs->initialized || pbox_bit_test(cs->init_bits, f)) {
		PBOX_STAT_ADD(x->e->stats, dups, 1);
		if (cs->initialized && ends_round(x, f)) {
			send_ack(x, 0, 0, 1, PBOX_F_OF_INIT);
		} else if (!cs->initialized && (m->flags & PBOX_F_LAST)) {
			send_nack(x, 0, 0, cs->init_bits, 0, PBOX_F_OF_INIT);
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
		if (m->flags & PBOX_F_LAST) {
			send_nack(x, 0, 0, cs->init_bits, 0, PBOX_F_OF_INIT);
		}
		return;
	}
	cs->initialized = true;
	send_ack(x, 0, 0, 1, PBOX_F_OF_INIT);
	release_held(x);
}

/* ---- modes ------------------------------------------------------------------------------ */

static const struct pbox_mode_ops mode_aggregate = {
	.name = "aggregate",
	.push_wants = push_wants_same,
	.want_step = 0,
	.slot_results = true,
	.eager_release = false,
	.ready = ready_result,
	.complete = complete_result,
	.answer = answer_result,
	.finalize = finalize_reduce,
};

static const struct pbox_mode_ops mode_server_opt = {
	.name = "server-optimizer",
	.push_wants = push_wants_next,
	.want_step = 1,
	.slot_results = false,
	.eager_release = true,
	.ready = ready_model,
	.complete = complete_model,
	.answer = answer_model,
	.finalize = finalize_opt,
};

/* Aggregates kept per iteration as for aggregate jobs; only what a push-pull asks for
 * differs (the lag of SSP, engine.h). */
static const struct pbox_mode_ops mode_broadcast = {
	.name = "broadcast",
	.push_wants = push_wants_lagged,
	.want_step = 0,
	.slot_results = true,
	.eager_release = false,
	.ready = ready_result,
	.complete = complete_result,
	.answer = answer_result,
	.finalize = finalize_reduce,
};

static const struct pbox_mode_ops *const mode_ops[] = {
	[PBOX_MODE_AGGREGATE] = &mode_aggregate,
	[PBOX_MODE_SERVER_OPT] = &mode_server_opt,
	[PBOX_MODE_BROADCAST] = &mode_broadcast,
};

static const struct pbox_mode_ops *mode_of(const struct pbox_job *job)
{
	return mode_ops[job->mode];
}

/* ---- membership ------------------------------------------------------------------------ */

/*
 * Ranks left the job: iterations in flight stop waiting for them. Without folding, a
 * fragment then needs every remaining live rank that has not sent it; with folding
 * (drop-stragglers), the quorum shrinks to the live count and what the departed ranks sent
 * in time still counts. Held pulls of departed ranks are forgotten.
 */
static void reconcile_chunk(struct ctx *x, const uint64_t *gone)
{
	struct pbox_chunk_state *cs = x->cs;
	size_t fwords = pbox_bitmap_words(x->cd->nfrags);
	uint32_t nw = x->d->nworkers, w, q;

	PBOX_BIT_FOREACH(w, gone, nw)
	{
		if (cs->pull_want[w] != PBOX_PULL_NONE) {
			cs->pull_want[w] = PBOX_PULL_NONE;
			cs->nheld--;
		}
		pbox_bit_clear(cs->blocked, w);
	}
	q = x->job->sync->quorum(&x->job->sync_cfg, x->job->nlive);
	for (uint32_t s = 0; s < x->job->window; s++) {
		struct pbox_slot *sl = &cs->slot[s];

		if (!sl->open || sl->iter < cs->version) {
			continue;
		}
		for (uint32_t f = 0; f < x->cd->nfrags; f++) {
			uint32_t need = sl->need[f];

			if (need == PBOX_FRAG_FINAL) {
				continue;
			}
			if (x->job->sync->folds_late) {
				/* What the departed sent in time still counts. */
				uint32_t counted = sl->quorum - need;

				need = q > counted ? q - counted : 0;
			} else {
				/* Every live rank completes the fragment: recount (a rare event;
				 * exact whatever the slot saw before the change). */
				need = 0;
				for (uint32_t r = 0; r < nw; r++) {
					need += pbox_bit_test(x->job->live, r) &&
						!pbox_bit_test(sl->bits + (size_t)r * fwords, f);
				}
			}
			sl->need[f] = (uint16_t)need;
		}
		sl->quorum = q;
	}
	advance(x);
}

/* Membership changed since this core last looked: reconcile every owned chunk. */
static void reconcile(struct pbox_engine *e, const struct pbox_job *job, struct pbox_core_job *cj)
{
	uint64_t gone[PBOX_MAX_WORKERS / 64];
	uint32_t nw = job->wire.desc->nworkers;
	size_t wwords = pbox_bitmap_words(nw);
	struct ctx x = { .e = e, .job = job, .mode = mode_of(job), .d = job->wire.desc, .cj = cj };

	for (size_t i = 0; i < wwords; i++) {
		gone[i] = cj->seen_live[i] & ~job->live[i];
	}
	memcpy(cj->seen_live, job->live, wwords * 8);
	cj->seen_generation = job->generation;
	PBOX_STAT_ADD(e->stats, membership_changes, 1);
	for (uint32_t i = 0; i < cj->nchunks; i++) {
		x.cs = &cj->chunks[i];
		x.cd = &x.d->chunks[x.cs->id];
		reconcile_chunk(&x, gone);
	}
}

void pbox_engine_job_changed(struct pbox_engine *e, const struct pbox_jobtab *tab)
{
	for (uint32_t j = 0; tab != NULL && j < tab->njobs; j++) {
		const struct pbox_job *job = tab->jobs[j];
		struct pbox_core_job *cj = &job->state->core[e->core];

		if (cj->seen_generation != job->generation && job->live != NULL) {
			reconcile(e, job, cj);
		}
	}
}

void pbox_engine_observe_table(struct pbox_engine *e, const struct pbox_jobtab *tab)
{
	uint64_t gen = tab != NULL ? tab->generation : 0;

	if (pbox_likely(tab == e->seen_tab && gen == e->seen_tab_generation)) {
		return;
	}
	e->seen_tab = tab;
	e->seen_tab_generation = gen;
	/* Membership may have changed: chunks waiting for departed ranks may now complete. */
	pbox_engine_job_changed(e, tab);
	pbox_engine_flush(e);
}

/* ---- entry points -------------------------------------------------------------------- */

/*
 * Whether a datagram that carries rank's valid cookie comes from the rank's address. The
 * first one under a cookie, on any core, pins the address for every core of the job
 * (struct pbox_rank_pin); later ones must come from exactly there (IP and port; for L2
 * transports also the MAC and port this core learned with its first matching datagram).
 * Anything else, a spoofed source that would turn a small PULL into a chunk-sized reply
 * at a victim, a sender that learned the cookie and tries a core the rank has not used
 * yet, or a worker that moved, is refused: moving takes a new registration, which draws a
 * new cookie. Costs two loads of a read-mostly shared line and one compare per datagram.
 */
static bool source_pinned(struct pbox_rank_pin *pin, struct pbox_core_job *cj, uint32_t rank,
			  uint64_t cookie, const struct pbox_peer *from)
{
	uint64_t want =
		PBOX_PIN_SET | (cookie & 0x7fff) << 48 | (uint64_t)from->ip << 16 | from->port;
	uint64_t c = __atomic_load_n(&pin->cookie, __ATOMIC_ACQUIRE);
	struct pbox_peer *p = &cj->peers[rank];

	if (pbox_unlikely(c != cookie)) {
		/* First datagram under this cookie anywhere: the core whose swap wins pins. */
		if (__atomic_compare_exchange_n(&pin->cookie, &c, cookie, false, __ATOMIC_ACQ_REL,
						__ATOMIC_ACQUIRE)) {
			__atomic_store_n(&pin->addr, want, __ATOMIC_RELEASE);
			goto learn;
		}
		if (c != cookie) {
			return false; /* another cookie of the rank won meanwhile */
		}
	}
	/* Not equal also while the winning core has yet to store addr: refused, resent. */
	if (pbox_unlikely(__atomic_load_n(&pin->addr, __ATOMIC_ACQUIRE) != want)) {
		return false;
	}
	if (pbox_unlikely(cj->peer_cookie[rank] != cookie || p->ip != from->ip ||
			  p->port != from->port)) {
		goto learn;
	}
	return p->ifport == from->ifport && memcmp(p->mac, from->mac, sizeof(p->mac)) == 0;
learn:
	*p = *from;
	p->pad = 0;
	cj->peer_cookie[rank] = cookie;
	return true;
}

/*
 * Count the NaN / Inf values of a PUSH payload, or of an INIT one (rank 0's initial
 * model), in a pass of its own; a float split between two pieces is reassembled. Under
 * non_finite = "reject" a fragment with any is refused before it touches a sum or the
 * model (nonfinite_found). PUSHes that push_fusable() admits skip this pass: push_data
 * counts while it copies or adds. Returns whether to go on.
 */
static bool finite_ok(struct ctx *x)
{
	uint8_t carry[4];
	uint32_t ncarry = 0;
	size_t n = 0;

	if (x->enc != NULL) {
		n = x->enc->nonfinite(x->e->kern, &x->em);
		return n == 0 || nonfinite_found(x, n);
	}
	for (unsigned s = 0; s < x->npay; s++) {
		const uint8_t *p = x->pay[s].base;
		uint32_t len = x->pay[s].len;

		if (ncarry != 0) {
			uint32_t take = PBOX_MIN(4 - ncarry, len);

			memcpy(carry + ncarry, p, take);
			ncarry += take;
			p += take;
			len -= take;
			if (ncarry == 4) {
				n += x->e->kern->nonfinite((const float *)(const void *)carry, 1);
				ncarry = 0;
			}
		}
		n += x->e->kern->nonfinite((const float *)(const void *)p, len / 4);
		if (len % 4 != 0) {
			ncarry = len % 4;
			memcpy(carry, p + (len - ncarry), ncarry);
		}
	}
	if (pbox_likely(n == 0)) {
		return true;
	}
	return nonfinite_found(x, n);
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
	} else {
		m.payload = NULL; /* in pieces (x.pay); hdr may be a copy */
	}
	x.e = e;
	x.m = &m;
	x.pay = pay;
	x.npay = npay;
	x.fused = false;
	x.data_done = false;
	x.enc = NULL;
	x.job = pbox_container_of(wj, struct pbox_job, wire);
	x.mode = mode_of(x.job);
	x.d = wj->desc;
	x.cd = &x.d->chunks[m.chunk];
	if (pbox_unlikely(x.cd->core != e->core)) {
		drop(e, PBOX_DROP_MISDIRECTED);
		return;
	}
	x.cj = &x.job->state->core[e->core];
	x.cs = &x.cj->chunks[x.cd->local];
	if (pbox_unlikely(x.cj->seen_generation != x.job->generation) && x.job->live != NULL) {
		reconcile(e, x.job, x.cj);
	}
	if (pbox_unlikely(!source_pinned(&x.job->state->pins[m.sender], x.cj, m.sender, m.cookie,
					 from))) {
		drop(e, PBOX_DROP_BAD_SOURCE);
		return;
	}
	if (m.flags & PBOX_F_RETRANSMIT) {
		PBOX_STAT_ADD(e->stats, rx_retransmits, 1);
	}
	if (pbox_unlikely(x.job->run == PBOX_JOB_ABORTED)) {
		drop(e, PBOX_DROP_JOB_ABORTED);
		send_error(&x, m.sender, m.iter, x.job->abort_errno);
		return;
	}
	if ((m.flags & PBOX_F_CRC) && x.job->verify_crc &&
	    pbox_unlikely(pbox_crc32c_iov(x.pay, x.npay) != m.arg1)) {
		/* The version word does not match the payload: a torn or corrupted buffer.
		 * Never aggregated; the sender resends (or finds its buffer changed). */
		drop(e, PBOX_DROP_BAD_CHECKSUM);
		return;
	}
	x.enc = pbox_enc_ops_of(m.encoding);
	if (x.enc != NULL) {
		/* Decoded and validated in full before anything counts it. */
		r = x.enc->decode(e, x.pay, x.npay,
				  pbox_frag_len(x.d, x.cd->bytes, m.frag_off / x.d->frag_bytes) / 4,
				  &x.em);
		if (pbox_unlikely(r != PBOX_DROP_NONE)) {
			drop(e, r);
			return;
		}
	}
	if (x.job->dvf.enabled && m.type == PBOX_MSG_PUSH) {
		pbox_enc_count_push(e, &m, x.enc != NULL ? &x.em : NULL,
				    pbox_frag_len(x.d, x.cd->bytes, m.frag_off / x.d->frag_bytes) /
					    4);
	}
	switch (m.type) {
	case PBOX_MSG_PUSH:
		x.fused = x.enc == NULL && push_fusable(&x);
		if (x.fused || finite_ok(&x)) {
			on_push(&x);
		}
		break;
	case PBOX_MSG_PULL:
		on_pull(&x);
		break;
	case PBOX_MSG_INIT:
		if (finite_ok(&x)) {
			on_init(&x);
		}
		break;
	default:
		drop(e, PBOX_DROP_UNEXPECTED);
		break;
	}
}

void pbox_engine_rx(struct pbox_engine *e, const struct pbox_jobtab *tab, const void *pkt,
		    size_t len, const struct pbox_peer *from)
{
	struct pbox_iov pay = { NULL,
				len > PBOX_WIRE_HDR_LEN ? (uint32_t)(len - PBOX_WIRE_HDR_LEN) : 0 };

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
	/* A header-only datagram (or less) is validated as it is; with exactly one payload
	 * piece the fused fast path applies. */
	rx_one(e, tab, hdr, total, pay, need != 0 ? 0 : npay, from);
}
