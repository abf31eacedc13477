"""What a statement does, as the classifier judges it: ``Kind``, ``Statement`` (one
statement) and ``Analysis`` (a whole COM_QUERY text)."""

from __future__ import annotations

import enum
from typing import Final

import attrs

import proxy.sqltext.tokens as tk
from proxy.sqltext.dialect import UNKNOWN, Dialect
from proxy.sqltext.lexer import SqlParseError

__all__ = ["Kind", "Statement", "Analysis", "TRANSACTION_KINDS", "PLAIN", "OTHER_COMMIT"]


class Kind(enum.Enum):
    BEGIN = "begin"
    COMMIT = "commit"
    ROLLBACK = "rollback"
    SAVEPOINT = "savepoint"
    ROLLBACK_TO_SAVEPOINT = "rollback_to_savepoint"
    RELEASE_SAVEPOINT = "release_savepoint"
    SET = "set"
    SET_TRANSACTION = "set_transaction"
    USE = "use"
    SELECT = "select"
    INSERT = "insert"
    REPLACE = "replace"
    UPDATE = "update"
    DELETE = "delete"
    LOAD_DATA = "load_data"
    CALL = "call"
    DDL = "ddl"
    LOCK_TABLES = "lock_tables"
    UNLOCK_TABLES = "unlock_tables"
    SHOW = "show"  # also DESCRIBE / DESC / EXPLAIN (without ANALYZE)
    PREPARE_SQL = "prepare_sql"
    EXECUTE_SQL = "execute_sql"
    DEALLOCATE_SQL = "deallocate_sql"
    DO = "do"
    XA = "xa"
    OTHER = "other"
    EMPTY = "empty"


TRANSACTION_KINDS: Final = frozenset({Kind.BEGIN, Kind.COMMIT, Kind.ROLLBACK, Kind.SAVEPOINT,
                                      Kind.ROLLBACK_TO_SAVEPOINT, Kind.RELEASE_SAVEPOINT})  # fmt: skip
_ENDS: Final = frozenset({Kind.COMMIT, Kind.ROLLBACK})


@attrs.frozen
class Statement:
    """What one statement does.

    ``implicit_commit``: the server commits an open transaction before running it (DDL, LOCK
    TABLES, BEGIN itself, SET autocommit=1, ...) -- whether the statement then succeeds or not.
    ``read_only``: proven to change nothing. ``session_only``: proven to change only this
    session (SET, USE, ...). ``runs_code``: runs the user's code the proxy does not see (CALL,
    EXECUTE, a stored function): it may write tables that do not roll back, change the
    session, and (procedures) commit. ``xa``: the XA verb (START, END, PREPARE, COMMIT,
    ROLLBACK, RECOVER). ``unknown``: why the proxy cannot judge it.
    ``session_unrestorable``: why a session that ran it cannot be rebuilt on a new connection.
    ``needs_capture``: a session variable was set from an expression; read its value back to
    restore it. ``autocommit``: the value a SET gives autocommit (None if untouched/unknown).
    ``target``: savepoint name, database of USE, or SQL prepared statement name.
    """

    kind: Kind
    implicit_commit: bool = False
    read_only: bool = False
    session_only: bool = False
    runs_code: bool = False
    begin_read_only: bool = False
    consistent_snapshot: bool = False
    chain: bool = False
    release: bool = False
    xa: str | None = None
    session_unrestorable: str | None = None
    needs_capture: bool = False
    autocommit: bool | None = None
    target: str | None = None
    unknown: str | None = None

    @property
    def writes(self) -> bool:
        """May it change data (anything beyond this session)?"""
        return not (self.read_only or self.session_only or self.kind in TRANSACTION_KINDS)

    @property
    def may_end_transaction(self) -> bool:
        """Might an open transaction be over (committed or rolled back) once it ran?"""
        return (
            self.implicit_commit or self.runs_code or self.unknown is not None or self.xa is not None
            or self.kind in _ENDS
        )  # fmt: skip

    @property
    def may_commit(self) -> bool:
        """Might it commit something (an open transaction, or itself in autocommit)?"""
        return self.may_end_transaction and self.kind is not Kind.ROLLBACK


@attrs.frozen
class Analysis:
    """A whole COM_QUERY (or prepared) text: its statements in the order the server runs them."""

    text: str
    statements: tuple[Statement, ...]
    spans: tuple[tuple[int, int], ...]  # (start, end) of each statement in ``text``
    unknown: str | None = None  # why the text as a whole cannot be judged
    dialect: Dialect = UNKNOWN
    nbe: bool = False
    # Read several times per statement: slots set once, not properties (a Python call per read).
    first: Statement = attrs.field(init=False, eq=False, repr=False)
    single: bool = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "first", self.statements[0])
        object.__setattr__(self, "single", len(self.statements) == 1)

    def keywords(self, i: int = 0, n: int = 2) -> tuple[str, ...]:
        """The first ``n`` keywords of statement ``i`` (() when the text is unknown)."""
        if self.unknown is not None and i >= len(self.spans):
            return ()
        start, end = self.spans[i]
        try:
            return tk.leading_keywords(self.text[start:end], n, dialect=self.dialect, nbe=self.nbe)
        except SqlParseError:
            return ()

    @property
    def writes(self) -> bool:
        return self.unknown is not None or any(s.writes for s in self.statements)

    @property
    def read_only(self) -> bool:
        return self.unknown is None and all(s.read_only for s in self.statements)

    @property
    def session_only(self) -> bool:
        return self.unknown is None and all(s.session_only or s.read_only for s in self.statements) and not self.read_only

    @property
    def may_end_transaction(self) -> bool:
        return self.unknown is not None or any(s.may_end_transaction for s in self.statements)

    @property
    def may_commit(self) -> bool:
        return self.unknown is not None or any(s.may_commit for s in self.statements)


# Shared instances of the common judgements (statements are immutable).
PLAIN = {kind: Statement(kind) for kind in Kind}
PLAIN[Kind.EMPTY] = Statement(Kind.EMPTY, read_only=True)
OTHER_COMMIT = Statement(Kind.OTHER, implicit_commit=True)
