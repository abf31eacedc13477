"""The client's side of a session, in the slow lane: the client task reads a command, lets the
plugins look at it, judges it and sends it (``submit``); and the ways the relay answers the
client itself. The fast lane (``fastlane``) carries the commands that need none of this (a
COMMIT's commit marker included); the task wakes for the rest, and for everything that waits (a
split statement, COM_CHANGE_USER, a hand-over, a COMMIT whose marker did not simply succeed). A
plain function of the session each: ``Session`` takes ``send_client`` and the others as its
methods.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from proxy.cycle.cycle import JUDGE_ASIDE, rewritten
from proxy.cycle.inflight import SEND_FAILED, SENT, Inflight, SessionClosed, for_payload
from proxy.hooks import CommandInfo
from proxy.netio import PeerClosed, WaitInterrupted
from proxy.protocol.constants import MAX_FRAME, Commands, Err
from proxy.protocol.framing import encode_packet
from proxy.protocol.packets import make_err, make_ok
from proxy.protocol.response import ResponseTracker
from proxy.relay import login, oversize, responses
from proxy.relay.kill import translate_kill
from proxy.relay.reading import judged_whole, read_command
from proxy.relay.verdicts import run_command_hooks
from proxy.session.intake import Command, Oversized, whole_command
from proxy.session.texts import needs_last_results
from proxy.sessionlog import outcome
from proxy.sqltext import Kind

if TYPE_CHECKING:
    from proxy.relay.fastlane import Job
    from proxy.relay.relay import Relay

__all__ = ["client_task", "send_client", "answer_error", "answer_inflight", "send_inflight", "run_internal", "follow_state",
           "commit_after_marker"]  # fmt: skip

log = logging.getLogger("replay_proxy.session")

C = Commands
_STMT_COMMANDS = frozenset({C.COM_STMT_EXECUTE, C.COM_STMT_SEND_LONG_DATA, C.COM_STMT_CLOSE, C.COM_STMT_RESET, C.COM_STMT_FETCH})
# Commands a proxy in front of a replicator's target has no business relaying.
REFUSED_COMMANDS = frozenset(
    {
        C.COM_BINLOG_DUMP,
        C.COM_BINLOG_DUMP_GTID,
        C.COM_REGISTER_SLAVE,
        C.COM_TABLE_DUMP,
        C.COM_CONNECT_OUT,
        C.COM_SHUTDOWN,
        C.COM_SLEEP,
        C.COM_CONNECT,
        C.COM_TIME,
        C.COM_DELAYED_INSERT,
        C.COM_DAEMON,
    }
)


async def client_task(s: Relay, both: trio.CancelScope) -> None:
    """Read and run the client's commands until it goes; then end both tasks (``both``)."""
    cycle, record = s.cycle, s.record
    try:
        while True:
            if cycle.inflight is None:  # answered here (an error, a first answer): idle again
                record.between_commands(s.tracking)
            cmd = await _read_command(s)
            if cmd is None:
                s.ends("client closed the connection")
                return
            if cmd.code == C.COM_QUIT:
                s.ends("client quit")
                return
            cycle.arrived()
            if cycle.inflight is not None:
                await _wait_inflight(s)
            record.read(cmd.wire_size, cycle.commands)
            reply = cycle.owed_reply(cmd, s.deprecate_eof)
            if reply is not None:
                record.answering(len(reply.frames), s.tracking)
                await s.client.send(reply.frames)
                if reply.close is not None:
                    raise SessionClosed(reply.close)
                continue
            code = cmd.code
            if code in REFUSED_COMMANDS:
                await s.answer_error(cmd, *Err.UNKNOWN_COM, f"{CommandInfo(code, b'').name} is not supported through replay-proxy")
                continue
            if code == C.COM_CHANGE_USER:
                with s.exchange():  # what it writes before its last answer is not an answer
                    await login.change_user(s, cmd)
                record.rebase(s.client)  # its exchange read more of the client's stream than the command
                continue
            if s.command_hooks:
                cmd = await run_command_hooks(s, cmd)
                if cmd is None:
                    continue
            if cmd.size > s.link.largest:  # kept whole because split mode may cut it into pieces
                await oversize.split(s, cmd)
                continue
            await submit(s, cmd)
    finally:
        both.cancel()


async def _read_command(s: Relay) -> Command | None:
    config = s.parts.config
    limits = config.limits
    max_size = s.link.largest  # like the server
    keep = max(max_size, limits.split_max_statement) if limits.oversized == "split" else max_size
    idle_timeout = config.listen.idle_timeout
    while True:
        client = s.client
        if s.mover is not None and not client.decoder.buffered():
            await _hand_over(s)
        try:
            data = None if client.decoder.buffered() else await _next_data(s, idle_timeout)
            if data is not None and type(data) is not bytes:
                await data()
                continue
            cmd = whole_command(data, max_size, limits.spool_threshold) if data is not None else None
            if cmd is None:
                if data is not None:
                    client.decoder.feed(data)
                cmd = await read_command(client, max_size, limits.spool_threshold, keep)
        except PeerClosed:
            return None
        except WaitInterrupted:  # an upgrade takes the session, between two commands
            await _hand_over(s)
            continue
        if isinstance(cmd, Oversized):
            await oversize.refuse(s, cmd.size, cmd.seq_end, cmd.code)
            s.record.rebase(client)
            continue
        if not cmd.payload:
            raise SessionClosed("client sent an empty command packet")
        if (cmd.seq_end - cmd.size // MAX_FRAME) & 0xFF != 0:
            # A command starts at sequence id 0. MariaDB answers 1156; TiDB closes without a
            # word, which recovery took for a server gone and sent the command again, and
            # again, for the whole buffer window. Refuse it here, as MariaDB does.
            await s.answer_error(cmd, *Err.PACKETS_OUT_OF_ORDER, "Got packets out of order")
            raise SessionClosed("client sent a command out of sequence")
        return cmd


async def _next_data(s: Relay, idle_timeout: float) -> bytes | Job | None:
    """The client's next bytes, nothing of them read before (None: they are in the client's
    decoder): from the fast lane, which carries the commands it can and leaves this task the
    rest (or a job: the rest of a send it began), or from the socket. listen.idle_timeout: a session that sends nothing for that long
    while no command of its own runs is closed (like the server's wait_timeout, but the proxy's)."""
    lane, client, cycle = s.lane, s.client, s.cycle
    if not idle_timeout:
        return await lane.client_data() if lane is not None else await client.recv(wait_first=True)
    while True:
        since = cycle.last_activity
        with trio.move_on_at((since if cycle.inflight is None else s.now()) + idle_timeout):
            if lane is not None:
                return await lane.client_data()
            await client.wait_data()
            return None
        if cycle.inflight is None and cycle.last_activity == since and not (lane is not None and lane.pending()):
            raise SessionClosed(f"idle for {idle_timeout:g}s (listen.idle_timeout)")


async def _hand_over(s: Relay) -> None:
    """An upgrade asked for this session (``proxy.handover.sessions``): if it can move now,
    hand it over and end here (SessionClosed); otherwise go on."""
    mover = s.mover
    if mover is not None and await mover.move(s):
        raise SessionClosed(f"moved to pid {mover.new_pid} (upgrade)")


async def _wait_inflight(s: Relay) -> None:
    """The client sent a command before the answer to the last one was complete: it waits."""
    inflight = s.cycle.inflight
    if inflight is not None:
        done = trio.Event()
        inflight.waiter = done.set  # its answer is the backend task's now (the fast lane leaves it)
        await done.wait()


async def submit(s: Relay, cmd: Command) -> None:
    """Judge the client's command and send it (or leave it to recovery while the link is not up)."""
    code = cmd.code
    tracking, link, cycle = s.tracking, s.link, s.cycle
    statement = None
    if code in _STMT_COMMANDS:
        statement = tracking.statement_of(cmd.payload)
        if statement is not None and statement.long_data_refused is not None and code == C.COM_STMT_EXECUTE:
            await oversize.refuse_long_data(s, cmd, statement)
            return
    if (
        link.owes_results
        and link.up_or_moving
        and link.takes_results_debt(code)
        and await judged_whole(cmd, lambda payload: needs_last_results(tracking.reading, payload, statement))
    ):  # mid-recovery, the recovery's finish asks instead
        msg = (
            "Lost connection to backend during query (replay-proxy: the backend connection was replaced; "
            "the previous statement's results, such as FOUND_ROWS() and warnings, are gone)"
        )
        s.log.warning("%s; the client gets 1158 and the session ends", msg, **outcome("refused_1158", Err.CONNECTION_LOST[0]))
        await s.answer_error(cmd, *Err.CONNECTION_LOST, msg)
        raise SessionClosed(msg)
    if code != C.COM_QUERY:
        verb, analysis = None, None
    elif cmd.size < JUDGE_ASIDE:
        verb, analysis = tracking.triage(cmd.payload)
    else:  # seconds for megabytes: in a thread, so that the other sessions go on meanwhile
        verb, analysis = await trio.to_thread.run_sync(tracking.triage, cmd.payload)
    # A marker only for a transaction that wrote: a read-only one (START TRANSACTION READ
    # ONLY) would refuse it, and replaying reads is always safe. A COMMIT prepared and
    # executed (mysql-connector's prepared cursor) is judged by its statement's text.
    commits_writes = cycle.commits_writes(cmd, statement, analysis)
    if commits_writes and cycle.markers_on and not await _write_commit_marker(s, cmd):
        return
    inflight = cycle.start(cmd, statement, verb, analysis, s.deprecate_eof, commits_writes)
    if code == C.COM_STMT_PREPARE:
        inflight.prepare_ok = bytearray()
    elif code == C.COM_STMT_SEND_LONG_DATA and statement is not None:
        inflight.piece = tracking.long_data_received(statement, cmd, link.limit)
        if inflight.piece is None:
            return  # kept from the server; the execute that would use it gets 1153
    elif analysis is not None and rewritten(cmd, analysis):
        if analysis.first.kind is Kind.SELECT:
            cmd = inflight.command = oversize.tell_effective_limit(cmd, link.limit, link.backend)
        else:
            cmd = inflight.command = await translate_kill(s, cmd)
    if cycle.dispatch(inflight):
        await send_inflight(s, inflight)
    else:
        s.backend_task.command_waits()


async def _write_commit_marker(s: Relay, commit: Command) -> bool:
    """Upsert this session's marker row inside the transaction about to commit, so that a
    lost COMMIT answer can be resolved exactly. False: the client was already answered."""
    markers = s.parts.markers
    assert markers is not None
    number, payload = markers.upsert_sql()
    s.record.marker(number)
    tracker = await run_internal(s, payload, commit.seq_end)
    if tracker is None or await _marker_refused(s, tracker, commit.seq_end):
        return False
    markers.written = number
    s.cycle.marker_written(number)
    return True


async def commit_after_marker(s: Relay, commit: Inflight, marker: Inflight, number: int) -> None:
    """The fast lane sent the marker of ``commit`` (``fastlane.FastLane._marker_first``) and
    left the rest to the client task: once the marker is settled, as ``submit`` goes on."""
    if marker.answered or await _marker_refused(s, marker.tracker, commit.command.seq_end):
        return
    assert s.parts.markers is not None
    s.parts.markers.written = commit.marker = number
    if s.cycle.dispatch(commit):
        await send_inflight(s, commit)
    else:
        s.backend_task.command_waits()


async def _marker_refused(s: Relay, tracker: ResponseTracker, seq_end: int) -> bool:
    """The server refused the commit marker: the client's COMMIT gets its error (True)."""
    err = tracker.error
    if err is None:
        return False
    # The transaction may be gone (a deadlock victim is rolled back) or stuck: the client's
    # COMMIT gets this error, and is not sent. An OK now could be a lie.
    s.log.warning("commit marker not written (%s); the COMMIT gets this error and is not sent", err, **outcome("marker_failed", err.code))
    await send_client(s, make_err(err.code, err.sqlstate, err.message), seq_end + 1)
    return True


async def run_internal(s: Relay, payload: bytes, seq_end: int, capture: bytearray | None = None) -> ResponseTracker | None:
    """Client task only: run a command of the proxy's own on the backend and wait for its
    whole response (not forwarded; kept in ``capture`` if given). None when recovery
    answered the client with an error instead, and the caller must stop."""
    inflight = for_payload(payload, s.tracking, s.deprecate_eof, s.now(), seq_end, internal=True)
    inflight.captured = capture
    done = trio.Event()
    inflight.waiter = done.set
    if s.cycle.dispatch(inflight):
        await send_inflight(s, inflight)
    else:
        s.backend_task.command_waits()
    await done.wait()
    return None if inflight.answered else inflight.tracker


async def send_inflight(s: Relay, inflight: Inflight) -> None:
    """Send (or resend) the in-flight command to the current backend."""
    link, cycle = s.link, s.cycle
    backend = link.backend
    assert backend is not None
    cmd = inflight.command
    # After an idle spell as long as the server's wait_timeout, its close may be waiting
    # unread too: a command sent into it would look lost in flight.
    look = inflight.look_first or responses.idled_out(s, backend, inflight.arrived) is not None
    if look and backend.channel.data_pending() and not await _still_up(s, backend):
        return  # the server closed before this command left: recovery sends it, as not run
    if s.record.changed(s.tracking):
        await follow_state(s)
        if not (link.up and link.backend is backend):
            return  # lost meanwhile: recovery sends it
    s.record.sent()
    cycle.resend(inflight)
    cycle.sending(inflight)
    link.sending()
    try:
        if cmd.complete:
            data = s.tracking.backend_bytes(cmd.payload, cmd.raw, inflight.statement)
            await backend.channel.send(data)
        else:  # spooled: streamed from its file, its statement id renumbered on the way
            for chunk in s.tracking.backend_frames(cmd, inflight.statement):
                await backend.channel.send(chunk)
        cycle.sent(inflight)
    except (PeerClosed, trio.ClosedResourceError):
        inflight.state = SEND_FAILED  # the backend task notices the loss and recovers
    finally:
        link.sent()
    if inflight.state is SENT and inflight.tracker.done:  # no response expected
        await responses.complete(s, inflight, b"")


async def _still_up(s: Relay, backend) -> bool:
    """The server spoke (or closed) while the session was idle, and the backend task has not
    read it yet: let it. Sending now would make a close the server made before it ever saw
    the command look like one in the middle of it (a 1158 for a COMMIT or a write)."""
    link = s.link
    with trio.move_on_after(s.parts.config.backend.io_timeout):
        while link.up and link.backend is backend and backend.channel.data_pending():
            await trio.sleep(0.001)
    return link.up and link.backend is backend


async def follow_state(s: Relay) -> None:
    """The copy of the state kept for a takeover follows a change, before the client hears of
    it or a command runs on a new backend connection (``--workers N``)."""
    if s.record.changed(s.tracking):
        await s.record.follow(s)


# ------------------------------------------------------------------ answering in the server's place


async def send_client(s: Relay, payload: bytes, seq: int) -> None:
    """One packet to the client: a whole answer (or, in COM_CHANGE_USER's exchange, part of one)."""
    frame = encode_packet(payload, seq)[0]
    s.record.answering(len(frame), None if s.exchanging else s.tracking)
    await s.client.send(frame)


async def answer_error(s: Relay, cmd: Command, code: int, sqlstate: str, message: str) -> None:
    await send_client(s, make_err(code, sqlstate, message), cmd.seq_end + 1)


async def answer_inflight(s: Relay, err: bytes | None) -> None:
    """Answer the in-flight command in the server's place: with ``err``, or OK (a COMMIT that
    a commit marker proved committed)."""
    cycle = s.cycle
    inflight = cycle.inflight
    assert inflight is not None
    payload = err if err is not None else make_ok(s.tracking.status_word())
    if not s.record.kept or inflight.internal:  # (an internal one's client task settles the record)
        cycle.answered(inflight)
        try:
            await send_client(s, payload, inflight.answer_seq())
        finally:
            inflight.finish()
        return
    inflight.answered = True
    try:  # the next command waits until the answer is out (the record's order)
        await send_client(s, payload, inflight.answer_seq())
    finally:
        cycle.answered(inflight)
        inflight.finish()
    s.record.idle(s.tracking)
