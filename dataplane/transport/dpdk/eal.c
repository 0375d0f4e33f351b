/* SPDX-License-Identifier: BSD-3-Clause */
/* EAL start-up with the checks that turn DPDK's obscure failures into precise errors. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_lcore.h>

#include "common/log.h"
#include "dpdk.h"

static bool has_arg(int argc, char *const *argv, const char *opt)
{
	size_t l = strlen(opt);

	for (int i = 1; i < argc; i++) {
		if (strncmp(argv[i], opt, l) == 0 && (argv[i][l] == '\0' || argv[i][l] == '=')) {
			return true;
		}
	}
	return false;
}

bool pbox_dpdk_eal_has_cores(int argc, char *const *argv)
{
	for (int i = 1; i < argc; i++) {
		/* -l LIST, -lLIST, -c MASK, -cMASK, --lcores[=]... */
		if (strncmp(argv[i], "-l", 2) == 0 || strncmp(argv[i], "-c", 2) == 0 ||
		    strncmp(argv[i], "--lcores", 8) == 0) {
			return true;
		}
	}
	return false;
}

/* Append printf-style to buf at *off; false (buf unchanged past *off) if it does not fit. */
static bool __attribute__((format(printf, 4, 5)))
put(char *buf, size_t len, size_t *off, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf + *off, len - *off, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= len - *off) {
		return false;
	}
	*off += (size_t)n;
	return true;
}

/* The ids in set as "a-b,c,...", consecutive ids compressed into ranges. */
static bool put_set(char *buf, size_t len, size_t *off, const cpu_set_t *set)
{
	const char *sep = "";

	for (int lo = 0; lo < CPU_SETSIZE; lo++) {
		int hi = lo;

		if (!CPU_ISSET(lo, set)) {
			continue;
		}
		while (hi + 1 < CPU_SETSIZE && CPU_ISSET(hi + 1, set)) {
			hi++;
		}
		/* The EAL's group parser marks "no range open" with RTE_MAX_LCORE, so a range
		 * starting at that id would lose its start: write the id alone first. */
		if (lo == RTE_MAX_LCORE && hi > lo) {
			if (!put(buf, len, off, "%s%d", sep, lo)) {
				return false;
			}
			sep = ",";
			lo++;
		}
		if (!(hi > lo ? put(buf, len, off, "%s%d-%d", sep, lo, hi)
			      : put(buf, len, off, "%s%d", sep, lo))) {
			return false;
		}
		sep = ",";
		lo = hi;
	}
	return true;
}

int pbox_dpdk_lcores_arg(const cpu_set_t *allowed, const int *cpus, uint32_t ncores, char *buf,
			 size_t len)
{
	cpu_set_t any;
	size_t off = 0;
	bool ok;

	if (CPU_COUNT(allowed) == 0 || ncores >= CPU_SETSIZE) {
		return -EINVAL;
	}
	CPU_ZERO(&any);
	CPU_SET(0, &any);
	for (uint32_t k = 0; k < ncores; k++) {
		if (cpus[k] < 0) {
			CPU_SET(k + 1, &any);
		}
	}
	ok = put(buf, len, &off, "(") && put_set(buf, len, &off, &any) &&
	     put(buf, len, &off, ")@(") && put_set(buf, len, &off, allowed) &&
	     put(buf, len, &off, ")");
	for (uint32_t k = 0; ok && k < ncores; k++) {
		if (cpus[k] >= 0) {
			ok = put(buf, len, &off, ",%u@%d", k + 1, cpus[k]);
		}
	}
	return ok ? 0 : -E2BIG;
}

/* Free hugepages of every size, from sysfs (0 if none or unreadable). */
static unsigned long free_hugepages(void)
{
	static const char *const sizes[] = { "hugepages-2048kB", "hugepages-1048576kB" };
	unsigned long total = 0;

	for (unsigned i = 0; i < PBOX_ARRAY_SIZE(sizes); i++) {
		char path[128];
		unsigned long v = 0;
		FILE *f;

		snprintf(path, sizeof(path), "/sys/kernel/mm/hugepages/%s/free_hugepages",
			 sizes[i]);
		f = fopen(path, "r");
		if (f == NULL) {
			continue;
		}
		if (fscanf(f, "%lu", &v) == 1) {
			total += v;
		}
		fclose(f);
	}
	return total;
}

static bool hugetlbfs_mounted(void)
{
	char line[512];
	bool found = false;
	FILE *f = fopen("/proc/mounts", "r");

	if (f == NULL) {
		return false;
	}
	while (!found && fgets(line, sizeof(line), f) != NULL) {
		found = strstr(line, " hugetlbfs ") != NULL;
	}
	fclose(f);
	return found;
}

int pbox_dpdk_eal_init(int argc, char **argv)
{
	bool no_huge = has_arg(argc, argv, "--no-huge");
	int rc;

	if (!no_huge) {
		if (free_hugepages() == 0) {
			PBOX_LOG_ERR(
				TRANSPORT,
				"dpdk: no free hugepages: reserve some (echo 512 > "
				"/proc/sys/vm/nr_hugepages; tests/dpdk/setup.sh does it) or pass "
				"--no-huge to the EAL (tests only)");
			return -ENOMEM;
		}
		if (!has_arg(argc, argv, "--in-memory") && !hugetlbfs_mounted()) {
			PBOX_LOG_ERR(TRANSPORT,
				     "dpdk: no hugetlbfs is mounted: mount one (mount -t hugetlbfs "
				     "nodev /dev/hugepages) or pass --in-memory to the EAL");
			return -ENOMEM;
		}
	}
	/* rte_eal_init permutes argv; give it a copy so the caller's stays intact. */
	{
		char **copy = calloc((size_t)argc + 1, sizeof(*copy));

		if (copy == NULL) {
			return -ENOMEM;
		}
		memcpy(copy, argv, (size_t)argc * sizeof(*copy));
		rc = rte_eal_init(argc, copy);
		free(copy);
	}
	if (rc < 0) {
		int err = rte_errno;

		switch (err) {
		case EINVAL:
			PBOX_LOG_ERR(TRANSPORT, "dpdk: the EAL refused its arguments (see above)");
			return -EINVAL;
		case EALREADY:
			PBOX_LOG_ERR(TRANSPORT, "dpdk: the EAL is already initialised");
			return -EALREADY;
		case ENOMEM:
		case EFAULT:
			PBOX_LOG_ERR(TRANSPORT,
				     "dpdk: the EAL could not set up its memory (%s): check free "
				     "hugepages, or use --no-huge -m MB for tests",
				     rte_strerror(err));
			return -ENOMEM;
		case EACCES:
			PBOX_LOG_ERR(TRANSPORT,
				     "dpdk: permission denied setting up the EAL: run as "
				     "root or with CAP_SYS_ADMIN / CAP_IPC_LOCK");
			return -EACCES;
		case EBUSY:
			PBOX_LOG_ERR(
				TRANSPORT,
				"dpdk: another DPDK primary process uses the same --file-prefix");
			return -EBUSY;
		default:
			PBOX_LOG_ERR(TRANSPORT, "dpdk: EAL initialisation failed: %s",
				     rte_strerror(err));
			return err > 0 ? -err : -EIO;
		}
	}
	return 0;
}

void pbox_dpdk_eal_cleanup(void)
{
	rte_eal_cleanup();
}
