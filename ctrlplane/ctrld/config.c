/* SPDX-License-Identifier: BSD-3-Clause */
/* pbox-ctrld's configuration file (see ctrld.h). */
#include <errno.h>
#include <libconfig.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jobspec.h"
#include "ctrld.h"
#include "pboxd/config.h"

static int bad(char *err, size_t errlen, const char *file, const config_setting_t *s,
	       const char *what, const char *msg)
{
	snprintf(err, errlen, "%s:%u: %s: %s", file, s ? config_setting_source_line(s) : 0, what,
		 msg);
	return -EINVAL;
}

/* A string member of g into out (absent: left alone). */
static int get_str(const config_setting_t *g, const char *name, char *out, size_t len,
		   const char *file, char *err, size_t errlen)
{
	const config_setting_t *s = config_setting_get_member(g, name);

	if (s == NULL) {
		return 0;
	}
	if (config_setting_type(s) != CONFIG_TYPE_STRING ||
	    strlen(config_setting_get_string(s)) >= len) {
		return bad(err, errlen, file, s, name, "must be a string (not too long)");
	}
	snprintf(out, len, "%s", config_setting_get_string(s));
	return 0;
}

static int get_u32(const config_setting_t *g, const char *name, uint32_t lo, uint32_t hi,
		   uint32_t *out, const char *file, char *err, size_t errlen)
{
	const config_setting_t *s = config_setting_get_member(g, name);
	char msg[96];
	long long v;

	if (s == NULL) {
		return 0;
	}
	if (config_setting_type(s) != CONFIG_TYPE_INT &&
	    config_setting_type(s) != CONFIG_TYPE_INT64) {
		return bad(err, errlen, file, s, name, "must be an integer");
	}
	v = config_setting_get_int64(s);
	if (v < lo || v > hi) {
		snprintf(msg, sizeof(msg), "must be between %u and %u (got %lld)", lo, hi, v);
		return bad(err, errlen, file, s, name, msg);
	}
	*out = (uint32_t)v;
	return 0;
}

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

static int load_pboxds(struct ctrld_config *cfg, const config_setting_t *l, char *err,
		       size_t errlen)
{
	static const char *const keys[] = { "name", "control", "admin_token", NULL };

	if (!config_setting_is_list(l) || config_setting_length(l) < 1 ||
	    (unsigned)config_setting_length(l) > CTRLD_MAX_PBOXDS) {
		return bad(err, errlen, cfg->path, l, "pboxds",
			   "must be a list of 1..64 groups ( { name = ...; control = ...; } )");
	}
	for (int i = 0; i < config_setting_length(l); i++) {
		const config_setting_t *g = config_setting_get_elem(l, (unsigned)i);
		struct ctrld_pboxd *p = &cfg->pboxds[i];
		int rc;

		if (!config_setting_is_group(g)) {
			return bad(err, errlen, cfg->path, g, "pboxds", "each must be a group");
		}
		for (int k = 0; k < config_setting_length(g); k++) {
			const char *n =
				config_setting_name(config_setting_get_elem(g, (unsigned)k));
			bool ok = false;

			for (const char *const *a = keys; *a != NULL; a++) {
				ok |= strcmp(*a, n) == 0;
			}
			if (!ok) {
				return bad(err, errlen, cfg->path, g, n,
					   "unknown setting of a pboxd (name, control, "
					   "admin_token)");
			}
		}
		if ((rc = get_str(g, "name", p->name, sizeof(p->name), cfg->path, err, errlen)) !=
			    0 ||
		    (rc = get_str(g, "control", p->control, sizeof(p->control), cfg->path, err,
				  errlen)) != 0 ||
		    (rc = get_str(g, "admin_token", p->admin_token, sizeof(p->admin_token),
				  cfg->path, err, errlen)) != 0) {
			return rc;
		}
		if (p->control[0] == '\0') {
			return bad(err, errlen, cfg->path, g, "control",
				   "each pboxd needs its control address (host:port) or Unix "
				   "control socket");
		}
		if (p->name[0] == '\0') {
			snprintf(p->name, sizeof(p->name), "%s", p->control);
		}
		for (int k = 0; k < i; k++) {
			if (strcmp(cfg->pboxds[k].name, p->name) == 0) {
				return bad(err, errlen, cfg->path, g, "name", "given twice");
			}
		}
		cfg->npboxds = (uint32_t)i + 1;
	}
	return 0;
}

int ctrld_config_load(struct ctrld_config *cfg, const char *path, char *err, size_t errlen)
{
	static const char *const top[] = { "ctrld", "pboxds", "jobs", NULL };
	const config_setting_t *root, *c, *l;
	char listen[128] = "127.0.0.1:7300", msg[512];
	config_t lc;
	int rc = 0;

	memset(cfg, 0, sizeof(*cfg));
	snprintf(cfg->path, sizeof(cfg->path), "%s", path);
	cfg->reconcile_ms = 1000;
	cfg->request_timeout_ms = 5000;
	cfg->max_connections = 256;
	cfg->jobs = json_array();
	config_init(&lc);
	if (config_read_file(&lc, path) != CONFIG_TRUE) {
		rc = config_error_type(&lc) == CONFIG_ERR_FILE_IO ? -ENOENT : -EINVAL;
		snprintf(err, errlen, "%s:%d: %s", path, config_error_line(&lc),
			 config_error_text(&lc));
		goto out;
	}
	root = config_root_setting(&lc);
	for (int i = 0; i < config_setting_length(root); i++) {
		const char *n = config_setting_name(config_setting_get_elem(root, (unsigned)i));
		bool ok = false;

		for (const char *const *a = top; *a != NULL; a++) {
			ok |= strcmp(*a, n) == 0;
		}
		if (!ok) {
			rc = bad(err, errlen, path, config_setting_get_elem(root, (unsigned)i), n,
				 "unknown setting (ctrld, pboxds, jobs)");
			goto out;
		}
	}
	c = config_setting_get_member(root, "ctrld");
	if (c != NULL) {
		if ((rc = get_str(c, "listen", listen, sizeof(listen), path, err, errlen)) != 0 ||
		    (rc = get_str(c, "control_socket", cfg->control_socket,
				  sizeof(cfg->control_socket), path, err, errlen)) != 0 ||
		    (rc = get_str(c, "admin_token", cfg->admin_token, sizeof(cfg->admin_token),
				  path, err, errlen)) != 0 ||
		    (rc = get_u32(c, "reconcile_interval", 10, 3600000, &cfg->reconcile_ms, path,
				  err, errlen)) != 0 ||
		    (rc = get_u32(c, "request_timeout", 10, 600000, &cfg->request_timeout_ms, path,
				  err, errlen)) != 0 ||
		    (rc = get_u32(c, "max_connections", 1, 65536, &cfg->max_connections, path, err,
				  errlen)) != 0) {
			goto out;
		}
	}
	if (pboxd_parse_hostport(listen, cfg->listen_host, sizeof(cfg->listen_host),
				 &cfg->listen_port) != 0) {
		rc = bad(err, errlen, path, c, "ctrld.listen", "expected HOST:PORT");
		goto out;
	}
	l = config_setting_get_member(root, "pboxds");
	if (l == NULL) {
		rc = bad(err, errlen, path, root, "pboxds",
			 "pbox-ctrld needs the pboxds it manages: pboxds = ( { name = \"a\"; "
			 "control = \"127.0.0.1:7000\"; admin_token = \"...\"; } )");
		goto out;
	}
	if ((rc = load_pboxds(cfg, l, err, errlen)) != 0) {
		goto out;
	}
	l = config_setting_get_member(root, "jobs");
	if (l != NULL) {
		if (!config_setting_is_list(l)) {
			rc = bad(err, errlen, path, l, "jobs", "must be a list of job groups");
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
				rc = bad(err, errlen, path, g, "jobs", "each job must be a group");
				goto out;
			}
			if (ctrld_job_validate(desc, msg, sizeof(msg)) != 0) {
				json_decref(desc);
				rc = bad(err, errlen, path, g, "jobs", msg);
				goto out;
			}
			(void)pbox_jobspec_id(desc, &id);
			json_array_foreach(cfg->jobs, k, o)
			{
				uint32_t other;

				(void)pbox_jobspec_id(o, &other);
				if (other == id) {
					json_decref(desc);
					snprintf(msg, sizeof(msg), "job id %u is defined twice",
						 id);
					rc = bad(err, errlen, path, g, "jobs", msg);
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
}
