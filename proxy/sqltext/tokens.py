"""Token-level helpers shared by the statement parsers: leading keywords, splitting token
lists, names and literals, constant expressions."""

from __future__ import annotations

import re

import attrs

from proxy.sqltext.dialect import UNKNOWN, Dialect
from proxy.sqltext.lexer import (
    SqlParseError,
    Token,
    TokenKind,
    iter_tokens,
)

# --- Leading keywords ---------------------------------------------------------------------------


def leading_keywords(sql: str, n: int = 2, *, dialect: Dialect = UNKNOWN, nbe: bool = False) -> tuple[str, ...]:
    """The first ``n`` bare words of ``sql``, upper-cased, skipping whitespace and comments
    (reading inside executable comments that run on ``dialect``). Stops at the first token
    that is not a bare word. Raises SqlParseError where the lexer does."""
    words: list[str] = []
    for tok in iter_tokens(sql, dialect=dialect, no_backslash_escapes=nbe):
        if tok.kind is not TokenKind.WORD or len(words) == n:
            break
        words.append(tok.text.upper())
    return tuple(words)


def after_keywords(sql: str, n: int, *, dialect: Dialect = UNKNOWN, nbe: bool = False) -> int:
    """Offset just after the ``n``-th leading keyword (which must exist)."""
    for i, tok in enumerate(iter_tokens(sql, dialect=dialect, no_backslash_escapes=nbe)):
        if i == n - 1:
            assert tok.kind is TokenKind.WORD
            return tok.end
    raise AssertionError("fewer keywords than asked")


# --- Small token helpers ----------------------------------------------------------------------


def word(tokens: list[Token], i: int) -> str | None:
    """Upper-cased text of tokens[i] if it is a bare word."""
    if i < len(tokens) and tokens[i].kind is TokenKind.WORD:
        return tokens[i].text.upper()
    return None


def is_punct(tokens: list[Token], i: int, text: str) -> bool:
    return i < len(tokens) and tokens[i].kind is TokenKind.PUNCT and tokens[i].text == text


def statement_tokens(sql: str, nbe: bool, dialect: Dialect = UNKNOWN, start: int = 0) -> list[Token]:
    """Significant tokens of one statement, without a trailing ';'. Raises SqlParseError when
    another statement follows the ';'."""
    tokens = list(iter_tokens(sql, dialect=dialect, no_backslash_escapes=nbe, start=start))
    for i, tok in enumerate(tokens):
        if tok.kind is TokenKind.PUNCT and tok.text == ";":
            if i != len(tokens) - 1:
                raise SqlParseError("more than one statement", tok.start)
            return tokens[:i]
    return tokens


def split_at(tokens: list[Token], kind: TokenKind, text: str) -> list[list[Token]]:
    """Split at the tokens of ``kind`` spelled ``text`` (any case) outside parentheses; the
    separators are dropped."""
    parts: list[list[Token]] = [[]]
    depth = 0
    for tok in tokens:
        if tok.kind is TokenKind.PUNCT and (tok.text == "(" or tok.text == ")"):
            depth += 1 if tok.text == "(" else -1
        elif depth == 0 and tok.kind is kind and tok.text.upper() == text:
            parts.append([])
            continue
        parts[-1].append(tok)
    return parts


def split_top_level(tokens: list[Token]) -> list[list[Token]]:
    """Split at commas outside parentheses."""
    return split_at(tokens, TokenKind.PUNCT, ",")


def split_words(tokens: list[Token], word: str) -> list[list[Token]]:
    """Split at the bare word ``word`` (e.g. AND) outside parentheses."""
    return split_at(tokens, TokenKind.WORD, word)


def matching_parens(tokens: list[Token]) -> dict[int, int]:
    """Index of every '(' -> index of its ')', in one pass (unclosed ones are left out)."""
    found: dict[int, int] = {}
    opened: list[int] = []
    for j, tok in enumerate(tokens):
        if tok.kind is TokenKind.PUNCT:
            if tok.text == "(":
                opened.append(j)
            elif tok.text == ")" and opened:
                found[opened.pop()] = j
    return found


def closing_paren(tokens: list[Token], i: int) -> int:
    """Index of the ')' matching the '(' at tokens[i], or -1."""
    depth = 0
    for j in range(i, len(tokens)):
        tok = tokens[j]
        if tok.kind is TokenKind.PUNCT:
            if tok.text == "(":
                depth += 1
            elif tok.text == ")":
                depth -= 1
                if depth == 0:
                    return j
    return -1


_ESCAPES = {"0": "\0", "b": "\b", "n": "\n", "r": "\r", "t": "\t", "Z": "\x1a", "%": "\\%", "_": "\\_"}


def unquote(text: str, nbe: bool = False) -> str:
    """Value of a quoted string or identifier token (introducers are not handled)."""
    if text[:1] in "Nn" and text[1:2] == "'":
        text = text[1:]
    quote = text[0]
    body = text[1:-1]
    if quote != "`" and not nbe and "\\" in body:
        # Escapes and doubled quotes must be undone in one left-to-right pass.
        out, i = [], 0
        while i < len(body):
            c = body[i]
            if c == "\\" and i + 1 < len(body):
                out.append(_ESCAPES.get(body[i + 1], body[i + 1]))
                i += 2
            elif c == quote:
                out.append(quote)
                i += 2
            else:
                out.append(c)
                i += 1
        return "".join(out)
    return body.replace(quote + quote, quote)


def name(tok: Token, nbe: bool = False) -> str:
    """Identifier text of a WORD/QUOTED_IDENT/STRING token, unquoted."""
    if tok.kind is TokenKind.WORD:
        return tok.text
    return unquote(tok.text, nbe)


def quote_ident(name: str) -> str:
    """``name`` as an identifier: bare when plain, else in backticks."""
    return name if _PLAIN_IDENT.fullmatch(name) else "`" + name.replace("`", "``") + "`"


_PLAIN_IDENT = re.compile(r"[A-Za-z0-9_$]+")


def quote_string(value: str, *, no_backslash_escapes: bool = False) -> str:
    """A single-quoted SQL string literal for ``value``."""
    if not no_backslash_escapes:
        value = value.replace("\\", "\\\\")
    return "'" + value.replace("'", "''") + "'"


# --- Constant expressions ---------------------------------------------------------------------

# Words that read the clock or the session without parentheses: not constants.
_NILADIC_FUNCTIONS = frozenset(
    {
        "CURRENT_DATE", "CURRENT_TIME", "CURRENT_TIMESTAMP", "CURRENT_USER", "CURRENT_ROLE",
        "LOCALTIME", "LOCALTIMESTAMP", "UTC_DATE", "UTC_TIME", "UTC_TIMESTAMP",
    }
)  # fmt: skip
_LITERAL_WORDS = frozenset({"NULL", "TRUE", "FALSE"})
_LITERAL_KINDS = frozenset({TokenKind.STRING, TokenKind.NUMBER, TokenKind.HEX, TokenKind.BIT})
_TYPED_LITERAL_WORDS = frozenset({"DATE", "TIME", "TIMESTAMP"})


def is_constant(tokens: list[Token], *, bare_words: bool, placeholders: bool = False) -> bool:
    """Is this expression a literal whose value does not depend on the server or the data?

    Literals, ``-5``, ``_utf8mb4'x' [COLLATE c]``, ``DATE '2020-01-01'``, NULL/TRUE/FALSE.
    ``bare_words``: a lone word is a value (SET x = ON/OFF/DEFAULT/ANSI...), not a column.
    ``placeholders``: ``?`` stands for a literal (prepared statements).
    """
    n = len(tokens)
    if n == 0:
        return False
    first = tokens[0]
    if n == 1:
        if first.kind in _LITERAL_KINDS:
            return True
        if first.kind is TokenKind.PLACEHOLDER:
            return placeholders
        if first.kind is TokenKind.WORD:
            text = first.text.upper()
            return text in _LITERAL_WORDS or (bare_words and text not in _NILADIC_FUNCTIONS)
        return False
    # Unary signs before a number.
    i = 0
    while i < n and tokens[i].kind is TokenKind.PUNCT and tokens[i].text in ("-", "+"):
        i += 1
    if i:
        return i == n - 1 and (tokens[i].kind is TokenKind.NUMBER or (placeholders and tokens[i].kind is TokenKind.PLACEHOLDER))
    # Charset introducer or typed literal in front of a string.
    if first.kind is TokenKind.WORD:
        head = first.text.upper()
        second = tokens[1].kind
        if head.startswith("_") and second in (TokenKind.STRING, TokenKind.HEX, TokenKind.BIT):
            i = 1
        elif head in _TYPED_LITERAL_WORDS and second is TokenKind.STRING:
            i = 1
        else:
            return False
    if tokens[i].kind not in (TokenKind.STRING, TokenKind.HEX, TokenKind.BIT):
        return False
    i += 1
    while i < n and tokens[i].kind is TokenKind.STRING:  # 'a' 'b' is one string
        i += 1
    if i < n and word(tokens, i) == "COLLATE":
        return i + 2 == n and tokens[i + 1].kind in (TokenKind.WORD, TokenKind.STRING, TokenKind.QUOTED_IDENT)
    return i == n


@attrs.frozen
class Reading:
    """How a statement is lexed (NO_BACKSLASH_ESCAPES, the server's dialect), for the
    classifier's handlers."""

    nbe: bool
    dialect: Dialect

    def tokens(self, sql: str, start: int = 0) -> list[Token]:
        return statement_tokens(sql, self.nbe, self.dialect, start)

    def keywords(self, sql: str, n: int) -> tuple[str, ...]:
        return leading_keywords(sql, n, dialect=self.dialect, nbe=self.nbe)

    def after_keywords(self, sql: str, n: int) -> int:
        return after_keywords(sql, n, dialect=self.dialect, nbe=self.nbe)
