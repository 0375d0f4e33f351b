/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-abi-dump: the layout of pbox.h's public structs as this tree compiles them, as one
 * JSON object on stdout: {"struct": {"size": N, "fields": [[name, offset, size], ...]}}.
 * test_ctypes_mirrors compares the hand-written ctypes mirrors (pboxtest.MIRRORS) with it
 * field by field. A field added to a struct but not listed here still shows as a size
 * that differs from the mirror's; the test also checks that the listed fields cover the
 * whole struct (no gap beyond alignment padding).
 */
#include <stddef.h>
#include <stdio.h>

#include "pbox/pbox.h"

#define F(t, f)                                                       \
	{                                                             \
#f, offsetof(struct t, f), sizeof(((struct t *)0)->f) \
	}

struct field {
	const char *name;
	size_t off, size;
};

static const struct field opts_fields[] = {
	F(pbox_client_opts, server),       F(pbox_client_opts, job),
	F(pbox_client_opts, token),        F(pbox_client_opts, rank),
	F(pbox_client_opts, local_addr),   F(pbox_client_opts, timeout_ms),
	F(pbox_client_opts, rto_ms),       F(pbox_client_opts, max_inflight),
	F(pbox_client_opts, window_bytes), F(pbox_client_opts, fault),
	F(pbox_client_opts, busy_poll),    F(pbox_client_opts, probe),
};

static const struct field key_fields[] = {
	F(pbox_key_info, id),
	F(pbox_key_info, nelem),
};

static const struct field stats_fields[] = {
	F(pbox_client_stats, tx_bytes),    F(pbox_client_stats, rx_bytes),
	F(pbox_client_stats, tx_pkts),     F(pbox_client_stats, rx_pkts),
	F(pbox_client_stats, retransmits), F(pbox_client_stats, probes),
	F(pbox_client_stats, dropped),     F(pbox_client_stats, ops_done),
	F(pbox_client_stats, ops_failed),  F(pbox_client_stats, foreign),
	F(pbox_client_stats, shm_rx_desc), F(pbox_client_stats, shm_stale),
	F(pbox_client_stats, shm_torn),    F(pbox_client_stats, shm_bad_desc),
	F(pbox_client_stats, shm_tx_full), F(pbox_client_stats, shm_tx_waits),
};

static void dump(const char *name, size_t size, const struct field *f, size_t n, int last)
{
	printf("\"%s\": {\"size\": %zu, \"fields\": [", name, size);
	for (size_t i = 0; i < n; i++) {
		printf("%s[\"%s\", %zu, %zu]", i ? ", " : "", f[i].name, f[i].off, f[i].size);
	}
	printf("]}%s", last ? "" : ", ");
}

#define DUMP(t, a, last) dump(#t, sizeof(struct t), a, sizeof(a) / sizeof(a[0]), last)

int main(void)
{
	printf("{");
	DUMP(pbox_client_opts, opts_fields, 0);
	DUMP(pbox_key_info, key_fields, 0);
	DUMP(pbox_client_stats, stats_fields, 1);
	printf("}\n");
	return 0;
}
