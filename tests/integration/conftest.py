"""Fixtures of the integration suites: the real proxy (a subprocess) in front of a real server.

The proxies follow ``db`` (tests/lab/fixtures.py): a test that takes one runs once in front of
MariaDB and once in front of TiDB (skipped with one line without a tidb-server binary), and
takes ``db`` itself for the server behind it (``db.flavor`` tells which).

- ``proxy``: module-scoped proxy, default config, in front of the shared ``db`` (64M
  max_allowed_packet); users app/apppw, root/"" and app2/app2pw (for COM_CHANGE_USER).
- ``limited_proxy``: module-scoped proxy in front of the shared server with
  ``[limits] max_allowed_packet = "1MiB"`` (reject mode).
- ``small_packet_server``: module-scoped server of ``db``'s flavor with max_allowed_packet=1M
  and a proxy in front of it (default config: the effective limit comes from the backend).
- ``proxy_factory``: start more proxies with config overrides; all stopped at teardown.

Every proxy is stopped with ProxyProcess.stop(), which fails the test (at teardown) if the
proxy logged a traceback or ignored SIGTERM.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.lab.fixtures import APP_PASSWORD, APP_USER, prepare_server, stop_all
from tests.lab.mariadb import MariaDB
from tests.lab.proxy import ProxyProcess
from tests.lab.tidb import TiDB

MiB = 1024 * 1024
SECOND_USER = ("app2", "app2pw")
# "Inside a transaction?" as SQL: TiDB has no @@in_transaction (1193); its @@tidb_current_ts is
# the open transaction's start timestamp, 0 outside one (measured on v8.5.3).
IN_TRANSACTION = {"mariadb": "@@in_transaction", "tidb": "(@@tidb_current_ts > 0)"}
# A refused multi-statement text: MariaDB's 1064; TiDB's own 8130 (measured).
MULTI_REFUSED = {"mariadb": 1064, "tidb": 8130}
PROXY_USERS = [
    {"name": APP_USER, "password": APP_PASSWORD},
    {"name": "root", "password": ""},
    {"name": SECOND_USER[0], "password": SECOND_USER[1]},
]


def seq_table(flavor: str, last: int, first: int = 1) -> str:
    """Rows first..last in a column ``seq``: MariaDB's sequence engine, a recursive CTE on TiDB."""
    if flavor == "mariadb":
        return f"seq_{first}_to_{last}"
    return (
        f"(WITH RECURSIVE s (seq) AS (SELECT {first} UNION ALL SELECT seq + 1 FROM s WHERE seq < {last}) "
        f"SELECT seq FROM s) AS seq_{first}_to_{last}"
    )


def start_proxy(workdir: Path, backend_port: int, **overrides: Any) -> ProxyProcess:
    overrides.setdefault("users", PROXY_USERS)
    proc = ProxyProcess(workdir, backend_port, **overrides)
    proc.start()
    return proc


@contextmanager
def running_proxy(workdir: Path, backend_port: int, **overrides: Any) -> Iterator[ProxyProcess]:
    """start_proxy() for the length of a ``with`` block (module fixtures)."""
    proc = start_proxy(workdir, backend_port, **overrides)
    try:
        yield proc
    finally:
        proc.stop()


def _prepare(server: MariaDB | TiDB) -> MariaDB | TiDB:
    prepare_server(server)
    server.create_user(*SECOND_USER)
    return server


@pytest.fixture(scope="module")
def proxy(db: MariaDB | TiDB, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    """The proxy with its default config in front of the shared 64M server."""
    _prepare(db)
    with running_proxy(tmp_path_factory.mktemp("proxy"), db.port) as proc:
        yield proc


@pytest.fixture(scope="module")
def limited_proxy(db: MariaDB | TiDB, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    """The shared 64M server behind a proxy whose own limit is 1 MiB (reject mode)."""
    _prepare(db)
    with running_proxy(
        tmp_path_factory.mktemp("proxy-1mib"), db.port, limits={"max_allowed_packet": "1MiB", "oversized": "reject"}
    ) as proc:
        yield proc


@pytest.fixture(scope="module")
def small_packet_server(db: MariaDB | TiDB, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """A server of ``db``'s flavor with max_allowed_packet=1M (``.db``; on TiDB a global
    variable, set once at start) and a default proxy in front (``.proxy``).

    Module-scoped (the factories are per test; a server start costs a second or three)."""
    server = type(db)(tmp_path_factory.mktemp(f"{db.flavor}-1m"), max_allowed_packet="1M")
    server.start()
    proc = None
    try:
        _prepare(server)
        proc = start_proxy(tmp_path_factory.mktemp("proxy-1m"), server.port)
        yield SimpleNamespace(db=server, proxy=proc, limit=1 * MiB)
    finally:
        try:
            if proc is not None:
                proc.stop()
        finally:
            server.stop()


@pytest.fixture
def proxy_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., ProxyProcess]]:
    """``proxy_factory(backend_port, limits={...})``: more proxies, stopped at teardown."""
    started: list[ProxyProcess] = []

    def make(backend_port: int, **overrides: Any) -> ProxyProcess:
        proc = start_proxy(tmp_path_factory.mktemp("proxy"), backend_port, **overrides)
        started.append(proc)
        return proc

    yield make
    stop_all(started)
