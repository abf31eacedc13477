"""SET statements: which variables a SET assigns, in which scope, and whether to a constant;
and the SET that restores them on a new connection."""

from __future__ import annotations

import enum
import re

import attrs

import proxy.sqltext.tokens as tk
from proxy.sqltext.dialect import UNKNOWN, Dialect
from proxy.sqltext.lexer import IDC, NAME_KINDS, SqlParseError, Token, TokenKind

__all__ = ["SetScope", "SetAssignment", "parse_set", "render_set", "is_set_not_assignment", "is_set_transaction"]


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


def is_set_not_assignment(kws: tuple[str, ...]) -> bool:
    """SET PASSWORD / ROLE / DEFAULT ROLE / RESOURCE GROUP: not variable assignments."""
    return kws[1:2] in (("PASSWORD",), ("ROLE",)) or kws[1:3] in (("DEFAULT", "ROLE"), ("RESOURCE", "GROUP"))


_ASSIGN = frozenset({"=", ":="})


def parse_set(sql: str, *, dialect: Dialect = UNKNOWN, no_backslash_escapes: bool = False) -> list[SetAssignment] | None:
    """Assignments of a SET statement in order; None if ``sql`` is not a variable-setting SET
    (not SET at all, or SET PASSWORD / ROLE / DEFAULT ROLE / RESOURCE GROUP).

    ``SET STATEMENT ... FOR ...`` (MariaDB) changes nothing in the session: returns [].
    Raises SqlParseError for a SET it cannot understand.
    """
    kws = tk.leading_keywords(sql, 3, dialect=dialect, nbe=no_backslash_escapes)
    if not kws or kws[0] != "SET":
        return None
    second = kws[1] if len(kws) > 1 else None
    if second == "STATEMENT":
        return []
    if is_set_not_assignment(kws):
        return None
    tokens = tk.statement_tokens(sql, no_backslash_escapes, dialect)
    if is_set_transaction(kws):
        return _parse_set_transaction(sql, tokens)
    result = []
    sticky = SetScope.SESSION  # a bare scope keyword applies to the following assignments too
    for item in tk.split_top_level(tokens[1:]):
        assignment, sticky = _parse_set_item(sql, item, sticky, no_backslash_escapes)
        result.append(assignment)
    return result


def is_set_transaction(kws: tuple[str, ...]) -> bool:
    """SET [GLOBAL|SESSION|LOCAL] TRANSACTION ..., from the first three keywords."""
    return kws[1:2] == ("TRANSACTION",) or (len(kws) > 2 and kws[1] in _SCOPE_WORDS and kws[2] == "TRANSACTION")


def _parse_set_item(sql: str, item: list[Token], sticky: SetScope, nbe: bool) -> tuple[SetAssignment, SetScope]:
    if not item:
        raise SqlParseError("empty assignment in SET")
    word = tk.word(item, 0)
    assigns_next = len(item) > 1 and item[1].text in _ASSIGN
    if word == "NAMES" and not assigns_next:
        return _parse_names(item, nbe), sticky
    if (word == "CHARSET" and not assigns_next) or (word == "CHARACTER" and tk.word(item, 1) == "SET"):
        rest = item[1:] if word == "CHARSET" else item[2:]
        if len(rest) != 1:
            raise SqlParseError("SET CHARACTER SET needs one charset name", item[0].start)
        return SetAssignment(SetScope.CHARSET, tk.name(rest[0], nbe).lower(), rest[0].text, True), sticky
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
    elif tok.kind in NAME_KINDS:
        scope, parts = sticky, [tk.name(tok)]
        i += 1
        while tk.is_punct(item, i, ".") and i + 1 < len(item) and item[i + 1].kind in NAME_KINDS:
            parts.append(tk.name(item[i + 1]))  # structured variables: default.key_buffer_size
            i += 2
        name = ".".join(parts).lower()
    else:
        raise SqlParseError(f"unexpected {tok.text!r} in SET", tok.start)
    if i >= len(item) or item[i].text not in _ASSIGN or i + 1 >= len(item):
        raise SqlParseError(f"expected '=' and a value after {name!r} in SET", tok.start)
    value = item[i + 1 :]
    value_sql = sql[value[0].start : value[-1].end].strip()
    return SetAssignment(scope, name, value_sql, tk.is_constant(value, bare_words=True)), sticky


def _sysvar_scope_and_name(text: str) -> tuple[SetScope, str]:
    """ "@@session.sql_mode" -> (SESSION, "sql_mode"); a bare @@x is the session value."""
    body = text[2:]
    parts = re.findall(rf"`[^`]*(?:``[^`]*)*`|{IDC}+", body)
    names = [p[1:-1].replace("``", "`") if p.startswith("`") else p for p in parts]
    if len(names) == 2 and names[0].lower() in _SYSVAR_PREFIXES:
        return _SYSVAR_PREFIXES[names[0].lower()], names[1].lower()
    return SetScope.SESSION, ".".join(names).lower()


def _user_var_name(text: str, nbe: bool) -> str:
    body = text[1:]
    if body[:1] in ("'", '"', "`"):
        body = tk.unquote(body, nbe)
    return body.lower()  # user variable names are case-insensitive


def _parse_names(item: list[Token], nbe: bool) -> SetAssignment:
    """NAMES cs [COLLATE coll] / NAMES DEFAULT."""
    if len(item) not in (2, 4) or (len(item) == 4 and tk.word(item, 2) != "COLLATE"):
        raise SqlParseError("expected SET NAMES charset [COLLATE collation]", item[0].start)
    charset = item[1]
    collation = tk.name(item[3], nbe).lower() if len(item) == 4 else None
    return SetAssignment(SetScope.NAMES, tk.name(charset, nbe).lower(), charset.text, True, collation)


_ISOLATION_LEVELS = {
    ("READ", "UNCOMMITTED"), ("READ", "COMMITTED"), ("REPEATABLE", "READ"), ("SERIALIZABLE",),
}  # fmt: skip


def _parse_set_transaction(sql: str, tokens: list[Token]) -> list[SetAssignment]:
    """[GLOBAL|SESSION|LOCAL] TRANSACTION ISOLATION LEVEL x | READ WRITE | READ ONLY [, ...]"""
    scope_word = tk.word(tokens, 1)
    if scope_word == "TRANSACTION":
        scope, i = SetScope.NEXT_TRANSACTION, 2
    else:
        scope = SetScope.GLOBAL if _SCOPE_WORDS.get(scope_word or "") is SetScope.GLOBAL else SetScope.TRANSACTION
        i = 3
    result = []
    for item in tk.split_top_level(tokens[i:]):
        words = tuple(tk.word(item, j) for j in range(len(item)))
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
