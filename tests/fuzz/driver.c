/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Replay driver: a main for the fuzz harnesses where libFuzzer is not linked (gcc builds,
 * the ASan build). Each argument is a corpus file or a directory of them; every file is
 * fed once to LLVMFuzzerTestOneInput, in name order, from a buffer of exactly its size
 * (so a sanitizer sees any read past the end). A harness invariant or a sanitizer report
 * aborts the run, which fails the meson test. An empty corpus is an error too: a replay
 * test that replays nothing would pass whatever the code does.
 *
 * Usage: replay_<name> FILE|DIR...
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int replay_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf;
	long len;

	if (f == NULL) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return -1;
	}
	if (fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
		fprintf(stderr, "replay: %s: cannot size the file\n", path);
		fclose(f);
		return -1;
	}
	/* malloc(0) may return NULL: keep one byte, but pass the exact length. */
	buf = malloc(len ? (size_t)len : 1);
	if (buf == NULL || fread(buf, 1, (size_t)len, f) != (size_t)len) {
		fprintf(stderr, "replay: %s: cannot read %ld bytes\n", path, len);
		free(buf);
		fclose(f);
		return -1;
	}
	fclose(f);
	LLVMFuzzerTestOneInput(buf, (size_t)len);
	free(buf);
	return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
	return strcmp((*a)->d_name, (*b)->d_name);
}

/* Replay path (a file, or every regular file of a directory); returns files replayed or
 * -1. */
static long replay(const char *path)
{
	struct dirent **ents;
	struct stat st;
	long done = 0;
	int n;

	if (stat(path, &st) != 0) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return -1;
	}
	if (!S_ISDIR(st.st_mode)) {
		return replay_file(path) == 0 ? 1 : -1;
	}
	n = scandir(path, &ents, NULL, by_name);
	if (n < 0) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return -1;
	}
	for (int i = 0; i < n; i++) {
		char full[4096];

		snprintf(full, sizeof(full), "%s/%s", path, ents[i]->d_name);
		if (ents[i]->d_name[0] != '.' && stat(full, &st) == 0 && S_ISREG(st.st_mode)) {
			if (replay_file(full) != 0) {
				done = -1;
			} else if (done >= 0) {
				done++;
			}
		}
		free(ents[i]);
	}
	free(ents);
	return done;
}

int main(int argc, char **argv)
{
	long total = 0;

	if (argc < 2) {
		fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
		return 2;
	}
	for (int i = 1; i < argc; i++) {
		long n = replay(argv[i]);

		if (n < 0) {
			return 1;
		}
		printf("%s: %ld input(s) replayed\n", argv[i], n);
		total += n;
	}
	if (total == 0) {
		fprintf(stderr, "replay: no input files: an empty corpus tests nothing\n");
		return 1;
	}
	return 0;
}
