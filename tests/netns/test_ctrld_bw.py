#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""pbox-ctrld's bandwidth matrix in network namespaces (< 30 s of test time on an idle
machine): a pboxd probe agent in w0 probes a `pbox-probe --listen` responder in w1 over
50 Mbit/s tbf links, asked by pbox-ctrld (also in w0) through `pbox bw probe w0 W1
--wait`:
  - the matrix entry's midpoint is within +-20% of the available bandwidth (the link's
    rate in IP bytes), with its timestamp and duration (<= the 10 s budget);
  - while the probe runs (the entry says "probing"), pbox-ctrld answers `pbox job list`
    at once: probes never stall its control API;
  - `pbox bw` prints the entry; the pboxd counts the probe.
Skips (exit 77) when not root or ip/tc are missing."""
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "perf", "slops"))
sys.path.insert(0, os.path.join(ROOT, "perf", "netlab"))
import netlab  # noqa: E402
from pboxtest import fail, print_tail  # noqa: E402 (netlab puts it on the path)
import bench_slops  # noqa: E402

TOKEN = "bw-test-token"
PBOXD_CTL = "127.0.0.1:7000"
CTRLD_CTL = "127.0.0.1:7300"


def wait_tcp(lab, ns, port, what, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        r = netlab.sh("ss", "-Hltn", "sport", "= :%d" % port, ns=ns, check=False)
        if r.stdout.strip():
            return
        time.sleep(0.1)
    fail("%s did not listen on TCP %d" % (what, port))


def main():
    why = netlab.missing()
    if why:
        print("SKIP: " + why)
        return 77
    build = os.environ.get("PBOX_BUILD_DIR") or os.path.join(ROOT, "build")
    pboxd = os.path.join(build, "dataplane", "pboxd")
    ctrld = os.path.join(build, "ctrlplane", "ctrld", "pbox-ctrld")
    pbox = os.path.join(build, "apps", "pbox")
    for b in (pboxd, ctrld, pbox, bench_slops.probe_bin(build)):
        if not os.path.exists(b):
            fail("%s is not built" % b)
    t_start = time.time()
    sc = netlab.Scenario.from_dict({"workers": 2, "worker_rate": "50mbit",
                                    "appliance_rate": "50mbit", "burst": 3028,
                                    "systems": ["pbox"]})
    link = bench_slops.ip_rate(50e6, sc.mtu)
    env = {"PBOX_ADMIN_TOKEN": TOKEN}
    os.environ.update(env)  # for every pbox command below
    with netlab.Lab(sc) as lab:
        ns0, ip0 = lab.ns_of("w0")
        ns1, ip1 = lab.ns_of("w1")
        peer = "%s:%d" % (ip1, bench_slops.PORT)
        tmp = lab.prefix.rstrip("-")
        pconf, cconf = "/tmp/%s-pboxd.conf" % tmp, "/tmp/%s-ctrld.conf" % tmp
        with open(pconf, "w") as f:
            f.write('appliance = { cores = 1; control = "%s"; data_address = "%s"; '
                    'base_port = 7100; admin_token = "%s"; memory_budget = "64M";\n'
                    '  probe = { port = %d; address = "%s"; max_rate = "1gbit"; '
                    'max_budget_s = 10; realtime = true; }; };\n'
                    % (PBOXD_CTL, ip0, TOKEN, bench_slops.PORT, ip0))
        with open(cconf, "w") as f:
            f.write('ctrld = { listen = "%s"; admin_token = "%s"; };\n'
                    'pboxds = ( { name = "w0"; control = "%s"; admin_token = "%s"; } );\n'
                    'bandwidth = { interval = 0; cap = "1gbit"; budget = 10;\n'
                    '  pairs = ( { from = "w0"; to = "%s"; } ); };\n'
                    % (CTRLD_CTL, TOKEN, PBOXD_CTL, TOKEN, peer))
        try:
            lab.popen(ns1, [bench_slops.probe_bin(build), "--listen", peer],
                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            bench_slops.wait_responder(lab, ns1)
            plog = open("/tmp/%s-pboxd.log" % tmp, "w")
            lab.popen(ns0, [pboxd, "-c", pconf], stdout=plog, stderr=subprocess.STDOUT)
            wait_tcp(lab, ns0, 7000, "pboxd")
            clog = open("/tmp/%s-ctrld.log" % tmp, "w")
            lab.popen(ns0, [ctrld, "-c", cconf], stdout=clog, stderr=subprocess.STDOUT)
            wait_tcp(lab, ns0, 7300, "pbox-ctrld")

            def bw_list():
                r = netlab.sh(pbox, "bw", "list", "--json", "--control", CTRLD_CTL,
                              ns=ns0, check=False, timeout=15)
                if r.returncode != 0:
                    fail("pbox bw list: %s" % r.stderr.strip())
                return json.loads(r.stdout)["pairs"][0]

            before = bw_list()
            if before["state"] != "pending" or "estimate" in before:
                fail("an on-demand pair has an estimate before any probe: %s" % before)
            t0 = time.time()
            prober = lab.popen(ns0, [pbox, "bw", "probe", "--wait", "25", "--json",
                                     "--control", CTRLD_CTL, "w0", peer], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            # While the probe runs, the control API answers at once.
            seen = False
            while time.time() - t0 < 15 and not seen:
                seen = bw_list()["state"] == "probing"
                time.sleep(0.05)
            if not seen:
                fail("the pair never showed as probing")
            tj = time.time()
            r = netlab.sh(pbox, "job", "list", "--control", CTRLD_CTL, ns=ns0,
                          check=False, timeout=15)
            dt = time.time() - tj
            still = bw_list()["state"]
            print("pbox job list during the probe: exit %d in %.2f s (pair still %s)" %
                  (r.returncode, dt, still), flush=True)
            if r.returncode != 0 or dt > 2.0:
                fail("pbox-ctrld's control API stalled during a probe (%.2f s)" % dt)
            out, err = prober.communicate(timeout=40)
            wall = time.time() - t0
            if prober.returncode != 0:
                fail("pbox bw probe: exit %d: %s %s" % (prober.returncode, out, err))
            e = json.loads(out)
            est = e["estimate"]
            mid = (est["r_min_bps"] + est["r_max_bps"]) / 2
            rel = (mid - link) / link
            print("matrix w0 -> %s: [%.1f, %.1f] Mbit/s (true %.1f, %+.1f%%), flags %s, "
                  "took %.1f s, answered in %.1f s" % (
                      peer, est["r_min_bps"] / 1e6, est["r_max_bps"] / 1e6, link / 1e6,
                      100 * rel, est["flags"], est["duration_ns"] / 1e9, wall), flush=True)
            if e["state"] != "ok" or e["probes"] != 1 or e["failures"] != 0:
                fail("matrix entry: %s" % e)
            if abs(rel) > 0.20:
                fail("estimate off by %+.0f%%" % (100 * rel))
            if not 0 < est["duration_ns"] <= 10.5e9 or est["timestamp_ns"] <= 0:
                fail("entry without a plausible duration / timestamp: %s" % est)
            r = subprocess.run(["ip", "netns", "exec", ns0, pbox, "bw", "--control",
                                CTRLD_CTL], env=dict(os.environ, **env),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=15)
            print(r.stdout, flush=True)
            if r.returncode != 0 or "w0" not in r.stdout or " ok " not in r.stdout:
                fail("pbox bw did not print the entry")
            r = subprocess.run(["ip", "netns", "exec", ns0, pbox, "stats", "--json",
                                "--control", PBOXD_CTL], env=dict(os.environ, **env),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=15)
            try:
                done = json.loads(r.stdout)["probe"]["probes_done"]
            except (ValueError, KeyError):
                done = None
            if done != 1:
                print(r.stdout[-2000:])
                fail("pboxd's stats do not count the probe (probes_done %s)" % done)
        finally:
            for pth in (pconf, cconf):
                if os.path.exists(pth):
                    os.unlink(pth)
            for pth in ("/tmp/%s-pboxd.log" % tmp, "/tmp/%s-ctrld.log" % tmp):
                if os.path.exists(pth):
                    print_tail(pth, 15)
                    os.unlink(pth)
    print("ok (%.1f s)" % (time.time() - t_start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
