"""Throwaway tidb-server processes (unistore) for tests, with the interface of ``MariaDB``.

    db = TiDB(tmp_path / "tidb", graceful_wait=3)
    db.start()                          # -store unistore -path <basedir>/store, free ports
    db.status()                         # 200 / 500 from the status port's /status
    db.restart()                        # SIGTERM: TiDB's graceful shutdown
    db.stop()

The binary is not built here (TiDB's module is not on the Go module proxy): the lab takes it
from ``$REPLAY_PROXY_TIDB_SERVER``, then ``~/.cache/replay-proxy/bin/tidb-server``, then PATH,
and suites that need it skip with one line when it is absent (also under CI=true: a fresh
machine cannot have it). README says how to bring one (TiDB's release tarball or tiup).

unistore keeps its data under ``-path`` across restarts, but does not sync its writes: a
SIGKILLed tidb-server may lose part of what it acknowledged (measured), so chaos suites check
exact data after SIGTERM only, and crash TiDB's SQL layer with the fault shim instead.
"""

from __future__ import annotations

import os
import signal as _signal
import subprocess
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pymysql

from tests.lab import binaries
from tests.lab.mariadb import (
    _CLIENT_DEFAULTS,
    HOST,
    ServerProcess,
    _finalize,
    _kill_group,
    _reap_orphans,
    _register,
    _unregister,
    free_port,
)
from tests.lab.procs import read_log

ENV_BINARY = "REPLAY_PROXY_TIDB_SERVER"


class TiDBError(RuntimeError):
    """The lab could not start, stop or talk to a tidb-server."""


def tidb_server_path() -> str | None:
    return binaries.find("tidb-server", ENV_BINARY)


def tidb_unavailable_reason() -> str | None:
    """None when a tidb-server binary is at hand, else the one line a skipped suite shows."""
    return binaries.missing_reason(("tidb-server",), ENV_BINARY)


def _size(value: str) -> int:
    units = {"K": 1024, "M": 1024**2, "G": 1024**3}
    return int(value[:-1]) * units[value[-1].upper()] if value[-1:].upper() in units else int(value)


class TiDB(ServerProcess):
    """One throwaway tidb-server on 127.0.0.1: SQL port ``port``, status port ``status_port``."""

    flavor = "tidb"
    error = TiDBError
    tls = None

    def __init__(self, basedir: Path, port: int | None = None, max_allowed_packet: str = "64M",
                 graceful_wait: int = 0, general_log: bool = False, extra_args: Iterable[str] = (),
                 pd: str | None = None, extra_config: str = "") -> None:  # fmt: skip
        """``graceful_wait``: TiDB's ``graceful-wait-before-shutdown`` (seconds): after SIGTERM,
        /status answers 500 this long before TiDB closes its listeners. ``general_log``: every
        statement in the log (``[instance] tidb_general_log``, on from each start). ``pd``: one
        server of a cluster (``-store tikv -path <pd>``: the data lives in the cluster's store,
        tests/lab/cluster.py) instead of its own unistore. ``extra_config``: TOML appended to
        the config file (e.g. a ``[security]`` section)."""
        self.general_log = general_log
        self.pd = pd
        self.extra_config = extra_config
        self.basedir = Path(basedir).resolve()
        self.basedir.mkdir(parents=True, exist_ok=True)
        self._port = port if port is not None else free_port()
        self.status_port = free_port()
        self.max_allowed_packet = max_allowed_packet
        self.graceful_wait = graceful_wait
        self.extra_args = list(extra_args)
        self.store = self.basedir / "store"
        self.log_path = self.basedir / "tidb.log"
        self.stdout_path = self.basedir / "tidb.out"
        self.config_path = self.basedir / "tidb.toml"
        self._socket_path = self.basedir / "tidb.sock"
        self._holder: list[subprocess.Popen | None] = [None]
        self._finalizer = weakref.finalize(self, _finalize, self._holder)
        self._log_offset = 0
        self._bootstrapped = False

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.is_running() else "stopped"
        return f"<TiDB {self.host}:{self.port} status {self.status_port} {state} {self.basedir}>"

    # -- lifecycle ---------------------------------------------------------

    def command(self) -> list[str]:
        program = tidb_server_path()
        if program is None:
            raise TiDBError(tidb_unavailable_reason() or "no tidb-server")
        return [
            program, *(("-store", "tikv", "-path", self.pd) if self.pd else ("-store", "unistore", "-path", str(self.store))),
            "-host", HOST, "-P", str(self.port),
            "-status", str(self.status_port), "-status-host", HOST, "-socket", str(self.socket_path),
            "-log-file", str(self.log_path), "-config", str(self.config_path), "-L", "info",
            *self.extra_args,
        ]  # fmt: skip

    def _write_config(self) -> None:
        self.config_path.write_text(
            f"graceful-wait-before-shutdown = {int(self.graceful_wait)}\n"
            "[log]\nslow-threshold = 3000\n"
            "[performance]\nrun-auto-analyze = false\n"
            # information_schema.DEADLOCKS: room for every deadlock of a test (default 10)
            "[pessimistic-txn]\ndeadlock-history-capacity = 10000\n"
            f"[instance]\ntidb_general_log = {'true' if self.general_log else 'false'}\n" + self.extra_config
        )

    def start(self, timeout: float = 90) -> None:
        """Start tidb-server and wait until root logs in (the first start bootstraps the store:
        several seconds)."""
        if self.is_running():
            raise TiDBError(f"{self!r} is already running")
        _reap_orphans()
        self._write_config()
        try:
            self._log_offset = self.log_path.stat().st_size
        except OSError:
            self._log_offset = 0
        try:
            self.socket_path.unlink()
        except OSError:
            pass
        cmd = self.command()
        with open(self.stdout_path, "ab") as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    cwd=self.basedir, start_new_session=True)  # fmt: skip
        self._holder[0] = proc
        _register(proc, self.store, program="tidb-server", marker=str(self.log_path))  # -log-file <it>: ours
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while True:
            rc = proc.poll()
            if rc is not None:
                _unregister(proc.pid)
                raise TiDBError(f"tidb-server exited with status {rc} during startup on port {self.port}\n"
                                f"command: {' '.join(cmd)}\n{self._startup_diagnostics()}")  # fmt: skip
            try:
                self._probe()
                break
            except (pymysql.err.Error, OSError) as e:
                last_error = e
            if time.monotonic() >= deadline:
                _kill_group(proc.pid)
                proc.wait(timeout=10)
                _unregister(proc.pid)
                raise TiDBError(f"tidb-server not ready after {timeout} s on port {self.port} "
                                f"(last probe error: {last_error!r})\n{self._startup_diagnostics()}")  # fmt: skip
            time.sleep(0.1)
        if not self._bootstrapped:
            # Global variables live in the store: set once, they survive restarts.
            self.query(f"SET GLOBAL max_allowed_packet = {_size(self.max_allowed_packet)}")
            self._bootstrapped = True

    def _probe(self) -> None:
        conn = pymysql.connect(host=HOST, port=self.port, user="root", connect_timeout=2, read_timeout=5)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1")
        finally:
            conn.close()

    def _startup_diagnostics(self) -> str:
        log = self.error_log_text()[self._log_offset :]
        parts = [f"--- {self.log_path} (this start, last 40 lines) ---", *(log.splitlines()[-40:] or ["<empty>"])]
        try:
            out = self.stdout_path.read_text(errors="replace").splitlines()[-20:]
        except OSError:
            out = []
        if out:
            parts += [f"--- {self.stdout_path} (last 20 lines) ---", *out]
        return "\n".join(parts)

    def stop(self, signal: int = _signal.SIGTERM, timeout: float = 60) -> None:
        """Send ``signal`` and wait for tidb-server to exit (SIGTERM: graceful shutdown, which
        waits up to ``graceful_wait`` + 15 s for sessions inside a transaction)."""
        proc = self._holder[0]
        if proc is None:
            return
        try:
            if proc.poll() is None:
                try:
                    proc.send_signal(signal)
                    if signal not in (_signal.SIGKILL, _signal.SIGSTOP):
                        proc.send_signal(_signal.SIGCONT)
                except ProcessLookupError:
                    pass
                try:
                    proc.wait(timeout=timeout + self.graceful_wait)
                except subprocess.TimeoutExpired:
                    _kill_group(proc.pid)
                    proc.wait(timeout=10)
                    raise TiDBError(f"tidb-server (pid {proc.pid}) did not exit within {timeout} s of "
                                    f"signal {_signal.Signals(signal).name}; killed it") from None  # fmt: skip
        finally:
            try:
                os.killpg(proc.pid, _signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            _unregister(proc.pid)

    def kill(self, timeout: float = 30) -> None:
        """SIGKILL. unistore loses unsynced writes: check no exact data after it."""
        self.stop(_signal.SIGKILL, timeout=timeout)

    def restart(self, sig: int = _signal.SIGTERM, down_for: float = 0.0, timeout: float = 60) -> None:
        self.stop(sig, timeout=timeout)
        if down_for > 0:
            time.sleep(down_for)
        self.start(timeout=max(timeout, 90))

    def pause(self) -> None:
        self._require_running().send_signal(_signal.SIGSTOP)

    def resume(self) -> None:
        self._require_running().send_signal(_signal.SIGCONT)

    def error_log_text(self) -> str:
        return read_log(self.log_path)

    def status(self, timeout: float = 2) -> int:
        """HTTP status of GET /status on the status port (500 while shutting down gracefully)."""
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.status_port}/status", timeout=timeout) as resp:
                return resp.status
        except urllib.error.HTTPError as e:
            return e.code

    # -- SQL helpers -------------------------------------------------------

    def admin(self, **kwargs: Any) -> pymysql.connections.Connection:
        """A PyMySQL connection as root over the unix socket (autocommit on)."""
        self._require_running()
        return pymysql.connect(**{"unix_socket": str(self.socket_path), "user": "root", "autocommit": True,
                                  **_CLIENT_DEFAULTS, **kwargs})  # fmt: skip

    def connect(self, user: str = "root", password: str = "", database: str | None = None,
                **kwargs: Any) -> pymysql.connections.Connection:  # fmt: skip
        return pymysql.connect(**{"host": HOST, "port": self.port, "user": user, "password": password,
                                  "database": database, **_CLIENT_DEFAULTS, **kwargs})  # fmt: skip

    def query(self, sql: str, args: Iterable[Any] | None = None) -> list[tuple]:
        conn = self.admin()
        try:
            with conn.cursor() as cur:
                cur.execute(sql, args)
                return list(cur.fetchall())
        finally:
            conn.close()

    def create_user(self, name: str, password: str, grants: str = "ALL PRIVILEGES ON *.*") -> None:
        """name@'%' with mysql_native_password (TiDB's default, and what DM's driver speaks)."""
        conn = self.admin()
        try:
            with conn.cursor() as cur:
                account = f"{conn.escape(name)}@'%'"
                cur.execute(f"CREATE USER IF NOT EXISTS {account} IDENTIFIED WITH mysql_native_password BY {conn.escape(password)}")
                cur.execute(f"ALTER USER {account} IDENTIFIED WITH mysql_native_password BY {conn.escape(password)}")
                cur.execute(f"GRANT {grants} TO {account}")
        finally:
            conn.close()
