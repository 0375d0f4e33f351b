#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The training demo through DPDK: three `pbox train` ranks (Fashion-MNIST MLP, NAG on the
appliance, deterministic job) in two worker namespaces train against pboxd on the
kernel-UDP transport and then on DPDK (net_af_xdp on a veth); the final models every
rank saves must be byte-identical within a run and between the two transports."""
import glob
import hashlib
import os
import struct
import sys
import tempfile

import netns
from netns import Topology, build_path, fail

RANKS = 3
BATCH = 240
STEPS = 12
DATA = "/usr/share/datasets/fashion-mnist"


def f32(x):
    """x rounded to float32, as a double (its repr parses back to exactly that float)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def job():
    return {"id": 3, "token": "train", "workers": RANKS, "mode": "server-optimizer",
            "deterministic": True,
            "optimizer": {"name": "nag", "lr": f32(0.05), "momentum": f32(0.9),
                          "rescale": f32(1.0 / BATCH)}}


def train(topo, d, outdir):
    cmds = [[build_path("apps/pbox"), "train", "--server", d.control, "--job", "3",
             "--token", "train", "--rank", str(r), "--workers", str(RANKS), "--batch",
             str(BATCH), "--max-steps", str(STEPS), "--data", DATA, "--save-model",
             os.path.join(outdir, "%s-rank%d.model" % (d.transport, r))]
            for r in range(RANKS)]
    topo.run_ranks(d, cmds, timeout=240)
    digests = set()
    for r in range(RANKS):
        with open(os.path.join(outdir, "%s-rank%d.model" % (d.transport, r)), "rb") as f:
            digests.add(hashlib.sha256(f.read()).hexdigest())
    if len(digests) != 1:
        fail("%s: the ranks saved different models" % d.transport)
    return digests.pop()


def main():
    why = netns.missing()
    if not why and not os.path.exists(os.path.join(os.environ.get("PBOX_BUILD_DIR", ""),
                                                   "apps/pbox")):
        why = "the pbox command (pbox train) is not built"
    if not why and not glob.glob(os.path.join(DATA, "train-images-idx3-ubyte*")):
        why = "no Fashion-MNIST data in %s" % DATA
    if why:
        print("SKIP: " + why)
        sys.exit(77)
    out = tempfile.mkdtemp(prefix="pbox-dpdk-train-")
    with Topology(nworker_ns=2) as topo:
        with topo.pboxd("udp", [job()]) as d:
            ref = train(topo, d, out)
        with topo.pboxd("dpdk", [job()]) as d:
            got = train(topo, d, out)
            tot = d.stats()["totals"]
            if tot["iterations"] == 0 or tot["dropped"] != 0:
                fail("DPDK counters: %d iterations, drops %s" % (tot["iterations"], tot["drops"]))
    print("kernel UDP model sha256 %s\nDPDK       model sha256 %s" % (ref, got))
    if ref != got:
        fail("the model trained through DPDK differs from the one through kernel UDP")
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
