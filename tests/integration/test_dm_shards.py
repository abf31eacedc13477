"""Real DM v8.5 merging two shards through a proxy per dm-worker into a TiDB cluster whose
tidb-servers restart in turn, while the same schema change (ADD COLUMN, ADD INDEX, a column
type change) lands on both shards at once (bench/dm_shards.py's lab, short): no pause, no 1158,
the shard DDL coordinated, the merged tables identical to the shards.

The long runs (pessimistic and optimistic, graceful and SIGKILL) are ``python -m bench.dm_shards``.
Skipped with one line without the DM or cluster binaries, or where a dm-worker cannot have an
/etc/hosts of its own (tests/lab/dm.py).
"""

from __future__ import annotations

import pytest

from bench.dm_shards import Setup, run_lab, summary, unavailable

pytestmark = pytest.mark.integration


def test_two_workers_with_a_sidecar_each_merge_shards_through_rolling_restarts(tmp_path):
    reasons = unavailable(["proxy"])
    if reasons:
        pytest.skip(f"needs DM, a TiDB cluster and a mount namespace per dm-worker: {'; '.join(reasons)}")
    setup = Setup(shard_mode="optimistic", faults="rolling", graceful_wait=0, duration=32, interval=8, scale=300, rate=20, catch_up=120)
    r = run_lab(setup, tmp_path / "lab", print)
    s = summary(r)
    assert len(r["restarts"]) == 4 and not any("error" in x for x in r["restarts"]), r["restarts"]
    assert all(result.startswith("ok") for d in r["ddl"] for result in d["results"]) and len(r["ddl"]) == 3, r["ddl"]
    assert (s["pauses"], s["refused_1158"]) == (0, 0), (r["dm"]["failed"], s["refusals"])
    assert all(p["moved"] + sum(p["recoveries"].values()) > 0 for p in r["proxies"]), r["proxies"]  # each sidecar met the restarts
    assert s["locks_resolved"] >= 1, r["locks"]
    assert r["identical"], r["tables"]  # (the DDL's columns and index included: the checksum reads every column downstream)
