/* SPDX-License-Identifier: BSD-3-Clause */
/* Shared-memory SPSC datagram rings (see ring.h). */
#include "ring.h"

#include <errno.h>
#include <string.h>

const char *pbox_shm_err_name(enum pbox_shm_err e)
{
	static const char *const names[PBOX_SHM_ERR_COUNT] = {
		[PBOX_SHM_OK] = "ok",
		[PBOX_SHM_ERR_TAIL] = "bad_tail",
		[PBOX_SHM_ERR_HEAD] = "bad_head",
		[PBOX_SHM_ERR_KIND] = "bad_kind",
		[PBOX_SHM_ERR_LEN] = "bad_len",
		[PBOX_SHM_ERR_OVERRUN] = "overrun",
	};

	return (unsigned)e < PBOX_SHM_ERR_COUNT ? names[e] : "unknown";
}

const uint8_t *pbox_shm_ref_payload(const struct pbox_shm_ref *ref, uint32_t id,
				    const uint8_t *base, uint64_t len)
{
	if (ref->region != id || ref->len == 0 || ref->len > PBOX_WIRE_MAX_PAYLOAD ||
	    ref->off > len || ref->len > len - ref->off) {
		return NULL;
	}
	return base + ref->off;
}

void pbox_shm_ring_ctl_init(struct pbox_shm_ring_ctl *ctl)
{
	atomic_init(&ctl->tail, 0);
	atomic_init(&ctl->prod_waiting, 0);
	atomic_init(&ctl->head, 0);
	atomic_init(&ctl->sleeping, 1);
}

void pbox_shm_prod_init(struct pbox_shm_prod *p, struct pbox_shm_ring_ctl *ctl, uint8_t *data,
			uint64_t size)
{
	memset(p, 0, sizeof(*p));
	p->ctl = ctl;
	p->data = data;
	p->size = size;
}

void pbox_shm_cons_init(struct pbox_shm_cons *c, struct pbox_shm_ring_ctl *ctl, const uint8_t *data,
			uint64_t size)
{
	memset(c, 0, sizeof(*c));
	c->ctl = ctl;
	c->data = data;
	c->size = size;
}

/* A record header: length and kind in one 64-bit word, so it is written and read in one
 * access (the reader never sees half of an update, and reads it exactly once). */
static inline uint64_t rec_word(uint32_t len, uint32_t kind)
{
	return (uint64_t)kind << 32 | len;
}

static inline void rec_store(uint8_t *at, uint32_t len, uint32_t kind)
{
	atomic_store_explicit((_Atomic uint64_t *)(void *)at, rec_word(len, kind),
			      memory_order_relaxed);
}

static inline uint64_t rec_load(const uint8_t *at)
{
	return atomic_load_explicit((_Atomic uint64_t *)(void *)at, memory_order_relaxed);
}

static inline uint64_t rec_bytes(uint32_t len)
{
	return PBOX_SHM_REC_HDR + PBOX_ALIGN_UP((uint64_t)len, 64u);
}

/* Room the producer may use, after reading the consumer's index once more if needed.
 * Returns false if the ring is broken. */
static bool refresh_head(struct pbox_shm_prod *p)
{
	uint64_t h = atomic_load_explicit(&p->ctl->head, memory_order_acquire);

	/* The consumer may only move forward, and never past what was published. */
	if (pbox_unlikely(h - p->head > p->published - p->head)) {
		p->err = PBOX_SHM_ERR_HEAD;
		return false;
	}
	p->head = h;
	return true;
}

/* Room for a record of len payload bytes (and the wrap before it): 0, -ENOBUFS or -EPIPE. */
static int room(struct pbox_shm_prod *p, uint32_t len)
{
	uint64_t need = rec_bytes(PBOX_WIRE_HDR_LEN + len), pos = p->tail & (p->size - 1);
	uint64_t skip = pos + need > p->size ? p->size - pos : 0;

	if (p->size - (p->tail - p->head) >= skip + need) {
		return 0;
	}
	if (!refresh_head(p)) {
		return -EPIPE;
	}
	return p->size - (p->tail - p->head) >= skip + need ? 0 : -ENOBUFS;
}

bool pbox_shm_prod_fits(struct pbox_shm_prod *p, uint32_t len)
{
	return p->err == PBOX_SHM_OK && len <= PBOX_WIRE_MAX_PAYLOAD && room(p, len) == 0;
}

bool pbox_shm_prod_wait_room(struct pbox_shm_prod *p, uint32_t len)
{
	atomic_store_explicit(&p->ctl->prod_waiting, 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_seq_cst);
	if (pbox_shm_prod_fits(p, len)) {
		pbox_shm_prod_room_ok(p);
		return true;
	}
	return false;
}

void pbox_shm_prod_room_ok(struct pbox_shm_prod *p)
{
	atomic_store_explicit(&p->ctl->prod_waiting, 0, memory_order_relaxed);
}

static int push_rec(struct pbox_shm_prod *p, const struct pbox_wire_hdr *hdr, const void *payload,
		    uint32_t len, uint32_t kind)
{
	uint64_t need, pos, skip;
	int rc;

	if (pbox_unlikely(p->err != PBOX_SHM_OK)) {
		return -EPIPE;
	}
	if (pbox_unlikely(len > PBOX_WIRE_MAX_PAYLOAD)) {
		return -EMSGSIZE;
	}
	rc = room(p, len);
	if (pbox_unlikely(rc != 0)) {
		p->full += rc == -ENOBUFS;
		return rc;
	}
	need = rec_bytes(PBOX_WIRE_HDR_LEN + len);
	pos = p->tail & (p->size - 1);
	skip = pos + need > p->size ? p->size - pos : 0;
	if (skip != 0) {
		rec_store(p->data + pos, 0, PBOX_SHM_REC_WRAP);
		p->tail += skip;
		pos = 0;
	}
	memcpy(p->data + pos + PBOX_SHM_REC_HDR, hdr, PBOX_WIRE_HDR_LEN);
	if (len != 0) {
		memcpy(p->data + pos + PBOX_SHM_REC_HDR + PBOX_WIRE_HDR_LEN, payload, len);
	}
	rec_store(p->data + pos, PBOX_WIRE_HDR_LEN + len, kind);
	p->tail += need;
	/* Publish at once (a plain store on x86): a consumer on another core starts on this
	 * record while the next is written. The wake-up check is per batch. */
	p->published = p->tail;
	atomic_store_explicit(&p->ctl->tail, p->tail, memory_order_release);
	p->pushed++;
	return 0;
}

int pbox_shm_push(struct pbox_shm_prod *p, const struct pbox_wire_hdr *hdr, const void *payload,
		  uint32_t len)
{
	return push_rec(p, hdr, payload, len, PBOX_SHM_REC_DGRAM);
}

int pbox_shm_push_desc(struct pbox_shm_prod *p, const struct pbox_wire_hdr *hdr,
		       const struct pbox_shm_desc *d)
{
	return push_rec(p, hdr, d, sizeof(*d), PBOX_SHM_REC_DESC);
}

int pbox_shm_push_ref(struct pbox_shm_prod *p, const struct pbox_wire_hdr *hdr,
		      const struct pbox_shm_ref *r)
{
	return push_rec(p, hdr, r, sizeof(*r), PBOX_SHM_REC_REF);
}

int pbox_shm_push_dgram(struct pbox_shm_prod *p, const struct pbox_shm_dgram *d)
{
	return push_rec(p, (const struct pbox_wire_hdr *)(const void *)d->hdr, d->payload,
			d->len - PBOX_WIRE_HDR_LEN, d->kind);
}

bool pbox_shm_prod_need_wake(struct pbox_shm_prod *p)
{
	if (p->checked == p->published) {
		return false;
	}
	p->checked = p->published;
	atomic_thread_fence(memory_order_seq_cst);
	return atomic_load_explicit(&p->ctl->sleeping, memory_order_relaxed) != 0;
}

/* Read the producer's index once and bound it. */
static bool refresh_tail(struct pbox_shm_cons *c)
{
	uint64_t t = atomic_load_explicit(&c->ctl->tail, memory_order_acquire);

	/* Forward only, and never more than a ring ahead of what was released. */
	if (pbox_unlikely(t - c->tail > c->size - (c->tail - c->released))) {
		c->err = PBOX_SHM_ERR_TAIL;
		return false;
	}
	c->tail = t;
	return true;
}

unsigned pbox_shm_cons_pop(struct pbox_shm_cons *c, struct pbox_shm_dgram *out, unsigned max)
{
	unsigned n = 0;

	if (pbox_unlikely(c->err != PBOX_SHM_OK) || max == 0) {
		return 0;
	}
	if (c->head == c->tail && !refresh_tail(c)) {
		return 0;
	}
	while (n < max && c->head != c->tail) {
		uint64_t pos = c->head & (c->size - 1), avail = c->tail - c->head, w, rec;
		uint32_t len, kind;

		/* Records are 64-byte aligned, so at least a record header fits here. */
		w = rec_load(c->data + pos);
		len = (uint32_t)w;
		kind = (uint32_t)(w >> 32);
		if (kind == PBOX_SHM_REC_WRAP) {
			if (pbox_unlikely(c->size - pos > avail)) {
				c->err = PBOX_SHM_ERR_OVERRUN;
				break;
			}
			c->head += c->size - pos;
			continue;
		}
		if (pbox_unlikely(kind != PBOX_SHM_REC_DGRAM &&
				  (kind != PBOX_SHM_REC_DESC || !c->accept_desc) &&
				  (kind != PBOX_SHM_REC_REF || !c->accept_ref))) {
			c->err = PBOX_SHM_ERR_KIND;
			break;
		}
		if (pbox_unlikely(len == 0 || len > PBOX_SHM_MAX_DGRAM ||
				  (kind == PBOX_SHM_REC_DESC && len != PBOX_SHM_DESC_DGRAM) ||
				  (kind == PBOX_SHM_REC_REF && len != PBOX_SHM_REF_DGRAM))) {
			c->err = PBOX_SHM_ERR_LEN;
			break;
		}
		rec = rec_bytes(len);
		if (pbox_unlikely(rec > avail || pos + rec > c->size)) {
			c->err = PBOX_SHM_ERR_OVERRUN;
			break;
		}
		/* The header is copied out once: everything decided about this datagram is
		 * decided on the copy, whatever the producer writes meanwhile. */
		memcpy(out[n].hdr, c->data + pos + PBOX_SHM_REC_HDR,
		       PBOX_MIN(len, PBOX_WIRE_HDR_LEN));
		out[n].payload = len > PBOX_WIRE_HDR_LEN
					 ? c->data + pos + PBOX_SHM_REC_HDR + PBOX_WIRE_HDR_LEN
					 : NULL;
		out[n].data = c->data + pos + PBOX_SHM_REC_HDR;
		out[n].len = len;
		out[n].kind = kind;
		c->head += rec;
		n++;
		if (c->head == c->tail && n < max && !refresh_tail(c)) {
			break;
		}
	}
	c->popped += n;
	/* A broken ring hands out nothing, not even what was decoded before the fault. */
	return c->err == PBOX_SHM_OK ? n : 0;
}

void pbox_shm_cons_release(struct pbox_shm_cons *c)
{
	if (c->head != c->released) {
		c->released = c->head;
		atomic_store_explicit(&c->ctl->head, c->head, memory_order_release);
	}
}

bool pbox_shm_cons_release_wake(struct pbox_shm_cons *c)
{
	if (c->head == c->released) {
		return false;
	}
	pbox_shm_cons_release(c);
	atomic_thread_fence(memory_order_seq_cst);
	return atomic_load_explicit(&c->ctl->prod_waiting, memory_order_relaxed) != 0;
}

bool pbox_shm_cons_ready(const struct pbox_shm_cons *c)
{
	return c->head != c->tail ||
	       atomic_load_explicit(&c->ctl->tail, memory_order_acquire) != c->tail;
}

bool pbox_shm_cons_sleep_prepare(struct pbox_shm_cons *c)
{
	atomic_store_explicit(&c->ctl->sleeping, 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_seq_cst);
	if (pbox_shm_cons_ready(c)) {
		atomic_store_explicit(&c->ctl->sleeping, 0, memory_order_relaxed);
		return false;
	}
	return true;
}

void pbox_shm_cons_sleep_end(struct pbox_shm_cons *c)
{
	atomic_store_explicit(&c->ctl->sleeping, 0, memory_order_relaxed);
}
