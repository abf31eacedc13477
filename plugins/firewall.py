"""firewall: allow or deny statements by class or pattern.

Options (``[plugins.firewall]``):

- ``deny = ["DROP", "TRUNCATE", "DELETE"]``: statement classes that are rejected.
- ``allow = ["SELECT", "INSERT", ...]``: when given, only statements of these classes pass.
- ``deny_patterns = ['(?i)\\bFROM\\s+`?mysql`?\\.']``: regular expressions (Python ``re``,
  matched case-insensitively with ``search`` anywhere in the statement text); a match rejects.

A statement class is one to four keywords: ``"DROP"`` matches every ``DROP ...``,
``"DROP DATABASE"`` only that, ``"LOAD DATA"`` ... Matching compares a class with the first
keywords of the statement, case-insensitively, after skipping whitespace and comments and
reading inside executable comments (``/*!50001 DROP */ TABLE t`` is a DROP), as
``proxy.protocol.sql.leading_keywords`` reads them. Deny wins over allow. A statement that does
not start with a keyword (``(SELECT 1)``) matches no class, so an allow list rejects it.

What is checked: the text of COM_QUERY and COM_STMT_PREPARE (a prepared statement cannot be
executed without being prepared through the firewall first). When the session allows
multi-statement queries, every statement of one is checked (statements are split as the
server reads them, with or without NO_BACKSLASH_ESCAPES as the session's status says), and
``PREPARE s FROM '<text>'`` is checked on its text too (``PREPARE s FROM @var`` cannot be seen
through: deny ``"PREPARE"`` to close that door). ``deny_patterns`` are searched through the
whole text, which costs time in proportion to the statement's size (Python's ``re`` scans
about 10 MB/s): prefer classes, and anchored or literal-led patterns.

A rejected statement gets ERR 1142 (SQLSTATE 42000), like the server's own privilege errors:
``DROP command denied to user 'app'@'10.0.0.7' by replay-proxy firewall (target orders)``. The
session and an open transaction stay as they were.
"""

from __future__ import annotations

import re
from typing import Annotated

import attrs

from proxy.hooks import CommandInfo, Reject, SessionInfo
from proxy.plugin_loader import Check, PluginContext
from proxy.protocol import sql

__all__ = ["Plugin", "statement_starts"]

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


def _next_statement_regex(no_backslash_escapes: bool) -> re.Pattern[str]:
    """From a statement start, consume code (literals, identifiers and comments whole) up to and
    including the next top-level ';'. Built from the sql module's lexer fragments."""
    code = "|".join(
        [
            r"[^'\"`#/;\-]++",
            sql.quoted_string("'", not no_backslash_escapes),
            sql.quoted_string('"', not no_backslash_escapes),
            sql.BACKTICK_IDENT,
            sql.HASH_COMMENT,
            sql.DASH_COMMENT,
            sql.BLOCK_COMMENT,
            sql.EXEC_COMMENT_OPEN,  # its content is code: a ';' in it separates statements
            r"[-/]",  # a lone '-' or '/' (comments were tried first)
        ]
    )
    return re.compile(rf"(?:{code})*+;")


_NEXT_STATEMENT = {False: _next_statement_regex(False), True: _next_statement_regex(True)}  # by NO_BACKSLASH_ESCAPES


def statement_starts(text: str, *, no_backslash_escapes: bool = False) -> list[int]:
    """Offsets where the statements of a multi-statement query start (``[0]`` for one)."""
    if ";" not in text:
        return [0]
    regex = _NEXT_STATEMENT[no_backslash_escapes]
    starts, pos = [0], 0
    while (m := regex.match(text, pos)) is not None:
        pos = m.end()
        starts.append(pos)
    return starts


def _keywords_at(text: str, start: int, end: int, n: int) -> tuple[str, ...]:
    """``leading_keywords`` of the statement ``text[start:end]``, reading a window of it first so
    that a huge statement is not copied: the window's answer is final unless the window holds
    nothing but keywords and comments (a giant comment before the keywords)."""
    if end - start <= _WINDOW:
        return sql.leading_keywords(text[start:end], n)
    window = text[start : start + _WINDOW]
    keywords = sql.leading_keywords(window, n)
    if len(keywords) < n and _ONLY_KEYWORDS.match(window):
        keywords = sql.leading_keywords(text[start:end], n)
    return keywords


_WINDOW = 4096
_ONLY_KEYWORDS = re.compile(
    rf"(?:{sql.WS}++|{sql.HASH_COMMENT}|{sql.DASH_COMMENT}|{sql.BLOCK_COMMENT}|{sql.EXEC_COMMENT_OPEN}|\*/|[0-9A-Za-z_$]++)*+"
    r"(?:/\*[\s\S]*+)?\Z"  # a comment cut by the window's end
)

_BLANK = re.compile(rf"(?:{sql.WS}++|{sql.HASH_COMMENT}|{sql.DASH_COMMENT}|{sql.BLOCK_COMMENT}|;)*+\Z")


def _is_blank(text: str, start: int, end: int) -> bool:
    """Nothing but whitespace, comments and ';' in ``text[start:end]`` (e.g. after the last ';')."""
    return _BLANK.match(text, start, end) is not None


def _prepared_text(text: str) -> str | None:
    """The statement of ``PREPARE name FROM '<text>'``, None for any other shape."""
    try:
        tokens = [t for t in sql.iter_tokens(text) if t.kind is not sql.TokenKind.PUNCT or t.text != ";"]
    except sql.SqlLexError:
        return None
    if len(tokens) == 4 and tokens[2].kind is sql.TokenKind.WORD and tokens[2].text.upper() == "FROM":
        literal = tokens[3]
        if literal.kind is sql.TokenKind.STRING:
            body = literal.text[2:-1] if literal.text[0] in "Nn" else literal.text[1:-1]
            quote = literal.text[-1]
            # Only escaped quotes matter to reading the statement's keywords and ';' separators.
            return body.replace(quote + quote, quote).replace("\\" + quote, quote)
    return None


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
        return self._judge_all(session, text)

    def _judge_all(self, session: SessionInfo, text: str) -> Reject | None:
        # Without multi-statements the server refuses "SELECT 1; DROP TABLE t" as a whole, so
        # only the first statement can run: no need to look for more.
        if not session.multi_statements:
            return self._judge(session, text, 0, len(text))
        starts = statement_starts(text, no_backslash_escapes=session.no_backslash_escapes)
        for start, end in zip(starts, [*starts[1:], len(text)]):
            verdict = self._judge(session, text, start, end)
            if verdict is not None:
                return verdict
        return None

    def _judge(self, session: SessionInfo, text: str, start: int, end: int) -> Reject | None:
        keywords = _keywords_at(text, start, end, self.depth)
        if not keywords and _is_blank(text, start, end):
            return None  # what follows a final ';'
        for n in range(1, len(keywords) + 1):
            denied = self.deny.get(keywords[:n])
            if denied is not None:
                return self._reject(session, denied, "deny")
        if self.allow is not None and not any(keywords[:n] in self.allow for n in range(1, len(keywords) + 1)):
            return self._reject(session, keywords[0] if keywords else "Statement", "not in allow")
        if keywords[:1] == ("PREPARE",):
            inner = _prepared_text(text[start:end])
            if inner is not None:
                return self._judge_all(session, inner)
        return None

    def _reject(self, session: SessionInfo, what: str, rule: str) -> Reject:
        self.log.warning("session %d: firewall rejected a %s statement of user %s (rule: %s)", session.id, what, session.user, rule)
        message = (
            f"{what} command denied to user '{session.user}'@'{session.client_host}' by replay-proxy firewall "
            f"(target {self.target}, rule: {rule})"
        )
        return Reject(1142, message, "42000")
