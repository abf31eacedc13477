"""Where a DDL statement holds expressions, and where a name before ``(`` is no call.

DDL is not an expression: in ``CREATE TABLE t (id INT, UNIQUE KEY uk (id, name(10)))`` nothing
is called. Only parts the server evaluates can call a function: the query of ``CREATE TABLE ...
SELECT``, ``DEFAULT`` values, generated columns (``AS (expr)``), ``CHECK`` constraints,
functional key parts (``((expr))``), partitioning expressions and an event's schedule. (MariaDB
10.11, MySQL 8 and TiDB refuse stored functions in all but the query and the schedule: error
1901, measured; the proxy judges them anyway, so the answer does not depend on that.)

``structural_names`` walks CREATE TABLE, ALTER TABLE and CREATE INDEX and returns the token
indices of names that are *not* calls although ``(`` follows them: column types (``VARCHAR(10)``),
index and constraint names, key parts with a prefix length (``name(10)``), referenced tables,
partition names, and the clause words ``DEFAULT``, ``CHECK``, ``AUTO_RANDOM``, ``RANGE``, ``LIST``, ``HASH``,
``COLUMNS``, ``THAN``. Everything else stays judged: a form the walker does not know keeps
every ``name(`` a call, which errs toward refusing, never toward running code unseen.

``unrun_body`` tells where the part of CREATE VIEW / FUNCTION / PROCEDURE / TRIGGER / EVENT
that the server stores without running begins.
"""

from __future__ import annotations

import proxy.sqltext.tokens as tk
from proxy.sqltext.dialect import Dialect
from proxy.sqltext.lexer import NAME_KINDS, SqlParseError, Token, TokenKind

__all__ = ["structural_names", "unrun_body", "object_word", "sets_auto_increment"]

# What CREATE makes: the first of these words outside parentheses (CREATE OR REPLACE
# DEFINER = u SQL SECURITY INVOKER VIEW ...).
_OBJECTS = frozenset(
    """
    TABLE INDEX VIEW FUNCTION PROCEDURE TRIGGER EVENT PACKAGE DATABASE SCHEMA USER ROLE SERVER
    SEQUENCE TABLESPACE LOGFILE BINDING STATISTICS POLICY RESOURCE
    """.split()
)  # fmt: skip
# Objects whose body is stored, not run, by CREATE.
_STORED_BODIES = frozenset({"VIEW", "FUNCTION", "PROCEDURE", "TRIGGER", "PACKAGE"})

# Definitions in a table body that are not columns.
_INDEX_WORDS = frozenset({"PRIMARY", "UNIQUE", "KEY", "INDEX", "FULLTEXT", "SPATIAL", "FOREIGN"})
_INDEX_PREFIXES = frozenset({"VECTOR", "COLUMNAR"})  # TiDB: VECTOR INDEX, COLUMNAR INDEX
_CONSTRAINT_KINDS = frozenset({"PRIMARY", "UNIQUE", "FOREIGN", "CHECK", "KEY", "INDEX"})
# Column types of two words: DOUBLE PRECISION(10,2), NATIONAL CHAR(5), CHAR VARYING(5)...
_TYPE_HEADS = frozenset({"DOUBLE", "NATIONAL", "CHAR", "CHARACTER", "LONG", "NCHAR"})
_TYPE_TAILS = frozenset({"PRECISION", "CHAR", "CHARACTER", "VARCHAR", "VARYING", "VARBINARY", "VARCHARACTER"})
# Words followed by "(" in a partitioning clause.
_PARTITION_WORDS = frozenset({"RANGE", "LIST", "HASH", "COLUMNS", "THAN", "KEY", "LINEAR"})
_QUERY_WORDS = frozenset({"SELECT", "WITH", "VALUES", "TABLE"})
# Column attributes that take "(": DEFAULT (expr), CHECK (expr), TiDB's AUTO_RANDOM(5[, 64]).
_ATTRIBUTE_WORDS = frozenset({"DEFAULT", "CHECK", "AUTO_RANDOM"})


def object_word(tokens: list[Token]) -> int:
    """Index of the word saying what a CREATE statement creates, or -1."""
    parens = 0
    for i in range(len(tokens)):
        if tk.is_punct(tokens, i, "("):
            parens += 1
        elif tk.is_punct(tokens, i, ")"):
            parens -= 1
        elif parens == 0 and i and tk.word(tokens, i) in _OBJECTS:
            return i
    return -1


def unrun_body(tokens: list[Token], obj: int) -> int | None:
    """Where the stored, not run, part of a CREATE begins: a view's or routine's definition
    (everything after the object word: a routine's parameters and RETURNS type included), an
    event's action after ``DO``. None when CREATE runs all of its text (tables, indexes...)."""
    word = tk.word(tokens, obj)
    if word in _STORED_BODIES:
        return obj + 1
    if word == "EVENT":  # the schedule (AT / STARTS / ENDS expressions) is evaluated now
        parens = tk.matching_parens(tokens)
        i = obj + 1
        while i < len(tokens):
            if i in parens:
                i = parens[i] + 1
                continue
            if tk.word(tokens, i) == "DO":
                return i
            i += 1
    return None


def structural_names(tokens: list[Token], obj: int) -> frozenset[int]:
    """Names followed by ``(`` that are no call, in CREATE TABLE / CREATE INDEX (``obj``: the
    object word) or ALTER TABLE (``obj``: the TABLE word)."""
    walk = _Walk(tokens)
    verb = tk.word(tokens, 0)
    what = tk.word(tokens, obj)
    if verb == "CREATE" and what == "TABLE":
        walk.create_table(obj)
    elif verb == "CREATE" and what == "INDEX":
        walk.create_index(obj)
    elif verb == "ALTER" and what == "TABLE":
        walk.alter_table(obj)
    return frozenset(walk.names)


class _Walk:
    def __init__(self, tokens: list[Token]) -> None:
        self.t = tokens
        self.parens = tk.matching_parens(tokens)
        self.names: set[int] = set()

    # --- helpers -----------------------------------------------------------------------------

    def word(self, i: int) -> str | None:
        return tk.word(self.t, i)

    def opens(self, i: int) -> bool:
        return tk.is_punct(self.t, i, "(")

    def is_name(self, i: int) -> bool:
        return i < len(self.t) and self.t[i].kind in NAME_KINDS

    def mark_before_paren(self, i: int) -> None:
        """tokens[i] is a name, not a call, if "(" follows it."""
        if self.is_name(i) and self.opens(i + 1):
            self.names.add(i)

    def after_name(self, i: int) -> int:
        """Index after a possibly qualified name (``t``, ``db.t``) at i."""
        if self.is_name(i):
            i += 1
            if tk.is_punct(self.t, i, ".") and self.is_name(i + 1):
                i += 2
        return i

    def skip_words(self, i: int, *words: str) -> int:
        for w in words:
            if self.word(i) != w:
                return i
            i += 1
        return i

    def items(self, start: int, end: int) -> list[tuple[int, int]]:
        """(start, end) of the comma-separated items in tokens[start:end], at that depth."""
        out, i, first = [], start, start
        while i < end:
            if i in self.parens:
                i = self.parens[i] + 1
                continue
            if tk.is_punct(self.t, i, ","):
                out.append((first, i))
                first = i + 1
            i += 1
        out.append((first, end))
        return [(a, b) for a, b in out if a < b]

    def group_end(self, i: int) -> int:
        """Index of the ")" closing the "(" at i (the end of the tokens when unclosed)."""
        return self.parens.get(i, len(self.t))

    # --- CREATE TABLE ------------------------------------------------------------------------

    def create_table(self, obj: int) -> None:
        i = self.after_name(self.skip_words(obj + 1, "IF", "NOT", "EXISTS"))
        if self.opens(i) and not (self.word(i + 1) in _QUERY_WORDS or self.word(i + 1) == "LIKE" or self.opens(i + 1)):
            close = self.group_end(i)
            self.definitions(i + 1, close)
            i = close + 1
        self.partitioning(i, self.query_start(i))

    def query_start(self, i: int) -> int:
        """Where the query of CREATE TABLE ... [AS] SELECT begins (the end if none)."""
        while i < len(self.t):
            j = i
            while self.opens(j):  # ((SELECT ...))
                j += 1
            if self.word(j) in _QUERY_WORDS:
                return i
            i = self.parens[i] + 1 if i in self.parens else i + 1
        return i

    def definitions(self, start: int, end: int) -> None:
        for a, b in self.items(start, end):
            self.definition(a, b)

    def definition(self, a: int, b: int) -> None:
        word = self.word(a)
        if word == "CONSTRAINT":
            a += 1
            if self.word(a) not in _CONSTRAINT_KINDS:
                a += 1  # the constraint's name
            word = self.word(a)
        if word in _INDEX_WORDS or (word in _INDEX_PREFIXES and self.word(a + 1) in ("INDEX", "KEY")):
            self.index(a, b)
        elif word == "CHECK":
            self.mark_before_paren(a)
        elif word == "PERIOD" and self.word(a + 1) == "FOR":  # MariaDB: PERIOD FOR p (start, end)
            self.mark_before_paren(a + 2)
        elif word != "LIKE":
            self.column(a, b)

    def index(self, a: int, b: int) -> None:
        """``[UNIQUE] KEY name [USING t] (part, ...) [REFERENCES t (c, ...)] ...``: the word
        before the first "(" names the index (or is KEY, INDEX...); a key part is a column,
        ``col(len)``, or ``(expr)`` -- only that one is an expression."""
        i = a
        while i < b and not self.opens(i):
            i += 1
        if i == b:
            return
        self.mark_before_paren(i - 1)
        close = self.group_end(i)
        self.key_parts(i + 1, close)
        self.attributes(close + 1, b)

    def key_parts(self, start: int, end: int) -> None:
        for a, _b in self.items(start, end):
            self.mark_before_paren(a)  # col(10); a "(" here is a functional part, judged

    def column(self, a: int, b: int) -> None:
        """``name type[(len)] [attributes]``: the type is no call; DEFAULT and CHECK take an
        expression in parentheses; REFERENCES names a table."""
        t = a + 1
        if self.word(t) in _TYPE_HEADS and self.word(t + 1) in _TYPE_TAILS:
            t += 1
        if self.word(t) is not None:
            self.mark_before_paren(t)
        self.attributes(t + 1, b)

    def attributes(self, start: int, end: int) -> None:
        i = start
        while i < end:
            if i in self.parens:  # expressions inside are judged as they are
                i = self.parens[i] + 1
                continue
            word = self.word(i)
            if word in _ATTRIBUTE_WORDS:
                self.mark_before_paren(i)
            elif word == "REFERENCES":
                j = self.after_name(i + 1)
                self.mark_before_paren(j - 1)
                i = j
                continue
            i += 1

    def partitioning(self, start: int, end: int) -> None:
        """``PARTITION BY RANGE (expr) (PARTITION p0 VALUES LESS THAN (10), ...)`` and the like,
        from the first PARTITION word on: its clause words and partition names are no calls."""
        i = start
        while i < end and self.word(i) != "PARTITION":
            i = self.parens[i] + 1 if i in self.parens else i + 1
        for j in range(i, end):
            word = self.word(j)
            if word in _PARTITION_WORDS:
                self.mark_before_paren(j)
            elif word in ("PARTITION", "SUBPARTITION"):
                self.mark_before_paren(j + 1)

    # --- CREATE INDEX, ALTER TABLE -----------------------------------------------------------

    def create_index(self, obj: int) -> None:
        """``CREATE [UNIQUE] INDEX name [USING t] ON tbl (part, ...) ...``."""
        i = obj + 1
        while i < len(self.t) and self.word(i) != "ON":
            i += 1
        i = self.after_name(i + 1)
        if self.opens(i):
            self.key_parts(i + 1, self.group_end(i))

    def alter_table(self, obj: int) -> None:
        i = self.after_name(self.skip_words(obj + 1, "IF", "EXISTS"))
        for a, b in self.items(i, len(self.t)):
            self.alter_spec(a, b)

    def alter_spec(self, a: int, b: int) -> None:
        verb = self.word(a)
        if verb == "ADD":
            i = self.skip_words(a + 1, "COLUMN")
            i = self.skip_words(i, "IF", "NOT", "EXISTS")
            word = self.word(i)
            if self.opens(i):  # ADD [COLUMN] (a INT, b INT)
                self.mark_before_paren(i - 1)
                self.definitions(i + 1, self.group_end(i))
            elif word not in ("PARTITION", "SUBPARTITION"):
                self.definition(i, b)
        elif verb == "MODIFY":
            self.column(self.skip_words(self.skip_words(a + 1, "COLUMN"), "IF", "EXISTS"), b)
        elif verb == "CHANGE":
            self.column(self.skip_words(self.skip_words(a + 1, "COLUMN"), "IF", "EXISTS") + 1, b)
        elif verb == "ALTER":  # ALTER [COLUMN] c SET DEFAULT (expr)
            self.attributes(a + 1, b)
        # Partitioning follows the last spec without a comma (``ENGINE=InnoDB PARTITION BY
        # HASH (a)``) or is the spec itself (``REORGANIZE PARTITION p INTO (PARTITION ...)``).
        self.partitioning(a, b)


def sets_auto_increment(sql: str, dialect: Dialect, nbe: bool) -> bool:
    """``ALTER TABLE [db.]t AUTO_INCREMENT [=] <digits>``, nothing else."""
    try:
        tokens = tk.statement_tokens(sql, nbe, dialect)
    except (SqlParseError, RecursionError):
        return False
    words = [t.text.upper() if t.kind is TokenKind.WORD else None for t in tokens]
    if words[:2] != ["ALTER", "TABLE"] or len(tokens) < 5 or tokens[2].kind not in NAME_KINDS:
        return False
    i = 3
    if tokens[i].text == "." and i + 1 < len(tokens) and tokens[i + 1].kind in NAME_KINDS:
        i += 2
    if i >= len(tokens) or words[i] != "AUTO_INCREMENT":
        return False
    i += 1
    if i < len(tokens) and tokens[i].kind is TokenKind.PUNCT and tokens[i].text == "=":
        i += 1
    return i == len(tokens) - 1 and tokens[i].kind is TokenKind.NUMBER and tokens[i].text.isdigit()
