/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz harness: pboxd's configuration parser (dataplane/pboxd/config.c): libconfig text ->
 * struct pboxd_config through pboxd_config_load, then pboxd_config_check, as
 * `pboxd -c FILE --check-config` does. The input is the file's text; it is written to a
 * memfd and loaded through /proc/self/fd (pboxd_config_load takes a path).
 *
 * Invariants checked beyond the sanitizers (and LeakSanitizer on every error path): a
 * refused file has a message naming the file; an accepted one has every setting inside
 * its documented range and distinct job ids; pboxd_config_check accepts only geometries
 * the data plane can carry (a fragment size > 0, at most PBOX_MAX_FRAGS_PER_CHUNK
 * fragments per chunk, ports that fit).
 *
 * Inputs with an @include directive are skipped: libconfig would read other files, and a
 * configuration file is trusted to name its own includes.
 */
#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/log.h"
#include "fuzz.h"
#include "harness.h"
#include "pboxd/config.h"

static int g_fd = -1;
static char g_path[64];

static void check_loaded(const struct pboxd_config *cfg)
{
	FUZZ_CHECK(cfg->ncores >= 1 && cfg->ncores <= PBOX_MAX_CORES, "ncores %u", cfg->ncores);
	FUZZ_CHECK(cfg->chunk_bytes >= PBOX_MIN_CHUNK_BYTES &&
			   cfg->chunk_bytes <= PBOX_MAX_CHUNK_BYTES &&
			   cfg->chunk_bytes % PBOX_FRAG_ALIGN == 0,
		   "chunk_bytes %u", cfg->chunk_bytes);
	FUZZ_CHECK(cfg->mtu >= 576 && cfg->mtu <= 65535, "mtu %u", cfg->mtu);
	FUZZ_CHECK(cfg->burst >= 1 && cfg->burst <= 256, "burst %u", cfg->burst);
	FUZZ_CHECK(memchr(cfg->transport, '\0', sizeof(cfg->transport)) != NULL &&
			   memchr(cfg->data_addr, '\0', sizeof(cfg->data_addr)) != NULL &&
			   memchr(cfg->control_host, '\0', sizeof(cfg->control_host)) != NULL,
		   "an unterminated string setting");
	for (uint32_t i = 0; i < cfg->njobs; i++) {
		const struct pboxd_job_cfg *j = &cfg->jobs[i];

		FUZZ_CHECK(j->workers >= 1 && j->workers <= PBOX_MAX_WORKERS, "job %u: workers %u",
			   j->id, j->workers);
		FUZZ_CHECK(memchr(j->token, '\0', sizeof(j->token)) != NULL, "job %u: token",
			   j->id);
		FUZZ_CHECK(j->sync != NULL && j->opt != NULL, "job %u: no sync model or optimizer",
			   j->id);
		FUZZ_CHECK(j->credits >= 1 && j->window >= 2 && j->window >= j->credits,
			   "job %u: credits %u window %u", j->id, j->credits, j->window);
		FUZZ_CHECK((j->keys == NULL) == (j->nkeys == 0), "job %u: %u keys at %p", j->id,
			   j->nkeys, (const void *)j->keys);
		for (uint32_t k = 0; k < j->nkeys; k++) {
			FUZZ_CHECK(j->keys[k].nelem >= 1, "job %u key %u: no elements", j->id, k);
		}
		for (uint32_t k = 0; k < i; k++) {
			FUZZ_CHECK(cfg->jobs[k].id != j->id, "job id %u twice", j->id);
		}
	}
}

static void check_checked(const struct pboxd_config *cfg)
{
	uint32_t frag = pbox_frag_bytes_for_mtu(cfg->mtu, cfg->chunk_bytes);

	FUZZ_CHECK(frag > 0 &&
			   PBOX_DIV_ROUND_UP(cfg->chunk_bytes, frag) <= PBOX_MAX_FRAGS_PER_CHUNK,
		   "chunk_bytes %u at mtu %u accepted", cfg->chunk_bytes, cfg->mtu);
	FUZZ_CHECK((uint32_t)cfg->base_port + cfg->ncores <= 65536, "base_port %u + %u cores",
		   cfg->base_port, cfg->ncores);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct pboxd_config cfg;
	char err[512];
	int rc;

	if (g_fd < 0) {
		pbox_log_set_level(PBOX_LOGC_COUNT, PBOX_LOG_LVL_DEBUG);
		pbox_log_set_sink(pbox_test_log_silent, NULL);
		g_fd = memfd_create("pboxd.conf", MFD_CLOEXEC);
		FUZZ_CHECK(g_fd >= 0, "memfd_create: %s", strerror(errno));
		snprintf(g_path, sizeof(g_path), "/proc/self/fd/%d", g_fd);
	}
	if (memmem(data, size, "@include", 8) != NULL) {
		return 0;
	}
	FUZZ_CHECK(ftruncate(g_fd, 0) == 0 && pwrite(g_fd, data, size, 0) == (ssize_t)size,
		   "writing the memfd: %s", strerror(errno));

	pboxd_config_defaults(&cfg);
	err[0] = '\0';
	rc = pboxd_config_load(&cfg, g_path, err, sizeof(err));
	if (rc != 0) {
		FUZZ_CHECK(rc == -EINVAL || rc == -ENOENT || rc == -ENOMEM, "load returned %d", rc);
		FUZZ_CHECK(rc == -ENOMEM || strncmp(err, g_path, strlen(g_path)) == 0,
			   "the error does not name the file: '%s'", err);
	} else {
		check_loaded(&cfg);
		err[0] = '\0';
		if (pboxd_config_check(&cfg, err, sizeof(err)) == 0) {
			check_checked(&cfg);
		} else {
			FUZZ_CHECK(err[0] != '\0', "check refused without a message");
		}
	}
	pboxd_config_free(&cfg);
	return 0;
}
