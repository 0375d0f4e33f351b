/* SPDX-License-Identifier: BSD-3-Clause */
/* `pbox stats`: a running pboxd's per-core counters and jobs, for people or as JSON. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define STATS_TIMEOUT_MS 5000

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: pbox stats [--control HOST:PORT | --socket PATH]\n"
		"                  [--admin-token-file FILE] [--json]\n"
		"\n"
		"Ask a running pboxd for its counters ({\"op\":\"stats\"} on the control channel)\n"
		"and print them per data-plane core, with the drop reasons, the jobs and the\n"
		"control channel's refusals. pboxd answers an operator only: over its local\n"
		"control socket (appliance control_socket), or with its admin token (appliance\n"
		"admin_token), read from FILE or from the environment variable PBOX_ADMIN_TOKEN.\n"
		"\n"
		"      --control HOST:PORT  pboxd control address (default 127.0.0.1:7000)\n"
		"      --socket PATH        pboxd's local control socket instead\n"
		"      --admin-token-file FILE  the admin token (first line of FILE)\n"
		"      --json               print pboxd's reply as JSON\n"
		"  -h, --help               this text\n");
}

static void print_core(const char *name, const json_t *c)
{
	char rxb[32], txb[32];
	const json_t *busy = json_object_get(c, "busy_pct");

	printf("%-5s %11" PRIu64 " %10s %11" PRIu64 " %10s %10" PRIu64 " %10" PRIu64 " %8" PRIu64
	       " %8" PRIu64 " %8" PRIu64 " %8" PRIu64 " %6.1f\n",
	       name, pbox_cli_json_u64(c, "rx_pkts"),
	       pbox_cli_bytes((double)pbox_cli_json_u64(c, "rx_bytes"), rxb, sizeof(rxb)),
	       pbox_cli_json_u64(c, "tx_pkts"),
	       pbox_cli_bytes((double)pbox_cli_json_u64(c, "tx_bytes"), txb, sizeof(txb)),
	       pbox_cli_json_u64(c, "agg_frags"), pbox_cli_json_u64(c, "iterations"),
	       pbox_cli_json_u64(c, "dups"), pbox_cli_json_u64(c, "rx_retransmits"),
	       pbox_cli_json_u64(c, "replies_resent"), pbox_cli_json_u64(c, "dropped"),
	       json_is_number(busy) ? json_number_value(busy) : 0.0);
}

static void print_control(const json_t *ctl)
{
	const char *key;
	const json_t *v;
	bool any = false;

	if (!json_is_object(ctl)) {
		return;
	}
	printf("control: %" PRIu64 " connections (%" PRIu64 " unauthenticated), %" PRIu64
	       " accepted so far",
	       pbox_cli_json_u64(ctl, "connections"), pbox_cli_json_u64(ctl, "unauthenticated"),
	       pbox_cli_json_u64(ctl, "accepted"));
	json_object_foreach((json_t *)ctl, key, v)
	{
		if (strcmp(key, "connections") == 0 || strcmp(key, "unauthenticated") == 0 ||
		    strcmp(key, "accepted") == 0 || strcmp(key, "max_connections") == 0 ||
		    strcmp(key, "peak_connections") == 0 || strcmp(key, "jobs_created") == 0 ||
		    strcmp(key, "jobs_removed") == 0 || json_integer_value(v) == 0) {
			continue;
		}
		printf("%s %s=%" JSON_INTEGER_FORMAT, any ? "" : "; refused/closed:", key,
		       json_integer_value(v));
		any = true;
	}
	printf("\n");
	if (json_is_object(json_object_get(ctl, "fds"))) {
		const json_t *f = json_object_get(ctl, "fds"), *h = json_object_get(f, "held"),
			     *r = json_object_get(f, "refused");

		printf("descriptors: limit %" JSON_INTEGER_FORMAT ", %" JSON_INTEGER_FORMAT
		       " reserved, %" JSON_INTEGER_FORMAT " free; held",
		       json_integer_value(json_object_get(f, "limit")),
		       json_integer_value(json_object_get(f, "reserve")),
		       json_integer_value(json_object_get(f, "free")));
		json_object_foreach((json_t *)h, key, v)
		{
			printf(" %s=%" JSON_INTEGER_FORMAT, key, json_integer_value(v));
		}
		printf("; refused");
		json_object_foreach((json_t *)r, key, v)
		{
			printf(" %s=%" JSON_INTEGER_FORMAT, key, json_integer_value(v));
		}
		printf("\n");
	}
	if (pbox_cli_json_u64(ctl, "jobs_created") || pbox_cli_json_u64(ctl, "jobs_removed")) {
		printf("runtime jobs: %" PRIu64 " created, %" PRIu64 " removed\n",
		       pbox_cli_json_u64(ctl, "jobs_created"),
		       pbox_cli_json_u64(ctl, "jobs_removed"));
	}
}

/* pboxd's XDP filter (nicfw/), when it has one: what it passed, redirected, dropped. */
static void print_xdp(const json_t *x)
{
	const char *key;
	const json_t *v;

	if (!json_is_object(x)) {
		return;
	}
	printf("xdp %s (%s): %" PRIu64 " frames, %" PRIu64 " passed to the kernel, %" PRIu64
	       " redirected, %" PRIu64 " dropped",
	       json_string_value(json_object_get(x, "interface")),
	       json_string_value(json_object_get(x, "mode")), pbox_cli_json_u64(x, "rx"),
	       pbox_cli_json_u64(x, "passed"), pbox_cli_json_u64(x, "redirected"),
	       pbox_cli_json_u64(x, "dropped"));
	json_object_foreach((json_t *)json_object_get(x, "drops"), key, v)
	{
		printf(" %s=%" JSON_INTEGER_FORMAT, key, json_integer_value(v));
	}
	printf("\n");
}

/* The kernel-UDP transport's line: datagrams per receive call and the offloads. */
static void print_udp(const json_t *t)
{
	const json_t *tot = json_object_get(t, "totals");
	const char *name = json_string_value(json_object_get(t, "name"));

	if (!json_is_object(tot) || name == NULL || strcmp(name, "udp") != 0) {
		return;
	}
	printf("udp: %.2f datagrams per recvmmsg call (%" PRIu64 " in %" PRIu64 " calls), %" PRIu64
	       " GRO / %" PRIu64 " GSO messages, gso %s, gro %s\n",
	       json_real_value(json_object_get(tot, "rx_pkts_per_call")),
	       pbox_cli_json_u64(tot, "rx_pkts"), pbox_cli_json_u64(tot, "rx_calls"),
	       pbox_cli_json_u64(tot, "rx_gro_msgs"), pbox_cli_json_u64(tot, "tx_gso_msgs"),
	       json_is_true(json_object_get(t, "gso")) ? "on" : "off",
	       json_is_true(json_object_get(t, "gro")) ? "on" : "off");
}

/* The shared-memory transport's line (local workers' rings beside kernel UDP). */
static void print_shm(const json_t *t)
{
	const json_t *broken = json_object_get(t, "broken"), *v;
	const char *key;
	uint64_t nbroken = 0;

	if (!json_is_object(t)) {
		return;
	}
	json_object_foreach((json_t *)broken, key, v)
	{
		nbroken += (uint64_t)json_integer_value(v);
	}
	printf("shm: %" PRIu64 " connections (%" PRIu64 " accepted, %" PRIu64
	       " not admitted, %" PRIu64 " broken rings), %" PRIu64 " datagrams in, %" PRIu64
	       " out, %" PRIu64 " dropped on a full ring, %" PRIu64 " wake-ups\n",
	       pbox_cli_json_u64(t, "conns_live"), pbox_cli_json_u64(t, "accepted"),
	       pbox_cli_json_u64(t, "auth_failed"), nbroken, pbox_cli_json_u64(t, "rx_pkts"),
	       pbox_cli_json_u64(t, "tx_pkts"), pbox_cli_json_u64(t, "tx_full"),
	       pbox_cli_json_u64(t, "wakes"));
	if (nbroken != 0) {
		printf("shm broken:");
		json_object_foreach((json_t *)broken, key, v)
		{
			if (json_integer_value(v) != 0) {
				printf(" %s=%" JSON_INTEGER_FORMAT, key, json_integer_value(v));
			}
		}
		printf("\n");
	}
}

/* The AF_XDP transport's line: frames and datagrams each way, drops, ring stalls. */
static void print_afxdp(const json_t *t)
{
	const json_t *tot = json_object_get(t, "totals"), *k = json_object_get(tot, "kernel");
	const char *name = json_string_value(json_object_get(t, "name")), *key;
	const json_t *v;
	uint64_t bad = 0;

	if (!json_is_object(tot) || name == NULL || strcmp(name, "afxdp") != 0) {
		return;
	}
	json_object_foreach((json_t *)json_object_get(tot, "rx_dropped"), key, v)
	{
		bad += (uint64_t)json_integer_value(v);
	}
	printf("afxdp %s (%s): rx %" PRIu64 " datagrams in %" PRIu64 " frames, %" PRIu64
	       " dropped; tx %" PRIu64 " datagrams in %" PRIu64 " frames, %" PRIu64
	       " dropped (no free frame %" PRIu64 ", ring full %" PRIu64
	       "); fill ring empty %" PRIu64 ", rx ring full %" PRIu64 "\n",
	       json_string_value(json_object_get(t, "interface")),
	       json_string_value(json_object_get(t, "mode")), pbox_cli_json_u64(tot, "rx_pkts"),
	       pbox_cli_json_u64(tot, "rx_frames"), bad, pbox_cli_json_u64(tot, "tx_pkts"),
	       pbox_cli_json_u64(tot, "tx_frames"),
	       pbox_cli_json_u64(tot, "tx_no_frame") + pbox_cli_json_u64(tot, "tx_ring_full") +
		       pbox_cli_json_u64(tot, "tx_too_big"),
	       pbox_cli_json_u64(tot, "tx_no_frame"), pbox_cli_json_u64(tot, "tx_ring_full"),
	       pbox_cli_json_u64(k, "rx_fill_ring_empty_descs"),
	       pbox_cli_json_u64(k, "rx_ring_full"));
}

static void print_stats(const char *addr, const json_t *st)
{
	const json_t *cores = json_object_get(st, "cores"), *tot = json_object_get(st, "totals");
	const json_t *jobs = json_object_get(st, "jobs"), *drops, *v, *c;
	const char *key;
	size_t i;
	char name[16], b[32];

	printf("pboxd %s: %zu data-plane core%s\n", addr, json_array_size(cores),
	       json_array_size(cores) == 1 ? "" : "s");
	printf("%-5s %11s %10s %11s %10s %10s %10s %8s %8s %8s %8s %6s\n", "core", "rx_pkts",
	       "rx_bytes", "tx_pkts", "tx_bytes", "agg_frags", "iterations", "dups", "retx_rx",
	       "resent", "dropped", "busy%");
	json_array_foreach(cores, i, c)
	{
		snprintf(name, sizeof(name), "%" PRIu64, pbox_cli_json_u64(c, "core"));
		print_core(name, c);
	}
	if (json_is_object(tot)) {
		print_core("all", tot);
		drops = json_object_get(tot, "drops");
		if (pbox_cli_json_u64(tot, "dropped") != 0 && json_is_object(drops)) {
			printf("drops:");
			json_object_foreach((json_t *)drops, key, v)
			{
				if (json_integer_value(v) != 0) {
					printf(" %s=%" JSON_INTEGER_FORMAT, key,
					       json_integer_value(v));
				}
			}
			printf("\n");
		}
	}
	print_udp(json_object_get(st, "transport"));
	print_shm(json_object_get(json_object_get(st, "transport"), "shm"));
	print_afxdp(json_object_get(st, "transport"));
	print_control(json_object_get(st, "control"));
	print_xdp(json_object_get(st, "xdp"));
	if (json_array_size(jobs) == 0) {
		printf("jobs: none configured\n");
		return;
	}
	printf("jobs:\n");
	json_array_foreach(jobs, i, c)
	{
		const char *state = json_string_value(json_object_get(c, "state"));
		const char *mode = json_string_value(json_object_get(c, "mode"));

		printf("  job %" PRIu64 ": %s, %s, %" PRIu64 "/%" PRIu64
		       " workers connected, %" PRIu64 " registered, %" PRIu64
		       " chunks (%s), %" PRIu64 " sessions so far\n",
		       pbox_cli_json_u64(c, "id"), state ? state : "?", mode ? mode : "?",
		       pbox_cli_json_u64(c, "connected"), pbox_cli_json_u64(c, "workers"),
		       pbox_cli_json_u64(c, "registered"), pbox_cli_json_u64(c, "chunks"),
		       pbox_cli_bytes((double)pbox_cli_json_u64(c, "bytes"), b, sizeof(b)),
		       pbox_cli_json_u64(c, "sessions"));
		if (json_string_value(json_object_get(c, "sync")) != NULL) {
			printf("    sync %s", json_string_value(json_object_get(c, "sync")));
			if (json_object_get(c, "version_min") != NULL) {
				printf(", chunk versions %" PRIu64 "..%" PRIu64 ", %" PRIu64
				       " pulls waiting, %" PRIu64 " of %" PRIu64 " workers counted",
				       pbox_cli_json_u64(c, "version_min"),
				       pbox_cli_json_u64(c, "version_max"),
				       pbox_cli_json_u64(c, "pulls_waiting"),
				       pbox_cli_json_u64(c, "live"),
				       pbox_cli_json_u64(c, "workers"));
			}
			printf(", %" PRIu64 " workers removed so far\n",
			       pbox_cli_json_u64(c, "removed"));
		}
	}
}

int pbox_cmd_stats(int argc, char **argv)
{
	static const struct option lo[] = {
		PBOX_CLI_CTL_LONGOPTS,
		PBOX_CLI_CTL_LONGOPTS_END,
	};
	struct pbox_cli_ctl ctl = { .cmd = "pbox stats",
				    .addr = "127.0.0.1:7000",
				    .usage = usage,
				    .token_in_request = true };
	json_t *reply;

	optind = 1;
	/* No options of its own: anything pbox_cli_ctl_getopt() hands back is unknown. */
	switch (pbox_cli_ctl_getopt(&ctl, argc, argv, "h", lo)) {
	case -1:
		break;
	case PBOX_CLI_CTL_EXIT:
		return ctl.exit_status;
	default:
		fprintf(stderr, "Try 'pbox stats --help'.\n");
		return 64;
	}
	if (optind < argc) {
		fprintf(stderr, "pbox stats: unexpected argument '%s'\n", argv[optind]);
		return 64;
	}
	if (pbox_cli_ctl_token(&ctl) != 0) {
		return 64;
	}
	if (pbox_cli_ctl_call(&ctl, NULL, json_pack("{s:s}", "op", "stats"), &reply,
			      STATS_TIMEOUT_MS) != 0) {
		return 1;
	}
	if (ctl.json) {
		pbox_cli_print_json(reply);
	} else {
		print_stats(ctl.addr, reply);
	}
	json_decref(reply);
	return 0;
}
