/* SPDX-License-Identifier: BSD-3-Clause */
/* Log sink, transmit no-ops and virtual clock for test harnesses (harness.h). */
#include "harness.h"

void pbox_test_log_silent(enum pbox_log_level lvl, enum pbox_log_component comp, const char *msg,
			  void *arg)
{
	(void)lvl;
	(void)comp;
	(void)msg;
	(void)arg;
}

void pbox_test_tx_flush(void *ctx)
{
	(void)ctx;
}

uint64_t pbox_test_tx_queued(void *ctx)
{
	(void)ctx;
	return 0;
}

uint64_t pbox_test_tx_reclaim(void *ctx, uint64_t upto)
{
	(void)ctx;
	return upto;
}

uint64_t pbox_test_clock(void *arg)
{
	return *(const uint64_t *)arg;
}
