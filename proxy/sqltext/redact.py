"""Statement text fit for a log line: every literal replaced by ``?``."""

from __future__ import annotations

from proxy.sqltext.dialect import UNKNOWN, Dialect
from proxy.sqltext.lexer import SqlParseError, TokenKind, iter_tokens

__all__ = ["redact"]

_LITERALS = frozenset({TokenKind.STRING, TokenKind.NUMBER, TokenKind.HEX, TokenKind.BIT})
_VALUE_AFTER_INTRODUCER = frozenset({TokenKind.STRING, TokenKind.HEX, TokenKind.BIT})


def redact(text: str, dialect: Dialect = UNKNOWN, no_backslash_escapes: bool = False) -> str:
    """``text`` with every literal replaced by ``?`` (``_utf8mb4'x'`` too, introducer and all),
    lexed as the session's server reads it (NO_BACKSLASH_ESCAPES, executable comments). Text
    the lexer cannot read to the end (an unterminated string, e.g. cut by max_sql_length; an
    executable comment whose fate is unknown) ends in ``?`` from that point: nothing after it
    can leak."""
    out: list[str] = []
    introducer = -1  # index in out of a pending "_charset" word
    try:
        for tok in iter_tokens(text, dialect=dialect, no_backslash_escapes=no_backslash_escapes, trivia=True):
            kind = tok.kind
            if kind in _LITERALS:
                if introducer >= 0 and kind in _VALUE_AFTER_INTRODUCER:
                    del out[introducer:]  # "_utf8mb4 'x'" → "?"
                out.append("?")
                introducer = -1
            elif kind is TokenKind.WORD and tok.text[0] == "_":
                introducer = len(out)
                out.append(tok.text)
            else:
                if kind is not TokenKind.WHITESPACE:
                    introducer = -1
                out.append(tok.text)
    except SqlParseError:
        # The tokens before the unreadable one are already out; the rest is dropped.
        out.append("?")
    return "".join(out)
