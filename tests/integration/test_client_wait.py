#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""libpbox's pbox_wait / pbox_wait_all with a finite timeout wait that long: an operation
that cannot complete (the job's other rank never pushes) makes them return -ETIMEDOUT
after the timeout, not at once (the condition variable's clock used to be
CLOCK_REALTIME against CLOCK_MONOTONIC deadlines), and the operation is still in flight
afterwards. Calls the C API through ctypes."""
import ctypes
import errno
import time

from pboxtest import ClientOpts, KeyInfo, Pboxd, fail, load_libpbox


def main():
    lib = load_libpbox()
    lib.pbox_last_error.restype = ctypes.c_char_p
    jobs = [{"id": 1, "token": "a", "workers": 2, "mode": "aggregate"}]
    with Pboxd(jobs, cores=1) as d:
        c = ctypes.c_void_p()
        o = ClientOpts(server=d.control.encode(), job=1, token=b"a", rank=0, timeout_ms=20000)
        keys = (KeyInfo * 1)(KeyInfo(0, 100))
        buf = (ctypes.c_float * 100)()
        if (lib.pbox_connect(ctypes.byref(o), ctypes.byref(c)) < 0
                or lib.pbox_register(c, keys, 1) < 0
                or lib.pbox_push_pull_async(c, 0, 0, buf, buf, None, None) < 0):
            fail("setting up: %s" % lib.pbox_last_error().decode())
        try:
            for name, call in (("pbox_wait", lambda: lib.pbox_wait(c, 0, 700)),
                               ("pbox_wait_all", lambda: lib.pbox_wait_all(c, 700))):
                t0 = time.monotonic()
                rc = call()
                took = time.monotonic() - t0
                msg = lib.pbox_last_error().decode()
                print("%s(700 ms) -> %d after %.3f s: %s" % (name, rc, took, msg))
                if rc != -errno.ETIMEDOUT or "still in flight" not in msg:
                    fail("%s: expected -ETIMEDOUT for an operation still in flight" % name)
                if not 0.6 <= took < 10:
                    fail("%s(700 ms) returned after %.3f s" % (name, took))
        finally:
            lib.pbox_close(c)
    print("ok")


if __name__ == "__main__":
    main()
