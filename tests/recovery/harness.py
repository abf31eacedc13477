"""Recovery-matrix harness: client -> proxy -> fault shim -> server (MariaDB or TiDB).

One ``RecoveryHarness`` per test module and flavor (fixture ``recovery_harness``, parametrized
over ``mariadb`` and ``tidb``; import it into the test module, or parametrize it indirectly with
the flavors a test needs): a server of its own (the lab's, tests/lab), one ``FaultShim`` in front
of it, and one proxy per recovery mode, started the first time a case asks for that mode and
reused:

    MODES = {"default": {}, "commit_marker": {"recovery": {"commit_marker": True}},
             "safe_mode": {"recovery": {"idempotent": "safe-mode"}}}

A case runs a script of SQL statements through the proxy with PyMySQL (autocommit on,
``CLIENT.MULTI_STATEMENTS`` on request), with one fault armed on one statement of it (armed
right before that statement is sent, for one matching command: by default a COM_QUERY whose
text is exactly the statement's):

    res = recovery_harness.run(
        ["BEGIN", "INSERT INTO t VALUES (1)", "INSERT INTO t VALUES (2)", "COMMIT"],
        fault=Fault("close_before", on=2),
        setup=["CREATE TABLE t (id INT PRIMARY KEY)"],
        mode="default",
    )
    assert res.fault_applied
    assert [o.error for o in res.outcomes] == [None] * 4, res.describe()
    assert res.query("SELECT id FROM t") == [(1,), (2,)]

Besides the shim's faults, ``Fault`` takes two operator actions: ``close_idle_connections``
(right before statement ``on``: the shim closes every idle connection, as a restarting server
does, then the case waits briefly for the proxy to notice) and ``kill`` (an operator's ``KILL``
of the proxy's backend connection, found in information_schema.PROCESSLIST by user and the
case's database: right before statement ``on``, or with ``params={"running": True}`` while
statement ``on`` runs). ``before={i: [sql, ...]}`` runs statements on a direct connection
right before statement ``i`` (before its fault). ``driver="connector"`` runs the script with
mysql-connector-python instead of PyMySQL; its steps may then be ``Prepared(sql, params)``
(a server-side prepared statement, ``cursor(prepared=True)``; a fault on it matches its
COM_STMT_EXECUTE by default).

``CaseResult`` holds what the client saw for every statement (rows and affected-row counts of
every result set, or the error code and message; statements after a lost connection are
``skipped``), whether the fault fired, the shim events and proxy log of the case, and direct
(not proxied) access to the server to read the data back. Each case runs in its own database
(``rc_<n>``), so cases of one module do not see each other's tables.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pymysql
import pytest
from pymysql.constants import CLIENT

from tests.lab.faultshim import Command, Event, FaultShim, Rule, matcher
from tests.lab.fixtures import APP_PASSWORD, APP_USER, running_server
from tests.lab.mariadb import HOST, MariaDB
from tests.lab.netfault import Partition
from tests.lab.proxy import ProxyProcess
from tests.lab.tidb import TiDB

__all__ = [
    "FLAVORS",
    "MODES",
    "Fault",
    "Prepared",
    "Outcome",
    "CaseResult",
    "RecoveryHarness",
    "recovery_harness",
    "SHIM_FAULTS",
    "ACTION_FAULTS",
]

FLAVORS = ("mariadb", "tidb")

MODES: dict[str, dict[str, Any]] = {
    "default": {},
    "commit_marker": {"recovery": {"commit_marker": True}},
    "safe_mode": {"recovery": {"idempotent": "safe-mode"}},
    # configs/dm-sidecar.toml's pair: what safe mode cannot prove, a marker settles
    "safe_mode_marker": {"recovery": {"idempotent": "safe-mode", "commit_marker": True}},
}

# Error codes that mean "this client connection is gone": the rest of the script is skipped.
# 1158 (SQLSTATE 08S01) is the proxy's own "connection error" answer, after which it closes; 1927
# (an operator's KILL) ends the session too.
CONNECTION_LOST = {0, 1158, 1927, 2006, 2013, 2014, 2055}
# Outcome.error code of an exception that is not a driver error (the driver choked on what it
# received: a bogus packet length, a short packet, ...): never a valid answer.
DRIVER_CRASH = -1

SHIM_FAULTS = ("drop_answer", "close_before", "cut_result", "stall")
ACTION_FAULTS = ("close_idle_connections", "kill", "partition", "wait_timeout")
# The proxy of a partition case checks its backend often and gives it up soon (backend.
# dead_after), so that a case takes seconds: the cut comes within DEAD_AFTER + 3 intervals.
FAST_HEALTH = {"health_interval": "1s", "dead_after": "3s"}


@dataclasses.dataclass
class Fault:
    """One fault on statement ``on`` (index into the script).

    kind: ``drop_answer``, ``close_before``, ``cut_result``, ``stall`` (see FaultShim), or the
    operator actions ``close_idle_connections`` and ``kill`` (see the module doc);
    params: the fault's own (``at=``, ``seconds=``, ``then_close=``, ``reset=``, ``times=``;
    ``running=``, ``delay=`` for ``kill``; ``settle=`` for both actions);
    match: a predicate on the shim's Command or a SQL prefix; default: a COM_QUERY whose text
    is exactly the statement (for a ``Prepared`` step: its COM_STMT_EXECUTE)."""

    kind: str
    on: int
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    match: Callable[[Command], bool] | str | None = None


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A script step run as a server-side prepared statement (``driver="connector"`` only)."""

    sql: str
    params: tuple = ()

    def __str__(self) -> str:
        return f"PREPARED {self.sql} {self.params!r}"


@dataclasses.dataclass
class Outcome:
    """What the client saw for one statement."""

    sql: str
    results: list[tuple[tuple, ...] | None] = dataclasses.field(default_factory=list)  # rows per result set
    affected: list[int] = dataclasses.field(default_factory=list)  # affected rows per result set
    error: tuple[int, str] | None = None
    skipped: bool = False
    elapsed: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and not self.skipped

    @property
    def code(self) -> int | None:
        return self.error[0] if self.error else None

    @property
    def rows(self) -> tuple[tuple, ...] | None:
        """Rows of the first result set (None for a statement without one)."""
        return self.results[0] if self.results else None

    def __str__(self) -> str:
        if self.skipped:
            what = "skipped (connection lost earlier)"
        elif self.error:
            what = f"ERROR {self.error[0]}: {self.error[1]}"
        else:
            parts = [f"rows={r!r}" if r is not None else f"affected={a}" for r, a in zip(self.results, self.affected)]
            what = "OK " + "; ".join(parts)
        sql = self.sql if len(self.sql) <= 300 else f"{self.sql[:150]}...<{len(self.sql)} chars>...{self.sql[-100:]}"
        return f"{sql!r} -> {what} ({self.elapsed:.2f}s)"


@dataclasses.dataclass
class CaseResult:
    outcomes: list[Outcome]
    mode: str
    database: str
    fault: Fault | None
    rule: Rule | None
    fault_applied: bool
    shim_events: list[Event]
    proxy_log: str
    harness: RecoveryHarness

    @property
    def errors(self) -> list[tuple[int, int, str]]:
        """(statement index, code, message) of every statement that failed."""
        return [(i, o.error[0], o.error[1]) for i, o in enumerate(self.outcomes) if o.error]

    def query(self, sql: str, args: Any = None) -> list[tuple]:
        """Run ``sql`` directly on the server (not through proxy or shim), in the case's database."""
        return self.harness.query(sql, args, database=self.database)

    def direct(self, **kwargs: Any) -> pymysql.connections.Connection:
        """A root connection straight to the server, in the case's database (close it)."""
        return self.harness.direct(self.database, **kwargs)

    def sent(self, match: Callable[[Command], bool] | str) -> int:
        """How many matching commands the shim forwarded to the server during the case."""
        pred = matcher(match)
        return sum(1 for e in self.shim_events if e.kind == "command" and e.forwarded and pred(e.command))

    def describe(self) -> str:
        """Everything needed to understand a failing case (for assertion messages)."""
        lines = [f"mode={self.mode} database={self.database} fault={self.fault} applied={self.fault_applied}", "--- client saw:"]
        lines += [f"  [{i}] {o}" for i, o in enumerate(self.outcomes)]
        lines.append("--- shim:")
        lines += [f"  {e!r}" for e in self.shim_events]
        lines.append("--- proxy log (this case):")
        lines += self.proxy_log.splitlines()[-80:]
        return "\n".join(lines)


class RecoveryHarness:
    """A FaultShim in front of a running lab server (``server``: a MariaDB or a TiDB, started
    and stopped by its owner, the fixture) and lazily started proxies (one per mode) in front
    of the shim; ``run`` runs one case through them."""

    def __init__(self, workdir: Path, server: MariaDB | TiDB) -> None:
        self.workdir = Path(workdir)
        self.server = server
        self.flavor = server.flavor
        self.shim = FaultShim(server.port)
        self.proxies: dict[str, ProxyProcess] = {}
        self._cases = itertools.count()

    def __enter__(self) -> RecoveryHarness:
        self.shim.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop the proxies (raising if one logged a traceback) and the shim."""
        errors: list[BaseException] = []
        for proxy in self.proxies.values():
            try:
                proxy.stop()
            except BaseException as exc:  # stop the rest anyway
                errors.append(exc)
        self.proxies.clear()
        self.shim.stop()
        if errors:
            raise errors[0]
        self.shim.check()

    def proxy(self, mode: str = "default", fast_health: bool = False) -> ProxyProcess:
        """The proxy of ``mode``; with ``fast_health``, one with FAST_HEALTH (partition cases)."""
        if mode not in MODES:
            raise ValueError(f"unknown recovery mode {mode!r} (one of {', '.join(MODES)})")
        key = f"{mode}-fast-health" if fast_health else mode
        proxy = self.proxies.get(key)
        if proxy is None or proxy.proc is None or proxy.proc.poll() is not None:
            extra = {"backend": FAST_HEALTH} if fast_health else {}
            proxy = ProxyProcess(self.workdir / f"proxy-{key}", self.shim.port, **MODES[mode], **extra)
            proxy.start()
            self.proxies[key] = proxy
        return proxy

    def direct(self, database: str | None = None, **kwargs: Any) -> pymysql.connections.Connection:
        """A root connection straight to the server (unix socket, autocommit)."""
        return self.server.admin(database=database, **kwargs)

    def query(self, sql: str, args: Any = None, database: str | None = None) -> list[tuple]:
        """``sql`` as root straight on the server (in ``database``); its rows."""
        return self.server.query(sql, args, database=database)

    def client(
        self, mode: str = "default", database: str = "test", multi_statements: bool = False, fast_health: bool = False, **kwargs: Any
    ) -> pymysql.connections.Connection:
        """A PyMySQL connection through the proxy of ``mode`` (autocommit on)."""
        args = {
            "host": HOST,
            "port": self.proxy(mode, fast_health).port,
            "user": APP_USER,
            "password": APP_PASSWORD,
            "database": database,
            "autocommit": True,
            "connect_timeout": 10,
            "read_timeout": 90,
            "write_timeout": 90,
            "charset": "utf8mb4",
            "client_flag": CLIENT.MULTI_STATEMENTS if multi_statements else 0,
            **kwargs,
        }
        return pymysql.connect(**args)

    def connector_client(self, mode: str = "default", database: str = "test", fast_health: bool = False, **kwargs: Any) -> Any:
        """A mysql-connector-python connection (pure Python) through the proxy of ``mode``."""
        import mysql.connector

        args = {
            "host": HOST,
            "port": self.proxy(mode, fast_health).port,
            "user": APP_USER,
            "password": APP_PASSWORD,
            "database": database,
            "autocommit": True,
            "connection_timeout": 10,
            "use_pure": True,
            "charset": "utf8mb4",
            "collation": "utf8mb4_general_ci",
            **kwargs,
        }
        return mysql.connector.connect(**args)

    def backend_ids(self, database: str, command: str | None = None, info: str | None = None) -> list[int]:
        """Server connection ids of the proxy's backend connections (user app) whose current
        database is ``database`` (optionally: in ``command`` state, running ``info``)."""
        sql = "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = %s AND DB = %s"
        args: list[Any] = [APP_USER, database]
        if command is not None:
            sql += " AND COMMAND = %s"
            args.append(command)
        if info is not None:
            sql += " AND INFO = %s"
            args.append(info)
        return [row[0] for row in self.query(sql, args)]

    def run(
        self,
        script: Sequence[str | Prepared],
        *,
        fault: Fault | None = None,
        mode: str = "default",
        multi_statements: bool = False,
        setup: Sequence[str] = (),
        fault_timeout: float = 10,
        database: str | None = None,
        before: dict[int, Sequence[str]] | None = None,
        driver: str = "pymysql",
    ) -> CaseResult:
        """Run one case; see the module doc."""
        if fault is not None and not 0 <= fault.on < len(script):
            raise ValueError(f"fault.on={fault.on} is not a statement index of the script")
        if fault is not None and fault.kind not in SHIM_FAULTS + ACTION_FAULTS:
            raise ValueError(f"unknown fault {fault.kind!r} (one of {', '.join(SHIM_FAULTS + ACTION_FAULTS)})")
        if driver not in ("pymysql", "connector"):
            raise ValueError(f"unknown driver {driver!r}")
        if driver == "pymysql" and any(isinstance(step, Prepared) for step in script):
            raise ValueError("Prepared steps need driver='connector'")
        before = before or {}
        self.shim.check()
        database = database or f"rc_{next(self._cases)}"
        self.query(f"DROP DATABASE IF EXISTS `{database}`")
        self.query(f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4")
        for sql in setup:
            self.query(sql, database=database)
        fast_health = fault is not None and fault.kind == "partition"
        proxy = self.proxy(mode, fast_health)
        log_start = len(proxy.log_text())
        mark = self.shim.mark()
        rule: Rule | None = None
        action_applied = False
        outcomes: list[Outcome] = []
        if driver == "connector":
            conn = self.connector_client(mode, database=database, fast_health=fast_health)
            execute = _execute_connector
        else:
            conn = self.client(mode, database=database, multi_statements=multi_statements, fast_health=fast_health)
            execute = _execute
        try:
            lost = False
            for i, step in enumerate(script):
                if lost:
                    outcomes.append(Outcome(str(step), skipped=True))
                    continue
                for sql in before.get(i, ()):
                    self.query(sql, database=database)
                killer: _Killer | None = None
                partition: _Partitioner | None = None
                if fault is not None and i == fault.on:
                    if fault.kind in SHIM_FAULTS:
                        match = fault.match if fault.match is not None else _default_match(step)
                        params = {k: v for k, v in fault.params.items()}
                        rule = self.shim.arm(fault.kind, match, **params)
                    elif fault.kind == "close_idle_connections":
                        action_applied = self._close_idle(fault)
                    elif fault.kind == "wait_timeout":
                        action_applied = self._outwait(fault, str(script[i - 1]))
                    elif fault.kind == "partition":
                        partition = _Partitioner(self.shim.port, fault.params.get("seconds", 6.0))
                        partition.start()
                    elif fault.params.get("running"):
                        killer = _Killer(self, database, str(step) if isinstance(step, str) else step.sql, fault.params.get("delay", 0.3))
                        killer.start()
                    else:
                        action_applied = self._kill_idle(database, fault)
                outcome = execute(conn, step)
                if killer is not None:
                    killer.join()
                    action_applied = killer.killed is not None
                if partition is not None:
                    partition.join()
                    action_applied = "unreachable: no answer to any health check" in proxy.log_text()[log_start:]
                outcomes.append(outcome)
                lost = outcome.code in CONNECTION_LOST
        finally:
            try:
                conn.close()
            except Exception:
                pass
        applied = action_applied
        if rule is not None:
            applied = self.shim.wait_applied(rule, fault_timeout)
            self.shim.disarm(rule)
        # Let the proxy finish logging the session (it logs one line when a session closes).
        time.sleep(0.05)
        result = CaseResult(
            outcomes=outcomes,
            mode=mode,
            database=database,
            fault=fault,
            rule=rule,
            fault_applied=applied,
            shim_events=self.shim.events(since=mark),
            proxy_log=proxy.log_text()[log_start:],
            harness=self,
        )
        if proxy.proc is not None and proxy.proc.poll() is not None:
            raise AssertionError(f"the proxy exited with {proxy.proc.returncode}\n{result.describe()}")
        self.shim.check()
        return result

    def _settle(self, mark: int, fault: Fault) -> None:
        """Give the proxy a moment to notice a closed backend connection: until it logs in
        again through the shim (if it reconnects at once) or ``settle`` seconds."""
        settle = fault.params.get("settle", 0.5)
        self.shim.wait_for(lambda: any(e.kind == "login" for e in self.shim.events(since=mark)), settle)

    def _close_idle(self, fault: Fault) -> bool:
        mark = self.shim.mark()
        closed = self.shim.close_idle_connections(reset=fault.params.get("reset", False))
        self._settle(mark, fault)
        return bool(closed)

    def _outwait(self, fault: Fault, last_sql: str) -> bool:
        """Stay idle until the server closes the session's connection (the one that ran the
        script's ``last_sql``) for its wait_timeout (set by the script: ``seconds``); True once
        it did."""
        events = self.shim.events()
        conn = max(e.conn for e in events if e.kind == "command" and e.sql == last_sql)
        mark = self.shim.mark()

        def closed() -> bool:
            return any(e.kind == "close" and e.conn == conn and "server closed" in e.detail for e in self.shim.events(since=mark))

        return self.shim.wait_for(closed, fault.params.get("seconds", 2) + 5)

    def _kill_idle(self, database: str, fault: Fault) -> bool:
        ids = self.backend_ids(database, command="Sleep")
        if not ids:
            return False
        mark = self.shim.mark()
        for conn_id in ids:
            self.query(f"KILL {int(conn_id)}")
        self.shim.wait_for(lambda: any(e.kind == "close" for e in self.shim.events(since=mark)), 2)
        self._settle(self.shim.mark(), fault)
        return True


class _Killer(threading.Thread):
    """Operator KILL of the backend connection running ``sql`` (in ``database``), ``delay``
    seconds after it shows up in the process list."""

    def __init__(self, harness: RecoveryHarness, database: str, sql: str, delay: float, timeout: float = 10) -> None:
        super().__init__(daemon=True, name=f"killer:{database}")
        self.harness, self.database, self.sql, self.delay, self.timeout = harness, database, sql, delay, timeout
        self.killed: int | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            deadline = time.monotonic() + self.timeout
            while time.monotonic() < deadline:
                ids = self.harness.backend_ids(self.database, info=self.sql)
                if ids:
                    time.sleep(self.delay)
                    self.harness.query(f"KILL {int(ids[0])}")
                    self.killed = ids[0]
                    return
                time.sleep(0.02)
        except BaseException as exc:  # reported through killed=None
            self.error = exc


class _Partitioner(threading.Thread):
    """The port cut off (``Partition``: every packet to and from it dropped) for ``seconds``,
    from the moment the thread starts; healed however the case ends."""

    def __init__(self, port: int, seconds: float) -> None:
        super().__init__(daemon=True, name=f"partition:{port}")
        self.partition = Partition(port).cut()
        self.seconds = seconds

    def run(self) -> None:
        try:
            time.sleep(self.seconds)
        finally:
            self.partition.heal()


def _default_match(step: str | Prepared) -> Callable[[Command], bool]:
    if isinstance(step, Prepared):

        def execute(cmd: Command) -> bool:
            return cmd.code == 0x17

        execute.__qualname__ = "COM_STMT_EXECUTE"
        return execute
    return _exact(step)


def _exact(sql: str) -> Callable[[Command], bool]:
    def exact(cmd: Command) -> bool:
        return cmd.code == 0x03 and cmd.sql == sql

    exact.__qualname__ = f"sql == {sql!r}"
    return exact


def _execute(conn: pymysql.connections.Connection, sql: str) -> Outcome:
    outcome = Outcome(sql)
    start = time.monotonic()
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            while True:
                outcome.results.append(tuple(cur.fetchall()) if cur.description else None)
                outcome.affected.append(cur.rowcount)
                if not cur.nextset():
                    break
    except pymysql.err.Error as exc:
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else 0
        message = str(exc.args[1]) if len(exc.args) > 1 else str(exc)
        outcome.error = (code, message)
    except Exception as exc:  # the driver choked on what it was sent: a protocol violation
        outcome.error = (DRIVER_CRASH, f"{type(exc).__name__}: {exc}")
    outcome.elapsed = time.monotonic() - start
    return outcome


def _execute_connector(conn: Any, step: str | Prepared) -> Outcome:
    import mysql.connector

    outcome = Outcome(str(step))
    start = time.monotonic()
    try:
        if isinstance(step, Prepared):
            cur = conn.cursor(prepared=True)
            cur.execute(step.sql, step.params)
        else:
            cur = conn.cursor(buffered=True)
            cur.execute(step)
        try:
            outcome.results.append(tuple(tuple(r) for r in cur.fetchall()) if cur.with_rows else None)
            outcome.affected.append(cur.rowcount)
        finally:
            cur.close()
    except mysql.connector.Error as exc:
        outcome.error = (exc.errno if isinstance(exc.errno, int) and exc.errno > 0 else 0, exc.msg or str(exc))
    except Exception as exc:  # the driver choked on what it was sent: a protocol violation
        outcome.error = (DRIVER_CRASH, f"{type(exc).__name__}: {exc}")
    outcome.elapsed = time.monotonic() - start
    return outcome


@pytest.fixture(scope="module", params=FLAVORS)
def recovery_harness(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RecoveryHarness]:
    """Module-scoped RecoveryHarness per flavor, on a server of its own (the lab's
    ``running_server``); TiDB's cases skip with one line without a tidb-server binary."""
    workdir = tmp_path_factory.mktemp(f"recovery-{request.param}")
    with running_server(request.param, workdir / "db") as server, RecoveryHarness(workdir, server) as harness:
        yield harness
