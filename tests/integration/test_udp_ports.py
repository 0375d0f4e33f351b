#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""No other socket can take over a data-plane UDP port, of pboxd's cores or of a worker.

With SO_REUSEADDR on the data sockets, a later socket with the same option could bind the
same port (any process's ephemeral bind could even pick it) and from then on received every
datagram sent there: the worker, or the core, silently stopped hearing its peer while
retransmitting correctly. That is how `pbox demo --fault ...` on a machine busy with other
tests could fail once in a while mid-operation with "init of key 0 (iteration 0) timed out
after 30.0 s: 22 of 25 chunks done, 3 unanswered" (issue 9, defect 5). Here a worker
(rank 0, waiting for rank 1 inside its first push-pull) and pboxd are running; binding
their data ports with SO_REUSEADDR, on 0.0.0.0 and on 127.0.0.1, must fail with
EADDRINUSE; then the job completes normally."""
import errno
import os
import socket
import subprocess
import time

from pboxtest import Pboxd, build_path, fail


def udp_ports_of(pid):
    """The local UDP ports of the sockets process pid has open (from /proc)."""
    inodes = set()
    fd_dir = "/proc/%d/fd" % pid
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    ports = set()
    with open("/proc/%d/net/udp" % pid) as f:
        next(f)
        for line in f:
            fields = line.split()
            if fields[9] in inodes:
                ports.add(int(fields[1].split(":")[1], 16))
    return ports


def check_not_shareable(port, what):
    for addr in ("0.0.0.0", "127.0.0.1"):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((addr, port))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                fail("binding %s:%d (%s): unexpected error %s" % (addr, port, what, e))
            continue
        finally:
            s.close()
        fail("another socket could bind %s's data port %s:%d (SO_REUSEADDR): it could "
             "receive datagrams meant for it" % (what, addr, port))
    print("%s's data port %d cannot be taken over" % (what, port))


def main():
    w = build_path("tests/integration/pbox-check-worker")
    jobs = [{"id": 1, "token": "a", "workers": 2, "mode": "server-optimizer",
             "optimizer": {"name": "sgd", "lr": 0.5}}]
    with Pboxd(jobs, cores=2) as d:
        for k in range(2):
            check_not_shareable(d.base + k, "pboxd core %d" % k)

        def start(rank):
            return subprocess.Popen([w, "--server", d.control, "--job", "1", "--token", "a",
                                     "--rank", str(rank), "--workers", "2", "--server-opt",
                                     "--keys", "20000,77", "--iters", "20",
                                     "--timeout-ms", "20000"],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True)

        # Rank 0 alone: it registers, initialises the model and then waits for rank 1.
        r0 = start(0)
        ports = set()
        deadline = time.time() + 15
        while not ports and time.time() < deadline and r0.poll() is None:
            time.sleep(0.05)
            ports = udp_ports_of(r0.pid)
        if not ports:
            r0.kill()
            fail("rank 0 opened no data socket: %s" % r0.communicate()[0])
        for p in sorted(ports):
            check_not_shareable(p, "worker rank 0")
        r1 = start(1)
        for rank, p in ((0, r0), (1, r1)):
            try:
                out, _ = p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                r0.kill()
                r1.kill()
                fail("rank %d did not finish" % rank)
            print("[rank %d] exit %d: %s" % (rank, p.returncode, out.strip()))
            if p.returncode != 0:
                fail("rank %d failed" % rank)
    print("ok")


if __name__ == "__main__":
    main()
