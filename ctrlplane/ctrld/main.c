/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-ctrld: jobs, admission and publication to the managed pboxds (see ctrld.h).
 *
 * The control API (newline JSON, common/ctlproto.h) speaks the job messages of
 * common/jobspec.h, so `pbox job create|list|rm` works against pbox-ctrld as against a
 * pboxd. Every request needs the admin token (proved once per connection with
 * {"op":"auth"} or given in the request) unless it comes over the Unix control socket.
 *
 * Client limits (a subset of pboxd's control channel): at most max_connections, and
 * max_per_address from one address; wrong admin tokens limited per address
 * (common/ctladdr.h, pboxd's bucket); a request
 * line of at most 4 KiB before authentication (32 MiB after); unauthenticated connections
 * closed after 10 s; at most 8 malformed or refused requests per connection; answers
 * queued up to 16 MiB per connection (a client that does not read is closed). Requests to
 * a pboxd are made from the one loop and block it for at most request_timeout each, except
 * probes: the bandwidth matrix (bw.h, ops bw_list and bw_probe) asks for them from its own
 * thread.
 *
 * Threading: the main loop; the bandwidth matrix's thread (bw.h).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/ctladdr.h"
#include "common/ctlclient.h"
#include "common/ctlproto.h"
#include "common/jobspec.h"
#include "common/log.h"
#include "bw.h"
#include "ctrld.h"

#ifdef PBOX_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#else
/* Built without libsystemd: no readiness notification (Type=notify units need it). */
static inline int sd_notify(int unset_env, const char *state)
{
	(void)unset_env;
	(void)state;
	return 0;
}

static inline int sd_notifyf(int unset_env, const char *format, ...)
{
	(void)unset_env;
	(void)format;
	return 0;
}
#endif

#ifndef PBOX_VERSION_STRING
#define PBOX_VERSION_STRING "0.0.0"
#endif

#define UNAUTH_LINE_BYTES 4096u
#define AUTHED_LINE_BYTES (32u << 20)
#define UNAUTH_TIMEOUT_MS 10000u
#define MAX_OUT_BYTES     (16u << 20)
#define MAX_BAD           8u
#define MAX_JOBS          4096u

struct cjob {
	uint32_t id;
	json_t *desc;
	json_t *plan;      /* tree / thresholds (common/jobspec.h), passed on; NULL: none */
	bool plan_given;   /* the client's plan: kept as given, not computed (plan.h) */
	int64_t plan_sent; /* plan revision its pboxd acknowledged (-1: none yet) */
	json_t *placement; /* host name per rank (plan.h) or NULL */
	json_t *agents;    /* its pboxd's job_list entry (probe agents; bw.h) or NULL */
	bool from_config;
	int where; /* index of the pboxd holding it; -1: not placed */
	char note[512];
};

struct pending_rm {
	uint32_t id;
	int where;
};

struct conn {
	int fd;
	struct pbox_ctladdr *addr; /* NULL: the Unix socket */
	bool local, admin, dead;
	unsigned bad;
	uint64_t accepted_ms;
	struct pbox_linebuf in;
	char *out;
	size_t out_len, out_off;
};

struct ctrld {
	struct ctrld_config cfg;
	int lfd, ufd;
	uint16_t port;
	struct conn **conns;
	uint32_t nconns;
	struct cjob *jobs;
	uint32_t njobs;
	struct pending_rm *rms;
	uint32_t nrms;
	uint64_t next_reconcile_ms;
	struct pbox_ratelog log_client;  /* refusals and closes caused by clients */
	struct pbox_ctladdr_table addrs; /* connections and failed tokens per address */
	struct ctrld_bw *bw;             /* the bandwidth matrix (NULL: no pairs) */
	int64_t bw_sig;                  /* probes counted in it when plans were computed */
	struct {
		uint64_t created, removed, create_refused, rm_refused, admin_refused,
			wrong_admin_token, republished, publish_failures, auth_rate_limited,
			plans_sent, plan_failures;
	} n;
};

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
	(void)sig;
	g_stop = 1;
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* A warning caused by a client: rate-limited so that clients cannot flood the log. */
#define CLIENT_WARN(d, fmt, ...)                                                   \
	do {                                                                       \
		uint64_t sup_;                                                     \
		if (pbox_ratelog_ok(&(d)->log_client, now_ms(), &sup_)) {          \
			PBOX_LOG_WARN(ADMIN, fmt "%s", __VA_ARGS__,                \
				      sup_ ? " (similar messages left out)" : ""); \
		}                                                                  \
	} while (0)

static struct cjob *find_job(struct ctrld *d, uint32_t id)
{
	for (uint32_t i = 0; i < d->njobs; i++) {
		if (d->jobs[i].id == id) {
			return &d->jobs[i];
		}
	}
	return NULL;
}

/* One request to pboxd p: 0 with *reply, or -errno (unreachable: p is marked down). */
static int pboxd_request(struct ctrld *d, struct ctrld_pboxd *p, const json_t *req, json_t **reply)
{
	char err[320];
	int rc = pbox_ctl_request(p->control, p->admin_token, req, reply,
				  (int)d->cfg.request_timeout_ms, err, sizeof(err));

	if (rc != 0) {
		if (p->up || strcmp(p->last_error, err) != 0) {
			PBOX_LOG_WARN(ADMIN, "pboxd %s: %s", p->name, err);
		}
		p->up = false;
		snprintf(p->last_error, sizeof(p->last_error), "%s", err);
		return rc;
	}
	if (!p->up) {
		PBOX_LOG_INFO(ADMIN, "pboxd %s (%s) is reachable", p->name, p->control);
	}
	p->up = true;
	p->last_error[0] = '\0';
	return 0;
}

/* Sum of the matrix's probe counts: changes when any pair has a new result. */
static int64_t bw_signature(const json_t *bw)
{
	int64_t sig = 0;
	size_t i;
	const json_t *p;

	json_array_foreach(json_object_get(bw, "pairs"), i, p)
	{
		sig += json_integer_value(json_object_get(p, "probes")) +
		       json_integer_value(json_object_get(p, "failures"));
	}
	return sig;
}

/* (Re)compute job j's plan for pboxd w (plan.h); a client-given plan is left alone. On
 * failure the previous plan stays and the cause is logged and noted. */
static void compute_plan(struct ctrld *d, struct cjob *j, uint32_t w, const json_t *bw)
{
	json_t *np = NULL, *own = NULL;
	char err[512];
	int rc;

	if (j->plan_given) {
		return;
	}
	if (bw == NULL) {
		bw = own = ctrld_bw_list(d->bw);
	}
	rc = ctrld_plan_compute(&d->cfg.plan, d->cfg.pboxds[w].name,
				(uint32_t)json_integer_value(json_object_get(j->desc, "workers")),
				j->placement, bw, j->agents, j->plan, &np, err, sizeof(err));
	json_decref(own);
	if (rc != 0) {
		snprintf(j->note, sizeof(j->note), "plan: %s", err);
		PBOX_LOG_WARN(ADMIN, "job %u: no plan: %s", j->id, err);
		return;
	}
	if (np != j->plan) {
		json_t *t = json_object_get(np, "tree");

		PBOX_LOG_INFO(
			ADMIN, "job %u: plan revision %lld (tree %s, objective %.3f; broadcast %s)",
			j->id, (long long)json_integer_value(json_object_get(t, "revision")),
			json_string_value(json_object_get(t, "method")) ?: "?",
			json_number_value(json_object_get(t, "objective")),
			json_string_value(json_object_get(
				json_object_get(json_object_get(np, "thresholds"), "broadcast"),
				"select"))
				?: "?");
	}
	json_decref(j->plan);
	j->plan = np;
}

/* Publish job j to pboxd w. 0, or -errno with why (the pboxd's refusal or the failure). */
static int publish_to(struct ctrld *d, struct cjob *j, uint32_t w, char *why, size_t len)
{
	struct ctrld_pboxd *p = &d->cfg.pboxds[w];
	json_t *req, *reply = NULL;
	int rc;

	compute_plan(d, j, w, NULL);
	req = pbox_jobmsg_create_plan(j->desc, j->plan, NULL);

	if (req == NULL) {
		snprintf(why, len, "out of memory");
		return -ENOMEM;
	}
	rc = pboxd_request(d, p, req, &reply);
	json_decref(req);
	if (rc != 0) {
		snprintf(why, len, "pboxd %s: unreachable (%s)", p->name, p->last_error);
		return rc;
	}
	if (!json_is_true(json_object_get(reply, "ok"))) {
		rc = -(int)json_integer_value(json_object_get(reply, "errno"));
		snprintf(why, len, "pboxd %s: %s", p->name,
			 json_string_value(json_object_get(reply, "error")) ?: "refused");
		json_decref(reply);
		return rc ? rc : -EIO;
	}
	json_decref(reply);
	j->plan_sent = j->plan != NULL ? pbox_jobspec_plan_revision(j->plan) : -1;
	return 0;
}

/* Send job j's current plan to its pboxd (job_plan) when the pboxd has not acknowledged
 * this revision yet; a failure is noted and retried on the next reconcile. */
static void send_plan(struct ctrld *d, struct cjob *j)
{
	struct ctrld_pboxd *p;
	json_t *req, *reply = NULL;
	int64_t rev;
	int rc;

	if (j->where < 0 || j->plan == NULL) {
		return;
	}
	rev = pbox_jobspec_plan_revision(j->plan);
	if (rev <= j->plan_sent) {
		return;
	}
	p = &d->cfg.pboxds[j->where];
	req = pbox_jobmsg_plan(j->id, j->plan, NULL);
	if (req == NULL) {
		return;
	}
	rc = pboxd_request(d, p, req, &reply);
	json_decref(req);
	if (rc != 0 || !json_is_true(json_object_get(reply, "ok"))) {
		d->n.plan_failures++;
		snprintf(j->note, sizeof(j->note), "plan revision %lld not sent to pboxd %s: %s",
			 (long long)rev, p->name,
			 rc != 0 ? p->last_error
				 : json_string_value(json_object_get(reply, "error")) ?: "refused");
		PBOX_LOG_WARN(ADMIN, "job %u: %s (retried)", j->id, j->note);
		json_decref(reply);
		return;
	}
	/* Applied, or the pboxd holds this revision or a newer one already. */
	j->plan_sent = rev;
	d->n.plans_sent++;
	if (!json_is_true(json_object_get(reply, "applied"))) {
		PBOX_LOG_INFO(ADMIN, "job %u: pboxd %s: %s", j->id, p->name,
			      json_string_value(json_object_get(reply, "reason")) ?: "not applied");
	} else {
		PBOX_LOG_INFO(ADMIN, "job %u: plan revision %lld sent to pboxd %s", j->id,
			      (long long)rev, p->name);
	}
	json_decref(reply);
}

/* Admission: offer j to the pboxds, fewest jobs first, until one holds it. 0, or -errno
 * with every pboxd's reason in why (-EINVAL at once: the definition is bad anywhere). */
static int place(struct ctrld *d, struct cjob *j, char *why, size_t len)
{
	bool tried[CTRLD_MAX_PBOXDS] = { false };
	size_t off = 0;
	int last = -EHOSTUNREACH;
	bool any_reachable = false;

	why[0] = '\0';
	for (uint32_t round = 0; round < d->cfg.npboxds; round++) {
		char one[400];
		int best = -1, rc;

		for (uint32_t w = 0; w < d->cfg.npboxds; w++) {
			if (!tried[w] &&
			    (best < 0 || d->cfg.pboxds[w].njobs < d->cfg.pboxds[best].njobs)) {
				best = (int)w;
			}
		}
		tried[best] = true;
		rc = publish_to(d, j, (uint32_t)best, one, sizeof(one));
		if (rc == 0) {
			j->where = best;
			d->cfg.pboxds[best].njobs++;
			j->note[0] = '\0';
			PBOX_LOG_INFO(ADMIN, "job %u: published to pboxd %s (%s)", j->id,
				      d->cfg.pboxds[best].name, d->cfg.pboxds[best].control);
			return 0;
		}
		if (rc == -EINVAL) {
			snprintf(why, len, "%s", one);
			return rc;
		}
		if (rc != -ECONNREFUSED && rc != -ETIMEDOUT && rc != -ECONNRESET && rc != -ENOENT &&
		    rc != -EHOSTUNREACH) {
			any_reachable = true;
			last = rc;
		}
		off += (size_t)snprintf(why + off, off < len ? len - off : 0, "%s%s",
					off ? "; " : "", one);
		if (off >= len) {
			off = len;
		}
	}
	return any_reachable ? (last == -EEXIST ? -EEXIST : -ENOSPC) : -EHOSTUNREACH;
}

static int add_job(struct ctrld *d, json_t *desc, const json_t *plan, const json_t *placement,
		   bool from_config, char *why, size_t len)
{
	struct cjob *j;
	uint32_t id;
	int rc;

	if (pbox_jobspec_id(desc, &id) != 0 || ctrld_job_validate(desc, why, len) != 0) {
		if (why[0] == '\0') {
			snprintf(why, len, "job description: job.id: missing or out of range");
		}
		return -EINVAL;
	}
	if (ctrld_plan_check_placement(
		    &d->cfg.plan, placement,
		    (uint32_t)json_integer_value(json_object_get(desc, "workers")), why,
		    len) != 0) {
		return -EINVAL;
	}
	if (find_job(d, id) != NULL) {
		snprintf(why, len, "job %u exists already (remove it first)", id);
		return -EEXIST;
	}
	if (d->njobs >= MAX_JOBS) {
		snprintf(why, len, "job %u: pbox-ctrld holds %u jobs, the most it manages", id,
			 MAX_JOBS);
		return -ENOSPC;
	}
	j = &d->jobs[d->njobs];
	memset(j, 0, sizeof(*j));
	j->id = id;
	j->desc = json_incref(desc);
	j->plan = plan != NULL ? json_deep_copy(plan) : NULL;
	j->plan_given = plan != NULL;
	j->plan_sent = -1;
	j->placement = placement != NULL ? json_deep_copy(placement) : NULL;
	j->from_config = from_config;
	j->where = -1;
	rc = place(d, j, why, len);
	if (rc == 0) {
		d->njobs++;
		return 0;
	}
	if (from_config && rc != -EINVAL) {
		/* A static job waits for a pboxd that can hold it (reconcile retries). */
		snprintf(j->note, sizeof(j->note), "%s", why);
		PBOX_LOG_WARN(ADMIN, "job %u: not placed yet: %s", id, why);
		d->njobs++;
		return 0;
	}
	json_decref(j->desc);
	json_decref(j->plan);
	json_decref(j->placement);
	return rc;
}

static int remove_job(struct ctrld *d, uint32_t id, char *why, size_t len)
{
	struct cjob *j = find_job(d, id);

	if (j == NULL) {
		snprintf(why, len, "job %u does not exist", id);
		return -ENOENT;
	}
	if (j->where >= 0) {
		struct ctrld_pboxd *p = &d->cfg.pboxds[j->where];
		json_t *req = pbox_jobmsg_rm(id, NULL), *reply = NULL;

		if (req != NULL && pboxd_request(d, p, req, &reply) == 0) {
			PBOX_LOG_INFO(ADMIN, "job %u: removed from pboxd %s%s", id, p->name,
				      json_is_true(json_object_get(reply, "ok"))
					      ? ""
					      : " (it did not hold it any more)");
		} else if (d->nrms < MAX_JOBS) {
			/* Retried by the reconcile loop once the pboxd answers. */
			d->rms[d->nrms++] = (struct pending_rm){ .id = id, .where = j->where };
			PBOX_LOG_WARN(ADMIN, "job %u: pboxd %s unreachable; its removal is retried",
				      id, p->name);
		}
		json_decref(req);
		json_decref(reply);
		p->njobs--;
	}
	json_decref(j->desc);
	json_decref(j->plan);
	json_decref(j->placement);
	json_decref(j->agents);
	*j = d->jobs[--d->njobs];
	return 0;
}

/* The probe agents of job j on pboxd w (its job_list entry o): the matrix's pairs for
 * the job (bw.h), and a new plan when they changed. */
static void job_agents(struct ctrld *d, struct cjob *j, uint32_t w, json_t *o)
{
	if (j->agents == NULL ||
	    !json_equal(json_object_get(j->agents, "agents"), json_object_get(o, "agents")) ||
	    !json_equal(json_object_get(j->agents, "probe"), json_object_get(o, "probe"))) {
		json_decref(j->agents);
		j->agents = json_incref(o);
		compute_plan(d, j, w, NULL);
	} else {
		json_decref(j->agents);
		j->agents = json_incref(o); /* its progress (version_max) for the matrix */
	}
	ctrld_bw_job(d->bw, w, j->id, j->agents, j->plan);
}

/* Every pboxd: what should be there and is not is published again (a restarted pboxd),
 * removals that could not be sent are retried, jobs not placed are offered again. */
static void reconcile(struct ctrld *d)
{
	char why[1024];

	ctrld_bw_jobs_begin(d->bw);
	for (uint32_t w = 0; w < d->cfg.npboxds; w++) {
		struct ctrld_pboxd *p = &d->cfg.pboxds[w];
		json_t *req = pbox_jobmsg_list(NULL), *reply = NULL, *there, *o;
		size_t k;

		if (req == NULL || pboxd_request(d, p, req, &reply) != 0) {
			json_decref(req);
			continue;
		}
		json_decref(req);
		there = json_object_get(reply, "jobs");
		for (uint32_t r = 0; r < d->nrms;) {
			json_t *rm, *rr = NULL;

			if (d->rms[r].where != (int)w) {
				r++;
				continue;
			}
			rm = pbox_jobmsg_rm(d->rms[r].id, NULL);
			if (rm != NULL && pboxd_request(d, p, rm, &rr) == 0) {
				PBOX_LOG_INFO(ADMIN, "job %u: removal delivered to pboxd %s",
					      d->rms[r].id, p->name);
				d->rms[r] = d->rms[--d->nrms];
			} else {
				r++;
			}
			json_decref(rm);
			json_decref(rr);
		}
		for (uint32_t i = 0; i < d->njobs; i++) {
			struct cjob *j = &d->jobs[i];
			bool found = false;

			if (j->where != (int)w) {
				continue;
			}
			json_array_foreach(there, k, o)
			{
				if (!found && json_integer_value(json_object_get(o, "id")) ==
						      (json_int_t)j->id) {
					found = true;
					job_agents(d, j, w, o);
				}
			}
			if (found) {
				continue;
			}
			if (publish_to(d, j, w, why, sizeof(why)) == 0) {
				d->n.republished++;
				PBOX_LOG_INFO(
					ADMIN,
					"job %u: published again to pboxd %s (it did not hold "
					"it: restarted?)",
					j->id, p->name);
			} else {
				d->n.publish_failures++;
				snprintf(j->note, sizeof(j->note), "%s", why);
				PBOX_LOG_WARN(ADMIN, "job %u: publishing again failed: %s", j->id,
					      why);
			}
		}
		json_decref(reply);
	}
	ctrld_bw_jobs_end(d->bw);
	for (uint32_t i = 0; i < d->njobs; i++) {
		if (d->jobs[i].where < 0 && place(d, &d->jobs[i], why, sizeof(why)) != 0) {
			snprintf(d->jobs[i].note, sizeof(d->jobs[i].note), "%s", why);
		}
	}
	/* New probe results: recompute the plans (plan.h keeps trees and link states unless
	 * the change is material). The pboxd got the plan with the job; pbox-ctrld's
	 * job_list reports the current one. */
	if (d->bw != NULL) {
		json_t *bw = ctrld_bw_list(d->bw);
		int64_t sig = bw_signature(bw);

		if (sig != d->bw_sig) {
			d->bw_sig = sig;
			for (uint32_t i = 0; i < d->njobs; i++) {
				if (d->jobs[i].where >= 0) {
					compute_plan(d, &d->jobs[i], (uint32_t)d->jobs[i].where,
						     bw);
				}
			}
		}
		json_decref(bw);
	}
	/* The pboxds get every new plan (job_plan, swapped in with RCU there); a failed send
	 * is retried here on the next reconcile. */
	for (uint32_t i = 0; i < d->njobs; i++) {
		send_plan(d, &d->jobs[i]);
	}
}

static json_t *job_list(struct ctrld *d)
{
	json_t *arr = json_array(), *ps = json_array();

	for (uint32_t i = 0; i < d->njobs; i++) {
		const struct cjob *j = &d->jobs[i];
		const json_t *mode = json_object_get(j->desc, "mode");
		const json_t *sync = json_object_get(json_object_get(j->desc, "sync"), "model");
		json_t *o = json_pack("{s:I, s:s, s:s, s:s, s:O, s:s}", "id", (json_int_t)j->id,
				      "origin", j->from_config ? "config" : "runtime", "state",
				      j->where >= 0 ? "published" : "unplaced", "mode",
				      json_is_string(mode) ? json_string_value(mode) : "aggregate",
				      "workers", json_object_get(j->desc, "workers"), "sync",
				      json_is_string(sync) ? json_string_value(sync) : "bsp");

		if (j->where >= 0) {
			json_object_set_new(o, "pboxd", json_string(d->cfg.pboxds[j->where].name));
			json_object_set_new(o, "control",
					    json_string(d->cfg.pboxds[j->where].control));
		}
		if (j->note[0] != '\0') {
			json_object_set_new(o, "note", json_string(j->note));
		}
		if (j->plan != NULL) {
			json_object_set(o, "plan", j->plan);
		}
		json_array_append_new(arr, o);
	}
	for (uint32_t w = 0; w < d->cfg.npboxds; w++) {
		const struct ctrld_pboxd *p = &d->cfg.pboxds[w];

		json_array_append_new(ps,
				      json_pack("{s:s, s:s, s:b, s:i, s:s}", "name", p->name,
						"control", p->control, "up", p->up, "jobs",
						(json_int_t)p->njobs, "last_error", p->last_error));
	}
	return json_pack(
		"{s:b, s:o, s:o, s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:i}}",
		"ok", 1, "jobs", arr, "pboxds", ps, "control", "jobs_created",
		(json_int_t)d->n.created, "jobs_removed", (json_int_t)d->n.removed,
		"job_create_refused", (json_int_t)d->n.create_refused, "job_rm_refused",
		(json_int_t)d->n.rm_refused, "admin_refused", (json_int_t)d->n.admin_refused,
		"wrong_admin_token", (json_int_t)d->n.wrong_admin_token, "auth_rate_limited",
		(json_int_t)d->n.auth_rate_limited, "republished", (json_int_t)d->n.republished,
		"publish_failures", (json_int_t)d->n.publish_failures, "plans_sent",
		(json_int_t)d->n.plans_sent, "plan_failures", (json_int_t)d->n.plan_failures,
		"connections", (json_int_t)d->nconns);
}

/* ---- the control API ---- */

static void conn_send(struct ctrld *d, struct conn *c, const json_t *obj)
{
	size_t len;
	char *s = pbox_ctl_encode(obj, &len);
	char *n;

	if (s == NULL || c->out_len - c->out_off + len > MAX_OUT_BYTES) {
		free(s);
		CLIENT_WARN(d, "control connection %d: does not read its answers; closing", c->fd);
		c->dead = true;
		return;
	}
	n = realloc(c->out, c->out_len + len);
	if (n == NULL) {
		free(s);
		c->dead = true;
		return;
	}
	c->out = n;
	memcpy(c->out + c->out_len, s, len);
	c->out_len += len;
	free(s);
}

static void conn_flush(struct conn *c)
{
	while (c->out_off < c->out_len) {
		ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);

		if (w < 0) {
			if (errno != EAGAIN && errno != EINTR) {
				c->dead = true;
			}
			return;
		}
		c->out_off += (size_t)w;
	}
	c->out_off = c->out_len = 0;
}

static json_t *admin_check(struct ctrld *d, struct conn *c, const char *op, const char *token)
{
	if (c->local || c->admin) {
		return NULL;
	}
	if (token != NULL && c->addr != NULL &&
	    !pbox_ctladdr_auth_allowed(&d->addrs, c->addr, now_ms())) {
		c->bad++;
		d->n.auth_rate_limited++;
		CLIENT_WARN(d,
			    "control connection %d: %s refused: too many wrong admin tokens "
			    "from its address",
			    c->fd, op);
		return pbox_ctl_error(EAGAIN,
				      "%s: too many wrong admin tokens from this address (at most "
				      "%u a minute); try again later",
				      op, d->cfg.auth_failures_per_minute);
	}
	if (token != NULL && d->cfg.admin_token[0] != '\0' &&
	    pbox_ctl_token_equal(token, d->cfg.admin_token)) {
		c->admin = true;
		pbox_linebuf_set_max(&c->in, AUTHED_LINE_BYTES);
		return NULL;
	}
	c->bad++;
	if (token != NULL) {
		d->n.wrong_admin_token++;
		if (c->addr != NULL) {
			pbox_ctladdr_auth_failed(c->addr);
		}
		CLIENT_WARN(d, "control connection %d: %s refused: wrong admin token", c->fd, op);
		return pbox_ctl_error(EACCES, "%s: wrong admin token", op);
	}
	d->n.admin_refused++;
	CLIENT_WARN(d, "control connection %d: %s refused: no admin token", c->fd, op);
	return pbox_ctl_error(EACCES,
			      "%s needs pbox-ctrld's admin token (\"admin_token\") or its local "
			      "control socket",
			      op);
}

/* bw_list, and bw_probe {"from": PBOXD, "to": "ADDR:PORT"}: queue a probe (answered at
 * once with "done_at": the pair's "probes" count once it has run; the matrix shows its
 * result then). */
static json_t *handle_bw(struct ctrld *d, struct conn *c, const json_t *req, const char *op)
{
	const char *from = json_string_value(json_object_get(req, "from"));
	const char *to = json_string_value(json_object_get(req, "to"));
	char err[512];
	uint64_t done_at = 0;
	json_t *resp =
		admin_check(d, c, op, json_string_value(json_object_get(req, "admin_token")));
	int rc;

	if (resp != NULL) {
		return resp;
	}
	if (strcmp(op, "bw_list") == 0) {
		return ctrld_bw_list(d->bw);
	}
	if (from == NULL || to == NULL) {
		c->bad++;
		return pbox_ctl_error(EINVAL, "bw_probe needs \"from\" (a pboxd) and \"to\" (an "
					      "address) strings");
	}
	rc = ctrld_bw_probe(d->bw, from, to, &done_at, err, sizeof(err));
	if (rc != 0) {
		CLIENT_WARN(d, "bw_probe refused: %s", err);
		return pbox_ctl_error(-rc, "%s", err);
	}
	return json_pack("{s:b, s:b, s:I}", "ok", 1, "queued", 1, "done_at", (json_int_t)done_at);
}

static json_t *handle(struct ctrld *d, struct conn *c, const json_t *req)
{
	const char *op = json_string_value(json_object_get(req, "op"));
	struct pbox_jobmsg m;
	char err[1024];
	json_t *resp;
	int rc;

	if (op != NULL && strcmp(op, "auth") == 0) {
		resp = admin_check(d, c, op,
				   json_string_value(json_object_get(req, "admin_token")));
		return resp ? resp : json_pack("{s:b}", "ok", 1);
	}
	if (op != NULL && (strcmp(op, "bw_list") == 0 || strcmp(op, "bw_probe") == 0)) {
		return handle_bw(d, c, req, op);
	}
	rc = pbox_jobmsg_decode(req, &m, err, sizeof(err));
	if (rc == -ENOENT) {
		c->bad++;
		return pbox_ctl_error(EINVAL,
				      "unknown op '%s' (auth, job_create, job_rm, job_list, "
				      "bw_list, bw_probe)",
				      op ? op : "");
	}
	if (rc != 0) {
		c->bad++;
		return pbox_ctl_error(-rc, "%s", err);
	}
	resp = admin_check(d, c, op, m.admin_token);
	if (resp != NULL) {
		return resp;
	}
	err[0] = '\0';
	switch (m.op) {
	case PBOX_JOBMSG_LIST:
		return job_list(d);
	case PBOX_JOBMSG_PLAN:
		CLIENT_WARN(d, "job_plan for job %u refused: pbox-ctrld computes the plans", m.id);
		return pbox_ctl_error(
			EOPNOTSUPP, "job_plan is pboxd's operation: pbox-ctrld computes the plans "
				    "(give one with job_create)");
	case PBOX_JOBMSG_RM:
		rc = remove_job(d, m.id, err, sizeof(err));
		if (rc != 0) {
			d->n.rm_refused++;
			CLIENT_WARN(d, "job_rm refused: %s", err);
			return pbox_ctl_error(-rc, "%s", err);
		}
		d->n.removed++;
		return json_pack("{s:b, s:I}", "ok", 1, "id", (json_int_t)m.id);
	case PBOX_JOBMSG_CREATE:
		rc = add_job(d, (json_t *)m.job, m.plan, json_object_get(req, "placement"), false,
			     err, sizeof(err));
		if (rc != 0) {
			uint32_t id = 0;

			(void)pbox_jobspec_id(m.job, &id);
			d->n.create_refused++;
			CLIENT_WARN(d, "job_create of job %u refused: %s", id, err);
			return pbox_ctl_error(-rc, "%s", err);
		}
		d->n.created++;
		return json_pack("{s:b, s:I, s:s}", "ok", 1, "id",
				 (json_int_t)d->jobs[d->njobs - 1].id, "pboxd",
				 d->cfg.pboxds[d->jobs[d->njobs - 1].where].name);
	}
	return pbox_ctl_error(EINVAL, "not a job operation");
}

static void serve(struct ctrld *d, struct conn *c)
{
	long n = pbox_linebuf_fill(&c->in, c->fd);
	char *line;

	while (!c->dead && (line = pbox_linebuf_next(&c->in)) != NULL) {
		json_error_t jerr;
		json_t *req = json_loads(line, 0, &jerr), *resp;

		if (!json_is_object(req)) {
			c->bad++;
			resp = pbox_ctl_error(EINVAL, "not a JSON object: %s",
					      req ? "wrong type" : jerr.text);
		} else {
			resp = handle(d, c, req);
		}
		conn_send(d, c, resp);
		json_decref(resp);
		json_decref(req);
		if (c->bad >= MAX_BAD) {
			CLIENT_WARN(d, "control connection %d: %u bad requests; closing", c->fd,
				    c->bad);
			c->dead = true;
		}
	}
	if (n == -E2BIG) {
		json_t *e = pbox_ctl_error(E2BIG,
					   "request line too long (%u bytes before the "
					   "admin token is proved)",
					   UNAUTH_LINE_BYTES);

		CLIENT_WARN(d, "control connection %d: request line too long; closing", c->fd);
		conn_send(d, c, e);
		json_decref(e);
		c->dead = true;
	} else if (n == 0 || (n < 0 && n != -EAGAIN)) {
		c->dead = true;
	}
	conn_flush(c);
}

static int listen_tcp(struct ctrld *d)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(d->cfg.listen_port) };
	socklen_t sl = sizeof(sa);
	int one = 1;

	if (inet_pton(AF_INET, d->cfg.listen_host, &sa.sin_addr) != 1) {
		PBOX_LOG_ERR(MAIN, "listen %s: not an IPv4 address", d->cfg.listen_host);
		return -EINVAL;
	}
	d->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (d->lfd < 0 || setsockopt(d->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
	    bind(d->lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(d->lfd, 128) != 0 ||
	    getsockname(d->lfd, (struct sockaddr *)&sa, &sl) != 0) {
		int rc = -errno;

		PBOX_LOG_ERR(MAIN, "listen %s:%u: %s", d->cfg.listen_host, d->cfg.listen_port,
			     strerror(errno));
		return rc;
	}
	d->port = ntohs(sa.sin_port);
	return 0;
}

static int listen_unix(struct ctrld *d)
{
	struct sockaddr_un su = { .sun_family = AF_UNIX };

	snprintf(su.sun_path, sizeof(su.sun_path), "%s", d->cfg.control_socket);
	unlink(su.sun_path);
	d->ufd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (d->ufd < 0 || bind(d->ufd, (struct sockaddr *)&su, sizeof(su)) != 0 ||
	    listen(d->ufd, 16) != 0) {
		int rc = -errno;

		PBOX_LOG_ERR(MAIN, "control_socket %s: %s", su.sun_path, strerror(errno));
		return rc;
	}
	return 0;
}

static void accept_one(struct ctrld *d, int lfd, bool local)
{
	struct sockaddr_in sa;
	socklen_t sl = sizeof(sa);
	int fd = accept4(lfd, local ? NULL : (struct sockaddr *)&sa, local ? NULL : &sl,
			 SOCK_NONBLOCK | SOCK_CLOEXEC);
	struct pbox_ctladdr *a = NULL;
	struct conn *c;

	if (fd < 0) {
		return;
	}
	if (!local) {
		a = pbox_ctladdr_get(&d->addrs, sa.sin_addr.s_addr, now_ms());
		if (a == NULL || a->nconns >= d->cfg.max_per_address) {
			char ip[INET_ADDRSTRLEN];

			inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
			CLIENT_WARN(d,
				    "control: %s holds %u connections, the most per address; "
				    "refusing one",
				    ip, a ? a->nconns : 0);
			close(fd);
			return;
		}
	}
	if (d->nconns >= d->cfg.max_connections) {
		CLIENT_WARN(d, "control: %u connections, the most allowed; refusing one",
			    d->nconns);
		close(fd);
		return;
	}
	c = calloc(1, sizeof(*c));
	if (c == NULL) {
		close(fd);
		return;
	}
	c->fd = fd;
	c->addr = a;
	if (a != NULL) {
		a->nconns++;
	}
	c->local = local;
	c->accepted_ms = now_ms();
	pbox_linebuf_init(&c->in);
	pbox_linebuf_set_max(&c->in, local ? AUTHED_LINE_BYTES : UNAUTH_LINE_BYTES);
	d->conns[d->nconns++] = c;
}

static void reap(struct ctrld *d)
{
	uint64_t now = now_ms();

	for (uint32_t i = 0; i < d->nconns;) {
		struct conn *c = d->conns[i];

		if (!c->dead && !c->local && !c->admin &&
		    now - c->accepted_ms > UNAUTH_TIMEOUT_MS) {
			CLIENT_WARN(d, "control connection %d: no admin token within %u s; closing",
				    c->fd, UNAUTH_TIMEOUT_MS / 1000);
			c->dead = true;
		}
		if (!c->dead) {
			i++;
			continue;
		}
		conn_flush(c);
		/* Read what is left (bounded) so the close is a FIN, not a reset that could
		 * discard the last answer (the refusal) before the client read it. */
		for (int k = 0; k < 64; k++) {
			char sink[4096];

			if (recv(c->fd, sink, sizeof(sink), MSG_DONTWAIT) <= 0) {
				break;
			}
		}
		close(c->fd);
		if (c->addr != NULL) {
			c->addr->nconns--;
		}
		pbox_linebuf_free(&c->in);
		free(c->out);
		free(c);
		d->conns[i] = d->conns[--d->nconns];
	}
}

static int run(struct ctrld *d)
{
	struct pollfd *pfd = calloc(d->cfg.max_connections + 2, sizeof(*pfd));
	char why[1024];
	size_t k;
	json_t *o;

	if (pfd == NULL) {
		return -ENOMEM;
	}
	json_array_foreach(d->cfg.jobs, k, o)
	{
		why[0] = '\0';
		if (add_job(d, o, NULL, NULL, true, why, sizeof(why)) != 0) {
			PBOX_LOG_ERR(ADMIN, "configured job refused: %s", why);
		}
	}
	/* Listening, and the configured jobs published or queued: tell systemd (Type=notify). */
	{
		uint32_t published = 0;

		for (uint32_t i = 0; i < d->njobs; i++) {
			published += d->jobs[i].where >= 0;
		}
		sd_notifyf(0, "READY=1\nSTATUS=%u pboxd%s, %u job%s (%u published)", d->cfg.npboxds,
			   d->cfg.npboxds == 1 ? "" : "s", d->njobs, d->njobs == 1 ? "" : "s",
			   published);
	}
	d->next_reconcile_ms = now_ms() + d->cfg.reconcile_ms;
	while (!g_stop) {
		uint32_t n = 0, first;
		uint64_t now = now_ms();
		int wait;

		pfd[n++] = (struct pollfd){ .fd = d->lfd, .events = POLLIN };
		pfd[n++] = (struct pollfd){ .fd = d->ufd, .events = POLLIN };
		first = n;
		for (uint32_t i = 0; i < d->nconns; i++) {
			pfd[n++] = (struct pollfd){
				.fd = d->conns[i]->fd,
				.events = (short)(POLLIN | (d->conns[i]->out_len ? POLLOUT : 0)),
			};
		}
		wait = now >= d->next_reconcile_ms ? 0 : (int)(d->next_reconcile_ms - now);
		if (poll(pfd, n, wait) < 0 && errno != EINTR) {
			PBOX_LOG_ERR(MAIN, "poll: %s", strerror(errno));
			break;
		}
		for (uint32_t i = first; i < n; i++) {
			struct conn *c = d->conns[i - first];

			if (pfd[i].revents & (POLLIN | POLLHUP | POLLERR)) {
				serve(d, c);
			} else if (pfd[i].revents & POLLOUT) {
				conn_flush(c);
			}
		}
		reap(d);
		if (pfd[0].revents & POLLIN) {
			accept_one(d, d->lfd, false);
		}
		if (d->ufd >= 0 && (pfd[1].revents & POLLIN)) {
			accept_one(d, d->ufd, true);
		}
		if (now_ms() >= d->next_reconcile_ms) {
			pbox_ctladdr_gc(&d->addrs, now_ms());
			reconcile(d);
			d->next_reconcile_ms = now_ms() + d->cfg.reconcile_ms;
		}
	}
	sd_notify(0, "STOPPING=1");
	free(pfd);
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: pbox-ctrld [-c FILE] [--check-config] [-V] [-h]\n"
		"\n"
		"The pbox control plane: holds the jobs (its configuration file's and those\n"
		"created with `pbox job create --control ADDR`), admits each onto one of the\n"
		"pboxds it manages and publishes it there over the pboxd's admin control channel,\n"
		"publishing again whenever a pboxd lost its jobs (restarted). With a bandwidth\n"
		"group it keeps the bandwidth matrix of its probe pairs (`pbox bw`). Runs in the\n"
		"foreground; SIGTERM / SIGINT stop it (the published jobs stay on the pboxds).\n"
		"\n"
		"  -c, --config FILE   configuration (default %s)\n"
		"      --check-config  validate the configuration (static jobs with pboxd's job\n"
		"                      validation) and exit\n"
		"  -V, --version       version\n"
		"  -h, --help          this text\n",
		CTRLD_DEFAULT_CONFIG);
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "check-config", no_argument, NULL, 'C' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *path = CTRLD_DEFAULT_CONFIG;
	struct ctrld d = { .lfd = -1, .ufd = -1 };
	struct sigaction sa = { .sa_handler = on_signal };
	bool check = false;
	char err[1024];
	int opt, rc;

	pbox_log_init_from_env();
	pbox_log_set_ident("pbox-ctrld");
	while ((opt = getopt_long(argc, argv, "c:Vh", longopts, NULL)) != -1) {
		switch (opt) {
		case 'c':
			path = optarg;
			break;
		case 'C':
			check = true;
			break;
		case 'V':
			printf("pbox-ctrld %s\n", PBOX_VERSION_STRING);
			return 0;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 64;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "pbox-ctrld: unexpected argument '%s'\n", argv[optind]);
		return 64;
	}
	rc = ctrld_config_load(&d.cfg, path, err, sizeof(err));
	if (rc != 0) {
		fprintf(stderr, "pbox-ctrld: %s\n", err);
		return 78; /* EX_CONFIG */
	}
	if (check) {
		printf("%s: ok: %u pboxd(s), %zu static job(s)\n", path, d.cfg.npboxds,
		       json_array_size(d.cfg.jobs));
		ctrld_config_free(&d.cfg);
		return 0;
	}
	pbox_ctladdr_init(&d.addrs, d.cfg.auth_failures_burst, d.cfg.auth_failures_per_minute);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	d.conns = calloc(d.cfg.max_connections, sizeof(*d.conns));
	d.jobs = calloc(MAX_JOBS, sizeof(*d.jobs));
	d.rms = calloc(MAX_JOBS, sizeof(*d.rms));
	if (d.conns == NULL || d.jobs == NULL || d.rms == NULL || listen_tcp(&d) != 0 ||
	    (d.cfg.control_socket[0] != '\0' && listen_unix(&d) != 0)) {
		rc = 69; /* EX_UNAVAILABLE */
		goto out;
	}
	if (ctrld_bw_start(&d.cfg, &d.bw) != 0) {
		rc = 69; /* EX_UNAVAILABLE */
		goto out;
	}
	PBOX_LOG_INFO(MAIN, "pbox-ctrld %s: control API on %s:%u%s%s, managing %u pboxd(s)",
		      PBOX_VERSION_STRING, d.cfg.listen_host, d.port,
		      d.cfg.control_socket[0] ? " and " : "", d.cfg.control_socket, d.cfg.npboxds);
	rc = run(&d) == 0 ? 0 : 1;
	PBOX_LOG_INFO(MAIN, "stopping (the published jobs stay on their pboxds)");
out:
	ctrld_bw_stop(d.bw);
	for (uint32_t i = 0; i < d.nconns; i++) {
		d.conns[i]->dead = true;
	}
	reap(&d);
	for (uint32_t i = 0; i < d.njobs; i++) {
		json_decref(d.jobs[i].desc);
		json_decref(d.jobs[i].plan);
		json_decref(d.jobs[i].placement);
		json_decref(d.jobs[i].agents);
	}
	if (d.lfd >= 0) {
		close(d.lfd);
	}
	if (d.ufd >= 0) {
		close(d.ufd);
		unlink(d.cfg.control_socket);
	}
	pbox_ctladdr_free(&d.addrs);
	free(d.conns);
	free(d.jobs);
	free(d.rms);
	ctrld_config_free(&d.cfg);
	return rc;
}
