/* SPDX-License-Identifier: BSD-3-Clause */
/* pboxd configuration: a valid file loads; each kind of mistake is refused with the file,
 * line and setting named. */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/log.h"
#include "common/tsb.h"
#include "pboxd/tsbd.h"
#include "pboxd/budget.h"
#include "pboxd/config.h"
#include "dvf/dvf_job.h"

static char g_path[PATH_MAX];

/* Load text as a config file; returns the load status, err receives the message. */
static int load(const char *text, struct pboxd_config *cfg, char *err, size_t errlen)
{
	const char *tmpdir = getenv("TMPDIR");
	FILE *f;
	int fd, rc;

	/* mkstemp(3): a new file of our own, not a name someone else may have created. */
	snprintf(g_path, sizeof(g_path), "%s/pbox-test-config-XXXXXX",
		 tmpdir != NULL && *tmpdir != '\0' ? tmpdir : "/tmp");
	fd = mkstemp(g_path);
	assert_true(fd >= 0);
	f = fdopen(fd, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
	pboxd_config_defaults(cfg);
	err[0] = '\0';
	rc = pboxd_config_load(cfg, g_path, err, errlen);
	if (rc == 0) {
		rc = pboxd_config_check(cfg, err, errlen);
	}
	unlink(g_path);
	return rc;
}

static void expect_error(const char *text, const char *fragment)
{
	struct pboxd_config cfg;
	char err[512];

	assert_int_equal(load(text, &cfg, err, sizeof(err)), -EINVAL);
	if (strstr(err, fragment) == NULL) {
		fail_msg("error '%s' does not mention '%s'", err, fragment);
	}
	assert_non_null(strstr(err, g_path));
	pboxd_config_free(&cfg);
}

static void test_valid(void **state)
{
	struct pboxd_config cfg;
	char err[512];

	(void)state;
	assert_int_equal(
		load("# a full example\n"
		     "appliance = { transport = \"udp\"; data_address = \"127.0.0.1\";\n"
		     "  base_port = 9100; control = \"127.0.0.1:9000\"; cpus = [0, 1];\n"
		     "  chunk_bytes = 65536; mtu = 9000; busy_poll = true; deterministic = true;\n"
		     "  fault = \"drop=0.01,seed=3\"; stats_interval = 5; };\n"
		     "jobs = ( { id = 3; token = \"x\"; workers = 4; mode = \"server-optimizer\";\n"
		     "           optimizer = { name = \"adamw\"; lr = 1e-3; wd = 0.01; beta2 = "
		     "0.99; };\n"
		     "           keys = ( [0, 10], [1, 20] ); },\n"
		     "         { id = 4; token = \"y\"; workers = 1; reduce = \"sum\"; "
		     "deterministic = false; } );\n",
		     &cfg, err, sizeof(err)),
		0);
	assert_int_equal(cfg.base_port, 9100);
	assert_int_equal(cfg.control_port, 9000);
	assert_int_equal(cfg.ncores, 2);
	assert_int_equal(cfg.cpus[1], 1);
	assert_int_equal(cfg.chunk_bytes, 65536);
	assert_true(cfg.busy_poll);
	assert_true(cfg.fault.drop == 0.01);
	assert_int_equal(cfg.njobs, 2);
	assert_int_equal(cfg.jobs[0].mode, PBOX_MODE_SERVER_OPT);
	assert_string_equal(cfg.jobs[0].opt->name, "adamw");
	assert_true(cfg.jobs[0].opt_params.lr == 1e-3f);
	assert_true(cfg.jobs[0].opt_params.beta2 == 0.99f);
	assert_true(cfg.jobs[0].deterministic);
	assert_int_equal(cfg.jobs[0].nkeys, 2);
	assert_int_equal(cfg.jobs[0].keys[1].nelem, 20);
	assert_int_equal(cfg.jobs[1].reduce, PBOX_REDUCE_SUM);
	assert_false(cfg.jobs[1].deterministic);
	pboxd_config_free(&cfg);
}

static void test_errors(void **state)
{
	(void)state;
	expect_error("appliance = { cores = 2 ; \n base_port = ; };\n", ":2: syntax error");
	expect_error("appliance = { wrokers = 2; };\n", "appliance.wrokers: unknown setting");
	expect_error("appliance = { cores = 0; };\n", "appliance.cores: must be between 1");
	expect_error("appliance = { mtu = \"big\"; };\n", "appliance.mtu: must be an integer");
	expect_error("appliance = { chunk_bytes = 1000; };\n", "multiple of 64");
	expect_error("appliance = { control = \"localhost\"; };\n", "expected \"host:port\"");
	expect_error("appliance = { cores = 3; cpus = [0, 1]; };\n", "lists 2 CPUs but cores = 3");
	expect_error("appliance = { fault = \"drop=2\"; };\n", "probability must be in [0, 1]");
	expect_error("appliance = { transport = \"carrier-pigeon\"; };\n",
		     "transport 'carrier-pigeon' is not available");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 0; } );\n",
		     "jobs[0].workers: must be between 1 and 1024 (got 0)");
	expect_error("jobs = ( { id = 1; workers = 2; } );\n", "non-empty token");
	expect_error("jobs = ( { token = \"t\"; workers = 2; } );\n", "job needs an id");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2; mode = \"magic\"; } );\n",
		     "unknown mode 'magic'");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2; optimizer = { name = \"nag\"; "
		     "}; } );\n",
		     "only with mode = \"server-optimizer\"");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2; mode = \"server-optimizer\";\n"
		     " optimizer = { name = \"lamb\"; }; } );\n",
		     "unknown optimizer 'lamb'");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2; mode = \"server-optimizer\";\n"
		     " optimizer = { name = \"sgd\"; momentum = 1.5; }; } );\n",
		     "momentum: must be between 0 and 1");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2; },\n"
		     "         { id = 1; token = \"u\"; workers = 2; } );\n",
		     "job id 1 is defined twice");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2; keys = ( [0, 0] ); } );\n",
		     "elements 1..2^40");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2; colour = \"red\"; } );\n",
		     "jobs[0].colour: unknown setting");
}

static void test_sync_and_flow(void **state)
{
	struct pboxd_config cfg;
	char err[512];

	(void)state;
	assert_int_equal(
		load("appliance = { worker_timeout = 3; };\n"
		     "jobs = ( { id = 1; token = \"t\"; workers = 4; mode = \"server-optimizer\";\n"
		     "  sync = { model = \"pssp-dyn\"; staleness = 3; alpha = 0.8; release = "
		     "\"eager\"; };\n"
		     "  flow = { mode = \"notify-ack\"; credits = 2; verify = true; }; },\n"
		     "  { id = 2; token = \"u\"; workers = 5;\n"
		     "  sync = { model = \"drop-stragglers\"; quorum = 4; }; on_worker_loss = "
		     "\"abort\"; },\n"
		     "  { id = 3; token = \"v\"; workers = 2; flow = { mode = \"plain\"; }; } );\n",
		     &cfg, err, sizeof(err)),
		0);
	assert_int_equal(cfg.worker_timeout, 3);
	assert_int_equal(cfg.jobs[0].sync_cfg.model, PBOX_SYNC_PSSP_DYN);
	assert_int_equal(cfg.jobs[0].sync_cfg.staleness, 3);
	assert_true(cfg.jobs[0].sync_cfg.eager);
	assert_true(cfg.jobs[0].sync_cfg.alpha > 0.79 && cfg.jobs[0].sync_cfg.alpha < 0.81);
	assert_int_equal(cfg.jobs[0].credits, 2);
	assert_true(cfg.jobs[0].verify_crc);
	assert_int_equal(cfg.jobs[0].window, 5); /* s + 2 */
	assert_false(cfg.jobs[0].abort_on_loss); /* not BSP: continue by default */
	assert_int_equal(cfg.jobs[1].sync_cfg.quorum, 4);
	assert_true(cfg.jobs[1].abort_on_loss);
	assert_int_equal(cfg.jobs[1].window, 4);
	assert_true(cfg.jobs[2].plain_flow);
	assert_int_equal(cfg.jobs[2].credits, cfg.jobs[2].window - 1);
	assert_true(cfg.jobs[2].abort_on_loss); /* BSP */
	pboxd_config_free(&cfg);
}

static void test_sync_errors(void **state)
{
	(void)state;
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2; sync = { model = \"ssp\"; }; "
		     "} );\n",
		     "needs mode = \"server-optimizer\"");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2; sync = { model = "
		     "\"lockstep\"; }; } );\n",
		     "unknown model 'lockstep'");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2;\n"
		     " sync = { model = \"drop-stragglers\"; quorum = 3; }; } );\n",
		     "sync.quorum: must be between 1 and 2");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2; deterministic = true;\n"
		     " sync = { model = \"drop-stragglers\"; }; } );\n",
		     "cannot be deterministic");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2; mode = \"server-optimizer\";\n"
		     " flow = { credits = 2; }; sync = { model = \"asp\"; }; } );\n",
		     "sync model 'asp' needs flow credits = 1");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2; mode = \"server-optimizer\";\n"
		     " window = 3; sync = { model = \"ssp\"; staleness = 4; }; } );\n",
		     "window: must be at least 6");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2; sync = { release = \"soon\"; "
		     "}; } );\n",
		     "unknown release 'soon'");
	expect_error(
		"jobs = ( { id = 1; token = \"t\"; workers = 2; flow = { mode = \"tcp\"; }; } );\n",
		"unknown flow mode 'tcp'");
	expect_error(
		"jobs = ( { id = 1; token = \"t\"; workers = 2; flow = { credits = 0; }; } );\n",
		"flow.credits: must be between 1");
	expect_error(
		"jobs = ( { id = 1; token = \"t\"; workers = 2; on_worker_loss = \"panic\"; } );\n",
		"unknown on_worker_loss 'panic'");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2; sync = { model = \"pssp\";\n"
		     " probability = 1.5; }; mode = \"server-optimizer\"; } );\n",
		     "probability: must be between 0 and 1");
}

/* Broadcast-update jobs: bsp / ssp only, an optimizer for the workers, the window the
 * lagged aggregates need. */
static void test_broadcast(void **state)
{
	struct pboxd_config cfg;
	char err[512];

	(void)state;
	assert_int_equal(
		load("jobs = ( { id = 1; token = \"t\"; workers = 2; mode = \"broadcast\";\n"
		     " reduce = \"sum\"; sync = { model = \"ssp\"; staleness = 2; };\n"
		     " optimizer = { name = \"adam\"; lr = 0.001; }; } );\n",
		     &cfg, err, sizeof(err)),
		0);
	assert_int_equal(cfg.jobs[0].mode, PBOX_MODE_BROADCAST);
	assert_int_equal(cfg.jobs[0].credits, 2); /* a pull in flight beside each push */
	assert_int_equal(cfg.jobs[0].window, 7);  /* 2s + 1 + credits */
	assert_string_equal(cfg.jobs[0].opt->name, "adam");
	assert_false(cfg.jobs[0].checkpoint);
	pboxd_config_free(&cfg);
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2; mode = \"broadcast\";\n"
		     " sync = { model = \"asp\"; }; } );\n",
		     "a broadcast job runs under bsp or ssp");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2; mode = \"broadcast\";\n"
		     " window = 5; flow = { credits = 1; };\n"
		     " sync = { model = \"ssp\"; staleness = 2; }; } );\n",
		     "window: must be at least 6");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2; mode = \"broadcast\";\n"
		     " sync = { release = \"eager\"; }; } );\n",
		     "needs mode = \"server-optimizer\"");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2;\n"
		     " optimizer = { name = \"nag\"; }; } );\n",
		     "\"broadcast\" (every worker does)");
}

static void test_missing_file(void **state)
{
	struct pboxd_config cfg;
	char err[256];

	(void)state;
	pboxd_config_defaults(&cfg);
	assert_int_equal(pboxd_config_load(&cfg, "/nonexistent/pboxd.conf", err, sizeof(err)),
			 -ENOENT);
	assert_non_null(strstr(err, "/nonexistent/pboxd.conf: cannot read"));
	pboxd_config_free(&cfg);
}

static void test_parsers(void **state)
{
	int cpus[8];

	(void)state;
	assert_int_equal(pboxd_parse_cpulist("0,2-4,7", cpus, 8), 5);
	assert_int_equal(cpus[0], 0);
	assert_int_equal(cpus[3], 4);
	assert_int_equal(cpus[4], 7);
	assert_int_equal(pboxd_parse_cpulist("3-1", cpus, 8), -EINVAL);
	assert_int_equal(pboxd_parse_cpulist("0-9", cpus, 8), -EINVAL);
	assert_int_equal(pboxd_parse_cpulist("x", cpus, 8), -EINVAL);
}

/* Memory budgets: the options, the size syntax, and the admission arithmetic with the
 * numbers in the refusal. */
static void test_memory_budget(void **state)
{
	struct pboxd_config cfg;
	struct pboxd_budget b;
	struct pbox_job params = { 0 };
	struct pbox_keyspec big[] = { { 0, UINT64_C(1) << 40 } };
	struct pbox_keyspec small[] = { { 0, 1 << 20 } }; /* 4 MiB of parameters */
	uint64_t v;
	char err[512];

	(void)state;
	assert_int_equal(pboxd_parse_bytes("4G", &v), 0);
	assert_int_equal(v, UINT64_C(4) << 30);
	assert_int_equal(pboxd_parse_bytes("512MiB", &v), 0);
	assert_int_equal(v, UINT64_C(512) << 20);
	assert_int_equal(pboxd_parse_bytes("1048576", &v), 0);
	assert_int_equal(v, 1048576);
	assert_int_equal(pboxd_parse_bytes("2t", &v), 0);
	assert_int_equal(v, UINT64_C(2) << 40);
	assert_int_equal(pboxd_parse_bytes("0", &v), -EINVAL);
	assert_int_equal(pboxd_parse_bytes("4X", &v), -EINVAL);
	assert_int_equal(pboxd_parse_bytes("4GB extra", &v), -EINVAL);
	assert_int_equal(pboxd_parse_bytes("-1", &v), -EINVAL);
	assert_int_equal(pboxd_parse_bytes("9000000000000000000000", &v), -EINVAL);
	assert_int_equal(pboxd_parse_bytes("16777216T", &v), -EINVAL); /* 2^64 */

	assert_int_equal(load("appliance = { memory_budget = \"64M\"; checkpoint_dir = \"/x\";\n"
			      "  checkpoint_interval = 5; };\n"
			      "jobs = ( { id = 1; token = \"t\"; workers = 2; mode = "
			      "\"server-optimizer\";\n"
			      "  optimizer = { name = \"nag\"; }; memory_budget = 8388608; } );\n",
			      &cfg, err, sizeof(err)),
			 0);
	assert_int_equal(cfg.memory_budget, UINT64_C(64) << 20);
	assert_int_equal(cfg.jobs[0].memory_budget, UINT64_C(8) << 20);
	assert_string_equal(cfg.checkpoint_dir, "/x");
	assert_int_equal(cfg.checkpoint_interval, 5);

	/* Per job: 4 MiB of parameters with NAG are 2 models + momentum + 2 slots = 20 MiB
	 * (+ 0.13 MiB of per-chunk bookkeeping),
	 * over the job's 8 MiB, refused from the keys alone (before any geometry). */
	pboxd_budget_init(&b, cfg.memory_budget);
	params.mode = cfg.jobs[0].mode;
	params.opt = cfg.jobs[0].opt;
	params.window = cfg.jobs[0].window;
	params.sync = cfg.jobs[0].sync;
	assert_int_equal(pboxd_budget_precheck(&b, &cfg.jobs[0], &params, small, 1, 32768, 1408,
					       err, sizeof(err)),
			 -ENOSPC);
	assert_non_null(strstr(err, "needs at least 20.13 MiB"));
	assert_non_null(strstr(err, "over the job's memory_budget of 8.00 MiB (8388608 bytes)"));
	/* A hostile key set: refused on its chunk count, whatever the budget. */
	assert_int_equal(pboxd_budget_precheck(&b, &cfg.jobs[0], &params, big, 1, 1024, 1024, err,
					       sizeof(err)),
			 -E2BIG);
	assert_non_null(strstr(err, "4294967296 or more chunks"));
	/* The appliance's budget: the sum of the running sessions plus the new one. */
	cfg.jobs[0].memory_budget = 0;
	assert_int_equal(
		pboxd_budget_charge(&b, &cfg.jobs[0], UINT64_C(40) << 20, err, sizeof(err)), 0);
	assert_int_equal(
		pboxd_budget_charge(&b, &cfg.jobs[0], UINT64_C(30) << 20, err, sizeof(err)),
		-ENOSPC);
	assert_non_null(strstr(err, "needs 30.00 MiB (31457280 bytes)"));
	assert_non_null(strstr(err, "memory_budget is 64.00 MiB (67108864 bytes)"));
	assert_non_null(strstr(err, "40.00 MiB (41943040 bytes) is in use by 1 running session"));
	assert_non_null(strstr(err, "24.00 MiB (25165824 bytes) free"));
	assert_int_equal(
		pboxd_budget_charge(&b, &cfg.jobs[0], UINT64_C(24) << 20, err, sizeof(err)), 0);
	assert_int_equal(b.in_use, UINT64_C(64) << 20);
	pboxd_budget_release(&b, UINT64_C(40) << 20);
	assert_int_equal(
		pboxd_budget_charge(&b, &cfg.jobs[0], UINT64_C(30) << 20, err, sizeof(err)), 0);
	/* Near UINT64_MAX: no wrap-around lets a huge request through. */
	assert_int_equal(pboxd_budget_charge(&b, &cfg.jobs[0], UINT64_MAX - 1, err, sizeof(err)),
			 -ENOSPC);
	assert_true(pboxd_budget_machine_default() > 0);
	pboxd_config_free(&cfg);

	expect_error("appliance = { memory_budget = \"lots\"; };\n",
		     "memory_budget: 'lots' is not a size");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 1; memory_budget = \"auto\"; "
		     "} );\n",
		     "'auto' is not a size");
	expect_error("appliance = { memory_budget = 0; };\n", "must be a positive number");
}

/* non_finite: per job, "reject" by default, "propagate" accepted, anything else (another
 * word, another type, the appliance group) refused with the setting named. */
/* A job's dvf group (Parameter Flow's filter): defaults, every setting, and mistakes. */
static void test_dvf(void **state)
{
	struct pboxd_config cfg;
	char err[512];

	(void)state;
	assert_int_equal(load("jobs = ( { id = 1; token = \"t\"; workers = 2; },\n"
			      "         { id = 2; token = \"u\"; workers = 2; dvf = { }; },\n"
			      "         { id = 3; token = \"v\"; workers = 2; dvf = { low = 0.5; "
			      "up = 3; codec = \"zstd:2\"; link = \"insufficient\"; sparse = 0.9; "
			      "bitmap = false; }; } );\n",
			      &cfg, err, sizeof(err)),
			 0);
	assert_false(cfg.jobs[0].dvf.enabled);
	assert_true(cfg.jobs[1].dvf.enabled);
	assert_true(cfg.jobs[1].dvf.params.delta_low == PBOX_DVF_DEFAULT_LOW);
	assert_true(cfg.jobs[1].dvf.params.delta_up == PBOX_DVF_DEFAULT_UP);
	assert_string_equal(cfg.jobs[1].dvf.enc.codec->name, "snappy");
	assert_int_equal(cfg.jobs[1].dvf.link, PBOX_DVF_LINK_SUFFICIENT);
	assert_true(cfg.jobs[2].dvf.params.delta_low == 0.5f);
	assert_true(cfg.jobs[2].dvf.params.delta_up == 3.0f);
	assert_string_equal(cfg.jobs[2].dvf.enc.codec->name, "zstd");
	assert_int_equal(cfg.jobs[2].dvf.enc.level, 2);
	assert_int_equal(cfg.jobs[2].dvf.link, PBOX_DVF_LINK_INSUFFICIENT);
	assert_int_equal(cfg.jobs[2].dvf.enc.sparse_permille, 900);
	assert_false(cfg.jobs[2].dvf.enc.dense_bitmap);
	/* What a worker is told at registration decodes to the same settings. */
	{
		json_t *o = pbox_dvf_job_to_json(&cfg.jobs[2].dvf);
		struct pbox_dvf_job back;

		assert_int_equal(pbox_dvf_job_from_json(o, &back, err, sizeof(err)), 0);
		assert_true(back.params.delta_low == 0.5f && back.params.delta_up == 3.0f);
		assert_true(back.enc.codec == cfg.jobs[2].dvf.enc.codec && back.enc.level == 2);
		assert_int_equal(back.link, PBOX_DVF_LINK_INSUFFICIENT);
		assert_int_equal(back.enc.sparse_permille, 900);
		assert_false(back.enc.dense_bitmap);
		json_object_set_new(o, "codec", json_string("zip"));
		assert_int_equal(pbox_dvf_job_from_json(o, &back, err, sizeof(err)), -EPROTO);
		assert_non_null(strstr(err, "unknown codec 'zip'"));
		json_decref(o);
	}
	pboxd_config_free(&cfg);
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2; dvf = { low = 2; up = 1; }; "
		     "} );\n",
		     "jobs[0].dvf: low (2) must not exceed up (1)");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2; dvf = { codec = \"zstd:9\"; "
		     "}; } );\n",
		     "unknown codec or level 'zstd:9'");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2; dvf = { lo = 1; }; } );\n",
		     "lo");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2; dvf = { low = -1; }; } );\n",
		     "low: must be between 0");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2; dvf = { link = \"slow\"; }; "
		     "} );\n",
		     "slow");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2; dvf = 1; } );\n",
		     "must be a group");
}

static void test_non_finite(void **state)
{
	struct pboxd_config cfg;
	char err[512];

	(void)state;
	assert_int_equal(load("jobs = ( { id = 1; token = \"t\"; workers = 2; },\n"
			      "         { id = 2; token = \"u\"; workers = 2; non_finite = "
			      "\"propagate\"; },\n"
			      "         { id = 3; token = \"v\"; workers = 2; non_finite = "
			      "\"reject\"; mode = \"server-optimizer\";\n"
			      "           optimizer = { name = \"sgd\"; }; } );\n",
			      &cfg, err, sizeof(err)),
			 0);
	assert_int_equal(cfg.njobs, 3);
	assert_int_equal(cfg.jobs[0].non_finite, PBOX_NON_FINITE_REJECT);
	assert_int_equal(cfg.jobs[1].non_finite, PBOX_NON_FINITE_PROPAGATE);
	assert_int_equal(cfg.jobs[2].non_finite, PBOX_NON_FINITE_REJECT);
	pboxd_config_free(&cfg);

	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2; non_finite = \"ignore\"; "
		     "} );\n",
		     "non_finite: unknown non_finite 'ignore' (reject, propagate)");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2; non_finite = \"Reject\"; "
		     "} );\n",
		     "unknown non_finite 'Reject'");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 2; non_finite = true; } );\n",
		     "non_finite");
	expect_error("appliance = { non_finite = \"propagate\"; };\n", "non_finite");
}

/* The appliance's xdp group (nicfw/'s filter): defaults, values, and each mistake. */
static void test_xdp(void **state)
{
	struct pboxd_config cfg;
	char err[512];

	(void)state;
	assert_int_equal(load("appliance = { cores = 2; };\n", &cfg, err, sizeof(err)), 0);
	assert_string_equal(cfg.xdp.interface, "");
	assert_string_equal(cfg.xdp.mode, "auto");
	assert_string_equal(cfg.xdp.pin_root, "/sys/fs/bpf/pbox");
	assert_int_equal(cfg.xdp.max_chunks, 1u << 20);
	pboxd_config_free(&cfg);
	assert_int_equal(load("appliance = { xdp = { interface = \"veth1\"; mode = \"generic\"; "
			      "pin_root = \"\"; max_chunks = 4096; }; };\n",
			      &cfg, err, sizeof(err)),
			 0);
	assert_string_equal(cfg.xdp.interface, "veth1");
	assert_string_equal(cfg.xdp.mode, "generic");
	assert_string_equal(cfg.xdp.pin_root, "");
	assert_int_equal(cfg.xdp.max_chunks, 4096);
	pboxd_config_free(&cfg);

	expect_error("appliance = { xdp = { interface = \"eth1\"; mode = \"offload\"; }; };\n",
		     "xdp.mode: unknown mode 'offload' (auto, native, generic)");
	expect_error("appliance = { xdp = { interface = \"a-name-longer-than-ifnamsiz\"; }; };\n",
		     "xdp.interface: too long");
	expect_error("appliance = { xdp = { pin_root = \"pins\"; }; };\n",
		     "xdp.pin_root: must be an absolute path");
	expect_error("appliance = { xdp = { max_chunks = 0; }; };\n", "xdp.max_chunks");
	expect_error("appliance = { xdp = { iface = \"eth1\"; }; };\n", "unknown setting");
	expect_error("appliance = { xdp = \"eth1\"; };\n", "xdp: must be a group");
	expect_error("appliance = { transport = \"dpdk\"; data_address = \"10.0.0.1\"; "
		     "xdp = { interface = \"eth1\"; }; dpdk = { addresses = [ \"10.0.0.1\" ]; "
		     "}; };\n",
		     "xdp.interface needs transport \"udp\"");
}

/* The appliance's probe group (the SLoPS probe agent): off by default, values, mistakes. */
static void test_probe(void **state)
{
	struct pboxd_config cfg;
	char err[512];

	(void)state;
	assert_int_equal(load("appliance = { cores = 2; };\n", &cfg, err, sizeof(err)), 0);
	assert_false(cfg.probe.enabled);
	pboxd_config_free(&cfg);
	assert_int_equal(load("appliance = { probe = { }; };\n", &cfg, err, sizeof(err)), 0);
	assert_true(cfg.probe.enabled);
	assert_int_equal(cfg.probe.port, 55001);
	assert_true(cfg.probe.max_rate_bps == 1e9);
	assert_int_equal(cfg.probe.max_budget_s, 10);
	pboxd_config_free(&cfg);
	assert_int_equal(load("appliance = { probe = { port = 6000; address = \"10.0.0.1\"; "
			      "max_rate = \"2.5gbit\"; max_budget_s = 3; realtime = true; }; };\n",
			      &cfg, err, sizeof(err)),
			 0);
	assert_int_equal(cfg.probe.port, 6000);
	assert_string_equal(cfg.probe.address, "10.0.0.1");
	assert_true(cfg.probe.max_rate_bps == 2.5e9);
	assert_int_equal(cfg.probe.max_budget_s, 3);
	assert_true(cfg.probe.realtime);
	pboxd_config_free(&cfg);
	assert_int_equal(load("appliance = { probe = { max_rate = \"500M\"; }; };\n", &cfg, err,
			      sizeof(err)),
			 0);
	assert_true(cfg.probe.max_rate_bps == 5e8);
	pboxd_config_free(&cfg);

	expect_error("appliance = { probe = { max_rate = \"fast\"; }; };\n",
		     "probe.max_rate: expected a rate");
	expect_error("appliance = { probe = { max_rate = \"1mbit\"; }; };\n",
		     "probe.max_rate: expected a rate");
	expect_error("appliance = { probe = { max_rate = \"10tbit\"; }; };\n",
		     "probe.max_rate: expected a rate");
	expect_error("appliance = { probe = { address = \"probe.example.com\"; }; };\n",
		     "probe.address: must be a numeric");
	expect_error("appliance = { probe = { port = 0; }; };\n", "probe.port");
	expect_error("appliance = { probe = { max_budget_s = 0; }; };\n", "probe.max_budget_s");
	expect_error("appliance = { probe = { rate = \"1gbit\"; }; };\n", "unknown setting");
	expect_error("appliance = { probe = true; };\n", "probe: must be a group");
}

/* The metrics group (common/metrics.h) and log_format: off by default, loopback by
 * default when the group is there, refusals named. */
static void test_metrics_and_logs(void **state)
{
	struct pboxd_config cfg;
	char err[512];

	(void)state;
	assert_int_equal(load("appliance = { cores = 1; };\n", &cfg, err, sizeof(err)), 0);
	assert_false(cfg.metrics.enabled);
	assert_int_equal(cfg.log_format, -1);
	pboxd_config_free(&cfg);
	assert_int_equal(load("metrics = { };\nappliance = { log_format = \"json\"; };\n", &cfg,
			      err, sizeof(err)),
			 0);
	assert_true(cfg.metrics.enabled);
	assert_string_equal(cfg.metrics.host, "127.0.0.1");
	assert_int_equal(cfg.metrics.port, PBOX_METRICS_PORT_PBOXD);
	assert_int_equal(cfg.metrics.max_connections, PBOX_METRICS_MAX_CONNECTIONS);
	assert_int_equal(cfg.log_format, PBOX_LOG_FORMAT_JSON);
	pboxd_config_free(&cfg);
	assert_int_equal(load("metrics = { listen = \"0.0.0.0:9999\"; max_connections = 2; "
			      "timeout = 3; };\n",
			      &cfg, err, sizeof(err)),
			 0);
	assert_string_equal(cfg.metrics.host, "0.0.0.0");
	assert_int_equal(cfg.metrics.port, 9999);
	assert_int_equal(cfg.metrics.max_connections, 2);
	assert_int_equal(cfg.metrics.timeout_s, 3);
	pboxd_config_free(&cfg);
	expect_error("metrics = { listen = \"localhost:9540\"; };\n", "numeric IPv4 address");
	expect_error("metrics = { listen = \"127.0.0.1\"; };\n", "expected \"ADDRESS:PORT\"");
	expect_error("metrics = { listen = \"127.0.0.1:70000\"; };\n", "port must be");
	expect_error("metrics = { max_connections = 0; };\n", "metrics.max_connections");
	expect_error("metrics = { path = \"/m\"; };\n", "metrics.path: unknown setting");
	expect_error("metrics = 1;\n", "must be a group");
	expect_error("appliance = { log_format = \"xml\"; };\n", "appliance.log_format");
}

/* TSB: a job's tree = { degree; depth; parent } (pboxd/tsbd.h). */
static void test_tree(void **state)
{
	struct pboxd_config cfg;
	char err[512];

	(void)state;
	assert_int_equal(load("jobs = ( { id = 1; token = \"t\"; workers = 6;\n"
			      "  tree = { degree = 2; depth = 3; }; } );\n",
			      &cfg, err, sizeof(err)),
			 0);
	assert_true(cfg.jobs[0].tree);
	assert_int_equal(cfg.jobs[0].tree_parent[0], PBOX_TSB_ROOT);
	assert_int_equal(cfg.jobs[0].tree_parent[5], 1);
	pboxd_config_free(&cfg);
	assert_int_equal(load("jobs = ( { id = 1; token = \"t\"; workers = 3;\n"
			      "  tree = { degree = 1; depth = 3; parent = [ -1, 0, 1 ]; }; } );\n",
			      &cfg, err, sizeof(err)),
			 0);
	assert_int_equal(cfg.jobs[0].tree_parent[2], 1);
	pboxd_config_free(&cfg);
	/* a session's tree: pbox-ctrld's plan when it fits, else the job's own */
	assert_int_equal(load("jobs = ( { id = 1; token = \"t\"; workers = 6;\n"
			      "  tree = { degree = 2; depth = 3; }; } );\n",
			      &cfg, err, sizeof(err)),
			 0);
	{
		static const uint32_t chain[6] = { PBOX_TSB_ROOT, 0, 1, 2, 3, 4 };
		uint32_t parent[6];
		json_t *plan = json_pack("{s:{s:[i,i,i,i,i,i], s:i, s:i}}", "tree", "parent", -1, 0,
					 1, 2, 3, 4, "degree", 1, "depth", 6);
		json_t *bad = json_pack("{s:{s:[i,i,i,i,i,i], s:i, s:i}}", "tree", "parent", -1, 2,
					1, 2, 3, 4, "degree", 1, "depth", 6);

		assert_int_equal(pboxd_tsb_session_tree(&cfg.jobs[0], plan, parent), 1);
		assert_memory_equal(parent, chain, sizeof(chain));
		/* a plan tree with a cycle (or of another size, or none) is not used */
		assert_int_equal(pboxd_tsb_session_tree(&cfg.jobs[0], bad, parent), 0);
		assert_memory_equal(parent, cfg.jobs[0].tree_parent, sizeof(parent));
		assert_int_equal(pboxd_tsb_session_tree(&cfg.jobs[0], NULL, parent), 0);
		json_decref(plan);
		json_decref(bad);
	}
	pboxd_config_free(&cfg);
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 15;\n"
		     "  tree = { degree = 2; depth = 3; }; } );\n",
		     "15 workers do not fit a tree of degree 2 and depth 3");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 3;\n"
		     "  tree = { degree = 2; depth = 3; parent = [ -1, 2, 1 ]; }; } );\n",
		     "deeper than 3");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 3;\n"
		     "  tree = { degree = 2; parent = [ -1, 0 ]; }; } );\n",
		     "parent of each of the 3 ranks");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 3;\n"
		     "  tree = { degree = 2; width = 3; }; } );\n",
		     "width");
	expect_error("jobs = ( { id = 1; token = \"t\"; workers = 3; mode = \"server-optimizer\";\n"
		     "  sync = { model = \"ssp\"; staleness = 1; };\n"
		     "  tree = { degree = 2; depth = 3; }; } );\n",
		     "needs sync model 'bsp'");
	/* DVF and a tree together: the filtered results go down the tree as they are. */
	assert_int_equal(load("jobs = ( { id = 1; token = \"t\"; workers = 3;\n"
			      "  dvf = { low = 2.0; up = 8.0; };\n"
			      "  tree = { degree = 2; depth = 3; }; } );\n",
			      &cfg, err, sizeof(err)),
			 0);
	assert_true(cfg.jobs[0].dvf.enabled);
	assert_non_null(cfg.jobs[0].tree_parent);
	pboxd_config_free(&cfg);
}

/*
 * The dpdk group, parsed by the transport's own hooks (transport/dpdk/conf.c) in every
 * build; transport "dpdk" accepted with a routable data_address where DPDK is built and
 * refused with the reason where it is not (this file is built both ways when DPDK is
 * there: tests/unit/meson.build's config_nodpdk).
 */
static void test_dpdk(void **state)
{
	struct pboxd_config cfg;
	char err[512];

	(void)state;
	assert_int_equal(load("appliance = { cores = 1; };\n", &cfg, err, sizeof(err)), 0);
	assert_int_equal(cfg.dpdk.rx_desc, 1024);
	assert_int_equal(cfg.dpdk.mbuf_bytes, 2048);
	assert_int_equal(cfg.dpdk.idle_sleep_us, 50);
	assert_string_equal(cfg.dpdk.steering, "auto");
	assert_true(cfg.dpdk.zero_copy);
	assert_int_equal(cfg.dpdk.neal, 0);
	pboxd_config_free(&cfg);

	assert_int_equal(load("appliance = { dpdk = { eal = [ \"--vdev\", \"net_ring0\" ];\n"
			      "  addresses = [ \"10.0.0.1\", \"10.0.1.1\" ]; rx_desc = 512;\n"
			      "  steering = \"software\"; zero_copy = false; }; };\n",
			      &cfg, err, sizeof(err)),
			 0);
	assert_int_equal(cfg.dpdk.neal, 2);
	assert_int_equal(cfg.dpdk.neal_owned, 2);
	assert_string_equal(cfg.dpdk.eal[1], "net_ring0");
	assert_int_equal(cfg.dpdk.naddrs, 2);
	assert_int_equal(cfg.dpdk.addrs[1], htonl(0x0a000101));
	assert_int_equal(cfg.dpdk.rx_desc, 512);
	assert_string_equal(cfg.dpdk.steering, "software");
	assert_false(cfg.dpdk.zero_copy);
	pboxd_config_free(&cfg);
	assert_int_equal(cfg.dpdk.neal, 0);

	expect_error("appliance = { dpdk = { steering = \"magic\"; }; };\n", "dpdk.steering");
	expect_error("appliance = { dpdk = { addresses = [ \"eth1\" ]; }; };\n",
		     "dpdk.addresses: element 0 is not an IPv4 address");
	expect_error("appliance = { dpdk = { eal = [ 1 ]; }; };\n",
		     "dpdk.eal: element 0 is not a string");
	expect_error("appliance = { dpdk = { rx_desc = 8; }; };\n", "dpdk.rx_desc");
	expect_error("appliance = { dpdk = { ports = 1; }; };\n", "unknown setting");
	expect_error("appliance = { dpdk = \"eal\"; };\n", "dpdk: must be a group");

	if (pbox_dpdk_conf_built()) {
		assert_int_equal(
			load("appliance = { transport = \"dpdk\"; data_address = "
			     "\"10.0.0.1\"; dpdk = { addresses = [ \"10.0.0.1\" ]; }; };\n",
			     &cfg, err, sizeof(err)),
			0);
		pboxd_config_free(&cfg);
		expect_error("appliance = { transport = \"dpdk\"; };\n",
			     "transport \"dpdk\" needs data_address");
		expect_error("appliance = { transport = \"dpdk\"; data_address = \"10.0.0.2\"; "
			     "dpdk = { addresses = [ \"10.0.0.1\" ]; }; };\n",
			     "is not one of dpdk.addresses");
		expect_error("appliance = { transport = \"ib\"; };\n",
			     "(this build has: udp, dpdk");
	} else {
		expect_error(
			"appliance = { transport = \"dpdk\"; data_address = \"10.0.0.1\"; "
			"dpdk = { addresses = [ \"10.0.0.1\" ]; }; };\n",
			"transport 'dpdk' is not available: this pboxd was built without DPDK");
		/* Other transports may follow udp; dpdk is not among them. */
		assert_int_equal(
			load("appliance = { transport = \"ib\"; };\n", &cfg, err, sizeof(err)),
			-EINVAL);
		assert_non_null(strstr(err, "(this build has: udp"));
		assert_null(strstr(err, "dpdk"));
		pboxd_config_free(&cfg);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_valid),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_sync_and_flow),
		cmocka_unit_test(test_sync_errors),
		cmocka_unit_test(test_missing_file),
		cmocka_unit_test(test_parsers),
		cmocka_unit_test(test_memory_budget),
		cmocka_unit_test(test_non_finite),
		cmocka_unit_test(test_xdp),
		cmocka_unit_test(test_probe),
		cmocka_unit_test(test_metrics_and_logs),
		cmocka_unit_test(test_broadcast),
		cmocka_unit_test(test_dvf),
		cmocka_unit_test(test_tree),
		cmocka_unit_test(test_dpdk),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
