/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox._pbox's arguments: Python objects checked and converted to what libpbox takes
 * (integers in range, seconds to milliseconds, C-contiguous float32 buffers), with errors
 * that name the argument. Objects without the buffer protocol (torch tensors) go through
 * the adapter pbox/__init__.py installs (pbox._pbox._set_buffer_adapter).
 */
#include "_pbox.h"

#include <string.h>

static PyObject *g_adapter; /* callable: non-buffer object -> buffer object */

int pbox_py_get_u64(PyObject *o, const char *name, uint64_t max, uint64_t *out)
{
	unsigned long long v;

	if (!PyLong_Check(o)) {
		PyErr_Format(PyExc_TypeError, "%s must be an integer, not %.80s", name,
			     Py_TYPE(o)->tp_name);
		return -1;
	}
	v = PyLong_AsUnsignedLongLong(o);
	if (v == (unsigned long long)-1 && PyErr_Occurred()) {
		PyErr_Clear();
		PyErr_Format(PyExc_ValueError, "%s must be between 0 and %llu", name,
			     (unsigned long long)max);
		return -1;
	}
	if (v > max) {
		PyErr_Format(PyExc_ValueError, "%s must be between 0 and %llu (got %llu)", name,
			     (unsigned long long)max, v);
		return -1;
	}
	*out = v;
	return 0;
}

int pbox_py_get_u32(PyObject *o, const char *name, uint32_t *out)
{
	uint64_t v;

	if (pbox_py_get_u64(o, name, UINT32_MAX, &v) < 0) {
		return -1;
	}
	*out = (uint32_t)v;
	return 0;
}

/* Seconds (float or int, > 0 unless zero_ok) to milliseconds; None leaves *ms unchanged. */
int pbox_py_get_seconds_ms(PyObject *o, const char *name, uint32_t *ms)
{
	double s;

	if (o == NULL || o == Py_None) {
		return 0;
	}
	s = PyFloat_AsDouble(o);
	if (s == -1.0 && PyErr_Occurred()) {
		PyErr_Clear();
		PyErr_Format(PyExc_TypeError, "%s must be a number of seconds, not %.80s", name,
			     Py_TYPE(o)->tp_name);
		return -1;
	}
	if (!(s >= 0.001 && s <= 86400.0)) {
		PyErr_Format(PyExc_ValueError,
			     "%s must be between 0.001 and 86400 seconds (got %g)", name, s);
		return -1;
	}
	*ms = (uint32_t)(s * 1000.0 + 0.5);
	return 0;
}

static bool is_float32_format(const char *f)
{
	if (f == NULL) {
		return false; /* unsigned bytes */
	}
	if (f[0] == '@' || f[0] == '=' ||
	    (f[0] == '<' && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__)) {
		f++;
	}
	return strcmp(f, "f") == 0;
}

/*
 * Export obj as a C-contiguous float32 buffer (writable if asked). Objects without the
 * buffer protocol (torch tensors) go through the adapter. Errors name the key and role.
 */
int pbox_py_get_view(PyObject *obj, bool writable, const char *role, uint32_t key, Py_buffer *v)
{
	PyObject *conv = NULL;
	int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);

	if (!PyObject_CheckBuffer(obj)) {
		if (g_adapter == NULL) {
			PyErr_Format(
				PyExc_TypeError,
				"key %u: %s must support the buffer protocol (a numpy array, a "
				"bytearray, ...), not %.80s",
				key, role, Py_TYPE(obj)->tp_name);
			return -1;
		}
		conv = PyObject_CallFunction(g_adapter, "Os", obj, role);
		if (conv == NULL) {
			return -1;
		}
		if (!PyObject_CheckBuffer(conv)) {
			PyErr_Format(PyExc_TypeError,
				     "key %u: %s (%.80s) must support the buffer protocol (a numpy "
				     "array, a contiguous CPU torch tensor, ...)",
				     key, role, Py_TYPE(obj)->tp_name);
			Py_DECREF(conv);
			return -1;
		}
		obj = conv;
	}
	if (PyObject_GetBuffer(obj, v, flags) < 0) {
		PyObject *et, *ev, *tb, *s;

		PyErr_Fetch(&et, &ev, &tb);
		PyErr_NormalizeException(&et, &ev, &tb);
		s = ev ? PyObject_Str(ev) : NULL;
		PyErr_Format(PyExc_ValueError, "key %u: %s cannot be used%s: %s", key, role,
			     writable ? " as a writable C-contiguous buffer"
				      : " as a C-contiguous buffer",
			     s ? PyUnicode_AsUTF8(s) : "unknown reason");
		Py_XDECREF(s);
		Py_XDECREF(et);
		Py_XDECREF(ev);
		Py_XDECREF(tb);
		Py_XDECREF(conv);
		return -1;
	}
	Py_XDECREF(conv); /* the view keeps its own reference to the exporter */
	if (v->itemsize != 4 || !is_float32_format(v->format)) {
		PyErr_Format(
			PyExc_TypeError,
			"key %u: %s has items of format '%s' (%zd bytes); pbox exchanges float32 "
			"(numpy.float32, torch.float32)",
			key, role, v->format ? v->format : "B", v->itemsize);
		PyBuffer_Release(v);
		return -1;
	}
	return 0;
}

PyObject *pbox_py_set_buffer_adapter(PyObject *m, PyObject *fn)
{
	(void)m;
	if (fn != Py_None && !PyCallable_Check(fn)) {
		PyErr_SetString(PyExc_TypeError, "the buffer adapter must be callable or None");
		return NULL;
	}
	Py_XDECREF(g_adapter);
	g_adapter = fn == Py_None ? NULL : fn;
	Py_XINCREF(g_adapter);
	Py_RETURN_NONE;
}
