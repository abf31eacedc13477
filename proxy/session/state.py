"""Replayable session state: what a fresh backend connection needs to look like the old one.

Everything here is recorded only after the server accepted it (the response was OK), so a
restore never applies something the server refused.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import attrs

from proxy import sqltext as sql

if TYPE_CHECKING:
    from proxy.protocol.resultset import Column

__all__ = ["PreparedStatement", "SessionState"]


@attrs.define(slots=True, eq=False)
class PreparedStatement:
    """A server-side prepared statement as the client knows it."""

    client_id: int
    prepare_payload: bytes  # the COM_STMT_PREPARE payload, to prepare it again on a new backend
    num_params: int
    num_columns: int
    backend_id: int
    # Parameter types from the last COM_STMT_EXECUTE that bound them: a client only sends them
    # again when they change, but a re-prepared statement has none yet.
    param_types: bytes | None = None
    types_bound_on_backend: bool = False
    # COM_STMT_SEND_LONG_DATA commands since the last execute/reset, sent again after a reconnect.
    long_data: list = attrs.Factory(list)  # longdata.Piece, in the order sent
    long_data_bytes: int = 0
    long_data_refused: str | None = None  # why its long data was held back: its execute gets 1153
    generation: int = 0  # which backend connection (SessionTracker.generation) backend_id belongs to
    analysis: sql.Analysis | None = None  # what the statement does (judged at PREPARE)


@attrs.define(slots=True)
class SessionState:
    username: str
    database: str | None
    collation: int  # from the client's handshake
    names: str | None = None  # the last accepted SET NAMES / CHARACTER SET statement
    variables: dict[str, str] = attrs.Factory(dict)  # session variable -> SQL value
    user_variables: dict[str, str] = attrs.Factory(dict)  # user variable -> SQL constant
    next_transaction: str | None = None  # SET TRANSACTION ... for the next transaction only
    unrestorable: str | None = None  # why a new backend cannot take over this session
    # LAST_INSERT_ID(): the last value known for sure, then the INSERTs since whose OK carried
    # an id -- generated (the new LAST_INSERT_ID()) or given explicitly (no change): the
    # table's AUTO_INCREMENT column decides, at restore (relay.proofs.last_insert_id).
    last_insert_id: int = 0
    insert_ids: list[tuple[int, str | None, sql.ServerReading]] = attrs.Factory(list)  # (id, INSERT text or None, its reading)
    insert_id_unknown: bool = False  # set by an expression the proxy cannot evaluate
    insert_text_bytes: int = 0  # the INSERT texts kept in insert_ids (their sum, kept as it changes)

    def snapshot(self) -> SessionState:
        return attrs.evolve(self, variables=dict(self.variables), user_variables=dict(self.user_variables),
                            insert_ids=list(self.insert_ids))  # fmt: skip

    def wait_timeout(self, server_value: float | None) -> float | None:
        """Seconds of idleness after which the server closes this session: a ``SET SESSION
        wait_timeout`` the session made (a plain number), else ``server_value``."""
        value = self.variables.get("wait_timeout")
        try:
            return float(value) if value is not None else server_value
        except ValueError:  # an expression's text: the server's own reading is unknown here
            return server_value

    def mark_unrestorable(self, reason: str) -> None:
        if self.unrestorable is None:
            self.unrestorable = reason

    def reset(self) -> None:
        """COM_RESET_CONNECTION / COM_CHANGE_USER: the server forgets everything session-level."""
        self.names = None
        self.variables.clear()
        self.user_variables.clear()
        self.next_transaction = None
        self.unrestorable = None
        self.known_insert_id(0)

    _MAX_INSERT_IDS = 64
    _MAX_INSERT_TEXT = 256 * 1024  # bytes of INSERT text kept per session

    def known_insert_id(self, value: int) -> None:
        """LAST_INSERT_ID() is ``value`` for sure."""
        self.last_insert_id = value
        self.insert_ids.clear()
        self.insert_text_bytes = 0
        self.insert_id_unknown = False

    def insert_id_lost(self) -> None:
        """LAST_INSERT_ID(expr) with an expression the proxy cannot evaluate."""
        self.insert_ids.clear()
        self.insert_text_bytes = 0
        self.insert_id_unknown = True

    def forced_insert_id_used(self, value: int) -> None:
        """An OK carried insert id ``value``: a pending SET INSERT_ID = value was used up (it
        holds until an INSERT generates an id), so it is not set again on a new connection."""
        forced = self.variables.get("insert_id")
        if forced is not None and forced.isdigit() and int(forced) == value:
            del self.variables["insert_id"]

    def insert_id(self, value: int, text: str | None, reading: sql.ServerReading) -> None:
        """An INSERT/REPLACE answered with id ``value``: generated, or given by the statement
        (``text``, read as the server read it then)."""
        if text is not None and len(text) > self._MAX_INSERT_TEXT:
            text = None
        ids = self.insert_ids
        ids.append((value, text, reading))
        self.insert_text_bytes += len(text) if text else 0
        while len(ids) > self._MAX_INSERT_IDS or self.insert_text_bytes > self._MAX_INSERT_TEXT:
            _value, dropped, _reading = ids.pop(0)
            self.insert_text_bytes -= len(dropped) if dropped else 0
            self.insert_id_unknown = True  # the one dropped may have been the last generated id

    def apply_set(self, assignments: list[sql.SetAssignment]) -> list[str]:
        """Record an accepted SET; returns the variables whose value must be read back from the
        server (assigned an expression, not a constant): session variables by name, user
        variables as ``@name``."""
        capture: list[str] = []
        for a in assignments:
            scope = a.scope
            if scope == sql.SetScope.SESSION:
                if a.name in _NEXT_STATEMENT_ONLY:
                    self.mark_unrestorable(f"SET {a.name} holds for what runs next only: it cannot be set again later")
                elif a.is_constant:
                    self.variables.pop(a.name, None)  # keep assignment order = last write order
                    self.variables[a.name] = a.value_sql
                else:
                    capture.append(a.name)
            elif scope in (sql.SetScope.NAMES, sql.SetScope.CHARSET):
                self.names = sql.render_set([a])
                # SET NAMES resets character_set_client/connection/results set earlier.
                for var in ("character_set_client", "character_set_connection", "character_set_results", "collation_connection"):
                    self.variables.pop(var, None)
            elif scope == sql.SetScope.USER:
                if a.is_constant:
                    self.user_variables[a.name] = a.value_sql
                else:
                    capture.append("@" + a.name)  # its value, as the server computed it
            elif scope == sql.SetScope.TRANSACTION:
                # One entry per characteristic (isolation level, access mode).
                key = f"{_TRANSACTION_PREFIX}{a.name}"
                self.variables.pop(key, None)
                self.variables[key] = a.value_sql
            elif scope == sql.SetScope.NEXT_TRANSACTION:
                clauses = [c for c in (self.next_transaction or "").split(", ") if c and not _same_characteristic(c, a.value_sql)]
                self.next_transaction = ", ".join(clauses + [a.value_sql])
            # GLOBAL: server-wide, survives on the server by itself; nothing to restore.
        return capture

    def restore_statements(self) -> list[str]:
        """SQL that makes a fresh connection (logged in with ``database`` and ``collation``)
        match this session."""
        out = []
        if self.names:
            out.append(self.names)
        assignments = []
        for name, value in self.variables.items():
            if name.startswith(_TRANSACTION_PREFIX):
                out.append(f"SET SESSION TRANSACTION {value}")
            else:
                assignments.append(f"@@session.{_ident(name)} = {value}")
        for name, value in self.user_variables.items():
            assignments.append(f"@{_ident(name)} = {value}")
        if assignments:
            out.append("SET " + ", ".join(assignments))
        return out


# Session variables that the server uses up (the next RAND(), the next GTID): set again on a new
# connection later, they would apply to a statement they were never meant for.
_NEXT_STATEMENT_ONLY = frozenset({"rand_seed1", "rand_seed2", "gtid_seq_no"})
_TRANSACTION_PREFIX = "transaction:"  # keys of SET SESSION TRANSACTION characteristics


def _same_characteristic(a: str, b: str) -> bool:
    """Both set the isolation level, or both the access mode (READ ONLY / READ WRITE)."""
    return a.upper().startswith("ISOLATION") == b.upper().startswith("ISOLATION")


def _ident(name: str) -> str:
    return sql.quote_ident(name)


# MYSQL_TYPE_* a user variable can hold: integers, DECIMAL, DOUBLE, strings (binary ones too),
# and on TiDB DATETIME and DATE (MariaDB turns temporal values into strings).
_INTEGER_TYPES = frozenset({1, 2, 3, 8, 9, 13})
_DECIMAL_TYPES = frozenset({0, 246})
_FLOAT_TYPES = frozenset({4, 5})
_STRING_TYPES = frozenset({15, 249, 250, 251, 252, 253, 254})
_DATETIME, _DATE = 12, 10
_NAME = re.compile(r"[A-Za-z0-9_]+")
_HEX = re.compile(rb"(?:[0-9A-Fa-f]{2})*")
_SHAPES = {  # what each type's text looks like when it can be written back as it reads
    "integer": re.compile(r"-?\d+"),
    "decimal": re.compile(r"-?\d+(\.\d+)?"),
    "double": re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?"),
    "datetime": re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d{1,6})?"),
    "date": re.compile(r"\d{4}-\d\d-\d\d"),
}


def session_variable_literal(column: Column, value: bytes | None) -> str:
    """A constant for a session variable's value as ``SELECT @@session.name`` reported it."""
    if value is None:
        return "NULL"
    text = value.decode("utf-8", "surrogateescape")
    numeric = (_INTEGER_TYPES, "integer"), (_DECIMAL_TYPES, "decimal"), (_FLOAT_TYPES, "double")
    if any(column.type in types and _SHAPES[shape].fullmatch(text) for types, shape in numeric):
        return text
    return sql.quote_string(text)


def user_variable_literal(column: Column, value: bytes | None, hexed: bytes | None, charset: str, collation: str) -> str | None:
    """A constant that gives a user variable back the value and type the server reported for
    it (``SELECT @v, HEX(@v), CHARSET(@v), COLLATION(@v)``: a string's ``value`` comes converted
    to character_set_results, ``hexed`` is its own bytes): a number of its type (signedness
    too), a string with its character set and collation, a binary string as hex, a date and
    time as such, NULL of its type. None: a value the proxy cannot write back exactly."""
    t = column.type
    integer = "UNSIGNED" if column.unsigned else "SIGNED"
    if value is None:
        if t in _INTEGER_TYPES:
            return f"CAST(NULL AS {integer})"
        if t in _DECIMAL_TYPES:
            return "CAST(NULL AS DECIMAL)"
        return "CAST(NULL AS DOUBLE)" if t in _FLOAT_TYPES else "NULL"
    text = value.decode("ascii", "replace")
    if t in _INTEGER_TYPES and _SHAPES["integer"].fullmatch(text):
        return f"CAST({text} AS UNSIGNED)" if column.unsigned else text
    if t in _DECIMAL_TYPES and _SHAPES["decimal"].fullmatch(text):
        return text
    if t in _FLOAT_TYPES and _SHAPES["double"].fullmatch(text):
        return text if "e" in text.lower() else text + "E0"  # an E makes the literal a DOUBLE
    if t == _DATETIME and _SHAPES["datetime"].fullmatch(text):
        return f"CAST('{text}' AS DATETIME({min(column.decimals, 6)}))"
    if t == _DATE and _SHAPES["date"].fullmatch(text):
        return f"CAST('{text}' AS DATE)"
    if t in _STRING_TYPES and hexed is not None and _HEX.fullmatch(hexed):
        own = hexed.decode()
        if charset == "binary":
            return f"CAST(X'{own}' AS BINARY)"  # a string: a bare X'' is a number in arithmetic
        if _NAME.fullmatch(charset) and _NAME.fullmatch(collation):
            return f"CONVERT(X'{own}' USING {charset}) COLLATE {collation}"
    return None
