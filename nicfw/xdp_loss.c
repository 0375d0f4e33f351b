/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-xdp-loss: attach the test-only loss injector (loss.bpf.c) to an interface, read its
 * counters, detach it. For emulated links (perf/netlab, tests) only.
 *
 *   pbox-xdp-loss attach DEV --probability P [--seed N] [--mode auto|native|generic]
 *   pbox-xdp-loss stats DEV      # {"frames": n, "dropped": n} of the attached injector
 *   pbox-xdp-loss detach DEV
 *
 * The program stays attached after this command exits (until detach, or until the
 * interface goes away); stats and detach find it through the interface. Exit status: 0,
 * 1 on failure (with the reason on stderr), 64 bad arguments.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/if_link.h>

#include "loss.skel.h"
#include "loss_abi.h"

#define PROG_NAME "pbox_loss"

static void usage(FILE *f)
{
	fprintf(f, "Usage: pbox-xdp-loss attach DEV --probability P [--seed N] "
		   "[--mode auto|native|generic]\n"
		   "       pbox-xdp-loss stats DEV\n"
		   "       pbox-xdp-loss detach DEV\n"
		   "\n"
		   "Test-only link loss: drops each frame received on DEV with probability P,\n"
		   "decided by a hash of (seed, frame index): same seed, same decisions.\n");
}

/* The id and mode flags of the pbox_loss program attached to ifindex: 0, -ENOENT (none),
 * -EBUSY (another program) or -errno. */
static int find_ours(int ifindex, const char *dev, uint32_t *id, uint32_t *flags)
{
	LIBBPF_OPTS(bpf_xdp_query_opts, q);
	struct bpf_prog_info info;
	uint32_t len = sizeof(info);
	int rc, fd;

	rc = bpf_xdp_query(ifindex, 0, &q);
	if (rc != 0) {
		fprintf(stderr, "pbox-xdp-loss: %s: XDP query: %s\n", dev, strerror(-rc));
		return rc;
	}
	*id = q.drv_prog_id ? q.drv_prog_id : q.skb_prog_id;
	*flags = q.drv_prog_id ? XDP_FLAGS_DRV_MODE : XDP_FLAGS_SKB_MODE;
	if (*id == 0) {
		return -ENOENT;
	}
	fd = bpf_prog_get_fd_by_id(*id);
	if (fd < 0) {
		return -errno;
	}
	memset(&info, 0, sizeof(info));
	rc = bpf_obj_get_info_by_fd(fd, &info, &len);
	close(fd);
	if (rc != 0) {
		return -errno;
	}
	if (strcmp(info.name, PROG_NAME) != 0) {
		fprintf(stderr, "pbox-xdp-loss: %s: another XDP program (%s, id %u) is attached\n",
			dev, info.name, *id);
		return -EBUSY;
	}
	return 0;
}

static int do_attach(int ifindex, const char *dev, double p, uint64_t seed, const char *mode)
{
	struct pbox_loss_bpf *skel;
	uint32_t id, flags;
	int rc;

	rc = find_ours(ifindex, dev, &id, &flags);
	if (rc == 0) {
		fprintf(stderr, "pbox-xdp-loss: %s: a loss injector is attached already (id %u)\n",
			dev, id);
		return 1;
	}
	if (rc != -ENOENT) {
		return 1;
	}
	skel = pbox_loss_bpf__open();
	if (skel == NULL) {
		fprintf(stderr, "pbox-xdp-loss: open: %s\n", strerror(errno));
		return 1;
	}
	skel->rodata->threshold = (uint32_t)fmin(p * 4294967296.0, 4294967295.0);
	skel->rodata->seed = seed;
	rc = pbox_loss_bpf__load(skel);
	if (rc != 0) {
		fprintf(stderr, "pbox-xdp-loss: load: %s\n", strerror(-rc));
		pbox_loss_bpf__destroy(skel);
		return 1;
	}
	rc = -EOPNOTSUPP;
	if (strcmp(mode, "generic") != 0) {
		rc = bpf_xdp_attach(ifindex, bpf_program__fd(skel->progs.pbox_loss),
				    XDP_FLAGS_DRV_MODE | XDP_FLAGS_UPDATE_IF_NOEXIST, NULL);
		if (rc != 0 && strcmp(mode, "native") == 0) {
			fprintf(stderr, "pbox-xdp-loss: %s: native attach: %s\n", dev,
				strerror(-rc));
			pbox_loss_bpf__destroy(skel);
			return 1;
		}
	}
	if (rc != 0) {
		rc = bpf_xdp_attach(ifindex, bpf_program__fd(skel->progs.pbox_loss),
				    XDP_FLAGS_SKB_MODE | XDP_FLAGS_UPDATE_IF_NOEXIST, NULL);
		if (rc != 0) {
			fprintf(stderr, "pbox-xdp-loss: %s: attach: %s\n", dev, strerror(-rc));
			pbox_loss_bpf__destroy(skel);
			return 1;
		}
	}
	/* The attachment holds the program (and its maps) after we exit. */
	pbox_loss_bpf__destroy(skel);
	return 0;
}

static int do_stats(int ifindex, const char *dev)
{
	struct pbox_loss_counters c = { 0 };
	struct bpf_prog_info info;
	uint32_t len, id, flags, key = 0;
	int rc, fd, mfd;

	rc = find_ours(ifindex, dev, &id, &flags);
	if (rc != 0) {
		if (rc == -ENOENT) {
			fprintf(stderr, "pbox-xdp-loss: %s: no loss injector attached\n", dev);
		}
		return 1;
	}
	/* The program uses two maps (counters, rodata): find the counters by name. */
	{
		uint32_t ids[4];
		struct bpf_map_info mi;

		memset(&info, 0, sizeof(info));
		info.nr_map_ids = 4;
		info.map_ids = (uint64_t)(uintptr_t)ids;
		len = sizeof(info);
		fd = bpf_prog_get_fd_by_id(id);
		if (fd < 0 || bpf_obj_get_info_by_fd(fd, &info, &len) != 0) {
			fprintf(stderr, "pbox-xdp-loss: %s: prog info: %s\n", dev, strerror(errno));
			return 1;
		}
		close(fd);
		for (uint32_t i = 0; i < info.nr_map_ids && i < 4; i++) {
			mfd = bpf_map_get_fd_by_id(ids[i]);
			len = sizeof(mi);
			memset(&mi, 0, sizeof(mi));
			if (mfd >= 0 && bpf_obj_get_info_by_fd(mfd, &mi, &len) == 0 &&
			    strcmp(mi.name, "loss_counters") == 0) {
				rc = bpf_map_lookup_elem(mfd, &key, &c);
				close(mfd);
				if (rc != 0) {
					break;
				}
				printf("{\"frames\": %" PRIu64 ", \"dropped\": %" PRIu64 "}\n",
				       (uint64_t)c.seq, (uint64_t)c.dropped);
				return 0;
			}
			if (mfd >= 0) {
				close(mfd);
			}
		}
	}
	fprintf(stderr, "pbox-xdp-loss: %s: the injector's counters are not readable\n", dev);
	return 1;
}

static int do_detach(int ifindex, const char *dev)
{
	uint32_t id, flags;
	int rc = find_ours(ifindex, dev, &id, &flags);

	if (rc == -ENOENT) {
		return 0;
	}
	if (rc != 0) {
		return 1;
	}
	rc = bpf_xdp_detach(ifindex, flags, NULL);
	if (rc != 0) {
		fprintf(stderr, "pbox-xdp-loss: %s: detach: %s\n", dev, strerror(-rc));
		return 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "probability", required_argument, NULL, 'p' },
		{ "seed", required_argument, NULL, 's' },
		{ "mode", required_argument, NULL, 'm' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *mode = "auto", *cmd, *dev;
	double p = -1;
	uint64_t seed = 1;
	char *end;
	int o, ifindex;

	while ((o = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (o) {
		case 'p':
			p = strtod(optarg, &end);
			if (*end != '\0' || !(p >= 0 && p <= 1)) {
				fprintf(stderr, "pbox-xdp-loss: --probability %s: expected 0..1\n",
					optarg);
				return 64;
			}
			break;
		case 's':
			errno = 0;
			seed = strtoull(optarg, &end, 0);
			if (errno != 0 || *end != '\0') {
				fprintf(stderr, "pbox-xdp-loss: --seed %s: expected an integer\n",
					optarg);
				return 64;
			}
			break;
		case 'm':
			if (strcmp(optarg, "auto") != 0 && strcmp(optarg, "native") != 0 &&
			    strcmp(optarg, "generic") != 0) {
				fprintf(stderr,
					"pbox-xdp-loss: --mode %s: auto, native or generic\n",
					optarg);
				return 64;
			}
			mode = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 64;
		}
	}
	if (argc - optind != 2) {
		usage(stderr);
		return 64;
	}
	cmd = argv[optind];
	dev = argv[optind + 1];
	ifindex = (int)if_nametoindex(dev);
	if (ifindex == 0) {
		fprintf(stderr, "pbox-xdp-loss: %s: %s\n", dev, strerror(errno));
		return 1;
	}
	if (strcmp(cmd, "attach") == 0) {
		if (p < 0) {
			fprintf(stderr, "pbox-xdp-loss: attach needs --probability\n");
			return 64;
		}
		return do_attach(ifindex, dev, p, seed, mode);
	}
	if (strcmp(cmd, "stats") == 0) {
		return do_stats(ifindex, dev);
	}
	if (strcmp(cmd, "detach") == 0) {
		return do_detach(ifindex, dev);
	}
	usage(stderr);
	return 64;
}
