/* SPDX-License-Identifier: BSD-3-Clause */
/* pbox-ctrld's status answer and /metrics text (status.h). */
#include "status.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/compiler.h"

static int pboxd_index(const struct ctrld_config *cfg, const char *name)
{
	for (uint32_t i = 0; name != NULL && i < cfg->npboxds; i++) {
		if (strcmp(cfg->pboxds[i].name, name) == 0) {
			return (int)i;
		}
	}
	return -1;
}

/* Ask pboxd w for the status of its jobs (all, or m->job) and attach each answer to the
 * matching job of jobs. */
static void ask_pboxd(const struct ctrld_config *cfg, uint32_t w, json_t *jobs,
		      const struct pbox_statusmsg *m, ctrld_ask_fn ask, void *arg)
{
	struct pbox_statusmsg pm = *m;
	const char *name = cfg->pboxds[w].name;
	json_t *req, *reply = NULL, *j;
	char why[400] = "";
	size_t i;

	pm.admin_token = NULL; /* the pboxd's own token is added by ask */
	req = pbox_statusmsg_encode(&pm);
	if (req == NULL) {
		snprintf(why, sizeof(why), "out of memory");
	} else if (!cfg->pboxds[w].up && cfg->pboxds[w].last_error[0] != '\0') {
		snprintf(why, sizeof(why), "pboxd %s is down: %s", name, cfg->pboxds[w].last_error);
	} else if (ask(arg, w, req, &reply) != 0) {
		snprintf(why, sizeof(why), "pboxd %s: %s", name,
			 cfg->pboxds[w].last_error[0] ? cfg->pboxds[w].last_error : "unreachable");
	} else if (!json_is_true(json_object_get(reply, "ok"))) {
		snprintf(why, sizeof(why), "pboxd %s refused: %s", name,
			 json_string_value(json_object_get(reply, "error")) ?: "(no reason)");
	}
	json_decref(req);
	json_array_foreach(jobs, i, j)
	{
		const json_t *pj;
		size_t k;
		bool found = false;

		if (strcmp(json_string_value(json_object_get(j, "pboxd")) ?: "", name) != 0) {
			continue;
		}
		if (why[0] != '\0') {
			json_object_set_new(j, "status_error", json_string(why));
			continue;
		}
		json_array_foreach(json_object_get(reply, "jobs"), k, pj)
		{
			if (json_equal(json_object_get(pj, "id"), json_object_get(j, "id"))) {
				json_object_set(j, "status", (json_t *)pj);
				found = true;
				break;
			}
		}
		if (!found) {
			json_object_set_new(
				j, "status_error",
				json_sprintf("pboxd %s does not hold the job (yet)", name));
		}
	}
	json_decref(reply);
}

json_t *ctrld_status(const struct ctrld_config *cfg, json_t *list, json_t *bw,
		     const struct pbox_statusmsg *m, ctrld_ask_fn ask, void *arg, int *err)
{
	json_t *jobs = json_array(), *j, *out;
	bool wanted[CTRLD_MAX_PBOXDS] = { false };
	size_t i;

	*err = 0;
	json_array_foreach(json_object_get(list, "jobs"), i, j)
	{
		int w;

		if (m->job >= 0 && json_integer_value(json_object_get(j, "id")) != m->job) {
			continue;
		}
		json_array_append(jobs, j);
		w = pboxd_index(cfg, json_string_value(json_object_get(j, "pboxd")));
		if (w >= 0) {
			wanted[w] = true;
		}
	}
	if (m->job >= 0 && json_array_size(jobs) == 0) {
		json_decref(jobs);
		json_decref(list);
		json_decref(bw);
		*err = ENOENT;
		return NULL;
	}
	for (uint32_t w = 0; w < cfg->npboxds; w++) {
		if (wanted[w]) {
			ask_pboxd(cfg, w, jobs, m, ask, arg);
		}
	}
	/* "bandwidth" taken (s:o): a new empty array without a matrix is not leaked. */
	out = json_pack("{s:b, s:s, s:o, s:O, s:O, s:o}", "ok", 1, "daemon", "pbox-ctrld", "jobs",
			jobs, "pboxds", json_object_get(list, "pboxds"), "control",
			json_object_get(list, "control"), "bandwidth",
			bw != NULL ? json_incref(json_object_get(bw, "pairs")) : json_array());
	json_decref(list);
	json_decref(bw);
	return out;
}

/* ---- metrics ---- */

static void gauge_per(struct pbox_prom *p, const char *name, const char *help, const json_t *arr,
		      const char *label, const char *label_key, const char *key)
{
	const json_t *o;
	size_t i;

	pbox_prom_family(p, name, "gauge", help);
	json_array_foreach(arr, i, o)
	{
		const json_t *lv = json_object_get(o, label_key), *v = json_object_get(o, key);
		char buf[64];

		if (!json_is_number(v) && !json_is_boolean(v)) {
			continue;
		}
		if (json_is_integer(lv)) {
			snprintf(buf, sizeof(buf), "%" JSON_INTEGER_FORMAT, json_integer_value(lv));
		} else {
			snprintf(buf, sizeof(buf), "%s", json_string_value(lv) ?: "");
		}
		pbox_prom_f64(p, name, (pbox_prom_labels){ label, buf, NULL },
			      json_is_boolean(v) ? (double)json_is_true(v) : json_number_value(v));
	}
}

static void bandwidth(struct pbox_prom *p, const json_t *pairs)
{
	static const struct {
		const char *name, *type, *help, *key;
		bool in_estimate;
	} s[] = {
		{ "pbox_ctrld_bandwidth_min_bps", "gauge",
		  "lower end of the available-bandwidth estimate of a probe pair (SLoPS)",
		  "r_min_bps", true },
		{ "pbox_ctrld_bandwidth_max_bps", "gauge",
		  "upper end of the available-bandwidth estimate of a probe pair (SLoPS)",
		  "r_max_bps", true },
		{ "pbox_ctrld_bandwidth_age_seconds", "gauge", "age of a probe pair's estimate",
		  "age_s", false },
		{ "pbox_ctrld_probes_total", "counter", "probes of a pair that gave an estimate",
		  "probes", false },
		{ "pbox_ctrld_probe_failures_total", "counter", "probes of a pair that failed",
		  "failures", false },
	};
	static const char *const states[] = { "pending", "probing", "ok", "failed" };
	const json_t *o;
	size_t i;

	for (size_t k = 0; k < PBOX_ARRAY_SIZE(s); k++) {
		pbox_prom_family(p, s[k].name, s[k].type, s[k].help);
		json_array_foreach(pairs, i, o)
		{
			const json_t *src = s[k].in_estimate ? json_object_get(o, "estimate") : o;
			const json_t *v = json_object_get(src, s[k].key);
			const char *from = json_string_value(json_object_get(o, "from")) ?: "";
			const char *to = json_string_value(json_object_get(o, "to")) ?: "";

			if (json_is_number(v)) {
				pbox_prom_f64(p, s[k].name,
					      (pbox_prom_labels){ "from", from, "to", to, NULL },
					      json_number_value(v));
			}
		}
	}
	pbox_prom_family(p, "pbox_ctrld_probe_state", "gauge", "1 for a probe pair's state");
	json_array_foreach(pairs, i, o)
	{
		const char *st = json_string_value(json_object_get(o, "state")) ?: "";
		const char *from = json_string_value(json_object_get(o, "from")) ?: "";
		const char *to = json_string_value(json_object_get(o, "to")) ?: "";

		for (size_t k = 0; k < PBOX_ARRAY_SIZE(states); k++) {
			pbox_prom_u64(p, "pbox_ctrld_probe_state",
				      (pbox_prom_labels){ "from", from, "to", to, "state",
							  states[k], NULL },
				      strcmp(st, states[k]) == 0);
		}
	}
}

void ctrld_metrics_render(const json_t *list, const json_t *bw, struct pbox_prom *p)
{
	const json_t *jobs = json_object_get(list, "jobs"), *ctl = json_object_get(list, "control");
	const json_t *o, *v;
	const char *key;
	uint64_t published = 0, unplaced = 0, planned = 0;
	size_t i;

	pbox_prom_family(p, "pbox_ctrld_up", "gauge", "1: pbox-ctrld answered this scrape");
	pbox_prom_u64(p, "pbox_ctrld_up", NULL, 1);
	json_array_foreach(jobs, i, o)
	{
		const char *st = json_string_value(json_object_get(o, "state")) ?: "";

		published += strcmp(st, "published") == 0;
		unplaced += strcmp(st, "unplaced") == 0;
		planned += json_is_object(json_object_get(o, "plan"));
	}
	pbox_prom_family(p, "pbox_ctrld_jobs", "gauge", "jobs held by pbox-ctrld, by state");
	pbox_prom_u64(p, "pbox_ctrld_jobs", (pbox_prom_labels){ "state", "published", NULL },
		      published);
	pbox_prom_u64(p, "pbox_ctrld_jobs", (pbox_prom_labels){ "state", "unplaced", NULL },
		      unplaced);
	pbox_prom_family(p, "pbox_ctrld_jobs_with_plan", "gauge",
			 "jobs with a plan (broadcast tree and DVF thresholds)");
	pbox_prom_u64(p, "pbox_ctrld_jobs_with_plan", NULL, planned);
	pbox_prom_family(p, "pbox_ctrld_job_plan_revision", "gauge",
			 "revision of a job's plan (its tree's revision)");
	json_array_foreach(jobs, i, o)
	{
		const json_t *rev = json_object_get(
			json_object_get(json_object_get(o, "plan"), "tree"), "revision");
		char id[32];

		if (!json_is_integer(rev)) {
			continue;
		}
		snprintf(id, sizeof(id), "%" JSON_INTEGER_FORMAT,
			 json_integer_value(json_object_get(o, "id")));
		pbox_prom_u64(p, "pbox_ctrld_job_plan_revision",
			      (pbox_prom_labels){ "job", id, NULL },
			      (uint64_t)json_integer_value(rev));
	}
	gauge_per(p, "pbox_ctrld_pboxd_up", "1 if the managed pboxd answered its last request",
		  json_object_get(list, "pboxds"), "pboxd", "name", "up");
	gauge_per(p, "pbox_ctrld_pboxd_jobs", "jobs pbox-ctrld assigned to the pboxd",
		  json_object_get(list, "pboxds"), "pboxd", "name", "jobs");
	json_object_foreach((json_t *)ctl, key, v)
	{
		char name[128], help[160];
		bool gauge = strcmp(key, "connections") == 0;

		if (!json_is_integer(v)) {
			continue;
		}
		snprintf(name, sizeof(name), gauge ? "pbox_ctrld_%s" : "pbox_ctrld_%s_total", key);
		snprintf(help, sizeof(help), "pbox-ctrld control counter: %s (job_list's control)",
			 key);
		pbox_prom_family(p, name, gauge ? "gauge" : "counter", help);
		pbox_prom_u64(p, name, NULL, (uint64_t)json_integer_value(v));
	}
	bandwidth(p, json_object_get(bw, "pairs"));
}
