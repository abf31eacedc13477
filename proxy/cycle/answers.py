"""What the client's next command gets before anything else (``CommandCycle.first_answer``),
filled by recovery or by a split statement. Each decides, without I/O, what the command gets:

- ``LostTransaction``: a transaction known not to have committed could not be brought back:
  the next command gets 1213 (DM retries the batch); a ROLLBACK of it gets OK.
- ``Failed``: the backend is lost for good while the client was idle: its next command gets
  the error, then the session ends.
- ``proxy.relay.oversize.SplitWarnings``: right after a split statement, SHOW WARNINGS gets the
  warnings of all its pieces; any other command just goes on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from proxy.protocol.constants import Commands
from proxy.protocol.framing import encode_packet
from proxy.protocol.packets import make_ok, parse_err
from proxy.session.intake import Command
from proxy.sqltext import Analysis, Kind

if TYPE_CHECKING:
    from proxy.session.tracker import SessionTracker

__all__ = ["FirstAnswer", "Reply", "LostTransaction", "Failed"]


class Reply:
    """The client's command answered in the server's place: ``frames`` (whole packets, sequence
    ids set); ``close``: why the session ends after it (None: it goes on)."""

    __slots__ = ("frames", "close")

    def __init__(self, frames: bytes, close: str | None = None) -> None:
        self.frames = frames
        self.close = close


class FirstAnswer(Protocol):
    def reply(self, cmd: Command, tracking: SessionTracker, deprecate_eof: bool) -> Reply | None:
        """What ``cmd`` gets in the server's place; None: it goes on as usual."""
        ...


class LostTransaction:
    __slots__ = ("payload",)

    def __init__(self, payload: bytes) -> None:
        self.payload = payload  # the 1213

    def reply(self, cmd: Command, tracking: SessionTracker, deprecate_eof: bool) -> Reply:
        if cmd.code == Commands.COM_QUERY and _is_rollback(tracking.triage(cmd.payload)[1]):
            # The client wants to roll back a transaction that is already gone: that is fine.
            return Reply(encode_packet(make_ok(tracking.status_word()), cmd.seq_end + 1)[0])
        return Reply(encode_packet(self.payload, cmd.seq_end + 1)[0])


class Failed:
    __slots__ = ("payload",)

    def __init__(self, payload: bytes) -> None:
        self.payload = payload  # the connection error

    def reply(self, cmd: Command, tracking: SessionTracker, deprecate_eof: bool) -> Reply:
        return Reply(encode_packet(self.payload, cmd.seq_end + 1)[0], close=parse_err(self.payload).message)


def _is_rollback(analysis: Analysis | None) -> bool:
    return analysis is not None and analysis.unknown is None and analysis.single and analysis.first.kind is Kind.ROLLBACK
