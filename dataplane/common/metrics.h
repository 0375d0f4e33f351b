/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The Prometheus endpoint of pboxd and pbox-ctrld: GET /metrics over HTTP (libmicrohttpd),
 * configured by a top-level group of either daemon's file:
 *
 *   metrics = {
 *     listen = "127.0.0.1:9540";   # numeric IPv4 address and port (pbox-ctrld: 9541)
 *     max_connections = 8;         # connections served at once; more are refused
 *     timeout = 5;                 # seconds a connection may take (slow clients are cut)
 *     max_bytes = 4194304;         # bound of one response (series past it are left out,
 *   };                             # pbox_metrics_truncated 1 says so)
 *
 * Off without the group: the endpoint has no authentication (scrapers do not send any)
 * and shows job ids, membership and traffic, which pboxd otherwise shows only to an
 * operator; so nothing listens unless the operator asks, and then on loopback unless
 * another address is named.
 *
 * Threads and data. libmicrohttpd runs its own listener thread and one thread per
 * connection (at most max_connections; each cut after `timeout` seconds, requests larger
 * than 8 KiB refused): a slow or hostile client holds one of them for `timeout` at most
 * and never the daemon's own loop. Only GET (and HEAD) of /metrics is served: 405 with
 * "Allow: GET, HEAD" for other methods, 404 for other paths. The text itself is rendered
 * by the daemon on its own control thread (pbox_metrics_serve, called when
 * pbox_metrics_fd is readable), from the counters the data-plane cores already publish and
 * the control thread's own state; the HTTP threads only copy the last rendered text. A
 * scrape asks for a new rendering and waits up to 1 s for it (so what it gets is at most a
 * scrape-interval fresh), then serves the latest text it has, with its age
 * (pbox_metrics_age_seconds). A rendering less than 250 ms old is served without asking,
 * so clients scraping in a loop cost the control thread at most four renderings a second.
 *
 * Errors: pbox_metrics_start returns NULL after logging why (address in use, no
 * libmicrohttpd in this build).
 */
#ifndef PBOX_METRICS_H
#define PBOX_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libconfig.h>

#include "confkit.h"
#include "prom.h"

#define PBOX_METRICS_PORT_PBOXD      9540u
#define PBOX_METRICS_PORT_CTRLD      9541u
#define PBOX_METRICS_MAX_CONNECTIONS 8u
#define PBOX_METRICS_TIMEOUT_S       5u
#define PBOX_METRICS_MAX_BYTES       (4u << 20)

struct pbox_metrics_cfg {
	bool enabled;
	char host[64]; /* numeric IPv4 */
	uint16_t port;
	uint32_t max_connections;
	uint32_t timeout_s;
	uint32_t max_bytes;
};

/* Off, with the defaults (listen 127.0.0.1:default_port) for when the group appears. */
void pbox_metrics_cfg_defaults(struct pbox_metrics_cfg *cfg, uint16_t default_port);

/* Read the group g (the `metrics` setting; NULL: stays off). 0 or -EINVAL with the
 * confkit error. */
int pbox_metrics_cfg_load(struct pbox_confkit *c, const config_setting_t *g,
			  struct pbox_metrics_cfg *cfg);

/* Renders the daemon's metrics into p (on the daemon's control thread). */
typedef void pbox_metrics_render_fn(void *arg, struct pbox_prom *p);

struct pbox_metrics;

/* Listen as cfg says; daemon names the process in logs ("pboxd"). NULL after logging
 * why. */
struct pbox_metrics *pbox_metrics_start(const struct pbox_metrics_cfg *cfg, const char *daemon);

/* Stop listening, end the connections' threads, free. NULL is a no-op. */
void pbox_metrics_stop(struct pbox_metrics *m);

/* Readable (an eventfd) when a scrape waits for a new rendering. */
int pbox_metrics_fd(const struct pbox_metrics *m);

/* Control thread: drain the fd, render with fn and hand the text to waiting scrapes. */
void pbox_metrics_serve(struct pbox_metrics *m, pbox_metrics_render_fn *fn, void *arg);

/* The bound port (cfg port 0: the one the kernel chose). */
uint16_t pbox_metrics_port(const struct pbox_metrics *m);

#endif /* PBOX_METRICS_H */
