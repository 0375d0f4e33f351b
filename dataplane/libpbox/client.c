/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libpbox's public API (pbox/pbox.h): errors, admission (pbox_connect), the session's
 * getters and pbox_close. The rest of the client is in client_*.c (client_int.h).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client_int.h"
#include "common/hostport.h"
#include "common/log.h"
#include "transport/shm/shm.h"
#include "transport/udp/udp.h"

static __thread char g_errmsg[PBOX_CLIENT_ERRMSG_LEN];

int pbox_client_error(int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(g_errmsg, sizeof(g_errmsg), fmt, ap);
	va_end(ap);
	return err;
}

const char *pbox_last_error(void)
{
	return g_errmsg;
}

const char *pbox_version(void)
{
	return PBOX_VERSION_STRING;
}

int pbox_connect(const struct pbox_client_opts *o, struct pbox_client **out)
{
	struct pbox_client *c;
	json_t *resp = NULL;
	const char *mode;
	int rc;

	*out = NULL;
	if (o == NULL || o->token == NULL) {
		return pbox_client_error(-EINVAL,
					 "pbox_connect: options with a job token are required");
	}
	c = calloc(1, sizeof(*c));
	if (c == NULL) {
		return pbox_client_error(-ENOMEM, "out of memory");
	}
	c->opts = *o;
	c->ctl_fd = -1;
	c->wake_fd = -1;
	pthread_mutex_init(&c->lock, NULL);
	{
		/* pbox_wait's deadlines are CLOCK_MONOTONIC (abs_deadline): so is the condition
		 * variable's clock, or every finite wait would time out at once. */
		pthread_condattr_t ca;

		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&c->cond, &ca);
		pthread_condattr_destroy(&ca);
	}
	pbox_linebuf_init(&c->ctl_in);
	if (c->opts.timeout_ms == 0) {
		c->opts.timeout_ms = 30000;
	}
	snprintf(c->token, sizeof(c->token), "%s", o->token);
	c->opts.token = c->token;
	if (o->local_addr != NULL) {
		snprintf(c->local_addr, sizeof(c->local_addr), "%s", o->local_addr);
		c->opts.local_addr = c->local_addr;
	}
	if (o->fault != NULL) {
		snprintf(c->fault, sizeof(c->fault), "%s", o->fault);
		c->opts.fault = c->fault;
	}
	if (o->probe != NULL) {
		snprintf(c->probe_spec, sizeof(c->probe_spec), "%s", o->probe);
		c->opts.probe = c->probe_spec;
	}
	if (pbox_hostport_split(o->server ? o->server : "127.0.0.1:7000", false, 1, c->server_host,
				sizeof(c->server_host), &c->server_port) != 0) {
		rc = pbox_client_error(-EINVAL, "server address '%s': expected host:port",
				       o->server);
		goto err;
	}
	rc = pbox_client_ctl_connect(c);
	if (rc < 0) {
		goto err;
	}
	rc = pbox_client_ctl_call(c,
				  json_pack("{s:s, s:i, s:i, s:s, s:i}", "op", "hello", "job",
					    (json_int_t)o->job, "rank", (json_int_t)o->rank,
					    "token", o->token, "version", PBOX_CTL_PROTO_VERSION),
				  &resp);
	if (rc < 0) {
		goto err;
	}
	mode = json_string_value(json_object_get(resp, "mode"));
	c->info.job = o->job;
	c->info.rank = o->rank;
	c->info.workers = (uint32_t)json_integer_value(json_object_get(resp, "workers"));
	c->info.mode = mode && strcmp(mode, "server-optimizer") == 0 ? PBOX_JOB_SERVER_OPTIMIZER
		       : mode && strcmp(mode, "broadcast") == 0      ? PBOX_JOB_BROADCAST
								     : PBOX_JOB_AGGREGATE;
	if (c->info.mode == PBOX_JOB_BROADCAST) {
		char why[160];

		rc = pbox_update_parse_optimizer(json_object_get(resp, "optimizer"), &c->bc_opt,
						 &c->bc_params, why, sizeof(why));
		if (rc < 0) {
			json_decref(resp);
			rc = pbox_client_error(rc, "job %u: hello: %s", o->job, why);
			goto err;
		}
		snprintf(c->info.optimizer, sizeof(c->info.optimizer), "%s", c->bc_opt->name);
	}
	c->info.mean = json_string_value(json_object_get(resp, "reduce")) != NULL &&
		       strcmp(json_string_value(json_object_get(resp, "reduce")), "mean") == 0;
	json_decref(resp);
	*out = c;
	return 0;
err:
	pbox_close(c);
	return rc;
}

const char *pbox_transport(const struct pbox_client *c)
{
	return c != NULL ? c->transport : "";
}

int pbox_job_info(const struct pbox_client *c, struct pbox_job_info *info)
{
	if (c == NULL || info == NULL) {
		return pbox_client_error(-EINVAL, "pbox_job_info: NULL argument");
	}
	*info = c->info;
	return 0;
}

uint64_t pbox_client_rx_placed(struct pbox_client *c)
{
	uint64_t v;

	if (c == NULL || c->node == NULL) {
		return 0;
	}
	pthread_mutex_lock(&c->lock);
	v = c->rx_placed;
	pthread_mutex_unlock(&c->lock);
	return v;
}

size_t pbox_struct_size(const char *name)
{
	static const struct {
		const char *name;
		size_t size;
	} sizes[] = {
		{ "pbox_client_opts", sizeof(struct pbox_client_opts) },
		{ "pbox_key_info", sizeof(struct pbox_key_info) },
		{ "pbox_job_info", sizeof(struct pbox_job_info) },
		{ "pbox_client_stats", sizeof(struct pbox_client_stats) },
		{ "pbox_plan", sizeof(struct pbox_plan) },
	};

	for (size_t i = 0; name != NULL && i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		if (strcmp(name, sizes[i].name) == 0) {
			return sizes[i].size;
		}
	}
	return 0;
}

void pbox_client_stats(struct pbox_client *c, struct pbox_client_stats *st)
{
	memset(st, 0, sizeof(*st));
	if (c == NULL || c->node == NULL) {
		return;
	}
	pthread_mutex_lock(&c->lock);
	*st = c->stats;
	pthread_mutex_unlock(&c->lock);
}

void pbox_close(struct pbox_client *c)
{
	if (c == NULL) {
		return;
	}
	if (c->thread_started && pthread_equal(pthread_self(), c->thread)) {
		/* A completion callback cannot close its own client: the progress thread
		 * would have to join itself. */
		PBOX_LOG_ERR(CLIENT, "pbox_close called from a completion callback of the same "
				     "client; close it from another thread");
		return;
	}
	if (c->thread_started) {
		uint64_t one = 1;

		__atomic_store_n(&c->stop, true, __ATOMIC_RELEASE);
		if (write(c->wake_fd, &one, sizeof(one)) < 0) {
			/* the thread also wakes on its poll timeout */
		}
		pthread_join(c->thread, NULL);
	}
	if (c->ctl_fd >= 0) {
		json_t *bye = json_pack("{s:s}", "op", "leave");

		/* Best effort: a clean goodbye tells pboxd this is not a failure. */
		fcntl(c->ctl_fd, F_SETFL, fcntl(c->ctl_fd, F_GETFL) & ~O_NONBLOCK);
		pbox_ctl_send(c->ctl_fd, bye, 1000);
		json_decref(bye);
		shutdown(c->ctl_fd, SHUT_WR);
		{
			/* Wait briefly for pboxd's acknowledgement so the leave is processed
			 * before the connection drops. */
			struct pollfd p = { .fd = c->ctl_fd, .events = POLLIN };

			poll(&p, 1, 1000);
		}
		close(c->ctl_fd);
	}
	pbox_wprobe_destroy(c->probe); /* before the doorbell it rings goes */
	if (c->wake_fd >= 0) {
		close(c->wake_fd);
	}
	pbox_node_destroy(c->node);
	while (c->mem != NULL) { /* the shm client unmaps the shared ones */
		struct mem_block *b = c->mem;

		c->mem = b->next;
		if (!b->shared) {
			munmap(b->p, b->bytes);
		}
		free(b);
	}
	pbox_shm_client_close(c->shm);
	pbox_udp_close(c->udp);
	pbox_jobdesc_free(&c->desc);
	pbox_linebuf_free(&c->ctl_in);
	free(c->cores);
	free(c->ops);
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->cond);
	free(c);
}
