/* SPDX-License-Identifier: BSD-3-Clause */
/* Seeded drop / duplicate / reorder decisions for outgoing datagrams (see fault.h). */
#include "fault.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int pbox_fault_check(const struct pbox_fault_cfg *c, char *err, size_t errlen)
{
	const double p[3] = { c->drop, c->dup, c->reorder };
	const char *const n[3] = { "drop", "dup", "reorder" };

	for (int i = 0; i < 3; i++) {
		if (!(p[i] >= 0.0 && p[i] <= 1.0)) {
			snprintf(err, errlen, "fault %s=%g: a probability must be in [0, 1]", n[i],
				 p[i]);
			return -EINVAL;
		}
	}
	if (c->drop + c->dup + c->reorder > 1.0) {
		snprintf(err, errlen, "fault probabilities add up to %g (more than 1)",
			 c->drop + c->dup + c->reorder);
		return -EINVAL;
	}
	return 0;
}

int pbox_fault_parse(const char *spec, struct pbox_fault_cfg *cfg, char *err, size_t errlen)
{
	char buf[256], *save = NULL, *item;

	memset(cfg, 0, sizeof(*cfg));
	cfg->seed = 1;
	if (spec == NULL || *spec == '\0') {
		return 0;
	}
	if (strlen(spec) >= sizeof(buf)) {
		snprintf(err, errlen, "fault spec too long");
		return -EINVAL;
	}
	strcpy(buf, spec);
	for (item = strtok_r(buf, ",", &save); item != NULL; item = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(item, '='), *end;
		double v;

		if (eq == NULL) {
			snprintf(err, errlen, "fault spec item '%s': expected key=value", item);
			return -EINVAL;
		}
		*eq = '\0';
		errno = 0;
		v = strtod(eq + 1, &end);
		if (errno != 0 || end == eq + 1 || *end != '\0') {
			snprintf(err, errlen, "fault spec item '%s': '%s' is not a number", item,
				 eq + 1);
			return -EINVAL;
		}
		if (strcmp(item, "drop") == 0) {
			cfg->drop = v;
		} else if (strcmp(item, "dup") == 0) {
			cfg->dup = v;
		} else if (strcmp(item, "reorder") == 0) {
			cfg->reorder = v;
		} else if (strcmp(item, "seed") == 0) {
			cfg->seed = strtoull(eq + 1, NULL, 0);
		} else {
			snprintf(err, errlen,
				 "fault spec: unknown key '%s' (drop, dup, reorder, seed)", item);
			return -EINVAL;
		}
	}
	return pbox_fault_check(cfg, err, errlen);
}

void pbox_fault_init(struct pbox_fault *f, const struct pbox_fault_cfg *cfg)
{
	memset(f, 0, sizeof(*f));
	f->cfg = *cfg;
	/* splitmix64 of the seed so that small seeds give well-mixed streams */
	f->state = cfg->seed + 0x9e3779b97f4a7c15ull;
	f->state = (f->state ^ (f->state >> 30)) * 0xbf58476d1ce4e5b9ull;
	f->state = (f->state ^ (f->state >> 27)) * 0x94d049bb133111ebull;
	f->state ^= f->state >> 31;
	if (f->state == 0) {
		f->state = 1;
	}
}

enum pbox_fault_action pbox_fault_next(struct pbox_fault *f)
{
	double u;

	f->state ^= f->state << 13;
	f->state ^= f->state >> 7;
	f->state ^= f->state << 17;
	u = (double)(f->state >> 11) * (1.0 / 9007199254740992.0);
	if (u < f->cfg.drop) {
		f->dropped++;
		return PBOX_FAULT_DROP;
	}
	u -= f->cfg.drop;
	if (u < f->cfg.dup) {
		f->duplicated++;
		return PBOX_FAULT_DUP;
	}
	u -= f->cfg.dup;
	if (u < f->cfg.reorder) {
		f->reordered++;
		return PBOX_FAULT_REORDER;
	}
	return PBOX_FAULT_PASS;
}
