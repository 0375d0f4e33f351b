/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The workers' event streams: the JSON lines `pbox train --json` writes on its stdout
 * (ready, step, epoch, done, error), read from their pipes into each struct worker and
 * the per-epoch sums.
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "common/clock.h"
#include "common/compiler.h"
#include "common/ctlproto.h"
#include "demo.h"

static double jreal(const json_t *o, const char *k)
{
	const json_t *v = json_object_get(o, k);

	return json_is_number(v) ? json_number_value(v) : 0.0;
}

static void read_net(const json_t *o, struct pbox_client_stats *n)
{
	const json_t *net = json_object_get(o, "net");

	n->tx_bytes = pbox_cli_json_u64(net, "tx_bytes");
	n->rx_bytes = pbox_cli_json_u64(net, "rx_bytes");
	n->tx_pkts = pbox_cli_json_u64(net, "tx_pkts");
	n->rx_pkts = pbox_cli_json_u64(net, "rx_pkts");
	n->retransmits = pbox_cli_json_u64(net, "retransmits");
	n->probes = pbox_cli_json_u64(net, "probes");
	n->dropped = pbox_cli_json_u64(net, "dropped");
}

static void read_stats(const json_t *o, const char *k, struct pbox_mlp_stats *acc)
{
	const json_t *s = json_object_get(o, k);

	acc->loss += jreal(s, "loss");
	acc->correct += pbox_cli_json_u64(s, "correct");
	acc->samples += pbox_cli_json_u64(s, "samples");
}

/* A worker's data path (its ready event): the run's, or "shm+udp" once they differ. */
static void note_transport(struct demo *d, const char *t)
{
	if (t == NULL || strlen(t) > 3) {
		return;
	}
	if (d->transport[0] == '\0') {
		snprintf(d->transport, sizeof(d->transport), "%s", t);
	} else if (strcmp(d->transport, t) != 0) {
		snprintf(d->transport, sizeof(d->transport), "shm+udp");
	}
}

/* One event line from worker w. */
static void on_line(struct demo *d, struct worker *w, const char *line)
{
	json_t *o = json_loads(line, 0, NULL);
	const char *ev;

	if (o == NULL) {
		return; /* not an event; the workers print only events on stdout */
	}
	ev = json_string_value(json_object_get(o, "ev"));
	if (ev == NULL) {
		json_decref(o);
		return;
	}
	if (strcmp(ev, "ready") == 0) {
		if (!w->ready) {
			w->ready = true;
			d->steps_per_epoch = (uint32_t)pbox_cli_json_u64(o, "steps");
			/* The step a restarted rank resumes at (0 on a fresh start). */
			d->resumed_at = pbox_cli_json_u64(o, "total_steps");
			note_transport(d, json_string_value(json_object_get(o, "transport")));
			if (json_is_true(json_object_get(o, "registered"))) {
				d->nregistered++;
			}
			if (++d->nready == d->o.workers) {
				d->t_ready = pbox_mono_s();
				d->last_plain = d->t_ready;
				demo_show_ready(d);
			}
		}
	} else if (strcmp(ev, "step") == 0) {
		w->total_steps = pbox_cli_json_u64(o, "total_steps");
		read_net(o, &w->net);
	} else if (strcmp(ev, "epoch") == 0) {
		uint32_t e = (uint32_t)pbox_cli_json_u64(o, "epoch");

		w->total_steps = pbox_cli_json_u64(o, "total_steps");
		read_net(o, &w->net);
		/* After a restart, an epoch already reported by every rank may end again. */
		if (e >= 1 && e <= d->o.epochs && d->ep[e - 1].reports < d->o.workers) {
			struct epoch_sum *s = &d->ep[e - 1];

			read_stats(o, "train", &s->train);
			read_stats(o, "test", &s->test);
			s->train_s = PBOX_MAX(s->train_s, jreal(o, "train_s"));
			s->eval_s = PBOX_MAX(s->eval_s, jreal(o, "eval_s"));
			s->steps = PBOX_MAX(s->steps, (uint32_t)pbox_cli_json_u64(o, "step"));
			if (++s->reports == d->o.workers) {
				s->wire_bytes = demo_wire_bytes(d, NULL, NULL);
				demo_show_epoch(d, e - 1);
			}
		}
	} else if (strcmp(ev, "done") == 0) {
		read_net(o, &w->net);
		w->train_s = jreal(o, "train_s");
		w->model_crc = (uint32_t)pbox_cli_json_u64(o, "model_crc");
		if (!w->done) {
			w->done = true;
			if (++d->ndone == d->o.workers) {
				d->t_done = pbox_mono_s();
			}
		}
	} else if (strcmp(ev, "error") == 0) {
		const char *msg = json_string_value(json_object_get(o, "error"));

		snprintf(w->error, sizeof(w->error), "%s", msg ? msg : "unknown error");
	}
	json_decref(o);
}

/* Read what worker w wrote; returns false once its stream has ended. */
bool demo_drain(struct demo *d, struct worker *w)
{
	long n;
	char *line;

	if (w->out_fd < 0) {
		return false;
	}
	do {
		n = pbox_linebuf_fill(&w->lb, w->out_fd);
		while ((line = pbox_linebuf_next(&w->lb)) != NULL) {
			on_line(d, w, line);
		}
	} while (n > 0);
	if (n == -EAGAIN) {
		return true;
	}
	close(w->out_fd);
	w->out_fd = -1;
	return false;
}
