/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libpbox's progress thread: it owns the worker node (node.h) and its data sockets,
 * receives, runs timers, takes the callers' submissions and completes their operations.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_int.h"
#include "common/log.h"
#include "dvf_push.h"
#include "transport/shm/shm.h"
#include "transport/udp/udp.h"

static void snapshot_stats(struct pbox_client *c)
{
	const struct pbox_node_stats *s = pbox_node_stats(c->node);
	uint64_t dropped = 0;

	for (int r = 0; r < PBOX_DROP_COUNT; r++) {
		dropped += s->drops[r];
	}
	c->stats.tx_bytes = s->tx_bytes;
	c->stats.rx_bytes = s->rx_bytes;
	c->stats.tx_pkts = s->tx_pkts;
	c->stats.rx_pkts = s->rx_pkts;
	c->stats.retransmits = s->retransmits;
	c->stats.probes = s->probes;
	c->stats.dropped = dropped;
	c->stats.foreign = s->foreign;
	c->rx_placed = s->rx_placed;
	c->stats.ops_done = s->ops_done;
	c->stats.ops_failed = s->ops_failed;
	c->stats.shm_torn = s->torn_frags; /* only shm results are read split (node.h) */
	if (c->shm != NULL) {
		const struct pbox_shm_client_stats *m = pbox_shm_client_stats(c->shm);

		c->stats.shm_rx_desc = m->rx_desc;
		c->stats.shm_stale = m->stale;
		c->stats.shm_bad_desc = m->bad_desc;
		c->stats.shm_tx_full = m->tx_full;
		c->stats.shm_tx_waits = m->tx_waits;
	}
}

/* Node completion callback, on the progress thread. */
void pbox_client_op_done(struct pbox_op *op, void *arg)
{
	struct pbox_client *c = arg;
	struct cop *cp = pbox_container_of(op, struct cop, op);
	pbox_done_fn cb;
	void *cb_arg;

	/* Refused because the job was aborted: the reason travels on the control channel
	 * (sent before the refusals); pick it up so the error says why. Once a failure is
	 * recorded there is nothing more to learn (fail_err is written on this thread only). */
	if (op->status == -ECONNABORTED && c->fail_err == 0 && c->ctl_fd >= 0) {
		pbox_client_ctl_read_events(c);
	}
	pthread_mutex_lock(&c->lock);
	if (op->status == -ECONNABORTED && c->fail_err == -ECONNABORTED) {
		snprintf(op->errmsg, sizeof(op->errmsg), "%s", c->fail_msg);
	}
	cp->state = COP_DONE;
	if (op->status == 0 && op->label != UINT32_MAX) {
		cp->version = op->label;
	}
	cb = cp->cb;
	cb_arg = cp->cb_arg;
	snapshot_stats(c);
	if (cp->waited) {
		/* Only a completion someone waits for wakes the waiters: a broadcast per
		 * operation woke pbox_wait_all's thread once per key (a futex wake-up and
		 * a context switch each, on the CPUs the transfer needs). */
		cp->waited = false;
		pthread_cond_broadcast(&c->cond);
	}
	pthread_mutex_unlock(&c->lock);
	if (cb != NULL) {
		/* Inside the callback pbox_last_error() tells why the operation failed. */
		if (op->status < 0) {
			(void)pbox_client_error(op->status, "%s", op->errmsg);
		}
		cb(c->desc.keys[op->key].id, op->status, cb_arg);
	}
}

/* Record the first failure of the session; the progress loop applies it to the node. */
void pbox_client_record_failure(struct pbox_client *c, int err, const char *msg)
{
	pthread_mutex_lock(&c->lock);
	if (c->fail_err == 0) {
		c->fail_err = err;
		snprintf(c->fail_msg, sizeof(c->fail_msg), "%s", msg);
		PBOX_LOG_ERR(CLIENT, "%s", msg);
	}
	pthread_mutex_unlock(&c->lock);
}

/* On the progress thread: fail the node, once, when the session has failed. */
static void apply_failure(struct pbox_client *c)
{
	if (c->fail_err != 0 && !c->node_failed) {
		c->node_failed = true;
		pbox_node_fail(c->node, c->fail_err, c->fail_msg);
	}
}

/* On the progress thread: events, then fail the node if the session failed. */
void pbox_client_ctl_events(struct pbox_client *c)
{
	pbox_client_ctl_read_events(c);
	if (c->probe != NULL) {
		pbox_client_ctl_answer(c, pbox_wprobe_poll(c->probe));
	}
	apply_failure(c);
}

static void drain_submissions(struct pbox_client *c)
{
	struct cop *list;

	pthread_mutex_lock(&c->lock);
	list = c->sub_head;
	c->sub_head = c->sub_tail = NULL;
	pthread_mutex_unlock(&c->lock);
	while (list != NULL) {
		struct cop *next = list->next;
		int rc;

		list->next = NULL;
		rc = pbox_node_submit(c->node, &list->op);
		if (rc != 0) {
			list->op.status = rc;
			pbox_client_op_done(&list->op, c);
		}
		list = next;
	}
}

/* pboxd closed the shared-memory connection: if it went away (its control connection
 * closes too, a moment later), say that; otherwise it ended only this connection. */
static void shm_ended(struct pbox_client *c)
{
	if (c->ctl_fd >= 0) {
		struct pollfd p = { .fd = c->ctl_fd, .events = POLLIN };

		(void)poll(&p, 1, 200);
		pbox_client_ctl_events(c);
	}
	pbox_client_record_failure(
		c, -ECONNRESET, "pboxd ended the shared-memory connection (see pboxd's log: shm)");
}

/* Results from the shared-memory rings, read in place by the node; their room goes back
 * after the burst. Returns the count. */
static unsigned shm_rx(struct pbox_client *c, struct pbox_rx_pkt *pkts)
{
	unsigned n = pbox_shm_client_rx(c->shm, pkts, PBOX_UDP_MAX_BURST);

	for (unsigned i = 0; i < n; i++) {
		const struct pbox_shm_split *sp = pbox_shm_client_split(c->shm, i);

		if (sp != NULL) { /* a result read in place in pboxd's results' arena */
			pbox_node_rx_split(c->node, pkts[i].data, sp->payload, sp->len, sp->gen,
					   sp->want, &pkts[i].from);
		} else {
			pbox_node_rx(c->node, pkts[i].data, pkts[i].len, &pkts[i].from);
		}
	}
	pbox_shm_client_rx_done(c->shm);
	return n;
}

/* One receive of up to max datagrams from the UDP socket into the node, with results
 * received into the callers' buffers where the node expects them (node.h). */
static unsigned udp_rx_once(struct pbox_client *c, struct pbox_rx_pkt *pkts, unsigned max,
			    struct pbox_node_place *place, struct pbox_udp_place *uplace,
			    int16_t *placed, bool no_place)
{
	unsigned np = 0, n;

	if (!no_place) {
		np = pbox_node_rx_places(c->node, place,
					 PBOX_MIN(PBOX_MIN(max, PBOX_UDP_DEFAULT_BURST),
						  pbox_node_rx_place_want(c->node)));
	}
	for (unsigned i = 0; i < np; i++) {
		uplace[i].dst = place[i].dst;
		uplace[i].len = place[i].len;
	}
	n = pbox_udp_rx_placed(c->udp, pkts, max, uplace, np, placed, 0);
	pbox_node_rx_burst(c->node, pkts, n, place, np, placed);
	return n;
}

/*
 * The socket sees long runs of results from one appliance core, and which core's run is
 * at the head is what placement cannot guess: take one datagram first, then the rest
 * placed after it (one more recvmmsg per burst).
 */
static unsigned udp_rx(struct pbox_client *c, struct pbox_rx_pkt *pkts,
		       struct pbox_node_place *place, struct pbox_udp_place *uplace,
		       int16_t *placed, bool no_place)
{
	unsigned n = udp_rx_once(c, pkts, no_place ? PBOX_UDP_MAX_BURST : 1, place, uplace, placed,
				 no_place);

	if (n == 0 || no_place) {
		return n;
	}
	return n + udp_rx_once(c, pkts, PBOX_UDP_MAX_BURST, place, uplace, placed, false);
}

/* Kernel pacing (transport/udp/kpace.h): the socket's departure times follow the
 * congestion controller's pacing rate, in wire bytes (each fragment also carries the pbox
 * header and IP/UDP/Ethernet headers), so the kernel spaces what the node releases in
 * bursts (after the thread was descheduled, resends) at the rate the window allows. */
static void set_kpace_rate(struct pbox_client *c)
{
	uint32_t frag;
	uint64_t r = pbox_node_pace_rate(c->node, &frag);

	if (frag != 0) {
		r += r * (PBOX_WIRE_HDR_LEN + PBOX_KPACE_L2_OVERHEAD) / frag;
	}
	pbox_udp_set_pace_rate(c->udp, r);
}

void *pbox_client_progress_main(void *arg)
{
	struct pbox_client *c = arg;
	/* Room for a whole burst of GRO messages' datagrams per call. */
	struct pbox_rx_pkt pkts[PBOX_UDP_MAX_BURST];
	/* Results received straight into the callers' buffers (node.h, udp.h). */
	struct pbox_node_place place[PBOX_UDP_MAX_BURST];
	struct pbox_udp_place uplace[PBOX_UDP_MAX_BURST];
	int16_t placed[PBOX_UDP_MAX_BURST];
	/* Opt-in (PBOX_RX_PLACE=1): on loopback with 2 appliance cores it saved no CPU
	 * measurably (perf/README.md section 4: the runs of the two cores interleave in the
	 * one socket, so about a third of the results land in place). */
	bool no_place =
		getenv("PBOX_RX_PLACE") == NULL || strcmp(getenv("PBOX_RX_PLACE"), "1") != 0;
	uint64_t next_ctl_check = 0;

	while (!__atomic_load_n(&c->stop, __ATOMIC_ACQUIRE)) {
		unsigned n;
		uint64_t next, t;

		/* Submissions first: the places offered below must stay dead until the
		 * burst is handled, and nothing but the node's own receive changes them. */
		drain_submissions(c);
		n = udp_rx(c, pkts, place, uplace, placed, no_place);
		if (c->shm != NULL) {
			n += shm_rx(c, pkts);
		}
		if (pbox_node_stats(c->node)->foreign != c->stats.foreign) {
			/* Dropped strays complete no operation: publish their count now. */
			pthread_mutex_lock(&c->lock);
			snapshot_stats(c);
			pthread_mutex_unlock(&c->lock);
		}
		apply_failure(c);
		pbox_client_heartbeat(c);
		pbox_node_timers(c->node);
		if (c->shm == NULL && pbox_udp_kpace(c->udp)) {
			set_kpace_rate(c);
		}
		pbox_node_flush(c->node);
		if (n != 0 || c->opts.busy_poll) {
			/* Busy: still look at the control channel every 10 ms for events. */
			t = pbox_clock_ns(NULL);
			if (c->ctl_fd >= 0 && t >= next_ctl_check) {
				pbox_client_ctl_events(c);
				next_ctl_check = t + 10000000ull;
			}
			continue;
		}
		/* Idle: sleep until a datagram, a submission, a control event or a timer. */
		next = pbox_node_next_timer(c->node);
		{
			struct pollfd p[5] = {
				{ .fd = pbox_udp_fd(c->udp), .events = POLLIN },
				{ .fd = c->wake_fd, .events = POLLIN },
				{ .fd = c->ctl_fd, .events = POLLIN },
				{ .fd = c->shm ? pbox_shm_client_wake_fd(c->shm) : -1,
				  .events = POLLIN },
				/* No POLLIN: registrations read their answers there
				 * (pbox_mem_alloc); pboxd's close is POLLHUP. */
				{ .fd = c->shm ? pbox_shm_client_sock_fd(c->shm) : -1,
				  .events = 0 },
			};
			int ms = next == UINT64_MAX ? 200 : (int)PBOX_MIN(next / 1000000 + 1, 200);

			if (c->heartbeat_ms != 0) {
				ms = (int)PBOX_MIN((uint32_t)ms, c->heartbeat_ms);
			}

			if (c->shm != NULL && !pbox_shm_client_sleep_prepare(c->shm)) {
				continue; /* a result arrived meanwhile */
			}
			if (poll(p, 5, ms) > 0) {
				if (p[1].revents & POLLIN) {
					uint64_t v;

					if (read(c->wake_fd, &v, sizeof(v)) < 0) {
						/* nothing: the eventfd is only a doorbell */
					}
					if (c->probe != NULL && c->ctl_fd >= 0) {
						pbox_client_ctl_answer(c,
								       pbox_wprobe_poll(c->probe));
					}
				}
				if (c->ctl_fd >= 0 &&
				    (p[2].revents & (POLLIN | POLLHUP | POLLERR))) {
					pbox_client_ctl_events(c);
				}
				if (p[4].revents & (POLLHUP | POLLERR)) {
					shm_ended(c);
				}
			}
			if (c->shm != NULL) {
				pbox_shm_client_sleep_end(c->shm);
			}
		}
	}
	/* Operations still in flight, and those submitted but not yet picked up, fail, so
	 * that every callback has run when pbox_close returns. Refuse new submissions first
	 * (start() checks fail_err under the lock), or one made from a callback below would
	 * be left in the list after the last drain. */
	pthread_mutex_lock(&c->lock);
	if (c->fail_err == 0) {
		c->fail_err = -ECANCELED;
		snprintf(c->fail_msg, sizeof(c->fail_msg), "the client was closed");
	}
	pthread_mutex_unlock(&c->lock);
	pbox_node_fail(c->node, -ECANCELED, "the client was closed");
	drain_submissions(c);
	return NULL;
}
