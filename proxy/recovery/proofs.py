"""What information_schema on the backend proves: a table's keys, the views a statement reads.

Safe mode: before a statement that may already have run is applied again, the table's keys
must show that doing so leaves the same rows (``proxy.sqltext.idempotence``). Every mode: a
statement that reads a view may run the stored functions the view calls, which the text does
not show (``code_in_views``). LAST_INSERT_ID(): after a reconnect, whether the last INSERTs
generated their ids (``last_insert_id``).

The keys, triggers and foreign keys of a table are read from information_schema on the new
backend connection and cached per target for a minute (``proxy.recovery.tablekeys``); a DDL seen
through the proxy drops the cache. A statement the text alone cannot claim, a table the proxy cannot read, a USE inside
the transaction (which database did the statement mean?) -- all make the proof fail, and the
replay does not happen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy.backend import Backend, BackendError
from proxy.recovery.facts import PluginAnswers
from proxy.recovery.tablekeys import KeyCache, lower_text
from proxy.session.state import PreparedStatement, SessionState
from proxy.session.texts import text_of
from proxy.sqltext import Dialect, ServerReading, SqlParseError, Token, TokenKind, analyze, iter_tokens, quote_string
from proxy.sqltext.claims import Claim, claim, stored_as_zero
from proxy.sqltext.idempotence import TableKeys, proves, proves_together, repeatable
from proxy.sqltext.inserts import InsertHead, insert_head, insert_rows, insert_target
from proxy.sqltext.tokens import name

if TYPE_CHECKING:
    from proxy.cycle.inflight import Inflight
    from proxy.session.tracker import SessionTracker
    from proxy.session.transaction import JournalEntry

__all__ = ["unproven", "code_in_views", "last_insert_id"]


_FK_CHECKS_OFF = frozenset({"0", "OFF", "'OFF'", "FALSE", "'0'"})


def _null_params(payload: bytes, stmt: PreparedStatement | None) -> list[bool] | None:
    """Which parameters a COM_STMT_EXECUTE binds to NULL (its NULL bitmap)."""
    if stmt is None or not stmt.num_params:
        return None
    bitmap = payload[10 : 10 + (stmt.num_params + 7) // 8]
    if len(bitmap) * 8 < stmt.num_params:
        return None
    return [bool(bitmap[i // 8] >> (i % 8) & 1) for i in range(stmt.num_params)]


async def unproven(backend: Backend, commands: list[JournalEntry | Inflight], tracking: SessionTracker, keys: KeyCache,
                   answers: PluginAnswers) -> str | None:  # fmt: skip
    """Why the idempotence of these commands (the journal, the command in flight) cannot be
    proven on ``backend``; None when every one of them is proven. Each is read as the server
    read it when it ran; the tables' keys come from ``keys``, a plugin's policy from ``answers``
    (asked once per text in a loss)."""
    state = tracking.state
    fk_checks = state is None or state.variables.get("foreign_key_checks", "1").upper() not in _FK_CHECKS_OFF
    before = tracking.tx.session_before if tracking.tx.active else None
    session_changed = before is not None and state is not None and before.database != state.database
    # 0 into an AUTO_INCREMENT column is a value only with NO_AUTO_VALUE_ON_ZERO, in the session
    # as it is now and as it was when the transaction began (DM sets it on its connections).
    zero_is_value = state is not None and _zero_is_value(state) and (before is None or _zero_is_value(before))
    proven: list[tuple[str, Claim, TableKeys]] = []  # each statement's table, claim and keys
    for command in commands:
        payload = command.payload
        if text_of(payload, command.statement) is None:
            continue  # PING, USE by COM_INIT_DB, ...: no rows
        analysis = command.judged()
        if analysis is None or analysis.unknown is not None:
            return "a statement the proxy cannot judge"
        text = analysis.text
        for start, end in analysis.spans:
            part = text[start:end]
            if repeatable(part, analysis.dialect, analysis.nbe):
                continue
            if await answers.idempotent(part):
                continue  # a plugin's policy vouches for it
            nulls = _null_params(payload, command.statement) if payload[:1] == b"\x17" else None
            found = claim(part, analysis.dialect, analysis.nbe, nulls)
            if found is None:
                return f"not a keyed write of constants: {analysis.statements[0].kind.value}"
            why = await _disproof(keys, backend, found, state.database if state else None, session_changed, fk_checks,
                                  zero_is_value, proven)  # fmt: skip
            if why is not None:
                return why
    return proves_together(proven)


def _zero_is_value(state: SessionState) -> bool:
    return "NO_AUTO_VALUE_ON_ZERO" in state.variables.get("sql_mode", "").upper()


async def _disproof(keys: KeyCache, backend: Backend, c: Claim, current_db: str | None, session_changed: bool,
                    fk_checks: bool, zero_is_value: bool, proven: list[tuple[str, Claim, TableKeys]]) -> str | None:  # fmt: skip
    """Why the table's keys do not prove ``c``; None when they do (``proven`` gets it then)."""
    database, table = c.table
    if database is None:
        if session_changed:
            return "the session changed database inside the transaction (which one did the statement mean?)"
        database = current_db
    if database is None:
        return "no database selected"
    table_keys = await keys.get(backend, database, table)
    if table_keys is None:
        return f"the keys of {database}.{table} are unknown"
    if not proves(c, table_keys, fk_checks, zero_is_value):
        return (f"{database}.{table}: the statement does not pin a unique key with constants (or gives its AUTO_INCREMENT "
                "column a value that may be 0, or the table has triggers / is referenced by foreign keys)")  # fmt: skip
    # Tables told apart without case: on TiDB (and with lower_case_table_names = 1) `T` is `t`;
    # where they are two tables, a dependency taken between them only refuses a proof.
    proven.append((f"{database}.{table}".lower(), c, table_keys))
    return None


# --- Views ------------------------------------------------------------------------------------

_VIEW_DEPTH = 8  # views of views of ...: deeper than this is "cannot tell"
_NAMES_PER_QUERY = 500
_NAME_MAX = 64  # longer is no table's name


async def code_in_views(backend: Backend, commands: list[JournalEntry | Inflight], tracking: SessionTracker) -> str | None:
    """Why running these commands again may run stored code hidden in a view (``SELECT * FROM
    v`` where v calls a stored function that writes); None when no name they use is a view
    that calls anything but side-effect-free built-ins. Every name is looked up, not just
    table positions (a column that is also a view's name only costs a look): ``db.name`` in db,
    a bare name in every database the session used (a view's own names: in the view's)."""
    state = tracking.state
    before = tracking.tx.session_before if tracking.tx.active else None
    databases = {db for db in (state.database if state else None, before.database if before else None) if db}
    wanted: set[tuple[str, str]] = set()
    try:
        for command in commands:
            payload = command.payload
            if payload[:1] == b"\x02":  # COM_INIT_DB
                databases.add(payload[1:].decode("utf-8", "surrogateescape"))
            text = text_of(payload, command.statement)
            if text is not None:
                analysis = command.judged()  # read as the server read it when it ran
                dialect, nbe = (analysis.dialect, analysis.nbe) if analysis is not None else (tracking.dialect, tracking.nbe)
                bare, qualified, used = _names(text, dialect, nbe)
                databases |= used
                wanted |= qualified
                wanted |= {(db, n) for db in databases for n in bare}
    except SqlParseError:
        return "a statement the proxy cannot read"
    seen: set[tuple[str, str]] = set()
    for _ in range(_VIEW_DEPTH):
        new = sorted(wanted - seen)
        if not new:
            return None
        seen.update(new)
        wanted = set()
        try:
            for i in range(0, len(new), _NAMES_PER_QUERY):
                pairs = ", ".join(f"({quote_string(db)}, {quote_string(n)})" for db, n in new[i : i + _NAMES_PER_QUERY])
                rows = await backend.query(
                    f"SELECT TABLE_SCHEMA, TABLE_NAME, VIEW_DEFINITION FROM information_schema.VIEWS WHERE (TABLE_SCHEMA, TABLE_NAME) IN ({pairs})"
                )
                for schema, view, definition in rows:
                    body = (definition or b"").decode("utf-8", "surrogateescape")
                    analysis = analyze(body, dialect=tracking.dialect) if body.strip() else None
                    if analysis is None or analysis.unknown is not None or analysis.writes:
                        return f"the view {lower_text(schema)}.{lower_text(view)} calls stored code (or its definition cannot be read)"
                    bare, qualified, _used = _names(body, tracking.dialect, False)
                    home = (schema or b"").decode("utf-8", "surrogateescape")
                    wanted |= qualified | {(home, n) for n in bare}
        except BackendError as exc:
            return f"cannot read information_schema.VIEWS: {exc}"
        except SqlParseError:
            return "a view definition the proxy cannot read"
    return f"views nested more than {_VIEW_DEPTH} deep"


def _names(text: str, dialect: Dialect, nbe: bool) -> tuple[set[str], set[tuple[str, str]], set[str]]:
    """The names of ``text`` that could name a table: bare ones, ``db.name`` pairs, and the
    databases of ``USE db``. Words, quoted names and double-quoted strings (names under
    ANSI_QUOTES) all count: a superset. Raises SqlParseError where the lexer does."""
    tokens = list(iter_tokens(text, dialect=dialect, no_backslash_escapes=nbe))
    values = [name(tok, nbe) if _could_name(tok) else None for tok in tokens]
    bare: set[str] = set()
    qualified: set[tuple[str, str]] = set()
    used: set[str] = set()
    for i, value in enumerate(values):
        if value is None or not 0 < len(value) <= _NAME_MAX:
            continue
        if i + 2 < len(tokens) and tokens[i + 1].text == "." and values[i + 2] is not None:
            qualified.add((value, values[i + 2]))
        elif not (i >= 2 and tokens[i - 1].text == "." and values[i - 2] is not None):  # not the name after "db."
            bare.add(value)
        if i > 0 and tokens[i - 1].kind is TokenKind.WORD and tokens[i - 1].text.upper() == "USE":
            used.add(value)
    return bare, qualified, used


def _could_name(tok: Token) -> bool:
    kind = tok.kind
    return kind is TokenKind.WORD or kind is TokenKind.QUOTED_IDENT or (kind is TokenKind.STRING and tok.text[0] == '"')


# --- LAST_INSERT_ID() -------------------------------------------------------------------------------


async def last_insert_id(backend: Backend, state: SessionState, keys: KeyCache) -> int | None:
    """The session's LAST_INSERT_ID(), to set again on a new connection; None when it cannot be
    known. An INSERT's OK carries an id both when the AUTO_INCREMENT column was generated (the
    new LAST_INSERT_ID()) and when the statement gave it (LAST_INSERT_ID() unchanged): the
    table's AUTO_INCREMENT column and the statement's values tell which, newest first."""
    zero_is_value = _zero_is_value(state)
    for value, text, reading in reversed(state.insert_ids):
        generated = await _generated(keys, backend, text, reading, state.database, zero_is_value) if text is not None else None
        if generated is None:
            return None
        if generated:
            return value
    return None if state.insert_id_unknown else state.last_insert_id


async def _generated(keys: KeyCache, backend: Backend, text: str, reading: ServerReading, current_db: str | None,
                     zero_is_value: bool) -> bool | None:  # fmt: skip
    """Did this INSERT/REPLACE generate its AUTO_INCREMENT value? None: cannot tell."""
    head = insert_head(text, reading.nbe, reading.dialect)
    if not isinstance(head, InsertHead):
        return None  # INSERT ... SELECT / SET: not followed
    table, columns = insert_target(text, head, reading.dialect, reading.nbe)
    if table is None:
        return None
    database = table[0] or current_db
    if database is None:
        return None
    table_keys = await keys.get(backend, database, table[1])
    if table_keys is None or table_keys.auto_increment is None:
        return None
    order = columns if columns is not None else list(table_keys.columns)
    if table_keys.auto_increment not in order:
        return True  # not given: generated
    i = order.index(table_keys.auto_increment)
    for row in insert_rows(text, head.rows_start, len(text), reading.dialect, reading.nbe):
        if i >= len(row):
            return None
        value = row[i]
        if len(value) != 1:
            return None  # an expression: not followed
        token = value[0]
        if token.kind is TokenKind.WORD and token.text.upper() in ("NULL", "DEFAULT"):
            return True
        if token.kind not in (TokenKind.NUMBER, TokenKind.STRING):
            return None
        zero = False if zero_is_value else stored_as_zero(token.text)
        if zero is None:
            return None
        if zero:
            return True  # 0, '0', 0.4: generated
    return False  # every row gave the id
