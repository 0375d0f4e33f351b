/* SPDX-License-Identifier: BSD-3-Clause */
/* pboxd's side of the shared-memory transport (see pboxd_shm.h). */
#include "pboxd_shm.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <linux/magic.h>
#include <urcu-qsbr.h>

#include "common/ctlproto.h"
#include "common/log.h"
#include "engine/engine.h"
#include "pboxd/fdbudget.h"
#include "shm.h"

/* Datagrams taken from one connection's ring per poll: fairness between workers. */
#define SHM_POLL_BURST 32u
/* Bytes of replies a core holds for a worker whose ring is full (a descheduled worker),
 * per (connection, core), allocated at the first overflow. */
#define SHM_BACKLOG_BYTES (4u << 20)
/* Descriptors a connection holds in pboxd (pboxd/fdbudget.h): its socket and the worker's
 * eventfd for its life; until its welcome is sent also the rings' memfd and a dup of each
 * core's results' memfd. */
#define SHM_CONN_FDS     2u
#define SHM_HELLO_FDS(s) (1u + (s)->ncores)
/* A connection that says no hello within this long is closed (it holds a slot). */
#define SHM_HELLO_TIMEOUT_MS 5000u

/* A region a worker registered (pbox_mem_alloc), mapped read-only by pboxd. Immutable
 * once published in its connection's table; the listener frees it once every core
 * acknowledged the generation that unpublished it (dead_gen). */
struct shm_region {
	const uint8_t *base;
	uint64_t len;
	uint32_t id;
	uint64_t dead_gen;
	struct shm_region *next_dead;
};

enum conn_state {
	CONN_FREE = 0,
	CONN_HELLO,   /* accepted, hello not yet read (listener only) */
	CONN_LIVE,    /* rings set up; the cores list it */
	CONN_CLOSING, /* ended; freed once every core dropped it */
};

/* One worker connection: written by the listener, read by the cores once they saw it
 * LIVE under a generation (acquire). `bad` is the only field a core writes. */
struct shm_conn {
	_Atomic int state;
	_Atomic uint32_t bad; /* enum pbox_shm_err a core found (0: none) */
	uint32_t id;          /* 1 .. 2^24 - 1, the peer's address */
	uint32_t job, rank;
	bool welcomed;
	uint64_t accepted_ms; /* CLOCK_MONOTONIC, for the hello timeout */
	uint32_t fds_held;    /* descriptors of pboxd's budget (fdbudget.h): SHM_CONN_FDS */
	int sock;
	int wake_fd;       /* the worker's eventfd */
	int memfd_pending; /* until the welcome carried it */
	uint32_t nres;     /* results' memfds (dups of the job's) the welcome carries */
	int res_fd[PBOX_SHM_MAX_CORES];
	uint64_t res_bytes[PBOX_SHM_MAX_CORES];
	/* The job state whose results' arenas the worker maps (a reference, so its memory
	 * is not reused under a descriptor), and where pboxd has them; NULL: none. */
	struct pbox_job_state *res_state;
	uint8_t *res_base[PBOX_SHM_MAX_CORES];
	uint8_t *base;
	struct pbox_shm_layout lay;
	uint64_t add_gen, close_gen;
	/* Registered regions: published by the listener (release), read by the cores
	 * (acquire) while they list the connection. */
	_Atomic(struct shm_region *) reg[PBOX_SHM_MAX_REGIONS];
	uint32_t nreg, reg_seq;
	uint64_t reg_bytes;
	bool reg_logged;          /* a refusal was logged (once per connection: counted after) */
	struct shm_region *dying; /* unpublished, not yet unmapped */
};

/* Replies that found the worker's ring full, in the same record format, in the core's
 * private memory; moved to the ring in order as room appears. */
struct shm_backlog {
	struct pbox_shm_ring_ctl ctl;
	struct pbox_shm_prod p;
	struct pbox_shm_cons c;
	struct pbox_shm_dgram d;
	alignas(PBOX_CACHE_LINE) uint8_t data[SHM_BACKLOG_BYTES];
};

/* A core's private view of one connection slot. */
struct shm_local {
	bool live;
	bool touched; /* replies written since the last flush */
	uint32_t id;
	uint32_t broken_id; /* a connection this core found broken: never relisted */
	int wake_fd;
	struct pbox_peer peer;
	struct pbox_shm_cons rx; /* worker -> this core */
	struct pbox_shm_prod tx; /* this core -> worker */
	struct shm_backlog *bl;  /* NULL until the first overflow; freed with the connection */
	uint32_t job;
	const uint8_t *res_base; /* this core's results' arena of the job, as the worker has it */
	uint64_t res_len;        /* (NULL / 0: results are copied into the ring) */
	_Atomic(struct shm_region *) *regs; /* the connection's registered regions */
};

struct shm_core_stats {
	uint64_t rx_pkts;
	uint64_t rx_bytes;
	uint64_t tx_pkts;
	uint64_t tx_bytes;
	uint64_t tx_desc;    /* result datagrams sent as descriptors (payload left in place) */
	uint64_t tx_full;    /* replies dropped: the worker's ring and the backlog were full */
	uint64_t backlogged; /* replies that waited in the core's backlog for ring room */
	uint64_t tx_gone;    /* replies to a connection that ended or broke: sent after it did,
			      * the one that found its ring broken, or held in its backlog */
	uint64_t wakes;      /* eventfd writes to sleeping workers */
	uint64_t sleeps;     /* waits with the rings armed */
	uint64_t rx_ref;     /* pushes read in place from a worker's registered region */
	uint64_t bad_ref;    /* references outside a registered region (dropped) */
	uint64_t staged;     /* payloads copied into the core's stage before the engine */
	uint64_t broken[PBOX_SHM_ERR_COUNT];
};

struct shm_core {
	struct shm_core_stats st; /* first: its own cache lines */
	struct pboxd_shm *s;
	uint32_t k;
	int efd; /* workers (and the listener) ring this core */
	uint64_t seen_gen;
	_Atomic uint64_t acked_gen;
	struct pbox_engine *e;
	const struct pbox_tx_ops *inner;
	void *inner_ctx;
	uint64_t pushed; /* payload datagrams copied into rings */
	uint32_t nlive, ntouched;
	uint32_t *live;    /* slots, nlive of them */
	uint32_t *touched; /* slots, ntouched of them */
	struct shm_local *local;
	uint8_t *stage; /* PBOX_WIRE_MAX_PAYLOAD: encoded payloads, copied before decoding */
	bool stage_all; /* shm.stage_pushes: every payload copied there first */
	struct pbox_shm_dgram dg[SHM_POLL_BURST];
} PBOX_CACHE_ALIGNED;

struct pboxd_shm {
	struct pboxd_shm_cfg cfg;
	char name[108];
	uint32_t ncores;
	uint64_t ring_bytes;
	struct pbox_jobtab *const *tab;
	int lfd;
	int efd; /* the listener's doorbell: stop, or a core found a broken ring */
	bool stop;
	uint64_t sessions_ended; /* pboxd_shm_session_ended calls (atomic); the listener's: */
	uint64_t sessions_seen;
	bool started;
	pthread_t thread;
	_Atomic uint64_t gen;
	uint32_t next_id;
	struct shm_conn *conns;
	struct shm_core **cores;
	/* listener counters (relaxed) */
	uint64_t accepted, refused, auth_failed, bad_hello, closed;
	struct pbox_ratelog refuse_log;               /* listener only */
	uint64_t reg_ok, reg_refused, reg_bad, unreg; /* region (un)registrations */
	uint64_t reg_live, reg_live_bytes;
};

static const char *g_advertised;

const char *pboxd_shm_advertised(void)
{
	return __atomic_load_n(&g_advertised, __ATOMIC_ACQUIRE);
}

static void ring_fd(int fd)
{
	uint64_t one = 1;

	if (fd >= 0 && write(fd, &one, sizeof(one)) < 0) {
		/* saturated: the reader is awake anyway */
	}
}

static void drain_fd(int fd)
{
	uint64_t v;

	if (read(fd, &v, sizeof(v)) < 0) {
		/* EAGAIN: nobody rang */
	}
}

/* ---- the cores ---------------------------------------------------------------------- */

/* Replies the backlog still holds (pushed into it, not yet moved to the ring). */
static uint64_t backlog_held(const struct shm_local *loc)
{
	return loc->bl == NULL ? 0 : loc->bl->p.pushed - loc->bl->c.popped;
}

static void local_drop(struct shm_core *c, uint32_t slot)
{
	struct shm_local *loc = &c->local[slot];

	loc->live = false;
	/* The worker's overflow goes with it: counted, as every reply that never arrives. */
	PBOX_STAT_ADD(&c->st, tx_gone, backlog_held(loc));
	free(loc->bl);
	loc->bl = NULL;
	for (uint32_t i = 0; i < c->nlive; i++) {
		if (c->live[i] == slot) {
			c->live[i] = c->live[--c->nlive];
			break;
		}
	}
}

static void backlog_reset(struct shm_backlog *b)
{
	pbox_shm_ring_ctl_init(&b->ctl);
	pbox_shm_prod_init(&b->p, &b->ctl, b->data, SHM_BACKLOG_BYTES);
	pbox_shm_cons_init(&b->c, &b->ctl, b->data, SHM_BACKLOG_BYTES);
	b->c.accept_desc = true; /* pboxd's own records */
}

static bool backlog_empty(const struct shm_local *loc)
{
	return loc->bl == NULL || loc->bl->p.tail == loc->bl->c.head;
}

static void touch(struct shm_core *c, uint32_t slot)
{
	if (!c->local[slot].touched) {
		c->local[slot].touched = true;
		c->touched[c->ntouched++] = slot;
	}
}

/* Move what the backlog holds into the worker's ring while it has room. Returns how many
 * replies moved (0: the ring has no room, or it broke: loc->tx.err says so). */
static unsigned backlog_drain(struct shm_core *c, uint32_t slot)
{
	struct shm_local *loc = &c->local[slot];
	struct shm_backlog *b = loc->bl;
	unsigned moved = 0;

	while (b->p.tail != b->c.head && pbox_shm_prod_fits(&loc->tx, PBOX_WIRE_MAX_PAYLOAD) &&
	       pbox_shm_cons_pop(&b->c, &b->d, 1) == 1) {
		/* It fits (checked): only a ring found broken meanwhile refuses it. */
		if (pbox_shm_push_dgram(&loc->tx, &b->d) != 0) {
			PBOX_STAT_ADD(&c->st, tx_gone, 1);
			pbox_shm_cons_release(&b->c);
			break;
		}
		pbox_shm_cons_release(&b->c);
		touch(c, slot);
		moved++;
	}
	if (b->p.tail == b->c.head) {
		pbox_shm_prod_room_ok(&loc->tx);
	}
	return moved;
}

/* Pick up connections added or ended since the last look; acknowledge the generation. */
static void rebuild(struct shm_core *c)
{
	struct pboxd_shm *s = c->s;
	uint64_t g = atomic_load_explicit(&s->gen, memory_order_acquire);

	if (pbox_likely(g == c->seen_gen)) {
		return;
	}
	for (uint32_t slot = 0; slot < s->cfg.max_conns; slot++) {
		struct shm_conn *cn = &s->conns[slot];
		struct shm_local *loc = &c->local[slot];
		int st = atomic_load_explicit(&cn->state, memory_order_acquire);

		if (st == CONN_LIVE && cn->add_gen <= g && (!loc->live || loc->id != cn->id)) {
			if (loc->live) {
				local_drop(c, slot);
			}
			if (loc->broken_id == cn->id) {
				continue;
			}
			loc->id = cn->id;
			loc->wake_fd = cn->wake_fd;
			loc->touched = false;
			memset(&loc->peer, 0, sizeof(loc->peer));
			loc->peer.ip = htonl(cn->id);
			loc->peer.port = htons((uint16_t)(slot + 1));
			loc->peer.ifport = PBOX_SHM_IFPORT;
			loc->job = cn->job;
			loc->res_base = cn->res_state != NULL ? cn->res_base[c->k] : NULL;
			loc->res_len = cn->res_state != NULL ? cn->res_bytes[c->k] : 0;
			pbox_shm_cons_init(&loc->rx, pbox_shm_ctl_w2a(cn->base, c->k),
					   pbox_shm_data_w2a(cn->base, &cn->lay, c->k),
					   cn->lay.ring_bytes);
			loc->rx.accept_ref = true;
			loc->regs = cn->reg;
			pbox_shm_prod_init(&loc->tx, pbox_shm_ctl_a2w(cn->base, c->k),
					   pbox_shm_data_a2w(cn->base, &cn->lay, c->k),
					   cn->lay.ring_bytes);
			loc->live = true;
			c->live[c->nlive++] = slot;
		} else if (st != CONN_LIVE && loc->live) {
			local_drop(c, slot);
		}
	}
	/* Replies queued for a connection just dropped are not woken for: it is gone. (A
	 * generation also moves for a region unregistered: live ones keep their wake-up.) A
	 * slot taken over by a new connection above is live with its flag cleared: it is
	 * dropped from the list too, or its next touch() would list it twice. */
	{
		uint32_t kept = 0;

		for (uint32_t i = 0; i < c->ntouched; i++) {
			if (c->local[c->touched[i]].live && c->local[c->touched[i]].touched) {
				c->touched[kept++] = c->touched[i];
			} else {
				c->local[c->touched[i]].touched = false;
			}
		}
		c->ntouched = kept;
	}
	c->seen_gen = g;
	atomic_store_explicit(&c->acked_gen, g, memory_order_release);
}

static void broken(struct shm_core *c, uint32_t slot, enum pbox_shm_err err)
{
	struct shm_conn *cn = &c->s->conns[slot];
	struct shm_local *loc = &c->local[slot];

	PBOX_STAT_ADD(&c->st, broken[err], 1);
	PBOX_LOG_WARN(TRANSPORT, "shm connection %u (job %u rank %u), core %u: %s; ending it",
		      loc->id, cn->job, cn->rank, c->k, pbox_shm_err_name(err));
	loc->broken_id = loc->id;
	if (loc->touched) {
		loc->touched = false;
		for (uint32_t i = 0; i < c->ntouched; i++) {
			if (c->touched[i] == slot) {
				c->touched[i] = c->touched[--c->ntouched];
				break;
			}
		}
	}
	local_drop(c, slot);
	atomic_store_explicit(&cn->bad, (uint32_t)err, memory_order_release);
	ring_fd(c->s->efd);
}

/*
 * The payload a reference record names: the reference is copied out of the ring once
 * (the worker may rewrite it), then bounded against the region as pboxd mapped it (its
 * size, sealed against shrinking when it was registered, so every byte in bounds is
 * backed). NULL if it names no region of this connection (never registered,
 * unregistered, or a reused slot's older id), a zero or too large length, or bytes past
 * the region's end: the datagram is dropped (counted, bad_ref), the ring stays intact.
 * The payload bytes themselves may change while the engine reads them: they are the
 * worker's own contribution (see pboxd_shm.h).
 */
static const void *region_payload(const struct shm_local *loc, const struct pbox_shm_dgram *d,
				  uint32_t *len)
{
	struct pbox_shm_ref ref;
	const struct shm_region *r;

	memcpy(&ref, d->payload, sizeof(ref));
	r = atomic_load_explicit(&loc->regs[PBOX_SHM_REGION_SLOT(ref.region)],
				 memory_order_acquire);
	if (r == NULL) {
		return NULL;
	}
	*len = ref.len;
	return pbox_shm_ref_payload(&ref, r->id, r->base, r->len);
}

static enum pbox_poll_rc shm_poll(void *arg, struct pbox_loop *l)
{
	struct shm_core *c = arg;
	const struct pbox_jobtab *tab = NULL;
	bool any = false;

	rebuild(c);
	for (uint32_t i = 0; i < c->nlive; i++) {
		uint32_t slot = c->live[i];
		struct shm_local *loc = &c->local[slot];
		unsigned n = pbox_shm_cons_pop(&loc->rx, c->dg, SHM_POLL_BURST);

		if (pbox_unlikely(loc->rx.err != PBOX_SHM_OK)) {
			broken(c, slot, loc->rx.err);
			i--; /* the slot at i was replaced by the last one */
			continue;
		}
		if (pbox_unlikely(!backlog_empty(loc))) {
			unsigned moved = backlog_drain(c, slot);

			if (pbox_unlikely(loc->tx.err != PBOX_SHM_OK)) {
				broken(c, slot, loc->tx.err);
				i--;
				continue;
			}
			/* Busy only if replies moved (the flush wakes the worker). A ring still
			 * full is not work: the core may sleep, sleep_prepare arms prod_waiting
			 * and the worker rings it when it frees room (spinning here took the CPU
			 * a descheduled worker needs to catch up, and hammered its ring). */
			any |= moved != 0;
		}
		if (n == 0) {
			continue;
		}
		if (tab == NULL) {
			tab = pbox_loop_table(l);
		}
		for (unsigned j = 0; j < n; j++) {
			const struct pbox_shm_dgram *d = &c->dg[j];
			struct pbox_iov seg[2] = {
				{ d->hdr, PBOX_MIN(d->len, (uint32_t)PBOX_WIRE_HDR_LEN) },
				{ d->payload, d->len - seg[0].len },
			};

			if (d->kind == PBOX_SHM_REC_REF) {
				seg[1].base = region_payload(loc, d, &seg[1].len);
				if (pbox_unlikely(seg[1].base == NULL)) {
					PBOX_STAT_ADD(&c->st, bad_ref, 1);
					continue;
				}
				PBOX_STAT_ADD(&c->st, rx_ref, 1);
			}
			/* An encoded payload (DVF) is decoded in passes that trust what an
			 * earlier one checked (a bitmap's population, then values read by
			 * it): a worker rewriting it in between would make the add read past
			 * the payload, past a region's end. Copied first (they are small). A
			 * dense payload is read as values only: copied only with
			 * shm.stage_pushes (the non-finite check and the add then read the
			 * same bytes). */
			if (pbox_unlikely(seg[1].base != NULL &&
					  (c->stage_all ||
					   ((const struct pbox_wire_hdr *)(const void *)d->hdr)
							   ->encoding != PBOX_ENC_F32))) {
				memcpy(c->stage, seg[1].base, seg[1].len);
				seg[1].base = c->stage;
				PBOX_STAT_ADD(&c->st, staged, 1);
			}
			PBOX_STAT_ADD(&c->st, rx_bytes,
				      d->kind == PBOX_SHM_REC_REF ? PBOX_WIRE_HDR_LEN + seg[1].len
								  : d->len);
			pbox_engine_rx_iov(c->e, tab, seg, seg[1].base != NULL ? 2 : 1, &loc->peer);
		}
		PBOX_STAT_ADD(&c->st, rx_pkts, n);
		/* The engine read them during the calls: the room goes back now. */
		pbox_shm_cons_release(&loc->rx);
		any = true;
	}
	if (!any) {
		return PBOX_POLL_IDLE;
	}
	pbox_engine_flush(c->e);
	return PBOX_POLL_BUSY;
}

static int shm_sleep_prepare(void *arg)
{
	struct shm_core *c = arg;

	if (atomic_load_explicit(&c->s->gen, memory_order_acquire) != c->seen_gen) {
		return -EAGAIN;
	}
	if (c->nlive == 0) {
		return -1;
	}
	for (uint32_t i = 0; i < c->nlive; i++) {
		struct shm_local *loc = &c->local[c->live[i]];

		/* Held-back results: sleep only if the worker will say when room appears. */
		if (!backlog_empty(loc) &&
		    pbox_shm_prod_wait_room(&loc->tx, PBOX_WIRE_MAX_PAYLOAD)) {
			atomic_store_explicit(&loc->tx.ctl->prod_waiting, 1, memory_order_relaxed);
			for (uint32_t j = 0; j < i; j++) {
				pbox_shm_cons_sleep_end(&c->local[c->live[j]].rx);
			}
			return -EAGAIN;
		}
		if (!pbox_shm_cons_sleep_prepare(&loc->rx)) {
			for (uint32_t j = 0; j < i; j++) {
				pbox_shm_cons_sleep_end(&c->local[c->live[j]].rx);
			}
			return -EAGAIN;
		}
	}
	PBOX_STAT_ADD(&c->st, sleeps, 1);
	return c->efd;
}

static void shm_sleep_end(void *arg)
{
	struct shm_core *c = arg;

	for (uint32_t i = 0; i < c->nlive; i++) {
		pbox_shm_cons_sleep_end(&c->local[c->live[i]].rx);
	}
	drain_fd(c->efd);
}

static const struct pbox_loop_poller shm_poller = {
	.poll = shm_poll,
	.sleep_prepare = shm_sleep_prepare,
	.sleep_end = shm_sleep_end,
};

/* ---- the engine's send multiplexer ---------------------------------------------------- */

/*
 * Whether a reply goes as a descriptor, and which: a dense result fragment (DATA, f32,
 * not a tree relay's) of the connection's own job whose payload is a result buffer in
 * this core's results' arena of that job, the one the worker maps (engine/job.h: the
 * buffer starts frag_off bytes before the payload, one struct pbox_res_line after its
 * generation line). Everything else is copied into the ring as before.
 */
static bool result_desc(const struct shm_local *loc, const struct pbox_wire_hdr *hdr,
			const void *payload, uint32_t len, struct pbox_shm_desc *d)
{
	const uint8_t *p = payload, *base = loc->res_base;
	const struct pbox_res_line *l;
	uint32_t foff;

	if (base == NULL || len == 0 || hdr->type != PBOX_MSG_DATA ||
	    hdr->encoding != PBOX_ENC_F32 || (be16toh(hdr->flags) & PBOX_F_TREE) ||
	    be32toh(hdr->job) != loc->job) {
		return false;
	}
	foff = be32toh(hdr->frag_off);
	if (p < base || (uint64_t)(p - base) < (uint64_t)foff + sizeof(*l) ||
	    (uint64_t)(p - base) + len > loc->res_len) {
		return false;
	}
	l = (const struct pbox_res_line *)(const void *)(p - foff - sizeof(*l));
	if (((uintptr_t)l & (PBOX_CACHE_LINE - 1)) != 0 || l->magic != PBOX_RES_MAGIC) {
		return false;
	}
	d->data_off = (uint64_t)(p - base);
	d->gen_off = (uint64_t)((const uint8_t *)&l->gen - base);
	d->gen = __atomic_load_n(&l->gen, __ATOMIC_RELAXED); /* this core writes it */
	d->len = len;
	d->pad = 0;
	return true;
}

static int mux_send(void *ctx, const struct pbox_peer *to, const struct pbox_wire_hdr *hdr,
		    const void *payload, uint32_t len)
{
	struct shm_core *c = ctx;
	struct shm_local *loc;
	struct pbox_shm_desc desc;
	bool is_desc;
	uint32_t slot;
	int rc;

	if (pbox_likely(to->ifport != PBOX_SHM_IFPORT)) {
		return c->inner->send(c->inner_ctx, to, hdr, payload, len);
	}
	slot = (uint32_t)ntohs(to->port) - 1u;
	if (pbox_unlikely(slot >= c->s->cfg.max_conns || !c->local[slot].live ||
			  c->local[slot].id != ntohl(to->ip))) {
		PBOX_STAT_ADD(&c->st, tx_gone, 1);
		return -EHOSTUNREACH;
	}
	loc = &c->local[slot];
	is_desc = result_desc(loc, hdr, payload, len, &desc);
	/* In order: while replies wait in the backlog, new ones queue behind them. */
	rc = !backlog_empty(loc) ? -ENOBUFS
	     : is_desc           ? pbox_shm_push_desc(&loc->tx, hdr, &desc)
				 : pbox_shm_push(&loc->tx, hdr, payload, len);
	if (pbox_unlikely(rc == -ENOBUFS)) {
		if (loc->bl == NULL) {
			loc->bl = aligned_alloc(PBOX_CACHE_LINE, sizeof(*loc->bl));
			if (loc->bl != NULL) {
				backlog_reset(loc->bl);
			}
		}
		rc = loc->bl == NULL ? -ENOBUFS
		     : is_desc       ? pbox_shm_push_desc(&loc->bl->p, hdr, &desc)
				     : pbox_shm_push(&loc->bl->p, hdr, payload, len);
		if (rc != 0) {
			PBOX_STAT_ADD(&c->st, tx_full, 1);
			return -ENOBUFS;
		}
		/* The worker rings this core when it frees room (before the core sleeps,
		 * sleep_prepare looks once more). */
		atomic_store_explicit(&loc->tx.ctl->prod_waiting, 1, memory_order_relaxed);
		PBOX_STAT_ADD(&c->st, backlogged, 1);
	} else if (pbox_unlikely(rc != 0)) {
		/* A broken ring (the connection ends) or a payload too large: never arrives. */
		PBOX_STAT_ADD(&c->st, tx_gone, 1);
		if (loc->tx.err != PBOX_SHM_OK) {
			broken(c, slot, loc->tx.err);
		}
		return rc;
	}
	PBOX_STAT_ADD(&c->st, tx_pkts, 1);
	PBOX_STAT_ADD(&c->st, tx_bytes, PBOX_WIRE_HDR_LEN + len);
	PBOX_STAT_ADD(&c->st, tx_desc, is_desc);
	c->pushed += len != 0;
	touch(c, slot);
	return 0;
}

static void mux_flush(void *ctx)
{
	struct shm_core *c = ctx;

	c->inner->flush(c->inner_ctx);
	for (uint32_t i = 0; i < c->ntouched; i++) {
		struct shm_local *loc = &c->local[c->touched[i]];

		loc->touched = false;
		if (pbox_shm_prod_need_wake(&loc->tx)) {
			PBOX_STAT_ADD(&c->st, wakes, 1);
			ring_fd(loc->wake_fd);
		}
	}
	c->ntouched = 0;
}

static uint64_t mux_queued(void *ctx)
{
	struct shm_core *c = ctx;

	return c->inner->queued(c->inner_ctx) + c->pushed;
}

/* Ring writes copy: only the inner transport's datagrams can still be referenced, and it
 * releases all of them (the attach contract). */
static uint64_t mux_reclaim(void *ctx, uint64_t upto)
{
	struct shm_core *c = ctx;

	(void)upto;
	return c->inner->reclaim(c->inner_ctx, c->inner->queued(c->inner_ctx)) + c->pushed;
}

static const struct pbox_tx_ops mux_ops = {
	.send = mux_send,
	.flush = mux_flush,
	.queued = mux_queued,
	.reclaim = mux_reclaim,
};

void pboxd_shm_core_attach(struct pboxd_shm *s, uint32_t k, struct pbox_loop *l)
{
	struct shm_core *c = s->cores[k];

	c->e = l->engine;
	c->inner = l->engine->tx;
	c->inner_ctx = l->engine->tx_ctx;
	l->engine->tx = &mux_ops;
	l->engine->tx_ctx = c;
	l->poller = &shm_poller;
	l->poller_arg = c;
}

/* ---- results' arenas ----------------------------------------------------------------- */

/* Descriptors results' memfds never take, whatever pboxd's budget (pboxd/fdbudget.h, where
 * every memfd is counted) says: a second guard against descriptors the budget does not
 * count. */
#define SHM_RES_FD_RESERVE 64u

static uint64_t g_res_fds; /* results' memfds open (atomic) */

/* One sealed memfd per (job, core): pboxd maps it read-write before sealing it against
 * new writable mappings, so the workers it is handed to map it read-only. A memfd that
 * would leave fewer than SHM_RES_FD_RESERVE descriptors under the open-file limit is not
 * taken: -EMFILE (the state then keeps its results in its own arena: copies). */
static int res_alloc(void *ctx, size_t bytes, uint32_t job, uint32_t core, void **p, int *handle)
{
	char name[48];
	struct rlimit rl;
	int fd, err;
	void *m;

	(void)ctx;
	if (pboxd_fd_take(PBOXD_FD_RESULTS, 1) != 0) {
		char why[160];

		PBOX_LOG_WARN(TRANSPORT,
			      "job %u core %u: no results' arena: out of file descriptors in "
			      "pboxd's budget (%s; results' memfds leave %u for connections)",
			      job, core, pboxd_fd_explain(why, sizeof(why)),
			      PBOXD_FD_CONN_HEADROOM);
		return -EMFILE;
	}
	snprintf(name, sizeof(name), "pbox-results-j%u-c%u", job, core);
	fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	/* Descriptors are allocated lowest first: every one below fd is taken. */
	if (fd >= 0 && getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
	    (uint64_t)fd + SHM_RES_FD_RESERVE >= (uint64_t)rl.rlim_cur) {
		close(fd);
		fd = -1;
		errno = EMFILE;
	}
	if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) {
		goto fail;
	}
	/* Populated now: the first results do not take page faults on the core. */
	m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
	if (m == MAP_FAILED) {
		goto fail;
	}
	if (fcntl(fd, F_ADD_SEALS, PBOX_SHM_RES_SEALS) != 0) {
		err = errno;
		munmap(m, bytes);
		errno = err;
		goto fail;
	}
	*p = m;
	*handle = fd;
	__atomic_fetch_add(&g_res_fds, 1, __ATOMIC_RELAXED);
	return 0;
fail:
	err = errno;
	PBOX_LOG_ERR(TRANSPORT, "job %u core %u: cannot create %zu bytes of results' arena: %s",
		     job, core, bytes,
		     err == EMFILE || err == ENFILE ? "out of file descriptors (EMFILE)"
						    : strerror(err));
	if (fd >= 0) {
		close(fd);
	}
	pboxd_fd_give(PBOXD_FD_RESULTS, 1);
	return -err;
}

static void res_free(void *ctx, void *p, size_t bytes, int handle)
{
	(void)ctx;
	munmap(p, bytes);
	close(handle);
	pboxd_fd_give(PBOXD_FD_RESULTS, 1);
	__atomic_fetch_sub(&g_res_fds, 1, __ATOMIC_RELAXED);
}

const struct pbox_result_ops pboxd_shm_result_ops = { res_alloc, res_free, NULL };

/* ---- the listener ------------------------------------------------------------------- */

static void region_unmap(struct pboxd_shm *s, struct shm_region *r)
{
	__atomic_fetch_sub(&s->reg_live, 1, __ATOMIC_RELAXED);
	__atomic_fetch_sub(&s->reg_live_bytes, r->len, __ATOMIC_RELAXED);
	munmap((void *)r->base, r->len);
	free(r);
}

static void conn_free(struct pboxd_shm *s, struct shm_conn *cn)
{
	if (cn->sock >= 0) {
		close(cn->sock);
	}
	if (cn->wake_fd >= 0) {
		close(cn->wake_fd);
	}
	if (cn->memfd_pending >= 0) {
		close(cn->memfd_pending);
	}
	for (uint32_t k = 0; k < cn->nres; k++) {
		close(cn->res_fd[k]);
	}
	if (cn->fds_held != 0) {
		pboxd_fd_give(PBOXD_FD_SHM, cn->fds_held);
		cn->fds_held = 0;
	}
	cn->nres = 0;
	pbox_job_state_put(cn->res_state); /* no core lists the connection any more */
	cn->res_state = NULL;
	/* No core lists the connection: its regions go, live and dying alike. */
	for (uint32_t i = 0; i < PBOX_SHM_MAX_REGIONS; i++) {
		struct shm_region *r = atomic_load_explicit(&cn->reg[i], memory_order_relaxed);

		if (r != NULL) {
			atomic_store_explicit(&cn->reg[i], NULL, memory_order_relaxed);
			r->next_dead = cn->dying;
			cn->dying = r;
		}
	}
	while (cn->dying != NULL) {
		struct shm_region *r = cn->dying;

		cn->dying = r->next_dead;
		region_unmap(s, r);
	}
	cn->nreg = 0;
	cn->reg_bytes = 0;
	cn->reg_logged = false;
	if (cn->base != NULL) {
		munmap(cn->base, cn->lay.seg_bytes);
	}
	cn->sock = cn->wake_fd = cn->memfd_pending = -1;
	cn->base = NULL;
	cn->welcomed = false;
	cn->job = cn->rank = cn->id = 0;
	cn->add_gen = cn->close_gen = 0;
	atomic_store_explicit(&cn->bad, 0, memory_order_relaxed);
	atomic_store_explicit(&cn->state, CONN_FREE, memory_order_release);
}

static void ring_cores(struct pboxd_shm *s)
{
	for (uint32_t k = 0; k < s->ncores; k++) {
		ring_fd(s->cores[k]->efd);
	}
}

static bool cores_acked(const struct pboxd_shm *s, uint64_t g)
{
	for (uint32_t k = 0; k < s->ncores; k++) {
		if (atomic_load_explicit(&s->cores[k]->acked_gen, memory_order_acquire) < g) {
			return false;
		}
	}
	return true;
}

/* End a live connection: the worker sees its socket close; the memory goes once every
 * core dropped it. */
static void conn_end(struct pboxd_shm *s, struct shm_conn *cn, const char *why)
{
	PBOX_LOG_INFO(TRANSPORT, "shm connection %u (job %u rank %u) ended: %s", cn->id, cn->job,
		      cn->rank, why);
	if (cn->sock >= 0) {
		close(cn->sock);
		cn->sock = -1;
	}
	cn->close_gen = atomic_load_explicit(&s->gen, memory_order_relaxed) + 1;
	atomic_store_explicit(&cn->state, CONN_CLOSING, memory_order_release);
	atomic_store_explicit(&s->gen, cn->close_gen, memory_order_release);
	__atomic_fetch_add(&s->closed, 1, __ATOMIC_RELAXED);
	ring_cores(s);
}

/* A connection pins the job state it was admitted with (its descriptors point into that
 * state's results' arenas): once the published table no longer lists that state (its
 * session ended), the connection ends too, so the state and its bytes, which the memory
 * budget already gave back, go now rather than when the worker disconnects. */
static void end_stale_sessions(struct pboxd_shm *s)
{
	uint64_t n = __atomic_load_n(&s->sessions_ended, __ATOMIC_ACQUIRE);

	if (n == s->sessions_seen) {
		return;
	}
	s->sessions_seen = n;
	rcu_thread_online();
	for (uint32_t i = 0; i < s->cfg.max_conns; i++) {
		struct shm_conn *cn = &s->conns[i];
		const struct pbox_job *j;

		if (atomic_load_explicit(&cn->state, memory_order_relaxed) != CONN_LIVE ||
		    cn->res_state == NULL) {
			continue;
		}
		j = pbox_jobtab_find(rcu_dereference(*s->tab), cn->job);
		if (j == NULL || j->state != cn->res_state) {
			conn_end(s, cn, "its session ended");
		}
	}
	rcu_thread_offline();
}

void pboxd_shm_session_ended(struct pboxd_shm *s)
{
	if (s == NULL) {
		return;
	}
	__atomic_fetch_add(&s->sessions_ended, 1, __ATOMIC_RELEASE);
	ring_fd(s->efd);
}

static void refuse(struct pboxd_shm *s, struct shm_conn *cn, uint32_t status)
{
	struct pbox_shm_welcome w = { .magic = PBOX_SHM_MAGIC,
				      .version = PBOX_SHM_VERSION,
				      .status = status };

	(void)pbox_shm_send_fds(cn->sock, &w, sizeof(w), NULL, 0);
	conn_free(s, cn);
}

/* Whether (job, rank, cookie) is an admitted worker in the published table. If so, and
 * the job's state has results' arenas (one per core), cn gets its own descriptors of
 * them (dup, in the same read-side section: the state the table lists is alive). */
static bool admitted(struct pboxd_shm *s, const struct pbox_shm_hello *h, struct shm_conn *cn)
{
	const struct pbox_job *j;
	bool ok = false;

	rcu_thread_online();
	j = pbox_jobtab_find(rcu_dereference(*s->tab), h->job);
	if (j != NULL && h->rank < j->wire.desc->nworkers && h->cookie != 0 &&
	    j->wire.cookies[h->rank] == h->cookie) {
		ok = true;
		if (j->state != NULL && j->state->result_ops == &pboxd_shm_result_ops &&
		    j->state->ncores == s->ncores) {
			for (uint32_t k = 0; k < s->ncores; k++) {
				int fd = fcntl(j->state->core[k].res_handle, F_DUPFD_CLOEXEC, 0);

				if (fd < 0) {
					break; /* out of descriptors: the copy path serves it */
				}
				cn->res_fd[cn->nres] = fd;
				cn->res_bytes[cn->nres++] = j->state->core[k].res_bytes;
			}
			if (cn->nres != s->ncores) {
				for (uint32_t k = 0; k < cn->nres; k++) {
					close(cn->res_fd[k]);
				}
				cn->nres = 0;
			} else {
				pbox_job_state_get(j->state);
				cn->res_state = j->state;
				for (uint32_t k = 0; k < s->ncores; k++) {
					cn->res_base[k] = j->state->core[k].res_arena;
				}
			}
		}
	}
	rcu_thread_offline();
	return ok;
}

/* The hello of a new connection: check it, set up its memory, list it for the cores. */
static void on_hello(struct pboxd_shm *s, struct shm_conn *cn)
{
	struct pbox_shm_hello h;
	unsigned nfds = 0;
	int fds[1], memfd = -1;
	int rc = pbox_shm_recv_fds(cn->sock, &h, sizeof(h), fds, 0, &nfds);

	if (rc == -EAGAIN) {
		return;
	}
	if (rc != 0 || h.magic != PBOX_SHM_MAGIC || h.version != PBOX_SHM_VERSION) {
		__atomic_fetch_add(&s->bad_hello, 1, __ATOMIC_RELAXED);
		refuse(s, cn, EPROTO);
		return;
	}
	if (!admitted(s, &h, cn)) {
		__atomic_fetch_add(&s->auth_failed, 1, __ATOMIC_RELAXED);
		PBOX_LOG_INFO(TRANSPORT, "shm: refused job %u rank %u: not an admitted worker",
			      h.job, h.rank);
		refuse(s, cn, EACCES);
		return;
	}
	cn->job = h.job;
	cn->rank = h.rank;
	pbox_shm_layout(&cn->lay, s->ncores, s->ring_bytes);
	memfd = memfd_create("pbox-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	cn->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (memfd < 0 || cn->wake_fd < 0 || ftruncate(memfd, (off_t)cn->lay.seg_bytes) != 0 ||
	    fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
		PBOX_LOG_ERR(TRANSPORT,
			     "shm: job %u rank %u: cannot create %llu bytes of rings: %s", h.job,
			     h.rank, (unsigned long long)cn->lay.seg_bytes, strerror(errno));
		goto fail;
	}
	cn->base = mmap(NULL, cn->lay.seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (cn->base == MAP_FAILED) {
		cn->base = NULL;
		PBOX_LOG_ERR(TRANSPORT, "shm: job %u rank %u: cannot map its rings: %s", h.job,
			     h.rank, strerror(errno));
		goto fail;
	}
	for (uint32_t k = 0; k < s->ncores; k++) {
		pbox_shm_ring_ctl_init(pbox_shm_ctl_w2a(cn->base, k));
		pbox_shm_ring_ctl_init(pbox_shm_ctl_a2w(cn->base, k));
	}
	cn->id = s->next_id;
	s->next_id = s->next_id + 1 >= (1u << 24) ? 1 : s->next_id + 1;
	cn->memfd_pending = memfd;
	cn->add_gen = atomic_load_explicit(&s->gen, memory_order_relaxed) + 1;
	atomic_store_explicit(&cn->state, CONN_LIVE, memory_order_release);
	atomic_store_explicit(&s->gen, cn->add_gen, memory_order_release);
	__atomic_fetch_add(&s->accepted, 1, __ATOMIC_RELAXED);
	ring_cores(s);
	return;
fail:
	if (memfd >= 0) {
		close(memfd);
	}
	refuse(s, cn, ENOMEM);
}

/* A region registration: the memfd must be what it says (a regular file of `bytes`
 * bytes) and sealed against shrinking before pboxd maps it: a file truncated under
 * pboxd's mapping would fault (SIGBUS) on the core that reads it. It must be plain shmem
 * (tmpfs): a hugetlbfs memfd whose hole the worker punched is refilled on pboxd's fault
 * from the huge page pool, and an empty pool is a SIGBUS too. Not populated: pboxd's
 * faults allocate only pages a push referenced. Returns the status of the answer (0, or a
 * positive errno) and, for 0, the region's id. */
static uint32_t region_add(struct pboxd_shm *s, struct shm_conn *cn,
			   const struct pbox_shm_memreq *rq, int fd, uint32_t *id)
{
	uint64_t limit = (uint64_t)s->cfg.max_region_mb << 20;
	struct shm_region *r;
	uint32_t slot = PBOX_SHM_MAX_REGIONS;
	struct statfs sf;
	struct stat st;
	int seals;
	void *m;

	seals = fcntl(fd, F_GET_SEALS);
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || fstatfs(fd, &sf) != 0 ||
	    sf.f_type != TMPFS_MAGIC || rq->bytes == 0 || (uint64_t)st.st_size != rq->bytes ||
	    rq->bytes > SIZE_MAX || seals < 0 ||
	    (seals & PBOX_SHM_MEM_SEALS_REQUIRED) != PBOX_SHM_MEM_SEALS_REQUIRED) {
		if (!cn->reg_logged) { /* once per connection: a worker could flood the log */
			cn->reg_logged = true;
			PBOX_LOG_WARN(TRANSPORT,
				      "shm connection %u (job %u rank %u): region of %llu bytes "
				      "refused: not a (tmpfs) memfd of that size sealed against "
				      "shrinking",
				      cn->id, cn->job, cn->rank, (unsigned long long)rq->bytes);
		}
		__atomic_fetch_add(&s->reg_bad, 1, __ATOMIC_RELAXED);
		return EPERM;
	}
	for (uint32_t i = 0; i < s->cfg.max_regions && cn->nreg < s->cfg.max_regions; i++) {
		if (atomic_load_explicit(&cn->reg[i], memory_order_relaxed) == NULL) {
			slot = i;
			break;
		}
	}
	if (slot == PBOX_SHM_MAX_REGIONS || rq->bytes > limit - PBOX_MIN(limit, cn->reg_bytes)) {
		if (!cn->reg_logged) {
			cn->reg_logged = true;
			PBOX_LOG_INFO(TRANSPORT,
				      "shm connection %u (job %u rank %u): region of %llu bytes "
				      "refused: %u regions of %llu bytes held (shm.max_regions %u, "
				      "max_region_mb %u)",
				      cn->id, cn->job, cn->rank, (unsigned long long)rq->bytes,
				      cn->nreg, (unsigned long long)cn->reg_bytes,
				      s->cfg.max_regions, s->cfg.max_region_mb);
		}
		__atomic_fetch_add(&s->reg_refused, 1, __ATOMIC_RELAXED);
		return ENOSPC;
	}
	m = mmap(NULL, (size_t)rq->bytes, PROT_READ, MAP_SHARED, fd, 0);
	r = calloc(1, sizeof(*r));
	if (m == MAP_FAILED || r == NULL) {
		PBOX_LOG_ERR(TRANSPORT, "shm connection %u: cannot map a region of %llu bytes: %s",
			     cn->id, (unsigned long long)rq->bytes,
			     m == MAP_FAILED ? strerror(errno) : "out of memory");
		if (m != MAP_FAILED) {
			munmap(m, (size_t)rq->bytes);
		}
		free(r);
		__atomic_fetch_add(&s->reg_refused, 1, __ATOMIC_RELAXED);
		return ENOMEM;
	}
	cn->reg_seq = (cn->reg_seq + 1) & 0xffffffu;
	cn->reg_seq += cn->reg_seq == 0;
	r->base = m;
	r->len = rq->bytes;
	r->id = slot | cn->reg_seq << 8;
	cn->nreg++;
	cn->reg_bytes += r->len;
	__atomic_fetch_add(&s->reg_ok, 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&s->reg_live, 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&s->reg_live_bytes, r->len, __ATOMIC_RELAXED);
	atomic_store_explicit(&cn->reg[slot], r, memory_order_release);
	*id = r->id;
	return 0;
}

/* An unregistration: unpublish the region; it is unmapped once every core has moved past
 * the generation that says so (a core may be adding from it right now). An id of no
 * region is counted and ignored. */
static void region_del(struct pboxd_shm *s, struct shm_conn *cn, uint32_t id)
{
	uint32_t slot = PBOX_SHM_REGION_SLOT(id);
	struct shm_region *r = atomic_load_explicit(&cn->reg[slot], memory_order_relaxed);

	if (r == NULL || r->id != id) {
		__atomic_fetch_add(&s->reg_bad, 1, __ATOMIC_RELAXED);
		return;
	}
	atomic_store_explicit(&cn->reg[slot], NULL, memory_order_release);
	cn->nreg--;
	cn->reg_bytes -= r->len;
	r->dead_gen = atomic_load_explicit(&s->gen, memory_order_relaxed) + 1;
	r->next_dead = cn->dying;
	cn->dying = r;
	atomic_store_explicit(&s->gen, r->dead_gen, memory_order_release);
	__atomic_fetch_add(&s->unreg, 1, __ATOMIC_RELAXED);
	ring_cores(s);
}

/* Unmap the regions every core has let go of. */
static void regions_reap(struct pboxd_shm *s, struct shm_conn *cn)
{
	struct shm_region **pp = &cn->dying;

	while (*pp != NULL) {
		struct shm_region *r = *pp;

		if (cores_acked(s, r->dead_gen)) {
			*pp = r->next_dead;
			region_unmap(s, r);
		} else {
			pp = &r->next_dead;
		}
	}
}

/* A message of a welcomed worker: a region (un)registration, or the end (EOF, or
 * anything else: the connection ends). */
static void on_message(struct pboxd_shm *s, struct shm_conn *cn)
{
	struct pbox_shm_memreq rq;
	struct pbox_shm_memrep rp = { .magic = PBOX_SHM_MAGIC, .op = PBOX_SHM_MEM_REG };
	unsigned nfds = 0;
	int fds[1];
	int rc = pbox_shm_recv_fds(cn->sock, &rq, sizeof(rq), fds, 1, &nfds);

	if (rc == -EAGAIN) {
		for (unsigned i = 0; i < nfds; i++) {
			close(fds[i]);
		}
		return;
	}
	if (rc == -EMFILE && rq.magic == PBOX_SHM_MAGIC && rq.op == PBOX_SHM_MEM_REG) {
		/* A registration whose memfd pboxd could not take (its open-file limit): a
		 * refusal the worker can live with (it sends from plain memory), not the
		 * end of its connection. */
		for (unsigned i = 0; i < nfds; i++) {
			close(fds[i]);
		}
		__atomic_fetch_add(&s->reg_refused, 1, __ATOMIC_RELAXED);
		if (!cn->reg_logged) {
			cn->reg_logged = true;
			PBOX_LOG_WARN(TRANSPORT,
				      "shm connection %u (job %u rank %u): region of %llu bytes "
				      "refused: its descriptor could not be received (pboxd at "
				      "its open-file limit)",
				      cn->id, cn->job, cn->rank, (unsigned long long)rq.bytes);
		}
		rp.seq = rq.seq;
		rp.status = EMFILE;
		if (pbox_shm_send_fds(cn->sock, &rp, sizeof(rp), NULL, 0) != 0) {
			conn_end(s, cn, "the answer to a registration could not be sent");
		}
		return;
	}
	if (rc != 0 || rq.magic != PBOX_SHM_MAGIC ||
	    (rq.op != PBOX_SHM_MEM_REG && rq.op != PBOX_SHM_MEM_UNREG) ||
	    nfds != (rq.op == PBOX_SHM_MEM_REG ? 1u : 0u)) {
		for (unsigned i = 0; i < nfds; i++) {
			close(fds[i]);
		}
		conn_end(s, cn,
			 rc == -ECONNRESET ? "the worker closed its socket"
					   : "a malformed message from the worker");
		return;
	}
	if (rq.op == PBOX_SHM_MEM_UNREG) {
		region_del(s, cn, rq.region);
		return;
	}
	rp.seq = rq.seq;
	rp.status = s->cfg.max_regions == 0 ? ENOSPC : region_add(s, cn, &rq, fds[0], &rp.region);
	if (s->cfg.max_regions == 0) {
		__atomic_fetch_add(&s->reg_refused, 1, __ATOMIC_RELAXED);
	}
	close(fds[0]); /* the mapping keeps the memory */
	if (pbox_shm_send_fds(cn->sock, &rp, sizeof(rp), NULL, 0) != 0) {
		conn_end(s, cn, "the answer to a registration could not be sent");
	}
}

/* Every core lists the connection: tell the worker where its rings are. */
static void welcome(struct pboxd_shm *s, struct shm_conn *cn)
{
	struct pbox_shm_welcome w = { .magic = PBOX_SHM_MAGIC,
				      .version = PBOX_SHM_VERSION,
				      .status = 0,
				      .ncores = s->ncores,
				      .ring_bytes = cn->lay.ring_bytes,
				      .seg_bytes = cn->lay.seg_bytes,
				      .conn_id = cn->id };
	int fds[PBOX_SHM_MAX_FDS];
	int rc;

	fds[0] = cn->memfd_pending;
	fds[1] = cn->wake_fd;
	for (uint32_t k = 0; k < s->ncores; k++) {
		fds[2 + k] = s->cores[k]->efd;
	}
	w.nres = cn->nres;
	for (uint32_t k = 0; k < cn->nres; k++) {
		fds[2 + s->ncores + k] = cn->res_fd[k];
		w.res_bytes[k] = cn->res_bytes[k];
	}
	rc = pbox_shm_send_fds(cn->sock, &w, sizeof(w), fds, s->ncores + 2 + cn->nres);
	for (uint32_t k = 0; k < cn->nres; k++) {
		close(cn->res_fd[k]); /* the worker has its own now */
	}
	cn->nres = 0;
	close(cn->memfd_pending); /* the mappings keep the memory */
	cn->memfd_pending = -1;
	pboxd_fd_give(PBOXD_FD_SHM, cn->fds_held - SHM_CONN_FDS);
	cn->fds_held = SHM_CONN_FDS;
	cn->welcomed = true;
	if (rc != 0) {
		conn_end(s, cn, "the welcome could not be sent");
		return;
	}
	PBOX_LOG_INFO(TRANSPORT,
		      "shm connection %u: job %u rank %u, %u cores, rings of %llu KiB, %s", cn->id,
		      cn->job, cn->rank, s->ncores, (unsigned long long)(cn->lay.ring_bytes >> 10),
		      w.nres != 0 ? "results' arenas mapped read-only" : "no results' arenas");
}

static uint64_t now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000u + (uint64_t)t.tv_nsec / 1000000u;
}

/* A connection refused at accept: log the worker's process and the cause (rate-limited;
 * the worker is told EMFILE and takes kernel UDP). */
static void refused_log(struct pboxd_shm *s, int fd, bool slots)
{
	struct ucred cr = { 0 };
	socklen_t len = sizeof(cr);
	uint64_t sup;
	char why[160];

	if (!pbox_ratelog_ok(&s->refuse_log, now_ms(), &sup)) {
		return;
	}
	(void)getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len);
	if (slots) {
		snprintf(why, sizeof(why), "all %u connections taken (shm.max_conns)",
			 s->cfg.max_conns);
	} else {
		char b[128];

		snprintf(why, sizeof(why), "no descriptor left in pboxd's budget (%s)",
			 pboxd_fd_explain(b, sizeof(b)));
	}
	PBOX_LOG_WARN(TRANSPORT, "shm: connection of pid %d refused: %s%s", (int)cr.pid, why,
		      sup ? " (similar messages left out)" : "");
}

static void accept_some(struct pboxd_shm *s)
{
	for (;;) {
		int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		struct shm_conn *cn = NULL;

		if (fd < 0) {
			return;
		}
		for (uint32_t i = 0; i < s->cfg.max_conns; i++) {
			if (atomic_load_explicit(&s->conns[i].state, memory_order_relaxed) ==
			    CONN_FREE) {
				cn = &s->conns[i];
				break;
			}
		}
		if (cn == NULL ||
		    pboxd_fd_take(PBOXD_FD_SHM, SHM_CONN_FDS + SHM_HELLO_FDS(s)) != 0) {
			struct pbox_shm_welcome w = { .magic = PBOX_SHM_MAGIC,
						      .version = PBOX_SHM_VERSION,
						      .status = EMFILE };

			__atomic_fetch_add(&s->refused, 1, __ATOMIC_RELAXED);
			refused_log(s, fd, cn == NULL);
			(void)pbox_shm_send_fds(fd, &w, sizeof(w), NULL, 0);
			close(fd);
			continue;
		}
		cn->fds_held = SHM_CONN_FDS + SHM_HELLO_FDS(s);
		cn->sock = fd;
		cn->accepted_ms = now_ms();
		cn->wake_fd = -1;
		cn->memfd_pending = -1;
		atomic_store_explicit(&cn->state, CONN_HELLO, memory_order_relaxed);
	}
}

static void *listener_main(void *arg)
{
	struct pboxd_shm *s = arg;
	struct pollfd *p = calloc(s->cfg.max_conns + 2, sizeof(*p));
	uint32_t *who = calloc(s->cfg.max_conns + 2, sizeof(*who));

	rcu_register_thread();
	rcu_thread_offline();
	while (p != NULL && who != NULL && !__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) {
		unsigned np = 2;
		bool waiting = false, hellos = false;
		int rc;

		p[0] = (struct pollfd){ .fd = s->lfd, .events = POLLIN };
		p[1] = (struct pollfd){ .fd = s->efd, .events = POLLIN };
		for (uint32_t i = 0; i < s->cfg.max_conns; i++) {
			struct shm_conn *cn = &s->conns[i];
			int st = atomic_load_explicit(&cn->state, memory_order_relaxed);

			if (st == CONN_HELLO || (st == CONN_LIVE && cn->welcomed)) {
				p[np] = (struct pollfd){ .fd = cn->sock, .events = POLLIN };
				who[np++] = i;
			}
			waiting |= (st == CONN_LIVE && !cn->welcomed) || st == CONN_CLOSING ||
				   cn->dying != NULL;
			hellos |= st == CONN_HELLO;
		}
		/* While a connection waits for the cores, look every 2 ms. */
		rc = poll(p, np, waiting ? 2 : hellos ? 100 : -1);
		if (rc < 0 && errno != EINTR) {
			PBOX_LOG_ERR(TRANSPORT, "shm: poll: %s", strerror(errno));
			break;
		}
		if (p[1].revents & POLLIN) {
			drain_fd(s->efd);
		}
		end_stale_sessions(s);
		for (unsigned i = 2; rc > 0 && i < np; i++) {
			struct shm_conn *cn = &s->conns[who[i]];

			if (p[i].revents == 0) {
				continue;
			}
			if (atomic_load_explicit(&cn->state, memory_order_relaxed) == CONN_HELLO) {
				on_hello(s, cn);
			} else if (p[i].revents & POLLIN) {
				/* Registrations, or EOF. */
				on_message(s, cn);
			} else {
				conn_end(s, cn, "the worker closed its socket");
			}
		}
		if (rc > 0 && (p[0].revents & POLLIN)) {
			accept_some(s);
		}
		for (uint32_t i = 0; i < s->cfg.max_conns; i++) {
			struct shm_conn *cn = &s->conns[i];
			int st = atomic_load_explicit(&cn->state, memory_order_relaxed);
			uint32_t bad = atomic_load_explicit(&cn->bad, memory_order_acquire);

			if (st == CONN_HELLO && now_ms() - cn->accepted_ms > SHM_HELLO_TIMEOUT_MS) {
				__atomic_fetch_add(&s->bad_hello, 1, __ATOMIC_RELAXED);
				conn_free(s, cn); /* said nothing: its slot goes to others */
			} else if (st == CONN_LIVE && bad != 0) {
				conn_end(s, cn, pbox_shm_err_name((enum pbox_shm_err)bad));
			} else if (st == CONN_LIVE && !cn->welcomed &&
				   cores_acked(s, cn->add_gen)) {
				welcome(s, cn);
			} else if (st == CONN_CLOSING && cores_acked(s, cn->close_gen)) {
				conn_free(s, cn);
			} else if (st == CONN_LIVE && cn->dying != NULL) {
				regions_reap(s, cn);
			}
		}
	}
	rcu_unregister_thread();
	free(p);
	free(who);
	return NULL;
}

/* ---- set-up ------------------------------------------------------------------------- */

struct pboxd_shm *pboxd_shm_create(const struct pboxd_shm_cfg *cfg, uint32_t ncores,
				   struct pbox_jobtab *const *tab)
{
	struct pboxd_shm *s = calloc(1, sizeof(*s));
	struct sockaddr_un su;
	struct pbox_shm_layout lay;
	int sl;

	if (s == NULL) {
		PBOX_LOG_ERR(TRANSPORT, "shm: out of memory");
		return NULL;
	}
	s->cfg = *cfg;
	s->lfd = s->efd = -1;
	s->ncores = ncores;
	s->tab = tab;
	s->next_id = 1;
	s->ring_bytes = pboxd_shm_ring_bytes(cfg, ncores);
	if (pbox_shm_layout(&lay, ncores, s->ring_bytes) != 0 || cfg->max_conns == 0 ||
	    cfg->max_conns > 65534) {
		PBOX_LOG_ERR(TRANSPORT,
			     "shm: rings of %llu KiB (a power of two, %u..%u) with %u cores, "
			     "max_conns %u (1..65534): out of range",
			     (unsigned long long)(s->ring_bytes >> 10), PBOX_SHM_RING_MIN >> 10,
			     PBOX_SHM_RING_MAX >> 10, ncores, cfg->max_conns);
		goto fail;
	}
	if (cfg->socket[0] == '\0') {
		snprintf(s->name, sizeof(s->name), "@pbox-shm-%d", (int)getpid());
	} else {
		snprintf(s->name, sizeof(s->name), "%s", cfg->socket);
	}
	/* Job states created from now on keep their results in memfds (shown to workers). */
	pbox_job_set_result_ops(&pboxd_shm_result_ops);
	s->conns = calloc(cfg->max_conns, sizeof(*s->conns));
	s->cores = calloc(ncores, sizeof(*s->cores));
	s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (s->conns == NULL || s->cores == NULL || s->efd < 0) {
		PBOX_LOG_ERR(TRANSPORT, "shm: out of memory / descriptors");
		goto fail;
	}
	for (uint32_t i = 0; i < cfg->max_conns; i++) {
		s->conns[i].sock = s->conns[i].wake_fd = s->conns[i].memfd_pending = -1;
	}
	for (uint32_t k = 0; k < ncores; k++) {
		struct shm_core *c =
			aligned_alloc(PBOX_CACHE_LINE, PBOX_ALIGN_UP(sizeof(*c), PBOX_CACHE_LINE));

		if (c == NULL) {
			PBOX_LOG_ERR(TRANSPORT, "shm: out of memory for core %u", k);
			goto fail;
		}
		memset(c, 0, sizeof(*c));
		s->cores[k] = c;
		c->s = s;
		c->k = k;
		c->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		c->live = calloc(cfg->max_conns, sizeof(*c->live));
		c->touched = calloc(cfg->max_conns, sizeof(*c->touched));
		c->local = calloc(cfg->max_conns, sizeof(*c->local));
		c->stage = aligned_alloc(PBOX_CACHE_LINE, PBOX_WIRE_MAX_PAYLOAD);
		c->stage_all = cfg->stage_pushes;
		if (c->efd < 0 || c->live == NULL || c->touched == NULL || c->local == NULL ||
		    c->stage == NULL) {
			PBOX_LOG_ERR(TRANSPORT, "shm: out of memory / descriptors for core %u", k);
			goto fail;
		}
	}
	sl = pbox_shm_sockaddr(s->name, &su);
	s->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (sl < 0 || s->lfd < 0) {
		PBOX_LOG_ERR(TRANSPORT, "shm: socket '%s': %s", s->name,
			     sl < 0 ? "name too long" : strerror(errno));
		goto fail;
	}
	if (s->name[0] != '@') {
		(void)unlink(s->name); /* a stale socket of an earlier run */
	}
	if (bind(s->lfd, (struct sockaddr *)&su, (socklen_t)sl) != 0 || listen(s->lfd, 64) != 0) {
		PBOX_LOG_ERR(TRANSPORT, "shm: cannot listen on '%s': %s", s->name, strerror(errno));
		goto fail;
	}
	return s;
fail:
	pboxd_shm_destroy(s);
	return NULL;
}

int pboxd_shm_start(struct pboxd_shm *s)
{
	int rc = pthread_create(&s->thread, NULL, listener_main, s);

	if (rc != 0) {
		PBOX_LOG_ERR(TRANSPORT, "shm: cannot start the listener thread: %s", strerror(rc));
		return -rc;
	}
	pthread_setname_np(s->thread, "pbox-shm");
	s->started = true;
	__atomic_store_n(&g_advertised, s->name, __ATOMIC_RELEASE);
	PBOX_LOG_INFO(
		TRANSPORT,
		"shm: local workers connect to %s (rings of %llu KiB, at most %u connections)",
		s->name, (unsigned long long)(s->ring_bytes >> 10), s->cfg.max_conns);
	return 0;
}

void pboxd_shm_destroy(struct pboxd_shm *s)
{
	if (s == NULL) {
		return;
	}
	__atomic_store_n(&g_advertised, NULL, __ATOMIC_RELEASE);
	pbox_job_set_result_ops(NULL); /* states made with them stay valid: the ops are static */
	if (s->started) {
		__atomic_store_n(&s->stop, true, __ATOMIC_RELEASE);
		ring_fd(s->efd);
		pthread_join(s->thread, NULL);
	}
	if (s->lfd >= 0) {
		close(s->lfd);
		if (s->name[0] != '@') {
			(void)unlink(s->name);
		}
	}
	for (uint32_t i = 0; s->conns != NULL && i < s->cfg.max_conns; i++) {
		conn_free(s, &s->conns[i]);
	}
	for (uint32_t k = 0; s->cores != NULL && k < s->ncores; k++) {
		struct shm_core *c = s->cores[k];

		if (c == NULL) {
			continue;
		}
		if (c->efd >= 0) {
			close(c->efd);
		}
		for (uint32_t i = 0; c->local != NULL && i < s->cfg.max_conns; i++) {
			free(c->local[i].bl);
		}
		free(c->live);
		free(c->touched);
		free(c->local);
		free(c->stage);
		free(c);
	}
	if (s->efd >= 0) {
		close(s->efd);
	}
	free(s->cores);
	free(s->conns);
	free(s);
}

/* ---- counters ----------------------------------------------------------------------- */

static void sum_cores(const struct pboxd_shm *s, struct shm_core_stats *t)
{
	memset(t, 0, sizeof(*t));
	for (uint32_t k = 0; k < s->ncores; k++) {
		const struct shm_core_stats *c = &s->cores[k]->st;

		t->rx_pkts += pbox_stat_read(&c->rx_pkts);
		t->rx_bytes += pbox_stat_read(&c->rx_bytes);
		t->tx_pkts += pbox_stat_read(&c->tx_pkts);
		t->tx_bytes += pbox_stat_read(&c->tx_bytes);
		t->tx_desc += pbox_stat_read(&c->tx_desc);
		t->tx_full += pbox_stat_read(&c->tx_full);
		t->backlogged += pbox_stat_read(&c->backlogged);
		t->tx_gone += pbox_stat_read(&c->tx_gone);
		t->wakes += pbox_stat_read(&c->wakes);
		t->sleeps += pbox_stat_read(&c->sleeps);
		t->rx_ref += pbox_stat_read(&c->rx_ref);
		t->bad_ref += pbox_stat_read(&c->bad_ref);
		t->staged += pbox_stat_read(&c->staged);
		for (int e = 0; e < PBOX_SHM_ERR_COUNT; e++) {
			t->broken[e] += pbox_stat_read(&c->broken[e]);
		}
	}
}

static uint64_t live_conns(const struct pboxd_shm *s)
{
	uint64_t n = 0;

	for (uint32_t i = 0; i < s->cfg.max_conns; i++) {
		n += atomic_load_explicit(&s->conns[i].state, memory_order_relaxed) == CONN_LIVE;
	}
	return n;
}

json_t *pboxd_shm_stats_json(const struct pboxd_shm *s)
{
	struct shm_core_stats t;
	json_t *broken = json_object();
	json_t *o;

	sum_cores(s, &t);
	for (int e = 1; e < PBOX_SHM_ERR_COUNT; e++) {
		json_object_set_new(broken, pbox_shm_err_name((enum pbox_shm_err)e),
				    json_integer((json_int_t)t.broken[e]));
	}
	o = json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, "
		      "s:I, s:I, s:I, s:I, s:o}",
		      "name", "shm", "socket", s->name, "ring_bytes", (json_int_t)s->ring_bytes,
		      "conns_live", (json_int_t)live_conns(s), "accepted",
		      (json_int_t)pbox_stat_read(&s->accepted), "refused",
		      (json_int_t)pbox_stat_read(&s->refused), "auth_failed",
		      (json_int_t)pbox_stat_read(&s->auth_failed), "bad_hello",
		      (json_int_t)pbox_stat_read(&s->bad_hello), "closed",
		      (json_int_t)pbox_stat_read(&s->closed), "rx_pkts", (json_int_t)t.rx_pkts,
		      "rx_bytes", (json_int_t)t.rx_bytes, "tx_pkts", (json_int_t)t.tx_pkts,
		      "tx_bytes", (json_int_t)t.tx_bytes, "tx_full", (json_int_t)t.tx_full,
		      "tx_gone", (json_int_t)t.tx_gone, "backlogged", (json_int_t)t.backlogged,
		      "wakes", (json_int_t)t.wakes, "sleeps", (json_int_t)t.sleeps, "broken",
		      broken);
	if (o != NULL) {
		json_object_set_new(o, "tx_desc", json_integer((json_int_t)t.tx_desc));
		json_object_set_new(o, "rx_ref", json_integer((json_int_t)t.rx_ref));
		json_object_set_new(o, "bad_ref", json_integer((json_int_t)t.bad_ref));
		json_object_set_new(o, "staged", json_integer((json_int_t)t.staged));
		json_object_set_new(o, "regions",
				    json_pack("{s:I, s:I, s:I, s:I, s:I, s:I}", "registered",
					      (json_int_t)pbox_stat_read(&s->reg_ok), "refused",
					      (json_int_t)pbox_stat_read(&s->reg_refused), "bad",
					      (json_int_t)pbox_stat_read(&s->reg_bad),
					      "unregistered", (json_int_t)pbox_stat_read(&s->unreg),
					      "live", (json_int_t)pbox_stat_read(&s->reg_live),
					      "live_bytes",
					      (json_int_t)pbox_stat_read(&s->reg_live_bytes)));
		json_object_set_new(
			o, "res_fds",
			json_integer((json_int_t)__atomic_load_n(&g_res_fds, __ATOMIC_RELAXED)));
	}
	return o;
}

void pboxd_shm_stats_print(FILE *f, const struct pboxd_shm *s)
{
	struct shm_core_stats t;
	uint64_t nbroken = 0;

	sum_cores(s, &t);
	for (int e = 1; e < PBOX_SHM_ERR_COUNT; e++) {
		nbroken += t.broken[e];
	}
	fprintf(f,
		"shm: %" PRIu64 " connections live (%" PRIu64 " accepted, %" PRIu64
		" refused, %" PRIu64 " not admitted, %" PRIu64 " broken rings); %" PRIu64
		" datagrams in, %" PRIu64 " out, %" PRIu64 " dropped on a full ring, %" PRIu64
		" lost with ended connections, %" PRIu64 " wake-ups; %" PRIu64
		" regions registered (%" PRIu64 " refused, %" PRIu64 " bad), %" PRIu64
		" pushes read in place, %" PRIu64 " bad references\n",
		live_conns(s), pbox_stat_read(&s->accepted), pbox_stat_read(&s->refused),
		pbox_stat_read(&s->auth_failed), nbroken, t.rx_pkts, t.tx_pkts, t.tx_full,
		t.tx_gone, t.wakes, pbox_stat_read(&s->reg_ok), pbox_stat_read(&s->reg_refused),
		pbox_stat_read(&s->reg_bad), t.rx_ref, t.bad_ref);
	fflush(f);
}
