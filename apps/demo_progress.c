/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What `pbox demo` shows while it trains: the start line once every worker is ready, the
 * progress bar (a terminal) or progress lines (anything else), and one line per epoch.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "common/clock.h"
#include "common/compiler.h"
#include "demo.h"
#include "train/schedule.h"

uint64_t demo_min_steps(const struct demo *d)
{
	uint64_t m = UINT64_MAX;

	for (uint32_t r = 0; r < d->o.workers; r++) {
		m = PBOX_MIN(m, d->w[r].total_steps);
	}
	return m;
}

uint64_t demo_wire_bytes(const struct demo *d, uint64_t *tx, uint64_t *rx)
{
	uint64_t t = 0, x = 0;

	for (uint32_t r = 0; r < d->o.workers; r++) {
		t += d->w[r].net.tx_bytes;
		x += d->w[r].net.rx_bytes;
	}
	if (tx != NULL) {
		*tx = t;
		*rx = x;
	}
	return t + x;
}

static uint64_t planned_steps(const struct demo *d)
{
	uint64_t all = (uint64_t)d->steps_per_epoch * d->o.epochs;

	return d->o.max_steps != 0 ? PBOX_MIN(all, d->o.max_steps) : all;
}

void demo_clear_bar(struct demo *d)
{
	if (d->tty) {
		fprintf(d->out, "\r\033[K");
	}
}

void demo_show_progress(struct demo *d, bool force)
{
	uint64_t done = demo_min_steps(d), spe = d->steps_per_epoch;
	double now = pbox_mono_s(), rate;
	uint32_t epoch, step;
	bool testing;
	char wire[32];

	if (d->nready < d->o.workers || spe == 0 || done >= planned_steps(d) ||
	    (!force && now - d->last_plain < (d->tty ? DEMO_BAR_EVERY_S : DEMO_PLAIN_EVERY_S))) {
		return;
	}
	d->last_plain = now;
	epoch = (uint32_t)(done / spe) + 1;
	step = (uint32_t)(done % spe);
	/* All ranks finished an epoch's steps and are testing: show that epoch as full
	 * until its summary arrives. */
	testing = step == 0 && epoch > 1 && d->ep[epoch - 2].reports < d->o.workers;
	if (testing) {
		epoch--;
		step = (uint32_t)spe;
	}
	rate = now > d->t_ready ? (double)done * d->o.batch / (now - d->t_ready) : 0;
	pbox_cli_bytes((double)demo_wire_bytes(d, NULL, NULL), wire, sizeof(wire));
	if (d->tty) {
		int fill = (int)((double)step * DEMO_BAR_WIDTH / (double)spe);

		fprintf(d->out,
			"\r\033[Kepoch %u/%u [%.*s%*s] %3.0f%% %u/%u steps, %.0f samples/s, %s on "
			"the wire%s",
			epoch, d->o.epochs, fill, "##############################################",
			DEMO_BAR_WIDTH - fill, "", demo_pct(step, spe), step, d->steps_per_epoch,
			rate, wire, testing ? ", testing" : "");
	} else {
		fprintf(d->out,
			"epoch %u/%u: %u/%u steps (%.0f%%), %.0f samples/s, %s on the wire%s\n",
			epoch, d->o.epochs, step, d->steps_per_epoch, demo_pct(step, spe), rate,
			wire, testing ? ", testing" : "");
	}
	fflush(d->out);
}

void demo_show_epoch(struct demo *d, uint32_t e)
{
	const struct epoch_sum *s = &d->ep[e];
	char wire[32];

	demo_clear_bar(d);
	fprintf(d->out,
		"epoch %u/%u: train loss %.4f acc %.2f%% | test acc %.2f%% | %s on the wire | "
		"%.1f s, %.0f samples/s\n",
		e + 1, d->o.epochs, s->train.samples ? s->train.loss / (double)s->train.samples : 0,
		demo_pct(s->train.correct, s->train.samples),
		demo_pct(s->test.correct, s->test.samples),
		pbox_cli_bytes((double)s->wire_bytes, wire, sizeof(wire)), s->train_s,
		s->train_s > 0 ? (double)s->train.samples / s->train_s : 0.0);
	fflush(d->out);
}

void demo_show_ready(struct demo *d)
{
	uint32_t start, most, least;
	char per[32];

	/* Rank 0 gets the largest shard of the batch, the last rank the smallest. */
	pbox_sched_split(d->o.batch, d->o.workers, 0, &start, &most);
	pbox_sched_split(d->o.batch, d->o.workers, d->o.workers - 1, &start, &least);
	if (least != most) {
		snprintf(per, sizeof(per), "%u-%u", least, most);
	} else {
		snprintf(per, sizeof(per), "%u", most);
	}
	fprintf(d->out,
		"all %u workers ready after %.1f s: %u steps per epoch of %u samples (%s per "
		"worker)\n",
		d->o.workers, d->t_ready - d->t_start, d->steps_per_epoch, d->o.batch, per);
	if (d->transport[0] != '\0') {
		fprintf(d->out, "transport: %s\n", d->transport);
	}
	if (strstr(d->transport, "shm") != NULL) {
		fprintf(d->out,
			"gradients pushed from registered memory (not copied): %u of %u "
			"workers\n",
			d->nregistered, d->o.workers);
	}
	if (d->killed) {
		fprintf(d->out,
			"resuming at step %llu: the version pboxd restored from its checkpoint "
			"(%llu steps redone)\n",
			(unsigned long long)d->resumed_at,
			(unsigned long long)(d->killed_at - PBOX_MIN(d->killed_at, d->resumed_at)));
	}
	fflush(d->out);
}
