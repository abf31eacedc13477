"""The head of ``INSERT|REPLACE ... VALUES``: verb, modifiers, table, columns, and where the
rows start (split mode cuts the rows; safe mode checks them)."""

from __future__ import annotations

import re

import attrs

import proxy.sqltext.tokens as tk
from proxy.sqltext.dialect import UNKNOWN, Dialect
from proxy.sqltext.lexer import IDC, NAME_KINDS, TRIVIA, WS, Token, TokenKind, iter_tokens

__all__ = ["InsertHead", "insert_head", "parse_insert_head", "insert_target", "insert_rows", "table_ref_end", "table_name"]


@attrs.frozen
class InsertHead:
    """The part of ``INSERT|REPLACE [modifiers] [INTO] t [PARTITION (..)] [(cols)] VALUES``."""

    verb: str  # "INSERT" or "REPLACE"
    modifiers: frozenset[str]  # LOW_PRIORITY, DELAYED, HIGH_PRIORITY, IGNORE
    rows_start: int  # offset of the first row's "("


class _Cursor:
    """Significant tokens read one at a time, so a 60 MB INSERT is never fully tokenized.
    Tracks whether the next token is inside an executable comment."""

    def __init__(self, sql: str, nbe: bool, dialect: Dialect) -> None:
        self._tokens = iter_tokens(sql, dialect=dialect, no_backslash_escapes=nbe, trivia=True)
        self._peeked: Token | None = None
        self._done = False
        self.in_exec_comment = False

    def peek(self) -> Token | None:
        if self._peeked is None and not self._done:
            for tok in self._tokens:
                if tok.kind is TokenKind.EXEC_OPEN:
                    self.in_exec_comment = True
                elif tok.kind is TokenKind.EXEC_CLOSE:
                    self.in_exec_comment = False
                elif tok.kind not in TRIVIA:
                    self._peeked = tok
                    break
            else:
                self._done = True
        return self._peeked

    def next(self) -> Token | None:
        tok = self.peek()
        self._peeked = None
        return tok

    def word(self) -> str | None:
        tok = self.peek()
        return tok.text.upper() if tok is not None and tok.kind is TokenKind.WORD else None

    def punct(self, text: str) -> bool:
        tok = self.peek()
        return tok is not None and tok.kind is TokenKind.PUNCT and tok.text == text

    def skip_parens(self) -> bool:
        """Consume a balanced (...) group starting at the current '('."""
        depth = 0
        while (tok := self.next()) is not None:
            if tok.kind is TokenKind.PUNCT:
                depth += tok.text == "("
                depth -= tok.text == ")"
                if depth == 0:
                    return True
        return False


_INSERT_MODIFIERS = frozenset({"LOW_PRIORITY", "DELAYED", "HIGH_PRIORITY", "IGNORE"})
_NOT_TABLE_NAMES = frozenset({"VALUES", "VALUE", "SET", "SELECT", "PARTITION", "WITH", "TABLE"})


def _insert_head_regex() -> re.Pattern[str]:
    """The common head shape (the verb first, no comments inside, plain names); others go
    through tokens."""
    keyword = rf"(?i:INTO|VALUES?|SET|SELECT|PARTITION|WITH|TABLE)(?!{IDC})"
    name = rf"(?:`[^`]*+(?:``[^`]*+)*+`|(?!{keyword}){IDC}++)"
    return re.compile(
        rf"((?i:INSERT|REPLACE))((?:{WS}++(?i:LOW_PRIORITY|DELAYED|HIGH_PRIORITY|IGNORE))*+)"
        rf"{WS}++(?:(?i:INTO){WS}++)?{name}(?:{WS}*+\.{WS}*+{name})?{WS}*+"
        rf"(?:\((?:{WS}*+{name}{WS}*+(?:,{WS}*+{name}{WS}*+)*+)?\){WS}*+)?"
        rf"(?i:VALUES?){WS}*+(?=\()"
    )


_INSERT_HEAD = _insert_head_regex()


def insert_head(sql: str, nbe: bool, dialect: Dialect = UNKNOWN) -> InsertHead | str:
    """InsertHead, or the reason ``sql`` is not ``INSERT|REPLACE ... VALUES (``."""
    m = _INSERT_HEAD.match(sql)
    if m is not None:
        return InsertHead(m.group(1).upper(), frozenset(m.group(2).upper().split()), m.end())
    cur = _Cursor(sql, nbe, dialect)
    verb = cur.word()
    if verb not in ("INSERT", "REPLACE"):
        return "not an INSERT or REPLACE statement"
    cur.next()
    modifiers = set()
    while (word := cur.word()) in _INSERT_MODIFIERS:
        modifiers.add(word)
        cur.next()
    if cur.word() == "INTO":
        cur.next()
    table = cur.next()
    if table is None or table.kind not in NAME_KINDS or (table.kind is TokenKind.WORD and table.text.upper() in _NOT_TABLE_NAMES):
        return "expected a table name"
    if cur.punct("."):
        cur.next()
        table = cur.next()
        if table is None or table.kind not in NAME_KINDS:
            return "expected a table name after '.'"
    if cur.word() == "PARTITION":
        cur.next()
        if not cur.punct("(") or not cur.skip_parens():
            return "malformed PARTITION list"
    if cur.punct("(") and not cur.skip_parens():
        return "unbalanced column list"
    word = cur.word()
    if word in ("SELECT", "WITH", "TABLE") or cur.punct("("):
        return f"{verb} ... SELECT has no VALUES rows"
    if word == "SET":
        return f"{verb} ... SET has no VALUES rows"
    if word not in ("VALUES", "VALUE"):
        return "expected VALUES"
    cur.next()
    if cur.word() == "ROW":
        return "VALUES ROW(...) is not supported"
    first = cur.peek()
    if first is None or not cur.punct("("):
        return "expected '(' after VALUES"
    if cur.in_exec_comment:
        return "the VALUES rows start inside an executable comment"
    return InsertHead(verb, frozenset(modifiers), first.start)


def parse_insert_head(sql: str, *, dialect: Dialect = UNKNOWN, no_backslash_escapes: bool = False) -> InsertHead | None:
    """Head of ``INSERT|REPLACE ... VALUES (...)``, or None for any other statement shape
    (INSERT ... SELECT / SET, VALUES ROW(...), ...). Raises SqlLexError on unterminated text
    before the rows."""
    head = insert_head(sql, no_backslash_escapes, dialect)
    return head if isinstance(head, InsertHead) else None


def insert_target(sql: str, head: InsertHead, dialect: Dialect, nbe: bool) -> tuple[tuple[str | None, str] | None, list[str] | None]:
    """(table, listed columns or None) of an INSERT/REPLACE head; table is (database or None,
    name) as written, the columns lower-cased; None when the head cannot be read."""
    tokens = tk.statement_tokens(sql[: head.rows_start], nbe, dialect)
    i = 1
    while tk.word(tokens, i) in ("LOW_PRIORITY", "DELAYED", "HIGH_PRIORITY", "INTO"):
        i += 1
    end = table_ref_end(tokens, i)
    if end < 0:
        return None, None
    table = table_name(tokens[i:end], nbe)
    if tk.word(tokens, end) == "PARTITION":
        end = tk.closing_paren(tokens, end + 1) + 1
    if not tk.is_punct(tokens, end, "("):
        return table, None
    close = tk.closing_paren(tokens, end)
    return table, [tk.name(t, nbe).lower() for t in tokens[end + 1 : close] if t.kind in NAME_KINDS]


def insert_rows(sql: str, start: int, end: int, dialect: Dialect, nbe: bool) -> list[list[list[Token]]]:
    """The values of each row of ``(v, ...), (v, ...)`` starting at ``start`` (up to ``end``):
    a list of rows, each a list of value token lists. Stops after the last row."""
    rows: list[list[list[Token]]] = []
    depth = 0
    for tok in tk.statement_tokens(sql[:end], nbe, dialect, start):
        punct = tok.text if tok.kind is TokenKind.PUNCT else None
        if depth == 0:
            if punct == "(":
                depth = 1
                rows.append([[]])
            elif punct != ",":
                break  # ON DUPLICATE KEY UPDATE, AS alias, ...
            continue
        if punct == "(":
            depth += 1
        elif punct == ")":
            depth -= 1
            if depth == 0:
                continue
        elif punct == "," and depth == 1:
            rows[-1].append([])
            continue
        rows[-1][-1].append(tok)
    return rows


def table_ref_end(tokens: list[Token], i: int) -> int:
    """Index after a single ``t`` / ``db.t`` table reference at i, or -1."""
    if i >= len(tokens) or tokens[i].kind not in NAME_KINDS:
        return -1
    if tk.is_punct(tokens, i + 1, "."):
        return i + 3 if i + 2 < len(tokens) and tokens[i + 2].kind in NAME_KINDS else -1
    return i + 1


def table_name(ref: list[Token], nbe: bool) -> tuple[str | None, str]:
    """(database or None, table) as written: with lower_case_table_names = 0 (MariaDB on
    Linux) `t` and `T` are two tables, so the case is kept."""
    if len(ref) == 3:
        return tk.name(ref[0], nbe), tk.name(ref[2], nbe)
    return None, tk.name(ref[0], nbe)
