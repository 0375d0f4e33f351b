/* SPDX-License-Identifier: BSD-3-Clause */
/* The AF_XDP transport's framing (dataplane/transport/afxdp/frame.h): frames it builds
 * parse back to the same datagram with checksums a byte-wise RFC 1071 reference accepts,
 * whatever the buffer boundaries; every malformed or foreign frame gets its verdict; the
 * afxdp configuration group's checks. */
#include <arpa/inet.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "pboxd/config.h"
#include "transport/afxdp/conf.h"
#include "transport/afxdp/frame.h"

#define MAXF 9100

static const struct pbox_afx_addr g_me = {
	.mac = { 0x02, 0, 0, 0, 0, 1 },
	.ip = 0x0100e80a, /* 10.232.0.1 in network order on a little-endian host */
	.port_lo = 7100,
	.nports = 2,
};

/* Byte-wise RFC 1071, the reference: big-endian 16-bit words. */
static uint16_t ref_sum(const uint8_t *p, size_t n, uint32_t acc)
{
	for (size_t i = 0; i < n; i++) {
		acc += (i & 1) ? p[i] : (uint32_t)p[i] << 8;
	}
	while (acc >> 16) {
		acc = (acc & 0xffff) + (acc >> 16);
	}
	return (uint16_t)acc;
}

static uint32_t fill(uint8_t *pay, uint32_t n, uint32_t seed)
{
	for (uint32_t i = 0; i < n; i++) {
		seed = seed * 1103515245u + 12345u;
		pay[i] = (uint8_t)(seed >> 16);
	}
	return seed;
}

/* A frame built as the transport builds it: headers, then the payload. */
static uint32_t build(uint8_t *f, const struct pbox_peer *to, const uint8_t *pay, uint32_t n)
{
	struct pbox_iov v = { pay, n };

	pbox_afx_build(f, &g_me, 7101, to, n, 77, pbox_afx_csum_iov(&v, 1));
	memcpy(f + PBOX_AFX_HDR_LEN, pay, n);
	return PBOX_AFX_HDR_LEN + n;
}

static const struct pbox_peer g_worker = {
	.ip = 0x0b00e80a, /* 10.232.0.11 */
	.port = 0x3930,   /* 12345 */
	.mac = { 0x02, 0, 0, 0, 0, 0x11 },
};

/* A worker's datagram to me (swap the roles). */
static uint32_t build_in(uint8_t *f, uint16_t dport, const uint8_t *pay, uint32_t n)
{
	struct pbox_afx_addr w = { .ip = g_worker.ip };
	struct pbox_peer me = { .ip = g_me.ip, .port = htons(dport) };
	struct pbox_iov v = { pay, n };

	memcpy(w.mac, g_worker.mac, 6);
	memcpy(me.mac, g_me.mac, 6);
	pbox_afx_build(f, &w, ntohs(g_worker.port), &me, n, 9, pbox_afx_csum_iov(&v, 1));
	memcpy(f + PBOX_AFX_HDR_LEN, pay, n);
	return PBOX_AFX_HDR_LEN + n;
}

static enum pbox_afx_verdict parse1(const uint8_t *f, uint32_t len, struct pbox_afx_rx *r)
{
	struct pbox_iov v = { f, len };

	return pbox_afx_parse(&v, 1, &g_me, r);
}

static void test_build_checksums(void **state)
{
	static uint8_t f[MAXF], pay[MAXF];
	uint32_t seed = 1;

	(void)state;
	for (uint32_t n = 0; n < 9000; n += n < 80 ? 1 : 997) {
		uint32_t len;

		seed = fill(pay, n, seed);
		len = build(f, &g_worker, pay, n);
		/* IPv4 header sums to 0xffff; UDP with its pseudo-header too. */
		assert_int_equal(ref_sum(f + 14, 20, 0), 0xffff);
		{
			uint32_t ps = ref_sum(f + 26, 8, 0) + 17 + 8 + n;

			assert_int_equal(ref_sum(f + 34, 8 + n, ps), 0xffff);
		}
		assert_memory_equal(f, g_worker.mac, 6);
		assert_memory_equal(f + 6, g_me.mac, 6);
		assert_int_equal(f[12] << 8 | f[13], 0x0800);
		assert_int_equal(f[14 + 6] & 0x40, 0x40); /* DF */
		assert_int_equal(f[14 + 2] << 8 | f[14 + 3], 28 + n);
		assert_int_equal(f[34] << 8 | f[35], 7101);
		assert_memory_equal(f + 36, &g_worker.port, 2);
		assert_int_equal(len, 42 + n);
	}
}

static void test_csum_iov_splits(void **state)
{
	static uint8_t buf[3000];
	struct pbox_iov whole = { buf, sizeof(buf) };
	uint16_t want;

	(void)state;
	fill(buf, sizeof(buf), 7);
	want = pbox_afx_csum_iov(&whole, 1);
	/* The reference gives the sum in network order; the iov sum is in memory order. */
	assert_int_equal(htons(ref_sum(buf, sizeof(buf), 0)), want);
	for (uint32_t a = 0; a < 40; a++) {
		for (uint32_t b = a; b < 80; b += 3) {
			struct pbox_iov v[3] = { { buf, a },
						 { buf + a, b - a },
						 { buf + b, sizeof(buf) - b } };

			assert_int_equal(pbox_afx_csum_iov(v, 3), want);
		}
	}
}

static void test_parse_roundtrip_segments(void **state)
{
	static uint8_t f[MAXF], pay[MAXF];
	struct pbox_afx_rx r;

	(void)state;
	for (uint32_t n = 0; n < 9000; n += n < 70 ? 1 : 1499) {
		uint32_t len;

		fill(pay, n, n + 3);
		len = build_in(f, 7101, pay, n);
		assert_int_equal(parse1(f, len, &r), PBOX_AFX_OK);
		assert_int_equal(r.off, 42);
		assert_int_equal(r.len, n);
		assert_int_equal(r.dport, 7101);
		assert_int_equal(r.from.ip, g_worker.ip);
		assert_int_equal(r.from.port, g_worker.port);
		assert_memory_equal(r.from.mac, g_worker.mac, 6);
		/* Ethernet padding after the datagram is ignored. */
		assert_int_equal(parse1(f, len + 4, &r), PBOX_AFX_OK);
		assert_int_equal(r.len, n);
		/* The same bytes in chained buffers, cut anywhere after the headers. */
		for (uint32_t cut = 42; cut < len; cut += cut < 60 ? 1 : 701) {
			struct pbox_iov v[3] = { { f, cut },
						 { f + cut, (len - cut) / 2 },
						 { f + cut + (len - cut) / 2,
						   len - cut - (len - cut) / 2 } };

			assert_int_equal(pbox_afx_parse(v, 3, &g_me, &r), PBOX_AFX_OK);
			assert_int_equal(r.len, n);
			f[len - 1] ^= 0x10;
			assert_int_equal(pbox_afx_parse(v, 3, &g_me, &r),
					 n ? PBOX_AFX_BAD_UDP_CSUM : PBOX_AFX_OK);
			f[len - 1] ^= 0x10;
		}
	}
}

static void test_parse_verdicts(void **state)
{
	static uint8_t f[2000], pay[1400];
	struct pbox_afx_rx r;
	uint32_t len;

	(void)state;
	fill(pay, sizeof(pay), 5);
	len = build_in(f, 7100, pay, sizeof(pay));
	assert_int_equal(parse1(f, len, &r), PBOX_AFX_OK);
	/* Cut short anywhere: never accepted. */
	for (uint32_t n = 0; n < len; n++) {
		enum pbox_afx_verdict v = parse1(f, n, &r);

		assert_true(v == PBOX_AFX_TRUNCATED || (n < 14 && v == PBOX_AFX_NOT_OURS));
	}
	/* A payload byte flipped: the UDP checksum. */
	f[100] ^= 1;
	assert_int_equal(parse1(f, len, &r), PBOX_AFX_BAD_UDP_CSUM);
	f[100] ^= 1;
	/* No checksum (0), and a sender's unfinished offload (the pseudo-header sum): both
	 * accepted, as the kernel does. */
	{
		uint8_t save[2];
		uint32_t ps = ref_sum(f + 26, 8, 0) + 17 + 8 + sizeof(pay);
		uint16_t partial = htons(ref_sum(NULL, 0, ps));

		memcpy(save, f + 40, 2);
		memset(f + 40, 0, 2);
		f[100] ^= 1;
		assert_int_equal(parse1(f, len, &r), PBOX_AFX_OK);
		memcpy(f + 40, &partial, 2);
		assert_int_equal(parse1(f, len, &r), PBOX_AFX_OK);
		f[100] ^= 1;
		memcpy(f + 40, save, 2);
	}
	/* The IPv4 header checksum. */
	f[14 + 8] = 63;
	assert_int_equal(parse1(f, len, &r), PBOX_AFX_BAD_IP_CSUM);
	f[14 + 8] = 64;
	/* Other port, address, protocol, ethertype, VLAN: not ours. */
	len = build_in(f, 7102, pay, 100);
	assert_int_equal(parse1(f, len, &r), PBOX_AFX_NOT_OURS);
	len = build_in(f, 7099, pay, 100);
	assert_int_equal(parse1(f, len, &r), PBOX_AFX_NOT_OURS);
	len = build_in(f, 7101, pay, 100);
	f[14 + 16] ^= 1;
	assert_int_equal(parse1(f, len, &r), PBOX_AFX_NOT_OURS);
	f[14 + 16] ^= 1;
	f[14 + 9] = 6;
	assert_int_equal(parse1(f, len, &r), PBOX_AFX_NOT_OURS);
	f[14 + 9] = 17;
	f[12] = 0x08;
	f[13] = 0x06; /* ARP */
	assert_int_equal(parse1(f, len, &r), PBOX_AFX_NOT_OURS);
	f[12] = 0x81;
	f[13] = 0x00; /* 802.1Q */
	assert_int_equal(parse1(f, len, &r), PBOX_AFX_NOT_OURS);
	f[12] = 0x08;
	f[13] = 0x00;
	/* A fragment (more fragments set), and a later one. */
	f[14 + 6] = 0x20;
	assert_int_equal(parse1(f, len, &r), PBOX_AFX_FRAGMENT);
	f[14 + 6] = 0x00;
	f[14 + 7] = 0x10;
	assert_int_equal(parse1(f, len, &r), PBOX_AFX_FRAGMENT);
	f[14 + 7] = 0;
	f[14 + 6] = 0x40;
	/* Lengths past the frame; a UDP length shorter than its header. */
	assert_int_equal(parse1(f, len - 1, &r), PBOX_AFX_TRUNCATED);
	f[38] = 0;
	f[39] = 7;
	assert_int_equal(parse1(f, len, &r), PBOX_AFX_TRUNCATED);
	assert_int_equal(pbox_afx_parse(NULL, 0, &g_me, &r), PBOX_AFX_TRUNCATED);
	assert_string_equal(pbox_afx_verdict_name(PBOX_AFX_BAD_UDP_CSUM), "bad_udp_checksum");
}

static void test_conf_check(void **state)
{
	struct pbox_afxdp_cfg ac;
	char err[256];

	(void)state;
	pbox_afxdp_conf_defaults(&ac);
	assert_int_equal(pbox_afxdp_conf_check(&ac, "f", 1, "10.0.0.1", "", 1500, err, sizeof(err)),
			 -EINVAL);
	assert_non_null(strstr(err, "afxdp.interface"));
	snprintf(ac.interface, sizeof(ac.interface), "eth1");
	assert_int_equal(pbox_afxdp_conf_check(&ac, "f", 1, "10.0.0.1", "", 1500, err, sizeof(err)),
			 0);
	assert_int_equal(
		pbox_afxdp_conf_check(&ac, "f", 1, "10.0.0.1", "eth1", 9000, err, sizeof(err)), 0);
	assert_int_equal(
		pbox_afxdp_conf_check(&ac, "f", 1, "127.0.0.1", "", 1500, err, sizeof(err)),
		-EINVAL);
	assert_non_null(strstr(err, "data_address"));
	assert_int_equal(
		pbox_afxdp_conf_check(&ac, "f", 1, "10.0.0.1", "eth2", 1500, err, sizeof(err)),
		-EINVAL);
	assert_non_null(strstr(err, "differs"));
	ac.nqueues = 2;
	ac.queues[0] = 3;
	ac.queues[1] = 3;
	assert_int_equal(pbox_afxdp_conf_check(&ac, "f", 3, "10.0.0.1", "", 1500, err, sizeof(err)),
			 -EINVAL);
	assert_non_null(strstr(err, "2 queues for 3 cores"));
	assert_int_equal(pbox_afxdp_conf_check(&ac, "f", 2, "10.0.0.1", "", 1500, err, sizeof(err)),
			 -EINVAL);
	assert_non_null(strstr(err, "queue 3 is given to cores 0 and 1"));
	ac.nqueues = 0;
	ac.frames = ac.fill_size;
	assert_int_equal(pbox_afxdp_conf_check(&ac, "f", 1, "10.0.0.1", "", 1500, err, sizeof(err)),
			 -EINVAL);
	assert_non_null(strstr(err, "fill_size"));
}

/* Load text as a pboxd configuration file; 0 or the loader's -errno, err filled. */
static int load(const char *text, struct pboxd_config *cfg, char *err, size_t len)
{
	char path[] = "/tmp/pbox-afxdp-conf-XXXXXX";
	int fd = mkstemp(path), rc;

	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	pboxd_config_defaults(cfg);
	rc = pboxd_config_load(cfg, path, err, len);
	if (rc == 0) {
		rc = pboxd_config_check(cfg, err, len);
	}
	unlink(path);
	return rc;
}

static void test_conf_file(void **state)
{
	struct pboxd_config cfg;
	char err[512];

	(void)state;
	if (load("appliance = { transport = \"afxdp\"; data_address = \"10.0.0.1\"; afxdp = { "
		 "interface = \"eth1\"; }; };\n",
		 &cfg, err, sizeof(err)) != 0) {
		/* A build without libxdp: the transport is refused by name, with the reason. */
		assert_non_null(strstr(err, "transport 'afxdp' is not available"));
		pboxd_config_free(&cfg);
		skip();
	}
	pboxd_config_free(&cfg);
	assert_int_equal(load("appliance = { transport = \"afxdp\"; data_address = "
			      "\"10.0.0.1\"; cores = 2; afxdp = { interface = \"eth1\"; "
			      "queues = [3, 5]; zero_copy = \"off\"; frame_size = 2048; frames = "
			      "1024; fill_size = 512; busy_poll = true; }; };\n",
			      &cfg, err, sizeof(err)),
			 0);
	assert_string_equal(cfg.afxdp.interface, "eth1");
	assert_int_equal(cfg.afxdp.nqueues, 2);
	assert_int_equal(cfg.afxdp.queues[1], 5);
	assert_int_equal(cfg.afxdp.zero_copy, PBOX_AFXDP_ZC_OFF);
	assert_int_equal(cfg.afxdp.frame_size, 2048);
	assert_true(cfg.afxdp.busy_poll);
	pboxd_config_free(&cfg);
	/* Each mistake named with its line and setting. */
	assert_int_equal(load("appliance = {\n afxdp = { interface = \"eth1\"; fill_size = "
			      "1000; }; };\n",
			      &cfg, err, sizeof(err)),
			 -EINVAL);
	assert_non_null(strstr(err, ":2: appliance.afxdp.fill_size: must be a power of two"));
	pboxd_config_free(&cfg);
	assert_int_equal(load("appliance = { afxdp = { interface = \"eth1\"; rings = 4; }; };\n",
			      &cfg, err, sizeof(err)),
			 -EINVAL);
	assert_non_null(strstr(err, "rings"));
	pboxd_config_free(&cfg);
	assert_int_equal(load("appliance = { afxdp = { zero_copy = \"maybe\"; }; };\n", &cfg, err,
			      sizeof(err)),
			 -EINVAL);
	assert_non_null(strstr(err, "zero_copy"));
	pboxd_config_free(&cfg);
	assert_int_equal(
		load("appliance = { afxdp = { queues = [64]; }; };\n", &cfg, err, sizeof(err)),
		-EINVAL);
	assert_non_null(strstr(err, "queue 64 out of range"));
	pboxd_config_free(&cfg);
	/* The filter may be named, but only on the same interface. */
	assert_int_equal(load("appliance = { transport = \"afxdp\"; data_address = \"10.0.0.1\"; "
			      "xdp = { interface = \"eth2\"; }; afxdp = { interface = \"eth1\"; "
			      "}; };\n",
			      &cfg, err, sizeof(err)),
			 -EINVAL);
	assert_non_null(strstr(err, "differs from afxdp.interface"));
	pboxd_config_free(&cfg);
	/* xdp = {...} with transport dpdk stays refused; with afxdp it is allowed. */
	assert_int_equal(load("appliance = { transport = \"afxdp\"; data_address = \"10.0.0.1\"; "
			      "xdp = { interface = \"eth1\"; mode = \"generic\"; }; afxdp = { "
			      "interface = \"eth1\"; }; };\n",
			      &cfg, err, sizeof(err)),
			 0);
	pboxd_config_free(&cfg);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_build_checksums),
		cmocka_unit_test(test_csum_iov_splits),
		cmocka_unit_test(test_parse_roundtrip_segments),
		cmocka_unit_test(test_parse_verdicts),
		cmocka_unit_test(test_conf_check),
		cmocka_unit_test(test_conf_file),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
