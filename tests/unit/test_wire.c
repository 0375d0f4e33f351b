/* SPDX-License-Identifier: BSD-3-Clause */
/* Wire format: every malformed field, truncation, version, unknown job, bad cookie. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <endian.h>

#include <cmocka.h>

#include "common/bitmap.h"
#include "common/jobdesc.h"
#include "common/wire_check.h"

#define FRAG 1024u

static struct pbox_jobdesc g_desc;
static uint64_t g_cookies[3] = { 0x1111, 0x2222, 0 }; /* rank 2 not admitted */
static uint64_t g_worker_cookie[1] = { 0x2222 };
static struct pbox_wire_job g_job = { .id = 7, .desc = &g_desc, .cookies = g_cookies };
static struct pbox_wire_job g_wjob = { .id = 7, .desc = &g_desc, .cookies = g_worker_cookie };
static uint8_t g_pkt[PBOX_WIRE_HDR_LEN + 4096];

static const struct pbox_wire_job *lookup(void *arg, uint32_t id)
{
	const struct pbox_wire_job *j = arg;

	return id == j->id ? j : NULL;
}

static int setup(void **state)
{
	/* key 0: 3000 floats (12000 bytes) -> chunks of 8192 + 3808 bytes */
	struct pbox_keyspec keys[] = { { 0, 3000 }, { 5, 16 } };
	char err[128];

	(void)state;
	return pbox_jobdesc_build(&g_desc, keys, 2, 3, 2, 8192, FRAG, NULL, err, sizeof(err));
}

static int teardown(void **state)
{
	(void)state;
	pbox_jobdesc_free(&g_desc);
	return 0;
}

/* A valid PUSH of fragment f of chunk c from rank 1; returns the datagram length. */
static size_t make_push(uint32_t c, uint32_t f)
{
	const struct pbox_chunk_desc *cd = &g_desc.chunks[c];
	struct pbox_msg m = {
		.type = PBOX_MSG_PUSH,
		.encoding = PBOX_ENC_F32,
		.flags = PBOX_F_WANT_REPLY,
		.job = 7,
		.sender = 1,
		.cookie = 0x2222,
		.chunk = c,
		.iter = 3,
		.frag_off = f * FRAG,
		.frag_len = pbox_frag_len(&g_desc, cd->bytes, f),
		.chunk_len = cd->bytes,
		.seq = 99,
	};

	memset(g_pkt, 0xab, sizeof(g_pkt));
	pbox_wire_encode(&m, (struct pbox_wire_hdr *)g_pkt);
	return PBOX_WIRE_HDR_LEN + m.frag_len;
}

static enum pbox_drop_reason validate(size_t len, struct pbox_msg *m)
{
	const struct pbox_wire_job *j = NULL;

	return pbox_wire_validate(g_pkt, len, PBOX_ROLE_APPLIANCE, lookup, &g_job, m, &j);
}

static struct pbox_wire_hdr *hdr(void)
{
	return (struct pbox_wire_hdr *)g_pkt;
}

static void test_roundtrip(void **state)
{
	struct pbox_msg m;
	size_t len = make_push(1, 3);

	(void)state;
	assert_int_equal(validate(len, &m), PBOX_DROP_NONE);
	assert_int_equal(m.type, PBOX_MSG_PUSH);
	assert_int_equal(m.job, 7);
	assert_int_equal(m.sender, 1);
	assert_true(m.cookie == 0x2222);
	assert_int_equal(m.chunk, 1);
	assert_int_equal(m.iter, 3);
	assert_int_equal(m.frag_off, 3 * FRAG);
	assert_int_equal(m.frag_len, 3808 - 3 * FRAG);
	assert_int_equal(m.seq, 99);
	assert_ptr_equal(m.payload, g_pkt + PBOX_WIRE_HDR_LEN);
	/* Byte order on the wire is big-endian. */
	assert_int_equal(g_pkt[0], 'P');
	assert_int_equal(g_pkt[3], 'X');
	assert_int_equal(g_pkt[31], 3); /* iter low byte last */
}

static void test_truncated(void **state)
{
	struct pbox_msg m;
	size_t len = make_push(0, 0);

	(void)state;
	for (size_t l = 0; l < PBOX_WIRE_HDR_LEN; l++) {
		assert_int_equal(pbox_wire_decode(g_pkt, l, &m), PBOX_DROP_TRUNCATED);
	}
	/* Payload cut short: the length disagrees with frag_len. */
	assert_int_equal(validate(len - 1, &m), PBOX_DROP_BAD_LENGTH);
	assert_int_equal(validate(len + 4, &m), PBOX_DROP_BAD_LENGTH);
}

static void test_header_fields(void **state)
{
	struct pbox_msg m;
	size_t len;

	(void)state;
	len = make_push(0, 0);
	hdr()->magic ^= htobe32(1);
	assert_int_equal(validate(len, &m), PBOX_DROP_BAD_MAGIC);

	len = make_push(0, 0);
	hdr()->version = 2;
	assert_int_equal(validate(len, &m), PBOX_DROP_BAD_VERSION);
	hdr()->version = 0;
	assert_int_equal(validate(len, &m), PBOX_DROP_BAD_VERSION);

	len = make_push(0, 0);
	hdr()->type = 0;
	assert_int_equal(validate(len, &m), PBOX_DROP_BAD_TYPE);
	hdr()->type = PBOX_MSG_TYPE_MAX + 1;
	assert_int_equal(validate(len, &m), PBOX_DROP_BAD_TYPE);
	hdr()->type = 0xff;
	assert_int_equal(validate(len, &m), PBOX_DROP_BAD_TYPE);

	len = make_push(0, 0);
	hdr()->hdr_len = 32;
	assert_int_equal(validate(len, &m), PBOX_DROP_BAD_HDR_LEN);

	len = make_push(0, 0);
	hdr()->sack = htobe64(1); /* without PBOX_F_SACK */
	assert_int_equal(validate(len, &m), PBOX_DROP_BAD_RESERVED);

	len = make_push(0, 0);
	hdr()->flags = htobe16(1u << 9);
	assert_int_equal(validate(len, &m), PBOX_DROP_BAD_FLAGS);

	len = make_push(0, 0);
	hdr()->encoding = PBOX_ENC_NONE;
	assert_int_equal(validate(len, &m), PBOX_DROP_BAD_ENCODING);
	hdr()->encoding = 77;
	assert_int_equal(validate(len, &m), PBOX_DROP_BAD_ENCODING);
}

static void test_fragments(void **state)
{
	struct pbox_msg m;
	size_t len;

	(void)state;
	/* Fragment beyond the chunk end. */
	len = make_push(1, 0);
	hdr()->frag_off = htobe32(3808 - 512);
	assert_int_equal(validate(len, &m), PBOX_DROP_BAD_FRAGMENT);
	/* Offset overflow must not wrap into range. */
	hdr()->frag_off = htobe32(0xfffffe00u);
	assert_int_equal(validate(len, &m), PBOX_DROP_BAD_FRAGMENT);
	/* Not a whole number of floats. */
	len = make_push(0, 0);
	hdr()->frag_len = htobe16(FRAG - 2);
	assert_int_equal(validate(len - 2, &m), PBOX_DROP_BAD_FRAGMENT);
	/* Off the job's fragment grid. */
	len = make_push(0, 1);
	hdr()->frag_off = htobe32(FRAG + 64);
	assert_int_equal(validate(len, &m), PBOX_DROP_BAD_ALIGNMENT);
	/* Right offset, short length. */
	len = make_push(0, 1);
	hdr()->frag_len = htobe16(FRAG - 64);
	assert_int_equal(validate(len - 64, &m), PBOX_DROP_BAD_ALIGNMENT);
	/* Chunk length disagreeing with the job. */
	len = make_push(0, 0);
	hdr()->chunk_len = htobe32(8192 + 1024);
	assert_int_equal(validate(len, &m), PBOX_DROP_BAD_CHUNK);
	/* A PULL carries no payload. */
	len = make_push(0, 0);
	hdr()->type = PBOX_MSG_PULL;
	hdr()->flags = 0;
	assert_int_equal(validate(len, &m), PBOX_DROP_BAD_ENCODING);
	hdr()->encoding = PBOX_ENC_NONE;
	assert_int_equal(validate(len, &m), PBOX_DROP_BAD_FRAGMENT);
	hdr()->frag_len = 0;
	hdr()->frag_off = 0;
	assert_int_equal(validate(PBOX_WIRE_HDR_LEN, &m), PBOX_DROP_NONE);
	assert_null(m.payload);
}

static void test_job_fields(void **state)
{
	struct pbox_msg m;
	size_t len;

	(void)state;
	len = make_push(0, 0);
	hdr()->job = htobe32(8);
	assert_int_equal(validate(len, &m), PBOX_DROP_UNKNOWN_JOB);

	len = make_push(0, 0);
	hdr()->cookie = htobe64(0x1111); /* rank 0's cookie presented by rank 1 */
	assert_int_equal(validate(len, &m), PBOX_DROP_BAD_COOKIE);

	len = make_push(0, 0);
	hdr()->sender = htobe32(2); /* rank 2 has no session: cookie 0 never matches */
	hdr()->cookie = 0;
	assert_int_equal(validate(len, &m), PBOX_DROP_BAD_COOKIE);

	len = make_push(0, 0);
	hdr()->sender = htobe32(3);
	assert_int_equal(validate(len, &m), PBOX_DROP_BAD_SENDER);
	hdr()->sender = htobe32(PBOX_SENDER_APPLIANCE);
	assert_int_equal(validate(len, &m), PBOX_DROP_BAD_SENDER);

	len = make_push(0, 0);
	hdr()->chunk = htobe32(g_desc.nchunks);
	assert_int_equal(validate(len, &m), PBOX_DROP_BAD_CHUNK);
	hdr()->chunk = htobe32(0xffffffffu);
	assert_int_equal(validate(len, &m), PBOX_DROP_BAD_CHUNK);

	/* Replies are not accepted by the appliance. */
	len = make_push(0, 0);
	hdr()->type = PBOX_MSG_DATA;
	hdr()->flags = 0;
	assert_int_equal(validate(len, &m), PBOX_DROP_BAD_SENDER);

	/* INIT: only rank 0, only jobs that take it, only iteration 0. */
	len = make_push(0, 0);
	hdr()->type = PBOX_MSG_INIT;
	hdr()->flags = 0;
	assert_int_equal(validate(len, &m), PBOX_DROP_NOT_ALLOWED);
	g_job.accepts_init = true;
	assert_int_equal(validate(len, &m), PBOX_DROP_NOT_ALLOWED); /* rank 1 */
	hdr()->sender = 0;
	hdr()->cookie = htobe64(0x1111);
	assert_int_equal(validate(len, &m), PBOX_DROP_NOT_ALLOWED); /* iter 3 */
	hdr()->iter = 0;
	assert_int_equal(validate(len, &m), PBOX_DROP_NONE);
	g_job.accepts_init = false;
}

static void test_worker_role(void **state)
{
	struct pbox_msg m = {
		.type = PBOX_MSG_ACK,
		.job = 7,
		.sender = PBOX_SENDER_APPLIANCE,
		.cookie = 0x2222,
		.chunk = 2,
		.chunk_len = 64,
	};
	const struct pbox_wire_job *j;

	(void)state;
	pbox_wire_encode(&m, hdr());
	assert_int_equal(pbox_wire_validate(g_pkt, PBOX_WIRE_HDR_LEN, PBOX_ROLE_WORKER, lookup,
					    &g_wjob, &m, &j),
			 PBOX_DROP_NONE);
	/* A push is not something a worker accepts. */
	make_push(0, 0);
	assert_int_equal(pbox_wire_validate(g_pkt, PBOX_WIRE_HDR_LEN + FRAG, PBOX_ROLE_WORKER,
					    lookup, &g_wjob, &m, &j),
			 PBOX_DROP_BAD_SENDER);
}

/* An ACK to rank 1 with the given flags and SACK fields; validated in the worker role. */
static enum pbox_drop_reason sack_msg(uint8_t type, uint16_t flags, uint32_t c, uint32_t frag_off,
				      uint64_t sack, struct pbox_msg *out)
{
	struct pbox_msg m = {
		.type = type,
		.flags = flags,
		.job = 7,
		.sender = type == PBOX_MSG_PULL ? 1 : PBOX_SENDER_APPLIANCE,
		.cookie = 0x2222,
		.chunk = c,
		.chunk_len = g_desc.chunks[c].bytes,
		.frag_off = frag_off,
		.sack = sack,
	};
	const struct pbox_wire_job *j;

	pbox_wire_encode(&m, hdr());
	if (!(flags & PBOX_F_SACK)) {
		hdr()->sack = htobe64(sack); /* encode writes it only with the flag */
	}
	return pbox_wire_validate(g_pkt, PBOX_WIRE_HDR_LEN,
				  type == PBOX_MSG_PULL ? PBOX_ROLE_APPLIANCE : PBOX_ROLE_WORKER,
				  lookup, type == PBOX_MSG_PULL ? &g_job : &g_wjob, out, &j);
}

/* Selective acknowledgements: the bitmap forms (NACK, PULL) and every way to get them
 * wrong. Chunk 0 has 8 fragments, chunk 1 has 4. */
static void test_sack(void **state)
{
	uint64_t bits[2] = { 0, 0 };
	struct pbox_msg m;
	uint32_t base;
	uint64_t map;

	(void)state;
	/* A NACK: fragments 0, 1 held (below the base), 2 missing, 3 and 5 held. */
	assert_int_equal(sack_msg(PBOX_MSG_ACK, PBOX_F_SACK, 0, 2 * FRAG, 0xa, &m), PBOX_DROP_NONE);
	assert_int_equal(m.frag_off, 2 * FRAG);
	assert_int_equal(m.sack, 0xa);
	assert_true(pbox_sack_has(2, m.sack, 0) && pbox_sack_has(2, m.sack, 1));
	assert_false(pbox_sack_has(2, m.sack, 2));
	assert_true(pbox_sack_has(2, m.sack, 3) && pbox_sack_has(2, m.sack, 5));
	assert_false(pbox_sack_has(2, m.sack, 4) || pbox_sack_has(2, m.sack, 7));
	/* The map may reach the chunk's last fragment, not past it. */
	assert_int_equal(sack_msg(PBOX_MSG_ACK, PBOX_F_SACK, 0, 2 * FRAG, 0x3f, &m),
			 PBOX_DROP_NONE);
	assert_int_equal(sack_msg(PBOX_MSG_ACK, PBOX_F_SACK, 0, 2 * FRAG, 0x40, &m),
			 PBOX_DROP_BAD_ALIGNMENT);
	assert_int_equal(sack_msg(PBOX_MSG_ACK, PBOX_F_SACK, 1, 0, 0x10, &m),
			 PBOX_DROP_BAD_ALIGNMENT);
	assert_int_equal(sack_msg(PBOX_MSG_ACK, PBOX_F_SACK, 1, 3 * FRAG, 1ull << 63, &m),
			 PBOX_DROP_BAD_ALIGNMENT);
	/* The base on the fragment grid and inside the chunk. */
	assert_int_equal(sack_msg(PBOX_MSG_ACK, PBOX_F_SACK, 0, 2 * FRAG + 64, 0, &m),
			 PBOX_DROP_BAD_ALIGNMENT);
	assert_int_equal(sack_msg(PBOX_MSG_ACK, PBOX_F_SACK, 0, 8 * FRAG, 0, &m),
			 PBOX_DROP_BAD_FRAGMENT);
	assert_int_equal(sack_msg(PBOX_MSG_ACK, PBOX_F_SACK, 1, 3808, 0, &m),
			 PBOX_DROP_BAD_FRAGMENT);
	/* Without the flag: no bitmap and no offset. */
	assert_int_equal(sack_msg(PBOX_MSG_ACK, 0, 0, 0, 0x1, &m), PBOX_DROP_BAD_RESERVED);
	assert_int_equal(sack_msg(PBOX_MSG_ACK, 0, 0, FRAG, 0, &m), PBOX_DROP_BAD_FRAGMENT);
	/* Which types may carry which of the new flags. */
	assert_int_equal(sack_msg(PBOX_MSG_ACK, PBOX_F_LAST, 0, 0, 0, &m), PBOX_DROP_BAD_FLAGS);
	assert_int_equal(sack_msg(PBOX_MSG_ERROR, PBOX_F_SACK, 0, 0, 0, &m), PBOX_DROP_BAD_FLAGS);
	assert_int_equal(sack_msg(PBOX_MSG_PULL, PBOX_F_SACK | PBOX_F_RETRANSMIT, 0, FRAG, 0x3, &m),
			 PBOX_DROP_NONE);
	assert_int_equal(sack_msg(PBOX_MSG_PULL, PBOX_F_SACK, 0, FRAG, 0x80, &m),
			 PBOX_DROP_BAD_ALIGNMENT);
	make_push(0, 7);
	hdr()->flags = htobe16(PBOX_F_LAST | PBOX_F_RETRANSMIT);
	assert_int_equal(validate(PBOX_WIRE_HDR_LEN + FRAG, &m), PBOX_DROP_NONE);
	hdr()->flags = htobe16(PBOX_F_SACK);
	assert_int_equal(validate(PBOX_WIRE_HDR_LEN + FRAG, &m), PBOX_DROP_BAD_FLAGS);

	/* Building a map: held 0, 1, 2, 4, and 70 (beyond the 64 the map covers). */
	pbox_bit_set(bits, 0);
	pbox_bit_set(bits, 1);
	pbox_bit_set(bits, 2);
	pbox_bit_set(bits, 4);
	pbox_bit_set(bits, 70);
	pbox_sack_build(bits, 100, &base, &map);
	assert_int_equal(base, 3);
	assert_int_equal(map, 0x2);
	assert_false(pbox_sack_has(base, map, 70)); /* not described: taken as missing */
	for (uint32_t i = 0; i < 100; i++) {
		pbox_bit_set(bits, i);
	}
	pbox_sack_build(bits, 100, &base, &map);
	assert_int_equal(base, 100);
	assert_int_equal(map, 0);
}

/* Random garbage never crashes and is never accepted. */
static void test_garbage(void **state)
{
	uint64_t x = 88172645463325252ull;
	unsigned accepted = 0;

	(void)state;
	for (int i = 0; i < 200000; i++) {
		struct pbox_msg m;
		size_t len;

		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		len = x % sizeof(g_pkt);
		for (size_t b = 0; b < len; b++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			g_pkt[b] = (uint8_t)x;
		}
		/* Half the time keep a valid prefix so deeper checks run. */
		if (i & 1 && len >= 8) {
			memcpy(g_pkt, "PBOX\x01\x01\x00\x00", 8);
		}
		accepted += validate(len, &m) == PBOX_DROP_NONE;
	}
	assert_int_equal(accepted, 0);
}

static void test_names(void **state)
{
	(void)state;
	for (int r = 0; r < PBOX_DROP_COUNT; r++) {
		assert_string_not_equal(pbox_drop_reason_name(r), "invalid");
	}
	assert_string_equal(pbox_drop_reason_name(PBOX_DROP_COUNT), "invalid");
	assert_string_equal(pbox_drop_reason_name(PBOX_DROP_BAD_COOKIE), "bad_cookie");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip),     cmocka_unit_test(test_truncated),
		cmocka_unit_test(test_header_fields), cmocka_unit_test(test_fragments),
		cmocka_unit_test(test_job_fields),    cmocka_unit_test(test_worker_role),
		cmocka_unit_test(test_garbage),       cmocka_unit_test(test_names),
		cmocka_unit_test(test_sack),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
