#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Results received straight into the caller's buffer (libpbox's receive placement,
PBOX_RX_PLACE=1) over real UDP at MTU 65535 (32 KB fragments: one datagram per chunk),
with loss, duplicates and reordering injected on pboxd's and every worker's sends, push-
pulls in place (grad == out) and into another buffer: every result is exact, nothing
fails, and results did land in place (pbox_client_rx_placed). Ranks run in threads,
calling libpbox through ctypes (which releases the GIL during each call)."""
import ctypes
import os

from pboxtest import ClientOpts, KeyInfo, Pboxd, fail, load_libpbox, run_threads

WORKERS = 3
ITERS = 6
KEYS = {0: 400000, 1: 8000, 2: 1}  # 49 chunks, one short chunk, one value
FAULT = "drop=0.03,dup=0.03,reorder=0.05"


def grad(rank, it, key, i):
    """Small integers: sums are exact in float32 in any order."""
    return float(((rank + 2) * 5 + it * 3 + key * 11 + i % 17) % 40 - 20)


def main():
    os.environ["PBOX_RX_PLACE"] = "1"  # read by each client's progress thread
    lib = load_libpbox()
    lib.pbox_last_error.restype = ctypes.c_char_p
    lib.pbox_client_rx_placed.restype = ctypes.c_uint64
    jobs = [{"id": 1, "token": "a", "workers": WORKERS, "mode": "aggregate",
             "reduce": "sum"}]
    placed = [0] * WORKERS

    def rank(r, control):
        c = ctypes.c_void_p()
        o = ClientOpts(server=control.encode(), job=1, token=b"a", rank=r, timeout_ms=60000,
                       fault=("%s,seed=%d" % (FAULT, 70 + r)).encode())
        keys = (KeyInfo * len(KEYS))(*[KeyInfo(k, n) for k, n in KEYS.items()])
        if lib.pbox_connect(ctypes.byref(o), ctypes.byref(c)) < 0:
            raise RuntimeError("rank %d: %s" % (r, lib.pbox_last_error().decode()))
        try:
            if lib.pbox_register(c, keys, len(KEYS)) < 0:
                raise RuntimeError("rank %d: %s" % (r, lib.pbox_last_error().decode()))
            for it in range(ITERS):
                for k, n in KEYS.items():
                    src = (ctypes.c_float * n)(*[grad(r, it, k, i) for i in range(n)])
                    # Odd iterations in place, even ones into a buffer of stale values.
                    dst = src if it % 2 else (ctypes.c_float * n)(*([7.5] * n))
                    if lib.pbox_push_pull(c, k, it, src, dst) < 0:
                        raise RuntimeError("rank %d key %d iteration %d: %s" % (
                            r, k, it, lib.pbox_last_error().decode()))
                    for i in range(n):
                        want = sum(grad(q, it, k, i) for q in range(WORKERS))
                        if dst[i] != want:
                            raise RuntimeError("rank %d key %d iteration %d element %d: "
                                               "%r, want %r" % (r, k, it, i, dst[i], want))
            placed[r] = lib.pbox_client_rx_placed(c)
        finally:
            lib.pbox_close(c)

    with Pboxd(jobs, cores=2, mtu=65535, fault=FAULT + ",seed=11") as d:
        run_threads(WORKERS, lambda r: rank(r, d.control))
        print("results received in place per rank: %s" % placed)
        if sum(placed) == 0:
            fail("no result was received in place: placement did not run")
    print("ok")


if __name__ == "__main__":
    main()
