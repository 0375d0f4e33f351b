/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pboxd's XDP filter (nicfw/): attached at start when the appliance's xdp = { interface =
 * ...; } is set, kept in step with every published job table (the admitted jobs, their
 * ranks' session cookies, their chunks' owner cores), reported in the stats, detached at
 * exit. Without XDP support in the build, a configured interface is an error at start.
 *
 * With transport "afxdp" and no xdp.interface, the filter goes on afxdp.interface.
 *
 * Ordering: pboxd_xdp_sync runs from the sessions' publish hook, before the control thread
 * answers the register that drew a new cookie, so a worker's first datagram already finds
 * its cookie in the filter. A job leaves the filter when it leaves the table (its session
 * ended), so a new session of the job loads its new chunk owners.
 *
 * Threading: control thread only.
 */
#ifndef PBOXD_XDP_H
#define PBOXD_XDP_H

#include <jansson.h>
#include <stdio.h>

#include "config.h"
#include "engine/job.h"

struct pboxd_xdp;

/* Attach per cfg->xdp. *out is NULL when no interface is configured. 0, or -errno after
 * logging (no such interface, BPF not permitted, another XDP program there, no XDP in
 * this build: -ENOTSUP). */
int pboxd_xdp_start(const struct pboxd_config *cfg, struct pboxd_xdp **out);

/* The loader's handle (nicfw/loader.h) for the transport's sockets; NULL when x is. */
struct pbox_xdp *pboxd_xdp_prog(const struct pboxd_xdp *x);

/* Detach and free (NULL accepted). */
void pboxd_xdp_stop(struct pboxd_xdp *x);

/* Make the filter admit exactly the jobs of tab with their cookies (a publish hook: arg is
 * the struct pboxd_xdp). Failures are logged; the filter then errs towards dropping (a
 * cookie it lacks), never towards admitting a removed one. */
void pboxd_xdp_sync(void *arg, const struct pbox_jobtab *tab);

/* {"interface":..., "mode":..., "rx":n, "passed":n, "redirected":n, "dropped":n,
 *  "pass_other":n, "pass_fragment":n, "pass_no_owner":n, "pass_queue":n,
 *  "drops":{"bad_cookie":n, ...}, "cores":[{"core":k, "redirected":n, "passed":n}, ...]}
 * (new reference); NULL when x is NULL or the counters cannot be read. */
json_t *pboxd_xdp_stats_json(const struct pboxd_xdp *x);

/* One or two lines of the same counters (nothing when x is NULL). */
void pboxd_xdp_stats_print(FILE *f, const struct pboxd_xdp *x);

#endif /* PBOXD_XDP_H */
