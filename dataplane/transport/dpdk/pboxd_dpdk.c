/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pboxd's "dpdk" transport: the DPDK data plane (dpdk.h) behind pboxd's transport ops.
 * Builds the EAL command line (the configuration's and the command line's EAL arguments,
 * plus --lcores from cores / cpus when they do not choose lcores themselves), opens the
 * ports and launches one lcore per data-plane core. Control thread only.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rte_ethdev.h>
#include <urcu-qsbr.h>

#include "common/log.h"
#include "dpdk.h"
#include "kernels/kernels.h"
#include "pboxd/dataplane.h"

struct glue {
	struct pbox_dpdk *d;
	bool eal;
	bool arenas; /* chunk arenas in DPDK memory (pbox_dpdk_arena_ops installed) */
	struct pbox_arena_ops arena_ops;
	char lcores[4096];
};

static enum pbox_dpdk_steering steering_of(const char *s)
{
	if (strcmp(s, "flow") == 0) {
		return PBOX_DPDK_STEER_FLOW;
	}
	if (strcmp(s, "rss") == 0) {
		return PBOX_DPDK_STEER_RSS;
	}
	if (strcmp(s, "software") == 0) {
		return PBOX_DPDK_STEER_SOFTWARE;
	}
	return PBOX_DPDK_STEER_AUTO;
}

/* "--lcores" value: the control thread (lcore 0) and unpinned data-plane lcores may run
 * on any CPU this process may use; pinned ones on their CPU. */
static int lcores_arg(const struct pboxd_config *cfg, char *buf, size_t len)
{
	cpu_set_t set;

	if (sched_getaffinity(0, sizeof(set), &set) != 0) {
		return -errno;
	}
	return pbox_dpdk_lcores_arg(&set, cfg->cpus, cfg->ncores, buf, len);
}

static void dpdk_stop(struct pboxd_dp *dp)
{
	struct glue *g = dp->xport;

	if (g == NULL) {
		return;
	}
	if (g->d != NULL) {
		/* The lcores first, then the call_rcu work (retirements) while the transport
		 * can still take it, then the ports (which frees every reply still held). */
		pbox_dpdk_stop(g->d);
		rcu_barrier();
	}
	pbox_dpdk_close(g->d);
	if (g->arenas) {
		/* Job states still alive (freed after the transport stops) keep their arenas
		 * in EAL memory: it stays mapped until the process exits, and so do the ops
		 * they free with. */
		pbox_job_set_arena_ops(NULL);
		dp->xport = NULL;
		return;
	}
	if (g->eal) {
		pbox_dpdk_eal_cleanup();
	}
	free(g);
	dp->xport = NULL;
}

static int dpdk_start(struct pboxd_dp *dp, const struct pboxd_config *cfg)
{
	static char prog[] = "pboxd", lcores_opt[] = "--lcores";
	char *argv[PBOXD_DPDK_MAX_EAL_ARGS + 4];
	struct pbox_core_stats *stats[PBOX_MAX_CORES];
	struct pbox_dpdk_cfg dc;
	struct glue *g;
	int argc = 0, rc;

	g = calloc(1, sizeof(*g));
	if (g == NULL) {
		return -ENOMEM;
	}
	dp->xport = g;
	argv[argc++] = prog;
	for (unsigned i = 0; i < cfg->dpdk.neal; i++) {
		argv[argc++] = cfg->dpdk.eal[i];
	}
	if (!pbox_dpdk_eal_has_cores(argc, argv)) {
		rc = lcores_arg(cfg, g->lcores, sizeof(g->lcores));
		if (rc != 0) {
			PBOX_LOG_ERR(MAIN, "cannot build the EAL lcore list: %s", strerror(-rc));
			return rc;
		}
		argv[argc++] = lcores_opt;
		argv[argc++] = g->lcores;
	}
	argv[argc] = NULL;
	rc = pbox_dpdk_eal_init(argc, argv);
	if (rc != 0) {
		return rc;
	}
	g->eal = true;

	memset(&dc, 0, sizeof(dc));
	dc.ncores = cfg->ncores;
	dc.base_port = cfg->base_port;
	if (cfg->dpdk.naddrs == 0) {
		struct in_addr a;

		inet_pton(AF_INET, cfg->data_addr, &a); /* checked by pboxd_config_check */
		dc.addrs[0] = a.s_addr;
		dc.naddrs = 1;
	} else {
		memcpy(dc.addrs, cfg->dpdk.addrs, sizeof(dc.addrs[0]) * cfg->dpdk.naddrs);
		dc.naddrs = cfg->dpdk.naddrs;
	}
	dc.mtu = cfg->mtu;
	dc.burst = PBOX_MIN(cfg->burst, PBOX_DPDK_MAX_BURST);
	dc.rx_desc = cfg->dpdk.rx_desc;
	dc.tx_desc = cfg->dpdk.tx_desc;
	dc.mbuf_bytes = cfg->dpdk.mbuf_bytes;
	dc.tx_drain_us = cfg->dpdk.tx_drain_us;
	dc.busy_poll = cfg->busy_poll;
	dc.idle_us = cfg->idle_us;
	dc.idle_sleep_us = cfg->dpdk.idle_sleep_us;
	dc.steering = steering_of(cfg->dpdk.steering);
	dc.zero_copy = cfg->dpdk.zero_copy;
	dc.dma_arenas = cfg->dpdk.zero_copy; /* installed below where a port needs them */
	for (uint32_t k = 0; k < cfg->ncores; k++) {
		stats[k] = &dp->cores[k].stats;
	}
	g->d = pbox_dpdk_open(&dc, &dp->tab, stats);
	if (g->d == NULL) {
		return -ENODEV;
	}
	for (uint16_t i = 0; i < pbox_dpdk_nports(g->d) && !g->arenas; i++) {
		if (pbox_dpdk_port_dma(g->d, i) && pbox_dpdk_port_zero_copy(g->d, i)) {
			/* Chunk memory the device can read: sessions start after this. */
			pbox_dpdk_arena_ops(&g->arena_ops,
					    rte_eth_dev_socket_id(pbox_dpdk_port_id(g->d, i)));
			pbox_job_set_arena_ops(&g->arena_ops);
			g->arenas = true;
		}
	}
	rc = pbox_dpdk_launch(g->d);
	if (rc != 0) {
		return rc;
	}
	PBOX_LOG_INFO(MAIN,
		      "%u data-plane core%s on dpdk (%u port%s), udp ports %u-%u, kernels %s, %s",
		      cfg->ncores, cfg->ncores == 1 ? "" : "s", pbox_dpdk_nports(g->d),
		      pbox_dpdk_nports(g->d) == 1 ? "" : "s", cfg->base_port,
		      cfg->base_port + cfg->ncores - 1, pbox_kernels_get()->isa,
		      cfg->busy_poll ? "busy polling" : "polling, sleeping when idle");
	return 0;
}

static void dpdk_retire(struct pboxd_dp *dp, struct pbox_job_state *st)
{
	struct glue *g = dp->xport;

	if (g != NULL && g->d != NULL) {
		pbox_dpdk_retire(g->d, st);
	}
}

static void dpdk_transport_stats(const struct pboxd_dp *dp, uint32_t core, uint64_t *tx_dropped,
				 uint64_t *rx_truncated)
{
	const struct glue *g = dp->xport;
	const struct pbox_dpdk_stats *s;

	*tx_dropped = *rx_truncated = 0;
	if (g == NULL || g->d == NULL) {
		return;
	}
	s = pbox_dpdk_core_stats(g->d, core);
	*tx_dropped = pbox_stat_read(&s->tx_dropped) + pbox_stat_read(&s->tx_nombuf);
	*rx_truncated = pbox_stat_read(&s->truncated);
}

/* Core k's counters in out[] (k == ncores: totals). */
static void read_counters(const struct pboxd_dp *dp, uint32_t k, uint64_t *out)
{
	const struct glue *g = dp->xport;

	memset(out, 0, PBOX_DPDK_NSTATS * sizeof(*out));
	for (uint32_t c = 0; c < dp->ncores; c++) {
		const uint64_t *in = (const uint64_t *)(const void *)pbox_dpdk_core_stats(g->d, c);

		if (k != dp->ncores && c != k) {
			continue;
		}
		for (size_t i = 0; i < PBOX_DPDK_NSTATS; i++) {
			out[i] += pbox_stat_read(&in[i]);
		}
	}
}

static json_t *counters_json(const uint64_t *v)
{
	json_t *o = json_object();

	for (size_t i = 0; i < PBOX_DPDK_NSTATS; i++) {
		json_object_set_new(o, pbox_dpdk_stat_names[i], json_integer((json_int_t)v[i]));
	}
	return o;
}

static json_t *dpdk_stats_json(const struct pboxd_dp *dp)
{
	const struct glue *g = dp->xport;
	json_t *o, *ports = json_array(), *cores = json_array();
	uint64_t v[PBOX_DPDK_NSTATS];

	if (g == NULL || g->d == NULL) {
		json_decref(ports);
		json_decref(cores);
		return NULL;
	}
	for (uint16_t i = 0; i < pbox_dpdk_nports(g->d); i++) {
		char name[RTE_ETH_NAME_MAX_LEN] = "";
		uint16_t id = pbox_dpdk_port_id(g->d, i);

		rte_eth_dev_get_name_by_port(id, name);
		json_array_append_new(
			ports,
			json_pack("{s:i, s:s, s:s, s:b}", "port", id, "name", name, "steering",
				  pbox_dpdk_steer_name(pbox_dpdk_steer_method(g->d, i)),
				  "zero_copy", pbox_dpdk_port_zero_copy(g->d, i)));
	}
	for (uint32_t k = 0; k < dp->ncores; k++) {
		read_counters(dp, k, v);
		json_array_append_new(cores, counters_json(v));
	}
	read_counters(dp, dp->ncores, v);
	o = json_pack("{s:s, s:o, s:o, s:o}", "name", "dpdk", "ports", ports, "cores", cores,
		      "totals", counters_json(v));
	return o;
}

static void dpdk_stats_print(FILE *f, const struct pboxd_dp *dp)
{
	const struct glue *g = dp->xport;
	uint64_t v[PBOX_DPDK_NSTATS];

	if (g == NULL || g->d == NULL) {
		return;
	}
	for (uint32_t k = 0; k <= dp->ncores; k++) {
		bool any = false;
		char label[16];

		read_counters(dp, k, v);
		if (k == dp->ncores) {
			snprintf(label, sizeof(label), "all");
		} else {
			snprintf(label, sizeof(label), "%u", k);
		}
		fprintf(f, "dpdk core %-4s", label);
		for (size_t i = 0; i < PBOX_DPDK_NSTATS; i++) {
			if (v[i] != 0) {
				fprintf(f, " %s=%" PRIu64, pbox_dpdk_stat_names[i], v[i]);
				any = true;
			}
		}
		fprintf(f, "%s\n", any ? "" : " (no traffic)");
	}
	fflush(f);
}

const struct pboxd_transport_ops pboxd_dpdk_transport = {
	.name = "dpdk",
	.start = dpdk_start,
	.stop = dpdk_stop,
	.retire = dpdk_retire,
	.transport_stats = dpdk_transport_stats,
	.stats_json = dpdk_stats_json,
	.stats_print = dpdk_stats_print,
};
