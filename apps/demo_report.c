/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * `pbox demo`'s final report: pboxd's counters read at the end, the summary for people,
 * and the --json summary.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "common/clock.h"
#include "demo.h"

void demo_fetch_appliance_stats(struct demo *d)
{
	/* The demo's pboxd takes the job token as its admin token too (both are this user's). */
	json_t *req = json_pack("{s:s, s:s}", "op", "stats", "admin_token", d->token),
	       *reply = NULL;
	char err[256];

	if (pbox_cli_ctl_request(d->control, req, &reply, 5000, err, sizeof(err)) == 0) {
		const json_t *jobs = json_object_get(reply, "jobs"), *job;
		size_t i;

		d->appliance = json_incref(json_object_get(reply, "totals"));
		/* The synchronisation model pboxd ran the job under, as it reports it: shows
		 * that --sync reached the appliance. */
		json_array_foreach(jobs, i, job)
		{
			if (d->appliance != NULL && pbox_cli_json_u64(job, "id") == DEMO_JOB_ID) {
				json_object_set(d->appliance, "sync", json_object_get(job, "sync"));
			}
		}
		json_decref(reply);
	} else {
		fprintf(stderr, "pbox demo: could not read pboxd's counters: %s\n", err);
	}
	json_decref(req);
}

struct totals {
	uint64_t steps, samples, tx, rx, retransmits, probes;
	double train_s;
	struct pbox_mlp_stats test;
	uint32_t last_epoch;
};

static void summarize(const struct demo *d, struct totals *t)
{
	memset(t, 0, sizeof(*t));
	t->steps = demo_min_steps(d);
	t->samples = t->steps * d->o.batch;
	for (uint32_t e = 0; e < d->o.epochs; e++) {
		if (d->ep[e].reports == d->o.workers) {
			t->train_s += d->ep[e].train_s;
			t->test = d->ep[e].test;
			t->last_epoch = e + 1;
		}
	}
	demo_wire_bytes(d, &t->tx, &t->rx);
	for (uint32_t r = 0; r < d->o.workers; r++) {
		t->retransmits += d->w[r].net.retransmits;
		t->probes += d->w[r].net.probes;
	}
}

/* Whether every rank finished with the same model (its done event's CRC32C). */
bool demo_replicas_identical(const struct demo *d)
{
	for (uint32_t r = 1; r < d->o.workers; r++) {
		if (d->w[r].model_crc != d->w[0].model_crc) {
			return false;
		}
	}
	return true;
}

/* What DVF did, from pboxd's counters: push payloads received (blocks and dense
 * fragments) and results sent, against the dense bytes they stand for. */
static void print_dvf(struct demo *d)
{
	const json_t *v = json_object_get(d->appliance, "dvf");
	uint64_t ib = pbox_cli_json_u64(v, "in_bytes"), id = pbox_cli_json_u64(v, "in_dense");
	uint64_t iv = pbox_cli_json_u64(v, "in_vals");
	uint64_t ob = pbox_cli_json_u64(v, "out_bytes"), od = pbox_cli_json_u64(v, "out_dense");
	uint64_t ov = pbox_cli_json_u64(v, "out_vals");
	char a[32], b[32], c[32], e[32];

	if (id == 0) {
		return;
	}
	fprintf(d->out, "dvf: pushes %s for %s dense (%.2fx smaller, %.1f%% of the values sent)",
		pbox_cli_bytes((double)ib, a, sizeof(a)), pbox_cli_bytes((double)id, b, sizeof(b)),
		ib ? (double)id / (double)ib : 0.0, 400.0 * (double)iv / (double)id);
	if (od != 0) {
		fprintf(d->out, "; broadcasts %s for %s (%.2fx, %.1f%%)",
			pbox_cli_bytes((double)ob, c, sizeof(c)),
			pbox_cli_bytes((double)od, e, sizeof(e)),
			ob ? (double)od / (double)ob : 0.0, 400.0 * (double)ov / (double)od);
	}
	fprintf(d->out, "\n");
}

void demo_print_summary(struct demo *d)
{
	struct totals t;
	char tx[32], rx[32];

	summarize(d, &t);
	demo_clear_bar(d);
	fprintf(d->out, "final test accuracy: %.2f%% (%llu of %llu test images)\n",
		demo_pct(t.test.correct, t.test.samples), (unsigned long long)t.test.correct,
		(unsigned long long)t.test.samples);
	fprintf(d->out,
		"throughput: %.0f samples/s (%llu samples in %llu steps, %.1f s of training; %.1f "
		"s "
		"in all)\n",
		t.train_s > 0 ? (double)t.samples / t.train_s : 0.0, (unsigned long long)t.samples,
		(unsigned long long)t.steps, t.train_s, d->t_done - d->t_start);
	fprintf(d->out, "on the wire: %s sent and %s received by %u worker%s, %llu retransmits\n",
		pbox_cli_bytes((double)t.tx, tx, sizeof(tx)),
		pbox_cli_bytes((double)t.rx, rx, sizeof(rx)), d->o.workers,
		d->o.workers == 1 ? "" : "s", (unsigned long long)t.retransmits);
	if (d->appliance != NULL) {
		fprintf(d->out,
			"pboxd: %llu chunk iterations on %u core%s, %llu duplicates and %llu "
			"retransmissions received, %llu replies re-sent, %llu dropped\n",
			(unsigned long long)pbox_cli_json_u64(d->appliance, "iterations"),
			d->o.cores, d->o.cores == 1 ? "" : "s",
			(unsigned long long)pbox_cli_json_u64(d->appliance, "dups"),
			(unsigned long long)pbox_cli_json_u64(d->appliance, "rx_retransmits"),
			(unsigned long long)pbox_cli_json_u64(d->appliance, "replies_resent"),
			(unsigned long long)pbox_cli_json_u64(d->appliance, "dropped"));
	}
	if (d->o.dvf && d->appliance != NULL) {
		print_dvf(d);
	}
	if (demo_is_broadcast(d)) {
		fprintf(d->out, "broadcast: all %u ranks hold the same model (crc32c %08x)\n",
			d->o.workers, d->w[0].model_crc);
	}
	if (d->o.save_model != NULL) {
		fprintf(d->out, "model saved to %s\n", d->o.save_model);
	}
	fflush(d->out);
}

void demo_print_json(struct demo *d, int rc, const char *error)
{
	json_t *o = json_object(), *eps = json_array();
	struct totals t;

	json_object_set_new(o, "ok", json_boolean(rc == 0));
	if (d->killed) {
		json_object_set_new(o, "appliance_killed_at",
				    json_integer((json_int_t)d->killed_at));
		json_object_set_new(o, "resumed_at", json_integer((json_int_t)d->resumed_at));
	}
	if (rc != 0) {
		json_object_set_new(o, "error", json_string(error));
	}
	if (d->w != NULL && d->ep != NULL) {
		summarize(d, &t);
		for (uint32_t e = 0; e < d->o.epochs; e++) {
			const struct epoch_sum *s = &d->ep[e];

			if (s->reports != d->o.workers) {
				continue;
			}
			json_array_append_new(
				eps,
				json_pack(
					"{s:i, s:i, s:f, s:f, s:f, s:f, s:I, s:I, s:f, s:f, s:I}",
					"epoch", (json_int_t)e + 1, "steps", (json_int_t)s->steps,
					"train_loss",
					s->train.samples ? s->train.loss / (double)s->train.samples
							 : 0.0,
					"train_acc", demo_ratio(s->train.correct, s->train.samples),
					"test_loss",
					s->test.samples ? s->test.loss / (double)s->test.samples
							: 0.0,
					"test_acc", demo_ratio(s->test.correct, s->test.samples),
					"test_correct", (json_int_t)s->test.correct, "test_samples",
					(json_int_t)s->test.samples, "train_s", s->train_s,
					"eval_s", s->eval_s, "wire_bytes",
					(json_int_t)s->wire_bytes));
		}
		json_object_set_new(o, "epochs", eps);
		eps = NULL;
		json_object_set_new(o, "final_test_acc",
				    json_real(demo_ratio(t.test.correct, t.test.samples)));
		json_object_set_new(o, "test_correct", json_integer((json_int_t)t.test.correct));
		json_object_set_new(o, "test_samples", json_integer((json_int_t)t.test.samples));
		json_object_set_new(o, "steps", json_integer((json_int_t)t.steps));
		json_object_set_new(o, "samples", json_integer((json_int_t)t.samples));
		json_object_set_new(o, "train_s", json_real(t.train_s));
		json_object_set_new(o, "samples_per_s",
				    json_real(t.train_s > 0 ? (double)t.samples / t.train_s : 0));
		json_object_set_new(o, "elapsed_s", json_real(pbox_mono_s() - d->t_start));
		json_object_set_new(o, "tx_bytes", json_integer((json_int_t)t.tx));
		json_object_set_new(o, "rx_bytes", json_integer((json_int_t)t.rx));
		json_object_set_new(o, "wire_bytes", json_integer((json_int_t)(t.tx + t.rx)));
		json_object_set_new(o, "retransmits", json_integer((json_int_t)t.retransmits));
		json_object_set_new(o, "probes", json_integer((json_int_t)t.probes));
	}
	json_decref(eps);
	json_object_set_new(o, "workers", json_integer(d->o.workers));
	json_object_set_new(o, "batch", json_integer(d->o.batch));
	json_object_set_new(o, "optimizer", json_string(d->o.optimizer));
	json_object_set_new(o, "mode", json_string(d->o.mode));
	json_object_set_new(o, "dvf",
			    d->o.dvf ? json_pack("{s:f, s:f, s:s}", "low", d->o.dvf_low, "up",
						 d->o.dvf_up, "codec", d->o.dvf_codec)
				     : json_null());
	if (d->w != NULL) { /* NULL when the set-up failed before the workers' table */
		json_t *crcs = json_array();

		for (uint32_t r = 0; r < d->o.workers; r++) {
			json_array_append_new(crcs, json_integer(d->w[r].model_crc));
		}
		json_object_set_new(o, "model_crcs", crcs);
		json_object_set_new(o, "replicas_identical",
				    json_boolean(demo_replicas_identical(d)));
	}
	json_object_set_new(o, "lr", json_real(d->o.lr));
	json_object_set_new(o, "deterministic", json_boolean(d->o.deterministic));
	json_object_set_new(o, "sync", json_string(d->o.sync));
	json_object_set_new(o, "release", json_string(d->o.release));
	json_object_set_new(o, "staleness", json_integer(d->o.staleness));
	json_object_set_new(o, "exact_lag", json_boolean(d->o.exact_lag));
	json_object_set_new(o, "slow_rank",
			    d->o.slow_rank == UINT32_MAX ? json_null()
							 : json_integer(d->o.slow_rank));
	json_object_set_new(o, "slow_factor", json_real(d->o.slow_factor));
	json_object_set_new(o, "cores", json_integer(d->o.cores));
	json_object_set_new(o, "fault", d->o.fault ? json_string(d->o.fault) : json_null());
	json_object_set_new(o, "model",
			    d->o.save_model ? json_string(d->o.save_model) : json_null());
	if (d->appliance != NULL) {
		json_object_set(o, "appliance", d->appliance);
	}
	json_dumpf(o, stdout, JSON_INDENT(2));
	printf("\n");
	fflush(stdout);
	json_decref(o);
}
