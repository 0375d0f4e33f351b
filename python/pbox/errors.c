/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox._pbox's exceptions: PboxError (an OSError whose errno is the cause) and its
 * subclasses for deadlines, connections and admission, created with the module, and how
 * a libpbox status and message become one of them.
 */
#include "_pbox.h"

#include <errno.h>
#include <string.h>

PyObject *g_pbox_py_error;           /* pbox.PboxError(OSError) */
static PyObject *g_timeout_error;    /* + TimeoutError */
static PyObject *g_connection_error; /* + ConnectionError */
static PyObject *g_permission_error; /* + PermissionError */

static PyObject *error_class(int err)
{
	switch (err) {
	case ETIMEDOUT:
		return g_timeout_error;
	case ECONNREFUSED:
	case ECONNRESET:
	case ECONNABORTED:
	case ENOTCONN:
	case EPIPE:
	case EHOSTUNREACH:
	case ENETUNREACH:
		return g_connection_error;
	case EACCES:
	case EPERM:
		return g_permission_error;
	default:
		return g_pbox_py_error;
	}
}

/* An instance of the PboxError subclass for errno err. Messages come from C code and
 * may hold anything: bytes that are not UTF-8 are replaced rather than lost in a
 * UnicodeDecodeError. */
PyObject *pbox_py_new_exception(int err, const char *msg)
{
	PyObject *text = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace");
	PyObject *exc;

	if (text == NULL) {
		return NULL;
	}
	exc = PyObject_CallFunction(error_class(err), "iO", err, text);
	Py_DECREF(text);
	return exc;
}

/* Raise the PboxError subclass for -status with msg (libpbox's message). Returns NULL. */
PyObject *pbox_py_raise_status(int status, const char *msg)
{
	int err = status < 0 ? -status : EIO;
	PyObject *exc;

	if (msg == NULL || msg[0] == '\0') {
		msg = strerror(err);
	}
	exc = pbox_py_new_exception(err, msg);
	if (exc != NULL) {
		PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
		Py_DECREF(exc);
	}
	return NULL;
}

PyObject *pbox_py_raise_last(int status)
{
	return pbox_py_raise_status(status, pbox_last_error());
}

/* A subclass of PboxError and of base2, the built-in class of the same cause. */
static PyObject *new_error(const char *name, PyObject *base2, const char *doc)
{
	PyObject *bases = base2 ? PyTuple_Pack(2, g_pbox_py_error, base2) : NULL;
	PyObject *e;

	if (base2 != NULL && bases == NULL) {
		return NULL;
	}
	e = PyErr_NewExceptionWithDoc(name, doc, bases, NULL);
	Py_XDECREF(bases);
	return e;
}

int pbox_py_errors_create(void)
{
	g_pbox_py_error =
		PyErr_NewExceptionWithDoc("pbox.PboxError",
					  "An error of libpbox: errno is the cause, strerror "
					  "libpbox's message.",
					  PyExc_OSError, NULL);
	if (g_pbox_py_error == NULL) {
		return -1;
	}
	g_timeout_error = new_error("pbox.PboxTimeoutError", PyExc_TimeoutError,
				    "An operation or connection passed its deadline.");
	g_connection_error = new_error("pbox.PboxConnectionError", PyExc_ConnectionError,
				       "pboxd cannot be reached, or the connection or job ended.");
	g_permission_error = new_error("pbox.PboxPermissionError", PyExc_PermissionError,
				       "The appliance refused admission (wrong token).");
	if (g_timeout_error == NULL || g_connection_error == NULL || g_permission_error == NULL) {
		return -1;
	}
	return 0;
}

int pbox_py_errors_add(PyObject *m)
{
	Py_INCREF(g_pbox_py_error);
	Py_INCREF(g_timeout_error);
	Py_INCREF(g_connection_error);
	Py_INCREF(g_permission_error);
	if (PyModule_AddObject(m, "PboxError", g_pbox_py_error) < 0 ||
	    PyModule_AddObject(m, "PboxTimeoutError", g_timeout_error) < 0 ||
	    PyModule_AddObject(m, "PboxConnectionError", g_connection_error) < 0 ||
	    PyModule_AddObject(m, "PboxPermissionError", g_permission_error) < 0) {
		return -1;
	}
	return 0;
}
