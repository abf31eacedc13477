"""What a run ran on: the tools it needs (``missing_tools``), their versions and the results
header every benchmark writes (``run_meta``)."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench import REPO
from bench.haproxy import haproxy_unavailable_reason
from tests.lab.mariadb import mariadb_unavailable_reason


def missing_tools() -> list[str]:
    reasons = []
    for reason in (mariadb_unavailable_reason(), haproxy_unavailable_reason()):
        if reason:
            reasons.append(reason)
    for tool, pkg in (("sysbench", "sysbench"), ("mariadb", "mariadb-client")):
        if shutil.which(tool) is None:
            reasons.append(f"{tool} not found on PATH (Debian: apt-get install {pkg})")
    return reasons


def run_meta(now: _dt.datetime, module: str, argv: list[str] | None, **extra: Any) -> dict[str, Any]:
    """The results header every benchmark writes: when, where, with what, and the command line."""
    return {
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "host": socket.gethostname(),
        "cores": os.cpu_count(),
        "kernel": f"{platform.system()} {platform.release()}",
        "loadavg_start": os.getloadavg(),
        "versions": versions(),
        **extra,
        "command": " ".join([sys.executable, "-m", module, *(argv if argv is not None else sys.argv[1:])]),
    }


def versions() -> dict[str, str]:
    """Versions of the tools in play, for the results header."""
    out: dict[str, str] = {"python": sys.version.split()[0]}
    for name, cmd in (
        ("mariadbd", ["mariadbd", "--version"]),
        ("haproxy", ["haproxy", "-v"]),
        ("sysbench", ["sysbench", "--version"]),
        ("go", ["go", "version"]),
    ):
        exe = shutil.which(cmd[0]) or (f"/usr/sbin/{cmd[0]}" if os.path.exists(f"/usr/sbin/{cmd[0]}") else None)
        if exe is None:
            continue
        try:
            res = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, timeout=10)
            out[name] = (res.stdout or res.stderr).strip().splitlines()[0]
        except (OSError, subprocess.TimeoutExpired, IndexError):
            pass
    commit = git_commit(REPO)
    if commit:
        out["git_commit"] = commit
    return out


def git_commit(tree: Path) -> str | None:
    """The checkout's short commit, marked when its proxy/ or plugins/ have uncommitted changes."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "proxy", "plugins"], cwd=tree, capture_output=True, text=True,
                               timeout=10).stdout.strip()  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return commit + (" (+ uncommitted changes in proxy/ or plugins/)" if dirty else "")
