/* SPDX-License-Identifier: BSD-3-Clause */
/* pboxd data-plane cores: the transport choice, start / stop, and the lifetime of job
 * tables and job states (see dataplane.h). The transports are modules of the core loop:
 * kernel UDP in transport/udp/pboxd_udp.c, DPDK in transport/dpdk/pboxd_dpdk.c. */
#include "dataplane.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <urcu-qsbr.h>
#include <x86intrin.h>

#include "common/log.h"

static uint64_t measure_tsc_hz(void)
{
	struct timespec a, b, d = { 0, 20000000 };
	uint64_t t0, t1;
	double ns;

	clock_gettime(CLOCK_MONOTONIC, &a);
	t0 = __rdtsc();
	nanosleep(&d, NULL);
	t1 = __rdtsc();
	clock_gettime(CLOCK_MONOTONIC, &b);
	ns = (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
	return ns > 0 ? (uint64_t)((double)(t1 - t0) * 1e9 / ns) : 1000000000ull;
}

const struct pboxd_transport_ops *pboxd_transport_find(const char *name)
{
	static const struct pboxd_transport_ops *const all[] = {
		&pboxd_udp_transport,
#ifdef PBOX_HAVE_DPDK
		&pboxd_dpdk_transport,
#endif
#ifdef PBOX_HAVE_AFXDP
		&pboxd_afxdp_transport,
#endif
	};

	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
		if (strcmp(all[i]->name, name) == 0) {
			return all[i];
		}
	}
	return NULL;
}

/* ---- lifetime of job tables and job states ------------------------------------------ */

/* The reaper: unmaps the arenas of states whose last reference was dropped, wherever
 * that happened (a data-plane core, the call_rcu thread, the control thread). */
static void reap(struct pboxd_dp *dp)
{
	struct pbox_job_state *st = __atomic_exchange_n(&dp->reap_list, NULL, __ATOMIC_ACQUIRE);

	while (st != NULL) {
		struct pbox_job_state *next = st->release_next;

		pbox_job_state_free(st);
		__atomic_fetch_add(&dp->life.states_freed, 1, __ATOMIC_RELAXED);
		st = next;
	}
}

static void *reaper_main(void *arg)
{
	struct pboxd_dp *dp = arg;

	while (!__atomic_load_n(&dp->reap_stop, __ATOMIC_ACQUIRE)) {
		struct pollfd p = { .fd = dp->reap_fd, .events = POLLIN };
		uint64_t n;

		if (poll(&p, 1, -1) > 0 && read(dp->reap_fd, &n, sizeof(n)) < 0) {
			/* EAGAIN: another wake-up took it; the list is checked anyway */
		}
		reap(dp);
	}
	return NULL;
}

/* A state's last reference is gone (any thread, possibly a data-plane core): hand it to
 * the reaper, lock-free. */
static void state_release(struct pbox_job_state *st, void *arg)
{
	struct pboxd_dp *dp = arg;
	struct pbox_job_state *head = __atomic_load_n(&dp->reap_list, __ATOMIC_RELAXED);
	uint64_t one = 1;

	do {
		st->release_next = head;
	} while (!__atomic_compare_exchange_n(&dp->reap_list, &head, st, true, __ATOMIC_RELEASE,
					      __ATOMIC_RELAXED));
	if (!dp->reaper_started) {
		reap(dp); /* start-up failed or shutting down: no core runs any more */
	} else if (write(dp->reap_fd, &one, sizeof(one)) < 0) {
		/* the counter is saturated: the reaper is awake already */
	}
}

/* A table's last reference is gone: after its grace period (call_rcu thread), or when the
 * core that pinned it unpins (that core). Each state it lists loses the table's
 * reference; a state no table lists any more goes to the transport's retire(). */
static void tab_release(struct pbox_jobtab *tab, void *arg)
{
	struct pboxd_dp *dp = arg;

	for (uint32_t i = 0; i < tab->njobs; i++) {
		struct pbox_job_state *st = tab->jobs[i]->state;

		if (st == NULL) {
			continue;
		}
		if (__atomic_sub_fetch(&st->tables, 1, __ATOMIC_ACQ_REL) == 0 &&
		    !__atomic_load_n(&dp->transport_down, __ATOMIC_ACQUIRE) && dp->ops != NULL &&
		    dp->ops->retire != NULL) {
			dp->ops->retire(dp, st);
		}
		pbox_job_state_put(st);
	}
	pbox_jobtab_free(tab);
	__atomic_fetch_add(&dp->life.tables_freed, 1, __ATOMIC_RELAXED);
}

struct retired_tab {
	struct rcu_head rcu;
	struct pbox_jobtab *tab;
};

static void tab_retired(struct rcu_head *head)
{
	struct retired_tab *r = caa_container_of(head, struct retired_tab, rcu);

	pbox_jobtab_put(r->tab);
	free(r);
}

int pboxd_dp_publish(struct pboxd_dp *dp, struct pbox_jobtab *tab)
{
	struct retired_tab *r = NULL;
	struct pbox_jobtab *old;
	bool live = dp->rcu_registered && dp->ops != NULL && !dp->transport_down;

	if (live && dp->tab != NULL) {
		/* Allocated before anything is published, so failing changes nothing. */
		r = malloc(sizeof(*r));
		if (r == NULL) {
			__atomic_fetch_add(&dp->life.publish_nomem, 1, __ATOMIC_RELAXED);
			PBOX_LOG_ERR(MAIN,
				     "job table %llu: out of memory retiring the previous one",
				     tab != NULL ? (unsigned long long)tab->generation : 0ull);
			return -ENOMEM;
		}
	}
	if (tab != NULL) {
		tab->refs = 1;
		tab->release = tab_release;
		tab->release_arg = dp;
		for (uint32_t i = 0; i < tab->njobs; i++) {
			struct pbox_job_state *st = tab->jobs[i]->state;

			if (st == NULL) {
				continue;
			}
			if (st->release == NULL) {
				/* Published once: from now on its arenas go through the reaper. */
				st->release = state_release;
				st->release_arg = dp;
			}
			pbox_job_state_get(st);
			__atomic_fetch_add(&st->tables, 1, __ATOMIC_RELAXED);
		}
	}
	if (!live) {
		/* No core runs: nothing can see the old table. */
		old = dp->tab;
		dp->tab = tab;
		pbox_jobtab_put(old);
		return 0;
	}
	/* QSBR: call_rcu is for online registered threads; the control thread is online only
	 * for these few instructions, so it never holds up a grace period. */
	rcu_thread_online();
	old = rcu_xchg_pointer(&dp->tab, tab);
	if (old != NULL) {
		r->tab = old;
		call_rcu(&r->rcu, tab_retired);
	}
	rcu_thread_offline();
	return 0;
}

void pboxd_dp_lifetime_stats(const struct pboxd_dp *dp, struct pboxd_dp_lifetime *out)
{
	out->tables_freed = pbox_stat_read(&dp->life.tables_freed);
	out->states_freed = pbox_stat_read(&dp->life.states_freed);
	out->publish_nomem = pbox_stat_read(&dp->life.publish_nomem);
}

static int lifetime_start(struct pboxd_dp *dp)
{
	int rc;

	rcu_register_thread();
	rcu_thread_offline();
	dp->rcu_registered = true;
	dp->reap_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (dp->reap_fd < 0) {
		rc = -errno;
		PBOX_LOG_ERR(MAIN, "data plane: cannot create the reaper's eventfd: %s",
			     strerror(-rc));
		return rc;
	}
	rc = pthread_create(&dp->reaper, NULL, reaper_main, dp);
	if (rc != 0) {
		PBOX_LOG_ERR(MAIN, "data plane: cannot start the reaper thread: %s", strerror(rc));
		return -rc;
	}
	pthread_setname_np(dp->reaper, "pbox-reaper");
	dp->reaper_started = true;
	return 0;
}

/* After the transport stopped: run the pending call_rcu work, drop the published table,
 * stop the reaper and free what is left. */
static void lifetime_stop(struct pboxd_dp *dp)
{
	uint64_t one = 1;

	__atomic_store_n(&dp->transport_down, true, __ATOMIC_RELEASE);
	if (dp->rcu_registered) {
		rcu_barrier();
	}
	pbox_jobtab_put(dp->tab);
	dp->tab = NULL;
	if (dp->reaper_started) {
		__atomic_store_n(&dp->reap_stop, true, __ATOMIC_RELEASE);
		if (write(dp->reap_fd, &one, sizeof(one)) < 0) {
			/* the reaper is awake already */
		}
		pthread_join(dp->reaper, NULL);
		dp->reaper_started = false;
	}
	reap(dp);
	if (dp->reap_fd >= 0) {
		close(dp->reap_fd);
		dp->reap_fd = -1;
	}
	if (dp->rcu_registered) {
		rcu_unregister_thread();
		dp->rcu_registered = false;
	}
}

int pboxd_dp_start(struct pboxd_dp *dp, const struct pboxd_config *cfg)
{
	int rc;

	memset(dp, 0, sizeof(*dp));
	dp->stop_fd = -1;
	dp->reap_fd = -1;
	dp->ops = pboxd_transport_find(cfg->transport);
	if (dp->ops == NULL) {
		PBOX_LOG_ERR(MAIN, "transport '%s' is not available in this build", cfg->transport);
		return -EINVAL;
	}
	rc = lifetime_start(dp);
	if (rc != 0) {
		lifetime_stop(dp);
		return rc;
	}
	dp->ncores = cfg->ncores;
	dp->busy_poll = cfg->busy_poll;
	dp->tsc_hz = measure_tsc_hz();
	dp->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	dp->cores = aligned_alloc(PBOX_CACHE_LINE, sizeof(*dp->cores) * cfg->ncores);
	if (dp->cores == NULL || dp->stop_fd < 0) {
		PBOX_LOG_ERR(MAIN, "out of memory / descriptors for %u cores", cfg->ncores);
		free(dp->cores);
		dp->cores = NULL;
		if (dp->stop_fd >= 0) {
			close(dp->stop_fd);
		}
		lifetime_stop(dp);
		return -ENOMEM;
	}
	memset(dp->cores, 0, sizeof(*dp->cores) * cfg->ncores);
	for (uint32_t k = 0; k < cfg->ncores; k++) {
		struct pboxd_core *c = &dp->cores[k];

		c->idx = k;
		c->cpu = cfg->cpus[k];
		c->dp = dp;
		c->engine.core = k;
		c->engine.kern = pbox_kernels_get();
		c->engine.stats = &c->stats;
	}
	rc = dp->ops->start(dp, cfg);
	if (rc != 0) {
		pboxd_dp_stop(dp);
	}
	return rc;
}

void pboxd_dp_stop(struct pboxd_dp *dp)
{
	if (dp->cores == NULL) {
		return;
	}
	dp->ops->stop(dp);
	lifetime_stop(dp);
	close(dp->stop_fd);
	for (uint32_t k = 0; k < dp->ncores; k++) {
		pbox_engine_fini(&dp->cores[k].engine); /* the cores have stopped */
	}
	free(dp->cores);
	dp->cores = NULL;
}

void pboxd_dp_transport_stats(const struct pboxd_dp *dp, uint32_t core, uint64_t *tx_dropped,
			      uint64_t *rx_truncated)
{
	dp->ops->transport_stats(dp, core, tx_dropped, rx_truncated);
}

int pboxd_dp_xdp_attach(struct pboxd_dp *dp, struct pbox_xdp *prog)
{
	return dp->ops->xdp_attach != NULL ? dp->ops->xdp_attach(dp, prog) : 0;
}

json_t *pboxd_dp_transport_json(const struct pboxd_dp *dp)
{
	return dp->ops->stats_json != NULL ? dp->ops->stats_json(dp) : NULL;
}

void pboxd_dp_transport_print(FILE *f, const struct pboxd_dp *dp)
{
	if (dp->ops->stats_print != NULL) {
		dp->ops->stats_print(f, dp);
	}
}
