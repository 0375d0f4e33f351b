#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""End-to-end comm-only exchanges per second: pboxd on DPDK (net_af_xdp on a veth) against
pboxd on the kernel-UDP transport, in one run, on the same namespaces and wires (see
tests/dpdk/netns.py). Workers (kernel UDP, one per worker namespace) push-pull one key in
a loop with no computation; each prints its exchanges per second.

    bench_dpdk_e2e.py --build-dir BUILD [--seconds 5] [--sizes 1024,262144] [--workers 2]
                      [--rounds 2]

Transports alternate within each round so drift on the shared machine hits both; the
table gives the median over rounds. Needs root, hugepages (tests/dpdk/setup.sh), AF_XDP.
"""
import argparse
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "dpdk"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--sizes", default="1024,262144", help="key sizes in floats")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    os.environ["PBOX_BUILD_DIR"] = os.path.abspath(a.build_dir)
    import netns
    from netns import Topology, build_path, fail

    why = netns.missing()
    if why:
        print("SKIP: " + why)
        sys.exit(77)
    sizes = [int(x) for x in a.sizes.split(",")]
    jobs = [{"id": 1, "token": "bench", "workers": a.workers, "mode": "aggregate",
             "reduce": "sum"}]
    worker = build_path("perf/dpdk/pbox-bench-dpdk-worker")
    res = {}
    with Topology(nworker_ns=2) as topo:
        for rnd in range(a.rounds):
            order = ("udp", "dpdk") if rnd % 2 == 0 else ("dpdk", "udp")
            for tr in order:
                with topo.pboxd(tr, jobs) as d:
                    for n in sizes:
                        cmds = [[worker, "--server", d.control, "--job", "1", "--token",
                                 "bench", "--rank", str(r), "--keys", str(n), "--bench",
                                 "--seconds", str(a.seconds), "--timeout-ms", "20000"]
                                for r in range(a.workers)]
                        outs = topo.run_ranks(d, cmds, timeout=a.seconds * 4 + 60)
                        rates = []
                        for o in outs:
                            m = re.search(r"([0-9.]+) exchanges/s", o)
                            if not m:
                                fail("no rate in worker output: %s" % o)
                            rates.append(float(m.group(1)))
                        res.setdefault((tr, n), []).append(statistics.mean(rates))
                    if d.stats()["totals"]["dropped"] != 0:
                        print("# note: %s run had drops: %s" % (tr, d.stats()["totals"]["drops"]))
    print("# comm-only push-pull, %d workers in 2 namespaces, 1 data-plane core, %.0f s x %d "
          "rounds (median)" % (a.workers, a.seconds, a.rounds))
    print("%-10s %-12s %16s %12s %14s" % ("key_floats", "key_bytes", "transport",
                                           "exch/s", "dpdk/udp"))
    for n in sizes:
        u = statistics.median(res[("udp", n)])
        k = statistics.median(res[("dpdk", n)])
        for tr, v in (("udp", u), ("dpdk af_xdp", k)):
            print("%-10d %-12d %16s %12.1f %14s" % (n, n * 4, tr, v,
                                                   "%.2f" % (k / u) if tr != "udp" else ""))


if __name__ == "__main__":
    main()
