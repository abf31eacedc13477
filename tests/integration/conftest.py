"""Fixtures of the integration suites: the real proxy (a subprocess) in front of real MariaDB.

- ``proxy``: module-scoped proxy, default config, in front of the shared ``mariadb`` (64M
  max_allowed_packet); users app/apppw, root/"" and app2/app2pw (for COM_CHANGE_USER).
- ``limited_proxy``: module-scoped proxy in front of the shared server with
  ``[limits] max_allowed_packet = "1MiB"`` (reject mode).
- ``small_packet_server``: module-scoped MariaDB with max_allowed_packet=1M and a proxy in
  front of it (default config: the effective limit comes from the backend).
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

from tests.lab.fixtures import APP_PASSWORD, APP_USER, prepare_server, require, stop_all
from tests.lab.mariadb import MariaDB, mariadb_unavailable_reason
from tests.lab.proxy import ProxyProcess

MiB = 1024 * 1024
SECOND_USER = ("app2", "app2pw")
PROXY_USERS = [
    {"name": APP_USER, "password": APP_PASSWORD},
    {"name": "root", "password": ""},
    {"name": SECOND_USER[0], "password": SECOND_USER[1]},
]


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


def _prepare(server: MariaDB) -> MariaDB:
    prepare_server(server)
    server.create_user(*SECOND_USER)
    return server


@pytest.fixture(scope="module")
def proxy(mariadb: MariaDB, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    """The proxy with its default config in front of the shared 64M server."""
    _prepare(mariadb)
    with running_proxy(tmp_path_factory.mktemp("proxy"), mariadb.port) as proc:
        yield proc


@pytest.fixture(scope="module")
def limited_proxy(mariadb: MariaDB, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    """The shared 64M server behind a proxy whose own limit is 1 MiB (reject mode)."""
    _prepare(mariadb)
    with running_proxy(tmp_path_factory.mktemp("proxy-1mib"), mariadb.port,
                       limits={"max_allowed_packet": "1MiB", "oversized": "reject"}) as proc:
        yield proc


@pytest.fixture(scope="module")
def small_packet_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """A MariaDB with max_allowed_packet=1M (``.db``) and a default proxy in front (``.proxy``).

    Module-scoped (mariadb_factory is per test; a server start costs a second or two)."""
    require(mariadb_unavailable_reason())
    server = MariaDB(tmp_path_factory.mktemp("mariadb-1m"), max_allowed_packet="1M")
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
