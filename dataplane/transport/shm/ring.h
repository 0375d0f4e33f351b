/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Single-producer single-consumer byte rings in shared memory, carrying pbox datagrams
 * (the 64-byte wire header and its payload) between a worker process and pboxd on the
 * same host. The shared-memory transport (shm.h) puts one ring each way per
 * (worker connection, data-plane core) into a sealed memfd.
 *
 * Layout: a ring is a control block (struct pbox_shm_ring_ctl: the producer's index on
 * one cache line, the consumer's index and its "sleeping" flag on another) and a data
 * area of 2^k bytes (at least PBOX_SHM_RING_MIN). Indices are byte counts that only grow
 * (64 bits never wrap); the position of index i is i mod size. A datagram is a record: a
 * 64-byte record header (its length and kind) followed by the datagram, padded to a
 * multiple of 64 bytes, so the pbox header and the payload are cache-line aligned. A
 * record never wraps: when it does not fit before the end of the area, the producer
 * writes a WRAP record that covers the rest of the area and starts again at 0.
 *
 * Memory ordering (C11 atomics): the producer writes a record, then stores its tail with
 * release; the consumer loads the tail with acquire, reads the records, and stores its
 * head with release when it is done with them (records are read in place, zero copy,
 * until pbox_shm_cons_release()). The producer loads the head with acquire before reusing
 * room. Wake-ups: a consumer that is about to block sets its sleeping flag, issues a
 * full fence and looks at the tail once more (pbox_shm_cons_sleep_prepare); a producer
 * that published something issues a full fence and wakes the consumer (its eventfd) only
 * if the flag is set (pbox_shm_prod_need_wake). Neither misses the other (Dekker), and a
 * busy consumer never costs the producer a system call. The same the other way: a
 * producer holding data back for want of room sets prod_waiting and looks at the head
 * once more (pbox_shm_prod_wait_room); a consumer that released room wakes it only if
 * the flag is set (pbox_shm_cons_release_wake).
 *
 * Trust: the peer can write anything into the shared memory at any time. Each side keeps
 * its own index privately and only ever writes it to the shared block; the peer's index
 * and every record header are read exactly once into a local copy, then bounded: an
 * index that moved backwards or further than the ring size, a record header with an
 * unknown kind, a length beyond PBOX_SHM_MAX_DGRAM, or a record that crosses the end of
 * the area or the producer's index breaks the ring (enum pbox_shm_err, counted by the
 * caller; a broken ring returns nothing more). A record's bytes may still change while
 * the consumer reads them: the consumer must copy the 64-byte pbox header out before
 * validating it (pbox_shm_cons_pop does), and must treat the payload as bytes that may
 * change under it (pboxd adds them into the sender's own job only).
 *
 * Threading: one thread per side (struct pbox_shm_prod / struct pbox_shm_cons are the
 * private halves); the shared block is written by both as described.
 */
#ifndef PBOX_SHM_RING_H
#define PBOX_SHM_RING_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <pbox/wire.h>

#include "common/compiler.h"

/* Bytes of a record header; the pbox header follows at this offset. */
#define PBOX_SHM_REC_HDR 64u
/* Largest datagram a record carries: the pbox header and the largest payload. */
#define PBOX_SHM_MAX_DGRAM (PBOX_WIRE_HDR_LEN + PBOX_WIRE_MAX_PAYLOAD)
/* Largest record: its header and the largest datagram, padded (65536 bytes). */
#define PBOX_SHM_MAX_REC (PBOX_SHM_REC_HDR + PBOX_ALIGN_UP(PBOX_SHM_MAX_DGRAM, 64u))
/* Smallest ring: room for a largest record after a largest wrap. */
#define PBOX_SHM_RING_MIN (4u * PBOX_SHM_MAX_REC)
/* Largest ring. */
#define PBOX_SHM_RING_MAX (1u << 30)

/* Record kinds (the record header's second word). */
#define PBOX_SHM_REC_DGRAM 0x44475231u /* "1RGD": a datagram */
#define PBOX_SHM_REC_WRAP  0x50525731u /* "1WRP": skip to the start of the area */
/* "1CSD": a result datagram whose payload stays in the results' arena (shm.h): the pbox
 * header, then a struct pbox_shm_desc. Only pboxd writes them, only a consumer that
 * accepts them (pbox_shm_cons.accept_desc) reads them; any other breaks the ring. */
#define PBOX_SHM_REC_DESC 0x44534331u

/* "1FER": a worker's datagram whose payload stays in one of its registered regions
 * (shm.h, pbox_mem_alloc): the pbox header, then a struct pbox_shm_ref. Only a worker
 * writes them, only a consumer that accepts them (pbox_shm_cons.accept_ref: pboxd's
 * cores) reads them; any other breaks the ring. The reference itself is bounded by its
 * reader against the region it names (a bad one is dropped and counted, not a broken
 * ring: the ring's framing is intact). */
#define PBOX_SHM_REC_REF 0x52454631u

/* Where a worker's payload is: len bytes at off in its registered region `region` (the
 * id pboxd gave at registration). */
struct pbox_shm_ref {
	uint32_t region;
	uint32_t len; /* payload bytes: the header's frag_len */
	uint64_t off;
};
_Static_assert(sizeof(struct pbox_shm_ref) == 16, "16-byte reference");
/* A reference record's datagram length. */
#define PBOX_SHM_REF_DGRAM (PBOX_WIRE_HDR_LEN + (uint32_t)sizeof(struct pbox_shm_ref))

/* The payload *ref names in a region registered as (id, base, len): NULL unless
 * ref->region == id, 0 < ref->len <= PBOX_WIRE_MAX_PAYLOAD and [off, off + len) lies in
 * [0, len) (no overflow). ref must be a private copy (read once). */
const uint8_t *pbox_shm_ref_payload(const struct pbox_shm_ref *ref, uint32_t id,
				    const uint8_t *base, uint64_t len);

/* Where a descriptor's payload is: in the results' arena of the core whose ring carried
 * it. The payload is valid if the generation word still holds gen after it was read
 * (the engine bumps it before it rewrites the buffer: a seqlock read). */
struct pbox_shm_desc {
	uint64_t data_off; /* the payload's offset in the arena */
	uint64_t gen_off;  /* the buffer's generation word's offset (8-aligned) */
	uint64_t gen;      /* its value when the payload was complete */
	uint32_t len;      /* payload bytes: the header's frag_len */
	uint32_t pad;
};
/* A descriptor record's datagram length. */
#define PBOX_SHM_DESC_DGRAM (PBOX_WIRE_HDR_LEN + (uint32_t)sizeof(struct pbox_shm_desc))

/* The shared control block of one ring. */
struct pbox_shm_ring_ctl {
	alignas(PBOX_CACHE_LINE) _Atomic uint64_t tail; /* producer: bytes published */
	_Atomic uint32_t prod_waiting; /* producer: holds data back for want of room */
	alignas(PBOX_CACHE_LINE) _Atomic uint64_t head; /* consumer: bytes released */
	_Atomic uint32_t sleeping;                      /* consumer: may block on its eventfd */
};
_Static_assert(sizeof(struct pbox_shm_ring_ctl) == 2 * PBOX_CACHE_LINE, "two cache lines");

/* Why a ring broke. Keep PBOX_SHM_ERR_COUNT last. */
enum pbox_shm_err {
	PBOX_SHM_OK = 0,
	PBOX_SHM_ERR_TAIL,    /* consumer: the producer's index went back or past a full ring */
	PBOX_SHM_ERR_HEAD,    /* producer: the consumer's index went back or past the tail */
	PBOX_SHM_ERR_KIND,    /* consumer: a record header of no known kind */
	PBOX_SHM_ERR_LEN,     /* consumer: a record length of 0 or beyond PBOX_SHM_MAX_DGRAM */
	PBOX_SHM_ERR_OVERRUN, /* consumer: a record crossing the area's end or the tail */
	PBOX_SHM_ERR_COUNT,
};

/* Short stable name of a ring error ("bad_tail"); never NULL. */
const char *pbox_shm_err_name(enum pbox_shm_err e);

/* The producer's private half. */
struct pbox_shm_prod {
	struct pbox_shm_ring_ctl *ctl;
	uint8_t *data;
	uint64_t size;      /* power of two */
	uint64_t tail;      /* private: bytes written (published up to `published`) */
	uint64_t published; /* tail last stored to ctl->tail */
	uint64_t head;      /* the consumer's index as last read (validated) */
	uint64_t checked;   /* published as of the last pbox_shm_prod_need_wake */
	enum pbox_shm_err err;
	uint64_t full;   /* pushes refused: no room */
	uint64_t pushed; /* datagrams pushed */
};

/* The consumer's private half. */
struct pbox_shm_cons {
	struct pbox_shm_ring_ctl *ctl;
	const uint8_t *data;
	uint64_t size;
	uint64_t head;     /* private: bytes consumed (released up to `released`) */
	uint64_t released; /* head last stored to ctl->head */
	uint64_t tail;     /* the producer's index as last read (validated) */
	enum pbox_shm_err err;
	uint64_t popped;  /* datagrams handed out */
	bool accept_desc; /* descriptor records are valid here (set after init) */
	bool accept_ref;  /* reference records are valid here (set after init) */
};

/* One datagram handed out by pbox_shm_cons_pop: hdr is a private copy of its first 64
 * bytes (all of it if shorter); payload points into the ring (len - 64 bytes, NULL if
 * none) and stays valid until pbox_shm_cons_release. */
struct pbox_shm_dgram {
	alignas(8) uint8_t hdr[PBOX_WIRE_HDR_LEN];
	const uint8_t *payload;
	const uint8_t *data; /* the whole datagram in place (a trusting reader's view) */
	uint32_t len;        /* whole datagram */
	uint32_t kind;       /* PBOX_SHM_REC_DGRAM, or _DESC / _REF: payload is the descriptor
			      * or the reference (a volatile copy in the ring: copy it out) */
};

/* Whether size is a valid ring size. */
static inline bool pbox_shm_ring_size_ok(uint64_t size)
{
	return size >= PBOX_SHM_RING_MIN && size <= PBOX_SHM_RING_MAX && (size & (size - 1)) == 0;
}

/* Initialise a shared control block (before the peer can see it): indices 0, sleeping
 * set (a consumer that has not looked yet is woken by the first publish). */
void pbox_shm_ring_ctl_init(struct pbox_shm_ring_ctl *ctl);

/* Attach the private halves to a ring whose indices are both 0. size must satisfy
 * pbox_shm_ring_size_ok (the caller checked it). */
void pbox_shm_prod_init(struct pbox_shm_prod *p, struct pbox_shm_ring_ctl *ctl, uint8_t *data,
			uint64_t size);
void pbox_shm_cons_init(struct pbox_shm_cons *c, struct pbox_shm_ring_ctl *ctl, const uint8_t *data,
			uint64_t size);

/*
 * Write one datagram: the 64-byte header hdr (copied) and len payload bytes (len <=
 * PBOX_WIRE_MAX_PAYLOAD), and publish it. Returns 0; -ENOBUFS if the ring has no room
 * (counted in p->full; the datagram is dropped, as a full socket would); -EPIPE if the
 * ring is broken (p->err says why); -EMSGSIZE if len is too large.
 */
int pbox_shm_push(struct pbox_shm_prod *p, const struct pbox_wire_hdr *hdr, const void *payload,
		  uint32_t len);

/* Write one descriptor record: the header hdr and *d (see PBOX_SHM_REC_DESC). Returns
 * as pbox_shm_push. */
int pbox_shm_push_desc(struct pbox_shm_prod *p, const struct pbox_wire_hdr *hdr,
		       const struct pbox_shm_desc *d);

/* Write one reference record: the header hdr and *r (see PBOX_SHM_REC_REF). Returns as
 * pbox_shm_push. */
int pbox_shm_push_ref(struct pbox_shm_prod *p, const struct pbox_wire_hdr *hdr,
		      const struct pbox_shm_ref *r);

/* Write a record as popped from another ring (a backlog): its kind, header and payload. */
int pbox_shm_push_dgram(struct pbox_shm_prod *p, const struct pbox_shm_dgram *d);

/* The producer holds data back: set prod_waiting, fence, and look at the head again.
 * Returns true (flag cleared) if len payload bytes fit now. */
bool pbox_shm_prod_wait_room(struct pbox_shm_prod *p, uint32_t len);
/* Nothing is held back any more: clear prod_waiting. */
void pbox_shm_prod_room_ok(struct pbox_shm_prod *p);

/* Whether a datagram of len payload bytes would fit now (reads the consumer's index if
 * needed; false also when the ring is broken). */
bool pbox_shm_prod_fits(struct pbox_shm_prod *p, uint32_t len);

/* After publishing: whether the consumer announced it may be sleeping (then write its
 * eventfd). Issues the full fence the wake-up protocol needs; costs nothing else. Call
 * once per batch of pushes, not per push. Returns false when nothing was published since
 * the last call. */
bool pbox_shm_prod_need_wake(struct pbox_shm_prod *p);

/*
 * Hand out up to max datagrams published so far, in order, without copying their
 * payloads. Returns the count (0: none, or the ring is broken: c->err says why). The
 * payloads stay valid until pbox_shm_cons_release().
 */
unsigned pbox_shm_cons_pop(struct pbox_shm_cons *c, struct pbox_shm_dgram *out, unsigned max);

/* Give the room of every datagram handed out so far back to the producer. */
void pbox_shm_cons_release(struct pbox_shm_cons *c);
/* The same, then (full fence) whether the producer waits for room: write its eventfd. */
bool pbox_shm_cons_release_wake(struct pbox_shm_cons *c);

/* Whether the producer published something not yet handed out (one acquire load; does
 * not validate: pop does). */
bool pbox_shm_cons_ready(const struct pbox_shm_cons *c);

/* About to block: set the sleeping flag, fence, and look again. Returns false (flag
 * cleared again) if something is ready: do not block. */
bool pbox_shm_cons_sleep_prepare(struct pbox_shm_cons *c);

/* Woke up (or did not block after all): clear the sleeping flag. */
void pbox_shm_cons_sleep_end(struct pbox_shm_cons *c);

#endif /* PBOX_SHM_RING_H */
