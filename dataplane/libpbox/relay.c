/* SPDX-License-Identifier: BSD-3-Clause */
/* The worker's TSB relay (see relay.h). */
#include "relay.h"

#include <endian.h>
#include <string.h>

void pbox_relay_init(struct pbox_relay *r, uint32_t job, const struct pbox_jobdesc *desc,
		     const struct pbox_tsb_key *key)
{
	memset(r, 0, sizeof(*r));
	r->key = *key;
	r->cookie = pbox_tsb_cookie(key);
	r->wire.id = job;
	r->wire.desc = desc;
	r->wire.cookies = &r->cookie;
	r->pos.parent = PBOX_TSB_ROOT;
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
