"""Throwaway MariaDB servers for tests.

``MariaDB(basedir)`` owns one ``mariadbd`` process and its data directory:

    db = MariaDB(tmp_path / "db", max_allowed_packet="1M")
    db.start()
    db.create_user("app", "apppw")
    db.restart(signal.SIGKILL)        # crash; InnoDB recovers on start
    db.stop()

The server listens on 127.0.0.1 only, on a port that stays the same across
restarts, with durable commits (``innodb_flush_log_at_trx_commit=1``), so
chaos tests can SIGKILL it and check committed rows. Every started process is
killed at interpreter exit, and processes left behind by a test run that was
itself killed are reaped by the next ``start()``.

Synchronous on purpose: trio tests call the blocking methods through
``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import shutil
import signal as _signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Self

import pymysql

from tests.lab.procs import read_log

HOST = "127.0.0.1"

# Processes started by this interpreter, killed at exit even if the owning
# MariaDB object is leaked or a fixture teardown never ran.
_LIVE: dict[int, subprocess.Popen] = {}
_LIVE_LOCK = threading.Lock()

# Ports handed out by free_port() in this process, so two servers created
# before either binds do not get the same one.
_ISSUED_PORTS: set[int] = set()

# Records "<mariadbd pid>.json" = {"owner": pid, "datadir": ...} so a later run
# can kill servers whose pytest process died without running atexit.
_REGISTRY = Path(tempfile.gettempdir()) / "replay-proxy-lab"

_SEARCH_DIRS = ("/usr/sbin", "/usr/local/sbin", "/usr/bin", "/usr/local/bin")


class MariaDBError(RuntimeError):
    """The lab could not start, stop or talk to a MariaDB server."""


# Environment overrides, e.g. LAB_MARIADBD=/opt/mariadb/bin/mariadbd.
_OVERRIDES = {"mariadbd": "LAB_MARIADBD", "mariadb-install-db": "LAB_MARIADB_INSTALL_DB"}


def find_program(name: str) -> str | None:
    """Locate a program: its LAB_* override, PATH, then sbin dirs (mariadbd
    lives in /usr/sbin, which is not on PATH for every user)."""
    env = _OVERRIDES.get(name)
    if env and os.environ.get(env):
        path = os.environ[env]
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    found = shutil.which(name)
    if found:
        return found
    for d in _SEARCH_DIRS:
        candidate = Path(d) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def mariadb_unavailable_reason() -> str | None:
    """None if the MariaDB server binaries are installed, else why not."""
    missing = []
    for program in ("mariadbd", "mariadb-install-db"):
        if find_program(program) is None:
            env = _OVERRIDES[program]
            where = f"${env}={os.environ[env]}" if os.environ.get(env) else "PATH or /usr/sbin"
            missing.append(f"{program} not found in {where}")
    if missing:
        return "; ".join(missing) + " (Debian: apt-get install mariadb-server)"
    return None


# PyMySQL settings of the lab's own connections (admin() and connect()); callers may override.
_CLIENT_DEFAULTS: dict[str, Any] = {"connect_timeout": 10, "read_timeout": 120, "write_timeout": 120, "charset": "utf8mb4"}


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = HOST) -> int:
    """A port that is free now and outside the kernel's ephemeral range.

    Outside the ephemeral range because a server that is down during a
    restart must get its port back: with many reconnect attempts, an outgoing
    connection could otherwise be given that port as its source port (or even
    connect to itself).
    """
    lo, hi = _ephemeral_range()
    if lo > 12000:
        candidates = (10000, lo - 1)
    else:
        candidates = (hi + 1, 65535)
    rng = random.Random()
    for _ in range(500):
        port = rng.randint(*candidates)
        if port in _ISSUED_PORTS:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _ISSUED_PORTS.add(port)
        return port
    raise MariaDBError(f"no free port found in {candidates[0]}-{candidates[1]} on {host}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_group(pid: int) -> None:
    """SIGKILL the process group led by pid (mariadbd runs in its own session)."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, _signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _register(proc: subprocess.Popen, datadir: Path, program: str = "mariadbd", marker: str | None = None) -> None:
    """Remember a server process; ``marker``: the argument that tells it is ours (default
    ``--datadir=<datadir>``)."""
    with _LIVE_LOCK:
        _LIVE[proc.pid] = proc
    try:
        _REGISTRY.mkdir(parents=True, exist_ok=True)
        (_REGISTRY / f"{proc.pid}.json").write_text(
            json.dumps({"owner": os.getpid(), "datadir": str(datadir), "program": program, "marker": marker or f"--datadir={datadir}"})
        )
    except OSError:
        pass  # best effort: the registry only helps after a hard crash


def _unregister(pid: int) -> None:
    with _LIVE_LOCK:
        _LIVE.pop(pid, None)
    try:
        (_REGISTRY / f"{pid}.json").unlink()
    except OSError:
        pass


def _reap_orphans() -> None:
    """Kill server processes started by a lab run whose process is gone."""
    try:
        entries = list(_REGISTRY.glob("*.json"))
    except OSError:
        return
    for entry in entries:
        try:
            pid = int(entry.stem)
            meta = json.loads(entry.read_text())
            owner, datadir = int(meta["owner"]), meta["datadir"]
            program = meta.get("program", "mariadbd").encode()
            marker = meta.get("marker", f"--datadir={datadir}").encode()
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
    # Runs when a MariaDB object is garbage collected while still running.
    proc = holder[0]
    if proc is not None and proc.poll() is None:
        _kill_group(proc.pid)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    if proc is not None:
        _unregister(proc.pid)


class ServerProcess:
    """What the lab's servers (MariaDB here, TiDB in tests/lab/tidb.py) share: the address, the
    process, and the calls that do not depend on the server. A subclass sets ``_port``,
    ``_socket_path``, ``_holder``, ``error`` and defines ``start``, ``stop`` and ``query``."""

    error: type[Exception] = RuntimeError
    _port: int
    _socket_path: Path
    _holder: list[subprocess.Popen | None]

    @property
    def host(self) -> str:
        return HOST

    @property
    def port(self) -> int:
        return self._port

    @property
    def socket_path(self) -> Path:
        return self._socket_path

    @property
    def pid(self) -> int | None:
        proc = self._holder[0]
        return proc.pid if proc is not None and proc.poll() is None else None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def is_running(self) -> bool:
        proc = self._holder[0]
        return proc is not None and proc.poll() is None

    def _require_running(self) -> subprocess.Popen:
        proc = self._holder[0]
        if proc is None or proc.poll() is not None:
            raise self.error(f"{self!r} is not running")
        return proc

    def create_database(self, name: str) -> None:
        quoted = "`" + name.replace("`", "``") + "`"
        self.query(f"CREATE DATABASE IF NOT EXISTS {quoted} CHARACTER SET utf8mb4")


class MariaDB(ServerProcess):
    """One throwaway mariadbd, listening on 127.0.0.1:port and a unix socket."""

    flavor = "mariadb"
    error = MariaDBError

    def __init__(
        self,
        basedir: Path,
        port: int | None = None,
        max_allowed_packet: str = "64M",
        extra_args: Sequence[str] = (),
        tls: tuple[str, str, str] | None = None,
        require_secure_transport: bool = False,
    ) -> None:
        """``tls=(ca, cert, key)``: PEM files for --ssl-ca/--ssl-cert/--ssl-key (the lab's own
        TCP connections then use TLS, verifying ``ca``); ``require_secure_transport``: refuse
        plain TCP logins (the unix socket, which admin() uses, stays allowed)."""
        if require_secure_transport and tls is None:
            raise ValueError("require_secure_transport needs tls=(ca, cert, key)")
        self.tls = tuple(str(f) for f in tls) if tls is not None else None
        self.require_secure_transport = require_secure_transport
        self.basedir = Path(basedir).resolve()
        self.basedir.mkdir(parents=True, exist_ok=True)
        self._port = port if port is not None else free_port()
        self.max_allowed_packet = max_allowed_packet
        self.extra_args = list(extra_args)
        self.datadir = self.basedir / "data"
        self.pid_file = self.basedir / "mariadbd.pid"
        self.log_path = self.basedir / "error.log"
        self.stdout_path = self.basedir / "mariadbd.out"
        sock = self.basedir / "mariadbd.sock"
        if len(str(sock).encode()) > 100:
            # AF_UNIX paths are limited to 107 bytes.
            sock = Path(tempfile.mkdtemp(prefix="mdb-")) / "mariadbd.sock"
        self._socket_path = sock
        self._holder: list[subprocess.Popen | None] = [None]
        self._finalizer = weakref.finalize(self, _finalize, self._holder)
        self._log_offset = 0

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.is_running() else "stopped"
        return f"<MariaDB {self.host}:{self.port} {state} {self.basedir}>"

    # -- lifecycle ---------------------------------------------------------

    def command(self) -> list[str]:
        """The mariadbd command line."""
        cmd = [
            find_program("mariadbd") or "mariadbd",
            "--no-defaults",  # must come first
            f"--datadir={self.datadir}",
            f"--port={self.port}",
            f"--socket={self.socket_path}",
            f"--pid-file={self.pid_file}",
            f"--log-error={self.log_path}",
            f"--bind-address={HOST}",
            "--skip-name-resolve",
            "--innodb-buffer-pool-size=128M",
            "--max-connections=3000",
            f"--max-allowed-packet={self.max_allowed_packet}",
            # Durable commits: chaos tests count rows after SIGKILL.
            "--innodb-flush-log-at-trx-commit=1",
        ]
        if os.geteuid() == 0:
            cmd.insert(2, "--user=root")
        if self.tls is not None:
            ca, cert, key = self.tls
            cmd += [f"--ssl-ca={ca}", f"--ssl-cert={cert}", f"--ssl-key={key}"]
            if self.require_secure_transport:
                cmd.append("--require-secure-transport=ON")
        return cmd + self.extra_args

    def tls_client_options(self) -> dict[str, Any]:
        """PyMySQL's ``ssl`` argument for a TLS connection to this server (empty without TLS)."""
        return {"ssl": {"ca": self.tls[0]}} if self.tls is not None else {}

    def _install_db(self) -> None:
        if (self.datadir / "mysql").is_dir():
            return
        install = find_program("mariadb-install-db")
        if install is None:
            raise MariaDBError(mariadb_unavailable_reason() or "mariadb-install-db not found")
        # Initialise into a scratch dir and rename, so an interrupted run
        # never leaves a half-initialised datadir that looks complete.
        tmp = self.basedir / "data.init"
        shutil.rmtree(tmp, ignore_errors=True)
        cmd = [
            install,
            "--no-defaults",
            f"--datadir={tmp}",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
        ]
        if os.geteuid() == 0:
            cmd.append("--user=root")
        try:
            res = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=120,
                cwd=self.basedir,
            )
        except subprocess.TimeoutExpired as e:
            raise MariaDBError(f"mariadb-install-db did not finish in 120 s: {' '.join(cmd)}") from e
        if res.returncode != 0:
            out = res.stdout.decode(errors="replace")[-4000:]
            raise MariaDBError(f"mariadb-install-db failed with exit status {res.returncode}: {' '.join(cmd)}\n{out}")
        shutil.rmtree(self.datadir, ignore_errors=True)
        tmp.rename(self.datadir)

    def start(self, timeout: float = 30) -> None:
        """Start mariadbd and wait until root can log in over TCP and the socket."""
        if self.is_running():
            raise MariaDBError(f"{self!r} is already running")
        _reap_orphans()
        self._install_db()
        try:
            self._log_offset = self.log_path.stat().st_size
        except OSError:
            self._log_offset = 0
        # A stale socket file from a SIGKILLed server would make the socket
        # readiness probe fail confusingly; mariadbd recreates it.
        try:
            self.socket_path.unlink()
        except OSError:
            pass
        cmd = self.command()
        with open(self.stdout_path, "ab") as out:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.basedir,
                start_new_session=True,  # own process group: killpg reaches everything
            )
        self._holder[0] = proc
        _register(proc, self.datadir)

        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while True:
            rc = proc.poll()
            if rc is not None:
                _unregister(proc.pid)
                raise MariaDBError(
                    f"mariadbd exited with status {rc} during startup on port {self.port}\n"
                    f"command: {' '.join(cmd)}\n{self._startup_diagnostics()}"
                )
            try:
                self._probe()
                return
            except (pymysql.err.Error, OSError) as e:
                last_error = e
            if time.monotonic() >= deadline:
                _kill_group(proc.pid)
                try:
                    proc.wait(timeout=10)
                finally:
                    _unregister(proc.pid)
                raise MariaDBError(
                    f"mariadbd not ready after {timeout} s on port {self.port} "
                    f"(last probe error: {last_error!r})\n{self._startup_diagnostics()}"
                )
            time.sleep(0.05)

    def _probe(self) -> None:
        # TCP is what clients and the proxy use; the socket is what admin() uses.
        for kwargs in ({"host": HOST, "port": self.port, **self.tls_client_options()}, {"unix_socket": str(self.socket_path)}):
            conn = pymysql.connect(user="root", connect_timeout=2, read_timeout=5, **kwargs)
            try:
                with conn.cursor() as cur:
                    cur.execute("SELECT 1")
            finally:
                conn.close()

    def _startup_diagnostics(self) -> str:
        parts = []
        log = self.error_log_text()[self._log_offset :]
        parts.append(f"--- {self.log_path} (this start, last 60 lines) ---")
        parts.extend(log.splitlines()[-60:] or ["<empty>"])
        try:
            out = self.stdout_path.read_text(errors="replace").splitlines()[-20:]
        except OSError:
            out = []
        if out:
            parts.append(f"--- {self.stdout_path} (last 20 lines) ---")
            parts.extend(out)
        return "\n".join(parts)

    def stop(self, signal: int = _signal.SIGTERM, timeout: float = 30) -> None:
        """Send ``signal`` and wait for mariadbd to exit.

        If it has not exited after ``timeout`` seconds it is SIGKILLed and
        MariaDBError is raised: a server that ignores SIGTERM is a lab bug.
        """
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
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    _kill_group(proc.pid)
                    proc.wait(timeout=10)
                    raise MariaDBError(
                        f"mariadbd (pid {proc.pid}) did not exit within {timeout} s of "
                        f"signal {_signal.Signals(signal).name}; killed it\n" + "\n".join(self.error_log_text().splitlines()[-30:])
                    ) from None
        finally:
            # Nothing else should live in its group, but never leave strays.
            try:
                os.killpg(proc.pid, _signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            _unregister(proc.pid)

    def kill(self, timeout: float = 30) -> None:
        """SIGKILL (a crash: InnoDB runs recovery on the next start) and wait."""
        self.stop(_signal.SIGKILL, timeout=timeout)

    def restart(self, sig: int = _signal.SIGTERM, down_for: float = 0.0, timeout: float = 30) -> None:
        """Stop with ``sig``, stay down ``down_for`` seconds, start on the same port."""
        self.stop(sig, timeout=timeout)
        if down_for > 0:
            time.sleep(down_for)
        self.start(timeout=timeout)

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open but nothing is answered."""
        proc = self._require_running()
        proc.send_signal(_signal.SIGSTOP)

    def resume(self) -> None:
        """Undo pause()."""
        proc = self._require_running()
        proc.send_signal(_signal.SIGCONT)

    def error_log_text(self) -> str:
        """The whole error log (all starts so far), or '' if there is none yet."""
        return read_log(self.log_path)

    # -- SQL helpers -------------------------------------------------------

    def admin(self, **kwargs: Any) -> pymysql.connections.Connection:
        """A PyMySQL connection as root over the unix socket (autocommit on)."""
        self._require_running()
        return pymysql.connect(**{"unix_socket": str(self.socket_path), "user": "root", "autocommit": True, **_CLIENT_DEFAULTS, **kwargs})

    def connect(self, user: str = "root", password: str = "", database: str | None = None, **kwargs: Any) -> pymysql.connections.Connection:
        """A PyMySQL connection over TCP to 127.0.0.1:port (over TLS when the server has it)."""
        return pymysql.connect(
            **{
                "host": HOST,
                "port": self.port,
                "user": user,
                "password": password,
                "database": database,
                **_CLIENT_DEFAULTS,
                **self.tls_client_options(),
                **kwargs,
            }
        )

    def query(self, sql: str, args: Iterable[Any] | None = None) -> list[tuple]:
        """Run one statement as root on a fresh connection; return its rows."""
        conn = self.admin()
        try:
            with conn.cursor() as cur:
                cur.execute(sql, args)
                return list(cur.fetchall())
        finally:
            conn.close()

    def create_user(self, name: str, password: str, grants: str = "ALL PRIVILEGES ON *.*") -> None:
        """Create (or replace) name@'%' and name@'localhost' with
        mysql_native_password (what DM's driver and the proxy speak)."""
        conn = self.admin()
        try:
            with conn.cursor() as cur:
                for host in ("%", "localhost"):
                    account = f"{conn.escape(name)}@{conn.escape(host)}"
                    cur.execute(
                        f"CREATE OR REPLACE USER {account} IDENTIFIED VIA mysql_native_password USING PASSWORD({conn.escape(password)})"
                    )
                    cur.execute(f"GRANT {grants} TO {account}")
        finally:
            conn.close()
