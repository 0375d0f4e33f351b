/* SPDX-License-Identifier: BSD-3-Clause */
/* pbox-ctrld's state file: runtime jobs, written atomically, loaded strictly (state.h). */
#include "state.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/jobspec.h"
#include "ctrld.h"

/* The largest state file read (2^20-key jobs are ~30 MB of JSON each; 4096 jobs). */
#define STATE_MAX_BYTES (1ull << 32)

static bool only_members(const json_t *o, const char *const *allowed, const char **bad)
{
	const char *k;
	json_t *v;

	json_object_foreach((json_t *)o, k, v)
	{
		bool ok = false;

		for (const char *const *a = allowed; *a != NULL; a++) {
			ok |= strcmp(k, *a) == 0;
		}
		if (!ok) {
			*bad = k;
			return false;
		}
	}
	return true;
}

static int check_entry(const json_t *e, size_t i, char *msg, size_t len)
{
	static const char *const members[] = { "job",   "plan",       "placement",
					       "pboxd", "assignment", NULL };
	const json_t *pb = json_object_get(e, "pboxd"), *pl = json_object_get(e, "placement");
	const char *bad = NULL;
	struct pbox_jobmsg m;
	char why[768];
	json_t *req;
	int rc;

	if (!json_is_object(e)) {
		snprintf(msg, len, "jobs[%zu]: not an object", i);
		return -EINVAL;
	}
	if (!only_members(e, members, &bad)) {
		snprintf(msg, len,
			 "jobs[%zu].%.64s: unknown member (job, plan, placement, pboxd, "
			 "assignment)",
			 i, bad);
		return -EINVAL;
	}
	if (pb != NULL &&
	    (!json_is_string(pb) || json_string_length(pb) == 0 || json_string_length(pb) >= 64)) {
		snprintf(msg, len, "jobs[%zu].pboxd: not a pboxd name (a string of 1..63 bytes)",
			 i);
		return -EINVAL;
	}
	if (pl != NULL && !json_is_array(pl)) {
		snprintf(msg, len, "jobs[%zu].placement: not a list", i);
		return -EINVAL;
	}
	/* The job, plan and assignment are checked as a job_create request carrying them
	 * would be: the same decoder, then pboxd's job validation. */
	req = json_pack("{s:s, s:O}", "op", "job_create", "job",
			json_object_get(e, "job") ?: json_null());
	if (req == NULL) {
		snprintf(msg, len, "jobs[%zu]: out of memory", i);
		return -ENOMEM;
	}
	if (json_object_get(e, "plan") != NULL) {
		json_object_set(req, "plan", json_object_get(e, "plan"));
	}
	if (json_object_get(e, "assignment") != NULL) {
		json_object_set(req, "assignment", json_object_get(e, "assignment"));
	}
	rc = pbox_jobmsg_decode(req, &m, why, sizeof(why));
	if (rc == 0 && ctrld_job_validate(m.job, why, sizeof(why)) != 0) {
		rc = -EINVAL;
	}
	json_decref(req);
	if (rc != 0) {
		snprintf(msg, len, "jobs[%zu]: %s", i, why);
		return -EINVAL;
	}
	return 0;
}

/* removals: [{"id": N, "pboxd": NAME}, ...] */
static int check_removals(const json_t *rms, char *msg, size_t len)
{
	static const char *const members[] = { "id", "pboxd", NULL };
	const char *bad = NULL;
	const json_t *e;
	size_t i;

	if (!json_is_array(rms)) {
		snprintf(msg, len, "removals: not a list");
		return -EINVAL;
	}
	json_array_foreach(rms, i, e)
	{
		const json_t *id = json_object_get(e, "id"), *pb = json_object_get(e, "pboxd");

		if (!json_is_object(e) || !only_members(e, members, &bad) || !json_is_integer(id) ||
		    json_integer_value(id) < 0 || json_integer_value(id) > (json_int_t)UINT32_MAX ||
		    !json_is_string(pb) || json_string_length(pb) == 0 ||
		    json_string_length(pb) >= 64) {
			snprintf(msg, len,
				 "removals[%zu]: not {\"id\": 0..4294967295, \"pboxd\": a name}",
				 i);
			return -EINVAL;
		}
	}
	return 0;
}

int ctrld_state_load(const char *path, json_t **jobs, json_t **removals, char *err, size_t errlen)
{
	static const char *const members[] = { "format", "version", "jobs", "removals", NULL };
	json_error_t jerr;
	json_t *root, *arr, *rms, *e;
	const char *bad = NULL, *fmt;
	char msg[900];
	struct stat st;
	size_t i;
	int rc = -EINVAL;

	*jobs = *removals = NULL;
	if (stat(path, &st) != 0) {
		if (errno == ENOENT) {
			*jobs = json_array();
			*removals = json_array();
			return *jobs != NULL && *removals != NULL ? -ENOENT : -ENOMEM;
		}
		rc = -errno;
		snprintf(err, errlen, "state file %s: %s", path, strerror(errno));
		return rc;
	}
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > STATE_MAX_BYTES) {
		snprintf(err, errlen, "state file %s: not a regular file of at most %llu bytes",
			 path, STATE_MAX_BYTES);
		return -EINVAL;
	}
	root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
	if (root == NULL) {
		snprintf(err, errlen,
			 "state file %s: line %d column %d: %s (not loaded: fix or "
			 "remove the file; its runtime jobs would be lost)",
			 path, jerr.line, jerr.column, jerr.text);
		return -EINVAL;
	}
	fmt = json_string_value(json_object_get(root, "format"));
	arr = json_object_get(root, "jobs");
	rms = json_object_get(root, "removals");
	if (!json_is_object(root)) {
		snprintf(msg, sizeof(msg), "not a JSON object");
	} else if (fmt == NULL || strcmp(fmt, CTRLD_STATE_FORMAT) != 0) {
		snprintf(msg, sizeof(msg), "format: not \"%s\"", CTRLD_STATE_FORMAT);
	} else if (!json_is_integer(json_object_get(root, "version")) ||
		   json_integer_value(json_object_get(root, "version")) != CTRLD_STATE_VERSION) {
		snprintf(msg, sizeof(msg),
			 "version: not %d (the only version this pbox-ctrld reads)",
			 CTRLD_STATE_VERSION);
	} else if (!only_members(root, members, &bad)) {
		snprintf(msg, sizeof(msg),
			 "%.64s: unknown member (format, version, jobs, removals)", bad);
	} else if (!json_is_array(arr)) {
		snprintf(msg, sizeof(msg), "jobs: not a list");
	} else if (rms != NULL && check_removals(rms, msg, sizeof(msg)) != 0) {
		rc = -EINVAL;
	} else {
		rc = 0;
		json_array_foreach(arr, i, e)
		{
			uint32_t id = 0;

			rc = check_entry(e, i, msg, sizeof(msg));
			if (rc != 0) {
				break;
			}
			(void)pbox_jobspec_id(json_object_get(e, "job"), &id);
			for (size_t k = 0; k < i; k++) {
				uint32_t other = 0;

				(void)pbox_jobspec_id(
					json_object_get(json_array_get(arr, k), "job"), &other);
				if (other == id) {
					snprintf(msg, sizeof(msg),
						 "jobs[%zu]: job %u is also jobs[%zu]", i, id, k);
					rc = -EINVAL;
					break;
				}
			}
			if (rc != 0) {
				break;
			}
		}
	}
	if (rc != 0) {
		snprintf(err, errlen,
			 "state file %s: %s (not loaded: fix or remove the file; its runtime "
			 "jobs would be lost)",
			 path, msg);
		json_decref(root);
		return rc;
	}
	*jobs = json_incref(arr);
	*removals = rms != NULL ? json_incref(rms) : json_array();
	json_decref(root);
	return 0;
}

static int write_all(int fd, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(fd, p, n);

		if (w < 0) {
			if (errno == EINTR) {
				continue;
			}
			return -errno;
		}
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

int ctrld_state_save(const char *path, const json_t *jobs, const json_t *removals, char *err,
		     size_t errlen)
{
	json_t *root = json_pack("{s:s, s:i, s:O, s:O}", "format", CTRLD_STATE_FORMAT, "version",
				 CTRLD_STATE_VERSION, "jobs", (json_t *)jobs, "removals",
				 (json_t *)removals);
	char tmp[600], dir[600], *text;
	const char *step = "write";
	bool renamed = false;
	int fd = -1, rc = 0;

	if (root == NULL) {
		snprintf(err, errlen, "state file %s: out of memory", path);
		return -ENOMEM;
	}
	text = json_dumps(root, JSON_COMPACT);
	json_decref(root);
	if (text == NULL) {
		snprintf(err, errlen, "state file %s: out of memory", path);
		return -ENOMEM;
	}
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0) {
		rc = -errno;
		step = "create";
		goto out;
	}
	/* Tokens are in it: 0600 even when an older temporary file had other modes. */
	if (fchmod(fd, 0600) != 0) {
		rc = -errno;
		step = "chmod 0600";
		goto out;
	}
	if ((rc = write_all(fd, text, strlen(text))) != 0 || (rc = write_all(fd, "\n", 1)) != 0) {
		goto out;
	}
	if (fsync(fd) != 0) {
		rc = -errno;
		step = "fsync";
		goto out;
	}
	if (close(fd) != 0) {
		fd = -1;
		rc = -errno;
		step = "close";
		goto out;
	}
	fd = -1;
	if (rename(tmp, path) != 0) {
		rc = -errno;
		step = "rename";
		goto out;
	}
	renamed = true;
	snprintf(dir, sizeof(dir), "%s", path);
	fd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || fsync(fd) != 0) {
		rc = -errno;
		step = "fsync";
	}
out:
	if (fd >= 0) {
		close(fd);
	}
	if (rc != 0) {
		snprintf(err, errlen, "state file %s: %s (of %s): %s", path, step,
			 renamed ? "the directory" : tmp, strerror(-rc));
		if (!renamed) {
			unlink(tmp);
		}
	}
	free(text);
	return rc;
}
