"""pytest hooks and fixtures of the test lab (imported by tests/conftest.py).

Tests marked ``integration`` or ``chaos`` need a real MariaDB. When mariadbd
is missing they are skipped, except under CI (CI=true), where a missing
server is a broken CI image and the tests fail with the reason instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lab.cluster import Cluster, cluster_program, cluster_unavailable_reason
from tests.lab.dm import dm_unavailable_reason
from tests.lab.goclient import build_goclient, go_unavailable_reason
from tests.lab.mariadb import MariaDB, mariadb_unavailable_reason
from tests.lab.tidb import TiDB, tidb_server_path, tidb_unavailable_reason

APP_USER = "app"
APP_PASSWORD = "apppw"
DATABASES = ("test", "sbtest")
LAB_MARKERS = ("integration", "chaos")

_MISSING = pytest.StashKey[str]()


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def require(reason: str | None) -> None:
    """Skip the current test for ``reason`` (fail instead under CI=true)."""
    if reason is None:
        return
    if in_ci():
        pytest.fail(f"{reason} (CI=true: a missing lab dependency is an error, not a skip)", pytrace=False)
    pytest.skip(reason)


def pytest_configure(config: pytest.Config) -> None:
    # A run killed by SIGTERM (CI timeout, `timeout`) would skip fixture
    # teardown and atexit, leaving mariadbd processes behind; turn it into
    # KeyboardInterrupt so pytest unwinds normally.
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:

        def _interrupt(signum: int, frame: object) -> None:
            raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

        signal.signal(signal.SIGTERM, _interrupt)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line for the build of the sans-IO core the tests ran on (compiled or interpreted),
    and one each for TiDB, DM and the TiDB cluster, built by hand outside the checkout: what the
    suites that need them ran with, or why they were skipped."""
    from proxy import corebuild

    terminalreporter.write_line(f"sans-IO core: {corebuild.mode()}")
    tidb, dm = tidb_unavailable_reason(), dm_unavailable_reason()
    terminalreporter.write_line(f"TiDB suites skipped: {tidb}" if tidb else f"TiDB for the suites that need it: {tidb_server_path()}")
    terminalreporter.write_line(f"DM suites skipped: {dm}" if dm else "DM for the suites that need it: dm-master, dm-worker, dm-ctl found")
    cluster = cluster_unavailable_reason()
    terminalreporter.write_line(
        f"TiDB cluster suites skipped: {cluster}"
        if cluster
        else f"TiDB cluster (PD, store): {cluster_program('pd-server')}, {cluster_program('unistore-server')}"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = mariadb_unavailable_reason()
    if reason is None:
        return
    for item in items:
        if any(item.get_closest_marker(m) for m in LAB_MARKERS):
            if in_ci():
                item.stash[_MISSING] = reason  # failed in pytest_runtest_setup
            else:
                item.add_marker(pytest.mark.skip(reason=f"needs MariaDB: {reason}"))


def pytest_runtest_setup(item: pytest.Item) -> None:
    reason = item.stash.get(_MISSING, None)
    if reason is not None:
        pytest.fail(f"needs MariaDB: {reason} (CI=true: failing instead of skipping)", pytrace=False)


def require_tidb() -> None:
    """Skip without a tidb-server binary, under CI=true too: it is built by hand, outside the
    checkout, so a fresh machine cannot have it (tests/lab/tidb.py)."""
    reason = tidb_unavailable_reason()
    if reason is not None:
        pytest.skip(f"needs TiDB: {reason}")


SERVERS: dict[str, type[MariaDB] | type[TiDB]] = {"mariadb": MariaDB, "tidb": TiDB}


def require_server(flavor: str) -> None:
    """Skip (or fail, see ``require``) without the binaries of ``flavor``'s server."""
    if flavor == "tidb":
        require_tidb()
    else:
        require(mariadb_unavailable_reason())


def prepare_server(server: MariaDB | TiDB) -> MariaDB | TiDB:
    """The app user and the databases the tests use."""
    server.create_user(APP_USER, APP_PASSWORD)
    for name in DATABASES:
        server.create_database(name)
    return server


@contextlib.contextmanager
def running_server(flavor: str, basedir: Path, **options: Any) -> Iterator[MariaDB | TiDB]:
    """A server of ``flavor`` (``options``: its own, e.g. ``max_allowed_packet``) started in
    ``basedir`` with the app user and the test databases; stopped on leaving."""
    require_server(flavor)
    server = SERVERS[flavor](basedir, **options)
    server.start()
    try:
        yield prepare_server(server)
    finally:
        server.stop()


@contextlib.contextmanager
def running_cluster(basedir: Path, **options: Any) -> Iterator[Cluster]:
    """A TiDB cluster (tests/lab/cluster.py; ``options``: its own, e.g. ``servers=2``) started
    in ``basedir`` with the app user and the test databases; stopped on leaving. Skips, under
    CI=true too, without its binaries (built by hand, outside the checkout)."""
    reason = cluster_unavailable_reason()
    if reason is not None:
        pytest.skip(f"needs a TiDB cluster: {reason}")
    cluster = Cluster(basedir, **options)
    try:
        cluster.start()  # inside: the parts a failed start did start are stopped
        prepare_server(cluster)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDB]:
    """The shared server: user app/apppw, databases test and sbtest.

    Chaos tests may restart it but must leave it running.
    """
    with running_server("mariadb", tmp_path_factory.mktemp("mariadb")) as server:
        yield server


@pytest.fixture(scope="session")
def tidb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TiDB]:
    """The shared tidb-server (unistore): user app/apppw, databases test and sbtest. Chaos
    tests may restart it but must leave it running."""
    with running_server("tidb", tmp_path_factory.mktemp("tidb")) as server:
        yield server


@pytest.fixture(scope="session", params=["mariadb", "tidb"])
def db(request: pytest.FixtureRequest) -> MariaDB | TiDB:
    """The shared backend, once per flavor: suites that take ``db`` run on MariaDB and on TiDB
    (``db.flavor`` tells which)."""
    return request.getfixturevalue(request.param)


def _server_factory(flavor: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Any]]:
    require_server(flavor)
    with contextlib.ExitStack() as servers:

        def make(**kwargs: Any) -> MariaDB | TiDB:
            basedir: Path = kwargs.pop("basedir", None) or tmp_path_factory.mktemp(flavor)
            return servers.enter_context(running_server(flavor, basedir, **kwargs))

        yield make


@pytest.fixture
def tidb_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., TiDB]]:
    """Extra independent tidb-servers, e.g. ``tidb_factory(graceful_wait=3)``; stopped at teardown."""
    yield from _server_factory("tidb", tmp_path_factory)


@pytest.fixture(params=["mariadb", "tidb"])
def db_factory(request: pytest.FixtureRequest) -> Callable[..., MariaDB | TiDB]:
    """``mariadb_factory`` or ``tidb_factory``, once per flavor (``max_allowed_packet`` works on
    both; other keyword arguments are the flavor's own)."""
    return request.getfixturevalue(f"{request.param}_factory")


@pytest.fixture
def mariadb_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., MariaDB]]:
    """Start extra independent servers, e.g. ``mariadb_factory(max_allowed_packet="1M")``.

    Each gets its own datadir and port, app/apppw and the test databases, and
    is stopped at teardown.
    """
    yield from _server_factory("mariadb", tmp_path_factory)


def stop_all(things: Iterable[Any]) -> None:
    """Call stop() on each of ``things``; if any fail, the others are still stopped and the
    first error is raised."""
    errors = []
    for thing in things:
        try:
            thing.stop()
        except Exception as exc:  # stop the others anyway
            errors.append(exc)
    if errors:
        raise errors[0]


@pytest.fixture(scope="session")
def goclient() -> Path:
    """Path of the built Go client (built once per session)."""
    require(go_unavailable_reason())
    return build_goclient()
