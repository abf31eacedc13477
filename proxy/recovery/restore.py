"""A new backend connection that looks like the old session: reconnect (with backoff) after a
loss (``reestablish``), or between transactions off a draining server (``move``); either way
``restore`` gives it the session's variables, LAST_INSERT_ID() and prepared statements.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import attrs
import trio

from proxy.backend import Backend, BackendError, backoff_delays
from proxy.cycle.inflight import Inflight
from proxy.netio import PeerClosed
from proxy.protocol.framing import encode_packet
from proxy.protocol.packets import ProtocolError
from proxy.protocol.response import Expect
from proxy.recovery.kills import kill_if_alive
from proxy.recovery.loss import failure
from proxy.recovery.proofs import last_insert_id
from proxy.relay.link import LinkState
from proxy.session.state import PreparedStatement, SessionState
from proxy.sessionlog import outcome

if TYPE_CHECKING:
    from proxy.recovery.loss import Loss, SessionParts, Slots
    from proxy.session.tracker import SessionTracker

__all__ = ["Waited", "reestablish", "restore", "prepare_on", "send_long_data", "move"]


@attrs.frozen
class Waited:
    """The waiting command's buffer window passed while the backend stayed away."""

    inflight: Inflight
    why: str


async def reestablish(loss: Loss, slots: Slots) -> Backend | Waited:
    """Reconnect (with backoff) and restore the session on the new connection. When the buffer
    window of the command waiting now (``slots.inflight``: it may arrive meanwhile) passes
    first, ``Waited``: the client is answered, then the session reestablishes again."""
    p = loss.parts
    rec, tracking, link = p.config.recovery, p.tracking, p.link
    tx = tracking.tx
    state = tx.session_before if (tx.active and tx.session_before) else tracking.state
    assert state is not None and link.login is not None
    delays = backoff_delays(rec.backoff_initial, rec.backoff_max)
    attempts = 0
    error: BackendError | None = None
    while True:
        inflight = slots.inflight
        window = loss.window if inflight is loss.inflight else rec.buffer_window
        if inflight is not None and trio.current_time() - inflight.arrived >= window:
            return Waited(inflight, f"backend unavailable for {window:g}s (last error: {error or 'replay failed'})")
        attempts += 1
        login = attrs.evolve(link.login, database=state.database, collation=state.collation)
        backend = None
        try:
            backend = await p.target.connect(login)
            link.replace(backend)
            with trio.fail_after(p.config.backend.io_timeout):  # a server that accepts, then stalls
                await restore(p, backend, state, loss.old)
            return backend
        except BackendError as exc:
            if not exc.retryable:
                raise failure(p, f"cannot restore the session: {exc}") from None
            error = exc
        except (PeerClosed, ProtocolError, OSError) as exc:
            error = BackendError(str(exc), retryable=True)
        except trio.TooSlowError:
            error = BackendError(f"restoring the session took longer than {p.config.backend.io_timeout:g}s", retryable=True)
        if backend is not None:
            backend.close()
        if attempts == 1 or attempts % 20 == 0:
            p.log.warning("reconnect attempt %d failed: %s", attempts, error)
        await trio.sleep(next(delays))


async def restore(parts: SessionParts, backend: Backend, state: SessionState, old: Backend | None) -> None:
    """Make the new connection look like the old session: variables, LAST_INSERT_ID(),
    prepared statements; and free the old session's locks if it may still be alive."""
    if old is not None and parts.config.recovery.kill_old_session:
        await kill_if_alive(backend, old, parts.log)
    for statement in state.restore_statements():
        await backend.query(statement)
    insert_id = await last_insert_id(backend, state, parts.target.keys)
    if insert_id is None:
        parts.log.warning(
            "LAST_INSERT_ID() cannot be restored (set by an expression, an INSERT the proxy cannot follow, "
            "or a statement the worker that died ran after its last copy of the session)"
        )
    elif insert_id:
        await backend.query(f"DO LAST_INSERT_ID({int(insert_id)})")
    for stmt in list(parts.tracking.prepared.values()):
        await prepare_on(parts.tracking, backend, stmt)


async def prepare_on(tracking: SessionTracker, backend: Backend, stmt: PreparedStatement) -> None:
    tracker = await backend.exchange(encode_packet(stmt.prepare_payload, 0)[0], Expect.PREPARE)
    if tracker.error is not None or tracker.prepare_ok is None:
        raise BackendError(f"re-preparing statement {stmt.client_id} failed: {tracker.error}", retryable=False)
    tracking.reprepared(stmt, tracker.prepare_ok.statement_id)
    for piece in stmt.long_data:
        await send_long_data(tracking, backend, piece, stmt)


async def send_long_data(tracking: SessionTracker, backend: Backend, piece, stmt: PreparedStatement) -> None:
    """A kept COM_STMT_SEND_LONG_DATA, again, exactly (from the session's spool)."""
    for chunk in tracking.long_data_frames(piece, stmt):
        await backend.channel.send(chunk)


_ASK_OLD_TIMEOUT = 2.0  # seconds: an idle server answers at once, and the move waits meanwhile


class Reader(Protocol):
    """The session's backend task (``proxy.relay.backendtask.BackendTask``), which reads its
    backend connection: stopped where it waits between answers, and started again."""

    async def stop(self) -> bool: ...

    def start(self) -> None: ...


async def move(parts: SessionParts, reader: Reader) -> bool:
    """Replace a draining connection between transactions: a fresh connection (elsewhere when
    another address is usable), the session restored on it, the old one closed politely.
    Nothing is replayed or held; a command that arrives meanwhile waits for the new connection.
    False: the move failed, and the session stays where it was (recovery handles the old
    connection's end)."""
    old = parts.link.begin_move()  # a command arriving meanwhile runs on the new one
    stopped = await _insert_id_from(parts, old, reader)
    try:
        return await _move_from(parts, old)
    finally:
        if stopped and parts.link.state is not LinkState.CLOSED:  # (the session may have ended meanwhile)
            reader.start()  # on the new connection, or the old one if the move failed


async def _insert_id_from(parts: SessionParts, old: Backend | None, reader: Reader) -> bool:
    """Where the session's own record of LAST_INSERT_ID() is unsure (INSERTs whose OK carried
    an id the statement may have given, more of them than it keeps: DM's), the old connection,
    alive and idle, says it. Its backend task is stopped meanwhile (True: start it again)."""
    state = parts.tracking.state
    if old is None or state is None or not (state.insert_ids or state.insert_id_unknown):
        return False
    health = parts.target.health_of(old.address)
    if health.state == "down" or health.silent_since is not None:
        return False  # it answers no health check (a partition): the move must not wait on it
    if not await reader.stop():
        return False  # busy (the old connection's last words, a loss): the record's own reading
    try:
        with trio.fail_after(min(parts.config.backend.io_timeout, _ASK_OLD_TIMEOUT)):
            rows = await old.query("SELECT LAST_INSERT_ID()")
        parts.tracking.insert_id_read(int(rows[0][0] or b"0"))
    except (BackendError, PeerClosed, ProtocolError, OSError, trio.TooSlowError, ValueError, IndexError) as exc:
        parts.log.info("could not read LAST_INSERT_ID() on the old connection before the move: %s", exc)
    return True


async def _move_from(parts: SessionParts, old: Backend | None) -> bool:
    link, tracking = parts.link, parts.tracking
    state = tracking.state
    started = trio.current_time()
    backend = None
    ids = tracking.backend_ids()
    try:
        login = attrs.evolve(link.login, database=state.database, collation=state.collation)
        with trio.fail_after(parts.config.backend.io_timeout):
            backend = await parts.target.connect(login, old.address if old is not None else None)
            link.replace(backend)
            await restore(parts, backend, state, None)
    except (BackendError, PeerClosed, ProtocolError, OSError, trio.TooSlowError) as exc:
        parts.log.warning("could not move off draining backend %s: %s", old.address if old else "-", exc, **outcome("move_failed"))
        if backend is not None:
            backend.close()
        link.move_failed(old, ids)  # the statements' ids on the old connection still hold
        return False
    link.moved(old)
    moved_ms = round((trio.current_time() - started) * 1000)
    parts.log.info(
        "moved from %s to %s (connection %d) in %d ms, between transactions",
        old.address if old else "-",
        backend.address,
        backend.connection_id,
        moved_ms,
        **outcome("moved", waited_ms=moved_ms),
    )
    return True
