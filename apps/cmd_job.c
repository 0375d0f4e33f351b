/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * `pbox job create|list|rm`: jobs of a running pboxd (or pbox-ctrld, which speaks the same
 * messages) at run time, over its control channel as an operator (Unix control socket, or
 * the admin token). The job definition has the settings of a configuration file's job
 * group, as a JSON object (--file) and/or SETTING=VALUE words (common/jobspec.h).
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
#include "common/jobspec.h"

#define JOB_TIMEOUT_MS 10000

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: pbox job create [options] [--file FILE.json] [SETTING=VALUE ...]\n"
		"       pbox job list   [options] [--json]\n"
		"       pbox job rm     [options] ID\n"
		"\n"
		"Create, list or remove jobs of a running pboxd (or pbox-ctrld) at run time. A\n"
		"job definition has the settings of a job group of pboxd's configuration file\n"
		"(id, token, workers, mode, reduce, optimizer, keys, window, deterministic, sync,\n"
		"flow, on_worker_loss, memory_budget, non_finite), given as a JSON object in\n"
		"FILE (\"-\": standard input) and/or as SETTING=VALUE words, which override it:\n"
		"  pbox job create id=5 token=s3cret workers=2 mode=server-optimizer \\\n"
		"      optimizer.name=nag optimizer.lr=0.1 sync.model=ssp sync.staleness=2\n"
		"  keys=ID:ELEMENTS,ID:ELEMENTS,...   a fixed key set\n"
		"The appliance validates it exactly as a configuration file's job. Removing a\n"
		"job ends its session: its workers get an error naming the removal.\n"
		"\n"
		"      --control HOST:PORT  control address (default 127.0.0.1:7000)\n"
		"      --socket PATH        the local control socket instead (no token needed)\n"
		"      --admin-token-file FILE  the admin token (first line of FILE; default: the\n"
		"                           environment variable PBOX_ADMIN_TOKEN)\n"
		"  -f, --file FILE          the job definition as JSON (create)\n"
		"      --json               print the reply as JSON (list)\n"
		"  -h, --help               this text\n");
}

static json_t *read_json_file(const char *path, char *err, size_t errlen)
{
	json_error_t jerr;
	json_t *o;

	if (strcmp(path, "-") == 0) {
		o = json_loadf(stdin, 0, &jerr);
	} else {
		o = json_load_file(path, 0, &jerr);
	}
	if (o == NULL) {
		snprintf(err, errlen, "%s:%d: %s", path, jerr.line, jerr.text);
	} else if (!json_is_object(o)) {
		snprintf(err, errlen, "%s: a job definition must be a JSON object", path);
		json_decref(o);
		o = NULL;
	}
	return o;
}

/* One line per plan (pbox-ctrld's trees and thresholds): the tree's parents (-1: the
 * appliance) and the DVF choices; nothing without a plan. */
static void print_plan(const json_t *plan)
{
	const json_t *t = json_object_get(plan, "tree"), *th = json_object_get(plan, "thresholds"),
		     *w;
	size_t i;

	if (!json_is_object(t) && !json_is_object(th)) {
		return;
	}
	printf("  plan:");
	if (json_is_object(t)) {
		printf(" tree rev %" PRIu64 " %s objective %.3f parents [",
		       pbox_cli_json_u64(t, "revision"),
		       json_string_value(json_object_get(t, "method")) ?: "-",
		       json_number_value(json_object_get(t, "objective")));
		json_array_foreach(json_object_get(t, "parent"), i, w)
		{
			printf("%s%lld", i ? " " : "", (long long)json_integer_value(w));
		}
		printf("]");
	}
	if (json_is_object(th)) {
		printf(" broadcast %s; pushes", json_string_value(json_object_get(
							json_object_get(th, "broadcast"), "select"))
							?: "-");
		json_array_foreach(json_object_get(th, "workers"), i, w)
		{
			const char *p = json_string_value(json_object_get(w, "push"));

			printf(" %s", p != NULL && strcmp(p, "delta_up") == 0 ? "up" : "low");
		}
	}
	printf("\n");
	if (json_is_object(json_object_get(plan, "phub"))) {
		const json_t *ph = json_object_get(plan, "phub");

		/* PHub's rule (ctrlplane/ctrld/plan.h): the recommendation and its inputs. */
		printf("  phub: %s (%" PRIu64 " rack(s) x %" PRIu64 " workers; core %.0f, "
		       "appliance %.0f, worker %.0f%s Mbit/s; flat %.3g s/Gbit, hierarchical "
		       "%.3g s/Gbit): %s\n",
		       json_string_value(json_object_get(ph, "recommend")) ?: "-",
		       pbox_cli_json_u64(ph, "racks"), pbox_cli_json_u64(ph, "workers_per_rack"),
		       json_number_value(json_object_get(ph, "core_bps")) / 1e6,
		       json_number_value(json_object_get(ph, "appliance_bps")) / 1e6,
		       json_number_value(json_object_get(ph, "worker_bps")) / 1e6,
		       json_is_true(json_object_get(ph, "worker_bps_measured")) ? " measured" : "",
		       json_number_value(json_object_get(ph, "flat_s_per_bit")) * 1e9,
		       json_number_value(json_object_get(ph, "hierarchical_s_per_bit")) * 1e9,
		       json_string_value(json_object_get(ph, "reason")) ?: "");
	}
}

/* The placement summary: pbox-ctrld's "assignment" (chunks and bytes per core), or
 * pboxd's "chunks_assigned_by". */
static void print_assignment(const json_t *j)
{
	const json_t *a = json_object_get(j, "assignment"), *n;
	const char *by = json_string_value(json_object_get(a, "by"));
	size_t k;

	if (by == NULL) {
		by = json_string_value(json_object_get(j, "chunks_assigned_by"));
		if (by != NULL) {
			printf("  cores: chunks assigned by %s\n", by);
		}
		return;
	}
	if (strcmp(by, "pbox-ctrld") != 0) {
		printf("  cores: chunks assigned by %s (at register)", by);
		json_array_foreach(json_object_get(a, "bytes"), k, n)
		{
			printf("%s core %zu %.1f KiB", k ? "," : ":", k,
			       (double)json_integer_value(n) / 1024.0);
		}
		printf("\n");
		return;
	}
	printf("  cores: chunks assigned by pbox-ctrld on %s:",
	       json_string_value(json_object_get(a, "pboxd")) ?: "?");
	json_array_foreach(json_object_get(a, "chunks"), k, n)
	{
		printf(" core %zu %" PRIu64 " chunk%s %.1f KiB%s", k,
		       (uint64_t)json_integer_value(n), json_integer_value(n) == 1 ? "" : "s",
		       (double)json_integer_value(json_array_get(json_object_get(a, "bytes"), k)) /
			       1024.0,
		       k + 1 < json_array_size(json_object_get(a, "chunks")) ? "," : "");
	}
	printf("\n");
}

static void print_list(const json_t *jobs)
{
	const json_t *j;
	size_t i;

	if (json_array_size(jobs) == 0) {
		printf("no jobs\n");
		return;
	}
	printf("%-10s %-8s %-17s %-8s %-8s %-9s %-10s %s\n", "id", "origin", "mode", "sync",
	       "workers", "state", "connected", "where");
	json_array_foreach(jobs, i, j)
	{
		const char *where = json_string_value(json_object_get(j, "pboxd"));

		printf("%-10" PRIu64 " %-8s %-17s %-8s %-8" PRIu64 " %-9s %-10" PRIu64 " %s\n",
		       pbox_cli_json_u64(j, "id"),
		       json_string_value(json_object_get(j, "origin")) ?: "-",
		       json_string_value(json_object_get(j, "mode")) ?: "-",
		       json_string_value(json_object_get(j, "sync")) ?: "-",
		       pbox_cli_json_u64(j, "workers"),
		       json_string_value(json_object_get(j, "state")) ?: "-",
		       pbox_cli_json_u64(j, "connected"), where ? where : "");
		print_plan(json_object_get(j, "plan"));
		print_assignment(j);
	}
}

int pbox_cmd_job(int argc, char **argv)
{
	static const struct option longopts[] = {
		PBOX_CLI_CTL_LONGOPTS,
		{ "file", required_argument, NULL, 'f' },
		PBOX_CLI_CTL_LONGOPTS_END,
	};
	struct pbox_cli_ctl ctl = { .cmd = "pbox job", .addr = "127.0.0.1:7000", .usage = usage };
	const char *file = NULL, *verb;
	json_t *req = NULL, *reply = NULL, *desc = NULL;
	char err[768];
	int opt;

	if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 64 : 0;
	}
	verb = argv[1];
	if (strcmp(verb, "create") != 0 && strcmp(verb, "list") != 0 && strcmp(verb, "rm") != 0) {
		fprintf(stderr, "pbox job: unknown action '%s' (create, list, rm)\n", verb);
		return 64;
	}
	argc--;
	argv++;
	optind = 1;
	while ((opt = pbox_cli_ctl_getopt(&ctl, argc, argv, "f:h", longopts)) != -1) {
		switch (opt) {
		case PBOX_CLI_CTL_EXIT:
			return ctl.exit_status;
		case 'f':
			file = optarg;
			break;
		default:
			usage(stderr);
			return 64;
		}
	}
	if (pbox_cli_ctl_token(&ctl) != 0) {
		return 64;
	}
	if (strcmp(verb, "create") == 0) {
		desc = file != NULL ? read_json_file(file, err, sizeof(err)) : json_object();
		if (desc == NULL) {
			fprintf(stderr, "pbox job create: %s\n", err);
			return 64;
		}
		for (int i = optind; i < argc; i++) {
			if (pbox_jobspec_set_kv(desc, argv[i], err, sizeof(err)) != 0) {
				fprintf(stderr, "pbox job create: %s\n", err);
				json_decref(desc);
				return 64;
			}
		}
		if (json_object_size(desc) == 0) {
			fprintf(stderr, "pbox job create: no job definition (--file or "
					"SETTING=VALUE words)\n");
			json_decref(desc);
			return 64;
		}
		req = pbox_jobmsg_create(desc, NULL);
		json_decref(desc);
	} else if (strcmp(verb, "rm") == 0) {
		uint32_t id;

		if (optind != argc - 1 ||
		    pbox_arg_u32("pbox job rm", "ID", argv[optind], 0, UINT32_MAX, &id) != 0) {
			fprintf(stderr, "pbox job rm: expected one job ID\n");
			return 64;
		}
		req = pbox_jobmsg_rm(id, NULL);
	} else {
		if (optind != argc) {
			fprintf(stderr, "pbox job list: unexpected argument '%s'\n", argv[optind]);
			return 64;
		}
		req = pbox_jobmsg_list(NULL);
	}
	if (pbox_cli_ctl_call(&ctl, verb, req, &reply, JOB_TIMEOUT_MS) != 0) {
		return 1;
	}
	if (strcmp(verb, "list") == 0) {
		if (ctl.json) {
			pbox_cli_print_json(reply);
		} else {
			print_list(json_object_get(reply, "jobs"));
		}
	} else {
		printf("job %" PRIu64 " %s\n", pbox_cli_json_u64(reply, "id"),
		       strcmp(verb, "rm") == 0 ? "removed" : "created");
	}
	json_decref(reply);
	return 0;
}
