/* SPDX-License-Identifier: BSD-3-Clause */
/* Header encode / decode and the header-level half of validation (see pbox/wire.h). */
#include <pbox/wire.h>

#include <endian.h>
#include <string.h>

#include "compiler.h"

static const char *const g_drop_names[PBOX_DROP_COUNT] = {
	[PBOX_DROP_NONE] = "none",
	[PBOX_DROP_TRUNCATED] = "truncated",
	[PBOX_DROP_BAD_MAGIC] = "bad_magic",
	[PBOX_DROP_BAD_VERSION] = "bad_version",
	[PBOX_DROP_BAD_TYPE] = "bad_type",
	[PBOX_DROP_BAD_HDR_LEN] = "bad_hdr_len",
	[PBOX_DROP_BAD_LENGTH] = "bad_length",
	[PBOX_DROP_BAD_FLAGS] = "bad_flags",
	[PBOX_DROP_BAD_RESERVED] = "bad_reserved",
	[PBOX_DROP_BAD_ENCODING] = "bad_encoding",
	[PBOX_DROP_BAD_FRAGMENT] = "bad_fragment",
	[PBOX_DROP_UNKNOWN_JOB] = "unknown_job",
	[PBOX_DROP_BAD_SENDER] = "bad_sender",
	[PBOX_DROP_BAD_COOKIE] = "bad_cookie",
	[PBOX_DROP_BAD_CHUNK] = "bad_chunk",
	[PBOX_DROP_BAD_ALIGNMENT] = "bad_alignment",
	[PBOX_DROP_MISDIRECTED] = "misdirected",
	[PBOX_DROP_NOT_ALLOWED] = "not_allowed",
	[PBOX_DROP_FUTURE_ITER] = "future_iter",
	[PBOX_DROP_STALE_ITER] = "stale_iter",
	[PBOX_DROP_NOT_READY] = "not_ready",
	[PBOX_DROP_JOB_ABORTED] = "job_aborted",
	[PBOX_DROP_CREDIT] = "credit_exceeded",
	[PBOX_DROP_BAD_CHECKSUM] = "bad_checksum",
	[PBOX_DROP_UNEXPECTED] = "unexpected",
	[PBOX_DROP_BAD_SOURCE] = "bad_source",
	[PBOX_DROP_NON_FINITE] = "non_finite",
	[PBOX_DROP_ITER_LIMIT] = "iter_limit",
	[PBOX_DROP_BAD_BLOCK] = "bad_block",
};

const char *pbox_drop_reason_name(enum pbox_drop_reason r)
{
	if ((unsigned)r >= PBOX_DROP_COUNT || g_drop_names[r] == NULL) {
		return "invalid";
	}
	return g_drop_names[r];
}

/* Per message type: flags allowed, whether a payload must be present, and whether it may
 * be a DVF block. */
static const struct {
	uint16_t flags;
	uint8_t payload;
	uint8_t dvf;
} g_type_rules[PBOX_MSG_TYPE_MAX + 1] = {
	[PBOX_MSG_PUSH] = { PBOX_F_WANT_REPLY | PBOX_F_RETRANSMIT | PBOX_F_CRC | PBOX_F_LAST, 1,
			    1 },
	[PBOX_MSG_PULL] = { PBOX_F_RETRANSMIT | PBOX_F_SACK, 0, 0 },
	[PBOX_MSG_INIT] = { PBOX_F_RETRANSMIT | PBOX_F_CRC | PBOX_F_LAST, 1, 0 },
	[PBOX_MSG_DATA] = { PBOX_F_RETRANSMIT, 1, 1 },
	[PBOX_MSG_ACK] = { PBOX_F_RETRY | PBOX_F_OF_INIT | PBOX_F_STATUS | PBOX_F_SACK, 0, 0 },
	[PBOX_MSG_ERROR] = { 0, 0, 0 },
};

enum pbox_drop_reason pbox_wire_decode(const void *buf, size_t len, struct pbox_msg *m)
{
	struct pbox_wire_hdr h;

	if (pbox_unlikely(len < PBOX_WIRE_HDR_LEN)) {
		return PBOX_DROP_TRUNCATED;
	}
	/* Copy: the datagram may sit at any alignment in the receive buffer. */
	memcpy(&h, buf, sizeof(h));
	if (pbox_unlikely(be32toh(h.magic) != PBOX_WIRE_MAGIC)) {
		return PBOX_DROP_BAD_MAGIC;
	}
	if (pbox_unlikely(h.version != PBOX_WIRE_VERSION)) {
		return PBOX_DROP_BAD_VERSION;
	}
	if (pbox_unlikely(h.type == 0 || h.type > PBOX_MSG_TYPE_MAX)) {
		return PBOX_DROP_BAD_TYPE;
	}
	if (pbox_unlikely(h.hdr_len != PBOX_WIRE_HDR_LEN)) {
		return PBOX_DROP_BAD_HDR_LEN;
	}
	m->type = h.type;
	m->flags = be16toh(h.flags);
	if (pbox_unlikely(h.sack != 0 && !(m->flags & PBOX_F_SACK))) {
		return PBOX_DROP_BAD_RESERVED;
	}
	m->encoding = h.encoding;
	m->frag_len = be16toh(h.frag_len);
	m->frag_off = be32toh(h.frag_off);
	m->chunk_len = be32toh(h.chunk_len);
	if (pbox_unlikely(m->frag_len != len - PBOX_WIRE_HDR_LEN)) {
		return PBOX_DROP_BAD_LENGTH;
	}
	if (pbox_unlikely(m->flags & ~g_type_rules[h.type].flags)) {
		return PBOX_DROP_BAD_FLAGS;
	}
	if (g_type_rules[h.type].payload) {
		if (m->encoding == PBOX_ENC_DVF && g_type_rules[h.type].dvf) {
			/* A block: any length from its header up; the fragment it stands for
			 * is checked against the job (pbox_wire_check). */
			if (pbox_unlikely(m->frag_len < PBOX_WIRE_DVF_MIN_LEN ||
					  m->frag_off % 4 != 0)) {
				return PBOX_DROP_BAD_FRAGMENT;
			}
		} else if (pbox_unlikely(m->encoding != PBOX_ENC_F32)) {
			return PBOX_DROP_BAD_ENCODING;
		} else if (pbox_unlikely(m->frag_len == 0 || m->frag_len % 4 != 0)) {
			return PBOX_DROP_BAD_FRAGMENT;
		}
		if (pbox_unlikely(m->chunk_len == 0 || m->frag_off > m->chunk_len ||
				  m->frag_len > m->chunk_len - m->frag_off)) {
			return PBOX_DROP_BAD_FRAGMENT;
		}
		m->payload = (const uint8_t *)buf + PBOX_WIRE_HDR_LEN;
	} else {
		if (pbox_unlikely(m->encoding != PBOX_ENC_NONE)) {
			return PBOX_DROP_BAD_ENCODING;
		}
		if (pbox_unlikely(m->frag_len != 0 ||
				  (m->flags & PBOX_F_SACK ? m->frag_off >= m->chunk_len
							  : m->frag_off != 0))) {
			return PBOX_DROP_BAD_FRAGMENT;
		}
		m->payload = NULL;
	}
	m->job = be32toh(h.job);
	m->sender = be32toh(h.sender);
	m->cookie = be64toh(h.cookie);
	m->chunk = be32toh(h.chunk);
	m->iter = be32toh(h.iter);
	m->seq = be32toh(h.seq);
	m->arg0 = be32toh(h.arg0);
	m->arg1 = be32toh(h.arg1);
	m->sack = be64toh(h.sack);
	return PBOX_DROP_NONE;
}

void pbox_wire_encode(const struct pbox_msg *m, struct pbox_wire_hdr *h)
{
	h->magic = htobe32(PBOX_WIRE_MAGIC);
	h->version = PBOX_WIRE_VERSION;
	h->type = m->type;
	h->flags = htobe16(m->flags);
	h->job = htobe32(m->job);
	h->sender = htobe32(m->sender);
	h->cookie = htobe64(m->cookie);
	h->chunk = htobe32(m->chunk);
	h->iter = htobe32(m->iter);
	h->frag_off = htobe32(m->frag_off);
	h->frag_len = htobe16((uint16_t)m->frag_len);
	h->encoding = m->encoding;
	h->hdr_len = PBOX_WIRE_HDR_LEN;
	h->chunk_len = htobe32(m->chunk_len);
	h->seq = htobe32(m->seq);
	h->arg0 = htobe32(m->arg0);
	h->arg1 = htobe32(m->arg1);
	h->sack = m->flags & PBOX_F_SACK ? htobe64(m->sack) : 0;
}
