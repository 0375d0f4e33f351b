/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pboxd: the PBox appliance daemon. Loads and validates the configuration, starts the
 * data-plane cores and the control listener, then runs the control loop: admissions,
 * stats requests, signals (SIGTERM/SIGINT: orderly drain; SIGUSR1: print counters).
 */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <sysexits.h>
#include <time.h>
#include <unistd.h>

#include "common/hostport.h"
#include "common/log.h"
#include "common/notify.h"
#include "budget.h"
#include "checkpoint.h"
#include "config.h"
#include "control.h"
#include "dataplane.h"
#include "fdbudget.h"
#include "metrics.h"
#include "sessions.h"
#include "stats.h"
#include "probe.h"
#include "xdp.h"

#ifndef PBOX_VERSION_STRING
#define PBOX_VERSION_STRING "0.0.0"
#endif

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: pboxd [options] [-- EAL arguments]\n"
		"\n"
		"The PBox appliance daemon: aggregates gradients from training workers on\n"
		"poll-mode data-plane cores and runs the optimizer on the appliance.\n"
		"\n"
		"Options (command-line values override the configuration file):\n"
		"  -c, --config FILE        configuration file (default: none; see\n"
		"                           dataplane/pboxd/pboxd.conf.example)\n"
		"      --check-config       validate the configuration and exit\n"
		"      --transport NAME     data plane: udp (kernel sockets, default), afxdp\n"
		"                           (AF_XDP sockets, see appliance.afxdp) or dpdk\n"
		"                           (kernel bypass; arguments after -- go to the DPDK\n"
		"                           EAL, e.g. -- --vdev net_af_xdp0,iface=eth1 -a\n"
		"                           0000:01:00.0 --file-prefix pbox --no-huge)\n"
		"      --cores N            number of data-plane cores (threads, not pinned)\n"
		"      --cpus LIST          pin one core per CPU, e.g. 0,1 or 2-5 (dpdk: the\n"
		"                           lcores, unless the EAL arguments give -l/--lcores)\n"
		"      --data-address ADDR  IPv4 address for data-plane UDP (default 127.0.0.1;\n"
		"                           with dpdk: the appliance's address on its port)\n"
		"      --base-port PORT     core k listens on PORT+k (default 7100)\n"
		"      --control HOST:PORT  admission / stats TCP address (default "
		"127.0.0.1:7000)\n"
		"      --chunk-bytes N      key chunk size (default 32768)\n"
		"      --mtu N              path MTU; sets the fragment size (default 1500)\n"
		"      --busy-poll          never sleep when idle (dedicated CPUs)\n"
		"      --deterministic      make every job sum in rank order (bit-reproducible)\n"
		"      --fault SPEC         inject faults on sends: drop=P,dup=P,reorder=P,seed=N\n"
		"      --stats-interval S   print counters every S seconds\n"
		"      --log-level LEVEL    err, warn, info (default) or debug\n"
		"      --log-format FORMAT  text (default) or json: one JSON object per line\n"
		"  -h, --help               this text\n"
		"  -V, --version            version\n"
		"\n"
		"Signals: SIGTERM/SIGINT drain (stop admitting, let sessions finish for\n"
		"drain_timeout seconds, then abort them) and exit; a second one exits at once.\n"
		"SIGUSR1 prints the per-core counters.\n"
		"\n"
		"Exit status: 0 after a clean stop, 64 bad arguments (EAL arguments too),\n"
		"78 bad configuration, 69 a port or resource could not be set up (no\n"
		"hugepages, no DPDK port, a device that cannot do what is configured).\n");
}

enum {
	OPT_CHECK = 256,
	OPT_CORES,
	OPT_CPUS,
	OPT_DATA_ADDR,
	OPT_BASE_PORT,
	OPT_CONTROL,
	OPT_CHUNK,
	OPT_MTU,
	OPT_BUSY,
	OPT_DET,
	OPT_FAULT,
	OPT_STATS,
	OPT_LOG,
	OPT_LOG_FORMAT,
	OPT_TRANSPORT,
};

static const struct option g_opts[] = {
	{ "config", required_argument, NULL, 'c' },
	{ "check-config", no_argument, NULL, OPT_CHECK },
	{ "cores", required_argument, NULL, OPT_CORES },
	{ "cpus", required_argument, NULL, OPT_CPUS },
	{ "data-address", required_argument, NULL, OPT_DATA_ADDR },
	{ "base-port", required_argument, NULL, OPT_BASE_PORT },
	{ "control", required_argument, NULL, OPT_CONTROL },
	{ "chunk-bytes", required_argument, NULL, OPT_CHUNK },
	{ "mtu", required_argument, NULL, OPT_MTU },
	{ "busy-poll", no_argument, NULL, OPT_BUSY },
	{ "deterministic", no_argument, NULL, OPT_DET },
	{ "fault", required_argument, NULL, OPT_FAULT },
	{ "stats-interval", required_argument, NULL, OPT_STATS },
	{ "log-level", required_argument, NULL, OPT_LOG },
	{ "log-format", required_argument, NULL, OPT_LOG_FORMAT },
	{ "transport", required_argument, NULL, OPT_TRANSPORT },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, 'V' },
	{ NULL, 0, NULL, 0 },
};

static int parse_uint(const char *opt, const char *s, unsigned long lo, unsigned long hi,
		      unsigned long *out)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno != 0 || *end != '\0' || end == s || v < lo || v > hi) {
		fprintf(stderr, "pboxd: --%s %s: expected an integer between %lu and %lu\n", opt, s,
			lo, hi);
		return -1;
	}
	*out = v;
	return 0;
}

struct app {
	struct pboxd_config cfg;
	struct pboxd_dp dp;
	struct pboxd_sessions *sessions;
	struct pboxd_control *control;
	struct pboxd_xdp *xdp;        /* NULL: no XDP filter */
	struct pboxd_probe *probe;    /* NULL: not a probe agent */
	struct pbox_metrics *metrics; /* NULL: no /metrics endpoint */
	struct pboxd_metrics_src metrics_src;
};

static json_t *stats_cb(void *arg, bool all, uint32_t job)
{
	struct app *a = arg;
	json_t *o, *t, *jobs, *mine, *j;
	size_t i;

	if (!all) {
		/* A member: its own job's entry, nothing about the others or the cores. */
		jobs = pboxd_sessions_status(a->sessions);
		mine = json_array();
		json_array_foreach(jobs, i, j)
		{
			if (json_integer_value(json_object_get(j, "id")) == (json_int_t)job) {
				json_array_append(mine, j);
			}
		}
		json_decref(jobs);
		return json_pack("{s:b, s:o}", "ok", 1, "jobs", mine);
	}
	o = pboxd_stats_json(&a->dp, a->sessions);
	t = pboxd_dp_transport_json(&a->dp);
	if (o != NULL && t != NULL) {
		json_object_set_new(o, "transport", t);
	} else {
		json_decref(t);
	}
	t = pboxd_xdp_stats_json(a->xdp);
	if (o != NULL && t != NULL) {
		json_object_set_new(o, "xdp", t);
	} else {
		json_decref(t);
	}
	t = pboxd_probe_stats(a->probe);
	if (o != NULL && t != NULL) {
		json_object_set_new(o, "probe", t);
	} else {
		json_decref(t);
	}
	return o;
}

/* What /metrics renders: the stats request's full answer, control channel included. */
static json_t *metrics_stats(void *arg)
{
	struct app *a = arg;
	json_t *o = stats_cb(a, true, 0);

	if (o != NULL) {
		json_object_set_new(o, "control", pboxd_control_stats(a->control));
	}
	return o;
}

/* The /metrics endpoint's connections (2 descriptors each) from pboxd's descriptor budget,
 * for as long as pboxd runs: 0, or -EMFILE after logging why. */
static int metrics_fds(const struct pbox_metrics_cfg *m)
{
	char why[192];

	if (pboxd_fd_take(PBOXD_FD_METRICS, 2 * m->max_connections) == 0) {
		return 0;
	}
	PBOX_LOG_ERR(MAIN,
		     "metrics.max_connections %u needs %u descriptors, more than pboxd's "
		     "descriptor budget has (%s): lower it or raise the open-file limit",
		     m->max_connections, 2 * m->max_connections,
		     pboxd_fd_explain(why, sizeof(why)));
	return -EMFILE;
}

/* Raise the soft open-file limit to the hard one: each control connection takes a
 * descriptor, and the default soft limit (1024) is below the connection cap. */
static void raise_fd_limit(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
		PBOX_LOG_WARN(MAIN, "getrlimit(RLIMIT_NOFILE): %s", strerror(errno));
		return;
	}
	if (rl.rlim_cur >= rl.rlim_max) {
		PBOX_LOG_INFO(MAIN, "open-file limit %llu (the hard limit)",
			      (unsigned long long)rl.rlim_cur);
		return;
	}
	{
		rlim_t before = rl.rlim_cur;

		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
			PBOX_LOG_WARN(MAIN,
				      "cannot raise the open-file limit from %llu to %llu: %s",
				      (unsigned long long)before, (unsigned long long)rl.rlim_max,
				      strerror(errno));
			return;
		}
		PBOX_LOG_INFO(MAIN, "open-file limit raised from %llu to %llu (the hard limit)",
			      (unsigned long long)before, (unsigned long long)rl.rlim_max);
	}
}

/* Command-line overrides, applied after the file. Returns 0 or an exit status. */
static int apply_cli(struct pboxd_config *cfg, int argc, char **argv, bool *check_only)
{
	unsigned long v;
	int o;

	optind = 1;
	while ((o = getopt_long(argc, argv, "c:hV", g_opts, NULL)) != -1) {
		switch (o) {
		case 'c':
			break; /* loaded before */
		case OPT_CHECK:
			*check_only = true;
			break;
		case OPT_CORES:
			if (parse_uint("cores", optarg, 1, PBOX_MAX_CORES, &v) != 0) {
				return EX_USAGE;
			}
			cfg->ncores = (uint32_t)v;
			for (unsigned i = 0; i < PBOX_MAX_CORES; i++) {
				cfg->cpus[i] = -1;
			}
			break;
		case OPT_CPUS: {
			int n = pboxd_parse_cpulist(optarg, cfg->cpus, PBOX_MAX_CORES);

			if (n <= 0) {
				fprintf(stderr,
					"pboxd: --cpus %s: expected a CPU list like 0,1 or 2-5\n",
					optarg);
				return EX_USAGE;
			}
			cfg->ncores = (uint32_t)n;
			break;
		}
		case OPT_TRANSPORT:
			if (snprintf(cfg->transport, sizeof(cfg->transport), "%s", optarg) >=
			    (int)sizeof(cfg->transport)) {
				fprintf(stderr, "pboxd: --transport %s: unknown transport\n",
					optarg);
				return EX_USAGE;
			}
			break;
		case OPT_DATA_ADDR:
			snprintf(cfg->data_addr, sizeof(cfg->data_addr), "%s", optarg);
			break;
		case OPT_BASE_PORT:
			if (parse_uint("base-port", optarg, 1, 65535 - PBOX_MAX_CORES, &v) != 0) {
				return EX_USAGE;
			}
			cfg->base_port = (uint16_t)v;
			break;
		case OPT_CONTROL:
			if (pbox_hostport_split(optarg, false, 0, cfg->control_host,
						sizeof(cfg->control_host),
						&cfg->control_port) != 0) {
				fprintf(stderr, "pboxd: --control %s: expected HOST:PORT\n",
					optarg);
				return EX_USAGE;
			}
			break;
		case OPT_CHUNK:
			if (parse_uint("chunk-bytes", optarg, PBOX_MIN_CHUNK_BYTES,
				       PBOX_MAX_CHUNK_BYTES, &v) != 0) {
				return EX_USAGE;
			}
			if (v % PBOX_FRAG_ALIGN != 0) {
				fprintf(stderr,
					"pboxd: --chunk-bytes %lu: must be a multiple of %u\n", v,
					PBOX_FRAG_ALIGN);
				return EX_USAGE;
			}
			cfg->chunk_bytes = (uint32_t)v;
			break;
		case OPT_MTU:
			if (parse_uint("mtu", optarg, 576, 65535, &v) != 0) {
				return EX_USAGE;
			}
			cfg->mtu = (uint32_t)v;
			break;
		case OPT_BUSY:
			cfg->busy_poll = true;
			break;
		case OPT_DET:
			cfg->deterministic = true;
			for (uint32_t i = 0; i < cfg->njobs; i++) {
				if (cfg->jobs[i].sync->folds_late) {
					fprintf(stderr,
						"pboxd: --deterministic: job %u uses %s, which "
						"adds late "
						"contributions in arrival order\n",
						cfg->jobs[i].id, cfg->jobs[i].sync->name);
					return EX_USAGE;
				}
				cfg->jobs[i].deterministic = true;
			}
			break;
		case OPT_FAULT: {
			char err[192];

			if (pbox_fault_parse(optarg, &cfg->fault, err, sizeof(err)) != 0) {
				fprintf(stderr, "pboxd: --fault: %s\n", err);
				return EX_USAGE;
			}
			break;
		}
		case OPT_STATS:
			if (parse_uint("stats-interval", optarg, 0, 86400, &v) != 0) {
				return EX_USAGE;
			}
			cfg->stats_interval = (uint32_t)v;
			break;
		case OPT_LOG_FORMAT: {
			int fmt = pbox_log_parse_format(optarg);

			if (fmt < 0) {
				fprintf(stderr, "pboxd: --log-format %s: expected text or json\n",
					optarg);
				return EX_USAGE;
			}
			cfg->log_format = fmt;
			break;
		}
		case OPT_LOG: {
			int lvl = pbox_log_parse_level(optarg);

			if (lvl < 0) {
				fprintf(stderr,
					"pboxd: --log-level %s: expected err, warn, info or "
					"debug\n",
					optarg);
				return EX_USAGE;
			}
			pbox_log_set_level(PBOX_LOGC_COUNT, (enum pbox_log_level)lvl);
			break;
		}
		default:
			return EX_USAGE;
		}
	}
	if (optind < argc && strcmp(argv[optind - 1], "--") != 0) {
		fprintf(stderr, "pboxd: unexpected argument '%s' (see --help)\n", argv[optind]);
		return EX_USAGE;
	}
	if (optind < argc) {
		char err[128];

		/* After --: the DPDK EAL's arguments. */
		if (pboxd_config_add_eal_args(cfg, argc - optind, argv + optind, err,
					      sizeof(err)) != 0) {
			fprintf(stderr, "pboxd: %s\n", err);
			return EX_USAGE;
		}
	}
	return 0;
}

static int run(struct app *a)
{
	sigset_t mask;
	int sfd, tfd = -1, hfd = -1, signals = 0;
	uint32_t heartbeat_ms = pboxd_sessions_heartbeat_ms(a->sessions);
	struct timespec drain_deadline = { 0 };
	bool draining = false;

	sigemptyset(&mask);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGUSR1);
	sigaddset(&mask, SIGPIPE);
	sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
	if (sfd < 0) {
		PBOX_LOG_ERR(MAIN, "signalfd: %s", strerror(errno));
		return EX_OSERR;
	}
	if (a->cfg.stats_interval > 0) {
		struct itimerspec it = { { a->cfg.stats_interval, 0 },
					 { a->cfg.stats_interval, 0 } };

		tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
		timerfd_settime(tfd, 0, &it, NULL);
	}
	if (heartbeat_ms > 0) {
		struct timespec iv = { heartbeat_ms / 1000, (long)(heartbeat_ms % 1000) * 1000000 };
		struct itimerspec it = { iv, iv };

		hfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
		if (hfd < 0 || timerfd_settime(hfd, 0, &it, NULL) != 0) {
			PBOX_LOG_ERR(MAIN, "heartbeat timer: %s", strerror(errno));
			close(sfd);
			if (tfd >= 0) {
				close(tfd);
			}
			if (hfd >= 0) {
				close(hfd);
			}
			return EX_OSERR;
		}
	}
	PBOX_LOG_INFO(MAIN, "pboxd %s ready: %u job%s configured", PBOX_VERSION_STRING,
		      a->cfg.njobs, a->cfg.njobs == 1 ? "" : "s");
	/* The data plane and the control listener are up: tell systemd (Type=notify). */
	pbox_notifyf("READY=1\nSTATUS=%s transport, %u core%s, %u job%s", a->cfg.transport,
		     a->cfg.ncores, a->cfg.ncores == 1 ? "" : "s", a->cfg.njobs,
		     a->cfg.njobs == 1 ? "" : "s");
	for (;;) {
		/* The control channel's connections are in its own epoll set (one fd here). */
		struct pollfd p[5];
		int timeout = -1;

		p[0] = (struct pollfd){ .fd = sfd, .events = POLLIN };
		p[1] = (struct pollfd){ .fd = tfd, .events = POLLIN };
		p[2] = (struct pollfd){ .fd = hfd, .events = POLLIN };
		p[3] = (struct pollfd){ .fd = pboxd_control_fd(a->control), .events = POLLIN };
		p[4] = (struct pollfd){ .fd = a->metrics ? pbox_metrics_fd(a->metrics) : -1,
					.events = POLLIN };
		if (draining) {
			struct timespec now;

			if (pboxd_sessions_active(a->sessions) == 0) {
				PBOX_LOG_INFO(MAIN, "drained: no session left");
				break;
			}
			clock_gettime(CLOCK_MONOTONIC, &now);
			if (now.tv_sec >= drain_deadline.tv_sec) {
				PBOX_LOG_WARN(MAIN, "drain timeout: aborting %u session(s)",
					      pboxd_sessions_active(a->sessions));
				pboxd_sessions_abort_all(a->sessions,
							 "the appliance is shutting down");
				break;
			}
			timeout = 200;
		}
		if (poll(p, PBOX_ARRAY_SIZE(p), timeout) < 0 && errno != EINTR) {
			PBOX_LOG_ERR(MAIN, "poll: %s", strerror(errno));
			break;
		}
		if (p[0].revents & POLLIN) {
			struct signalfd_siginfo si;

			while (read(sfd, &si, sizeof(si)) == sizeof(si)) {
				if (si.ssi_signo == SIGUSR1) {
					pboxd_stats_print(stderr, &a->dp);
					pboxd_dp_transport_print(stderr, &a->dp);
					pboxd_xdp_stats_print(stderr, a->xdp);
				} else if (si.ssi_signo == SIGINT || si.ssi_signo == SIGTERM) {
					signals++;
				}
			}
			if (signals >= 2) {
				PBOX_LOG_WARN(MAIN, "second signal: stopping now");
				pbox_notify("STOPPING=1\nSTATUS=stopping now");
				pboxd_sessions_abort_all(a->sessions,
							 "the appliance is shutting down");
				break;
			}
			if (signals == 1 && !draining) {
				draining = true;
				pbox_notify("STOPPING=1\nSTATUS=draining");
				pboxd_control_stop_accepting(a->control);
				/* A checkpoint of the running sessions, while they still run. */
				pboxd_ckpt_request(pboxd_sessions_ckpt(a->sessions));
				clock_gettime(CLOCK_MONOTONIC, &drain_deadline);
				drain_deadline.tv_sec += a->cfg.drain_timeout;
				PBOX_LOG_INFO(
					MAIN,
					"stopping: no new connections; %u session(s) get %u s "
					"to finish",
					pboxd_sessions_active(a->sessions), a->cfg.drain_timeout);
			}
		}
		if (tfd >= 0 && (p[1].revents & POLLIN)) {
			uint64_t ticks;

			if (read(tfd, &ticks, sizeof(ticks)) > 0) {
				pboxd_stats_print(stderr, &a->dp);
				pboxd_dp_transport_print(stderr, &a->dp);
				pboxd_xdp_stats_print(stderr, a->xdp);
			}
		}
		/* Requests first, then the heartbeat check (which reads the members' pending
		 * input again before judging them). */
		if (p[3].revents & POLLIN) {
			pboxd_control_handle(a->control);
		}
		if (hfd >= 0 && (p[2].revents & POLLIN)) {
			uint64_t ticks;

			if (read(hfd, &ticks, sizeof(ticks)) > 0) {
				pboxd_control_tick(a->control);
			}
		}
		if (p[4].revents & POLLIN) {
			pbox_metrics_serve(a->metrics, pboxd_metrics_render, &a->metrics_src);
		}
	}
	close(sfd);
	if (tfd >= 0) {
		close(tfd);
	}
	if (hfd >= 0) {
		close(hfd);
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct app a;
	const char *config_path = NULL;
	bool check_only = false;
	char err[512];
	sigset_t mask;
	int o, rc;

	pbox_log_set_ident("pboxd");
	pbox_log_init_from_env();
	pboxd_config_defaults(&a.cfg);
	/* First pass: --help, --version and the config file, which the other options
	 * override. */
	opterr = 1;
	while ((o = getopt_long(argc, argv, "c:hV", g_opts, NULL)) != -1) {
		if (o == 'h') {
			usage(stdout);
			return 0;
		}
		if (o == 'V') {
			printf("pboxd %s\n", PBOX_VERSION_STRING);
			return 0;
		}
		if (o == 'c') {
			config_path = optarg;
		}
		if (o == '?') {
			fprintf(stderr, "see pboxd --help\n");
			return EX_USAGE;
		}
	}
	if (config_path != NULL) {
		rc = pboxd_config_load(&a.cfg, config_path, err, sizeof(err));
		if (rc != 0) {
			fprintf(stderr, "pboxd: %s\n", err);
			pboxd_config_free(&a.cfg);
			return EX_CONFIG;
		}
	}
	opterr = 0;
	rc = apply_cli(&a.cfg, argc, argv, &check_only);
	if (rc != 0) {
		pboxd_config_free(&a.cfg);
		return rc;
	}
	if (a.cfg.log_format >= 0) {
		pbox_log_set_format((enum pbox_log_format)a.cfg.log_format);
	}
	if (pboxd_config_check(&a.cfg, err, sizeof(err)) != 0) {
		fprintf(stderr, "pboxd: %s\n", err);
		pboxd_config_free(&a.cfg);
		return EX_CONFIG;
	}
	if (check_only) {
		if (pboxd_budget_report(&a.cfg, stdout) != 0) {
			fprintf(stderr, "pboxd: %s: a job can never start (see above)\n",
				config_path ? config_path : "(defaults)");
			pboxd_config_free(&a.cfg);
			return EX_CONFIG;
		}
		printf("%s: OK (%u job%s, %u core%s)\n", config_path ? config_path : "(defaults)",
		       a.cfg.njobs, a.cfg.njobs == 1 ? "" : "s", a.cfg.ncores,
		       a.cfg.ncores == 1 ? "" : "s");
		pboxd_config_free(&a.cfg);
		return 0;
	}
	if (a.cfg.njobs == 0) {
		PBOX_LOG_WARN(MAIN,
			      "no jobs configured: workers will be refused (add a jobs = ( ... ) "
			      "list to the configuration)");
	}
	/* Signals are taken through signalfd by the control loop; block them in every
	 * thread (the cores inherit the mask). */
	sigemptyset(&mask);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGUSR1);
	sigaddset(&mask, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &mask, NULL);

	raise_fd_limit();
	rc = pboxd_dp_start(&a.dp, &a.cfg);
	if (rc != 0) {
		pboxd_config_free(&a.cfg);
		return rc == -EINVAL ? EX_USAGE : EX_UNAVAILABLE;
	}
	/* The filter before the first admission, after the sockets it protects exist. */
	if (pboxd_xdp_start(&a.cfg, &a.xdp) != 0 ||
	    pboxd_dp_xdp_attach(&a.dp, pboxd_xdp_prog(a.xdp)) != 0) {
		pboxd_xdp_stop(a.xdp);
		pboxd_dp_stop(&a.dp);
		pboxd_config_free(&a.cfg);
		return EX_UNAVAILABLE;
	}
	a.sessions = pboxd_sessions_create(&a.cfg, &a.dp);
	if (a.sessions != NULL && a.xdp != NULL) {
		pboxd_sessions_set_publish_hook(a.sessions, pboxd_xdp_sync, a.xdp);
	}
	a.probe = NULL;
	a.control = a.sessions ? pboxd_control_open(&a.cfg, a.sessions, stats_cb, &a) : NULL;
	if (a.control != NULL && (pboxd_probe_create(&a.cfg, &a.probe) != 0 ||
				  pboxd_control_set_probe(a.control, a.probe) != 0)) {
		pboxd_control_close(a.control);
		a.control = NULL;
	}
	a.metrics = NULL;
	a.metrics_src = (struct pboxd_metrics_src){ metrics_stats, &a, a.sessions };
	if (a.control != NULL && a.cfg.metrics.enabled &&
	    (metrics_fds(&a.cfg.metrics) != 0 ||
	     (a.metrics = pbox_metrics_start(&a.cfg.metrics, "pboxd")) == NULL)) {
		pboxd_control_close(a.control);
		a.control = NULL;
	}
	if (a.control == NULL) {
		pboxd_probe_destroy(a.probe);
		pboxd_sessions_destroy(a.sessions);
		pboxd_xdp_stop(a.xdp);
		pboxd_dp_stop(&a.dp);
		pboxd_config_free(&a.cfg);
		return EX_UNAVAILABLE;
	}
	rc = run(&a);
	pbox_metrics_stop(a.metrics);
	pboxd_control_close(a.control);
	pboxd_probe_destroy(a.probe);
	pboxd_sessions_destroy(a.sessions);
	fprintf(stderr, "pboxd: final counters\n");
	pboxd_stats_print(stderr, &a.dp);
	pboxd_dp_transport_print(stderr, &a.dp);
	pboxd_xdp_stats_print(stderr, a.xdp);
	pboxd_xdp_stop(a.xdp);
	pboxd_dp_stop(&a.dp);
	pboxd_config_free(&a.cfg);
	return rc;
}
