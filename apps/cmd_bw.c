/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * `pbox bw [list] | pbox bw probe FROM TO`: pbox-ctrld's bandwidth matrix (ctrlplane/ctrld/
 * bw.h) over its control API as an operator (Unix control socket, or the admin token).
 */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "common/args.h"

#define BW_TIMEOUT_MS 10000

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: pbox bw [list]  [options] [--json]\n"
		"       pbox bw probe   [options] [--wait SECONDS] FROM TO\n"
		"\n"
		"Print pbox-ctrld's bandwidth matrix: for each configured probe pair, the pboxd\n"
		"that probes (FROM), the responder it probes (TO: a pboxd's probe port or\n"
		"`pbox-probe --listen` on a host), the available bandwidth found by SLoPS as a\n"
		"range [r_min, r_max] (Mbit/s), the grey region where the path's load varied\n"
		"during the probe, the flags (converged, at_cap, at_min, sender_limited, budget),\n"
		"the age of the estimate and how long the probe took, and the last error.\n"
		"`probe` asks for a probe of the pair FROM TO now (after the one running, if any)\n"
		"and, with --wait, waits for its result and prints the entry (exit status 1 if\n"
		"that probe failed: the entry's last error says why).\n"
		"\n"
		"      --control HOST:PORT  pbox-ctrld's control address (default 127.0.0.1:7300)\n"
		"      --socket PATH        its local control socket instead (no token needed)\n"
		"      --admin-token-file FILE  the admin token (first line of FILE; default: the\n"
		"                           environment variable PBOX_ADMIN_TOKEN)\n"
		"      --wait SECONDS       probe: wait this long for the result (default 0: no)\n"
		"      --json               print the reply as JSON\n"
		"  -h, --help               this text\n");
}

static void print_pair(const json_t *p)
{
	const json_t *e = json_object_get(p, "estimate"), *fl, *f;
	const char *err = json_string_value(json_object_get(p, "last_error"));
	char flags[128] = "";
	size_t i, off = 0;

	printf("%-12s %-22s %-8s", json_string_value(json_object_get(p, "from")),
	       json_string_value(json_object_get(p, "to")),
	       json_string_value(json_object_get(p, "state")));
	if (e == NULL) {
		printf(" %-17s %-15s %-7s %-7s %s", "-", "-", "-", "-", "-");
	} else {
		double gmin = json_number_value(json_object_get(e, "grey_min_bps"));
		double gmax = json_number_value(json_object_get(e, "grey_max_bps"));
		char range[32], grey[32];

		fl = json_object_get(e, "flags");
		json_array_foreach(fl, i, f)
		{
			off += (size_t)snprintf(flags + off,
						off < sizeof(flags) ? sizeof(flags) - off : 0,
						"%s%s", off ? "," : "", json_string_value(f));
		}
		snprintf(range, sizeof(range), "%.1f..%.1f",
			 json_number_value(json_object_get(e, "r_min_bps")) / 1e6,
			 json_number_value(json_object_get(e, "r_max_bps")) / 1e6);
		if (gmax > 0) {
			snprintf(grey, sizeof(grey), "%.1f..%.1f", gmin / 1e6, gmax / 1e6);
		} else {
			snprintf(grey, sizeof(grey), "-");
		}
		printf(" %-17s %-15s %-7.0f %-7.1f %s", range, grey,
		       json_number_value(json_object_get(p, "age_s")),
		       (double)json_integer_value(json_object_get(e, "duration_ns")) / 1e9,
		       flags[0] ? flags : "-");
	}
	printf("  %s\n", err ? err : "");
}

static void print_matrix(const json_t *reply)
{
	const json_t *pairs = json_object_get(reply, "pairs"), *p;
	size_t i;

	if (json_array_size(pairs) == 0) {
		printf("no probe pairs (pbox-ctrld's configuration has no bandwidth = { ... } "
		       "group)\n");
		return;
	}
	printf("%-12s %-22s %-8s %-17s %-15s %-7s %-7s %s\n", "from", "to", "state", "Mbit/s",
	       "grey", "age_s", "took_s", "flags");
	json_array_foreach(pairs, i, p)
	{
		print_pair(p);
	}
}

static const json_t *find_pair(const json_t *reply, const char *from, const char *to)
{
	const json_t *p;
	size_t i;

	json_array_foreach(json_object_get(reply, "pairs"), i, p)
	{
		if (strcmp(json_string_value(json_object_get(p, "from")) ?: "", from) == 0 &&
		    strcmp(json_string_value(json_object_get(p, "to")) ?: "", to) == 0) {
			return p;
		}
	}
	return NULL;
}

int pbox_cmd_bw(int argc, char **argv)
{
	static const struct option longopts[] = {
		PBOX_CLI_CTL_LONGOPTS,
		{ "wait", required_argument, NULL, 'w' },
		PBOX_CLI_CTL_LONGOPTS_END,
	};
	struct pbox_cli_ctl ctl = { .cmd = "pbox bw", .addr = "127.0.0.1:7300", .usage = usage };
	const char *verb = "list";
	json_t *reply = NULL;
	uint32_t wait_s = 0;
	int opt, status = 1;

	if (argc >= 2 && argv[1][0] != '-') {
		verb = argv[1];
		argc--;
		argv++;
	}
	if (strcmp(verb, "list") != 0 && strcmp(verb, "probe") != 0) {
		fprintf(stderr, "pbox bw: unknown action '%s' (list, probe)\n", verb);
		return 64;
	}
	optind = 1;
	while ((opt = pbox_cli_ctl_getopt(&ctl, argc, argv, "h", longopts)) != -1) {
		switch (opt) {
		case PBOX_CLI_CTL_EXIT:
			return ctl.exit_status;
		case 'w':
			if (pbox_arg_u32("pbox bw", "--wait", optarg, 0, 3600, &wait_s) != 0) {
				return 64;
			}
			break;
		default:
			usage(stderr);
			return 64;
		}
	}
	if (pbox_cli_ctl_token(&ctl) != 0) {
		return 64;
	}
	if (strcmp(verb, "list") == 0) {
		if (optind != argc) {
			fprintf(stderr, "pbox bw list: unexpected argument '%s'\n", argv[optind]);
			return 64;
		}
		if (pbox_cli_ctl_call(&ctl, "list", json_pack("{s:s}", "op", "bw_list"), &reply,
				      BW_TIMEOUT_MS) != 0) {
			return 1;
		}
	} else {
		const char *from, *to;
		json_int_t done_at;
		const json_t *p;
		struct timespec t0, now;

		if (optind != argc - 2) {
			fprintf(stderr, "pbox bw probe: expected FROM (a pboxd's name) and TO (the "
					"responder's ADDRESS:PORT)\n");
			return 64;
		}
		from = argv[optind];
		to = argv[optind + 1];
		if (pbox_cli_ctl_call(
			    &ctl, "probe",
			    json_pack("{s:s, s:s, s:s}", "op", "bw_probe", "from", from, "to", to),
			    &reply, BW_TIMEOUT_MS) != 0) {
			return 1;
		}
		if (wait_s == 0) {
			printf("probe of %s -> %s queued\n", from, to);
			json_decref(reply);
			return 0;
		}
		done_at = json_integer_value(json_object_get(reply, "done_at"));
		json_decref(reply);
		reply = NULL;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		for (;;) {
			if (pbox_cli_ctl_call(&ctl, "probe", json_pack("{s:s}", "op", "bw_list"),
					      &reply, BW_TIMEOUT_MS) != 0) {
				return 1;
			}
			p = find_pair(reply, from, to);
			if (p != NULL &&
			    json_integer_value(json_object_get(p, "probes")) >= done_at) {
				break;
			}
			json_decref(reply);
			reply = NULL;
			clock_gettime(CLOCK_MONOTONIC, &now);
			if (now.tv_sec - t0.tv_sec >= (time_t)wait_s) {
				fprintf(stderr,
					"pbox bw probe: no result for %s -> %s within %u s\n", from,
					to, wait_s);
				return 1;
			}
			usleep(200000);
		}
		if (ctl.json) {
			pbox_cli_print_json(p);
		} else {
			printf("%-12s %-22s %-8s %-17s %-15s %-7s %-7s %s\n", "from", "to", "state",
			       "Mbit/s", "grey", "age_s", "took_s", "flags");
			print_pair(p);
		}
		/* The last probe that ended is the one asked for (or a later one). */
		status = json_object_get(p, "last_error") == NULL ? 0 : 1;
		json_decref(reply);
		return status;
	}
	if (ctl.json) {
		pbox_cli_print_json(reply);
	} else {
		print_matrix(reply);
	}
	json_decref(reply);
	return 0;
}
