/* SPDX-License-Identifier: BSD-3-Clause */
/* Checkpoints: the state round trip through the file, refusals of files that do not match
 * (other keys, other optimizer, corruption), and the core-side capture at a version
 * boundary. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "pboxd/checkpoint.h"

struct fixture {
	struct pbox_jobdesc desc;
	struct pbox_job job;
	char path[256];
};

static const struct pbox_keyspec g_keys[] = { { 0, 784 * 256 }, { 1, 256 }, { 7, 3 } };

static void make(struct fixture *fx, const char *opt, uint32_t ncores)
{
	char err[256];

	memset(fx, 0, sizeof(*fx));
	assert_int_equal(pbox_jobdesc_build(&fx->desc, g_keys, 3, 2, ncores, 32768, 1408, NULL, err,
					    sizeof(err)),
			 0);
	fx->job.wire.id = 4;
	fx->job.wire.desc = &fx->desc;
	fx->job.mode = PBOX_MODE_SERVER_OPT;
	fx->job.opt = pbox_optimizer_find(opt);
	fx->job.window = 2;
	fx->job.sync = pbox_sync_ops(PBOX_SYNC_BSP);
	fx->job.checkpoint = true;
	fx->job.state = pbox_job_state_create(&fx->job);
	assert_non_null(fx->job.state);
	snprintf(fx->path, sizeof(fx->path), "%s/pbox-test-ckpt-%d.ckpt",
		 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
}

static void destroy(struct fixture *fx)
{
	pbox_job_state_free(fx->job.state);
	pbox_jobdesc_free(&fx->desc);
}

static struct pbox_chunk_state *chunk(struct fixture *fx, uint32_t c)
{
	const struct pbox_chunk_desc *cd = &fx->desc.chunks[c];

	return &fx->job.state->core[cd->core].chunks[cd->local];
}

/* Element i of key k's vector v: distinct everywhere. */
static float val(uint32_t k, uint64_t i, unsigned v, uint32_t version)
{
	return (float)(k * 1000003u + i) * 0.25f + (float)v * 0.125f + (float)version;
}

static void fill(struct fixture *fx, uint32_t version)
{
	for (uint32_t c = 0; c < fx->desc.nchunks; c++) {
		const struct pbox_chunk_desc *cd = &fx->desc.chunks[c];
		struct pbox_chunk_state *cs = chunk(fx, c);
		float *vec[3] = { cs->model[version & 1], cs->s0, cs->s1 };

		for (unsigned v = 0; v <= fx->job.opt->nstate; v++) {
			for (uint32_t i = 0; i < cd->bytes / 4; i++) {
				vec[v][i] = val(cd->key, cd->elem_off + i, v, version);
			}
		}
		/* The other model buffer holds something else (the previous version). */
		memset(cs->model[(version + 1) & 1], 0x7f, cd->bytes);
		cs->version = version;
		cs->initialized = true;
	}
}

static void check(struct fixture *fx, uint32_t version)
{
	for (uint32_t c = 0; c < fx->desc.nchunks; c++) {
		const struct pbox_chunk_desc *cd = &fx->desc.chunks[c];
		struct pbox_chunk_state *cs = chunk(fx, c);
		float *vec[3] = { cs->model[version & 1], cs->s0, cs->s1 };

		assert_int_equal(cs->version, version);
		assert_true(cs->initialized);
		for (unsigned v = 0; v <= fx->job.opt->nstate; v++) {
			for (uint32_t i = 0; i < cd->bytes / 4; i++) {
				assert_true(vec[v][i] ==
					    val(cd->key, cd->elem_off + i, v, version));
			}
		}
	}
}

static void test_round_trip(void **state)
{
	struct fixture a, b;
	uint32_t version = 0;
	char err[512];

	(void)state;
	make(&a, "adam", 2);
	fill(&a, 37);
	assert_int_equal(pboxd_ckpt_write_state(a.path, &a.job, g_keys, 3, err, sizeof(err)), 0);
	/* Restored on another core count: the file does not depend on the chunk map. */
	make(&b, "adam", 3);
	assert_int_equal(
		pboxd_ckpt_read_state(a.path, &b.job, g_keys, 3, &version, err, sizeof(err)), 0);
	assert_int_equal(version, 37);
	check(&b, 37);
	destroy(&b);
	/* An odd version lands in the other model buffer. */
	fill(&a, 38);
	assert_int_equal(pboxd_ckpt_write_state(a.path, &a.job, g_keys, 3, err, sizeof(err)), 0);
	make(&b, "adam", 1);
	assert_int_equal(
		pboxd_ckpt_read_state(a.path, &b.job, g_keys, 3, &version, err, sizeof(err)), 0);
	check(&b, 38);
	destroy(&b);
	/* Chunks at different versions cannot make one checkpoint. */
	chunk(&a, 1)->version = 39;
	assert_int_equal(pboxd_ckpt_write_state(a.path, &a.job, g_keys, 3, err, sizeof(err)),
			 -EINVAL);
	unlink(a.path);
	destroy(&a);
}

static void test_mismatch(void **state)
{
	struct pbox_keyspec other[] = { { 0, 784 * 256 }, { 1, 255 }, { 7, 3 } };
	struct fixture a, b;
	uint32_t version = 0;
	char err[512];
	FILE *f;

	(void)state;
	make(&a, "nag", 2);
	fill(&a, 5);
	assert_int_equal(pboxd_ckpt_write_state(a.path, &a.job, g_keys, 3, err, sizeof(err)), 0);
	make(&b, "nag", 2);
	/* Other keys. */
	assert_int_equal(
		pboxd_ckpt_read_state(a.path, &b.job, other, 3, &version, err, sizeof(err)),
		-EINVAL);
	assert_non_null(strstr(err, "key #1 was id 1 with 256 elements; the session registered "
				    "id 1 with 255"));
	assert_int_equal(
		pboxd_ckpt_read_state(a.path, &b.job, g_keys, 2, &version, err, sizeof(err)),
		-EINVAL);
	assert_non_null(strstr(err, "saved with 3 keys; the session registered 2"));
	destroy(&b);
	/* Another optimizer. */
	make(&b, "adam", 2);
	assert_int_equal(
		pboxd_ckpt_read_state(a.path, &b.job, g_keys, 3, &version, err, sizeof(err)),
		-EINVAL);
	assert_non_null(strstr(err, "optimizer 'nag'"));
	destroy(&b);
	/* One flipped byte in the data: the checksum says so and the state is left fresh. */
	f = fopen(a.path, "r+b");
	assert_non_null(f);
	fseek(f, 56 + 3 * 16 + 1000, SEEK_SET);
	fputc(0x55, f);
	fclose(f);
	make(&b, "nag", 2);
	assert_int_equal(
		pboxd_ckpt_read_state(a.path, &b.job, g_keys, 3, &version, err, sizeof(err)),
		-EBADMSG);
	assert_non_null(strstr(err, "checksum mismatch"));
	for (uint32_t c = 0; c < b.desc.nchunks; c++) {
		assert_false(chunk(&b, c)->initialized);
		assert_int_equal(chunk(&b, c)->version, 0);
		assert_true(chunk(&b, c)->model[1][0] == 0.0f);
	}
	/* Truncated. */
	assert_int_equal(truncate(a.path, 5000), 0);
	assert_int_equal(
		pboxd_ckpt_read_state(a.path, &b.job, g_keys, 3, &version, err, sizeof(err)),
		-EINVAL);
	unlink(a.path);
	assert_int_equal(
		pboxd_ckpt_read_state(a.path, &b.job, g_keys, 3, &version, err, sizeof(err)),
		-ENOENT);
	destroy(&b);
	destroy(&a);
}

/* The core copies exactly when the chunk reaches the version asked for: the model of that
 * version and the optimizer state as it is then, and publishes the version. */
static void test_capture(void **state)
{
	struct fixture a;
	struct pbox_chunk_state *cs;
	const struct pbox_chunk_desc *cd;
	const float *snap;

	(void)state;
	make(&a, "nag", 1);
	cs = chunk(&a, 0);
	cd = &a.desc.chunks[0];
	assert_non_null(cs->snap);
	assert_int_equal(cs->snap_want, PBOX_SNAP_NONE);
	assert_int_equal(cs->snap_have, PBOX_SNAP_NONE);
	fill(&a, 9);
	pbox_chunk_snap(&a.job, cd, cs); /* nobody asked */
	assert_int_equal(cs->snap_have, PBOX_SNAP_NONE);
	cs->snap_want = 10;
	pbox_chunk_snap(&a.job, cd, cs); /* version 9: not yet */
	assert_int_equal(cs->snap_have, PBOX_SNAP_NONE);
	fill(&a, 10);
	pbox_chunk_snap(&a.job, cd, cs);
	assert_int_equal(cs->snap_have, 10);
	snap = cs->snap;
	for (uint32_t i = 0; i < cd->bytes / 4; i++) {
		assert_true(snap[i] == val(cd->key, cd->elem_off + i, 0, 10));
		assert_true(snap[cd->bytes / 4 + i] == val(cd->key, cd->elem_off + i, 1, 10));
	}
	/* Without checkpointing, no snapshot buffer (and no memory for one). */
	{
		struct pbox_job j = a.job;
		uint64_t with = pbox_job_state_bytes(&a.job), without;

		j.checkpoint = false;
		without = pbox_job_state_bytes(&j);
		/* model + momentum of every chunk, less what page rounding had spare */
		assert_true(with - without + 4096 > 2 * a.desc.total_bytes);
	}
	destroy(&a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_mismatch),
		cmocka_unit_test(test_capture),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
