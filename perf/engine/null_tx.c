/* SPDX-License-Identifier: BSD-3-Clause */
/* A transmitter that sends nothing (see null_tx.h). */
#include "null_tx.h"

static uint64_t g_sent;

static int null_send(void *ctx, const struct pbox_peer *to, const struct pbox_wire_hdr *h,
		     const void *payload, uint32_t len)
{
	(void)ctx;
	(void)to;
	(void)h;
	(void)payload;
	g_sent += len != 0;
	return 0;
}

static void null_flush(void *ctx)
{
	(void)ctx;
}

static uint64_t null_queued(void *ctx)
{
	(void)ctx;
	return g_sent;
}

static uint64_t null_reclaim(void *ctx, uint64_t upto)
{
	(void)ctx;
	(void)upto;
	return g_sent;
}

const struct pbox_tx_ops pbox_bench_null_tx = {
	.send = null_send,
	.flush = null_flush,
	.queued = null_queued,
	.reclaim = null_reclaim,
};
