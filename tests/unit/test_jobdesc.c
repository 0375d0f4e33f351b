/* SPDX-License-Identifier: BSD-3-Clause */
/* Chunk map: 32 KB boundaries, tiny and huge keys, LPT balance and determinism. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <cmocka.h>

#include "common/jobdesc.h"
#include "engine/job.h"

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

/* 64-bit geometry: a key of 2^40 elements in 1 KiB chunks needs 2^32 chunks. Counted in
 * 32 bits that is 0 (the old code then built a job with no chunk for it); it must be
 * refused, naming the numbers, before anything is allocated. */
static void test_geometry_64bit(void **state)
{
	struct pbox_keyspec big[] = { { 5, UINT64_C(1) << 40 } };
	struct pbox_keyspec two[] = { { 1, 100 }, { 5, UINT64_C(1) << 40 } };
	struct pbox_keyspec edge[] = { { 0, UINT64_C(1) << 32 } }; /* 2^24 chunks of 1 KiB */
	struct pbox_keyspec over[] = { { 0, (UINT64_C(1) << 32) + 1 } };
	struct pbox_jobdesc d;
	uint64_t n = 0;
	char err[256];

	(void)state;
	assert_int_equal(pbox_jobdesc_count_chunks(big, 1, 1024, &n, err, sizeof(err)), -E2BIG);
	assert_non_null(strstr(err, "4294967296 or more chunks of 1024 bytes"));
	assert_non_null(strstr(err, "key 5"));
	assert_non_null(strstr(err, "at most 16777216 chunks"));
	assert_int_equal(pbox_jobdesc_build(&d, big, 1, 2, 2, 1024, 1024, NULL, err, sizeof(err)),
			 -E2BIG);
	assert_int_equal(d.nchunks, 0);
	assert_int_equal(pbox_jobdesc_build(&d, two, 2, 2, 2, 1024, 1024, NULL, err, sizeof(err)),
			 -E2BIG);
	assert_non_null(strstr(err, "key 5"));
	/* The limit itself is allowed, one more chunk is not (counted, not built: 2^24
	 * chunk descriptors would take 640 MiB). */
	assert_int_equal(pbox_jobdesc_count_chunks(edge, 1, 1024, &n, err, sizeof(err)), 0);
	assert_int_equal(n, PBOX_MAX_CHUNKS);
	assert_int_equal(pbox_jobdesc_count_chunks(over, 1, 1024, &n, err, sizeof(err)), -E2BIG);
	/* 2^40 elements in 64 MiB chunks: 65536 chunks, the last key byte in the last one. */
	assert_int_equal(pbox_jobdesc_count_chunks(big, 1, 64u << 20, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 65536);
	assert_int_equal(
		pbox_jobdesc_build(&d, big, 1, 1, 3, 64u << 20, 8192, NULL, err, sizeof(err)), 0);
	assert_int_equal(d.nchunks, 65536);
	assert_int_equal(d.keys[0].nchunks, 65536);
	assert_int_equal(d.total_bytes, UINT64_C(1) << 42);
	assert_int_equal(d.chunks[65535].elem_off, UINT64_C(65535) << 24);
	assert_int_equal(d.chunks[65535].bytes, 64u << 20);
	pbox_jobdesc_free(&d);
}

static uint64_t rss_bytes(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	unsigned long long kb = 0;

	assert_non_null(f);
	while (fgets(line, sizeof(line), f) != NULL) {
		if (sscanf(line, "VmRSS: %llu kB", &kb) == 1) {
			break;
		}
	}
	fclose(f);
	return (uint64_t)kb * 1024;
}

static bool inside(const struct pbox_core_job *cj, const void *p, uint64_t bytes)
{
	const char *a = cj->arena, *q = p;

	return q >= a && q + bytes <= a + cj->arena_bytes;
}

/* Inside the core's results' arena (pbox_result_ops), or its arena when it has none. */
static bool inside_res(const struct pbox_core_job *cj, const void *p, uint64_t bytes)
{
	const char *a = cj->res_arena, *q = p;

	return a == NULL ? inside(cj, p, bytes) : q >= a && q + bytes <= a + cj->res_bytes;
}

/* A results' allocator for the test: anonymous memory, counted. */
static unsigned g_res_live;

static int t_res_alloc(void *ctx, size_t bytes, uint32_t job, uint32_t core, void **p, int *handle)
{
	(void)ctx;
	(void)job;
	*p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (*p == MAP_FAILED) {
		return -errno;
	}
	*handle = (int)(1000 + core);
	g_res_live++;
	return 0;
}

static void t_res_free(void *ctx, void *p, size_t bytes, int handle)
{
	(void)ctx;
	assert_true(handle >= 1000);
	munmap(p, bytes);
	g_res_live--;
}

static const struct pbox_result_ops t_res_ops = { t_res_alloc, t_res_free, NULL };

/* Every piece of every chunk lies inside its core's arena (a sizing pass that counted
 * less than the carving pass uses would fail here). */
static void check_layout(const struct pbox_job *job, const struct pbox_job_state *st)
{
	const struct pbox_jobdesc *d = job->wire.desc;

	for (uint32_t k = 0; k < st->ncores; k++) {
		const struct pbox_core_job *cj = &st->core[k];

		for (uint32_t i = 0; i < cj->nchunks; i++) {
			const struct pbox_chunk_state *cs = &cj->chunks[i];
			uint32_t b = d->chunks[cs->id].bytes;

			assert_int_equal(d->chunks[cs->id].core, k);
			if (job->mode == PBOX_MODE_SERVER_OPT) {
				assert_true(inside_res(cj, cs->model[0], b));
				assert_true(inside_res(cj, cs->model[1], b));
				assert_true(job->opt->nstate < 2 || inside(cj, cs->s1, b));
			}
			assert_true(inside(cj, cs->pull_want, 4));
			for (uint32_t s = 0; s < job->window; s++) {
				const struct pbox_slot *sl = &cs->slot[s];

				assert_true(inside_res(cj, sl->acc, b));
				if (cj->res_arena != NULL) {
					/* Its generation line right before it. */
					const struct pbox_res_line *l =
						(const void *)((const char *)sl->acc - sizeof(*l));

					assert_ptr_equal(sl->acc_gen, &l->gen);
					assert_true(l->magic == PBOX_RES_MAGIC);
				} else {
					assert_null(sl->acc_gen);
				}
				assert_true(inside(cj, sl->done, 8));
				assert_true(inside(cj, sl->bits, 8));
				for (uint32_t w = 0; job->deterministic && w < d->nworkers; w++) {
					assert_true(inside(cj, sl->stage[w], b));
				}
			}
		}
	}
}

/* pbox_job_state_bytes (what the budget charges, computed before allocation) is exactly
 * what pbox_job_state_create maps, for every layout option; the lower bound from the keys
 * alone is below it; and the memory is really there (RSS grows by that much). */
static void state_bytes(bool res)
{
	static const struct {
		enum pbox_job_mode mode;
		const char *opt;
		bool det;
		uint32_t window, workers, cores;
		enum pbox_sync_model sync;
	} cases[] = {
		{ PBOX_MODE_AGGREGATE, "sgd", false, 2, 3, 2, PBOX_SYNC_BSP },
		{ PBOX_MODE_SERVER_OPT, "nag", false, 2, 3, 1, PBOX_SYNC_BSP },
		{ PBOX_MODE_SERVER_OPT, "adam", true, 4, 5, 3, PBOX_SYNC_BSP },
		{ PBOX_MODE_SERVER_OPT, "sgd", false, 8, 70, 2, PBOX_SYNC_DROP_STRAGGLERS },
		{ PBOX_MODE_AGGREGATE, "sgd", true, 3, 129, 4, PBOX_SYNC_BSP },
	};
	/* Full chunks, short last chunks, a one-element key. */
	struct pbox_keyspec keys[] = { { 0, 784 * 256 }, { 1, 256 }, { 2, 1 }, { 3, 100003 } };

	pbox_job_set_result_ops(res ? &t_res_ops : NULL);
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		struct pbox_jobdesc d;
		struct pbox_job job = { 0 };
		struct pbox_job_state *st;
		uint64_t want, lower, got, rss0, rss1;
		char err[128];

		assert_int_equal(pbox_jobdesc_build(&d, keys, 4, cases[c].workers, cases[c].cores,
						    KB32, 1408 - 1408 % 64, NULL, err, sizeof(err)),
				 0);
		job.wire.desc = &d;
		job.mode = cases[c].mode;
		job.opt = pbox_optimizer_find(cases[c].opt);
		job.deterministic = cases[c].det;
		job.window = cases[c].window;
		job.sync = pbox_sync_ops(cases[c].sync);
		assert_non_null(job.opt);
		want = pbox_job_state_bytes(&job);
		lower = pbox_job_state_bytes_min(&job, keys, 4, cases[c].workers, KB32,
						 1408 - 1408 % 64);
		assert_true(lower <= want);
		/* The lower bound misses only per-core headers (the chunk table) and page
		 * rounding; with results' arenas, a second page rounding per core and the
		 * generation line of every result buffer (window + 2 per chunk at most). */
		assert_true(
			want - lower <
			cases[c].cores * (8192 + cases[c].workers * 64 + 4096) +
				(uint64_t)d.nchunks * sizeof(struct pbox_chunk_state) +
				(res ? cases[c].cores * 4096 +
						 (uint64_t)d.nchunks * (cases[c].window + 2) * 64
				     : 0));
		rss0 = rss_bytes();
		st = pbox_job_state_create(&job);
		assert_non_null(st);
		rss1 = rss_bytes();
		got = ((sizeof(*st) + st->ncores * sizeof(st->core[0]) + 63) / 64) * 64;
		for (uint32_t k = 0; k < st->ncores; k++) {
			got += st->core[k].arena_bytes + st->core[k].res_bytes;
			assert_int_equal(st->core[k].arena_bytes + st->core[k].res_bytes,
					 pbox_job_state_core_bytes(&job, k));
			/* The results' arena is the result buffers only: window accumulators
			 * (and two model versions per server-optimizer chunk), and the rest
			 * stays in the arena. */
			assert_int_equal(st->core[k].res_arena != NULL, res);
			assert_int_equal(st->core[k].res_handle, res ? (int)(1000 + k) : -1);
		}
		assert_true(!res || g_res_live == st->ncores);
		assert_int_equal(got, want);
		/* MAP_POPULATE: the arenas are resident (a few pages of slack for the rest;
		 * the test's results' arenas are not populated). */
		if (!res) {
			assert_true(rss1 - rss0 + 65536 >= want - 4096 * st->ncores);
		}
		check_layout(&job, st);
		pbox_job_state_free(st);
		assert_int_equal(g_res_live, 0);
		pbox_jobdesc_free(&d);
	}
	pbox_job_set_result_ops(NULL);
}

static void test_state_bytes(void **state)
{
	(void)state;
	state_bytes(false);
}

/* The same with results' arenas (pbox_result_ops): exact sizes, every result buffer in
 * the results' arena and nothing else there, freed with the state. */
static void test_state_bytes_results(void **state)
{
	(void)state;
	state_bytes(true);
}

/* A core that owns none of a job's chunks still gets a results' arena (a page): every
 * shm worker maps one per core. (A zero-byte arena could not be created: the job's
 * state was refused.) */
static void test_state_results_empty_core(void **state)
{
	struct pbox_keyspec keys[] = { { 0, 10 } };
	struct pbox_jobdesc d;
	struct pbox_job job = { 0 };
	struct pbox_job_state *st;
	char err[128];

	(void)state;
	pbox_job_set_result_ops(&t_res_ops);
	assert_int_equal(pbox_jobdesc_build(&d, keys, 1, 2, 2, KB32, 1408 - 1408 % 64, NULL, err,
					    sizeof(err)),
			 0);
	job.wire.desc = &d;
	job.mode = PBOX_MODE_AGGREGATE;
	job.opt = pbox_optimizer_find("sgd");
	job.window = 2;
	job.sync = pbox_sync_ops(PBOX_SYNC_BSP);
	st = pbox_job_state_create(&job);
	assert_non_null(st);
	for (uint32_t k = 0; k < 2; k++) {
		assert_non_null(st->core[k].res_arena);
		assert_true(st->core[k].res_bytes >= 4096);
	}
	assert_true(st->core[0].nchunks == 0 || st->core[1].nchunks == 0);
	pbox_job_state_free(st);
	assert_int_equal(g_res_live, 0);
	pbox_jobdesc_free(&d);
	pbox_job_set_result_ops(NULL);
}

/* Sizing a hostile geometry saturates instead of wrapping, and is fast: 2^24 chunks of
 * 64 MiB in deterministic mode with 1024 workers and a window of 64 is ~2^72 bytes. */
static void test_state_bytes_saturate(void **state)
{
	struct pbox_keyspec keys[256];
	struct pbox_job job = { 0 };

	(void)state;
	for (uint32_t i = 0; i < 256; i++) {
		keys[i].id = i;
		keys[i].nelem = UINT64_C(1) << 40;
	}
	job.mode = PBOX_MODE_SERVER_OPT;
	job.opt = pbox_optimizer_find("adam");
	job.deterministic = true;
	job.window = PBOX_MAX_WINDOW;
	job.sync = pbox_sync_ops(PBOX_SYNC_BSP);
	assert_int_equal(pbox_job_state_bytes_min(&job, keys, 256, 1024, 64u << 20, 8192),
			 UINT64_MAX);
	/* One key of that size alone: 65536 chunks x (64 slots x 1025 copies + 4) x 64 MiB
	 * = 2^16 x 65604 x 2^26 bytes, about 2^58.0: no saturation yet, and no wrap. */
	{
		uint64_t b = pbox_job_state_bytes_min(&job, keys, 1, 1024, 64u << 20, 8192);

		assert_true(b > (UINT64_C(65604) << 42) && b < (UINT64_C(65700) << 42));
	}
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
		cmocka_unit_test(test_boundaries),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_huge_key),
		cmocka_unit_test(test_lpt_bound),
		cmocka_unit_test(test_lpt_known),
		cmocka_unit_test(test_model_balance),
		cmocka_unit_test(test_frag_for_mtu),
		cmocka_unit_test(test_geometry_64bit),
		cmocka_unit_test(test_state_bytes),
		cmocka_unit_test(test_state_bytes_saturate),
		cmocka_unit_test(test_state_bytes_results),
		cmocka_unit_test(test_state_results_empty_core),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
