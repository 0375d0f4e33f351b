/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Job descriptions on the control channel, and the typed job-administration messages that
 * carry them (shared by pboxd, pbox-ctrld and the `pbox job` command).
 *
 * A job description is a JSON object with exactly the settings of a job group of pboxd's
 * configuration file (config.h: id, token, workers, mode, reduce, optimizer {...}, keys
 * [[id, elements], ...], window, deterministic, sync {...}, flow {...}, on_worker_loss,
 * memory_budget, non_finite). It is never interpreted here: pbox_jobspec_to_setting turns
 * it into the libconfig group a configuration file would have given, and pboxd validates
 * that group with the very code that loads config-file jobs (pboxd_config_load_job), so
 * a runtime job and a static job cannot differ in what they accept. The other direction,
 * pbox_jobspec_from_setting, lets pbox-ctrld send the jobs of its own configuration file.
 *
 * Messages (requests; answers are {"ok":true,...} or {"ok":false,"errno":E,"error":...}):
 *   {"op":"job_create","job":{...description...}[,"plan":{...}]}  -> {"ok":true,"id":N}
 *   {"op":"job_rm","id":N}                              -> {"ok":true,"id":N}
 *   {"op":"job_list"}                                    -> {"ok":true,"jobs":[...]}
 *   {"op":"job_plan","id":N,"plan":{...}}  -> {"ok":true,"id":N,"applied":B,"revision":R}
 * job_plan replaces the plan a job holds (pbox-ctrld sends it whenever it recomputes one);
 * the plan's revision is its "tree"."revision" (an integer >= 0; absent: 0), and a plan that
 * is not newer than the held one is not applied (applied false, revision the held one).
 * The optional "plan" is the place of what the control plane computes for a job rather than
 * what its owner configures: {"tree": {...}, "thresholds": {...}} (broadcast tree and DVF
 * thresholds, issue 11 §4-5). Only those two members are accepted, each an object or null;
 * pboxd keeps the plan with the job (swapped in with RCU by job_plan, see pboxd/sessions.h)
 * and reports it and its revision in job_list.
 * job_create's optional "assignment" is the control plane's placement of the job's chunks on
 * the pboxd's data-plane cores: {"chunk_bytes": C, "map": [core of chunk 0, ...]}, for a job
 * with a fixed key set cut into chunks of C bytes. pboxd uses it instead of its own LPT
 * after checking it strictly (C is its chunk size, one entry per chunk of the key set, every
 * core one of its data-plane cores: else the job is refused); pbox-ctrld makes it.
 * Each request is optionally with "admin_token":"..." (pboxd requires it unless the request comes
 * over its Unix control socket or the connection already proved the token).
 *
 * The decoders take untrusted input (any JSON a client sends) and bound what they build:
 * at most PBOX_JOBSPEC_MAX_DEPTH levels, PBOX_JOBSPEC_MAX_NODES values in all, setting
 * names as libconfig allows them ([A-Za-z*][-A-Za-z0-9_*]*, at most 64 bytes), strings
 * of at most PBOX_JOBSPEC_MAX_STRING bytes without NUL, finite numbers.
 *
 * Thread safety: no shared state; every call works on its arguments only.
 */
#ifndef PBOX_JOBSPEC_H
#define PBOX_JOBSPEC_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <libconfig.h>

/* Nesting of a job description: job { sync { } }, job { keys ( [id, n] ) }. */
#define PBOX_JOBSPEC_MAX_DEPTH 4u
/* Values in one description: a key set of 2^20 keys is 3 values per key. */
#define PBOX_JOBSPEC_MAX_NODES  (4u << 20)
#define PBOX_JOBSPEC_MAX_STRING 1024u
#define PBOX_JOBSPEC_MAX_NAME   64u

enum pbox_jobmsg_op {
	PBOX_JOBMSG_CREATE = 1,
	PBOX_JOBMSG_RM,
	PBOX_JOBMSG_LIST,
	PBOX_JOBMSG_PLAN,
};

/* A decoded request. job is borrowed from the request object (valid while it lives). */
struct pbox_jobmsg {
	enum pbox_jobmsg_op op;
	uint32_t id;        /* job_rm, job_plan */
	const json_t *job;  /* job_create: the description (an object) */
	const json_t *plan; /* job_create: NULL or {"tree":..., "thresholds":...}; job_plan: set */
	const char *admin_token; /* NULL: none given; borrowed */
	/* job_create: NULL or the control plane's chunk -> core assignment
	 * {"chunk_bytes": C, "map": [core of chunk 0, core of chunk 1, ...]} */
	const json_t *assignment;
};

/*
 * Add the description desc as a group named `name` under parent (a group, e.g. the root of
 * an empty config_t). JSON objects become groups, arrays of scalars of one type arrays,
 * other arrays lists, integers int (int64 when they do not fit 32 bits), reals floats,
 * true/false bools, strings strings. Returns 0, or -EINVAL with err naming the offending
 * member (path like "job.sync.model") and the cause (a null, a bad name, too deep, too
 * many values, a long string), or -ENOMEM. On error the partial group is removed.
 */
int pbox_jobspec_to_setting(const json_t *desc, config_setting_t *parent, const char *name,
			    char *err, size_t errlen);

/* The JSON form of libconfig group g (the inverse of pbox_jobspec_to_setting for what it
 * produces). New reference, or NULL (out of memory). */
json_t *pbox_jobspec_from_setting(const config_setting_t *g);

/* The job id of a description: 0 and *id set, or -EINVAL (no integer id in 0..2^32-1). */
int pbox_jobspec_id(const json_t *desc, uint32_t *id);

/*
 * Set one setting of desc from a command-line word SETTING=VALUE: SETTING is a dotted
 * path (optimizer.lr=0.1 creates the optimizer object), VALUE an integer, a number,
 * true/false or else a string; keys=ID:ELEMENTS,ID:ELEMENTS gives the key set. Returns 0,
 * -EINVAL with err, or -ENOMEM.
 */
int pbox_jobspec_set_kv(json_t *desc, const char *kv, char *err, size_t errlen);

/* Requests (new references, NULL on out of memory). admin_token NULL or "": none sent.
 * pbox_jobmsg_create does not steal desc. */
json_t *pbox_jobmsg_create(const json_t *desc, const char *admin_token);
/* job_create with a plan (NULL: none); does not steal desc or plan. */
json_t *pbox_jobmsg_create_plan(const json_t *desc, const json_t *plan, const char *admin_token);
json_t *pbox_jobmsg_rm(uint32_t id, const char *admin_token);
json_t *pbox_jobmsg_list(const char *admin_token);
/* job_plan: plan for job id; does not steal plan. */
json_t *pbox_jobmsg_plan(uint32_t id, const json_t *plan, const char *admin_token);

/* A plan's revision: "tree"."revision" when an integer >= 0, else 0. */
int64_t pbox_jobspec_plan_revision(const json_t *plan);

/*
 * Decode req (an object whose "op" is job_create, job_rm, job_list or job_plan) into m. Returns 0,
 * -ENOENT (not a job operation: the caller dispatches it elsewhere) or -EINVAL with err
 * (a job_create without an object "job", with an assignment that is not
 * {"chunk_bytes": 64..2^26, "map": [1..2^24 integers in 0..63]}, or with a plan other than {"tree":
 * object|null, "thresholds": object|null} with an optional integer tree.revision >= 0, a job_rm or
 * job_plan without an integer "id" in 0..2^32-1, a job_plan without such a plan,
 * an admin_token that is not a string).
 */
int pbox_jobmsg_decode(const json_t *req, struct pbox_jobmsg *m, char *err, size_t errlen);

#endif /* PBOX_JOBSPEC_H */
