"""One client session: its state, the client task and sending commands to the backend.

- the client task reads a command, lets the plugins look at it, and sends it to the backend;
- the backend task (``responses``) reads the backend socket all the time, streams each
  response to the client and runs recovery when the connection is lost.

``inflight`` is the one command sent (or queued while recovering) whose response is not
complete. The client task does not wait for a response after sending; it only waits when the
client sends the next command before the previous response completed (pipelining).

Login is in ``login``, oversized commands in ``oversize``, recovery in ``proxy.recovery``
(``driver``), commit markers in ``markers``; what the session's state is lives in ``proxy.session.tracker``.
"""

from __future__ import annotations

import logging

import trio

from proxy.handover.slot import consumed, flags_of
from proxy.hooks import CommandInfo, SessionInfo
from proxy.netio import Channel, PeerClosed, WaitInterrupted
from proxy.protocol.constants import MAX_FRAME, Commands, Err
from proxy.protocol.framing import encode_packet
from proxy.protocol.packets import make_err, make_ok
from proxy.protocol.response import ResponseTracker, expect_for
from proxy.recovery.facts import needs_last_results
from proxy.recovery.loss import SessionParts
from proxy.recovery.markers import CommitMarkers
from proxy.recovery.restore import move
from proxy.relay import login, oversize, responses
from proxy.relay.inflight import NOT_SENT, SEND_FAILED, SENDING, SENT, Inflight, SessionClosed
from proxy.relay.kill import translate_kill
from proxy.relay.link import BackendLink, LinkState
from proxy.relay.relay import FirstAnswer
from proxy.relay.verdicts import run_command_hooks
from proxy.session.intake import Command, Oversized, read_command, whole_command
from proxy.session.longdata import LongDataSpool
from proxy.session.tracker import SessionTracker
from proxy.sessionlog import outcome
from proxy.sqltext import Analysis, Kind
from proxy.target import Target

__all__ = ["Session", "SessionClosed"]

log = logging.getLogger("replay_proxy.session")


C = Commands
# Enum members read per statement, as module globals (EnumType's __getattr__ hook otherwise).
_UP, _MOVING = LinkState.UP, LinkState.MOVING
_SELECT, _OTHER, _COMMIT = Kind.SELECT, Kind.OTHER, Kind.COMMIT
# Command codes compared per statement, likewise: an attribute of a class is not a cached read
# in CPython 3.11, a module global is.
_QUERY, _EXECUTE, _PREPARE, _LONG_DATA = C.COM_QUERY, C.COM_STMT_EXECUTE, C.COM_STMT_PREPARE, C.COM_STMT_SEND_LONG_DATA
_QUIT, _CHANGE_USER = C.COM_QUIT, C.COM_CHANGE_USER

_STMT_COMMANDS = frozenset({C.COM_STMT_EXECUTE, C.COM_STMT_SEND_LONG_DATA, C.COM_STMT_CLOSE, C.COM_STMT_RESET, C.COM_STMT_FETCH})
# Texts at least this long are judged in a thread (about 0.5 s per MB of Python).
_JUDGE_ASIDE = 256 * 1024
# Commands a proxy in front of a replicator's target has no business relaying.
_REFUSED_COMMANDS = frozenset(
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
_WRITE_VERBS = frozenset({b"INSERT", b"REPLACE", b"UPDATE", b"DELETE"})  # of the fast path (sqltext.triage)


class Session:
    """One client's relay (``relay.relay.Relay``, as login, answers, oversize and responses
    take it). What does not change while it lives is in ``parts``, built once."""

    def __init__(self, target: Target, client: Channel, client_address: str, session_id: int) -> None:
        config, hooks, rec, limits = target.config, target.hooks, target.config.recovery, target.config.limits
        info = SessionInfo(session_id, target.name, "", client_address, opened_at=trio.current_time())
        self.log = info.logger(log)  # every line about the session carries its fields
        self.tracking = SessionTracker(info, rec.journal_max_bytes, rec.journal_max_statements, rec.idempotent == "safe-mode",
                                       LongDataSpool(limits.spool_threshold, limits.long_data_spool))  # fmt: skip
        self.link = BackendLink(self.tracking, limits.max_allowed_packet)  # the backend connection's life
        markers = CommitMarkers(target.markers, session_id) if rec.commit_marker and rec.enabled else None
        # Config, plugins, target, info, commit markers...: for the relay's modules and recovery.
        self.parts = SessionParts(self.log, client_address, config, self.link, self.tracking, target, hooks, info, markers)
        self.id = session_id
        # Resolved once: with no plugin implementing them, these hooks cost one attribute test.
        self._command_hooks = bool(hooks.command_received)
        self.result_hooks = bool(hooks.result_received)
        self.client = client
        self.client_caps = 0
        self.deprecate_eof = False
        self.scramble = b""
        self.inflight: Inflight | None = None
        self.first_answer: FirstAnswer | None = None  # what the next command gets before anything else
        self._tasks: _Tasks | None = None  # while it runs
        # An upgrade's SessionMover (proxy.handover.sessions) waiting for this session's next
        # command boundary.
        self.mover = None
        self.parked = False  # the backend task waits between responses (an upgrade may stop it there)
        self._unparked: trio.Event | None = None  # set when that wait ends (stop_backend_task)
        self._stopped_parked = False  # and it ended by stop_backend_task's interrupt
        self._queued: trio.Event | None = None  # set by the next command while the backend task waits for one
        self._stop_waiting = False  # stop_backend_task ended that wait (an upgrade takes the session)
        self._unconnected = False  # idle with no backend connection (closed for idling) until a command comes
        self.commands = 0
        self._next_marker = 0  # marker number written for the COMMIT about to be submitted
        self.close_reason = ""
        self.login_refused = False  # wrong credentials (counted against the client's host)
        # trio.current_time() without its two wrappers (read twice per statement): the run's clock.
        self.now = trio.lowlevel.current_clock().current_time
        self.last_activity = self.now()  # when the last command completed (wait_timeout)
        # --workers N: its record in shared memory and the worker's link to the supervisor, which
        # holds the client's socket and state so that another worker can take over if this one
        # dies (``proxy.handover.mirror``); None when not registered (one process, TLS).
        self.slot = None
        self.mirror = None
        self.settled = 0  # the last command whose completion the supervisor's copy of the state includes
        self.handed_over = False  # moved to another process: its client connection lives on there
        self.left_to_keeper = False  # its worker is going down: the supervisor's copy of the client lives on
        self._exchanging = False  # in COM_CHANGE_USER's exchange with the client
        # Why its link is LOST without a backend connection (recovery's first line): the server
        # closed it for idling (here, or before an upgrade moved the session), or it died with
        # the worker this session was taken over from.
        self.unconnected_reason = "the backend connection was closed for idling; a new one for the next command"

    async def handshake(self) -> bool:
        return await login.handshake(self)

    # ------------------------------------------------------------------ life

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._tasks = _Tasks(nursery)
                self.start_backend_task()
                # A task of its own, not this one's body: each wake for a command resumes its
                # few frames, not also those of the accept loop's task that runs the session.
                nursery.start_soon(self._client_task, nursery.cancel_scope)
        except BaseExceptionGroup as group:
            # Either task's failure ends the session; surface the cause itself.
            cause = _first_cause(group)
            if not isinstance(cause, SessionClosed):
                raise cause from None
            self.close_reason = str(cause)
        except SessionClosed as exc:
            self.close_reason = str(exc)

    def start_backend_task(self) -> None:
        tasks = self._tasks
        assert tasks is not None
        tasks.backend_done = trio.Event()
        tasks.nursery.start_soon(responses.backend_task, self, tasks.backend_done)

    def unpark(self, interrupted: bool) -> None:
        """Backend task: its wait between responses ended (``interrupted``: by
        ``stop_backend_task``, and the task returns)."""
        self.parked = False
        self._stopped_parked = interrupted
        if self._unparked is not None:
            self._unparked.set()

    async def stop_backend_task(self) -> bool:
        """Stop reading the backend connection where the backend task waits between responses
        (an upgrade is about to hand it over). False: it is busy -- a response, or recovery
        after a loss it saw the moment before -- and goes on; stopping it there would leave
        the session half recovered. The wait is ended by the channel's interrupt, which costs
        the wait nothing (a cancel scope per response did: callgrind)."""
        tasks, backend = self._tasks, self.link.backend
        if tasks is None or tasks.backend_done is None:
            return False
        if self._queued is not None and self.inflight is None:  # no connection: it waits for a command
            self._stop_waiting = True
            self._queued.set()
            await tasks.backend_done.wait()
            self._stop_waiting = False
            return True
        if not self.parked or backend is None:
            return False
        self._unparked = trio.Event()
        if not backend.channel.interrupt_wait():
            self._unparked = None
            return False
        await self._unparked.wait()  # the wait ended: interrupted, or with what had arrived
        self._unparked = None
        if not self._stopped_parked:
            return False
        await tasks.backend_done.wait()
        return True

    def end(self, reason: str) -> None:
        """Stop the session from outside (proxy shutdown)."""
        if self._tasks is not None and not self._tasks.nursery.cancel_scope.cancel_called:
            self.close_reason = reason
            self._tasks.nursery.cancel_scope.cancel()

    def idle(self) -> bool:
        """Between transactions with nothing in flight: it can be closed or moved now."""
        return self.inflight is None and not self.tracking.tx.active

    @property
    def recoveries(self) -> int:
        return self.link.recoveries

    @property
    def in_transaction(self) -> bool:  # stats.SessionFacts
        return self.tracking.tx.active

    @property
    def backend_address(self) -> str | None:  # stats.SessionFacts: while its backend connection is open
        backend = self.link.backend
        return str(backend.address) if backend is not None and not backend.channel.closed else None

    def request_move(self) -> None:
        """Its backend address is draining: move to another connection as soon as it is idle."""
        self.link.want_move()
        if self.idle() and self.link.up:
            self.start_move()

    def cut_backend(self, address, since: float, reason: str) -> bool:
        """Its backend connection is to ``address``, opened by ``since``, and that server
        answers no one: cut it (``BackendLink.cut``); the backend task's recovery follows."""
        backend = self.link.backend
        if not self.link.up or backend is None or backend.address != address or backend.connected_at > since:
            return False
        self.log.warning("cutting backend connection %d: %s", backend.connection_id, reason)
        self.link.cut(reason)
        return True

    def start_move(self) -> None:
        self.parts.target.spawn(self._move)

    async def _move(self) -> None:
        """Move an idle session off its draining backend (``proxy.recovery.restore.move``), then
        send a command that arrived meanwhile."""
        link, state = self.link, self.tracking.state
        if not link.move_requested or not link.up or not self.idle() or state is None:
            return
        if state.unrestorable is not None:
            self.log.warning("cannot move off a draining backend: %s", state.unrestorable)
            link.drop_move()
            return
        await move(self.parts)
        waiting = self.inflight
        if waiting is not None and waiting.state == NOT_SENT:
            await self.send_inflight(waiting)

    def describe(self) -> dict:
        """For /status: who, where, what state (no statement text)."""
        info = self.parts.info
        return {
            "id": self.id,
            "user": info.user,
            "client": self.parts.client_address,
            "backend": info.backend_address,
            "backend_connection": self.link.connection_id,
            "in_transaction": self.tracking.tx.active,
            "command_in_flight": self.inflight is not None,
            "commands": self.commands,
            "recoveries": self.link.recoveries,
            "opened_s_ago": round(trio.current_time() - info.opened_at, 1),
            "restorable": self.tracking.state is None or self.tracking.state.unrestorable is None,
        }

    def close(self) -> None:
        self.link.close()  # after a move the link is closed already (detach): no COM_QUIT
        if self.slot is not None and not self.handed_over and not self.left_to_keeper:
            self.client.shutdown()  # the supervisor's copy of the socket must not keep the connection open
        self.client.close()
        self.tracking.close()

    # ------------------------------------------------------------------ client task

    async def _client_task(self, both: trio.CancelScope) -> None:
        """Read and run the client's commands until it goes; then end both tasks (``both``)."""
        try:
            while True:
                slot = self.slot
                if slot is not None and slot.phase and self.inflight is None:  # answered here: idle
                    slot.idle(flags_of(self.tracking))
                cmd = await self._read_command()
                if cmd is None:
                    self.close_reason = self.close_reason or "client closed the connection"
                    return
                if cmd.code == _QUIT:
                    self.close_reason = self.close_reason or "client quit"
                    return
                self.commands += 1
                if self.inflight is not None:
                    await self._wait_inflight()
                slot = self.slot
                if slot is not None:
                    slot.read(cmd.wire_size, self.commands)
                if self.first_answer is not None:
                    first, self.first_answer = self.first_answer, None
                    if await first.answer(self, cmd):
                        continue
                code = cmd.code
                if code in _REFUSED_COMMANDS:
                    await self.answer_error(cmd, *Err.UNKNOWN_COM, f"{CommandInfo(code, b'').name} is not supported through replay-proxy")
                    continue
                if code == _CHANGE_USER:
                    self._exchanging = True  # what it writes before its last answer is not an answer
                    try:
                        await login.change_user(self, cmd)
                    finally:
                        self._exchanging = False
                    self.rebase_slot()  # its exchange read more of the client's stream than the command
                    continue
                if self._command_hooks:
                    cmd = await run_command_hooks(self, cmd)
                    if cmd is None:
                        continue
                if cmd.size > self.link.largest:  # kept whole because split mode may cut it into pieces
                    await oversize.split(self, cmd)
                    continue
                await self._submit(cmd)
        finally:
            both.cancel()

    async def _read_command(self) -> Command | None:
        config = self.parts.config
        limits = config.limits
        max_size = self.link.largest  # like the server
        keep = max(max_size, limits.split_max_statement) if limits.oversized == "split" else max_size
        idle_timeout = config.listen.idle_timeout
        while True:
            if self.mover is not None and not self.client.decoder.buffered():
                await self._hand_over()
            try:
                if idle_timeout:
                    await self._wait_for_command(idle_timeout)
                client = self.client
                if client.decoder.buffered():
                    cmd = await read_command(client, max_size, limits.spool_threshold, keep)
                else:  # read_command's first step written out: a frame less on each command's wake
                    data = await client.recv(wait_first=True)
                    cmd = whole_command(data, max_size, limits.spool_threshold)
                    if cmd is None:
                        client.decoder.feed(data)
                        cmd = await read_command(client, max_size, limits.spool_threshold, keep)
            except PeerClosed:
                return None
            except WaitInterrupted:  # an upgrade takes the session, between two commands
                await self._hand_over()
                continue
            if isinstance(cmd, Oversized):
                await oversize.refuse(self, cmd.size, cmd.seq_end, cmd.code)
                self.rebase_slot()
                continue
            if not cmd.payload:
                raise SessionClosed("client sent an empty command packet")
            if (cmd.seq_end - cmd.size // MAX_FRAME) & 0xFF != 0:
                # A command starts at sequence id 0. MariaDB answers 1156; TiDB closes without a
                # word, which recovery took for a server gone and sent the command again, and
                # again, for the whole buffer window. Refuse it here, as MariaDB does.
                await self.answer_error(cmd, *Err.PACKETS_OUT_OF_ORDER, "Got packets out of order")
                raise SessionClosed("client sent a command out of sequence")
            return cmd

    def attach_slot(self, slot) -> None:
        """Keep the session's record in ``slot`` from now on (``proxy.handover.slot``): the
        client's bytes land in it as they are read."""
        self.slot = self.client.tape = slot

    def rebase_slot(self) -> None:
        """The client's bytes were read past what the record follows (a command dropped for its
        size, COM_CHANGE_USER's exchange): the record starts over from the kernel's count."""
        slot = self.slot
        if slot is not None:
            read = consumed(self.client.sock)
            if read is not None:
                slot.rebase(read - self.client.decoder.buffered())

    async def mirror_state(self) -> None:
        """The supervisor's copy of the session's state follows a change, before the client
        hears of it or a command runs on a new backend connection."""
        if self.mirror is not None and self.tracking.changed:
            await self.mirror.state(self)

    async def _hand_over(self) -> None:
        """An upgrade asked for this session (``proxy.handover.sessions``): if it can move now,
        hand it over and end here (SessionClosed); otherwise go on."""
        mover = self.mover
        if mover is not None and await mover.move(self):
            raise SessionClosed(f"moved to pid {mover.new_pid} (upgrade)")

    async def _wait_for_command(self, idle_timeout: float) -> None:
        """listen.idle_timeout: close a session that sends nothing for that long while no
        command of its own is running (like the server's wait_timeout, but the proxy's)."""
        while True:
            with trio.move_on_after(idle_timeout):
                await self.client.wait_data()
                return
            if self.inflight is None:
                raise SessionClosed(f"idle for {idle_timeout:g}s (listen.idle_timeout)")

    async def _wait_inflight(self) -> None:
        inflight = self.inflight
        if inflight is not None:
            if inflight.done is None:
                inflight.done = trio.Event()
            await inflight.done.wait()

    async def _submit(self, cmd: Command) -> None:
        code = cmd.code
        tracking, link = self.tracking, self.link
        statement = None
        if code in _STMT_COMMANDS:
            statement = tracking.statement_of(cmd.payload)
            if statement is not None and statement.long_data_refused is not None and code == _EXECUTE:
                await oversize.refuse_long_data(self, cmd, statement)
                return
        if (
            link.owes_results
            and (link.state is _UP or link.state is _MOVING)
            and link.takes_results_debt(code)
            and await cmd.judged_whole(lambda payload: needs_last_results(tracking.reading, payload, statement))
        ):  # mid-recovery, proxy.recovery.driver.finish asks instead
            msg = (
                "Lost connection to backend during query (replay-proxy: the backend connection was replaced; "
                "the previous statement's results, such as FOUND_ROWS() and warnings, are gone)"
            )
            self.log.warning("%s; the client gets 1158 and the session ends", msg, **outcome("refused_1158", Err.CONNECTION_LOST[0]))
            await self.answer_error(cmd, *Err.CONNECTION_LOST, msg)
            raise SessionClosed(msg)
        if code != _QUERY:
            verb, analysis = None, None
        elif cmd.size < _JUDGE_ASIDE:
            verb, analysis = tracking.triage(cmd.payload)
        else:  # seconds for megabytes: in a thread, so that the other sessions go on meanwhile
            verb, analysis = await trio.to_thread.run_sync(tracking.triage, cmd.payload)
        # A marker only for a transaction that wrote: a read-only one (START TRANSACTION READ
        # ONLY) would refuse it, and replaying reads is always safe.
        # A COMMIT prepared and executed (mysql-connector's prepared cursor) is judged by its
        # statement's text.
        markers = self.parts.markers
        ends_with = statement.analysis if code == _EXECUTE and statement is not None else analysis
        tx = tracking.tx
        commits_writes = tx.active and tx.writes and _is_commit(ends_with)
        if commits_writes and markers is not None and markers.on:
            if not await self._write_commit_marker(cmd):
                return
        tracker = ResponseTracker(expect_for(code), self.deprecate_eof, tracking.wants_fingerprint(analysis))
        inflight = Inflight(cmd, tracker, statement, self.now(), verb, analysis, tracking.reading)
        if tx.active:
            inflight.look_first = commits_writes
        elif tracking.autocommit:
            inflight.look_first = verb in _WRITE_VERBS or (ends_with is not None and ends_with.writes)
        if self._next_marker:
            inflight.marker, self._next_marker = self._next_marker, 0
        if code == _PREPARE:
            inflight.prepare_ok = bytearray()
        elif code == _LONG_DATA and statement is not None:
            inflight.piece = tracking.long_data_received(statement, cmd, link.limit)
            if inflight.piece is None:
                return  # kept from the server; the execute that would use it gets 1153
        elif analysis is not None and analysis.single and analysis.first.kind is _SELECT and oversize.asks_max_packet(cmd):
            cmd = inflight.command = oversize.tell_effective_limit(cmd, link.limit, link.backend)
        elif analysis is not None and analysis.first.kind is _OTHER and analysis.keywords(0, 1) == ("KILL",):
            cmd = inflight.command = await translate_kill(self, cmd)
        if self._dispatch(inflight):
            await self.send_inflight(inflight)

    def _dispatch(self, inflight: Inflight) -> bool:
        """``inflight`` is the command in flight: True when it is to be sent now
        (``send_inflight``); while the link is not up it is left for recovery (and the backend
        task told, if it waits for a command to recover). A plain call: it runs per statement."""
        self.inflight = inflight
        if self.link.state is _UP:  # link.up, without the property's call
            return True
        if self._queued is not None:
            self._queued.set()
        return False

    async def command_queued(self) -> bool:
        """Backend task: wait until a command waits to be sent (the link is LOST: nothing
        sends it but recovery). False: ``stop_backend_task`` ended the wait instead."""
        self._unconnected = True
        if self.inflight is None:
            self._queued = trio.Event()
            try:
                await self._queued.wait()
            finally:
                self._queued = None
        if self._stop_waiting:
            return False
        self._unconnected = False
        return True

    @property
    def waits_to_reconnect(self) -> bool:
        """Idle without a backend connection (the server closed it for idling): a new one opens
        at the next command (the backend task waits for it, or was stopped for an upgrade)."""
        return self._unconnected and self.inflight is None

    async def _write_commit_marker(self, commit: Command) -> bool:
        """Upsert this session's marker row inside the transaction about to commit, so that a
        lost COMMIT answer can be resolved exactly. False: the client was already answered."""
        markers = self.parts.markers
        number, payload = markers.upsert_sql()
        if self.slot is not None:
            self.slot.marker(number)
        tracker = await self.run_internal(payload, commit.seq_end)
        if tracker is None:
            return False
        if tracker.error is not None:
            # The transaction may be gone (a deadlock victim is rolled back) or stuck: the client's
            # COMMIT gets this error, and is not sent. An OK now could be a lie.
            err = tracker.error
            self.log.warning(
                "commit marker not written (%s); the COMMIT gets this error and is not sent", err, **outcome("marker_failed", err.code)
            )
            await self.send_client(make_err(err.code, err.sqlstate, err.message), commit.seq_end + 1)
            return False
        markers.written = self._next_marker = number
        return True

    async def run_internal(self, payload: bytes, seq_end: int, capture: bytearray | None = None) -> ResponseTracker | None:
        """Client task only: run a command of the proxy's own on the backend and wait for its
        whole response (not forwarded; kept in ``capture`` if given). None when recovery
        answered the client with an error instead, and the caller must stop."""
        cmd = Command(payload, encode_packet(payload, 0)[0], seq_end, len(payload))
        statement = self.tracking.statement_of(payload) if payload[0] in _STMT_COMMANDS else None
        verb, analysis = self.tracking.triage(payload) if payload[0] == _QUERY else (None, None)
        tracker = ResponseTracker(expect_for(payload[0]), self.deprecate_eof, self.tracking.wants_fingerprint(analysis))
        inflight = Inflight(cmd, tracker, statement, trio.current_time(), verb, analysis, self.tracking.reading,
                            internal=True, done=trio.Event())  # fmt: skip
        inflight.captured = capture
        if self._dispatch(inflight):
            await self.send_inflight(inflight)
        await inflight.done.wait()
        return None if inflight.answered else inflight.tracker

    async def send_inflight(self, inflight: Inflight) -> None:
        """Send (or resend) the in-flight command to the current backend."""
        link = self.link
        backend = link.backend
        assert backend is not None
        cmd = inflight.command
        # After an idle spell as long as the server's wait_timeout, its close may be waiting
        # unread too: a command sent into it would look lost in flight.
        look = inflight.look_first or responses.idled_out(self, backend, inflight.arrived) is not None
        if look and backend.channel.data_pending() and not await self._still_up(backend):
            return  # the server closed before this command left: recovery sends it, as not run
        slot = self.slot
        if slot is not None:
            if self.tracking.changed:
                await self.mirror_state()
                if not (link.up and link.backend is backend):
                    return  # lost meanwhile: recovery sends it
            slot.sent()
        inflight.state = SENDING
        link.sending()
        try:
            if cmd.complete:
                data = self.tracking.backend_bytes(cmd.payload, cmd.raw, inflight.statement)
                sent = backend.channel.try_send(data)
                if sent < len(data):
                    await backend.channel.send(data[sent:])
            else:  # spooled: streamed from its file, its statement id renumbered on the way
                for chunk in self.tracking.backend_frames(cmd, inflight.statement):
                    await backend.channel.send(chunk)
            inflight.state = SENT
            if inflight.piece is not None:
                inflight.piece.sent_on = self.tracking.generation
        except (PeerClosed, trio.ClosedResourceError):
            inflight.state = SEND_FAILED  # the backend task notices the loss and recovers
        finally:
            link.sent()
        if inflight.state == SENT and inflight.tracker.done:  # no response expected
            await responses.complete(self, inflight, b"")

    async def _still_up(self, backend) -> bool:
        """The server spoke (or closed) while the session was idle, and the backend task has not
        read it yet: let it. Sending now would make a close the server made before it ever saw
        the command look like one in the middle of it (a 1158 for a COMMIT or a write)."""
        with trio.move_on_after(self.parts.config.backend.io_timeout):
            while self.link.up and self.link.backend is backend and backend.channel.data_pending():
                await trio.sleep(0.001)
        return self.link.up and self.link.backend is backend

    # ------------------------------------------------------------------ answering locally

    async def send_client(self, payload: bytes, seq: int) -> None:
        """One packet to the client: a whole answer (or, in COM_CHANGE_USER's exchange, part of one)."""
        frame = encode_packet(payload, seq)[0]
        slot = self.slot
        if slot is not None:
            slot.answering(len(frame), None if self._exchanging else flags_of(self.tracking))
        await self.client.send(frame)

    async def answer_error(self, cmd: Command, code: int, sqlstate: str, message: str) -> None:
        await self.send_client(make_err(code, sqlstate, message), cmd.seq_end + 1)

    async def answer_inflight(self, err: bytes | None) -> None:
        """Answer the in-flight command in the server's place: with ``err``, or OK (a COMMIT that
        a commit marker proved committed)."""
        inflight = self.inflight
        assert inflight is not None
        inflight.answered = True
        payload = err if err is not None else make_ok(self.tracking.status_word())
        slot = self.slot
        if slot is None or inflight.internal:  # (an internal one's client task settles the record)
            self.inflight = None
            try:
                await self.send_client(payload, inflight.answer_seq())
            finally:
                inflight.finish()
            return
        try:  # the next command waits until the answer is out (the record's order)
            await self.send_client(payload, inflight.answer_seq())
        finally:
            self.inflight = None
            inflight.finish()
        slot.idle(flags_of(self.tracking))


def _is_commit(analysis: Analysis | None) -> bool:
    """One COMMIT [AND CHAIN] (what a commit marker can protect)."""
    return (
        analysis is not None
        and analysis.unknown is None
        and analysis.single
        and analysis.first.kind is _COMMIT
        and not analysis.first.release
    )


def _first_cause(group: BaseExceptionGroup) -> BaseException:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            exc = _first_cause(exc)
        if not isinstance(exc, trio.Cancelled):
            return exc
    return group.exceptions[0]


class _Tasks:
    """A running session's tasks: the nursery of both, and how to stop and start the backend
    task alone (an upgrade hands its connection over between two commands)."""

    __slots__ = ("nursery", "backend_done")

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.backend_done: trio.Event | None = None
