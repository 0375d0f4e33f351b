/* SPDX-License-Identifier: BSD-3-Clause */
/* The `metrics = { ... }` group of pboxd's and pbox-ctrld's files (metrics.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hostport.h"
#include "metrics.h"

void pbox_metrics_cfg_defaults(struct pbox_metrics_cfg *cfg, uint16_t default_port)
{
	memset(cfg, 0, sizeof(*cfg));
	snprintf(cfg->host, sizeof(cfg->host), "127.0.0.1");
	cfg->port = default_port;
	cfg->max_connections = PBOX_METRICS_MAX_CONNECTIONS;
	cfg->timeout_s = PBOX_METRICS_TIMEOUT_S;
	cfg->max_bytes = PBOX_METRICS_MAX_BYTES;
}

int pbox_metrics_cfg_load(struct pbox_confkit *c, const config_setting_t *g,
			  struct pbox_metrics_cfg *cfg)
{
	static const char *const keys[] = { "listen", "max_connections", "timeout", "max_bytes",
					    NULL };
	const config_setting_t *where = NULL;
	char listen[96] = "";
	struct in_addr in;
	int rc;

	if (g == NULL) {
		return 0;
	}
	if (!config_setting_is_group(g)) {
		return pbox_conf_bad(c, g, "must be a group { listen = \"127.0.0.1:%u\"; }",
				     cfg->port);
	}
	if ((rc = pbox_conf_only(c, g, keys)) != 0 ||
	    (rc = pbox_conf_str(c, g, "listen", listen, sizeof(listen), &where)) != 0 ||
	    (rc = pbox_conf_u32(c, g, "max_connections", 1, 1024, &cfg->max_connections)) != 0 ||
	    (rc = pbox_conf_u32(c, g, "timeout", 1, 3600, &cfg->timeout_s)) != 0 ||
	    (rc = pbox_conf_u32(c, g, "max_bytes", 4096, 1u << 30, &cfg->max_bytes)) != 0) {
		return rc;
	}
	if (where != NULL) {
		char host[sizeof(cfg->host)];
		uint16_t port;
		const char *colon = strrchr(listen, ':');

		if (colon == NULL || (size_t)(colon - listen) >= sizeof(cfg->host)) {
			return pbox_conf_bad(c, where, "'%s': expected \"ADDRESS:PORT\"", listen);
		}
		if (pbox_hostport_split(listen, true, 0, host, sizeof(host), &port) != 0) {
			return pbox_conf_bad(c, where, "'%s': the port must be 0..65535", listen);
		}
		if (inet_pton(AF_INET, host, &in) != 1) {
			return pbox_conf_bad(c, where,
					     "'%s': expected a numeric IPv4 address (e.g. "
					     "127.0.0.1, or 0.0.0.0 for every interface)",
					     host);
		}
		snprintf(cfg->host, sizeof(cfg->host), "%s", host);
		cfg->port = port;
	}
	cfg->enabled = true;
	return 0;
}
