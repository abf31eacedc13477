"""Chaos on the user's topology: a TiDB cluster (PD, one store process, three tidb-servers that
share all data, tests/lab/cluster.py) with the proxy in front of all three, watching each
server's status port, while the DM-like Go workload runs (go-sql-driver configured as DM,
DM's session with ``tidb_txn_mode='optimistic'``, 8 pinned connections). Every row verified
afterwards.

- rolling restarts (``graceful-wait-before-shutdown`` 0 and 3 s), one tidb-server at a time,
  each serving again before the next goes, as ``tiup cluster reload`` and TiDB Operator do:
  the proxy moves every session off a draining server (idle ones at once, the others at their
  transaction's end) to the others;
- crashes: one tidb-server SIGKILLed at a time; its sessions fail over to the others by the
  recovery rules. The store lives in its own process and syncs its writes, so exact data after
  a crash is provable here: an in-doubt COMMIT is resolved by its commit marker on another
  server (the marker row fenced: proxy/recovery/markers.py) or replayed in safe mode;
- the store itself restarted (the whole database away for a moment: every tidb-server stays up
  and answers errors meanwhile);
- partitions: one tidb-server's SQL port cut off at a time (netfilter drops every packet: no
  FIN, no RST), its status port still answering: the proxy finds the address dead by its SQL
  health checks (``backend.dead_after``) and its sessions fail over to the other two, instead
  of waiting for TCP to give up.

Skipped with one line without pd-server, unistore-server or tidb-server.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Iterator

import pytest

from tests.lab.chaos import ChaosResult, _every, assert_chaos_ok, noticed_after, recoveries, run_chaos, start_chaos_proxy
from tests.lab.cluster import Cluster
from tests.lab.fixtures import running_cluster
from tests.lab.netfault import Partition, heal_all, partition_unavailable_reason

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

DURATION = 24.0
PARTITION_DOWN = 10.0


@pytest.fixture
def cluster_factory(tmp_path_factory) -> Iterator:
    """``cluster_factory(servers=3, graceful_wait=3)``: a started cluster, stopped at teardown."""
    with contextlib.ExitStack() as clusters:
        yield lambda **kwargs: clusters.enter_context(running_cluster(tmp_path_factory.mktemp("cluster"), **kwargs))


def cluster_backend(cluster: Cluster) -> dict:
    """``[backend]`` in front of a cluster: every tidb-server, each one's status port watched."""
    return {
        "addresses": cluster.addresses,
        "status_urls": {addr: f"http://127.0.0.1:{s.status_port}/status" for addr, s in zip(cluster.addresses, cluster.servers)},
        "health_interval": "0.5s",
    }


def rolling(cluster: Cluster, sig: int = signal.SIGTERM, down_for: float = 0.0):
    """Each event takes the next tidb-server down with ``sig`` and back."""
    return lambda duration, interval, log: _every(interval, duration, log, lambda i: cluster.restart_server(i, sig, down_for))


def partitioning_each(cluster: Cluster, down: float, began: list[float]):
    """Each event cuts the next tidb-server's SQL port off for ``down`` seconds; ``began``
    gets the wall-clock time each cut began."""

    def partition(i: int) -> str:
        server = i % len(cluster.ports)
        with Partition(cluster.ports[server]):
            began.append(time.time())
            time.sleep(down)
        return f"partition of tidb-server {server}"

    return lambda duration, interval, log: _every(interval, duration, log, partition)


def restarting_store(cluster: Cluster):
    def restart(i: int) -> str:
        cluster.restart_store()
        return "store SIGTERM"

    return lambda duration, interval, log: _every(interval, duration, log, restart)


async def through_proxy(cluster: Cluster, tmp_path, label: str, sql: str, disrupt, interval: float, *, backend: dict | None = None,
                        duration: float = DURATION, **recovery) -> tuple[ChaosResult, str]:  # fmt: skip
    proxy = start_chaos_proxy(tmp_path / "proxy", cluster.ports[0], backend={**cluster_backend(cluster), **(backend or {})}, **recovery)
    try:
        result = await run_chaos(
            label, cluster, proxy.port, tmp_path / "run", sql=sql, duration=duration, interval=interval, disrupt=disrupt
        )
    finally:
        log = proxy.stop()
    print(json.dumps(result.summary(), indent=2))
    print(f"proxy: {recoveries(log)} sessions recovered or moved")
    return result, log


def check(result: ChaosResult, log: str, faults: int = 3, sessions_lose_connections: bool = True) -> None:
    """No client error, no 1158, every row; and, where a fault closes the servers' connections
    (``sessions_lose_connections``), every fault reached the pinned sessions."""
    assert_chaos_ok(result, log, min_disruptions=faults, min_txns=100)
    if sessions_lose_connections:
        assert recoveries(log) >= len(result.restarts), recoveries(log)
    refused = [line for line in log.splitlines() if "the client gets 1158" in line]  # (not a connection id holding 1158)
    assert not refused, refused[:5]


async def test_rolling_restart_no_wait_safe_mode(cluster_factory, goclient, tmp_path):
    cluster = cluster_factory(graceful_wait=0)
    check(*await through_proxy(cluster, tmp_path, "roll0_safe", "safe", rolling(cluster), 2.0, idempotent="safe-mode"))


async def test_rolling_restart_with_a_wait_insert_with_commit_markers(cluster_factory, goclient, tmp_path):
    """graceful-wait-before-shutdown 3 s: /status answers 500 first, the proxy moves every
    session to the other two before the server closes anything."""
    cluster = cluster_factory(graceful_wait=3)
    result, log = await through_proxy(cluster, tmp_path, "roll3_marker", "insert", rolling(cluster), 2.0, commit_marker=True)
    check(result, log)
    assert " moved from " in log


async def test_crashes_insert_with_commit_markers(cluster_factory, goclient, tmp_path):
    """SIGKILL of one tidb-server at a time: every in-doubt COMMIT resolved exactly by its
    marker on another server (a 1158 here was the cluster's first finding: the marker could
    only be checked on the server that ran the COMMIT)."""
    cluster = cluster_factory(graceful_wait=0)
    check(*await through_proxy(cluster, tmp_path, "kill_marker", "insert", rolling(cluster, signal.SIGKILL), 3.0, commit_marker=True))


async def test_crashes_safe_mode(cluster_factory, goclient, tmp_path):
    cluster = cluster_factory(graceful_wait=0)
    check(*await through_proxy(cluster, tmp_path, "kill_safe", "safe", rolling(cluster, signal.SIGKILL), 3.0, idempotent="safe-mode"))


async def test_store_restarts_safe_mode(cluster_factory, goclient, tmp_path):
    """The whole database away for a moment: the tidb-servers stay up (no connection is lost) and
    answer what TiDB answers while its store is gone."""
    cluster = cluster_factory(graceful_wait=0)
    # TiDB may ride a store restart out with its own retries (seen: 0 sessions recovered in one
    # run, 20 in the next), so recoveries are not required here.
    check(*await through_proxy(cluster, tmp_path, "store_safe", "safe", restarting_store(cluster), 6.0, idempotent="safe-mode"), faults=2,
          sessions_lose_connections=False)  # fmt: skip


async def test_partitions_insert_with_commit_markers(cluster_factory, goclient, tmp_path):
    """Each tidb-server's SQL port cut off in turn for 10 s: an in-doubt COMMIT on it is settled
    by its marker on another server (the marker row waits for the cut-off server's transaction
    to end: its locks stay while it lives), the rest fail over; no client error, every row."""
    reason = partition_unavailable_reason()
    if reason:
        pytest.skip(f"partition tests skipped: {reason}")
    heal_all()
    cluster = cluster_factory(graceful_wait=0)
    began: list[float] = []
    result, log = await through_proxy(cluster, tmp_path, "part_marker", "insert", partitioning_each(cluster, PARTITION_DOWN, began), 4.0,
                                      backend={"health_interval": "1s", "dead_after": "3s"}, duration=44.0, commit_marker=True)  # fmt: skip
    notice = noticed_after(began, log)
    print(f"partitions of one tidb-server at a time: noticed after {notice} s")
    check(result, log)
    assert all(n <= 3 + 4 * 1 + 1 for n in notice), notice
