/* SPDX-License-Identifier: BSD-3-Clause */
/* The simulated appliance of the unit tests (see sim.h). */
#include "sim.h"

#include "common/bitmap.h"
#include "common/compiler.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t sim_now(void *arg)
{
	return ((struct sim *)arg)->now_ns;
}

/* ---- the timed network (sim_set_links) ----------------------------------------------- */

static bool heap_less(const struct sim_timed *a, const struct sim_timed *b)
{
	return a->at < b->at || (a->at == b->at && a->seq < b->seq);
}

static void heap_push(struct sim *s, const struct sim_timed *e)
{
	uint32_t i = s->nheap++;

	if (s->nheap > SIM_MAX_QUEUE) {
		fprintf(stderr, "sim: link queue overflow\n");
		abort();
	}
	s->heap[i] = *e;
	while (i > 0 && heap_less(&s->heap[i], &s->heap[(i - 1) / 2])) {
		struct sim_timed t = s->heap[i];

		s->heap[i] = s->heap[(i - 1) / 2];
		s->heap[(i - 1) / 2] = t;
		i = (i - 1) / 2;
	}
}

static struct sim_timed heap_pop(struct sim *s)
{
	struct sim_timed top = s->heap[0];
	uint32_t i = 0;

	s->heap[0] = s->heap[--s->nheap];
	for (;;) {
		uint32_t l = 2 * i + 1, r = l + 1, m = i;
		struct sim_timed t;

		if (l < s->nheap && heap_less(&s->heap[l], &s->heap[m])) {
			m = l;
		}
		if (r < s->nheap && heap_less(&s->heap[r], &s->heap[m])) {
			m = r;
		}
		if (m == i) {
			break;
		}
		t = s->heap[i];
		s->heap[i] = s->heap[m];
		s->heap[m] = t;
		i = m;
	}
	return top;
}

int sim_set_links(struct sim *s, const struct sim_link_cfg *up, const struct sim_link_cfg *down)
{
	s->up = *up;
	s->down = *down;
	s->up_free = calloc(s->nranks, sizeof(*s->up_free));
	s->down_free = calloc(s->nranks, sizeof(*s->down_free));
	s->heap = calloc(SIM_MAX_QUEUE, sizeof(*s->heap));
	if (s->up_free == NULL || s->down_free == NULL || s->heap == NULL) {
		return -ENOMEM;
	}
	s->links = true;
	return 0;
}

/* Put p on its rank's link: dropped if the queue is full, else delivered after the queue
 * ahead of it, its own serialisation and the delay. Takes p's data. */
static void link_send(struct sim *s, const struct sim_pkt *p)
{
	uint32_t rank = p->dir == SIM_TO_APPLIANCE ? p->from : p->to;
	const struct sim_link_cfg *l = p->dir == SIM_TO_APPLIANCE ? &s->up : &s->down;
	uint64_t *free_at = p->dir == SIM_TO_APPLIANCE ? &s->up_free[rank] : &s->down_free[rank];
	uint64_t start = PBOX_MAX(*free_at, s->now_ns);
	uint64_t queued = (start - s->now_ns) * l->rate_Bps / 1000000000ull;
	struct sim_timed e;

	if (queued + p->len > l->queue_bytes) {
		s->link_drops[p->dir]++;
		free(p->data);
		return;
	}
	s->link_max_queue[p->dir] = PBOX_MAX(s->link_max_queue[p->dir], queued + p->len);
	s->link_bytes[p->dir] += p->len;
	*free_at = start + (uint64_t)p->len * 1000000000ull / l->rate_Bps;
	e.at = *free_at + l->delay_ns;
	if (p->dir == SIM_TO_APPLIANCE && s->core_tick_ns > 0) {
		e.at = (e.at + s->core_tick_ns - 1) / s->core_tick_ns * s->core_tick_ns;
	}
	if (p->dir == SIM_TO_APPLIANCE && s->stall_ns[p->to] > 0 &&
	    e.at % s->stall_period_ns[p->to] < s->stall_ns[p->to]) {
		e.at += s->stall_ns[p->to] - e.at % s->stall_period_ns[p->to];
	}
	e.seq = s->heap_seq++;
	e.p = *p;
	heap_push(s, &e);
}

static void enqueue(struct sim *s, enum sim_dir dir, uint32_t to, uint32_t from,
		    const struct pbox_wire_hdr *h, const void *payload, uint32_t len)
{
	struct sim_pkt *p;
	struct pbox_msg m;
	enum sim_verdict v = SIM_PASS;
	uint32_t total = PBOX_WIRE_HDR_LEN + len;
	uint8_t buf[PBOX_WIRE_HDR_LEN + PBOX_WIRE_MAX_PAYLOAD];

	memcpy(buf, h, PBOX_WIRE_HDR_LEN);
	if (len) {
		memcpy(buf + PBOX_WIRE_HDR_LEN, payload, len);
	}
	s->filter_from = from;
	if (s->filter != NULL && pbox_wire_decode(buf, total, &m) == PBOX_DROP_NONE) {
		v = s->filter(s, dir, to, &m, s->filter_arg);
	}
	for (int copies = v == SIM_DROP ? 0 : (v == SIM_DUP ? 2 : 1); copies > 0; copies--) {
		if (s->links) {
			struct sim_pkt lp = { .dir = dir, .to = to, .from = from, .len = total };

			lp.data = malloc(total);
			memcpy(lp.data, buf, total);
			link_send(s, &lp);
			continue;
		}
		if (s->qtail - s->qhead >= SIM_MAX_QUEUE) {
			fprintf(stderr, "sim: queue overflow\n");
			abort();
		}
		p = &s->q[s->qtail++ % SIM_MAX_QUEUE];
		p->dir = dir;
		p->to = to;
		p->from = from;
		p->len = total;
		p->data = malloc(total);
		memcpy(p->data, buf, total);
	}
}

static int core_send(void *ctx, const struct pbox_peer *to, const struct pbox_wire_hdr *h,
		     const void *payload, uint32_t len)
{
	struct sim_ep *ep = ctx;
	struct sim *s = ep->s;
	uint32_t core = ep->idx;
	uint32_t rank = ntohs(to->port) - 20000u;

	if (rank >= s->nranks) {
		return -EINVAL;
	}
	s->eng_queued[core] += len != 0;
	enqueue(s, SIM_TO_WORKER, rank, core, h, payload, len);
	return 0;
}

static void nop_flush(void *ctx)
{
	(void)ctx;
}

static uint64_t core_queued(void *ctx)
{
	struct sim_ep *ep = ctx;

	return ep->s->eng_queued[ep->idx];
}

static uint64_t core_reclaim(void *ctx, uint64_t upto)
{
	(void)upto;
	return core_queued(ctx);
}

static const struct pbox_tx_ops g_core_tx = {
	.send = core_send,
	.flush = nop_flush,
	.queued = core_queued,
	.reclaim = core_reclaim,
};

static int rank_send(void *ctx, const struct pbox_peer *to, const struct pbox_wire_hdr *h,
		     const void *payload, uint32_t len)
{
	struct sim_ep *ep = ctx;
	struct sim *s = ep->s;
	uint32_t rank = ep->idx;
	uint32_t core = ntohs(to->port) - 10000u;

	if (ntohs(to->port) >= 20000u) {
		/* A TSB relay forwarding to a child rank. */
		uint32_t child = ntohs(to->port) - 20000u;

		if (child >= s->nranks) {
			return -EINVAL;
		}
		enqueue(s, SIM_TO_WORKER, child, SIM_FROM_RANK | rank, h, payload, len);
		return 0;
	}
	enqueue(s, SIM_TO_APPLIANCE, core, rank, h, payload, len);
	return 0;
}

static uint64_t rank_queued(void *ctx)
{
	(void)ctx;
	return 0;
}

static uint64_t rank_reclaim(void *ctx, uint64_t upto)
{
	(void)ctx;
	return upto;
}

static const struct pbox_tx_ops g_rank_tx = {
	.send = rank_send,
	.flush = nop_flush,
	.queued = rank_queued,
	.reclaim = rank_reclaim,
};

static void on_done(struct pbox_op *op, void *arg)
{
	struct sim *s = arg;

	if (s->ncompleted < PBOX_ARRAY_SIZE(s->completed)) {
		s->completed[s->ncompleted++] = op;
	}
}

int sim_init(struct sim *s, const struct sim_job_cfg *c)
{
	char err[256];

	memset(s, 0, sizeof(*s));
	s->ncores = c->ncores ? c->ncores : 1;
	s->nranks = c->nranks;
	s->now_ns = 1000000000ull;
	s->q = calloc(SIM_MAX_QUEUE, sizeof(*s->q));
	s->outbox = calloc(SIM_MAX_QUEUE, sizeof(*s->outbox));
	if (pbox_jobdesc_build(&s->desc, c->keys, c->nkeys, c->nranks, s->ncores,
			       c->chunk_bytes ? c->chunk_bytes : 32768,
			       c->frag_bytes ? c->frag_bytes : 1024, NULL, err, sizeof(err)) != 0) {
		fprintf(stderr, "sim: %s\n", err);
		return -1;
	}
	for (uint32_t r = 0; r < c->nranks; r++) {
		s->cookies[r] = 0x1000 + r * 7919;
	}
	s->job.wire.id = 42;
	s->job.wire.desc = &s->desc;
	s->job.wire.cookies = s->cookies;
	s->job.wire.accepts_init = c->mode == PBOX_MODE_SERVER_OPT;
	s->job.mode = c->mode;
	s->job.reduce = c->reduce;
	s->job.deterministic = c->deterministic;
	s->job.sync = pbox_sync_ops(c->sync.model);
	s->job.sync_cfg = c->sync;
	if (s->job.sync_cfg.quorum == 0) {
		s->job.sync_cfg.quorum = c->nranks;
	}
	s->job.credits = c->credits ? c->credits : 1;
	s->job.verify_crc = c->verify_crc;
	s->job.non_finite = c->non_finite;
	if (c->dvf != NULL) {
		s->job.dvf = *c->dvf;
		s->job.wire.accepts_dvf = c->dvf->enabled;
	}
	s->job.window = PBOX_MAX(c->window, pbox_job_min_window(c->mode, s->job.sync,
								&s->job.sync_cfg, s->job.credits));
	if (c->nranks == 0 || c->nranks > SIM_MAX_RANKS) {
		fprintf(stderr, "sim: %u ranks (1..%u)\n", c->nranks, SIM_MAX_RANKS);
		return -1;
	}
	for (uint32_t r = 0; r < c->nranks; r++) {
		pbox_bit_set(s->live, r);
	}
	s->job.live = s->live;
	s->job.nlive = c->nranks;
	s->job.generation = 1;
	s->job.opt = pbox_optimizer_find(c->optimizer ? c->optimizer : "sgd");
	s->job.opt_params = c->opt;
	s->job.state = pbox_job_state_create(&s->job);
	s->tab = calloc(1, sizeof(*s->tab) + sizeof(s->tab->jobs[0]));
	s->tab->njobs = 1;
	s->tab->jobs[0] = &s->job;
	for (uint32_t k = 0; k < s->ncores; k++) {
		s->ctx_core[k].s = s;
		s->ctx_core[k].idx = k;
		s->eng[k].core = k;
		s->eng[k].kern = pbox_kernels_get();
		s->eng[k].tx = &g_core_tx;
		s->eng[k].tx_ctx = &s->ctx_core[k];
		s->eng[k].stats = &s->stats[k];
		s->core_peer[k].ip = htonl(0x7f000001);
		s->core_peer[k].port = htons((uint16_t)(10000 + k));
	}
	for (uint32_t r = 0; r < c->nranks && !c->no_nodes; r++) {
		struct pbox_node_cfg nc = {
			.desc = &s->desc,
			.job = 42,
			.rank = r,
			.cookie = s->cookies[r],
			.server_opt = c->mode == PBOX_MODE_SERVER_OPT,
			.cores = s->core_peer,
			.tx = &g_rank_tx,
			.tx_ctx = &s->ctx_rank[r],
			.now_ns = sim_now,
			.now_arg = s,
			.rto_ms = c->rto_ms ? c->rto_ms : 10,
			.rto_min_ms = c->rto_min_ms,
			.pto_min_ms = c->pto_min_ms,
			.rto_max_ms = 80,
			.timeout_ms = c->timeout_ms ? c->timeout_ms : 2000,
			.staleness = s->job.sync->worker_staleness(&s->job.sync_cfg),
			.accept_newer = s->job.sync->folds_late && c->mode != PBOX_MODE_SERVER_OPT,
			.result_lag = c->mode == PBOX_MODE_BROADCAST
					      ? s->job.sync->worker_staleness(&s->job.sync_cfg)
					      : 0,
			.credits = s->job.credits,
			.plain = c->plain,
			.window_bytes = c->window_bytes,
			.crc = !c->sampled_words,
			.sampled_words = c->sampled_words,
			.dvf = c->dvf,
			.done = on_done,
			.done_arg = s,
		};

		s->ctx_rank[r].s = s;
		s->ctx_rank[r].idx = r;
		s->node[r] = pbox_node_create(&nc);
	}
	return s->job.state != NULL ? 0 : -1;
}

int sim_set_pacing(struct sim *s, const struct pbox_pace_cfg *tmpl)
{
	for (uint32_t k = 0; k < s->ncores; k++) {
		struct pbox_pace_cfg c = *tmpl;

		c.inner = &g_core_tx;
		c.inner_ctx = &s->ctx_core[k];
		c.now_ns = sim_now;
		c.now_arg = s;
		s->pace[k] = pbox_pace_create(&c);
		if (s->pace[k] == NULL) {
			return -ENOMEM;
		}
		s->eng[k].tx = &pbox_pace_tx_ops;
		s->eng[k].tx_ctx = s->pace[k];
	}
	return 0;
}

void sim_fini(struct sim *s)
{
	for (uint32_t k = 0; k < s->ncores; k++) {
		pbox_pace_destroy(s->pace[k]);
	}
	while (s->qhead != s->qtail) {
		free(s->q[s->qhead++ % SIM_MAX_QUEUE].data);
	}
	for (uint32_t i = 0; i < s->nheap; i++) {
		free(s->heap[i].p.data);
	}
	free(s->heap);
	free(s->up_free);
	free(s->down_free);
	for (uint32_t i = 0; i < s->nout; i++) {
		free(s->outbox[i].data);
	}
	free(s->outbox);
	for (uint32_t r = 0; r < s->nranks; r++) {
		pbox_node_destroy(s->node[r]);
	}
	for (uint32_t k = 0; k < s->ncores; k++) {
		pbox_engine_fini(&s->eng[k]);
	}
	pbox_job_state_free(s->job.state);
	pbox_tsb_free(s->job.tsb);
	pbox_jobdesc_free(&s->desc);
	free(s->tab);
	free(s->q);
}

uint64_t sim_pump(struct sim *s, uint64_t max)
{
	uint64_t n = 0;

	while ((s->links ? s->nheap > 0 && s->heap[0].at <= s->now_ns : s->qhead != s->qtail) &&
	       (max == 0 || n < max)) {
		struct sim_pkt p = s->links ? heap_pop(s).p : s->q[s->qhead++ % SIM_MAX_QUEUE];
		struct pbox_peer from = { 0 };

		if (p.dir == SIM_TO_APPLIANCE) {
			from.ip = htonl(0x7f000001);
			from.port = htons((uint16_t)(20000 + p.from));
			if (s->pace[p.to] != NULL) {
				pbox_pace_rx(s->pace[p.to], &from, p.len);
			}
			pbox_engine_rx(&s->eng[p.to], s->tab, p.data, p.len, &from);
			pbox_engine_flush(&s->eng[p.to]);
		} else if (s->node[p.to] != NULL) {
			from = p.from & SIM_FROM_RANK ? sim_rank_addr(p.from & ~SIM_FROM_RANK)
						      : s->core_peer[p.from];
			pbox_node_rx(s->node[p.to], p.data, p.len, &from);
			pbox_node_flush(s->node[p.to]);
		} else {
			/* No node: keep it for sim_take_reply. */
			if (s->nout == SIM_MAX_QUEUE) {
				fprintf(stderr, "sim: outbox overflow\n");
				abort();
			}
			s->outbox[s->nout++] = p;
			n++;
			continue;
		}
		free(p.data);
		s->delivered++;
		n++;
	}
	return n;
}

void sim_advance(struct sim *s, uint64_t ns)
{
	s->now_ns += ns;
	for (uint32_t r = 0; r < s->nranks; r++) {
		if (s->node[r] != NULL) {
			pbox_node_timers(s->node[r]);
			pbox_node_flush(s->node[r]);
		}
	}
	sim_pump(s, 0);
}

bool sim_run(struct sim *s, uint64_t until_ns)
{
	for (;;) {
		uint64_t next = s->nheap > 0 ? s->heap[0].at : UINT64_MAX;
		bool busy = false;

		for (uint32_t r = 0; r < s->nranks; r++) {
			if (s->node[r] != NULL) {
				pbox_node_timers(s->node[r]);
				pbox_node_flush(s->node[r]);
			}
		}
		for (uint32_t k = 0; k < s->ncores; k++) {
			if (s->pace[k] != NULL) {
				uint64_t nt = pbox_pace_poll(s->pace[k]);

				if (nt != UINT64_MAX) {
					next = PBOX_MIN(next, s->now_ns + PBOX_MAX(nt, 1u));
				}
			}
		}
		sim_pump(s, 0);
		next = PBOX_MIN(next, s->nheap > 0 ? s->heap[0].at : UINT64_MAX);
		for (uint32_t r = 0; r < s->nranks; r++) {
			uint64_t nt;

			if (s->node[r] == NULL || pbox_node_inflight(s->node[r]) == 0) {
				continue;
			}
			busy = true;
			nt = pbox_node_next_timer(s->node[r]);
			if (nt != UINT64_MAX) {
				next = PBOX_MIN(next, s->now_ns + nt);
			}
		}
		if (!busy) {
			return true;
		}
		if (next > until_ns) {
			s->now_ns = PBOX_MAX(s->now_ns, until_ns);
			return false;
		}
		s->now_ns = PBOX_MAX(s->now_ns, next);
	}
}

void sim_remove_rank(struct sim *s, uint32_t rank)
{
	pbox_bit_clear(s->live, rank);
	s->job.nlive--;
	s->job.generation++;
	for (uint32_t k = 0; k < s->ncores; k++) {
		pbox_engine_job_changed(&s->eng[k], s->tab);
		pbox_engine_flush(&s->eng[k]);
	}
	sim_pump(s, 0);
}

void sim_inject(struct sim *s, uint32_t from, const void *data, uint32_t len)
{
	struct pbox_peer p = { 0 };

	p.ip = htonl(0x7f000001);
	p.port = htons((uint16_t)(20000 + from));
	for (uint32_t k = 0; k < s->ncores; k++) {
		pbox_engine_rx(&s->eng[k], s->tab, data, len, &p);
		pbox_engine_flush(&s->eng[k]);
	}
}

struct pbox_peer sim_rank_addr(uint32_t rank)
{
	struct pbox_peer p = { 0 };

	p.ip = htonl(0x7f000001);
	p.port = htons((uint16_t)(20000 + rank));
	return p;
}

void sim_send_msg(struct sim *s, uint32_t rank, struct pbox_msg *m, const void *payload)
{
	struct pbox_peer p = sim_rank_addr(rank);

	sim_send_msg_from(s, rank, m, payload, &p);
}

void sim_send_msg_from(struct sim *s, uint32_t rank, struct pbox_msg *m, const void *payload,
		       const struct pbox_peer *from)
{
	uint8_t buf[PBOX_WIRE_HDR_LEN + PBOX_WIRE_MAX_PAYLOAD];
	uint32_t core = s->desc.chunks[m->chunk].core;

	m->job = 42;
	m->sender = rank;
	m->cookie = s->cookies[rank];
	m->chunk_len = s->desc.chunks[m->chunk].bytes;
	if (payload != NULL && m->encoding == PBOX_ENC_NONE) {
		m->encoding = PBOX_ENC_F32; /* the default; tests of other forms set theirs */
	}
	pbox_wire_encode(m, (struct pbox_wire_hdr *)buf);
	if (m->frag_len) {
		memcpy(buf + PBOX_WIRE_HDR_LEN, payload, m->frag_len);
	}
	pbox_engine_rx(&s->eng[core], s->tab, buf, PBOX_WIRE_HDR_LEN + m->frag_len, from);
	pbox_engine_flush(&s->eng[core]);
}

uint32_t sim_take_all(struct sim *s,
		      void (*fn)(uint32_t rank, const struct pbox_msg *m, const uint8_t *payload,
				 void *arg),
		      void *arg)
{
	uint32_t n = 0;

	sim_pump(s, 0);
	for (uint32_t i = 0; i < s->nout; i++) {
		struct pbox_msg m;

		if (pbox_wire_decode(s->outbox[i].data, s->outbox[i].len, &m) == PBOX_DROP_NONE) {
			m.payload = NULL;
			fn(s->outbox[i].to, &m, s->outbox[i].data + PBOX_WIRE_HDR_LEN, arg);
			n++;
		}
		free(s->outbox[i].data);
	}
	s->nout = 0;
	return n;
}

bool sim_take_reply(struct sim *s, uint32_t rank, struct pbox_msg *m, uint8_t *payload)
{
	sim_pump(s, 0);
	for (uint32_t i = 0; i < s->nout; i++) {
		struct sim_pkt mine = s->outbox[i];
		bool ok;

		if (mine.to != rank) {
			continue;
		}
		memmove(&s->outbox[i], &s->outbox[i + 1], (s->nout - i - 1) * sizeof(*s->outbox));
		s->nout--;
		ok = pbox_wire_decode(mine.data, mine.len, m) == PBOX_DROP_NONE;
		if (ok && m->frag_len && payload != NULL) {
			memcpy(payload, mine.data + PBOX_WIRE_HDR_LEN, m->frag_len);
		}
		m->payload = NULL;
		free(mine.data);
		return ok;
	}
	return false;
}

int sim_set_tree(struct sim *s, const uint32_t *parent, const struct pbox_tsb_key *key)
{
	s->job.tsb = pbox_tsb_create(parent, s->nranks, s->ncores, key);
	if (s->job.tsb == NULL) {
		return -ENOMEM;
	}
	for (uint32_t r = 0; r < s->nranks; r++) {
		struct pbox_tsb_pos pos = { .revision = 1, .parent = parent[r] };

		if (s->node[r] == NULL) {
			continue;
		}
		if (parent[r] != PBOX_TSB_ROOT) {
			pos.parent_addr = sim_rank_addr(parent[r]);
		}
		for (uint32_t c = 0; c < s->nranks; c++) {
			if (parent[c] == r) {
				pos.child[pos.nchildren] = c;
				pos.child_addr[pos.nchildren++] = sim_rank_addr(c);
			}
		}
		if (pbox_node_tsb_key(s->node[r], key) != 0 ||
		    pbox_node_tsb_position(s->node[r], &pos) != 0) {
			return -ENOMEM;
		}
	}
	return 0;
}
