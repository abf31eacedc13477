"""Chaos: the DM-like workload (go-sql-driver, pinned connections) through the proxy while MariaDB
is restarted for real (SIGTERM and SIGKILL alternately); afterwards every row is verified."""

from __future__ import annotations

import json

import pytest

from tests.lab.chaos import run_chaos, server_log_tail, start_chaos_proxy

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

DURATION = 20.0
INTERVAL = 4.0


@pytest.fixture
def server(mariadb_factory):
    return mariadb_factory()


def _report(result, proxy_log: str, server) -> None:
    """Printed for every run; pytest shows it when an assertion fails."""
    print(json.dumps(result.summary(), indent=2))
    print("server log tail:\n" + server_log_tail(server))
    recoveries = [line for line in proxy_log.splitlines() if "recovered on" in line or "plan:" in line]
    print(f"proxy recoveries logged: {len(recoveries)}")


async def test_safe_mode_workload_sees_no_errors(server, goclient, tmp_path):
    proxy = start_chaos_proxy(tmp_path / "proxy", server.port, idempotent="safe-mode")
    try:
        result = await run_chaos("safe", server, proxy.port, tmp_path, sql="safe", duration=DURATION, interval=INTERVAL)
    finally:
        log = proxy.stop()
    _report(result, log, server)
    assert len(result.restarts) >= 3
    assert result.errors == 0, result.workload["errors"]
    assert result.rows_ok, result.verify
    assert result.workload["committed_txns"] > 100


async def test_insert_workload_never_loses_or_doubles_a_row(server, goclient, tmp_path):
    """Plain INSERT plus `n = n + k` counters, no safe mode: a COMMIT whose outcome is unknown
    must surface as an error (never acknowledged, never applied twice); everything else is
    transparent."""
    proxy = start_chaos_proxy(tmp_path / "proxy", server.port)
    try:
        result = await run_chaos("insert", server, proxy.port, tmp_path, sql="insert", duration=DURATION, interval=INTERVAL)
    finally:
        log = proxy.stop()
    _report(result, log, server)
    assert result.rows_ok, result.verify  # no lost row, no double application
    unexpected = {k: v for k, v in result.workload["errors"].items() if not k.startswith("commit:")}
    assert not unexpected, unexpected  # only in-doubt COMMITs may surface


async def test_prepared_statement_workload(server, goclient, tmp_path):
    """interpolateParams=false: every statement goes through COM_STMT_PREPARE / EXECUTE / CLOSE."""
    proxy = start_chaos_proxy(tmp_path / "proxy", server.port, idempotent="safe-mode")
    try:
        result = await run_chaos(
            "prepared", server, proxy.port, tmp_path, sql="safe", duration=DURATION, interval=INTERVAL,
            extra={"extra_dsn": "interpolateParams=false"},
        )
    finally:
        log = proxy.stop()
    _report(result, log, server)
    assert result.errors == 0, result.workload["errors"]
    assert result.rows_ok, result.verify


async def test_commit_markers_make_the_insert_workload_transparent(server, goclient, tmp_path):
    """With recovery.commit_marker, an in-doubt COMMIT is resolved exactly after reconnecting:
    the non-idempotent workload sees no error at all, and still no row is lost or doubled."""
    proxy = start_chaos_proxy(tmp_path / "proxy", server.port, commit_marker=True)
    try:
        result = await run_chaos("marker", server, proxy.port, tmp_path, sql="insert", duration=DURATION, interval=INTERVAL)
    finally:
        log = proxy.stop()
    _report(result, log, server)
    print("marker resolutions:", [line[-60:] for line in log.splitlines() if "commit marker" in line][:10])
    assert result.rows_ok, result.verify
    assert result.errors == 0, result.workload["errors"]
