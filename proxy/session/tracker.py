"""What the server's side of a session looks like, learned from the commands it completed
(``SessionTracker``, sans-IO: the relay tells it each command that completed, with the response
tracker that read the answer).

Transaction state comes from the IN_TRANS bit of every status word plus what each statement
does (``proxy.sqltext.analyze``, every statement of the text). An ERR has no status word: when
the failed statement may have ended the transaction (an implicit commit happens before a DDL
fails; an error may roll the transaction back), the tracker waits for the next status word
(``pending``) and, where even that cannot tell, keeps the transaction "in doubt" -- a loss
then is a connection error, never a replay or a "retry".

What recovery needs to know about a statement is read from it by ``proxy.recovery.facts``.
"""

from __future__ import annotations

from typing import Final

import attrs

from proxy.protocol.constants import Commands as C
from proxy.protocol.constants import ServerStatus
from proxy.protocol.resultset import Column
from proxy.session.completed import FAST_STATEMENTS, SESSION_ONLY_COMMANDS, Completed
from proxy.session.info import SessionInfo
from proxy.session.insertid import follow_insert_id
from proxy.session.longdata import LongDataSpool, Piece
from proxy.session.prepared import PreparedStatements
from proxy.session.state import SessionState, session_variable_literal, user_variable_literal
from proxy.session.transaction import CONNECTION_FATAL, PARSE_ERRORS, ROLLS_BACK, STATEMENT_ERRORS, JournalEntry, Transaction
from proxy.sqltext import Analysis, Dialect, Kind, ServerReading, SqlParseError, Statement, classify, parse_set
from proxy.sqltext.triage import fast_verb, may_pin_session

__all__ = ["SessionTracker", "IN_TRANS", "AUTOCOMMIT", "SESSION_ONLY_COMMANDS", "CONNECTION_FATAL"]

# Plain ints, not IntFlag: flag arithmetic on enums is slow and this is the hot path.
IN_TRANS: Final = int(ServerStatus.SERVER_STATUS_IN_TRANS)
AUTOCOMMIT: Final = int(ServerStatus.SERVER_STATUS_AUTOCOMMIT)
NO_BACKSLASH_ESCAPES: Final = int(ServerStatus.SERVER_STATUS_NO_BACKSLASH_ESCAPES)

_JUDGED_TEXTS: Final = 64  # short texts whose judgement a session keeps (its BEGIN, COMMIT, SET...)
_JUDGED_TEXT: Final = 256  # bytes, at most

_NO_TRANSACTION_EFFECT: Final = frozenset({Kind.INSERT, Kind.REPLACE, Kind.UPDATE, Kind.DELETE, Kind.SELECT})


@attrs.frozen
class Pending:
    """An ERR left the transaction's fate open; the next status word settles it."""

    may_have_committed: bool  # the failed statement commits before it runs (or runs code)
    reason: str


@attrs.frozen
class Orphaned:
    """What a takeover knows of a session whose worker died holding its backend connection
    (``proxy.handover.takeover``, from the session's record): its transaction's journal and the
    state since the supervisor's copy died with the worker."""

    why: str
    in_transaction: bool
    wrote: bool  # the open transaction wrote
    pending: Pending | None  # an ERR had left the transaction's fate open
    xa: str | None
    insert_id_moved: bool  # LAST_INSERT_ID() moved since the supervisor's copy
    long_data_lost: bool  # long data for an execute to come was kept by the worker that died


class SessionTracker:
    """The only writer of a session's model. It holds

    - ``tx``: the open transaction and its journal; ``pending`` and ``xa``, what an ERR left open
      and the XA state;
    - ``state``: the replayable session state (database, SET variables, LAST_INSERT_ID, ...);
    - ``statements``: the prepared statements and how their ids map to the backend connection's
      (``PreparedStatements``; the relay and recovery call its methods by the same names here);
    - ``long_data``: the session's spool of COM_STMT_SEND_LONG_DATA (statements' and journal's);
    - ``autocommit`` (from the status words) and ``reading``, how the server reads the text:
      dialect, NO_BACKSLASH_ESCAPES, multi-statements;
    - ``info``, what plugins see of the session, kept up to date here."""

    def __init__(self, info: SessionInfo, journal_max_bytes: int, journal_max_statements: int, safe_mode: bool = False,
                 long_data: LongDataSpool | None = None) -> None:  # fmt: skip
        self.info = info
        # COM_STMT_SEND_LONG_DATA kept to be sent again (statements' pending ones, the journal's)
        self.long_data = long_data or LongDataSpool(4 << 20, 256 << 20)
        self.tx = Transaction(journal_max_bytes, journal_max_statements, release=self.long_data.release)
        self.state: SessionState | None = None
        self.autocommit = True
        # How the server reads the session's text: the backend's dialect (from its greeting),
        # NO_BACKSLASH_ESCAPES (from the status words), multi-statements (the handshake,
        # COM_SET_OPTION). Kept here only; ``info`` shows it to plugins. ``multi``: its
        # multi-statements, read per statement; ``_judged``: short texts judged with it.
        self.reading = info.reading
        self.multi = self.reading.multi
        self._judged: dict[bytes, Analysis] = {}
        self.in_transaction_shown = False  # what ``info`` says
        self.pending: Pending | None = None
        self.xa: str | None = None  # XA state: ACTIVE / IDLE / PREPARED (None: no XA transaction)
        self.statements = statements = PreparedStatements(self.long_data)  # and their ids on the backend connection
        # What the relay and recovery ask the tracker about prepared statements, answered by ``statements``.
        self.prepared = statements.prepared
        self.statement_of = statements.statement_of
        self.long_data_received = statements.long_data_received
        self.long_data_dropped = statements.long_data_dropped
        self.long_data_frames = statements.long_data_frames
        self.backend_bytes = statements.backend_bytes
        self.backend_frames = statements.backend_frames
        self.backend_ids = statements.backend_ids
        self.restore_backend_ids = statements.restore_backend_ids
        self.reprepared = statements.reprepared
        self.safe_mode = safe_mode  # recovery.idempotent = "safe-mode": idempotence is asked
        # What another process would need to run the session changed (its state, statements,
        # reading, backend connection) since ``mirrored()``: a worker tells its supervisor
        # (``proxy.handover.mirror``) before the client hears of the change.
        self.changed = False
        statements.on_change = self._changed
        # LAST_INSERT_ID() moved since ``mirrored()`` (not worth a message per INSERT: a worker
        # taking the session over knows it is not restorable then, ``proxy.handover.slot``).
        self.insert_id_moved = False
        # The session's own wait_timeout (a SET made it), or None: the server's counts (read per
        # statement by the fast lane, kept from ``state`` by ``_state_changed``).
        self.session_wait: float | None = None

    def _changed(self) -> None:
        self.changed = True

    def _state_changed(self) -> None:
        """The session's variables changed: what is read of them per statement follows."""
        state = self.state
        self.session_wait = state.wait_timeout(None) if state is not None else None

    def mirrored(self) -> None:
        """Another process has the session's state as it is now."""
        self.changed = self.insert_id_moved = False

    # ------------------------------------------------------------------ what plugins see

    def logged_in(self, user: str, database: str | None, collation: int, status: int) -> None:
        """A (new) login: the session starts over as ``user``."""
        self.state = SessionState(user, database, collation)
        self._state_changed()
        self.changed = True
        self.info._user = user
        self.info._database = database
        self.autocommit = bool(status & AUTOCOMMIT)
        self.statements.forget()
        self._end_transaction()

    def restore(self, state: SessionState, autocommit: bool, reading: ServerReading, prepared: dict,
                transaction: dict | None, orphaned: Orphaned | None = None) -> None:  # fmt: skip
        """The session as another process had it -- an upgrade's hand-over (with its open
        transaction's journal), or a takeover after its worker died (``orphaned``) -- on the
        backend connection the link has now (``backend_changed`` came first)."""
        self.logged_in(state.username, state.database, state.collation, AUTOCOMMIT if autocommit else 0)
        self.state = state
        self._state_changed()
        self.autocommit = autocommit
        self.adopt_reading(reading)
        self.statements.adopt(prepared, self.analyze)
        if transaction is not None:
            self.tx.adopt(transaction, self.prepared)
        if orphaned is not None:
            if orphaned.insert_id_moved:  # since the supervisor's copy: not known here
                state.insert_id_unknown = True
            if orphaned.in_transaction:
                self.tx.start(None)
                self.tx.writes = orphaned.wrote
                self.tx.mark_not_replayable(f"{orphaned.why}: the journal of its transaction went with it")
            self.pending = orphaned.pending
            self.xa = orphaned.xa
            if orphaned.long_data_lost:
                self.mark_unrestorable("long data (COM_STMT_SEND_LONG_DATA) for an execute to come was kept by the worker that died")
        self.info._in_transaction = self.in_transaction_shown = self.tx.active

    def backend_changed(self, address: str, server_version: str) -> None:
        self.changed = True
        self.statements.new_backend()
        self.info._backend_address = address
        self._read(dialect=Dialect.from_server_version(server_version))

    @property
    def generation(self) -> int:
        """Which backend connection is in use (bumped by ``backend_changed``)."""
        return self.statements.generation

    def adopt_reading(self, reading: ServerReading) -> None:
        """The reading the session had in the process it moved from (an upgrade); the one
        writer of ``reading``, and of what is kept of it (a texts' judgements made with another
        reading are forgotten)."""
        self.reading = self.info._reading = reading
        self.multi = reading.multi
        self._judged.clear()

    def set_multi_statements(self, on: bool) -> None:
        self._read(multi=on)

    def _read(self, **changes) -> None:
        self.adopt_reading(attrs.evolve(self.reading, **changes))
        self.changed = True

    @property
    def dialect(self) -> Dialect:
        return self.reading.dialect

    @property
    def nbe(self) -> bool:
        return self.reading.nbe

    @property
    def multi_statements(self) -> bool:
        return self.reading.multi

    def status_word(self) -> int:
        """The status word for an answer the proxy gives itself, as the server would set it."""
        return (IN_TRANS if self.tx.active else 0) | (AUTOCOMMIT if self.autocommit else 0)

    def transaction_lost(self) -> None:
        """The open transaction died with the backend connection (and will not be replayed)."""
        self._end_transaction()

    def _end_transaction(self) -> None:
        self.tx.reset()
        self.pending = None
        self.xa = None
        self.info._in_transaction = self.in_transaction_shown = False

    # ------------------------------------------------------------------ judging commands

    def triage(self, payload: bytes) -> tuple[bytes | None, Analysis | None]:
        """(fast-path verb, None) for a COM_QUERY that needs no analysis, else (None, analysis).
        A short text judged before (a replicator's BEGIN and COMMIT) is looked up, not judged
        again, while the reading holds (``_read`` forgets them)."""
        verb = fast_verb(payload, self.multi)
        if verb is not None:
            return verb, None
        judged = self._judged.get(payload)
        if judged is None:
            judged = self.analyze(payload)
            if len(payload) <= _JUDGED_TEXT:
                if len(self._judged) >= _JUDGED_TEXTS:
                    self._judged.clear()
                self._judged[payload] = judged
        return None, judged

    def analyze(self, payload: bytes, multi: bool | None = None) -> Analysis:
        """Judge a COM_QUERY / COM_STMT_PREPARE text as this session's server will run it."""
        return self.reading.analyze(payload[1:].decode("utf-8", "surrogateescape"), multi)

    def wants_fingerprint(self, analysis: Analysis | None) -> bool:
        """Is the response to this command journaled (and so worth fingerprinting)?"""
        return self.tx.active or not self.autocommit or analysis is not None

    # ------------------------------------------------------------------ completed commands

    def completed(self, done: Completed) -> list[str]:
        """Record what a completed command did to the session and the transaction. Returns the
        session variables whose new values must be read back from the server."""
        tracker = done.tracker
        if tracker.saw_status:
            self.autocommit = bool(tracker.status & AUTOCOMMIT)
            nbe = bool(tracker.status & NO_BACKSLASH_ESCAPES)
            if nbe is not self.reading.nbe:
                self._read(nbe=nbe)
            if self.pending is not None:
                self._settle(bool(tracker.status & IN_TRANS))
        captures = self._bookkeep(done)
        active = self.tx.active
        if active is not self.in_transaction_shown:  # (a plugin's view, written when it changes)
            self.info._in_transaction = self.in_transaction_shown = active
        state = self.state
        if tracker.error is None and state is not None and (done.command.code == C.COM_QUERY or done.command.code == C.COM_STMT_EXECUTE):
            if follow_insert_id(state, done):
                self.insert_id_moved = True
        return captures

    def _settle(self, in_trans: bool) -> None:
        """The first status word after an ERR that left the transaction open to question."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        if not in_trans:
            self.tx.reset()  # it ended (committed or rolled back): nothing left to replay
        elif not self.autocommit:
            # Still open, or a new one began (autocommit off): the old journal cannot be trusted.
            if pending.may_have_committed:
                self.tx.mark_in_doubt(pending.reason)
            else:
                self.tx.mark_not_replayable(pending.reason)
        # autocommit on and IN_TRANS: nothing but an explicit BEGIN (a boundary of its own)
        # opens a transaction, so the old one is still open and its journal intact.

    def _bookkeep(self, done: Completed) -> list[str]:
        cmd = done.command
        tracker = done.tracker
        code = cmd.code
        err = tracker.error
        ok = err is None
        state = self.state
        assert state is not None
        if code == C.COM_QUERY:
            if done.analysis is None:  # fast path: one DML or SELECT, no transaction effect
                if err is None:
                    # (the fast path's SELECT calls nothing, assigns nothing: no "(" nor "@" in it)
                    if done.verb != b"SELECT" and may_pin_session(cmd.payload):
                        self._note_pins(classify(cmd.text(), dialect=done.reading.dialect, no_backslash_escapes=done.reading.nbe))
                elif done.verb is not None:
                    self._failed(FAST_STATEMENTS[done.verb], err.code)
                self._journal_step(done, None, False)
                return []
            return self._apply(done, done.analysis)
        if code == C.COM_STMT_EXECUTE:
            stmt = done.statement
            captures: list[str] = []
            if stmt is not None:
                long_data = self.statements.executed(stmt)
                if len(cmd.payload) > 5 and cmd.payload[5] & 0x07:
                    self.mark_unrestorable("a server-side cursor was opened")
                a = stmt.analysis
                if a is not None and a.unknown is None and a.first.kind in _NO_TRANSACTION_EFFECT:
                    if tracker.error is None and a.first.session_unrestorable:
                        self._note_pins(a.first)
                    elif tracker.error is not None:
                        self._failed(a.first, tracker.error.code)
                    self._journal_step(done, None, False, long_data)
                else:
                    captures = self._apply(done, a, long_data)  # SET @v = ?: read back like text
                if long_data and not (self.tx.entries and self.tx.entries[-1].long_data is long_data):
                    self.long_data.release(long_data)  # not journaled: nothing will send it again
            return captures
        if code == C.COM_STMT_PREPARE:
            if ok and tracker.prepare_ok is not None:
                self.changed = True
                done.statement = self.statements.prepare_ok(cmd.payload, tracker.prepare_ok, self.analyze(cmd.payload, multi=False))
            return []
        if code == C.COM_STMT_CLOSE:
            if done.statement is not None:
                self.changed = True
                self.statements.closed(done.statement)
            return []
        if code == C.COM_STMT_RESET:
            if ok and done.statement is not None:
                self.statements.long_data_dropped(done.statement)
            return []
        if code == C.COM_STMT_FETCH:
            self.tx.mark_not_replayable("server-side cursor fetch")
            return []
        if code == C.COM_INIT_DB:
            if ok:
                self.tx.note_session_change(state)
                self._use(cmd.payload[1:].decode("utf-8", "surrogateescape"))
            self._journal_step(done, None, False)
            return []
        if code == C.COM_RESET_CONNECTION:
            if ok:
                self.changed = True
                state.reset()
                self._state_changed()
                self.statements.forget()
                self._end_transaction()
            return []
        if code == C.COM_SET_OPTION:
            if ok and len(cmd.payload) >= 3:
                # 0: MYSQL_OPTION_MULTI_STATEMENTS_ON, 1: ..._OFF. A new connection starts with
                # what the handshake negotiated, so the session is not restorable any more.
                self._read(multi=cmd.payload[1] == 0)
                self.mark_unrestorable("COM_SET_OPTION changed multi-statement mode")
            return []
        if code in SESSION_ONLY_COMMANDS or code == C.COM_STMT_SEND_LONG_DATA:
            return []
        self._journal_step(done, None, False)
        return []

    def _apply(self, done: Completed, analysis: Analysis | None, long_data: list[Piece] | None = None) -> list[str]:
        """The effects of a judged text: session changes of the statements that ran, where the
        transaction ended or began, what is now in doubt."""
        tracker = done.tracker
        err = tracker.error
        if analysis is None:  # a prepared statement the proxy could not judge at PREPARE
            analysis = Analysis("", (Statement(Kind.OTHER, unknown="unknown prepared statement"),), ((0, 0),), "unknown prepared statement")
        statements = analysis.statements
        if err is not None and err.code in PARSE_ERRORS and tracker.results == 0:
            return []  # rejected before anything ran
        ran = len(statements) if err is None else min(tracker.results, len(statements))
        failed = statements[ran] if err is not None and ran < len(statements) else None
        if analysis.unknown is None and not analysis.single and any(st.runs_code for st in statements):
            # A routine's own result sets make the count of results say nothing about which
            # statement failed: judge the text as a whole.
            analysis = attrs.evolve(analysis, unknown="a stored routine inside a multi-statement query")
        if analysis.unknown is not None:
            why = f"a statement the proxy cannot judge ran ({analysis.unknown})"
            self.mark_unrestorable(why)
            self._journal_step(done, None, False, long_data, in_doubt=why)
            return []
        captures: list[str] = []
        boundary: int | None = None  # the last statement that ended the transaction known so far
        in_doubt: str | None = None
        for i, st in enumerate(statements[:ran]):
            if st.runs_code:
                in_doubt = in_doubt or "a stored routine ran (it may commit)"
                self.mark_unrestorable("a stored routine ran: it may change the session")
            if st.xa is not None:
                in_doubt = self._xa(st.xa) or in_doubt
            if st.implicit_commit or st.kind is Kind.COMMIT or st.kind is Kind.ROLLBACK:
                boundary = i
            captures += self._note_statement(analysis, i, st)
        if failed is not None and err is not None:
            self._failed(failed, err.code)
        # A failed statement that may have committed is never journaled: if it did nothing, the
        # transaction goes on without it; if it committed, there is nothing left to replay.
        record = failed is None or not failed.may_end_transaction
        ender = statements[boundary] if boundary is not None else None
        self._journal_step(
            done,
            boundary,
            analysis.single,
            long_data,
            in_doubt=in_doubt,
            record=record,
            begins=ender is not None and ender.kind is Kind.BEGIN,
            chained=ender is not None and ender.chain,
        )
        return captures

    def _failed(self, st: Statement, code: int) -> None:
        """A statement failed: what that means for the open transaction (no status word)."""
        if code in ROLLS_BACK:
            self.tx.reset()  # the server rolled the whole transaction back
            self.xa = None
            return
        if code in CONNECTION_FATAL:
            return
        if st.kind is Kind.COMMIT and self.dialect.flavor == "tidb":
            # TiDB ends the transaction when its COMMIT fails, whatever the error (session.go:
            # doCommitWithRetry invalidates it; an undetermined outcome closes the connection
            # instead): nothing committed, nothing is left open.
            self.tx.reset()
            return
        ends = st.may_end_transaction
        if not ends and code in STATEMENT_ERRORS:
            return  # only the statement failed
        if not (self.tx.active or st.runs_code):
            return
        reason = f"{st.kind.value} failed with error {code}"
        self.pending = Pending(st.may_commit, reason)

    def _xa(self, verb: str) -> str | None:
        """Track the XA state; returns why the transaction is in doubt (a prepared branch
        survives the connection)."""
        if verb == "START":
            self.xa = "ACTIVE"
        elif verb == "END":
            self.xa = "IDLE"
        elif verb == "PREPARE":
            self.xa = "PREPARED"
            return "an XA transaction is prepared"
        elif verb in ("COMMIT", "ROLLBACK"):
            self.xa = None
        return None

    def _journal_step(
        self,
        done: Completed,
        boundary: int | None,
        single: bool,
        long_data: list[Piece] | None = None,
        *,
        in_doubt: str | None = None,
        begins: bool = False,
        chained: bool = False,
        record: bool = True,
    ) -> None:
        """Move the transaction on by one command: ``boundary`` is the index of the last of its
        statements that ended the transaction (None: none did)."""
        tracker = done.tracker
        tx = self.tx
        if tracker.error is not None and tracker.error.code in CONNECTION_FATAL:
            return  # the server closes the connection after it: replaying it would loop
        if boundary is not None:
            tx.reset()
        in_tx_after = bool(tracker.status & IN_TRANS) if tracker.saw_status else tx.active
        if not in_tx_after:
            if tx.active:
                tx.reset()
            return
        if not tx.active:
            state = self.state
            tx.start(state.next_transaction if state else None)
            if state is not None and state.next_transaction is not None:
                state.next_transaction = None
                self.changed = True
            if boundary is not None and not begins:
                if single and chained:
                    return  # COMMIT|ROLLBACK AND CHAIN: the new transaction starts empty
                if single:
                    # Judged to end the transaction, yet the server kept one open: if the judgement
                    # was wrong, the journal has lost statements that did not commit.
                    tx.mark_in_doubt("a statement judged to end the transaction left one open")
                else:
                    # Part of this command belongs to the new transaction: it cannot be replayed alone.
                    tx.mark_not_replayable("a transaction began inside a multi-statement query")
        if in_doubt is not None:
            tx.mark_in_doubt(in_doubt)
        if self.xa is not None:
            tx.mark_not_replayable(f"XA transaction ({self.xa})")
        cmd = done.command
        if not record:
            return
        if not cmd.complete:
            tx.writes = True
            tx.mark_not_replayable(f"a statement of {cmd.size} bytes is larger than the journal keeps")
            return
        fingerprint = tracker.fingerprint if tracker.hashing else None
        tx.record(JournalEntry(cmd.payload, tracker.expect, fingerprint, done.statement, long_data or None,
                               done.analysis, done.reading))  # fmt: skip
        if not tx.writes:
            stmt = done.statement
            tx.writes = (
                (done.verb is not None and done.verb != b"SELECT")
                or (done.analysis is not None and done.analysis.writes)
                or (cmd.code == C.COM_STMT_EXECUTE and (stmt is None or stmt.analysis is None or stmt.analysis.writes))
            )

    # ------------------------------------------------------------------ session state

    def _use(self, database: str | None) -> None:
        assert self.state is not None
        self.changed = True
        self.state.database = database
        self.info._database = database

    def _note_statement(self, analysis: Analysis, i: int, st: Statement) -> list[str]:
        """Session effects of one statement that completed; returns variables to read back."""
        self._note_pins(st)
        kind = st.kind
        state = self.state
        assert state is not None
        if kind is Kind.USE:
            self.tx.note_session_change(state)
            self._use(st.target)
            return []
        if kind is not Kind.SET and kind is not Kind.SET_TRANSACTION:
            return []
        start, end = analysis.spans[i]
        try:
            assignments = parse_set(analysis.text[start:end], dialect=analysis.dialect, no_backslash_escapes=analysis.nbe)
        except SqlParseError as exc:  # classify judged it; a parse failure here is a bug to survive
            self.mark_unrestorable(f"SET statement not understood: {exc}")
            return []
        if not assignments:
            return []
        self.changed = True
        self.tx.note_session_change(state)
        captures = state.apply_set(assignments)
        self._state_changed()
        return captures

    def _note_pins(self, st: Statement) -> None:
        if st.session_unrestorable:
            self.mark_unrestorable(st.session_unrestorable)

    def captured(self, name: str, column: Column, value: bytes | None) -> None:
        """The server's value of a session variable that was set from an expression or a
        parameter: a number as a number (MariaDB refuses wait_timeout = '7777', 1232), anything
        else as a string."""
        assert self.state is not None
        self.changed = True
        self.state.variables.pop(name, None)
        self.state.variables[name] = session_variable_literal(column, value)
        self._state_changed()

    def captured_user(self, name: str, column: Column, value: bytes | None, hexed: bytes | None, charset: str, collation: str) -> None:
        """The server's value of a user variable that was set from an expression (a prepared
        ``SET @v = ?``, ``SET @v = NOW()``): restored as a constant of the same type."""
        assert self.state is not None
        literal = user_variable_literal(column, value, hexed, charset, collation)
        if literal is None:
            self.mark_unrestorable(f"user variable @{name} holds a value the proxy cannot write back (column type {column.type})")
            return
        self.changed = True
        self.state.user_variables[name] = literal

    def insert_id_read(self, value: int) -> None:
        """The session's connection said LAST_INSERT_ID() is ``value`` (idle, before a move)."""
        assert self.state is not None
        self.state.known_insert_id(value)
        self.insert_id_moved = True

    # ------------------------------------------------------------------ the session's end

    def mark_unrestorable(self, reason: str) -> None:
        """The session holds something a new backend connection cannot be given."""
        assert self.state is not None
        if self.state.unrestorable is None:
            self.changed = True
        self.state.mark_unrestorable(reason)

    def close(self) -> None:
        """The session ends: its spool goes."""
        self.long_data.close()
