"""Where a session's command stands, kept for whoever may take the session over: the one
interface the relay writes through, whatever keeps it.

In a single process nobody does: ``SessionRecord`` itself does nothing, and each call costs the
hot path one method call. With ``--workers N``, ``proxy.handover.record.SlotRecord`` writes a
record in shared memory (``proxy.handover.slot``) and keeps the supervisor's copy of the
session's state (``proxy.handover.mirror``), so that another worker can take the session over
if this one dies. The relay calls the same methods either way:

- ``read``: a command was taken from the client, nothing of it sent;
- ``marker``: the commit marker written for it; ``sent``: it goes to the server;
- ``answering``: bytes of its answer go to the client (``last``: its last bytes);
- ``idle``: the answer is complete (``between_commands``: whatever was, before the next one);
- ``rebase``: the client's stream was read past what the record follows;
- ``follow``: the state changed: the copy follows before the client hears of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from proxy.netio import Channel
    from proxy.relay.relay import Relay
    from proxy.session.tracker import SessionTracker

__all__ = ["SessionRecord", "NO_RECORD"]


class SessionRecord:
    """The single-process record: nothing kept."""

    __slots__ = ()

    # Does anyone keep it (``--workers N``)? Then the answer's end waits for the copy of the
    # state, and the client's socket is shut down at the session's end (another process holds it).
    kept = False

    def read(self, wire: int, number: int) -> None:
        pass

    def marker(self, number: int) -> None:
        pass

    def sent(self) -> None:
        pass

    def answering(self, n: int, tracking: SessionTracker | None = None) -> None:
        """``n`` bytes of an answer are about to go; with ``tracking``, they are its last (the
        state after the command is the tracker's now)."""

    def idle(self, tracking: SessionTracker) -> None:
        pass

    def between_commands(self, tracking: SessionTracker) -> None:
        """The client task waits for the next command: whatever was answered is complete."""

    def rebase(self, client: Channel) -> None:
        pass

    def changed(self, tracking: SessionTracker) -> bool:
        """Must the copy follow the state (``follow``) before the client hears more?"""
        return False

    async def follow(self, s: Relay) -> None:
        pass

    def moved_on(self) -> None:
        """The session lives on in another process (an upgrade) or with the supervisor (this
        worker is going down): its client connection must not be shut down here."""

    def left_behind(self) -> None:
        """A bug unwinds this worker: whoever keeps the record keeps the client for the next."""

    def ends(self, client: Channel) -> None:
        """The session ends here."""

    async def closed(self, s: Relay) -> None:
        """The session is over: whoever keeps the record lets it go."""


NO_RECORD = SessionRecord()
