/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz harness of nicfw/pbox_xdp.bpf.c, run in the kernel by bpf_prog_test_run_opts (needs
 * BPF: root; without it the harness prints SKIP and exits 77). The program is loaded once
 * with one admitted job (2 ranks with known cookies, chunks on 2 cores).
 *
 * Input grammar: byte 0 picks the framing. Bit 7 set: the rest is a raw frame, fed as is
 * (the Ethernet/VLAN/IPv4/UDP parser on arbitrary bytes). Bit 7 clear: the rest is a UDP
 * payload (a datagram to the appliance), wrapped in Ethernet with (bits 0-1) % 3 VLAN
 * tags, IPv4 with ihl 5 + bits 2-3, to data port PORT_LO + bit 4, bit 5: the frame cut 1..16
 * bytes short (byte 1 gives how much, then the datagram starts at byte 2).
 *
 * Invariants (the filter may only drop what pboxd's engine drops too):
 *  - the verdict is XDP_PASS or XDP_DROP (no socket is registered), and exactly one
 *    counter besides rx moves;
 *  - a datagram of a whole frame that the filter drops is refused by pbox_wire_validate()
 *    against the same job, and for the header-level reasons the filter checks in the
 *    engine's order (truncated, bad_magic, bad_version, bad_type) with the same reason;
 *  - a valid datagram (pbox_wire_validate accepts it) is passed to the core that owns its
 *    chunk.
 */
#include <arpa/inet.h>
#include <errno.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/bpf.h>

#include "common/jobdesc.h"
#include "common/wire_check.h"
#include "fuzz.h"
#include "loader.h"

#define PORT_LO  7100
#define NWORKERS 2
#define JOB      3

static struct pbox_xdp *g_x;
static struct pbox_jobdesc g_desc;
static const uint64_t g_cookies[NWORKERS] = { 0x1111222233334444ull, 0x5555666677778888ull };
static struct pbox_wire_job g_job;

static const struct pbox_wire_job *lookup(void *arg, uint32_t job)
{
	(void)arg;
	return job == JOB ? &g_job : NULL;
}

static int quiet(enum libbpf_print_level level, const char *fmt, va_list ap)
{
	(void)level;
	(void)fmt;
	(void)ap;
	return 0;
}

static void init(void)
{
	static const struct pbox_keyspec keys[] = { { 1, 3000 }, { 2, 17 } };
	struct pbox_xdp_opts o = { .port_lo = PORT_LO, .nports = 2 };
	uint32_t core[64];
	char err[256];

	libbpf_set_print(quiet);
	g_x = pbox_xdp_open(&o);
	if (g_x == NULL) {
		printf("SKIP: cannot load the XDP program (needs root or CAP_BPF)\n");
		exit(77);
	}
	FUZZ_CHECK(pbox_jobdesc_build(&g_desc, keys, 2, NWORKERS, 2, 4096, 1024, NULL, err,
				      sizeof(err)) == 0,
		   "%s", err);
	FUZZ_CHECK(g_desc.nchunks <= 64, "%u chunks", g_desc.nchunks);
	for (uint32_t c = 0; c < g_desc.nchunks; c++) {
		core[c] = g_desc.chunks[c].core;
	}
	FUZZ_CHECK(pbox_xdp_job_set(g_x, JOB, NWORKERS, g_cookies) == 0, "job_set");
	FUZZ_CHECK(pbox_xdp_chunks_set(g_x, JOB, core, g_desc.nchunks) == 0, "chunks_set");
	g_job = (struct pbox_wire_job){ .id = JOB, .desc = &g_desc, .cookies = g_cookies };
}

/* Which counter moved (byte offset in struct pbox_xdp_stats), after checking it is one. */
static size_t moved(const struct pbox_xdp_stats *a, const struct pbox_xdp_stats *b)
{
	const uint64_t *x = (const uint64_t *)a, *y = (const uint64_t *)b;
	size_t which = 0, n = 0;

	FUZZ_CHECK(y[0] - x[0] == 1, "rx moved by %llu", (unsigned long long)(y[0] - x[0]));
	for (size_t i = 1; i < sizeof(*a) / 8; i++) {
		if (y[i] != x[i]) {
			FUZZ_CHECK(y[i] - x[i] == 1, "counter %zu moved by %llu", i * 8,
				   (unsigned long long)(y[i] - x[i]));
			which = i * 8;
			n++;
		}
	}
	FUZZ_CHECK(n == 1, "%zu counters moved", n);
	return which;
}

#define OFF(member) offsetof(struct pbox_xdp_stats, member)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint8_t frame[9216];
	struct pbox_xdp_stats before, after;
	const uint8_t *dgram = NULL;
	size_t len = 0, dlen = 0, cut = 0, which;
	struct fz f;
	uint8_t mode;
	int rc;

	if (g_x == NULL) {
		init();
	}
	fz_init(&f, data, size);
	mode = fz_u8(&f);
	if (mode & 0x80) {
		const uint8_t *rest = fz_rest(&f, &len);

		len = len < sizeof(frame) ? len : sizeof(frame);
		memcpy(frame, rest, len);
	} else {
		unsigned ntags = (mode & 3) % 3, ihl = 5 + ((mode >> 2) & 3), off = 12;
		uint16_t udp_len;

		if (mode & 0x20) {
			cut = 1 + fz_below(&f, 16);
		}
		dgram = fz_rest(&f, &dlen);
		if (dlen > 8000) {
			dlen = 8000;
		}
		memset(frame, 0, 64);
		frame[0] = 0x02;
		frame[6] = 0x04;
		for (unsigned t = 0; t < ntags; t++) {
			frame[off] = t == 0 && ntags == 2 ? 0x88 : 0x81;
			frame[off + 1] = t == 0 && ntags == 2 ? 0xa8 : 0x00;
			frame[off + 3] = (uint8_t)(t + 1);
			off += 4;
		}
		frame[off] = 0x08;
		frame[off + 1] = 0x00;
		off += 2;
		memset(frame + off, 1, ihl * 4); /* options: NOP */
		frame[off] = (uint8_t)(0x40 | ihl);
		frame[off + 1] = 0;
		{
			uint16_t tot = htons((uint16_t)(ihl * 4 + 8 + dlen));

			memcpy(frame + off + 2, &tot, 2);
		}
		memset(frame + off + 4, 0, 4); /* id, no fragmentation */
		frame[off + 8] = 64;
		frame[off + 9] = 17;
		memset(frame + off + 10, 0, 2);
		memcpy(frame + off + 12, (uint8_t[]){ 10, 0, 0, 2, 10, 0, 0, 1 }, 8);
		off += ihl * 4;
		{
			uint16_t sport = htons(40000), dport = htons(PORT_LO + ((mode >> 4) & 1));

			udp_len = htons((uint16_t)(8 + dlen));
			memcpy(frame + off, &sport, 2);
			memcpy(frame + off + 2, &dport, 2);
			memcpy(frame + off + 4, &udp_len, 2);
			memset(frame + off + 6, 0, 2);
		}
		off += 8;
		memcpy(frame + off, dgram, dlen);
		len = off + dlen;
		len = cut < len ? len - cut : 0;
	}
	if (len < 14) {
		return 0; /* the kernel does not run XDP on less than an Ethernet header */
	}
	FUZZ_CHECK(pbox_xdp_stats_read(g_x, &before) == 0, "stats");
	{
		LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = frame,
			    .data_size_in = (uint32_t)len, .repeat = 1);

		rc = bpf_prog_test_run_opts(pbox_xdp_prog_fd(g_x), &opts);
		FUZZ_CHECK(rc == 0, "test_run: %s", strerror(errno));
		FUZZ_CHECK(opts.retval == XDP_PASS || opts.retval == XDP_DROP, "verdict %u",
			   opts.retval);
		rc = (int)opts.retval;
	}
	FUZZ_CHECK(pbox_xdp_stats_read(g_x, &after) == 0, "stats");
	which = moved(&before, &after);
	if (dgram != NULL && cut == 0) {
		struct pbox_msg m;
		const struct pbox_wire_job *job;
		enum pbox_drop_reason r = pbox_wire_validate(dgram, dlen, PBOX_ROLE_APPLIANCE,
							     lookup, NULL, &m, &job);

		if (rc == XDP_DROP) {
			size_t x = (which - OFF(drop)) / 8;

			FUZZ_CHECK(which >= OFF(drop) && x < PBOX_DROP_COUNT, "drop counted at %zu",
				   which);
			FUZZ_CHECK(r != PBOX_DROP_NONE, "XDP dropped (%s) what the engine accepts",
				   pbox_drop_reason_name((enum pbox_drop_reason)x));
			if (x == PBOX_DROP_TRUNCATED || x == PBOX_DROP_BAD_MAGIC ||
			    x == PBOX_DROP_BAD_VERSION || x == PBOX_DROP_BAD_TYPE) {
				FUZZ_CHECK(r == (enum pbox_drop_reason)x,
					   "XDP says %s, the engine %s",
					   pbox_drop_reason_name((enum pbox_drop_reason)x),
					   pbox_drop_reason_name(r));
			}
		} else if (r == PBOX_DROP_NONE) {
			uint32_t owner = g_desc.chunks[m.chunk].core;

			FUZZ_CHECK(which == OFF(core_pass[owner]),
				   "valid datagram of chunk %u (core %u) counted at %zu", m.chunk,
				   owner, which);
		}
	}
	return 0;
}
