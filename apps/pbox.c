/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox: the command-line front end of the worker side. One program with subcommands, so
 * that `pbox demo` can start its workers as `pbox train` from its own executable.
 */
#include <stdio.h>
#include <string.h>

#include <pbox/pbox.h>

#include "cli.h"
#include "common/log.h"

#ifndef PBOX_VERSION_STRING
#define PBOX_VERSION_STRING "0.0.0"
#endif

struct subcommand {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *summary;
};

static const struct subcommand g_cmds[] = {
	{ "demo", pbox_cmd_demo,
	  "start pboxd and N workers on this machine and train Fashion-MNIST end to end" },
	{ "train", pbox_cmd_train,
	  "train the Fashion-MNIST MLP as one rank of a pbox job, or alone (--local)" },
	{ "stats", pbox_cmd_stats, "print the counters of a running pboxd" },
	{ "job", pbox_cmd_job, "create, list or remove jobs of a running pboxd or pbox-ctrld" },
	{ "bw", pbox_cmd_bw, "print pbox-ctrld's bandwidth matrix, or probe a pair now" },
	{ "status", pbox_cmd_status,
	  "jobs, ranks, plans, and which ranks a waiting job lacks (pboxd or pbox-ctrld)" },
};

static void usage(FILE *f)
{
	fprintf(f, "Usage: pbox COMMAND [options]\n"
		   "\n"
		   "Commands:\n");
	for (size_t i = 0; i < sizeof(g_cmds) / sizeof(g_cmds[0]); i++) {
		fprintf(f, "  %-7s %s\n", g_cmds[i].name, g_cmds[i].summary);
	}
	fprintf(f, "\n"
		   "`pbox COMMAND --help` describes a command's options.\n"
		   "  -h, --help     this text\n"
		   "  -V, --version  version\n"
		   "\n"
		   "Example: pbox demo --workers 3 --epochs 3\n");
}

int main(int argc, char **argv)
{
	pbox_log_init_from_env();
	if (argc < 2) {
		usage(stderr);
		return 64;
	}
	if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 ||
	    strcmp(argv[1], "help") == 0) {
		usage(stdout);
		return 0;
	}
	if (strcmp(argv[1], "-V") == 0 || strcmp(argv[1], "--version") == 0) {
		printf("pbox %s (libpbox %s)\n", PBOX_VERSION_STRING, pbox_version());
		return 0;
	}
	for (size_t i = 0; i < sizeof(g_cmds) / sizeof(g_cmds[0]); i++) {
		if (strcmp(argv[1], g_cmds[i].name) == 0) {
			pbox_log_set_ident("pbox");
			return g_cmds[i].run(argc - 1, argv + 1);
		}
	}
	fprintf(stderr, "pbox: unknown command '%s'\n\n", argv[1]);
	usage(stderr);
	return 64;
}
