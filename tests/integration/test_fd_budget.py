#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""pboxd's file-descriptor budget (dataplane/pboxd/fdbudget.h): control connections, shared-
memory connections (2 each) and results' memfds (1 per session and core) take from one
account under the open-file limit, with 128 descriptors reserved for pboxd's own. Before,
control connections were capped at limit - 128 while shm connections and results' memfds
were not counted at all: under a low limit they took the descriptors the cap promised
(accept() then failed with EMFILE) or the other way round.

With pboxd's limit lowered (prlimit) to the reserve + /metrics' share + 7:
1. A job of two workers (libpbox, transport chosen by itself) trains to exact results
   (pbox-check-worker checks every element): both control connections fit, one worker's
   shm connection fits (5 descriptors until its welcome is sent on 2 cores, then 2), the
   other's does not (told EMFILE: it takes kernel UDP), the
   session's results' memfds are refused (they leave 64 descriptors for connections: its
   results go to the shm worker as copies). Refusals are counted per class and logged with
   the object (the worker's pid; the job and core) and the cause (the budget's numbers).
2. 30 control connections at once: the 7 the budget holds are accepted, the others are
   refused by the budget (counted, logged with the peer and the budget), and accept() never
   failed for want of descriptors: the budget refused before the kernel did.
3. With the limit restored, everything taken was given back, and a new session takes its
   results' memfds (held 2 on 2 cores) and its worker's shm connection 2 once welcomed,
   given back when they end.
4. metrics.max_connections whose descriptors do not fit: pboxd does not start, and says
   why."""
import os
import resource
import socket
import subprocess
import time

import spoof
from pboxtest import Pboxd, build_path, fail, free_ports, wait_for

RESERVE = 128
FREE = 7


METRICS_CONNS = 4


class MetricsPboxd(Pboxd):
    """A pboxd with its /metrics endpoint on a free port."""
    conns = METRICS_CONNS

    def choose_ports(self):
        super().choose_ports()
        self.mport = free_ports(1)[0]
        with open(self.conf, "a") as f:
            f.write('metrics = { listen = "127.0.0.1:%d"; max_connections = %d; };\n' %
                    (self.mport, self.conns))


def part_metrics_too_big():
    """metrics.max_connections whose descriptors do not fit the budget: pboxd does not start,
    and says why."""
    class Big(MetricsPboxd):
        conns = 100

    d = Big([{"id": 1, "token": "a", "workers": 1, "mode": "aggregate"}], cores=1)
    try:
        p = subprocess.run(d.args, capture_output=True, text=True, timeout=60,
                           preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE,
                                                                 (256, 256)))
    finally:
        import shutil
        shutil.rmtree(d.dir, ignore_errors=True)
    out = p.stdout + p.stderr
    if p.returncode == 0 or "metrics.max_connections 100 needs 200 descriptors" not in out:
        fail("pboxd with /metrics over its descriptor budget: exit %d:\n%s" %
             (p.returncode, out[-2000:]))
    print("metrics too big: pboxd refused to start (exit %d): %s" % (
        p.returncode, [x for x in out.splitlines() if "max_connections 100" in x][0][-160:]))


def fds(d):
    return d.stats()["control"]["fds"]


def held(f):
    """What the budget holds, less the /metrics endpoint's share (taken at start)."""
    return {k: v for k, v in f["held"].items() if k != "metrics"}


def settled(d, control=1):
    """The budget holds only the stats request's own connection (and `control` - 1 more)."""
    return held(fds(d)) == {"control": control, "shm": 0, "results": 0}


def nopen(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def quiet(d):
    """The budget holds no client's connection, and pboxd's descriptors stopped changing
    (the stats request's own connection is closed)."""
    pid = d.proc.pid
    wait_for(lambda: settled(d), "the budget to hold only the stats connection")
    same, prev = 0, None
    for _ in range(200):
        cur = sorted(os.listdir("/proc/%d/fd" % pid))
        same = same + 1 if cur == prev else 0
        if same >= 5:
            return
        prev = cur
        time.sleep(0.1)
    fail("pboxd's descriptors keep changing")


def lower(d):
    """pboxd's open-file limit to the budget's reserve + /metrics' share + FREE; returns
    the old limits."""
    pid = d.proc.pid
    old = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    if nopen(pid) + 16 > RESERVE:
        fail("pboxd has %d descriptors open: its reserve of %d would not hold them" %
             (nopen(pid), RESERVE))
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit(d), old[1]))
    return old


def limit(d):
    return RESERVE + d.metrics_fds + FREE


def part_job(d):
    pid = d.proc.pid
    quiet(d)
    env = dict(os.environ, PBOX_TRANSPORT="auto")
    old = lower(d)
    try:
        ps = [subprocess.Popen([build_path("tests/integration/pbox-check-worker"),
                                "--server", d.control, "--job", "1", "--token", "a",
                                "--rank", str(r), "--workers", "2", "--keys",
                                "1000,50000,8193", "--iters", "40"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=env)
              for r in range(2)]
        outs = [p.communicate(timeout=120)[0] for p in ps]
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, old)
    for r, (p, out) in enumerate(zip(ps, outs)):
        if p.returncode != 0 or "OK 40 iterations" not in out:
            fail("rank %d under descriptor pressure (exit %d):\n%s" % (r, p.returncode, out))
    wait_for(lambda: settled(d), "the job's descriptors to be given back")
    st = d.stats()
    f, shm = st["control"]["fds"], st["transport"]["shm"]
    print("job under pressure: both ranks exact; fds %s; shm accepted %d refused %d" %
          (f, shm["accepted"], shm["refused"]))
    if f["refused"]["shm"] != 1 or shm["refused"] != 1 or shm["accepted"] != 1:
        fail("expected one shm connection taken and one refused by the budget: %s, shm %s"
             % (f, shm))
    if f["refused"]["results"] < 1 or f["refused"]["control"] != 0:
        fail("expected the results' memfds refused, no control connection: %s" % f)
    log = d.log()
    for want in ("job 1 core 0: no results' arena: out of file descriptors in pboxd's "
                 "budget (open-file limit %d" % limit(d),
                 "go to shared-memory workers as copies",
                 "refused: no descriptor left in pboxd's budget (open-file limit"):
        if want not in log:
            fail("pboxd's log lacks %r:\n%s" % (want, log[-3000:]))
    if "shm: connection of pid %d refused" % ps[0].pid not in log and \
            "shm: connection of pid %d refused" % ps[1].pid not in log:
        fail("the shm refusal does not name the worker's pid:\n" + log[-3000:])


def part_flood(d):
    from test_metrics import scrape

    def control_fds():
        # /metrics' descriptors are its own (taken at start): it answers while the
        # control connections hold the rest of the budget
        fams = scrape(d.mport, wait=5)
        held_ = {lab["class"]: int(v) for lab, v in fams["pboxd_fds_held"]["samples"]}
        refused_ = {lab["class"]: int(v)
                    for lab, v in fams["pboxd_fds_refused_total"]["samples"]}
        return held_.get("control", 0), refused_.get("control", 0)

    pid = d.proc.pid
    quiet(d)
    # the first scrape leaves the /metrics server two descriptors it keeps (its share of
    # the budget, taken at start): count from after it
    refused0 = control_fds()[1]
    n0 = nopen(pid)
    before = d.stats()["control"]
    wait_for(lambda: nopen(pid) <= n0, "the stats connection closed")
    old = lower(d)
    conns = []
    try:
        for i in range(30):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.3.%d" % (1 + i), 0))
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", d.tcp))
            conns.append(s)
        # every connection accepted or refused before any closes (a closed one would
        # give its descriptor back to one still queued)
        wait_for(lambda: control_fds()[0] >= FREE and
                 control_fds()[1] - refused0 >= 30 - FREE,
                 "pboxd to accept %d and refuse %d of the flood's connections" %
                 (FREE, 30 - FREE))
        for s in conns:
            s.close()
        wait_for(lambda: nopen(pid) <= n0, "pboxd to close the flood's connections")
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, old)
    after = d.stats()["control"]
    if held(after["fds"]) != {"control": 1, "shm": 0, "results": 0}:
        fail("flood: descriptors not given back: %s" % after["fds"])
    refused = after["refused_fd_budget"] - before["refused_fd_budget"]
    accepted = after["accepted"] - before["accepted"] - 1  # this stats request
    print("flood: %d accepted, %d refused by the budget, accept() out of descriptors %d" %
          (accepted, refused, after["accept_no_fds"]))
    if accepted != FREE or refused != 30 - FREE:
        fail("flood: %d accepted and %d refused of 30 at a budget of %d" %
             (accepted, refused, FREE))
    if after["accept_no_fds"] != 0 or after["fds"]["refused"]["control"] < refused:
        fail("flood: the kernel ran out of descriptors before the budget: %s" % after)
    if "127.0.3." not in d.log():
        fail("flood: the refusals do not name the peer")


def part_recovered(d):
    """A session with descriptors to spare takes its memfds; its worker's shm connection
    holds 2 once welcomed; everything is given back when they end."""
    from test_shm import ShmConn
    keys = [(0, 300000)]
    ten = spoof.Tenant(d.control, 2, 0, "b", keys, "127.0.0.1", "127.0.0.1")
    c = ShmConn(d.stats()["transport"]["shm"]["socket"], 2, 0, ten.cookie)
    f = fds(d)
    status, nres = c.status, c.nres
    c.close()
    ten.close()
    print("recovered: a new session and its shm connection hold %s" % f["held"])
    if status != 0 or nres != 2 or held(f) != {"control": 2, "shm": 2, "results": 2}:
        fail("a session on 2 cores with descriptors to spare (shm status %d, %d arenas): %s"
             % (status, nres, f))
    wait_for(lambda: settled(d), "the session's descriptors to be given back")


def part_shown(d):
    """The budget in `pbox stats` and /metrics."""
    from test_metrics import scrape
    out = subprocess.run([build_path("apps/pbox"), "stats", "--control", d.control],
                         env=dict(os.environ, PBOX_ADMIN_TOKEN=d.admin_token),
                         capture_output=True, text=True, timeout=30, check=True).stdout
    line = [x for x in out.splitlines() if x.startswith("descriptors: limit")]
    if not line or "metrics=%d" % d.metrics_fds not in line[0] or "shm=1" not in line[0]:
        fail("pbox stats does not show the descriptor budget:\n" + out)
    fams = scrape(d.mport)
    held = {lab["class"]: int(v) for lab, v in fams["pboxd_fds_held"]["samples"]}
    refused = {lab["class"]: int(v) for lab, v in fams["pboxd_fds_refused_total"]["samples"]}
    if held.get("metrics") != d.metrics_fds or refused.get("shm") != 1 or \
            refused.get("control", 0) < 30 - FREE or "pboxd_fds_free" not in fams:
        fail("/metrics: held %s, refused %s" % (held, refused))
    print("shown: %s; /metrics held %s refused %s" % (line[0], held, refused))


def main():
    jobs = [{"id": 1, "token": "a", "workers": 2, "mode": "aggregate"},
            {"id": 2, "token": "b", "workers": 1, "mode": "aggregate"}]
    with MetricsPboxd(jobs, cores=2, control_limits={"unauth_timeout": 30}) as d:
        if "descriptor budget: open-file limit" not in d.log():
            fail("pboxd does not log its descriptor budget at start")
        # /metrics takes 2 per connection of metrics.max_connections, at start
        d.metrics_fds = fds(d)["held"]["metrics"]
        if d.metrics_fds != 2 * METRICS_CONNS:
            fail("the /metrics endpoint holds %d descriptors of the budget, not 2 x %d" %
                 (d.metrics_fds, METRICS_CONNS))
        part_job(d)
        part_flood(d)
        part_recovered(d)
        part_shown(d)
    part_metrics_too_big()
    print("fd budget: OK")


if __name__ == "__main__":
    main()
