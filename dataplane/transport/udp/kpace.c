/* SPDX-License-Identifier: BSD-3-Clause */
/* Kernel pacing of the kernel-UDP transport: departure times, egress qdisc check (kpace.h). */
#include "kpace.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <linux/netlink.h>
#include <linux/pkt_sched.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int pbox_kpace_init(struct pbox_kpace *k, bool per_dst, uint64_t rate_Bps, uint64_t max_lead_ns)
{
	memset(k, 0, sizeof(*k));
	k->rate_Bps = rate_Bps;
	k->max_lead_ns = max_lead_ns ? max_lead_ns : PBOX_KPACE_DEFAULT_LEAD_NS;
	k->per_dst = per_dst;
	if (per_dst) {
		k->dst = calloc(PBOX_KPACE_MAX_DST, sizeof(*k->dst));
		if (k->dst == NULL) {
			return -ENOMEM;
		}
	}
	return 0;
}

void pbox_kpace_fini(struct pbox_kpace *k)
{
	free(k->dst);
	k->dst = NULL;
}

/* The timeline of ip:port: its table entry (linear probing over a few slots), or the
 * socket's when the neighbourhood is full. */
static uint64_t *timeline(struct pbox_kpace *k, uint32_t ip, uint16_t port)
{
	uint32_t h;

	if (!k->per_dst) {
		return &k->next_ns;
	}
	h = (ip * 2654435761u) ^ ((uint32_t)port * 40503u);
	for (uint32_t i = 0; i < 16; i++) {
		struct pbox_kpace_dst *d = &k->dst[(h + i) % PBOX_KPACE_MAX_DST];

		if (!d->used) {
			d->used = true;
			d->ip = ip;
			d->port = port;
			d->next_ns = 0;
			return &d->next_ns;
		}
		if (d->ip == ip && d->port == port) {
			return &d->next_ns;
		}
	}
	k->stats.shared++;
	return &k->next_ns;
}

uint64_t pbox_kpace_stamp(struct pbox_kpace *k, uint32_t ip, uint16_t port, uint64_t bytes,
			  uint64_t now)
{
	uint64_t *next, t, dt, lead;

	if (k->rate_Bps == 0) {
		return 0;
	}
	next = timeline(k, ip, port);
	t = *next > now ? *next : now;
	/* bytes / rate in ns without overflow for any message (< 2^17 B) and rate (> 0) */
	dt = bytes * 1000000000ull / k->rate_Bps;
	/* at a low rate one message takes longer than the lead: then two of them may wait */
	lead = k->max_lead_ns > 2 * dt ? k->max_lead_ns : 2 * dt;
	k->stats.stamped++;
	if (t > now) {
		k->stats.delayed++;
		if (t - now > k->stats.lead_max_ns) {
			k->stats.lead_max_ns = t - now;
		}
		if (t - now > lead) {
			t = now + lead;
			k->stats.capped++;
		}
	}
	*next = t + dt;
	return t;
}

bool pbox_kpace_env_on(void)
{
	const char *v = getenv("PBOX_KPACE");

	return v != NULL && strcmp(v, "1") == 0;
}

int pbox_kpace_parse_rate(const char *s, uint64_t *Bps)
{
	char *end;
	unsigned long long v;
	uint64_t mul = 1;

	if (s == NULL || *s < '0' || *s > '9') {
		return -EINVAL;
	}
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno != 0) {
		return -EINVAL;
	}
	if (*end == 'k' || *end == 'K') {
		mul = 1000;
		end++;
	} else if (*end == 'm' || *end == 'M') {
		mul = 1000000;
		end++;
	} else if (*end == 'g' || *end == 'G') {
		mul = 1000000000;
		end++;
	}
	if (strcmp(end, "") != 0 && strcmp(end, "bit") != 0) {
		return -EINVAL;
	}
	if (v == 0 || v > UINT64_MAX / mul) {
		return -EINVAL;
	}
	*Bps = (uint64_t)v * mul / 8;
	return *Bps > 0 ? 0 : -EINVAL;
}

/* ---- the egress check: which interfaces, and their qdiscs over rtnetlink ------------- */

#define MAX_IFS 64

struct ifq {
	unsigned index;
	char name[IF_NAMESIZE];
	bool paces;          /* an fq qdisc on it */
	bool etf;            /* an etf qdisc on it (see note_qdisc) */
	char root[IFNAMSIZ]; /* kind of its root qdisc ("" if none seen: noqueue) */
};

/* The interfaces carrying traffic from local_ip (0: all up, non-loopback, with IPv4). */
static int pick_ifs(uint32_t local_ip, struct ifq *ifs, unsigned *nifs, bool *loopback)
{
	struct ifaddrs *ia, *a;

	*nifs = 0;
	*loopback = false;
	if (getifaddrs(&ia) != 0) {
		return -errno;
	}
	for (a = ia; a != NULL; a = a->ifa_next) {
		uint32_t ip;
		unsigned idx;
		bool dup = false;

		if (a->ifa_addr == NULL || a->ifa_addr->sa_family != AF_INET ||
		    !(a->ifa_flags & IFF_UP)) {
			continue;
		}
		ip = ((const struct sockaddr_in *)(const void *)a->ifa_addr)->sin_addr.s_addr;
		if (local_ip != 0 && ip != local_ip) {
			continue;
		}
		if (a->ifa_flags & IFF_LOOPBACK) {
			*loopback = *loopback || local_ip != 0;
			continue;
		}
		idx = if_nametoindex(a->ifa_name);
		for (unsigned i = 0; i < *nifs; i++) {
			dup = dup || ifs[i].index == idx;
		}
		if (idx == 0 || dup || *nifs == MAX_IFS) {
			continue;
		}
		memset(&ifs[*nifs], 0, sizeof(ifs[*nifs]));
		ifs[*nifs].index = idx;
		snprintf(ifs[*nifs].name, sizeof(ifs[*nifs].name), "%s", a->ifa_name);
		(*nifs)++;
	}
	freeifaddrs(ia);
	return 0;
}

/* One RTM_NEWQDISC: note its kind on its interface. */
static void note_qdisc(const struct nlmsghdr *nh, struct ifq *ifs, unsigned nifs)
{
	const struct tcmsg *tc = NLMSG_DATA(nh);
	int alen = (int)nh->nlmsg_len - (int)NLMSG_LENGTH(sizeof(*tc));
	const struct rtattr *ra =
		(const struct rtattr *)((const char *)tc + NLMSG_ALIGN(sizeof(*tc)));

	if (alen < 0) {
		return;
	}
	for (; RTA_OK(ra, alen); ra = RTA_NEXT(ra, alen)) {
		char kind[IFNAMSIZ] = "";

		if (ra->rta_type != TCA_KIND) {
			continue;
		}
		snprintf(kind, sizeof(kind), "%.*s", (int)RTA_PAYLOAD(ra),
			 (const char *)RTA_DATA(ra));
		for (unsigned i = 0; i < nifs; i++) {
			if ((int)ifs[i].index != tc->tcm_ifindex) {
				continue;
			}
			/* Only fq honours CLOCK_MONOTONIC departure times. etf compares them
			 * with its own clock (CLOCK_TAI as it is set up) and drops a packet
			 * whose time is on another clock, already past, or missing: with etf
			 * on the egress, pbox's datagrams would be lost, not paced. */
			if (strcmp(kind, "fq") == 0) {
				ifs[i].paces = true;
			} else if (strcmp(kind, "etf") == 0) {
				ifs[i].etf = true;
			}
			if (tc->tcm_parent == TC_H_ROOT) {
				snprintf(ifs[i].root, sizeof(ifs[i].root), "%s", kind);
			}
		}
	}
}

/* Dump every qdisc (RTM_GETQDISC) and note fq / etf per interface. */
static int read_qdiscs(struct ifq *ifs, unsigned nifs)
{
	struct {
		struct nlmsghdr nh;
		struct tcmsg tc;
	} req = { .nh = { .nlmsg_len = NLMSG_LENGTH(sizeof(struct tcmsg)),
			  .nlmsg_type = RTM_GETQDISC,
			  .nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP,
			  .nlmsg_seq = 1 },
		  .tc = { .tcm_family = AF_UNSPEC } };
	struct sockaddr_nl sa = { .nl_family = AF_NETLINK };
	static const size_t buflen = 65536; /* above a dump message's most (32 KB) */
	char *buf = malloc(buflen);
	int fd, rc = 0;
	bool done = false;

	if (buf == NULL) {
		return -ENOMEM;
	}
	fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
	if (fd < 0) {
		rc = -errno;
		goto out;
	}
	if (sendto(fd, &req, req.nh.nlmsg_len, 0, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		rc = -errno;
		goto out;
	}
	while (!done) {
		ssize_t n = recv(fd, buf, buflen, 0);
		const struct nlmsghdr *nh;
		int left;

		if (n < 0) {
			if (errno == EINTR) {
				continue;
			}
			rc = -errno;
			goto out;
		}
		left = (int)n;
		for (nh = (const struct nlmsghdr *)(const void *)buf; NLMSG_OK(nh, left);
		     nh = NLMSG_NEXT(nh, left)) {
			if (nh->nlmsg_type == NLMSG_DONE) {
				done = true;
				break;
			}
			if (nh->nlmsg_type == NLMSG_ERROR) {
				const struct nlmsgerr *e = NLMSG_DATA(nh);

				rc = e->error < 0 ? e->error : -EIO;
				goto out;
			}
			if (nh->nlmsg_type == RTM_NEWQDISC) {
				note_qdisc(nh, ifs, nifs);
			}
		}
		if (n == 0) {
			break;
		}
	}
out:
	if (fd >= 0) {
		close(fd);
	}
	free(buf);
	return rc;
}

int pbox_kpace_route_src(uint32_t peer_ip, uint32_t *local)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(9) };
	socklen_t sl = sizeof(sa);
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	int rc = 0;

	if (fd < 0) {
		return -errno;
	}
	sa.sin_addr.s_addr = peer_ip;
	/* connect() on a UDP socket only looks the route up: nothing is sent */
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
	    getsockname(fd, (struct sockaddr *)&sa, &sl) != 0) {
		rc = -errno;
	} else {
		*local = sa.sin_addr.s_addr;
	}
	close(fd);
	return rc;
}

int pbox_kpace_egress(uint32_t local_ip, char *why, size_t len)
{
	struct ifq ifs[MAX_IFS];
	unsigned nifs = 0;
	bool loopback = false;
	int rc;
	size_t off = 0;

	if (len > 0) {
		why[0] = '\0';
	}
	rc = pick_ifs(local_ip, ifs, &nifs, &loopback);
	if (rc < 0) {
		snprintf(why, len, "cannot list the interfaces: %s", strerror(-rc));
		return rc;
	}
	if (nifs == 0) {
		snprintf(why, len,
			 loopback ? "loopback: lo has no fq, departure times are ignored"
				  : "no interface but loopback is up: departure times are ignored");
		return 0;
	}
	rc = read_qdiscs(ifs, nifs);
	if (rc < 0) {
		snprintf(why, len, "cannot read the qdiscs (rtnetlink): %s", strerror(-rc));
		return rc;
	}
	rc = 1;
	for (unsigned i = 0; i < nifs; i++) {
		int w;

		if (ifs[i].etf) {
			rc = 0;
			w = snprintf(why + off, len - off,
				     "%s%s: etf, which drops departure times that are not on its "
				     "clock (CLOCK_TAI) and unstamped datagrams: use fq",
				     off ? ", " : "", ifs[i].name);
		} else if (ifs[i].paces) {
			w = snprintf(why + off, len - off, "%s%s: fq", off ? ", " : "",
				     ifs[i].name);
		} else {
			rc = 0;
			w = snprintf(why + off, len - off, "%s%s: no fq (root qdisc %s)",
				     off ? ", " : "", ifs[i].name,
				     ifs[i].root[0] ? ifs[i].root : "noqueue");
		}
		if (w < 0 || (size_t)w >= len - off) {
			break;
		}
		off += (size_t)w;
	}
	return rc;
}
