"""Run the DM-like Go workload while the server goes away, then verify every row.

What goes away (``disrupt`` of ``run_chaos``, run every ``interval`` seconds):

- ``restarting(server)``: the server restarted for real -- MariaDB with SIGTERM and SIGKILL in turn,
  TiDB with SIGTERM only (its graceful shutdown; unistore does not sync its writes, so a SIGKILLed
  tidb-server loses acknowledged data even without a proxy: measured);
- ``crashing(shim)``: TiDB's SQL layer dying without its storage -- the fault shim in front of the
  server cuts every connection and refuses connects for ``down`` seconds (``FaultShim.crash``);
- ``partitioning(port, down)``: every packet to and from the server's port dropped (netfilter);
- ``hanging(server, down)``: the server's process stopped (SIGSTOP), its kernel still ACKing.

What every chaos test checks (``assert_chaos_ok``, or ``chaos_problems`` for clients other than
the Go workload): the lab carried out the disruptions, no session is stuck (a hang is a failure,
not a quiet run), no client error, every row verified, and with the proxy in the path, sessions
it recovered in its log.

Shared by the chaos tests, bench/chaos.py, bench/chaos_matrix.py and the README demo (bench/demo.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any, Awaitable, Callable

import attrs
import trio

from tests.lab.faultshim import FaultShim
from tests.lab.goclient import run_goclient, run_goclient_async
from tests.lab.mariadb import MariaDB
from tests.lab.netfault import Hung, Partition
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

# How long the proxy holds a request while the server is away. Below DM's own 60 s read timeout
# (what a deployment must keep), and below the workload's grace: a session the proxy holds for
# the whole window gets the proxy's error inside the run, and one held past it (a proxy that
# never lets go) is still waiting when the grace ends, which the workload reports as a stuck
# worker, an error. A restart here takes 1-5 s (a SIGTERM on a loaded machine up to ~20 s).
CHAOS_BUFFER_WINDOW_S = 40
CHAOS_BUFFER_WINDOW = f"{CHAOS_BUFFER_WINDOW_S}s"
# After its -duration the workload waits this long for its workers; one still waiting for the
# server then is stuck (goclient: an error, ok false).
CHAOS_GRACE_S = CHAOS_BUFFER_WINDOW_S + 10


def start_chaos_proxy(workdir: Path, server_port: int, backend: dict[str, Any] | None = None, listen: dict[str, Any] | None = None,
                      **recovery: Any) -> ProxyProcess:  # fmt: skip
    """The proxy as the chaos tests run it: info logging, a buffer window longer than a lab
    restart and shorter than the workload's grace (``CHAOS_BUFFER_WINDOW``), plus the given
    ``[recovery]`` keys (and ``[backend]``, ``[listen]`` ones). With workers, once all listen."""
    recovery = {"buffer_window": CHAOS_BUFFER_WINDOW, **recovery}
    proxy = ProxyProcess(workdir, server_port, recovery=recovery, log={"level": "info"}, backend=backend or {},
                         **({"listen": listen} if listen else {})).start()  # fmt: skip
    workers = (listen or {}).get("workers", 1)
    deadline = time.monotonic() + 60
    while workers > 1 and proxy.log_text().count("listening on") < workers:
        if time.monotonic() > deadline:
            raise RuntimeError(f"not every worker listens after 60 s:\n{proxy.log_text()[-3000:]}")
        time.sleep(0.1)
    return proxy


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
    restarts: list[str]  # one line per disruption the lab carried out (and confirmed)
    corruption: list[str] = attrs.Factory(list)  # CHECK TABLE findings when the rows did not verify
    # The proxy's sessions with a command in flight, as its /status told them during the
    # workload's grace (``run_chaos``'s ``proxy_admin``): where a stuck one waits.
    late_sessions: list[dict] = attrs.Factory(list)

    @property
    def errors(self) -> int:
        """Client error events: every failed attempt of anything (each failed reconnect attempt,
        every ``retry_delay``, counts), stuck workers included."""
        return int(self.workload.get("error_count", 0))

    @property
    def failed_txns(self) -> int:
        """What a replicator sees fail: transaction attempts that ended in an error, and those
        stuck inside one."""
        return int(self.workload.get("failed_txns", 0))

    @property
    def stuck(self) -> int:
        return int(self.workload.get("stuck_workers", 0))

    @property
    def rows_ok(self) -> bool:
        return bool(self.verify.get("ok"))

    def summary(self) -> dict[str, Any]:
        w = self.workload
        return {
            "label": self.label,
            "client_errors": self.errors,
            "failed_txns": self.failed_txns,
            "stuck_workers": self.stuck,
            "stuck": w.get("stuck", []),
            "errors": w.get("errors", {}),
            "reconnects": w.get("reconnects"),
            "committed_txns": w.get("committed_txns"),
            "committed_rows": w.get("committed_rows"),
            "txns_per_sec": w.get("txns_per_sec"),
            "max_txn_latency_ms": (w.get("txn_latency_ms") or {}).get("max"),
            "longest_stall_ms": w.get("longest_stall_ms"),
            "in_doubt_resolved": w.get("in_doubt_resolved"),
            "restarts": self.restarts,
            "rows_verified": self.verify.get("checked_rows"),
            "row_check": "ok" if self.rows_ok else f"{self.verify.get('problem_count')} problems: {self.verify.get('problems', [])[:5]}",
            "server_table_corruption": self.corruption,
            "proxy_sessions_in_flight_late": self.late_sessions,
        }


def chaos_problems(
    *,
    disruptions: int,
    stuck: list[str],
    errors: dict[str, int],
    rows_ok: bool,
    rows_verified: int,
    rows_committed: int,
    row_problems: Any = None,
    proxy_log: str | None = None,
    allowed_errors: tuple[str, ...] = (),
    min_disruptions: int = 1,
) -> list[str]:
    """What is wrong with a chaos run that should have been transparent (empty: nothing), for any
    client: ``disruptions`` the lab carried out (not what the workload noticed), the ``stuck``
    sessions (one description each), the client's ``errors`` by kind (those starting with one of
    ``allowed_errors`` are expected, e.g. in-doubt COMMITs without commit markers), the row check,
    and with the proxy in the path (``proxy_log``) the sessions it recovered."""
    problems = []
    if disruptions < min_disruptions:
        problems.append(f"only {disruptions} disruptions happened (want >= {min_disruptions}): the run proved nothing")
    if stuck:
        problems.append(f"{len(stuck)} sessions stuck at the end: {stuck[:5]}")
    unexpected = {k: v for k, v in errors.items() if not k.startswith(allowed_errors) or k.startswith("stuck")}
    if unexpected:
        top = sorted(unexpected.items(), key=lambda kv: -kv[1])[:5]
        problems.append(f"{sum(unexpected.values())} client errors: {top}")
    if not rows_ok:
        problems.append(f"rows did not verify: {row_problems}")
    elif rows_verified < rows_committed or rows_committed <= 0:
        problems.append(f"{rows_verified} rows verified of {rows_committed} committed")
    if proxy_log is not None:
        n = recoveries(proxy_log)
        if n <= 0:
            problems.append("the proxy logged no recovered session: the disruptions never reached a session through it")
    return problems


def assert_chaos_ok(
    result: ChaosResult, proxy_log: str | None, *, allowed_errors: tuple[str, ...] = (), min_disruptions: int = 3, min_txns: int = 1
) -> None:
    """The checks every chaos test makes of a Go-workload run (``chaos_problems``), plus: the
    workload ran (``min_txns`` committed) and reported ok (no anomaly, no stuck worker)."""
    w = result.workload
    stuck = [f"worker {s.get('worker')} in {s.get('phase')} (seq {s.get('seq')}, {s.get('blocked_ms')} ms)" for s in w.get("stuck", [])]
    if result.stuck and not stuck:  # an older goclient: the count only
        stuck = [f"worker {k} ({v.get('stuck_phase') or '?'})" for k, v in w.get("per_worker", {}).items() if v.get("stuck")]
    problems = chaos_problems(
        disruptions=len(result.restarts),
        stuck=stuck or ([f"{result.stuck} workers"] if result.stuck else []),
        errors=w.get("errors", {}),
        rows_ok=result.rows_ok,
        rows_verified=int(result.verify.get("checked_rows") or 0),
        rows_committed=int(w.get("committed_rows") or 0),
        row_problems=(result.verify.get("problems", [])[:5], result.corruption),
        proxy_log=proxy_log,
        allowed_errors=allowed_errors,
        min_disruptions=min_disruptions,
    )
    if w.get("anomalies"):
        problems.append(f"workload anomalies: {w['anomalies'][:5]}")
    if stuck and result.late_sessions:
        problems.append(f"the proxy's sessions with a command in flight during the grace: {result.late_sessions}")
    if not w.get("ok") and not stuck and not w.get("anomalies"):
        problems.append("the workload reported ok = false")
    if int(w.get("committed_txns") or 0) < min_txns:
        problems.append(f"{w.get('committed_txns')} transactions committed (want >= {min_txns})")
    assert not problems, f"{result.label}: " + "; ".join(problems) + f"\nrestarts: {result.restarts}"


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
        before = server.pid
        server.restart(sig)
        after = server.pid
        if before is None or after is None or after == before:  # the fault did not happen as logged
            raise RuntimeError(f"restart of {server!r} with {signal.Signals(sig).name}: pid {before} -> {after}")
        return signal.Signals(sig).name

    return lambda duration, interval, log: _every(interval, duration, log, restart)


def crashing(shim: FaultShim, down: float = 1.0) -> Disrupt:
    """The fault shim cuts every connection (FIN and RST in turn) and refuses connects for
    ``down`` seconds: the server's SQL layer dies and comes back, its storage untouched."""

    def crash(i: int) -> str:
        cut = shim.crash(down=down, reset=bool(i % 2))
        return f"crash ({len(cut)} connections cut, {'RST' if i % 2 else 'FIN'})"

    return lambda duration, interval, log: _every(interval, duration, log, crash)


def killing_workers(proxy: ProxyProcess) -> Disrupt:
    """SIGKILL the proxy's workers in turn (``--workers N``): each time, the supervisor starts
    another in its place, which takes the dead one's clients over. Checked: the pid changed."""

    def healthz() -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{proxy.admin_port}/healthz", timeout=5) as response:
            return json.load(response)

    def kill(i: int) -> str:
        pids = healthz()["pids"]
        index = i % len(pids)
        os.kill(pids[index], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while healthz()["pids"][index] in (pids[index], None):
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker {index} (pid {pids[index]}) was not replaced within 30 s")
            time.sleep(0.1)
        return f"SIGKILL of worker {index} (pid {pids[index]})"

    return lambda duration, interval, log: _every(interval, duration, log, kill)


def cut_times(proxy_log: str) -> list[float]:
    """When (seconds of the log's clock) the proxy cut connections to an unreachable address."""
    times = []
    for line in proxy_log.splitlines():
        if "unreachable: no answer to any health check" in line and "cut " in line:
            m = re.match(r"(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[.,]\d+)", line)
            if m:
                times.append(time.mktime(time.strptime(m.group(1)[:19].replace("T", " "), "%Y-%m-%d %H:%M:%S"))
                             + float("0." + re.split(r"[.,]", m.group(1))[1]))  # fmt: skip
    return times


def noticed_after(fault_started_wall: list[float], proxy_log: str) -> list[float]:
    """For each fault (its start, wall clock), seconds until the proxy's first cut after it."""
    cuts = cut_times(proxy_log)
    return [round(min((c - t for c in cuts if c >= t), default=float("inf")), 1) for t in fault_started_wall]


def fault_starts(restarts: list[str], run_started_wall: float) -> list[float]:
    """Wall-clock starts of the chaos run's faults, from its log lines ("... at +12.3s, ...")."""
    return [run_started_wall + float(m.group(1)) for line in restarts if (m := re.search(r"at \+([\d.]+)s", line))]


def partitioning(port: int, down: float) -> Disrupt:
    """Every packet to and from ``port`` dropped for ``down`` seconds (tests/lab/netfault.py):
    a network partition, no FIN, no RST; the server and its sessions stay up behind it."""

    def partition(i: int) -> str:
        with Partition(port):
            time.sleep(down)
        return "partition"

    return lambda duration, interval, log: _every(interval, duration, log, partition)


def hanging(server: MariaDB | TiDB, down: float) -> Disrupt:
    """The server's process stopped (SIGSTOP) for ``down`` seconds: a hung server whose kernel
    still accepts connections and ACKs what it is sent."""

    def hang(i: int) -> str:
        with Hung(server):
            time.sleep(down)
        return "hang (SIGSTOP)"

    return lambda duration, interval, log: _every(interval, duration, log, hang)


async def _sessions_in_flight_after(delay: float, admin_port: int, into: list[dict]) -> None:
    """The proxy's sessions with a command in flight ``delay`` seconds from now (/status)."""
    await trio.sleep(delay)

    def read() -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/status", timeout=5) as answer:
            return json.load(answer)

    try:
        status = await trio.to_thread.run_sync(read)
    except OSError as exc:
        into.append({"error": f"/status: {exc}"})
        return
    into.extend(s for s in status.get("sessions", []) if s.get("command_in_flight"))


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
    grace: float = CHAOS_GRACE_S,
    proxy_admin: int | None = None,
) -> ChaosResult:
    """Set up tables, run the workload against ``port`` (proxy, shim or server) while ``disrupt``
    runs (default: ``restarting(server)``; none with ``restarts=False``), then verify every row
    directly on the server. On TiDB the workload's session is DM's (``TIDB_SESSION``) unless
    ``extra`` gives one. A worker still waiting for the server ``grace`` seconds after the run's
    end is stuck: an error, and the workload is not ok. ``proxy_admin``: the proxy's admin port,
    whose /status is read once during the grace (``ChaosResult.late_sessions``)."""
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
    late: list[dict] = []
    async with trio.open_nursery() as nursery:
        if restarts:
            nursery.start_soon(disrupt or restarting(server), duration, interval, log)
        if proxy_admin is not None:
            nursery.start_soon(_sessions_in_flight_after, duration + grace / 2, proxy_admin, late)
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
            grace=f"{grace:g}s",
            check=False,
            timeout=duration + grace + 120,
            **creds,
            **extra,
        )
        nursery.cancel_scope.cancel()
    if not server.is_running():
        server.start()
    verify = run_goclient("verify", port=server.port, expect=str(expect), table=table, counters_table=counters, check=False, **creds)
    result = ChaosResult(label, workload, verify, log, late_sessions=late)
    if not result.rows_ok:
        result.corruption = corrupt_tables(server, [table, counters])
    (workdir / f"{label}-summary.json").write_text(json.dumps(result.summary(), indent=2))
    return result
