/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pboxd's "afxdp" transport: one AF_XDP socket and one UMEM per data-plane core (libxdp's
 * xsk API), a module of the core loop (core/loop.h) behind struct pboxd_transport_ops.
 *
 * Steering: pboxd's XDP filter (nicfw/pbox_xdp.bpf.c) is attached to the interface; it
 * redirects each valid pbox datagram to XSK slot (owner core, RX queue of arrival) and
 * passes everything else (ARP, the control channel's TCP, probes, other traffic) to the
 * kernel, whose address on the interface is data_address. Core k binds one socket to RX
 * queue queues[k] (default k) and registers it in slot (k, queues[k]) only: an AF_XDP
 * socket receives only from its (device, queue), a (device, queue) takes one UMEM, and a
 * UMEM's fill ring belongs to one core. So with several cores the device must steer
 * datagrams to data port base_port + k onto queue queues[k] (ethtool ntuple rules on a
 * NIC, tc skbedit queue_mapping in front of a multi-queue veth): datagrams that arrive on
 * another core's queue find no socket in their slot and go to the kernel, counted by the
 * filter per owner core (core_pass), never handed between cores in software. One core on
 * a one-queue veth needs no steering.
 *
 * RX: the engine reads each datagram in its UMEM buffers (no copy; frames larger than a
 * buffer arrive chained, XDP_USE_SG); after the burst the buffers go straight back to the
 * fill ring. Checksums (IPv4 header, UDP) are verified here (frame.h). TX: each reply is
 * written into free UMEM frames (headers from the core's template, the payload copied
 * once, the UDP checksum computed) and the socket is kicked on flush; completions return
 * the frames. The payload is copied at send, so reclaim releases at once (the contract of
 * common/xport.h, as for kernel UDP). Neighbours: replies go to the Ethernet source of
 * the worker's datagrams (learned per rank by the engine), never through ARP here.
 *
 * Threading: start / stop / xdp_attach / the counters from the control thread; the loop
 * hooks on the core's thread; afx_wake from stop. Counters are written by their core
 * only and read relaxed.
 */
#include <arpa/inet.h>
#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <linux/if_xdp.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <xdp/xsk.h>

#include "common/log.h"
#include "core/loop.h"
#include "loader.h"
#include "pboxd/dataplane.h"
#include "transport/afxdp/frame.h"

/* Kernel ABI constants newer than Debian 12's headers (Linux 6.6). */
#ifndef XDP_USE_SG
#define XDP_USE_SG (1 << 4)
#endif
#ifndef XDP_PKT_CONTD
#define XDP_PKT_CONTD (1 << 0)
#endif
#ifndef SO_PREFER_BUSY_POLL
#define SO_PREFER_BUSY_POLL 69
#endif
#ifndef SO_BUSY_POLL_BUDGET
#define SO_BUSY_POLL_BUDGET 70
#endif

#define AFX_MAX_SEGS   64  /* buffers of one frame (PBOX_ENGINE_MAX_SEGS) */
#define AFX_RX_BATCH   256 /* RX descriptors looked at per poll */
#define AFX_KICK_TRIES 64  /* sendto calls per flush in copy mode (32 frames each) */

/* One core's counters (written by the core, read relaxed by the control thread). */
struct afx_stats {
	uint64_t rx_frames;                     /* RX descriptors */
	uint64_t rx_pkts;                       /* datagrams handed to the engine */
	uint64_t rx_bytes;                      /* their pbox bytes */
	uint64_t rx_verdict[PBOX_AFX_VERDICTS]; /* frames not handed on, by reason */
	uint64_t rx_too_many_segs;
	uint64_t rx_wakeups; /* recvfrom to drive the driver (need_wakeup / busy poll) */
	uint64_t fill_short; /* RX buffers that found no room in the fill ring */
	uint64_t tx_pkts;
	uint64_t tx_frames; /* TX descriptors */
	uint64_t tx_bytes;
	uint64_t tx_no_frame;  /* no free UMEM frame after reaping completions: dropped */
	uint64_t tx_ring_full; /* no room in the TX ring: dropped */
	uint64_t tx_too_big;   /* would need chained buffers without XDP_USE_SG */
	uint64_t tx_kicks;
	uint64_t tx_kick_errors;
	uint64_t completions;
};

struct afx_core {
	struct pbox_loop loop;
	struct afx_stats st;
	struct xsk_ring_cons rx;
	struct xsk_ring_prod tx;
	struct xsk_ring_prod fq;
	struct xsk_ring_cons cq;
	struct xsk_umem *umem;
	struct xsk_socket *xsk;
	int fd;
	int wake_fd;
	uint8_t *area;
	size_t area_len;
	uint32_t frame_size;
	uint32_t tx_size;
	uint64_t *free_frames; /* TX frames not in flight */
	uint32_t nfree;
	uint32_t tx_unkicked; /* submitted since the last kick */
	uint64_t queued;      /* payload datagrams queued (xport.h) */
	uint16_t sport;
	uint16_t ip_id;
	bool zc;
	bool sg;
	bool busy_poll; /* the socket's busy-poll options took */
	struct pbox_afx_addr me;
	uint32_t idx;
	uint32_t queue;
	struct pboxd_core *core;
	pthread_t thread;
	bool started;
} PBOX_CACHE_ALIGNED;
static_assert(_Alignof(struct afx_core) == PBOX_CACHE_LINE,
	      "a core's AF_XDP state starts its own cache line");

struct afx {
	char ifname[IF_NAMESIZE];
	uint32_t ncores;
	struct afx_core **cores;
	bool registered; /* sockets in the XDP filter's XSK map */
};

/* ---- TX ------------------------------------------------------------------------------ */

static void reap_completions(struct afx_core *a)
{
	uint32_t idx, n = xsk_ring_cons__peek(&a->cq, UINT32_MAX, &idx);

	for (uint32_t i = 0; i < n; i++) {
		a->free_frames[a->nfree++] = *xsk_ring_cons__comp_addr(&a->cq, idx + i);
	}
	if (n != 0) {
		xsk_ring_cons__release(&a->cq, n);
		PBOX_STAT_ADD(&a->st, completions, n);
	}
}

/* Make the kernel send what was submitted. Copy mode sends at most 32 frames per
 * sendto and says EAGAIN while more wait; zero-copy drivers that do not need a wake-up
 * send on their own. */
static void kick(struct afx_core *a)
{
	if (a->tx_unkicked == 0) {
		return;
	}
	a->tx_unkicked = 0;
	for (int t = 0; t < AFX_KICK_TRIES; t++) {
		if (!xsk_ring_prod__needs_wakeup(&a->tx)) {
			break;
		}
		PBOX_STAT_ADD(&a->st, tx_kicks, 1);
		if (sendto(a->fd, NULL, 0, MSG_DONTWAIT, NULL, 0) < 0 && errno != EAGAIN &&
		    errno != EBUSY && errno != ENOBUFS) {
			PBOX_STAT_ADD(&a->st, tx_kick_errors, 1);
			break;
		}
		reap_completions(a);
		if (xsk_prod_nb_free(&a->tx, a->tx_size) == a->tx_size) {
			return; /* the kernel took every descriptor */
		}
	}
	/* Descriptors left (tries exhausted, or an error): the next tx hook kicks again. */
	if (xsk_ring_prod__needs_wakeup(&a->tx)) {
		a->tx_unkicked = 1;
	}
}

static int afx_send(void *ctx, const struct pbox_peer *to, const struct pbox_wire_hdr *hdr,
		    const void *payload, uint32_t len)
{
	struct afx_core *a = ctx;
	const uint32_t fs = a->frame_size;
	const uint32_t total = PBOX_AFX_HDR_LEN + (uint32_t)sizeof(*hdr) + len;
	const uint32_t nfr = (total + fs - 1) / fs;
	struct pbox_iov src[2] = { { hdr, sizeof(*hdr) }, { payload, len } };
	unsigned si = 0;
	uint32_t soff = 0, idx;

	if (nfr > 1 && !a->sg) {
		PBOX_STAT_ADD(&a->st, tx_too_big, 1);
		return -EMSGSIZE;
	}
	if (a->nfree < nfr) {
		reap_completions(a);
		if (a->nfree < nfr) {
			kick(a);
			reap_completions(a);
		}
		if (a->nfree < nfr) {
			PBOX_STAT_ADD(&a->st, tx_no_frame, 1);
			return -ENOBUFS;
		}
	}
	if (xsk_ring_prod__reserve(&a->tx, nfr, &idx) != nfr) {
		a->tx_unkicked = 1;
		kick(a);
		if (xsk_ring_prod__reserve(&a->tx, nfr, &idx) != nfr) {
			PBOX_STAT_ADD(&a->st, tx_ring_full, 1);
			return -ENOBUFS;
		}
	}
	for (uint32_t f = 0; f < nfr; f++) {
		uint64_t addr = a->free_frames[--a->nfree];
		uint8_t *dst = xsk_umem__get_data(a->area, addr);
		uint32_t off = 0, room = fs;
		struct xdp_desc *d = xsk_ring_prod__tx_desc(&a->tx, idx + f);

		if (f == 0) {
			pbox_afx_build(dst, &a->me, a->sport, to, (uint32_t)sizeof(*hdr) + len,
				       a->ip_id++, pbox_afx_csum_iov(src, len != 0 ? 2 : 1));
			off = PBOX_AFX_HDR_LEN;
		}
		while (off < room && si < 2) {
			uint32_t take = src[si].len - soff;

			if (take > room - off) {
				take = room - off;
			}
			if (take != 0) {
				memcpy(dst + off, (const uint8_t *)src[si].base + soff, take);
			}
			off += take;
			soff += take;
			if (soff == src[si].len) {
				si++;
				soff = 0;
			}
		}
		d->addr = addr;
		d->len = off;
		d->options = f + 1 < nfr ? XDP_PKT_CONTD : 0;
	}
	xsk_ring_prod__submit(&a->tx, nfr);
	a->tx_unkicked += nfr;
	if (len != 0) {
		a->queued++;
	}
	PBOX_STAT_ADD(&a->st, tx_pkts, 1);
	PBOX_STAT_ADD(&a->st, tx_frames, nfr);
	PBOX_STAT_ADD(&a->st, tx_bytes, sizeof(*hdr) + len);
	return 0;
}

static void afx_flush(void *ctx)
{
	kick(ctx);
}

static uint64_t afx_queued(void *ctx)
{
	return ((struct afx_core *)ctx)->queued;
}

/* The payload was copied into UMEM by afx_send: released when queued. */
static uint64_t afx_reclaim(void *ctx, uint64_t upto)
{
	(void)upto;
	return ((struct afx_core *)ctx)->queued;
}

static const struct pbox_tx_ops afx_tx_ops = {
	.send = afx_send,
	.flush = afx_flush,
	.queued = afx_queued,
	.reclaim = afx_reclaim,
};

/* ---- RX: a module of the core loop --------------------------------------------------- */

/* Give RX buffers back to the kernel. The fill ring holds every RX buffer (fill_size of
 * them), so it always has room; a shortfall would be a bug, counted, and the buffer goes
 * to the TX frames instead of being lost. */
static void refill(struct afx_core *a, uint32_t first, uint32_t n)
{
	uint32_t fidx, got = xsk_ring_prod__reserve(&a->fq, n, &fidx);

	for (uint32_t i = 0; i < got; i++) {
		*xsk_ring_prod__fill_addr(&a->fq, fidx + i) =
			xsk_umem__extract_addr(xsk_ring_cons__rx_desc(&a->rx, first + i)->addr);
	}
	xsk_ring_prod__submit(&a->fq, got);
	for (uint32_t i = got; i < n; i++) {
		a->free_frames[a->nfree++] =
			xsk_umem__extract_addr(xsk_ring_cons__rx_desc(&a->rx, first + i)->addr);
	}
	if (got < n) {
		PBOX_STAT_ADD(&a->st, fill_short, n - got);
	}
}

static enum pbox_poll_rc afx_rx(void *xc, struct pbox_loop *l)
{
	struct afx_core *a = xc;
	struct pbox_engine *e = l->engine;
	const struct pbox_jobtab *tab;
	uint32_t idx, n, i = 0;

	n = xsk_ring_cons__peek(&a->rx, AFX_RX_BATCH, &idx);
	if (n == 0) {
		if (a->busy_poll || xsk_ring_prod__needs_wakeup(&a->fq)) {
			PBOX_STAT_ADD(&a->st, rx_wakeups, 1);
			if (recvfrom(a->fd, NULL, 0, MSG_DONTWAIT, NULL, NULL) < 0) {
				/* EAGAIN: nothing yet; the ring is read on the next poll */
			}
		}
		return PBOX_POLL_IDLE;
	}
	tab = pbox_loop_table(l);
	while (i < n) {
		struct pbox_iov seg[AFX_MAX_SEGS];
		struct pbox_afx_rx r;
		enum pbox_afx_verdict v;
		unsigned ns = 0;
		uint32_t j = i;
		bool complete = false;

		for (; j < n; j++) {
			const struct xdp_desc *d = xsk_ring_cons__rx_desc(&a->rx, idx + j);

			if (ns < AFX_MAX_SEGS) {
				seg[ns].base = xsk_umem__get_data(a->area, d->addr);
				seg[ns].len = d->len;
			}
			ns++;
			if (!(d->options & XDP_PKT_CONTD)) {
				complete = true;
				j++;
				break;
			}
		}
		if (!complete) {
			break; /* the rest of this frame is not in the ring yet */
		}
		PBOX_STAT_ADD(&a->st, rx_frames, j - i);
		i = j;
		if (ns > AFX_MAX_SEGS) {
			PBOX_STAT_ADD(&a->st, rx_too_many_segs, 1);
			continue;
		}
		v = pbox_afx_parse(seg, ns, &a->me, &r);
		if (pbox_unlikely(v != PBOX_AFX_OK)) {
			PBOX_STAT_ADD(&a->st, rx_verdict[v], 1);
			continue;
		}
		PBOX_STAT_ADD(&a->st, rx_pkts, 1);
		PBOX_STAT_ADD(&a->st, rx_bytes, r.len);
		if (pbox_likely(r.off + r.len <= seg[0].len)) {
			pbox_engine_rx(e, tab, (const uint8_t *)seg[0].base + r.off, r.len,
				       &r.from);
		} else {
			/* A chained frame: the datagram from offset r.off over the buffers. */
			struct pbox_iov dg[AFX_MAX_SEGS];
			uint32_t skip = r.off, want = r.len;
			unsigned nd = 0;

			for (unsigned k = 0; k < ns && want != 0; k++) {
				uint32_t take;

				if (skip >= seg[k].len) {
					skip -= seg[k].len;
					continue;
				}
				take = PBOX_MIN(seg[k].len - skip, want);
				dg[nd].base = (const uint8_t *)seg[k].base + skip;
				dg[nd].len = take;
				nd++;
				want -= take;
				skip = 0;
			}
			pbox_engine_rx_iov(e, tab, dg, nd, &r.from);
		}
	}
	/* Replies are copied into TX frames by the flush, so the RX buffers are free after
	 * it. */
	pbox_engine_flush(e);
	/* A frame whose last buffer is not in the ring yet is looked at again next time. */
	xsk_ring_cons__cancel(&a->rx, n - i);
	if (i != 0) {
		refill(a, idx, i);
		xsk_ring_cons__release(&a->rx, i);
	}
	return i != 0 ? PBOX_POLL_BUSY : PBOX_POLL_IDLE;
}

/* After the table was observed: completions back to the free TX frames, and a kick for
 * what the engine's timers queued. */
static void afx_tx(void *xc, struct pbox_loop *l, enum pbox_poll_rc rx_rc)
{
	struct afx_core *a = xc;

	(void)l;
	(void)rx_rc;
	kick(a);
	reap_completions(a);
}

static bool afx_wait(void *xc, int timeout_ms)
{
	struct afx_core *a = xc;
	struct pollfd p[2] = { { .fd = a->fd, .events = POLLIN },
			       { .fd = a->wake_fd, .events = POLLIN } };

	if (poll(p, 2, timeout_ms) < 0) {
		/* EINTR: the loop polls again */
	}
	return true;
}

static void afx_wake(void *xc)
{
	struct afx_core *a = xc;
	uint64_t one = 1;

	if (write(a->wake_fd, &one, sizeof(one)) < 0) {
		/* saturated: already woken */
	}
}

static const struct pbox_loop_ops afx_loop_ops = {
	.rx = afx_rx,
	.tx = afx_tx,
	.wait = afx_wait,
	.wake = afx_wake,
};

static void *afx_core_main(void *arg)
{
	struct afx_core *a = arg;

	pbox_loop_run(&a->loop);
	return NULL;
}

/* ---- set-up and teardown (control thread) -------------------------------------------- */

static int if_mac(const char *ifname, uint8_t mac[6])
{
	struct ifreq ifr;
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), rc = 0;

	if (s < 0) {
		return -errno;
	}
	memset(&ifr, 0, sizeof(ifr));
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", ifname);
	if (ioctl(s, SIOCGIFHWADDR, &ifr) != 0) {
		rc = -errno;
	} else {
		memcpy(mac, ifr.ifr_hwaddr.sa_data, 6);
	}
	close(s);
	return rc;
}

/* The interface's RX queues (/sys/class/net/IF/queues/rx-N), or 0 if unknown. */
static uint32_t if_rx_queues(const char *ifname)
{
	char path[128];
	struct dirent *de;
	uint32_t n = 0;
	DIR *d;

	snprintf(path, sizeof(path), "/sys/class/net/%s/queues", ifname);
	d = opendir(path);
	if (d == NULL) {
		return 0;
	}
	while ((de = readdir(d)) != NULL) {
		n += strncmp(de->d_name, "rx-", 3) == 0;
	}
	closedir(d);
	return n;
}

static void core_close(struct afx_core *a)
{
	if (a->xsk != NULL) {
		xsk_socket__delete(a->xsk);
		a->xsk = NULL;
	}
	if (a->umem != NULL) {
		xsk_umem__delete(a->umem);
		a->umem = NULL;
	}
	if (a->area != NULL) {
		munmap(a->area, a->area_len);
		a->area = NULL;
	}
	if (a->wake_fd >= 0) {
		close(a->wake_fd);
		a->wake_fd = -1;
	}
	free(a->free_frames);
	a->free_frames = NULL;
}

/* Busy polling on the socket (Linux 5.11+): logged per outcome. */
static void set_busy_poll(struct afx_core *a, const struct pbox_afxdp_cfg *ac, char *what,
			  size_t len)
{
	int one = 1, us = (int)ac->busy_poll_us, budget = (int)ac->busy_poll_budget;

	if (!ac->busy_poll) {
		snprintf(what, len, "busy polling off (afxdp.busy_poll)");
		return;
	}
	if (setsockopt(a->fd, SOL_SOCKET, SO_PREFER_BUSY_POLL, &one, sizeof(one)) != 0 ||
	    setsockopt(a->fd, SOL_SOCKET, SO_BUSY_POLL, &us, sizeof(us)) != 0) {
		snprintf(what, len, "no busy polling (%s: interrupts and poll() instead)",
			 strerror(errno));
		return;
	}
	a->busy_poll = true;
	if (setsockopt(a->fd, SOL_SOCKET, SO_BUSY_POLL_BUDGET, &budget, sizeof(budget)) != 0) {
		snprintf(what, len, "busy polling %d us (budget %d refused: %s, kernel default)",
			 us, budget, strerror(errno));
		return;
	}
	snprintf(what, len, "busy polling %d us, budget %d", us, budget);
}

/* Create the UMEM and bind the socket (zero copy first unless told otherwise). */
static int core_bind(struct afx_core *a, const char *ifname, const struct pbox_afxdp_cfg *ac,
		     char *zc_why, size_t zc_len)
{
	struct xsk_umem_config uc = {
		.fill_size = ac->fill_size,
		.comp_size = ac->comp_size,
		.frame_size = ac->frame_size,
		.frame_headroom = 0,
		.flags = 0,
	};
	struct xsk_socket_config sc = {
		.rx_size = ac->rx_size,
		.tx_size = ac->tx_size,
		.libxdp_flags = XSK_LIBXDP_FLAGS__INHIBIT_PROG_LOAD,
		.xdp_flags = 0,
	};
	bool try_zc = ac->zero_copy != PBOX_AFXDP_ZC_OFF;
	int rc;

	for (;;) {
		rc = xsk_umem__create(&a->umem, a->area, a->area_len, &a->fq, &a->cq, &uc);
		if (rc != 0) {
			a->umem = NULL;
			return rc;
		}
		sc.bind_flags = (uint16_t)(XDP_USE_NEED_WAKEUP | (a->sg ? XDP_USE_SG : 0) |
					   (try_zc ? XDP_ZEROCOPY : XDP_COPY));
		rc = xsk_socket__create(&a->xsk, ifname, a->queue, a->umem, &a->rx, &a->tx, &sc);
		if (rc == 0) {
			a->zc = try_zc;
			return 0;
		}
		a->xsk = NULL;
		xsk_umem__delete(a->umem);
		a->umem = NULL;
		if (!try_zc || ac->zero_copy == PBOX_AFXDP_ZC_ON) {
			return rc;
		}
		snprintf(zc_why, zc_len, "zero copy refused: %s", strerror(-rc));
		try_zc = false;
	}
}

static int core_open(struct afx_core *a, const struct pboxd_config *cfg, const char *ifname,
		     const struct pbox_afx_addr *me)
{
	const struct pbox_afxdp_cfg *ac = &cfg->afxdp;
	uint32_t ntx = ac->frames - ac->fill_size, fidx;
	char zc_why[96] = "", bp[128];
	int rc;

	a->frame_size = ac->frame_size;
	a->tx_size = ac->tx_size;
	a->me = *me;
	a->sport = (uint16_t)(cfg->base_port + a->idx);
	a->sg = 14 + cfg->mtu > ac->frame_size;
	a->area_len = (size_t)ac->frames * ac->frame_size;
	a->area = mmap(NULL, a->area_len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (a->area == MAP_FAILED) {
		a->area = NULL;
		rc = -errno;
		PBOX_LOG_ERR(TRANSPORT, "core %u: %s: cannot map a UMEM of %zu bytes: %s", a->idx,
			     ifname, a->area_len, strerror(-rc));
		return rc;
	}
	a->free_frames = malloc(sizeof(*a->free_frames) * ac->frames);
	a->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (a->free_frames == NULL || a->wake_fd < 0) {
		PBOX_LOG_ERR(TRANSPORT, "core %u: out of memory / descriptors", a->idx);
		return -ENOMEM;
	}
	rc = core_bind(a, ifname, ac, zc_why, sizeof(zc_why));
	if (rc != 0) {
		const char *hint = "";

		if (rc == -EPERM || rc == -EACCES) {
			hint = " (AF_XDP sockets need CAP_NET_RAW, the XDP filter CAP_NET_ADMIN "
			       "and CAP_BPF: run as root)";
		} else if (rc == -ENOBUFS || rc == -ENOMEM) {
			hint = " (the UMEM is locked memory: CAP_IPC_LOCK, or a higher "
			       "RLIMIT_MEMLOCK, or fewer afxdp.frames)";
		} else if (rc == -EBUSY) {
			hint = " (another AF_XDP socket or UMEM is bound to this queue)";
		} else if (rc == -EINVAL && a->sg) {
			hint = " (frames larger than afxdp.frame_size need XDP_USE_SG, Linux >= "
			       "6.6)";
		} else if (rc == -EOPNOTSUPP && ac->zero_copy == PBOX_AFXDP_ZC_ON) {
			hint = " (zero_copy = \"on\" but the driver has no zero-copy AF_XDP)";
		}
		PBOX_LOG_ERR(TRANSPORT,
			     "core %u: %s queue %u: cannot set up its UMEM and AF_XDP socket: %s%s",
			     a->idx, ifname, a->queue, strerror(-rc), hint);
		return rc;
	}
	a->fd = xsk_socket__fd(a->xsk);
	/* Fill ring: the first fill_size frames; the rest are TX frames. */
	if (xsk_ring_prod__reserve(&a->fq, ac->fill_size, &fidx) != ac->fill_size) {
		PBOX_LOG_ERR(TRANSPORT, "core %u: %s: the fill ring takes fewer than %u frames",
			     a->idx, ifname, ac->fill_size);
		return -ENOSPC;
	}
	for (uint32_t i = 0; i < ac->fill_size; i++) {
		*xsk_ring_prod__fill_addr(&a->fq, fidx + i) = (uint64_t)i * ac->frame_size;
	}
	xsk_ring_prod__submit(&a->fq, ac->fill_size);
	for (uint32_t i = 0; i < ntx; i++) {
		a->free_frames[a->nfree++] = (uint64_t)(ac->fill_size + i) * ac->frame_size;
	}
	set_busy_poll(a, ac, bp, sizeof(bp));
	PBOX_LOG_INFO(TRANSPORT,
		      "core %u: AF_XDP socket on %s queue %u, %s%s%s, UMEM %u x %u B (%u RX, %u "
		      "TX)%s, %s",
		      a->idx, ifname, a->queue, a->zc ? "zero-copy mode" : "copy mode",
		      zc_why[0] ? ": " : "", zc_why, ac->frames, ac->frame_size, ac->fill_size, ntx,
		      a->sg ? ", chained buffers (XDP_USE_SG)" : "", bp);
	return 0;
}

static void afx_stop(struct pboxd_dp *dp)
{
	struct afx *x = dp->xport;

	if (x == NULL) {
		return;
	}
	for (uint32_t k = 0; k < x->ncores; k++) {
		if (x->cores[k] != NULL) {
			pbox_loop_stop(&x->cores[k]->loop);
		}
	}
	for (uint32_t k = 0; k < x->ncores; k++) {
		struct afx_core *a = x->cores[k];

		if (a != NULL && a->started) {
			pthread_join(a->thread, NULL);
			a->started = false;
		}
	}
	for (uint32_t k = 0; k < x->ncores; k++) {
		struct afx_core *a = x->cores[k];

		if (a != NULL) {
			core_close(a);
			free(a);
			dp->cores[k].xport_core = NULL;
		}
	}
	PBOX_LOG_INFO(TRANSPORT, "afxdp: %u AF_XDP socket%s on %s closed", x->ncores,
		      x->ncores == 1 ? "" : "s", x->ifname);
	free(x->cores);
	free(x);
	dp->xport = NULL;
}

static int afx_start(struct pboxd_dp *dp, const struct pboxd_config *cfg)
{
	const struct pbox_afxdp_cfg *ac = &cfg->afxdp;
	struct pbox_afx_addr me = { .port_lo = cfg->base_port, .nports = (uint16_t)cfg->ncores };
	uint32_t nrxq;
	struct in_addr ip;
	struct afx *x;
	int rc;

	if (if_nametoindex(ac->interface) == 0) {
		PBOX_LOG_ERR(TRANSPORT, "afxdp.interface '%s': no such interface (%s)",
			     ac->interface, strerror(errno));
		return -ENODEV;
	}
	rc = if_mac(ac->interface, me.mac);
	if (rc != 0) {
		PBOX_LOG_ERR(TRANSPORT, "afxdp.interface '%s': cannot read its MAC address: %s",
			     ac->interface, strerror(-rc));
		return rc;
	}
	if (inet_pton(AF_INET, cfg->data_addr, &ip) != 1) {
		PBOX_LOG_ERR(TRANSPORT, "afxdp: data_address '%s' is not an IPv4 address",
			     cfg->data_addr);
		return -EINVAL;
	}
	me.ip = ip.s_addr;
	nrxq = if_rx_queues(ac->interface);
	x = calloc(1, sizeof(*x));
	if (x == NULL || (x->cores = calloc(cfg->ncores, sizeof(*x->cores))) == NULL) {
		free(x);
		return -ENOMEM;
	}
	dp->xport = x;
	snprintf(x->ifname, sizeof(x->ifname), "%s", ac->interface);
	x->ncores = cfg->ncores;
	for (uint32_t k = 0; k < cfg->ncores; k++) {
		struct pboxd_core *c = &dp->cores[k];
		struct afx_core *a;

		a = aligned_alloc(PBOX_CACHE_LINE, (sizeof(*a) + PBOX_CACHE_LINE - 1) /
							   PBOX_CACHE_LINE * PBOX_CACHE_LINE);
		if (a == NULL) {
			return -ENOMEM;
		}
		memset(a, 0, sizeof(*a));
		a->wake_fd = -1;
		a->fd = -1;
		a->idx = k;
		a->core = c;
		a->queue = ac->nqueues != 0 ? ac->queues[k] : k;
		x->cores[k] = a;
		c->xport_core = a;
		if (nrxq != 0 && a->queue >= nrxq) {
			PBOX_LOG_ERR(TRANSPORT,
				     "core %u: %s has %u RX queue%s, no queue %u (one queue per "
				     "core; a veth gets more with numrxqueues, a NIC with ethtool "
				     "-L)",
				     k, ac->interface, nrxq, nrxq == 1 ? "" : "s", a->queue);
			return -ENXIO;
		}
		a->loop = (struct pbox_loop){
			.ops = &afx_loop_ops,
			.xc = a,
			.engine = &c->engine,
			.tab = &dp->tab,
			.busy_poll = cfg->busy_poll,
			.idle_tsc = (uint64_t)cfg->idle_us * (dp->tsc_hz / 1000000),
			.wait_ms = 100,
		};
		rc = core_open(a, cfg, ac->interface, &me);
		if (rc != 0) {
			return rc;
		}
		c->engine.tx = &afx_tx_ops;
		c->engine.tx_ctx = a;
	}
	for (uint32_t k = 0; k < cfg->ncores; k++) {
		struct afx_core *a = x->cores[k];
		char name[16];

		rc = pthread_create(&a->thread, NULL, afx_core_main, a);
		if (rc != 0) {
			PBOX_LOG_ERR(TRANSPORT, "core %u: cannot start its thread: %s", k,
				     strerror(rc));
			return -rc;
		}
		a->started = true;
		if (a->core->cpu >= 0) {
			cpu_set_t set;

			CPU_ZERO(&set);
			CPU_SET(a->core->cpu, &set);
			rc = pthread_setaffinity_np(a->thread, sizeof(set), &set);
			if (rc != 0) {
				PBOX_LOG_ERR(TRANSPORT, "core %u: cannot pin to CPU %d: %s", k,
					     a->core->cpu, strerror(rc));
				return -rc;
			}
		}
		snprintf(name, sizeof(name), "pbox-core%u", k);
		pthread_setname_np(a->thread, name);
	}
	PBOX_LOG_INFO(TRANSPORT, "%u data-plane core%s on afxdp %s (%s:%u-%u), kernels %s, %s; %s",
		      cfg->ncores, cfg->ncores == 1 ? "" : "s", ac->interface, cfg->data_addr,
		      cfg->base_port, cfg->base_port + cfg->ncores - 1, pbox_kernels_get()->isa,
		      cfg->busy_poll ? "spinning when idle" : "blocking in poll() when idle",
		      cfg->ncores == 1 ? "no steering needed"
				       : "the device must steer port base_port + k to core k's "
					 "queue (see afxdp.queues)");
	return 0;
}

static int afx_xdp_attach(struct pboxd_dp *dp, struct pbox_xdp *prog)
{
	struct afx *x = dp->xport;

	if (prog == NULL) {
		PBOX_LOG_ERR(TRANSPORT, "afxdp: %s has no XDP filter to steer to the sockets",
			     x->ifname);
		return -ENOTSUP;
	}
	for (uint32_t k = 0; k < x->ncores; k++) {
		struct afx_core *a = x->cores[k];
		int rc = pbox_xdp_xsk_set(prog, k, a->queue, a->fd);

		if (rc != 0) {
			PBOX_LOG_ERR(TRANSPORT,
				     "core %u: cannot register its AF_XDP socket (queue %u) in the "
				     "XDP filter: %s",
				     k, a->queue, strerror(-rc));
			return rc;
		}
	}
	x->registered = true;
	PBOX_LOG_INFO(TRANSPORT, "afxdp: the XDP filter on %s steers to %u AF_XDP socket%s",
		      x->ifname, x->ncores, x->ncores == 1 ? "" : "s");
	return 0;
}

/* ---- counters (control thread) ------------------------------------------------------- */

static void sum_stats(const struct afx *x, uint32_t core, struct afx_stats *out)
{
	memset(out, 0, sizeof(*out));
	for (uint32_t k = 0; k < x->ncores; k++) {
		const struct afx_core *a = x->cores[k];
		const uint64_t *src;
		uint64_t *dst = (uint64_t *)out;

		if ((core != x->ncores && k != core) || a == NULL) {
			continue;
		}
		src = (const uint64_t *)&a->st;
		for (size_t i = 0; i < sizeof(*out) / sizeof(uint64_t); i++) {
			dst[i] += pbox_stat_read(&src[i]);
		}
	}
}

/* The kernel's counters of a socket (XDP_STATISTICS); zeros if unavailable. */
static void kernel_stats(const struct afx_core *a, struct xdp_statistics *ks)
{
	socklen_t len = sizeof(*ks);

	memset(ks, 0, sizeof(*ks));
	if (a == NULL || a->fd < 0 || getsockopt(a->fd, SOL_XDP, XDP_STATISTICS, ks, &len) != 0) {
		memset(ks, 0, sizeof(*ks));
	}
}

static void afx_transport_stats(const struct pboxd_dp *dp, uint32_t core, uint64_t *tx_dropped,
				uint64_t *rx_truncated)
{
	const struct afx *x = dp->xport;
	struct afx_stats s;

	*tx_dropped = *rx_truncated = 0;
	if (x == NULL || core >= x->ncores) {
		return;
	}
	sum_stats(x, core, &s);
	*tx_dropped = s.tx_no_frame + s.tx_ring_full + s.tx_too_big;
	*rx_truncated = s.rx_verdict[PBOX_AFX_TRUNCATED];
}

static json_t *stats_obj(const struct afx_stats *s, const struct xdp_statistics *ks)
{
	json_t *o = json_pack(
		"{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
		"rx_frames", (json_int_t)s->rx_frames, "rx_pkts", (json_int_t)s->rx_pkts,
		"rx_bytes", (json_int_t)s->rx_bytes, "rx_too_many_segs",
		(json_int_t)s->rx_too_many_segs, "rx_wakeups", (json_int_t)s->rx_wakeups,
		"fill_short", (json_int_t)s->fill_short, "tx_pkts", (json_int_t)s->tx_pkts,
		"tx_frames", (json_int_t)s->tx_frames, "tx_bytes", (json_int_t)s->tx_bytes,
		"tx_no_frame", (json_int_t)s->tx_no_frame, "tx_ring_full",
		(json_int_t)s->tx_ring_full, "tx_too_big", (json_int_t)s->tx_too_big, "tx_kicks",
		(json_int_t)s->tx_kicks, "completions", (json_int_t)s->completions);
	json_t *drops = json_object();

	for (int v = 1; v < PBOX_AFX_VERDICTS; v++) {
		json_object_set_new(drops, pbox_afx_verdict_name((enum pbox_afx_verdict)v),
				    json_integer((json_int_t)s->rx_verdict[v]));
	}
	json_object_set_new(o, "rx_dropped", drops);
	json_object_set_new(o, "tx_kick_errors", json_integer((json_int_t)s->tx_kick_errors));
	json_object_set_new(o, "kernel",
			    json_pack("{s:I, s:I, s:I, s:I, s:I, s:I}", "rx_dropped",
				      (json_int_t)ks->rx_dropped, "rx_invalid_descs",
				      (json_int_t)ks->rx_invalid_descs, "tx_invalid_descs",
				      (json_int_t)ks->tx_invalid_descs, "rx_ring_full",
				      (json_int_t)ks->rx_ring_full, "rx_fill_ring_empty_descs",
				      (json_int_t)ks->rx_fill_ring_empty_descs,
				      "tx_ring_empty_descs", (json_int_t)ks->tx_ring_empty_descs));
	return o;
}

static void kernel_sum(const struct afx *x, struct xdp_statistics *sum)
{
	memset(sum, 0, sizeof(*sum));
	for (uint32_t k = 0; k < x->ncores; k++) {
		struct xdp_statistics ks;

		kernel_stats(x->cores[k], &ks);
		sum->rx_dropped += ks.rx_dropped;
		sum->rx_invalid_descs += ks.rx_invalid_descs;
		sum->tx_invalid_descs += ks.tx_invalid_descs;
		sum->rx_ring_full += ks.rx_ring_full;
		sum->rx_fill_ring_empty_descs += ks.rx_fill_ring_empty_descs;
		sum->tx_ring_empty_descs += ks.tx_ring_empty_descs;
	}
}

static json_t *afx_stats_json(const struct pboxd_dp *dp)
{
	const struct afx *x = dp->xport;
	json_t *cores = json_array(), *o;
	struct xdp_statistics ks;
	struct afx_stats s;
	uint32_t nzc = 0;

	if (x == NULL) {
		json_decref(cores);
		return NULL;
	}
	for (uint32_t k = 0; k < x->ncores; k++) {
		const struct afx_core *a = x->cores[k];
		json_t *c;

		sum_stats(x, k, &s);
		kernel_stats(a, &ks);
		c = stats_obj(&s, &ks);
		json_object_set_new(c, "queue", json_integer(a ? a->queue : 0));
		json_object_set_new(c, "zero_copy", json_boolean(a && a->zc));
		json_object_set_new(c, "busy_poll", json_boolean(a && a->busy_poll));
		json_array_append_new(cores, c);
		nzc += a && a->zc;
	}
	sum_stats(x, x->ncores, &s);
	kernel_sum(x, &ks);
	o = json_pack("{s:s, s:s, s:s, s:b, s:o, s:o}", "name", "afxdp", "interface", x->ifname,
		      "mode",
		      nzc == x->ncores ? "zero-copy"
		      : nzc == 0       ? "copy"
				       : "mixed",
		      "registered", x->registered, "cores", cores, "totals", stats_obj(&s, &ks));
	return o;
}

static void afx_stats_print(FILE *f, const struct pboxd_dp *dp)
{
	const struct afx *x = dp->xport;
	struct xdp_statistics ks;
	struct afx_stats s;
	uint64_t bad = 0;

	if (x == NULL) {
		return;
	}
	sum_stats(x, x->ncores, &s);
	kernel_sum(x, &ks);
	for (int v = 1; v < PBOX_AFX_VERDICTS; v++) {
		bad += s.rx_verdict[v];
	}
	fprintf(f,
		"afxdp %s (%s): rx %" PRIu64 " datagrams in %" PRIu64 " frames, %" PRIu64
		" not handed on (checksum, not ours, ...), %" PRIu64 " wake-ups; tx %" PRIu64
		" datagrams in %" PRIu64 " frames, %" PRIu64 " dropped (no frame %" PRIu64
		", ring full %" PRIu64 "), %" PRIu64 " kicks; kernel: fill ring empty %llu, rx "
		"ring full %llu, rx dropped %llu\n",
		x->ifname, x->cores[0] && x->cores[0]->zc ? "zero-copy" : "copy", s.rx_pkts,
		s.rx_frames, bad, s.rx_wakeups, s.tx_pkts, s.tx_frames,
		s.tx_no_frame + s.tx_ring_full + s.tx_too_big, s.tx_no_frame, s.tx_ring_full,
		s.tx_kicks, (unsigned long long)ks.rx_fill_ring_empty_descs,
		(unsigned long long)ks.rx_ring_full, (unsigned long long)ks.rx_dropped);
	fflush(f);
}

const struct pboxd_transport_ops pboxd_afxdp_transport = {
	.name = "afxdp",
	.start = afx_start,
	.stop = afx_stop,
	.xdp_attach = afx_xdp_attach,
	.transport_stats = afx_transport_stats,
	.stats_json = afx_stats_json,
	.stats_print = afx_stats_print,
};
