#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Memory budgets (issue 9, defect 3): a job whose key set needs more chunk state than
its job's memory_budget, or than what the appliance's memory_budget has left, is refused
at registration with the numbers (needed, budget, in use); a key set whose chunk count
overflows 32 bits is refused by its count; nothing is allocated for them (pboxd's resident
memory stays small), and a job that is training meanwhile is not disturbed."""
import os
import re
import subprocess
import tempfile
import time

from pboxtest import Pboxd, build_path, fail, register_rank, to_libconfig


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def expect_refusal(d, job, token, keys, *fragments):
    rep = register_rank(d.control, job, token, keys, may_refuse=True)
    print("job %d: %s" % (job, rep.get("error", rep)))
    if rep.get("ok"):
        fail("job %d: a key set over budget was admitted: %s" % (job, rep))
    for frag in fragments:
        if frag not in rep.get("error", ""):
            fail("job %d: refusal does not say '%s': %s" % (job, frag, rep))


def check_config():
    """pboxd --check-config prints each job's worst-case chunk state and fails (78) when a
    configured key set can never fit its budget."""
    jobs = [{"id": 1, "token": "a", "workers": 2, "mode": "server-optimizer",
             "optimizer": {"name": "adam"}, "keys": [[0, 1000000], [1, 10]]},
            {"id": 2, "token": "b", "workers": 4, "deterministic": True}]
    with tempfile.TemporaryDirectory(prefix="pbox-budget-") as tmp:
        conf = os.path.join(tmp, "pboxd.conf")
        for budget, want_rc in (("64M", 0), ("16M", 78)):
            with open(conf, "w") as f:
                f.write(to_libconfig({"memory_budget": budget, "cores": 2}, jobs))
            r = subprocess.run([build_path("dataplane/pboxd"), "-c", conf, "--check-config"],
                               capture_output=True, text=True, timeout=60)
            print(r.stdout + r.stderr)
            if r.returncode != want_rc:
                fail("--check-config with memory_budget %s: status %d, expected %d"
                     % (budget, r.returncode, want_rc))
            # The state per chunk follows the engine's slot layout (23.0x MiB here).
            if not re.search(r"job 1: 2 keys, 124 chunks: worst-case chunk state 23\.0\d MiB",
                             r.stdout) \
                    or "job 2: key set defined at registration" not in r.stdout:
                fail("--check-config does not print the jobs' chunk state")
            if want_rc and "job 1: can never start" not in r.stdout:
                fail("--check-config does not say which job can never start")


def main():
    check_config()
    worker = build_path("tests/integration/pbox-check-worker")
    jobs = [
        {"id": 1, "token": "one", "workers": 2, "mode": "aggregate"},
        # 4 Mi floats with NAG: 2 models + momentum + 2 window slots = 80 MiB.
        {"id": 2, "token": "two", "workers": 1, "mode": "server-optimizer",
         "optimizer": {"name": "nag"}, "memory_budget": "16M"},
        {"id": 3, "token": "three", "workers": 1, "mode": "aggregate"},
    ]
    with Pboxd(jobs, cores=2, memory_budget="48M") as d:
        common = ["--server", d.control, "--job", "1", "--token", "one", "--workers", "2",
                  "--keys", "100000,30000,7", "--iters", "3000"]
        ranks = [subprocess.Popen([worker, "--rank", str(r)] + common,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(2)]
        # Job 1 is running once its session holds state.
        deadline = time.time() + 30
        while time.time() < deadline:
            st = {j["id"]: j for j in d.stats()["jobs"]}
            if st[1]["state"] == "active" and st[1]["registered"] == 2:
                break
            time.sleep(0.1)
        else:
            fail("job 1 did not start: %s" % d.stats())
        rss0 = rss_kb(d.proc.pid)
        if not 0 < st[1]["state_bytes"] < 4 << 20:
            fail("job 1's chunk state is not accounted in stats: %s" % st[1])

        expect_refusal(d, 2, "two", [[0, 4 << 20]], "needs at least 80.",
                       "over the job's memory_budget of 16.00 MiB (16777216 bytes)")
        # 10 Mi floats, 2 slots: 80 MiB, over what is left of the appliance's 48 MiB.
        expect_refusal(d, 3, "three", [[0, 10 << 20], [1, 5]], "needs at least 81.",
                       "the appliance's memory_budget is 48.00 MiB (50331648 bytes)",
                       "in use by 1 running session(s)")
        # A key of 2^40 elements: refused by its chunk count (2^27 chunks of 32 KiB).
        expect_refusal(d, 3, "three", [[0, 1 << 40]], "134217728 or more chunks",
                       "at most 16777216 chunks per job")
        rss1 = rss_kb(d.proc.pid)
        print("pboxd resident: %d KiB before the refusals, %d KiB after" % (rss0, rss1))
        if rss1 - rss0 > 16 * 1024:
            fail("pboxd's resident memory grew by %d KiB for refused jobs" % (rss1 - rss0))
        for p in ranks:
            if p.poll() is not None and p.returncode != 0:
                fail("job 1 failed while other jobs were refused: %s" % p.communicate()[0])
        # A key set that fits is admitted next to job 1 (and uses the budget).
        rep = register_rank(d.control, 3, "three", [[0, 1 << 20]], may_refuse=True)
        if not rep.get("ok"):
            fail("job 3 within budget was refused: %s" % rep)
        for r, p in enumerate(ranks):
            out, _ = p.communicate(timeout=240)
            if p.returncode != 0:
                fail("job 1 rank %d failed: %s" % (r, out))
        log = d.log()
        for frag in ("register refused", "of chunk state"):
            if frag not in log:
                fail("pboxd's log does not say '%s'" % frag)


if __name__ == "__main__":
    main()
