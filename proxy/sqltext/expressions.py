"""What the expressions of a statement do: the functions it calls (a stored function is user
code; GET_LOCK() holds a session lock) and the effects of a query (INTO, locking reads,
variable assignments, sequences)."""

from __future__ import annotations

import attrs

import proxy.sqltext.tokens as tk
from proxy.sqltext.dialect import Dialect
from proxy.sqltext.functions import BUILTIN_EFFECTS, PAREN_KEYWORDS, PURE_FUNCTIONS
from proxy.sqltext.lexer import NAME_KINDS, SqlParseError, Token, TokenKind, iter_tokens

__all__ = ["Calls", "calls", "effects", "reads_last_results", "GET_LOCK_REASON"]

GET_LOCK_REASON = "GET_LOCK() holds a named lock that belongs to the session"


@attrs.frozen
class Calls:
    """What a statement calls: the first call of anything but a side-effect-free built-in,
    whether that includes a stored function (user code), whether GET_LOCK()."""

    first: str | None = None
    stored: bool = False
    get_lock: bool = False


# A name after these words, followed by "(", is a table with its column list, not a call.
_BEFORE_TABLE = frozenset(
    {"INTO", "TABLE", "INSERT", "REPLACE", "LOW_PRIORITY", "DELAYED", "HIGH_PRIORITY", "IGNORE", "EXISTS", "ON", "REFERENCES"}
)  # CREATE TABLE IF NOT EXISTS t (..), CREATE INDEX i ON t (..)


def _names_a_table(tokens: list[Token], i: int, parens: dict[int, int]) -> bool:
    """tokens[i], followed by "(", names a table (``INTO t (a, b)``, ``INTO db.t (a)``) or a CTE
    with its columns (``WITH c (a) AS (...)``, ``, c (a) AS``). ``parens``: tk.matching_parens."""
    j = i - 2 if tk.is_punct(tokens, i - 1, ".") else i  # db.t: look before db
    if tk.word(tokens, j - 1) in _BEFORE_TABLE or tk.word(tokens, j - 1) in ("WITH", "RECURSIVE"):
        return True
    close = parens.get(i + 1, -1)
    return close > 0 and tk.word(tokens, close + 1) == "AS" and tk.is_punct(tokens, close + 2, "(")


def calls(tokens: list[Token], not_calls: frozenset[int] = frozenset()) -> Calls:
    """``not_calls``: indices of names followed by "(" known to be no call (DDL structure,
    ``proxy.sqltext.ddl``)."""
    first, stored, get_lock = None, False, False
    parens = tk.matching_parens(tokens)  # once: looking each one up again is quadratic in nesting
    for i, tok in enumerate(tokens):
        if not tk.is_punct(tokens, i + 1, "(") or tok.kind not in NAME_KINDS or i in not_calls:
            continue
        if _names_a_table(tokens, i, parens):
            continue
        if tok.kind is TokenKind.QUOTED_IDENT:  # `f`(...): only stored functions are called so
            first, stored = first or tok.text, True
        elif tok.kind is TokenKind.WORD:
            word = tok.text.upper()
            if tk.is_punct(tokens, i - 1, "."):  # db.f(...)
                first, stored = first or tok.text, True
            elif word in PAREN_KEYWORDS or word in PURE_FUNCTIONS:
                continue
            elif word == "LAST_INSERT_ID" and tk.is_punct(tokens, i + 2, ")"):
                continue  # reading it; LAST_INSERT_ID(expr) sets it
            else:
                first = first or tok.text
                stored |= word not in BUILTIN_EFFECTS
                get_lock |= word == "GET_LOCK"
    return Calls(first, stored, get_lock)


def effects(tokens: list[Token], not_calls: frozenset[int] = frozenset()) -> tuple[bool, str | None, bool]:
    """(read_only, session_unrestorable, runs_code) of the expressions of a query: it reads
    unless it calls something that may write, takes locks, writes into variables or files, or
    moves a sequence; it runs code when it calls a stored function."""
    found = calls(tokens, not_calls)
    read_only = found.first is None
    reason = GET_LOCK_REASON if found.get_lock else None
    n = len(tokens)
    for i, tok in enumerate(tokens):
        kind = tok.kind
        if kind is TokenKind.WORD:
            word = tok.text.upper()
            nxt = tk.word(tokens, i + 1)
            if word == "INTO":  # SELECT ... INTO @v / OUTFILE / DUMPFILE
                read_only = False
                if i + 1 < n and tokens[i + 1].kind is TokenKind.USER_VAR and reason is None:
                    reason = "SELECT ... INTO @variable assigns a user variable from query results"
            elif (word == "FOR" and nxt in ("UPDATE", "SHARE")) or (word == "LOCK" and nxt == "IN"):
                read_only = False
            elif word == "NEXT" and nxt == "VALUE":  # MariaDB NEXT VALUE FOR seq
                read_only = False
            elif word == "NEXTVAL" and tk.is_punct(tokens, i - 1, "."):  # seq.nextval (sql_mode=ORACLE)
                read_only = False
        elif kind is TokenKind.PUNCT and tok.text == ":=" and i and tokens[i - 1].kind is TokenKind.USER_VAR:
            read_only = False
            if reason is None:
                reason = "a user variable is assigned inside a query (@v := ...)"
    return read_only, reason, found.stored


# What the previous statement of the session left behind, which a new connection does not have.
_LAST_RESULT_CALLS = frozenset({"FOUND_ROWS", "ROW_COUNT", "LASTVAL"})
_LAST_RESULT_VARIABLES = ("warning_count", "error_count", "last_gtid")
_LAST_RESULT_WORDS = frozenset({"WARNINGS", "ERRORS", "DIAGNOSTICS", "PREVIOUS"})  # SHOW WARNINGS, GET DIAGNOSTICS, PREVIOUS VALUE FOR s


def reads_last_results(sql: str, dialect: Dialect, nbe: bool) -> bool:
    """Does the first statement of ``sql`` read what the session's previous statement left
    (FOUND_ROWS(), ROW_COUNT(), warnings and errors, a sequence's previous value)? On a new
    connection those belong to the proxy's restore statements: such a read cannot be answered
    truthfully. Later statements of a multi-statement text read what the earlier ones left, which
    they reproduce. Text the lexer rejects: True (cannot tell)."""
    try:
        tokens = iter_tokens(sql, dialect=dialect, no_backslash_escapes=nbe)
        previous = None
        for tok in tokens:
            kind = tok.kind
            if kind is TokenKind.PUNCT:
                if tok.text == ";":
                    return False
                if tok.text == "(" and previous in _LAST_RESULT_CALLS:
                    return True
                previous = None
                continue
            if kind is TokenKind.WORD:
                previous = tok.text.upper()
                if previous in _LAST_RESULT_WORDS:
                    return True
                continue
            if kind is TokenKind.QUOTED_IDENT:
                previous = tk.name(tok).upper()
                continue
            if kind is TokenKind.SYS_VAR:
                name = tok.text.lower().replace("`", "")
                if any(name.endswith(v) for v in _LAST_RESULT_VARIABLES):
                    return True
            previous = None
    except SqlParseError:
        return True
    return False
