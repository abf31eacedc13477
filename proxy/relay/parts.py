"""What a session's modules share of it that does not change while it lives (``SessionParts``),
and what the relay asks of the layers above it without importing them:

- ``Recovery``: the backend connection is gone (``on_lost``), was it an operator's KILL, move
  a session off a draining server; ``proxy.recovery.relayside`` is the one there is, handed to
  each session by the frontend (recovery sits above the relay: it imports the relay, never
  the other way round);
- ``Markers``: one session's commit markers (``proxy.recovery.markers.CommitMarkers``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import attrs

if TYPE_CHECKING:
    from proxy.config import Config
    from proxy.cycle.cycle import CommandCycle
    from proxy.cycle.inflight import ConnectionFailed
    from proxy.hooks import Hooks
    from proxy.relay.link import BackendLink
    from proxy.relay.relay import Relay
    from proxy.session.info import SessionInfo
    from proxy.session.tracker import SessionTracker
    from proxy.sessionlog import SessionLog
    from proxy.target import Target

__all__ = ["SessionParts", "Recovery", "Markers"]


class Markers(Protocol):
    """One session's commit markers, as the relay writes them before a COMMIT."""

    written: int

    @property
    def on(self) -> bool: ...

    def upsert_sql(self) -> tuple[int, bytes]: ...


class Recovery(Protocol):
    """What the relay asks of recovery."""

    async def on_lost(self, s: Relay, reason: str, rejected: bool = False, clean: bool = False) -> None:
        """The backend connection is gone (or going): recover, and do what it decides.
        ``rejected``: the server answered the command in flight with a going-away error;
        ``clean``: it closed the connection (a FIN). Fatal outcomes raise ConnectionFailed."""
        ...

    async def killed_by_operator(self, s: Relay) -> bool:
        """Did an operator's KILL end the backend connection (not a server going away)?"""
        ...

    async def move(self, s: Relay) -> bool:
        """Move an idle session off its draining backend connection; False: it stays."""
        ...

    def markers_for(self, target: Target, session_id: int) -> Markers:
        """A new session's commit markers."""
        ...

    def connection_error(self, s: Relay, reason: str) -> ConnectionFailed:
        """The client gets a connection error and the session ends (logged, counted)."""
        ...


@attrs.frozen(eq=False)
class SessionParts:
    """What a session's modules, recovery and the hand-over need of it that does not change
    while it lives: built once."""

    log: SessionLog  # the session's: every line carries its fields
    client_address: str
    config: Config  # the session's (a reload applies to new sessions only)
    link: BackendLink
    tracking: SessionTracker
    target: Target
    hooks: Hooks
    info: SessionInfo
    markers: Markers | None
    recovery: Recovery
    cycle: CommandCycle  # the command in flight and what the client is owed
