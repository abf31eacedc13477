"""One command for the whole benchmark suite: ``python -m bench.run`` from the repository's root.

Starts a throwaway MariaDB and intermediaries in front of it (HAProxy in TCP mode, bare trio and
uvloop byte pumps, the proxy with an empty plugin chain, the proxy with ``--workers N``, the proxy
with a chain of plugins; started afresh for the workloads that measure memory), runs the
workload against every target interleaved within each round (the order rotates from round to
round to cancel drift), and prints a table of medians and ratios to direct. Results go to
``bench/results/<timestamp>/`` (gitignored): results.json, table.txt, chart.png (and flame graphs
with ``--profile``).

See bench/README.md for what each workload measures.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys
import time
import tomllib
import traceback
from pathlib import Path

from bench import REPO
from bench.callgrind import callgrind_unavailable_reason
from bench.env import BenchEnv
from bench.hygiene import raise_nofile, sigterm_as_interrupt
from bench.instructions import count_all
from bench.instructions import render as render_instructions
from bench.middle import Profile, flame_summary, perf_counts_instructions, perf_unavailable_reason, pyspy_unavailable_reason
from bench.plugin_variants import DEFAULT_PLUGIN_CHAIN, PluginVariant
from bench.report import finalize, new_workload_record, render_table, write_chart, write_json
from bench.runinfo import git_commit, missing_tools, run_meta
from bench.stack import ALL_TARGETS, DEFAULT_TARGETS
from bench.workloads import LOOP_METRICS, PERF_METRICS, SYS_METRIC, Settings, Workload, WorkloadError, WorkloadSkipped
from bench.workloads.bulk import BigResult, BigStatement
from bench.workloads.idle import IdleConnections
from bench.workloads.longdata import LongDataFlood
from bench.workloads.replicator import ReplicatorWorkload
from bench.workloads.sysbench import CpuPerStatement, SysbenchSetup, SysbenchWorkload

RESULTS_DIR = REPO / "bench" / "results"


def all_workloads() -> list[Workload]:
    return [
        SysbenchWorkload("oltp_point_select", 1),
        SysbenchWorkload("oltp_point_select", 16),
        SysbenchWorkload("oltp_write_only", 1),
        SysbenchWorkload("oltp_write_only", 16),
        # The prepared-statement path (COM_STMT_PREPARE / EXECUTE), beside the text one.
        SysbenchWorkload("oltp_point_select", 1, ps_mode="auto"),
        SysbenchWorkload("oltp_write_only", 16, ps_mode="auto"),
        ReplicatorWorkload(),
        CpuPerStatement(),
        BigResult(),
        BigStatement(),
        IdleConnections(),
        LongDataFlood(),
    ]


def quick_settings() -> Settings:
    return Settings(
        rounds=1,
        sysbench_time=5,
        replicator_time=5,
        cpu_time=5,
        big_result_mb=50,
        big_statement_mb=60,
        big_statement_reps=1,
        idle_conns=2000,
        quick=True,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    names = [w.name for w in all_workloads()]
    p = argparse.ArgumentParser(
        prog="python -m bench.run",
        description="Benchmark replay-proxy against a direct connection and HAProxy (TCP mode), side by side.",
        epilog="Workloads: " + ", ".join(names),
    )
    p.add_argument("--quick", action="store_true", help="smoke mode (~3 min): 1 round, 5 s runs, 50 MB result")
    p.add_argument("--rounds", type=int, help="rounds per workload (default 3; --quick: 1)")
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="WORKLOAD",
        help="run only these workloads (repeatable or comma-separated; prefix match, e.g. 'write_only')",
    )
    p.add_argument("--skip", action="append", default=[], metavar="WORKLOAD", help="skip these workloads")
    p.add_argument("--targets", default=",".join(DEFAULT_TARGETS),
                   help=f"comma-separated subset of {','.join(ALL_TARGETS)} (default: {','.join(DEFAULT_TARGETS)})")  # fmt: skip
    p.add_argument("--no-plugins", action="store_true", help="leave out the proxy+plugins target")
    p.add_argument(
        "--plugin-chain",
        default=",".join(DEFAULT_PLUGIN_CHAIN),
        help="plugin chain of the proxy+plugins target; 'a|b' = the first installed of a, b (default %(default)s)",
    )
    p.add_argument(
        "--plugins-config",
        type=Path,
        metavar="TOML",
        help="TOML file with a [plugins] table (chain = [...]) and [plugins.<name>] option tables for "
        "the proxy+plugins target (replaces the default options)",
    )
    p.add_argument("--duration", type=float, help="seconds per sysbench/replicator/cpu run (default 20/20/15; --quick 5)")
    p.add_argument(
        "--backend",
        choices=("mariadb", "tidb"),
        default="mariadb",
        help="the database behind every target (tidb: tests/lab/tidb.py finds tidb-server)",
    )
    p.add_argument("--replicator-batch", type=int, help="rows per replicator transaction (default 10; DM's batch is 100)")
    p.add_argument("--replicator-multirow", action="store_true",
                   help="the replicator writes its batch as one multi-row REPLACE, as DM does (default: a statement per row)")  # fmt: skip
    p.add_argument("--replicator-rate", type=float, metavar="TXN_PER_S",
                   help="offer the replicator's transactions at this rate, all connections together (DM's own rate: the "
                        "latency each statement gets at it); default: as fast as they go")  # fmt: skip
    p.add_argument(
        "--commit-marker",
        action="store_true",
        help="the proxies run with recovery.commit_marker = true (one marker upsert per transaction)",
    )
    p.add_argument(
        "--sysbench-ps-mode",
        choices=("disable", "auto"),
        default="disable",
        help="disable: text protocol like the replicator (default); auto: prepared statements",
    )
    p.add_argument("--big-result-mb", type=int, help="size of the big result (default 200; --quick 50)")
    p.add_argument("--big-statement-mb", type=int, help="size of the big statement (default 60)")
    p.add_argument("--idle-conns", type=int, help="idle connections to open (default 2000)")
    p.add_argument("--haproxy-threads", type=int, default=1, help="HAProxy nbthread (default 1, like the proxy)")
    p.add_argument(
        "--workers-n",
        type=int,
        default=os.cpu_count() or 1,
        metavar="N",
        help="worker processes of the proxy_workers target (replay-proxy --workers N; default: cores, %(default)s)",
    )
    p.add_argument(
        "--instrument",
        action="store_true",
        help="run the proxy (and the trio pump) with a trio Instrument: task steps and epoll waits per "
        "statement next to CPU/stmt (the instrument's own cost shows in their CPU/stmt)",
    )
    p.add_argument(
        "--perf",
        action="store_true",
        help="perf stat of the middle process(es) over every run: context switches (and instructions, "
        "where the CPU exposes counters) per statement",
    )
    p.add_argument(
        "--profile",
        action="append",
        default=[],
        metavar="WORKLOAD",
        help="after this workload's rounds, one extra run per --profile-targets target with py-spy "
        "attached: a flame graph (SVG) in the results folder and self time by layer in the table "
        "(not counted in the medians)",
    )
    p.add_argument(
        "--profile-gil", action="store_true", help="py-spy --gil: only samples running Python code (leaves out socket calls and waits)"
    )
    p.add_argument(
        "--profile-targets",
        default="proxy",
        metavar="T[,T]",
        help="targets profiled by --profile (Python processes: proxy, proxy+plugins, trio_pump, uvloop_pump; default %(default)s)",
    )
    p.add_argument(
        "--instructions",
        action="store_true",
        help="after the workloads, count the instructions per statement of haproxy, the pumps and the proxy under "
        "callgrind (bench/instructions.py): a figure that repeats on a busy machine, beside CPU/stmt",
    )
    p.add_argument("--instructions-statements", type=int, default=1500, metavar="N",
                   help="statements per counted run (N, then 2N; default %(default)s)")  # fmt: skip
    p.add_argument("--instructions-cells", metavar="C[,C]",
                   help="only these cells, in this order (point_select, write_only, point_select_ps, write_only_ps, dm_batches; default all)")  # fmt: skip
    p.add_argument("--instructions-repeat", type=int, default=2, metavar="K",
                   help="fresh processes per counted target, to show the count repeats (default %(default)s)")  # fmt: skip
    p.add_argument("--proxy-source", type=Path, metavar="DIR",
                   help="run the proxy targets from this checkout's proxy package (e.g. a `git worktree` of another commit: "
                   "figures before and after a change, with this checkout's benchmark)")  # fmt: skip
    p.add_argument("--out", type=Path, help="results folder (default bench/results/<timestamp>)")
    p.add_argument("--workdir", type=Path, help="where MariaDB and the proxies keep their files (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the work dir (databases, proxy logs) afterwards")
    p.add_argument("--list", action="store_true", help="list the workloads and exit")
    return p.parse_args(argv)


def build_settings(args: argparse.Namespace) -> Settings:
    s = quick_settings() if args.quick else Settings()
    if args.rounds:
        s.rounds = args.rounds
    if args.duration:
        s.sysbench_time = s.replicator_time = s.cpu_time = args.duration
    s.sysbench_ps_mode = args.sysbench_ps_mode
    if args.replicator_batch:
        s.replicator_batch = args.replicator_batch
    s.replicator_multirow = args.replicator_multirow
    s.replicator_rate = args.replicator_rate or 0.0
    if args.big_result_mb:
        s.big_result_mb = args.big_result_mb
    if args.big_statement_mb:
        s.big_statement_mb = args.big_statement_mb
    if args.idle_conns:
        s.idle_conns = args.idle_conns
    return s


def select_workloads(args: argparse.Namespace) -> list[Workload]:
    def split(values: list[str]) -> list[str]:
        return [v.strip() for value in values for v in value.split(",") if v.strip()]

    only, skip = split(args.only), split(args.skip)
    wls = all_workloads()
    names = [w.name for w in wls]
    for pattern in only + skip:
        if not any(n == pattern or n.startswith(pattern) or pattern in n for n in names):
            raise SystemExit(f"unknown workload {pattern!r}; workloads: {', '.join(names)}")

    def match(name: str, patterns: list[str]) -> bool:
        return any(name == p or name.startswith(p) or p in name for p in patterns)

    return [w for w in wls if (not only or match(w.name, only)) and not match(w.name, skip)]


def plugin_variant(args: argparse.Namespace) -> PluginVariant:
    chain = tuple(n.strip() for n in args.plugin_chain.split(",") if n.strip())
    options: dict | None = None  # None: bench.plugin_variants.DEFAULT_PLUGIN_OPTIONS
    if args.plugins_config:
        data = tomllib.loads(args.plugins_config.read_text())
        section = data.get("plugins", data)
        if "chain" in section:
            chain = tuple(section["chain"])
        options = {k: v for k, v in section.items() if isinstance(v, dict)}
    return PluginVariant(chain=chain, options=options)


def rotate(items: list[str], n: int) -> list[str]:
    if not items:
        return items
    n %= len(items)
    return items[n:] + items[:n]


def summarize(values: dict) -> str:
    parts = []
    for k, v in values.items():
        if k.startswith("_") or v is None:
            continue
        parts.append(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}")
    return " ".join(parts)


def profile_workload(env: BenchEnv, wl: Workload, settings: Settings, targets: list[str], out: Path, rec: dict, gil: bool = False) -> None:
    """One extra run per target with py-spy attached (not part of the samples)."""
    for t in targets:
        target = env.targets.get(t)
        if target is None or target.pid is None:
            rec["profile"][t] = {"error": f"{t} is not running"}
            continue
        svg = out / f"flame-{wl.name}-{t.replace('+', '_')}{'-gil' if gil else ''}.svg"
        try:
            wl.before_run(env, settings)
        except Exception as e:
            rec["profile"][t] = {"error": f"before_run: {e}"}
            continue
        prof = Profile(target.pid, svg, gil=gil)
        error = None
        try:
            wl.run(env, target, settings)
        except Exception as e:
            error = f"the profiled run failed: {str(e)[:500]}"
        finally:
            problem = prof.stop()
        env.check_alive(t)
        if problem:
            rec["profile"][t] = {"error": problem}
            continue
        rec["profile"][t] = {"svg": str(svg), "gil_only": gil, **flame_summary(svg), **({"run_error": error} if error else {})}
        env.log(f"{wl.name}: {t} flame graph {svg}")


def run_workload(
    env: BenchEnv, wl: Workload, settings: Settings, targets: list[str], results: dict, profile: tuple[list[str], Path, bool] | None = None
) -> None:
    rec = new_workload_record(wl)
    results["workloads"][wl.name] = rec
    wanted = [t for t in targets if t in wl.targets]
    problems_before = len(env.problems)
    env.log(f"=== {wl.name}: {wl.title}")
    try:
        wl.setup(env, settings)
    except WorkloadSkipped as e:
        rec["skipped"] = str(e)
        env.log(f"SKIP {wl.name}: {e}")
        return
    except Exception as e:
        rec["skipped"] = f"setup failed: {e}"
        env.log(f"{wl.name} setup failed: {e}")
        rec["errors"].append({"round": 0, "target": "setup", "error": traceback.format_exc()[-3000:]})
        return
    rec["title"] = wl.title
    try:
        if wl.fresh_stack or not env.has_stack(wanted):
            env.start_stack(wanted)
        mark = env.mark_logs()
        rec["unavailable"] = dict(env.unavailable)
        running = [t for t in wanted if t in env.targets]
        for m in wl.metrics:
            rec["samples"][m.key] = {t: [] for t in running}
        for t in running:
            rec["extra"][t] = []
        for rnd in range(settings.rounds):
            if wl.fresh_stack and rnd > 0:
                # Memory is measured on processes that have not served an earlier round.
                for name in list(env.proxies):
                    lines = env.proxy_log_findings(name, mark)
                    if lines:
                        rec["proxy_log"].setdefault(name, []).extend(lines[:50])
                env.start_stack(wanted)
                mark = env.mark_logs()
            for t in rotate(running, rnd):
                if t not in env.targets:
                    why = env.unavailable.get(t, "not running")
                    rec["errors"].append({"round": rnd + 1, "target": t, "error": f"target unavailable: {why}"})
                    for m in wl.metrics:
                        rec["samples"][m.key][t].append(None)
                    continue
                try:
                    wl.before_run(env, settings)
                except Exception as e:
                    rec["errors"].append({"round": rnd + 1, "target": t, "error": f"before_run: {e}"})
                    continue
                error = None
                values: dict = {}
                try:
                    values = wl.run(env, env.targets[t], settings)
                except WorkloadError as e:
                    error = str(e)
                except Exception:
                    error = traceback.format_exc()[-3000:]
                died = env.check_alive(t)
                if died:
                    error = (error + "\n" if error else "") + died
                if error:
                    rec["errors"].append({"round": rnd + 1, "target": t, "error": error})
                    env.log(f"{wl.name} round {rnd + 1}/{settings.rounds} {t}: ERROR {error.splitlines()[0][:200]}")
                    values = {}
                else:
                    env.log(f"{wl.name} round {rnd + 1}/{settings.rounds} {t}: {summarize(values)}")
                for m in wl.metrics:
                    v = values.get(m.key)
                    if m.intermediary_only and t == "direct":
                        v = None
                    rec["samples"][m.key][t].append(v)
                shown = {m.key for m in wl.metrics}
                rec["extra"][t].append({k.removeprefix("_"): v for k, v in values.items() if k.startswith("_") or k not in shown})
                if values.get("errors"):
                    env.problems.append(
                        f"{wl.name}: {t} round {rnd + 1}: {values['errors']:.0f} client-visible errors "
                        f"without any restart: {values.get('_error_kinds')}"
                    )
        if profile is not None:
            profile_workload(env, wl, settings, [t for t in profile[0] if t in running], profile[1], rec, profile[2])
        for name in list(env.proxies):
            lines = env.proxy_log_findings(name, mark)
            if lines:
                rec["proxy_log"].setdefault(name, []).extend(lines[:50])
                env.problems.append(f"{wl.name}: {name} logged {len(lines)} warning/error line(s), first: {lines[0][:300]}")
    finally:
        if wl.fresh_stack:
            env.stop_stack()  # the next workload starts from fresh processes too
        try:
            wl.teardown(env, settings)
        except Exception as e:
            env.log(f"{wl.name} teardown: {e}")
    for p in env.problems[problems_before:]:
        if p not in results["problems"]:
            results["problems"].append(p)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for w in all_workloads():
            print(f"{w.name:18} {w.title}  [targets: {', '.join(w.targets)}]")
        return 0
    sigterm_as_interrupt()
    missing = missing_tools()
    if missing:
        print("bench: cannot run, missing tools:\n  " + "\n  ".join(missing), file=sys.stderr)
        return 2
    settings = build_settings(args)
    workloads = select_workloads(args)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = [t for t in targets if t not in ALL_TARGETS]
    if unknown:
        raise SystemExit(f"unknown target(s) {unknown}; targets: {', '.join(ALL_TARGETS)}")
    if args.no_plugins and "proxy+plugins" in targets:
        targets.remove("proxy+plugins")
    notes: list[str] = []
    if args.perf:
        reason = perf_unavailable_reason()
        if reason:
            raise SystemExit(f"--perf: {reason}")
    perf_metrics = list(PERF_METRICS) if args.perf else []
    if args.perf and not perf_counts_instructions():
        perf_metrics = [m for m in perf_metrics if m.key != "instructions_per_stmt"]
        notes.append("--perf: no hardware counters here (perf stat: instructions <not supported>); software events only")
    if args.instructions:
        reason = callgrind_unavailable_reason()
        if reason:
            raise SystemExit(f"--instructions: {reason}")
    profiled = select_workloads(argparse.Namespace(only=args.profile, skip=[])) if args.profile else []
    profile_targets = [t.strip() for t in args.profile_targets.split(",") if t.strip()]
    if profiled:
        reason = pyspy_unavailable_reason()
        if reason:
            notes.append(f"--profile: {reason}; no flame graph")
            profiled = []
    for wl in workloads:
        if wl.per_statement_meter:
            explain = [SYS_METRIC] if args.instrument or args.perf else []
            at = next((i + 1 for i, m in enumerate(wl.metrics) if m.key == "cpu_us_per_stmt"), len(wl.metrics))
            wl.metrics = [*wl.metrics[:at], *explain, *wl.metrics[at:], *(LOOP_METRICS if args.instrument else []), *perf_metrics]
    raise_nofile(max(16384, settings.idle_conns * 2 + 1024))

    now = _dt.datetime.now(_dt.UTC)
    out = args.out or RESULTS_DIR / (now.strftime("%Y%m%d-%H%M%S") + ("-quick" if settings.quick else ""))
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {
        "meta": run_meta(
            now,
            "bench.run",
            argv,
            settings=settings.__dict__.copy(),
            targets=targets,
            plugin_chain=None,
            backend=args.backend,
            commit_marker=args.commit_marker,
            proxy_source=f"{args.proxy_source.resolve()} at {git_commit(args.proxy_source)}" if args.proxy_source else None,
            workers=args.workers_n,
            instrument=args.instrument,
            perf=args.perf,
            notes=notes,
        ),
        "targets": targets,
        "workloads": {},
        "checks": [],
        "problems": [],
    }
    plugins = plugin_variant(args)
    results["meta"]["plugin_chain"] = plugins.describe()
    started = time.monotonic()
    overrides = {"recovery": {"commit_marker": True}} if args.commit_marker else None
    env = BenchEnv(
        args.workdir,
        keep=args.keep,
        plugins=plugins,
        haproxy_threads=args.haproxy_threads,
        workers=args.workers_n,
        instrument=args.instrument,
        perf=args.perf,
        proxy_overrides=overrides,
        proxy_source=args.proxy_source.resolve() if args.proxy_source else None,
    )
    SysbenchSetup.done = False
    interrupted = False
    try:
        env.log(f"work dir {env.workdir}; results to {out}")
        env.start_db(backend=args.backend)
        profiled_names = {w.name for w in profiled}
        for wl in workloads:
            run_workload(
                env, wl, settings, targets, results, (profile_targets, out, args.profile_gil) if wl.name in profiled_names else None
            )
        if args.instructions:
            env.stop_stack()  # callgrind's process runs alone beside the client and the database
            SysbenchSetup.ensure(env, settings)
            results["instructions"] = count_all(env, targets, settings, args.instructions_statements, args.instructions_repeat, out,
                                                 args.instructions_cells.split(",") if args.instructions_cells else None)  # fmt: skip
    except KeyboardInterrupt as e:
        interrupted = True
        env.log(f"interrupted ({e}); stopping everything and writing partial results")
    finally:
        env.close()
        if args.keep:
            env.log(f"kept work dir {env.workdir}")
        for p in env.problems:
            if p not in results["problems"]:
                results["problems"].append(p)
        results["meta"]["elapsed_s"] = round(time.monotonic() - started, 1)
        results["meta"]["loadavg_end"] = os.getloadavg()
        results["meta"]["interrupted"] = interrupted
        finalize(results)
        table = render_table(results)
        if "instructions" in results:
            table += "\n\n" + render_instructions(results["instructions"], results["workloads"])
        write_json(results, out / "results.json")
        (out / "table.txt").write_text(table + "\n")
        chart_note = write_chart(results, out / "chart.png")
        print(table)
        print(
            f"\nelapsed {results['meta']['elapsed_s']:.0f} s; load average at start {results['meta']['loadavg_start'][0]:.2f}, "
            f"end {results['meta']['loadavg_end'][0]:.2f}"
        )
        print(f"results: {out / 'results.json'}\n         {out / 'table.txt'}")
        print(f"         {out / 'chart.png'}" if chart_note is None else f"         {chart_note}")
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
