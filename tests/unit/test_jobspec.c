/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Job descriptions (common/jobspec.h): JSON -> libconfig group (types, arrays vs lists,
 * 64-bit integers, every bound refused with the member's path), the way back, the
 * SETTING=VALUE words of `pbox job create`, and the job messages' decoder; and that a
 * description goes through pboxd's configuration-file validation (pboxd_job_cfg_from_json)
 * with the file's own error texts.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/jobspec.h"
#include "pboxd/config.h"

static json_t *parse(const char *s)
{
	json_t *o = json_loads(s, 0, NULL);

	assert_non_null(o);
	return o;
}

static void test_types(void **state)
{
	json_t *d = parse("{\"id\":5,\"token\":\"t\",\"keys\":[[0,5000000000],[1,10]],"
			  "\"window\":4,\"optimizer\":{\"lr\":0.5},\"deterministic\":true,"
			  "\"arr\":[1,2,3000000000],\"mixed\":[1,\"a\"]}");
	const config_setting_t *g, *k;
	char err[256];
	config_t lc;
	json_t *back;

	(void)state;
	config_init(&lc);
	assert_int_equal(
		pbox_jobspec_to_setting(d, config_root_setting(&lc), "job", err, sizeof(err)), 0);
	g = config_lookup(&lc, "job");
	assert_non_null(g);
	assert_int_equal(config_setting_type(config_setting_get_member(g, "id")), CONFIG_TYPE_INT);
	k = config_setting_get_member(g, "keys");
	assert_true(config_setting_is_list(k));
	assert_true(config_setting_is_array(config_setting_get_elem(k, 0)));
	assert_true(config_setting_get_int64_elem(config_setting_get_elem(k, 0), 1) ==
		    5000000000LL);
	/* An int array with one 64-bit value is an int64 array. */
	assert_int_equal(config_setting_type(
				 config_setting_get_elem(config_setting_get_member(g, "arr"), 0)),
			 CONFIG_TYPE_INT64);
	assert_true(config_setting_is_list(config_setting_get_member(g, "mixed")));
	assert_int_equal(config_setting_type(config_setting_get_member(g, "deterministic")),
			 CONFIG_TYPE_BOOL);
	back = pbox_jobspec_from_setting(g);
	assert_non_null(back);
	assert_true(json_equal(back, d));
	json_decref(back);
	config_destroy(&lc);
	json_decref(d);
}

static void test_refusals(void **state)
{
	static const struct {
		const char *json;
		const char *words;
	} bad[] = {
		{ "{\"id\":null}", "job.id: null" },
		{ "{\"9x\":1}", "job.9x: not a setting name" },
		{ "{\"a b\":1}", "not a setting name" },
		{ "{\"a\":{\"b\":{\"c\":{\"d\":1}}}}", "job.a.b.c.d: nested too deeply" },
		{ "{\"keys\":[[0,1],[1,null]]}", "job.keys[1][1]: null" },
	};
	char err[256];

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		json_t *d = parse(bad[i].json);
		config_t lc;

		config_init(&lc);
		assert_int_equal(pbox_jobspec_to_setting(d, config_root_setting(&lc), "job", err,
							 sizeof(err)),
				 -EINVAL);
		if (strstr(err, bad[i].words) == NULL) {
			fail_msg("%s: '%s' does not say '%s'", bad[i].json, err, bad[i].words);
		}
		/* Nothing half-built is left behind. */
		assert_null(config_lookup(&lc, "job"));
		config_destroy(&lc);
		json_decref(d);
	}
	{
		char big[PBOX_JOBSPEC_MAX_STRING + 32];
		json_t *d;
		config_t lc;

		memset(big, 'x', sizeof(big) - 1);
		big[sizeof(big) - 1] = '\0';
		d = json_pack("{s:s}", "token", big);
		config_init(&lc);
		assert_int_equal(pbox_jobspec_to_setting(d, config_root_setting(&lc), "job", err,
							 sizeof(err)),
				 -EINVAL);
		assert_non_null(strstr(err, "job.token"));
		config_destroy(&lc);
		json_decref(d);
	}
}

static void test_kv(void **state)
{
	json_t *d = json_object(), *want;
	char err[256];

	(void)state;
	assert_int_equal(pbox_jobspec_set_kv(d, "id=5", err, sizeof(err)), 0);
	assert_int_equal(pbox_jobspec_set_kv(d, "token=s3cret", err, sizeof(err)), 0);
	assert_int_equal(pbox_jobspec_set_kv(d, "optimizer.name=nag", err, sizeof(err)), 0);
	assert_int_equal(pbox_jobspec_set_kv(d, "optimizer.lr=0.25", err, sizeof(err)), 0);
	assert_int_equal(pbox_jobspec_set_kv(d, "deterministic=true", err, sizeof(err)), 0);
	assert_int_equal(pbox_jobspec_set_kv(d, "keys=0:784000,7:1000", err, sizeof(err)), 0);
	want = parse("{\"id\":5,\"token\":\"s3cret\",\"optimizer\":{\"name\":\"nag\",\"lr\":0.25},"
		     "\"deterministic\":true,\"keys\":[[0,784000],[7,1000]]}");
	assert_true(json_equal(d, want));
	json_decref(want);
	assert_int_equal(pbox_jobspec_set_kv(d, "workers", err, sizeof(err)), -EINVAL);
	assert_int_equal(pbox_jobspec_set_kv(d, "=2", err, sizeof(err)), -EINVAL);
	assert_int_equal(pbox_jobspec_set_kv(d, "keys=0:", err, sizeof(err)), -EINVAL);
	assert_int_equal(pbox_jobspec_set_kv(d, "keys=5", err, sizeof(err)), -EINVAL);
	assert_int_equal(pbox_jobspec_set_kv(d, "a..b=1", err, sizeof(err)), -EINVAL);
	assert_int_equal(pbox_jobspec_set_kv(d, "1x=1", err, sizeof(err)), -EINVAL);
	json_decref(d);
}

static void test_messages(void **state)
{
	struct pbox_jobmsg m;
	char err[256];
	json_t *desc = parse("{\"id\":3}"), *r;

	(void)state;
	r = pbox_jobmsg_create(desc, "tok");
	assert_int_equal(pbox_jobmsg_decode(r, &m, err, sizeof(err)), 0);
	assert_int_equal(m.op, PBOX_JOBMSG_CREATE);
	assert_true(json_equal(m.job, desc));
	assert_string_equal(m.admin_token, "tok");
	assert_null(m.plan);
	json_decref(r);
	r = pbox_jobmsg_rm(4294967295u, NULL);
	assert_int_equal(pbox_jobmsg_decode(r, &m, err, sizeof(err)), 0);
	assert_int_equal(m.op, PBOX_JOBMSG_RM);
	assert_true(m.id == 4294967295u);
	assert_null(m.admin_token);
	json_decref(r);
	r = pbox_jobmsg_list(NULL);
	assert_int_equal(pbox_jobmsg_decode(r, &m, err, sizeof(err)), 0);
	assert_int_equal(m.op, PBOX_JOBMSG_LIST);
	json_decref(r);
	{
		json_t *plan = parse("{\"tree\":{\"revision\":12,\"parent\":[-1]},"
				     "\"thresholds\":null}");

		r = pbox_jobmsg_plan(6, plan, "tok");
		assert_int_equal(pbox_jobmsg_decode(r, &m, err, sizeof(err)), 0);
		assert_int_equal(m.op, PBOX_JOBMSG_PLAN);
		assert_true(m.id == 6);
		assert_true(json_equal(m.plan, plan));
		assert_string_equal(m.admin_token, "tok");
		assert_true(pbox_jobspec_plan_revision(m.plan) == 12);
		json_decref(r);
		json_decref(plan);
		plan = parse("{\"thresholds\":{}}");
		assert_true(pbox_jobspec_plan_revision(plan) == 0);
		json_decref(plan);
	}
	static const char *const bad[] = {
		"{\"op\":\"job_plan\",\"id\":1}",
		"{\"op\":\"job_plan\",\"plan\":{}}",
		"{\"op\":\"job_plan\",\"id\":1,\"plan\":[]}",
		"{\"op\":\"job_plan\",\"id\":1,\"plan\":{\"route\":{}}}",
		"{\"op\":\"job_plan\",\"id\":1,\"plan\":{\"tree\":{\"revision\":-1}}}",
		"{\"op\":\"job_plan\",\"id\":1,\"plan\":{\"tree\":{\"revision\":1.5}}}",
		"{\"op\":\"job_create\",\"job\":{},\"plan\":{\"tree\":{\"revision\":\"1\"}}}",
		"{\"op\":\"job_create\"}",
		"{\"op\":\"job_create\",\"job\":[1]}",
		"{\"op\":\"job_create\",\"job\":{},\"plan\":{\"route\":{}}}",
		"{\"op\":\"job_create\",\"job\":{},\"plan\":{\"tree\":[1]}}",
		"{\"op\":\"job_create\",\"job\":{},\"assignment\":[0]}",
		"{\"op\":\"job_create\",\"job\":{},\"assignment\":{\"map\":[0]}}",
		"{\"op\":\"job_create\",\"job\":{},\"assignment\":{\"chunk_bytes\":32,"
		"\"map\":[0]}}",
		"{\"op\":\"job_create\",\"job\":{},\"assignment\":{\"chunk_bytes\":32768,"
		"\"map\":[]}}",
		"{\"op\":\"job_create\",\"job\":{},\"assignment\":{\"chunk_bytes\":32768,"
		"\"map\":[64]}}",
		"{\"op\":\"job_create\",\"job\":{},\"assignment\":{\"chunk_bytes\":32768,"
		"\"map\":[-1]}}",
		"{\"op\":\"job_create\",\"job\":{},\"assignment\":{\"chunk_bytes\":32768,"
		"\"map\":[0.5]}}",
		"{\"op\":\"job_create\",\"job\":{},\"assignment\":{\"chunk_bytes\":32768,"
		"\"map\":[0],\"cores\":2}}",
		"{\"op\":\"job_rm\",\"id\":-1}",
		"{\"op\":\"job_rm\",\"id\":4294967296}",
		"{\"op\":\"job_rm\",\"id\":\"1\"}",
		"{\"op\":\"job_list\",\"admin_token\":1}",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		r = parse(bad[i]);
		err[0] = '\0';
		assert_int_equal(pbox_jobmsg_decode(r, &m, err, sizeof(err)), -EINVAL);
		assert_true(err[0] != '\0');
		json_decref(r);
	}
	r = parse("{\"op\":\"job_create\",\"job\":{},\"assignment\":{\"chunk_bytes\":"
		  "32768,\"map\":[0,63]}}");
	assert_int_equal(pbox_jobmsg_decode(r, &m, err, sizeof(err)), 0);
	assert_int_equal(json_array_size(json_object_get(m.assignment, "map")), 2);
	json_decref(r);
	r = parse("{\"op\":\"hello\"}");
	assert_int_equal(pbox_jobmsg_decode(r, &m, err, sizeof(err)), -ENOENT);
	json_decref(r);
	json_decref(desc);
}

/* A description is validated exactly as a configuration file's job. */
static void test_pboxd_validation(void **state)
{
	struct pboxd_config cfg;
	struct pboxd_job_cfg j;
	char err[512];
	json_t *d;

	(void)state;
	pboxd_config_defaults(&cfg);
	d = parse("{\"id\":7,\"token\":\"t\",\"workers\":3,\"mode\":\"server-optimizer\","
		  "\"optimizer\":{\"name\":\"nag\",\"lr\":0.1},\"sync\":{\"model\":\"ssp\","
		  "\"staleness\":2},\"keys\":[[0,100],[1,5000000000]],\"memory_budget\":\"4G\"}");
	assert_int_equal(pboxd_job_cfg_from_json(&cfg, d, &j, err, sizeof(err)), 0);
	assert_int_equal(j.id, 7);
	assert_int_equal(j.workers, 3);
	assert_int_equal(j.mode, PBOX_MODE_SERVER_OPT);
	assert_int_equal(j.nkeys, 2);
	assert_true(j.keys[1].nelem == 5000000000ULL);
	assert_true(j.memory_budget == (4ULL << 30));
	assert_string_equal(j.sync->name, "ssp");
	pboxd_job_cfg_free(&j);
	json_decref(d);
	d = parse("{\"id\":7,\"token\":\"t\",\"workers\":2,\"sync\":{\"model\":\"ssp\"}}");
	assert_int_equal(pboxd_job_cfg_from_json(&cfg, d, &j, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "job description: job: sync model 'ssp' needs mode = "
				    "\"server-optimizer\""));
	assert_null(j.keys);
	json_decref(d);
	d = parse("{\"id\":7,\"token\":\"t\",\"workers\":2,\"keys\":[[0,0]]}");
	assert_int_equal(pboxd_job_cfg_from_json(&cfg, d, &j, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "job.keys[0]: id must be 0..2^32-1 and elements 1..2^40"));
	json_decref(d);
	pboxd_config_free(&cfg);
}

/* pboxd checks a control plane's chunk -> core map against its cores and the key set. */
static void test_pboxd_assignment(void **state)
{
	static const struct {
		const char *a, *words;
	} bad[] = {
		{ "{\"chunk_bytes\":32768,\"map\":[0,2,1]}",
		  "chunk 1 on core 2; this pboxd has 2" },
		{ "{\"chunk_bytes\":32768,\"map\":[0,1]}", "places 2 chunks; the key set has 3" },
		{ "{\"chunk_bytes\":32768,\"map\":[0,1,0,1]}", "places 4 chunks" },
		{ "{\"chunk_bytes\":16384,\"map\":[0,1,0,1,0,1]}", "chunks of 16384 bytes" },
	};
	struct pboxd_config cfg;
	struct pboxd_job_cfg j;
	char err[512];
	json_t *d, *a;

	(void)state;
	pboxd_config_defaults(&cfg);
	cfg.ncores = 2;
	/* One key of 24576 elements: 3 chunks of 32768 bytes. */
	d = parse("{\"id\":7,\"token\":\"t\",\"workers\":2,\"keys\":[[5,24576]]}");
	assert_int_equal(pboxd_job_cfg_from_json(&cfg, d, &j, err, sizeof(err)), 0);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		a = parse(bad[i].a);
		err[0] = '\0';
		assert_int_equal(pboxd_job_cfg_set_assignment(&cfg, &j, a, err, sizeof(err)),
				 -EINVAL);
		assert_non_null(strstr(err, bad[i].words));
		assert_null(j.core_map);
		json_decref(a);
	}
	a = parse("{\"chunk_bytes\":32768,\"map\":[1,1,0]}");
	assert_int_equal(pboxd_job_cfg_set_assignment(&cfg, &j, a, err, sizeof(err)), 0);
	assert_int_equal(j.ncore_map, 3);
	assert_int_equal(j.core_map[0], 1);
	assert_int_equal(j.core_map[2], 0);
	json_decref(a);
	pboxd_job_cfg_free(&j);
	json_decref(d);
	/* Without a fixed key set there is nothing to map yet. */
	d = parse("{\"id\":8,\"token\":\"t\",\"workers\":2}");
	assert_int_equal(pboxd_job_cfg_from_json(&cfg, d, &j, err, sizeof(err)), 0);
	a = parse("{\"chunk_bytes\":32768,\"map\":[0]}");
	assert_int_equal(pboxd_job_cfg_set_assignment(&cfg, &j, a, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "needs a fixed key set"));
	json_decref(a);
	pboxd_job_cfg_free(&j);
	json_decref(d);
	pboxd_config_free(&cfg);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_types),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_kv),
		cmocka_unit_test(test_messages),
		cmocka_unit_test(test_pboxd_validation),
		cmocka_unit_test(test_pboxd_assignment),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
