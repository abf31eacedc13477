"""A worker's crash under load (``--workers 2``, ``listen.takeover``): the DM-like Go workload
(go-sql-driver, 8 pinned connections, non-idempotent transactions with commit markers) while a
worker is SIGKILLed every few seconds, then every row verified on the server. No client
connection is lost (the workload replaced none), no session hangs, and the only errors are the
1213s of transactions the dead worker had open (known not committed: the workload retries them
in place, as DM does); on MariaDB and on TiDB."""

from __future__ import annotations

import json

import pytest

from tests.lab.chaos import assert_chaos_ok, killing_workers, recoveries, run_chaos, start_chaos_proxy

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

RETRIED_IN_PLACE = tuple(f"{phase}: Error 1213" for phase in ("begin", "dml", "commit"))


async def test_workers_killed_under_load_lose_no_client(db, goclient, tmp_path):
    proxy = start_chaos_proxy(tmp_path / "proxy", db.port, listen={"workers": 2}, commit_marker=True)
    try:
        result = await run_chaos("workerkill", db, proxy.port, tmp_path / "run", sql="insert", duration=30, interval=4,
                                 disrupt=killing_workers(proxy))  # fmt: skip
    finally:
        log = proxy.stop(timeout=30)
    print(json.dumps(result.summary(), indent=2))
    taken = log.count(", which died (")  # one line per session taken over
    closed = log.count("which ran it, died")
    print(f"proxy: {taken} sessions taken over, {closed} closed, {recoveries(log)} recovered")
    assert_chaos_ok(result, log, allowed_errors=RETRIED_IN_PLACE, min_disruptions=5, min_txns=100)
    assert result.workload.get("reconnects") == 0, "a client connection was lost"
    assert closed == 0, "a session was closed instead of taken over"
    assert taken >= len(result.restarts), (taken, result.restarts)  # about half the 8 sessions each time
