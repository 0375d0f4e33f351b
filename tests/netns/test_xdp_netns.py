#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""pboxd's XDP filter (nicfw/pbox_xdp.bpf.c) on the veth of its kernel-UDP data port, in
network namespaces (tests/dpdk/netns.py's topology: appliance on ct0, workers on w0, one
bridge).

  1. Without the filter, then with it: the same deterministic jobs give exact results
     (pbox-check-worker checks every element) and, when pbox-dpdk-worker is built, the
     same result hash: the filter changes nothing for admitted traffic.
  2. A flood of garbage and wrong-cookie datagrams from a worker namespace during a
     session: without the filter the engine counts every one under its reason (the flood
     reaches the engine); with it the XDP counters show every one under the same reason
     and the engine's drop counters stay 0. `pbox stats` shows the XDP counters.
  3. Operations: attached in native mode; pboxd's exit detaches it; a program left by a
     killed pboxd is replaced by the next one, but a second pboxd does not take a running
     one's; another XDP program on the interface makes pboxd refuse to start (exit 69)
     and is left alone.
  4. The loss injector (pbox-xdp-loss) on a veth drops about the configured fraction of
     what crosses it, every datagram it lets through arrives, and it detaches cleanly.
  5. The same through perf/netlab's loss_method "xdp", in both directions of a link.
Skips (exit 77) when not root, BPF is unavailable, or pboxd was built without XDP.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "dpdk"))
import netns  # noqa: E402
from netns import BASE_PORT, CTL_IP, PYTHON, Topology, fail, sh  # noqa: E402
from pboxtest import build_path  # noqa: E402

CORES = 2
WORKERS = 2
JOBS = [{"id": 1, "token": "t", "workers": WORKERS, "mode": "aggregate", "reduce": "mean",
         "deterministic": True}]
XDP = {"interface": "ct0", "mode": "native"}
REASONS = ("truncated", "bad_magic", "bad_version", "bad_type", "unknown_job", "bad_sender",
           "bad_cookie")

# Sent from a worker namespace: FLOOD datagrams cycling through REASONS, to both data
# ports. Prints the count per reason as JSON.
FLOOD = r'''
import json, random, socket, struct, sys, time
host, base, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(7)
def header(**kw):
    f = dict(magic=0x50424F58, version=1, type=1, flags=0, job=1, sender=0, cookie=0,
             chunk=0, iter=0, frag_off=0, frag_len=64, encoding=1, hdr_len=64, chunk_len=64,
             seq=0, arg0=0, arg1=0, reserved=0)
    f.update(kw)
    return struct.pack(">IBBHIIQIIIHBBIIIIQ", *f.values()) + b"\0" * 64
kinds = ["truncated", "bad_magic", "bad_version", "bad_type", "unknown_job", "bad_sender",
         "bad_cookie"]
sent = dict.fromkeys(kinds, 0)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(n):
    k = kinds[i % len(kinds)]
    if k == "truncated":
        p = b"PBOX" + rng.randbytes(rng.randrange(0, 60))
    elif k == "bad_magic":
        p = b"XBOX" + rng.randbytes(rng.randrange(60, 1400))
    elif k == "bad_version":
        p = header(version=rng.choice([0, 2, 255]))
    elif k == "bad_type":
        p = header(type=rng.choice([0, 7, 200]))
    elif k == "unknown_job":
        p = header(job=999)
    elif k == "bad_sender":
        p = header(sender=rng.choice([2, 1000, 0xffffffff]))
    else:
        p = header(cookie=rng.getrandbits(64) | 1, sender=rng.randrange(2))
    s.sendto(p, (host, base + i % 2))
    sent[k] += 1
    if i % 100 == 99:
        time.sleep(0.002)  # no socket buffer overflows on the engine's side
print(json.dumps(sent))
'''
FLOOD_N = 2100


def check_worker(d, rank, iters):
    return [build_path("tests/integration/pbox-check-worker"), "--server", d.control, "--job",
            "1", "--token", "t", "--rank", str(rank), "--workers", str(WORKERS), "--keys",
            "30000,5,4000", "--iters", str(iters), "--timeout-ms", "20000"]


def wait_active(d):
    deadline = time.time() + 30
    while time.time() < deadline:
        job = d.stats()["jobs"][0]
        if job["state"] == "active" and job["registered"] == WORKERS:
            return
        time.sleep(0.05)
    d.dump_log()
    fail("the job's session did not start")


def run_with_flood(topo, d):
    """Exact-checking workers, with a flood in the middle of their session. Returns the
    flood's counts per reason."""
    # 5 ms of "compute" per iteration: the session outlasts the flood (>= 3 s) even when
    # the links are fast and the flood's interpreter starts slowly under load.
    procs = topo.start_ranks([check_worker(d, r, 600) + ["--sleep-ms", "5"]
                              for r in range(WORKERS)])
    wait_active(d)
    sent = json.loads(sh(PYTHON, "-c", FLOOD, CTL_IP, str(BASE_PORT), str(FLOOD_N),
                         ns=topo.worker_ns[0]).stdout)
    if d.stats()["jobs"][0]["state"] != "active":
        fail("the session ended before the flood did: make the workers run longer")
    topo.wait_ranks(d, procs)
    return sent


def hashes(topo, d):
    """The result hash of pbox-dpdk-worker (built with DPDK only), or None."""
    if not os.path.exists(build_path("tests/dpdk/pbox-dpdk-worker")):
        return None
    outs = topo.run_workers(d, 1, "t", WORKERS, ["--hash", "--iters", "5", "--keys",
                                                 "20000,3000,7"])
    hs = {re.search(r"hash ([0-9a-f]{16})", o).group(1) for o in outs}
    if len(hs) != 1:
        fail("ranks got different results: %s" % hs)
    return hs.pop()


def xdp_attached(topo, dev="ct0", ns=None):
    out = sh("ip", "-d", "link", "show", "dev", dev, ns=ns or topo.app_ns).stdout
    m = re.search(r"prog/xdp(drv|generic)? id (\d+)", out)
    return m.group(0) if m else None


# The receiver's buffer holds every datagram (SO_RCVBUFFORCE, root): a receiver slowed
# down by the machine's load must not lose any.
RECV = ("import socket; s = socket.socket(2, 2); s.setsockopt(1, 33, 16 << 20); "
        "s.bind(('0.0.0.0', 6999)); s.settimeout(2); n = 0\ntry:\n while True: s.recv(100); "
        "n += 1\nexcept socket.timeout: print(n)")
SEND = ("import socket, sys, time\ns = socket.socket(2, 2)\n"
        "for i in range(int(sys.argv[2])):\n s.sendto(b'x' * 100, (sys.argv[1], 6999))\n"
        " if i % 100 == 99: time.sleep(0.002)")


def transfer(procs, recv_ns, send_ns, dst, n):
    """n UDP datagrams from send_ns to dst (in recv_ns); returns how many arrived."""
    recv = subprocess.Popen(["ip", "netns", "exec", recv_ns, PYTHON, "-c", RECV],
                            stdout=subprocess.PIPE, text=True)
    procs.append(recv)
    time.sleep(0.5)
    sh(PYTHON, "-c", SEND, dst, str(n), ns=send_ns)
    return int(recv.communicate(timeout=30)[0])


def check_loss(c, n, got, p, what):
    """c: an injector's counters on the receiving link of n datagrams of which got arrived.
    The counters see every frame (ARP too): the datagrams' own drops are known within
    frames - n. 6 standard deviations around p."""
    if c["frames"] < n or abs(c["dropped"] - p * c["frames"]) > 6 * (c["frames"] * p * (1 - p)) ** 0.5:
        fail("%s: injector counters %s for %d datagrams at p=%g" % (what, c, n, p))
    if not n - c["dropped"] <= got <= n - c["dropped"] + (c["frames"] - n):
        fail("%s: received %d of %d, injector: %s" % (what, got, n, c))


def start_failing(topo, extra_app):
    """Run a pboxd that is expected to refuse to start; (exit status, log)."""
    return topo.pboxd("udp", JOBS, cores=CORES, extra_app=extra_app).run_to_exit()


def missing():
    if os.geteuid() != 0:
        return "needs root (network namespaces, BPF)"
    if not os.path.exists(build_path("nicfw/pbox-xdp-loss")):
        return "built without XDP (nicfw/ needs clang, bpftool and libbpf-dev)"
    r = subprocess.run([build_path("tests/nicfw/test_xdp")], capture_output=True, text=True)
    if r.returncode == 77:
        return r.stdout.strip()
    return None


def main():
    why = missing()
    if why:
        print("SKIP: " + why)
        return 77
    with Topology(nworker_ns=2) as topo:
        # 1-2 without the filter: the reference, and the flood reaches the engine.
        with topo.pboxd("udp", JOBS, cores=CORES) as d:
            sent = run_with_flood(topo, d)
            ref = hashes(topo, d)
            st = d.stats()
            drops = st["totals"]["drops"]
            for k in REASONS:
                if drops[k] != sent[k]:
                    fail("without XDP the engine counted %d %s drops of %d sent: %s" %
                         (drops[k], k, sent[k], drops))
            if "xdp" in st:
                fail("stats show an XDP section without a filter")
        print("without XDP: the engine dropped %d flood datagrams; hash %s" %
              (st["totals"]["dropped"], ref))

        # 1-3 with the filter.
        with topo.pboxd("udp", JOBS, cores=CORES, extra_app={"xdp": XDP}) as d:
            if not xdp_attached(topo, "ct0"):
                fail("pboxd is running but ct0 has no XDP program")
            sent = run_with_flood(topo, d)
            got = hashes(topo, d)
            st = d.stats()
            x = st["xdp"]
            if x["mode"] != "native" or x["interface"] != "ct0":
                fail("XDP attached as %s on %s, expected native on ct0" %
                     (x["mode"], x["interface"]))
            for k in REASONS:
                if x["drops"].get(k, 0) != sent[k]:
                    fail("XDP counted %d %s drops of %d sent: %s" %
                         (x["drops"].get(k, 0), k, sent[k], x))
            if st["totals"]["dropped"] != 0:
                fail("datagrams reached the engine past the filter: %s" %
                     st["totals"]["drops"])
            if x["dropped"] != sum(sent.values()) or x["passed"] == 0:
                fail("XDP totals: %s (sent %s)" % (x, sent))
            if got != ref:
                fail("results with the XDP filter differ: hash %s vs %s" % (got, ref))
            # Another session of the job (new cookies, chunk owners loaded again).
            topo.run_ranks(d, [check_worker(d, r, 5) for r in range(WORKERS)])
            st = d.stats()
            x = st["xdp"]
            # Valid datagrams were steered by their chunk's owner: both cores seen (no
            # socket registered, so passed to the kernel), none without an owner.
            passed = {c["core"]: c["passed"] for c in x["cores"]}
            if sorted(passed) != list(range(CORES)) or min(passed.values()) == 0 or \
                    x["pass_no_owner"] != 0 or x["redirected"] != 0:
                fail("XDP steering counters: %s" % x)
            if st["totals"]["dropped"] != 0:
                fail("engine drops after the second session: %s" % st["totals"]["drops"])
            out = subprocess.run(["ip", "netns", "exec", topo.app_ns,
                                  build_path("apps/pbox"), "stats", "--control",
                                  d.control], env=dict(os.environ, PBOX_ADMIN_TOKEN=d.admin_token),
                                 capture_output=True, text=True).stdout
            if "xdp ct0 (native)" not in out or "bad_cookie=%d" % sent["bad_cookie"] not in out:
                fail("`pbox stats` does not show the XDP counters: %s" % out)
            if "XDP maps pinned under /sys/fs/bpf/pbox/ct0" not in d.log():
                fail("pboxd did not pin the maps: %s" % d.log())
            # A second pboxd (other ports) must not take the running one's filter.
            mine = xdp_attached(topo, "ct0")
            r, log = start_failing(topo, {"xdp": XDP, "base_port": BASE_PORT + 100,
                                          "control": "%s:7001" % CTL_IP})
            if r != 69 or "belongs to a running process" not in log:
                fail("a second pboxd on ct0: status %d: %s" % (r, log))
            if xdp_attached(topo, "ct0") != mine:
                fail("the second pboxd changed the running one's filter")
        print("with XDP: %d dropped by XDP (%s), 0 by the engine; hash %s" %
              (x["dropped"], x["drops"], got))
        if xdp_attached(topo, "ct0"):
            fail("pboxd's exit left the XDP program on ct0: %s" % xdp_attached(topo, "ct0"))

        # 3: a killed pboxd leaves its program; the next one replaces it.
        d = topo.pboxd("udp", JOBS, cores=CORES, extra_app={"xdp": XDP})
        d.start()
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        d.remove_dir()
        stale = xdp_attached(topo, "ct0")
        if not stale:
            fail("after SIGKILL the program should still be attached")
        with topo.pboxd("udp", JOBS, cores=CORES, extra_app={"xdp": XDP}) as d:
            now = xdp_attached(topo, "ct0")
            if now == stale or "replacing it" not in d.log():
                fail("the stale program (%s) was not replaced (%s): %s" % (stale, now, d.log()))
            topo.run_ranks(d, [check_worker(d, r, 5) for r in range(WORKERS)])
        if xdp_attached(topo, "ct0"):
            fail("the exit after a replacement left a program on ct0")

        # 3: another program on the interface is not ours to replace.
        loss = build_path("nicfw/pbox-xdp-loss")
        sh(loss, "attach", "ct0", "--probability", "0", ns=topo.app_ns)
        r, log = start_failing(topo, {"xdp": XDP})
        if r != 69 or "another XDP program" not in log:
            fail("pboxd started over a foreign XDP program (status %d): %s" % (r, log))
        if not xdp_attached(topo, "ct0"):
            fail("pboxd removed the foreign program")
        sh(loss, "detach", "ct0", ns=topo.app_ns)
        if xdp_attached(topo, "ct0"):
            fail("pbox-xdp-loss detach left a program")
        print("operations: detach on exit, stale program replaced, foreign program kept")

        # 4: the loss injector on a worker's veth.
        w = topo.worker_ns[1]
        sh(loss, "attach", "w0", "--probability", "0.2", "--seed", "5", ns=w)
        n = 3000
        got = transfer(topo.procs, w, topo.app_ns, "10.232.0.12", n)
        c = json.loads(sh(loss, "stats", "w0", ns=w).stdout)
        sh(loss, "detach", "w0", ns=w)
        check_loss(c, n, got, 0.2, "pbox-xdp-loss on w0")
        print("loss injector: %d of %d frames dropped (p=0.2); %d of %d datagrams arrived" %
              (c["dropped"], c["frames"], got, n))

    # 5: netlab's "xdp" loss method on a lab's links, both directions.
    sys.path.insert(0, os.path.join(HERE, "..", "..", "perf", "netlab"))
    import netlab
    sc = netlab.Scenario.from_dict({"workers": 1, "worker_rate": "none", "loss": 0.1,
                                    "loss_method": "xdp", "seed": 3, "systems": ["pbox"]})
    method = netlab.LOSS_METHODS["xdp"](sc.loss, sc.seed, os.environ.get("PBOX_BUILD_DIR"))
    with netlab.Lab(sc) as lab:
        method.apply(lab)
        n = 2000
        to_w0 = transfer(lab.procs, lab.worker_ns[0], lab.app_ns, lab.worker_ip[0], n)
        to_app = transfer(lab.procs, lab.app_ns, lab.worker_ns[0], lab.app_ip, n)
        c = method.counters(lab)
        check_loss(c["w0"], n, to_w0, 0.1, "netlab xdp loss, app to w0")
        check_loss(c["app"], n, to_app, 0.1, "netlab xdp loss, w0 to app")
    print("netlab xdp loss (p=0.1): %d of %d and %d of %d datagrams arrived; counters %s" %
          (to_w0, n, to_app, n, c))
    return 0


if __name__ == "__main__":
    sys.exit(main())
