"""Real DM v8.5 through its sidecar in the modes users run beside the default, all at once in
one short task while the cluster's tidb-servers restart in turn (bench/dm_paths.py's runs, one
mode each, are the long version): ``online-ddl: true`` with pt-online-schema-change altering
two tables upstream under the load (an index, a column type; with the validator no ADD
COLUMN: bench/dm_paths.py's ``CHANGES_COLUMNS``), the continuous validator in ``full`` mode,
the relay log, ``syncers.compact`` with ``multiple-rows``, and the full load's
``on-duplicate-logical: replace``. No pause, no 1158, the validator finds every row as
upstream has it, every table identical.

Skipped with one line without the DM or cluster binaries, a mount namespace per dm-worker, or
pt-online-schema-change (Debian's percona-toolkit; scripts/setup test installs it).
"""

from __future__ import annotations

import json

import pytest

from bench.dm_paths import PATHS, Setup, path_setup, path_unavailable_reason
from bench.dm_shards import run_lab, summary, unavailable

pytestmark = pytest.mark.integration


def test_online_ddl_validator_relay_and_compact_through_the_sidecar_and_rolling_restarts(tmp_path):
    reasons = [*unavailable(["proxy"]), path_unavailable_reason("online-ddl")]
    if any(reasons):
        pytest.skip(
            f"needs DM, a TiDB cluster, a mount namespace per dm-worker and pt-online-schema-change: {'; '.join(filter(None, reasons))}"
        )
    base = Setup(faults="rolling", graceful_wait=0, duration=40, interval=8, scale=1000, rate=40, catch_up=120)
    r = run_lab(path_setup(base, *PATHS), tmp_path / "lab", print)  # every mode's settings in the one task
    s = summary(r)
    assert len(r["restarts"]) == 5 and not any("error" in x for x in r["restarts"]), r["restarts"]
    changes = [d for d in r["ddl"] if d["sql"].startswith("pt-online-schema-change")]
    assert len(changes) == 2 and all(d["results"][0].startswith("ok") for d in changes), r["ddl"]
    assert (s["pauses"], s["refused_1158"]) == (0, 0), (r["dm"]["failed"], s["refusals"])
    assert r["identical"], r["tables"]
    assert all(p["moved"] + sum(p["recoveries"].values()) > 0 for p in r["proxies"]), r["proxies"]  # the sidecar met the restarts
    assert s["max_lag"] is not None, r["lag"][:5]  # the lag was read downstream
    status = json.dumps(r["status_at_end"])
    assert '"stage": "Running"' in status and '"relayStatus": {' in status, status[:3000]
    # The validator read the rows back through the proxy, found every one as upstream has it.
    assert r["validator_settled_after"] is not None, s["validation"]
    assert s["validation"].startswith("errors 0/0/0") and not s["validation"].startswith("errors 0/0/0, processed 0/0/0"), s["validation"]
