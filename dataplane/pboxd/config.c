/* SPDX-License-Identifier: BSD-3-Clause */
/* pboxd configuration file: libconfig parsing and validation (see config.h). */
#include "config.h"
#include "tsbd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <libconfig.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/compiler.h"
#include "common/hostport.h"
#include "common/confkit.h"
#include "common/jobspec.h"
#include "dvf/dvf_job.h"

int pboxd_parse_bytes(const char *s, uint64_t *out)
{
	static const char units[] = "KMGT";
	unsigned long long v;
	const char *u;
	char *end;
	unsigned shift = 0;

	if (s[0] < '0' || s[0] > '9') {
		return -EINVAL;
	}
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno != 0 || v == 0) {
		return -EINVAL;
	}
	if (*end != '\0') {
		u = strchr(units, *end >= 'a' ? *end - 'a' + 'A' : *end);
		if (u == NULL) {
			return -EINVAL;
		}
		shift = 10 * (unsigned)(u - units + 1);
		end++;
		if (strcmp(end, "") != 0 && strcmp(end, "B") != 0 && strcmp(end, "iB") != 0) {
			return -EINVAL;
		}
	}
	if (v > (UINT64_C(1) << 63) >> shift) {
		return -EINVAL;
	}
	*out = (uint64_t)v << shift;
	return 0;
}

/* A byte size setting: an integer or a string for pboxd_parse_bytes; "auto" (allowed when
 * auto_ok) gives 0. Left alone when absent. */
static int get_bytes(struct pbox_confkit *c, const config_setting_t *g, const char *name,
		     bool auto_ok, uint64_t *out)
{
	const config_setting_t *s = config_setting_get_member(g, name);
	const char *v;

	if (s == NULL) {
		return 0;
	}
	if (config_setting_type(s) == CONFIG_TYPE_INT ||
	    config_setting_type(s) == CONFIG_TYPE_INT64) {
		long long n = config_setting_get_int64(s);

		if (n <= 0) {
			return pbox_conf_bad(c, s, "must be a positive number of bytes (got %lld)",
					     n);
		}
		*out = (uint64_t)n;
		return 0;
	}
	if (config_setting_type(s) != CONFIG_TYPE_STRING) {
		return pbox_conf_bad(c, s,
				     "must be a size: bytes, or a string like \"512M\" or \"4G\"");
	}
	v = config_setting_get_string(s);
	if (auto_ok && strcmp(v, "auto") == 0) {
		*out = 0;
		return 0;
	}
	if (pboxd_parse_bytes(v, out) != 0) {
		return pbox_conf_bad(
			c, s,
			"'%s' is not a size (a number with K, M, G or T, powers of 1024, "
			"e.g. \"4G\"%s)",
			v, auto_ok ? ", or \"auto\"" : "");
	}
	return 0;
}

int pboxd_parse_cpulist(const char *s, int *cpus, unsigned max)
{
	unsigned n = 0;

	while (*s != '\0') {
		char *end;
		long a = strtol(s, &end, 10), b;

		if (end == s || a < 0 || a > 4095) {
			return -EINVAL;
		}
		b = a;
		if (*end == '-') {
			s = end + 1;
			b = strtol(s, &end, 10);
			if (end == s || b < a || b > 4095) {
				return -EINVAL;
			}
		}
		for (long v = a; v <= b; v++) {
			if (n == max) {
				return -EINVAL;
			}
			cpus[n++] = (int)v;
		}
		if (*end == ',') {
			end++;
		} else if (*end != '\0') {
			return -EINVAL;
		}
		s = end;
	}
	return (int)n;
}

void pboxd_config_defaults(struct pboxd_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	snprintf(cfg->transport, sizeof(cfg->transport), "udp");
	snprintf(cfg->data_addr, sizeof(cfg->data_addr), "127.0.0.1");
	cfg->base_port = 7100;
	snprintf(cfg->control_host, sizeof(cfg->control_host), "127.0.0.1");
	cfg->control_port = 7000;
	cfg->ncores = 1;
	for (unsigned i = 0; i < PBOX_MAX_CORES; i++) {
		cfg->cpus[i] = -1;
	}
	cfg->chunk_bytes = PBOX_DEFAULT_CHUNK_BYTES;
	cfg->mtu = 1500;
	cfg->idle_us = 200;
	cfg->burst = 32;
	cfg->drain_timeout = 10;
	cfg->worker_timeout = 10;
	cfg->checkpoint_interval = 60;
	cfg->log_format = -1;
	pbox_metrics_cfg_defaults(&cfg->metrics, PBOX_METRICS_PORT_PBOXD);
	cfg->fault.seed = 1;
	cfg->limits = (struct pboxd_control_limits){
		.max_connections = 4096,
		.max_per_address = 1024,
		.max_unauth = 256,
		.max_unauth_per_address = 32,
		.unauth_timeout = 5,
		.max_register_keys = 100000,
		.max_output_bytes = 1u << 20,
		.auth_failures_burst = 10,
		.auth_failures_per_minute = 60,
	};
	pbox_dpdk_conf_defaults(&cfg->dpdk);
	snprintf(cfg->xdp.mode, sizeof(cfg->xdp.mode), "auto");
	snprintf(cfg->xdp.pin_root, sizeof(cfg->xdp.pin_root), "/sys/fs/bpf/pbox");
	cfg->xdp.max_chunks = 1u << 20;
	pboxd_shm_cfg_default(&cfg->shm);
	pbox_afxdp_conf_defaults(&cfg->afxdp);
	cfg->probe.port = 55001;
	cfg->probe.max_rate_bps = 1e9;
	cfg->probe.max_budget_s = 10;
}

static int load_keys(struct pbox_confkit *c, const config_setting_t *ks, struct pboxd_job_cfg *j)
{
	int n = config_setting_length(ks);

	if (!config_setting_is_list(ks) && !config_setting_is_array(ks)) {
		return pbox_conf_bad(c, ks, "must be a list of [id, elements] pairs");
	}
	if (n == 0 || (uint32_t)n > PBOX_MAX_KEYS) {
		return pbox_conf_bad(c, ks, "must list 1..%u keys", PBOX_MAX_KEYS);
	}
	j->keys = calloc((size_t)n, sizeof(*j->keys));
	if (j->keys == NULL) {
		return pbox_conf_bad(c, ks, "out of memory");
	}
	for (int i = 0; i < n; i++) {
		const config_setting_t *k = config_setting_get_elem(ks, (unsigned)i);
		long long id, ne;

		if (config_setting_length(k) != 2 || !config_setting_is_aggregate(k)) {
			return pbox_conf_bad(c, k, "must be [id, elements]");
		}
		id = config_setting_get_int64_elem(k, 0);
		ne = config_setting_get_int64_elem(k, 1);
		if (id < 0 || id > UINT32_MAX || ne <= 0 || ne > (1LL << 40)) {
			return pbox_conf_bad(
				c, k,
				"id must be 0..2^32-1 and elements 1..2^40 (got [%lld, %lld])", id,
				ne);
		}
		j->keys[i].id = (uint32_t)id;
		j->keys[i].nelem = (uint64_t)ne;
	}
	j->nkeys = (uint32_t)n;
	return 0;
}

static int load_sync(struct pbox_confkit *c, const config_setting_t *g, struct pboxd_job_cfg *j)
{
	static const char *const keys[] = { "model",  "staleness", "probability", "alpha",
					    "quorum", "release",   "seed",        NULL };
	static const char *const releases[] = { "lazy", "eager", NULL };
	const config_setting_t *s = config_setting_get_member(g, "sync"), *where;
	struct pbox_sync_cfg *sc = &j->sync_cfg;
	char buf[64];
	float f;
	int rc, m, eager;

	pbox_sync_cfg_defaults(sc, j->workers);
	if (s == NULL) {
		j->sync = pbox_sync_ops(sc->model);
		return 0;
	}
	if (!config_setting_is_group(s)) {
		return pbox_conf_bad(c, s,
				     "must be a group { model = \"ssp\"; staleness = 2; ... }");
	}
	if ((rc = pbox_conf_only(c, s, keys)) != 0 ||
	    (rc = pbox_conf_str(c, s, "model", buf, sizeof(buf), &where)) != 0) {
		return rc;
	}
	if (where != NULL) {
		m = pbox_sync_parse(buf);
		if (m < 0) {
			return pbox_conf_bad(c, where,
					     "unknown model '%s' (bsp, ssp, asp, pssp, pssp-dyn, "
					     "drop-stragglers)",
					     buf);
		}
		sc->model = (enum pbox_sync_model)m;
	}
	if ((rc = pbox_conf_u32(c, s, "staleness", 0, PBOX_MAX_WINDOW - 2, &sc->staleness)) != 0 ||
	    (rc = pbox_conf_u32(c, s, "quorum", 1, j->workers, &sc->quorum)) != 0) {
		return rc;
	}
	f = (float)sc->probability;
	if ((rc = pbox_conf_float(c, s, "probability", 0, 1, &f)) != 0) {
		return rc;
	}
	sc->probability = f;
	f = (float)sc->alpha;
	if ((rc = pbox_conf_float(c, s, "alpha", 0, 2, &f)) != 0) {
		return rc;
	}
	sc->alpha = f;
	{
		uint32_t seed = 1;

		if ((rc = pbox_conf_u32(c, s, "seed", 0, UINT32_MAX, &seed)) != 0) {
			return rc;
		}
		sc->seed = seed;
	}
	eager = sc->eager;
	if ((rc = pbox_conf_choice(c, s, "release", "release", releases, &eager)) != 0) {
		return rc;
	}
	sc->eager = eager == 1;
	j->sync = pbox_sync_ops(sc->model);
	return 0;
}

static int load_flow(struct pbox_confkit *c, const config_setting_t *g, struct pboxd_job_cfg *j)
{
	static const char *const keys[] = { "mode", "credits", "verify", NULL };
	static const char *const modes[] = { "notify-ack", "plain", NULL };
	const config_setting_t *s = config_setting_get_member(g, "flow");
	int rc, plain = 0;

	j->credits = PBOX_DEFAULT_CREDITS;
	j->plain_flow = false;
	j->verify_crc = false;
	if (s == NULL) {
		return 0;
	}
	if (!config_setting_is_group(s)) {
		return pbox_conf_bad(c, s,
				     "must be a group { mode = \"notify-ack\"; credits = 1; }");
	}
	if ((rc = pbox_conf_only(c, s, keys)) != 0 ||
	    (rc = pbox_conf_choice(c, s, "mode", "flow mode", modes, &plain)) != 0) {
		return rc;
	}
	j->plain_flow = plain == 1;
	if ((rc = pbox_conf_u32(c, s, "credits", 1, PBOX_MAX_CREDITS, &j->credits)) != 0 ||
	    (rc = pbox_conf_bool(c, s, "verify", &j->verify_crc)) != 0) {
		return rc;
	}
	return 0;
}

/* The job's dvf group (dvf/dvf_job.h); absent: no DVF. */
static int load_dvf(struct pbox_confkit *c, const config_setting_t *g, struct pboxd_job_cfg *j)
{
	static const char *const keys[] = {
		"low", "up", "codec", "link", "sparse", "bitmap", NULL
	};
	static const char *const links[] = { "sufficient", "insufficient", NULL };
	const config_setting_t *s = config_setting_get_member(g, "dvf"), *where;
	float sparse = 0.8f;
	char codec[32];
	int rc, link = 0;

	memset(&j->dvf, 0, sizeof(j->dvf));
	if (s == NULL) {
		return 0;
	}
	if (!config_setting_is_group(s)) {
		return pbox_conf_bad(
			c, s, "must be a group { low = 2.0; up = 8.0; codec = \"snappy\"; }");
	}
	pbox_dvf_job_default(&j->dvf);
	if ((rc = pbox_conf_only(c, s, keys)) != 0 ||
	    (rc = pbox_conf_float(c, s, "low", 0.0, 1e30, &j->dvf.params.delta_low)) != 0 ||
	    (rc = pbox_conf_float(c, s, "up", 0.0, 1e30, &j->dvf.params.delta_up)) != 0 ||
	    (rc = pbox_conf_float(c, s, "sparse", 0.5, 1.0, &sparse)) != 0 ||
	    (rc = pbox_conf_bool(c, s, "bitmap", &j->dvf.enc.dense_bitmap)) != 0 ||
	    (rc = pbox_conf_choice(c, s, "link", "link state", links, &link)) != 0 ||
	    (rc = pbox_conf_str(c, s, "codec", codec, sizeof(codec), &where)) != 0) {
		return rc;
	}
	if (j->dvf.params.delta_low > j->dvf.params.delta_up) {
		return pbox_conf_bad(c, s, "low (%g) must not exceed up (%g)",
				     (double)j->dvf.params.delta_low,
				     (double)j->dvf.params.delta_up);
	}
	if (where != NULL &&
	    pbox_dvf_codec_parse(codec, &j->dvf.enc.codec, &j->dvf.enc.level) != 0) {
		return pbox_conf_bad(c, where, "unknown codec or level '%s' (%s; e.g. \"zstd:2\")",
				     codec, pbox_dvf_codec_names());
	}
	j->dvf.link = link == 0 ? PBOX_DVF_LINK_SUFFICIENT : PBOX_DVF_LINK_INSUFFICIENT;
	j->dvf.enc.sparse_permille = (uint32_t)(sparse * 1000.0f + 0.5f);
	return 0;
}

/* Checks across a job's settings, and the values derived from them. */
static int finish_job(struct pbox_confkit *c, const config_setting_t *g, struct pboxd_job_cfg *j)
{
	static const char *const losses[] = { "abort", "continue", NULL };
	uint32_t min_window;
	int rc, loss;

	if (j->mode == PBOX_MODE_BROADCAST && j->sync_cfg.model != PBOX_SYNC_BSP &&
	    j->sync_cfg.model != PBOX_SYNC_SSP) {
		return pbox_conf_bad(
			c, g,
			"sync model '%s': a broadcast job runs under bsp or ssp (every "
			"worker applies every iteration's aggregate)",
			j->sync->name);
	}
	if (j->sync_cfg.model != PBOX_SYNC_BSP && j->sync_cfg.model != PBOX_SYNC_DROP_STRAGGLERS &&
	    j->mode == PBOX_MODE_AGGREGATE) {
		return pbox_conf_bad(
			c, g,
			"sync model '%s' needs mode = \"server-optimizer\" (an aggregate job "
			"answers each iteration with its complete aggregate)",
			j->sync->name);
	}
	if (j->sync_cfg.eager && j->mode != PBOX_MODE_SERVER_OPT) {
		return pbox_conf_bad(c, g, "release = \"eager\" needs mode = \"server-optimizer\"");
	}
	if (j->sync->folds_late && j->deterministic) {
		return pbox_conf_bad(
			c, g,
			"sync model '%s' adds late contributions in arrival order; it cannot be "
			"deterministic (set deterministic = false)",
			j->sync->name);
	}
	if (j->sync->folds_late && j->credits != 1) {
		return pbox_conf_bad(c, g, "sync model '%s' needs flow credits = 1", j->sync->name);
	}
	if (j->mode == PBOX_MODE_BROADCAST && j->sync_cfg.model == PBOX_SYNC_SSP &&
	    (config_setting_get_member(g, "flow") == NULL ||
	     config_setting_get_member(config_setting_get_member(g, "flow"), "credits") == NULL)) {
		/* A worker keeps the pull of its next aggregate in flight while it pushes
		 * (pbox_update_step): two operations per key. */
		j->credits = 2;
	}
	min_window = pbox_job_min_window(j->mode, j->sync, &j->sync_cfg, j->credits);
	if (config_setting_get_member(g, "window") != NULL && j->window < min_window) {
		return pbox_conf_bad(c, config_setting_get_member(g, "window"),
				     "must be at least %u for sync model '%s' with %u credit(s)",
				     min_window, j->sync->name, j->credits);
	}
	j->window = PBOX_MAX(j->window, min_window);
	if (j->plain_flow) {
		j->credits = j->window - 1;
	}
	/* BSP cannot go on without a rank; the relaxed models can. */
	loss = j->sync_cfg.model == PBOX_SYNC_BSP ? 0 : 1;
	if ((rc = pbox_conf_choice(c, g, "on_worker_loss", "on_worker_loss", losses, &loss)) != 0) {
		return rc;
	}
	j->abort_on_loss = loss == 0;
	if (j->tree && (j->sync_cfg.model != PBOX_SYNC_BSP || j->sync_cfg.eager)) {
		return pbox_conf_bad(
			c, config_setting_get_member(g, "tree"),
			"a broadcast tree needs sync model 'bsp' with lazy release (the "
			"one model whose results are the same for every rank)");
	}
	return 0;
}

static int load_job(struct pbox_confkit *c, const config_setting_t *g,
		    const struct pboxd_config *cfg, struct pboxd_job_cfg *j)
{
	static const char *const job_keys[] = { "id",
						"token",
						"workers",
						"mode",
						"reduce",
						"optimizer",
						"keys",
						"window",
						"deterministic",
						"sync",
						"flow",
						"on_worker_loss",
						"memory_budget",
						"non_finite",
						"dvf",
						"tree",
						NULL };
	static const char *const opt_keys[] = { "name", "lr",    "momentum", "wd",  "rescale",
						"clip", "beta1", "beta2",    "eps", NULL };
	static const char *const modes[] = { "aggregate", "server-optimizer", "broadcast", NULL };
	static const char *const reduces[] = { "sum", "mean", NULL };
	static const char *const non_finites[] = { "reject", "propagate", NULL };
	const config_setting_t *s, *where;
	char buf[64];
	int rc, mode, reduce, non_finite = PBOX_NON_FINITE_REJECT;

	if (!config_setting_is_group(g)) {
		return pbox_conf_bad(c, g,
				     "each job must be a group { id = ...; token = ...; ... }");
	}
	if ((rc = pbox_conf_only(c, g, job_keys)) != 0) {
		return rc;
	}
	j->deterministic = cfg->deterministic;
	j->window = PBOX_DEFAULT_WINDOW;
	j->mode = PBOX_MODE_AGGREGATE;
	j->reduce = PBOX_REDUCE_MEAN;
	j->opt = pbox_optimizer_find("sgd");
	pbox_opt_params_default(&j->opt_params);
	if (config_setting_get_member(g, "id") == NULL) {
		return pbox_conf_bad(c, g, "job needs an id");
	}
	if (config_setting_get_member(g, "workers") == NULL) {
		return pbox_conf_bad(c, g, "job needs workers (the number of ranks)");
	}
	if ((rc = pbox_conf_u32(c, g, "id", 0, UINT32_MAX, &j->id)) != 0 ||
	    (rc = pbox_conf_u32(c, g, "workers", 1, PBOX_MAX_WORKERS, &j->workers)) != 0 ||
	    (rc = pbox_conf_u32(c, g, "window", 2, PBOX_MAX_WINDOW, &j->window)) != 0 ||
	    (rc = pbox_conf_bool(c, g, "deterministic", &j->deterministic)) != 0) {
		return rc;
	}
	if ((rc = pbox_conf_str(c, g, "token", j->token, sizeof(j->token), &where)) != 0) {
		return rc;
	}
	if (where == NULL || strlen(j->token) < 1) {
		return pbox_conf_bad(c, where ? where : g,
				     "job needs a non-empty token (the job's secret)");
	}
	/* Indexed by enum pbox_job_mode and enum pbox_reduce_op. */
	_Static_assert(PBOX_MODE_AGGREGATE == 0 && PBOX_MODE_SERVER_OPT == 1 &&
			       PBOX_MODE_BROADCAST == 2,
		       "modes[] order");
	_Static_assert(PBOX_REDUCE_SUM == 0 && PBOX_REDUCE_MEAN == 1, "reduces[] order");
	mode = (int)j->mode;
	reduce = (int)j->reduce;
	if ((rc = pbox_conf_choice(c, g, "mode", "mode", modes, &mode)) != 0 ||
	    (rc = pbox_conf_choice(c, g, "reduce", "reduce", reduces, &reduce)) != 0) {
		return rc;
	}
	j->mode = (enum pbox_job_mode)mode;
	j->reduce = (enum pbox_reduce_op)reduce;
	_Static_assert(PBOX_NON_FINITE_REJECT == 0 && PBOX_NON_FINITE_PROPAGATE == 1,
		       "non_finites[] order");
	if ((rc = pbox_conf_choice(c, g, "non_finite", "non_finite", non_finites, &non_finite)) !=
	    0) {
		return rc;
	}
	j->non_finite = (enum pbox_non_finite)non_finite;
	s = config_setting_get_member(g, "optimizer");
	if (s != NULL) {
		if (!config_setting_is_group(s)) {
			return pbox_conf_bad(c, s, "must be a group { name = \"nag\"; lr = ...; }");
		}
		if ((rc = pbox_conf_only(c, s, opt_keys)) != 0 ||
		    (rc = pbox_conf_str(c, s, "name", buf, sizeof(buf), &where)) != 0) {
			return rc;
		}
		if (where != NULL) {
			j->opt = pbox_optimizer_find(buf);
			if (j->opt == NULL) {
				return pbox_conf_bad(c, where, "unknown optimizer '%s' (%s)", buf,
						     pbox_optimizer_names());
			}
		}
		if ((rc = pbox_conf_float(c, s, "lr", 0, 1e6, &j->opt_params.lr)) != 0 ||
		    (rc = pbox_conf_float(c, s, "momentum", 0, 1, &j->opt_params.momentum)) != 0 ||
		    (rc = pbox_conf_float(c, s, "wd", 0, 1e3, &j->opt_params.wd)) != 0 ||
		    (rc = pbox_conf_float(c, s, "rescale", -1e9, 1e9, &j->opt_params.rescale)) !=
			    0 ||
		    (rc = pbox_conf_float(c, s, "clip", 0, 1e30, &j->opt_params.clip)) != 0 ||
		    (rc = pbox_conf_float(c, s, "beta1", 0, 0.999999, &j->opt_params.beta1)) != 0 ||
		    (rc = pbox_conf_float(c, s, "beta2", 0, 0.99999999, &j->opt_params.beta2)) !=
			    0 ||
		    (rc = pbox_conf_float(c, s, "eps", 0, 1, &j->opt_params.eps)) != 0) {
			return rc;
		}
		if (j->mode == PBOX_MODE_AGGREGATE) {
			return pbox_conf_bad(c, s,
					     "an optimizer is part of a job only with mode = "
					     "\"server-optimizer\" (the appliance runs it) or "
					     "\"broadcast\" (every worker does)");
		}
	}
	s = config_setting_get_member(g, "keys");
	if (s != NULL && (rc = load_keys(c, s, j)) != 0) {
		return rc;
	}
	if ((rc = load_sync(c, g, j)) != 0 || (rc = load_flow(c, g, j)) != 0 ||
	    (rc = load_dvf(c, g, j)) != 0 ||
	    (rc = get_bytes(c, g, "memory_budget", false, &j->memory_budget)) != 0) {
		return rc;
	}
	j->checkpoint = cfg->checkpoint_dir[0] != '\0' && j->mode == PBOX_MODE_SERVER_OPT;
	if ((rc = pboxd_tsb_load(c, g, j)) != 0) {
		return rc;
	}
	return finish_job(c, g, j);
}

int pboxd_config_load_job(const struct pboxd_config *cfg, const config_setting_t *g,
			  const char *origin, struct pboxd_job_cfg *j, char *err, size_t errlen)
{
	struct pbox_confkit c = { .file = origin, .err = err, .errlen = errlen };
	int rc;

	memset(j, 0, sizeof(*j));
	rc = load_job(&c, g, cfg, j);
	if (rc != 0) {
		pboxd_job_cfg_free(j);
	}
	return rc;
}

int pboxd_job_cfg_from_json(const struct pboxd_config *cfg, const json_t *desc,
			    struct pboxd_job_cfg *j, char *err, size_t errlen)
{
	char msg[384];
	config_t lc;
	int rc;

	memset(j, 0, sizeof(*j));
	config_init(&lc);
	rc = pbox_jobspec_to_setting(desc, config_root_setting(&lc), "job", msg, sizeof(msg));
	if (rc != 0) {
		snprintf(err, errlen, "job description: %s", msg);
	} else {
		rc = pboxd_config_load_job(cfg, config_lookup(&lc, "job"), "job description", j,
					   err, errlen);
	}
	config_destroy(&lc);
	return rc;
}

void pboxd_job_cfg_free(struct pboxd_job_cfg *j)
{
	free(j->keys);
	j->keys = NULL;
	j->nkeys = 0;
	free(j->core_map);
	j->core_map = NULL;
	j->ncore_map = 0;
	free(j->tree_parent);
	j->tree_parent = NULL;
}

int pboxd_job_cfg_set_assignment(const struct pboxd_config *cfg, struct pboxd_job_cfg *j,
				 const json_t *a, char *err, size_t errlen)
{
	const json_t *map = json_object_get(a, "map");
	json_int_t cb = json_integer_value(json_object_get(a, "chunk_bytes"));
	uint64_t nchunks = 0;
	char why[256];
	size_t i;
	const json_t *v;

	if (j->keys == NULL) {
		snprintf(err, errlen,
			 "job %u: a core assignment needs a fixed key set (keys); without one "
			 "pboxd assigns the chunks when the key set is registered",
			 j->id);
		return -EINVAL;
	}
	if (cb != (json_int_t)cfg->chunk_bytes) {
		snprintf(err, errlen,
			 "job %u: the core assignment was made for chunks of %lld bytes; this "
			 "pboxd cuts keys into chunks of %u bytes",
			 j->id, (long long)cb, cfg->chunk_bytes);
		return -EINVAL;
	}
	if (pbox_jobdesc_count_chunks(j->keys, j->nkeys, cfg->chunk_bytes, &nchunks, why,
				      sizeof(why)) != 0) {
		snprintf(err, errlen, "job %u: %s", j->id, why);
		return -EINVAL;
	}
	if (json_array_size(map) != nchunks) {
		snprintf(err, errlen,
			 "job %u: the core assignment places %zu chunks; the key set has %llu "
			 "chunks of %u bytes",
			 j->id, json_array_size(map), (unsigned long long)nchunks,
			 cfg->chunk_bytes);
		return -EINVAL;
	}
	json_array_foreach(map, i, v)
	{
		json_int_t core = json_integer_value(v);

		if (!json_is_integer(v) || core < 0 || core >= (json_int_t)cfg->ncores) {
			snprintf(err, errlen,
				 "job %u: the core assignment puts chunk %zu on core %lld; this "
				 "pboxd has %u data-plane core%s (0..%u)",
				 j->id, i, (long long)core, cfg->ncores,
				 cfg->ncores == 1 ? "" : "s", cfg->ncores - 1);
			return -EINVAL;
		}
	}
	free(j->core_map);
	j->core_map = malloc(nchunks * sizeof(*j->core_map));
	if (j->core_map == NULL) {
		j->ncore_map = 0;
		snprintf(err, errlen, "job %u: out of memory", j->id);
		return -ENOMEM;
	}
	json_array_foreach(map, i, v)
	{
		j->core_map[i] = (uint32_t)json_integer_value(v);
	}
	j->ncore_map = (uint32_t)nchunks;
	return 0;
}

/* The appliance's control_limits = { ... } group. */
static int load_limits(struct pbox_confkit *c, const config_setting_t *g,
		       struct pboxd_control_limits *l)
{
	static const char *const keys[] = { "max_connections",
					    "max_per_address",
					    "max_unauth",
					    "max_unauth_per_address",
					    "unauth_timeout",
					    "max_register_keys",
					    "max_output_bytes",
					    "auth_failures_burst",
					    "auth_failures_per_minute",
					    NULL };
	int rc;

	if (!config_setting_is_group(g)) {
		return pbox_conf_bad(c, g, "must be a group { max_connections = 4096; ... }");
	}
	if ((rc = pbox_conf_only(c, g, keys)) != 0 ||
	    (rc = pbox_conf_u32(c, g, "max_connections", 1, 1u << 20, &l->max_connections)) != 0 ||
	    (rc = pbox_conf_u32(c, g, "max_per_address", 1, 1u << 20, &l->max_per_address)) != 0 ||
	    (rc = pbox_conf_u32(c, g, "max_unauth", 1, 1u << 20, &l->max_unauth)) != 0 ||
	    (rc = pbox_conf_u32(c, g, "max_unauth_per_address", 1, 1u << 20,
				&l->max_unauth_per_address)) != 0 ||
	    (rc = pbox_conf_u32(c, g, "unauth_timeout", 1, 3600, &l->unauth_timeout)) != 0 ||
	    (rc = pbox_conf_u32(c, g, "max_register_keys", 1, PBOX_MAX_KEYS,
				&l->max_register_keys)) != 0 ||
	    (rc = pbox_conf_u32(c, g, "max_output_bytes", 4096, 1u << 30, &l->max_output_bytes)) !=
		    0 ||
	    (rc = pbox_conf_u32(c, g, "auth_failures_burst", 1, 1u << 20,
				&l->auth_failures_burst)) != 0 ||
	    (rc = pbox_conf_u32(c, g, "auth_failures_per_minute", 1, 1u << 20,
				&l->auth_failures_per_minute)) != 0) {
		return rc;
	}
	return 0;
}

/* The appliance's xdp = { ... } group. */
static int load_xdp(struct pbox_confkit *c, const config_setting_t *g, struct pboxd_xdp_cfg *xc)
{
	static const char *const keys[] = { "interface", "mode", "pin_root", "max_chunks", NULL };
	static const char *const modes[] = { "auto", "native", "generic", NULL };
	const config_setting_t *where;
	int rc, mode = -1;

	if (!config_setting_is_group(g)) {
		return pbox_conf_bad(c, g, "must be a group { interface = \"eth1\"; ... }");
	}
	if ((rc = pbox_conf_only(c, g, keys)) != 0 ||
	    (rc = pbox_conf_str(c, g, "interface", xc->interface, sizeof(xc->interface), NULL)) !=
		    0 ||
	    (rc = pbox_conf_choice(c, g, "mode", "mode", modes, &mode)) != 0 ||
	    (rc = pbox_conf_str(c, g, "pin_root", xc->pin_root, sizeof(xc->pin_root), &where)) !=
		    0 ||
	    (rc = pbox_conf_u32(c, g, "max_chunks", 1, PBOX_MAX_CHUNKS, &xc->max_chunks)) != 0) {
		return rc;
	}
	if (mode >= 0) {
		snprintf(xc->mode, sizeof(xc->mode), "%s", modes[mode]);
	}
	if (where != NULL && xc->pin_root[0] != '\0' && xc->pin_root[0] != '/') {
		return pbox_conf_bad(c, where,
				     "must be an absolute path on a bpffs, or \"\" (no pins)");
	}
	return 0;
}

bool pboxd_parse_rate(const char *s, double *out)
{
	static const struct {
		const char *sfx;
		double mul;
	} units[] = { { "", 1 },       { "k", 1e3 }, { "kbit", 1e3 }, { "m", 1e6 },
		      { "mbit", 1e6 }, { "g", 1e9 }, { "gbit", 1e9 } };
	char *end;
	double v = strtod(s, &end);

	if (end == s || !(v > 0)) {
		return false;
	}
	for (size_t i = 0; i < PBOX_ARRAY_SIZE(units); i++) {
		if (strcasecmp(end, units[i].sfx) == 0) {
			*out = v * units[i].mul;
			return *out >= 2e6 && *out <= 1e12;
		}
	}
	return false;
}

/* The appliance's probe = { ... } group. */
static int load_probe(struct pbox_confkit *c, const config_setting_t *g, struct pboxd_probe_cfg *pc)
{
	static const char *const keys[] = { "port",         "address",  "max_rate",
					    "max_budget_s", "realtime", NULL };
	const config_setting_t *where;
	char rate[32] = "";
	uint32_t port = pc->port;
	struct in6_addr a6;
	struct in_addr a4;
	int rc;

	if (!config_setting_is_group(g)) {
		return pbox_conf_bad(c, g, "must be a group { port = 55001; ... }");
	}
	if ((rc = pbox_conf_only(c, g, keys)) != 0 ||
	    (rc = pbox_conf_u32(c, g, "port", 1, 65535, &port)) != 0 ||
	    (rc = pbox_conf_str(c, g, "address", pc->address, sizeof(pc->address), &where)) != 0 ||
	    (rc = pbox_conf_u32(c, g, "max_budget_s", 1, 3600, &pc->max_budget_s)) != 0 ||
	    (rc = pbox_conf_bool(c, g, "realtime", &pc->realtime)) != 0) {
		return rc;
	}
	if (where != NULL && pc->address[0] != '\0' && inet_pton(AF_INET, pc->address, &a4) != 1 &&
	    inet_pton(AF_INET6, pc->address, &a6) != 1) {
		return pbox_conf_bad(c, where, "must be a numeric IPv4 or IPv6 address, or \"\"");
	}
	if ((rc = pbox_conf_str(c, g, "max_rate", rate, sizeof(rate), &where)) != 0) {
		return rc;
	}
	if (where != NULL && !pboxd_parse_rate(rate, &pc->max_rate_bps)) {
		return pbox_conf_bad(c, where,
				     "expected a rate from 2mbit to 1000gbit (e.g. \"1gbit\", "
				     "\"500mbit\")");
	}
	pc->port = (uint16_t)port;
	pc->enabled = true;
	return 0;
}

int pboxd_config_add_eal_args(struct pboxd_config *cfg, int argc, char **argv, char *err,
			      size_t errlen)
{
	for (int i = 0; i < argc; i++) {
		if (cfg->dpdk.neal == PBOXD_DPDK_MAX_EAL_ARGS) {
			snprintf(err, errlen, "more than %d EAL arguments",
				 PBOXD_DPDK_MAX_EAL_ARGS);
			return -E2BIG;
		}
		cfg->dpdk.eal[cfg->dpdk.neal++] = argv[i];
	}
	return 0;
}

#ifdef PBOX_HAVE_AFXDP
#define PBOXD_HAVE_AFXDP            1
#define PBOXD_TRANSPORT_NAMES_AFXDP ", afxdp"
#else
#define PBOXD_HAVE_AFXDP            0
#define PBOXD_TRANSPORT_NAMES_AFXDP ""
#endif

/* The transports this build has, for error messages. */
static const char *transport_names(void)
{
	return pbox_dpdk_conf_built() ? "udp, dpdk" PBOXD_TRANSPORT_NAMES_AFXDP
				      : "udp" PBOXD_TRANSPORT_NAMES_AFXDP;
}

int pboxd_config_load(struct pboxd_config *cfg, const char *path, char *err, size_t errlen)
{
	static const char *const top_keys[] = { "appliance", "jobs", "metrics", NULL };
	static const char *const app_keys[] = {
		"transport",
		"data_address",
		"base_port",
		"control",
		"cores",
		"cpus",
		"chunk_bytes",
		"mtu",
		"busy_poll",
		"idle_us",
		"burst",
		"deterministic",
		"stats_interval",
		"drain_timeout",
		"fault",
		"dpdk",
		"xdp",
		"afxdp",
		"probe",
		"shm",
		"worker_timeout",
		"admin_token",
		"control_socket",
		"control_limits",
		"memory_budget",
		"checkpoint_dir",
		"checkpoint_interval",
		"log_format",
		NULL,
	};
	static const char *const log_formats[] = { "text", "json", NULL };
	struct pbox_confkit c = { .file = path, .err = err, .errlen = errlen };
	const config_setting_t *root, *a, *jobs, *s;
	config_t lc;
	char buf[128];
	int rc = 0;

	snprintf(cfg->path, sizeof(cfg->path), "%s", path);
	config_init(&lc);
	if (config_read_file(&lc, path) != CONFIG_TRUE) {
		if (config_error_type(&lc) == CONFIG_ERR_FILE_IO) {
			snprintf(err, errlen, "%s: cannot read the configuration file: %s", path,
				 strerror(errno ? errno : ENOENT));
			rc = -ENOENT;
		} else {
			snprintf(err, errlen, "%s:%d: syntax error: %s", path,
				 config_error_line(&lc), config_error_text(&lc));
			rc = -EINVAL;
		}
		goto out;
	}
	root = config_root_setting(&lc);
	if ((rc = pbox_conf_only(&c, root, top_keys)) != 0) {
		goto out;
	}
	a = config_setting_get_member(root, "appliance");
	if (a != NULL) {
		const config_setting_t *where;

		if (!config_setting_is_group(a)) {
			rc = pbox_conf_bad(&c, a, "must be a group { ... }");
			goto out;
		}
		if ((rc = pbox_conf_only(&c, a, app_keys)) != 0 ||
		    (rc = pbox_conf_str(&c, a, "transport", cfg->transport, sizeof(cfg->transport),
					NULL)) != 0 ||
		    (rc = pbox_conf_str(&c, a, "data_address", cfg->data_addr,
					sizeof(cfg->data_addr), NULL)) != 0) {
			goto out;
		}
		{
			uint32_t v = cfg->base_port;

			if ((rc = pbox_conf_u32(&c, a, "base_port", 1, 65535 - PBOX_MAX_CORES,
						&v)) != 0) {
				goto out;
			}
			cfg->base_port = (uint16_t)v;
		}
		if ((rc = pbox_conf_str(&c, a, "control", buf, sizeof(buf), &where)) != 0) {
			goto out;
		}
		if (where != NULL &&
		    pbox_hostport_split(buf, false, 0, cfg->control_host, sizeof(cfg->control_host),
					&cfg->control_port) != 0) {
			rc = pbox_conf_bad(&c, where, "'%s': expected \"host:port\"", buf);
			goto out;
		}
		if ((rc = pbox_conf_u32(&c, a, "cores", 1, PBOX_MAX_CORES, &cfg->ncores)) != 0) {
			goto out;
		}
		s = config_setting_get_member(a, "cpus");
		if (s != NULL) {
			int n = config_setting_length(s);

			if (!config_setting_is_array(s) || n < 1 || n > (int)PBOX_MAX_CORES) {
				rc = pbox_conf_bad(
					&c, s, "must be a list of 1..%u CPU numbers, e.g. [0, 1]",
					PBOX_MAX_CORES);
				goto out;
			}
			for (int i = 0; i < n; i++) {
				int v = config_setting_get_int_elem(s, i);

				if (v < 0 || v > 4095) {
					rc = pbox_conf_bad(&c, s, "CPU %d out of range", v);
					goto out;
				}
				cfg->cpus[i] = v;
			}
			if (config_setting_get_member(a, "cores") != NULL &&
			    cfg->ncores != (uint32_t)n) {
				rc = pbox_conf_bad(&c, s, "lists %d CPUs but cores = %u", n,
						   cfg->ncores);
				goto out;
			}
			cfg->ncores = (uint32_t)n;
		}
		if ((rc = pbox_conf_u32(&c, a, "chunk_bytes", PBOX_MIN_CHUNK_BYTES,
					PBOX_MAX_CHUNK_BYTES, &cfg->chunk_bytes)) != 0 ||
		    (rc = pbox_conf_u32(&c, a, "mtu", 576, 65535, &cfg->mtu)) != 0 ||
		    (rc = pbox_conf_bool(&c, a, "busy_poll", &cfg->busy_poll)) != 0 ||
		    (rc = pbox_conf_u32(&c, a, "idle_us", 0, 10000000, &cfg->idle_us)) != 0 ||
		    (rc = pbox_conf_u32(&c, a, "burst", 1, 256, &cfg->burst)) != 0 ||
		    (rc = pbox_conf_bool(&c, a, "deterministic", &cfg->deterministic)) != 0 ||
		    (rc = pbox_conf_u32(&c, a, "stats_interval", 0, 86400, &cfg->stats_interval)) !=
			    0 ||
		    (rc = pbox_conf_u32(&c, a, "drain_timeout", 0, 3600, &cfg->drain_timeout)) !=
			    0 ||
		    (rc = pbox_conf_u32(&c, a, "worker_timeout", 0, 86400, &cfg->worker_timeout)) !=
			    0 ||
		    (rc = get_bytes(&c, a, "memory_budget", true, &cfg->memory_budget)) != 0 ||
		    (rc = pbox_conf_str(&c, a, "checkpoint_dir", cfg->checkpoint_dir,
					sizeof(cfg->checkpoint_dir), NULL)) != 0 ||
		    (rc = pbox_conf_u32(&c, a, "checkpoint_interval", 0, 86400 * 7,
					&cfg->checkpoint_interval)) != 0) {
			goto out;
		}
		if (cfg->chunk_bytes % PBOX_FRAG_ALIGN != 0) {
			rc = pbox_conf_bad(&c, config_setting_get_member(a, "chunk_bytes"),
					   "must be a multiple of %u", PBOX_FRAG_ALIGN);
			goto out;
		}
		if ((rc = pbox_conf_str(&c, a, "fault", buf, sizeof(buf), &where)) != 0) {
			goto out;
		}
		if (where != NULL) {
			char ferr[192];

			if (pbox_fault_parse(buf, &cfg->fault, ferr, sizeof(ferr)) != 0) {
				rc = pbox_conf_bad(&c, where, "%s", ferr);
				goto out;
			}
		}
		s = config_setting_get_member(a, "dpdk");
		if (s != NULL && (rc = pbox_dpdk_conf_load(&c, s, &cfg->dpdk)) != 0) {
			goto out;
		}
		s = config_setting_get_member(a, "xdp");
		if (s != NULL && (rc = load_xdp(&c, s, &cfg->xdp)) != 0) {
			goto out;
		}
		s = config_setting_get_member(a, "afxdp");
		if (s != NULL && (rc = pbox_afxdp_conf_load(&c, s, &cfg->afxdp)) != 0) {
			goto out;
		}
		s = config_setting_get_member(a, "probe");
		if (s != NULL && (rc = load_probe(&c, s, &cfg->probe)) != 0) {
			goto out;
		}
		s = config_setting_get_member(a, "shm");
		if (s != NULL && (rc = pboxd_shm_cfg_load(&c, s, &cfg->shm)) != 0) {
			goto out;
		}
		if ((rc = pbox_conf_str(&c, a, "admin_token", cfg->admin_token,
					sizeof(cfg->admin_token), NULL)) != 0 ||
		    (rc = pbox_conf_str(&c, a, "control_socket", cfg->control_socket,
					sizeof(cfg->control_socket), &where)) != 0) {
			goto out;
		}
		if (where != NULL && cfg->control_socket[0] != '\0' &&
		    cfg->control_socket[0] != '/') {
			rc = pbox_conf_bad(
				&c, where,
				"must be an absolute path like \"/run/pbox/pboxd.sock\"");
			goto out;
		}
		s = config_setting_get_member(a, "control_limits");
		if (s != NULL && (rc = load_limits(&c, s, &cfg->limits)) != 0) {
			goto out;
		}
		if ((rc = pbox_conf_choice(&c, a, "log_format", "log format", log_formats,
					   &cfg->log_format)) != 0) {
			goto out;
		}
	}
	rc = pbox_metrics_cfg_load(&c, config_setting_get_member(root, "metrics"), &cfg->metrics);
	if (rc != 0) {
		goto out;
	}
	jobs = config_setting_get_member(root, "jobs");
	if (jobs != NULL) {
		int n = config_setting_length(jobs);

		if (!config_setting_is_list(jobs)) {
			rc = pbox_conf_bad(&c, jobs,
					   "must be a list of job groups: ( { ... }, { ... } )");
			goto out;
		}
		cfg->jobs = calloc(n ? (size_t)n : 1, sizeof(*cfg->jobs));
		if (cfg->jobs == NULL) {
			rc = -ENOMEM;
			goto out;
		}
		for (int i = 0; i < n; i++) {
			const config_setting_t *g = config_setting_get_elem(jobs, (unsigned)i);

			memset(&cfg->jobs[i], 0, sizeof(cfg->jobs[i]));
			rc = load_job(&c, g, cfg, &cfg->jobs[i]);
			cfg->njobs = (uint32_t)i + 1;
			if (rc != 0) {
				goto out;
			}
			for (int k = 0; k < i; k++) {
				if (cfg->jobs[k].id == cfg->jobs[i].id) {
					rc = pbox_conf_bad(&c, g, "job id %u is defined twice",
							   cfg->jobs[i].id);
					goto out;
				}
			}
		}
	}
out:
	config_destroy(&lc);
	return rc;
}

int pboxd_config_check(const struct pboxd_config *cfg, char *err, size_t errlen)
{
	const char *file = cfg->path[0] ? cfg->path : "command line";
	uint32_t frag;

	if (cfg->xdp.interface[0] != '\0' && strcmp(cfg->transport, "udp") != 0 &&
	    strcmp(cfg->transport, "afxdp") != 0) {
		/* DPDK's net_af_xdp loads its own XDP program on its interface. */
		snprintf(err, errlen,
			 "%s: xdp.interface needs transport \"udp\" or \"afxdp\" (got \"%s\")",
			 file, cfg->transport);
		return -EINVAL;
	}
	if (strcmp(cfg->transport, "afxdp") == 0) {
		if (!PBOXD_HAVE_AFXDP) {
			snprintf(err, errlen,
				 "%s: transport 'afxdp' is not available: this pboxd was built "
				 "without libxdp-dev or XDP support (this build has: %s)",
				 file, transport_names());
			return -EINVAL;
		}
		if (pbox_afxdp_conf_check(&cfg->afxdp, file, cfg->ncores, cfg->data_addr,
					  cfg->xdp.interface, cfg->mtu, err, errlen) != 0) {
			return -EINVAL;
		}
	}
	if (strcmp(cfg->transport, "dpdk") == 0) {
		if (pbox_dpdk_conf_check(&cfg->dpdk, file, cfg->data_addr, err, errlen) != 0) {
			return -EINVAL;
		}
	} else if (strcmp(cfg->transport, "udp") != 0 && strcmp(cfg->transport, "afxdp") != 0) {
		snprintf(err, errlen, "%s: transport '%s' is not available (this build has: %s)",
			 file, cfg->transport, transport_names());
		return -EINVAL;
	}
	if (strcmp(cfg->transport, "dpdk") != 0 && cfg->dpdk.neal > cfg->dpdk.neal_owned) {
		snprintf(err, errlen, "EAL arguments after -- need --transport dpdk");
		return -EINVAL;
	}
	frag = pbox_frag_bytes_for_mtu(cfg->mtu, cfg->chunk_bytes);
	if (frag == 0) {
		snprintf(err, errlen, "%s: mtu %u is too small to carry a fragment", file,
			 cfg->mtu);
		return -EINVAL;
	}
	if (PBOX_DIV_ROUND_UP(cfg->chunk_bytes, frag) > PBOX_MAX_FRAGS_PER_CHUNK) {
		snprintf(err, errlen,
			 "%s: chunk_bytes %u at mtu %u makes more than %u fragments per chunk "
			 "(use a larger mtu or smaller chunks)",
			 file, cfg->chunk_bytes, cfg->mtu, PBOX_MAX_FRAGS_PER_CHUNK);
		return -EINVAL;
	}
	if ((uint32_t)cfg->base_port + cfg->ncores > 65536) {
		snprintf(err, errlen, "%s: base_port %u + %u cores runs past port 65535", file,
			 cfg->base_port, cfg->ncores);
		return -EINVAL;
	}
	return 0;
}

void pboxd_config_free(struct pboxd_config *cfg)
{
	for (uint32_t i = 0; i < cfg->njobs; i++) {
		pboxd_job_cfg_free(&cfg->jobs[i]);
	}
	free(cfg->jobs);
	cfg->jobs = NULL;
	cfg->njobs = 0;
	pbox_dpdk_conf_free(&cfg->dpdk);
}
