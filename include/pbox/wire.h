/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox wire format: the header every pbox data-plane datagram starts with.
 *
 * One format serves the kernel-UDP, DPDK and AF_XDP transports: Ethernet / IPv4 / UDP, then
 * this fixed 64-byte header (one cache line), then the payload: a fragment of one chunk.
 *
 * Byte order: every multi-byte header field is big-endian (network order). The payload of
 * PBOX_ENC_F32 is IEEE-754 binary32 in little-endian order (the order of every host pbox
 * runs on; pbox refuses to build for a big-endian host). The payload of PBOX_ENC_DVF is
 * one DVF block (dataplane/dvf/dvf.h, little-endian) holding the elements of the same
 * fragment of the grid a dense payload would cover.
 *
 *   off  size  field       meaning
 *     0     4  magic       PBOX_WIRE_MAGIC ("PBOX")
 *     4     1  version     PBOX_WIRE_VERSION; anything else is dropped
 *     5     1  type        enum pbox_msg_type
 *     6     2  flags       PBOX_F_* (only the flags allowed for the type)
 *     8     4  job         job namespace id
 *    12     4  sender      worker rank, or PBOX_SENDER_APPLIANCE
 *    16     8  cookie      session cookie of the worker the datagram concerns
 *    24     4  chunk       chunk id within the job
 *    28     4  iter        iteration (PUSH, DATA of aggregate jobs) or model version
 *    32     4  frag_off    byte offset of the payload within the chunk
 *    36     2  frag_len    payload bytes in this datagram
 *    38     1  encoding    enum pbox_encoding
 *    39     1  hdr_len     PBOX_WIRE_HDR_LEN
 *    40     4  chunk_len   total bytes of the chunk (cross-checked against the job)
 *    44     4  seq         sender's sequence number (echoed in ACK/DATA as arg0 of PUSH)
 *    48     4  arg0        type specific, see enum pbox_msg_type
 *    52     4  arg1        type specific
 *    56     8  sack        with PBOX_F_SACK: a fragment bitmap (below); else zero
 *
 * Selective acknowledgement (PBOX_F_SACK, on ACK and PULL): the sender holds every fragment
 * before frag_off (a fragment boundary; the message has no payload) and, for bit i of
 * sack (bit 0 = least significant), fragment frag_off / frag_bytes + i. Fragments past
 * the 64 the map covers are not described (taken as missing). An ACK with PBOX_F_SACK is
 * a NACK: the contribution (chunk, iter) is incomplete, these fragments are held; it
 * answers a fragment flagged PBOX_F_LAST (the last datagram of a worker's send round).
 * A PULL with PBOX_F_SACK tells which fragments of the result labelled arg0 the worker
 * already holds, so that only the others are sent again.
 *
 * Validation: pbox_wire_decode() checks everything the header can say about itself; a
 * receiver then checks the message against the admitted job with pbox_wire_check() (see
 * dataplane/common/wire_check.h). A datagram failing either is dropped and counted under
 * one enum pbox_drop_reason, never trusted, and never answered unless its cookie proved it
 * came from an admitted worker.
 */
#ifndef PBOX_WIRE_H
#define PBOX_WIRE_H

/* Also included by nicfw/'s BPF programs (built -ffreestanding, no vmlinux.h): only the
 * compiler's own freestanding headers here, no libc header. */
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "pbox payloads are little-endian float32; big-endian hosts are not supported"
#endif

#define PBOX_WIRE_MAGIC   0x50424f58u /* "PBOX" */
#define PBOX_WIRE_VERSION 1
#define PBOX_WIRE_HDR_LEN 64

/* Sender value of datagrams that come from the appliance. */
#define PBOX_SENDER_APPLIANCE 0xffffffffu

/* Largest payload a datagram may carry (bounded by frag_len's 16 bits and by UDP). */
#define PBOX_WIRE_MAX_PAYLOAD 65408u
/* Bytes of Ethernet + IPv4 + UDP in front of the pbox header. */
#define PBOX_WIRE_L2L4_LEN 42u

/* Iterations in flight per chunk at most (a job's window), and unacknowledged
 * contributions a worker may have per chunk at most (its NOTIFY-ACK credits): limits both
 * ends check, pboxd on its configuration, libpbox on pboxd's register answer. */
#define PBOX_MAX_WINDOW  64u
#define PBOX_MAX_CREDITS PBOX_MAX_WINDOW

enum pbox_msg_type {
	/* worker -> appliance: a gradient fragment for (chunk, iter). arg0: 0; arg1: the
	 * fragment's CRC32C version word if PBOX_F_CRC. PBOX_F_WANT_REPLY asks for the
	 * result (fused push-pull) when the job's synchronisation model allows;
	 * PBOX_F_RETRANSMIT marks a resend. */
	PBOX_MSG_PUSH = 1,
	/* worker -> appliance: send me the result. No payload. iter: the model version
	 * wanted (server-optimizer jobs) or the iteration whose aggregate is wanted
	 * (aggregate jobs). A pull that cannot be answered yet is held. PBOX_F_SACK: arg0 is
	 * the label of a result partly received, sack / frag_off say which fragments. */
	PBOX_MSG_PULL = 2,
	/* rank 0 -> appliance: initial model values for a server-optimizer job. iter: 0. */
	PBOX_MSG_INIT = 3,
	/* appliance -> worker: a fragment of the result. iter: the model version (server-
	 * optimizer) or the iteration (aggregate). arg0: seq of the request answered. */
	PBOX_MSG_DATA = 4,
	/* appliance -> worker: your contribution (PUSH or INIT) for (chunk, iter) has been
	 * received in full and consumed (NOTIFY-ACK), or, answering a probe, the status of
	 * iteration iter (PBOX_F_STATUS). arg0: seq echoed; arg1: contributions received so
	 * far for that iteration. PBOX_F_OF_INIT: the INIT of (chunk) is complete.
	 * PBOX_F_RETRY: a refused push may be sent again now. PBOX_F_SACK: a NACK, the
	 * contribution is incomplete and sack / frag_off say which fragments are held.
	 * No payload. */
	PBOX_MSG_ACK = 5,
	/* appliance -> worker: the request for (chunk, iter) was refused. arg0: a positive
	 * errno (e.g. ECONNABORTED: the job was aborted; ESTALE: that result is no longer
	 * kept; EAGAIN: the model has not been initialised). No payload. */
	PBOX_MSG_ERROR = 6,
	PBOX_MSG_TYPE_MAX = PBOX_MSG_ERROR,
};

enum pbox_msg_flags {
	PBOX_F_WANT_REPLY = 1u << 0, /* PUSH: answer with the result (fused push-pull) */
	PBOX_F_RETRANSMIT = 1u << 1, /* PUSH, PULL, INIT, DATA: sent again after a timeout */
	PBOX_F_CRC = 1u << 2,        /* PUSH, INIT: arg1 is the CRC32C of the payload */
	PBOX_F_RETRY = 1u << 3,      /* ACK: a push was refused (window full); resend now */
	PBOX_F_OF_INIT = 1u << 4,    /* ACK: acknowledges an INIT, not a PUSH */
	PBOX_F_STATUS = 1u << 5,     /* ACK: answers a probe; acknowledges nothing */
	PBOX_F_SACK = 1u << 6,       /* ACK (a NACK), PULL: sack and frag_off hold a bitmap */
	PBOX_F_LAST = 1u << 7,       /* PUSH, INIT: last datagram of a send round */
	/* DATA: a broadcast fragment travelling down the job's TSB tree (relays forward it
	 * unchanged): cookie is the session's broadcast cookie, sack holds the fragment's
	 * 64-bit MAC (dataplane/common/tsb.h). */
	PBOX_F_TREE = 1u << 8,
};
#define PBOX_F_ALL                                                                            \
	(PBOX_F_WANT_REPLY | PBOX_F_RETRANSMIT | PBOX_F_CRC | PBOX_F_RETRY | PBOX_F_OF_INIT | \
	 PBOX_F_STATUS | PBOX_F_SACK | PBOX_F_LAST | PBOX_F_TREE)

/* Fragments one PBOX_F_SACK bitmap describes past its base. */
#define PBOX_SACK_BITS 64u

enum pbox_encoding {
	PBOX_ENC_NONE = 0, /* no payload (PULL, ACK, ERROR) */
	PBOX_ENC_F32 = 1,  /* dense float32, little-endian */
	/* PUSH and DATA of jobs with DVF: one DVF block (PBOX_DVF_HDR_LEN header + compressed
	 * payload, dataplane/dvf/dvf.h) of the n = dense length / 4 elements of the grid
	 * fragment at frag_off; frag_len is the block's length, at least the block header
	 * and at most the dense fragment's length (a block that would not be smaller goes
	 * as PBOX_ENC_F32). Independently decodable: a block never needs another datagram. */
	PBOX_ENC_DVF = 2,
	PBOX_ENC_MAX = PBOX_ENC_DVF,
};

/* Bytes of a DVF block header (dataplane/dvf/dvf.h PBOX_DVF_HDR_LEN): the least payload
 * of a PBOX_ENC_DVF fragment. */
#define PBOX_WIRE_DVF_MIN_LEN 24u

/* The header exactly as it is on the wire. Fields are big-endian: use the accessors. */
struct pbox_wire_hdr {
	uint32_t magic;
	uint8_t version;
	uint8_t type;
	uint16_t flags;
	uint32_t job;
	uint32_t sender;
	uint64_t cookie;
	uint32_t chunk;
	uint32_t iter;
	uint32_t frag_off;
	uint16_t frag_len;
	uint8_t encoding;
	uint8_t hdr_len;
	uint32_t chunk_len;
	uint32_t seq;
	uint32_t arg0;
	uint32_t arg1;
	uint64_t sack; /* was "reserved": zero unless PBOX_F_SACK */
} __attribute__((packed, aligned(8)));

_Static_assert(sizeof(struct pbox_wire_hdr) == PBOX_WIRE_HDR_LEN, "pbox header is one cache line");
_Static_assert(offsetof(struct pbox_wire_hdr, cookie) == 16, "cookie offset");
_Static_assert(offsetof(struct pbox_wire_hdr, frag_len) == 36, "frag_len offset");
_Static_assert(offsetof(struct pbox_wire_hdr, chunk_len) == 40, "chunk_len offset");
_Static_assert(offsetof(struct pbox_wire_hdr, sack) == 56, "sack offset");

/* A decoded header in host byte order. */
struct pbox_msg {
	uint8_t type;
	uint8_t encoding;
	uint16_t flags;
	uint32_t job;
	uint32_t sender;
	uint64_t cookie;
	uint32_t chunk;
	uint32_t iter;
	uint32_t frag_off;
	uint32_t frag_len;
	uint32_t chunk_len;
	uint32_t seq;
	uint32_t arg0;
	uint32_t arg1;
	uint64_t sack;       /* PBOX_F_SACK: bitmap from fragment frag_off / frag_bytes;
				PBOX_F_TREE: the MAC */
	const void *payload; /* frag_len bytes following the header, NULL if none */
};

/*
 * Why a datagram was dropped. Every receiver counts drops per reason (pboxd prints the
 * names from pbox_drop_reason_name()). Keep PBOX_DROP_COUNT last.
 */
enum pbox_drop_reason {
	PBOX_DROP_NONE = 0,
	/* header-level (pbox_wire_decode) */
	PBOX_DROP_TRUNCATED,    /* shorter than the header */
	PBOX_DROP_BAD_MAGIC,    /* not a pbox datagram */
	PBOX_DROP_BAD_VERSION,  /* pbox, but a version this build does not speak */
	PBOX_DROP_BAD_TYPE,     /* unknown message type */
	PBOX_DROP_BAD_HDR_LEN,  /* hdr_len != 64 */
	PBOX_DROP_BAD_LENGTH,   /* frag_len disagrees with the datagram length */
	PBOX_DROP_BAD_FLAGS,    /* a flag not defined for this type */
	PBOX_DROP_BAD_RESERVED, /* sack bytes not zero without PBOX_F_SACK */
	PBOX_DROP_BAD_ENCODING, /* encoding unknown or wrong for the type */
	PBOX_DROP_BAD_FRAGMENT, /* fragment outside the chunk */
	/* job-level (pbox_wire_check) */
	PBOX_DROP_UNKNOWN_JOB,   /* no admitted job with this namespace id */
	PBOX_DROP_BAD_SENDER,    /* sender rank out of range, or wrong direction */
	PBOX_DROP_BAD_COOKIE,    /* cookie does not match the sender's session */
	PBOX_DROP_BAD_CHUNK,     /* chunk id out of range or chunk_len differs */
	PBOX_DROP_BAD_ALIGNMENT, /* fragment not on the job's fragment grid */
	PBOX_DROP_MISDIRECTED,   /* chunk owned by another core */
	PBOX_DROP_NOT_ALLOWED,   /* message not allowed for this job or rank (e.g. INIT
				    from rank 1, INIT to an aggregate job) */
	/* engine-level */
	PBOX_DROP_FUTURE_ITER,  /* iteration beyond the in-flight window */
	PBOX_DROP_STALE_ITER,   /* iteration long complete and no longer answerable */
	PBOX_DROP_NOT_READY,    /* job has no model yet (push before initialisation) */
	PBOX_DROP_JOB_ABORTED,  /* job aborted; answered with PBOX_MSG_ERROR */
	PBOX_DROP_CREDIT,       /* a contribution beyond the rank's NOTIFY-ACK credits */
	PBOX_DROP_BAD_CHECKSUM, /* payload does not match its CRC32C version word */
	PBOX_DROP_UNEXPECTED,   /* well-formed but not expected now (e.g. stray reply) */
	PBOX_DROP_BAD_SOURCE,   /* valid cookie, but not from the rank's pinned address */
	PBOX_DROP_NON_FINITE,   /* gradient with NaN/Inf refused (non_finite = "reject") */
	PBOX_DROP_ITER_LIMIT,   /* iteration past the last one a chunk can run (~2^32) */
	PBOX_DROP_BAD_BLOCK,    /* a PBOX_ENC_DVF payload its decoder rejects (the block's
				   reason is counted too: pbox_dvf_reject) */
	PBOX_DROP_COUNT,
};

/* Short stable name of a drop reason for counters ("bad_cookie"); never NULL. */
const char *pbox_drop_reason_name(enum pbox_drop_reason r);

/*
 * Decode and validate the header of a datagram of len bytes.
 *
 * Checks magic, version, type, hdr_len, flags allowed for the type, sack zero unless
 * PBOX_F_SACK, encoding allowed for the type, frag_len == len - 64, frag_off + frag_len
 * <= chunk_len, and frag_off 0 for a message without payload unless PBOX_F_SACK (then
 * frag_off < chunk_len). PBOX_ENC_F32 payloads are whole floats; PBOX_ENC_DVF (PUSH and
 * DATA only) at least PBOX_WIRE_DVF_MIN_LEN bytes at a float-aligned frag_off (its
 * fragment's length and contents are checked by pbox_wire_check and the block decoder). On success
 * fills *msg (payload points into buf) and returns PBOX_DROP_NONE; otherwise returns the reason and
 * *msg is undefined. Never reads beyond buf + len.
 */
enum pbox_drop_reason pbox_wire_decode(const void *buf, size_t len, struct pbox_msg *msg);

/* Encode msg (host order) into the 64-byte header at hdr; the payload is not touched. */
void pbox_wire_encode(const struct pbox_msg *msg, struct pbox_wire_hdr *hdr);

#ifdef __cplusplus
}
#endif

#endif /* PBOX_WIRE_H */
