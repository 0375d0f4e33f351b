/* SPDX-License-Identifier: BSD-3-Clause */
/* Job geometry: cut keys into chunks and assign chunks to cores by LPT. */
#include "jobdesc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pbox/wire.h>

#include "compiler.h"

struct lpt_item {
	uint64_t size;
	uint32_t idx;
};

static int lpt_cmp(const void *a, const void *b)
{
	const struct lpt_item *x = a, *y = b;

	if (x->size != y->size) {
		return x->size > y->size ? -1 : 1;
	}
	return x->idx < y->idx ? -1 : (x->idx > y->idx);
}

int pbox_lpt_partition(const uint64_t *size, uint32_t n, uint32_t nbins, uint32_t *bin,
		       uint64_t *load)
{
	struct lpt_item *items;
	uint64_t *l;

	items = calloc(n ? n : 1, sizeof(*items));
	l = calloc(nbins, sizeof(*l));
	if (items == NULL || l == NULL) {
		free(items);
		free(l);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < n; i++) {
		items[i].size = size[i];
		items[i].idx = i;
	}
	qsort(items, n, sizeof(*items), lpt_cmp);
	/* nbins is at most PBOX_MAX_CORES: a linear scan beats a heap at that size. */
	for (uint32_t i = 0; i < n; i++) {
		uint32_t best = 0;

		for (uint32_t b = 1; b < nbins; b++) {
			if (l[b] < l[best]) {
				best = b;
			}
		}
		bin[items[i].idx] = best;
		l[best] += items[i].size;
	}
	if (load != NULL) {
		memcpy(load, l, nbins * sizeof(*l));
	}
	free(items);
	free(l);
	return 0;
}

uint32_t pbox_frag_bytes_for_mtu(uint32_t mtu, uint32_t chunk_bytes)
{
	uint32_t room;

	/* IPv4 (20) + UDP (8) are inside the MTU; Ethernet is not. */
	if (mtu < 28 + PBOX_WIRE_HDR_LEN + PBOX_FRAG_ALIGN) {
		return 0;
	}
	room = mtu - 28 - PBOX_WIRE_HDR_LEN;
	room = PBOX_MIN(room, PBOX_WIRE_MAX_PAYLOAD);
	room -= room % PBOX_FRAG_ALIGN;
	return PBOX_MIN(room, chunk_bytes);
}

static int key_id_cmp(const void *a, const void *b, void *arg)
{
	const struct pbox_key *keys = arg;
	uint32_t x = keys[*(const uint32_t *)a].id, y = keys[*(const uint32_t *)b].id;

	return x < y ? -1 : (x > y);
}

void pbox_jobdesc_free(struct pbox_jobdesc *d)
{
	if (d->core_chunks != NULL) {
		for (uint32_t c = 0; c < d->ncores; c++) {
			free(d->core_chunks[c]);
		}
	}
	free(d->core_chunks);
	free(d->core_nchunks);
	free(d->core_bytes);
	free(d->chunks);
	free(d->key_order);
	free(d->keys);
	memset(d, 0, sizeof(*d));
}

int64_t pbox_jobdesc_find_key(const struct pbox_jobdesc *d, uint32_t id)
{
	uint32_t lo = 0, hi = d->nkeys;

	/* Dense ids 0..n-1 in order are the common case. */
	if (id < d->nkeys && d->keys[id].id == id) {
		return id;
	}
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		uint32_t k = d->key_order[mid];

		if (d->keys[k].id == id) {
			return k;
		}
		if (d->keys[k].id < id) {
			lo = mid + 1;
		} else {
			hi = mid;
		}
	}
	return -1;
}

int pbox_jobdesc_count_chunks(const struct pbox_keyspec *keys, uint32_t nkeys, uint32_t chunk_bytes,
			      uint64_t *nchunks, char *err, size_t errlen)
{
	uint64_t per = chunk_bytes / 4, n = 0;

	*nchunks = 0;
	if (per == 0) {
		snprintf(err, errlen, "chunk size %u: must be at least 4 bytes", chunk_bytes);
		return -EINVAL;
	}
	for (uint32_t k = 0; k < nkeys; k++) {
		if (keys[k].nelem == 0 || keys[k].nelem > PBOX_MAX_KEY_ELEMS) {
			snprintf(err, errlen, "key %u: %llu elements (must be 1..2^40)", keys[k].id,
				 (unsigned long long)keys[k].nelem);
			return -EINVAL;
		}
		/* 2^40 elements in 16-element chunks is 2^36: no overflow over 2^20 keys
		 * (2^56), and the sum is checked after every key anyway. */
		n += PBOX_DIV_ROUND_UP(keys[k].nelem, per);
		if (n > PBOX_MAX_CHUNKS) {
			snprintf(err, errlen,
				 "the keys need %llu or more chunks of %u bytes (key %u, #%u, "
				 "has %llu elements); at most %u chunks per job (use a larger "
				 "chunk_bytes or fewer elements)",
				 (unsigned long long)n, chunk_bytes, keys[k].id, k,
				 (unsigned long long)keys[k].nelem, PBOX_MAX_CHUNKS);
			return -E2BIG;
		}
	}
	*nchunks = n;
	return 0;
}

#define FAIL(code, ...)                             \
	do {                                        \
		snprintf(err, errlen, __VA_ARGS__); \
		rc = (code);                        \
		goto fail;                          \
	} while (0)

int pbox_jobdesc_build(struct pbox_jobdesc *d, const struct pbox_keyspec *keys, uint32_t nkeys,
		       uint32_t nworkers, uint32_t ncores, uint32_t chunk_bytes,
		       uint32_t frag_bytes, const uint32_t *core_map, char *err, size_t errlen)
{
	uint64_t nchunks = 0, *sizes = NULL;
	uint32_t *bins = NULL, *fill = NULL;
	int rc = 0;

	memset(d, 0, sizeof(*d));
	if (nkeys == 0 || nkeys > PBOX_MAX_KEYS) {
		FAIL(-EINVAL, "a job needs 1..%u keys (got %u)", PBOX_MAX_KEYS, nkeys);
	}
	if (nworkers == 0 || nworkers > PBOX_MAX_WORKERS) {
		FAIL(-EINVAL, "a job needs 1..%u workers (got %u)", PBOX_MAX_WORKERS, nworkers);
	}
	if (ncores == 0 || ncores > PBOX_MAX_CORES) {
		FAIL(-EINVAL, "1..%u data-plane cores (got %u)", PBOX_MAX_CORES, ncores);
	}
	if (chunk_bytes < PBOX_MIN_CHUNK_BYTES || chunk_bytes > PBOX_MAX_CHUNK_BYTES ||
	    chunk_bytes % PBOX_FRAG_ALIGN != 0) {
		FAIL(-EINVAL, "chunk size %u: must be a multiple of %u between %u and %u bytes",
		     chunk_bytes, PBOX_FRAG_ALIGN, PBOX_MIN_CHUNK_BYTES, PBOX_MAX_CHUNK_BYTES);
	}
	if (frag_bytes == 0 || frag_bytes % PBOX_FRAG_ALIGN != 0 || frag_bytes > chunk_bytes ||
	    frag_bytes > PBOX_WIRE_MAX_PAYLOAD) {
		FAIL(-EINVAL,
		     "fragment size %u: must be a multiple of %u, at most the chunk size %u",
		     frag_bytes, PBOX_FRAG_ALIGN, chunk_bytes);
	}
	if (PBOX_DIV_ROUND_UP(chunk_bytes, frag_bytes) > PBOX_MAX_FRAGS_PER_CHUNK) {
		FAIL(-EINVAL,
		     "chunks of %u bytes in fragments of %u bytes: more than %u fragments per "
		     "chunk (use a larger MTU or smaller chunks)",
		     chunk_bytes, frag_bytes, PBOX_MAX_FRAGS_PER_CHUNK);
	}
	d->nworkers = nworkers;
	d->ncores = ncores;
	d->chunk_bytes = chunk_bytes;
	d->frag_bytes = frag_bytes;
	d->nkeys = nkeys;
	d->keys = calloc(nkeys, sizeof(*d->keys));
	d->key_order = calloc(nkeys, sizeof(*d->key_order));
	if (d->keys == NULL || d->key_order == NULL) {
		FAIL(-ENOMEM, "out of memory for %u keys", nkeys);
	}
	rc = pbox_jobdesc_count_chunks(keys, nkeys, chunk_bytes, &nchunks, err, errlen);
	if (rc != 0) {
		goto fail;
	}
	nchunks = 0;
	for (uint32_t k = 0; k < nkeys; k++) {
		uint64_t per = chunk_bytes / 4;

		/* Checked above: every count fits PBOX_MAX_CHUNKS, so the narrowing is exact. */
		d->keys[k].id = keys[k].id;
		d->keys[k].nelem = keys[k].nelem;
		d->keys[k].first_chunk = (uint32_t)nchunks;
		d->keys[k].nchunks = (uint32_t)PBOX_DIV_ROUND_UP(keys[k].nelem, per);
		nchunks += d->keys[k].nchunks;
		d->total_bytes += keys[k].nelem * 4;
		d->key_order[k] = k;
	}
	qsort_r(d->key_order, nkeys, sizeof(uint32_t), key_id_cmp, d->keys);
	for (uint32_t i = 1; i < nkeys; i++) {
		if (d->keys[d->key_order[i]].id == d->keys[d->key_order[i - 1]].id) {
			FAIL(-EINVAL, "key id %u registered twice", d->keys[d->key_order[i]].id);
		}
	}

	d->nchunks = (uint32_t)nchunks;
	d->chunks = calloc(nchunks, sizeof(*d->chunks));
	sizes = calloc(nchunks, sizeof(*sizes));
	bins = calloc(nchunks, sizeof(*bins));
	d->core_nchunks = calloc(ncores, sizeof(*d->core_nchunks));
	d->core_bytes = calloc(ncores, sizeof(*d->core_bytes));
	d->core_chunks = calloc(ncores, sizeof(*d->core_chunks));
	fill = calloc(ncores, sizeof(*fill));
	if (d->chunks == NULL || sizes == NULL || bins == NULL || d->core_nchunks == NULL ||
	    d->core_bytes == NULL || d->core_chunks == NULL || fill == NULL) {
		FAIL(-ENOMEM, "out of memory for %llu chunks", (unsigned long long)nchunks);
	}
	for (uint32_t k = 0; k < nkeys; k++) {
		const struct pbox_key *key = &d->keys[k];
		uint64_t per = chunk_bytes / 4;

		for (uint32_t i = 0; i < key->nchunks; i++) {
			struct pbox_chunk_desc *c = &d->chunks[key->first_chunk + i];
			uint64_t left = key->nelem - (uint64_t)i * per;

			c->key = k;
			c->elem_off = (uint64_t)i * per;
			c->bytes = (uint32_t)(PBOX_MIN(left, per) * 4);
			c->nfrags = PBOX_DIV_ROUND_UP(c->bytes, frag_bytes);
			sizes[key->first_chunk + i] = c->bytes;
		}
	}
	if (core_map != NULL) {
		for (uint32_t c = 0; c < d->nchunks; c++) {
			if (core_map[c] >= ncores) {
				FAIL(-EINVAL, "chunk %u mapped to core %u of %u", c, core_map[c],
				     ncores);
			}
			bins[c] = core_map[c];
		}
	} else if (pbox_lpt_partition(sizes, d->nchunks, ncores, bins, NULL) != 0) {
		FAIL(-ENOMEM, "out of memory for the chunk map");
	}
	for (uint32_t c = 0; c < d->nchunks; c++) {
		d->chunks[c].core = bins[c];
		d->core_nchunks[bins[c]]++;
		d->core_bytes[bins[c]] += d->chunks[c].bytes;
	}
	for (uint32_t k = 0; k < ncores; k++) {
		d->core_chunks[k] =
			calloc(d->core_nchunks[k] ? d->core_nchunks[k] : 1, sizeof(uint32_t));
		if (d->core_chunks[k] == NULL) {
			FAIL(-ENOMEM, "out of memory for the chunk map");
		}
	}
	for (uint32_t c = 0; c < d->nchunks; c++) {
		uint32_t k = d->chunks[c].core;

		d->chunks[c].local = fill[k];
		d->core_chunks[k][fill[k]++] = c;
	}
	free(sizes);
	free(bins);
	free(fill);
	return 0;
fail:
	free(sizes);
	free(bins);
	free(fill);
	pbox_jobdesc_free(d);
	return rc;
}
