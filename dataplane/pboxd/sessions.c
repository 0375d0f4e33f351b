/* SPDX-License-Identifier: BSD-3-Clause */
/* Job sessions: admission, key sets, cookies, and the published job table. */
#include "sessions.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <pbox/pbox.h>

#include "common/bitmap.h"
#include "common/hostport.h"
#include "common/ctlproto.h"
#include "common/jobspec.h"
#include "common/log.h"
#include "dvf/dvf_job.h"
#include "budget.h"
#include "checkpoint.h"
#include "transport/shm/pboxd_shm.h"
#include "common/tsbmsg.h"
#include "engine/bcast.h"
#include "tsbd.h"

enum sess_state {
	SESS_IDLE = 0,
	SESS_ACTIVE,
	SESS_ABORTED,
	SESS_STARTING, /* chunk state being allocated by the allocator thread */
};

struct member {
	struct pboxd_member_ref *ref; /* NULL: rank not connected */
	uint64_t cookie;              /* 0 until registered */
	bool waiting;                 /* registered while the session was starting */
	char probe[64];               /* its SLoPS responder "a.b.c.d:port" ("": none) */
};

/* A probe pbox-ctrld asked a rank to make (pboxd_sessions_probe_via), waiting for the
 * rank's probe_result. */
struct via_probe {
	uint64_t id; /* 0: free slot */
	uint32_t job, rank;
	struct pboxd_member_ref *owner; /* the admin connection to answer */
	uint64_t deadline_ms;
};

#define PBOXD_VIA_MAX 16u

/* One allocation of a session's chunk state, handed to the allocator thread and back. */
struct alloc_req {
	struct job *job;
	struct pbox_job desc;         /* what pbox_job_state_create reads; points into job */
	struct pbox_job_state *state; /* the result (NULL: failed) */
	int err;                      /* why it failed (errno) */
	uint64_t elapsed_ns;
	struct alloc_req *next;
};

struct job {
	const struct pboxd_job_cfg *cfg;
	struct pboxd_job_cfg *owned_cfg; /* a runtime job's configuration (NULL: the file's) */
	bool removed; /* job_rm while its chunk state was being allocated: freed when it is */
	/* The control plane's plan (tree, thresholds; common/jobspec.h), published with RCU
	 * (sessions.h: pboxd_job_plan). NULL: none. */
	struct pboxd_job_plan *plan;
	uint64_t created_ms;
	enum sess_state st;
	char abort_reason[256];
	uint32_t nconnected;
	uint32_t nregistered;
	struct member *members;
	/* session */
	struct pbox_keyspec *keys;
	uint32_t nkeys;
	struct pbox_jobdesc desc;
	bool has_desc;
	struct pbox_job_state *state;
	uint64_t sessions; /* sessions started so far */
	uint64_t *live;    /* ranks counted as members of the running session */
	uint32_t nlive;
	uint64_t generation;     /* bumped when live changes */
	uint64_t ranks_removed;  /* ranks removed from sessions, all time */
	uint64_t charged;        /* bytes of the session's state charged to the budget */
	uint32_t resume_version; /* restored from a checkpoint (0: fresh) */
	/* TSB (tsbd.h): the session's key (given at register) and tree; the tables carry
	 * the tree once every rank was told its place (tsb_live). */
	struct pbox_tsb *tsb;
	struct pbox_tsb_key tsb_key;
	bool tsb_keyed;
	bool tsb_live;
	bool tsb_from_plan;
};

/*
 * The allocator thread maps and populates (MAP_POPULATE) a new session's chunk state, which
 * for a large job takes seconds: on the control thread it would stall every other job's
 * heartbeats. Requests and results pass through two lists under one mutex; a result is
 * signalled on an eventfd that the control loop watches (pboxd_sessions_fd).
 */
struct allocator {
	pthread_t thread;
	bool started;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct alloc_req *todo, **todo_tail; /* FIFO, under lock */
	struct alloc_req *done;              /* under lock */
	bool stop;                           /* under lock */
	int efd;
};

struct pboxd_sessions {
	const struct pboxd_config *cfg;
	struct pboxd_dp *dp;
	uint32_t njobs;
	uint32_t cap;
	struct job **jobs; /* sorted by id (removed ones, still allocating, included) */
	uint64_t jobs_created, jobs_removed; /* at run time */
	uint64_t plans_swapped;              /* job_plan applied */
	uint64_t generation;
	uint32_t frag_bytes;
	struct allocator alloc;
	struct pbox_ratelog reg_log; /* register refusals */
	struct pboxd_budget budget;
	struct pboxd_ckpt *ckpt; /* NULL: checkpoints off */
	pboxd_publish_hook_fn publish_hook;
	void *publish_hook_arg;
	struct via_probe via[PBOXD_VIA_MAX];
	uint64_t via_next_id;
};

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *allocator_main(void *arg)
{
	struct allocator *a = arg;

	pthread_mutex_lock(&a->lock);
	for (;;) {
		struct alloc_req *r;
		uint64_t t0, one = 1;

		while (a->todo == NULL && !a->stop) {
			pthread_cond_wait(&a->cond, &a->lock);
		}
		if (a->stop) {
			break; /* what is left is freed by allocator_stop's caller */
		}
		r = a->todo;
		a->todo = r->next;
		if (a->todo == NULL) {
			a->todo_tail = &a->todo;
		}
		pthread_mutex_unlock(&a->lock);
		t0 = mono_ns();
		r->state = pbox_job_state_create(&r->desc);
		r->err = r->state == NULL ? errno : 0;
		r->elapsed_ns = mono_ns() - t0;
		pthread_mutex_lock(&a->lock);
		r->next = a->done;
		a->done = r;
		if (write(a->efd, &one, sizeof(one)) != sizeof(one)) {
			/* The counter cannot overflow here; the control loop reads it. */
			PBOX_LOG_ERR(ADMIN, "allocator: eventfd write: %s", strerror(errno));
		}
	}
	pthread_mutex_unlock(&a->lock);
	return NULL;
}

static int allocator_start(struct allocator *a)
{
	int rc;

	a->todo_tail = &a->todo;
	a->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (a->efd < 0) {
		rc = -errno;
		PBOX_LOG_ERR(ADMIN, "allocator: eventfd: %s", strerror(errno));
		return rc;
	}
	pthread_mutex_init(&a->lock, NULL);
	pthread_cond_init(&a->cond, NULL);
	rc = pthread_create(&a->thread, NULL, allocator_main, a);
	if (rc != 0) {
		PBOX_LOG_ERR(ADMIN, "allocator: cannot start its thread: %s", strerror(rc));
		return -rc;
	}
	a->started = true;
	return 0;
}

/* Stop the thread (after the allocation it is doing) and return what it did not take and
 * what it finished, for the caller to free. */
static struct alloc_req *allocator_stop(struct allocator *a)
{
	struct alloc_req *left, *r;

	if (!a->started) {
		if (a->efd > 0) {
			close(a->efd);
		}
		return NULL;
	}
	pthread_mutex_lock(&a->lock);
	a->stop = true;
	pthread_cond_signal(&a->cond);
	pthread_mutex_unlock(&a->lock);
	pthread_join(a->thread, NULL);
	a->started = false;
	left = a->todo;
	for (r = a->done; r != NULL;) {
		struct alloc_req *next = r->next;

		r->next = left;
		left = r;
		r = next;
	}
	a->todo = a->done = NULL;
	pthread_mutex_destroy(&a->lock);
	pthread_cond_destroy(&a->cond);
	close(a->efd);
	return left;
}

static int job_cmp(const void *a, const void *b)
{
	const struct job *x = *(struct job *const *)a, *y = *(struct job *const *)b;

	return x->cfg->id < y->cfg->id ? -1 : (x->cfg->id > y->cfg->id);
}

static void plan_free(struct pboxd_job_plan *p)
{
	if (p != NULL) {
		json_decref(p->json);
		free(p);
	}
}

static void plan_retired(struct rcu_head *head)
{
	plan_free(caa_container_of(head, struct pboxd_job_plan, rcu));
}

static struct pboxd_job_plan *plan_new(const json_t *plan)
{
	struct pboxd_job_plan *p = calloc(1, sizeof(*p));

	if (p == NULL) {
		return NULL;
	}
	p->json = json_deep_copy(plan);
	if (p->json == NULL) {
		free(p);
		return NULL;
	}
	p->revision = pbox_jobspec_plan_revision(plan);
	return p;
}

/* Publish np as j's plan (NULL: none) and retire the old one after a grace period. The
 * control thread goes RCU-online only for the exchange (QSBR, as pboxd_dp_publish): it
 * never waits for a grace period. Without running cores nothing can read the old plan. */
static void plan_swap(struct pboxd_sessions *s, struct job *j, struct pboxd_job_plan *np)
{
	struct pboxd_job_plan *old;

	if (s->dp == NULL || !s->dp->rcu_registered) {
		old = j->plan;
		rcu_set_pointer(&j->plan, np);
		plan_free(old);
		return;
	}
	rcu_thread_online();
	old = rcu_xchg_pointer(&j->plan, np);
	if (old != NULL) {
		call_rcu(&old->rcu, plan_retired);
	}
	rcu_thread_offline();
}

static void job_free(struct job *j)
{
	if (j == NULL) {
		return;
	}
	free(j->members);
	free(j->live);
	free(j->keys); /* a session's key set (NULL once its session ended) */
	plan_free(j->plan);
	pbox_tsb_free(j->tsb);
	if (j->owned_cfg != NULL) {
		pboxd_job_cfg_free(j->owned_cfg);
		free(j->owned_cfg);
	}
	free(j);
}

/* A job with no session for configuration cfg (owned: taken, freed with the job). */
static struct job *job_new(const struct pboxd_job_cfg *cfg, struct pboxd_job_cfg *owned)
{
	struct job *j = calloc(1, sizeof(*j));

	if (j == NULL) {
		return NULL;
	}
	j->cfg = cfg;
	j->owned_cfg = owned;
	j->created_ms = pboxd_now_ms();
	j->members = calloc(cfg->workers, sizeof(struct member));
	j->live = calloc(pbox_bitmap_words(cfg->workers), sizeof(uint64_t));
	if (j->members == NULL || j->live == NULL) {
		j->owned_cfg = NULL; /* not taken: the caller still owns it */
		job_free(j);
		return NULL;
	}
	return j;
}

struct pboxd_sessions *pboxd_sessions_create(const struct pboxd_config *cfg, struct pboxd_dp *dp)
{
	struct pboxd_sessions *s = calloc(1, sizeof(*s));

	if (s == NULL) {
		return NULL;
	}
	s->cfg = cfg;
	s->dp = dp;
	s->alloc.efd = -1;
	s->frag_bytes = pbox_frag_bytes_for_mtu(cfg->mtu, cfg->chunk_bytes);
	pboxd_budget_init(&s->budget, cfg->memory_budget);
	if (pboxd_ckpt_create(cfg, &s->ckpt) != 0) {
		free(s);
		return NULL;
	}
	s->cap = cfg->njobs > 16 ? cfg->njobs : 16;
	s->jobs = calloc(s->cap, sizeof(*s->jobs));
	if (s->jobs == NULL) {
		pboxd_ckpt_destroy(s->ckpt);
		free(s);
		return NULL;
	}
	for (uint32_t i = 0; i < cfg->njobs; i++) {
		s->jobs[i] = job_new(&cfg->jobs[i], NULL);
		if (s->jobs[i] == NULL) {
			pboxd_sessions_destroy(s);
			return NULL;
		}
		s->njobs = i + 1;
	}
	qsort(s->jobs, s->njobs, sizeof(*s->jobs), job_cmp);
	if (allocator_start(&s->alloc) != 0) {
		pboxd_sessions_destroy(s);
		return NULL;
	}
	return s;
}

static struct job *find_job(const struct pboxd_sessions *s, uint32_t id)
{
	uint32_t lo = 0, hi = s->njobs;

	/* Sorted by id; a removed job still allocating may share its id with a new one. */
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (s->jobs[mid]->cfg->id < id) {
			lo = mid + 1;
		} else {
			hi = mid;
		}
	}
	for (; lo < s->njobs && s->jobs[lo]->cfg->id == id; lo++) {
		if (!s->jobs[lo]->removed) {
			return s->jobs[lo];
		}
	}
	return NULL;
}

/* Take j out of the job list (not freed). */
static void unlink_job(struct pboxd_sessions *s, struct job *j)
{
	for (uint32_t i = 0; i < s->njobs; i++) {
		if (s->jobs[i] == j) {
			memmove(&s->jobs[i], &s->jobs[i + 1],
				(s->njobs - i - 1) * sizeof(s->jobs[0]));
			s->njobs--;
			return;
		}
	}
}

static const char *mode_name(enum pbox_job_mode m)
{
	static const char *const names[] = { [PBOX_MODE_AGGREGATE] = "aggregate",
					     [PBOX_MODE_SERVER_OPT] = "server-optimizer",
					     [PBOX_MODE_BROADCAST] = "broadcast" };

	return names[m];
}

static void fill_job(struct pbox_job *pj, const struct job *j)
{
	const struct pboxd_job_cfg *c = j->cfg;

	pj->wire.id = c->id;
	/* Tables point at the state's copy: it lives as long as a core may read them. */
	pj->wire.desc = j->state != NULL ? &j->state->desc : &j->desc;
	pj->wire.accepts_init = c->mode == PBOX_MODE_SERVER_OPT;
	pj->mode = c->mode;
	pj->reduce = c->reduce;
	pj->run = j->st == SESS_ABORTED ? PBOX_JOB_ABORTED : PBOX_JOB_RUNNING;
	pj->abort_errno = ECONNABORTED;
	pj->deterministic = c->deterministic;
	pj->window = c->window;
	pj->opt = c->opt;
	pj->opt_params = c->opt_params;
	pj->sync = c->sync;
	pj->sync_cfg = c->sync_cfg;
	pj->credits = c->credits;
	pj->verify_crc = c->verify_crc;
	pj->checkpoint = c->checkpoint;
	pj->non_finite = c->non_finite;
	pj->dvf = c->dvf;
	pj->dvf.link = pbox_dvf_plan_broadcast_link(j->plan != NULL ? j->plan->json : NULL,
						    c->dvf.link); /* the plan's, if it says */
	pj->wire.accepts_dvf = c->dvf.enabled;
	pj->live = j->live;
	pj->nlive = j->nlive;
	pj->generation = j->generation;
	pj->state = j->state;
	pj->tsb = j->tsb_live ? j->tsb : NULL;
}

/* In the cores' job table: a session whose chunk state exists. */
static bool is_published(const struct job *j)
{
	return !j->removed && (j->st == SESS_ACTIVE || j->st == SESS_ABORTED);
}

/* Build and publish the table of every job with a session; free the old one. */
static int publish(struct pboxd_sessions *s)
{
	struct pbox_jobtab *tab;
	uint32_t n = 0, i;

	for (i = 0; i < s->njobs; i++) {
		n += is_published(s->jobs[i]);
	}
	tab = calloc(1, sizeof(*tab) + n * sizeof(tab->jobs[0]));
	if (tab == NULL) {
		PBOX_LOG_ERR(ADMIN, "out of memory publishing the job table");
		return -ENOMEM;
	}
	tab->generation = ++s->generation;
	for (i = 0; i < s->njobs; i++) {
		const struct job *j = s->jobs[i];
		struct pbox_job *pj;
		uint64_t *cookies;

		if (!is_published(j)) {
			continue;
		}
		/* One allocation: the job entry, its cookies, its live bitmap. */
		pj = calloc(1,
			    sizeof(*pj) + (j->cfg->workers + pbox_bitmap_words(j->cfg->workers)) *
						  sizeof(uint64_t));
		if (pj == NULL) {
			for (uint32_t k = 0; k < tab->njobs; k++) {
				free((void *)tab->jobs[k]);
			}
			free(tab);
			PBOX_LOG_ERR(ADMIN, "out of memory publishing the job table");
			return -ENOMEM;
		}
		cookies = (uint64_t *)(pj + 1);
		for (uint32_t r = 0; r < j->cfg->workers; r++) {
			cookies[r] = j->members[r].ref != NULL ? j->members[r].cookie : 0;
		}
		fill_job(pj, j);
		pj->wire.cookies = cookies;
		pj->live = cookies + j->cfg->workers;
		memcpy((uint64_t *)pj->live, j->live, pbox_bitmap_words(j->cfg->workers) * 8);
		tab->jobs[tab->njobs++] = pj;
	}
	/* The data plane frees the old table (and what it alone kept) after a grace period. */
	if (pboxd_dp_publish(s->dp, tab) != 0) {
		pbox_jobtab_free(tab);
		return -ENOMEM;
	}
	if (s->publish_hook != NULL) {
		s->publish_hook(s->publish_hook_arg, tab);
	}
	return 0;
}

void pboxd_sessions_set_publish_hook(struct pboxd_sessions *s, pboxd_publish_hook_fn fn, void *arg)
{
	s->publish_hook = fn;
	s->publish_hook_arg = arg;
}

struct tsb_retired {
	struct rcu_head rcu;
	struct pbox_tsb *t;
};

static void tsb_retired_cb(struct rcu_head *head)
{
	struct tsb_retired *r = caa_container_of(head, struct tsb_retired, rcu);

	pbox_tsb_free(r->t);
	free(r);
}

/* The session's tree goes after the grace period that retires the tables naming it
 * (published already without it). */
static void tsb_retire(struct pboxd_sessions *s, struct job *j)
{
	struct tsb_retired *r;

	j->tsb_keyed = false;
	j->tsb_live = false;
	if (j->tsb == NULL) {
		return;
	}
	r = s->dp != NULL && s->dp->rcu_registered ? malloc(sizeof(*r)) : NULL;
	if (r == NULL) {
		if (s->dp != NULL && s->dp->rcu_registered) {
			/* No memory for the deferral: wait for the grace period here, once. */
			synchronize_rcu();
		}
		pbox_tsb_free(j->tsb);
	} else {
		r->t = j->tsb;
		rcu_thread_online();
		call_rcu(&r->rcu, tsb_retired_cb);
		rcu_thread_offline();
	}
	j->tsb = NULL;
}

static void end_session(struct pboxd_sessions *s, struct job *j)
{
	struct pbox_job_state *st = j->state;

	pboxd_ckpt_session_end(s->ckpt, j->cfg->id); /* before the state can go */
	j->st = SESS_IDLE;
	j->state = NULL;
	/* The session's reference: the state (and the job description it adopted) goes when
	 * the tables that cores may still read are retired and the transport released its
	 * replies, never sooner (dataplane.h). */
	publish(s);
	pboxd_shm_session_ended(s->dp != NULL ? s->dp->shm : NULL); /* their pin on st */
	tsb_retire(s, j);
	pbox_job_state_put(st);
	pboxd_budget_release(&s->budget, j->charged);
	j->charged = 0;
	if (j->has_desc) {
		memset(&j->desc, 0, sizeof(j->desc)); /* the state's now */
		j->has_desc = false;
	}
	free(j->keys);
	j->keys = NULL;
	j->nkeys = 0;
	j->nregistered = 0;
	PBOX_LOG_INFO(ADMIN, "job %u: session ended; the job is idle", j->cfg->id);
}

static void abort_session(struct pboxd_sessions *s, struct job *j, const char *reason)
{
	json_t *ev;

	if (j->st != SESS_ACTIVE) {
		return;
	}
	j->st = SESS_ABORTED;
	snprintf(j->abort_reason, sizeof(j->abort_reason), "%s", reason);
	PBOX_LOG_WARN(ADMIN, "job %u: session aborted: %s", j->cfg->id, reason);
	/* Tell the members first, so the reason is on its way before their datagrams start
	 * being refused. */
	ev = json_pack("{s:s, s:i, s:s}", "event", "abort", "errno", ECONNABORTED, "reason",
		       reason);
	for (uint32_t r = 0; r < j->cfg->workers; r++) {
		if (j->members[r].ref != NULL) {
			j->members[r].ref->send_event(j->members[r].ref, ev);
		}
	}
	json_decref(ev);
	publish(s);
}

json_t *pboxd_sessions_hello(struct pboxd_sessions *s, struct pboxd_member_ref *ref,
			     const json_t *req)
{
	json_t *jid = json_object_get(req, "job"), *jrank = json_object_get(req, "rank");
	const char *token = json_string_value(json_object_get(req, "token"));
	json_int_t version = json_integer_value(json_object_get(req, "version"));
	struct job *j;
	uint32_t rank;

	if (ref->joined) {
		return pbox_ctl_error(EALREADY, "this connection already joined job %u as rank %u",
				      ref->job, ref->rank);
	}
	if (!json_is_integer(jid) || !json_is_integer(jrank) || token == NULL) {
		return pbox_ctl_error(EINVAL,
				      "hello needs integer 'job', 'rank' and string 'token'");
	}
	if (version != PBOX_CTL_PROTO_VERSION) {
		return pbox_ctl_error(
			EPROTONOSUPPORT,
			"control protocol version %lld not supported (pboxd speaks %d)",
			(long long)version, PBOX_CTL_PROTO_VERSION);
	}
	j = json_integer_value(jid) >= 0 && json_integer_value(jid) <= UINT32_MAX
		    ? find_job(s, (uint32_t)json_integer_value(jid))
		    : NULL;
	if (j == NULL) {
		/* The other jobs are not listed: their ids are not this client's business. The
		 * control channel logs and counts the refusal (rate-limited). */
		return pbox_ctl_error(ENOENT, "job %lld is not configured on this appliance",
				      (long long)json_integer_value(jid));
	}
	if (!pbox_ctl_token_equal(token, j->cfg->token)) {
		return pbox_ctl_error(EACCES, "job %u: wrong token for rank %lld", j->cfg->id,
				      (long long)json_integer_value(jrank));
	}
	if (json_integer_value(jrank) < 0 || json_integer_value(jrank) >= j->cfg->workers) {
		return pbox_ctl_error(
			EINVAL, "job %u has %u workers (ranks 0..%u); rank %lld is out of range",
			j->cfg->id, j->cfg->workers, j->cfg->workers - 1,
			(long long)json_integer_value(jrank));
	}
	rank = (uint32_t)json_integer_value(jrank);
	if (j->st == SESS_ABORTED) {
		return pbox_ctl_error(EBUSY,
				      "job %u was aborted (%s); it restarts once its %u remaining "
				      "worker(s) disconnect",
				      j->cfg->id, j->abort_reason, j->nconnected);
	}
	if (j->members[rank].ref != NULL) {
		return pbox_ctl_error(EBUSY, "rank %u of job %u is already connected (from %s)",
				      rank, j->cfg->id, j->members[rank].ref->peer);
	}
	if (j->st == SESS_ACTIVE && !pbox_bit_test(j->live, rank)) {
		return pbox_ctl_error(EBUSY,
				      "rank %u was removed from the running session of job %u; it "
				      "can join the next session",
				      rank, j->cfg->id);
	}
	j->members[rank].ref = ref;
	j->members[rank].cookie = 0;
	j->nconnected++;
	ref->joined = true;
	ref->job = j->cfg->id;
	ref->rank = rank;
	PBOX_LOG_INFO(ADMIN, "job %u: rank %u connected from %s (%u of %u)", j->cfg->id, rank,
		      ref->peer, j->nconnected, j->cfg->workers);
	if (j->cfg->mode == PBOX_MODE_BROADCAST) {
		/* Every worker runs the job's optimizer: the same one, from here. Floats go
		 * as doubles, which round back exactly. */
		const struct pbox_opt_params *p = &j->cfg->opt_params;

		return json_pack("{s:b, s:i, s:s, s:s, s:{s:s, s:f, s:f, s:f, s:f, s:f, s:f, "
				 "s:f, s:f}}",
				 "ok", 1, "workers", (json_int_t)j->cfg->workers, "mode",
				 mode_name(j->cfg->mode), "reduce",
				 j->cfg->reduce == PBOX_REDUCE_MEAN ? "mean" : "sum", "optimizer",
				 "name", j->cfg->opt->name, "lr", (double)p->lr, "momentum",
				 (double)p->momentum, "wd", (double)p->wd, "rescale",
				 (double)p->rescale, "clip", (double)p->clip, "beta1",
				 (double)p->beta1, "beta2", (double)p->beta2, "eps",
				 (double)p->eps);
	}
	return json_pack("{s:b, s:i, s:s, s:s}", "ok", 1, "workers", (json_int_t)j->cfg->workers,
			 "mode", mode_name(j->cfg->mode), "reduce",
			 j->cfg->reduce == PBOX_REDUCE_MEAN ? "mean" : "sum");
}

/* Parse the request's keys; returns the count or a negative errno with *resp set. */
static int parse_keys(const json_t *arr, uint32_t max, struct pbox_keyspec **out, json_t **resp)
{
	size_t n = json_array_size(arr);
	struct pbox_keyspec *ks;

	if (!json_is_array(arr) || n == 0 || n > max) {
		*resp = pbox_ctl_error(EINVAL,
				       "register needs 'keys': 1..%u [id, elements] pairs (the "
				       "appliance's control_limits.max_register_keys)",
				       max);
		return -EINVAL;
	}
	ks = calloc(n, sizeof(*ks));
	if (ks == NULL) {
		*resp = pbox_ctl_error(ENOMEM, "out of memory for %zu keys", n);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		const json_t *p = json_array_get(arr, i);
		json_int_t id = json_integer_value(json_array_get(p, 0));
		json_int_t ne = json_integer_value(json_array_get(p, 1));

		if (json_array_size(p) != 2 || !json_is_integer(json_array_get(p, 0)) ||
		    !json_is_integer(json_array_get(p, 1)) || id < 0 || id > UINT32_MAX ||
		    ne <= 0 || ne > (1LL << 40)) {
			free(ks);
			*resp = pbox_ctl_error(
				EINVAL,
				"key #%zu: expected [id, elements] with id 0..2^32-1 "
				"and 1..2^40 elements",
				i);
			return -EINVAL;
		}
		ks[i].id = (uint32_t)id;
		ks[i].nelem = (uint64_t)ne;
	}
	*out = ks;
	return (int)n;
}

/* NULL if equal, else a response describing the first difference. */
static json_t *keys_differ(const struct job *j, const struct pbox_keyspec *ks, uint32_t n,
			   const struct pbox_keyspec *want, uint32_t nwant, const char *whose)
{
	if (n != nwant) {
		return pbox_ctl_error(EINVAL, "job %u: %u keys registered, but %s has %u",
				      j->cfg->id, n, whose, nwant);
	}
	for (uint32_t i = 0; i < n; i++) {
		if (ks[i].id != want[i].id || ks[i].nelem != want[i].nelem) {
			return pbox_ctl_error(
				EINVAL,
				"job %u: key #%u is id %u with %llu elements here, but "
				"id %u with %llu elements in %s",
				j->cfg->id, i, ks[i].id, (unsigned long long)ks[i].nelem,
				want[i].id, (unsigned long long)want[i].nelem, whose);
		}
	}
	return NULL;
}

/* Start a session with key set ks (taken): the key set is fixed now, the chunk state is
 * allocated by the allocator thread (pboxd_sessions_poll finishes the start). NULL, or an
 * error response. */
static json_t *start_session(struct pboxd_sessions *s, struct job *j, struct pbox_keyspec *ks,
			     uint32_t n)
{
	struct pbox_job tmp = { 0 };
	struct alloc_req *r;
	char err[256];
	int rc;

	fill_job(&tmp, j);
	rc = pboxd_budget_precheck(&s->budget, j->cfg, &tmp, ks, n, s->cfg->chunk_bytes,
				   s->frag_bytes, err, sizeof(err));
	if (rc == 0) {
		/* A fixed key set may come with the control plane's core map (checked at
		 * job_create against this key set and these cores). */
		rc = pbox_jobdesc_build(&j->desc, ks, n, j->cfg->workers, s->cfg->ncores,
					s->cfg->chunk_bytes, s->frag_bytes, j->cfg->core_map, err,
					sizeof(err));
	}
	if (rc != 0) {
		free(ks);
		return pbox_ctl_error(-rc, "job %u: %s", j->cfg->id, err);
	}
	r = calloc(1, sizeof(*r));
	if (r == NULL) {
		pbox_jobdesc_free(&j->desc);
		free(ks);
		return pbox_ctl_error(ENOMEM, "job %u: out of memory", j->cfg->id);
	}
	j->has_desc = true;
	for (uint32_t b = 0; b < j->cfg->workers; b++) {
		pbox_bit_set(j->live, b);
	}
	j->nlive = j->cfg->workers;
	j->generation++;
	fill_job(&tmp, j);
	j->charged = pbox_job_state_bytes(&tmp);
	rc = pboxd_budget_charge(&s->budget, j->cfg, j->charged, err, sizeof(err));
	if (rc != 0) {
		j->charged = 0;
		pbox_jobdesc_free(&j->desc);
		j->has_desc = false;
		free(ks);
		free(r);
		return pbox_ctl_error(-rc, "job %u: %s", j->cfg->id, err);
	}
	j->keys = ks;
	j->nkeys = n;
	j->st = SESS_STARTING;
	j->tsb_keyed = j->cfg->tree && pbox_tsb_key_new(&j->tsb_key) == 0;
	/* The request points into j: desc, keys and live do not change while starting. */
	r->job = j;
	fill_job(&r->desc, j);
	pthread_mutex_lock(&s->alloc.lock);
	*s->alloc.todo_tail = r;
	s->alloc.todo_tail = &r->next;
	pthread_cond_signal(&s->alloc.cond);
	pthread_mutex_unlock(&s->alloc.lock);
	PBOX_LOG_INFO(ADMIN, "job %u: allocating %.1f MB of chunk state for %u keys", j->cfg->id,
		      (double)j->desc.total_bytes / 1e6, n);
	return NULL;
}

/* "a.b.c.d:port" with a port 1..65535. */
static bool probe_addr_ok(const char *a)
{
	char host[INET_ADDRSTRLEN];
	struct in_addr ia;
	uint16_t port;

	return a != NULL && strlen(a) < 64 &&
	       pbox_hostport_split(a, false, 1, host, sizeof(host), &port) == 0 &&
	       inet_pton(AF_INET, host, &ia) == 1;
}

/* resp with "plan": rank's slice of j's plan when j holds one that has it (steals resp).
 * A plan without a tree for the job is not sent (err says why, when given). */
static json_t *with_plan(const struct job *j, uint32_t rank, json_t *resp, char *err, size_t errlen)
{
	struct pbox_plan *p = malloc(sizeof(*p));
	char e[160];

	if (p != NULL && resp != NULL && j->plan != NULL) {
		if (pbox_ctl_plan_slice(j->plan->json, rank, j->cfg->workers, p, e, sizeof(e)) ==
		    0) {
			json_object_set_new(resp, "plan", pbox_ctl_plan_encode(p));
		} else if (err != NULL) {
			snprintf(err, errlen, "%s", e);
		}
	}
	free(p);
	return resp;
}

/* Tell every registered rank of j its slice of j's (new) plan. */
static void push_plan(const struct job *j)
{
	uint32_t told = 0;
	char err[160] = "";

	for (uint32_t r = 0; r < j->cfg->workers; r++) {
		const struct member *m = &j->members[r];
		json_t *ev;

		if (m->ref == NULL || m->cookie == 0) {
			continue; /* not registered: gets it with the register answer */
		}
		ev = with_plan(j, r, json_pack("{s:s}", "event", "plan"), err, sizeof(err));
		if (ev != NULL && json_object_get(ev, "plan") != NULL) {
			m->ref->send_event(m->ref, ev);
			told++;
		}
		json_decref(ev);
	}
	if (told > 0) {
		PBOX_LOG_DEBUG(ADMIN, "job %u: plan revision %lld sent to %u rank(s)", j->cfg->id,
			       (long long)j->plan->revision, told);
	} else if (err[0] != '\0') {
		/* Once per plan (not per rank): the ranks keep what they had. */
		PBOX_LOG_WARN(ADMIN, "job %u: plan revision %lld not sent to the workers: %s",
			      j->cfg->id, (long long)j->plan->revision, err);
	}
}

/* job_list's "agents": the registered ranks' probe responders. */
static json_t *agents_of(const struct job *j)
{
	json_t *a = json_array();

	for (uint32_t r = 0; a != NULL && r < j->cfg->workers; r++) {
		if (j->members[r].ref != NULL && j->members[r].cookie != 0 &&
		    j->members[r].probe[0] != '\0') {
			json_array_append_new(a, json_pack("{s:I, s:s}", "rank", (json_int_t)r,
							   "probe", j->members[r].probe));
		}
	}
	return a;
}

/* Answer the owner of via-probe slot v with obj (stolen) and free the slot. */
static void via_answer(struct via_probe *v, json_t *obj)
{
	if (obj != NULL && v->owner != NULL) {
		v->owner->send_event(v->owner, obj);
	}
	json_decref(obj);
	v->id = 0;
}

/* The probes waiting for rank of job fail with why (the rank left, the job went). */
static void via_fail_rank(struct pboxd_sessions *s, uint32_t job, uint32_t rank, const char *why)
{
	for (uint32_t v = 0; v < PBOXD_VIA_MAX; v++) {
		if (s->via[v].id != 0 && s->via[v].job == job && s->via[v].rank == rank) {
			via_answer(&s->via[v],
				   pbox_ctl_error(ECONNRESET, "probe via job %u rank %u: %s", job,
						  rank, why));
		}
	}
}

/* The answer to a rank's accepted register in a running session: its cookie and the data
 * plane's geometry. Publishes the new cookie. */
static json_t *finish_register(struct pboxd_sessions *s, struct job *j,
			       struct pboxd_member_ref *ref)
{
	struct member *m = &j->members[ref->rank];
	json_t *ports, *map, *resp;
	char cookie[17];
	uint32_t st;

	while (m->cookie == 0) {
		if (getrandom(&m->cookie, sizeof(m->cookie), 0) != sizeof(m->cookie)) {
			m->cookie = 0;
			return pbox_ctl_error(EIO, "cannot draw a session cookie");
		}
	}
	j->nregistered++;
	/* A rank that waited for its answer (the job's state allocated off the control thread,
	 * seconds for a large key set) sent nothing meanwhile: liveness counts from now, or
	 * the next tick would declare it dead as soon as it is registered. */
	ref->last_seen_ms = PBOX_MAX(ref->last_seen_ms, pboxd_now_ms());
	if (publish(s) != 0) {
		m->cookie = 0;
		j->nregistered--;
		return pbox_ctl_error(ENOMEM, "out of memory");
	}
	ports = json_array();
	for (uint32_t k = 0; k < s->cfg->ncores; k++) {
		json_array_append_new(ports, json_integer(s->cfg->base_port + k));
	}
	map = json_array();
	for (uint32_t c = 0; c < j->desc.nchunks; c++) {
		json_array_append_new(map, json_integer(j->desc.chunks[c].core));
	}
	snprintf(cookie, sizeof(cookie), "%016llx", (unsigned long long)m->cookie);
	PBOX_LOG_INFO(ADMIN, "job %u: rank %u registered (%u of %u)", j->cfg->id, ref->rank,
		      j->nregistered, j->cfg->workers);
	st = j->cfg->sync->worker_staleness(&j->cfg->sync_cfg);
	/* resume_version: the resume contract (README, "Checkpoints and restart"); shm: the
	 * shared-memory socket for workers on this host (transport/shm/shm.h), if offered. */
	resp = json_pack("{s:b, s:s, s:s, s:o, s:i, s:i, s:i, s:o, s:s, s:I, s:i, s:s, "
			 "s:b, s:b, s:i, s:I, s:s*}",
			 "ok", 1, "cookie", cookie, "data_addr", s->cfg->data_addr, "ports", ports,
			 "chunk_bytes", (json_int_t)j->desc.chunk_bytes, "frag_bytes",
			 (json_int_t)j->desc.frag_bytes, "window", (json_int_t)j->cfg->window,
			 "core_map", map, "sync", j->cfg->sync->name, "staleness",
			 st == UINT32_MAX ? (json_int_t)-1 : (json_int_t)st, "credits",
			 (json_int_t)j->cfg->credits, "flow",
			 j->cfg->plain_flow ? "plain" : "notify-ack", "folds_late",
			 j->cfg->sync->folds_late, "crc", j->cfg->verify_crc, "heartbeat_ms",
			 (json_int_t)pboxd_sessions_heartbeat_ms(s), "resume_version",
			 (json_int_t)j->resume_version, "shm", pboxd_shm_advertised());
	if (resp != NULL && j->cfg->dvf.enabled) {
		json_object_set_new(resp, "dvf", pbox_dvf_job_to_json(&j->cfg->dvf));
	}
	if (resp != NULL && j->tsb_keyed) {
		char hex[2 * PBOX_TSB_KEY_BYTES + 1];

		pbox_tsb_key_hex(&j->tsb_key, hex); /* TSB: the session key (common/tsbmsg.h) */
		json_object_set_new(resp, "tsb_key", json_string(hex));
	}
	/* "plan": the rank's slice of the control plane's plan (common/ctlproto.h). */
	return with_plan(j, ref->rank, resp, NULL, 0);
}

static void log_register_refusal(struct pboxd_sessions *s, const struct pboxd_member_ref *ref,
				 const struct job *j, const json_t *resp)
{
	uint64_t suppressed;

	if (pbox_ratelog_ok(&s->reg_log, pboxd_now_ms(), &suppressed)) {
		PBOX_LOG_WARN(ADMIN, "%s: job %u rank %u: register refused: %s%s", ref->peer,
			      j->cfg->id, ref->rank,
			      json_string_value(json_object_get(resp, "error")),
			      suppressed ? " (and earlier refusals not logged)" : "");
	}
}

json_t *pboxd_sessions_register(struct pboxd_sessions *s, struct pboxd_member_ref *ref,
				const json_t *req)
{
	struct pbox_keyspec *ks = NULL;
	json_t *resp = NULL;
	struct member *m;
	struct job *j;
	int n;

	if (!ref->joined) {
		return pbox_ctl_error(EPROTO,
				      "say hello (job, rank, token) before registering keys");
	}
	j = find_job(s, ref->job);
	m = &j->members[ref->rank];
	if (m->cookie != 0 || m->waiting) {
		return pbox_ctl_error(EALREADY, "rank %u of job %u has already registered its keys",
				      ref->rank, j->cfg->id);
	}
	if (j->st == SESS_ABORTED) {
		return pbox_ctl_error(ECONNABORTED, "job %u was aborted: %s", j->cfg->id,
				      j->abort_reason);
	}
	if (json_object_get(req, "probe") != NULL &&
	    !probe_addr_ok(json_string_value(json_object_get(req, "probe")))) {
		return pbox_ctl_error(EINVAL, "register: \"probe\" must be a numeric IPv4 "
					      "\"a.b.c.d:port\" (the worker's probe responder)");
	}
	n = parse_keys(json_object_get(req, "keys"), s->cfg->limits.max_register_keys, &ks, &resp);
	if (n < 0) {
		return resp;
	}
	snprintf(m->probe, sizeof(m->probe), "%s",
		 json_string_value(json_object_get(req, "probe")) ?: "");
	if (j->st == SESS_IDLE) {
		if (j->cfg->keys != NULL) {
			resp = keys_differ(j, ks, (uint32_t)n, j->cfg->keys, j->cfg->nkeys,
					   "the appliance's configuration");
		}
		if (resp == NULL) {
			resp = start_session(s, j, ks, (uint32_t)n);
			ks = NULL; /* taken */
		}
	} else {
		resp = keys_differ(j, ks, (uint32_t)n, j->keys, j->nkeys,
				   "the session (as registered by the first rank)");
	}
	free(ks);
	if (resp != NULL) {
		log_register_refusal(s, ref, j, resp);
		return resp;
	}
	if (j->st == SESS_STARTING) {
		/* Answered by pboxd_sessions_poll once the chunk state exists. */
		m->waiting = true;
		ref->pending = true;
		return NULL;
	}
	return finish_register(s, j, ref);
}

int pboxd_sessions_fd(const struct pboxd_sessions *s)
{
	return s->alloc.efd;
}

/* TSB: the session's tree (published once every rank knows its place: tsb_tick). */
static void tsb_start(struct job *j)
{
	const struct pboxd_job_plan *plan = j->plan;
	uint32_t *parent;
	int src;

	if (!j->tsb_keyed) {
		return;
	}
	parent = calloc(j->cfg->workers, sizeof(*parent));
	src = parent != NULL ? pboxd_tsb_session_tree(j->cfg, plan ? plan->json : NULL, parent)
			     : -ENOMEM;
	if (src >= 0) {
		j->tsb = pbox_tsb_create(parent, j->cfg->workers, j->desc.ncores, &j->tsb_key);
	}
	free(parent);
	if (j->tsb == NULL) {
		PBOX_LOG_ERR(ADMIN,
			     "job %u: no broadcast tree for this session (out of memory): "
			     "results go to every rank directly",
			     j->cfg->id);
		return;
	}
	j->tsb_from_plan = src == 1;
}

/* Every rank of a session with a tree has registered and sent its first datagram (so its
 * data address is pinned): tell each its place, and publish the tree. */
static void tsb_tick(struct pboxd_sessions *s)
{
	for (uint32_t i = 0; i < s->njobs; i++) {
		struct job *j = s->jobs[i];
		struct pbox_peer *addr;
		bool ready = true;

		if (j->st != SESS_ACTIVE || j->removed || j->tsb == NULL || j->tsb_live ||
		    j->nregistered != j->cfg->workers || j->nlive != j->cfg->workers) {
			continue;
		}
		addr = calloc(j->cfg->workers, sizeof(*addr));
		if (addr == NULL) {
			continue;
		}
		for (uint32_t r = 0; r < j->cfg->workers && ready; r++) {
			const struct pbox_rank_pin *pin = &j->state->pins[r];
			uint64_t a = __atomic_load_n(&pin->addr, __ATOMIC_ACQUIRE);

			ready = j->members[r].ref != NULL &&
				__atomic_load_n(&pin->cookie, __ATOMIC_ACQUIRE) ==
					j->members[r].cookie &&
				(a & PBOX_PIN_SET);
			addr[r].ip = (uint32_t)(a >> 16);
			addr[r].port = (uint16_t)a;
		}
		for (uint32_t r = 0; r < j->cfg->workers && ready; r++) {
			struct pbox_tsb_pos pos;
			json_t *ev;

			pboxd_tsb_position(j->tsb->parent, j->cfg->workers, r, addr, j->sessions,
					   &pos);
			ev = pbox_tsb_pos_encode(&pos);
			if (ev != NULL) {
				j->members[r].ref->send_event(j->members[r].ref, ev);
				json_decref(ev);
			}
		}
		free(addr);
		if (!ready) {
			continue;
		}
		j->tsb_live = true;
		publish(s);
		PBOX_LOG_INFO(ADMIN,
			      "job %u: results go down the broadcast tree (%s) from now on; every "
			      "rank was told its place",
			      j->cfg->id,
			      j->tsb_from_plan ? "pbox-ctrld's plan" : "the job's tree");
	}
}

/* A session's chunk state is ready (or could not be allocated): answer its waiting ranks. */
static void finish_start(struct pboxd_sessions *s, struct alloc_req *r)
{
	struct job *j = r->job;
	json_t *resp;

	if (j->removed) {
		/* Removed while allocating: its ranks were told; the state never reached the
		 * cores, so it goes now. */
		if (r->state != NULL) {
			pbox_job_state_adopt_desc(r->state, &j->desc);
			pbox_job_state_put(r->state);
		} else {
			pbox_jobdesc_free(&j->desc);
		}
		pboxd_budget_release(&s->budget, j->charged);
		unlink_job(s, j);
		PBOX_LOG_INFO(ADMIN,
			      "job %u: removed (its chunk state, allocated meanwhile, freed)",
			      j->cfg->id);
		plan_swap(s, j, NULL);
		job_free(j);
		return;
	}
	if (r->state == NULL) {
		bool nofd = r->err == EMFILE || r->err == ENFILE;

		resp = pbox_ctl_error(
			nofd ? r->err : ENOMEM, "job %u: %s for the chunk state (see pboxd's log)",
			j->cfg->id,
			nofd ? "pboxd is out of file descriptors" : "not enough memory");
		for (uint32_t k = 0; k < j->cfg->workers; k++) {
			struct member *m = &j->members[k];

			if (m->waiting) {
				m->waiting = false;
				m->ref->pending = false;
				m->ref->send_event(m->ref, resp);
			}
		}
		json_decref(resp);
		pboxd_budget_release(&s->budget, j->charged);
		j->charged = 0;
		j->st = SESS_IDLE;
		pbox_jobdesc_free(&j->desc);
		j->has_desc = false;
		free(j->keys);
		j->keys = NULL;
		j->nkeys = 0;
		return;
	}
	j->state = r->state;
	/* The state keeps the description: tables that cores may still read point at it. */
	pbox_job_state_adopt_desc(j->state, &j->desc);
	{
		struct pbox_job tmp = { 0 };

		fill_job(&tmp, j);
		j->resume_version = pboxd_ckpt_session_start(s->ckpt, &tmp, j->keys, j->nkeys);
	}
	j->st = SESS_ACTIVE;
	j->sessions++;
	tsb_start(j);
	PBOX_LOG_INFO(
		ADMIN,
		"job %u: session %llu started: %u keys, %.1f MB, %u chunks of <= %u bytes on %u "
		"cores, %s%s (state allocated in %.1f ms off the control thread)",
		j->cfg->id, (unsigned long long)j->sessions, j->nkeys,
		(double)j->desc.total_bytes / 1e6, j->desc.nchunks, j->desc.chunk_bytes,
		j->desc.ncores, mode_name(j->cfg->mode),
		j->cfg->deterministic ? ", deterministic" : "", (double)r->elapsed_ns / 1e6);
	if (j->nconnected == 0) {
		/* Everyone left while it was allocated. */
		end_session(s, j);
		return;
	}
	for (uint32_t k = 0; k < j->cfg->workers; k++) {
		struct member *m = &j->members[k];

		if (!m->waiting) {
			continue;
		}
		m->waiting = false;
		m->ref->pending = false;
		resp = finish_register(s, j, m->ref);
		if (!json_is_true(json_object_get(resp, "ok"))) {
			log_register_refusal(s, m->ref, j, resp);
		}
		m->ref->send_event(m->ref, resp);
		json_decref(resp);
	}
}

void pboxd_sessions_poll(struct pboxd_sessions *s)
{
	struct alloc_req *r, *done, *order = NULL;
	uint64_t v;

	if (read(s->alloc.efd, &v, sizeof(v)) < 0 && errno != EAGAIN) {
		PBOX_LOG_ERR(ADMIN, "allocator: eventfd read: %s", strerror(errno));
	}
	pthread_mutex_lock(&s->alloc.lock);
	done = s->alloc.done;
	s->alloc.done = NULL;
	pthread_mutex_unlock(&s->alloc.lock);
	/* The list is newest first: finish in request order. */
	while (done != NULL) {
		r = done;
		done = r->next;
		r->next = order;
		order = r;
	}
	while (order != NULL) {
		r = order;
		order = r->next;
		finish_start(s, r);
		free(r);
	}
}

/* Take rank out of the running session's counts (iterations stop waiting for it). */
static void drop_from_counts(struct job *j, uint32_t rank, const char *why)
{
	if (j->st != SESS_ACTIVE || !pbox_bit_test(j->live, rank)) {
		return;
	}
	pbox_bit_clear(j->live, rank);
	j->nlive--;
	j->generation++;
	j->ranks_removed++;
	PBOX_LOG_WARN(ADMIN, "job %u: rank %u %s; the session continues with %u of %u workers",
		      j->cfg->id, rank, why, j->nlive, j->cfg->workers);
}

static void remove_member(struct pboxd_sessions *s, struct job *j, uint32_t rank)
{
	struct member *m = &j->members[rank];

	if (m->cookie != 0) {
		j->nregistered--;
	}
	m->ref = NULL;
	m->cookie = 0;
	m->waiting = false;
	m->probe[0] = '\0';
	via_fail_rank(s, j->cfg->id, rank, "the rank left the job");
	j->nconnected--;
	if (j->st == SESS_STARTING) {
		return; /* the allocation's completion ends the session if nobody is left */
	}
	if (j->nconnected == 0 && j->st != SESS_IDLE) {
		end_session(s, j);
	} else if (j->st != SESS_IDLE) {
		publish(s); /* the rank's cookie is no longer valid */
	}
}

json_t *pboxd_sessions_leave(struct pboxd_sessions *s, struct pboxd_member_ref *ref)
{
	struct job *j;

	if (!ref->joined) {
		ref->left = true;
		return json_pack("{s:b}", "ok", 1);
	}
	j = find_job(s, ref->job);
	PBOX_LOG_INFO(ADMIN, "job %u: rank %u left", j->cfg->id, ref->rank);
	ref->left = true;
	ref->joined = false;
	/* Only a registered rank is part of the session's counts. */
	if (j->nconnected > 1 && j->members[ref->rank].cookie != 0) {
		drop_from_counts(j, ref->rank, "left");
	}
	remove_member(s, j, ref->rank);
	return json_pack("{s:b}", "ok", 1);
}

void pboxd_sessions_disconnect(struct pboxd_sessions *s, struct pboxd_member_ref *ref)
{
	struct job *j;
	char why[192];

	for (uint32_t v = 0; v < PBOXD_VIA_MAX; v++) {
		if (s->via[v].id != 0 && s->via[v].owner == ref) {
			s->via[v].id = 0; /* nobody to answer any more */
		}
	}
	if (!ref->joined) {
		return;
	}
	j = find_job(s, ref->job);
	ref->joined = false;
	snprintf(why, sizeof(why), "rank %u (%s) %s", ref->rank, ref->peer,
		 ref->gone_reason[0] ? ref->gone_reason
				     : "left without a goodbye (control connection closed)");
	if (j->members[ref->rank].cookie == 0) {
		/* Never registered: not part of the session's counts. */
		PBOX_LOG_INFO(ADMIN, "job %u: %s before registering", j->cfg->id, why);
	} else if (j->st == SESS_ACTIVE && j->cfg->abort_on_loss) {
		j->members[ref->rank].ref = NULL; /* not told about its own departure */
		abort_session(s, j, why);
		j->members[ref->rank].ref = ref;
	} else if (j->st == SESS_ACTIVE && j->nconnected > 1) {
		drop_from_counts(j, ref->rank,
				 ref->gone_reason[0] ? ref->gone_reason
						     : "was lost (connection closed)");
	} else {
		PBOX_LOG_INFO(ADMIN, "job %u: %s", j->cfg->id, why);
	}
	remove_member(s, j, ref->rank);
}

json_t *pboxd_sessions_status(const struct pboxd_sessions *s)
{
	static const char *const names[] = { "idle", "active", "aborted", "starting" };
	json_t *arr = json_array();

	for (uint32_t i = 0; i < s->njobs; i++) {
		const struct job *j = s->jobs[i];

		if (j->removed) {
			continue;
		}
		json_t *o =
			json_pack("{s:i, s:s, s:s, s:i, s:i, s:i, s:I, s:I, s:I}", "id",
				  (json_int_t)j->cfg->id, "state", names[j->st], "mode",
				  mode_name(j->cfg->mode), "workers", (json_int_t)j->cfg->workers,
				  "connected", (json_int_t)j->nconnected, "registered",
				  (json_int_t)j->nregistered, "sessions", (json_int_t)j->sessions,
				  "chunks", (json_int_t)(j->has_desc ? j->desc.nchunks : 0),
				  "bytes", (json_int_t)(j->has_desc ? j->desc.total_bytes : 0));

		json_object_set_new(o, "sync", json_string(j->cfg->sync->name));
		json_object_set_new(o, "state_bytes", json_integer((json_int_t)j->charged));
		if (j->state != NULL) {
			/* FluentPS's per-shard progress: the spread of the chunks' versions, and
			 * the pulls waiting. Read while the cores write them: each value is a
			 * single word, only roughly simultaneous with the others. */
			uint32_t vmin = UINT32_MAX, vmax = 0, held = 0;
			uint64_t nonfinite = 0;

			for (uint32_t k = 0; k < j->state->ncores; k++) {
				const struct pbox_core_job *cj = &j->state->core[k];

				nonfinite += pbox_stat_read(&cj->nonfinite);
				for (uint32_t c = 0; c < cj->nchunks; c++) {
					uint32_t v = __atomic_load_n(&cj->chunks[c].version,
								     __ATOMIC_RELAXED);

					vmin = PBOX_MIN(vmin, v);
					vmax = PBOX_MAX(vmax, v);
					held += __atomic_load_n(&cj->chunks[c].nheld,
								__ATOMIC_RELAXED);
				}
			}
			json_object_set_new(o, "version_min",
					    json_integer(vmin == UINT32_MAX ? 0 : vmin));
			json_object_set_new(o, "version_max", json_integer(vmax));
			json_object_set_new(o, "pulls_waiting", json_integer(held));
			json_object_set_new(o, "nonfinite", json_integer((json_int_t)nonfinite));
		}
		if (j->tsb != NULL) {
			/* TSB (engine/bcast.h): per-core counters, read relaxed. */
			uint64_t sent = 0, repairs = 0, bypasses = 0;

			for (uint32_t k = 0; k < j->tsb->ncores; k++) {
				sent += pbox_stat_read(&j->tsb->core[k].sent);
				repairs += pbox_stat_read(&j->tsb->core[k].repairs);
				bypasses += pbox_stat_read(&j->tsb->core[k].bypasses);
			}
			json_object_set_new(
				o, "tsb",
				json_pack("{s:b, s:s, s:I, s:I, s:I}", "live", j->tsb_live, "tree",
					  j->tsb_from_plan ? "plan" : "job", "sent",
					  (json_int_t)sent, "repairs", (json_int_t)repairs,
					  "bypasses", (json_int_t)bypasses));
		}
		json_object_set_new(o, "live", json_integer(j->st == SESS_IDLE ? 0 : j->nlive));
		json_object_set_new(o, "removed", json_integer((json_int_t)j->ranks_removed));
		json_object_set_new(o, "origin", json_string(j->owned_cfg ? "runtime" : "config"));
		json_array_append_new(arr, o);
	}
	return arr;
}

uint32_t pboxd_sessions_heartbeat_ms(const struct pboxd_sessions *s)
{
	return PBOX_MIN(1000u, s->cfg->worker_timeout * 1000u / 3);
}

void pboxd_sessions_tick(struct pboxd_sessions *s, uint64_t now_ms)
{
	uint64_t limit = (uint64_t)s->cfg->worker_timeout * 1000;

	tsb_tick(s);
	if (limit == 0) {
		return;
	}
	for (uint32_t i = 0; i < s->njobs; i++) {
		struct job *j = s->jobs[i];

		if (j->st != SESS_ACTIVE || j->removed) {
			continue;
		}
		for (uint32_t r = 0; r < j->cfg->workers; r++) {
			struct pboxd_member_ref *ref = j->members[r].ref;
			json_t *ev;

			if (ref == NULL || j->members[r].cookie == 0 || ref->gone_reason[0] ||
			    now_ms - ref->last_seen_ms <= limit) {
				continue;
			}
			snprintf(ref->gone_reason, sizeof(ref->gone_reason),
				 "declared dead: no heartbeat for %u s", s->cfg->worker_timeout);
			ev = json_pack("{s:s, s:i, s:s}", "event", "removed", "errno", ETIMEDOUT,
				       "reason", ref->gone_reason);
			ref->send_event(ref, ev);
			json_decref(ev);
			ref->kick(ref); /* handled as lost when the connection is freed */
		}
	}
}

uint32_t pboxd_sessions_active(const struct pboxd_sessions *s)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < s->njobs; i++) {
		n += s->jobs[i]->st != SESS_IDLE;
	}
	return n;
}

void pboxd_sessions_abort_all(struct pboxd_sessions *s, const char *reason)
{
	for (uint32_t i = 0; i < s->njobs; i++) {
		abort_session(s, s->jobs[i], reason);
	}
}

void pboxd_sessions_destroy(struct pboxd_sessions *s)
{
	struct alloc_req *left;

	if (s == NULL) {
		return;
	}
	/* Allocations in flight or not taken: their sessions never reached the cores. */
	left = allocator_stop(&s->alloc);
	while (left != NULL) {
		struct alloc_req *r = left;

		left = r->next;
		r->job->state = r->state;
		if (r->state != NULL) {
			pbox_job_state_adopt_desc(r->state, &r->job->desc);
		} else {
			pbox_jobdesc_free(&r->job->desc);
			r->job->has_desc = false;
		}
		r->job->st = SESS_ACTIVE;
		free(r);
	}
	/* Every session first: ending one publishes a table built from all the jobs, so
	 * none may be freed before the last session has ended. */
	for (uint32_t i = 0; i < s->njobs; i++) {
		if (s->jobs[i]->st != SESS_IDLE) {
			end_session(s, s->jobs[i]);
		}
	}
	for (uint32_t i = 0; i < s->njobs; i++) {
		/* The cores may still run (pboxd_dp_stop comes later): plans go by call_rcu. */
		plan_swap(s, s->jobs[i], NULL);
		job_free(s->jobs[i]);
	}
	pboxd_ckpt_destroy(s->ckpt);
	free(s->jobs);
	free(s);
}

struct pboxd_ckpt *pboxd_sessions_ckpt(struct pboxd_sessions *s)
{
	return s->ckpt;
}

int pboxd_sessions_job_add(struct pboxd_sessions *s, struct pboxd_job_cfg *cfg, const json_t *plan,
			   char *err, size_t errlen)
{
	struct job *j;
	uint32_t pos;
	int rc;

	if (find_job(s, cfg->id) != NULL) {
		snprintf(err, errlen, "job %u exists already (remove it first)", cfg->id);
		return -EEXIST;
	}
	if (s->njobs >= PBOXD_MAX_JOBS) {
		snprintf(err, errlen, "job %u: the appliance has %u jobs, the most it holds",
			 cfg->id, PBOXD_MAX_JOBS);
		return -ENOSPC;
	}
	rc = pboxd_budget_admit(&s->budget, s->cfg, cfg, err, errlen);
	if (rc != 0) {
		char msg[400];

		snprintf(msg, sizeof(msg), "job %u: %s", cfg->id, err);
		snprintf(err, errlen, "%s", msg);
		return rc;
	}
	if (s->njobs == s->cap) {
		struct job **n = realloc(s->jobs, 2 * s->cap * sizeof(*n));

		if (n == NULL) {
			snprintf(err, errlen, "job %u: out of memory", cfg->id);
			return -ENOMEM;
		}
		s->jobs = n;
		s->cap *= 2;
	}
	j = job_new(cfg, cfg);
	if (j != NULL && plan != NULL) {
		j->plan = plan_new(plan);
		if (j->plan == NULL) {
			j->owned_cfg = NULL; /* not taken */
			job_free(j);
			j = NULL;
		}
	}
	if (j == NULL) {
		snprintf(err, errlen, "job %u: out of memory", cfg->id);
		return -ENOMEM;
	}
	for (pos = s->njobs; pos > 0 && s->jobs[pos - 1]->cfg->id > cfg->id; pos--) {
		s->jobs[pos] = s->jobs[pos - 1];
	}
	s->jobs[pos] = j;
	s->njobs++;
	s->jobs_created++;
	/* The cores see no idle job; publishing anyway makes every change of the job set one
	 * table swap, so the swap path runs as often as jobs change (and is tested so). */
	publish(s);
	PBOX_LOG_INFO(ADMIN, "job %u: created at run time (%u workers, %s, sync %s)", cfg->id,
		      cfg->workers, mode_name(cfg->mode), cfg->sync->name);
	return 0;
}

/* Tell every connected rank of j that the job is gone and close its connection; the
 * connections no longer count as members (their close is not a loss). */
static void evict_members(struct job *j, const char *reason)
{
	json_t *ev = json_pack("{s:s, s:i, s:s}", "event", "abort", "errno", ESHUTDOWN, "reason",
			       reason);
	json_t *err = pbox_ctl_error(ESHUTDOWN, "%s", reason);

	for (uint32_t r = 0; r < j->cfg->workers; r++) {
		struct pboxd_member_ref *ref = j->members[r].ref;

		if (ref == NULL) {
			continue;
		}
		if (ref->pending) {
			/* Its register waits for an answer: this is the answer. */
			ref->pending = false;
			ref->send_event(ref, err);
		} else {
			ref->send_event(ref, ev);
		}
		ref->joined = false;
		ref->left = true;
		ref->kick(ref);
		j->members[r].ref = NULL;
		j->members[r].waiting = false;
		j->members[r].probe[0] = '\0';
	}
	j->nconnected = 0;
	j->nregistered = 0;
	json_decref(ev);
	json_decref(err);
}

int pboxd_sessions_job_remove(struct pboxd_sessions *s, uint32_t id, const char *why, char *err,
			      size_t errlen)
{
	struct job *j = find_job(s, id);
	char reason[256];

	if (j == NULL) {
		snprintf(err, errlen, "job %u does not exist", id);
		return -ENOENT;
	}
	snprintf(reason, sizeof(reason), "job %u was removed from the appliance (%s)", id, why);
	for (uint32_t r = 0; r < j->cfg->workers; r++) {
		via_fail_rank(s, id, r, "the job was removed");
	}
	evict_members(j, reason);
	s->jobs_removed++;
	if (j->st == SESS_STARTING) {
		/* The allocator thread holds j: freed when its allocation comes back. */
		j->removed = true;
		PBOX_LOG_INFO(ADMIN, "%s; its chunk state is freed once allocated", reason);
		return 0;
	}
	j->removed = true;
	if (j->st != SESS_IDLE) {
		/* Unpublished first; the state goes after the cores' grace period. */
		end_session(s, j);
	} else {
		publish(s);
	}
	unlink_job(s, j);
	PBOX_LOG_INFO(ADMIN, "%s", reason);
	plan_swap(s, j, NULL);
	job_free(j);
	return 0;
}

json_t *pboxd_sessions_job_list(const struct pboxd_sessions *s)
{
	json_t *arr = pboxd_sessions_status(s);
	size_t i;
	json_t *o;

	json_array_foreach(arr, i, o)
	{
		const struct job *j =
			find_job(s, (uint32_t)json_integer_value(json_object_get(o, "id")));

		json_object_set_new(o, "window", json_integer(j->cfg->window));
		json_object_set_new(
			o, "reduce",
			json_string(j->cfg->reduce == PBOX_REDUCE_MEAN ? "mean" : "sum"));
		json_object_set_new(o, "keys_configured", json_integer(j->cfg->nkeys));
		json_object_set_new(
			o, "chunks_assigned_by",
			json_string(j->cfg->core_map != NULL ? "control plane" : "pboxd"));
		if (j->has_desc) {
			/* Where the session's chunks are: a control plane balancing its own
			 * assignments counts the bytes pboxd placed (keys known at register). */
			json_t *cb = json_array();

			for (uint32_t k = 0; k < j->desc.ncores; k++) {
				json_array_append_new(
					cb, json_integer((json_int_t)j->desc.core_bytes[k]));
			}
			json_object_set_new(o, "core_bytes", cb);
		}
		json_object_set_new(o, "memory_budget",
				    json_integer((json_int_t)j->cfg->memory_budget));
		if (j->plan != NULL) {
			json_object_set(o, "plan", j->plan->json);
			json_object_set_new(o, "plan_revision", json_integer(j->plan->revision));
		}
		json_object_set_new(o, "agents", agents_of(j));
		if (s->cfg->probe.enabled) { /* the appliance's own responder, for the workers */
			char a[96];

			snprintf(a, sizeof(a), "%s:%u",
				 s->cfg->probe.address[0] ? s->cfg->probe.address
							  : s->cfg->data_addr,
				 (unsigned)s->cfg->probe.port);
			json_object_set_new(o, "probe", json_string(a));
		}
	}
	return arr;
}

int pboxd_sessions_job_plan(struct pboxd_sessions *s, uint32_t id, const json_t *plan,
			    int64_t *held, char *err, size_t errlen)
{
	struct job *j = find_job(s, id);
	struct pboxd_job_plan *np;
	int64_t rev = pbox_jobspec_plan_revision(plan);

	if (j == NULL) {
		snprintf(err, errlen, "job %u does not exist", id);
		return -ENOENT;
	}
	if (j->plan != NULL && rev <= j->plan->revision) {
		*held = j->plan->revision;
		snprintf(err, errlen,
			 "job %u: plan revision %lld is not newer than the held revision %lld: "
			 "not applied",
			 id, (long long)rev, (long long)j->plan->revision);
		return 1;
	}
	np = plan_new(plan);
	if (np == NULL) {
		snprintf(err, errlen, "job %u: out of memory for its plan", id);
		return -ENOMEM;
	}
	plan_swap(s, j, np);
	s->plans_swapped++;
	if (j->cfg->dvf.enabled && is_published(j)) {
		publish(s); /* the cores filter broadcasts by the new plan (fill_job) */
	}
	*held = rev;
	PBOX_LOG_INFO(ADMIN, "job %u: plan revision %lld swapped in", id, (long long)rev);
	push_plan(j);
	return 0;
}

struct pboxd_job_plan *const *pboxd_sessions_plan_slot(struct pboxd_sessions *s, uint32_t id)
{
	struct job *j = find_job(s, id);

	return j != NULL ? &j->plan : NULL;
}

void pboxd_sessions_job_counts(const struct pboxd_sessions *s, uint64_t *created, uint64_t *removed)
{
	*created = s->jobs_created;
	*removed = s->jobs_removed;
}

int pboxd_sessions_job_view(const struct pboxd_sessions *s, uint32_t id, struct pboxd_job_view *v)
{
	static const char *const names[] = { "idle", "active", "aborted", "starting" };
	const struct job *j = find_job(s, id);

	if (j == NULL) {
		return -ENOENT;
	}
	memset(v, 0, sizeof(*v));
	v->id = id;
	v->state_name = names[j->st];
	v->abort_reason = j->st == SESS_ABORTED ? j->abort_reason : "";
	v->workers = j->cfg->workers;
	v->window = j->cfg->window;
	v->live = j->st == SESS_IDLE ? NULL : j->live;
	v->nlive = j->st == SESS_IDLE ? 0 : j->nlive;
	v->state = j->state;
	v->desc = j->has_desc && j->state != NULL ? &j->desc : NULL;
	v->sessions = j->sessions;
	return 0;
}

int pboxd_sessions_member_view(const struct pboxd_sessions *s, uint32_t id, uint32_t rank,
			       struct pboxd_member_view *m)
{
	const struct job *j = find_job(s, id);
	const struct member *mb;

	if (j == NULL || rank >= j->cfg->workers) {
		return -ENOENT;
	}
	mb = &j->members[rank];
	memset(m, 0, sizeof(*m));
	m->connected = mb->ref != NULL;
	m->registered = mb->cookie != 0;
	if (mb->ref != NULL) {
		m->peer = mb->ref->peer;
		m->last_seen_ms = mb->ref->last_seen_ms;
	}
	return 0;
}

int pboxd_sessions_probe_via(struct pboxd_sessions *s, const json_t *req,
			     struct pboxd_member_ref *owner, char *err, size_t errlen)
{
	const json_t *via = json_object_get(req, "via"), *rq = json_object_get(req, "request");
	json_int_t jid = json_integer_value(json_object_get(via, "job")),
		   rank = json_integer_value(json_object_get(via, "rank"));
	uint64_t now = pboxd_now_ms(), budget;
	struct via_probe *slot = NULL;
	const struct member *m;
	struct job *j;
	json_t *ev;

	if (!json_is_object(via) || json_object_size(via) != 2 ||
	    !json_is_integer(json_object_get(via, "job")) ||
	    !json_is_integer(json_object_get(via, "rank")) || !json_is_object(rq)) {
		snprintf(err, errlen,
			 "probe: \"via\" must be {\"job\": J, \"rank\": R} with a "
			 "\"request\" object");
		return -EINVAL;
	}
	j = jid >= 0 && jid <= UINT32_MAX ? find_job(s, (uint32_t)jid) : NULL;
	if (j == NULL || rank < 0 || rank >= j->cfg->workers) {
		snprintf(err, errlen, "probe via job %lld rank %lld: no such job or rank",
			 (long long)jid, (long long)rank);
		return -ENOENT;
	}
	m = &j->members[rank];
	if (m->ref == NULL || m->cookie == 0 || m->probe[0] == '\0') {
		snprintf(
			err, errlen,
			"probe via job %u rank %lld: the rank is not registered with a probe agent",
			j->cfg->id, (long long)rank);
		return -ENOENT;
	}
	for (uint32_t v = 0; v < PBOXD_VIA_MAX; v++) {
		if (s->via[v].id != 0 && s->via[v].deadline_ms <= now) {
			via_answer(&s->via[v],
				   pbox_ctl_error(ETIMEDOUT,
						  "probe via job %u rank %u: no answer in time",
						  s->via[v].job, s->via[v].rank));
		}
		if (s->via[v].id == 0 && slot == NULL) {
			slot = &s->via[v];
		}
	}
	if (slot == NULL) {
		snprintf(err, errlen, "probe via job %u rank %lld: %u probes wait already",
			 j->cfg->id, (long long)rank, PBOXD_VIA_MAX);
		return -EBUSY;
	}
	/* The worker decodes the request against its own limits; its budget bounds the wait
	 * (plus the report timeouts and slack). */
	budget = (uint64_t)json_integer_value(json_object_get(rq, "budget_ms"));
	slot->id = ++s->via_next_id;
	slot->job = j->cfg->id;
	slot->rank = (uint32_t)rank;
	slot->owner = owner;
	slot->deadline_ms = now + (budget < 60000 ? budget : 60000) + 5000;
	ev = json_pack("{s:s, s:I, s:O}", "event", "probe", "id", (json_int_t)slot->id, "request",
		       rq);
	if (ev == NULL) {
		slot->id = 0;
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	m->ref->send_event(m->ref, ev);
	json_decref(ev);
	PBOX_LOG_INFO(ADMIN, "job %u: rank %lld asked to probe %s (probe %llu)", j->cfg->id,
		      (long long)rank, json_string_value(json_object_get(rq, "peer")) ?: "?",
		      (unsigned long long)slot->id);
	return 0;
}

json_t *pboxd_sessions_probe_result(struct pboxd_sessions *s, struct pboxd_member_ref *ref,
				    const json_t *req)
{
	const json_t *result;
	const char *error;
	uint64_t id;
	int e;
	char err[256];

	if (!ref->joined) {
		return pbox_ctl_error(EPROTO, "probe_result: say hello first");
	}
	if (pbox_ctl_probe_result_decode(req, &id, &result, &e, &error, err, sizeof(err)) != 0) {
		return pbox_ctl_error(EINVAL, "%s", err);
	}
	for (uint32_t v = 0; v < PBOXD_VIA_MAX; v++) {
		struct via_probe *vp = &s->via[v];

		if (vp->id != id || vp->job != ref->job || vp->rank != ref->rank) {
			continue;
		}
		if (result != NULL) {
			/* pbox-ctrld validates the result (probe_msg.h) as it does pboxd's own. */
			via_answer(vp, json_pack("{s:b, s:O}", "ok", 1, "result", result));
		} else {
			via_answer(vp, pbox_ctl_error(e, "job %u rank %u: %s", ref->job, ref->rank,
						      error));
		}
		return NULL;
	}
	/* Late (timed out, or its asker left): dropped. */
	return NULL;
}
