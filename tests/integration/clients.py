"""The Python clients under test, driven through one tiny op language.

A test writes what a client does as a list of ops, runs it once straight against MariaDB and
once through the proxy, and compares the two transcripts: if they are equal, that client cannot
tell the proxy is there. Ops (``name`` picks one of several connections, default "c"):

    ("connect", name, {"user": .., "password": .., "database": .., "autocommit": True,
                       "multi": False, "local_infile": False, "max_packet": None, "found_rows": False})
    ("sql", name, sql[, params])        -> ("rows", description, rows) | ("ok", rowcount, lastrowid)
    ("ps", name, sql[, params])         prepared (binary protocol; mysql-connector only)
    ("ps_many", name, sql, [params, ...]) one prepared cursor executed once per params
    ("multi", name, sql)                -> ("sets", [result, ...]) every result of a multi-statement
    ("ping", name) ("select_db", name, db) ("reset", name) ("change_user", name, user, pw, db)
    ("commit", name) ("rollback", name) ("close", name)

Each op yields one result; a failing op yields ("error", errno, sqlstate, message) instead and
the script goes on. Values longer than BIG bytes are replaced by ("big", length, sha256) so
50 MB results compare cheaply; the port number in client-side messages is replaced by
"<port>".

Clients: pymysql, connector_pure (mysql-connector-python, use_pure=True), connector_c
(its C extension) and mysqlclient (MySQLdb, libmariadb).

The C extension runs in a subprocess: the wheel's ``_mysql_connector`` is linked against the
libssl.so.3 vendored in ``mysql/vendor`` (it needs OPENSSL_3.2.0 symbols). Once Python's
``ssl`` module has loaded the system libssl.so.3 (trio and PyMySQL import ssl, so inside
pytest it always has), the dynamic linker reuses that one, the import fails, and
``use_pure=False`` silently falls back to the pure implementation. In a fresh interpreter
that imports ``_mysql_connector`` before anything else it loads fine; the runner checks that
the connection really is a ``CMySQLConnection``.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

CLIENTS = ("pymysql", "connector_pure", "connector_c", "mysqlclient")
HOST = "127.0.0.1"
BIG = 64 * 1024
REPO = Path(__file__).resolve().parents[2]

Op = tuple
Result = tuple


class ClientUnavailable(RuntimeError):
    """The client library cannot be used on this machine (the message says why)."""


# ---------------------------------------------------------------------------- normalising


def _value(v: Any) -> Any:
    if isinstance(v, bytearray):
        v = bytes(v)
    if isinstance(v, (bytes, str)) and len(v) > BIG:
        data = v.encode("utf-8", "surrogateescape") if isinstance(v, str) else v
        return ("big", type(v).__name__, len(data), hashlib.sha256(data).hexdigest())
    return v


def _rows(rows: Any) -> list[tuple]:
    return [tuple(_value(v) for v in row) for row in rows or ()]


def _description(desc: Any) -> list[tuple] | None:
    if desc is None:
        return None
    return [tuple(d) for d in desc]


def _error(exc: BaseException, port: int) -> Result:
    errno = getattr(exc, "errno", None)
    msg = getattr(exc, "msg", None)
    args = getattr(exc, "args", ())
    if errno is None and args and isinstance(args[0], int):
        errno = args[0]
    if msg is None:
        msg = args[1] if len(args) > 1 else str(exc)
    sqlstate = getattr(exc, "sqlstate", None)
    msg = str(msg).replace(str(port), "<port>")
    return ("error", errno, sqlstate, msg)


# ---------------------------------------------------------------------------- drivers


class _Driver:
    """One client library: connect and the few calls that differ between libraries."""

    def __init__(self, client: str, port: int, tmpdir: str) -> None:
        self.client = client
        self.port = port
        self.tmpdir = tmpdir

    def connect(
        self,
        user="app",
        password="apppw",
        database="test",
        autocommit=True,
        multi=False,
        local_infile=False,
        max_packet=None,
        found_rows=False,
    ):
        common = dict(host=HOST, port=self.port, user=user, password=password, database=database)
        if self.client == "pymysql":
            import pymysql
            from pymysql.constants import CLIENT

            flags = (CLIENT.MULTI_STATEMENTS if multi else 0) | (CLIENT.FOUND_ROWS if found_rows else 0)
            return pymysql.connect(
                **common,
                charset="utf8mb4",
                autocommit=autocommit,
                client_flag=flags,
                local_infile=local_infile,
                max_allowed_packet=max_packet or 256 * 1024 * 1024,
                connect_timeout=10,
                read_timeout=120,
                write_timeout=120,
            )
        if self.client in ("connector_pure", "connector_c"):
            import mysql.connector
            from mysql.connector.constants import ClientFlag

            conn = mysql.connector.connect(
                **common,
                charset="utf8mb4",
                autocommit=autocommit,
                use_pure=self.client == "connector_pure",
                allow_local_infile=local_infile,
                connection_timeout=10,
                client_flags=[ClientFlag.FOUND_ROWS] if found_rows else [],
            )
            if self.client == "connector_c" and type(conn).__name__ != "CMySQLConnection":
                raise ClientUnavailable(f"use_pure=False gave a {type(conn).__name__}")
            return conn
        if self.client == "mysqlclient":
            import MySQLdb
            from MySQLdb.constants import CLIENT

            kwargs: dict[str, Any] = dict(
                charset="utf8mb4", autocommit=autocommit, connect_timeout=10, local_infile=1 if local_infile else 0
            )
            # MySQLdb turns multi-statements on by default; off unless asked, like the others.
            kwargs["client_flag"] = (
                (CLIENT.MULTI_STATEMENTS if multi else 0) | CLIENT.MULTI_RESULTS | (CLIENT.FOUND_ROWS if found_rows else 0)
            )
            if max_packet:
                # libmariadb takes max_allowed_packet only from an option file.
                cnf = Path(self.tmpdir) / f"client-{max_packet}.cnf"
                cnf.write_text(f"[client]\nmax_allowed_packet={max_packet}\n")
                kwargs.update(read_default_file=str(cnf), read_default_group="client")
            return MySQLdb.connect(**common, **kwargs)
        raise ValueError(f"unknown client {self.client!r}")

    def cursor(self, conn, prepared=False):
        if prepared:
            if not self.client.startswith("connector"):
                raise NotImplementedError(f"{self.client} has no server-side prepared statements")
            return conn.cursor(prepared=True)
        if self.client.startswith("connector"):
            return conn.cursor(buffered=True)
        return conn.cursor()

    def execute(self, conn, sql, params, prepared=False) -> Result:
        cur = self.cursor(conn, prepared)
        try:
            cur.execute(sql, params) if params is not None else cur.execute(sql)
            return self._result(cur)
        finally:
            try:
                cur.close()
            except Exception:
                pass

    def execute_many_prepared(self, conn, sql, param_sets) -> Result:
        """The same prepared statement executed repeatedly (one prepare, several executes)."""
        cur = self.cursor(conn, prepared=True)
        results: list[Result] = []
        try:
            for params in param_sets:
                try:
                    cur.execute(sql, params)
                    results.append(self._result(cur))
                except Exception as exc:
                    results.append(_error(exc, self.port))
            return ("each", results)
        finally:
            try:
                cur.close()
            except Exception:
                pass

    def _result(self, cur) -> Result:
        if cur.description is not None:
            return ("rows", _description(cur.description), _rows(cur.fetchall()))
        return ("ok", cur.rowcount, cur.lastrowid)

    def multi(self, conn, sql) -> Result:
        if self.client not in ("pymysql", "mysqlclient"):
            raise NotImplementedError("multi-statements are only scripted for PyMySQL and mysqlclient")
        cur = conn.cursor()
        sets: list[Result] = []
        try:
            try:
                cur.execute(sql)
                sets.append(self._result(cur))
                while cur.nextset():
                    sets.append(self._result(cur))
            except Exception as exc:
                sets.append(_error(exc, self.port))
            return ("sets", sets)
        finally:
            try:
                cur.close()
            except Exception:
                pass

    def ping(self, conn):
        if self.client == "pymysql":
            conn.ping(reconnect=False)
        elif self.client.startswith("connector"):
            conn.ping(reconnect=False)
        else:
            conn.ping()
        return ("pong",)

    def select_db(self, conn, db):
        if self.client.startswith("connector"):
            conn.cmd_init_db(db)
        else:
            conn.select_db(db)
        return ("ok",)

    def reset(self, conn):
        if not self.client.startswith("connector"):
            raise NotImplementedError
        return ("reset", bool(conn.cmd_reset_connection()))

    def change_user(self, conn, user, password, db):
        if self.client.startswith("connector"):
            conn.cmd_change_user(username=user, password=password, database=db)
        elif self.client == "mysqlclient":
            conn.change_user(user, password, db)
        else:
            raise NotImplementedError(f"{self.client} has no COM_CHANGE_USER")
        return ("changed",)


def run_ops(client: str, port: int, ops: list[Op]) -> list[Result]:
    """Run one script with ``client`` against 127.0.0.1:port and return its transcript."""
    if client == "connector_c":
        return run_many(client, [(port, ops)])[0]
    with tempfile.TemporaryDirectory(prefix="clients-") as tmpdir:
        return _run(client, port, ops, tmpdir)


def run_many(client: str, jobs: list[tuple[int, list[Op]]]) -> list[list[Result]]:
    """Several scripts, one after the other (one subprocess for the C extension)."""
    if client != "connector_c":
        return [run_ops(client, port, ops) for port, ops in jobs]
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER],
        input=pickle.dumps((client, jobs)),
        capture_output=True,
        cwd=REPO,
        timeout=300,
        check=False,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"connector_c runner failed (exit {proc.returncode}):\n{proc.stderr.decode(errors='replace')[-4000:]}")
    status, payload = pickle.loads(proc.stdout)
    if status == "unavailable":
        raise ClientUnavailable(payload)
    return payload


def _run(client: str, port: int, ops: list[Op], tmpdir: str) -> list[Result]:
    driver = _Driver(client, port, tmpdir)
    conns: dict[str, Any] = {}
    out: list[Result] = []
    for op in ops:
        kind, name, *args = op
        try:
            if kind == "connect":
                conns[name] = driver.connect(**(args[0] if args else {}))
                out.append(("connected",))
                continue
            conn = conns[name]
            if kind == "sql":
                out.append(driver.execute(conn, args[0], args[1] if len(args) > 1 else None))
            elif kind == "ps":
                out.append(driver.execute(conn, args[0], args[1] if len(args) > 1 else None, prepared=True))
            elif kind == "ps_many":
                out.append(driver.execute_many_prepared(conn, args[0], args[1]))
            elif kind == "multi":
                out.append(driver.multi(conn, args[0]))
            elif kind == "ping":
                out.append(driver.ping(conn))
            elif kind == "select_db":
                out.append(driver.select_db(conn, args[0]))
            elif kind == "reset":
                out.append(driver.reset(conn))
            elif kind == "change_user":
                out.append(driver.change_user(conn, *args))
            elif kind == "commit":
                conn.commit()
                out.append(("ok",))
            elif kind == "rollback":
                conn.rollback()
                out.append(("ok",))
            elif kind == "close":
                conns.pop(name).close()
                out.append(("closed",))
            else:
                raise ValueError(f"unknown op {kind!r}")
        except ClientUnavailable:
            raise
        except (NotImplementedError, ValueError, KeyError, TypeError):
            raise
        except Exception as exc:
            out.append(_error(exc, port))
    for conn in conns.values():
        try:
            conn.close()
        except Exception:
            pass
    return out


# The C extension must be imported before anything loads the system libssl/libcrypto
# (ssl, hashlib, ...), so the runner imports it before this module.
_RUNNER = """
try:
    import _mysql_connector
    problem = None
except ImportError as exc:
    problem = str(exc)
import tests.integration.clients as m
m._subprocess_main(problem)
"""


def _subprocess_main(problem: str | None) -> None:
    """Entry point of the C-extension runner (see the module docstring)."""
    client, jobs = pickle.loads(sys.stdin.buffer.read())
    if problem is not None:
        sys.stdout.buffer.write(pickle.dumps(("unavailable", f"mysql-connector C extension: {problem}")))
        return
    try:
        with tempfile.TemporaryDirectory(prefix="clients-") as tmpdir:
            results = [_run(client, port, ops, tmpdir) for port, ops in jobs]
    except ClientUnavailable as exc:
        sys.stdout.buffer.write(pickle.dumps(("unavailable", str(exc))))
        return
    sys.stdout.buffer.write(pickle.dumps(("ok", results)))


# ---------------------------------------------------------------------------- values


ALL_BYTES = bytes(range(256))


def sql_bytes_literal(data: bytes) -> str:
    """X'..' literal (the statement stays ASCII)."""
    return "X'" + data.hex() + "'"


__all__ = [
    "ALL_BYTES",
    "CLIENTS",
    "ClientUnavailable",
    "run_many",
    "run_ops",
    "sql_bytes_literal",
]
