"""Fuzz driver.

    python -m tests.fuzz                       # short mode: every target, 3,000 inputs, mutator
    python -m tests.fuzz --long                # atheris, 1,000,000 inputs per target (subprocesses)
    python -m tests.fuzz --long --target response --inputs 5000000
    python -m tests.fuzz --list

Long mode runs the targets one after the other (each in its own process; use ``nice``) and
writes crashes (input .bin + traceback .txt), the corpus and a JSON report per target under
``--out`` (default: $TMPDIR/replay-proxy-fuzz). Without atheris, ``--long`` falls back to the
mutator and says so. Exit status 1 when anything was found.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LONG_INPUTS = 1_000_000
SHORT_INPUTS = 3_000


def _atheris_available() -> bool:
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


def run_long_atheris(name: str, inputs: int, out: Path, max_restarts: int = 5):
    """Run the worker; restart it after a libFuzzer abort (timeout, OOM) until ``inputs`` ran."""
    from tests.fuzz.runner import Report

    total = Report(name, engine="atheris")
    notes = []
    remaining = inputs
    for _ in range(max_restarts + 1):
        out.mkdir(parents=True, exist_ok=True)
        summary = out / f"report-{name}.json"
        summary.unlink(missing_ok=True)
        log = out / f"libfuzzer-{name}.log"
        t0 = time.perf_counter()
        with open(log, "w") as fh:
            proc = subprocess.run([sys.executable, "-m", "tests.fuzz.worker", name, str(remaining), str(out),
                                   f"-artifact_prefix={out}/crashes/{name}-"],
                                  stdout=fh, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[2])  # fmt: skip
        wall = time.perf_counter() - t0
        text = log.read_text(errors="replace")
        done = re.search(r"Done (\d+) runs in (\d+) second", text)
        part = Report.from_json(json.loads(summary.read_text())) if summary.exists() else Report(name)
        ran = int(done.group(1)) if done else part.inputs
        total.inputs += ran
        total.seconds += wall
        total.crashes += part.crashes
        for sig, entry in part.findings.items():
            total.findings.setdefault(sig, entry)
        if proc.returncode == 0 or done:
            break
        kind = (
            "timeout"
            if "Timeout" in text or "timeout" in text
            else "out-of-memory"
            if "out-of-memory" in text
            else f"exit {proc.returncode}"
        )
        artifact = re.search(r"Test unit written to (\S+)", text)
        sig = f"libFuzzer {kind}" + (f" ({artifact.group(1)})" if artifact else "")
        total.crashes += 1
        total.findings.setdefault(sig, {"input": "", "traceback": text[-3000:], "count": 1})
        notes.append(kind)
        remaining = inputs - total.inputs
        if remaining <= 0:
            break
    total.note = ", ".join(notes)
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--long", action="store_true", help=f"coverage-guided (atheris), {LONG_INPUTS:,} inputs per target")
    parser.add_argument("--target", action="append", help="run only this target (repeatable)")
    parser.add_argument("--inputs", type=int, help="inputs per target")
    parser.add_argument("--seed", type=int, default=0, help="mutator seed (short mode)")
    parser.add_argument("--engine", choices=["auto", "atheris", "mutator"], default="auto")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "replay-proxy-fuzz")
    parser.add_argument("--list", action="store_true", help="list the targets")
    args = parser.parse_args(argv)

    from tests.fuzz.runner import run_mutator
    from tests.fuzz.targets import TARGETS

    if args.list:
        for t in TARGETS.values():
            print(f"{t.name:<20} {t.doc}")
        return 0
    names = args.target or list(TARGETS)
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        parser.error(f"unknown target(s) {', '.join(unknown)}; --list shows them")
    inputs = args.inputs or (LONG_INPUTS if args.long else SHORT_INPUTS)
    engine = args.engine
    if engine == "auto":
        engine = "atheris" if args.long and _atheris_available() else "mutator"
    if engine == "atheris" and not _atheris_available():
        parser.error("atheris is not installed (pip install atheris); --engine mutator runs without it")
    if args.long and engine == "mutator":
        print("atheris not available: long mode runs the (not coverage-guided) mutator", flush=True)
    print(f"fuzzing {len(names)} target(s), {inputs:,} inputs each, engine {engine}, output in {args.out}", flush=True)
    found = 0
    reports = []
    for name in names:
        out = args.out / name
        if engine == "atheris":
            report = run_long_atheris(name, inputs, out)
        else:
            report = run_mutator(TARGETS[name], inputs, seed=args.seed, memory=not args.long, out=out / "crashes")
            out.mkdir(parents=True, exist_ok=True)
            (out / f"report-{name}.json").write_text(json.dumps(report.to_json(), indent=1))
        reports.append(report)
        print(report.line(), flush=True)
        for sig, entry in report.findings.items():
            print(f"    {entry['count']:>6} x {sig}   input={entry['input'][:120]}", flush=True)
        found += report.crashes
    total_inputs = sum(r.inputs for r in reports)
    print(f"total: {total_inputs:,} inputs, {found} crash(es)", flush=True)
    summary = args.out / "summary.json"
    args.out.mkdir(parents=True, exist_ok=True)
    summary.write_text(json.dumps([r.to_json() for r in reports], indent=1))
    return 1 if found else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
