#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""pboxd --transport afxdp end to end, in network namespaces (tests/dpdk/netns.py's
topology: pboxd on the veth ct0, whose kernel address 10.232.0.1 is the data address and
the control channel's; kernel-UDP workers in two other namespaces, one bridge).

  1. Training (`pbox train`, Fashion-MNIST MLP, NAG on the appliance, deterministic):
     the model every rank saves is byte-identical over kernel UDP (MTU 1500) and over
     AF_XDP at MTU 1500 and at MTU 9000 (chained UMEM buffers); the datagrams went
     through the AF_XDP socket (transport and XDP redirect counters), none was dropped.
  2. A garbage and wrong-cookie flood during an exact-checking session (pbox-check-worker)
     is dropped by the XDP filter under its reasons and never reaches the engine (its
     drop counters stay 0) nor the transport's parser; `pbox stats` prints the afxdp and
     xdp lines.
  3. Two cores, one RX queue each, on a two-queue veth (dp0, address 10.231.0.1) with
     NIC-like flow steering in front of it (nicfw/steer.bpf.c at tc ingress of the
     bridge ports facing the workers: data port base_port + k onto queue k): the same
     model again, each core's socket received its chunks' datagrams (XDP redirects per
     core), none was passed to the kernel for want of a socket on its queue.
  4. Teardown: after SIGTERM pboxd exits 0, the XDP program is detached (the interface has
     none) and the socket closed; a missing interface, a queue given twice, two cores on
     a one-queue veth and missing capabilities are refused with their reason.
Skips (exit 77) when not root, or pboxd was built without AF_XDP, or the data is missing.
"""
import glob
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "dpdk"))
import netns  # noqa: E402
from netns import BASE_PORT, CTL_IP, DATA_IP, PYTHON, Topology, fail, sh  # noqa: E402
from pboxtest import build_path  # noqa: E402

sys.path.insert(0, HERE)
from test_xdp_netns import FLOOD, REASONS, xdp_attached  # noqa: E402

RANKS = 2
BATCH = 240
STEPS = 8
DATA = "/usr/share/datasets/fashion-mnist"
AFXDP = {"interface": "ct0"}


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def train_job():
    return {"id": 3, "token": "train", "workers": RANKS, "mode": "server-optimizer",
            "deterministic": True,
            "optimizer": {"name": "nag", "lr": f32(0.05), "momentum": f32(0.9),
                          "rescale": f32(1.0 / BATCH)}}


CHECK_JOB = {"id": 1, "token": "t", "workers": RANKS, "mode": "aggregate", "reduce": "mean",
             "deterministic": True}


def set_mtu(topo, mtu):
    for ns, dev in [(topo.app_ns, "ct0")] + [(w, "w0") for w in topo.worker_ns]:
        sh("ip", "link", "set", dev, "mtu", str(mtu), ns=ns)
    for dev in ["ct0s", "dp0s"] + ["w%ds" % i for i in range(len(topo.worker_ns))]:
        sh("ip", "link", "set", dev, "mtu", str(mtu), ns=topo.sw_ns)


def train(topo, d, outdir, tag):
    cmds = [[build_path("apps/pbox"), "train", "--server", d.control, "--job", "3",
             "--token", "train", "--rank", str(r), "--workers", str(RANKS), "--batch",
             str(BATCH), "--max-steps", str(STEPS), "--data", DATA, "--save-model",
             os.path.join(outdir, "%s-rank%d.model" % (tag, r))]
            for r in range(RANKS)]
    topo.run_ranks(d, cmds, timeout=120)
    digests = set()
    for r in range(RANKS):
        with open(os.path.join(outdir, "%s-rank%d.model" % (tag, r)), "rb") as f:
            digests.add(hashlib.sha256(f.read()).hexdigest())
    if len(digests) != 1:
        fail("%s: the ranks saved different models" % tag)
    return digests.pop()


def check_afxdp_counters(st, what, chained, dev="ct0"):
    t = st["transport"]
    tot = t["totals"]
    x = st["xdp"]
    if t["name"] != "afxdp" or t["interface"] != dev or not t["registered"]:
        fail("%s: transport section %s" % (what, t))
    if tot["rx_pkts"] == 0 or tot["tx_pkts"] == 0 or x["redirected"] != tot["rx_pkts"]:
        fail("%s: %d datagrams redirected by XDP, %d received, %d sent by the AF_XDP socket" %
             (what, x["redirected"], tot["rx_pkts"], tot["tx_pkts"]))
    if chained != (tot["rx_frames"] > tot["rx_pkts"] and tot["tx_frames"] > tot["tx_pkts"]):
        fail("%s: %d RX frames for %d datagrams, %d TX frames for %d (chained buffers %s)" %
             (what, tot["rx_frames"], tot["rx_pkts"], tot["tx_frames"], tot["tx_pkts"],
              "expected" if chained else "not expected"))
    if any(tot["rx_dropped"].values()) or tot["tx_no_frame"] or tot["tx_ring_full"] or \
            tot["tx_too_big"] or st["totals"]["dropped"] != 0:
        fail("%s: drops: transport %s, engine %s" % (what, tot, st["totals"]["drops"]))


def check_worker(d, rank, iters):
    # Small keys: the session lasts by its iterations (latency), not by its bytes.
    return [build_path("tests/integration/pbox-check-worker"), "--server", d.control, "--job",
            "1", "--token", "t", "--rank", str(rank), "--workers", str(RANKS), "--keys",
            "3000,5", "--iters", str(iters), "--timeout-ms", "20000"]


def flood_session(topo, d):
    """Exact-checking workers with a flood in the middle of their session; the flood's
    counts per reason."""
    procs = topo.start_ranks([check_worker(d, r, 2000) for r in range(RANKS)])
    deadline = time.time() + 30
    while time.time() < deadline:
        job = d.stats()["jobs"][0]
        if job["state"] == "active" and job["registered"] == RANKS:
            break
        time.sleep(0.05)
    else:
        d.dump_log()
        fail("the job's session did not start")
    # One data port: the flood goes to core 0's port (a second port would not be pbox's).
    sent = json.loads(sh(PYTHON, "-c", FLOOD.replace("base + i % 2", "base"), CTL_IP,
                         str(BASE_PORT), "1400", ns=topo.worker_ns[0]).stdout)
    if d.stats()["jobs"][0]["state"] != "active":
        fail("the session ended before the flood did: make the workers run longer")
    topo.wait_ranks(d, procs)
    return sent


def refused(topo, extra_app, cores=1, drop_caps=False):
    """A pboxd that must refuse to start: (exit status, log). drop_caps: without the
    capabilities AF_XDP and BPF need (capsh)."""
    d = topo.pboxd("afxdp", [CHECK_JOB], cores=cores, extra_app=extra_app)
    args = d.args
    if drop_caps:
        # d.args: ip netns exec NS pboxd ...
        args = args[:4] + ["capsh", "--drop=cap_net_raw,cap_net_admin,cap_bpf,cap_sys_admin",
                           "--", "-c", " ".join(args[4:])]
    return d.run_to_exit(args)


def missing():
    if os.geteuid() != 0:
        return "needs root (network namespaces, AF_XDP, BPF)"
    r = subprocess.run([build_path("dataplane/pboxd"), "--transport", "afxdp",
                        "--check-config", "--data-address", "10.0.0.1"],
                       capture_output=True, text=True)
    if "not available" in r.stderr:
        return "pboxd was built without the afxdp transport (libxdp-dev, nicfw/)"
    r = subprocess.run([build_path("tests/nicfw/test_xdp")], capture_output=True, text=True)
    if r.returncode == 77:
        return r.stdout.strip()
    if not glob.glob(os.path.join(DATA, "train-images-idx3-ubyte*")):
        return "no Fashion-MNIST data in %s" % DATA
    return None


def main():
    why = missing()
    if why:
        print("SKIP: " + why)
        return 77
    out = tempfile.mkdtemp(prefix="pbox-afxdp-train-")
    t0 = time.time()
    with Topology(nworker_ns=2, data_queues=2) as topo:
        # 1. The model over kernel UDP, then over AF_XDP, at MTU 1500.
        with topo.pboxd("udp", [train_job()], cores=1) as d:
            ref = train(topo, d, out, "udp-1500")
        with topo.pboxd("afxdp", [train_job()], cores=1, extra_app={"afxdp": AFXDP}) as d:
            if not xdp_attached(topo, "ct0"):
                fail("pboxd on afxdp is running but ct0 has no XDP program")
            got = train(topo, d, out, "afxdp-1500")
            st = d.stats()
            check_afxdp_counters(st, "afxdp at MTU 1500", chained=False)
            if "copy mode" not in d.log() and "zero-copy mode" not in d.log():
                fail("pboxd did not log the AF_XDP bind mode: %s" % d.log())
        if got != ref:
            fail("the model trained over AF_XDP (%s) differs from kernel UDP's (%s)" % (got, ref))
        print("MTU 1500: kernel UDP and AF_XDP models sha256 %s (%d datagrams in, %d out); "
              "%.1f s" % (got, st["transport"]["totals"]["rx_pkts"],
                          st["transport"]["totals"]["tx_pkts"], time.time() - t0))
        # SIGTERM (pboxtest's stop, exit status 0 checked): program detached, sockets closed.
        if xdp_attached(topo, "ct0"):
            fail("pboxd's exit left the XDP program on ct0")
        if "ct0: XDP filter detached" not in d.log() or \
                "1 AF_XDP socket on ct0 closed" not in d.log():
            fail("pboxd's exit did not detach the filter and close the socket: %s" % d.log())

        # 2. The flood, at MTU 1500.
        with topo.pboxd("afxdp", [CHECK_JOB], cores=1, extra_app={"afxdp": AFXDP}) as d:
            sent = flood_session(topo, d)
            st = d.stats()
            x = st["xdp"]
            for k in REASONS:
                if x["drops"].get(k, 0) != sent[k]:
                    fail("XDP counted %d %s drops of %d sent: %s" %
                         (x["drops"].get(k, 0), k, sent[k], x))
            if st["totals"]["dropped"] != 0:
                fail("flood datagrams reached the engine: %s" % st["totals"]["drops"])
            check_afxdp_counters(st, "afxdp with a flood", chained=False)
            text = subprocess.run(["ip", "netns", "exec", topo.app_ns,
                                   build_path("apps/pbox"), "stats", "--control",
                                   d.control],
                                  env=dict(os.environ, PBOX_ADMIN_TOKEN=d.admin_token),
                                  capture_output=True, text=True).stdout
            if "afxdp ct0 (" not in text or "xdp ct0 (native)" not in text:
                fail("`pbox stats` does not show the afxdp and xdp counters: %s" % text)
        print("flood: %d datagrams dropped by XDP (%s), 0 by the engine; %.1f s" %
              (x["dropped"], x["drops"], time.time() - t0))

        # 3. Two cores on two queues, steered by destination port like a NIC would.
        sh("ip", "addr", "add", DATA_IP + "/24", "dev", "dp0", ns=topo.app_ns)
        for i in range(len(topo.worker_ns)):
            dev = "w%ds" % i
            sh("tc", "qdisc", "add", "dev", dev, "clsact", ns=topo.sw_ns)
            sh("tc", "filter", "add", "dev", dev, "ingress", "bpf", "direct-action", "obj",
               build_path("nicfw/steer.bpf.o"), "sec", "tc", ns=topo.sw_ns)
        with topo.pboxd("afxdp", [train_job()], cores=2,
                        extra_app={"afxdp": {"interface": "dp0"},
                                   "data_address": DATA_IP}) as d:
            got2 = train(topo, d, out, "afxdp-2cores")
            st = d.stats()
            check_afxdp_counters(st, "afxdp on 2 cores", chained=False, dev="dp0")
            x = st["xdp"]
            per_core = [(c["queue"], c["rx_pkts"]) for c in st["transport"]["cores"]]
            if [q for q, _ in per_core] != [0, 1] or min(n for _, n in per_core) == 0 or \
                    any(c["passed"] for c in x["cores"]) or \
                    [c["redirected"] for c in x["cores"]] != [n for _, n in per_core]:
                fail("2 cores: per-core (queue, datagrams) %s, XDP %s" % (per_core, x))
        if got2 != ref:
            fail("the model trained over AF_XDP on 2 cores (%s) differs from kernel UDP's "
                 "(%s)" % (got2, ref))
        print("2 cores on 2 queues: the same model; (queue, datagrams) per core %s; %.1f s" %
              (per_core, time.time() - t0))

        # 1. MTU 9000: frames of three 4 KB UMEM buffers.
        set_mtu(topo, 9000)
        with topo.pboxd("afxdp", [train_job()], cores=1,
                        extra_app={"afxdp": AFXDP, "mtu": 9000}) as d:
            got9k = train(topo, d, out, "afxdp-9000")
            check_afxdp_counters(d.stats(), "afxdp at MTU 9000", chained=True)
        if got9k != ref:
            fail("the model trained over AF_XDP at MTU 9000 (%s) differs from kernel UDP's "
                 "(%s)" % (got9k, ref))
        print("MTU 9000: AF_XDP model sha256 %s (the same)" % got9k)

        # 4. Refusals.
        r, log = refused(topo, {"afxdp": {"interface": "nosuch0"}})
        if r != 69 or "no such interface" not in log:
            fail("a missing interface: status %d: %s" % (r, log))
        r, log = refused(topo, {"afxdp": {"interface": "ct0", "queues": [0, 0]}}, cores=2)
        if r != 78 or "queue 0 is given to cores 0 and 1" not in log:
            fail("a queue given twice: status %d: %s" % (r, log))
        r, log = refused(topo, {"afxdp": {"interface": "ct0"}}, cores=2)
        if r != 69 or "no queue 1" not in log:
            fail("two cores on a one-queue veth: status %d: %s" % (r, log))
        if shutil.which("capsh"):
            r, log = refused(topo, {"afxdp": AFXDP}, drop_caps=True)
            if r != 69 or "Operation not permitted" not in log or "run as root" not in log:
                fail("without CAP_NET_RAW: status %d: %s" % (r, log))
        if xdp_attached(topo, "ct0"):
            fail("a refused start left the XDP program on ct0")
    print("refusals: missing interface, queue given twice, too few queues, no privileges; "
          "%.1f s" % (time.time() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
