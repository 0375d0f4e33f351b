#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""perf/tune.sh: check mode on this machine changes nothing and gives every setting a
status; --apply on a fake /proc and /sys tree (--root) sets the governor, hugepages,
IRQ affinities, socket buffers and busy polling, reports isolated CPUs as impossible at
run time, reports a write the kernel refuses with its reason, and a second run finds
everything as recommended (--strict exits 0 only then)."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TUNE = os.path.join(ROOT, "perf", "tune.sh")
STATUS = re.compile(r"(ok|would change|changed|cannot: .+|n/a: .+)$")
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL: " + msg, flush=True)


def run(*args):
    p = subprocess.run([TUNE] + list(args), capture_output=True, text=True)
    print("$ perf/tune.sh %s  -> %d\n%s%s" % (" ".join(args), p.returncode, p.stdout, p.stderr))
    return p


def rows(out):
    """{setting: (current, recommended, status)} from the table."""
    res = {}
    for line in out.splitlines()[2:]:
        if line.startswith("tune.sh:"):
            continue
        m = re.match(r"^(.{32}) (.{20}) (.{20}) (.*)$", line)
        if m:
            res[m.group(1).strip()] = (m.group(2).strip(), m.group(3).strip(), m.group(4))
    return res


def expand(cpus):
    out = set()
    for part in cpus.split(","):
        a, _, b = part.partition("-")
        out |= {str(c) for c in range(int(a), int(b or a) + 1)}
    return out


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text + "\n")


def read(root, rel):
    with open(os.path.join(root, rel)) as f:
        return f.read().strip()


def fake_host(root):
    write(root, "sys/devices/system/cpu/online", "0-3")
    for c in range(4):
        write(root, "sys/devices/system/cpu/cpu%d/cpufreq/scaling_governor" % c, "powersave")
        write(root, "sys/devices/system/cpu/cpu%d/cpufreq/scaling_available_governors" % c,
              "performance powersave")
    write(root, "sys/devices/system/cpu/isolated", "")
    write(root, "sys/devices/system/cpu/nohz_full", "(null)")
    write(root, "proc/cmdline", "root=/dev/sda1 quiet")
    write(root, "proc/mounts", "hugetlbfs /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0")
    write(root, "proc/sys/vm/nr_hugepages", "0")
    for k, v in (("rmem_max", 212992), ("wmem_max", 33554432), ("busy_poll", 0),
                 ("busy_read", 0)):
        write(root, "proc/sys/net/core/" + k, str(v))
    write(root, "proc/irq/default_smp_affinity", "f")
    write(root, "proc/irq/24/smp_affinity_list", "0-3")
    write(root, "proc/irq/25/smp_affinity_list", "0,2")  # already off the data plane
    write(root, "proc/irq/26/smp_affinity_list", "3")
    # An IRQ whose affinity the kernel refuses to change (as /proc does for managed IRQs):
    # a read-only sysfs file that lists CPU 1, which even root cannot write.
    os.makedirs(os.path.join(root, "proc/irq/27"))
    os.symlink("/sys/devices/system/cpu/online", os.path.join(root, "proc/irq/27/smp_affinity_list"))


def readonly_sysctls(root):
    """/proc/sys read-only, as in a container: --apply says so instead of failing."""
    if os.geteuid() != 0:
        print("(not root: the read-only /proc/sys case is not exercised)")
        return
    core = os.path.join(root, "proc/sys/net/core")
    write(root, "proc/sys/net/core/rmem_max", "4096")
    if subprocess.run(["mount", "--bind", core, core]).returncode != 0:
        print("(bind mounts are not allowed here: the read-only case is not exercised)")
        return
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", core, core]).returncode != 0:
            check(False, "cannot remount %s read-only" % core)
            return
        p = run("--apply", "--root", root, "--only", "sockbuf", "--dataplane-cpus", "1,3")
        r = rows(p.stdout)
        check(p.returncode == 0, "read-only sysctls: exit %d" % p.returncode)
        check(r["net.core.rmem_max"][2] == "cannot: /proc/sys/net/core/rmem_max is read-only "
              "here (a container: set it on the host or through the runtime)",
              "read-only rmem_max: %r" % (r["net.core.rmem_max"],))
        check(read(root, "proc/sys/net/core/rmem_max") == "4096", "rmem_max changed")
    finally:
        subprocess.run(["umount", core])


def main():
    # 1. This machine, check mode: nothing changes, every row has a status.
    before = {k: open("/proc/sys/net/core/" + k).read() for k in ("rmem_max", "busy_poll")}
    p = run()
    check(p.returncode == 0, "check mode exited with %d" % p.returncode)
    r = rows(p.stdout)
    check(len(r) >= 6, "check mode printed %d settings" % len(r))
    for name, (_, _, status) in r.items():
        check(STATUS.match(status), "%s: unknown status %r" % (name, status))
        check(status != "changed", "%s changed in check mode" % name)
    after = {k: open("/proc/sys/net/core/" + k).read() for k in before}
    check(before == after, "check mode changed sysctls: %s -> %s" % (before, after))

    # 2. A fake host, --apply.
    root = tempfile.mkdtemp(prefix="pbox-tune-")
    try:
        fake_host(root)
        p = run("--apply", "--root", root, "--dataplane-cpus", "1,3", "--hugepages", "64",
                "--strict")
        check(p.returncode == 1, "--strict with isolation impossible must exit 1 (got %d)" %
              p.returncode)
        r = rows(p.stdout)
        for c in range(4):
            check(read(root, "sys/devices/system/cpu/cpu%d/cpufreq/scaling_governor" % c) ==
                  "performance", "cpu%d governor not set" % c)
            check(r.get("governor cpu%d" % c, ("", "", ""))[2] == "changed",
                  "cpu%d governor not reported changed" % c)
        check(read(root, "proc/sys/vm/nr_hugepages") == "64", "hugepages not set")
        check(read(root, "proc/sys/net/core/rmem_max") == "16777216", "rmem_max not raised")
        check(read(root, "proc/sys/net/core/wmem_max") == "33554432",
              "wmem_max was lowered (it was above the recommendation)")
        check(r["net.core.wmem_max"][2] == "ok", "wmem_max above the minimum is not ok")
        check(read(root, "proc/sys/net/core/busy_poll") == "50", "busy_poll not set")
        check(read(root, "proc/irq/24/smp_affinity_list") == "0,2", "IRQ 24 not moved")
        check(read(root, "proc/irq/26/smp_affinity_list") == "0,2", "IRQ 26 not moved")
        check(read(root, "proc/irq/25/smp_affinity_list") == "0,2", "IRQ 25 was touched")
        check("IRQ 25 affinity" not in r, "IRQ 25 (off the data plane) is listed")
        check(read(root, "proc/irq/default_smp_affinity") == "5", "default affinity not 5")
        online = open("/sys/devices/system/cpu/online").read().strip()
        if "1" in expand(online):
            check(r.get("IRQ 27 affinity", ("", "", ""))[2].startswith("cannot: ") and
                  "/proc/irq/27/smp_affinity_list" in r["IRQ 27 affinity"][2],
                  "IRQ 27's refused write is not reported as cannot: %r" %
                  (r.get("IRQ 27 affinity"),))
        else:
            print("(this machine has no CPU 1: the refused-write case is not exercised)")
        for k in ("isolated CPUs", "nohz_full CPUs", "rcu_nocbs CPUs"):
            check(r[k][2].startswith("cannot: at run time") and "isolcpus=managed_irq,domain,1,3"
                  in r[k][2], "%s: %r" % (k, r[k]))
        # 3. Again: all that can be set is as recommended.
        shutil.rmtree(os.path.join(root, "proc/irq/27"))
        p = run("--apply", "--root", root, "--dataplane-cpus", "1,3", "--hugepages", "64",
                "--only", "governor,hugepages,irq,sockbuf,busypoll", "--strict")
        check(p.returncode == 0 and "every setting is as recommended" in p.stdout,
              "the second run still finds something to do")
        check(all(s[2] == "ok" for s in rows(p.stdout).values()), "a second-run row is not ok")
        readonly_sysctls(root)
        p = run("--dataplane-cpus", "7", "--root", root)
        check(p.returncode == 64 and "not online" in p.stderr, "an offline CPU is accepted")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    print("tune.sh: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
