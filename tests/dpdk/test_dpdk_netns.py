#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""pboxd on DPDK (net_af_xdp on a veth) in its own network namespace, workers on plain
kernel UDP in two other namespaces, all on one bridge.

  1. The same deterministic jobs (server-optimizer Adam, aggregate mean; keys of mixed
     sizes) run through the kernel-UDP transport and through DPDK: every rank's results
     must hash bit-identically across the two transports (and across ranks).
  2. ARP: the workers resolve the appliance's data address (which only DPDK owns) to the
     DPDK port's MAC; a raw ARP request gets a correct reply.
  3. Garbage frames from a worker namespace are counted under their reasons and ignored;
     the appliance keeps serving afterwards.
One data-plane lcore: the AF_XDP driver takes a single queue on a veth (veth has no
combined channels); several lcores and the hand-off between them are covered in-process
(test_dpdk_ring) where the ring port has one queue per core.
"""
import re
import sys
import time

import netns
from netns import BASE_PORT, DATA_IP, PYTHON, Topology, fail, sh

CORES = 1
KEYS = "20000,3000,7"
ITERS = 6
JOBS = [
    {"id": 1, "token": "opt", "workers": 4, "mode": "server-optimizer", "deterministic": True,
     "optimizer": {"name": "adam", "lr": 0.01}},
    {"id": 2, "token": "agg", "workers": 3, "mode": "aggregate", "reduce": "mean",
     "deterministic": True},
]


def hashes(topo, d):
    out = {}
    for job, token, n, extra in ((1, "opt", 4, ["--server-opt"]), (2, "agg", 3, [])):
        outs = topo.run_workers(d, job, token, n,
                                ["--hash", "--iters", str(ITERS), "--keys", KEYS] + extra)
        hs = set()
        for o in outs:
            m = re.search(r"hash ([0-9a-f]{16})", o)
            if not m:
                fail("job %d: no hash in worker output: %s" % (job, o))
            hs.add(m.group(1))
        if len(hs) != 1:
            fail("job %d (%s): ranks got different results: %s" % (job, d.transport, hs))
        out[job] = hs.pop()
    return out


def dp0_mac(topo):
    r = sh("ip", "-o", "link", "show", "dp0", ns=topo.app_ns)
    return re.search(r"link/ether ([0-9a-f:]{17})", r.stdout).group(1)


RAW = r'''
import socket, struct, sys, time
mac = bytes.fromhex(sys.argv[1].replace(":", ""))
me_ip = socket.inet_aton(sys.argv[2])
app_ip = socket.inet_aton(sys.argv[3])
base = int(sys.argv[4])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0806))
s.bind(("w0", 0))
me = s.getsockname()[4]

def csum(b):
    if len(b) % 2: b += b"\0"
    t = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while t >> 16: t = (t & 0xffff) + (t >> 16)
    return (~t) & 0xffff

def ipv4(dst, proto, payload, frag=0, bad=False):
    h = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 1, frag, 64, proto, 0, me_ip, dst)
    c = csum(h) ^ (0x1111 if bad else 0)
    return h[:10] + struct.pack("!H", c) + h[12:] + payload

def udp(sport, dport, payload):
    return struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload

def eth(t, payload):
    return mac + me + struct.pack("!H", t) + payload

if sys.argv[5] == "arp":
    req = (b"\xff" * 6 + me + b"\x08\x06" + struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1) + me + me_ip
           + b"\0" * 6 + app_ip)
    s.send(req)
    s.settimeout(3)
    end = time.time() + 3
    while time.time() < end:
        f = s.recv(2048)
        op = struct.unpack("!H", f[20:22])[0]
        if op == 2 and f[28:32] == app_ip:
            print("reply", f[22:28].hex(":"), f[6:12].hex(":"))
            break
    sys.exit(0)
frames = [
    eth(0x86dd, b"\0" * 60),                                               # ignored_l2
    eth(0x0800, ipv4(socket.inet_aton("10.231.0.99"), 17, udp(5000, base, b"x" * 64))),  # ignored_l3
    eth(0x0800, ipv4(app_ip, 17, udp(5000, 9, b"x" * 64))),                  # ignored_l3
    eth(0x0800, ipv4(app_ip, 17, udp(5000, base, b"x" * 64), bad=True)),      # bad_ip
    eth(0x0800, ipv4(app_ip, 17, udp(5000, base, b"x" * 64), frag=0x2000)),   # ip_fragments
    eth(0x0800, ipv4(app_ip, 17, udp(5000, base, b"NOTPBOX!" * 12))),        # bad_magic
    eth(0x0800, ipv4(app_ip, 17, udp(5000, base, b"PBOX" + b"\0" * 16))),    # truncated
]
for f in frames:
    s.send(f)
print("sent", len(frames))
'''


def raw(topo, what):
    return sh(PYTHON, "-c", RAW, dp0_mac(topo), topo.worker_ip[topo.worker_ns[0]], DATA_IP,
              str(BASE_PORT), what, ns=topo.worker_ns[0]).stdout


def main():
    why = netns.missing()
    if why:
        print("SKIP: " + why)
        sys.exit(77)
    with Topology(nworker_ns=2, data_queues=CORES) as topo:
        with topo.pboxd("udp", JOBS, cores=CORES) as d:
            ref = hashes(topo, d)
        print("kernel UDP: job 1 %s, job 2 %s" % (ref[1], ref[2]))
        with topo.pboxd("dpdk", JOBS, cores=CORES) as d:
            got = hashes(topo, d)
            print("DPDK:       job 1 %s, job 2 %s" % (got[1], got[2]))
            if got != ref:
                fail("DPDK results differ from kernel UDP: %s vs %s" % (got, ref))
            log = d.log()
            if "steering: " not in log:
                fail("pboxd did not say which steering method is in force")
            st = d.stats()
            tr, tot = st["transport"]["totals"], st["totals"]
            if tot["dropped"] != 0:
                fail("drops in a clean run: %s" % tot["drops"])
            if tr["rx_frames"] == 0 or tr["tx_frames"] == 0 or tr["arp_replies"] == 0:
                fail("DPDK counters show no traffic: %s" % tr)
            if any(c["iterations"] == 0 for c in st["cores"]):
                fail("a data-plane core did no work: %s" % st["cores"])

            # ARP: the kernel's neighbour entry and a raw request both give dp0's MAC.
            mac = dp0_mac(topo)
            neigh = sh("ip", "neigh", "show", DATA_IP, ns=topo.worker_ns[1]).stdout
            if mac not in neigh:
                fail("worker's neighbour entry for %s is not the DPDK port %s: %s" %
                     (DATA_IP, mac, neigh))
            out = raw(topo, "arp")
            if ("reply %s %s" % (mac, mac)) not in out:
                fail("raw ARP request for %s: expected a reply from %s, got %r" %
                     (DATA_IP, mac, out))
            print("ARP: %s is-at %s" % (DATA_IP, mac))

            # Garbage: counted and ignored.
            before = d.stats()
            out = raw(topo, "garbage")
            if "sent 7" not in out:
                fail("could not send the garbage frames: %s" % out)
            after = None
            for _ in range(50):
                after = d.stats()
                if (after["totals"]["drops"]["truncated"] > before["totals"]["drops"]["truncated"]
                        and after["transport"]["totals"]["ip_fragments"] >
                        before["transport"]["totals"]["ip_fragments"]):
                    break
                time.sleep(0.1)

            def delta(sect, key):
                a = after["transport"]["totals"] if sect == "t" else after["totals"]["drops"]
                b = before["transport"]["totals"] if sect == "t" else before["totals"]["drops"]
                return a[key] - b[key]

            want = [("t", "ignored_l2", 1, False), ("t", "ignored_l3", 2, False),
                    ("t", "bad_ip", 1, True), ("t", "ip_fragments", 1, True),
                    ("d", "bad_magic", 1, True), ("d", "truncated", 1, True)]
            for sect, key, n, exact in want:
                got_n = delta(sect, key)
                if got_n < n or (exact and got_n != n):
                    fail("garbage: %s rose by %d, expected %s%d" %
                         (key, got_n, "" if exact else ">= ", n))
            print("garbage: counted and ignored (%s)" %
                  ", ".join("%s +%d" % (k, delta(s, k)) for s, k, _, _ in want))
            # Still serving.
            again = hashes(topo, d)
            if again != ref:
                fail("results after the garbage differ: %s vs %s" % (again, ref))
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
