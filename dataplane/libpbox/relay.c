/* SPDX-License-Identifier: BSD-3-Clause */
/* The worker's TSB relay (see relay.h). */
#include "relay.h"

#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const struct pbox_wire_job *lookup_pull(void *arg, uint32_t id)
{
	const struct pbox_relay *r = arg;

	return id == r->pull_wire.id ? &r->pull_wire : NULL;
}

int pbox_relay_init(struct pbox_relay *r, uint32_t job, const struct pbox_jobdesc *desc,
		    const struct pbox_tsb_key *key, size_t cache_bytes)
{
	memset(r, 0, sizeof(*r));
	r->key = *key;
	r->cookie = pbox_tsb_cookie(key);
	r->wire.id = job;
	r->wire.desc = desc;
	r->wire.cookies = &r->cookie;
	r->cookies = malloc(desc->nworkers * sizeof(*r->cookies));
	if (r->cookies == NULL) {
		return -ENOMEM;
	}
	for (uint32_t w = 0; w < desc->nworkers; w++) {
		r->cookies[w] = r->cookie;
	}
	r->pull_wire = r->wire;
	r->pull_wire.cookies = r->cookies;
	r->pos.parent = PBOX_TSB_ROOT;
	r->cache_bytes = cache_bytes ? cache_bytes : PBOX_RELAY_CACHE_BYTES;
	return 0;
}

void pbox_relay_fini(struct pbox_relay *r)
{
	free(r->cookies);
	free(r->cache);
	free(r->slot);
	memset(r, 0, sizeof(*r));
}

int pbox_relay_set_position(struct pbox_relay *r, const struct pbox_tsb_pos *pos)
{
	const struct pbox_jobdesc *d = r->wire.desc;
	uint64_t frags = 0;

	r->pos = *pos;
	r->positioned = true;
	if (pos->nchildren == 0 || r->cache != NULL) {
		return 0;
	}
	r->per_chunk = (d->chunk_bytes + d->frag_bytes - 1) / d->frag_bytes;
	r->slot_bytes = PBOX_WIRE_HDR_LEN + d->frag_bytes;
	frags = (uint64_t)d->nchunks * r->per_chunk;
	r->nslots =
		(uint32_t)(frags < r->cache_bytes / r->slot_bytes ? frags
								  : r->cache_bytes / r->slot_bytes);
	if (r->nslots == 0) {
		return 0;
	}
	r->cache = malloc((size_t)r->nslots * r->slot_bytes);
	r->slot = calloc(r->nslots, sizeof(*r->slot));
	if (r->cache == NULL || r->slot == NULL) {
		free(r->cache);
		free(r->slot);
		r->cache = NULL;
		r->slot = NULL;
		r->nslots = 0;
		return -ENOMEM;
	}
	return 0;
}

static uint32_t slot_of(const struct pbox_relay *r, uint32_t chunk, uint32_t frag)
{
	return (uint32_t)(((uint64_t)chunk * r->per_chunk + frag) % r->nslots);
}

void pbox_relay_keep(struct pbox_relay *r, const void *pkt, uint32_t len, const struct pbox_msg *m)
{
	uint32_t f, i;

	if (r->nslots == 0 || len > r->slot_bytes) {
		return;
	}
	f = m->frag_off / r->wire.desc->frag_bytes;
	i = slot_of(r, m->chunk, f);
	memcpy(r->cache + (size_t)i * r->slot_bytes, pkt, len);
	r->slot[i] = (struct pbox_relay_slot){
		.chunk = m->chunk, .frag = f, .label = m->iter, .len = len
	};
}

bool pbox_relay_has_parent(const struct pbox_relay *r)
{
	return r->positioned && r->pos.parent != PBOX_TSB_ROOT && r->pos.parent_addr.port != 0;
}

int pbox_relay_ask_parent(const struct pbox_relay *r, struct pbox_msg *m,
			  const struct pbox_tx_ops *tx, void *tx_ctx)
{
	struct pbox_wire_hdr h;

	m->job = r->wire.id;
	m->cookie = r->cookie;
	pbox_wire_encode(m, &h);
	return tx->send(tx_ctx, &r->pos.parent_addr, &h, NULL, 0);
}

int pbox_relay_serve(const struct pbox_relay *r, const void *pkt, uint32_t len,
		     const struct pbox_peer *from, const struct pbox_tx_ops *tx, void *tx_ctx,
		     enum pbox_drop_reason *why)
{
	const struct pbox_wire_job *j;
	const struct pbox_peer *to = NULL;
	const struct pbox_chunk_desc *cd;
	struct pbox_msg m;
	uint32_t label, base, nf;
	int sent = 0;

	*why = pbox_wire_validate(pkt, len, PBOX_ROLE_APPLIANCE, lookup_pull, (void *)r, &m, &j);
	if (*why != PBOX_DROP_NONE) {
		return -1;
	}
	if (m.type != PBOX_MSG_PULL) {
		*why = PBOX_DROP_UNEXPECTED;
		return -1;
	}
	for (uint32_t c = 0; r->positioned && c < r->pos.nchildren; c++) {
		if (r->pos.child[c] == m.sender && from != NULL &&
		    r->pos.child_addr[c].ip == from->ip &&
		    r->pos.child_addr[c].port == from->port) {
			to = &r->pos.child_addr[c];
		}
	}
	if (to == NULL) {
		return -1; /* not a child of ours (at its address) */
	}
	cd = &r->wire.desc->chunks[m.chunk];
	nf = cd->nfrags;
	label = (m.flags & PBOX_F_SACK) ? m.arg0 : m.iter;
	base = (m.flags & PBOX_F_SACK) ? m.frag_off / r->wire.desc->frag_bytes : 0;
	for (uint32_t f = 0; f < nf && r->nslots != 0; f++) {
		const struct pbox_relay_slot *sl = &r->slot[slot_of(r, m.chunk, f)];
		const uint8_t *p;
		struct pbox_wire_hdr h;

		if (((m.flags & PBOX_F_SACK) && pbox_sack_has(base, m.sack, f)) || sl->len == 0 ||
		    sl->chunk != m.chunk || sl->frag != f || sl->label != label) {
			continue;
		}
		p = r->cache + (size_t)slot_of(r, m.chunk, f) * r->slot_bytes;
		memcpy(&h, p, sizeof(h));
		sent += tx->send(tx_ctx, to, &h, p + PBOX_WIRE_HDR_LEN,
				 sl->len - PBOX_WIRE_HDR_LEN) == 0;
	}
	return sent;
}

bool pbox_relay_is_tree(const void *pkt, uint32_t len)
{
	const struct pbox_wire_hdr *h = pkt;
	uint16_t flags;

	if (len < PBOX_WIRE_HDR_LEN || h->type != PBOX_MSG_DATA) {
		return false;
	}
	memcpy(&flags, (const uint8_t *)pkt + offsetof(struct pbox_wire_hdr, flags), sizeof(flags));
	return (be16toh(flags) & PBOX_F_TREE) != 0;
}

static const struct pbox_wire_job *lookup(void *arg, uint32_t id)
{
	const struct pbox_relay *r = arg;

	return id == r->wire.id ? &r->wire : NULL;
}

enum pbox_drop_reason pbox_relay_check(const struct pbox_relay *r, const void *pkt, uint32_t len,
				       struct pbox_msg *m)
{
	const struct pbox_wire_job *j;

	return pbox_wire_validate(pkt, len, PBOX_ROLE_WORKER, lookup, (void *)r, m, &j);
}

bool pbox_relay_from_parent(const struct pbox_relay *r, const struct pbox_peer *from)
{
	return r->positioned && r->pos.parent != PBOX_TSB_ROOT && from != NULL &&
	       r->pos.parent_addr.port != 0 && r->pos.parent_addr.ip == from->ip &&
	       r->pos.parent_addr.port == from->port;
}

bool pbox_relay_verify(const struct pbox_relay *r, const void *pkt, uint32_t len)
{
	return pbox_tsb_verify(&r->key, pkt, len);
}

uint32_t pbox_relay_forward(const struct pbox_relay *r, const void *pkt, uint32_t len,
			    const struct pbox_tx_ops *tx, void *tx_ctx)
{
	const uint8_t *payload = (const uint8_t *)pkt + PBOX_WIRE_HDR_LEN;
	struct pbox_wire_hdr h;
	uint32_t n = 0;

	if (!r->positioned) {
		return 0;
	}
	memcpy(&h, pkt, sizeof(h));
	for (uint32_t c = 0; c < r->pos.nchildren; c++) {
		n += tx->send(tx_ctx, &r->pos.child_addr[c], &h, payload,
			      len - PBOX_WIRE_HDR_LEN) == 0;
	}
	return n;
}
