#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""deploy/ without changing this machine: `lint` runs ansible-lint on deploy/ (it must
pass with no violation); `check` runs the tasks the real-run test skips - the kernel
command line, NIC, IRQ affinity and governor tags - in --check --diff mode against a
copy of a GRUB defaults file, and checks that the diff shows the new command line (the
old isolcpus= replaced, the rest kept), that a reboot is announced, and that neither the
file nor the IRQ affinities changed.
Usage: test_deploy_check.py lint|check
"""
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import pboxtest  # noqa: E402
from test_deploy import ansible_env, write_vars, skip, fail  # noqa: E402

TAGS = "kernel_cmdline,nic,irq_affinity,governor"


def lint():
    if shutil.which("ansible-lint") is None:
        skip("ansible-lint is not installed (Debian: ansible-lint)")
    tmp = tempfile.mkdtemp(prefix="pbox-lint-")
    try:
        env = ansible_env(tmp)
        env["HOME"] = tmp  # its caches
        t0 = time.time()
        p = subprocess.run(["ansible-lint", "--offline", "--nocolor", "deploy/"], cwd=ROOT, env=env,
                           capture_output=True, text=True)
        out = p.stdout + p.stderr
        print(out[-4000:])
        if p.returncode != 0:
            fail("ansible-lint found violations (exit %d)" % p.returncode)
        if "0 failure(s), 0 warning(s)" not in out:
            fail("ansible-lint did not report a clean pass")
        print("ansible-lint: clean (%.1f s)" % (time.time() - t0))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def irq_affinities():
    out = {}
    for d in os.listdir("/proc/irq"):
        p = os.path.join("/proc/irq", d, "smp_affinity_list")
        try:
            with open(p) as f:
                out[d] = f.read().strip()
        except OSError:
            pass
    return out


def verify_units(tmp, build):
    """The systemd unit of each transport passes systemd-analyze verify with no warning
    (this host may not run systemd; the unit is checked offline)."""
    if shutil.which("systemd-analyze") is None:
        print("  (systemd-analyze is not installed: the units are not verified)")
        return
    p = subprocess.run(["ansible-playbook", "-i", "localhost,", "-c", "local",
                        "tests/deploy/render_unit.yml", "-e", "out=" + tmp, "-e",
                        "pbox_pboxd_bin=" + os.path.join(os.path.abspath(build), "dataplane",
                                                         "pboxd"),
                        "-e", "pbox_ctrld_bin_path=" + os.path.join(os.path.abspath(build),
                                                                   "ctrlplane", "ctrld",
                                                                   "pbox-ctrld"),
                        "-e", "pbox_src_dir=" + ROOT],
                       cwd=ROOT, env=ansible_env(tmp), capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stdout[-3000:] + p.stderr[-2000:])
        fail("rendering the units failed")
    for transport in ("udp", "dpdk"):
        unit = os.path.join(tmp, transport, "pboxd.service")
        v = subprocess.run(["systemd-analyze", "verify", unit], capture_output=True, text=True)
        if v.returncode != 0 or v.stderr.strip():
            fail("systemd-analyze verify of the %s unit: exit %d: %s" %
                 (transport, v.returncode, v.stderr.strip()))
        caps = re.search(r"^AmbientCapabilities=(.*)$", open(unit).read(), re.M).group(1)
        if transport == "udp" and caps.strip():
            fail("the udp unit grants capabilities: %s" % caps)
        print("  systemd unit (%s transport): systemd-analyze verify clean; capabilities: %s" %
              (transport, caps.strip() or "none"))
    unit = os.path.join(tmp, "pbox-ctrld.service")
    v = subprocess.run(["systemd-analyze", "verify", unit], capture_output=True, text=True)
    if v.returncode != 0 or v.stderr.strip():
        fail("systemd-analyze verify of the pbox-ctrld unit: exit %d: %s" %
             (v.returncode, v.stderr.strip()))
    text = open(unit).read()
    for line in ("CapabilityBoundingSet=", "AmbientCapabilities=", "NoNewPrivileges=yes"):
        if not re.search("^%s$" % line, text, re.M):
            fail("the pbox-ctrld unit lacks '%s' (it needs no capability)" % line)
    print("  systemd unit pbox-ctrld: systemd-analyze verify clean; capabilities: none")


def vfio_refusal(tmp, varsfile):
    """The nic role in vfio-pci mode, --check, with a PCI address that does not exist:
    it must stop with the reason (no IOMMU here, or no such device), naming what to do,
    before any binding."""
    bogus = "0000:ff:1f.7"
    cmd = ["ansible-playbook", "-i", "deploy/inventory/local.yml", "-c", "local",
           "deploy/site.yml", "--check", "--tags", "nic", "-e", "@" + varsfile, "-e",
           '{"pbox_nic_mode": "vfio-pci", "pbox_nic_pci": ["%s"]}' % bogus]
    p = subprocess.run(cmd, cwd=ROOT, env=ansible_env(tmp), capture_output=True, text=True)
    out = p.stdout + p.stderr
    reasons = ("no IOMMU groups: turn the IOMMU on", "no PCI device %s" % bogus)
    found = [r for r in reasons if r in out]
    if p.returncode == 0 or not found or "Bind to vfio-pci" in out.split(found[0])[0]:
        print(out[-4000:])
        fail("vfio-pci mode with PCI device %s: exit %d, expected a refusal naming %s" %
             (bogus, p.returncode, " or ".join(reasons)))
    print("  nic vfio-pci, --check, bogus device: refused: %s..." % found[0])


def ctrld_check(tmp, varsfile, build):
    """The pbox_ctrld role in --check --diff: the diff shows the configuration it would
    install (the appliance's pboxd with its admin token, the static job) and nothing is
    written; an appliance without pboxd_admin_token is refused before anything is done."""
    bindir = os.path.join(os.path.abspath(build), "ctrlplane", "ctrld")
    base = ["ansible-playbook", "-i", "deploy/inventory/local.yml", "-c", "local",
            "tests/deploy/ctrld_role.yml", "--check", "--diff", "-e", "@" + varsfile,
            "-e", "pbox_bin_dir=" + bindir]
    with open(varsfile) as f:
        v = json.load(f)
    conf = os.path.join(v["pbox_conf_dir"], "pbox-ctrld.conf")
    p = subprocess.run(base, cwd=ROOT, env=ansible_env(tmp), capture_output=True, text=True)
    out = p.stdout + p.stderr
    want = ('+pboxds = ( { name = "localhost"; control = "%s"; admin_token = "%s"; } );' %
            (v["pboxd_control"], v["pbox_local_admin_token"]))
    if p.returncode != 0 or want not in out or "+jobs = ( { id = 3;" not in out or \
            '+ctrld = { listen = "%s";' % v["pbox_ctrld_listen"] not in out:
        print(out[-5000:])
        fail("pbox_ctrld --check --diff: exit %d; the diff lacks %s" % (p.returncode, want))
    if os.path.exists(conf):
        fail("--check wrote %s" % conf)
    print("  pbox_ctrld --check --diff: the configuration's diff names the pboxd and job 3; "
          "nothing written")
    p = subprocess.run(base + ["-e", '{"pboxd_admin_token": ""}'], cwd=ROOT,
                       env=ansible_env(tmp), capture_output=True, text=True)
    out = p.stdout + p.stderr
    if p.returncode == 0 or "admin token (pboxd_admin_token)" not in out or \
            "Configuration (checked" in out:
        print(out[-4000:])
        fail("pbox_ctrld with an appliance without pboxd_admin_token: exit %d, expected a "
             "refusal before the configuration task" % p.returncode)
    print("  pbox_ctrld, appliance without pboxd_admin_token: refused")
    p = subprocess.run(base + ["-e", '{"pbox_ctrld_jobs": [{"id": 2, "token": "x", '
                                      '"workers": 1, "mode": "aggregate"}]}'], cwd=ROOT,
                       env=ansible_env(tmp), capture_output=True, text=True)
    out = p.stdout + p.stderr
    if p.returncode == 0 or "(both: [2])" not in out:
        print(out[-4000:])
        fail("pbox_ctrld with a static job whose id is one of pboxd's own jobs: exit %d, "
             "expected a refusal naming job 2" % p.returncode)
    print("  pbox_ctrld, static job 2 that pboxd's configuration also has: refused")


def check():
    if os.geteuid() != 0:
        skip("needs root (ansible reads /proc/irq and the NIC state as root)")
    if shutil.which("ansible-playbook") is None:
        skip("ansible-playbook is not installed (Debian: ansible)")
    build = os.environ.get("PBOX_BUILD_DIR") or os.path.join(ROOT, "build")
    tmp = tempfile.mkdtemp(prefix="pbox-deploy-check-")
    try:
        varsfile, v = write_vars(tmp, os.path.abspath(build), pboxtest.free_ports(1), "t")
        grub = os.path.join(tmp, "grub")
        shutil.copy(os.path.join(HERE, "grub.default"), grub)
        before = hashlib.sha256(open(grub, "rb").read()).hexdigest()
        irqs = irq_affinities()
        cmd = ["ansible-playbook", "-i", "deploy/inventory/local.yml", "-c", "local",
               "deploy/site.yml", "--check", "--diff", "--tags", TAGS, "-e", "@" + varsfile,
               "-e", "pbox_grub_default_file=" + grub]
        t0 = time.time()
        p = subprocess.run(cmd, cwd=ROOT, env=ansible_env(tmp), capture_output=True, text=True)
        out = p.stdout + p.stderr
        print("$ %s  (%.1f s)" % (" ".join(cmd), time.time() - t0))
        if p.returncode != 0:
            print(out[-6000:])
            fail("the --check run failed (exit %d)" % p.returncode)
        m = re.search(r'^\+GRUB_CMDLINE_LINUX="console=ttyS0 isolcpus=managed_irq,domain,(\d+) '
                      r'nohz_full=\1 rcu_nocbs=\1"$', out, re.M)
        if not m or not re.search(r'^-GRUB_CMDLINE_LINUX="console=ttyS0 isolcpus=3"$', out, re.M):
            print(out[-6000:])
            fail("the diff does not replace isolcpus=3 by the data-plane CPU's "
                 "isolcpus/nohz_full/rcu_nocbs")
        print("  GRUB diff: %s" % m.group(0))
        if "take effect at the next boot" not in out:
            fail("no word that a reboot is needed")
        if hashlib.sha256(open(grub, "rb").read()).hexdigest() != before:
            fail("--check changed %s" % grub)
        if irq_affinities() != irqs:
            fail("--check changed IRQ affinities")
        for task in ("IRQ affinity away from the data-plane CPUs", "CPU frequency governor",
                     "Up, with the MTU the appliance uses"):
            if task not in out:
                fail("the --check run did not reach '%s'" % task)
        rec = re.search(r"localhost\s+:\s+ok=(\d+)\s+changed=(\d+)", out)
        print("  recap: ok=%s changed=%s; %s and the IRQ affinities unchanged" %
              (rec.group(1), rec.group(2), grub))
        verify_units(tmp, build)
        vfio_refusal(tmp, varsfile)
        ctrld_check(tmp, varsfile, build)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in ("lint", "check"):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 64
    lint() if sys.argv[1] == "lint" else check()
    return 0


if __name__ == "__main__":
    sys.exit(main())
