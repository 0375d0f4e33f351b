/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The worker's data-plane node: the progress engine of libpbox.
 *
 * It is written as a node of the data plane, not as a request/response client: it is fed
 * datagrams (pbox_node_rx) and clock ticks (pbox_node_timers), keeps per-chunk state,
 * and emits datagrams through a struct pbox_tx_ops. libpbox runs it on its progress
 * thread; tests run it on a virtual clock against an in-memory appliance. Later roles
 * (relaying broadcast chunks to tree children, answering bandwidth probes) are further
 * message handlers of the same node.
 *
 * Operations are per key, and each runs in one of the key's lanes: a job allows `credits`
 * unacknowledged contributions per chunk (NOTIFY-ACK), so a key has that many lanes and as
 * many operations in flight (of different iterations). An operation is cut into its
 * chunks; each chunk goes to the appliance core that owns it. Reliability (UDP has none):
 *  - selective repeat: the last datagram of every send round of a contribution is flagged
 *    PBOX_F_LAST; if the appliance still misses fragments when it arrives, it answers
 *    with a NACK (an ACK with a PBOX_F_SACK bitmap of the fragments it holds) and the
 *    node re-sends only the missing ones at once. When neither ACK, NACK nor result came
 *    within the retransmission timeout (the round's tail or the answer was lost), one
 *    probe goes: the last missing fragment, flagged LAST, which the appliance answers
 *    with the ACK, the result or a NACK; the timeout doubles up to rto_max. An ACK
 *    flagged RETRY (the appliance's window moved) triggers an immediate resend of what
 *    is missing;
 *  - once a contribution is acknowledged, only a small PULL is re-sent, asking the
 *    appliance to repeat a result that may have been lost. The first fragment of a
 *    push-pull's result counts as its acknowledgement (the appliance answers a push only
 *    when it holds all of it): the source is never read again after that, so src == dst
 *    (in place) is safe under any loss;
 *  - results are collected into the caller's buffer fragment by fragment with a bitmap,
 *    so duplicates and reordering are harmless; a PULL asking for a result again carries
 *    that bitmap (PBOX_F_SACK), and the appliance re-sends only the missing fragments;
 *    once a result has begun to arrive, the rest is asked for after one RTO; a result of another
 * version restarts the collection; a result older than the job's staleness bound is ignored;
 *  - with cfg.crc, every fragment carries a CRC32C version word of its bytes taken when
 *    the operation started; a resend whose bytes no longer match (the caller changed the
 *    buffer while the push was in flight) fails the operation instead of sending torn
 *    data, and an appliance that verifies the words drops corrupted fragments. With
 *    cfg.sampled_words instead, the word stays in the node (nothing on the wire) and
 *    covers a sample of the fragment (its first and last 8 bytes and 8 bytes of every
 *    KiB): the first send reads no payload byte itself, the resend that compares reads
 *    the same sample again. It catches the hazard it is for, a caller writing its next
 *    gradient or an optimizer step into a buffer whose push is in flight (every element
 *    changes), but not a change confined to bytes between samples: cfg.crc does;
 *  - every operation has a deadline; when it passes the operation fails with -ETIMEDOUT
 *    and a message saying what was and was not received;
 *  - jobs with DVF (cfg.dvf): a chunk of a push is filtered and encoded once, when it
 *    starts sending, and every resend sends those bytes (libpbox/dvf_push.h: the
 *    residual is applied once per push); result fragments may come as DVF blocks,
 *    decoded in full before any lane takes them (bad ones counted as bad_block).
 * In "plain" flow a push completes as soon as its data is sent (the node keeps a copy for
 * resends); in NOTIFY-ACK flow (default) it completes when the appliance acknowledges that
 * it consumed the data, so the caller's buffer is free exactly then.
 * Flow and congestion control: chunks being sent (unacknowledged contributions) are
 * limited by a congestion window in bytes, under the caps max_inflight (chunks) and
 * window_bytes (bytes); the rest wait their turn. Results owed after an ACK are not
 * limited: a worker that held back its contributions until earlier results came in could
 * deadlock with a peer that submits keys in another order.
 *  - The window is NewReno-style AIMD (RFC 5681 / 6582) in bytes: it starts at
 *    max(64 KiB, one chunk), doubles per round trip in slow start, then grows by one
 *    fragment per round trip; a loss shrinks it at most once per round trip. Why not a
 *    delay-based BBR/Vegas: pbox shares hosts and links with TCP (Gloo, NCCL, storage),
 *    and its RTT samples include the progress threads' scheduling on busy CPUs, so a
 *    delay signal alone is noisy; loss is what a tbf or a switch port reports exactly.
 *    Delay is used where it is robust: slow start ends when three RTT samples in a row
 *    are a quarter (at least 1 ms) above the minimum (HyStart), not only at a loss after
 *    a queue overflowed; a loss shrinks the window by the bytes queued on the path (at
 *    most half; Westwood's bandwidth x minimum RTT), so a random loss with no queue costs
 *    no rate and an overflow drains the queue (TCP Veno's x0.8, used before, held the
 *    window near one chunk at 1% loss on 1 Gbit/s). The queue is read from the standing
 *    RTT (the least sample of the last half round trip, Copa's filter), not the smoothed
 *    one, so a descheduled progress thread does not read as a queue. A Vegas-style
 *    ceiling (stop growing while 4 chunks stand queued) was tried and dropped: on the
 *    shared 2-CPU test machine (load 20) every RTT sample carries scheduling delay, the
 *    ceiling read it as a queue and held the window at a third of the link (netlab: 33 s
 *    instead of 11 s). A result that arrives in part counts as a loss too: results leave
 *    the appliance at the pace of the workers' pushes, so that is the lever for the
 *    appliance's link and the worker's downlink.
 *  - Pacing: chunks start at gain x cwnd / srtt (gain 2 in slow start, 1.25 after), so a
 *    window does not arrive at a rate limiter as one burst; a late wake-up may catch up
 *    2 ms worth.
 *  - RTO from measured RTT (RFC 6298): SRTT/RTTVAR from contributions sent once (Karn),
 *    RTO = SRTT + max(1 ms, 4 RTTVAR) within [rto_min_ms, rto_max_ms], rto_ms before the
 *    first sample; the first timeout of a send round, and of a result that has started
 *    to arrive, is a tail-loss probe after max(2 SRTT, 2 ms) within the RTO (RFC 8985:
 *    the 10 ms floor alone stalled a chunk 20 RTTs per lost last fragment at 1 Gbit/s);
 *    each chunk's timer doubles on expiry. A chunk whose timer expires while its core's
 *    acknowledgements still arrive, none for anything sent after it, is waiting in that
 *    core's queue, not lost: its timer restarts (TCP restarts its one timer on each ACK;
 *    RACK, RFC 8985, declares a loss once something sent later is acknowledged). Per
 *    appliance core: each core is a thread that the host deschedules on its own, so core
 *    0 acknowledging chunks sent after core 1's says nothing about core 1's (on 2 CPUs
 *    with 2 workers and 2 pboxd cores this took ~14k chunks per 35 exchanges for lost).
 *  - Spurious timeouts (TCP's Eifel, RFC 3522 / 4015, and F-RTO, RFC 5682): an ACK echoes
 *    the seq of the datagram that completed the contribution, so an ACK of a datagram
 *    sent before the timer's resend proves the timeout spurious (a descheduled thread, not
 *    a loss); the window the timeout took is given back, and the tail-loss probe's floor
 *    (and the RTO) rise to 1.25 x the delay seen, at most rto_max / 4; each timeout that
 *    proves right (answered by its resend, or a NACK) lowers that floor by a quarter
 *    (RACK's reordering window also grows on DSACKs and decays after recoveries), and so
 *    do every NACK and every 100 ms without a new spurious timeout (a push-pull's result
 *    answers its contribution and cannot judge the timer: the floor stayed otherwise). While a
 *    core answers nothing for a tail-loss probe's time, one of its chunks probes (RACK's
 *    TLP), the next after twice that, and so on (F-RTO: one datagram first; its answer
 *    says whether the rest were lost), not every chunk in flight; an answer that proves a
 *    loss lets the others, now overtaken, go at once. stats.spurious_retx counts the
 *    proven spurious ones.
 *  - Result probes of an acknowledged push-pull: a probe goes only for a chunk that is
 *    overtaken (a result came from its core for a chunk acknowledged after it: its own
 *    was lost), or, while the core has sent no results for the probe interval (a peer is
 *    late, or the tail was lost), one chunk of the core, then the next after twice the
 *    interval, and so on until results come again: every chunk of a key waits for
 *    the slowest peer, and probing each one (after the measured wait and doubling) sent
 *    ~7 probes per waiting chunk during a 200 ms stall of a peer (thousands of PULLs and
 *    status ACKs; R6 in perf/README.md section 4). A result that arrives unflagged after
 *    a probe answered the original request (stats.spurious_probes). The measured wait
 *    sets no floor: a peer's wait says nothing about the path, and raising the probe's
 *    timer by it delayed the recovery of lost results (see judge_timer in node.c).
 *
 * Threading: a node is used by one thread at a time (the progress thread); completion
 * callbacks run on that thread.
 */
#ifndef PBOX_NODE_H
#define PBOX_NODE_H

#include <stdbool.h>
#include <stdint.h>

#include <pbox/wire.h>

#include "common/jobdesc.h"
#include "common/wire_check.h"
#include "common/xport.h"

enum pbox_op_kind {
	PBOX_OP_NONE = 0,
	PBOX_OP_PUSH,      /* contribute a gradient; done when acknowledged */
	PBOX_OP_PULL,      /* fetch a result */
	PBOX_OP_PUSH_PULL, /* contribute and receive the result of the iteration */
	PBOX_OP_INIT,      /* rank 0: set the initial model (server-optimizer jobs) */
};

struct pbox_node;
struct pbox_op;

/* Called on the node's thread when op completes (op->status says how). */
typedef void (*pbox_op_done_fn)(struct pbox_op *op, void *arg);

/* One operation on one key. Owned by the caller; must stay valid until it completes. */
struct pbox_op {
	enum pbox_op_kind kind;
	uint32_t key;     /* index into the job's keys (not the id) */
	uint32_t iter;    /* PUSH / PUSH_PULL: iteration; PULL: version or iteration wanted */
	const float *src; /* PUSH, PUSH_PULL, INIT: nelem floats */
	float *dst;       /* PULL, PUSH_PULL: nelem floats */
	/* filled by the node */
	uint32_t lane;
	struct pbox_op *next_pending; /* plain flow: waiting for a lane of its key */
	int status;                   /* 0 or a negative errno once complete */
	char errmsg[256];             /* why, when status < 0 */
	uint32_t chunks_left;
	uint32_t label; /* version / iteration of the result received */
	uint64_t start_ns;
	uint64_t deadline_ns;
};

struct pbox_node_stats {
	uint64_t rx_pkts;
	uint64_t rx_bytes;
	uint64_t tx_pkts;
	uint64_t tx_bytes;
	uint64_t retransmits; /* datagrams sent again after a timeout */
	uint64_t probes;      /* PULLs sent to recover a possibly lost result */
	uint64_t dup_frags;   /* result fragments received twice */
	uint64_t torn_frags;  /* in-place results rewritten while copied (pbox_node_rx_split) */
	uint64_t rx_placed;   /* result fragments received straight into the caller's buffer */
	uint64_t rx_unplaced; /* placed datagrams that were not their place's fragment */
	uint64_t ops_done;
	uint64_t ops_failed;
	uint64_t stale_results;    /* results ignored: older than the staleness bound */
	uint64_t retry_hints;      /* immediate resends on the appliance's RETRY */
	uint64_t foreign;          /* datagrams dropped: not from the owning core's endpoint */
	uint64_t retransmit_bytes; /* payload bytes sent again */
	uint64_t nacks;            /* NACKs that triggered a selective resend */
	uint64_t loss_events;      /* congestion window reductions */
	uint64_t ss_exits;         /* slow starts ended by a growing RTT (not a loss) */
	uint64_t cwnd;             /* congestion window now, bytes */
	uint64_t srtt_us;          /* smoothed RTT (0: no sample yet) */
	uint64_t rto_us;           /* retransmission timeout now */
	uint64_t timer_waits;      /* timeouts not taken as losses: acknowledgements of
				      earlier sends still arriving (a queue, not a loss) */
	uint64_t spurious_retx;    /* timer resends proven needless: the original was
				      answered (node.h, "Spurious timeouts") */
	uint64_t spurious_probes;  /* result probes proven needless: the result came unasked */
	uint64_t loss_undone;      /* window reductions of spurious timeouts given back */
	uint64_t pto_floor_us;     /* the tail-loss probe's floor learnt from them (0: none) */
	/* TSB (relay.h): broadcast fragments accepted, forwarded to children, refused for a
	 * bad MAC, refused for coming from neither the parent nor the owning core */
	uint64_t tsb_rx;
	uint64_t tsb_fwd;
	uint64_t tsb_bad_mac;
	uint64_t tsb_not_parent;
	uint64_t tsb_parent_pulls; /* repairs asked from the parent (then the appliance) */
	uint64_t tsb_served;       /* fragments re-sent to children from the repair cache */
	uint64_t drops[PBOX_DROP_COUNT];
};

struct pbox_dvf_job;
struct pbox_dvf_push;

struct pbox_node_cfg {
	const struct pbox_jobdesc *desc;
	uint32_t job;
	uint32_t rank;
	uint64_t cookie;
	bool server_opt;               /* job mode: results are model versions */
	const struct pbox_peer *cores; /* appliance endpoint of each core (desc->ncores) */
	const struct pbox_tx_ops *tx;
	void *tx_ctx;
	uint64_t (*now_ns)(void *arg); /* clock; NULL: CLOCK_MONOTONIC */
	void *now_arg;
	uint32_t rto_ms;       /* RTO before the first RTT sample (0: 50 ms) */
	uint32_t rto_min_ms;   /* floor of the measured RTO (0: 10 ms; at most rto_ms) */
	uint32_t pto_min_ms;   /* floor of the tail-loss probe (0: 2 ms; at most the RTO): a
				* transport that loses nothing unless it counts it (shm) sets
				* its RTO floor, so a descheduled peer is not probed for */
	uint32_t rto_max_ms;   /* cap of the RTO and of its doubling (0: 1000 ms) */
	uint32_t timeout_ms;   /* operation deadline (0: 30 s) */
	uint32_t max_inflight; /* cap: chunks sending at once (0: 256) */
	uint32_t window_bytes; /* cap of the congestion window (0: 4 MiB); one chunk always may */
	uint32_t staleness;    /* oldest acceptable result: want - staleness (UINT32_MAX: any) */
	bool accept_newer;     /* aggregate jobs with drop-stragglers: newer results do */
	uint32_t result_lag;   /* broadcast jobs: a push-pull of t wants the aggregate of t - lag */
	uint32_t credits;      /* lanes per key: unacknowledged contributions (0: 1) */
	bool plain;            /* pushes complete when sent (node keeps a copy) */
	bool crc;              /* stamp fragments with CRC32C version words (on the wire) */
	bool sampled_words;    /* without crc: sampled version words, kept by the node */
	/* The job's DVF settings (NULL or not enabled: none): pushes are filtered with this
	 * worker's residual and results may come as DVF blocks (libpbox/dvf_push.h). */
	const struct pbox_dvf_job *dvf;
	size_t relay_cache_bytes; /* TSB relay's repair cache (0: PBOX_RELAY_CACHE_BYTES) */
	pbox_op_done_fn done;
	void *done_arg;
};

/* Create a node. Returns NULL after logging why (out of memory). */
struct pbox_node *pbox_node_create(const struct pbox_node_cfg *cfg);
void pbox_node_destroy(struct pbox_node *n);

/*
 * Start op (fields kind, key, iter, src, dst set by the caller). Returns 0, -EBUSY if
 * every lane of the key is busy, -EINVAL for a bad key or kind (message in op), or the
 * node's failure status if it has failed (pbox_node_fail). On 0 the completion callback
 * will run exactly once.
 */
int pbox_node_submit(struct pbox_node *n, struct pbox_op *op);

/* Handle one received datagram. from is its source: only datagrams from the data-plane
 * endpoint (address and port) of the appliance core that owns the message's chunk
 * (cfg->cores) are read; the rest (a spoofed or reflected reply, a stray) are counted in
 * stats.foreign and dropped. */
void pbox_node_rx(struct pbox_node *n, const void *pkt, uint32_t len, const struct pbox_peer *from);

/*
 * The same for a result datagram whose payload is not behind its header: hdr (64 bytes,
 * a private copy) says frag_len == len, payload is read in place (the shared-memory
 * transport's results' arena). gen: the payload's generation word in that memory, which
 * must still equal want after the payload was copied into the caller's buffer (a seqlock
 * read); otherwise the fragment counts as not received (stats.torn_frags), and the
 * node's probes ask for it again. Only DATA is accepted this way, and not for a node
 * relaying a broadcast tree.
 */
void pbox_node_rx_split(struct pbox_node *n, const void *hdr, const void *payload, uint32_t len,
			const uint64_t *gen, uint64_t want, const struct pbox_peer *from);

/*
 * Results received straight into the caller's buffer (issue 10, section 3): a receive
 * with placement (transport/udp/udp.h, pbox_udp_rx_placed) asks first where the next
 * datagrams' payloads are expected. pbox_node_rx_places() gives up to max places in the
 * order their results are expected (an appliance core sends results about in chunk order
 * and the socket sees runs from one core: the chunks after the last result accepted, of
 * its core): each the result slot of a fragment in the operation's dst whose bytes are
 * dead until the fragment is accepted: not yet received for the result being collected,
 * and not the source of a push that may still be resent (a push-pull whose src overlaps
 * its dst is offered only once acknowledged). None for jobs whose results may come
 * DVF-encoded or down a broadcast tree.
 *
 * pbox_node_rx_burst() then handles the count datagrams received: placed[k] >= 0 says
 * datagram k's payload is at place[placed[k]] (pkts[k].data is its header, with room
 * behind it for the payload); -1 that pkts[k].data is whole. Before any datagram is
 * handled, every placed one that is not a plain (F32) result fragment of the place's
 * length, or whose place's fragment another datagram of the burst carries, is copied
 * back behind its header (placed[k] becomes -1). The rest go through the same checks as
 * pbox_node_rx() (source, job, cookie, chunk, label, duplicates) with their payload where
 * it is: the fragment the place expected is taken with no copy; another one (a miss) is
 * copied from the place to its own slot, one copy as without placement. Whatever is not
 * accepted leaves its place as dead as it was. (In a burst of more than 256 datagrams
 * every placed one is copied back.)
 */
struct pbox_node_place {
	void *dst;
	uint32_t len;
	uint32_t chunk;
	uint32_t frag_off;
};

unsigned pbox_node_rx_places(struct pbox_node *n, struct pbox_node_place *out, unsigned max);
/* How many places are worth asking for now (>= 1): about the length of the recent bursts'
 * runs of hits from their first place (after a miss every later datagram is off its place,
 * and a miss costs about what a hit saves). */
unsigned pbox_node_rx_place_want(const struct pbox_node *n);
void pbox_node_rx_burst(struct pbox_node *n, const struct pbox_rx_pkt *pkts, unsigned count,
			const struct pbox_node_place *place, unsigned nplace, int16_t *placed);

/* Run retransmissions and deadlines due at the current time. */
void pbox_node_timers(struct pbox_node *n);

/* Flush queued datagrams. Call after a batch of rx / submit / timers. */
void pbox_node_flush(struct pbox_node *n);

/* The pacing rate of the congestion controller now, in payload bytes/s (gain x cwnd /
 * srtt, what the node paces its chunks at; 0 before the first RTT sample), and the
 * payload bytes of one fragment (the unit of its additive increase) in *frag_bytes. For
 * the transport's kernel pacing (transport/udp/kpace.h). */
uint64_t pbox_node_pace_rate(const struct pbox_node *n, uint32_t *frag_bytes);

/* Nanoseconds until the next timer (UINT64_MAX: none). */
uint64_t pbox_node_next_timer(struct pbox_node *n);

/* Fail every operation in flight, and every later submit, with err and msg. */
void pbox_node_fail(struct pbox_node *n, int err, const char *msg);

/* TSB (relay.h): accept broadcast fragments of the session keyed by key (from the
 * appliance only, until a position is given). 0 or -ENOMEM. */
struct pbox_tsb_key;
struct pbox_tsb_pos;
int pbox_node_tsb_key(struct pbox_node *n, const struct pbox_tsb_key *key);

/* TSB: this rank's parent and children from now on (pos copied). 0, or -EINVAL before
 * pbox_node_tsb_key. */
int pbox_node_tsb_position(struct pbox_node *n, const struct pbox_tsb_pos *pos);

/* Number of operations in flight. */
uint32_t pbox_node_inflight(const struct pbox_node *n);

const struct pbox_node_stats *pbox_node_stats(const struct pbox_node *n);

/* The node's DVF filter (pushes and results), or NULL if the job has no DVF. */
struct pbox_dvf_push *pbox_node_dvf(const struct pbox_node *n);

/* CLOCK_MONOTONIC in ns (the default clock). */
uint64_t pbox_clock_ns(void *arg);

#endif /* PBOX_NODE_H */
