#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Comm-only exchanges per second over pboxd's three transports on the same veth pair, side
by side in one run: kernel UDP (also with pboxd's GSO/GRO off), AF_XDP (--transport afxdp:
nicfw's filter + one AF_XDP socket per core) and DPDK (net_af_xdp on the same veth), at MTU
1500 and 9000.

Topology: tests/dpdk/netns.py's (appliance namespace, bridge, two worker namespaces). All
three transports use the appliance's veth dp0 and its address 10.231.0.1 (a kernel
address for UDP and AF_XDP; DPDK answers for it itself); the control channel is on ct0.
Workers (kernel UDP, libpbox; one per worker namespace) push-pull one key in a loop with
no computation and print their exchanges per second (perf/dpdk's worker).

    bench_afxdp.py --build-dir BUILD [--seconds 4] [--sizes 1024,262144] [--mtus 1500,9000]
                   [--rounds 2] [--json out.json]

Transports alternate within each round (the order rotates) so drift on a shared machine
hits all; the table gives the median over rounds. One data-plane core. Needs root, AF_XDP,
hugepages for DPDK (tests/dpdk/setup.sh; without them DPDK's column says why).
"""
import argparse
import json
import os
import re
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "dpdk"))

# "udp1": kernel UDP with pboxd's GSO and GRO off (PBOX_UDP_GSO=0 PBOX_UDP_GRO=0 for
# pboxd only): one skb per datagram like AF_XDP, to separate batching from the bypass.
TRANSPORTS = ("udp", "udp1", "afxdp", "dpdk")


def set_mtu(topo, sh, mtu):
    for ns, dev in [(topo.app_ns, "dp0"), (topo.app_ns, "ct0")] + \
            [(w, "w0") for w in topo.worker_ns]:
        sh("ip", "link", "set", dev, "mtu", str(mtu), ns=ns)
    for dev in ["ct0s", "dp0s"] + ["w%ds" % i for i in range(len(topo.worker_ns))]:
        sh("ip", "link", "set", dev, "mtu", str(mtu), ns=topo.sw_ns)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--sizes", default="1024,262144", help="key sizes in floats")
    ap.add_argument("--mtus", default="1500,9000")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    os.environ["PBOX_BUILD_DIR"] = os.path.abspath(a.build_dir)
    import netns
    from netns import DATA_IP, Topology, build_path, sh

    if os.geteuid() != 0:
        print("SKIP: needs root (namespaces, AF_XDP)")
        sys.exit(77)
    dpdk_why = netns.missing()
    sizes = [int(x) for x in a.sizes.split(",")]
    mtus = [int(x) for x in a.mtus.split(",")]
    jobs = [{"id": 1, "token": "bench", "workers": a.workers, "mode": "aggregate",
             "reduce": "sum"}]
    worker = build_path("perf/dpdk/pbox-bench-dpdk-worker")
    res, notes = {}, {}
    t0 = time.time()
    with Topology(nworker_ns=2) as topo:
        sh("ip", "addr", "add", DATA_IP + "/24", "dev", "dp0", ns=topo.app_ns)
        for mtu in mtus:
            set_mtu(topo, sh, mtu)
            for rnd in range(a.rounds):
                k = rnd % len(TRANSPORTS)
                order = TRANSPORTS[k:] + TRANSPORTS[:k]
                for tr in order:
                    if tr == "dpdk" and dpdk_why:
                        notes[(tr, mtu)] = dpdk_why
                        continue
                    if (tr, mtu) in notes and not any(k[:2] == (tr, mtu) for k in res):
                        continue  # refused to start in an earlier round
                    extra = {"mtu": mtu, "data_address": DATA_IP}
                    if tr == "afxdp":
                        extra["afxdp"] = {"interface": "dp0"}
                    d = topo.pboxd("udp" if tr == "udp1" else tr, jobs, cores=1,
                                   extra_app=extra)
                    saved = dict(os.environ)
                    if tr == "udp1":
                        os.environ.update(PBOX_UDP_GSO="0", PBOX_UDP_GRO="0")
                    try:
                        d.start()
                    except SystemExit:
                        # pboxd refused (e.g. DPDK's net_af_xdp and a 9000-byte MTU).
                        line = [l for l in d.log().splitlines() if "ERR" in l or "pboxd:" in l]
                        notes[(tr, mtu)] = line[-1] if line else "did not start"
                        d.halt()
                        continue
                    finally:
                        os.environ.clear()
                        os.environ.update(saved)
                    try:
                        for n in sizes:
                            cmds = [[worker, "--server", d.control, "--job", "1", "--token",
                                     "bench", "--rank", str(r), "--keys", str(n), "--bench",
                                     "--seconds", str(a.seconds), "--timeout-ms", "20000"]
                                    for r in range(a.workers)]
                            outs = topo.run_ranks(d, cmds, timeout=a.seconds * 4 + 60)
                            rates = [float(re.search(r"([0-9.]+) exchanges/s", o).group(1))
                                     for o in outs]
                            res.setdefault((tr, mtu, n), []).append(statistics.mean(rates))
                        tot = d.stats()["totals"]
                        if tot["dropped"] != 0:
                            notes[(tr, mtu)] = "engine drops: %s" % {
                                k: v for k, v in tot["drops"].items() if v}
                    finally:
                        d.stop()
    print("# comm-only push-pull, %d workers in 2 namespaces, 1 data-plane core, one veth "
          "pair (dp0), %.0f s x %d rounds (median); %.0f s in all" %
          (a.workers, a.seconds, a.rounds, time.time() - t0))
    print("%-5s %-10s %-10s %12s %12s %12s %12s %10s %10s %10s" %
          ("mtu", "key_floats", "key_bytes", "udp", "udp-no-gso", "afxdp", "dpdk",
           "afxdp/udp", "afxdp/u1", "dpdk/udp"))
    rows = []
    for mtu in mtus:
        for n in sizes:
            v = {tr: statistics.median(res[(tr, mtu, n)]) if (tr, mtu, n) in res else None
                 for tr in TRANSPORTS}

            def fmt(x):
                return "%12.1f" % x if x is not None else "%12s" % "n/a"

            def ratio(x, base="udp"):
                return "%10.2f" % (x / v[base]) if x is not None and v[base] else \
                    "%10s" % "-"
            print("%-5d %-10d %-10d %s %s %s %s %s %s %s" % (
                mtu, n, 4 * n, fmt(v["udp"]), fmt(v["udp1"]), fmt(v["afxdp"]),
                fmt(v["dpdk"]), ratio(v["afxdp"]), ratio(v["afxdp"], "udp1"),
                ratio(v["dpdk"])))
            rows.append({"mtu": mtu, "key_floats": n, "exchanges_per_s": v,
                         "runs": {tr: res.get((tr, mtu, n)) for tr in TRANSPORTS}})
    for (tr, mtu), why in sorted(notes.items()):
        print("# note: %s at MTU %d: %s" % (tr, mtu, why))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"seconds": a.seconds, "rounds": a.rounds, "workers": a.workers,
                       "rows": rows, "notes": {"%s/%d" % k: w for k, w in notes.items()}},
                      f, indent=1)


if __name__ == "__main__":
    main()
