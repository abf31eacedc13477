"""Recovery, step by step: the backend connection is gone. Each step reads what it needs from
the ``Loss`` and returns what it found; the relay (``responses.on_lost``) runs the steps in
order and answers the client where one says so.

1. ``decide``: what was in flight, the facts of every statement, ``proxy.recovery.plan.plan_recovery``;
2. ``reestablish``: reconnect (with backoff) and restore the session; ``Waited`` when a waiting
   command's buffer window passes first;
3. ``resolve_marker``: a COMMIT in doubt, settled by its commit marker;
4. ``run_plan``: what runs again is proven safe (views, safe mode's keys), then the journal
   is replayed;
5. ``finish``: the new connection serves the session.

Fatal outcomes raise ``ConnectionFailed`` (``failure``); a transaction known not to have
committed becomes a 1213 (``lost_transaction``). ``move`` replaces a draining connection
between transactions, where nothing is in doubt.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
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
from proxy.recovery.facts import PluginAnswers, facts_of, needs_last_results
from proxy.recovery.kills import kill_if_alive
from proxy.recovery.plan import Outcome, Plan, Sent, StatementFacts, plan_recovery
from proxy.recovery.proofs import code_in_views, last_insert_id, unproven
from proxy.relay.inflight import NOT_SENT, SEND_FAILED, ConnectionFailed, Inflight
from proxy.relay.link import BackendLink
from proxy.session.state import PreparedStatement, SessionState
from proxy.session.transaction import JournalEntry
from proxy.sessionlog import SessionLog, outcome
from proxy.sqltext import Kind

if TYPE_CHECKING:
    from proxy.config import Config
    from proxy.hooks import Hooks
    from proxy.recovery.markers import CommitMarkers
    from proxy.session.info import SessionInfo
    from proxy.session.tracker import SessionTracker
    from proxy.stats import Stats
    from proxy.target import Target

__all__ = ["Loss", "Waited", "decide", "reestablish", "resolve_marker", "run_plan", "finish", "failure",
           "connection_error", "lost_transaction", "move"]  # fmt: skip


@attrs.define(eq=False)
class Loss:
    """One loss of a session's backend connection: what recovery reads, and what it learns."""

    log: SessionLog  # the session's: every line carries its fields
    client_address: str
    config: Config  # the session's (a reload applies to new sessions only)
    link: BackendLink
    tracking: SessionTracker
    target: Target
    hooks: Hooks
    info: SessionInfo
    markers: CommitMarkers | None
    reason: str
    old: Backend | None  # the lost connection
    inflight: Inflight | None  # the command in flight when it was lost
    deprecate_eof: bool
    sent: Sent | None = None  # how far the command in flight got (decide)
    plan: Plan | None = None
    answers: PluginAnswers = attrs.field(init=False)  # the plugins' safe-mode answers, once per text

    def __attrs_post_init__(self) -> None:
        self.answers = PluginAnswers(self.hooks, self.info)

    @property
    def may_have_run(self) -> bool:
        """The command in flight may have run already, and the plan would run it again."""
        return self.sent is Sent.MAYBE_EXECUTED and self.plan is not None and self.plan.outcome in (Outcome.RESUME, Outcome.RESOLVE)


@attrs.frozen
class Waited:
    """The waiting command's buffer window passed while the backend stayed away."""

    inflight: Inflight
    why: str


def connection_error(slog: SessionLog, link: BackendLink, stats: Stats, reason: str) -> ConnectionFailed:
    """Outcome unknown or state unrecoverable: the client gets a connection error (now, or at
    its next command) and the session ends."""
    address = link.backend.address if link.backend else "-"
    msg = f"Lost connection to backend {address} during query (replay-proxy: {reason})"
    slog.error("recovery aborted, the client gets 1158 and the session ends: %s", msg, **outcome("aborted_1158", Err.CONNECTION_LOST[0]))
    stats.recovered("aborted_1158", trio.current_time() - link.lost_at if link.lost_at else 0.0)
    return ConnectionFailed(make_err(*Err.CONNECTION_LOST, msg), msg)


def failure(loss: Loss, reason: str) -> ConnectionFailed:
    return connection_error(loss.log, loss.link, loss.target.stats, reason)


def lost_transaction(loss: Loss, reason: str) -> bytes:
    """The open transaction is lost and known not to have committed: forget it; the 1213 the
    client gets for it (for the waiting command, or its next one)."""
    loss.tracking.transaction_lost()
    loss.log.warning(
        "recovery aborted, the client gets 1213 (its transaction is known not to have committed): %s",
        reason,
        **outcome("aborted_1213", Err.LOCK_DEADLOCK[0]),
    )
    loss.target.stats.recovered("aborted_1213", trio.current_time() - loss.link.lost_at if loss.link.lost_at else 0.0)
    msg = f"Deadlock found when trying to get lock; try restarting transaction (replay-proxy: backend connection lost, {reason})"
    return make_err(*Err.LOCK_DEADLOCK, msg)


# --- 1. decide ---------------------------------------------------------------------------------


async def decide(loss: Loss, rejected: bool) -> Plan:
    """How far the command in flight got, and the plan. ``rejected``: the server answered it
    with a going-away error, so it did not run it."""
    link, rec, inflight = loss.link, loss.config.recovery, loss.inflight
    loss.sent = sent = await _sent(loss, rejected)
    plan = await _plan(loss)
    link.losses_in_a_row += 1
    if link.losses_in_a_row > 1:
        # Lost again before anything succeeded (a server that accepts connections but
        # refuses every command while it drains): back off instead of spinning.
        await trio.sleep(min(rec.backoff_max, rec.backoff_initial * 2 ** (link.losses_in_a_row - 2)))
        if inflight is not None and trio.current_time() - inflight.arrived >= rec.buffer_window:
            why = f"backend kept failing for {rec.buffer_window:g}s"
            if sent is Sent.MAYBE_EXECUTED or sent is Sent.PARTIAL_RESPONSE:
                raise failure(loss, why)
            plan = Plan(Outcome.FAIL_RETRYABLE, why)
    link.recoveries += 1
    tx = loss.tracking.tx
    described = inflight.describe(CommandInfo(inflight.command.code, b"").name) if inflight is not None else "nothing"
    loss.log.warning(
        "backend %s lost (user %s, client %s): %s; transaction open: %s (%d journaled); in flight: %s; plan: %s (%s)",
        loss.old.address if loss.old else "-",
        loss.info.user,
        loss.client_address,
        loss.reason,
        tx.active,
        len(tx.entries),
        described,
        plan.outcome.value,
        plan.reason,
    )
    hooks = loss.hooks
    if hooks.backend_lost:
        await hooks.notify(hooks.backend_lost, loss.info, loss.reason)
    if plan.outcome is Outcome.RESUME and (plan.replay or plan.resend) and hooks.replay_decided:
        plan = await _ask_veto(loss, plan) or plan
    loss.plan = plan
    return plan


async def _sent(loss: Loss, rejected: bool) -> Sent | None:
    inflight = loss.inflight
    if inflight is None:
        return None
    if inflight.forwarded:
        return Sent.PARTIAL_RESPONSE
    if inflight.state in (NOT_SENT, SEND_FAILED):
        return Sent.NOT_EXECUTED
    if rejected and not (await _facts(loss, inflight)).commits:
        return Sent.NOT_EXECUTED  # a statement refused with 1053/1927 did not run (a COMMIT: unknown)
    return Sent.MAYBE_EXECUTED


async def _plan(loss: Loss) -> Plan:
    if not loss.config.recovery.enabled:
        return Plan(Outcome.FAIL_CONNECTION, "recovery is disabled for this target")
    tracking, inflight = loss.tracking, loss.inflight
    tx, state, pending = tracking.tx, tracking.state, tracking.pending
    journal = [await _facts(loss, e) for e in tx.entries] if tx.active else []
    in_doubt = tx.in_doubt
    if tracking.xa == "PREPARED":
        in_doubt = "an XA transaction is prepared (it survives the connection)"
    elif pending is not None and pending.may_have_committed:
        in_doubt = in_doubt or pending.reason
    return plan_recovery(
        in_doubt=in_doubt,
        maybe_rolled_back=pending.reason if pending is not None and not pending.may_have_committed else None,
        sent=loss.sent,
        inflight=await _facts(loss, inflight) if inflight else None,
        in_transaction=tx.active,
        journal=journal,
        not_replayable=tx.not_replayable,
        unrestorable=state.unrestorable if state else None,
        autocommit=tracking.autocommit,
        safe_mode=tracking.safe_mode,
        commit_marker=inflight is not None and inflight.marker > 0,
    )


async def _facts(loss: Loss, command: JournalEntry | Inflight) -> StatementFacts:
    """The facts of a journaled or in-flight command (computed once, then kept with it)."""
    return await facts_of(command, loss.tracking.safe_mode, loss.answers)


async def _ask_veto(loss: Loss, plan: Plan) -> Plan | None:
    veto = await loss.hooks.replay_veto(loss.info, plan)
    if veto is None:
        return None
    loss.log.warning("a plugin vetoed the replay: %s", veto.reason)
    if plan.verify and loss.tracking.tx.active:  # COMMIT was not in flight: known not committed
        return Plan(Outcome.FAIL_RETRYABLE, f"replay vetoed by a plugin: {veto.reason}")
    return Plan(Outcome.FAIL_CONNECTION, f"replay vetoed by a plugin: {veto.reason}")


# --- 2. reestablish ----------------------------------------------------------------------------


async def reestablish(loss: Loss, waiting: Callable[[], Inflight | None]) -> Backend | Waited:
    """Reconnect (with backoff) and restore the session on the new connection. ``waiting``:
    the command waiting now (it may arrive meanwhile); when its buffer window passes first,
    ``Waited``: the caller answers it, then reestablishes again."""
    rec, tracking, link = loss.config.recovery, loss.tracking, loss.link
    tx = tracking.tx
    state = tx.session_before if (tx.active and tx.session_before) else tracking.state
    assert state is not None and link.login is not None
    delays = backoff_delays(rec.backoff_initial, rec.backoff_max)
    attempts = 0
    error: BackendError | None = None
    while True:
        inflight = waiting()
        if inflight is not None and trio.current_time() - inflight.arrived >= rec.buffer_window:
            return Waited(inflight, f"backend unavailable for {rec.buffer_window:g}s (last error: {error or 'replay failed'})")
        attempts += 1
        login = attrs.evolve(link.login, database=state.database, collation=state.collation)
        backend = None
        try:
            backend = await loss.target.connect(login)
            link.replace(backend)
            with trio.fail_after(loss.config.backend.io_timeout):  # a server that accepts, then stalls
                await restore(loss, backend, state, loss.old)
            return backend
        except BackendError as exc:
            if not exc.retryable:
                raise failure(loss, f"cannot restore the session: {exc}") from None
            error = exc
        except (PeerClosed, ProtocolError, OSError) as exc:
            error = BackendError(str(exc), retryable=True)
        except trio.TooSlowError:
            error = BackendError(f"restoring the session took longer than {loss.config.backend.io_timeout:g}s", retryable=True)
        if backend is not None:
            backend.close()
        if attempts == 1 or attempts % 20 == 0:
            loss.log.warning("reconnect attempt %d failed: %s", attempts, error)
        await trio.sleep(next(delays))


async def restore(loss: Loss, backend: Backend, state: SessionState, old: Backend | None) -> None:
    """Make the new connection look like the old session: variables, LAST_INSERT_ID(),
    prepared statements; and free the old session's locks if it may still be alive."""
    if old is not None and loss.config.recovery.kill_old_session:
        await kill_if_alive(backend, old, loss.log)
    for statement in state.restore_statements():
        await backend.query(statement)
    insert_id = await last_insert_id(backend, state, loss.target.keys)
    if insert_id is None:
        loss.log.warning("LAST_INSERT_ID() cannot be restored (set by an expression, or an INSERT the proxy cannot follow)")
    elif insert_id:
        await backend.query(f"DO LAST_INSERT_ID({int(insert_id)})")
    for stmt in list(loss.tracking.prepared.values()):
        await _prepare_on(loss.tracking, backend, stmt)


async def _prepare_on(tracking: SessionTracker, backend: Backend, stmt: PreparedStatement) -> None:
    tracker = await backend.exchange(encode_packet(stmt.prepare_payload, 0)[0], Expect.PREPARE)
    if tracker.error is not None or tracker.prepare_ok is None:
        raise BackendError(f"re-preparing statement {stmt.client_id} failed: {tracker.error}", retryable=False)
    tracking.reprepared(stmt, tracker.prepare_ok.statement_id)
    for piece in stmt.long_data:
        await _send_long_data(tracking, backend, piece, stmt)


async def _send_long_data(tracking: SessionTracker, backend: Backend, piece, stmt: PreparedStatement) -> None:
    """A kept COM_STMT_SEND_LONG_DATA, again, exactly (from the session's spool)."""
    for chunk in tracking.long_data_frames(piece, stmt):
        await backend.channel.send(chunk)


# --- 3. resolve_marker -------------------------------------------------------------------------


async def resolve_marker(loss: Loss, backend: Backend) -> bool:
    """Did the COMMIT in doubt commit? Its commit marker says; when it cannot (the old
    connection may still be alive), a connection error. If it committed, the session is left
    as the client believes it: no transaction, or COMMIT AND CHAIN's new one."""
    inflight, io_timeout = loss.inflight, loss.config.backend.io_timeout
    assert inflight is not None and loss.markers is not None
    try:
        with trio.fail_after(io_timeout):
            committed = await loss.markers.committed(backend, loss.old, inflight.marker, io_timeout, loss.tracking.dialect.flavor)
    except trio.TooSlowError:
        committed = None
    if committed is None:
        raise failure(loss, "COMMIT was in flight and its commit marker could not be checked")
    loss.log.warning("commit marker %d says the COMMIT %s", inflight.marker, "committed" if committed else "did not commit")
    if committed:
        # TiDB accepts AND CHAIN but opens no new transaction (measured, v8.5.3)
        chain = inflight.analysis is not None and inflight.analysis.first.chain and loss.tracking.dialect.flavor != "tidb"
        begin = _chained_begin(loss.tracking) if chain else None
        loss.tracking.transaction_lost()
        if begin is not None:  # COMMIT AND CHAIN: the client is in a new transaction
            with trio.fail_after(io_timeout):
                for statement in begin:
                    await backend.query(statement)
            loss.tracking.tx.start(None)
    return committed


def _chained_begin(tracking: SessionTracker) -> list[str]:
    """What opens a transaction like the open one (COMMIT AND CHAIN keeps its characteristics):
    its SET TRANSACTION, and its own BEGIN / START TRANSACTION ... or a plain one."""
    tx = tracking.tx
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


# --- 4. run_plan -------------------------------------------------------------------------------


async def run_plan(loss: Loss, backend: Backend) -> tuple[int, bytes | None]:
    """Prove that what runs again is safe to run again, then replay the journal. Returns the
    statements replayed and, when the replay did not reproduce what the client saw (the
    transaction rolled back), the 1213 the client is owed."""
    plan, io_timeout, tx = loss.plan, loss.config.backend.io_timeout, loss.tracking.tx
    assert plan is not None
    again = _run_again(loss)
    if again:
        with trio.fail_after(io_timeout):
            why = await code_in_views(backend, again, loss.tracking)
        if why is not None:
            raise failure(loss, f"a statement to run again may call stored code: {why}")
    if plan.proof:
        with trio.fail_after(io_timeout):
            why = await unproven(backend, again, loss.tracking, loss.target.keys, loss.answers)
        if why is not None:
            raise failure(loss, f"safe mode cannot prove the replay idempotent: {why}")
    if not (plan.replay and tx.active):
        return 0, None
    replayed, mismatch = await _replay(loss, backend, plan.verify)
    if mismatch is None:
        return replayed, None
    loss.log.warning("replay stopped: %s; transaction rolled back", mismatch)
    if not plan.verify:
        raise failure(loss, f"idempotent replay failed: {mismatch}")
    with trio.fail_after(io_timeout):
        await backend.query("ROLLBACK")
    return replayed, lost_transaction(loss, f"replay did not reproduce what the client saw: {mismatch}")


def _run_again(loss: Loss) -> list[JournalEntry | Inflight]:
    """What the plan runs a second time: the journal it replays, the command in flight it
    resends although it may have run. (For a plan with ``proof``, what safe mode must prove.)"""
    plan, tx = loss.plan, loss.tracking.tx
    commands: list[JournalEntry | Inflight] = list(tx.entries) if plan.replay and tx.active else []
    if loss.inflight is not None and plan.resend and loss.sent is Sent.MAYBE_EXECUTED:
        commands.append(loss.inflight)
    return commands


async def _replay(loss: Loss, backend: Backend, verify: bool) -> tuple[int, str | None]:
    """Run the journal of the open transaction on the new connection."""
    tracking, io_timeout = loss.tracking, loss.config.backend.io_timeout
    tx = tracking.tx
    entries = list(tx.entries)
    with trio.fail_after(io_timeout):
        if tx.prefix:
            await backend.query(tx.prefix)
        if not _is_begin(entries[0] if entries else None):
            await backend.query("START TRANSACTION")
    temporary: list[PreparedStatement] = []
    count = 0
    try:
        for entry in entries:
            stmt = entry.statement
            # Each entry within io_timeout, as the restore is: a server that stops reading
            # (long data filling its window) or answering is a failed replay, not a hang.
            with trio.fail_after(io_timeout):
                if stmt is not None and stmt.generation != tracking.generation:
                    await _prepare_on(tracking, backend, stmt)  # closed by the client since; needed again
                    temporary.append(stmt)
                for piece in entry.long_data or ():
                    await _send_long_data(tracking, backend, piece, stmt)
                tracker = await backend.exchange(tracking.backend_bytes(entry.payload, None, stmt), entry.expect, True)
            count += 1
            if verify and entry.fingerprint is not None and tracker.fingerprint != entry.fingerprint:
                return count, f"statement {count} of {len(entries)} returned a different result"
            if not verify and tracker.error is not None:
                return count, f"statement {count} of {len(entries)} failed on replay: {tracker.error}"
    finally:
        for stmt in temporary:
            if stmt.client_id not in tracking.prepared:
                await backend.channel.send(encode_packet(b"\x19" + struct.pack("<I", stmt.backend_id), 0)[0])
    return count, None


# --- 5. finish ---------------------------------------------------------------------------------


async def finish(loss: Loss, backend: Backend, replayed: int, waiting: Inflight | None, owed: bool) -> None:
    """The new connection serves the session from now on. ``waiting``: the command that waits
    to be sent; ``owed``: the client is owed a 1213 (not a resumed recovery). A waiting command
    that reads the previous statement's results, which stayed on the lost connection, is a
    connection error."""
    link = loss.link
    if replayed:
        link.owes_results = False  # the replayed journal left what the client's statements left
    sending = waiting is not None and waiting.state == NOT_SENT and not waiting.internal
    if (
        sending
        and not owed
        and link.takes_results_debt(waiting.command.code)
        and needs_last_results(loss.tracking.reading, waiting.payload, waiting.statement)
    ):
        raise failure(
            loss, "the command reads the previous statement's results (FOUND_ROWS(), warnings...), which stayed on the lost connection"
        )
    link.ready()
    waited = trio.current_time() - link.lost_at
    loss.log.warning(
        "recovered on %s (connection %d) after %.0f ms; replayed %d statement(s)%s",
        backend.address,
        backend.connection_id,
        waited * 1000,
        replayed,
        "; sending the waiting command" if waiting is not None and waiting.state == NOT_SENT else "",
        **outcome("aborted_1213" if owed else "resumed", Err.LOCK_DEADLOCK[0] if owed else None, waited_ms=round(waited * 1000)),
    )
    if not owed:
        loss.target.stats.recovered("resumed", waited, replayed)
    hooks = loss.hooks
    if hooks.backend_recovered:
        plan = loss.plan.outcome.value if loss.plan else "-"
        await hooks.notify(
            hooks.backend_recovered, loss.info, {"reason": loss.reason, "plan": plan, "replayed": replayed, "waited": waited}
        )


# --- a move between transactions --------------------------------------------------------------


async def move(loss: Loss) -> bool:
    """Replace a draining connection between transactions: a fresh connection (elsewhere when
    another address is usable), the session restored on it, the old one closed politely.
    Nothing is replayed or held; a command that arrives meanwhile waits for the new connection.
    False: the move failed, and the session stays where it was (recovery handles the old
    connection's end)."""
    link, tracking = loss.link, loss.tracking
    state = tracking.state
    old = link.begin_move()
    owed, link.owes_results = link.owes_results, True  # a command arriving meanwhile runs on the new one
    started = trio.current_time()
    backend = None
    ids = tracking.backend_ids()
    try:
        login = attrs.evolve(link.login, database=state.database, collation=state.collation)
        with trio.fail_after(loss.config.backend.io_timeout):
            backend = await loss.target.connect(login)
            link.replace(backend)
            await restore(loss, backend, state, None)
    except (BackendError, PeerClosed, ProtocolError, OSError, trio.TooSlowError) as exc:
        loss.log.warning("could not move off draining backend %s: %s", old.address if old else "-", exc, **outcome("move_failed"))
        if backend is not None:
            backend.close()
        link.move_failed(old, owed, ids)  # the statements' ids on the old connection still hold
        return False
    link.moved(old)
    moved_ms = round((trio.current_time() - started) * 1000)
    loss.log.info(
        "moved from %s to %s (connection %d) in %d ms, between transactions",
        old.address if old else "-",
        backend.address,
        backend.connection_id,
        moved_ms,
        **outcome("moved", waited_ms=moved_ms),
    )
    return True
