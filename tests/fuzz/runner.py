"""Running targets: the per-input rule (time, memory, exceptions) and what was found."""

from __future__ import annotations

import hashlib
import json
import time
import traceback
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import attrs

__all__ = ["Recorder", "Report", "run_mutator", "signature"]

SLOW_SECONDS = 1.0  # an input that takes longer is a finding (libFuzzer's -timeout is the hard stop)
MEMORY_LIMIT = 64 << 20  # peak Python allocation per input, short mode (tracemalloc)


def signature(exc: BaseException) -> str:
    """Type and innermost frame in the project: one finding per distinct bug, not per input."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = "?"
    for frame in reversed(frames):
        if "/proxy/" in frame.filename or "/tests/fuzz/" in frame.filename:
            where = f"{frame.filename.rsplit('/', 2)[-2]}/{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"
            break
    text = str(exc).splitlines()[0][:80] if type(exc).__name__ == "Finding" and str(exc) else ""
    return f"{type(exc).__name__} at {where}" + (f": {text}" if text else "")


@attrs.define
class Report:
    target: str
    inputs: int = 0
    seconds: float = 0.0
    crashes: int = 0  # inputs that broke the rule
    findings: dict[str, dict] = attrs.Factory(dict)  # signature -> {"input": hex, "traceback": str, "count": n}
    engine: str = "mutator"
    note: str = ""

    @property
    def rate(self) -> float:
        return self.inputs / self.seconds if self.seconds else 0.0

    def line(self) -> str:
        return (f"{self.target:<20} {self.inputs:>10,} inputs {self.seconds:8.1f} s {self.rate:9,.0f}/s  "
                f"crashes {self.crashes} ({len(self.findings)} distinct){'  ' + self.note if self.note else ''}")  # fmt: skip

    def to_json(self) -> dict:
        return {"target": self.target, "inputs": self.inputs, "seconds": self.seconds, "crashes": self.crashes,
                "findings": self.findings, "engine": self.engine, "note": self.note}  # fmt: skip

    @classmethod
    def from_json(cls, d: dict) -> Report:
        return cls(d["target"], d["inputs"], d["seconds"], d["crashes"], d["findings"], d.get("engine", "?"), d.get("note", ""))


class Recorder:
    """Runs one input under the rule and records what broke it."""

    def __init__(self, report: Report, out: Path | None = None, memory: bool = False) -> None:
        self.report = report
        self.out = out
        self.memory = memory
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)

    def run(self, fn: Callable[[bytes], None], data: bytes) -> None:
        report = self.report
        report.inputs += 1
        if self.memory:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        try:
            fn(data)
        except Exception as exc:  # noqa: BLE001 - every other exception is what we look for
            self.record(signature(exc), data, "".join(traceback.format_exception(exc)))
        elapsed = time.perf_counter() - t0
        if elapsed > SLOW_SECONDS and self._slow_again(fn, data):  # once is scheduling noise on a busy machine
            self.record(f"slow input (over {SLOW_SECONDS:g} s)", data, f"took {elapsed:.2f} s, and again on a re-run")
        if self.memory:
            peak = tracemalloc.get_traced_memory()[1] - base
            if peak > MEMORY_LIMIT:
                self.record("allocation over 64 MiB", data, f"peak {peak} bytes")

    @staticmethod
    def _slow_again(fn: Callable[[bytes], None], data: bytes) -> bool:
        t0 = time.perf_counter()
        try:
            fn(data)
        except Exception:  # noqa: BLE001 - recorded by the first run already
            pass
        return time.perf_counter() - t0 > SLOW_SECONDS

    def record(self, sig: str, data: bytes, detail: str) -> None:
        report = self.report
        report.crashes += 1
        entry = report.findings.get(sig)
        if entry is None:
            entry = report.findings[sig] = {"input": data.hex(), "traceback": detail, "count": 0}
            if self.out is not None:
                name = f"crash-{report.target}-{hashlib.sha1(data).hexdigest()[:12]}"
                (self.out / f"{name}.bin").write_bytes(data)
                (self.out / f"{name}.txt").write_text(f"{sig}\n\n{detail}")
        entry["count"] += 1

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.report.to_json(), indent=1))


def run_mutator(target, inputs: int, seed: int = 0, memory: bool = True, out: Path | None = None) -> Report:
    """Seeds first, then mutated seeds, ``inputs`` in all."""
    from tests.fuzz.mutate import Mutator

    report = Report(target.name)
    recorder = Recorder(report, out, memory)
    seeds = target.seeds()
    mutator = Mutator(seeds, seed)
    started_tracing = memory and not tracemalloc.is_tracing()
    if started_tracing:
        tracemalloc.start()
    t0 = time.perf_counter()
    try:
        for data in seeds[:inputs]:
            recorder.run(target.run, data)
        for _ in range(inputs - min(inputs, len(seeds))):
            recorder.run(target.run, mutator.next())
    finally:
        report.seconds = time.perf_counter() - t0
        if started_tracing:
            tracemalloc.stop()
    return report
