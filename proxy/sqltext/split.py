"""Split an oversized multi-row INSERT/REPLACE ... VALUES into statements under a size limit.

Works on the raw COM_QUERY text as bytes, so bytes that are not valid UTF-8 (``_binary'...'``
literals) survive untouched: only ASCII bytes (quotes, backslashes, parentheses, comment
markers) matter to the MySQL lexer with utf8mb4, latin1 or binary connection charsets.
Multi-byte charsets whose second byte can be ``\\`` or a quote (sjis, gbk, big5) are not
supported.

Rows are found by one regular expression (C speed, linear: strings, comments and nested
parentheses are matched whole with possessive quantifiers, so nothing backtracks). Greedy
packing reuses it: matching the rows pattern with ``endpos`` at the end of the room left in a
piece yields exactly the rows that fit, because a row can only match once its closing ``)`` is
inside the window and the lexing of everything before that ``)`` is the same as in the full text.

Splitting changes what the client can observe: each piece is a statement of its own (atomic on
its own, with its own affected-rows count and LAST_INSERT_ID), so the caller must run the pieces
inside one transaction and add up the results.
"""

from __future__ import annotations

import re

import proxy.sqltext.tokens as tk
from proxy.sqltext.inserts import insert_head
from proxy.sqltext.lexer import (
    BACKTICK_IDENT,
    BLOCK_COMMENT,
    DASH_COMMENT,
    HASH_COMMENT,
    TRIVIA,
    WS,
    SqlParseError,
    Token,
    TokenKind,
    iter_tokens,
    quoted_string,
    tokenize,
)

__all__ = ["CannotSplit", "MAX_NESTING", "count_rows", "split_values_statement"]

# Parentheses nesting inside one row that the row pattern follows (CONCAT(LEFT('a', 1), ...)).
MAX_NESTING = 16
# The head (INSERT ... VALUES) is looked for in this many bytes first; longer heads are rare.
_HEAD_PROBE = 64 * 1024
# A malformed row is diagnosed with the Python lexer over at most this many bytes.
_DIAGNOSE_WINDOW = 1024 * 1024


class CannotSplit(ValueError):
    """The statement cannot be split safely; the message says why."""


def _row_pattern(backslash_escapes: bool) -> bytes:
    sq = quoted_string("'", backslash_escapes)
    dq = quoted_string('"', backslash_escapes)
    # Everything but quotes, parentheses and comment starters goes by in runs; "-" and "/" are
    # ordinary unless they start a comment; "/*!" (executable comment) matches nothing, so a
    # row containing one is refused.
    atom = "|".join(
        [
            r"[^'\"`()/#\-]++",
            sq,
            dq,
            BACKTICK_IDENT,
            HASH_COMMENT,
            DASH_COMMENT,
            BLOCK_COMMENT,
            r"-",
            r"/(?!\*)",
        ]
    )
    row = rf"\((?:{atom})*+\)"
    for _ in range(MAX_NESTING - 1):
        row = rf"\((?:{atom}|{row})*+\)"
    return row.encode("ascii")


# Between rows: a comma with whitespace and comments around it.
_GAP = rf"(?:{WS}|{HASH_COMMENT}|{DASH_COMMENT}|{BLOCK_COMMENT})*+"
_SEP = f"{_GAP},{_GAP}".encode("ascii")


def _compile(backslash_escapes: bool) -> tuple[re.Pattern[bytes], re.Pattern[bytes], re.Pattern[bytes]]:
    row = _row_pattern(backslash_escapes)
    return re.compile(row), re.compile(row + rb"(?:" + _SEP + row + rb")*+"), re.compile(_SEP)


_PATTERNS = {False: _compile(True), True: _compile(False)}  # keyed by no_backslash_escapes
_TRAILING_WS = b" \t\n\r\f\v"


def split_values_statement(sql: bytes, limit: int, *, no_backslash_escapes: bool = False) -> list[bytes]:
    """Split ``INSERT|REPLACE ... VALUES (row), (row)... [suffix]`` into statements that each fit
    in a COM_QUERY packet of ``limit`` bytes: ``len(piece) + 1 <= limit`` (the +1 is the
    COM_QUERY command byte in front of the text, which counts against max_allowed_packet).

    Each piece is the original head (everything up to the first row, leading comments
    included), as many whole rows as fit (bytes, separators and order preserved), then the
    original suffix (``ON DUPLICATE KEY UPDATE ...`` / ``AS alias ...``; a trailing ``;`` is
    dropped). A statement that already fits is returned unchanged as the only piece.

    Raises CannotSplit if the statement is not such an INSERT/REPLACE, is malformed (unterminated
    literal or comment, unbalanced parentheses), contains executable comments around or inside
    the rows, or if one row with the head and suffix is larger than the limit.
    """
    sql = bytes(sql)
    nbe = no_backslash_escapes
    rows_start = _rows_start(sql, nbe)
    # The room for rows depends on the suffix, which is only known once the rows are scanned.
    # Packing with a guessed suffix and checking it afterwards keeps this to one pass.
    guess = _guess_rows_end(sql, rows_start)
    if guess is not None:
        try:
            suffix = _suffix(sql, guess, nbe)
            pieces, rows_end = _pack(sql, rows_start, suffix, limit, nbe)
        except (CannotSplit, _RowTooLarge):
            pass  # perhaps only because of the guess: decide with the real suffix below
        else:
            if rows_end == guess:
                return [sql] if len(sql) + 1 <= limit else pieces
    rows_end = _rows_end(sql, rows_start, nbe)
    suffix = _suffix(sql, rows_end, nbe)
    try:
        pieces, _ = _pack(sql, rows_start, suffix, limit, nbe)
    except _RowTooLarge as exc:
        raise CannotSplit(str(exc)) from None
    return [sql] if len(sql) + 1 <= limit else pieces


class _RowTooLarge(Exception):
    pass


def _pack(sql: bytes, rows_start: int, suffix: bytes, limit: int, nbe: bool) -> tuple[list[bytes], int]:
    """Greedy packing: (pieces, offset where the rows end)."""
    row_re, rows_re, sep_re = _PATTERNS[nbe]
    head = memoryview(sql)[:rows_start]
    body = memoryview(sql)
    room = max(limit - 1 - len(head) - len(suffix), 0)  # bytes of rows one piece can hold
    pieces = []
    pos = rows_start
    while True:
        # With endpos, the rows pattern stops at the last row that ends inside the room.
        fitting = rows_re.match(sql, pos, pos + room)
        if fitting is None:
            row = row_re.match(sql, pos)
            if row is None:
                raise CannotSplit(_diagnose_row(sql, pos, nbe))
            raise _RowTooLarge(
                f"a single row is larger than the limit: the row at byte {pos} is {row.end() - pos} bytes, and "
                f"with the {len(head)}-byte head and {len(suffix)}-byte suffix a {limit}-byte packet leaves room for {room}"
            )
        end = fitting.end()
        pieces.append(b"".join((head, body[pos:end], suffix)))
        sep = sep_re.match(sql, end)
        if sep is None:
            return pieces, end
        pos = sep.end()


def _rows_end(sql: bytes, rows_start: int, nbe: bool) -> int:
    """Where the rows end (one full scan); CannotSplit if a row is malformed."""
    _, rows_re, sep_re = _PATTERNS[nbe]
    rows = rows_re.match(sql, rows_start)
    if rows is None:
        raise CannotSplit(_diagnose_row(sql, rows_start, nbe))
    sep = sep_re.match(sql, rows.end())
    if sep is not None:  # a "," after the last row that matched: the next row is malformed
        raise CannotSplit(_diagnose_row(sql, sep.end(), nbe))
    return rows.end()


# Where the rows probably end: the last ")" before "AS alias", "ON DUPLICATE", or the end.
_ROWS_END_HINTS = [
    re.compile(rf"\)(?={WS}*+[Aa][Ss]{WS})".encode()),
    re.compile(rf"\)(?={WS}*+[Oo][Nn]{WS}++[Dd][Uu][Pp][Ll][Ii][Cc][Aa][Tt][Ee]{WS})".encode()),
    re.compile(rf"\)(?=(?:{WS}|;)*+\Z)".encode()),
]
_GUESS_WINDOW = 64 * 1024


def _guess_rows_end(sql: bytes, rows_start: int) -> int | None:
    """A cheap guess from the last bytes; a wrong guess only costs a second pass."""
    tail = max(rows_start, len(sql) - _GUESS_WINDOW)
    for hint in _ROWS_END_HINTS:
        last = None
        for last in hint.finditer(sql, tail):  # noqa: B007 (what is kept is the last match)
            pass
        if last is not None:
            return last.end()
    return None


def _rows_start(sql: bytes, nbe: bool) -> int:
    """Offset of the first row's "(" after VALUES, or CannotSplit."""
    probe = sql if len(sql) <= _HEAD_PROBE else sql[:_HEAD_PROBE]
    head = _parse_head(probe, nbe)
    if isinstance(head, str) and probe is not sql:  # maybe the head is longer than the probe
        head = _parse_head(sql, nbe)
    if isinstance(head, str):
        raise CannotSplit(head)
    return head


def _parse_head(data: bytes, nbe: bool) -> int | str:
    try:
        head = insert_head(data.decode("latin-1"), nbe)
    except SqlParseError as exc:
        return f"{exc.reason} at byte {exc.offset} before the VALUES rows"
    return head if isinstance(head, str) else head.rows_start


def _suffix(sql: bytes, rows_end: int, nbe: bool) -> bytes:
    """The text after the rows, without a trailing ";" and whitespace; CannotSplit unless it is
    empty, ``AS alias [(cols)]`` and/or ``ON DUPLICATE KEY UPDATE ...``."""
    text = sql[rows_end:].decode("latin-1")
    try:
        tokens = tokenize(text, no_backslash_escapes=nbe, trivia=True)
    except SqlParseError as exc:
        raise CannotSplit(f"{exc.reason} at byte {rows_end + (exc.offset or 0)}, after the VALUES rows") from None
    significant = [t for t in tokens if t.kind not in TRIVIA]
    if any(t.kind in (TokenKind.EXEC_OPEN, TokenKind.EXEC_CLOSE) for t in tokens):
        raise CannotSplit("executable comment after the VALUES rows")
    end = len(text)
    if significant and significant[-1].text == ";":
        end = significant[-1].start
        significant = significant[:-1]
    if any(t.kind is TokenKind.PUNCT and t.text == ";" for t in significant):
        raise CannotSplit("more than one statement")
    if significant:
        _check_suffix(significant)
    return sql[rows_end : rows_end + end].rstrip(_TRAILING_WS)


def _check_suffix(tokens: list[Token]) -> None:
    words = [t.text.upper() if t.kind is TokenKind.WORD else None for t in tokens]
    i = 0
    if words[0] == "AS":  # MySQL 8 row alias: AS new [(a, b)]
        if len(tokens) < 2 or tokens[1].kind not in (TokenKind.WORD, TokenKind.QUOTED_IDENT):
            raise CannotSplit("expected an alias after AS")
        i = 2
        if i < len(tokens) and tokens[i].text == "(":
            i = tk.closing_paren(tokens, i) + 1
            if i == 0:
                raise CannotSplit("unbalanced parentheses after the VALUES rows")
        if i == len(tokens):
            return
    if words[i : i + 4] != ["ON", "DUPLICATE", "KEY", "UPDATE"]:
        raise CannotSplit(f"unexpected {tokens[i].text!r} after the VALUES rows")
    depth = 0
    for tok, word in zip(tokens, words):
        if tok.kind is TokenKind.PUNCT:
            depth += tok.text == "("
            depth -= tok.text == ")"
            if depth < 0:
                raise CannotSplit("unbalanced parentheses after the VALUES rows")
        elif word == "RETURNING" and depth == 0:  # MariaDB: one result set per piece
            raise CannotSplit("INSERT ... RETURNING cannot be split")
    if depth:
        raise CannotSplit("unbalanced parentheses after the VALUES rows")


def _diagnose_row(sql: bytes, pos: int, nbe: bool) -> str:
    """Why the row starting at ``pos`` does not match the row pattern (error path only)."""
    window = sql[pos : pos + _DIAGNOSE_WINDOW]
    truncated = pos + len(window) < len(sql)
    depth = deepest = 0
    try:
        for tok in iter_tokens(window.decode("latin-1"), no_backslash_escapes=nbe, trivia=True):
            at = pos + tok.start
            if tok.kind in (TokenKind.EXEC_OPEN, TokenKind.EXEC_CLOSE):
                return f"executable comment inside the VALUES rows at byte {at}"
            if tok.kind in TRIVIA:
                continue
            if depth == 0 and tok.text != "(":
                return f"expected '(' starting a row at byte {at}, found {tok.text!r}"
            if tok.kind is TokenKind.PUNCT and tok.text in ("(", ")"):
                depth += 1 if tok.text == "(" else -1
                deepest = max(deepest, depth)
                if depth == 0:
                    if deepest > MAX_NESTING:
                        return f"the row at byte {pos} nests parentheses deeper than {MAX_NESTING}"
                    return f"the row at byte {pos} could not be scanned"
    except SqlParseError as exc:
        if not truncated:
            return f"{exc.reason} at byte {pos + (exc.offset or 0)}"
    if truncated:
        return f"the row at byte {pos} is malformed or longer than {_DIAGNOSE_WINDOW} bytes"
    if depth == 0:
        return f"expected a row after byte {pos}"
    return f"unbalanced parentheses: the row at byte {pos} is never closed"


def count_rows(statement: bytes, *, no_backslash_escapes: bool = False) -> int:
    """How many rows an ``INSERT|REPLACE ... VALUES`` statement has (e.g. one piece of a split:
    the server numbers rows in its warnings from the piece's first row)."""
    nbe = no_backslash_escapes
    row_re, _, sep_re = _PATTERNS[nbe]
    pos = _rows_start(statement, nbe)
    count = 0
    while (row := row_re.match(statement, pos)) is not None:
        count += 1
        sep = sep_re.match(statement, row.end())
        if sep is None:
            break
        pos = sep.end()
    return count
