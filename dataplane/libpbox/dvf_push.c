/* SPDX-License-Identifier: BSD-3-Clause */
/* The worker's DVF push filter and result decoder (see dvf_push.h). */
#include "dvf_push.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <pbox/wire.h>

#include "common/log.h"

struct pbox_dvf_push {
	const struct pbox_jobdesc *d;
	uint32_t nlanes;
	struct pbox_dvf_job cfg;
	const struct pbox_dvf_kernels *k;
	struct pbox_dvf_scratch *s;
	float *resid;      /* the model's elements, chunks in id order */
	uint64_t *off;     /* per chunk: its first byte in resid and in each lane's copy */
	uint8_t *enc;      /* nlanes copies of the model's bytes, encoded per fragment */
	uint16_t *len;     /* per (chunk, lane, fragment): bytes of the encoded fragment */
	uint64_t *len_off; /* per chunk: its first entry in len (lane-major inside) */
	uint64_t total;    /* model bytes */
	uint32_t plan;     /* enum pbox_dvf_plan (atomic: set by the client's threads) */
	struct pbox_dvf_push_stats st;
};

struct pbox_dvf_push *pbox_dvf_push_create(const struct pbox_jobdesc *d, uint32_t nlanes,
					   const struct pbox_dvf_job *cfg)
{
	struct pbox_dvf_push *p = calloc(1, sizeof(*p));
	uint64_t nlen = 0, bytes = 0;

	if (p == NULL) {
		goto oom;
	}
	p->d = d;
	p->nlanes = nlanes;
	p->cfg = *cfg;
	p->k = pbox_dvf_kernels_get();
	p->off = calloc(d->nchunks + 1u, sizeof(*p->off));
	p->len_off = calloc(d->nchunks + 1u, sizeof(*p->len_off));
	if (p->off == NULL || p->len_off == NULL) {
		goto oom;
	}
	for (uint32_t c = 0; c < d->nchunks; c++) {
		p->off[c] = bytes;
		p->len_off[c] = nlen;
		bytes += d->chunks[c].bytes;
		nlen += (uint64_t)d->chunks[c].nfrags * nlanes;
	}
	p->total = bytes;
	p->resid = calloc(bytes / 4 + 1, sizeof(float));
	p->enc = malloc(bytes * nlanes + 1);
	p->len = calloc(nlen + 1, sizeof(*p->len));
	p->s = pbox_dvf_scratch_new(d->frag_bytes / 4);
	if (p->resid == NULL || p->enc == NULL || p->len == NULL || p->s == NULL) {
		goto oom;
	}
	return p;
oom:
	PBOX_LOG_ERR(CLIENT,
		     "out of memory for the DVF push filter (residual and %u encoded "
		     "copies of the model)",
		     nlanes);
	pbox_dvf_push_destroy(p);
	return NULL;
}

void pbox_dvf_push_destroy(struct pbox_dvf_push *p)
{
	if (p == NULL) {
		return;
	}
	pbox_dvf_scratch_free(p->s);
	free(p->resid);
	free(p->off);
	free(p->enc);
	free(p->len);
	free(p->len_off);
	free(p);
}

enum pbox_dvf_link pbox_dvf_push_link(const struct pbox_dvf_push *p)
{
	switch (__atomic_load_n(&p->plan, __ATOMIC_RELAXED)) {
	case PBOX_DVF_PLAN_LOW:
		return PBOX_DVF_LINK_SUFFICIENT;
	case PBOX_DVF_PLAN_UP:
		return PBOX_DVF_LINK_INSUFFICIENT;
	default:
		return p->cfg.link;
	}
}

void pbox_dvf_push_set_plan(struct pbox_dvf_push *p, enum pbox_dvf_plan plan)
{
	__atomic_store_n(&p->plan, (uint32_t)plan, __ATOMIC_RELAXED);
}

float pbox_dvf_push_threshold(const struct pbox_dvf_push *p, uint32_t t)
{
	return pbox_dvf_threshold(&p->cfg.params, pbox_dvf_push_link(p), t);
}

static uint8_t *lane_enc(const struct pbox_dvf_push *p, uint32_t c, uint32_t lane)
{
	return p->enc + p->total * lane + p->off[c];
}

static uint16_t *lane_len(const struct pbox_dvf_push *p, uint32_t c, uint32_t lane)
{
	return p->len + p->len_off[c] + (uint64_t)lane * p->d->chunks[c].nfrags;
}

int pbox_dvf_push_encode(struct pbox_dvf_push *p, uint32_t c, uint32_t lane, const float *src,
			 uint32_t t)
{
	const struct pbox_chunk_desc *cd;
	float thr = pbox_dvf_push_threshold(p, t);
	uint8_t *out;
	uint16_t *len;

	if (c >= p->d->nchunks || lane >= p->nlanes) {
		return -EINVAL;
	}
	cd = &p->d->chunks[c];
	out = lane_enc(p, c, lane);
	len = lane_len(p, c, lane);
	for (uint32_t f = 0; f < cd->nfrags; f++) {
		uint32_t off = f * p->d->frag_bytes, n = pbox_frag_len(p->d, cd->bytes, f) / 4;
		float *r = p->resid + (p->off[c] + off) / 4;
		struct pbox_dvf_enc_info info;
		bool dense;
		int l = pbox_dvf_encode_frag(
			p->s, &p->cfg.enc, p->k, r,
			(const float *)(const void *)((const uint8_t *)src + off), n, thr,
			out + off, &dense, &info);

		if (l < 0) {
			/* Settings were checked when the job was admitted: cannot happen. Send
			 * the gradient plus residual dense rather than lose anything. */
			memcpy(out + off, (const uint8_t *)src + off, (size_t)n * 4);
			p->k->add((float *)(void *)(out + off), r, n);
			memset(r, 0, (size_t)n * 4);
			l = (int)(n * 4);
			info.sent = n;
			dense = true;
		}
		len[f] = (uint16_t)l;
		p->st.frags++;
		p->st.blocks += !dense;
		p->st.elems += n;
		p->st.sent += info.sent;
		p->st.wire_bytes += (uint64_t)l;
		p->st.dense_bytes += (uint64_t)n * 4;
	}
	return 0;
}

const void *pbox_dvf_push_frag(const struct pbox_dvf_push *p, uint32_t c, uint32_t lane, uint32_t f,
			       uint32_t *len, uint8_t *encoding)
{
	uint32_t dense = pbox_frag_len(p->d, p->d->chunks[c].bytes, f);

	*len = lane_len(p, c, lane)[f];
	*encoding = *len < dense ? PBOX_ENC_DVF : PBOX_ENC_F32;
	return lane_enc(p, c, lane) + (size_t)f * p->d->frag_bytes;
}

int pbox_dvf_push_decode(struct pbox_dvf_push *p, const void *buf, uint32_t len, uint32_t n,
			 struct pbox_dvf_view *v, enum pbox_dvf_reject *why)
{
	if (pbox_dvf_decode(p->s, buf, len, n, v, why) != 0 ||
	    (v->n != n && (*why = PBOX_DVF_REJ_CAPACITY, true))) {
		p->st.rejects[*why]++;
		return -EBADMSG;
	}
	p->st.results++;
	return 0;
}

void pbox_dvf_push_expand(const struct pbox_dvf_push *p, const struct pbox_dvf_view *v, float *dst)
{
	memset(dst, 0, (size_t)v->n * 4);
	pbox_dvf_view_add(p->k, v, dst);
}

const float *pbox_dvf_push_resid(const struct pbox_dvf_push *p, uint32_t c)
{
	return p->resid + p->off[c] / 4;
}

const struct pbox_dvf_push_stats *pbox_dvf_push_stats(const struct pbox_dvf_push *p)
{
	return &p->st;
}
