/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz harness of the shared-memory rings (dataplane/transport/shm/ring.h) against a
 * peer that writes anything into the shared memory at any time: pboxd consumes the
 * worker's ring (whose tail and records the worker writes) and produces into the
 * worker's (whose head the worker writes). One ring of the smallest size, an honest
 * producer and an honest consumer on it, and hostile writes in between.
 *
 * Input grammar: a sequence of operations, each one byte (op % 8) and its arguments:
 *   0 push     u16 len: the honest producer writes a datagram of len % 65409 bytes (an
 *              odd len: a descriptor record instead, as pboxd sends results)
 *   1 tail     u64: the shared tail becomes that value
 *   2 tail+    i16 delta: the shared tail becomes the producer's tail + delta * 64
 *   3 record   u32 pos, u32 len, u8 kind: a record header word at pos (8-aligned):
 *              kind % 4: a datagram, a wrap, a descriptor, or the raw u32 that follows
 *   4 pop      u8 max: the honest consumer takes up to max % 64 + 1 datagrams, reads
 *              every byte it was handed, and releases them
 *   5 head     u64: the shared head becomes that value (a hostile consumer)
 *   6 bytes    u32 pos, u8 n: the next n bytes of input are written into the area at pos
 *   7 ref      u32 region, u32 len, u64 off: the honest producer writes a reference record
 *              (a worker's push from its registered memory) with these fields as given
 * The consumer accepts descriptor records (the worker's) if the first input byte has its
 * top bit set, reference records (pboxd's) if its bit 6 is set.
 * Every reference record popped is copied out and resolved against one registered region
 * (pbox_shm_ref_payload: a heap block of REGION bytes, id REGION_ID): a payload it
 * returns must lie in the region (every byte is read: ASan), and one that names another
 * id, a zero or too large length, or bytes past the end must be refused.
 * Invariants (aborts): a datagram handed out lies inside the area, its length is within
 * [1, PBOX_SHM_MAX_DGRAM], its header copy equals its first bytes at the time of the pop,
 * and once a side reports an error it hands out / accepts nothing more. Reads outside
 * the area are caught by ASan (the area is a heap block of exactly its size).
 */
#include <errno.h>

#include "fuzz.h"
#include "transport/shm/ring.h"

#define SIZE      PBOX_SHM_RING_MIN
#define REGION    (3u * 65536u + 123u)
#define REGION_ID 0x105u

static uint8_t g_payload[PBOX_WIRE_MAX_PAYLOAD];

/* A popped reference record, resolved as pboxd's core does. */
static void check_ref(const struct pbox_shm_dgram *d, const uint8_t *region)
{
	struct pbox_shm_ref ref;
	const uint8_t *p;
	volatile uint8_t sink = 0;
	bool inside;

	memcpy(&ref, d->payload, sizeof(ref));
	p = pbox_shm_ref_payload(&ref, REGION_ID, region, REGION);
	inside = ref.region == REGION_ID && ref.len != 0 && ref.len <= PBOX_WIRE_MAX_PAYLOAD &&
		 ref.off <= REGION && (uint64_t)ref.off + ref.len <= REGION;
	FUZZ_CHECK((p != NULL) == inside, "reference (%#x, %u at %llu) %s", ref.region, ref.len,
		   (unsigned long long)ref.off, p != NULL ? "taken" : "refused");
	if (p == NULL) {
		return;
	}
	FUZZ_CHECK(p == region + ref.off, "payload not at its offset");
	for (uint32_t b = 0; b < ref.len; b++) {
		sink ^= p[b];
	}
	(void)sink;
}

static void do_pop(struct pbox_shm_cons *c, const uint8_t *data, const uint8_t *region,
		   unsigned max)
{
	struct pbox_shm_dgram d[64];
	enum pbox_shm_err before = c->err;
	unsigned n = pbox_shm_cons_pop(c, d, max);
	volatile uint8_t sink = 0;

	FUZZ_CHECK(n <= max, "popped %u of at most %u", n, max);
	FUZZ_CHECK(before == PBOX_SHM_OK || n == 0, "a broken ring handed out %u", n);
	for (unsigned i = 0; i < n; i++) {
		FUZZ_CHECK(d[i].len >= 1 && d[i].len <= PBOX_SHM_MAX_DGRAM, "length %u", d[i].len);
		FUZZ_CHECK(d[i].data >= data && d[i].data + d[i].len <= data + SIZE,
			   "datagram at %td + %u outside the area", d[i].data - data, d[i].len);
		FUZZ_CHECK((d[i].len > PBOX_WIRE_HDR_LEN) == (d[i].payload != NULL), "payload");
		FUZZ_CHECK(d[i].kind == PBOX_SHM_REC_DGRAM ||
				   (d[i].kind == PBOX_SHM_REC_DESC && c->accept_desc &&
				    d[i].len == PBOX_SHM_DESC_DGRAM) ||
				   (d[i].kind == PBOX_SHM_REC_REF && c->accept_ref &&
				    d[i].len == PBOX_SHM_REF_DGRAM),
			   "record kind %#x (descriptors accepted: %d, references: %d), length %u",
			   d[i].kind, c->accept_desc, c->accept_ref, d[i].len);
		if (d[i].kind == PBOX_SHM_REC_REF) {
			check_ref(&d[i], region);
		}
		if (d[i].payload != NULL) {
			FUZZ_CHECK(d[i].payload == d[i].data + PBOX_WIRE_HDR_LEN, "payload offset");
		}
		FUZZ_CHECK(memcmp(d[i].hdr, d[i].data, PBOX_MIN(d[i].len, PBOX_WIRE_HDR_LEN)) == 0,
			   "header copy differs");
		for (uint32_t b = 0; b < d[i].len; b++) {
			sink ^= d[i].data[b]; /* every byte handed out is readable */
		}
	}
	(void)sink;
	pbox_shm_cons_release(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *in, size_t size)
{
	struct pbox_shm_ring_ctl *ctl = aligned_alloc(64, sizeof(*ctl));
	uint8_t *data = malloc(SIZE);
	uint8_t *region = malloc(REGION);
	struct pbox_shm_prod p;
	struct pbox_shm_cons c;
	struct fz f;
	unsigned ops = 0;

	if (ctl == NULL || data == NULL || region == NULL) {
		free(ctl);
		free(data);
		free(region);
		return 0;
	}
	memset(data, 0, SIZE);
	memset(region, 0x5a, REGION);
	pbox_shm_ring_ctl_init(ctl);
	pbox_shm_prod_init(&p, ctl, data, SIZE);
	pbox_shm_cons_init(&c, ctl, data, SIZE);
	/* The worker's consumer accepts descriptor records, pboxd's does not: both. */
	c.accept_desc = size > 0 && (in[0] & 0x80);
	c.accept_ref = size > 0 && (in[0] & 0x40); /* pboxd's consumer */
	fz_init(&f, in, size);
	while (!fz_empty(&f) && ops++ < 4096) {
		switch (fz_u8(&f) % 8) {
		case 0: {
			struct pbox_wire_hdr h = { .magic = PBOX_WIRE_MAGIC };
			uint32_t len = fz_u16(&f) % (PBOX_WIRE_MAX_PAYLOAD + 1);
			enum pbox_shm_err before = p.err;
			/* An odd length pushes a descriptor record instead (pboxd's results). */
			struct pbox_shm_desc dsc = { .len = len };
			int rc = len & 1 ? pbox_shm_push_desc(&p, &h, &dsc)
					 : pbox_shm_push(&p, &h, g_payload, len);

			FUZZ_CHECK(rc == 0 || rc == -ENOBUFS || rc == -EPIPE, "push: %d", rc);
			FUZZ_CHECK(before == PBOX_SHM_OK || rc == -EPIPE,
				   "a broken ring took a push");
			FUZZ_CHECK(p.tail - p.head <= SIZE, "producer overcommitted");
			break;
		}
		case 1:
			atomic_store(&ctl->tail, fz_u64(&f));
			break;
		case 2:
			atomic_store(&ctl->tail,
				     p.tail + (uint64_t)(int64_t)(int16_t)fz_u16(&f) * 64);
			break;
		case 3: {
			uint32_t pos = fz_u32(&f) % SIZE & ~7u, len = fz_u32(&f);
			uint8_t k = fz_u8(&f) % 4;
			uint32_t kind = k == 0   ? PBOX_SHM_REC_DGRAM
					: k == 1 ? PBOX_SHM_REC_WRAP
					: k == 2 ? PBOX_SHM_REC_DESC
						 : fz_u32(&f);
			uint64_t w = (uint64_t)kind << 32 | len;

			memcpy(data + pos, &w, sizeof(w));
			break;
		}
		case 4:
			do_pop(&c, data, region, fz_u8(&f) % 64 + 1);
			break;
		case 5:
			atomic_store(&ctl->head, fz_u64(&f));
			break;
		case 6: {
			uint32_t pos = fz_u32(&f) % SIZE;
			size_t n = fz_u8(&f);

			fz_bytes(&f, data + pos, n < SIZE - pos ? n : SIZE - pos);
			break;
		}
		case 7: {
			struct pbox_wire_hdr h = { .magic = PBOX_WIRE_MAGIC };
			struct pbox_shm_ref r = { .region = fz_u32(&f), .len = fz_u32(&f) };
			enum pbox_shm_err before = p.err;
			int rc;

			r.off = fz_u64(&f);
			rc = pbox_shm_push_ref(&p, &h, &r);
			FUZZ_CHECK(rc == 0 || rc == -ENOBUFS || rc == -EPIPE, "push_ref: %d", rc);
			FUZZ_CHECK(before == PBOX_SHM_OK || rc == -EPIPE,
				   "a broken ring took a push");
			break;
		}
		}
	}
	do_pop(&c, data, region, 64);
	free(ctl);
	free(data);
	free(region);
	return 0;
}
