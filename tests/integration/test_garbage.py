#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Garbage on every port: random datagrams and malformed pbox headers on the data ports,
malformed requests on the control channel. pboxd counts each datagram under its drop
reason, answers control garbage with errors (closing abusive connections), never
crashes, and keeps serving a job while it happens."""
import json
import random
import socket
import struct
import subprocess
import time

from pboxtest import Pboxd, build_path, fail


def header(**kw):
    f = dict(magic=0x50424F58, version=1, type=1, flags=0, job=1, sender=0, cookie=0,
             chunk=0, iter=0, frag_off=0, frag_len=0, encoding=1, hdr_len=64, chunk_len=64,
             seq=0, arg0=0, arg1=0, reserved=0)
    f.update(kw)
    return struct.pack(">IBBHIIQIIIHBBIIIIQ", f["magic"], f["version"], f["type"], f["flags"],
                       f["job"], f["sender"], f["cookie"], f["chunk"], f["iter"],
                       f["frag_off"], f["frag_len"], f["encoding"], f["hdr_len"],
                       f["chunk_len"], f["seq"], f["arg0"], f["arg1"], f["reserved"])


def main():
    rng = random.Random(1234)
    jobs = [{"id": 1, "token": "t", "workers": 2, "mode": "aggregate"}]
    with Pboxd(jobs, cores=2) as d:
        workers = [subprocess.Popen(
            [build_path("tests/integration/pbox-check-worker"), "--server", d.control,
             "--job", "1", "--token", "t", "--rank", str(r), "--workers", "2",
             "--keys", "30000,5", "--iters", "600"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
        # Garbage with the job's id must meet a running session (else it is unknown_job).
        deadline = time.time() + 30
        while time.time() < deadline:
            job = d.stats()["jobs"][0]
            if job["state"] == "active" and job["registered"] == 2:
                break
            time.sleep(0.05)
        else:
            fail("the job's session did not start")
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sent = {"truncated": 0, "bad_magic": 0, "bad_version": 0, "bad_type": 0,
                "bad_length": 0, "unknown_job": 0, "bad_cookie": 0, "bad_reserved": 0}
        for i in range(3000):
            port = d.base + i % 2
            kind = i % 8
            if kind == 0:
                pkt = rng.randbytes(rng.randrange(0, 63))
                sent["truncated"] += 1
            elif kind == 1:
                pkt = rng.randbytes(rng.randrange(64, 1400))
                if pkt[:4] == b"PBOX":
                    continue
                sent["bad_magic"] += 1
            elif kind == 2:
                pkt = header(version=rng.choice([0, 2, 255]))
                sent["bad_version"] += 1
            elif kind == 3:
                pkt = header(type=rng.choice([0, 7, 200]))
                sent["bad_type"] += 1
            elif kind == 4:
                pkt = header(frag_len=64) + b"\0" * rng.randrange(0, 63)
                sent["bad_length"] += 1
            elif kind == 5:
                pkt = header(job=999, frag_len=64) + b"\0" * 64
                sent["unknown_job"] += 1
            elif kind == 6:
                pkt = header(job=1, cookie=rng.getrandbits(64) | 1, frag_len=64) + b"\0" * 64
                sent["bad_cookie"] += 1
            else:
                pkt = header(reserved=1)
                sent["bad_reserved"] += 1
            s.sendto(pkt, ("127.0.0.1", port))
            if i % 200 == 0:
                time.sleep(0.01)
        # Control channel garbage: bad JSON, no op, unknown op, then a flood.
        c = socket.create_connection(("127.0.0.1", d.tcp))
        c.sendall(b"this is not json\n{\"op\":42}\n{\"op\":\"reboot\"}\n[1,2]\n")
        replies = b""
        while replies.count(b"\n") < 4:
            chunk = c.recv(4096)
            if not chunk:
                break
            replies += chunk
        for line in replies.splitlines():
            r = json.loads(line)
            if r.get("ok") is not False or "error" not in r:
                fail("control garbage not answered with an error: %s" % line)
        c.sendall(b"{}\n" * 20)
        c.settimeout(5)
        try:
            while c.recv(4096):
                pass
        except socket.timeout:
            fail("an abusive control connection was not closed")
        c.close()
        for r, p in enumerate(workers):
            out, _ = p.communicate(timeout=120)
            print(out.strip())
            if p.returncode != 0:
                fail("rank %d failed while garbage arrived" % r)
        time.sleep(0.2)
        drops = d.stats()["totals"]["drops"]
        print("sent:", sent)
        print("counted:", {k: v for k, v in drops.items() if v})
        # A wrong cookie for job 1 counts as unknown_job if it arrives after the session
        # ended (the workers finished first); together they must add up.
        both = drops["unknown_job"] + drops["bad_cookie"]
        sent_both = sent.pop("unknown_job") + sent.pop("bad_cookie")
        if not (0.9 * sent_both <= both <= sent_both):
            fail("sent %d unknown-job/bad-cookie datagrams, pboxd counted %d"
                 % (sent_both, both))
        for reason, n in sent.items():
            # Loopback does not lose datagrams unless a socket buffer overflows; allow a
            # little for that, but every counted one must have the right reason.
            if not (0.9 * n <= drops[reason] <= n):
                fail("sent %d %s datagrams, pboxd counted %d" % (n, reason, drops[reason]))
        if "malformed requests; closing" not in d.log():
            fail("pboxd did not log closing the abusive control connection")


if __name__ == "__main__":
    main()
