"""Build and run tests/goclient, the DM-like Go client (go-sql-driver/mysql).

Flags, modes and JSON formats are documented at the top of
tests/goclient/main.go. Typical use:

    out = run_goclient("smoke", port=proxy_port, user="app", password="apppw")
    assert out["ok"], out["checks"]

Flags are passed as keyword arguments, underscores becoming dashes
(``read_timeout="5s"`` -> ``-read-timeout=5s``); list values repeat the flag
(``session=["time_zone=+00:00"]``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GOCLIENT_DIR = Path(__file__).resolve().parent.parent / "goclient"
BIN_DIR = GOCLIENT_DIR / "bin"  # git-ignored
BINARY = BIN_DIR / "goclient"
# tests/goclient is a Go module (go.mod + go.sum) requiring go-sql-driver/mysql at the version
# TiDB DM v8.5 ships; the driver comes from the Go module proxy into the module cache
# (GOMODCACHE, default ~/go/pkg/mod), which outlives the run.
MIN_GO = (1, 26)
# Where the Go toolchain is installed on the lab machines when it is not on PATH.
_GO_FALLBACKS = ("/usr/local/go/bin/go",)
# Shared across sessions so rebuilds are incremental (the driver compiles once).
GOCACHE = Path(tempfile.gettempdir()) / "replay-proxy-gocache"

_build_lock = threading.Lock()
_built: Path | None = None


class GoClientError(RuntimeError):
    """Building or running the Go client failed, or its output is unusable."""


def _go_version(go: str) -> tuple[int, int] | None:
    """(major, minor) of ``go version``, or None if it cannot be run or parsed."""
    try:
        out = subprocess.run([go, "version"], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"\bgo(\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def find_go() -> tuple[str | None, str | None]:
    """(path of a go >= MIN_GO, None) or (None, why not): $LAB_GO, then PATH, then
    /usr/local/go/bin/go (an older Debian go earlier on PATH does not hide the newer one)."""
    if os.environ.get("LAB_GO"):
        candidates = [os.environ["LAB_GO"]]
    else:
        candidates = [c for c in (shutil.which("go"), *_GO_FALLBACKS) if c and os.access(c, os.X_OK)]
    if not candidates:
        return None, "go not found on PATH or in /usr/local/go/bin (Go >= %d.%d is required)" % MIN_GO
    seen = []
    for go in dict.fromkeys(candidates):
        version = _go_version(go)
        if version is not None and version >= MIN_GO:
            return go, None
        seen.append(f"{go}: " + ("go%d.%d" % version if version else "does not run"))
    return None, f"Go >= {MIN_GO[0]}.{MIN_GO[1]} is required ({'; '.join(seen)})"


def go_unavailable_reason() -> str | None:
    """None if a Go toolchain new enough for tests/goclient/go.mod is installed.

    The driver itself is a module dependency (go.sum pins it), fetched through the
    Go module proxy by the first build; a failed fetch is a build error.
    """
    return find_go()[1]


def build_goclient(force: bool = False) -> Path:
    """Build tests/goclient/bin/goclient once per process and return its path."""
    global _built
    with _build_lock:
        if _built is not None and _built.exists() and not force:
            return _built
        go, reason = find_go()
        if go is None:
            raise GoClientError(f"cannot build the Go client: {reason}")
        BIN_DIR.mkdir(parents=True, exist_ok=True)
        GOCACHE.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        # Module mode with go.mod/go.sum as committed (-mod=readonly: a build never edits
        # them), this toolchain only (no silent toolchain download).
        env.update(GO111MODULE="on", GOFLAGS="-mod=readonly -buildvcs=false", GOTOOLCHAIN="local", GOCACHE=str(GOCACHE), CGO_ENABLED="0")
        # Build to a temporary name and rename: concurrent sessions never
        # execute a half-written binary.
        tmp = BIN_DIR / f".goclient.{os.getpid()}.tmp"
        cmd = [go, "build", "-o", str(tmp), "."]
        try:
            res = subprocess.run(
                cmd,
                cwd=GOCLIENT_DIR,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=300,
            )
        except subprocess.TimeoutExpired as e:
            raise GoClientError("go build of tests/goclient did not finish in 300 s") from e
        if res.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise GoClientError(
                f"go build failed (exit {res.returncode}) in {GOCLIENT_DIR}:\n" + (res.stdout + res.stderr).decode(errors="replace")
            )
        os.replace(tmp, BINARY)
        _built = BINARY
        return BINARY


def _flag_args(flags: dict[str, Any]) -> list[str]:
    args = []
    for key, value in flags.items():
        if value is None:
            continue
        name = "-" + key.replace("_", "-")
        values = value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            if isinstance(v, bool):
                v = "true" if v else "false"
            args.append(f"{name}={v}")
    return args


def goclient_command(
    mode: str,
    *,
    port: int,
    host: str = "127.0.0.1",
    user: str = "app",
    password: str = "apppw",
    db: str = "test",
    **flags: Any,
) -> list[str]:
    """The argv for one goclient run (builds the binary if needed)."""
    binary = build_goclient()
    base = {
        "mode": mode,
        "dsn_host": host,
        "port": port,
        "user": user,
        "password": password,
        "db": db,
    }
    return [str(binary), *_flag_args(base), *_flag_args(flags)]


def parse_goclient_output(stdout: bytes | str, stderr: bytes | str = b"", returncode: int = 0) -> dict:
    """Parse the single JSON object goclient prints; raise with context if absent."""
    if isinstance(stdout, bytes):
        stdout = stdout.decode(errors="replace")
    if isinstance(stderr, bytes):
        stderr = stderr.decode(errors="replace")
    try:
        data = json.loads(stdout)
    except json.JSONDecodeError:
        raise GoClientError(
            f"goclient (exit {returncode}) printed no JSON result\n--- stdout ---\n{stdout[-3000:]}\n--- stderr ---\n{stderr[-3000:]}"
        ) from None
    if not isinstance(data, dict):
        raise GoClientError(f"goclient printed {type(data).__name__}, expected a JSON object")
    return data


@dataclass
class GoClientRun:
    """Everything about one finished run, for assertions and messages."""

    argv: list[str]
    returncode: int
    data: dict
    stderr: str
    elapsed: float

    def describe(self) -> str:
        return (
            f"goclient exit {self.returncode} after {self.elapsed:.1f} s: {' '.join(self.argv)}\n"
            f"{json.dumps(self.data, indent=2, sort_keys=True)[:6000]}\n"
            f"--- stderr (tail) ---\n{self.stderr[-3000:]}"
        )


def run_goclient(
    mode: str,
    *,
    port: int,
    timeout: float = 120,
    check: bool = True,
    full: bool = False,
    **kwargs: Any,
) -> dict | GoClientRun:
    """Run goclient and return its parsed JSON.

    With ``check`` (default) a non-zero exit raises GoClientError showing the
    JSON and stderr. ``full=True`` returns a GoClientRun instead of the dict.
    """
    argv = goclient_command(mode, port=port, **kwargs)
    start = time.monotonic()
    try:
        res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise GoClientError(
            f"goclient -mode {mode} did not finish in {timeout} s: {' '.join(argv)}\n"
            f"--- stderr (tail) ---\n{(e.stderr or b'').decode(errors='replace')[-3000:]}"
        ) from None
    return _finish(argv, res.returncode, res.stdout, res.stderr, time.monotonic() - start, check, full)


async def run_goclient_async(
    mode: str,
    *,
    port: int,
    timeout: float = 120,
    check: bool = True,
    full: bool = False,
    **kwargs: Any,
) -> dict | GoClientRun:
    """Like run_goclient, for trio tests (e.g. a workload while the server restarts)."""
    import trio

    argv = goclient_command(mode, port=port, **kwargs)
    start = time.monotonic()
    with trio.move_on_after(timeout) as scope:
        res = await trio.run_process(argv, stdin=b"", capture_stdout=True, capture_stderr=True, check=False)
    if scope.cancelled_caught:
        raise GoClientError(f"goclient -mode {mode} did not finish in {timeout} s: {' '.join(argv)}")
    return _finish(argv, res.returncode, res.stdout, res.stderr, time.monotonic() - start, check, full)


def _finish(argv: list[str], rc: int, stdout: bytes, stderr: bytes, elapsed: float, check: bool, full: bool) -> dict | GoClientRun:
    data = parse_goclient_output(stdout, stderr, rc)
    run = GoClientRun(argv, rc, data, stderr.decode(errors="replace"), elapsed)
    if check and rc != 0:
        raise GoClientError(run.describe())
    return run if full else data
