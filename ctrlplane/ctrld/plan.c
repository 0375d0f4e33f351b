/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-ctrld's job plans: broadcast tree and DVF thresholds from the bandwidth matrix and
 * the configured placement (plan.h).
 */
#include "plan.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pboxd/config.h"
#include "tree.h"

void ctrld_plan_defaults(struct ctrld_plan_cfg *pc)
{
	memset(pc, 0, sizeof(*pc));
	pc->degree = 5;
	pc->depth = 3;
	pc->exact_max_workers = 16;
	pc->time_limit_ms = 200;
	pc->alpha = 0.1;
	pc->min_rate_bps = 50e6;
	pc->hysteresis = 0.1;
	pc->delta_low = 0.001;
	pc->delta_up = 0.01;
	pc->phub_core_bps = 40e9;
	pc->phub_appliance_bps = 100e9;
	pc->phub_worker_bps = 10e9;
}

/* Member name of g as a double (pbox_conf_float checked it; libconfig ints too), else def. */
static double num(const config_setting_t *g, const char *name, double def)
{
	const config_setting_t *s = config_setting_get_member(g, name);

	if (s == NULL) {
		return def;
	}
	if (config_setting_type(s) == CONFIG_TYPE_FLOAT) {
		return config_setting_get_float(s);
	}
	return (double)config_setting_get_int64(s);
}

int ctrld_plan_load(struct pbox_confkit *ck, struct ctrld_plan_cfg *pc, const config_setting_t *g)
{
	static const char *const keys[] = {
		"degree",     "depth",    "alpha",      "exact_max_workers",
		"time_limit", "min_rate", "hysteresis", "delta_low",
		"delta_up",   "hosts",    "phub",       NULL
	};
	static const char *const phkeys[] = { "core_rate", "appliance_rate", "worker_rate", NULL };
	static const char *const hkeys[] = { "name", "addr", "edge", "agg", NULL };
	const config_setting_t *where, *l;
	float alpha = 0.1f, hyst = 0.1f, dlow = 0.001f, dup = 0.01f;
	char rate[32];
	int rc;

	ctrld_plan_defaults(pc);
	if (!config_setting_is_group(g)) {
		return pbox_conf_bad(ck, g, "must be a group { degree = 5; depth = 3; ... }");
	}
	if ((rc = pbox_conf_only(ck, g, keys)) != 0 ||
	    (rc = pbox_conf_u32(ck, g, "degree", 1, 1024, &pc->degree)) != 0 ||
	    (rc = pbox_conf_u32(ck, g, "depth", 1, 64, &pc->depth)) != 0 ||
	    (rc = pbox_conf_u32(ck, g, "exact_max_workers", 0, 64, &pc->exact_max_workers)) != 0 ||
	    (rc = pbox_conf_u32(ck, g, "time_limit", 1, 600000, &pc->time_limit_ms)) != 0 ||
	    (rc = pbox_conf_float(ck, g, "alpha", 0, 1e6, &alpha)) != 0 ||
	    (rc = pbox_conf_float(ck, g, "hysteresis", 0, 0.9, &hyst)) != 0 ||
	    (rc = pbox_conf_float(ck, g, "delta_low", 0, 1e30, &dlow)) != 0 ||
	    (rc = pbox_conf_float(ck, g, "delta_up", 0, 1e30, &dup)) != 0 ||
	    (rc = pbox_conf_str(ck, g, "min_rate", rate, sizeof(rate), &where)) != 0) {
		return rc;
	}
	if (where != NULL && !pboxd_parse_rate(rate, &pc->min_rate_bps)) {
		return pbox_conf_bad(ck, where,
				     "expected a rate from 2mbit to 1000gbit (e.g. \"50mbit\")");
	}
	if (dlow > dup) {
		return pbox_conf_bad(ck, g, "delta_low (%g) must not exceed delta_up (%g)",
				     (double)dlow, (double)dup);
	}
	pc->alpha = num(g, "alpha", pc->alpha);
	pc->hysteresis = num(g, "hysteresis", pc->hysteresis);
	pc->delta_low = num(g, "delta_low", pc->delta_low);
	pc->delta_up = num(g, "delta_up", pc->delta_up);
	l = config_setting_get_member(g, "phub");
	if (l != NULL) {
		static const char *const names[] = { "core_rate", "appliance_rate", "worker_rate" };
		double *dst[] = { &pc->phub_core_bps, &pc->phub_appliance_bps,
				  &pc->phub_worker_bps };

		if (!config_setting_is_group(l) || (rc = pbox_conf_only(ck, l, phkeys)) != 0) {
			return config_setting_is_group(l)
				       ? rc
				       : pbox_conf_bad(ck, l,
						       "must be a group { core_rate = ...; }");
		}
		for (unsigned k = 0; k < 3; k++) {
			if ((rc = pbox_conf_str(ck, l, names[k], rate, sizeof(rate), &where)) !=
			    0) {
				return rc;
			}
			if (where != NULL && !pboxd_parse_rate(rate, dst[k])) {
				return pbox_conf_bad(ck, where,
						     "expected a rate (e.g. \"40gbit\")");
			}
		}
	}
	l = config_setting_get_member(g, "hosts");
	if (l == NULL) {
		return 0;
	}
	if (!config_setting_is_list(l) || config_setting_length(l) > (int)CTRLD_PLAN_MAX_HOSTS) {
		return pbox_conf_bad(ck, l,
				     "must be a list of at most %u groups { name; addr; "
				     "edge; agg; }",
				     CTRLD_PLAN_MAX_HOSTS);
	}
	pc->hosts = calloc((size_t)config_setting_length(l) + 1, sizeof(*pc->hosts));
	if (pc->hosts == NULL) {
		return pbox_conf_bad(ck, l, "out of memory");
	}
	for (int i = 0; i < config_setting_length(l); i++) {
		const config_setting_t *h = config_setting_get_elem(l, (unsigned)i);
		struct ctrld_plan_host *ph = &pc->hosts[pc->nhosts];

		if (!config_setting_is_group(h)) {
			return pbox_conf_bad(ck, h, "each host must be a group { name; ... }");
		}
		if ((rc = pbox_conf_only(ck, h, hkeys)) != 0 ||
		    (rc = pbox_conf_str(ck, h, "name", ph->name, sizeof(ph->name), &where)) != 0 ||
		    (rc = pbox_conf_str(ck, h, "addr", ph->addr, sizeof(ph->addr), NULL)) != 0 ||
		    (rc = pbox_conf_u32(ck, h, "edge", 0, 1000000, &ph->edge)) != 0 ||
		    (rc = pbox_conf_u32(ck, h, "agg", 0, 1000000, &ph->agg)) != 0) {
			return rc;
		}
		if (where == NULL || ph->name[0] == '\0') {
			return pbox_conf_bad(ck, h, "a host needs a name");
		}
		for (uint32_t k = 0; k < pc->nhosts; k++) {
			if (strcmp(pc->hosts[k].name, ph->name) == 0) {
				return pbox_conf_bad(ck, h, "host '%s' is given twice", ph->name);
			}
		}
		pc->nhosts++;
	}
	return 0;
}

void ctrld_plan_free(struct ctrld_plan_cfg *pc)
{
	free(pc->hosts);
	pc->hosts = NULL;
	pc->nhosts = 0;
}

static const struct ctrld_plan_host *find_host(const struct ctrld_plan_cfg *pc, const char *name)
{
	for (uint32_t k = 0; name != NULL && k < pc->nhosts; k++) {
		if (strcmp(pc->hosts[k].name, name) == 0) {
			return &pc->hosts[k];
		}
	}
	return NULL;
}

int ctrld_plan_check_placement(const struct ctrld_plan_cfg *pc, const json_t *placement,
			       uint32_t workers, char *err, size_t errlen)
{
	size_t i;
	const json_t *v;

	if (placement == NULL) {
		return 0;
	}
	if (!json_is_array(placement) || json_array_size(placement) != workers) {
		snprintf(err, errlen,
			 "placement: expected an array of %u host names (one per rank; plan.hosts "
			 "of the configuration)",
			 workers);
		return -EINVAL;
	}
	json_array_foreach(placement, i, v)
	{
		if (find_host(pc, json_string_value(v)) == NULL) {
			snprintf(err, errlen, "placement[%zu]: not a host of plan.hosts", i);
			return -EINVAL;
		}
	}
	return 0;
}

/* The measured bandwidth (middle of [r_min, r_max]) from pboxd `from` to addr; 0: none. */
static double measured(const json_t *bw, const char *from, const char *addr)
{
	size_t i;
	const json_t *p;

	if (bw == NULL || from == NULL || addr == NULL || addr[0] == '\0') {
		return 0;
	}
	json_array_foreach(json_object_get(bw, "pairs"), i, p)
	{
		const json_t *e = json_object_get(p, "estimate");

		if (e != NULL &&
		    strcmp(json_string_value(json_object_get(p, "from")) ?: "", from) == 0 &&
		    strcmp(json_string_value(json_object_get(p, "to")) ?: "", addr) == 0) {
			double lo = json_number_value(json_object_get(e, "r_min_bps")),
			       hi = json_number_value(json_object_get(e, "r_max_bps"));
			bool conv = false;
			size_t k;
			const json_t *f;

			json_array_foreach(json_object_get(e, "flags"), k, f)
			{
				conv |= json_string_value(f) != NULL &&
					strcmp(json_string_value(f), "converged") == 0;
			}
			/* A search cut short (budget, sender limit) left a wide range: its
			 * lower bound is what was established. */
			if (!conv) {
				return lo > 0 ? lo : 0;
			}
			return (lo + hi) / 2 > 0 ? (lo + hi) / 2 : 0;
		}
	}
	return 0;
}

enum link_state { LINK_UNKNOWN, LINK_SUFFICIENT, LINK_INSUFFICIENT };
static const char *const g_link_names[] = { "unknown", "sufficient", "insufficient" };

static enum link_state prev_link(const json_t *prev, uint32_t rank)
{
	const json_t *w = json_array_get(
		json_object_get(json_object_get(prev, "thresholds"), "workers"), rank);
	const char *s = json_string_value(json_object_get(w, "link"));

	if (s != NULL && strcmp(s, "sufficient") == 0) {
		return LINK_SUFFICIENT;
	}
	if (s != NULL && strcmp(s, "insufficient") == 0) {
		return LINK_INSUFFICIENT;
	}
	return LINK_UNKNOWN;
}

static enum link_state link_of(const struct ctrld_plan_cfg *pc, double bps, enum link_state prev)
{
	if (bps <= 0) {
		return LINK_UNKNOWN;
	}
	if (bps >= pc->min_rate_bps * (1 + pc->hysteresis)) {
		return LINK_SUFFICIENT;
	}
	if (bps < pc->min_rate_bps * (1 - pc->hysteresis)) {
		return LINK_INSUFFICIENT;
	}
	if (prev != LINK_UNKNOWN) {
		return prev; /* inside the band: keep */
	}
	return bps >= pc->min_rate_bps ? LINK_SUFFICIENT : LINK_INSUFFICIENT;
}

/* The previous tree's parents (node numbering of tree.h) if it fits n, T and H. */
static bool prev_tree(const json_t *prev, uint32_t n, uint32_t *parent)
{
	const json_t *t = json_object_get(prev, "tree"), *arr = json_object_get(t, "parent");

	if (!json_is_array(arr) || json_array_size(arr) != n) {
		return false;
	}
	parent[0] = 0;
	for (uint32_t j = 1; j <= n; j++) {
		json_int_t v = json_integer_value(json_array_get(arr, j - 1));

		if (v < -1 || v >= (json_int_t)n) {
			return false;
		}
		parent[j] = (uint32_t)(v + 1);
	}
	return true;
}

/* The responder address of rank r: the agent's (pboxd's job entry), else its placed
 * host's (NULL: none). */
static const char *rank_addr(const json_t *agents, const struct ctrld_plan_host *h, uint32_t r)
{
	size_t i;
	const json_t *a;

	json_array_foreach(json_object_get(agents, "agents"), i, a)
	{
		if (json_integer_value(json_object_get(a, "rank")) == (json_int_t)r &&
		    json_string_value(json_object_get(a, "probe")) != NULL) {
			return json_string_value(json_object_get(a, "probe"));
		}
	}
	return h != NULL && h->addr[0] != '\0' ? h->addr : NULL;
}

static double min_known(double a, double b)
{
	return a > 0 && b > 0 ? fmin(a, b) : a > 0 ? a : b;
}

/* PHub's hierarchy rule (papers/phub.md §6): with R racks (edge switches) of N workers
 * each, reduce hierarchically (one appliance per rack, then across racks) when the flat
 * cross-rack time N(R-1)/(R B_core) exceeds max(N/B_pbox, 1/B_wkr) + (R-1)/(R B_bn),
 * B_bn = min(B_pbox, B_core); times per byte of model. B_wkr: the slowest measured worker
 * link, else the configured one. */
static json_t *phub_decision(const struct ctrld_plan_cfg *pc, const struct ctrld_plan_host **wh,
			     uint32_t n, const double *link)
{
	uint32_t racks = 0, per = 0;
	uint32_t *edges = calloc(n + 1, sizeof(*edges)), *count = calloc(n + 1, sizeof(*count));
	double bw = pc->phub_worker_bps, flat, hier, bbn;
	bool measured = false, placed = true;
	json_t *o;

	if (edges == NULL || count == NULL) {
		free(edges);
		free(count);
		return NULL;
	}
	for (uint32_t j = 1; j <= n; j++) {
		/* Unplaced ranks count as one rack of their own. */
		uint32_t k = 0, e = wh[j] != NULL ? wh[j]->edge : UINT32_MAX;

		placed &= wh[j] != NULL;
		while (k < racks && edges[k] != e) {
			k++;
		}
		if (k == racks) {
			edges[racks++] = e;
		}
		count[k]++;
		per = count[k] > per ? count[k] : per;
		if (link[j] > 0 && (!measured || link[j] < bw)) {
			bw = link[j];
			measured = true;
		}
	}
	free(edges);
	free(count);
	bbn = fmin(pc->phub_appliance_bps, pc->phub_core_bps);
	flat = racks > 1 ? (double)per * (racks - 1) / (racks * pc->phub_core_bps) : 0;
	hier = fmax((double)per / pc->phub_appliance_bps, 1.0 / bw) +
	       (racks > 1 ? (double)(racks - 1) / (racks * bbn) : 0);
	o = json_pack("{s:s, s:I, s:I, s:f, s:f, s:f, s:b, s:f, s:f}", "recommend",
		      racks > 1 && flat > hier ? "hierarchical" : "single", "racks",
		      (json_int_t)racks, "workers_per_rack", (json_int_t)per, "core_bps",
		      pc->phub_core_bps, "appliance_bps", pc->phub_appliance_bps, "worker_bps", bw,
		      "worker_bps_measured", measured, "flat_s_per_bit", flat,
		      "hierarchical_s_per_bit", hier);
	if (o != NULL) {
		json_object_set_new(
			o, "reason",
			json_string(!placed       ? "ranks without a placement count as one "
						    "rack"
				    : racks <= 1  ? "the job's workers share one rack"
				    : flat > hier ? "cross-rack traffic through the core "
						    "takes longer than rack-local reduction "
						    "plus the exchange between racks"
						  : "the core carries the flat traffic faster "
						    "than a hierarchy would"));
	}
	return o;
}

int ctrld_plan_compute(const struct ctrld_plan_cfg *pc, const char *root, uint32_t workers,
		       const json_t *placement, const json_t *bw, const json_t *agents,
		       json_t *prev, json_t **out, char *err, size_t errlen)
{
	uint32_t n = workers, N = n + 1, nmeasured = 0, ninsuff = 0;
	const struct ctrld_plan_host *rh = find_host(pc, root), **wh = NULL;
	const char *app = json_string_value(json_object_get(agents, "probe"));
	double *cost = NULL, *bps = NULL, *up = NULL, *down = NULL;
	const char **addr = NULL;
	uint32_t *parent = NULL, *old = NULL;
	struct pbox_tree_problem p = {
		.n = n, .max_degree = pc->degree, .max_depth = pc->depth, .alpha = pc->alpha
	};
	struct pbox_tree_opts o = { .exact_max_workers = pc->exact_max_workers,
				    .time_limit_ms = pc->time_limit_ms };
	struct pbox_tree_result r;
	json_t *tree = NULL, *thr = NULL, *pa, *wa, *plan = NULL, *phub = NULL;
	bool changed = prev == NULL, kept = false;
	int rc = -ENOMEM;

	*out = NULL;
	cost = calloc((size_t)N * N, sizeof(*cost));
	bps = calloc(N, sizeof(*bps));
	parent = calloc(N, sizeof(*parent));
	old = calloc(N, sizeof(*old));
	wh = calloc(N, sizeof(*wh));
	up = calloc(N, sizeof(*up));
	down = calloc(N, sizeof(*down));
	addr = calloc(N, sizeof(*addr));
	if (cost == NULL || bps == NULL || parent == NULL || old == NULL || wh == NULL ||
	    up == NULL || down == NULL || addr == NULL) {
		snprintf(err, errlen, "plan: out of memory for %u workers", n);
		goto out;
	}
	for (uint32_t j = 1; j <= n; j++) {
		wh[j] = placement != NULL
				? find_host(pc, json_string_value(json_array_get(placement, j - 1)))
				: NULL;
		addr[j] = rank_addr(agents, wh[j], j - 1);
		/* A rank's link: its access link as the appliance's probe towards it (the
		 * broadcast) and its own towards the appliance (the push) see it. */
		down[j] = measured(bw, root, addr[j]);
		up[j] = app != NULL ? measured(bw, addr[j], app) : 0;
		bps[j] = min_known(down[j], up[j]);
		nmeasured += bps[j] > 0;
	}
	for (uint32_t i = 0; i <= n; i++) {
		const struct ctrld_plan_host *a = i == 0 ? rh : wh[i];

		for (uint32_t j = 1; j <= n; j++) {
			const struct ctrld_plan_host *b = wh[j];

			double ij = i > 0 ? measured(bw, addr[i], addr[j]) : 0;

			/* Unmeasured worker -> worker: the path through i's and j's access
			 * links (one switch between workers: the access links bound it). */
			if (i > 0 && ij <= 0 && up[i] > 0 && down[j] > 0) {
				ij = fmin(up[i], down[j]);
			}
			if (i == 0 && down[j] > 0) {
				cost[i * N + j] = 1e9 / down[j];
			} else if (ij > 0) {
				cost[i * N + j] = 1e9 / ij;
			} else if (a != NULL && b != NULL) {
				cost[i * N + j] =
					pbox_tree_tier_cost(a->edge, a->agg, b->edge, b->agg);
			} else {
				cost[i * N + j] = 1.0;
			}
		}
	}
	p.cost = cost;
	rc = pbox_tree_solve(&p, &o, parent, &r, err, errlen);
	if (rc != 0) {
		goto out;
	}
	if (prev != NULL && prev_tree(prev, n, old) && pbox_tree_check(&p, old, err, errlen) == 0) {
		double ob = pbox_tree_objective(&p, old);

		if (r.objective >= ob * (1 - PLAN_TREE_MIN_GAIN)) {
			memcpy(parent, old, (size_t)N * sizeof(*parent));
			kept = true;
		} else {
			changed = true;
		}
	} else {
		changed = true;
	}
	err[0] = '\0';
	pa = json_array();
	for (uint32_t j = 1; j <= n && pa != NULL; j++) {
		json_array_append_new(pa, json_integer((json_int_t)parent[j] - 1));
	}
	if (kept) {
		r.objective = pbox_tree_objective(&p, parent);
		r.method = (enum pbox_tree_method)0;
	}
	tree = json_pack("{s:s, s:o, s:I, s:I, s:f, s:s, s:f, s:s, s:f}", "root", root, "parent",
			 pa, "degree", (json_int_t)pc->degree, "depth", (json_int_t)pc->depth,
			 "alpha", pc->alpha, "costs",
			 nmeasured == n && n > 0 ? "measured+tiers"
			 : nmeasured > 0         ? "partly-measured+tiers"
			 : placement != NULL     ? "tiers"
						 : "uniform",
			 "objective", r.objective, "method",
			 kept ? "kept" : pbox_tree_method_name(r.method), "solve_ms", r.solve_ms);
	if (tree != NULL && !kept && r.method == PBOX_TREE_EXACT_LIMIT) {
		json_object_set_new(tree, "gap", json_real(r.gap));
	}
	wa = json_array();
	for (uint32_t j = 1; j <= n && wa != NULL; j++) {
		enum link_state ls = link_of(pc, bps[j], prev_link(prev, j - 1));
		json_t *w = json_pack("{s:I, s:s, s:s, s:f}", "rank", (json_int_t)j - 1, "link",
				      g_link_names[ls], "push",
				      ls == LINK_INSUFFICIENT ? "delta_up" : "delta_low", "delta",
				      ls == LINK_INSUFFICIENT ? pc->delta_up : pc->delta_low);

		ninsuff += ls == LINK_INSUFFICIENT;
		if (w != NULL && bps[j] > 0) {
			json_object_set_new(w, "bw_bps", json_real(bps[j]));
		}
		if (w != NULL && down[j] > 0) {
			json_object_set_new(w, "down_bps", json_real(down[j]));
		}
		if (w != NULL && up[j] > 0) {
			json_object_set_new(w, "up_bps", json_real(up[j]));
		}
		if (ls != prev_link(prev, j - 1)) {
			changed = true;
		}
		json_array_append_new(wa, w);
	}
	thr = json_pack("{s:f, s:f, s:f, s:f, s:{s:s, s:f}, s:o}", "min_rate_bps", pc->min_rate_bps,
			"hysteresis", pc->hysteresis, "delta_low", pc->delta_low, "delta_up",
			pc->delta_up, "broadcast", "select", ninsuff > 0 ? "delta_up" : "delta_low",
			"delta", ninsuff > 0 ? pc->delta_up : pc->delta_low, "workers", wa);
	if (tree == NULL || thr == NULL) {
		snprintf(err, errlen, "plan: out of memory");
		rc = -ENOMEM;
		goto out;
	}
	phub = phub_decision(pc, wh, n, bps);
	if (phub != NULL && prev != NULL &&
	    !json_equal(json_object_get(phub, "recommend"),
			json_object_get(json_object_get(prev, "phub"), "recommend"))) {
		changed = true;
	}
	if (!changed) {
		*out = json_incref(prev);
		rc = 0;
		goto out;
	}
	plan = json_pack("{s:O, s:O}", "tree", tree, "thresholds", thr);
	if (plan != NULL && phub != NULL) {
		json_object_set(plan, "phub", phub);
	}
	if (plan == NULL) {
		rc = -ENOMEM;
		goto out;
	}
	json_object_set_new(json_object_get(plan, "tree"), "revision",
			    json_integer(json_integer_value(json_object_get(
						 json_object_get(prev, "tree"), "revision")) +
					 1));
	*out = plan;
	rc = 0;
out:
	json_decref(tree);
	json_decref(thr);
	json_decref(phub);
	free(up);
	free(down);
	free(addr);
	free(cost);
	free(bps);
	free(parent);
	free(old);
	free(wh);
	return rc;
}
