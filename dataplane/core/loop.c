/* SPDX-License-Identifier: BSD-3-Clause */
/* The per-core data-plane loop (see loop.h). */
#include "core/loop.h"

#include <errno.h>
#include <time.h>
#include <x86intrin.h>

/* One pass: rx -> table -> tx -> end -> quiescent state -> accounting. Returns what rx
 * returned; *now: the TSC at its end. */
static enum pbox_poll_rc pass(struct pbox_loop *l, struct pbox_core_stats *es, uint64_t *now)
{
	const struct pbox_loop_ops *ops = l->ops;
	uint64_t t0 = __rdtsc(), t1;
	enum pbox_poll_rc rc;

	l->tab_read = false;
	rc = ops->rx(l->xc, l);
	if (l->poller != NULL && l->poller->poll(l->poller_arg, l) == PBOX_POLL_BUSY) {
		rc = PBOX_POLL_BUSY;
	}
	/* A new job table (a worker left) is reconciled now, not when the next datagram of
	 * that job arrives; the table rx read after its last receive is current. */
	pbox_engine_observe_table(l->engine, l->tab_read ? l->cur_tab : pbox_loop_table(l));
	if (ops->tx != NULL) {
		ops->tx(l->xc, l, rc);
	}
	if (ops->end != NULL) {
		ops->end(l->xc);
	}
	/* No job table is in use past this point. */
	l->cur_tab = NULL;
	rcu_quiescent_state();
	t1 = __rdtsc();
	if (rc == PBOX_POLL_BUSY) {
		PBOX_STAT_ADD(es, busy_cycles, t1 - t0);
		l->last_work = t1;
	} else {
		PBOX_STAT_ADD(es, idle_cycles, t1 - t0);
	}
	*now = t1;
	return rc;
}

void pbox_loop_run(struct pbox_loop *l)
{
	struct pbox_core_stats *es = l->engine->stats;

	rcu_register_thread();
	l->last_work = __rdtsc();
	while (!pbox_loop_stopping(l)) {
		uint64_t t1;

		if (pass(l, es, &t1) == PBOX_POLL_IDLE && !l->busy_poll &&
		    (l->idle_tsc == 0 || t1 - l->last_work > l->idle_tsc) &&
		    !pbox_loop_stopping(l)) {
			bool again = false;
			uint64_t due =
				l->ops->tx_due_ns != NULL ? l->ops->tx_due_ns(l->xc) : UINT64_MAX;
			int ms = l->wait_ms, fd;

			if (due < 1000000u) {
				PBOX_STAT_ADD(es, polls, 1);
				continue; /* held output is due: the next pass's tx releases it */
			}
			if (due / 1000000u < (uint64_t)ms) {
				ms = (int)(due / 1000000u);
			}
			fd = l->poller != NULL ? l->poller->sleep_prepare(l->poller_arg) : -1;
			if (fd == -EAGAIN) {
				PBOX_STAT_ADD(es, polls, 1);
				continue; /* the poller has input already */
			}
			/* RCU-offline: a publish need not wait for this core. */
			rcu_thread_offline();
			if (fd >= 0 && l->ops->wait_fd != NULL) {
				again = l->ops->wait_fd(l->xc, ms, fd);
			} else if (fd < 0 && l->ops->wait != NULL) {
				again = l->ops->wait(l->xc, ms);
			} else {
				struct timespec ts = { 0, (long)l->idle_sleep_us * 1000 };

				nanosleep(&ts, NULL);
			}
			rcu_thread_online();
			if (fd >= 0) {
				l->poller->sleep_end(l->poller_arg);
			}
			PBOX_STAT_ADD(es, idle_cycles, __rdtsc() - t1);
			if (again && !pbox_loop_stopping(l)) {
				pass(l, es, &t1);
			}
		}
		PBOX_STAT_ADD(es, polls, 1);
	}
	if (l->ops->fini != NULL) {
		l->ops->fini(l->xc);
	}
	rcu_unregister_thread();
}

void pbox_loop_stop(struct pbox_loop *l)
{
	__atomic_store_n(&l->stop, true, __ATOMIC_RELEASE);
	if (l->ops != NULL && l->ops->wake != NULL) {
		l->ops->wake(l->xc);
	}
}
