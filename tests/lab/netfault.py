"""Faults below the server: a network partition of one port, and a hung server.

    with Partition(server.port):        # every TCP packet to or from the port is dropped
        ...                             # no FIN, no RST, no ACK: a cable pulled
    with Hung(server):                  # SIGSTOP: the kernel still accepts and ACKs
        ...
    with SilentListener() as silent:    # a port that accepts and never greets
        ...
    with Trickle(server.port) as t:     # a relay; t.slow = True: the server's bytes at 1/s
        ...

A partition is two netfilter rules (``iptables``, loopback, INPUT: the packets to the port and
the ones from it), inserted at the top and deleted on exit however the block ends; each carries
a comment naming the process that made it, so ``heal_all`` removes any left by a killed run and
none of a live one (a soak beside the suite). It needs root
and Debian's iptables (``scripts/setup test`` installs it); ``partition_unavailable_reason``
says in one line why not. Nothing else on the machine is touched: other ports pass.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time

__all__ = ["Partition", "Hung", "SilentListener", "Trickle", "partition_unavailable_reason", "heal_all"]

COMMENT = "replay-proxy-test-partition"


def _iptables(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["iptables", "-w", "5", *args], capture_output=True, text=True, check=check, timeout=30)


def partition_unavailable_reason() -> str | None:
    """None when rules can be made here, else the one line a skip shows."""
    if shutil.which("iptables") is None:
        return "no iptables on PATH (scripts/setup test installs Debian's iptables)"
    if os.geteuid() != 0:
        return "partitions need root (iptables rules)"
    probe = _iptables("-L", "INPUT", "-n", check=False)
    if probe.returncode != 0:
        return f"iptables does not work here: {(probe.stderr or probe.stdout).strip()[:200]}"
    return None


def _comment(pid: int | None = None) -> str:
    """The comment on this process's rules: the creator's pid lets ``heal_all`` tell a rule a
    killed run left from one another run (a soak beside the suite) still needs."""
    return f"{COMMENT} pid={pid or os.getpid()}"


def _rules(port: int) -> list[list[str]]:
    tail = ["-j", "DROP", "-m", "comment", "--comment", _comment()]
    return [["INPUT", "-i", "lo", "-p", "tcp", "--dport", str(port), *tail],
            ["INPUT", "-i", "lo", "-p", "tcp", "--sport", str(port), *tail]]  # fmt: skip


class Partition:
    """Drop every packet to and from 127.0.0.1:``port`` while the block runs (or between
    ``cut()`` and ``heal()``); ``began``/``ended``: when, in ``time.monotonic()``."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.began: float | None = None
        self.ended: float | None = None
        self._on = False

    def cut(self) -> Partition:
        for rule in _rules(self.port):
            _iptables("-I", *rule)
        self._on = True
        self.began = time.monotonic()
        return self

    def heal(self) -> None:
        if self._on:
            for rule in _rules(self.port):
                _iptables("-D", *rule, check=False)
            self._on = False
            self.ended = time.monotonic()

    def __enter__(self) -> Partition:
        return self.cut()

    def __exit__(self, *exc: object) -> None:
        self.heal()


def heal_all() -> int:
    """Delete every rule this process made and every rule a run that is gone left (a killed
    run never reached its ``heal``); rules of a live other process stay."""
    left = []
    for line in _iptables("-S", "INPUT", check=False).stdout.splitlines():
        m = re.search(rf'--comment "?{re.escape(COMMENT)}(?: pid=(\d+))?"?', line)
        if m is None or not line.startswith("-A "):
            continue
        pid = int(m.group(1)) if m.group(1) else None
        if pid is None or pid == os.getpid() or not _alive(pid):
            left.append(shlex.split(line)[1:])
    for rule in left:
        _iptables("-D", *rule, check=False)
    return len(left)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Hung:
    """The server's process stopped (SIGSTOP) while the block runs, then continued: its
    kernel keeps accepting connections and ACKing bytes, and nothing answers."""

    def __init__(self, server) -> None:
        self.server = server
        self.pid: int | None = None
        self.began: float | None = None
        self.ended: float | None = None

    def __enter__(self) -> Hung:
        self.pid = self.server.pid
        if self.pid is None:
            raise RuntimeError(f"{self.server!r} is not running")
        os.kill(self.pid, signal.SIGSTOP)
        self.began = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pid is not None:
            os.kill(self.pid, signal.SIGCONT)
            self.ended = time.monotonic()


class SilentListener:
    """A port that accepts TCP connections and never sends a byte: a server whose process
    accepts (or whose kernel's backlog does) and never greets. ``accepted``: how many."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True, name="silent-listener")

    def __enter__(self) -> SilentListener:
        self._thread.start()
        return self

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self._held.append(conn)

    def __exit__(self, *exc: object) -> None:
        self.sock.close()
        for conn in self._held:
            conn.close()


class Trickle:
    """A relay in front of a server that, while ``slow`` is set, passes the server's bytes on at
    one a second (every connection, those open before too): a server that still answers, too
    slowly to be of use. What the client sends goes through at once.

        with Trickle(server.port) as trickle:   # listens on trickle.port
            trickle.slow = True
    """

    def __init__(self, server_port: int, bytes_per_second: float = 1.0) -> None:
        self.server_port = server_port
        self.delay = 1.0 / bytes_per_second
        self.slow = False
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self._stopped = threading.Event()
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()

    def __enter__(self) -> Trickle:
        threading.Thread(target=self._accept, daemon=True, name="trickle-accept").start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        self.sock.close()
        with self._lock:
            for sock in self._open:
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in its recv
                except OSError:
                    pass
                sock.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self.sock.accept()
                server = socket.create_connection(("127.0.0.1", self.server_port), timeout=5)
            except OSError:
                if self._stopped.is_set():
                    return
                continue
            server.settimeout(None)
            with self._lock:
                self._open += [client, server]
            threading.Thread(target=self._pass, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pass, args=(server, client, True), daemon=True).start()

    def _pass(self, source: socket.socket, sink: socket.socket, trickles: bool) -> None:
        try:
            while data := source.recv(65536):
                while trickles and self.slow and data:  # set while this recv waited: counts too
                    sink.sendall(data[:1])
                    data = data[1:]
                    time.sleep(self.delay)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
            with self._lock:
                self._open = [s for s in self._open if s not in (source, sink)]
