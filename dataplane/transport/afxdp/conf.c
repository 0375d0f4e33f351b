/* SPDX-License-Identifier: BSD-3-Clause */
/* The afxdp = { ... } group of pboxd's configuration (see conf.h). */
#include "transport/afxdp/conf.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

void pbox_afxdp_conf_defaults(struct pbox_afxdp_cfg *ac)
{
	memset(ac, 0, sizeof(*ac));
	ac->zero_copy = PBOX_AFXDP_ZC_AUTO;
	ac->frame_size = 4096;
	ac->frames = 8192;
	ac->fill_size = 4096;
	ac->comp_size = 2048;
	ac->rx_size = 2048;
	ac->tx_size = 2048;
	ac->busy_poll = false;
	ac->busy_poll_us = 20;
	ac->busy_poll_budget = 64;
}

const char *pbox_afxdp_zc_name(enum pbox_afxdp_zc zc)
{
	return zc == PBOX_AFXDP_ZC_ON ? "on" : zc == PBOX_AFXDP_ZC_OFF ? "off" : "auto";
}

static int ring_size(struct pbox_confkit *c, const config_setting_t *g, const char *name,
		     uint32_t *out)
{
	int rc = pbox_conf_u32(c, g, name, 64, 16384, out);

	if (rc == 0 && (*out & (*out - 1)) != 0) {
		return pbox_conf_bad(c, config_setting_get_member(g, name),
				     "must be a power of two (got %u)", *out);
	}
	return rc;
}

int pbox_afxdp_conf_load(struct pbox_confkit *c, const config_setting_t *g,
			 struct pbox_afxdp_cfg *ac)
{
	static const char *const keys[] = { "interface",  "queues",       "zero_copy",
					    "frame_size", "frames",       "fill_size",
					    "comp_size",  "rx_size",      "tx_size",
					    "busy_poll",  "busy_poll_us", "busy_poll_budget",
					    NULL };
	static const char *const zcs[] = { "auto", "on", "off", NULL };
	const config_setting_t *s;
	int rc, zc = -1;

	if (!config_setting_is_group(g)) {
		return pbox_conf_bad(c, g, "must be a group { interface = \"eth1\"; ... }");
	}
	if ((rc = pbox_conf_only(c, g, keys)) != 0 ||
	    (rc = pbox_conf_str(c, g, "interface", ac->interface, sizeof(ac->interface), NULL)) !=
		    0 ||
	    (rc = pbox_conf_choice(c, g, "zero_copy", "zero_copy", zcs, &zc)) != 0 ||
	    (rc = pbox_conf_u32(c, g, "frame_size", 2048, 4096, &ac->frame_size)) != 0 ||
	    (rc = pbox_conf_u32(c, g, "frames", 256, 1u << 20, &ac->frames)) != 0 ||
	    (rc = ring_size(c, g, "fill_size", &ac->fill_size)) != 0 ||
	    (rc = ring_size(c, g, "comp_size", &ac->comp_size)) != 0 ||
	    (rc = ring_size(c, g, "rx_size", &ac->rx_size)) != 0 ||
	    (rc = ring_size(c, g, "tx_size", &ac->tx_size)) != 0 ||
	    (rc = pbox_conf_bool(c, g, "busy_poll", &ac->busy_poll)) != 0 ||
	    (rc = pbox_conf_u32(c, g, "busy_poll_us", 0, 1000000, &ac->busy_poll_us)) != 0 ||
	    (rc = pbox_conf_u32(c, g, "busy_poll_budget", 1, 65535, &ac->busy_poll_budget)) != 0) {
		return rc;
	}
	if (zc >= 0) {
		ac->zero_copy = (enum pbox_afxdp_zc)zc;
	}
	if (ac->frame_size != 2048 && ac->frame_size != 4096) {
		return pbox_conf_bad(c, config_setting_get_member(g, "frame_size"),
				     "must be 2048 or 4096 (got %u)", ac->frame_size);
	}
	s = config_setting_get_member(g, "queues");
	if (s != NULL) {
		int n = config_setting_length(s);

		if (!config_setting_is_array(s) || n < 1 || n > PBOX_AFXDP_MAX_QUEUES) {
			return pbox_conf_bad(
				c, s, "must be a list of 1..%d RX queue numbers, e.g. [0, 1]",
				PBOX_AFXDP_MAX_QUEUES);
		}
		for (int i = 0; i < n; i++) {
			int v = config_setting_get_int_elem(s, i);

			if (v < 0 || v >= PBOX_AFXDP_MAX_QUEUES) {
				return pbox_conf_bad(c, s, "queue %d out of range 0..%d", v,
						     PBOX_AFXDP_MAX_QUEUES - 1);
			}
			ac->queues[i] = (uint32_t)v;
		}
		ac->nqueues = (uint32_t)n;
	}
	return 0;
}

int pbox_afxdp_conf_check(const struct pbox_afxdp_cfg *ac, const char *file, uint32_t ncores,
			  const char *data_addr, const char *xdp_interface, uint32_t mtu, char *err,
			  size_t errlen)
{
	struct in_addr a;
	uint32_t need;

	if (ac->interface[0] == '\0') {
		snprintf(err, errlen,
			 "%s: transport \"afxdp\" needs afxdp.interface (the data port, e.g. "
			 "afxdp = { interface = \"eth1\"; })",
			 file);
		return -EINVAL;
	}
	if (inet_pton(AF_INET, data_addr, &a) != 1 || a.s_addr == 0 ||
	    (ntohl(a.s_addr) >> 24) == 127) {
		snprintf(err, errlen,
			 "%s: transport \"afxdp\" needs data_address to be the IPv4 address of %s "
			 "(replies are sent from it; got '%s')",
			 file, ac->interface, data_addr);
		return -EINVAL;
	}
	if (xdp_interface[0] != '\0' && strcmp(xdp_interface, ac->interface) != 0) {
		snprintf(err, errlen,
			 "%s: xdp.interface '%s' differs from afxdp.interface '%s' (the AF_XDP "
			 "sockets receive from the filter on their own interface)",
			 file, xdp_interface, ac->interface);
		return -EINVAL;
	}
	if (ac->nqueues != 0 && ac->nqueues != ncores) {
		snprintf(err, errlen, "%s: afxdp.queues lists %u queues for %u cores (one each)",
			 file, ac->nqueues, ncores);
		return -EINVAL;
	}
	for (uint32_t i = 0; i < ac->nqueues; i++) {
		for (uint32_t j = 0; j < i; j++) {
			if (ac->queues[i] == ac->queues[j]) {
				snprintf(
					err, errlen,
					"%s: afxdp.queues: queue %u is given to cores %u and %u (a "
					"queue has one UMEM: one core)",
					file, ac->queues[i], j, i);
				return -EINVAL;
			}
		}
	}
	if (ac->nqueues == 0 && ncores > PBOX_AFXDP_MAX_QUEUES) {
		snprintf(err, errlen, "%s: afxdp: %u cores need more than %d queues", file, ncores,
			 PBOX_AFXDP_MAX_QUEUES);
		return -EINVAL;
	}
	if (ac->frames < ac->fill_size + 64) {
		snprintf(err, errlen,
			 "%s: afxdp.frames %u: must exceed fill_size %u by at least 64 (the rest "
			 "are the TX frames)",
			 file, ac->frames, ac->fill_size);
		return -EINVAL;
	}
	/* An Ethernet frame of mtu bytes (14 + mtu) in chained buffers. */
	need = (14 + mtu + ac->frame_size - 1) / ac->frame_size;
	if (need > 64) {
		snprintf(err, errlen, "%s: mtu %u needs %u afxdp buffers of %u bytes (at most 64)",
			 file, mtu, need, ac->frame_size);
		return -EINVAL;
	}
	return 0;
}
