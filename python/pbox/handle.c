/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox.Handle: one operation, or a group of operations on several keys of one buffer, in
 * flight. libpbox's progress thread completes it (pbox_py_op_done, one callback per key):
 * the last callback wakes the waiters, who need no GIL, then takes the GIL once to
 * complete the notify object and release the buffers. Handle.wait sleeps with the GIL
 * released.
 */
#include "_pbox.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* Handle.wait sleeps in slices this long so that Ctrl-C (signals) is noticed. */
#define WAIT_SLICE_NS 100000000ll

static const char *const g_op_names[] = {
	[OP_PUSH] = "push",
	[OP_PULL] = "pull",
	[OP_PUSH_PULL] = "push-pull",
	[OP_INIT] = "init",
};

__thread bool g_pbox_py_progress_thread; /* see _pbox.h */

struct handle *pbox_py_handle_new(enum op_kind kind, uint32_t nops)
{
	struct handle *h = PyObject_New(struct handle, &g_pbox_py_handle_type);
	pthread_condattr_t ca;

	if (h == NULL) {
		return NULL;
	}
	h->pc = NULL;
	h->kind = kind;
	h->key = 0;
	h->iter = 0;
	h->nops = nops;
	h->has_in = h->has_out = false;
	h->notify = h->result = NULL;
	h->remaining = 0;
	h->done = false;
	h->status = 0;
	h->msg[0] = '\0';
	pthread_mutex_init(&h->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&h->cond, &ca);
	pthread_condattr_destroy(&ca);
	return h;
}

/* GIL held. Release what the operation borrowed. */
static void handle_release_refs(struct handle *h)
{
	if (h->has_in) {
		PyBuffer_Release(&h->in);
		h->has_in = false;
	}
	if (h->has_out) {
		PyBuffer_Release(&h->out);
		h->has_out = false;
	}
	Py_CLEAR(h->notify);
	Py_CLEAR(h->result);
}

static void handle_dealloc(struct handle *h)
{
	handle_release_refs(h);
	pthread_mutex_destroy(&h->lock);
	pthread_cond_destroy(&h->cond);
	PyObject_Free(h);
}

static PyObject *handle_exception(struct handle *h)
{
	int err = -h->status;

	return pbox_py_new_exception(err, h->msg);
}

/* GIL held: complete the notify object (set_result / set_exception). */
static void handle_notify(struct handle *h)
{
	PyObject *r;

	if (h->notify == NULL) {
		return;
	}
	if (h->status == 0) {
		r = PyObject_CallMethod(h->notify, "set_result", "O",
					h->result ? h->result : Py_None);
	} else {
		PyObject *exc = handle_exception(h);

		r = exc ? PyObject_CallMethod(h->notify, "set_exception", "O", exc) : NULL;
		Py_XDECREF(exc);
	}
	if (r == NULL) {
		PyErr_WriteUnraisable(h->notify);
	}
	Py_XDECREF(r);
}

/*
 * The last callback of h (progress thread, or the submitting thread when a group could
 * not be started whole). Wake waiters first: they need no GIL. Then take the GIL once.
 */
void pbox_py_handle_complete(struct handle *h)
{
	PyGILState_STATE gs;

	pthread_mutex_lock(&h->lock);
	h->done = true;
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->lock);

	gs = PyGILState_Ensure();
	handle_notify(h);
	handle_release_refs(h);
	Py_DECREF(h); /* the reference the operations held */
	PyGILState_Release(gs);
}

void pbox_py_handle_note_error(struct handle *h, int status, const char *msg)
{
	pthread_mutex_lock(&h->lock);
	if (h->status == 0) {
		h->status = status;
		snprintf(h->msg, sizeof(h->msg), "%s", msg);
	}
	pthread_mutex_unlock(&h->lock);
}

/* libpbox completion callback: progress thread, no GIL. */
void pbox_py_op_done(uint32_t key, int status, void *arg)
{
	struct handle *h = arg;

	g_pbox_py_progress_thread = true;
	if (status < 0) {
		/* libpbox sets this thread's last error to the operation's message before it
		 * calls back (pbox_done_fn). */
		const char *why = pbox_last_error();
		char msg[512];

		if (why[0] != '\0') {
			snprintf(msg, sizeof(msg), "%s", why);
		} else {
			snprintf(msg, sizeof(msg), "%s of key %u failed: %s", g_op_names[h->kind],
				 key, strerror(-status));
		}
		pbox_py_handle_note_error(h, status, msg);
	}
	if (__atomic_sub_fetch(&h->remaining, 1, __ATOMIC_ACQ_REL) == 0) {
		pbox_py_handle_complete(h);
	}
}

static int64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/*
 * Wait for h with the GIL released, in slices so that signals are handled. timeout_ns < 0:
 * no limit. Returns 1 when done, 0 when the timeout passed, -1 with an exception set
 * (a signal handler raised).
 */
int pbox_py_handle_wait_done(struct handle *h, int64_t timeout_ns)
{
	int64_t deadline = timeout_ns < 0 ? INT64_MAX : mono_ns() + timeout_ns;

	for (;;) {
		int64_t until = mono_ns() + WAIT_SLICE_NS;
		struct timespec abs;
		PyThreadState *tstate;
		bool done;

		if (until > deadline) {
			until = deadline;
		}
		abs.tv_sec = (time_t)(until / 1000000000ll);
		abs.tv_nsec = (long)(until % 1000000000ll);
		tstate = PyEval_SaveThread();
		pthread_mutex_lock(&h->lock);
		while (!h->done && pthread_cond_timedwait(&h->cond, &h->lock, &abs) != ETIMEDOUT) {
		}
		done = h->done;
		pthread_mutex_unlock(&h->lock);
		PyEval_RestoreThread(tstate);
		if (done) {
			return 1;
		}
		if (PyErr_CheckSignals() < 0) {
			return -1;
		}
		if (mono_ns() >= deadline) {
			return 0;
		}
	}
}

/* After h is done: None, or raise its error. */
PyObject *pbox_py_handle_result(struct handle *h)
{
	int status;
	char msg[sizeof(h->msg)];

	pthread_mutex_lock(&h->lock);
	status = h->status;
	snprintf(msg, sizeof(msg), "%s", h->msg);
	pthread_mutex_unlock(&h->lock);
	if (status < 0) {
		return pbox_py_raise_status(status, msg);
	}
	Py_RETURN_NONE;
}

static PyObject *handle_wait(struct handle *h, PyObject *args, PyObject *kw)
{
	static const char *kwlist[] = { "timeout", NULL };
	PyObject *to = Py_None;
	int64_t tns = -1;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:wait", (char **)kwlist, &to)) {
		return NULL;
	}
	if (to != Py_None) {
		double s = PyFloat_AsDouble(to);

		if (s == -1.0 && PyErr_Occurred()) {
			return NULL;
		}
		if (!(s >= 0.0 && s < 1e9)) {
			PyErr_Format(PyExc_ValueError, "timeout must be >= 0 seconds (got %g)", s);
			return NULL;
		}
		tns = (int64_t)(s * 1e9);
	}
	rc = pbox_py_handle_wait_done(h, tns);
	if (rc < 0) {
		return NULL;
	}
	if (rc == 0) {
		PyErr_Format(
			PyExc_TimeoutError,
			"%s of key %u (iteration %u%s): not complete after %.3f s; the operation "
			"is still in flight (wait again, or let it fail at its deadline)",
			g_op_names[h->kind], h->key, h->iter,
			h->nops > 1 ? ", with other keys" : "", (double)tns / 1e9);
		return NULL;
	}
	return pbox_py_handle_result(h);
}

static PyObject *handle_done(struct handle *h, PyObject *unused)
{
	bool done;

	(void)unused;
	pthread_mutex_lock(&h->lock);
	done = h->done;
	pthread_mutex_unlock(&h->lock);
	return PyBool_FromLong(done);
}

static PyObject *handle_repr(struct handle *h)
{
	bool done;
	int status;

	pthread_mutex_lock(&h->lock);
	done = h->done;
	status = h->status;
	pthread_mutex_unlock(&h->lock);
	return PyUnicode_FromFormat("<pbox.Handle %s key %u iteration %u%s: %s>",
				    g_op_names[h->kind], h->key, h->iter,
				    h->nops > 1 ? " (+ more keys)" : "",
				    !done         ? "in flight"
				    : status == 0 ? "done"
						  : "failed");
}

static PyObject *handle_get_keys(struct handle *h, void *unused)
{
	(void)unused;
	return PyLong_FromUnsignedLong(h->nops);
}

static PyMethodDef g_handle_methods[] = {
	{ "wait", (PyCFunction)(void (*)(void))handle_wait, METH_VARARGS | METH_KEYWORDS,
	  "wait(timeout=None)\n--\n\nWait for the operation (GIL released). Returns None, raises "
	  "the operation's PboxError, or TimeoutError if timeout (seconds) passes first; the "
	  "operation then stays in flight." },
	{ "done", (PyCFunction)handle_done, METH_NOARGS,
	  "done()\n--\n\nTrue once the operation has completed (successfully or not)." },
	{ NULL, NULL, 0, NULL },
};

static PyGetSetDef g_handle_getset[] = {
	{ "nkeys", (getter)handle_get_keys, NULL, "number of keys in the operation", NULL },
	{ NULL, NULL, NULL, NULL, NULL },
};

PyTypeObject g_pbox_py_handle_type = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pbox.Handle",
	.tp_basicsize = sizeof(struct handle),
	.tp_dealloc = (destructor)handle_dealloc,
	.tp_repr = (reprfunc)handle_repr,
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "An asynchronous pbox operation in flight (see Client.push_pull_async).",
	.tp_methods = g_handle_methods,
	.tp_getset = g_handle_getset,
};
