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

Its lifecycle (and the reaping of servers a killed run left behind) is the lab's one,
tests/lab/server.py.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from tests.lab import binaries
from tests.lab.server import HOST, SQLServer, free_port

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


class TiDB(SQLServer):
    """One throwaway tidb-server on 127.0.0.1: SQL port ``port``, status port ``status_port``.
    The first start bootstraps the store (several seconds); SIGTERM is TiDB's graceful
    shutdown, which waits up to ``graceful_wait`` + 15 s for sessions inside a transaction."""

    what = "tidb-server"
    flavor = "tidb"
    error = TiDBError
    start_timeout = 90
    stop_timeout = 60
    probe_interval = 0.1

    def __init__(self, basedir: Path, port: int | None = None, max_allowed_packet: str = "64M",
                 graceful_wait: int = 0, general_log: bool = False, extra_args: Iterable[str] = (),
                 pd: str | None = None, extra_config: str = "", host: str = HOST, status_port: int | None = None) -> None:  # fmt: skip
        """``graceful_wait``: TiDB's ``graceful-wait-before-shutdown`` (seconds): after SIGTERM,
        /status answers 500 this long before TiDB closes its listeners. ``general_log``: every
        statement in the log (``[instance] tidb_general_log``, on from each start). ``pd``: one
        server of a cluster (``-store tikv -path <pd>``: the data lives in the cluster's store,
        tests/lab/cluster.py) instead of its own unistore. ``extra_config``: TOML appended to
        the config file (e.g. a ``[security]`` section). ``host``: the loopback address it
        binds (127.0.0.2, ...: servers of a cluster on one port, each at its own address, as
        pods are; ``move_to`` gives it another)."""
        super().__init__(basedir, port)
        self._host = host
        self.general_log = general_log
        self.pd = pd
        self.extra_config = extra_config
        self.status_port = status_port if status_port is not None else free_port()
        self.max_allowed_packet = max_allowed_packet
        self.graceful_wait = graceful_wait
        self.extra_args = list(extra_args)
        self.store = self.basedir / "store"
        self.log_path = self.basedir / "tidb.log"
        self.stdout_path = self.basedir / "tidb.out"
        self.config_path = self.basedir / "tidb.toml"
        self.socket_path = self.basedir / "tidb.sock"
        self._bootstrapped = False

    def command(self) -> list[str]:
        program = tidb_server_path()
        if program is None:
            raise TiDBError(tidb_unavailable_reason() or "no tidb-server")
        return [
            program, *(("-store", "tikv", "-path", self.pd) if self.pd else ("-store", "unistore", "-path", str(self.store))),
            "-host", self.host, "-P", str(self.port),
            "-status", str(self.status_port), "-status-host", self.host, "-socket", str(self.socket_path),
            "-log-file", str(self.log_path), "-config", str(self.config_path), "-L", "info",
            *self.extra_args,
        ]  # fmt: skip

    def prepare(self) -> None:
        """The config file (written at each start)."""
        self.config_path.write_text(
            f"graceful-wait-before-shutdown = {int(self.graceful_wait)}\n"
            "[log]\nslow-threshold = 3000\n"
            "[performance]\nrun-auto-analyze = false\n"
            # information_schema.DEADLOCKS: room for every deadlock of a test (default 10)
            "[pessimistic-txn]\ndeadlock-history-capacity = 10000\n"
            f"[instance]\ntidb_general_log = {'true' if self.general_log else 'false'}\n" + self.extra_config
        )

    def after_start(self) -> None:
        if not self._bootstrapped:
            # Global variables live in the store: set once, they survive restarts.
            self.query(f"SET GLOBAL max_allowed_packet = {_size(self.max_allowed_packet)}")
            self._bootstrapped = True

    def move_to(self, host: str) -> None:
        """Listen on ``host`` from the next start on (a pod that comes back on a new address;
        the server must be stopped)."""
        if self.is_running():
            raise TiDBError(f"{self!r} is running: stop it before it moves to {host}")
        self._host = host
        if "-advertise-address" in self.extra_args:  # what it registers in PD
            self.extra_args[self.extra_args.index("-advertise-address") + 1] = host

    def kill(self, timeout: float | None = None) -> None:
        """SIGKILL. unistore loses unsynced writes: check no exact data after it."""
        super().kill(timeout)

    def status(self, timeout: float = 2) -> int:
        """HTTP status of GET /status on the status port (500 while shutting down gracefully)."""
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.status_port}/status", timeout=timeout) as resp:
                return resp.status
        except urllib.error.HTTPError as e:
            return e.code

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
