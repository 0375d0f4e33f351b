/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Broadcast trees for a job (issue 11 §4; Parameter Flow's TSB, pf.md §5): the appliance is
 * the root (node 0), the job's workers are nodes 1..n, and every worker gets exactly one
 * parent so that the aggregate the root sends reaches each worker, relayed down the tree.
 *
 * The problem is PF's program P3 (pf.md §5.3): minimise
 *     sum of c(parent(j), j) over the workers j  +  alpha * (number of childless nodes,
 *                                                           the root included)
 * subject to at most T children per node (root included) and at most H hops from the root
 * to any worker. P3 as printed admits cycles of workers that never reach the root (pf.md
 * §5.4: for n = 3 its optimum is the 3-cycle w0->w2->w1->w0); the exact solver here uses
 * the rooted depth-label formulation instead, with O(n^2) variables:
 *     l_ij in {0,1} (i in 0..n, j in 1..n, i != j), t_i in {0,1}, d_j in [1, H], d_0 = 0
 *     sum_i l_ij = 1 (one parent)          sum_j l_ij <= T (degree)
 *     sum_j l_ij + t_i >= 1 (t_i = 1 for a childless node)
 *     d_j >= d_i + 1 - (H + 1)(1 - l_ij)   (a child is deeper than its parent)
 * Along any cycle the labels would have to increase strictly and return to themselves, so
 * no cycle is feasible; every worker's chain of parents ends at the root within H hops.
 *
 * Two solvers behind pbox_tree_solve: the exact one (GLPK branch and cut, given the
 * heuristic's tree as its first incumbent and a time limit; on the limit it returns its best
 * tree with the remaining relative gap), and the heuristic (a greedy Prim-like insertion,
 * which never runs out of degree/depth capacity, from five weightings of the leaf
 * penalty; then subtree moves while they lower the objective, O(n^2 H) per pass, a work
 * budget bounding the passes; up to 32 workers also pairs of moves and place swaps).
 * Every tree either returns has passed pbox_tree_check (rooted, acyclic, every worker
 * reached, degree <= T, depth <= H).
 *
 * Costs: any non-negative finite numbers; pbox_tree_tier_cost gives PF's static tier costs
 * (0.1 same edge switch, 0.5 same aggregation switch, 1.0 otherwise).
 *
 * Thread safety: no shared state; GLPK is used from the calling thread only (its
 * environment is per thread). Errors: -EINVAL (bad problem, with err), -ENOSPC (no tree
 * satisfies T and H for n workers), -ENOMEM.
 */
#ifndef PBOX_TREE_H
#define PBOX_TREE_H

#include <stddef.h>
#include <stdint.h>

#define PBOX_TREE_MAX_NODES 100000u

struct pbox_tree_problem {
	uint32_t n;          /* workers; nodes are 0 (root) .. n */
	const double *cost;  /* (n+1) x (n+1), row major: cost[i * (n+1) + j] of edge i -> j */
	uint32_t max_degree; /* T >= 1 */
	uint32_t max_depth;  /* H >= 1 */
	double alpha;        /* leaf penalty >= 0 */
};

enum pbox_tree_method {
	PBOX_TREE_EXACT = 1,   /* GLPK proved the tree optimal */
	PBOX_TREE_EXACT_LIMIT, /* GLPK hit its time limit: best tree found, gap below */
	PBOX_TREE_HEURISTIC,   /* the heuristic (n above the exact limit, or GLPK failed) */
};

struct pbox_tree_opts {
	uint32_t exact_max_workers; /* the exact solver for n <= this; 0: never */
	uint32_t time_limit_ms;     /* GLPK's limit; 0: none */
};

struct pbox_tree_result {
	enum pbox_tree_method method;
	double objective; /* edge costs + alpha * leaves */
	double gap;       /* PBOX_TREE_EXACT_LIMIT: relative gap of GLPK's bound; else 0 */
	uint32_t leaves;
	uint32_t depth;  /* deepest worker's hops */
	double solve_ms; /* wall time of pbox_tree_solve */
};

/* The objective of the tree parent[0..n] (parent[0] ignored) for p; it need not be valid. */
double pbox_tree_objective(const struct pbox_tree_problem *p, const uint32_t *parent);

/* Check parent[0..n] (parent[0] ignored; parent[j] in 0..n) against p: every worker's
 * chain of parents reaches node 0 (no cycle, no self-loop), at most max_depth hops, no
 * node with more than max_degree children. 0 or -EINVAL with the first violation in err. */
int pbox_tree_check(const struct pbox_tree_problem *p, const uint32_t *parent, char *err,
		    size_t errlen);

/* The heuristic alone: parent[0..n] (caller's array of n+1) gets a checked tree. 0,
 * -EINVAL, -ENOSPC, -ENOMEM. */
int pbox_tree_heuristic(const struct pbox_tree_problem *p, uint32_t *parent, char *err,
			size_t errlen);

/* The exact solver alone (GLPK; time_limit_ms 0: none). start: NULL, or a valid tree given
 * to GLPK as its first incumbent. 0 with parent filled and res->method EXACT or EXACT_LIMIT;
 * -ETIMEDOUT (the limit passed before any tree was found), -EINVAL, -ENOSPC, -ENOMEM,
 * -EIO (GLPK failed, err says how). */
int pbox_tree_exact(const struct pbox_tree_problem *p, const uint32_t *start,
		    uint32_t time_limit_ms, uint32_t *parent, struct pbox_tree_result *res,
		    char *err, size_t errlen);

/* The solver for a job: the heuristic's tree, then the exact solver from it when
 * n <= opts->exact_max_workers; the exact solver's failure or time-out leaves the better of
 * the two trees. 0 with parent and res filled; -EINVAL, -ENOSPC, -ENOMEM. */
int pbox_tree_solve(const struct pbox_tree_problem *p, const struct pbox_tree_opts *opts,
		    uint32_t *parent, struct pbox_tree_result *res, char *err, size_t errlen);

/* PF's static tier cost between hosts placed at (edge_a, agg_a) and (edge_b, agg_b): 0.1
 * on one edge switch, 0.5 under one aggregation switch, 1.0 otherwise. */
double pbox_tree_tier_cost(uint32_t edge_a, uint32_t agg_a, uint32_t edge_b, uint32_t agg_b);

/* The largest n a tree with degree T and depth H holds: T + T^2 + ... + T^H, saturated at
 * UINT32_MAX. */
uint32_t pbox_tree_capacity(uint32_t max_degree, uint32_t max_depth);

const char *pbox_tree_method_name(enum pbox_tree_method m);

#endif /* PBOX_TREE_H */
