#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Hostile clients while two jobs train (issue 9, defect 1: idle TCP connections abort
every job). An aggregate job and a server-optimizer job (both deterministic) train with
two ranks each, while on the same appliance an attacker:

  * opens 1,100 connections that never say anything (the old control loop's poll set
    held 1,024 entries with new connections in front: the workers were never read again
    and were declared dead after worker_timeout);
  * as the ranks of a third job, pipelines requests and never reads the answers (slow
    readers; a member may ask for its own job's stats);
  * sends lines of 16 MB without a newline (huge lines);
  * sends garbage that is not JSON;
  * tries wrong tokens and unknown jobs;
  * floods the data ports with 1,000,000 garbage datagrams (pbox-udp-flood, sendmmsg);
  * forges appliance replies to the training workers (issue 9, defect 6: workers accepted
    DATA from any source): well-formed DATA and ACK datagrams shaped like the ones seen on
    the wire to each worker's data port (job, cookie, chunk, geometry, iteration guesses;
    watched during the attack as an attacker on the path would, when the test may
    capture: as root), random payload, from other addresses and ports. Every worker must
    count them as foreign (and its results stay exact);
  * steals a cookie for reflection (defect 6: a datagram with a valid cookie re-targeted
    where that rank's replies went, and a 64-byte PULL returns a whole chunk): the test
    joins a fourth job as its rank over the control protocol, pins its data address with
    a push, then sends PULLs and pushes under that cookie from another address. Nothing
    may come back there, they must be counted as bad_source, and the pushes must not
    count; a PULL from the pinned address is answered (its amplification is printed).

Both jobs must finish: every result each worker gets is compared bit for bit
(pbox-check-worker's memcmp) with the result computed locally for an undisturbed run, so
a pass means both models are bit-identical to an undisturbed run. No worker may be
declared dead, the operator's stats must keep being answered, and every kind of attack
must show up in the control channel's refusal counters."""
import json
import os
import random
import re
import resource
import socket
import struct
import subprocess
import threading
import time

import spoof
from pboxtest import Pboxd, build_path, control_request, fail

ITERS = 8000             # about 20 s undisturbed on a loaded 2-core machine (the test
                         # checks the attack overlapped the training)
IDLE = 1100
SLOW_READERS = 8
HUGE_LINES = 4
HUGE_BYTES = 16 << 20
GARBAGE_CONNS = 40
TOKEN_TRIES = 60
DATAGRAMS = 1000000
ATTACK_S = 12.0
OVERLAP_S = 5            # > worker_timeout (3 s) + a heartbeat interval


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < IDLE + 200:
        fail("this test needs %d open files (hard limit %d)" % (IDLE + 200, hard))
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# Each kind of attack comes from its own loopback address, as from its own host: the
# per-address limits then act on the attacker, not on the workers (127.0.0.1).
IDLE_FROM = "127.0.0.2"
SLOW_FROM = "127.0.0.3"
TOKENS_FROM = "127.0.0.4"
HUGE_FROM = "127.0.0.5"
GARBAGE_FROM = "127.0.0.6"
TENANT_CTL_FROM = "127.0.0.7"  # the reflection test's rank: its control connection,
PINNED_FROM = "127.0.0.8"      # its data-plane address (pinned by its first datagram),
THIEF_FROM = "127.0.0.9"       # and the address that uses its cookie

TENANT_JOB = 4
TENANT_KEY = (1, 8192)  # 32 KiB of float32: one chunk (the default chunk_bytes)
THIEF_TRIES = 40


def nb_connect(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((IDLE_FROM, 0))
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", port))
    return s


def connect_from(src, port, rcvbuf=None):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.bind((src, 0))
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    return s


def request_from(src, port, obj):
    with connect_from(src, port) as s:
        s.sendall((json.dumps(obj) + "\n").encode())
        buf = b""
        while b"\n" not in buf:
            d = s.recv(65536)
            if not d:
                raise ConnectionResetError("closed without an answer")
            buf += d
    return json.loads(buf.split(b"\n", 1)[0])


class Attack:
    def __init__(self, d):
        self.d = d
        self.stop = threading.Event()
        self.errors = []
        self.replies = {"unknown_job": [], "wrong_token": [], "rate_limited": 0}
        self.stats_latency = []
        self.held = []
        self.idle_open = None
        self.forger = None
        self.reflect = None

    def guard(self, fn):
        def run():
            try:
                fn()
            except Exception as e:  # an attack thread's own failure is a test failure
                self.errors.append("%s: %r" % (fn.__name__, e))
        return threading.Thread(target=run, name=fn.__name__)

    def idle(self):
        # 1,100 connections that never speak, kept open for the whole attack; the
        # appliance closes the oldest ones, so some are opened again meanwhile.
        for _ in range(IDLE):
            self.held.append(nb_connect(self.d.tcp))
        self.idle_open = time.time()
        while not self.stop.wait(1.0):
            for _ in range(100):
                old = self.held.pop(0)
                old.close()
                self.held.append(nb_connect(self.d.tcp))

    def slow_readers(self):
        # A malicious tenant: the ranks of job 3 (its token is theirs) pipeline requests
        # for their job's stats and never read the answers.
        conns = []
        for r in range(SLOW_READERS):
            # A small receive window: the answers pile up at the appliance, not here.
            s = connect_from(SLOW_FROM, self.d.tcp, rcvbuf=4096)
            s.sendall(b'{"op":"hello","job":3,"rank":%d,"token":"c","version":1}\n' % r)
            reply = s.recv(4096)
            if b'"ok":true' not in reply:
                self.errors.append("slow reader %d not admitted: %r" % (r, reply))
            s.setblocking(False)
            conns.append(s)
        req = b'{"op":"stats"}\n' * 4000
        while conns and not self.stop.wait(0.05):
            for s in list(conns):
                try:
                    while s.send(req) > 0:
                        pass
                except BlockingIOError:
                    pass
                except OSError:
                    conns.remove(s)  # closed by the appliance: expected
                    s.close()
        for s in conns:
            s.close()

    def huge_lines(self):
        block = b"x" * 65536
        for _ in range(HUGE_LINES):
            s = connect_from(HUGE_FROM, self.d.tcp)
            sent = 0
            try:
                while sent < HUGE_BYTES and not self.stop.is_set():
                    s.sendall(block)
                    sent += len(block)
            except OSError:
                pass  # closed by the appliance: expected
            s.close()

    def garbage(self):
        rng = random.Random(99)
        for _ in range(GARBAGE_CONNS):
            s = connect_from(GARBAGE_FROM, self.d.tcp)
            try:
                for _ in range(20):
                    line = bytes(rng.randrange(1, 256) for _ in range(rng.randrange(1, 200)))
                    s.sendall(line.replace(b"\n", b" ") + b"\n")
                # Read the answers until pboxd closes: closing with them unread would
                # reset the connection, and a reset discards lines pboxd has not read yet
                # (then nothing is counted as malformed on a loaded machine).
                s.shutdown(socket.SHUT_WR)
                while s.recv(65536):
                    pass
            except OSError:
                pass
            s.close()
            if self.stop.is_set():
                return

    def tokens(self):
        for i in range(TOKEN_TRIES):
            job = 99 if i % 2 else 1
            try:
                r = request_from(TOKENS_FROM, self.d.tcp,
                                 {"op": "hello", "job": job, "rank": 0,
                                  "token": "guess%d" % i, "version": 1})
            except OSError as e:
                self.errors.append("hello attempt %d: %s" % (i, e))
                continue
            if r.get("errno") == 11:  # EAGAIN: rate-limited
                self.replies["rate_limited"] += 1
            elif job == 99:
                self.replies["unknown_job"].append(r.get("error", ""))
            else:
                self.replies["wrong_token"].append(r.get("error", ""))
            time.sleep(0.05)

    def forge(self):
        self.forger.run(self.stop)

    def reflection(self):
        t = spoof.Tenant(self.d.control, TENANT_JOB, 0, "d", [TENANT_KEY], TENANT_CTL_FROM,
                         PINNED_FROM)
        try:
            self.reflect = steal_cookie(self.d, t)
        finally:
            t.close()

    def probe(self):
        # The operator's view (admin token, from the workers' address) must stay
        # available during the attack.
        while not self.stop.wait(0.5):
            t = time.time()
            r = control_request(self.d.control, {"op": "stats",
                                                 "admin_token": self.d.admin_token},
                                timeout=20)
            if r.get("ok") is not True:
                self.errors.append("stats refused to the operator: %s" % r)
            self.stats_latency.append(time.time() - t)


def pushed(t, it, values):
    """Push chunk 0 of iteration it from the tenant's pinned address until the appliance
    acknowledges it (datagrams may be lost while the flood runs)."""
    payload = struct.pack("<%df" % len(values), *values)
    for attempt in range(100):
        for dg in t.push_dgrams(it, payload, flags=spoof.F_RETRANSMIT if attempt else 0):
            t.data.sendto(dg, t.endpoint())
        got = spoof.recv_all(t.data, 0.3, until=lambda g: any(
            (h := spoof.parse_hdr(b)) and h["type"] == spoof.ACK and h["iter"] == it
            for b, _ in g))
        for b, src in got:
            h = spoof.parse_hdr(b)
            if h and h["type"] == spoof.ACK and h["iter"] == it:
                if src != t.endpoint():
                    raise AssertionError("ACK from %s, not the appliance" % (src,))
                return
    raise AssertionError("the push of iteration %d from the pinned address was never "
                         "acknowledged" % it)


def pulled(t, it):
    """PULL chunk 0 of iteration it from the tenant's pinned address until one PULL gets
    every fragment; returns (the chunk's bytes, UDP bytes answered to that one PULL)."""
    nfrags = len(t.frags())
    for _ in range(100):
        t.data.sendto(t.pull_dgram(it), t.endpoint())
        frags = {}
        for b, src in spoof.recv_all(t.data, 1.0, until=lambda g: len(g) >= nfrags):
            h = spoof.parse_hdr(b)
            if h and h["type"] == spoof.DATA and h["iter"] == it and src == t.endpoint():
                frags[h["frag_off"]] = b
        if len(frags) == nfrags:
            chunk = b"".join(frags[off][spoof.HDR_LEN:] for off, _ in t.frags())
            return chunk, sum(len(b) for b in frags.values())
    raise AssertionError("a PULL of iteration %d from the pinned address was never answered "
                         "in full" % it)


def bad_source(d):
    return d.stats()["totals"]["drops"]["bad_source"]


def steal_cookie(d, t):
    """Reflection with a stolen cookie (t: a rank of job TENANT_JOB, one worker, sum)."""
    n = t.chunk_len() // 4
    v0 = [float(i % 251) for i in range(n)]
    v1 = [float(3 * i % 509) for i in range(n)]
    pushed(t, 0, v0)  # the first datagram under the cookie pins PINNED_FROM
    chunk, answered = pulled(t, 0)
    if chunk != struct.pack("<%df" % n, *v0):
        raise AssertionError("iteration 0 is not the tenant's push")
    before = bad_source(d)
    thief = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    thief.bind((THIEF_FROM, 0))
    junk = struct.pack("<f", 1e6) * n
    sent = 0
    try:
        for i in range(THIEF_TRIES):
            # Under the stolen cookie: the result of iteration 0 (reflected at THIEF_FROM
            # on the old appliance), and a push for iteration 1 asking for the result.
            for dg in [t.pull_dgram(0)] + t.push_dgrams(1, junk, flags=spoof.F_WANT_REPLY):
                thief.sendto(dg, t.endpoint())
                sent += len(dg)
            time.sleep(0.02)
        back = spoof.recv_all(thief, 2.0)
    finally:
        thief.close()
    if back:
        raise AssertionError("%d datagrams (%d bytes) answered to %s, which used a stolen "
                             "cookie" % (len(back), sum(len(b) for b, _ in back), THIEF_FROM))
    deadline = time.time() + 10
    while bad_source(d) == before and time.time() < deadline:
        time.sleep(0.1)
    after = bad_source(d)
    if after == before:
        raise AssertionError("%d datagrams from %s under a stolen cookie, bad_source "
                             "still %d" % (THIEF_TRIES * (1 + len(t.frags())), THIEF_FROM,
                                           before))
    # The thief's pushes for iteration 1 did not count: it is the tenant's own.
    pushed(t, 1, v1)
    chunk, _ = pulled(t, 1)
    if chunk != struct.pack("<%df" % n, *v1):
        raise AssertionError("iteration 1 is not the tenant's push: a push under the "
                             "stolen cookie counted")
    return {"pull_bytes": spoof.HDR_LEN, "answered": answered, "thief_sent": sent,
            "thief_answered": 0, "bad_source": after - before}


def worker_ports(procs):
    """{(ip, port): job} of the training workers' data-plane sockets."""
    out = {}
    for (what, p) in procs:
        job = int(what.split()[1])
        ports = spoof.udp_ports(p.pid)
        deadline = time.monotonic() + 10
        while not ports and time.monotonic() < deadline:
            time.sleep(0.1)  # a loaded (sanitizer) run may list it a little later
            ports = spoof.udp_ports(p.pid)
        if not ports:
            fail("%s (pid %d) holds no UDP socket" % (what, p.pid))
        for ip, port in ports:
            out[("127.0.0.1" if ip == "0.0.0.0" else ip, port)] = job
    return out


def start_workers(d):
    W = build_path("tests/integration/pbox-check-worker")
    procs = []
    for job, token, extra in ((1, "a", ["--sum"]),
                              (2, "b", ["--server-opt", "--lr", "0.5"])):
        for r in range(2):
            procs.append(("job %d rank %d" % (job, r), subprocess.Popen(
                [W, "--server", d.control, "--job", str(job), "--token", token, "--rank",
                 str(r), "--workers", "2", "--keys", "20000,77", "--iters", str(ITERS),
                 "--timeout-ms", "30000"] + extra,
                # the data socket must be the workers' only UDP socket (worker_ports)
                env=dict(os.environ, PBOX_PROBE="off"),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    return procs


def wait_training(d):
    deadline = time.time() + 30
    while time.time() < deadline:
        jobs = d.stats()["jobs"][:2]
        if all(j["state"] == "active" and j["registered"] == 2 for j in jobs):
            return
        time.sleep(0.05)
    fail("the two jobs did not start training: %s" % d.stats()["jobs"])


def main():
    raise_nofile()
    jobs = [{"id": 1, "token": "a", "workers": 2, "mode": "aggregate", "reduce": "sum",
             "deterministic": True},
            {"id": 2, "token": "b", "workers": 2, "mode": "server-optimizer",
             "deterministic": True, "optimizer": {"name": "sgd", "lr": 0.5}},
            {"id": 3, "token": "c", "workers": SLOW_READERS, "mode": "aggregate"},
            {"id": TENANT_JOB, "token": "d", "workers": 1, "mode": "aggregate",
             "reduce": "sum"}]
    # worker_timeout 3 s: a starved member is declared dead quickly (the old code did so
    # within a few seconds of the idle connections).
    with Pboxd(jobs, cores=2, worker_timeout=3,
               control_limits={"max_output_bytes": 65536}) as d:
        procs = start_workers(d)
        wait_training(d)
        # The forger's targets: each worker's data port, and what goes to it on the wire.
        targets = worker_ports(procs)
        sniffer = spoof.Sniffer({p for _, p in targets})
        if not sniffer.start():
            sniffer = None
            print("no CAP_NET_RAW: the forged replies carry guessed cookies (as root, "
                  "they carry the ones seen on the wire)")
        elif not sniffer.wait_all(10):
            fail("no appliance datagram seen to some worker ports: %s" % sniffer.latest)
        t0 = time.time()
        a = Attack(d)
        a.forger = spoof.Forger(sorted(targets), sniffer,
                                {p: j for (_, p), j in targets.items()})
        threads = [a.guard(f) for f in (a.idle, a.slow_readers, a.huge_lines, a.garbage,
                                         a.tokens, a.probe, a.forge, a.reflection)]
        for t in threads:
            t.start()
        flood = subprocess.Popen([build_path("tests/integration/pbox-udp-flood"), "127.0.0.1",
                                  str(d.base), "2", str(DATAGRAMS), "1", "7"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        # The attack lasts ATTACK_S (and until the flood is sent), or until the workers
        # are done; when each worker finished is noted.
        finished = {}
        while True:
            now = time.time()
            for what, p in procs:
                if what not in finished and p.poll() is not None:
                    finished[what] = now
            if flood.poll() is not None and (now - t0 >= ATTACK_S or
                                             len(finished) == len(procs)):
                break
            if now - t0 > 180:
                flood.kill()
                fail("pbox-udp-flood did not finish within 180 s")
            time.sleep(0.1)
        print(flood.communicate()[0].strip())
        if flood.returncode != 0:
            fail("pbox-udp-flood failed")
        a.stop.set()
        for t in threads:
            t.join(60)
        attack_s = time.time() - t0
        for s in a.held:
            s.close()
        a.forger.close()
        if sniffer is not None:
            sniffer.stop()
            print("datagrams to the workers seen on the wire by the attacker: %d"
                  % sniffer.seen)
        if a.errors:
            fail("attack threads: %s" % a.errors)
        r = a.reflect
        print("forged replies sent to the workers: %d" % a.forger.sent)
        print("amplification: a %d-byte PULL from the pinned address was answered with %d "
              "bytes (x%.0f); from %s under the stolen cookie %d bytes sent, %d answered "
              "(x0), %d counted as bad_source"
              % (r["pull_bytes"], r["answered"], r["answered"] / r["pull_bytes"], THIEF_FROM,
                 r["thief_sent"], r["thief_answered"], r["bad_source"]))
        results = []
        outputs = {}
        for what, p in procs:
            try:
                out, _ = p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                fail("%s did not finish" % what)
            print("[%s] %s" % (what, out.strip()))
            results.append((what, p.returncode))
            outputs[what] = out
        st = d.stats()
        ctl = st["control"]
        print("attack lasted %.1f s; control counters: %s" % (attack_s, ctl))
        print("operator stats answered %d times during the attack, slowest %.3f s"
              % (len(a.stats_latency), max(a.stats_latency or [0])))
        print("data-plane drops: %s" % {k: v for k, v in st["totals"]["drops"].items() if v})
        bad = [w for w, rc in results if rc != 0]
        if bad:
            d.dump_log()
            fail("jobs disturbed by hostile clients: %s failed" % bad)
        # The attack must overlap the training, or the test proves nothing: every worker
        # trained for OVERLAP_S with all the idle connections open. (Checked once the
        # workers succeeded: one that failed early has said why.)
        if a.idle_open is None:
            fail("the idle connections were never all open")
        early = [w for w, t in finished.items() if t < a.idle_open + OVERLAP_S]
        if early:
            fail("%s finished less than %d s after the idle connections were open (raise "
                 "ITERS)" % (early, OVERLAP_S))
        for what, out in outputs.items():
            m = re.search(r"(\d+) foreign", out)
            if m is None or int(m.group(1)) == 0:
                fail("%s counted no forged reply as foreign: %s" % (what, out.strip()))
        log = d.log()
        for word in ("declared dead", "session aborted"):
            if word in log:
                fail("pboxd log says '%s' during the attack" % word)
        if not a.stats_latency:
            fail("the operator's stats were never answered during the attack")
        for msg in a.replies["unknown_job"]:
            if msg != "job 99 is not configured on this appliance":
                fail("unknown-job refusal says more than it should: %r" % msg)
        if a.replies["rate_limited"] == 0:
            fail("%d wrong tokens from one address were never rate-limited" % TOKEN_TRIES)
        want = {"lines_too_long": HUGE_LINES, "malformed_closed": 1, "wrong_token": 1,
                "unknown_job": 1, "auth_rate_limited": 1, "slow_readers_closed": 1}
        short = {k: (ctl[k], n) for k, n in want.items() if ctl[k] < n}
        if short:
            fail("refusals not counted (counted, expected at least): %s" % short)
        if ctl["evicted_unauth"] + ctl["unauth_timeouts"] < IDLE - 300:
            fail("%d idle connections, but only %d closed by the appliance"
                 % (IDLE, ctl["evicted_unauth"] + ctl["unauth_timeouts"]))
        dropped = sum(st["totals"]["drops"].values())
        if dropped < DATAGRAMS // 100:
            fail("only %d of %d garbage datagrams reached pboxd's drop counters"
                 % (dropped, DATAGRAMS))


if __name__ == "__main__":
    main()
