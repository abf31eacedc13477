"""The backend task of a session: it reads the backend socket all the time, streams each
response to the client, completes it (session and transaction state, plugins' results), and
notices a server closing the connection while the client is idle (FIN, reset, an unsolicited
ERR), so recovery (``reconnect.recover``) replaces it before the client's next command.

The hot path is ``backend_task`` -> ``on_response_data`` -> ``complete``.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import trio

from proxy.hooks import CommandInfo, ResultInfo
from proxy.netio import PeerClosed, PeerFinished
from proxy.protocol.constants import Err
from proxy.protocol.framing import encode_packet
from proxy.protocol.packets import ERR_HEADER, ErrPacket, ProtocolError, make_err, parse_err
from proxy.protocol.response import Expect, ResponseTracker
from proxy.relay import reconnect
from proxy.relay.inflight import NOT_SENT, ConnectionFailed, Inflight, SessionClosed
from proxy.relay.kills import killed_by_operator
from proxy.sqltext import Kind

if TYPE_CHECKING:
    from proxy.relay.tasks import Session

__all__ = ["backend_task", "complete", "recover"]

# Errors with which a server says "I am going away" in answer to a command it did not run.
KILLED = 1927  # ER_CONNECTION_KILLED: a shutdown, or an operator's KILL
SERVER_GOING_AWAY = frozenset({1053, KILLED})


async def backend_task(s: Session) -> None:
    try:
        while True:
            backend = s.backend
            assert backend is not None
            inflight = s.inflight
            try:
                # Nothing arrives between responses, nor before the server has worked on a
                # command: wait for readability first, except mid-response.
                data = await backend.channel.recv(wait_first=inflight is None or inflight.tracker.nbytes == 0)
            except PeerClosed as exc:
                if s.backend is not backend or s.migrating:  # replaced on purpose (COM_CHANGE_USER, a move)
                    await s.backend_replaced.wait()
                    continue
                if isinstance(exc, PeerFinished) and _kills(s.inflight) and s.inflight.state != NOT_SENT:
                    # The client's KILL closed its own connection, and TiDB sends nothing
                    # before the FIN: close the client's too, as the server did; the KILL is
                    # never sent again (a replay used to send it again and again).
                    raise SessionClosed("the client killed its own backend connection")
                await recover(s, str(exc), clean=isinstance(exc, PeerFinished))
                continue
            inflight = s.inflight
            if inflight is None or inflight.state == NOT_SENT:
                err = _unsolicited_err(data)
                if err is not None and err.code == KILLED and await killed_by_operator(s):
                    # An operator killed this session's connection: the client hears the
                    # server's error at its next command, and the session ends, as direct.
                    s.target.stats.recovered("killed_1927", 0.0)
                    s.failed = make_err(err.code, err.sqlstate, err.message)
                    return
                await recover(s, f"backend sent {_describe_unsolicited(data)} while idle")
                continue
            await on_response_data(s, inflight, data)
    except ConnectionFailed as failed:
        inflight = s.inflight
        if inflight is not None and inflight.forwarded:
            # Part of the answer reached the client, maybe part of a packet: an ERR now
            # would be read as the rest of a row. Closing is the only clear signal.
            raise SessionClosed(f"{failed} (client connection closed mid-response)") from None
        if inflight is not None:
            await s.answer_inflight(failed.payload)
            raise SessionClosed(str(failed)) from None
        s.failed = failed.payload  # an idle client hears it at its next command

def _kills(inflight: Inflight | None) -> bool:
    """Is the command in flight a KILL statement (its own connection's end is no loss)?"""
    return inflight is not None and inflight.analysis is not None and inflight.analysis.keywords(0, 1) == ("KILL",)


async def recover(s: Session, reason: str, rejected: bool = False, clean: bool = False) -> None:
    resend = await reconnect.recover(s, reason, rejected, clean)
    if resend is not None:
        await s.send_inflight(resend)

async def on_response_data(s: Session, inflight: Inflight, data: bytes) -> None:
    tracker = inflight.tracker
    try:
        end = tracker.feed(data)
    except ProtocolError as exc:
        raise reconnect.failure(s, f"protocol error in backend response: {exc}") from None
    if end < 0:
        if inflight.held is not None or inflight.refuse_infile or inflight.internal:
            if inflight.held is not None:
                inflight.held += data
            return
        inflight.forwarded = True
        await s.client.send(data)
        return
    extra = data[end:]
    if extra:
        data = data[:end]
    error = tracker.error
    if error is not None and error.code in SERVER_GOING_AWAY and not inflight.forwarded:
        if _kills(inflight):
            # The client killed its own connection (KILL CONNECTION_ID()): pass the answer
            # on and end the session, as the server does, instead of bringing it back.
            await complete(s, inflight, data)
            raise SessionClosed("the client killed its own backend connection")
        if error.code == KILLED and await killed_by_operator(s):
            # Not a shutdown: an operator's KILL. It is not undone by running the command
            # again; the client gets the server's error and the session ends, as direct.
            s.target.stats.recovered("killed_1927", 0.0)
            await complete(s, inflight, data)
            raise SessionClosed(f"backend connection killed by an operator ({error})")
        # Rejected -- nothing ran -- only when the error is the first result: after an OK of
        # a multi-statement text, the statements before the error did run.
        await recover(s, f"backend answered {error}", rejected=tracker.results == 0)
        return
    if tracker.local_infile and not inflight.refuse_infile:
        await _refuse_local_infile(s, inflight)
        return
    await complete(s, inflight, data)
    if extra:
        await recover(s, f"backend sent {_describe_unsolicited(extra)} after a response")

async def _refuse_local_infile(s: Session, inflight: Inflight) -> None:
    """The server asked for a client file (LOAD DATA LOCAL). Send it an empty one; the
    client gets an ERR instead of the request."""
    assert s.backend is not None
    seq = inflight.tracker.last_seq + 1
    inflight.refuse_infile = True
    inflight.tracker = ResponseTracker(Expect.SINGLE, s.deprecate_eof)
    await s.backend.channel.send(encode_packet(b"", seq)[0])

async def complete(s: Session, inflight: Inflight, last: bytes) -> None:
    """The response is complete: update session and transaction state, then let the
    client have the rest of it."""
    tracker = inflight.tracker
    captures = s.tracking.completed(inflight)
    if inflight.analysis is not None and any(st.kind is Kind.DDL for st in inflight.analysis.statements):
        s.target.keys.clear()  # safe mode reads table keys again
    if captures:
        # Read the values back before the client hears "OK": a loss now is a loss with the
        # SET still in flight, and recovery simply sends it again.
        try:
            await _capture_variables(s, captures)
        except (PeerClosed, ProtocolError) as exc:
            await recover(s, f"connection lost while reading back session variables: {exc}")
            return
    if inflight.internal:
        if inflight.held is not None:
            inflight.held += last
        out = b""
    elif inflight.refuse_infile:
        out = encode_packet(
            make_err(*Err.NOT_ALLOWED_COMMAND, "LOAD DATA LOCAL INFILE is not supported through replay-proxy"),
            inflight.command.seq_end + 1,
        )[0]
    elif inflight.held is not None:
        inflight.held += last
        out = _rewrite_prepare_ok(inflight)
    else:
        out = last
    s.inflight = None
    s.losses_in_a_row = 0
    s.last_activity = trio.current_time()
    inflight.command.release()
    if s.move_requested and s.idle():
        s.target.spawn(reconnect.migrate, s)
    if out:
        await s.client.send(out)
    if inflight.done is not None:
        inflight.done.set()
    if s._result_hooks:
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
        info = CommandInfo.for_session(s.info, command.code, command.payload, command.complete)
        await s.hooks.notify(s.hooks.result_received, s.info, info, result)

def _rewrite_prepare_ok(inflight: Inflight) -> bytes:
    """The client sees the statement id the proxy gave it, not the backend's."""
    held = inflight.held
    assert held is not None
    stmt = inflight.statement
    if stmt is not None and stmt.client_id != stmt.backend_id:
        held[5:9] = struct.pack("<I", stmt.client_id)  # frame header (4) + OK byte (1)
    return bytes(held)

async def _capture_variables(s: Session, names: list[str]) -> None:
    """Read back session variables that were set from an expression, so a restore can set
    the value its."""
    from proxy.backend import BackendError

    assert s.backend is not None
    for name in names:
        try:
            rows = await s.backend.query(f"SELECT @@session.{name}")
        except BackendError as exc:  # the server refused to tell: nothing to restore it from
            s.tracking.mark_unrestorable(f"could not read back session variable {name}: {exc}")
            continue
        s.tracking.captured(name, rows[0][0] if rows else None)



def _unsolicited_err(data: bytes) -> ErrPacket | None:
    """The ERR packet a server sent on its own (a KILL, a shutdown), if ``data`` starts with one."""
    if len(data) > 5 and data[4] == ERR_HEADER:
        try:
            return parse_err(data[4 : 4 + (data[0] | data[1] << 8 | data[2] << 16)])
        except ProtocolError:
            return None
    return None


def _describe_unsolicited(data: bytes) -> str:
    err = _unsolicited_err(data)
    return str(err) if err is not None else f"{len(data)} unexpected byte(s)"
