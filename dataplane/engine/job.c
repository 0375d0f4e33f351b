/* SPDX-License-Identifier: BSD-3-Clause */
/* Job table lookup and the per-core state arenas of a job session (see job.h). */
#include "job.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/log.h"

const struct pbox_job *pbox_jobtab_find(const struct pbox_jobtab *tab, uint32_t id)
{
	uint32_t lo = 0, hi;

	if (tab == NULL) {
		return NULL;
	}
	hi = tab->njobs;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		uint32_t mid_id = tab->jobs[mid]->wire.id;

		if (mid_id == id) {
			return tab->jobs[mid];
		}
		if (mid_id < id) {
			lo = mid + 1;
		} else {
			hi = mid;
		}
	}
	return NULL;
}

const struct pbox_wire_job *pbox_jobtab_lookup(void *arg, uint32_t id)
{
	const struct pbox_job *j = pbox_jobtab_find(arg, id);

	return j != NULL ? &j->wire : NULL;
}

/*
 * Arena carving in two passes: with base == NULL only the size is accumulated, then the
 * same sequence of carve() calls hands out pointers into the real arena. Every piece is
 * cache-line aligned so vector kernels and per-worker rows never share a line.
 */
struct carver {
	char *base;
	size_t off;
};

static void *carve(struct carver *c, size_t bytes)
{
	void *p;

	c->off = PBOX_ALIGN_UP(c->off, PBOX_CACHE_LINE);
	p = c->base != NULL ? c->base + c->off : NULL;
	c->off += bytes;
	return p;
}

static void layout_core(const struct pbox_job *job, uint32_t core, struct carver *c,
			struct pbox_core_job *cj)
{
	const struct pbox_jobdesc *d = job->wire.desc;
	uint32_t n = d->core_nchunks[core], nw = d->nworkers;
	size_t wwords = PBOX_DIV_ROUND_UP(nw, 64);
	unsigned nstate = job->mode == PBOX_MODE_SERVER_OPT ? job->opt->nstate : 0;

	cj->nchunks = n;
	cj->chunks = carve(c, n * sizeof(*cj->chunks));
	cj->peers = carve(c, nw * sizeof(*cj->peers));
	cj->peer_cookie = carve(c, nw * sizeof(*cj->peer_cookie));
	cj->seen_live = carve(c, wwords * 8);
	for (uint32_t i = 0; i < n; i++) {
		const struct pbox_chunk_desc *cd = &d->chunks[d->core_chunks[core][i]];
		struct pbox_chunk_state *cs = c->base ? &cj->chunks[i] : NULL;
		struct pbox_chunk_state tmp;
		size_t fwords = PBOX_DIV_ROUND_UP(cd->nfrags, 64);

		if (cs == NULL) {
			cs = &tmp; /* sizing pass: pointers are discarded */
		}
		memset(cs, 0, sizeof(*cs));
		cs->id = d->core_chunks[core][i];
		cs->initialized = job->mode != PBOX_MODE_SERVER_OPT;
		if (job->mode == PBOX_MODE_SERVER_OPT) {
			cs->model[0] = carve(c, cd->bytes);
			cs->model[1] = carve(c, cd->bytes);
			cs->init_bits = carve(c, fwords * 8);
			if (nstate >= 1) {
				cs->s0 = carve(c, cd->bytes);
			}
			if (nstate >= 2) {
				cs->s1 = carve(c, cd->bytes);
			}
		}
		cs->pull_want = carve(c, nw * sizeof(uint32_t));
		cs->blocked = carve(c, wwords * 8);
		if (job->sync->folds_late) {
			cs->late_iter = carve(c, nw * sizeof(uint32_t));
			cs->late_cnt = carve(c, nw * sizeof(uint16_t));
			cs->late_bits = carve(c, nw * fwords * 8);
		}
		cs->slot = carve(c, job->window * sizeof(struct pbox_slot));
		for (uint32_t s = 0; s < job->window; s++) {
			struct pbox_slot tmps, *sl = c->base ? &cs->slot[s] : &tmps;

			memset(sl, 0, sizeof(*sl));
			sl->acc = carve(c, cd->bytes);
			sl->bits = carve(c, nw * fwords * 8);
			sl->wcnt = carve(c, nw * sizeof(uint16_t));
			sl->need = carve(c, cd->nfrags * sizeof(uint16_t));
			sl->fcnt = carve(c, cd->nfrags * sizeof(uint16_t));
			sl->done = carve(c, wwords * 8);
			if (job->deterministic) {
				sl->stage = carve(c, nw * sizeof(float *));
				for (uint32_t w = 0; w < nw; w++) {
					float *p = carve(c, cd->bytes);

					if (c->base != NULL) {
						sl->stage[w] = p;
					}
				}
			}
		}
		if (c->base != NULL) {
			for (uint32_t w = 0; w < nw; w++) {
				cs->pull_want[w] = PBOX_PULL_NONE;
				if (cs->late_iter != NULL) {
					cs->late_iter[w] = UINT32_MAX;
				}
			}
		}
	}
	if (c->base != NULL) {
		/* The state starts out reconciled with the membership it was created for. */
		cj->seen_generation = job->generation;
		if (job->live != NULL) {
			memcpy(cj->seen_live, job->live, wwords * 8);
		}
	}
}

size_t pbox_job_state_core_bytes(const struct pbox_job *job, uint32_t core)
{
	struct carver c = { 0 };
	struct pbox_core_job cj;

	layout_core(job, core, &c, &cj);
	return PBOX_ALIGN_UP(c.off, 4096);
}

struct pbox_job_state *pbox_job_state_create(const struct pbox_job *job)
{
	const struct pbox_jobdesc *d = job->wire.desc;
	struct pbox_job_state *st;

	st = aligned_alloc(
		PBOX_CACHE_LINE,
		PBOX_ALIGN_UP(sizeof(*st) + d->ncores * sizeof(st->core[0]), PBOX_CACHE_LINE));
	if (st == NULL) {
		PBOX_LOG_ERR(ENGINE, "job %u: out of memory for the per-core state table",
			     job->wire.id);
		return NULL;
	}
	memset(st, 0, sizeof(*st) + d->ncores * sizeof(st->core[0]));
	st->ncores = d->ncores;
	for (uint32_t k = 0; k < d->ncores; k++) {
		struct pbox_core_job *cj = &st->core[k];
		size_t bytes = pbox_job_state_core_bytes(job, k);
		struct carver c;

		/* Anonymous mmap: zeroed, page aligned, and populated now so the first
		 * packets do not take page faults on the data-plane core. */
		c.base = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
			      MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
		if (c.base == MAP_FAILED) {
			PBOX_LOG_ERR(ENGINE,
				     "job %u core %u: cannot map %zu bytes of chunk state: %s",
				     job->wire.id, k, bytes, strerror(errno));
			pbox_job_state_free(st);
			return NULL;
		}
		c.off = 0;
		cj->arena = c.base;
		cj->arena_bytes = bytes;
		layout_core(job, k, &c, cj);
	}
	return st;
}

void pbox_job_state_free(struct pbox_job_state *st)
{
	if (st == NULL) {
		return;
	}
	for (uint32_t k = 0; k < st->ncores; k++) {
		if (st->core[k].arena != NULL) {
			munmap(st->core[k].arena, st->core[k].arena_bytes);
		}
	}
	free(st);
}
