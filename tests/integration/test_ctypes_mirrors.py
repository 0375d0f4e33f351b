#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The ctypes mirrors of pbox.h's structs (pboxtest.MIRRORS) match the C structs, and
pbox_client_stats exports the shared-memory transport's counters.

1. Every mirror agrees with the struct as this tree compiles it (pbox-abi-dump: size, and
   each field's name, order, offset and size), and with pbox_struct_size of libpbox.so.
   (A field added to struct pbox_client_stats without its mirror made test_in_place_loss
   crash: libpbox wrote past the Python object.)
2. No Python file of the source tree (build trees aside) defines a ctypes.Structure of
   its own: a mirror lives in pboxtest.py, where (1) checks it.
3. A mirror that disagrees makes load_libpbox fail with a message naming the struct,
   before any call can write past it.
4. pbox_client_stats through ctypes: over the shared-memory transport the results read
   through descriptors are counted (shm_rx_desc), none stale, torn or out of bounds; over
   UDP every shm_* counter stays zero."""
import ast
import ctypes
import json
import os
import subprocess
import sys

import pboxtest
from pboxtest import (ClientOpts, KeyInfo, MIRRORS, Pboxd, build_path, check_mirrors,
                      client_stats, fail, load_libpbox)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SHM_FIELDS = ("shm_rx_desc", "shm_stale", "shm_torn", "shm_bad_desc", "shm_tx_full",
              "shm_tx_waits")


def part_layout(lib):
    dump = json.loads(subprocess.run([build_path("tests/integration/pbox-abi-dump")],
                                     capture_output=True, text=True, check=True).stdout)
    for name, mirror in MIRRORS.items():
        if name not in dump:
            fail("pbox-abi-dump does not list struct %s (add it to abi_dump.c)" % name)
        c = dump[name]
        py = [(f[0], getattr(mirror, f[0]).offset, getattr(mirror, f[0]).size)
              for f in mirror._fields_]
        cf = [tuple(f) for f in c["fields"]]
        if py != cf:
            diff = [(a, b) for a, b in zip(py, cf) if a != b] or (py[len(cf):], cf[len(py):])
            fail("struct %s: mirror %s (name, offset, size) %s, C %s; first differences %s"
                 % (name, mirror.__name__, py, cf, diff))
        if ctypes.sizeof(mirror) != c["size"]:
            fail("struct %s: mirror %d bytes, C %d (a field missing from both the mirror and "
                 "abi_dump.c?)" % (name, ctypes.sizeof(mirror), c["size"]))
        end = max(off + size for _, off, size in cf)
        align = max(ctypes.alignment(t) for _, t in mirror._fields_)
        if c["size"] - end >= align:
            fail("struct %s: %d bytes past its last listed field (%d): a field is missing "
                 "from abi_dump.c and the mirror" % (name, c["size"] - end, end))
        if lib.pbox_struct_size(name.encode()) != c["size"]:
            fail("pbox_struct_size(%s) = %d, the C struct is %d" %
                 (name, lib.pbox_struct_size(name.encode()), c["size"]))
    if lib.pbox_struct_size(b"pbox_no_such_struct") != 0 or lib.pbox_struct_size(None) != 0:
        fail("pbox_struct_size of an unknown name is not 0")
    print("layout: %s match the C structs" %
          ", ".join("%s (%d B)" % (n, ctypes.sizeof(m)) for n, m in MIRRORS.items()))


def part_no_stray_mirrors():
    stray = []
    for top in (ROOT,):
        for dirpath, dirs, files in os.walk(top):
            # build trees (build, build-ci, ...) and git's files are not sources
            dirs[:] = [x for x in dirs if not x.startswith(("build", ".")) and
                       not os.path.exists(os.path.join(dirpath, x, "meson-private"))]
            for fn in files:
                path = os.path.join(dirpath, fn)
                if not fn.endswith(".py") or os.path.samefile(path, pboxtest.__file__):
                    continue
                with open(path, encoding="utf-8") as f:
                    try:
                        tree = ast.parse(f.read(), path)
                    except SyntaxError:
                        continue
                for node in ast.walk(tree):
                    if isinstance(node, ast.ClassDef) and any(
                            ast.unparse(b).endswith("Structure") for b in node.bases):
                        stray.append("%s:%d class %s" % (
                            os.path.relpath(path, ROOT), node.lineno, node.name))
    if stray:
        fail("ctypes structures outside pboxtest.py (mirror pbox structs in pboxtest.MIRRORS, "
             "where this test checks them): %s" % stray)
    print("no stray mirrors: no Python file of the tree defines a ctypes.Structure of its own")


def part_mismatch_refused(lib):
    short = type("ShortStats", (ctypes.Structure,),
                 {"_fields_": pboxtest.ClientStats._fields_[:-1]})
    saved = dict(MIRRORS)
    MIRRORS["pbox_client_stats"] = short
    r, w = os.pipe()
    old = os.dup(2)
    os.dup2(w, 2)
    try:
        check_mirrors(lib)
        code = None
    except SystemExit as e:
        code = e.code
    finally:
        os.dup2(old, 2)
        os.close(w)
        MIRRORS.clear()
        MIRRORS.update(saved)
    msg = os.read(r, 4096).decode()
    os.close(r)
    if code != 1 or "ShortStats" not in msg or "pbox_client_stats" not in msg:
        fail("a mirror 8 bytes short was not refused with a clear error (exit %r): %r" %
             (code, msg))
    print("mismatch refused: %s" % msg.strip())


def run_rank(lib, control, transport):
    os.environ["PBOX_TRANSPORT"] = transport  # read by pbox_register
    lib.pbox_transport.restype = ctypes.c_char_p
    c = ctypes.c_void_p()
    n = 50000
    o = ClientOpts(server=control.encode(), job=1, token=b"a", rank=0, timeout_ms=30000)
    keys = (KeyInfo * 1)(KeyInfo(0, n))
    if lib.pbox_connect(ctypes.byref(o), ctypes.byref(c)) < 0 or \
            lib.pbox_register(c, keys, 1) < 0:
        fail("%s: %s" % (transport, lib.pbox_last_error().decode()))
    try:
        if lib.pbox_transport(c).decode() != transport:
            fail("asked for %s, got %s" % (transport, lib.pbox_transport(c).decode()))
        for it in range(4):
            buf = (ctypes.c_float * n)(*[float((i + it) % 7) for i in range(n)])
            if lib.pbox_push_pull(c, 0, it, buf, buf) < 0:
                fail("%s iteration %d: %s" % (transport, it, lib.pbox_last_error().decode()))
            if any(buf[i] != float((i + it) % 7) for i in range(0, n, 997)):
                fail("%s iteration %d: wrong result" % (transport, it))
        return client_stats(lib, c)
    finally:
        lib.pbox_close(c)


def part_shm_counters(lib):
    lib.pbox_last_error.restype = ctypes.c_char_p
    jobs = [{"id": 1, "token": "a", "workers": 1, "mode": "aggregate", "reduce": "sum"}]
    with Pboxd(jobs, cores=2) as d:  # shm on by default
        shm = run_rank(lib, d.control, "shm")
        udp = run_rank(lib, d.control, "udp")
    got = {f: getattr(shm, f) for f in SHM_FIELDS}
    print("shm: %d ops, %s" % (shm.ops_done, got))
    if shm.ops_done != 4 or shm.shm_rx_desc == 0:
        fail("shm: results read through descriptors not counted: %s" % got)
    if shm.shm_stale or shm.shm_torn or shm.shm_bad_desc:
        fail("shm: stale / torn / bad descriptors with one worker reading at once: %s" % got)
    if udp.ops_done != 4 or any(getattr(udp, f) for f in SHM_FIELDS):
        fail("udp: shm counters moved: %s" % {f: getattr(udp, f) for f in SHM_FIELDS})
    print("udp: %d ops, every shm_* counter 0" % udp.ops_done)


def main():
    lib = load_libpbox()  # check_mirrors: sizes agree, or a clear failure
    part_layout(lib)
    part_no_stray_mirrors()
    part_mismatch_refused(lib)
    part_shm_counters(lib)
    print("ctypes mirrors: OK")


if __name__ == "__main__":
    sys.exit(main())
