"""The backend task of a session: it reads the backend socket all the time, streams each
response to the client, completes it (session and transaction state, plugins' results), and
notices a server closing the connection while the client is idle (FIN, reset, an unsolicited
ERR), so recovery replaces it before the client's next command: ``on_lost`` hands the loss to
``proxy.recovery.driver.recover`` and does what its decision says.

The hot path is ``backend_task`` -> ``on_response_data`` -> ``complete``.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import trio

from proxy.backend import BackendError
from proxy.handover.slot import flags_of
from proxy.hooks import CommandInfo, ResultInfo
from proxy.netio import PeerClosed, PeerFinished, WaitInterrupted
from proxy.protocol.constants import Err
from proxy.protocol.framing import encode_packet
from proxy.protocol.packets import ERR_HEADER, ErrPacket, ProtocolError, make_err, parse_err
from proxy.protocol.response import Expect, ResponseTracker
from proxy.protocol.resultset import Column
from proxy.recovery.driver import AnswerNext, AnswerNow, Fatal, recover
from proxy.recovery.kills import killed_by_operator
from proxy.recovery.loss import Loss, connection_error
from proxy.recovery.moves import Then
from proxy.relay.answers import Failed, LostTransaction
from proxy.relay.inflight import NOT_SENT, ConnectionFailed, Inflight, SessionClosed
from proxy.relay.link import LinkState
from proxy.sqltext import Kind
from proxy.sqltext.tokens import quote_ident

# Enum members read per response: globals, not EnumType's __getattr__ hook (CPython 3.11).
_LOST, _MOVING, _DDL = LinkState.LOST, LinkState.MOVING, Kind.DDL

if TYPE_CHECKING:
    from proxy.relay.relay import Relay

__all__ = ["backend_task", "complete", "on_lost"]


# Errors with which a server says "I am going away" in answer to a command it did not run.
KILLED = 1927  # ER_CONNECTION_KILLED: a shutdown, or an operator's KILL
SERVER_GOING_AWAY = frozenset({1053, KILLED})


async def backend_task(s: Relay, done: trio.Event) -> None:
    """The task, until the session ends or ``Session.stop_backend_task`` stops it (``done``)."""
    link = s.link
    try:
        if link.state is _LOST:
            # No connection to read: the server closed it for idling (in this process, or in the
            # old one of an upgrade, which moved the session without it). One at the next command.
            if not await s.command_queued():
                return  # stopped again: an upgrade takes the session
            await on_lost(s, s.unconnected_reason)
        while True:
            backend = link.backend
            assert backend is not None
            inflight = s.inflight
            try:
                # Nothing arrives between responses, nor before the server has worked on a
                # command: wait for readability first, except mid-response.
                if inflight is None:
                    s.parked = True  # an upgrade may stop the task here, and only here
                    interrupted = False
                    try:
                        data = await backend.channel.recv(wait_first=True)
                    except WaitInterrupted:
                        interrupted = True
                    finally:
                        s.unpark(interrupted)
                    if interrupted:
                        return
                else:
                    data = await backend.channel.recv(wait_first=inflight.tracker.nbytes == 0)
            except PeerClosed as exc:
                if link.backend is not backend or link.state is _MOVING:  # replaced on purpose (COM_CHANGE_USER, a move)
                    await link.replaced.wait()
                    continue
                if isinstance(exc, PeerFinished) and _kills(s.inflight) and s.inflight.state != NOT_SENT:
                    # The client's KILL closed its own connection, and TiDB sends nothing
                    # before the FIN: close the client's too, as the server did; the KILL is
                    # never sent again (a replay used to send it again and again).
                    raise SessionClosed("the client killed its own backend connection") from None
                cut = link.take_cut_reason()
                idled = None if cut is not None else _closed_for_idling(s, backend)
                if idled is not None:
                    # Reconnecting now would be closed again after as long, for as long as the
                    # client stays away: a new connection at its next command instead.
                    link.lost()
                    s.log.info("backend connection %d closed after %.0fs idle (the server's wait_timeout %gs): "
                               "a new one at the next command", backend.connection_id, trio.current_time() - s.last_activity, idled)  # fmt: skip
                    if not await s.command_queued():
                        return  # an upgrade takes the session, without a connection
                await on_lost(s, cut or str(exc), clean=cut is None and isinstance(exc, PeerFinished))
                continue
            inflight = s.inflight
            if inflight is None or inflight.state == NOT_SENT:
                if link.state is _MOVING:  # the old connection's last words: the move goes on
                    await link.replaced.wait()
                    continue
                err = _unsolicited_err(data)
                if err is not None and err.code == KILLED and await _killed_by_operator(s):
                    # An operator killed this session's connection: the client hears the
                    # server's error at its next command, and the session ends, as direct.
                    s.parts.target.stats.recovered("killed_1927", 0.0)
                    s.first_answer = Failed(make_err(err.code, err.sqlstate, err.message))
                    return
                await on_lost(s, f"backend sent {_describe_unsolicited(data)} while idle")
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
        s.first_answer = Failed(failed.payload)  # an idle client hears it at its next command
    finally:
        done.set()


def _closed_for_idling(s: Relay, backend) -> float | None:
    """The session's wait_timeout (seconds) if the server closed it for idling that long: no
    command sent, no transaction, nothing owed to the client, idle for about its wait_timeout.
    Else None. (A command that arrived with the close waits unsent: ``Session.send_inflight``.)"""
    tracking = s.tracking
    inflight = s.inflight
    if (inflight is not None and inflight.state is not NOT_SENT) or s.first_answer is not None or tracking.state is None:
        return None
    if tracking.tx.active or tracking.pending is not None or tracking.xa is not None:
        return None
    return idled_out(s, backend, trio.current_time())


def idled_out(s: Relay, backend, now: float) -> float | None:
    """The session's wait_timeout (seconds) if it has been idle about that long at ``now`` (the
    server may close its connection for idling), else None."""
    state = s.tracking.state
    wait = state.wait_timeout(backend.wait_timeout) if state is not None else backend.wait_timeout
    return wait if wait and now - s.last_activity >= wait - 1 else None


def _kills(inflight: Inflight | None) -> bool:
    """Is the command in flight a KILL statement (its own connection's end is no loss)?"""
    return inflight is not None and inflight.analysis is not None and inflight.analysis.keywords(0, 1) == ("KILL",)


async def _killed_by_operator(s: Relay) -> bool:
    return await killed_by_operator(s.link, s.parts.target, s.parts.config.backend.io_timeout, s.log, s.last_activity)


async def on_lost(s: Relay, reason: str, rejected: bool = False, clean: bool = False) -> None:
    """The backend connection is gone (or going): recovery (``proxy.recovery.driver.recover``)
    runs its steps and says what to do; this does it. ``rejected``: the server answered the
    command in flight with a going-away error, so it did not run it; ``clean``: the server
    closed the connection (a FIN), as after a KILL. Fatal outcomes raise ConnectionFailed."""
    first = s.first_answer
    owed = first if isinstance(first, LostTransaction) else None
    loss = Loss(s.parts, reason, s.inflight, s.deprecate_eof, rejected=rejected, clean=clean, owed=owed)
    while True:
        decision = await recover(loss, s)
        if isinstance(decision, Fatal):
            raise ConnectionFailed(decision.payload, decision.reason)
        if isinstance(decision, AnswerNow):  # recovery goes on unless it is the last
            await s.answer_inflight(decision.packet)
            if decision.last:
                return
        elif isinstance(decision, AnswerNext):
            s.first_answer = loss.owed = LostTransaction(decision.packet)
        else:
            waiting = decision.waiting
            if decision.then is Then.SEND:
                await s.send_inflight(waiting)
            elif decision.then is Then.COMPLETE:
                await complete(s, waiting, b"")
            elif decision.then is Then.ANSWER_OWED:
                answer, s.first_answer = s.first_answer, None
                await s.answer_inflight(answer.payload)
            return


async def on_response_data(s: Relay, inflight: Inflight, data: bytes) -> None:
    tracker = inflight.tracker
    try:
        end = tracker.feed(data)
    except ProtocolError as exc:
        raise connection_error(s.log, s.link, s.parts.target.stats, f"protocol error in backend response: {exc}") from None
    if end < 0:
        if inflight.prepare_ok is not None:
            inflight.prepare_ok += data
            return
        if inflight.refuse_infile or inflight.internal:
            if inflight.captured is not None:
                inflight.captured += data
            return
        inflight.forwarded = True
        slot = s.slot
        if slot is not None:
            slot.answering(len(data))
        sent = s.client.try_send(data)
        if sent < len(data):
            await s.client.send(data[sent:])
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
        if error.code == KILLED and await _killed_by_operator(s):
            # Not a shutdown: an operator's KILL. It is not undone by running the command
            # again; the client gets the server's error and the session ends, as direct.
            s.parts.target.stats.recovered("killed_1927", 0.0)
            await complete(s, inflight, data)
            raise SessionClosed(f"backend connection killed by an operator ({error})")
        # Rejected -- nothing ran -- only when the error is the first result: after an OK of
        # a multi-statement text, the statements before the error did run.
        await on_lost(s, f"backend answered {error}", rejected=tracker.results == 0)
        return
    if tracker.local_infile and not inflight.refuse_infile:
        await _refuse_local_infile(s, inflight)
        return
    await complete(s, inflight, data)
    if extra:
        await on_lost(s, f"backend sent {_describe_unsolicited(extra)} after a response")


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
    tracker = inflight.tracker
    captures = s.tracking.completed(inflight)
    a = inflight.analysis
    if a is not None and (a.statements[0].kind is _DDL if len(a.statements) == 1 else any(st.kind is _DDL for st in a.statements)):
        s.parts.target.keys.clear()  # safe mode reads table keys again
    if captures:
        # Read the values back before the client hears "OK": a loss now is a loss with the
        # SET still in flight, and recovery simply sends it again.
        try:
            await _capture_variables(s, captures)
        except (PeerClosed, ProtocolError) as exc:
            await on_lost(s, f"connection lost while reading back session variables: {exc}")
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
    s.link.completed()
    s.last_activity = s.now()
    command = inflight.command
    if command.spool is not None:  # (its release, without the call for the usual command kept in memory)
        command.release()
    slot = s.slot
    if slot is None or inflight.internal:
        s.inflight = None
        if s.link.move_requested and s.idle():
            s.start_move()
        if out:
            sent = s.client.try_send(out)
            if sent < len(out):
                await s.client.send(out[sent:])
    else:
        # The record's order: the state the client is about to hear of is the supervisor's
        # first; the next command waits until this answer is out (``inflight`` stays set).
        if s.tracking.changed:
            s.settled = s.commands
            await s.mirror_state()
        flags = flags_of(s.tracking)
        if out:
            slot.answering(len(out), flags)  # its last bytes
            await s.client.send(out)
        s.inflight = None
        slot.idle(flags)
        if s.link.move_requested and s.idle():
            s.start_move()
    if inflight.done is not None:
        inflight.done.set()
    if s.result_hooks:
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
