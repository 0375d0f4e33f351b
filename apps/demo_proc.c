/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * `pbox demo`'s process supervision: finding pboxd, starting it and the workers, waiting
 * for them (signals, exits, failures) while their events arrive, the --kill-appliance-at
 * restart, and stopping and reaping every child on every way out.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/ctlproto.h"
#include "demo.h"

static bool is_exec(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* pboxd: $PBOX_PBOXD, else the build tree's (../dataplane/pboxd from this program, in
 * build/apps/), else PATH. */
int demo_find_pboxd(struct demo *d)
{
	const char *env = getenv("PBOX_PBOXD"), *path = getenv("PATH");
	char dir[PATH_MAX], *slash;

	if (env != NULL && *env != '\0') {
		if (!is_exec(env)) {
			fprintf(stderr, "pbox demo: PBOX_PBOXD=%s: not an executable file\n", env);
			return -ENOENT;
		}
		snprintf(d->pboxd_path, sizeof(d->pboxd_path), "%s", env);
		return 0;
	}
	snprintf(dir, sizeof(dir), "%s", d->self_path);
	slash = strrchr(dir, '/');
	if (slash != NULL) {
		*slash = '\0';
		snprintf(d->pboxd_path, sizeof(d->pboxd_path), "%s/../dataplane/pboxd", dir);
		if (is_exec(d->pboxd_path)) {
			return 0;
		}
	}
	while (path != NULL && *path != '\0') {
		const char *end = strchr(path, ':');
		size_t n = end ? (size_t)(end - path) : strlen(path);

		if (n > 0 && n < sizeof(dir)) {
			snprintf(d->pboxd_path, sizeof(d->pboxd_path), "%.*s/pboxd", (int)n, path);
			if (is_exec(d->pboxd_path)) {
				return 0;
			}
		}
		path = end ? end + 1 : NULL;
	}
	fprintf(stderr,
		"pbox demo: pboxd not found: not at ../dataplane/pboxd from %s (a build tree) "
		"nor in PATH; set PBOX_PBOXD to its path\n",
		d->self_path);
	return -ENOENT;
}

/* fork + exec with the demo's signals unblocked, its own process group, stdout to out_fd
 * (or the log), stderr to the log file, and extra environment (NAME=VALUE, may be NULL). */
static pid_t spawn(struct demo *d, const char *const argv[], int out_fd, const char *logpath,
		   const char *const *env, int deathsig)
{
	int log = open(logpath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	pid_t pid;

	if (log < 0) {
		fprintf(stderr, "pbox demo: %s: cannot create: %s\n", logpath, strerror(errno));
		return -1;
	}
	pid = fork();
	if (pid < 0) {
		fprintf(stderr, "pbox demo: fork: %s\n", strerror(errno));
		close(log);
		return -1;
	}
	if (pid == 0) {
		int devnull = open("/dev/null", O_RDONLY);

		sigprocmask(SIG_SETMASK, &d->oldmask, NULL);
		signal(SIGPIPE, SIG_DFL); /* ignored dispositions survive exec */
		setpgid(0, 0);
		prctl(PR_SET_PDEATHSIG, deathsig);
		if (getppid() != d->self) {
			_exit(127); /* the demo died before the death signal was armed */
		}
		if (devnull >= 0) {
			dup2(devnull, STDIN_FILENO);
		}
		dup2(out_fd >= 0 ? out_fd : log, STDOUT_FILENO);
		dup2(log, STDERR_FILENO);
		for (size_t i = 0; env != NULL && env[i] != NULL; i++) {
			putenv((char *)env[i]);
		}
		execv(argv[0], (char *const *)argv);
		dprintf(STDERR_FILENO, "pbox demo: cannot run %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	close(log);
	return pid;
}

/* Print the last lines of a log, indented, to the demo's error output. */
static void show_tail(const char *what, const char *path)
{
	char buf[8192];
	FILE *f = fopen(path, "r");
	size_t n;
	long size;
	char *p, *start;
	int lines = 0;

	if (f == NULL) {
		return;
	}
	fseek(f, 0, SEEK_END);
	size = ftell(f);
	fseek(f, size > (long)sizeof(buf) - 1 ? size - (long)sizeof(buf) + 1 : 0, SEEK_SET);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	while (n > 0 && buf[n - 1] == '\n') {
		buf[--n] = '\0';
	}
	if (n == 0) {
		return;
	}
	start = buf;
	for (p = buf + n; p > buf; p--) {
		if (p[-1] == '\n' && ++lines == DEMO_LOG_TAIL) {
			start = p;
			break;
		}
	}
	fprintf(stderr, "---- last lines of %s (%s) ----\n%s\n", what, path, start);
}

/* Reap every child that has exited and record its status. */
static void reap(struct demo *d)
{
	for (;;) {
		int st;
		pid_t pid = waitpid(-1, &st, WNOHANG);

		if (pid <= 0) {
			return;
		}
		if (pid == d->pboxd) {
			d->pboxd = 0;
			d->pboxd_status = st;
			d->pboxd_reaped = true;
			continue;
		}
		for (uint32_t r = 0; r < d->o.workers; r++) {
			if (d->w[r].pid == pid) {
				d->w[r].pid = 0;
				d->w[r].status = st;
				d->w[r].reaped = true;
			}
		}
	}
}

static void describe_status(int st, char *buf, size_t len)
{
	if (WIFEXITED(st)) {
		snprintf(buf, len, "exited with status %d", WEXITSTATUS(st));
	} else if (WIFSIGNALED(st)) {
		snprintf(buf, len, "killed by signal %d (%s)", WTERMSIG(st),
			 strsignal(WTERMSIG(st)));
	} else {
		snprintf(buf, len, "stopped (status 0x%x)", st);
	}
}

/* Stop every child still running (SIGTERM, then SIGKILL after a grace period), reap all,
 * and remove the temporary directory unless asked to keep it. */
void demo_stop(struct demo *d)
{
	double deadline = pbox_mono_s() + DEMO_STOP_TIMEOUT_S;
	bool any;

	for (uint32_t r = 0; d->w != NULL && r < d->o.workers; r++) {
		if (d->w[r].pid > 0) {
			kill(d->w[r].pid, SIGTERM);
		}
	}
	if (d->pboxd > 0) {
		kill(d->pboxd, SIGTERM);
	}
	for (;;) {
		reap(d);
		any = d->pboxd > 0;
		for (uint32_t r = 0; d->w != NULL && r < d->o.workers; r++) {
			any |= d->w[r].pid > 0;
		}
		if (!any) {
			break;
		}
		if (pbox_mono_s() > deadline) {
			for (uint32_t r = 0; d->w != NULL && r < d->o.workers; r++) {
				if (d->w[r].pid > 0) {
					kill(d->w[r].pid, SIGKILL);
				}
			}
			if (d->pboxd > 0) {
				fprintf(stderr,
					"pbox demo: pboxd did not stop within %.0f s of SIGTERM; "
					"killing it\n",
					DEMO_STOP_TIMEOUT_S);
				kill(d->pboxd, SIGKILL);
			}
			deadline = pbox_mono_s() + 60;
		}
		usleep(10000);
	}
	for (uint32_t r = 0; d->w != NULL && r < d->o.workers; r++) {
		if (d->w[r].out_fd >= 0) {
			close(d->w[r].out_fd);
			d->w[r].out_fd = -1;
		}
		pbox_linebuf_free(&d->w[r].lb);
	}
	if (d->dir[0] != '\0') {
		if (d->o.keep_logs) {
			fprintf(stderr, "pbox demo: configuration and logs kept in %s\n", d->dir);
		} else {
			char path[PATH_MAX + 32];

			unlink(d->conf);
			unlink(d->pboxd_log);
			unlink(d->killed_log);
			unlink(d->ckpt_file);
			/* A write the kill interrupted; a file the restart did not accept. */
			snprintf(path, sizeof(path), "%s/.job-%u.ckpt.tmp", d->ckpt_dir,
				 DEMO_JOB_ID);
			unlink(path);
			snprintf(path, sizeof(path), "%s.rejected", d->ckpt_file);
			unlink(path);
			rmdir(d->ckpt_dir);
			for (uint32_t r = 0; d->w != NULL && r < d->o.workers; r++) {
				unlink(d->w[r].log);
			}
			snprintf(path, sizeof(path), "%s", d->dir);
			if (rmdir(path) != 0) {
				fprintf(stderr, "pbox demo: cannot remove %s: %s\n", path,
					strerror(errno));
			}
		}
		d->dir[0] = '\0';
	}
}

/* Wait for a fatal signal for up to ms; returns true if one arrived (and records it). */
static bool wait_signal(struct demo *d, int ms)
{
	struct pollfd p = { .fd = d->sigfd, .events = POLLIN };
	struct signalfd_siginfo si;

	if (poll(&p, 1, ms) <= 0) {
		return false;
	}
	while (read(d->sigfd, &si, sizeof(si)) == sizeof(si)) {
		if (si.ssi_signo != SIGCHLD) {
			d->interrupted = true;
		}
	}
	return d->interrupted;
}

static bool control_answers(uint16_t port)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				 .sin_port = htons(port) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	bool ok;

	if (fd < 0) {
		return false;
	}
	ok = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	close(fd);
	return ok;
}

/* Start pboxd and wait until its control port answers. 0, -EINTR or -EIO (reported). */
int demo_start_pboxd(struct demo *d)
{
	for (int attempt = 1; attempt <= DEMO_START_ATTEMPTS; attempt++) {
		const char *argv[6] = { d->pboxd_path, "-c", d->conf, NULL, NULL, NULL };
		double deadline;
		int rc;

		rc = demo_pick_ports(d);
		if (rc < 0) {
			fprintf(stderr, "pbox demo: no free loopback ports: %s\n", strerror(-rc));
			return -EIO;
		}
		rc = demo_write_config(d);
		if (rc < 0) {
			return -EIO;
		}
		if (d->o.fault != NULL) {
			argv[3] = "--fault";
			argv[4] = d->o.fault;
		}
		d->pboxd = spawn(d, argv, -1, d->pboxd_log, NULL, SIGTERM);
		if (d->pboxd < 0) {
			d->pboxd = 0;
			return -EIO;
		}
		d->pboxd_reaped = false;
		deadline = pbox_mono_s() + DEMO_START_TIMEOUT_S;
		while (!control_answers(d->tcp_port)) {
			if (wait_signal(d, 50)) {
				return -EINTR;
			}
			reap(d);
			if (d->pboxd_reaped) {
				break;
			}
			if (pbox_mono_s() > deadline) {
				fprintf(stderr,
					"pbox demo: pboxd did not open its control port %s within "
					"%.0f "
					"s\n",
					d->control, DEMO_START_TIMEOUT_S);
				show_tail("the pboxd log", d->pboxd_log);
				return -EIO;
			}
		}
		if (!d->pboxd_reaped) {
			return 0;
		}
		/* 69 (EX_UNAVAILABLE): a port was taken between our check and its bind. */
		if (WIFEXITED(d->pboxd_status) && WEXITSTATUS(d->pboxd_status) == 69 &&
		    attempt < DEMO_START_ATTEMPTS) {
			continue;
		}
		{
			char how[128];

			describe_status(d->pboxd_status, how, sizeof(how));
			fprintf(stderr, "pbox demo: pboxd (%s) %s at start\n", d->pboxd_path, how);
			show_tail("the pboxd log", d->pboxd_log);
		}
		return -EIO;
	}
	return -EIO;
}

int demo_start_workers(struct demo *d)
{
	char fault_env[512], token_env[64];
	const char *env[4] = { "OPENBLAS_NUM_THREADS=1", token_env, NULL, NULL };

	/* The token goes in the environment, which only this user can read
	 * (/proc/<pid>/environ), not on the command line, which everyone can. */
	snprintf(token_env, sizeof(token_env), "PBOX_TOKEN=%s", d->token);
	if (d->o.fault != NULL) {
		snprintf(fault_env, sizeof(fault_env), "PBOX_FAULT=%s", d->o.fault);
		env[2] = fault_env;
	}
	for (uint32_t r = 0; r < d->o.workers; r++) {
		struct worker *w = &d->w[r];
		char rank[16], workers[16], epochs[16], batch[16], seed[32], job[16], steps[32];
		char slow[32];
		const char *argv[40];
		int n = 0, pipefd[2];

		snprintf(rank, sizeof(rank), "%u", r);
		snprintf(workers, sizeof(workers), "%u", d->o.workers);
		snprintf(epochs, sizeof(epochs), "%u", d->o.epochs);
		snprintf(batch, sizeof(batch), "%u", d->o.batch);
		snprintf(seed, sizeof(seed), "%llu", (unsigned long long)d->o.seed);
		snprintf(job, sizeof(job), "%u", DEMO_JOB_ID);
		snprintf(steps, sizeof(steps), "%llu", (unsigned long long)d->o.max_steps);
		argv[n++] = d->self_path;
		argv[n++] = "train";
		argv[n++] = "--json";
		argv[n++] = "--server";
		argv[n++] = d->control;
		argv[n++] = "--job";
		argv[n++] = job;
		argv[n++] = "--rank";
		argv[n++] = rank;
		argv[n++] = "--workers";
		argv[n++] = workers;
		argv[n++] = "--epochs";
		argv[n++] = epochs;
		argv[n++] = "--batch";
		argv[n++] = batch;
		argv[n++] = "--seed";
		argv[n++] = seed;
		if (d->o.max_steps != 0) {
			argv[n++] = "--max-steps";
			argv[n++] = steps;
		}
		if (d->o.data_dir != NULL) {
			argv[n++] = "--data";
			argv[n++] = d->o.data_dir;
		}
		if (r == 0 && d->o.save_model != NULL) {
			argv[n++] = "--save-model";
			argv[n++] = d->o.save_model;
		}
		if (r == d->o.slow_rank) {
			snprintf(slow, sizeof(slow), "%g", d->o.slow_factor);
			argv[n++] = "--slow-factor";
			argv[n++] = slow;
		}
		if (d->o.exact_lag) {
			argv[n++] = "--exact-lag";
		}
		argv[n] = NULL;
		if (pipe2(pipefd, O_CLOEXEC) != 0) {
			fprintf(stderr, "pbox demo: pipe: %s\n", strerror(errno));
			return -EIO;
		}
		w->pid = spawn(d, argv, pipefd[1], w->log, env, SIGKILL);
		close(pipefd[1]);
		if (w->pid < 0) {
			w->pid = 0;
			close(pipefd[0]);
			return -EIO;
		}
		w->out_fd = pipefd[0];
		fcntl(w->out_fd, F_SETFL, O_NONBLOCK);
	}
	return 0;
}

static void report_worker_failure(struct demo *d, struct worker *w)
{
	char how[128];

	if (w->reaped) {
		describe_status(w->status, how, sizeof(how));
	} else {
		snprintf(how, sizeof(how), "closed its output without finishing");
	}
	demo_clear_bar(d);
	fflush(d->out);
	fprintf(stderr, "pbox demo: rank %u failed: %s%s%s\n", w->rank, how,
		w->error[0] ? ": " : "", w->error);
	if (w->error[0] == '\0') {
		char what[32];

		snprintf(what, sizeof(what), "rank %u's log", w->rank);
		show_tail(what, w->log);
	}
}

/*
 * --kill-appliance-at: kill -9 pboxd (its state survives only in the checkpoint file), stop
 * the workers (their operations would only time out), then start pboxd again with the same
 * configuration and the workers again: they register, get the restored version in the
 * reply and resume from it (see the README's resume contract).
 */
static int kill_and_restart(struct demo *d)
{
	double deadline = pbox_mono_s() + DEMO_STOP_TIMEOUT_S;
	bool any = true;

	d->killed = true;
	d->killed_at = demo_min_steps(d);
	kill(d->pboxd, SIGKILL);
	for (uint32_t r = 0; r < d->o.workers; r++) {
		if (d->w[r].pid > 0) {
			kill(d->w[r].pid, SIGKILL);
		}
	}
	while (any && pbox_mono_s() < deadline) {
		usleep(10000);
		reap(d);
		any = d->pboxd > 0;
		for (uint32_t r = 0; r < d->o.workers; r++) {
			any |= d->w[r].pid > 0;
		}
	}
	if (any) {
		fprintf(stderr, "pbox demo: killed processes did not exit\n");
		return -EIO;
	}
	rename(d->pboxd_log, d->killed_log);
	for (uint32_t r = 0; r < d->o.workers; r++) {
		struct worker *w = &d->w[r];

		if (w->out_fd >= 0) {
			close(w->out_fd);
			w->out_fd = -1;
		}
		pbox_linebuf_free(&w->lb);
		pbox_linebuf_init(&w->lb);
		w->reaped = w->ready = w->done = false;
		w->status = 0;
		w->error[0] = '\0';
	}
	d->nready = d->ndone = 0;
	demo_clear_bar(d);
	fprintf(d->out,
		"pbox demo: killed pboxd (SIGKILL) at step %llu; restarting it and the workers, "
		"which resume from its last checkpoint\n",
		(unsigned long long)d->killed_at);
	fflush(d->out);
	return demo_start_pboxd(d) == 0 && demo_start_workers(d) == 0 ? 0 : -EIO;
}

/*
 * Follow the run until every worker is done (0), one fails or pboxd dies (-EIO,
 * reported), or a signal asks to stop (-EINTR).
 */
int demo_follow(struct demo *d)
{
	struct pollfd *p = calloc(d->o.workers + 1, sizeof(*p));
	int rc = 0;

	if (p == NULL) {
		return -ENOMEM;
	}
	for (;;) {
		nfds_t np = 0;
		bool all_ok = true;

		p[np++] = (struct pollfd){ .fd = d->sigfd, .events = POLLIN };
		for (uint32_t r = 0; r < d->o.workers; r++) {
			if (d->w[r].out_fd >= 0) {
				p[np++] = (struct pollfd){ .fd = d->w[r].out_fd, .events = POLLIN };
			}
		}
		if (poll(p, np, d->tty ? 200 : 500) < 0 && errno != EINTR) {
			rc = -errno;
			break;
		}
		if (wait_signal(d, 0)) {
			rc = -EINTR;
			break;
		}
		for (uint32_t r = 0; r < d->o.workers; r++) {
			demo_drain(d, &d->w[r]);
		}
		if (d->o.kill_at != 0 && !d->killed && d->nready == d->o.workers &&
		    demo_min_steps(d) >= d->o.kill_at && access(d->ckpt_file, F_OK) == 0) {
			rc = kill_and_restart(d);
			if (rc != 0) {
				break;
			}
			continue;
		}
		reap(d);
		for (uint32_t r = 0; r < d->o.workers && rc == 0; r++) {
			struct worker *w = &d->w[r];

			if (w->reaped) {
				demo_drain(d, w); /* its last events */
			}
			if ((w->reaped &&
			     (!WIFEXITED(w->status) || WEXITSTATUS(w->status) != 0 || !w->done)) ||
			    (w->out_fd < 0 && !w->done)) {
				if (w->out_fd >= 0 || !w->reaped) {
					/* wait briefly for the exit status to name the cause */
					for (int i = 0; i < 50 && !w->reaped; i++) {
						usleep(10000);
						reap(d);
					}
					demo_drain(d, w);
				}
				report_worker_failure(d, w);
				rc = -EIO;
			}
			all_ok &= w->reaped && w->done;
		}
		if (rc != 0) {
			break;
		}
		if (d->pboxd_reaped) {
			char how[128];

			describe_status(d->pboxd_status, how, sizeof(how));
			demo_clear_bar(d);
			fprintf(stderr, "pbox demo: pboxd %s while the workers were training\n",
				how);
			show_tail("the pboxd log", d->pboxd_log);
			rc = -EIO;
			break;
		}
		if (all_ok) {
			break;
		}
		demo_show_progress(d, false);
	}
	free(p);
	return rc;
}

/* Stop pboxd after a good run; it must exit cleanly. */
int demo_stop_pboxd(struct demo *d)
{
	double deadline = pbox_mono_s() + DEMO_STOP_TIMEOUT_S;
	char how[128];

	if (d->pboxd > 0) {
		kill(d->pboxd, SIGTERM);
	}
	while (d->pboxd > 0 && pbox_mono_s() < deadline) {
		usleep(10000);
		reap(d);
	}
	if (d->pboxd > 0) {
		return -ETIMEDOUT; /* demo_stop() kills it and says so */
	}
	if (WIFEXITED(d->pboxd_status) && WEXITSTATUS(d->pboxd_status) == 0) {
		return 0;
	}
	describe_status(d->pboxd_status, how, sizeof(how));
	fprintf(stderr, "pbox demo: pboxd %s when stopped\n", how);
	show_tail("the pboxd log", d->pboxd_log);
	return -EIO;
}
