"""Child processes of the lab and the benchmarks (the proxy, HAProxy, the floors): wait until one
listens, tell whether one still runs, wait for a condition, and never leave one running when
the interpreter exits."""

from __future__ import annotations

import atexit
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie); without reaping it: its Popen keeps its exit status."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for(predicate: Callable[[], object], what: str = "condition", *, timeout: float = 60, interval: float = 0.05) -> None:
    """Poll ``predicate`` until it holds; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def read_log(path: Path) -> str:
    """A child's whole log file, or '' while it does not exist yet."""
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


class ListeningChild:
    """A child process that logs to ``log_path`` and serves on ``port``: ``launch`` starts it
    and waits until it listens (stopping it if it does not), ``stop`` ends it."""

    proc: subprocess.Popen | None = None
    log_path: Path
    port: int

    def launch(self, cmd: list[str], timeout: float, what: str, **popen: Any) -> None:
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, **popen)
        kill_at_exit(self.proc)
        try:
            wait_listening(self.proc, self.port, timeout, what, self.log_text)
        except RuntimeError:
            self.stop()
            raise

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def log_text(self) -> str:
        return read_log(self.log_path)

    def stop(self, timeout: float = 10) -> None:
        if self.proc is None:
            return
        terminate(self.proc, timeout)
        self._log.close()
