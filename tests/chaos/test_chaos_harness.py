"""The chaos harness itself: a session held without end must fail a chaos run, not pass it as
"0 client errors". Two ways a session can hang with the proxy in the path, each under the Go
workload with a short run and a short grace:

- the backend answers nothing (the fault shim between the proxy and MariaDB holds COMMIT's
  answer for good): the worker waits in COMMIT;
- the backend never comes back and the proxy's buffer window is longer than the run: the proxy
  holds every request.

Each must come out as stuck workers (counted, with the phase they wait in), errors, the
workload not ok, and ``assert_chaos_ok`` failing on them, while the rows still verify.
"""

from __future__ import annotations

import pytest

from tests.lab.chaos import assert_chaos_ok, run_chaos
from tests.lab.faultshim import FaultShim
from tests.lab.proxy import ProxyProcess

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

DURATION = 3.0
GRACE = 2.0


def _check_stuck(result, phases: set[str], workers: int) -> None:
    w = result.workload
    print({k: w.get(k) for k in ("ok", "stuck_workers", "stuck_phases", "error_count", "failed_txns", "longest_stall_ms", "errors")})
    assert w["ok"] is False, w
    assert result.stuck == workers == len(w["stuck"]), w["stuck"]
    assert set(w["stuck_phases"]) <= phases and sum(w["stuck_phases"].values()) == workers, w["stuck_phases"]
    assert sum(v for k, v in w["errors"].items() if k.startswith("stuck: ")) == workers, w["errors"]
    assert result.errors >= workers
    # Held since before the deadline: the unfinished transactions count in the longest stall.
    assert w["longest_stall_ms"] >= GRACE * 1000, w["stall_ms"]
    assert result.rows_ok, result.verify  # nothing lost: the in-doubt COMMIT is checked as such
    with pytest.raises(AssertionError, match="stuck"):
        assert_chaos_ok(result, None, min_disruptions=0)


async def test_a_backend_that_never_answers_commit_is_a_stuck_worker(mariadb, goclient, tmp_path):
    with FaultShim(mariadb.port) as shim:
        rule = shim.stall(None, match="COMMIT", user="app")  # COMMIT runs, its answer never comes
        proxy = ProxyProcess(tmp_path / "proxy", shim.port, recovery={"buffer_window": "1h"}, log={"level": "info"}).start()
        try:
            result = await run_chaos("held_commit", mariadb, proxy.port, tmp_path, conns=2, duration=DURATION, restarts=False, grace=GRACE)
        finally:
            shim.release()
            proxy.stop()
        assert rule.matched, shim.format_log()
    _check_stuck(result, {"commit"}, 1)
    assert result.workload["failed_txns"] >= 1  # the stuck transaction is a failed one
    assert sum(1 for v in result.workload["per_worker"].values() if v["in_doubt_seq"]) == 1


async def test_a_backend_that_never_returns_behind_a_long_buffer_window_is_stuck(mariadb_factory, goclient, tmp_path):
    server = mariadb_factory()
    proxy = ProxyProcess(tmp_path / "proxy", server.port, recovery={"buffer_window": "1h"}, log={"level": "info"}).start()

    async def stop_for_good(duration: float, interval: float, log: list[str]) -> None:
        import trio

        await trio.sleep(1.0)
        await trio.to_thread.run_sync(server.stop)
        log.append("stopped, not restarted")

    try:
        result = await run_chaos(
            "held_by_proxy", server, proxy.port, tmp_path, conns=3, duration=DURATION, disrupt=stop_for_good, grace=GRACE
        )  # run_chaos starts the server again before it verifies
    finally:
        proxy.stop(timeout=30)
    # Each waits where the server went away: in its transaction, or reconnecting after a COMMIT
    # the proxy could not replay (1158: in doubt, not safe mode) -- the proxy holds the login too.
    _check_stuck(result, {"begin", "dml", "commit", "ping", "connect"}, 3)
