/* SPDX-License-Identifier: BSD-3-Clause */
/* Job table lookup and the per-core state arenas of a job session (see job.h). */
#include "job.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/log.h"
#include "encoding.h"

uint32_t pbox_job_min_window(enum pbox_job_mode mode, const struct pbox_sync_ops *sync,
			     const struct pbox_sync_cfg *sc, uint32_t credits)
{
	uint32_t w = PBOX_MAX(sync->min_window(sc), credits + 1);

	if (mode == PBOX_MODE_BROADCAST) {
		uint64_t s = sync->worker_staleness(sc), b = 2 * s + 1 + credits;

		w = (uint32_t)PBOX_MAX((uint64_t)w, PBOX_MIN(b, (uint64_t)UINT32_MAX));
	}
	return w;
}

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
 * cache-line aligned so vector kernels and per-worker rows never share a line. Offsets are
 * 64-bit and saturate at UINT64_MAX, so sizing a hostile key set cannot wrap around.
 */
struct carver {
	char *base;
	uint64_t off;
	struct carver *res; /* the results' own arena (pbox_result_ops), or NULL: this one */
};

static uint64_t sat_add(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static uint64_t sat_mul(uint64_t a, uint64_t b)
{
	return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

static uint64_t line_up(uint64_t off)
{
	return off > UINT64_MAX - PBOX_CACHE_LINE ? UINT64_MAX
						  : PBOX_ALIGN_UP(off, PBOX_CACHE_LINE);
}

static void *carve(struct carver *c, uint64_t bytes)
{
	void *p;

	c->off = line_up(c->off);
	p = c->base != NULL ? c->base + c->off : NULL;
	c->off = sat_add(c->off, bytes);
	return p;
}

/* A buffer results are sent from: in the results' arena when the state has one, after
 * its line (struct pbox_res_line), whose generation word goes to *gen (else NULL). */
static void *carve_res(struct carver *c, uint64_t bytes, uint64_t **gen)
{
	struct pbox_res_line *l;

	*gen = NULL;
	if (c->res == NULL) {
		return carve(c, bytes);
	}
	l = carve(c->res, sizeof(*l));
	if (l != NULL) {
		l->magic = PBOX_RES_MAGIC;
		*gen = &l->gen;
	}
	return carve(c->res, bytes);
}

/* Both carvers' offsets, to size a repeated layout once (memo below). */
struct carve_mark {
	uint64_t off, res_off;
};

static struct carve_mark carve_mark(const struct carver *c)
{
	return (struct carve_mark){ line_up(c->off), c->res != NULL ? line_up(c->res->off) : 0 };
}

/* After one layout from mark m: the size it took in each carver. */
static struct carve_mark carve_span(const struct carver *c, struct carve_mark m)
{
	return (struct carve_mark){ c->off - m.off, c->res != NULL && c->res->off > m.res_off
							    ? c->res->off - m.res_off
							    : 0 };
}

/* Advance each carver from m by n layouts of span one (every layout starts on a line). */
static void carve_repeat(struct carver *c, struct carve_mark m, struct carve_mark one, uint64_t n)
{
	c->off = sat_add(m.off, sat_add(sat_mul(n - 1, line_up(one.off)), one.off));
	if (c->res != NULL && one.res_off != 0) {
		c->res->off = sat_add(m.res_off,
				      sat_add(sat_mul(n - 1, line_up(one.res_off)), one.res_off));
	}
}

/* One window slot; sl is NULL in the sizing pass. */
static void layout_slot(const struct pbox_job *job, const struct pbox_chunk_desc *cd,
			struct carver *c, struct pbox_slot *sl)
{
	uint32_t nw = job->wire.desc->nworkers;
	size_t wwords = PBOX_DIV_ROUND_UP(nw, 64), fwords = PBOX_DIV_ROUND_UP(cd->nfrags, 64);
	struct pbox_slot tmp;

	if (sl == NULL) {
		sl = &tmp;
	}
	memset(sl, 0, sizeof(*sl));
	sl->acc = carve_res(c, cd->bytes, &sl->acc_gen);
	sl->bits = carve(c, (uint64_t)nw * fwords * 8);
	sl->wcnt = carve(c, (uint64_t)nw * sizeof(uint16_t));
	sl->need = carve(c, (uint64_t)cd->nfrags * sizeof(uint16_t));
	sl->fcnt = carve(c, (uint64_t)cd->nfrags * sizeof(uint16_t));
	sl->done = carve(c, wwords * 8);
	if (pbox_enc_job_filters_results(job)) {
		sl->enc = carve(c, cd->bytes); /* encoded: never shown in place */
		sl->enc_len = carve(c, (uint64_t)cd->nfrags * sizeof(uint16_t));
	}
	if (job->deterministic) {
		sl->stage = carve(c, (uint64_t)nw * sizeof(float *));
		if (c->base == NULL) {
			/* nw pieces of cd->bytes, each starting on a line. */
			c->off = sat_add(line_up(c->off),
					 sat_add(sat_mul(nw - 1, line_up(cd->bytes)), cd->bytes));
		} else {
			for (uint32_t w = 0; w < nw; w++) {
				sl->stage[w] = carve(c, cd->bytes);
			}
		}
	}
}

/* One owned chunk; cs is NULL in the sizing pass. Starts with a carve (so on a line). */
static void layout_chunk(const struct pbox_job *job, const struct pbox_chunk_desc *cd,
			 struct carver *c, struct pbox_chunk_state *cs)
{
	uint32_t nw = job->wire.desc->nworkers;
	size_t wwords = PBOX_DIV_ROUND_UP(nw, 64), fwords = PBOX_DIV_ROUND_UP(cd->nfrags, 64);
	unsigned nstate = job->mode == PBOX_MODE_SERVER_OPT ? job->opt->nstate : 0;
	struct pbox_chunk_state tmp;

	if (cs == NULL) {
		cs = &tmp; /* sizing pass: pointers are discarded */
	}
	memset(cs, 0, sizeof(*cs));
	cs->initialized = job->mode != PBOX_MODE_SERVER_OPT;
	if (job->mode == PBOX_MODE_SERVER_OPT) {
		cs->model[0] = carve_res(c, cd->bytes, &cs->model_gen[0]);
		cs->model[1] = carve_res(c, cd->bytes, &cs->model_gen[1]);
		cs->init_bits = carve(c, fwords * 8);
		if (nstate >= 1) {
			cs->s0 = carve(c, cd->bytes);
		}
		if (nstate >= 2) {
			cs->s1 = carve(c, cd->bytes);
		}
	}
	cs->pull_want = carve(c, (uint64_t)nw * sizeof(uint32_t));
	cs->blocked = carve(c, wwords * 8);
	if (pbox_enc_job_filters_results(job)) {
		cs->resid = carve(c, cd->bytes); /* zeroed arena: R starts at 0 */
	}
	if (job->sync->folds_late) {
		cs->late_iter = carve(c, (uint64_t)nw * sizeof(uint32_t));
		cs->late_cnt = carve(c, (uint64_t)nw * sizeof(uint16_t));
		cs->late_bits = carve(c, (uint64_t)nw * fwords * 8);
	}
	if (job->mode == PBOX_MODE_SERVER_OPT && job->checkpoint) {
		cs->snap = carve(c, (uint64_t)(1 + nstate) * cd->bytes);
		cs->snap_want = PBOX_SNAP_NONE;
		cs->snap_have = PBOX_SNAP_NONE;
	}
	cs->slot = carve(c, (uint64_t)job->window * sizeof(struct pbox_slot));
	if (c->base == NULL) {
		/* Every slot is laid out alike from a line boundary: size one. */
		struct carve_mark start = carve_mark(c);

		layout_slot(job, cd, c, NULL);
		carve_repeat(c, start, carve_span(c, start), job->window);
		return;
	}
	for (uint32_t s = 0; s < job->window; s++) {
		layout_slot(job, cd, c, &cs->slot[s]);
	}
	for (uint32_t w = 0; w < nw; w++) {
		cs->pull_want[w] = PBOX_PULL_NONE;
		if (cs->late_iter != NULL) {
			cs->late_iter[w] = UINT32_MAX;
		}
	}
}

/* One core's arena; core 0's also holds the shared per-rank pins (*pins). */
static void layout_core(const struct pbox_job *job, uint32_t core, struct carver *c,
			struct pbox_core_job *cj, struct pbox_rank_pin **pins)
{
	const struct pbox_jobdesc *d = job->wire.desc;
	uint32_t n = d->core_nchunks[core], nw = d->nworkers, memo_bytes = 0;
	size_t wwords = PBOX_DIV_ROUND_UP(nw, 64);
	struct carve_mark memo = { 0, 0 };

	cj->nchunks = n;
	cj->chunks = carve(c, (uint64_t)n * sizeof(*cj->chunks));
	cj->peers = carve(c, (uint64_t)nw * sizeof(*cj->peers));
	cj->peer_cookie = carve(c, (uint64_t)nw * sizeof(*cj->peer_cookie));
	cj->seen_live = carve(c, wwords * 8);
	if (core == 0) {
		*pins = carve(c, (uint64_t)nw * sizeof(**pins));
	}
	for (uint32_t i = 0; i < n; i++) {
		const struct pbox_chunk_desc *cd = &d->chunks[d->core_chunks[core][i]];

		if (c->base == NULL) {
			/* A chunk's layout depends only on its size (nfrags follows from it),
			 * and most chunks are full: size each distinct size once. */
			struct carve_mark start = carve_mark(c);

			if (cd->bytes == memo_bytes) {
				carve_repeat(c, start, memo, 1);
			} else {
				layout_chunk(job, cd, c, NULL);
				memo = carve_span(c, start);
				memo_bytes = cd->bytes;
			}
			continue;
		}
		layout_chunk(job, cd, c, &cj->chunks[i]);
		cj->chunks[i].id = d->core_chunks[core][i];
	}
	if (c->base != NULL) {
		/* The state starts out reconciled with the membership it was created for. */
		cj->seen_generation = job->generation;
		if (job->live != NULL) {
			memcpy(cj->seen_live, job->live, wwords * 8);
		}
	}
}

static uint64_t page_up(uint64_t b)
{
	return b > UINT64_MAX - 4096 ? UINT64_MAX : PBOX_ALIGN_UP(b, 4096);
}

static const struct pbox_arena_ops *g_arena_ops;
static const struct pbox_result_ops *g_result_ops;

/* Results get their own arena when result ops are installed and the arenas are not the
 * transport's (DPDK sends results from its own memory). */
static const struct pbox_result_ops *result_ops_now(void)
{
	return g_arena_ops == NULL ? g_result_ops : NULL;
}

/* A core's arena bytes; *res_bytes: its results' arena (0 when res is false: none). */
static uint64_t core_bytes2(const struct pbox_job *job, uint32_t core, bool res,
			    uint64_t *res_bytes)
{
	struct carver r = { 0 };
	struct carver c = { .res = res ? &r : NULL };
	struct pbox_core_job cj;
	struct pbox_rank_pin *pins;

	layout_core(job, core, &c, &cj, &pins);
	/* At least a page: a core that owns none of the job's chunks still has an arena
	 * (every worker maps one per core). */
	*res_bytes = res ? page_up(PBOX_MAX(r.off, (uint64_t)1)) : 0;
	return page_up(c.off);
}

static uint64_t core_bytes(const struct pbox_job *job, uint32_t core)
{
	uint64_t rb, b = core_bytes2(job, core, result_ops_now() != NULL, &rb);

	return sat_add(b, rb);
}

size_t pbox_job_state_core_bytes(const struct pbox_job *job, uint32_t core)
{
	uint64_t b = core_bytes(job, core);

	return b > SIZE_MAX ? SIZE_MAX : (size_t)b;
}

static uint64_t table_bytes(uint32_t ncores)
{
	return PBOX_ALIGN_UP(sizeof(struct pbox_job_state) +
				     ncores * sizeof(((struct pbox_job_state *)0)->core[0]),
			     PBOX_CACHE_LINE);
}

uint64_t pbox_job_state_bytes(const struct pbox_job *job)
{
	const struct pbox_jobdesc *d = job->wire.desc;
	uint64_t total = table_bytes(d->ncores);

	for (uint32_t k = 0; k < d->ncores; k++) {
		total = sat_add(total, core_bytes(job, k));
	}
	return total;
}

uint64_t pbox_job_state_bytes_min(const struct pbox_job *job, const struct pbox_keyspec *keys,
				  uint32_t nkeys, uint32_t nworkers, uint32_t chunk_bytes,
				  uint32_t frag_bytes)
{
	struct pbox_jobdesc d = { .nworkers = nworkers, .frag_bytes = frag_bytes };
	struct pbox_job j = *job;
	uint64_t per = chunk_bytes / 4, total = 0;

	j.wire.desc = &d;
	for (uint32_t k = 0; k < nkeys; k++) {
		uint64_t full = keys[k].nelem / per, rest = keys[k].nelem % per;
		struct pbox_chunk_desc cd = { 0 };
		struct carver c = { 0 };

		/* Chunks are at most 64 MiB (PBOX_MAX_CHUNK_BYTES): their sizes fit 32 bits. */
		if (full != 0) {
			cd.bytes = chunk_bytes;
			cd.nfrags = PBOX_DIV_ROUND_UP(cd.bytes, frag_bytes);
			layout_chunk(&j, &cd, &c, NULL);
			total = sat_add(total, sat_mul(full, c.off));
		}
		if (rest != 0) {
			c.off = 0;
			cd.bytes = (uint32_t)(rest * 4);
			cd.nfrags = PBOX_DIV_ROUND_UP(cd.bytes, frag_bytes);
			layout_chunk(&j, &cd, &c, NULL);
			total = sat_add(total, c.off);
		}
	}
	return total;
}

void pbox_job_set_arena_ops(const struct pbox_arena_ops *ops)
{
	g_arena_ops = ops;
}

void pbox_job_set_result_ops(const struct pbox_result_ops *ops)
{
	g_result_ops = ops;
}

/* The state with results' arenas from rops (NULL: in the chunk state's own arena). NULL
 * after logging why, *err the cause (ENOMEM, or the allocators' errno). */
static struct pbox_job_state *state_create(const struct pbox_job *job,
					   const struct pbox_result_ops *rops, int *err)
{
	const struct pbox_jobdesc *d = job->wire.desc;
	struct pbox_job_state *st;

	st = aligned_alloc(PBOX_CACHE_LINE, table_bytes(d->ncores));
	if (st == NULL) {
		*err = ENOMEM;
		PBOX_LOG_ERR(ENGINE, "job %u: out of memory for the per-core state table",
			     job->wire.id);
		return NULL;
	}
	memset(st, 0, sizeof(*st) + d->ncores * sizeof(st->core[0]));
	st->ncores = d->ncores;
	st->refs = 1;
	st->arena_ops = g_arena_ops;
	st->result_ops = rops;
	for (uint32_t k = 0; k < d->ncores; k++) {
		st->core[k].res_handle = -1;
	}
	for (uint32_t k = 0; k < d->ncores; k++) {
		struct pbox_core_job *cj = &st->core[k];
		uint64_t rbytes, b = core_bytes2(job, k, st->result_ops != NULL, &rbytes);
		size_t bytes = b > SIZE_MAX ? SIZE_MAX : (size_t)b;
		struct carver c, r = { 0 };

		if (st->arena_ops != NULL) {
			/* The transport's memory (its allocator logs a failure). */
			c.base = st->arena_ops->alloc(st->arena_ops->ctx, bytes, k);
		} else {
			/* Anonymous mmap: zeroed, page aligned, and populated now so the first
			 * packets do not take page faults on the data-plane core. */
			c.base = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
				      MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
			if (c.base == MAP_FAILED) {
				PBOX_LOG_ERR(ENGINE,
					     "job %u core %u: cannot map %zu bytes of chunk state: "
					     "%s",
					     job->wire.id, k, bytes, strerror(errno));
				c.base = NULL;
			}
		}
		if (c.base == NULL) {
			*err = errno != 0 ? errno : ENOMEM;
			pbox_job_state_free(st);
			return NULL;
		}
		c.off = 0;
		c.res = NULL;
		cj->arena = c.base;
		cj->arena_bytes = bytes;
		if (st->result_ops != NULL) {
			/* The results' arena: zeroed, page aligned (its allocator logs a
			 * failure). */
			int rc = rbytes > SIZE_MAX
					 ? -ENOMEM
					 : st->result_ops->alloc(st->result_ops->ctx,
								 (size_t)rbytes, job->wire.id, k,
								 &cj->res_arena, &cj->res_handle);

			if (rc != 0) {
				*err = rc < 0 ? -rc : ENOMEM;
				pbox_job_state_free(st);
				return NULL;
			}
			cj->res_bytes = (size_t)rbytes;
			r.base = cj->res_arena;
			c.res = &r;
		}
		layout_core(job, k, &c, cj, &st->pins);
	}
	return st;
}

struct pbox_job_state *pbox_job_state_create(const struct pbox_job *job)
{
	const struct pbox_result_ops *rops = result_ops_now();
	struct pbox_job_state *st;
	int err = ENOMEM;

	errno = 0;
	st = state_create(job, rops, &err);
	if (st == NULL && rops != NULL && (err == EMFILE || err == ENFILE)) {
		/* Out of descriptors, not memory: the results stay in the chunk state's arena
		 * and go to shm workers as copies; the session is not refused for it. */
		PBOX_LOG_WARN(ENGINE,
			      "job %u: no file descriptor for its results' arenas (%s): its "
			      "results go to shared-memory workers as copies",
			      job->wire.id, strerror(err));
		errno = 0;
		st = state_create(job, NULL, &err);
	}
	if (st == NULL) {
		errno = err;
	}
	return st;
}

void pbox_job_state_free(struct pbox_job_state *st)
{
	if (st == NULL) {
		return;
	}
	for (uint32_t k = 0; k < st->ncores; k++) {
		if (st->core[k].arena != NULL && st->arena_ops != NULL) {
			st->arena_ops->free(st->arena_ops->ctx, st->core[k].arena,
					    st->core[k].arena_bytes);
		} else if (st->core[k].arena != NULL) {
			munmap(st->core[k].arena, st->core[k].arena_bytes);
		}
		if (st->core[k].res_arena != NULL) {
			st->result_ops->free(st->result_ops->ctx, st->core[k].res_arena,
					     st->core[k].res_bytes, st->core[k].res_handle);
		}
	}
	if (st->owns_desc) {
		pbox_jobdesc_free(&st->desc);
	}
	free(st);
}

void pbox_job_state_get(struct pbox_job_state *st)
{
	__atomic_fetch_add(&st->refs, 1, __ATOMIC_RELAXED);
}

void pbox_job_state_put(struct pbox_job_state *st)
{
	if (st == NULL || __atomic_sub_fetch(&st->refs, 1, __ATOMIC_ACQ_REL) != 0) {
		return;
	}
	if (st->release != NULL) {
		st->release(st, st->release_arg);
	} else {
		pbox_job_state_free(st);
	}
}

const struct pbox_jobdesc *pbox_job_state_adopt_desc(struct pbox_job_state *st,
						     const struct pbox_jobdesc *d)
{
	st->desc = *d;
	st->owns_desc = true;
	return &st->desc;
}

void pbox_jobtab_get(struct pbox_jobtab *tab)
{
	if (tab != NULL && tab->release != NULL) {
		__atomic_fetch_add(&tab->refs, 1, __ATOMIC_RELAXED);
	}
}

void pbox_jobtab_put(struct pbox_jobtab *tab)
{
	if (tab == NULL || tab->release == NULL ||
	    __atomic_sub_fetch(&tab->refs, 1, __ATOMIC_ACQ_REL) != 0) {
		return;
	}
	tab->release(tab, tab->release_arg);
}

void pbox_jobtab_free(struct pbox_jobtab *tab)
{
	if (tab == NULL) {
		return;
	}
	for (uint32_t i = 0; i < tab->njobs; i++) {
		free((void *)tab->jobs[i]);
	}
	free(tab);
}

void pbox_chunk_snap_copy(const struct pbox_job *job, const struct pbox_chunk_desc *cd,
			  struct pbox_chunk_state *cs)
{
	char *dst = (char *)cs->snap;

	memcpy(dst, cs->model[cs->version & 1], cd->bytes);
	if (job->opt->nstate >= 1) {
		memcpy(dst + cd->bytes, cs->s0, cd->bytes);
	}
	if (job->opt->nstate >= 2) {
		memcpy(dst + 2 * (size_t)cd->bytes, cs->s1, cd->bytes);
	}
	__atomic_store_n(&cs->snap_have, cs->version, __ATOMIC_RELEASE);
}
