# SPDX-License-Identifier: BSD-3-Clause
"""Helpers for pbox integration tests (standard library only).

    from pboxtest import Pboxd, build_path
    with Pboxd(jobs=[{"id": 1, "token": "t", "workers": 3}], cores=2) as d:
        subprocess.run([build_path("tests/integration/pbox-check-worker"), ...,
                        "--server", d.control])
        print(d.stats()["totals"]["dropped"])

Pboxd picks free ports, writes a libconfig file into a temporary directory (with a random
admin_token, which stats() sends: pboxd answers stats only to an operator), starts the
build tree's pboxd (on fresh ports if another process took one first), waits until its
control channel answers, and on exit stops it with SIGTERM, checks that it exited
cleanly and removes the directory (PBOX_KEEP_LOGS=1 keeps it and says where).
run_demo() runs `pbox demo` in a temporary TMPDIR and checks that it leaves nothing
there. Tests find the build tree through PBOX_BUILD_DIR (set by meson).
"""
import ctypes
import json
import os
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

__all__ = ["Pboxd", "build_path", "free_ports", "free_port", "to_libconfig", "control_request",
           "fail", "run_demo", "children", "alive", "check_gone", "load_libpbox", "wait_for",
           "finish", "pbox_job", "connect_from", "ask", "closed_within", "cpu_seconds",
           "starve_descriptors", "wait_answering", "print_tail", "ClientOpts", "KeyInfo",
           "ClientStats", "MIRRORS", "check_mirrors", "client_stats", "register_rank"]

START_ATTEMPTS = 3  # pboxd exits with 69 when a port was taken before it could bind it
EX_UNAVAILABLE = 69


def build_path(rel):
    """Path of a file in the meson build tree."""
    root = os.environ.get("PBOX_BUILD_DIR")
    if not root:
        here = os.path.dirname(os.path.abspath(__file__))
        root = os.path.join(here, "..", "..", "build")
    path = os.path.join(root, rel)
    if not os.path.exists(path):
        fail("%s not found (set PBOX_BUILD_DIR to the meson build directory)" % path)
    return path


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr, flush=True)
    sys.exit(1)


def load_libpbox():
    """libpbox.so loaded into this Python through ctypes. A sanitizer build's library needs
    the ASan runtime loaded first, which an uninstrumented Python cannot give it: such a
    test skips there (exit 77, meson's SKIP) and runs in the -Werror build."""
    path = build_path("dataplane/libpbox.so")
    deps = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
    if "libasan" in deps:
        print("SKIP: this build's libpbox.so is ASan-instrumented and cannot be loaded into "
              "an uninstrumented Python through ctypes (the test runs in the -Werror build)",
              flush=True)
        sys.exit(77)
    lib = ctypes.CDLL(path)
    check_mirrors(lib)
    return lib


class ClientOpts(ctypes.Structure):
    """struct pbox_client_opts (include/pbox/pbox.h), for tests that call libpbox through
    ctypes (load_libpbox()). The mirrors of pbox.h's structs live here only (MIRRORS);
    test_ctypes_mirrors checks every field's offset and size against the C struct."""
    _fields_ = [("server", ctypes.c_char_p), ("job", ctypes.c_uint32),
                ("token", ctypes.c_char_p), ("rank", ctypes.c_uint32),
                ("local_addr", ctypes.c_char_p), ("timeout_ms", ctypes.c_uint32),
                ("rto_ms", ctypes.c_uint32), ("max_inflight", ctypes.c_uint32),
                ("window_bytes", ctypes.c_uint32), ("fault", ctypes.c_char_p),
                ("busy_poll", ctypes.c_bool), ("probe", ctypes.c_char_p)]


class KeyInfo(ctypes.Structure):
    """struct pbox_key_info (include/pbox/pbox.h)."""
    _fields_ = [("id", ctypes.c_uint32), ("nelem", ctypes.c_uint64)]


class ClientStats(ctypes.Structure):
    """struct pbox_client_stats (include/pbox/pbox.h): every field a uint64_t."""
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "tx_bytes", "rx_bytes", "tx_pkts", "rx_pkts", "retransmits", "probes", "dropped",
        "ops_done", "ops_failed", "foreign", "shm_rx_desc", "shm_stale", "shm_torn",
        "shm_bad_desc", "shm_tx_full", "shm_tx_waits")]


# C struct name -> its ctypes mirror. A struct passed to libpbox through ctypes is mirrored
# here and nowhere else (test_ctypes_mirrors fails on a ctypes.Structure elsewhere).
MIRRORS = {"pbox_client_opts": ClientOpts, "pbox_key_info": KeyInfo,
           "pbox_client_stats": ClientStats}


def check_mirrors(lib):
    """Fail, naming the struct, if a mirror's size differs from the C struct's as lib was
    built (pbox_struct_size): libpbox would read or write past the Python object (memory
    corruption) instead of a clear error."""
    lib.pbox_struct_size.restype = ctypes.c_size_t
    lib.pbox_struct_size.argtypes = [ctypes.c_char_p]
    for name, mirror in MIRRORS.items():
        want = lib.pbox_struct_size(name.encode())
        if want != ctypes.sizeof(mirror):
            fail("ctypes mirror %s of struct %s is %d bytes, libpbox's is %d: update it in "
                 "tests/integration/pboxtest.py to match include/pbox/pbox.h" %
                 (mirror.__name__, name, ctypes.sizeof(mirror), want))


def client_stats(lib, c):
    """pbox_client_stats of client c, as a ClientStats (size checked by load_libpbox)."""
    st = ClientStats()
    lib.pbox_client_stats(c, ctypes.byref(st))
    return st


def free_ports(n_udp):
    """A TCP port and a run of n_udp consecutive free UDP ports on 127.0.0.1."""
    for _ in range(200):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        base = s.getsockname()[1]
        s.close()
        if base + n_udp >= 65000:
            continue
        socks = []
        try:
            for k in range(n_udp):
                u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                socks.append(u)
                u.bind(("127.0.0.1", base + k))
            t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(t)
            t.bind(("127.0.0.1", 0))
            tcp = t.getsockname()[1]
            return tcp, base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    fail("no free ports")


def free_port(kind=socket.SOCK_STREAM):
    """A port of kind (socket.SOCK_STREAM or SOCK_DGRAM) free on 127.0.0.1 just now."""
    s = socket.socket(socket.AF_INET, kind)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_for(cond, what, timeout=20, interval=0.05):
    """Poll cond() until it returns a true value, and return that; fail naming what after
    timeout seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(interval)
    fail("%s did not happen within %d s" % (what, timeout))


def finish(p, what, timeout=120, tail=300):
    """Wait for the subprocess p (text stdout, stderr merged into it); print its exit status
    and the last tail characters of its output (None: all); kill it and fail after timeout
    seconds. Returns (returncode, output)."""
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        fail("%s did not finish within %d s" % (what, timeout))
    shown = out.strip() if tail is None else out.strip()[-tail:]
    print("[%s] exit %d: %s" % (what, p.returncode, shown))
    return p.returncode, out


def pbox_job(*args, ok=True, timeout=60):
    """Run `pbox job ARGS` (output printed); fail unless it succeeds (ok) or fails (not ok).
    Returns its output (stdout and stderr)."""
    p = subprocess.run([build_path("apps/pbox"), "job"] + list(args),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    print("$ pbox job %s -> %d\n%s" % (" ".join(args)[:120], p.returncode, p.stdout.strip()))
    if (p.returncode == 0) != ok:
        fail("pbox job %s: exit %d" % (args[0], p.returncode))
    return p.stdout


def _lc_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, dict):
        return "{ " + " ".join("%s = %s;" % (k, _lc_value(x)) for k, x in v.items()) + " }"
    if isinstance(v, (list, tuple)):
        if v and all(isinstance(x, dict) for x in v):
            return "( " + ", ".join(_lc_value(x) for x in v) + " )"
        if v and all(isinstance(x, (list, tuple)) for x in v):
            return "( " + ", ".join(_lc_value(x) for x in v) + " )"
        return "[ " + ", ".join(_lc_value(x) for x in v) + " ]"
    raise TypeError("cannot express %r in libconfig" % (v,))


def to_libconfig(appliance, jobs):
    """libconfig text for an appliance group and a list of job dicts."""
    out = "appliance = %s;\n" % _lc_value(appliance)
    if jobs:
        out += "jobs = %s;\n" % _lc_value(list(jobs))
    return out


def _connect(addr, timeout):
    if addr.startswith("/"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        s.connect(addr)
        return s
    host, port = addr.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout)


def control_request(addr, obj, timeout=10.0):
    """Send one JSON request to a pboxd control address "host:port" (or its Unix control
    socket, a path); return the reply."""
    with _connect(addr, timeout) as s:
        s.sendall((json.dumps(obj) + "\n").encode())
        buf = b""
        while b"\n" not in buf:
            d = s.recv(65536)
            if not d:
                break
            buf += d
    return json.loads(buf.split(b"\n", 1)[0])


# Clients that misbehave on a control channel (the limit tests of pboxd and pbox-ctrld).
# Addresses 127.0.0.x stand for separate hosts.

def connect_from(port, src="127.0.0.1"):
    """A TCP connection to 127.0.0.1:port from the address src (10 s timeout)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((src, 0))
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    return s


def ask(s, obj):
    """Send obj (or raw bytes) on s and return the next answer line, or None at EOF."""
    s.sendall(obj if isinstance(obj, bytes) else (json.dumps(obj) + "\n").encode())
    buf = b""
    while b"\n" not in buf:
        try:
            d = s.recv(65536)
        except ConnectionResetError:
            return None
        if not d:
            return None
        buf += d
    return json.loads(buf.split(b"\n", 1)[0])


def closed_within(s, seconds):
    """True if the peer closes s within seconds (anything it sends is skipped)."""
    s.settimeout(seconds)
    deadline = time.time() + seconds
    try:
        while time.time() < deadline:
            if not s.recv(65536):
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False
    return False


def stop_process(proc, timeout=10):
    """SIGSTOP proc and return once every one of its threads is stopped: the signal is
    taken by each thread on its way back to user space, so a thread busy in a system call
    (a core's recvmmsg) may still handle a datagram after kill() returned."""
    proc.send_signal(signal.SIGSTOP)
    task = "/proc/%d/task" % proc.pid

    def all_stopped():
        try:
            for t in os.listdir(task):
                with open(os.path.join(task, t, "stat")) as f:
                    # the state follows the ")" that ends the command name
                    if f.read().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
                        return False
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended meanwhile: not running
        return True
    wait_for(all_stopped, "pid %d stopped (SIGSTOP)" % proc.pid, timeout=timeout,
             interval=0.005)


def cpu_seconds(pid):
    """User + system CPU time process pid has used so far."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def starve_descriptors(pid, port, settle, headroom=8):
    """Run process pid (listening on 127.0.0.1:port) out of descriptors below its connection
    cap: lower its open-file limit to what it has open + headroom, connect 60 times (from
    127.0.3.1..60, without waiting), and measure the CPU it uses in the next second (a loop
    spinning on accept() failing with EMFILE shows there). Then close the connections, wait
    settle seconds (for the accepted ones to time out) and restore the limit. Returns
    (CPU seconds, wall seconds) of the measurement. headroom 0: the limit is its lowest
    free descriptor number once its descriptors stopped changing, so that not even one
    accept() succeeds (a process that closes what it accepts beyond a budget of its own,
    as pboxd does, would otherwise never see EMFILE)."""
    if headroom == 0:
        def listing():
            return set(int(x) for x in os.listdir("/proc/%d/fd" % pid))
        prev = None
        for _ in range(100):
            cur = listing()
            if cur == prev:
                break
            prev = cur
            time.sleep(0.2)
        limit = min(set(range(len(cur) + 1)) - cur)
    else:
        limit = len(os.listdir("/proc/%d/fd" % pid)) + headroom
    old = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, old[1]))
    try:
        conns = []
        for i in range(60):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.3.%d" % (1 + i), 0))
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            conns.append(s)
        time.sleep(0.3)
        cpu0, t0 = cpu_seconds(pid), time.time()
        time.sleep(1.0)
        cpu, wall = cpu_seconds(pid) - cpu0, time.time() - t0
        for s in conns:
            s.close()
        time.sleep(settle)
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, old)
    return cpu, wall


def run_threads(n, fn, timeout=600):
    """Run fn(r) for r in range(n), each in its own thread (ranks of a job calling
    libpbox through ctypes); fail with the first exception a thread raised, or if one
    is still running after timeout s."""
    errors = []

    def body(r):
        try:
            fn(r)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    deadline = time.time() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.time()))
        if t.is_alive():
            fail("a rank did not finish within %d s" % timeout)
    if errors:
        fail(str(errors[0]))


def register_rank(control, job, token, keys, rank=0, may_refuse=False):
    """hello + register of keys ([(id, elements)]) as rank of job on one control connection
    to control ("host:port"), closed on return (the rank leaves without a goodbye);
    returns the register reply. Fails if the hello is refused, or the register unless
    may_refuse."""
    host, port = control.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=20) as s:
        f = s.makefile("rwb")
        for req in ({"op": "hello", "job": job, "rank": rank, "token": token, "version": 1},
                    {"op": "register", "keys": [list(k) for k in keys]}):
            f.write((json.dumps(req) + "\n").encode())
            f.flush()
            while True:
                rep = json.loads(f.readline())
                if "event" not in rep:
                    break
            if not rep.get("ok") and (req["op"] == "hello" or not may_refuse):
                fail("%s refused: %s" % (req["op"], rep))
        return rep


def wait_answering(addr, req, what, timeout=20):
    """Send req to the control address addr until something answers (a daemon starting up)
    and return its reply; fail with "WHAT did not start" after timeout seconds."""
    deadline = time.time() + timeout
    while True:
        try:
            return control_request(addr, req)
        except OSError:
            if time.time() > deadline:
                fail("%s did not start" % what)
            time.sleep(0.1)


def print_tail(path, lines, title=None):
    """Print the last lines of the file at path under a "---- TITLE (tail)" line (title:
    path when None)."""
    with open(path) as f:
        print("---- %s (tail)\n%s" % (title or path, "".join(f.readlines()[-lines:])))


def keep_logs():
    """PBOX_KEEP_LOGS set (and not "0"): keep the temporary directories for inspection."""
    return os.environ.get("PBOX_KEEP_LOGS", "") not in ("", "0")


class Pboxd:
    """A pboxd process for one test, on free loopback ports."""

    def __init__(self, jobs, cores=2, extra_args=(), **appliance):
        self.cores = cores
        self.jobs = jobs
        self.appliance = appliance
        self.dir = tempfile.mkdtemp(prefix="pboxtest-")
        self.conf = os.path.join(self.dir, "pboxd.conf")
        self.logpath = os.path.join(self.dir, "pboxd.log")
        self.args = [build_path("dataplane/pboxd"), "-c", self.conf] + list(extra_args)
        self.proc = None
        self.logf = None
        self.saved_log = None  # the log's text once the directory is gone
        self.admin_token = appliance.get("admin_token", secrets.token_hex(16))
        self.choose_ports()

    def choose_ports(self):
        """Free ports now, and the configuration file that names them."""
        self.tcp, self.base = free_ports(self.cores)
        self.control = "127.0.0.1:%d" % self.tcp
        app = {"cores": self.cores, "control": self.control, "base_port": self.base,
               "data_address": "127.0.0.1", "drain_timeout": 2,
               "admin_token": self.admin_token}
        app.update(self.appliance)
        with open(self.conf, "w") as f:
            f.write(to_libconfig(app, self.jobs))

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, et, ev, tb):
        rc = self.stop()
        if et is None and rc != 0:
            self.dump_log()
            fail("pboxd exited with status %d" % rc)
        if et is not None:
            self.dump_log()
        return False

    def start(self):
        for attempt in range(1, START_ATTEMPTS + 1):
            if attempt > 1:
                self.choose_ports()
            self.logf = open(self.logpath, "w")
            self.proc = subprocess.Popen(self.args, stdout=self.logf,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            deadline = time.time() + 20
            while time.time() < deadline and self.proc.poll() is None:
                try:
                    socket.create_connection(("127.0.0.1", self.tcp), timeout=0.5).close()
                    return
                except OSError:
                    time.sleep(0.05)
            rc = self.proc.poll()
            if rc == EX_UNAVAILABLE and attempt < START_ATTEMPTS:
                self.halt()
                print("pboxd could not set up its ports (another process took one?); "
                      "retrying on fresh ports", file=sys.stderr)
                continue
            if rc is None:
                what = "pboxd did not open its control port %s" % self.control
            else:
                what = "pboxd exited at start with status %d" % rc
            # Stop it before failing: __exit__ does not run when start() fails.
            self.stop(signal.SIGKILL)
            self.dump_log()
            fail(what)

    def stats(self):
        """Every job's and core's counters (asked over the control socket if configured,
        else with the admin token)."""
        sock = self.appliance.get("control_socket")
        if sock:
            r = control_request(sock, {"op": "stats"})
        else:
            r = control_request(self.control, {"op": "stats",
                                               "admin_token": self.admin_token})
        if r.get("ok") is not True:
            fail("pboxd refused the stats request: %s" % r)
        return r

    def stop(self, sig=signal.SIGTERM, timeout=30):
        """Stop pboxd (sig, then SIGKILL after timeout s) and return its exit status; then
        remove the temporary directory, keeping the log's text for log() and dump_log()."""
        try:
            return self.halt(sig, timeout)
        finally:
            self.remove_dir()

    def halt(self, sig=signal.SIGTERM, timeout=30):
        """stop() without removing the directory."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self.logf.close()
                self.proc = None
                self.dump_log()
                fail("pboxd did not stop within %d s of signal %d" % (timeout, sig))
        self.logf.close()
        rc = self.proc.returncode
        self.proc = None
        return rc

    def remove_dir(self):
        if self.dir is None:
            return
        if keep_logs():
            print("pboxd configuration and log kept in %s" % self.dir, file=sys.stderr)
        else:
            try:
                self.saved_log = self.log()
            except OSError:
                self.saved_log = ""
            shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None

    def log(self):
        if self.saved_log is not None:
            return self.saved_log
        with open(self.logpath) as f:
            return f.read()

    def dump_log(self):
        try:
            sys.stderr.write("---- pboxd log ----\n" + self.log() + "-------------------\n")
        except OSError:
            pass


def children(pid):
    """(pid, cmdline) of the direct children of pid."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name) as f:
                stat = f.read()
            with open("/proc/%s/cmdline" % name, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append((int(name), cmd))
    return out


def alive(pid, cmd):
    """Process pid still runs cmd (and is not a zombie)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            now = f.read().replace(b"\0", b" ").decode(errors="replace")
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return now == cmd and state != "Z"


def check_gone(kids, tmpdir, what):
    """Fail unless every (pid, cmdline) of kids ends within 5 s (those left are killed)
    and tmpdir (None: not checked) is empty."""
    deadline = time.time() + 5
    while time.time() < deadline and any(alive(k, c) for k, c in kids):
        time.sleep(0.1)
    left = [c for k, c in kids if alive(k, c)]
    if left:
        for k, c in kids:
            if alive(k, c):
                os.kill(k, signal.SIGKILL)
        fail("%s: processes left behind: %s" % (what, left))
    if tmpdir is not None and os.listdir(tmpdir):
        fail("%s: temporary files left behind: %s" % (what, os.listdir(tmpdir)))


PR_SET_CHILD_SUBREAPER = 36


def become_subreaper():
    """Make processes orphaned below this one its children instead of init's, so that
    whatever a command leaves running shows up in children(os.getpid())."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        fail("prctl(PR_SET_CHILD_SUBREAPER): %s" % os.strerror(ctypes.get_errno()))


def run_demo(args, timeout, env=None, watch=False):
    """Run `pbox demo ARGS` with TMPDIR set to a fresh temporary directory and return the
    subprocess.CompletedProcess (text stdout and stderr; the caller checks returncode).
    Past timeout seconds the demo gets SIGTERM (it then stops its children and removes its
    files), SIGKILL 15 s later, and the test fails. The test fails too if the demo leaves
    files in TMPDIR (unless ARGS has --keep-logs). With watch, the result's kids lists the
    (pid, cmdline) of every child of the demo seen while it ran and every process it left
    behind, for check_gone(); the caller must have no other children then."""
    cmd = [build_path("apps/pbox"), "demo"] + list(args)
    kids = {}
    if watch:
        become_subreaper()
    with tempfile.TemporaryDirectory(prefix="pboxtest-demo-") as tmpdir:
        denv = dict(os.environ if env is None else env, TMPDIR=tmpdir)
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=denv) as p:
            if watch:
                # Sample the children while the demo runs; communicate() collects the
                # output on its own threads meanwhile.
                done = threading.Event()

                def sample():
                    # A zombie's cmdline is empty: keep what the process ran.
                    while not done.is_set():
                        kids.update((k, c) for k, c in children(p.pid) if c)
                        done.wait(0.01)

                sampler = threading.Thread(target=sample, daemon=True)
                sampler.start()
            try:
                out, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGTERM)
                try:
                    out, err = p.communicate(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    out, err = p.communicate()
                sys.stderr.write(err[-4000:])
                fail("pbox demo %s did not finish within %d s (stopped with SIGTERM: exit "
                     "%d)" % (" ".join(args), timeout, p.returncode))
            finally:
                if watch:
                    done.set()
                    sampler.join()
        if watch:
            kids.update((k, c) for k, c in children(os.getpid()) if alive(k, c))
        left = os.listdir(tmpdir)
        if left and "--keep-logs" not in args:
            fail("pbox demo %s left %s in its TMPDIR" % (" ".join(args), left))
    res = subprocess.CompletedProcess(cmd, p.returncode, out, err)
    res.kids = sorted(kids.items())
    return res
