/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox.Client: one struct pbox_client. Connecting (Client(...)), registering the keys,
 * the job's information and counters, and closing, here or, on a libpbox progress thread,
 * on a thread of its own (struct core). Its operations are in ops.c, Client.alloc in
 * memory.c; its method table, here, lists them all.
 */
#include "_pbox.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * What closing a client needs, apart from the Python object: a Client can be collected,
 * or closed, on a libpbox progress thread (by a completion's callback, or by the garbage
 * collector running there), where pbox_close would join the thread it runs on. It is
 * then closed by a thread of its own, which shares this struct with the Client.
 */
struct core {
	struct pbox_client *c;
	uint32_t refs; /* atomic: the Client and a closer */
};

/* ---- Client: lifecycle -------------------------------------------------------------- */

static int client_init(struct client *self, PyObject *args, PyObject *kw)
{
	static const char *kwlist[] = { "server",     "job",       "token", "rank",
					"world_size", "timeout",   "rto",   "max_inflight",
					"local_addr", "busy_poll", "fault", NULL };
	const char *server = NULL, *token = NULL, *local_addr = NULL, *fault = NULL;
	PyObject *job_o, *rank_o, *ws_o = Py_None, *to_o = Py_None, *rto_o = Py_None;
	PyObject *mi_o = NULL;
	int busy_poll = 0;
	struct pbox_client_opts o = { 0 };
	struct pbox_client *c = NULL;
	uint32_t ws = 0;
	PyThreadState *ts;
	int rc;

	if (self->c != NULL || self->core->c != NULL) {
		PyErr_SetString(PyExc_RuntimeError, "pbox.Client is already connected");
		return -1;
	}
	if (!PyArg_ParseTupleAndKeywords(args, kw, "zOsO|O$OOOzpz:Client", (char **)kwlist, &server,
					 &job_o, &token, &rank_o, &ws_o, &to_o, &rto_o, &mi_o,
					 &local_addr, &busy_poll, &fault)) {
		return -1;
	}
	if (pbox_py_get_u32(job_o, "job", &o.job) < 0 ||
	    pbox_py_get_u32(rank_o, "rank", &o.rank) < 0 ||
	    pbox_py_get_seconds_ms(to_o, "timeout", &o.timeout_ms) < 0 ||
	    pbox_py_get_seconds_ms(rto_o, "rto", &o.rto_ms) < 0 ||
	    (mi_o != NULL && pbox_py_get_u32(mi_o, "max_inflight", &o.max_inflight) < 0) ||
	    (ws_o != Py_None && pbox_py_get_u32(ws_o, "world_size", &ws) < 0)) {
		return -1;
	}
	if (ws_o != Py_None && (ws == 0 || o.rank >= ws)) {
		PyErr_Format(PyExc_ValueError, "rank %u is out of range for world size %u", o.rank,
			     ws);
		return -1;
	}
	o.server = server;
	o.token = token;
	o.local_addr = local_addr;
	o.busy_poll = busy_poll != 0;
	o.fault = fault;
	snprintf(self->server, sizeof(self->server), "%s", server ? server : "127.0.0.1:7000");

	ts = PyEval_SaveThread();
	rc = pbox_connect(&o, &c);
	PyEval_RestoreThread(ts);
	if (rc < 0) {
		pbox_py_raise_last(rc);
		return -1;
	}
	pbox_job_info(c, &self->info);
	if (ws != 0 && ws != self->info.workers) {
		ts = PyEval_SaveThread();
		pbox_close(c);
		PyEval_RestoreThread(ts);
		PyErr_Format(g_pbox_py_error,
			     "job %u on pboxd at %s has %u workers, but this process runs "
			     "with world size %u: the job and the launch must agree",
			     o.job, self->server, self->info.workers, ws);
		return -1;
	}
	self->c = c;
	self->core->c = c;
	return 0;
}

static PyObject *client_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
	struct client *self = (struct client *)type->tp_alloc(type, 0);

	(void)args;
	(void)kw;
	if (self == NULL) {
		return NULL;
	}
	self->core = calloc(1, sizeof(*self->core));
	if (self->core == NULL) {
		Py_DECREF(self);
		return PyErr_NoMemory();
	}
	self->core->refs = 1;
	return (PyObject *)self;
}

static void core_put(struct core *k)
{
	if (__atomic_sub_fetch(&k->refs, 1, __ATOMIC_ACQ_REL) == 0) {
		free(k);
	}
}

/*
 * Without the GIL. Close k->c: its operations in flight, and those submitted but not yet
 * started, fail (ECANCELED) through callbacks that take the GIL, all before pbox_close
 * returns.
 */
static void core_close(struct core *k)
{
	pbox_close(k->c);
	k->c = NULL;
}

static void *closer_main(void *arg)
{
	struct core *k = arg;

	core_close(k);
	core_put(k);
	return NULL;
}

/* GIL held. Close the client: here, or on a thread of its own when this is a progress
 * thread (see struct core). */
static void client_shutdown(struct client *self)
{
	struct core *k = self->core;
	PyThreadState *ts;

	if (self->c == NULL) {
		return;
	}
	pbox_py_mem_detach_all(self);
	self->c = NULL;
	if (g_pbox_py_progress_thread) {
		pthread_attr_t attr;
		pthread_t t;
		int rc;

		__atomic_add_fetch(&k->refs, 1, __ATOMIC_ACQ_REL);
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		rc = pthread_create(&t, &attr, closer_main, k);
		pthread_attr_destroy(&attr);
		if (rc == 0) {
			return;
		}
		/* Closing here would join this very thread: leave the client open (leaked)
		 * rather than crash, and say so. */
		__atomic_sub_fetch(&k->refs, 1, __ATOMIC_ACQ_REL);
		fprintf(stderr, "pbox: cannot start a thread to close the client to %s: %s\n",
			self->server, strerror(rc));
		return;
	}
	ts = PyEval_SaveThread();
	core_close(k);
	PyEval_RestoreThread(ts);
}

static void client_dealloc(struct client *self)
{
	if (self->weakreflist != NULL) {
		PyObject_ClearWeakRefs((PyObject *)self);
	}
	if (self->core != NULL) {
		client_shutdown(self);
		core_put(self->core);
	}
	PyMem_Free(self->keys);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

int pbox_py_check_open(struct client *self)
{
	if (self->c == NULL) {
		PyErr_SetString(g_pbox_py_error, "the pbox client is closed");
		return -1;
	}
	return 0;
}

static PyObject *client_close(struct client *self, PyObject *unused)
{
	(void)unused;
	if (self->c == NULL) {
		Py_RETURN_NONE;
	}
	if (self->registering) {
		PyErr_SetString(PyExc_RuntimeError,
				"cannot close the pbox client: another thread is registering keys");
		return NULL;
	}
	if (self->allocating != 0) {
		PyErr_SetString(PyExc_RuntimeError,
				"cannot close the pbox client: another thread is in Client.alloc");
		return NULL;
	}
	client_shutdown(self);
	Py_RETURN_NONE;
}

static PyObject *client_enter(struct client *self, PyObject *unused)
{
	(void)unused;
	if (pbox_py_check_open(self) < 0) {
		return NULL;
	}
	Py_INCREF(self);
	return (PyObject *)self;
}

static PyObject *client_exit(struct client *self, PyObject *args)
{
	PyObject *r;

	(void)args;
	r = client_close(self, NULL);
	if (r == NULL) {
		return NULL;
	}
	Py_DECREF(r);
	Py_RETURN_FALSE;
}

/* ---- Client: registration ----------------------------------------------------------- */

static int cmp_ckey(const void *a, const void *b)
{
	const struct ckey *x = a, *y = b;

	return x->id < y->id ? -1 : x->id > y->id;
}

const struct ckey *pbox_py_find_key(const struct client *self, uint32_t id)
{
	struct ckey probe = { .id = id };

	return bsearch(&probe, self->keys, self->nkeys, sizeof(*self->keys), cmp_ckey);
}

static int add_key(PyObject *id_o, PyObject *n_o, struct pbox_key_info *k)
{
	if (pbox_py_get_u32(id_o, "key id", &k->id) < 0 ||
	    pbox_py_get_u64(n_o, "key length", UINT64_MAX, &k->nelem) < 0) {
		return -1;
	}
	if (k->nelem == 0) {
		PyErr_Format(PyExc_ValueError, "key %u: length must be at least 1 float32 value",
			     k->id);
		return -1;
	}
	return 0;
}

static PyObject *client_register(struct client *self, PyObject *args, PyObject *kw)
{
	static const char *kwlist[] = { "keys", NULL };
	PyObject *keys_o, *seq = NULL, *items = NULL;
	struct pbox_key_info *keys = NULL;
	struct ckey *table = NULL;
	PyThreadState *ts;
	Py_ssize_t n;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O:register", (char **)kwlist, &keys_o) ||
	    pbox_py_check_open(self) < 0) {
		return NULL;
	}
	if (self->keys != NULL || self->registering) {
		PyErr_SetString(g_pbox_py_error, "keys are already registered with this client");
		return NULL;
	}
	if (PyDict_Check(keys_o)) {
		items = PyDict_Items(keys_o);
		keys_o = items;
	}
	if (items == NULL && PyErr_Occurred()) {
		return NULL;
	}
	seq = PySequence_Fast(keys_o,
			      "keys must be a dict {id: nelem} or a sequence of (id, nelem)");
	if (seq == NULL) {
		goto err;
	}
	n = PySequence_Fast_GET_SIZE(seq);
	if (n == 0 || n > UINT32_MAX) {
		PyErr_SetString(PyExc_ValueError, "register: no keys given");
		goto err;
	}
	keys = PyMem_Calloc((size_t)n, sizeof(*keys));
	table = PyMem_Calloc((size_t)n, sizeof(*table));
	if (keys == NULL || table == NULL) {
		PyErr_NoMemory();
		goto err;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *it = PySequence_Fast_GET_ITEM(seq, i);

		if (!PyTuple_Check(it) && !PyList_Check(it)) {
			PyErr_Format(PyExc_TypeError,
				     "register: entry %zd must be (id, nelem), not %.80s", i,
				     Py_TYPE(it)->tp_name);
			goto err;
		}
		if (PySequence_Fast_GET_SIZE(it) != 2) {
			PyErr_Format(PyExc_TypeError, "register: entry %zd must be (id, nelem)", i);
			goto err;
		}
		if (add_key(PySequence_Fast_GET_ITEM(it, 0), PySequence_Fast_GET_ITEM(it, 1),
			    &keys[i]) < 0) {
			goto err;
		}
		table[i].id = keys[i].id;
		table[i].nelem = keys[i].nelem;
	}
	qsort(table, (size_t)n, sizeof(*table), cmp_ckey);
	for (Py_ssize_t i = 1; i < n; i++) {
		if (table[i].id == table[i - 1].id) {
			PyErr_Format(PyExc_ValueError, "register: key id %u appears twice",
				     table[i].id);
			goto err;
		}
	}
	self->registering = true;
	ts = PyEval_SaveThread();
	rc = pbox_register(self->c, keys, (uint32_t)n);
	PyEval_RestoreThread(ts);
	self->registering = false;
	if (rc < 0) {
		pbox_py_raise_last(rc);
		goto err;
	}
	pbox_job_info(self->c, &self->info);
	self->keys = table;
	self->nkeys = (uint32_t)n;
	PyMem_Free(keys);
	Py_DECREF(seq);
	Py_XDECREF(items);
	Py_RETURN_NONE;
err:
	PyMem_Free(keys);
	PyMem_Free(table);
	Py_XDECREF(seq);
	Py_XDECREF(items);
	return NULL;
}

/* ---- Client: information ------------------------------------------------------------ */

static const char *mode_name(enum pbox_job_mode_public m)
{
	return m == PBOX_JOB_SERVER_OPTIMIZER ? "server-optimizer"
	       : m == PBOX_JOB_BROADCAST      ? "broadcast"
					      : "aggregate";
}

/* The synchronisation contract (sync, staleness, credits) comes with registration: None
 * before it. A staleness of -1 means any (no bound). */
static PyObject *client_get_info(struct client *self, void *unused)
{
	const struct pbox_job_info *i = &self->info;
	PyObject *sync, *stale, *credits, *d = NULL;

	(void)unused;
	if (pbox_py_check_open(self) < 0) {
		return NULL;
	}
	if (self->keys == NULL) {
		Py_INCREF(Py_None);
		Py_INCREF(Py_None);
		Py_INCREF(Py_None);
		sync = stale = credits = Py_None;
	} else {
		sync = PyUnicode_FromString(i->sync);
		stale = i->staleness == UINT32_MAX ? PyLong_FromLong(-1)
						   : PyLong_FromUnsignedLong(i->staleness);
		credits = PyLong_FromUnsignedLong(i->credits);
	}
	if (sync != NULL && stale != NULL && credits != NULL) {
		d = Py_BuildValue("{s:I, s:I, s:I, s:s, s:s, s:I, s:I, s:I, s:I, s:K, s:s, s:O, "
				  "s:O, s:O}",
				  "job", i->job, "rank", i->rank, "workers", i->workers, "mode",
				  mode_name(i->mode), "reduce", i->mean ? "mean" : "sum", "cores",
				  i->cores, "chunk_bytes", i->chunk_bytes, "frag_bytes",
				  i->frag_bytes, "nchunks", i->nchunks, "total_bytes",
				  (unsigned long long)i->total_bytes, "server", self->server,
				  "sync", sync, "staleness", stale, "credits", credits);
	}
	Py_XDECREF(sync);
	Py_XDECREF(stale);
	Py_XDECREF(credits);
	return d;
}

static PyObject *client_get_keys(struct client *self, void *unused)
{
	PyObject *d = PyDict_New();

	(void)unused;
	for (uint32_t i = 0; d != NULL && i < self->nkeys; i++) {
		PyObject *k = PyLong_FromUnsignedLong(self->keys[i].id);
		PyObject *v = PyLong_FromUnsignedLongLong(self->keys[i].nelem);

		if (k == NULL || v == NULL || PyDict_SetItem(d, k, v) < 0) {
			Py_CLEAR(d);
		}
		Py_XDECREF(k);
		Py_XDECREF(v);
	}
	return d;
}

static PyObject *client_get_closed(struct client *self, void *unused)
{
	(void)unused;
	return PyBool_FromLong(self->c == NULL);
}

static PyObject *client_get_transport(struct client *self, void *unused)
{
	(void)unused;
	if (pbox_py_check_open(self) < 0) {
		return NULL;
	}
	return PyUnicode_FromString(pbox_transport(self->c));
}

static PyObject *client_stats(struct client *self, PyObject *unused)
{
	struct pbox_client_stats s;

	(void)unused;
	if (pbox_py_check_open(self) < 0) {
		return NULL;
	}
	pbox_client_stats(self->c, &s);
	{
		const struct {
			const char *name;
			uint64_t v;
		} f[] = {
			{ "tx_bytes", s.tx_bytes },       { "rx_bytes", s.rx_bytes },
			{ "tx_pkts", s.tx_pkts },         { "rx_pkts", s.rx_pkts },
			{ "retransmits", s.retransmits }, { "probes", s.probes },
			{ "dropped", s.dropped },         { "ops_done", s.ops_done },
			{ "ops_failed", s.ops_failed },   { "foreign", s.foreign },
			{ "shm_rx_desc", s.shm_rx_desc }, { "shm_stale", s.shm_stale },
			{ "shm_torn", s.shm_torn },       { "shm_bad_desc", s.shm_bad_desc },
			{ "shm_tx_full", s.shm_tx_full }, { "shm_tx_waits", s.shm_tx_waits },
		};
		PyObject *d = PyDict_New();

		for (size_t i = 0; d != NULL && i < sizeof(f) / sizeof(f[0]); i++) {
			PyObject *v = PyLong_FromUnsignedLongLong((unsigned long long)f[i].v);

			if (v == NULL || PyDict_SetItemString(d, f[i].name, v) != 0) {
				Py_XDECREF(v);
				Py_DECREF(d);
				return NULL;
			}
			Py_DECREF(v);
		}
		return d;
	}
}

static PyObject *client_repr(struct client *self)
{
	if (self->c == NULL) {
		return PyUnicode_FromString("<pbox.Client closed>");
	}
	return PyUnicode_FromFormat("<pbox.Client %s job %u rank %u of %u, %u keys>", self->server,
				    self->info.job, self->info.rank, self->info.workers,
				    self->nkeys);
}

#define METH_KW(f) (PyCFunction)(void (*)(void))(f), METH_VARARGS | METH_KEYWORDS

static PyMethodDef g_client_methods[] = {
	{ "register", METH_KW(client_register),
	  "register(keys)\n--\n\nRegister the job's keys, the same on every rank: a dict "
	  "{id: nelem} or a sequence of (id, nelem) pairs (nelem float32 values)." },
	{ "push", METH_KW(pbox_py_client_op_push),
	  "push(key, iteration, buffer)\n--\n\nContribute a gradient; returns once acknowledged." },
	{ "pull", METH_KW(pbox_py_client_op_pull),
	  "pull(key, iteration, buffer)\n--\n\nFetch a result into buffer (writable)." },
	{ "push_pull", METH_KW(pbox_py_client_op_push_pull),
	  "push_pull(key, iteration, buffer, out=None)\n--\n\nContribute buffer and receive the "
	  "iteration's result into out (default: into buffer, in place)." },
	{ "init", METH_KW(pbox_py_client_op_init),
	  "init(key, buffer)\n--\n\nSet the initial model of a server-optimizer job (rank 0)." },
	{ "push_async", METH_KW(pbox_py_client_op_push_async),
	  "push_async(key, iteration, buffer, *, notify=None, result=None) -> Handle" },
	{ "pull_async", METH_KW(pbox_py_client_op_pull_async),
	  "pull_async(key, iteration, buffer, *, notify=None, result=None) -> Handle" },
	{ "push_pull_async", METH_KW(pbox_py_client_op_push_pull_async),
	  "push_pull_async(key, iteration, buffer, out=None, *, notify=None, result=None) -> "
	  "Handle\n\nStart a push-pull. The buffers belong to the operation until it completes. "
	  "notify, if given, is completed from libpbox's progress thread with "
	  "notify.set_result(result) or notify.set_exception(error)." },
	{ "init_async", METH_KW(pbox_py_client_op_init_async),
	  "init_async(key, buffer, *, notify=None, result=None) -> Handle" },
	{ "push_pull_many", METH_KW(pbox_py_client_push_pull_many),
	  "push_pull_many(buffer, slices, notify=None, result=None) -> Handle\n--\n\n"
	  "Push-pull several keys stored in one float32 buffer, in place; slices is a sequence "
	  "of (key, iteration, offset in elements). One Handle for all of them." },
	{ "alloc", METH_KW(pbox_py_client_alloc),
	  "alloc(nbytes) -> Memory\n--\n\nMemory for buffers (after register): shared with "
	  "pboxd over the shm transport (Memory.registered), so pushes from it are not "
	  "copied; plain memory otherwise. View it with numpy.frombuffer(m, numpy.float32) "
	  "or torch.frombuffer(m, dtype=torch.float32)." },
	{ "stats", (PyCFunction)client_stats, METH_NOARGS,
	  "stats()\n--\n\nThe client's counters (libpbox pbox_client_stats) as a dict." },
	{ "close", (PyCFunction)client_close, METH_NOARGS,
	  "close()\n--\n\nLeave the job; operations in flight fail with ECANCELED." },
	{ "__enter__", (PyCFunction)client_enter, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction)client_exit, METH_VARARGS, NULL },
	{ NULL, NULL, 0, NULL },
};

static PyGetSetDef g_client_getset[] = {
	{ "info", (getter)client_get_info, NULL,
	  "job information (pbox_job_info) as a dict: job, rank, workers, mode "
	  "('aggregate' or 'server-optimizer'), reduce ('mean' or 'sum'), server; after "
	  "register also cores, chunk_bytes, frag_bytes, nchunks, total_bytes (0 before) and "
	  "sync ('bsp', 'ssp', ...), staleness (iterations; -1: any), credits (operations "
	  "per key in flight at once) (None before)",
	  NULL },
	{ "keys", (getter)client_get_keys, NULL, "registered keys: {id: nelem}", NULL },
	{ "closed", (getter)client_get_closed, NULL, "True after close()", NULL },
	{ "transport", (getter)client_get_transport, NULL,
	  "the data path: 'shm' (shared memory with a pboxd on this host) or 'udp'; '' "
	  "before register",
	  NULL },
	{ NULL, NULL, NULL, NULL, NULL },
};

PyTypeObject g_pbox_py_client_type = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pbox.Client",
	.tp_basicsize = sizeof(struct client),
	.tp_dealloc = (destructor)client_dealloc,
	.tp_repr = (reprfunc)client_repr,
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
	.tp_doc =
		"Client(server, job, token, rank, world_size=None, *, timeout=None, rto=None, "
		"max_inflight=None, local_addr=None, busy_poll=False, fault=None)\n--\n\n"
		"A worker of a pbox job: connects to pboxd at server ('host:port') and is admitted "
		"as rank. timeout (seconds) bounds connecting and every operation (default 30); "
		"world_size, if given, must equal the job's worker count. fault injects loss on "
		"this client's sends for tests ('drop=P,dup=P,reorder=P,seed=N'; default: the "
		"PBOX_FAULT environment variable, else none).",
	.tp_weaklistoffset = offsetof(struct client, weakreflist),
	.tp_methods = g_client_methods,
	.tp_getset = g_client_getset,
	.tp_init = (initproc)client_init,
	.tp_new = client_new,
};
