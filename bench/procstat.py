"""Per-process counters from /proc: CPU time (utime + stime) and resident memory.

Everything here reads the counters of the process in the middle (the proxy, HAProxy, a pump or
mariadbd), so a benchmark can say "the proxy spent N µs of CPU per statement" independently of
what the client and the server cost on the same machine. CPU is summed over the process and its
descendants (``process_tree``): ``replay-proxy --workers N`` serves from child processes of a
supervisor; for a single process the tree is that process.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")


def stat(pid: int | str) -> tuple[str, list[str]]:
    """A process's command name and the fields of /proc/<pid>/stat after it: [0] is field 3
    (state), [1] the parent pid, [11] utime and [12] stime (in clock ticks)."""
    data = Path(f"/proc/{pid}/stat").read_text()
    # comm (field 2) may contain spaces and parentheses: split after the last ')'.
    return data[data.index("(") + 1 : data.rindex(")")], data[data.rindex(")") + 2 :].split()


def every_stat() -> Iterator[tuple[int, str, list[str]]]:
    """(pid, ``stat``) of every process alive now (those that end while read skipped)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                yield int(entry.name), *stat(entry.name)
            except OSError:
                continue


def cpu_times(pid: int) -> tuple[float, float]:
    """(utime, stime) of the whole process (all threads), in seconds: user space and kernel."""
    fields = stat(pid)[1]
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (all threads), in seconds."""
    return sum(cpu_times(pid))


def children(pid: int) -> list[int]:
    """Direct children of ``pid``: /proc/<pid>/task/*/children, or a scan of /proc by parent pid."""
    task_dir = Path(f"/proc/{pid}/task")
    found: list[int] = []
    try:
        tids = [t.name for t in task_dir.iterdir()]
        for tid in tids:
            found.extend(int(c) for c in (task_dir / tid / "children").read_text().split())
        return found
    except FileNotFoundError:
        pass  # no CONFIG_PROC_CHILDREN (or pid gone): scan
    except OSError:
        return found
    found.extend(child for child, _command, fields in every_stat() if int(fields[1]) == pid)
    return found


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (those alive now)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children(p))
    return out


def tree_cpu_times(pid: int) -> dict[int, tuple[float, float]]:
    """(utime, stime) of every process of the tree, by pid (processes that vanish meanwhile skipped)."""
    out = {}
    for p in process_tree(pid):
        try:
            out[p] = cpu_times(p)
        except (OSError, ValueError):
            pass
    return out


def status_kib(pid: int, key: str) -> int:
    """A 'kB' line of /proc/<pid>/status (VmRSS, VmHWM, ...), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(f"{key} not in /proc/{pid}/status")


def rss_kib(pid: int) -> int:
    return status_kib(pid, "VmRSS")


def hwm_kib(pid: int) -> int:
    return status_kib(pid, "VmHWM")


def reset_peak_rss(pid: int) -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to clear_refs). False if refused."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class CpuMeter:
    """CPU seconds a process and its descendants used between start() and stop() (None for no
    process). A descendant that exits in between loses its CPU since start() (``lost`` lists
    it); one started in between counts from 0."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.before: dict[int, tuple[float, float]] | None = None
        self.used: float | None = None
        self.used_sys: float | None = None  # of which in the kernel (stime)
        self.pids: list[int] = []
        self.lost: list[int] = []
        self.by_pid: dict[int, float] = {}  # CPU seconds of each process over the run

    def start(self) -> CpuMeter:
        if self.pid is not None:
            self.before = tree_cpu_times(self.pid)
            if self.pid not in self.before:
                raise ProcessLookupError(f"process {self.pid} is gone")
        return self

    def stop(self) -> float | None:
        if self.pid is not None and self.before is not None:
            after = tree_cpu_times(self.pid)
            if self.pid not in after:
                self.used = None  # the process died: the caller reports that
            else:
                self.pids = sorted(after)
                self.lost = sorted(set(self.before) - set(after))
                user = sum(u - self.before.get(p, (0.0, 0.0))[0] for p, (u, _) in after.items())
                self.used_sys = sum(s - self.before.get(p, (0.0, 0.0))[1] for p, (_, s) in after.items())
                self.used = user + self.used_sys
                self.by_pid = {p: u + s - sum(self.before.get(p, (0.0, 0.0))) for p, (u, s) in after.items()}
        return self.used


class PeakRss:
    """Peak RSS of a process over a block: VmHWM after resetting it, cross-checked by sampling.

    Sampling every ``interval`` seconds alone could miss a short spike; VmHWM alone would be
    wrong where clear_refs is refused (then it is the peak since the process started). The
    result is the larger of the sampled maximum and VmHWM when the reset worked.
    """

    def __init__(self, pid: int | None, interval: float = 0.02) -> None:
        self.pid = pid
        self.interval = interval
        self.sampled_max = 0
        self.start_kib = 0
        self.reset_ok = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.peak_kib: int | None = None

    def __enter__(self) -> PeakRss:
        if self.pid is None:
            return self
        self.start_kib = rss_kib(self.pid)
        self.sampled_max = self.start_kib
        self.reset_ok = reset_peak_rss(self.pid)
        self._thread = threading.Thread(target=self._sample, name="peak-rss", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sampled_max = max(self.sampled_max, rss_kib(self.pid))
            except (OSError, KeyError, ValueError):
                return

    def __exit__(self, *exc: object) -> None:
        if self.pid is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        peak = self.sampled_max
        if self.reset_ok:
            try:
                peak = max(peak, hwm_kib(self.pid))
            except (OSError, KeyError, ValueError):
                pass
        self.peak_kib = peak


def wait_rss_settled(pid: int, timeout: float = 5.0, interval: float = 0.25) -> int:
    """RSS once it stops changing (two equal reads in a row) or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last = rss_kib(pid)
    while time.monotonic() < deadline:
        time.sleep(interval)
        now = rss_kib(pid)
        if now == last:
            return now
        last = now
    return last


def machine_cpu() -> tuple[float, float]:
    """(busy, all) CPU seconds of the whole machine since boot, summed over its CPUs (/proc/stat:
    idle and iowait are not busy)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + ticks[4]
    return (sum(ticks[:8]) - idle) / CLK_TCK, sum(ticks[:8]) / CLK_TCK


def cpu_by_process(labels: dict[int, str]) -> dict[int, tuple[str, float]]:
    """(name, CPU seconds) of every process alive now, by pid: its command name, or the label of
    the pid in ``labels`` whose tree it belongs to (a python middle is not the bench's python)."""
    labelled = {p: label for pid, label in labels.items() if Path(f"/proc/{pid}").exists() for p in process_tree(pid)}
    out: dict[int, tuple[str, float]] = {}
    for pid, command, fields in every_stat():
        name = labelled.get(pid) or command.split("/")[0]  # kworker/1:1 -> kworker
        out[pid] = (name, (int(fields[11]) + int(fields[12])) / CLK_TCK)
    return out


class CpuShare:
    """Where a machine's CPU went between start() and stop(): cores used by each command
    (``cpu_by_process``, summed by name; a process that exits in between is not counted) and by
    the whole machine, over the wall time between the two."""

    def __init__(self, labels: dict[int, str]) -> None:
        self.labels = labels

    def start(self) -> CpuShare:
        self.t0, self.machine0, self.before = time.time(), machine_cpu(), cpu_by_process(self.labels)
        return self

    def stop(self) -> dict[str, Any]:
        wall = time.time() - self.t0
        busy1, all1 = machine_cpu()
        used: dict[str, float] = {}
        for pid, (name, seconds) in cpu_by_process(self.labels).items():
            used[name] = used.get(name, 0.0) + seconds - self.before.get(pid, (name, 0.0))[1]
        cores = {name: s / wall for name, s in used.items() if s > 0.005 * wall}
        return {"wall_s": wall, "machine_busy_cores": (busy1 - self.machine0[0]) / wall,
                "machine_cores": (all1 - self.machine0[1]) / wall,
                "cores_by_command": dict(sorted(cores.items(), key=lambda kv: -kv[1]))}  # fmt: skip
