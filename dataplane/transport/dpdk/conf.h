/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The appliance's dpdk = { ... } group (pboxd --transport dpdk): parsed and checked here,
 * through the hooks pboxd's config.c calls, so the transport's settings live with the
 * transport and config.c has no #ifdef for it. Built in every pboxd (also without DPDK),
 * so a file that names dpdk is parsed everywhere and transport "dpdk" is refused with the
 * reason where the transport is not built (pbox_dpdk_conf_check).
 *
 *   dpdk = {
 *     eal = [ "--vdev", "net_af_xdp0,iface=eth1" ];  # EAL arguments (pboxd adds
 *                                    # --lcores from cores/cpus unless given here; those
 *                                    # after -- on pboxd's command line are appended)
 *     addresses = [ "10.0.0.1" ];    # IPv4 per DPDK port (or one for all);
 *                                    # default: data_address, which must be listed
 *     rx_desc = 1024; tx_desc = 1024; mbuf_bytes = 2048;
 *     tx_drain_us = 20; idle_sleep_us = 50;
 *     steering = "auto";             # "auto", "flow", "rss" or "software"
 *     zero_copy = true;              # replies reference chunk memory
 *   };
 *
 * Thread safety: the control thread's, like the rest of the configuration. Ownership: the
 * file's eal strings (the first neal_owned) are strdup'ed and freed by
 * pbox_dpdk_conf_free; those appended from the command line are the caller's.
 */
#ifndef PBOX_DPDK_CONF_H
#define PBOX_DPDK_CONF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libconfig.h>

#include "common/confkit.h"

/* The appliance's dpdk = { ... } group (see above). */
#define PBOXD_DPDK_MAX_EAL_ARGS 128
#define PBOXD_DPDK_MAX_ADDRS    8
struct pboxd_dpdk_cfg {
	char *eal[PBOXD_DPDK_MAX_EAL_ARGS]; /* the file's (owned), then the command line's */
	unsigned neal;
	unsigned neal_owned;
	uint32_t addrs[PBOXD_DPDK_MAX_ADDRS]; /* network order; none: data_address */
	unsigned naddrs;
	uint32_t rx_desc;
	uint32_t tx_desc;
	uint32_t mbuf_bytes;
	uint32_t tx_drain_us;
	uint32_t idle_sleep_us;
	char steering[16];
	bool zero_copy;
};

/* Whether this pboxd was built with the DPDK transport (libdpdk found). */
bool pbox_dpdk_conf_built(void);

/* The defaults shown above (no EAL arguments, no addresses). */
void pbox_dpdk_conf_defaults(struct pboxd_dpdk_cfg *dc);

/*
 * Read group g (the appliance's dpdk member) into dc. 0, or -EINVAL with c's error
 * ("file:line: appliance.dpdk.x: why"); EAL strings read before an error stay owned by dc
 * (pbox_dpdk_conf_free).
 */
int pbox_dpdk_conf_load(struct pbox_confkit *c, const config_setting_t *g,
			struct pboxd_dpdk_cfg *dc);

/*
 * Checks once the transport is "dpdk" (after the command line): the transport is built,
 * data_addr is a specific IPv4 address and, if dpdk.addresses is set, one of them.
 * 0 or -EINVAL with "file: why" in err.
 */
int pbox_dpdk_conf_check(const struct pboxd_dpdk_cfg *dc, const char *file, const char *data_addr,
			 char *err, size_t errlen);

/* Frees the file's EAL strings; dc is left with no EAL arguments. */
void pbox_dpdk_conf_free(struct pboxd_dpdk_cfg *dc);

#endif /* PBOX_DPDK_CONF_H */
