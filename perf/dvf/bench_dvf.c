/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * DVF benchmark (see perf/dvf/README.md): on real gradients, for each threshold delta and
 * each codec, the throughput of filter + encode + compress and of decode + add into an
 * accumulator, in GB/s of dense input on one core, and the compression ratio (dense bytes
 * / bytes on the wire, headers included); beside it snappy alone on the same unfiltered
 * blocks, and the filter + compaction kernels per ISA.
 *
 * Inputs: the demo's model (the MLP 784-256-128-10 of apps/train on Fashion-MNIST:
 * the summed gradient of one batch of 64 after --mlp-steps SGD steps, computed here), and
 * any raw float32 file (--input, e.g. the ResNet-50 gradient of resnet50_grad.py).
 * Thresholds: the deltas at which the first filter (zero residual) keeps the given
 * fractions of |U| (--sparsity), so the rows compare like with like across inputs.
 *
 * Usage: pbox-bench-dvf [--input FILE.f32 [--name NAME]] [--block N] [--seconds S]
 *                       [--sparsity 0.5,0.8,...] [--codecs none,lz4,...] [--no-mlp]
 *                       [--repeat R]   (R <= 16: each cell is the median of R runs)
 *                       [--json FILE]  (also one JSON object per row, for perf/report)
 * A codec SPEC/plain (e.g. lz4/plain) sends PF's plain dense array for the blocks that are
 * not sparse, instead of the bitmap form. Times are the thread's CPU time (the machine is
 * shared: wall time would count other processes).
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dvf/dvf.h"
#include "train/fmnist.h"
#include "train/mlp.h"

#define MAX_LIST 16

struct opts {
	const char *input, *name;
	uint32_t block;
	double seconds;
	double sparsity[MAX_LIST];
	unsigned nsparsity;
	const char *codecs[MAX_LIST];
	unsigned ncodecs;
	unsigned mlp_steps;
	unsigned repeat;
	bool mlp;
	FILE *json; /* --json FILE: one JSON object per table row (perf/report reads it) */
};

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *xalloc(size_t len)
{
	void *p = NULL;

	if (posix_memalign(&p, 64, len ? len : 64) != 0) {
		fprintf(stderr, "bench_dvf: out of memory (%zu bytes)\n", len);
		exit(1);
	}
	return p;
}

/* ---- inputs --------------------------------------------------------------------------- */

static float *load_file(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	long len;
	float *u;

	if (f == NULL || fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) <= 0 ||
	    fseek(f, 0, SEEK_SET) != 0) {
		fprintf(stderr, "bench_dvf: %s: %s\n", path, strerror(errno));
		exit(1);
	}
	*n = (size_t)len / 4;
	u = xalloc(*n * 4);
	if (fread(u, 4, *n, f) != *n) {
		fprintf(stderr, "bench_dvf: %s: short read\n", path);
		exit(1);
	}
	fclose(f);
	return u;
}

/* The demo's model: the summed gradient of one batch of 64 after `steps` SGD steps
 * (lr 0.05 on the batch mean) from the seed-1 initialisation. */
static float *mlp_gradient(unsigned steps, size_t *n)
{
	static const unsigned dims[] = { 784, 256, 128, 10 };
	const unsigned batch = 64;
	struct pbox_fmnist_set set;
	struct pbox_mlp_stats st = { 0 };
	struct pbox_mlp *m;
	const struct pbox_mlp_layout *lay;
	char err[256];
	float *w, *g, *x;
	uint8_t y[64];

	if (pbox_fmnist_load(PBOX_FMNIST_DEFAULT_DIR, true, &set, err, sizeof(err)) != 0) {
		fprintf(stderr, "bench_dvf: Fashion-MNIST: %s\n", err);
		exit(1);
	}
	pbox_mlp_blas_single_thread();
	m = pbox_mlp_create(dims, 3, batch);
	lay = pbox_mlp_layout(m);
	w = pbox_mlp_alloc_params(m);
	g = pbox_mlp_alloc_params(m);
	x = xalloc((size_t)batch * 784 * sizeof(float));
	pbox_mlp_init_params(m, w, 1);
	for (unsigned s = 0; s <= steps; s++) {
		pbox_fmnist_gather(&set, NULL, (s * batch) % (set.n - batch), batch, x, y);
		pbox_mlp_grad(m, w, x, y, batch, g, &st);
		if (s < steps) {
			for (size_t i = 0; i < lay->nparams; i++) {
				w[i] -= 0.05f / (float)batch * g[i];
			}
		}
	}
	*n = lay->nparams;
	free(w);
	free(x);
	pbox_mlp_destroy(m);
	pbox_fmnist_free(&set);
	return g;
}

/* ---- measurements ------------------------------------------------------------------- */

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;

	return x < y ? -1 : x > y;
}

/* The delta at which a fraction s of |u| is <= delta (from a sample of up to 2^20). */
static float delta_for(const float *u, size_t n, double s)
{
	size_t m = n < (1u << 20) ? n : (1u << 20), k;
	float *a = xalloc(m * sizeof(float)), d;

	for (size_t i = 0; i < m; i++) {
		a[i] = fabsf(u[(size_t)((double)i * (double)n / (double)m)]);
	}
	qsort(a, m, sizeof(float), cmp_float);
	k = (size_t)(s * (double)m);
	d = a[k >= m ? m - 1 : k];
	free(a);
	return d;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

struct input {
	const char *name;
	const float *u;
	size_t n;
	uint32_t block, nblocks;
};

struct result {
	double enc_gbs, dec_gbs, ratio, sparsity, sparse_blocks, bitmap_blocks;
};

static size_t blk_len(const struct input *in, uint32_t b)
{
	size_t off = (size_t)b * in->block;

	return in->n - off < in->block ? in->n - off : in->block;
}

static void run_dvf(const struct input *in, const struct opts *o, const struct pbox_dvf_kernels *k,
		    struct pbox_dvf_scratch *s, const struct pbox_dvf_enc_cfg *cfg, float thr,
		    uint8_t *wire, uint32_t *wlen, float *resid, float *acc, struct result *r)
{
	const size_t slot = pbox_dvf_block_bound(in->block);
	const double bytes = (double)in->n * 4;
	size_t wire_total = 0, sent = 0, sparse = 0, bitmap = 0;
	double t, el = 0;
	unsigned passes = 0;

	do {
		memset(resid, 0, in->n * 4);
		wire_total = sent = sparse = bitmap = 0;
		t = now();
		for (uint32_t b = 0; b < in->nblocks; b++) {
			size_t off = (size_t)b * in->block;
			struct pbox_dvf_enc_info info;

			if (pbox_dvf_encode(s, cfg, k, resid + off, in->u + off,
					    (uint32_t)blk_len(in, b), thr, wire + b * slot, slot,
					    &info) != 0) {
				fprintf(stderr, "bench_dvf: encode failed\n");
				exit(1);
			}
			wlen[b] = info.wire_len;
			wire_total += info.wire_len;
			sent += info.sent;
			sparse += info.encoding == PBOX_DVF_ENC_SPARSE_VARINT ||
				  info.encoding == PBOX_DVF_ENC_SPARSE_BITPACK;
			bitmap += info.encoding == PBOX_DVF_ENC_BITMAP;
		}
		el += now() - t;
		passes++;
	} while (el < o->seconds);
	r->enc_gbs = bytes * passes / el / 1e9;
	r->ratio = bytes / (double)wire_total;
	r->sparsity = 1.0 - (double)sent / (double)in->n;
	r->sparse_blocks = (double)sparse / in->nblocks;
	r->bitmap_blocks = (double)bitmap / in->nblocks;
	el = 0;
	passes = 0;
	do {
		memset(acc, 0, in->n * 4);
		t = now();
		for (uint32_t b = 0; b < in->nblocks; b++) {
			enum pbox_dvf_reject why;

			if (pbox_dvf_block_add(s, k, wire + b * slot, wlen[b],
					       acc + (size_t)b * in->block,
					       (uint32_t)blk_len(in, b), &why) != 0) {
				fprintf(stderr, "bench_dvf: decode: %s\n",
					pbox_dvf_reject_name(why));
				exit(1);
			}
		}
		el += now() - t;
		passes++;
	} while (el < o->seconds);
	r->dec_gbs = bytes * passes / el / 1e9;
}

/* snappy alone on the same blocks, unfiltered: compress and decompress GB/s, ratio. */
static void run_snappy(const struct input *in, const struct opts *o, struct pbox_dvf_scratch *s,
		       uint8_t *wire, uint32_t *wlen, float *acc, struct result *r)
{
	const struct pbox_dvf_codec_ops *sn = pbox_dvf_codec_find("snappy");
	const double bytes = (double)in->n * 4;
	size_t total = 0;
	double t, el = 0;
	unsigned passes = 0;

	do {
		total = 0;
		t = now();
		for (uint32_t b = 0; b < in->nblocks; b++) {
			size_t clen;
			size_t cap = sn->bound(in->block * 4);

			if (sn->compress(pbox_dvf_scratch_codec(s), in->u + (size_t)b * in->block,
					 blk_len(in, b) * 4, wire + b * cap, cap, 0, &clen) != 0) {
				exit(1);
			}
			wlen[b] = (uint32_t)clen;
			total += clen;
		}
		el += now() - t;
		passes++;
	} while (el < o->seconds);
	r->enc_gbs = bytes * passes / el / 1e9;
	r->ratio = bytes / (double)total;
	el = 0;
	passes = 0;
	do {
		t = now();
		for (uint32_t b = 0; b < in->nblocks; b++) {
			size_t cap = sn->bound(in->block * 4);

			if (sn->decompress(pbox_dvf_scratch_codec(s), wire + b * cap, wlen[b],
					   acc + (size_t)b * in->block, blk_len(in, b) * 4) != 0) {
				exit(1);
			}
		}
		el += now() - t;
		passes++;
	} while (el < o->seconds);
	r->dec_gbs = bytes * passes / el / 1e9;
}

/* Filter + compaction alone per ISA (GB/s of dense input), at threshold thr. */
static double run_filter(const struct input *in, const struct opts *o,
			 const struct pbox_dvf_kernels *k, float thr, float *resid, float *out,
			 float *vals, uint32_t *idx, uint8_t *bitmap)
{
	double t, el = 0;
	unsigned passes = 0;

	do {
		memset(resid, 0, in->n * 4);
		t = now();
		for (uint32_t b = 0; b < in->nblocks; b++) {
			size_t off = (size_t)b * in->block, len = blk_len(in, b);

			k->filter(resid + off, in->u + off, len, thr, out);
			k->compact(out, len, vals, idx, bitmap);
		}
		el += now() - t;
		passes++;
	} while (el < o->seconds);
	return (double)in->n * 4 * passes / el / 1e9;
}

static void bench(const struct input *in, const struct opts *o)
{
	const struct pbox_dvf_kernels *k = pbox_dvf_kernels_get(), *isas[3];
	unsigned nisas = pbox_dvf_kernels_supported(isas, 3);
	struct pbox_dvf_scratch *s = pbox_dvf_scratch_new(in->block);
	const struct pbox_dvf_codec_ops *sn = pbox_dvf_codec_find("snappy");
	size_t slot = pbox_dvf_block_bound(in->block);
	size_t wire_len = (size_t)in->nblocks *
			  (slot > sn->bound(in->block * 4) ? slot : sn->bound(in->block * 4));
	uint8_t *wire = xalloc(wire_len);
	uint32_t *wlen = xalloc(in->nblocks * sizeof(uint32_t));
	float *resid = xalloc(in->n * 4), *acc = xalloc(in->n * 4);
	float *out = xalloc(in->block * 4), *vals = xalloc(in->block * 4);
	uint32_t *idx = xalloc(in->block * 4);
	uint8_t *bitmap = xalloc(in->block / 8 + 1);
	struct result snap;

	if (s == NULL) {
		exit(1);
	}
	run_snappy(in, o, s, wire, wlen, acc, &snap);
	printf("\n### %s: %zu floats (%.1f MB), blocks of %u floats (%u KB), kernels %s\n\n",
	       in->name, in->n, in->n * 4 / 1e6, in->block, in->block * 4 / 1024, k->isa);
	printf("snappy alone (unfiltered blocks): compress %.2f GB/s, decompress %.2f GB/s, "
	       "ratio %.2f\n\n",
	       snap.enc_gbs, snap.dec_gbs, snap.ratio);
	printf("| delta | sparsity | blocks sparse / bitmap | codec | "
	       "filter+encode+compress GB/s | x snappy alone | ratio | decode+add GB/s |\n");
	printf("|---|---|---|---|---|---|---|---|\n");
	for (unsigned d = 0; d < o->nsparsity; d++) {
		float thr = delta_for(in->u, in->n, o->sparsity[d]);

		for (unsigned c = 0; c < o->ncodecs; c++) {
			struct pbox_dvf_enc_cfg cfg;
			struct result r = { 0 };
			char spec[32];
			char *plain;

			/* SPEC/plain: PF's plain dense array instead of the bitmap form */
			snprintf(spec, sizeof(spec), "%s", o->codecs[c]);
			plain = strstr(spec, "/plain");
			if (plain != NULL) {
				*plain = '\0';
			}
			pbox_dvf_enc_cfg_default(&cfg);
			cfg.dense_bitmap = plain == NULL;
			if (pbox_dvf_codec_parse(spec, &cfg.codec, &cfg.level) != 0) {
				fprintf(stderr, "bench_dvf: unknown codec %s (%s)\n", o->codecs[c],
					pbox_dvf_codec_names());
				exit(2);
			}
			{
				/* the median of --repeat measurements of each throughput */
				double enc[MAX_LIST], dec[MAX_LIST];

				for (unsigned t = 0; t < o->repeat; t++) {
					run_dvf(in, o, k, s, &cfg, thr, wire, wlen, resid, acc, &r);
					enc[t] = r.enc_gbs;
					dec[t] = r.dec_gbs;
				}
				qsort(enc, o->repeat, sizeof(double), cmp_double);
				qsort(dec, o->repeat, sizeof(double), cmp_double);
				r.enc_gbs = enc[o->repeat / 2];
				r.dec_gbs = dec[o->repeat / 2];
			}
			printf("| %.3g | %.3f | %.0f%% / %.0f%% | %s | %.2f | %.1f | %.2f | %.2f "
			       "|\n",
			       thr, r.sparsity, 100 * r.sparse_blocks, 100 * r.bitmap_blocks,
			       o->codecs[c], r.enc_gbs, r.enc_gbs / snap.enc_gbs, r.ratio,
			       r.dec_gbs);
			fflush(stdout);
			if (o->json != NULL) {
				json_t *row = json_pack(
					"{s:s, s:I, s:i, s:f, s:f, s:f, s:f, s:s, s:f, s:f, s:f, "
					"s:f, s:f}",
					"input", in->name, "floats", (json_int_t)in->n, "block",
					(int)in->block, "delta", (double)thr, "sparsity",
					r.sparsity, "sparse_blocks", r.sparse_blocks,
					"bitmap_blocks", r.bitmap_blocks, "codec", o->codecs[c],
					"enc_gbs", r.enc_gbs, "dec_gbs", r.dec_gbs, "ratio",
					r.ratio, "snappy_enc_gbs", snap.enc_gbs, "snappy_ratio",
					snap.ratio);

				if (row == NULL || json_dumpf(row, o->json, JSON_COMPACT) != 0 ||
				    fputc('\n', o->json) == EOF || fflush(o->json) != 0) {
					fprintf(stderr, "bench_dvf: --json: cannot write a row\n");
					exit(1);
				}
				json_decref(row);
			}
		}
	}
	printf("\nfilter + compaction alone (GB/s), delta at sparsity %.2f:", o->sparsity[0]);
	for (unsigned i = 0; i < nisas; i++) {
		printf(" %s %.2f%s", isas[i]->isa,
		       run_filter(in, o, isas[i], delta_for(in->u, in->n, o->sparsity[0]), resid,
				  out, vals, idx, bitmap),
		       i + 1 < nisas ? "," : "\n");
	}
	free(wire);
	free(wlen);
	free(resid);
	free(acc);
	free(out);
	free(vals);
	free(idx);
	free(bitmap);
	pbox_dvf_scratch_free(s);
}

static unsigned split(char *arg, const char **out)
{
	unsigned n = 0;

	for (char *t = strtok(arg, ","); t != NULL && n < MAX_LIST; t = strtok(NULL, ",")) {
		out[n++] = t;
	}
	return n;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "input", required_argument, NULL, 'i' },
		{ "name", required_argument, NULL, 'n' },
		{ "block", required_argument, NULL, 'b' },
		{ "seconds", required_argument, NULL, 's' },
		{ "sparsity", required_argument, NULL, 'p' },
		{ "codecs", required_argument, NULL, 'c' },
		{ "mlp-steps", required_argument, NULL, 'm' },
		{ "no-mlp", no_argument, NULL, 'N' },
		{ "repeat", required_argument, NULL, 'r' },
		{ "json", required_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	static char def_codecs[] = "none/plain,lz4/plain,snappy/plain,none,lz4,zstd:1,zstd:2,"
				   "zstd:3,snappy,igzip:0,igzip:1";
	struct opts o = {
		.block = 8192,
		.seconds = 0.3,
		.sparsity = { 0.5, 0.8, 0.9, 0.99 },
		.nsparsity = 4,
		.mlp_steps = 50,
		.repeat = 1,
		.mlp = true,
		.name = NULL,
	};
	const char *sp[MAX_LIST];
	int c;

	o.ncodecs = split(def_codecs, o.codecs);
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case 'i':
			o.input = optarg;
			break;
		case 'n':
			o.name = optarg;
			break;
		case 'b':
			o.block = (uint32_t)strtoul(optarg, NULL, 10);
			break;
		case 's':
			o.seconds = strtod(optarg, NULL);
			break;
		case 'p':
			o.nsparsity = split(optarg, sp);
			for (unsigned i = 0; i < o.nsparsity; i++) {
				o.sparsity[i] = strtod(sp[i], NULL);
			}
			break;
		case 'c':
			o.ncodecs = split(optarg, o.codecs);
			break;
		case 'm':
			o.mlp_steps = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'N':
			o.mlp = false;
			break;
		case 'r':
			o.repeat = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'j':
			o.json = fopen(optarg, "w");
			if (o.json == NULL) {
				fprintf(stderr, "bench_dvf: --json %s: %s\n", optarg,
					strerror(errno));
				return 2;
			}
			break;
		default:
			fprintf(c == 'h' ? stdout : stderr,
				"usage: %s [--input FILE.f32 [--name NAME]] [--block N] "
				"[--seconds S] [--sparsity LIST] [--codecs LIST] "
				"[--mlp-steps N] [--no-mlp] [--repeat R] [--json FILE]\n",
				argv[0]);
			return c == 'h' ? 0 : 2;
		}
	}
	if (o.block == 0 || o.block > PBOX_DVF_MAX_BLOCK || o.nsparsity == 0 || o.ncodecs == 0 ||
	    o.repeat == 0 || o.repeat > MAX_LIST) {
		fprintf(stderr, "bench_dvf: bad --block, --sparsity or --codecs\n");
		return 2;
	}
	if (o.mlp) {
		struct input in = { .name = "MLP 784-256-128-10 (the demo's), Fashion-MNIST",
				    .block = o.block };
		float *u = mlp_gradient(o.mlp_steps, &in.n);

		in.u = u;
		in.nblocks = (uint32_t)((in.n + o.block - 1) / o.block);
		bench(&in, &o);
		free(u);
	}
	if (o.input != NULL) {
		struct input in = { .name = o.name ? o.name : o.input, .block = o.block };
		float *u = load_file(o.input, &in.n);

		in.u = u;
		in.nblocks = (uint32_t)((in.n + o.block - 1) / o.block);
		bench(&in, &o);
		free(u);
	}
	if (o.json != NULL && fclose(o.json) != 0) {
		fprintf(stderr, "bench_dvf: --json: %s\n", strerror(errno));
		return 1;
	}
	return 0;
}
