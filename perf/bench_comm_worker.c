/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-bench-comm: one worker of the communication-only ("zero compute") benchmark of
 * PHub. It registers a model's parameter tensors as keys (from a layer-size table in
 * perf/models/), then exchanges the whole model every iteration with no computation:
 * push_pull_async on every key, then wait_all. The job must be an aggregate job.
 *
 * Measured, over the timed iterations only: full-model exchanges per second, and the
 * payload rate: gradient bytes pushed plus aggregate bytes received (2 x model bytes per
 * exchange) per second. Wire counters of libpbox (headers included, retransmissions) are
 * reported beside them so that a lossy run is visible rather than averaged away.
 *
 * Iteration count: every rank of a BSP job must run the same number of iterations, so
 * with --seconds rank 0 times the warm-up and chooses the count, and all ranks learn it
 * through one exchange of a two-element planning key (not part of the model): element 0
 * is the count from rank 0 (0 from the others), element 1 is 1 from every rank, so
 * count = e0 * workers / e1 whether the job sums or averages.
 *
 * Buffers: the gradients and the results live in memory from pbox_mem_alloc (shared with
 * pboxd when the transport is shm: pushes go without a copy into the ring); --plain-mem
 * takes malloc'ed memory instead (the A/B of registered buffers).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <pbox/pbox.h>

#include "common/args.h"
#include "common/clock.h"

#define PROG             "pbox-bench-comm"
#define MAX_TABLE_KEYS   100000u
#define MAX_PLANNED_ITER 1000000u

struct table {
	char path[512];
	char model[64];
	uint32_t nkeys;
	struct pbox_key_info *keys; /* nkeys + 1: the last one is the planning key */
	char **names;
	uint64_t total; /* elements of the model (planning key excluded) */
};

struct opts {
	const char *server;
	const char *token;
	const char *model;
	uint32_t job;
	uint32_t rank;
	bool rank_set;
	double seconds;
	uint32_t iters; /* 0: choose from --seconds */
	uint32_t warmup;
	uint32_t timeout_ms;
	uint32_t max_inflight;
	uint32_t rto_ms;
	bool busy_poll;
	bool json;
	double grad_sigma; /* > 0: Gaussian gradients of this deviation, new every iteration */
	bool plain_mem;    /* malloc, not pbox_mem_alloc */
};

struct result {
	uint32_t iters;
	double seconds;
	double *iter_s; /* iters entries: each timed exchange's duration */
	struct pbox_client_stats before, after;
	uint64_t placed_before, placed_after; /* pbox_client_rx_placed */
	double cpu_s;    /* this process's CPU time (all threads) over the timed iterations */
	bool registered; /* the buffers are shared with pboxd (pbox_mem_registered) */
	const char *transport;
};

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: pbox-bench-comm --token T --rank R --model TABLE [options]\n"
		"\n"
		"One worker of the zero-compute communication benchmark: registers the tensors of\n"
		"TABLE (perf/models/*.txt) as keys of an aggregate job and exchanges the whole\n"
		"model every iteration (push_pull_async on every key, then wait_all), with no\n"
		"computation. Reports full-model exchanges/s and GB/s of gradient pushed plus\n"
		"aggregate received.\n"
		"\n"
		"Options:\n"
		"  --server H:P        pboxd control address (default 127.0.0.1:7000)\n"
		"  --job J             job id (default 1)\n"
		"  --token T           the job's token (required)\n"
		"  --rank R            this worker's rank (required)\n"
		"  --model TABLE       layer-size table: '<name> <elements>' per line (required)\n"
		"  --seconds S         timed duration; rank 0 picks the iteration count from the\n"
		"                      warm-up (default 5)\n"
		"  --iters N           timed iterations instead (give the same N to every rank)\n"
		"  --warmup N          untimed iterations first (default 2, at least 1)\n"
		"  --timeout-ms MS     libpbox operation deadline (default: libpbox's, 30 s)\n"
		"  --max-inflight N    chunks sent before their ACK (default: libpbox's, 256)\n"
		"  --rto-ms MS         libpbox's first retransmission timeout (default: "
		"libpbox's)\n"
		"  --busy-poll         libpbox progress thread spins instead of sleeping\n"
		"  --grad-sigma S      push Gaussian gradients N(0, S^2), new every iteration\n"
		"                      (seeded by rank and iteration; all written before the\n"
		"                      first exchange; needs --iters), for jobs with DVF; results\n"
		"                      are then checked finite only. Default: every element 1,\n"
		"                      checked exactly\n"
		"  --plain-mem         gradients and results in malloc'ed memory, not in\n"
		"                      pbox_mem_alloc's (shared with pboxd over shm)\n"
		"  --json              print the result as one JSON object (iter_seconds: each\n"
		"                      timed exchange's duration)\n"
		"  -h, --help          this text\n"
		"\n"
		"Exit status: 0 after the run, 1 on bad arguments or a bad table, 2 when the\n"
		"appliance refused or an exchange failed.\n");
}

static int parse_args(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{ "server", required_argument, NULL, 's' },
		{ "job", required_argument, NULL, 'j' },
		{ "token", required_argument, NULL, 't' },
		{ "rank", required_argument, NULL, 'r' },
		{ "model", required_argument, NULL, 'm' },
		{ "seconds", required_argument, NULL, 'S' },
		{ "iters", required_argument, NULL, 'i' },
		{ "warmup", required_argument, NULL, 'w' },
		{ "timeout-ms", required_argument, NULL, 'T' },
		{ "max-inflight", required_argument, NULL, 'I' },
		{ "rto-ms", required_argument, NULL, 'R' },
		{ "busy-poll", no_argument, NULL, 'B' },
		{ "json", no_argument, NULL, 'J' },
		{ "plain-mem", no_argument, NULL, 'P' },
		{ "grad-sigma", required_argument, NULL, 'G' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c, rc = 0;

	memset(o, 0, sizeof(*o));
	o->server = "127.0.0.1:7000";
	o->job = 1;
	o->seconds = 5.0;
	o->warmup = 2;
	while (rc == 0 && (c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case 's':
			o->server = optarg;
			break;
		case 'j':
			rc = pbox_arg_u32(PROG, "--job", optarg, 0, UINT32_MAX, &o->job);
			break;
		case 't':
			o->token = optarg;
			break;
		case 'r':
			rc = pbox_arg_u32(PROG, "--rank", optarg, 0, UINT32_MAX, &o->rank);
			o->rank_set = true;
			break;
		case 'm':
			o->model = optarg;
			break;
		case 'S':
			rc = pbox_arg_double(PROG, "--seconds", optarg, 0.001, 3600, &o->seconds);
			break;
		case 'i':
			rc = pbox_arg_u32(PROG, "--iters", optarg, 1, MAX_PLANNED_ITER, &o->iters);
			break;
		case 'w':
			rc = pbox_arg_u32(PROG, "--warmup", optarg, 1, 1000, &o->warmup);
			break;
		case 'T':
			rc = pbox_arg_u32(PROG, "--timeout-ms", optarg, 1, 3600000, &o->timeout_ms);
			break;
		case 'I':
			rc = pbox_arg_u32(PROG, "--max-inflight", optarg, 1, 1u << 20,
					  &o->max_inflight);
			break;
		case 'R':
			rc = pbox_arg_u32(PROG, "--rto-ms", optarg, 1, 600000, &o->rto_ms);
			break;
		case 'B':
			o->busy_poll = true;
			break;
		case 'J':
			o->json = true;
			break;
		case 'P':
			o->plain_mem = true;
			break;
		case 'G':
			rc = pbox_arg_double(PROG, "--grad-sigma", optarg, 1e-30, 1e30,
					     &o->grad_sigma);
			break;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			usage(stderr);
			return -EINVAL;
		}
	}
	if (rc != 0) {
		return rc;
	}
	if (o->grad_sigma > 0 && o->iters == 0) {
		fprintf(stderr, "pbox-bench-comm: --grad-sigma needs --iters (the gradients are "
				"written before the first exchange)\n");
		return -EINVAL;
	}
	if (optind < argc) {
		fprintf(stderr, "pbox-bench-comm: unexpected argument '%s' (see --help)\n",
			argv[optind]);
		return -EINVAL;
	}
	if (o->token == NULL || !o->rank_set || o->model == NULL) {
		fprintf(stderr, "pbox-bench-comm: --token, --rank and --model are required "
				"(see --help)\n");
		return -EINVAL;
	}
	return 0;
}

static void table_free(struct table *t)
{
	if (t->names != NULL) {
		for (uint32_t i = 0; i < t->nkeys; i++) {
			free(t->names[i]);
		}
	}
	free(t->names);
	free(t->keys);
	memset(t, 0, sizeof(*t));
}

/* Header line "# <word> <value>": returns the value of word, or -1 if the line is not one. */
static long long header_value(const char *line, const char *word)
{
	size_t wl = strlen(word);
	char *end;
	long long v;

	if (strncmp(line, "# ", 2) != 0 || strncmp(line + 2, word, wl) != 0 ||
	    line[2 + wl] != ' ') {
		return -1;
	}
	v = strtoll(line + 3 + wl, &end, 10);
	return (*end == '\0' || *end == '\n') && v >= 0 ? v : -1;
}

static int table_add(struct table *t, uint32_t *cap, const char *name, uint64_t nelem)
{
	if (t->nkeys + 1 >= *cap) {
		uint32_t ncap = *cap ? *cap * 2 : 64;
		struct pbox_key_info *k = realloc(t->keys, ncap * sizeof(*k));
		char **n;

		if (k == NULL) {
			return -ENOMEM;
		}
		t->keys = k;
		n = realloc(t->names, ncap * sizeof(*n));
		if (n == NULL) {
			return -ENOMEM;
		}
		t->names = n;
		*cap = ncap;
	}
	t->names[t->nkeys] = strdup(name);
	if (t->names[t->nkeys] == NULL) {
		return -ENOMEM;
	}
	t->keys[t->nkeys].id = t->nkeys;
	t->keys[t->nkeys].nelem = nelem;
	t->nkeys++;
	t->total += nelem;
	return 0;
}

/* Read a layer-size table; errors name the file and line. */
static int table_load(struct table *t, const char *path)
{
	FILE *f = fopen(path, "r");
	char line[1024];
	unsigned lineno = 0;
	long long want_total = -1, want_tensors = -1;
	uint32_t cap = 0;
	int rc = 0;

	memset(t, 0, sizeof(*t));
	snprintf(t->path, sizeof(t->path), "%s", path);
	if (f == NULL) {
		fprintf(stderr, "pbox-bench-comm: model table %s: %s\n", path, strerror(errno));
		return -errno;
	}
	while (rc == 0 && fgets(line, sizeof(line), f) != NULL) {
		char name[512], num[32], extra[2], *end;
		unsigned long long n = 0;
		const char *p = line;
		long long v;

		lineno++;
		if (strchr(line, '\n') == NULL && !feof(f)) {
			fprintf(stderr, "pbox-bench-comm: %s:%u: line longer than %zu characters\n",
				path, lineno, sizeof(line) - 1);
			rc = -EINVAL;
			break;
		}
		if ((v = header_value(line, "total")) >= 0) {
			want_total = v;
			continue;
		}
		if ((v = header_value(line, "tensors")) >= 0) {
			want_tensors = v;
			continue;
		}
		if (strncmp(line, "# model ", 8) == 0) {
			sscanf(line + 8, "%63s", t->model);
			continue;
		}
		while (*p == ' ' || *p == '\t') {
			p++;
		}
		if (*p == '#' || *p == '\n' || *p == '\0') {
			continue;
		}
		if (sscanf(p, "%511s %31s %1s", name, num, extra) == 2 && num[0] >= '0' &&
		    num[0] <= '9') {
			errno = 0;
			n = strtoull(num, &end, 10);
			if (errno != 0 || *end != '\0') {
				n = ULLONG_MAX;
			}
		} else {
			n = ULLONG_MAX;
		}
		if (n == ULLONG_MAX || n > (1ull << 40)) {
			fprintf(stderr,
				"pbox-bench-comm: %s:%u: expected '<tensor name> <element count>' "
				"with a count below 2^40\n",
				path, lineno);
			rc = -EINVAL;
			break;
		}
		if (n == 0) {
			fprintf(stderr, "pbox-bench-comm: %s:%u: tensor %s has no elements\n", path,
				lineno, name);
			rc = -EINVAL;
			break;
		}
		if (t->nkeys >= MAX_TABLE_KEYS) {
			fprintf(stderr, "pbox-bench-comm: %s:%u: more than %u tensors\n", path,
				lineno, MAX_TABLE_KEYS);
			rc = -EINVAL;
			break;
		}
		rc = table_add(t, &cap, name, n);
		if (rc != 0) {
			fprintf(stderr, "pbox-bench-comm: %s: out of memory\n", path);
		}
	}
	if (rc == 0 && ferror(f)) {
		fprintf(stderr, "pbox-bench-comm: reading %s: %s\n", path, strerror(errno));
		rc = -EIO;
	}
	fclose(f);
	if (rc == 0 && t->nkeys == 0) {
		fprintf(stderr, "pbox-bench-comm: %s: no tensors listed\n", path);
		rc = -EINVAL;
	}
	/* The header totals catch a truncated or hand-edited table. */
	if (rc == 0 && want_total >= 0 && (uint64_t)want_total != t->total) {
		fprintf(stderr,
			"pbox-bench-comm: %s: tensors add up to %" PRIu64
			" elements, the header says %lld\n",
			path, t->total, want_total);
		rc = -EINVAL;
	}
	if (rc == 0 && want_tensors >= 0 && (uint64_t)want_tensors != t->nkeys) {
		fprintf(stderr, "pbox-bench-comm: %s: %u tensors listed, the header says %lld\n",
			path, t->nkeys, want_tensors);
		rc = -EINVAL;
	}
	if (rc == 0) {
		/* The planning key: two elements, id after the model's. */
		t->keys[t->nkeys].id = t->nkeys;
		t->keys[t->nkeys].nelem = 2;
		if (t->model[0] == '\0') {
			const char *base = strrchr(path, '/');

			snprintf(t->model, sizeof(t->model), "%s", base ? base + 1 : path);
		}
	} else {
		table_free(t);
	}
	return rc;
}

/* --grad-sigma: gradient of iteration it of this rank, N(0, sigma^2) (xorshift64* and
 * Box-Muller), a different stream for every rank and iteration. */
static void fill_gauss(float *g, uint64_t n, uint32_t rank, uint32_t it, double sigma)
{
	uint64_t x = 0x9e3779b97f4a7c15ull ^ ((uint64_t)rank << 32 | it);

	for (uint64_t i = 0; i < n; i += 2) {
		double u1, u2, r;

		x ^= x >> 12;
		x ^= x << 25;
		x ^= x >> 27;
		u1 = ((double)((x * 0x2545f4914f6cdd1dull) >> 11) + 1.0) / 9007199254740993.0;
		x ^= x >> 12;
		x ^= x << 25;
		x ^= x >> 27;
		u2 = (double)((x * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0;
		r = sigma * sqrt(-2.0 * log(u1));
		g[i] = (float)(r * cos(2.0 * M_PI * u2));
		if (i + 1 < n) {
			g[i + 1] = (float)(r * sin(2.0 * M_PI * u2));
		}
	}
}

/* One full-model exchange of iteration it: every key's push-pull started, then waited for. */
static int exchange(struct pbox_client *c, const struct table *t, const uint64_t *off,
		    const float *grad, float *out, uint32_t it)
{
	int rc;

	for (uint32_t k = 0; k < t->nkeys; k++) {
		rc = pbox_push_pull_async(c, t->keys[k].id, it, grad + off[k], out + off[k], NULL,
					  NULL);
		if (rc < 0) {
			fprintf(stderr, "pbox-bench-comm: iteration %u: starting key %u (%s): %s\n",
				it, t->keys[k].id, t->names[k], pbox_last_error());
			/* Let what was started finish or fail before the buffers go away. */
			pbox_wait_all(c, -1);
			return rc;
		}
	}
	rc = pbox_wait_all(c, -1);
	if (rc < 0) {
		fprintf(stderr, "pbox-bench-comm: iteration %u: %s\n", it, pbox_last_error());
	}
	return rc;
}

/* Agree on the number of timed iterations (see the file comment). */
static int plan_iters(struct pbox_client *c, const struct table *t, const struct opts *o,
		      uint32_t workers, double warm_iter_s, uint32_t *iters)
{
	uint32_t id = t->keys[t->nkeys].id;
	float in[2], res[2];
	double want, n;
	int rc;

	if (o->iters != 0) {
		*iters = o->iters;
		return 0;
	}
	want = warm_iter_s > 0 ? ceil(o->seconds / warm_iter_s) : MAX_PLANNED_ITER;
	want = fmin(fmax(want, 3), MAX_PLANNED_ITER);
	in[0] = o->rank == 0 ? (float)want : 0.0f;
	in[1] = 1.0f;
	rc = pbox_push_pull(c, id, 0, in, res);
	if (rc < 0) {
		fprintf(stderr, "pbox-bench-comm: agreeing on the iteration count: %s\n",
			pbox_last_error());
		return rc;
	}
	n = res[1] > 0 ? rint((double)res[0] * workers / (double)res[1]) : 0;
	if (!(n >= 1 && n <= MAX_PLANNED_ITER)) {
		fprintf(stderr,
			"pbox-bench-comm: the planning exchange gave (%g, %g), not an iteration "
			"count; is every rank a pbox-bench-comm with --seconds?\n",
			(double)res[0], (double)res[1]);
		return -EPROTO;
	}
	*iters = (uint32_t)n;
	return 0;
}

static void report(const struct opts *o, const struct table *t, const struct pbox_job_info *ji,
		   const struct result *r)
{
	double mb = (double)t->total * 4.0;
	double xps = r->iters / r->seconds;
	double push = mb * r->iters / r->seconds / 1e9, recv = push;
	double wire_tx = (double)(r->after.tx_bytes - r->before.tx_bytes) / r->seconds / 1e9;
	double wire_rx = (double)(r->after.rx_bytes - r->before.rx_bytes) / r->seconds / 1e9;
	uint64_t retx = r->after.retransmits - r->before.retransmits;
	uint64_t probes = r->after.probes - r->before.probes;
	uint64_t dropped = r->after.dropped - r->before.dropped;
	uint64_t rx_pkts = r->after.rx_pkts - r->before.rx_pkts;
	uint64_t placed = r->placed_after - r->placed_before;
	/* shared-memory transport: results read through descriptors, and those dropped
	 * (buffer rewritten before / while read) and re-requested */
	uint64_t desc = r->after.shm_rx_desc - r->before.shm_rx_desc;
	uint64_t stale = r->after.shm_stale - r->before.shm_stale;
	uint64_t torn = r->after.shm_torn - r->before.shm_torn;

	if (o->json) {
		printf("{\"rank\": %u, \"workers\": %u, \"model\": \"%s\", \"keys\": %u, "
		       "\"model_bytes\": %.0f, \"chunk_bytes\": %u, \"frag_bytes\": %u, "
		       "\"nchunks\": %u, \"cores\": %u, \"iters\": %u, \"seconds\": %.6f, "
		       "\"exchanges_per_s\": %.6f, \"push_gbps\": %.6f, \"recv_gbps\": %.6f, "
		       "\"wire_tx_gbps\": %.6f, \"wire_rx_gbps\": %.6f, \"retransmits\": %" PRIu64
		       ", \"probes\": %" PRIu64 ", \"dropped\": %" PRIu64 ", \"rx_pkts\": %" PRIu64
		       ", \"rx_placed\": %" PRIu64 ", \"shm_rx_desc\": %" PRIu64
		       ", \"shm_stale\": %" PRIu64 ", \"shm_torn\": %" PRIu64
		       ", \"cpu_s\": %.6f, \"registered\": %s, \"transport\": \"%s\", "
		       "\"iter_seconds\": [",
		       o->rank, ji->workers, t->model, t->nkeys, mb, ji->chunk_bytes,
		       ji->frag_bytes, ji->nchunks, ji->cores, r->iters, r->seconds, xps, push,
		       recv, wire_tx, wire_rx, retx, probes, dropped, rx_pkts, placed, desc, stale,
		       torn, r->cpu_s, r->registered ? "true" : "false", r->transport);
		for (uint32_t i = 0; i < r->iters; i++) {
			printf("%s%.6f", i ? ", " : "", r->iter_s[i]);
		}
		printf("]}\n");
	} else {
		printf("rank %u of %u: %s, %u keys, %.1f MB, chunk %u B, fragment %u B, %u "
		       "chunks on %u cores\n",
		       o->rank, ji->workers, t->model, t->nkeys, mb / 1e6, ji->chunk_bytes,
		       ji->frag_bytes, ji->nchunks, ji->cores);
		printf("  %u exchanges in %.3f s: %.3f exchanges/s, %.3f GB/s pushed + %.3f GB/s "
		       "received = %.3f GB/s\n",
		       r->iters, r->seconds, xps, push, recv, push + recv);
		printf("  wire (headers included): %.3f GB/s out, %.3f GB/s in; %" PRIu64
		       " retransmits, %" PRIu64 " probes, %" PRIu64 " dropped\n",
		       wire_tx, wire_rx, retx, probes, dropped);
		if (desc + stale + torn != 0) {
			printf("  shm: %" PRIu64 " results read through descriptors, %" PRIu64
			       " stale and %" PRIu64 " torn (dropped, re-requested)\n",
			       desc, stale, torn);
		}
	}
	fflush(stdout);
}

/* CPU seconds of this process (user + system, every thread). */
static double cpu_now(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
	       (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

int main(int argc, char **argv)
{
	struct opts o;
	struct table t;
	struct pbox_client *c = NULL;
	struct pbox_client_opts co = { 0 };
	struct pbox_job_info ji;
	struct result r = { 0 };
	uint64_t *off = NULL, ngrad;
	float *grad = NULL, *out = NULL;
	double warm_iter_s = 0;
	int rc, status = 2;

	if (parse_args(argc, argv, &o) != 0) {
		return 1;
	}
	if (table_load(&t, o.model) != 0) {
		return 1;
	}
	/* Refuse what cannot fit rather than be killed while writing the buffers. */
	if ((double)t.total * 4 * (2 + (o.grad_sigma > 0 ? o.warmup + o.iters : 0)) >
	    (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE) * 0.8) {
		fprintf(stderr,
			"pbox-bench-comm: %s: %.1f MB of buffers exceed 80%% of this machine's "
			"memory\n",
			t.path,
			(double)t.total * 4 * (2 + (o.grad_sigma > 0 ? o.warmup + o.iters : 0)) /
				1e6);
		status = 1;
		goto out;
	}
	co.server = o.server;
	co.job = o.job;
	co.token = o.token;
	co.rank = o.rank;
	co.timeout_ms = o.timeout_ms;
	co.max_inflight = o.max_inflight;
	co.rto_ms = o.rto_ms;
	co.busy_poll = o.busy_poll;
	rc = pbox_connect(&co, &c);
	if (rc < 0) {
		fprintf(stderr, "pbox-bench-comm: rank %u: connecting to %s: %s\n", o.rank,
			o.server, pbox_last_error());
		goto out;
	}
	if (pbox_job_info(c, &ji) == 0 && ji.mode != PBOX_JOB_AGGREGATE) {
		fprintf(stderr,
			"pbox-bench-comm: job %u is a server-optimizer job; the zero-compute "
			"benchmark needs an aggregate job\n",
			o.job);
		goto out;
	}
	rc = pbox_register(c, t.keys, t.nkeys + 1);
	if (rc < 0) {
		fprintf(stderr, "pbox-bench-comm: rank %u: registering %u keys of %s: %s\n", o.rank,
			t.nkeys + 1, t.path, pbox_last_error());
		goto out;
	}
	pbox_job_info(c, &ji);
	off = calloc(t.nkeys, sizeof(*off));
	/* --grad-sigma: every iteration's gradient written now, so that writing them neither
	 * counts in an exchange nor delays one rank's start against the others'. */
	ngrad = o.grad_sigma > 0 ? (uint64_t)o.warmup + o.iters : 1;
	if (o.plain_mem) {
		grad = malloc(t.total * ngrad * sizeof(float));
		out = malloc(t.total * sizeof(float));
	} else if (pbox_mem_alloc(c, t.total * ngrad * sizeof(float), (void **)&grad) != 0 ||
		   pbox_mem_alloc(c, t.total * sizeof(float), (void **)&out) != 0) {
		fprintf(stderr, "pbox-bench-comm: %s\n", pbox_last_error());
	}
	if (off == NULL || grad == NULL || out == NULL) {
		fprintf(stderr, "pbox-bench-comm: cannot allocate 2 x %.1f MB for %s\n",
			(double)t.total * 4 / 1e6, t.model);
		status = 1;
		goto out;
	}
	r.registered = !o.plain_mem && pbox_mem_registered(c, grad) && pbox_mem_registered(c, out);
	r.transport = pbox_transport(c);
	for (uint32_t k = 1; k < t.nkeys; k++) {
		off[k] = off[k - 1] + t.keys[k - 1].nelem;
	}
	/* Write both buffers now so that page faults stay out of the exchanges; a constant
	 * gradient keeps the mean (and, for few iterations, the sum) finite. */
	for (uint64_t i = 0; o.grad_sigma == 0 && i < t.total; i++) {
		grad[i] = 1.0f;
	}
	for (uint64_t i = 0; i < ngrad && o.grad_sigma > 0; i++) {
		fill_gauss(grad + i * t.total, t.total, o.rank, (uint32_t)i, o.grad_sigma);
	}
	memset(out, 0, t.total * sizeof(float));
	for (uint32_t it = 0; it < o.warmup; it++) {
		double t0 = pbox_mono_s();

		if (exchange(c, &t, off, grad + (ngrad > 1 ? it * t.total : 0), out, it) < 0) {
			goto out;
		}
		warm_iter_s =
			pbox_mono_s() - t0; /* the last one: the first pays for connection set-up */
	}
	if (plan_iters(c, &t, &o, ji.workers, warm_iter_s, &r.iters) < 0) {
		goto out;
	}
	r.iter_s = calloc(r.iters, sizeof(*r.iter_s));
	if (r.iter_s == NULL) {
		fprintf(stderr, "pbox-bench-comm: cannot allocate %u iteration times\n", r.iters);
		goto out;
	}
	pbox_client_stats(c, &r.before);
	r.placed_before = pbox_client_rx_placed(c);
	r.cpu_s = -cpu_now();
	{
		double ti;

		r.seconds = 0;
		for (uint32_t i = 0; i < r.iters; i++) {
			const float *g = grad + (ngrad > 1 ? (o.warmup + i) * t.total : 0);

			ti = pbox_mono_s();
			if (exchange(c, &t, off, g, out, o.warmup + i) < 0) {
				goto out;
			}
			r.iter_s[i] = pbox_mono_s() - ti;
			r.seconds += r.iter_s[i];
		}
	}
	pbox_client_stats(c, &r.after);
	r.placed_after = pbox_client_rx_placed(c);
	r.cpu_s += cpu_now();
	/* The mean of identical gradients is that gradient, exactly; anything else means the
	 * results were not the aggregates (or the appliance sums: then it is workers x 1).
	 * Every element of the last exchange is checked (after the timing). */
	for (uint64_t i = 0; o.grad_sigma > 0 && i < t.total; i++) {
		if (!isfinite(out[i])) {
			fprintf(stderr,
				"pbox-bench-comm: rank %u: result element %" PRIu64 " is %g\n",
				o.rank, i, (double)out[i]);
			goto out;
		}
	}
	for (uint64_t i = 0; o.grad_sigma == 0 && i < t.total; i++) {
		if (out[i] != out[0] || (out[i] != 1.0f && out[i] != (float)ji.workers)) {
			fprintf(stderr,
				"pbox-bench-comm: rank %u: result element %" PRIu64
				" is %g, expected 1 (mean) or %u (sum)\n",
				o.rank, i, (double)out[i], ji.workers);
			goto out;
		}
	}
	report(&o, &t, &ji, &r);
	status = 0;
out:
	if (o.plain_mem) {
		free(grad);
		free(out);
	} else {
		pbox_mem_free(c, grad);
		pbox_mem_free(c, out);
	}
	pbox_close(c);
	free(r.iter_s);
	free(off);
	table_free(&t);
	return status;
}
