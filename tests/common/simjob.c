/* SPDX-License-Identifier: BSD-3-Clause */
/* The simulated appliance's shared test set-up (simjob.h). */
#include "simjob.h"

#include <string.h>

struct sim_job_cfg simjob_cfg(uint32_t nranks, const struct pbox_keyspec *keys, uint32_t nkeys,
			      uint32_t timeout_ms)
{
	struct sim_job_cfg c = {
		.nranks = nranks,
		.ncores = 2,
		.keys = keys,
		.nkeys = nkeys,
		.chunk_bytes = 4096,
		.frag_bytes = 1024,
		.mode = PBOX_MODE_AGGREGATE,
		.reduce = PBOX_REDUCE_SUM,
		.rto_ms = 10,
		.timeout_ms = timeout_ms,
	};

	return c;
}

int simjob_push_pull(struct sim *s, uint32_t rank, struct pbox_op *op, uint32_t key, uint32_t iter,
		     const float *src, float *dst)
{
	int rc;

	memset(op, 0, sizeof(*op));
	op->kind = PBOX_OP_PUSH_PULL;
	op->key = key;
	op->iter = iter;
	op->src = src;
	op->dst = dst;
	rc = pbox_node_submit(s->node[rank], op);
	if (rc == 0) {
		pbox_node_flush(s->node[rank]);
	}
	return rc;
}

bool simjob_run_until(struct sim *s, uint32_t n, uint64_t step_ns, uint32_t max_steps)
{
	sim_pump(s, 0);
	for (uint32_t k = 0; k < max_steps && s->ncompleted < n; k++) {
		sim_advance(s, step_ns);
	}
	return s->ncompleted >= n;
}

enum sim_verdict simjob_chaos(struct sim *s, enum sim_dir dir, uint32_t ep,
			      const struct pbox_msg *m, void *arg)
{
	struct simjob_chaos *c = arg;

	(void)s;
	(void)dir;
	(void)ep;
	(void)m;
	c->x ^= c->x << 13;
	c->x ^= c->x >> 7;
	c->x ^= c->x << 17;
	switch (c->x % c->one_in) {
	case 0:
		return SIM_DROP;
	case 1:
		return SIM_DUP;
	default:
		return SIM_PASS;
	}
}
