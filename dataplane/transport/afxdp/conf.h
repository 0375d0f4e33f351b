/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The appliance's afxdp = { ... } group (pboxd --transport afxdp): parsed and checked here,
 * through the two hooks pboxd's config.c calls, so the transport's settings live with the
 * transport. Built in every pboxd (also without libxdp), so a file that names afxdp is
 * parsed everywhere and refused with a clear reason where the transport is not built.
 *
 *   afxdp = {
 *     interface = "eth1";      # the data port (its kernel IPv4 address is data_address)
 *     queues = [0, 1];         # RX queue of each core (default: core k on queue k); the
 *                              # device must steer port base_port + k to queue k
 *     zero_copy = "auto";      # "auto" (zero copy, else copy, logged), "on", "off"
 *     frame_size = 4096;       # UMEM frame: 2048 or 4096; larger frames are chained
 *     frames = 8192;           # UMEM frames per core (fill ring + TX)
 *     fill_size = 4096; comp_size = 2048; rx_size = 2048; tx_size = 2048;  # powers of 2
 *     busy_poll = false;       # SO_PREFER_BUSY_POLL + SO_BUSY_POLL on each socket, and
 *                              # a recvfrom per empty poll to drive the driver: for
 *                              # dedicated cores (measured slower on shared CPUs)
 *     busy_poll_us = 20; busy_poll_budget = 64;
 *   };
 *
 * Thread safety: the control thread's, like the rest of the configuration.
 */
#ifndef PBOX_AFXDP_CONF_H
#define PBOX_AFXDP_CONF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libconfig.h>

#include "common/confkit.h"

#define PBOX_AFXDP_MAX_QUEUES 64 /* nicfw's PBOX_XDP_MAX_RXQ */

enum pbox_afxdp_zc {
	PBOX_AFXDP_ZC_AUTO = 0, /* zero copy where the driver has it, else copy (logged) */
	PBOX_AFXDP_ZC_ON,       /* zero copy or fail */
	PBOX_AFXDP_ZC_OFF,      /* copy mode */
};

struct pbox_afxdp_cfg {
	char interface[16]; /* "": not configured */
	uint32_t queues[PBOX_AFXDP_MAX_QUEUES];
	uint32_t nqueues; /* 0: core k on queue k */
	enum pbox_afxdp_zc zero_copy;
	uint32_t frame_size;
	uint32_t frames;
	uint32_t fill_size, comp_size, rx_size, tx_size;
	bool busy_poll;
	uint32_t busy_poll_us;
	uint32_t busy_poll_budget;
};

/* The defaults shown above (interface ""). */
void pbox_afxdp_conf_defaults(struct pbox_afxdp_cfg *ac);

/* Read group g (the appliance's afxdp member) into ac. 0 or -EINVAL with c's error. */
int pbox_afxdp_conf_load(struct pbox_confkit *c, const config_setting_t *g,
			 struct pbox_afxdp_cfg *ac);

/* "auto", "on", "off". */
const char *pbox_afxdp_zc_name(enum pbox_afxdp_zc zc);

/*
 * Cross-checks once the transport is "afxdp" (after the command line): an interface, a
 * specific IPv4 data_address, one queue per core and no queue twice, xdp_interface (the
 * XDP filter's, "" = the same) naming the same device, frames that hold an Ethernet frame
 * of mtu bytes in at most 64 chained buffers. 0 or -EINVAL with "file: afxdp...: why".
 */
int pbox_afxdp_conf_check(const struct pbox_afxdp_cfg *ac, const char *file, uint32_t ncores,
			  const char *data_addr, const char *xdp_interface, uint32_t mtu, char *err,
			  size_t errlen);

#endif /* PBOX_AFXDP_CONF_H */
