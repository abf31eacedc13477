"""Hot-path statement triage on raw COM_QUERY bytes.

Most statements a replicator sends (INSERT / REPLACE / UPDATE / DELETE / SELECT) need no
decision from the proxy beyond "pass it on". This module finds the first keyword with one regex
over the first bytes and says whether the statement deserves a closer look (full
classification in proxy.protocol.sql) because it may change the transaction or session state.
"""

from __future__ import annotations

import re

__all__ = ["first_keyword", "TX_CONTROL", "SESSION_CHANGE", "IMPLICIT_COMMIT", "may_pin_session"]

# Leading whitespace and comments (not /*! executable comments), then an optional "/*!NNNNN",
# then the first word.
_FIRST_WORD = re.compile(
    rb"(?:\s+|/\*(?![!M]).*?\*/|(?:--[ \t\r\n]|#)[^\n]*(?:\n|$))*(?:/\*M?!\d*\s*)?([A-Za-z_]+)",
    re.S,
)

TX_CONTROL = frozenset({b"BEGIN", b"START", b"COMMIT", b"ROLLBACK", b"XA", b"SAVEPOINT", b"RELEASE"})
SESSION_CHANGE = frozenset({b"SET", b"USE"})
# Statements that commit an open transaction before they run (MySQL/MariaDB "implicit commit").
IMPLICIT_COMMIT = frozenset(
    {
        b"CREATE", b"ALTER", b"DROP", b"RENAME", b"TRUNCATE", b"GRANT", b"REVOKE", b"LOCK", b"UNLOCK",
        b"ANALYZE", b"OPTIMIZE", b"REPAIR", b"FLUSH", b"INSTALL", b"UNINSTALL", b"CACHE",
    }
)
# Statements that may hold server-side state a new connection cannot get back.
_PIN_CANDIDATES = frozenset({b"SELECT", b"DO", b"SET", b"CREATE", b"LOCK", b"PREPARE", b"HANDLER", b"VALUES"})
_PINNING = re.compile(
    rb"\bGET_LOCK\s*\(|\bCREATE\s+(?:OR\s+REPLACE\s+)?TEMPORARY\s+TABLE\b|\bLOCK\s+TABLES?\b|:=|\bINTO\s+@|^\s*PREPARE\b|^\s*HANDLER\b",
    re.I,
)


def first_keyword(sql: bytes, start: int = 0) -> bytes:
    """Upper-cased first keyword of the statement at ``sql[start:]`` (b"" when there is none).
    ``start`` lets callers skip the command byte without copying the payload."""
    m = _FIRST_WORD.match(sql, start, start + 4096)
    return m.group(1).upper() if m else b""


# Bytes any pinning statement of a SELECT / DO / SET / VALUES must contain: a user variable
# (@x := / INTO @x) or a named-lock call. One C-level scan, before the slower regex.
_SELECT_HINT = re.compile(rb"@|_[Ll][Oo][Cc][Kk]")
_HINTED = frozenset({b"SELECT", b"DO", b"SET", b"VALUES"})


def may_pin_session(keyword: bytes, sql: bytes) -> bool:
    """Cheap pre-check before the full classifier: could this statement make the session
    impossible to restore (temporary table, named lock, table lock, user variable from a query,
    SQL-level PREPARE, HANDLER)?"""
    if keyword not in _PIN_CANDIDATES:
        return False
    if keyword in _HINTED and _SELECT_HINT.search(sql) is None:
        return False
    return _PINNING.search(sql) is not None
