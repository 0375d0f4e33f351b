/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Job sessions: admission of workers (token, rank), the key set of a session, session
 * cookies, and the data-plane job table built from them.
 *
 * A configured job is idle until a rank says hello with the right token. The first rank
 * to register keys starts a session: the key set is fixed (or checked against the
 * configured one), chunk state is allocated for every core by the allocator thread (so a
 * large job's MAP_POPULATE never stalls the control thread: the register answer is sent
 * when it completes, see pboxd_sessions_poll), and every rank that registers gets a random
 * session cookie that its datagrams must carry.
 *
 * Membership: every rank counts as live from the start of a session. A rank that leaves
 * cleanly is removed from the counts (iterations stop waiting for it). A rank lost without
 * a goodbye (connection closed, or no heartbeat for worker_timeout seconds) either aborts
 * the session (on_worker_loss = "abort", the default for BSP: the other ranks are told at
 * once over their control connections and their datagrams are refused) or is removed from
 * the counts like a leaver ("continue"). Removed ranks cannot rejoin the running session.
 * When the last rank is gone the session ends, its state is freed after an RCU grace
 * period, and the job is idle again.
 *
 * Every change publishes a new immutable job table to the cores (pboxd_dp_publish).
 *
 * Threading: control thread only, except the allocator thread, which only maps chunk
 * state and hands it back through pboxd_sessions_fd.
 */
#ifndef PBOXD_SESSIONS_H
#define PBOXD_SESSIONS_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include <urcu-qsbr.h>

#include "common/ctlproto.h"
#include "config.h"
#include "dataplane.h"

struct pboxd_sessions;

/* Milliseconds on CLOCK_MONOTONIC (the clock of last_seen_ms and pboxd_sessions_tick). */
static inline uint64_t pboxd_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* What the sessions module keeps about a control connection. */
struct pboxd_member_ref {
	uint32_t job; /* job id, valid when joined */
	uint32_t rank;
	bool joined; /* said hello and was admitted */
	bool left;   /* said leave: closing is not a failure */
	char peer[64];
	uint64_t last_seen_ms; /* last byte read from the connection (heartbeats included) */
	bool pending;          /* a register waits for its session's chunk state */
	/* Send an unsolicited event object to this connection (does not steal obj). */
	void (*send_event)(struct pboxd_member_ref *ref, json_t *obj);
	/* Close the connection (after the current event loop pass). */
	void (*kick)(struct pboxd_member_ref *ref);
	char gone_reason[160]; /* set when the appliance removes the member */
};

struct pboxd_sessions *pboxd_sessions_create(const struct pboxd_config *cfg, struct pboxd_dp *dp);
void pboxd_sessions_destroy(struct pboxd_sessions *s);

/* Request handlers: each returns the response object (new reference). Refusals of hello
 * are not logged here: the control channel logs, counts and rate-limits them (errno
 * EACCES: wrong token; ENOENT: no such job). */
json_t *pboxd_sessions_hello(struct pboxd_sessions *s, struct pboxd_member_ref *ref,
			     const json_t *req);
/* NULL when the answer comes later: the session is starting (its chunk state is being
 * allocated); ref->pending is then set, and the answer is sent with ref->send_event (after
 * clearing ref->pending) from pboxd_sessions_poll. */
json_t *pboxd_sessions_register(struct pboxd_sessions *s, struct pboxd_member_ref *ref,
				const json_t *req);
/* Readable (an eventfd) when an allocation finished: then call pboxd_sessions_poll. */
int pboxd_sessions_fd(const struct pboxd_sessions *s);
/* Finish the sessions whose chunk state is ready (or failed): answer their waiting ranks. */
void pboxd_sessions_poll(struct pboxd_sessions *s);
json_t *pboxd_sessions_leave(struct pboxd_sessions *s, struct pboxd_member_ref *ref);
/* The interval at which members send heartbeats ({"op":"ping"}, stamped into
 * last_seen_ms by the control channel) and at which pboxd_sessions_tick should run: a
 * third of the worker timeout, at most 1 s; 0 when heartbeats are off. */
uint32_t pboxd_sessions_heartbeat_ms(const struct pboxd_sessions *s);
/* Every heartbeat interval: members of running sessions silent for longer than the worker
 * timeout are declared dead (told, disconnected, and handled as lost). */
void pboxd_sessions_tick(struct pboxd_sessions *s, uint64_t now_ms);

/* The connection is gone (after leave: clean; otherwise the session aborts). */
void pboxd_sessions_disconnect(struct pboxd_sessions *s, struct pboxd_member_ref *ref);

/* Jobs and their sessions, for the stats request: a JSON array. */
json_t *pboxd_sessions_status(const struct pboxd_sessions *s);

/* Number of jobs with a session (draining waits for 0). */
uint32_t pboxd_sessions_active(const struct pboxd_sessions *s);

/* Abort every session with reason (shutdown); members are told. */
void pboxd_sessions_abort_all(struct pboxd_sessions *s, const char *reason);

/* Called on the control thread after every job table the sessions publish (the table is
 * the cores' current one until the next publish), e.g. to keep pboxd's XDP filter in step
 * (pboxd_xdp_sync). Set before any admission; NULL fn: none. */
typedef void (*pboxd_publish_hook_fn)(void *arg, const struct pbox_jobtab *tab);
void pboxd_sessions_set_publish_hook(struct pboxd_sessions *s, pboxd_publish_hook_fn fn, void *arg);
/* Most jobs an appliance holds (configured and created at run time). */
#define PBOXD_MAX_JOBS 4096u

/*
 * Run-time jobs (the narrow ingress of the control plane: `pbox job`, pbox-ctrld).
 *
 * pboxd_sessions_job_add: add job cfg (with plan, the control plane's tree/thresholds
 * object of common/jobspec.h, copied; NULL: none), validated already (pboxd_config_load_job or
 * pboxd_job_cfg_from_json, as for config-file jobs) and taken on success (freed with the
 * job; on error it stays the caller's). Refused with -EEXIST (the id exists), -ENOSPC
 * (PBOXD_MAX_JOBS jobs, or a state that can never fit the memory budgets: the same rule as
 * `pboxd --check-config`), the geometry's -EINVAL / -E2BIG for a configured key set, or
 * -ENOMEM; err names the job and the cause. A new job table is published.
 *
 * pboxd_sessions_job_remove: remove job id (config-file or run-time). Its connected ranks
 * are told ({"event":"abort","errno":ESHUTDOWN,"reason":"job N was removed ... (why)"}, or
 * that answer to a pending register) and disconnected; a running session is unpublished
 * and its chunk state freed after the cores' RCU grace period (never on this thread's
 * behalf of a core still reading it); a session still being allocated is freed when the
 * allocation returns. -ENOENT (no such job) with err.
 */
int pboxd_sessions_job_add(struct pboxd_sessions *s, struct pboxd_job_cfg *cfg, const json_t *plan,
			   char *err, size_t errlen);
int pboxd_sessions_job_remove(struct pboxd_sessions *s, uint32_t id, const char *why, char *err,
			      size_t errlen);

/*
 * A job's plan as readers see it (the control plane's tree and DVF thresholds; the data
 * path's TSB, issue 12, is to read it). Published by the control thread with RCU
 * (liburcu-qsbr, like the job table: rcu_xchg_pointer, old one freed by call_rcu after a
 * grace period, never a blocking synchronize_rcu); immutable once published. A reader (a
 * registered data-plane core) does rcu_read_lock(); p = rcu_dereference(*slot); ... uses
 * p->json / p->revision read-only ...; rcu_read_unlock(); slot comes from
 * pboxd_sessions_plan_slot and stays valid while the job exists.
 */
struct pboxd_job_plan {
	json_t *json;     /* {"tree":..., "thresholds":...}; read-only */
	int64_t revision; /* pbox_jobspec_plan_revision of json */
	struct rcu_head rcu;
};

/*
 * pboxd_sessions_job_plan: replace job id's plan with a copy of plan (validated already:
 * pbox_jobmsg_decode). Returns 0 (swapped in; *held = its revision), 1 (not newer than
 * the held plan: nothing changed, *held = the held revision, err says so), -ENOENT (no
 * such job) or -ENOMEM, with err naming the job. Control thread only.
 *
 * pboxd_sessions_plan_slot: where job id's plan pointer lives (NULL: no such job).
 */
int pboxd_sessions_job_plan(struct pboxd_sessions *s, uint32_t id, const json_t *plan,
			    int64_t *held, char *err, size_t errlen);
struct pboxd_job_plan *const *pboxd_sessions_plan_slot(struct pboxd_sessions *s, uint32_t id);

/*
 * Probes by workers (issue 11; libpbox/probe.h): pbox-ctrld's admin request {"op":"probe",
 * "via":{"job":J,"rank":R},"request":{...}} is forwarded to rank R of job J as
 * {"event":"probe","id":N,"request":{...}} (the rank checks the request against its own
 * limits). pboxd_sessions_probe_via returns 0 when it was forwarded: the answer
 * ({"ok":true,"result":{...}} or the rank's refusal) goes to owner->send_event when the
 * rank's probe_result arrives, or ETIMEDOUT / ECONNRESET when it does not in time or the
 * rank leaves; nothing when the owner has disconnected first. Errors (nothing sent):
 * -EINVAL (malformed), -ENOENT (no such job or rank, or no probe agent registered), -EBUSY
 * (PBOXD_VIA_MAX wait already), -ENOMEM, with err. pboxd_sessions_probe_result handles a
 * rank's {"op":"probe_result"}: NULL (no reply), or an error object when malformed.
 * Control thread only.
 */
int pboxd_sessions_probe_via(struct pboxd_sessions *s, const json_t *req,
			     struct pboxd_member_ref *owner, char *err, size_t errlen);
json_t *pboxd_sessions_probe_result(struct pboxd_sessions *s, struct pboxd_member_ref *ref,
				    const json_t *req);

/* Every job with its definition's main settings and its session (and its plan with
 * "plan_revision" when it holds one, and "agents": [{"rank","probe"}], the registered
 * ranks' probe responders): a JSON array. */
json_t *pboxd_sessions_job_list(const struct pboxd_sessions *s);
/* Jobs created and removed at run time so far. */
void pboxd_sessions_job_counts(const struct pboxd_sessions *s, uint64_t *created,
			       uint64_t *removed);

/* The checkpointer (NULL: checkpoints off), for the shutdown hook. */
struct pboxd_ckpt *pboxd_sessions_ckpt(struct pboxd_sessions *s);

#endif /* PBOXD_SESSIONS_H */
