/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox._pbox: the CPython binding of libpbox (include/pbox/pbox.h). This header is
 * private to the extension: what its files share. One module, built from these files,
 * one purpose each:
 *
 *   module.c   the module: its functions and PyInit__pbox
 *   errors.c   the exception classes (PboxError and its subclasses) and raising them
 *   args.c     arguments: integers, seconds and float32 buffers checked and converted
 *   client.c   Client: connect, register, information, close; its method table
 *   ops.c      Client's operations: push, pull, push_pull, init (and _async), push_pull_many
 *   handle.c   Handle: an operation in flight, its completion (libpbox's callback), waiting
 *   memory.c   Memory: Client.alloc's buffers, registered with pboxd (shm)
 *
 * Client wraps one struct pbox_client; Handle is one operation, or a group of operations
 * on several keys of one buffer (push_pull_many, used by the PyTorch DDP hook), in flight.
 * Buffers are any C-contiguous float32 buffer-protocol object; torch tensors go through an
 * adapter installed by pbox/__init__.py that returns a numpy view of the same memory. The
 * exported Py_buffer is held by the Handle until the operation completes, so libpbox's
 * progress thread reads and writes the caller's memory in place, with no copy.
 *
 * Threads and the GIL: every call that can block (connect, register, waiting, close) runs
 * with the GIL released. Completion arrives on libpbox's progress thread as one callback
 * per key; only the last callback of a Handle takes the GIL, once, to release the buffers
 * and complete the optional notify object (e.g. a torch.futures.Future). Waiters sleep on
 * the Handle's own condition variable and are woken before the GIL is taken, so a thread
 * in Handle.wait() never depends on the GIL to make progress. A Handle does not keep its
 * Client alive: closing (or collecting) a Client fails the operations in flight with
 * ECANCELED before close returns, through libpbox's callbacks (pbox_close runs every
 * outstanding callback before it returns); on a progress thread a thread of its own does
 * the closing (struct core, client.c).
 *
 * Every function here is called with the GIL held unless its comment says otherwise.
 */
#ifndef PBOX_PYTHON_PBOX_H
#define PBOX_PYTHON_PBOX_H

/* Python.h first, as the C API asks. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <pbox/pbox.h>

/* ---- types -------------------------------------------------------------------------- */

struct core; /* the closing of a client, shared with a closer thread (client.c) */
struct mem;  /* pbox.Memory (memory.c) */

/* A registered key of a client: its id and length (float32 values). */
struct ckey {
	uint32_t id;
	uint64_t nelem;
};

/* pbox.Client (client.c). */
struct client {
	PyObject ob_base;
	struct pbox_client *c; /* NULL once closed (or being closed) */
	struct core *core;
	struct ckey *keys; /* sorted by id; NULL before register */
	uint32_t nkeys;
	bool registering;
	uint32_t allocating; /* Client.alloc calls running without the GIL */
	struct mem *mems;    /* live Memory objects of this client (GIL) */
	char server[256];
	struct pbox_job_info info;
	PyObject *weakreflist;
};

enum op_kind {
	OP_PUSH,
	OP_PULL,
	OP_PUSH_PULL,
	OP_INIT,
};

/* pbox.Handle (handle.c): the operations (ops.c) fill it in and start it. */
struct handle {
	PyObject ob_base;
	struct pbox_client *pc; /* to submit with: set just before, with the GIL held */
	enum op_kind kind;
	uint32_t key, iter, nops; /* key / iter: the first operation's, for messages */
	Py_buffer in, out;
	bool has_in, has_out;
	PyObject *notify, *result;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	uint32_t remaining; /* callbacks still due (atomic) */
	bool done;          /* under lock */
	int status;         /* under lock: 0 or the first error */
	char msg[512];      /* under lock: the first error's message */
};

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

/* ---- client.c ----------------------------------------------------------------------- */

extern PyTypeObject g_pbox_py_client_type; /* pbox.Client: struct client */

/* 0 if self is open, else -1 with PboxError ("the pbox client is closed") set. */
int pbox_py_check_open(struct client *self);

/* Key id among the keys registered with self, or NULL (no exception set). */
const struct ckey *pbox_py_find_key(const struct client *self, uint32_t id);

/* ---- ops.c -------------------------------------------------------------------------- */

/* The methods of Client for its operations, blocking (they return None once the
 * operation completes) and _async (they return its Handle). Each raises PboxError, or a
 * TypeError / ValueError / KeyError for its arguments. */
PyObject *pbox_py_client_op_push(struct client *self, PyObject *args, PyObject *kw);
PyObject *pbox_py_client_op_push_async(struct client *self, PyObject *args, PyObject *kw);
PyObject *pbox_py_client_op_pull(struct client *self, PyObject *args, PyObject *kw);
PyObject *pbox_py_client_op_pull_async(struct client *self, PyObject *args, PyObject *kw);
PyObject *pbox_py_client_op_push_pull(struct client *self, PyObject *args, PyObject *kw);
PyObject *pbox_py_client_op_push_pull_async(struct client *self, PyObject *args, PyObject *kw);
PyObject *pbox_py_client_op_init(struct client *self, PyObject *args, PyObject *kw);
PyObject *pbox_py_client_op_init_async(struct client *self, PyObject *args, PyObject *kw);

/* Client.push_pull_many(buffer, slices, notify=None, result=None) -> Handle. */
PyObject *pbox_py_client_push_pull_many(struct client *self, PyObject *args, PyObject *kw);

/* ---- handle.c ----------------------------------------------------------------------- */

extern PyTypeObject g_pbox_py_handle_type; /* pbox.Handle: struct handle */

/* Set on libpbox progress threads (they run Python code only inside pbox_py_op_done). */
extern __thread bool g_pbox_py_progress_thread;

/* A new Handle for nops operations of kind, not started (remaining 0, no buffers); NULL
 * with an exception set. */
struct handle *pbox_py_handle_new(enum op_kind kind, uint32_t nops);

/* The last callback of h (progress thread, or the submitting thread when a group could
 * not be started whole), with or without the GIL: marks h done and wakes its waiters,
 * then takes the GIL (PyGILState_Ensure) to complete its notify object, release its
 * buffers and drop the operations' reference to h. */
void pbox_py_handle_complete(struct handle *h);

/* Record status and msg as h's error unless it has one already. Any thread, no GIL
 * needed. */
void pbox_py_handle_note_error(struct handle *h, int status, const char *msg);

/* libpbox's completion callback (pbox_done_fn) for every operation of a Handle, arg the
 * Handle: progress thread, no GIL. */
void pbox_py_op_done(uint32_t key, int status, void *arg);

/* Wait for h with the GIL released, in slices so that signals are handled; timeout_ns < 0:
 * no limit. Returns 1 when done, 0 when the timeout passed, -1 with an exception set (a
 * signal handler raised). */
int pbox_py_handle_wait_done(struct handle *h, int64_t timeout_ns);

/* After h is done: None, or raise its error (the PboxError subclass of its status). */
PyObject *pbox_py_handle_result(struct handle *h);

/* ---- memory.c ----------------------------------------------------------------------- */

extern PyTypeObject g_pbox_py_mem_type; /* pbox.Memory: struct mem */

/* Before self closes: every live Memory of self keeps its mapping, no longer libpbox's
 * (pbox_mem_detach), and new views of it are refused. */
void pbox_py_mem_detach_all(struct client *self);

/* Client.alloc(nbytes) -> Memory. */
PyObject *pbox_py_client_alloc(struct client *self, PyObject *args, PyObject *kw);

#endif /* PBOX_PYTHON_PBOX_H */
