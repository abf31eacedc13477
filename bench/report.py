"""Results: medians, ratios, the text table, the target checks, JSON and the PNG chart.

The results document (results.json) is plain JSON:

    {"meta": {...},                       # date, cores, kernel, versions, settings, command line
     "targets": ["direct", ...],
     "workloads": {name: {
         "title": str, "info": {...}, "skipped": str | null,
         "metrics": [{"key", "label", "unit", "better", "intermediary_only", "ratio", "digits"}],
         "samples": {metric: {target: [value | null per round]}},
         "median": {metric: {target: value | null}},
         "extra": {target: [{...per run: counts, p99, rss before/after...}]},
         "errors": [{"round", "target", "error"}],
         "unavailable": {target: reason},
         "proxy_log": {target: [warning/error lines, first 50]},
         "profile": {target: {"svg", "samples", "self_by_layer_pct", "self_by_function_pct"} | {"error"}}}},
     "checks": [{"name", "value", "threshold", "op", "unit", "pass": bool | null}],
     "problems": [str]}
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from bench.workloads import Metric

# Ratio columns; every target's throughput relative to direct is a row of its own ("÷ direct").
RATIO_COLUMNS = (("proxy+plugins", "proxy"),)
# Workloads whose CPU per statement is compared with the trio pump's (the floor of a trio relay).
FLOOR_WORKLOADS = (
    "write_only_16t",
    "point_select_1t",
    "write_only_16t_ps",
    "point_select_1t_ps",
    "point_select_16t",
    "replicator",
    "write_only_1t",
    "cpu_per_stmt",
)
FLOOR_TARGET = 1.10  # proxy CPU/stmt <= 1.10 x trio pump CPU/stmt


def median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def new_workload_record(wl) -> dict[str, Any]:
    return {
        "title": wl.title,
        "info": wl.info,
        "skipped": None,
        "metrics": [m.__dict__.copy() for m in wl.metrics],
        "samples": {m.key: {} for m in wl.metrics},
        "median": {},
        "extra": {},
        "errors": [],
        "unavailable": {},
        "proxy_log": {},
        "profile": {},
    }


def finalize(results: dict[str, Any]) -> None:
    """Fill in medians and the target checks."""
    for rec in results["workloads"].values():
        rec["median"] = {key: {t: median(vals) for t, vals in per_target.items()} for key, per_target in rec["samples"].items()}
    results["checks"] = checks(results)


def _med(results: dict, workload: str, metric: str, target: str) -> float | None:
    rec = results["workloads"].get(workload)
    if not rec or rec.get("skipped"):
        return None
    return rec.get("median", {}).get(metric, {}).get(target)


def checks(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets (2-core machine where client, server and proxy share CPU)."""
    out = []

    def add(name: str, value: float | None, op: str, threshold: float | None, unit: str) -> None:
        ok = None
        if value is not None and threshold is not None:
            ok = {"<=": value <= threshold, "<": value < threshold, ">=": value >= threshold}[op]
        out.append({"name": name, "value": value, "op": op, "threshold": threshold, "unit": unit, "pass": ok})

    qp, qd = _med(results, "write_only_16t", "qps", "proxy"), _med(results, "write_only_16t", "qps", "direct")
    add("oltp_write_only 16 threads: proxy QPS / direct QPS", qp / qd if qp and qd else None, ">=", 0.40, "x")
    add("proxy CPU per statement (cpu_per_stmt, fixed rate)", _med(results, "cpu_per_stmt", "cpu_us_per_stmt", "proxy"), "<=", 120.0, "µs")
    add("proxy RSS per idle connection pair", _med(results, "idle_conns", "rss_kib_per_conn", "proxy"), "<=", 64.0, "KiB")
    add("proxy peak RSS streaming the big result", _med(results, "big_result", "peak_rss_mb", "proxy"), "<", 100.0, "MB")
    # Plugin chain overhead: informational (no target), CPU per statement with 3 plugins minus empty chain.
    for wl in ("cpu_per_stmt", "point_select_16t", "replicator"):
        a = _med(results, wl, "cpu_us_per_stmt", "proxy+plugins")
        b = _med(results, wl, "cpu_us_per_stmt", "proxy")
        if a is not None and b is not None:
            add(f"plugin chain overhead per statement ({wl}): proxy+plugins - proxy", a - b, "<=", None, "µs")
    # The floors: the proxy's CPU per statement against a bare trio pump's, and what --workers gains.
    for wl in FLOOR_WORKLOADS:
        rec = results["workloads"].get(wl)
        if not rec or rec.get("skipped"):
            continue
        a, b = _med(results, wl, "cpu_us_per_stmt", "proxy"), _med(results, wl, "cpu_us_per_stmt", "trio_pump")
        if a is not None and b:
            add(f"{wl}: proxy CPU/stmt ÷ trio_pump CPU/stmt ({a:.0f} / {b:.0f} µs)", a / b, "<=", FLOOR_TARGET, "x")
        a, b = _med(results, wl, "cpu_us_per_stmt", "uvloop_pump"), _med(results, wl, "cpu_us_per_stmt", "trio_pump")
        if a is not None and b:
            add(f"{wl}: uvloop_pump CPU/stmt ÷ trio_pump CPU/stmt", a / b, "<=", None, "x")
        key = _throughput_metric(rec)
        if key and wl != "cpu_per_stmt":
            a, b = _med(results, wl, key, "proxy_workers"), _med(results, wl, key, "proxy")
            if a is not None and b:
                add(f"{wl}: proxy_workers {key} ÷ proxy {key}", a / b, "<=", None, "x")
    workers_off = next(
        (rec["unavailable"]["proxy_workers"] for rec in results["workloads"].values() if rec.get("unavailable", {}).get("proxy_workers")),
        None,
    )
    if workers_off:
        out.append(
            {
                "name": "proxy_workers ÷ proxy",
                "value": None,
                "op": "",
                "threshold": None,
                "unit": "x",
                "pass": None,
                "note": f"skipped: {workers_off.splitlines()[0]}",
            }
        )
    if not any(c["name"].startswith("plugin chain") for c in out):
        reason = next(
            (
                rec["unavailable"].get("proxy+plugins")
                for rec in results["workloads"].values()
                if rec.get("unavailable", {}).get("proxy+plugins")
            ),
            "proxy+plugins target not run",
        )
        out.append(
            {
                "name": "plugin chain overhead per statement",
                "value": None,
                "op": "",
                "threshold": None,
                "unit": "µs",
                "pass": None,
                "note": f"skipped: {reason.splitlines()[0]}",
            }
        )
    return out


def _throughput_metric(rec: dict[str, Any]) -> str | None:
    """The first higher-is-better metric that has a ratio (QPS, statements/s, MB/s, ...)."""
    if rec.get("metrics") and rec["metrics"][0]["key"] == "txn_per_s":
        return "stmt_per_s"  # the replicator: statements, comparable with sysbench's queries
    return next((m["key"] for m in rec.get("metrics", []) if m["better"] == "higher" and m["ratio"] and not m["intermediary_only"]), None)


def _fmt(value: float | None, digits: int) -> str:
    if value is None:
        return "-"
    if abs(value) >= 10000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def render_table(results: dict[str, Any]) -> str:
    meta = results["meta"]
    targets = [t for t in results["targets"]]
    ratio_cols = [(a, b) for a, b in RATIO_COLUMNS if a in targets and b in targets]
    head = [
        f"replay-proxy benchmark  {meta['date']}  host {meta['host']}  {meta['cores']} cores  {meta['kernel']}",
        f"rounds {meta['settings']['rounds']} (medians shown){'  QUICK MODE' if meta['settings']['quick'] else ''}"
        f"  sysbench ps-mode={meta['settings']['sysbench_ps_mode']}  commit {meta['versions'].get('git_commit', '?')}",
        *([f"the proxy targets ran the proxy package of {meta['proxy_source']}"] if meta.get("proxy_source") else []),
        "client, server and intermediaries share the same cores: compare columns, not machines.",
        "",
    ]
    columns = ["workload", "metric", *targets, *[f"{a}/{b}" for a, b in ratio_cols]]
    rows: list[list[str]] = []
    for name, rec in results["workloads"].items():
        if rec.get("skipped"):
            rows.append([name, "SKIPPED (see below)"] + [""] * (len(columns) - 2))
            continue
        for m in rec["metrics"]:
            metric = Metric(**m)
            med = rec["median"].get(metric.key, {})
            label = f"{metric.label} ({metric.unit})" if metric.unit else metric.label
            cells = [name, label]
            for t in targets:
                if metric.intermediary_only and t == "direct":
                    cells.append("")
                    continue
                samples = rec["samples"].get(metric.key, {}).get(t)
                if samples is None:
                    cells.append("n/a" if t in rec.get("unavailable", {}) else "")
                    continue
                got = len([v for v in samples if v is not None])
                failed = any(e.get("target") == t for e in rec.get("errors", []))
                mark = "*" if got < len(samples) and failed else ""
                cells.append(_fmt(med.get(t), metric.digits) + mark)
            for a, b in ratio_cols:
                va, vb = med.get(a), med.get(b)
                if not metric.ratio or (metric.intermediary_only and b == "direct") or va is None or vb in (None, 0):
                    cells.append("")
                else:
                    cells.append(f"{va / vb:.2f}x")
            rows.append(cells)
            direct = med.get("direct")
            if metric.better == "higher" and metric.ratio and not metric.intermediary_only and direct and len(targets) > 1:
                ratio_row = [name, f"  {metric.label} ÷ direct"]
                for t in targets:
                    v = med.get(t)
                    ratio_row.append("" if t == "direct" or v is None else f"{v / direct:.2f}x")
                rows.append(ratio_row + [""] * len(ratio_cols))
    widths = [max(len(str(r[i])) for r in [columns, *rows]) for i in range(len(columns))]
    lines = list(head)
    fmt_row = lambda r: "  ".join(  # noqa: E731
        (str(c).ljust(widths[i]) if i < 2 else str(c).rjust(widths[i])) for i, c in enumerate(r)
    )
    lines.append(fmt_row(columns))
    lines.append("  ".join("-" * w for w in widths))
    prev = None
    for r in rows:
        lines.append(fmt_row([r[0] if r[0] != prev else "", *r[1:]]))
        prev = r[0]
    lines.append("")
    lines.append(
        "'*' = some rounds failed for that cell (see errors below / results.json); empty = not applicable; n/a = target unavailable"
    )
    lines.append(
        "CPU/stmt, CPU/MB, peak RSS: the intermediary process's own counters (/proc/<pid>/stat, status; "
        "proxy_workers: supervisor + workers); idle RSS/conn for direct is mariadbd's growth (reference only)"
    )
    if meta.get("instrument"):
        lines.append(
            "--instrument: proxy, proxy+plugins and trio_pump ran with a trio Instrument (task steps, epoll "
            "waits); its own cost is in their CPU/stmt, compare CPU with a run without --instrument"
        )
    for note in meta.get("notes") or []:
        lines.append(f"note: {note}")
    lines.append("")
    lines.append("Targets:")
    for c in results.get("checks", []):
        if c.get("note"):
            lines.append(f"  [ -- ] {c['name']}: {c['note']}")
            continue
        val = "not measured" if c["value"] is None else f"{c['value']:.2f} {c['unit']}".rstrip()
        if c["threshold"] is None:
            lines.append(f"  [info] {c['name']}: {val}")
        else:
            verdict = {True: "PASS", False: "FAIL", None: " -- "}[c["pass"]]
            lines.append(f"  [{verdict}] {c['name']}: {val} (target {c['op']} {c['threshold']:g} {c['unit']})")
    profiles = [(n, t, p) for n, rec in results["workloads"].items() for t, p in rec.get("profile", {}).items()]
    if profiles:
        lines.append("")
        lines.append(
            "Profiles (py-spy, one extra run; self time in % of the samples outside epoll_wait; a socket "
            "call's kernel time is in the Python line that made it):"
        )
        for name, t, p in profiles:
            if p.get("error"):
                lines.append(f"  {name} {t}: no profile: {p['error'].splitlines()[0][:300]}")
                continue
            what = "GIL-holding samples only" if p.get("gil_only") else f"{p['epoll_wait_samples_pct']}% in epoll_wait left out"
            lines.append(f"  {name} {t}: {p['svg']} ({p['samples']} samples, {what})")
            lines.append("    by layer:    " + ", ".join(f"{k} {v}%" for k, v in list(p["self_by_layer_pct"].items())[:8]))
            lines.append("    by function: " + ", ".join(f"{k} {v}%" for k, v in list(p["self_by_function_pct"].items())[:8]))
    skipped = [(n, rec["skipped"]) for n, rec in results["workloads"].items() if rec.get("skipped")]
    if skipped:
        lines.append("")
        lines.append("Skipped workloads:")
        for name, why in skipped:
            lines.append(f"  {name}: {why.strip().splitlines()[0][:300] if why.strip() else '?'}")
    unavailable = sorted(
        {
            (t, why.strip().splitlines()[0][:300] if why.strip() else "?")
            for rec in results["workloads"].values()
            for t, why in rec.get("unavailable", {}).items()
        }
    )
    if unavailable:
        lines.append("")
        lines.append("Targets not run:")
        for t, why in unavailable:
            lines.append(f"  {t}: {why}")
    errors = [(n, e) for n, rec in results["workloads"].items() for e in rec.get("errors", [])]
    if errors:
        lines.append("")
        lines.append(f"Errors ({len(errors)}):")
        for name, e in errors[:30]:
            first = str(e["error"]).strip().splitlines()
            lines.append(f"  {name} round {e['round']} {e['target']}: {first[0][:300] if first else '?'}")
    if results.get("problems"):
        lines.append("")
        lines.append(f"Problems ({len(results['problems'])}) -- details in results.json:")
        for p in results["problems"][:20]:
            lines.append(f"  - {p.strip().splitlines()[0][:300]}")
    return "\n".join(lines)


def write_json(results: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")


def write_chart(results: dict[str, Any], path: Path) -> str | None:
    """A 2x2 PNG: throughput vs direct, CPU per statement, RSS per idle connection, peak RSS."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib, or pip install -e '.[bench]'): no chart"

    colors = {
        "direct": "#777777",
        "haproxy": "#4c72b0",
        "trio_pump": "#8172b3",
        "uvloop_pump": "#64b5cd",
        "netio_pump": "#55a868",
        "proxy": "#dd8452",
        "proxy_workers": "#937860",
        "proxy+plugins": "#c44e52",
    }
    middle = [t for t in results["targets"] if t != "direct"]
    wls = results["workloads"]
    meta = results["meta"]
    fig, axes = plt.subplots(2, 2, figsize=(15, 10))
    fig.suptitle(
        f"replay-proxy benchmark — {meta['date']} — {meta['cores']} cores — medians of "
        f"{meta['settings']['rounds']} round(s){' (QUICK)' if meta['settings']['quick'] else ''}",
        fontsize=12,
    )

    def grouped(ax, labels, series, title, xlabel, refs=()):
        import numpy as np

        names = [n for n in series if any(v is not None for v in series[n])]
        if not labels or not names:
            ax.set_title(title + " (no data)")
            ax.axis("off")
            return
        y = np.arange(len(labels))
        h = 0.8 / len(names)
        for i, n in enumerate(names):
            vals = [v if v is not None else 0 for v in series[n]]
            bars = ax.barh(y + (i - (len(names) - 1) / 2) * h, vals, h, label=n, color=colors.get(n))
            for bar, v in zip(bars, series[n]):
                if v is not None:
                    ax.text(
                        bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {v:.2f}" if v < 10 else f" {v:.0f}", va="center", fontsize=7
                    )
        for x, lab in refs:
            ax.axvline(x, color="k", linestyle="--", linewidth=0.8)
            ax.text(x, 0.98, lab, transform=ax.get_xaxis_transform(), rotation=90, va="top", ha="right", fontsize=7, color="#333333")
        ax.set_yticks(y)
        ax.set_yticklabels(labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.legend(fontsize=7, loc="best")

    # 1. Throughput relative to direct.
    labels, series = [], {t: [] for t in middle}
    for name, rec in wls.items():
        if rec.get("skipped"):
            continue
        for m in rec["metrics"]:
            if m["better"] == "higher" and m["ratio"] and not m["intermediary_only"]:
                med = rec["median"].get(m["key"], {})
                d = med.get("direct")
                if not d:
                    break
                labels.append(f"{name}\n{m['label']}")
                for t in series:
                    v = med.get(t)
                    series[t].append(v / d if v is not None else None)
                break
    grouped(
        axes[0][0],
        labels,
        series,
        "Throughput relative to direct (higher is better)",
        "x direct",
        refs=[(1.0, "direct"), (0.40, "0.40x target (write_only 16t)")],
    )

    # 2. CPU per statement.
    labels, series = [], {t: [] for t in middle}
    for name, rec in wls.items():
        med = rec.get("median", {}).get("cpu_us_per_stmt")
        if rec.get("skipped") or not med:
            continue
        labels.append(name)
        for t in series:
            series[t].append(med.get(t))
    grouped(
        axes[0][1], labels, series, "Intermediary CPU per statement (lower is better)", "µs / statement", refs=[(120.0, "120 µs target")]
    )

    # 3. RSS per idle connection.
    rec = wls.get("idle_conns")
    labels, series = [], {t: [] for t in ("haproxy", "proxy")}
    if rec and not rec.get("skipped"):
        labels = ["RSS per idle connection"]
        for t in series:
            series[t].append(rec["median"].get("rss_kib_per_conn", {}).get(t))
    grouped(axes[1][0], labels, series, "Memory per idle connection (lower is better)", "KiB", refs=[(64.0, "64 KiB target")])

    # 4. Peak RSS during bulk transfers.
    labels, series = [], {t: [] for t in ("haproxy", "proxy")}
    for name in ("big_result", "big_statement"):
        rec = wls.get(name)
        if rec and not rec.get("skipped"):
            labels.append(name)
            for t in series:
                series[t].append(rec["median"].get("peak_rss_mb", {}).get(t))
    grouped(
        axes[1][1], labels, series, "Peak RSS during bulk transfers (lower is better)", "MB", refs=[(100.0, "100 MB target (big_result)")]
    )

    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
