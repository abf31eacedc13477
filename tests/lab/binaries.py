"""Where the lab finds the programs built by hand outside the checkout (tidb-server, DM, PD,
the store, TiProxy): an environment variable (a file, or a folder of several programs), else
``~/.cache/replay-proxy/bin``, else PATH. Nothing here builds them."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

CACHE_BIN = Path.home() / ".cache" / "replay-proxy" / "bin"


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find(name: str, env: str, folder: bool = False) -> str | None:
    """``name`` from ``$env`` (the program itself, or with ``folder`` a folder holding it; set
    but wrong means absent), else the cache folder, else PATH."""
    given = os.environ.get(env)
    if given:
        candidate = Path(given) / name if folder else Path(given)
        return str(candidate) if _executable(candidate) else None
    if _executable(CACHE_BIN / name):
        return str(CACHE_BIN / name)
    return shutil.which(name)


def missing_reason(names: tuple[str, ...], env: str, folder: bool = False) -> str | None:
    """None when every program is found, else the one line a skipped suite shows."""
    missing = [name for name in names if find(name, env, folder) is None]
    if not missing:
        return None
    where = f"${env}={os.environ[env]}" if os.environ.get(env) else f"${env}, {CACHE_BIN} or PATH"
    return f"no {', '.join(missing)} in {where} (see README, 'Testing on TiDB')"
