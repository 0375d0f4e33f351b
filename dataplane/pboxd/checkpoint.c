/* SPDX-License-Identifier: BSD-3-Clause */
/* Checkpoints of server-optimizer jobs: capture by the cores, files, restore (see
 * checkpoint.h). */
#include "checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/crc.h"
#include "budget.h"
#include "common/log.h"

#define CKPT_MAGIC  "PBOXCKP1"
#define CKPT_FORMAT 1u
/* A capture that has not completed after this long is abandoned (training stopped). */
#define CKPT_CAPTURE_TIMEOUT_MS 10000u
#define CKPT_POLL_US            2000u

static uint64_t mono_ms(void)
{
	return (uint64_t)(pbox_mono_s() * 1000.0);
}

struct ckpt_hdr {
	char magic[8];
	uint32_t format;
	uint32_t job;
	uint32_t mode;
	uint32_t nstate;
	char opt[16];
	uint32_t nkeys;
	uint32_t version;
	uint64_t data_bytes;
};
_Static_assert(sizeof(struct ckpt_hdr) == 56, "checkpoint header layout");

struct ckpt_key {
	uint32_t id;
	uint32_t pad;
	uint64_t nelem;
};
_Static_assert(sizeof(struct ckpt_key) == 16, "checkpoint key layout");

struct sess {
	struct pbox_job job; /* id, desc, mode, opt, state */
	struct pbox_keyspec *keys;
	uint32_t nkeys;
	bool busy; /* the writer uses it (capture or write) */
	bool gone; /* the session is ending: abandon */
	struct sess *next;
};

struct pboxd_ckpt {
	char dir[512];
	uint32_t interval_s;
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond; /* a change of: stop, req, busy, sessions */
	bool stop;
	uint64_t req;  /* requests made (pboxd_ckpt_request) */
	uint64_t done; /* requests served */
	uint64_t written;
	struct sess *sessions;
};

static void job_path(const struct pboxd_ckpt *ck, uint32_t id, const char *suffix, char *buf,
		     size_t len)
{
	snprintf(buf, len, "%s/job-%u.ckpt%s", ck->dir, id, suffix);
}

static struct pbox_chunk_state *chunk_of(const struct pbox_job *job, uint32_t c)
{
	const struct pbox_chunk_desc *cd = &job->wire.desc->chunks[c];

	return &job->state->core[cd->core].chunks[cd->local];
}

static unsigned nstate_of(const struct pbox_job *job)
{
	return job->opt->nstate;
}

/* ---- the file ------------------------------------------------------------------------ */

/* Vector v (0: model, 1..nstate: state) of chunk cs: from its snapshot or live. */
typedef const float *(*vec_fn)(const struct pbox_chunk_state *cs, uint32_t bytes, unsigned v);

static const float *vec_snap(const struct pbox_chunk_state *cs, uint32_t bytes, unsigned v)
{
	return (const float *)((const char *)cs->snap + (size_t)v * bytes);
}

static const float *vec_live(const struct pbox_chunk_state *cs, uint32_t bytes, unsigned v)
{
	(void)bytes;
	return v == 0 ? cs->model[cs->version & 1] : v == 1 ? cs->s0 : cs->s1;
}

static void fill_hdr(struct ckpt_hdr *h, const struct pbox_job *job, uint32_t version)
{
	memset(h, 0, sizeof(*h));
	memcpy(h->magic, CKPT_MAGIC, 8);
	h->format = CKPT_FORMAT;
	h->job = job->wire.id;
	h->mode = (uint32_t)job->mode;
	h->nstate = nstate_of(job);
	snprintf(h->opt, sizeof(h->opt), "%s", job->opt->name);
	h->nkeys = job->wire.desc->nkeys;
	h->version = version;
	h->data_bytes = job->wire.desc->total_bytes * (1 + h->nstate);
}

static int put(FILE *f, const void *p, size_t n, uint32_t *crc)
{
	*crc = pbox_crc32c(p, n, *crc);
	return fwrite(p, 1, n, f) == n ? 0 : -EIO;
}

static int write_file(const char *path, const struct pbox_job *job, uint32_t version, vec_fn vec,
		      char *err, size_t errlen)
{
	const struct pbox_jobdesc *d = job->wire.desc;
	char tmp[600], dir[600], *slash;
	uint32_t crc = PBOX_CRC_INIT;
	struct ckpt_hdr h;
	int fd, rc = 0;
	FILE *f;

	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (slash != NULL) {
		*slash = '\0';
		snprintf(tmp, sizeof(tmp), "%s/.%s.tmp", dir, slash + 1);
	} else {
		snprintf(dir, sizeof(dir), ".");
		snprintf(tmp, sizeof(tmp), ".%s.tmp", path);
	}
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		rc = -errno;
		snprintf(err, errlen, "%s: cannot create: %s", tmp, strerror(-rc));
		return rc;
	}
	f = fdopen(fd, "w");
	if (f == NULL) {
		rc = -errno;
		close(fd);
		unlink(tmp);
		snprintf(err, errlen, "%s: %s", tmp, strerror(-rc));
		return rc;
	}
	setvbuf(f, NULL, _IOFBF, 1u << 20);
	fill_hdr(&h, job, version);
	rc = put(f, &h, sizeof(h), &crc);
	for (uint32_t k = 0; rc == 0 && k < d->nkeys; k++) {
		struct ckpt_key ke = { .id = d->keys[k].id, .nelem = d->keys[k].nelem };

		rc = put(f, &ke, sizeof(ke), &crc);
	}
	for (uint32_t k = 0; rc == 0 && k < d->nkeys; k++) {
		const struct pbox_key *key = &d->keys[k];

		for (unsigned v = 0; rc == 0 && v <= h.nstate; v++) {
			for (uint32_t i = 0; rc == 0 && i < key->nchunks; i++) {
				uint32_t c = key->first_chunk + i;

				rc = put(f, vec(chunk_of(job, c), d->chunks[c].bytes, v),
					 d->chunks[c].bytes, &crc);
			}
		}
	}
	if (rc == 0) {
		crc ^= PBOX_CRC_INIT;
		rc = fwrite(&crc, 1, sizeof(crc), f) == sizeof(crc) ? 0 : -EIO;
	}
	if (rc == 0 && fflush(f) != 0) {
		rc = -errno;
	}
	if (rc == 0 && fsync(fd) != 0) {
		rc = -errno;
	}
	if (fclose(f) != 0 && rc == 0) {
		rc = -errno;
	}
	if (rc == 0 && rename(tmp, path) != 0) {
		rc = -errno;
	}
	if (rc != 0) {
		snprintf(err, errlen, "%s: cannot write: %s", tmp, strerror(-rc));
		unlink(tmp);
		return rc;
	}
	/* The rename is durable once the directory is. */
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0) {
		fsync(fd);
		close(fd);
	}
	return 0;
}

static int get(FILE *f, void *p, size_t n, uint32_t *crc)
{
	if (fread(p, 1, n, f) != n) {
		return -EINVAL;
	}
	*crc = pbox_crc32c(p, n, *crc);
	return 0;
}

/* Every chunk back to its freshly allocated, uninitialised state. */
static void reset_state(const struct pbox_job *job)
{
	const struct pbox_jobdesc *d = job->wire.desc;

	for (uint32_t c = 0; c < d->nchunks; c++) {
		struct pbox_chunk_state *cs = chunk_of(job, c);

		memset(cs->model[0], 0, d->chunks[c].bytes);
		memset(cs->model[1], 0, d->chunks[c].bytes);
		if (cs->s0 != NULL) {
			memset(cs->s0, 0, d->chunks[c].bytes);
		}
		if (cs->s1 != NULL) {
			memset(cs->s1, 0, d->chunks[c].bytes);
		}
		cs->version = 0;
		cs->initialized = false;
	}
}

int pboxd_ckpt_read_state(const char *path, const struct pbox_job *job,
			  const struct pbox_keyspec *keys, uint32_t nkeys, uint32_t *version,
			  char *err, size_t errlen)
{
	const struct pbox_jobdesc *d = job->wire.desc;
	uint32_t crc = PBOX_CRC_INIT, want_crc;
	struct ckpt_hdr h, mine;
	struct stat sb;
	uint64_t size;
	int rc = 0;
	FILE *f;

	f = fopen(path, "rbe");
	if (f == NULL) {
		rc = -errno;
		snprintf(err, errlen, "%s: %s", path, strerror(-rc));
		return rc;
	}
	setvbuf(f, NULL, _IOFBF, 1u << 20);
	fill_hdr(&mine, job, 0);
	size = sizeof(h) + (uint64_t)nkeys * sizeof(struct ckpt_key) + mine.data_bytes + 4;
	if (fstat(fileno(f), &sb) != 0 || get(f, &h, sizeof(h), &crc) != 0 ||
	    memcmp(h.magic, CKPT_MAGIC, 8) != 0 || h.format != CKPT_FORMAT) {
		snprintf(err, errlen, "%s: not a pbox checkpoint (format %u)", path, CKPT_FORMAT);
		rc = -EINVAL;
		goto out;
	}
	if (h.job != mine.job || h.mode != mine.mode || h.nstate != mine.nstate ||
	    strncmp(h.opt, mine.opt, sizeof(h.opt)) != 0) {
		snprintf(err, errlen,
			 "%s: saved by job %u with optimizer '%.16s' (%u state vectors); this is "
			 "job %u with '%s' (%u)",
			 path, h.job, h.opt, h.nstate, mine.job, mine.opt, mine.nstate);
		rc = -EINVAL;
		goto out;
	}
	if (h.nkeys != nkeys) {
		snprintf(err, errlen, "%s: saved with %u keys; the session registered %u", path,
			 h.nkeys, nkeys);
		rc = -EINVAL;
		goto out;
	}
	for (uint32_t k = 0; k < nkeys; k++) {
		struct ckpt_key ke;

		if (get(f, &ke, sizeof(ke), &crc) != 0) {
			snprintf(err, errlen, "%s: truncated in its key list", path);
			rc = -EINVAL;
			goto out;
		}
		if (ke.id != keys[k].id || ke.nelem != keys[k].nelem) {
			snprintf(err, errlen,
				 "%s: key #%u was id %u with %llu elements; the session registered "
				 "id %u with %llu",
				 path, k, ke.id, (unsigned long long)ke.nelem, keys[k].id,
				 (unsigned long long)keys[k].nelem);
			rc = -EINVAL;
			goto out;
		}
	}
	if ((uint64_t)sb.st_size != size || h.data_bytes != mine.data_bytes) {
		snprintf(err, errlen, "%s: %llu bytes; its keys need %llu", path,
			 (unsigned long long)sb.st_size, (unsigned long long)size);
		rc = -EINVAL;
		goto out;
	}
	for (uint32_t k = 0; rc == 0 && k < d->nkeys; k++) {
		const struct pbox_key *key = &d->keys[k];

		for (unsigned v = 0; rc == 0 && v <= h.nstate; v++) {
			for (uint32_t i = 0; rc == 0 && i < key->nchunks; i++) {
				uint32_t c = key->first_chunk + i;
				struct pbox_chunk_state *cs = chunk_of(job, c);
				float *dst = v == 0   ? cs->model[h.version & 1]
					     : v == 1 ? cs->s0
						      : cs->s1;

				rc = get(f, dst, d->chunks[c].bytes, &crc);
			}
		}
	}
	if (rc == 0 && fread(&want_crc, 1, 4, f) != 4) {
		rc = -EINVAL;
	}
	if (rc != 0) {
		snprintf(err, errlen, "%s: truncated", path);
		reset_state(job);
		goto out;
	}
	if ((crc ^ PBOX_CRC_INIT) != want_crc) {
		snprintf(err, errlen, "%s: checksum mismatch (CRC32C %08x, file says %08x)", path,
			 crc ^ PBOX_CRC_INIT, want_crc);
		reset_state(job);
		rc = -EBADMSG;
		goto out;
	}
	for (uint32_t c = 0; c < d->nchunks; c++) {
		struct pbox_chunk_state *cs = chunk_of(job, c);

		cs->version = h.version;
		cs->initialized = true;
	}
	*version = h.version;
out:
	fclose(f);
	return rc;
}

int pboxd_ckpt_write_state(const char *path, const struct pbox_job *job,
			   const struct pbox_keyspec *keys, uint32_t nkeys, char *err,
			   size_t errlen)
{
	const struct pbox_jobdesc *d = job->wire.desc;
	uint32_t v = d->nchunks ? chunk_of(job, 0)->version : 0;

	(void)keys;
	if (nkeys != d->nkeys) {
		snprintf(err, errlen, "%s: %u keys given, the job has %u", path, nkeys, d->nkeys);
		return -EINVAL;
	}
	for (uint32_t c = 1; c < d->nchunks; c++) {
		if (chunk_of(job, c)->version != v) {
			snprintf(err, errlen, "%s: chunk %u is at version %u, chunk 0 at %u", path,
				 c, chunk_of(job, c)->version, v);
			return -EINVAL;
		}
	}
	return write_file(path, job, v, vec_live, err, errlen);
}

/* ---- capture and the writer thread ----------------------------------------------------- */

static void cancel_capture(const struct pbox_job *job)
{
	for (uint32_t c = 0; c < job->wire.desc->nchunks; c++) {
		__atomic_store_n(&chunk_of(job, c)->snap_want, PBOX_SNAP_NONE, __ATOMIC_RELEASE);
	}
}

static bool gone(struct pboxd_ckpt *ck, struct sess *s)
{
	bool g;

	pthread_mutex_lock(&ck->lock);
	g = s->gone || ck->stop;
	pthread_mutex_unlock(&ck->lock);
	return g;
}

/* Ask every chunk for one version and wait until all have it. Returns the version, or
 * PBOX_SNAP_NONE if abandoned. */
static uint32_t capture(struct pboxd_ckpt *ck, struct sess *s)
{
	const struct pbox_job *job = &s->job;
	uint32_t n = job->wire.desc->nchunks, want = 0;
	uint64_t deadline = mono_ms() + CKPT_CAPTURE_TIMEOUT_MS;

	for (int attempt = 0; attempt < 3; attempt++) {
		bool missed = false;

		want = 0;
		for (uint32_t c = 0; c < n; c++) {
			want = PBOX_MAX(want, __atomic_load_n(&chunk_of(job, c)->version,
							      __ATOMIC_ACQUIRE));
		}
		if (want == UINT32_MAX - 1) {
			return PBOX_SNAP_NONE;
		}
		want++;
		for (uint32_t c = 0; c < n; c++) {
			__atomic_store_n(&chunk_of(job, c)->snap_want, want, __ATOMIC_RELEASE);
		}
		while (!missed) {
			uint32_t have = 0;

			for (uint32_t c = 0; c < n; c++) {
				const struct pbox_chunk_state *cs = chunk_of(job, c);
				uint32_t v = __atomic_load_n(&cs->version, __ATOMIC_ACQUIRE);

				if (__atomic_load_n(&cs->snap_have, __ATOMIC_ACQUIRE) == want) {
					have++;
				} else if (v > want) {
					/* Went past before it saw the request: ask again. */
					missed = true;
					break;
				}
			}
			if (have == n) {
				cancel_capture(job);
				return want;
			}
			if (mono_ms() > deadline || gone(ck, s)) {
				cancel_capture(job);
				return PBOX_SNAP_NONE;
			}
			if (!missed) {
				usleep(CKPT_POLL_US);
			}
		}
	}
	cancel_capture(job);
	return PBOX_SNAP_NONE;
}

static void checkpoint_one(struct pboxd_ckpt *ck, struct sess *s)
{
	char path[600], err[700], size[64];
	uint64_t t0 = mono_ms();
	uint32_t v = capture(ck, s);
	int rc;

	if (v == PBOX_SNAP_NONE) {
		PBOX_LOG_DEBUG(ADMIN, "job %u: checkpoint skipped: no common version reached",
			       s->job.wire.id);
		return;
	}
	job_path(ck, s->job.wire.id, "", path, sizeof(path));
	rc = write_file(path, &s->job, v, vec_snap, err, sizeof(err));
	if (rc != 0) {
		PBOX_LOG_ERR(ADMIN, "job %u: checkpoint of version %u failed: %s", s->job.wire.id,
			     v, err);
		return;
	}
	pthread_mutex_lock(&ck->lock);
	ck->written++;
	pthread_mutex_unlock(&ck->lock);
	PBOX_LOG_INFO(ADMIN, "job %u: checkpoint of version %u written to %s (%s, %llu ms)",
		      s->job.wire.id, v, path,
		      pboxd_budget_fmt(s->job.wire.desc->total_bytes * (1 + nstate_of(&s->job)),
				       size, sizeof(size)),
		      (unsigned long long)(mono_ms() - t0));
}

static void *writer_main(void *arg)
{
	struct pboxd_ckpt *ck = arg;
	uint64_t next = mono_ms() + (uint64_t)ck->interval_s * 1000;

	pthread_mutex_lock(&ck->lock);
	while (!ck->stop) {
		uint64_t now = mono_ms(), req = ck->req;
		bool due = ck->interval_s != 0 && now >= next;

		if (!due && req == ck->done) {
			struct timespec ts;
			uint64_t wait_ms = ck->interval_s != 0 ? next - now : 3600 * 1000;

			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += (time_t)(wait_ms / 1000);
			ts.tv_nsec += (long)(wait_ms % 1000) * 1000000;
			if (ts.tv_nsec >= 1000000000) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000;
			}
			pthread_cond_timedwait(&ck->cond, &ck->lock, &ts);
			continue;
		}
		/* One session at a time; each marked busy so its end waits for us. */
		for (struct sess *s = ck->sessions; s != NULL && !ck->stop; s = s->next) {
			if (s->gone) {
				continue;
			}
			s->busy = true;
			pthread_mutex_unlock(&ck->lock);
			checkpoint_one(ck, s);
			pthread_mutex_lock(&ck->lock);
			s->busy = false;
			pthread_cond_broadcast(&ck->cond);
		}
		ck->done = req;
		pthread_cond_broadcast(&ck->cond);
		if (due) {
			next = mono_ms() + (uint64_t)ck->interval_s * 1000;
		}
	}
	pthread_mutex_unlock(&ck->lock);
	return NULL;
}

int pboxd_ckpt_create(const struct pboxd_config *cfg, struct pboxd_ckpt **out)
{
	struct pboxd_ckpt *ck;
	char probe[600];
	int rc, fd;

	*out = NULL;
	if (cfg->checkpoint_dir[0] == '\0') {
		return 0;
	}
	if (mkdir(cfg->checkpoint_dir, 0700) != 0 && errno != EEXIST) {
		rc = -errno;
		PBOX_LOG_ERR(ADMIN, "checkpoint_dir %s: cannot create: %s", cfg->checkpoint_dir,
			     strerror(-rc));
		return rc;
	}
	snprintf(probe, sizeof(probe), "%s/.pboxd-probe", cfg->checkpoint_dir);
	fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		rc = -errno;
		PBOX_LOG_ERR(ADMIN, "checkpoint_dir %s: cannot write there: %s",
			     cfg->checkpoint_dir, strerror(-rc));
		return rc;
	}
	close(fd);
	unlink(probe);
	ck = calloc(1, sizeof(*ck));
	if (ck == NULL) {
		return -ENOMEM;
	}
	snprintf(ck->dir, sizeof(ck->dir), "%s", cfg->checkpoint_dir);
	ck->interval_s = cfg->checkpoint_interval;
	pthread_mutex_init(&ck->lock, NULL);
	pthread_cond_init(&ck->cond, NULL);
	rc = pthread_create(&ck->thread, NULL, writer_main, ck);
	if (rc != 0) {
		PBOX_LOG_ERR(ADMIN, "checkpoint writer thread: %s", strerror(rc));
		pthread_mutex_destroy(&ck->lock);
		pthread_cond_destroy(&ck->cond);
		free(ck);
		return -rc;
	}
	PBOX_LOG_INFO(ADMIN, "checkpoints of server-optimizer jobs in %s, every %u s%s", ck->dir,
		      ck->interval_s, ck->interval_s ? "" : " (0: at shutdown only)");
	*out = ck;
	return 0;
}

void pboxd_ckpt_destroy(struct pboxd_ckpt *ck)
{
	if (ck == NULL) {
		return;
	}
	pthread_mutex_lock(&ck->lock);
	ck->stop = true;
	pthread_cond_broadcast(&ck->cond);
	pthread_mutex_unlock(&ck->lock);
	pthread_join(ck->thread, NULL);
	while (ck->sessions != NULL) {
		struct sess *s = ck->sessions;

		ck->sessions = s->next;
		free(s->keys);
		free(s);
	}
	pthread_mutex_destroy(&ck->lock);
	pthread_cond_destroy(&ck->cond);
	free(ck);
}

uint32_t pboxd_ckpt_session_start(struct pboxd_ckpt *ck, const struct pbox_job *job,
				  const struct pbox_keyspec *keys, uint32_t nkeys)
{
	char path[600], bad[620], err[700];
	uint32_t version = 0;
	struct sess *s;
	int rc;

	if (ck == NULL || job->mode != PBOX_MODE_SERVER_OPT || !job->checkpoint) {
		return 0;
	}
	job_path(ck, job->wire.id, "", path, sizeof(path));
	rc = pboxd_ckpt_read_state(path, job, keys, nkeys, &version, err, sizeof(err));
	if (rc == 0) {
		PBOX_LOG_INFO(ADMIN, "job %u: restored version %u from %s", job->wire.id, version,
			      path);
	} else if (rc != -ENOENT) {
		job_path(ck, job->wire.id, ".rejected", bad, sizeof(bad));
		PBOX_LOG_WARN(ADMIN,
			      "job %u: checkpoint not restored, the session starts fresh: %s "
			      "(kept as %s)",
			      job->wire.id, err, bad);
		rename(path, bad);
		version = 0;
	}
	s = calloc(1, sizeof(*s));
	if (s != NULL) {
		s->keys = malloc((size_t)nkeys * sizeof(*keys));
	}
	if (s == NULL || s->keys == NULL) {
		PBOX_LOG_ERR(ADMIN, "job %u: out of memory: this session is not checkpointed",
			     job->wire.id);
		free(s);
		return version;
	}
	memcpy(s->keys, keys, (size_t)nkeys * sizeof(*keys));
	s->nkeys = nkeys;
	s->job = *job;
	pthread_mutex_lock(&ck->lock);
	s->next = ck->sessions;
	ck->sessions = s;
	pthread_mutex_unlock(&ck->lock);
	return version;
}

void pboxd_ckpt_session_end(struct pboxd_ckpt *ck, uint32_t id)
{
	struct sess **pp, *s;

	if (ck == NULL) {
		return;
	}
	pthread_mutex_lock(&ck->lock);
	for (pp = &ck->sessions; *pp != NULL && (*pp)->job.wire.id != id; pp = &(*pp)->next) {
	}
	s = *pp;
	if (s != NULL) {
		s->gone = true;
		while (s->busy) {
			pthread_cond_wait(&ck->cond, &ck->lock);
		}
		/* The list may have changed while we waited; find it again. */
		for (pp = &ck->sessions; *pp != s; pp = &(*pp)->next) {
		}
		*pp = s->next;
	}
	pthread_mutex_unlock(&ck->lock);
	if (s != NULL) {
		free(s->keys);
		free(s);
	}
}

void pboxd_ckpt_request(struct pboxd_ckpt *ck)
{
	if (ck == NULL) {
		return;
	}
	pthread_mutex_lock(&ck->lock);
	ck->req++;
	pthread_cond_broadcast(&ck->cond);
	pthread_mutex_unlock(&ck->lock);
}

int pboxd_ckpt_flush(struct pboxd_ckpt *ck, uint32_t timeout_ms)
{
	struct timespec ts;
	int rc = 0;

	if (ck == NULL) {
		return 0;
	}
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += (time_t)(timeout_ms / 1000);
	ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&ck->lock);
	while (ck->done != ck->req && rc == 0) {
		if (pthread_cond_timedwait(&ck->cond, &ck->lock, &ts) == ETIMEDOUT) {
			rc = -ETIMEDOUT;
		}
	}
	pthread_mutex_unlock(&ck->lock);
	return rc;
}

uint64_t pboxd_ckpt_written(const struct pboxd_ckpt *ck)
{
	uint64_t n;

	if (ck == NULL) {
		return 0;
	}
	pthread_mutex_lock((pthread_mutex_t *)&ck->lock);
	n = ck->written;
	pthread_mutex_unlock((pthread_mutex_t *)&ck->lock);
	return n;
}
