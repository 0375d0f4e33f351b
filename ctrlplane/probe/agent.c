/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The probe agent (see agent.h): the responder's packet logic and socket loop, and the
 * prober (handshake, paced streams, reports, the rate search).
 */
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "common/log.h"
#include "probe_wire.h"

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#else
#define cpu_relax() __asm__ __volatile__("" ::: "memory")
#endif

static int64_t clock_ns(clockid_t c)
{
	struct timespec ts;

	clock_gettime(c, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t mono_ns(void)
{
	return clock_ns(CLOCK_MONOTONIC);
}

static const char *addr_str(const struct sockaddr *sa, char *buf, size_t len)
{
	char host[64], port[8];

	if (getnameinfo(sa,
			sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
						  : sizeof(struct sockaddr_in),
			host, sizeof(host), port, sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV)) {
		snprintf(buf, len, "?");
	} else {
		snprintf(buf, len, sa->sa_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, port);
	}
	return buf;
}

/* ---- responder ---- */

struct probe_session {
	uint64_t token; /* 0: free */
	uint64_t nonce;
	struct sockaddr_storage peer;
	socklen_t peer_len;
	int64_t last_ns;
	/* the current stream */
	bool have_stream;
	uint32_t stream;
	uint16_t count;
	uint32_t period_ns;
	uint64_t rx_bytes;
	int64_t send_ns[PBOX_SLOPS_MAX_STREAM_LEN];
	int64_t recv_ns[PBOX_SLOPS_MAX_STREAM_LEN];
	uint8_t got[PBOX_SLOPS_MAX_STREAM_LEN];
};

struct pbox_probe_responder {
	struct pbox_probe_responder_conf conf;
	struct probe_session *sessions;
	double hello_tokens;
	int64_t hello_last_ns;
	struct pbox_probe_responder_stats st;
};

struct pbox_probe_responder *
pbox_probe_responder_create(const struct pbox_probe_responder_conf *conf)
{
	struct pbox_probe_responder *r = calloc(1, sizeof(*r));

	if (r == NULL) {
		PBOX_LOG_ERR(TRANSPORT, "probe responder: out of memory");
		return NULL;
	}
	if (conf) {
		r->conf = *conf;
	}
	if (r->conf.max_sessions == 0) {
		r->conf.max_sessions = 64;
	}
	if (r->conf.max_per_addr == 0) {
		r->conf.max_per_addr = 4;
	}
	if (r->conf.idle_ns <= 0) {
		r->conf.idle_ns = 5000000000LL;
	}
	if (r->conf.hello_per_s == 0) {
		r->conf.hello_per_s = 100;
	}
	r->sessions = calloc(r->conf.max_sessions, sizeof(*r->sessions));
	if (r->sessions == NULL) {
		PBOX_LOG_ERR(TRANSPORT, "probe responder: no memory for %u sessions",
			     r->conf.max_sessions);
		free(r);
		return NULL;
	}
	r->hello_tokens = r->conf.hello_per_s;
	r->hello_last_ns = INT64_MIN;
	return r;
}

void pbox_probe_responder_destroy(struct pbox_probe_responder *r)
{
	if (r) {
		free(r->sessions);
		free(r);
	}
}

void pbox_probe_responder_get_stats(const struct pbox_probe_responder *r,
				    struct pbox_probe_responder_stats *out)
{
	*out = r->st;
}

static bool session_live(const struct pbox_probe_responder *r, const struct probe_session *s,
			 int64_t now_ns)
{
	return s->token != 0 && now_ns - s->last_ns <= r->conf.idle_ns;
}

unsigned pbox_probe_responder_sessions(const struct pbox_probe_responder *r, int64_t now_ns)
{
	unsigned i, n = 0;

	for (i = 0; i < r->conf.max_sessions; i++) {
		n += session_live(r, &r->sessions[i], now_ns);
	}
	return n;
}

/* Same address (and port, when with_port). */
static bool same_addr(const struct sockaddr *a, socklen_t alen, const struct sockaddr_storage *b,
		      socklen_t blen, bool with_port)
{
	if (alen != blen || a->sa_family != b->ss_family) {
		return false;
	}
	if (a->sa_family == AF_INET) {
		const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;

		return x->sin_addr.s_addr == y->sin_addr.s_addr &&
		       (!with_port || x->sin_port == y->sin_port);
	}
	if (a->sa_family == AF_INET6) {
		const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;

		return !memcmp(&x->sin6_addr, &y->sin6_addr, sizeof(x->sin6_addr)) &&
		       (!with_port || x->sin6_port == y->sin6_port);
	}
	return false;
}

static void session_free(struct pbox_probe_responder *r, struct probe_session *s)
{
	(void)r;
	s->token = 0;
	s->have_stream = false;
}

static uint64_t new_token(void)
{
	uint64_t t = 0;

	while (t == 0) {
		if (getrandom(&t, sizeof(t), 0) != (ssize_t)sizeof(t)) {
			return 0;
		}
	}
	return t;
}

static size_t on_hello(struct pbox_probe_responder *r, const struct sockaddr *from,
		       socklen_t fromlen, const struct pbox_probe_msg *m, int64_t now_ns,
		       void *reply, size_t cap)
{
	struct probe_session *free_slot = NULL, *s;
	unsigned i, same = 0;

	if (fromlen > sizeof(s->peer)) {
		r->st.drop_malformed++;
		return 0;
	}
	for (i = 0; i < r->conf.max_sessions; i++) {
		s = &r->sessions[i];
		if (s->token != 0 && !session_live(r, s, now_ns)) {
			session_free(r, s);
			r->st.sessions_expired++;
		}
		if (s->token == 0) {
			free_slot = free_slot ? free_slot : s;
			continue;
		}
		if (same_addr(from, fromlen, &s->peer, s->peer_len, true) &&
		    s->nonce == m->u.hello.nonce) {
			/* A retransmitted HELLO: the same session again, not a new one. */
			s->last_ns = now_ns;
			return pbox_probe_encode_ack(reply, cap, s->token, s->nonce,
						     PBOX_SLOPS_MAX_STREAM_LEN,
						     PBOX_PROBE_MAX_DATAGRAM);
		}
		same += same_addr(from, fromlen, &s->peer, s->peer_len, false);
	}
	if (free_slot == NULL || same >= r->conf.max_per_addr) {
		r->st.drop_full++;
		return 0;
	}
	/* New sessions: a token bucket of hello_per_s per second, as deep. */
	if (r->hello_last_ns != INT64_MIN) {
		r->hello_tokens += (double)(now_ns - r->hello_last_ns) * 1e-9 * r->conf.hello_per_s;
		if (r->hello_tokens > r->conf.hello_per_s) {
			r->hello_tokens = r->conf.hello_per_s;
		}
	}
	r->hello_last_ns = now_ns;
	if (r->hello_tokens < 1) {
		r->st.drop_rate++;
		return 0;
	}
	r->hello_tokens -= 1;
	s = free_slot;
	s->token = new_token();
	if (s->token == 0) {
		PBOX_LOG_WARN(TRANSPORT, "probe responder: getrandom: %s", strerror(errno));
		return 0;
	}
	memcpy(&s->peer, from, fromlen);
	s->peer_len = fromlen;
	s->nonce = m->u.hello.nonce;
	s->last_ns = now_ns;
	s->have_stream = false;
	r->st.sessions_opened++;
	return pbox_probe_encode_ack(reply, cap, s->token, s->nonce, PBOX_SLOPS_MAX_STREAM_LEN,
				     PBOX_PROBE_MAX_DATAGRAM);
}

static struct probe_session *find_session(struct pbox_probe_responder *r,
					  const struct sockaddr *from, socklen_t fromlen,
					  uint64_t token, int64_t now_ns)
{
	unsigned i;

	for (i = 0; token != 0 && i < r->conf.max_sessions; i++) {
		struct probe_session *s = &r->sessions[i];

		if (s->token == token && session_live(r, s, now_ns) &&
		    same_addr(from, fromlen, &s->peer, s->peer_len, true)) {
			s->last_ns = now_ns;
			return s;
		}
	}
	r->st.drop_bad_token++;
	return NULL;
}

static void on_data(struct pbox_probe_responder *r, struct probe_session *s,
		    const struct pbox_probe_msg *m, size_t len, int64_t rx_ns)
{
	uint16_t seq = m->u.data.seq;

	if (!s->have_stream || m->u.data.stream != s->stream) {
		/* Streams only move forward (serial-number order): a late packet of an earlier
		 * stream must not wipe the current one. */
		if (s->have_stream && (int32_t)(m->u.data.stream - s->stream) < 0) {
			r->st.drop_stream++;
			return;
		}
		s->have_stream = true;
		s->stream = m->u.data.stream;
		s->count = m->u.data.count;
		s->period_ns = m->u.data.period_ns;
		s->rx_bytes = 0;
		memset(s->got, 0, sizeof(s->got));
	} else if (m->u.data.count != s->count || m->u.data.period_ns != s->period_ns) {
		r->st.drop_stream++;
		return;
	}
	if (s->got[seq]) {
		r->st.drop_duplicate++;
		return;
	}
	s->got[seq] = 1;
	s->send_ns[seq] = m->u.data.send_ns;
	s->recv_ns[seq] = rx_ns;
	s->rx_bytes += len + PBOX_PROBE_IPUDP_BYTES;
}

static int32_t ppm(double x)
{
	return (int32_t)lrint(x * 1e6);
}

static size_t on_report_req(struct probe_session *s, const struct pbox_probe_msg *m, void *reply,
			    size_t cap)
{
	struct pbox_probe_msg rep = { .type = PBOX_PROBE_REPORT };
	struct pbox_slops_stream_stats st;

	rep.u.report.stream = m->u.report_req.stream;
	rep.u.report.pct_ppm = -1000000;
	if (s->have_stream && s->stream == m->u.report_req.stream &&
	    pbox_slops_stream_analyze(s->send_ns, s->recv_ns, s->got, s->count, s->period_ns,
				      &st) == 0) {
		rep.u.report.count = s->count;
		rep.u.report.received = (uint16_t)st.received;
		rep.u.report.rx_bytes = s->rx_bytes;
		rep.u.report.send_excess_ns = st.send_excess_ns;
		rep.u.report.duration_ns = st.duration_ns;
		rep.u.report.rx_span_ns = st.rx_span_ns;
		rep.u.report.pct_ppm = st.pct < 0 ? -1000000 : ppm(st.pct);
		rep.u.report.pdt_ppm = ppm(st.pdt);
	}
	return pbox_probe_encode_report(reply, cap, s->token, &rep);
}

size_t pbox_probe_responder_input(struct pbox_probe_responder *r, const struct sockaddr *from,
				  socklen_t fromlen, const void *pkt, size_t len, int64_t now_ns,
				  int64_t rx_ns, void *reply, size_t cap)
{
	struct pbox_probe_msg m;
	struct probe_session *s;
	size_t out = 0;
	int rc;

	r->st.rx_packets++;
	r->st.rx_bytes += len;
	rc = pbox_probe_decode(pkt, len, &m);
	if (rc == -EBADMSG) {
		r->st.drop_not_ours++;
		return 0;
	}
	if (rc < 0) {
		r->st.drop_malformed++;
		return 0;
	}
	switch (m.type) {
	case PBOX_PROBE_HELLO:
		out = on_hello(r, from, fromlen, &m, now_ns, reply, cap);
		break;
	case PBOX_PROBE_DATA:
		s = find_session(r, from, fromlen, m.token, now_ns);
		if (s) {
			on_data(r, s, &m, len, rx_ns);
		}
		break;
	case PBOX_PROBE_REPORT_REQ:
		s = find_session(r, from, fromlen, m.token, now_ns);
		if (s) {
			out = on_report_req(s, &m, reply, cap);
		}
		break;
	case PBOX_PROBE_BYE:
		s = find_session(r, from, fromlen, m.token, now_ns);
		if (s) {
			session_free(r, s);
			r->st.sessions_closed++;
		}
		break;
	default:
		r->st.drop_unexpected++;
		break;
	}
	if (out > len) { /* cannot happen (static_asserts in probe_wire.c): never amplify */
		out = 0;
	}
	if (out) {
		r->st.tx_packets++;
		r->st.tx_bytes += out;
	}
	return out;
}

#define SERVE_BATCH  32
#define SERVE_NAP_NS 1000000

int pbox_probe_responder_serve(struct pbox_probe_responder *r, int fd,
			       const volatile sig_atomic_t *stop)
{
	uint8_t(*bufs)[PBOX_PROBE_MAX_DATAGRAM + 1] = malloc(SERVE_BATCH * sizeof(*bufs));
	struct sockaddr_storage from[SERVE_BATCH];
	char ctl[SERVE_BATCH][CMSG_SPACE(sizeof(struct timespec))];
	struct mmsghdr msgs[SERVE_BATCH];
	struct iovec iov[SERVE_BATCH];
	uint8_t reply[PBOX_PROBE_REQ_BYTES];
	int one = 1, i, rc = 0;

	if (bufs == NULL) {
		PBOX_LOG_ERR(TRANSPORT, "probe responder: no memory for receive buffers");
		return -ENOMEM;
	}
	if (setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof(one)) < 0) {
		PBOX_LOG_WARN(TRANSPORT,
			      "probe responder: SO_TIMESTAMPNS: %s (user-space "
			      "receive times instead)",
			      strerror(errno));
	}
	while (!*stop) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		int n = poll(&pfd, 1, 200);

		if (n < 0) {
			if (errno == EINTR) {
				continue;
			}
			rc = -errno;
			break;
		}
		if (n == 0) {
			continue;
		}
		for (i = 0; i < SERVE_BATCH; i++) {
			iov[i].iov_base = bufs[i];
			iov[i].iov_len = sizeof(bufs[i]);
			memset(&msgs[i], 0, sizeof(msgs[i]));
			msgs[i].msg_hdr.msg_name = &from[i];
			msgs[i].msg_hdr.msg_namelen = sizeof(from[i]);
			msgs[i].msg_hdr.msg_iov = &iov[i];
			msgs[i].msg_hdr.msg_iovlen = 1;
			msgs[i].msg_hdr.msg_control = ctl[i];
			msgs[i].msg_hdr.msg_controllen = sizeof(ctl[i]);
		}
		n = recvmmsg(fd, msgs, SERVE_BATCH, MSG_DONTWAIT, NULL);
		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR || errno == ECONNREFUSED) {
				continue;
			}
			rc = -errno;
			break;
		}
		for (i = 0; i < n; i++) {
			int64_t now = mono_ns(), rx = clock_ns(CLOCK_REALTIME);
			struct cmsghdr *c;
			size_t out, len = msgs[i].msg_len;

			for (c = CMSG_FIRSTHDR(&msgs[i].msg_hdr); c;
			     c = CMSG_NXTHDR(&msgs[i].msg_hdr, c)) {
				if (c->cmsg_level == SOL_SOCKET &&
				    c->cmsg_type == SCM_TIMESTAMPNS) {
					struct timespec ts;

					memcpy(&ts, CMSG_DATA(c), sizeof(ts));
					rx = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
				}
			}
			if (msgs[i].msg_hdr.msg_flags & MSG_TRUNC) {
				len = sizeof(
					bufs[i]); /* longer than any probe: the decoder drops it */
			}
			out = pbox_probe_responder_input(r, (struct sockaddr *)&from[i],
							 msgs[i].msg_hdr.msg_namelen, bufs[i], len,
							 now, rx, reply, sizeof(reply));
			if (out) {
				sendto(fd, reply, out, MSG_DONTWAIT, (struct sockaddr *)&from[i],
				       msgs[i].msg_hdr.msg_namelen);
			}
		}
		if (n < SERVE_BATCH) {
			/* Arrival times are the kernel's, so there is no hurry: being woken for
			 * every datagram would preempt the sender when both share a core. */
			struct timespec nap = { .tv_nsec = SERVE_NAP_NS };

			nanosleep(&nap, NULL);
		}
	}
	free(bufs);
	return rc;
}

/* ---- addresses ---- */

static int parse_addr(const char *s, uint16_t def_port, int flags, struct sockaddr_storage *ss,
		      socklen_t *len)
{
	struct addrinfo hints = { .ai_socktype = SOCK_DGRAM, .ai_flags = AI_NUMERICSERV | flags };
	struct addrinfo *res = NULL;
	char host[256], port[8];
	const char *colon;
	size_t hl;
	int rc;

	snprintf(port, sizeof(port), "%u", def_port);
	if (s[0] == '[') {
		const char *end = strchr(s, ']');

		if (end == NULL || (end[1] != '\0' && end[1] != ':')) {
			return -EINVAL;
		}
		hl = (size_t)(end - s - 1);
		colon = end[1] == ':' ? end + 1 : NULL;
		s++;
	} else {
		colon = strrchr(s, ':');
		if (colon && strchr(s, ':') != colon) {
			colon = NULL; /* a bare IPv6 address */
		}
		hl = colon ? (size_t)(colon - s) : strlen(s);
	}
	if (hl >= sizeof(host)) {
		return -EINVAL;
	}
	memcpy(host, s, hl);
	host[hl] = '\0';
	if (colon) {
		char *end;
		unsigned long p = strtoul(colon + 1, &end, 10);

		if (colon[1] == '\0' || *end != '\0' || p == 0 || p > 65535) {
			return -EINVAL;
		}
		snprintf(port, sizeof(port), "%lu", p);
	}
	if (host[0] == '\0') {
		hints.ai_flags |= AI_PASSIVE;
		hints.ai_family = AF_INET;
	}
	rc = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
	if (rc != 0 || res == NULL) {
		return -EHOSTUNREACH;
	}
	memcpy(ss, res->ai_addr, res->ai_addrlen);
	*len = res->ai_addrlen;
	freeaddrinfo(res);
	return 0;
}

int pbox_probe_parse_addr(const char *s, uint16_t def_port, struct sockaddr_storage *ss,
			  socklen_t *len)
{
	return parse_addr(s, def_port, 0, ss, len);
}

int pbox_probe_parse_numeric_addr(const char *s, uint16_t def_port, struct sockaddr_storage *ss,
				  socklen_t *len)
{
	return parse_addr(s, def_port, AI_NUMERICHOST, ss, len);
}

int pbox_probe_listen(const struct sockaddr *addr, socklen_t len)
{
	char name[80];
	int fd = socket(addr->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0), rc, sz = 4 << 20;

	if (fd < 0) {
		rc = -errno;
		PBOX_LOG_ERR(TRANSPORT, "probe responder: socket: %s", strerror(errno));
		return rc;
	}
	/* Streams arrive at line rate while the loop may be descheduled: room for several. */
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
	if (bind(fd, addr, len) < 0) {
		rc = -errno;
		PBOX_LOG_ERR(TRANSPORT, "probe responder: bind %s: %s",
			     addr_str(addr, name, sizeof(name)), strerror(errno));
		close(fd);
		return rc;
	}
	return fd;
}

/* ---- prober ---- */

void pbox_probe_request_defaults(struct pbox_probe_request *req)
{
	memset(req, 0, sizeof(*req));
	req->min_bps = 1e6;
	req->resolution = PBOX_SLOPS_RESOLUTION;
	req->max_datagram = 1500;
	req->streams = PBOX_SLOPS_FLEET_STREAMS;
	req->stream_len = PBOX_SLOPS_STREAM_LEN;
	req->reply_timeout_ns = 300000000;
}

struct prober {
	const struct pbox_probe_request *req;
	int fd;
	uint64_t token;
	uint32_t stream;
	uint32_t stream_len, max_datagram;
	int64_t start_ns, deadline_ns;
	unsigned streams_sent;
	uint64_t bytes_sent;
	double max_stream_bps;
	char peer[80];
	uint8_t buf[PBOX_PROBE_MAX_DATAGRAM];
};

/* Sleep to within PBOX_PROBE_SPIN_NS of t, then spin on the clock until t. */
static void wait_until(int64_t t)
{
	int64_t now = mono_ns();

	if (t - now > PBOX_PROBE_SPIN_NS) {
		int64_t w = t - PBOX_PROBE_SPIN_NS;
		struct timespec ts = { .tv_sec = w / 1000000000, .tv_nsec = w % 1000000000 };

		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
		}
	}
	while (mono_ns() < t) {
		cpu_relax();
	}
}

/* Wait up to timeout for a reply of `type` (and stream, for reports); returns 0,
 * -ETIMEDOUT, -ECONNREFUSED or -errno. */
static int await_reply(struct prober *p, uint8_t type, uint32_t stream, int64_t timeout_ns,
		       struct pbox_probe_msg *m)
{
	int64_t end = mono_ns() + timeout_ns;

	for (;;) {
		int64_t left = end - mono_ns();
		struct pollfd pfd = { .fd = p->fd, .events = POLLIN };
		uint8_t b[256];
		ssize_t n;

		if (left <= 0) {
			return -ETIMEDOUT;
		}
		if (poll(&pfd, 1, (int)((left + 999999) / 1000000)) < 0 && errno != EINTR) {
			return -errno;
		}
		n = recv(p->fd, b, sizeof(b), MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR) {
				continue;
			}
			return -errno;
		}
		if (pbox_probe_decode(b, (size_t)n, m) == 0 && m->type == type &&
		    (type != PBOX_PROBE_REPORT ||
		     (m->token == p->token && m->u.report.stream == stream))) {
			return 0;
		}
	}
}

static int hello(struct prober *p)
{
	struct pbox_probe_msg m;
	uint64_t nonce = 0;
	size_t len;
	int tries, rc = -ETIMEDOUT;

	if (getrandom(&nonce, sizeof(nonce), 0) != (ssize_t)sizeof(nonce)) {
		return -errno;
	}
	len = pbox_probe_encode_hello(p->buf, sizeof(p->buf), nonce);
	for (tries = 0; tries < 3; tries++) {
		if (send(p->fd, p->buf, len, 0) < 0) {
			return -errno;
		}
		rc = await_reply(p, PBOX_PROBE_HELLO_ACK, 0, p->req->reply_timeout_ns, &m);
		if (rc == 0 && m.u.ack.nonce == nonce && m.token != 0) {
			p->token = m.token;
			if (m.u.ack.max_stream_len < p->stream_len) {
				p->stream_len = m.u.ack.max_stream_len;
			}
			if ((uint32_t)m.u.ack.max_datagram + PBOX_PROBE_IPUDP_BYTES <
			    p->max_datagram) {
				p->max_datagram =
					(uint32_t)m.u.ack.max_datagram + PBOX_PROBE_IPUDP_BYTES;
			}
			return p->stream_len >= 2 ? 0 : -EPROTO;
		}
		if (rc == -ECONNREFUSED) {
			return rc;
		}
	}
	return rc;
}

/* Time one stream at bps takes, with its gap and report: for budget checks. */
static int64_t stream_cost_ns(const struct prober *p, double bps)
{
	int64_t period, d;

	pbox_slops_packet_bytes(bps, p->max_datagram, p->stream_len, &period);
	d = period * (p->stream_len - 1);

	return d + (d > PBOX_PROBE_MIN_GAP_NS ? d : PBOX_PROBE_MIN_GAP_NS) + 2000000;
}

/*
 * Send one stream at (at most) bps, then ask for its report. Fills *st (count: what was
 * sent). Returns 0, 1 when no report came (the stream is unusable), or -errno.
 */
static int send_stream(struct prober *p, double bps, struct pbox_slops_stream_stats *st)
{
	int64_t period, t, stream_start, gap_end, tol;
	uint32_t bytes = pbox_slops_packet_bytes(bps, p->max_datagram, p->stream_len, &period);
	size_t len = bytes - PBOX_PROBE_IPUDP_BYTES;
	struct pbox_probe_msg m;
	uint32_t i, id = ++p->stream;
	int tries, rc;

	if (len < PBOX_PROBE_DATA_HDR) {
		len = PBOX_PROBE_DATA_HDR;
		bytes = (uint32_t)len + PBOX_PROBE_IPUDP_BYTES;
	}
	/* period was rounded up from bytes * 8 / bps: the stream's rate is at most bps. */
	tol = period / 8;
	stream_start = t = mono_ns() + 20000;
	for (i = 0; i < p->stream_len; i++) {
		int64_t now;

		pbox_probe_encode_data(p->buf, sizeof(p->buf), len, p->token, id, (uint16_t)i,
				       (uint16_t)p->stream_len, (uint32_t)period, 0);
		wait_until(t);
		now = mono_ns();
		if (now - t > tol) {
			t = now; /* behind schedule: shift it, never catch up with a burst */
		}
		pbox_probe_stamp_data(p->buf, now);
		if (send(p->fd, p->buf, len, 0) < 0 && errno != ENOBUFS && errno != EAGAIN) {
			if (errno == ECONNREFUSED) {
				return -ECONNREFUSED;
			}
			return -errno;
		}
		p->bytes_sent += bytes;
		t += period;
	}
	p->streams_sent++;
	if ((double)bytes * 8e9 / (double)period > p->max_stream_bps) {
		p->max_stream_bps = (double)bytes * 8e9 / (double)period;
	}
	/* The idle gap after a stream lasts at least as long as the stream: a queue the
	 * stream built drains before the next one, and the fleet's mean rate stays <= R/2.
	 * And at least PBOX_PROBE_MIN_GAP_NS, so that a fleet samples the cross traffic over
	 * more than 100 ms even at high rates, where streams last a millisecond or two. */
	gap_end = t + (t - stream_start > PBOX_PROBE_MIN_GAP_NS ? t - stream_start
								: PBOX_PROBE_MIN_GAP_NS);
	memset(st, 0, sizeof(*st));
	st->count = p->stream_len;
	st->pct = -1;
	for (tries = 0; tries < 3; tries++) {
		size_t rl = pbox_probe_encode_report_req(p->buf, sizeof(p->buf), p->token, id);

		if (send(p->fd, p->buf, rl, 0) < 0 && errno != ENOBUFS && errno != EAGAIN) {
			return errno == ECONNREFUSED ? -ECONNREFUSED : -errno;
		}
		rc = await_reply(p, PBOX_PROBE_REPORT, id, p->req->reply_timeout_ns, &m);
		if (rc == 0) {
			break;
		}
		if (rc != -ETIMEDOUT) {
			return rc;
		}
	}
	if (tries == 3) {
		return 1;
	}
	if (m.u.report.count == p->stream_len) {
		st->received = m.u.report.received;
		st->send_excess_ns = m.u.report.send_excess_ns;
		st->duration_ns = m.u.report.duration_ns;
		st->rx_span_ns = m.u.report.rx_span_ns;
		st->pct = m.u.report.pct_ppm == -1000000 ? -1 : m.u.report.pct_ppm / 1e6;
		st->pdt = m.u.report.pdt_ppm / 1e6;
	} /* else: nothing of this stream arrived (count 0): received stays 0, lossy */
	if (mono_ns() < gap_end) {
		wait_until(gap_end);
	}
	return 0;
}

/* One fleet at bps: its verdict, or -errno. DISTURBED also when the budget ends it. */
static int run_fleet(struct prober *p, double bps, enum pbox_slops_verdict *verdict, bool *budget)
{
	enum pbox_slops_verdict v[PBOX_SLOPS_MAX_FLEET_STREAMS];
	struct pbox_slops_stream_stats st;
	unsigned k, missing = 0;
	int rc;

	for (k = 0; k < p->req->streams; k++) {
		if (mono_ns() + stream_cost_ns(p, bps) > p->deadline_ns) {
			*budget = true;
			*verdict = PBOX_SLOPS_DISTURBED;
			return 0;
		}
		rc = send_stream(p, bps, &st);
		if (rc < 0) {
			return rc;
		}
		missing += rc;
		v[k] = rc ? PBOX_SLOPS_SHORT : pbox_slops_stream_verdict(&st);
		if (pbox_slops_fleet_decided(v, k + 1, p->req->streams, verdict)) {
			k++;
			break;
		}
	}
	if (2 * missing > k) {
		PBOX_LOG_WARN(TRANSPORT, "probe %s: no report for %u of %u streams", p->peer,
			      missing, k);
		return -ETIMEDOUT;
	}
	if (k == p->req->streams) {
		*verdict = pbox_slops_fleet_verdict(v, k);
	}
	if (p->req->on_fleet) {
		p->req->on_fleet(p->req->arg, bps, *verdict, v, k);
	}
	return 0;
}

static int check_request(const struct pbox_probe_request *req)
{
	if (req->peer_len == 0 || req->peer_len > sizeof(req->peer) || !(req->min_bps > 0) ||
	    !(req->cap_bps > req->min_bps) || req->cap_bps > 1e12 || req->budget_ns <= 0 ||
	    !(req->resolution > 0 && req->resolution < 1) ||
	    req->max_datagram < PBOX_SLOPS_MIN_PACKET ||
	    req->max_datagram > PBOX_PROBE_MAX_DATAGRAM + PBOX_PROBE_IPUDP_BYTES ||
	    req->streams == 0 || req->streams > PBOX_SLOPS_MAX_FLEET_STREAMS ||
	    req->stream_len < 10 || req->stream_len > PBOX_SLOPS_MAX_STREAM_LEN ||
	    req->reply_timeout_ns <= 0) {
		return -EINVAL;
	}
	return 0;
}

int pbox_probe_run(const struct pbox_probe_request *req, struct pbox_probe_result *res)
{
	struct prober *p;
	struct pbox_slops_search search;
	struct pbox_slops_stream_stats st;
	struct pbox_slops_range range;
	int old_slack, rc, sz = 4 << 20, old_policy = SCHED_OTHER;
	struct sched_param old_param = { 0 };
	bool budget = false, realtime = false;
	double bps;

	memset(res, 0, sizeof(*res));
	if (check_request(req) < 0) {
		PBOX_LOG_ERR(TRANSPORT,
			     "probe: request out of range (cap %.0f min %.0f bit/s, "
			     "budget %lld ns, resolution %g, datagram %u, %u x %u)",
			     req->cap_bps, req->min_bps, (long long)req->budget_ns, req->resolution,
			     req->max_datagram, req->streams, req->stream_len);
		return -EINVAL;
	}
	p = calloc(1, sizeof(*p));
	if (p == NULL) {
		return -ENOMEM;
	}
	p->req = req;
	p->stream_len = req->stream_len;
	p->max_datagram = req->max_datagram;
	addr_str((const struct sockaddr *)&req->peer, p->peer, sizeof(p->peer));
	p->start_ns = mono_ns();
	p->deadline_ns = p->start_ns + req->budget_ns;
	old_slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
	prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0);
	if (req->realtime) {
		struct sched_param sp = { .sched_priority = 10 };

		pthread_getschedparam(pthread_self(), &old_policy, &old_param);
		rc = pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp);
		if (rc != 0) {
			PBOX_LOG_WARN(TRANSPORT,
				      "probe %s: SCHED_FIFO: %s (pacing may be disturbed)", p->peer,
				      strerror(rc));
		} else {
			realtime = true;
		}
	}
	p->fd = socket(req->peer.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (p->fd < 0) {
		rc = -errno;
		PBOX_LOG_ERR(TRANSPORT, "probe %s: socket: %s", p->peer, strerror(errno));
		goto out_free;
	}
	setsockopt(p->fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	if (connect(p->fd, (const struct sockaddr *)&req->peer, req->peer_len) < 0) {
		rc = -errno;
		PBOX_LOG_ERR(TRANSPORT, "probe %s: connect: %s", p->peer, strerror(errno));
		goto out_close;
	}
	rc = hello(p);
	if (rc < 0) {
		PBOX_LOG_ERR(TRANSPORT, "probe %s: no session: %s", p->peer, strerror(-rc));
		goto out_close;
	}
	pbox_slops_search_init(&search, req->min_bps, req->cap_bps, req->resolution);
	/* The first stream at the cap: its receive dispersion rate is an upper estimate of
	 * the available bandwidth (pathload's ADR), where the search starts. */
	if (mono_ns() + stream_cost_ns(p, req->cap_bps) <= p->deadline_ns) {
		rc = send_stream(p, req->cap_bps, &st);
		if (rc < 0) {
			goto out_bye;
		}
		if (rc == 0 && st.received >= 2 && st.rx_span_ns > 0) {
			int64_t period;
			uint32_t bytes = pbox_slops_packet_bytes(req->cap_bps, p->max_datagram,
								 p->stream_len, &period);

			res->adr_bps =
				(double)(st.received - 1) * bytes * 8e9 / (double)st.rx_span_ns;
			pbox_slops_search_hint(&search, res->adr_bps);
		}
	}
	while (pbox_slops_search_next(&search, &bps)) {
		enum pbox_slops_verdict v;
		int tries;

		/* A disturbed fleet is repeated: a preempted sender (a busy machine) is not
		 * yet proof that it cannot send at bps, and taking it as such would cap the
		 * estimate below the true value. */
		for (tries = 0; tries < PBOX_PROBE_DISTURBED_TRIES; tries++) {
			rc = run_fleet(p, bps, &v, &budget);
			if (rc < 0) {
				goto out_bye;
			}
			if (budget || v != PBOX_SLOPS_DISTURBED) {
				break;
			}
		}
		if (budget) {
			break;
		}
		pbox_slops_search_update(&search, bps, v);
	}
	pbox_slops_search_result(&search, &range);
	res->r_min_bps = range.r_min;
	res->r_max_bps = range.r_max;
	res->grey_min_bps = range.grey_min;
	res->grey_max_bps = range.grey_max;
	res->flags = range.flags | (budget ? PBOX_SLOPS_F_BUDGET : 0);
	res->fleets = range.fleets;
	rc = 0;
out_bye:
	res->streams = p->streams_sent;
	res->bytes_sent = p->bytes_sent;
	res->max_stream_bps = p->max_stream_bps;
	res->timestamp_ns = clock_ns(CLOCK_REALTIME);
	res->duration_ns = mono_ns() - p->start_ns;
	send(p->fd, p->buf, pbox_probe_encode_bye(p->buf, sizeof(p->buf), p->token), 0);
	if (rc < 0) {
		PBOX_LOG_ERR(TRANSPORT, "probe %s: %s after %u streams", p->peer, strerror(-rc),
			     p->streams_sent);
	}
out_close:
	close(p->fd);
out_free:
	if (old_slack > 0) {
		prctl(PR_SET_TIMERSLACK, (unsigned long)old_slack, 0, 0, 0);
	}
	if (realtime) {
		pthread_setschedparam(pthread_self(), old_policy, &old_param);
	}
	free(p);
	return rc;
}
