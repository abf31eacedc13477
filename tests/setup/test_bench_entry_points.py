"""Every benchmark entry point starts as README and bench/README.md write it: ``python -m
bench.<name>`` from the repository's root, where ``bench`` and ``tests`` (the lab helpers in
tests/lab) import as packages. No module of bench/ edits ``sys.path`` to get there."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

ENTRY_POINTS = [
    ("bench.run", "--list", "point_select_1t"),
    ("bench", "--list", "point_select_1t"),  # __main__: bench.run
    ("bench.demo", "--help", "usage: python -m bench.demo"),
    ("bench.chaos", "--help", "usage: python -m bench.chaos"),
    ("bench.dm_e2e", "--help", "usage: python -m bench.dm_e2e"),
    ("bench.chaos_matrix", "--help", "usage:"),
    ("bench.floors", "--help", "usage: python -m bench.floors"),
    ("bench.instrumented_proxy", "--help", "usage: python -m bench.instrumented_proxy"),
]


@pytest.mark.parametrize("module, arg, expected", ENTRY_POINTS, ids=[m for m, _, _ in ENTRY_POINTS])
def test_entry_point_starts_from_the_repository_root(module, arg, expected):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing but the working directory
    res = subprocess.run(
        [sys.executable, "-m", module, arg], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert expected in res.stdout, res.stdout[-3000:]


def test_no_bench_module_edits_sys_path():
    edits = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in sorted((REPO / "bench").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bsys\.path\b|__package__", line)
    ]
    assert edits == []
