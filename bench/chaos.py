"""Chaos benchmark: the replicator-like workload, direct and through the proxy, while MariaDB restarts.

    python -m bench.chaos [--quick] [--duration 30] [--interval 5] [--rounds 1] [--sql safe|insert]

For each target (direct, proxy) and each round it runs the Go client's workload (go-sql-driver
configured as TiDB DM, 16 pinned connections, 10-row transactions) twice: once without restarts
(the baseline) and once while MariaDB is restarted every ``--interval`` seconds (SIGTERM and
SIGKILL alternately, tests/lab/chaos.py). After every run the Go client's verify mode checks every
row directly on MariaDB (nothing lost, nothing applied twice).

Reported per target: client error events (every error the client saw: each failed reconnect
attempt, one per 100 ms while MariaDB is down, counts), failed transactions (BEGIN .. COMMIT
attempts that ended in an error, what a replicator retries), stuck sessions (still waiting for
the server 50 s after the run: an error, a problem), committed transactions, throughput lost
versus its own no-restart baseline, the longest stall (a transaction's first attempt to its
COMMIT, retries included, or to the run's end for one that never committed), p99 latency, client
reconnects, and the row verification. Results: table.txt, results.json and
chart.png in bench/results/<timestamp>-chaos/.

Proxy settings: recovery.idempotent = "safe-mode" with --sql safe (DM's safe mode: REPLACE, so
an in-flight COMMIT may be replayed); recovery.commit_marker = true with --sql insert.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import trio

from bench import REPO
from bench.env import BenchEnv
from bench.hygiene import sigterm_as_interrupt
from bench.runinfo import run_meta
from tests.lab import goclient as gc
from tests.lab.chaos import ChaosResult, run_chaos

TARGETS = ("direct", "proxy")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="12 s runs, a restart every 3 s, 1 round (~2 min)")
    p.add_argument("--duration", type=float, help="seconds per run (default 30)")
    p.add_argument("--interval", type=float, help="seconds between restarts (default 5)")
    p.add_argument("--rounds", type=int, help="rounds (default 1)")
    p.add_argument("--conns", type=int, default=16, help="pinned connections (default 16)")
    p.add_argument("--batch", type=int, default=10, help="rows per transaction (default 10)")
    p.add_argument(
        "--sql", choices=("safe", "insert"), default="safe", help="safe: REPLACE (DM safe mode, default); insert: plain INSERT + counters"
    )
    p.add_argument("--out", type=Path, help="results folder (default bench/results/<timestamp>-chaos)")
    p.add_argument("--keep", action="store_true", help="keep the work dir (MariaDB, proxy log, workload JSON)")
    args = p.parse_args(argv)
    args.duration = args.duration or (12.0 if args.quick else 30.0)
    args.interval = args.interval or (3.0 if args.quick else 5.0)
    args.rounds = args.rounds or 1
    return args


def proxy_overrides(sql: str) -> dict[str, Any]:
    recovery: dict[str, Any] = {"buffer_window": "30s"}
    if sql == "safe":
        recovery["idempotent"] = "safe-mode"
    else:
        recovery["commit_marker"] = True
    # info: the log says when a session recovered (counted below); it costs little at this rate.
    return {"recovery": recovery, "log": {"level": "info"}}


def summarize_run(result: ChaosResult) -> dict[str, Any]:
    w = result.workload
    lat = w.get("txn_latency_ms") or {}
    return {
        "committed_txns": w.get("committed_txns"),
        "txns_per_sec": w.get("txns_per_sec"),
        "errors": int(w.get("error_count", 0)),
        "failed_txns": int(w.get("failed_txns", 0)),
        "error_kinds": w.get("errors") or {},
        "max_ms": w.get("longest_stall_ms", lat.get("max")),
        "max_txn_ms": lat.get("max"),
        "p99_ms": lat.get("p99"),
        "p50_ms": lat.get("p50"),
        "reconnects": w.get("reconnects"),
        "stuck_workers": w.get("stuck_workers"),
        "stuck": w.get("stuck") or [],
        "in_doubt_resolved": w.get("in_doubt_resolved"),
        "anomalies": w.get("anomalies") or [],
        "restarts": result.restarts,
        "verify_ok": result.rows_ok,
        "verified_rows": result.verify.get("checked_rows"),
        "verify_problems": result.verify.get("problems", [])[:10],
        "verify_problem_count": result.verify.get("problem_count"),
    }


def med(values: list) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def build_rows(runs: dict[str, list[dict[str, Any]]]) -> list[tuple[str, dict[str, str]]]:
    """Table rows: (label, {target: cell})."""

    def cell(target: str, fn, fmt: str = "{:.0f}") -> str:
        vals = [fn(r) for r in runs.get(target, [])]
        m = med(vals)
        return "-" if m is None else fmt.format(m)

    rows: list[tuple[str, dict[str, str]]] = []

    def add(label: str, fn, fmt: str = "{:.0f}") -> None:
        rows.append((label, {t: cell(t, fn, fmt) for t in TARGETS}))

    add("restarts during the run", lambda r: len(r["chaos"]["restarts"]))
    add("client error events (incl. every failed reconnect)", lambda r: r["chaos"]["errors"])
    add("failed transactions", lambda r: r["chaos"].get("failed_txns"))
    add("committed txns, no restarts", lambda r: r["baseline"]["committed_txns"])
    add("committed txns, with restarts", lambda r: r["chaos"]["committed_txns"])
    add("txn/s, no restarts", lambda r: r["baseline"]["txns_per_sec"], "{:.1f}")
    add("txn/s, with restarts", lambda r: r["chaos"]["txns_per_sec"], "{:.1f}")
    add("throughput lost vs own baseline", lambda r: r["lost_pct"], "{:.1f} %")
    add("longest stall (ms, unfinished included)", lambda r: r["chaos"]["max_ms"], "{:.0f}")
    add("  same, no restarts", lambda r: r["baseline"]["max_ms"], "{:.0f}")
    add("p99 txn latency (ms)", lambda r: r["chaos"]["p99_ms"], "{:.1f}")
    add("client reconnects", lambda r: r["chaos"]["reconnects"])
    add("stuck sessions", lambda r: r["chaos"]["stuck_workers"])
    rows.append(
        (
            "rows verified (with restarts)",
            {
                t: (
                    " ".join("ok" if r["chaos"]["verify_ok"] else f"FAIL({r['chaos']['verify_problem_count']})" for r in runs.get(t, []))
                    or "-"
                )
                for t in TARGETS
            },
        )
    )
    rows.append(
        (
            "rows verified (no restarts)",
            {
                t: (
                    " ".join(
                        "ok" if r["baseline"]["verify_ok"] else f"FAIL({r['baseline']['verify_problem_count']})" for r in runs.get(t, [])
                    )
                    or "-"
                )
                for t in TARGETS
            },
        )
    )
    add("proxy recoveries logged", lambda r: r.get("recoveries"))
    return rows


def render(results: dict[str, Any]) -> str:
    meta = results["meta"]
    s = meta["settings"]
    lines = [
        f"replay-proxy chaos benchmark  {meta['date']}  host {meta['host']}  {meta['cores']} cores  {meta['kernel']}",
        f"replicator-like workload: {s['conns']} pinned go-sql-driver connections, {s['batch']}-row transactions "
        f"({s['sql']} SQL), {s['duration']:g} s per run, MariaDB restarted every {s['interval']:g} s "
        f"(SIGTERM / SIGKILL alternately); {s['rounds']} round(s), medians",
        "",
    ]
    rows = build_rows(results["runs"])
    width = max(len(label) for label, _ in rows)
    lines.append(f"{'':<{width}}  {'direct':>16}  {'proxy':>16}")
    lines.append(f"{'-' * width}  {'-' * 16}  {'-' * 16}")
    for label, cells in rows:
        lines.append(f"{label:<{width}}  {cells['direct']:>16}  {cells['proxy']:>16}")
    for t in TARGETS:
        kinds: dict[str, int] = {}
        for r in results["runs"].get(t, []):
            for k, v in r["chaos"]["error_kinds"].items():
                kinds[k] = kinds.get(k, 0) + v
        if kinds:
            lines.append("")
            lines.append(f"{t}: errors seen by the client (all rounds):")
            for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])[:6]:
                lines.append(f"  {v:6d}  {k[:160]}")
    if results["problems"]:
        lines.append("")
        lines.append("Problems:")
        for p in results["problems"]:
            lines.append(f"  - {p.strip().splitlines()[0][:300]}")
    return "\n".join(lines)


def write_chart(results: dict[str, Any], path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no chart"
    runs = results["runs"]
    panels = [
        ("client error events", lambda r: r["chaos"]["errors"]),
        ("throughput lost vs own baseline (%)", lambda r: r["lost_pct"]),
        ("longest stall (ms)", lambda r: r["chaos"]["max_ms"]),
        ("committed txns (no restarts / with restarts)", None),
    ]
    fig, axes = plt.subplots(1, 4, figsize=(16, 4))
    colors = {"direct": "#777777", "proxy": "#dd8452"}
    for ax, (title, fn) in zip(axes, panels):
        if fn is None:
            x = range(len(TARGETS))
            base = [med([r["baseline"]["committed_txns"] for r in runs.get(t, [])]) or 0 for t in TARGETS]
            chaos = [med([r["chaos"]["committed_txns"] for r in runs.get(t, [])]) or 0 for t in TARGETS]
            ax.bar([i - 0.2 for i in x], base, 0.4, label="no restarts", color="#bbbbbb")
            ax.bar([i + 0.2 for i in x], chaos, 0.4, label="with restarts", color=[colors[t] for t in TARGETS])
            ax.set_xticks(list(x))
            ax.set_xticklabels(TARGETS)
            ax.legend(fontsize=7)
        else:
            vals = [med([fn(r) for r in runs.get(t, [])]) or 0 for t in TARGETS]
            bars = ax.bar(TARGETS, vals, color=[colors[t] for t in TARGETS])
            for b, v in zip(bars, vals):
                ax.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{v:.0f}", ha="center", va="bottom", fontsize=8)
        ax.set_title(title, fontsize=9)
    s = results["meta"]["settings"]
    fig.suptitle(
        f"chaos: MariaDB restarted every {s['interval']:g} s during {s['duration']:g} s runs "
        f"({s['conns']} conns, {s['sql']} SQL) — {results['meta']['date']}",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


async def run_all(args: argparse.Namespace, env: BenchEnv, results: dict[str, Any]) -> None:
    assert env.db is not None
    db = env.db
    runs: dict[str, list[dict[str, Any]]] = results["runs"]
    kw = dict(sql=args.sql, duration=args.duration, interval=args.interval, conns=args.conns, batch=args.batch)
    for rnd in range(args.rounds):
        order = list(TARGETS) if rnd % 2 == 0 else list(reversed(TARGETS))
        pending: dict[str, dict[str, Any]] = {t: {"round": rnd + 1} for t in order}
        # A target's baseline and chaos runs are adjacent, so drift (other jobs) hits both alike.
        for t in order:
            for phase in ("baseline", "chaos"):
                target = env.targets.get(t)
                if target is None:
                    env.log(f"{t} unavailable: {env.unavailable.get(t, '?')}")
                    continue
                label = f"{t}_{phase}_r{rnd + 1}"
                env.log(
                    f"round {rnd + 1}/{args.rounds}: {t}, {phase} "
                    f"({args.duration:g} s{'' if phase == 'baseline' else f', restart every {args.interval:g} s'})"
                )
                log_before = env.proxies["proxy"].log_text() if t == "proxy" and "proxy" in env.proxies else ""
                try:
                    result = await run_chaos(label, db, target.port, env.workdir / "runs", restarts=phase == "chaos", **kw)
                except Exception as e:
                    env.problems.append(f"{label}: {e}")
                    env.log(f"{label} failed: {str(e).splitlines()[0]}")
                    if not db.is_running():
                        db.start()
                    continue
                summary = summarize_run(result)
                pending[t][phase] = summary
                if t == "proxy" and "proxy" in env.proxies:
                    new_log = env.proxies["proxy"].log_text()[len(log_before) :]
                    pending[t].setdefault("recoveries", 0)
                    if phase == "chaos":
                        pending[t]["recoveries"] = sum(1 for line in new_log.splitlines() if "recovered on" in line)
                    bad = [line for line in new_log.splitlines() if "Traceback" in line or " ERROR " in line]
                    if bad:
                        env.problems.append(f"{label}: proxy logged {len(bad)} error line(s), first: {bad[0][:300]}")
                died = env.check_alive(t)
                if died:
                    env.problems.append(f"{label}: {died}")
                if summary["stuck_workers"]:
                    env.problems.append(f"{label}: {summary['stuck_workers']} sessions stuck at the end: {summary['stuck'][:3]}")
                if not summary["verify_ok"]:
                    env.problems.append(
                        f"{label}: row verification FAILED ({summary['verify_problem_count']} problems): {summary['verify_problems'][:3]}"
                    )
                if t == "proxy" and phase == "chaos" and args.sql == "safe" and summary["errors"]:
                    env.problems.append(
                        f"{label}: {summary['errors']} client-visible errors through the proxy in safe mode "
                        f"(expected 0): {dict(list(summary['error_kinds'].items())[:3])}"
                    )
                if phase == "baseline" and summary["errors"]:
                    env.problems.append(
                        f"{label}: {summary['errors']} errors without any restart: {dict(list(summary['error_kinds'].items())[:3])}"
                    )
                env.log(
                    f"  {label}: txns={summary['committed_txns']} errors={summary['errors']} "
                    f"max_ms={summary['max_ms']} verify={'ok' if summary['verify_ok'] else 'FAIL'} "
                    f"restarts={len(summary['restarts'])}"
                )
        for t in order:
            rec = pending[t]
            if "baseline" in rec and "chaos" in rec:
                b, c = rec["baseline"]["txns_per_sec"], rec["chaos"]["txns_per_sec"]
                rec["lost_pct"] = (1 - c / b) * 100 if b else None
                runs.setdefault(t, []).append(rec)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sigterm_as_interrupt()
    reason = gc.go_unavailable_reason()
    if reason:
        print(f"bench.chaos: cannot run: {reason}", file=sys.stderr)
        return 2
    now = _dt.datetime.now(_dt.timezone.utc)
    out = args.out or REPO / "bench" / "results" / (now.strftime("%Y%m%d-%H%M%S") + "-chaos")
    out.mkdir(parents=True, exist_ok=True)
    settings = {k: getattr(args, k) for k in ("duration", "interval", "rounds", "conns", "batch", "sql", "quick")}
    results: dict[str, Any] = {
        "meta": run_meta(now, "bench.chaos", argv, settings=settings, proxy_config=proxy_overrides(args.sql)),
        "runs": {},
        "problems": [],
    }
    started = time.monotonic()
    env = BenchEnv(None, keep=args.keep, proxy_overrides=proxy_overrides(args.sql))
    interrupted = False
    try:
        env.log(f"work dir {env.workdir}; results to {out}")
        env.log("building tests/goclient")
        gc.build_goclient()
        env.start_db(tuned=False)  # the lab's defaults, as the chaos tests and the demo use
        env.start_stack(list(TARGETS))
        trio.run(run_all, args, env, results)
    except KeyboardInterrupt as e:
        interrupted = True
        env.log(f"interrupted ({e}); stopping everything")
    finally:
        env.close()
        results["problems"].extend(p for p in env.problems if p not in results["problems"])
        results["meta"]["elapsed_s"] = round(time.monotonic() - started, 1)
        results["meta"]["loadavg_end"] = os.getloadavg()
        results["meta"]["interrupted"] = interrupted
        table = render(results)
        (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
        (out / "table.txt").write_text(table + "\n")
        note = write_chart(results, out / "chart.png")
        print(table)
        print(
            f"\nelapsed {results['meta']['elapsed_s']:.0f} s; results: {out / 'results.json'}, "
            f"{out / 'table.txt'}, {out / 'chart.png' if note is None else note}"
        )
    return 130 if interrupted else (1 if results["problems"] else 0)


if __name__ == "__main__":
    sys.exit(main())
