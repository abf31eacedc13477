"""Chaos on TiDB: the DM-like Go workload (go-sql-driver configured as DM, DM's session with
``tidb_txn_mode='optimistic'``, 8 pinned connections) through the proxy while tidb-server goes
away, then every row verified on the server.

- graceful: SIGTERM restarts, ``graceful-wait-before-shutdown`` 0 and 2 s (the proxy watches the
  status port, as deployed in front of TiDB, and moves idle sessions off a draining server);
- crash: TiDB's SQL layer dying without its storage -- the fault shim in front of tidb-server cuts
  every connection and refuses connects for a second. (unistore does not sync its writes: a
  SIGKILLed tidb-server loses acknowledged data even without a proxy, so SIGKILL is no fault to
  check exact data after.)

Through the proxy: no client error, exact data (no row lost or doubled, exact counters). Directly
the same faults cost errors: ``python -m bench.chaos_matrix --server tidb`` prints both side by
side. Skipped with one line without a tidb-server binary.
"""

from __future__ import annotations

import json

import pytest

from tests.lab.chaos import ChaosResult, assert_chaos_ok, crashing, recoveries, run_chaos, server_log_tail, start_chaos_proxy, tidb_backend
from tests.lab.faultshim import FaultShim

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

DURATION = 20.0
INTERVAL = 3.0


async def through_proxy(
    tidb_factory,
    tmp_path,
    label: str,
    sql: str,
    *,
    graceful_wait: int = 0,
    crash: bool = False,
    interval: float = INTERVAL,
    extra: dict | None = None,
    **recovery,
) -> tuple[ChaosResult, str]:
    server = tidb_factory(graceful_wait=graceful_wait)
    shim = FaultShim(server.port).start() if crash else None
    try:
        proxy = start_chaos_proxy(tmp_path / "proxy", shim.port if shim else server.port, backend=tidb_backend(server), **recovery)
        try:
            result = await run_chaos(
                label,
                server,
                proxy.port,
                tmp_path / "run",
                sql=sql,
                duration=DURATION,
                interval=interval,
                disrupt=crashing(shim) if shim else None,
                extra=extra,
                proxy_admin=proxy.admin_port,
            )
        finally:
            log = proxy.stop()
    finally:
        if shim is not None:
            shim.stop()
    print(json.dumps(result.summary(), indent=2))
    print(f"proxy: {recoveries(log)} sessions recovered or moved\nserver log tail:\n{server_log_tail(server)}")
    if shim is not None:
        shim.check()
    return result, log


def check(result: ChaosResult, log: str) -> None:
    assert_chaos_ok(result, log, min_disruptions=3, min_txns=100)
    # Every disruption reached the pinned sessions (else the run proved nothing).
    assert recoveries(log) >= len(result.restarts), recoveries(log)


async def test_graceful_restarts_safe_mode(tidb_factory, goclient, tmp_path):
    """DM's safe mode (REPLACE) through TiDB's graceful restarts without a graceful wait."""
    check(*await through_proxy(tidb_factory, tmp_path, "graceful0_safe", "safe", idempotent="safe-mode"))


async def test_graceful_restarts_with_a_wait_insert_with_commit_markers(tidb_factory, goclient, tmp_path):
    """Plain INSERT + `n = n + k` counters (a doubled or lost transaction shows), commit markers,
    graceful-wait-before-shutdown 2 s: /status answers 500 first, then TiDB drains."""
    check(
        *await through_proxy(tidb_factory, tmp_path, "graceful2_marker", "insert", graceful_wait=2, interval=2.0, commit_marker=True)
    )  # a restart takes 3-5 s here: >= 3 of them in 20 s


async def test_graceful_restarts_prepared_statements(tidb_factory, goclient, tmp_path):
    """interpolateParams=false (what DM falls back to for a statement over max_allowed_packet):
    every statement through COM_STMT_PREPARE / EXECUTE / CLOSE, statement ids renumbered on
    the new connection, safe mode."""
    result, log = await through_proxy(
        tidb_factory, tmp_path, "graceful0_prepared", "safe", extra={"extra_dsn": "interpolateParams=false"}, idempotent="safe-mode"
    )
    check(result, log)


async def test_sql_layer_crashes_insert_with_commit_markers(tidb_factory, goclient, tmp_path):
    """Every connection cut at once, COMMITs in flight included: each in-doubt COMMIT is resolved
    by its marker row (the same TiDB is still up: the old connection is KILLed first)."""
    check(*await through_proxy(tidb_factory, tmp_path, "crash_marker", "insert", crash=True, commit_marker=True))


async def test_sql_layer_crashes_safe_mode(tidb_factory, goclient, tmp_path):
    """The same crashes, DM's safe mode: an in-doubt COMMIT is replayed (REPLACE is idempotent)."""
    check(*await through_proxy(tidb_factory, tmp_path, "crash_safe", "safe", crash=True, idempotent="safe-mode"))
