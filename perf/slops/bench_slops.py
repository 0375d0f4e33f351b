#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""perf/slops: accuracy of the SLoPS prober (ctrlplane/probe, pbox-probe) in network
namespaces, against links whose available bandwidth is known.

A perf/netlab lab with two workers and the appliance namespace: the responder
(`pbox-probe --listen`) runs in w1, the prober in w0; every worker link is limited by
tc tbf at RATE in both directions. The path w0 -> w1 crosses w0's uplink and w1's
downlink, both at RATE. Cross traffic (iperf3, from the appliance namespace, whose link
is unlimited, to w1) shares w1's downlink with the probes:

  none  available bandwidth = RATE
  udp   constant-rate UDP at CROSS_FRACTION * RATE: iperf3 offers 1.5 times that into
        the appliance's own link, limited by tbf to CROSS_FRACTION * RATE, whose queue
        never empties, so the flow is constant at the packet scale (iperf3 -b alone
        paces in user space: on a busy machine it stalls and catches up in bursts).
        Available = RATE - the cross rate measured on the appliance link.
  tcp   one TCP flow whose own access link (the appliance's) is CROSS_FRACTION * RATE:
        available = RATE - the TCP rate measured on the appliance link while the probe
        ran (TCP backs off when the probe congests the shared link)

For each (rate, cross) it runs pbox-probe and records the range [r_min, r_max], the
time, whether the true value is in the range and the error of the range's midpoint.
Rate "max" is an unlimited link: the fastest the namespaces sustain is then what the
prober reports with its flags (sender_limited / at_cap) and the dispersion rate.

    /usr/bin/python3 perf/slops/bench_slops.py --build-dir build \\
        --rates 20,50,100,200,500,1000 --cross none,udp,tcp --json out.json

The tbf burst is --burst bytes (default 3028: two 1514-byte frames), not netlab's 64 KB
default: a token bucket absorbs a stream's excess up to its burst, so the estimate is
biased up by about burst * 8 / stream duration (streams last <= 40 ms). Root, ip, tc and
iperf3 (for cross traffic) are needed; the JSON has one entry per run plus the machine's
load average.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "perf", "netlab"))
import netlab  # noqa: E402

PORT = 55001


def ip_rate(link_bps, mtu):
    """IP bytes per second through a tbf of link_bps with MTU-sized frames."""
    return link_bps * mtu / (mtu + 14)


def app_tx(lab):
    """(tx bytes, tx packets, time) of the appliance namespace's link: one counter read,
    timed at its middle (reading every link of the lab takes long enough on a busy
    machine to bias a rate measured over a few seconds)."""
    ns, _ = lab.ns_of("app")
    t0 = time.time()
    st = json.loads(netlab.sh("ip", "-j", "-s", "link", "show", "dev", netlab.IFNAME,
                              ns=ns).stdout)[0]["stats64"]["tx"]
    return st["bytes"], st["packets"], (t0 + time.time()) / 2


def probe_bin(build_dir):
    return os.path.join(build_dir, "ctrlplane", "pbox-probe")


def wait_responder(lab, ns, timeout=5.0):
    """Until the responder's UDP port is bound in ns."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        r = netlab.sh("ss", "-Hlun", "sport", "= :%d" % PORT, ns=ns, check=False)
        if r.stdout.strip():
            return
        time.sleep(0.05)
    raise netlab.LabError("pbox-probe --listen did not bind UDP %d in %s" % (PORT, ns))


def run_probe(lab, build_dir, cap_bps, budget_s, extra=()):
    """pbox-probe from w0 to w1's responder; returns (its JSON result, wall seconds)."""
    ns0, _ = lab.ns_of("w0")
    _, ip1 = lab.ns_of("w1")
    cmd = [probe_bin(build_dir), "--json", "--realtime", "--cap", "%d" % int(cap_bps),
           "--budget", "%g" % budget_s] + list(extra) + ["%s:%d" % (ip1, PORT)]
    t0 = time.time()
    r = netlab.sh(*cmd, ns=ns0, check=False, timeout=budget_s + 30)
    wall = time.time() - t0
    if r.returncode != 0:
        raise netlab.LabError("pbox-probe exited %d: %s" % (r.returncode, r.stderr.strip()))
    res = json.loads(r.stdout)  # the agent's result message (ctrlplane/probe/probe_msg.h)
    res["duration_s"] = res["duration_ns"] / 1e9
    res["flags"] = ",".join(res["flags"])
    return res, wall


def measure(build_dir, rate_bps, cross, cross_fraction=0.4, burst=3028, budget_s=10.0,
            cap_bps=None, mtu=1500, extra=()):
    """One lab, one probe. Returns a result dict (see the file comment)."""
    flows = cross != "none"
    if flows and not rate_bps:
        raise netlab.LabError("cross traffic needs a rate-limited link")
    # The cross traffic's own access link (the appliance's) is limited to the cross rate
    # and offered more than that: its tbf, never empty, releases a constant-rate flow.
    sc = netlab.Scenario.from_dict({
        "workers": 2, "worker_rate": rate_bps if rate_bps else "none", "mtu": mtu,
        "appliance_rate": int(cross_fraction * rate_bps) if flows else None,
        "burst": burst, "systems": ["pbox"]})
    if cap_bps is None:
        cap_bps = max(1e9, 2 * rate_bps) if rate_bps else 10e9
    with netlab.Lab(sc) as lab:
        ns1, ip1 = lab.ns_of("w1")
        lab.popen(ns1, [probe_bin(build_dir), "--listen", "%s:%d" % (ip1, PORT)],
                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_responder(lab, ns1)
        offered = [{"from": "app", "to": "w1", "proto": cross,
                    "rate": "%dbit" % int(1.5 * cross_fraction * rate_bps)}] if flows else []
        with netlab.Cross(lab, offered) as cr:
            if flows:
                time.sleep(1.0)  # let TCP reach its rate
            b0, p0, t0 = app_tx(lab)
            res, wall = run_probe(lab, build_dir, cap_bps, budget_s, extra)
            b1, p1, t1 = app_tx(lab)
            cr.check()
    # Cross bytes counted at the appliance's interface include the 14-byte Ethernet
    # header; tbf and the prober count IP bytes.
    cross_bps = ((b1 - b0) - 14 * (p1 - p0)) * 8 / (t1 - t0) if flows else 0.0
    # tbf counts Ethernet frames (IP + 14 bytes); the prober counts IP datagrams: the
    # link's rate in IP bytes of MTU-sized packets.
    true_bps = (ip_rate(rate_bps, mtu) - cross_bps) if rate_bps else None
    target = cross_fraction * ip_rate(rate_bps, mtu) if flows else 0.0
    out = {"rate_bps": rate_bps, "cross": cross, "cross_bps": cross_bps,
           "cross_target_bps": target,
           # UDP cross traffic is constant-rate only when its source keeps the tbf of its
           # link busy; a CPU-starved iperf3 falls short and sends in bursts.
           "cross_constant": (cross != "udp" or cross_bps >= 0.95 * target),
           "true_bps": true_bps, "burst": burst, "mtu": mtu, "cap_bps": cap_bps,
           "wall_s": wall, **res}
    if true_bps:
        mid = (res["r_min_bps"] + res["r_max_bps"]) / 2
        out["mid_bps"] = mid
        out["error"] = (mid - true_bps) / true_bps
        out["in_range"] = res["r_min_bps"] <= true_bps <= res["r_max_bps"]
    return out


def fmt(r):
    mb = lambda x: "%.1f" % (x / 1e6)  # noqa: E731
    true = mb(r["true_bps"]) if r.get("true_bps") else "-"
    err = "%+.1f%%" % (100 * r["error"]) if "error" in r else "-"
    cross = r["cross"]
    if cross != "none":
        cross += " %s" % mb(r["cross_bps"])
        if not r.get("cross_constant", True):
            cross += " (bursty: target %s)" % mb(r["cross_target_bps"])
    return "| %s | %s | %s | [%s, %s] | %s | %.1f s | %s |" % (
        mb(r["rate_bps"]) if r["rate_bps"] else "unlimited", cross, true,
        mb(r["r_min_bps"]), mb(r["r_max_bps"]), err, r["duration_s"], r["flags"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rates", default="20,50,100,200,500,1000,max",
                    help="Mbit/s list; 'max': unlimited link")
    ap.add_argument("--cross", default="none,udp,tcp")
    ap.add_argument("--cross-fraction", type=float, default=0.4)
    ap.add_argument("--burst", type=int, default=3028)
    ap.add_argument("--budget", type=float, default=10.0)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--mtu", type=int, default=1500)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    why = netlab.missing()
    if why:
        print("SKIP: " + why)
        return 77
    if not os.path.exists(probe_bin(args.build_dir)):
        print("%s not built" % probe_bin(args.build_dir), file=sys.stderr)
        return 1
    runs = []
    print("load average before: %.1f %.1f %.1f" % os.getloadavg())
    print("| link Mbit/s | cross Mbit/s | true avail Mbit/s | estimate [R_min, R_max] Mbit/s | "
          "midpoint error | time | flags |")
    print("|---|---|---|---|---|---|---|")
    for rs in args.rates.split(","):
        rate = None if rs == "max" else float(rs) * 1e6
        for cross in args.cross.split(","):
            if rate is None and cross != "none":
                continue
            for _ in range(args.repeat):
                try:
                    r = measure(args.build_dir, rate, cross, args.cross_fraction, args.burst,
                                args.budget, mtu=args.mtu)
                except netlab.LabError as e:
                    r = {"rate_bps": rate, "cross": cross, "error_msg": str(e)}
                    print("| %s | %s | failed: %s |" % (rs, cross, e), flush=True)
                    runs.append(r)
                    continue
                runs.append(r)
                print(fmt(r), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"loadavg": os.getloadavg(), "nproc": os.cpu_count(),
                       "command": " ".join(sys.argv), "runs": runs},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
