/* SPDX-License-Identifier: BSD-3-Clause */
/* Per-destination result pacing of one appliance core (see pace.h). */
#include "core/pace.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"

#define NONE UINT32_MAX
/* One phase of the gain cycle: short, so that a probe phase queues little (5 ms at 1/4
 * over the rate: 1/8 of a 10 ms switch buffer). */
#define PHASE_NS 5000000ull

/* One datagram waiting for its departure. */
struct pace_ent {
	struct pbox_wire_hdr hdr;
	const void *payload;
	uint32_t len;
	uint32_t next; /* next in its destination's FIFO, or in the free list */
	uint64_t ord;  /* payload datagrams accepted before it (its number if it has one) */
};

struct pace_dst {
	struct pbox_peer peer;
	uint64_t rate; /* send rate, bytes/s, gain applied (0: not paced) */
	uint64_t samples[PBOX_PACE_SAMPLES];
	uint32_t nsamples, isample;
	/* the train of arrivals being measured */
	uint64_t rx_t0, rx_last, rx_bytes;
	bool rx_opening; /* arrivals at rx_t0 belong to the opening burst: not counted */
	/* the bucket */
	int64_t tokens;
	uint64_t t_tokens;
	/* the FIFO */
	uint32_t head, tail, n;
	uint64_t qbytes;     /* wire bytes in it */
	uint32_t active_pos; /* index in the active list while n > 0 */
};

struct pbox_pace {
	struct pbox_pace_cfg cfg;
	struct pace_dst *dst;
	uint32_t ndst;
	uint32_t *hash; /* open addressing: dst index + 1, 0 empty */
	uint32_t hmask;
	uint32_t *active; /* destinations with something queued */
	uint32_t nactive;
	struct pace_ent *ent;
	uint32_t free_head, nqueued;
	uint64_t queued; /* payload datagrams accepted */
	bool warned_full;
	struct pbox_pace_stats stats;
};

static uint64_t mono_ns(void *arg)
{
	struct timespec ts;

	(void)arg;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t now(const struct pbox_pace *p)
{
	return p->cfg.now_ns(p->cfg.now_arg);
}

struct pbox_pace *pbox_pace_create(const struct pbox_pace_cfg *cfg)
{
	struct pbox_pace *p = calloc(1, sizeof(*p));
	uint32_t hsize = 1;

	if (p == NULL) {
		PBOX_LOG_ERR(MAIN, "pacer: out of memory");
		return NULL;
	}
	p->cfg = *cfg;
	if (p->cfg.now_ns == NULL) {
		p->cfg.now_ns = mono_ns;
	}
	p->cfg.max_dst = p->cfg.max_dst ? p->cfg.max_dst : 1024;
	p->cfg.max_queued = p->cfg.max_queued ? p->cfg.max_queued : 16384;
	p->cfg.gain_pct = p->cfg.gain_pct ? p->cfg.gain_pct : 100;
	p->cfg.min_rate_Bps = p->cfg.min_rate_Bps ? p->cfg.min_rate_Bps : 1000000;
	p->cfg.burst_bytes = p->cfg.burst_bytes ? p->cfg.burst_bytes : 2 * 9216;
	p->cfg.burst_us = p->cfg.burst_us ? p->cfg.burst_us : 250;
	p->cfg.sample_us = p->cfg.sample_us ? p->cfg.sample_us : 50000;
	p->cfg.idle_us = p->cfg.idle_us ? p->cfg.idle_us : 20000;
	p->cfg.max_delay_us = p->cfg.max_delay_us ? p->cfg.max_delay_us : 60000;
	while (hsize < 2 * p->cfg.max_dst) {
		hsize <<= 1;
	}
	p->hmask = hsize - 1;
	p->dst = calloc(p->cfg.max_dst, sizeof(*p->dst));
	p->hash = calloc(hsize, sizeof(*p->hash));
	p->active = calloc(p->cfg.max_dst, sizeof(*p->active));
	p->ent = calloc(p->cfg.max_queued, sizeof(*p->ent));
	if (p->dst == NULL || p->hash == NULL || p->active == NULL || p->ent == NULL) {
		PBOX_LOG_ERR(MAIN, "pacer: out of memory for %u destinations, %u datagrams",
			     p->cfg.max_dst, p->cfg.max_queued);
		pbox_pace_destroy(p);
		return NULL;
	}
	for (uint32_t i = 0; i < p->cfg.max_queued; i++) {
		p->ent[i].next = i + 1 < p->cfg.max_queued ? i + 1 : NONE;
	}
	p->free_head = 0;
	return p;
}

static uint32_t peer_hash(const struct pbox_peer *a)
{
	uint64_t k = ((uint64_t)a->ip << 16) ^ a->port;

	k *= 0x9e3779b97f4a7c15ull;
	return (uint32_t)(k >> 32);
}

/* The destination of peer; created if create. NULL: unknown, or the table is full. */
static struct pace_dst *lookup(struct pbox_pace *p, const struct pbox_peer *peer, bool create)
{
	for (uint32_t h = peer_hash(peer) & p->hmask;; h = (h + 1) & p->hmask) {
		struct pace_dst *d;

		if (p->hash[h] == 0) {
			if (!create) {
				return NULL;
			}
			if (p->ndst == p->cfg.max_dst) {
				if (!p->warned_full) {
					p->warned_full = true;
					PBOX_LOG_WARN(MAIN,
						      "pacer: more than %u destinations, the rest "
						      "go unpaced",
						      p->cfg.max_dst);
				}
				return NULL;
			}
			d = &p->dst[p->ndst];
			d->peer.ip = peer->ip;
			d->peer.port = peer->port;
			d->head = d->tail = NONE;
			p->hash[h] = p->ndst + 1;
			__atomic_store_n(&p->ndst, p->ndst + 1, __ATOMIC_RELEASE);
			return d;
		}
		d = &p->dst[p->hash[h] - 1];
		if (d->peer.ip == peer->ip && d->peer.port == peer->port) {
			return d;
		}
	}
}

/* The send rate now: the learned rate times BBR's cycle of gains, phases of PHASE_NS:
 * 5/4 (probe: if the worker's pushes wait for its results, faster results raise
 * the rate it is measured at, so the pacer can never hold both at a low rate), 3/4 (drain
 * what the probe queued), then 6 x 1. */
static uint64_t cycled_rate(const struct pbox_pace *p, const struct pace_dst *d, uint64_t t)
{
	uint64_t r, drain = d->qbytes * 1000000u / p->cfg.max_delay_us;

	switch ((t / PHASE_NS) % 8) {
	case 0:
		r = d->rate * 5 / 4;
		break;
	case 1:
		r = d->rate * 3 / 4;
		break;
	default:
		r = d->rate;
		break;
	}
	/* never a longer wait than max_delay_us */
	return r > drain ? r : drain;
}

static void refill(const struct pbox_pace *p, struct pace_dst *d, uint64_t t)
{
	uint64_t depth, dt, rate;

	if (d->rate == 0) {
		return;
	}
	rate = cycled_rate(p, d, t);
	depth = rate * p->cfg.burst_us / 1000000u;
	if (depth < p->cfg.burst_bytes) {
		depth = p->cfg.burst_bytes;
	}
	dt = t > d->t_tokens ? t - d->t_tokens : 0;
	if (dt > 1000000000ull) {
		dt = 1000000000ull;
	}
	d->tokens += (int64_t)(dt * rate / 1000000000ull);
	if (d->tokens > (int64_t)depth) {
		d->tokens = (int64_t)depth;
	}
	d->t_tokens = t;
}

static void release_head(struct pbox_pace *p, struct pace_dst *d)
{
	uint32_t i = d->head;
	struct pace_ent *e = &p->ent[i];

	p->cfg.inner->send(p->cfg.inner_ctx, &d->peer, &e->hdr, e->payload, e->len);
	d->tokens -= (int64_t)(PBOX_WIRE_HDR_LEN + e->len);
	d->qbytes -= PBOX_WIRE_HDR_LEN + e->len;
	d->head = e->next;
	if (--d->n == 0) {
		uint32_t pos = d->active_pos;

		d->tail = NONE;
		p->active[pos] = p->active[--p->nactive];
		p->dst[p->active[pos]].active_pos = pos;
	}
	e->next = p->free_head;
	p->free_head = i;
	p->nqueued--;
}

static int pace_send(void *ctx, const struct pbox_peer *to, const struct pbox_wire_hdr *hdr,
		     const void *payload, uint32_t len)
{
	struct pbox_pace *p = ctx;
	struct pace_dst *d = lookup(p, to, true);
	uint64_t ord = p->queued;
	struct pace_ent *e;
	uint32_t i;

	if (len != 0) {
		p->queued++;
	}
	if (d == NULL || d->rate == 0) {
		p->stats.sent_direct++;
		return p->cfg.inner->send(p->cfg.inner_ctx, to, hdr, payload, len);
	}
	if (len < PBOX_PACE_SMALL) {
		/* ACKs and NACKs never wait: the worker's window and timers run on them */
		d->tokens -= (int64_t)(PBOX_WIRE_HDR_LEN + len);
		p->stats.sent_direct++;
		return p->cfg.inner->send(p->cfg.inner_ctx, to, hdr, payload, len);
	}
	if (d->n == 0) {
		refill(p, d, now(p));
		if (d->tokens >= 0) {
			d->tokens -= (int64_t)(PBOX_WIRE_HDR_LEN + len);
			p->stats.sent_direct++;
			return p->cfg.inner->send(p->cfg.inner_ctx, to, hdr, payload, len);
		}
	}
	if (p->free_head == NONE) {
		/* Full: the oldest of this destination goes now, or this one if it has none. */
		p->stats.forced++;
		if (d->n == 0) {
			return p->cfg.inner->send(p->cfg.inner_ctx, to, hdr, payload, len);
		}
		release_head(p, d);
	}
	i = p->free_head;
	e = &p->ent[i];
	p->free_head = e->next;
	memcpy(&e->hdr, hdr, sizeof(e->hdr));
	e->payload = payload;
	e->len = len;
	e->ord = ord;
	e->next = NONE;
	d->qbytes += PBOX_WIRE_HDR_LEN + len;
	if (d->n++ == 0) {
		d->head = i;
		d->active_pos = p->nactive;
		p->active[p->nactive++] = (uint32_t)(d - p->dst);
	} else {
		p->ent[d->tail].next = i;
	}
	d->tail = i;
	if (++p->nqueued > p->stats.max_backlog) {
		p->stats.max_backlog = p->nqueued;
	}
	return 0;
}

uint64_t pbox_pace_poll(struct pbox_pace *p)
{
	uint64_t next = UINT64_MAX;

	if (p->nactive > 0) {
		uint64_t t = now(p);

		/* Every destination by its own bucket: order does not matter. One emptied is
		 * replaced in the list by the last one, visited in its place. */
		for (uint32_t k = 0; k < p->nactive;) {
			struct pace_dst *d = &p->dst[p->active[k]];

			refill(p, d, t);
			while (d->n > 0 && d->tokens >= 0) {
				release_head(p, d);
				p->stats.sent_paced++;
			}
			if (d->n == 0) {
				continue;
			}
			{
				uint64_t r = cycled_rate(p, d, t);
				uint64_t wait = ((uint64_t)-d->tokens * 1000000000ull + r - 1) / r;

				next = wait < next ? wait : next;
			}
			k++;
		}
	}
	p->cfg.inner->flush(p->cfg.inner_ctx);
	return next;
}

static void pace_flush(void *ctx)
{
	pbox_pace_poll(ctx);
}

static uint64_t pace_queued(void *ctx)
{
	return ((struct pbox_pace *)ctx)->queued;
}

static uint64_t pace_reclaim(void *ctx, uint64_t upto)
{
	struct pbox_pace *p = ctx;
	uint64_t low = p->queued;

	for (uint32_t k = 0; k < p->nactive;) {
		struct pace_dst *d = &p->dst[p->active[k]];
		uint32_t before = p->nactive;

		while (d->n > 0 && p->ent[d->head].ord < upto) {
			release_head(p, d);
			p->stats.forced++;
		}
		if (d->n > 0 && p->ent[d->head].ord < low) {
			low = p->ent[d->head].ord;
		}
		if (p->nactive == before) {
			k++; /* else the last one moved into slot k */
		}
	}
	p->cfg.inner->reclaim(p->cfg.inner_ctx, p->cfg.inner->queued(p->cfg.inner_ctx));
	return low;
}

const struct pbox_tx_ops pbox_pace_tx_ops = {
	.send = pace_send,
	.flush = pace_flush,
	.queued = pace_queued,
	.reclaim = pace_reclaim,
};

void pbox_pace_rx(struct pbox_pace *p, const struct pbox_peer *from, uint32_t len)
{
	struct pace_dst *d;
	uint64_t t, span, max = 0;

	/* Only data measures the worker's rate: a worker waiting for its results sends small
	 * PULLs now and then, which would read as a slow worker and hold its results back. */
	if (len <= PBOX_WIRE_HDR_LEN) {
		return;
	}
	d = lookup(p, from, true);
	if (d == NULL) {
		return;
	}
	t = now(p);
	if (d->rx_t0 == 0 || t - d->rx_last > (uint64_t)p->cfg.idle_us * 1000u) {
		/* A new train: what arrives at its first instant came before its clock. */
		d->rx_t0 = d->rx_last = t;
		d->rx_bytes = 0;
		d->rx_opening = true;
		return;
	}
	d->rx_last = t;
	if (t == d->rx_t0 && d->rx_opening) {
		return;
	}
	d->rx_bytes += len;
	span = t - d->rx_t0;
	/* the first sample is a quarter as long: results may follow at once */
	if (span < (uint64_t)p->cfg.sample_us * 1000u / (d->nsamples == 0 ? 4 : 1)) {
		return;
	}
	d->samples[d->isample] = d->rx_bytes * 1000000000ull / span;
	d->isample = (d->isample + 1) % PBOX_PACE_SAMPLES;
	if (d->nsamples < PBOX_PACE_SAMPLES) {
		d->nsamples++;
	}
	p->stats.samples++;
	d->rx_t0 = t;
	d->rx_bytes = 0;
	d->rx_opening = false;
	for (uint32_t i = 0; i < d->nsamples; i++) {
		max = d->samples[i] > max ? d->samples[i] : max;
	}
	if (max < p->cfg.min_rate_Bps) {
		max = p->cfg.min_rate_Bps;
	}
	if (d->rate == 0) {
		d->t_tokens = t;
		d->tokens = 0;
	} else {
		refill(p, d, t); /* the old rate up to now */
	}
	__atomic_store_n(&d->rate, max * p->cfg.gain_pct / 100u, __ATOMIC_RELAXED);
}

uint32_t pbox_pace_backlog(const struct pbox_pace *p)
{
	return p->nqueued;
}

uint64_t pbox_pace_rate(const struct pbox_pace *p, const struct pbox_peer *peer)
{
	const struct pace_dst *d = lookup((struct pbox_pace *)p, peer, false);

	return d != NULL ? d->rate : 0;
}

const struct pbox_pace_stats *pbox_pace_stats(const struct pbox_pace *p)
{
	return &p->stats;
}

uint32_t pbox_pace_rates(const struct pbox_pace *p, uint64_t *out, uint32_t max)
{
	uint32_t n = __atomic_load_n(&p->ndst, __ATOMIC_ACQUIRE);

	n = n < max ? n : max;
	for (uint32_t i = 0; i < n; i++) {
		out[i] = __atomic_load_n(&p->dst[i].rate, __ATOMIC_RELAXED);
	}
	return n;
}

void pbox_pace_destroy(struct pbox_pace *p)
{
	if (p == NULL) {
		return;
	}
	if (p->ent != NULL && p->cfg.inner != NULL) {
		pace_reclaim(p, p->queued);
	}
	free(p->ent);
	free(p->active);
	free(p->hash);
	free(p->dst);
	free(p);
}
