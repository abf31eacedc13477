"""Child processes of the lab and the benchmarks (the proxy, HAProxy): wait until one listens,
and never leave one running when the interpreter exits."""

from __future__ import annotations

import atexit
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable

_LIVE: set[subprocess.Popen] = set()


def kill_at_exit(proc: subprocess.Popen) -> None:
    """Kill ``proc`` when the interpreter exits, unless forget() was called for it first."""
    _LIVE.add(proc)


def forget(proc: subprocess.Popen) -> None:
    _LIVE.discard(proc)


def terminate(proc: subprocess.Popen, timeout: float) -> bool:
    """SIGTERM, wait up to ``timeout`` seconds, else SIGKILL; then forget it. False when it
    had to be killed."""
    clean = True
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            clean = False
            proc.kill()
            proc.wait(5)
    forget(proc)
    return clean


def _kill_all() -> None:
    for proc in list(_LIVE):
        if proc.poll() is None:
            proc.kill()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


atexit.register(_kill_all)


def wait_listening(proc: subprocess.Popen, port: int, timeout: float, what: str, log_text: Callable[[], str]) -> None:
    """Return once 127.0.0.1:``port`` accepts a connection; RuntimeError (with the end of the
    child's log) if ``proc`` exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log_text()[-3000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port} within {timeout} s:\n{log_text()[-3000:]}")


def read_log(path: Path) -> str:
    """A child's whole log file, or '' while it does not exist yet."""
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
