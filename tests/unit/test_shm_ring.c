/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The shared-memory datagram rings (transport/shm/ring.h): wrap-around, full, empty, the
 * wake-up protocol, and a peer that writes nonsense into the shared indices and record
 * headers (the ring breaks with the right reason, never reads out of bounds: run under
 * ASan in CI). A two-thread run checks order and that no wake-up is lost.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cmocka.h>

#include "transport/shm/ring.h"
#include "transport/shm/shm.h"

#define SIZE PBOX_SHM_RING_MIN

struct ring {
	struct pbox_shm_ring_ctl ctl;
	uint8_t *data;
	struct pbox_shm_prod p;
	struct pbox_shm_cons c;
};

static struct ring *ring_new(void)
{
	struct ring *r = aligned_alloc(64, sizeof(*r));

	assert_non_null(r);
	r->data = aligned_alloc(64, SIZE);
	assert_non_null(r->data);
	memset(r->data, 0xa5, SIZE);
	pbox_shm_ring_ctl_init(&r->ctl);
	pbox_shm_prod_init(&r->p, &r->ctl, r->data, SIZE);
	pbox_shm_cons_init(&r->c, &r->ctl, r->data, SIZE);
	return r;
}

static void ring_free(struct ring *r)
{
	free(r->data);
	free(r);
}

static void mkhdr(struct pbox_wire_hdr *h, uint32_t seq, uint16_t len)
{
	memset(h, 0, sizeof(*h));
	h->magic = PBOX_WIRE_MAGIC;
	h->seq = seq;
	h->frag_len = len;
}

static void fill(uint8_t *buf, uint32_t len, uint32_t seed)
{
	for (uint32_t i = 0; i < len; i++) {
		buf[i] = (uint8_t)(seed * 31 + i * 7);
	}
}

static void check_dgram(const struct pbox_shm_dgram *d, uint32_t seq, uint32_t len)
{
	struct pbox_wire_hdr h;
	static uint8_t want[PBOX_WIRE_MAX_PAYLOAD];

	assert_int_equal(d->len, PBOX_WIRE_HDR_LEN + len);
	memcpy(&h, d->hdr, sizeof(h));
	assert_int_equal(h.seq, seq);
	assert_int_equal(h.frag_len, len);
	assert_memory_equal(d->data, d->hdr, PBOX_WIRE_HDR_LEN);
	if (len == 0) {
		assert_null(d->payload);
		return;
	}
	fill(want, len, seq);
	assert_memory_equal(d->payload, want, len);
	assert_true(((uintptr_t)d->payload & 63) == 0); /* payloads stay cache-line aligned */
}

static void test_empty(void **state)
{
	struct ring *r = ring_new();
	struct pbox_shm_dgram d[4];

	(void)state;
	assert_int_equal(pbox_shm_cons_pop(&r->c, d, 4), 0);
	assert_false(pbox_shm_cons_ready(&r->c));
	pbox_shm_cons_release(&r->c);
	assert_int_equal(r->c.err, PBOX_SHM_OK);
	ring_free(r);
}

/* Many laps of mixed sizes, a few records in flight at a time: every datagram comes out
 * once, in order, intact, across the wrap records. */
static void test_wrap(void **state)
{
	static uint8_t buf[PBOX_WIRE_MAX_PAYLOAD];
	static const uint32_t sizes[] = { 0, 1, 4, 1400, 8192, 60000, PBOX_WIRE_MAX_PAYLOAD, 333 };
	struct ring *r = ring_new();
	struct pbox_shm_dgram d[8];
	uint32_t sent = 0, got = 0;

	(void)state;
	while (r->p.tail < 20ull * SIZE) {
		for (int k = 0; k < 3; k++, sent++) {
			struct pbox_wire_hdr h;
			uint32_t len = sizes[sent % PBOX_ARRAY_SIZE(sizes)];

			mkhdr(&h, sent, (uint16_t)len);
			fill(buf, len, sent);
			assert_int_equal(pbox_shm_push(&r->p, &h, buf, len), 0);
		}
		for (;;) {
			unsigned n = pbox_shm_cons_pop(&r->c, d, 2);

			if (n == 0) {
				break;
			}
			for (unsigned i = 0; i < n; i++, got++) {
				check_dgram(&d[i], got, sizes[got % PBOX_ARRAY_SIZE(sizes)]);
			}
			pbox_shm_cons_release(&r->c);
		}
	}
	assert_int_equal(got, sent);
	assert_int_equal(r->c.err, PBOX_SHM_OK);
	assert_int_equal(r->p.err, PBOX_SHM_OK);
	ring_free(r);
}

/* A full ring refuses (counted) until the consumer releases; unreleased records are not
 * overwritten. */
static void test_full(void **state)
{
	static uint8_t buf[PBOX_WIRE_MAX_PAYLOAD];
	struct ring *r = ring_new();
	struct pbox_wire_hdr h;
	struct pbox_shm_dgram d[8];
	uint32_t n = 0;

	(void)state;
	for (;; n++) {
		mkhdr(&h, n, 60000);
		fill(buf, 60000, n);
		if (pbox_shm_push(&r->p, &h, buf, 60000) != 0) {
			break;
		}
	}
	assert_int_equal(n, SIZE / 60160); /* 64 + 64 + 60000 padded to 64 bytes */
	assert_int_equal(r->p.full, 1);
	mkhdr(&h, n, 60000);
	assert_int_equal(pbox_shm_push(&r->p, &h, buf, 60000), -ENOBUFS);
	/* Handed out but not released: still no room. */
	assert_int_equal(pbox_shm_cons_pop(&r->c, d, 1), 1);
	check_dgram(&d[0], 0, 60000);
	assert_int_equal(pbox_shm_push(&r->p, &h, buf, 60000), -ENOBUFS);
	pbox_shm_cons_release(&r->c);
	fill(buf, 60000, n);
	assert_int_equal(pbox_shm_push(&r->p, &h, buf, 60000), 0);
	for (uint32_t i = 1; i <= n; i++) {
		assert_int_equal(pbox_shm_cons_pop(&r->c, d, 1), 1);
		check_dgram(&d[0], i, 60000);
		pbox_shm_cons_release(&r->c);
	}
	assert_int_equal(pbox_shm_push(&r->p, &h, buf, PBOX_WIRE_MAX_PAYLOAD + 1), -EMSGSIZE);
	ring_free(r);
}

static void test_wakeup(void **state)
{
	struct ring *r = ring_new();
	struct pbox_wire_hdr h;
	struct pbox_shm_dgram d[1];

	(void)state;
	/* A new ring counts its consumer as asleep: the first publish wakes it. */
	mkhdr(&h, 0, 0);
	assert_int_equal(pbox_shm_push(&r->p, &h, NULL, 0), 0);
	assert_true(pbox_shm_prod_need_wake(&r->p));
	assert_false(pbox_shm_prod_need_wake(&r->p)); /* nothing new published */
	/* Data is there: the consumer must not block. */
	assert_false(pbox_shm_cons_sleep_prepare(&r->c));
	assert_int_equal(atomic_load(&r->ctl.sleeping), 0);
	assert_int_equal(pbox_shm_cons_pop(&r->c, d, 1), 1);
	pbox_shm_cons_release(&r->c);
	/* Awake consumer: no wake-up needed. */
	assert_int_equal(pbox_shm_push(&r->p, &h, NULL, 0), 0);
	assert_false(pbox_shm_prod_need_wake(&r->p));
	assert_int_equal(pbox_shm_cons_pop(&r->c, d, 1), 1);
	pbox_shm_cons_release(&r->c);
	/* Empty: it may sleep; the next publish wakes it; after waking no more. */
	assert_true(pbox_shm_cons_sleep_prepare(&r->c));
	assert_int_equal(pbox_shm_push(&r->p, &h, NULL, 0), 0);
	assert_true(pbox_shm_prod_need_wake(&r->p));
	pbox_shm_cons_sleep_end(&r->c);
	assert_int_equal(pbox_shm_push(&r->p, &h, NULL, 0), 0);
	assert_false(pbox_shm_prod_need_wake(&r->p));
	ring_free(r);
}

/* The other direction: a producer holding data back for want of room is woken by the
 * consumer that frees some, and only then. */
static void test_room_wakeup(void **state)
{
	static uint8_t buf[PBOX_WIRE_MAX_PAYLOAD];
	struct ring *r = ring_new();
	struct pbox_wire_hdr h;
	struct pbox_shm_dgram d[1];

	(void)state;
	mkhdr(&h, 0, 60000);
	assert_int_equal(pbox_shm_push(&r->p, &h, buf, 60000), 0);
	/* Room, no waiting producer: releasing wakes nobody. */
	assert_true(pbox_shm_prod_fits(&r->p, 60000));
	assert_int_equal(pbox_shm_cons_pop(&r->c, d, 1), 1);
	assert_false(pbox_shm_cons_release_wake(&r->c));
	while (pbox_shm_push(&r->p, &h, buf, 60000) == 0) {
	}
	assert_false(pbox_shm_prod_fits(&r->p, 60000));
	assert_false(pbox_shm_prod_wait_room(&r->p, 60000)); /* waits: flag set */
	assert_int_equal(atomic_load(&r->ctl.prod_waiting), 1);
	assert_false(pbox_shm_cons_release_wake(&r->c)); /* nothing handed out: no room made */
	assert_int_equal(pbox_shm_cons_pop(&r->c, d, 1), 1);
	assert_true(pbox_shm_cons_release_wake(&r->c)); /* room made: wake the producer */
	assert_true(pbox_shm_prod_wait_room(&r->p, 60000));
	assert_int_equal(atomic_load(&r->ctl.prod_waiting), 0);
	assert_int_equal(pbox_shm_push(&r->p, &h, buf, 60000), 0);
	assert_int_equal(pbox_shm_cons_pop(&r->c, d, 1), 1);
	assert_false(pbox_shm_cons_release_wake(&r->c));
	ring_free(r);
}

/* ---- a hostile peer ------------------------------------------------------------------ */

static void store_rec(uint8_t *at, uint32_t len, uint32_t kind)
{
	uint64_t w = (uint64_t)kind << 32 | len;

	memcpy(at, &w, sizeof(w));
}

static void expect_broken(struct ring *r, enum pbox_shm_err e)
{
	struct pbox_shm_dgram d[4];

	assert_int_equal(pbox_shm_cons_pop(&r->c, d, 4), 0);
	assert_int_equal(r->c.err, e);
	/* Broken for good, whatever the peer writes next. */
	atomic_store(&r->ctl.tail, 0);
	assert_int_equal(pbox_shm_cons_pop(&r->c, d, 4), 0);
	assert_int_equal(r->c.err, e);
}

static void test_bad_tail(void **state)
{
	struct ring *r = ring_new();

	(void)state;
	atomic_store(&r->ctl.tail, SIZE + 64); /* more than a ring ahead */
	expect_broken(r, PBOX_SHM_ERR_TAIL);
	ring_free(r);

	r = ring_new();
	atomic_store(&r->ctl.tail, UINT64_MAX - 63); /* "negative" */
	expect_broken(r, PBOX_SHM_ERR_TAIL);
	ring_free(r);

	/* Backwards after a good record. */
	r = ring_new();
	{
		struct pbox_wire_hdr h;
		struct pbox_shm_dgram d[1];

		mkhdr(&h, 0, 0);
		assert_int_equal(pbox_shm_push(&r->p, &h, NULL, 0), 0);
		assert_int_equal(pbox_shm_cons_pop(&r->c, d, 1), 1);
		atomic_store(&r->ctl.tail, 64);
		expect_broken(r, PBOX_SHM_ERR_TAIL);
	}
	ring_free(r);
}

static void test_bad_records(void **state)
{
	struct ring *r;

	(void)state;
	r = ring_new();
	store_rec(r->data, 64, 0x12345678);
	atomic_store(&r->ctl.tail, 128);
	expect_broken(r, PBOX_SHM_ERR_KIND);
	ring_free(r);

	r = ring_new();
	store_rec(r->data, 0, PBOX_SHM_REC_DGRAM);
	atomic_store(&r->ctl.tail, 128);
	expect_broken(r, PBOX_SHM_ERR_LEN);
	ring_free(r);

	r = ring_new();
	store_rec(r->data, PBOX_SHM_MAX_DGRAM + 1, PBOX_SHM_REC_DGRAM);
	atomic_store(&r->ctl.tail, SIZE);
	expect_broken(r, PBOX_SHM_ERR_LEN);
	ring_free(r);

	/* A length past what was published. */
	r = ring_new();
	store_rec(r->data, 1000, PBOX_SHM_REC_DGRAM);
	atomic_store(&r->ctl.tail, 128);
	expect_broken(r, PBOX_SHM_ERR_OVERRUN);
	ring_free(r);

	/* A record crossing the end of the area (published up to a full ring). */
	r = ring_new();
	for (uint64_t off = 0; off < SIZE - 128; off += 128) {
		store_rec(r->data + off, 64, PBOX_SHM_REC_DGRAM);
	}
	store_rec(r->data + SIZE - 128, 4096, PBOX_SHM_REC_DGRAM);
	atomic_store(&r->ctl.tail, SIZE);
	{
		struct pbox_shm_dgram d[16];
		unsigned total = 0, n;

		while ((n = pbox_shm_cons_pop(&r->c, d, 16)) != 0) {
			total += n;
		}
		assert_int_equal(r->c.err, PBOX_SHM_ERR_OVERRUN);
		assert_true(total < (SIZE - 128) / 128);
	}
	ring_free(r);

	/* A wrap record where less than the rest of the area was published. */
	r = ring_new();
	store_rec(r->data, 0, PBOX_SHM_REC_WRAP);
	atomic_store(&r->ctl.tail, 64);
	expect_broken(r, PBOX_SHM_ERR_OVERRUN);
	ring_free(r);
}

/* Descriptor records (pboxd -> worker only): refused by a consumer that does not accept
 * them (pboxd reading a worker's ring), handed out with their kind by one that does,
 * and only at their exact length; a backlog's copy keeps the kind. */
static void test_desc_records(void **state)
{
	struct pbox_shm_desc dsc = { .data_off = 4096, .gen_off = 64, .gen = 7, .len = 1024 };
	struct pbox_shm_dgram d[2];
	struct pbox_wire_hdr h;
	struct ring *r = ring_new(), *r2;

	(void)state;
	mkhdr(&h, 1, 1024);
	assert_int_equal(pbox_shm_push_desc(&r->p, &h, &dsc), 0);
	expect_broken(r, PBOX_SHM_ERR_KIND);
	ring_free(r);

	r = ring_new();
	r->c.accept_desc = true;
	assert_int_equal(pbox_shm_push_desc(&r->p, &h, &dsc), 0);
	assert_int_equal(pbox_shm_push(&r->p, &h, NULL, 0), 0);
	assert_int_equal(pbox_shm_cons_pop(&r->c, d, 2), 2);
	assert_int_equal(d[0].kind, PBOX_SHM_REC_DESC);
	assert_int_equal(d[0].len, PBOX_SHM_DESC_DGRAM);
	assert_memory_equal(d[0].payload, &dsc, sizeof(dsc));
	assert_int_equal(d[1].kind, PBOX_SHM_REC_DGRAM);
	/* Moved to another ring as a backlog does: still a descriptor. */
	r2 = ring_new();
	r2->c.accept_desc = true;
	assert_int_equal(pbox_shm_push_dgram(&r2->p, &d[0]), 0);
	assert_int_equal(pbox_shm_cons_pop(&r2->c, d, 2), 1);
	assert_int_equal(d[0].kind, PBOX_SHM_REC_DESC);
	assert_memory_equal(d[0].payload, &dsc, sizeof(dsc));
	ring_free(r2);
	ring_free(r);

	r = ring_new();
	r->c.accept_desc = true;
	store_rec(r->data, PBOX_SHM_DESC_DGRAM + 8, PBOX_SHM_REC_DESC);
	atomic_store(&r->ctl.tail, 256);
	expect_broken(r, PBOX_SHM_ERR_LEN);
	ring_free(r);
}

/* Reference records (a worker's push from its registered memory): read only by a
 * consumer that accepts them (pboxd's), of exactly their size; the reference resolves
 * only inside its region. */
static void test_ref_records(void **state)
{
	static const uint8_t region[8192];
	struct pbox_shm_ref ref = { .region = 0x305, .len = 1024, .off = 4096 }, bad;
	struct pbox_shm_dgram d[2];
	struct pbox_wire_hdr h;
	struct ring *r = ring_new();

	(void)state;
	mkhdr(&h, 1, 1024);
	r->c.accept_desc = true; /* a worker's consumer: references break it */
	assert_int_equal(pbox_shm_push_ref(&r->p, &h, &ref), 0);
	expect_broken(r, PBOX_SHM_ERR_KIND);
	ring_free(r);

	r = ring_new();
	r->c.accept_ref = true;
	assert_int_equal(pbox_shm_push_ref(&r->p, &h, &ref), 0);
	assert_int_equal(pbox_shm_push(&r->p, &h, NULL, 0), 0);
	assert_int_equal(pbox_shm_cons_pop(&r->c, d, 2), 2);
	assert_int_equal(d[0].kind, PBOX_SHM_REC_REF);
	assert_int_equal(d[0].len, PBOX_SHM_REF_DGRAM);
	assert_memory_equal(d[0].payload, &ref, sizeof(ref));
	assert_int_equal(d[1].kind, PBOX_SHM_REC_DGRAM);
	ring_free(r);

	r = ring_new();
	r->c.accept_ref = true;
	store_rec(r->data, PBOX_SHM_REF_DGRAM + 8, PBOX_SHM_REC_REF);
	atomic_store(&r->ctl.tail, 256);
	expect_broken(r, PBOX_SHM_ERR_LEN);
	ring_free(r);

	/* Resolution against the region (id 0x305, 8192 bytes). */
	assert_ptr_equal(pbox_shm_ref_payload(&ref, 0x305, region, sizeof(region)), region + 4096);
	bad = ref;
	bad.off = sizeof(region) - 1023; /* one byte past the end */
	assert_null(pbox_shm_ref_payload(&bad, 0x305, region, sizeof(region)));
	bad.off = sizeof(region) - 1024; /* the last bytes */
	assert_non_null(pbox_shm_ref_payload(&bad, 0x305, region, sizeof(region)));
	bad.off = UINT64_MAX - 512; /* off + len overflows */
	assert_null(pbox_shm_ref_payload(&bad, 0x305, region, sizeof(region)));
	bad = ref;
	bad.region = 0x405; /* the same slot, another registration */
	assert_null(pbox_shm_ref_payload(&bad, 0x305, region, sizeof(region)));
	bad = ref;
	bad.len = 0;
	assert_null(pbox_shm_ref_payload(&bad, 0x305, region, sizeof(region)));
	bad.len = PBOX_WIRE_MAX_PAYLOAD + 1;
	bad.off = 0;
	assert_null(pbox_shm_ref_payload(&bad, 0x305, region, 1u << 20));
}

/* The header handed out is a copy: rewriting the ring afterwards changes nothing. */
static void test_header_copied_once(void **state)
{
	struct ring *r = ring_new();
	struct pbox_wire_hdr h;
	struct pbox_shm_dgram d[1];
	uint8_t pay[256];

	(void)state;
	mkhdr(&h, 7, sizeof(pay));
	fill(pay, sizeof(pay), 7);
	assert_int_equal(pbox_shm_push(&r->p, &h, pay, sizeof(pay)), 0);
	assert_int_equal(pbox_shm_cons_pop(&r->c, d, 1), 1);
	memset(r->data + PBOX_SHM_REC_HDR, 0xff, PBOX_WIRE_HDR_LEN);
	store_rec(r->data, 0xffffff, 0xdead);
	memcpy(&h, d[0].hdr, sizeof(h));
	assert_int_equal(h.seq, 7);
	assert_int_equal(d[0].len, PBOX_WIRE_HDR_LEN + sizeof(pay));
	ring_free(r);
}

/* The producer's side: a consumer index that goes backwards or past the tail. */
static void test_bad_head(void **state)
{
	static uint8_t buf[PBOX_WIRE_MAX_PAYLOAD];
	struct ring *r = ring_new();
	struct pbox_wire_hdr h;

	(void)state;
	mkhdr(&h, 0, 60000);
	while (pbox_shm_push(&r->p, &h, buf, 60000) == 0) {
	}
	atomic_store(&r->ctl.head, r->p.tail + 64);
	assert_int_equal(pbox_shm_push(&r->p, &h, buf, 60000), -EPIPE);
	assert_int_equal(r->p.err, PBOX_SHM_ERR_HEAD);
	ring_free(r);

	r = ring_new();
	while (pbox_shm_push(&r->p, &h, buf, 60000) == 0) {
	}
	atomic_store(&r->ctl.head, 120320); /* two records consumed ... */
	assert_int_equal(pbox_shm_push(&r->p, &h, buf, 60000), 0);
	while (pbox_shm_push(&r->p, &h, buf, 60000) == 0) {
	}
	assert_int_equal(r->p.err, PBOX_SHM_OK);
	atomic_store(&r->ctl.head, 64); /* ... then backwards */
	assert_int_equal(pbox_shm_push(&r->p, &h, buf, 60000), -EPIPE);
	assert_int_equal(r->p.err, PBOX_SHM_ERR_HEAD);
	ring_free(r);
}

/* ---- two threads ----------------------------------------------------------------------- */

#define STRESS_N 200000u

struct stress {
	struct ring *r;
	int efd;
	uint32_t lost_wakeups;
};

static void *producer(void *arg)
{
	struct stress *s = arg;
	uint8_t buf[2048];

	for (uint32_t i = 0; i < STRESS_N;) {
		struct pbox_wire_hdr h;
		uint32_t len = (i * 131) % sizeof(buf);

		mkhdr(&h, i, (uint16_t)len);
		memset(buf, (int)(i & 0xff), len);
		if (pbox_shm_push(&s->r->p, &h, buf, len) == 0) {
			i++;
		}
		if ((i & 7) == 0 || i == STRESS_N) {
			if (pbox_shm_prod_need_wake(&s->r->p)) {
				uint64_t one = 1;

				assert_int_equal(write(s->efd, &one, sizeof(one)), sizeof(one));
			}
		}
	}
	return NULL;
}

/* The consumer sleeps whenever the ring is empty: a lost wake-up shows as a poll that
 * times out with data published. */
static void test_threads(void **state)
{
	struct stress s = { .r = ring_new() };
	struct pbox_shm_dgram d[32];
	pthread_t t;
	uint32_t next = 0;

	(void)state;
	s.efd = eventfd(0, EFD_NONBLOCK);
	assert_true(s.efd >= 0);
	assert_int_equal(pthread_create(&t, NULL, producer, &s), 0);
	while (next < STRESS_N) {
		unsigned n = pbox_shm_cons_pop(&s.r->c, d, 32);

		for (unsigned i = 0; i < n; i++, next++) {
			struct pbox_wire_hdr h;
			uint32_t len = (next * 131) % 2048;

			memcpy(&h, d[i].hdr, sizeof(h));
			assert_int_equal(h.seq, next);
			assert_int_equal(d[i].len, PBOX_WIRE_HDR_LEN + len);
			if (len != 0) {
				assert_int_equal(d[i].payload[len - 1], next & 0xff);
			}
		}
		pbox_shm_cons_release(&s.r->c);
		if (n == 0 && pbox_shm_cons_sleep_prepare(&s.r->c)) {
			struct pollfd p = { .fd = s.efd, .events = POLLIN };
			uint64_t v;

			if (poll(&p, 1, 2000) == 0 && pbox_shm_cons_ready(&s.r->c)) {
				s.lost_wakeups++;
			}
			pbox_shm_cons_sleep_end(&s.r->c);
			if (read(s.efd, &v, sizeof(v)) < 0) {
				/* nobody rang */
			}
		}
	}
	pthread_join(t, NULL);
	assert_int_equal(s.lost_wakeups, 0);
	assert_int_equal(s.r->c.err, PBOX_SHM_OK);
	close(s.efd);
	ring_free(s.r);
}

static void test_layout(void **state)
{
	struct pbox_shm_layout lay;

	(void)state;
	assert_int_equal(pbox_shm_layout(&lay, 2, 4u << 20), 0);
	assert_int_equal(lay.ctl_bytes, 4096);
	assert_int_equal(lay.seg_bytes, 4096 + 4ull * (4u << 20));
	assert_int_equal(pbox_shm_layout(&lay, 0, 4u << 20), -EINVAL);
	assert_int_equal(pbox_shm_layout(&lay, 2, (4u << 20) + 64), -EINVAL); /* not 2^k */
	assert_int_equal(pbox_shm_layout(&lay, 2, 64u << 10), -EINVAL);       /* too small */
	assert_int_equal(pbox_shm_layout(&lay, PBOX_SHM_MAX_CORES + 1, 4u << 20), -EINVAL);
	assert_string_equal(pbox_shm_err_name(PBOX_SHM_ERR_OVERRUN), "overrun");
	assert_string_equal(pbox_shm_err_name((enum pbox_shm_err)99), "unknown");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_empty),       cmocka_unit_test(test_wrap),
		cmocka_unit_test(test_full),        cmocka_unit_test(test_wakeup),
		cmocka_unit_test(test_room_wakeup), cmocka_unit_test(test_bad_tail),
		cmocka_unit_test(test_bad_records), cmocka_unit_test(test_header_copied_once),
		cmocka_unit_test(test_bad_head),    cmocka_unit_test(test_threads),
		cmocka_unit_test(test_layout),      cmocka_unit_test(test_desc_records),
		cmocka_unit_test(test_ref_records),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
