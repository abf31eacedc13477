"""The record a worker keeps of each session for its supervisor (``--workers N``): the relay's
``SessionRecord`` written to the session's slot in shared memory (``slot``), and the
supervisor's copy of the session's state kept up to date (``mirror``), so that the worker that
takes a dead one's place can take the session over (``takeover``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy.handover.slot import Slot, consumed, flags_of
from proxy.relay.record import SessionRecord

if TYPE_CHECKING:
    from proxy.handover.mirror import Mirror
    from proxy.netio import Channel
    from proxy.relay.relay import Relay
    from proxy.session.tracker import SessionTracker

__all__ = ["SlotRecord"]


class SlotRecord(SessionRecord):
    __slots__ = ("slot", "client", "mirror", "_moved", "_left")

    kept = True

    def __init__(self, slot: Slot, client: Channel) -> None:
        self.slot = slot
        self.client = client
        client.tape = slot  # the client's bytes land in the slot as they are read
        self.mirror: Mirror | None = None  # the link to the supervisor's keeper, once registered
        self._moved = False  # the session lives on in another process (an upgrade)
        self._left = False  # this worker is going down: the supervisor's copy of the client lives on

    def read(self, wire: int, number: int) -> None:
        self.slot.read(wire, number)

    def marker(self, number: int) -> None:
        self.slot.marker(number)

    def sent(self) -> None:
        self.slot.sent()

    def answering(self, n: int, tracking: SessionTracker | None = None) -> None:
        self.slot.answering(n, None if tracking is None else flags_of(tracking))

    def idle(self, tracking: SessionTracker) -> None:
        self.slot.idle(flags_of(tracking))

    def between_commands(self, tracking: SessionTracker) -> None:
        if self.slot.phase:
            self.slot.idle(flags_of(tracking))

    def rebase(self, client: Channel) -> None:
        read = consumed(client.sock)
        if read is not None:
            self.slot.rebase(read - client.decoder.buffered())

    def changed(self, tracking: SessionTracker) -> bool:
        return self.mirror is not None and tracking.changed

    async def follow(self, s: Relay) -> None:
        if self.mirror is not None:
            await self.mirror.state(s)

    def moved_on(self) -> None:
        self._moved = True

    def left_behind(self) -> None:
        """A bug unwinds this worker: the supervisor keeps the client for the next one."""
        self._left = True
        self._moved = True

    def ends(self, client: Channel) -> None:
        if not self._moved:
            client.shutdown()  # the supervisor's copy of the socket must not keep the connection open

    async def closed(self, s: Relay) -> None:
        """The session ended here: the keeper is told (unless it keeps the client for the next
        worker), and the slot is let go."""
        if self.mirror is not None:
            await self.mirror.closed(s, tell_keeper=not self._left)
        self.release()

    def release(self) -> None:
        if self.client.tape is self.slot:
            self.client.tape = None
            self.slot.close()
