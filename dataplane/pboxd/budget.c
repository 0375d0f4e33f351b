/* SPDX-License-Identifier: BSD-3-Clause */
/* Memory budgets of job sessions (see budget.h). */
#include "budget.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"

const char *pboxd_budget_fmt(uint64_t bytes, char *buf, size_t len)
{
	static const char *const units[] = { "bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
	double v = (double)bytes;
	unsigned u = 0;

	if (bytes == UINT64_MAX) {
		snprintf(buf, len, "more than 16 EiB");
		return buf;
	}
	while (v >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
		v /= 1024;
		u++;
	}
	if (u == 0) {
		snprintf(buf, len, "%" PRIu64 " bytes", bytes);
	} else {
		snprintf(buf, len, "%.2f %s (%" PRIu64 " bytes)", v, units[u], bytes);
	}
	return buf;
}

/* A /proc/meminfo field in bytes, or 0 if absent. */
static uint64_t meminfo(const char *field)
{
	FILE *f = fopen("/proc/meminfo", "re");
	char line[256];
	size_t flen = strlen(field);
	uint64_t v = 0;

	if (f == NULL) {
		return 0;
	}
	while (fgets(line, sizeof(line), f) != NULL) {
		unsigned long long kb;

		if (strncmp(line, field, flen) == 0 && line[flen] == ':' &&
		    sscanf(line + flen + 1, "%llu", &kb) == 1) {
			v = (uint64_t)kb * 1024;
			break;
		}
	}
	fclose(f);
	return v;
}

/* A number of bytes from a file ("max" or absent: UINT64_MAX). */
static uint64_t read_limit(const char *path)
{
	FILE *f = fopen(path, "re");
	unsigned long long v;
	uint64_t r = UINT64_MAX;

	if (f == NULL) {
		return r;
	}
	if (fscanf(f, "%llu", &v) == 1) {
		r = (uint64_t)v;
	}
	fclose(f);
	return r;
}

/* The memory limit of this process's cgroup (v2 memory.max or v1 memory.limit_in_bytes),
 * UINT64_MAX if none: in a container MemTotal is the host's memory. */
static uint64_t cgroup_limit(void)
{
	FILE *f = fopen("/proc/self/cgroup", "re");
	char line[512], path[640];
	uint64_t lim = UINT64_MAX;

	if (f == NULL) {
		return lim;
	}
	while (fgets(line, sizeof(line), f) != NULL) {
		char *nl = strchr(line, '\n'), *ctl = strchr(line, ':'), *cg;

		if (nl != NULL) {
			*nl = '\0';
		}
		cg = ctl != NULL ? strchr(ctl + 1, ':') : NULL;
		if (cg == NULL) {
			continue;
		}
		*cg++ = '\0';
		if (strcmp(ctl + 1, "") == 0) {
			snprintf(path, sizeof(path), "/sys/fs/cgroup%s/memory.max", cg);
		} else if (strstr(ctl + 1, "memory") != NULL) {
			snprintf(path, sizeof(path),
				 "/sys/fs/cgroup/memory%s/memory.limit_in_bytes", cg);
		} else {
			continue;
		}
		lim = PBOX_MIN(lim, read_limit(path));
	}
	fclose(f);
	return lim;
}

uint64_t pboxd_budget_machine_default(void)
{
	uint64_t total = meminfo("MemTotal"), huge = meminfo("Hugetlb");

	if (total == 0) {
		long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);

		total = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : UINT64_C(1) << 30;
	}
	if (huge < total) {
		total -= huge;
	}
	total = PBOX_MIN(total, cgroup_limit());
	return total / 2 ? total / 2 : 1;
}

void pboxd_budget_init(struct pboxd_budget *b, uint64_t configured)
{
	char buf[64];

	memset(b, 0, sizeof(*b));
	b->limit = configured != 0 ? configured : pboxd_budget_machine_default();
	PBOX_LOG_INFO(ADMIN, "memory budget for chunk state: %s%s",
		      pboxd_budget_fmt(b->limit, buf, sizeof(buf)),
		      configured != 0 ? "" : " (auto: half of the memory outside hugepages)");
}

/* Refuse need against the job's and the appliance's budgets; what is a lower bound says
 * "at least". */
static int check(const struct pboxd_budget *b, const struct pboxd_job_cfg *cfg, uint64_t need,
		 bool lower_bound, char *err, size_t errlen)
{
	char n[64], l[64], u[64], f[64];
	const char *least = lower_bound ? "at least " : "";

	if (cfg->memory_budget != 0 && need > cfg->memory_budget) {
		snprintf(
			err, errlen,
			"the key set needs %s%s of chunk state, over the job's memory_budget of %s",
			least, pboxd_budget_fmt(need, n, sizeof(n)),
			pboxd_budget_fmt(cfg->memory_budget, l, sizeof(l)));
		return -ENOSPC;
	}
	if (need > b->limit || b->in_use > b->limit - need) {
		snprintf(err, errlen,
			 "the key set needs %s%s of chunk state; the appliance's memory_budget is "
			 "%s, of which %s is in use by %u running session(s) (%s free)",
			 least, pboxd_budget_fmt(need, n, sizeof(n)),
			 pboxd_budget_fmt(b->limit, l, sizeof(l)),
			 pboxd_budget_fmt(b->in_use, u, sizeof(u)), b->njobs,
			 pboxd_budget_fmt(b->limit > b->in_use ? b->limit - b->in_use : 0, f,
					  sizeof(f)));
		return -ENOSPC;
	}
	return 0;
}

int pboxd_budget_precheck(const struct pboxd_budget *b, const struct pboxd_job_cfg *cfg,
			  const struct pbox_job *params, const struct pbox_keyspec *keys,
			  uint32_t nkeys, uint32_t chunk_bytes, uint32_t frag_bytes, char *err,
			  size_t errlen)
{
	uint64_t nchunks, need;
	int rc;

	rc = pbox_jobdesc_count_chunks(keys, nkeys, chunk_bytes, &nchunks, err, errlen);
	if (rc != 0) {
		return rc;
	}
	need = pbox_job_state_bytes_min(params, keys, nkeys, cfg->workers, chunk_bytes, frag_bytes);
	return check(b, cfg, need, true, err, errlen);
}

int pboxd_budget_charge(struct pboxd_budget *b, const struct pboxd_job_cfg *cfg, uint64_t need,
			char *err, size_t errlen)
{
	int rc = check(b, cfg, need, false, err, errlen);

	if (rc == 0) {
		b->in_use += need;
		b->njobs++;
	}
	return rc;
}

void pboxd_budget_release(struct pboxd_budget *b, uint64_t bytes)
{
	if (bytes == 0) {
		return;
	}
	b->in_use -= PBOX_MIN(bytes, b->in_use);
	b->njobs -= b->njobs != 0;
}

/* What the layout needs of a job's parameters (sessions.c fills the rest). */
static void layout_params(const struct pboxd_job_cfg *c, const struct pbox_jobdesc *d,
			  struct pbox_job *pj)
{
	memset(pj, 0, sizeof(*pj));
	pj->wire.id = c->id;
	pj->wire.desc = d;
	pj->mode = c->mode;
	pj->deterministic = c->deterministic;
	pj->window = c->window;
	pj->opt = c->opt;
	pj->sync = c->sync;
	pj->sync_cfg = c->sync_cfg;
	pj->checkpoint = c->checkpoint;
}

int pboxd_budget_job_need(const struct pboxd_config *cfg, const struct pboxd_job_cfg *c,
			  uint64_t *need, uint32_t *nchunks, char *err, size_t errlen)
{
	uint32_t frag = pbox_frag_bytes_for_mtu(cfg->mtu, cfg->chunk_bytes);
	struct pbox_jobdesc d;
	struct pbox_job pj;
	int rc;

	if (c->keys == NULL) {
		/* Bytes of one full chunk: the key set comes with the first register. */
		struct pbox_keyspec one = { 0, cfg->chunk_bytes / 4 };

		layout_params(c, NULL, &pj);
		*need = pbox_job_state_bytes_min(&pj, &one, 1, c->workers, cfg->chunk_bytes, frag);
		*nchunks = 0;
		return 0;
	}
	rc = pbox_jobdesc_build(&d, c->keys, c->nkeys, c->workers, cfg->ncores, cfg->chunk_bytes,
				frag, NULL, err, errlen);
	if (rc != 0) {
		return rc;
	}
	layout_params(c, &d, &pj);
	*need = pbox_job_state_bytes(&pj);
	*nchunks = d.nchunks;
	pbox_jobdesc_free(&d);
	return 0;
}

int pboxd_budget_admit(const struct pboxd_budget *b, const struct pboxd_config *cfg,
		       const struct pboxd_job_cfg *c, char *err, size_t errlen)
{
	struct pboxd_budget empty = { .limit = b->limit };
	uint32_t nchunks;
	uint64_t need;
	char msg[320], n[64], l[64];
	int rc = pboxd_budget_job_need(cfg, c, &need, &nchunks, msg, sizeof(msg));

	if (rc != 0) {
		snprintf(err, errlen, "the configured key set is refused: %s", msg);
		return rc;
	}
	/* Against the whole budget, not what is free now: sessions come and go. */
	rc = check(&empty, c, need, c->keys == NULL, msg, sizeof(msg));
	if (rc != 0 && (c->memory_budget == 0 || need <= c->memory_budget)) {
		snprintf(err, errlen,
			 "can never start: the key set needs %s%s of chunk state, over the "
			 "appliance's memory_budget of %s",
			 c->keys == NULL ? "per chunk " : "", pboxd_budget_fmt(need, n, sizeof(n)),
			 pboxd_budget_fmt(b->limit, l, sizeof(l)));
	} else if (rc != 0) {
		snprintf(err, errlen, "can never start: %s%s", msg,
			 c->keys == NULL ? " (for one chunk)" : "");
	}
	return rc;
}

int pboxd_budget_report(const struct pboxd_config *cfg, FILE *out)
{
	struct pboxd_budget b;
	char n[64], l[64], err[320];
	int ret = 0;

	memset(&b, 0, sizeof(b));
	b.limit = cfg->memory_budget != 0 ? cfg->memory_budget : pboxd_budget_machine_default();
	fprintf(out, "memory budget: %s%s\n", pboxd_budget_fmt(b.limit, l, sizeof(l)),
		cfg->memory_budget != 0 ? "" : " (auto)");
	for (uint32_t i = 0; i < cfg->njobs; i++) {
		const struct pboxd_job_cfg *c = &cfg->jobs[i];
		uint32_t nchunks;
		uint64_t need;
		int rc = pboxd_budget_job_need(cfg, c, &need, &nchunks, err, sizeof(err));

		if (rc != 0) {
			fprintf(out, "job %u: the configured key set is refused: %s\n", c->id, err);
			ret = ret ? ret : rc;
			continue;
		}
		if (c->keys == NULL) {
			fprintf(out,
				"job %u: key set defined at registration; %s of chunk state per "
				"%u-byte chunk (%.1fx the parameters)",
				c->id, pboxd_budget_fmt(need, n, sizeof(n)), cfg->chunk_bytes,
				(double)need / cfg->chunk_bytes);
			if (c->memory_budget != 0) {
				fprintf(out, "; job budget %s",
					pboxd_budget_fmt(c->memory_budget, l, sizeof(l)));
			}
			fprintf(out, "\n");
			continue;
		}
		fprintf(out, "job %u: %u keys, %u chunks: worst-case chunk state %s\n", c->id,
			c->nkeys, nchunks, pboxd_budget_fmt(need, n, sizeof(n)));
		if (check(&b, c, need, false, err, sizeof(err)) != 0) {
			fprintf(out, "job %u: can never start: %s\n", c->id, err);
			ret = ret ? ret : -ENOSPC;
		}
	}
	return ret;
}
