"""The two lanes' loops: uvloop (libuv, in C) as the host, trio as its guest on the same thread.

Trio remains the programming model: every task, timeout and wait is trio's, run by
``trio.lowlevel.start_guest_run`` inside uvloop. What uvloop adds is its callbacks: the fast
lane (``proxy.relay.fastlane``) watches a session's sockets with ``loop.add_reader`` and
carries each command and its answer from there, with no trio task woken per packet (a task's
wake is a pass of trio's run loop in Python: about half of a statement's cost). A callback
that meets something to wait for hands it to a trio task (``TrioToken.run_sync_soon``).

The sockets the fast lane waits on are watched through ``Poller``: by uvloop for their bytes,
and by an epoll of the proxy's own for their errors, which libuv's watch misses.

``run`` runs an async function that way when uvloop is installed, else with ``trio.run``;
``current()`` is the host while it runs (None: trio alone, as in the component tests).
"""

from __future__ import annotations

import logging
import select
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

__all__ = ["Host", "Poller", "current", "run", "available"]

log = logging.getLogger("replay_proxy.hostloop")

T = TypeVar("T")


_BATCH = 64  # events taken per call; more wait for the next (the epoll stays readable)


class Poller:
    """Sockets watched for the fast lane: ``add(fd, readable)`` calls ``readable()`` from the
    host loop whenever the socket has bytes, an end or an error, until ``remove(fd)``.

    uvloop watches each socket for its bytes (``add_reader``). libuv's watch of a socket ends
    without a call when the socket reports an error (a reset right behind the last bytes read:
    tests/component/test_fastlane.py), and a task parked on it would wait forever. So an epoll of
    the proxy's own watches the same sockets for errors and hang-ups only (an empty event mask:
    the kernel reports those always), and uvloop watches that epoll as one more descriptor: quiet
    while sessions run, it costs nothing per statement."""

    __slots__ = ("loop", "errors", "callbacks")

    def __init__(self, loop: Any) -> None:
        self.loop = loop
        self.errors = select.epoll()
        self.callbacks: dict[int, Callable[[], None]] = {}
        loop.add_reader(self.errors.fileno(), self._failed)

    def add(self, fd: int, readable: Callable[[], None]) -> None:
        self.loop.add_reader(fd, readable)
        if fd in self.callbacks:
            self.errors.modify(fd, 0)
        else:
            self.errors.register(fd, 0)
        self.callbacks[fd] = readable

    def remove(self, fd: int) -> None:
        if self.callbacks.pop(fd, None) is not None:
            self.errors.unregister(fd)
            self.loop.remove_reader(fd)

    def _failed(self) -> None:
        callbacks = self.callbacks
        for fd, _ in self.errors.poll(0, _BATCH):
            readable = callbacks.get(fd)  # (an earlier callback of the batch may have removed it)
            if readable is not None:
                readable()  # it reads the error or the end, and gives the parked task up

    def close(self) -> None:
        self.loop.remove_reader(self.errors.fileno())
        self.errors.close()


class Host:
    """The running host loop, its sockets' watcher and the way back into trio from its callbacks."""

    __slots__ = ("loop", "poller", "token")

    def __init__(self, loop: Any, token: trio.lowlevel.TrioToken) -> None:
        self.loop = loop  # uvloop.Loop
        self.poller = Poller(loop)  # the fast lane's sockets
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
        host = _current = Host(loop, trio.lowlevel.current_trio_token())
        try:
            return await async_fn(*args)
        finally:
            _current = None
            host.poller.close()

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
