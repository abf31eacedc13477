"""Transaction tracking and the journal of the open transaction.

Whether a transaction is open comes from the server: the IN_TRANS bit of every OK/EOF status
word. Statement classification only adds what the status word cannot say: a BEGIN or COMMIT
AND CHAIN inside a transaction ends the old one even though IN_TRANS stays set (any other
statement judged to end it that leaves IN_TRANS set puts the new one in doubt: the judgement
may be wrong), and a deadlock error (1213) means the server rolled the transaction back.

The journal holds every command of the open transaction as the client sent it, with a
fingerprint of the response the client saw, so the transaction can be replayed on a new
connection and checked to have produced the same results.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import cattrs

from proxy.protocol.constants import Commands
from proxy.protocol.response import Expect
from proxy.session.longdata import Piece
from proxy.session.state import PreparedStatement, SessionState
from proxy.sqltext import Analysis, ServerReading

__all__ = ["JournalEntry", "judged", "Transaction", "CONNECTION_FATAL", "ROLLS_BACK", "STATEMENT_ERRORS", "PARSE_ERRORS"]

# Errors after which the server closes the connection (1153: packet too large; going away).
CONNECTION_FATAL: Final = frozenset({1153, 1053, 1927})
# Errors that roll the whole transaction back: deadlock, XA branch rolled back.
ROLLS_BACK: Final = frozenset({1213, 1402, 1614})
# Errors of a statement that failed without touching the transaction (parsing, names, data,
# privileges, a feature the server lacks -- 1235, TiDB's for READ ONLY, SQL_CALC_FOUND_ROWS...):
# the open transaction goes on. Any other error may have ended it.
STATEMENT_ERRORS: Final = frozenset(
    {
        1044, 1045, 1046, 1048, 1049, 1051, 1054, 1062, 1064, 1065, 1091, 1110, 1136, 1142, 1143, 1146,
        1166, 1235, 1264, 1265, 1292, 1305, 1364, 1365, 1366, 1406, 1451, 1452, 1644, 1690, 3140, 4025,
    }
)  # fmt: skip
PARSE_ERRORS: Final = frozenset({1064, 1065})  # nothing of the statement ran


class JournalEntry:
    """One command of the open transaction, as the client sent it. A plain slotted class: one
    is made per statement in a transaction (an attrs class is no native class once compiled)."""

    __slots__ = ("payload", "expect", "fingerprint", "statement", "long_data", "analysis", "reading", "facts")

    def __init__(self, payload: bytes, expect: Expect, fingerprint: int | None, statement: PreparedStatement | None = None,
                 long_data: list[Piece] | None = None, analysis: Analysis | None = None, reading: ServerReading | None = None) -> None:  # fmt: skip
        self.payload = payload  # command payload with the client's statement ids
        self.expect = expect
        # ResponseTracker.fingerprint of what the client saw; None when it was not computed
        # (statements before the transaction was known to be open, e.g. its BEGIN).
        self.fingerprint = fingerprint
        self.statement = statement  # for COM_STMT_EXECUTE
        self.long_data = long_data  # the COM_STMT_SEND_LONG_DATA commands sent before this execute
        # The judgement made when it ran (None on the hot path, which judges nothing), and how
        # the server read text then: recovery reads these, never the session's reading of now.
        self.analysis = analysis
        self.reading = reading
        # What recovery needs to know of it (its StatementFacts, ``proxy.recovery.facts``), from
        # that judgement: computed at the first loss that asks, then kept here.
        self.facts: Any = None

    def judged(self) -> Analysis | None:
        return judged(self.payload, self.statement, self.analysis, self.reading)


def judged(payload: bytes, statement: PreparedStatement | None, analysis: Analysis | None,
           reading: ServerReading | None) -> Analysis | None:  # fmt: skip
    """What a command's text does, as the server read it when it ran: the judgement made then,
    or (the hot path skipped it) made now with the reading of then; a COM_STMT_EXECUTE's is its
    statement's, judged at PREPARE. None: no text (PING, ...) or a statement not judged."""
    if analysis is not None:
        return analysis
    code = payload[0]
    if code == Commands.COM_QUERY and reading is not None:
        return reading.analyze(payload[1:].decode("utf-8", "surrogateescape"))
    if code == Commands.COM_STMT_EXECUTE and statement is not None:
        return statement.analysis
    return None


class Transaction:
    """The open transaction and its journal (a plain slotted class, as ``JournalEntry``)."""

    __slots__ = ("max_bytes", "max_entries", "active", "entries", "size", "not_replayable", "in_doubt", "session_before", "prefix",
                 "writes", "release")  # fmt: skip

    def __init__(self, max_bytes: int, max_entries: int, release: Callable[[list[Piece]], None] | None = None) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.active = False
        self.entries: list[JournalEntry] = []
        self.size = 0
        # Why this transaction cannot be replayed (journal overflow, cursor, XA...), or None. It
        # is still known not to have committed: a loss is a 1213 "retry".
        self.not_replayable: str | None = None
        # Why part of it may have committed already (a stored routine, a statement the proxy
        # cannot judge, a prepared XA branch), or None: a loss is a connection error, never a replay.
        self.in_doubt: str | None = None
        # Session state as it was when the transaction began, taken only when the session
        # changes (USE, SET) inside it, so replay starts from the right database and variables.
        self.session_before: SessionState | None = None
        # SET TRANSACTION ... that applied to this transaction, replayed before it.
        self.prefix: str | None = None
        self.writes = False  # a command of it may have changed data (a commit marker is worth it)
        # Called with the long data of entries dropped from the journal (the session's spool).
        self.release = release

    def _drop(self, entries: list[JournalEntry]) -> None:
        if self.release is None:
            return
        for entry in entries:  # a plain loop: entries without long data are the rule (per statement)
            if entry.long_data:
                self.release([piece for e in entries if e.long_data for piece in e.long_data])
                return

    def reset(self) -> None:
        self.active = False
        if self.entries:
            self._drop(self.entries)
            self.entries.clear()
        self.size = 0
        self.not_replayable = None
        self.in_doubt = None
        self.writes = False
        self.session_before = None
        self.prefix = None

    def start(self, prefix: str | None) -> None:
        self.reset()
        self.active = True
        self.prefix = prefix

    def record(self, entry: JournalEntry) -> None:
        if self.not_replayable is not None:
            self._drop([entry])
            return
        self.size += len(entry.payload) + 64  # + bookkeeping, roughly
        if self.size > self.max_bytes or len(self.entries) >= self.max_entries:
            self._drop([entry])
            self.mark_not_replayable(
                f"journal over its limit ({len(self.entries) + 1} commands, {self.size} bytes;"
                f" limits {self.max_entries} commands, {self.max_bytes} bytes)"
            )
            return
        self.entries.append(entry)

    def export(self, prepared: dict[int, PreparedStatement]) -> dict[str, Any] | None:
        """The open transaction and its journal as JSON, for the new process of an upgrade
        (the backend connection, and so the transaction on the server, moves with it); None
        when none is open. Long data is never in it (``movable``); a statement closed since
        its entry ran goes as missing, and its journal cannot be replayed there."""
        if not self.active:
            return None
        entries = []
        for e in self.entries:
            statement = e.statement.client_id if e.statement is not None else None
            if statement is not None and prepared.get(statement) is not e.statement:
                statement = -1  # closed since: the new process has no statement for it
            entries.append({"payload": e.payload.hex(), "expect": e.expect.value, "fingerprint": e.fingerprint,
                            "statement": statement, "reading": cattrs.unstructure(e.reading) if e.reading is not None else None})  # fmt: skip
        return {
            "entries": entries,
            "size": self.size,
            "not_replayable": self.not_replayable,
            "in_doubt": self.in_doubt,
            "session_before": cattrs.unstructure(self.session_before) if self.session_before is not None else None,
            "prefix": self.prefix,
            "writes": self.writes,
        }

    def adopt(self, exported: dict[str, Any], prepared: dict[int, PreparedStatement]) -> None:
        """The transaction ``export`` gave, open on the adopted connection; ``prepared``: the
        session's statements there, by client id."""
        self.start(exported["prefix"])
        self.writes = bool(exported["writes"])
        self.in_doubt = exported["in_doubt"]
        self.not_replayable = exported["not_replayable"]
        before = exported["session_before"]
        self.session_before = cattrs.structure(before, SessionState) if before is not None else None
        for e in exported["entries"]:
            statement = None
            if e["statement"] is not None:
                statement = prepared.get(int(e["statement"]))
                if statement is None:
                    self.mark_not_replayable("a prepared statement of the journal was closed before the upgrade moved it")
                    break
            reading = cattrs.structure(e["reading"], ServerReading) if e["reading"] is not None else None
            self.entries.append(JournalEntry(bytes.fromhex(e["payload"]), Expect(e["expect"]), e["fingerprint"], statement,
                                             None, None, reading))  # fmt: skip
        self.size = int(exported["size"]) if self.not_replayable is None else 0

    def mark_not_replayable(self, reason: str) -> None:
        if self.not_replayable is None:
            self.not_replayable = reason
        self._drop(self.entries)
        self.entries.clear()  # nothing will replay them; give the memory back
        self.size = 0

    def mark_in_doubt(self, reason: str) -> None:
        if self.in_doubt is None:
            self.in_doubt = reason
        self.mark_not_replayable(reason)

    def note_session_change(self, session: SessionState) -> None:
        """Call before applying a session change while the transaction is open."""
        if self.active and self.session_before is None:
            self.session_before = session.snapshot()
