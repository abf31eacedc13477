"""One client session: login, the command relay, and recovery when the backend goes away.

Two tasks per session:

- the client task reads a command, lets the plugins look at it, and sends it to the backend;
- the backend task reads the backend socket all the time. It streams each response to the
  client, and while the client is idle its pending read is what notices a server closing the
  connection (FIN, reset, an unsolicited ERR) at once, so the connection is replaced before the
  client's next command. It also runs recovery (reconnect, restore, replay, resend).

``inflight`` is the one command sent (or queued while recovering) whose response is not
complete. The client task does not wait for a response after sending; it only waits when the
client sends the next command before the previous response completed (pipelining).
"""

from __future__ import annotations

import logging
import os
import re
import struct

import attrs
import trio

from proxy import statements as st
from proxy.backend import Backend, BackendError, Login, backoff_delays
from proxy.intake import Command, Oversized, read_command
from proxy.hooks import AnswerOk, CommandInfo, PluginError, Reject, ResultInfo, Rewrite, SessionInfo, Veto
from proxy.netio import Channel, PeerClosed
from proxy.protocol import sql
from proxy.protocol.auth import NATIVE, ServerAuth, new_scramble
from proxy.protocol.constants import PROXY_CAPABILITIES, Capabilities, Commands, Err, ServerStatus
from proxy.protocol.framing import encode_packet
from proxy.protocol.resultset import build_text_result, read_text_result
from proxy.protocol.split import CannotSplit, count_rows, split_values_statement
from proxy.protocol.packets import (
    ERR_HEADER,
    HandshakeResponse,
    ProtocolError,
    ServerHandshake,
    make_err,
    make_ok,
    make_server_handshake,
    parse_change_user,
    parse_err,
    parse_handshake_response,
)
from proxy.protocol.response import Expect, ResponseTracker, expect_for
from proxy.recovery import Outcome, Plan, Sent, StatementFacts, plan_recovery
from proxy.session import PreparedStatement, SessionState, parse_use
from proxy.target import Target
from proxy.transaction import JournalEntry, Transaction

__all__ = ["Session"]

log = logging.getLogger("replay_proxy.session")

C = Commands
# Plain ints, not IntFlag: flag arithmetic on enums is slow and this is the hot path.
IN_TRANS = int(ServerStatus.SERVER_STATUS_IN_TRANS)
AUTOCOMMIT = int(ServerStatus.SERVER_STATUS_AUTOCOMMIT)
NO_BACKSLASH_ESCAPES = int(ServerStatus.SERVER_STATUS_NO_BACKSLASH_ESCAPES)

# Send states of an in-flight command.
NOT_SENT, SENDING, SENT, SEND_FAILED = range(4)

# Errors with which a server says "I am going away" in answer to a command it did not run.
SERVER_GOING_AWAY = frozenset({1053, 1927})
# Errors after which the server closes the connection (1153: packet too large).
_CONNECTION_FATAL = frozenset({1153}) | SERVER_GOING_AWAY

_STMT_COMMANDS = frozenset(
    {C.COM_STMT_EXECUTE, C.COM_STMT_SEND_LONG_DATA, C.COM_STMT_CLOSE, C.COM_STMT_RESET, C.COM_STMT_FETCH}
)
# Commands a proxy in front of a replicator's target has no business relaying.
_REFUSED_COMMANDS = frozenset(
    {
        C.COM_BINLOG_DUMP, C.COM_BINLOG_DUMP_GTID, C.COM_REGISTER_SLAVE, C.COM_TABLE_DUMP, C.COM_CONNECT_OUT,
        C.COM_SHUTDOWN, C.COM_SLEEP, C.COM_CONNECT, C.COM_TIME, C.COM_DELAYED_INSERT, C.COM_DAEMON,
    }
)
_SESSION_ONLY_COMMANDS = frozenset(
    {
        C.COM_PING, C.COM_INIT_DB, C.COM_STMT_PREPARE, C.COM_STMT_CLOSE, C.COM_STMT_RESET, C.COM_STMT_SEND_LONG_DATA,
        C.COM_FIELD_LIST, C.COM_STATISTICS, C.COM_SET_OPTION, C.COM_RESET_CONNECTION, C.COM_PROCESS_INFO,
    }
)


@attrs.define(slots=True, eq=False)
class Inflight:
    command: Command
    tracker: ResponseTracker
    statement: PreparedStatement | None
    arrived: float
    keyword: bytes = b""  # first keyword of a COM_QUERY
    state: int = NOT_SENT
    forwarded: bool = False  # part of the response already reached the client
    held: bytearray | None = None  # PREPARE responses are held whole (statement ids get rewritten)
    refuse_infile: bool = False  # answering the server's LOCAL INFILE request with "no file"
    marker: int = 0  # commit-marker number written just before this COMMIT (0: none)
    internal: bool = False  # the proxy's own command (split pieces): response not forwarded
    answered: bool = False  # recovery answered the client with an error instead
    done: trio.Event | None = None


class SessionClosed(Exception):
    """End the session (after the client has been told why, where possible)."""


class Session:
    def __init__(self, target: Target, client: Channel, client_address: str, session_id: int) -> None:
        self.target = target
        self.config = target.config
        self.hooks = target.hooks
        # Resolved once: with no plugin implementing them, these hooks cost one attribute test.
        self._command_hooks = bool(self.hooks.command_received)
        self._split_mode = self.config.limits.oversized == "split"
        self._safe_mode = self.config.recovery.idempotent == "safe-mode"
        rec = self.config.recovery
        self._markers = rec.commit_marker and rec.enabled
        self.marker_slot = os.urandom(16).hex()  # this session's row in the commit-marker table
        self.marker_txn = 0
        self._next_marker = 0
        self._result_hooks = bool(self.hooks.result_received)
        self.client = client
        self.client_address = client_address
        self.id = session_id
        self.info = SessionInfo(session_id, target.name, "", client_address, opened_at=trio.current_time())
        self.backend: Backend | None = None
        self.limit = self.config.limits.max_allowed_packet
        self.backend_ok = False
        self.login: Login | None = None
        self.state: SessionState | None = None
        self.tx = Transaction(self.config.recovery.journal_max_bytes, self.config.recovery.journal_max_statements)
        self.autocommit = True
        self.nbe = False  # sql_mode NO_BACKSLASH_ESCAPES, from the status word: changes how SQL lexes
        self.client_caps = 0
        self.deprecate_eof = False
        self.scramble = b""
        self.prepared: dict[int, PreparedStatement] = {}
        self.remap_ids = False  # once a reconnect renumbered statements, the proxy numbers them
        self.next_stmt_id = 1
        self.generation = 0  # bumped for every new backend connection
        self.inflight: Inflight | None = None
        self.pending_error: tuple[bytes, bool] | None = None  # (ERR payload, close after sending)
        self._send_settled: trio.Event | None = None
        self._backend_replaced = trio.Event()
        self._cancel: trio.CancelScope | None = None
        self.commands = 0
        self.recoveries = 0
        self._losses_in_a_row = 0  # recoveries since the last command completed
        self._split_warnings: _MergedWarnings | None = None  # warnings of the last split statement
        self.close_reason = ""

    # ------------------------------------------------------------------ login

    async def handshake(self) -> bool:
        """Authenticate the client and open its backend connection. False: session refused.
        listen.handshake_timeout bounds the client's part; waiting for a backend that is down
        is bounded by recovery.buffer_window instead."""
        timeout = self.config.listen.handshake_timeout
        with trio.move_on_after(timeout) as scope:
            resp, user, seq = await self._client_login()
        if scope.cancelled_caught:
            self.close_reason = f"no login within {timeout:g}s"
            return False
        if user is None:
            return False
        self.info.user = user
        self.state = SessionState(user, resp.database, resp.charset)
        self.info.database = resp.database
        self.login = self._login_for(user, resp)
        try:
            self._use_backend(await self._connect_within_window())
        except BackendError as exc:
            await self._send_backend_error(exc, seq)
            self.close_reason = f"backend login failed: {exc}"
            return False
        self.backend_ok = True
        self.autocommit = bool(self.backend.status & AUTOCOMMIT)
        self.info.backend_address = str(self.backend.address)
        if self._markers:
            self._markers = await self.target.ensure_marker_table(self.backend)
        await self._send_client(make_ok(self.backend.status), seq)
        return True

    async def _client_login(self) -> tuple[HandshakeResponse | None, str | None, int]:
        """Greeting, handshake response, authentication: (response, user or None, next seq)."""
        client = self.client
        try:
            profile = await self.target.profile()
        except BackendError as exc:
            await self._send_client(make_err(*Err.CONN_HOST_ERROR, f"Can't connect to backend: {exc}"), 0)
            self.close_reason = f"backend unreachable: {exc}"
            return None, None, 0
        self.scramble = new_scramble()
        offered = (PROXY_CAPABILITIES & profile.capabilities) | (
            Capabilities.CLIENT_PROTOCOL_41 | Capabilities.CLIENT_SECURE_CONNECTION | Capabilities.CLIENT_PLUGIN_AUTH
        )
        greeting = ServerHandshake(
            profile.server_version, self.id, self.scramble, offered, profile.collation, int(AUTOCOMMIT), NATIVE
        )
        await self._send_client(make_server_handshake(greeting), 0)
        packet = await client.read_packet()
        resp = parse_handshake_response(packet.payload)
        if resp.ssl_request:
            await self._send_client(make_err(*Err.HANDSHAKE, "replay-proxy does not support TLS yet"), packet.seq + 1)
            self.close_reason = "client asked for TLS"
            return resp, None, 0
        if resp.capabilities & Capabilities.CLIENT_COMPRESS:
            # Not offered, asked anyway (mysql-connector does): say so instead of a silent hang.
            await self._send_client(
                make_err(*Err.HANDSHAKE, "replay-proxy does not support the compressed protocol; connect without compression"),
                packet.seq + 1,
            )
            self.close_reason = "client asked for compression"
            return resp, None, 0
        self.client_caps = resp.capabilities & offered
        self.deprecate_eof = bool(self.client_caps & Capabilities.CLIENT_DEPRECATE_EOF)
        self.info.multi_statements = bool(self.client_caps & Capabilities.CLIENT_MULTI_STATEMENTS)
        host = self.client_address.rsplit(":", 1)[0]
        auth = ServerAuth(self.scramble, self.target.passwords, host)
        user, seq = await self._authenticate(auth, auth.start(resp), packet.seq + 1)
        if user is None:
            self.close_reason = f"login refused for user {resp.username!r}"
            log.warning("session %d: login refused for user %r from %s", self.id, resp.username, self.client_address)
        return resp, user, seq

    def _login_for(self, user: str, resp: HandshakeResponse | None, database: str | None = None) -> Login:
        cfg = self.config.user(user)
        assert cfg is not None
        return Login(
            user=cfg.resolved_backend_user(),
            password=cfg.resolved_backend_password(),
            database=resp.database if resp is not None else database,
            collation=resp.charset if resp is not None else self.state.collation,
            capabilities=self.client_caps,
            connect_attrs=resp.connect_attrs if resp is not None else (self.login.connect_attrs if self.login else {}),
        )

    async def _authenticate(self, auth: ServerAuth, result, seq: int) -> tuple[str | None, int]:
        while True:
            for payload in result.packets:
                await self._send_client(payload, seq)
                seq += 1
            if result.done:
                break
            packet = await self.client.read_packet()
            seq = packet.seq + 1
            result = auth.on_packet(packet.payload)
        if result.error is not None:
            await self._send_client(result.error, seq)
            return None, seq
        return result.user, seq

    async def _send_backend_error(self, exc: BackendError, seq: int) -> None:
        if exc.err is not None and not exc.retryable:
            payload = make_err(exc.err.code, exc.err.sqlstate, exc.err.message)
        else:
            payload = make_err(*Err.CONN_HOST_ERROR, f"Can't connect to backend through replay-proxy: {exc}")
        await self._send_client(payload, seq)

    async def _connect_within_window(self) -> Backend:
        """Log into the backend, retrying retryable failures for up to recovery.buffer_window."""
        rec = self.config.recovery
        deadline = trio.current_time() + rec.buffer_window
        delays = backoff_delays(rec.backoff_initial, rec.backoff_max)
        while True:
            try:
                return await self.target.connect(self.login)
            except BackendError as exc:
                if not exc.retryable or trio.current_time() + rec.backoff_initial >= deadline:
                    raise
                await trio.sleep(min(next(delays), max(0.0, deadline - trio.current_time())))

    # ------------------------------------------------------------------ relay

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._cancel = nursery.cancel_scope
                nursery.start_soon(self._backend_task)
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

    def close(self) -> None:
        if self.backend is not None:
            if self.backend_ok and not self.backend.channel.closed:
                # A polite COM_QUIT spares the server an "aborted connection" warning.
                self.backend.channel.send_nowait(encode_packet(b"\x01", 0)[0])
            self.backend.close()
        self.client.close()

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
            if self.pending_error is not None:
                await self._answer_pending(cmd)
                continue
            code = cmd.code
            if self._split_warnings is not None:  # only the very next command may ask for them
                merged, self._split_warnings = self._split_warnings, None
                if code == C.COM_QUERY and _SHOW_WARNINGS.match(cmd.payload, 1):
                    await self.client.send(build_text_result(merged.coldefs, merged.rows, self._status(), self.deprecate_eof, cmd.seq_end + 1))
                    continue
            if code in _REFUSED_COMMANDS:
                await self._answer_error(cmd, *Err.UNKNOWN_COM, f"{CommandInfo(code, b'').name} is not supported through replay-proxy")
                continue
            if code == C.COM_CHANGE_USER:
                await self._change_user(cmd)
                continue
            if self._command_hooks:
                cmd = await self._run_command_hooks(cmd)
                if cmd is None:
                    continue
            if cmd.size >= self.limit:  # kept whole because split mode may cut it into pieces
                await self._split_oversized(cmd)
                continue
            await self._submit(cmd)

    def _status(self) -> int:
        """The status word for an answer the proxy gives itself, as the server would set it."""
        return (IN_TRANS if self.tx.active else 0) | (AUTOCOMMIT if self.autocommit else 0)

    def _use_backend(self, backend: Backend | None) -> None:
        self.backend = backend
        if backend is not None:
            # Effective max_allowed_packet: the config's, or the backend's if smaller.
            configured = self.config.limits.max_allowed_packet
            self.limit = min(configured, backend.max_allowed_packet) if backend.max_allowed_packet else configured

    async def _read_command(self) -> Command | None:
        limits = self.config.limits
        max_size = self.limit - 1  # like the server: a command must be smaller than max_allowed_packet
        keep = max(max_size, limits.split_max_statement) if self._split_mode else max_size
        while True:
            try:
                cmd = await read_command(self.client, max_size, limits.spool_threshold, keep)
            except PeerClosed:
                return None
            if isinstance(cmd, Oversized):
                await self._refuse_oversized(cmd.size, cmd.seq_end, cmd.code)
                continue
            if not cmd.payload:
                raise SessionClosed("client sent an empty command packet")
            return cmd

    async def _refuse_oversized(self, size: int, seq_end: int, code: int, why: str = "") -> None:
        limit = self.limit
        backend = self.backend.max_allowed_packet if self.backend is not None else None
        origin = f"[limits] max_allowed_packet = {self.config.limits.max_allowed_packet}"
        if backend and backend < self.config.limits.max_allowed_packet:
            origin = f"the backend's @@max_allowed_packet = {backend}"
        msg = (
            f"Got a packet bigger than 'max_allowed_packet' bytes: {size} bytes, max_allowed_packet {limit} "
            f"(target {self.target.name}, limit from {origin}); not sent to the backend{why}"
        )
        log.warning("session %d: refused %s of %d bytes (limit %d)%s", self.id, CommandInfo(code, b"").name, size, limit, why)
        if self.hooks.oversized_packet:
            await self.hooks.notify(self.hooks.oversized_packet, self.info, size, limit)
        await self._send_client(make_err(*Err.NET_PACKET_TOO_LARGE, msg), seq_end + 1)

    async def _wait_inflight(self) -> None:
        inflight = self.inflight
        if inflight is not None:
            if inflight.done is None:
                inflight.done = trio.Event()
            await inflight.done.wait()

    async def _run_command_hooks(self, cmd: Command) -> Command | None:
        try:
            verdict = await self.hooks.run_command_chain(self.info, CommandInfo(cmd.code, cmd.payload, cmd.complete))
        except PluginError as exc:
            log.error("session %d: %s", self.id, exc)
            await self._answer_error(cmd, *Err.UNKNOWN_ERROR, str(exc))
            return None
        if verdict is None:
            return cmd
        if isinstance(verdict, Rewrite):
            raw, last_seq = encode_packet(verdict.payload, 0)
            if not cmd.complete or (last_seq - 1) & 0xFF != cmd.seq_end:
                # Plugins see only the head of a spooled command; and the client's sequence ids
                # must still match the response.
                await self._answer_error(cmd, *Err.UNKNOWN_ERROR, "plugin rewrite of a command this large is not supported")
                return None
            return Command(verdict.payload, raw, cmd.seq_end, len(verdict.payload))
        if isinstance(verdict, Reject):
            await self._answer_error(cmd, verdict.code, verdict.sqlstate, verdict.message)
        elif isinstance(verdict, AnswerOk):
            ok = make_ok(self._status(), verdict.affected_rows, verdict.last_insert_id, verdict.warnings, verdict.info.encode())
            await self._send_client(ok, cmd.seq_end + 1)
        return None

    async def _submit(self, cmd: Command) -> None:
        code = cmd.code
        statement = None
        if code in _STMT_COMMANDS and len(cmd.payload) >= 5:
            statement = self.prepared.get(int.from_bytes(cmd.payload[1:5], "little"))
            if statement is not None and statement.long_data_bytes >= self.limit and code == C.COM_STMT_EXECUTE:
                await self._refuse_long_data(cmd, statement)
                return
        expect = expect_for(code)
        keyword = st.first_keyword(cmd.payload, 1) if code == C.COM_QUERY else b""
        if keyword == b"COMMIT" and self._markers and self.tx.active:
            if not await self._write_commit_marker(cmd):
                return
        fingerprint = self.tx.active or not self.autocommit or keyword in st.TX_CONTROL
        inflight = Inflight(cmd, ResponseTracker(expect, self.deprecate_eof, fingerprint), statement, trio.current_time(), keyword)
        if self._next_marker:
            inflight.marker, self._next_marker = self._next_marker, 0
        if code == C.COM_STMT_PREPARE:
            inflight.held = bytearray()
        elif code == C.COM_STMT_SEND_LONG_DATA and statement is not None:
            statement.long_data_bytes += len(cmd.payload) - 7
            if statement.long_data_bytes >= self.limit:
                return  # kept from the server; the execute that would use it gets 1153
            statement.long_data.append(cmd.payload)
        elif code == C.COM_QUERY and keyword == b"SELECT" and _ASKS_MAX_PACKET.match(cmd.payload, 1):
            cmd = self._tell_effective_limit(cmd)
            inflight.command = cmd
        elif code == C.COM_QUERY and keyword == b"KILL":
            cmd = self._translate_kill(cmd)
            inflight.command = cmd
        self.inflight = inflight
        if self.backend_ok:
            await self._send_inflight(inflight)

    def _tell_effective_limit(self, cmd: Command) -> Command:
        """go-sql-driver (maxAllowedPacket=0) asks SELECT @@max_allowed_packet and then keeps its
        packets under the answer: when the proxy's limit is the smaller one, answer with that."""
        limit = self.limit
        if not self.backend or not self.backend.max_allowed_packet or limit >= self.backend.max_allowed_packet:
            return cmd
        payload = b"\x03SELECT %d AS `@@max_allowed_packet`" % limit
        return Command(payload, encode_packet(payload, 0)[0], cmd.seq_end, len(payload))

    def _translate_kill(self, cmd: Command) -> Command:
        """Clients KILL by the connection id of the proxy's greeting (the mariadb CLI on Ctrl-C:
        KILL QUERY <id>). Those ids are the proxy's own session numbers; the server knows the
        session's current backend connection instead."""
        m = _KILL.match(cmd.payload, 1)
        if m is None:
            return cmd
        session = self.target.session_by_id(int(m.group(2)))
        if session is None or session.backend is None:
            return cmd  # not a proxy session: the server will judge the id
        payload = b"\x03KILL %s%d" % (m.group(1), session.backend.connection_id)
        log.info("session %d: %s of proxy session %s sent as backend connection %d",
                 self.id, payload[1:].decode(errors="replace"), m.group(2).decode(), session.backend.connection_id)
        return Command(payload, encode_packet(payload, 0)[0], cmd.seq_end, len(payload))

    async def _refuse_long_data(self, cmd: Command, stmt: PreparedStatement) -> None:
        """COM_STMT_SEND_LONG_DATA over the limit was held back; refuse the execute that would
        use it and clear what the server got of it."""
        size = stmt.long_data_bytes
        await self._run_internal(b"\x1a" + struct.pack("<I", stmt.client_id), cmd.seq_end)
        stmt.long_data, stmt.long_data_bytes = [], 0
        await self._refuse_oversized(size, cmd.seq_end, cmd.code, " (parameter data sent with COM_STMT_SEND_LONG_DATA)")

    async def _write_commit_marker(self, commit: Command) -> bool:
        """Upsert this session's marker row inside the transaction about to commit, so that a
        lost COMMIT answer can be resolved exactly. False: the client was already answered."""
        number = self.marker_txn + 1
        table = self.config.recovery.marker_table
        sql_ = (
            f"INSERT INTO {table} (slot, txn) VALUES (X'{self.marker_slot}', {number})"
            " ON DUPLICATE KEY UPDATE txn = VALUES(txn)"
        )
        tracker = await self._run_internal(b"\x03" + sql_.encode(), commit.seq_end)
        if tracker is None:
            return False
        if tracker.error is not None:
            log.warning("session %d: commit marker not written (%s); this COMMIT is not protected", self.id, tracker.error)
            return True
        self.marker_txn = self._next_marker = number
        return True

    async def _run_internal(self, payload: bytes, seq_end: int, capture: bytearray | None = None) -> ResponseTracker | None:
        """Client task only: run a command of the proxy's own on the backend and wait for its
        whole response (not forwarded; kept in ``capture`` if given). None when recovery
        answered the client with an error instead, and the caller must stop."""
        cmd = Command(payload, encode_packet(payload, 0)[0], seq_end, len(payload))
        statement = self.prepared.get(int.from_bytes(payload[1:5], "little")) if payload[0] in _STMT_COMMANDS else None
        keyword = st.first_keyword(payload, 1) if payload[0] == C.COM_QUERY else b""
        hashing = self.tx.active or not self.autocommit or keyword in st.TX_CONTROL
        inflight = Inflight(cmd, ResponseTracker(expect_for(payload[0]), self.deprecate_eof, hashing), statement,
                            trio.current_time(), keyword, internal=True, done=trio.Event())
        inflight.held = capture
        self.inflight = inflight
        if self.backend_ok:
            await self._send_inflight(inflight)
        await inflight.done.wait()
        return None if inflight.answered else inflight.tracker

    async def _split_oversized(self, cmd: Command) -> None:
        """Split mode: run an oversized multi-row INSERT/REPLACE as several statements under the
        limit, atomically, and answer with one OK that adds up their results."""
        limit = self.limit
        if cmd.code != C.COM_QUERY:
            await self._refuse_oversized(cmd.size, cmd.seq_end, cmd.code)
            return
        try:
            # Each piece (command byte included) must stay below max_allowed_packet.
            pieces = split_values_statement(cmd.full_payload()[1:], limit - 1, no_backslash_escapes=self.nbe)
        except CannotSplit as exc:
            cmd.release()
            await self._refuse_oversized(cmd.size, cmd.seq_end, cmd.code, f"; split mode could not split it: {exc}")
            return
        cmd.release()
        own_transaction = not self.tx.active and self.autocommit
        begin, commit, undo = (
            ("START TRANSACTION", "COMMIT", "ROLLBACK")
            if own_transaction
            else ("SAVEPOINT replay_proxy_split", "RELEASE SAVEPOINT replay_proxy_split", "ROLLBACK TO SAVEPOINT replay_proxy_split")
        )
        log.info("session %d: splitting a %d-byte statement into %d pieces (limit %d)", self.id, cmd.size, len(pieces), limit)
        if await self._run_internal(b"\x03" + begin.encode(), cmd.seq_end) is None:
            return
        affected = warnings = 0
        insert_id = None
        merged = _MergedWarnings()
        for piece in pieces:
            tracker = await self._run_internal(b"\x03" + piece, cmd.seq_end)
            if tracker is None:
                return
            if tracker.error is not None:
                if tracker.error.code != 1213:  # after a deadlock the server already rolled back
                    await self._run_internal(b"\x03" + undo.encode(), cmd.seq_end)
                err = tracker.error
                await self._send_client(make_err(err.code, err.sqlstate, err.message), cmd.seq_end + 1)
                return
            if tracker.ok is not None:
                affected += tracker.ok.affected_rows
                warnings += tracker.ok.warnings
                if insert_id is None:
                    insert_id = tracker.ok.last_insert_id  # LAST_INSERT_ID of a multi-row insert: its first row
                if tracker.ok.warnings and not await self._collect_warnings(merged, cmd.seq_end):
                    return
            merged.rows_before += count_rows(piece, no_backslash_escapes=self.nbe)
        if insert_id:
            # The session's LAST_INSERT_ID() must be the statement's first id, as unsplit.
            if await self._run_internal(b"\x03DO LAST_INSERT_ID(%d)" % insert_id, cmd.seq_end) is None:
                return
        done = await self._run_internal(b"\x03" + commit.encode(), cmd.seq_end)
        if done is None:
            return
        if done.error is not None:
            err = done.error
            await self._send_client(make_err(err.code, err.sqlstate, err.message), cmd.seq_end + 1)
            return
        await self._send_client(make_ok(done.status, affected, insert_id or 0, warnings), cmd.seq_end + 1)
        if merged.rows:
            self._split_warnings = merged  # SHOW WARNINGS right after this gets all pieces' warnings

    async def _collect_warnings(self, merged: "_MergedWarnings", seq_end: int) -> bool:
        """SHOW WARNINGS after one piece of a split statement, renumbered to the whole statement.
        False: the client was already answered (recovery)."""
        frames = bytearray()
        tracker = await self._run_internal(b"\x03SHOW WARNINGS", seq_end, capture=frames)
        if tracker is None:
            return False
        if tracker.error is None:
            merged.add(*read_text_result(bytes(frames), self.deprecate_eof))
        return True

    async def _send_inflight(self, inflight: Inflight) -> None:
        """Send (or resend) the in-flight command to the current backend."""
        backend = self.backend
        assert backend is not None
        cmd = inflight.command
        inflight.state = SENDING
        try:
            if cmd.complete:
                await backend.channel.send(self._backend_bytes(cmd.payload, cmd.raw, inflight.statement))
            elif inflight.statement is not None:  # a huge execute that needs rewriting
                await backend.channel.send(self._backend_bytes(cmd.full_payload(), None, inflight.statement))
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
            await self._complete(inflight, b"")

    def _backend_bytes(self, payload: bytes, raw: bytes | None, stmt: PreparedStatement | None) -> bytes:
        """The command as this backend must see it: statement ids renumbered, parameter types
        bound again for a statement that was re-prepared."""
        if stmt is None:
            return raw if raw is not None else encode_packet(payload, 0)[0]
        new = payload
        if payload[0] == C.COM_STMT_EXECUTE and stmt.num_params:
            flag_pos = 10 + (stmt.num_params + 7) // 8
            if len(payload) > flag_pos:
                if payload[flag_pos]:
                    stmt.param_types = payload[flag_pos + 1 : flag_pos + 1 + 2 * stmt.num_params]
                    stmt.types_bound_on_backend = True
                elif not stmt.types_bound_on_backend and stmt.param_types is not None:
                    new = payload[:flag_pos] + b"\x01" + stmt.param_types + payload[flag_pos + 1 :]
                    stmt.types_bound_on_backend = True
        if stmt.backend_id != stmt.client_id:
            new = new[:1] + struct.pack("<I", stmt.backend_id) + new[5:]
        if new is payload and raw is not None:
            return raw
        return encode_packet(new, 0)[0]

    async def _backend_task(self) -> None:
        while True:
            backend = self.backend
            assert backend is not None
            inflight = self.inflight
            try:
                # Nothing arrives between responses, nor before the server has worked on a
                # command: wait for readability first, except mid-response.
                data = await backend.channel.recv(wait_first=inflight is None or inflight.tracker.nbytes == 0)
            except PeerClosed as exc:
                if self.backend is not backend:  # replaced on purpose (COM_CHANGE_USER)
                    await self._backend_replaced.wait()
                    continue
                await self._recover(str(exc))
                continue
            inflight = self.inflight
            if inflight is None or inflight.state == NOT_SENT:
                await self._recover(f"backend sent {_describe_unsolicited(data)} while idle")
                continue
            await self._on_response_data(inflight, data)

    async def _on_response_data(self, inflight: Inflight, data: bytes) -> None:
        tracker = inflight.tracker
        try:
            end = tracker.feed(data)
        except ProtocolError as exc:
            await self._fail_connection(inflight, f"protocol error in backend response: {exc}")
            return
        if end < 0:
            if inflight.held is not None or inflight.refuse_infile or inflight.internal:
                if inflight.held is not None:
                    inflight.held += data
                return
            inflight.forwarded = True
            await self.client.send(data)
            return
        extra = data[end:]
        if extra:
            data = data[:end]
        error = tracker.error
        if error is not None and error.code in SERVER_GOING_AWAY and not inflight.forwarded:
            if inflight.keyword == b"KILL":
                # The client killed its own connection (KILL CONNECTION_ID()): pass the answer
                # on and end the session, as the server does, instead of bringing it back.
                await self._complete(inflight, data)
                raise SessionClosed("the client killed its own backend connection")
            await self._recover(f"backend answered {error}", rejected=True)
            return
        if tracker.local_infile and not inflight.refuse_infile:
            await self._refuse_local_infile(inflight)
            return
        await self._complete(inflight, data)
        if extra:
            await self._recover(f"backend sent {_describe_unsolicited(extra)} after a response")

    async def _refuse_local_infile(self, inflight: Inflight) -> None:
        """The server asked for a client file (LOAD DATA LOCAL). Send it an empty one; the
        client gets an ERR instead of the request."""
        assert self.backend is not None
        seq = inflight.tracker.last_seq + 1
        inflight.refuse_infile = True
        inflight.tracker = ResponseTracker(Expect.SINGLE, self.deprecate_eof)
        await self.backend.channel.send(encode_packet(b"", seq)[0])

    async def _complete(self, inflight: Inflight, last: bytes) -> None:
        """The response is complete: update session and transaction state, then let the
        client have the rest of it."""
        tracker = inflight.tracker
        captures = self._bookkeep(inflight)
        if captures:
            # Read the values back before the client hears "OK": a loss now is a loss with the
            # SET still in flight, and recovery simply sends it again.
            try:
                await self._capture_variables(captures)
            except (PeerClosed, ProtocolError) as exc:
                await self._recover(f"connection lost while reading back session variables: {exc}")
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
            out = self._rewrite_prepare_ok(inflight)
        else:
            out = last
        self.inflight = None
        self._losses_in_a_row = 0
        inflight.command.release()
        if out:
            await self.client.send(out)
        if inflight.done is not None:
            inflight.done.set()
        if self._result_hooks:
            error = tracker.error
            result = ResultInfo(
                ok=error is None,
                error_code=error.code if error else None,
                error_message=error.message if error else None,
                affected_rows=tracker.ok.affected_rows if tracker.ok else 0,
                rows=tracker.rows,
                bytes=tracker.nbytes,
                latency=trio.current_time() - inflight.arrived,
                in_transaction=self.tx.active,
            )
            command = inflight.command
            await self.hooks.notify(self.hooks.result_received, self.info, CommandInfo(command.code, command.payload, command.complete), result)

    def _rewrite_prepare_ok(self, inflight: Inflight) -> bytes:
        """The client sees the statement id the proxy gave it, not the backend's."""
        held = inflight.held
        assert held is not None
        stmt = inflight.statement
        if stmt is not None and stmt.client_id != stmt.backend_id:
            held[5:9] = struct.pack("<I", stmt.client_id)  # frame header (4) + OK byte (1)
        return bytes(held)

    # ------------------------------------------------------------------ state bookkeeping

    def _bookkeep(self, inflight: Inflight) -> list[str]:
        """Record what a completed command did to the session and the transaction. Returns the
        session variables whose new values must be read back from the server."""
        cmd = inflight.command
        tracker = inflight.tracker
        code = cmd.code
        ok = tracker.error is None
        state = self.state
        assert state is not None
        captures: list[str] = []
        ends_tx = False
        if tracker.saw_status:
            self.autocommit = bool(tracker.status & AUTOCOMMIT)
            self.nbe = self.info.no_backslash_escapes = bool(tracker.status & NO_BACKSLASH_ESCAPES)
        if code == C.COM_QUERY:
            keyword = inflight.keyword
            if tracker.results > 1 or (tracker.error is not None and tracker.results):
                captures = self._note_multi_statement(cmd, tracker.results)
            else:
                if keyword in st.TX_CONTROL or keyword in st.IMPLICIT_COMMIT:
                    ends_tx = ok and self._ends_transaction(cmd, keyword)
                if ok and (keyword in st.SESSION_CHANGE or st.may_pin_session(keyword, cmd.payload)):
                    captures = self._note_statement(cmd.text(), keyword, cmd.payload)
        elif code == C.COM_STMT_EXECUTE:
            stmt = inflight.statement
            if stmt is not None:
                long_data = stmt.long_data
                stmt.long_data, stmt.long_data_bytes = [], 0
                if len(cmd.payload) > 5 and cmd.payload[5] & 0x07:
                    state.mark_unrestorable("a server-side cursor was opened")
                if self.tx.active or (tracker.saw_status and tracker.status & IN_TRANS):
                    ends_tx = self._statement_ends_transaction(stmt)
                self._journal(inflight, ends_tx, long_data)
            return captures
        elif code == C.COM_STMT_PREPARE:
            if ok and tracker.prepare_ok is not None:
                inflight.statement = self._register_prepared(cmd, tracker)
            return captures
        elif code == C.COM_STMT_CLOSE:
            if inflight.statement is not None:
                self.prepared.pop(inflight.statement.client_id, None)
            return captures
        elif code == C.COM_STMT_RESET:
            if ok and inflight.statement is not None:
                inflight.statement.long_data, inflight.statement.long_data_bytes = [], 0
            return captures
        elif code == C.COM_STMT_FETCH:
            self.tx.mark_not_replayable("server-side cursor fetch")
            return captures
        elif code == C.COM_INIT_DB:
            if ok:
                self.tx.note_session_change(state)
                state.database = cmd.payload[1:].decode("utf-8", "surrogateescape")
                self.info.database = state.database
        elif code == C.COM_RESET_CONNECTION:
            if ok:
                state.reset()
                self.prepared.clear()
                self.tx.reset()
            return captures
        elif code == C.COM_SET_OPTION:
            if ok and len(cmd.payload) >= 3:
                # 0: MYSQL_OPTION_MULTI_STATEMENTS_ON, 1: ..._OFF. A new connection starts with
                # what the handshake negotiated, so the session is not restorable any more.
                self.info.multi_statements = cmd.payload[1] == 0
                state.mark_unrestorable("COM_SET_OPTION changed multi-statement mode")
            return captures
        elif code in _SESSION_ONLY_COMMANDS or code == C.COM_STMT_SEND_LONG_DATA:
            return captures
        self._journal(inflight, ends_tx, None)
        return captures

    def _journal(self, inflight: Inflight, ends_tx: bool, long_data: list[bytes] | None) -> None:
        tracker = inflight.tracker
        tx = self.tx
        if tracker.error is not None:
            if tracker.error.code == 1213:
                tx.reset()  # deadlock: the server rolled the whole transaction back
                return
            if tracker.error.code in _CONNECTION_FATAL:
                return  # the server closes the connection after it: replaying it would loop
        if ends_tx:
            tx.reset()
        in_tx_after = bool(tracker.status & IN_TRANS) if tracker.saw_status else tx.active
        if not in_tx_after:
            if tx.active:
                tx.reset()
            return
        if not tx.active:
            state = self.state
            tx.start(state.next_transaction if state else None)
            if state is not None:
                state.next_transaction = None
            if ends_tx and inflight.keyword in (b"COMMIT", b"ROLLBACK"):
                return  # ... AND CHAIN: the new transaction starts empty
        self.info.in_transaction = True
        cmd = inflight.command
        if not cmd.complete:
            tx.mark_not_replayable(f"a statement of {cmd.size} bytes is larger than the journal keeps")
            return
        fingerprint = tracker.fingerprint if tracker.hashing else None
        tx.record(JournalEntry(cmd.payload, tracker.expect, fingerprint, inflight.statement, long_data or None))

    def _ends_transaction(self, cmd: Command, keyword: bytes) -> bool:
        """Does this accepted statement end the open transaction (commit, rollback, implicit
        commit) even if IN_TRANS stays set afterwards (a new transaction began)?"""
        if keyword in st.IMPLICIT_COMMIT:
            # CREATE TEMPORARY TABLE and a few others do not commit; the classifier knows.
            return sql.classify(cmd.text(), no_backslash_escapes=self.nbe).implicit_commit
        if keyword in (b"BEGIN", b"COMMIT") or (keyword == b"START" and b"TRANSACTION" in cmd.payload[:64].upper()):
            return True
        if keyword == b"ROLLBACK":
            return sql.classify(cmd.text(), no_backslash_escapes=self.nbe).kind == sql.Kind.ROLLBACK
        if keyword == b"XA":
            self.tx.mark_not_replayable("XA transaction")
        return False

    def _statement_ends_transaction(self, stmt: PreparedStatement) -> bool:
        if stmt.ends_transaction is None:  # decided once per statement, not per execute
            keyword = st.first_keyword(stmt.prepare_payload, 1)
            stmt.ends_transaction = (keyword in st.TX_CONTROL or keyword in st.IMPLICIT_COMMIT) and self._ends_transaction(
                Command(stmt.prepare_payload, b"", 0), keyword
            )
        return stmt.ends_transaction

    def _note_statement(self, text: str, keyword: bytes, raw: bytes) -> list[str]:
        """Session effects of one accepted statement; returns variables to read back."""
        captures: list[str] = []
        if keyword in st.SESSION_CHANGE:
            captures = self._note_session_change(text, keyword)
        if st.may_pin_session(keyword, raw):
            reason = sql.classify(text, no_backslash_escapes=self.nbe).session_unrestorable
            if reason:
                self.state.mark_unrestorable(reason)
        return captures

    def _note_multi_statement(self, cmd: Command, ran: int) -> list[str]:
        """Several statements in one COM_QUERY (CLIENT_MULTI_STATEMENTS): apply the session
        effects of the ``ran`` statements the server completed. Transaction control inside one
        is not tracked statement by statement, so such a transaction is not replayable."""
        try:
            pieces = _split_statements(cmd.text(), self.nbe)
        except sql.SqlLexError:
            pieces = []
        if len(pieces) < ran:  # e.g. a stored-program body: the proxy cannot follow it
            self.state.mark_unrestorable("a multi-statement query the proxy could not follow")
            self.tx.mark_not_replayable("multi-statement query")
            return []
        captures: list[str] = []
        for text in pieces[:ran]:
            raw = text.encode("utf-8", "surrogateescape")
            keyword = st.first_keyword(raw)
            if keyword in st.TX_CONTROL or keyword in st.IMPLICIT_COMMIT:
                self.tx.mark_not_replayable("transaction control inside a multi-statement query")
            captures += self._note_statement(text, keyword, raw)
        return captures

    def _note_session_change(self, text: str, keyword: bytes) -> list[str]:
        state = self.state
        assert state is not None
        if keyword == b"USE":
            db = parse_use(text)
            if db is not None:
                self.tx.note_session_change(state)
                state.database = db
                self.info.database = db
            return []
        assignments = sql.parse_set(text, no_backslash_escapes=self.nbe)
        if not assignments:
            return []
        self.tx.note_session_change(state)
        return state.apply_set(assignments)

    async def _capture_variables(self, names: list[str]) -> None:
        """Read back session variables that were set from an expression, so a restore can set
        the value itself."""
        assert self.backend is not None and self.state is not None
        for name in names:
            try:
                rows = await self.backend.query(f"SELECT @@session.{name}")
            except BackendError as exc:  # the server refused to tell: nothing to restore it from
                self.state.mark_unrestorable(f"could not read back session variable {name}: {exc}")
                continue
            value = rows[0][0] if rows else None
            self.state.variables.pop(name, None)
            self.state.variables[name] = "NULL" if value is None else sql.quote_string(value.decode("utf-8", "surrogateescape"))

    def _register_prepared(self, cmd: Command, tracker: ResponseTracker) -> PreparedStatement:
        prep = tracker.prepare_ok
        assert prep is not None
        client_id = prep.statement_id
        if self.remap_ids:
            client_id = self.next_stmt_id
        self.next_stmt_id = max(self.next_stmt_id, client_id) + 1
        stmt = PreparedStatement(client_id, cmd.payload, prep.num_params, prep.num_columns, prep.statement_id)
        stmt.generation = self.generation
        self.prepared[client_id] = stmt
        return stmt

    # ------------------------------------------------------------------ answering locally

    async def _send_client(self, payload: bytes, seq: int) -> None:
        await self.client.send(encode_packet(payload, seq)[0])

    async def _answer_error(self, cmd: Command, code: int, sqlstate: str, message: str) -> None:
        await self._send_client(make_err(code, sqlstate, message), cmd.seq_end + 1)

    async def _answer_pending(self, cmd: Command) -> None:
        payload, close = self.pending_error  # type: ignore[misc]
        self.pending_error = None
        if not close and cmd.code == C.COM_QUERY and st.first_keyword(cmd.payload, 1) == b"ROLLBACK":
            # The client wants to roll back a transaction that is already gone: that is fine.
            await self._send_client(make_ok(AUTOCOMMIT if self.autocommit else 0), cmd.seq_end + 1)
            return
        await self._send_client(payload, cmd.seq_end + 1)
        if close:
            raise SessionClosed(parse_err(payload).message)

    async def _change_user(self, cmd: Command) -> None:
        """COM_CHANGE_USER: authenticate the new user against the proxy's users, then give the
        session a fresh backend connection logged in as that user."""
        change = parse_change_user(cmd.payload, self.client_caps)
        auth = ServerAuth(self.scramble, self.target.passwords, self.client_address.rsplit(":", 1)[0])
        resp = HandshakeResponse(self.client_caps, 0, change.charset or self.state.collation, change.username,
                                 change.auth_response, change.database, change.auth_plugin, change.connect_attrs)
        user, seq = await self._authenticate(auth, auth.start(resp), cmd.seq_end + 1)
        if user is None:  # like MariaDB: the session goes on as the previous user
            log.warning("session %d: COM_CHANGE_USER to %r refused", self.id, change.username)
            return
        old = self.backend
        self.backend_ok = False
        self._use_backend(None)
        self._backend_replaced = trio.Event()
        if old is not None:
            old.close()
        self.state = SessionState(user, change.database, change.charset or self.state.collation)
        self.login = self._login_for(user, resp)
        self.prepared.clear()
        self.tx.reset()
        self.info.user = user
        self.info.database = change.database
        try:
            self._use_backend(await self._connect_within_window())
        except BackendError as exc:
            await self._send_backend_error(exc, seq)
            raise SessionClosed(f"backend login after COM_CHANGE_USER failed: {exc}") from None
        self.generation += 1
        self.backend_ok = True
        self._backend_replaced.set()
        await self._send_client(make_ok(self.backend.status), seq)

    # ------------------------------------------------------------------ recovery

    async def _recover(self, reason: str, rejected: bool = False) -> None:
        """The backend connection is gone (or going). Decide, reconnect, restore, replay, resend.

        ``rejected``: the server answered the in-flight command with a going-away error, so it
        did not run it."""
        lost_at = trio.current_time()
        old = self.backend
        self.backend_ok = False
        if old is not None:
            old.close()
        inflight = self.inflight
        if inflight is not None and inflight.state == SENDING:
            self._send_settled = trio.Event()
            await self._send_settled.wait()
            self._send_settled = None
        sent = self._sent(inflight, rejected)
        plan = self._plan(inflight, sent)
        self._losses_in_a_row += 1
        if self._losses_in_a_row > 1:
            # Lost again before anything succeeded (a server that accepts connections but
            # refuses every command while it drains): back off instead of spinning.
            rec = self.config.recovery
            await trio.sleep(min(rec.backoff_max, rec.backoff_initial * 2 ** (self._losses_in_a_row - 2)))
            if inflight is not None and trio.current_time() - inflight.arrived >= rec.buffer_window:
                why = f"backend kept failing for {rec.buffer_window:g}s"
                if sent is Sent.MAYBE_EXECUTED or sent is Sent.PARTIAL_RESPONSE:
                    await self._fail_connection(inflight, why)
                plan = Plan(Outcome.FAIL_RETRYABLE, why)
        self.recoveries += 1
        log.warning(
            "session %d (user %s, client %s): backend %s lost: %s; transaction open: %s (%d journaled); in flight: %s; plan: %s (%s)",
            self.id, self.info.user, self.client_address, old.address if old else "-", reason, self.tx.active,
            len(self.tx.entries), self._describe(inflight), plan.outcome.value, plan.reason,
        )
        if self.hooks.backend_lost:
            await self.hooks.notify(self.hooks.backend_lost, self.info, reason)
        if plan.outcome is Outcome.RESUME and (plan.replay or plan.resend) and self.hooks.replay_decided:
            plan = await self._ask_veto(plan) or plan
        if plan.outcome is Outcome.FAIL_CONNECTION:
            await self._fail_connection(inflight, plan.reason)
        if plan.outcome is Outcome.FAIL_RETRYABLE:
            self._fail_retryable_later(plan.reason)
            if inflight is not None:
                await self._answer_inflight_with_pending()
        elif inflight is not None:
            # Resend on the new connection, from a clean slate.
            inflight.state = NOT_SENT
            inflight.tracker = ResponseTracker(inflight.tracker.expect, self.deprecate_eof, inflight.tracker.hashing)
            if inflight.held is not None:
                inflight.held.clear()
        # Past the buffer window, a command that may have run gets a connection error; one that
        # certainly did not run gets 1213.
        may_have_run = sent is Sent.MAYBE_EXECUTED and plan.outcome in (Outcome.RESUME, Outcome.RESOLVE)
        resolved = plan.outcome is not Outcome.RESOLVE
        while True:
            backend = await self._reestablish(inflight if may_have_run else None)
            replayed = 0
            try:
                if not resolved:
                    assert inflight is not None
                    committed = await self._commit_marker_says(backend, old, inflight.marker)
                    resolved = True
                    if committed is None:
                        await self._fail_connection(inflight, "COMMIT was in flight and its commit marker could not be checked")
                    log.warning("session %d: commit marker %d says the COMMIT %s", self.id, inflight.marker,
                                "committed" if committed else "did not commit")
                    if committed:
                        self.tx.reset()
                        self.info.in_transaction = False
                        self.backend_ok = True
                        await self._answer_inflight_ok(inflight)
                        return
                    if not plan.replay:
                        self._fail_retryable_later(f"transaction did not commit and cannot be replayed: {self.tx.not_replayable}")
                        break
                if not (plan.replay and self.tx.active):
                    break
                replayed, mismatch = await self._replay(backend, plan.verify)
                if mismatch is not None:
                    log.warning("session %d: replay stopped: %s; transaction rolled back", self.id, mismatch)
                    if not plan.verify:
                        await self._fail_connection(self.inflight, f"idempotent replay failed: {mismatch}")
                    await backend.query("ROLLBACK")
                    self._fail_retryable_later(f"replay did not reproduce what the client saw: {mismatch}")
                break
            except (PeerClosed, BackendError, ProtocolError) as exc:
                log.warning("session %d: new backend connection lost during replay (%s); reconnecting", self.id, exc)
                backend.close()
        self.backend_ok = True
        waited = trio.current_time() - lost_at
        current = self.inflight
        log.warning(
            "session %d: recovered on %s (connection %d) after %.0f ms; replayed %d statement(s)%s",
            self.id, backend.address, backend.connection_id, waited * 1000, replayed,
            "; sending the waiting command" if current is not None and current.state == NOT_SENT else "",
        )
        if self.hooks.backend_recovered:
            await self.hooks.notify(
                self.hooks.backend_recovered, self.info,
                {"reason": reason, "plan": plan.outcome.value, "replayed": replayed, "waited": waited},
            )
        if current is not None and current.state == NOT_SENT:
            if self.pending_error is not None:
                await self._answer_inflight_with_pending()
            else:
                await self._send_inflight(current)

    def _sent(self, inflight: Inflight | None, rejected: bool) -> Sent | None:
        if inflight is None:
            return None
        if inflight.forwarded:
            return Sent.PARTIAL_RESPONSE
        if inflight.state in (NOT_SENT, SEND_FAILED):
            return Sent.NOT_EXECUTED
        if rejected and not self._facts_of_inflight(inflight).commits:
            return Sent.NOT_EXECUTED  # a statement refused with 1053/1927 did not run (a COMMIT: unknown)
        return Sent.MAYBE_EXECUTED

    def _plan(self, inflight: Inflight | None, sent: Sent | None) -> Plan:
        rec = self.config.recovery
        state = self.state
        if not rec.enabled:
            return Plan(Outcome.FAIL_CONNECTION, "recovery is disabled for this target")
        return plan_recovery(
            sent=sent,
            inflight=self._facts_of_inflight(inflight) if inflight is not None else None,
            in_transaction=self.tx.active,
            journal=[self._facts(e.payload, e.statement) for e in self.tx.entries] if self.tx.active else [],
            not_replayable=self.tx.not_replayable,
            unrestorable=state.unrestorable if state else None,
            autocommit=self.autocommit,
            safe_mode=self._safe_mode,
            commit_marker=inflight is not None and inflight.marker > 0,
        )

    def _facts_of_inflight(self, inflight: Inflight) -> StatementFacts:
        return self._facts(inflight.command.payload, inflight.statement, inflight.command.complete)

    def _facts(self, payload: bytes, stmt: PreparedStatement | None, complete: bool = True) -> StatementFacts:
        code = payload[0]
        if code in _SESSION_ONLY_COMMANDS:
            return StatementFacts(writes=False, idempotent=True, session_only=True)
        if code == C.COM_STMT_EXECUTE:
            if stmt is None:
                return StatementFacts()
            text = stmt.prepare_payload[1:].decode("utf-8", "surrogateescape")
        elif code == C.COM_QUERY:
            text = payload[1:].decode("utf-8", "surrogateescape")
        else:
            return StatementFacts()
        c = sql.classify(text, no_backslash_escapes=self.nbe)
        kind = c.kind
        session_only = kind in (sql.Kind.SET, sql.Kind.USE)
        writes = not (c.read_only or session_only or kind in (sql.Kind.BEGIN, sql.Kind.COMMIT, sql.Kind.ROLLBACK))
        # Idempotency only matters in safe mode (and is slow on huge statements); the head of a
        # spooled statement says nothing about its rows.
        idempotent = self._safe_mode and complete and (not writes or self._is_idempotent(text))
        return StatementFacts(
            commits=kind == sql.Kind.COMMIT or c.implicit_commit,
            rollback=kind == sql.Kind.ROLLBACK,
            writes=writes,
            idempotent=idempotent,
            session_only=session_only,
        )

    def _is_idempotent(self, text: str) -> bool:
        if self.hooks.is_idempotent:
            for _name, fn, is_async in self.hooks.is_idempotent.impls:
                if is_async:
                    continue
                try:
                    answer = fn(self.info, text)
                except Exception:
                    log.exception("session %d: is_idempotent hook failed; treating statement as not idempotent", self.id)
                    return False
                if answer is not None:
                    return bool(answer)
        return sql.is_idempotent(text, no_backslash_escapes=self.nbe)

    async def _ask_veto(self, plan: Plan) -> Plan | None:
        for name, fn, is_async in self.hooks.replay_decided.impls:
            try:
                answer = (await fn(self.info, plan)) if is_async else fn(self.info, plan)
            except Exception:
                log.exception("session %d: replay_decided hook of %s failed; treating as veto", self.id, name)
                answer = Veto(f"plugin {name} failed")
            if isinstance(answer, Veto):
                log.warning("session %d: plugin %s vetoed the replay: %s", self.id, name, answer.reason)
                if plan.verify and self.tx.active:  # COMMIT was not in flight: known not committed
                    return Plan(Outcome.FAIL_RETRYABLE, f"replay vetoed by plugin {name}: {answer.reason}")
                return Plan(Outcome.FAIL_CONNECTION, f"replay vetoed by plugin {name}: {answer.reason}")
        return None

    def _describe(self, inflight: Inflight | None) -> str:
        if inflight is None:
            return "nothing"
        cmd = inflight.command
        what = CommandInfo(cmd.code, b"").name
        if cmd.code == C.COM_QUERY:
            what += " " + repr(cmd.payload[1:61].decode("utf-8", "replace"))
        states = {NOT_SENT: "not sent", SENDING: "sending", SENT: "sent", SEND_FAILED: "send failed"}
        return f"{what} ({states[inflight.state]}{', partly answered' if inflight.forwarded else ''})"

    def _fail_retryable_later(self, reason: str) -> None:
        """The open transaction is lost and known not committed: the client hears 1213 (for the
        in-flight command, or its next one)."""
        self.tx.reset()
        self.info.in_transaction = False
        msg = f"Deadlock found when trying to get lock; try restarting transaction (replay-proxy: backend connection lost, {reason})"
        self.pending_error = (make_err(*Err.LOCK_DEADLOCK, msg), False)

    async def _answer_inflight_with_pending(self) -> None:
        inflight = self.inflight
        assert inflight is not None and self.pending_error is not None
        payload, close = self.pending_error
        self.pending_error = None
        self.inflight = None
        inflight.answered = True
        inflight.command.release()
        seq = (inflight.tracker.last_seq if inflight.forwarded else inflight.command.seq_end) + 1
        try:
            await self._send_client(payload, seq)
        finally:
            if inflight.done is not None:
                inflight.done.set()
        if close:
            raise SessionClosed(parse_err(payload).message)

    async def _fail_connection(self, inflight: Inflight | None, reason: str) -> None:
        """Outcome unknown or state unrecoverable: tell the client (now, or at its next command)
        and end the session."""
        address = self.backend.address if self.backend else "-"
        msg = f"Lost connection to backend {address} during query (replay-proxy: {reason})"
        self.pending_error = (make_err(*Err.SERVER_LOST, msg), True)
        log.error("session %d: %s", self.id, msg)
        if inflight is not None:
            await self._answer_inflight_with_pending()
        # Idle client: it hears the error at its next command; nothing more to do here.
        await trio.sleep_forever()

    async def _reestablish(self, may_have_run: Inflight | None) -> Backend:
        """Reconnect (with backoff) and restore the session. While the backend stays away, a
        waiting command gets an error after buffer_window: a connection error if it may have
        run already (``may_have_run``), else 1213."""
        rec = self.config.recovery
        state = self.tx.session_before if (self.tx.active and self.tx.session_before) else self.state
        assert state is not None and self.login is not None
        delays = backoff_delays(rec.backoff_initial, rec.backoff_max)
        attempts = 0
        old = self.backend
        while True:
            attempts += 1
            login = attrs.evolve(self.login, database=state.database, collation=state.collation)
            try:
                backend = await self.target.connect(login, fresh=True)
                self._use_backend(backend)
                self.generation += 1
                await self._restore(backend, state, old)
                self.info.backend_address = str(backend.address)
                return backend
            except BackendError as exc:
                if not exc.retryable:
                    await self._fail_connection(self.inflight, f"cannot restore the session: {exc}")
                error = exc
            except (PeerClosed, ProtocolError, OSError) as exc:
                error = BackendError(str(exc), retryable=True)
            if attempts == 1 or attempts % 20 == 0:
                log.warning("session %d: reconnect attempt %d failed: %s", self.id, attempts, error)
            inflight = self.inflight
            if inflight is not None and trio.current_time() - inflight.arrived >= rec.buffer_window:
                why = f"backend unavailable for {rec.buffer_window:g}s (last error: {error})"
                if inflight is may_have_run:
                    await self._fail_connection(inflight, why)
                self._fail_retryable_later(why)
                await self._answer_inflight_with_pending()
            await trio.sleep(next(delays))

    async def _restore(self, backend: Backend, state: SessionState, old: Backend | None) -> None:
        """Make the new connection look like the old session: variables, prepared statements;
        and free the old session's locks if it may still be alive."""
        if old is not None and self.config.recovery.kill_old_session:
            await self._kill_if_alive(backend, old)
        for statement in state.restore_statements():
            await backend.query(statement)
        for stmt in list(self.prepared.values()):
            await self._prepare_on(backend, stmt)

    async def _restarted_since(self, backend: Backend, old: Backend) -> bool | None:
        """Has the server restarted since ``old`` connected? None when the proxy cannot tell
        (another address, no uptime, too close to call)."""
        if backend.address != old.address:
            return None
        try:
            rows = await backend.query("SHOW GLOBAL STATUS LIKE 'Uptime'")
            uptime = float(rows[0][1])
        except (BackendError, ValueError, IndexError, TypeError):
            return None
        age = trio.current_time() - old.connected_at
        if uptime < age - 2:
            return True
        if uptime > age + 2:
            return False
        return None

    async def _kill_if_alive(self, backend: Backend, old: Backend) -> None:
        """KILL the old connection id, but only on the same server instance: after a restart
        the id may belong to someone else."""
        if await self._restarted_since(backend, old) is False:
            try:
                await backend.query(f"KILL {int(old.connection_id)}")
                log.info("session %d: killed old backend connection %d", self.id, old.connection_id)
            except BackendError:
                pass  # already gone

    async def _commit_marker_says(self, backend: Backend, old: Backend | None, number: int) -> bool | None:
        """Did the in-doubt COMMIT (marker ``number``) commit? None when it cannot be known:
        the old connection might still be alive and commit later."""
        if old is None or not await self._old_session_gone(backend, old):
            return None
        table = self.config.recovery.marker_table
        rows = await backend.query(f"SELECT txn FROM {table} WHERE slot = X'{self.marker_slot}'")
        stored = int(rows[0][0]) if rows and rows[0][0] is not None else 0
        return stored >= number

    async def _old_session_gone(self, backend: Backend, old: Backend) -> bool:
        """Is the old connection certainly dead, so its COMMIT cannot still land?"""
        if backend.address != old.address:
            return False  # another server: nothing here can prove it
        restarted = await self._restarted_since(backend, old)
        if restarted:
            return True
        conn_id = int(old.connection_id)
        if restarted is False:  # same server instance: the id is still ours to KILL
            try:
                await backend.query(f"KILL {conn_id}")
            except BackendError:
                pass  # unknown thread: gone already
        # Ambiguous uptime: no KILL (the id might be someone else's now), only one look.
        deadline = trio.current_time() + (self.config.backend.io_timeout if restarted is False else 0)
        while True:
            rows = await backend.query(f"SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = {conn_id}")
            if rows and rows[0][0] == b"0":
                return True
            if trio.current_time() >= deadline:
                return False
            await trio.sleep(0.1)

    async def _answer_inflight_ok(self, inflight: Inflight) -> None:
        """The in-doubt COMMIT did commit: tell the client so."""
        self.inflight = None
        inflight.answered = True
        inflight.command.release()
        try:
            await self._send_client(make_ok(AUTOCOMMIT if self.autocommit else 0), inflight.command.seq_end + 1)
        finally:
            if inflight.done is not None:
                inflight.done.set()

    async def _prepare_on(self, backend: Backend, stmt: PreparedStatement) -> None:
        tracker = await backend.exchange(encode_packet(stmt.prepare_payload, 0)[0], Expect.PREPARE)
        if tracker.error is not None or tracker.prepare_ok is None:
            raise BackendError(f"re-preparing statement {stmt.client_id} failed: {tracker.error}", retryable=False)
        stmt.backend_id = tracker.prepare_ok.statement_id
        stmt.generation = self.generation
        stmt.types_bound_on_backend = False
        if stmt.backend_id != stmt.client_id:
            self.remap_ids = True
        for payload in stmt.long_data:
            await backend.channel.send(self._backend_bytes(payload, None, stmt))

    async def _replay(self, backend: Backend, verify: bool) -> tuple[int, str | None]:
        """Run the journal of the open transaction on the new connection."""
        tx = self.tx
        entries = list(tx.entries)
        if tx.prefix:
            await backend.query(tx.prefix)
        first = entries[0].payload if entries else b""
        if not (first[:1] == b"\x03" and st.first_keyword(first, 1) in (b"BEGIN", b"START")):
            await backend.query("START TRANSACTION")
        temporary: list[PreparedStatement] = []
        count = 0
        try:
            for entry in entries:
                stmt = entry.statement
                if stmt is not None and stmt.generation != self.generation:
                    await self._prepare_on(backend, stmt)  # closed by the client since; needed again
                    temporary.append(stmt)
                for payload in entry.long_data or ():
                    await backend.channel.send(self._backend_bytes(payload, None, stmt))
                data_payload = entry.payload
                tracker = await backend.exchange(self._backend_bytes(data_payload, None, stmt), entry.expect, True)
                count += 1
                if verify and entry.fingerprint is not None and tracker.fingerprint != entry.fingerprint:
                    return count, f"statement {count} of {len(entries)} returned a different result"
                if not verify and tracker.error is not None:
                    return count, f"statement {count} of {len(entries)} failed on replay: {tracker.error}"
        finally:
            for stmt in temporary:
                if stmt.client_id not in self.prepared:
                    await backend.channel.send(encode_packet(b"\x19" + struct.pack("<I", stmt.backend_id), 0)[0])
        return count, None


_SHOW_WARNINGS = re.compile(rb"\s*SHOW\s+WARNINGS\s*;?\s*$", re.I)
_AT_ROW = re.compile(rb"(at row )(\d+)")
_MAX_ERROR_COUNT = 64  # the server keeps at most @@max_error_count (default 64) warnings


class _MergedWarnings:
    """SHOW WARNINGS rows of all pieces of a split statement, numbered as in the whole one."""

    def __init__(self) -> None:
        self.coldefs: list[bytes] = []
        self.rows: list[list[bytes | None]] = []
        self.rows_before = 0  # rows of the statement in earlier pieces

    def add(self, coldefs: list[bytes], rows: list[list[bytes | None]]) -> None:
        self.coldefs = self.coldefs or coldefs
        offset = self.rows_before
        for level, code, message in rows:
            if message is not None and offset:
                message = _AT_ROW.sub(lambda m: m.group(1) + str(int(m.group(2)) + offset).encode(), message)
            if len(self.rows) < _MAX_ERROR_COUNT:
                self.rows.append([level, code, message])


_KILL = re.compile(rb"\s*KILL\s+((?:CONNECTION\s+|QUERY\s+)?)(\d+)\s*;?\s*$", re.I)
_ASKS_MAX_PACKET = re.compile(rb"\s*SELECT\s+@@(?:session\.)?max_allowed_packet\s*;?\s*$", re.I)


def _split_statements(text: str, nbe: bool) -> list[str]:
    """Split at top-level semicolons (the lexer skips those inside literals and comments)."""
    pieces, start = [], 0
    for token in sql.iter_tokens(text, no_backslash_escapes=nbe):
        if token.kind is sql.TokenKind.PUNCT and token.text == ";":
            pieces.append(text[start : token.start])
            start = token.end
    pieces.append(text[start:])
    return [p for p in pieces if p.strip()]


def _first_cause(group: BaseExceptionGroup) -> BaseException:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            exc = _first_cause(exc)
        if not isinstance(exc, trio.Cancelled):
            return exc
    return group.exceptions[0]


def _describe_unsolicited(data: bytes) -> str:
    if len(data) > 5 and data[4] == ERR_HEADER:
        try:
            return str(parse_err(data[4 : 4 + (data[0] | data[1] << 8 | data[2] << 16)]))
        except ProtocolError:
            pass
    return f"{len(data)} unexpected byte(s)"
