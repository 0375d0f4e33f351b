/* SPDX-License-Identifier: BSD-3-Clause */
/* pboxd's /metrics text, from its stats object (metrics.h). */
#include "metrics.h"

#include <stdio.h>
#include <string.h>

#include "common/compiler.h"
#include "jobstatus.h"

/* Members of a stats object that are not counters of their own. */
static bool skipped(const char *key)
{
	return strcmp(key, "core") == 0 || strcmp(key, "cpu") == 0 || strcmp(key, "drops") == 0 ||
	       strcmp(key, "busy_pct") == 0;
}

/* Members of the control object that are levels, not counts. */
static bool gauge_key(const char *key)
{
	return strcmp(key, "connections") == 0 || strcmp(key, "unauthenticated") == 0 ||
	       strcmp(key, "max_connections") == 0 || strcmp(key, "peak_connections") == 0;
}

/* Every integer member of each object of arr (or of obj alone, arr NULL) as the counter
 * <prefix>_<key>_total, labelled label=<the object's label_key> (or unlabelled). One
 * family per key: the keys of the first object decide. */
static void counters(struct pbox_prom *p, const char *prefix, const char *what, const json_t *arr,
		     const json_t *obj, const char *label, const char *label_key)
{
	const json_t *first = arr != NULL ? json_array_get(arr, 0) : obj, *v, *o;
	const char *key;
	size_t i;

	if (!json_is_object(first)) {
		return;
	}
	json_object_foreach((json_t *)first, key, v)
	{
		char name[160], help[256];

		if (!json_is_integer(v) || skipped(key)) {
			continue;
		}
		snprintf(name, sizeof(name), gauge_key(key) ? "%s_%s" : "%s_%s_total", prefix, key);
		snprintf(help, sizeof(help), "%s: %s (as `pbox stats` shows it)", what, key);
		pbox_prom_family(p, name, gauge_key(key) ? "gauge" : "counter", help);
		if (arr == NULL) {
			pbox_prom_u64(p, name, NULL, (uint64_t)json_integer_value(v));
			continue;
		}
		json_array_foreach(arr, i, o)
		{
			char lv[32];
			const json_t *x = json_object_get(o, key);

			if (!json_is_integer(x)) {
				continue;
			}
			snprintf(lv, sizeof(lv), "%" JSON_INTEGER_FORMAT,
				 json_integer_value(json_object_get(o, label_key)));
			pbox_prom_u64(p, name, (pbox_prom_labels){ label, lv, NULL },
				      (uint64_t)json_integer_value(x));
		}
	}
}

static void cores(struct pbox_prom *p, const json_t *arr)
{
	const json_t *o, *v;
	const char *reason;
	size_t i;

	counters(p, "pboxd_core", "data-plane core counter", arr, NULL, "core", "core");
	pbox_prom_family(p, "pboxd_core_drops_total", "counter",
			 "datagrams dropped by a data-plane core, by reason (include/pbox/wire.h)");
	json_array_foreach(arr, i, o)
	{
		char core[32];

		snprintf(core, sizeof(core), "%" JSON_INTEGER_FORMAT,
			 json_integer_value(json_object_get(o, "core")));
		json_object_foreach(json_object_get(o, "drops"), reason, v)
		{
			pbox_prom_u64(p, "pboxd_core_drops_total",
				      (pbox_prom_labels){ "core", core, "reason", reason, NULL },
				      (uint64_t)json_integer_value(v));
		}
	}
	/* DVF counters (`dvf` object of each core, jobs with a dvf group): one family per
	 * integer member, pboxd_core_dvf_<member>_total{core}. */
	{
		json_t *dv = json_array();

		json_array_foreach(arr, i, o)
		{
			const json_t *d = json_object_get(o, "dvf");
			json_t *c;

			if (dv == NULL || !json_is_object(d) ||
			    (c = json_copy((json_t *)d)) == NULL) {
				continue;
			}
			json_object_set(c, "core", json_object_get(o, "core"));
			json_array_append_new(dv, c);
		}
		if (json_array_size(dv) > 0) {
			counters(p, "pboxd_core_dvf", "data-plane core DVF counter", dv, NULL,
				 "core", "core");
		}
		json_decref(dv);
	}
	pbox_prom_family(p, "pboxd_core_busy_ratio", "gauge",
			 "share of a data-plane core's cycles spent in polls that did work");
	json_array_foreach(arr, i, o)
	{
		char core[32];

		snprintf(core, sizeof(core), "%" JSON_INTEGER_FORMAT,
			 json_integer_value(json_object_get(o, "core")));
		pbox_prom_f64(p, "pboxd_core_busy_ratio", (pbox_prom_labels){ "core", core, NULL },
			      json_number_value(json_object_get(o, "busy_pct")) / 100.0);
	}
}

static void jobs(struct pbox_prom *p, const json_t *arr)
{
	static const struct {
		const char *key, *name, *help;
	} g[] = {
		{ "workers", "pboxd_job_workers", "ranks the job has" },
		{ "connected", "pboxd_job_connected", "ranks with a control connection" },
		{ "registered", "pboxd_job_registered", "ranks registered in the session" },
		{ "live", "pboxd_job_live", "ranks counted as members of the running session" },
		{ "version_min", "pboxd_job_version_min", "lowest chunk version (iteration)" },
		{ "version_max", "pboxd_job_version_max", "highest chunk version (iteration)" },
		{ "chunks", "pboxd_job_chunks", "chunks of the session's key set" },
		{ "bytes", "pboxd_job_bytes", "parameter bytes of the session's key set" },
		{ "state_bytes", "pboxd_job_state_bytes",
		  "chunk state bytes charged to the budget" },
		{ "pulls_waiting", "pboxd_job_pulls_waiting", "pulls held for a later version" },
		{ "waiting_chunks", "pboxd_job_waiting_chunks",
		  "chunks some ranks completed the current iteration of while others have not "
		  "(pbox status names the missing ranks)" },
		{ "changing_chunks", "pboxd_job_changing_chunks",
		  "chunks that advanced while being read" },
		{ "scanned_chunks", "pboxd_job_scanned_chunks",
		  "chunks read for this rendering (fewer than chunks when the time bound cut the "
		  "scan short)" },
	};
	static const char *const states[] = { "idle", "active", "aborted", "starting" };
	const json_t *o, *v;
	size_t i;

	for (size_t k = 0; k < PBOX_ARRAY_SIZE(g); k++) {
		pbox_prom_family(p, g[k].name, "gauge", g[k].help);
		json_array_foreach(arr, i, o)
		{
			char id[32];

			v = json_object_get(o, g[k].key);
			if (!json_is_integer(v)) {
				continue;
			}
			snprintf(id, sizeof(id), "%" JSON_INTEGER_FORMAT,
				 json_integer_value(json_object_get(o, "id")));
			pbox_prom_u64(p, g[k].name, (pbox_prom_labels){ "job", id, NULL },
				      (uint64_t)json_integer_value(v));
		}
	}
	pbox_prom_family(p, "pboxd_job_progress_age_seconds", "gauge",
			 "seconds since a chunk of the job last advanced (while it has a session)");
	json_array_foreach(arr, i, o)
	{
		char id[32];

		v = json_object_get(o, "progress_ms_ago");
		if (!json_is_integer(v)) {
			continue;
		}
		snprintf(id, sizeof(id), "%" JSON_INTEGER_FORMAT,
			 json_integer_value(json_object_get(o, "id")));
		pbox_prom_f64(p, "pboxd_job_progress_age_seconds",
			      (pbox_prom_labels){ "job", id, NULL },
			      (double)json_integer_value(v) / 1000.0);
	}
	pbox_prom_family(p, "pboxd_job_state", "gauge", "1 for the job's session state");
	json_array_foreach(arr, i, o)
	{
		const char *st = json_string_value(json_object_get(o, "state"));
		char id[32];

		snprintf(id, sizeof(id), "%" JSON_INTEGER_FORMAT,
			 json_integer_value(json_object_get(o, "id")));
		for (size_t k = 0; k < PBOX_ARRAY_SIZE(states); k++) {
			pbox_prom_u64(p, "pboxd_job_state",
				      (pbox_prom_labels){ "job", id, "state", states[k], NULL },
				      st != NULL && strcmp(st, states[k]) == 0);
		}
	}
}

/* pboxd's descriptor budget (fdbudget.h, the control object's "fds"): gauges of the limit,
 * what is free and what each class holds; refusals per class. */
static void fds(struct pbox_prom *p, const json_t *f)
{
	const json_t *held = json_object_get(f, "held"), *refused = json_object_get(f, "refused");
	const json_t *v;
	const char *key;

	if (!json_is_object(f) || json_integer_value(json_object_get(f, "limit")) < 0) {
		return;
	}
	pbox_prom_family(p, "pboxd_fds_limit", "gauge", "open-file limit (RLIMIT_NOFILE, soft)");
	pbox_prom_u64(p, "pboxd_fds_limit", NULL,
		      (uint64_t)json_integer_value(json_object_get(f, "limit")));
	pbox_prom_family(p, "pboxd_fds_free", "gauge",
			 "descriptors of pboxd's budget free (limit less the reserve and holders)");
	pbox_prom_u64(p, "pboxd_fds_free", NULL,
		      (uint64_t)json_integer_value(json_object_get(f, "free")));
	pbox_prom_family(p, "pboxd_fds_held", "gauge", "descriptors held, by class of holder");
	json_object_foreach((json_t *)held, key, v)
	{
		pbox_prom_u64(p, "pboxd_fds_held", (pbox_prom_labels){ "class", key, NULL },
			      (uint64_t)json_integer_value(v));
	}
	pbox_prom_family(p, "pboxd_fds_refused_total", "counter",
			 "holders refused for want of descriptors in the budget, by class");
	json_object_foreach((json_t *)refused, key, v)
	{
		pbox_prom_u64(p, "pboxd_fds_refused_total",
			      (pbox_prom_labels){ "class", key, NULL },
			      (uint64_t)json_integer_value(v));
	}
}

void pboxd_metrics_render(void *arg, struct pbox_prom *p)
{
	struct pboxd_metrics_src *src = arg;
	json_t *st = src->stats(src->stats_arg);
	json_t *js = pboxd_jobstatus_metrics(src->sessions, pboxd_now_ms());

	pbox_prom_family(p, "pboxd_up", "gauge", "1: pboxd answered this scrape");
	pbox_prom_u64(p, "pboxd_up", NULL, 1);
	if (st != NULL) {
		cores(p, json_object_get(st, "cores"));
		counters(p, "pboxd_control", "control channel counter", NULL,
			 json_object_get(st, "control"), NULL, NULL);
		fds(p, json_object_get(json_object_get(st, "control"), "fds"));
		counters(p, "pboxd_lifetime", "data-plane memory lifetime counter", NULL,
			 json_object_get(st, "lifetime"), NULL, NULL);
		counters(p, "pboxd_probe", "probe agent counter", NULL,
			 json_object_get(st, "probe"), NULL, NULL);
	}
	if (js != NULL) {
		jobs(p, js);
	}
	json_decref(st);
	json_decref(js);
}
