/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pboxd's configuration of the shared-memory transport (pboxd_shm.h), the appliance's
 *
 *   shm = {
 *     enabled = true;        # offer shared-memory rings to workers on this host
 *     socket = "";           # "": abstract "@pbox-shm-<pid>"; "@name": abstract;
 *                            # else a file path (e.g. "/run/pbox/shm.sock")
 *     ring_kb = 0;           # bytes per ring / 1024: a power of two, 256 .. 1048576;
 *                            # a connection maps 2 rings per data-plane core; 0 (auto):
 *                            # 32 MiB per direction split over the cores (at least
 *                            # 1 MiB a ring): a worker's window of results and the
 *                            # bursts a descheduled worker must absorb
 *     max_conns = 64;        # connections at once (each is a worker)
 *     max_regions = 64;      # memory regions a worker may register (pbox_mem_alloc),
 *                            # 0 .. 256 (0: none; its pushes are then copied)
 *     max_region_mb = 1024;  # ... and their bytes at most, MiB per worker (pboxd maps
 *                            # them read-only; pages a push references that the worker
 *                            # never wrote are allocated by pboxd's read)
 *     stage_pushes = false;  # copy every payload a worker pushes (ring or region) into
 *                            # core-local memory before the engine reads it: then
 *                            # under non_finite = "reject" the check and the add read
 *                            # the same bytes even if the worker rewrites its memory
 *                            # meanwhile (without it such a worker can get a NaN into
 *                            # its own job's sum). ~7 % more CPU per exchange.
 *                            # Encoded (DVF) payloads are always copied.
 *   };
 *
 * Parsed by pboxd's config.c through pboxd_shm_cfg_load; no state, any thread.
 */
#ifndef PBOXD_SHM_CONFIG_H
#define PBOXD_SHM_CONFIG_H

#include <libconfig.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/confkit.h"

struct pboxd_shm_cfg {
	bool enabled;
	char socket[108];
	uint32_t ring_kb; /* 0: auto (pboxd_shm_ring_bytes) */
	uint32_t max_conns;
	uint32_t max_regions;
	uint32_t max_region_mb;
	bool stage_pushes;
};

/* Bytes per ring for ncores cores: ring_kb, or the automatic size. */
uint64_t pboxd_shm_ring_bytes(const struct pboxd_shm_cfg *cfg, uint32_t ncores);

/* Defaults: enabled, abstract socket, automatic ring size, 64 connections, 64 regions of
 * 1 GiB in all per connection. */
void pboxd_shm_cfg_default(struct pboxd_shm_cfg *cfg);

/* Read the group g into cfg (defaults kept for absent keys). 0, or the confkit error
 * (the message names the file, line and key). */
int pboxd_shm_cfg_load(struct pbox_confkit *c, const config_setting_t *g,
		       struct pboxd_shm_cfg *cfg);

#endif /* PBOXD_SHM_CONFIG_H */
