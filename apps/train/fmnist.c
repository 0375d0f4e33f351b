/* SPDX-License-Identifier: BSD-3-Clause */
/* Fashion-MNIST IDX files through zlib, validated before use (see fmnist.h). */
#include "fmnist.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zlib.h>

/* IDX magic: two zero bytes, the element type (0x08: unsigned byte), the dimension count. */
#define IDX_MAGIC_U8(ndim) (0x00000800u | (ndim))
/* Bounds that no real split exceeds; they keep sizes far from overflow. */
#define IDX_MAX_SAMPLES 10000000u
#define IDX_MAX_SIDE    1024u

struct idx_file {
	char path[512];
	gzFile gz;
};

static const char *const g_names[2][2] = {
	{ "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte" },
	{ "train-images-idx3-ubyte", "train-labels-idx1-ubyte" },
};

/* Open dir/name.gz, or dir/name if there is no compressed one (zlib reads both). */
static int idx_open(struct idx_file *f, const char *dir, const char *name, char *err, size_t errlen)
{
	snprintf(f->path, sizeof(f->path), "%s/%s.gz", dir, name);
	if (access(f->path, F_OK) != 0) {
		snprintf(f->path, sizeof(f->path), "%s/%s", dir, name);
		if (access(f->path, F_OK) != 0) {
			snprintf(
				err, errlen,
				"%s/%s.gz: no such file (nor %s/%s); install the Debian package "
				"dataset-fashion-mnist or pass the directory holding the IDX files",
				dir, name, dir, name);
			return -ENOENT;
		}
	}
	f->gz = gzopen(f->path, "rb");
	if (f->gz == NULL) {
		int e = errno ? errno : ENOMEM;

		snprintf(err, errlen, "%s: cannot open: %s", f->path, strerror(e));
		return -e;
	}
	gzbuffer(f->gz, 1u << 17);
	return 0;
}

static void idx_close(struct idx_file *f)
{
	if (f->gz != NULL) {
		gzclose(f->gz);
		f->gz = NULL;
	}
}

/* zlib's message without the "path: " prefix gzerror() puts in front of it. */
static const char *gz_msg(struct idx_file *f)
{
	int zerr;
	const char *msg = gzerror(f->gz, &zerr);
	size_t n = strlen(f->path);

	if (zerr == Z_ERRNO) {
		return strerror(errno);
	}
	if (strncmp(msg, f->path, n) == 0 && msg[n] == ':' && msg[n + 1] == ' ') {
		msg += n + 2;
	}
	return msg;
}

/* Read exactly len bytes. what names the part being read, for the message. */
static int idx_read(struct idx_file *f, void *buf, size_t len, const char *what, char *err,
		    size_t errlen)
{
	size_t got = 0;

	while (got < len) {
		size_t want = len - got;
		int n;

		if (want > (1u << 30)) {
			want = 1u << 30;
		}
		n = gzread(f->gz, (char *)buf + got, (unsigned)want);
		if (n < 0) {
			snprintf(err, errlen, "%s: reading the %s: gzip: %s", f->path, what,
				 gz_msg(f));
			return -EIO;
		}
		if (n == 0) {
			int zerr;

			gzerror(f->gz, &zerr);
			if (zerr != Z_OK && zerr != Z_STREAM_END) {
				snprintf(err, errlen, "%s: reading the %s: gzip: %s", f->path, what,
					 gz_msg(f));
				return -EIO;
			}
			snprintf(err, errlen,
				 "%s: truncated: the %s needs %zu bytes, the file ends after %zu",
				 f->path, what, len, got);
			return -EINVAL;
		}
		got += (size_t)n;
	}
	return 0;
}

static uint32_t be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Read and check the header: magic for ndim unsigned-byte dimensions, then the dims. */
static int idx_header(struct idx_file *f, unsigned ndim, uint32_t *dims, char *err, size_t errlen)
{
	uint8_t h[4 * 4];
	uint32_t magic;
	int rc;

	rc = idx_read(f, h, 4 * (1 + ndim), "IDX header", err, errlen);
	if (rc < 0) {
		return rc;
	}
	magic = be32(h);
	if (magic != IDX_MAGIC_U8(ndim)) {
		snprintf(err, errlen,
			 "%s: not an IDX file of unsigned bytes with %u dimension%s: magic "
			 "0x%08x, expected 0x%08x",
			 f->path, ndim, ndim > 1 ? "s" : "", magic, IDX_MAGIC_U8(ndim));
		return -EINVAL;
	}
	for (unsigned i = 0; i < ndim; i++) {
		dims[i] = be32(h + 4 * (1 + i));
	}
	if (dims[0] == 0 || dims[0] > IDX_MAX_SAMPLES) {
		snprintf(err, errlen, "%s: %u samples: expected between 1 and %u", f->path, dims[0],
			 IDX_MAX_SAMPLES);
		return -EINVAL;
	}
	for (unsigned i = 1; i < ndim; i++) {
		if (dims[i] == 0 || dims[i] > IDX_MAX_SIDE) {
			snprintf(err, errlen, "%s: dimension %u is %u: expected between 1 and %u",
				 f->path, i, dims[i], IDX_MAX_SIDE);
			return -EINVAL;
		}
	}
	return 0;
}

/* After the payload the stream must end: extra bytes mean the header lied about sizes. */
static int idx_expect_end(struct idx_file *f, char *err, size_t errlen)
{
	uint8_t extra;
	int n = gzread(f->gz, &extra, 1);

	if (n < 0) {
		snprintf(err, errlen, "%s: after the data: gzip: %s", f->path, gz_msg(f));
		return -EIO;
	}
	if (n > 0) {
		snprintf(err, errlen, "%s: trailing bytes after the data the header announces",
			 f->path);
		return -EINVAL;
	}
	return 0;
}

static int load_images(const char *dir, const char *name, struct pbox_fmnist_set *set, char *err,
		       size_t errlen)
{
	struct idx_file f = { .gz = NULL };
	uint32_t dims[3];
	size_t len;
	int rc;

	rc = idx_open(&f, dir, name, err, errlen);
	if (rc < 0) {
		return rc;
	}
	rc = idx_header(&f, 3, dims, err, errlen);
	if (rc < 0) {
		goto out;
	}
	len = (size_t)dims[0] * dims[1] * dims[2];
	set->images = malloc(len);
	if (set->images == NULL) {
		snprintf(err, errlen, "%s: no memory for %zu bytes of pixels", f.path, len);
		rc = -ENOMEM;
		goto out;
	}
	rc = idx_read(&f, set->images, len, "pixel data", err, errlen);
	if (rc == 0) {
		rc = idx_expect_end(&f, err, errlen);
	}
	if (rc < 0) {
		free(set->images);
		set->images = NULL;
		goto out;
	}
	set->n = dims[0];
	set->rows = dims[1];
	set->cols = dims[2];
out:
	idx_close(&f);
	return rc;
}

static int load_labels(const char *dir, const char *name, struct pbox_fmnist_set *set, char *err,
		       size_t errlen)
{
	struct idx_file f = { .gz = NULL };
	uint32_t n;
	int rc;

	rc = idx_open(&f, dir, name, err, errlen);
	if (rc < 0) {
		return rc;
	}
	rc = idx_header(&f, 1, &n, err, errlen);
	if (rc < 0) {
		goto out;
	}
	if (n != set->n) {
		snprintf(err, errlen, "%s: %u labels, but the image file has %u images", f.path, n,
			 set->n);
		rc = -EINVAL;
		goto out;
	}
	set->labels = malloc(n);
	if (set->labels == NULL) {
		snprintf(err, errlen, "%s: no memory for %u labels", f.path, n);
		rc = -ENOMEM;
		goto out;
	}
	rc = idx_read(&f, set->labels, n, "labels", err, errlen);
	if (rc == 0) {
		rc = idx_expect_end(&f, err, errlen);
	}
	for (uint32_t i = 0; rc == 0 && i < n; i++) {
		if (set->labels[i] >= PBOX_FMNIST_CLASSES) {
			snprintf(err, errlen, "%s: label %u of sample %u is out of range 0..%u",
				 f.path, set->labels[i], i, PBOX_FMNIST_CLASSES - 1);
			rc = -EINVAL;
		}
	}
	if (rc < 0) {
		free(set->labels);
		set->labels = NULL;
	}
out:
	idx_close(&f);
	return rc;
}

int pbox_fmnist_load(const char *dir, bool train, struct pbox_fmnist_set *set, char *err,
		     size_t errlen)
{
	const char *const *names = g_names[train ? 1 : 0];
	int rc;

	memset(set, 0, sizeof(*set));
	rc = load_images(dir, names[0], set, err, errlen);
	if (rc < 0) {
		return rc;
	}
	rc = load_labels(dir, names[1], set, err, errlen);
	if (rc < 0) {
		pbox_fmnist_free(set);
		return rc;
	}
	return 0;
}

void pbox_fmnist_gather(const struct pbox_fmnist_set *set, const uint32_t *idx, uint32_t first,
			uint32_t n, float *x, uint8_t *y)
{
	/* Fashion-MNIST training pixels (scaled to [0, 1]) have mean 0.2860 and standard
	 * deviation 0.3530; centred inputs let plain SGD use a larger step. */
	const float scale = 1.0f / 255.0f, mean = 0.2860f, inv_std = 1.0f / 0.3530f;
	size_t dim = (size_t)set->rows * set->cols;

	for (uint32_t i = 0; i < n; i++) {
		uint32_t s = idx ? idx[i] : first + i;
		const uint8_t *px = set->images + (size_t)s * dim;
		float *xi = x + (size_t)i * dim;

		for (size_t j = 0; j < dim; j++) {
			xi[j] = ((float)px[j] * scale - mean) * inv_std;
		}
		y[i] = set->labels[s];
	}
}

void pbox_fmnist_free(struct pbox_fmnist_set *set)
{
	free(set->images);
	free(set->labels);
	memset(set, 0, sizeof(*set));
}
