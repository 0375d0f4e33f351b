/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pboxd's kernel-UDP transport: a module of the core loop (core/loop.h) behind
 * struct pboxd_transport_ops (dataplane.h). One pinned thread per core, each with its own
 * socket (base_port + core); the per-core state is struct udp_core, in
 * pboxd_core.xport_core. Threading as in dataplane.h: start / stop / the counters from the
 * control thread, the hooks on the core's thread (udp_wake from stop).
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "core/loop.h"
#include "core/pace.h"
#include "pboxd/dataplane.h"
#include "transport/shm/pboxd_shm.h"
#include "transport/udp/udp.h"

/* ---- the kernel-UDP transport: a module of the core loop (core/loop.h) --------------- */

/* One core's UDP state: its socket, and the burst a wait received for the next rx. */
struct udp_core {
	struct pbox_loop loop;
	struct pbox_udp *udp;
	struct pbox_pace *pace; /* core/pace.h; NULL unless PBOX_PACE=1 */
	struct pboxd_core *core;
	pthread_t thread;
	bool started;
	bool waited;  /* pkts[0..nwaited) came from udp_wait: rx hands them on */
	bool drained; /* the last receive emptied the socket: the next pass waits at once */
	unsigned nwaited;
	struct pbox_rx_pkt pkts[PBOX_UDP_MAX_BURST];
};

static enum pbox_poll_rc udp_rx(void *xc, struct pbox_loop *l)
{
	struct udp_core *u = xc;
	struct pbox_engine *e = l->engine;
	const struct pbox_jobtab *tab;
	unsigned n;

	if (u->waited) {
		u->waited = false;
		n = u->nwaited;
	} else if (u->drained && !l->busy_poll) {
		/* The socket was empty after the last receive: a second one now would come
		 * back empty (a system call per burst); the loop's wait is the next receive,
		 * and it returns at once with what arrived meanwhile. */
		u->drained = false;
		return PBOX_POLL_IDLE;
	} else {
		n = pbox_udp_rx_burst(u->udp, u->pkts, PBOX_UDP_MAX_BURST);
	}
	if (n == 0) {
		return PBOX_POLL_IDLE;
	}
	u->drained = !pbox_udp_rx_more(u->udp);
	tab = pbox_loop_table(l);
	for (unsigned i = 0; i < n; i++) {
		if (i + 1 < n) {
			/* the next header arrives in cache while this one is handled */
			__builtin_prefetch(u->pkts[i + 1].data);
		}
		if (u->pace != NULL) {
			pbox_pace_rx(u->pace, &u->pkts[i].from, u->pkts[i].len);
		}
		pbox_engine_rx(e, tab, u->pkts[i].data, u->pkts[i].len, &u->pkts[i].from);
	}
	pbox_engine_flush(e);
	return PBOX_POLL_BUSY;
}

/* Nothing queued: block in the receive itself for the first datagram, then drain. With
 * kernel UDP a wake-up costs less than polling: every empty recvmmsg is a system call, and
 * on shared CPUs the spinning takes the time the senders need (measured in perf/README.md
 * section 4). */
static bool udp_wait(void *xc, int timeout_ms)
{
	struct udp_core *u = xc;

	if (u->pace != NULL && pbox_pace_backlog(u->pace) > 0) {
		/* Results are waiting for their departure: wait for input only until then
		 * (short waits spin: the next pass releases them). */
		uint64_t next = pbox_pace_poll(u->pace);

		if (next != UINT64_MAX && next >= 20000) {
			struct pollfd pfd = { .fd = pbox_udp_fd(u->udp), .events = POLLIN };
			struct timespec ts = { (time_t)(next / 1000000000u),
					       (long)(next % 1000000000u) };

			ppoll(&pfd, 1, &ts, NULL);
		}
		return true;
	}
	u->nwaited = pbox_udp_rx_wait(u->udp, u->pkts, PBOX_UDP_MAX_BURST, timeout_ms);
	u->waited = true;
	return true;
}

/* The same with local workers' rings on the core: wait for the socket or their doorbell,
 * then the rx pass receives without blocking. */
static bool udp_wait_fd(void *xc, int timeout_ms, int fd)
{
	struct udp_core *u = xc;

	return pbox_udp_wait(u->udp, timeout_ms, fd) >= 0;
}

static void udp_wake(void *xc)
{
	struct udp_core *u = xc;

	if (u->udp != NULL) {
		pbox_udp_wake(u->udp); /* a core blocked in its receive */
	}
}

/* Release the results whose departure is due (core/pace.h). */
static void udp_tx(void *xc, struct pbox_loop *l, enum pbox_poll_rc rx_rc)
{
	struct udp_core *u = xc;

	(void)l;
	(void)rx_rc;
	if (u->pace != NULL && pbox_pace_backlog(u->pace) > 0) {
		pbox_pace_poll(u->pace);
	}
}

/* When the next paced result is due: the loop's waits end then (with local workers' rings
 * on the core it waits in udp_wait_fd, which does not look at the pacer). */
static uint64_t udp_tx_due(void *xc)
{
	struct udp_core *u = xc;

	return u->pace != NULL && pbox_pace_backlog(u->pace) > 0 ? pbox_pace_poll(u->pace)
								 : UINT64_MAX;
}

static const struct pbox_loop_ops udp_loop_ops = {
	.rx = udp_rx,
	.tx = udp_tx,
	.tx_due_ns = udp_tx_due,
	.wait = udp_wait,
	.wait_fd = udp_wait_fd,
	.wake = udp_wake,
};

static void *udp_core_main(void *arg)
{
	struct udp_core *u = arg;

	pbox_loop_run(&u->loop);
	return NULL;
}

/* Result pacing only with PBOX_PACE=1: measured in netlab (perf/netlab/README.md, "Result
 * pacing in the appliance"), it does not help on a quiet machine and, with the CPUs
 * contended, it caused the switch drops it is meant to prevent (1.45x against 1.08x). */
static bool pace_on(void)
{
	const char *v = getenv("PBOX_PACE");

	return v != NULL && strcmp(v, "1") == 0;
}

/* Kernel pacing of results (transport/udp/kpace.h), PBOX_KPACE=1: one departure-time
 * timeline per worker at PBOX_KPACE_RATE (bit/s, "1g"; each worker's link rate). pboxd has
 * no per-worker congestion controller, and the rate its loop pacer learns from a worker's
 * arrivals held results below the link rate (perf/netlab/README.md), so the rate is the
 * operator's: a burst of results (a backlog handled after the core was descheduled) leaves
 * towards each worker at no more than its link takes. Returns 0 (*Bps 0: off) or -EINVAL. */
static int kpace_rate(uint64_t *Bps)
{
	const char *r = getenv("PBOX_KPACE_RATE");

	*Bps = 0;
	if (!pbox_kpace_env_on()) {
		return 0;
	}
	if (r == NULL) {
		PBOX_LOG_WARN(MAIN, "kernel pacing off: PBOX_KPACE=1 needs PBOX_KPACE_RATE (each "
				    "worker's link rate in bit/s, e.g. 1g)");
		return 0;
	}
	if (pbox_kpace_parse_rate(r, Bps) != 0) {
		PBOX_LOG_ERR(MAIN,
			     "PBOX_KPACE_RATE '%s': expected a rate in bit/s (1000000000, "
			     "1g, 200m, 500k)",
			     r);
		return -EINVAL;
	}
	return 0;
}

static int udp_start(struct pboxd_dp *dp, const struct pboxd_config *cfg)
{
	int rc = 0;
	uint64_t kpace_Bps;

	if (kpace_rate(&kpace_Bps) != 0) {
		return -EINVAL;
	}

	if (cfg->shm.enabled &&
	    (cfg->fault.drop > 0 || cfg->fault.dup > 0 || cfg->fault.reorder > 0)) {
		/* Fault injection is the UDP socket's: with it, every worker stays on UDP. */
		PBOX_LOG_INFO(MAIN,
			      "shm: not offered to local workers while fault injection is on");
	} else if (cfg->shm.enabled) {
		dp->shm = pboxd_shm_create(&cfg->shm, cfg->ncores, &dp->tab);
		if (dp->shm == NULL) {
			return -EINVAL;
		}
	}
	for (uint32_t k = 0; k < cfg->ncores; k++) {
		struct pboxd_core *c = &dp->cores[k];
		struct udp_core *u;
		struct pbox_udp_cfg ucfg = {
			.addr = cfg->data_addr,
			.port = (uint16_t)(cfg->base_port + k),
			.burst = cfg->burst,
			.fault = cfg->fault,
			.kpace = kpace_Bps != 0,
			.kpace_per_dst = true,
			.kpace_rate_Bps = kpace_Bps,
		};

		u = aligned_alloc(PBOX_CACHE_LINE, (sizeof(*u) + PBOX_CACHE_LINE - 1) /
							   PBOX_CACHE_LINE * PBOX_CACHE_LINE);
		if (u == NULL) {
			PBOX_LOG_ERR(MAIN, "core %u: out of memory for its UDP state", k);
			return -ENOMEM;
		}
		memset(u, 0, sizeof(*u));
		u->core = c;
		u->loop = (struct pbox_loop){
			.ops = &udp_loop_ops,
			.xc = u,
			.engine = &c->engine,
			.tab = &dp->tab,
			.busy_poll = cfg->busy_poll,
			.wait_ms = 100,
		};
		c->xport_core = u;
		/* Each core's fault stream is seeded differently but reproducibly. */
		ucfg.fault.seed = cfg->fault.seed * 1000003u + k;
		u->udp = pbox_udp_open(&ucfg);
		if (u->udp == NULL) {
			PBOX_LOG_ERR(MAIN, "core %u: cannot open its UDP port %s:%u (see above)", k,
				     cfg->data_addr, cfg->base_port + k);
			return -EADDRINUSE;
		}
		c->engine.tx = &pbox_udp_tx_ops;
		c->engine.tx_ctx = u->udp;
		if (pace_on()) {
			struct pbox_pace_cfg pc = { .inner = &pbox_udp_tx_ops,
						    .inner_ctx = u->udp };

			u->pace = pbox_pace_create(&pc);
			if (u->pace == NULL) {
				return -ENOMEM;
			}
			c->engine.tx = &pbox_pace_tx_ops;
			c->engine.tx_ctx = u->pace;
		}
		if (dp->shm != NULL) {
			pboxd_shm_core_attach(dp->shm, k, &u->loop);
		}
		{
			char info[320];

			PBOX_LOG_INFO(MAIN, "core %u: udp port %u: %s", k, pbox_udp_port(u->udp),
				      pbox_udp_info_str(u->udp, info, sizeof(info)));
		}
	}
	for (uint32_t k = 0; k < cfg->ncores; k++) {
		struct pboxd_core *c = &dp->cores[k];
		struct udp_core *u = c->xport_core;

		rc = pthread_create(&u->thread, NULL, udp_core_main, u);
		if (rc != 0) {
			PBOX_LOG_ERR(MAIN, "core %u: cannot start its thread: %s", k, strerror(rc));
			return -rc;
		}
		u->started = true;
		if (c->cpu >= 0) {
			cpu_set_t set;

			CPU_ZERO(&set);
			CPU_SET(c->cpu, &set);
			rc = pthread_setaffinity_np(u->thread, sizeof(set), &set);
			if (rc != 0) {
				PBOX_LOG_ERR(MAIN, "core %u: cannot pin to CPU %d: %s", k, c->cpu,
					     strerror(rc));
				return -rc;
			}
		}
		{
			char name[16];

			snprintf(name, sizeof(name), "pbox-core%u", k);
			pthread_setname_np(u->thread, name);
		}
	}
	PBOX_LOG_INFO(MAIN, "%u data-plane core%s on udp %s:%u-%u, kernels %s, %s, %s", cfg->ncores,
		      cfg->ncores == 1 ? "" : "s", cfg->data_addr, cfg->base_port,
		      cfg->base_port + cfg->ncores - 1, pbox_kernels_get()->isa,
		      cfg->busy_poll ? "busy polling" : "blocking in recvmmsg when idle",
		      pace_on() ? "results paced per worker (PBOX_PACE=1)" : "results not paced");
	return dp->shm != NULL ? pboxd_shm_start(dp->shm) : 0;
}

static void udp_stop(struct pboxd_dp *dp)
{
	uint64_t one = 1;

	__atomic_store_n(&dp->stop, true, __ATOMIC_RELEASE);
	if (write(dp->stop_fd, &one, sizeof(one)) < 0) {
		/* cores also wake on their receive timeout */
	}
	for (uint32_t k = 0; k < dp->ncores; k++) {
		if (dp->cores[k].xport_core != NULL) {
			pbox_loop_stop(&((struct udp_core *)dp->cores[k].xport_core)->loop);
		}
	}
	for (uint32_t k = 0; k < dp->ncores; k++) {
		struct udp_core *u = dp->cores[k].xport_core;

		if (u != NULL && u->started) {
			pthread_join(u->thread, NULL);
			u->started = false;
		}
	}
	pboxd_shm_destroy(dp->shm); /* the cores are joined */
	dp->shm = NULL;
	for (uint32_t k = 0; k < dp->ncores; k++) {
		struct udp_core *u = dp->cores[k].xport_core;

		if (u != NULL) {
			pbox_pace_destroy(u->pace); /* sends what it still holds */
			pbox_udp_close(u->udp);
			free(u);
			dp->cores[k].xport_core = NULL;
		}
	}
}

static void udp_transport_stats(const struct pboxd_dp *dp, uint32_t core, uint64_t *tx_dropped,
				uint64_t *rx_truncated)
{
	const struct udp_core *u = dp->cores[core].xport_core;
	const struct pbox_udp_stats *s;

	if (u == NULL || u->udp == NULL) {
		*tx_dropped = *rx_truncated = 0;
		return;
	}
	s = pbox_udp_stats(u->udp);
	*tx_dropped = __atomic_load_n(&s->tx_dropped, __ATOMIC_RELAXED);
	*rx_truncated = __atomic_load_n(&s->rx_truncated, __ATOMIC_RELAXED);
}

/* The receive and send counters of one core, or of all (core == ncores), read relaxed. */
static void udp_counters(const struct pboxd_dp *dp, uint32_t core, struct pbox_udp_stats *out)
{
	memset(out, 0, sizeof(*out));
	for (uint32_t k = 0; k < dp->ncores; k++) {
		const struct udp_core *u = dp->cores[k].xport_core;
		const struct pbox_udp_stats *s;

		if ((core != dp->ncores && k != core) || u == NULL || u->udp == NULL) {
			continue;
		}
		s = pbox_udp_stats(u->udp);
		out->rx_pkts += __atomic_load_n(&s->rx_pkts, __ATOMIC_RELAXED);
		out->rx_calls += __atomic_load_n(&s->rx_calls, __ATOMIC_RELAXED);
		out->rx_empty += __atomic_load_n(&s->rx_empty, __ATOMIC_RELAXED);
		out->rx_msgs += __atomic_load_n(&s->rx_msgs, __ATOMIC_RELAXED);
		out->rx_gro_msgs += __atomic_load_n(&s->rx_gro_msgs, __ATOMIC_RELAXED);
		out->tx_pkts += __atomic_load_n(&s->tx_pkts, __ATOMIC_RELAXED);
		out->tx_calls += __atomic_load_n(&s->tx_calls, __ATOMIC_RELAXED);
		out->tx_msgs += __atomic_load_n(&s->tx_msgs, __ATOMIC_RELAXED);
		out->tx_gso_msgs += __atomic_load_n(&s->tx_gso_msgs, __ATOMIC_RELAXED);
	}
}

static json_t *udp_counters_json(const struct pbox_udp_stats *s)
{
	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:I, s:I, s:I}", "rx_pkts",
			 (json_int_t)s->rx_pkts, "rx_calls", (json_int_t)s->rx_calls, "rx_empty",
			 (json_int_t)s->rx_empty, "rx_msgs", (json_int_t)s->rx_msgs, "rx_gro_msgs",
			 (json_int_t)s->rx_gro_msgs, "rx_pkts_per_call",
			 s->rx_calls ? (double)s->rx_pkts / (double)s->rx_calls : 0.0, "tx_pkts",
			 (json_int_t)s->tx_pkts, "tx_calls", (json_int_t)s->tx_calls, "tx_msgs",
			 (json_int_t)s->tx_msgs, "tx_gso_msgs", (json_int_t)s->tx_gso_msgs);
}

/* The result pacers' counters summed over cores (core/pace.h), read relaxed; null when
 * pacing is off (the default; PBOX_PACE=1 turns it on). */
static json_t *pace_json(const struct pboxd_dp *dp)
{
	uint64_t direct = 0, paced = 0, forced = 0, samples = 0, backlog = 0;
	bool any = false;
	json_t *rates = json_array();

	for (uint32_t k = 0; k < dp->ncores; k++) {
		const struct udp_core *u = dp->cores[k].xport_core;
		const struct pbox_pace_stats *ps;

		if (u == NULL || u->pace == NULL) {
			continue;
		}
		any = true;
		ps = pbox_pace_stats(u->pace);
		direct += __atomic_load_n(&ps->sent_direct, __ATOMIC_RELAXED);
		paced += __atomic_load_n(&ps->sent_paced, __ATOMIC_RELAXED);
		forced += __atomic_load_n(&ps->forced, __ATOMIC_RELAXED);
		samples += __atomic_load_n(&ps->samples, __ATOMIC_RELAXED);
		backlog = PBOX_MAX(backlog, __atomic_load_n(&ps->max_backlog, __ATOMIC_RELAXED));
		{
			uint64_t r[64];
			uint32_t n = pbox_pace_rates(u->pace, r, 64);

			for (uint32_t i = 0; i < n; i++) {
				json_array_append_new(rates, json_integer((json_int_t)r[i]));
			}
		}
	}
	if (!any) {
		json_decref(rates);
		return json_null();
	}
	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:o}", "sent_direct", (json_int_t)direct,
			 "sent_paced", (json_int_t)paced, "forced", (json_int_t)forced,
			 "rate_samples", (json_int_t)samples, "max_backlog", (json_int_t)backlog,
			 "rates_Bps", rates);
}

/* Kernel pacing (transport/udp/kpace.h): whether it is on, whether the egress honours it,
 * the socket's SO_TXTIME clock as getsockopt reads it (core 0), and the departure-time
 * counters summed over cores, read relaxed. */
static json_t *kpace_json(const struct pboxd_dp *dp)
{
	struct pbox_udp_info info = { .txtime_clockid = -1 };
	uint64_t stamped = 0, delayed = 0, capped = 0, shared = 0, lead = 0;

	for (uint32_t k = 0; k < dp->ncores; k++) {
		const struct udp_core *u = dp->cores[k].xport_core;
		const struct pbox_kpace_stats *ks;

		if (u == NULL || u->udp == NULL) {
			continue;
		}
		if (k == 0) {
			pbox_udp_info(u->udp, &info);
		}
		ks = pbox_udp_kpace_stats(u->udp);
		stamped += __atomic_load_n(&ks->stamped, __ATOMIC_RELAXED);
		delayed += __atomic_load_n(&ks->delayed, __ATOMIC_RELAXED);
		capped += __atomic_load_n(&ks->capped, __ATOMIC_RELAXED);
		shared += __atomic_load_n(&ks->shared, __ATOMIC_RELAXED);
		lead = PBOX_MAX(lead, __atomic_load_n(&ks->lead_max_ns, __ATOMIC_RELAXED));
	}
	return json_pack("{s:b, s:i, s:i, s:I, s:I, s:I, s:I, s:f}", "on", info.kpace, "egress_fq",
			 info.kpace_egress, "txtime_clockid", info.txtime_clockid, "stamped",
			 (json_int_t)stamped, "delayed", (json_int_t)delayed, "capped",
			 (json_int_t)capped, "shared", (json_int_t)shared, "lead_max_ms",
			 (double)lead / 1e6);
}

static json_t *udp_stats_json(const struct pboxd_dp *dp)
{
	json_t *cores = json_array();
	struct pbox_udp_stats s;
	struct pbox_udp_info info = { 0 };

	for (uint32_t k = 0; k < dp->ncores; k++) {
		udp_counters(dp, k, &s);
		json_array_append_new(cores, udp_counters_json(&s));
	}
	if (dp->ncores > 0 && dp->cores[0].xport_core != NULL) {
		const struct udp_core *u = dp->cores[0].xport_core;

		if (u->udp != NULL) {
			pbox_udp_info(u->udp, &info);
		}
	}
	udp_counters(dp, dp->ncores, &s);
	return json_pack("{s:s, s:b, s:b, s:i, s:i, s:o, s:o, s:o, s:o, s:o*}", "name", "udp",
			 "gso", info.gso, "gro", info.gro, "rcvbuf", info.rcvbuf, "sndbuf",
			 info.sndbuf, "cores", cores, "totals", udp_counters_json(&s), "pace",
			 pace_json(dp), "kpace", kpace_json(dp), "shm",
			 dp->shm != NULL ? pboxd_shm_stats_json(dp->shm) : NULL);
}

static void udp_stats_print(FILE *f, const struct pboxd_dp *dp)
{
	struct pbox_udp_stats s;

	udp_counters(dp, dp->ncores, &s);
	fprintf(f,
		"udp: %" PRIu64 " datagrams in %" PRIu64 " recvmmsg calls (%.2f per call, %" PRIu64
		" empty), %" PRIu64 " GRO messages; %" PRIu64 " datagrams in %" PRIu64
		" sendmmsg calls, %" PRIu64 " GSO messages\n",
		s.rx_pkts, s.rx_calls, s.rx_calls ? (double)s.rx_pkts / (double)s.rx_calls : 0.0,
		s.rx_empty, s.rx_gro_msgs, s.tx_pkts, s.tx_calls, s.tx_gso_msgs);
	fflush(f);
	if (dp->shm != NULL) {
		pboxd_shm_stats_print(f, dp->shm);
	}
}

const struct pboxd_transport_ops pboxd_udp_transport = {
	.name = "udp",
	.start = udp_start,
	.stop = udp_stop,
	.transport_stats = udp_transport_stats,
	.stats_json = udp_stats_json,
	.stats_print = udp_stats_print,
};
