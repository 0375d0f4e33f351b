/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * `pbox status`: what a running pboxd (or pbox-ctrld, which adds its pboxds, bandwidth
 * matrix and plans and asks each job's pboxd) says about its jobs: the ranks (address,
 * last seen, next iteration), and for a job that waits, which ranks each waiting chunk
 * still lacks. One {"op":"status"} request (common/statusmsg.h); --json prints the reply.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common/args.h"
#include "common/statusmsg.h"

#define STATUS_TIMEOUT_MS 10000

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: pbox status [--control HOST:PORT | --socket PATH] [--admin-token-file "
		"FILE]\n"
		"                   [--job ID] [--max-groups N] [--max-ranges N] [--max-ranks N]\n"
		"                   [--json]\n"
		"\n"
		"Ask a running pboxd, or pbox-ctrld, what its jobs are doing: each job's state,\n"
		"iterations (the lowest and highest chunk version), time since a chunk last\n"
		"advanced, its ranks (control connection, pinned data address, last seen, the\n"
		"next iteration the chunks need from it) and, for a job that waits, which ranks\n"
		"each waiting chunk still lacks, grouped by iteration and missing ranks. "
		"pbox-ctrld\n"
		"adds its pboxds, its bandwidth matrix (with each estimate's age) and each job's\n"
		"plan (tree and DVF thresholds), and asks the job's pboxd for the rest.\n"
		"Operators only: the local control socket, or the admin token (FILE or the\n"
		"environment variable PBOX_ADMIN_TOKEN).\n"
		"\n"
		"      --control HOST:PORT  the daemon's control address (default 127.0.0.1:7000)\n"
		"      --socket PATH        its local control socket instead\n"
		"      --admin-token-file FILE  the admin token (first line of FILE)\n"
		"      --job ID             only this job\n"
		"      --max-groups N       waiting-chunk groups per job (default %u, max %u)\n"
		"      --max-ranges N       ranges per list of chunks or ranks (default %u, max "
		"%u)\n"
		"      --max-ranks N        ranks listed per job (default %u, max %u)\n"
		"      --json               print the reply as JSON\n"
		"  -h, --help               this text\n"
		"\n"
		"Exit status: 0, 1 if the daemon could not be asked or refused, 64 bad "
		"arguments.\n",
		PBOX_STATUS_GROUPS_DEFAULT, PBOX_STATUS_GROUPS_MAX, PBOX_STATUS_RANGES_DEFAULT,
		PBOX_STATUS_RANGES_MAX, PBOX_STATUS_RANKS_DEFAULT, PBOX_STATUS_RANKS_MAX);
}

static const char *str(const json_t *o, const char *key)
{
	const char *s = json_string_value(json_object_get(o, key));

	return s != NULL ? s : "-";
}

/* "1.2 s", "-" for null. */
static const char *age(const json_t *ms, char *buf, size_t len)
{
	if (!json_is_integer(ms)) {
		return "-";
	}
	snprintf(buf, len, "%.1f s", (double)json_integer_value(ms) / 1000.0);
	return buf;
}

/* A rank list "2" / "0-3,7" reads better with its noun. */
static const char *ranks_word(const char *list)
{
	return strpbrk(list, ",-") != NULL ? "ranks" : "rank";
}

static void print_ranks(const json_t *st)
{
	const json_t *ranks = json_object_get(st, "ranks"), *r;
	size_t i;
	char a[32];

	if (json_array_size(ranks) == 0) {
		return;
	}
	printf("  %-5s %-5s %-10s %-22s %-22s %-10s %s\n", "rank", "live", "registered", "peer",
	       "data address", "last seen", "next iteration");
	json_array_foreach(ranks, i, r)
	{
		const json_t *n = json_object_get(r, "next_iteration");

		printf("  %-5" PRIu64 " %-5s %-10s %-22s %-22s %-10s ",
		       pbox_cli_json_u64(r, "rank"),
		       json_is_true(json_object_get(r, "live")) ? "yes" : "no",
		       json_is_true(json_object_get(r, "registered")) ? "yes" : "no",
		       str(r, "peer"), str(r, "data_addr"),
		       age(json_object_get(r, "last_seen_ms_ago"), a, sizeof(a)));
		if (json_is_integer(n)) {
			printf("%" JSON_INTEGER_FORMAT "\n", json_integer_value(n));
		} else {
			printf("-\n");
		}
	}
	if (pbox_cli_json_u64(st, "ranks_omitted") != 0) {
		printf("  (%" PRIu64 " more ranks; --max-ranks)\n",
		       pbox_cli_json_u64(st, "ranks_omitted"));
	}
}

/* The last-seen age of the first rank of list ("2", "2-4,9"): the one to look at first. */
static void print_first_missing_seen(const json_t *st, const char *list)
{
	unsigned long r = strtoul(list, NULL, 10);
	const json_t *ranks = json_object_get(st, "ranks"), *x;
	size_t i;
	char a[32];

	json_array_foreach(ranks, i, x)
	{
		if (pbox_cli_json_u64(x, "rank") == r) {
			const json_t *seen = json_object_get(x, "last_seen_ms_ago");

			if (json_is_integer(seen)) {
				printf("; rank %lu last seen %s ago", r, age(seen, a, sizeof(a)));
			} else {
				printf("; rank %lu is not connected", r);
			}
			return;
		}
	}
}

static void print_waiting(uint64_t id, const json_t *st)
{
	const json_t *w = json_object_get(st, "waiting"), *g;
	size_t i;

	if (!json_is_object(w)) {
		return;
	}
	if (json_is_integer(json_object_get(w, "scanned")) &&
	    pbox_cli_json_u64(w, "scanned") < pbox_cli_json_u64(st, "chunks")) {
		printf("  (only the first %" PRIu64 " of %" PRIu64
		       " chunks were read: pboxd bounds "
		       "the time one status takes)\n",
		       pbox_cli_json_u64(w, "scanned"), pbox_cli_json_u64(st, "chunks"));
	}
	if (pbox_cli_json_u64(w, "chunks") == 0) {
		if (pbox_cli_json_u64(w, "changing") != 0) {
			printf("  %" PRIu64 " chunks advancing while read (not waiting)\n",
			       pbox_cli_json_u64(w, "changing"));
		}
		return;
	}
	json_array_foreach(json_object_get(w, "groups"), i, g)
	{
		const char *miss = str(g, "missing"), *part = str(g, "partial");

		printf("job %" PRIu64 ": iteration %" PRIu64 ", %" PRIu64 " chunks waiting: ", id,
		       pbox_cli_json_u64(g, "iteration"), pbox_cli_json_u64(g, "nchunks"));
		if (miss[0] == '\0') {
			printf("no live rank missing (finishing) on chunks %s", str(g, "chunks"));
		} else {
			printf("%s %s missing on chunks %s", ranks_word(miss), miss,
			       str(g, "chunks"));
			if (part[0] != '\0') {
				printf(" (%s %s sent part of it)", ranks_word(part), part);
			}
			print_first_missing_seen(st, miss);
		}
		printf("\n");
	}
	if (pbox_cli_json_u64(w, "ungrouped") != 0) {
		printf("job %" PRIu64 ": %" PRIu64 " more waiting chunks in other groups "
		       "(--max-groups)\n",
		       id, pbox_cli_json_u64(w, "ungrouped"));
	}
	if (pbox_cli_json_u64(w, "changing") != 0) {
		printf("  (%" PRIu64 " chunks advanced while read: not waiting)\n",
		       pbox_cli_json_u64(w, "changing"));
	}
}

/* At most this many parents / ranks are printed per plan line. */
#define PLAN_LIST_MAX 32u

static void print_plan(const json_t *plan)
{
	const json_t *t = json_object_get(plan, "tree"), *th = json_object_get(plan, "thresholds");
	const json_t *w;
	size_t i, n;

	if (!json_is_object(t) && !json_is_object(th)) {
		return;
	}
	if (json_is_object(t)) {
		const json_t *parent = json_object_get(t, "parent");

		printf("  tree: rev %" PRIu64 " (%s, objective %.3f), parents [",
		       pbox_cli_json_u64(t, "revision"), str(t, "method"),
		       json_number_value(json_object_get(t, "objective")));
		n = json_array_size(parent);
		json_array_foreach(parent, i, w)
		{
			if (i == PLAN_LIST_MAX) {
				printf(" ... +%zu", n - i);
				break;
			}
			printf("%s%" JSON_INTEGER_FORMAT, i ? " " : "", json_integer_value(w));
		}
		printf("] (-1: the appliance)\n");
	}
	if (json_is_object(th)) {
		const json_t *b = json_object_get(th, "broadcast");
		size_t up = 0;

		printf("  thresholds: broadcast %s", str(b, "select"));
		if (json_is_number(json_object_get(b, "delta"))) {
			printf(" (%g)", json_number_value(json_object_get(b, "delta")));
		}
		printf("; delta_up pushes from ranks [");
		json_array_foreach(json_object_get(th, "workers"), i, w)
		{
			if (strcmp(str(w, "push"), "delta_up") != 0) {
				continue;
			}
			if (up == PLAN_LIST_MAX) {
				printf(" ...");
				break;
			}
			printf("%s%zu (%s)", up ? " " : "", i, str(w, "link"));
			up++;
		}
		printf("] of %zu\n", json_array_size(json_object_get(th, "workers")));
	}
}

/* One job: st is pboxd's status object (for pbox-ctrld, the job's "status" member). */
static void print_job(const json_t *j)
{
	const json_t *st = json_object_get(j, "status");
	uint64_t id = pbox_cli_json_u64(j, "id");
	char a[32], b[32];

	if (!json_is_object(st)) {
		st = j;
	}
	printf("job %" PRIu64 ": %s, %s/%s, %" PRIu64 " workers (%" PRIu64 " connected, %" PRIu64
	       " live), iterations %" PRIu64 "..%" PRIu64 ", %" PRIu64 " chunks (%s), last "
	       "progress %s ago",
	       id, str(st, "state"), str(st, "mode"), str(st, "sync"),
	       pbox_cli_json_u64(st, "workers"), pbox_cli_json_u64(st, "connected"),
	       pbox_cli_json_u64(st, "live"), pbox_cli_json_u64(st, "version_min"),
	       pbox_cli_json_u64(st, "version_max"), pbox_cli_json_u64(st, "chunks"),
	       pbox_cli_bytes((double)pbox_cli_json_u64(st, "bytes"), b, sizeof(b)),
	       age(json_object_get(st, "progress_ms_ago"), a, sizeof(a)));
	if (json_is_string(json_object_get(j, "pboxd"))) {
		printf(", on pboxd %s", str(j, "pboxd"));
	}
	printf("\n");
	if (json_is_string(json_object_get(st, "abort_reason"))) {
		printf("  aborted: %s\n", str(st, "abort_reason"));
	}
	if (json_is_string(json_object_get(j, "status_error"))) {
		printf("  pboxd not asked: %s\n", str(j, "status_error"));
	}
	print_plan(json_object_get(j, "plan") ? json_object_get(j, "plan")
					      : json_object_get(st, "plan"));
	print_ranks(st);
	print_waiting(id, st);
}

static void print_pboxds(const json_t *arr)
{
	const json_t *p;
	size_t i;

	if (json_array_size(arr) == 0) {
		return;
	}
	printf("pboxds:\n");
	json_array_foreach(arr, i, p)
	{
		printf("  %-12s %-24s %-5s %" PRIu64 " jobs%s%s\n", str(p, "name"),
		       str(p, "control"), json_is_true(json_object_get(p, "up")) ? "up" : "down",
		       pbox_cli_json_u64(p, "jobs"),
		       json_string_value(json_object_get(p, "last_error")) ? "  " : "",
		       json_string_value(json_object_get(p, "last_error")) ?: "");
	}
}

static void print_bandwidth(const json_t *arr)
{
	const json_t *p;
	size_t i;

	if (json_array_size(arr) == 0) {
		return;
	}
	printf("bandwidth matrix:\n  %-12s %-22s %-8s %-17s %s\n", "from", "to", "state", "Mbit/s",
	       "age");
	json_array_foreach(arr, i, p)
	{
		const json_t *e = json_object_get(p, "estimate");
		char range[40] = "-", a[32] = "-";

		if (json_is_object(e)) {
			snprintf(range, sizeof(range), "%.1f..%.1f",
				 json_number_value(json_object_get(e, "r_min_bps")) / 1e6,
				 json_number_value(json_object_get(e, "r_max_bps")) / 1e6);
			snprintf(a, sizeof(a), "%.0f s",
				 json_number_value(json_object_get(p, "age_s")));
		}
		printf("  %-12s %-22s %-8s %-17s %s%s%s\n", str(p, "from"), str(p, "to"),
		       str(p, "state"), range, a, json_object_get(p, "last_error") ? "  " : "",
		       json_string_value(json_object_get(p, "last_error")) ?: "");
	}
}

static void print_reply(const json_t *reply)
{
	const json_t *jobs = json_object_get(reply, "jobs"), *j;
	size_t i;

	if (strcmp(str(reply, "daemon"), "pbox-ctrld") == 0) {
		print_pboxds(json_object_get(reply, "pboxds"));
		print_bandwidth(json_object_get(reply, "bandwidth"));
	}
	if (json_array_size(jobs) == 0) {
		printf("no jobs\n");
	}
	json_array_foreach(jobs, i, j)
	{
		print_job(j);
	}
}

int pbox_cmd_status(int argc, char **argv)
{
	static const struct option longopts[] = {
		PBOX_CLI_CTL_LONGOPTS,
		{ "job", required_argument, NULL, 'J' },
		{ "max-groups", required_argument, NULL, 'g' },
		{ "max-ranges", required_argument, NULL, 'r' },
		{ "max-ranks", required_argument, NULL, 'k' },
		PBOX_CLI_CTL_LONGOPTS_END,
	};
	struct pbox_cli_ctl ctl = { .cmd = "pbox status",
				    .addr = "127.0.0.1:7000",
				    .usage = usage };
	struct pbox_statusmsg m;
	json_t *reply;
	uint32_t id;
	int opt;

	pbox_statusmsg_defaults(&m);
	optind = 1;
	while ((opt = pbox_cli_ctl_getopt(&ctl, argc, argv, "h", longopts)) != -1) {
		switch (opt) {
		case PBOX_CLI_CTL_EXIT:
			return ctl.exit_status;
		case 'J':
			if (pbox_arg_u32("pbox status", "--job", optarg, 0, UINT32_MAX, &id) != 0) {
				return 64;
			}
			m.job = id;
			break;
		case 'g':
			if (pbox_arg_u32("pbox status", "--max-groups", optarg, 1,
					 PBOX_STATUS_GROUPS_MAX, &m.max_groups) != 0) {
				return 64;
			}
			break;
		case 'r':
			if (pbox_arg_u32("pbox status", "--max-ranges", optarg, 1,
					 PBOX_STATUS_RANGES_MAX, &m.max_ranges) != 0) {
				return 64;
			}
			break;
		case 'k':
			if (pbox_arg_u32("pbox status", "--max-ranks", optarg, 1,
					 PBOX_STATUS_RANKS_MAX, &m.max_ranks) != 0) {
				return 64;
			}
			break;
		default:
			usage(stderr);
			return 64;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "pbox status: unexpected argument '%s'\n", argv[optind]);
		return 64;
	}
	if (pbox_cli_ctl_token(&ctl) != 0) {
		return 64;
	}
	if (pbox_cli_ctl_call(&ctl, NULL, pbox_statusmsg_encode(&m), &reply, STATUS_TIMEOUT_MS) !=
	    0) {
		return 1;
	}
	if (ctl.json) {
		pbox_cli_print_json(reply);
	} else {
		print_reply(reply);
	}
	json_decref(reply);
	return 0;
}
