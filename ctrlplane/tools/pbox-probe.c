/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-probe: measure the available bandwidth of a path with SLoPS, or answer such
 * probes. The same agent pbox-ctrld will drive (ctrlplane/probe/agent.h); this tool is
 * for one pair by hand, the benchmarks and the tests.
 *
 *   pbox-probe --listen ADDR[:PORT]|:PORT        responder, until SIGINT/SIGTERM
 *   pbox-probe [options] HOST[:PORT]             probe the responder at HOST
 *
 * Exit status: 0 estimate made (also when the budget ended it: see "flags"), 1 probe
 * failed (no responder, socket error), 2 usage.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent.h"
#include "common/args.h"
#include "common/log.h"
#include "probe_msg.h"
#include "probe_wire.h"

#define PROG "pbox-probe"

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
	(void)sig;
	g_stop = 1;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: " PROG
		" [options] HOST[:PORT]     measure the available bandwidth to HOST\n"
		"       " PROG " --listen ADDR[:PORT]|:PORT  answer probes (foreground)\n"
		"\n"
		"SLoPS (pathload's method): fleets of periodic UDP streams at rate R; one-way\n"
		"delays that increase mean R is above the available bandwidth. A binary search\n"
		"over R ends with a range [r_min, r_max] (and a grey region where the fleets\n"
		"could not tell). The default port is %u (UDP).\n"
		"\n"
		"probe options:\n"
		"  --cap RATE          never send faster than RATE (default 1gbit); the search\n"
		"                      starts there. RATE: 500m, 100mbit, 2.5gbit, 800000\n"
		"  --min RATE          lowest rate probed (default 1mbit)\n"
		"  --budget SECONDS    stop starting streams after this (default 10)\n"
		"  --resolution F      stop when r_max - r_min <= F * r_max (default %g)\n"
		"  --mtu BYTES         largest IP datagram (default 1500)\n"
		"  --streams N         streams per fleet (default %d)\n"
		"  --stream-len N      packets per stream (default %d, max %d)\n"
		"  --realtime          pace from a SCHED_FIFO thread (root/CAP_SYS_NICE): fewer\n"
		"                      streams disturbed by preemption on a busy machine\n"
		"  --json              one JSON object on stdout\n"
		"  -v, --verbose       print each fleet's rate and verdicts on stderr\n"
		"responder options:\n"
		"  --listen ADDR[:PORT]     bind here (\":PORT\": every address; port %u)\n"
		"  --max-sessions N         concurrent sessions (default 64)\n"
		"  --max-per-addr N         sessions per source address (default 4)\n"
		"  -h, --help\n",
		PBOX_PROBE_PORT, PBOX_SLOPS_RESOLUTION, PBOX_SLOPS_FLEET_STREAMS,
		PBOX_SLOPS_STREAM_LEN, PBOX_SLOPS_MAX_STREAM_LEN, PBOX_PROBE_PORT);
}

/* "100mbit", "1.5gbit", "500m", "20M", "800000" (bit/s). 0 or -EINVAL (reported). */
static int parse_rate(const char *opt, const char *s, double *out)
{
	static const struct {
		const char *unit;
		double f;
	} units[] = { { "", 1 },    { "bit", 1 },    { "k", 1e3 }, { "kbit", 1e3 },
		      { "m", 1e6 }, { "mbit", 1e6 }, { "g", 1e9 }, { "gbit", 1e9 } };
	char *end;
	double v = strtod(s, &end);
	size_t i;

	for (i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		if (!strcasecmp(end, units[i].unit) && end != s && isfinite(v)) {
			v *= units[i].f;
			if (v >= 1e3 && v <= 1e12) {
				*out = v;
				return 0;
			}
		}
	}
	fprintf(stderr, PROG ": %s %s: expected a rate between 1kbit and 1000gbit (e.g. 100mbit)\n",
		opt, s);
	return -EINVAL;
}

static void print_fleet(void *arg, double bps, enum pbox_slops_verdict fleet,
			const enum pbox_slops_verdict *v, unsigned n)
{
	unsigned i;

	(void)arg;
	fprintf(stderr, "fleet %.2f Mbit/s: %s (", bps / 1e6, pbox_slops_verdict_name(fleet));
	for (i = 0; i < n; i++) {
		fprintf(stderr, "%s%c", i ? " " : "", pbox_slops_verdict_name(v[i])[0]);
	}
	fprintf(stderr, ")\n");
}

static int serve(const char *where, const struct pbox_probe_responder_conf *conf)
{
	struct sockaddr_storage ss;
	struct pbox_probe_responder *r;
	struct pbox_probe_responder_stats st;
	struct sigaction sa = { .sa_handler = on_signal };
	socklen_t len;
	int fd, rc;

	rc = pbox_probe_parse_addr(where, PBOX_PROBE_PORT, &ss, &len);
	if (rc < 0) {
		fprintf(stderr, PROG ": --listen %s: %s\n", where,
			rc == -EINVAL ? "expected [ADDR][:PORT]" : "address not resolved");
		return 2;
	}
	fd = pbox_probe_listen((struct sockaddr *)&ss, len);
	if (fd < 0) {
		return 1;
	}
	r = pbox_probe_responder_create(conf);
	if (r == NULL) {
		close(fd);
		return 1;
	}
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	PBOX_LOG_INFO(MAIN, "responder on %s (UDP)", where);
	rc = pbox_probe_responder_serve(r, fd, &g_stop);
	pbox_probe_responder_get_stats(r, &st);
	PBOX_LOG_INFO(MAIN,
		      "responder %s: stopped: %llu datagrams in, %llu out (%llu bytes in, %llu "
		      "out), %llu sessions; drops: %llu not ours, %llu malformed, %llu bad token, "
		      "%llu table full, %llu rate, %llu stream, %llu duplicate",
		      where, (unsigned long long)st.rx_packets, (unsigned long long)st.tx_packets,
		      (unsigned long long)st.rx_bytes, (unsigned long long)st.tx_bytes,
		      (unsigned long long)st.sessions_opened, (unsigned long long)st.drop_not_ours,
		      (unsigned long long)st.drop_malformed, (unsigned long long)st.drop_bad_token,
		      (unsigned long long)st.drop_full, (unsigned long long)st.drop_rate,
		      (unsigned long long)st.drop_stream, (unsigned long long)st.drop_duplicate);
	pbox_probe_responder_destroy(r);
	close(fd);
	if (rc < 0) {
		PBOX_LOG_ERR(MAIN, "responder %s: %s", where, strerror(-rc));
		return 1;
	}
	return 0;
}

static void flags_str(unsigned f, char *buf, size_t len)
{
	static const char *names[] = { "converged", "at_cap", "at_min", "sender_limited",
				       "budget" };
	size_t i, off = 0;

	buf[0] = '\0';
	for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (f & (1u << i)) {
			off += (size_t)snprintf(buf + off, len - off, "%s%s", off ? "," : "",
						names[i]);
			if (off >= len) {
				break;
			}
		}
	}
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "cap", required_argument, NULL, 'c' },
		{ "min", required_argument, NULL, 'm' },
		{ "budget", required_argument, NULL, 'b' },
		{ "resolution", required_argument, NULL, 'r' },
		{ "mtu", required_argument, NULL, 'M' },
		{ "streams", required_argument, NULL, 'n' },
		{ "stream-len", required_argument, NULL, 'k' },
		{ "json", no_argument, NULL, 'j' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "realtime", no_argument, NULL, 'R' },
		{ "listen", required_argument, NULL, 'l' },
		{ "max-sessions", required_argument, NULL, 'S' },
		{ "max-per-addr", required_argument, NULL, 'A' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct pbox_probe_responder_conf conf = { 0 };
	struct pbox_probe_request req;
	struct pbox_probe_result res;
	const char *listen = NULL;
	double budget_s = 10;
	bool json = false;
	char flags[96];
	int c, rc;

	pbox_log_set_ident(PROG);
	pbox_log_init_from_env();
	pbox_probe_request_defaults(&req);
	req.cap_bps = 1e9;
	while ((c = getopt_long(argc, argv, "vh", opts, NULL)) != -1) {
		switch (c) {
		case 'c':
			rc = parse_rate("--cap", optarg, &req.cap_bps);
			break;
		case 'm':
			rc = parse_rate("--min", optarg, &req.min_bps);
			break;
		case 'b':
			rc = pbox_arg_double(PROG, "--budget", optarg, 0.1, 3600, &budget_s);
			break;
		case 'r':
			rc = pbox_arg_double(PROG, "--resolution", optarg, 0.001, 0.5,
					     &req.resolution);
			break;
		case 'M':
			rc = pbox_arg_u32(PROG, "--mtu", optarg, PBOX_SLOPS_MIN_PACKET,
					  PBOX_PROBE_MAX_DATAGRAM + PBOX_PROBE_IPUDP_BYTES,
					  &req.max_datagram);
			break;
		case 'n':
			rc = pbox_arg_u32(PROG, "--streams", optarg, 1,
					  PBOX_SLOPS_MAX_FLEET_STREAMS, &req.streams);
			break;
		case 'k':
			rc = pbox_arg_u32(PROG, "--stream-len", optarg, 10,
					  PBOX_SLOPS_MAX_STREAM_LEN, &req.stream_len);
			break;
		case 'j':
			json = true;
			rc = 0;
			break;
		case 'R':
			req.realtime = true;
			rc = 0;
			break;
		case 'v':
			req.on_fleet = print_fleet;
			rc = 0;
			break;
		case 'l':
			listen = optarg;
			rc = 0;
			break;
		case 'S':
			rc = pbox_arg_u32(PROG, "--max-sessions", optarg, 1, 65536,
					  &conf.max_sessions);
			break;
		case 'A':
			rc = pbox_arg_u32(PROG, "--max-per-addr", optarg, 1, 65536,
					  &conf.max_per_addr);
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
		if (rc < 0) {
			return 2;
		}
	}
	if (listen) {
		if (optind != argc) {
			fprintf(stderr, PROG ": --listen takes no HOST\n");
			return 2;
		}
		return serve(listen, &conf);
	}
	if (optind != argc - 1) {
		usage(stderr);
		return 2;
	}
	if (!(req.cap_bps > req.min_bps)) {
		fprintf(stderr, PROG ": --cap must be above --min\n");
		return 2;
	}
	rc = pbox_probe_parse_addr(argv[optind], PBOX_PROBE_PORT, &req.peer, &req.peer_len);
	if (rc < 0) {
		fprintf(stderr, PROG ": %s: %s\n", argv[optind],
			rc == -EINVAL ? "expected HOST[:PORT]" : "host not resolved");
		return 2;
	}
	req.budget_ns = (int64_t)(budget_s * 1e9);
	rc = pbox_probe_run(&req, &res);
	if (rc < 0) {
		return 1;
	}
	flags_str(res.flags, flags, sizeof(flags));
	if (json) {
		/* The message pbox-ctrld receives from an agent (probe_msg.h). */
		json_t *j = pbox_probe_result_to_json(&res, argv[optind]);
		char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;

		if (text == NULL) {
			fprintf(stderr, PROG ": out of memory\n");
			json_decref(j);
			return 1;
		}
		printf("%s\n", text);
		free(text);
		json_decref(j);
	} else {
		printf("%s: available bandwidth %.2f .. %.2f Mbit/s", argv[optind],
		       res.r_min_bps / 1e6, res.r_max_bps / 1e6);
		if (res.grey_min_bps <= res.grey_max_bps) {
			printf(", grey %.2f .. %.2f", res.grey_min_bps / 1e6,
			       res.grey_max_bps / 1e6);
		}
		printf(" [%s] in %.2f s (%u fleets, %u streams, dispersion %.1f Mbit/s)\n", flags,
		       res.duration_ns / 1e9, res.fleets, res.streams, res.adr_bps / 1e6);
	}
	return 0;
}
