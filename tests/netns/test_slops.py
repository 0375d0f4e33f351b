#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""The SLoPS prober (ctrlplane/probe, pbox-probe) in network namespaces, short (< 30 s):

  1. Accuracy: w0 probes w1's responder over 50 Mbit/s tbf links; the midpoint of the
     estimated range must be within +-20% of the available bandwidth (the link's rate in
     IP bytes), the estimate must converge within its 10 s budget. Then the same with
     constant-rate UDP cross traffic of 20 Mbit/s on w1's link (available ~29.5, from
     the cross rate measured while the probe ran).
  2. Rate limit: probing with --cap 20mbit over the 50 Mbit/s link, w0's link carries
     at most 20 Mbit/s on average over the probe, no stream is faster than the cap, and
     the result says the cap was reached (at_cap: the available bandwidth is above it).
  3. Hostile peers: a HELLO shorter than the longest reply, DATA and REPORT_REQ with a
     made-up token, and garbage get no reply; a valid HELLO gets a reply no longer than
     itself.
All on one lab (its set-up is the slow part on a busy machine). Skips (exit 77) when not
root or ip/tc are missing; without iperf3 only the cross-traffic case is skipped.
"""
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "perf", "slops"))
sys.path.insert(0, os.path.join(ROOT, "perf", "netlab"))
import netlab  # noqa: E402
import bench_slops  # noqa: E402

HOSTILE = r"""
import socket, struct, sys
ip, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(0.5)
def hdr(t, token): return struct.pack("<IBBHQ", 0x50534250, 1, t, 0, token)
def ask(b):
    s.sendto(b, (ip, port))
    try:
        return len(s.recv(65536))
    except socket.timeout:
        return 0
out = {
  "short_hello": ask(hdr(1, 0) + struct.pack("<Q", 5)),           # 24 bytes < 64
  "bad_token_data": ask(hdr(3, 12345) + struct.pack("<IHHIIq", 1, 0, 10, 100000, 0, 1) + bytes(100)),
  "bad_token_req": ask(hdr(4, 12345) + struct.pack("<I", 1) + bytes(44)),
  "garbage": ask(bytes(range(200))),
  "hello": ask(hdr(1, 0) + struct.pack("<Q", 6) + bytes(40)),     # 64 bytes
}
print(out)
"""


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr, flush=True)
    sys.exit(1)


def check_estimate(what, res, true_bps):
    mid = (res["r_min_bps"] + res["r_max_bps"]) / 2
    err = (mid - true_bps) / true_bps
    print("%s: true %.1f Mbit/s, estimate [%.1f, %.1f] (%+.1f%%) in %.1f s, %s" % (
        what, true_bps / 1e6, res["r_min_bps"] / 1e6, res["r_max_bps"] / 1e6, 100 * err,
        res["duration_s"], res["flags"]), flush=True)
    if "converged" not in res["flags"]:
        fail("%s: not converged: %s" % (what, res))
    if abs(err) > 0.20:
        fail("%s: estimate [%.1f, %.1f] Mbit/s, true %.1f: %+.0f%%" % (
            what, res["r_min_bps"] / 1e6, res["r_max_bps"] / 1e6, true_bps / 1e6, 100 * err))
    if res["duration_s"] > 10.5:
        fail("%s: the estimate took %.1f s (budget 10 s)" % (what, res["duration_s"]))


def main():
    why = netlab.missing()
    if why:
        print("SKIP: " + why)
        return 77
    build = os.environ.get("PBOX_BUILD_DIR") or os.path.join(ROOT, "build")
    if not os.path.exists(bench_slops.probe_bin(build)):
        fail("%s is not built" % bench_slops.probe_bin(build))
    t_start = time.time()
    # One lab: 50 Mbit/s worker links; the appliance's link (20 Mbit/s) only carries the
    # cross traffic, which its tbf makes constant-rate (see perf/slops/bench_slops.py).
    sc = netlab.Scenario.from_dict({"workers": 2, "worker_rate": "50mbit",
                                    "appliance_rate": "20mbit", "burst": 3028,
                                    "systems": ["pbox"]})
    link = bench_slops.ip_rate(50e6, sc.mtu)
    with netlab.Lab(sc) as lab:
        ns0, _ = lab.ns_of("w0")
        ns1, ip1 = lab.ns_of("w1")
        lab.popen(ns1, [bench_slops.probe_bin(build), "--listen", "%s:%d" % (
            ip1, bench_slops.PORT)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        bench_slops.wait_responder(lab, ns1)

        # 1: accuracy, without and with constant-rate UDP cross traffic
        res, _ = bench_slops.run_probe(lab, build, 1e9, 10)
        check_estimate("50 Mbit/s", res, link)
        if shutil.which("iperf3") is None:
            print("cross traffic not checked: iperf3 is missing (apt-get install iperf3)")
        else:
            with netlab.Cross(lab, [{"from": "app", "to": "w1", "proto": "udp",
                                     "rate": "30mbit"}]) as cr:
                time.sleep(1.0)
                b0, p0, t0 = bench_slops.app_tx(lab)
                res, _ = bench_slops.run_probe(lab, build, 1e9, 10)
                b1, p1, t1 = bench_slops.app_tx(lab)
                cr.check()
            cross = ((b1 - b0) - 14 * (p1 - p0)) * 8 / (t1 - t0)
            check_estimate("50 Mbit/s with %.1f Mbit/s of UDP" % (cross / 1e6), res,
                           link - cross)

        # 2: the rate cap
        c0 = lab.link_counters()
        t0 = time.time()
        res, _ = bench_slops.run_probe(lab, build, 20e6, 5)
        dt = time.time() - t0
        c1 = lab.link_counters()
        sent = (c1["w0"]["tx_bytes"] - c0["w0"]["tx_bytes"]) * 8
        print("cap 20 Mbit/s: %s; w0 sent %.1f Mbit/s on average over %.1f s" % (
            {k: res[k] for k in ("r_min_bps", "r_max_bps", "flags", "max_stream_bps")},
            sent / dt / 1e6, dt))
        if sent / dt > 20e6:
            fail("with --cap 20mbit w0 sent %.1f Mbit/s on average" % (sent / dt / 1e6))
        if res["max_stream_bps"] > 20e6:
            fail("a stream ran at %.2f Mbit/s over the 20 Mbit/s cap" %
                 (res["max_stream_bps"] / 1e6))
        if "at_cap" not in res["flags"] or res["r_max_bps"] > 20e6:
            fail("a 50 Mbit/s path probed with a 20 Mbit/s cap: %s" % res)

        # 3: hostile peers
        r = netlab.sh(sys.executable, "-c", HOSTILE, ip1, bench_slops.PORT, ns=ns0)
        got = eval(r.stdout.strip(), {})
        print("hostile peer, reply bytes:", got)
        for k in ("short_hello", "bad_token_data", "bad_token_req", "garbage"):
            if got[k] != 0:
                fail("%s got a %d-byte reply" % (k, got[k]))
        if not 0 < got["hello"] <= 64:
            fail("a 64-byte HELLO got a %d-byte reply" % got["hello"])
    print("ok (%.1f s)" % (time.time() - t_start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
