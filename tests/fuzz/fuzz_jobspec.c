/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz harness: job-administration requests as pboxd decodes them from a client: the
 * input is one request line; json_loads (as control.c), pbox_jobmsg_decode
 * (common/jobspec.c), and for a job_create the description's conversion to a libconfig
 * group and its validation as a configuration-file job (pboxd_job_cfg_from_json, with
 * pboxd's defaults). Also SETTING=VALUE words (pbox_jobspec_set_kv, the `pbox job`
 * command line) when the input starts with "kv:". A job_create's "assignment" (a control
 * plane's chunk -> core map) goes through pboxd's strict check against 1..4 cores
 * (pboxd_job_cfg_set_assignment), and an "appliance" member (a pboxd's description of its
 * cores, as pbox-ctrld reads it from job_list) through ctrld_cores_from_json and, when
 * accepted, pbox-ctrld's assignment of the job's chunks to those cores (ctrld_assign).
 *
 * Invariants beyond the sanitizers: a refused request has a message; an accepted job has
 * every setting in its documented range (as fuzz_config checks config-file jobs); a
 * description that converts converts back (pbox_jobspec_from_setting) to a JSON value that
 * converts again to the same setting tree (the round trip pbox-ctrld relies on to send
 * its configuration file's jobs); an accepted assignment maps every chunk to an existing
 * core; pbox-ctrld's assignment is accepted by pboxd's check.
 */
#include <errno.h>

#include "../../ctrlplane/ctrld/assign.h"
#include "common/jobspec.h"
#include "common/log.h"
#include "fuzz.h"
#include "harness.h"
#include "pboxd/config.h"

static void check_job(const struct pboxd_job_cfg *j)
{
	FUZZ_CHECK(j->workers >= 1 && j->workers <= PBOX_MAX_WORKERS, "workers %u", j->workers);
	FUZZ_CHECK(memchr(j->token, '\0', sizeof(j->token)) != NULL && j->token[0] != '\0',
		   "token");
	FUZZ_CHECK(j->sync != NULL && j->opt != NULL, "no sync model or optimizer");
	FUZZ_CHECK(j->credits >= 1 && j->window >= 2 && j->window >= j->credits,
		   "credits %u window %u", j->credits, j->window);
	FUZZ_CHECK((j->keys == NULL) == (j->nkeys == 0), "%u keys at %p", j->nkeys,
		   (const void *)j->keys);
	for (uint32_t k = 0; k < j->nkeys; k++) {
		FUZZ_CHECK(j->keys[k].nelem >= 1, "key %u: no elements", k);
	}
}

static void round_trip(const json_t *desc)
{
	char err[512];
	config_t a, b;
	json_t *back, *again;

	config_init(&a);
	config_init(&b);
	if (pbox_jobspec_to_setting(desc, config_root_setting(&a), "job", err, sizeof(err)) == 0) {
		back = pbox_jobspec_from_setting(config_lookup(&a, "job"));
		FUZZ_CHECK(back != NULL, "from_setting failed");
		FUZZ_CHECK(pbox_jobspec_to_setting(back, config_root_setting(&b), "job", err,
						   sizeof(err)) == 0,
			   "the converted-back description is refused: %s", err);
		again = pbox_jobspec_from_setting(config_lookup(&b, "job"));
		FUZZ_CHECK(again != NULL && json_equal(back, again), "the round trip changed it");
		json_decref(back);
		json_decref(again);
	} else {
		FUZZ_CHECK(err[0] != '\0', "refused without a message");
	}
	config_destroy(&a);
	config_destroy(&b);
}

/* pboxd's check of an assignment, and pbox-ctrld's assignment for the cores in app. */
static void check_assignment(const json_t *req, const struct pbox_jobmsg *m,
			     const struct pboxd_job_cfg *jc0)
{
	struct pboxd_config cfg;
	struct pboxd_job_cfg jc = *jc0;
	struct ctrld_cores cores;
	struct ctrld_core_load load;
	json_t *a = NULL;
	char err[512];
	int rc;

	pboxd_config_defaults(&cfg);
	cfg.ncores = 1 + (uint32_t)(json_array_size(json_object_get(m->assignment, "map")) % 4);
	jc.core_map = NULL;
	if (m->assignment != NULL) {
		err[0] = '\0';
		rc = pboxd_job_cfg_set_assignment(&cfg, &jc, m->assignment, err, sizeof(err));
		FUZZ_CHECK(rc == 0 || rc == -EINVAL || rc == -ENOMEM, "set_assignment: %d", rc);
		FUZZ_CHECK(rc == 0 || err[0] != '\0', "an assignment refused without a message");
		for (uint32_t i = 0; rc == 0 && i < jc.ncore_map; i++) {
			FUZZ_CHECK(jc.core_map[i] < cfg.ncores, "chunk %u on core %u of %u", i,
				   jc.core_map[i], cfg.ncores);
		}
		free(jc.core_map);
		jc.core_map = NULL;
	}
	err[0] = '\0';
	if (json_object_get(req, "appliance") != NULL &&
	    ctrld_cores_from_json(json_object_get(req, "appliance"), &cores, err, sizeof(err)) ==
		    0 &&
	    jc.keys != NULL && jc.nkeys <= 64) {
		uint64_t nchunks = 0;

		/* Small key sets only: the assignment's JSON map is one integer per chunk. */
		if (pbox_jobdesc_count_chunks(jc.keys, jc.nkeys, cores.chunk_bytes, &nchunks, err,
					      sizeof(err)) != 0 ||
		    nchunks > 4096) {
			pboxd_config_free(&cfg);
			return;
		}
		rc = ctrld_assign(&cores, m->job, NULL, &a, &load, err, sizeof(err));
		FUZZ_CHECK(rc == 0 || rc == 1 || rc == -EINVAL || rc == -ENOMEM, "assign: %d", rc);
		if (rc == 0) {
			cfg.ncores = cores.ncores;
			cfg.chunk_bytes = cores.chunk_bytes;
			rc = pboxd_job_cfg_set_assignment(&cfg, &jc, a, err, sizeof(err));
			FUZZ_CHECK(rc == 0, "pboxd refused pbox-ctrld's assignment: %s", err);
			free(jc.core_map);
			json_decref(a);
		}
	} else if (json_object_get(req, "appliance") != NULL) {
		FUZZ_CHECK(cores.known || err[0] != '\0', "cores refused without a message");
	}
	pboxd_config_free(&cfg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static bool init;
	struct pboxd_config cfg;
	struct pboxd_job_cfg jc;
	struct pbox_jobmsg m;
	json_t *req;
	char err[512], *text;
	int rc;

	if (!init) {
		pbox_log_set_level(PBOX_LOGC_COUNT, PBOX_LOG_LVL_DEBUG);
		pbox_log_set_sink(pbox_test_log_silent, NULL);
		init = true;
	}
	if (size > 1 << 20) {
		return 0;
	}
	text = malloc(size + 1);
	FUZZ_CHECK(text != NULL, "out of memory");
	memcpy(text, data, size);
	text[size] = '\0';
	if (size >= 3 && memcmp(text, "kv:", 3) == 0) {
		json_t *desc = json_object();
		char *save = NULL;

		for (char *w = strtok_r(text + 3, " \n", &save); w != NULL;
		     w = strtok_r(NULL, " \n", &save)) {
			err[0] = '\0';
			rc = pbox_jobspec_set_kv(desc, w, err, sizeof(err));
			FUZZ_CHECK(rc == 0 || rc == -ENOMEM || err[0] != '\0',
				   "kv refused silently");
		}
		round_trip(desc);
		json_decref(desc);
		free(text);
		return 0;
	}
	req = json_loads(text, 0, NULL);
	free(text);
	if (req == NULL || !json_is_object(req)) {
		json_decref(req);
		return 0;
	}
	err[0] = '\0';
	rc = pbox_jobmsg_decode(req, &m, err, sizeof(err));
	FUZZ_CHECK(rc == 0 || rc == -ENOENT || rc == -EINVAL, "decode returned %d", rc);
	FUZZ_CHECK(rc != -EINVAL || err[0] != '\0', "decode refused without a message");
	if (rc == 0 && m.op == PBOX_JOBMSG_PLAN) {
		FUZZ_CHECK(json_is_object(m.plan), "job_plan decoded without a plan object");
		FUZZ_CHECK(pbox_jobspec_plan_revision(m.plan) >= 0, "a negative plan revision");
	}
	if (rc == 0 && m.op == PBOX_JOBMSG_CREATE) {
		pboxd_config_defaults(&cfg);
		err[0] = '\0';
		rc = pboxd_job_cfg_from_json(&cfg, m.job, &jc, err, sizeof(err));
		if (rc == 0) {
			check_job(&jc);
			check_assignment(req, &m, &jc);
			pboxd_job_cfg_free(&jc);
		} else {
			FUZZ_CHECK(rc == -EINVAL || rc == -ENOMEM, "from_json returned %d", rc);
			FUZZ_CHECK(err[0] != '\0', "a job refused without a message");
			FUZZ_CHECK(jc.keys == NULL, "a refused job kept its keys");
		}
		round_trip(m.job);
		pboxd_config_free(&cfg);
	}
	json_decref(req);
	return 0;
}
