/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The shared-memory transport between a worker and pboxd on the same host.
 *
 * Connecting: the worker registers over the control channel as always; pboxd's answer
 * names its shared-memory socket ("shm": a Unix SOCK_SEQPACKET socket; a name starting
 * with '@' is in the abstract namespace). The worker connects and sends a hello (job,
 * rank, session cookie: the same credential that authenticates its UDP datagrams);
 * pboxd checks it against the published job table, creates one memfd for the
 * connection, sizes it, seals its size (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, so
 * the worker cannot truncate it under pboxd's mapping), maps it, and answers with a
 * welcome and, by SCM_RIGHTS, the memfd, the worker's wake-up eventfd and one eventfd per
 * data-plane core. The connection lives as long as the socket: either side closing it
 * (the worker exits or is killed, pboxd stops or finds the worker's rings broken) ends
 * it.
 *
 * The memfd holds, per data-plane core k, two rings (ring.h): worker -> core k and core
 * k -> worker, so every ring has exactly one producer and one consumer thread. Layout
 * (pbox_shm_layout): the control blocks of every ring first (core k's at k * 256: the
 * worker's ring, then pboxd's), padded to a page, then the data areas, worker -> core k
 * at data + 2k * ring_bytes, core k -> worker at data + (2k + 1) * ring_bytes.
 *
 * The rings carry the same datagrams as UDP (pbox header + payload), so the chunk engine
 * and the worker's node do not change: a connection is a pbox_tx_ops (this file: the
 * worker's; pboxd_shm.h: pboxd's) plus a receive burst. One exception, pboxd -> worker
 * only: a dense result fragment whose payload lies in the job's results' arena (the
 * welcome's memfds) goes as a descriptor record (ring.h, PBOX_SHM_REC_DESC); the worker
 * bounds it against its mapping, drops it if the buffer's generation moved on, and hands
 * the node the header and the payload in place (pbox_shm_client_split), whose copy into
 * the caller's buffer is checked against the generation again (a seqlock read).
 *
 * Registered memory (pbox_mem_alloc): after the welcome, the worker may hand pboxd memfds
 * of its own over the socket (struct pbox_shm_memreq, the memfd by SCM_RIGHTS), sealed
 * against shrinking (F_SEAL_SHRINK, checked by pboxd before it maps them read-only: a
 * truncated file under a mapping would raise SIGBUS in pboxd). A push whose payload lies
 * in such a region goes as a reference record (ring.h, PBOX_SHM_REC_REF: region id,
 * offset, length) instead of a copy; pboxd's core bounds it against its mapping of the
 * region and adds the payload from there. pboxd answers each registration (struct
 * pbox_shm_memrep) and bounds them per connection (count and bytes, shm.max_regions and
 * shm.max_region_mb); an unregistration has no answer (pboxd unmaps the region once no
 * core can still be reading it).
 *
 * Threading: struct pbox_shm_client is used by one thread (libpbox's progress thread),
 * except the registration calls (pbox_shm_client_mem_reg / _unreg: any thread, serialised
 * among themselves; the progress thread sees a region from the moment mem_reg returns).
 */
#ifndef PBOX_SHM_H
#define PBOX_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <fcntl.h>

#include "common/xport.h"
#include "ring.h"

#define PBOX_SHM_MAGIC   0x50534d31u /* "PSM1" */
#define PBOX_SHM_VERSION 3u
/* Data-plane cores a connection can span (one eventfd each in the welcome). */
#define PBOX_SHM_MAX_CORES 64u
/* The worker's RTO floor over shared memory, ms (see libpbox/client_register.c). */
#define PBOX_SHM_RTO_MIN_MS 100u
/* Longest a worker's send waits for room in a full ring before dropping, ms. */
#define PBOX_SHM_SEND_WAIT_MS 100
/* Datagrams handed out per receive call at most. */
#define PBOX_SHM_BURST 256u
/* Descriptors a welcome carries at most: the rings' memfd, the worker's eventfd, one
 * eventfd per core, one results' memfd per core. */
#define PBOX_SHM_MAX_FDS (2u + 2u * PBOX_SHM_MAX_CORES)
/* Bytes of control blocks per core (two rings). */
#define PBOX_SHM_CTL_PER_CORE (2u * sizeof(struct pbox_shm_ring_ctl))

/* worker -> pboxd, the first message of the worker (then only struct pbox_shm_memreq). */
struct pbox_shm_hello {
	uint32_t magic;
	uint32_t version;
	uint32_t job;
	uint32_t rank;
	uint64_t cookie;
};

/* pboxd -> worker. status 0: fds follow (memfd, the worker's eventfd, then ncores core
 * eventfds, then nres results' memfds); otherwise a positive errno and no fds (EACCES:
 * not an admitted worker; EMFILE: too many connections).
 *
 * Results' arenas (nres == ncores, or 0 when the job's state has none): core k's memfd
 * holds the buffers core k sends the worker's job's results from (engine/job.h,
 * struct pbox_result_ops), res_bytes[k] of them, and nothing else: no other job's
 * memory, no cookies, no other rank's contribution. pboxd sealed each against resizing
 * and against new writable mappings (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE |
 * F_SEAL_SEAL): the worker maps it read-only and can neither write nor resize it. */
struct pbox_shm_welcome {
	uint32_t magic;
	uint32_t version;
	uint32_t status;
	uint32_t ncores;
	uint64_t ring_bytes;
	uint64_t seg_bytes;
	uint32_t conn_id;
	uint32_t nres;
	uint64_t res_bytes[PBOX_SHM_MAX_CORES];
};

/* worker -> pboxd after the welcome: register a region (its memfd by SCM_RIGHTS, `bytes`
 * its size) or unregister one (`region`, no descriptor). */
#define PBOX_SHM_MEM_REG   1u
#define PBOX_SHM_MEM_UNREG 2u
struct pbox_shm_memreq {
	uint32_t magic;
	uint32_t op;
	uint32_t region; /* UNREG: the id pboxd gave */
	uint32_t seq;    /* REG: echoed in the answer */
	uint64_t bytes;  /* REG: the memfd's size */
};

/* pboxd -> worker: the answer to a REG. status 0: `region` is its id (never 0); else a
 * positive errno: EPERM (not a tmpfs memfd of `bytes` bytes sealed with F_SEAL_SHRINK;
 * hugetlbfs memfds are refused), ENOSPC
 * (the connection's region count or bytes would pass pboxd's limits), ENOMEM (pboxd
 * cannot map it), EMFILE (the memfd could not be received: pboxd at its open-file
 * limit), EPROTO (a malformed request). An answer that comes after its request timed out
 * is read by the worker's next registration, which unregisters its region: until then
 * (or the connection's end) that region counts against the worker's limits. */
struct pbox_shm_memrep {
	uint32_t magic;
	uint32_t op;
	uint32_t status;
	uint32_t region;
	uint32_t seq; /* the request's: an answer that came after its request timed out is
		       * recognised as stale (its region, if any, given back) */
	uint32_t pad;
};

/* Regions a connection may hold at most (pboxd's shm.max_regions is at most this). A
 * region id is its slot (low 8 bits) and a sequence number (the rest), so a reference to
 * a region unregistered and its slot reused does not reach the new one. */
#define PBOX_SHM_MAX_REGIONS     256u
#define PBOX_SHM_REGION_SLOT(id) ((id) & (PBOX_SHM_MAX_REGIONS - 1u))
/* The seals pboxd requires on a region before it maps it, and those libpbox sets. */
#define PBOX_SHM_MEM_SEALS_REQUIRED F_SEAL_SHRINK
#define PBOX_SHM_MEM_SEALS          (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
/* Payloads of at most this many bytes are copied even from a region (a reference record
 * costs a record of its own). */
#define PBOX_SHM_REF_MIN 256u

/* The seals a results' memfd must carry (the worker checks them before mapping it). */
#define PBOX_SHM_RES_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL)

/* Where a connection's rings are. */
struct pbox_shm_layout {
	uint64_t ctl_bytes;
	uint64_t ring_bytes;
	uint64_t seg_bytes;
	uint32_t ncores;
};

/* The layout for ncores cores and rings of ring_bytes; -EINVAL if either is out of range. */
int pbox_shm_layout(struct pbox_shm_layout *lay, uint32_t ncores, uint64_t ring_bytes);

/* Core k's rings in a mapped segment. */
static inline struct pbox_shm_ring_ctl *pbox_shm_ctl_w2a(uint8_t *base, uint32_t k)
{
	return (struct pbox_shm_ring_ctl *)(void *)(base + (size_t)k * PBOX_SHM_CTL_PER_CORE);
}
static inline struct pbox_shm_ring_ctl *pbox_shm_ctl_a2w(uint8_t *base, uint32_t k)
{
	return pbox_shm_ctl_w2a(base, k) + 1;
}
static inline uint8_t *pbox_shm_data_w2a(uint8_t *base, const struct pbox_shm_layout *lay,
					 uint32_t k)
{
	return base + lay->ctl_bytes + (size_t)(2 * k) * lay->ring_bytes;
}
static inline uint8_t *pbox_shm_data_a2w(uint8_t *base, const struct pbox_shm_layout *lay,
					 uint32_t k)
{
	return base + lay->ctl_bytes + (size_t)(2 * k + 1) * lay->ring_bytes;
}

/* Fill a sockaddr_un for name ('@...': abstract); returns its length, or -ENAMETOOLONG. */
struct sockaddr_un;
int pbox_shm_sockaddr(const char *name, struct sockaddr_un *su);

/* Send msg (len bytes) with nfds descriptors over a Unix socket; 0 or -errno. */
int pbox_shm_send_fds(int sock, const void *msg, size_t len, const int *fds, unsigned nfds);
/* Receive one message of exactly len bytes and up to maxfds descriptors (received ones
 * are always stored, *nfds says how many, so the caller closes them whatever happens).
 * Returns 0, -ECONNRESET at the end of the stream (the peer closed), -EPROTO for a message
 * of another size or cut short, -EMFILE for a whole message whose descriptors could not
 * all be received (this process at its open-file limit, or more than fit), or -errno. */
int pbox_shm_recv_fds(int sock, void *msg, size_t len, int *fds, unsigned maxfds, unsigned *nfds);

/* ---- the worker's side -------------------------------------------------------------- */

struct pbox_shm_client_stats {
	uint64_t tx_pkts;
	uint64_t tx_bytes;
	uint64_t tx_full;  /* datagrams dropped: the ring stayed full */
	uint64_t tx_waits; /* sends that had to wait for room */
	uint64_t rx_pkts;
	uint64_t rx_bytes;
	uint64_t wakes;    /* eventfd writes to pboxd's cores */
	uint64_t foreign;  /* sends to an endpoint that is none of the cores (dropped) */
	uint64_t rx_desc;  /* results received as descriptors (read in the results' arena) */
	uint64_t stale;    /* descriptors whose buffer was rewritten before it was read */
	uint64_t bad_desc; /* descriptors out of the arena's bounds (dropped) */
	uint64_t tx_ref;   /* pushes sent as references into a registered region (no copy) */
};

/* A datagram pbox_shm_client_rx handed out whose payload is not behind its header: pkts[i]
 * .data is the header (a private copy, pkts[i].len = 64 + len), the payload is in the
 * results' arena, valid while *gen == want (check again after reading it: a seqlock). */
struct pbox_shm_split {
	const uint8_t *payload;
	uint32_t len;
	const uint64_t *gen;
	uint64_t want;
};

struct pbox_shm_client;

/*
 * Connect to pboxd's shared-memory socket `name` and set up the rings of worker (job,
 * rank, cookie). cores[0..ncores): the appliance cores' UDP endpoints as the node knows
 * them: a datagram sent to cores[k] goes into core k's ring, and one received from core
 * k's ring is reported as from cores[k] (the node stays unchanged). The array must
 * outlive the client. Returns NULL with the reason in err (connection refused, not
 * admitted, pboxd's core count differs...).
 */
struct pbox_shm_client *pbox_shm_client_open(const char *name, uint32_t job, uint32_t rank,
					     uint64_t cookie, const struct pbox_peer *cores,
					     uint32_t ncores, char *err, size_t errlen);
void pbox_shm_client_close(struct pbox_shm_client *c);

/* Datagrams from the cores, up to max, in place (pointers into the rings, valid until
 * pbox_shm_client_rx_done). */
unsigned pbox_shm_client_rx(struct pbox_shm_client *c, struct pbox_rx_pkt *pkts, unsigned max);
/* For the i-th datagram of the last pbox_shm_client_rx: its split payload, or NULL if it
 * is a whole datagram (header and payload at .data). */
const struct pbox_shm_split *pbox_shm_client_split(const struct pbox_shm_client *c, unsigned i);

/* The datagrams handed out are consumed: give their room back. */
void pbox_shm_client_rx_done(struct pbox_shm_client *c);

/* Before blocking: announce it to pboxd; false if a datagram arrived meanwhile (do not
 * block). After blocking (or not): pbox_shm_client_sleep_end. */
bool pbox_shm_client_sleep_prepare(struct pbox_shm_client *c);
void pbox_shm_client_sleep_end(struct pbox_shm_client *c);

/* The eventfd pboxd writes when it published to a sleeping worker (poll it for POLLIN),
 * and the connection's socket (POLLHUP: pboxd ended the connection). */
int pbox_shm_client_wake_fd(const struct pbox_shm_client *c);
int pbox_shm_client_sock_fd(const struct pbox_shm_client *c);

/* Ring errors seen on receive (pboxd wrote something invalid): PBOX_SHM_OK if none. */
enum pbox_shm_err pbox_shm_client_err(const struct pbox_shm_client *c);

/* Core k's results' arena as mapped (read-only) by the worker, *len its bytes; NULL (and
 * *len 0) when pboxd gave none (the job's state has no results' arenas). */
const uint8_t *pbox_shm_client_results(const struct pbox_shm_client *c, uint32_t k, size_t *len);

const struct pbox_shm_client_stats *pbox_shm_client_stats(const struct pbox_shm_client *c);

/*
 * Registered memory. mem_reg: create a memfd of `bytes` (> 0; rounded up to a page), map
 * it read-write, seal it (PBOX_SHM_MEM_SEALS), hand it to pboxd and wait for its answer
 * (bounded by the socket's 10 s receive timeout). Returns 0 with *out the mapping, which
 * belongs to the client until mem_unreg or pbox_shm_client_close; or -errno with the
 * reason in err: pboxd's refusal (-EPERM, -ENOSPC, -ENOMEM), -ENOSPC (this side's
 * PBOX_SHM_MAX_REGIONS taken), -ECONNRESET (pboxd ended the connection), or a system
 * call's error. Nothing is left mapped on failure.
 * mem_unreg: p must be a mapping mem_reg returned; no push from it may be in flight. The
 * region is forgotten, pboxd told, the mapping removed. 0 or -EINVAL (not a region).
 * Both any thread (serialised by a lock of their own).
 */
int pbox_shm_client_mem_reg(struct pbox_shm_client *c, size_t bytes, void **out, char *err,
			    size_t errlen);
int pbox_shm_client_mem_unreg(struct pbox_shm_client *c, void *p);
/* mem_detach: as mem_unreg, but the mapping stays and becomes the caller's (munmap it);
 * pboxd no longer sees it. */
int pbox_shm_client_mem_detach(struct pbox_shm_client *c, void *p);

/* struct pbox_tx_ops of the worker's side; ctx is the struct pbox_shm_client. A full ring
 * makes a send wait (waking the core) up to PBOX_SHM_SEND_WAIT_MS, then drop the datagram
 * (counted): pboxd drains its rings whatever the worker does, so waiting cannot deadlock.
 * A payload of more than PBOX_SHM_REF_MIN bytes inside a registered region goes as a
 * reference (pboxd reads it in place later: the caller must not change it until the
 * operation completed; queued / reclaim do not track it). */
extern const struct pbox_tx_ops pbox_shm_client_tx_ops;

#endif /* PBOX_SHM_H */
