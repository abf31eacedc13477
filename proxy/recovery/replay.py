"""The steps on a restored connection that settle the open transaction: a COMMIT in doubt
asked of its commit marker (``resolve_marker``), a DDL in doubt looked up in TiDB's job list
(``resolve_ddl``); what runs again proven safe, then the journal replayed and checked against
what the client saw (``run_plan``).
"""

from __future__ import annotations

import struct
import time
from typing import TYPE_CHECKING

import trio

from proxy.backend import BackendError
from proxy.cycle.inflight import Inflight
from proxy.protocol.framing import encode_packet
from proxy.recovery.ddljobs import Job, JobState, error_of, error_query, find_job, job_text
from proxy.recovery.kills import old_session_gone
from proxy.recovery.loss import failure, lost_transaction
from proxy.recovery.plan import Sent
from proxy.recovery.proofs import code_in_views, unproven
from proxy.recovery.restore import prepare_on, send_long_data
from proxy.session.state import PreparedStatement
from proxy.session.transaction import JournalEntry
from proxy.sqltext import Kind

if TYPE_CHECKING:
    from proxy.backend import Backend
    from proxy.recovery.loss import Loss
    from proxy.session.tracker import SessionTracker

__all__ = ["resolve_marker", "resolve_ddl", "run_plan", "is_begin", "Unproven"]

_POLL = 0.5  # seconds between two readings of TiDB's DDL job list


class Unproven(Exception):
    """Safe mode could not prove the replay idempotent, and the COMMIT in doubt has a commit
    marker to ask instead (``Plan.marker_fallback``). Nothing ran on the new connection."""


async def resolve_marker(loss: Loss, backend: Backend) -> bool:
    """Did the COMMIT in doubt commit? Its commit marker says; when it cannot (the old
    connection may still be alive), a connection error. If it committed, the session is left
    as the client believes it: no transaction, or COMMIT AND CHAIN's new one."""
    p, inflight = loss.parts, loss.inflight
    io_timeout, tracking = p.config.backend.io_timeout, p.tracking
    assert inflight is not None and p.markers is not None
    try:
        with trio.fail_after(io_timeout):
            committed = await p.markers.committed(backend, loss.old, inflight.marker, io_timeout, tracking.dialect.flavor)
    except trio.TooSlowError:
        committed = None
    if committed is None:
        raise failure(p, "COMMIT was in flight and its commit marker could not be checked")
    p.log.warning("commit marker %d says the COMMIT %s", inflight.marker, "committed" if committed else "did not commit")
    if committed:
        # TiDB accepts AND CHAIN but opens no new transaction (measured, v8.5.3)
        chain = inflight.analysis is not None and inflight.analysis.first.chain and tracking.dialect.flavor != "tidb"
        begin = _chained_begin(tracking) if chain else None
        tracking.transaction_lost()
        if begin is not None:  # COMMIT AND CHAIN: the client is in a new transaction
            with trio.fail_after(io_timeout):
                for statement in begin:
                    await backend.query(statement)
            tracking.tx.start(None)
    return committed


async def resolve_ddl(loss: Loss, backend: Backend) -> tuple[Job | None, tuple[int, str] | None]:
    """The job of the DDL in doubt once it ended (done or failed) and, when it failed, TiDB's
    error for it if it can be read (code, message); or None when it never was
    queued and cannot be any more (its old session is gone, or safe mode may send it again
    anyway). A job still running is waited for (``recovery.ddl_job_wait``); a missing one is
    looked for again while the old session might still queue it, until the command's buffer
    window ends. Then, or when two jobs match that the job list cannot tell apart, a connection
    error. The job is the one the old connection queued: another session's of the same text
    (a second DM worker's ALTER of a merged table) is not."""
    p, inflight = loss.parts, loss.inflight
    assert inflight is not None
    rec, io_timeout = p.config.recovery, p.config.backend.io_timeout
    text = job_text(inflight.judged())
    assert text is not None
    since = time.time() - (trio.current_time() - inflight.arrived)  # when it arrived, by the wall clock
    resend_anyway = p.tracking.safe_mode and inflight.facts is not None and inflight.facts.idempotent
    database = p.tracking.state.database if p.tracking.state else None
    sender = loss.old.connection_id if loss.old is not None else None  # its job is the one this connection queued
    gone = False
    while True:
        with trio.fail_after(io_timeout):
            found = await find_job(backend, text, since, database, resend_anyway, sender)
            if found is None and not gone and not resend_anyway and loss.old is not None:
                gone = await old_session_gone(backend, loss.old, io_timeout, p.log)
                if gone:  # it may have queued the job between the list's reading and its end
                    found = await find_job(backend, text, since, database, resend_anyway, sender)
        if isinstance(found, str):
            raise failure(p, f"the DDL in flight cannot be told apart: {found}")
        waited = trio.current_time() - inflight.arrived
        if found is None:
            if gone or resend_anyway:
                p.log.warning("the DDL in flight is not in TiDB's DDL job list: it never ran; sending it again")
                return None, None
            if waited >= rec.buffer_window:
                raise failure(
                    p,
                    f"the DDL in flight is not in TiDB's DDL job list after {rec.buffer_window:g}s, and its old session may still queue it",
                )
        elif found.ended is not JobState.RUNNING:
            p.tracking.transaction_lost()  # queued, so its implicit commit ended the (empty) transaction
            return found, await _job_error(backend, found) if found.ended is JobState.FAILED else None
        elif waited >= rec.ddl_job_wait:
            raise failure(p, f"DDL job {found.id} of the DDL in flight still {found.state} after {rec.ddl_job_wait:g}s")
        await trio.sleep(_POLL)


async def _job_error(backend: Backend, job: Job) -> tuple[int, str] | None:
    """TiDB's error for a failed job, or None when it cannot be read (no privilege on
    mysql.tidb_ddl_history, another layout of its row)."""
    try:
        return error_of(await backend.query(error_query(job.id)))
    except BackendError:
        return None


def _chained_begin(tracking: SessionTracker) -> list[str]:
    """What opens a transaction like the open one (COMMIT AND CHAIN keeps its characteristics):
    its SET TRANSACTION, and its own BEGIN / START TRANSACTION ... or a plain one."""
    tx = tracking.tx
    out = [tx.prefix] if tx.prefix else []
    first = tx.entries[0] if tx.entries else None
    if is_begin(first):
        out.append(first.payload[1:].decode("utf-8", "surrogateescape"))
    else:
        out.append("START TRANSACTION")
    return out


def is_begin(entry: JournalEntry | None) -> bool:
    """Does the journal start with the transaction's own BEGIN / START TRANSACTION?"""
    if entry is None or entry.payload[:1] != b"\x03":
        return False
    analysis = entry.judged()
    return analysis is not None and analysis.first.kind is Kind.BEGIN


async def run_plan(loss: Loss, backend: Backend) -> tuple[int, bytes | None]:
    """Prove that what runs again is safe to run again, then replay the journal. Returns the
    statements replayed and, when the replay did not reproduce what the client saw (the
    transaction rolled back), the 1213 the client is owed. ``Unproven`` when the proof fails
    and a commit marker can tell instead."""
    p, plan = loss.parts, loss.plan
    io_timeout, tx = p.config.backend.io_timeout, p.tracking.tx
    assert plan is not None
    again = _run_again(loss)
    if again:
        with trio.fail_after(io_timeout):
            why = await code_in_views(backend, again, p.tracking)
        if why is not None:
            raise failure(p, f"a statement to run again may call stored code: {why}")
    if plan.proof:
        with trio.fail_after(io_timeout):
            why = await unproven(backend, again, p.tracking, p.target.keys, loss.answers)
        if why is not None:
            if plan.marker_fallback:
                raise Unproven(why)
            raise failure(p, f"safe mode cannot prove the replay idempotent: {why}")
    if not (plan.replay and tx.active):
        return 0, None
    replayed, mismatch = await _replay(loss, backend, plan.verify)
    if mismatch is None:
        return replayed, None
    p.log.warning("replay stopped: %s; transaction rolled back", mismatch)
    if not plan.verify:
        raise failure(p, f"idempotent replay failed: {mismatch}")
    with trio.fail_after(io_timeout):
        await backend.query("ROLLBACK")
    return replayed, lost_transaction(p, f"replay did not reproduce what the client saw: {mismatch}")


def _run_again(loss: Loss) -> list[JournalEntry | Inflight]:
    """What the plan runs a second time: the journal it replays, the command in flight it
    resends although it may have run. (For a plan with ``proof``, what safe mode must prove.)"""
    plan, tx = loss.plan, loss.parts.tracking.tx
    commands: list[JournalEntry | Inflight] = list(tx.entries) if plan.replay and tx.active else []
    if loss.inflight is not None and plan.resend and loss.sent is Sent.MAYBE_EXECUTED:
        commands.append(loss.inflight)
    return commands


async def _replay(loss: Loss, backend: Backend, verify: bool) -> tuple[int, str | None]:
    """Run the journal of the open transaction on the new connection."""
    tracking, io_timeout = loss.parts.tracking, loss.parts.config.backend.io_timeout
    tx = tracking.tx
    entries = list(tx.entries)
    with trio.fail_after(io_timeout):
        if tx.prefix:
            await backend.query(tx.prefix)
        if not is_begin(entries[0] if entries else None):
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
                    await prepare_on(tracking, backend, stmt)  # closed by the client since; needed again
                    temporary.append(stmt)
                for piece in entry.long_data or ():
                    await send_long_data(tracking, backend, piece, stmt)
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
