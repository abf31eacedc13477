"""What recovery does for the relay (``proxy.relay.parts.Recovery``; the frontend hands each
session ``RECOVERY``): the relay reports a lost backend connection and carries out what
recovery decides; recovery imports the relay, never the other way round.

``on_lost`` runs recovery's steps (``driver.recover``) and does what each decision says:
answer the command in flight now, owe the client's next command a 1213, send the waiting
command on the new connection, or end the session (ConnectionFailed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy.cycle.answers import LostTransaction
from proxy.cycle.inflight import ConnectionFailed
from proxy.recovery.driver import AnswerNext, AnswerNow, Fatal, recover
from proxy.recovery.kills import killed_by_operator
from proxy.recovery.loss import Loss, connection_error
from proxy.recovery.markers import CommitMarkers
from proxy.recovery.moves import Then
from proxy.recovery.restore import move
from proxy.relay.responses import complete

if TYPE_CHECKING:
    from proxy.relay.relay import Relay
    from proxy.target import Target

__all__ = ["RelayRecovery", "RECOVERY"]


class RelayRecovery:
    """``proxy.relay.parts.Recovery``: the one there is."""

    async def on_lost(self, s: Relay, reason: str, rejected: bool = False, clean: bool = False) -> None:
        """The backend connection is gone (or going): recovery runs its steps and says what to
        do; this does it. ``rejected``: the server answered the command in flight with a
        going-away error, so it did not run it; ``clean``: the server closed the connection (a
        FIN), as after a KILL. Fatal outcomes raise ConnectionFailed."""
        cycle = s.cycle
        first = cycle.first_answer
        owed = first if isinstance(first, LostTransaction) else None
        loss = Loss(s.parts, reason, cycle.inflight, s.deprecate_eof, rejected=rejected, clean=clean, owed=owed)
        cycle.lose()
        try:
            while True:
                decision = await recover(loss, cycle)
                if isinstance(decision, Fatal):
                    raise ConnectionFailed(decision.payload, decision.reason)
                if isinstance(decision, AnswerNow):  # recovery goes on unless it is the last
                    await s.answer_inflight(decision.packet)
                    if decision.last:
                        return
                elif isinstance(decision, AnswerNext):
                    loss.owed = LostTransaction(decision.packet)
                    cycle.owe(loss.owed)
                else:
                    waiting = decision.waiting
                    cycle.resume()
                    if decision.then is Then.SEND:
                        await s.send_inflight(waiting)
                    elif decision.then is Then.COMPLETE:
                        await complete(s, waiting, b"")
                    elif decision.then is Then.ANSWER_OWED:
                        answer = cycle.first_answer
                        cycle.owe(None)
                        await s.answer_inflight(answer.payload)
                    return
        finally:
            cycle.resume()

    async def killed_by_operator(self, s: Relay) -> bool:
        return await killed_by_operator(s.link, s.parts.target, s.parts.config.backend.io_timeout, s.log, s.cycle.last_activity)

    async def move(self, s: Relay) -> bool:
        return await move(s.parts, s.backend_task)

    def markers_for(self, target: Target, session_id: int) -> CommitMarkers:
        return CommitMarkers(target.markers, session_id)

    def connection_error(self, s: Relay, reason: str) -> ConnectionFailed:
        return connection_error(s.log, s.link, s.parts.target.stats, reason)


RECOVERY = RelayRecovery()
