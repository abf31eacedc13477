"""One client session: its state, the client task and sending commands to the backend.

- the client task reads a command, lets the plugins look at it, and sends it to the backend;
- the backend task (``responses``) reads the backend socket all the time, streams each
  response to the client and runs recovery when the connection is lost.

``inflight`` is the one command sent (or queued while recovering) whose response is not
complete. The client task does not wait for a response after sending; it only waits when the
client sends the next command before the previous response completed (pipelining).

Login is in ``login``, oversized commands in ``oversize``, recovery in ``reconnect``, commit
markers in ``markers``; what the session's state is lives in ``proxy.tracking``.
"""

from __future__ import annotations

import logging
import re

import trio

from proxy.backend import Backend
from proxy.facts import needs_last_results
from proxy.hooks import AnswerOk, CommandInfo, PluginError, Reject, Rewrite, SessionInfo
from proxy.intake import Command, Oversized, read_command
from proxy.netio import Channel, PeerClosed
from proxy.protocol.constants import MAX_FRAME, Commands, Err
from proxy.protocol.framing import encode_packet
from proxy.protocol.packets import make_err, make_ok, parse_err
from proxy.protocol.response import ResponseTracker, expect_for
from proxy.relay import login, oversize, reconnect, responses
from proxy.relay.inflight import SEND_FAILED, SENDING, SENT, Inflight, SessionClosed
from proxy.markers import CommitMarkers
from proxy.session import PreparedStatement
from proxy.sqltext import Analysis, Kind
from proxy.target import Target
from proxy.tracking import SessionTracker
from proxy.worker_identity import backend_connection_of

__all__ = ["Session", "SessionClosed"]

log = logging.getLogger("replay_proxy.session")

C = Commands

_STMT_COMMANDS = frozenset(
    {C.COM_STMT_EXECUTE, C.COM_STMT_SEND_LONG_DATA, C.COM_STMT_CLOSE, C.COM_STMT_RESET, C.COM_STMT_FETCH}
)
# Texts at least this long are judged in a thread (about 0.5 s per MB of Python).
_JUDGE_ASIDE = 256 * 1024
# Commands a proxy in front of a replicator's target has no business relaying.
_REFUSED_COMMANDS = frozenset(
    {
        C.COM_BINLOG_DUMP, C.COM_BINLOG_DUMP_GTID, C.COM_REGISTER_SLAVE, C.COM_TABLE_DUMP, C.COM_CONNECT_OUT,
        C.COM_SHUTDOWN, C.COM_SLEEP, C.COM_CONNECT, C.COM_TIME, C.COM_DELAYED_INSERT, C.COM_DAEMON,
    }
)
_KILL = re.compile(rb"\s*KILL\s+((?:CONNECTION\s+|QUERY\s+)?)(\d+)\s*;?\s*$", re.I)


class Session:
    def __init__(self, target: Target, client: Channel, client_address: str, session_id: int) -> None:
        self.target = target
        self.config = config = target.config
        self.hooks = target.hooks
        # Resolved once: with no plugin implementing them, these hooks cost one attribute test.
        self._command_hooks = bool(self.hooks.command_received)
        self._result_hooks = bool(self.hooks.result_received)
        self._split_mode = config.limits.oversized == "split"
        rec = config.recovery
        self.markers = CommitMarkers(target.markers, session_id) if rec.commit_marker and rec.enabled else None
        self.client = client
        self.client_address = client_address
        self.id = session_id
        self.info = SessionInfo(session_id, target.name, "", client_address, opened_at=trio.current_time())
        self.tracking = SessionTracker(self.info, rec.journal_max_bytes, rec.journal_max_statements, rec.idempotent == "safe-mode")
        self.backend: Backend | None = None
        self.limit = config.limits.max_allowed_packet
        self.largest = self.limit - 1  # the largest command payload the server takes
        self.backend_ok = False
        self.login = None  # backend.Login, from login.handshake
        self.client_caps = 0
        self.deprecate_eof = False
        self.scramble = b""
        self.inflight: Inflight | None = None
        self.pending_error: bytes | None = None  # a 1213 for the waiting or next command
        self.failed: bytes | None = None  # the ERR the next command gets before the session ends
        self._send_settled: trio.Event | None = None
        self.backend_replaced = trio.Event()
        self._cancel: trio.CancelScope | None = None
        self.commands = 0
        self.recoveries = 0
        self.losses_in_a_row = 0  # recoveries since the last command completed
        self.split_warnings: oversize.MergedWarnings | None = None  # warnings of the last split statement
        self._next_marker = 0  # marker number written for the COMMIT about to be submitted
        self.close_reason = ""
        self.login_refused = False  # wrong credentials (counted against the client's host)
        self.move_requested = False  # its backend is draining: move between transactions
        self.lost_at = 0.0  # when the backend was last lost (recovery)
        self.migrating = False
        self.results_gone = False  # on a new backend connection, before the client's first command ran there
        self.last_activity = trio.current_time()  # when the last command completed (wait_timeout)
        self.kill_relayed: tuple[int, float] | None = None  # (backend connection id, when): another session's KILL of it

    async def handshake(self) -> bool:
        return await login.handshake(self)

    # ------------------------------------------------------------------ life

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._cancel = nursery.cancel_scope
                nursery.start_soon(responses.backend_task, self)
                try:
                    reason = await self._client_task()
                    self.close_reason = self.close_reason or reason
                finally:
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # Either task's failure ends the session; surface the cause itself.
            cause = _first_cause(group)
            if not isinstance(cause, SessionClosed):
                raise cause from None
            self.close_reason = str(cause)
        except SessionClosed as exc:
            self.close_reason = str(exc)

    def end(self, reason: str) -> None:
        """Stop the session from outside (proxy shutdown)."""
        if self._cancel is not None and not self._cancel.cancel_called:
            self.close_reason = reason
            self._cancel.cancel()

    def idle(self) -> bool:
        """Between transactions with nothing in flight: it can be closed or moved now."""
        return self.inflight is None and not self.tracking.tx.active

    def request_move(self) -> None:
        """Its backend address is draining: move to another connection as soon as it is idle."""
        self.move_requested = True
        if self.idle() and self.backend_ok:
            self.target.spawn(reconnect.migrate, self)

    def describe(self) -> dict:
        """For /status: who, where, what state (no statement text)."""
        return {
            "id": self.id,
            "user": self.info.user,
            "client": self.client_address,
            "backend": self.info.backend_address,
            "backend_connection": self.backend.connection_id if self.backend is not None else None,
            "in_transaction": self.tracking.tx.active,
            "command_in_flight": self.inflight is not None,
            "commands": self.commands,
            "recoveries": self.recoveries,
            "opened_s_ago": round(trio.current_time() - self.info.opened_at, 1),
            "restorable": self.tracking.state is None or self.tracking.state.unrestorable is None,
        }

    def close(self) -> None:
        if self.backend is not None:
            if self.backend_ok and not self.backend.channel.closed:
                # A polite COM_QUIT spares the server an "aborted connection" warning.
                self.backend.channel.send_nowait(encode_packet(b"\x01", 0)[0])
            self.backend.close()
        self.client.close()

    def use_backend(self, backend: Backend | None) -> None:
        self.backend = backend
        if backend is not None:
            self.limit = oversize.effective_limit(self.config.limits.max_allowed_packet, backend)
            self.tracking.backend_changed(str(backend.address), backend.handshake.server_version)
            # MariaDB takes a command smaller than max_allowed_packet, TiDB one of that size too
            self.largest = self.limit if self.tracking.dialect.flavor == "tidb" else self.limit - 1

    # ------------------------------------------------------------------ client task

    async def _client_task(self) -> str:
        while True:
            cmd = await self._read_command()
            if cmd is None:
                return "client closed the connection"
            if cmd.code == C.COM_QUIT:
                return "client quit"
            self.commands += 1
            if self.inflight is not None:
                await self._wait_inflight()
            if self.failed is not None or self.pending_error is not None:
                await self._answer_pending(cmd)
                continue
            code = cmd.code
            if self.split_warnings is not None and await oversize.answer_split_warnings(self, cmd):
                continue
            if code in _REFUSED_COMMANDS:
                await self.answer_error(cmd, *Err.UNKNOWN_COM, f"{CommandInfo(code, b'').name} is not supported through replay-proxy")
                continue
            if code == C.COM_CHANGE_USER:
                await login.change_user(self, cmd)
                continue
            if self._command_hooks:
                cmd = await self._run_command_hooks(cmd)
                if cmd is None:
                    continue
            if cmd.size > self.largest:  # kept whole because split mode may cut it into pieces
                await oversize.split(self, cmd)
                continue
            await self._submit(cmd)

    async def _read_command(self) -> Command | None:
        limits = self.config.limits
        max_size = self.largest  # like the server
        keep = max(max_size, limits.split_max_statement) if self._split_mode else max_size
        idle_timeout = self.config.listen.idle_timeout
        while True:
            try:
                if idle_timeout:
                    await self._wait_for_command(idle_timeout)
                cmd = await read_command(self.client, max_size, limits.spool_threshold, keep)
            except PeerClosed:
                return None
            if isinstance(cmd, Oversized):
                await oversize.refuse(self, cmd.size, cmd.seq_end, cmd.code)
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

    async def _answer_pending(self, cmd: Command) -> None:
        if self.failed is not None:
            payload, self.failed = self.failed, None
            await self.send_client(payload, cmd.seq_end + 1)
            raise SessionClosed(parse_err(payload).message)
        payload = self.take_pending_error()
        if cmd.code == C.COM_QUERY and _is_rollback(self.tracking.triage(cmd.payload)[1]):
            # The client wants to roll back a transaction that is already gone: that is fine.
            await self.send_client(make_ok(self.tracking.status_word()), cmd.seq_end + 1)
            return
        await self.send_client(payload, cmd.seq_end + 1)

    async def _run_command_hooks(self, cmd: Command) -> Command | None:
        try:
            verdict = await self.hooks.run_command_chain(self.info, CommandInfo.for_session(self.info, cmd.code, cmd.payload, cmd.complete))
        except PluginError as exc:
            log.error("session %d: %s", self.id, exc)
            await self.answer_error(cmd, *Err.UNKNOWN_ERROR, str(exc))
            return None
        if verdict is None:
            return cmd
        if isinstance(verdict, Rewrite):
            raw, last_seq = encode_packet(verdict.payload, 0)
            if not cmd.complete or (last_seq - 1) & 0xFF != cmd.seq_end:
                # Plugins see only the head of a spooled command; and the client's sequence ids
                # must still match the response.
                await self.answer_error(cmd, *Err.UNKNOWN_ERROR, "plugin rewrite of a command this large is not supported")
                return None
            return Command(verdict.payload, raw, cmd.seq_end, len(verdict.payload))
        if isinstance(verdict, Reject):
            await self.answer_error(cmd, verdict.code, verdict.sqlstate, verdict.message)
        elif isinstance(verdict, AnswerOk):
            ok = make_ok(self.tracking.status_word(), verdict.affected_rows, verdict.last_insert_id, verdict.warnings, verdict.info.encode())
            await self.send_client(ok, cmd.seq_end + 1)
        return None

    async def _submit(self, cmd: Command) -> None:
        code = cmd.code
        tracking = self.tracking
        statement = None
        if code in _STMT_COMMANDS:
            statement = tracking.statement_of(cmd.payload)
            if statement is not None and statement.long_data_bytes >= self.limit and code == C.COM_STMT_EXECUTE:
                await oversize.refuse_long_data(self, cmd, statement)
                return
        if self.results_gone and (self.backend_ok or self.migrating) and self.reads_gone_results(cmd, statement):
            # mid-recovery, recover() asks instead
            msg = ("Lost connection to backend during query (replay-proxy: the backend connection was replaced; "
                   "the previous statement's results, such as FOUND_ROWS() and warnings, are gone)")
            log.warning("session %d: %s; the client gets 1158 and the session ends", self.id, msg)
            await self.answer_error(cmd, *Err.CONNECTION_LOST, msg)
            raise SessionClosed(msg)
        if code != C.COM_QUERY:
            verb, analysis = None, None
        elif cmd.size < _JUDGE_ASIDE:
            verb, analysis = tracking.triage(cmd.payload)
        else:  # seconds for megabytes: in a thread, so that the other sessions go on meanwhile
            verb, analysis = await trio.to_thread.run_sync(tracking.triage, cmd.payload)
        # A marker only for a transaction that wrote: a read-only one (START TRANSACTION READ
        # ONLY) would refuse it, and replaying reads is always safe.
        if self.markers is not None and tracking.tx.active and tracking.tx.writes and _is_commit(analysis):
            if not await self._write_commit_marker(cmd):
                return
        tracker = ResponseTracker(expect_for(code), self.deprecate_eof, tracking.wants_fingerprint(analysis))
        inflight = Inflight(cmd, tracker, statement, trio.current_time(), verb, analysis, tracking.reading)
        if self._next_marker:
            inflight.marker, self._next_marker = self._next_marker, 0
        if code == C.COM_STMT_PREPARE:
            inflight.held = bytearray()
        elif code == C.COM_STMT_SEND_LONG_DATA and statement is not None:
            if not tracking.long_data_received(statement, cmd.payload, self.limit):
                return  # kept from the server; the execute that would use it gets 1153
        elif analysis is not None and analysis.single and analysis.first.kind is Kind.SELECT and oversize.asks_max_packet(cmd):
            cmd = inflight.command = oversize.tell_effective_limit(cmd, self.limit, self.backend)
        elif analysis is not None and analysis.first.kind is Kind.OTHER and analysis.keywords(0, 1) == ("KILL",):
            cmd = inflight.command = await self._translate_kill(cmd)
        self.inflight = inflight
        if self.backend_ok:
            await self.send_inflight(inflight)

    def reads_gone_results(self, cmd: Command, statement: PreparedStatement | None) -> bool:
        """The first command on a new backend connection (``results_gone``): does it read what
        the previous statement left (FOUND_ROWS(), warnings, ...), which stayed on the old
        connection? A statement that runs makes the results the new connection's; PING and the
        like leave them as they are."""
        if cmd.code not in (C.COM_QUERY, C.COM_STMT_EXECUTE):
            return False
        self.results_gone = False
        return needs_last_results(self.tracking, cmd.payload, statement)

    async def _translate_kill(self, cmd: Command) -> Command:
        """Clients KILL by the connection id of the proxy's greeting (the mariadb CLI on Ctrl-C:
        KILL QUERY <id>). Those ids are the proxy's own session numbers; the server knows the
        session's current backend connection instead (another worker's session: ask it)."""
        m = _KILL.match(cmd.payload, 1)
        if m is None:
            return cmd
        session_id = int(m.group(2))
        session = self.target.session_by_id(session_id)
        killing = not m.group(1).upper().startswith(b"QUERY")
        if session is not None and session.backend is not None:
            address, connection_id = str(session.backend.address), session.backend.connection_id
            if killing:  # the server may not count KILLs (TiDB): tell the victim's recovery
                session.kill_relayed = (connection_id, trio.current_time())
        else:
            worker = self.target.worker
            found = await backend_connection_of(worker, session_id, killing) if worker is not None else None
            if found is None:
                return cmd  # not a proxy session: the server will judge the id
            address, connection_id = found
        if self.backend is None or address != str(self.backend.address):
            log.info("session %d: KILL of proxy session %d, which is on backend %s, not this session's", self.id, session_id, address)
        payload = b"\x03KILL %s%d" % (m.group(1), connection_id)
        log.info("session %d: %s of proxy session %d sent as backend connection %d",
                 self.id, payload[1:].decode(errors="replace"), session_id, connection_id)
        return Command(payload, encode_packet(payload, 0)[0], cmd.seq_end, len(payload))

    async def _write_commit_marker(self, commit: Command) -> bool:
        """Upsert this session's marker row inside the transaction about to commit, so that a
        lost COMMIT answer can be resolved exactly. False: the client was already answered."""
        number, payload = self.markers.upsert_sql()
        tracker = await self.run_internal(payload, commit.seq_end)
        if tracker is None:
            return False
        if tracker.error is not None:
            # The transaction may be gone (a deadlock victim is rolled back) or stuck: the client's
            # COMMIT gets this error, and is not sent. An OK now could be a lie.
            err = tracker.error
            log.warning("session %d: commit marker not written (%s); the COMMIT gets this error and is not sent", self.id, err)
            await self.send_client(make_err(err.code, err.sqlstate, err.message), commit.seq_end + 1)
            return False
        self.markers.written = self._next_marker = number
        return True

    async def run_internal(self, payload: bytes, seq_end: int, capture: bytearray | None = None) -> ResponseTracker | None:
        """Client task only: run a command of the proxy's own on the backend and wait for its
        whole response (not forwarded; kept in ``capture`` if given). None when recovery
        answered the client with an error instead, and the caller must stop."""
        cmd = Command(payload, encode_packet(payload, 0)[0], seq_end, len(payload))
        statement = self.tracking.statement_of(payload) if payload[0] in _STMT_COMMANDS else None
        verb, analysis = self.tracking.triage(payload) if payload[0] == C.COM_QUERY else (None, None)
        tracker = ResponseTracker(expect_for(payload[0]), self.deprecate_eof, self.tracking.wants_fingerprint(analysis))
        inflight = Inflight(cmd, tracker, statement, trio.current_time(), verb, analysis, self.tracking.reading,
                            internal=True, done=trio.Event())  # fmt: skip
        inflight.held = capture
        self.inflight = inflight
        if self.backend_ok:
            await self.send_inflight(inflight)
        await inflight.done.wait()
        return None if inflight.answered else inflight.tracker

    async def send_inflight(self, inflight: Inflight) -> None:
        """Send (or resend) the in-flight command to the current backend."""
        backend = self.backend
        assert backend is not None
        cmd = inflight.command
        inflight.state = SENDING
        try:
            if cmd.complete:
                await backend.channel.send(self.tracking.backend_bytes(cmd.payload, cmd.raw, inflight.statement))
            elif inflight.statement is not None:  # a huge execute that needs rewriting
                await backend.channel.send(self.tracking.backend_bytes(cmd.full_payload(), None, inflight.statement))
            else:
                for chunk in cmd.frames():
                    await backend.channel.send(chunk)
            inflight.state = SENT
        except (PeerClosed, trio.ClosedResourceError):
            inflight.state = SEND_FAILED  # the backend task notices the loss and recovers
        finally:
            if self._send_settled is not None:
                self._send_settled.set()
        if inflight.state == SENT and inflight.tracker.done:  # no response expected
            await responses.complete(self, inflight, b"")

    async def send_settled(self) -> None:
        """Recovery: wait until the client task's send of the in-flight command has finished."""
        self._send_settled = trio.Event()
        await self._send_settled.wait()
        self._send_settled = None

    # ------------------------------------------------------------------ answering locally

    async def send_client(self, payload: bytes, seq: int) -> None:
        await self.client.send(encode_packet(payload, seq)[0])

    async def answer_error(self, cmd: Command, code: int, sqlstate: str, message: str) -> None:
        await self.send_client(make_err(code, sqlstate, message), cmd.seq_end + 1)

    def take_pending_error(self) -> bytes:
        payload = self.pending_error
        assert payload is not None
        self.pending_error = None
        return payload

    async def answer_inflight(self, err: bytes | None) -> None:
        """Answer the in-flight command in the server's place: with ``err``, or OK (a COMMIT that
        a commit marker proved committed)."""
        inflight = self.inflight
        assert inflight is not None
        self.inflight = None
        inflight.answered = True
        payload = err if err is not None else make_ok(self.tracking.status_word())
        try:
            await self.send_client(payload, inflight.answer_seq())
        finally:
            inflight.finish()


def _is_commit(analysis: Analysis | None) -> bool:
    """One COMMIT [AND CHAIN] (what a commit marker can protect)."""
    return analysis is not None and analysis.unknown is None and analysis.single and analysis.first.kind is Kind.COMMIT and not analysis.first.release


def _is_rollback(analysis: Analysis | None) -> bool:
    return analysis is not None and analysis.unknown is None and analysis.single and analysis.first.kind is Kind.ROLLBACK


def _first_cause(group: BaseExceptionGroup) -> BaseException:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            exc = _first_cause(exc)
        if not isinstance(exc, trio.Cancelled):
            return exc
    return group.exceptions[0]
