/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pboxd as a probe agent (ctrlplane/probe/agent.h): with the appliance's probe = { ... }
 * group it answers SLoPS probes on its own UDP port (the responder, on its own thread,
 * bounded as agent.h describes) and runs probes a controller asks for over the admin
 * control channel ({"op":"probe","request":{...}}, probe_msg.h), one at a time, on a
 * worker thread, never faster or longer than the group's max_rate / max_budget_s.
 *
 * Threading: create, start, poll, stats and destroy belong to the control thread; the
 * responder thread and the probe thread only touch their own state, and a finished probe
 * is handed back through an eventfd (pboxd_probe_fd) read by pboxd_probe_poll.
 * Errors: int functions return 0 or -errno and log the cause.
 */
#ifndef PBOXD_PROBE_H
#define PBOXD_PROBE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "config.h"

struct pboxd_probe;

/* The agent for cfg->probe (NULL *out when the group is absent or disabled: not an
 * error). Binds the responder's port and starts its thread. Returns 0 or -errno. */
int pboxd_probe_create(const struct pboxd_config *cfg, struct pboxd_probe **out);
/* Stops the responder; waits for a running probe to end (at most its budget). */
void pboxd_probe_destroy(struct pboxd_probe *p);

/*
 * Start the probe request j (untrusted: decoded by pbox_probe_request_from_json against
 * the configured limits) for the waiter `owner` (an opaque pointer given back by
 * pboxd_probe_poll). Returns 0 (started), -EINVAL (malformed request), -EPERM (cap or
 * budget above the limits), -EBUSY (a probe is running), -ENOTSUP (p is NULL: probing
 * not enabled), -errno of pthread_create; err names the cause. Counted in the stats.
 */
int pboxd_probe_start(struct pboxd_probe *p, const json_t *j, void *owner, char *err,
		      size_t errlen);

/* Readable (an eventfd) when a probe finished; -1 when p is NULL. */
int pboxd_probe_fd(const struct pboxd_probe *p);

/* When a probe finished: its answer (new reference: {"ok":true,"result":{...}} or an
 * error object) and its owner; NULL when none has finished. */
json_t *pboxd_probe_poll(struct pboxd_probe *p, void **owner);

/* The waiter owner is gone: the running probe's answer is dropped. */
void pboxd_probe_forget(struct pboxd_probe *p, const void *owner);

/* The "probe" stats object (new reference; NULL when p is NULL). */
json_t *pboxd_probe_stats(const struct pboxd_probe *p);

#endif /* PBOXD_PROBE_H */
