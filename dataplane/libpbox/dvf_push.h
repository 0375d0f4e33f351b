/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The worker's side of DVF (Parameter Flow's value-bounded filter, dataplane/dvf/dvf.h):
 * the push filter with the worker's residual, the encoded fragments a push sends (and
 * resends), and the decoder of the appliance's filtered results.
 *
 * Per chunk of a push of iteration t, once, when the chunk starts sending: for every
 * fragment, U = R + g (R: this worker's residual of those elements); |U_i| <= delta_t stays
 * in R (boundary inclusive), the rest goes, as a DVF block or, when no block would be
 * smaller, as the filtered dense values; delta_t = delta_sel / sqrt(t + 1), delta_sel =
 * delta_low or delta_up by pbox_dvf_push_link(). The encoded bytes are kept with the
 * (chunk, lane) until the next push of that lane starts: every retransmission sends the
 * same bytes, and the residual is applied exactly once per push, whatever the loss. So
 * ||R||_inf <= delta_t after every filter, and R + everything sent == everything pushed.
 *
 * Memory: the residual (one float per model element) and, per lane, one encoded copy of
 * the model; allocated at creation. Threading: used by the node's thread only.
 */
#ifndef PBOX_DVF_PUSH_H
#define PBOX_DVF_PUSH_H

#include <stdbool.h>
#include <stdint.h>

#include "common/jobdesc.h"
#include "dvf/dvf.h"

struct pbox_dvf_push;

/* What the filter did (cumulative). */
struct pbox_dvf_push_stats {
	uint64_t frags;       /* fragments filtered */
	uint64_t blocks;      /* of them sent as DVF blocks (the rest dense) */
	uint64_t elems;       /* elements filtered */
	uint64_t sent;        /* of them sent (the rest kept in the residual) */
	uint64_t wire_bytes;  /* bytes of the fragments as encoded */
	uint64_t dense_bytes; /* bytes they stand for, dense */
	uint64_t results;     /* result fragments received as DVF blocks */
	uint64_t rejects[PBOX_DVF_REJ_COUNT_REASONS]; /* result blocks refused, by reason */
};

/* For a job of geometry d (kept, must outlive it) with nlanes lanes per key, and the
 * job's settings cfg (copied; enabled). NULL after logging why (no memory). */
struct pbox_dvf_push *pbox_dvf_push_create(const struct pbox_jobdesc *d, uint32_t nlanes,
					   const struct pbox_dvf_job *cfg);
void pbox_dvf_push_destroy(struct pbox_dvf_push *p);

/*
 * The link state pushes are filtered for: the switch between delta_low and delta_up. The
 * control plane's plan for this rank decides once one arrived (pbox_dvf_push_set_plan:
 * its push_up); until then the job's configured `link`. The numerators stay the job's:
 * the plan's are in pbox-ctrld's units, not necessarily the job's values'.
 */
enum pbox_dvf_link pbox_dvf_push_link(const struct pbox_dvf_push *p);

/* What the plan says of this rank's push links (libpbox's client, on a plan change):
 * PBOX_DVF_PLAN_NONE (no plan: the job's link), _LOW (sufficient or not measured),
 * _UP (insufficient). Any thread (an atomic store read by the next filter). */
enum pbox_dvf_plan {
	PBOX_DVF_PLAN_NONE = 0,
	PBOX_DVF_PLAN_LOW,
	PBOX_DVF_PLAN_UP,
};
void pbox_dvf_push_set_plan(struct pbox_dvf_push *p, enum pbox_dvf_plan plan);

/* The threshold of a push of iteration t: pbox_dvf_threshold(params, link, t). */
float pbox_dvf_push_threshold(const struct pbox_dvf_push *p, uint32_t t);

/*
 * Filter and encode chunk c's contribution src[0..chunk elements) of iteration t for lane
 * `lane`, replacing what that (chunk, lane) held. Applies the residual once. Returns 0,
 * or -EINVAL (bad chunk or lane).
 */
int pbox_dvf_push_encode(struct pbox_dvf_push *p, uint32_t c, uint32_t lane, const float *src,
			 uint32_t t);

/* Fragment f of the last encode of (c, lane): its bytes, *len and *encoding
 * (PBOX_ENC_DVF or PBOX_ENC_F32). */
const void *pbox_dvf_push_frag(const struct pbox_dvf_push *p, uint32_t c, uint32_t lane, uint32_t f,
			       uint32_t *len, uint8_t *encoding);

/*
 * Validate and decode a result block buf[0..len) for a fragment of n elements. 0 with *v
 * (valid until the next decode), or -EBADMSG with the reason counted in the stats and
 * returned in *why.
 */
int pbox_dvf_push_decode(struct pbox_dvf_push *p, const void *buf, uint32_t len, uint32_t n,
			 struct pbox_dvf_view *v, enum pbox_dvf_reject *why);

/* dst[0..v->n) = the fragment v stands for (unsent elements 0). */
void pbox_dvf_push_expand(const struct pbox_dvf_push *p, const struct pbox_dvf_view *v, float *dst);

/* The residual of chunk c (its elements), for tests and diagnostics. */
const float *pbox_dvf_push_resid(const struct pbox_dvf_push *p, uint32_t c);

const struct pbox_dvf_push_stats *pbox_dvf_push_stats(const struct pbox_dvf_push *p);

#endif /* PBOX_DVF_PUSH_H */
