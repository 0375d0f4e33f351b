/* SPDX-License-Identifier: BSD-3-Clause */
/* Payload encodings of the chunk engine and DVF-filtered results (see encoding.h). */
#include "encoding.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/compiler.h"
#include "common/log.h"
#include "engine.h"

_Static_assert(PBOX_WIRE_DVF_MIN_LEN == PBOX_DVF_HDR_LEN, "wire.h's DVF block header size");

/* Elements of the largest fragment a datagram can carry. */
#define FRAG_MAX_ELEMS (PBOX_WIRE_MAX_PAYLOAD / 4)

void pbox_enc_core_free(struct pbox_enc_core *ec)
{
	if (ec == NULL) {
		return;
	}
	pbox_dvf_scratch_free(ec->dvf);
	free(ec->gather);
	free(ec);
}

void pbox_engine_fini(struct pbox_engine *e)
{
	pbox_enc_core_free(e->enc);
	e->enc = NULL;
}

/* The engine's encoding state, made on first use (once per core: the codec contexts and
 * staging buffers of one fragment). NULL after logging if there is no memory. */
static struct pbox_enc_core *enc_core(struct pbox_engine *e)
{
	struct pbox_enc_core *ec;

	if (pbox_likely(e->enc != NULL)) {
		return e->enc;
	}
	ec = calloc(1, sizeof(*ec));
	if (ec == NULL || (ec->gather = malloc(PBOX_WIRE_MAX_PAYLOAD)) == NULL ||
	    (ec->dvf = pbox_dvf_scratch_new(FRAG_MAX_ELEMS)) == NULL) {
		PBOX_LOG_ERR(ENGINE, "core %u: no memory for the DVF scratch; DVF payloads dropped",
			     e->core);
		pbox_enc_core_free(ec);
		return NULL;
	}
	ec->k = pbox_dvf_kernels_get();
	e->enc = ec;
	return ec;
}

/* ---- PBOX_ENC_DVF ------------------------------------------------------------------ */

static enum pbox_drop_reason dvf_decode(struct pbox_engine *e, const struct pbox_iov *pay,
					unsigned npay, uint32_t n, struct pbox_enc_msg *msg)
{
	struct pbox_enc_core *ec = enc_core(e);
	enum pbox_dvf_reject why = PBOX_DVF_REJ_TRUNCATED;
	const void *buf;
	size_t len;

	if (pbox_unlikely(ec == NULL)) {
		return PBOX_DROP_BAD_BLOCK;
	}
	if (pbox_unlikely(npay == 0)) {
		goto reject;
	}
	buf = pay[0].base;
	len = pay[0].len;
	if (npay > 1) {
		/* A block in pieces (a segmented receive): make it contiguous. The wire check
		 * bounded it by the fragment's dense length. */
		len = 0;
		for (unsigned i = 0; i < npay; i++) {
			if (pbox_unlikely(len + pay[i].len > PBOX_WIRE_MAX_PAYLOAD)) {
				goto reject;
			}
			memcpy(ec->gather + len, pay[i].base, pay[i].len);
			len += pay[i].len;
		}
		buf = ec->gather;
	}
	if (pbox_dvf_decode(ec->dvf, buf, len, n, &msg->view, &why) != 0) {
		goto reject;
	}
	if (pbox_unlikely(msg->view.n != n)) {
		/* A block of another fragment's size: it cannot stand for this one. */
		why = PBOX_DVF_REJ_CAPACITY;
		goto reject;
	}
	PBOX_STAT_ADD(e->stats, dvf_blocks, 1);
	return PBOX_DROP_NONE;
reject:
	PBOX_STAT_ADD(e->stats, dvf_rejects[why], 1);
	return PBOX_DROP_BAD_BLOCK;
}

static size_t dvf_nonfinite(const struct pbox_kernels *k, const struct pbox_enc_msg *msg)
{
	return k->nonfinite(msg->view.vals, msg->view.count);
}

static void dvf_copy(struct pbox_engine *e, const struct pbox_enc_msg *msg, float *dst, uint32_t n)
{
	memset(dst, 0, (size_t)n * 4);
	pbox_dvf_view_add(e->enc->k, &msg->view, dst);
}

static void dvf_add(struct pbox_engine *e, const struct pbox_enc_msg *msg, float *acc)
{
	pbox_dvf_view_add(e->enc->k, &msg->view, acc);
}

static const struct pbox_enc_ops enc_dvf = {
	.name = "dvf",
	.decode = dvf_decode,
	.nonfinite = dvf_nonfinite,
	.copy = dvf_copy,
	.add = dvf_add,
};

static const struct pbox_enc_ops *const enc_ops[PBOX_ENC_MAX + 1] = {
	[PBOX_ENC_DVF] = &enc_dvf,
};

const struct pbox_enc_ops *pbox_enc_ops_of(uint8_t encoding)
{
	return encoding <= PBOX_ENC_MAX ? enc_ops[encoding] : NULL;
}

void pbox_enc_count_push(struct pbox_engine *e, const struct pbox_msg *m,
			 const struct pbox_enc_msg *em, uint32_t n)
{
	PBOX_STAT_ADD(e->stats, dvf_in_bytes, m->frag_len);
	PBOX_STAT_ADD(e->stats, dvf_in_dense, (uint64_t)n * 4);
	PBOX_STAT_ADD(e->stats, dvf_in_vals, em != NULL ? em->view.count : n);
}

/* ---- filtered results ---------------------------------------------------------------- */

bool pbox_enc_job_filters_results(const struct pbox_job *job)
{
	/* Aggregate and broadcast-update results are sums of updates; a server-optimizer
	 * result is the model itself, which is not filtered. */
	return job->dvf.enabled && job->mode != PBOX_MODE_SERVER_OPT;
}

enum pbox_dvf_link pbox_enc_result_link(const struct pbox_job *job)
{
	return job->dvf.link;
}

void pbox_enc_result_final(struct pbox_engine *e, const struct pbox_job *job,
			   struct pbox_chunk_state *cs, struct pbox_slot *sl, uint32_t f,
			   uint32_t off, uint32_t n)
{
	struct pbox_enc_core *ec = enc_core(e);
	float thr = pbox_dvf_threshold(&job->dvf.params, pbox_enc_result_link(job), sl->iter);
	const float *res = (const float *)(const void *)((const uint8_t *)sl->acc + off);
	float *resid = (float *)(void *)((uint8_t *)cs->resid + off);
	struct pbox_dvf_enc_info info;
	bool dense;
	int len;

	len = ec != NULL ? pbox_dvf_encode_frag(ec->dvf, &job->dvf.enc, ec->k, resid, res, n, thr,
						sl->enc + off, &dense, &info)
			 : -ENOMEM;
	if (pbox_unlikely(len < 0)) {
		/* No scratch (logged), or settings the admission should have refused: send
		 * the result with its residual added, unfiltered, and start the residual over,
		 * so nothing is lost. */
		float *out = (float *)(void *)(sl->enc + off);

		memcpy(out, res, (size_t)n * 4);
		pbox_kernels_get()->add(out, resid, n);
		memset(resid, 0, (size_t)n * 4);
		len = (int)(n * 4);
		info.sent = n;
	}
	sl->enc_len[f] = (uint16_t)len;
	PBOX_STAT_ADD(e->stats, dvf_out_frags, 1);
	PBOX_STAT_ADD(e->stats, dvf_out_bytes, sl->enc_len[f]);
	PBOX_STAT_ADD(e->stats, dvf_out_dense, (uint64_t)n * 4);
	PBOX_STAT_ADD(e->stats, dvf_out_vals, info.sent);
}

const void *pbox_enc_result_frag(const struct pbox_job *job, const struct pbox_slot *sl, uint32_t f,
				 uint32_t off, uint32_t *len, uint8_t *encoding)
{
	if (!pbox_enc_job_filters_results(job)) {
		return (const uint8_t *)sl->acc + off;
	}
	*encoding = sl->enc_len[f] < *len ? PBOX_ENC_DVF : PBOX_ENC_F32;
	*len = sl->enc_len[f];
	return sl->enc + off;
}
