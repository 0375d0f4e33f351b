/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pboxd's side of the shared-memory transport (shm.h): the listener that admits local
 * workers' connections, and on every data-plane core a poller of the core loop
 * (struct pbox_loop_poller) that reads the workers' rings into the engine and a send op
 * that writes the engine's replies into them, beside the core's kernel-UDP socket.
 *
 * Receive: zero copy. The poller copies each record's 64-byte pbox header out of the
 * ring (the worker may rewrite it at any time: everything is decided on the copy, read
 * once) and hands the engine the header copy plus the payload in place
 * (pbox_engine_rx_iov); the engine only reads a datagram during that call, and the
 * ring's room is given back after the burst. A reference record (a push from memory the
 * worker registered, shm.h) is copied out of the ring, bounded against pboxd's mapping of
 * that region and its payload read there, in place too. Payload bytes the worker changes
 * while the engine adds them only change that worker's own contribution to its own job;
 * an encoded payload (DVF), whose decoder reads it in passes that trust each other, is
 * copied into the core's stage first, so what the engine reads is what it checked.
 *
 * Registered regions: the listener maps a worker's region read-only (after checking its
 * seals and size, shm.h) and publishes it in the connection's table (release); cores read
 * it (acquire) while they list the connection. An unregistered region leaves the table,
 * the generation moves, and the listener unmaps it once every core acknowledged that
 * generation (a core acknowledges between polls, never while it reads a region).
 *
 * Send: the engine's tx ops of a core become a small multiplexer: a reply to a peer that
 * is a shared-memory connection (struct pbox_peer with ifport PBOX_SHM_IFPORT, ip the
 * connection id in 0.0.0.0/8, which no UDP datagram can come from: Linux drops martian
 * sources, port the connection's slot + 1) is copied into that worker's ring at once,
 * except a dense result fragment in the job's results' arena, which goes as a descriptor
 * (shm.h: results written once, read in place by every worker); everything else goes to
 * the UDP socket as before. The copy releases the arena at once (queued /
 * reclaim count it as released). A ring without room holds the reply back (below);
 * a full backlog drops it (counted, the worker's reliability asks again), as a full
 * socket would.
 *
 * Untrusted workers: every index and record header a worker wrote is read once and
 * bounded (ring.h); a ring found broken ends that connection only (its socket is closed,
 * the worker sees it), counted per reason (pbox stats: shm.broken.<reason>), and never
 * touches another connection, core or job. Datagrams are validated by the engine exactly
 * as UDP ones (the cookie authenticates each); the hello is checked against the job
 * table before any memory is given out (a connection silent for 5 s is closed), and
 * max_conns bounds connections.
 *
 * Lifetime: the listener thread owns the connections. Adding or ending one bumps a
 * generation; each core notices it at its next poll (the listener rings the cores'
 * eventfds; a core with no connection yet blocks in its UDP receive and notices within
 * its 100 ms wait), rebuilds its private list, and acknowledges the generation. A
 * connection's welcome is sent only once every core lists it (its first datagrams are
 * never missed); its memory is unmapped only once every core has dropped it. Replies
 * that find a worker's ring full wait in the core's backlog (4 MiB per connection and
 * core, allocated at the first overflow) and move in as the worker frees room (it rings
 * the core: prod_waiting, ring.h; meanwhile the core sleeps, it does not poll the full
 * ring); past that they are dropped (shm.tx_full). Replies that never reach a connection
 * that ended or broke, sent after it did or held in its backlog then, are counted
 * (shm.tx_gone).
 *
 * Threading: create / attach / start / destroy on the control thread (attach before the
 * cores run, destroy after they were joined); the poller and send op on each core's
 * thread; stats readers any thread (relaxed counters).
 */
#ifndef PBOXD_SHM_H
#define PBOXD_SHM_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/loop.h"
#include "engine/job.h"
#include "shm_config.h"

/* pbox_peer.ifport of a shared-memory connection. */
#define PBOX_SHM_IFPORT 0xfffeu

struct pboxd_shm;

/* Open the listening socket and set up the per-core state for ncores cores reading the
 * job table *tab (RCU-published). Returns NULL after logging why. */
struct pboxd_shm *pboxd_shm_create(const struct pboxd_shm_cfg *cfg, uint32_t ncores,
				   struct pbox_jobtab *const *tab);

/* Make core k's loop poll the rings (l->poller) and its engine send through the
 * multiplexer (l->engine->tx wrapped; the inner ops must copy payloads on reclaim, as
 * kernel UDP does). Before the core runs. */
void pboxd_shm_core_attach(struct pboxd_shm *s, uint32_t k, struct pbox_loop *l);

/* Start the listener thread; from now on the socket is advertised. 0 or -errno. */
int pboxd_shm_start(struct pboxd_shm *s);

/* Stop the listener, end every connection and free everything. After the cores were
 * joined. NULL is a no-op. */
void pboxd_shm_destroy(struct pboxd_shm *s);

/* A session ended (its state is no longer in the published table): the listener ends
 * the connections admitted with that state (they pin it; their workers see the socket
 * close). Any thread, after the table without the state was published; NULL: no-op. */
void pboxd_shm_session_ended(struct pboxd_shm *s);

/* The results' arenas pboxd_shm_create installs (pbox_job_set_result_ops): a sealed
 * memfd per (job, core), handed to that job's shm workers with their welcome (shm.h).
 * Static: states created with them outlive the listener. */
extern const struct pbox_result_ops pboxd_shm_result_ops;

/* The socket name workers are told ("@..." abstract), or NULL when no listener runs. */
const char *pboxd_shm_advertised(void);

/* Counters: a JSON object (new reference), and one line of text. */
json_t *pboxd_shm_stats_json(const struct pboxd_shm *s);
void pboxd_shm_stats_print(FILE *f, const struct pboxd_shm *s);

#endif /* PBOXD_SHM_H */
