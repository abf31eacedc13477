"""The two lanes' loops: uvloop (libuv, in C) as the host, trio as its guest on the same thread.

Trio remains the programming model: every task, timeout and wait is trio's, run by
``trio.lowlevel.start_guest_run`` inside uvloop. What uvloop adds is its callbacks: the fast
lane (``proxy.relay.fastlane``) watches a session's sockets with ``loop.add_reader`` and
carries each command and its answer from there, with no trio task woken per packet (a task's
wake is a pass of trio's run loop in Python: about half of a statement's cost). A callback
that meets something to wait for hands it to a trio task (``TrioToken.run_sync_soon``).

``run`` runs an async function that way when uvloop is installed, else with ``trio.run``;
``current()`` is the host while it runs (None: trio alone, as in the component tests).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

__all__ = ["Host", "current", "run", "available"]

log = logging.getLogger("replay_proxy.hostloop")

T = TypeVar("T")


class Host:
    """The running host loop and the way back into trio from its callbacks."""

    __slots__ = ("loop", "token")

    def __init__(self, loop: Any, token: trio.lowlevel.TrioToken) -> None:
        self.loop = loop  # uvloop.Loop: add_reader / remove_reader
        self.token = token  # run_sync_soon: a callback's way into trio (thread-safe)


_current: Host | None = None


def current() -> Host | None:
    return _current


def available() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def run(async_fn: Callable[..., Awaitable[T]], *args: Any, hosted: bool = True) -> T:
    """``async_fn(*args)`` as trio's guest in a uvloop loop (``hosted`` and uvloop installed),
    else under ``trio.run``; its result, or its exception."""
    if not hosted or not available():
        return trio.run(async_fn, *args)
    import uvloop

    loop = uvloop.new_event_loop()
    outcomes: list[Any] = []

    async def main() -> T:
        global _current
        _current = Host(loop, trio.lowlevel.current_trio_token())
        try:
            return await async_fn(*args)
        finally:
            _current = None

    def done(outcome: Any) -> None:
        outcomes.append(outcome)
        loop.stop()

    trio.lowlevel.start_guest_run(
        main,
        run_sync_soon_threadsafe=loop.call_soon_threadsafe,
        run_sync_soon_not_threadsafe=loop.call_soon,
        done_callback=done,
        host_uses_signal_set_wakeup_fd=True,
    )
    try:
        loop.run_forever()
    finally:
        loop.close()
    return outcomes[0].unwrap()
