"""MySQL/MariaDB/TiDB statement text as the server lexes it (sql/sql_lex.cc).

- ``-- `` starts a comment only when the second dash is followed by a space or control character
  (or the end; on TiDB a space only, as Go's unicode.IsSpace has it); ``1--1`` is ``1 - -1``. ``#`` comments run to the end of the line.
- Executable comments (``/*!``, ``/*!50001``, ``/*M!100100``) run or not as the connected
  server decides (``Dialect.runs``): content that runs is lexed as code, a comment that does
  not run is a comment; TiDB's ``/*T![feature] ... */`` runs on TiDB when it knows every feature
  named. Where the proxy cannot tell (an unknown server), and
  for a ``;`` inside an executable comment (the server splits statements there), lexing raises
  ``SqlUnknown``: such text is never judged.
- ``'...'`` and ``"..."`` are strings with backslash escapes (unless NO_BACKSLASH_ESCAPES) and
  doubled quotes; ANSI_QUOTES (``"`` quoting identifiers) is not supported.
- Unterminated strings, identifiers and comments raise ``SqlLexError``.

Text decoded as latin-1 lexes exactly like the raw bytes (only ASCII bytes matter to the
lexer), which is how binary-unsafe payloads (``_binary'...'``) are handled.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator
from typing import NamedTuple

from proxy.sqltext.dialect import UNKNOWN, Dialect

__all__ = [
    "SqlParseError", "SqlLexError", "SqlUnknown", "TokenKind", "Token", "TRIVIA", "NAME_KINDS",
    "iter_tokens", "tokenize", "split_statements", "quoted_string",
    "WS", "DASH_COMMENT", "HASH_COMMENT", "BLOCK_COMMENT", "EXEC_COMMENT_OPEN", "BACKTICK_IDENT",
    "IDC",
]  # fmt: skip


class SqlParseError(ValueError):
    """Statement text this package cannot make sense of."""

    def __init__(self, message: str, offset: int | None = None) -> None:
        super().__init__(message if offset is None else f"{message} at offset {offset}")
        self.reason = message
        self.offset = offset


class SqlLexError(SqlParseError):
    """Unterminated string, quoted identifier or comment (or a nested executable comment)."""


class SqlUnknown(SqlParseError):
    """Text whose meaning depends on what the proxy cannot know (whether an executable
    comment runs on this server, where the server splits statements)."""


# --- Pattern fragments (ASCII only, so split.py can compile them as bytes patterns too) -------

WS = r"[ \t\n\r\f\v]"
# "--" needs a space or control character after it (sql_lex.cc: my_isspace || my_iscntrl).
DASH_COMMENT = r"--(?=[\x00-\x20\x7f]|\Z)[^\n]*+"
# TiDB (pkg/parser/lexer.go startWithDash): a byte that unicode.IsSpace calls space, or the end.
# Bytes 0x85 and 0xA0 alone are invalid UTF-8: text decoded with surrogateescape holds them as
# U+DC85 / U+DCA0 (in valid UTF-8 the byte after "--" is never a continuation byte).
_TIDB_DASH_COMMENT = r"--(?=[ \t\n\x0b\x0c\r\udc85\udca0]|\Z)[^\n]*+"
HASH_COMMENT = r"\#[^\n]*+"
# A plain /* */ comment (optimizer hints /*+ */ included), not an executable one.
BLOCK_COMMENT = r"/\*(?!!|M!)[^*]*+\*++(?:[^/*][^*]*+\*++)*+/"
# The rest of a comment after its opener, up to and including the first "*/".
_COMMENT_REST = re.compile(r"[^*]*+\*++(?:[^/*][^*]*+\*++)*+/")
EXEC_COMMENT_OPEN = r"/\*M?!(?:[0-9]{6}|[0-9]{5})?"
BACKTICK_IDENT = r"`[^`]*+(?:``[^`]*+)*+`"


def quoted_string(quote: str, backslash_escapes: bool = True) -> str:
    """Pattern for a quote-delimited string: doubled quotes, and backslash escapes if enabled."""
    q = re.escape(quote)
    if backslash_escapes:
        return rf"{q}[^{q}\\]*+(?:(?:\\[\s\S]|{q}{q})[^{q}\\]*+)*+{q}"
    return rf"{q}[^{q}]*+(?:{q}{q}[^{q}]*+)*+{q}"


def _ascii_plus_non_ascii(ascii_chars: str) -> str:
    """Character class: the given ASCII characters and every non-ASCII character. Written as a
    negated ASCII class, because a range up to U+10FFFF takes sre_compile ~10 ms per use."""
    return "[^" + "".join(f"\\x{c:02x}" for c in range(128) if chr(c) not in ascii_chars) + "]"


_ASCII_IDENT = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_$"
# Identifier characters (str patterns only): ASCII letters, digits, _ and $, and anything
# non-ASCII (the server treats every multi-byte character as part of an identifier).
IDC = _ascii_plus_non_ascii(_ASCII_IDENT)
_IDENT_START = _ascii_plus_non_ascii(_ASCII_IDENT[10:])  # not a digit
_BEFORE_DOT = _ascii_plus_non_ascii(_ASCII_IDENT + "`")  # an identifier ends here
_USER_VAR_CHAR = _ascii_plus_non_ascii(_ASCII_IDENT + ".")
# --- Lexer ------------------------------------------------------------------------------------


class TokenKind(enum.Enum):
    __hash__ = object.__hash__  # C-level hash: kinds are looked up in sets on every token

    WHITESPACE = "whitespace"
    COMMENT = "comment"
    EXEC_OPEN = "exec_open"  # "/*!50001" / "/*M!": what follows up to EXEC_CLOSE is code
    EXEC_CLOSE = "exec_close"
    WORD = "word"  # keyword or unquoted identifier
    QUOTED_IDENT = "quoted_ident"  # `...`
    STRING = "string"  # '...', "...", N'...'
    NUMBER = "number"
    HEX = "hex"  # X'..', 0x..
    BIT = "bit"  # b'..', 0b..
    USER_VAR = "user_var"  # @x, @'x', @`x`
    SYS_VAR = "sys_var"  # @@x, @@session.x
    PLACEHOLDER = "placeholder"  # ?
    PUNCT = "punct"


TRIVIA = frozenset({TokenKind.WHITESPACE, TokenKind.COMMENT, TokenKind.EXEC_OPEN, TokenKind.EXEC_CLOSE})


class Token(NamedTuple):
    kind: TokenKind
    text: str
    start: int

    @property
    def end(self) -> int:
        return self.start + len(self.text)


def _lexer_regex(backslash_escapes: bool, dash_comment: str = DASH_COMMENT) -> re.Pattern[str]:
    sq = quoted_string("'", backslash_escapes)
    dq = quoted_string('"', backslash_escapes)
    var_part = rf"(?:{IDC}+|{BACKTICK_IDENT})"
    # Alternatives are tried in order: comments before punctuation, hex/bit/exponent numbers
    # before words (``0x1f``, ``1e5``), words before plain numbers (``1abc`` is an identifier).
    return re.compile(
        "|".join(
            [
                rf"(?P<ws>{WS}+)",
                # After "ident." the server reads an identifier even if it starts with digits.
                rf"(?<={_BEFORE_DOT})(?P<dot>\.(?P<after_dot>{IDC}+)?)",
                r"(?P<tidb>/\*T!)",
                rf"(?P<comment>{HASH_COMMENT}|{dash_comment}|{BLOCK_COMMENT})",
                rf"(?P<exec_open>{EXEC_COMMENT_OPEN})",
                r"(?P<exec_close>\*/)",
                rf"(?P<string>[Nn]?{sq}|{dq})",
                rf"(?P<hex>[Xx]'[^']*'|0x[0-9A-Fa-f]+(?!{IDC}))",
                rf"(?P<bit>[Bb]'[^']*'|0b[01]+(?!{IDC}))",
                rf"(?P<number_exp>(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+(?!{IDC}))",
                rf"(?P<word>[0-9]*{_IDENT_START}{IDC}*)",
                r"(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)",
                rf"(?P<qident>{BACKTICK_IDENT})",
                rf"(?P<sys_var>@@{var_part}(?:\.{var_part})?)",
                rf"(?P<user_var>@(?:{_USER_VAR_CHAR}+|{sq}|{dq}|{BACKTICK_IDENT}))",
                r"(?P<placeholder>\?)",
                r"(?P<unterminated>['\"`]|/\*)",
                r"(?P<punct><=>|->>|:=|<=|>=|<>|!=|<<|>>|&&|\|\||->|[\s\S])",
            ]
        )
    )


# Keyed by (no_backslash_escapes, TiDB's dash comments).
_LEXERS = {(nbe, tidb): _lexer_regex(not nbe, _TIDB_DASH_COMMENT if tidb else DASH_COMMENT)
           for nbe in (False, True) for tidb in (False, True)}  # fmt: skip
# TiDB's /*T![feature, ...] ... */: the list as TiDB scans it (scanFeatureIDs).
_TIDB_FEATURES = re.compile(r"\[([0-9A-Za-z_$\x80-\U0010ffff]+(?:,[0-9A-Za-z_$\x80-\U0010ffff]+)*)\]")
_GROUP_KIND = {
    "ws": TokenKind.WHITESPACE,
    "comment": TokenKind.COMMENT,
    "string": TokenKind.STRING,
    "hex": TokenKind.HEX,
    "bit": TokenKind.BIT,
    "number_exp": TokenKind.NUMBER,
    "number": TokenKind.NUMBER,
    "word": TokenKind.WORD,
    "qident": TokenKind.QUOTED_IDENT,
    "sys_var": TokenKind.SYS_VAR,
    "user_var": TokenKind.USER_VAR,
    "placeholder": TokenKind.PLACEHOLDER,
    "punct": TokenKind.PUNCT,
    "dot": TokenKind.PUNCT,
}
_UNTERMINATED_WHAT = {"'": "string", '"': "string", "`": "quoted identifier", "/*": "comment"}


def iter_tokens(
    sql: str, *, dialect: Dialect = UNKNOWN, no_backslash_escapes: bool = False, trivia: bool = False, start: int = 0
) -> Iterator[Token]:
    """Tokens of ``sql`` from offset ``start``, lazily (stop reading early on huge statements).

    Whitespace, comments and executable-comment markers are yielded only with ``trivia=True``;
    the content of an executable comment that runs on ``dialect`` is yielded as ordinary tokens,
    one that does not run is a comment. With trivia the token texts concatenate back to
    ``sql[start:]``. Raises SqlLexError (unterminated text) and SqlUnknown (see the module).
    """
    finditer = _LEXERS[no_backslash_escapes, dialect.flavor == "tidb"].finditer
    group_kind = _GROUP_KIND
    new = tuple.__new__  # Token(...) without NamedTuple's Python-level __new__
    exec_open_at = -1  # offset of the enclosing "/*!" while inside an executable comment
    pos, n = start, len(sql)
    while pos < n:
        # Every offset matches some alternative, so the matches are contiguous; the loop
        # restarts after a comment that does not run and after a stray "*/" (re-lexed as "*"
        # then whatever follows).
        for m in finditer(sql, pos):
            group = m.lastgroup
            if group == "ws" or group == "comment":
                if trivia:
                    yield new(Token, (group_kind[group], m.group(), m.start()))
                continue
            kind = group_kind.get(group)  # type: ignore[arg-type]
            if kind is not None:
                if group == "dot":
                    yield new(Token, (TokenKind.PUNCT, ".", m.start()))
                    if m.group("after_dot"):
                        yield new(Token, (TokenKind.WORD, m.group("after_dot"), m.start() + 1))
                    continue
                if exec_open_at >= 0 and group == "punct" and m.group() == ";":
                    raise SqlUnknown("';' inside an executable comment", m.start())
                yield new(Token, (kind, m.group(), m.start()))
            elif group == "exec_open" or group == "tidb":
                if exec_open_at >= 0:
                    raise SqlLexError("nested executable comment", m.start())
                opener, content_at = m.group(), m.end()
                if group == "tidb":
                    features = _TIDB_FEATURES.match(sql, content_at)
                    if features is not None:
                        content_at = features.end()
                    runs = dialect.runs_tidb_comment(None if features is None else features.group(1).split(","))
                else:
                    opener = dialect.comment_opener(opener)
                    content_at = m.start() + len(opener)
                    runs = dialect.runs(opener)
                if runs is None:
                    raise SqlUnknown(
                        f"cannot tell whether the executable comment {m.group()} runs on this {dialect.flavor} server", m.start()
                    )
                if runs:
                    exec_open_at = m.start()
                    if trivia:
                        yield new(Token, (TokenKind.EXEC_OPEN, sql[m.start() : content_at], m.start()))
                    if content_at == m.end():
                        continue
                    pos = content_at  # TiDB reads 5 version digits, and a feature list
                    break
                pos = _comment_end(sql, m.end(), m.start())
                if trivia:
                    yield new(Token, (TokenKind.COMMENT, sql[m.start() : pos], m.start()))
                break
            elif group == "exec_close" and exec_open_at >= 0:
                exec_open_at = -1
                if trivia:
                    yield new(Token, (TokenKind.EXEC_CLOSE, "*/", m.start()))
            elif group == "exec_close":  # a stray "*/" is "*", then lexing resumes at "/"
                yield new(Token, (TokenKind.PUNCT, "*", m.start()))
                pos = m.start() + 1
                break
            else:
                raise SqlLexError(f"unterminated {_UNTERMINATED_WHAT[m.group()]}", m.start())
        else:
            break
    if exec_open_at >= 0:
        raise SqlLexError("unterminated executable comment", exec_open_at)


def _comment_end(sql: str, pos: int, opened_at: int) -> int:
    """Offset after the "*/" that closes the comment whose opener ends at ``pos``."""
    m = _COMMENT_REST.match(sql, pos)
    if m is None:
        raise SqlLexError("unterminated comment", opened_at)
    return m.end()


NAME_KINDS = frozenset({TokenKind.WORD, TokenKind.QUOTED_IDENT})


def split_statements(sql: str, *, dialect: Dialect = UNKNOWN, no_backslash_escapes: bool = False) -> list[tuple[int, int]]:
    """(start, end) offsets of the statements of a multi-statement text, split at top-level
    semicolons as the server splits them. Only whitespace after the last ';' is nothing. On
    MariaDB and MySQL a piece with only comments is a statement of its own (the server answers
    it with an OK), and an empty statement before another one makes the server refuse the text
    (SqlUnknown); TiDB skips empty and comment-only pieces alike (measured on v8.5.3). Raises
    SqlParseError (unterminated text, unknown comments)."""
    tidb = dialect.flavor == "tidb"
    spans: list[tuple[int, int]] = []
    start, content, empty_before = 0, False, False
    for token in iter_tokens(sql, dialect=dialect, no_backslash_escapes=no_backslash_escapes, trivia=True):
        if token.kind is TokenKind.PUNCT and token.text == ";":
            if content:
                spans.append((start, token.start))
            elif spans or start == 0:
                empty_before = True
            start, content = token.end, False
        elif token.kind is not TokenKind.WHITESPACE and not (tidb and token.kind in TRIVIA):
            if empty_before and token.kind is not TokenKind.COMMENT and not tidb:
                raise SqlUnknown("an empty statement before another one", token.start)
            content = True
    if content:
        spans.append((start, len(sql)))
    return spans


def tokenize(sql: str, *, dialect: Dialect = UNKNOWN, no_backslash_escapes: bool = False, trivia: bool = False) -> list[Token]:
    """All tokens of ``sql`` (see ``iter_tokens``)."""
    return list(iter_tokens(sql, dialect=dialect, no_backslash_escapes=no_backslash_escapes, trivia=trivia))
