#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""pboxd's Prometheus endpoint (common/metrics.h, dataplane/pboxd/metrics.h):
 - GET /metrics parses with a strict parser of the text exposition format 0.0.4 (HELP and
   TYPE once per family, before its samples, families not interleaved, names and label
   escapes valid, counters named *_total);
 - after a job trained, every per-core counter and drop reason equals `pbox stats --json`
   (the cycle and poll clocks, which move while a core waits, are not lower), and the job's
   gauges equal the stats' job entry;
 - hostile clients: other methods get 405 with Allow, other paths 404, a huge request
   header is refused, connections past max_connections are refused and do not stop a
   later scrape, a slowloris connection (a byte every 0.3 s, never idle) is cut after the
   timeout; the control channel answers throughout; libmicrohttpd's messages about
   refused requests are rate-limited in the log;
 - structured logs: pboxd runs with log_format = "json" and every log line is a JSON
   object with ts, level, daemon, object and msg."""
import json
import re
import socket
import subprocess
import time

from pboxtest import Pboxd, build_path, control_request, fail, free_ports
from test_runtime_jobs import finish, worker
import test_runtime_jobs

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*$")
TIMEOUT_S = 3
MAX_CONN = 4


def parse_labels(s, line):
    """{a="x",b="y\\"z"} body (without braces) -> dict; strict about escapes."""
    out, i = {}, 0
    while i < len(s):
        m = re.match(r"([a-zA-Z_][a-zA-Z0-9_]*)=\"", s[i:])
        if not m:
            fail("bad label at %r in %r" % (s[i:], line))
        name = m.group(1)
        i += m.end()
        val = ""
        while True:
            if i >= len(s):
                fail("unterminated label value in %r" % line)
            c = s[i]
            if c == "\\":
                nxt = s[i + 1:i + 2]
                if nxt not in ("\\", "\"", "n"):
                    fail("bad escape \\%s in %r" % (nxt, line))
                val += {"\\": "\\", "\"": "\"", "n": "\n"}[nxt]
                i += 2
            elif c == "\"":
                i += 1
                break
            elif c == "\n":
                fail("raw newline in a label value: %r" % line)
            else:
                val += c
                i += 1
        if name in out:
            fail("label %s twice in %r" % (name, line))
        out[name] = val
        if i < len(s):
            if s[i] != ",":
                fail("expected ',' at %r in %r" % (s[i:], line))
            i += 1
    return out


def parse_prom(text):
    """Strict text-format parser: {family: {"type", "help", "samples": [(labels, v)]}}."""
    fams, order, cur = {}, [], None
    if not text.endswith("\n"):
        fail("the exposition does not end with a newline")
    for line in text.split("\n")[:-1]:
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            kind, rest = line[2:6], line[7:]
            name, _, arg = rest.partition(" ")
            if not NAME.match(name):
                fail("bad metric name in %r" % line)
            f = fams.setdefault(name, {"type": None, "help": None, "samples": []})
            if name != cur:
                if name in order:
                    fail("family %s interleaved with others" % name)
                order.append(name)
                cur = name
            key = "help" if kind == "HELP" else "type"
            if f[key] is not None:
                fail("%s given twice for %s" % (kind, name))
            if f["samples"]:
                fail("%s of %s after its samples" % (kind, name))
            if key == "type" and arg not in ("counter", "gauge", "untyped", "summary",
                                             "histogram"):
                fail("bad type %r" % line)
            if key == "help" and re.search(r"\\[^\\n]", arg.replace("\\\\", "")):
                fail("bad escape in HELP %r" % line)
            f[key] = arg
            continue
        if line.startswith("#") or line == "":
            fail("unexpected line %r" % line)
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$", line)
        if not m:
            fail("bad sample line %r" % line)
        name, labels, value = m.group(1), parse_labels(m.group(3) or "", line), m.group(4)
        if name != cur:
            fail("sample %s outside its family block (current %s)" % (name, cur))
        if value not in ("NaN", "+Inf", "-Inf"):
            try:
                float(value)
            except ValueError:
                fail("bad value in %r" % line)
        fams[name]["samples"].append((labels, float(value)))
    for name, f in fams.items():
        if f["type"] is None or f["help"] is None:
            fail("family %s lacks HELP or TYPE" % name)
        if f["type"] == "counter" and not name.endswith("_total"):
            fail("counter %s is not named *_total" % name)
    return fams


def http(port, raw, timeout=5.0):
    """Send raw bytes; return the whole answer (b"" if the server closed at once)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(raw)
        except OSError:
            return b""
        buf = b""
        while True:
            try:
                d = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not d:
                break
            buf += d
    return buf


def scrape(port, wait=0.0):
    """GET /metrics, parsed. wait: retry an empty answer this long (connection slots are
    given back when the server's connection threads have exited)."""
    deadline = time.time() + wait
    while True:
        r = http(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        if r or time.time() > deadline:
            break
        time.sleep(0.1)
    head, _, body = r.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        fail("GET /metrics: %r" % head[:200])
    if b"text/plain; version=0.0.4" not in head:
        fail("GET /metrics: wrong content type: %r" % head)
    return parse_prom(body.decode())


def value(fams, name, **labels):
    for lab, v in fams.get(name, {"samples": []})["samples"]:
        if all(lab.get(k) == str(x) for k, x in labels.items()):
            return v
    fail("no sample %s%s" % (name, labels))


def is_open(s):
    """The server has not closed s (nothing to read within 0.2 s)."""
    s.settimeout(0.2)
    try:
        return s.recv(1, socket.MSG_PEEK) != b""
    except socket.timeout:
        return True
    except OSError:
        return False


def hold_connections(port, n):
    """n idle connections the server holds (slots of earlier requests are given back when
    their threads have exited: a connection refused meanwhile is replaced)."""
    held, deadline = [], time.time() + 5
    while len(held) < n:
        if time.time() > deadline:
            fail("could not hold %d connections (%d held)" % (n, len(held)))
        s = socket.create_connection(("127.0.0.1", port))
        if is_open(s):
            held.append(s)
        else:
            s.close()
            time.sleep(0.1)
    return held


def hostile(d, port):
    for method in (b"POST", b"PUT", b"DELETE", b"OPTIONS"):
        r = http(port, method + b" /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        if not r.startswith(b"HTTP/1.1 405") or b"Allow: GET, HEAD" not in r:
            fail("%s /metrics: %r" % (method.decode(), r[:200]))
    for path in (b"/", b"/metrics/x", b"/metricsx", b"/../etc/passwd"):
        r = http(port, b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        if not r.startswith(b"HTTP/1.1 404"):
            fail("GET %s: %r" % (path.decode(), r[:200]))
    r = http(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")
    if r.startswith(b"HTTP/1.1 200"):
        fail("a 20 KB request header was served")
    print("bad methods: 405; bad paths: 404; huge header: %r" % r[:40])
    # libmicrohttpd logs each refused request: rate-limited (at most 10 lines per 10 s).
    for _ in range(30):
        http(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")

    # Connection limit: MAX_CONN idle connections, then more are refused at once.
    idle = hold_connections(port, MAX_CONN)
    extra = http(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", timeout=3)
    if extra.startswith(b"HTTP/1.1 200"):
        fail("a scrape beyond max_connections was served")
    # The control channel is not affected.
    r = control_request(d.control, {"op": "status", "admin_token": d.admin_token})
    if r.get("ok") is not True:
        fail("control channel while the metrics connections are full: %s" % r)
    # Idle connections are cut after the timeout; scrapes work again.
    t0 = time.time()
    for s in idle:
        s.settimeout(TIMEOUT_S + 5)
        try:
            got = s.recv(100)
        except OSError:
            got = b""
        if got not in (b"",) and not got.startswith(b"HTTP/1.1 408"):
            fail("an idle connection got %r" % got)
        s.close()
    print("idle connections closed after %.1f s; a scrape beyond the limit was refused"
          % (time.time() - t0))
    scrape(port, wait=3.0)

    # Slowloris: a byte every 0.3 s (never idle for the inactivity timeout) is cut by the
    # total deadline.
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(0.3)
    req, t0, closed = b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 1000, time.time(), False
    for b in req:
        try:
            s.send(bytes([b]))
            if s.recv(1) == b"":
                closed = True
                break
        except socket.timeout:
            pass
        except OSError:
            closed = True
            break
        if time.time() - t0 > TIMEOUT_S + 5:
            break
    s.close()
    took = time.time() - t0
    if not closed or took > TIMEOUT_S + 2:
        fail("a slowloris connection was not cut within %d s (%.1f s, closed %s)" %
             (TIMEOUT_S + 2, took, closed))
    print("slowloris connection cut after %.1f s (timeout %d s)" % (took, TIMEOUT_S))
    fams = scrape(port, wait=3.0)
    if value(fams, "pbox_metrics_connections_cut_total") < 1:
        fail("the cut connection was not counted")
    if value(fams, "pbox_metrics_requests_total", outcome="method_not_allowed") < 4 or \
            value(fams, "pbox_metrics_requests_total", outcome="not_found") < 4:
        fail("refused requests not counted")


class MetricsPboxd(Pboxd):
    """A pboxd with a metrics group on a free port (chosen again with the others)."""

    def choose_ports(self):
        super().choose_ports()
        self.mport = free_ports(1)[0]
        with open(self.conf, "a") as f:
            f.write('metrics = { listen = "127.0.0.1:%d"; max_connections = %d; '
                    'timeout = %d; };\n' % (self.mport, MAX_CONN, TIMEOUT_S))


def main():
    test_runtime_jobs.W = build_path("tests/integration/pbox-check-worker")
    jobs = [{"id": 4, "token": "t4", "workers": 2, "mode": "aggregate"}]
    d = MetricsPboxd(jobs, cores=2, log_format="json")
    with d:
        ws = [worker(d, 4, "t4", r, 2, "--iters", "20") for r in range(2)]
        for r, p in enumerate(ws):
            if finish(p, "rank %d" % r)[0] != 0:
                fail("rank %d failed" % r)
        time.sleep(0.5)
        st = json.loads(subprocess.run(
            [build_path("apps/pbox"), "stats", "--control", d.control, "--json"],
            env={"PBOX_ADMIN_TOKEN": d.admin_token}, stdout=subprocess.PIPE, text=True,
            timeout=30, check=True).stdout)
        fams = scrape(d.mport)
        print("%d families, %d samples" % (len(fams),
                                           sum(len(f["samples"]) for f in fams.values())))
        n = 0
        for c in st["cores"]:
            for k, v in c.items():
                if k in ("core", "cpu", "busy_pct", "drops"):
                    continue
                if k == "dvf":  # pboxd_core_dvf_<member>_total, integer members
                    for dk, dv in v.items():
                        if isinstance(dv, int) and \
                                value(fams, "pboxd_core_dvf_%s_total" % dk, core=c["core"]) != dv:
                            fail("core %d dvf %s differs" % (c["core"], dk))
                    continue
                got = value(fams, "pboxd_core_%s_total" % k, core=c["core"])
                if k in ("busy_cycles", "idle_cycles", "polls"):
                    # Clocks, not events: they move while the core waits; scraped after
                    # the stats, never lower.
                    if got < v:
                        fail("core %d %s went back: %s < %s" % (c["core"], k, got, v))
                    continue
                if got != v:
                    fail("core %d %s: metrics %s, stats %s" % (
                        c["core"], k, value(fams, "pboxd_core_%s_total" % k, core=c["core"]),
                        v))
                n += 1
            for reason, v in c["drops"].items():
                if value(fams, "pboxd_core_drops_total", core=c["core"], reason=reason) != v:
                    fail("core %d drops %s differ" % (c["core"], reason))
                n += 1
        if value(fams, "pboxd_core_iterations_total", core=0) + \
                value(fams, "pboxd_core_iterations_total", core=1) == 0:
            fail("no iterations counted")
        job = [j for j in st["jobs"] if j["id"] == 4][0]
        for k in ("workers", "chunks", "bytes", "version_min", "version_max", "connected"):
            if k not in job:
                continue
            if value(fams, "pboxd_job_" + k, job=4) != job[k]:
                fail("job 4 %s: metrics %s, stats %s" % (k, value(fams, "pboxd_job_" + k,
                                                                  job=4), job[k]))
        if value(fams, "pboxd_job_state", job=4, state=job["state"]) != 1:
            fail("job state gauge")
        print("%d per-core counters equal `pbox stats`; job 4 gauges equal" % n)
        hostile(d, d.mport)
        log = d.log()
    lines = [ln for ln in log.splitlines() if ln.startswith("{")]
    if len(lines) < 5:
        fail("pboxd wrote no JSON log lines")
    for ln in lines:
        o = json.loads(ln)
        for k in ("ts", "level", "daemon", "object", "msg"):
            if k not in o:
                fail("log line without %s: %s" % (k, ln))
        if o["daemon"] != "pboxd" or not re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$",
                                                 o["ts"]):
            fail("bad log line %s" % ln)
    mhd = [ln for ln in lines if json.loads(ln)["msg"].startswith("metrics pboxd:")]
    if not 1 <= len(mhd) <= 12:
        fail("%d libmicrohttpd lines in the log for 31 refused requests (expected 1..12)"
             % len(mhd))
    if not any(json.loads(ln)["object"] == "job 4" for ln in lines):
        fail("no log line names its object (job 4)")
    print("%d JSON log lines, each with ts, level, daemon, object, msg" % len(lines))
    print("test_metrics: ok")


if __name__ == "__main__":
    main()
