#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Garbage dropped by pboxd's XDP filter vs by its engine, side by side, in one run.

A perf/netlab lab (an appliance and one worker namespace, unlimited veth links, MTU 1500);
pboxd with one data-plane core on kernel UDP, first without, then with the XDP filter on
the appliance's veth. Each time the worker floods the data port with COUNT garbage
datagrams (tests/integration's pbox-udp-flood: random bytes, and pbox headers with
the right magic and version but no admitted job). Reported per path:

  - where the datagrams ended: dropped by the XDP program, dropped by the engine, lost
    in the socket buffer (the kernel's UDP RcvbufErrors: the engine did not keep up);
  - the cost of deciding to drop, as datagrams per second of one core:
      engine: datagrams the core dropped / the core's busy seconds (pboxd's busy cycles,
              recvmmsg included; the kernel's UDP receive before the socket is not);
      XDP:    the program's runs / its run time (the kernel's BPF run-time statistics,
              kernel.bpf_stats_enabled, on for the run; the veth driver before the hook
              is not included).

    /usr/bin/python3 nicfw/bench_drop.py --build-dir build [--count 2000000]
        [--mode native,generic] [--json out.json]

Root only. The machine's other load shows in the numbers: run it twice.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "perf", "netlab"))
import netlab  # noqa: E402
from netlab import IFNAME, Lab, Scenario, sh  # noqa: E402

PORT = 7100
TOKEN = "bench"


def pboxd_conf(lab, xdp_mode):
    xdp = ('xdp = { interface = "%s"; mode = "%s"; pin_root = ""; };' % (IFNAME, xdp_mode)
           if xdp_mode else "")
    return ('appliance = { cores = 1; data_address = "%s"; base_port = %d; '
            'control = "127.0.0.1:7000"; admin_token = "%s"; %s };\n'
            'jobs = ( { id = 1; token = "t"; workers = 2; } );\n' %
            (lab.app_ip, PORT, TOKEN, xdp))


def stats(lab, build):
    out = sh(os.path.join(build, "apps/pbox"), "stats", "--json", "--control",
             "127.0.0.1:7000", ns=lab.app_ns).stdout
    return json.loads(out)


def rcvbuf_errors(lab):
    lines = sh("cat", "/proc/net/snmp", ns=lab.app_ns).stdout.splitlines()
    udp = [ln.split() for ln in lines if ln.startswith("Udp:")]
    return int(udp[1][udp[0].index("RcvbufErrors")])


def prog_stats(lab):
    """(run_cnt, run_time_ns) of the XDP program on the appliance's veth."""
    m = re.search(r"prog/xdp\w* id (\d+)", sh("ip", "-d", "link", "show", IFNAME,
                                             ns=lab.app_ns).stdout)
    info = json.loads(sh("bpftool", "-j", "prog", "show", "id", m.group(1)).stdout)
    return info.get("run_cnt", 0), info.get("run_time_ns", 0)


def run_path(sc, build, count, xdp_mode):
    with Lab(sc) as lab, tempfile.TemporaryDirectory() as tmp:
        conf = os.path.join(tmp, "pboxd.conf")
        with open(conf, "w") as f:
            f.write(pboxd_conf(lab, xdp_mode))
        logf = open(os.path.join(tmp, "pboxd.log"), "w+")
        p = lab.popen(lab.app_ns, [os.path.join(build, "dataplane/pboxd"), "-c", conf],
                      env={"PBOX_ADMIN_TOKEN": TOKEN}, stdout=logf, stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        while "ready:" not in open(logf.name).read():
            if p.poll() is not None or time.time() > deadline:
                raise SystemExit("pboxd did not start:\n" + open(logf.name).read())
            time.sleep(0.1)
        os.environ["PBOX_ADMIN_TOKEN"] = TOKEN
        s0, b0 = stats(lab, build), rcvbuf_errors(lab)
        x0 = prog_stats(lab) if xdp_mode else (0, 0)
        t0 = time.time()
        out = sh(os.path.join(build, "tests/integration/pbox-udp-flood"), lab.app_ip, PORT, 1,
                 count, 999, 1, ns=lab.worker_ns[0], timeout=600).stdout
        time.sleep(1.0)  # let the engine drain its socket
        wall = time.time() - t0
        s1, b1 = stats(lab, build), rcvbuf_errors(lab)
        x1 = prog_stats(lab) if xdp_mode else (0, 0)
        p.terminate()
        p.wait(30)
        c0, c1 = s0["cores"][0], s1["cores"][0]
        busy = c1["busy_cycles"] - c0["busy_cycles"]
        cyc = busy + c1["idle_cycles"] - c0["idle_cycles"]
        busy_s = wall * busy / cyc if cyc else 0.0
        eng = c1["dropped"] - c0["dropped"]
        r = {"path": "xdp-" + xdp_mode if xdp_mode else "engine",
             "sent": count, "flood": out.strip(),
             "sent_per_s": count / float(re.search(r"in ([0-9.]+) s", out).group(1)),
             "engine_dropped": eng, "engine_busy_s": busy_s,
             "engine_drops_per_core_s": eng / busy_s if busy_s > 0 and eng else None,
             "socket_buffer_lost": b1 - b0}
        if xdp_mode:
            x = s1["xdp"]
            runs, ns = x1[0] - x0[0], x1[1] - x0[1]
            r.update({"xdp_mode": x["mode"], "xdp_dropped": x["dropped"],
                      "xdp_drops": x["drops"], "xdp_runs": runs,
                      "xdp_ns_per_frame": ns / runs if runs else None,
                      "xdp_drops_per_core_s": runs * 1e9 / ns if ns else None})
        return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--count", type=int, default=2000000)
    ap.add_argument("--mode", default="native,generic",
                    help="XDP attach modes to measure, comma-separated (native, generic)")
    ap.add_argument("--json")
    args = ap.parse_args()
    why = netlab.missing(need_tc=False)
    if why:
        raise SystemExit(why)
    build = os.path.abspath(args.build_dir)
    if any(m not in ("native", "generic") for m in args.mode.split(",")):
        raise SystemExit("--mode: native and/or generic")
    sc = Scenario.from_dict({"workers": 1, "worker_rate": "none", "mtu": 1500,
                             "systems": ["pbox"]})
    with open("/proc/sys/kernel/bpf_stats_enabled") as f:
        old = f.read().strip()
    res = []
    try:
        with open("/proc/sys/kernel/bpf_stats_enabled", "w") as f:
            f.write("1")
        for mode in [None] + args.mode.split(","):
            res.append(run_path(sc, build, args.count, mode))
    finally:
        with open("/proc/sys/kernel/bpf_stats_enabled", "w") as f:
            f.write(old)
    print("| path | sent | sent/s | dropped at XDP | dropped by engine | lost in socket "
          "buffer | drops/s per core |")
    print("|---|---|---|---|---|---|---|")
    for r in res:
        per = r.get("xdp_drops_per_core_s") if "xdp_mode" in r else r["engine_drops_per_core_s"]
        print("| %s | %d | %.0f | %s | %d | %d | %s |" % (
            r["path"] if "xdp_mode" not in r else "XDP (%s)" % r["xdp_mode"], r["sent"],
            r["sent_per_s"], r.get("xdp_dropped", "-"), r["engine_dropped"],
            r["socket_buffer_lost"], "%.2f M" % (per / 1e6) if per else "-"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpus": os.cpu_count(), "results": res}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
