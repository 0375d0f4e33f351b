/* SPDX-License-Identifier: BSD-3-Clause */
/* Chunk map: 32 KB boundaries, tiny and huge keys, LPT balance and determinism. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/jobdesc.h"

#define KB32 (32u << 10)

static void test_boundaries(void **state)
{
	/* 8192 floats = exactly one 32 KB chunk; 8193 needs a second of 4 bytes. */
	struct pbox_keyspec keys[] = { { 10, 8192 }, { 11, 8193 }, { 12, 1 }, { 13, 3 * 8192 } };
	struct pbox_jobdesc d;
	char err[128];

	(void)state;
	assert_int_equal(pbox_jobdesc_build(&d, keys, 4, 2, 3, KB32, 8192, NULL, err, sizeof(err)),
			 0);
	assert_int_equal(d.nchunks, 1 + 2 + 1 + 3);
	assert_int_equal(d.chunks[0].bytes, KB32);
	assert_int_equal(d.chunks[1].bytes, KB32);
	assert_int_equal(d.chunks[2].bytes, 4);
	assert_int_equal(d.chunks[2].elem_off, 8192);
	assert_int_equal(d.chunks[3].bytes, 4);
	assert_int_equal(d.chunks[3].nfrags, 1);
	assert_int_equal(d.chunks[6].elem_off, 2 * 8192);
	assert_int_equal(d.chunks[0].nfrags, 4);
	assert_int_equal(d.keys[1].first_chunk, 1);
	assert_int_equal(d.keys[1].nchunks, 2);
	assert_int_equal(d.total_bytes, (8192 + 8193 + 1 + 3 * 8192) * 4ull);
	assert_int_equal(pbox_jobdesc_find_key(&d, 12), 2);
	assert_int_equal(pbox_jobdesc_find_key(&d, 9), -1);
	/* Every core's list is ascending and points back at the chunk. */
	for (uint32_t k = 0; k < d.ncores; k++) {
		for (uint32_t i = 0; i < d.core_nchunks[k]; i++) {
			uint32_t c = d.core_chunks[k][i];

			assert_int_equal(d.chunks[c].core, k);
			assert_int_equal(d.chunks[c].local, i);
			if (i > 0) {
				assert_true(d.core_chunks[k][i - 1] < c);
			}
		}
	}
	pbox_jobdesc_free(&d);
}

static void test_errors(void **state)
{
	struct pbox_keyspec dup[] = { { 1, 10 }, { 2, 10 }, { 1, 5 } };
	struct pbox_keyspec zero[] = { { 1, 0 } };
	struct pbox_jobdesc d;
	char err[128];

	(void)state;
	assert_int_equal(pbox_jobdesc_build(&d, dup, 3, 1, 1, KB32, 1024, NULL, err, sizeof(err)),
			 -EINVAL);
	assert_non_null(strstr(err, "key id 1 registered twice"));
	assert_int_equal(pbox_jobdesc_build(&d, zero, 1, 1, 1, KB32, 1024, NULL, err, sizeof(err)),
			 -EINVAL);
	assert_int_equal(pbox_jobdesc_build(&d, dup, 2, 1, 1, 100, 64, NULL, err, sizeof(err)),
			 -EINVAL); /* chunk not a multiple of 64 */
	assert_int_equal(pbox_jobdesc_build(&d, dup, 2, 1, 1, KB32, 100, NULL, err, sizeof(err)),
			 -EINVAL);
	assert_int_equal(pbox_jobdesc_build(&d, dup, 2, 0, 1, KB32, 1024, NULL, err, sizeof(err)),
			 -EINVAL);
	assert_int_equal(pbox_jobdesc_build(&d, dup, 2, 1, 0, KB32, 1024, NULL, err, sizeof(err)),
			 -EINVAL);
	/* 64 MiB chunks of 1 KiB fragments: 65536 fragments overflow the engine's counters. */
	assert_int_equal(
		pbox_jobdesc_build(&d, dup, 2, 1, 1, 64u << 20, 1024, NULL, err, sizeof(err)),
		-EINVAL);
	assert_non_null(strstr(err, "more than 32768 fragments per chunk"));
	assert_int_equal(
		pbox_jobdesc_build(&d, dup, 2, 1, 1, 64u << 20, 2048, NULL, err, sizeof(err)), 0);
	pbox_jobdesc_free(&d);
	{
		uint32_t map[2] = { 0, 5 };

		assert_int_equal(
			pbox_jobdesc_build(&d, dup, 2, 1, 2, KB32, 1024, map, err, sizeof(err)),
			-EINVAL);
		assert_non_null(strstr(err, "core 5"));
	}
}

static void test_huge_key(void **state)
{
	/* A 1 GiB key: 32768 chunks, all full size, spread evenly. */
	struct pbox_keyspec keys[] = { { 0, 1ull << 28 } };
	struct pbox_jobdesc d;
	char err[128];

	(void)state;
	assert_int_equal(pbox_jobdesc_build(&d, keys, 1, 8, 7, KB32, 1408 - 1408 % 64, NULL, err,
					    sizeof(err)),
			 0);
	assert_int_equal(d.nchunks, 32768);
	for (uint32_t k = 0; k < 7; k++) {
		assert_true(d.core_nchunks[k] == 32768 / 7 || d.core_nchunks[k] == 32768 / 7 + 1);
	}
	pbox_jobdesc_free(&d);
}

static uint64_t brute_opt(const uint64_t *s, uint32_t n, uint32_t m)
{
	uint32_t assign[12] = { 0 };
	uint64_t best = UINT64_MAX;

	for (;;) {
		uint64_t load[8] = { 0 }, mx = 0;
		uint32_t i;

		for (i = 0; i < n; i++) {
			load[assign[i]] += s[i];
		}
		for (i = 0; i < m; i++) {
			mx = load[i] > mx ? load[i] : mx;
		}
		best = mx < best ? mx : best;
		for (i = 0; i < n && ++assign[i] == m; i++) {
			assign[i] = 0;
		}
		if (i == n) {
			return best;
		}
	}
}

static void test_lpt_bound(void **state)
{
	uint64_t x = 12345;

	(void)state;
	for (int trial = 0; trial < 300; trial++) {
		uint64_t s[9], load[4];
		uint32_t bin[9], bin2[9], n = 4 + trial % 6, m = 2 + trial % 3;
		uint64_t mx = 0, opt;

		for (uint32_t i = 0; i < n; i++) {
			x = x * 6364136223846793005ull + 1442695040888963407ull;
			s[i] = 1 + (x >> 40) % 100;
		}
		assert_int_equal(pbox_lpt_partition(s, n, m, bin, load), 0);
		for (uint32_t b = 0; b < m; b++) {
			mx = load[b] > mx ? load[b] : mx;
		}
		opt = brute_opt(s, n, m);
		/* Graham: LPT <= (4/3 - 1/(3m)) OPT, i.e. 3m * LPT <= (4m - 1) * OPT. */
		assert_true(3 * m * mx <= (4 * m - 1) * opt);
		/* Deterministic. */
		assert_int_equal(pbox_lpt_partition(s, n, m, bin2, NULL), 0);
		assert_memory_equal(bin, bin2, n * sizeof(bin[0]));
	}
}

static void test_lpt_known(void **state)
{
	/* Graham's tight example for m = 2: {3,3,2,2,2}: LPT = 7, OPT = 6. */
	uint64_t s[] = { 3, 3, 2, 2, 2 }, load[2];
	uint32_t bin[5];

	(void)state;
	assert_int_equal(pbox_lpt_partition(s, 5, 2, bin, load), 0);
	assert_int_equal(bin[0], 0);
	assert_int_equal(bin[1], 1);
	assert_true((load[0] == 7 && load[1] == 5) || (load[0] == 5 && load[1] == 7));
}

static void test_model_balance(void **state)
{
	/* Mixed sizes like a CNN: the byte load per core stays within one chunk. */
	struct pbox_keyspec keys[64];
	struct pbox_jobdesc d, d2;
	char err[128];
	uint64_t mx = 0, mn = UINT64_MAX;

	(void)state;
	for (uint32_t i = 0; i < 64; i++) {
		keys[i].id = i;
		keys[i].nelem = (i % 3 == 0) ? 64 * (i + 1) : 9 * 9 * 64 * (i + 1);
	}
	assert_int_equal(pbox_jobdesc_build(&d, keys, 64, 4, 6, KB32, 8192, NULL, err, sizeof(err)),
			 0);
	assert_int_equal(
		pbox_jobdesc_build(&d2, keys, 64, 4, 6, KB32, 8192, NULL, err, sizeof(err)), 0);
	for (uint32_t k = 0; k < 6; k++) {
		mx = d.core_bytes[k] > mx ? d.core_bytes[k] : mx;
		mn = d.core_bytes[k] < mn ? d.core_bytes[k] : mn;
	}
	assert_true(mx - mn <= KB32);
	for (uint32_t c = 0; c < d.nchunks; c++) {
		assert_int_equal(d.chunks[c].core, d2.chunks[c].core);
	}
	pbox_jobdesc_free(&d);
	pbox_jobdesc_free(&d2);
}

static void test_frag_for_mtu(void **state)
{
	(void)state;
	assert_int_equal(pbox_frag_bytes_for_mtu(1500, KB32), 1408);
	assert_int_equal(pbox_frag_bytes_for_mtu(9000, KB32), 8896);
	assert_int_equal(pbox_frag_bytes_for_mtu(65535, KB32), KB32);
	assert_int_equal(pbox_frag_bytes_for_mtu(65535, 1u << 20), 65408);
	assert_int_equal(pbox_frag_bytes_for_mtu(100, KB32), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_boundaries),   cmocka_unit_test(test_errors),
		cmocka_unit_test(test_huge_key),     cmocka_unit_test(test_lpt_bound),
		cmocka_unit_test(test_lpt_known),    cmocka_unit_test(test_model_balance),
		cmocka_unit_test(test_frag_for_mtu),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
