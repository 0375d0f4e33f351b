#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Write the seed corpus of fuzz_shm (tests/fuzz/corpus/shm/seed-*), following the byte
grammar of tests/fuzz/fuzz_shm.c: honest traffic that wraps the ring several times, and
each kind of hostile write (a tail out of range or backwards, a record header of no
kind, a zero or huge length, a record past the tail or the area's end, a wrap past the
tail, a consumer index that goes backwards or past the tail), and reference records (a
worker's push from its registered memory) that pboxd's consumer resolves against its
region: in bounds, past the end, an offset that overflows, another region's id, a zero
or too large length, and one sent to a consumer that takes none. Re-run after changing
the grammar.

Usage: tests/fuzz/gen_corpus_shm.py
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
SIZE = 4 * 65536
DGRAM, WRAP = 0x44475231, 0x50525731


def push(n):
    return bytes([0]) + struct.pack("<H", n)


def tail(v):
    return bytes([1]) + struct.pack("<Q", v)


def tail_rel(d):
    return bytes([2]) + struct.pack("<h", d)


def record(pos, ln, kind, raw=0):
    b = bytes([3]) + struct.pack("<IIB", pos, ln, kind)
    return b + (struct.pack("<I", raw) if kind == 2 else b"")


def pop(m):
    return bytes([4, m])


def head(v):
    return bytes([5]) + struct.pack("<Q", v)


def raw(pos, data):
    return bytes([6]) + struct.pack("<IB", pos, len(data)) + data


REGION, REGION_ID = 3 * 65536 + 123, 0x105


def ref(region, ln, off, first=False):
    """A reference record; first: the input's first byte, which also makes the consumer
    accept references (bit 6)."""
    return bytes([7 | (0x40 if first else 0)]) + struct.pack("<IIQ", region, ln, off)


def seeds():
    s = []
    honest = b"".join(push(n) + push(n // 3) + pop(1) + pop(5)
                      for n in [0, 1, 1400, 8192, 65408, 60000, 333, 40000] * 6)
    s.append(("honest-wraps", honest))
    s.append(("full", b"".join(push(60000) for _ in range(6)) + pop(2) + push(60000) +
              pop(63)))
    s.append(("tail-far", tail(SIZE + 64) + pop(3)))
    s.append(("tail-negative", tail(2**64 - 64) + pop(3)))
    s.append(("tail-back", push(100) + pop(1) + tail(64) + pop(1)))
    s.append(("kind", record(0, 64, 2, 0x12345678) + tail(128) + pop(1)))
    s.append(("len-zero", record(0, 0, 0) + tail(128) + pop(1)))
    s.append(("len-huge", record(0, 70000, 0) + tail(SIZE) + pop(1)))
    s.append(("past-tail", record(0, 1000, 0) + tail(128) + pop(1)))
    s.append(("past-end", record(SIZE - 128, 4096, 0) + record(0, 0, 1) + tail(SIZE) +
              pop(63)))
    s.append(("wrap-past-tail", record(0, 0, 1) + tail(64) + pop(1)))
    s.append(("rewrite-after-push", push(500) + raw(64, bytes(range(64))) +
              record(0, 3000, 0) + pop(1) + push(10) + tail_rel(5) + pop(4)))
    s.append(("head-back", b"".join(push(60000) for _ in range(5)) + head(120320) +
              push(60000) + push(60000) + head(64) + push(60000)))
    s.append(("head-ahead", push(100) + head(2**40) + b"".join(push(60000) for _ in range(5))))
    s.append(("ref-ok", ref(REGION_ID, 65000, 0, True) + ref(REGION_ID, 123, REGION - 123) +
              ref(REGION_ID, 1, REGION - 1) + pop(63)))
    s.append(("ref-past-end", ref(REGION_ID, 124, REGION - 123, True) +
              ref(REGION_ID, 1, REGION) + ref(REGION_ID, 64, REGION + 4096) + pop(63)))
    s.append(("ref-off-overflow", ref(REGION_ID, 4096, 2**64 - 64, True) +
              ref(REGION_ID, 65000, 2**63) + pop(63)))
    s.append(("ref-other-id", ref(REGION_ID + 256, 64, 0, True) + ref(0, 64, 0) +
              ref(2**32 - 1, 64, 0) + pop(63)))
    s.append(("ref-len", ref(REGION_ID, 0, 0, True) + ref(REGION_ID, 65409, 0) +
              ref(REGION_ID, 2**32 - 1, 0) + pop(63)))
    s.append(("ref-not-accepted", ref(REGION_ID, 64, 0) + pop(1)))
    s.append(("ref-rewritten", ref(REGION_ID, 64, 0, True) + raw(128, b"\xff" * 16) + pop(1)))
    return s


def main():
    d = os.path.join(HERE, "corpus", "shm")
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        if f.startswith("seed-"):
            os.remove(os.path.join(d, f))
    ss = seeds()
    for i, (label, data) in enumerate(ss):
        with open(os.path.join(d, "seed-%02d-%s" % (i, label)), "wb") as f:
            f.write(data)
    print("shm: %d seeds" % len(ss))


if __name__ == "__main__":
    main()
