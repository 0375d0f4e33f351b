/* SPDX-License-Identifier: BSD-3-Clause */
/* pbox-ctrld: chunks of a job to a pboxd's cores, LPT on bytes across jobs (assign.h). */
#include "assign.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/compiler.h"
#include "pboxd/config.h"

int ctrld_cores_from_json(const json_t *appliance, struct ctrld_cores *c, char *err, size_t errlen)
{
	const json_t *cores = json_object_get(appliance, "cores"), *o;
	json_int_t n = json_integer_value(json_object_get(appliance, "ncores"));
	json_int_t cb = json_integer_value(json_object_get(appliance, "chunk_bytes"));
	size_t i;

	memset(c, 0, sizeof(*c));
	if (!json_is_object(appliance)) {
		snprintf(err, errlen, "no \"appliance\" object (an older pboxd?)");
		return -EINVAL;
	}
	if (n < 1 || n > (json_int_t)PBOX_MAX_CORES) {
		snprintf(err, errlen, "appliance.ncores: not in 1..%u", PBOX_MAX_CORES);
		return -EINVAL;
	}
	if (cb < PBOX_MIN_CHUNK_BYTES || cb > PBOX_MAX_CHUNK_BYTES || cb % 4 != 0) {
		snprintf(err, errlen, "appliance.chunk_bytes: not a multiple of 4 in %u..%u",
			 PBOX_MIN_CHUNK_BYTES, PBOX_MAX_CHUNK_BYTES);
		return -EINVAL;
	}
	if (!json_is_array(cores) || json_array_size(cores) != (size_t)n) {
		snprintf(err, errlen, "appliance.cores: not a list of %lld cores", (long long)n);
		return -EINVAL;
	}
	c->ncores = (uint32_t)n;
	c->chunk_bytes = (uint32_t)cb;
	json_array_foreach(cores, i, o)
	{
		const json_t *cpu = json_object_get(o, "cpu"), *numa = json_object_get(o, "numa");
		const json_t *port = json_object_get(o, "port");

		if (json_integer_value(json_object_get(o, "core")) != (json_int_t)i) {
			snprintf(err, errlen, "appliance.cores[%zu]: core is not %zu", i, i);
			return -EINVAL;
		}
		c->cpu[i] = json_is_integer(cpu) ? (int32_t)json_integer_value(cpu) : -1;
		c->numa[i] = json_is_integer(numa) ? (int32_t)json_integer_value(numa) : -1;
		c->port[i] = json_is_integer(port) ? (int32_t)json_integer_value(port) : -1;
	}
	c->known = true;
	return 0;
}

/* The chunk sizes of desc's fixed key set cut at chunk_bytes (common/jobdesc.h's cut).
 * 0 with *sizes (malloc'd) and *n, 1 (no fixed key set), or -errno with err. */
static int chunk_sizes(const json_t *desc, uint32_t chunk_bytes, uint64_t **sizes, uint32_t *n,
		       char *err, size_t errlen)
{
	struct pboxd_config defaults;
	struct pboxd_job_cfg jc;
	uint64_t nchunks = 0, per = chunk_bytes / 4, c = 0;
	int rc;

	pboxd_config_defaults(&defaults);
	rc = pboxd_job_cfg_from_json(&defaults, desc, &jc, err, errlen);
	pboxd_config_free(&defaults);
	if (rc != 0) {
		return rc;
	}
	if (jc.keys == NULL) {
		pboxd_job_cfg_free(&jc);
		return 1;
	}
	rc = pbox_jobdesc_count_chunks(jc.keys, jc.nkeys, chunk_bytes, &nchunks, err, errlen);
	if (rc != 0) {
		pboxd_job_cfg_free(&jc);
		return rc == -E2BIG ? -EINVAL : rc;
	}
	*sizes = malloc(nchunks * sizeof(**sizes));
	if (*sizes == NULL) {
		pboxd_job_cfg_free(&jc);
		snprintf(err, errlen, "out of memory for %llu chunks", (unsigned long long)nchunks);
		return -ENOMEM;
	}
	for (uint32_t k = 0; k < jc.nkeys; k++) {
		for (uint64_t off = 0; off < jc.keys[k].nelem; off += per) {
			(*sizes)[c++] = PBOX_MIN(jc.keys[k].nelem - off, per) * 4;
		}
	}
	*n = (uint32_t)nchunks;
	pboxd_job_cfg_free(&jc);
	return 0;
}

/* Largest first; ties: the lower chunk id. */
static int by_size_desc(const void *a, const void *b, void *arg)
{
	const uint64_t *size = arg;
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	if (size[x] != size[y]) {
		return size[x] > size[y] ? -1 : 1;
	}
	return x < y ? -1 : x > y;
}

int ctrld_assign(const struct ctrld_cores *c, const json_t *desc, const uint64_t *base,
		 json_t **out, struct ctrld_core_load *mine, char *err, size_t errlen)
{
	uint64_t *sizes = NULL, load[PBOX_MAX_CORES];
	uint32_t *order = NULL, *core = NULL, n = 0;
	json_t *map = NULL;
	int rc;

	*out = NULL;
	memset(mine, 0, sizeof(*mine));
	if (!c->known) {
		snprintf(err, errlen, "the pboxd's cores are not known");
		return -EINVAL;
	}
	rc = chunk_sizes(desc, c->chunk_bytes, &sizes, &n, err, errlen);
	if (rc != 0) {
		return rc;
	}
	if (n > CTRLD_ASSIGN_MAX_CHUNKS) {
		free(sizes);
		return 1;
	}
	order = malloc((size_t)n * sizeof(*order));
	core = malloc((size_t)n * sizeof(*core));
	map = json_array();
	if (order == NULL || core == NULL || map == NULL) {
		snprintf(err, errlen, "out of memory for %u chunks", n);
		rc = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < n; i++) {
		order[i] = i;
	}
	qsort_r(order, n, sizeof(*order), by_size_desc, sizes);
	for (uint32_t k = 0; k < c->ncores; k++) {
		load[k] = base != NULL ? base[k] : 0;
	}
	for (uint32_t i = 0; i < n; i++) {
		uint32_t best = 0;

		for (uint32_t k = 1; k < c->ncores; k++) {
			if (load[k] < load[best]) {
				best = k;
			}
		}
		core[order[i]] = best;
		load[best] += sizes[order[i]];
		mine->bytes[best] += sizes[order[i]];
		mine->chunks[best]++;
	}
	for (uint32_t i = 0; i < n; i++) {
		if (json_array_append_new(map, json_integer(core[i])) != 0) {
			snprintf(err, errlen, "out of memory for %u chunks", n);
			rc = -ENOMEM;
			goto out;
		}
	}
	*out = json_pack("{s:I, s:O}", "chunk_bytes", (json_int_t)c->chunk_bytes, "map", map);
	if (*out == NULL) {
		snprintf(err, errlen, "out of memory");
		rc = -ENOMEM;
	}
out:
	json_decref(map);
	free(order);
	free(core);
	free(sizes);
	return rc;
}

int ctrld_assign_load(const json_t *assignment, const json_t *desc, uint32_t ncores,
		      struct ctrld_core_load *load, char *err, size_t errlen)
{
	const json_t *map = json_object_get(assignment, "map"), *v;
	json_int_t cb = json_integer_value(json_object_get(assignment, "chunk_bytes"));
	uint64_t *sizes = NULL;
	uint32_t n = 0;
	size_t i;
	int rc;

	memset(load, 0, sizeof(*load));
	if (cb < PBOX_MIN_CHUNK_BYTES || cb > PBOX_MAX_CHUNK_BYTES || cb % 4 != 0) {
		snprintf(err, errlen, "assignment.chunk_bytes: not a multiple of 4 in %u..%u",
			 PBOX_MIN_CHUNK_BYTES, PBOX_MAX_CHUNK_BYTES);
		return -EINVAL;
	}
	rc = chunk_sizes(desc, (uint32_t)cb, &sizes, &n, err, errlen);
	if (rc == 1) {
		snprintf(err, errlen, "an assignment for a job without a fixed key set");
		return -EINVAL;
	}
	if (rc != 0) {
		return rc;
	}
	if (!json_is_array(map) || json_array_size(map) != n) {
		snprintf(err, errlen, "assignment.map: not a list of the key set's %u chunks", n);
		free(sizes);
		return -EINVAL;
	}
	json_array_foreach(map, i, v)
	{
		json_int_t k = json_integer_value(v);

		if (!json_is_integer(v) || k < 0 || k >= (json_int_t)ncores) {
			snprintf(err, errlen, "assignment.map[%zu]: not a core in 0..%u", i,
				 ncores - 1);
			free(sizes);
			return -EINVAL;
		}
		load->bytes[k] += sizes[i];
		load->chunks[k]++;
	}
	free(sizes);
	return 0;
}
