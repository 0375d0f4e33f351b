#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""deploy/ applied to this machine for real, as CI runs it (root).

  1. ansible-playbook -i deploy/inventory/local.yml -c local deploy/site.yml, skipping
     the tags that change the running kernel or the hardware (kernel_cmdline, nic,
     irq_affinity, governor), with every path (install destdir, /etc/pbox, /run/pbox,
     /var/lib/pbox, logs, sysctl files) in a temporary directory, the build directory of
     this meson build, free ports, and sysctl values equal to the running kernel's, so
     that nothing outside the directory changes but the service account;
  2. pboxd and pbox-ctrld (managing that pboxd) run as the services the play set up
     (systemd, or the fallback runner pbox-service where systemd is not PID 1), as the
     unprivileged account with no capability (udp transport); pboxd killed with SIGKILL
     is restarted by the runner;
  3. a job created through pbox-ctrld (`pbox job create --control`, with the admin token
     file the role wrote) lands on the pboxd, next to pbox-ctrld's static job 3;
  4. a smoke training against them: two `pbox train` ranks on that runtime job
     (server-optimizer) and Python ranks (`import pbox` through the environment file
     the workers role wrote) on pboxd's static aggregate job 2 and pbox-ctrld's static
     job 3, all through the control port the inventory set;
  5. the same play again: it must report changed=0 (pbox-ctrld keeps its runtime job);
  6. cleanup: the services are stopped, the account removed, the directory deleted.
The lint and the --check run of the tagged tasks are test_deploy_check.py.
"""
import json
import os
import pwd
import grp
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import pboxtest  # noqa: E402

SKIP_TAGS = "kernel_cmdline,nic,irq_affinity,governor"
# Names of this run only: two test runs on one machine (several CI trees) must not
# remove each other's service account.
_RUN = secrets.token_hex(3)
USER = "pboxci-" + _RUN
WORKER_GROUP = "pboxtr-" + _RUN


def skip(msg):
    print("SKIP: " + msg, flush=True)
    sys.exit(77)


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr, flush=True)
    raise SystemExit(1)


def sysctl(name):
    with open("/proc/sys/" + name.replace(".", "/")) as f:
        return int(f.read().split()[0])


def ansible_env(tmp):
    env = dict(os.environ)
    env.update({
        "ANSIBLE_CONFIG": os.path.join(ROOT, "deploy", "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_PIPELINING": "1",
        "ANSIBLE_LOCAL_TEMP": os.path.join(tmp, "ansible-local"),
        "ANSIBLE_REMOTE_TMP": os.path.join(tmp, "ansible-remote"),
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
        "ANSIBLE_HOME": os.path.join(tmp, "ansible-home"),
    })
    env.setdefault("HOME", tmp)
    # ansible-core refuses a locale that is not UTF-8.
    if "UTF-8" not in (env.get("LC_ALL") or env.get("LANG") or "").upper().replace("UTF8", "UTF-8"):
        env["LC_ALL"] = "C.UTF-8"
    return env


def write_vars(tmp, build, ports, token):
    """Extra variables that keep the play inside tmp (JSON is YAML)."""
    tcp, base = ports
    ctrld_port = tcp
    while ctrld_port == tcp:
        ctrld_port = pboxtest.free_ports(1)[0]
    v = {
        "pbox_build_dir": build,
        "pbox_destdir": os.path.join(tmp, "root"),
        "pbox_conf_dir": os.path.join(tmp, "etc", "pbox"),
        "pbox_run_dir": os.path.join(tmp, "run", "pbox"),
        "pbox_state_dir": os.path.join(tmp, "var", "lib", "pbox"),
        "pbox_log_dir": os.path.join(tmp, "var", "log", "pbox"),
        "pbox_service_state_dir": os.path.join(tmp, "run", "pbox-service"),
        "pbox_sysctl_file": os.path.join(tmp, "etc", "sysctl.d", "60-pbox.conf"),
        "pbox_hugepages_sysctl_file": os.path.join(tmp, "etc", "sysctl.d", "60-hp.conf"),
        "pbox_hugepages_2m": sysctl("vm.nr_hugepages"),
        "pbox_hugepages_fstab": False,
        "pbox_sysctls": {k: sysctl(k) for k in ("net.core.rmem_max", "net.core.wmem_max",
                                                "net.core.busy_poll", "net.core.busy_read")},
        "pbox_user": USER,
        "pbox_group": USER,
        "pbox_worker_group": WORKER_GROUP,
        "pboxd_control": "127.0.0.1:%d" % tcp,
        "pboxd_base_port": base,
        "pboxd_drain_timeout": 2,
        "pboxd_restart_sec": 1,
        "pbox_local_token": token,
        "pbox_local_admin_token": token + "-pboxd-admin",
        "pbox_local_ctrld_token": token + "-ctrld-admin",
        "pbox_ctrld_run_dir": os.path.join(tmp, "run", "pbox-ctrld"),
        "pbox_ctrld_listen": "127.0.0.1:%d" % ctrld_port,
        # The service manager this host has; the test checks the runner's own behaviour
        # only where it is the one in use.
        "pbox_service_manager": "auto",
    }
    if not os.path.isdir("/dev/hugepages") or sysctl("vm.nr_hugepages") == 0:
        v["pbox_hugepages_2m"] = 0  # the role is skipped: nothing reserved to keep
    path = os.path.join(tmp, "vars.json")
    with open(path, "w") as f:
        json.dump(v, f, indent=1)
    return path, v


def play(tmp, varsfile, extra=()):
    cmd = ["ansible-playbook", "-i", "deploy/inventory/local.yml", "-c", "local",
           "deploy/site.yml", "-e", "@" + varsfile, "--skip-tags", SKIP_TAGS] + list(extra)
    t0 = time.time()
    p = subprocess.run(cmd, cwd=ROOT, env=ansible_env(tmp), capture_output=True, text=True)
    out = p.stdout + p.stderr
    m = re.search(r"localhost\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+"
                  r"failed=(\d+)", out)
    print("$ %s  (%.1f s)" % (" ".join(cmd), time.time() - t0), flush=True)
    if p.returncode != 0 or m is None:
        print(out[-6000:])
        fail("ansible-playbook exited with %d" % p.returncode)
    ok, changed, unreachable, failed = map(int, m.groups())
    print("  recap: ok=%d changed=%d failed=%d" % (ok, changed, failed), flush=True)
    return changed, out


def changed_tasks(out):
    """Names of the tasks that reported changed (for a useful failure message)."""
    names, cur = [], None
    for line in out.splitlines():
        if line.startswith("TASK [") or line.startswith("RUNNING HANDLER ["):
            cur = line.split("[", 1)[1].rsplit("]", 1)[0]
        elif line.startswith("changed:") and cur:
            names.append(cur)
    return names


def env_file(path):
    env = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                k, v = line.split("=", 1)
                env[k] = v
    return env


def wait_control(addr, timeout=15.0, what="pboxd"):
    host, port = addr.rsplit(":", 1)
    deadline = time.time() + timeout
    import socket
    while time.time() < deadline:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    fail("%s's control port %s does not answer" % (what, addr))


class Service:
    """A service (pboxd, pbox-ctrld) as the play set it up: systemd or pbox-service."""

    def __init__(self, v, systemd, name="pboxd"):
        self.v = v
        self.systemd = systemd
        self.name = name

    @property
    def runner(self):
        """pbox-service where the play installed it (PBOX_BIN_DIR of worker.env)."""
        try:
            bindir = env_file(os.path.join(self.v["pbox_conf_dir"], "worker.env"))["PBOX_BIN_DIR"]
        except (OSError, KeyError):
            return ""
        return os.path.join(bindir, "pbox-service")

    def _runner(self, action):
        return subprocess.run([self.runner, "--conf-dir", self.v["pbox_conf_dir"],
                               "--state-dir", self.v["pbox_service_state_dir"], action,
                               self.name], capture_output=True, text=True)

    def main_pid(self):
        if self.systemd:
            p = subprocess.run(["systemctl", "show", "-p", "MainPID", "--value", self.name],
                               capture_output=True, text=True)
            pid = int(p.stdout.strip() or 0)
            return pid or None
        try:
            with open(os.path.join(self.v["pbox_service_state_dir"], self.name + ".main.pid")) as f:
                return int(f.read())
        except (OSError, ValueError):
            return None

    def stop(self):
        if self.systemd:
            subprocess.run(["systemctl", "disable", "--now", self.name], capture_output=True)
            return
        if self.runner and os.path.exists(self.runner):
            print("  " + self._runner("stop").stdout.strip(), flush=True)


def proc_status(pid):
    st = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k, v = line.split(":", 1)
            st[k] = v.strip()
    return st


def check_service(svc, addr):
    pid = svc.main_pid()
    if not pid:
        fail("no %s main process after the play" % svc.name)
    st = proc_status(pid)
    uid = int(st["Uid"].split()[1])
    if pwd.getpwuid(uid).pw_name != USER:
        fail("%s runs as uid %d, not the service account %s" % (svc.name, uid, USER))
    for k in ("CapEff", "CapPrm", "CapAmb", "CapBnd"):
        if int(st[k], 16) != 0:
            fail("%s has %s=%s; it needs no capability here" % (svc.name, k, st[k]))
    wait_control(addr, what=svc.name)
    print("  %s pid %d runs as %s with no capabilities; control port %s answers" %
          (svc.name, pid, USER, addr), flush=True)
    return pid


def check_restart(svc, v, pid):
    """SIGKILL the daemon: the runner (Restart=on-failure) must start a new one."""
    os.kill(pid, 9)
    deadline = time.time() + 15
    while time.time() < deadline:
        new = svc.main_pid()
        if new and new != pid and os.path.exists("/proc/%d" % new):
            wait_control(v["pboxd_control"])
            print("  killed pid %d with SIGKILL; restarted as pid %d" % (pid, new), flush=True)
            return
        time.sleep(0.1)
    fail("pboxd was not restarted within 15 s after SIGKILL")


# The runtime job created through pbox-ctrld: job 1's settings (deploy/inventory/local.yml).
CTRLD_JOB = 4


def pbox_job(v, env, *args, pboxd=False):
    """`pbox job ...` against pbox-ctrld (its admin token file), or against the pboxd."""
    cli = os.path.join(env["PBOX_BIN_DIR"], "pbox")
    tokfile = os.path.join(v["pbox_conf_dir"], "ctrld-admin.token")
    penv = dict(os.environ, LD_LIBRARY_PATH=env["LD_LIBRARY_PATH"])
    if pboxd:
        cmd = [cli, "job", args[0], "--control", v["pboxd_control"]] + list(args[1:])
        penv["PBOX_ADMIN_TOKEN"] = v["pbox_local_admin_token"]
    else:
        cmd = [cli, "job", args[0], "--control", v["pbox_ctrld_listen"], "--admin-token-file",
               tokfile] + list(args[1:])
    p = subprocess.run(cmd, env=penv, capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        fail("%s: exit %d: %s" % (" ".join(cmd), p.returncode, p.stderr.strip()))
    return p.stdout


def ctrld_jobs(v, env):
    """pbox-ctrld's jobs {id: pboxd name or None} (`pbox job list --control --json`)."""
    reply = json.loads(pbox_job(v, env, "list", "--json"))
    return {j["id"]: j.get("pboxd") for j in reply["jobs"]}


def pboxd_jobs(v, env):
    reply = json.loads(pbox_job(v, env, "list", "--json", pboxd=True))
    return {j["id"]: j.get("origin") for j in reply["jobs"]}


def ctrld_create_job(v, token):
    env = env_file(os.path.join(v["pbox_conf_dir"], "worker.env"))
    # pboxd may just have been restarted (SIGKILL above): pbox-ctrld publishes its static
    # job 3 again within its reconcile interval.
    deadline = time.time() + 15
    while 3 not in pboxd_jobs(v, env):
        if time.time() > deadline:
            fail("pbox-ctrld's static job 3 is not on the pboxd: pboxd has %s, pbox-ctrld "
                 "%s" % (pboxd_jobs(v, env), ctrld_jobs(v, env)))
        time.sleep(0.2)
    out = pbox_job(v, env, "create", "id=%d" % CTRLD_JOB, "token=" + token, "workers=2",
                   "mode=server-optimizer", "deterministic=true", "optimizer.name=nag",
                   "optimizer.lr=0.05", "optimizer.momentum=0.9",
                   "optimizer.rescale=0.004166666666666667")
    jobs = ctrld_jobs(v, env)
    if "job %d created" % CTRLD_JOB not in out or jobs.get(CTRLD_JOB) != "localhost" or \
            CTRLD_JOB not in pboxd_jobs(v, env):
        fail("job %d through pbox-ctrld: %s; its jobs: %s; pboxd's: %s" %
             (CTRLD_JOB, out.strip(), jobs, pboxd_jobs(v, env)))
    print("  pbox job create --control %s (pbox-ctrld): job %d on pboxd localhost; "
          "pbox-ctrld's jobs %s" % (v["pbox_ctrld_listen"], CTRLD_JOB, sorted(jobs)),
          flush=True)


def smoke_train(v, token):
    env = env_file(os.path.join(v["pbox_conf_dir"], "worker.env"))
    if env["PBOX_SERVER"] != v["pboxd_control"] or env["PBOX_TOKEN"] != token:
        fail("worker.env names %s with token %s; the inventory says %s" %
             (env["PBOX_SERVER"], env["PBOX_TOKEN"], v["pboxd_control"]))
    penv = dict(os.environ, LD_LIBRARY_PATH=env["LD_LIBRARY_PATH"],
                PYTHONPATH=env["PYTHONPATH"])
    cli = os.path.join(env["PBOX_BIN_DIR"], "pbox")
    steps = 30
    procs = [subprocess.Popen([cli, "train", "--server", env["PBOX_SERVER"], "--job",
                               str(CTRLD_JOB), "--token", env["PBOX_TOKEN"], "--rank",
                               str(r), "--workers", "2", "--max-steps", str(steps), "--json"],
                              env=penv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in range(2)]
    for r, p in enumerate(procs):
        out, err = p.communicate(timeout=120)
        if p.returncode != 0:
            fail("pbox train rank %d exited with %d: %s" % (r, p.returncode, err[-1500:]))
        events = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
        done = [e for e in events if e.get("ev") == "done"]
        epochs = [e for e in events if e.get("ev") == "epoch"]
        if not done or done[0]["total_steps"] != steps or not epochs:
            fail("pbox train rank %d did not report %d steps: %s" % (r, steps, out[-800:]))
        acc = epochs[-1]["test"]["correct"] / epochs[-1]["test"]["samples"]
        # 30 steps of this MLP reach ~80 % here; 10 classes give 10 % by chance.
        if acc < 0.5:
            fail("rank %d: test accuracy %.1f%% after %d steps: it did not learn" %
                 (r, 100 * acc, steps))
        print("  pbox train rank %d, job %d (pbox-ctrld): %d steps, test accuracy %.1f%%" %
              (r, CTRLD_JOB, steps, 100 * acc), flush=True)
    # Python ranks, with nothing but the environment file: pboxd's aggregate job 2 (mean
    # of 1, 2) and pbox-ctrld's static job 3 (sum), side by side.
    code = ("import os, sys, numpy as np, pbox\n"
            "r, job, want = int(os.environ['RANK']), int(sys.argv[1]), float(sys.argv[2])\n"
            "c = pbox.Client(os.environ['PBOX_SERVER'], job, os.environ['PBOX_TOKEN'], r, 2)\n"
            "c.register({0: 4096})\n"
            "b = np.full(4096, r + 1.0, dtype=np.float32)\n"
            "c.push_pull(0, 0, b)\n"
            "assert (b == want).all(), b[:4]\n"
            "c.close() if hasattr(c, 'close') else None\n")
    pyenv = dict(os.environ)
    pyenv.update(env)
    runs = [(job, want, r) for job, want in ((2, "1.5"), (3, "3.0")) for r in range(2)]
    procs = [subprocess.Popen(["/usr/bin/python3", "-c", code, str(job), want],
                              env=dict(pyenv, RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for job, want, r in runs]
    for (job, _, r), p in zip(runs, procs):
        out, err = p.communicate(timeout=60)
        if p.returncode != 0:
            fail("Python rank %d of job %d through worker.env failed: %s" %
                 (r, job, err[-1500:]))
    print("  Python ranks (worker.env): push_pull exact on job 2 (pboxd, mean) and "
          "job 3 (pbox-ctrld, sum)", flush=True)


def existed(kind, name):
    try:
        (pwd.getpwnam if kind == "user" else grp.getgrnam)(name)
        return True
    except KeyError:
        return False


def main():
    if os.geteuid() != 0:
        skip("needs root (the play creates a service account and runs pboxd as it)")
    if shutil.which("ansible-playbook") is None:
        skip("ansible-playbook is not installed (Debian: ansible; deploy/debian-packages.sh)")
    build = os.environ.get("PBOX_BUILD_DIR")
    if not build:
        skip("PBOX_BUILD_DIR is not set (run through meson test)")
    if "libasan" in subprocess.run(["ldd", os.path.join(build, "dataplane", "pboxd")],
                                   capture_output=True, text=True).stdout:
        skip("a sanitizer build: the deployed pboxd would run under ASan as another user")
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix="pbox-deploy-")
    os.chmod(tmp, 0o755)  # the service account must reach its files below it
    created = [(k, n) for k, n in (("user", USER), ("group", USER), ("group", WORKER_GROUP))
               if not existed(k, n)]
    token = secrets.token_hex(12)
    varsfile, v = write_vars(tmp, os.path.abspath(build), pboxtest.free_ports(1), token)
    systemd = open("/proc/1/comm").read().strip() == "systemd"
    svc = Service(v, systemd)
    ctrld = Service(v, systemd, "pbox-ctrld")
    print("service manager: %s" % ("systemd" if systemd else
                                   "pbox-service (the fallback runner: PID 1 is not systemd)"),
          flush=True)
    ok = False
    try:
        changed, _ = play(tmp, varsfile)
        if changed == 0:
            fail("the first run changed nothing: it cannot have set anything up")
        pid = check_service(svc, v["pboxd_control"])
        check_service(ctrld, v["pbox_ctrld_listen"])
        if not systemd:
            check_restart(svc, v, pid)
        ctrld_create_job(v, token)
        smoke_train(v, token)
        changed, out = play(tmp, varsfile)
        if changed != 0:
            fail("the second run changed %d task(s): %s" % (changed, changed_tasks(out)))
        print("second run: changed=0", flush=True)
        ok = True
    finally:
        for s in (ctrld, svc):
            s.stop()
            pid = s.main_pid()
            if pid and os.path.exists("/proc/%d" % pid):
                print("%s pid %d still running after stop" % (s.name, pid), flush=True)
                ok = False
        for name in ("pboxd", "pbox-ctrld"):
            log = os.path.join(v["pbox_log_dir"], name + ".log")
            if not ok and os.path.exists(log):
                print("--- %s (end)\n%s" % (log, open(log).read()[-3000:]))
        for kind, name in created:
            if existed(kind, name):
                subprocess.run(["userdel" if kind == "user" else "groupdel", name],
                               capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    print("deploy test done in %.1f s" % (time.time() - t0))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
