"""Process hygiene of a benchmark run: a SIGTERM unwinds like Ctrl-C (so the finally blocks stop
every process the run started), and enough file descriptors for thousands of connections."""

from __future__ import annotations

import resource
import signal
import threading


def raise_nofile(wanted: int = 16384) -> int:
    """Raise RLIMIT_NOFILE (soft) towards ``wanted``; children inherit it. Returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def sigterm_as_interrupt() -> None:
    """SIGTERM unwinds like Ctrl-C, so finally blocks stop every process we started."""
    if threading.current_thread() is threading.main_thread():

        def _interrupt(signum: int, frame: object) -> None:
            raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

        signal.signal(signal.SIGTERM, _interrupt)
