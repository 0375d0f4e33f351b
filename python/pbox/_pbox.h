/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox._pbox's private declarations: what the files of the extension share. One module,
 * built from these files, one purpose each:
 *
 *   _pbox.c    the types, the operations and the module definition
 *   errors.c   the exception classes (PboxError and its subclasses) and raising them
 *
 * Every function here is called with the GIL held.
 */
#ifndef PBOX_PYTHON_PBOX_H
#define PBOX_PYTHON_PBOX_H

/* Python.h first, as the C API asks. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pbox/pbox.h>

/* ---- errors.c ----------------------------------------------------------------------- */

extern PyObject *g_pbox_py_error; /* pbox.PboxError(OSError) */

/* Create PboxError and its subclasses (PboxTimeoutError, PboxConnectionError,
 * PboxPermissionError). Returns 0, or -1 with an exception set. */
int pbox_py_errors_create(void);

/* Add the four classes to module m. Returns 0, or -1 with an exception set. */
int pbox_py_errors_add(PyObject *m);

/* A new instance of the PboxError subclass for errno err with message msg (bytes that
 * are not UTF-8 replaced); NULL with an exception set if it cannot be made. */
PyObject *pbox_py_new_exception(int err, const char *msg);

/* Raise the PboxError subclass for -status (EIO if status is not negative) with msg,
 * libpbox's message (strerror when NULL or empty). Returns NULL. */
PyObject *pbox_py_raise_status(int status, const char *msg);

/* pbox_py_raise_status with this thread's pbox_last_error(). Returns NULL. */
PyObject *pbox_py_raise_last(int status);

#endif /* PBOX_PYTHON_PBOX_H */
