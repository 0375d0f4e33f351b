/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The broadcast-tree solvers (ctrlplane/tree/tree.h):
 *  - the checker rejects cycles, self-loops, too-deep and too-wide trees;
 *  - the exact solver's optimum equals the optimum found by enumerating every parent
 *    assignment (kept when the checker accepts it) for n <= 6 workers on random costs,
 *    degrees, depths and leaf penalties;
 *  - pf.md §5.4's case (n = 3, T = 2, H = 3, alpha = 0.5, worker-worker 0.1, server 1.0),
 *    whose printed-P3 optimum is the 3-cycle w0->w2->w1->w0 at 0.8, gives the rooted chain
 *    at 1.7: the cycle is rejected by the checker and never produced;
 *  - the heuristic's trees are always valid and within HEUR_FACTOR of the exact optimum
 *    (1.3) on random instances (n <= 7, optimum by enumeration; mean and worst printed);
 *  - the exact solver's time limit: a 40-worker job with a 30 ms limit gives a valid
 *    tree no worse than the heuristic's (GLPK's best, or the heuristic's when it found
 *    nothing better), and too many workers for T and H is -ENOSPC.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tree.h"

/* The heuristic's worst ratio to the optimum allowed on the random instances below. */
#define HEUR_FACTOR 1.3

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static double urand(void)
{
	g_rng ^= g_rng << 13;
	g_rng ^= g_rng >> 7;
	g_rng ^= g_rng << 17;
	return (double)(g_rng >> 11) / 9007199254740992.0;
}

static uint32_t urange(uint32_t lo, uint32_t hi) /* [lo, hi] */
{
	return lo + (uint32_t)(urand() * (hi - lo + 1));
}

/* Random costs: tier costs of random placements (3 edge switches under 2 aggregation
 * switches) or uniform random costs, asymmetric. */
static void random_costs(double *c, uint32_t n, bool tiers)
{
	uint32_t N = n + 1, edge[64], agg[64];

	for (uint32_t i = 0; i < N; i++) {
		edge[i] = urange(0, 2);
		agg[i] = edge[i] / 2;
	}
	for (uint32_t i = 0; i < N; i++)
		for (uint32_t j = 0; j < N; j++)
			c[i * N + j] = tiers ? pbox_tree_tier_cost(edge[i], agg[i], edge[j], agg[j])
					     : 0.05 + urand();
}

/* The optimum over every parent assignment the checker accepts (NAN: none). */
static double enumerate(const struct pbox_tree_problem *p, uint32_t *count)
{
	uint32_t n = p->n, par[8] = { 0 };
	double best = NAN;
	char err[128];

	*count = 0;
	for (uint32_t j = 1; j <= n; j++)
		par[j] = 0;
	for (;;) {
		bool self = false;

		for (uint32_t j = 1; j <= n; j++)
			self |= par[j] == j;
		if (!self && pbox_tree_check(p, par, err, sizeof(err)) == 0) {
			double o = pbox_tree_objective(p, par);

			(*count)++;
			if (isnan(best) || o < best)
				best = o;
		}
		/* next assignment (odometer over 0..n) */
		uint32_t j = 1;

		while (j <= n && par[j] == n) {
			par[j] = 0;
			j++;
		}
		if (j > n)
			break;
		par[j]++;
	}
	return best;
}

static void test_checker(void **state)
{
	(void)state;
	double c[16] = { 0 };
	struct pbox_tree_problem p = { .n = 3, .cost = c, .max_degree = 2, .max_depth = 2 };
	char err[128];
	uint32_t ok[4] = { 0, 0, 0, 1 }, cyc[4] = { 0, 2, 3, 1 }, self[4] = { 0, 1, 0, 0 },
		 deep[4] = { 0, 0, 1, 2 }, wide[4] = { 0, 0, 0, 0 }, bad[4] = { 0, 7, 0, 0 },
		 two[4] = { 0, 0, 3, 2 };

	assert_int_equal(pbox_tree_check(&p, ok, err, sizeof(err)), 0);
	assert_int_equal(pbox_tree_check(&p, cyc, err, sizeof(err)), -EINVAL);
	assert_int_equal(pbox_tree_check(&p, two, err, sizeof(err)), -EINVAL);
	assert_int_equal(pbox_tree_check(&p, self, err, sizeof(err)), -EINVAL);
	assert_int_equal(pbox_tree_check(&p, deep, err, sizeof(err)), -EINVAL);
	assert_int_equal(pbox_tree_check(&p, wide, err, sizeof(err)), -EINVAL);
	assert_int_equal(pbox_tree_check(&p, bad, err, sizeof(err)), -EINVAL);
	p.max_depth = 3;
	assert_int_equal(pbox_tree_check(&p, deep, err, sizeof(err)), 0);
	p.max_degree = 3;
	assert_int_equal(pbox_tree_check(&p, wide, err, sizeof(err)), 0);
	assert_int_equal(pbox_tree_capacity(2, 3), 14);
	assert_int_equal(pbox_tree_capacity(5, 3), 155);
	assert_true(pbox_tree_tier_cost(1, 0, 1, 0) == 0.1);
	assert_true(pbox_tree_tier_cost(0, 0, 1, 0) == 0.5);
	assert_true(pbox_tree_tier_cost(0, 0, 2, 1) == 1.0);
}

static void test_exact_equals_enumeration(void **state)
{
	(void)state;
	double c[49];
	uint32_t par[8], instances = 0;
	char err[256];

	for (uint32_t n = 1; n <= 6; n++)
		for (uint32_t rep = 0; rep < 6; rep++) {
			struct pbox_tree_problem p = {
				.n = n,
				.cost = c,
				.max_degree = urange(1, 3),
				.max_depth = urange(1, 3),
				.alpha = rep % 3 == 0 ? 0 : urand(),
			};
			struct pbox_tree_result r;
			uint32_t count;
			double best;

			random_costs(c, n, rep % 2 == 0);
			best = enumerate(&p, &count);
			if (count == 0) {
				assert_int_equal(
					pbox_tree_exact(&p, NULL, 0, par, &r, err, sizeof(err)),
					-ENOSPC);
				continue;
			}
			assert_int_equal(pbox_tree_exact(&p, NULL, 0, par, &r, err, sizeof(err)),
					 0);
			assert_int_equal(r.method, PBOX_TREE_EXACT);
			assert_int_equal(pbox_tree_check(&p, par, err, sizeof(err)), 0);
			if (fabs(r.objective - best) > 1e-6)
				fail_msg("n=%u T=%u H=%u alpha=%g: exact %.9f, enumerated %.9f", n,
					 p.max_degree, p.max_depth, p.alpha, r.objective, best);
			assert_true(fabs(pbox_tree_objective(&p, par) - r.objective) < 1e-9);
			instances++;
		}
	assert_true(instances > 20);
}

/* pf.md §5.4: the printed P3's optimum is the cycle; the rooted program's is the chain. */
static void test_printed_p3_cycle_not_produced(void **state)
{
	(void)state;
	/* nodes: 0 server, 1..3 = w0..w2 */
	double c[16];
	struct pbox_tree_problem p = {
		.n = 3, .cost = c, .max_degree = 2, .max_depth = 3, .alpha = 0.5
	};
	/* parents (1,2,0) of w0,w1,w2 in the extraction's numbering: w0<-w1, w1<-w2, w2<-w0 */
	uint32_t cycle[4] = { 0, 2, 3, 1 }, par[4];
	struct pbox_tree_result r;
	uint32_t count;
	char err[256];

	for (uint32_t i = 0; i < 4; i++)
		for (uint32_t j = 0; j < 4; j++)
			c[i * 4 + j] = i == 0 ? 1.0 : 0.1;
	assert_true(fabs(pbox_tree_objective(&p, cycle) - 0.8) < 1e-9);
	assert_int_equal(pbox_tree_check(&p, cycle, err, sizeof(err)), -EINVAL);
	assert_true(fabs(enumerate(&p, &count) - 1.7) < 1e-9);
	assert_int_equal(pbox_tree_exact(&p, NULL, 0, par, &r, err, sizeof(err)), 0);
	assert_int_equal(pbox_tree_check(&p, par, err, sizeof(err)), 0);
	assert_true(fabs(r.objective - 1.7) < 1e-9);
	assert_int_equal(r.depth, 3); /* the chain server -> w -> w -> w */
	assert_int_equal(pbox_tree_heuristic(&p, par, err, sizeof(err)), 0);
	assert_true(fabs(pbox_tree_objective(&p, par) - 1.7) < 1e-9);
	/* With alpha = 0 the printed program's 2-cycles reach 0.3; the rooted one pays the
	 * server edge: 1.2. */
	p.alpha = 0;
	assert_int_equal(pbox_tree_exact(&p, NULL, 0, par, &r, err, sizeof(err)), 0);
	assert_true(fabs(r.objective - 1.2) < 1e-9);
}

static void test_heuristic_quality(void **state)
{
	(void)state;
	static double c[8 * 8];
	uint32_t par[8];
	double sum = 0, worst = 1;
	uint32_t count = 0;
	char err[256];

	/* The reference optimum is the enumeration's (deterministic, no solver time limit). */
	for (uint32_t rep = 0; rep < 60; rep++) {
		uint32_t n = urange(2, 7), total;
		struct pbox_tree_problem p = { .n = n,
					       .cost = c,
					       .max_degree = urange(2, 4),
					       .max_depth = urange(2, 3),
					       .alpha = urand() * 0.5 };
		double h, best, ratio;
		int rc;

		random_costs(c, n, rep % 2 == 0);
		rc = pbox_tree_heuristic(&p, par, err, sizeof(err));
		if (n > pbox_tree_capacity(p.max_degree, p.max_depth)) {
			assert_int_equal(rc, -ENOSPC);
			continue;
		}
		assert_int_equal(rc, 0);
		assert_int_equal(pbox_tree_check(&p, par, err, sizeof(err)), 0);
		h = pbox_tree_objective(&p, par);
		best = enumerate(&p, &total);
		assert_true(total > 0 && best <= h + 1e-9);
		ratio = h / best;
		sum += ratio;
		worst = ratio > worst ? ratio : worst;
		count++;
		if (ratio > HEUR_FACTOR) {
			fail_msg("n=%u T=%u H=%u alpha=%g: heuristic %.4f vs optimum %.4f", n,
				 p.max_degree, p.max_depth, p.alpha, h, best);
		}
	}
	printf("heuristic/optimum over %u instances: mean %.4f, worst %.4f (bound %.2f)\n", count,
	       sum / count, worst, HEUR_FACTOR);
	assert_true(count > 40);
}

static void test_time_limit_falls_back(void **state)
{
	(void)state;
	uint32_t n = 40, N = n + 1;
	double *c = malloc(sizeof(double) * N * N);
	uint32_t *par = malloc(sizeof(uint32_t) * N), *h = malloc(sizeof(uint32_t) * N);
	struct pbox_tree_problem p = {
		.n = n, .cost = c, .max_degree = 3, .max_depth = 4, .alpha = 0.2
	};
	struct pbox_tree_opts o = { .exact_max_workers = 64, .time_limit_ms = 30 };
	struct pbox_tree_result r;
	char err[256];
	int rc;

	assert_non_null(c);
	assert_non_null(par);
	assert_non_null(h);
	for (uint32_t i = 0; i < N * N; i++)
		c[i] = 0.05 + urand();
	assert_int_equal(pbox_tree_heuristic(&p, h, err, sizeof(err)), 0);
	assert_int_equal(pbox_tree_solve(&p, &o, par, &r, err, sizeof(err)), 0);
	assert_int_equal(pbox_tree_check(&p, par, err, sizeof(err)), 0);
	assert_true(r.objective <= pbox_tree_objective(&p, h) + 1e-9);
	assert_true(r.gap >= 0 && r.gap <= 1);
	printf("n=40 with a 30 ms limit: %s, objective %.4f (heuristic %.4f), gap %.3f, "
	       "%.1f ms\n",
	       pbox_tree_method_name(r.method), r.objective, pbox_tree_objective(&p, h), r.gap,
	       r.solve_ms);
	/* Without a start tree GLPK may find nothing within 1 ms: -ETIMEDOUT, else a tree. */
	rc = pbox_tree_exact(&p, NULL, 1, par, &r, err, sizeof(err));
	assert_true(rc == 0 || rc == -ETIMEDOUT);
	if (rc == 0)
		assert_int_equal(pbox_tree_check(&p, par, err, sizeof(err)), 0);
	/* Too many workers for T and H. */
	p.max_degree = 2;
	p.max_depth = 3; /* 14 at most */
	assert_int_equal(pbox_tree_solve(&p, &o, par, &r, err, sizeof(err)), -ENOSPC);
	/* A heuristic-only job (exact_max_workers below n). */
	p.max_degree = 8;
	o.exact_max_workers = 10;
	assert_int_equal(pbox_tree_solve(&p, &o, par, &r, err, sizeof(err)), 0);
	assert_int_equal(r.method, PBOX_TREE_HEURISTIC);
	assert_int_equal(pbox_tree_check(&p, par, err, sizeof(err)), 0);
	free(c);
	free(par);
	free(h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_checker),
		cmocka_unit_test(test_exact_equals_enumeration),
		cmocka_unit_test(test_printed_p3_cycle_not_produced),
		cmocka_unit_test(test_heuristic_quality),
		cmocka_unit_test(test_time_limit_falls_back),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
