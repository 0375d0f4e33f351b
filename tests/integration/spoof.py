# SPDX-License-Identifier: BSD-3-Clause
"""Spoofing and reflection attacks on pbox's data plane, for the integration tests
(standard library only).

  * hdr() / parse_hdr(): the 64-byte pbox header of include/pbox/wire.h.
  * udp_ports(pid): the local UDP ports a process holds (/proc/PID/fd -> socket inodes ->
    /proc/PID/net/udp), e.g. a training worker's data-plane socket.
  * Sniffer(ports): the latest headers of pbox datagrams to those ports, as an attacker on
    the path sees them (cookies travel in the clear). Needs CAP_NET_RAW (an AF_PACKET
    socket on lo).
  * Forger: sends well-formed DATA / ACK datagrams, as if from the appliance, to workers
    from other addresses (127.0.0.x, other ports).
  * Tenant: joins a job over the JSON control protocol as a real rank (hello + register),
    so it holds a real session cookie, and speaks the data plane from a UDP socket of its
    own (the address the appliance pins) or from a thief's.
"""
import json
import os
import random
import select
import socket
import struct
import threading
import time

MAGIC = 0x50424F58
VERSION = 1
HDR_LEN = 64
HDR = struct.Struct("!IBBHIIQIIIHBBIIIIQ")
assert HDR.size == HDR_LEN

PUSH, PULL, INIT, DATA, ACK, ERROR = 1, 2, 3, 4, 5, 6
F_WANT_REPLY, F_RETRANSMIT, F_CRC = 1, 2, 4
ENC_NONE, ENC_F32 = 0, 1
SENDER_APPLIANCE = 0xFFFFFFFF
FIELDS = ("magic", "version", "type", "flags", "job", "sender", "cookie", "chunk", "iter",
          "frag_off", "frag_len", "encoding", "hdr_len", "chunk_len", "seq", "arg0", "arg1",
          "reserved")


def hdr(type, job, sender, cookie, chunk, iter, chunk_len, frag_off=0, frag_len=0, flags=0,
        seq=0, arg0=0, arg1=0):
    """A pbox header (big-endian fields, include/pbox/wire.h)."""
    return HDR.pack(MAGIC, VERSION, type, flags, job, sender, cookie, chunk, iter, frag_off,
                    frag_len, ENC_F32 if frag_len else ENC_NONE, HDR_LEN, chunk_len, seq, arg0,
                    arg1, 0)


def parse_hdr(b):
    """The header of datagram b as a dict, or None if it is not a pbox datagram."""
    if len(b) < HDR_LEN:
        return None
    h = dict(zip(FIELDS, HDR.unpack_from(b)))
    if h["magic"] != MAGIC or h["version"] != VERSION:
        return None
    return h


def udp_ports(pid):
    """Local (address, port) of every UDP socket process pid holds."""
    inodes = set()
    fd_dir = "/proc/%d/fd" % pid
    for fd in os.listdir(fd_dir):
        try:
            link = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    out = []
    with open("/proc/%d/net/udp" % pid) as f:
        next(f)
        for line in f:
            cols = line.split()
            if cols[9] in inodes:
                addr, port = cols[1].split(":")
                ip = socket.inet_ntoa(struct.pack("<I", int(addr, 16)))
                out.append((ip, int(port, 16)))
    return out


ETH_P_ALL = 3


class Sniffer:
    """Watches, as an attacker on the path would (cookies travel in the clear), the pbox
    datagrams of want_types sent to the UDP ports `ports` on lo, keeping the latest headers
    per port and chunk: latest[port] = {chunk: header dict}. start() returns False if this
    process may not capture (no CAP_NET_RAW). A small receive buffer read every few ms
    keeps what it sees recent, at little CPU."""

    def __init__(self, ports, want_types=(DATA, ACK)):
        self.ports = set(ports)
        self.want = want_types
        self.latest = {p: {} for p in ports}
        self.seen = 0
        self.sock = None
        self.thread = None
        self.halt = threading.Event()

    def start(self):
        try:
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM,
                                      socket.htons(ETH_P_ALL))
        except PermissionError:
            return False
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        self.sock.bind(("lo", 0))
        self.sock.setblocking(False)
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return True

    def run(self):
        while not self.halt.wait(0.003):
            for _ in range(64):
                try:
                    pkt = self.sock.recv(65535)
                except BlockingIOError:
                    break
                self.take(pkt)

    def take(self, pkt):
        if len(pkt) < 28 or pkt[0] >> 4 != 4 or pkt[9] != 17:
            return
        ihl = (pkt[0] & 15) * 4
        dport = struct.unpack_from("!H", pkt, ihl + 2)[0]
        if dport not in self.ports:
            return
        h = parse_hdr(pkt[ihl + 8:])
        if h is not None and h["type"] in self.want and h["sender"] == SENDER_APPLIANCE:
            self.latest[dport][h["chunk"]] = h
            self.seen += 1

    def wait_all(self, timeout):
        """Whether every port has had a datagram seen within timeout s."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if all(self.latest.values()):
                return True
            time.sleep(0.05)
        return False

    def stop(self):
        self.halt.set()
        if self.thread is not None:
            self.thread.join()
            self.sock.close()


class Forger:
    """Forged appliance replies to workers: for each target port, DATA of random payload
    and ACKs shaped like the latest datagrams seen to it (by a Sniffer: right job, cookie,
    chunk, geometry; iteration and sequence guesses from the one seen on), or with guessed
    cookies when nothing can be seen, sent from addresses that are not the appliance's
    data-plane endpoint."""

    SOURCES = ("127.0.0.10", "127.0.0.1")  # the last: the appliance's address, another port

    def __init__(self, targets, sniffer, job_of_port):
        self.targets = targets  # [(ip, port)]
        self.sniffer = sniffer  # None: cookies are guessed
        self.job_of_port = job_of_port
        self.sent = 0
        self.socks = []
        for src in self.SOURCES:
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            u.bind((src, 0))
            u.setblocking(False)
            self.socks.append(u)
        self.rng = random.Random(4242)

    def templates(self, port):
        if self.sniffer is not None:
            return list(self.sniffer.latest[port].values())[-4:]
        # Nothing seen: the job is known, the cookie is a guess.
        return [{"job": self.job_of_port[port], "cookie": self.rng.getrandbits(64),
                 "chunk": c, "iter": 0, "chunk_len": 32768, "frag_off": 0, "frag_len": 1408,
                 "seq": 0} for c in range(2)]

    def burst(self):
        for ip, port in self.targets:
            for h in self.templates(port):
                for k in range(3):
                    it = (h["iter"] + k) & 0xFFFFFFFF
                    seq = (h["seq"] + k) & 0xFFFFFFFF
                    data = hdr(DATA, h["job"], SENDER_APPLIANCE, h["cookie"], h["chunk"], it,
                               h["chunk_len"], h["frag_off"], h["frag_len"], seq=seq,
                               arg0=seq)
                    data += os.urandom(h["frag_len"])
                    ack = hdr(ACK, h["job"], SENDER_APPLIANCE, h["cookie"], h["chunk"], it,
                              h["chunk_len"], seq=seq, arg0=seq, arg1=2)
                    for u in self.socks:
                        for d in (data, ack):
                            try:
                                u.sendto(d, (ip, port))
                                self.sent += 1
                            except (BlockingIOError, ConnectionRefusedError):
                                pass

    def run(self, stop, pause=0.01):
        while not stop.wait(pause):
            self.burst()

    def close(self):
        for u in self.socks:
            u.close()


class Tenant:
    """A rank of a job, joined by this process over the control protocol."""

    def __init__(self, control, job, rank, token, keys, ctl_from, data_from):
        host, port = control.rsplit(":", 1)
        self.ctl = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.ctl.bind((ctl_from, 0))
        self.ctl.settimeout(30)
        self.ctl.connect((host, int(port)))
        self.buf = b""
        self.job, self.rank = job, rank
        r = self.call({"op": "hello", "job": job, "rank": rank, "token": token,
                       "version": 1})
        if r.get("ok") is not True:
            raise RuntimeError("hello refused: %s" % r)
        self.reg = self.call({"op": "register", "keys": [list(k) for k in keys]})
        if self.reg.get("ok") is not True:
            raise RuntimeError("register refused: %s" % self.reg)
        self.cookie = int(self.reg["cookie"], 16)
        self.chunk_bytes = self.reg["chunk_bytes"]
        self.frag_bytes = self.reg["frag_bytes"]
        self.addr = self.reg["data_addr"]
        if self.addr == "0.0.0.0":
            self.addr = "127.0.0.1"
        self.ports = self.reg["ports"]
        self.core_map = self.reg["core_map"]
        self.nbytes = keys[0][1] * 4
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.pinger = threading.Thread(target=self.ping, daemon=True)
        self.pinger.start()
        self.data = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.data.bind((data_from, 0))
        self.seq = 0

    def call(self, obj):
        self.ctl.sendall((json.dumps(obj) + "\n").encode())
        while b"\n" not in self.buf:
            d = self.ctl.recv(65536)
            if not d:
                raise ConnectionResetError("pboxd closed the control connection")
            self.buf += d
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def ping(self):
        # The liveness heartbeat (pboxd answers nothing to it).
        while not self.stop.wait(0.3):
            with self.lock:
                try:
                    self.ctl.sendall(b'{"op":"ping"}\n')
                except OSError:
                    return

    def close(self):
        self.stop.set()
        self.pinger.join()
        with self.lock:
            try:
                self.call({"op": "leave"})
            except (OSError, ValueError):
                pass
            self.ctl.close()
        self.data.close()

    def endpoint(self, chunk=0):
        return (self.addr, self.ports[self.core_map[chunk]])

    def chunk_len(self, chunk=0):
        return min(self.chunk_bytes, self.nbytes - chunk * self.chunk_bytes)

    def frags(self, chunk=0):
        n = self.chunk_len(chunk)
        return [(off, min(self.frag_bytes, n - off)) for off in range(0, n, self.frag_bytes)]

    def push_dgrams(self, it, payload, chunk=0, flags=0):
        """The PUSH datagrams of chunk `chunk`, iteration it, values `payload` (bytes)."""
        self.seq += 1
        return [hdr(PUSH, self.job, self.rank, self.cookie, chunk, it, self.chunk_len(chunk),
                    off, ln, flags=flags, seq=self.seq) + payload[off:off + ln]
                for off, ln in self.frags(chunk)]

    def pull_dgram(self, it, chunk=0, flags=0):
        self.seq += 1
        return hdr(PULL, self.job, self.rank, self.cookie, chunk, it, self.chunk_len(chunk),
                   flags=flags, seq=self.seq)


def recv_all(sock, timeout, until=None):
    """Datagrams (bytes, from) arriving at sock within timeout s (or until until(list) is
    true)."""
    got = []
    deadline = time.time() + timeout
    p = select.poll()  # not select(): the hostile test holds more than 1,024 descriptors
    p.register(sock, select.POLLIN)
    while True:
        left = deadline - time.time()
        if left <= 0 or (until is not None and until(got)):
            return got
        if p.poll(left * 1000):
            got.append(sock.recvfrom(65536))
