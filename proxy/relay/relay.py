"""What the relay's modules (``login``, ``answers``, ``oversize``, ``responses``) take of one
client's session: a ``Relay``. ``relay.tasks.Session`` is the one there is; they name this
Protocol instead, so that they do not import ``tasks``, which imports them.

``FirstAnswer`` is what the client's next command gets before anything else (``answers``,
``oversize.SplitWarnings``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

    from proxy.netio import Channel
    from proxy.protocol.response import ResponseTracker
    from proxy.recovery.loss import SessionParts
    from proxy.relay.inflight import Inflight
    from proxy.relay.link import BackendLink
    from proxy.session.intake import Command
    from proxy.session.tracker import SessionTracker
    from proxy.sessionlog import SessionLog

__all__ = ["Relay", "FirstAnswer"]


class FirstAnswer(Protocol):
    async def answer(self, s: Relay, cmd: Command) -> bool:
        """Answer ``cmd`` in the server's place? True: answered, the command goes no further."""
        ...


class Relay(Protocol):
    """One client's session, as the relay's modules use it."""

    # Built once: config, plugins, target, info, commit markers (and the three below).
    parts: SessionParts
    id: int  # the connection id of the proxy's greeting
    log: SessionLog
    tracking: SessionTracker
    link: BackendLink
    result_hooks: bool  # a plugin wants each result
    # The client's side, as its login set it.
    client: Channel
    client_caps: int
    deprecate_eof: bool
    scramble: bytes
    # What the relay holds for the client.
    inflight: Inflight | None  # the command sent (or waiting to be) whose response is not complete
    first_answer: FirstAnswer | None
    last_activity: float  # when the last command completed
    now: Callable[[], float]  # the run's clock (trio.current_time(), read per statement)
    # --workers N: the session's record in shared memory (``proxy.handover.slot``), or None;
    # the last command the supervisor's copy of its state includes; why a LOST link has no
    # connection.
    slot: object | None
    settled: int
    commands: int
    unconnected_reason: str
    close_reason: str
    login_refused: bool  # wrong credentials (counted against the client's host)

    async def send_client(self, payload: bytes, seq: int) -> None: ...

    async def mirror_state(self) -> None:
        """The supervisor's copy of the state follows a change (``--workers N``)."""
        ...

    def rebase_slot(self) -> None: ...

    async def run_internal(self, payload: bytes, seq_end: int, capture: bytearray | None = None) -> ResponseTracker | None:
        """Run a command of the proxy's own and wait for its whole response; None when
        recovery answered the client instead."""
        ...

    async def send_inflight(self, inflight: Inflight) -> None: ...

    parked: bool  # the backend task waits between responses (an upgrade may stop it there)

    def unpark(self, interrupted: bool) -> None: ...

    @property
    def waits_to_reconnect(self) -> bool: ...

    async def command_queued(self) -> bool:
        """Wait until a command waits to be sent (while the link is LOST)."""
        ...

    async def answer_inflight(self, err: bytes | None) -> None: ...

    def idle(self) -> bool:
        """Between transactions with nothing in flight."""
        ...

    def start_move(self) -> None: ...
