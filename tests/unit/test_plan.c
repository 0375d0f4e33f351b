/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-ctrld's job plans (ctrlplane/ctrld/plan.h) on synthetic bandwidth matrices:
 *  - link states: sufficient from min_rate*(1+h), insufficient below min_rate*(1-h), inside
 *    the band the previous state stays (without one: against min_rate); unmeasured ranks
 *    are unknown and push with delta_low; one insufficient rank turns the broadcast to
 *    delta_up;
 *  - an unchanged matrix gives back the previous plan itself; a change of state gives a new
 *    revision; the tree is valid for the placement;
 *  - placements of the wrong length or with unknown hosts are refused, and a job larger
 *    than degree and depth allow is -ENOSPC;
 *  - with the ranks' own probe agents (the pboxd's job entry): both directions are read,
 *    a rank's link is the lower, an unconverged estimate counts as its r_min, a measured
 *    worker -> worker edge costs 1e9 / its bandwidth; PHub's rule recommends a hierarchy
 *    across racks exactly when the core is the bottleneck.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>
#include <stdbool.h>

#include "plan.h"

static struct ctrld_plan_host g_hosts[] = {
	{ .name = "a", .edge = 0, .agg = 0 },
	{ .name = "w0", .addr = "10.0.0.2:1", .edge = 0, .agg = 0 },
	{ .name = "w1", .addr = "10.0.0.3:1", .edge = 1, .agg = 0 },
	{ .name = "w2", .edge = 2, .agg = 1 },
};

static void cfg(struct ctrld_plan_cfg *pc)
{
	ctrld_plan_defaults(pc);
	pc->hosts = g_hosts;
	pc->nhosts = 4;
	pc->min_rate_bps = 50e6;
	pc->hysteresis = 0.1;
}

/* A bw_list answer with pboxd a's estimates to w0 (bps0) and w1 (bps1); 0: no estimate. */
static json_t *matrix(double bps0, double bps1)
{
	json_t *pairs = json_array();
	double b[2] = { bps0, bps1 };
	const char *to[2] = { "10.0.0.2:1", "10.0.0.3:1" };

	for (int i = 0; i < 2; i++) {
		json_t *p = json_pack("{s:s, s:s, s:I}", "from", "a", "to", to[i], "probes", 1);

		if (b[i] > 0) {
			json_object_set_new(p, "estimate",
					    json_pack("{s:f, s:f}", "r_min_bps", b[i] * 0.99,
						      "r_max_bps", b[i] * 1.01));
		}
		json_array_append_new(pairs, p);
	}
	return json_pack("{s:b, s:o}", "ok", 1, "pairs", pairs);
}

static const char *link_of(const json_t *plan, size_t rank)
{
	return json_string_value(json_object_get(
		json_array_get(json_object_get(json_object_get(plan, "thresholds"), "workers"),
			       rank),
		"link"));
}

static const char *broadcast(const json_t *plan)
{
	return json_string_value(json_object_get(
		json_object_get(json_object_get(plan, "thresholds"), "broadcast"), "select"));
}

static json_int_t revision(const json_t *plan)
{
	return json_integer_value(json_object_get(json_object_get(plan, "tree"), "revision"));
}

/* Compute with matrix (bps0, bps1) from prev (its reference is consumed). */
static json_t *step(const struct ctrld_plan_cfg *pc, const json_t *pl, double bps0, double bps1,
		    json_t *prev)
{
	json_t *bw = matrix(bps0, bps1), *out = NULL;
	char err[256];

	assert_int_equal(ctrld_plan_compute(pc, "a", 3, pl, bw, NULL, prev, &out, err, sizeof(err)),
			 0);
	json_decref(bw);
	json_decref(prev);
	return out;
}

static void test_links_and_hysteresis(void **state)
{
	(void)state;
	struct ctrld_plan_cfg pc;
	json_t *pl = json_pack("[s, s, s]", "w0", "w1", "w2"), *p, *q;
	const json_t *parent;

	cfg(&pc);
	p = step(&pc, pl, 100e6, 52e6, NULL); /* no previous state: 52 >= 50 */
	assert_string_equal(link_of(p, 0), "sufficient");
	assert_string_equal(link_of(p, 1), "sufficient");
	assert_string_equal(link_of(p, 2), "unknown");
	assert_string_equal(broadcast(p), "delta_low");
	assert_int_equal(revision(p), 1);
	parent = json_object_get(json_object_get(p, "tree"), "parent");
	assert_int_equal(json_array_size(parent), 3);
	for (size_t r = 0; r < 3; r++) {
		json_int_t v = json_integer_value(json_array_get(parent, r));

		assert_true(v >= -1 && v < 3 && v != (json_int_t)r);
	}
	/* Inside the band (45..55): states stay; nothing changed, the same plan comes back. */
	q = step(&pc, pl, 100e6, 46e6, json_incref(p));
	assert_ptr_equal(q, p);
	json_decref(q);
	/* Below the band: insufficient, the broadcast goes to delta_up, a new revision. */
	q = step(&pc, pl, 100e6, 40e6, json_incref(p));
	assert_ptr_not_equal(q, p);
	assert_string_equal(link_of(q, 1), "insufficient");
	assert_string_equal(
		json_string_value(json_object_get(
			json_array_get(json_object_get(json_object_get(q, "thresholds"), "workers"),
				       1),
			"push")),
		"delta_up");
	assert_string_equal(broadcast(q), "delta_up");
	assert_int_equal(revision(q), 2);
	json_decref(p);
	/* Back inside the band: stays insufficient; above it: sufficient again. */
	p = step(&pc, pl, 100e6, 54e6, json_incref(q));
	assert_ptr_equal(p, q);
	json_decref(p);
	p = step(&pc, pl, 100e6, 56e6, q);
	assert_string_equal(link_of(p, 1), "sufficient");
	assert_string_equal(broadcast(p), "delta_low");
	json_decref(p);
	/* No previous state inside the band: against min_rate itself. */
	p = step(&pc, pl, 48e6, 0, NULL);
	assert_string_equal(link_of(p, 0), "insufficient");
	assert_string_equal(link_of(p, 1), "unknown");
	json_decref(p);
	json_decref(pl);
}

/* A matrix entry from -> to with [lo, hi], converged or not. */
static void entry(json_t *pairs, const char *from, const char *to, double lo, double hi, bool conv)
{
	json_array_append_new(pairs,
			      json_pack("{s:s, s:s, s:I, s:{s:f, s:f, s:[s]}}", "from", from, "to",
					to, "probes", 1, "estimate", "r_min_bps", lo, "r_max_bps",
					hi, "flags", conv ? "converged" : "budget"));
}

static double wnum(const json_t *plan, size_t rank, const char *name)
{
	return json_number_value(json_object_get(
		json_array_get(json_object_get(json_object_get(plan, "thresholds"), "workers"),
			       rank),
		name));
}

static void test_agents_and_phub(void **state)
{
	(void)state;
	struct ctrld_plan_cfg pc;
	json_t *pairs = json_array(), *bw, *ag, *out = NULL, *ph;
	json_t *pl = json_pack("[s, s, s]", "w0", "w1", "w2");
	char err[256];

	cfg(&pc);
	ag = json_pack("{s:s, s:[{s:i, s:s}, {s:i, s:s}, {s:i, s:s}]}", "probe", "10.0.0.1:9",
		       "agents", "rank", 0, "probe", "10.0.0.2:5", "rank", 1, "probe", "10.0.0.3:5",
		       "rank", 2, "probe", "10.0.0.4:5");
	entry(pairs, "a", "10.0.0.2:5", 99e6, 101e6, true);         /* down 100 */
	entry(pairs, "10.0.0.2:5", "10.0.0.1:9", 39e6, 41e6, true); /* up 40: the link */
	entry(pairs, "a", "10.0.0.3:5", 60e6, 300e6, false);        /* unconverged: 60 */
	entry(pairs, "10.0.0.2:5", "10.0.0.4:5", 19e6, 21e6, true); /* worker -> worker */
	bw = json_pack("{s:b, s:o}", "ok", 1, "pairs", pairs);
	assert_int_equal(ctrld_plan_compute(&pc, "a", 3, pl, bw, ag, NULL, &out, err, sizeof(err)),
			 0);
	assert_true(fabs(wnum(out, 0, "down_bps") - 100e6) < 1);
	assert_true(fabs(wnum(out, 0, "up_bps") - 40e6) < 1);
	assert_true(fabs(wnum(out, 0, "bw_bps") - 40e6) < 1);
	assert_string_equal(link_of(out, 0), "insufficient"); /* 40 < 45 */
	assert_true(fabs(wnum(out, 1, "bw_bps") - 60e6) < 1);
	assert_string_equal(link_of(out, 1), "sufficient");
	assert_string_equal(link_of(out, 2), "unknown");
	assert_string_equal(broadcast(out), "delta_up");
	/* Placement w0 (edge 0), w1 (edge 1), w2 (edge 2): three racks of one worker; with
	 * 40 Gbit/s of core the flat exchange wins. */
	ph = json_object_get(out, "phub");
	assert_string_equal(json_string_value(json_object_get(ph, "recommend")), "single");
	assert_int_equal(json_integer_value(json_object_get(ph, "racks")), 3);
	assert_true(json_is_true(json_object_get(ph, "worker_bps_measured")));
	json_decref(out);
	/* A core far slower than the workers' links: reduce per rack first. N(R-1)/(R B_core)
	 * = 2/(3 * 1e6) against max(1/1e11, 1/40e6) + 2/(3 * 1e6). */
	pc.phub_core_bps = 1e6;
	assert_int_equal(ctrld_plan_compute(&pc, "a", 3, pl, bw, ag, NULL, &out, err, sizeof(err)),
			 0);
	ph = json_object_get(out, "phub");
	/* One worker per rack: the hierarchy saves nothing (equal core terms, plus the local
	 * step): still single. */
	assert_string_equal(json_string_value(json_object_get(ph, "recommend")), "single");
	json_decref(out);
	json_decref(pl);
	/* Two racks of two: the flat exchange pushes 2 workers' data across the core. */
	pl = json_pack("[s, s, s, s]", "w0", "w0", "w1", "w1");
	assert_int_equal(
		ctrld_plan_compute(&pc, "a", 4, pl, bw, NULL, NULL, &out, err, sizeof(err)), 0);
	ph = json_object_get(out, "phub");
	assert_string_equal(json_string_value(json_object_get(ph, "recommend")), "hierarchical");
	assert_int_equal(json_integer_value(json_object_get(ph, "workers_per_rack")), 2);
	json_decref(out);
	json_decref(pl);
	json_decref(bw);
	json_decref(ag);
}

static void test_placement_and_size(void **state)
{
	(void)state;
	struct ctrld_plan_cfg pc;
	json_t *shortp = json_pack("[s]", "w0"), *bad = json_pack("[s, s, s]", "w0", "x", "w2"),
	       *out = NULL;
	char err[256];

	cfg(&pc);
	assert_int_equal(ctrld_plan_check_placement(&pc, NULL, 3, err, sizeof(err)), 0);
	assert_int_equal(ctrld_plan_check_placement(&pc, shortp, 3, err, sizeof(err)), -EINVAL);
	assert_int_equal(ctrld_plan_check_placement(&pc, bad, 3, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "placement[1]"));
	pc.degree = 2;
	pc.depth = 2; /* 6 workers at most */
	assert_int_equal(
		ctrld_plan_compute(&pc, "a", 7, NULL, NULL, NULL, NULL, &out, err, sizeof(err)),
		-ENOSPC);
	assert_null(out);
	assert_int_equal(
		ctrld_plan_compute(&pc, "a", 6, NULL, NULL, NULL, NULL, &out, err, sizeof(err)), 0);
	assert_string_equal(
		json_string_value(json_object_get(json_object_get(out, "tree"), "costs")),
		"uniform");
	json_decref(out);
	json_decref(shortp);
	json_decref(bad);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_links_and_hysteresis),
		cmocka_unit_test(test_placement_and_size),
		cmocka_unit_test(test_agents_and_phub),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
