#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""perf/netlab's scenario parsing and validation, bounds and bucketing, and its command
line's errors (no privileges needed, no lab built)."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
NETLAB = os.path.join(HERE, "..", "..", "perf", "netlab")
sys.path.insert(0, NETLAB)
import netlab  # noqa: E402
from netlab import LabError, Scenario, parse_rate, parse_size  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL: " + what, file=sys.stderr)


def refused(d, needle):
    try:
        Scenario.from_dict(d)
    except LabError as e:
        check(needle in str(e), "%r: message %r lacks %r" % (d, str(e), needle))
        return
    check(False, "%r was accepted" % (d,))


# rates and sizes
for text, bps in (("100mbit", 100e6), ("1gbit", 1e9), ("1.5gbit", 1.5e9), ("250m", 250e6),
                  ("64kbit", 64e3), ("2G", 2e9), (1e9, 1e9), ("500000000", 5e8)):
    check(parse_rate(text) == bps, "parse_rate(%r) = %r, not %r" % (text, parse_rate(text), bps))
for text in ("none", "off", "unlimited", None):
    check(parse_rate(text) is None, "parse_rate(%r) is not None" % (text,))
for text in ("fast", "100 mbps", "-1gbit", "1e3gbit", "1kbit", True, "1000tbit"):
    try:
        parse_rate(text)
        check(False, "parse_rate(%r) accepted" % (text,))
    except LabError:
        pass
check(parse_size("32K") == 32768 and parse_size("4M") == 4 << 20 and parse_size(65536) == 65536,
      "parse_size")
for text in ("0", "1.5K", "-4K", "big"):
    try:
        parse_size(text)
        check(False, "parse_size(%r) accepted" % text)
    except LabError:
        pass

# a scenario: defaults, conversions, derived values
sc = Scenario.from_dict({})
check(sc.workers == 4 and sc.mtu == 1500 and sc.loss == 0 and sc.systems == ["pbox", "gloo"],
      "defaults: %r" % sc.to_dict())
sc = Scenario.from_dict({"workers": "3", "worker_rate": "100mbit", "appliance_rate": "400mbit",
                         "mtu": 9000, "loss": "0.01", "systems": "gloo, pbox,ps-lite,pbox",
                         "chunk_bytes": "64K", "cross": ["w0>w2:10mbit", {
                             "from": "app", "to": "w1", "rate": "5mbit", "proto": "tcp"}]})
check(sc.workers == 3 and sc.worker_bps() == 100e6 and sc.appliance_bps() == 400e6,
      "converted values: %r" % sc.to_dict())
check(sc.systems == ["gloo", "pbox", "ps-lite"], "systems kept in order without repeats: %r" %
      sc.systems)
check(sc.chunk_bytes == 65536 and sc.loss == 0.01, "chunk_bytes/loss: %r" % sc.to_dict())
check(sc.cross == [{"from": "w0", "to": "w2", "rate": "10mbit", "proto": "udp"},
                   {"from": "app", "to": "w1", "rate": "5mbit", "proto": "tcp"}],
      "cross flows: %r" % sc.cross)
check(sc.model_path().endswith("perf/models/resnet50.txt"), "model path: " + sc.model_path())
json.dumps(sc.to_dict())  # a scenario goes into the result JSON as it is

# invalid scenarios, each with a message that says what is wrong
refused({"worker": 4}, "unknown setting(s) worker")
refused({"workers": 0}, "workers: 0 is outside 1..200")
refused({"workers": 2.5}, "not an integer")
refused({"mtu": 100}, "mtu: 100 is outside 1280..65535")
refused({"worker_rate": "fast"}, "not a rate")
refused({"loss": 0.9}, "loss: 0.9 is outside")
refused({"loss": "often"}, "not a number")
refused({"systems": "pbox,horovod"}, "unknown system 'horovod'")
refused({"systems": []}, "no system given")
refused({"model": "nosuchmodel"}, "no model table")
refused({"workers": 2, "cross": ["w0>w2:10mbit"]}, "'w2' is not an endpoint (app, w0 .. w1)")
refused({"cross": ["w0>w0:10mbit"]}, "same namespace")
refused({"cross": ["w0-w1"]}, "is not FROM>TO:RATE")
refused({"cross": [{"from": "w0", "to": "w1"}]}, "'rate' is missing")
refused({"cross": [{"from": "w0", "to": "w1", "rate": "none"}]}, "needs a rate")
check(Scenario.from_dict({"loss": 0.01, "loss_method": "xdp"}).loss_method == "xdp",
      "loss_method xdp is accepted")
refused({"loss_method": "netem"}, "not one of transport, xdp")
refused({"iterations": 0}, "iterations: 0 is outside")

# bounds: gradient bytes / worker link rate; a ring allreduce moves 2 (n-1)/n of it
sc = Scenario.from_dict({"workers": 4, "worker_rate": "100mbit", "appliance_rate": "200mbit"})
b = netlab.bounds(sc, 100_000_000)
check(abs(b["link_bound_s"] - 8.0) < 1e-9, "link bound %r" % b)
check(abs(b["appliance_bound_s"] - 16.0) < 1e-9 and abs(b["pbox_bound_s"] - 16.0) < 1e-9,
      "appliance bound %r" % b)
check(abs(b["gloo_ring_bound_s"] - 12.0) < 1e-9, "ring bound %r" % b)
b = netlab.bounds(Scenario.from_dict({"worker_rate": "none"}), 1000)
check(b["link_bound_s"] is None and b["pbox_bound_s"] is None, "unlimited: %r" % b)

# DDP's bucketing: reverse order, first bucket >= 1 MiB, then >= cap, nothing lost
sizes = [100] * 10 + [300_000] * 20
bk = netlab.gloo_buckets(sizes, 4 << 20)
check(sum(bk) == sum(sizes), "buckets lose elements: %r" % bk)
check(bk[0] * 4 >= 1 << 20 and bk[0] * 4 < (1 << 20) + 4 * 300_000, "first bucket %r" % bk)
check(all(x * 4 >= 4 << 20 for x in bk[1:-1]), "middle buckets under the cap: %r" % bk)

# the checked-in DVF + TSB scenario: its model table (cut of resnet50) and systems
scs = [Scenario.from_dict(x) for x in netlab.load_scenarios(
    os.path.join(NETLAB, "scenarios", "dvf-tsb.toml"))]
check([s.appliance_rate for s in scs] == ["100mbit", "400mbit"] and
      scs[0].systems == ["pbox", "pbox-tsb", "pbox-dvf", "pbox-dvf-tsb", "gloo"] and
      scs[0].grad_sigma == 1.2, "dvf-tsb.toml: %r" % scs[0].to_dict())
name, sizes = netlab.read_table(scs[0].model_path())
check(name == "resnet50-head85" and len(sizes) == 85 and sum(sizes) == 3219520,
      "resnet50-head85: %s %d %d" % (name, len(sizes), sum(sizes)))

# scenario files: TOML with a [[scenario]] list over shared defaults, and JSON
with tempfile.TemporaryDirectory() as d:
    p = os.path.join(d, "s.toml")
    with open(p, "w") as f:
        f.write('workers = 2\nworker_rate = "50mbit"\n[[scenario]]\nmtu = 1500\n'
                '[[scenario]]\nmtu = 9000\nworkers = 3\n')
    scs = [Scenario.from_dict(x) for x in netlab.load_scenarios(p)]
    check([(s.workers, s.mtu, s.worker_rate) for s in scs] ==
          [(2, 1500, "50mbit"), (3, 9000, "50mbit")], "TOML scenarios: %r" %
          [s.to_dict() for s in scs])
    p = os.path.join(d, "s.json")
    with open(p, "w") as f:
        json.dump({"workers": 5, "loss": 0.001}, f)
    s = Scenario.from_dict(netlab.load_scenarios(p)[0])
    check(s.workers == 5 and s.loss == 0.001, "JSON scenario: %r" % s.to_dict())
    with open(p, "w") as f:
        f.write("{not json")
    try:
        netlab.load_scenarios(p)
        check(False, "a broken JSON file was accepted")
    except LabError as e:
        check("s.json" in str(e), "broken file message: %s" % e)

    # the command line: --help, refusals before anything is built, exit status 2
    cli = [sys.executable, os.path.join(NETLAB, "netlab.py")]
    for sub in ([], ["run"], ["up"], ["cleanup"], ["check"]):
        r = subprocess.run(cli + sub + ["--help"], capture_output=True, text=True)
        check(r.returncode == 0 and "usage:" in r.stdout, "netlab %s --help" % " ".join(sub))
    r = subprocess.run(cli + ["run", "--mtu", "100"], capture_output=True, text=True)
    check(r.returncode == 2 and "mtu: 100 is outside" in r.stderr,
          "run --mtu 100: %d %s" % (r.returncode, r.stderr))
    r = subprocess.run(cli + ["run", "--scenario", os.path.join(d, "missing.toml")],
                       capture_output=True, text=True)
    check(r.returncode == 2 and "missing.toml" in r.stderr, "missing scenario file: " + r.stderr)
    r = subprocess.run(cli + ["run", "--build-dir", os.path.join(d, "nobuild"), "--system",
                              "pbox"], capture_output=True, text=True)
    want = "needs root" if os.geteuid() != 0 else "build first"
    check(r.returncode == 2 and want in r.stderr, "missing build dir: " + r.stderr)
    if os.geteuid() == 0 and os.path.exists("/usr/bin/setpriv"):
        r = subprocess.run(["/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
                            "--clear-groups"] + cli + ["run", "--workers", "2"],
                           capture_output=True, text=True)
        check(r.returncode == 2 and "needs root" in r.stderr, "not root: " + r.stderr)

# shape.py (issue 10's shape at a scale of rates): refusals before anything is built, and
# the summary of a point from its runs
import argparse  # noqa: E402
import shape  # noqa: E402

cli = [sys.executable, os.path.join(NETLAB, "shape.py")]
for argv, needle in ((["--pbox", "bogus"], "unknown variant 'bogus'"),
                     (["--pbox", "pbox-old"], "needs --old-build"),
                     (["--rates", "100,x"], "comma-separated"),
                     (["--losses", "0,0.9"], "within 0..0.5")):
    r = subprocess.run(cli + ["run"] + argv, capture_output=True, text=True)
    check(r.returncode == 2 and needle in r.stderr, "shape run %s: %d %s" % (
        " ".join(argv), r.returncode, r.stderr))
sc = shape.scenario(argparse.Namespace(
    workers=2, mtu=1500, model="resnet50", iterations=2, warmup=1, loss_method="xdp",
    appliance_cores=1, appliance_factor=4.0, seed=1, timeout=None), 100)
check(sc.worker_bps() == 100e6 and sc.appliance_bps() == 400e6, "shape scenario rates")
link = {"tx_bytes": 0, "rx_bytes": 0, "tbf_drops_host": 1, "tbf_drops_switch": 2}
run = {"status": "ok", "iter_seconds": [2.0, 4.0], "median_s": 3.0, "retransmits": 10,
       "frag_bytes": 1000, "pboxd": {"busy_pct": 50, "dups": 1},
       "links": {"app": dict(link), "w0": dict(link, tx_bytes=3 * 25e6),
                 "w1": dict(link, tx_bytes=3 * 25e6)}}
pt = shape.pooled([run, dict(run, iter_seconds=[3.0, 3.0], median_s=3.0)], sc, 1e6, 100e6)
check(pt["median_s"] == 3.0 and pt["min_s"] == 2.0 and pt["max_s"] == 4.0, "pooled times")
check(abs(pt["worker_tx_bytes_per_exchange"] - 25e6) < 1, "pooled tx per exchange %r" %
      pt["worker_tx_bytes_per_exchange"])
check(abs(pt["worker_link_utilisation"] - 25e6 * 8 / 100e6 / 3.0) < 1e-9, "utilisation")
check(pt["tbf_drops_switch"] == 12 and pt["retransmits"] == 20, "pooled counters")
check(abs(pt["retransmitted_payload_pct"] - 100.0 * 20 * 1000 / (1e6 * 2 * 6)) < 1e-9,
      "retransmitted payload %")
res = {"systems": {"pbox": dict(pt), "gloo": dict(pt, median_s=6.0)}}
rs = shape.ratios(res, 2.0, 1.5)
check(rs == {"gloo_over_pbox": 2.0} and res["systems"]["pbox"]["over_link_bound"] == 1.5
      and res["systems"]["pbox"]["over_cpu_bound"] == 2.0
      and "over_cpu_bound" not in res["systems"]["gloo"], "ratios %r" % rs)
rows = shape.table({"points": [dict(res, rate_mbit=100, link_bound_s=2.0, binds="link",
                                    ratios=rs)], "loss": []})
check(any("| pbox | 3.00 (2.00–4.00) | 1.50 | 2.00 |" in r for r in rows), "table %r" % rows)
# steadiness: times 2, 4, 3, 3 (mean 3, population deviation sqrt(0.5)); the kernel-pacing
# counters of the runs summed, the lead their largest, "on" only if every run had it
check(abs(pt["max_over_median"] - 4.0 / 3.0) < 1e-9 and
      abs(pt["cv"] - 0.5 ** 0.5 / 3.0) < 1e-9, "spread %r %r" % (
          pt["max_over_median"], pt["cv"]))
kp = {"on": True, "egress_fq": 0, "stamped": 10, "delayed": 4, "capped": 1,
      "lead_max_ms": 2.5}
pk = shape.pooled([dict(run, kpace=kp), dict(run, kpace=dict(kp, lead_max_ms=7.0))], sc,
                  1e6, 100e6)
check(pk["kpace"] == {"on": True, "egress_fq": 0, "stamped": 20, "delayed": 8, "capped": 2,
                      "lead_max_ms": 7.0}, "pooled kpace %r" % pk.get("kpace"))
# (times 2, 4, 2, 4: deviation 1, CV 1/3)
rows = shape.spread_table({"points": [dict(rate_mbit=100, systems={"pbox-kpace": pk})],
                           "loss": []})
check(any("| 100 Mbit/s | pbox-kpace | 3.00, 3.00 | 1.33 | 0.33 | 20 / 8 / 2 (no) | 7.0 |" in r
          for r in rows), "spread table %r" % rows)
check(shape.VARIANTS["pbox-kpace"]["PBOX_KPACE"] == "1" and
      shape.VARIANTS["pbox"]["PBOX_KPACE"] == "0", "kpace variants")
# netlab's host qdisc: tbf (default) or tbf+fq, nothing else
check(netlab.Scenario.from_dict({}).host_qdisc == "tbf", "host_qdisc default")
try:
    netlab.Scenario.from_dict({"host_qdisc": "fq"})
    check(False, "host_qdisc fq accepted")
except netlab.LabError as e:
    check("tbf+fq" in str(e), "host_qdisc refusal: %s" % e)

if failures:
    print("%d check(s) failed" % len(failures), file=sys.stderr)
    sys.exit(1)
print("ok")
