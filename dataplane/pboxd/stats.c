/* SPDX-License-Identifier: BSD-3-Clause */
/* pboxd counters as JSON and as text (see stats.h). */
#include "stats.h"

#include <inttypes.h>
#include <string.h>

/* One consistent-enough copy of a core's counters (each value read atomically). */
static void snap(const struct pbox_core_stats *s, struct pbox_core_stats *o)
{
	const uint64_t *in = (const uint64_t *)s;
	uint64_t *out = (uint64_t *)o;

	for (size_t i = 0; i < offsetof(struct pbox_core_stats, polls) / 8 + 1; i++) {
		out[i] = pbox_stat_read(&in[i]);
	}
}

static void add(struct pbox_core_stats *t, const struct pbox_core_stats *s)
{
	uint64_t *a = (uint64_t *)t;
	const uint64_t *b = (const uint64_t *)s;

	for (size_t i = 0; i < offsetof(struct pbox_core_stats, polls) / 8 + 1; i++) {
		a[i] += b[i];
	}
}

static json_t *core_json(const struct pbox_core_stats *s, uint64_t tx_dropped, uint64_t rx_trunc)
{
	json_t *drops = json_object(), *o;
	uint64_t ndrops = 0, cyc = s->busy_cycles + s->idle_cycles;

	for (int r = 1; r < PBOX_DROP_COUNT; r++) {
		json_object_set_new(drops, pbox_drop_reason_name(r),
				    json_integer((json_int_t)s->drops[r]));
		ndrops += s->drops[r];
	}
	o = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
		      "rx_pkts", (json_int_t)s->rx_pkts, "rx_bytes", (json_int_t)s->rx_bytes,
		      "tx_pkts", (json_int_t)s->tx_pkts, "tx_bytes", (json_int_t)s->tx_bytes,
		      "tx_errors", (json_int_t)(s->tx_errors + tx_dropped), "agg_frags",
		      (json_int_t)s->agg_frags, "agg_bytes", (json_int_t)s->agg_bytes, "iterations",
		      (json_int_t)s->iterations, "dups", (json_int_t)s->dups, "rx_retransmits",
		      (json_int_t)s->rx_retransmits, "replies_resent",
		      (json_int_t)s->replies_resent, "pulls_held", (json_int_t)s->pulls_held,
		      "acks", (json_int_t)s->acks, "errors_sent", (json_int_t)s->errors_sent);
	json_object_set_new(o, "folded_frags", json_integer((json_int_t)s->folded_frags));
	json_object_set_new(o, "late_contribs", json_integer((json_int_t)s->late_contribs));
	json_object_set_new(o, "membership_changes",
			    json_integer((json_int_t)s->membership_changes));
	json_object_set_new(o, "nonfinite", json_integer((json_int_t)s->nonfinite));
	json_object_set_new(o, "nacks", json_integer((json_int_t)s->nacks));
	{
		/* DVF payloads (engine/encoding.h): blocks in, rejections by reason, results
		 * filtered (bytes sent and the dense bytes they stand for) */
		json_t *rej = json_object();

		for (int r = 1; r < PBOX_DVF_REJ_COUNT_REASONS; r++) {
			json_object_set_new(rej, pbox_dvf_reject_name(r),
					    json_integer((json_int_t)s->dvf_rejects[r]));
		}
		json_object_set_new(o, "dvf",
				    json_pack("{s:I, s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
					      "blocks", (json_int_t)s->dvf_blocks, "rejects", rej,
					      "in_bytes", (json_int_t)s->dvf_in_bytes, "in_dense",
					      (json_int_t)s->dvf_in_dense, "in_vals",
					      (json_int_t)s->dvf_in_vals, "out_frags",
					      (json_int_t)s->dvf_out_frags, "out_bytes",
					      (json_int_t)s->dvf_out_bytes, "out_dense",
					      (json_int_t)s->dvf_out_dense, "out_vals",
					      (json_int_t)s->dvf_out_vals));
	}
	json_object_set_new(o, "dropped", json_integer((json_int_t)ndrops));
	json_object_set_new(o, "rx_truncated", json_integer((json_int_t)rx_trunc));
	json_object_set_new(o, "drops", drops);
	json_object_set_new(o, "busy_cycles", json_integer((json_int_t)s->busy_cycles));
	json_object_set_new(o, "idle_cycles", json_integer((json_int_t)s->idle_cycles));
	json_object_set_new(o, "busy_pct",
			    json_real(cyc ? 100.0 * (double)s->busy_cycles / (double)cyc : 0));
	return o;
}

json_t *pboxd_stats_json(const struct pboxd_dp *dp, const struct pboxd_sessions *s)
{
	json_t *cores = json_array(), *o;
	struct pbox_core_stats tot;
	struct pboxd_dp_lifetime life;
	uint64_t tot_txd = 0, tot_trunc = 0;

	memset(&tot, 0, sizeof(tot));
	for (uint32_t k = 0; k < dp->ncores; k++) {
		struct pbox_core_stats cs;
		uint64_t txd, trunc;
		json_t *c;

		snap(&dp->cores[k].stats, &cs);
		pboxd_dp_transport_stats(dp, k, &txd, &trunc);
		add(&tot, &cs);
		tot_txd += txd;
		tot_trunc += trunc;
		c = core_json(&cs, txd, trunc);
		json_object_set_new(c, "core", json_integer(k));
		json_object_set_new(c, "cpu", json_integer(dp->cores[k].cpu));
		json_array_append_new(cores, c);
	}
	pboxd_dp_lifetime_stats(dp, &life);
	o = json_pack("{s:b, s:o, s:o, s:o, s:{s:I, s:I, s:I}}", "ok", 1, "cores", cores, "totals",
		      core_json(&tot, tot_txd, tot_trunc), "jobs", pboxd_sessions_status(s),
		      "lifetime", "tables_freed", (json_int_t)life.tables_freed, "states_freed",
		      (json_int_t)life.states_freed, "publish_nomem",
		      (json_int_t)life.publish_nomem);
	return o;
}

void pboxd_stats_print(FILE *f, const struct pboxd_dp *dp)
{
	struct pbox_core_stats tot;
	struct pboxd_dp_lifetime life;

	memset(&tot, 0, sizeof(tot));
	fprintf(f, "%-5s %12s %14s %12s %14s %10s %10s %8s %8s %8s %6s\n", "core", "rx_pkts",
		"rx_bytes", "tx_pkts", "tx_bytes", "agg_frags", "iters", "dups", "retx_rx",
		"dropped", "busy%");
	for (uint32_t k = 0; k <= dp->ncores; k++) {
		struct pbox_core_stats cs;
		uint64_t ndrops = 0, cyc;
		char name[16];

		if (k < dp->ncores) {
			snap(&dp->cores[k].stats, &cs);
			add(&tot, &cs);
			snprintf(name, sizeof(name), "%u", k);
		} else {
			cs = tot;
			snprintf(name, sizeof(name), "all");
		}
		for (int r = 1; r < PBOX_DROP_COUNT; r++) {
			ndrops += cs.drops[r];
		}
		cyc = cs.busy_cycles + cs.idle_cycles;
		fprintf(f,
			"%-5s %12" PRIu64 " %14" PRIu64 " %12" PRIu64 " %14" PRIu64 " %10" PRIu64
			" %10" PRIu64 " %8" PRIu64 " %8" PRIu64 " %8" PRIu64 " %6.1f\n",
			name, cs.rx_pkts, cs.rx_bytes, cs.tx_pkts, cs.tx_bytes, cs.agg_frags,
			cs.iterations, cs.dups, cs.rx_retransmits, ndrops,
			cyc ? 100.0 * (double)cs.busy_cycles / (double)cyc : 0.0);
		if (k == dp->ncores && ndrops != 0) {
			fprintf(f, "drops:");
			for (int r = 1; r < PBOX_DROP_COUNT; r++) {
				if (cs.drops[r] != 0) {
					fprintf(f, " %s=%" PRIu64, pbox_drop_reason_name(r),
						cs.drops[r]);
				}
			}
			fprintf(f, "\n");
		}
	}
	pboxd_dp_lifetime_stats(dp, &life);
	fprintf(f,
		"lifetime: tables_freed=%" PRIu64 " states_freed=%" PRIu64 " publish_nomem=%" PRIu64
		"\n",
		life.tables_freed, life.states_freed, life.publish_nomem);
	fflush(f);
}
