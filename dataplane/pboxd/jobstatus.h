/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What `pbox status` shows about pboxd's jobs: each job's ranks (control address, pinned
 * data address, last seen, the next iteration the chunks need from them) and, for a job
 * that waits, which ranks each waiting chunk still lacks ("job 7: iteration 41, 12 chunks
 * waiting: rank 2 missing on chunks 0-11").
 *
 * Reading the cores' chunk state from the control thread. The chunk state is written by
 * its owning core only, with plain stores (the hot path has no atomics and no locks), and
 * this module never writes it, never takes a lock a core takes and never waits for a
 * core: a status request costs the cores only the cache lines it reads (a core's next
 * store to a line read here takes it back from the shared state once: a few hundred
 * nanoseconds per chunk and request, no more). To report only states a chunk really was
 * in, every chunk is read like a seqlock whose sequence is
 * the chunk's own monotonic progress:
 *   1. v = version (acquire; the core stores it with release), slot = slot[v % window];
 *      open, iter and ndone of the slot, then its `done` bitmap over ranks, each word with
 *      a relaxed atomic load (so no word is torn);
 *   2. an acquire fence, then version, iter, open and ndone again.
 * The read is accepted only if nothing of step 2 changed, the slot holds iteration v, and
 * ndone equals the number of bits set in `done`. Within one iteration `done` bits are only
 * set (ndone counts them) and a slot is reused only for iteration v + window, after the
 * version moved past v (versions never wrap, job.h), so an accepted read is a set of
 * ranks that had all completed iteration v at one moment while v was still waiting. A
 * chunk whose read is not accepted in PBOXD_STATUS_READ_TRIES tries is progressing and is
 * counted as "changing", never reported with guessed ranks. `partial` (ranks that sent
 * some fragments of v but not all) comes from per-rank fragment counts read the same way
 * and is a hint: a value the count had during the read.
 * A job's scan stops after PBOXD_STATUS_SCAN_BUDGET_MS (the answer's "scanned" says how
 * many chunks were read), so a job of millions of chunks cannot stall the control thread.
 * Missing ranks are the session's live ranks (control thread's copy of the membership
 * the cores were given) without a done bit.
 *
 * Threading: control thread only (the sessions module's rule); the job's chunk state is
 * kept alive by its session, which only this thread ends.
 */
#ifndef PBOXD_JOBSTATUS_H
#define PBOXD_JOBSTATUS_H

#include <jansson.h>
#include <stdint.h>

#include "common/statusmsg.h"
#include "engine/job.h"
#include "sessions.h"

#define PBOXD_STATUS_READ_TRIES 4u
/* Longest one job's scan may hold the control thread (about 0.5 us a chunk on this
 * machine: 62,500 chunks took 25-34 ms); chunks past it are not read, and the answer says
 * how many were ("scanned"). */
#define PBOXD_STATUS_SCAN_BUDGET_MS 200u

/* Bounds of one answer (common/statusmsg.h). */
struct pboxd_status_limits {
	uint32_t max_groups;
	uint32_t max_ranges;
	uint32_t max_ranks;
};

enum pboxd_chunk_read {
	PBOXD_CHUNK_IDLE = 0, /* no rank completed the current iteration (nothing waits) */
	PBOXD_CHUNK_WAITING,  /* some ranks completed iteration *iter, others not (done) */
	PBOXD_CHUNK_CHANGING, /* progressed during every try: not stuck */
	PBOXD_CHUNK_UNINIT,   /* server-optimizer chunk without its initial model */
};

/*
 * Read one chunk's current iteration as described above. done: pbox_bitmap_words(
 * nworkers) words, the ranks that completed *iter (set when WAITING); partial (may be
 * NULL): ranks with some but not all fragments of *iter. *iter is the chunk's version in
 * every case. Never blocks; reads only.
 */
enum pboxd_chunk_read pboxd_chunk_read(const struct pbox_chunk_state *cs, uint32_t window,
				       uint32_t nworkers, uint32_t nfrags, uint64_t *done,
				       uint64_t *partial, uint32_t *iter);

/*
 * The answer of {"op":"status"}: {"ok":true,"daemon":"pboxd","jobs":[...]} with every job
 * (job < 0) or job `job` (-ENOENT in *err when it does not exist: NULL returned). Each job:
 * pboxd_sessions_status's object plus "ranks", "waiting" and "progress_ms_ago" (time since
 * the sum of its chunks' versions last changed, as seen by this module's calls). New
 * reference; NULL with *err (positive errno) on failure.
 */
json_t *pboxd_jobstatus(struct pboxd_sessions *s, int64_t job,
			const struct pboxd_status_limits *lim, uint64_t now_ms, int *err);

/*
 * Per-job counters for /metrics (new reference): an array of {"id","state","workers",
 * "live","connected","registered","version_min","version_max","waiting_chunks",
 * "changing_chunks","bytes","progress_ms_ago"}. Also updates the progress clocks.
 */
json_t *pboxd_jobstatus_metrics(struct pboxd_sessions *s, uint64_t now_ms);

#endif /* PBOXD_JOBSTATUS_H */
