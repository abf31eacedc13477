"""What the process in the middle spent on a run, per statement.

``MiddleMeter(env, target)`` wraps one run of a workload:

- CPU: utime + stime of the intermediary and its descendants (bench/procstat.py; for
  ``proxy_workers`` the supervisor plus every worker);
- with ``--instrument``: trio's task steps and I/O waits (bench/instrument.py), read from the
  counts file the instrumented process writes on SIGUSR1, before and after the run;
- with ``--perf``: ``perf stat -p <pids>`` of the middle process(es) over the run (software
  events; hardware counters where the machine has them, otherwise "<not supported>").

``profile(pid, svg)`` records a py-spy flame graph; ``flame_summary(svg)`` reads it back into
self time by function and by layer (trio's scheduler, sockets, the proxy's own code).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.procstat import CpuMeter, process_tree

if TYPE_CHECKING:
    from bench.env import BenchEnv
    from bench.stack import Target

PERF_EVENTS = ("task-clock", "context-switches", "cpu-migrations", "page-faults", "instructions", "cycles")


# -- trio loop counts -----------------------------------------------------------------------------


def loop_counts(pid: int, path: Path, timeout: float = 3.0) -> dict[str, Any] | None:
    """Ask the instrumented process (SIGUSR1) for its counts and return them (None: no answer)."""

    def read() -> dict[str, Any] | None:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    last = (read() or {}).get("seq", 0)
    try:
        os.kill(pid, signal.SIGUSR1)
    except ProcessLookupError:
        return None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        data = read()
        if data is not None and data.get("seq", 0) > last:
            return data
        time.sleep(0.005)
    return None


# -- perf stat ------------------------------------------------------------------------------------


def perf_unavailable_reason() -> str | None:
    if shutil.which("perf") is None:
        return "perf not found on PATH (Debian: apt-get install linux-perf)"
    try:
        res = subprocess.run(["perf", "stat", "-x", ",", "-e", "task-clock", "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"perf stat does not run: {exc}"
    if res.returncode != 0 or "task-clock" not in res.stderr:
        return f"perf stat does not work here: {(res.stderr or res.stdout).strip()[-300:]}"
    return None


def perf_counts_instructions() -> bool:
    """False where the CPU exposes no hardware counters to perf (VMs): instructions <not supported>."""
    try:
        res = subprocess.run(["perf", "stat", "-x", ",", "-e", "instructions", "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return res.returncode == 0 and any(line.split(",")[0].strip().isdigit() for line in res.stderr.splitlines())


class PerfStat:
    def __init__(self, pids: list[int], workdir: Path) -> None:
        fd, name = tempfile.mkstemp(prefix="perf-", suffix=".csv", dir=workdir)
        os.close(fd)
        self.out = Path(name)
        self.proc = subprocess.Popen(
            ["perf", "stat", "-x", ",", "-e", ",".join(PERF_EVENTS), "-p", ",".join(map(str, pids)), "-o", str(self.out)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        from tests.lab.procs import kill_at_exit

        kill_at_exit(self.proc)
        time.sleep(0.1)  # attached before the run starts

    def stop(self) -> dict[str, float | None]:
        from tests.lab.procs import forget

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        forget(self.proc)
        values: dict[str, float | None] = {}
        for line in self.out.read_text().splitlines():
            fields = line.split(",")
            if len(fields) < 3 or line.startswith("#"):
                continue
            try:
                values[fields[2]] = float(fields[0])
            except ValueError:
                values[fields[2]] = None  # <not supported> / <not counted>
        self.out.unlink(missing_ok=True)
        return values


# -- the meter ------------------------------------------------------------------------------------


class MiddleMeter:
    def __init__(self, env: BenchEnv, target: Target) -> None:
        self.target = target
        self.cpu = CpuMeter(target.pid)
        self.counts_path = target.counts_path
        self.counts_before: dict[str, Any] | None = None
        self.counts_after: dict[str, Any] | None = None
        self.perf: PerfStat | None = None
        self.perf_values: dict[str, float | None] | None = None
        self.want_perf = bool(getattr(env, "perf", False)) and target.pid is not None
        self.workdir = env.workdir
        self.elapsed = 0.0

    def start(self) -> MiddleMeter:
        if self.counts_path is not None and self.target.pid is not None:
            self.counts_before = loop_counts(self.target.pid, self.counts_path)
        if self.want_perf:
            self.perf = PerfStat(process_tree(self.target.pid), self.workdir)
        self.cpu.start()
        self._t0 = time.monotonic()
        return self

    def stop(self) -> MiddleMeter:
        self.cpu.stop()
        self.elapsed = time.monotonic() - self._t0
        if self.perf is not None:
            self.perf_values = self.perf.stop()
        if self.counts_before is not None and self.target.pid is not None:
            self.counts_after = loop_counts(self.target.pid, self.counts_path)
        return self

    def per_statement(self, statements: float) -> dict[str, Any]:
        """{metric: value} for the workload's result (``_`` keys: extras in results.json)."""
        n = statements if statements and statements > 0 else None
        out: dict[str, Any] = {
            "cpu_us_per_stmt": self.cpu.used * 1e6 / n if self.cpu.used is not None and n else None,
        }
        if self.target.pid is None:
            return out
        if self.cpu.used_sys is not None and n:
            out["sys_us_per_stmt"] = self.cpu.used_sys * 1e6 / n
        if len(self.cpu.pids) > 1:
            out["_middle_processes"] = len(self.cpu.pids)
            if n:
                out["_cpu_us_per_stmt_by_process"] = {
                    ("supervisor" if p == self.target.pid else f"child {p}"): round(cpu * 1e6 / n, 1) for p, cpu in self.cpu.by_pid.items()
                }
        if self.cpu.lost:
            out["_middle_processes_exited"] = self.cpu.lost
        a, b = self.counts_before, self.counts_after
        if a is not None and b is not None and n:
            out["steps_per_stmt"] = (b["steps"] - a["steps"]) / n
            out["io_waits_per_stmt"] = (b["io_waits"] - a["io_waits"]) / n
            out["_blocking_io_waits_per_stmt"] = (b["io_blocking"] - a["io_blocking"]) / n
            out["_tasks_spawned_per_stmt"] = (b["spawned"] - a["spawned"]) / n
            out["_io_wait_share"] = (b["wait_s"] - a["wait_s"]) / self.elapsed if self.elapsed else None
            steps = {k: (v - a["by_task"].get(k, 0)) / n for k, v in b["by_task"].items()}
            out["_steps_per_stmt_by_task"] = {k: round(v, 3) for k, v in sorted(steps.items(), key=lambda kv: -kv[1]) if v >= 0.005}
        elif self.counts_path is not None:
            out["_loop_counts"] = "no answer from the instrumented process"
        if self.perf_values is not None and n:
            pv = self.perf_values
            out["ctx_switches_per_stmt"] = pv["context-switches"] / n if pv.get("context-switches") is not None else None
            out["instructions_per_stmt"] = pv["instructions"] / n if pv.get("instructions") is not None else None
            out["_perf"] = pv
        return out


# -- py-spy ---------------------------------------------------------------------------------------


def pyspy_unavailable_reason() -> str | None:
    if shutil.which("py-spy") is None:
        return "py-spy not found on PATH (pip install py-spy)"
    return None


class Profile:
    """py-spy recording one process into a flame graph (SVG) until stop()."""

    def __init__(self, pid: int, svg: Path, rate: int = 100, gil: bool = False) -> None:
        """``gil``: only samples holding the GIL (Python code running; socket calls and epoll_wait,
        which release it, drop out, and so does time spent preempted inside them)."""
        from tests.lab.procs import kill_at_exit

        self.svg = svg
        self.log = svg.with_suffix(".log")
        self._log = open(self.log, "wb")
        self.proc = subprocess.Popen(
            ["py-spy", "record", "-p", str(pid), "-o", str(svg), "-r", str(rate), "-f", "flamegraph", *(["--gil"] if gil else [])],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        kill_at_exit(self.proc)
        time.sleep(0.5)

    def stop(self) -> str | None:
        """Stop (SIGINT: py-spy writes the file); None, or why there is no flame graph."""
        from tests.lab.procs import forget

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        forget(self.proc)
        self._log.close()
        if not self.svg.exists():
            return f"py-spy wrote no flame graph: {self.log.read_text(errors='replace')[-500:]}"
        return None


_G = re.compile(r'<g><title>(?P<title>[^<]*)</title><rect [^>]*?y="(?P<y>[\d.]+)"[^>]*?fg:x="(?P<x>\d+)" fg:w="(?P<w>\d+)"')
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^():]+)(?::\d+)?\) \([\d,]+ samples?, [\d.]+%\)$")

# Self time of a frame goes to the first layer whose pattern matches its file.
LAYERS = (
    ("trio scheduler", r"^trio/_core/_(run|ki|instrumentation|traps|generated_run)"),
    ("trio I/O (epoll, wait_readable)", r"^trio/_core/_(io_epoll|generated_io_epoll|wakeup_socketpair)"),
    ("trio sockets/streams", r"^trio/(_socket|_highlevel|_abc|_util|_core/_thread)"),
    ("trio other", r"^trio/"),
    ("proxy netio (socket calls)", r"^proxy/netio"),
    ("proxy framing + response tracking", r"^proxy/protocol/"),
    ("proxy SQL text (classify, split)", r"^proxy/sqltext/"),
    ("proxy tracking (session, transactions)", r"^proxy/(tracking|transaction|session)"),
    ("proxy relay (tasks, inflight)", r"^proxy/relay/"),
    ("proxy other", r"^proxy/"),
    ("bench pump / instrument", r"^bench/"),
    ("python stdlib", r"^(<frozen |asyncio/|socket\.py|selectors|logging/|enum|functools|threading|signal)"),
)
_LAYERS = [(name, re.compile(pat)) for name, pat in LAYERS]


def flame_summary(svg: Path, top: int = 15) -> dict[str, Any]:
    """Self time by function and by layer, in % of the busy samples (those outside epoll_wait), from
    a py-spy flame graph SVG."""
    text = svg.read_text(errors="replace")
    frames = []
    for m in _G.finditer(text):
        title = (
            m.group("title").replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&").replace("&quot;", '"').replace("&apos;", "'")
        )
        frames.append((float(m.group("y")), int(m.group("x")), int(m.group("w")), title))
    if not frames:
        return {"samples": 0}
    total = max(w for _, _, w, _ in frames)
    # Samples py-spy took inside epoll_wait: idle, or the syscall itself (it cannot tell which).
    waiting = 0
    by_row: dict[float, list[tuple[int, int]]] = defaultdict(list)
    for y, x, w, _ in frames:
        by_row[y].append((x, w))
    rows = sorted(by_row)
    step = min((b - a for a, b in zip(rows, rows[1:])), default=16.0)
    root_y = next((y for y, _, _, t in frames if t.startswith("all (")), rows[0])
    if root_y != rows[0]:
        step = -step  # root at the bottom: callees above it
    self_by_func: dict[str, float] = defaultdict(float)
    self_by_layer: dict[str, float] = defaultdict(float)
    for y, x, w, title in frames:
        if title.startswith("all ("):
            continue
        children = sum(cw for cx, cw in by_row.get(y + step, ()) if x <= cx < x + w)
        own = w - children
        if own <= 0:
            continue
        fm = _FRAME.match(title)
        func, file = (fm.group("func"), fm.group("file")) if fm else (title, "")
        if func.endswith("get_events") and "_io_epoll" in file:
            waiting += own
            continue
        self_by_func[f"{func} ({file})"] += own
        layer = next((name for name, pat in _LAYERS if pat.search(file)), "other (C code, other modules)")
        self_by_layer[layer] += own
    busy = total - waiting or 1
    pct = lambda v: round(100.0 * v / busy, 1)  # noqa: E731
    return {
        "samples": total,
        "epoll_wait_samples_pct": round(100.0 * waiting / total, 1),  # left out of the percentages below
        "self_by_layer_pct": {k: pct(v) for k, v in sorted(self_by_layer.items(), key=lambda kv: -kv[1])},
        "self_by_function_pct": {k: pct(v) for k, v in sorted(self_by_func.items(), key=lambda kv: -kv[1])[:top]},
    }
