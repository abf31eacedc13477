"""Recovery's driver: the backend connection is gone; ``recover(loss, slots)`` runs the steps
and comes back with what the relay must do:

- ``Resumed``: the new connection serves the session; the command waiting goes out (or gets
  the 1213 the client is owed);
- ``AnswerNow``: the command waiting gets this answer now (a 1213; OK for a COMMIT its marker
  proved committed); unless it is the last, call ``recover`` again: recovery goes on from
  where it stopped (the ``Loss`` keeps its progress);
- ``AnswerNext``: the client's next command gets this 1213 first; call ``recover`` again;
- ``Fatal``: the client gets this connection error (now, or at its next command) and the
  session ends.

The steps, in order (``Stage``): lost (``judge``: how far the command in flight got, the
plan), reconnect and restore (``restore``), resolve a COMMIT in doubt by its marker and replay
(``replay``), finish. After each, a pure function (``moves``) says what follows; the I/O steps
take what they use. What the relay holds for the client (the command waiting, its first
answer) the driver only reads (``Slots``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import trio

from proxy.backend import BackendError
from proxy.cycle.inflight import NOT_SENT, SEND_FAILED, SENDING, ConnectionFailed, Inflight
from proxy.hooks import CommandInfo
from proxy.netio import PeerClosed
from proxy.protocol.constants import Err
from proxy.protocol.packets import ProtocolError, make_err, make_ok
from proxy.recovery import moves
from proxy.recovery.facts import facts_of
from proxy.recovery.kills import killed, killed_by_operator
from proxy.recovery.loss import Loss, Slots, Stage, failure, lost_transaction, window_for
from proxy.recovery.moves import GiveUp, Move, Then
from proxy.recovery.plan import Outcome, Plan, StatementFacts, marker_plan, plan_recovery
from proxy.recovery.replay import Unproven, resolve_ddl, resolve_marker, run_plan
from proxy.recovery.restore import Waited, reestablish
from proxy.relay.reading import judged_whole
from proxy.session.texts import needs_last_results
from proxy.sessionlog import outcome

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = ["recover", "judge", "finish", "Resumed", "AnswerNow", "AnswerNext", "Fatal", "Decision"]


@attrs.frozen
class Resumed:
    """The new connection serves the session; ``then``: what the command ``waiting`` gets."""

    waiting: Inflight | None
    then: Then


@attrs.frozen
class AnswerNow:
    """The command waiting gets ``packet`` now. Unless ``last``, recovery goes on: call
    ``recover`` again."""

    packet: bytes
    last: bool = False


@attrs.frozen
class AnswerNext:
    """The client's next command gets ``packet`` (a 1213: its transaction is lost) first;
    recovery goes on: call ``recover`` again."""

    packet: bytes


@attrs.frozen
class Fatal:
    """The session cannot go on: the client gets ``payload`` (now if a command waits, else at
    its next command), then the session ends."""

    payload: bytes
    reason: str


Decision = Resumed | AnswerNow | AnswerNext | Fatal

# A new connection that fails while the session is brought back on it: reconnect again.
_TRANSIENT = (PeerClosed, BackendError, ProtocolError, trio.TooSlowError)


async def recover(loss: Loss, slots: Slots) -> Decision:
    """Run recovery's steps from where ``loss`` stands to its next decision."""
    try:
        while True:
            decision = await _STEPS[loss.stage](loss, slots)
            if decision is not None:
                return decision
    except ConnectionFailed as failed:
        loss.stage = Stage.OVER
        return Fatal(failed.payload, str(failed))


# --- the stages -------------------------------------------------------------------------------


async def _lost(loss: Loss, slots: Slots) -> Decision | None:
    """The connection went away: close it, wait for a send under way, tell an operator's KILL
    from a server going away, judge, and make the plan's first move."""
    p, inflight = loss.parts, loss.inflight
    loss.old = p.link.lost()
    if inflight is not None and inflight.state == SENDING:
        await p.link.settled()
    if loss.clean and p.config.recovery.enabled:
        if await killed_by_operator(p.link, p.target, p.config.backend.io_timeout, p.log, slots.last_activity):
            raise killed(p.target.stats, "the server closed the connection and is still up: killed by an operator")
    if loss.old is not None:  # its server may be going away: new connections try the others first
        p.target.suspect(loss.old.address)
    plan = await judge(loss)
    loss.stage = Stage.RECONNECT
    move = moves.opening(plan.outcome, inflight is not None)
    if move is Move.FAIL:
        raise failure(p, plan.reason)
    if move is Move.ANSWER_1213:
        return AnswerNow(lost_transaction(p, plan.reason))
    if move is Move.OWE_1213:
        return AnswerNext(lost_transaction(p, plan.reason))
    if inflight is not None:
        inflight.restart(loss.deprecate_eof)
    return None


async def _reconnect(loss: Loss, slots: Slots) -> Decision | None:
    """A restored connection. A waiting command whose buffer window passes first gets an error
    meanwhile: a connection error if it may have run already, else 1213."""
    got = await reestablish(loss, slots)
    if isinstance(got, Waited):
        if moves.after_wait(got.inflight is loss.inflight, loss.may_have_run) is Move.FAIL:
            raise failure(loss.parts, got.why)
        return AnswerNow(lost_transaction(loss.parts, got.why))
    loss.backend = got
    loss.stage = Stage.RESOLVE if moves.after_restore(loss.plan.outcome, loss.resolved) is Move.RESOLVE else Stage.REPLAY
    return None


async def _resolve(loss: Loss, slots: Slots) -> Decision | None:
    """Ask the COMMIT's marker (once) whether it committed; or the DDL's job how it ended."""
    p = loss.parts
    if loss.plan.outcome is Outcome.RESOLVE_DDL:
        return await _resolve_ddl(loss)
    loss.resolved = True
    try:
        committed = await resolve_marker(loss, loss.backend)
    except _TRANSIENT as exc:
        return _again(loss, exc)
    move = moves.after_marker(committed, loss.plan.replay)
    if move is Move.ANSWER_OK:
        return await _settled(loss, make_ok(p.tracking.status_word()), "its commit marker says the COMMIT committed: OK")
    if move is Move.OWE_1213:
        loss.stage = Stage.FINISH
        return AnswerNext(lost_transaction(p, f"transaction did not commit and cannot be replayed: {p.tracking.tx.not_replayable}"))
    loss.stage = Stage.REPLAY
    return None


async def _resolve_ddl(loss: Loss) -> Decision | None:
    """Find the DDL's job in TiDB's list: done → OK, failed → its error, never queued → sent
    again (after the replay of what the transaction had, if any)."""
    p = loss.parts
    try:
        job, error = await resolve_ddl(loss, loss.backend)
    except _TRANSIENT as exc:
        return _again(loss, exc)
    move = moves.after_ddl_job(job.ended if job is not None else None)
    if move is Move.REPLAY:
        loss.stage = Stage.REPLAY
        return None
    if move is Move.ANSWER_OK:
        return await _settled(loss, make_ok(p.tracking.status_word()), f"DDL job {job.id} ended {job.state}: OK")
    code, msg = error or (Err.CANCELLED_DDL[0], f"DDL job {job.id} ended {job.state}")
    return await _settled(loss, make_err(code, Err.CANCELLED_DDL[1], msg), f"DDL job {job.id} ended {job.state}: error {code}")


async def _settled(loss: Loss, answer: bytes, how: str) -> AnswerNow:
    """The command in doubt is settled on the new connection, which serves the session now:
    it gets ``answer``, the one it would have had (a recovery the client saw only as a delay)."""
    loss.stage = Stage.OVER
    await _recovered(loss, how, owed=False)
    return AnswerNow(answer, last=True)


async def _replay(loss: Loss, slots: Slots) -> Decision | None:
    """Prove what runs again, replay the journal. What safe mode cannot prove, a commit
    marker may settle: then the COMMIT is resolved by it first."""
    try:
        replayed, owed = await run_plan(loss, loss.backend)
    except _TRANSIENT as exc:
        return _again(loss, exc)
    except Unproven as exc:
        loss.parts.log.warning("safe mode cannot prove the replay idempotent (%s); asking the commit marker", exc)
        loss.plan = marker_plan(f"COMMIT in flight, not proven idempotent ({exc}); its commit marker will tell")
        loss.stage = Stage.RESOLVE
        return None
    loss.replayed = replayed
    loss.stage = Stage.FINISH
    if moves.after_replay(owed is not None) is Move.OWE_1213:
        return AnswerNext(owed)
    return None


def _again(loss: Loss, exc: Exception) -> None:
    """The new connection failed while the session was brought back on it: another one."""
    loss.parts.log.warning("new backend connection failed during replay (%s); reconnecting", exc or "no answer within io_timeout")
    loss.backend.close()
    loss.stage = Stage.RECONNECT


async def _finish(loss: Loss, slots: Slots) -> Decision:
    """The command waiting now (the one in flight, or one that arrived meanwhile) goes out, or
    gets the 1213 the client is owed (while its first answer still holds it)."""
    waiting = slots.inflight
    owed = loss.owed is not None and slots.first_answer is loss.owed
    await finish(loss, waiting, owed)
    loss.stage = Stage.OVER
    piece = waiting.piece if waiting is not None else None
    sent_here = piece is not None and piece.sent_on == loss.parts.tracking.generation
    return Resumed(waiting, moves.then(waiting is not None and waiting.state == NOT_SENT, owed, sent_here))


_STEPS: dict[Stage, Callable[[Loss, Slots], Awaitable[Decision | None]]] = {
    Stage.LOST: _lost,
    Stage.RECONNECT: _reconnect,
    Stage.RESOLVE: _resolve,
    Stage.REPLAY: _replay,
    Stage.FINISH: _finish,
}


# --- judge ------------------------------------------------------------------------------------


async def judge(loss: Loss) -> Plan:
    """How far the command in flight got, and the plan. The decision is pure (``moves``,
    ``plan.plan_recovery``); around it, explicit steps: the facts (the plugins asked once per
    text), the backoff after a loss in a row, the log line, the plugins told, their veto."""
    p = loss.parts
    link, rec, inflight, hooks = p.link, p.config.recovery, loss.inflight, p.hooks
    in_flight, journal = await _facts(loss)
    if inflight is not None:
        unsent = inflight.state in (NOT_SENT, SEND_FAILED)
        loss.sent = moves.how_far(unsent, inflight.forwarded, loss.rejected, in_flight is not None and in_flight.commits)
    plan = _plan(loss, in_flight, journal)
    delay = moves.backoff_delay(p.cycle.count_loss(), rec.backoff_initial, rec.backoff_max)
    if delay is not None:
        await trio.sleep(delay)
        waited = trio.current_time() - inflight.arrived if inflight is not None else None
        after = moves.after_backoff(plan, loss.sent, waited, window_for(plan, p.config))
        if isinstance(after, GiveUp):
            raise failure(p, after.reason)
        plan = after
    link.count_recovery()
    _log_loss(loss, plan)
    if hooks.backend_lost:
        await hooks.notify(hooks.backend_lost, p.info, loss.reason)
    if moves.asks_veto(plan) and hooks.replay_decided:
        veto = await hooks.replay_veto(p.info, plan)
        if veto is not None:
            p.log.warning("a plugin vetoed the replay: %s", veto.reason)
        plan = moves.vetoed(plan, veto.reason if veto is not None else None, p.tracking.tx.active)
    loss.plan = plan
    return plan


async def _facts(loss: Loss) -> tuple[StatementFacts | None, list[StatementFacts]]:
    """The facts of the command in flight and of the journal, each computed once (then kept with
    it). The command in flight's first when the server refused it: how far it got hangs on it."""
    p, inflight = loss.parts, loss.inflight
    safe_mode, tx, enabled = p.tracking.safe_mode, p.tracking.tx, p.config.recovery.enabled
    in_flight = await facts_of(inflight, safe_mode, loss.answers) if inflight is not None and loss.rejected else None
    journal = [await facts_of(e, safe_mode, loss.answers) for e in tx.entries] if enabled and tx.active else []
    if inflight is not None and enabled:
        in_flight = await facts_of(inflight, safe_mode, loss.answers)
    return in_flight, journal


def _plan(loss: Loss, in_flight: StatementFacts | None, journal: list[StatementFacts]) -> Plan:
    """The plan (``plan_recovery``) from the facts and what the tracker knows of the session."""
    if not loss.parts.config.recovery.enabled:
        return Plan(Outcome.FAIL_CONNECTION, "recovery is disabled for this target")
    tracking, inflight = loss.parts.tracking, loss.inflight
    tx, state, pending = tracking.tx, tracking.state, tracking.pending
    in_doubt = tx.in_doubt
    if tracking.xa == "PREPARED":
        in_doubt = "an XA transaction is prepared (it survives the connection)"
    elif pending is not None and pending.may_have_committed:
        in_doubt = in_doubt or pending.reason
    return plan_recovery(
        in_doubt=in_doubt,
        maybe_rolled_back=pending.reason if pending is not None and not pending.may_have_committed else None,
        sent=loss.sent,
        inflight=in_flight,
        in_transaction=tx.active,
        journal=journal,
        not_replayable=tx.not_replayable,
        unrestorable=state.unrestorable if state else None,
        autocommit=tracking.autocommit,
        safe_mode=tracking.safe_mode,
        commit_marker=inflight is not None and inflight.marker > 0,
        ddl_jobs=loss.parts.config.recovery.ddl_jobs and tracking.dialect.flavor == "tidb",
        wrote=tx.active and tx.writes,
    )


def _log_loss(loss: Loss, plan: Plan) -> None:
    p, inflight = loss.parts, loss.inflight
    tx = p.tracking.tx
    described = inflight.describe(CommandInfo(inflight.command.code, b"").name) if inflight is not None else "nothing"
    p.log.warning(
        "backend %s lost (user %s, client %s): %s; transaction open: %s (%d journaled); in flight: %s; plan: %s (%s)",
        loss.old.address if loss.old else "-",
        p.info.user,
        p.client_address,
        loss.reason,
        tx.active,
        len(tx.entries),
        described,
        plan.outcome.value,
        plan.reason,
    )


# --- finish -----------------------------------------------------------------------------------


async def finish(loss: Loss, waiting: Inflight | None, owed: bool) -> None:
    """The new connection serves the session from now on. ``waiting``: the command that waits
    to be sent; ``owed``: the client is owed a 1213 (not a resumed recovery). A waiting command
    that reads the previous statement's results, which stayed on the lost connection, is a
    connection error."""
    p, replayed = loss.parts, loss.replayed
    link = p.link
    if replayed:
        link.results_replayed()
    sending = waiting is not None and waiting.state == NOT_SENT and not waiting.internal
    if (
        sending
        and not owed
        and link.takes_results_debt(waiting.command.code)
        and await judged_whole(waiting.command, lambda payload: needs_last_results(p.tracking.reading, payload, waiting.statement))
    ):
        raise failure(
            p, "the command reads the previous statement's results (FOUND_ROWS(), warnings...), which stayed on the lost connection"
        )
    sending_now = "; sending the waiting command" if waiting is not None and waiting.state == NOT_SENT else ""
    await _recovered(loss, f"replayed {replayed} statement(s){sending_now}", owed=owed, replayed=replayed)


async def _recovered(loss: Loss, how: str, *, owed: bool, replayed: int = 0) -> None:
    """The new connection serves the session: its log line (with the outcome: ``resumed``, or
    ``aborted_1213`` when the client is ``owed`` a 1213), the metric, the plugins told."""
    p, backend = loss.parts, loss.backend
    p.link.ready()
    waited = trio.current_time() - p.link.lost_at
    p.log.warning(
        "recovered on %s (connection %d) after %.0f ms; %s",
        backend.address,
        backend.connection_id,
        waited * 1000,
        how,
        **outcome("aborted_1213" if owed else "resumed", Err.LOCK_DEADLOCK[0] if owed else None, waited_ms=round(waited * 1000)),
    )
    if not owed:
        p.target.stats.recovered("resumed", waited, replayed)
    hooks = p.hooks
    if hooks.backend_recovered:
        plan = loss.plan.outcome.value if loss.plan else "-"
        await hooks.notify(hooks.backend_recovered, p.info, {"reason": loss.reason, "plan": plan, "replayed": replayed, "waited": waited})
