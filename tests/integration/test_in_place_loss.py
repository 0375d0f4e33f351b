#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""In-place push-pulls (grad == out, as the DDP hook does) through libpbox's C API over
real UDP at MTU 1500 (32 KB chunks of 24 fragments), with loss, duplicates and reordering
injected on pboxd's and on every worker's sends: every result is exact and nothing fails
(issue 9, defect 2: a lost result fragment made the retransmission re-read the partly
overwritten gradient and fail with EILSEQ). Ranks run in threads, calling libpbox through
ctypes (which releases the GIL during each call)."""
import ctypes

from pboxtest import (ClientOpts, KeyInfo, Pboxd, client_stats, fail, load_libpbox,
                      run_threads)

WORKERS = 3
ITERS = 8
KEYS = {0: 300000, 1: 8000, 2: 1}  # 37 chunks, one chunk of 23 fragments, one value
FAULT = "drop=0.04,dup=0.02,reorder=0.05"


def grad(rank, it, key, i):
    """Small integers: sums are exact in float32 in any order."""
    return float(((rank + 1) * 3 + it * 5 + key * 7 + i % 13) % 32 - 16)


def main():
    lib = load_libpbox()
    lib.pbox_last_error.restype = ctypes.c_char_p
    jobs = [{"id": 1, "token": "a", "workers": WORKERS, "mode": "aggregate",
             "reduce": "sum"}]
    stats = [None] * WORKERS

    def rank(r, control):
        c = ctypes.c_void_p()
        o = ClientOpts(server=control.encode(), job=1, token=b"a", rank=r, timeout_ms=60000,
                 fault=("%s,seed=%d" % (FAULT, 40 + r)).encode())
        keys = (KeyInfo * len(KEYS))(*[KeyInfo(k, n) for k, n in KEYS.items()])
        if lib.pbox_connect(ctypes.byref(o), ctypes.byref(c)) < 0:
            raise RuntimeError("rank %d: %s" % (r, lib.pbox_last_error().decode()))
        try:
            if lib.pbox_register(c, keys, len(KEYS)) < 0:
                raise RuntimeError("rank %d: %s" % (r, lib.pbox_last_error().decode()))
            for it in range(ITERS):
                for k, n in KEYS.items():
                    buf = (ctypes.c_float * n)(*[grad(r, it, k, i) for i in range(n)])
                    if lib.pbox_push_pull(c, k, it, buf, buf) < 0:
                        raise RuntimeError("rank %d key %d iteration %d: %s" % (
                            r, k, it, lib.pbox_last_error().decode()))
                    for i in range(n):
                        want = sum(grad(q, it, k, i) for q in range(WORKERS))
                        if buf[i] != want:
                            raise RuntimeError("rank %d key %d iteration %d element %d: "
                                               "%r, want %r" % (r, k, it, i, buf[i], want))
            stats[r] = client_stats(lib, c)
        finally:
            lib.pbox_close(c)

    with Pboxd(jobs, cores=2, mtu=1500, fault=FAULT + ",seed=9") as d:
        run_threads(WORKERS, lambda r: rank(r, d.control))
        for r, st in enumerate(stats):
            print("rank %d: %d ops, %d retransmits, %d probes, %d foreign" % (
                r, st.ops_done, st.retransmits, st.probes, st.foreign))
            if st.ops_failed != 0 or st.ops_done != ITERS * len(KEYS) or st.foreign != 0:
                fail("rank %d: unexpected counters" % r)
        if sum(st.retransmits + st.probes for st in stats) == 0:
            fail("the injected loss had no visible effect")
        tot = d.stats()["totals"]
        print("pboxd: rx_retransmits %d, replies_resent %d, nacks %d, drops %s" % (
            tot["rx_retransmits"], tot["replies_resent"], tot["nacks"],
            {k: v for k, v in tot["drops"].items() if v}))
        if tot["drops"]["bad_checksum"] != 0:
            fail("torn data reached the appliance")
    print("ok")


if __name__ == "__main__":
    main()
