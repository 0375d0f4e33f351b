/* SPDX-License-Identifier: BSD-3-Clause */
/* pboxd's side of TSB (see tsbd.h). */
#include "tsbd.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

int pboxd_tsb_load(struct pbox_confkit *c, const config_setting_t *g, struct pboxd_job_cfg *j)
{
	static const char *const keys[] = { "degree", "depth", "parent", NULL };
	const config_setting_t *s = config_setting_get_member(g, "tree"), *ps;
	char err[160];
	int rc;

	j->tree = false;
	if (s == NULL) {
		return 0;
	}
	if (!config_setting_is_group(s)) {
		return pbox_conf_bad(c, s, "must be a group { degree = 2; depth = 3; }");
	}
	j->tree_degree = 2;
	j->tree_depth = 3;
	if ((rc = pbox_conf_only(c, s, keys)) != 0 ||
	    (rc = pbox_conf_u32(c, s, "degree", 1, PBOX_TSB_MAX_DEGREE, &j->tree_degree)) != 0 ||
	    (rc = pbox_conf_u32(c, s, "depth", 1, PBOX_TSB_MAX_DEPTH, &j->tree_depth)) != 0) {
		return rc;
	}
	j->tree_parent = calloc(j->workers, sizeof(*j->tree_parent));
	if (j->tree_parent == NULL) {
		return pbox_conf_bad(c, s, "out of memory");
	}
	ps = config_setting_get_member(s, "parent");
	if (ps == NULL) {
		if (pbox_tsb_tree_build(j->workers, j->tree_degree, j->tree_depth,
					j->tree_parent) != 0) {
			return pbox_conf_bad(
				c, s, "%u workers do not fit a tree of degree %u and depth %u",
				j->workers, j->tree_degree, j->tree_depth);
		}
	} else {
		if ((!config_setting_is_array(ps) && !config_setting_is_list(ps)) ||
		    (uint32_t)config_setting_length(ps) != j->workers) {
			return pbox_conf_bad(c, ps, "must list the parent of each of the %u ranks",
					     j->workers);
		}
		for (uint32_t r = 0; r < j->workers; r++) {
			const config_setting_t *e = config_setting_get_elem(ps, r);
			long long v;

			if (config_setting_type(e) != CONFIG_TYPE_INT &&
			    config_setting_type(e) != CONFIG_TYPE_INT64) {
				return pbox_conf_bad(c, ps, "parent[%u] must be an integer", r);
			}
			v = config_setting_get_int64(e);
			if (v < -1 || v >= (long long)j->workers) {
				return pbox_conf_bad(c, ps, "parent[%u] must be -1 or a rank 0..%u",
						     r, j->workers - 1);
			}
			j->tree_parent[r] = v < 0 ? PBOX_TSB_ROOT : (uint32_t)v;
		}
		if (pbox_tsb_tree_check(j->workers, j->tree_parent, j->tree_degree, j->tree_depth,
					err, sizeof(err)) != 0) {
			return pbox_conf_bad(c, ps, "%s", err);
		}
	}
	j->tree = true;
	return 0;
}

/* The plan's tree if it fits n ranks and its own degree and depth. */
static bool plan_tree(const json_t *plan, uint32_t n, uint32_t *parent)
{
	const json_t *t = json_object_get(plan, "tree"), *pa = json_object_get(t, "parent");
	json_int_t deg = json_integer_value(json_object_get(t, "degree"));
	json_int_t dep = json_integer_value(json_object_get(t, "depth"));
	char err[160];

	if (!json_is_array(pa) || json_array_size(pa) != n || deg < 1 ||
	    deg > PBOX_TSB_MAX_DEGREE || dep < 1 || dep > PBOX_TSB_MAX_DEPTH) {
		return false;
	}
	for (uint32_t r = 0; r < n; r++) {
		const json_t *v = json_array_get(pa, r);
		json_int_t p = json_integer_value(v);

		if (!json_is_integer(v) || p < -1 || p >= (json_int_t)n) {
			return false;
		}
		parent[r] = p < 0 ? PBOX_TSB_ROOT : (uint32_t)p;
	}
	return pbox_tsb_tree_check(n, parent, (uint32_t)deg, (uint32_t)dep, err, sizeof(err)) == 0;
}

int pboxd_tsb_session_tree(const struct pboxd_job_cfg *j, const json_t *plan, uint32_t *parent)
{
	if (!j->tree) {
		return -EINVAL;
	}
	if (plan != NULL && plan_tree(plan, j->workers, parent)) {
		return 1;
	}
	memcpy(parent, j->tree_parent, j->workers * sizeof(*parent));
	return 0;
}

void pboxd_tsb_position(const uint32_t *parent, uint32_t n, uint32_t r,
			const struct pbox_peer *addr, uint64_t revision, struct pbox_tsb_pos *pos)
{
	memset(pos, 0, sizeof(*pos));
	pos->revision = revision;
	pos->parent = parent[r];
	if (parent[r] != PBOX_TSB_ROOT) {
		pos->parent_addr = addr[parent[r]];
	}
	for (uint32_t c = 0; c < n && pos->nchildren < PBOX_TSB_MAX_DEGREE; c++) {
		if (parent[c] == r) {
			pos->child[pos->nchildren] = c;
			pos->child_addr[pos->nchildren++] = addr[c];
		}
	}
}
