#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The shared-memory transport (dataplane/transport/shm/) end to end.

0. appliance.shm is validated like the rest of pboxd's configuration; with fault
   injection (pboxd's `fault` or a worker's PBOX_FAULT) workers stay on UDP.
1. Selection and equivalence: `pbox demo` picks shm by itself on one host ("transport:
   shm"), and PBOX_TRANSPORT=udp forces kernel UDP; the two runs train the bit-identical
   model (deterministic summation), with pboxd's shm counters showing the traffic.
2. Hostile workers: while a job of real workers trains over shm, an admitted rank of
   another job connects to the shm socket and
     - tries to shrink the sealed memfd (refused by the kernel),
     - publishes garbage (a record of no known kind), a tail out of range, a record
       running past the tail, and (with a ring it filled) a consumer index that went
       backwards: each time pboxd ends that connection only (its socket closes), counts
       the reason (shm.broken.*), and keeps serving;
     - a hello with a wrong cookie is refused (EACCES, shm.auth_failed);
   and a real worker is killed with SIGKILL in the middle of its pushes. pboxd survives
   every one of them, and the other job's workers finish with exact results.
3. Registered memory (pbox_mem_alloc): libpbox workers whose gradients and results live
   in memory shared with pboxd (separate and in-place push-pull) get exact results, their
   pushes read in place (shm.rx_ref); a hand-written worker's regions are refused unless
   they are memfds of the announced size sealed against shrinking, bounded in count and
   bytes, cannot be truncated once registered; references past a region's end, to
   another region, of zero or too large length are dropped and counted (shm.bad_ref)
   without ending the connection; a region unregistered is unmapped and no longer read;
   a re-sent push re-reads the region; a malformed message ends the connection.
"""
import errno
import fcntl
import json
import mmap
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

from pboxtest import Pboxd, build_path, fail, run_demo, wait_for
import spoof

SHM_MAGIC, SHM_VERSION = 0x50534D31, 3
DGRAM, WRAP, DESC, REF = 0x44475231, 0x50525731, 0x44534331, 0x52454631
MEMREQ = struct.Struct("<IIIIQ")  # shm.h: struct pbox_shm_memreq
MEMREP = struct.Struct("<IIIIII")  # struct pbox_shm_memrep
MEM_REG, MEM_UNREG = 1, 2
SHMDESC = struct.Struct("<QQQII")  # ring.h: struct pbox_shm_desc
HELLO = struct.Struct("<IIIIQ")
WELCOME = struct.Struct("<IIIIQQII64Q")  # shm.h: struct pbox_shm_welcome
RING_KB = 256
# A result fragment of a shm worker is a descriptor record in its ring (64-byte record
# header, pbox header, 32-byte descriptor into the results' arena: 192 bytes), so a
# 256 KB ring (pboxd's minimum) holds ~1365 of them. The parts that need a ring to
# overflow (pboxd then holds the rest in its backlog) push one key of 8 MB: at 32 KB
# chunks of 1408-byte fragments, one iteration asks ~3000 result fragments of each core.
DESC_REC = 192
OVERFLOW_KEYS = [(0, 1 << 21)]


class ShmConn:
    """A worker's shared-memory connection, written by hand (so it can also misbehave)."""

    def __init__(self, name, job, rank, cookie):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.settimeout(10)
        self.sock.connect("\0" + name[1:] if name.startswith("@") else name)
        self.sock.send(HELLO.pack(SHM_MAGIC, SHM_VERSION, job, rank, cookie))
        msg, fds, _, _ = socket.recv_fds(self.sock, WELCOME.size, 130)
        (magic, ver, self.status, self.ncores, self.ring, self.seg, self.conn_id,
         self.nres) = WELCOME.unpack(msg)[:8]
        self.res_bytes = WELCOME.unpack(msg)[8:8 + self.nres]
        if magic != SHM_MAGIC or ver != SHM_VERSION:
            fail("shm: bad welcome %r" % (msg,))
        self.fds = fds
        self.mem = None
        if self.status != 0:
            return
        if len(fds) != self.ncores + 2 + self.nres or self.nres not in (0, self.ncores):
            fail("shm: welcome with %d descriptors for %d cores, %d results' arenas"
                 % (len(fds), self.ncores, self.nres))
        self.memfd, self.core_efd = fds[0], fds[2:2 + self.ncores]
        self.res_fd = fds[2 + self.ncores:]
        self.res_mem = [mmap.mmap(fd, n, prot=mmap.PROT_READ)
                        for fd, n in zip(self.res_fd, self.res_bytes)]
        self.ndesc = 0
        self.nstale = 0
        self.mem = mmap.mmap(self.memfd, self.seg)
        # The indices and record headers as 64-bit words: one load or store each, as
        # pboxd's C11 atomics are. struct.pack_into / unpack_from move the 8 bytes one at
        # a time: pboxd could read a head half written (it went "backwards": pboxd then
        # ends the connection as broken, bad_head), and this consumer a tail half
        # written (it then read past what was published). That tore the slow-worker case
        # under load in CI (614 of 1536 results).
        self.words = memoryview(self.mem).cast("Q")
        self.ctl = (self.ncores * 256 + 4095) // 4096 * 4096
        self.tail = [0] * self.ncores

    def close(self):
        if self.mem is not None:
            self.words.release()
            self.mem.close()
            for m in self.res_mem:
                m.close()
        for fd in self.fds:
            os.close(fd)
        self.sock.close()

    # worker -> core k: control block at k * 256, data at ctl + 2k * ring
    def w2a(self, k):
        return k * 256, self.ctl + 2 * k * self.ring

    def a2w(self, k):
        return k * 256 + 128, self.ctl + (2 * k + 1) * self.ring

    def u64(self, off):
        """The aligned 64-bit word at off, in one load."""
        assert off % 8 == 0
        return self.words[off // 8]

    def set_u64(self, off, v):
        """One 64-bit store at the aligned offset off."""
        assert off % 8 == 0
        self.words[off // 8] = v & (2**64 - 1)

    def ring_core(self, k):
        os.write(self.core_efd[k], struct.pack("<Q", 1))

    def register(self, fd, nbytes):
        """Hand pboxd a region (fd by SCM_RIGHTS, nbytes announced): (status, id)."""
        self.reg_seq = getattr(self, "reg_seq", 0) + 1
        socket.send_fds(self.sock, [MEMREQ.pack(SHM_MAGIC, MEM_REG, 0, self.reg_seq, nbytes)],
                        [fd])
        magic, op, status, rid, seq, _ = MEMREP.unpack(self.sock.recv(MEMREP.size))
        if magic != SHM_MAGIC or op != MEM_REG or seq != self.reg_seq:
            fail("shm: bad answer to a registration")
        return status, rid

    def unregister(self, rid):
        self.sock.send(MEMREQ.pack(SHM_MAGIC, MEM_UNREG, rid, 0, 0))

    def push_ref(self, k, hdr64, rid, off, ln):
        """A push whose payload stays in registered region rid at off (a reference)."""
        return self.push(k, hdr64 + struct.pack("<IIQ", rid, ln, off), kind=REF)

    def push(self, k, dgram, timeout=2.0, kind=DGRAM):
        """An honest producer: one record, published, the core woken. False if the ring
        had no room for timeout s (pboxd stopped reading it)."""
        ctl, data = self.w2a(k)
        rec = 64 + (len(dgram) + 63) // 64 * 64
        pos = self.tail[k] % self.ring
        need = rec + (self.ring - pos if pos + rec > self.ring else 0)
        deadline = time.time() + timeout
        while self.ring - (self.tail[k] - self.u64(ctl + 64)) < need:
            if time.time() > deadline:
                return False
            self.ring_core(k)
            time.sleep(0.001)
        if pos + rec > self.ring:
            self.set_u64(data + pos, WRAP << 32)
            self.tail[k] += self.ring - pos
            pos = 0
        self.mem[data + pos + 64:data + pos + 64 + len(dgram)] = dgram
        self.set_u64(data + pos, kind << 32 | len(dgram))
        self.tail[k] += rec
        self.set_u64(ctl, self.tail[k])
        self.ring_core(k)
        return True

    def peek_all(self, k):
        """Every datagram core k published and this consumer has not released (bytes
        each), the head that would release them and how many came as descriptors (taken,
        stale); nothing is given back."""
        ctl, data = self.a2w(k)
        if not hasattr(self, "head"):
            self.head = [0] * self.ncores
        out, ndesc, nstale = [], 0, 0
        head, tail = self.head[k], self.u64(ctl)
        while head != tail:
            pos = head % self.ring
            w = self.u64(data + pos)
            if w >> 32 == WRAP:
                head += self.ring - pos
                continue
            ln = w & 0xFFFFFFFF
            rec = bytes(self.mem[data + pos + 64:data + pos + 64 + ln])
            if w >> 32 == DESC:
                # A result left in place: its bytes are in core k's results' arena,
                # valid while the buffer's generation word is unchanged.
                off, gen_off, gen, plen, _ = SHMDESC.unpack_from(rec, 64)
                res = self.res_mem[k]
                pl = bytes(res[off:off + plen])
                if struct.unpack_from("<Q", res, gen_off)[0] == gen:
                    out.append(rec[:64] + pl)
                    ndesc += 1
                else:
                    nstale += 1  # rewritten since: dropped, as libpbox does
            else:
                out.append(rec)
            head += 64 + (ln + 63) // 64 * 64
        return out, head, ndesc, nstale

    def pop_all(self, k):
        """An honest consumer: every datagram core k published (bytes each), room given
        back, and the core woken if it waits for room."""
        ctl, _ = self.a2w(k)
        out, self.head[k], nd, ns = self.peek_all(k)
        self.ndesc += nd
        self.nstale += ns
        self.set_u64(ctl + 64, self.head[k])
        # libpbox reads the core's "waiting for room" flag after a full fence (ring.c:
        # pbox_shm_cons_release_wake); Python has no fence between this store and that
        # load (x86 may reorder them: a lost wake-up, and the core sleeps on its backlog),
        # so this consumer wakes the core whenever it gave room back. The wake protocol
        # itself is tested in C (test_shm_ring).
        if out:
            self.ring_core(k)
        return out

    def ended(self, timeout=10):
        """Whether pboxd closed the connection within timeout s."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(64) == b""
        except (socket.timeout, ConnectionResetError):
            return False


def shm_stats(d):
    return d.stats()["transport"]["shm"]


def part_equivalence():
    models = {}
    for t in ("shm", "udp"):
        path = os.path.join(tempfile.mkdtemp(prefix="pbox-shm-"), "model.bin")
        env = dict(os.environ, PBOX_TRANSPORT=t)
        if t == "shm":
            env.pop("PBOX_TRANSPORT")  # auto must pick shm by itself (meson sets udp)
        res = run_demo(["--epochs", "1", "--max-steps", "120", "--cores", "2",
                        "--save-model", path], 120, env=env)
        out = res.stdout + res.stderr
        if res.returncode != 0:
            fail("demo with PBOX_TRANSPORT=%s failed (%d):\n%s" %
                 (env.get("PBOX_TRANSPORT", "(auto)"), res.returncode, out[-3000:]))
        if "transport: %s\n" % t not in out:
            fail("demo with PBOX_TRANSPORT=%s: no 'transport: %s' line:\n%s" %
                 (env.get("PBOX_TRANSPORT", "(auto)"), t, out))
        # shm: every worker pushes its gradients from registered memory (pbox_mem_alloc)
        reg = re.search(r"^gradients pushed from registered memory \(not copied\): "
                        r"(\d+) of (\d+) workers$", out, re.M)
        if (t == "shm") != (reg is not None and reg.group(1) == reg.group(2) != "0"):
            fail("demo with PBOX_TRANSPORT=%s: registered gradients reported as %r:\n%s" %
                 (env.get("PBOX_TRANSPORT", "(auto)"), reg and reg.group(0), out))
        with open(path, "rb") as f:
            models[t] = f.read()
        os.unlink(path)
    if not models["shm"] or models["shm"] != models["udp"]:
        fail("shm and udp trained different models (%d / %d bytes)" %
             (len(models["shm"]), len(models["udp"])))
    print("equivalence: shm and udp trained the bit-identical model (%d bytes)" %
          len(models["shm"]))


def run_workers(d, job, token, n, keys, iters, extra=()):
    # Forced: a worker that could not set up shm fails instead of using UDP.
    env = dict(os.environ, PBOX_TRANSPORT="shm")
    return [subprocess.Popen([build_path("tests/integration/pbox-check-worker"),
                              "--server", d.control, "--job", str(job), "--token", token,
                              "--rank", str(r), "--workers", str(n), "--keys", keys,
                              "--iters", str(iters)] + list(extra),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env)
            for r in range(n)]


def push_unread(c, ten, keys, iters):
    """Push iters iterations of key 0 (each fragment asks for its result) without reading
    any result; returns how many result fragments that asks for. The caller wants the
    worker's rings to overflow: each core must answer more descriptor records than its
    ring holds (checked first; pboxd's `backlogged` then shows the overflow was used)."""
    nchunks = (keys[0][1] * 4 + ten.chunk_bytes - 1) // ten.chunk_bytes
    per_core = [0] * c.ncores
    for ch in range(nchunks):
        per_core[ten.core_map[ch]] += iters * len(ten.frags(ch))
    if max(per_core) * DESC_REC < 2 * c.ring:
        fail("push_unread: %s result fragments per core fit in rings of %d bytes (as "
             "%d-byte descriptor records): the test would not overflow them" %
             (per_core, c.ring, DESC_REC))
    want = 0
    for it in range(iters):
        for ch in range(nchunks):
            for dg in ten.push_dgrams(it, bytes(ten.chunk_len(ch)), ch,
                                      flags=spoof.F_WANT_REPLY):
                if not c.push(ten.core_map[ch], dg):
                    fail("slow worker: pboxd stopped reading its ring")
            want += len(ten.frags(ch))
    return want


def slow_worker(d, name, ten, keys):
    """A slow worker: it pushes two iterations of a key before reading any result, whose
    result fragments are more than its rings hold (as descriptor records). pboxd holds what does not fit (its backlog) and moves it in as the
    worker frees room: every fragment arrives, none is dropped, lost or refused."""
    before = shm_stats(d)
    c = ShmConn(name, 1, 0, ten.cookie)
    want = push_unread(c, ten, keys, 2)
    time.sleep(0.5)
    t0 = time.time()
    got, deadline, types = 0, t0 + 20, {}
    while got < want and time.time() < deadline:
        for k in range(c.ncores):
            for dg in c.pop_all(k):
                t = spoof.parse_hdr(dg)["type"]
                types[t] = types.get(t, 0) + 1
                got += t == spoof.DATA
        time.sleep(0.01)
    after = shm_stats(d)
    lost = {n: after[n] - before[n] for n in ("tx_full", "tx_gone")}
    lost.update({"broken." + n: after["broken"][n] - before["broken"][n]
                 for n in after["broken"]})
    if got != want or any(lost.values()):
        fail("slow worker: %d of %d result fragments (datagram types %s); counters that "
             "moved: %s" % (got, want, types, {n: v for n, v in lost.items() if v}))
    if after["backlogged"] == before["backlogged"]:
        fail("slow worker: its rings never overflowed (the test needs them to)")
    print("slow worker: %d result fragments in %.2f s; %d datagrams held back by pboxd (all "
          "connections), none dropped" %
          (got, time.time() - t0, after["backlogged"] - before["backlogged"]))
    c.close()


def backlog_lost(d, name, ten, keys):
    """A worker whose ring breaks while pboxd holds its overflow: what the backlog held is
    counted (shm.tx_gone), like every reply that never arrives. Every result fragment is
    in the ring, counted lost, or counted dropped."""
    before = shm_stats(d)
    c = ShmConn(name, 1, 0, ten.cookie)
    want = push_unread(c, ten, keys, 1)
    # Every push read by pboxd (so every result sent), some of them held back.
    wait_for(lambda: all(
        c.u64(c.w2a(k)[0] + 64) == c.tail[k] for k in range(c.ncores)),
        "pboxd to read every push")
    if shm_stats(d)["backlogged"] == before["backlogged"]:
        fail("backlog lost: the worker's rings never overflowed (the test needs them to)")
    in_ring = 0
    for k in range(c.ncores):
        # What the ring holds (read, not released), then a head past the tail.
        in_ring += sum(1 for dg in c.peek_all(k)[0]
                       if spoof.parse_hdr(dg)["type"] == spoof.DATA)
        c.set_u64(c.a2w(k)[0] + 64, 2**63)
        c.ring_core(k)
    if not c.ended():
        fail("backlog lost: pboxd did not end the connection whose head went backwards")
    c.close()
    wait_for(lambda: shm_stats(d)["broken"]["bad_head"] > before["broken"]["bad_head"],
             "bad_head counted")
    # Each core counts what its backlog held when it drops the connection, which can
    # come after the listener counted the broken ring: wait (bounded) for the counts.
    deadline = time.time() + 20
    while True:
        after = shm_stats(d)
        gone = after["tx_gone"] - before["tx_gone"]
        full = after["tx_full"] - before["tx_full"]
        if in_ring + gone + full >= want or time.time() > deadline:
            break
        time.sleep(0.05)
    if in_ring >= want or in_ring + gone + full < want:
        fail("backlog lost: %d result fragments, %d in the ring, %d counted lost, %d dropped"
             % (want, in_ring, gone, full))
    print("backlog lost: %d result fragments: %d in the ring, the other %d counted (tx_gone)"
          % (want, in_ring, want - in_ring))


def part_hostile():
    jobs = [{"id": 1, "token": "evil", "workers": 1, "mode": "aggregate"},
            {"id": 2, "token": "good", "workers": 2, "mode": "aggregate"},
            {"id": 3, "token": "victim", "workers": 1, "mode": "aggregate"},
            {"id": 4, "token": "nag", "workers": 2, "mode": "server-optimizer",
             "optimizer": {"name": "nag", "lr": 0.1, "momentum": 0.9}}]
    with Pboxd(jobs, cores=2, shm={"ring_kb": RING_KB}) as d:
        good = run_workers(d, 2, "good", 2, "1000,50000,8193", 1500)
        good += run_workers(d, 4, "nag", 2, "1000,50000,3", 300,
                            ["--server-opt", "--optimizer", "nag", "--lr", "0.1", "--async"])
        # A worker killed in the middle of its pushes (a large key keeps it busy).
        victim = run_workers(d, 3, "victim", 1, "4000000", 1000)[0]
        keys = OVERFLOW_KEYS
        ten = spoof.Tenant(d.control, 1, 0, "evil", keys, "127.0.0.1", "127.0.0.1")
        name = ten.reg.get("shm")
        if not name:
            fail("pboxd's register answer offers no shm socket: %s" % ten.reg)
        # A connection that never says hello holds a slot only for a while.
        silent = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        silent.connect("\0" + name[1:])
        t_silent = time.time()

        # A wrong cookie: refused before any memory is handed out.
        c = ShmConn(name, 1, 0, ten.cookie ^ 1)
        if c.status != errno.EACCES or c.fds:
            fail("a wrong cookie got status %d and %d descriptors" % (c.status, len(c.fds)))
        c.close()

        def hostile(label, reason, act):
            before = shm_stats(d)["broken"][reason]
            c = ShmConn(name, 1, 0, ten.cookie)
            if c.status != 0:
                fail("%s: the admitted rank was refused (%d)" % (label, c.status))
            act(c)
            if not c.ended():
                fail("%s: pboxd did not end the connection" % label)
            c.close()
            wait_for(lambda: shm_stats(d)["broken"][reason] > before, "%s counted" % label, 10)
            print("hostile %s: connection ended, counted as %s" % (label, reason))

        c = ShmConn(name, 1, 0, ten.cookie)
        try:
            os.ftruncate(c.memfd, 4096)
            fail("the worker could shrink the shared memory: it is not sealed")
        except PermissionError:
            print("hostile shrink: refused by the seal")
        c.close()

        def garbage(c):
            ctl, data = c.w2a(0)
            c.mem[data:data + 4096] = os.urandom(4096)
            c.set_u64(data, 0x1234567800000040)
            c.set_u64(ctl, 4096)
            c.ring_core(0)
        hostile("garbage", "bad_kind", garbage)

        def far_tail(c):
            ctl, _ = c.w2a(1 % c.ncores)
            c.set_u64(ctl, c.ring * 3)
            c.ring_core(1 % c.ncores)
        hostile("tail", "bad_tail", far_tail)

        def overrun(c):
            ctl, data = c.w2a(0)
            c.set_u64(data, DGRAM << 32 | 60000)
            c.set_u64(ctl, 128)
            c.ring_core(0)
        hostile("overrun", "overrun", overrun)

        slow_worker(d, name, ten, keys)
        ten.close()
        ten = spoof.Tenant(d.control, 1, 0, "evil", keys, "127.0.0.1", "127.0.0.1")
        backlog_lost(d, name, ten, keys)
        ten.close()
        ten = spoof.Tenant(d.control, 1, 0, "evil", keys, "127.0.0.1", "127.0.0.1")

        def bad_head(c):
            # Fill the worker's rings with results it never consumes (job 1 has one
            # worker: a push with WANT_REPLY is answered at once), then move its
            # consumer index backwards: pboxd finds out when it looks for room.
            nchunks = (keys[0][1] * 4 + ten.chunk_bytes - 1) // ten.chunk_bytes
            corrupted = set()
            for it in range(4):
                for ch in range(nchunks):
                    k = ten.core_map[ch]
                    for dg in ten.push_dgrams(it, bytes(ten.chunk_len(ch)), ch,
                                              flags=spoof.F_WANT_REPLY):
                        if not c.push(k, dg):
                            return  # pboxd ended it: no more reading
                    for kk in range(c.ncores):
                        actl, _ = c.a2w(kk)
                        if kk not in corrupted and c.u64(actl) != 0:
                            c.set_u64(actl + 64, 2**63)
                            corrupted.add(kk)
        hostile("head", "bad_head", bad_head)

        time.sleep(0.5)
        os.kill(victim.pid, signal.SIGKILL)
        victim.communicate(timeout=30)
        if victim.returncode != -signal.SIGKILL:
            fail("the victim worker was not running any more (exit %d)" % victim.returncode)
        print("victim worker killed mid-run")

        for r, p in enumerate(good):
            out, _ = p.communicate(timeout=180)
            sys.stdout.write(out)
            if p.returncode != 0:
                fail("worker %d of jobs 2 / 4 failed beside the hostile connections" % r)
        silent.settimeout(max(1.0, t_silent + 15 - time.time()))
        try:
            closed = silent.recv(64) == b""
        except socket.timeout:
            closed = False
        if not closed or shm_stats(d)["bad_hello"] < 1:
            fail("a connection without a hello was not closed: %s" % shm_stats(d))
        silent.close()
        print("silent connection closed after %.1f s" % (time.time() - t_silent))
        ten.close()
        wait_for(lambda: shm_stats(d)["conns_live"] == 0, "every connection ended", 30)
        st = shm_stats(d)
        print("pboxd shm counters: %s" % st)
        if st["auth_failed"] < 1 or st["rx_pkts"] == 0 or st["tx_pkts"] == 0:
            fail("shm counters do not show the traffic and the refusal: %s" % st)
        tot = d.stats()["totals"]
        if tot["iterations"] == 0:
            fail("pboxd aggregated nothing")
        out = subprocess.run([build_path("apps/pbox"), "stats", "--control",
                              d.control], capture_output=True, text=True, timeout=30,
                             env=dict(os.environ, PBOX_ADMIN_TOKEN=d.admin_token)).stdout
        shm_lines = [ln for ln in out.splitlines() if ln.startswith("shm")]
        if not shm_lines or "bad_kind=1" not in out or "overrun=1" not in out:
            fail("pbox stats shows no shm counters:\n" + out)
        print("\n".join(shm_lines))


def part_stuck_backlog():
    """A worker that reads nothing for a while: pboxd holds its overflow without spinning
    on it (its cores sleep until the worker gives room back and rings them; they polled
    the full rings at 100 % before), and delivers all of it once the worker reads."""
    jobs = [{"id": 1, "token": "t", "workers": 1, "mode": "aggregate"}]
    keys = OVERFLOW_KEYS
    with Pboxd(jobs, cores=2, shm={"ring_kb": RING_KB}) as d:
        ten = spoof.Tenant(d.control, 1, 0, "t", keys, "127.0.0.1", "127.0.0.1")
        c = ShmConn(d.stats()["transport"]["shm"]["socket"], 1, 0, ten.cookie)
        want = push_unread(c, ten, keys, 1)
        wait_for(lambda: all(
            c.u64(c.w2a(k)[0] + 64) == c.tail[k] for k in range(c.ncores)),
            "pboxd to read every push")
        if shm_stats(d)["backlogged"] == 0:
            fail("stuck backlog: the worker's rings never overflowed (the test needs them to)")
        time.sleep(0.2)
        t0 = d.stats()["totals"]
        time.sleep(1.0)
        t1 = d.stats()["totals"]
        busy = t1["busy_cycles"] - t0["busy_cycles"]
        share = busy / max(1, busy + t1["idle_cycles"] - t0["idle_cycles"])
        if share > 0.25:
            fail("stuck backlog: pboxd's cores were busy %.0f %% of a second in which the "
                 "only worker read nothing (they spin on its full rings)" % (100 * share))
        got, deadline = 0, time.time() + 20
        while got < want and time.time() < deadline:
            for k in range(c.ncores):
                got += sum(1 for dg in c.pop_all(k)
                           if spoof.parse_hdr(dg)["type"] == spoof.DATA)
            time.sleep(0.01)
        st = shm_stats(d)
        if got != want or st["tx_full"] or st["tx_gone"]:
            fail("stuck backlog: %d of %d result fragments, %d dropped, %d lost" %
                 (got, want, st["tx_full"], st["tx_gone"]))
        c.close()
        ten.close()
    print("stuck backlog: cores busy %.0f %% while the worker read nothing; then all %d "
          "result fragments" % (100 * share, want))


def paced_run(d):
    """part_paced_beside_shm's run on pboxd d: (seconds, pacer counters)."""
    ten = spoof.Tenant(d.control, 2, 0, "s", [(0, 1000)], "127.0.0.1", "127.0.0.1")
    c = ShmConn(shm_stats(d)["socket"], 2, 0, ten.cookie)
    wait_for(lambda: shm_stats(d)["conns_live"] == 1, "the idle connection listed")
    t0 = time.time()
    env = dict(os.environ, PBOX_TRANSPORT="udp")
    ps = [subprocess.Popen([build_path("tests/integration/pbox-check-worker"), "--server",
                            d.control, "--job", "1", "--token", "w", "--rank", str(r),
                            "--workers", "2", "--keys", "1000,300000", "--iters", "10"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=env) for r in range(2)]
    outs = []
    for p in ps:
        try:
            outs.append(p.communicate(timeout=60)[0])
        except subprocess.TimeoutExpired:
            p.kill()
            outs.append(p.communicate()[0])
    dt = time.time() - t0
    paced = d.stats()["transport"]["pace"]
    if any(p.returncode != 0 for p in ps):
        fail("paced beside shm: a UDP worker failed after %.1f s:\n%s" % (dt, "\n".join(outs)))
    if paced is None or paced["sent_paced"] == 0:
        fail("paced beside shm: pboxd paced nothing (PBOX_PACE=1): %s" % paced)
    # 0.2-0.3 s on a loaded 2-CPU machine, 5.5 s with two CPU hogs beside it; 101.8 s
    # before the fix.
    if dt > 40:
        fail("paced beside shm: 10 iterations took %.1f s: paced results wait for the "
             "cores' 100 ms timeout" % dt)
    c.close()
    ten.close()
    return dt, paced


def part_paced_beside_shm():
    """Result pacing (PBOX_PACE=1) while a local worker is connected: the cores then wait
    on the rings' doorbell, and that wait must end when a paced result is due (it waited
    for the next input or the 100 ms timeout: 2 UDP workers took 101.8 s for these 10
    iterations, 0.24 s with the fix)."""
    jobs = [{"id": 1, "token": "w", "workers": 2, "mode": "aggregate"},
            {"id": 2, "token": "s", "workers": 1, "mode": "aggregate"}]
    os.environ["PBOX_PACE"] = "1"
    try:
        with Pboxd(jobs, cores=2) as d:
            del os.environ["PBOX_PACE"]  # pboxd's only, not the workers'
            dt, paced = paced_run(d)
    finally:
        os.environ.pop("PBOX_PACE", None)
    print("paced beside shm: 10 iterations of 2 UDP workers in %.2f s (%d results paced)" %
          (dt, paced["sent_paced"]))


def part_results():
    """Results' arenas: every admitted worker gets, with its welcome, one sealed memfd per
    core holding its own job's result buffers: it can read its results there (the bytes
    of each result fragment it received), cannot write or resize them, and another job's
    worker gets other memory in which none of them appear."""
    jobs = [{"id": 1, "token": "a", "workers": 1, "mode": "aggregate"},
            {"id": 2, "token": "b", "workers": 1, "mode": "aggregate"}]
    with Pboxd(jobs, cores=2, shm={"ring_kb": RING_KB}) as d:
        keys = [(0, 300000)]  # several chunks: both cores own some
        ta = spoof.Tenant(d.control, 1, 0, "a", keys, "127.0.0.1", "127.0.0.1")
        tb = spoof.Tenant(d.control, 2, 0, "b", keys, "127.0.0.1", "127.0.0.1")
        name = ta.reg.get("shm")
        ca, cb = ShmConn(name, 1, 0, ta.cookie), ShmConn(name, 2, 0, tb.cookie)
        for c in (ca, cb):
            if c.status != 0 or c.nres != c.ncores:
                fail("results' arenas: status %d, %d arenas for %d cores" %
                     (c.status, c.nres, c.ncores))
        ino_a = {os.fstat(fd).st_ino for fd in ca.res_fd}
        ino_b = {os.fstat(fd).st_ino for fd in cb.res_fd}
        if len(ino_a) != ca.ncores or ino_a & ino_b:
            fail("results' arenas shared between jobs: %s / %s" % (ino_a, ino_b))
        for k, fd in enumerate(ca.res_fd):
            for label, act in (("map it writable", lambda: mmap.mmap(fd, ca.res_bytes[k])),
                               ("write it", lambda: os.pwrite(fd, b"x", 0)),
                               ("shrink it", lambda: os.ftruncate(fd, 4096)),
                               ("grow it", lambda: os.ftruncate(fd, ca.res_bytes[k] * 2))):
                try:
                    act()
                    fail("a worker could %s (core %d's results' arena)" % (label, k))
                except PermissionError:
                    pass
        ra = [mmap.mmap(fd, n, prot=mmap.PROT_READ) for fd, n in zip(ca.res_fd, ca.res_bytes)]
        rb = [mmap.mmap(fd, n, prot=mmap.PROT_READ) for fd, n in zip(cb.res_fd, cb.res_bytes)]
        nchunks = (keys[0][1] * 4 + ta.chunk_bytes - 1) // ta.chunk_bytes
        rnd = random.Random(10)
        grad = struct.pack("<%df" % keys[0][1],
                           *(rnd.uniform(1.0, 2.0) for _ in range(keys[0][1])))
        want = 0
        for ch in range(nchunks):
            off = ch * ta.chunk_bytes
            for dg in ta.push_dgrams(0, grad[off:off + ta.chunk_len(ch)], ch,
                                     flags=spoof.F_WANT_REPLY):
                if not ca.push(ta.core_map[ch], dg):
                    fail("results' arenas: pboxd stopped reading the ring")
            want += len(ta.frags(ch))
        got, deadline = [], time.time() + 20
        while len(got) < want and time.time() < deadline:
            for k in range(ca.ncores):
                got += [(k, dg) for dg in ca.pop_all(k)
                        if spoof.parse_hdr(dg)["type"] == spoof.DATA]
            time.sleep(0.01)
        if len(got) != want:
            fail("results' arenas: %d of %d result fragments" % (len(got), want))
        for k, dg in got:
            h = spoof.parse_hdr(dg)
            pl = dg[64:64 + h["frag_len"]]
            off = h["chunk"] * ta.chunk_bytes + h["frag_off"]
            if pl != grad[off:off + h["frag_len"]]:
                fail("results' arenas: chunk %d fragment at %d is not the sum" %
                     (h["chunk"], h["frag_off"]))
            if ra[k].find(pl) < 0:
                fail("results' arenas: chunk %d fragment at %d is not in core %d's arena" %
                     (h["chunk"], h["frag_off"], k))
            if any(m.find(pl) >= 0 for m in rb):
                fail("results' arenas: job 1's result is visible in job 2's arenas")
        # Job 2's arenas: its buffers' generation lines (engine/job.h: struct
        # pbox_res_line, magic first) and zeros, nothing else.
        magic = struct.pack("<Q", 0x50424F5852455331)
        for m in rb:
            for i in range(0, len(m), 64):
                line = m[i:i + 64]
                if line[:8] != magic and line != bytes(64):
                    fail("results' arenas: job 2's arenas hold bytes it never pushed "
                         "(at %d)" % i)
        # Every result came as a descriptor into the arena (no payload in the ring).
        if ca.ndesc != want or shm_stats(d).get("tx_desc", 0) < want:
            fail("results' arenas: %d of %d results as descriptors (pboxd: %s)" %
                 (ca.ndesc, want, shm_stats(d).get("tx_desc")))
        # Results not read before their buffer is reused: the worker pushes iterations
        # 1..8 of chunk 0 without reading anything, so the slots of the early ones are
        # reopened (window < 8) and their generation bumped: those descriptors are
        # dropped as stale, the last ones read the right sums.
        k0 = ta.core_map[0]
        n0, stale0 = len(ta.frags(0)), ca.nstale
        sent0 = shm_stats(d)["tx_desc"]
        for it in range(1, 9):
            pl = struct.pack("<%df" % (ta.chunk_len(0) // 4),
                             *([float(it)] * (ta.chunk_len(0) // 4)))
            for dg in ta.push_dgrams(it, pl, 0, flags=spoof.F_WANT_REPLY):
                if not ca.push(k0, dg):
                    fail("results' arenas: pboxd stopped reading the ring")
        # Read only once pboxd has answered all eight (not timing: its counter).
        wait_for(lambda: shm_stats(d)["tx_desc"] >= sent0 + 8 * n0, "pboxd's answers", 20)
        fresh, deadline = [], time.time() + 20
        while len(fresh) + ca.nstale - stale0 < 8 * n0 and time.time() < deadline:
            fresh += [dg for dg in ca.pop_all(k0) if spoof.parse_hdr(dg)["type"] == spoof.DATA]
            time.sleep(0.01)
        nstale = ca.nstale - stale0
        if nstale == 0 or len(fresh) + nstale != 8 * n0:
            fail("results' arenas: %d fresh and %d stale results of 8 iterations x %d" %
                 (len(fresh), nstale, n0))
        for dg in fresh:
            h = spoof.parse_hdr(dg)
            want_pl = struct.pack("<f", float(h["iter"])) * (h["frag_len"] // 4)
            if dg[64:] != want_pl:
                fail("results' arenas: iteration %d read other bytes" % h["iter"])
        iters = sorted({spoof.parse_hdr(dg)["iter"] for dg in fresh})
        if iters != list(range(9 - len(fresh) // n0, 9)):
            fail("results' arenas: iterations %s read, not the last ones" % iters)
        print("results' arenas: 8 iterations unread, %d stale descriptors dropped (their "
              "buffers reused), %d read with their own iteration's values" %
              (nstale, len(fresh)))
        for m in ra + rb:
            m.close()
        ca.close()
        cb.close()
        ta.close()
        tb.close()
    print("results' arenas: %d result fragments sent as descriptors, read in the job's "
          "own read-only arenas; "
          "writes, resizing and writable maps refused; another job's arenas are other "
          "memory and hold none of them" % want)


def region(nbytes, seals=fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL):
    """A memfd of nbytes, mapped, with these seals (0: none): (fd, mmap)."""
    fd = os.memfd_create("pbox-test-region", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, nbytes)
    m = mmap.mmap(fd, nbytes)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd, m


def regions_libpbox(d):
    """Real workers with registered buffers: exact results, pushes read in place."""
    for extra in (["--shm-mem"], ["--shm-mem", "--in-place", "--async"]):
        before = shm_stats(d)
        ps = run_workers(d, 2, "lib", 2, "1000,50000,300000", 20, extra)
        for p in ps:
            out, _ = p.communicate(timeout=120)
            if p.returncode != 0:
                fail("registered memory %s: a worker failed:\n%s" % (extra, out))
        after = shm_stats(d)
        nref = after["rx_ref"] - before["rx_ref"]
        # Every push datagram of a key larger than PBOX_SHM_REF_MIN (256) bytes: 2 ranks
        # x 20 iterations x the keys' fragments (at least one per 64 KB).
        least = 2 * 20 * ((50000 * 4 + 65535) // 65536 + (300000 * 4 + 65535) // 65536)
        if nref < least or after["bad_ref"] != before["bad_ref"]:
            fail("registered memory %s: %d pushes read in place (at least %d expected), "
                 "%d bad references" % (extra, nref, least,
                                        after["bad_ref"] - before["bad_ref"]))
        print("registered memory %s: exact results, %d pushes read in place by pboxd" %
              (" ".join(extra), nref))


def part_staged():
    """Payloads copied into pboxd's core-local stage before the engine reads them: encoded
    (DVF) ones always (their decoder trusts a bitmap it checked in an earlier pass), every
    one with shm.stage_pushes; results exact either way."""
    env = dict(os.environ)
    env.pop("PBOX_TRANSPORT")  # auto: shm
    res = run_demo(["--mode", "broadcast", "--dvf", "--max-steps", "30", "--cores", "2",
                    "--json"], 120, env=env)
    if res.returncode != 0:
        fail("dvf demo over shm failed (%d):\n%s" % (res.returncode, res.stderr[-3000:]))
    out = json.loads(res.stdout)
    dvf = out["appliance"].get("dvf") or {}
    if ("transport: shm\n" not in res.stdout + res.stderr or not out["ok"] or
            not dvf.get("blocks") or sum(dvf.get("rejects", {}).values()) != 0 or
            out["appliance"]["drops"].get("bad_block", 0) != 0):
        fail("dvf demo over shm: ok %s, dvf %s, drops %s\n%s" % (
            out.get("ok"), dvf, out["appliance"].get("drops"), res.stderr[-2000:]))
    print("staged: the dvf demo over shm trained, %d blocks decoded (each copied before "
          "decoding), none rejected" % dvf["blocks"])
    jobs = [{"id": 1, "token": "s", "workers": 2, "mode": "aggregate"}]
    with Pboxd(jobs, cores=2, shm={"stage_pushes": True}) as d:
        ps = run_workers(d, 1, "s", 2, "1000,300000", 10, ["--shm-mem", "--in-place"])
        for p in ps:
            o, _ = p.communicate(timeout=120)
            if p.returncode != 0:
                fail("stage_pushes: a worker failed:\n%s" % o)
        st = shm_stats(d)
        if st["staged"] < st["rx_ref"] or st["rx_ref"] == 0:
            fail("stage_pushes: %d pushes read in place, %d staged" % (st["rx_ref"],
                                                                   st["staged"]))
    print("staged: shm.stage_pushes copies every push (%d) before the engine reads it; "
          "exact results" % st["staged"])


def part_regions():
    jobs = [{"id": 1, "token": "t", "workers": 2, "mode": "aggregate", "reduce": "sum"},
            {"id": 2, "token": "lib", "workers": 2, "mode": "aggregate"}]
    keys = [(0, 300000)]  # 1.2 MB, several chunks on both cores
    mib = 1 << 20
    with Pboxd(jobs, cores=2, shm={"ring_kb": RING_KB, "max_regions": 6,
                                   "max_region_mb": 3}) as d:
        regions_libpbox(d)  # 6 regions of 2.8 MB in all per worker
        wait_for(lambda: shm_stats(d)["regions"]["live"] == 0,
                 "the libpbox workers' regions unmapped", 10)
        t0 = spoof.Tenant(d.control, 1, 0, "t", keys, "127.0.0.1", "127.0.0.1")
        t1 = spoof.Tenant(d.control, 1, 1, "t", keys, "127.0.0.1", "127.0.0.1")
        name = t0.reg.get("shm")
        c0, c1 = ShmConn(name, 1, 0, t0.cookie), ShmConn(name, 1, 1, t1.cookie)
        base = shm_stats(d)["regions"]

        def refused(label, fd, nbytes, want):
            st, _ = c0.register(fd, nbytes)
            if st != want:
                fail("regions: %s: status %d, expected %d" % (label, st, want))
            print("regions: %s refused (%s)" % (label, errno.errorcode[want]))

        # Not sealed against shrinking / not the size announced / not a memfd at all.
        fd, m = region(mib, seals=fcntl.F_SEAL_GROW)
        refused("a memfd not sealed against shrinking", fd, mib, errno.EPERM)
        os.close(fd)
        m.close()
        fd, m = region(mib)
        refused("a size other than the memfd's", fd, 2 * mib, errno.EPERM)
        os.close(fd)
        m.close()
        r, w = os.pipe()
        refused("a pipe", r, 4096, errno.EPERM)
        os.close(r)
        os.close(w)
        # A hugetlbfs memfd: a hole the worker punches would be refilled from the huge
        # page pool on pboxd's read (SIGBUS when it is empty).
        try:
            hfd = os.memfd_create("pbox-test-huge", os.MFD_HUGETLB | os.MFD_ALLOW_SEALING)
            os.ftruncate(hfd, 2 * mib)
            fcntl.fcntl(hfd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        except OSError as e:
            hfd = None
            print("regions: hugetlbfs memfd case skipped: %s" % e)
        if hfd is not None:
            refused("a hugetlbfs memfd", hfd, 2 * mib, errno.EPERM)
            os.close(hfd)
        # The region the pushes come from: 2 MiB, the gradient at 4096.
        fd, mem = region(2 * mib)
        st, rid = c0.register(fd, 2 * mib)
        if st != 0 or rid == 0:
            fail("regions: a sealed memfd was refused (%d)" % st)
        try:
            os.ftruncate(fd, 4096)
            fail("regions: a registered region could be truncated under pboxd's mapping")
        except PermissionError:
            pass
        # Limits: 3 MiB in all, 6 regions.
        fd2, m2 = region(2 * mib)
        refused("a region past max_region_mb", fd2, 2 * mib, errno.ENOSPC)
        small = []
        for _ in range(5):
            f, m = region(4096)
            st, sid = c0.register(f, 4096)
            if st != 0:
                fail("regions: small region %d refused (%d)" % (len(small), st))
            small.append((f, m, sid))
        f, m = region(4096)
        refused("a region past max_regions", f, 4096, errno.ENOSPC)
        os.close(f)
        m.close()
        os.close(fd2)
        m2.close()
        now = shm_stats(d)["regions"]
        if (now["bad"] - base["bad"] != 3 + (hfd is not None) or now["refused"] - base["refused"] != 2 or
                now["registered"] - base["registered"] != 6 or
                now["live_bytes"] - base["live_bytes"] != 2 * mib + 5 * 4096):
            fail("regions: counters %s (before %s)" % (now, base))

        # Bad references: dropped and counted, the connection lives on.
        rnd = random.Random(3)
        g0 = struct.pack("<300000f", *(float(rnd.randint(-8, 8)) for _ in range(300000)))
        g1 = struct.pack("<300000f", *(float(rnd.randint(-8, 8)) for _ in range(300000)))
        mem[4096:4096 + len(g0)] = g0
        dg0 = t0.push_dgrams(0, g0[:t0.chunk_len(0)], 0, flags=spoof.F_WANT_REPLY)[0]
        k0, ln0 = t0.core_map[0], len(dg0) - 64
        bad_before = shm_stats(d)["bad_ref"]
        bad = [("past the region's end", rid, 2 * mib - ln0 + 4, ln0),
               ("offset overflowing", rid, 2**64 - 64, ln0),
               ("another region's id", rid + 256, 4096, ln0),
               ("a region never registered", rid ^ 7, 4096, ln0),
               ("zero length", rid, 4096, 0),
               ("longer than a datagram", rid, 0, 70000)]
        for _, r_id, off, ln in bad:
            if not c0.push_ref(k0, dg0[:64], r_id, off, ln):
                fail("regions: pboxd stopped reading the ring")
        wait_for(lambda: shm_stats(d)["bad_ref"] - bad_before == len(bad),
                 "bad references counted", 10)
        if c0.ended(timeout=0.2):
            fail("regions: a bad reference ended the connection")
        print("regions: %d bad references (%s) dropped and counted, connection alive" %
              (len(bad), ", ".join(b[0] for b in bad)))

        # The exchange: rank 0 pushes by reference (the first chunk twice: a re-sent push
        # reads the region again), rank 1 by copy; every result is the exact sum.
        nchunks = (keys[0][1] * 4 + t0.chunk_bytes - 1) // t0.chunk_bytes
        ref_before = shm_stats(d)["rx_ref"]
        want, nref = 0, 0
        for ch in range(nchunks):
            off = ch * t0.chunk_bytes
            for rep in range(2 if ch == 0 else 1):
                for dg in t0.push_dgrams(0, g0[off:off + t0.chunk_len(ch)], ch,
                                         flags=spoof.F_WANT_REPLY | (
                                             spoof.F_RETRANSMIT if rep else 0)):
                    h = spoof.parse_hdr(dg)
                    if not c0.push_ref(t0.core_map[ch], dg[:64], rid,
                                       4096 + off + h["frag_off"], h["frag_len"]):
                        fail("regions: pboxd stopped reading the ring")
                    nref += 1
            for dg in t1.push_dgrams(0, g1[off:off + t1.chunk_len(ch)], ch,
                                     flags=spoof.F_WANT_REPLY):
                if not c1.push(t1.core_map[ch], dg):
                    fail("regions: pboxd stopped reading rank 1's ring")
            want += len(t0.frags(ch))
        got, deadline = {}, time.time() + 20
        while len(got) < want and time.time() < deadline:
            for k in range(c0.ncores):
                for dg in c0.pop_all(k):
                    h = spoof.parse_hdr(dg)
                    if h["type"] == spoof.DATA:
                        got[(h["chunk"], h["frag_off"])] = dg[64:64 + h["frag_len"]]
            time.sleep(0.01)
        if len(got) != want:
            fail("regions: %d of %d result fragments" % (len(got), want))
        a0 = struct.unpack("<300000f", g0)
        a1 = struct.unpack("<300000f", g1)
        for (ch, fo), pl in got.items():
            e0 = (ch * t0.chunk_bytes + fo) // 4
            n = len(pl) // 4
            exp = struct.pack("<%df" % n, *(a0[e0 + i] + a1[e0 + i] for i in range(n)))
            if pl != exp:
                fail("regions: chunk %d fragment at %d is not the sum" % (ch, fo))
        got_ref = shm_stats(d)["rx_ref"] - ref_before
        if got_ref != nref:
            fail("regions: pboxd read %d pushes in place, %d were sent" % (got_ref, nref))
        print("regions: %d result fragments exact; %d pushes read in the worker's region "
              "(a re-sent chunk among them)" % (want, nref))

        # Unregistered: unmapped once the cores moved on; a reference to it is refused.
        f, m, sid = small[0]
        live = shm_stats(d)["regions"]["live"]
        c0.unregister(sid)
        wait_for(lambda: shm_stats(d)["regions"]["live"] == live - 1, "the region unmapped", 10)
        bad_before = shm_stats(d)["bad_ref"]
        c0.push_ref(k0, dg0[:64], sid, 0, 64)
        wait_for(lambda: shm_stats(d)["bad_ref"] == bad_before + 1,
                 "a reference to an unregistered region counted", 10)
        for f, m, _ in small:
            os.close(f)
            m.close()
        # Anything but a registration ends the connection.
        c0.sock.send(MEMREQ.pack(SHM_MAGIC, 99, 0, 0, 0))
        if not c0.ended():
            fail("regions: a malformed message did not end the connection")
        print("regions: unregistered region unmapped and refused; a malformed message ends "
              "the connection")
        mem.close()
        os.close(fd)
        for c in (c0, c1):
            c.close()
        t0.close()
        t1.close()


def results_memfds(d, job):
    """How many results' memfds of job pboxd holds open (one per core of each live job
    state: they go with the state)."""
    fd_dir = "/proc/%d/fd" % d.proc.pid
    n = 0
    for fd in os.listdir(fd_dir):
        try:
            n += os.readlink(os.path.join(fd_dir, fd)).startswith(
                "/memfd:pbox-results-j%d-c" % job)
        except OSError:
            pass  # closed meanwhile
    return n


def part_session_end():
    """A session's end ends its workers' shm connections (review R1): a connection pins
    the job state it was admitted with (its descriptors point into that state's results'
    arenas), and the memory budget gives the session's bytes back when it ends; a worker
    that stays connected after its session ended (aborted, removed, a failed peer) kept
    the whole old state alive beside the next session's. Now pboxd closes the socket and
    the state goes (its results' memfds are closed); the next session connects afresh."""
    jobs = [{"id": 1, "token": "t", "workers": 1, "mode": "aggregate"}]
    keys = [(0, 300000)]
    with Pboxd(jobs, cores=2, shm={"ring_kb": RING_KB}) as d:
        ten = spoof.Tenant(d.control, 1, 0, "t", keys, "127.0.0.1", "127.0.0.1")
        c = ShmConn(shm_stats(d)["socket"], 1, 0, ten.cookie)
        if c.status != 0 or c.nres != c.ncores:
            fail("session end: status %d, %d results' arenas" % (c.status, c.nres))
        wait_for(lambda: shm_stats(d)["conns_live"] == 1, "the connection listed")
        held = results_memfds(d, 1)
        if held != c.ncores:
            fail("session end: pboxd holds %d results' memfds of job 1, not %d" %
                 (held, c.ncores))
        ten.close()  # the only member leaves: the session ends; the worker stays
        if not c.ended(10):
            fail("session end: the worker's shm connection outlived its session (it pins "
                 "the old job state: %d results' memfds still open)" % results_memfds(d, 1))
        wait_for(lambda: shm_stats(d)["conns_live"] == 0, "the connection dropped", 10)
        wait_for(lambda: results_memfds(d, 1) == 0, "the old state freed", 10)
        c.close()
        # The next session of the job: a new connection, admitted with the new state.
        ten = spoof.Tenant(d.control, 1, 0, "t", keys, "127.0.0.1", "127.0.0.1")
        c = ShmConn(shm_stats(d)["socket"], 1, 0, ten.cookie)
        if c.status != 0 or c.nres != c.ncores:
            fail("session end: the next session's worker got status %d" % c.status)
        dg = ten.push_dgrams(0, bytes(ten.chunk_len(0)), 0, flags=spoof.F_WANT_REPLY)
        for x in dg:
            if not c.push(ten.core_map[0], x):
                fail("session end: pboxd does not read the new connection's ring")
        got, deadline = 0, time.time() + 20
        while got < len(dg) and time.time() < deadline:
            got += sum(1 for x in c.pop_all(ten.core_map[0])
                       if spoof.parse_hdr(x)["type"] == spoof.DATA)
            time.sleep(0.01)
        if got != len(dg):
            fail("session end: the next session got %d of %d results" % (got, len(dg)))
        c.close()
        ten.close()
    print("session end: the worker's connection ended with its session, the old state "
          "freed; the next session connected and got its results")


def part_fd_reserve():
    """Results' memfds and the open-file limit (review R2): every (session, core) holds
    one for the session's life. Clients that used up pboxd's descriptors made
    memfd_create fail, and a legit job was refused as "not enough memory for the chunk
    state". Now a memfd never takes the last descriptors under the limit: the session
    starts without results' arenas (its results go to shm workers as copies), pboxd's log
    names the cause, and shm.res_fds counts the memfds held."""
    import resource
    jobs = [{"id": 1, "token": "t", "workers": 1, "mode": "aggregate"}]
    keys = [(0, 300000)]
    with Pboxd(jobs, cores=2, shm={"ring_kb": RING_KB}) as d:
        pid = d.proc.pid
        if shm_stats(d).get("res_fds", 0) != 0:
            fail("fd reserve: res_fds %d without a session" % shm_stats(d)["res_fds"])
        time.sleep(0.2)  # the stats connection closed
        lim = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        nopen = len(os.listdir("/proc/%d/fd" % pid))
        # Room in pboxd's descriptor budget (its 128 reserved + 2: fdbudget.h) for the
        # rank's control connection, not for memfds (they leave 64 for connections).
        if nopen + 16 > 128:
            fail("fd reserve: pboxd has %d descriptors open" % nopen)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (128 + 2, lim[1]))
        try:
            ten = spoof.Tenant(d.control, 1, 0, "t", keys, "127.0.0.1", "127.0.0.1")
        except RuntimeError as e:
            fail("fd reserve: with pboxd's descriptors used up, a job was refused: %s" % e)
        finally:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, lim)
        c = ShmConn(shm_stats(d)["socket"], 1, 0, ten.cookie)
        if c.status != 0 or c.nres != 0:
            fail("fd reserve: status %d, %d results' arenas (none could be had)" %
                 (c.status, c.nres))
        dg = ten.push_dgrams(0, bytes(ten.chunk_len(0)), 0, flags=spoof.F_WANT_REPLY)
        k = ten.core_map[0]
        for x in dg:
            if not c.push(k, x):
                fail("fd reserve: pboxd does not read the ring")
        got, deadline = 0, time.time() + 20
        while got < len(dg) and time.time() < deadline:
            got += sum(1 for x in c.pop_all(k) if spoof.parse_hdr(x)["type"] == spoof.DATA)
            time.sleep(0.01)
        if got != len(dg) or c.ndesc != 0:
            fail("fd reserve: %d of %d results, %d as descriptors" % (got, len(dg), c.ndesc))
        c.close()
        ten.close()
        with open(d.logpath) as f:
            log = f.read()
        if "out of file descriptors" not in log or "go to shared-memory workers as copies" \
                not in log:
            fail("fd reserve: pboxd's log does not name the cause:\n" + log[-2000:])
        # A session with descriptors to spare gets its arenas; they are counted.
        ten = spoof.Tenant(d.control, 1, 0, "t", keys, "127.0.0.1", "127.0.0.1")
        held = shm_stats(d)["res_fds"]
        ten.close()
        if held != 2:
            fail("fd reserve: res_fds %d with one session on 2 cores" % held)
    print("fd reserve: with descriptors used up the job started without results' arenas "
          "(%d results as copies, the cause logged); res_fds counts the memfds" % got)


def part_config():
    """appliance.shm is checked like the rest of the configuration."""
    from pboxtest import to_libconfig
    d = tempfile.mkdtemp(prefix="pbox-shm-conf-")
    conf = os.path.join(d, "pboxd.conf")
    for shm, ok in (({"ring_kb": 300}, False), ({"ring_kb": 128}, False),
                    ({"max_conns": 0}, False), ({"bogus": 1}, False),
                    ({"max_regions": 257}, False), ({"max_region_mb": 2**21}, False),
                    ({"max_regions": 0, "max_region_mb": 0}, True),
                    ({"stage_pushes": 1}, False), ({"stage_pushes": True}, True),
                    ({"enabled": False, "socket": "/run/pbox/shm.sock", "ring_kb": 1024}, True)):
        with open(conf, "w") as f:
            f.write(to_libconfig({"shm": shm}, []))
        p = subprocess.run([build_path("dataplane/pboxd"), "-c", conf, "--check-config"],
                           capture_output=True, text=True, timeout=30)
        if (p.returncode == 0) != ok or (not ok and "shm" not in p.stdout + p.stderr):
            fail("pboxd --check-config with shm = %s: exit %d, %s" %
                 (shm, p.returncode, (p.stdout + p.stderr).strip()))
    os.unlink(conf)
    os.rmdir(d)
    print("config: appliance.shm checked")


def part_fault_stays_udp():
    """Fault injection is the UDP socket's: with it on either side, workers use UDP."""
    jobs = [{"id": 1, "token": "t", "workers": 1, "mode": "aggregate"}]
    with Pboxd(jobs, cores=1, fault="drop=0.01,seed=3") as d:
        ten = spoof.Tenant(d.control, 1, 0, "t", [(0, 1000)], "127.0.0.1", "127.0.0.1")
        offered = ten.reg.get("shm")
        ten.close()
        if offered:
            fail("pboxd with fault injection offers shm (%s)" % offered)
    with Pboxd(jobs, cores=1) as d:
        env = dict(os.environ, PBOX_FAULT="drop=0.001,seed=5")
        env.pop("PBOX_TRANSPORT", None)
        p = subprocess.run([build_path("tests/integration/pbox-check-worker"), "--server",
                            d.control, "--job", "1", "--token", "t", "--rank", "0",
                            "--workers", "1", "--keys", "1000", "--iters", "3"],
                           capture_output=True, text=True, timeout=60, env=env)
        if p.returncode != 0:
            fail("worker with PBOX_FAULT failed: %s" % (p.stdout + p.stderr))
        if shm_stats(d)["accepted"] != 0:
            fail("a worker with PBOX_FAULT chose shm: %s" % shm_stats(d))
    print("fault injection: pboxd does not offer shm, a worker with PBOX_FAULT uses udp")


def main():
    part_config()
    part_fault_stays_udp()
    part_equivalence()
    part_regions()
    part_staged()
    part_stuck_backlog()
    part_paced_beside_shm()
    part_results()
    part_session_end()
    part_fd_reserve()
    part_hostile()
    print("shm: OK")


if __name__ == "__main__":
    main()
