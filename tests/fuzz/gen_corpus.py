#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Write the seed corpora of the fuzz harnesses: tests/fuzz/corpus/<name>/seed-*.

The seeds are the checked-in output of this script (re-run it after changing a harness's
input grammar; crash inputs found later are added by hand as regress-* files and are not
touched here). Each structured seed follows the byte grammar its harness reads (see the
harness's header comment): real sessions (a job's ranks say hello and register; every
rank pushes every fragment of every chunk for two iterations; a worker's push-pull gets
its result), so the fuzzer starts from inputs that already reach the deep code.

Usage: tests/fuzz/gen_corpus.py [HARNESS...]   (default: all)
"""
import ast
import json
import os
import re
import struct
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def write(name, seeds):
    d = os.path.join(HERE, "corpus", name)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        if f.startswith("seed-"):
            os.remove(os.path.join(d, f))
    for i, (label, data) in enumerate(seeds):
        with open(os.path.join(d, "seed-%02d-%s" % (i, label)), "wb") as f:
            f.write(data)
    print("%s: %d seeds" % (name, len(seeds)))


# ---- engine (fuzz_engine.c) -------------------------------------------------------------

PUSH, PULL, INIT, DATA, ACK = 0, 3, 5, 6, 7  # indexes into the harness's type table
F_WANT_REPLY, F_RETRANSMIT, F_CRC = 1, 2, 4
F_SACK, F_LAST = 0x40, 0x80


def engine_geometry(frag):
    """Chunks of job A (keys of 100 and 16 floats, chunk_bytes 256): fragment counts."""
    sizes = [256, 144, 64]
    return [(s + frag - 1) // frag for s in sizes]


def engine_cfg(server_opt=False, det=False, model=0, eager=False, verify=False, mean=False,
               ranks_idx=1, frag128=False, cores2=False, credits=1, clip=False,
               unreg=False, staleness=0, quorum=0, window_extra=0, opt=0):
    c0 = (int(server_opt) | det << 1 | model << 2 | eager << 5 | verify << 6 | mean << 7)
    c1 = (ranks_idx | frag128 << 2 | cores2 << 3 | (credits > 1) << 4 | (credits > 2) << 5 |
          clip << 6 | unreg << 7)
    c2 = staleness | quorum << 2 | window_extra << 4 | opt << 5
    return bytes([c0, c1, c2])


def eng_msg(typ, sender, chunk, frag=0, flags=0, delta=0, job_b=False, seq=0, mode=0,
            dvf=None):
    """A structured datagram event (ev 0): valid header, payload from the harness; dvf
    (a byte: threshold 0..3, codec << 2, index coding << 4, no bitmap << 6) re-encodes a
    payload as a DVF block."""
    sel = (7 if job_b else 0) | typ << 3 | (0x40 if dvf is not None else 0)
    out = bytes([0, sel, 0, flags, sender, chunk, delta & 0xff, seq])
    if typ in (PUSH, INIT, DATA):
        out += bytes([frag])
        if dvf is not None:
            out += bytes([dvf])
    return out + bytes([mode])


def eng_pull_sack(sender, chunk, base, sack, back=0, flags=F_SACK | F_RETRANSMIT, delta=0):
    """A PULL saying which result fragments the worker holds (base, 64-bit map, label
    = the wanted iteration minus back)."""
    sel = PULL << 3
    return (bytes([0, sel, 0, flags, sender, chunk, delta & 0xff, 0, base]) +
            struct.pack("<Q", sack) + bytes([back, 0]))


def engine_session(nranks, frag, server_opt, iters=2, flags=F_WANT_REPLY | F_CRC, order=None,
                   dvf=None):
    nfrags = engine_geometry(frag)
    out = b""
    if server_opt:
        for c, n in enumerate(nfrags):
            for f in range(n):
                out += eng_msg(INIT, 0, c, f, F_CRC)
    for it in range(iters):
        for r in (order or range(nranks)):
            for c, n in enumerate(nfrags):
                for f in range(n):
                    d = None if dvf is None else dvf[(r + c + f + it) % len(dvf)]
                    out += eng_msg(PUSH, r, c, f, flags, seq=it, dvf=d)
        for r in range(nranks):
            out += eng_msg(PULL, r, 0, delta=0xff)  # the iteration just completed
    return out


def engine_seeds():
    seeds = []
    ranks = {0: 1, 1: 2, 2: 3, 3: 65}
    for label, kw in [
        ("agg-bsp-2", dict()),
        ("agg-bsp-3-mean", dict(ranks_idx=2, mean=True)),
        ("agg-det-2cores", dict(det=True, cores2=True)),
        ("agg-1rank", dict(ranks_idx=0)),
        ("sopt-bsp-nag", dict(server_opt=True, opt=2)),
        ("sopt-det-adam", dict(server_opt=True, det=True, opt=3, ranks_idx=2)),
        ("sopt-ssp", dict(server_opt=True, model=1, staleness=2)),
        ("sopt-asp", dict(server_opt=True, model=2)),
        ("sopt-pssp-eager", dict(server_opt=True, model=3, staleness=1, eager=True)),
        ("sopt-psspdyn", dict(server_opt=True, model=4, staleness=1)),
        ("agg-drop-stragglers", dict(model=5, ranks_idx=2, quorum=1)),
        ("agg-credits3-verify", dict(credits=3, verify=True, frag128=True)),
        ("sopt-clip-adamw", dict(server_opt=True, clip=True, opt=4, window_extra=1)),
    ]:
        cfg = engine_cfg(**kw)
        n = ranks[kw.get("ranks_idx", 1)]
        frag = 128 if kw.get("frag128") else 64
        seeds.append((label, cfg + engine_session(n, frag, kw.get("server_opt", False))))
    # 65 ranks: bitmaps over two words; one iteration of one chunk, then rank 64 leaves.
    body = b"".join(eng_msg(PUSH, r, 2, 0, F_WANT_REPLY) for r in range(64))
    body += bytes([14, 0, 64, 3])  # leave: job A, rank 64, withdraw cookie, observe
    seeds.append(("agg-65ranks-leave", engine_cfg(ranks_idx=3) + body))
    # Lost results: every rank retransmits its last fragment (RETRANSMIT flag).
    body = engine_session(2, 64, False, iters=1)
    body += eng_msg(PUSH, 0, 2, 0, F_WANT_REPLY | F_RETRANSMIT, delta=0xff)
    seeds.append(("agg-retransmit", engine_cfg() + body))
    # Pushes beyond the window, then the window moves (RETRY).
    body = eng_msg(PUSH, 0, 2, 0, F_WANT_REPLY, delta=3) + engine_session(2, 64, False, 1)
    seeds.append(("agg-future-iter", engine_cfg() + body))
    # Job B next to job A, and a rank leaving mid-iteration.
    body = eng_msg(PUSH, 0, 0, 0, 0, job_b=True) + eng_msg(PUSH, 1, 0, 1, 0, job_b=True)
    body += eng_msg(PUSH, 0, 2, 0, F_WANT_REPLY) + bytes([14, 0, 1, 2])
    seeds.append(("two-jobs-leave", engine_cfg() + body))
    # An aborted job answers with errors.
    body = eng_msg(PUSH, 0, 2, 0, F_WANT_REPLY) + bytes([0xff]) + eng_msg(PULL, 1, 2)
    seeds.append(("abort", engine_cfg() + body))
    # Multi-piece delivery (iov mode 3, pieces of 17, 40 and 6 bytes, then the rest).
    body = b""
    for r in range(2):
        body += eng_msg(PUSH, r, 2, 0, F_WANT_REPLY | F_CRC, mode=3)[:-1] + bytes([3, 16, 39, 5])
    seeds.append(("iov", engine_cfg(verify=True) + body))
    # Raw datagrams: a real header, truncated, and with a bad magic (ev 12).
    hdr = struct.pack(">IBBHIIQIIIHBBIIIIQ", 0x50424F58, 1, 2, 0, 42, 0, 0x1000 + 42 * 65537,
                      2, 0, 0, 0, 0, 64, 64, 0, 0, 0, 0)
    raw = b""
    for dgram in (hdr, hdr[:40], b"XBOX" + hdr[4:]):
        # ev, length (4 bytes: fz_below of more than 256), core, bytes, elsewhere, mode
        raw += bytes([12]) + struct.pack("<I", len(dgram)) + bytes([0]) + dgram + bytes([0, 0])
    seeds.append(("raw", engine_cfg() + raw))
    # Selective repeat: rank 0 ends a round with fragment 2 of chunk 0 missing (NACK), sends
    # it, rank 1 completes the iteration; then rank 0 asks for the result holding 0 and 3.
    body = b"".join(eng_msg(PUSH, 0, 0, f, F_WANT_REPLY | (F_LAST if f == 3 else 0))
                    for f in (0, 1, 3))
    body += eng_msg(PUSH, 0, 0, 2, F_WANT_REPLY | F_RETRANSMIT | F_LAST)
    body += b"".join(eng_msg(PUSH, 1, 0, f, F_WANT_REPLY | (F_LAST if f == 3 else 0))
                     for f in range(4))
    body += eng_pull_sack(0, 0, 1, 0b100, delta=0xff)
    seeds.append(("agg-nack-sack-pull", engine_cfg() + body))
    # DVF blocks: every codec (none, lz4, snappy, zstd), index coding (auto, varint,
    # bitpack) and threshold (0..3), the bitmap on and off; aggregate (filtered results),
    # deterministic on 2 cores, server optimizer, multi-piece delivery.
    codes = [t | c << 2 | i << 4 | b << 6 for c in range(4) for i in range(3)
             for t, b in ((2, 0), (3, 0), (1, 1))]
    for label, kw in [("dvf-agg", dict()), ("dvf-det-2cores-mean", dict(det=True, cores2=True,
                                                                     mean=True)),
                      ("dvf-sopt-nag", dict(server_opt=True, opt=2))]:
        seeds.append((label, engine_cfg(**kw) + engine_session(
            2, 64, kw.get("server_opt", False), dvf=codes)))
    body = b""
    for r in range(2):
        body += eng_msg(PUSH, r, 2, 0, F_WANT_REPLY, mode=3, dvf=3)[:-1] + bytes([3, 10, 7, 5])
    seeds.append(("dvf-iov", engine_cfg() + body))
    # A block to job B (no DVF: refused), then damaged blocks (corrupt bit 8: bytes).
    body = eng_msg(PUSH, 0, 0, 0, 0, job_b=True, dvf=3)
    dmg = bytes([0, 0x40, 8, F_WANT_REPLY, 0, 0, 0, 0, 0, 1 | 2 << 2, 1, 70, 0xff, 90, 0x55, 0])
    seeds.append(("dvf-refused-damaged", engine_cfg() + body + dmg))
    return seeds


# ---- node (fuzz_node.c) ------------------------------------------------------------------

N_DATA, N_ACK, N_ERROR = 0, 2, 3
OP_PUSH, OP_PULL, OP_PUSH_PULL, OP_INIT = 0, 1, 2, 3


def node_cfg(nworkers=2, credits=1, cores2=False, server_opt=False, frag128=False,
             accept_newer=False, plain=False, rank=0, max_inflight=3, window512=False,
             unbounded=False, staleness=0):
    c0 = ((nworkers - 1) | (credits > 1) << 2 | cores2 << 3 | server_opt << 4 | frag128 << 5 |
          accept_newer << 6 | plain << 7)
    c1 = rank | (max_inflight - 1) << 2 | window512 << 4 | unbounded << 5 | staleness << 6
    return bytes([c0, c1])


def node_submit(op, kind, key=0, it=0, inplace=False):
    return bytes([0, op, kind | key << 2 | inplace << 3, it])


def node_reply(typ, op, chunk_in_key=0, flags=0, delta=0, frag=0, arg0=0, arg1=0):
    """A structured reply (ev 7) about op's key: chunk index within the key."""
    out = bytes([7, typ | flags << 2, 0, op, chunk_in_key, delta & 0xff, arg0, arg1])
    if typ == N_DATA:
        out += bytes([frag])
    return out


def node_nack(op, chunk_in_key, seq, base, sack, delta=0, arg1=0):
    """A NACK (ev 7, ACK with bits 64): fragments held from base."""
    return (bytes([7, N_ACK, 64, op, chunk_in_key, delta & 0xff, seq, arg1, base]) +
            struct.pack("<Q", sack))


def node_time(ms):
    return bytes([4, ms - 1])


def node_result(op, key, frag, delta=0):
    """Every fragment of every chunk of the key."""
    nfr = [(s + frag - 1) // frag for s in ([256, 144] if key == 0 else [64])]
    return b"".join(node_reply(N_DATA, op, c, 0, delta, f) for c, n in enumerate(nfr)
                    for f in range(n))


def node_dvf_result(op, key, frag, vals_seed=0):
    """Every fragment of every chunk of the key as a DVF block (bits 2: payload given,
    128: re-encoded with the byte that follows: thresholds 0.25..0.75, every codec)."""
    nfr = [(s + frag - 1) // frag for s in ([256, 144] if key == 0 else [64])]
    sizes = [256, 144] if key == 0 else [64]
    out = b""
    for c, n in enumerate(nfr):
        for f in range(n):
            ln = min(frag, sizes[c] - f * frag)
            vals = [((i * 7 + vals_seed + f) % 9 - 4) * 0.25 for i in range(ln // 4)]
            dv = (1 + (c + f) % 3) | ((c + f) % 4) << 2 | ((c + f) % 3) << 4
            out += bytes([7, N_DATA, 2 | 128, op, c, 0, 0, 0, f])
            out += struct.pack("<%df" % (ln // 4), *vals) + bytes([dv])
    return out


def node_seeds():
    s = []
    # push-pull answered with the result (aggregate, then server optimizer: version t+1).
    s.append(("agg-pushpull", node_cfg() + node_submit(0, OP_PUSH_PULL) + node_result(0, 0, 64)))
    s.append(("sopt-pushpull", node_cfg(server_opt=True) + node_submit(0, OP_PUSH_PULL, it=2) +
              node_result(0, 0, 64, delta=0)))
    # push acknowledged (NOTIFY-ACK), both chunks of key 0.
    s.append(("push-ack", node_cfg() + node_submit(1, OP_PUSH) + node_reply(N_ACK, 1, 0) +
              node_reply(N_ACK, 1, 1)))
    # push-pull acknowledged first, then the result is lost: probes, then it arrives.
    s.append(("ack-then-probe", node_cfg() + node_submit(0, OP_PUSH_PULL, key=1) +
              node_reply(N_ACK, 0, 0) + node_time(50) + node_time(100) +
              node_result(0, 1, 64)))
    # nothing answers: retransmissions with back-off, then the deadline.
    s.append(("timeout", node_cfg() + node_submit(0, OP_PUSH_PULL) + node_time(20) +
              node_time(60) + bytes([0x14, 130])))
    # the appliance refuses: abort, not initialised, stale.
    for i, label in enumerate(["aborted", "eagain", "estale"]):
        s.append(("error-" + label, node_cfg(server_opt=i == 1) + node_submit(0, OP_PUSH_PULL) +
                  node_reply(N_ERROR, 0, 0, arg0=i)))
    # the window moved: RETRY.
    s.append(("retry", node_cfg() + node_submit(0, OP_PUSH) + node_reply(N_ACK, 0, 0, flags=8)))
    # status answer to a probe.
    s.append(("status", node_cfg() + node_submit(0, OP_PUSH_PULL) + node_reply(N_ACK, 0, 0) +
              node_time(50) + node_reply(N_ACK, 0, 0, flags=32, arg1=1)))
    # init (server optimizer, rank 0), acknowledged with OF_INIT.
    s.append(("init", node_cfg(server_opt=True) + node_submit(2, OP_INIT, key=1) +
              node_reply(N_ACK, 2, 0, flags=16, delta=0)))
    # pull of an old version, in place.
    s.append(("pull-inplace", node_cfg(server_opt=True, staleness=1) +
              node_submit(3, OP_PULL, key=1, it=3, inplace=True) + node_result(3, 1, 64, -1)))
    # two credits: two push-pulls of one key in flight, answered out of order.
    s.append(("credits2", node_cfg(credits=2) + node_submit(0, OP_PUSH_PULL, it=0) +
              node_submit(1, OP_PUSH_PULL, it=1) + node_result(1, 0, 64) + node_result(0, 0, 64)))
    # plain flow: pushes complete when sent; lanes reused; acks later.
    s.append(("plain", node_cfg(plain=True) + node_submit(0, OP_PUSH, it=0) +
              node_submit(1, OP_PUSH, it=1) + node_reply(N_ACK, 0, 0) + node_reply(N_ACK, 0, 1)))
    # window limits: one chunk in flight at a time, 128-byte fragments, 2 cores.
    s.append(("window", node_cfg(max_inflight=1, window512=True, frag128=True, cores2=True) +
              node_submit(0, OP_PUSH_PULL) + node_submit(1, OP_PUSH_PULL, key=1) +
              node_result(0, 0, 128) + node_result(1, 1, 128)))
    # drop-stragglers worker: a newer result is accepted.
    s.append(("accept-newer", node_cfg(accept_newer=True) + node_submit(0, OP_PULL, it=1) +
              node_result(0, 0, 64, delta=2)))
    # duplicate fragments and a newer version restarting the collection.
    s.append(("dups", node_cfg(server_opt=True, unbounded=True) + node_submit(0, OP_PUSH_PULL) +
              node_reply(N_DATA, 0, 0, 0, 0, 0) + node_reply(N_DATA, 0, 0, 0, 0, 0) +
              node_reply(N_DATA, 0, 0, 0, 1, 1) + node_result(0, 0, 64, delta=1)))
    # a raw datagram (ev 3, length byte... fz_below(1089) reads 4 bytes) and a failure.
    s.append(("raw-fail", node_cfg() + node_submit(0, OP_PULL) + bytes([3, 10, 0, 0, 0]) +
              b"PBOX\x01\x04\x00\x00\x00\x00" + bytes([0xf6])))
    # selective repeat: chunk 0 (4 fragments, seqs 0..3) is NACKed holding 0 and 2; the
    # node re-sends 1 and 3; then the result comes.
    s.append(("nack", node_cfg() + node_submit(0, OP_PUSH_PULL) + node_nack(0, 0, 3, 1, 0b10) +
              node_time(20) + node_result(0, 0, 64)))
    # DVF job (2 workers): pushes filtered; the result comes as blocks.
    s.append(("dvf-agg-pushpull", node_cfg(nworkers=4) + node_submit(0, OP_PUSH_PULL) +
              node_dvf_result(0, 0, 64)))
    s.append(("dvf-sopt-push", node_cfg(nworkers=4, server_opt=True) +
              node_submit(1, OP_PUSH) + node_reply(N_ACK, 1, 0) + node_reply(N_ACK, 1, 1)))
    return s


# ---- control (fuzz_control.c) -------------------------------------------------------------

def ctl_line(conn, obj):
    """A raw-bytes event (ev 0) carrying one JSON line."""
    text = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
    assert len(text) < 512
    return bytes([0, conn]) + struct.pack("<I", len(text)) + text


def ctl_hello(conn, job, rank, right_token=True, version=1):
    f = (job - 1) | (0 if right_token else 8) | (16 if version != 1 else 0)
    out = bytes([4, conn, 0, f, rank])
    if not right_token:
        out += bytes([2])  # the empty token
    return out


def ctl_register(conn, keys_choice, extra=b""):
    return bytes([4, conn, 3, 0, keys_choice]) + extra


def ctl_seeds():
    s = []
    tok = {1: "s3cret", 2: "t0ken-two"}

    def hello(conn, job, rank, token=None):
        return ctl_line(conn, {"op": "hello", "job": job, "rank": rank,
                               "token": token or tok[job], "version": 1})

    # job 1 (free keys): two ranks join, register, train, leave cleanly.
    keys = [[0, 784], [1, 10]]
    s.append(("job1-session", hello(0, 1, 0) + ctl_line(0, {"op": "register", "keys": keys}) +
              hello(1, 1, 1) + ctl_line(1, {"op": "register", "keys": keys}) +
              ctl_line(0, {"op": "ping"}) + ctl_line(0, {"op": "leave"}) +
              ctl_line(1, {"op": "leave"})))
    # job 2 (fixed keys): three ranks, one is lost (connection closed): dropped.
    k2 = [[0, 300], [7, 16]]
    s.append(("job2-lost", b"".join(hello(c, 2, c) + ctl_line(c, {"op": "register", "keys": k2})
                                    for c in range(3)) + bytes([12, 1]) +
              ctl_line(0, {"op": "stats"})))
    # job 1, a rank lost: the session aborts, the other is told; then a new session.
    s.append(("job1-abort", hello(0, 1, 0) + ctl_line(0, {"op": "register", "keys": keys}) +
              hello(1, 1, 1) + ctl_line(1, {"op": "register", "keys": keys}) +
              bytes([12, 1]) + hello(2, 1, 1) + bytes([12, 0]) + hello(3, 1, 0)))
    # heartbeats: a silent member is declared dead at the tick (worker_timeout 3 s).
    s.append(("heartbeat", hello(0, 2, 0) + ctl_line(0, {"op": "register", "keys": k2}) +
              hello(1, 2, 1) + ctl_line(1, {"op": "register", "keys": k2}) +
              bytes([14, 0, 13, 40, 14, 0, 13, 40])))
    # refusals: wrong token, unknown job, rank out of range, twice the same rank, a key
    # set that differs, register before hello, hello twice, old protocol version.
    s.append(("refusals", hello(0, 1, 0, "nope") + ctl_line(0, {"op": "hello", "job": 9,
                                                                "rank": 0, "token": "x",
                                                                "version": 1}) +
              hello(0, 1, 5) + hello(0, 1, 0) + hello(1, 1, 0) + hello(0, 1, 1) +
              ctl_line(2, {"op": "register", "keys": keys}) +
              ctl_line(3, {"op": "hello", "job": 1, "rank": 1, "token": "s3cret",
                           "version": 2})))
    s.append(("keys-differ", hello(0, 1, 0) + ctl_line(0, {"op": "register", "keys": keys}) +
              hello(1, 1, 1) + ctl_line(1, {"op": "register", "keys": [[0, 784], [1, 11]]}) +
              hello(2, 2, 0) + ctl_line(2, {"op": "register", "keys": [[0, 300]]})))
    # garbage: not JSON, not an object, no op, unknown op, bad key shapes, a line in pieces.
    garbage = [b"{\n", b"[1,2]\n", b'{"job":1}\n', b'{"op":"dance"}\n', b"\x00\xff\n",
               b'{"op":"register","keys":[[1]]}\n', b'{"op":"register","keys":"x"}\n',
               b'{"op":"hello","job":"1","rank":0,"token":"s3cret","version":1}\n',
               b'{"op":"hello","job":1,"rank":-1,"token":"s3cret","version":1}\n',
               b'{"op":"hello","job":4294967297,"rank":0,"token":"s3cret","version":1}\n']
    s.append(("garbage", b"".join(bytes([0, 0]) + struct.pack("<I", len(g)) + g
                                  for g in garbage)))
    line = b'{"op":"hello","job":2,"rank":2,"token":"t0ken-two","version":1}\n'
    s.append(("split-line", bytes([1, 4]) + struct.pack("<I", 20) + line[:20] +
              bytes([2, 4]) + struct.pack("<I", len(line) - 20) + line[20:]))
    # structured events (the harness builds the requests): a session with job 2's keys.
    s.append(("structured", ctl_hello(0, 2, 0) + ctl_register(0, 0) + ctl_hello(1, 2, 1) +
              ctl_register(1, 0) + ctl_hello(2, 2, 2) + ctl_register(2, 3) +
              bytes([4, 0, 5, 0]) + bytes([4, 1, 6, 1])))
    s.append(("structured-job1", ctl_hello(0, 1, 0) + ctl_register(0, 2, bytes([1, 0x10, 0])) +
              ctl_hello(1, 1, 1, right_token=False) + ctl_register(1, 5, bytes([3, 1, 0, 9,
                                                                                 2, 0, 9, 3, 0,
                                                                                 9])) +
              bytes([0xfe])))
    # deferred registers (flag 128: not waited for at once): a stats request on a pending
    # connection (not handled, as in control.c), a rank that closes while its register
    # waits for the chunk state, the wait event (0xce), a register over the 16M memory
    # budget, and an allocation still in flight when the input ends (sessions_destroy).
    s.append(("pending", ctl_hello(2, 1, 0) +
              ctl_line(2, {"op": "register", "keys": [[0, 1 << 23]]}) +
              ctl_hello(0, 2, 0) + bytes([4, 0, 3, 128, 0]) + ctl_line(0, {"op": "stats"}) +
              ctl_hello(3, 1, 1) + bytes([4, 3, 3, 128, 2, 1, 0x10, 0]) +
              bytes([12, 3, 0xce]) + ctl_hello(1, 2, 1) + ctl_register(1, 0) +
              bytes([4, 2, 3, 128, 2, 1, 0x10, 0])))
    return s


# ---- config (fuzz_config.c) ----------------------------------------------------------------

def config_seeds():
    s = []
    for path in ["dataplane/pboxd/pboxd.conf.example", "python/examples/pboxd.conf"]:
        with open(os.path.join(ROOT, path), "rb") as f:
            s.append((os.path.basename(path).replace(".", "-"), f.read()))
    # The strings the unit tests load (each a real mistake or a valid file).
    with open(os.path.join(ROOT, "tests/unit/test_config.c")) as f:
        src = f.read()
    for m in re.finditer(r'(?:expect_error|load)\(((?:\s*"(?:[^"\\]|\\.)*")+)', src):
        text = ast.literal_eval("(" + m.group(1) + ")")
        if isinstance(text, tuple):
            text = "".join(text)
        s.append(("unit-%d" % len(s), text.encode()))
    full = b"""appliance = {
  transport = "udp"; data_address = "10.0.0.1"; base_port = 7100; control = "0.0.0.0:7000";
  cpus = [0, 1]; chunk_bytes = 4096; mtu = 9000; busy_poll = true; idle_us = 50; burst = 64;
  deterministic = true; stats_interval = 5; drain_timeout = 2; worker_timeout = 0;
  fault = "drop=0.1,dup=0.1,reorder=0.1,seed=3";
  dpdk = { eal = ["--vdev", "net_ring0"]; addresses = ["10.0.0.1"]; rx_desc = 512;
           tx_desc = 512; mbuf_bytes = 4096; tx_drain_us = 10; idle_sleep_us = 20;
           steering = "software"; zero_copy = false; };
};
jobs = (
  { id = 1; token = "a"; workers = 1024; mode = "server-optimizer"; window = 8;
    optimizer = { name = "adamw"; lr = 0.001; momentum = 0.0; wd = 0.01; rescale = 1.0;
                  clip = 5.0; beta1 = 0.9; beta2 = 0.999; eps = 1e-8; };
    sync = { model = "pssp-dyn"; staleness = 3; alpha = 2.0; release = "eager"; seed = 9; };
    flow = { mode = "notify-ack"; credits = 4; verify = true; };
    keys = ( [0, 1], [4294967295, 1000000] ); on_worker_loss = "abort"; },
  { id = 4294967295; token = "b"; workers = 5; mode = "aggregate"; reduce = "sum";
    sync = { model = "drop-stragglers"; quorum = 3; }; flow = { mode = "plain"; }; },
  { id = 0; token = "c"; workers = 2; sync = { model = "asp"; }; }
);
"""
    s.append(("everything", full))
    for label, text in [
        ("pssp", b'jobs = ({ id = 1; token = "t"; workers = 2; mode = "server-optimizer"; '
                 b'sync = { model = "pssp"; staleness = 2; probability = 0.25; }; });\n'),
        ("dup-id", b'jobs = ({ id = 1; token = "t"; workers = 2; }, '
                   b'{ id = 1; token = "u"; workers = 3; });\n'),
        ("window-small", b'jobs = ({ id = 1; token = "t"; workers = 2; window = 2; '
                         b'flow = { credits = 4; }; });\n'),
        ("bad-types", b'appliance = { cpus = ["a"]; cores = 1.5; busy_poll = 1; };\n'),
        ("nested", b'appliance = { dpdk = { eal = ( "x", ( "y" ) ); }; };\n'),
        ("mtu-frags", b'appliance = { chunk_bytes = 67108864; mtu = 576; };\n'),
        ("groups-lists", b'jobs = { id = 1; };\nappliance = ();\n'),
        ("keys-bad", b'jobs = ({ id = 1; token = "t"; workers = 2; keys = ( [0], [1, -1], '
                     b'[2, 1099511627777] ); });\n'),
        ("ports", b'appliance = { base_port = 65500; cores = 64; control = "[::1]:99999"; };\n'),
    ]:
        s.append((label, text))
    return s


# ---- xdp (fuzz_xdp.c) -------------------------------------------------------------------

XDP_COOKIES = (0x1111222233334444, 0x5555666677778888)


def xdp_dgram(typ=1, sender=0, cookie=None, job=3, chunk=0, frag_off=0, frag_len=1024,
              chunk_len=4096, encoding=1, magic=0x50424F58, version=1, payload=None):
    if cookie is None:
        cookie = XDP_COOKIES[sender] if sender < 2 else 1
    if payload is None:
        payload = bytes(frag_len)
    return struct.pack(">IBBHIIQIIIHBBIIIIQ", magic, version, typ, 0, job, sender, cookie,
                       chunk, 0, frag_off, frag_len, encoding, 64, chunk_len, 7, 0, 0,
                       0) + payload


def xdp_seeds():
    s = []
    push = xdp_dgram()
    pull = xdp_dgram(typ=2, frag_len=0, encoding=0, payload=b"")
    for label, mode, d in [
            ("push", 0x00, push), ("push-vlan", 0x01, push), ("push-qinq", 0x02, push),
            ("push-ihl7", 0x08, push), ("push-port1", 0x10, push),
            ("pull-rank1", 0x00, xdp_dgram(typ=2, sender=1, frag_len=0, encoding=0,
                                            payload=b"")),
            ("push-last-chunk", 0x00, xdp_dgram(chunk=3, frag_len=68, chunk_len=68)),
            ("pull", 0x04, pull),
            ("bad-magic", 0x00, xdp_dgram(magic=0x58424F58)),
            ("bad-version", 0x00, xdp_dgram(version=2)),
            ("bad-type", 0x00, xdp_dgram(typ=9)),
            ("unknown-job", 0x00, xdp_dgram(job=4)),
            ("bad-sender", 0x00, xdp_dgram(sender=2)),
            ("data-type", 0x00, xdp_dgram(typ=4)),
            ("bad-cookie", 0x00, xdp_dgram(cookie=XDP_COOKIES[1])),
            ("bad-length", 0x00, xdp_dgram(frag_len=1000)),
            ("truncated", 0x00, push[:40]),
            ("cut", 0x20, b"\x05" + push)]:
        s.append((label, bytes([mode]) + d))
    eth = b"\x02" * 6 + b"\x04" * 6
    s.append(("raw-arp", b"\x80" + eth + b"\x08\x06" + bytes(28)))
    s.append(("raw-ipv6", b"\x80" + eth + b"\x86\xdd" + bytes(60)))
    s.append(("raw-frag", b"\x80" + eth + b"\x08\x00\x45\x00\x00\x60\x00\x00\x20\x00\x40\x11"
              + bytes(2) + bytes([10, 0, 0, 2, 10, 0, 0, 1]) + b"\x9c\x40\x1b\xbc\x00\x50\x00\x00"
              + push[:72]))
# ---- dvf (fuzz_dvf.c, fuzz_dvf_codec.c) -------------------------------------------------

DVF_NONE, DVF_LZ4, DVF_ZSTD, DVF_SNAPPY, DVF_IGZIP = range(5)
DVF_DENSE, DVF_VARINT, DVF_BITPACK, DVF_BITMAP = 1, 2, 3, 4


def uleb(v):
    out = b""
    while v >= 0x80:
        out += bytes([v & 0x7f | 0x80])
        v >>= 7
    return out + bytes([v])


def lz4_literals(data):
    """An LZ4 block of one literal-only sequence (valid, uncompressed)."""
    n = len(data)
    out = bytes([min(n, 15) << 4])
    if n >= 15:
        rest = n - 15
        while rest >= 255:
            out += b"\xff"
            rest -= 255
        out += bytes([rest])
    return out + data


def snappy_literals(data):
    """A snappy stream of literal elements of up to 60 bytes each."""
    out = uleb(len(data))
    for i in range(0, len(data), 60):
        chunk = data[i:i + 60]
        out += bytes([(len(chunk) - 1) << 2]) + chunk
    return out


def zstd_frame(data, rle=False):
    """A single-segment zstd frame with one raw (or RLE of data[0]) block, content size in a
    4-byte field."""
    hdr = struct.pack("<IB", 0xFD2FB528, 0x80 | 0x20) + struct.pack("<I", len(data))
    block = 1 | (2 if rle else 0) << 1 | len(data) << 3
    return hdr + struct.pack("<I", block)[:3] + (data[:1] if rle else data)


def raw_deflate(data):
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


def dvf_compress(codec, raw):
    return {DVF_NONE: lambda d: d, DVF_LZ4: lz4_literals, DVF_ZSTD: zstd_frame,
            DVF_SNAPPY: snappy_literals, DVF_IGZIP: raw_deflate}[codec](raw)


def dvf_block(enc, codec, n, vals, idx=(), raw=None):
    """A DVF block (dataplane/dvf/dvf.h): header, then the payload compressed by codec."""
    vbytes = struct.pack("<%df" % len(vals), *vals)
    bits = 0
    if enc == DVF_VARINT:
        ib, prev = b"", 0
        for k, i in enumerate(idx):
            ib += uleb(i - prev if k else i)
            prev = i
    elif enc == DVF_BITPACK:
        bits = max(1, (n - 1).bit_length())
        acc = sum(i << (k * bits) for k, i in enumerate(idx))
        ib = acc.to_bytes((len(idx) * bits + 7) // 8, "little")
    elif enc == DVF_BITMAP:
        ib = sum(1 << i for i in idx).to_bytes((n + 7) // 8, "little")
    else:
        ib = b""
    payload = vbytes + ib if raw is None else raw
    comp = dvf_compress(codec, payload)
    hdr = struct.pack("<BBBBIIIII", 1, enc, codec, bits, n, len(vals), len(ib),
                      len(vbytes) + len(ib), len(comp))
    return hdr + comp


def dvf_seeds():
    s = []
    vals = [0.5, -1.25, 3.0, float("inf"), -2.0, 1e-3, 7.5, -0.125]
    sparse_idx = [3, 4, 17, 40, 41, 63, 80, 99]
    for codec in range(5):
        s.append(("dense-%d" % codec, b"\x00" + struct.pack("<H", 63) +
                  dvf_block(DVF_DENSE, codec, 16, vals + [0.0] * 8)))
        s.append(("varint-%d" % codec, b"\x00" + struct.pack("<H", 99) +
                  dvf_block(DVF_VARINT, codec, 100, vals, sparse_idx)))
        s.append(("bitpack-%d" % codec, b"\x00" + struct.pack("<H", 99) +
                  dvf_block(DVF_BITPACK, codec, 100, vals, sparse_idx)))
        s.append(("bitmap-%d" % codec, b"\x00" + struct.pack("<H", 99) +
                  dvf_block(DVF_BITMAP, codec, 100, vals, sparse_idx)))
    # a zstd bomb: an RLE block of 4 n + 100 zeros for a dense block of n = 16
    s.append(("bomb-zstd", b"\x00" + struct.pack("<H", 15) +
              dvf_block(DVF_DENSE, DVF_ZSTD, 16, [0.0] * 16)[:24 - 8] +
              struct.pack("<II", 64, len(zstd_frame(bytes(164), rle=True))) +
              zstd_frame(bytes(164), rle=True)))
    # structured: codec spec, index mode, sparse permille, n, threshold exponent, floats
    rng = 12345
    for k, (spec, mode, n, e) in enumerate([(0, 0, 100, 30), (1, 1, 1000, 28), (2, 2, 257, 26),
                                            (3, 0, 4095, 31), (4, 1, 64, 24), (5, 2, 900, 29),
                                            (6, 0, 33, 20), (7, 1, 2048, 30), (0, 3, 1000, 28),
                                            (1, 4, 777, 29), (4, 5, 4000, 30)]):
        floats = b""
        for i in range(n):
            rng = (rng * 6364136223846793005 + 1442695040888963407) % 2**64
            mag = ((rng >> 33) % 2000 - 1000) / 1000.0 * 2.0 ** -(8 + (rng >> 20) % 6)
            floats += struct.pack("<f", mag)
        body = (bytes([1, spec, mode]) + struct.pack("<I", 300) + struct.pack("<I", n - 1) +
                bytes([e]) + floats + bytes([2]) + struct.pack("<HB", 30, 0x40) +
                struct.pack("<HB", 50, 0x01))
        s.append(("enc-%d" % k, body))
    return s


def dvf_codec_seeds():
    s = []
    text = (b"pbox dvf " * 40) + bytes(range(256)) + bytes(300)
    for codec in range(5):
        stream = dvf_compress(codec, text)
        s.append(("raw-%d" % codec, bytes([codec, 0]) + struct.pack("<I", len(text)) + stream))
        s.append(("trip-%d" % codec, bytes([codec, 1 | codec << 1]) +
                  struct.pack("<I", len(text)) + text + bytes([1]) +
                  struct.pack("<IB", 5, 0xff)))
    return s


# ---- afxdp_frame (fuzz_afxdp_frame.c) ----------------------------------------------------

def inet_sum(b, acc=0):
    if len(b) % 2:
        b += b"\0"
    for i in range(0, len(b), 2):
        acc += b[i] << 8 | b[i + 1]
    while acc >> 16:
        acc = (acc & 0xffff) + (acc >> 16)
    return acc


def afx_frame(payload, dport=7101, ihl=5, udp_csum="full", frag=0x4000, dst=(10, 232, 0, 1)):
    src = bytes([10, 232, 0, 11])
    opts = bytes(4 * (ihl - 5))
    udp = struct.pack(">HHHH", 40000, dport, 8 + len(payload), 0) + payload
    ip = struct.pack(">BBHHHBBH4s4s", 0x40 | ihl, 0, 4 * ihl + len(udp), 1, frag, 64, 17, 0,
                     src, bytes(dst)) + opts
    ip = ip[:10] + struct.pack(">H", ~inet_sum(ip) & 0xffff) + ip[12:]
    pseudo = inet_sum(src + bytes(dst) + struct.pack(">HH", 17, len(udp)))
    if udp_csum == "full":
        c = ~inet_sum(udp, pseudo) & 0xffff or 0xffff
    elif udp_csum == "partial":
        c = pseudo
    else:
        c = 0
    udp = udp[:6] + struct.pack(">H", c) + udp[8:]
    return b"\x02" * 6 + b"\x04" * 6 + b"\x08\x00" + ip + udp


def afxdp_frame_seeds():
    push = xdp_dgram(frag_len=200)
    return [("one", b"\x00" + afx_frame(push)),
            ("three-bufs", b"\x02\x00\x10" + afx_frame(xdp_dgram(frag_len=1400))),
            ("partial-csum", b"\x00" + afx_frame(push, udp_csum="partial")),
            ("no-csum", b"\x00" + afx_frame(push, udp_csum="none")),
            ("ihl15", b"\x01\x02" + afx_frame(push, ihl=15)),
            ("odd", b"\x03\x01\x03\x05" + afx_frame(push + b"\x07")),
            ("fragment", b"\x00" + afx_frame(push, frag=0x2000)),
            ("other-port", b"\x00" + afx_frame(push, dport=80)),
            ("other-addr", b"\x00" + afx_frame(push, dst=(10, 232, 0, 2))),
            ("arp", b"\x00" + b"\x02" * 6 + b"\x04" * 6 + b"\x08\x06" + bytes(28))]
# ---- status requests (fuzz_statusmsg.c) -------------------------------------------------

def statusmsg_seeds():
    return [
        ("min", b'{"op":"status"}'),
        ("full", b'{"op":"status","job":7,"max_groups":3,"max_ranges":4,"max_ranks":5,'
                 b'"admin_token":"x"}'),
        ("bad-job", b'{"op":"status","job":-1}'),
        ("bad-groups", b'{"op":"status","max_groups":0}'),
        ("types", b'{"op":"status","max_ranges":"9","admin_token":3}'),
        ("null-job", b'{"op":"status","job":null,"max_ranks":1024}'),
        ("array", b'[1,2]'),
    ]


if __name__ == "__main__":
    import sys
    gens = {"engine": engine_seeds, "node": node_seeds, "control": ctl_seeds,
            "config": config_seeds, "xdp": xdp_seeds, "dvf": dvf_seeds,
            "dvf_codec": dvf_codec_seeds, "afxdp_frame": afxdp_frame_seeds,
            "statusmsg": statusmsg_seeds}
    for name in sys.argv[1:] or gens:
        write(name, gens[name]())
