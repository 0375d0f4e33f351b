/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox._pbox's private declarations: what the files of the extension share. One module,
 * built from these files, one purpose each:
 *
 *   _pbox.c    the types, the operations and the module definition
 *   errors.c   the exception classes (PboxError and its subclasses) and raising them
 *   args.c     arguments: integers, seconds and float32 buffers checked and converted
 *
 * Every function here is called with the GIL held.
 */
#ifndef PBOX_PYTHON_PBOX_H
#define PBOX_PYTHON_PBOX_H

/* Python.h first, as the C API asks. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>
#include <stdint.h>

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

/* ---- args.c ------------------------------------------------------------------------- */

/* The integer o, 0..max, into *out. Returns 0, or -1 with TypeError / ValueError set, the
 * message naming the argument name. */
int pbox_py_get_u64(PyObject *o, const char *name, uint64_t max, uint64_t *out);

/* pbox_py_get_u64 up to UINT32_MAX. */
int pbox_py_get_u32(PyObject *o, const char *name, uint32_t *out);

/* Seconds o (a number, 0.001..86400) rounded to milliseconds in *ms; NULL or None leaves
 * *ms unchanged. Returns 0, or -1 with TypeError / ValueError set. */
int pbox_py_get_seconds_ms(PyObject *o, const char *name, uint32_t *ms);

/* Export obj into *v as a C-contiguous float32 buffer, writable if asked, through the
 * buffer adapter when obj lacks the buffer protocol. The caller releases *v
 * (PyBuffer_Release). Returns 0, or -1 with TypeError / ValueError set, the message
 * naming key and role ("grad", "out", ...). */
int pbox_py_get_view(PyObject *obj, bool writable, const char *role, uint32_t key, Py_buffer *v);

/* pbox._pbox._set_buffer_adapter(fn): install fn(obj, role) -> buffer object, used by
 * pbox_py_get_view (None: none). Returns None, or NULL with TypeError set. */
PyObject *pbox_py_set_buffer_adapter(PyObject *m, PyObject *fn);

#endif /* PBOX_PYTHON_PBOX_H */
