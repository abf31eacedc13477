"""Benchmark suite for replay-proxy: see bench/README.md (python -m bench.run).

Its entry points run as ``python -m bench.<module>`` from the repository's root, where both
``bench`` and ``tests`` (the lab helpers of tests/lab) are importable packages: no path edits.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
