/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Checkpoints of server-optimizer jobs: the model, the optimizer state and their version,
 * saved to checkpoint_dir every checkpoint_interval seconds (and on request, at shutdown),
 * restored when the job's next session starts, in this process or after a restart.
 *
 * Consistency without stalling the data plane. The cores own the chunk state; the
 * optimizer state is updated in place fragment by fragment, so no other thread can read a
 * consistent (model, state) pair of a chunk that is being trained. The checkpointer asks
 * every chunk of a job for the same version V (one more than the newest version of any
 * chunk) through cs->snap_want; each owning core copies model[V & 1] and the optimizer
 * state into the chunk's snapshot buffer at the moment the chunk reaches version V
 * (pbox_chunk_snap, called right after the version increment, before anything of iteration
 * V is finalised) and publishes cs->snap_have = V. Once every chunk has V, the writer
 * thread writes the buffers; the cores go on training meanwhile (they never touch the
 * buffer again until asked for a newer version). A capture that cannot complete (the
 * training stopped before V, or a chunk went past V before it was asked) is abandoned and
 * retried at the next interval.
 *
 * Files: <checkpoint_dir>/job-<id>.ckpt, written to .job-<id>.ckpt.tmp, fsync'ed, renamed
 * over the old one and the directory fsync'ed, so a crash leaves the old or the new file,
 * never a mix. Layout (host byte order): header (magic "PBOXCKP1", format, job id, mode,
 * optimizer name, state vectors, key count, version, data bytes), the keys (id, elements),
 * then per key in registration order its model, then each optimizer state vector (float32,
 * the key's elements each), then the CRC32C of everything before it. The data does not
 * depend on chunk_bytes or on the number of cores.
 *
 * Restore: when a session starts (its state allocated, not yet published), a checkpoint of
 * the job whose key set (ids and sizes, in order), optimizer and state layout match is
 * loaded into every chunk (model[V & 1], state, version V, initialised) and V is returned:
 * the register reply carries it as resume_version. A file that does not match (other keys,
 * other optimizer, a bad checksum, truncated) is not loaded: the session starts fresh with
 * a log line saying why, and the file is renamed to job-<id>.ckpt.rejected so it is kept
 * but not overwritten by the new session's checkpoints.
 *
 * Threading: the functions are called by the control thread; one writer thread per
 * appliance captures and writes. pboxd_ckpt_session_end waits until the writer no longer
 * uses the session's state (the state may be freed after it returns).
 */
#ifndef PBOXD_CHECKPOINT_H
#define PBOXD_CHECKPOINT_H

#include <stdint.h>

#include "common/jobdesc.h"
#include "config.h"
#include "engine/job.h"

struct pboxd_ckpt;

/*
 * Start checkpointing for cfg (NULL in *out when checkpoint_dir is empty). Creates the
 * directory if needed and the writer thread. Returns 0 or a negative errno after logging
 * why (the directory cannot be created or written).
 */
int pboxd_ckpt_create(const struct pboxd_config *cfg, struct pboxd_ckpt **out);
/* Stop the writer (a write in progress completes) and free. NULL is accepted. */
void pboxd_ckpt_destroy(struct pboxd_ckpt *ck);

/*
 * A session of a server-optimizer job started: job describes it (wire.id, wire.desc, mode,
 * opt, state allocated and not yet published); keys are its registered keys (copied).
 * Restores the job's checkpoint if it matches (see above) and registers the session for
 * periodic checkpoints. Returns the restored version (0: fresh start). ck may be NULL.
 */
uint32_t pboxd_ckpt_session_start(struct pboxd_ckpt *ck, const struct pbox_job *job,
				  const struct pbox_keyspec *keys, uint32_t nkeys);

/* The session of job id ends: unregister it, after waiting for a capture or write of it in
 * progress (abandoned captures return at once). ck may be NULL. */
void pboxd_ckpt_session_end(struct pboxd_ckpt *ck, uint32_t id);

/* Checkpoint every registered session now (shutdown); returns at once. ck may be NULL. */
void pboxd_ckpt_request(struct pboxd_ckpt *ck);

/* Wait up to timeout_ms for the requested checkpoints to be written or abandoned. Returns 0
 * or -ETIMEDOUT. ck may be NULL. */
int pboxd_ckpt_flush(struct pboxd_ckpt *ck, uint32_t timeout_ms);

/* Checkpoints written so far (for tests and logs). */
uint64_t pboxd_ckpt_written(const struct pboxd_ckpt *ck);

/*
 * The file format, for tests and tools: write the state of job (every chunk's current
 * model, optimizer state and version, which must all be equal; the caller guarantees no
 * core runs the job) to path atomically; read one back into a freshly allocated state.
 * Return 0 or a negative errno with err naming the file and the cause (-EINVAL: the file
 * does not match the job's keys or optimizer; -EBADMSG: checksum; -ENOENT: no file).
 */
int pboxd_ckpt_write_state(const char *path, const struct pbox_job *job,
			   const struct pbox_keyspec *keys, uint32_t nkeys, char *err,
			   size_t errlen);
int pboxd_ckpt_read_state(const char *path, const struct pbox_job *job,
			  const struct pbox_keyspec *keys, uint32_t nkeys, uint32_t *version,
			  char *err, size_t errlen);

#endif /* PBOXD_CHECKPOINT_H */
