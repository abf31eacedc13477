"""MySQL/MariaDB statement text: lexing, classification, SET parsing, idempotency.

Sans-IO and dependency-light: the proxy calls ``leading_keywords``/``classify`` for every
COM_QUERY, so the common statements are judged from a regex over the first keywords; the full
lexer runs only when a statement needs a closer look (SET, SELECT, transaction control...).

Lexing follows the server's lexer (sql/sql_lex.cc) for what matters to statement shape:

- ``-- `` starts a comment only when the second dash is followed by a space or control character
  (or the end); ``1--1`` is ``1 - -1``. ``#`` comments run to the end of the line.
- ``/*! ... */``, ``/*!50001 ... */`` and ``/*M! ... */`` are executable comments: their content
  is code and is lexed as tokens (version numbers are not compared: content counts as code).
- ``'...'`` and ``"..."`` are strings with backslash escapes (unless NO_BACKSLASH_ESCAPES) and
  doubled quotes; ANSI_QUOTES (``"`` quoting identifiers) is not supported.
- Unterminated strings, identifiers and comments raise ``SqlLexError``.

Text decoded as latin-1 lexes exactly like the raw bytes (only ASCII bytes matter to the
lexer), which is how binary-unsafe payloads (``_binary'...'``) are handled.
"""

from __future__ import annotations

import enum
import functools
import re
from typing import Iterator, NamedTuple

import attrs

__all__ = [
    "InsertHead",
    "Kind",
    "SetAssignment",
    "SetScope",
    "SqlLexError",
    "SqlParseError",
    "Statement",
    "Token",
    "TokenKind",
    "classify",
    "is_idempotent",
    "iter_tokens",
    "leading_keywords",
    "parse_insert_head",
    "parse_set",
    "quote_string",
    "render_set",
    "split_statements",
    "tokenize",
]


class SqlParseError(ValueError):
    """Statement text this module cannot make sense of."""

    def __init__(self, message: str, offset: int | None = None) -> None:
        super().__init__(message if offset is None else f"{message} at offset {offset}")
        self.reason = message
        self.offset = offset


class SqlLexError(SqlParseError):
    """Unterminated string, quoted identifier or comment (or a nested executable comment)."""


# --- Pattern fragments (ASCII only, so split.py can compile them as bytes patterns too) -------

WS = r"[ \t\n\r\f\v]"
# "--" needs a space or control character after it (sql_lex.cc: my_isspace || my_iscntrl).
DASH_COMMENT = r"--(?=[\x00-\x20\x7f]|\Z)[^\n]*+"
HASH_COMMENT = r"\#[^\n]*+"
# A plain /* */ comment (optimizer hints /*+ */ included), not an executable one.
BLOCK_COMMENT = r"/\*(?!!|M!)[^*]*+\*++(?:[^/*][^*]*+\*++)*+/"
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
_IDC = _ascii_plus_non_ascii(_ASCII_IDENT)
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


def _lexer_regex(backslash_escapes: bool) -> re.Pattern[str]:
    sq = quoted_string("'", backslash_escapes)
    dq = quoted_string('"', backslash_escapes)
    var_part = rf"(?:{_IDC}+|{BACKTICK_IDENT})"
    # Alternatives are tried in order: comments before punctuation, hex/bit/exponent numbers
    # before words (``0x1f``, ``1e5``), words before plain numbers (``1abc`` is an identifier).
    return re.compile(
        "|".join(
            [
                rf"(?P<ws>{WS}+)",
                # After "ident." the server reads an identifier even if it starts with digits.
                rf"(?<={_BEFORE_DOT})(?P<dot>\.(?P<after_dot>{_IDC}+)?)",
                rf"(?P<comment>{HASH_COMMENT}|{DASH_COMMENT}|{BLOCK_COMMENT})",
                rf"(?P<exec_open>{EXEC_COMMENT_OPEN})",
                r"(?P<exec_close>\*/)",
                rf"(?P<string>[Nn]?{sq}|{dq})",
                rf"(?P<hex>[Xx]'[^']*'|0x[0-9A-Fa-f]+(?!{_IDC}))",
                rf"(?P<bit>[Bb]'[^']*'|0b[01]+(?!{_IDC}))",
                rf"(?P<number_exp>(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+(?!{_IDC}))",
                rf"(?P<word>[0-9]*{_IDENT_START}{_IDC}*)",
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


_LEXERS = {False: _lexer_regex(True), True: _lexer_regex(False)}  # keyed by no_backslash_escapes
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
    sql: str, *, no_backslash_escapes: bool = False, trivia: bool = False, start: int = 0
) -> Iterator[Token]:
    """Tokens of ``sql`` from offset ``start``, lazily (stop reading early on huge statements).

    Whitespace, comments and executable-comment markers are yielded only with ``trivia=True``;
    the content of executable comments is always yielded as ordinary tokens. With trivia the
    token texts concatenate back to ``sql[start:]``.
    """
    finditer = _LEXERS[no_backslash_escapes].finditer
    group_kind = _GROUP_KIND
    new = tuple.__new__  # Token(...) without NamedTuple's Python-level __new__
    exec_open_at = -1  # offset of the enclosing "/*!" while inside an executable comment
    pos, n = start, len(sql)
    while pos < n:
        # Every offset matches some alternative, so the matches are contiguous; the loop only
        # restarts after a stray "*/", which must be re-lexed as "*" then whatever follows.
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
                yield new(Token, (kind, m.group(), m.start()))
            elif group == "exec_open":
                if exec_open_at >= 0:
                    raise SqlLexError("nested executable comment", m.start())
                exec_open_at = m.start()
                if trivia:
                    yield new(Token, (TokenKind.EXEC_OPEN, m.group(), m.start()))
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


_NAME_KINDS = frozenset({TokenKind.WORD, TokenKind.QUOTED_IDENT})


def split_statements(sql: str, *, no_backslash_escapes: bool = False) -> list[str]:
    """The statements of a multi-statement text, split at top-level semicolons (the lexer
    skips those inside literals and comments); empty ones dropped. Raises SqlLexError."""
    pieces, start = [], 0
    for token in iter_tokens(sql, no_backslash_escapes=no_backslash_escapes):
        if token.kind is TokenKind.PUNCT and token.text == ";":
            pieces.append(sql[start : token.start])
            start = token.end
    pieces.append(sql[start:])
    return [p for p in pieces if p.strip()]


def tokenize(sql: str, *, no_backslash_escapes: bool = False, trivia: bool = False) -> list[Token]:
    """All tokens of ``sql`` (see ``iter_tokens``); raises ``SqlLexError`` on unterminated text."""
    return list(iter_tokens(sql, no_backslash_escapes=no_backslash_escapes, trivia=trivia))


# --- Leading keywords (hot path) --------------------------------------------------------------

# Whitespace, comments, and the "/*!NNNNN" / "*/" around executable comment content.
_SKIP = rf"(?:{WS}++|{HASH_COMMENT}|{DASH_COMMENT}|{EXEC_COMMENT_OPEN}|{BLOCK_COMMENT}|\*/)*+"
_KEYWORD = rf"([A-Za-z][0-9A-Za-z_]*+)(?!{_IDC})"
# Whitespace and plain comments only: fast paths that must not look inside /*! */.
_SKIP_PLAIN = rf"(?:{WS}++|{HASH_COMMENT}|{DASH_COMMENT}|{BLOCK_COMMENT})*+"


@functools.cache
def _leading_regex(n: int) -> re.Pattern[str]:
    pattern = _SKIP + _KEYWORD
    for _ in range(n - 1):
        pattern = f"{_SKIP}{_KEYWORD}(?:{pattern})?"
    return re.compile(pattern)


_LEADING = [_leading_regex(n) for n in range(9)[1:]]


def leading_keywords(sql: str, n: int = 2) -> tuple[str, ...]:
    """The first ``n`` bare words of ``sql``, upper-cased, skipping whitespace and comments and
    reading inside ``/*! */``. Stops early at the first token that is not a bare word."""
    m = (_LEADING[n - 1] if 0 < n <= len(_LEADING) else _leading_regex(n)).match(sql)
    if m is None:
        return ()
    if n == 2:  # the hot path: no generator, no filtering
        first, second = m.groups()
        return (first.upper(),) if second is None else (first.upper(), second.upper())
    return tuple([w.upper() for w in m.groups() if w is not None])


def _after_keywords(sql: str, n: int) -> int:
    """Offset just after the ``n``-th leading keyword (which must exist)."""
    m = _leading_regex(n).match(sql)
    assert m is not None and m.group(n) is not None
    return m.end(n)


# --- Small token helpers ----------------------------------------------------------------------


def _word(tokens: list[Token], i: int) -> str | None:
    """Upper-cased text of tokens[i] if it is a bare word."""
    if i < len(tokens) and tokens[i].kind is TokenKind.WORD:
        return tokens[i].text.upper()
    return None


def _is_punct(tokens: list[Token], i: int, text: str) -> bool:
    return i < len(tokens) and tokens[i].kind is TokenKind.PUNCT and tokens[i].text == text


def _statement_tokens(sql: str, nbe: bool, start: int = 0) -> list[Token]:
    """Significant tokens of one statement, without a trailing ';'. Raises SqlParseError when
    another statement follows the ';'."""
    tokens = list(iter_tokens(sql, no_backslash_escapes=nbe, start=start))
    for i, tok in enumerate(tokens):
        if tok.kind is TokenKind.PUNCT and tok.text == ";":
            if i != len(tokens) - 1:
                raise SqlParseError("more than one statement", tok.start)
            return tokens[:i]
    return tokens


def _split_at(tokens: list[Token], kind: TokenKind, text: str) -> list[list[Token]]:
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


def _split_top_level(tokens: list[Token]) -> list[list[Token]]:
    """Split at commas outside parentheses."""
    return _split_at(tokens, TokenKind.PUNCT, ",")


def _split_words(tokens: list[Token], word: str) -> list[list[Token]]:
    """Split at the bare word ``word`` (e.g. AND) outside parentheses."""
    return _split_at(tokens, TokenKind.WORD, word)


def _closing_paren(tokens: list[Token], i: int) -> int:
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


def _unquote(text: str, nbe: bool = False) -> str:
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


def _name(tok: Token, nbe: bool = False) -> str:
    """Identifier text of a WORD/QUOTED_IDENT/STRING token, unquoted."""
    if tok.kind is TokenKind.WORD:
        return tok.text
    return _unquote(tok.text, nbe)


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


def _is_constant(tokens: list[Token], *, bare_words: bool, placeholders: bool = False) -> bool:
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
            word = first.text.upper()
            return word in _LITERAL_WORDS or (bare_words and word not in _NILADIC_FUNCTIONS)
        return False
    # Unary signs before a number.
    i = 0
    while i < n and tokens[i].kind is TokenKind.PUNCT and tokens[i].text in ("-", "+"):
        i += 1
    if i:
        return i == n - 1 and (
            tokens[i].kind is TokenKind.NUMBER or (placeholders and tokens[i].kind is TokenKind.PLACEHOLDER)
        )
    # Charset introducer or typed literal in front of a string.
    if first.kind is TokenKind.WORD:
        word = first.text.upper()
        second = tokens[1].kind
        if word.startswith("_") and second in (TokenKind.STRING, TokenKind.HEX, TokenKind.BIT):
            i = 1
        elif word in _TYPED_LITERAL_WORDS and second is TokenKind.STRING:
            i = 1
        else:
            return False
    if tokens[i].kind not in (TokenKind.STRING, TokenKind.HEX, TokenKind.BIT):
        return False
    i += 1
    while i < n and tokens[i].kind is TokenKind.STRING:  # 'a' 'b' is one string
        i += 1
    if i < n and _word(tokens, i) == "COLLATE":
        return i + 2 == n and tokens[i + 1].kind in (TokenKind.WORD, TokenKind.STRING, TokenKind.QUOTED_IDENT)
    return i == n


# --- SET statements ---------------------------------------------------------------------------


class SetScope(enum.Enum):
    SESSION = "session"  # SET x / SESSION x / LOCAL x / @@x / @@session.x / @@local.x
    GLOBAL = "global"  # GLOBAL / PERSIST / PERSIST_ONLY: not session state
    USER = "user"  # @x
    NAMES = "names"  # SET NAMES cs [COLLATE c]
    CHARSET = "charset"  # SET CHARACTER SET cs / SET CHARSET cs
    TRANSACTION = "transaction"  # SET SESSION TRANSACTION ...: every later transaction
    NEXT_TRANSACTION = "next_transaction"  # SET TRANSACTION ...: the next transaction only


@attrs.frozen
class SetAssignment:
    """One assignment of a SET statement.

    ``name``: lower-cased variable name without ``@``/``@@``/scope; the charset for NAMES and
    CHARSET ("default" for DEFAULT); ``transaction_isolation`` or ``transaction_read_only``
    for transaction characteristics. ``value_sql``: the expression as written; for transaction
    characteristics the whole clause (``ISOLATION LEVEL READ COMMITTED``, ``READ ONLY``).
    """

    scope: SetScope
    name: str
    value_sql: str
    is_constant: bool
    collation: str | None = None


_SCOPE_WORDS = {
    "SESSION": SetScope.SESSION,
    "LOCAL": SetScope.SESSION,
    "GLOBAL": SetScope.GLOBAL,
    "PERSIST": SetScope.GLOBAL,
    "PERSIST_ONLY": SetScope.GLOBAL,
}
_SYSVAR_PREFIXES = {"session": SetScope.SESSION, "local": SetScope.SESSION, "global": SetScope.GLOBAL,
                    "persist": SetScope.GLOBAL, "persist_only": SetScope.GLOBAL}  # fmt: skip


def _is_set_not_assignment(kws: tuple[str, ...]) -> bool:
    """SET PASSWORD / ROLE / DEFAULT ROLE / RESOURCE GROUP: not variable assignments."""
    return kws[1:2] in (("PASSWORD",), ("ROLE",)) or kws[1:3] in (("DEFAULT", "ROLE"), ("RESOURCE", "GROUP"))
_ASSIGN = frozenset({"=", ":="})


def parse_set(sql: str, *, no_backslash_escapes: bool = False) -> list[SetAssignment] | None:
    """Assignments of a SET statement in order; None if ``sql`` is not a variable-setting SET
    (not SET at all, or SET PASSWORD / ROLE / DEFAULT ROLE / RESOURCE GROUP).

    ``SET STATEMENT ... FOR ...`` (MariaDB) changes nothing in the session: returns [].
    Raises SqlParseError for a SET it cannot understand.
    """
    kws = leading_keywords(sql, 3)
    if not kws or kws[0] != "SET":
        return None
    second = kws[1] if len(kws) > 1 else None
    if second == "STATEMENT":
        return []
    if _is_set_not_assignment(kws):
        return None
    tokens = _statement_tokens(sql, no_backslash_escapes)
    if _is_set_transaction(kws):
        return _parse_set_transaction(sql, tokens)
    result = []
    sticky = SetScope.SESSION  # a bare scope keyword applies to the following assignments too
    for item in _split_top_level(tokens[1:]):
        assignment, sticky = _parse_set_item(sql, item, sticky, no_backslash_escapes)
        result.append(assignment)
    return result


def _is_set_transaction(kws: tuple[str, ...]) -> bool:
    """SET [GLOBAL|SESSION|LOCAL] TRANSACTION ..., from the first three keywords."""
    return kws[1:2] == ("TRANSACTION",) or (len(kws) > 2 and kws[1] in _SCOPE_WORDS and kws[2] == "TRANSACTION")


def _parse_set_item(
    sql: str, item: list[Token], sticky: SetScope, nbe: bool
) -> tuple[SetAssignment, SetScope]:
    if not item:
        raise SqlParseError("empty assignment in SET")
    word = _word(item, 0)
    assigns_next = len(item) > 1 and item[1].text in _ASSIGN
    if word == "NAMES" and not assigns_next:
        return _parse_names(item, nbe), sticky
    if (word == "CHARSET" and not assigns_next) or (word == "CHARACTER" and _word(item, 1) == "SET"):
        rest = item[1:] if word == "CHARSET" else item[2:]
        if len(rest) != 1:
            raise SqlParseError("SET CHARACTER SET needs one charset name", item[0].start)
        return SetAssignment(SetScope.CHARSET, _name(rest[0], nbe).lower(), rest[0].text, True), sticky
    i = 0
    if word in _SCOPE_WORDS and len(item) > 1 and item[1].text not in _ASSIGN:
        sticky = _SCOPE_WORDS[word]
        i = 1
    tok = item[i] if i < len(item) else None
    if tok is None:
        raise SqlParseError("missing variable name in SET")
    if tok.kind is TokenKind.SYS_VAR:
        scope, name = _sysvar_scope_and_name(tok.text)
        i += 1
    elif tok.kind is TokenKind.USER_VAR:
        scope, name = SetScope.USER, _user_var_name(tok.text, nbe)
        i += 1
    elif tok.kind in _NAME_KINDS:
        scope, parts = sticky, [_name(tok)]
        i += 1
        while _is_punct(item, i, ".") and i + 1 < len(item) and item[i + 1].kind in _NAME_KINDS:
            parts.append(_name(item[i + 1]))  # structured variables: default.key_buffer_size
            i += 2
        name = ".".join(parts).lower()
    else:
        raise SqlParseError(f"unexpected {tok.text!r} in SET", tok.start)
    if i >= len(item) or item[i].text not in _ASSIGN or i + 1 >= len(item):
        raise SqlParseError(f"expected '=' and a value after {name!r} in SET", tok.start)
    value = item[i + 1 :]
    value_sql = sql[value[0].start : value[-1].end].strip()
    return SetAssignment(scope, name, value_sql, _is_constant(value, bare_words=True)), sticky


def _sysvar_scope_and_name(text: str) -> tuple[SetScope, str]:
    """"@@session.sql_mode" -> (SESSION, "sql_mode"); a bare @@x is the session value."""
    body = text[2:]
    parts = re.findall(rf"`[^`]*(?:``[^`]*)*`|{_IDC}+", body)
    names = [p[1:-1].replace("``", "`") if p.startswith("`") else p for p in parts]
    if len(names) == 2 and names[0].lower() in _SYSVAR_PREFIXES:
        return _SYSVAR_PREFIXES[names[0].lower()], names[1].lower()
    return SetScope.SESSION, ".".join(names).lower()


def _user_var_name(text: str, nbe: bool) -> str:
    body = text[1:]
    if body[:1] in ("'", '"', "`"):
        body = _unquote(body, nbe)
    return body.lower()  # user variable names are case-insensitive


def _parse_names(item: list[Token], nbe: bool) -> SetAssignment:
    """NAMES cs [COLLATE coll] / NAMES DEFAULT."""
    if len(item) not in (2, 4) or (len(item) == 4 and _word(item, 2) != "COLLATE"):
        raise SqlParseError("expected SET NAMES charset [COLLATE collation]", item[0].start)
    charset = item[1]
    collation = _name(item[3], nbe).lower() if len(item) == 4 else None
    return SetAssignment(SetScope.NAMES, _name(charset, nbe).lower(), charset.text, True, collation)


_ISOLATION_LEVELS = {
    ("READ", "UNCOMMITTED"), ("READ", "COMMITTED"), ("REPEATABLE", "READ"), ("SERIALIZABLE",),
}  # fmt: skip


def _parse_set_transaction(sql: str, tokens: list[Token]) -> list[SetAssignment]:
    """[GLOBAL|SESSION|LOCAL] TRANSACTION ISOLATION LEVEL x | READ WRITE | READ ONLY [, ...]"""
    scope_word = _word(tokens, 1)
    if scope_word == "TRANSACTION":
        scope, i = SetScope.NEXT_TRANSACTION, 2
    else:
        scope = SetScope.GLOBAL if _SCOPE_WORDS[scope_word] is SetScope.GLOBAL else SetScope.TRANSACTION
        i = 3
    result = []
    for item in _split_top_level(tokens[i:]):
        words = tuple(_word(item, j) for j in range(len(item)))
        if words[:2] == ("ISOLATION", "LEVEL") and words[2:] in _ISOLATION_LEVELS:
            name = "transaction_isolation"
        elif words in (("READ", "ONLY"), ("READ", "WRITE")):
            name = "transaction_read_only"
        else:
            raise SqlParseError("unknown transaction characteristic in SET TRANSACTION", tokens[0].start)
        result.append(SetAssignment(scope, name, sql[item[0].start : item[-1].end], True))
    return result


_PLAIN_NAME = re.compile(r"[0-9a-z_$]+")
_PLAIN_USER_VAR = re.compile(r"[0-9a-z_$.]+")


def _quote_ident(name: str, plain: re.Pattern[str] = _PLAIN_NAME) -> str:
    return name if plain.fullmatch(name) else "`" + name.replace("`", "``") + "`"


def render_set(assignments: list[SetAssignment]) -> str:
    """One SET statement that re-applies ``assignments`` (in order) on a new connection.

    Session variables, user variables, NAMES and CHARACTER SET can be mixed;
    TRANSACTION (or NEXT_TRANSACTION) characteristics need a SET of their own.
    GLOBAL assignments are not session state and are refused.
    """
    if not assignments:
        raise ValueError("render_set needs at least one assignment")
    scopes = {a.scope for a in assignments}
    if SetScope.GLOBAL in scopes:
        raise ValueError("GLOBAL assignments are not session state")
    for tx_scope, prefix in ((SetScope.TRANSACTION, "SET SESSION TRANSACTION "), (SetScope.NEXT_TRANSACTION, "SET TRANSACTION ")):
        if tx_scope in scopes:
            if scopes != {tx_scope}:
                raise ValueError("transaction characteristics need a SET statement of their own")
            return prefix + ", ".join(a.value_sql for a in assignments)
    parts = []
    for a in assignments:
        if a.scope is SetScope.NAMES:
            collate = ""
            if a.collation is not None:
                collate = " COLLATE " + ("DEFAULT" if a.collation == "default" else _quote_ident(a.collation))
            parts.append(f"NAMES {a.value_sql}{collate}")
        elif a.scope is SetScope.CHARSET:
            parts.append(f"CHARACTER SET {a.value_sql}")
        elif a.scope is SetScope.USER:
            parts.append(f"@{_quote_ident(a.name, _PLAIN_USER_VAR)} = {a.value_sql}")
        else:
            name = ".".join(_quote_ident(p) for p in a.name.split("."))
            parts.append(f"@@SESSION.{name} = {a.value_sql}")
    return "SET " + ", ".join(parts)


# --- INSERT/REPLACE ... VALUES heads ----------------------------------------------------------


@attrs.frozen
class InsertHead:
    """The part of ``INSERT|REPLACE [modifiers] [INTO] t [PARTITION (..)] [(cols)] VALUES``."""

    verb: str  # "INSERT" or "REPLACE"
    modifiers: frozenset[str]  # LOW_PRIORITY, DELAYED, HIGH_PRIORITY, IGNORE
    rows_start: int  # offset of the first row's "("


class _Cursor:
    """Significant tokens read one at a time, so a 60 MB INSERT is never fully tokenized.
    Tracks whether the next token is inside an executable comment."""

    def __init__(self, sql: str, nbe: bool) -> None:
        self._tokens = iter_tokens(sql, no_backslash_escapes=nbe, trivia=True)
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
    """The common head shape (no comments inside, plain names); others go through tokens."""
    keyword = rf"(?i:INTO|VALUES?|SET|SELECT|PARTITION|WITH|TABLE)(?!{_IDC})"
    name = rf"(?:`[^`]*+(?:``[^`]*+)*+`|(?!{keyword}){_IDC}++)"
    return re.compile(
        rf"{_SKIP_PLAIN}((?i:INSERT|REPLACE))((?:{WS}++(?i:LOW_PRIORITY|DELAYED|HIGH_PRIORITY|IGNORE))*+)"
        rf"{WS}++(?:(?i:INTO){WS}++)?{name}(?:{WS}*+\.{WS}*+{name})?{WS}*+"
        rf"(?:\((?:{WS}*+{name}{WS}*+(?:,{WS}*+{name}{WS}*+)*+)?\){WS}*+)?"
        rf"(?i:VALUES?){WS}*+(?=\()"
    )


_INSERT_HEAD = _insert_head_regex()


def _parse_insert_head(sql: str, nbe: bool) -> InsertHead | str:
    """InsertHead, or the reason ``sql`` is not ``INSERT|REPLACE ... VALUES (``."""
    m = _INSERT_HEAD.match(sql)
    if m is not None:
        return InsertHead(m.group(1).upper(), frozenset(m.group(2).upper().split()), m.end())
    cur = _Cursor(sql, nbe)
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
    if table is None or table.kind not in _NAME_KINDS or (table.kind is TokenKind.WORD and table.text.upper() in _NOT_TABLE_NAMES):
        return "expected a table name"
    if cur.punct("."):
        cur.next()
        table = cur.next()
        if table is None or table.kind not in _NAME_KINDS:
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


def parse_insert_head(sql: str, *, no_backslash_escapes: bool = False) -> InsertHead | None:
    """Head of ``INSERT|REPLACE ... VALUES (...)``, or None for any other statement shape
    (INSERT ... SELECT / SET, VALUES ROW(...), ...). Raises SqlLexError on unterminated text
    before the rows."""
    head = _parse_insert_head(sql, no_backslash_escapes)
    return head if isinstance(head, InsertHead) else None


# --- Classification ---------------------------------------------------------------------------


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


@attrs.frozen
class Statement:
    """What a statement does to transaction and session state.

    ``implicit_commit``: the server commits an open transaction before running it (DDL, LOCK
    TABLES, BEGIN itself, SET autocommit=1, ...). ``read_only``: replaying it has no side effect.
    ``session_unrestorable``: why a session that ran it cannot be rebuilt on a new connection.
    ``needs_capture``: a session variable was set from an expression; read its value back to
    restore it. ``autocommit``: the value a SET gives autocommit (None if untouched/unknown).
    ``target``: savepoint name, database of USE, or SQL prepared statement name.
    """

    kind: Kind
    implicit_commit: bool = False
    read_only: bool = False
    begin_read_only: bool = False
    consistent_snapshot: bool = False
    chain: bool = False
    release: bool = False
    session_unrestorable: str | None = None
    needs_capture: bool = False
    autocommit: bool | None = None
    target: str | None = None


_PLAIN = {kind: Statement(kind) for kind in Kind}
_DDL_COMMIT = Statement(Kind.DDL, implicit_commit=True)
_OTHER_COMMIT = Statement(Kind.OTHER, implicit_commit=True)

# GET_LOCK(: candidates are found by a fast literal search, then confirmed to be code.
_LOCK_CANDIDATE = re.compile(r"_[Ll][Oo][Cc][Kk]")
_GET_LOCK_CALL = re.compile(rf"(?<!{_IDC})[Gg][Ee][Tt]_[Ll][Oo][Cc][Kk]{WS}*\(")
_GET_LOCK_REASON = "GET_LOCK() holds a named lock that belongs to the session"


def _code_scanner(backslash_escapes: bool) -> re.Pattern[str]:
    """Consumes code up to ``endpos``, skipping literals and comments whole. It stops short of
    ``endpos`` exactly when ``endpos`` lies inside a literal or comment (line comments must end
    with their newline here, so one running into ``endpos`` stops the scan too)."""
    sq = quoted_string("'", backslash_escapes)
    dq = quoted_string('"', backslash_escapes)
    return re.compile(
        rf"(?:[^'\"`#/\-]++|{sq}|{dq}|{BACKTICK_IDENT}|\#[^\n]*+\n|--(?=[\x00-\x20\x7f])[^\n]*+\n"
        rf"|{BLOCK_COMMENT}|{EXEC_COMMENT_OPEN}|-(?!-[\x00-\x20\x7f])|/(?!\*))*+"
    )


def _literal_token(backslash_escapes: bool) -> re.Pattern[str]:
    sq = quoted_string("'", backslash_escapes)
    dq = quoted_string('"', backslash_escapes)
    return re.compile(rf"{sq}|{dq}|{BACKTICK_IDENT}|{HASH_COMMENT}|{DASH_COMMENT}|{BLOCK_COMMENT}")


_CODE_SCANNER = {False: _code_scanner(True), True: _code_scanner(False)}
_LITERAL_TOKEN = {False: _literal_token(True), True: _literal_token(False)}


def _get_lock_reason(sql: str, nbe: bool) -> str | None:
    """GET_LOCK_REASON if ``sql`` calls GET_LOCK( outside literals and comments. Linear: the
    code scan resumes where the previous candidate left it."""
    scan_from = 0
    for m in _LOCK_CANDIDATE.finditer(sql):
        call = _GET_LOCK_CALL.match(sql, m.start() - 3)
        if call is None or call.start() < scan_from:
            continue
        pos = call.start()
        reached = _CODE_SCANNER[nbe].match(sql, scan_from, pos).end()
        if reached == pos:
            return _GET_LOCK_REASON
        # pos is inside the literal/comment starting at `reached`: resume after it.
        literal = _LITERAL_TOKEN[nbe].match(sql, reached)
        if literal is None:
            return None  # unterminated: the server rejects the statement anyway
        scan_from = literal.end()
    return None


# Statements up to this length are cached (transaction control, SET, USE: few distinct texts).
_CACHE_MAX_LEN = 256
_DML = frozenset({"INSERT", "REPLACE", "UPDATE", "DELETE"})


def classify(sql: str, *, no_backslash_escapes: bool = False) -> Statement:
    """Classify the first statement of ``sql``. Never raises: text it cannot lex is OTHER (or
    its leading keyword's kind) with conservative flags."""
    kws = leading_keywords(sql, 2)
    if kws and kws[0] in _DML:  # the hot path: one keyword regex and one literal search
        return _with_lock_check(Kind[kws[0]], sql, no_backslash_escapes)
    if len(sql) <= _CACHE_MAX_LEN:
        return _classify_cached(sql, no_backslash_escapes)
    return _classify(sql, no_backslash_escapes)


@functools.lru_cache(maxsize=4096)
def _classify_cached(sql: str, nbe: bool) -> Statement:
    return _classify(sql, nbe)


def _classify(sql: str, nbe: bool) -> Statement:
    kws = leading_keywords(sql, 2)
    if not kws:
        return _classify_no_keyword(sql, nbe)
    handler = _HANDLERS.get(kws[0])
    if handler is None:
        return _PLAIN[Kind.OTHER]
    try:
        return handler(sql, kws, nbe)
    except SqlParseError:
        return _PLAIN[_FALLBACK_KIND.get(kws[0], Kind.OTHER)]


_EMPTY = re.compile(rf"{_SKIP};?{_SKIP}\Z")
_OPEN_PAREN = re.compile(rf"{_SKIP}\(")


def _classify_no_keyword(sql: str, nbe: bool) -> Statement:
    if _EMPTY.match(sql):
        return _PLAIN[Kind.EMPTY]
    if _OPEN_PAREN.match(sql):  # (SELECT ...) UNION (SELECT ...)
        try:
            return _classify_query(sql, nbe, _statement_tokens(sql, nbe))
        except SqlParseError:
            return _PLAIN[Kind.SELECT]
    return _PLAIN[Kind.OTHER]


def _with_lock_check(kind: Kind, sql: str, nbe: bool, base: Statement | None = None) -> Statement:
    reason = _get_lock_reason(sql, nbe)
    base = base or _PLAIN[kind]
    return base if reason is None else attrs.evolve(base, session_unrestorable=reason)


def _classify_dml(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    return _with_lock_check(Kind[kws[0]], sql, nbe)


def _classify_call(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    return _with_lock_check(Kind.CALL, sql, nbe)


def _classify_load(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    if kws[1:] in (("DATA",), ("XML",)):
        return _PLAIN[Kind.LOAD_DATA]
    return _OTHER_COMMIT if kws[1:] == ("INDEX",) else _PLAIN[Kind.OTHER]


# Functions whose evaluation changes something (locks, sequences, the session, time spent).
_SIDE_EFFECT_FUNCTIONS = frozenset(
    {
        "GET_LOCK", "RELEASE_LOCK", "RELEASE_ALL_LOCKS", "SLEEP", "BENCHMARK", "NEXTVAL", "SETVAL",
        "MASTER_POS_WAIT", "SOURCE_POS_WAIT", "MASTER_GTID_WAIT", "WAIT_FOR_EXECUTED_GTID_SET",
        "WAIT_UNTIL_SQL_THREAD_AFTER_GTIDS",
    }
)  # fmt: skip


def _query_effects(tokens: list[Token]) -> tuple[bool, str | None]:
    """(read_only, session_unrestorable) of a SELECT-like token list."""
    read_only, reason = True, None
    n = len(tokens)
    for i, tok in enumerate(tokens):
        kind = tok.kind
        if kind is TokenKind.WORD:
            word = tok.text.upper()
            nxt = _word(tokens, i + 1)
            if word == "INTO":  # SELECT ... INTO @v / OUTFILE / DUMPFILE
                read_only = False
                if i + 1 < n and tokens[i + 1].kind is TokenKind.USER_VAR and reason is None:
                    reason = "SELECT ... INTO @variable assigns a user variable from query results"
            elif (word == "FOR" and nxt in ("UPDATE", "SHARE")) or (word == "LOCK" and nxt == "IN"):
                read_only = False
            elif word == "NEXT" and nxt == "VALUE":  # MariaDB NEXT VALUE FOR seq
                read_only = False
            elif _is_punct(tokens, i + 1, "("):
                if word in _SIDE_EFFECT_FUNCTIONS:
                    read_only = False
                    if word == "GET_LOCK":
                        reason = _GET_LOCK_REASON
                elif word == "LAST_INSERT_ID" and not _is_punct(tokens, i + 2, ")"):
                    read_only = False  # LAST_INSERT_ID(expr) sets the value
        elif kind is TokenKind.PUNCT and tok.text == ":=" and i and tokens[i - 1].kind is TokenKind.USER_VAR:
            read_only = False
            if reason is None:
                reason = "a user variable is assigned inside a query (@v := ...)"
    return read_only, reason


def _classify_query(sql: str, nbe: bool, tokens: list[Token] | None = None) -> Statement:
    """SELECT, WITH ..., TABLE t, VALUES ROW(...), (SELECT ...)."""
    tokens = _statement_tokens(sql, nbe) if tokens is None else tokens
    if _word(tokens, 0) == "WITH":
        verb = _main_verb_after_with(tokens)
        if verb in ("UPDATE", "DELETE", "INSERT", "REPLACE"):
            return _with_lock_check(Kind[verb], sql, nbe)
    read_only, reason = _query_effects(tokens)
    if read_only and reason is None:
        return _READ_ONLY_SELECT
    return Statement(Kind.SELECT, read_only=read_only, session_unrestorable=reason)


_READ_ONLY_SELECT = Statement(Kind.SELECT, read_only=True)
_QUERY_VERBS = frozenset({"SELECT", "TABLE", "VALUES", "UPDATE", "DELETE", "INSERT", "REPLACE"})


def _main_verb_after_with(tokens: list[Token]) -> str | None:
    """The statement verb after ``WITH cte AS (...), ...``: CTE bodies are parenthesized, so it
    is the first verb outside parentheses."""
    depth = 0
    for tok in tokens[1:]:
        if tok.kind is TokenKind.PUNCT:
            depth += tok.text == "("
            depth -= tok.text == ")"
        elif depth == 0 and tok.kind is TokenKind.WORD and tok.text.upper() in _QUERY_VERBS:
            return tok.text.upper()
    return None


def _classify_select(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    return _classify_query(sql, nbe)


def _classify_do(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    read_only, reason = _query_effects(_statement_tokens(sql, nbe))
    return Statement(Kind.DO, read_only=read_only, session_unrestorable=reason)


def _classify_explain(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    """EXPLAIN/DESCRIBE/DESC only describe, unless ANALYZE: that runs the statement."""
    if kws[1:] == ("ANALYZE",):
        inner = _classify(sql[_after_keywords(sql, 2) :], nbe)
        return attrs.evolve(inner, kind=Kind.SHOW) if inner.read_only else inner
    return _READ_ONLY_SHOW


_READ_ONLY_SHOW = Statement(Kind.SHOW, read_only=True)


def _classify_show(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    return _READ_ONLY_SHOW


def _classify_use(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    tokens = _statement_tokens(sql, nbe)
    if len(tokens) != 2 or tokens[1].kind not in _NAME_KINDS:
        return _PLAIN[Kind.OTHER]
    return Statement(Kind.USE, read_only=True, target=_name(tokens[1]))


# START TRANSACTION characteristics; TiDB adds BEGIN PESSIMISTIC / OPTIMISTIC.
def _classify_begin(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    tokens = _statement_tokens(sql, nbe)
    words = [_word(tokens, i) for i in range(len(tokens))]
    if words[0] == "BEGIN":
        if words[1:] in ([], ["WORK"], ["PESSIMISTIC"], ["OPTIMISTIC"]):
            return _BEGIN
        return _PLAIN[Kind.OTHER]  # BEGIN NOT ATOMIC (MariaDB compound statement), ...
    if words[1:2] != ["TRANSACTION"]:
        return _OTHER_COMMIT  # START SLAVE / REPLICA / GROUP_REPLICATION
    read_only = snapshot = False
    for item in _split_top_level(tokens[2:]):
        item_words = [_word(item, i) for i in range(len(item))]
        if item_words == ["WITH", "CONSISTENT", "SNAPSHOT"]:
            snapshot = True
        elif item_words == ["READ", "WRITE"]:
            read_only = False
        elif item_words[:2] == ["READ", "ONLY"]:
            read_only = True  # TiDB: READ ONLY AS OF TIMESTAMP ...
            if len(item) > 2 and item_words[2:4] != ["AS", "OF"]:
                return _PLAIN[Kind.OTHER]
        elif item:
            return _PLAIN[Kind.OTHER]
    return Statement(Kind.BEGIN, implicit_commit=True, begin_read_only=read_only, consistent_snapshot=snapshot)


_BEGIN = Statement(Kind.BEGIN, implicit_commit=True)


def _completion_options(words: list[str | None]) -> tuple[bool, bool] | None:
    """[AND [NO] CHAIN] [[NO] RELEASE] -> (chain, release), None if something else follows."""
    chain = release = False
    i = 0
    if words[i : i + 2] == ["AND", "CHAIN"]:
        chain, i = True, i + 2
    elif words[i : i + 3] == ["AND", "NO", "CHAIN"]:
        i += 3
    if words[i : i + 1] == ["RELEASE"]:
        release, i = True, i + 1
    elif words[i : i + 2] == ["NO", "RELEASE"]:
        i += 2
    return (chain, release) if i == len(words) else None


def _classify_commit(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    """COMMIT|ROLLBACK [WORK] [AND [NO] CHAIN] [[NO] RELEASE]; ROLLBACK [WORK] TO [SAVEPOINT] x."""
    tokens = _statement_tokens(sql, nbe)
    kind = Kind[kws[0]]
    i = 2 if _word(tokens, 1) == "WORK" else 1
    if kind is Kind.ROLLBACK and _word(tokens, i) == "TO":
        i += 2 if _word(tokens, i + 1) == "SAVEPOINT" else 1
        return _savepoint_statement(Kind.ROLLBACK_TO_SAVEPOINT, tokens, i)
    options = _completion_options([_word(tokens, j) for j in range(i, len(tokens))])
    if options is None:
        return _PLAIN[Kind.OTHER]
    chain, release = options
    return Statement(kind, chain=chain, release=release) if chain or release else _PLAIN[kind]


def _savepoint_statement(kind: Kind, tokens: list[Token], i: int) -> Statement:
    if i != len(tokens) - 1 or tokens[i].kind not in _NAME_KINDS:
        return _PLAIN[Kind.OTHER]
    return Statement(kind, target=_name(tokens[i]))


def _classify_savepoint(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    return _savepoint_statement(Kind.SAVEPOINT, _statement_tokens(sql, nbe), 1)


def _classify_release(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    if kws[1:] != ("SAVEPOINT",):
        return _PLAIN[Kind.OTHER]
    return _savepoint_statement(Kind.RELEASE_SAVEPOINT, _statement_tokens(sql, nbe), 2)


def _classify_xa(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    return _XA_RECOVER if kws[1:] == ("RECOVER",) else _PLAIN[Kind.XA]


_XA_RECOVER = Statement(Kind.XA, read_only=True)
_AUTOCOMMIT_VALUES = {"1": True, "ON": True, "TRUE": True, "'ON'": True, "'1'": True,
                      "0": False, "OFF": False, "FALSE": False, "'OFF'": False, "'0'": False}  # fmt: skip


def _classify_set(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    second = kws[1] if len(kws) > 1 else None
    if second == "STATEMENT":  # SET STATEMENT var=value[, ...] FOR <statement>: that statement
        return _classify(sql[_set_statement_body(sql, nbe) :], nbe)
    kws = leading_keywords(sql, 3)
    if _is_set_not_assignment(kws):
        if second == "PASSWORD":
            return _OTHER_COMMIT
        if second == "ROLE":
            return Statement(Kind.SET, session_unrestorable="SET ROLE changes the active roles, which are not restored")
        return _PLAIN[Kind.OTHER]  # SET DEFAULT ROLE / SET RESOURCE GROUP
    try:
        assignments = parse_set(sql, no_backslash_escapes=nbe) or []
    except SqlParseError as exc:
        return Statement(Kind.SET, session_unrestorable=f"SET statement not understood: {exc}")
    if _is_set_transaction(kws):
        return _PLAIN[Kind.SET_TRANSACTION]
    reason = _get_lock_reason(sql, nbe)
    needs_capture = implicit_commit = False
    autocommit = None
    for a in assignments:
        if a.scope is SetScope.USER and not a.is_constant and reason is None:
            reason = f"user variable @{a.name} is assigned a non-constant expression"
        elif a.scope is SetScope.SESSION:
            needs_capture |= not a.is_constant
            if a.name == "autocommit":
                autocommit = _AUTOCOMMIT_VALUES.get(a.value_sql.upper())
                implicit_commit = autocommit is not False  # turning autocommit on commits
    if not (reason or needs_capture or implicit_commit or autocommit is not None):
        return _PLAIN[Kind.SET]
    return Statement(Kind.SET, implicit_commit=implicit_commit, session_unrestorable=reason,
                     needs_capture=needs_capture, autocommit=autocommit)  # fmt: skip


def _set_statement_body(sql: str, nbe: bool) -> int:
    """Offset of the statement after ``SET STATEMENT ... FOR``."""
    depth = 0
    for tok in iter_tokens(sql, no_backslash_escapes=nbe):
        if tok.kind is TokenKind.PUNCT:
            depth += tok.text == "("
            depth -= tok.text == ")"
        elif depth == 0 and tok.kind is TokenKind.WORD and tok.text.upper() == "FOR":
            return tok.end
    raise SqlParseError("SET STATEMENT without FOR")


def _classify_create(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    words = leading_keywords(sql, 4)
    if words[1:3] == ("OR", "REPLACE"):
        words = words[:1] + words[3:]
    if words[1:2] == ("TEMPORARY",):  # no implicit commit, but the table lives in the session
        return Statement(Kind.DDL, session_unrestorable="CREATE TEMPORARY TABLE: temporary tables live only in the session")
    return _with_lock_check(Kind.DDL, sql, nbe, _DDL_COMMIT)


def _classify_drop(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    if kws[1:] == ("PREPARE",):
        return _classify_deallocate(sql, kws, nbe)
    if kws[1:] == ("TEMPORARY",):
        return _PLAIN[Kind.DDL]
    return _DDL_COMMIT


def _classify_ddl(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    return _DDL_COMMIT


def _classify_lock(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    if kws[1:] in (("TABLES",), ("TABLE",)):
        return Statement(Kind.LOCK_TABLES, implicit_commit=True, session_unrestorable="LOCK TABLES holds table locks that belong to the session")
    if kws[1:] == ("INSTANCE",):
        return Statement(Kind.OTHER, session_unrestorable="LOCK INSTANCE FOR BACKUP holds a lock that belongs to the session")
    return _PLAIN[Kind.OTHER]


def _classify_unlock(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    if kws[1:] in (("TABLES",), ("TABLE",)):
        return _UNLOCK_TABLES
    return _PLAIN[Kind.OTHER]


_UNLOCK_TABLES = Statement(Kind.UNLOCK_TABLES, implicit_commit=True)


def _classify_prepare(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    tokens = _statement_tokens(sql, nbe)
    if len(tokens) < 4 or tokens[1].kind not in _NAME_KINDS or _word(tokens, 2) != "FROM":
        return _PLAIN[Kind.OTHER]
    name = _name(tokens[1])
    return Statement(Kind.PREPARE_SQL, target=name,
                     session_unrestorable=f"PREPARE {name}: SQL-level prepared statements live only in the session")  # fmt: skip


def _classify_execute(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    if kws[1:] == ("IMMEDIATE",):  # MariaDB EXECUTE IMMEDIATE 'sql'
        return _PLAIN[Kind.EXECUTE_SQL]
    tokens = _statement_tokens(sql, nbe)
    if len(tokens) < 2 or tokens[1].kind not in _NAME_KINDS:
        return _PLAIN[Kind.OTHER]
    return Statement(Kind.EXECUTE_SQL, target=_name(tokens[1]))


def _classify_deallocate(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    """DEALLOCATE PREPARE name / DROP PREPARE name."""
    tokens = _statement_tokens(sql, nbe)
    if len(tokens) != 3 or _word(tokens, 1) != "PREPARE" or tokens[2].kind not in _NAME_KINDS:
        return _PLAIN[Kind.OTHER]
    return Statement(Kind.DEALLOCATE_SQL, target=_name(tokens[2]))


def _classify_analyze(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    """ANALYZE TABLE commits; MariaDB's ANALYZE <statement> runs the statement."""
    if kws[1:] in (("SELECT",), ("UPDATE",), ("DELETE",), ("INSERT",), ("REPLACE",)):
        inner = _classify(sql[_after_keywords(sql, 1) :], nbe)
        return attrs.evolve(inner, kind=Kind.SHOW) if inner.read_only else inner
    return _OTHER_COMMIT


def _classify_flush(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    tokens = _statement_tokens(sql, nbe)
    words = [_word(tokens, i) for i in range(len(tokens))]
    for i in range(len(words) - 1):
        if (words[i], words[i + 1]) in (("READ", "LOCK"), ("FOR", "EXPORT")):
            return Statement(Kind.OTHER, implicit_commit=True,
                             session_unrestorable="FLUSH TABLES ... WITH READ LOCK / FOR EXPORT holds locks that belong to the session")  # fmt: skip
    return _OTHER_COMMIT


def _classify_handler(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    tokens = _statement_tokens(sql, nbe)
    if any(_word(tokens, i) == "OPEN" for i in range(len(tokens))):
        return Statement(Kind.OTHER, session_unrestorable="HANDLER ... OPEN keeps a table handler open in the session")
    return _PLAIN[Kind.OTHER]


def _classify_backup(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    return Statement(Kind.OTHER, session_unrestorable="MariaDB BACKUP STAGE / BACKUP LOCK holds locks that belong to the session")


def _classify_other_commit(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    return _OTHER_COMMIT


def _classify_stop(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    return _OTHER_COMMIT if kws[1:] in (("SLAVE",), ("REPLICA",), ("GROUP_REPLICATION",)) else _PLAIN[Kind.OTHER]


def _classify_change(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    return _OTHER_COMMIT if kws[1:] in (("MASTER",), ("REPLICATION",)) else _PLAIN[Kind.OTHER]


def _classify_check(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    return _OTHER_COMMIT if kws[1:] in (("TABLE",), ("TABLES",)) else _PLAIN[Kind.OTHER]


def _classify_help(sql: str, kws: tuple[str, ...], nbe: bool) -> Statement:
    return _READ_ONLY_OTHER


_READ_ONLY_OTHER = Statement(Kind.OTHER, read_only=True)

_HANDLERS = {
    "INSERT": _classify_dml, "REPLACE": _classify_dml, "UPDATE": _classify_dml, "DELETE": _classify_dml,
    "SELECT": _classify_select, "WITH": _classify_select, "TABLE": _classify_select, "VALUES": _classify_select,
    "SHOW": _classify_show, "DESCRIBE": _classify_explain, "DESC": _classify_explain, "EXPLAIN": _classify_explain,
    "BEGIN": _classify_begin, "START": _classify_begin,
    "COMMIT": _classify_commit, "ROLLBACK": _classify_commit,
    "SAVEPOINT": _classify_savepoint, "RELEASE": _classify_release, "XA": _classify_xa,
    "SET": _classify_set, "USE": _classify_use, "DO": _classify_do, "CALL": _classify_call, "LOAD": _classify_load,
    "CREATE": _classify_create, "DROP": _classify_drop,
    "ALTER": _classify_ddl, "RENAME": _classify_ddl, "TRUNCATE": _classify_ddl,
    "LOCK": _classify_lock, "UNLOCK": _classify_unlock,
    "PREPARE": _classify_prepare, "EXECUTE": _classify_execute, "DEALLOCATE": _classify_deallocate,
    "ANALYZE": _classify_analyze, "FLUSH": _classify_flush, "HANDLER": _classify_handler, "BACKUP": _classify_backup,
    "GRANT": _classify_other_commit, "REVOKE": _classify_other_commit, "OPTIMIZE": _classify_other_commit,
    "REPAIR": _classify_other_commit, "CACHE": _classify_other_commit, "RESET": _classify_other_commit,
    "INSTALL": _classify_other_commit, "UNINSTALL": _classify_other_commit,
    "STOP": _classify_stop, "CHANGE": _classify_change, "CHECK": _classify_check, "HELP": _classify_help,
}  # fmt: skip

# Kind reported when a statement's text cannot be lexed (the server will reject it too).
_FALLBACK_KIND = {
    "SELECT": Kind.SELECT, "WITH": Kind.SELECT, "DO": Kind.DO, "SET": Kind.SET,
    "COMMIT": Kind.OTHER, "ROLLBACK": Kind.OTHER, "BEGIN": Kind.OTHER, "START": Kind.OTHER,
}  # fmt: skip


# --- Idempotency ------------------------------------------------------------------------------
#
# A statement is idempotent here when applying it again, after it (and the rest of its
# transaction) may already have been applied, leaves the same rows. That holds for the shapes
# DM's safe mode emits: keyed full-row writes (REPLACE, INSERT ... ON DUPLICATE KEY UPDATE
# c=VALUES(c)), keyed deletes, and keyed updates to constants. Each of them sets the row with a
# given key to a fixed value or removes it, whatever it held before, so a replayed sequence of
# them ends where the first run ended. Assumptions the text cannot show: the literal values cover
# a primary/unique key (DM guarantees it; on a table without one, REPLACE duplicates rows), and no
# other statement of the transaction changes a key (DM's safe mode turns such UPDATEs into
# DELETE + REPLACE). Values must be literals: NOW(), RAND(), DEFAULT or a column would change the
# outcome of a second run.


def _literal_pattern(backslash_escapes: bool) -> str:
    """One constant literal (a string, number, NULL/TRUE/FALSE, hex/bit, introduced string, ?),
    matched atomically."""
    sq = quoted_string("'", backslash_escapes)
    dq = quoted_string('"', backslash_escapes)
    hex_bit = rf"[Xx]'[0-9A-Fa-f]*+'|[Bb]'[01]*+'|0x[0-9A-Fa-f]++(?!{_IDC})|0b[01]++(?!{_IDC})"
    return (
        rf"(?>{sq}"
        rf"|[-+]?(?:[0-9]++(?:\.[0-9]*+)?|\.[0-9]++)(?:[eE][-+]?[0-9]++)?(?!{_IDC})"
        rf"|(?i:NULL|TRUE|FALSE)(?!{_IDC})"
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


def _dm_delete_regex(backslash_escapes: bool) -> re.Pattern[str]:
    """The DELETE shape DM emits, ``DELETE FROM t WHERE k = lit [AND k2 IS NULL ...] [LIMIT 1]``:
    a regex fast path for ``is_idempotent``; anything else goes through the tokens."""
    literal = _literal_pattern(backslash_escapes)
    name = rf"(?:`[^`]*+(?:``[^`]*+)*+`|{_IDC}++)"
    column = rf"{name}(?:{WS}*+\.{WS}*+{name}){{0,2}}"
    condition = rf"{column}{WS}*+(?:<?=>?{WS}*+{literal}|(?i:IS){WS}++(?:(?i:NULL)(?!{_IDC})|\?))"
    return re.compile(
        rf"{_SKIP_PLAIN}(?i:DELETE){WS}++(?i:FROM){WS}++{name}(?:{WS}*+\.{WS}*+{name})?{WS}++"
        rf"(?i:WHERE){WS}++{condition}(?:{WS}++(?i:AND){WS}++{condition})*+"
        rf"(?:{WS}++(?i:LIMIT){WS}++1)?{WS}*+;?{WS}*+\Z"
    )


_LITERAL_ROWS = {False: _literal_rows_regex(True), True: _literal_rows_regex(False)}
_DM_DELETE = {False: _dm_delete_regex(True), True: _dm_delete_regex(False)}
_TRANSACTION_KINDS = frozenset({Kind.BEGIN, Kind.COMMIT, Kind.ROLLBACK, Kind.SAVEPOINT,
                                Kind.ROLLBACK_TO_SAVEPOINT, Kind.RELEASE_SAVEPOINT})  # fmt: skip
_SESSION_SET_SCOPES = frozenset({SetScope.SESSION, SetScope.USER, SetScope.NAMES, SetScope.CHARSET,
                                 SetScope.TRANSACTION, SetScope.NEXT_TRANSACTION})  # fmt: skip


def is_idempotent(sql: str, *, no_backslash_escapes: bool = False) -> bool:
    """Can this statement be applied again, after it may already have been, with the same final
    state? True only for the keyed/constant shapes described above, transaction control, SETs
    of session/user variables to constants, and read-only SELECT/SHOW/USE. ``?`` placeholders
    count as literals."""
    nbe = no_backslash_escapes
    kws = leading_keywords(sql, 2)
    first = kws[0] if kws else None
    try:
        if first in ("INSERT", "REPLACE"):
            return _idempotent_insert(sql, nbe)
        if first == "UPDATE":
            return _idempotent_update(_statement_tokens(sql, nbe))
        if first == "DELETE":
            return _DM_DELETE[nbe].match(sql) is not None or _idempotent_delete(_statement_tokens(sql, nbe))
        if first == "SET":
            if kws[1:] == ("STATEMENT",):
                return is_idempotent(sql[_set_statement_body(sql, nbe) :], no_backslash_escapes=nbe)
            assignments = parse_set(sql, no_backslash_escapes=nbe)
            return bool(assignments) and all(a.is_constant and a.scope in _SESSION_SET_SCOPES for a in assignments)
    except SqlParseError:
        return False
    st = classify(sql, no_backslash_escapes=nbe)
    if st.kind in _TRANSACTION_KINDS:
        return True
    return st.kind in (Kind.SELECT, Kind.SHOW, Kind.USE) and st.read_only and st.session_unrestorable is None


def _idempotent_insert(sql: str, nbe: bool) -> bool:
    """REPLACE ... VALUES (literals)...; INSERT ... VALUES (literals)... ON DUPLICATE KEY UPDATE
    c = VALUES(c) | alias.c | literal, ..."""
    head = _parse_insert_head(sql, nbe)
    if isinstance(head, str) or "IGNORE" in head.modifiers:
        return False
    rows = _LITERAL_ROWS[nbe].match(sql, head.rows_start)
    if rows is None:
        return False
    tail = _statement_tokens(sql, nbe, start=rows.end())
    if head.verb == "REPLACE":
        return not tail
    return _safe_on_duplicate(tail, nbe)


def _safe_on_duplicate(tokens: list[Token], nbe: bool) -> bool:
    """``[AS alias [(cols)]] ON DUPLICATE KEY UPDATE`` whose right sides use only the new row's
    values or literals, never the existing row (``c = c + 1`` is not idempotent)."""
    i, alias, alias_columns = 0, None, set()
    if _word(tokens, 0) == "AS":
        if len(tokens) < 2 or tokens[1].kind not in _NAME_KINDS:
            return False
        alias, i = _name(tokens[1], nbe).lower(), 2
        if _is_punct(tokens, 2, "("):
            close = _closing_paren(tokens, 2)
            if close < 0:
                return False
            alias_columns = {_name(t, nbe).lower() for t in tokens[3:close] if t.kind in _NAME_KINDS}
            i = close + 1
    if [_word(tokens, j) for j in range(i, i + 4)] != ["ON", "DUPLICATE", "KEY", "UPDATE"]:
        return False
    items = _split_top_level(tokens[i + 4 :])
    for item in items:
        column_end = _column_ref_end(item, 0)
        if column_end < 0 or not _is_punct(item, column_end, "="):
            return False
        rhs = item[column_end + 1 :]
        if not (_is_constant(rhs, bare_words=False, placeholders=True) or _is_new_row_value(rhs, alias, alias_columns, nbe)):
            return False
    return bool(items)


def _is_new_row_value(rhs: list[Token], alias: str | None, alias_columns: set[str], nbe: bool) -> bool:
    """VALUES(col), alias.col, or a column alias of ``AS alias(cols)``."""
    n = len(rhs)
    if n == 4 and _word(rhs, 0) == "VALUES" and _is_punct(rhs, 1, "(") and rhs[2].kind in _NAME_KINDS and _is_punct(rhs, 3, ")"):
        return True
    if alias is not None and n == 3 and rhs[0].kind in _NAME_KINDS and _is_punct(rhs, 1, ".") and rhs[2].kind in _NAME_KINDS:
        return _name(rhs[0], nbe).lower() == alias
    return n == 1 and rhs[0].kind in _NAME_KINDS and _name(rhs[0], nbe).lower() in alias_columns


def _column_ref_end(tokens: list[Token], i: int) -> int:
    """Index after ``col``, ``t.col`` or ``db.t.col`` starting at i, or -1."""
    if i >= len(tokens) or tokens[i].kind not in _NAME_KINDS:
        return -1
    i += 1
    for _ in range(2):
        if _is_punct(tokens, i, ".") and i + 1 < len(tokens) and tokens[i + 1].kind in _NAME_KINDS:
            i += 2
    return i


def _column_key(tokens: list[Token]) -> str:
    """Column name of a column reference, without qualifiers, lower-cased."""
    return _name(tokens[-1]).lower()


def _literal_key(tokens: list[Token]) -> str | None:
    """Comparable text of a literal; None for a placeholder (its value is unknown)."""
    if any(t.kind is TokenKind.PLACEHOLDER for t in tokens):
        return None
    return " ".join(t.text.upper() if t.kind is TokenKind.WORD else t.text for t in tokens)


def _table_ref_end(tokens: list[Token], i: int) -> int:
    """Index after a single ``t`` / ``db.t`` table reference at i, or -1."""
    if i >= len(tokens) or tokens[i].kind not in _NAME_KINDS:
        return -1
    if _is_punct(tokens, i + 1, "."):
        return i + 3 if i + 2 < len(tokens) and tokens[i + 2].kind in _NAME_KINDS else -1
    return i + 1


def _strip_limit_one(tokens: list[Token]) -> tuple[list[Token], bool]:
    if len(tokens) >= 2 and _word(tokens, len(tokens) - 2) == "LIMIT" and tokens[-1].text == "1":
        return tokens[:-2], True
    return tokens, False


def _keyed_conjunction(tokens: list[Token]) -> dict[str, str | None] | None:
    """``k1 = lit AND k2 IS NULL AND (a, b) = (1, 2) ...`` -> {column: literal key}, else None."""
    result: dict[str, str | None] = {}
    for pred in _split_words(tokens, "AND"):
        pairs = _keyed_predicate(pred)
        if pairs is None:
            return None
        result.update(pairs)
    return result


def _keyed_predicate(pred: list[Token]) -> dict[str, str | None] | None:
    if not pred:
        return None
    if _is_punct(pred, 0, "(") and _closing_paren(pred, 0) == len(pred) - 1:
        inner = pred[1:-1]
        if not any(_is_punct(inner, j, ",") for j in range(len(inner))):
            return _keyed_conjunction(inner)  # (k = 1 AND j = 2)
        return None
    if _is_punct(pred, 0, "("):  # (a, b) = (1, 2)
        close = _closing_paren(pred, 0)
        if close < 0 or not _is_punct(pred, close + 1, "=") or not _is_punct(pred, close + 2, "("):
            return None
        if _closing_paren(pred, close + 2) != len(pred) - 1:
            return None
        columns = _split_top_level(pred[1:close])
        values = _split_top_level(pred[close + 3 : -1])
        if len(columns) != len(values):
            return None
        result: dict[str, str | None] = {}
        for col, val in zip(columns, values):
            if _column_ref_end(col, 0) != len(col) or not _is_constant(val, bare_words=False, placeholders=True):
                return None
            result[_column_key(col)] = _literal_key(val)
        return result
    end = _column_ref_end(pred, 0)
    if end < 0 or end >= len(pred):
        return None
    column, op, value = pred[:end], pred[end], pred[end + 1 :]
    if op.kind is TokenKind.PUNCT and op.text in ("=", "<=>"):
        if _is_constant(value, bare_words=False, placeholders=True):
            return {_column_key(column): _literal_key(value)}
    elif op.kind is TokenKind.WORD and op.text.upper() == "IS" and len(value) == 1:
        if _word(value, 0) == "NULL":
            return {_column_key(column): "NULL"}
        if value[0].kind is TokenKind.PLACEHOLDER:  # DM's "k IS ?" before interpolation
            return {_column_key(column): None}
    return None


def _keyed_set(tokens: list[Token]) -> bool:
    """A constant set of keys (DM's multi-row DELETE): ``(k = 1 AND j = 2) OR (k = 3 ...) ...``,
    ``k IN (lit, ...)`` or ``(a, b) IN ((lit, lit), ...)``."""
    alternatives = _split_words(tokens, "OR")
    if len(alternatives) > 1:  # every alternative must name the same key columns
        keys = [_keyed_conjunction(alt) for alt in alternatives]
        return all(k is not None and k.keys() == keys[0].keys() for k in keys)  # type: ignore[union-attr]
    if _is_punct(tokens, 0, "("):  # a tuple of columns
        close = _closing_paren(tokens, 0)
        if close < 0:
            return False
        columns = _split_top_level(tokens[1:close])
        if not all(_column_ref_end(c, 0) == len(c) for c in columns):
            return False
        width, i = len(columns), close + 1
    else:
        width, i = 0, _column_ref_end(tokens, 0)
        if i < 0:
            return False
    if _word(tokens, i) != "IN" or not _is_punct(tokens, i + 1, "(") or _closing_paren(tokens, i + 1) != len(tokens) - 1:
        return False
    for value in _split_top_level(tokens[i + 2 : -1]):
        if width:  # each value is a (lit, lit, ...) tuple of the same width
            if not (_is_punct(value, 0, "(") and _closing_paren(value, 0) == len(value) - 1):
                return False
            value_parts = _split_top_level(value[1:-1])
        else:
            value_parts = [value]
        if (width and len(value_parts) != width) or not all(
            _is_constant(p, bare_words=False, placeholders=True) for p in value_parts
        ):
            return False
    return True


def _idempotent_delete(tokens: list[Token]) -> bool:
    """DELETE [LOW_PRIORITY] [QUICK] FROM t WHERE <keyed predicate> [LIMIT 1]."""
    i = 1
    while _word(tokens, i) in ("LOW_PRIORITY", "QUICK"):
        i += 1
    if _word(tokens, i) != "FROM":
        return False
    i = _table_ref_end(tokens, i + 1)
    if i < 0 or _word(tokens, i) != "WHERE":
        return False
    condition, limited = _strip_limit_one(tokens[i + 1 :])
    if _keyed_conjunction(condition) is not None:
        return True
    # Deleting a constant set of keys is idempotent too, but LIMIT would make it "some of them".
    return not limited and _keyed_set(condition)


def _idempotent_update(tokens: list[Token]) -> bool:
    """UPDATE [LOW_PRIORITY] t SET c = lit, ... WHERE <keyed conjunction> [LIMIT 1], where a key
    column may only be "assigned" its own WHERE value (DM sets every column, key included)."""
    i = 2 if _word(tokens, 1) == "LOW_PRIORITY" else 1
    i = _table_ref_end(tokens, i)
    if i < 0 or _word(tokens, i) != "SET":
        return False
    where = next((j for j in range(i + 1, len(tokens)) if _word(tokens, j) == "WHERE"), -1)
    if where < 0:
        return False
    assigned: dict[str, str | None] = {}
    for item in _split_top_level(tokens[i + 1 : where]):
        end = _column_ref_end(item, 0)
        if end < 0 or not _is_punct(item, end, "=") or not _is_constant(item[end + 1 :], bare_words=False, placeholders=True):
            return False
        assigned[_column_key(item[:end])] = _literal_key(item[end + 1 :])
    condition, _ = _strip_limit_one(tokens[where + 1 :])
    keys = _keyed_conjunction(condition)
    if keys is None or not assigned:
        return False
    for column, value in keys.items():
        if column in assigned and (value is None or assigned[column] != value):
            return False  # the update moves the row out of its own WHERE
    return True
