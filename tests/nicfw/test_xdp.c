/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * nicfw unit tests on bpf_prog_test_run_opts (no NIC): every verdict of pbox_xdp.bpf.c
 * through the loader's map operations (each drop reason, pass or redirect for each owner
 * core, non-pbox traffic untouched, truncation at every offset, VLAN and QinQ, IPv4
 * options and fragments), and the loss injector's drop fraction and determinism. Needs
 * BPF (root or CAP_BPF + CAP_NET_ADMIN + CAP_NET_RAW); skips with the reason otherwise.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <net/if.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/if_ether.h>
#include <linux/if_link.h>
#include <linux/if_xdp.h>
#include <linux/ip.h>
#include <linux/udp.h>

#include <pbox/wire.h>

#include "loader.h"
#include "loss.skel.h"
#include "loss_abi.h"

#define PORT_LO   7100
#define NPORTS    2
#define DATA_ADDR "10.0.0.1"
#define JOB       7
#define NWORKERS  3
#define NCHUNKS   PBOX_XDP_MAX_CORES
#define PAYLOAD   256

static const uint64_t g_cookies[NWORKERS] = { 0xa1a1a1a1a1a1a1a1ull, 0xb2b2b2b2b2b2b2b2ull, 0 };
static struct pbox_xdp *g_x;

/* ---- frames ---- */

struct frame_spec {
	uint16_t vlans[2]; /* TPIDs of the tags, 0: none */
	unsigned ihl;      /* 5..15 */
	uint8_t proto;     /* IPPROTO_UDP */
	uint16_t frag_off; /* host order, as in the IPv4 header */
	uint32_t daddr;    /* network order */
	uint16_t dport;
	struct pbox_msg msg;
	uint32_t magic;  /* 0: PBOX_WIRE_MAGIC */
	uint8_t version; /* 0: PBOX_WIRE_VERSION */
	uint16_t payload;
};

static struct frame_spec push(uint32_t chunk, uint32_t rank, uint64_t cookie)
{
	struct frame_spec s = {
		.ihl = 5,
		.proto = IPPROTO_UDP,
		.daddr = inet_addr(DATA_ADDR),
		.dport = PORT_LO + 1,
		.payload = PAYLOAD,
	};

	s.msg.type = PBOX_MSG_PUSH;
	s.msg.encoding = PBOX_ENC_F32;
	s.msg.job = JOB;
	s.msg.sender = rank;
	s.msg.cookie = cookie;
	s.msg.chunk = chunk;
	s.msg.frag_len = PAYLOAD;
	s.msg.chunk_len = 4096;
	return s;
}

/* Build the frame into buf; returns its length. The headers are built in aligned locals
 * and copied: behind a 14-byte Ethernet header (or VLAN tags) they are not aligned in buf. */
static size_t build(const struct frame_spec *s, uint8_t *buf)
{
	struct ethhdr eth;
	size_t off = sizeof(eth), ip_off, udp_off;
	struct iphdr ip;
	struct udphdr udp;
	uint16_t proto = ETH_P_IP;
	struct pbox_wire_hdr h;

	memset(&eth, 0, sizeof(eth));
	memset(eth.h_dest, 0x02, ETH_ALEN);
	memset(eth.h_source, 0x04, ETH_ALEN);
	memcpy(buf, &eth, sizeof(eth));
	{
		size_t type_off = 12; /* the EtherType the next header is named in */

		for (int i = 0; i < 2 && s->vlans[i] != 0; i++) {
			buf[type_off] = (uint8_t)(s->vlans[i] >> 8);
			buf[type_off + 1] = (uint8_t)s->vlans[i];
			buf[off] = 0;
			buf[off + 1] = (uint8_t)(10 + i); /* VLAN id */
			type_off = off + 2;
			off += 4;
		}
		buf[type_off] = (uint8_t)(proto >> 8);
		buf[type_off + 1] = (uint8_t)proto;
	}
	ip_off = off;
	memset(&ip, 0, sizeof(ip));
	ip.version = 4;
	ip.ihl = s->ihl & 15;
	ip.ttl = 64;
	ip.protocol = s->proto;
	ip.saddr = inet_addr("10.0.0.2");
	ip.daddr = s->daddr;
	ip.frag_off = htons(s->frag_off);
	for (unsigned i = 20; i < s->ihl * 4; i++) {
		buf[ip_off + i] = 1; /* IPOPT_NOOP */
	}
	udp_off = ip_off + s->ihl * 4;
	memset(&udp, 0, sizeof(udp));
	udp.source = htons(40000);
	udp.dest = htons(s->dport);
	udp.len = htons((uint16_t)(sizeof(udp) + PBOX_WIRE_HDR_LEN + s->payload));
	udp.check = 0;
	memcpy(buf + udp_off, &udp, sizeof(udp));
	pbox_wire_encode(&s->msg, &h);
	if (s->magic != 0) {
		h.magic = htonl(s->magic);
	}
	if (s->version != 0) {
		h.version = s->version;
	}
	memcpy(buf + udp_off + sizeof(udp), &h, sizeof(h));
	memset(buf + udp_off + sizeof(udp) + PBOX_WIRE_HDR_LEN, 0x3c, s->payload);
	off = udp_off + sizeof(udp) + PBOX_WIRE_HDR_LEN + s->payload;
	ip.tot_len = htons((uint16_t)(off - ip_off));
	/* The fixed 20 bytes; options (ihl > 5) were written above, behind them. */
	memcpy(buf + ip_off, &ip, sizeof(ip));
	return off;
}

/* ---- running the program ---- */

static int test_run(int prog_fd, const void *data, size_t len, const struct xdp_md *ctx)
{
	uint8_t out[2048];
	LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = data, .data_size_in = (uint32_t)len,
		    .data_out = out, .data_size_out = sizeof(out), .ctx_in = ctx,
		    .ctx_size_in = ctx ? sizeof(*ctx) : 0, .repeat = 1);
	int rc = bpf_prog_test_run_opts(prog_fd, &opts);

	if (rc != 0) {
		return -errno;
	}
	/* The program never rewrites a frame it lets through. */
	if (opts.retval == XDP_PASS && (opts.data_size_out != len || memcmp(out, data, len) != 0)) {
		fail_msg("a passed frame of %zu bytes came out modified (%u bytes)", len,
			 opts.data_size_out);
	}
	return (int)opts.retval;
}

static int run_ctx(int prog_fd, const void *data, size_t len, struct xdp_md *ctx)
{
	if (ctx != NULL) {
		ctx->data = 0; /* the frame is data_in, whole */
		ctx->data_end = (uint32_t)len;
	}
	return test_run(prog_fd, data, len, ctx);
}

static int run(const void *data, size_t len)
{
	return run_ctx(pbox_xdp_prog_fd(g_x), data, len, NULL);
}

static struct pbox_xdp_stats g_before;

static void mark(void)
{
	assert_int_equal(pbox_xdp_stats_read(g_x, &g_before), 0);
}

/* The counters moved by exactly one frame, under the counter at byte offset field. */
static void expect_counted(size_t field)
{
	struct pbox_xdp_stats now;
	const uint64_t *a = (const uint64_t *)&g_before, *b = (const uint64_t *)&now;

	assert_int_equal(pbox_xdp_stats_read(g_x, &now), 0);
	for (size_t i = 0; i < sizeof(now) / 8; i++) {
		uint64_t want = i * 8 == field || i == 0 ? 1 : 0;

		if (b[i] - a[i] != want) {
			fail_msg("counter at offset %zu moved by %llu, expected %llu (field %zu)",
				 i * 8, (unsigned long long)(b[i] - a[i]), (unsigned long long)want,
				 field);
		}
	}
}

#define F(member) offsetof(struct pbox_xdp_stats, member)

/* Send s; expect verdict act counted under field. */
static void expect(const struct frame_spec *s, int act, size_t field)
{
	uint8_t buf[2048];
	size_t len = build(s, buf);

	mark();
	assert_int_equal(run(buf, len), act);
	expect_counted(field);
}

static void expect_drop(const struct frame_spec *s, enum pbox_drop_reason r)
{
	expect(s, XDP_DROP, F(drop[r]));
}

/* ---- fixtures ---- */

static int setup(void **state)
{
	struct pbox_xdp_opts o = {
		.ifname = NULL,
		.port_lo = PORT_LO,
		.nports = NPORTS,
		.data_addr = inet_addr(DATA_ADDR),
	};
	uint32_t core[NCHUNKS];

	(void)state;
	g_x = pbox_xdp_open(&o);
	if (g_x == NULL) {
		return -1;
	}
	/* Chunk c is owned by core c. */
	for (uint32_t c = 0; c < NCHUNKS; c++) {
		core[c] = c;
	}
	if (pbox_xdp_job_set(g_x, JOB, NWORKERS, g_cookies) != 0 ||
	    pbox_xdp_chunks_set(g_x, JOB, core, NCHUNKS) != 0) {
		return -1;
	}
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	pbox_xdp_close(g_x);
	g_x = NULL;
	return 0;
}

/* ---- tests ---- */

static void test_valid_passes_without_xsk(void **state)
{
	(void)state;
	for (uint32_t rank = 0; rank < 2; rank++) {
		struct frame_spec s = push(3, rank, g_cookies[rank]);

		expect(&s, XDP_PASS, F(core_pass[3]));
		s.msg.type = PBOX_MSG_PULL;
		s.msg.encoding = PBOX_ENC_NONE;
		s.payload = 0;
		s.msg.frag_len = 0;
		expect(&s, XDP_PASS, F(core_pass[3]));
	}
}

static void test_drop_reasons(void **state)
{
	struct frame_spec s;

	(void)state;
	s = push(0, 0, g_cookies[0]);
	s.magic = 0x50424f59;
	expect_drop(&s, PBOX_DROP_BAD_MAGIC);

	s = push(0, 0, g_cookies[0]);
	s.version = PBOX_WIRE_VERSION + 1;
	expect_drop(&s, PBOX_DROP_BAD_VERSION);

	s = push(0, 0, g_cookies[0]);
	s.msg.type = 0;
	expect_drop(&s, PBOX_DROP_BAD_TYPE);
	s.msg.type = PBOX_MSG_TYPE_MAX + 1;
	expect_drop(&s, PBOX_DROP_BAD_TYPE);

	s = push(0, 0, g_cookies[0]);
	s.msg.job = JOB + 1;
	expect_drop(&s, PBOX_DROP_UNKNOWN_JOB);

	/* Appliance-to-worker types and ranks beyond the job are not from a worker. */
	s = push(0, 0, g_cookies[0]);
	s.msg.type = PBOX_MSG_DATA;
	expect_drop(&s, PBOX_DROP_BAD_SENDER);
	s = push(0, NWORKERS, g_cookies[0]);
	expect_drop(&s, PBOX_DROP_BAD_SENDER);
	s = push(0, PBOX_SENDER_APPLIANCE, g_cookies[0]);
	expect_drop(&s, PBOX_DROP_BAD_SENDER);

	/* Another rank's cookie, a guess, 0, and a rank without a session. */
	s = push(0, 0, g_cookies[1]);
	expect_drop(&s, PBOX_DROP_BAD_COOKIE);
	s = push(0, 0, g_cookies[0] ^ 1);
	expect_drop(&s, PBOX_DROP_BAD_COOKIE);
	s = push(0, 0, 0);
	expect_drop(&s, PBOX_DROP_BAD_COOKIE);
	s = push(0, 2, 0);
	expect_drop(&s, PBOX_DROP_BAD_COOKIE);
	s = push(0, 2, g_cookies[0]);
	expect_drop(&s, PBOX_DROP_BAD_COOKIE);

	/* A datagram shorter than the pbox header. */
	s = push(0, 0, g_cookies[0]);
	{
		uint8_t buf[2048];
		size_t len = build(&s, buf);
		uint16_t ulen = htons(sizeof(struct udphdr) + PBOX_WIRE_HDR_LEN - 1);

		memcpy(buf + 14 + 20 + offsetof(struct udphdr, len), &ulen, sizeof(ulen));
		mark();
		assert_int_equal(run(buf, len), XDP_DROP);
		expect_counted(F(drop[PBOX_DROP_TRUNCATED]));
	}
}

/* A valid frame cut at every length: before the UDP header is complete nothing says it is
 * pbox's (passed, as the kernel would drop it anyway); from there on it is truncated. */
static void test_truncated_every_offset(void **state)
{
	struct frame_spec s = push(5, 1, g_cookies[1]);
	uint8_t buf[2048];
	size_t len = build(&s, buf), l4_end = 14 + 20 + 8;

	(void)state;
	for (size_t l = ETH_HLEN; l < len; l++) {
		mark();
		assert_int_equal(run(buf, l), l < l4_end ? XDP_PASS : XDP_DROP);
		expect_counted(l < l4_end ? F(pass_other) : F(drop[PBOX_DROP_TRUNCATED]));
	}
	/* Ethernet padding after the datagram is not a problem. */
	memset(buf + len, 0, 32);
	mark();
	assert_int_equal(run(buf, len + 32), XDP_PASS);
	expect_counted(F(core_pass[5]));
	/* Shorter than an Ethernet header: the kernel refuses to run it, or it passes. */
	for (size_t l = 1; l < ETH_HLEN; l++) {
		int r = run(buf, l);

		assert_true(r == -EINVAL || r == XDP_PASS);
	}
}

static void test_vlan(void **state)
{
	static const uint16_t tags[][2] = {
		{ ETH_P_8021Q, 0 },
		{ ETH_P_8021AD, 0 },
		{ ETH_P_8021AD, ETH_P_8021Q },
		{ ETH_P_8021Q, ETH_P_8021Q },
	};

	(void)state;
	for (size_t i = 0; i < sizeof(tags) / sizeof(tags[0]); i++) {
		struct frame_spec s = push(9, 0, g_cookies[0]);

		s.vlans[0] = tags[i][0];
		s.vlans[1] = tags[i][1];
		expect(&s, XDP_PASS, F(core_pass[9]));
		s.msg.cookie ^= 0xff;
		expect_drop(&s, PBOX_DROP_BAD_COOKIE);
		s.magic = 1;
		expect_drop(&s, PBOX_DROP_BAD_MAGIC);
	}
	/* A third tag is not parsed: the frame is not recognised, and passes. */
	{
		struct frame_spec s = push(9, 0, g_cookies[0] ^ 1);
		uint8_t buf[2048], three[2048];
		size_t len;

		s.vlans[0] = ETH_P_8021AD;
		s.vlans[1] = ETH_P_8021Q;
		len = build(&s, buf);
		memcpy(three, buf, 12);
		three[12] = 0x88;
		three[13] = 0xa8;
		three[14] = 0;
		three[15] = 7;
		memcpy(three + 16, buf + 12, len - 12);
		mark();
		assert_int_equal(run(three, len + 4), XDP_PASS);
		expect_counted(F(pass_other));
	}
}

static void test_ip_options(void **state)
{
	(void)state;
	for (unsigned ihl = 5; ihl <= 15; ihl++) {
		struct frame_spec s = push(11, 1, g_cookies[1]);

		s.ihl = ihl;
		expect(&s, XDP_PASS, F(core_pass[11]));
		s.msg.job = 99;
		expect_drop(&s, PBOX_DROP_UNKNOWN_JOB);
	}
	/* ihl below 5 is not IPv4 anyone accepts: passed to the kernel, which drops it. */
	{
		struct frame_spec s = push(11, 1, g_cookies[1]);
		uint8_t buf[2048];
		size_t len = build(&s, buf);

		buf[14] = 0x44;
		mark();
		assert_int_equal(run(buf, len), XDP_PASS);
		expect_counted(F(pass_other));
	}
}

static void test_fragments(void **state)
{
	struct frame_spec s;

	(void)state;
	/* First fragment: its header is checked, but it is never redirected. */
	s = push(1, 0, g_cookies[0]);
	s.frag_off = 0x2000;
	expect(&s, XDP_PASS, F(pass_fragment));
	s.msg.cookie = 42;
	expect_drop(&s, PBOX_DROP_BAD_COOKIE);
	/* A later fragment has no UDP header to judge. */
	s = push(1, 0, 42);
	s.frag_off = 0x2000 | 100;
	expect(&s, XDP_PASS, F(pass_fragment));
	s.frag_off = 100;
	expect(&s, XDP_PASS, F(pass_fragment));
}

static void test_not_pbox_passes(void **state)
{
	uint8_t buf[2048];
	struct frame_spec s;
	size_t len;

	(void)state;
	/* Garbage to other ports, other addresses, other protocols. */
	s = push(0, 0, 0);
	s.magic = 0xdeadbeef;
	s.dport = PORT_LO - 1;
	expect(&s, XDP_PASS, F(pass_other));
	s.dport = PORT_LO + NPORTS;
	expect(&s, XDP_PASS, F(pass_other));
	s.dport = 22;
	expect(&s, XDP_PASS, F(pass_other));
	s.dport = PORT_LO;
	s.daddr = inet_addr("10.0.0.9");
	expect(&s, XDP_PASS, F(pass_other));
	s.daddr = inet_addr(DATA_ADDR);
	s.proto = IPPROTO_TCP;
	expect(&s, XDP_PASS, F(pass_other));
	s.proto = IPPROTO_UDP;
	expect_drop(&s, PBOX_DROP_BAD_MAGIC); /* the same datagram to a data port */

	/* ARP. */
	len = build(&s, buf);
	buf[12] = 0x08;
	buf[13] = 0x06;
	mark();
	assert_int_equal(run(buf, 60), XDP_PASS);
	expect_counted(F(pass_other));

	/* IPv6 with a UDP header to a data port at the place IPv4's would be. */
	buf[12] = 0x86;
	buf[13] = 0xdd;
	mark();
	assert_int_equal(run(buf, len), XDP_PASS);
	expect_counted(F(pass_other));
}

/* Redirect to the owner core's socket when one is registered, for every core. */
static void test_redirect_each_core(void **state)
{
	int fds[PBOX_XDP_MAX_CORES];

	(void)state;
	for (uint32_t k = 0; k < PBOX_XDP_MAX_CORES; k++) {
		fds[k] = -1;
		if (k % 2 != 0) {
			continue; /* odd cores have no socket */
		}
		fds[k] = socket(AF_XDP, SOCK_RAW, 0);
		if (fds[k] < 0) {
			skip();
		}
		assert_int_equal(pbox_xdp_xsk_set(g_x, k, 0, fds[k]), 0);
	}
	for (uint32_t k = 0; k < PBOX_XDP_MAX_CORES; k++) {
		struct frame_spec s = push(k, 0, g_cookies[0]); /* chunk k: core k */

		if (k % 2 == 0) {
			expect(&s, XDP_REDIRECT, F(core_redirect[k]));
		} else {
			expect(&s, XDP_PASS, F(core_pass[k]));
		}
		/* Drops stay drops with a socket registered. */
		s.msg.cookie = 1;
		expect_drop(&s, PBOX_DROP_BAD_COOKIE);
	}
	/* A socket of core 2 on another RX queue does not take queue 0's frames. */
	assert_int_equal(pbox_xdp_xsk_clear(g_x, 2, 0), 0);
	assert_int_equal(pbox_xdp_xsk_set(g_x, 2, 1, fds[2]), 0);
	{
		struct frame_spec s = push(2, 0, g_cookies[0]);

		expect(&s, XDP_PASS, F(core_pass[2]));
	}
	assert_int_equal(pbox_xdp_xsk_set(g_x, PBOX_XDP_MAX_CORES, 0, fds[0]), -EINVAL);
	assert_int_equal(pbox_xdp_xsk_set(g_x, 0, PBOX_XDP_MAX_RXQ, fds[0]), -EINVAL);
	for (uint32_t k = 0; k < PBOX_XDP_MAX_CORES; k++) {
		pbox_xdp_xsk_clear(g_x, k, 0);
		pbox_xdp_xsk_clear(g_x, k, 1);
		if (fds[k] >= 0) {
			close(fds[k]);
		}
	}
}

/* The slot is the owner core's socket on the frame's RX queue: a veth with 66 RX queues
 * (in a network namespace of this process's own) gives test_run real queue indexes. Queues
 * beyond PBOX_XDP_MAX_RXQ go to the kernel. */
static void test_redirect_rx_queue(void **state)
{
	struct xdp_md ctx = { 0 };
	uint8_t buf[2048];
	struct frame_spec s = push(5, 1, g_cookies[1]); /* chunk 5: core 5 */
	size_t len = build(&s, buf);
	int fd;

	(void)state;
	if (unshare(CLONE_NEWNET) != 0 ||
	    system("ip link add xq0 numrxqueues 66 type veth peer name xq1 numrxqueues 66 && "
		   "ip link set xq0 up && ip link set xq1 up") != 0) {
		skip(); /* needs CAP_SYS_ADMIN and iproute2 */
	}
	ctx.ingress_ifindex = if_nametoindex("xq0");
	assert_true(ctx.ingress_ifindex != 0);
	fd = socket(AF_XDP, SOCK_RAW, 0);
	assert_true(fd >= 0);
	assert_int_equal(pbox_xdp_xsk_set(g_x, 5, 2, fd), 0);
	for (uint32_t q = 0; q < 4; q++) {
		ctx.rx_queue_index = q;
		mark();
		assert_int_equal(run_ctx(pbox_xdp_prog_fd(g_x), buf, len, &ctx),
				 q == 2 ? XDP_REDIRECT : XDP_PASS);
		expect_counted(q == 2 ? F(core_redirect[5]) : F(core_pass[5]));
	}
	for (uint32_t q = PBOX_XDP_MAX_RXQ; q < PBOX_XDP_MAX_RXQ + 2; q++) {
		ctx.rx_queue_index = q;
		mark();
		assert_int_equal(run_ctx(pbox_xdp_prog_fd(g_x), buf, len, &ctx), XDP_PASS);
		expect_counted(F(pass_queue));
	}
	/* Another core's chunk on queue 2 is not taken by core 5's socket. */
	s = push(6, 1, g_cookies[1]);
	len = build(&s, buf);
	ctx.rx_queue_index = 2;
	mark();
	assert_int_equal(run_ctx(pbox_xdp_prog_fd(g_x), buf, len, &ctx), XDP_PASS);
	expect_counted(F(core_pass[6]));
	assert_int_equal(pbox_xdp_xsk_clear(g_x, 5, 2), 0);
	close(fd);
}

/* The id of the XDP program on dev (0: none), from the kernel. */
static uint32_t attached_id(const char *dev)
{
	LIBBPF_OPTS(bpf_xdp_query_opts, q);

	assert_int_equal(bpf_xdp_query((int)if_nametoindex(dev), 0, &q), 0);
	return q.prog_id;
}

static uint32_t fd_prog_id(int fd)
{
	struct bpf_prog_info info;
	uint32_t len = sizeof(info);

	memset(&info, 0, sizeof(info));
	assert_int_equal(bpf_obj_get_info_by_fd(fd, &info, &len), 0);
	return info.id;
}

static uint32_t prog_id(const struct pbox_xdp *x)
{
	return fd_prog_id(pbox_xdp_prog_fd(x));
}

/* Make the program pinned under pins look as if its process had died. */
static void orphan(const char *pins)
{
	struct pbox_xdp_owner dead = { .start_time = 1 };
	char path[128];
	uint32_t key = 0;
	pid_t pid = fork();
	int fd;

	assert_true(pid >= 0);
	if (pid == 0) {
		_exit(0);
	}
	assert_int_equal(waitpid(pid, NULL, 0), pid);
	dead.pid = (uint32_t)pid;
	snprintf(path, sizeof(path), "%s/xq0/pbox_owner", pins);
	fd = bpf_obj_get(path);
	assert_true(fd >= 0);
	assert_int_equal(bpf_map_update_elem(fd, &key, &dead, BPF_ANY), 0);
	close(fd);
}

/* Attach, pins, replacement of a stale program, detach only of our own program, refusal
 * of a foreign one: on xq0 of test_redirect_rx_queue's namespace, pins in a bpffs of a
 * mount namespace of this process's own. */
static void test_attach(void **state)
{
	char root[] = "/tmp/pbox-test-bpffs-XXXXXX", pins[64], path[128];
	struct pbox_xdp_opts o = { .ifname = "xq0", .port_lo = PORT_LO, .nports = 1 };
	struct pbox_xdp *a, *b;
	struct pbox_loss_bpf *foreign;
	struct stat st;

	(void)state;
	if (if_nametoindex("xq0") == 0 || unshare(CLONE_NEWNS) != 0 ||
	    mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 || mkdtemp(root) == NULL) {
		skip();
	}
	assert_int_equal(mount("bpf", root, "bpf", 0, "mode=0700"), 0);
	snprintf(pins, sizeof(pins), "%s/pbox", root);
	o.pin_root = pins;

	/* Generic, then native (veth has native XDP) over the stale generic one. */
	o.mode = PBOX_XDP_MODE_GENERIC;
	a = pbox_xdp_open(&o);
	assert_non_null(a);
	assert_string_equal(pbox_xdp_attach_mode(a), "generic");
	assert_int_equal(attached_id("xq0"), prog_id(a));
	snprintf(path, sizeof(path), "%s/xq0/pbox_cookies", pins);
	assert_int_equal(stat(path, &st), 0);
	o.mode = PBOX_XDP_MODE_AUTO;
	/* Its owner (this process) runs: not replaced. */
	assert_null(pbox_xdp_open(&o));
	assert_int_equal(attached_id("xq0"), prog_id(a));
	orphan(pins);
	b = pbox_xdp_open(&o); /* a is stale now: as if its pboxd had died */
	assert_non_null(b);
	assert_string_equal(pbox_xdp_attach_mode(b), "native");
	assert_int_equal(attached_id("xq0"), prog_id(b));
	/* Closing the replaced one leaves the new one attached, and its pins. */
	pbox_xdp_close(a);
	assert_int_equal(attached_id("xq0"), prog_id(b));
	assert_int_equal(stat(path, &st), 0);
	/* Same mode: replaced in one step. */
	o.mode = PBOX_XDP_MODE_NATIVE;
	orphan(pins);
	a = pbox_xdp_open(&o);
	assert_non_null(a);
	assert_int_equal(attached_id("xq0"), prog_id(a));
	pbox_xdp_close(b);
	assert_int_equal(attached_id("xq0"), prog_id(a));
	pbox_xdp_close(a);
	assert_int_equal(attached_id("xq0"), 0);
	assert_int_not_equal(stat(path, &st), 0); /* pins removed */

	/* Someone else's program is left alone. */
	foreign = pbox_loss_bpf__open_and_load();
	assert_non_null(foreign);
	assert_int_equal(bpf_xdp_attach((int)if_nametoindex("xq0"),
					bpf_program__fd(foreign->progs.pbox_loss),
					XDP_FLAGS_SKB_MODE, NULL),
			 0);
	assert_null(pbox_xdp_open(&o));
	o.mode = PBOX_XDP_MODE_AUTO;
	assert_null(pbox_xdp_open(&o));
	assert_int_equal(attached_id("xq0"), fd_prog_id(bpf_program__fd(foreign->progs.pbox_loss)));
	bpf_xdp_detach((int)if_nametoindex("xq0"), XDP_FLAGS_SKB_MODE, NULL);
	pbox_loss_bpf__destroy(foreign);

	/* No such interface. */
	o.ifname = "nosuchif0";
	assert_null(pbox_xdp_open(&o));
	umount(root);
	rmdir(root);
}

/* The maps follow admissions: a new cookie replaces the old, a removed job is unknown, a
 * chunk without an owner goes to the kernel. */
static void test_admission_changes(void **state)
{
	uint64_t c2[NWORKERS] = { g_cookies[0], 0x5555, 0x7777 };
	uint32_t core[4] = { 1, 1, 1, 1 };
	struct frame_spec s;

	(void)state;
	assert_int_equal(pbox_xdp_job_set(g_x, JOB, NWORKERS, c2), 0);
	s = push(3, 1, g_cookies[1]);
	expect_drop(&s, PBOX_DROP_BAD_COOKIE);
	s = push(3, 1, 0x5555);
	expect(&s, XDP_PASS, F(core_pass[3]));
	s = push(3, 2, 0x7777);
	expect(&s, XDP_PASS, F(core_pass[3]));

	/* Chunk owners replaced: chunks 4.. have none now. */
	assert_int_equal(pbox_xdp_chunks_set(g_x, JOB, core, 4), 0);
	s = push(3, 0, g_cookies[0]);
	expect(&s, XDP_PASS, F(core_pass[1]));
	s = push(4, 0, g_cookies[0]);
	expect(&s, XDP_PASS, F(pass_no_owner));
	assert_int_equal(pbox_xdp_chunks_set(g_x, JOB + 1, core, 4), -ENOENT);

	/* A second job beside the first. */
	assert_int_equal(pbox_xdp_job_set(g_x, JOB + 1, 1, (uint64_t[]){ 0x99 }), 0);
	s = push(0, 0, 0x99);
	s.msg.job = JOB + 1;
	expect(&s, XDP_PASS, F(pass_no_owner));
	s.msg.cookie = g_cookies[0];
	expect_drop(&s, PBOX_DROP_BAD_COOKIE);

	assert_int_equal(pbox_xdp_job_remove(g_x, JOB + 1), 0);
	assert_false(pbox_xdp_job_known(g_x, JOB + 1));
	s.msg.cookie = 0x99;
	expect_drop(&s, PBOX_DROP_UNKNOWN_JOB);
	assert_int_equal(pbox_xdp_job_remove(g_x, JOB), 0);
	s = push(3, 1, 0x5555);
	expect_drop(&s, PBOX_DROP_UNKNOWN_JOB);

	/* Re-admitted with another geometry (a new session with more ranks). */
	{
		uint64_t c5[5] = { 1, 2, 3, 4, 5 };
		uint32_t all[NCHUNKS];

		assert_int_equal(pbox_xdp_job_set(g_x, JOB, 5, c5), 0);
		s = push(3, 4, 5);
		expect(&s, XDP_PASS, F(pass_no_owner));
		for (uint32_t c = 0; c < NCHUNKS; c++) {
			all[c] = c;
		}
		assert_int_equal(pbox_xdp_chunks_set(g_x, JOB, all, NCHUNKS), 0);
		expect(&s, XDP_PASS, F(core_pass[3]));
		/* Back to the fixture's state for the tests after this one. */
		assert_int_equal(pbox_xdp_job_remove(g_x, JOB), 0);
		assert_int_equal(pbox_xdp_job_set(g_x, JOB, NWORKERS, g_cookies), 0);
		assert_int_equal(pbox_xdp_chunks_set(g_x, JOB, all, NCHUNKS), 0);
	}
}

/* A small chunk-owner map: runs of slots are allocated first fit, refused when full,
 * reused after a job goes, and each job reads only its own run. */
static void test_chunk_capacity(void **state)
{
	struct pbox_xdp_opts o = { .port_lo = PORT_LO,
				   .nports = NPORTS,
				   .data_addr = inet_addr(DATA_ADDR),
				   .max_chunks = 20 }; /* 24 slots */
	struct pbox_xdp *keep = g_x;
	uint32_t ten[10], four[4] = { 9, 9, 9, 9 };
	struct frame_spec s;

	(void)state;
	g_x = pbox_xdp_open(&o);
	assert_non_null(g_x);
	for (uint32_t c = 0; c < 10; c++) {
		ten[c] = c;
	}
	for (uint32_t j = 1; j <= 3; j++) {
		assert_int_equal(pbox_xdp_job_set(g_x, j, 1, (uint64_t[]){ 100 + j }), 0);
	}
	assert_int_equal(pbox_xdp_chunks_set(g_x, 1, ten, 10), 0); /* slots 0..9 */
	assert_int_equal(pbox_xdp_chunks_set(g_x, 2, four, 4), 0); /* 10..13 */
	assert_int_equal(pbox_xdp_chunks_set(g_x, 3, ten, 10), 0); /* 14..23 */
	assert_int_equal(pbox_xdp_job_set(g_x, 4, 1, (uint64_t[]){ 104 }), 0);
	assert_int_equal(pbox_xdp_chunks_set(g_x, 4, ten, 10), -ENOSPC);
	s = push(7, 0, 104);
	s.msg.job = 4;
	expect(&s, XDP_PASS, F(pass_no_owner));
	assert_int_equal(pbox_xdp_job_remove(g_x, 1), 0);
	assert_int_equal(pbox_xdp_chunks_set(g_x, 4, ten, 10), 0); /* 0..9 again */
	expect(&s, XDP_PASS, F(core_pass[7]));
	s.msg.chunk = 10; /* beyond its chunks: no owner, not job 2's slot 10 */
	expect(&s, XDP_PASS, F(pass_no_owner));
	s = push(3, 0, 102);
	s.msg.job = 2;
	expect(&s, XDP_PASS, F(core_pass[9]));
	s = push(9, 0, 103);
	s.msg.job = 3;
	expect(&s, XDP_PASS, F(core_pass[9]));
	/* Owners replaced in place of the old run; an owner out of range refused. */
	assert_int_equal(pbox_xdp_chunks_set(g_x, 2, ten, 4), 0);
	s = push(3, 0, 102);
	s.msg.job = 2;
	expect(&s, XDP_PASS, F(core_pass[3]));
	ten[0] = PBOX_XDP_MAX_CORES;
	assert_int_equal(pbox_xdp_chunks_set(g_x, 2, ten, 4), -EINVAL);
	pbox_xdp_close(g_x);
	g_x = keep;
}

/* ---- the loss injector ---- */

static void loss_run(double p, uint64_t seed, uint32_t n, uint64_t *dropped)
{
	struct pbox_loss_bpf *sk = pbox_loss_bpf__open();
	struct pbox_loss_counters c;
	uint8_t frame[64] = { 0 };
	uint32_t key = 0;
	uint64_t want = 0;
	uint32_t thr = (uint32_t)fmin(p * 4294967296.0, 4294967295.0);

	assert_non_null(sk);
	sk->rodata->threshold = thr;
	sk->rodata->seed = seed;
	assert_int_equal(pbox_loss_bpf__load(sk), 0);
	{
		LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = frame,
			    .data_size_in = sizeof(frame), .repeat = n);

		assert_int_equal(
			bpf_prog_test_run_opts(bpf_program__fd(sk->progs.pbox_loss), &opts), 0);
	}
	assert_int_equal(bpf_map_lookup_elem(bpf_map__fd(sk->maps.loss_counters), &key, &c), 0);
	assert_int_equal(c.seq, n);
	/* The same decisions as the documented draw, frame by frame. */
	for (uint64_t i = 0; i < n; i++) {
		want += pbox_loss_draw(seed, i) < thr;
	}
	assert_int_equal(c.dropped, want);
	*dropped = c.dropped;
	pbox_loss_bpf__destroy(sk);
}

static void test_loss_fraction(void **state)
{
	const uint32_t n = 20000;
	uint64_t d1, d2, d3;

	(void)state;
	for (unsigned i = 0; i < 3; i++) {
		static const double ps[] = { 0.01, 0.1, 0.3 };
		double mean = ps[i] * n, sd = sqrt(n * ps[i] * (1 - ps[i]));

		loss_run(ps[i], 42, n, &d1);
		/* 6 standard deviations: a correct injector fails this about once in 10^9. */
		if (fabs((double)d1 - mean) > 6 * sd) {
			fail_msg("p=%.2f: %llu of %u dropped, expected %.0f +- %.0f", ps[i],
				 (unsigned long long)d1, n, mean, 6 * sd);
		}
	}
	/* Same seed, same drops; another seed, other drops (same statistics). */
	loss_run(0.1, 7, n, &d1);
	loss_run(0.1, 7, n, &d2);
	loss_run(0.1, 8, n, &d3);
	assert_int_equal(d1, d2);
	assert_true(d1 != d3);
	loss_run(0, 7, n, &d1);
	assert_int_equal(d1, 0);
	loss_run(1, 7, n, &d1);
	assert_true(d1 >= n - 1);
}

static int bpf_unavailable(char *why, size_t len)
{
	struct pbox_loss_bpf *sk = pbox_loss_bpf__open_and_load();

	if (sk == NULL) {
		snprintf(why, len, "cannot load a BPF program (%s): needs root or CAP_BPF",
			 strerror(errno));
		return 1;
	}
	pbox_loss_bpf__destroy(sk);
	return 0;
}

static int quiet(enum libbpf_print_level level, const char *fmt, va_list ap)
{
	(void)level;
	(void)fmt;
	(void)ap;
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_valid_passes_without_xsk),
		cmocka_unit_test(test_drop_reasons),
		cmocka_unit_test(test_truncated_every_offset),
		cmocka_unit_test(test_vlan),
		cmocka_unit_test(test_ip_options),
		cmocka_unit_test(test_fragments),
		cmocka_unit_test(test_not_pbox_passes),
		cmocka_unit_test(test_redirect_each_core),
		cmocka_unit_test(test_admission_changes),
		cmocka_unit_test(test_chunk_capacity),
		cmocka_unit_test(test_loss_fraction),
		/* Last: they move the process into namespaces of its own. */
		cmocka_unit_test(test_redirect_rx_queue),
		cmocka_unit_test(test_attach),
	};
	char why[256];

	libbpf_set_print(quiet);
	if (bpf_unavailable(why, sizeof(why))) {
		printf("SKIP: %s\n", why);
		return 77;
	}
	return cmocka_run_group_tests(tests, setup, teardown);
}
