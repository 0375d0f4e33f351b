/* SPDX-License-Identifier: BSD-3-Clause */
/* Kernel-UDP transport with recvmmsg / sendmmsg bursts (see udp.h). */
#include "udp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/compiler.h"
#include "common/log.h"

struct tx_entry {
	struct pbox_wire_hdr hdr;
	struct sockaddr_in to;
	struct iovec iov[2];
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
	struct pbox_udp_stats stats;
	struct pbox_fault fault;
	bool faulty;
	/* receive */
	struct mmsghdr *rx_msgs;
	struct iovec *rx_iov;
	struct sockaddr_in *rx_addr;
	uint8_t *rx_buf; /* burst * PBOX_UDP_MAX_DGRAM */
	/* send */
	unsigned ntx;
	uint64_t tx_refs; /* payload datagrams queued so far */
	struct mmsghdr *tx_msgs;
	struct tx_entry *tx;
	struct held *held;
	bool emsgsize_logged;
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

static void set_buf(int fd, int opt, int force_opt, int bytes, const char *what)
{
	int got = 0;
	socklen_t l = sizeof(got);

	/* FORCE (root) overrides net.core.{r,w}mem_max; fall back to the plain option. */
	if (setsockopt(fd, SOL_SOCKET, force_opt, &bytes, sizeof(bytes)) != 0) {
		setsockopt(fd, SOL_SOCKET, opt, &bytes, sizeof(bytes));
	}
	getsockopt(fd, SOL_SOCKET, opt, &got, &l);
	if (got < bytes) {
		PBOX_LOG_INFO(TRANSPORT,
			      "%s buffer is %d bytes (asked %d; raise net.core.%s_max or run as "
			      "root for fewer drops under bursts)",
			      what, got / 2, bytes, opt == SO_RCVBUF ? "rmem" : "wmem");
	}
}

struct pbox_udp *pbox_udp_open(const struct pbox_udp_cfg *cfg)
{
	struct pbox_udp *u = calloc(1, sizeof(*u));
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t sl = sizeof(sa);
	struct pbox_peer local;
	int pmtu = IP_PMTUDISC_DO;
	int bufsz = cfg->sock_buf > 0 ? cfg->sock_buf : 8 << 20;

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
	u->rx_msgs = calloc(u->burst, sizeof(*u->rx_msgs));
	u->rx_iov = calloc(u->burst, sizeof(*u->rx_iov));
	u->rx_addr = calloc(u->burst, sizeof(*u->rx_addr));
	u->rx_buf = aligned_alloc(PBOX_CACHE_LINE, (size_t)u->burst * PBOX_UDP_MAX_DGRAM);
	u->tx_msgs = calloc(u->burst, sizeof(*u->tx_msgs));
	u->tx = calloc(u->burst, sizeof(*u->tx));
	if (u->rx_msgs == NULL || u->rx_iov == NULL || u->rx_addr == NULL || u->rx_buf == NULL ||
	    u->tx_msgs == NULL || u->tx == NULL) {
		PBOX_LOG_ERR(TRANSPORT, "udp: out of memory for %u-datagram bursts", u->burst);
		goto fail;
	}
	for (unsigned i = 0; i < u->burst; i++) {
		u->rx_iov[i].iov_base = u->rx_buf + (size_t)i * PBOX_UDP_MAX_DGRAM;
		u->rx_iov[i].iov_len = PBOX_UDP_MAX_DGRAM;
	}
	pbox_fault_init(&u->fault, &cfg->fault);
	u->faulty = pbox_fault_enabled(&u->fault);
	if (u->faulty) {
		u->held = calloc(1, sizeof(*u->held));
		if (u->held == NULL) {
			goto fail;
		}
	}
	u->fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (u->fd < 0) {
		PBOX_LOG_ERR(TRANSPORT, "udp: socket: %s", strerror(errno));
		goto fail;
	}
	/* No SO_REUSEADDR: on a UDP socket it lets another socket with the option bind the
	 * same port (an ephemeral bind may even pick it), and the newer socket then gets
	 * every datagram sent to it, so a worker or a core silently stops hearing. */
	setsockopt(u->fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof(pmtu));
	set_buf(u->fd, SO_RCVBUF, SO_RCVBUFFORCE, bufsz, "receive");
	set_buf(u->fd, SO_SNDBUF, SO_SNDBUFFORCE, bufsz, "send");
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
	free(u->rx_addr);
	free(u->rx_buf);
	free(u->tx_msgs);
	free(u->tx);
	free(u->held);
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

const struct pbox_fault *pbox_udp_fault(const struct pbox_udp *u)
{
	return &u->fault;
}

unsigned pbox_udp_rx_burst(struct pbox_udp *u, struct pbox_rx_pkt *pkts, unsigned max)
{
	int n;

	max = PBOX_MIN(max, u->burst);
	for (unsigned i = 0; i < max; i++) {
		struct msghdr *h = &u->rx_msgs[i].msg_hdr;

		h->msg_name = &u->rx_addr[i];
		h->msg_namelen = sizeof(u->rx_addr[i]);
		h->msg_iov = &u->rx_iov[i];
		h->msg_iovlen = 1;
		h->msg_control = NULL;
		h->msg_controllen = 0;
		h->msg_flags = 0;
	}
	n = recvmmsg(u->fd, u->rx_msgs, max, MSG_DONTWAIT, NULL);
	if (n <= 0) {
		return 0;
	}
	for (int i = 0; i < n; i++) {
		struct pbox_rx_pkt *p = &pkts[i];

		p->data = u->rx_iov[i].iov_base;
		p->len = u->rx_msgs[i].msg_len;
		if (u->rx_msgs[i].msg_hdr.msg_flags & MSG_TRUNC) {
			/* Larger than any pbox datagram: validation drops it on length. */
			u->stats.rx_truncated++;
		}
		memset(&p->from, 0, sizeof(p->from));
		p->from.ip = u->rx_addr[i].sin_addr.s_addr;
		p->from.port = u->rx_addr[i].sin_port;
		u->stats.rx_bytes += p->len;
	}
	u->stats.rx_pkts += (unsigned)n;
	return (unsigned)n;
}

int pbox_udp_wait(struct pbox_udp *u, int timeout_ms, int wake_fd)
{
	struct pollfd p[2] = { { .fd = u->fd, .events = POLLIN },
			       { .fd = wake_fd, .events = POLLIN } };
	int rc = poll(p, wake_fd >= 0 ? 2 : 1, timeout_ms);

	if (rc < 0) {
		return errno == EINTR ? 0 : -errno;
	}
	return (p[0].revents & POLLIN) ? 1 : 0;
}

/* Send tx[0..ntx) with as few sendmmsg calls as the socket allows. */
static void send_queued(struct pbox_udp *u)
{
	unsigned done = 0, waits = 0;

	while (done < u->ntx) {
		int n = sendmmsg(u->fd, u->tx_msgs + done, u->ntx - done, 0);

		if (n > 0) {
			for (int i = 0; i < n; i++) {
				u->stats.tx_bytes += u->tx_msgs[done + i].msg_len;
			}
			u->stats.tx_pkts += (unsigned)n;
			done += (unsigned)n;
			continue;
		}
		if (errno == EINTR) {
			continue;
		}
		if ((errno == EAGAIN || errno == ENOBUFS) && waits < 100) {
			struct pollfd p = { .fd = u->fd, .events = POLLOUT };

			u->stats.tx_waits++;
			waits++;
			poll(&p, 1, 1);
			continue;
		}
		if (errno == EMSGSIZE && !u->emsgsize_logged) {
			PBOX_LOG_ERR(TRANSPORT,
				     "udp: datagram of %zu bytes exceeds the path MTU; configure a "
				     "smaller mtu",
				     u->tx[done].iov[0].iov_len + u->tx[done].iov[1].iov_len);
			u->emsgsize_logged = true;
		}
		/* This datagram cannot go; drop it and carry on with the rest. */
		u->stats.tx_dropped++;
		done++;
	}
	u->ntx = 0;
}

static void queue(struct pbox_udp *u, const struct pbox_peer *to, const struct pbox_wire_hdr *hdr,
		  const void *payload, uint32_t len)
{
	struct tx_entry *e;
	struct msghdr *h;

	if (u->ntx == u->burst) {
		send_queued(u);
	}
	e = &u->tx[u->ntx];
	h = &u->tx_msgs[u->ntx].msg_hdr;
	memcpy(&e->hdr, hdr, sizeof(e->hdr));
	e->to.sin_family = AF_INET;
	e->to.sin_addr.s_addr = to->ip;
	e->to.sin_port = to->port;
	e->iov[0].iov_base = &e->hdr;
	e->iov[0].iov_len = sizeof(e->hdr);
	e->iov[1].iov_base = (void *)payload;
	e->iov[1].iov_len = len;
	memset(h, 0, sizeof(*h));
	h->msg_name = &e->to;
	h->msg_namelen = sizeof(e->to);
	h->msg_iov = e->iov;
	h->msg_iovlen = len ? 2 : 1;
	u->ntx++;
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
