/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Port set-up: capability negotiation, descriptors, NUMA-local mempools, one RX and one TX
 * queue per data-plane core, and steering (rte_flow, else RSS, else software hand-off).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <rte_bus.h>
#include <rte_dev.h>
#include <rte_ethdev.h>
#include <rte_flow.h>

#include "common/log.h"
#include "dpdk_impl.h"

unsigned pbox_dpdk_pool_size(unsigned nq, unsigned desc, unsigned burst, unsigned cache,
			     unsigned parked)
{
	unsigned long need = (unsigned long)nq * (desc + 2ul * burst + cache) + parked;
	unsigned long size = 1023;

	while (size < need) {
		size = size * 2 + 1;
	}
	return (unsigned)size;
}

const char *pbox_dpdk_steer_name(enum pbox_dpdk_steer_method m)
{
	switch (m) {
	case PBOX_DPDK_METHOD_SINGLE:
		return "single-queue";
	case PBOX_DPDK_METHOD_FLOW:
		return "rte_flow";
	case PBOX_DPDK_METHOD_RSS:
		return "rss+handoff";
	case PBOX_DPDK_METHOD_SOFTWARE:
		return "software-handoff";
	}
	return "?";
}

/* Log each offload bit asked for but not granted. */
static void log_reduced(const struct dpdk_port *p, const char *dir, uint64_t want, uint64_t got,
			const char *(*name)(uint64_t))
{
	uint64_t miss = want & ~got;

	while (miss != 0) {
		uint64_t bit = miss & -miss;

		PBOX_LOG_INFO(TRANSPORT,
			      "port %u (%s): %s offload %s not supported by the device: "
			      "done in software",
			      p->id, p->name, dir, name(bit));
		miss &= ~bit;
	}
}

static struct rte_mempool *make_pool(const struct dpdk_port *p, const char *what, unsigned n,
				     uint16_t priv, uint16_t room)
{
	char name[RTE_MEMPOOL_NAMESIZE];
	struct rte_mempool *mp;

	snprintf(name, sizeof(name), "pbox_%s_%u", what, p->id);
	mp = rte_pktmbuf_pool_create(name, n, PBOX_DPDK_CACHE, priv, room, p->socket);
	if (mp == NULL) {
		PBOX_LOG_ERR(TRANSPORT,
			     "port %u (%s): cannot create the %s mempool of %u mbufs x %u bytes on "
			     "socket %d: %s (reserve more hugepages, or fewer descriptors)",
			     p->id, p->name, what, n, (unsigned)room + priv, p->socket,
			     rte_strerror(rte_errno));
	}
	return mp;
}

/* Whether the device reads buffers by IOVA (a PCI function) rather than by virtual
 * address in this process (virtual devices: af_xdp, ring, memif, tap...). */
static bool needs_dma(const struct rte_eth_dev_info *info)
{
	const struct rte_bus *bus = info->device != NULL ? rte_dev_bus(info->device) : NULL;

	return bus != NULL && strcmp(rte_bus_name(bus), "vdev") != 0;
}

static int steer_flow(struct pbox_dpdk *d, struct dpdk_port *p)
{
	struct rte_flow_attr attr = { .ingress = 1 };
	struct rte_flow_item_ipv4 ip_spec = { 0 }, ip_mask = { 0 };
	struct rte_flow_item_udp udp_spec = { 0 }, udp_mask = { 0 };
	struct rte_flow_action_queue queue = { 0 };
	struct rte_flow_item pattern[] = {
		{ .type = RTE_FLOW_ITEM_TYPE_ETH },
		{ .type = RTE_FLOW_ITEM_TYPE_IPV4, .spec = &ip_spec, .mask = &ip_mask },
		{ .type = RTE_FLOW_ITEM_TYPE_UDP, .spec = &udp_spec, .mask = &udp_mask },
		{ .type = RTE_FLOW_ITEM_TYPE_END },
	};
	struct rte_flow_action actions[] = {
		{ .type = RTE_FLOW_ACTION_TYPE_QUEUE, .conf = &queue },
		{ .type = RTE_FLOW_ACTION_TYPE_END },
	};
	struct rte_flow_error err;

	ip_spec.hdr.dst_addr = p->addr;
	ip_mask.hdr.dst_addr = UINT32_MAX;
	udp_mask.hdr.dst_port = UINT16_MAX;
	/* Validate every rule before creating any, as flow_filtering does. */
	for (uint32_t k = 0; k < d->cfg.ncores; k++) {
		udp_spec.hdr.dst_port = htons((uint16_t)(d->cfg.base_port + k));
		queue.index = (uint16_t)k;
		memset(&err, 0, sizeof(err));
		if (rte_flow_validate(p->id, &attr, pattern, actions, &err) != 0) {
			PBOX_LOG_INFO(TRANSPORT,
				      "port %u (%s): rte_flow rule for core %u refused: %s", p->id,
				      p->name, k, err.message ? err.message : "no reason given");
			return -ENOTSUP;
		}
	}
	for (uint32_t k = 0; k < d->cfg.ncores; k++) {
		udp_spec.hdr.dst_port = htons((uint16_t)(d->cfg.base_port + k));
		queue.index = (uint16_t)k;
		memset(&err, 0, sizeof(err));
		p->flows[k] = rte_flow_create(p->id, &attr, pattern, actions, &err);
		if (p->flows[k] == NULL) {
			PBOX_LOG_WARN(TRANSPORT,
				      "port %u (%s): rte_flow rule for core %u validated but not "
				      "created: %s",
				      p->id, p->name, k,
				      err.message ? err.message : "no reason given");
			for (uint32_t j = 0; j < k; j++) {
				rte_flow_destroy(p->id, p->flows[j], &err);
				p->flows[j] = NULL;
			}
			p->nflows = 0;
			return -ENOTSUP;
		}
		p->nflows = k + 1;
	}
	return 0;
}

static int steer_setup(struct pbox_dpdk *d, struct dpdk_port *p, bool rss)
{
	enum pbox_dpdk_steering want = d->cfg.steering;

	if (d->cfg.ncores == 1) {
		p->steer = PBOX_DPDK_METHOD_SINGLE;
		return 0;
	}
	if (want == PBOX_DPDK_STEER_AUTO || want == PBOX_DPDK_STEER_FLOW) {
		if (steer_flow(d, p) == 0) {
			p->steer = PBOX_DPDK_METHOD_FLOW;
			return 0;
		}
		if (want == PBOX_DPDK_STEER_FLOW) {
			PBOX_LOG_ERR(
				TRANSPORT,
				"port %u (%s): steering = \"flow\" but the device does not take "
				"the rte_flow rules (use \"auto\" to fall back)",
				p->id, p->name);
			return -ENOTSUP;
		}
	}
	p->steer = rss ? PBOX_DPDK_METHOD_RSS : PBOX_DPDK_METHOD_SOFTWARE;
	return 0;
}

static int port_setup(struct pbox_dpdk *d, struct dpdk_port *p)
{
	const struct pbox_dpdk_cfg *cfg = &d->cfg;
	uint16_t nq = (uint16_t)cfg->ncores;
	uint32_t frame = RTE_ETHER_HDR_LEN + cfg->mtu + RTE_ETHER_CRC_LEN;
	struct rte_eth_conf conf;
	struct rte_eth_dev_info info;
	struct rte_eth_link link;
	uint64_t want_rx, want_tx;
	bool rss = false;
	unsigned n;
	int rc;

	memset(&conf, 0, sizeof(conf));
	rte_eth_dev_get_name_by_port(p->id, p->name);
	rc = rte_eth_dev_info_get(p->id, &info);
	if (rc != 0) {
		PBOX_LOG_ERR(TRANSPORT, "port %u (%s): cannot read device info: %s", p->id, p->name,
			     strerror(-rc));
		return rc;
	}
	if (info.max_rx_queues < nq || info.max_tx_queues < nq) {
		PBOX_LOG_ERR(TRANSPORT,
			     "port %u (%s, driver %s): the device has %u RX / %u TX queues but %u "
			     "data-plane cores need one of each (use fewer cores; net_af_xdp "
			     "takes queue_count=N)",
			     p->id, p->name, info.driver_name, info.max_rx_queues,
			     info.max_tx_queues, nq);
		return -ENOTSUP;
	}
	if (cfg->mtu > info.max_mtu || cfg->mtu < info.min_mtu) {
		PBOX_LOG_ERR(TRANSPORT,
			     "port %u (%s, driver %s): MTU %u is outside what the device takes "
			     "(%u..%u): set mtu accordingly",
			     p->id, p->name, info.driver_name, cfg->mtu, info.min_mtu,
			     info.max_mtu);
		return -ENOTSUP;
	}
	conf.rxmode.mtu = cfg->mtu;

	want_rx = RTE_ETH_RX_OFFLOAD_IPV4_CKSUM | RTE_ETH_RX_OFFLOAD_UDP_CKSUM;
	if (frame > cfg->mbuf_bytes) {
		want_rx |= RTE_ETH_RX_OFFLOAD_SCATTER;
	}
	conf.rxmode.offloads = want_rx & info.rx_offload_capa;
	log_reduced(p, "RX", want_rx & ~RTE_ETH_RX_OFFLOAD_SCATTER, conf.rxmode.offloads,
		    rte_eth_dev_rx_offload_name);
	if ((want_rx & RTE_ETH_RX_OFFLOAD_SCATTER) &&
	    !(conf.rxmode.offloads & RTE_ETH_RX_OFFLOAD_SCATTER)) {
		PBOX_LOG_ERR(TRANSPORT,
			     "port %u (%s): frames of up to %u bytes do not fit %u-byte mbufs and "
			     "the device cannot scatter them: set dpdk.mbuf_bytes >= %u or a "
			     "smaller mtu",
			     p->id, p->name, frame, cfg->mbuf_bytes, frame);
		return -ENOTSUP;
	}
	p->rx_ip_cksum = (conf.rxmode.offloads & RTE_ETH_RX_OFFLOAD_IPV4_CKSUM) != 0;
	p->rx_udp_cksum = (conf.rxmode.offloads & RTE_ETH_RX_OFFLOAD_UDP_CKSUM) != 0;

	want_tx = RTE_ETH_TX_OFFLOAD_IPV4_CKSUM;
	if (cfg->zero_copy) {
		want_tx |= RTE_ETH_TX_OFFLOAD_MULTI_SEGS;
	}
	conf.txmode.offloads = want_tx & info.tx_offload_capa;
	log_reduced(p, "TX", want_tx & ~RTE_ETH_TX_OFFLOAD_MULTI_SEGS, conf.txmode.offloads,
		    rte_eth_dev_tx_offload_name);
	p->tx_ip_cksum = (conf.txmode.offloads & RTE_ETH_TX_OFFLOAD_IPV4_CKSUM) != 0;
	p->zero_copy = (conf.txmode.offloads & RTE_ETH_TX_OFFLOAD_MULTI_SEGS) != 0;
	p->dma = needs_dma(&info) || cfg->force_dma;
	if (p->zero_copy && p->dma && !cfg->dma_arenas) {
		/* Chunk memory is ordinary anonymous memory, not registered with the
		 * device's IOMMU mapping: the device could not read it. */
		PBOX_LOG_INFO(TRANSPORT,
			      "port %u (%s): chunk memory is not mapped for device DMA: reply "
			      "payloads are copied",
			      p->id, p->name);
		p->zero_copy = false;
	} else if (p->zero_copy && p->dma) {
		PBOX_LOG_INFO(TRANSPORT,
			      "port %u (%s): chunk memory is DPDK memory: reply payloads are sent "
			      "by DMA from it (IOVA mode %s)",
			      p->id, p->name, rte_eal_iova_mode() == RTE_IOVA_VA ? "VA" : "PA");
	} else if (cfg->zero_copy && !p->zero_copy) {
		PBOX_LOG_INFO(TRANSPORT,
			      "port %u (%s): the device cannot send multi-segment frames: reply "
			      "payloads are copied into one buffer",
			      p->id, p->name);
	}

	if (nq > 1 && cfg->steering != PBOX_DPDK_STEER_SOFTWARE &&
	    cfg->steering != PBOX_DPDK_STEER_FLOW) {
		uint64_t want_hf = RTE_ETH_RSS_IPV4 | RTE_ETH_RSS_NONFRAG_IPV4_UDP;
		uint64_t hf = want_hf & info.flow_type_rss_offloads;

		if (hf != 0) {
			conf.rxmode.mq_mode = RTE_ETH_MQ_RX_RSS;
			conf.rx_adv_conf.rss_conf.rss_hf = hf;
			rss = true;
			if (hf != want_hf) {
				PBOX_LOG_INFO(TRANSPORT,
					      "port %u (%s): RSS reduced to hash types 0x%llx of "
					      "0x%llx",
					      p->id, p->name, (unsigned long long)hf,
					      (unsigned long long)want_hf);
			}
		} else {
			PBOX_LOG_INFO(TRANSPORT, "port %u (%s): the device has no IPv4/UDP RSS",
				      p->id, p->name);
		}
	}

	rc = rte_eth_dev_configure(p->id, nq, nq, &conf);
	if (rc != 0) {
		PBOX_LOG_ERR(TRANSPORT, "port %u (%s): configure with %u queues failed: %s", p->id,
			     p->name, nq, strerror(-rc));
		return rc;
	}
	p->nb_rxd = (uint16_t)cfg->rx_desc;
	p->nb_txd = (uint16_t)cfg->tx_desc;
	rc = rte_eth_dev_adjust_nb_rx_tx_desc(p->id, &p->nb_rxd, &p->nb_txd);
	if (rc != 0) {
		PBOX_LOG_ERR(TRANSPORT, "port %u (%s): cannot adjust descriptor counts: %s", p->id,
			     p->name, strerror(-rc));
		return rc;
	}
	if (p->nb_rxd != cfg->rx_desc || p->nb_txd != cfg->tx_desc) {
		PBOX_LOG_INFO(TRANSPORT,
			      "port %u (%s): descriptors adjusted by the device to %u RX / %u TX "
			      "(asked %u / %u)",
			      p->id, p->name, p->nb_rxd, p->nb_txd, cfg->rx_desc, cfg->tx_desc);
	}
	p->socket = rte_eth_dev_socket_id(p->id);
	if (p->socket < 0) {
		p->socket = SOCKET_ID_ANY;
	}

	/* RX mbufs also carry ARP replies (answered in place) in the TX ring, and wait in
	 * the software hand-off rings of the other cores. */
	n = pbox_dpdk_pool_size(nq, (unsigned)p->nb_rxd + p->nb_txd, cfg->burst, PBOX_DPDK_CACHE,
				nq > 1 ? nq * PBOX_DPDK_INBOX : 0);
	p->rx_pool = make_pool(p, "rx", n, 0, (uint16_t)(RTE_PKTMBUF_HEADROOM + cfg->mbuf_bytes));
	/* Each core also keeps a burst allocated ahead (tx.c's stash) and, of payload
	 * mbufs, up to PBOX_DPDK_FAN shared between workers' replies. */
	n = pbox_dpdk_pool_size(nq, p->nb_txd, cfg->burst, PBOX_DPDK_CACHE,
				nq * (cfg->burst + PBOX_DPDK_FAN));
	p->hdr_pool = make_pool(
		p, "hdr", n, 0,
		(uint16_t)(RTE_PKTMBUF_HEADROOM + (p->zero_copy ? RTE_CACHE_LINE_SIZE * 2
								: RTE_ETHER_HDR_LEN + cfg->mtu)));
	if (p->zero_copy) {
		p->ext_pool = make_pool(
			p, "ext", n, RTE_ALIGN(sizeof(struct dpdk_tx_ref), RTE_MBUF_PRIV_ALIGN), 0);
	}
	if (p->zero_copy && p->dma) {
		/* Rarely used: payloads outside DPDK memory (a job created before the arena
		 * allocator was installed). */
		p->copy_pool = make_pool(
			p, "copy",
			pbox_dpdk_pool_size(1, cfg->burst, cfg->burst, PBOX_DPDK_CACHE, 0), 0,
			(uint16_t)(RTE_PKTMBUF_HEADROOM + RTE_ETHER_HDR_LEN + cfg->mtu));
	}
	if (p->rx_pool == NULL || p->hdr_pool == NULL || (p->zero_copy && p->ext_pool == NULL) ||
	    (p->zero_copy && p->dma && p->copy_pool == NULL)) {
		return -ENOMEM;
	}

	for (uint16_t q = 0; q < nq; q++) {
		struct rte_eth_rxconf rxc = info.default_rxconf;
		struct rte_eth_txconf txc = info.default_txconf;

		rxc.offloads = conf.rxmode.offloads;
		txc.offloads = conf.txmode.offloads;
		rc = rte_eth_rx_queue_setup(p->id, q, p->nb_rxd, (unsigned)p->socket, &rxc,
					    p->rx_pool);
		if (rc != 0) {
			PBOX_LOG_ERR(TRANSPORT, "port %u (%s): RX queue %u set-up failed: %s",
				     p->id, p->name, q, strerror(-rc));
			return rc;
		}
		rc = rte_eth_tx_queue_setup(p->id, q, p->nb_txd, (unsigned)p->socket, &txc);
		if (rc != 0) {
			PBOX_LOG_ERR(TRANSPORT, "port %u (%s): TX queue %u set-up failed: %s",
				     p->id, p->name, q, strerror(-rc));
			return rc;
		}
	}
	rc = rte_eth_dev_start(p->id);
	if (rc != 0) {
		PBOX_LOG_ERR(TRANSPORT, "port %u (%s): cannot start the device: %s", p->id, p->name,
			     strerror(-rc));
		return rc;
	}
	p->started = true;
	rte_eth_macaddr_get(p->id, &p->mac);
	rc = steer_setup(d, p, rss);
	if (rc != 0) {
		return rc;
	}
	memset(&link, 0, sizeof(link));
	rte_eth_link_get_nowait(p->id, &link);
	{
		char mac[RTE_ETHER_ADDR_FMT_SIZE], ip[INET_ADDRSTRLEN];

		rte_ether_format_addr(mac, sizeof(mac), &p->mac);
		inet_ntop(AF_INET, &p->addr, ip, sizeof(ip));
		PBOX_LOG_INFO(
			TRANSPORT,
			"port %u (%s, driver %s): %s %s, %u queue pair%s x %u/%u descriptors, "
			"socket %d, link %s, steering: %s, replies: %s",
			p->id, p->name, info.driver_name, mac, ip, nq, nq == 1 ? "" : "s",
			p->nb_rxd, p->nb_txd, p->socket, link.link_status ? "up" : "down",
			pbox_dpdk_steer_name(p->steer),
			p->zero_copy ? "zero-copy (external buffers)" : "copied");
	}
	return 0;
}

int pbox_dpdk_ports_open(struct pbox_dpdk *d)
{
	uint16_t pid;
	int rc;

	d->nports = 0;
	RTE_ETH_FOREACH_DEV(pid)
	{
		if (d->nports == PBOX_DPDK_MAX_PORTS) {
			PBOX_LOG_ERR(TRANSPORT,
				     "dpdk: more than %u ports; allow only the ports to use "
				     "(-a / --vdev)",
				     PBOX_DPDK_MAX_PORTS);
			return -E2BIG;
		}
		d->ports[d->nports].id = pid;
		d->nports++;
	}
	if (d->nports == 0) {
		PBOX_LOG_ERR(TRANSPORT,
			     "dpdk: no usable port: name one with -a PCI_ADDRESS (bound to "
			     "vfio-pci) or --vdev (e.g. net_af_xdp0,iface=eth1) in the EAL "
			     "arguments; a device named there was refused by its driver if the EAL "
			     "said so above");
		return -ENODEV;
	}
	if (d->cfg.naddrs != 1 && d->cfg.naddrs != d->nports) {
		PBOX_LOG_ERR(TRANSPORT,
			     "dpdk: %u ports but %u addresses: give one address for every port, or "
			     "one for all",
			     d->nports, d->cfg.naddrs);
		return -EINVAL;
	}
	for (uint16_t i = 0; i < d->nports; i++) {
		d->ports[i].addr = d->cfg.addrs[d->cfg.naddrs == 1 ? 0 : i];
		rc = port_setup(d, &d->ports[i]);
		if (rc != 0) {
			return rc;
		}
	}
	return 0;
}

void pbox_dpdk_ports_close(struct pbox_dpdk *d)
{
	for (uint16_t i = 0; i < d->nports; i++) {
		struct dpdk_port *p = &d->ports[i];
		struct rte_flow_error err;

		for (uint32_t k = 0; k < p->nflows; k++) {
			rte_flow_destroy(p->id, p->flows[k], &err);
		}
		p->nflows = 0;
		if (p->started) {
			rte_eth_dev_stop(p->id);
			p->started = false;
		}
		rte_eth_dev_close(p->id);
		rte_mempool_free(p->rx_pool);
		rte_mempool_free(p->hdr_pool);
		rte_mempool_free(p->ext_pool);
		rte_mempool_free(p->copy_pool);
		p->rx_pool = p->hdr_pool = p->ext_pool = p->copy_pool = NULL;
	}
	d->nports = 0;
}
