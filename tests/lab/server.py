"""The lifecycle every server of the lab shares (MariaDB, tidb-server, PD, the store, TiProxy):

    server.start()                      # in its folder, on its ports of 127.0.0.1; returns once it serves
    server.restart(signal.SIGKILL)      # a crash; the same ports and data afterwards
    server.stop()                       # SIGTERM: its graceful shutdown

A subclass says how to run one (``command``), how to tell it serves (``probe``) and what to do
before each start (``prepare``: a config file, an initialised data folder). ``SQLServer`` adds
what the MySQL-protocol servers share: root's connections, ``query``, ``create_database``.

No server outlives the tests: each runs in a process group of its own, is killed at interpreter
exit and when its object is garbage collected, and is written to a registry
(``$TMPDIR/replay-proxy-lab``) so that the next start kills what a killed test run left behind.
Synchronous on purpose: trio tests call the blocking methods through ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import signal as _signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Self

import pymysql

from tests.lab.procs import read_log

HOST = "127.0.0.1"

# -- ports ----------------------------------------------------------------------------------

# Ports handed out by free_port() in this process, so two servers created before either binds
# do not get the same one.
_ISSUED_PORTS: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = HOST, *more_hosts: str) -> int:
    """A port that is free now (on ``host`` and each of ``more_hosts``) and outside the
    kernel's ephemeral range.

    Outside the ephemeral range because a server that is down during a restart must get its
    port back: with many reconnect attempts, an outgoing connection could otherwise be given
    that port as its source port (or even connect to itself).
    """
    lo, hi = _ephemeral_range()
    candidates = (10000, lo - 1) if lo > 12000 else (hi + 1, 65535)
    rng = random.Random()
    for _ in range(500):
        port = rng.randint(*candidates)
        if port in _ISSUED_PORTS:
            continue
        if not all(_bindable(h, port) for h in (host, *more_hosts)):
            continue
        _ISSUED_PORTS.add(port)
        return port
    raise RuntimeError(f"no free port found in {candidates[0]}-{candidates[1]} on {host}")


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


# -- the registry of live servers -----------------------------------------------------------

# Servers started by this interpreter, killed at exit even if the owning object is leaked or a
# fixture teardown never ran.
_LIVE: dict[int, subprocess.Popen] = {}
_LIVE_LOCK = threading.Lock()

# "<pid>.json" = {"owner": pid, "program": ..., "marker": ...}, so that a later run can kill
# servers whose test process died without running atexit.
_REGISTRY = Path(tempfile.gettempdir()) / "replay-proxy-lab"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (every server runs in its own session)."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, _signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _register(proc: subprocess.Popen, program: str, marker: str) -> None:
    """Remember a server process: ``program``, the name its command line starts with, and
    ``marker``, an argument of it that tells it is ours."""
    with _LIVE_LOCK:
        _LIVE[proc.pid] = proc
    try:
        _REGISTRY.mkdir(parents=True, exist_ok=True)
        (_REGISTRY / f"{proc.pid}.json").write_text(json.dumps({"owner": os.getpid(), "program": program, "marker": marker}))
    except OSError:
        pass  # best effort: the registry only helps after a hard crash


def _unregister(pid: int) -> None:
    with _LIVE_LOCK:
        _LIVE.pop(pid, None)
    try:
        (_REGISTRY / f"{pid}.json").unlink()
    except OSError:
        pass


def reap_orphans() -> None:
    """Kill the servers a lab run started whose test process is gone."""
    try:
        entries = list(_REGISTRY.glob("*.json"))
    except OSError:
        return
    for entry in entries:
        try:
            pid = int(entry.stem)
            meta = json.loads(entry.read_text())
            owner = int(meta["owner"])
            # (entries written before "marker" existed named MariaDB's data folder)
            program = meta.get("program", "mariadbd").encode()
            marker = meta.get("marker", f"--datadir={meta.get('datadir')}").encode()
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _pid_alive(owner):
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            cmdline = []
        # Only kill it if the pid still is the server we started.
        if cmdline and program in cmdline[0] and marker in cmdline:
            _kill_group(pid)
        try:
            entry.unlink()
        except OSError:
            pass


def _kill_all_at_exit() -> None:
    with _LIVE_LOCK:
        procs = list(_LIVE.values())
    for proc in procs:
        _kill_group(proc.pid)
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        _unregister(proc.pid)


atexit.register(_kill_all_at_exit)


def _finalize(holder: list[subprocess.Popen | None]) -> None:
    # Runs when a server object is garbage collected while its process still runs.
    proc = holder[0]
    if proc is not None and proc.poll() is None:
        _kill_group(proc.pid)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    if proc is not None:
        _unregister(proc.pid)


# -- one server -----------------------------------------------------------------------------


class ServerProcess:
    """One server process in ``basedir``, serving on ``port``.

    A subclass defines ``command`` and sets ``log_path`` (the server's own log, whose tail a
    failed start shows) and ``stdout_path`` (what it writes to stdout and stderr); it may
    override ``probe``, ``prepare``, ``after_start`` and ``orphan_marker``."""

    what = "server"  # the program, in messages
    error: type[Exception] = RuntimeError
    start_timeout: float = 30
    stop_timeout: float = 30
    graceful_wait: float = 0  # seconds the server waits after SIGTERM before it shuts down
    probe_interval: float = 0.05
    # What probe() raises while the server does not serve yet.
    not_serving: tuple[type[BaseException], ...] = (OSError,)
    socket_path: Path | None = None  # a unix socket, removed before each start (a SIGKILLed server leaves it)
    log_path: Path
    stdout_path: Path

    def __init__(self, basedir: Path, port: int | None = None) -> None:
        self.basedir = Path(basedir).resolve()
        self.basedir.mkdir(parents=True, exist_ok=True)
        self._port = port if port is not None else free_port()
        self._host = HOST  # the loopback address it listens on (a subclass may bind another: TiDB's host)
        self._holder: list[subprocess.Popen | None] = [None]
        self._finalizer = weakref.finalize(self, _finalize, self._holder)
        self._log_offset = 0

    # -- what a subclass defines ------------------------------------------------------------

    def command(self) -> list[str]:
        raise NotImplementedError

    def prepare(self) -> None:
        """Before each start: config files, an initialised data folder."""

    def probe(self) -> None:
        """Return once the server serves; raise one of ``not_serving`` while it does not (by
        default: it accepts a TCP connection on its port)."""
        socket.create_connection((self.host, self.port), timeout=0.5).close()

    def after_start(self) -> None:
        """After each start, once the server serves."""

    def orphan_marker(self) -> str:
        """An argument of ``command()`` that only this server's process has: an orphan whose
        command line lacks it is not ours (its pid was reused) and is left alone."""
        return str(self.log_path)

    # -- state ------------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        return self._port

    @property
    def pid(self) -> int | None:
        proc = self._holder[0]
        return proc.pid if proc is not None and proc.poll() is None else None

    def is_running(self) -> bool:
        proc = self._holder[0]
        return proc is not None and proc.poll() is None

    def _require_running(self) -> subprocess.Popen:
        proc = self._holder[0]
        if proc is None or proc.poll() is not None:
            raise self.error(f"{self!r} is not running")
        return proc

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.is_running() else "stopped"
        return f"<{type(self).__name__} {self.host}:{self.port} {state} {self.basedir}>"

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def error_log_text(self) -> str:
        """The server's whole log (all starts so far), or '' if there is none yet."""
        return read_log(self.log_path)

    # -- lifecycle --------------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> None:
        """Start the server and wait until it serves (``timeout`` seconds, default
        ``start_timeout``); on failure the error has the tail of its log."""
        timeout = self.start_timeout if timeout is None else timeout
        if self.is_running():
            raise self.error(f"{self!r} is already running")
        reap_orphans()
        self.prepare()
        try:
            self._log_offset = self.log_path.stat().st_size
        except OSError:
            self._log_offset = 0
        if self.socket_path is not None:
            self.socket_path.unlink(missing_ok=True)
        cmd = self.command()
        with open(self.stdout_path, "ab") as out:  # its own process group: killpg reaches everything
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=self.basedir,
                                    start_new_session=True)  # fmt: skip
        self._holder[0] = proc
        _register(proc, Path(cmd[0]).name, self.orphan_marker())
        deadline = time.monotonic() + timeout
        last_error: BaseException | None = None
        while True:
            rc = proc.poll()
            if rc is not None:
                _unregister(proc.pid)
                raise self.error(f"{self.what} exited with status {rc} during startup on port {self.port}\n"
                                 f"command: {' '.join(cmd)}\n{self._startup_diagnostics()}")  # fmt: skip
            try:
                self.probe()
                break
            except self.not_serving as e:
                last_error = e
            if time.monotonic() >= deadline:
                _kill_group(proc.pid)
                try:
                    proc.wait(timeout=10)
                finally:
                    _unregister(proc.pid)
                raise self.error(f"{self.what} not ready after {timeout} s on port {self.port} "
                                 f"(last probe error: {last_error!r})\n{self._startup_diagnostics()}")  # fmt: skip
            time.sleep(self.probe_interval)
        self.after_start()

    def _startup_diagnostics(self) -> str:
        log = self.error_log_text()[self._log_offset :]
        parts = [f"--- {self.log_path} (this start, last 60 lines) ---", *(log.splitlines()[-60:] or ["<empty>"])]
        out = read_log(self.stdout_path).splitlines()[-20:] if self.stdout_path != self.log_path else []
        if out:
            parts += [f"--- {self.stdout_path} (last 20 lines) ---", *out]
        return "\n".join(line[:1000] for line in parts)

    def stop(self, signal: int = _signal.SIGTERM, timeout: float | None = None) -> None:
        """Send ``signal`` and wait for the server to exit (``timeout`` seconds, default
        ``stop_timeout``, plus its ``graceful_wait``). A server still running then is SIGKILLed
        and the error raised: one that ignores SIGTERM is a lab bug."""
        timeout = self.stop_timeout if timeout is None else timeout
        proc = self._holder[0]
        if proc is None:
            return
        try:
            if proc.poll() is None:
                try:
                    proc.send_signal(signal)
                    # A paused (SIGSTOPped) server would never act on it.
                    if signal not in (_signal.SIGKILL, _signal.SIGSTOP):
                        proc.send_signal(_signal.SIGCONT)
                except ProcessLookupError:
                    pass
                try:
                    proc.wait(timeout=timeout + self.graceful_wait)
                except subprocess.TimeoutExpired:
                    _kill_group(proc.pid)
                    proc.wait(timeout=10)
                    tail = "\n".join(self.error_log_text().splitlines()[-30:])
                    raise self.error(f"{self.what} (pid {proc.pid}) did not exit within {timeout} s of "
                                     f"signal {_signal.Signals(signal).name}; killed it\n{tail}") from None  # fmt: skip
        finally:
            # Nothing else should live in its group, but never leave strays.
            try:
                os.killpg(proc.pid, _signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            _unregister(proc.pid)

    def kill(self, timeout: float | None = None) -> None:
        """SIGKILL (a crash) and wait."""
        self.stop(_signal.SIGKILL, timeout=timeout)

    def restart(self, sig: int = _signal.SIGTERM, down_for: float = 0.0, timeout: float | None = None) -> None:
        """Stop with ``sig``, stay down ``down_for`` seconds, start again on the same ports with
        the same data (a start is given at least its ``start_timeout``)."""
        self.stop(sig, timeout=timeout)
        if down_for > 0:
            time.sleep(down_for)
        self.start(timeout=max(timeout or 0, self.start_timeout))

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open but nothing is answered."""
        self._require_running().send_signal(_signal.SIGSTOP)

    def resume(self) -> None:
        """Undo pause()."""
        self._require_running().send_signal(_signal.SIGCONT)


# PyMySQL settings of the lab's own connections (admin() and connect()); callers may override.
_CLIENT_DEFAULTS: dict[str, Any] = {"connect_timeout": 10, "read_timeout": 120, "write_timeout": 120, "charset": "utf8mb4"}


class SQLServer(ServerProcess):
    """A MySQL-protocol server (MariaDB, tidb-server) with root's connections: ``admin`` over
    its unix socket, ``connect`` over TCP (over TLS when the server has ``tls``)."""

    flavor: str
    tls: tuple[str, ...] | None = None  # (ca, cert, key)
    not_serving = (OSError, pymysql.err.Error)
    socket_path: Path

    def probe(self) -> None:
        select_1(host=self.host, port=self.port, **self.tls_client_options())

    def tls_client_options(self) -> dict[str, Any]:
        """PyMySQL's ``ssl`` argument for a TLS connection to this server (empty without TLS)."""
        return {"ssl": {"ca": self.tls[0]}} if self.tls is not None else {}

    def admin(self, **kwargs: Any) -> pymysql.connections.Connection:
        """A PyMySQL connection as root over the unix socket (autocommit on)."""
        self._require_running()
        return pymysql.connect(**{"unix_socket": str(self.socket_path), "user": "root", "autocommit": True, **_CLIENT_DEFAULTS, **kwargs})

    def connect(self, user: str = "root", password: str = "", database: str | None = None, **kwargs: Any) -> pymysql.connections.Connection:
        """A PyMySQL connection over TCP to host:port (over TLS when the server has it)."""
        return pymysql.connect(**{"host": self.host, "port": self.port, "user": user, "password": password, "database": database,
                                  **_CLIENT_DEFAULTS, **self.tls_client_options(), **kwargs})  # fmt: skip

    def query(self, sql: str, args: Iterable[Any] | None = None, database: str | None = None) -> list[tuple]:
        """Run one statement as root on a fresh connection (in ``database``); return its rows."""
        conn = self.admin(database=database)
        try:
            with conn.cursor() as cur:
                cur.execute(sql, args)
                return list(cur.fetchall())
        finally:
            conn.close()

    def create_database(self, name: str) -> None:
        quoted = "`" + name.replace("`", "``") + "`"
        self.query(f"CREATE DATABASE IF NOT EXISTS {quoted} CHARACTER SET utf8mb4")


def select_1(**where: Any) -> None:
    """SELECT 1 as root on a new connection to ``where`` (raises while the server does not serve)."""
    conn = pymysql.connect(user="root", connect_timeout=2, read_timeout=5, **where)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
    finally:
        conn.close()
