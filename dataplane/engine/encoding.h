/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Payload encodings of the chunk engine (LAYOUT.md seam 3, its second half): what the
 * engine does with a fragment's payload is chosen once per datagram from its wire
 * encoding (pbox/wire.h) through struct pbox_enc_ops, and the results of a job with DVF
 * are filtered and encoded here, so the engine's handlers do not branch on encodings.
 *
 * PBOX_ENC_F32 is the engine's native form: contiguous dense floats are added in place by
 * its fused paths (engine.c), so pbox_enc_ops_of() returns NULL for it. PBOX_ENC_DVF (a
 * DVF block, dataplane/dvf/dvf.h) is decoded and validated in full before the engine
 * counts anything (a rejected block is dropped as PBOX_DROP_BAD_BLOCK and its reason
 * counted in pbox_core_stats.dvf_rejects), and then added without being densified:
 * scatter-add of its values at its indexes (sparse), the bitmap add (values + presence
 * bitmap), or the add kernel (dense block), all vectorised by the DVF kernels.
 *
 * Aggregation rules for blocks (engine.h's rules otherwise unchanged):
 *  - first data of a fragment (and, in deterministic mode, a rank's stage): the
 *    accumulator's fragment is zeroed and the block added into it (0 + v == v exactly,
 *    and a sent value is never 0);
 *  - later data: added into the accumulator at the block's elements only;
 *  - deterministic mode sums per rank in rank order: each rank's stage holds its
 *    contribution as the dense vector it stands for (unsent elements +0) and the reduce
 *    kernel sums the stages in rank order, as for dense pushes. So a sparse contribution
 *    and the same contribution sent dense (the filtered values, PBOX_ENC_F32) give
 *    bit-identical results, whatever the arrival order.
 *
 * Results (jobs whose results are filtered: aggregate and broadcast-update modes with
 * DVF; PF filters its broadcasts): when a fragment of
 * an iteration is final (its sum or mean in the slot's accumulator), it is filtered once
 * with the chunk's appliance residual at the threshold of that iteration and encoded
 * into the slot's result buffer; every answer to every worker, first or resent, sends
 * those same bytes (identical to every worker; the residual is never applied twice).
 *
 * Threading: struct pbox_enc_core belongs to one engine (one data-plane core); the
 * residuals and result buffers are per chunk, written only by the owning core.
 */
#ifndef PBOX_ENCODING_H
#define PBOX_ENCODING_H

#include <stdbool.h>
#include <stdint.h>

#include <pbox/wire.h>

#include "common/xport.h"
#include "dvf/dvf.h"

struct pbox_engine;
struct pbox_job;
struct pbox_chunk_state;
struct pbox_slot;
struct pbox_kernels;

/* A payload decoded by its encoding's ops, valid while one datagram is handled. */
struct pbox_enc_msg {
	struct pbox_dvf_view view;
};

struct pbox_enc_ops {
	const char *name;
	/* Validate and decode the payload pay[0..npay) of a fragment of n elements: 0 with
	 * *msg, or the drop reason (the cause counted in the engine's stats). */
	enum pbox_drop_reason (*decode)(struct pbox_engine *e, const struct pbox_iov *pay,
					unsigned npay, uint32_t n, struct pbox_enc_msg *msg);
	/* NaN / Inf values the payload carries. */
	size_t (*nonfinite)(const struct pbox_kernels *k, const struct pbox_enc_msg *msg);
	/* dst[0..n) = the fragment the payload stands for (first data of a fragment). */
	void (*copy)(struct pbox_engine *e, const struct pbox_enc_msg *msg, float *dst, uint32_t n);
	/* acc[0..n) += the payload, touching only the elements it carries. */
	void (*add)(struct pbox_engine *e, const struct pbox_enc_msg *msg, float *acc);
};

/* The ops of a wire encoding with a payload: NULL for PBOX_ENC_F32 (the engine's native
 * path) and for encodings without ops (pbox_wire_decode refuses those). */
const struct pbox_enc_ops *pbox_enc_ops_of(uint8_t encoding);

/* Count a PUSH payload of n elements of a job with DVF (em: its decoded block, NULL for
 * a dense fragment) in the engine's dvf_in_* counters. */
void pbox_enc_count_push(struct pbox_engine *e, const struct pbox_msg *m,
			 const struct pbox_enc_msg *em, uint32_t n);

/* Per-engine state of the encodings: created on first use, freed by pbox_engine_fini. */
struct pbox_enc_core {
	struct pbox_dvf_scratch *dvf;
	const struct pbox_dvf_kernels *k;
	uint8_t *gather; /* a block received in pieces, made contiguous */
};

void pbox_enc_core_free(struct pbox_enc_core *ec);

/* Whether the job's results are filtered and sent as DVF blocks (aggregate and
 * broadcast-update modes with a dvf group). */
bool pbox_enc_job_filters_results(const struct pbox_job *job);

/*
 * The link state the appliance filters results with: job->dvf.link, which pboxd sets
 * from the control plane's plan when it has one (broadcast select: delta_up when some
 * link of the job is insufficient) and from the job's `link` otherwise, republishing the
 * table when a new plan arrives.
 */
enum pbox_dvf_link pbox_enc_result_link(const struct pbox_job *job);

/*
 * Fragment f (n elements at byte offset off of the chunk) of slot sl is final in
 * sl->acc: filter it with cs->resid at the threshold of iteration sl->iter and encode it
 * into sl->enc (sl->enc_len[f] its length: < 4 n for a block, 4 n for the filtered
 * dense values). Owning core, once per fragment and iteration.
 */
void pbox_enc_result_final(struct pbox_engine *e, const struct pbox_job *job,
			   struct pbox_chunk_state *cs, struct pbox_slot *sl, uint32_t f,
			   uint32_t off, uint32_t n);

/* The bytes to send for fragment f (byte offset off, dense length len) of the result held
 * by slot sl: *len and *encoding updated when the job's results are filtered, else
 * sl->acc's bytes as they are. */
const void *pbox_enc_result_frag(const struct pbox_job *job, const struct pbox_slot *sl, uint32_t f,
				 uint32_t off, uint32_t *len, uint8_t *encoding);

#endif /* PBOX_ENCODING_H */
