"""The seed's story with the real parts: DM v8.5 replicating into TiDB while TiDB restarts.

    python -m bench.dm_e2e [--duration 300] [--interval 8] [--graceful-waits 0,3] [--targets direct,proxy]

For each target (``direct``: DM writes to tidb-server; ``proxy``: DM writes to replay-proxy in
front of it, configured as configs/dm-sidecar.toml) a fresh lab: an upstream MariaDB with a
row binlog (utf8mb4), a preloaded shop schema, tidb-server (unistore), one dm-master and one
dm-worker on loopback, a source and a ``task-mode: all`` task (16 DML workers, batches of 100).
A load writes upstream (bench/dm_load.py) from the moment the task starts, so TiDB restarts
(SIGTERM, ``graceful-wait-before-shutdown`` taking the listed values in turn) hit the full
load and then the sync. At the end the load stops, DM catches up, and every table is compared
upstream and downstream (row count and a checksum of every row, the same SQL on both).

Counted from dm-worker's log: pauses (``"paused"``; one auto-resumed within a second never
shows in ``query-status``), the time paused, resumes, the failed statements by kind. Lag: the
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
    return args


class Restarter(threading.Thread):
    """Restart TiDB every ``interval`` seconds (SIGTERM, then start), graceful waits in turn."""

    def __init__(self, tidb: TiDB, interval: float, waits: list[int], log) -> None:
        super().__init__(daemon=True, name="restarter")
        self.tidb, self.interval, self.waits, self.log = tidb, interval, waits, log
        self.stop_event = threading.Event()
        self.restarts: list[dict[str, float]] = []

    def run(self) -> None:
        n = 0
        while not self.stop_event.wait(self.interval):
            wait = self.tidb.graceful_wait
            began = time.time()
            self.tidb.stop()
            down = time.time()
            n += 1
            self.tidb.graceful_wait = self.waits[n % len(self.waits)]  # read by the next start
            self.tidb.start()
            self.restarts.append({"stop": began, "down": down, "up": time.time(), "graceful_wait": wait})
            self.log(f"  restart {n}: graceful wait {wait} s, down {down - began:.1f} s after SIGTERM, "
                     f"up {time.time() - down:.1f} s later")  # fmt: skip


class Sampler(threading.Thread):
    """Every second: the heartbeat lag read on TiDB, and DM's unit."""

    def __init__(self, tidb: TiDB, dm: DMCluster) -> None:
        super().__init__(daemon=True, name="sampler")
        self.tidb, self.dm = tidb, dm
        self.stop_event = threading.Event()
        self.lag: list[tuple[float, float | None]] = []

    def run(self) -> None:
        while not self.stop_event.wait(1.0):
            self.lag.append((time.time(), dm_load.heartbeat_lag(self.tidb.port)))


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
        restarter = Restarter(tidb, args.interval, args.graceful_waits, log)
        load = dm_load.ShopLoad(up.port, args.rate)
        started = time.time()
        answer = dm.ctl("start-task", str(task))
        if not answer.get("result"):
            raise RuntimeError(f"start-task failed: {json.dumps(answer)[:2000]}")
        load.start()
        sampler.start()
        restarter.start()
        log(f"  task started; load at {args.rate:g} txn/s, TiDB restarted every {args.interval:g} s for {args.duration:g} s")
        time.sleep(args.duration)
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
        return {
            "target": target,
            "check_task": check.get("result"),
            "started": started, "ended": ended, "caught_up_after": caught_up,
            "restarts": restarter.restarts,
            "load": {"transactions": stats.transactions, "statements": stats.statements, "errors": len(stats.errors)},
            "preloaded": rows,
            "lag": sampler.lag,
            "dm": dm_events(dm, started),
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


def dm_events(dm: DMCluster, started: float, now: float | None = None) -> dict[str, Any]:
    """What dm-worker's log says happened. A pause with no resume after it (DM's ``task can't
    auto resume``: a load-unit error is not retried) lasts until ``now``, when the log is read."""
    now = time.time() if now is None else now
    pauses = dm.pauses()
    resumes = dm.events("dispatch auto resume task")
    failures = dm.events("unit process error")  # the errors a pause reports, one line each
    retried = dm.events("execute sql failed by connection error", "execute statements")  # retried in place
    paused_for, spans, unresumed = 0.0, [], 0
    for p in pauses:
        nxt = next((r.at for r in resumes if r.at >= p.at), None)
        spans.append((p.at - started, (nxt - started) if nxt else None))
        paused_for += (nxt if nxt else now) - p.at
        unresumed += nxt is None
    kinds = Counter(error_kind(e.fields) for e in failures)
    switched = [e.at for e in dm.events("switching to next unit") if "unit=Load" in e.fields]
    units = Counter(m.group(1) for e in pauses for m in [re.search(r"\[unit=\"?([^\]\"]+)", e.fields)] if m)
    return {"pauses": len(pauses), "paused_s": paused_for, "never_resumed": unresumed, "sync_started": switched[-1] if switched else None,
            "pause_spans": spans, "paused_units": dict(units), "resumes": len(resumes),
            "failed": dict(kinds.most_common()), "failed_total": sum(kinds.values()), "retried_in_place": len(retried)}  # fmt: skip


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
    head = f"{'':44}" + "".join(f"{('directly' if n == 'direct' else 'through proxy'):>16}" for n in names)
    lines = [head]

    def row(label: str, fn) -> None:
        lines.append(f"{label:44}" + "".join(f"{fn(r):>16}" for r in runs))

    def lag_max(r) -> str:
        values = [v for _, v in r["lag"] if v is not None]
        return f"{max(values):.1f}" if values else "-"

    def load_restarts(r) -> str:
        switch = r["dm"].get("sync_started")
        return str(sum(1 for x in r["restarts"] if switch is None or x["stop"] < switch))

    row("run (s) / TiDB restarts (SIGTERM)", lambda r: f"{r['ended'] - r['started']:.0f} / {len(r['restarts'])}")
    row("  restarts during the full load", load_restarts)
    row("graceful waits (s)", lambda r: ",".join(sorted({str(x["graceful_wait"]) for x in r["restarts"]})))
    row("upstream transactions", lambda r: str(r["load"]["transactions"]))
    row("DM pauses (dm-worker log)", lambda r: str(r["dm"]["pauses"]))
    row("time paused (s)", lambda r: f"{r['dm']['paused_s']:.0f}" + (" (no resume)" if r["dm"].get("never_resumed") else ""))
    row("auto-resumes", lambda r: str(r["dm"]["resumes"]))
    row("failed statements (dm-worker log)", lambda r: str(r["dm"]["failed_total"]))
    row("  of which retried in place by DM", lambda r: str(r["dm"]["retried_in_place"]))
    kinds = sorted({k for r in runs for k in r["dm"]["failed"]}, key=lambda k: -max(r["dm"]["failed"].get(k, 0) for r in runs))
    for kind in kinds[:8]:
        row(f"  {kind[:42]}", lambda r, k=kind: str(r["dm"]["failed"].get(k, 0)))
    row("max lag (s, heartbeat on TiDB)", lag_max)
    row("proxy recoveries: resumed", lambda r: _outcome(r, "resumed"))
    row("proxy: 1213 (DM retries)", lambda r: _outcome(r, "aborted_1213"))
    row("proxy: refused, 1158", lambda r: _outcome(r, "aborted_1158"))
    row("proxy: replayed statements", lambda r: "-" if r["proxy"] is None else f"{r['proxy']['replayed_statements']:.0f}")
    row("caught up after the load (s)", lambda r: "no" if r["caught_up_after"] is None else f"{r['caught_up_after']:.0f}")
    row("tables identical (count + checksum)", lambda r: "yes" if r["identical"] else "NO")
    rows = sum(v["upstream"][0] for v in runs[0]["tables"].values()) if runs else 0
    lines.append(f"{'rows compared (last run)':44}{rows:>16}")
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
