"""The server's answers, in the slow lane: each piece of an answer the backend task reads is
streamed to the client, and a complete one completed (session and transaction state, variables
read back, plugins' results). The slow path of an answer is ``on_response_data`` ->
``after_feed`` -> ``complete``; the fast lane joins it where it stops being fast. In steady
state the fast lane carries the answers (``fastlane``) and the backend task (``backendtask``)
waits.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import trio

from proxy.backend import BackendError
from proxy.cycle.cycle import runs_ddl
from proxy.cycle.inflight import NOT_SENT, Inflight, SessionClosed
from proxy.hooks import CommandInfo, ResultInfo
from proxy.netio import PeerClosed
from proxy.protocol.constants import Err
from proxy.protocol.framing import encode_packet
from proxy.protocol.packets import ERR_HEADER, ErrPacket, ProtocolError, make_err, parse_err
from proxy.protocol.response import Expect, ResponseTracker
from proxy.protocol.resultset import Column
from proxy.sqltext.tokens import quote_ident

if TYPE_CHECKING:
    from proxy.relay.relay import Relay

__all__ = ["complete", "complete_after", "after_feed", "on_response_data", "idled_out", "closed_for_idling", "SERVER_GOING_AWAY", "KILLED"]

# Errors with which a server says "I am going away" in answer to a command it did not run.
KILLED = 1927  # ER_CONNECTION_KILLED: a shutdown, or an operator's KILL
SERVER_GOING_AWAY = frozenset({1053, KILLED})


def closed_for_idling(s: Relay, backend) -> float | None:
    """The session's wait_timeout (seconds) if the server closed it for idling: no command
    sent, no transaction, nothing owed to the client, idle for about its wait_timeout. Else
    None. (A command that arrived with the close waits unsent: ``commands.send_inflight``.)"""
    tracking, cycle = s.tracking, s.cycle
    inflight = cycle.inflight
    if (inflight is not None and inflight.state is not NOT_SENT) or cycle.first_answer is not None or tracking.state is None:
        return None
    if tracking.tx.active or tracking.pending is not None or tracking.xa is not None:
        return None
    return idled_out(s, backend, trio.current_time())


def idled_out(s: Relay, backend, now: float) -> float | None:
    """The session's wait_timeout (seconds) if it has been idle about that long at ``now`` (the
    server may close its connection for idling), else None."""
    return s.cycle.idled_out(backend.wait_timeout, now)


def kills(inflight: Inflight | None) -> bool:
    """Is the command in flight a KILL statement (its own connection's end is no loss)?"""
    return inflight is not None and inflight.analysis is not None and inflight.analysis.keywords(0, 1) == ("KILL",)


async def on_response_data(s: Relay, inflight: Inflight, data: bytes) -> None:
    try:
        end = inflight.tracker.feed(data)
    except ProtocolError as exc:
        raise s.parts.recovery.connection_error(s, f"protocol error in backend response: {exc}") from None
    await after_feed(s, inflight, data, end)


async def after_feed(s: Relay, inflight: Inflight, data: bytes, end: int) -> None:
    """``data`` was fed to the answer's tracker, which said it ends ``end`` bytes in (-1: not
    in ``data``): forward it, complete the answer, or hand a going-away server to recovery."""
    tracker = inflight.tracker
    if end < 0:
        if inflight.prepare_ok is not None:
            inflight.prepare_ok += data
            return
        if inflight.refuse_infile or inflight.internal:
            if inflight.captured is not None:
                inflight.captured += data
            return
        s.cycle.forward(inflight)
        s.record.answering(len(data))
        await s.client.send(data)
        return
    extra = data[end:]
    if extra:
        data = data[:end]
    error = tracker.error
    recovery = s.parts.recovery
    if error is not None and error.code in SERVER_GOING_AWAY and not inflight.forwarded:
        if kills(inflight):
            # The client killed its own connection (KILL CONNECTION_ID()): pass the answer
            # on and end the session, as the server does, instead of bringing it back.
            await complete(s, inflight, data)
            raise SessionClosed("the client killed its own backend connection")
        if error.code == KILLED and await recovery.killed_by_operator(s):
            # Not a shutdown: an operator's KILL. It is not undone by running the command
            # again; the client gets the server's error and the session ends, as direct.
            s.parts.target.stats.recovered("killed_1927", 0.0)
            await complete(s, inflight, data)
            raise SessionClosed(f"backend connection killed by an operator ({error})")
        # Rejected -- nothing ran -- only when the error is the first result: after an OK of
        # a multi-statement text, the statements before the error did run.
        await recovery.on_lost(s, f"backend answered {error}", rejected=tracker.results == 0)
        return
    if tracker.local_infile and not inflight.refuse_infile:
        await _refuse_local_infile(s, inflight)
        return
    await complete(s, inflight, data)
    if extra:
        await recovery.on_lost(s, f"backend sent {describe_unsolicited(extra)} after a response")


async def _refuse_local_infile(s: Relay, inflight: Inflight) -> None:
    """The server asked for a client file (LOAD DATA LOCAL). Send it an empty one; the
    client gets an ERR instead of the request."""
    backend = s.link.backend
    assert backend is not None
    seq = inflight.tracker.last_seq + 1
    inflight.refuse_infile = True
    inflight.tracker = ResponseTracker(Expect.SINGLE, s.deprecate_eof)
    await backend.channel.send(encode_packet(b"", seq)[0])


async def complete(s: Relay, inflight: Inflight, last: bytes) -> None:
    """The response is complete: update session and transaction state, then let the
    client have the rest of it."""
    captures = s.cycle.finish(inflight)
    if runs_ddl(inflight.analysis):
        s.parts.target.keys.clear()  # safe mode reads table keys again
    await complete_after(s, inflight, last, captures)


async def complete_after(s: Relay, inflight: Inflight, last: bytes, captures: list[str]) -> None:
    """``complete`` once the cycle has recorded what the command did (``CommandCycle.finish``)."""
    if captures:
        # Read the values back before the client hears "OK": a loss now is a loss with the
        # SET still in flight, and recovery simply sends it again.
        try:
            await _capture_variables(s, captures)
        except (PeerClosed, ProtocolError) as exc:
            await s.parts.recovery.on_lost(s, f"connection lost while reading back session variables: {exc}")
            return
    if inflight.internal:
        if inflight.captured is not None:
            inflight.captured += last
        out = b""
    elif inflight.refuse_infile:
        out = encode_packet(
            make_err(*Err.NOT_ALLOWED_COMMAND, "LOAD DATA LOCAL INFILE is not supported through replay-proxy"),
            inflight.command.seq_end + 1,
        )[0]
    elif inflight.prepare_ok is not None:
        inflight.prepare_ok += last
        out = _rewrite_prepare_ok(inflight)
    else:
        out = last
    cycle, record = s.cycle, s.record
    if not record.kept or inflight.internal:
        cycle.done(inflight)
        if s.link.move_requested and s.idle():
            s.start_move()
        if out:
            await s.client.send(out)
        inflight.wake()
    else:
        # The record's order: the state the client is about to hear of is the supervisor's
        # first; the next command waits until this answer is out (``inflight`` stays set).
        if record.changed(s.tracking):
            cycle.settle()
            await s.follow_state()
        if out:
            record.answering(len(out), s.tracking)  # its last bytes
            await s.client.send(out)
        cycle.done(inflight)
        record.idle(s.tracking)
        if s.link.move_requested and s.idle():
            s.start_move()
        inflight.wake()
    if s.result_hooks:
        await _tell_result(s, inflight)


async def _tell_result(s: Relay, inflight: Inflight) -> None:
    """The plugins' result hook, for a complete answer."""
    tracker = inflight.tracker
    error = tracker.error
    result = ResultInfo(
        ok=error is None,
        error_code=error.code if error else None,
        error_message=error.message if error else None,
        affected_rows=tracker.ok.affected_rows if tracker.ok else 0,
        rows=tracker.rows,
        bytes=tracker.nbytes,
        latency=trio.current_time() - inflight.arrived,
        in_transaction=s.tracking.tx.active,
    )
    command = inflight.command
    hooks, session_info = s.parts.hooks, s.parts.info
    info = CommandInfo.for_session(session_info, command.code, command.payload, command.complete)
    await hooks.notify(hooks.result_received, session_info, info, result)


def _rewrite_prepare_ok(inflight: Inflight) -> bytes:
    """The client sees the statement id the proxy gave it, not the backend's."""
    held = inflight.prepare_ok
    assert held is not None
    stmt = inflight.statement
    if stmt is not None and stmt.client_id != stmt.backend_id:
        held[5:9] = struct.pack("<I", stmt.client_id)  # frame header (4) + OK byte (1)
    return bytes(held)


async def _capture_variables(s: Relay, names: list[str]) -> None:
    """Read back the variables that were set from an expression (session ones by name, user
    ones as ``@name``), so a restore can set the values they took."""
    backend = s.link.backend
    assert backend is not None
    for name in names:
        user = name.startswith("@")
        # A string comes back converted to character_set_results: its own bytes come as HEX().
        expr = "@{0}, HEX(@{0}), CHARSET(@{0}), COLLATION(@{0})".format(quote_ident(name[1:])) if user else f"@@session.{name}"
        columns: list[Column] = []
        try:
            rows = await backend.query(f"SELECT {expr}", columns)
        except BackendError as exc:  # the server refused to tell: nothing to restore it from
            s.tracking.mark_unrestorable(f"could not read back {'user' if user else 'session'} variable {name}: {exc}")
            continue
        if len(rows) != 1 or len(columns) != len(rows[0]):
            s.tracking.mark_unrestorable(f"variable {name} read back as {len(rows)} row(s) of {len(columns)} column(s)")
        elif not user:
            s.tracking.captured(name, columns[0], rows[0][0])
        else:
            value, hexed, charset, collation = rows[0]
            s.tracking.captured_user(name[1:], columns[0], value, hexed, (charset or b"").decode(), (collation or b"").decode())


def unsolicited_err(data: bytes) -> ErrPacket | None:
    """The ERR packet a server sent on its own (a KILL, a shutdown), if ``data`` starts with one."""
    if len(data) > 5 and data[4] == ERR_HEADER:
        try:
            return parse_err(data[4 : 4 + (data[0] | data[1] << 8 | data[2] << 16)])
        except ProtocolError:
            return None
    return None


def describe_unsolicited(data: bytes) -> str:
    err = unsolicited_err(data)
    return str(err) if err is not None else f"{len(data)} unexpected byte(s)"
