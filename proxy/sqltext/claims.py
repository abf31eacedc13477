"""What the text of a write shows (``claim``): a keyed write whose values are all constants, and
which columns it fixes -- the ``Claim`` that ``proxy.sqltext.idempotence.proves`` then checks
against the table's keys. Parsed with regexes over the rows of VALUES (linear on 50 MB) and
tokens for the rest; anything else is no claim (None)."""

from __future__ import annotations

import re

import attrs

import proxy.sqltext.tokens as tk
from proxy.sqltext.dialect import UNKNOWN, Dialect
from proxy.sqltext.inserts import InsertHead, insert_head, insert_target, table_name, table_ref_end
from proxy.sqltext.lexer import IDC, NAME_KINDS, WS, SqlParseError, Token, TokenKind, quoted_string

__all__ = ["Claim", "claim", "stored_as_zero"]


@attrs.frozen
class Claim:
    """What the text shows of a keyed write; ``proves`` checks it against the table's keys.

    ``table``: (database or None for the session's, table), as written (``table_name``).
    ``fixed``: for each row (REPLACE/ODKU) or WHERE alternative (DELETE/UPDATE), the columns
    given non-NULL constants; a column is a name, or its 0-based position when the INSERT lists
    no columns.
    ``assigned``: columns an UPDATE / ON DUPLICATE KEY UPDATE changes (besides setting a key
    column to its own WHERE value). ``where``: the columns of the WHERE.
    """

    table: tuple[str | None, str]
    fixed: tuple[frozenset[str | int], ...]
    assigned: frozenset[str] = frozenset()
    where: frozenset[str] = frozenset()
    replaces: bool = False  # REPLACE: deletes the conflicting row and inserts a new one
    upsert: bool = False  # INSERT ... ON DUPLICATE KEY UPDATE: updates the first row it conflicts with
    # Columns whose value in a row already there it may change: an UPDATE's SET (but a key set to
    # its own WHERE value), every column of an upsert's UPDATE part (``c = VALUES(c)`` too).
    updates: frozenset[str] = frozenset()
    # ODKU ``c = literal``: (c, the literal's text), which every row must insert into c as well;
    # then the insert's column list (an upsert's, None: the table's order) and each row's literal
    # texts.
    same_as_inserted: tuple[tuple[str, str], ...] = ()
    columns: tuple[str, ...] | None = None
    rows: tuple[tuple[str, ...], ...] = ()
    # Columns some row gives a value that may be stored as 0 (``stored_as_zero``): in an
    # AUTO_INCREMENT column that generates a new id, unless sql_mode has NO_AUTO_VALUE_ON_ZERO.
    maybe_zero: frozenset[str | int] = frozenset()


def claim(sql: str, dialect: Dialect = UNKNOWN, nbe: bool = False, null_params: list[bool] | None = None) -> Claim | None:
    """The Claim of a keyed write of constants, or None for anything else. ``?`` placeholders
    count as constants (prepared statements); ``null_params`` (from an execute's NULL bitmap)
    says which are bound to NULL -- without it, a ``?`` fixes no column of a row."""
    try:
        kws = tk.leading_keywords(sql, 2, dialect=dialect, nbe=nbe)
        first = kws[0] if kws else None
        if first in ("INSERT", "REPLACE"):
            return _insert_claim(sql, dialect, nbe, null_params)
        if first in ("UPDATE", "DELETE"):
            tokens = tk.statement_tokens(sql, nbe, dialect)
            return _update_claim(tokens, nbe) if first == "UPDATE" else _delete_claim(tokens, nbe)
    except (SqlParseError, RecursionError):
        return None
    return None


# --- REPLACE / INSERT ... ON DUPLICATE KEY UPDATE -----------------------------------------------


def _literal_pattern(backslash_escapes: bool) -> str:
    """One constant literal (a string, number, NULL/TRUE/FALSE, hex/bit, introduced string, ?),
    matched atomically."""
    sq = quoted_string("'", backslash_escapes)
    dq = quoted_string('"', backslash_escapes)
    hex_bit = rf"[Xx]'[0-9A-Fa-f]*+'|[Bb]'[01]*+'|0x[0-9A-Fa-f]++(?!{IDC})|0b[01]++(?!{IDC})"
    return (
        rf"(?>{sq}"
        rf"|[-+]?(?:[0-9]++(?:\.[0-9]*+)?|\.[0-9]++)(?:[eE][-+]?[0-9]++)?(?!{IDC})"
        rf"|(?i:NULL|TRUE|FALSE)(?!{IDC})"
        rf"|_[0-9A-Za-z_]++{WS}*+(?:{sq}|{dq}|{hex_bit})"
        rf"|{dq}|[Nn]{sq}|{hex_bit}|\?)"
    )


def _literal_rows_regex(backslash_escapes: bool) -> re.Pattern[str]:
    """``(lit, lit, ...), (...)`` where each lit is a constant: linear and fast on 50 MB."""
    literal = _literal_pattern(backslash_escapes)
    # A bare "," is tried before the whitespace-tolerant separator: it is by far the common case.
    ws, sep = f"{WS}*+", f"(?:,|{WS}*+,{WS}*+)"
    row = rf"\({ws}{literal}(?:{sep}{literal})*+{ws}\)"
    return re.compile(rf"{row}(?:{sep}{row})*+")


_LITERAL_ROWS = {False: _literal_rows_regex(True), True: _literal_rows_regex(False)}
_LITERAL = {False: re.compile(_literal_pattern(True)), True: re.compile(_literal_pattern(False))}
_ROW_OPEN = re.compile(rf"{WS}*+,?{WS}*+\({WS}*+")  # before a row's first value
_VALUE_SEP = re.compile(rf"{WS}*+(,|\)){WS}*+")  # after a value: the next one, or the row's end


def _row_literals(sql: str, start: int, end: int, nbe: bool):
    """The literal values of each row of ``(lit, ...), (lit, ...)`` between ``start`` and
    ``end`` (already checked by _LITERAL_ROWS): regex steps, no tokenizing."""
    literal = _LITERAL[nbe]
    pos = start
    while pos < end:
        opened = _ROW_OPEN.match(sql, pos, end)
        if opened is None:
            return
        pos = opened.end()
        row = []
        while True:
            value = literal.match(sql, pos, end)
            if value is None:
                return
            row.append(value.group())
            sep = _VALUE_SEP.match(sql, value.end(), end)
            if sep is None:
                return
            pos = sep.end()
            if sep.group(1) == ")":
                break
        yield row


def _insert_claim(sql: str, dialect: Dialect, nbe: bool, null_params: list[bool] | None) -> Claim | None:
    head = insert_head(sql, nbe, dialect)
    if not isinstance(head, InsertHead) or "IGNORE" in head.modifiers:
        return None
    rows = _LITERAL_ROWS[nbe].match(sql, head.rows_start)
    if rows is None:
        return None
    tail = tk.statement_tokens(sql, nbe, dialect, start=rows.end())
    if head.verb == "REPLACE":
        if tail:
            return None
        assigned: frozenset[str] = frozenset()
    table, columns = insert_target(sql, head, dialect, nbe)
    if table is None:
        return None
    same: tuple[tuple[str, str], ...] = ()
    updates: frozenset[str] = frozenset()
    if head.verb == "INSERT":
        updated = _on_duplicate_assigned(tail, columns, nbe)
        if updated is None:
            return None
        assigned, same, updates = updated
    params = iter(null_params) if null_params is not None else None
    literal_rows = _row_literals(sql, head.rows_start, rows.end(), nbe)
    kept = [tuple(row) for row in literal_rows] if same else None  # kept only when a constant must be compared
    per_row = {_fixed_columns(row, columns, params) for row in (kept if kept is not None else literal_rows)}
    fixed = tuple({f for f, _ in per_row})
    maybe_zero = frozenset().union(*(z for _, z in per_row))
    if kept is None:
        upsert = head.verb == "INSERT"
        return Claim(table, fixed, assigned, replaces=not upsert, upsert=upsert, updates=updates,
                     columns=tuple(columns) if upsert and columns is not None else None, maybe_zero=maybe_zero)  # fmt: skip
    return Claim(table, fixed, assigned, same_as_inserted=same, columns=tuple(columns) if columns is not None else None,
                 rows=tuple(kept), upsert=True, updates=updates, maybe_zero=maybe_zero)  # fmt: skip


def _fixed_columns(row, columns: list[str] | None, null_params) -> tuple[frozenset[str | int], frozenset[str | int]]:
    """The columns a row gives a non-NULL constant (by name, or position without a list), and
    those of them whose value may be stored as 0. ``null_params``: an iterator over "is the next
    placeholder NULL" (None: unknown)."""
    fixed: set[str | int] = set()
    zero: set[str | int] = set()
    for i, value in enumerate(row):
        if value == "?":
            if null_params is None or next(null_params, True):
                continue  # may be bound to NULL
        elif value.upper() == "NULL":
            continue  # NULL: an AUTO_INCREMENT id generated anew, or a nullable key
        column = columns[i] if columns is not None and i < len(columns) else i
        fixed.add(column)
        if stored_as_zero(value) is not False:
            zero.add(column)
    return frozenset(fixed), frozenset(zero)


_NUMBER = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


def stored_as_zero(literal: str) -> bool | None:
    """Does an integer column store this literal as 0 (which in an AUTO_INCREMENT column makes a
    new id, unless sql_mode has NO_AUTO_VALUE_ON_ZERO)? True for 0, '0', 0.4, FALSE; False for a
    number of 1 or more, bare or quoted, and TRUE; None when the text cannot tell: 0.5 to 1 (a
    float rounds half to even), a negative number (0 in an UNSIGNED column without strict mode),
    a hex or bit value, another string, a ``?``."""
    upper = literal.upper()
    if upper in ("TRUE", "FALSE"):
        return upper == "FALSE"
    text = literal[1:-1] if len(literal) >= 2 and literal[0] == literal[-1] and literal[0] in "'\"" else literal
    if _NUMBER.fullmatch(text.strip()) is None:
        return None
    value = float(text)
    return True if abs(value) < 0.5 else False if value >= 1 else None


def _on_duplicate_assigned(
    tokens: list[Token], columns: list[str] | None, nbe: bool
) -> tuple[frozenset[str], tuple[tuple[str, str], ...], frozenset[str]] | None:
    """``[AS alias [(cols)]] ON DUPLICATE KEY UPDATE`` whose right sides use only the new row's
    values or literals, never the existing row (``c = c + 1`` is not idempotent): the columns
    it sets to something else than their own new value (``c = VALUES(c)`` makes the row what
    the statement inserts, as REPLACE does), with (column, literal) for each ``c = literal``
    (the rows must insert that literal into c), and every column it sets; or None."""
    i, alias, alias_columns = 0, None, []
    if tk.word(tokens, 0) == "AS":
        if len(tokens) < 2 or tokens[1].kind not in NAME_KINDS:
            return None
        alias, i = tk.name(tokens[1], nbe).lower(), 2
        if tk.is_punct(tokens, 2, "("):
            close = tk.closing_paren(tokens, 2)
            if close < 0:
                return None
            alias_columns = [tk.name(t, nbe).lower() for t in tokens[3:close] if t.kind in NAME_KINDS]
            i = close + 1
    if [tk.word(tokens, j) for j in range(i, i + 4)] != ["ON", "DUPLICATE", "KEY", "UPDATE"]:
        return None
    items = tk.split_top_level(tokens[i + 4 :])
    assigned: set[str] = set()
    same: list[tuple[str, str]] = []
    updates: set[str] = set()
    for item in items:
        column_end = _column_ref_end(item, 0)
        if column_end < 0 or not tk.is_punct(item, column_end, "="):
            return None
        rhs = item[column_end + 1 :]
        column = _column_key(item[:column_end])
        updates.add(column)
        source = _new_row_column(rhs, alias, alias_columns, columns, nbe)
        if source == column:
            continue  # the column gets its own inserted value: the row becomes what is inserted
        if source is not None or len(rhs) != 1 or rhs[0].kind is TokenKind.PLACEHOLDER:
            return None  # another column's new value, an expression, a value bound later
        if not tk.is_constant(rhs, bare_words=False, placeholders=False):
            return None
        assigned.add(column)
        same.append((column, rhs[0].text))
    return (frozenset(assigned), tuple(same), frozenset(updates)) if items else None


def _new_row_column(rhs: list[Token], alias: str | None, alias_columns: list[str], columns: list[str] | None, nbe: bool) -> str | None:
    """The column whose inserted value ``rhs`` names: VALUES(col), alias.col, or a column alias
    of ``AS alias(cols)`` (mapped to the insert's column at the same position); else None."""
    n = len(rhs)
    if n == 4 and tk.word(rhs, 0) == "VALUES" and tk.is_punct(rhs, 1, "(") and rhs[2].kind in NAME_KINDS and tk.is_punct(rhs, 3, ")"):
        return tk.name(rhs[2], nbe).lower()
    if alias is not None and n == 3 and rhs[0].kind in NAME_KINDS and tk.is_punct(rhs, 1, ".") and rhs[2].kind in NAME_KINDS:
        if tk.name(rhs[0], nbe).lower() != alias:
            return None
        name = tk.name(rhs[2], nbe).lower()
        return _aliased(name, alias_columns, columns) if alias_columns else name
    if n == 1 and rhs[0].kind in NAME_KINDS and tk.name(rhs[0], nbe).lower() in alias_columns:
        return _aliased(tk.name(rhs[0], nbe).lower(), alias_columns, columns)
    return None


def _aliased(name: str, alias_columns: list[str], columns: list[str] | None) -> str:
    """The insert column that column alias ``name`` stands for (itself when unknown)."""
    i = alias_columns.index(name) if name in alias_columns else -1
    return columns[i] if columns is not None and 0 <= i < len(columns) else f"<alias {name}>"


# --- DELETE / UPDATE ------------------------------------------------------------------------------


def _column_ref_end(tokens: list[Token], i: int) -> int:
    """Index after ``col``, ``t.col`` or ``db.t.col`` starting at i, or -1."""
    if i >= len(tokens) or tokens[i].kind not in NAME_KINDS:
        return -1
    i += 1
    for _ in range(2):
        if tk.is_punct(tokens, i, ".") and i + 1 < len(tokens) and tokens[i + 1].kind in NAME_KINDS:
            i += 2
    return i


def _column_key(tokens: list[Token]) -> str:
    """Column name of a column reference, without qualifiers, lower-cased."""
    return tk.name(tokens[-1]).lower()


def _literal_key(tokens: list[Token]) -> str | None:
    """Comparable text of a literal; None for a placeholder (its value is unknown)."""
    if any(t.kind is TokenKind.PLACEHOLDER for t in tokens):
        return None
    return " ".join(t.text.upper() if t.kind is TokenKind.WORD else t.text for t in tokens)


def _strip_limit_one(tokens: list[Token]) -> tuple[list[Token], bool]:
    if len(tokens) >= 2 and tk.word(tokens, len(tokens) - 2) == "LIMIT" and tokens[-1].text == "1":
        return tokens[:-2], True
    return tokens, False


_MAX_NESTING = 32  # ((((k = 1)))) deeper than this is no claim: each level is a pass over the rest


def _keyed_conjunction(tokens: list[Token], depth: int = 0) -> dict[str, str | None] | None:
    """``k1 = lit AND k2 = lit AND (a, b) = (1, 2) ...`` -> {column: literal key}, else None.
    ``k IS NULL`` fixes nothing (a nullable key can match several rows): it is left out."""
    result: dict[str, str | None] = {}
    for pred in tk.split_words(tokens, "AND"):
        pairs = _keyed_predicate(pred, depth)
        if pairs is None:
            return None
        result.update(pairs)
    return result


def _keyed_predicate(pred: list[Token], depth: int) -> dict[str, str | None] | None:
    if not pred or depth > _MAX_NESTING:
        return None
    if tk.is_punct(pred, 0, "(") and tk.closing_paren(pred, 0) == len(pred) - 1:
        inner = pred[1:-1]
        if not any(tk.is_punct(inner, j, ",") for j in range(len(inner))):
            return _keyed_conjunction(inner, depth + 1)  # (k = 1 AND j = 2)
        return None
    if tk.is_punct(pred, 0, "("):  # (a, b) = (1, 2)
        close = tk.closing_paren(pred, 0)
        if close < 0 or not tk.is_punct(pred, close + 1, "=") or not tk.is_punct(pred, close + 2, "("):
            return None
        if tk.closing_paren(pred, close + 2) != len(pred) - 1:
            return None
        columns = tk.split_top_level(pred[1:close])
        values = tk.split_top_level(pred[close + 3 : -1])
        if len(columns) != len(values):
            return None
        result: dict[str, str | None] = {}
        for col, val in zip(columns, values):
            if _column_ref_end(col, 0) != len(col) or not _non_null_constant(val):
                return None
            result[_column_key(col)] = _literal_key(val)
        return result
    end = _column_ref_end(pred, 0)
    if end < 0 or end >= len(pred):
        return None
    column, op, value = pred[:end], pred[end], pred[end + 1 :]
    if op.kind is TokenKind.PUNCT and op.text in ("=", "<=>"):
        if _non_null_constant(value):
            return {_column_key(column): _literal_key(value)}
    elif op.kind is TokenKind.WORD and op.text.upper() == "IS" and len(value) == 1:
        if tk.word(value, 0) == "NULL" or value[0].kind is TokenKind.PLACEHOLDER:
            return {}  # DM's "k IS NULL" (or "k IS ?" before interpolation): fixes no key column
    return None


def _non_null_constant(value: list[Token]) -> bool:
    return tk.is_constant(value, bare_words=False, placeholders=True) and not (len(value) == 1 and tk.word(value, 0) == "NULL")


def _keyed_alternatives(tokens: list[Token]) -> tuple[dict[str, str | None], ...] | None:
    """A WHERE naming a constant set of rows: one keyed conjunction, ``alt OR alt ...``,
    ``k IN (lit, ...)`` or ``(a, b) IN ((lit, lit), ...)``: the conjunction of each row."""
    alternatives = tk.split_words(tokens, "OR")
    if len(alternatives) > 1:
        keys = tuple(_keyed_conjunction(alt) for alt in alternatives)
        if any(k is None or k.keys() != keys[0].keys() for k in keys):  # type: ignore[union-attr]
            return None
        return keys  # type: ignore[return-value]
    one = _keyed_conjunction(tokens)
    if one is not None:
        return (one,)
    if tk.is_punct(tokens, 0, "("):  # a tuple of columns
        close = tk.closing_paren(tokens, 0)
        if close < 0:
            return None
        columns = tk.split_top_level(tokens[1:close])
        if not all(_column_ref_end(c, 0) == len(c) for c in columns):
            return None
        names, i = [_column_key(c) for c in columns], close + 1
    else:
        i = _column_ref_end(tokens, 0)
        if i < 0:
            return None
        names = [_column_key(tokens[:i])]
    if tk.word(tokens, i) != "IN" or not tk.is_punct(tokens, i + 1, "(") or tk.closing_paren(tokens, i + 1) != len(tokens) - 1:
        return None
    result = []
    for value in tk.split_top_level(tokens[i + 2 : -1]):
        if len(names) > 1:  # each value is a (lit, lit, ...) tuple of the same width
            if not (tk.is_punct(value, 0, "(") and tk.closing_paren(value, 0) == len(value) - 1):
                return None
            parts = tk.split_top_level(value[1:-1])
        else:
            parts = [value]
        if len(parts) != len(names) or not all(_non_null_constant(p) for p in parts):
            return None
        result.append({n: _literal_key(p) for n, p in zip(names, parts)})
    return tuple(result)


def _delete_claim(tokens: list[Token], nbe: bool) -> Claim | None:
    """DELETE [LOW_PRIORITY] [QUICK] FROM t WHERE <keyed rows> [LIMIT 1]."""
    i = 1
    while tk.word(tokens, i) in ("LOW_PRIORITY", "QUICK"):
        i += 1
    if tk.word(tokens, i) != "FROM":
        return None
    start = i + 1
    i = table_ref_end(tokens, start)
    if i < 0 or tk.word(tokens, i) != "WHERE":
        return None
    condition, limited = _strip_limit_one(tokens[i + 1 :])
    alternatives = _keyed_alternatives(condition)
    if alternatives is None or (limited and len(alternatives) > 1):
        return None  # LIMIT 1 of several keys deletes "one of them": another one the second time
    fixed = tuple(frozenset(a) for a in alternatives)
    return Claim(table_name(tokens[start:i], nbe), fixed, where=frozenset().union(*fixed))


def _update_claim(tokens: list[Token], nbe: bool) -> Claim | None:
    """UPDATE [LOW_PRIORITY] t SET c = lit, ... WHERE <keyed conjunction> [LIMIT 1], where a key
    column may only be "assigned" its own WHERE value (DM sets every column, key included)."""
    start = 2 if tk.word(tokens, 1) == "LOW_PRIORITY" else 1
    i = table_ref_end(tokens, start)
    if i < 0 or tk.word(tokens, i) != "SET":
        return None
    where = next((j for j in range(i + 1, len(tokens)) if tk.word(tokens, j) == "WHERE"), -1)
    if where < 0:
        return None
    values: dict[str, str | None] = {}
    for item in tk.split_top_level(tokens[i + 1 : where]):
        end = _column_ref_end(item, 0)
        if end < 0 or not tk.is_punct(item, end, "=") or not tk.is_constant(item[end + 1 :], bare_words=False, placeholders=True):
            return None
        values[_column_key(item[:end])] = _literal_key(item[end + 1 :])
    keys = _keyed_conjunction(_strip_limit_one(tokens[where + 1 :])[0])
    if keys is None or not values:
        return None
    assigned = set()
    for column, value in values.items():
        if column in keys and value is not None and keys[column] == value:
            continue  # "sets" a key column to the value it is selected by: no change
        if column in keys:
            return None  # moves the row out of its own WHERE
        assigned.add(column)
    return Claim(table_name(tokens[start:i], nbe), (frozenset(keys),), frozenset(assigned), frozenset(keys), updates=frozenset(assigned))
