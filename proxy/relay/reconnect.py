"""Recovery: the backend connection is gone. Decide (``proxy.recovery.plan_recovery``),
reconnect, restore the session, replay the open transaction, and hand back the command to
send again. Fatal outcomes raise ``ConnectionFailed``; a lost transaction that is known not to
have committed becomes a 1213 for the client (``pending_error``)."""

from __future__ import annotations

import logging
import struct
from typing import TYPE_CHECKING

import attrs
import trio

from proxy.backend import Backend, BackendError, backoff_delays
from proxy.hooks import CommandInfo
from proxy.netio import PeerClosed
from proxy.protocol.constants import Err
from proxy.protocol.framing import encode_packet
from proxy.protocol.packets import ProtocolError, make_err
from proxy.protocol.response import Expect
from proxy.facts import statement_facts
from proxy.recovery import Outcome, Plan, Sent, StatementFacts, plan_recovery
from proxy.relay.inflight import NOT_SENT, SEND_FAILED, SENDING, ConnectionFailed, Inflight
from proxy.relay.kills import kill_if_alive, killed, killed_by_operator
from proxy.relay.proofs import code_in_views, last_insert_id, unproven
from proxy.session import PreparedStatement, SessionState
from proxy.transaction import JournalEntry
from proxy.sqltext import Kind

if TYPE_CHECKING:
    from proxy.relay.tasks import Session

__all__ = ["recover", "failure"]

log = logging.getLogger("replay_proxy.session")


def failure(s: Session, reason: str) -> ConnectionFailed:
    """Outcome unknown or state unrecoverable: the client gets a connection error (now, or at
    its next command) and the session ends."""
    address = s.backend.address if s.backend else "-"
    msg = f"Lost connection to backend {address} during query (replay-proxy: {reason})"
    log.error("session %d: recovery aborted, the client gets 1158 and the session ends: %s", s.id, msg)
    s.target.stats.recovered("aborted_1158", trio.current_time() - s.lost_at if s.lost_at else 0.0)
    return ConnectionFailed(make_err(*Err.CONNECTION_LOST, msg), msg)


def _fail_retryable_later(s: Session, reason: str) -> None:
    """The open transaction is lost and known not committed: the client hears 1213 (for the
    in-flight command, or its next one)."""
    s.tracking.transaction_lost()
    msg = f"Deadlock found when trying to get lock; try restarting transaction (replay-proxy: backend connection lost, {reason})"
    s.pending_error = make_err(*Err.LOCK_DEADLOCK, msg)
    log.warning("session %d: recovery aborted, the client gets 1213 (its transaction is known not to have committed): %s", s.id, reason)
    s.target.stats.recovered("aborted_1213", trio.current_time() - s.lost_at if s.lost_at else 0.0)


async def recover(s: Session, reason: str, rejected: bool = False, clean: bool = False) -> Inflight | None:
    """The backend connection is gone (or going). Returns the in-flight command to send on the
    new connection, if any.

    ``rejected``: the server answered the in-flight command with a going-away error, so it
    did not run it. ``clean``: the server closed the connection (a FIN), as after a KILL."""
    lost_at = s.lost_at = trio.current_time()
    old = s.backend
    s.results_gone = True
    s.backend_ok = False
    if old is not None:
        old.close()
    inflight = s.inflight
    if inflight is not None and inflight.state == SENDING:
        await s.send_settled()
    if clean and s.config.recovery.enabled and await killed_by_operator(s):
        raise killed(s, "the server closed the connection and is still up: killed by an operator")
    sent = await _sent(s, inflight, rejected)
    plan = await _plan(s, inflight, sent)
    s.losses_in_a_row += 1
    rec = s.config.recovery
    if s.losses_in_a_row > 1:
        # Lost again before anything succeeded (a server that accepts connections but
        # refuses every command while it drains): back off instead of spinning.
        await trio.sleep(min(rec.backoff_max, rec.backoff_initial * 2 ** (s.losses_in_a_row - 2)))
        if inflight is not None and trio.current_time() - inflight.arrived >= rec.buffer_window:
            why = f"backend kept failing for {rec.buffer_window:g}s"
            if sent is Sent.MAYBE_EXECUTED or sent is Sent.PARTIAL_RESPONSE:
                raise failure(s, why)
            plan = Plan(Outcome.FAIL_RETRYABLE, why)
    s.recoveries += 1
    tx = s.tracking.tx
    described = inflight.describe(CommandInfo(inflight.command.code, b"").name) if inflight is not None else "nothing"
    log.warning(
        "session %d (user %s, client %s): backend %s lost: %s; transaction open: %s (%d journaled); in flight: %s; plan: %s (%s)",
        s.id, s.info.user, s.client_address, old.address if old else "-", reason, tx.active,
        len(tx.entries), described, plan.outcome.value, plan.reason,
    )
    if s.hooks.backend_lost:
        await s.hooks.notify(s.hooks.backend_lost, s.info, reason)
    if plan.outcome is Outcome.RESUME and (plan.replay or plan.resend) and s.hooks.replay_decided:
        plan = await _ask_veto(s, plan) or plan
    if plan.outcome is Outcome.FAIL_CONNECTION:
        raise failure(s, plan.reason)
    if plan.outcome is Outcome.FAIL_RETRYABLE:
        _fail_retryable_later(s, plan.reason)
        if inflight is not None:
            await s.answer_inflight(s.take_pending_error())
    elif inflight is not None:
        inflight.restart(s.deprecate_eof)
    # Past the buffer window, a command that may have run gets a connection error; one that
    # certainly did not run gets 1213.
    may_have_run = sent is Sent.MAYBE_EXECUTED and plan.outcome in (Outcome.RESUME, Outcome.RESOLVE)
    resolved = plan.outcome is not Outcome.RESOLVE
    while True:
        backend = await _reestablish(s, inflight if may_have_run else None)
        replayed = 0
        try:
            if not resolved:
                assert inflight is not None and s.markers is not None
                try:
                    with trio.fail_after(s.config.backend.io_timeout):
                        committed = await s.markers.committed(backend, old, inflight.marker, s.config.backend.io_timeout)
                except trio.TooSlowError:
                    committed = None
                resolved = True
                if committed is None:
                    raise failure(s, "COMMIT was in flight and its commit marker could not be checked")
                log.warning("session %d: commit marker %d says the COMMIT %s", s.id, inflight.marker,
                            "committed" if committed else "did not commit")
                if committed:
                    # TiDB accepts AND CHAIN but opens no new transaction (measured, v8.5.3)
                    chain = (inflight.analysis is not None and inflight.analysis.first.chain
                             and s.tracking.dialect.flavor != "tidb")
                    begin = _chained_begin(s) if chain else None
                    s.tracking.transaction_lost()
                    if begin is not None:  # COMMIT AND CHAIN: the client is in a new transaction
                        with trio.fail_after(s.config.backend.io_timeout):
                            for statement in begin:
                                await backend.query(statement)
                        s.tracking.tx.start(None)
                    s.backend_ok = True
                    await s.answer_inflight(None)
                    return None
                if not plan.replay:
                    _fail_retryable_later(s, f"transaction did not commit and cannot be replayed: {tx.not_replayable}")
                    break
            again = _run_again(s, inflight, plan, sent)
            if again:
                with trio.fail_after(s.config.backend.io_timeout):
                    why = await code_in_views(s, backend, again)
                if why is not None:
                    raise failure(s, f"a statement to run again may call stored code: {why}")
            if plan.proof:
                with trio.fail_after(s.config.backend.io_timeout):
                    why = await unproven(s, backend, again)
                if why is not None:
                    raise failure(s, f"safe mode cannot prove the replay idempotent: {why}")
            if not (plan.replay and tx.active):
                break
            replayed, mismatch = await _replay(s, backend, plan.verify)
            if mismatch is not None:
                log.warning("session %d: replay stopped: %s; transaction rolled back", s.id, mismatch)
                if not plan.verify:
                    raise failure(s, f"idempotent replay failed: {mismatch}")
                with trio.fail_after(s.config.backend.io_timeout):
                    await backend.query("ROLLBACK")
                _fail_retryable_later(s, f"replay did not reproduce what the client saw: {mismatch}")
            break
        except (PeerClosed, BackendError, ProtocolError, trio.TooSlowError) as exc:
            log.warning("session %d: new backend connection failed during replay (%s); reconnecting", s.id, exc or "no answer within io_timeout")
            backend.close()
    current = s.inflight
    if replayed:
        s.results_gone = False  # the replayed journal left what the client's statements left
    if (s.results_gone and current is not None and current.state == NOT_SENT and not current.internal
            and s.pending_error is None and s.reads_gone_results(current.command, current.statement)):
        raise failure(s, "the command reads the previous statement's results (FOUND_ROWS(), warnings...), which stayed on the lost connection")
    s.backend_ok = True
    waited = trio.current_time() - lost_at
    log.warning(
        "session %d: recovered on %s (connection %d) after %.0f ms; replayed %d statement(s)%s",
        s.id, backend.address, backend.connection_id, waited * 1000, replayed,
        "; sending the waiting command" if current is not None and current.state == NOT_SENT else "",
    )
    if s.pending_error is None:
        s.target.stats.recovered("resumed", waited, replayed)
    if s.hooks.backend_recovered:
        await s.hooks.notify(
            s.hooks.backend_recovered, s.info,
            {"reason": reason, "plan": plan.outcome.value, "replayed": replayed, "waited": waited},
        )
    if current is not None and current.state == NOT_SENT:
        if s.pending_error is not None:
            await s.answer_inflight(s.take_pending_error())
            return None
        return current
    return None


def _run_again(s: Session, inflight: Inflight | None, plan: Plan, sent: Sent | None) -> list[JournalEntry | Inflight]:
    """What the plan runs a second time: the journal it replays, the command in flight it
    resends although it may have run. (For a plan with ``proof``, what safe mode must prove.)"""
    commands: list[JournalEntry | Inflight] = list(s.tracking.tx.entries) if plan.replay and s.tracking.tx.active else []
    if inflight is not None and plan.resend and sent is Sent.MAYBE_EXECUTED:
        commands.append(inflight)
    return commands


async def _sent(s: Session, inflight: Inflight | None, rejected: bool) -> Sent | None:
    if inflight is None:
        return None
    if inflight.forwarded:
        return Sent.PARTIAL_RESPONSE
    if inflight.state in (NOT_SENT, SEND_FAILED):
        return Sent.NOT_EXECUTED
    if rejected and not (await _facts(s, inflight)).commits:
        return Sent.NOT_EXECUTED  # a statement refused with 1053/1927 did not run (a COMMIT: unknown)
    return Sent.MAYBE_EXECUTED


async def _plan(s: Session, inflight: Inflight | None, sent: Sent | None) -> Plan:
    rec = s.config.recovery
    tracking = s.tracking
    state = tracking.state
    if not rec.enabled:
        return Plan(Outcome.FAIL_CONNECTION, "recovery is disabled for this target")
    tx = tracking.tx
    journal = [await _facts(s, e) for e in tx.entries] if tx.active else []
    pending = tracking.pending
    in_doubt = tx.in_doubt
    if tracking.xa == "PREPARED":
        in_doubt = "an XA transaction is prepared (it survives the connection)"
    elif pending is not None and pending.may_have_committed:
        in_doubt = in_doubt or pending.reason
    return plan_recovery(
        in_doubt=in_doubt,
        maybe_rolled_back=pending.reason if pending is not None and not pending.may_have_committed else None,
        sent=sent,
        inflight=await _facts(s, inflight) if inflight else None,
        in_transaction=tx.active,
        journal=journal,
        not_replayable=tx.not_replayable,
        unrestorable=state.unrestorable if state else None,
        autocommit=tracking.autocommit,
        safe_mode=tracking.safe_mode,
        commit_marker=inflight is not None and inflight.marker > 0,
    )


async def _facts(s: Session, command: JournalEntry | Inflight) -> StatementFacts:
    """The facts of a journaled or in-flight command, from its judgement when it ran, with the
    plugins' answer to the safe-mode question."""
    complete = command.command.complete if isinstance(command, Inflight) else True
    analysis = command.judged()
    answer = None
    if s.tracking.safe_mode and complete and s.hooks.is_idempotent and analysis is not None:
        answer = await s.hooks.idempotent(s.info, analysis.text)
    return statement_facts(command.payload[0], analysis, complete=complete, safe_mode=s.tracking.safe_mode, idempotent=answer)


async def _ask_veto(s: Session, plan: Plan) -> Plan | None:
    veto = await s.hooks.replay_veto(s.info, plan)
    if veto is None:
        return None
    log.warning("session %d: a plugin vetoed the replay: %s", s.id, veto.reason)
    if plan.verify and s.tracking.tx.active:  # COMMIT was not in flight: known not committed
        return Plan(Outcome.FAIL_RETRYABLE, f"replay vetoed by a plugin: {veto.reason}")
    return Plan(Outcome.FAIL_CONNECTION, f"replay vetoed by a plugin: {veto.reason}")


async def _reestablish(s: Session, may_have_run: Inflight | None) -> Backend:
    """Reconnect (with backoff) and restore the session. While the backend stays away, a
    waiting command gets an error after buffer_window: a connection error if it may have
    run already (``may_have_run``), else 1213."""
    rec = s.config.recovery
    tx = s.tracking.tx
    state = tx.session_before if (tx.active and tx.session_before) else s.tracking.state
    assert state is not None and s.login is not None
    delays = backoff_delays(rec.backoff_initial, rec.backoff_max)
    attempts = 0
    old = s.backend
    error: BackendError | None = None
    while True:
        inflight = s.inflight
        if inflight is not None and trio.current_time() - inflight.arrived >= rec.buffer_window:
            why = f"backend unavailable for {rec.buffer_window:g}s (last error: {error or 'replay failed'})"
            if inflight is may_have_run:
                raise failure(s, why)
            _fail_retryable_later(s, why)
            await s.answer_inflight(s.take_pending_error())
        attempts += 1
        login = attrs.evolve(s.login, database=state.database, collation=state.collation)
        backend = None
        try:
            backend = await s.target.connect(login)
            s.use_backend(backend)
            with trio.fail_after(s.config.backend.io_timeout):  # a server that accepts, then stalls
                await _restore(s, backend, state, old)
            return backend
        except BackendError as exc:
            if not exc.retryable:
                raise failure(s, f"cannot restore the session: {exc}") from None
            error = exc
        except (PeerClosed, ProtocolError, OSError) as exc:
            error = BackendError(str(exc), retryable=True)
        except trio.TooSlowError:
            error = BackendError(f"restoring the session took longer than {s.config.backend.io_timeout:g}s", retryable=True)
        if backend is not None:
            backend.close()
        if attempts == 1 or attempts % 20 == 0:
            log.warning("session %d: reconnect attempt %d failed: %s", s.id, attempts, error)
        await trio.sleep(next(delays))


async def _restore(s: Session, backend: Backend, state: SessionState, old: Backend | None) -> None:
    """Make the new connection look like the old session: variables, prepared statements;
    and free the old session's locks if it may still be alive."""
    if old is not None and s.config.recovery.kill_old_session:
        await kill_if_alive(s, backend, old)
    for statement in state.restore_statements():
        await backend.query(statement)
    insert_id = await last_insert_id(s, backend, state)
    if insert_id is None:
        log.warning("session %d: LAST_INSERT_ID() cannot be restored (set by an expression, or an INSERT the proxy cannot follow)", s.id)
    elif insert_id:
        await backend.query(f"DO LAST_INSERT_ID({int(insert_id)})")
    for stmt in list(s.tracking.prepared.values()):
        await _prepare_on(s, backend, stmt)


async def _prepare_on(s: Session, backend: Backend, stmt: PreparedStatement) -> None:
    tracker = await backend.exchange(encode_packet(stmt.prepare_payload, 0)[0], Expect.PREPARE)
    if tracker.error is not None or tracker.prepare_ok is None:
        raise BackendError(f"re-preparing statement {stmt.client_id} failed: {tracker.error}", retryable=False)
    s.tracking.reprepared(stmt, tracker.prepare_ok.statement_id)
    for payload in stmt.long_data:
        await backend.channel.send(s.tracking.backend_bytes(payload, None, stmt))


def _chained_begin(s: Session) -> list[str]:
    """What opens a transaction like the open one (COMMIT AND CHAIN keeps its characteristics):
    its SET TRANSACTION, and its own BEGIN / START TRANSACTION ... or a plain one."""
    tx = s.tracking.tx
    out = [tx.prefix] if tx.prefix else []
    first = tx.entries[0] if tx.entries else None
    if _is_begin(first):
        out.append(first.payload[1:].decode("utf-8", "surrogateescape"))
    else:
        out.append("START TRANSACTION")
    return out


def _is_begin(entry: JournalEntry | None) -> bool:
    """Does the journal start with the transaction's own BEGIN / START TRANSACTION?"""
    if entry is None or entry.payload[:1] != b"\x03":
        return False
    analysis = entry.judged()
    return analysis is not None and analysis.first.kind is Kind.BEGIN


async def _replay(s: Session, backend: Backend, verify: bool) -> tuple[int, str | None]:
    """Run the journal of the open transaction on the new connection."""
    tx = s.tracking.tx
    entries = list(tx.entries)
    with trio.fail_after(s.config.backend.io_timeout):
        if tx.prefix:
            await backend.query(tx.prefix)
        if not _is_begin(entries[0] if entries else None):
            await backend.query("START TRANSACTION")
    temporary: list[PreparedStatement] = []
    count = 0
    try:
        for entry in entries:
            stmt = entry.statement
            if stmt is not None and stmt.generation != s.tracking.generation:
                await _prepare_on(s, backend, stmt)  # closed by the client since; needed again
                temporary.append(stmt)
            for payload in entry.long_data or ():
                await backend.channel.send(s.tracking.backend_bytes(payload, None, stmt))
            with trio.fail_after(s.config.backend.io_timeout):
                tracker = await backend.exchange(s.tracking.backend_bytes(entry.payload, None, stmt), entry.expect, True)
            count += 1
            if verify and entry.fingerprint is not None and tracker.fingerprint != entry.fingerprint:
                return count, f"statement {count} of {len(entries)} returned a different result"
            if not verify and tracker.error is not None:
                return count, f"statement {count} of {len(entries)} failed on replay: {tracker.error}"
    finally:
        for stmt in temporary:
            if stmt.client_id not in s.tracking.prepared:
                await backend.channel.send(encode_packet(b"\x19" + struct.pack("<I", stmt.backend_id), 0)[0])
    return count, None


async def migrate(s: Session) -> None:
    """Move an idle session off a draining backend: a fresh connection (elsewhere when another
    address is usable), the session restored on it, the old one closed politely. Nothing is
    replayed or held; a command that arrives meanwhile waits for the new connection. If the
    move fails, the session stays where it is (recovery handles the old connection's end)."""
    if s.migrating or not s.move_requested or not s.idle() or not s.backend_ok or s.tracking.state is None:
        return
    if s.tracking.state.unrestorable is not None:
        log.warning("session %d: cannot move off a draining backend: %s", s.id, s.tracking.state.unrestorable)
        s.move_requested = False
        return
    old = s.backend
    s.migrating, s.backend_ok = True, False
    results_gone, s.results_gone = s.results_gone, True  # a command arriving meanwhile runs on the new one
    s.backend_replaced = trio.Event()
    started = trio.current_time()
    backend = None
    ids = s.tracking.backend_ids()
    try:
        login = attrs.evolve(s.login, database=s.tracking.state.database, collation=s.tracking.state.collation)
        with trio.fail_after(s.config.backend.io_timeout):
            backend = await s.target.connect(login)
            s.use_backend(backend)
            await _restore(s, backend, s.tracking.state, None)
    except (BackendError, PeerClosed, ProtocolError, OSError, trio.TooSlowError) as exc:
        log.warning("session %d: could not move off draining backend %s: %s", s.id, old.address if old else "-", exc)
        if backend is not None:
            backend.close()
        s.use_backend(old)
        s.results_gone = results_gone
        s.tracking.restore_backend_ids(ids)  # the statements' ids on the old connection still hold
    else:
        s.move_requested = False
        if old is not None:
            old.channel.send_nowait(encode_packet(b"\x01", 0)[0])  # COM_QUIT
            old.close()
        log.info("session %d: moved from %s to %s (connection %d) in %.0f ms, between transactions",
                 s.id, old.address if old else "-", backend.address, backend.connection_id, (trio.current_time() - started) * 1000)
    finally:
        s.migrating, s.backend_ok = False, True
        s.backend_replaced.set()
    waiting = s.inflight
    if waiting is not None and waiting.state == NOT_SENT:
        await s.send_inflight(waiting)
