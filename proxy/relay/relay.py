"""What the relay's modules (``commands``, ``responses``, ``login``, ``oversize``, ``verdicts``,
``kill``, ``fastlane``) and the layers above (recovery, the hand-over) take of one client's
session: a ``Relay``. ``relay.session.Session`` is the one there is; they name this Protocol
instead, so that nothing imports ``session``, which imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from proxy.cycle.cycle import CommandCycle
    from proxy.cycle.inflight import Inflight
    from proxy.netio import Channel
    from proxy.protocol.response import ResponseTracker
    from proxy.relay.backendtask import BackendTask
    from proxy.relay.fastlane import FastLane
    from proxy.relay.link import BackendLink
    from proxy.relay.parts import SessionParts
    from proxy.relay.record import SessionRecord
    from proxy.session.intake import Command
    from proxy.session.tracker import SessionTracker
    from proxy.sessionlog import SessionLog

__all__ = ["Relay"]


class Relay(Protocol):
    """One client's session, as the relay's modules use it."""

    # Built once: config, plugins, target, info, commit markers, recovery (and the four below).
    parts: SessionParts
    id: int  # the connection id of the proxy's greeting
    log: SessionLog
    tracking: SessionTracker
    link: BackendLink
    cycle: CommandCycle  # the command in flight, the first answer owed, the counts
    backend_task: BackendTask
    record: SessionRecord  # where its command stands, for whoever may take it over
    lane: FastLane | None  # the fast lane, while a host loop runs and the sockets are plain
    result_hooks: bool  # a plugin wants each result
    command_hooks: bool  # a plugin wants each command
    # The client's side, as its login set it (``greeted``).
    client: Channel
    client_caps: int
    deprecate_eof: bool
    scramble: bytes
    now: Callable[[], float]  # the run's clock (trio.current_time(), read per statement)
    mover: object | None  # an upgrade's SessionMover waiting for the next command boundary
    exchanging: bool  # in COM_CHANGE_USER's exchange with the client: what goes out is not an answer
    unconnected_reason: str
    close_reason: str
    login_refused: bool

    def greeted(self, client: Channel, caps: int, scramble: bytes) -> None: ...

    def ends(self, reason: str) -> None:
        """Why the session ends (the first reason given stays)."""
        ...

    def refused(self, reason: str) -> None: ...

    def exchange(self) -> AbstractContextManager[None]: ...

    async def send_client(self, payload: bytes, seq: int) -> None: ...

    async def answer_error(self, cmd: Command, code: int, sqlstate: str, message: str) -> None: ...

    async def answer_inflight(self, err: bytes | None) -> None: ...

    async def send_inflight(self, inflight: Inflight) -> None: ...

    async def run_internal(self, payload: bytes, seq_end: int, capture: bytearray | None = None) -> ResponseTracker | None:
        """Run a command of the proxy's own and wait for its whole response; None when
        recovery answered the client instead."""
        ...

    async def follow_state(self) -> None:
        """The copy of the state kept for a takeover follows a change (``record``)."""
        ...

    def idle(self) -> bool: ...

    def start_move(self) -> None: ...
