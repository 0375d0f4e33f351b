/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * `pbox demo`: the whole product on one machine. Writes a pboxd configuration with one
 * server-optimizer (or, --mode broadcast, broadcast) job into a fresh temporary directory, starts
 * pboxd on free loopback ports, starts N `pbox train` workers (this same executable) as the job's
 * ranks, and follows their JSON event streams: a progress bar per epoch, the loss and accuracy of
 * each epoch summed over all ranks, the bytes on the wire, and at the end the final test
 * accuracy and the throughput.
 *
 * Children run in their own process group (so a terminal's Ctrl-C reaches only the demo,
 * which then stops them in order) with a parent-death signal (so they cannot outlive a
 * demo that is killed). Every way out - success, a failed worker, pboxd dying, bad
 * options, SIGINT/SIGTERM/SIGHUP/SIGQUIT - goes through demo_stop(), which stops and
 * reaps every child this process started and removes the temporary directory.
 *
 * This file is the command itself: the run's setup (temporary directory, token, tables)
 * and the order of its steps. The steps live in the files demo.h lists.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "cli.h"
#include "common/clock.h"
#include "common/ctlproto.h"
#include "demo.h"

static int setup(struct demo *d)
{
	const char *tmpdir;
	uint8_t rnd[16];
	ssize_t n;

	n = readlink("/proc/self/exe", d->self_path, sizeof(d->self_path) - 1);
	if (n <= 0) {
		fprintf(stderr, "pbox demo: cannot find this program's path: %s\n",
			strerror(errno));
		return -EIO;
	}
	d->self_path[n] = '\0';
	if (demo_find_pboxd(d) != 0) {
		return -ENOENT;
	}
	/* A fresh secret per run, so nobody else on the machine can join the job: pboxd reads
	 * it from a 0600 file in a 0700 directory, the workers from their environment. */
	if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) {
		fprintf(stderr, "pbox demo: getrandom: %s\n", strerror(errno));
		return -EIO;
	}
	for (size_t i = 0; i < sizeof(rnd); i++) {
		snprintf(d->token + 2 * i, 3, "%02x", rnd[i]);
	}
	tmpdir = getenv("TMPDIR");
	/* mkdtemp(3) replaces the six X of the template with a unique name. */
	snprintf(d->dir, sizeof(d->dir), "%s/pbox-demo-XXXXXX",
		 tmpdir != NULL && *tmpdir != '\0' ? tmpdir : "/tmp");
	if (mkdtemp(d->dir) == NULL) {
		fprintf(stderr, "pbox demo: cannot create a temporary directory %s: %s\n", d->dir,
			strerror(errno));
		d->dir[0] = '\0';
		return -EIO;
	}
	snprintf(d->conf, sizeof(d->conf), "%s/pboxd.conf", d->dir);
	snprintf(d->pboxd_log, sizeof(d->pboxd_log), "%s/pboxd.log", d->dir);
	snprintf(d->ckpt_dir, sizeof(d->ckpt_dir), "%s/checkpoints", d->dir);
	snprintf(d->ckpt_file, sizeof(d->ckpt_file), "%s/job-%u.ckpt", d->ckpt_dir, DEMO_JOB_ID);
	snprintf(d->killed_log, sizeof(d->killed_log), "%s/pboxd-killed.log", d->dir);
	d->w = calloc(d->o.workers, sizeof(*d->w));
	d->ep = calloc(d->o.epochs, sizeof(*d->ep));
	if (d->w == NULL || d->ep == NULL) {
		fprintf(stderr, "pbox demo: no memory\n");
		return -ENOMEM;
	}
	for (uint32_t r = 0; r < d->o.workers; r++) {
		d->w[r].rank = r;
		d->w[r].out_fd = -1;
		pbox_linebuf_init(&d->w[r].lb);
		snprintf(d->w[r].log, sizeof(d->w[r].log), "%s/worker-%u.log", d->dir, r);
	}
	return 0;
}

int pbox_cmd_demo(int argc, char **argv)
{
	struct demo d;
	sigset_t mask;
	int rc;

	memset(&d, 0, sizeof(d));
	d.sigfd = -1;
	d.t_start = pbox_mono_s();
	rc = demo_parse(argc, argv, &d.o);
	if (rc != 0) {
		return rc > 0 ? 0 : 64;
	}
	d.out = d.o.json ? stderr : stdout;
	/* A closed output (pbox demo | head) must not kill the demo before it has stopped
	 * its children; writes just fail. */
	signal(SIGPIPE, SIG_IGN);
	d.tty = isatty(fileno(d.out));
	d.self = getpid();
	/* Signals become events on a descriptor, so the loop can stop the children in order
	 * whatever it is doing; children get the original mask back. */
	sigemptyset(&mask);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGHUP);
	sigaddset(&mask, SIGQUIT);
	sigaddset(&mask, SIGCHLD);
	sigprocmask(SIG_BLOCK, &mask, &d.oldmask);
	d.sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	if (d.sigfd < 0) {
		fprintf(stderr, "pbox demo: signalfd: %s\n", strerror(errno));
		return 1;
	}
	rc = setup(&d);
	if (rc == 0) {
		char mom[48] = "";

		if (strcmp(d.o.optimizer, "momentum") == 0 || strcmp(d.o.optimizer, "nag") == 0) {
			snprintf(mom, sizeof(mom), " momentum %g", d.o.momentum);
		}
		fprintf(d.out,
			"pbox demo: %s%u worker%s, %u epoch%s, global batch %u, %s lr %g%s, "
			"%sdeterministic, pboxd on %u core%s%s%s\n",
			demo_is_broadcast(&d) ? "broadcast job, " : "", d.o.workers,
			d.o.workers == 1 ? "" : "s", d.o.epochs, d.o.epochs == 1 ? "" : "s",
			d.o.batch, d.o.optimizer, d.o.lr, mom, d.o.deterministic ? "" : "not ",
			d.o.cores, d.o.cores == 1 ? "" : "s", d.o.fault ? ", faults " : "",
			d.o.fault ? d.o.fault : "");
		fflush(d.out);
		rc = demo_start_pboxd(&d);
	}
	if (rc == 0) {
		rc = demo_start_workers(&d);
	}
	if (rc == 0) {
		rc = demo_follow(&d);
	}
	if (rc == 0 && demo_is_broadcast(&d) && !demo_replicas_identical(&d)) {
		/* Every rank applies the same aggregates in the same order: a difference is a
		 * defect, not noise. */
		fprintf(stderr, "pbox demo: broadcast job: the ranks' final models differ:");
		for (uint32_t r = 0; r < d.o.workers; r++) {
			fprintf(stderr, " rank %u crc32c %08x", r, d.w[r].model_crc);
		}
		fprintf(stderr, "\n");
		rc = -EPROTO;
	}
	if (rc == 0 && d.o.kill_at != 0 && !d.killed) {
		fprintf(stderr,
			"pbox demo: --kill-appliance-at %llu: the training ended before the "
			"workers "
			"were past that step with a checkpoint written; pboxd was not killed\n",
			(unsigned long long)d.o.kill_at);
	}
	if (rc == 0) {
		demo_fetch_appliance_stats(&d);
		rc = demo_stop_pboxd(&d);
	}
	if (rc == -EINTR || d.interrupted) {
		demo_clear_bar(&d);
		fprintf(stderr, "pbox demo: interrupted; stopping pboxd and the workers\n");
		rc = -EINTR;
	}
	demo_stop(&d);
	if (rc == 0) {
		demo_print_summary(&d);
	}
	if (d.o.json) {
		demo_print_json(&d, rc,
				rc == -EINTR ? "interrupted" : "failed; see the messages above");
	}
	json_decref(d.appliance);
	free(d.w);
	free(d.ep);
	close(d.sigfd);
	return rc == 0 ? 0 : (rc == -EINTR ? 130 : 1);
}
