"""The package's layers, read from every import in the source (those under TYPE_CHECKING and
inside functions included): imports go downward only --

    frontend, cli, workers, admin
      -> handover -> recovery -> relay -> the sans-IO core: cycle -> session -> protocol, sqltext

-- and the core does no I/O: no trio, no sockets. Types shared by the relay and recovery
(Inflight, SessionClosed, ConnectionFailed) live in the core (proxy.cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PROXY = Path(__file__).resolve().parents[2] / "proxy"
CORE = {"protocol", "sqltext", "session", "cycle"}
ABOVE = {  # a layer must not import these
    "core": {"relay", "recovery", "handover", "frontend", "cli", "workers", "admin", "target", "backend", "netio", "hostloop", "discovery"},
    "relay": {"recovery", "handover", "frontend", "cli", "workers", "admin", "discovery"},
    "recovery": {"handover", "frontend", "cli", "workers", "admin", "discovery"},
    # the servers' addresses come from below (config, health); the frontend starts the task
    "discovery": {"target", "relay", "recovery", "handover", "frontend", "cli", "workers", "admin"},
    "handover": {"frontend", "cli"},
}
NO_IO = {"trio", "socket", "asyncio", "uvloop", "selectors"}


def imports_of(path: Path) -> list[tuple[str, int]]:
    """Every module ``path`` imports (its parts under ``proxy.`` as ``proxy.x``), with the line."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, node.lineno))
            if node.module == "proxy":  # from proxy import sqltext
                found.extend((f"proxy.{alias.name}", node.lineno) for alias in node.names)
        elif isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
    return found


def layer_of(path: Path) -> str:
    part = path.relative_to(PROXY).parts[0]
    return "core" if part in CORE else part.removesuffix(".py")


MODULES = sorted(PROXY.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PROXY)))
def test_imports_go_downward_only(path):
    layer = layer_of(path)
    upward = []
    for module, line in imports_of(path):
        parts = module.split(".")
        if parts[0] == "proxy" and len(parts) > 1 and parts[1] in ABOVE.get(layer, ()):
            upward.append(f"line {line}: {module}")
        if layer == "core" and parts[0] in NO_IO:
            upward.append(f"line {line}: {module} (the core does no I/O)")
    assert not upward, f"{path.relative_to(PROXY)} ({layer}) imports upwards: {upward}"


def test_the_shared_types_live_below_the_relay_and_recovery():
    import proxy.cycle.inflight as inflight

    assert {"Inflight", "SessionClosed", "ConnectionFailed"} <= set(vars(inflight))
    assert layer_of(Path(inflight.__file__).with_suffix(".py")) == "core"
