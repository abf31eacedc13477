"""``bench.run --instructions``: instructions per statement of each middle process, by callgrind.

Each intermediary (HAProxy, the trio and uvloop pumps, the proxy) is started once more, alone,
under callgrind (bench/callgrind.py), in front of the benchmark's database. For every cell it
runs a fixed number of statements twice, N and then 2N, each between a zero and a dump of the
counters; the figure is (I(2N) - I(N)) / (statements(2N) - statements(N)), so the one client
login and logout of each run cancel out and only the per-statement work is left. The clients are
single connections (sysbench ``--threads=1``, goclient ``-conns 1``), after an uncounted
warm-up run of the cell (what runs once per process, such as a module imported on first use,
would otherwise be charged to N only) and a counted one thrown away (a process's first counted
window holds more than its later ones: charged to N, it lowered the figure of the cell counted
first by ~6 %, so that a cell's figure depended on the order of the cells): with one statement in
flight the middle reads and writes the same packets however slowly callgrind runs it, so the
count repeats. With several connections it would not: under callgrind the middle is ~50x
slower, so more requests would queue per wakeup than in a normal run.

The proxy runs without health checks (``backend.health_interval = 0``): they cost per second,
not per statement, and a counted run's seconds depend on how loaded the machine is.

``--instructions-repeat 2`` (the default) measures every middle twice, each time a fresh
process, to show the figure repeats. The profile by function of each cell (callgrind_annotate of
its 2N dump) is written to the results folder.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bench.benchproxy import BenchProxy, mirrored_proxy, variant_of
from bench.callgrind import Callgrind, annotate, instructions
from bench.floors import Floor
from bench.haproxy import HAProxy
from bench.workloads import Settings, WorkloadError
from bench.workloads.sysbench import run_sysbench

if TYPE_CHECKING:
    from bench.env import BenchEnv

COUNTED_TARGETS = ("haproxy", "trio_pump", "uvloop_pump", "netio_pump", "proxy", "proxy_interpreted", "proxy_trio",
                   "proxy_trio_interpreted", "proxy_mirrored")  # fmt: skip
START_TIMEOUT = 300.0  # Python's start-up under callgrind takes a minute on a loaded machine


@dataclass(frozen=True)
class Cell:
    name: str
    title: str
    workload: str  # the bench.run workload whose CPU/stmt is shown beside (same statements)
    run: Callable[[BenchEnv, int, Settings, int], int]  # (env, port, settings, n) -> statements relayed


def _sysbench(test: str, ps_mode: str, per_event: int) -> Callable[[BenchEnv, int, Settings, int], int]:
    """``per_event``: the statements of one sysbench event (write_only: BEGIN, 4 writes, COMMIT)."""

    def run(env: BenchEnv, port: int, settings: Settings, n: int) -> int:
        out = run_sysbench(test, settings, port, 1, 0, ps_mode=ps_mode, events=max(1, n // per_event), timeout=3600)
        return int(out["queries"])

    return run


def _dm_batches(env: BenchEnv, port: int, settings: Settings, n: int) -> int:
    """DM's shape: START TRANSACTION, one multi-row REPLACE of ``replicator_batch`` rows, an
    UPDATE of the counters, COMMIT (4 statements per transaction)."""
    from bench.workloads.replicator import goclient

    gc = goclient()
    assert env.db is not None
    gc.run_goclient("setup", port=env.db.port, conns=1, timeout=120)
    txns = max(1, n // 4)
    data = gc.run_goclient("workload", port=port, conns=1, txns=txns, duration=3600, batch=settings.replicator_batch,
                           multirow=True, sql="safe", timeout=3600)  # fmt: skip
    if not data.get("ok") or int(data["committed_txns"]) != txns:
        raise WorkloadError(f"goclient committed {data.get('committed_txns')} of {txns} transactions: {data.get('errors')}")
    return txns * 4


CELLS = (
    Cell("point_select", "sysbench oltp_point_select, text protocol", "point_select_1t", _sysbench("oltp_point_select", "disable", 1)),
    Cell("write_only", "sysbench oltp_write_only, text protocol", "write_only_1t", _sysbench("oltp_write_only", "disable", 6)),
    Cell("point_select_ps", "sysbench oltp_point_select, prepared", "point_select_1t_ps", _sysbench("oltp_point_select", "auto", 1)),
    Cell("write_only_ps", "sysbench oltp_write_only, prepared", "write_only_16t_ps", _sysbench("oltp_write_only", "auto", 6)),
    Cell("dm_batches", "DM's shape: 1 multi-row REPLACE per transaction (goclient)", "replicator", _dm_batches),
)


def _start(env: BenchEnv, target: str, workdir: Path, cg: Callgrind) -> tuple[int, Callable[[], object]]:
    """Start ``target`` under callgrind: (its port, its stop function)."""
    assert env.db is not None
    port = env.db.port
    if target == "haproxy":
        middle: HAProxy | Floor = HAProxy(workdir, port, nbthread=1).start(timeout=START_TIMEOUT, wrap=cg)
    elif target in ("trio_pump", "uvloop_pump", "netio_pump"):
        middle = Floor(target.removesuffix("_pump"), workdir, port).start(timeout=START_TIMEOUT, wrap=cg)
    else:
        config = env.stack.proxy_config(with_plugins=False)
        # No health checks: their cost is per second, not per statement, and under callgrind a
        # run of N statements lasts minutes that differ from run to run (a login and a ping every
        # 2 s put 0-20k instructions on each statement, as much as the machine was loaded).
        config["backend"] = {**config.get("backend", {}), "health_interval": "0s"}
        make = mirrored_proxy if target == "proxy_mirrored" else BenchProxy  # the records a worker's crash is survived by
        config, extra_env = variant_of(target, config)
        proxy = make(workdir, port, source=env.stack.proxy_source, env=extra_env, **config).start(timeout=START_TIMEOUT, wrap=cg)
        assert proxy.proc is not None
        cg.attach(proxy.proc.pid)
        return proxy.port, lambda: proxy.stop(timeout=START_TIMEOUT)
    assert middle.pid is not None
    cg.attach(middle.pid)
    return middle.port, middle.stop


def count_target(env: BenchEnv, target: str, cells: list[Cell], settings: Settings, n: int, workdir: Path,
                 profiles: Path | None) -> dict[str, dict]:  # fmt: skip
    """One fresh process of ``target`` under callgrind over every cell: {cell: figures}."""
    cg = Callgrind(workdir, target)
    port, stop = _start(env, target, workdir, cg)
    found: dict[str, dict] = {}
    try:
        for cell in cells:
            cell.run(env, port, settings, n // 2)  # uncounted: first-time paths (imports, caches) stay out of N
            # A counted run thrown away: the process's first zero-to-dump window holds ~20M
            # instructions more than any later one, whatever ran before (two warm-ups did not
            # absorb them), so the cell counted first came out ~14k/stmt low (N's extra).
            cg.zero()
            cell.run(env, port, settings, n // 2)
            cg.dump()
            runs = []
            for k in (n, 2 * n):
                cg.zero()
                statements = cell.run(env, port, settings, k)
                dump = cg.dump()
                runs.append({"statements": statements, "instructions": instructions(dump), "dump": str(dump)})
            (a, b) = runs
            per_stmt = (b["instructions"] - a["instructions"]) / (b["statements"] - a["statements"])
            found[cell.name] = {"per_stmt": per_stmt, "runs": runs}
            if profiles is not None:
                found[cell.name]["profile"] = str(annotate(Path(b["dump"]), profiles / f"callgrind-{cell.name}-{target}.txt"))
                # the N run's too: what it has that the 2N run lacks is a per-run cost (the diff of the two)
                found[cell.name]["profile_n"] = str(annotate(Path(a["dump"]), profiles / f"callgrind-{cell.name}-{target}-n.txt"))
            env.log(f"instructions: {target} {cell.name}: {per_stmt:,.0f}/stmt ({a['statements']} and {b['statements']} statements)")
    finally:
        stop()
    return found


def count_all(env: BenchEnv, targets: list[str], settings: Settings, n: int, repeat: int, out: Path,
              only: list[str] | None = None) -> dict:  # fmt: skip
    """Every counted target, ``repeat`` times (a fresh process each), one at a time: the machine's
    two cores are shared with the client and the database, and callgrind is slow enough.
    ``only``: these cells (by name), in that order (one process counts them one after the
    other, and what ran before a cell moves its figure), else all."""
    by_name = {c.name: c for c in CELLS}
    unknown = set(only or ()) - set(by_name)
    if unknown:
        raise WorkloadError(f"--instructions-cells: no cell {', '.join(sorted(unknown))}")
    cells = [by_name[name] for name in only] if only is not None else list(CELLS)
    cells = [c for c in cells if c.name != "dm_batches" or _has_go()]
    result: dict = {"statements": n, "repeat": repeat, "cells": {c.name: {"title": c.title, "workload": c.workload} for c in cells},
                    "targets": {}, "errors": []}  # fmt: skip
    for target in [t for t in COUNTED_TARGETS if t in targets]:
        passes = []
        for i in range(repeat):
            try:
                passes.append(
                    count_target(env, target, cells, settings, n, env.workdir / f"callgrind-{target}-{i + 1}", out if i == 0 else None)
                )
            except Exception as exc:  # recorded; the other targets still run
                result["errors"].append(f"{target} pass {i + 1}: {str(exc)[:1500]}")
                env.log(f"instructions: {target} pass {i + 1} failed: {str(exc).splitlines()[0][:200]}")
        result["targets"][target] = passes
    return result


def _has_go() -> bool:
    from tests.lab import goclient as gc

    return gc.go_unavailable_reason() is None


def per_statement(result: dict, target: str, cell: str) -> list[float]:
    return [p[cell]["per_stmt"] for p in result["targets"].get(target, []) if cell in p]


def render(result: dict, workloads: dict) -> str:
    """The floors in one table: per cell and target, CPU µs/stmt of the normal rounds (median of
    the workload named in the cell) and instructions/stmt (first pass; the spread between
    passes after it), and the ratio of each to the trio pump."""
    targets = [t for t in ("direct", *COUNTED_TARGETS) if t == "direct" or t in result["targets"]]
    lines = [
        f"Instructions per statement (callgrind; {result['statements']} and {2 * result['statements']} statements per cell, "
        f"1 connection; {result['repeat']} fresh process(es) per target) beside CPU µs/stmt of the normal rounds",
        "",
    ]
    rows = []
    for cell, info in result["cells"].items():
        cpu = workloads.get(info["workload"], {}).get("median", {}).get("cpu_us_per_stmt", {})
        pump_ir = (per_statement(result, "trio_pump", cell) or [None])[0]
        pump_cpu = cpu.get("trio_pump")
        texts = []
        for t in targets:
            irs = per_statement(result, t, cell)
            us = cpu.get(t)
            text = f"{us:.1f} µs" if us is not None else "–"
            if irs:
                spread = (max(irs) - min(irs)) / min(irs) * 100 if len(irs) > 1 else None
                text += f" {irs[0] / 1000:,.1f}k" + (f" ±{spread:.2f}%" if spread is not None else "")
                if pump_ir and t != "trio_pump":
                    text += f" {irs[0] / pump_ir:.2f}×"
            elif us is not None and pump_cpu and t not in ("direct", "trio_pump"):
                text += f" {us / pump_cpu:.2f}×"
            texts.append(text)
        rows.append((cell, texts))
    # Each column as wide as its widest text, two blanks apart (a fixed width ran them together).
    widths = [max([len(t)] + [len(texts[i]) for _, texts in rows]) + 2 for i, t in enumerate(targets)]
    header = f"{'cell':18}" + "".join(f"{t:>{w}}" for t, w in zip(targets, widths))
    lines += [header, "-" * len(header)]
    lines += [f"{cell:18}" + "".join(f"{text:>{w}}" for text, w in zip(texts, widths)) for cell, texts in rows]
    lines += ["", "k: thousand instructions per statement; ±: spread between passes; ×: instructions relative to the trio pump"]
    lines += [f"error: {e.splitlines()[0]}" for e in result["errors"]]
    return "\n".join(lines)
