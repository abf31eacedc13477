"""A trio Instrument that counts what the event loop does, for ``python -m bench.run --instrument``.

Counted, for the whole process:

- ``steps``: task steps (``before_task_step``): every time trio resumes a task's coroutine;
- ``io_waits``: passes through the I/O wait (``before_io_wait``), i.e. one ``epoll_wait`` call
  per scheduler batch; ``io_blocking`` of them with a timeout > 0 (nothing was runnable, the loop
  could sleep), the others polls with timeout 0 (tasks were runnable);
- ``wait_s``: wall time spent inside the I/O wait (idle or polling);
- ``spawned``: tasks started (0 per statement in a steady state);
- ``by_task``: steps per task name (a session's tasks all share their function's name).

The counts go to a JSON file (written to a temp name and renamed) on SIGUSR1 and at exit, with a
sequence number, so the benchmark can take a snapshot before and after a run and divide the
difference by the statements of that run (bench/middle.py). Used by bench/instrumented_proxy.py
(the proxy) and bench/floors.py (the trio pump).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from pathlib import Path

import trio

__all__ = ["LoopCounter", "dump_on_signal"]


class LoopCounter(trio.abc.Instrument):
    def __init__(self) -> None:
        self.steps = 0
        self.io_waits = 0
        self.io_blocking = 0
        self.spawned = 0
        self.wait_s = 0.0
        self.by_task: Counter[str] = Counter()
        self._wait_start = 0.0
        self._waiting = False
        self.seq = 0

    # Hot hooks: as little work as possible (their cost shows in the instrumented CPU/stmt).
    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1
        self.by_task[task.name] += 1

    def before_io_wait(self, timeout: float) -> None:
        self.io_waits += 1
        if timeout > 0:
            self.io_blocking += 1
        self._waiting = True
        self._wait_start = time.perf_counter()

    def after_io_wait(self, timeout: float) -> None:
        self.wait_s += time.perf_counter() - self._wait_start
        self._waiting = False

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.spawned += 1

    def snapshot(self) -> dict:
        if self._waiting:  # the signal handler runs inside epoll_wait: count the wait up to now
            now = time.perf_counter()
            self.wait_s += now - self._wait_start
            self._wait_start = now
        return {
            "pid": os.getpid(),
            "steps": self.steps,
            "io_waits": self.io_waits,
            "io_blocking": self.io_blocking,
            "spawned": self.spawned,
            "wait_s": self.wait_s,
            "by_task": dict(self.by_task.most_common(20)),
        }

    def dump(self, path: Path, final: bool = False) -> None:
        self.seq += 1
        data = {"seq": self.seq, "final": final, "time": time.time(), **self.snapshot()}
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)


def dump_on_signal(counter: LoopCounter, path: Path, signum: int = signal.SIGUSR1) -> None:
    """Write the counts to ``path`` whenever ``signum`` arrives (and once now, seq 1).

    A plain Python handler: inside ``trio.run`` the signal wakes the loop through trio's wakeup
    fd and the handler runs in the main thread at the next bytecode, between two task steps."""
    signal.signal(signum, lambda *_: counter.dump(path))
    counter.dump(path)
