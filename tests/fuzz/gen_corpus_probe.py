#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Write the seed corpus of fuzz_probe (tests/fuzz/corpus/probe/seed-*), following the
byte grammar of tests/fuzz/fuzz_probe.c: valid datagrams of every type for the decoder,
responder sessions (HELLO, a stream of DATA, REPORT_REQ, BYE; a second peer on the
same address; a stale token after the idle time), and the JSON request and result
messages. Re-run after changing the grammar.

Usage: tests/fuzz/gen_corpus_probe.py
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
MAGIC, VERSION = 0x50534250, 1
HELLO, ACK, DATA, REQ, REPORT, BYE = 1, 2, 3, 4, 5, 6


def hdr(t, token):
    return struct.pack("<IBBHQ", MAGIC, VERSION, t, 0, token)


def pad(b, n):
    return b + bytes(max(0, n - len(b)))


def datagrams():
    return [
        ("hello", pad(hdr(HELLO, 0) + struct.pack("<Q", 7), 64)),
        ("ack", hdr(ACK, 99) + struct.pack("<QHHI", 7, 400, 9000, 0)),
        ("data", pad(hdr(DATA, 99) + struct.pack("<IHHIIq", 1, 3, 100, 120000, 0, 5), 1472)),
        ("report-req", pad(hdr(REQ, 99) + struct.pack("<I", 1), 64)),
        ("report", hdr(REPORT, 99) + struct.pack("<IHHQqqqii", 1, 100, 97, 145000, 1000,
                                                 11880000, 12000000, 700000, 550000)),
        ("bye", hdr(BYE, 99)),
    ]


# responder events (see responder_session() in fuzz_probe.c)
def ev_hello(peer, nonce):
    return bytes([peer, 0, 2, 0, nonce, 0, 0]) + struct.pack("<H", 10)


def ev_data(peer, stream, seq, count, rx):
    # token: the peer's; type 1; count-2; seq; len-40; stream; bool(period 100 us);
    # send_ns; no corruption, no truncation; rx offset
    return (bytes([peer, 0, 0, 1, count - 2, seq, 100, stream, 1]) +
            struct.pack("<q", 1000000 + 100000 * seq) + bytes([0, 0]) +
            struct.pack("<H", rx))


def ev_req(peer, stream):
    return bytes([peer, 0, 0, 2, stream, 0, 0]) + struct.pack("<H", 0)


def ev_bye(peer):
    return bytes([peer, 0, 0, 3, 0, 0]) + struct.pack("<H", 0)


def ev_wait(short):
    return bytes([0, 6]) + struct.pack("<H", 500) if short else bytes([0, 7])


def sessions():
    conf = bytes([1, 3, 1, 199])  # mode odd; 4 sessions; 2 per address; 200 HELLO/s
    stream = b"".join(ev_data(0, 1, s, 20, 100 * s + (s * s) % 7) for s in range(20))
    rising = b"".join(ev_data(0, 2, s, 20, 400 * s) for s in range(20))
    return [
        ("session", conf + ev_hello(0, 1) + stream + ev_req(0, 1) + ev_bye(0)),
        ("two-streams", conf + ev_hello(0, 1) + stream + ev_req(0, 1) + rising +
         ev_req(0, 2) + ev_req(0, 1)),
        ("shared-addr", conf + ev_hello(0, 1) + ev_hello(1, 2) + ev_hello(1, 3) +
         ev_hello(2, 4) + ev_data(1, 1, 0, 10, 0) + ev_req(1, 1)),
        ("expired", conf + ev_hello(0, 1) + ev_wait(False) + stream + ev_req(0, 1) +
         ev_hello(0, 1) + ev_wait(True) + ev_req(0, 3)),
    ]


def messages():
    return [
        ("request", '{"peer": "10.0.0.2:55001", "cap_bps": 2e8, "budget_ms": 5000, '
                    '"resolution": 0.05, "mtu": 1500, "streams": 12, "stream_len": 100}'),
        ("request-v6", '{"peer": "[fd00::2]:9", "cap_bps": 1000000000, "budget_ms": 10000}'),
        ("request-over", '{"peer": "10.0.0.2", "cap_bps": 5e9, "budget_ms": 5000}'),
        ("result", '{"peer": "10.0.0.2:55001", "r_min_bps": 49000000.0, "r_max_bps": '
                   '51000000.0, "grey_min_bps": 49500000.0, "grey_max_bps": 50000000.0, '
                   '"adr_bps": 60000000.0, "flags": ["converged", "sender_limited"], '
                   '"fleets": 7, "streams": 70, "bytes_sent": 1500000, "max_stream_bps": '
                   '60000000.0, "timestamp_ns": 1795591961026128689, "duration_ns": 482453383}'),
    ]


def main():
    d = os.path.join(HERE, "corpus", "probe")
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        if f.startswith("seed-"):
            os.remove(os.path.join(d, f))
    seeds = ([("dgram-" + n, b"\x00" + b) for n, b in datagrams()] + sessions() +
             [("json-" + n, b"\x02" + t.encode()) for n, t in messages()])
    for i, (label, data) in enumerate(seeds):
        with open(os.path.join(d, "seed-%02d-%s" % (i, label)), "wb") as f:
            f.write(data)
    print("probe: %d seeds" % len(seeds))


if __name__ == "__main__":
    main()
