/* SPDX-License-Identifier: BSD-3-Clause */
/* The dpdk = { ... } group of pboxd's configuration (see conf.h). */
#include "transport/dpdk/conf.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool pbox_dpdk_conf_built(void)
{
#ifdef PBOX_HAVE_DPDK
	return true;
#else
	return false;
#endif
}

void pbox_dpdk_conf_defaults(struct pboxd_dpdk_cfg *dc)
{
	memset(dc, 0, sizeof(*dc));
	dc->rx_desc = 1024;
	dc->tx_desc = 1024;
	dc->mbuf_bytes = 2048;
	dc->tx_drain_us = 20;
	dc->idle_sleep_us = 50;
	snprintf(dc->steering, sizeof(dc->steering), "auto");
	dc->zero_copy = true;
}

int pbox_dpdk_conf_load(struct pbox_confkit *c, const config_setting_t *g,
			struct pboxd_dpdk_cfg *dc)
{
	static const char *const keys[] = {
		"eal",         "addresses",     "rx_desc",  "tx_desc",   "mbuf_bytes",
		"tx_drain_us", "idle_sleep_us", "steering", "zero_copy", NULL
	};
	static const char *const steerings[] = { "auto", "flow", "rss", "software", NULL };
	const config_setting_t *s;
	int rc, steering = -1;

	if (!config_setting_is_group(g)) {
		return pbox_conf_bad(c, g, "must be a group { eal = [ ... ]; ... }");
	}
	if ((rc = pbox_conf_only(c, g, keys)) != 0 ||
	    (rc = pbox_conf_u32(c, g, "rx_desc", 32, 32768, &dc->rx_desc)) != 0 ||
	    (rc = pbox_conf_u32(c, g, "tx_desc", 32, 32768, &dc->tx_desc)) != 0 ||
	    (rc = pbox_conf_u32(c, g, "mbuf_bytes", 512, 65000, &dc->mbuf_bytes)) != 0 ||
	    (rc = pbox_conf_u32(c, g, "tx_drain_us", 0, 100000, &dc->tx_drain_us)) != 0 ||
	    (rc = pbox_conf_u32(c, g, "idle_sleep_us", 1, 100000, &dc->idle_sleep_us)) != 0 ||
	    (rc = pbox_conf_bool(c, g, "zero_copy", &dc->zero_copy)) != 0 ||
	    (rc = pbox_conf_choice(c, g, "steering", "steering", steerings, &steering)) != 0) {
		return rc;
	}
	if (steering >= 0) {
		snprintf(dc->steering, sizeof(dc->steering), "%s", steerings[steering]);
	}
	s = config_setting_get_member(g, "eal");
	if (s != NULL) {
		int n = config_setting_length(s);

		if (!config_setting_is_aggregate(s) || n > PBOXD_DPDK_MAX_EAL_ARGS) {
			return pbox_conf_bad(
				c, s,
				"must be a list of at most %d strings, e.g. [ \"--vdev\", "
				"\"net_af_xdp0,iface=eth1\" ]",
				PBOXD_DPDK_MAX_EAL_ARGS);
		}
		for (int i = 0; i < n; i++) {
			const char *v = config_setting_get_string_elem(s, i);

			if (v == NULL) {
				return pbox_conf_bad(c, s, "element %d is not a string", i);
			}
			dc->eal[dc->neal] = strdup(v);
			if (dc->eal[dc->neal] == NULL) {
				return pbox_conf_bad(c, s, "out of memory");
			}
			dc->neal++;
			dc->neal_owned++;
		}
	}
	s = config_setting_get_member(g, "addresses");
	if (s != NULL) {
		int n = config_setting_length(s);

		if (!config_setting_is_aggregate(s) || n < 1 || n > PBOXD_DPDK_MAX_ADDRS) {
			return pbox_conf_bad(c, s,
					     "must be a list of 1..%d IPv4 addresses, one per port",
					     PBOXD_DPDK_MAX_ADDRS);
		}
		for (int i = 0; i < n; i++) {
			const char *v = config_setting_get_string_elem(s, i);
			struct in_addr a;

			if (v == NULL || inet_pton(AF_INET, v, &a) != 1) {
				return pbox_conf_bad(
					c, s, "element %d is not an IPv4 address like \"10.0.0.1\"",
					i);
			}
			dc->addrs[i] = a.s_addr;
		}
		dc->naddrs = (unsigned)n;
	}
	return 0;
}

int pbox_dpdk_conf_check(const struct pboxd_dpdk_cfg *dc, const char *file, const char *data_addr,
			 char *err, size_t errlen)
{
	struct in_addr a;
	bool listed = dc->naddrs == 0;

	if (!pbox_dpdk_conf_built()) {
		snprintf(err, errlen,
			 "%s: transport 'dpdk' is not available: this pboxd was built without "
			 "DPDK (libdpdk-dev not found; -Ddpdk=enabled requires it)",
			 file);
		return -EINVAL;
	}
	if (inet_pton(AF_INET, data_addr, &a) != 1 || (ntohl(a.s_addr) >> 24) == 127 ||
	    a.s_addr == 0) {
		snprintf(err, errlen,
			 "%s: transport \"dpdk\" needs data_address to be the appliance's IPv4 "
			 "address on its DPDK port (got '%s')",
			 file, data_addr);
		return -EINVAL;
	}
	for (unsigned i = 0; i < dc->naddrs; i++) {
		listed |= dc->addrs[i] == a.s_addr;
	}
	if (!listed) {
		snprintf(err, errlen,
			 "%s: data_address %s (where workers are told to send) is not one of "
			 "dpdk.addresses",
			 file, data_addr);
		return -EINVAL;
	}
	return 0;
}

void pbox_dpdk_conf_free(struct pboxd_dpdk_cfg *dc)
{
	for (unsigned i = 0; i < dc->neal_owned; i++) {
		free(dc->eal[i]);
	}
	dc->neal = dc->neal_owned = 0;
}
