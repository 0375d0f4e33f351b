#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""perf/netlab end to end, small: a 2-worker lab with 20 Mbit/s worker links and a
40 Mbit/s appliance link at MTU 1500; pbox exchanges a 1 MB gradient for 3 timed
iterations.

  1. The results are exact (pbox-bench-comm checks every element) and every exchange
     takes at least about the link-rate bound (gradient bytes / worker rate, less the tbf
     burst): without the rate limits a veth moves 1 MB in milliseconds, so a limit that
     is not applied fails here.
  2. The traffic went over the lab's links (the appliance link's counters).
  3. Teardown: no namespace of the run is left, and the root namespace has the same links
     as before.
  4. `netlab up` applies tbf on both sides of each link, and tears down on SIGTERM.
  5. A run killed with SIGKILL leaves its namespaces; `netlab cleanup` removes them (and
     leaves a live run's alone).
  6. Cross traffic (iperf3, when installed) flows and is held to the link rate.
Skips (exit 77) when not root or ip/tc are missing.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
NETLAB = os.path.join(HERE, "..", "..", "perf", "netlab")
sys.path.insert(0, NETLAB)
import netlab  # noqa: E402

RECV = ("import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
        "s.bind(('%s', 5999)); s.settimeout(10); print(len(s.recv(65536)))" % netlab.APP_IP)
SEND = ("import socket, time; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
        "s.setsockopt(socket.IPPROTO_IP, 10, 2); "  # IP_MTU_DISCOVER = IP_PMTUDISC_DO
        "[(s.sendto(bytes(8000), ('%s', 5999)), time.sleep(0.2)) for _ in range(5)]" %
        netlab.APP_IP)
CLI = [sys.executable, os.path.join(NETLAB, "netlab.py")]


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr, flush=True)
    sys.exit(1)


def root_links():
    r = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True)
    return sorted(re.findall(r"^\d+: ([^:@]+)", r.stdout, re.M))


def ours(prefix):
    return [n for n in netlab.list_namespaces() if n.startswith(prefix)]


def start_up(extra):
    """`netlab up` in the background; returns (process, its namespace prefix)."""
    p = subprocess.Popen(CLI + ["up"] + extra, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    line = p.stdout.readline()
    m = re.search(r"in (netlab-[0-9]+-[0-9a-z]+-)app", line)
    if not m:
        p.kill()
        fail("netlab up printed %r; stderr %s" % (line, p.stderr.read()))
    return p, m.group(1)


def check_wait_all():
    """Ranks' pipes are read at once: a rank that writes more than a pipe holds before
    another rank may finish must not block (netlab read them one by one, and a BSP job
    whose ranks print a line per step stalled once the unread pipes filled)."""
    with tempfile.TemporaryDirectory() as tmp:
        flag = os.path.join(tmp, "written")
        waiter = subprocess.Popen(
            [sys.executable, "-c", "import os, time\nwhile not os.path.exists(%r): "
             "time.sleep(0.02)" % flag], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        writer = subprocess.Popen(
            [sys.executable, "-c", "import sys\nsys.stdout.write('x' * 200000)\n"
             "sys.stdout.flush()\nopen(%r, 'w').close()" % flag],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            outs = netlab.wait_all([waiter, writer], 20)
        except netlab.LabError as e:
            fail("wait_all: %s (pipes read one process at a time?)" % e)
        if [rc for rc, _, _ in outs] != [0, 0] or len(outs[1][1]) != 200000:
            fail("wait_all: %s" % [(rc, len(o), e[-200:]) for rc, o, e in outs])
    print("wait_all: 200000 bytes from the second process while the first waited")


def main():
    check_wait_all()
    why = netlab.missing()
    if why:
        print("SKIP: " + why)
        return 77
    build = os.environ.get("PBOX_BUILD_DIR") or os.path.join(HERE, "..", "..", "build")
    why = netlab.build_dir_problem(build, ["pbox"])
    if why:
        fail(why)
    links0 = root_links()

    # 1-3: a scenario run
    with tempfile.TemporaryDirectory(prefix="netlab-test-") as d:
        table = os.path.join(d, "small.txt")
        with open(table, "w") as f:
            f.write("# model small\n# total 262144\na 200000\nb 62144\n")
        sc = netlab.Scenario.from_dict({
            "workers": 2, "worker_rate": "20mbit", "appliance_rate": "40mbit", "mtu": 1500,
            "model": table, "systems": ["pbox"], "iterations": 3, "warmup": 1,
            "timeout": 90})
        t0 = time.time()
        res = netlab.run_scenario(sc, os.path.abspath(build))
        print("pbox: %s (%.1f s)" % ({k: v for k, v in res["systems"]["pbox"].items()
                                      if k != "links"}, time.time() - t0))
    p = res["systems"]["pbox"]
    if p["status"] != "ok":
        fail("pbox run: %s" % p.get("error"))
    if not p["exact"] or len(p["iter_seconds"]) != 3:
        fail("pbox results: %r" % p)
    nbytes = 4 * 262144
    bound = res["bounds"]["link_bound_s"]
    if abs(bound - nbytes * 8 / 20e6) > 1e-9:
        fail("link-rate bound %r" % bound)
    # The first burst bytes pass at once (the bucket is full when an exchange starts).
    burst = max(64 << 10, int(20e6 / 8 / 1000))
    floor = 0.9 * (nbytes - burst) * 8 / 20e6
    if p["min_s"] < floor:
        fail("an exchange took %.3f s, less than %.3f s: the 20 Mbit/s limit is not applied"
             % (p["min_s"], floor))
    app = p["links"]["app"]
    if app["rx_bytes"] < 2 * 4 * nbytes:  # 2 workers x (warm-up + 3) exchanges
        fail("the appliance link carried %d bytes in, less than the gradients pushed" %
             app["rx_bytes"])
    left = ours(res["lab"]["prefix"])
    if left:
        fail("namespaces left behind: %s" % left)
    if root_links() != links0:
        fail("root namespace links changed: %s -> %s" % (links0, root_links()))

    # 4: tbf on both sides while a lab is up; SIGTERM tears it down
    p, prefix = start_up(["--workers", "2", "--worker-rate", "20mbit", "--appliance-rate",
                          "40mbit", "--mtu", "9000"])
    try:
        for ns, dev, rate in ((prefix + "w1", netlab.IFNAME, "20Mbit"),
                              (prefix + "sw", "w1", "20Mbit"),
                              (prefix + "app", netlab.IFNAME, "40Mbit"),
                              (prefix + "sw", "app", "40Mbit")):
            q = netlab.sh("tc", "qdisc", "show", "dev", dev, ns=ns).stdout
            if "tbf" not in q or "rate " + rate not in q:
                fail("%s in %s: no tbf at %s: %s" % (dev, ns, rate, q))
            mtu = netlab.sh("ip", "-o", "link", "show", "dev", dev, ns=ns).stdout
            if "mtu 9000" not in mtu:
                fail("%s in %s: not MTU 9000: %s" % (dev, ns, mtu))
        # An 8000-byte datagram with DF set crosses worker link, bridge and appliance link.
        rx = subprocess.Popen(["ip", "netns", "exec", prefix + "app", sys.executable, "-c",
                               RECV], stdout=subprocess.PIPE, text=True)
        time.sleep(0.5)
        netlab.sh(sys.executable, "-c", SEND, ns=prefix + "w0")
        got = rx.communicate(timeout=15)[0].strip()
        if got != "8000":
            fail("an 8000-byte DF datagram did not cross the MTU-9000 lab: %r" % got)
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            fail("netlab up did not exit within 30 s of SIGTERM")
    if p.returncode != 128 + signal.SIGTERM:
        fail("netlab up exited with %d after SIGTERM" % p.returncode)
    if ours(prefix):
        fail("SIGTERM left namespaces behind: %s" % ours(prefix))

    # 5: SIGKILL leaves the namespaces (no handler runs); cleanup removes a dead run's only
    dead, dead_prefix = start_up(["--workers", "1", "--worker-rate", "none"])
    live, live_prefix = start_up(["--workers", "1", "--worker-rate", "none"])
    try:
        dead.kill()
        dead.wait()
        if len(ours(dead_prefix)) != 3:
            fail("a SIGKILLed lab should leave its 3 namespaces: %s" % ours(dead_prefix))
        r = subprocess.run(CLI + ["cleanup"], capture_output=True, text=True)
        if r.returncode != 0 or ours(dead_prefix):
            fail("cleanup: %s %s; left %s" % (r.stdout, r.stderr, ours(dead_prefix)))
        if len(ours(live_prefix)) != 3:
            fail("cleanup removed a live run's namespaces: %s" % r.stdout)
    finally:
        for q in (dead, live):
            if q.poll() is None:
                q.send_signal(signal.SIGTERM)
                q.wait(30)
        subprocess.run(CLI + ["cleanup", "--run", dead_prefix], capture_output=True)
    if ours(live_prefix):
        fail("SIGTERM left namespaces behind: %s" % ours(live_prefix))
    if root_links() != links0:
        fail("root namespace links changed: %s -> %s" % (links0, root_links()))

    # 6: cross traffic: a 20 Mbit/s UDP flow w1 -> w0 capped by a 10 Mbit/s link
    if shutil.which("iperf3") is None:
        print("cross traffic not checked: iperf3 is missing (apt-get install iperf3)")
    else:
        sc = netlab.Scenario.from_dict({"workers": 2, "worker_rate": "10mbit",
                                        "cross": ["w1>w0:20mbit"]})
        with netlab.Lab(sc) as lab:
            with netlab.Cross(lab, sc.cross) as cross:
                c0 = lab.link_counters()
                time.sleep(2)
                c1 = lab.link_counters()
                cross.check()
            prefix = lab.prefix
        rx = c1["w0"]["rx_bytes"] - c0["w0"]["rx_bytes"]
        if not 0.6 * 2 * 10e6 / 8 <= rx <= 1.3 * 2 * 10e6 / 8:
            fail("cross traffic: w0 received %d bytes in 2 s on a 10 Mbit/s link" % rx)
        if ours(prefix):
            fail("namespaces left behind: %s" % ours(prefix))
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
