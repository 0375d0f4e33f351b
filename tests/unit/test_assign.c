/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-ctrld's chunk -> core assignment (ctrlplane/ctrld/assign.h):
 *  - a job's chunks fill the cores the jobs placed before left emptiest (LPT on bytes
 *    from their loads), and over many random jobs the cores stay within one chunk of each
 *    other;
 *  - the same jobs in the same order give the same maps (deterministic);
 *  - the chunks are cut exactly as pboxd cuts them: pbox_jobdesc_build accepts every map
 *    and finds the same bytes per core;
 *  - a job without a fixed key set is not assigned; a pboxd's "appliance" object and a
 *    stored assignment are checked.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "assign.h"
#include "common/jobdesc.h"

static json_t *parse(const char *s)
{
	json_t *o = json_loads(s, 0, NULL);

	assert_non_null(o);
	return o;
}

static void cores(struct ctrld_cores *c, uint32_t n, uint32_t chunk_bytes)
{
	memset(c, 0, sizeof(*c));
	c->known = true;
	c->ncores = n;
	c->chunk_bytes = chunk_bytes;
}

static json_t *job(uint32_t id, const uint64_t *nelem, uint32_t nkeys)
{
	json_t *keys = json_array();

	for (uint32_t k = 0; k < nkeys; k++) {
		json_array_append_new(keys, json_pack("[i, I]", (int)k, (json_int_t)nelem[k]));
	}
	return json_pack("{s:i, s:s, s:i, s:o}", "id", (int)id, "token", "t", "workers", 2, "keys",
			 keys);
}

/* Job 1 (3 chunks) then job 2 (1 chunk) on 2 cores: job 2 goes where job 1 left room. */
static void test_across_jobs(void **state)
{
	struct ctrld_cores c;
	struct ctrld_core_load l1, l2;
	uint64_t base[PBOX_MAX_CORES] = { 0 };
	json_t *d1 = parse("{\"id\":1,\"token\":\"a\",\"workers\":2,\"keys\":[[100,24576]]}");
	json_t *d2 = parse("{\"id\":2,\"token\":\"b\",\"workers\":2,\"keys\":[[100,8192]]}");
	json_t *a1, *a2, *want;
	char err[256];

	(void)state;
	cores(&c, 2, 32768);
	assert_int_equal(ctrld_assign(&c, d1, base, &a1, &l1, err, sizeof(err)), 0);
	want = parse("{\"chunk_bytes\":32768,\"map\":[0,1,0]}");
	assert_true(json_equal(a1, want));
	json_decref(want);
	assert_true(l1.bytes[0] == 65536 && l1.bytes[1] == 32768);
	assert_true(l1.chunks[0] == 2 && l1.chunks[1] == 1);
	/* Alone (pboxd's own LPT would do this) job 2's chunk goes to core 0 ... */
	assert_int_equal(ctrld_assign(&c, d2, base, &a2, &l2, err, sizeof(err)), 0);
	assert_int_equal(json_integer_value(json_array_get(json_object_get(a2, "map"), 0)), 0);
	json_decref(a2);
	/* ... after job 1 to core 1. */
	base[0] = l1.bytes[0];
	base[1] = l1.bytes[1];
	assert_int_equal(ctrld_assign(&c, d2, base, &a2, &l2, err, sizeof(err)), 0);
	assert_int_equal(json_integer_value(json_array_get(json_object_get(a2, "map"), 0)), 1);
	assert_true(l2.bytes[0] == 0 && l2.bytes[1] == 32768);
	json_decref(a1);
	json_decref(a2);
	json_decref(d1);
	json_decref(d2);
}

/* Random jobs on 1..8 cores: within one chunk of balance after every job, the same maps
 * on a second run, and pboxd's geometry agrees with the per-core bytes. */
static void test_balanced_deterministic(void **state)
{
	char err[256];

	(void)state;
	srand(11);
	for (int round = 0; round < 40; round++) {
		uint32_t ncores = 1 + (uint32_t)(rand() % 8), njobs = 1 + (uint32_t)(rand() % 6);
		uint32_t chunk_bytes = 64u << (rand() % 6);
		uint64_t base[2][PBOX_MAX_CORES] = { { 0 } };
		json_t *descs[6], *maps[2][6];
		struct ctrld_cores c;

		cores(&c, ncores, chunk_bytes);
		for (uint32_t j = 0; j < njobs; j++) {
			uint64_t nelem[4];
			uint32_t nkeys = 1 + (uint32_t)(rand() % 4);

			for (uint32_t k = 0; k < nkeys; k++) {
				nelem[k] = 1 + (uint64_t)(rand() % 3000);
			}
			descs[j] = job(j, nelem, nkeys);
		}
		for (int run = 0; run < 2; run++) {
			for (uint32_t j = 0; j < njobs; j++) {
				struct ctrld_core_load l;
				uint64_t lo = UINT64_MAX, hi = 0;

				assert_int_equal(ctrld_assign(&c, descs[j], base[run],
							      &maps[run][j], &l, err, sizeof(err)),
						 0);
				for (uint32_t k = 0; k < ncores; k++) {
					base[run][k] += l.bytes[k];
					lo = base[run][k] < lo ? base[run][k] : lo;
					hi = base[run][k] > hi ? base[run][k] : hi;
				}
				/* LPT keeps the spread within the largest chunk. */
				assert_true(hi - lo <= chunk_bytes);
				if (run == 1) {
					assert_true(json_equal(maps[0][j], maps[1][j]));
				}
			}
		}
		for (uint32_t j = 0; j < njobs; j++) {
			const json_t *keys = json_object_get(descs[j], "keys"), *map, *kv;
			struct pbox_keyspec ks[4];
			struct pbox_jobdesc jd;
			struct ctrld_core_load l;
			uint32_t cm[4 * 3000];
			size_t i;

			json_array_foreach(keys, i, kv)
			{
				ks[i].id = (uint32_t)json_integer_value(json_array_get(kv, 0));
				ks[i].nelem = (uint64_t)json_integer_value(json_array_get(kv, 1));
			}
			map = json_object_get(maps[0][j], "map");
			json_array_foreach(map, i, kv)
			{
				cm[i] = (uint32_t)json_integer_value(kv);
			}
			assert_int_equal(
				pbox_jobdesc_build(&jd, ks, (uint32_t)json_array_size(keys), 2,
						   ncores, chunk_bytes, 64, cm, err, sizeof(err)),
				0);
			assert_int_equal(jd.nchunks, json_array_size(map));
			assert_int_equal(ctrld_assign_load(maps[0][j], descs[j], ncores, &l, err,
							   sizeof(err)),
					 0);
			for (uint32_t k = 0; k < ncores; k++) {
				assert_true(jd.core_bytes[k] == l.bytes[k]);
				assert_int_equal(jd.core_nchunks[k], l.chunks[k]);
			}
			pbox_jobdesc_free(&jd);
			json_decref(maps[0][j]);
			json_decref(maps[1][j]);
			json_decref(descs[j]);
		}
	}
}

static void test_refusals(void **state)
{
	struct ctrld_cores c;
	struct ctrld_core_load l;
	json_t *d = parse("{\"id\":3,\"token\":\"t\",\"workers\":2}"), *a = NULL, *app;
	json_t *k = parse("{\"id\":4,\"token\":\"t\",\"workers\":2,\"keys\":[[1,100]]}");
	char err[256];

	(void)state;
	cores(&c, 2, 32768);
	/* No fixed key set: pboxd assigns at register. */
	assert_int_equal(ctrld_assign(&c, d, NULL, &a, &l, err, sizeof(err)), 1);
	assert_null(a);
	/* Too many chunks for a map in a request line: pboxd assigns them too. */
	{
		json_t *big = parse("{\"id\":5,\"token\":\"t\",\"workers\":2,\"keys\":"
				    "[[1,536879104]]}");

		assert_int_equal(ctrld_assign(&c, big, NULL, &a, &l, err, sizeof(err)), 1);
		assert_null(a);
		json_decref(big);
		big = parse("{\"id\":5,\"token\":\"t\",\"workers\":2,\"keys\":"
			    "[[1,536870912]]}");
		assert_int_equal(ctrld_assign(&c, big, NULL, &a, &l, err, sizeof(err)), 0);
		assert_int_equal(json_array_size(json_object_get(a, "map")),
				 CTRLD_ASSIGN_MAX_CHUNKS);
		json_decref(a);
		json_decref(big);
	}
	c.known = false;
	assert_int_equal(ctrld_assign(&c, k, NULL, &a, &l, err, sizeof(err)), -EINVAL);
	/* A pboxd's description of its cores. */
	app = parse(
		"{\"ncores\":2,\"chunk_bytes\":32768,\"cores\":[{\"core\":0,\"cpu\":3,"
		"\"numa\":0,\"port\":7100},{\"core\":1,\"cpu\":-1,\"numa\":-1,\"port\":7101}]}");
	assert_int_equal(ctrld_cores_from_json(app, &c, err, sizeof(err)), 0);
	assert_true(c.known && c.ncores == 2 && c.cpu[0] == 3 && c.port[1] == 7101);
	json_object_set_new(app, "ncores", json_integer(3));
	assert_int_equal(ctrld_cores_from_json(app, &c, err, sizeof(err)), -EINVAL);
	assert_false(c.known);
	json_object_set_new(app, "ncores", json_integer(0));
	assert_int_equal(ctrld_cores_from_json(app, &c, err, sizeof(err)), -EINVAL);
	assert_int_equal(ctrld_cores_from_json(NULL, &c, err, sizeof(err)), -EINVAL);
	json_decref(app);
	/* A stored assignment that does not fit. */
	a = parse("{\"chunk_bytes\":32768,\"map\":[0,1]}");
	assert_int_equal(ctrld_assign_load(a, k, 2, &l, err, sizeof(err)), -EINVAL);
	json_decref(a);
	a = parse("{\"chunk_bytes\":32768,\"map\":[2]}");
	assert_int_equal(ctrld_assign_load(a, k, 2, &l, err, sizeof(err)), -EINVAL);
	assert_int_equal(ctrld_assign_load(a, k, 3, &l, err, sizeof(err)), 0);
	assert_true(l.bytes[2] == 400 && l.chunks[2] == 1);
	assert_int_equal(ctrld_assign_load(a, d, 3, &l, err, sizeof(err)), -EINVAL);
	json_decref(a);
	json_decref(d);
	json_decref(k);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_across_jobs),
		cmocka_unit_test(test_balanced_deterministic),
		cmocka_unit_test(test_refusals),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
