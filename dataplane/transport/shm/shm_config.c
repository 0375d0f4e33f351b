/* SPDX-License-Identifier: BSD-3-Clause */
/* The appliance's shm = { ... } group (see shm_config.h). */
#include "shm_config.h"

#include <string.h>

#include "shm.h"

void pboxd_shm_cfg_default(struct pboxd_shm_cfg *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->enabled = true;
	cfg->ring_kb = 0;
	cfg->max_conns = 64;
	cfg->max_regions = 64;
	cfg->max_region_mb = 1024;
}

uint64_t pboxd_shm_ring_bytes(const struct pboxd_shm_cfg *cfg, uint32_t ncores)
{
	uint64_t per = (32ull << 20) / (ncores ? ncores : 1), b = 1ull << 20;

	if (cfg->ring_kb != 0) {
		return (uint64_t)cfg->ring_kb << 10;
	}
	while (b * 2 <= per) {
		b *= 2;
	}
	return b;
}

int pboxd_shm_cfg_load(struct pbox_confkit *c, const config_setting_t *g, struct pboxd_shm_cfg *cfg)
{
	static const char *const keys[] = { "enabled",      "socket",      "ring_kb",
					    "max_conns",    "max_regions", "max_region_mb",
					    "stage_pushes", NULL };
	const config_setting_t *where = NULL;
	int rc;

	if (!config_setting_is_group(g)) {
		return pbox_conf_bad(c, g, "must be a group { enabled = true; ... }");
	}
	if ((rc = pbox_conf_only(c, g, keys)) != 0 ||
	    (rc = pbox_conf_bool(c, g, "enabled", &cfg->enabled)) != 0 ||
	    (rc = pbox_conf_str(c, g, "socket", cfg->socket, sizeof(cfg->socket), NULL)) != 0 ||
	    (rc = pbox_conf_u32(c, g, "ring_kb", 0, 1u << 20, &cfg->ring_kb)) != 0 ||
	    (rc = pbox_conf_u32(c, g, "max_conns", 1, 65534, &cfg->max_conns)) != 0 ||
	    (rc = pbox_conf_u32(c, g, "max_regions", 0, PBOX_SHM_MAX_REGIONS, &cfg->max_regions)) !=
		    0 ||
	    (rc = pbox_conf_u32(c, g, "max_region_mb", 0, 1u << 20, &cfg->max_region_mb)) != 0 ||
	    (rc = pbox_conf_bool(c, g, "stage_pushes", &cfg->stage_pushes)) != 0) {
		return rc;
	}
	where = config_setting_get_member(g, "ring_kb");
	if (where != NULL && cfg->ring_kb != 0 &&
	    (cfg->ring_kb < 256 || (cfg->ring_kb & (cfg->ring_kb - 1)) != 0)) {
		return pbox_conf_bad(c, where,
				     "must be 0 (auto) or a power of two from 256 (got %u)",
				     cfg->ring_kb);
	}
	return 0;
}
