/* SPDX-License-Identifier: BSD-3-Clause */
/* TSB on the appliance: feeding the tree (see bcast.h). */
#include "bcast.h"

#include <stdlib.h>
#include <string.h>

#include "common/bitmap.h"
#include "common/log.h"
#include "engine.h"

struct pbox_tsb *pbox_tsb_create(const uint32_t *parent, uint32_t nworkers, uint32_t ncores,
				 const struct pbox_tsb_key *key)
{
	size_t words = pbox_bitmap_words(nworkers);
	struct pbox_tsb *t = calloc(1, sizeof(*t));

	if (t == NULL) {
		goto oom;
	}
	t->parent = calloc(nworkers, sizeof(*t->parent));
	t->core = aligned_alloc(PBOX_CACHE_LINE,
				PBOX_ALIGN_UP(ncores * sizeof(*t->core), PBOX_CACHE_LINE));
	if (t->parent == NULL || t->core == NULL) {
		goto oom;
	}
	memset(t->core, 0, ncores * sizeof(*t->core));
	t->ncores = ncores;
	for (uint32_t k = 0; k < ncores; k++) {
		t->core[k].bypass = calloc(words, sizeof(uint64_t));
		t->core[k].misses = calloc(nworkers, sizeof(uint32_t));
		t->core[k].miss_label = calloc(nworkers, sizeof(uint32_t));
		if (t->core[k].bypass == NULL || t->core[k].misses == NULL ||
		    t->core[k].miss_label == NULL) {
			goto oom;
		}
	}
	memcpy(t->parent, parent, nworkers * sizeof(*parent));
	t->nworkers = nworkers;
	t->key = *key;
	t->cookie = pbox_tsb_cookie(key);
	return t;
oom:
	PBOX_LOG_ERR(ENGINE, "out of memory for a broadcast tree of %u ranks", nworkers);
	pbox_tsb_free(t);
	return NULL;
}

void pbox_tsb_free(struct pbox_tsb *t)
{
	if (t == NULL) {
		return;
	}
	for (uint32_t k = 0; t->core != NULL && k < t->ncores; k++) {
		free(t->core[k].bypass);
		free(t->core[k].misses);
		free(t->core[k].miss_label);
	}
	free(t->core);
	free(t->parent);
	free(t);
}

uint32_t pbox_tsb_send_frag(struct pbox_tsb *t, uint32_t core, const uint64_t *live,
			    const struct pbox_peer *peers, const struct pbox_tx_ops *tx,
			    void *tx_ctx, struct pbox_msg *m, const void *payload,
			    struct pbox_core_stats *st)
{
	struct pbox_tsb_core *tc = &t->core[core];
	struct pbox_wire_hdr h;
	uint32_t n = 0;

	m->flags |= PBOX_F_TREE;
	m->sender = PBOX_SENDER_APPLIANCE;
	m->cookie = t->cookie;
	m->sack = 0;
	pbox_wire_encode(m, &h);
	/* One MAC per fragment, whatever the fan-out: every receiver gets the same bytes. */
	m->sack = pbox_tsb_mac(&t->key, &h, payload, m->frag_len);
	h.sack = htobe64(m->sack);
	for (uint32_t w = 0; w < t->nworkers; w++) {
		if (!pbox_bit_test(live, w) ||
		    pbox_tsb_feeder(t->parent, w, live, tc->bypass) != PBOX_TSB_ROOT) {
			continue;
		}
		if (peers[w].port == 0 ||
		    tx->send(tx_ctx, &peers[w], &h, payload, m->frag_len) != 0) {
			PBOX_STAT_ADD(st, tx_errors, 1);
			continue;
		}
		PBOX_STAT_ADD(st, tx_pkts, 1);
		PBOX_STAT_ADD(st, tx_bytes, PBOX_WIRE_HDR_LEN + m->frag_len);
		n++;
	}
	__atomic_store_n(&tc->sent, tc->sent + n, __ATOMIC_RELAXED);
	return n;
}

void pbox_tsb_note_repair(struct pbox_tsb *t, uint32_t core, const uint64_t *live, uint32_t w,
			  uint32_t label, bool got_some)
{
	struct pbox_tsb_core *tc = &t->core[core];
	uint32_t p;

	if (w >= t->nworkers) {
		return;
	}
	__atomic_store_n(&tc->repairs, tc->repairs + 1, __ATOMIC_RELAXED);
	p = pbox_tsb_feeder(t->parent, w, live, tc->bypass);
	if (p == PBOX_TSB_ROOT) {
		return; /* fed by the appliance: a loss on that hop, not a stalled relay */
	}
	if (got_some) {
		tc->misses[p] = 0; /* the relay forwards: a loss below it */
		return;
	}
	if (tc->misses[p] != 0 && tc->miss_label[p] == label) {
		return; /* counted for this iteration already */
	}
	tc->miss_label[p] = label;
	if (++tc->misses[p] < PBOX_TSB_STALL_PULLS) {
		return;
	}
	pbox_bit_set(tc->bypass, p);
	__atomic_store_n(&tc->bypasses, tc->bypasses + 1, __ATOMIC_RELAXED);
	PBOX_LOG_WARN(ENGINE,
		      "core %u: relay rank %u bypassed: in %u iterations in a row its children got "
		      "nothing of results sent down the tree; this core feeds them itself",
		      core, p, tc->misses[p]);
}
