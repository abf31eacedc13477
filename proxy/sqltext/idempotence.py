"""Safe mode: may a statement be applied again, after it (and the rest of its transaction) may
already have been applied, and leave the same rows?

Two steps. The text gives a ``Claim`` (``proxy.sqltext.claims.claim``): the statement is a
keyed write whose values are all constants -- REPLACE / INSERT ... ON DUPLICATE KEY UPDATE c =
VALUES(c) | constant, DELETE ... WHERE <key> = constant ..., UPDATE ... SET c = constant WHERE
<key> = constant --, and which columns it fixes. The table's keys (``TableKeys``, read from information_schema)
then decide (``proves``):

- REPLACE / ODKU: every row gives every column of one PRIMARY or UNIQUE key (all its columns
  NOT NULL) a non-NULL constant. Then the row with that key ends up with the statement's
  values whatever it held, so a second run ends where the first did. An ODKU's ``c = constant``
  keeps that only when every row inserts that same constant into c: after a first run that
  inserted the row, a second one finds it and applies the UPDATE part (``VALUES (1, 1) ON
  DUPLICATE KEY UPDATE n = 5`` leaves n = 1, then 5). Without it (an
  AUTO_INCREMENT id left out, NULL, or 0 without NO_AUTO_VALUE_ON_ZERO in sql_mode; a nullable
  unique key), a second run adds a row. A REPLACE deletes the row it conflicts with and inserts
  a new one: it must also give the AUTO_INCREMENT column, or the row comes back with a new id.
  An ODKU also needs the table to have one unique index only: with two, a row updates the first
  row it conflicts with by either, and which one that is depends on what the rows before it
  did (``VALUES (1, u=1, 1), (4, 1, 1), (2, 1, 2), (2, 4, 2) ... UPDATE v = VALUES(v)`` on an
  empty table leaves row 1 with v = 2, run again v = 1). A REPLACE deletes every row it
  conflicts with, so it stays "the row with these keys", whatever the number of keys.
- DELETE: the WHERE is a conjunction of ``column = constant`` covering such a key (or an
  OR / IN list of such conjunctions): it removes at most that row; LIMIT does not matter.
- UPDATE: the same WHERE, and SET assigns constants to columns that are in no unique key and
  not in the WHERE (a key column may be "set" to its own WHERE value, as DM writes it).
- The table has no triggers (they would run again), and no foreign key refers to it unless
  the session has foreign_key_checks = 0 (a REPLACE would cascade again).

A sequence of such statements is idempotent too: each sets "the row with key K" to fixed
values or removes it, and an UPDATE only applies to a row that exists, so running the sequence
again from its own end state gives the same end state -- except where a statement's effect
depends on a column outside the keys that another one changes (``proves_together``). A model of
the server checks all of it on random tables, start states and sequences
(tests/fuzz/test_idempotence_model.py).

Transaction control, SET of session/user variables to constants and read-only statements
change no rows: they are idempotent without a claim.
"""

from __future__ import annotations

import attrs

from proxy.sqltext.claims import Claim, claim
from proxy.sqltext.classify import classify
from proxy.sqltext.ddl import sets_auto_increment
from proxy.sqltext.dialect import UNKNOWN, Dialect
from proxy.sqltext.lexer import SqlParseError
from proxy.sqltext.setstmt import SetScope, parse_set
from proxy.sqltext.statement import TRANSACTION_KINDS, Kind

__all__ = ["TableKeys", "proves", "proves_together", "is_idempotent", "changes_no_rows", "repeatable"]


@attrs.frozen
class TableKeys:
    """What information_schema says about a table."""

    unique_keys: tuple[frozenset[str], ...]  # PRIMARY and UNIQUE keys whose columns are all NOT NULL
    key_columns: frozenset[str]  # every column of every unique key (nullable ones included)
    columns: tuple[str, ...]  # the visible ones, in table order: what an INSERT without a column list fills
    has_triggers: bool = False
    referenced: bool = False  # a foreign key of another table refers to it
    auto_increment: str | None = None  # the AUTO_INCREMENT column (or, on TiDB, the AUTO_RANDOM key)


def proves(c: Claim, keys: TableKeys, foreign_key_checks: bool = True, zero_is_value: bool = False) -> bool:
    """Do the table's keys make the claimed statement idempotent (module docstring)?
    ``zero_is_value``: the session's sql_mode has NO_AUTO_VALUE_ON_ZERO."""
    if keys.has_triggers or (keys.referenced and foreign_key_checks) or not keys.unique_keys:
        return False
    if c.upsert and not (len(set(keys.unique_keys)) == 1 and keys.key_columns == keys.unique_keys[0]):
        return False  # more than one unique index (a nullable one counts): which row it updates varies
    generated = None  # the AUTO_INCREMENT column when some row may have it generate an id
    if keys.auto_increment is not None and not zero_is_value and keys.auto_increment in _names(c.maybe_zero, keys):
        generated = keys.auto_increment
    for fixed in c.fixed:
        names = _names(fixed, keys) - {generated}
        if not any(key <= names for key in keys.unique_keys):
            return False
        if c.replaces and keys.auto_increment is not None and keys.auto_increment not in names:
            return False  # the row comes back with a new AUTO_INCREMENT id each time
    if c.same_as_inserted:
        order = list(c.columns) if c.columns is not None else list(keys.columns)
        for column, literal in c.same_as_inserted:
            i = order.index(column) if column in order else -1
            if i < 0 or any(i >= len(row) or row[i] != literal for row in c.rows):
                return False  # a second run would update the row the first one inserted
    return not (c.assigned & keys.key_columns) and not (c.assigned & c.where)


def proves_together(proven: list[tuple[str, Claim, TableKeys]]) -> str | None:
    """Statements each proven alone, with their tables (a name that tells tables apart) and
    keys: why the sequence is not idempotent, or None. Run again from its own end, the sequence
    meets its rows in another state; that matters where a statement's effect depends on a column
    outside the unique keys that another statement changes, but for a REPLACE, which makes its
    row anew each time:

    - a DELETE or UPDATE that selects by such a column (``WHERE id = 1 AND v = 5``), and an
      UPDATE or upsert writes it: ``DELETE ... WHERE id = 1 AND v = 5; UPDATE ... SET v = 5 WHERE
      id = 1`` on (1, 6) leaves (1, 5) once and no row twice;
    - an upsert that inserts such a column without updating it (a row inserted the first time
      has the statement's value, a row found the second time keeps its own), and an UPDATE sets it.

    Found by brute force against a model of the server (tests/fuzz/test_idempotence_model.py)."""
    written: dict[str, set[str]] = {}  # by an UPDATE's SET or an upsert (inserted or updated)
    set_by_update: dict[str, set[str]] = {}
    for table, c, keys in proven:
        if c.upsert:
            written.setdefault(table, set()).update(_inserted(c, keys) | c.updates)
        elif not c.replaces:
            written.setdefault(table, set()).update(c.updates)
            set_by_update.setdefault(table, set()).update(c.updates)
    for table, c, keys in proven:
        if c.upsert:
            depends = (_inserted(c, keys) - c.updates - keys.key_columns) & set_by_update.get(table, set())
        else:
            depends = set(c.where - keys.key_columns) & written.get(table, set())
        if depends:
            return f"{table}: a statement's effect depends on {', '.join(sorted(depends))}, which the transaction also changes"
    return None


def _inserted(c: Claim, keys: TableKeys) -> set[str]:
    """The columns an upsert inserts: its column list, else the table's."""
    return set(c.columns) if c.columns is not None else set(keys.columns)


def _names(columns: frozenset[str | int], keys: TableKeys) -> set[str | int]:
    """Columns by name (a position without a column list: the table's column there)."""
    return {keys.columns[i] if isinstance(i, int) and i < len(keys.columns) else i for i in columns}


def is_idempotent(sql: str, *, dialect: Dialect = UNKNOWN, no_backslash_escapes: bool = False) -> bool:
    """The text-only test: no rows changed, or a keyed write of constants (``claim``). Without
    the table's keys this is necessary, not sufficient."""
    return repeatable(sql, dialect, no_backslash_escapes) or claim(sql, dialect, no_backslash_escapes) is not None


def changes_no_rows(sql: str, dialect: Dialect = UNKNOWN, nbe: bool = False) -> bool:
    """Transaction control, SET of session/user variables to constants, read-only statements."""
    st = classify(sql, dialect=dialect, no_backslash_escapes=nbe)
    if st.unknown is not None:
        return False
    if st.kind in TRANSACTION_KINDS:
        return True
    if st.kind is Kind.SET:
        try:
            assignments = parse_set(sql, dialect=dialect, no_backslash_escapes=nbe)
        except SqlParseError:
            return False
        return (
            st.session_only
            and assignments is not None
            and bool(assignments)
            and all(a.is_constant and a.scope in _SESSION_SET_SCOPES for a in assignments)
        )
    if st.kind in (Kind.SET_TRANSACTION, Kind.USE):
        return st.session_only
    return st.kind in (Kind.SELECT, Kind.SHOW) and st.read_only and st.session_unrestorable is None


def repeatable(sql: str, dialect: Dialect = UNKNOWN, nbe: bool = False) -> bool:
    """Safe to run again whatever the keys: it changes no rows, or it only sets a table's
    AUTO_INCREMENT to a number (DM's full load ends each table so; twice is once)."""
    return changes_no_rows(sql, dialect, nbe) or sets_auto_increment(sql, dialect, nbe)


_SESSION_SET_SCOPES = frozenset({SetScope.SESSION, SetScope.USER, SetScope.NAMES, SetScope.CHARSET,
                                 SetScope.TRANSACTION, SetScope.NEXT_TRANSACTION})  # fmt: skip
