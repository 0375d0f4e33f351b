/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A simulated appliance for unit tests: one chunk engine per core and one libpbox node per
 * rank, connected by in-memory datagram queues, on a virtual clock. No sockets, no threads,
 * no real time: every retransmission and timeout happens when the test advances the clock.
 *
 * Datagrams are delivered by sim_pump() in FIFO order; a test can drop, duplicate or hold
 * datagrams with a filter. Threading: single-threaded.
 *
 * With sim_set_links(), every rank instead has an uplink and a downlink with a rate, a
 * drop-tail queue and a one-way delay (a tbf-limited port), and sim_run() delivers each
 * datagram when it has crossed its link, running the nodes' timers in between: a
 * discrete-event network for congestion-control tests.
 */
#ifndef PBOX_TEST_SIM_H
#define PBOX_TEST_SIM_H

#include <stdbool.h>
#include <stdint.h>

#include "common/tsb.h"
#include "engine/bcast.h"
#include "core/pace.h"
#include "engine/engine.h"
#include "libpbox/node.h"

#define SIM_MAX_CORES 4
#define SIM_MAX_RANKS PBOX_MAX_WORKERS /* every worker count pboxd admits */
#define SIM_MAX_QUEUE 65536

enum sim_dir {
	SIM_TO_APPLIANCE,
	SIM_TO_WORKER,
};

/* What to do with a datagram about to be queued. */
enum sim_verdict {
	SIM_PASS,
	SIM_DROP,
	SIM_DUP,
};

struct sim;

typedef enum sim_verdict (*sim_filter_fn)(struct sim *s, enum sim_dir dir, uint32_t endpoint,
					  const struct pbox_msg *m, void *arg);

/* sim_pkt.from of a datagram a rank relayed to another rank (TSB): SIM_FROM_RANK | rank. */
#define SIM_FROM_RANK 0x80000000u

struct sim_pkt {
	enum sim_dir dir;
	uint32_t to;   /* core or rank */
	uint32_t from; /* rank (to appliance), core or SIM_FROM_RANK | rank (to worker) */
	uint32_t len;
	uint8_t *data;
};

/* One direction of a rank's link. */
struct sim_link_cfg {
	uint64_t rate_Bps;    /* bytes per second (header and payload) */
	uint64_t delay_ns;    /* one-way propagation delay */
	uint64_t queue_bytes; /* drop-tail queue in front of the link */
};

struct sim_timed {
	uint64_t at;  /* delivery time */
	uint64_t seq; /* FIFO among equal times */
	struct sim_pkt p;
};

struct sim {
	uint64_t now_ns;
	/* link model (sim_set_links); links == false: instant FIFO delivery */
	bool links;
	struct sim_link_cfg up, down;
	uint64_t core_tick_ns; /* > 0: a CPU-starved appliance core, run only every tick:
				  arrivals wait for the next multiple of it */
	/* per core, stall_ns > 0: its thread is descheduled for the first stall_ns of every
	   stall_period_ns (arrivals then wait for the end of the stall) */
	uint64_t stall_ns[SIM_MAX_CORES], stall_period_ns[SIM_MAX_CORES];
	uint64_t *up_free, *down_free; /* per rank: when the link finishes what it holds */
	struct sim_timed *heap;
	uint32_t nheap;
	uint64_t heap_seq;
	uint64_t link_drops[2];     /* per enum sim_dir: queue overflows */
	uint64_t link_bytes[2];     /* per enum sim_dir: bytes carried */
	uint64_t link_max_queue[2]; /* per enum sim_dir: the deepest queue seen, bytes */
	uint32_t ncores, nranks;
	struct pbox_jobdesc desc;
	struct pbox_job job;
	uint64_t cookies[SIM_MAX_RANKS];
	uint64_t live[PBOX_MAX_WORKERS / 64];
	struct pbox_jobtab *tab;
	struct pbox_engine eng[SIM_MAX_CORES];
	struct pbox_core_stats stats[SIM_MAX_CORES];
	uint64_t eng_queued[SIM_MAX_CORES];
	struct pbox_peer core_peer[SIM_MAX_CORES];
	struct pbox_node *node[SIM_MAX_RANKS];
	struct pbox_pace *pace[SIM_MAX_CORES]; /* sim_set_pacing: results paced per rank */
	struct sim_ep {
		struct sim *s;
		uint32_t idx;
	} ctx_core[SIM_MAX_CORES], ctx_rank[SIM_MAX_RANKS];
	struct sim_pkt *q;
	/* replies to ranks without a node (direct engine tests), oldest first */
	struct sim_pkt *outbox;
	uint32_t nout;
	uint32_t qhead, qtail;
	uint64_t delivered;
	sim_filter_fn filter;
	void *filter_arg;
	uint32_t filter_from; /* during a filter call: the datagram's sim_pkt.from */
	/* completions seen by the nodes' callbacks */
	uint32_t ncompleted;
	struct pbox_op *completed[4 * SIM_MAX_RANKS];
};

struct sim_job_cfg {
	uint32_t nranks;
	uint32_t ncores;
	const struct pbox_keyspec *keys;
	uint32_t nkeys;
	uint32_t chunk_bytes;
	uint32_t frag_bytes;
	enum pbox_job_mode mode;
	enum pbox_reduce_op reduce;
	bool deterministic;
	const char *optimizer; /* server-optimizer jobs */
	struct pbox_opt_params opt;
	uint32_t window;           /* 0: the sync model's minimum */
	struct pbox_sync_cfg sync; /* zero: BSP */
	uint32_t credits;          /* 0: 1 */
	bool verify_crc;
	enum pbox_non_finite non_finite; /* zero: reject */
	bool plain;                      /* nodes: plain flow */
	bool sampled_words;              /* nodes: sampled version words, not CRC32C */
	uint32_t window_bytes;           /* nodes: 0 = default */
	uint32_t timeout_ms, rto_ms;
	uint32_t rto_min_ms, pto_min_ms; /* nodes: 0 = defaults */
	bool no_nodes;                   /* tests that speak to the engine directly */
	const struct pbox_dvf_job *dvf;  /* NULL: no DVF (kept: must outlive the sim) */
};

/* Build the job, the engines and (unless no_nodes) one node per rank. 0 on success. */
int sim_init(struct sim *s, const struct sim_job_cfg *cfg);
void sim_fini(struct sim *s);

/* Deliver queued datagrams (and what they trigger) until the queues are empty or max
 * datagrams were delivered (0: no limit). Returns the number delivered. */
uint64_t sim_pump(struct sim *s, uint64_t max);

/* Advance the virtual clock and run the nodes' timers, then pump. */
void sim_advance(struct sim *s, uint64_t ns);

/* Give every rank an uplink (towards the appliance) and a downlink. 0 or -ENOMEM. */
int sim_set_links(struct sim *s, const struct sim_link_cfg *up, const struct sim_link_cfg *down);

/* Put a result pacer (core/pace.h) between every core's engine and the network, made
 * from tmpl (inner, clock: the sim's). 0 or -ENOMEM. */
int sim_set_pacing(struct sim *s, const struct pbox_pace_cfg *tmpl);

/* With links: run the network and the nodes' timers until no rank has an operation in
 * flight or the clock reaches until_ns. Returns true if every operation completed. */
bool sim_run(struct sim *s, uint64_t until_ns);

/* Send a datagram to the appliance as rank `from` (for tests speaking raw wire). */
void sim_inject(struct sim *s, uint32_t from, const void *data, uint32_t len);

/* Build and inject one message to the chunk's owner core with the rank's cookie. */
void sim_send_msg(struct sim *s, uint32_t rank, struct pbox_msg *m, const void *payload);

/* The same from an arbitrary source address (spoofing tests). */
void sim_send_msg_from(struct sim *s, uint32_t rank, struct pbox_msg *m, const void *payload,
		       const struct pbox_peer *from);

/* The address rank sends from; replies to port 20000 + r are delivered to rank r (to
 * nobody, counted as a tx error, when r is not a rank). */
struct pbox_peer sim_rank_addr(uint32_t rank);

/* Datagrams queued towards a worker but not delivered (for direct engine tests): pops
 * the oldest one addressed to rank; returns false if none. */
bool sim_take_reply(struct sim *s, uint32_t rank, struct pbox_msg *m, uint8_t *payload);

/* Pops every queued reply (as sim_take_reply, oldest first, any rank) and hands it to fn
 * with its rank; payload is valid during the call. Returns the number handled. Linear in
 * the replies, for tests with many ranks. */
uint32_t sim_take_all(struct sim *s,
		      void (*fn)(uint32_t rank, const struct pbox_msg *m, const uint8_t *payload,
				 void *arg),
		      void *arg);

/* Take rank out of the counts (as pboxd does when a worker leaves) and let every core
 * reconcile, as it does when it sees the new table. */
void sim_remove_rank(struct sim *s, uint32_t rank);

/* TSB: results of the job go down the tree parent[] (PBOX_TSB_ROOT: fed by the
 * appliance) under key; every node gets the key and its position. 0 or -ENOMEM. */
int sim_set_tree(struct sim *s, const uint32_t *parent, const struct pbox_tsb_key *key);

/* Sum of a counter over cores, e.g. SIM_STAT(s, iterations). */
#define SIM_STAT(s, field)                                      \
	({                                                      \
		uint64_t t_ = 0;                                \
		for (uint32_t k_ = 0; k_ < (s)->ncores; k_++) { \
			t_ += (s)->stats[k_].field;             \
		}                                               \
		t_;                                             \
	})

#endif /* PBOX_TEST_SIM_H */
