/* SPDX-License-Identifier: BSD-3-Clause */
/* Kernel-UDP transport with recvmmsg / sendmmsg bursts (see udp.h). */
#include "udp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/net_tstamp.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/compiler.h"
#include "common/log.h"

/* A queued datagram: its header (copied) and where it goes; its two iovecs (header,
 * payload) are tx_iov[2i], tx_iov[2i + 1], contiguous across entries so a GSO message
 * can take a run of them. */
struct tx_entry {
	struct pbox_wire_hdr hdr;
	uint32_t ip; /* network order */
	uint16_t port;
	uint32_t len; /* header + payload */
	/* Its departure time once a message carrying it was stamped (kernel pacing), 0
	 * before: a message built again after EAGAIN, a partial sendmmsg or the GSO
	 * fallback keeps the times its datagrams got, instead of advancing the timeline a
	 * second time for the same bytes. */
	uint64_t when;
};

/* Per outgoing message: its address and room for the UDP_SEGMENT and SCM_TXTIME control
 * messages. */
struct tx_msg {
	struct sockaddr_in to;
	uint32_t first, count; /* tx entries it carries */
	union {
		char buf[CMSG_SPACE(sizeof(uint16_t)) + CMSG_SPACE(sizeof(uint64_t))];
		struct cmsghdr align;
	} ctl;
};

/* Per receive slot: the sender and room for the UDP_GRO control message. */
struct rx_slot {
	struct sockaddr_in from;
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
};

/* A datagram held back by reorder injection; owns a copy of its payload. */
struct held {
	bool valid;
	unsigned age; /* flushes since it was held */
	struct pbox_peer to;
	struct pbox_wire_hdr hdr;
	uint32_t len;
	uint8_t payload[PBOX_WIRE_MAX_PAYLOAD];
};

struct pbox_udp {
	int fd;
	unsigned burst;
	uint16_t port;
	bool gso, gro;
	int rcvbuf, sndbuf;
	int rcvtimeo_ms; /* SO_RCVTIMEO last set (0: none) */
	struct pbox_udp_stats stats;
	struct pbox_fault fault;
	bool faulty;
	/* receive: burst slots of rx_buf_len bytes */
	uint32_t rx_buf_len;
	struct mmsghdr *rx_msgs;
	struct iovec *rx_iov;
	struct rx_slot *rx_slot;
	uint8_t *rx_buf;
	/* placement (pbox_udp_rx_placed): 3 iovecs per slot, and the place each slot's
	 * payload is in (-1: none, the datagram is whole in the slot's buffer) */
	struct iovec *rx_piov;
	int16_t *rx_pidx;
	/* messages of the last recvmmsg not yet handed out: slot rx_next at byte rx_off */
	unsigned rx_nmsgs, rx_next;
	uint32_t rx_off;
	bool rx_full; /* the last recvmmsg filled every slot it offered: more may be queued */
	/* send */
	unsigned ntx, tx_cap;
	uint64_t tx_queued_bytes; /* bytes in tx[0..ntx) */
	uint64_t tx_refs;         /* payload datagrams queued so far */
	struct tx_entry *tx;
	struct iovec *tx_iov; /* 2 per entry */
	struct mmsghdr *tx_msgs;
	struct tx_msg *tx_msg;
	struct held *held;
	bool emsgsize_logged;
	/* kernel pacing (kpace.h): departure times on every message while kpace */
	bool kpace;
	int kpace_egress; /* pbox_kpace_egress() at open: 1 fq there, 0 not, < 0 unknown */
	char kpace_why[192];
	struct pbox_kpace kp;
};

int pbox_peer_from_str(struct pbox_peer *p, const char *host, uint16_t port)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_DGRAM }, *res;

	memset(p, 0, sizeof(*p));
	if (host == NULL || *host == '\0') {
		host = "0.0.0.0";
	}
	if (getaddrinfo(host, NULL, &hints, &res) != 0) {
		return -EINVAL;
	}
	p->ip = ((struct sockaddr_in *)res->ai_addr)->sin_addr.s_addr;
	p->port = htons(port);
	freeaddrinfo(res);
	return 0;
}

const char *pbox_peer_str(const struct pbox_peer *p, char *buf, unsigned len)
{
	char ip[INET_ADDRSTRLEN];

	inet_ntop(AF_INET, &p->ip, ip, sizeof(ip));
	snprintf(buf, len, "%s:%u", ip, ntohs(p->port));
	return buf;
}

/* Below this much payload room per socket a burst of one window from a few workers can
 * overflow: say so (less than asked, but at least this, is only a debug message). */
#define PBOX_UDP_LOW_SOCK_BUF (8 << 20)

/* Ask for `bytes` of socket buffer: SO_*BUFFORCE (root / CAP_NET_ADMIN) overrides
 * net.core.{r,w}mem_max; otherwise the plain option, which the kernel caps there. Returns
 * the effective size as getsockopt reports it (twice the payload room). */
static int set_buf(int fd, int opt, int force_opt, int bytes)
{
	int got = 0;
	socklen_t l = sizeof(got);

	if (setsockopt(fd, SOL_SOCKET, force_opt, &bytes, sizeof(bytes)) != 0) {
		setsockopt(fd, SOL_SOCKET, opt, &bytes, sizeof(bytes));
	}
	getsockopt(fd, SOL_SOCKET, opt, &got, &l);
	return got;
}

/* Turn on what the kernel offers: UDP_SEGMENT is probed by setting the socket's default
 * segment size to 0 (no segmentation unless a message asks for it), UDP_GRO by enabling
 * it. Either missing (ENOPROTOOPT before Linux 4.18 / 5.0) leaves it off. */
static bool env_off(const char *name)
{
	const char *v = getenv(name);

	return v != NULL && strcmp(v, "0") == 0;
}

static void probe_offloads(struct pbox_udp *u, const struct pbox_udp_cfg *cfg)
{
	int zero = 0, one = 1;
	bool no_gso = cfg->no_gso || env_off("PBOX_UDP_GSO");
	bool no_gro = cfg->no_gro || env_off("PBOX_UDP_GRO");

	u->gso = !no_gso && setsockopt(u->fd, SOL_UDP, UDP_SEGMENT, &zero, sizeof(zero)) == 0;
	u->gro = !no_gro && setsockopt(u->fd, SOL_UDP, UDP_GRO, &one, sizeof(one)) == 0;
}

/* Kernel pacing (kpace.h) if cfg->kpace: SO_TXTIME with CLOCK_MONOTONIC (what fq compares
 * departure times with), then a look at the egress qdiscs so the log says whether the
 * kernel will honour the times. */
static void setup_kpace(struct pbox_udp *u, const struct pbox_udp_cfg *cfg, uint32_t local_ip)
{
	struct sock_txtime st = { .clockid = CLOCK_MONOTONIC, .flags = 0 };

	if (!cfg->kpace) {
		return;
	}
	if (setsockopt(u->fd, SOL_SOCKET, SO_TXTIME, &st, sizeof(st)) != 0) {
		PBOX_LOG_WARN(TRANSPORT, "udp: kernel pacing off: SO_TXTIME: %s", strerror(errno));
		return;
	}
	if (pbox_kpace_init(&u->kp, cfg->kpace_per_dst, cfg->kpace_rate_Bps, cfg->kpace_lead_ns) !=
	    0) {
		PBOX_LOG_WARN(TRANSPORT, "udp: kernel pacing off: out of memory");
		return;
	}
	u->kpace = true;
	if (local_ip == 0 && cfg->kpace_peer != NULL) {
		struct pbox_peer p;

		if (pbox_peer_from_str(&p, cfg->kpace_peer, 0) == 0) {
			pbox_kpace_route_src(p.ip, &local_ip);
		}
	}
	u->kpace_egress = pbox_kpace_egress(local_ip, u->kpace_why, sizeof(u->kpace_why));
}

struct pbox_udp *pbox_udp_open(const struct pbox_udp_cfg *cfg)
{
	struct pbox_udp *u = calloc(1, sizeof(*u));
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t sl = sizeof(sa);
	struct pbox_peer local;
	int pmtu = IP_PMTUDISC_DO;
	int bufsz = cfg->sock_buf > 0 ? cfg->sock_buf : PBOX_UDP_DEFAULT_SOCK_BUF;

	if (u == NULL) {
		PBOX_LOG_ERR(TRANSPORT, "udp: out of memory");
		return NULL;
	}
	u->fd = -1;
	u->burst = cfg->burst ? PBOX_MIN(cfg->burst, PBOX_UDP_MAX_BURST) : PBOX_UDP_DEFAULT_BURST;
	if (pbox_peer_from_str(&local, cfg->addr, cfg->port) != 0) {
		PBOX_LOG_ERR(TRANSPORT, "udp: cannot resolve local address '%s'", cfg->addr);
		goto fail;
	}
	/* Blocking socket, MSG_DONTWAIT on every call but pbox_udp_rx_wait's: that one blocks
	 * for its first datagram inside recvmmsg, with no poll before it. */
	u->fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (u->fd < 0) {
		PBOX_LOG_ERR(TRANSPORT, "udp: socket: %s", strerror(errno));
		goto fail;
	}
	probe_offloads(u, cfg);
	/* With GRO a buffer takes a coalesced run of datagrams, up to one IP packet. */
	u->rx_buf_len = u->gro ? PBOX_ALIGN_UP(PBOX_UDP_MAX_MSG, PBOX_CACHE_LINE)
			       : PBOX_ALIGN_UP(PBOX_UDP_MAX_DGRAM, PBOX_CACHE_LINE);
	/* The send queue holds up to burst 64-KB datagrams' worth of bytes, and with GSO
	 * enough small datagrams to fill a burst of 64-KB messages. */
	u->tx_cap = u->gso ? PBOX_UDP_MAX_BURST : u->burst;
	u->rx_msgs = calloc(u->burst, sizeof(*u->rx_msgs));
	u->rx_iov = calloc(u->burst, sizeof(*u->rx_iov));
	u->rx_slot = calloc(u->burst, sizeof(*u->rx_slot));
	u->rx_buf = aligned_alloc(PBOX_CACHE_LINE, (size_t)u->burst * u->rx_buf_len);
	u->rx_piov = calloc((size_t)u->burst * 3, sizeof(*u->rx_piov));
	u->rx_pidx = calloc(u->burst, sizeof(*u->rx_pidx));
	u->tx = calloc(u->tx_cap, sizeof(*u->tx));
	u->tx_iov = calloc((size_t)u->tx_cap * 2, sizeof(*u->tx_iov));
	u->tx_msgs = calloc(u->tx_cap, sizeof(*u->tx_msgs));
	u->tx_msg = calloc(u->tx_cap, sizeof(*u->tx_msg));
	if (u->rx_msgs == NULL || u->rx_iov == NULL || u->rx_slot == NULL || u->rx_buf == NULL ||
	    u->rx_piov == NULL || u->rx_pidx == NULL || u->tx == NULL || u->tx_iov == NULL ||
	    u->tx_msgs == NULL || u->tx_msg == NULL) {
		PBOX_LOG_ERR(TRANSPORT, "udp: out of memory for %u-datagram bursts", u->burst);
		goto fail;
	}
	for (unsigned i = 0; i < u->burst; i++) {
		u->rx_iov[i].iov_base = u->rx_buf + (size_t)i * u->rx_buf_len;
		u->rx_iov[i].iov_len = u->rx_buf_len;
		u->rx_pidx[i] = -1;
	}
	pbox_fault_init(&u->fault, &cfg->fault);
	u->faulty = pbox_fault_enabled(&u->fault);
	if (u->faulty) {
		u->held = calloc(1, sizeof(*u->held));
		if (u->held == NULL) {
			goto fail;
		}
	}
	/* No SO_REUSEADDR: on a UDP socket it lets another socket with the option bind the
	 * same port (an ephemeral bind may even pick it), and the newer socket then gets
	 * every datagram sent to it, so a worker or a core silently stops hearing. */
	setsockopt(u->fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof(pmtu));
	u->rcvbuf = set_buf(u->fd, SO_RCVBUF, SO_RCVBUFFORCE, bufsz);
	u->sndbuf = set_buf(u->fd, SO_SNDBUF, SO_SNDBUFFORCE, bufsz);
	if (PBOX_MIN(u->rcvbuf, u->sndbuf) / 2 < PBOX_MIN(bufsz, PBOX_UDP_LOW_SOCK_BUF)) {
		PBOX_LOG_INFO(TRANSPORT,
			      "udp: socket buffers are %d / %d bytes (receive / send; asked %d): "
			      "raise net.core.rmem_max / wmem_max or run as root for fewer drops "
			      "under bursts",
			      u->rcvbuf / 2, u->sndbuf / 2, bufsz);
	} else if (PBOX_MIN(u->rcvbuf, u->sndbuf) / 2 < bufsz) {
		PBOX_LOG_DEBUG(TRANSPORT, "udp: socket buffers are %d / %d bytes (asked %d)",
			       u->rcvbuf / 2, u->sndbuf / 2, bufsz);
	}
	sa.sin_addr.s_addr = local.ip;
	sa.sin_port = local.port;
	if (bind(u->fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		char b[64];

		PBOX_LOG_ERR(TRANSPORT, "udp: cannot bind %s: %s",
			     pbox_peer_str(&local, b, sizeof(b)), strerror(errno));
		goto fail;
	}
	getsockname(u->fd, (struct sockaddr *)&sa, &sl);
	u->port = ntohs(sa.sin_port);
	setup_kpace(u, cfg, local.ip);
	return u;
fail:
	pbox_udp_close(u);
	return NULL;
}

void pbox_udp_close(struct pbox_udp *u)
{
	if (u == NULL) {
		return;
	}
	if (u->fd >= 0) {
		close(u->fd);
	}
	free(u->rx_msgs);
	free(u->rx_iov);
	free(u->rx_slot);
	free(u->rx_buf);
	free(u->rx_piov);
	free(u->rx_pidx);
	free(u->tx);
	free(u->tx_iov);
	free(u->tx_msgs);
	free(u->tx_msg);
	free(u->held);
	pbox_kpace_fini(&u->kp);
	free(u);
}

int pbox_udp_fd(const struct pbox_udp *u)
{
	return u->fd;
}

uint16_t pbox_udp_port(const struct pbox_udp *u)
{
	return u->port;
}

const struct pbox_udp_stats *pbox_udp_stats(const struct pbox_udp *u)
{
	return &u->stats;
}

void pbox_udp_info(const struct pbox_udp *u, struct pbox_udp_info *out)
{
	out->rcvbuf = u->rcvbuf;
	out->sndbuf = u->sndbuf;
	out->gso = __atomic_load_n(&u->gso, __ATOMIC_RELAXED);
	out->gro = u->gro;
	out->kpace = u->kpace;
	out->kpace_egress = u->kpace ? u->kpace_egress : 0;
	{
		struct sock_txtime st;
		socklen_t l = sizeof(st);

		out->txtime_clockid = getsockopt(u->fd, SOL_SOCKET, SO_TXTIME, &st, &l) == 0
					      ? (int)st.clockid
					      : -1;
	}
}

const char *pbox_udp_info_str(const struct pbox_udp *u, char *buf, unsigned len)
{
	struct pbox_udp_info i;

	pbox_udp_info(u, &i);
	if (!u->kpace) {
		snprintf(
			buf, len, "rcvbuf %d KiB, sndbuf %d KiB, gso %s, gro %s, kernel pacing off",
			i.rcvbuf >> 10, i.sndbuf >> 10, i.gso ? "on" : "off", i.gro ? "on" : "off");
		return buf;
	}
	snprintf(buf, len,
		 "rcvbuf %d KiB, sndbuf %d KiB, gso %s, gro %s, kernel pacing %s (SO_TXTIME "
		 "departure times per %s%s; %s)",
		 i.rcvbuf >> 10, i.sndbuf >> 10, i.gso ? "on" : "off", i.gro ? "on" : "off",
		 u->kpace_egress > 0    ? "ACTIVE"
		 : u->kpace_egress == 0 ? "INACTIVE"
					: "UNKNOWN",
		 u->kp.per_dst ? "destination" : "socket",
		 u->kpace_egress > 0    ? ""
		 : u->kpace_egress == 0 ? ", ignored without fq"
					: ", egress not checked",
		 u->kpace_why);
	return buf;
}

void pbox_udp_set_pace_rate(struct pbox_udp *u, uint64_t rate_Bps)
{
	if (u->kpace) {
		pbox_kpace_set_rate(&u->kp, rate_Bps);
	}
}

bool pbox_udp_kpace(const struct pbox_udp *u)
{
	return u->kpace;
}

const struct pbox_kpace_stats *pbox_udp_kpace_stats(const struct pbox_udp *u)
{
	return &u->kp.stats;
}

const struct pbox_fault *pbox_udp_fault(const struct pbox_udp *u)
{
	return &u->fault;
}

/* The GRO segment size of slot i's message, or 0 if it holds one datagram. */
static uint32_t gro_size(struct pbox_udp *u, unsigned i)
{
	struct msghdr *h = &u->rx_msgs[i].msg_hdr;

	for (struct cmsghdr *cm = CMSG_FIRSTHDR(h); cm != NULL; cm = CMSG_NXTHDR(h, cm)) {
		if (cm->cmsg_level == SOL_UDP && cm->cmsg_type == UDP_GRO) {
			int sz;

			memcpy(&sz, CMSG_DATA(cm), sizeof(sz));
			return sz > 0 ? (uint32_t)sz : 0;
		}
	}
	return 0;
}

/* Hand out datagrams of the messages received and not yet handed out, up to max. A
 * message is cut at its GRO segment size (the last piece may be shorter); a message
 * without one is one datagram (an empty datagram too: validation drops it). */
static unsigned deliver(struct pbox_udp *u, struct pbox_rx_pkt *pkts, unsigned max, int16_t *placed)
{
	unsigned n = 0;

	while (n < max && u->rx_next < u->rx_nmsgs) {
		unsigned i = u->rx_next;
		const struct mmsghdr *m = &u->rx_msgs[i];
		uint32_t total = m->msg_len, seg = gro_size(u, i);

		if (seg == 0 || seg >= total) {
			seg = PBOX_MAX(total, 1u);
		}
		if (u->rx_off == 0) {
			if (m->msg_hdr.msg_flags & MSG_TRUNC) {
				/* Larger than any pbox datagram (or, coalesced, than the buffer):
				 * validation drops the cut piece on length. */
				u->stats.rx_truncated++;
			}
			u->stats.rx_gro_msgs += seg < total;
		}
		do {
			struct pbox_rx_pkt *p = &pkts[n++];
			uint32_t len = PBOX_MIN(seg, total - u->rx_off);

			p->data = (const uint8_t *)u->rx_iov[i].iov_base + u->rx_off;
			p->len = len;
			memset(&p->from, 0, sizeof(p->from));
			p->from.ip = u->rx_slot[i].from.sin_addr.s_addr;
			p->from.port = u->rx_slot[i].from.sin_port;
			if (placed != NULL) {
				placed[n - 1] = u->rx_pidx[i];
				u->stats.rx_placed += u->rx_pidx[i] >= 0;
			}
			u->stats.rx_bytes += len;
			u->rx_off += len;
		} while (n < max && u->rx_off < total);
		if (u->rx_off >= total) {
			u->rx_next++;
			u->rx_off = 0;
		}
	}
	u->stats.rx_pkts += n;
	return n;
}

/* Whether a place can take a slot's payload: it fits the slot's buffer's layout, and GRO
 * cannot coalesce two datagrams of its size into one message (udp.h). */
static bool placeable(const struct pbox_udp *u, const struct pbox_udp_place *pl)
{
	uint32_t dg = PBOX_WIRE_HDR_LEN + pl->len;

	return pl->dst != NULL && pl->len > 0 && dg <= u->rx_buf_len &&
	       (!u->gro || 2 * dg > PBOX_UDP_MAX_MSG);
}

/* Slot i's message went (partly) to a place it is not returned in: copy what the place
 * got back behind the header, where the slot's buffer left room for it, so the datagram
 * is whole there. */
static void unplace(struct pbox_udp *u, unsigned i)
{
	const struct iovec *v = &u->rx_piov[3 * i];
	uint32_t total = u->rx_msgs[i].msg_len;

	if (total > PBOX_WIRE_HDR_LEN) {
		memcpy((uint8_t *)v[0].iov_base + PBOX_WIRE_HDR_LEN, v[1].iov_base,
		       PBOX_MIN(total - PBOX_WIRE_HDR_LEN, (uint32_t)v[1].iov_len));
	}
	u->rx_pidx[i] = -1;
	u->stats.rx_unplaced++;
}

/* One recvmmsg into every slot (at most `want`), then hand out up to max. With places
 * (pbox_udp_rx_placed), slot i < nplace receives its payload into place[i]. */
static unsigned receive(struct pbox_udp *u, struct pbox_rx_pkt *pkts, unsigned max, int flags,
			const struct pbox_udp_place *place, unsigned nplace, int16_t *placed)
{
	unsigned want = PBOX_MIN(max, u->burst);
	int n;

	for (unsigned i = 0; i < want; i++) {
		struct msghdr *h = &u->rx_msgs[i].msg_hdr;

		h->msg_name = &u->rx_slot[i].from;
		h->msg_namelen = sizeof(u->rx_slot[i].from);
		h->msg_iov = &u->rx_iov[i];
		h->msg_iovlen = 1;
		u->rx_pidx[i] = -1;
		if (i < nplace && placeable(u, &place[i])) {
			struct iovec *v = &u->rx_piov[3 * i];
			uint8_t *b = u->rx_iov[i].iov_base;

			v[0].iov_base = b;
			v[0].iov_len = PBOX_WIRE_HDR_LEN;
			v[1].iov_base = place[i].dst;
			v[1].iov_len = place[i].len;
			v[2].iov_base = b + PBOX_WIRE_HDR_LEN + place[i].len;
			v[2].iov_len = u->rx_buf_len - PBOX_WIRE_HDR_LEN - place[i].len;
			h->msg_iov = v;
			h->msg_iovlen = 3;
			u->rx_pidx[i] = (int16_t)i;
		}
		h->msg_control = u->gro ? u->rx_slot[i].ctl.buf : NULL;
		h->msg_controllen = u->gro ? sizeof(u->rx_slot[i].ctl.buf) : 0;
		h->msg_flags = 0;
	}
	u->stats.rx_calls++;
	n = recvmmsg(u->fd, u->rx_msgs, want, flags, NULL);
	u->rx_full = n == (int)want;
	/* A blocking receive woken by shutdown() "receives" an empty message without a
	 * sender; every real UDP datagram has one. */
	for (int i = 0; i < n; i++) {
		if (u->rx_msgs[i].msg_hdr.msg_namelen == 0) {
			n = i;
			break;
		}
	}
	if (n <= 0) {
		u->stats.rx_empty++;
		return 0;
	}
	/* A placed message stays placed only if it is one datagram that filled its place
	 * exactly (header + place.len bytes, nothing in the tail). */
	for (int i = 0; i < n; i++) {
		const struct mmsghdr *m = &u->rx_msgs[i];
		uint32_t seg;

		if (u->rx_pidx[i] < 0) {
			continue;
		}
		seg = gro_size(u, (unsigned)i);
		if ((m->msg_hdr.msg_flags & MSG_TRUNC) || (seg != 0 && seg < m->msg_len) ||
		    m->msg_len != PBOX_WIRE_HDR_LEN + u->rx_piov[3 * i + 1].iov_len) {
			unplace(u, (unsigned)i);
		}
	}
	u->stats.rx_msgs += (unsigned)n;
	u->rx_nmsgs = (unsigned)n;
	u->rx_next = 0;
	u->rx_off = 0;
	n = (int)deliver(u, pkts, max, placed);
	/* Messages left for the next call are never returned placed: by then the caller
	 * may have filled their places with other datagrams. */
	for (unsigned i = u->rx_next; i < u->rx_nmsgs; i++) {
		if (u->rx_pidx[i] >= 0) {
			unplace(u, i);
		}
	}
	return (unsigned)n;
}

unsigned pbox_udp_rx_burst(struct pbox_udp *u, struct pbox_rx_pkt *pkts, unsigned max)
{
	if (max == 0) {
		return 0;
	}
	/* Datagrams left from the last call first: their buffers are still in use. */
	if (u->rx_next < u->rx_nmsgs) {
		return deliver(u, pkts, max, NULL);
	}
	return receive(u, pkts, max, MSG_DONTWAIT, NULL, 0, NULL);
}

unsigned pbox_udp_rx_wait(struct pbox_udp *u, struct pbox_rx_pkt *pkts, unsigned max,
			  int timeout_ms)
{
	if (max == 0) {
		return 0;
	}
	if (u->rx_next < u->rx_nmsgs) {
		return deliver(u, pkts, max, NULL);
	}
	if (timeout_ms != u->rcvtimeo_ms) {
		struct timeval tv = { .tv_sec = timeout_ms / 1000,
				      .tv_usec = (timeout_ms % 1000) * 1000 };

		if (setsockopt(u->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0) {
			return pbox_udp_rx_burst(u, pkts, max);
		}
		u->rcvtimeo_ms = timeout_ms;
	}
	/* Blocks (up to SO_RCVTIMEO) for the first message, then takes what is queued. */
	return receive(u, pkts, max, MSG_WAITFORONE, NULL, 0, NULL);
}

unsigned pbox_udp_rx_placed(struct pbox_udp *u, struct pbox_rx_pkt *pkts, unsigned max,
			    const struct pbox_udp_place *place, unsigned nplace, int16_t *placed,
			    int timeout_ms)
{
	int flags = MSG_DONTWAIT;

	if (max == 0) {
		return 0;
	}
	if (u->rx_next < u->rx_nmsgs) {
		unsigned n = deliver(u, pkts, max, placed);

		return n; /* leftovers are never placed (receive) */
	}
	if (timeout_ms > 0) {
		if (timeout_ms != u->rcvtimeo_ms) {
			struct timeval tv = { .tv_sec = timeout_ms / 1000,
					      .tv_usec = (timeout_ms % 1000) * 1000 };

			if (setsockopt(u->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0) {
				u->rcvtimeo_ms = timeout_ms;
			}
		}
		if (u->rcvtimeo_ms == timeout_ms) {
			flags = MSG_WAITFORONE;
		}
	}
	return receive(u, pkts, max, flags, place, PBOX_MIN(nplace, u->burst), placed);
}

bool pbox_udp_rx_more(const struct pbox_udp *u)
{
	return u->rx_next < u->rx_nmsgs || u->rx_full;
}

void pbox_udp_wake(struct pbox_udp *u)
{
	/* On an unconnected socket shutdown() reports ENOTCONN but still marks the receive
	 * side shut and wakes the sleepers; a blocking receive then returns at once. */
	(void)shutdown(u->fd, SHUT_RD);
}

int pbox_udp_wait(struct pbox_udp *u, int timeout_ms, int wake_fd)
{
	struct pollfd p[2] = { { .fd = u->fd, .events = POLLIN },
			       { .fd = wake_fd, .events = POLLIN } };
	int rc;

	if (u->rx_next < u->rx_nmsgs) {
		return 1; /* datagrams of a coalesced message are still to be handed out */
	}
	rc = poll(p, wake_fd >= 0 ? 2 : 1, timeout_ms);
	if (rc < 0) {
		return errno == EINTR ? 0 : -errno;
	}
	return (p[0].revents & POLLIN) ? 1 : 0;
}

static bool same_peer(const struct tx_entry *a, const struct tx_entry *b)
{
	return a->ip == b->ip && a->port == b->port;
}

/* Build messages for tx[first..ntx): with GSO, a run of datagrams to one peer whose sizes
 * equal the first's (the run's last may be shorter) shares a message, within the
 * kernel's bounds; otherwise one datagram per message. Returns the message count. */
static unsigned build_msgs(struct pbox_udp *u, unsigned first)
{
	unsigned nm = 0, i = first;
	bool gso = u->gso;
	uint64_t t = 0;

	if (u->kpace && u->kp.rate_Bps != 0) {
		struct timespec ts;

		clock_gettime(CLOCK_MONOTONIC, &ts);
		t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	}

	while (i < u->ntx) {
		struct tx_msg *tm = &u->tx_msg[nm];
		struct msghdr *h = &u->tx_msgs[nm].msg_hdr;
		const struct tx_entry *e = &u->tx[i];
		uint32_t seg = e->len, total = e->len;
		unsigned j = i + 1;

		if (gso) {
			while (j < u->ntx && j - i < PBOX_UDP_GSO_MAX_SEGS &&
			       same_peer(&u->tx[j], e) && u->tx[j].len <= seg &&
			       total + u->tx[j].len <= PBOX_UDP_MAX_MSG) {
				total += u->tx[j].len;
				if (u->tx[j++].len < seg) {
					break; /* only the last segment may be short */
				}
			}
		}
		tm->to.sin_family = AF_INET;
		tm->to.sin_addr.s_addr = e->ip;
		tm->to.sin_port = e->port;
		tm->first = i;
		tm->count = j - i;
		memset(h, 0, sizeof(*h));
		h->msg_name = &tm->to;
		h->msg_namelen = sizeof(tm->to);
		h->msg_iov = &u->tx_iov[2 * i];
		h->msg_iovlen = 2 * (j - i);
		if (j - i > 1) {
			struct cmsghdr *cm = (struct cmsghdr *)(void *)tm->ctl.buf;
			uint16_t sz = (uint16_t)seg;

			h->msg_control = tm->ctl.buf;
			h->msg_controllen = CMSG_SPACE(sizeof(sz));
			cm->cmsg_level = SOL_UDP;
			cm->cmsg_type = UDP_SEGMENT;
			cm->cmsg_len = CMSG_LEN(sizeof(sz));
			memcpy(CMSG_DATA(cm), &sz, sizeof(sz));
		}
		if (t != 0) {
			/* Its departure time (kpace.h), in wire bytes: each datagram's IP, UDP
			 * and Ethernet headers count against the link as its bytes do. Only
			 * datagrams not stamped before advance the timeline; the message
			 * leaves at the latest time among its datagrams. */
			uint64_t when = 0, fresh = 0;
			struct cmsghdr *cm =
				(struct cmsghdr *)(void *)(tm->ctl.buf + h->msg_controllen);

			for (unsigned k = i; k < j; k++) {
				if (u->tx[k].when == 0) {
					fresh += u->tx[k].len + (uint64_t)PBOX_KPACE_L2_OVERHEAD;
				}
			}
			if (fresh != 0) {
				uint64_t w = pbox_kpace_stamp(&u->kp, e->ip, e->port, fresh, t);

				for (unsigned k = i; k < j; k++) {
					if (u->tx[k].when == 0) {
						u->tx[k].when = w;
					}
				}
			}
			for (unsigned k = i; k < j; k++) {
				when = u->tx[k].when > when ? u->tx[k].when : when;
			}

			h->msg_control = tm->ctl.buf;
			h->msg_controllen += CMSG_SPACE(sizeof(when));
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_TXTIME;
			cm->cmsg_len = CMSG_LEN(sizeof(when));
			memcpy(CMSG_DATA(cm), &when, sizeof(when));
		}
		nm++;
		i = j;
	}
	return nm;
}

/* Errors with which a kernel refuses to segment a message it would send whole. */
static bool gso_refused(int err)
{
	return err == EINVAL || err == EIO || err == EOPNOTSUPP || err == ENOPROTOOPT;
}

/* Send tx[0..ntx) with as few sendmmsg calls as the socket allows. */
static void send_queued(struct pbox_udp *u)
{
	unsigned done = 0, waits = 0;

	while (done < u->ntx) {
		unsigned nm = build_msgs(u, done);
		int n = sendmmsg(u->fd, u->tx_msgs, nm, MSG_DONTWAIT);
		int err = errno;
		const struct tx_msg *bad;

		u->stats.tx_calls++;
		if (n > 0) {
			for (int i = 0; i < n; i++) {
				u->stats.tx_bytes += u->tx_msgs[i].msg_len;
				u->stats.tx_pkts += u->tx_msg[i].count;
				u->stats.tx_gso_msgs += u->tx_msg[i].count > 1;
				done += u->tx_msg[i].count;
			}
			u->stats.tx_msgs += (unsigned)n;
			continue;
		}
		if (err == EINTR) {
			continue;
		}
		if ((err == EAGAIN || err == ENOBUFS) && waits < 100) {
			struct pollfd p = { .fd = u->fd, .events = POLLOUT };

			u->stats.tx_waits++;
			waits++;
			poll(&p, 1, 1);
			continue;
		}
		bad = &u->tx_msg[0];
		if (bad->count > 1 && gso_refused(err)) {
			/* The kernel cannot segment for this socket / route: send the same
			 * datagrams one per message from now on. */
			PBOX_LOG_WARN(TRANSPORT,
				      "udp port %u: the kernel refused UDP GSO (%s); sending one "
				      "datagram per message from now on",
				      u->port, strerror(err));
			__atomic_store_n(&u->gso, false, __ATOMIC_RELAXED);
			continue;
		}
		if (err == EMSGSIZE && !u->emsgsize_logged) {
			PBOX_LOG_ERR(TRANSPORT,
				     "udp: datagram of %u bytes exceeds the path MTU; configure a "
				     "smaller mtu",
				     u->tx[bad->first].len);
			u->emsgsize_logged = true;
		}
		/* This message cannot go; drop its datagrams and carry on with the rest. */
		u->stats.tx_dropped += bad->count;
		done += bad->count;
	}
	u->ntx = 0;
	u->tx_queued_bytes = 0;
}

static void queue(struct pbox_udp *u, const struct pbox_peer *to, const struct pbox_wire_hdr *hdr,
		  const void *payload, uint32_t len)
{
	struct tx_entry *e;
	struct iovec *iov;

	/* A full queue, or a burst of 64-KB datagrams' worth of bytes, goes out first. */
	if (u->ntx == u->tx_cap ||
	    u->tx_queued_bytes + sizeof(*hdr) + len > (uint64_t)u->burst * PBOX_UDP_MAX_MSG) {
		send_queued(u);
	}
	e = &u->tx[u->ntx];
	iov = &u->tx_iov[2 * u->ntx];
	memcpy(&e->hdr, hdr, sizeof(e->hdr));
	e->ip = to->ip;
	e->port = to->port;
	e->len = (uint32_t)sizeof(e->hdr) + len;
	e->when = 0;
	iov[0].iov_base = &e->hdr;
	iov[0].iov_len = sizeof(e->hdr);
	/* An empty second iovec for a header-only datagram keeps every entry at two. */
	iov[1].iov_base = (void *)payload;
	iov[1].iov_len = len;
	u->ntx++;
	u->tx_queued_bytes += e->len;
	u->tx_refs += len != 0;
}
static void release_held(struct pbox_udp *u)
{
	struct held *hd = u->held;

	hd->valid = false;
	queue(u, &hd->to, &hd->hdr, hd->len ? hd->payload : NULL, hd->len);
	/* hd->payload is referenced until the next send_queued(); hold nothing new until
	 * then (see udp_send). */
}

static int udp_send(void *ctx, const struct pbox_peer *to, const struct pbox_wire_hdr *hdr,
		    const void *payload, uint32_t len)
{
	struct pbox_udp *u = ctx;

	if (pbox_likely(!u->faulty)) {
		queue(u, to, hdr, payload, len);
		return 0;
	}
	switch (pbox_fault_next(&u->fault)) {
	case PBOX_FAULT_DROP:
		return 0;
	case PBOX_FAULT_DUP:
		queue(u, to, hdr, payload, len);
		queue(u, to, hdr, payload, len);
		break;
	case PBOX_FAULT_REORDER:
		if (!u->held->valid) {
			/* Make sure the held copy's buffer is no longer queued. */
			send_queued(u);
			u->held->valid = true;
			u->held->age = 0;
			u->held->to = *to;
			u->held->hdr = *hdr;
			u->held->len = len;
			if (len) {
				memcpy(u->held->payload, payload, len);
			}
			return 0;
		}
		queue(u, to, hdr, payload, len);
		break;
	default:
		queue(u, to, hdr, payload, len);
		break;
	}
	/* A held datagram goes out after the one just queued: reordered. */
	if (u->held->valid) {
		release_held(u);
		send_queued(u);
	}
	return 0;
}

static void udp_flush(void *ctx)
{
	struct pbox_udp *u = ctx;

	/* A held datagram waits at most one flush, so nothing is held forever. */
	if (u->faulty && u->held->valid && u->held->age++ >= 1) {
		release_held(u);
	}
	if (u->ntx != 0) {
		send_queued(u);
	}
}

static uint64_t udp_queued(void *ctx)
{
	return ((struct pbox_udp *)ctx)->tx_refs;
}

/* sendmmsg copies payloads into the kernel: after a flush nothing is referenced. A
 * datagram held back by reorder injection owns a copy of its payload. */
static uint64_t udp_reclaim(void *ctx, uint64_t upto)
{
	struct pbox_udp *u = ctx;

	(void)upto;
	if (u->ntx != 0) {
		send_queued(u);
	}
	return u->tx_refs;
}

const struct pbox_tx_ops pbox_udp_tx_ops = {
	.send = udp_send,
	.flush = udp_flush,
	.queued = udp_queued,
	.reclaim = udp_reclaim,
};
