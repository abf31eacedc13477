"""firewall: allow or deny statements by class or pattern.

Options (``[plugins.firewall]``):

- ``deny = ["DROP", "TRUNCATE", "DELETE"]``: statement classes that are rejected.
- ``allow = ["SELECT", "INSERT", ...]``: when given, only statements of these classes pass.
- ``deny_patterns = ['(?i)\\bFROM\\s+`?mysql`?\\.']``: regular expressions (Python ``re``,
  matched case-insensitively with ``search`` anywhere in the statement text); a match rejects.

A statement class is one to four keywords: ``"DROP"`` matches every ``DROP ...``,
``"DROP DATABASE"`` only that, ``"LOAD DATA"`` ... Matching compares a class with the first
keywords of each statement, case-insensitively, as the connected server reads the text
(``proxy.sqltext``): comments skipped, executable comments read when they run on that server's
version and skipped when they do not (``/*!50001 DROP */ TABLE t`` is a DROP on MariaDB,
``/*!999999 SELECT */ DROP TABLE t`` is a DROP too). Deny wins over allow. A statement that does
not start with a keyword (``(SELECT 1)``) matches no class, so an allow list rejects it.

What is checked: the text of COM_QUERY and COM_STMT_PREPARE (a prepared statement cannot be
executed without being prepared through the firewall first), every statement of a
multi-statement query, and the text of ``PREPARE s FROM '<text>'`` and ``EXECUTE IMMEDIATE
'<text>'``. Text the proxy cannot judge (an executable comment whose fate it cannot tell, an
unterminated string, dynamic SQL from a variable: ``PREPARE s FROM @sql``) is rejected whenever
a rule is configured: what cannot be read cannot pass. ``deny_patterns`` are searched through
the whole text, which costs time in proportion to the statement's size (Python's ``re`` scans
about 10 MB/s): prefer classes, and anchored or literal-led patterns.

A rejected statement gets ERR 1142 (SQLSTATE 42000), like the server's own privilege errors:
``DROP command denied to user 'app'@'10.0.0.7' by replay-proxy firewall (target orders)``. The
session and an open transaction stay as they were.
"""

from __future__ import annotations

import re
from typing import Annotated

import attrs

from proxy import sqltext
from proxy.hooks import CommandInfo, Reject, SessionInfo
from proxy.plugin_loader import Check, PluginContext
from proxy.sqltext.tokens import unquote

__all__ = ["Plugin"]

# Words that can start a MySQL/MariaDB statement: a class must start with one, so a typo such
# as "DORP" is a config error instead of a rule that never matches.
STATEMENT_VERBS = frozenset(
    """ALTER ANALYZE BACKUP BEGIN BINLOG CACHE CALL CHANGE CHECK CHECKSUM COMMIT CREATE DEALLOCATE
    DELETE DESC DESCRIBE DO DROP EXECUTE EXPLAIN FLUSH GET GRANT HANDLER HELP IMPORT INSERT INSTALL
    KILL LOAD LOCK OPTIMIZE PREPARE PURGE RELEASE RENAME REPAIR REPLACE RESET RESIGNAL RESTART
    REVOKE ROLLBACK SAVEPOINT SELECT SET SHOW SHUTDOWN SIGNAL START STOP TABLE TRUNCATE UNINSTALL
    UNLOCK UPDATE USE VALUES WITH XA""".split()
)
_CLASS_SHAPE = re.compile(r"\s*[A-Za-z_]+(?:\s+[A-Za-z_]+){0,3}\s*")


def _is_class(text: str) -> bool:
    return bool(_CLASS_SHAPE.fullmatch(text)) and text.split()[0].upper() in STATEMENT_VERBS


StatementClass = Annotated[
    str, Check(_is_class, "expected a statement class: one to four keywords starting with a statement verb, like 'DROP' or 'DROP DATABASE'")
]


def _dynamic_text(text: str, session: SessionInfo) -> str | None:
    """The statement of ``PREPARE name FROM '<text>'`` / ``EXECUTE IMMEDIATE '<text>'``; None
    when it is not a string literal (a variable, an expression)."""
    try:
        tokens = sqltext.tokenize(text, dialect=session.dialect, no_backslash_escapes=session.no_backslash_escapes)
    except sqltext.SqlParseError:
        return None
    words = [t.text.upper() if t.kind is sqltext.TokenKind.WORD else None for t in tokens[:3]]
    if words[:2] == ["EXECUTE", "IMMEDIATE"]:
        rest = tokens[2:]
    elif words[:1] == ["PREPARE"] and words[2:3] == ["FROM"]:
        rest = tokens[3:]
    else:
        return None
    if rest and rest[-1].kind is sqltext.TokenKind.PUNCT and rest[-1].text == ";":
        rest = rest[:-1]
    if len(rest) != 1 or rest[0].kind is not sqltext.TokenKind.STRING:
        return None
    return unquote(rest[0].text, session.no_backslash_escapes)


class Plugin:
    @attrs.frozen
    class Options:
        deny: list[StatementClass] = attrs.Factory(list)
        allow: list[StatementClass] | None = None
        deny_patterns: list[re.Pattern[str]] = attrs.Factory(list)

    def __init__(self, options: Options, context: PluginContext) -> None:
        self.target = context.target
        self.log = context.log
        self.deny = {tuple(c.upper().split()): " ".join(c.upper().split()) for c in options.deny}
        self.allow = None if options.allow is None else {tuple(c.upper().split()) for c in options.allow}
        self.patterns = [re.compile(p.pattern, p.flags | re.IGNORECASE) for p in options.deny_patterns]
        classes = list(self.deny) + list(self.allow or ())
        self.depth = max((len(c) for c in classes), default=1)  # keywords to read per statement
        if not classes and not self.patterns:
            self.command_received = None  # nothing to check: stay off the hot path

    def command_received(self, session: SessionInfo, command: CommandInfo) -> Reject | None:
        text = command.sql
        if text is None:
            return None
        for i, pattern in enumerate(self.patterns):
            if pattern.search(text):
                first = command.keywords(1)
                return self._reject(session, first[0] if first else "Statement", f"deny_patterns[{i}]")
        return self._judge_all(session, command.analysis, lambda i, n: command.keywords(n, i))

    @property
    def _reading(self) -> int:
        return max(self.depth, 2)  # EXECUTE IMMEDIATE is two words

    def _judge_all(self, session: SessionInfo, analysis: sqltext.Analysis, keywords) -> Reject | None:
        if analysis.unknown is not None:
            return self._reject(session, "Statement", f"cannot be judged: {analysis.unknown}")
        for i, st in enumerate(analysis.statements):
            if st.kind is sqltext.Kind.EMPTY:
                continue
            verdict = self._judge(session, analysis, i, keywords(i, self._reading))
            if verdict is not None:
                return verdict
        return None

    def _judge(self, session: SessionInfo, analysis: sqltext.Analysis, i: int, read: tuple[str, ...]) -> Reject | None:
        keywords = read[: self.depth]
        for n in range(1, len(keywords) + 1):
            denied = self.deny.get(keywords[:n])
            if denied is not None:
                return self._reject(session, denied, "deny")
        if self.allow is not None and not any(keywords[:n] in self.allow for n in range(1, len(keywords) + 1)):
            return self._reject(session, keywords[0] if keywords else "Statement", "not in allow")
        if read[:1] == ("PREPARE",) or read[:2] == ("EXECUTE", "IMMEDIATE"):
            start, end = analysis.spans[i]
            inner = _dynamic_text(analysis.text[start:end], session)
            if inner is None:
                return self._reject(session, keywords[0], "dynamic SQL that is not a string literal cannot be judged")
            inner_analysis = sqltext.analyze(inner, dialect=session.dialect, no_backslash_escapes=session.no_backslash_escapes, multi=False)
            return self._judge_all(session, inner_analysis, lambda j, n: inner_analysis.keywords(j, n))
        return None

    def _reject(self, session: SessionInfo, what: str, rule: str) -> Reject:
        session.logger(self.log).warning(
            "firewall rejected a %s statement of user %s (rule: %s)", what, session.user, rule, extra={"outcome": "rejected", "code": 1142}
        )
        message = (
            f"{what} command denied to user '{session.user}'@'{session.client_host}' by replay-proxy firewall "
            f"(target {self.target}, rule: {rule})"
        )
        return Reject(1142, message, "42000")
