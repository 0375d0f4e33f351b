/* SPDX-License-Identifier: BSD-3-Clause */
/* `pbox status` on pboxd: jobs, ranks, and which ranks each waiting chunk lacks (see
 * jobstatus.h for how the cores' chunk state is read consistently). */
#include "jobstatus.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bitmap.h"
#include "common/compiler.h"
#include "common/log.h"
#include "common/ranges.h"
#include "engine/engine.h"

#define LOAD(p)     __atomic_load_n((p), __ATOMIC_RELAXED)
#define LOAD_ACQ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)

enum pboxd_chunk_read pboxd_chunk_read(const struct pbox_chunk_state *cs, uint32_t window,
				       uint32_t nworkers, uint32_t nfrags, uint64_t *done,
				       uint64_t *partial, uint32_t *iter)
{
	size_t words = pbox_bitmap_words(nworkers);

	for (uint32_t t = 0; t < PBOXD_STATUS_READ_TRIES; t++) {
		uint32_t v = LOAD_ACQ(&cs->version);
		const struct pbox_slot *sl = &cs->slot[v % window];
		bool init = LOAD(&cs->initialized);
		bool open = LOAD(&sl->open);
		uint32_t it = LOAD(&sl->iter), nd = LOAD(&sl->ndone), pc = 0;
		bool holds = open && it == v;

		*iter = v;
		if (holds) {
			for (size_t i = 0; i < words; i++) {
				done[i] = LOAD(&sl->done[i]);
				pc += (uint32_t)__builtin_popcountll(done[i]);
			}
			if (partial != NULL) {
				/* Only the ranks not done: usually few once an iteration waits. */
				pbox_bitmap_zero(partial, nworkers);
				for (size_t i = 0; i < words; i++) {
					uint64_t rest = ~done[i];

					if (i == words - 1 && nworkers % 64 != 0) {
						rest &= (1ull << (nworkers % 64)) - 1;
					}
					for (; rest != 0; rest &= rest - 1) {
						uint32_t r = (uint32_t)(i * 64) +
							     (uint32_t)__builtin_ctzll(rest);
						uint16_t c = LOAD(&sl->wcnt[r]);

						if (c != 0 && c != nfrags) {
							pbox_bit_set(partial, r);
						}
					}
				}
			}
		}
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		if (LOAD(&cs->version) != v || LOAD(&sl->open) != open || LOAD(&sl->iter) != it ||
		    LOAD(&sl->ndone) != nd) {
			continue;
		}
		if (!init) {
			return PBOXD_CHUNK_UNINIT;
		}
		if (!holds) {
			return PBOXD_CHUNK_IDLE;
		}
		if (pc != nd) {
			continue; /* a done bit and its count were caught between two stores */
		}
		return PBOXD_CHUNK_WAITING;
	}
	return PBOXD_CHUNK_CHANGING;
}

static json_t *bitmap_ranges(const uint64_t *b, uint32_t nbits, uint32_t max)
{
	struct pbox_ranges r;
	uint32_t i;
	json_t *s;

	if (pbox_ranges_init(&r, max) != 0) {
		return NULL;
	}
	PBOX_BIT_FOREACH(i, b, nbits)
	{
		pbox_ranges_add(&r, i);
	}
	s = json_string(pbox_ranges_str(&r));
	pbox_ranges_free(&r);
	return s;
}

/* ---- progress clocks: when each session's chunk versions last moved ---- */

struct progress {
	uint32_t id;
	uint64_t session;
	uint64_t vsum;
	uint64_t changed_ms;
	uint64_t sweep; /* the last listing of every job that saw it */
};

static struct progress *g_progress;
static uint32_t g_nprogress, g_capprogress;
static uint64_t g_sweep;

/* After a listing of every job: forget the clocks of jobs it did not see (removed). */
static void progress_sweep(void)
{
	uint32_t k = 0;

	for (uint32_t i = 0; i < g_nprogress; i++) {
		if (g_progress[i].sweep == g_sweep) {
			g_progress[k++] = g_progress[i];
		}
	}
	g_nprogress = k;
}

/* ms since (id, session)'s version sum last changed; starts the clock at the first call. */
static uint64_t progress_age(uint32_t id, uint64_t session, uint64_t vsum, uint64_t now_ms)
{
	struct progress *p = NULL;

	for (uint32_t i = 0; i < g_nprogress; i++) {
		if (g_progress[i].id == id) {
			p = &g_progress[i];
			break;
		}
	}
	if (p == NULL) {
		if (g_nprogress == g_capprogress) {
			uint32_t cap = g_capprogress ? g_capprogress * 2 : 16;
			struct progress *n = realloc(g_progress, cap * sizeof(*n));

			if (n == NULL) {
				return 0;
			}
			g_progress = n;
			g_capprogress = cap;
		}
		p = &g_progress[g_nprogress++];
		*p = (struct progress){
			.id = id, .session = session, .vsum = vsum, .changed_ms = now_ms
		};
	}
	p->sweep = g_sweep;
	if (p->session != session || p->vsum != vsum) {
		p->session = session;
		p->vsum = vsum;
		p->changed_ms = now_ms;
	}
	return now_ms - p->changed_ms;
}

/* ---- one job ---- */

struct group {
	uint32_t iter;
	uint64_t *missing;
	uint64_t *partial; /* union over the group's chunks */
	uint32_t nchunks;
	struct pbox_ranges chunks;
};

struct scan {
	const struct pboxd_job_view *v;
	const struct pboxd_status_limits *lim;
	size_t words;
	struct group *groups;
	uint32_t ngroups;
	uint64_t waiting, changing, uninit, idle, ungrouped;
	uint32_t scanned;  /* chunks read (all of them unless the time budget ran out) */
	uint32_t iter_min; /* lowest version among waiting chunks */
	uint32_t idle_min; /* lowest version among idle chunks */
	uint32_t vmin, vmax;
	uint64_t vsum;
	uint32_t *next; /* per rank: first iteration some chunk still needs from it */
};

static struct group *group_of(struct scan *sc, uint32_t iter, const uint64_t *missing)
{
	for (uint32_t g = 0; g < sc->ngroups; g++) {
		if (sc->groups[g].iter == iter &&
		    memcmp(sc->groups[g].missing, missing, sc->words * 8) == 0) {
			return &sc->groups[g];
		}
	}
	if (sc->ngroups == sc->lim->max_groups) {
		return NULL;
	}
	struct group *g = &sc->groups[sc->ngroups];

	g->missing = calloc(2 * sc->words, sizeof(uint64_t));
	if (g->missing == NULL || pbox_ranges_init(&g->chunks, sc->lim->max_ranges) != 0) {
		free(g->missing);
		return NULL;
	}
	g->partial = g->missing + sc->words;
	memcpy(g->missing, missing, sc->words * 8);
	g->iter = iter;
	sc->ngroups++;
	return g;
}

/* Scan every chunk of the session (read-only; see jobstatus.h). with_groups: build the
 * missing-rank groups and per-rank iterations too (status), else counts only (metrics). */
static int scan_job(struct scan *sc, bool with_groups)
{
	const struct pboxd_job_view *v = sc->v;
	const struct pbox_jobdesc *d = v->desc;
	uint32_t nw = v->workers;
	uint64_t done[PBOX_MAX_WORKERS / 64], partial[PBOX_MAX_WORKERS / 64],
		missing[PBOX_MAX_WORKERS / 64];

	sc->words = pbox_bitmap_words(nw);
	sc->vmin = UINT32_MAX;
	sc->iter_min = UINT32_MAX;
	sc->idle_min = UINT32_MAX;
	if (with_groups) {
		sc->groups = calloc(sc->lim->max_groups, sizeof(*sc->groups));
		sc->next = malloc(nw * sizeof(uint32_t));
		if (sc->groups == NULL || sc->next == NULL) {
			return -ENOMEM;
		}
		for (uint32_t r = 0; r < nw; r++) {
			sc->next[r] = UINT32_MAX;
		}
	}
	uint64_t deadline = pboxd_now_ms() + PBOXD_STATUS_SCAN_BUDGET_MS;

	for (uint32_t c = 0; c < d->nchunks; c++, sc->scanned = c) {
		const struct pbox_chunk_desc *cd = &d->chunks[c];

		if (c % 4096 == 4095 && pboxd_now_ms() >= deadline) {
			break; /* the control thread has other work: report what was read */
		}
		const struct pbox_chunk_state *cs = &v->state->core[cd->core].chunks[cd->local];
		uint32_t it;
		enum pboxd_chunk_read k = pboxd_chunk_read(cs, v->window, nw, cd->nfrags, done,
							   with_groups ? partial : NULL, &it);

		sc->vmin = PBOX_MIN(sc->vmin, it);
		sc->vmax = PBOX_MAX(sc->vmax, it);
		sc->vsum += it;
		switch (k) {
		case PBOXD_CHUNK_CHANGING:
			sc->changing++;
			continue;
		case PBOXD_CHUNK_UNINIT:
			sc->uninit++;
			continue;
		case PBOXD_CHUNK_IDLE:
			sc->idle++;
			sc->idle_min = PBOX_MIN(sc->idle_min, it);
			continue;
		case PBOXD_CHUNK_WAITING:
			break;
		}
		sc->waiting++;
		sc->iter_min = PBOX_MIN(sc->iter_min, it);
		if (!with_groups) {
			continue;
		}
		for (size_t i = 0; i < sc->words; i++) {
			missing[i] = (v->live ? v->live[i] : 0) & ~done[i];
		}
		for (uint32_t r = 0; r < nw; r++) {
			uint32_t n = pbox_bit_test(done, r) ? it + 1 : it;

			sc->next[r] = PBOX_MIN(sc->next[r], n);
		}
		struct group *g = group_of(sc, it, missing);

		if (g == NULL) {
			sc->ungrouped++;
			continue;
		}
		for (size_t i = 0; i < sc->words; i++) {
			g->partial[i] |= partial[i] & missing[i];
		}
		g->nchunks++;
		pbox_ranges_add(&g->chunks, c);
	}
	if (sc->vmin == UINT32_MAX) {
		sc->vmin = 0;
	}
	/* An idle chunk needs its version from every rank. */
	for (uint32_t r = 0; with_groups && r < nw; r++) {
		sc->next[r] = PBOX_MIN(sc->next[r], sc->idle_min);
	}
	return 0;
}

static void scan_free(struct scan *sc)
{
	for (uint32_t g = 0; g < sc->ngroups; g++) {
		free(sc->groups[g].missing);
		pbox_ranges_free(&sc->groups[g].chunks);
	}
	free(sc->groups);
	free(sc->next);
}

static json_t *waiting_json(struct scan *sc)
{
	json_t *o = json_object(), *groups = json_array();

	json_object_set_new(o, "chunks", json_integer((json_int_t)sc->waiting));
	json_object_set_new(o, "iteration", sc->waiting ? json_integer(sc->iter_min) : json_null());
	json_object_set_new(o, "changing", json_integer((json_int_t)sc->changing));
	json_object_set_new(o, "uninitialized", json_integer((json_int_t)sc->uninit));
	json_object_set_new(o, "idle", json_integer((json_int_t)sc->idle));
	json_object_set_new(o, "scanned", json_integer(sc->scanned));
	json_object_set_new(o, "ungrouped", json_integer((json_int_t)sc->ungrouped));
	for (uint32_t i = 0; i < sc->ngroups; i++) {
		struct group *g = &sc->groups[i];
		uint32_t nmiss = 0;

		for (size_t w = 0; w < sc->words; w++) {
			nmiss += (uint32_t)__builtin_popcountll(g->missing[w]);
		}
		json_array_append_new(
			groups,
			json_pack("{s:I, s:o, s:I, s:o, s:I, s:s}", "iteration",
				  (json_int_t)g->iter, "missing",
				  bitmap_ranges(g->missing, sc->v->workers, sc->lim->max_ranges),
				  "missing_count", (json_int_t)nmiss, "partial",
				  bitmap_ranges(g->partial, sc->v->workers, sc->lim->max_ranges),
				  "nchunks", (json_int_t)g->nchunks, "chunks",
				  pbox_ranges_str(&g->chunks)));
	}
	json_object_set_new(o, "groups", groups);
	return o;
}

static json_t *ranks_json(struct pboxd_sessions *s, struct scan *sc, uint64_t now_ms)
{
	const struct pboxd_job_view *v = sc->v;
	json_t *arr = json_array();
	uint32_t n = PBOX_MIN(v->workers, sc->lim->max_ranks);

	for (uint32_t r = 0; r < n; r++) {
		struct pboxd_member_view m;
		json_t *o;

		if (pboxd_sessions_member_view(s, v->id, r, &m) != 0) {
			break;
		}
		o = json_pack("{s:I, s:b, s:b, s:b}", "rank", (json_int_t)r, "connected",
			      m.connected, "registered", m.registered, "live",
			      v->live != NULL && pbox_bit_test(v->live, r));
		json_object_set_new(o, "peer", m.peer ? json_string(m.peer) : json_null());
		json_object_set_new(o, "last_seen_ms_ago",
				    m.connected && m.last_seen_ms != 0 && now_ms >= m.last_seen_ms
					    ? json_integer((json_int_t)(now_ms - m.last_seen_ms))
					    : json_null());
		json_object_set_new(o, "data_addr", json_null());
		if (v->state != NULL && v->state->pins != NULL) {
			uint64_t a = LOAD_ACQ(&v->state->pins[r].addr);

			if (a & PBOX_PIN_SET) {
				char ip[INET_ADDRSTRLEN], buf[40];
				struct in_addr in = { .s_addr = (uint32_t)(a >> 16) };

				inet_ntop(AF_INET, &in, ip, sizeof(ip));
				snprintf(buf, sizeof(buf), "%s:%u", ip, ntohs((uint16_t)a));
				json_object_set_new(o, "data_addr", json_string(buf));
			}
		}
		json_object_set_new(o, "next_iteration",
				    sc->next != NULL && sc->next[r] != UINT32_MAX &&
						    json_is_true(json_object_get(o, "live"))
					    ? json_integer(sc->next[r])
					    : json_null());
		json_array_append_new(arr, o);
	}
	return arr;
}

/* Adds ranks/waiting/progress to o (a pboxd_sessions_status entry). */
static int job_status(struct pboxd_sessions *s, json_t *o, const struct pboxd_status_limits *lim,
		      uint64_t now_ms, bool full)
{
	uint32_t id = (uint32_t)json_integer_value(json_object_get(o, "id"));
	struct pboxd_job_view v;
	struct scan sc = { .v = &v, .lim = lim };
	int rc = pboxd_sessions_job_view(s, id, &v);

	if (rc != 0) {
		return rc;
	}
	if (v.state != NULL && v.desc != NULL) {
		rc = scan_job(&sc, full);
		if (rc != 0) {
			scan_free(&sc);
			return rc;
		}
		/* A scan cut short sums a different prefix each time: no clock then. */
		json_object_set_new(o, "progress_ms_ago",
				    sc.scanned == v.desc->nchunks
					    ? json_integer((json_int_t)progress_age(
						      id, v.sessions, sc.vsum, now_ms))
					    : json_null());
	} else {
		json_object_set_new(o, "progress_ms_ago", json_null());
	}
	if (v.abort_reason[0] != '\0') {
		json_object_set_new(o, "abort_reason", json_string(v.abort_reason));
	}
	if (full) {
		json_object_set_new(o, "window", json_integer(v.window));
		json_object_set_new(o, "ranks", ranks_json(s, &sc, now_ms));
		json_object_set_new(
			o, "ranks_omitted",
			json_integer(v.workers > lim->max_ranks ? v.workers - lim->max_ranks : 0));
		json_object_set_new(o, "waiting", waiting_json(&sc));
	} else {
		json_object_set_new(o, "waiting_chunks", json_integer((json_int_t)sc.waiting));
		json_object_set_new(o, "scanned_chunks", json_integer(sc.scanned));
		json_object_set_new(o, "changing_chunks", json_integer((json_int_t)sc.changing));
	}
	scan_free(&sc);
	return 0;
}

json_t *pboxd_jobstatus(struct pboxd_sessions *s, int64_t job,
			const struct pboxd_status_limits *lim, uint64_t now_ms, int *err)
{
	json_t *all = pboxd_sessions_job_list(s), *jobs = json_array(), *o;
	size_t i;

	*err = 0;
	g_sweep++;
	json_array_foreach(all, i, o)
	{
		if (job >= 0 && json_integer_value(json_object_get(o, "id")) != job) {
			continue;
		}
		int rc = job_status(s, o, lim, now_ms, true);

		if (rc != 0) {
			*err = -rc;
			break;
		}
		json_array_append(jobs, o);
	}
	json_decref(all);
	if (*err == 0 && job < 0) {
		progress_sweep();
	}
	if (*err == 0 && job >= 0 && json_array_size(jobs) == 0) {
		*err = ENOENT;
	}
	if (*err != 0) {
		json_decref(jobs);
		return NULL;
	}
	return json_pack("{s:b, s:s, s:o}", "ok", 1, "daemon", "pboxd", "jobs", jobs);
}

json_t *pboxd_jobstatus_metrics(struct pboxd_sessions *s, uint64_t now_ms)
{
	static const struct pboxd_status_limits lim = { 1, 1, 0 };
	json_t *all = pboxd_sessions_status(s), *o;
	size_t i;

	g_sweep++;
	json_array_foreach(all, i, o)
	{
		if (job_status(s, o, &lim, now_ms, false) != 0) {
			json_object_set_new(o, "waiting_chunks", json_integer(0));
		}
	}
	progress_sweep();
	return all;
}
