"""Benchmark suite for replay-proxy: see bench/README.md (python -m bench.run)."""
