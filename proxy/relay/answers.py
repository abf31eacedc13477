"""What the client's next command gets before anything else: one slot per session
(``Session.first_answer``), filled by recovery or by a split statement.

- ``LostTransaction``: a transaction known not to have committed could not be brought back:
  the next command gets 1213 (DM retries the batch); a ROLLBACK of it gets OK.
- ``Failed``: the backend is lost for good while the client was idle: its next command gets
  the error, then the session ends.
- ``oversize.SplitWarnings``: right after a split statement, SHOW WARNINGS gets the warnings of
  all its pieces; any other command just goes on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from proxy.protocol.constants import Commands
from proxy.protocol.packets import make_ok, parse_err
from proxy.relay.inflight import SessionClosed
from proxy.session.intake import Command
from proxy.sqltext import Kind

if TYPE_CHECKING:
    from proxy.relay.relay import Relay

__all__ = ["LostTransaction", "Failed"]


@attrs.frozen
class LostTransaction:
    payload: bytes  # the 1213

    async def answer(self, s: Relay, cmd: Command) -> bool:
        if cmd.code == Commands.COM_QUERY and _is_rollback(s.tracking.triage(cmd.payload)[1]):
            # The client wants to roll back a transaction that is already gone: that is fine.
            await s.send_client(make_ok(s.tracking.status_word()), cmd.seq_end + 1)
        else:
            await s.send_client(self.payload, cmd.seq_end + 1)
        return True


@attrs.frozen
class Failed:
    payload: bytes  # the connection error

    async def answer(self, s: Relay, cmd: Command) -> bool:
        await s.send_client(self.payload, cmd.seq_end + 1)
        raise SessionClosed(parse_err(self.payload).message)


def _is_rollback(analysis) -> bool:
    return analysis is not None and analysis.unknown is None and analysis.single and analysis.first.kind is Kind.ROLLBACK
