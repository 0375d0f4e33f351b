#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Checkpoint policy (issue 9): with checkpoint_interval = 0 a server-optimizer job is
checkpointed when pboxd is asked to stop (SIGTERM, while its workers still train); a pboxd
restarted with the same job (and another core count) restores it at the first register
with the same keys and says so in the register reply (resume_version) and its log; a
register with other keys is not given the old state: the session starts fresh
(resume_version 0), the log says why and the file is kept as job-<id>.ckpt.rejected."""
import os
import signal
import subprocess
import tempfile

from pboxtest import Pboxd, build_path, fail, register_rank, wait_for

KEYS = [(100, 5000), (101, 300)]


def main():
    worker = build_path("tests/integration/pbox-check-worker")
    jobs = [{"id": 5, "token": "t", "workers": 2, "mode": "server-optimizer",
             "optimizer": {"name": "nag", "lr": 0.01, "momentum": 0.9}}]
    with tempfile.TemporaryDirectory(prefix="pbox-ckpt-") as ck:
        path = os.path.join(ck, "job-5.ckpt")
        d = Pboxd(jobs, cores=2, checkpoint_dir=ck, checkpoint_interval=0)
        d.start()
        args = ["--server", d.control, "--job", "5", "--token", "t", "--workers", "2",
                "--keys", ",".join(str(n) for _, n in KEYS), "--server-opt",
                "--optimizer", "nag", "--lr", "0.01", "--iters", "1000000"]
        ranks = [subprocess.Popen([worker, "--rank", str(r)] + args, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for r in range(2)]
        try:
            wait_for(lambda: [j for j in d.stats()["jobs"]
                              if j["id"] == 5 and j.get("version_min", 0) > 20],
                     "job 5 to train", 30, 0.1)
            if os.path.exists(path):
                fail("a checkpoint was written with checkpoint_interval = 0 before shutdown")
            rc = d.halt(signal.SIGTERM)
        finally:
            for p in ranks:
                p.kill()
                p.communicate()
        log = d.log()
        d.remove_dir()
        print("\n".join(l for l in log.splitlines() if "checkpoint" in l))
        if rc != 0:
            fail("pboxd exited with %d" % rc)
        if "checkpoint of version" not in log or not os.path.exists(path):
            fail("no checkpoint written at shutdown:\n%s" % log)
        saved = int(log.split("checkpoint of version ")[1].split()[0])

        # Restarted, on one core instead of two: the same keys get the saved state back.
        with Pboxd(jobs, cores=1, checkpoint_dir=ck, checkpoint_interval=0) as d2:
            rep = register_rank(d2.control, 5, "t", KEYS)
            print("register reply: resume_version %s" % rep.get("resume_version"))
            if rep.get("resume_version") != saved:
                fail("resume_version %s, expected the saved version %d"
                     % (rep.get("resume_version"), saved))
            wait_for(lambda: [j for j in d2.stats()["jobs"] if j["state"] == "idle"],
                     "the session to end", 30, 0.1)
            if "job 5: restored version %d" % saved not in d2.log():
                fail("pboxd does not log the restore")
            # Other keys: not restored; the session starts fresh.
            rep = register_rank(d2.control, 5, "t", [(100, 5001), (101, 300)])
            if rep.get("resume_version") != 0:
                fail("a key set that differs was given the checkpoint: %s" % rep)
            log = d2.log()
            want = "key #0 was id 100 with 5000 elements; the session registered id 100 " \
                   "with 5001"
            if "checkpoint not restored, the session starts fresh" not in log or want not in log:
                fail("the refused restore is not explained in the log:\n%s" % log)
            if not os.path.exists(path + ".rejected") or os.path.exists(path):
                fail("the mismatching checkpoint was not kept aside as .rejected")
        print("checkpoint of version %d restored after a restart; other keys refused it"
              % saved)


if __name__ == "__main__":
    main()
