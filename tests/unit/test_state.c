/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-ctrld's state file (ctrlplane/ctrld/state.h): what is saved loads back the same,
 * with mode 0600 whatever the umask and no temporary file left; a missing file is an
 * empty state; every kind of damage is refused with the file, the member and the cause,
 * and a refused save leaves the old file as it was.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "state.h"

static char g_dir[64], g_path[128];

static json_t *parse(const char *s)
{
	json_t *o = json_loads(s, 0, NULL);

	assert_non_null(o);
	return o;
}

static int setup(void **state)
{
	(void)state;
	snprintf(g_dir, sizeof(g_dir), "/tmp/pbox-test-state-XXXXXX");
	assert_non_null(mkdtemp(g_dir));
	snprintf(g_path, sizeof(g_path), "%s/ctrld.state", g_dir);
	return 0;
}

static int teardown(void **state)
{
	char tmp[160];

	(void)state;
	snprintf(tmp, sizeof(tmp), "%s.tmp", g_path);
	unlink(tmp);
	unlink(g_path);
	rmdir(g_dir);
	return 0;
}

static void write_file(const char *text)
{
	FILE *f = fopen(g_path, "w");

	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static void test_round_trip(void **state)
{
	json_t *jobs = parse(
		"[{\"job\":{\"id\":1,\"token\":\"s3cret\",\"workers\":2,\"keys\":[[100,8192]]},"
		"\"pboxd\":\"a\",\"assignment\":{\"chunk_bytes\":32768,\"map\":[1]}},"
		"{\"job\":{\"id\":2,\"token\":\"t\",\"workers\":3},\"plan\":{\"tree\":{"
		"\"revision\":"
		"4},\"thresholds\":null},\"placement\":[\"h1\",\"h2\",\"h3\"]}]");
	json_t *rms = parse("[{\"id\":7,\"pboxd\":\"b\"}]"), *j2 = NULL, *r2 = NULL;
	char err[512], tmp[160];
	struct stat st;
	mode_t old;

	(void)state;
	assert_int_equal(ctrld_state_load(g_path, &j2, &r2, err, sizeof(err)), -ENOENT);
	assert_int_equal(json_array_size(j2), 0);
	assert_int_equal(json_array_size(r2), 0);
	json_decref(j2);
	json_decref(r2);
	old = umask(0);
	assert_int_equal(ctrld_state_save(g_path, jobs, rms, err, sizeof(err)), 0);
	umask(old);
	assert_int_equal(stat(g_path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	snprintf(tmp, sizeof(tmp), "%s.tmp", g_path);
	assert_int_not_equal(access(tmp, F_OK), 0);
	assert_int_equal(ctrld_state_load(g_path, &j2, &r2, err, sizeof(err)), 0);
	assert_true(json_equal(j2, jobs));
	assert_true(json_equal(r2, rms));
	json_decref(j2);
	json_decref(r2);
	/* A save that cannot be made leaves the old file. */
	assert_int_equal(chmod(g_dir, 0500), 0);
	if (geteuid() != 0) {
		assert_int_equal(ctrld_state_save(g_path, rms, rms, err, sizeof(err)), -EACCES);
		assert_non_null(strstr(err, g_path));
		assert_int_equal(ctrld_state_load(g_path, &j2, &r2, err, sizeof(err)), 0);
		assert_true(json_equal(j2, jobs));
		json_decref(j2);
		json_decref(r2);
	}
	assert_int_equal(chmod(g_dir, 0700), 0);
	json_decref(jobs);
	json_decref(rms);
}

static void test_refused(void **state)
{
	static const struct {
		const char *text, *words;
	} bad[] = {
		{ "{\"format\":\"pbox-ctrld-state\",\"version\":1,\"jobs\":[", "line 1" },
		{ "[]", "not a JSON object" },
		{ "{\"format\":\"other\",\"version\":1,\"jobs\":[]}", "format" },
		{ "{\"format\":\"pbox-ctrld-state\",\"version\":2,\"jobs\":[]}", "version: not 1" },
		{ "{\"format\":\"pbox-ctrld-state\",\"version\":1}", "jobs: not a list" },
		{ "{\"format\":\"pbox-ctrld-state\",\"version\":1,\"jobs\":[],\"x\":0}",
		  "x: unknown" },
		{ "{\"format\":\"pbox-ctrld-state\",\"version\":1,\"jobs\":[],\"jobs\":[]}",
		  "duplicate" },
		{ "{\"format\":\"pbox-ctrld-state\",\"version\":1,\"jobs\":[1]}",
		  "jobs[0]: not an" },
		{ "{\"format\":\"pbox-ctrld-state\",\"version\":1,\"jobs\":[{\"job\":{\"id\":1,"
		  "\"token\":\"t\",\"workers\":2},\"where\":\"a\"}]}",
		  "jobs[0].where: unknown member" },
		{ "{\"format\":\"pbox-ctrld-state\",\"version\":1,\"jobs\":[{\"job\":{\"id\":1,"
		  "\"token\":\"t\",\"workers\":0}}]}",
		  "jobs[0]: job description: job.workers" },
		{ "{\"format\":\"pbox-ctrld-state\",\"version\":1,\"jobs\":[{\"job\":{\"id\":1,"
		  "\"token\":\"t\",\"workers\":2},\"plan\":{\"route\":{}}}]}",
		  "jobs[0]" },
		{ "{\"format\":\"pbox-ctrld-state\",\"version\":1,\"jobs\":[{\"job\":{\"id\":1,"
		  "\"token\":\"t\",\"workers\":2},\"assignment\":{\"chunk_bytes\":32768,\"map\":["
		  "99]}}"
		  "]}",
		  "assignment.map[0]" },
		{ "{\"format\":\"pbox-ctrld-state\",\"version\":1,\"jobs\":[{\"job\":{\"id\":1,"
		  "\"token\":\"t\",\"workers\":2},\"pboxd\":\"\"}]}",
		  "jobs[0].pboxd" },
		{ "{\"format\":\"pbox-ctrld-state\",\"version\":1,\"jobs\":[{\"job\":{\"id\":1,"
		  "\"token\":\"t\",\"workers\":2}},{\"job\":{\"id\":1,\"token\":\"u\",\"workers\":"
		  "2}}]}",
		  "jobs[1]: job 1 is also jobs[0]" },
		{ "{\"format\":\"pbox-ctrld-state\",\"version\":1,\"jobs\":[],\"removals\":[{"
		  "\"id\":"
		  "1}]}",
		  "removals[0]" },
	};
	char err[512];

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		json_t *j = (json_t *)1, *r = (json_t *)1;

		write_file(bad[i].text);
		err[0] = '\0';
		assert_int_equal(ctrld_state_load(g_path, &j, &r, err, sizeof(err)), -EINVAL);
		assert_null(j);
		assert_null(r);
		if (strstr(err, bad[i].words) == NULL || strstr(err, g_path) == NULL) {
			fail_msg("case %zu: '%s' lacks '%s'", i, err, bad[i].words);
		}
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
		cmocka_unit_test_setup_teardown(test_refused, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
