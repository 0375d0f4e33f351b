/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz harness: the control plane's typed messages on the worker control channel
 * (common/ctlproto.h): a rank plan (register answer / plan event) that libpbox decodes
 * from the appliance, pboxd's slicing of pbox-ctrld's job plan into rank plans, and the
 * probe event / probe_result pair of a probe made by a worker.
 *
 * The first byte chooses the mode (its value modulo 3), the rest is JSON text:
 *  - 0: a rank plan: what decodes is encoded again and must decode to the same plan;
 *  - 1: a job plan ({"tree":..., "thresholds":..., "phub":...}): every rank 0..7 of a
 *       job of (second byte % 8 + 1) workers is sliced; a slice must encode to a rank
 *       plan the strict decoder accepts, with the same contents, its parent a rank of
 *       the job or the appliance, its children the ranks whose parent it is;
 *  - 2: a probe event and a probe_result: decoded ids are 1..2^53, borrowed members
 *       have the types the decoders promise.
 * Invariants beyond the sanitizers are FUZZ_CHECKs.
 */
#include <math.h>

#include <pbox/pbox.h>

#include "common/ctlproto.h"
#include "fuzz.h"

static void same(const struct pbox_plan *a, const struct pbox_plan *b)
{
	FUZZ_CHECK(a->revision == b->revision && a->delta == b->delta && a->push_up == b->push_up &&
			   a->link == b->link && a->link_bps == b->link_bps &&
			   a->broadcast_delta == b->broadcast_delta &&
			   a->broadcast_up == b->broadcast_up && a->delta_low == b->delta_low &&
			   a->delta_up == b->delta_up && a->min_rate_bps == b->min_rate_bps &&
			   a->parent == b->parent && a->depth == b->depth &&
			   a->nchildren == b->nchildren && strcmp(a->phub, b->phub) == 0,
		   "plan changed by encode/decode (revision %lld)", (long long)a->revision);
	FUZZ_CHECK(memcmp(a->children, b->children, a->nchildren * sizeof(a->children[0])) == 0,
		   "children changed");
}

static void roundtrip(const struct pbox_plan *p)
{
	struct pbox_plan *q = malloc(sizeof(*q));
	json_t *e = pbox_ctl_plan_encode(p);
	char err[256];

	FUZZ_CHECK(e != NULL && q != NULL, "encode");
	FUZZ_CHECK(pbox_ctl_plan_decode(e, q, err, sizeof(err)) == 0, "re-decode: %s", err);
	same(p, q);
	json_decref(e);
	free(q);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct pbox_plan *p;
	json_t *j;
	char err[256];
	unsigned mode, workers = 1;

	if (size < 1) {
		return 0;
	}
	mode = data[0] % 3;
	data++, size--;
	if (mode == 1 && size >= 1) {
		workers = data[0] % 8 + 1;
		data++, size--;
	}
	j = json_loadb((const char *)data, size, 0, NULL);
	p = malloc(sizeof(*p));
	if (j == NULL || p == NULL) {
		json_decref(j);
		free(p);
		return 0;
	}
	if (mode == 0) {
		if (pbox_ctl_plan_decode(j, p, err, sizeof(err)) == 0) {
			FUZZ_CHECK(p->revision >= 1 && p->delta_low <= p->delta_up &&
					   p->nchildren <= PBOX_PLAN_MAX_CHILDREN,
				   "decoded plan out of range");
			roundtrip(p);
		}
	} else if (mode == 1) {
		for (uint32_t r = 0; r < 8; r++) {
			if (pbox_ctl_plan_slice(j, r, workers, p, err, sizeof(err)) != 0) {
				continue;
			}
			FUZZ_CHECK(r < workers, "a slice of rank %u of %u workers", r, workers);
			FUZZ_CHECK(p->parent >= -1 && p->parent < (int32_t)workers &&
					   p->parent != (int32_t)r,
				   "parent %d", p->parent);
			FUZZ_CHECK(p->depth >= 1 && p->depth <= workers, "depth %u", p->depth);
			for (uint32_t k = 0; k < p->nchildren; k++) {
				FUZZ_CHECK(p->children[k] < workers && p->children[k] != r,
					   "child %u", p->children[k]);
			}
			roundtrip(p);
		}
	} else {
		uint64_t id;
		const json_t *m;
		const char *e;
		int en;

		if (pbox_ctl_probe_event_decode(j, &id, &m, err, sizeof(err)) == 0) {
			FUZZ_CHECK(id >= 1 && id <= (1ULL << 53) && json_is_object(m), "event");
		}
		if (pbox_ctl_probe_result_decode(j, &id, &m, &en, &e, err, sizeof(err)) == 0) {
			FUZZ_CHECK(id >= 1 && id <= (1ULL << 53), "id");
			FUZZ_CHECK((m != NULL && json_is_object(m) && en == 0 && e == NULL) ||
					   (m == NULL && en >= 1 && en <= 4095 && e != NULL),
				   "result or error");
		}
	}
	json_decref(j);
	free(p);
	return 0;
}
