/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-ctrld's bandwidth matrix, the jobs' pairs (ctrlplane/ctrld/bw.h), without a
 * network: the pboxd it would ask is a closed local port, so every probe fails at once
 * and only the choice of pairs is looked at.
 *  - a job's entry (its ranks' probe agents, the pboxd's own) gives, per rank with an
 *    agent, pboxd -> rank and rank -> pboxd (asked of the rank: via_rank);
 *  - worker -> worker pairs follow the tree only once it was built on measured links;
 *  - a sweep that no longer names the job drops its pairs (configured pairs stay);
 *  - with jobs = false nothing is added.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bw.h"

/* The pairs of the matrix as "from>to" (+ "@rank" when asked of a worker), joined by ' '. */
static void pairs_of(struct ctrld_bw *b, char *out, size_t len)
{
	json_t *l = ctrld_bw_list(b), *p;
	size_t i, off = 0;

	out[0] = '\0';
	json_array_foreach(json_object_get(l, "pairs"), i, p)
	{
		const json_t *v = json_object_get(p, "via_rank");

		off += (size_t)snprintf(out + off, len - off, "%s%s>%s", off ? " " : "",
					json_string_value(json_object_get(p, "from")),
					json_string_value(json_object_get(p, "to")));
		if (v != NULL) {
			off += (size_t)snprintf(out + off, len - off, "@%lld",
						(long long)json_integer_value(v));
		}
	}
	json_decref(l);
}

static void config(struct ctrld_config *cfg, bool jobs, struct ctrld_bw_pair *fixed)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->npboxds = 1;
	snprintf(cfg->pboxds[0].name, sizeof(cfg->pboxds[0].name), "a");
	/* Port 1 on loopback: refused at once. */
	snprintf(cfg->pboxds[0].control, sizeof(cfg->pboxds[0].control), "127.0.0.1:1");
	cfg->request_timeout_ms = 500;
	cfg->bw.interval_s = 3600;
	cfg->bw.cap_bps = 1e8;
	cfg->bw.budget_s = 1;
	cfg->bw.jobs = jobs;
	memset(fixed, 0, sizeof(*fixed)); /* from_idx 0: pboxd "a" */
	snprintf(fixed->from, sizeof(fixed->from), "a");
	snprintf(fixed->to, sizeof(fixed->to), "10.0.0.9:1");
	cfg->bw.pairs = fixed;
	cfg->bw.npairs = 1;
}

static void test_job_pairs(void **state)
{
	(void)state;
	struct ctrld_config *cfg = calloc(1, sizeof(*cfg));
	struct ctrld_bw_pair fixed;
	struct ctrld_bw *b;
	char got[1024];
	json_t *entry = json_pack("{s:s, s:s, s:[{s:i, s:s}, {s:i, s:s}]}", "state", "active",
				  "probe", "10.0.0.1:9", "agents", "rank", 0, "probe", "10.0.0.2:5",
				  "rank", 2, "probe", "10.0.0.4:5");
	json_t *uniform =
		json_pack("{s:{s:[i, i, i], s:s}}", "tree", "parent", -1, 0, 0, "costs", "uniform");
	json_t *measured = json_pack("{s:{s:[i, i, i], s:s}}", "tree", "parent", -1, -1, 0, "costs",
				     "measured+tiers");

	config(cfg, true, &fixed);
	assert_int_equal(ctrld_bw_start(cfg, &b), 0);
	assert_non_null(b);
	ctrld_bw_jobs_begin(b);
	ctrld_bw_job(b, 0, 7, entry, uniform);
	ctrld_bw_jobs_end(b);
	pairs_of(b, got, sizeof(got));
	/* Rank 1 has no agent; the uniform tree's worker edges are not probed. */
	assert_string_equal(got, "a>10.0.0.9:1 a>10.0.0.2:5 10.0.0.2:5>10.0.0.1:9@0 "
				 "a>10.0.0.4:5 10.0.0.4:5>10.0.0.1:9@2");
	ctrld_bw_jobs_begin(b);
	ctrld_bw_job(b, 0, 7, entry, measured);
	ctrld_bw_jobs_end(b);
	pairs_of(b, got, sizeof(got));
	/* Rank 2's parent is rank 0: that edge is probed by rank 0. */
	assert_non_null(strstr(got, "10.0.0.2:5>10.0.0.4:5@0"));
	assert_non_null(strstr(got, "a>10.0.0.2:5"));
	/* A sweep without the job: only the configured pair is left. */
	ctrld_bw_jobs_begin(b);
	ctrld_bw_jobs_end(b);
	pairs_of(b, got, sizeof(got));
	assert_string_equal(got, "a>10.0.0.9:1");
	ctrld_bw_stop(b);
	/* jobs = false: the jobs' pairs are not added. */
	config(cfg, false, &fixed);
	assert_int_equal(ctrld_bw_start(cfg, &b), 0);
	ctrld_bw_jobs_begin(b);
	ctrld_bw_job(b, 0, 7, entry, measured);
	ctrld_bw_jobs_end(b);
	pairs_of(b, got, sizeof(got));
	assert_string_equal(got, "a>10.0.0.9:1");
	ctrld_bw_stop(b);
	json_decref(entry);
	json_decref(uniform);
	json_decref(measured);
	free(cfg);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_job_pairs),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
