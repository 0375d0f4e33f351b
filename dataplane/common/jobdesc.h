/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Job geometry: keys cut into chunks, chunks assigned to data-plane cores.
 *
 * A job's keys (id, number of float32 elements) are cut, in registration order, into chunks
 * of at most chunk_bytes (the last chunk of a key may be shorter). Chunk ids are dense,
 * 0..nchunks-1, in key order. Chunks are assigned to cores by LPT on bytes (PHub's 4/3
 * set partition): largest first, each to the least-loaded core, ties broken by the lower
 * chunk id and the lower core index, so every build from the same keys gives the same map.
 * Each chunk is carried in fragments of frag_bytes (the last may be shorter); fragment i
 * covers bytes [i * frag_bytes, min((i + 1) * frag_bytes, chunk bytes)).
 *
 * The appliance and libpbox both build a jobdesc: the appliance from the registered keys,
 * the worker from the same keys and the core map the appliance sent at admission.
 *
 * Thread safety: a built jobdesc is immutable and may be read from any thread.
 */
#ifndef PBOX_JOBDESC_H
#define PBOX_JOBDESC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Limits enforced on every job (config, admission, wire). */
#define PBOX_MAX_WORKERS         1024u
#define PBOX_MAX_CORES           64u
#define PBOX_MAX_KEYS            (1u << 20)
#define PBOX_MAX_CHUNKS          (1u << 24)
#define PBOX_MAX_KEY_ELEMS       (UINT64_C(1) << 40)
#define PBOX_MIN_CHUNK_BYTES     64u
#define PBOX_MAX_CHUNK_BYTES     (64u << 20)
#define PBOX_DEFAULT_CHUNK_BYTES (32u << 10)
/* Fragments per chunk: the engine counts them per rank in 16 bits. */
#define PBOX_MAX_FRAGS_PER_CHUNK 32768u
/* Fragments are whole cache lines so each lands 64-byte aligned in the accumulator. */
#define PBOX_FRAG_ALIGN 64u

struct pbox_keyspec {
	uint32_t id;
	uint64_t nelem; /* float32 elements, >= 1 */
};

struct pbox_key {
	uint32_t id;
	uint64_t nelem;
	uint32_t first_chunk;
	uint32_t nchunks;
};

struct pbox_chunk_desc {
	uint32_t key;      /* index into keys[] */
	uint32_t core;     /* owner data-plane core */
	uint32_t local;    /* index of this chunk in its core's list */
	uint32_t bytes;    /* payload bytes (multiple of 4) */
	uint64_t elem_off; /* first element within the key */
	uint32_t nfrags;
};

struct pbox_jobdesc {
	uint32_t nworkers;
	uint32_t ncores;
	uint32_t chunk_bytes;
	uint32_t frag_bytes;
	uint32_t nkeys;
	uint32_t nchunks;
	uint64_t total_bytes;
	struct pbox_key *keys;          /* nkeys, registration order */
	uint32_t *key_order;            /* key indexes sorted by id, for lookup */
	struct pbox_chunk_desc *chunks; /* nchunks */
	uint32_t *core_nchunks;         /* ncores */
	uint64_t *core_bytes;           /* ncores: bytes owned */
	uint32_t **core_chunks;         /* ncores lists of chunk ids, ascending */
};

/*
 * Count the chunks of chunk_bytes that keys need, in 64 bits (a key may have up to 2^40
 * elements, so one key alone can need more than 2^32 chunks). Cheap: no allocation, so it
 * can run before anything is sized or built. Returns 0 with *nchunks set, -EINVAL (a key
 * with 0 or more than 2^40 elements, chunk_bytes < 4) or -E2BIG (more than PBOX_MAX_CHUNKS
 * chunks), with a message in err naming the key and the numbers.
 */
int pbox_jobdesc_count_chunks(const struct pbox_keyspec *keys, uint32_t nkeys, uint32_t chunk_bytes,
			      uint64_t *nchunks, char *err, size_t errlen);

/*
 * Build desc from keys. core_map, if not NULL, gives each chunk's core (as received from
 * the appliance) instead of computing LPT; it is validated (< ncores).
 * Returns 0, or -EINVAL with a message in err (duplicate key id, zero-length key, bad
 * sizes), -E2BIG (more than PBOX_MAX_CHUNKS chunks, see pbox_jobdesc_count_chunks) or
 * -ENOMEM. On error desc is left empty (safe to free).
 */
int pbox_jobdesc_build(struct pbox_jobdesc *desc, const struct pbox_keyspec *keys, uint32_t nkeys,
		       uint32_t nworkers, uint32_t ncores, uint32_t chunk_bytes,
		       uint32_t frag_bytes, const uint32_t *core_map, char *err, size_t errlen);
void pbox_jobdesc_free(struct pbox_jobdesc *desc);

/* Index of the key with this id, or -1. */
int64_t pbox_jobdesc_find_key(const struct pbox_jobdesc *desc, uint32_t id);

/* Fragment payload size for a path MTU: the largest multiple of PBOX_FRAG_ALIGN that fits
 * an IPv4/UDP datagram of mtu bytes after the pbox header, capped at chunk_bytes and at
 * PBOX_WIRE_MAX_PAYLOAD. Returns 0 if the MTU is too small to carry one aligned unit. */
uint32_t pbox_frag_bytes_for_mtu(uint32_t mtu, uint32_t chunk_bytes);

/*
 * LPT (longest processing time first) partition of n items into nbins bins.
 * Items in decreasing size (ties: lower index first) each go to the least-loaded bin
 * (ties: lower bin). bin[i] receives the bin of item i; load[b], if not NULL, the total
 * size in bin b. Max load <= (4/3 - 1/(3 nbins)) times the optimum (Graham 1969).
 * Returns 0 or -ENOMEM.
 */
int pbox_lpt_partition(const uint64_t *size, uint32_t n, uint32_t nbins, uint32_t *bin,
		       uint64_t *load);

/* Byte range of fragment f of chunk c. */
static inline uint32_t pbox_frag_len(const struct pbox_jobdesc *d, uint32_t bytes, uint32_t f)
{
	uint32_t off = f * d->frag_bytes;

	return bytes - off < d->frag_bytes ? bytes - off : d->frag_bytes;
}

#endif /* PBOX_JOBDESC_H */
