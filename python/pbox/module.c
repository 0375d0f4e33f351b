/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The module pbox._pbox: its functions (version, _set_buffer_adapter) and PyInit__pbox,
 * which readies the types Client, Handle and Memory and adds them, with the exception
 * classes, to the module. pbox/__init__.py gives them to users.
 */
#include "_pbox.h"

static PyObject *mod_version(PyObject *m, PyObject *unused)
{
	(void)m;
	(void)unused;
	return PyUnicode_FromString(pbox_version());
}

static PyMethodDef g_mod_methods[] = {
	{ "version", mod_version, METH_NOARGS, "version()\n--\n\nlibpbox's version string." },
	{ "_set_buffer_adapter", pbox_py_set_buffer_adapter, METH_O,
	  "Install fn(obj, role) -> buffer object, used for arguments without the buffer "
	  "protocol (torch tensors)." },
	{ NULL, NULL, 0, NULL },
};

static struct PyModuleDef g_module = {
	PyModuleDef_HEAD_INIT,
	.m_name = "pbox._pbox",
	.m_doc = "CPython binding of libpbox, the pbox worker library.",
	.m_size = -1,
	.m_methods = g_mod_methods,
};

PyMODINIT_FUNC PyInit__pbox(void);

PyMODINIT_FUNC PyInit__pbox(void)
{
	PyObject *m;

	if (PyType_Ready(&g_pbox_py_client_type) < 0 || PyType_Ready(&g_pbox_py_handle_type) < 0 ||
	    PyType_Ready(&g_pbox_py_mem_type) < 0) {
		return NULL;
	}
	m = PyModule_Create(&g_module);
	if (m == NULL) {
		return NULL;
	}
	if (pbox_py_errors_create() < 0) {
		goto err;
	}
	Py_INCREF(&g_pbox_py_client_type);
	Py_INCREF(&g_pbox_py_handle_type);
	Py_INCREF(&g_pbox_py_mem_type);
	if (PyModule_AddObject(m, "Client", (PyObject *)&g_pbox_py_client_type) < 0 ||
	    PyModule_AddObject(m, "Handle", (PyObject *)&g_pbox_py_handle_type) < 0 ||
	    PyModule_AddObject(m, "Memory", (PyObject *)&g_pbox_py_mem_type) < 0) {
		goto err;
	}
	if (pbox_py_errors_add(m) < 0) {
		goto err;
	}
	return m;
err:
	Py_DECREF(m);
	return NULL;
}
