"""rewrite: ordered regex rewrite rules over statement text.

Options (``[plugins.rewrite]``):

- ``rules``: a list of ``{pattern = "...", replace = "...", unless = "...", tables = [...]}``.
  ``pattern`` is a Python regular expression searched in the statement text (use ``(?i)`` for
  case-insensitive matching, ``^`` to anchor at the start); ``replace`` is an ``re.sub``
  template (``\\1``, ``\\g<name>``); every occurrence is replaced. ``unless`` (optional): a
  regular expression; a statement where it matches is left alone by this rule. ``tables``
  (optional) limits the rule to INSERT / REPLACE / UPDATE / DELETE statements on these tables:
  ``"t"`` matches table t in any database, ``"db.t"`` only in db (an unqualified table is in the
  session's current database). Names compare exactly, as on a case-sensitive (Linux) server.
- ``mode = "first"`` (default): the first rule that applies rewrites the statement and the
  others are skipped. ``mode = "all"``: every rule is applied in order, each to the output of
  the previous one.
- ``max_statement_size`` (default ``"1MiB"``): longer statements pass unchanged. Python's
  regular expressions scan text at roughly 10 MB/s, and a search holds the proxy's event loop
  (every session) while it runs; the cap bounds that. Statements too large to be held in
  memory (over ``[limits] spool_threshold``) always pass unchanged.

Rules apply to COM_QUERY and COM_STMT_PREPARE. Patterns and replacement templates are checked
at start-up; an error names the rule (``$.plugins.rewrite.rules[1].pattern: invalid regular
expression ...``). Anchor patterns (``^``) where possible: an anchored pattern that does not
match costs next to nothing, whatever the statement's size.

Example: turn DM's ``INSERT INTO`` into ``REPLACE INTO`` for tables whose rows are safe to
overwrite, except ``INSERT ... ON DUPLICATE KEY UPDATE`` (see configs/three-plugins.toml); this
also makes those transactions idempotent for safe-mode replay.
"""

from __future__ import annotations

import re
from typing import Literal

import attrs

from proxy import sqltext as sql
from proxy.config import Size
from proxy.hooks import COM_QUERY, COM_STMT_PREPARE, CommandInfo, Rewrite, SessionInfo
from proxy.plugin_loader import PluginContext

__all__ = ["Plugin", "statement_table"]

_TEXT_COMMANDS = frozenset({COM_QUERY, COM_STMT_PREPARE})

# Group references in a template: \1, \g<1>, \g<name>. Any other escape (\\, \n) is consumed
# whole, so that an escaped backslash followed by a digit is not read as a reference.
_GROUP_REFERENCE = re.compile(r"\\(?:g<([^>]*)>|([1-9][0-9]?)|.)", re.DOTALL)


@attrs.frozen
class Rule:
    pattern: re.Pattern[str]
    replace: str
    unless: re.Pattern[str] | None = None
    tables: list[str] | None = None

    def __attrs_post_init__(self) -> None:
        # A bad group reference would otherwise surface as an error on the first matching statement.
        for name, number in _GROUP_REFERENCE.findall(self.replace):
            group = name or number
            if not group:
                continue
            if group.isdigit() and int(group) > self.pattern.groups:
                raise ValueError(f"replace refers to group {group} but the pattern has {self.pattern.groups}")
            if not group.isdigit() and group not in self.pattern.groupindex:
                raise ValueError(f"replace refers to group {group!r}, which the pattern does not define")
        if self.tables is not None:
            for table in self.tables:
                if not table or table.count(".") > 1 or "" in table.split("."):
                    raise ValueError(f"tables: expected 'table' or 'db.table', got {table!r}")


# Words between the verb and the table name.
_MODIFIERS = {
    "INSERT": {"LOW_PRIORITY", "DELAYED", "HIGH_PRIORITY", "IGNORE", "INTO"},
    "REPLACE": {"LOW_PRIORITY", "DELAYED", "INTO"},
    "UPDATE": {"LOW_PRIORITY", "IGNORE"},
    "DELETE": {"LOW_PRIORITY", "QUICK", "IGNORE", "FROM"},
}
_NAMES = (sql.TokenKind.WORD, sql.TokenKind.QUOTED_IDENT)


def _unquote(token: sql.Token) -> str:
    return token.text[1:-1].replace("``", "`") if token.kind is sql.TokenKind.QUOTED_IDENT else token.text


_NAME = r"(`[^`]*+(?:``[^`]*+)*+`|[0-9A-Za-z_$\x80-\U0010ffff]++)"
# The common shape, as DM writes it: no comments in the head. Anything else goes through tokens.
_PLAIN_HEAD = re.compile(
    rf"[ \t\r\n]*+(?i:INSERT|REPLACE|UPDATE|DELETE)(?:[ \t\r\n]++(?i:LOW_PRIORITY|DELAYED|HIGH_PRIORITY|IGNORE|QUICK))*+"
    rf"[ \t\r\n]++(?:(?i:INTO|FROM)[ \t\r\n]++)?{_NAME}(?:[ \t\r\n]*+\.[ \t\r\n]*+{_NAME})?(?=[ \t\r\n(,;]|\Z)"
)


def statement_table(text: str, dialect: sql.Dialect = sql.UNKNOWN, nbe: bool = False) -> tuple[str | None, str] | None:
    """(database or None, table) written to by an INSERT / REPLACE / UPDATE / DELETE statement
    (its first table), None for other statements. Reads only the statement's head."""
    m = _PLAIN_HEAD.match(text)
    if m is not None:
        first, second = m.groups()
        if first.upper() not in ("INTO", "FROM"):
            first = first[1:-1].replace("``", "`") if first[0] == "`" else first
            if second is None:
                return None, first
            return first, second[1:-1].replace("``", "`") if second[0] == "`" else second
    try:
        tokens = sql.iter_tokens(text, dialect=dialect, no_backslash_escapes=nbe)  # lazy: a 50 MB INSERT is not tokenized past its head
        verb = next(tokens, None)
        if verb is None or verb.kind is not sql.TokenKind.WORD:
            return None
        modifiers = _MODIFIERS.get(verb.text.upper())
        if modifiers is None:
            return None
        tok = next(tokens, None)
        while tok is not None and tok.kind is sql.TokenKind.WORD and tok.text.upper() in modifiers:
            tok = next(tokens, None)
        if tok is None or tok.kind not in _NAMES:
            return None
        first = _unquote(tok)
        dot = next(tokens, None)
        if dot is not None and dot.kind is sql.TokenKind.PUNCT and dot.text == ".":
            second = next(tokens, None)
            if second is None or second.kind not in _NAMES:
                return None
            return first, _unquote(second)
        return None, first
    except sql.SqlParseError:
        return None


class Plugin:
    @attrs.frozen
    class Options:
        rules: list[Rule] = attrs.Factory(list)
        mode: Literal["first", "all"] = "first"
        max_statement_size: Size = Size(1024 * 1024)

    def __init__(self, options: Options, context: PluginContext) -> None:
        self.first_only = options.mode == "first"
        self.max_size = options.max_statement_size
        self.log = context.log
        self.too_large = 0  # statements passed unchanged because of their size
        # Per rule: pattern, template, unless, and the tables as {table: databases or None (any)}.
        self.rules: list[tuple[re.Pattern[str], str, re.Pattern[str] | None, dict[str, set[str] | None] | None]] = []
        for rule in options.rules:
            tables = None
            if rule.tables is not None:
                tables = {}
                for entry in rule.tables:
                    db, _, table = entry.rpartition(".")
                    if not db:
                        tables[table] = None
                    elif tables.get(table, set()) is not None:
                        tables.setdefault(table, set()).add(db)  # type: ignore[union-attr]
            self.rules.append((rule.pattern, rule.replace, rule.unless, tables))
        if not self.rules:
            self.command_received = None  # nothing to do: stay off the hot path

    def command_received(self, session: SessionInfo, command: CommandInfo) -> Rewrite | None:
        if command.code not in _TEXT_COMMANDS:
            return None
        if len(command.payload) > self.max_size or not command.complete:
            self._pass_large(session, command)
            return None
        text = command.sql
        changed = False
        target: tuple[str | None, str] | None | bool = False  # False: not looked up yet
        for pattern, template, unless, tables in self.rules:
            if pattern.search(text) is None:
                continue  # most statements stop here: an anchored pattern fails at once
            if tables is not None:
                if target is False:
                    target = statement_table(text, command.dialect, command.no_backslash_escapes)
                if not _listed(target, tables, session.database):
                    continue
            if unless is not None and unless.search(text) is not None:  # last: it may scan it all
                continue
            text, changed = pattern.sub(template, text), True
            if self.first_only:
                break
            target = False  # the statement changed: look its table up again if needed
        return command.rewrite(text) if changed else None

    def _pass_large(self, session: SessionInfo, command: CommandInfo) -> None:
        self.too_large += 1
        if self.too_large == 1 or self.too_large % 1000 == 0:  # a line now and then, not per statement
            session.logger(self.log).warning(
                "%s over max_statement_size (%d bytes) passed without rewrite rules (%d so far)",
                command.name,
                self.max_size,
                self.too_large,
            )


def _listed(target, tables: dict[str, set[str] | None], current_db: str | None) -> bool:
    if not target:
        return False
    db, table = target
    if table not in tables:
        return False
    databases = tables[table]
    return databases is None or (db if db is not None else current_db) in databases
