#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""tests/dpdk/netns.py Topology.run_ranks reads every rank's output at once: rank 1 writes
more than a pipe holds before rank 0 may finish (rank 0 waits for rank 1's flag file).
Read one rank at a time, rank 1 blocked in write() and rank 0 gave up: the run failed.
Needs root (one network namespace); skips (exit 77) otherwise."""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "dpdk"))
from netns import PYTHON, Topology, fail, sh  # noqa: E402


class NoPboxd:
    def dump_log(self):
        pass


def main():
    if os.geteuid() != 0:
        print("SKIP: needs root (a network namespace)")
        return 77
    topo = Topology(nworker_ns=1)
    ns = topo.worker_ns[0]
    sh("ip", "netns", "add", ns)
    try:
        with tempfile.TemporaryDirectory(prefix="pboxtest-ranks-") as tmp:
            flag = os.path.join(tmp, "written")
            waiter = [PYTHON, "-c", "import os, sys, time\nfor _ in range(500):\n"
                      "    if os.path.exists(%r):\n        sys.exit(0)\n"
                      "    time.sleep(0.02)\nsys.exit('no flag within 10 s')" % flag]
            writer = [PYTHON, "-c", "import sys\nsys.stdout.write('x' * 200000)\n"
                      "sys.stdout.flush()\nopen(%r, 'w').close()" % flag]
            outs = topo.run_ranks(NoPboxd(), [waiter, writer], timeout=30)
        if len(outs) != 2 or len(outs[1]) != 200000:
            fail("run_ranks returned %s" % [len(o) for o in outs])
    finally:
        for p in topo.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    print("run_ranks: 200000 bytes from rank 1 while rank 0 waited for it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
