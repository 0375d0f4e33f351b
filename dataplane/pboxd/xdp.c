/* SPDX-License-Identifier: BSD-3-Clause */
/* pboxd's XDP filter: start, sync with the job table, stats (see xdp.h). */
#include "xdp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

/* The filter's interface: xdp.interface, else the afxdp transport's (which needs it). */
static const char *pboxd_xdp_interface(const struct pboxd_config *cfg)
{
	if (cfg->xdp.interface[0] == '\0' && strcmp(cfg->transport, "afxdp") == 0) {
		return cfg->afxdp.interface;
	}
	return cfg->xdp.interface;
}

#ifdef PBOX_HAVE_XDP
#include "loader.h"

struct pboxd_xdp {
	struct pbox_xdp *prog;
	char ifname[32];
	uint32_t *jobs; /* ids of the jobs in the filter */
	uint32_t njobs, cap;
};

int pboxd_xdp_start(const struct pboxd_config *cfg, struct pboxd_xdp **out)
{
	struct pbox_xdp_opts o = {
		.ifname = pboxd_xdp_interface(cfg),
		.pin_root = cfg->xdp.pin_root,
		.port_lo = cfg->base_port,
		.nports = (uint16_t)cfg->ncores,
		.max_chunks = cfg->xdp.max_chunks,
	};
	struct pboxd_xdp *x;
	struct in_addr a;

	*out = NULL;
	if (o.ifname[0] == '\0') {
		return 0;
	}
	if (pbox_xdp_mode_parse(cfg->xdp.mode, &o.mode) != 0) {
		PBOX_LOG_ERR(TRANSPORT, "xdp.mode '%s': expected auto, native or generic",
			     cfg->xdp.mode);
		return -EINVAL;
	}
	/* A wildcard data address accepts datagrams to any address of the interface. */
	if (inet_pton(AF_INET, cfg->data_addr, &a) == 1) {
		o.data_addr = a.s_addr;
	}
	x = calloc(1, sizeof(*x));
	if (x == NULL) {
		return -ENOMEM;
	}
	snprintf(x->ifname, sizeof(x->ifname), "%s", o.ifname);
	x->prog = pbox_xdp_open(&o);
	if (x->prog == NULL) {
		free(x);
		return -EIO;
	}
	*out = x;
	return 0;
}

struct pbox_xdp *pboxd_xdp_prog(const struct pboxd_xdp *x)
{
	return x != NULL ? x->prog : NULL;
}

void pboxd_xdp_stop(struct pboxd_xdp *x)
{
	if (x == NULL) {
		return;
	}
	pbox_xdp_close(x->prog);
	free(x->jobs);
	free(x);
}

static const struct pbox_job *tab_find(const struct pbox_jobtab *tab, uint32_t id)
{
	for (uint32_t i = 0; i < tab->njobs; i++) {
		if (tab->jobs[i]->wire.id == id) {
			return tab->jobs[i];
		}
	}
	return NULL;
}

static void load_chunks(struct pboxd_xdp *x, const struct pbox_job *j)
{
	const struct pbox_jobdesc *d = j->wire.desc;
	uint32_t *core = malloc((d->nchunks ? d->nchunks : 1) * sizeof(*core));

	if (core == NULL) {
		PBOX_LOG_WARN(TRANSPORT, "%s: XDP: job %u: out of memory for the chunk owners",
			      x->ifname, j->wire.id);
		return;
	}
	for (uint32_t c = 0; c < d->nchunks; c++) {
		core[c] = d->chunks[c].core;
	}
	pbox_xdp_chunks_set(x->prog, j->wire.id, core, d->nchunks); /* logs failures */
	free(core);
}

void pboxd_xdp_sync(void *arg, const struct pbox_jobtab *tab)
{
	struct pboxd_xdp *x = arg;

	/* Jobs gone from the table first: their cookies must stop passing. */
	for (uint32_t i = 0; i < x->njobs;) {
		if (tab_find(tab, x->jobs[i]) == NULL) {
			pbox_xdp_job_remove(x->prog, x->jobs[i]);
			x->jobs[i] = x->jobs[--x->njobs];
		} else {
			i++;
		}
	}
	for (uint32_t i = 0; i < tab->njobs; i++) {
		const struct pbox_job *j = tab->jobs[i];
		bool known = pbox_xdp_job_known(x->prog, j->wire.id);

		if (!known && x->njobs == x->cap) {
			uint32_t cap = x->cap ? 2 * x->cap : 8;
			uint32_t *n = realloc(x->jobs, cap * sizeof(*n));

			if (n == NULL) {
				PBOX_LOG_ERR(TRANSPORT, "%s: XDP: job %u: out of memory", x->ifname,
					     j->wire.id);
				continue;
			}
			x->jobs = n;
			x->cap = cap;
		}
		if (pbox_xdp_job_set(x->prog, j->wire.id, j->wire.desc->nworkers,
				     j->wire.cookies) != 0) {
			continue; /* logged; its datagrams are dropped until the next sync */
		}
		if (!known) {
			x->jobs[x->njobs++] = j->wire.id;
			load_chunks(x, j);
		}
	}
}

json_t *pboxd_xdp_stats_json(const struct pboxd_xdp *x)
{
	struct pbox_xdp_stats st;
	uint64_t redirected = 0, passed, dropped = 0;
	json_t *o, *drops, *cores;

	if (x == NULL || pbox_xdp_stats_read(x->prog, &st) != 0) {
		return NULL;
	}
	drops = json_object();
	for (int r = 1; r < PBOX_DROP_COUNT; r++) {
		dropped += st.drop[r];
		if (st.drop[r] != 0) {
			json_object_set_new(drops, pbox_drop_reason_name(r),
					    json_integer((json_int_t)st.drop[r]));
		}
	}
	passed = st.pass_other + st.pass_fragment + st.pass_no_owner + st.pass_queue;
	cores = json_array();
	for (uint32_t k = 0; k < PBOX_XDP_MAX_CORES; k++) {
		redirected += st.core_redirect[k];
		passed += st.core_pass[k];
		if (st.core_redirect[k] != 0 || st.core_pass[k] != 0) {
			json_array_append_new(
				cores, json_pack("{s:i, s:I, s:I}", "core", (int)k, "redirected",
						 (json_int_t)st.core_redirect[k], "passed",
						 (json_int_t)st.core_pass[k]));
		}
	}
	o = json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "interface", x->ifname,
		      "mode", pbox_xdp_attach_mode(x->prog), "rx", (json_int_t)st.rx, "passed",
		      (json_int_t)passed, "redirected", (json_int_t)redirected, "dropped",
		      (json_int_t)dropped, "pass_other", (json_int_t)st.pass_other, "pass_fragment",
		      (json_int_t)st.pass_fragment, "pass_no_owner", (json_int_t)st.pass_no_owner,
		      "pass_queue", (json_int_t)st.pass_queue);
	json_object_set_new(o, "drops", drops);
	json_object_set_new(o, "cores", cores);
	return o;
}

#else /* !PBOX_HAVE_XDP */

struct pboxd_xdp {
	int unused;
};

int pboxd_xdp_start(const struct pboxd_config *cfg, struct pboxd_xdp **out)
{
	*out = NULL;
	if (pboxd_xdp_interface(cfg)[0] == '\0') {
		return 0;
	}
	PBOX_LOG_ERR(TRANSPORT,
		     "xdp.interface '%s': this pboxd was built without XDP support (nicfw/ needs "
		     "clang, bpftool and libbpf-dev at build time)",
		     pboxd_xdp_interface(cfg));
	return -ENOTSUP;
}

struct pbox_xdp *pboxd_xdp_prog(const struct pboxd_xdp *x)
{
	(void)x;
	return NULL;
}

void pboxd_xdp_stop(struct pboxd_xdp *x)
{
	(void)x;
}

void pboxd_xdp_sync(void *arg, const struct pbox_jobtab *tab)
{
	(void)arg;
	(void)tab;
}

json_t *pboxd_xdp_stats_json(const struct pboxd_xdp *x)
{
	(void)x;
	return NULL;
}

#endif /* PBOX_HAVE_XDP */

void pboxd_xdp_stats_print(FILE *f, const struct pboxd_xdp *x)
{
	json_t *o = pboxd_xdp_stats_json(x), *v;
	const char *key;

	if (o == NULL) {
		return;
	}
	fprintf(f,
		"xdp %s (%s): rx %" JSON_INTEGER_FORMAT " passed %" JSON_INTEGER_FORMAT
		" redirected %" JSON_INTEGER_FORMAT " dropped %" JSON_INTEGER_FORMAT "\n",
		json_string_value(json_object_get(o, "interface")),
		json_string_value(json_object_get(o, "mode")),
		json_integer_value(json_object_get(o, "rx")),
		json_integer_value(json_object_get(o, "passed")),
		json_integer_value(json_object_get(o, "redirected")),
		json_integer_value(json_object_get(o, "dropped")));
	if (json_object_size(json_object_get(o, "drops")) != 0) {
		fprintf(f, "xdp drops:");
		json_object_foreach(json_object_get(o, "drops"), key, v)
		{
			fprintf(f, " %s=%" JSON_INTEGER_FORMAT, key, json_integer_value(v));
		}
		fprintf(f, "\n");
	}
	fflush(f);
	json_decref(o);
}
