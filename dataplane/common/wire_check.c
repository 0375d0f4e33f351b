/* SPDX-License-Identifier: BSD-3-Clause */
/* Job-level validation of decoded pbox messages (see wire_check.h). */
#include "wire_check.h"

#include "bitmap.h"
#include "compiler.h"

enum pbox_drop_reason pbox_wire_check(const struct pbox_msg *m, const struct pbox_wire_job *job,
				      enum pbox_role role)
{
	const struct pbox_jobdesc *d = job->desc;
	const struct pbox_chunk_desc *c;
	uint64_t want_cookie;

	if (role == PBOX_ROLE_APPLIANCE) {
		if (pbox_unlikely(m->type != PBOX_MSG_PUSH && m->type != PBOX_MSG_PULL &&
				  m->type != PBOX_MSG_INIT)) {
			return PBOX_DROP_BAD_SENDER;
		}
		if (pbox_unlikely(m->sender >= d->nworkers)) {
			return PBOX_DROP_BAD_SENDER;
		}
		want_cookie = job->cookies[m->sender];
	} else {
		if (pbox_unlikely(m->type != PBOX_MSG_DATA && m->type != PBOX_MSG_ACK &&
				  m->type != PBOX_MSG_ERROR)) {
			return PBOX_DROP_BAD_SENDER;
		}
		if (pbox_unlikely(m->sender != PBOX_SENDER_APPLIANCE)) {
			return PBOX_DROP_BAD_SENDER;
		}
		want_cookie = job->cookies[0];
	}
	/* Cookie 0 marks a rank without a session: nothing can match it. */
	if (pbox_unlikely(want_cookie == 0 || m->cookie != want_cookie)) {
		return PBOX_DROP_BAD_COOKIE;
	}
	if (pbox_unlikely(m->chunk >= d->nchunks)) {
		return PBOX_DROP_BAD_CHUNK;
	}
	c = &d->chunks[m->chunk];
	if (pbox_unlikely(m->chunk_len != c->bytes)) {
		return PBOX_DROP_BAD_CHUNK;
	}
	if (m->payload != NULL) {
		uint32_t f = m->frag_off / d->frag_bytes;

		if (m->encoding == PBOX_ENC_DVF) {
			if (pbox_unlikely(!job->accepts_dvf)) {
				return PBOX_DROP_BAD_ENCODING;
			}
			if (pbox_unlikely(m->frag_off % d->frag_bytes != 0 ||
					  m->frag_len > pbox_frag_len(d, c->bytes, f))) {
				return PBOX_DROP_BAD_ALIGNMENT;
			}
		} else if (pbox_unlikely(m->frag_off % d->frag_bytes != 0 ||
					 m->frag_len != pbox_frag_len(d, c->bytes, f))) {
			return PBOX_DROP_BAD_ALIGNMENT;
		}
	}
	if (m->flags & PBOX_F_SACK) {
		/* decode checked frag_off < chunk_len, so base < nfrags */
		uint32_t left = c->nfrags - m->frag_off / d->frag_bytes;

		if (pbox_unlikely(m->frag_off % d->frag_bytes != 0 ||
				  (left < PBOX_SACK_BITS && (m->sack >> left) != 0))) {
			return PBOX_DROP_BAD_ALIGNMENT;
		}
	}
	if (m->type == PBOX_MSG_INIT &&
	    pbox_unlikely(!job->accepts_init || m->sender != 0 || m->iter != 0)) {
		return PBOX_DROP_NOT_ALLOWED;
	}
	return PBOX_DROP_NONE;
}

enum pbox_drop_reason pbox_wire_validate(const void *buf, size_t len, enum pbox_role role,
					 pbox_wire_lookup_fn lookup, void *lookup_arg,
					 struct pbox_msg *m, const struct pbox_wire_job **jobp)
{
	enum pbox_drop_reason r = pbox_wire_decode(buf, len, m);
	const struct pbox_wire_job *job;

	if (pbox_unlikely(r != PBOX_DROP_NONE)) {
		return r;
	}
	job = lookup(lookup_arg, m->job);
	if (pbox_unlikely(job == NULL)) {
		return PBOX_DROP_UNKNOWN_JOB;
	}
	*jobp = job;
	return pbox_wire_check(m, job, role);
}

void pbox_sack_build(const uint64_t *bits, uint32_t nfrags, uint32_t *base, uint64_t *map)
{
	uint32_t b = 0;

	while (b < nfrags && pbox_bit_test(bits, b)) {
		b++;
	}
	*base = b;
	*map = 0;
	for (uint32_t i = 0; i < PBOX_SACK_BITS && b + i < nfrags; i++) {
		if (pbox_bit_test(bits, b + i)) {
			*map |= 1ull << i;
		}
	}
}
