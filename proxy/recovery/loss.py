"""One loss of a session's backend connection, as recovery's steps read it, and the outcomes
that end a recovery without a replay.

- ``Slots``: what the relay holds for the client that recovery reads as it goes (the command
  waiting, the client's first answer: the session's ``CommandCycle``); what does not change
  while a session lives is its ``proxy.relay.parts.SessionParts``;
- ``Loss``: one loss: what was in flight, and what the steps have found so far (how far the
  command got, the plan, the new connection), so that the driver can stop to hand the relay a
  decision and go on where it stopped;
- ``connection_error`` / ``failure``: the client gets a connection error and the session ends;
  ``lost_transaction``: the open transaction is known not to have committed, a 1213.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Protocol

import attrs
import trio

from proxy.cycle.inflight import ConnectionFailed
from proxy.protocol.constants import Err
from proxy.protocol.packets import make_err
from proxy.recovery.facts import PluginAnswers
from proxy.recovery.plan import Outcome, Plan, Sent
from proxy.relay.parts import SessionParts
from proxy.sessionlog import outcome

if TYPE_CHECKING:
    from proxy.backend import Backend
    from proxy.config import Config
    from proxy.cycle.inflight import Inflight
    from proxy.relay.link import BackendLink
    from proxy.sessionlog import SessionLog
    from proxy.stats import Stats

__all__ = ["Slots", "Loss", "Stage", "window_for", "connection_error", "failure", "lost_transaction"]


class Slots(Protocol):
    """What the relay holds for the client, which recovery reads as it goes and never writes
    (its decisions say what to write; ``proxy.cycle.CommandCycle`` is one)."""

    @property
    def inflight(self) -> Inflight | None:
        """The command waiting for the backend: the one in flight at the loss, or one the
        client sent meanwhile."""

    @property
    def first_answer(self) -> object | None:
        """What the client's next command gets first (``proxy.cycle.answers``)."""

    @property
    def last_activity(self) -> float:
        """When the client's last command completed."""


class Stage(enum.Enum):
    """Where a recovery stands: the step it runs next."""

    LOST = "lost"  # just lost: how far the command in flight got, and the plan
    RECONNECT = "reconnect"  # a new connection, the session restored on it
    RESOLVE = "resolve"  # a COMMIT in doubt settled by its commit marker, a DDL by TiDB's job list
    REPLAY = "replay"  # what runs again proven safe, then the journal replayed
    FINISH = "finish"  # the new connection serves the session
    OVER = "over"


@attrs.define(eq=False)
class Loss:
    """One loss of a session's backend connection: what recovery reads, and what it learns."""

    parts: SessionParts
    reason: str
    inflight: Inflight | None  # the command in flight when it was lost
    deprecate_eof: bool  # the client's, for a response tracker made again
    rejected: bool = False  # the server answered the command in flight with a going-away error: it did not run it
    clean: bool = False  # the server closed the connection (a FIN), as after a KILL
    # The relay's first answer that owes the client a 1213 (its slot's object), if any: owed
    # while the slot still holds it (the client may hear it meanwhile).
    owed: object | None = None
    # What the steps find:
    stage: Stage = Stage.LOST
    old: Backend | None = None  # the lost connection
    sent: Sent | None = None  # how far the command in flight got
    plan: Plan | None = None
    resolved: bool = False  # the commit marker was asked (once)
    backend: Backend | None = None  # the new connection
    replayed: int = 0  # statements of the journal replayed on it
    answers: PluginAnswers = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.answers = PluginAnswers(self.parts.hooks, self.parts.info)

    @property
    def window(self) -> float:
        """How long the command in flight waits through losses for its answer: the buffer
        window; a DDL in doubt on TiDB as long as a job may run (it runs meanwhile, whatever
        happens to the connections and the servers they land on)."""
        return window_for(self.plan, self.parts.config)

    @property
    def may_have_run(self) -> bool:
        """The command in flight may have run already, and the plan would run it again."""
        return (
            self.sent is Sent.MAYBE_EXECUTED
            and self.plan is not None
            and self.plan.outcome in (Outcome.RESUME, Outcome.RESOLVE, Outcome.RESOLVE_DDL)
        )


def window_for(plan: Plan | None, config: Config) -> float:
    """``Loss.window`` for ``plan``."""
    rec = config.recovery
    return rec.ddl_job_wait if plan is not None and plan.outcome is Outcome.RESOLVE_DDL else rec.buffer_window


def connection_error(slog: SessionLog, link: BackendLink, stats: Stats, reason: str) -> ConnectionFailed:
    """Outcome unknown or state unrecoverable: the client gets a connection error (now, or at
    its next command) and the session ends."""
    address = link.backend.address if link.backend else "-"
    msg = f"Lost connection to backend {address} during query (replay-proxy: {reason})"
    slog.error("recovery aborted, the client gets 1158 and the session ends: %s", msg, **outcome("aborted_1158", Err.CONNECTION_LOST[0]))
    stats.recovered("aborted_1158", trio.current_time() - link.lost_at if link.lost_at else 0.0)
    return ConnectionFailed(make_err(*Err.CONNECTION_LOST, msg), msg)


def failure(parts: SessionParts, reason: str) -> ConnectionFailed:
    return connection_error(parts.log, parts.link, parts.target.stats, reason)


def lost_transaction(parts: SessionParts, reason: str) -> bytes:
    """The open transaction is lost and known not to have committed: forget it; the 1213 the
    client gets for it (for the waiting command, or its next one)."""
    parts.tracking.transaction_lost()
    parts.log.warning(
        "recovery aborted, the client gets 1213 (its transaction is known not to have committed): %s",
        reason,
        **outcome("aborted_1213", Err.LOCK_DEADLOCK[0]),
    )
    link = parts.link
    parts.target.stats.recovered("aborted_1213", trio.current_time() - link.lost_at if link.lost_at else 0.0)
    msg = f"Deadlock found when trying to get lock; try restarting transaction (replay-proxy: backend connection lost, {reason})"
    return make_err(*Err.LOCK_DEADLOCK, msg)
