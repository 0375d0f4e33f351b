/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libpbox's operations on keys: submitting init / push / pull / push-pull to the progress
 * thread, and waiting for them (blocking and asynchronous forms).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client_int.h"

static int start(struct pbox_client *c, enum pbox_op_kind kind, uint32_t key_id, uint32_t iter,
		 const float *src, float *dst, pbox_done_fn cb, void *arg)
{
	int64_t k;
	struct cop *cp;
	bool ring;

	if (c == NULL || c->node == NULL) {
		return pbox_client_error(-ENOTCONN,
					 "no keys registered yet (call pbox_register first)");
	}
	k = pbox_jobdesc_find_key(&c->desc, key_id);
	if (k < 0) {
		return pbox_client_error(-ENOENT, "key %u was not registered", key_id);
	}
	if ((src == NULL && kind != PBOX_OP_PULL) ||
	    (dst == NULL && (kind == PBOX_OP_PULL || kind == PBOX_OP_PUSH_PULL))) {
		return pbox_client_error(-EINVAL, "key %u: NULL buffer", key_id);
	}
	pthread_mutex_lock(&c->lock);
	if (c->fail_err != 0) {
		int e = c->fail_err;

		pbox_client_error(e, "%s", c->fail_msg);
		pthread_mutex_unlock(&c->lock);
		return e;
	}
	cp = NULL;
	for (uint32_t l = 0; l < c->credits; l++) {
		if (c->ops[k * c->credits + l].state != COP_SUBMITTED) {
			cp = &c->ops[k * c->credits + l];
			break;
		}
	}
	if (cp == NULL) {
		pthread_mutex_unlock(&c->lock);
		return pbox_client_error(
			-EBUSY,
			"key %u already has %u operation(s) in flight (the job allows %u "
			"unacknowledged contribution(s) per chunk); wait for one first",
			key_id, c->credits, c->credits);
	}
	memset(&cp->op, 0, sizeof(cp->op));
	cp->op.kind = kind;
	cp->op.key = (uint32_t)k;
	cp->op.iter = iter;
	cp->op.src = src;
	cp->op.dst = dst;
	cp->cb = cb;
	cp->cb_arg = arg;
	cp->state = COP_SUBMITTED;
	cp->next = NULL;
	cp->waited = false;
	/* The doorbell only for the first of a batch: the progress thread takes the whole
	 * list at once (drain_submissions), so one ring covers everything appended before
	 * it does. */
	ring = c->sub_head == NULL;
	if (c->sub_tail) {
		c->sub_tail->next = cp;
	} else {
		c->sub_head = cp;
	}
	c->sub_tail = cp;
	pthread_mutex_unlock(&c->lock);
	if (ring) {
		uint64_t one = 1;

		if (write(c->wake_fd, &one, sizeof(one)) < 0) {
			/* the eventfd cannot overflow with increments of 1; ignore */
		}
	}
	return 0;
}

static int abs_deadline(struct timespec *ts, int timeout_ms)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += timeout_ms / 1000;
	ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
	return 0;
}

/* Wait for cp under c->lock (held). Returns the op status or -ETIMEDOUT. */
static int wait_locked(struct pbox_client *c, struct cop *cp, const struct timespec *until)
{
	while (cp->state == COP_SUBMITTED) {
		int rc;

		cp->waited = true; /* op_done signals its completion */
		rc = until ? pthread_cond_timedwait(&c->cond, &c->lock, until)
			   : pthread_cond_wait(&c->cond, &c->lock);

		if (rc == ETIMEDOUT && cp->state == COP_SUBMITTED) {
			return pbox_client_error(
				-ETIMEDOUT,
				"waiting for key %u (iteration %u): timed out; the operation "
				"is still in flight",
				c->desc.keys[cp->op.key].id, cp->op.iter);
		}
	}
	if (cp->state == COP_DONE) {
		cp->state = COP_FREE;
		if (cp->op.status < 0) {
			return pbox_client_error(cp->op.status, "%s", cp->op.errmsg);
		}
		return cp->op.status;
	}
	return 0;
}

/* Wait for every operation slot of key index k (lock held); first error wins. */
static int wait_key_locked(struct pbox_client *c, uint32_t k, const struct timespec *until)
{
	int first = 0;
	char msg[PBOX_CLIENT_ERRMSG_LEN] = "";

	for (uint32_t l = 0; l < c->credits; l++) {
		int rc = wait_locked(c, &c->ops[k * c->credits + l], until);

		if (rc < 0 && first == 0) {
			first = rc;
			snprintf(msg, sizeof(msg), "%s", pbox_last_error());
		}
	}
	if (first < 0) {
		(void)pbox_client_error(first, "%s", msg);
	}
	return first;
}

int pbox_wait(struct pbox_client *c, uint32_t key_id, int timeout_ms)
{
	struct timespec until;
	int64_t k;
	int rc;

	if (c == NULL || c->node == NULL) {
		return pbox_client_error(-ENOTCONN, "no keys registered yet");
	}
	k = pbox_jobdesc_find_key(&c->desc, key_id);
	if (k < 0) {
		return pbox_client_error(-ENOENT, "key %u was not registered", key_id);
	}
	if (timeout_ms >= 0) {
		abs_deadline(&until, timeout_ms);
	}
	pthread_mutex_lock(&c->lock);
	rc = wait_key_locked(c, (uint32_t)k, timeout_ms >= 0 ? &until : NULL);
	pthread_mutex_unlock(&c->lock);
	return rc;
}

int pbox_wait_all(struct pbox_client *c, int timeout_ms)
{
	struct timespec until;
	int first = 0;
	char msg[PBOX_CLIENT_ERRMSG_LEN] = "";

	if (c == NULL || c->node == NULL) {
		return pbox_client_error(-ENOTCONN, "no keys registered yet");
	}
	if (timeout_ms >= 0) {
		abs_deadline(&until, timeout_ms);
	}
	pthread_mutex_lock(&c->lock);
	/* Last key first: operations complete about in the order they were started, so
	 * waiting for the last one first wakes this thread about once, not once per key.
	 * The error reported is still the one of the lowest key that failed. */
	for (uint32_t k = c->desc.nkeys; k-- > 0;) {
		int rc = wait_key_locked(c, k, timeout_ms >= 0 ? &until : NULL);

		if (rc < 0) {
			first = rc;
			snprintf(msg, sizeof(msg), "%s", pbox_last_error());
		}
	}
	pthread_mutex_unlock(&c->lock);
	if (first < 0) {
		(void)pbox_client_error(first, "%s", msg);
	}
	return first;
}

static int sync_op(struct pbox_client *c, enum pbox_op_kind kind, uint32_t key, uint32_t iter,
		   const float *src, float *dst)
{
	int rc = start(c, kind, key, iter, src, dst, NULL, NULL);

	return rc < 0 ? rc : pbox_wait(c, key, -1);
}

int pbox_init(struct pbox_client *c, uint32_t key, const float *values)
{
	return sync_op(c, PBOX_OP_INIT, key, 0, values, NULL);
}

int pbox_push(struct pbox_client *c, uint32_t key, uint32_t iter, const float *grad)
{
	return sync_op(c, PBOX_OP_PUSH, key, iter, grad, NULL);
}

int pbox_pull(struct pbox_client *c, uint32_t key, uint32_t iter, float *out)
{
	return sync_op(c, PBOX_OP_PULL, key, iter, NULL, out);
}

int pbox_push_pull(struct pbox_client *c, uint32_t key, uint32_t iter, const float *grad,
		   float *out)
{
	return sync_op(c, PBOX_OP_PUSH_PULL, key, iter, grad, out);
}

int pbox_init_async(struct pbox_client *c, uint32_t key, const float *values, pbox_done_fn cb,
		    void *arg)
{
	return start(c, PBOX_OP_INIT, key, 0, values, NULL, cb, arg);
}

int pbox_push_async(struct pbox_client *c, uint32_t key, uint32_t iter, const float *grad,
		    pbox_done_fn cb, void *arg)
{
	return start(c, PBOX_OP_PUSH, key, iter, grad, NULL, cb, arg);
}

int pbox_pull_async(struct pbox_client *c, uint32_t key, uint32_t iter, float *out, pbox_done_fn cb,
		    void *arg)
{
	return start(c, PBOX_OP_PULL, key, iter, NULL, out, cb, arg);
}

int pbox_push_pull_async(struct pbox_client *c, uint32_t key, uint32_t iter, const float *grad,
			 float *out, pbox_done_fn cb, void *arg)
{
	return start(c, PBOX_OP_PUSH_PULL, key, iter, grad, out, cb, arg);
}

int pbox_client_update_cfg(const struct pbox_client *c, const struct pbox_optimizer_ops **opt,
			   struct pbox_opt_params *params, const struct pbox_jobdesc **desc)
{
	if (c == NULL || c->node == NULL) {
		return pbox_client_error(-ENOTCONN,
					 "no keys registered yet (call pbox_register first)");
	}
	if (c->info.mode != PBOX_JOB_BROADCAST || c->bc_opt == NULL) {
		return pbox_client_error(-EINVAL,
					 "job %u is not a broadcast job (mode = \"broadcast\")",
					 c->info.job);
	}
	*opt = c->bc_opt;
	*params = c->bc_params;
	*desc = &c->desc;
	return 0;
}

uint32_t pbox_resume_version(const struct pbox_client *c)
{
	return c != NULL ? c->resume_version : 0;
}

int64_t pbox_result_version(struct pbox_client *c, uint32_t key_id)
{
	int64_t k, v;

	if (c == NULL || c->node == NULL) {
		return pbox_client_error(-ENOTCONN, "no keys registered yet");
	}
	k = pbox_jobdesc_find_key(&c->desc, key_id);
	if (k < 0) {
		return pbox_client_error(-ENOENT, "key %u was not registered", key_id);
	}
	pthread_mutex_lock(&c->lock);
	v = 0;
	for (uint32_t l = 0; l < c->credits; l++) {
		v = PBOX_MAX(v, (int64_t)c->ops[k * c->credits + l].version);
	}
	pthread_mutex_unlock(&c->lock);
	return v;
}
