"""Run the DM-like Go workload while the server goes away, then verify every row.

What goes away (``disrupt`` of ``run_chaos``, run every ``interval`` seconds):

- ``restarting(server)``: the server restarted for real -- MariaDB with SIGTERM and SIGKILL in turn,
  TiDB with SIGTERM only (its graceful shutdown; unistore does not sync its writes, so a SIGKILLed
  tidb-server loses acknowledged data even without a proxy: measured);
- ``crashing(shim)``: TiDB's SQL layer dying without its storage -- the fault shim in front of the
  server cuts every connection and refuses connects for ``down`` seconds (``FaultShim.crash``).

Shared by the chaos tests, bench/chaos.py, bench/chaos_matrix.py and the README demo (bench/demo.py).
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import attrs
import trio

from tests.lab.faultshim import FaultShim
from tests.lab.goclient import run_goclient, run_goclient_async
from tests.lab.mariadb import MariaDB
from tests.lab.proxy import ProxyProcess
from tests.lab.tidb import TiDB

# A disruption: run while the workload runs, appending one line per event to ``log``.
Disrupt = Callable[[float, float, list[str]], Awaitable[None]]
# DM's session on TiDB (dm/pkg/conn/basedb.go): the Go client's defaults plus optimistic transactions.
TIDB_SESSION = [
    "sql_mode=ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,"
    "NO_AUTO_CREATE_USER,NO_ENGINE_SUBSTITUTION",
    "time_zone=+00:00",
    "foreign_key_checks=0",
    "tidb_txn_mode=optimistic",
]

# A restart in the lab may keep the server away up to its stop and start timeouts (30 s each)
# on a slow machine (a graceful shutdown alone may wait 20 s for threads). "Zero client errors"
# must test the proxy, not the machine's disk, so the proxy holds requests longer than that.
CHAOS_BUFFER_WINDOW = "90s"


def start_chaos_proxy(workdir: Path, server_port: int, backend: dict[str, Any] | None = None, **recovery: Any) -> ProxyProcess:
    """The proxy as the chaos tests run it: info logging, a buffer window longer than any lab
    restart, plus the given ``[recovery]`` keys (and ``[backend]`` ones)."""
    recovery = {"buffer_window": CHAOS_BUFFER_WINDOW, **recovery}
    return ProxyProcess(workdir, server_port, recovery=recovery, log={"level": "info"}, backend=backend or {}).start()


def tidb_backend(server: TiDB) -> dict[str, Any]:
    """``[backend]`` as deployed in front of TiDB: its status port watched (draining during
    graceful-wait-before-shutdown)."""
    return {"status_port": server.status_port, "health_interval": "0.5s"}


def recoveries(proxy_log: str) -> int:
    """Sessions that got a new backend connection: recovered after a loss, or moved off a
    draining TiDB between transactions."""
    return sum(1 for line in proxy_log.splitlines() if "recovered on" in line or " moved from " in line)


def corrupt_tables(server: MariaDB | TiDB, tables: list[str]) -> list[str]:
    """What CHECK TABLE reports against ``tables`` (in database test), empty when they are sound
    (TiDB: what ADMIN CHECK TABLE reports, data against indexes).

    MariaDB itself has been seen to corrupt a table across a SIGKILL restart here (10.11.19:
    a duplicate key inside InnoDB's PRIMARY B-tree, CHECK TABLE "Corrupt", no error logged), which
    no SQL client can cause; a chaos run on such a table says nothing about the proxy."""
    found = []
    if server.flavor == "tidb":
        for table in tables:
            try:
                server.query(f"ADMIN CHECK TABLE test.{table}")
            except Exception as exc:  # noqa: BLE001 - what it says is the finding
                found.append(f"{table}: {exc}")
        return found
    for table in tables:
        for _table, _op, msg_type, text in server.query(f"CHECK TABLE test.{table}"):
            if msg_type.lower() != "status" or text.lower() not in ("ok", "table is already up to date"):
                found.append(f"{table}: {msg_type}: {text}")
    return found


def server_log_tail(server: MariaDB, lines: int = 40) -> str:
    """The end of the server's error log (shutdown and startup times), for failure messages."""
    return "\n".join(line[:400] for line in server.error_log_text().splitlines()[-lines:])  # TiDB logs stacks


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


async def _every(interval: float, duration: float, log: list[str], event: Callable[[int], str]) -> None:
    """``event(i)`` (blocking, in a thread) every ``interval`` seconds while ``duration`` lasts;
    each logs one line."""
    start = time.monotonic()
    i = 0
    await trio.sleep(interval)
    while time.monotonic() - start + 1 < duration:
        began = time.monotonic()
        what = await trio.to_thread.run_sync(event, i)
        i += 1
        log.append(f"{what} at +{began - start:.1f}s, down {time.monotonic() - began:.2f}s")
        await trio.sleep(interval)


def restarting(server: MariaDB | TiDB, signals: tuple[int, ...] | None = None) -> Disrupt:
    """Restart ``server`` with ``signals`` in turn (default: MariaDB SIGTERM and SIGKILL; TiDB
    SIGTERM only, see the module doc)."""
    sigs = signals or ((signal.SIGTERM,) if server.flavor == "tidb" else (signal.SIGTERM, signal.SIGKILL))

    def restart(i: int) -> str:
        sig = sigs[i % len(sigs)]
        server.restart(sig)
        return signal.Signals(sig).name

    return lambda duration, interval, log: _every(interval, duration, log, restart)


def crashing(shim: FaultShim, down: float = 1.0) -> Disrupt:
    """The fault shim cuts every connection (FIN and RST in turn) and refuses connects for
    ``down`` seconds: the server's SQL layer dies and comes back, its storage untouched."""

    def crash(i: int) -> str:
        cut = shim.crash(down=down, reset=bool(i % 2))
        return f"crash ({len(cut)} connections cut, {'RST' if i % 2 else 'FIN'})"

    return lambda duration, interval, log: _every(interval, duration, log, crash)


async def restart_periodically(server: MariaDB, duration: float, interval: float, log: list[str]) -> None:
    """Alternate graceful (SIGTERM) and crash (SIGKILL) restarts for ``duration`` seconds."""
    await restarting(server, (signal.SIGTERM, signal.SIGKILL))(duration, interval, log)


async def run_chaos(
    label: str,
    server: MariaDB | TiDB,
    port: int,
    workdir: Path,
    *,
    sql: str = "safe",
    duration: float = 20.0,
    interval: float = 4.0,
    conns: int = 8,
    batch: int = 10,
    restarts: bool = True,
    disrupt: Disrupt | None = None,
    extra: dict[str, Any] | None = None,
) -> ChaosResult:
    """Set up tables, run the workload against ``port`` (proxy, shim or server) while ``disrupt``
    runs (default: ``restarting(server)``; none with ``restarts=False``), then verify every row
    directly on the server. On TiDB the workload's session is DM's (``TIDB_SESSION``) unless
    ``extra`` gives one."""
    workdir.mkdir(parents=True, exist_ok=True)
    creds = dict(user="app", password="apppw", db="test")
    table = f"t_{label.replace('-', '_')}"
    counters = f"c_{label.replace('-', '_')}"
    run_goclient("setup", port=server.port, conns=conns, table=table, counters_table=counters, **creds)
    expect = workdir / f"{label}-workload.json"
    log: list[str] = []
    extra = dict(extra or {})
    if server.flavor == "tidb":
        extra.setdefault("session", TIDB_SESSION)
    async with trio.open_nursery() as nursery:
        if restarts:
            nursery.start_soon(disrupt or restarting(server), duration, interval, log)
        workload = await run_goclient_async(
            "workload",
            port=port,
            conns=conns,
            duration=duration,
            batch=batch,
            sql=sql,
            table=table,
            counters_table=counters,
            out=str(expect),
            check=False,
            timeout=duration + 120,
            **creds,
            **extra,
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
