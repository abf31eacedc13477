"""What the server's side of a session looks like, learned from the commands it completed.

``SessionTracker`` is sans-IO: the relay tells it each command that completed (with the
response tracker that read the answer), and it keeps

- the open transaction and its journal (``tx``),
- the replayable session state (``state``: database, SET variables, ...),
- the prepared statements and how their ids map to the backend's,
- autocommit and NO_BACKSLASH_ESCAPES from the status words,
- ``info``, what plugins see of the session: the tracker is its only writer.

It also answers the questions recovery asks about statements (``facts``).
"""

from __future__ import annotations

from typing import Protocol

from proxy import statements as st
from proxy.hooks import SessionInfo
from proxy.protocol import sql
from proxy.protocol.constants import Commands, ServerStatus
from proxy.protocol.response import ResponseTracker
from proxy.recovery import StatementFacts
from proxy.session import PreparedStatement, SessionState, parse_use
from proxy.transaction import JournalEntry, Transaction

__all__ = ["SessionTracker", "IN_TRANS", "AUTOCOMMIT", "SESSION_ONLY_COMMANDS", "CONNECTION_FATAL"]

C = Commands
# Plain ints, not IntFlag: flag arithmetic on enums is slow and this is the hot path.
IN_TRANS = int(ServerStatus.SERVER_STATUS_IN_TRANS)
AUTOCOMMIT = int(ServerStatus.SERVER_STATUS_AUTOCOMMIT)
NO_BACKSLASH_ESCAPES = int(ServerStatus.SERVER_STATUS_NO_BACKSLASH_ESCAPES)

# Errors after which the server closes the connection (1153: packet too large; going away).
CONNECTION_FATAL = frozenset({1153, 1053, 1927})

# Commands that change nothing but session-level state (never data).
SESSION_ONLY_COMMANDS = frozenset(
    {
        C.COM_PING, C.COM_INIT_DB, C.COM_STMT_PREPARE, C.COM_STMT_CLOSE, C.COM_STMT_RESET, C.COM_STMT_SEND_LONG_DATA,
        C.COM_FIELD_LIST, C.COM_STATISTICS, C.COM_SET_OPTION, C.COM_RESET_CONNECTION, C.COM_PROCESS_INFO,
    }
)


class Completed(Protocol):
    """A command whose response is complete (``relay.inflight.Inflight``)."""

    command: object  # intake.Command
    tracker: ResponseTracker
    statement: PreparedStatement | None
    keyword: bytes


class SessionTracker:
    def __init__(
        self,
        info: SessionInfo,
        journal_max_bytes: int,
        journal_max_statements: int,
        safe_mode: bool = False,
    ) -> None:
        self.info = info
        self.tx = Transaction(journal_max_bytes, journal_max_statements)
        self.state: SessionState | None = None
        self.autocommit = True
        self.nbe = False  # sql_mode NO_BACKSLASH_ESCAPES, from the status word: changes how SQL lexes
        self.prepared: dict[int, PreparedStatement] = {}
        self.remap_ids = False  # once a reconnect renumbered statements, the proxy numbers them
        self.next_stmt_id = 1
        self.generation = 0  # bumped for every new backend connection
        self.safe_mode = safe_mode  # recovery.idempotent = "safe-mode": idempotence is asked

    # ------------------------------------------------------------------ what plugins see

    def logged_in(self, user: str, database: str | None, collation: int, status: int) -> None:
        """A (new) login: the session starts over as ``user``."""
        self.state = SessionState(user, database, collation)
        self.info.user = user
        self.info.database = database
        self.autocommit = bool(status & AUTOCOMMIT)
        self.prepared.clear()
        self._end_transaction()

    def backend_changed(self, address: str) -> None:
        self.generation += 1
        self.info.backend_address = address

    def set_multi_statements(self, on: bool) -> None:
        self.info.multi_statements = on

    def status_word(self) -> int:
        """The status word for an answer the proxy gives itself, as the server would set it."""
        return (IN_TRANS if self.tx.active else 0) | (AUTOCOMMIT if self.autocommit else 0)

    def wants_fingerprint(self, keyword: bytes) -> bool:
        """Is the response to this command journaled (and so worth fingerprinting)?"""
        return self.tx.active or not self.autocommit or keyword in st.TX_CONTROL

    def transaction_lost(self) -> None:
        """The open transaction died with the backend connection (and will not be replayed)."""
        self._end_transaction()

    def _end_transaction(self) -> None:
        self.tx.reset()
        self.info.in_transaction = False

    # ------------------------------------------------------------------ completed commands

    def completed(self, done: Completed) -> list[str]:
        """Record what a completed command did to the session and the transaction. Returns the
        session variables whose new values must be read back from the server."""
        captures = self._bookkeep(done)
        self.info.in_transaction = self.tx.active
        return captures

    def _bookkeep(self, done: Completed) -> list[str]:
        cmd = done.command
        tracker = done.tracker
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
            keyword = done.keyword
            if tracker.results > 1 or (tracker.error is not None and tracker.results):
                captures = self._note_multi_statement(cmd, tracker.results)
            else:
                if keyword in st.TX_CONTROL or keyword in st.IMPLICIT_COMMIT:
                    ends_tx = ok and self._ends_transaction(cmd.payload, keyword)
                if ok and (keyword in st.SESSION_CHANGE or st.may_pin_session(keyword, cmd.payload)):
                    captures = self._note_statement(cmd.text(), keyword, cmd.payload)
        elif code == C.COM_STMT_EXECUTE:
            stmt = done.statement
            if stmt is not None:
                long_data = stmt.long_data
                stmt.long_data, stmt.long_data_bytes = [], 0
                if len(cmd.payload) > 5 and cmd.payload[5] & 0x07:
                    state.mark_unrestorable("a server-side cursor was opened")
                if self.tx.active or (tracker.saw_status and tracker.status & IN_TRANS):
                    ends_tx = self._statement_ends_transaction(stmt)
                self._journal(done, ends_tx, long_data)
            return captures
        elif code == C.COM_STMT_PREPARE:
            if ok and tracker.prepare_ok is not None:
                done.statement = self._register_prepared(cmd.payload, tracker)
            return captures
        elif code == C.COM_STMT_CLOSE:
            if done.statement is not None:
                self.prepared.pop(done.statement.client_id, None)
            return captures
        elif code == C.COM_STMT_RESET:
            if ok and done.statement is not None:
                done.statement.long_data, done.statement.long_data_bytes = [], 0
            return captures
        elif code == C.COM_STMT_FETCH:
            self.tx.mark_not_replayable("server-side cursor fetch")
            return captures
        elif code == C.COM_INIT_DB:
            if ok:
                self.tx.note_session_change(state)
                self._use(cmd.payload[1:].decode("utf-8", "surrogateescape"))
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
        elif code in SESSION_ONLY_COMMANDS or code == C.COM_STMT_SEND_LONG_DATA:
            return captures
        self._journal(done, ends_tx, None)
        return captures

    def _use(self, database: str) -> None:
        assert self.state is not None
        self.state.database = database
        self.info.database = database

    def _journal(self, done: Completed, ends_tx: bool, long_data: list[bytes] | None) -> None:
        tracker = done.tracker
        tx = self.tx
        if tracker.error is not None:
            if tracker.error.code == 1213:
                tx.reset()  # deadlock: the server rolled the whole transaction back
                return
            if tracker.error.code in CONNECTION_FATAL:
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
            if ends_tx and done.keyword in (b"COMMIT", b"ROLLBACK"):
                return  # ... AND CHAIN: the new transaction starts empty
        cmd = done.command
        if not cmd.complete:
            tx.mark_not_replayable(f"a statement of {cmd.size} bytes is larger than the journal keeps")
            return
        fingerprint = tracker.fingerprint if tracker.hashing else None
        tx.record(JournalEntry(cmd.payload, tracker.expect, fingerprint, done.statement, long_data or None))

    def _ends_transaction(self, payload: bytes, keyword: bytes) -> bool:
        """Does this accepted statement end the open transaction (commit, rollback, implicit
        commit) even if IN_TRANS stays set afterwards (a new transaction began)?"""
        if keyword in st.IMPLICIT_COMMIT:
            # CREATE TEMPORARY TABLE and a few others do not commit; the classifier knows.
            return self._classify(payload).implicit_commit
        if keyword in (b"BEGIN", b"COMMIT") or (keyword == b"START" and b"TRANSACTION" in payload[:64].upper()):
            return True
        if keyword == b"ROLLBACK":
            return self._classify(payload).kind == sql.Kind.ROLLBACK
        if keyword == b"XA":
            self.tx.mark_not_replayable("XA transaction")
        return False

    def _classify(self, payload: bytes) -> sql.Statement:
        return sql.classify(payload[1:].decode("utf-8", "surrogateescape"), no_backslash_escapes=self.nbe)

    def _statement_ends_transaction(self, stmt: PreparedStatement) -> bool:
        if stmt.ends_transaction is None:  # decided once per statement, not per execute
            keyword = st.first_keyword(stmt.prepare_payload, 1)
            stmt.ends_transaction = (keyword in st.TX_CONTROL or keyword in st.IMPLICIT_COMMIT) and self._ends_transaction(
                stmt.prepare_payload, keyword
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

    def _note_multi_statement(self, cmd, ran: int) -> list[str]:
        """Several statements in one COM_QUERY (CLIENT_MULTI_STATEMENTS): apply the session
        effects of the ``ran`` statements the server completed. Transaction control inside one
        is not tracked statement by statement, so such a transaction is not replayable."""
        try:
            pieces = sql.split_statements(cmd.text(), no_backslash_escapes=self.nbe)
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
                self._use(db)
            return []
        assignments = sql.parse_set(text, no_backslash_escapes=self.nbe)
        if not assignments:
            return []
        self.tx.note_session_change(state)
        return state.apply_set(assignments)

    def captured(self, name: str, value: bytes | None) -> None:
        """The server's value of a session variable that was set from an expression."""
        assert self.state is not None
        self.state.variables.pop(name, None)
        self.state.variables[name] = "NULL" if value is None else sql.quote_string(value.decode("utf-8", "surrogateescape"))

    # ------------------------------------------------------------------ prepared statements

    def statement_of(self, payload: bytes) -> PreparedStatement | None:
        """The prepared statement a COM_STMT_* payload names (by the client's id)."""
        return self.prepared.get(int.from_bytes(payload[1:5], "little")) if len(payload) >= 5 else None

    def _register_prepared(self, payload: bytes, tracker: ResponseTracker) -> PreparedStatement:
        prep = tracker.prepare_ok
        assert prep is not None
        client_id = prep.statement_id
        if self.remap_ids:
            client_id = self.next_stmt_id
        self.next_stmt_id = max(self.next_stmt_id, client_id) + 1
        stmt = PreparedStatement(client_id, payload, prep.num_params, prep.num_columns, prep.statement_id)
        stmt.generation = self.generation
        self.prepared[client_id] = stmt
        return stmt

    def reprepared(self, stmt: PreparedStatement, backend_id: int) -> None:
        """``stmt`` was prepared again on the current backend connection as ``backend_id``."""
        stmt.backend_id = backend_id
        stmt.generation = self.generation
        stmt.types_bound_on_backend = False
        if backend_id != stmt.client_id:
            self.remap_ids = True

    # ------------------------------------------------------------------ recovery's questions

    @staticmethod
    def text_of(payload: bytes, stmt: PreparedStatement | None) -> str | None:
        """The SQL text a COM_QUERY runs, or a COM_STMT_EXECUTE (of ``stmt``); else None."""
        code = payload[0]
        if code == C.COM_QUERY:
            return payload[1:].decode("utf-8", "surrogateescape")
        if code == C.COM_STMT_EXECUTE and stmt is not None:
            return stmt.prepare_payload[1:].decode("utf-8", "surrogateescape")
        return None

    def facts(
        self, payload: bytes, stmt: PreparedStatement | None, complete: bool = True, idempotent: bool | None = None
    ) -> StatementFacts:
        """What recovery needs to know about one command of the session. ``idempotent``: a
        plugin's answer to the safe-mode question (None: the built-in rules decide)."""
        if payload[0] in SESSION_ONLY_COMMANDS:
            return StatementFacts(writes=False, idempotent=True, session_only=True)
        text = self.text_of(payload, stmt)
        if text is None:
            return StatementFacts()
        c = sql.classify(text, no_backslash_escapes=self.nbe)
        kind = c.kind
        session_only = kind in (sql.Kind.SET, sql.Kind.USE)
        writes = not (c.read_only or session_only or kind in (sql.Kind.BEGIN, sql.Kind.COMMIT, sql.Kind.ROLLBACK))
        # Idempotency only matters in safe mode (and is slow on huge statements); the head of a
        # spooled statement says nothing about its rows.
        if not (self.safe_mode and complete):
            idempotent = False
        elif not writes:
            idempotent = True
        elif idempotent is None:
            idempotent = sql.is_idempotent(text, no_backslash_escapes=self.nbe)
        return StatementFacts(
            commits=kind == sql.Kind.COMMIT or c.implicit_commit,
            rollback=kind == sql.Kind.ROLLBACK,
            writes=writes,
            idempotent=idempotent,
            session_only=session_only,
        )

