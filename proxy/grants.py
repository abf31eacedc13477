"""What a server's SHOW GRANTS allows: enough to tell whether the proxy's user may keep the
commit-marker table (``replay-proxy check``). MySQL's and MariaDB's grant syntax: privileges on
``*.*``, ``db.*`` (with ``_`` and ``%`` wildcards) or ``db.table``, names quoted or not."""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["missing_marker_privileges", "grants_roles"]


_GRANT = re.compile(r"^GRANT\s+(?P<privs>.+?)\s+ON\s+(?P<object>.+?)\s+TO\s+", re.IGNORECASE | re.DOTALL)
_MARKER_PRIVILEGES = ("CREATE", "SELECT", "INSERT", "UPDATE", "DELETE")


def _split_privileges(text: str) -> list[str]:
    """'SELECT, INSERT (`a`, `b`), UPDATE' -> ['SELECT', 'INSERT (`a`, `b`)', 'UPDATE']."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    out.append(text[start:].strip())
    return [p for p in out if p]


_NAME = r"(?:`((?:[^`]|``)*)`|([^.`\s]+))"
_OBJECT = re.compile(rf"^{_NAME}(?:\s*\.\s*{_NAME})?$")


def _object_parts(text: str) -> tuple[str, str] | None:
    """'`db`.*' -> ('db', '*'); '*.*' -> ('*', '*'); 'db.t' -> ('db', 't'); None for what is
    not a table or a database (PROCEDURE x, a PROXY grant's user, a bare name)."""
    text = re.sub(r"(?i)^TABLE\s+", "", text.strip())
    if re.match(r"(?i)(PROCEDURE|FUNCTION|PACKAGE)\s", text):
        return None
    m = _OBJECT.match(text)
    if m is None or (m.group(3) is None and m.group(4) is None):
        return None
    db = m.group(1).replace("``", "`") if m.group(1) is not None else m.group(2)
    table = m.group(3).replace("``", "`") if m.group(3) is not None else m.group(4)
    return db, table


def _db_pattern_matches(pattern: str, name: str, fold: bool) -> bool:
    """A database-level grant's name is a LIKE pattern: '_' and '%' are wildcards unless escaped."""
    regex = ""
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            regex += re.escape(pattern[i + 1])
            i += 2
            continue
        regex += "." if ch == "_" else ".*" if ch == "%" else re.escape(ch)
        i += 1
    return re.fullmatch(regex, name, (re.IGNORECASE | re.DOTALL) if fold else re.DOTALL) is not None


def missing_marker_privileges(grants: Iterable[str], schema: str, table: str, fold_case: bool = False) -> list[str]:
    """The privileges of CREATE (on the database: CREATE DATABASE / TABLE IF NOT EXISTS check it
    before they look whether the object exists), SELECT, INSERT, UPDATE, DELETE (on the table)
    that ``grants`` (the lines of SHOW GRANTS, MariaDB's or TiDB's) do not give, in that order."""

    def same(a: str, b: str) -> bool:
        return a.lower() == b.lower() if fold_case else a == b

    have_db: set[str] = set()  # at the database level or global
    have_table: set[str] = set()
    for line in grants:
        m = _GRANT.match(line.strip())
        if m is None:
            continue  # a role grant (GRANT `r` TO u), SET DEFAULT ROLE ...
        where = _object_parts(m.group("object"))
        if where is None:
            continue
        db, tbl = where
        privileges = set()
        for p in _split_privileges(m.group("privs")):
            if "(" in p:
                continue  # column privileges: not the whole table
            p = " ".join(p.upper().split())
            if p in ("ALL", "ALL PRIVILEGES"):
                privileges.update(_MARKER_PRIVILEGES)
            elif p in _MARKER_PRIVILEGES:
                privileges.add(p)
        if db == "*" and tbl == "*":
            have_db |= privileges
        elif tbl == "*" and db and _db_pattern_matches(db, schema, fold_case):
            have_db |= privileges
        elif tbl != "*" and same(db, schema) and same(tbl, table):
            have_table |= privileges
    missing = []
    for p in _MARKER_PRIVILEGES:
        if p in have_db or (p != "CREATE" and p in have_table):
            continue
        missing.append(p)
    return missing


def grants_roles(grants: Iterable[str]) -> bool:
    """Does a line of SHOW GRANTS grant a role (``GRANT `r` TO ...``) rather than privileges?"""
    return any(line.strip().upper().startswith("GRANT ") and _GRANT.match(line.strip()) is None for line in grants)
