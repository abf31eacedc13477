"""The seed's story with the real parts: DM v8.5 replicating into TiDB while TiDB restarts.

    python -m bench.dm_e2e [--duration 300] [--interval 8] [--restarts N] [--chaos-from start|sync]
                           [--graceful-waits 0,3] [--targets direct,proxy]

For each target (``direct``: DM writes to tidb-server; ``proxy``: DM writes to replay-proxy in
front of it, configured as configs/dm-sidecar.toml) a fresh lab: an upstream MariaDB with a
row binlog (utf8mb4), a preloaded shop schema, tidb-server (unistore), one dm-master and one
dm-worker on loopback, a source and a ``task-mode: all`` task (16 DML workers, batches of 100).
A load writes upstream (bench/dm_load.py) from the moment the task starts. TiDB restarts
(SIGTERM, ``graceful-wait-before-shutdown`` taking the listed values in turn), exactly
``--restarts`` of them (default duration / interval), ``--interval`` seconds apart, the same
schedule for every target: with ``--chaos-from start`` from the task's start (they hit the full
load, then the sync), with ``--chaos-from sync`` only once DM's task runs its sync unit
(``dmctl query-status``: unit Sync, stage Running; the dump and the full load are done), so the
sync phase has a baseline of its own. The load runs at least ``--duration`` seconds and until
the last restart is an interval old. Then the load stops, DM catches up, and every table is
compared upstream and downstream (row count and a NULL-safe checksum of every row and column,
bench/dm_load.py, the same SQL on both).

Counted from dm-worker's log, per phase (full load / sync): pauses (``"paused"``; one
auto-resumed within a second never shows in ``query-status``), the time paused, resumes, the
failed transactions as DM sees them (sync: a batch try that failed -- ``execute sql failed by
connection error`` / ``by retryable error``, retried in place, or ``execute statements failed
after retry``, given up; full load: ``execute statement failed``, a chunk's statement), the
errors the pauses report by kind (``unit process error``), and apart from those the raw ERROR
lines. Lag: the
upstream heartbeat row read on TiDB every second. Through the proxy its /metrics add the
recoveries by outcome, refusals (1158) apart. Results in bench/results/<timestamp>-dm_e2e/:
table.txt, results.json, lag.png (lag over time, restarts marked).

Needs the DM and tidb-server binaries (tests/lab/dm.py, tests/lab/tidb.py say where from).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import re
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from bench import REPO, dm_load
from bench.hygiene import sigterm_as_interrupt
from bench.runinfo import run_meta
from tests.lab.dm import DMCluster, dm_unavailable_reason
from tests.lab.mariadb import MariaDB
from tests.lab.proxy import ProxyProcess
from tests.lab.tidb import TiDB, tidb_unavailable_reason

UPSTREAM_ARGS = ["--log-bin=binlog", "--binlog-format=ROW", "--binlog-row-image=FULL", "--server-id=1",
                 "--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci"]  # fmt: skip
DM_USER, DM_PASSWORD = "dm", "dm-secret"
SOURCE_ID = "mysql-replica-01"  # configs/deploy/dm/task.yaml's
TASK = "shop"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.dm_e2e", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--duration", type=float, default=300, help="seconds of load and restarts per target (default 300)")
    p.add_argument("--interval", type=float, default=8, help="seconds from one restart to the next (default 8)")
    p.add_argument("--restarts", type=int, help="TiDB restarts per target, the same for each (default duration / interval)")
    p.add_argument("--chaos-from", choices=("start", "sync"), default="start",
                   help="start: restarts from start-task on (full load, then sync); sync: only once DM's sync unit runs")  # fmt: skip
    p.add_argument("--sync-timeout", type=float, default=900, help="--chaos-from sync: seconds to wait for the sync unit (default 900)")
    p.add_argument("--graceful-waits", default="0,3", help="graceful-wait-before-shutdown values, in turn (default 0,3)")
    p.add_argument("--targets", default="direct,proxy", help="direct, proxy or both (default)")
    p.add_argument("--scale", type=int, default=60000, help="orders preloaded upstream (default 60000: ~45 MB)")
    p.add_argument("--rate", type=float, default=140, help="upstream transactions per second (default 140)")
    p.add_argument("--catch-up", type=float, default=600, help="seconds DM may take to catch up at the end")
    p.add_argument("--general-log", action="store_true", help="turn on TiDB's general log (the SQL corpus)")
    p.add_argument("--out", type=Path, help="results folder (default bench/results/<timestamp>-dm_e2e)")
    args = p.parse_args(argv)
    args.graceful_waits = [int(x) for x in args.graceful_waits.split(",")]
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if args.restarts is None:
        args.restarts = max(1, int(args.duration // args.interval))
    return args


class Restarter(threading.Thread):
    """Restart TiDB ``count`` times, every ``interval`` seconds (SIGTERM, then start), graceful
    waits in turn; with ``ready``, only once ``ready()`` says so (checked every second)."""

    def __init__(self, tidb: TiDB, interval: float, waits: list[int], log, count: int, ready=None) -> None:
        super().__init__(daemon=True, name="restarter")
        self.tidb, self.interval, self.waits, self.log, self.count, self.ready = tidb, interval, waits, log, count, ready
        self.stop_event = threading.Event()
        self.restarts: list[dict[str, float]] = []
        self.began: float | None = None  # when the schedule started (None: ``ready`` never said so)

    def run(self) -> None:
        while self.ready is not None and not self.ready():
            if self.stop_event.wait(1.0):
                return
        self.began = time.time()
        if self.ready is not None:
            self.log("  DM's sync unit is running: restarts begin")
        n = 0
        while n < self.count and not self.stop_event.wait(self.interval):
            wait = self.tidb.graceful_wait
            began = time.time()
            self.tidb.stop()
            down = time.time()
            n += 1
            self.tidb.graceful_wait = self.waits[n % len(self.waits)]  # read by the next start
            self.tidb.start()
            self.restarts.append({"stop": began, "down": down, "up": time.time(), "graceful_wait": wait})
            self.log(f"  restart {n}/{self.count}: graceful wait {wait} s, down {down - began:.1f} s after SIGTERM, "
                     f"up {time.time() - down:.1f} s later")  # fmt: skip


def subtask_units(answer: Any) -> list[tuple[str, str]]:
    """(stage, unit) of every subtask in a ``query-status <task>`` answer
    (``sources[].subTaskStatus[]``, looked for anywhere in the document)."""
    found = []
    if isinstance(answer, dict):
        for key, value in answer.items():
            if key == "subTaskStatus" and isinstance(value, list):
                found += [(str(st.get("stage", "")), str(st.get("unit", ""))) for st in value if isinstance(st, dict)]
            else:
                found += subtask_units(value)
    elif isinstance(answer, list):
        for item in answer:
            found += subtask_units(item)
    return found


class Sampler(threading.Thread):
    """Every second the heartbeat lag read on TiDB; every ``status_every`` seconds DM's units
    (``query-status``), and when the sync unit first ran."""

    def __init__(self, tidb: TiDB, dm: DMCluster, status_every: float = 2.0) -> None:
        super().__init__(daemon=True, name="sampler")
        self.tidb, self.dm, self.status_every = tidb, dm, status_every
        self.stop_event = threading.Event()
        self.lag: list[tuple[float, float | None]] = []
        self.units: list[tuple[float, list[tuple[str, str]]]] = []
        self.sync_running_at: float | None = None  # first query-status with every subtask Running in Sync

    def run(self) -> None:
        last_status = 0.0
        while not self.stop_event.wait(1.0):
            self.lag.append((time.time(), dm_load.heartbeat_lag(self.tidb.port)))
            if time.monotonic() - last_status >= self.status_every:
                last_status = time.monotonic()
                self.poll_status()

    def poll_status(self) -> None:
        try:
            units = subtask_units(self.dm.ctl("query-status", TASK, timeout=30))
        except Exception:  # dmctl busy or the master unreachable: the next poll says
            return
        now = time.time()
        if not self.units or self.units[-1][1] != units:
            self.units.append((now, units))
        if self.sync_running_at is None and units and all(stage == "Running" and unit == "Sync" for stage, unit in units):
            self.sync_running_at = now

    def in_sync(self) -> bool:
        return self.sync_running_at is not None


def task_yaml(path: Path, port: int, dump_dir: Path) -> Path:
    path.write_text(f"""name: "{TASK}"
task-mode: all
meta-schema: "dm_meta"
target-database:
  host: "127.0.0.1"
  port: {port}
  user: "{DM_USER}"
  password: "{DM_PASSWORD}"
block-allow-list:
  bw:
    do-dbs: ["{dm_load.SCHEMA}"]
mydumpers:
  global:
    threads: 4
    chunk-filesize: 8
loaders:
  global:
    pool-size: 16
    dir: "{dump_dir}"
    import-mode: "logical"
    on-duplicate-logical: "replace"
syncers:
  global:
    worker-count: 16
    batch: 100
mysql-instances:
  - source-id: "{SOURCE_ID}"
    block-allow-list: "bw"
    mydumper-config-name: "global"
    loader-config-name: "global"
    syncer-config-name: "global"
""")
    return path


def source_yaml(path: Path, port: int) -> Path:
    path.write_text(f"""source-id: "{SOURCE_ID}"
flavor: "mariadb"
enable-gtid: false
from:
  host: "127.0.0.1"
  port: {port}
  user: "root"
  password: ""
""")
    return path


def sidecar_overrides(tidb: TiDB) -> dict[str, Any]:
    """configs/dm-sidecar.toml's settings, on the lab's ports."""
    return {
        "name": "dm-e2e",
        "listen": {"max_connections": 256, "drain_timeout": "20s"},
        "backend": {"status_port": tidb.status_port, "health_interval": "2s"},
        "users": [{"name": DM_USER, "password": DM_PASSWORD}],
        "recovery": {"buffer_window": "30s", "idempotent": "safe-mode", "commit_marker": True},
        "log": {"level": "info"},
    }


def run_target(target: str, args: argparse.Namespace, workdir: Path, log) -> dict[str, Any]:
    workdir.mkdir(parents=True)
    up = MariaDB(workdir / "upstream", extra_args=UPSTREAM_ARGS)
    tidb = TiDB(workdir / "tidb", graceful_wait=args.graceful_waits[0], general_log=args.general_log)
    proxy: ProxyProcess | None = None
    dm: DMCluster | None = None
    restarter = sampler = load = None
    try:
        up.start()
        t = time.time()
        rows = dm_load.create_and_preload(up.port, args.scale)
        log(f"  upstream preloaded in {time.time() - t:.0f} s: {rows}")
        tidb.start()
        tidb.create_user(DM_USER, DM_PASSWORD)
        port = tidb.port
        if target == "proxy":
            proxy = ProxyProcess(workdir / "proxy", tidb.port, **sidecar_overrides(tidb))
            proxy.start()
            port = proxy.port
        dm = DMCluster(workdir / "dm")
        dm.start()
        dm.create_source(source_yaml(workdir / "source.yaml", up.port))
        task = task_yaml(workdir / "task.yaml", port, workdir / "dumped")
        check = dm.ctl("check-task", str(task))
        sampler = Sampler(tidb, dm)
        ready = sampler.in_sync if args.chaos_from == "sync" else None
        restarter = Restarter(tidb, args.interval, args.graceful_waits, log, args.restarts, ready)
        load = dm_load.ShopLoad(up.port, args.rate)
        started = time.time()
        answer = dm.ctl("start-task", str(task))
        if not answer.get("result"):
            raise RuntimeError(f"start-task failed: {json.dumps(answer)[:2000]}")
        load.start()
        sampler.start()
        restarter.start()
        log(f"  task started; load at {args.rate:g} txn/s for at least {args.duration:g} s; {args.restarts} TiDB restarts "
            f"{args.interval:g} s apart from {'the start' if args.chaos_from == 'start' else 'the sync unit on'}")  # fmt: skip
        time.sleep(args.duration)
        # Every target gets the same number of restarts: wait for the schedule (bounded), and
        # keep the load on for an interval after the last one.
        limit = time.time() + args.restarts * (args.interval + 180) + (args.sync_timeout if args.chaos_from == "sync" else 0)
        while restarter.is_alive() and time.time() < limit:
            restarter.join(1.0)
        if len(restarter.restarts) == args.restarts:
            time.sleep(max(0.0, restarter.restarts[-1]["up"] + args.interval - time.time()))
        else:
            log(f"  only {len(restarter.restarts)} of {args.restarts} restarts happened"
                + (" (the sync unit never ran)" if args.chaos_from == "sync" and not sampler.in_sync() else ""))  # fmt: skip
        restarter.stop_event.set()
        restarter.join(120)
        stats = load.stop()
        ended = time.time()
        log(f"  load stopped: {stats.transactions} transactions upstream; waiting for DM to catch up")
        caught_up = wait_caught_up(up, tidb, args.catch_up)
        sampler.stop_event.set()
        sampler.join(10)
        upstream, downstream = dm_load.checksums(up.port), dm_load.checksums(tidb.port)
        if args.general_log:
            corpus = dm_statements(tidb.error_log_text())
            with open(workdir / "dm_statements.jsonl", "w") as f:
                f.writelines(json.dumps(entry) + "\n" for entry in corpus)
            log(f"  {len(corpus)} statement shapes of DM in TiDB's general log: {workdir / 'dm_statements.jsonl'}")
        events = dm_events(dm, started, sync_running_at=sampler.sync_running_at)
        return {
            "target": target,
            "check_task": check.get("result"),
            "started": started, "ended": ended, "caught_up_after": caught_up,
            "chaos_from": args.chaos_from, "restarts_planned": args.restarts, "restarts_began": restarter.began,
            "restarts": [dict(x, phase=phase_at(x["stop"], events["sync_started"])) for x in restarter.restarts],
            "units": sampler.units,
            "load": {"transactions": stats.transactions, "statements": stats.statements, "errors": len(stats.errors)},
            "preloaded": rows,
            "lag": sampler.lag,
            "dm": events,
            "proxy": proxy_numbers(proxy) if proxy is not None else None,
            "tables": {name: {"upstream": upstream[name], "downstream": downstream.get(name)} for name in upstream},
            "identical": upstream == downstream,
        }  # fmt: skip
    finally:
        for thread in (restarter, sampler):
            if thread is not None:
                thread.stop_event.set()
        if load is not None:
            load.stop()
        for stop in (dm.stop if dm else None, proxy.stop if proxy else None, tidb.stop, up.stop):
            if stop is not None:
                try:
                    stop()
                except Exception as exc:  # the others are stopped anyway
                    log(f"  stopping: {exc}")


def wait_caught_up(up: MariaDB, tidb: TiDB, timeout: float) -> float | None:
    """Seconds until every table's checksum downstream equals upstream's (None: not within timeout)."""
    began = time.monotonic()
    upstream = dm_load.checksums(up.port)
    while time.monotonic() - began < timeout:
        try:
            if dm_load.checksums(tidb.port) == upstream:
                return time.monotonic() - began
        except Exception:
            pass
        time.sleep(5)
    return None


_NUMBERS = re.compile(r"\b\d{3,}\b")
_MESSAGE = re.compile(r'Message:\\"((?:[^"\\]|\\.)*?)\\"')
_CAUSE = re.compile(r'RawCause:\\"((?:[^"\\]|\\.)*?)\\"')


def error_kind(fields: str) -> str:
    """A short, stable name for the error of a ``unit process error`` line: what failed
    (``begin``, ``commit``, a statement) and the driver's or server's words, numbers blanked."""
    message, cause = _MESSAGE.search(fields), _CAUSE.search(fields)
    what = ""
    if message is not None:
        text = message.group(1)
        what = text.rsplit("execute statement failed: ", 1)[1] if "execute statement failed: " in text else text
        what = what if what in ("begin", "commit") else ("statement" if "execute statement failed" in text else what)
    cause_text = cause.group(1).replace('\\"', '"') if cause is not None else ""
    cause_text = re.sub(r"dial tcp [0-9.:]+: ", "dial: ", cause_text)
    return _NUMBERS.sub("N", f"{what}: {cause_text}" if cause_text else what)[:70]


# What dm-worker logs for a failed transaction, as DM sees it (tiflow dm/syncer/dbconn/db.go,
# dm/pkg/conn/baseconn.go; Lightning's TiDB backend for the full load): one line per failed try.
SYNC_RETRIED = ("execute sql failed by connection error", "execute sql failed by retryable error")  # retried in place
SYNC_GAVE_UP = ("execute statements failed after retry",)  # the batch failed for good: the unit errs, the task pauses
STATEMENT_FAILED = ("execute statement failed",)  # a statement of a batch (sync) or of a chunk (full load)
_ERROR_LINE = re.compile(r"^\[[^\]]+\] \[ERROR\]", re.M)


def phase_at(at: float, sync_started: float | None) -> str:
    """``sync`` from the moment DM's sync unit started, ``load`` (dump and full load) before."""
    return "sync" if sync_started is not None and at >= sync_started else "load"


def dm_events(dm: DMCluster, started: float, now: float | None = None, sync_running_at: float | None = None) -> dict[str, Any]:
    """What dm-worker's log says happened, per phase (``phase_at``: the sync phase starts at the
    log's switch from the Load unit, or at the first ``query-status`` that showed the Sync unit
    running, whichever came first). A pause with no resume after it (DM's ``task can't auto
    resume``: a load-unit error is not retried) lasts until ``now``, when the log is read."""
    now = time.time() if now is None else now
    pauses = dm.pauses()
    resumes = dm.events("dispatch auto resume task")
    failures = dm.events("unit process error")  # the errors a pause reports, one line each
    retried, gave_up, statements = dm.events(*SYNC_RETRIED), dm.events(*SYNC_GAVE_UP), dm.events(*STATEMENT_FAILED)
    switched = [e.at for e in dm.events("switching to next unit") if "unit=Load" in e.fields]
    candidates = [t for t in (switched[-1] if switched else None, sync_running_at) if t is not None]
    sync_started = min(candidates) if candidates else None
    paused_for, spans, unresumed = 0.0, [], 0
    by_phase = {phase: {"pauses": 0, "paused_s": 0.0, "failed_txns": 0, "retried_in_place": 0, "gave_up": 0,
                        "failed_statements": 0, "unit_errors": 0} for phase in ("load", "sync")}  # fmt: skip
    for p in pauses:
        nxt = next((r.at for r in resumes if r.at >= p.at), None)
        spans.append((p.at - started, (nxt - started) if nxt else None))
        span = (nxt if nxt else now) - p.at
        paused_for += span
        unresumed += nxt is None
        by_phase[phase_at(p.at, sync_started)]["pauses"] += 1
        by_phase[phase_at(p.at, sync_started)]["paused_s"] += span
    for events, key in ((retried, "retried_in_place"), (gave_up, "gave_up"), (statements, "failed_statements"), (failures, "unit_errors")):
        for e in events:
            by_phase[phase_at(e.at, sync_started)][key] += 1
    # A failed transaction as DM sees it: in the sync, a batch try that failed (retried in place
    # or given up); in the full load, a statement of a chunk that failed (Lightning retries or
    # gives up on the chunk), since the load has no transaction of its own around it.
    for phase, counts in by_phase.items():
        counts["failed_txns"] = counts["retried_in_place"] + counts["gave_up"] if phase == "sync" else counts["failed_statements"]
    kinds = Counter(error_kind(e.fields) for e in failures)
    units = Counter(m.group(1) for e in pauses for m in [re.search(r"\[unit=\"?([^\]\"]+)", e.fields)] if m)
    return {"pauses": len(pauses), "paused_s": paused_for, "never_resumed": unresumed, "sync_started": sync_started,
            "pause_spans": spans, "paused_units": dict(units), "resumes": len(resumes), "by_phase": by_phase,
            "failed": dict(kinds.most_common()), "failed_total": sum(kinds.values()), "retried_in_place": len(retried),
            "failed_txns": sum(c["failed_txns"] for c in by_phase.values()),
            "error_lines": len(_ERROR_LINE.findall(dm.worker_log_text()))}  # fmt: skip


# TiDB logs a statement as [GENERAL_LOG] ... [user=u@h] ... [sql="..."], and a DDL as
# ["CRUCIAL OPERATION"] ... [sql="..."] [user=u@h].
_LOGGED_SQL = re.compile(r'\[sql=("(?:[^"\\]|\\.)*"|[^\]]*)\]')
_LOGGED_USER = re.compile(r"\[user=([^@\]]*)@")
_GO_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{3}|.)")
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}


def _go_unquote(text: str) -> str:
    if not (text.startswith('"') and text.endswith('"')):
        return text

    def one(m: re.Match) -> str:
        e = m.group(1)
        if e[0] in "xuU":
            return chr(int(e[1:], 16))
        if e[0] in "01234567" and len(e) == 3:
            return chr(int(e, 8))
        return _SIMPLE_ESCAPES.get(e, e)

    return _GO_ESCAPE.sub(one, text[1:-1])


def dm_statements(tidb_log: str, user: str = DM_USER, max_rows: int = 3) -> list[dict[str, Any]]:
    """DM's statements in TiDB's general log, one example per shape (literals blanked), with
    how often each shape came; a multi-row VALUES list is cut to its first ``max_rows`` rows
    (the judgement does not depend on how many)."""
    from proxy.sqltext import TokenKind, tokenize
    from proxy.sqltext.dialect import TIDB

    literal = {TokenKind.STRING, TokenKind.NUMBER, TokenKind.HEX, TokenKind.BIT}
    seen: dict[str, dict[str, Any]] = {}
    for line in tidb_log.splitlines():
        if "[GENERAL_LOG]" not in line and '["CRUCIAL OPERATION"]' not in line:
            continue
        m, who = _LOGGED_SQL.search(line), _LOGGED_USER.search(line)
        if m is None or who is None or who.group(1) != user:
            continue
        sql = _go_unquote(m.group(1))
        try:
            tokens = tokenize(sql, dialect=TIDB)
        except Exception:
            tokens = []
        shape = _shape(tokens, literal)
        if shape in seen:
            seen[shape]["count"] += 1
            continue
        seen[shape] = {"sql": _first_rows(sql, tokens, max_rows), "count": 1}
    return list(seen.values())


def _shape(tokens: list, literal: set) -> str:
    """The statement with literals as ``?`` and a VALUES list as ``VALUES ...`` (any rows)."""
    out, depth, in_values = [], 0, False
    for tok in tokens:
        text = "?" if tok.kind in literal else tok.text.upper()
        if text == "VALUES" and depth == 0:
            in_values = True
            out.append("VALUES ...")
            continue
        depth += (text == "(") - (text == ")")
        if in_values:
            if depth == 0 and text not in (")", ","):
                in_values = False
            else:
                continue
        out.append(text)
    return " ".join(out)


def _first_rows(sql: str, tokens: list, max_rows: int) -> str:
    """``sql`` with a VALUES list cut after ``max_rows`` rows."""
    depth, rows, in_values = 0, 0, False
    for tok in tokens:
        if tok.text.upper() == "VALUES" and depth == 0:
            in_values = True
        elif tok.text == "(":
            depth += 1
        elif tok.text == ")":
            depth -= 1
            if in_values and depth == 0:
                rows += 1
                if rows == max_rows:
                    return sql[: tok.end]
    return sql


def proxy_numbers(proxy: ProxyProcess) -> dict[str, Any]:
    """Recoveries by outcome and replayed statements, from the proxy's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{proxy.admin_port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    outcomes: dict[str, float] = {}
    for m in re.finditer(r'^replay_proxy_recoveries_total\{[^}]*outcome="([^"]+)"[^}]*\} ([0-9.e+]+)$', text, re.M):
        outcomes[m.group(1)] = outcomes.get(m.group(1), 0) + float(m.group(2))
    replayed = sum(
        float(m.group(1)) for m in re.finditer(r"^replay_proxy_replayed_statements_total(?:\{[^}]*\})? ([0-9.e+]+)$", text, re.M)
    )
    log_text = proxy.log_text()
    return {"recoveries": outcomes, "replayed_statements": replayed,
            "refused_1158": outcomes.get("aborted_1158", 0),
            "tracebacks": log_text.count("Traceback")}  # fmt: skip


def render(results: dict[str, Any]) -> str:
    runs = results["runs"]
    names = [r["target"] for r in runs]
    head = f"{'':48}" + "".join(f"{('directly' if n == 'direct' else 'through proxy'):>16}" for n in names)
    lines = [head]

    def row(label: str, fn) -> None:
        lines.append(f"{label:48}" + "".join(f"{fn(r):>16}" for r in runs))

    def lag_max(r) -> str:
        values = [v for _, v in r["lag"] if v is not None]
        return f"{max(values):.1f}" if values else "-"

    def restarts_in(phase: str):
        return lambda r: str(sum(1 for x in r["restarts"] if x.get("phase", phase_at(x["stop"], r["dm"].get("sync_started"))) == phase))

    def phase(r, name: str) -> dict[str, Any]:
        return r["dm"].get("by_phase", {}).get(name, {})

    def sync_reached(r) -> str:
        at = r["dm"].get("sync_started")
        return "no" if at is None else f"at +{at - r['started']:.0f} s"

    row("run (s) / TiDB restarts (SIGTERM)", lambda r: f"{r['ended'] - r['started']:.0f} / {len(r['restarts'])}")
    row("  restarts planned / from", lambda r: f"{r.get('restarts_planned', '-')} / {r.get('chaos_from', 'start')}")
    row("  restarts during the full load (dump + load)", restarts_in("load"))
    row("  restarts during the sync", restarts_in("sync"))
    row("graceful waits (s)", lambda r: ",".join(sorted({str(x["graceful_wait"]) for x in r["restarts"]})) or "-")
    row("DM reached the sync unit", sync_reached)
    row("upstream transactions", lambda r: str(r["load"]["transactions"]))
    for name, label in (("load", "full load"), ("sync", "sync")):
        row(f"{label}: DM pauses (dm-worker log)", lambda r, n=name: str(phase(r, n).get("pauses", "-")))
        row(f"{label}: time paused (s)", lambda r, n=name: f"{phase(r, n).get('paused_s', 0):.0f}")
        row(f"{label}: failed transactions as DM sees them*", lambda r, n=name: str(phase(r, n).get("failed_txns", "-")))
    row("  sync: batch tries retried in place by DM", lambda r: str(phase(r, "sync").get("retried_in_place", "-")))
    row("  sync: batches DM gave up on (-> pause)", lambda r: str(phase(r, "sync").get("gave_up", "-")))
    row("pauses never resumed", lambda r: str(r["dm"].get("never_resumed", 0)))
    row("auto-resumes", lambda r: str(r["dm"]["resumes"]))
    row("errors the pauses report (unit process error)", lambda r: str(r["dm"]["failed_total"]))
    kinds = sorted({k for r in runs for k in r["dm"]["failed"]}, key=lambda k: -max(r["dm"]["failed"].get(k, 0) for r in runs))
    for kind in kinds[:8]:
        row(f"  {kind[:46]}", lambda r, k=kind: str(r["dm"]["failed"].get(k, 0)))
    row("ERROR lines in dm-worker's log (raw)", lambda r: str(r["dm"].get("error_lines", "-")))
    row("max lag (s, heartbeat on TiDB)", lag_max)
    row("proxy recoveries: resumed", lambda r: _outcome(r, "resumed"))
    row("proxy: 1213 (DM retries)", lambda r: _outcome(r, "aborted_1213"))
    row("proxy: refused, 1158", lambda r: _outcome(r, "aborted_1158"))
    row("proxy: replayed statements", lambda r: "-" if r["proxy"] is None else f"{r['proxy']['replayed_statements']:.0f}")
    row("caught up after the load (s)", lambda r: "no" if r["caught_up_after"] is None else f"{r['caught_up_after']:.0f}")
    row("tables identical (count + checksum)", lambda r: "yes" if r["identical"] else "NO")
    row("rows compared (this run, upstream)", lambda r: str(sum(v["upstream"][0] for v in r["tables"].values())))
    lines += [
        "",
        "* failed transactions as DM sees them: in the sync, every batch try (BEGIN .. COMMIT) that failed, whether DM",
        "  retried it in place or gave up on it; in the full load, every statement of a chunk that failed. The phases",
        "  split where DM's Sync unit starts (its log's switch from the Load unit, or the first query-status showing it).",
        "  Checksum: every column of every row, NULL-safe (bench/dm_load.py), the same SQL upstream (MariaDB) and",
        "  downstream (TiDB).",
    ]
    return "\n".join(lines)


def _outcome(r: dict[str, Any], name: str) -> str:
    if r["proxy"] is None:
        return "-"
    return f"{r['proxy']['recoveries'].get(name, 0):.0f}"


def write_chart(results: dict[str, Any], path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no chart"
    runs = results["runs"]
    fig, axes = plt.subplots(len(runs), 1, figsize=(12, 3.2 * len(runs)), sharex=True, squeeze=False)
    for ax, r in zip(axes[:, 0], runs):
        t0 = r["started"]
        xs = [t - t0 for t, v in r["lag"] if v is not None]
        ys = [v for _, v in r["lag"] if v is not None]
        ax.plot(xs, ys, color="#dd8452" if r["target"] == "proxy" else "#555555", lw=1.2, label="lag (s)")
        for i, x in enumerate(r["restarts"]):
            ax.axvspan(x["stop"] - t0, x["up"] - t0, color="#4c72b0", alpha=0.15, lw=0, label="TiDB down" if i == 0 else None)
        for i, (a, _b) in enumerate(r["dm"]["pause_spans"]):
            ax.axvline(a, color="#c44e52", lw=1, ls="--", label="DM paused" if i == 0 else None)
        ax.set_ylabel("lag (s)")
        title = "DM -> TiDB directly" if r["target"] == "direct" else "DM -> replay-proxy -> TiDB"
        ax.set_title(f"{title}: {r['dm']['pauses']} pauses, max lag {max(ys) if ys else 0:.0f} s, "
                     f"{len(r['restarts'])} restarts", fontsize=10)  # fmt: skip
        ax.legend(loc="upper left", fontsize=8)
    axes[-1, 0].set_xlabel("seconds since start-task")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sigterm_as_interrupt()
    for reason in (tidb_unavailable_reason(), dm_unavailable_reason()):
        if reason:
            print(f"bench.dm_e2e: {reason}", file=sys.stderr)
            return 2
    now = _dt.datetime.now()
    out = args.out or REPO / "bench" / "results" / f"{now:%Y%m%d-%H%M%S}-dm_e2e"
    out.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    results: dict[str, Any] = {"meta": run_meta(now, "bench.dm_e2e", argv, settings=vars(args) | {"out": str(out)}), "runs": []}
    for target in args.targets:
        log(f"{target}: fresh lab in {out / target}")
        results["runs"].append(run_target(target, args, out / target, log))
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    table = render(results)
    (out / "table.txt").write_text(table + "\n")
    problem = write_chart(results, out / "lag.png")
    print(table)
    print(f"\nresults: {out}" + (f" ({problem})" if problem else ""))
    return 0 if all(r["identical"] for r in results["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
