/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The loader of nicfw/pbox_xdp.bpf.c (libbpf skeleton) and the operations pboxd runs on it:
 * attach to an interface (native XDP, else generic, logged), pin the maps under
 * <pin_root>/<ifname>/, keep the admitted jobs' session cookies and chunk owners in the
 * maps, register AF_XDP sockets of the data-plane cores, read the counters, detach.
 *
 * Start-up and crash recovery: an XDP program stays attached when its process dies. Each
 * loaded program records its process (pid and start time, in its pbox_owner map). At open,
 * a pbox_xdp already on the interface whose process is gone (a crashed pboxd's) is replaced
 * and its stale pins removed; one whose process still runs (another pboxd), and any other
 * XDP program, is left alone and open fails with -EBUSY. At close, only pins still of this
 * loader's maps are removed.
 *
 * Threading: one pbox_xdp belongs to one thread (pboxd's control thread); the program reads
 * the maps concurrently, and each map update is atomic per entry. No call is made per
 * packet.
 *
 * Errors: int functions return 0 or a negative errno, after logging the interface and the
 * cause; pbox_xdp_open returns NULL after logging.
 */
#ifndef PBOX_NICFW_LOADER_H
#define PBOX_NICFW_LOADER_H

#include <stdint.h>

#include "pbox_xdp_abi.h"

enum pbox_xdp_mode {
	PBOX_XDP_MODE_AUTO = 0, /* native, else generic (logged) */
	PBOX_XDP_MODE_NATIVE,   /* driver mode only */
	PBOX_XDP_MODE_GENERIC,  /* skb mode only */
};

struct pbox_xdp_opts {
	/* Interface to attach to; NULL: load only (bpf_prog_test_run, tests). */
	const char *ifname;
	enum pbox_xdp_mode mode;
	/* Directory of the per-interface pin directories; NULL: "/sys/fs/bpf/pbox"; "": do
	 * not pin. A /sys/fs/bpf that is not a bpffs is mounted first. */
	const char *pin_root;
	/* pbox's data ports: port_lo .. port_lo + nports - 1 (host order), nports >= 1. */
	uint16_t port_lo;
	uint16_t nports;
	/* IPv4 destination of the data ports, network order; 0: any. */
	uint32_t data_addr;
	/* Chunk slots of the chunk-owner map (one byte each, over all jobs; rounded up to a
	 * multiple of 8); 0: PBOX_XDP_DEFAULT_CHUNKS. */
	uint32_t max_chunks;
};

struct pbox_xdp;

/* Parse "auto", "native" or "generic"; 0 or -EINVAL. */
int pbox_xdp_mode_parse(const char *s, enum pbox_xdp_mode *mode);

/* Load, (un)pin and attach per opts. NULL after logging why. */
struct pbox_xdp *pbox_xdp_open(const struct pbox_xdp_opts *opts);

/* Detach (only if the program on the interface is still ours), remove the pins, free.
 * NULL is accepted. */
void pbox_xdp_close(struct pbox_xdp *x);

/* "native", "generic" or "none" (load only): how the program is attached. */
const char *pbox_xdp_attach_mode(const struct pbox_xdp *x);

/* The program's fd (for bpf_prog_test_run_opts); owned by x. */
int pbox_xdp_prog_fd(const struct pbox_xdp *x);

/*
 * Admit job (or update it): nworkers ranks, cookies[r] the session cookie of rank r (0: no
 * session, its datagrams are dropped as bad_cookie). Only changed entries are written;
 * cookies go in before the job entry exists. 0, -ENOMEM (no room in the maps: the job is
 * left as it was before) or another -errno of the map update.
 */
int pbox_xdp_job_set(struct pbox_xdp *x, uint32_t job, uint32_t nworkers, const uint64_t *cookies);

/*
 * The job's owner core of each chunk (core[c] for chunk c, < PBOX_XDP_MAX_CORES), replacing
 * what was set before: a run of nchunks slots of the chunk-owner map, written with one copy
 * into its memory mapping (no system call per chunk). 0; -ENOENT (job not set); -EINVAL
 * (a core out of range: nothing changed); -ENOSPC (no free run of nchunks slots: the job
 * has no owners, its datagrams go to the kernel as pass_no_owner; logged).
 */
int pbox_xdp_chunks_set(struct pbox_xdp *x, uint32_t job, const uint32_t *core, uint32_t nchunks);

/* Forget job: the job entry first, then its cookies; its chunk slots become free. 0 (also
 * when unknown). */
int pbox_xdp_job_remove(struct pbox_xdp *x, uint32_t job);

/* Whether job is set (its datagrams are checked against its cookies). */
int pbox_xdp_job_known(const struct pbox_xdp *x, uint32_t job);

/* Register the AF_XDP socket xsk_fd of core bound to RX queue rxq (the transport's call),
 * or clear it. -EINVAL out of range, or the map update's -errno. */
int pbox_xdp_xsk_set(struct pbox_xdp *x, uint32_t core, uint32_t rxq, int xsk_fd);
int pbox_xdp_xsk_clear(struct pbox_xdp *x, uint32_t core, uint32_t rxq);

/* The counters summed over CPUs. 0 or -errno. */
int pbox_xdp_stats_read(const struct pbox_xdp *x, struct pbox_xdp_stats *sum);

#endif /* PBOX_NICFW_LOADER_H */
