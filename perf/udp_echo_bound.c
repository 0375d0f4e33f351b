/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-udp-echo-bound: the kernel-UDP bound for a pbox exchange, measured with the
 * smallest program of the same shape. An echo process (the appliance's place) runs
 * --threads echo threads, each on its own loopback UDP socket, receiving with recvmmsg
 * and sending every datagram straight back with sendmmsg, in bursts of --burst. --workers
 * worker processes (the workers' place, one I/O thread each) exchange --bytes per
 * iteration: the bytes go out as datagrams of --size bytes (UDP payload; the last one
 * shorter), spread round-robin over the echo threads, at most --window bytes outstanding
 * (libpbox's default send window is 4 MiB), and the iteration ends when every byte has come
 * back. Nothing is aggregated, checked or copied: what is left is the system calls and the
 * kernel's own copies, so no pbox exchange over the same sockets can be faster.
 *
 * --gso sends runs of datagrams as UDP_SEGMENT messages of up to 64 KB and receives with
 * UDP_GRO (the echo returns a coalesced message as one GSO message): the bound for small
 * datagrams (MTU 1500) when the kernel offloads are used.
 *
 * --reduce makes it the kernel-UDP bound of an aggregating exchange instead: each datagram
 * carries a 64-byte header (pbox's size; its first 8 bytes the iteration and the
 * datagram's index) and a slice of the worker's gradient (float32, every element 1.0). An
 * echo thread keeps the receive buffer of each contribution while the other workers' are
 * missing (no copy), sums all of a datagram's contributions in one pass with pbox's own
 * reduce kernel (a mean) when the last arrives, and sends that one result to every
 * contributor; each worker streams each result into its result buffer (as large as the
 * gradient) with the non-temporal copy libpbox's result copy uses, and checks every
 * element after the last iteration (exit 1 if one is not 1.0). What pbox must do beyond
 * it: a protocol (acknowledgements, reliability, flow control), its checks, and the
 * copy of a first contribution into an accumulator. No aggregating exchange over kernel
 * UDP sockets can be faster. Not with --gso (one datagram per message here).
 * --no-copy leaves the results in the receive buffers (the bound even for receiving in
 * place); --copy-first accumulates as pboxd does instead of holding, --ack acknowledges
 * each contribution that waits, --scan checks each for NaN / Inf in a pass of its own
 * (perf/agg_costs.py measures what each of these costs against the bound).
 *
 * Output: one line per worker, or with --json one JSON object with every worker's
 * seconds per iteration. A datagram lost (nothing back for 1 s) fails the run (exit 1):
 * loopback with the socket buffers this program asks for does not drop.
 */
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/args.h"
#include "common/clock.h"
#include "common/compiler.h"
#include "common/stream.h"
#include "kernels/kernels.h"

#define PROG       "pbox-udp-echo-bound"
#define MAX_BURST  256
#define MAX_MSG    65507u /* largest UDP payload over IPv4 */
#define MAX_SEGS   64u
#define MAX_THREAD 16
#define MAX_WORKER 64
#define SOCK_BUF   (32 << 20)
#define AGG_HDR    64u /* --reduce: pbox's header size; the first 8 bytes: struct agg_hdr */

struct opts {
	uint32_t workers, threads, burst, iters, warmup;
	uint64_t bytes, window;
	uint32_t size;
	bool gso, json, reduce;
	bool deliver;    /* --reduce: results copied into the result buffer (not --no-copy) */
	bool copy_first; /* --reduce --copy-first: accumulate as pboxd does, no holding */
	bool ack;        /* --reduce --ack: acknowledge each contribution that waits */
	bool scan;       /* --reduce --scan: check each contribution for NaN / Inf apart */
};

/* --reduce: what a datagram's header says (host order: both ends are this host). */
struct agg_hdr {
	uint32_t iter, idx;
};

static int open_sock(bool gso)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001) };
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), b = SOCK_BUF, one = 1;

	if (fd < 0) {
		perror(PROG ": socket");
		exit(1);
	}
	if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &b, sizeof(b)) != 0) {
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &b, sizeof(b));
	}
	if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &b, sizeof(b)) != 0) {
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof(b));
	}
	if (gso && setsockopt(fd, SOL_UDP, UDP_GRO, &one, sizeof(one)) != 0) {
		fprintf(stderr, PROG ": UDP_GRO: %s\n", strerror(errno));
		exit(1);
	}
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		perror(PROG ": bind");
		exit(1);
	}
	return fd;
}

static uint16_t sock_port(int fd)
{
	struct sockaddr_in sa;
	socklen_t l = sizeof(sa);

	getsockname(fd, (struct sockaddr *)&sa, &l);
	return sa.sin_port;
}

union ctl {
	char buf[CMSG_SPACE(sizeof(int))];
	struct cmsghdr align;
};

/* A GRO message's segment size, or 0. */
static int gro_size(struct msghdr *h)
{
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(h); cm != NULL; cm = CMSG_NXTHDR(h, cm)) {
		if (cm->cmsg_level == SOL_UDP && cm->cmsg_type == UDP_GRO) {
			int v;

			memcpy(&v, CMSG_DATA(cm), sizeof(v));
			return v;
		}
	}
	return 0;
}

static void set_segment(struct msghdr *h, union ctl *c, uint16_t seg)
{
	struct cmsghdr *cm;

	h->msg_control = c->buf;
	h->msg_controllen = CMSG_SPACE(sizeof(uint16_t));
	cm = CMSG_FIRSTHDR(h);
	cm->cmsg_level = SOL_UDP;
	cm->cmsg_type = UDP_SEGMENT;
	cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
	memcpy(CMSG_DATA(cm), &seg, sizeof(seg));
}

struct echo {
	int fd;
	const struct opts *o;
	pthread_t t;
};

/* Echo every datagram (or GRO message, as one GSO message of the same segment size) back
 * to its sender, a burst at a time. Runs until the process is killed. */
static void *echo_main(void *arg)
{
	struct echo *e = arg;
	unsigned burst = e->o->burst;
	uint32_t buflen = e->o->gso ? MAX_MSG : e->o->size;
	struct mmsghdr *m = calloc(burst, sizeof(*m));
	struct iovec *iov = calloc(burst, sizeof(*iov));
	struct sockaddr_in *from = calloc(burst, sizeof(*from));
	union ctl *rc = calloc(burst, sizeof(*rc)), *tc = calloc(burst, sizeof(*tc));
	uint8_t *buf = malloc((size_t)burst * buflen);

	if (m == NULL || iov == NULL || from == NULL || rc == NULL || tc == NULL || buf == NULL) {
		fprintf(stderr, PROG ": echo: out of memory\n");
		exit(1);
	}
	for (;;) {
		int n, done = 0;

		for (unsigned i = 0; i < burst; i++) {
			iov[i].iov_base = buf + (size_t)i * buflen;
			iov[i].iov_len = buflen;
			memset(&m[i].msg_hdr, 0, sizeof(m[i].msg_hdr));
			m[i].msg_hdr.msg_name = &from[i];
			m[i].msg_hdr.msg_namelen = sizeof(from[i]);
			m[i].msg_hdr.msg_iov = &iov[i];
			m[i].msg_hdr.msg_iovlen = 1;
			if (e->o->gso) {
				m[i].msg_hdr.msg_control = rc[i].buf;
				m[i].msg_hdr.msg_controllen = sizeof(rc[i].buf);
			}
		}
		/* Block for the first, then take what is queued. */
		n = recvmmsg(e->fd, m, burst, MSG_WAITFORONE, NULL);
		if (n <= 0) {
			continue;
		}
		for (int i = 0; i < n; i++) {
			int seg = e->o->gso ? gro_size(&m[i].msg_hdr) : 0;

			iov[i].iov_len = m[i].msg_len;
			m[i].msg_hdr.msg_control = NULL;
			m[i].msg_hdr.msg_controllen = 0;
			if (seg > 0 && (uint32_t)seg < m[i].msg_len) {
				set_segment(&m[i].msg_hdr, &tc[i], (uint16_t)seg);
			}
		}
		while (done < n) {
			int k = sendmmsg(e->fd, m + done, (unsigned)(n - done), 0);

			if (k < 0) {
				if (errno == EINTR || errno == EAGAIN || errno == ENOBUFS) {
					continue;
				}
				fprintf(stderr, PROG ": echo sendmmsg: %s\n", strerror(errno));
				exit(1);
			}
			done += k;
		}
	}
	return NULL;
}

/* --reduce: a datagram's contributions held until the last arrives (their receive
 * buffers, not copies), and where to send the result. */
struct agg_entry {
	struct agg_hdr h;
	uint32_t n;   /* contributions held */
	uint32_t len; /* the shortest held datagram's length */
	uint8_t *buf[MAX_WORKER];
	struct sockaddr_in from[MAX_WORKER];
};

/* Receive buffers: a stack of free ones, more allocated on demand (each worker has at most
 * --window bytes outstanding, so the held ones are bounded; agg_main checks the table). */
struct agg_pool {
	uint8_t **free;
	size_t nfree, cap;
	uint32_t buflen;
};

static uint8_t *pool_get(struct agg_pool *p)
{
	uint8_t *b = p->nfree > 0 ? p->free[--p->nfree] : malloc(p->buflen);

	if (b == NULL) {
		fprintf(stderr, PROG ": echo: out of memory\n");
		exit(1);
	}
	return b;
}

static void pool_put(struct agg_pool *p, uint8_t *b)
{
	if (p->nfree == p->cap) {
		size_t cap = p->cap ? 2 * p->cap : 256;
		uint8_t **f = realloc(p->free, cap * sizeof(*f));

		if (f == NULL) {
			fprintf(stderr, PROG ": echo: out of memory\n");
			exit(1);
		}
		p->free = f;
		p->cap = cap;
	}
	p->free[p->nfree++] = b;
}

/* The aggregating echo (--reduce): a burst of contributions in; every datagram whose last
 * contribution came is summed (mean) once and the result sent to each contributor, a
 * burst out. Runs until the process is killed. */
static void *agg_main(void *arg)
{
	struct echo *e = arg;
	const struct opts *o = e->o;
	const struct pbox_kernels *k = pbox_kernels_get();
	unsigned burst = o->burst, nw = o->workers;
	/* Pending datagrams span at most about a window (a worker's sends stop a window past
	 * its oldest missing result, and a datagram returns only once every worker sent it):
	 * slots for 4 windows, indexed by the datagram's index, collide only after a loss,
	 * which fails the run loudly. */
	uint64_t span = o->window / (o->size - AGG_HDR) + 2 * burst + 1;
	uint32_t nslot = 64;
	struct agg_pool pool = { .buflen = o->size };
	struct agg_entry *tab;
	/* Sends: each result goes to every worker. */
	size_t nsm = (size_t)burst * (nw + 1); /* results, and --ack's ACKs */
	struct mmsghdr *m = calloc(burst, sizeof(*m)), *sm = calloc(nsm, sizeof(*sm));
	struct iovec *iov = calloc(burst, sizeof(*iov)), *siov = calloc(nsm, sizeof(*siov));
	struct sockaddr_in *from = calloc(burst, sizeof(*from));
	uint8_t **rx = calloc(burst, sizeof(*rx)), *out = malloc((size_t)burst * o->size);
	uint8_t *ackb = malloc((size_t)burst * AGG_HDR);
	const float *srcs[MAX_WORKER];

	while (nslot < 4 * span) {
		nslot *= 2;
	}
	tab = calloc(nslot, sizeof(*tab));
	if (m == NULL || sm == NULL || iov == NULL || siov == NULL || from == NULL || rx == NULL ||
	    out == NULL || tab == NULL || ackb == NULL) {
		fprintf(stderr, PROG ": echo: out of memory\n");
		exit(1);
	}
	for (unsigned i = 0; i < burst; i++) {
		rx[i] = pool_get(&pool);
	}
	for (;;) {
		unsigned nout = 0, ns = 0, nack = 0;
		int n;

		for (unsigned i = 0; i < burst; i++) {
			iov[i] = (struct iovec){ .iov_base = rx[i], .iov_len = o->size };
			memset(&m[i].msg_hdr, 0, sizeof(m[i].msg_hdr));
			m[i].msg_hdr.msg_name = &from[i];
			m[i].msg_hdr.msg_namelen = sizeof(from[i]);
			m[i].msg_hdr.msg_iov = &iov[i];
			m[i].msg_hdr.msg_iovlen = 1;
		}
		n = recvmmsg(e->fd, m, burst, MSG_WAITFORONE, NULL);
		if (n <= 0) {
			continue;
		}
		for (int i = 0; i < n; i++) {
			uint32_t len = m[i].msg_len;
			struct agg_hdr h;
			struct agg_entry *a;
			uint8_t *res;
			const float *g;
			uint32_t nheld;
			size_t nf;

			if (len < AGG_HDR + sizeof(float)) {
				continue; /* not one of ours */
			}
			memcpy(&h, rx[i], sizeof(h));
			a = &tab[h.idx & (nslot - 1)];
			if (a->n != 0 && (a->h.iter != h.iter || a->h.idx != h.idx)) {
				fprintf(stderr,
					PROG
					": echo: datagram %u of iteration %u meets datagram %u of "
					"iteration %u, still pending: a contribution was lost (a "
					"socket buffer overflowed?)\n",
					h.idx, h.iter, a->h.idx, a->h.iter);
				exit(1);
			}
			if (a->n == 0) {
				a->h = h;
				a->len = len;
			}
			a->len = PBOX_MIN(a->len, len);
			nf = (a->len - AGG_HDR) / sizeof(float);
			g = (const float *)(const void *)(rx[i] + AGG_HDR);
			if (o->scan && k->nonfinite(g, nf) != 0) {
				/* pboxd's check under non_finite = "reject", apart */
				fprintf(stderr, PROG ": echo: NaN or Inf in datagram %u\n", h.idx);
				exit(1);
			}
			if (o->ack && a->n + 1 < nw) {
				/* pboxd's ACK of a contribution that waits for its peers */
				uint8_t *ack = ackb + (size_t)nack++ * AGG_HDR;

				memcpy(ack, rx[i], AGG_HDR);
				siov[ns] = (struct iovec){ .iov_base = ack, .iov_len = AGG_HDR };
				memset(&sm[ns].msg_hdr, 0, sizeof(sm[ns].msg_hdr));
				sm[ns].msg_hdr.msg_name = &from[i];
				sm[ns].msg_hdr.msg_namelen = sizeof(from[i]);
				sm[ns].msg_hdr.msg_iov = &siov[ns];
				sm[ns].msg_hdr.msg_iovlen = 1;
				ns++;
			}
			if (a->n + 1 < nw && o->copy_first && a->n == 0) {
				/* pboxd's way: the first contribution copied into an
				 * accumulator, the receive buffer reused at once */
				a->buf[0] = pool_get(&pool);
				memcpy(a->buf[0], rx[i], len);
				a->from[a->n++] = from[i];
				continue;
			}
			if (a->n + 1 < nw && o->copy_first) {
				/* ... and each later one but the last added to it */
				float *acc = (float *)(void *)(a->buf[0] + AGG_HDR);
				const float *two[2] = { acc, g };

				k->reduce(acc, two, 2, nf, 1.0f);
				a->from[a->n++] = from[i];
				continue;
			}
			if (a->n + 1 < nw) {
				/* Kept where it was received; the slot gets a fresh buffer. */
				a->buf[a->n] = rx[i];
				a->from[a->n++] = from[i];
				rx[i] = pool_get(&pool);
				continue;
			}
			/* The last: the sum of the held contributions (or the accumulator) and
			 * this one, in one pass. */
			nheld = o->copy_first ? PBOX_MIN(a->n, 1u) : a->n;
			for (uint32_t w = 0; w < nheld; w++) {
				srcs[w] = (const float *)(const void *)(a->buf[w] + AGG_HDR);
			}
			srcs[nheld] = g;
			a->from[a->n] = from[i];
			res = out + (size_t)nout++ * o->size;
			memcpy(res, rx[i], AGG_HDR);
			k->reduce((float *)(void *)(res + AGG_HDR), srcs, nheld + 1, nf, (float)nw);
			for (uint32_t w = 0; w < nw; w++) {
				siov[ns] = (struct iovec){ .iov_base = res, .iov_len = a->len };
				memset(&sm[ns].msg_hdr, 0, sizeof(sm[ns].msg_hdr));
				sm[ns].msg_hdr.msg_name = &a->from[w];
				sm[ns].msg_hdr.msg_namelen = sizeof(a->from[w]);
				sm[ns].msg_hdr.msg_iov = &siov[ns];
				sm[ns].msg_hdr.msg_iovlen = 1;
				ns++;
			}
			for (uint32_t w = 0; w < nheld; w++) {
				pool_put(&pool, a->buf[w]);
			}
			a->n = 0;
		}
		for (unsigned done = 0; done < ns;) {
			int r = sendmmsg(e->fd, sm + done, ns - done, 0);

			if (r < 0) {
				if (errno == EINTR || errno == EAGAIN || errno == ENOBUFS) {
					continue;
				}
				fprintf(stderr, PROG ": echo sendmmsg: %s\n", strerror(errno));
				exit(1);
			}
			done += (unsigned)r;
		}
	}
	return NULL;
}

/* --reduce: every element of the result buffer is the mean of the workers' 1.0s. */
static int check_result(const float *dst, uint64_t bytes)
{
	for (uint64_t i = 0; i < bytes / sizeof(float); i++) {
		if (dst[i] != 1.0f) {
			fprintf(stderr, PROG ": result element %llu is %g, not 1\n",
				(unsigned long long)i, (double)dst[i]);
			return 1;
		}
	}
	return 0;
}

/* --reduce: take one result datagram (rb, len bytes) of iteration it; returns its payload
 * bytes, or 0 if it is not a result of this iteration (reported). */
static uint64_t take_result(const struct opts *o, unsigned it, const uint8_t *rb, uint32_t len,
			    uint8_t *dst)
{
	uint32_t pl = o->size - AGG_HDR;
	struct agg_hdr h;
	uint64_t off;

	if (len <= AGG_HDR) {
		fprintf(stderr, PROG ": a result of %u bytes, no payload\n", len);
		return 0;
	}
	/* (--ack's ACKs are taken by the caller) */
	memcpy(&h, rb, sizeof(h));
	off = (uint64_t)h.idx * pl;
	if (h.iter != it || off + (len - AGG_HDR) > o->bytes) {
		fprintf(stderr, PROG ": iteration %u: a result for iteration %u datagram %u\n", it,
			h.iter, h.idx);
		return 0;
	}
	if (o->deliver) {
		pbox_copy_stream(dst + off, rb + AGG_HDR, len - AGG_HDR);
	}
	return len - AGG_HDR;
}

/* One worker: --iters + --warmup exchanges of --bytes; fills secs[] (timed ones). With
 * --reduce, dst receives the results. */
static int worker(const struct opts *o, const uint16_t *ports, uint8_t *src, uint8_t *dst,
		  double *secs)
{
	int fd = open_sock(o->gso);
	unsigned burst = o->burst;
	uint32_t per = o->gso ? PBOX_MAX(1u, MAX_MSG / o->size) : 1;
	/* --reduce: a datagram is a header and size - AGG_HDR bytes of the gradient */
	uint32_t unit = o->reduce ? o->size - AGG_HDR : o->size;
	struct mmsghdr m[MAX_BURST], rm[MAX_BURST];
	struct iovec iov[2 * MAX_BURST], riov[MAX_BURST];
	struct sockaddr_in to[MAX_THREAD];
	union ctl tc[MAX_BURST], rc[MAX_BURST];
	static uint8_t hdr[MAX_BURST][AGG_HDR];
	uint32_t rbuflen = o->gso ? MAX_MSG : o->size;
	uint8_t *rbuf = malloc((size_t)burst * rbuflen);

	if (per > MAX_SEGS) {
		per = MAX_SEGS;
	}
	if (rbuf == NULL) {
		fprintf(stderr, PROG ": out of memory\n");
		return 1;
	}
	for (unsigned t = 0; t < o->threads; t++) {
		to[t] = (struct sockaddr_in){ .sin_family = AF_INET,
					      .sin_addr.s_addr = htonl(0x7f000001),
					      .sin_port = ports[t] };
	}
	for (unsigned it = 0; it < o->warmup + o->iters; it++) {
		uint64_t sent = 0, back = 0;
		unsigned next_t = 0;
		double t0 = pbox_mono_s(), last_rx = t0;

		while (back < o->bytes) {
			unsigned nm = 0;

			/* Send a burst of messages while the window has room. */
			while (nm < burst && sent < o->bytes && sent - back < o->window) {
				uint64_t left = o->bytes - sent;
				uint64_t room = o->window - (sent - back);
				uint32_t nseg = per, len;

				len = (uint32_t)PBOX_MIN(PBOX_MIN(left, (uint64_t)nseg * unit),
							 PBOX_MAX(room, (uint64_t)unit));
				len = (uint32_t)PBOX_MIN(len, left);
				memset(&m[nm].msg_hdr, 0, sizeof(m[nm].msg_hdr));
				m[nm].msg_hdr.msg_name = &to[next_t];
				m[nm].msg_hdr.msg_namelen = sizeof(to[next_t]);
				m[nm].msg_hdr.msg_iov = &iov[2 * nm];
				if (o->reduce) {
					struct agg_hdr h = { .iter = it,
							     .idx = (uint32_t)(sent / unit) };

					memcpy(hdr[nm], &h, sizeof(h));
					iov[2 * nm] = (struct iovec){ .iov_base = hdr[nm],
								      .iov_len = AGG_HDR };
					iov[2 * nm + 1] = (struct iovec){ .iov_base = src + sent,
									  .iov_len = len };
					m[nm].msg_hdr.msg_iovlen = 2;
				} else {
					iov[2 * nm] = (struct iovec){ .iov_base = src + sent,
								      .iov_len = len };
					m[nm].msg_hdr.msg_iovlen = 1;
				}
				if (len > o->size) {
					set_segment(&m[nm].msg_hdr, &tc[nm], (uint16_t)o->size);
				}
				next_t = (next_t + 1) % o->threads;
				sent += len;
				nm++;
			}
			for (unsigned done = 0; done < nm;) {
				int k = sendmmsg(fd, m + done, nm - done, 0);

				if (k < 0) {
					if (errno == EINTR || errno == EAGAIN || errno == ENOBUFS) {
						continue;
					}
					fprintf(stderr, PROG ": sendmmsg: %s\n", strerror(errno));
					return 1;
				}
				done += (unsigned)k;
			}
			/* Receive what came back: block for the first (briefly, to notice loss)
			 * when the window is full or everything is out, else just drain. */
			for (;;) {
				bool must = sent == o->bytes || sent - back >= o->window;
				int n;

				for (unsigned i = 0; i < burst; i++) {
					riov[i].iov_base = rbuf + (size_t)i * rbuflen;
					riov[i].iov_len = rbuflen;
					memset(&rm[i].msg_hdr, 0, sizeof(rm[i].msg_hdr));
					rm[i].msg_hdr.msg_iov = &riov[i];
					rm[i].msg_hdr.msg_iovlen = 1;
					if (o->gso) {
						rm[i].msg_hdr.msg_control = rc[i].buf;
						rm[i].msg_hdr.msg_controllen = sizeof(rc[i].buf);
					}
				}
				if (must) {
					struct pollfd p = { .fd = fd, .events = POLLIN };

					if (poll(&p, 1, 100) == 0) {
						if (pbox_mono_s() - last_rx > 1.0) {
							fprintf(stderr,
								PROG
								": iteration %u: %llu of %llu "
								"bytes never came back (lost)\n",
								it,
								(unsigned long long)(sent - back),
								(unsigned long long)o->bytes);
							return 1;
						}
						continue;
					}
				}
				n = recvmmsg(fd, rm, burst, MSG_DONTWAIT, NULL);
				if (n <= 0) {
					break;
				}
				for (int i = 0; i < n; i++) {
					uint64_t got = rm[i].msg_len;

					if (o->ack && rm[i].msg_len == AGG_HDR) {
						continue; /* an ACK: nothing comes back */
					}
					if (o->reduce) {
						got = take_result(o, it, riov[i].iov_base,
								  rm[i].msg_len, dst);
						if (got == 0) {
							return 1;
						}
					}
					back += got;
				}
				last_rx = pbox_mono_s();
				if (back >= o->bytes || (unsigned)n < burst) {
					break;
				}
			}
		}
		if (it >= o->warmup) {
			secs[it - o->warmup] = pbox_mono_s() - t0;
		}
	}
	close(fd);
	free(rbuf);
	if (o->reduce && o->deliver) {
		return check_result((const float *)(const void *)dst, o->bytes);
	}
	return 0;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: " PROG " [--bytes N] [--size N] [--workers N] [--threads N] [--burst N]\n"
		"       [--window N] [--iters N] [--warmup N] [--gso]\n"
		"       [--reduce [--no-copy] [--copy-first] [--ack] [--scan]] [--json]\n"
		"  --bytes   bytes exchanged per iteration by each worker (default 102228128,\n"
		"            the ResNet-50 gradient)\n"
		"  --size    datagram size, UDP payload bytes (default 32832: a 32 KB fragment\n"
		"            and pbox's 64-byte header)\n"
		"  --workers worker processes (default 2); --threads echo threads (default 2)\n"
		"  --burst   datagrams per recvmmsg / sendmmsg (default 32)\n"
		"  --window  bytes outstanding per worker (default 4M)\n"
		"  --iters   timed iterations (default 10); --warmup untimed ones (default 2)\n"
		"  --gso     UDP_SEGMENT sends and UDP_GRO receives\n"
		"  --reduce  aggregate: the echo threads sum (mean) each datagram of all workers\n"
		"            and send the one result to each; the workers copy the results into\n"
		"            a result buffer and check them (--size: a 64-byte header and a\n"
		"            multiple of 4 bytes of gradient; not with --gso)\n"
		"  --no-copy with --reduce: the results are left in the receive buffers, not\n"
		"            copied (the bound even for receiving every result in place)\n"
		"  --copy-first with --reduce: the echo copies each datagram's first contribution\n"
		"            into an accumulator and adds the others to it, as pboxd does, "
		"instead\n"
		"            of keeping the receive buffers (what keeping them saves)\n"
		"  --ack     with --reduce: a 64-byte ACK to each contribution that waits for\n"
		"            others, as pboxd sends (what those ACKs cost)\n"
		"  --scan    with --reduce: each contribution checked for NaN / Inf in a pass\n"
		"            of its own on arrival, as pboxd's \"reject\" does (what that costs)\n"
		"  --json    one JSON object on standard output\n");
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "bytes", required_argument, NULL, 'b' },
		{ "size", required_argument, NULL, 's' },
		{ "workers", required_argument, NULL, 'w' },
		{ "threads", required_argument, NULL, 't' },
		{ "burst", required_argument, NULL, 'B' },
		{ "window", required_argument, NULL, 'W' },
		{ "iters", required_argument, NULL, 'i' },
		{ "warmup", required_argument, NULL, 'u' },
		{ "gso", no_argument, NULL, 'g' },
		{ "reduce", no_argument, NULL, 'r' },
		{ "no-copy", no_argument, NULL, 'n' },
		{ "copy-first", no_argument, NULL, 'c' },
		{ "ack", no_argument, NULL, 'a' },
		{ "scan", no_argument, NULL, 'S' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct opts o = { .workers = 2,
			  .threads = 2,
			  .burst = 32,
			  .iters = 10,
			  .warmup = 2,
			  .bytes = 102228128ull,
			  .window = 4u << 20,
			  .size = 32832,
			  .deliver = true };
	uint16_t ports[MAX_THREAD];
	int fds[MAX_THREAD], go[2], res[2], c;
	pid_t echo_pid, wpid[MAX_WORKER];
	uint8_t *src;
	double *all;
	int rc = 0;

	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		uint64_t v = 0;
		int bad = 0;

		switch (c) {
		case 'b':
			bad = pbox_arg_size(PROG, "--bytes", optarg, 1, 1ull << 40, &o.bytes);
			break;
		case 's':
			bad = pbox_arg_size(PROG, "--size", optarg, 64, MAX_MSG, &v);
			o.size = (uint32_t)v;
			break;
		case 'w':
			bad = pbox_arg_u32(PROG, "--workers", optarg, 1, MAX_WORKER, &o.workers);
			break;
		case 't':
			bad = pbox_arg_u32(PROG, "--threads", optarg, 1, MAX_THREAD, &o.threads);
			break;
		case 'B':
			bad = pbox_arg_u32(PROG, "--burst", optarg, 1, MAX_BURST, &o.burst);
			break;
		case 'W':
			bad = pbox_arg_size(PROG, "--window", optarg, 1, 1ull << 32, &o.window);
			break;
		case 'i':
			bad = pbox_arg_u32(PROG, "--iters", optarg, 1, 500, &o.iters);
			break;
		case 'u':
			bad = pbox_arg_u32(PROG, "--warmup", optarg, 0, 1000, &o.warmup);
			break;
		case 'g':
			o.gso = true;
			break;
		case 'r':
			o.reduce = true;
			break;
		case 'n':
			o.deliver = false;
			break;
		case 'c':
			o.copy_first = true;
			break;
		case 'a':
			o.ack = true;
			break;
		case 'S':
			o.scan = true;
			break;
		case 'j':
			o.json = true;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
		if (bad != 0) {
			return 2;
		}
	}
	if (!o.reduce && (!o.deliver || o.copy_first || o.ack || o.scan)) {
		fprintf(stderr,
			PROG ": --no-copy, --copy-first, --ack and --scan go with --reduce\n");
		return 2;
	}
	if (o.reduce &&
	    (o.gso || o.size <= AGG_HDR || (o.size - AGG_HDR) % 4 != 0 || o.bytes % 4 != 0)) {
		fprintf(stderr,
			PROG ": --reduce needs --size of %u bytes of header and a multiple "
			     "of 4 bytes, --bytes a multiple of 4, and no --gso\n",
			AGG_HDR);
		return 2;
	}
	if (o.window < o.size) {
		o.window = o.size;
	}
	for (unsigned t = 0; t < o.threads; t++) {
		fds[t] = open_sock(o.gso);
		ports[t] = sock_port(fds[t]);
	}
	echo_pid = fork();
	if (echo_pid == 0) {
		struct echo e[MAX_THREAD];

		for (unsigned t = 0; t < o.threads; t++) {
			e[t] = (struct echo){ .fd = fds[t], .o = &o };
			pthread_create(&e[t].t, NULL, o.reduce ? agg_main : echo_main, &e[t]);
		}
		pthread_join(e[0].t, NULL);
		_exit(0);
	}
	for (unsigned t = 0; t < o.threads; t++) {
		close(fds[t]);
	}
	src = malloc(o.bytes);
	all = calloc((size_t)o.workers * o.iters, sizeof(*all));
	if (src == NULL || all == NULL || pipe(go) != 0 || pipe(res) != 0) {
		fprintf(stderr, PROG ": cannot allocate %llu bytes\n", (unsigned long long)o.bytes);
		kill(echo_pid, SIGKILL);
		return 1;
	}
	/* No page faults in the timed region. */
	if (o.reduce) {
		for (uint64_t i = 0; i < o.bytes / sizeof(float); i++) {
			((float *)(void *)src)[i] = 1.0f;
		}
	} else {
		memset(src, 1, o.bytes);
	}
	for (unsigned w = 0; w < o.workers; w++) {
		wpid[w] = fork();
		if (wpid[w] == 0) {
			char b;
			int r;

			close(go[1]);
			if (read(go[0], &b, 1) != 1) {
				_exit(1);
			}
			uint8_t *dst = NULL;

			if (o.reduce) {
				dst = malloc(o.bytes);
				if (dst == NULL) {
					fprintf(stderr, PROG ": cannot allocate %llu bytes\n",
						(unsigned long long)o.bytes);
					_exit(1);
				}
				memset(dst, 0, o.bytes);
			}
			r = worker(&o, ports, src, dst, all);
			if (r == 0 && write(res[1], all, sizeof(double) * o.iters) < 0) {
				r = 1;
			}
			_exit(r);
		}
	}
	close(go[0]);
	close(res[1]);
	/* All workers start together. */
	for (unsigned w = 0; w < o.workers; w++) {
		if (write(go[1], "g", 1) != 1) {
			rc = 1;
		}
	}
	/* Each worker writes its times in one write of at most 4000 bytes (<= PIPE_BUF:
	 * not interleaved); read until every worker has closed its end. */
	for (size_t got = 0, want = sizeof(double) * o.workers * o.iters; got < want;) {
		ssize_t k = read(res[0], (char *)all + got, want - got);

		if (k <= 0) {
			rc = 1;
			break;
		}
		got += (size_t)k;
	}
	for (unsigned w = 0; w < o.workers; w++) {
		int st;

		waitpid(wpid[w], &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			rc = 1;
		}
	}
	kill(echo_pid, SIGKILL);
	waitpid(echo_pid, NULL, 0);
	if (rc != 0) {
		fprintf(stderr, PROG ": a worker failed\n");
		free(src);
		free(all);
		return 1;
	}
	{
		double *s = malloc(sizeof(double) * o.workers * o.iters), sum = 0;
		unsigned n = o.workers * o.iters;

		if (s == NULL) {
			free(src);
			free(all);
			return 1;
		}
		memcpy(s, all, sizeof(double) * n);
		for (unsigned i = 0; i < n; i++) {
			sum += s[i];
		}
		qsort(s, n, sizeof(double), cmp_d);
		if (o.json) {
			printf("{\"workers\": %u, \"threads\": %u, \"size\": %u, \"burst\": %u, "
			       "\"gso\": %s, \"reduce\": %s, \"copy\": %s, \"copy_first\": %s, "
			       "\"ack\": %s, \"scan\": %s, \"bytes\": %llu, "
			       "\"window\": %llu, \"median_s\": "
			       "%.6f, "
			       "\"mean_s\": %.6f, \"min_s\": %.6f, \"iter_seconds\": [",
			       o.workers, o.threads, o.size, o.burst, o.gso ? "true" : "false",
			       o.reduce ? "true" : "false", o.deliver ? "true" : "false",
			       o.copy_first ? "true" : "false", o.ack ? "true" : "false",
			       o.scan ? "true" : "false", (unsigned long long)o.bytes,
			       (unsigned long long)o.window, s[n / 2], sum / n, s[0]);
			for (unsigned i = 0; i < n; i++) {
				printf("%s%.6f", i ? ", " : "", all[i]);
			}
			printf("]}\n");
		} else {
			printf("%u workers x %.1f MB in %u-byte datagrams%s, %u %s threads: "
			       "median %.4f s per exchange (mean %.4f, min %.4f), %.2f "
			       "exchanges/s per worker\n",
			       o.workers, (double)o.bytes / 1e6, o.size, o.gso ? " (GSO/GRO)" : "",
			       o.threads, o.reduce ? "aggregating" : "echo", s[n / 2], sum / n,
			       s[0], 1.0 / s[n / 2]);
		}
		free(s);
	}
	free(src);
	free(all);
	return 0;
}
