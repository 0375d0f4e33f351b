/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libpbox's SLoPS probe agent (issue 11): every worker runs the probe agent library
 * (ctrlplane/probe/agent.h) so that pbox-ctrld can measure the paths its broadcast trees
 * and DVF thresholds depend on (appliance <-> worker, worker <-> worker).
 *
 *  - Responder: answers probes on its own UDP port (on its own thread), advertised to
 *    pboxd in the register request ("probe":"a.b.c.d:port"); pboxd reports it in
 *    job_list, where pbox-ctrld finds it.
 *  - Prober: pbox-ctrld asks a worker to probe towards another endpoint through pboxd:
 *    its admin request {"op":"probe","via":{"job":J,"rank":R},"request":{...}} makes
 *    pboxd push {"event":"probe","id":N,"request":{...}} on the rank's control channel
 *    (common/ctlproto.h); the worker runs the probe on a thread of its own and answers
 *    {"op":"probe_result","id":N,...}, which pboxd hands back to pbox-ctrld. The path is
 *    authenticated at both hops (pbox-ctrld's admin token at pboxd; the job's token on
 *    the worker's control connection), and the worker opens no listening TCP port.
 *    One probe at a time; a request above the agent's own limits (PBOX_PROBE_MAX_RATE,
 *    PBOX_PROBE_MAX_BUDGET_S) is refused (EPERM), never clipped.
 *
 * Threading: created, polled and destroyed by the client (the progress thread polls);
 * the responder and the probe run on their own threads. Errors: -errno, logged.
 */
#ifndef PBOX_LIBPBOX_PROBE_H
#define PBOX_LIBPBOX_PROBE_H

#include <stdint.h>

#include <jansson.h>

struct pbox_wprobe;

/*
 * The agent as spec says: "off" (then *out is NULL and 0 is returned), or "ADDR:PORT"
 * for the responder (port 0: any free port; ADDR empty or 0.0.0.0: def_addr), NULL: env
 * PBOX_PROBE, else def_addr with any free port. def_addr: the worker's address as pboxd
 * sees it (numeric). wake_fd: an eventfd written when a probe ends (the client's
 * doorbell). Returns 0, -EINVAL (spec or limits malformed), or -errno of the socket or
 * threads.
 */
int pbox_wprobe_create(const char *spec, const char *def_addr, int wake_fd,
		       struct pbox_wprobe **out);

/* "a.b.c.d:port": where the responder listens (advertised at register). */
const char *pbox_wprobe_addr(const struct pbox_wprobe *w);

/*
 * A {"event":"probe"} object from pboxd: start the probe on the agent's thread. Returns
 * NULL when it started (its answer comes from pbox_wprobe_poll), or the answer to send at
 * once: {"op":"probe_result","id":N,"errno":E,"error":...} (malformed, EBUSY: one runs,
 * EPERM: above the limits). A message without a usable id gets no answer (NULL).
 */
json_t *pbox_wprobe_start(struct pbox_wprobe *w, const json_t *event);

/* The answer of a probe that ended ({"op":"probe_result",...}, a new reference), or NULL
 * (none ended since the last call). Joins the probe's thread. */
json_t *pbox_wprobe_poll(struct pbox_wprobe *w);

/* Stop the responder, wait for a running probe (it ends within its budget), free. NULL:
 * no-op. */
void pbox_wprobe_destroy(struct pbox_wprobe *w);

#endif /* PBOX_LIBPBOX_PROBE_H */
