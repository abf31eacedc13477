"""Which build of the sans-IO core runs: compiled (mypyc) or interpreted.

``COMPILED`` names the modules setup.py compiles: the protocol, the SQL text, the session model
and the command cycle -- no I/O, type-checked, on every statement's path -- and the fast lane's
callbacks, which drive the cycle from the host loop (``proxy.relay.fastlane``). (Three are left out:
the classes cattrs reads back from a hand-over -- ``SessionState``, ``ServerReading``,
``Dialect`` -- need their annotations as written, and the plugins' ``SessionInfo`` too.)

A compiled module is an extension beside its source, and Python imports the extension first.
``choose()`` (``proxy/__init__.py`` calls it) keeps it that way only while the build's manifest
(``proxy/.compiled``, the sources' digests when they were compiled) matches every source now;
otherwise -- sources changed since, no build, or ``REPLAY_PROXY_INTERPRETED=1`` -- the finder
it puts first on ``sys.meta_path`` imports these modules from their sources (and any other
module of the package always: an extension of an earlier build is never used). ``mode()``
says which, and why. (No import of ``proxy``: setup.py reads this file alone.)
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
from pathlib import Path

__all__ = ["COMPILED", "MANIFEST", "choose", "mode", "source_of"]

_PACKAGES = {
    "protocol": ("auth", "constants", "framing", "packets", "response", "resultset", "scramble"),
    "sqltext": (
        "claims",
        "ddl",
        "expressions",
        "functions",
        "idempotence",
        "inserts",
        "lexer",
        "redact",
        "setstmt",
        "split",
        "statement",
        "tokens",
        "triage",
        "txcontrol",
    ),  # fmt: skip
    "session": ("completed", "insertid", "intake", "longdata", "prepared", "texts", "tracker", "transaction"),
    "cycle": ("answers", "cycle", "inflight"),
    "relay": ("fastlane", "heldcommit"),  # the fast lane's callbacks
}
COMPILED = tuple(f"proxy.{package}.{module}" for package, modules in _PACKAGES.items() for module in modules)
MANIFEST = "proxy/.compiled"  # relative to the project (or site-packages)
_ROOT = Path(__file__).resolve().parent.parent

_mode = "interpreted: not chosen yet"


def source_of(name: str) -> Path:
    """``proxy.a.b`` -> ``proxy/a/b.py`` (relative)."""
    return Path(*name.split(".")).with_suffix(".py")


def mode() -> str:
    """``compiled (mypyc)`` or ``interpreted: <why>``."""
    return _mode


def _why_interpreted() -> str | None:
    if os.environ.get("REPLAY_PROXY_INTERPRETED", "") not in ("", "0"):
        return "REPLAY_PROXY_INTERPRETED is set"
    manifest = _ROOT / MANIFEST
    try:
        digests = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return "not compiled (no build manifest)"
    for name in COMPILED:
        source = _ROOT / source_of(name)
        try:
            digest = hashlib.sha256(source.read_bytes()).hexdigest()
        except OSError:
            return f"{name}'s source is missing"
        if digests.get(name) != digest:
            return f"{name} changed since it was compiled (rebuild: scripts/setup test)"
        if not any(source.with_suffix(suffix).exists() for suffix in importlib.machinery.EXTENSION_SUFFIXES):
            return f"{name} has no compiled extension"  # compiled modules import one another's: all or none
    return None


class _FromSource(importlib.abc.MetaPathFinder):
    """Imports every module of the package from its source but those in ``compiled``: an
    extension left over from an earlier build (of another set of modules, against another
    build's shared library) is never imported."""

    _loaders = [(importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES)]

    def __init__(self, compiled: frozenset[str]) -> None:
        self.compiled = compiled

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        if not fullname.startswith("proxy.") or fullname in self.compiled:
            return None
        for entry in path or ():
            spec = importlib.machinery.FileFinder(entry, *self._loaders).find_spec(fullname)
            if spec is not None:
                return spec
        return None


def choose() -> str:
    """Keep the compiled modules if they are current, else import the sources (once)."""
    global _mode
    if not _mode.startswith("interpreted: not chosen"):
        return _mode
    why = _why_interpreted()
    sys.meta_path.insert(0, _FromSource(frozenset(COMPILED) if why is None else frozenset()))
    _mode = "compiled (mypyc)" if why is None else f"interpreted: {why}"
    return _mode
