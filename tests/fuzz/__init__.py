"""Fuzzing of every parser the proxy exposes to the network (issue "hostile peers").

- ``targets``: one target per parser; each takes raw bytes, derives its options (chunking,
  Expect kind, dialect, ...) from the first bytes and checks the rule: no exception but the
  codec's own (ProtocolError; SqlParseError for SQL, nothing at all from analyze/classify),
  no unbounded allocation, no infinite loop, plus differential oracles (chunking invariance,
  fingerprint on/off, round trips).
- ``mutate``: a seeded, dependency-free mutator (the short CI mode, and the fallback when
  atheris is missing).
- ``python -m tests.fuzz``: the driver. ``--short`` (default) runs the mutator in-process;
  ``--long`` runs atheris (coverage-guided libFuzzer) per target in a subprocess, at least
  1,000,000 inputs per target, and prints inputs/s and crashes.

This package imports nothing from ``proxy`` at import time, so the atheris worker can
instrument the proxy's modules when it imports them.
"""
