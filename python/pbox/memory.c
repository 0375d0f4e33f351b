/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox.Memory, and Client.alloc which makes it: blocks of pbox_mem_alloc, shared with
 * pboxd over the shm transport so that pushes from them are not copied, with the buffer
 * protocol. How a Memory outlives, or is detached from, its client: struct mem.
 */
#include "_pbox.h"

#include <stddef.h>
#include <stdio.h>

#include <sys/mman.h>

/*
 * Memory: a block of pbox_mem_alloc (registered with pboxd over the shm transport), with
 * the buffer protocol. It holds a reference to its Client, so the client outlives it
 * unless closed explicitly: closing detaches every live block first (pbox_mem_detach),
 * so views taken before keep valid memory, with the bytes they had, which the Memory
 * unmaps when it goes; new views of it are refused then. The last reference frees it
 * (pbox_mem_free). All fields under the GIL.
 */
struct mem {
	PyObject ob_base;
	struct client *owner; /* strong reference */
	void *p;
	size_t nbytes;
	bool registered; /* pboxd shares it (until detached) */
	bool detached;   /* owner closed: p is ours to munmap */
	Py_ssize_t exports;
	struct mem *prev, *next; /* owner->mems */
	PyObject *weakreflist;
};

/* GIL held, before closing: every live Memory keeps its mapping, no longer libpbox's. */
void pbox_py_mem_detach_all(struct client *self)
{
	for (struct mem *m = self->mems; m != NULL; m = m->next) {
		if (pbox_mem_detach(self->c, m->p) != 0) {
			/* Not libpbox's: cannot happen; leak rather than unmap what it owns. */
			fprintf(stderr, "pbox: %s\n", pbox_last_error());
			m->p = NULL;
		}
		m->detached = true;
		m->registered = false;
	}
	self->mems = NULL;
}

PyObject *pbox_py_client_alloc(struct client *self, PyObject *args, PyObject *kw)
{
	static const char *kwlist[] = { "nbytes", NULL };
	PyObject *n_o;
	uint64_t n;
	struct mem *m;
	PyThreadState *ts;
	void *p = NULL;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O:alloc", (char **)kwlist, &n_o) ||
	    pbox_py_get_u64(n_o, "nbytes", (uint64_t)PY_SSIZE_T_MAX, &n) < 0 ||
	    pbox_py_check_open(self) < 0) {
		return NULL;
	}
	if (n == 0) {
		PyErr_SetString(PyExc_ValueError, "nbytes must be at least 1");
		return NULL;
	}
	m = PyObject_GC_New(struct mem, &g_pbox_py_mem_type);
	if (m == NULL) {
		return NULL;
	}
	m->owner = NULL;
	m->p = NULL;
	m->nbytes = (size_t)n;
	m->registered = m->detached = false;
	m->exports = 0;
	m->prev = m->next = NULL;
	m->weakreflist = NULL;
	self->allocating++;
	ts = PyEval_SaveThread(); /* waits for pboxd's answer over shm */
	rc = pbox_mem_alloc(self->c, (size_t)n, &p);
	PyEval_RestoreThread(ts);
	self->allocating--;
	if (rc != 0) {
		Py_DECREF(m);
		return pbox_py_raise_last(rc);
	}
	m->p = p;
	m->registered = pbox_mem_registered(self->c, p);
	Py_INCREF(self);
	m->owner = self;
	m->next = self->mems;
	if (self->mems != NULL) {
		self->mems->prev = m;
	}
	self->mems = m;
	PyObject_GC_Track(m);
	return (PyObject *)m;
}

static void mem_dealloc(struct mem *m)
{
	struct client *owner = m->owner;

	PyObject_GC_UnTrack(m);
	if (m->weakreflist != NULL) {
		PyObject_ClearWeakRefs((PyObject *)m);
	}
	if (m->p != NULL && m->detached) {
		munmap(m->p, m->nbytes);
	} else if (m->p != NULL && owner != NULL) {
		if (m->prev != NULL) {
			m->prev->next = m->next;
		} else {
			owner->mems = m->next;
		}
		if (m->next != NULL) {
			m->next->prev = m->prev;
		}
		/* Nothing uses it: every operation holds a view (of an object holding one). */
		if (pbox_mem_free(owner->c, m->p) != 0) {
			fprintf(stderr, "pbox: %s\n", pbox_last_error());
		}
	}
	Py_XDECREF(owner);
	PyObject_GC_Del(m);
}

/* The owner stays alive while the Memory does; nothing to traverse but it. */
static int mem_traverse(struct mem *m, visitproc visit, void *arg)
{
	Py_VISIT(m->owner);
	return 0;
}

static int mem_getbuffer(struct mem *m, Py_buffer *v, int flags)
{
	if (m->detached || m->p == NULL) {
		PyErr_SetString(g_pbox_py_error,
				"pbox.Memory: its client is closed (views taken before close keep "
				"their bytes; new ones are refused)");
		v->obj = NULL;
		return -1;
	}
	if (PyBuffer_FillInfo(v, (PyObject *)m, m->p, (Py_ssize_t)m->nbytes, 0, flags) < 0) {
		return -1;
	}
	m->exports++;
	return 0;
}

static void mem_releasebuffer(struct mem *m, Py_buffer *v)
{
	(void)v;
	m->exports--;
}

static PyBufferProcs g_mem_buffer = {
	.bf_getbuffer = (getbufferproc)mem_getbuffer,
	.bf_releasebuffer = (releasebufferproc)mem_releasebuffer,
};

static Py_ssize_t mem_length(struct mem *m)
{
	return (Py_ssize_t)m->nbytes;
}

static PySequenceMethods g_mem_sequence = {
	.sq_length = (lenfunc)mem_length,
};

static PyObject *mem_get_registered(struct mem *m, void *unused)
{
	(void)unused;
	return PyBool_FromLong(m->registered);
}

static PyObject *mem_get_nbytes(struct mem *m, void *unused)
{
	(void)unused;
	return PyLong_FromSize_t(m->nbytes);
}

static PyObject *mem_get_closed(struct mem *m, void *unused)
{
	(void)unused;
	return PyBool_FromLong(m->detached);
}

static PyObject *mem_get_address(struct mem *m, void *unused)
{
	(void)unused;
	return PyLong_FromVoidPtr(m->p);
}

static PyObject *mem_repr(struct mem *m)
{
	return PyUnicode_FromFormat("<pbox.Memory %zu bytes, %s>", m->nbytes,
				    m->detached     ? "client closed"
				    : m->registered ? "registered with pboxd"
						    : "not registered (plain memory)");
}

static PyGetSetDef g_mem_getset[] = {
	{ "registered", (getter)mem_get_registered, NULL,
	  "True when pboxd shares the memory (shm transport): pushes from it are not copied",
	  NULL },
	{ "nbytes", (getter)mem_get_nbytes, NULL, "size in bytes, as asked", NULL },
	{ "closed", (getter)mem_get_closed, NULL,
	  "True after the client closed: new views are refused", NULL },
	{ "address", (getter)mem_get_address, NULL, "the first byte's address", NULL },
	{ NULL, NULL, NULL, NULL, NULL },
};

PyTypeObject g_pbox_py_mem_type = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pbox.Memory",
	.tp_basicsize = sizeof(struct mem),
	.tp_dealloc = (destructor)mem_dealloc,
	.tp_repr = (reprfunc)mem_repr,
	.tp_as_buffer = &g_mem_buffer,
	.tp_as_sequence = &g_mem_sequence,
	.tp_traverse = (traverseproc)mem_traverse,
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
	.tp_weaklistoffset = offsetof(struct mem, weakreflist),
	.tp_getset = g_mem_getset,
	.tp_doc = "Memory from Client.alloc(nbytes): writable bytes (buffer protocol, format "
		  "'B'), page-aligned and zeroed, for numpy.frombuffer(m, numpy.float32) or "
		  "torch.frombuffer(m, dtype=torch.float32). Over the shm transport pboxd "
		  "shares it (registered): pushes from it are not copied. Freed when the last "
		  "reference (views included) goes.",
};
