"""Chaos: the DM-like workload (go-sql-driver, pinned connections) through the proxy while MariaDB
is restarted for real (SIGTERM and SIGKILL alternately); afterwards every row is verified."""

from __future__ import annotations

import json

import pytest

from tests.lab.chaos import ChaosResult, assert_chaos_ok, recoveries, run_chaos, server_log_tail, start_chaos_proxy

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

DURATION = 20.0
INTERVAL = 4.0


def _report(result, proxy_log: str, server) -> None:
    """Printed for every run; pytest shows it when an assertion fails."""
    print(json.dumps(result.summary(), indent=2))
    print("server log tail:\n" + server_log_tail(server))
    print(f"proxy: {recoveries(proxy_log)} sessions recovered or moved")


async def chaos_through_proxy(
    mariadb_factory, tmp_path, label: str, sql: str, extra: dict | None = None, **recovery
) -> tuple[ChaosResult, str]:
    """The workload through a proxy with these ``[recovery]`` keys, on a fresh server, while it
    restarts. A run in which MariaDB corrupted its own table (see corrupt_tables) is reported
    and run once more on another fresh server; a second one fails the test like any row problem."""
    for attempt in (1, 2):
        server = mariadb_factory()
        proxy = start_chaos_proxy(tmp_path / f"proxy-{attempt}", server.port, **recovery)
        try:
            result = await run_chaos(
                label, server, proxy.port, tmp_path / f"run-{attempt}", sql=sql, duration=DURATION, interval=INTERVAL, extra=extra
            )
        finally:
            log = proxy.stop()
        _report(result, log, server)
        if not result.corruption or attempt == 2:
            return result, log
        print(f"MariaDB corrupted its own table in run {attempt} ({result.corruption}); running again on a fresh server")
    raise AssertionError("unreachable")


async def test_safe_mode_workload_sees_no_errors(mariadb_factory, goclient, tmp_path):
    result, log = await chaos_through_proxy(mariadb_factory, tmp_path, "safe", "safe", idempotent="safe-mode")
    assert_chaos_ok(result, log, min_txns=100)


async def test_insert_workload_never_loses_or_doubles_a_row(mariadb_factory, goclient, tmp_path):
    """Plain INSERT plus `n = n + k` counters, no safe mode: a COMMIT whose outcome is unknown
    must surface as an error (never acknowledged, never applied twice); everything else is
    transparent."""
    result, log = await chaos_through_proxy(mariadb_factory, tmp_path, "insert", "insert")
    # no lost row, no double application; only in-doubt COMMITs may surface
    assert_chaos_ok(result, log, allowed_errors=("commit:",), min_txns=100)


async def test_prepared_statement_workload(mariadb_factory, goclient, tmp_path):
    """interpolateParams=false: every statement goes through COM_STMT_PREPARE / EXECUTE / CLOSE."""
    result, log = await chaos_through_proxy(
        mariadb_factory, tmp_path, "prepared", "safe", extra={"extra_dsn": "interpolateParams=false"}, idempotent="safe-mode"
    )
    assert_chaos_ok(result, log, min_txns=100)


async def test_commit_markers_make_the_insert_workload_transparent(mariadb_factory, goclient, tmp_path):
    """With recovery.commit_marker, an in-doubt COMMIT is resolved exactly after reconnecting:
    the non-idempotent workload sees no error at all, and still no row is lost or doubled."""
    result, log = await chaos_through_proxy(mariadb_factory, tmp_path, "marker", "insert", commit_marker=True)
    print("marker resolutions:", [line[-60:] for line in log.splitlines() if "commit marker" in line][:10])
    assert_chaos_ok(result, log, min_txns=100)
