"""Run the DM-like Go workload while MariaDB restarts for real, then verify every row.

Shared by the chaos tests and the README demo (bench/demo.py).
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import attrs
import trio

from tests.lab.goclient import run_goclient, run_goclient_async
from tests.lab.mariadb import MariaDB
from tests.lab.proxy import ProxyProcess

# A restart in the lab may keep the server away up to its stop and start timeouts (30 s each)
# on a slow machine (a graceful shutdown alone may wait 20 s for threads). "Zero client errors"
# must test the proxy, not the machine's disk, so the proxy holds requests longer than that.
CHAOS_BUFFER_WINDOW = "90s"


def start_chaos_proxy(workdir: Path, server_port: int, **recovery: Any) -> ProxyProcess:
    """The proxy as the chaos tests run it: info logging, a buffer window longer than any lab
    restart, plus the given ``[recovery]`` keys."""
    recovery = {"buffer_window": CHAOS_BUFFER_WINDOW, **recovery}
    return ProxyProcess(workdir, server_port, recovery=recovery, log={"level": "info"}).start()


def corrupt_tables(server: MariaDB, tables: list[str]) -> list[str]:
    """What CHECK TABLE reports against ``tables`` (in database test), empty when they are sound.

    MariaDB itself has been seen to corrupt a table across a SIGKILL restart here (10.11.19:
    a duplicate key inside InnoDB's PRIMARY B-tree, CHECK TABLE "Corrupt", no error logged), which
    no SQL client can cause; a chaos run on such a table says nothing about the proxy."""
    found = []
    for table in tables:
        for _table, _op, msg_type, text in server.query(f"CHECK TABLE test.{table}"):
            if msg_type.lower() != "status" or text.lower() not in ("ok", "table is already up to date"):
                found.append(f"{table}: {msg_type}: {text}")
    return found


def server_log_tail(server: MariaDB, lines: int = 40) -> str:
    """The end of the server's error log (shutdown and startup times), for failure messages."""
    return "\n".join(server.error_log_text().splitlines()[-lines:])


@attrs.define
class ChaosResult:
    label: str
    workload: dict
    verify: dict
    restarts: list[str]
    corruption: list[str] = attrs.Factory(list)  # CHECK TABLE findings when the rows did not verify

    @property
    def errors(self) -> int:
        return int(self.workload.get("error_count", 0))

    @property
    def rows_ok(self) -> bool:
        return bool(self.verify.get("ok"))

    def summary(self) -> dict[str, Any]:
        w = self.workload
        return {
            "label": self.label,
            "client_errors": self.errors,
            "errors": w.get("errors", {}),
            "committed_txns": w.get("committed_txns"),
            "committed_rows": w.get("committed_rows"),
            "txns_per_sec": w.get("txns_per_sec"),
            "max_txn_latency_ms": (w.get("txn_latency_ms") or {}).get("max"),
            "in_doubt_resolved": w.get("in_doubt_resolved"),
            "restarts": self.restarts,
            "rows_verified": self.verify.get("checked_rows"),
            "row_check": "ok" if self.rows_ok else f"{self.verify.get('problem_count')} problems: {self.verify.get('problems', [])[:5]}",
            "server_table_corruption": self.corruption,
        }


async def restart_periodically(server: MariaDB, duration: float, interval: float, log: list[str]) -> None:
    """Alternate graceful (SIGTERM) and crash (SIGKILL) restarts for ``duration`` seconds."""
    start = time.monotonic()
    sigs = [signal.SIGTERM, signal.SIGKILL]
    i = 0
    await trio.sleep(interval)
    while time.monotonic() - start + 1 < duration:
        sig = sigs[i % 2]
        i += 1
        began = time.monotonic()
        await trio.to_thread.run_sync(lambda: server.restart(sig))
        log.append(f"{signal.Signals(sig).name} at +{began - start:.1f}s, down {time.monotonic() - began:.2f}s")
        await trio.sleep(interval)


async def run_chaos(
    label: str,
    server: MariaDB,
    port: int,
    workdir: Path,
    *,
    sql: str = "safe",
    duration: float = 20.0,
    interval: float = 4.0,
    conns: int = 8,
    batch: int = 10,
    restarts: bool = True,
    extra: dict[str, Any] | None = None,
) -> ChaosResult:
    """Set up tables, run the workload against ``port`` (proxy or server) while the server
    restarts, then verify every row directly on the server."""
    workdir.mkdir(parents=True, exist_ok=True)
    creds = dict(user="app", password="apppw", db="test")
    table = f"t_{label.replace('-', '_')}"
    counters = f"c_{label.replace('-', '_')}"
    run_goclient("setup", port=server.port, conns=conns, table=table, counters_table=counters, **creds)
    expect = workdir / f"{label}-workload.json"
    log: list[str] = []
    async with trio.open_nursery() as nursery:
        if restarts:
            nursery.start_soon(restart_periodically, server, duration, interval, log)
        workload = await run_goclient_async(
            "workload", port=port, conns=conns, duration=duration, batch=batch, sql=sql, table=table,
            counters_table=counters, out=str(expect), check=False, timeout=duration + 120, **creds, **(extra or {}),
        )
        nursery.cancel_scope.cancel()
    if not server.is_running():
        server.start()
    verify = run_goclient("verify", port=server.port, expect=str(expect), table=table, counters_table=counters, check=False, **creds)
    result = ChaosResult(label, workload, verify, log)
    if not result.rows_ok:
        result.corruption = corrupt_tables(server, [table, counters])
    (workdir / f"{label}-summary.json").write_text(json.dumps(result.summary(), indent=2))
    return result
