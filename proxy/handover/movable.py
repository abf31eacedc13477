"""Whether a session can move to the new process of an upgrade now (``proxy.handover.sessions``):
its state must all be in the tracker and in the two connections, nothing half done. An open
transaction moves (its connection, and so the transaction on the server, moves with it; its
journal goes too), unless long data is in its journal (spooled to files of this process). An
idle one whose backend connection the server closed for idling moves without it: the new
process opens one at its next command, as this one would have."""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy.netio import Channel

if TYPE_CHECKING:
    from proxy.relay.relay import Relay

__all__ = ["why_not_movable"]


def why_not_movable(s: Relay) -> str | None:
    """Why an upgrade cannot move this session to the new process now (None: it can, at its
    next command boundary; ``proxy.handover.sessions``)."""
    link, tracking = s.link, s.tracking
    unconnected = s.waits_to_reconnect
    if not unconnected and (not link.up or link.backend is None):
        return f"its backend connection is {link.state.value}"
    if s.cycle.inflight is not None:
        return "a command is in flight"
    if any(e.long_data for e in tracking.tx.entries):
        return "the transaction's journal holds long data"
    if tracking.pending is not None or tracking.xa is not None:
        return "an ERR left the transaction's fate open" if tracking.pending is not None else f"an XA transaction is {tracking.xa}"
    if tracking.long_data.held:
        return "long data is held"
    if s.cycle.first_answer is not None:
        return "an answer is owed to the next command"
    if type(s.client) is not Channel or not (unconnected or type(link.backend.channel) is Channel):
        return "a TLS connection (its state cannot be passed to another process)"
    if not unconnected and link.backend.channel.decoder.buffered():
        return "unread bytes from the backend"
    if tracking.state is None:
        return "not logged in"
    return None
