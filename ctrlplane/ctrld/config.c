/* SPDX-License-Identifier: BSD-3-Clause */
/* pbox-ctrld's configuration file (see ctrld.h). */
#include <errno.h>
#include <libconfig.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/confkit.h"
#include "common/hostport.h"
#include "common/jobspec.h"
#include "agent.h"
#include "probe_wire.h"
#include "ctrld.h"
#include "pboxd/config.h"

int ctrld_job_validate(const json_t *desc, char *err, size_t errlen)
{
	struct pboxd_config defaults;
	struct pboxd_job_cfg jc;
	int rc;

	pboxd_config_defaults(&defaults);
	rc = pboxd_job_cfg_from_json(&defaults, desc, &jc, err, errlen);
	if (rc == 0) {
		pboxd_job_cfg_free(&jc);
	}
	pboxd_config_free(&defaults);
	return rc;
}

static int load_pboxds(struct pbox_confkit *ck, struct ctrld_config *cfg, const config_setting_t *l)
{
	static const char *const keys[] = { "name", "control", "admin_token", NULL };

	if (!config_setting_is_list(l) || config_setting_length(l) < 1 ||
	    (unsigned)config_setting_length(l) > CTRLD_MAX_PBOXDS) {
		return pbox_conf_bad(ck, l,
				     "must be a list of 1..%u groups ( { name = ...; control = "
				     "...; } )",
				     CTRLD_MAX_PBOXDS);
	}
	for (int i = 0; i < config_setting_length(l); i++) {
		const config_setting_t *g = config_setting_get_elem(l, (unsigned)i), *where;
		struct ctrld_pboxd *p = &cfg->pboxds[i];
		int rc;

		if (!config_setting_is_group(g)) {
			return pbox_conf_bad(ck, g, "each pboxd must be a group");
		}
		if ((rc = pbox_conf_only(ck, g, keys)) != 0 ||
		    (rc = pbox_conf_str(ck, g, "name", p->name, sizeof(p->name), NULL)) != 0 ||
		    (rc = pbox_conf_str(ck, g, "control", p->control, sizeof(p->control),
					&where)) != 0 ||
		    (rc = pbox_conf_str(ck, g, "admin_token", p->admin_token,
					sizeof(p->admin_token), NULL)) != 0) {
			return rc;
		}
		if (p->control[0] == '\0') {
			return pbox_conf_bad(ck, where ? where : g,
					     "each pboxd needs its control address (host:port) or "
					     "Unix control socket");
		}
		if (p->name[0] == '\0') {
			snprintf(p->name, sizeof(p->name), "%s", p->control);
		}
		for (int k = 0; k < i; k++) {
			if (strcmp(cfg->pboxds[k].name, p->name) == 0) {
				return pbox_conf_bad(ck, g, "pboxd name '%s' given twice", p->name);
			}
		}
		cfg->npboxds = (uint32_t)i + 1;
	}
	return 0;
}

static int add_pair(struct pbox_confkit *ck, struct ctrld_config *cfg, const config_setting_t *s,
		    uint32_t from, const char *to)
{
	struct ctrld_bw_cfg *bc = &cfg->bw;
	struct sockaddr_storage ss;
	socklen_t len;

	if (pbox_probe_parse_numeric_addr(to, PBOX_PROBE_PORT, &ss, &len) != 0 ||
	    strlen(to) >= sizeof(bc->pairs[0].to)) {
		return pbox_conf_bad(ck, s,
				     "'%s': expected a numeric ADDRESS[:PORT] of a responder", to);
	}
	for (uint32_t i = 0; i < bc->npairs; i++) {
		if (bc->pairs[i].from_idx == from && strcmp(bc->pairs[i].to, to) == 0) {
			return pbox_conf_bad(ck, s, "pair %s -> %s given twice",
					     cfg->pboxds[from].name, to);
		}
	}
	if (bc->npairs == CTRLD_BW_MAX_PAIRS) {
		return pbox_conf_bad(ck, s, "more than %u probe pairs", CTRLD_BW_MAX_PAIRS);
	}
	bc->pairs[bc->npairs].from_idx = from;
	snprintf(bc->pairs[bc->npairs].from, sizeof(bc->pairs[0].from), "%s",
		 cfg->pboxds[from].name);
	snprintf(bc->pairs[bc->npairs].to, sizeof(bc->pairs[0].to), "%s", to);
	bc->npairs++;
	return 0;
}

/* The bandwidth = { ... } group (after the pboxds: pairs name them). */
static int load_bw(struct pbox_confkit *ck, struct ctrld_config *cfg, const config_setting_t *g)
{
	static const char *const keys[] = { "interval", "cap",  "budget", "pairs",
					    "all_to",   "jobs", NULL };
	static const char *const pkeys[] = { "from", "to", NULL };
	struct ctrld_bw_cfg *bc = &cfg->bw;
	const config_setting_t *where, *l;
	char rate[32];
	int rc;

	if (!config_setting_is_group(g)) {
		return pbox_conf_bad(ck, g, "must be a group { pairs = ( ... ); ... }");
	}
	if ((rc = pbox_conf_only(ck, g, keys)) != 0 ||
	    (rc = pbox_conf_u32(ck, g, "interval", 0, 86400 * 7, &bc->interval_s)) != 0 ||
	    (rc = pbox_conf_u32(ck, g, "budget", 1, 3600, &bc->budget_s)) != 0 ||
	    (rc = pbox_conf_str(ck, g, "cap", rate, sizeof(rate), &where)) != 0) {
		return rc;
	}
	if (config_setting_get_member(g, "jobs") != NULL) { /* bw.h: the jobs' own pairs */
		if (config_setting_type(config_setting_get_member(g, "jobs")) != CONFIG_TYPE_BOOL) {
			return pbox_conf_bad(ck, config_setting_get_member(g, "jobs"),
					     "must be true or false");
		}
		bc->jobs = config_setting_get_bool(config_setting_get_member(g, "jobs"));
	}
	if (where != NULL && !pboxd_parse_rate(rate, &bc->cap_bps)) {
		return pbox_conf_bad(ck, where,
				     "expected a rate from 2mbit to 1000gbit (e.g. \"1gbit\")");
	}
	bc->pairs = calloc(CTRLD_BW_MAX_PAIRS, sizeof(*bc->pairs));
	if (bc->pairs == NULL) {
		return pbox_conf_bad(ck, g, "out of memory");
	}
	l = config_setting_get_member(g, "pairs");
	if (l != NULL && !config_setting_is_list(l)) {
		return pbox_conf_bad(ck, l, "must be a list ( { from = \"a\"; to = \"ADDR\"; } )");
	}
	for (int i = 0; l != NULL && i < config_setting_length(l); i++) {
		const config_setting_t *p = config_setting_get_elem(l, (unsigned)i);
		char from[64] = "", to[128] = "";
		uint32_t w;

		if (!config_setting_is_group(p)) {
			return pbox_conf_bad(ck, p, "each pair must be a group { from; to; }");
		}
		if ((rc = pbox_conf_only(ck, p, pkeys)) != 0 ||
		    (rc = pbox_conf_str(ck, p, "from", from, sizeof(from), NULL)) != 0 ||
		    (rc = pbox_conf_str(ck, p, "to", to, sizeof(to), NULL)) != 0) {
			return rc;
		}
		for (w = 0; w < cfg->npboxds && strcmp(cfg->pboxds[w].name, from) != 0; w++) {
		}
		if (w == cfg->npboxds) {
			return pbox_conf_bad(ck, p, "from '%s': not the name of a managed pboxd",
					     from);
		}
		if ((rc = add_pair(ck, cfg, p, w, to)) != 0) {
			return rc;
		}
	}
	l = config_setting_get_member(g, "all_to");
	if (l != NULL && !config_setting_is_array(l)) {
		return pbox_conf_bad(ck, l, "must be an array of addresses [ \"ADDR:PORT\", ... ]");
	}
	for (int i = 0; l != NULL && i < config_setting_length(l); i++) {
		const config_setting_t *e = config_setting_get_elem(l, (unsigned)i);
		const char *to = config_setting_get_string(e);

		if (to == NULL) {
			return pbox_conf_bad(ck, e, "each entry must be a string \"ADDR:PORT\"");
		}
		for (uint32_t w = 0; w < cfg->npboxds; w++) {
			if ((rc = add_pair(ck, cfg, e, w, to)) != 0) {
				return rc;
			}
		}
	}
	if (bc->npairs == 0 && !bc->jobs) {
		return pbox_conf_bad(ck, g, "no probe pairs (pairs, all_to or jobs = true)");
	}
	return 0;
}

int ctrld_config_load(struct ctrld_config *cfg, const char *path, char *err, size_t errlen)
{
	static const char *const top[] = { "ctrld", "pboxds",  "jobs", "bandwidth",
					   "plan",  "metrics", NULL };
	static const char *const log_formats[] = { "text", "json", NULL };
	static const char *const ckeys[] = { "listen",
					     "control_socket",
					     "admin_token",
					     "reconcile_interval",
					     "request_timeout",
					     "max_connections",
					     "max_per_address",
					     "auth_failures_burst",
					     "auth_failures_per_minute",
					     "state_file",
					     "max_unauth",
					     "unauth_timeout",
					     "max_output_bytes",
					     "log_format",
					     NULL };
	struct pbox_confkit ck = { .file = path, .err = err, .errlen = errlen };
	const config_setting_t *root, *c, *l, *where = NULL;
	char listen[128] = "127.0.0.1:7300", msg[512];
	config_t lc;
	int rc = 0;

	memset(cfg, 0, sizeof(*cfg));
	snprintf(cfg->path, sizeof(cfg->path), "%s", path);
	cfg->reconcile_ms = 1000;
	cfg->request_timeout_ms = 5000;
	cfg->max_connections = 256;
	cfg->max_per_address = 64;
	cfg->auth_failures_burst = 10;
	cfg->auth_failures_per_minute = 60;
	cfg->max_unauth = 64;
	cfg->unauth_timeout_ms = 10000;
	cfg->max_output_bytes = 16u << 20;
	cfg->jobs = json_array();
	cfg->bw.interval_s = 300;
	cfg->bw.cap_bps = 1e9;
	cfg->bw.budget_s = 10;
	ctrld_plan_defaults(&cfg->plan);
	cfg->log_format = -1;
	pbox_metrics_cfg_defaults(&cfg->metrics, PBOX_METRICS_PORT_CTRLD);
	config_init(&lc);
	if (config_read_file(&lc, path) != CONFIG_TRUE) {
		rc = config_error_type(&lc) == CONFIG_ERR_FILE_IO ? -ENOENT : -EINVAL;
		snprintf(err, errlen, "%s:%d: %s", path, config_error_line(&lc),
			 config_error_text(&lc));
		goto out;
	}
	root = config_root_setting(&lc);
	if ((rc = pbox_conf_only(&ck, root, top)) != 0) {
		goto out;
	}
	c = config_setting_get_member(root, "ctrld");
	if (c != NULL) {
		if (!config_setting_is_group(c)) {
			rc = pbox_conf_bad(&ck, c, "must be a group { listen = ...; ... }");
			goto out;
		}
		if ((rc = pbox_conf_only(&ck, c, ckeys)) != 0 ||
		    (rc = pbox_conf_str(&ck, c, "listen", listen, sizeof(listen), &where)) != 0 ||
		    (rc = pbox_conf_str(&ck, c, "control_socket", cfg->control_socket,
					sizeof(cfg->control_socket), NULL)) != 0 ||
		    (rc = pbox_conf_str(&ck, c, "admin_token", cfg->admin_token,
					sizeof(cfg->admin_token), NULL)) != 0 ||
		    (rc = pbox_conf_u32(&ck, c, "reconcile_interval", 10, 3600000,
					&cfg->reconcile_ms)) != 0 ||
		    (rc = pbox_conf_u32(&ck, c, "request_timeout", 10, 600000,
					&cfg->request_timeout_ms)) != 0 ||
		    (rc = pbox_conf_u32(&ck, c, "max_connections", 1, 65536,
					&cfg->max_connections)) != 0 ||
		    (rc = pbox_conf_u32(&ck, c, "max_per_address", 1, 65536,
					&cfg->max_per_address)) != 0 ||
		    (rc = pbox_conf_u32(&ck, c, "auth_failures_burst", 1, 1000000,
					&cfg->auth_failures_burst)) != 0 ||
		    (rc = pbox_conf_u32(&ck, c, "auth_failures_per_minute", 1, 1000000,
					&cfg->auth_failures_per_minute)) != 0 ||
		    (rc = pbox_conf_str(&ck, c, "state_file", cfg->state_file,
					sizeof(cfg->state_file), NULL)) != 0 ||
		    (rc = pbox_conf_u32(&ck, c, "max_unauth", 1, 65536, &cfg->max_unauth)) != 0 ||
		    (rc = pbox_conf_u32(&ck, c, "unauth_timeout", 100, 600000,
					&cfg->unauth_timeout_ms)) != 0 ||
		    (rc = pbox_conf_u32(&ck, c, "max_output_bytes", 65536, 1u << 30,
					&cfg->max_output_bytes)) != 0 ||
		    (rc = pbox_conf_choice(&ck, c, "log_format", "log format", log_formats,
					   &cfg->log_format)) != 0) {
			goto out;
		}
	}
	if ((rc = pbox_metrics_cfg_load(&ck, config_setting_get_member(root, "metrics"),
					&cfg->metrics)) != 0) {
		goto out;
	}
	if (pbox_hostport_split(listen, false, 0, cfg->listen_host, sizeof(cfg->listen_host),
				&cfg->listen_port) != 0) {
		rc = pbox_conf_bad(&ck, where ? where : root, "expected HOST:PORT (got '%s')",
				   listen);
		goto out;
	}
	l = config_setting_get_member(root, "pboxds");
	if (l == NULL) {
		snprintf(err, errlen,
			 "%s: pboxds: pbox-ctrld needs the pboxds it manages: pboxds = ( { name = "
			 "\"a\"; control = \"127.0.0.1:7000\"; admin_token = \"...\"; } )",
			 path);
		rc = -EINVAL;
		goto out;
	}
	if ((rc = load_pboxds(&ck, cfg, l)) != 0) {
		goto out;
	}
	l = config_setting_get_member(root, "bandwidth");
	if (l != NULL && (rc = load_bw(&ck, cfg, l)) != 0) {
		goto out;
	}
	l = config_setting_get_member(root, "plan");
	if (l != NULL && (rc = ctrld_plan_load(&ck, &cfg->plan, l)) != 0) {
		goto out;
	}
	l = config_setting_get_member(root, "jobs");
	if (l != NULL) {
		if (!config_setting_is_list(l)) {
			rc = pbox_conf_bad(&ck, l, "must be a list of job groups: ( { ... } )");
			goto out;
		}
		for (int i = 0; i < config_setting_length(l); i++) {
			const config_setting_t *g = config_setting_get_elem(l, (unsigned)i);
			json_t *desc = pbox_jobspec_from_setting(g);
			uint32_t id;
			size_t k;
			json_t *o;

			if (desc == NULL || !json_is_object(desc)) {
				json_decref(desc);
				rc = pbox_conf_bad(&ck, g, "each job must be a group");
				goto out;
			}
			if (ctrld_job_validate(desc, msg, sizeof(msg)) != 0) {
				json_decref(desc);
				rc = pbox_conf_bad(&ck, g, "%s", msg);
				goto out;
			}
			(void)pbox_jobspec_id(desc, &id);
			json_array_foreach(cfg->jobs, k, o)
			{
				uint32_t other;

				(void)pbox_jobspec_id(o, &other);
				if (other == id) {
					json_decref(desc);
					rc = pbox_conf_bad(&ck, g, "job id %u is defined twice",
							   id);
					goto out;
				}
			}
			json_array_append_new(cfg->jobs, desc);
		}
	}
out:
	config_destroy(&lc);
	if (rc != 0) {
		ctrld_config_free(cfg);
	}
	return rc;
}

void ctrld_config_free(struct ctrld_config *cfg)
{
	json_decref(cfg->jobs);
	cfg->jobs = NULL;
	free(cfg->bw.pairs);
	cfg->bw.pairs = NULL;
	cfg->bw.npairs = 0;
	ctrld_plan_free(&cfg->plan);
}
