/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Broadcast-tree solvers (tree.h): the rooted P3 program on GLPK, the greedy + subtree-move
 * heuristic, and the one checker both are validated by.
 */
#include "tree.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <glpk.h>

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static double cost_of(const struct pbox_tree_problem *p, uint32_t i, uint32_t j)
{
	return p->cost[(size_t)i * (p->n + 1) + j];
}

uint32_t pbox_tree_capacity(uint32_t max_degree, uint32_t max_depth)
{
	uint64_t total = 0, level = 1;

	for (uint32_t k = 0; k < max_depth; k++) {
		level *= max_degree;
		total += level;
		if (total >= UINT32_MAX || level >= UINT32_MAX)
			return UINT32_MAX;
	}
	return (uint32_t)total;
}

double pbox_tree_tier_cost(uint32_t edge_a, uint32_t agg_a, uint32_t edge_b, uint32_t agg_b)
{
	if (agg_a != agg_b)
		return 1.0;
	return edge_a == edge_b ? 0.1 : 0.5;
}

const char *pbox_tree_method_name(enum pbox_tree_method m)
{
	switch (m) {
	case PBOX_TREE_EXACT:
		return "exact";
	case PBOX_TREE_EXACT_LIMIT:
		return "exact-time-limit";
	case PBOX_TREE_HEURISTIC:
		return "heuristic";
	}
	return "?";
}

static int validate(const struct pbox_tree_problem *p, char *err, size_t errlen)
{
	if (p == NULL || p->cost == NULL || p->max_degree == 0 || p->max_depth == 0 ||
	    p->n > PBOX_TREE_MAX_NODES || !(p->alpha >= 0) || !isfinite(p->alpha)) {
		snprintf(err, errlen,
			 "tree problem: needs costs, degree >= 1, depth >= 1, 0 <= alpha < inf "
			 "and at most %u workers",
			 PBOX_TREE_MAX_NODES);
		return -EINVAL;
	}
	for (uint32_t i = 0; i <= p->n; i++)
		for (uint32_t j = 1; j <= p->n; j++)
			if (i != j && !(cost_of(p, i, j) >= 0 && isfinite(cost_of(p, i, j)))) {
				snprintf(err, errlen,
					 "tree problem: cost %u->%u is %g (must be finite, >= 0)",
					 i, j, cost_of(p, i, j));
				return -EINVAL;
			}
	if (p->n > pbox_tree_capacity(p->max_degree, p->max_depth)) {
		snprintf(err, errlen,
			 "tree problem: %u workers do not fit a tree of degree %u and depth %u "
			 "(at most %u)",
			 p->n, p->max_degree, p->max_depth,
			 pbox_tree_capacity(p->max_degree, p->max_depth));
		return -ENOSPC;
	}
	return 0;
}

double pbox_tree_objective(const struct pbox_tree_problem *p, const uint32_t *parent)
{
	uint32_t n = p->n, leaves = 0;
	double sum = 0;
	bool *has_child = calloc((size_t)n + 1, sizeof(*has_child));

	if (has_child == NULL)
		return NAN;
	for (uint32_t j = 1; j <= n; j++) {
		if (parent[j] <= n) {
			sum += cost_of(p, parent[j], j);
			has_child[parent[j]] = true;
		}
	}
	for (uint32_t i = 0; i <= n; i++)
		leaves += !has_child[i];
	free(has_child);
	return sum + p->alpha * leaves;
}

int pbox_tree_check(const struct pbox_tree_problem *p, const uint32_t *parent, char *err,
		    size_t errlen)
{
	uint32_t n = p->n;
	uint32_t *deg = calloc((size_t)n + 1, sizeof(*deg));

	if (deg == NULL) {
		snprintf(err, errlen, "tree check: out of memory");
		return -ENOMEM;
	}
	for (uint32_t j = 1; j <= n; j++) {
		if (parent[j] > n || parent[j] == j) {
			snprintf(err, errlen, "tree: worker %u has parent %u (%s)", j, parent[j],
				 parent[j] == j ? "itself" : "no such node");
			free(deg);
			return -EINVAL;
		}
		if (++deg[parent[j]] > p->max_degree) {
			snprintf(err, errlen, "tree: node %u has more than %u children", parent[j],
				 p->max_degree);
			free(deg);
			return -EINVAL;
		}
	}
	free(deg);
	for (uint32_t j = 1; j <= n; j++) {
		uint32_t v = j, hops = 0;

		/* At most H hops to the root; a cycle never gets there, so it is caught too. */
		while (v != 0 && hops <= p->max_depth) {
			v = parent[v];
			hops++;
		}
		if (v != 0 || hops > p->max_depth) {
			snprintf(err, errlen,
				 "tree: worker %u does not reach the root within %u hops (a cycle "
				 "or too deep)",
				 j, p->max_depth);
			return -EINVAL;
		}
	}
	return 0;
}

static void fill_result(const struct pbox_tree_problem *p, const uint32_t *parent,
			struct pbox_tree_result *res)
{
	uint32_t n = p->n, leaves = 0, maxd = 0;
	bool *has_child = calloc((size_t)n + 1, sizeof(*has_child));

	for (uint32_t j = 1; j <= n; j++) {
		uint32_t v = j, d = 0;

		while (v != 0 && d <= n) {
			v = parent[v];
			d++;
		}
		maxd = d > maxd ? d : maxd;
		if (has_child != NULL)
			has_child[parent[j]] = true;
	}
	if (has_child != NULL) {
		for (uint32_t i = 0; i <= n; i++)
			leaves += !has_child[i];
		free(has_child);
	}
	res->leaves = leaves;
	res->depth = maxd;
	res->objective = pbox_tree_objective(p, parent);
}

/* ---- heuristic ------------------------------------------------------------------------ */

struct heur {
	const struct pbox_tree_problem *p;
	uint32_t *parent, *deg, *depth, *height;
	double aw; /* the greedy's weight of alpha (a start's variant) */
};

/* Attaching j under i costs c(i,j), plus alpha when i already has a child (the tree gains
 * a leaf: j; otherwise i stops being one). */
static double marginal(const struct heur *h, uint32_t i, uint32_t j)
{
	return cost_of(h->p, i, j) + (h->deg[i] > 0 ? h->aw * h->p->alpha : 0);
}

static bool open_parent(const struct heur *h, uint32_t i)
{
	return h->deg[i] < h->p->max_degree && h->depth[i] < h->p->max_depth;
}

static void recompute_depths(struct heur *h)
{
	uint32_t n = h->p->n;

	for (uint32_t j = 0; j <= n; j++)
		h->height[j] = 0;
	for (uint32_t j = 1; j <= n; j++) {
		uint32_t v = j, d = 0;

		while (v != 0) {
			v = h->parent[v];
			d++;
		}
		h->depth[j] = d;
	}
	h->depth[0] = 0;
	for (uint32_t j = 1; j <= n; j++)
		for (uint32_t v = h->parent[j], up = 1;; v = h->parent[v], up++) {
			if (h->height[v] < up)
				h->height[v] = up;
			if (v == 0)
				break;
		}
}

/* Greedy insertion, Prim-like: repeatedly attach the outside worker with the cheapest
 * marginal cost under an open node. It never gets stuck when n fits T and H: putting a
 * worker in a slot removes that slot and adds T at the next level (or none at depth H), so
 * the number of workers the remaining slots can still take drops by at most one. */
static int greedy(struct heur *h)
{
	const struct pbox_tree_problem *p = h->p;
	uint32_t n = p->n;
	uint32_t *best_i = malloc(((size_t)n + 1) * sizeof(*best_i));
	double *best = malloc(((size_t)n + 1) * sizeof(*best));
	bool *in = calloc((size_t)n + 1, sizeof(*in));
	int rc = 0;

	if (best_i == NULL || best == NULL || in == NULL) {
		rc = -ENOMEM;
		goto out;
	}
	in[0] = true;
	for (uint32_t j = 1; j <= n; j++) {
		best_i[j] = 0;
		best[j] = marginal(h, 0, j);
	}
	for (uint32_t step = 0; step < n; step++) {
		uint32_t j = 0, i;

		for (uint32_t k = 1; k <= n; k++)
			if (!in[k] && (j == 0 || best[k] < best[j]))
				j = k;
		i = best_i[j];
		in[j] = true;
		h->parent[j] = i;
		h->depth[j] = h->depth[i] + 1;
		h->deg[i]++;
		/* i's marginal rose (first child) or i is full: re-pick for those that chose i. */
		if (h->deg[i] == 1 || !open_parent(h, i)) {
			for (uint32_t k = 1; k <= n; k++) {
				if (in[k] || best_i[k] != i)
					continue;
				best[k] = DBL_MAX;
				for (uint32_t q = 0; q <= n; q++)
					if (in[q] && open_parent(h, q) &&
					    marginal(h, q, k) < best[k]) {
						best[k] = marginal(h, q, k);
						best_i[k] = q;
					}
			}
		}
		if (open_parent(h, j))
			for (uint32_t k = 1; k <= n; k++)
				if (!in[k] && marginal(h, j, k) < best[k]) {
					best[k] = marginal(h, j, k);
					best_i[k] = j;
				}
	}
out:
	free(best_i);
	free(best);
	free(in);
	return rc;
}

static bool in_subtree(const struct heur *h, uint32_t v, uint32_t root_of_subtree)
{
	for (;;) {
		if (v == root_of_subtree)
			return true;
		if (v == 0)
			return false;
		v = h->parent[v];
	}
}

/* The change of the objective when j's subtree moves under i; false if not allowed. */
static bool move_delta(const struct heur *h, uint32_t j, uint32_t i, double *delta)
{
	const struct pbox_tree_problem *p = h->p;
	uint32_t old = h->parent[j];

	if (i == old || i == j || h->deg[i] >= p->max_degree ||
	    h->depth[i] + 1 + h->height[j] > p->max_depth || in_subtree(h, i, j)) {
		return false;
	}
	*delta = cost_of(p, i, j) - cost_of(p, old, j) +
		 p->alpha * ((h->deg[old] == 1 ? 1.0 : 0.0) - (h->deg[i] == 0 ? 1.0 : 0.0));
	return true;
}

static void apply_move(struct heur *h, uint32_t j, uint32_t i)
{
	h->deg[h->parent[j]]--;
	h->deg[i]++;
	h->parent[j] = i;
	recompute_depths(h);
}

/* The best single subtree move (depths fresh): its delta, or 0 with none below -eps. */
static double best_move(const struct heur *h, uint32_t *bj, uint32_t *bi)
{
	double best = -1e-12, d;

	*bj = 0;
	for (uint32_t j = 1; j <= h->p->n; j++) {
		for (uint32_t i = 0; i <= h->p->n; i++) {
			if (move_delta(h, j, i, &d) && d < best) {
				best = d;
				*bj = j;
				*bi = i;
			}
		}
	}
	return *bj != 0 ? best : 0;
}

static uint32_t swapped(uint32_t v, uint32_t a, uint32_t b)
{
	return v == a ? b : v == b ? a : v;
}

/* Sum of the edge costs after workers a and b trade places (the tree's shape, hence the
 * degrees, depths and leaf count, stays). */
static double swap_edges(const struct heur *h, uint32_t a, uint32_t b)
{
	double sum = 0;

	for (uint32_t x = 1; x <= h->p->n; x++) {
		sum += cost_of(h->p, swapped(h->parent[x], a, b), swapped(x, a, b));
	}
	return sum;
}

static void apply_swap(struct heur *h, uint32_t a, uint32_t b)
{
	uint32_t pa = h->parent[a], pb = h->parent[b];

	for (uint32_t x = 1; x <= h->p->n; x++) {
		if (h->parent[x] == a) {
			h->parent[x] = b;
		} else if (h->parent[x] == b) {
			h->parent[x] = a;
		}
	}
	h->parent[a] = swapped(pb, a, b);
	h->parent[b] = swapped(pa, a, b);
	{
		uint32_t t = h->deg[a];

		h->deg[a] = h->deg[b];
		h->deg[b] = t;
	}
	recompute_depths(h);
}

/* Pairs of moves are searched for jobs up to this many workers (O(n^4 H) per pass). */
#define PAIR_MOVES_MAX_N 32u

/* Move whole subtrees to other parents while that lowers the objective: the best single
 * move, else (small n) the best first move of an improving pair — e.g. lifting a worker
 * one level so that another can hang under it, which alone costs more. */
static void improve(struct heur *h)
{
	uint32_t n = h->p->n, bj, bi;

	/* Each pass scans n^2 moves of O(H): bound the passes to ~5e7 steps for big jobs. */
	double work = (double)n * n * h->p->max_depth + 1;
	uint32_t passes = 4 * n + 16;

	if (passes > 5e7 / work) {
		passes = 5e7 / work > 4 ? (uint32_t)(5e7 / work) : 4;
	}
	recompute_depths(h);
	for (uint32_t pass = 0; pass < passes; pass++) {
		double pair_best = -1e-9;
		uint32_t pj = 0, pi = 0, pj2 = 0, pi2 = 0;

		if (best_move(h, &bj, &bi) < 0) {
			apply_move(h, bj, bi);
			continue;
		}
		if (n > PAIR_MOVES_MAX_N) {
			break;
		}
		for (uint32_t j = 1; j <= n; j++) {
			for (uint32_t i = 0; i <= n; i++) {
				uint32_t old = h->parent[j], j2, i2;
				double d1, d2;

				if (!move_delta(h, j, i, &d1)) {
					continue;
				}
				apply_move(h, j, i);
				d2 = best_move(h, &j2, &i2);
				if (j2 != 0 && d1 + d2 < pair_best) {
					pair_best = d1 + d2;
					pj = j, pi = i, pj2 = j2, pi2 = i2;
				}
				apply_move(h, j, old);
			}
		}
		if (pj == 0) {
			/* Last: two workers trade places (full trees allow no move at all). */
			double base = swap_edges(h, 0, 0), sb = -1e-9;

			for (uint32_t a = 1; a <= n; a++) {
				for (uint32_t b = a + 1; b <= n; b++) {
					double d = swap_edges(h, a, b) - base;

					if (d < sb) {
						sb = d;
						pj = a, pi = b;
					}
				}
			}
			if (pj == 0) {
				break;
			}
			apply_swap(h, pj, pi);
			continue;
		}
		apply_move(h, pj, pi);
		apply_move(h, pj2, pi2);
	}
}

int pbox_tree_heuristic(const struct pbox_tree_problem *p, uint32_t *parent, char *err,
			size_t errlen)
{
	/* Starts: the greedy weighs the leaf penalty by these factors; the best tree after
	 * the subtree moves wins. */
	static const double weights[] = { 1.0, 0.0, 2.0, 0.5, 4.0 };
	struct heur h = { .p = p };
	size_t sz = ((size_t)p->n + 1) * sizeof(uint32_t);
	double best = INFINITY;
	int rc = validate(p, err, errlen);

	if (rc != 0)
		return rc;
	h.parent = malloc(sz);
	h.deg = malloc(sz);
	h.depth = malloc(sz);
	h.height = malloc(sz);
	if (h.parent == NULL || h.deg == NULL || h.depth == NULL || h.height == NULL) {
		rc = -ENOMEM;
		snprintf(err, errlen, "tree heuristic: out of memory for %u workers", p->n);
		goto out;
	}
	for (size_t w = 0; w < sizeof(weights) / sizeof(weights[0]); w++) {
		double o;

		if (w > 0 && p->alpha == 0)
			break; /* the weights change nothing */
		memset(h.deg, 0, sz);
		memset(h.depth, 0, sz);
		h.parent[0] = 0;
		h.aw = weights[w];
		rc = greedy(&h);
		if (rc != 0) {
			snprintf(err, errlen, "tree heuristic: out of memory for %u workers", p->n);
			goto out;
		}
		improve(&h);
		o = pbox_tree_objective(p, h.parent);
		if (o < best) {
			best = o;
			memcpy(parent, h.parent, sz);
		}
	}
	rc = pbox_tree_check(p, parent, err, errlen);
out:
	free(h.parent);
	free(h.deg);
	free(h.depth);
	free(h.height);
	return rc;
}

/* ---- exact (GLPK) --------------------------------------------------------------------- */

struct exact_cb {
	const double *start_x; /* column values of the start tree, 1-based; NULL: none */
	bool given;
	double bound; /* best lower bound seen (the LP relaxation's at first) */
};

static void exact_callback(glp_tree *t, void *info)
{
	struct exact_cb *cb = info;

	switch (glp_ios_reason(t)) {
	case GLP_IHEUR:
		if (cb->start_x != NULL && !cb->given) {
			cb->given = true;
			(void)glp_ios_heur_sol(t, cb->start_x);
		}
		break;
	default:
		break;
	}
	{
		int best = glp_ios_best_node(t);

		if (best != 0 && glp_ios_node_bound(t, best) > cb->bound) {
			cb->bound = glp_ios_node_bound(t, best);
		}
	}
}

int pbox_tree_exact(const struct pbox_tree_problem *p, const uint32_t *start,
		    uint32_t time_limit_ms, uint32_t *parent, struct pbox_tree_result *res,
		    char *err, size_t errlen)
{
	uint32_t n = p->n, H = p->max_depth;
	size_t N = (size_t)n + 1, nl = N * N, ncol, nrow, nnz, k = 0;
	/* columns: l_ij at lcol[i*N + j] (i != j, j >= 1), t_i, d_j */
	int *lcol = NULL, *ia = NULL, *ja = NULL, tcol0, dcol0, row, grc, st;
	double *ar = NULL, *x0 = NULL, t0 = now_ms();
	glp_prob *lp = NULL;
	glp_smcp sm;
	glp_iocp io;
	struct exact_cb cb = { 0 };
	int rc = validate(p, err, errlen);

	if (rc != 0)
		return rc;
	if (n == 0) {
		parent[0] = 0;
		memset(res, 0, sizeof(*res));
		res->method = PBOX_TREE_EXACT;
		fill_result(p, parent, res);
		return 0;
	}
	ncol = (N * n - n) + N + n;
	nrow = n + N + N + (size_t)n * (n - 1);
	nnz = 3 * (N * n - n) + N + 3 * (size_t)n * (n - 1);
	if (ncol > 2000000 || nnz > 20000000) {
		snprintf(err, errlen, "tree exact: %u workers are too many for the exact solver",
			 n);
		return -EINVAL;
	}
	lcol = calloc(nl, sizeof(*lcol));
	ia = malloc((nnz + 1) * sizeof(*ia));
	ja = malloc((nnz + 1) * sizeof(*ja));
	ar = malloc((nnz + 1) * sizeof(*ar));
	if (lcol == NULL || ia == NULL || ja == NULL || ar == NULL) {
		snprintf(err, errlen, "tree exact: out of memory (%u workers)", n);
		rc = -ENOMEM;
		goto out;
	}
	lp = glp_create_prob();
	glp_set_obj_dir(lp, GLP_MIN);
	glp_add_cols(lp, (int)ncol);
	{
		int c = 0;

		for (uint32_t i = 0; i <= n; i++)
			for (uint32_t j = 1; j <= n; j++) {
				if (i == j)
					continue;
				lcol[i * N + j] = ++c;
				glp_set_col_kind(lp, c, GLP_BV);
				glp_set_obj_coef(lp, c, cost_of(p, i, j));
			}
		tcol0 = c + 1;
		for (uint32_t i = 0; i <= n; i++) {
			glp_set_col_kind(lp, ++c, GLP_BV);
			glp_set_obj_coef(lp, c, p->alpha);
		}
		dcol0 = c + 1;
		for (uint32_t j = 1; j <= n; j++) {
			++c;
			if (H > 1)
				glp_set_col_bnds(lp, c, GLP_DB, 1.0, (double)H);
			else
				glp_set_col_bnds(lp, c, GLP_FX, 1.0, 1.0);
		}
	}
	glp_add_rows(lp, (int)nrow);
	row = 0;
	for (uint32_t j = 1; j <= n; j++) { /* one parent */
		glp_set_row_bnds(lp, ++row, GLP_FX, 1.0, 1.0);
		for (uint32_t i = 0; i <= n; i++)
			if (i != j) {
				k++;
				ia[k] = row, ja[k] = lcol[i * N + j], ar[k] = 1.0;
			}
	}
	for (uint32_t i = 0; i <= n; i++) { /* degree; leaf indicator */
		int drow = ++row, lrow = ++row;

		glp_set_row_bnds(lp, drow, GLP_UP, 0.0, (double)p->max_degree);
		glp_set_row_bnds(lp, lrow, GLP_LO, 1.0, 0.0);
		for (uint32_t j = 1; j <= n; j++)
			if (i != j) {
				k++;
				ia[k] = drow, ja[k] = lcol[i * N + j], ar[k] = 1.0;
				k++;
				ia[k] = lrow, ja[k] = lcol[i * N + j], ar[k] = 1.0;
			}
		k++;
		ia[k] = lrow, ja[k] = tcol0 + (int)i, ar[k] = 1.0;
	}
	/* d_j - d_i - (H+1) l_ij >= -H for workers i != j (d_0 = 0 makes the root's rows
	 * d_j >= 1 - ..., which the bounds already give). */
	for (uint32_t i = 1; i <= n; i++)
		for (uint32_t j = 1; j <= n; j++) {
			if (i == j)
				continue;
			glp_set_row_bnds(lp, ++row, GLP_LO, -(double)H, 0.0);
			k++;
			ia[k] = row, ja[k] = dcol0 + (int)j - 1, ar[k] = 1.0;
			k++;
			ia[k] = row, ja[k] = dcol0 + (int)i - 1, ar[k] = -1.0;
			k++;
			ia[k] = row, ja[k] = lcol[i * N + j], ar[k] = -(double)(H + 1);
		}
	glp_load_matrix(lp, (int)k, ia, ja, ar);

	if (start != NULL) {
		char e2[160];

		if (pbox_tree_check(p, start, e2, sizeof(e2)) == 0) {
			uint32_t *deg = calloc(N, sizeof(*deg));

			x0 = calloc(ncol + 1, sizeof(*x0));
			if (x0 != NULL && deg != NULL) {
				for (uint32_t j = 1; j <= n; j++) {
					uint32_t v = j, d = 0;

					x0[lcol[start[j] * N + j]] = 1.0;
					deg[start[j]]++;
					while (v != 0) {
						v = start[v];
						d++;
					}
					x0[dcol0 + j - 1] = d;
				}
				for (uint32_t i = 0; i <= n; i++)
					x0[tcol0 + i] = deg[i] == 0 ? 1.0 : 0.0;
				cb.start_x = x0;
			}
			free(deg);
		}
	}

	glp_init_smcp(&sm);
	sm.msg_lev = GLP_MSG_OFF;
	if (time_limit_ms > 0)
		sm.tm_lim = (int)time_limit_ms;
	grc = glp_simplex(lp, &sm);
	if (grc != 0 || glp_get_status(lp) != GLP_OPT) {
		snprintf(err, errlen,
			 "tree exact: GLPK's LP relaxation failed (glp_simplex %d, "
			 "status %d)",
			 grc, glp_get_status(lp));
		rc = grc == GLP_ETMLIM ? -ETIMEDOUT : -EIO;
		goto out;
	}
	cb.bound = glp_get_obj_val(lp);
	glp_init_iocp(&io);
	io.msg_lev = GLP_MSG_OFF;
	io.presolve = GLP_OFF; /* the callback's start tree is in the original columns */
	io.cb_func = exact_callback;
	io.cb_info = &cb;
	io.mir_cuts = GLP_ON;
	if (time_limit_ms > 0) {
		double left = (double)time_limit_ms - (now_ms() - t0);

		io.tm_lim = left > 1 ? (int)left : 1;
	}
	grc = glp_intopt(lp, &io);
	st = glp_mip_status(lp);
	if ((grc != 0 && grc != GLP_ETMLIM) || (st != GLP_OPT && st != GLP_FEAS)) {
		if (grc == GLP_ETMLIM || (grc == 0 && st == GLP_UNDEF)) {
			snprintf(err, errlen, "tree exact: time limit of %u ms before any tree",
				 time_limit_ms);
			rc = -ETIMEDOUT;
		} else {
			snprintf(err, errlen, "tree exact: GLPK failed (glp_intopt %d, status %d)",
				 grc, st);
			rc = -EIO;
		}
		goto out;
	}
	parent[0] = 0;
	for (uint32_t j = 1; j <= n; j++) {
		parent[j] = UINT32_MAX;
		for (uint32_t i = 0; i <= n; i++)
			if (i != j && glp_mip_col_val(lp, lcol[i * N + j]) > 0.5)
				parent[j] = i;
	}
	rc = pbox_tree_check(p, parent, err, errlen);
	if (rc != 0) {
		rc = -EIO; /* a solver answer that is not a tree: never handed out */
		goto out;
	}
	memset(res, 0, sizeof(*res));
	res->method = grc == GLP_ETMLIM ? PBOX_TREE_EXACT_LIMIT : PBOX_TREE_EXACT;
	fill_result(p, parent, res);
	if (grc == GLP_ETMLIM) {
		/* relative distance of the tree's objective from the best bound */
		double o = res->objective;

		res->gap = o > cb.bound ? (o - cb.bound) / (o > 1e-12 ? o : 1e-12) : 0;
	}
	res->solve_ms = now_ms() - t0;
out:
	if (lp != NULL)
		glp_delete_prob(lp);
	free(lcol);
	free(ia);
	free(ja);
	free(ar);
	free(x0);
	return rc;
}

int pbox_tree_solve(const struct pbox_tree_problem *p, const struct pbox_tree_opts *opts,
		    uint32_t *parent, struct pbox_tree_result *res, char *err, size_t errlen)
{
	double t0 = now_ms();
	int rc = pbox_tree_heuristic(p, parent, err, errlen);

	if (rc != 0)
		return rc;
	memset(res, 0, sizeof(*res));
	res->method = PBOX_TREE_HEURISTIC;
	fill_result(p, parent, res);
	if (opts != NULL && p->n > 0 && p->n <= opts->exact_max_workers) {
		uint32_t *ex = malloc(((size_t)p->n + 1) * sizeof(*ex));
		struct pbox_tree_result er;
		char e2[256];

		if (ex != NULL &&
		    pbox_tree_exact(p, parent, opts->time_limit_ms, ex, &er, e2, sizeof(e2)) == 0 &&
		    er.objective <= res->objective + 1e-9) {
			memcpy(parent, ex, ((size_t)p->n + 1) * sizeof(*ex));
			*res = er;
		}
		free(ex);
	}
	res->solve_ms = now_ms() - t0;
	return 0;
}
