#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""pboxd as a probe agent (probe = { ... }): the admin-only {"op":"probe"} control op.
 - refused without / with a wrong admin token (EACCES), above the configured cap or budget
   (EPERM), with a bad peer, an unknown key or no request (EINVAL);
 - a probe of its own responder over loopback answers a result (r_min <= r_max <= cap);
 - a second probe while one runs is refused (EBUSY), on another connection and on the
   same one; a connection that goes away before its answer does not disturb pboxd;
 - a pboxd without the group refuses probes (ENOTSUP);
 - the counters (stats "probe", control "probe_refused") count all of it."""
import json
import socket
import time

from pboxtest import Pboxd, control_request, fail, free_port

EACCES, EPERM, EINVAL, EBUSY, ENOTSUP = 13, 1, 22, 16, 95


def send(s, obj):
    s.sendall((json.dumps(obj) + "\n").encode())


def recv(s, timeout=30):
    s.settimeout(timeout)
    buf = b""
    while b"\n" not in buf:
        d = s.recv(65536)
        if not d:
            fail("connection closed before an answer")
        buf += d
    return json.loads(buf.split(b"\n", 1)[0])


def expect(r, errno, what):
    print("%s -> %s" % (what, json.dumps(r)[:200]))
    if r.get("ok") is not False or r.get("errno") != errno:
        fail("%s: expected errno %d, got %s" % (what, errno, r))


def main():
    port = free_port(socket.SOCK_DGRAM)
    peer = "127.0.0.1:%d" % port
    cap = 200e6
    with Pboxd([], probe={"port": port, "address": "127.0.0.1", "max_rate": "200mbit",
                          "max_budget_s": 3}) as d:
        tok = d.admin_token
        good = {"peer": peer, "cap_bps": cap, "budget_ms": 2000}

        def probe(req, token=tok):
            o = {"op": "probe", "request": req}
            if token is not None:
                o["admin_token"] = token
            return control_request(d.control, o, timeout=30)

        expect(probe(good, token=None), EACCES, "no admin token")
        expect(probe(good, token="wrong"), EACCES, "wrong admin token")
        expect(probe(dict(good, cap_bps=1e9)), EPERM, "cap above max_rate")
        expect(probe(dict(good, budget_ms=4000)), EPERM, "budget above max_budget_s")
        expect(probe(dict(good, peer="probe.example.com:1")), EINVAL, "a name as peer")
        expect(probe(dict(good, peer="127.0.0.1:0:1")), EINVAL, "a bad peer")
        expect(probe(dict(good, extra=1)), EINVAL, "an unknown key")
        expect(control_request(d.control, {"op": "probe", "admin_token": tok}), EINVAL,
               "no request")

        # A probe of its own responder.
        r = probe(good)
        print("probe -> %s" % json.dumps(r))
        if r.get("ok") is not True:
            fail("the probe failed: %s" % r)
        res = r["result"]
        if res["peer"] != peer or not (0 < res["r_min_bps"] <= res["r_max_bps"] <= cap * 1.001):
            fail("implausible probe result: %s" % res)
        if not (0 < res["duration_ns"] <= 4e9) or res["bytes_sent"] <= 0:
            fail("probe result without its duration or bytes: %s" % res)

        # A peer that never answers (a silent socket): the probe runs ~1 s (3 HELLOs),
        # and others are refused meanwhile; then it fails with ETIMEDOUT.
        silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        silent.bind(("127.0.0.1", 0))
        mute = dict(good, peer="127.0.0.1:%d" % silent.getsockname()[1])
        a = socket.create_connection(("127.0.0.1", d.tcp), timeout=10)
        send(a, {"op": "probe", "admin_token": tok, "request": mute})
        time.sleep(0.1)
        expect(probe(good), EBUSY, "second probe, other connection")
        send(a, {"op": "stats", "admin_token": tok})
        expect(recv(a), EBUSY, "a request on the probing connection")
        expect(recv(a), 110, "a probe of a silent peer")
        a.close()

        # A client that leaves before its answer.
        b = socket.create_connection(("127.0.0.1", d.tcp), timeout=10)
        send(b, {"op": "probe", "admin_token": tok, "request": mute})
        time.sleep(0.1)
        b.close()
        deadline = time.time() + 10
        while True:
            st = d.stats()["probe"]
            if st["probes_done"] + st["probes_failed"] == 3 and not st["running"]:
                break
            if time.time() > deadline:
                fail("the abandoned probe did not end: %s" % st)
            time.sleep(0.2)
        silent.close()
        st = d.stats()
        print("stats: probe %s, control probe_refused %d" %
              (st["probe"], st["control"]["probe_refused"]))
        p = st["probe"]
        if (p["probes_run"], p["probes_done"], p["probes_failed"], p["refused_busy"],
                p["refused_limits"], p["refused_bad"], p["answers_dropped"]) != \
                (3, 1, 2, 1, 2, 4, 1):
            fail("probe counters: %s" % p)
        if st["control"]["probe_refused"] != 9:
            fail("control probe_refused %d, expected 9" % st["control"]["probe_refused"])

    with Pboxd([]) as d:
        expect(control_request(d.control, {"op": "probe", "admin_token": d.admin_token,
                                           "request": {"peer": peer, "cap_bps": cap,
                                                       "budget_ms": 1000}}),
               ENOTSUP, "pboxd without probe = { ... }")
    print("probe agent: refusals, one probe at a time, answers and counters OK")


if __name__ == "__main__":
    main()
