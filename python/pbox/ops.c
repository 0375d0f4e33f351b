/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The operations of pbox.Client: push, pull, push_pull and init, each blocking or _async
 * (a Handle), and push_pull_many (several keys of one buffer, one Handle). Each checks
 * its arguments, exports the buffers into the Handle, which holds them until the
 * operation completes, and starts the operation on libpbox with the GIL held.
 */
#include "_pbox.h"

#include <errno.h>

static const struct ckey *lookup(struct client *self, PyObject *key_o, uint32_t *id)
{
	const struct ckey *k;

	if (pbox_py_check_open(self) < 0 || pbox_py_get_u32(key_o, "key", id) < 0) {
		return NULL;
	}
	if (self->keys == NULL) {
		PyErr_SetString(g_pbox_py_error, "no keys registered yet (call register first)");
		return NULL;
	}
	k = pbox_py_find_key(self, *id);
	if (k == NULL) {
		PyErr_Format(PyExc_KeyError, "key %u was not registered", *id);
	}
	return k;
}

static int check_len(const Py_buffer *v, const struct ckey *k, const char *role)
{
	Py_ssize_t have = v->len / 4;

	if ((uint64_t)have != k->nelem) {
		PyErr_Format(PyExc_ValueError,
			     "key %u: %s holds %zd float32 values but the key has %llu", k->id,
			     role, have, (unsigned long long)k->nelem);
		return -1;
	}
	return 0;
}

static int submit(struct handle *h, uint32_t key, uint32_t iter, const float *src, float *dst)
{
	switch (h->kind) {
	case OP_PUSH:
		return pbox_push_async(h->pc, key, iter, src, pbox_py_op_done, h);
	case OP_PULL:
		return pbox_pull_async(h->pc, key, iter, dst, pbox_py_op_done, h);
	case OP_PUSH_PULL:
		return pbox_push_pull_async(h->pc, key, iter, src, dst, pbox_py_op_done, h);
	case OP_INIT:
		return pbox_init_async(h->pc, key, src, pbox_py_op_done, h);
	}
	return -EINVAL;
}

static int set_notify(struct handle *h, PyObject *notify, PyObject *result)
{
	if (notify != NULL && notify != Py_None) {
		if (!PyObject_HasAttrString(notify, "set_result") ||
		    !PyObject_HasAttrString(notify, "set_exception")) {
			PyErr_Format(
				PyExc_TypeError,
				"notify must have set_result and set_exception (a future), not "
				"%.80s",
				Py_TYPE(notify)->tp_name);
			return -1;
		}
		Py_INCREF(notify);
		h->notify = notify;
	}
	if (result != NULL && result != Py_None) {
		Py_INCREF(result);
		h->result = result;
	}
	return 0;
}

/* One operation on one key; returns a started Handle or NULL with an exception. */
static struct handle *start_one(struct client *self, enum op_kind kind, PyObject *args,
				PyObject *kw)
{
	static const char *kwlist[] = { "key",    "iteration", "buffer", "out",
					"notify", "result",    NULL };
	static const char *kwlist_init[] = { "key", "buffer", "notify", "result", NULL };
	PyObject *key_o, *it_o = NULL, *buf_o, *out_o = Py_None, *notify = NULL, *result = NULL;
	const struct ckey *k;
	struct handle *h;
	uint32_t id, iter = 0;
	const float *src = NULL;
	float *dst = NULL;
	int rc;

	if (kind == OP_INIT) {
		if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|$OO", (char **)kwlist_init, &key_o,
						 &buf_o, &notify, &result)) {
			return NULL;
		}
	} else if (kind == OP_PUSH_PULL) {
		if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|O$OO", (char **)kwlist, &key_o,
						 &it_o, &buf_o, &out_o, &notify, &result)) {
			return NULL;
		}
	} else {
		static const char *kwl[] = {
			"key", "iteration", "buffer", "notify", "result", NULL
		};

		if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|$OO", (char **)kwl, &key_o, &it_o,
						 &buf_o, &notify, &result)) {
			return NULL;
		}
	}
	k = lookup(self, key_o, &id);
	if (k == NULL || (it_o != NULL && pbox_py_get_u32(it_o, "iteration", &iter) < 0)) {
		return NULL;
	}
	h = pbox_py_handle_new(kind, 1);
	if (h == NULL) {
		return NULL;
	}
	h->key = id;
	h->iter = iter;
	if (set_notify(h, notify, result) < 0) {
		goto err;
	}
	if (kind == OP_PULL || (kind == OP_PUSH_PULL && out_o == Py_None)) {
		/* pull, or push-pull in place: one writable view */
		const char *role = kind == OP_PULL ? "out" : "buffer";

		if (pbox_py_get_view(buf_o, true, role, id, &h->out) < 0) {
			goto err;
		}
		h->has_out = true;
		if (check_len(&h->out, k, role) < 0) {
			goto err;
		}
		dst = h->out.buf;
		src = dst;
	} else {
		const char *role = kind == OP_INIT ? "values" : "grad";

		if (pbox_py_get_view(buf_o, false, role, id, &h->in) < 0) {
			goto err;
		}
		h->has_in = true;
		if (check_len(&h->in, k, role) < 0) {
			goto err;
		}
		src = h->in.buf;
		if (kind == OP_PUSH_PULL) {
			if (pbox_py_get_view(out_o, true, "out", id, &h->out) < 0) {
				goto err;
			}
			h->has_out = true;
			if (check_len(&h->out, k, "out") < 0) {
				goto err;
			}
			dst = h->out.buf;
		}
	}
	/* The buffer adapter runs Python code, during which another thread may have closed
	 * the client: look again, and submit without letting go of the GIL. */
	if (pbox_py_check_open(self) < 0) {
		goto err;
	}
	h->pc = self->c;
	h->remaining = 1;
	Py_INCREF(h); /* held by the operation until its callback */
	rc = submit(h, id, iter, src, dst);
	if (rc < 0) {
		Py_DECREF(h);
		pbox_py_raise_last(rc);
		goto err;
	}
	return h;
err:
	Py_DECREF(h);
	return NULL;
}

static PyObject *run_sync(struct handle *h)
{
	PyObject *r;

	if (h == NULL) {
		return NULL;
	}
	if (pbox_py_handle_wait_done(h, -1) < 0) {
		Py_DECREF(h);
		return NULL;
	}
	r = pbox_py_handle_result(h);
	Py_DECREF(h);
	return r;
}

#define OP_METHODS(name, kind)                                                                \
	PyObject *pbox_py_client_op_##name(struct client *self, PyObject *args, PyObject *kw) \
	{                                                                                     \
		return run_sync(start_one(self, kind, args, kw));                             \
	}                                                                                     \
	PyObject *pbox_py_client_op_##name##_async(struct client *self, PyObject *args,       \
						   PyObject *kw)                              \
	{                                                                                     \
		return (PyObject *)start_one(self, kind, args, kw);                           \
	}

OP_METHODS(push, OP_PUSH)
OP_METHODS(pull, OP_PULL)
OP_METHODS(push_pull, OP_PUSH_PULL)
OP_METHODS(init, OP_INIT)

/*
 * push_pull_many(buffer, slices, notify=None, result=None): push-pull of several keys
 * whose values lie in one buffer, in place; slices are (key, iteration, offset) with the
 * offset in float32 elements. One Handle, completed when every key is.
 */
PyObject *pbox_py_client_push_pull_many(struct client *self, PyObject *args, PyObject *kw)
{
	static const char *kwlist[] = { "buffer", "slices", "notify", "result", NULL };
	PyObject *buf_o, *sl_o, *notify = NULL, *result = NULL, *seq = NULL;
	struct handle *h = NULL;
	struct {
		uint32_t id, iter;
		uint64_t off;
	} *ops = NULL;
	unsigned char *seen = NULL;
	Py_ssize_t n, total;
	float *base;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|OO:push_pull_many", (char **)kwlist, &buf_o,
					 &sl_o, &notify, &result) ||
	    pbox_py_check_open(self) < 0) {
		return NULL;
	}
	if (self->keys == NULL) {
		PyErr_SetString(g_pbox_py_error, "no keys registered yet (call register first)");
		return NULL;
	}
	seq = PySequence_Fast(sl_o, "slices must be a sequence of (key, iteration, offset)");
	if (seq == NULL) {
		return NULL;
	}
	n = PySequence_Fast_GET_SIZE(seq);
	if (n == 0 || n > (Py_ssize_t)self->nkeys) {
		PyErr_Format(PyExc_ValueError, "push_pull_many: %zd slices for %u registered keys",
			     n, self->nkeys);
		goto err;
	}
	h = pbox_py_handle_new(OP_PUSH_PULL, (uint32_t)n);
	ops = PyMem_Calloc((size_t)n, sizeof(*ops));
	seen = PyMem_Calloc(self->nkeys, 1);
	if (h == NULL || ops == NULL || seen == NULL) {
		if (h != NULL) {
			PyErr_NoMemory();
		}
		goto err;
	}
	if (set_notify(h, notify, result) < 0) {
		goto err;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
		const struct ckey *k;

		if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 3) {
			PyErr_Format(PyExc_TypeError,
				     "push_pull_many: slice %zd must be a tuple (key, iteration, "
				     "offset)",
				     i);
			goto err;
		}
		k = lookup(self, PyTuple_GET_ITEM(it, 0), &ops[i].id);
		if (k == NULL ||
		    pbox_py_get_u32(PyTuple_GET_ITEM(it, 1), "iteration", &ops[i].iter) < 0 ||
		    pbox_py_get_u64(PyTuple_GET_ITEM(it, 2), "offset", UINT64_MAX, &ops[i].off) <
			    0) {
			goto err;
		}
		if (seen[k - self->keys]) {
			PyErr_Format(PyExc_ValueError, "push_pull_many: key %u appears twice",
				     ops[i].id);
			goto err;
		}
		seen[k - self->keys] = 1;
	}
	if (pbox_py_get_view(buf_o, true, "buffer", ops[0].id, &h->out) < 0) {
		goto err;
	}
	h->has_out = true;
	total = h->out.len / 4;
	for (Py_ssize_t i = 0; i < n; i++) {
		const struct ckey *k = pbox_py_find_key(self, ops[i].id);

		if (ops[i].off > (uint64_t)total || k->nelem > (uint64_t)total - ops[i].off) {
			PyErr_Format(PyExc_ValueError,
				     "push_pull_many: key %u (%llu values at offset %llu) does not "
				     "fit in the buffer of %zd float32 values",
				     ops[i].id, (unsigned long long)k->nelem,
				     (unsigned long long)ops[i].off, total);
			goto err;
		}
	}
	/* As in start_one: the adapter may have let another thread close the client. */
	if (pbox_py_check_open(self) < 0) {
		goto err;
	}
	h->pc = self->c;
	h->key = ops[0].id;
	h->iter = ops[0].iter;
	h->remaining = (uint32_t)n;
	Py_INCREF(h); /* held by the operations until the last callback */
	base = h->out.buf;
	for (Py_ssize_t i = 0; i < n; i++) {
		float *p = base + ops[i].off;
		int rc = pbox_push_pull_async(h->pc, ops[i].id, ops[i].iter, p, p, pbox_py_op_done,
					      h);

		if (rc < 0) {
			if (i == 0) {
				h->remaining = 0;
				Py_DECREF(h);
				pbox_py_raise_last(rc);
				goto err;
			}
			/* Keys before i are in flight and complete through callbacks; the
			 * Handle reports this error once they have. */
			pbox_py_handle_note_error(h, rc, pbox_last_error());
			if (__atomic_sub_fetch(&h->remaining, (uint32_t)(n - i),
					       __ATOMIC_ACQ_REL) == 0) {
				pbox_py_handle_complete(h);
			}
			break;
		}
	}
	PyMem_Free(ops);
	PyMem_Free(seen);
	Py_DECREF(seq);
	return (PyObject *)h;
err:
	Py_XDECREF(h);
	PyMem_Free(ops);
	PyMem_Free(seen);
	Py_XDECREF(seq);
	return NULL;
}
