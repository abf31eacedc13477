"""The plugin chain of the ``proxy+plugins`` target: which plugins (``"a|b"``: the first of a, b
that is installed), with options that make each do real work on every statement without changing
what the workloads send or get back, written as the proxy config's [plugins] table."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.lab.proxy import toml_key, toml_value

# "a|b": the first of a, b that is installed (plugins are being written alongside the bench).
DEFAULT_PLUGIN_CHAIN = ("firewall", "query_log|rewrite", "metrics")

# Options that make each plugin do real work on every statement without changing the workload:
# rules are checked on every statement and never match what the benchmarks send.
DEFAULT_PLUGIN_OPTIONS: dict[str, dict[str, Any]] = {
    "firewall": {
        "deny": ["DROP DATABASE", "TRUNCATE"],
        "deny_patterns": ["(?i)\\bFROM\\s+`?mysql`?\\."],
    },
    # Production-like: slow statements, failed ones and a 1 % sample go to a file.
    "query_log": {"path": "{workdir}/query.log", "slow_ms": 100, "sample": 0.01},
    "metrics": {"statement_kinds": True},
    "rewrite": {
        "rules": [{"pattern": "(?i)^\\s*INSERT\\s+INTO\\s+`?bench_no_such_table`?", "replace": "REPLACE INTO bench_no_such_table"}],
    },
}


def _plugin_module(name: str) -> str:
    return name.partition(":")[0] if ":" in name else f"plugins.{name}"


def _plugin_installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(_plugin_module(name)) is not None
    except (ImportError, ValueError):
        return False


def _subst(value: Any, workdir: Path | None) -> Any:
    if isinstance(value, str) and workdir is not None:
        return value.replace("{workdir}", str(workdir))
    if isinstance(value, list):
        return [_subst(v, workdir) for v in value]
    if isinstance(value, dict):
        return {k: _subst(v, workdir) for k, v in value.items()}
    return value


@dataclass
class PluginVariant:
    """The chain of the proxy+plugins target. Entries "a|b" take the first installed plugin."""

    chain: tuple[str, ...] = DEFAULT_PLUGIN_CHAIN
    options: dict[str, dict[str, Any]] | None = None  # None: DEFAULT_PLUGIN_OPTIONS

    def resolved_chain(self) -> tuple[list[str], list[str]]:
        """(chain with alternatives resolved, entries with no installed plugin)."""
        chain, missing = [], []
        for entry in self.chain:
            choices = [c.strip() for c in entry.split("|") if c.strip()]
            found = next((c for c in choices if _plugin_installed(c)), None)
            if found is None:
                missing.append(" or ".join(f"{c} ({_plugin_module(c)})" for c in choices))
            else:
                chain.append(found)
        return chain, missing

    def missing_modules(self) -> list[str]:
        return self.resolved_chain()[1]

    def toml(self, workdir: Path | None = None) -> str:
        """The [plugins] section; "{workdir}" in a string option becomes the proxy's work dir."""
        chain, _ = self.resolved_chain()
        options = DEFAULT_PLUGIN_OPTIONS if self.options is None else self.options
        lines = ["[plugins]", f"chain = {toml_value(chain)}"]
        for name in chain:
            opts = options.get(name)
            if opts:
                lines.append(f"[plugins.{toml_key(name)}]")
                lines.extend(f"{toml_key(k)} = {toml_value(_subst(v, workdir))}" for k, v in opts.items())
        return "\n".join(lines) + "\n"

    def describe(self) -> dict[str, Any]:
        chain, missing = self.resolved_chain()
        options = DEFAULT_PLUGIN_OPTIONS if self.options is None else self.options
        return {
            "requested": list(self.chain),
            "chain": chain,
            "missing": missing,
            "options": {n: options[n] for n in chain if n in options},
        }
