"""What statements do to the transaction, the session and the data.

``analyze`` judges a whole COM_QUERY text the way the connected server will run it: every
statement of a multi-statement, every comment form (``Dialect``), quoting with and without
NO_BACKSLASH_ESCAPES. What it cannot decide is *unknown*: ``Statement.unknown`` /
``Analysis.unknown`` say why, and the proxy never replays, resends or lets through a firewall
rule what is unknown.

The judgement is conservative in one direction only: a statement is ``read_only`` when it is
proven to change nothing (no call of anything but a side-effect-free built-in, no INTO, no
locking read), ``session_only`` when it is proven to change only this session; everything else
may write. Stored routines (CALL, EXECUTE, EXECUTE IMMEDIATE, compound statements) run
statements the proxy never sees: they may write and may commit (``runs_code``).
"""

from __future__ import annotations

import enum
import functools
import re

import attrs

from proxy.sqltext import tokens as tk
from proxy.sqltext.dialect import UNKNOWN, Dialect
from proxy.sqltext.functions import BUILTIN_EFFECTS, PAREN_KEYWORDS, PURE_FUNCTIONS
from proxy.sqltext.lexer import NAME_KINDS, WS, SqlParseError, Token, TokenKind, split_statements
from proxy.sqltext.setstmt import SetScope, is_set_not_assignment, is_set_transaction, parse_set

__all__ = ["Kind", "Statement", "Analysis", "analyze", "classify", "TRANSACTION_KINDS"]


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


TRANSACTION_KINDS = frozenset({Kind.BEGIN, Kind.COMMIT, Kind.ROLLBACK, Kind.SAVEPOINT,
                               Kind.ROLLBACK_TO_SAVEPOINT, Kind.RELEASE_SAVEPOINT})  # fmt: skip


@attrs.frozen
class Statement:
    """What one statement does.

    ``implicit_commit``: the server commits an open transaction before running it (DDL, LOCK
    TABLES, BEGIN itself, SET autocommit=1, ...) -- whether the statement then succeeds or not.
    ``read_only``: proven to change nothing. ``session_only``: proven to change only this
    session (SET, USE, ...). ``runs_code``: runs the user's code the proxy does not see (CALL,
    EXECUTE, a stored function): it may write tables that do not roll back, change the
    session, and (procedures) commit. ``xa``: the XA verb (START, END, PREPARE, COMMIT,
    ROLLBACK, RECOVER). ``unknown``: why the proxy cannot judge it.
    ``session_unrestorable``: why a session that ran it cannot be rebuilt on a new connection.
    ``needs_capture``: a session variable was set from an expression; read its value back to
    restore it. ``autocommit``: the value a SET gives autocommit (None if untouched/unknown).
    ``target``: savepoint name, database of USE, or SQL prepared statement name.
    """

    kind: Kind
    implicit_commit: bool = False
    read_only: bool = False
    session_only: bool = False
    runs_code: bool = False
    begin_read_only: bool = False
    consistent_snapshot: bool = False
    chain: bool = False
    release: bool = False
    xa: str | None = None
    session_unrestorable: str | None = None
    needs_capture: bool = False
    autocommit: bool | None = None
    target: str | None = None
    unknown: str | None = None

    @property
    def writes(self) -> bool:
        """May it change data (anything beyond this session)?"""
        return not (self.read_only or self.session_only or self.kind in TRANSACTION_KINDS)

    @property
    def may_end_transaction(self) -> bool:
        """Might an open transaction be over (committed or rolled back) once it ran?"""
        return (
            self.implicit_commit or self.runs_code or self.unknown is not None or self.xa is not None
            or self.kind in (Kind.COMMIT, Kind.ROLLBACK)
        )  # fmt: skip

    @property
    def may_commit(self) -> bool:
        """Might it commit something (an open transaction, or itself in autocommit)?"""
        return self.may_end_transaction and self.kind is not Kind.ROLLBACK


@attrs.frozen
class Analysis:
    """A whole COM_QUERY (or prepared) text: its statements in the order the server runs them."""

    text: str
    statements: tuple[Statement, ...]
    spans: tuple[tuple[int, int], ...]  # (start, end) of each statement in ``text``
    unknown: str | None = None  # why the text as a whole cannot be judged
    dialect: Dialect = UNKNOWN
    nbe: bool = False

    @property
    def first(self) -> Statement:
        return self.statements[0]

    @property
    def single(self) -> bool:
        return len(self.statements) == 1

    def keywords(self, i: int = 0, n: int = 2) -> tuple[str, ...]:
        """The first ``n`` keywords of statement ``i`` (() when the text is unknown)."""
        if self.unknown is not None and i >= len(self.spans):
            return ()
        start, end = self.spans[i]
        try:
            return tk.leading_keywords(self.text[start:end], n, dialect=self.dialect, nbe=self.nbe)
        except SqlParseError:
            return ()

    @property
    def writes(self) -> bool:
        return self.unknown is not None or any(s.writes for s in self.statements)

    @property
    def read_only(self) -> bool:
        return self.unknown is None and all(s.read_only for s in self.statements)

    @property
    def session_only(self) -> bool:
        return self.unknown is None and all(s.session_only or s.read_only for s in self.statements) and not self.read_only

    @property
    def may_end_transaction(self) -> bool:
        return self.unknown is not None or any(s.may_end_transaction for s in self.statements)

    @property
    def may_commit(self) -> bool:
        return self.unknown is not None or any(s.may_commit for s in self.statements)


_CACHE_MAX_LEN = 256  # texts up to this length are cached (transaction control, SET, USE)


def analyze(sql: str, *, dialect: Dialect = UNKNOWN, no_backslash_escapes: bool = False, multi: bool = True) -> Analysis:
    """Judge a whole text. ``multi``: the session may run several statements per COM_QUERY
    (CLIENT_MULTI_STATEMENTS); without it, a second statement makes the server reject the
    text, and the proxy calls it unknown rather than guess which part ran."""
    if len(sql) <= _CACHE_MAX_LEN:
        return _analyze_cached(sql, dialect, no_backslash_escapes, multi)
    return _analyze(sql, dialect, no_backslash_escapes, multi)


@functools.lru_cache(maxsize=4096)
def _analyze_cached(sql: str, dialect: Dialect, nbe: bool, multi: bool) -> Analysis:
    return _analyze(sql, dialect, nbe, multi)


def _analyze(sql: str, dialect: Dialect, nbe: bool, multi: bool) -> Analysis:
    whole = ((0, len(sql)),)
    try:
        spans = tuple(split_statements(sql, dialect=dialect, no_backslash_escapes=nbe))
    except SqlParseError as exc:
        reason = f"text not understood: {exc}"
        return Analysis(sql, (Statement(Kind.OTHER, unknown=reason),), whole, reason, dialect, nbe)
    if not spans:
        return Analysis(sql, (_PLAIN[Kind.EMPTY],), whole, None, dialect, nbe)
    statements = tuple(classify(sql[a:b], dialect=dialect, no_backslash_escapes=nbe) for a, b in spans)
    unknown = next((s.unknown for s in statements if s.unknown is not None), None)
    if len(spans) > 1 and not multi:
        unknown = "several statements without CLIENT_MULTI_STATEMENTS"
    return Analysis(sql, statements, spans, unknown, dialect, nbe)


def classify(sql: str, *, dialect: Dialect = UNKNOWN, no_backslash_escapes: bool = False) -> Statement:
    """Classify one statement (the text of one ``Analysis`` span). Never raises: text it cannot
    judge is a Statement with ``unknown`` set."""
    nbe = no_backslash_escapes
    try:
        kws = tk.leading_keywords(sql, 2, dialect=dialect, nbe=nbe)
        if not kws:
            return _classify_no_keyword(sql, nbe, dialect)
        handler = _HANDLERS.get(kws[0])
        if handler is None:
            return Statement(Kind.OTHER, unknown=f"{kws[0]} statements are not known to the proxy")
        return handler(sql, kws, _Reading(nbe, dialect))
    except SqlParseError as exc:
        return Statement(Kind.OTHER, unknown=f"statement not understood: {exc}")


@attrs.frozen
class _Reading:
    """How to lex: NO_BACKSLASH_ESCAPES and the server's dialect."""

    nbe: bool
    dialect: Dialect

    def tokens(self, sql: str, start: int = 0) -> list[Token]:
        return tk.statement_tokens(sql, self.nbe, self.dialect, start)

    def keywords(self, sql: str, n: int) -> tuple[str, ...]:
        return tk.leading_keywords(sql, n, dialect=self.dialect, nbe=self.nbe)

    def after_keywords(self, sql: str, n: int) -> int:
        return tk.after_keywords(sql, n, dialect=self.dialect, nbe=self.nbe)


_PLAIN = {kind: Statement(kind) for kind in Kind}
_PLAIN[Kind.EMPTY] = Statement(Kind.EMPTY, read_only=True)
_DDL_COMMIT = Statement(Kind.DDL, implicit_commit=True)
_OTHER_COMMIT = Statement(Kind.OTHER, implicit_commit=True)
_GET_LOCK_REASON = "GET_LOCK() holds a named lock that belongs to the session"
_OPEN_PAREN = re.compile(rf"(?:{WS})*\(")


def _classify_no_keyword(sql: str, nbe: bool, dialect: Dialect) -> Statement:
    tokens = tk.statement_tokens(sql, nbe, dialect)
    if not tokens:
        return _PLAIN[Kind.EMPTY]
    if tk.is_punct(tokens, 0, "("):  # (SELECT ...) UNION (SELECT ...)
        return _classify_query(tokens)
    return Statement(Kind.OTHER, unknown=f"a statement starting with {tokens[0].text[:20]!r} is not known to the proxy")


# --- Queries and expressions -------------------------------------------------------------------


@attrs.frozen
class _Calls:
    """What a statement calls: the first call of anything but a side-effect-free built-in,
    whether that includes a stored function (user code), whether GET_LOCK()."""

    first: str | None = None
    stored: bool = False
    get_lock: bool = False


# A name after these words, followed by "(", is a table with its column list, not a call.
_BEFORE_TABLE = frozenset({"INTO", "TABLE", "INSERT", "REPLACE", "LOW_PRIORITY", "DELAYED", "HIGH_PRIORITY", "IGNORE",
                           "EXISTS", "ON"})  # CREATE TABLE IF NOT EXISTS t (..), CREATE INDEX i ON t (..)


def _names_a_table(tokens: list[Token], i: int) -> bool:
    """tokens[i], followed by "(", names a table (``INTO t (a, b)``, ``INTO db.t (a)``) or a CTE
    with its columns (``WITH c (a) AS (...)``, ``, c (a) AS``)."""
    j = i - 2 if tk.is_punct(tokens, i - 1, ".") else i  # db.t: look before db
    if tk.word(tokens, j - 1) in _BEFORE_TABLE or tk.word(tokens, j - 1) in ("WITH", "RECURSIVE"):
        return True
    close = tk.closing_paren(tokens, i + 1)
    return close > 0 and tk.word(tokens, close + 1) == "AS" and tk.is_punct(tokens, close + 2, "(")


def _calls(tokens: list[Token]) -> _Calls:
    first, stored, get_lock = None, False, False
    for i, tok in enumerate(tokens):
        if not tk.is_punct(tokens, i + 1, "(") or tok.kind not in NAME_KINDS or _names_a_table(tokens, i):
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
    return _Calls(first, stored, get_lock)


def _effects(tokens: list[Token]) -> tuple[bool, str | None, bool]:
    """(read_only, session_unrestorable, runs_code) of the expressions of a query: it reads
    unless it calls something that may write, takes locks, writes into variables or files, or
    moves a sequence; it runs code when it calls a stored function."""
    calls = _calls(tokens)
    read_only = calls.first is None
    reason = _GET_LOCK_REASON if calls.get_lock else None
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
        elif kind is TokenKind.PUNCT and tok.text == ":=" and i and tokens[i - 1].kind is TokenKind.USER_VAR:
            read_only = False
            if reason is None:
                reason = "a user variable is assigned inside a query (@v := ...)"
    return read_only, reason, calls.stored


def _classify_query(tokens: list[Token]) -> Statement:
    """SELECT, WITH ..., TABLE t, VALUES ROW(...), (SELECT ...)."""
    if tk.word(tokens, 0) == "WITH":
        verb = _main_verb_after_with(tokens)
        if verb in ("UPDATE", "DELETE", "INSERT", "REPLACE"):
            return _dml(Kind[verb], tokens)
    read_only, reason, stored = _effects(tokens)
    if read_only and reason is None:
        return _READ_ONLY_SELECT
    return Statement(Kind.SELECT, read_only=read_only, session_unrestorable=reason, runs_code=stored)


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


def _dml(kind: Kind, tokens: list[Token]) -> Statement:
    _read_only, reason, stored = _effects(tokens)
    return _PLAIN[kind] if reason is None and not stored else Statement(kind, session_unrestorable=reason, runs_code=stored)


def _classify_dml(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    return _dml(Kind[kws[0]], r.tokens(sql))


def _classify_select(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    return _classify_query(r.tokens(sql))


def _classify_do(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    read_only, reason, stored = _effects(r.tokens(sql))
    return Statement(Kind.DO, read_only=read_only, session_unrestorable=reason, runs_code=stored)


def _classify_call(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    r.tokens(sql)  # lexes (an unterminated text is unknown)
    return Statement(Kind.CALL, runs_code=True)


def _classify_load(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    if kws[1:] in (("DATA",), ("XML",)):
        return _PLAIN[Kind.LOAD_DATA]
    if kws[1:] == ("INDEX",):
        return _OTHER_COMMIT
    return Statement(Kind.OTHER, unknown=f"LOAD {' '.join(kws[1:])} is not known to the proxy")


def _classify_explain(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    """EXPLAIN/DESCRIBE/DESC only describe, unless ANALYZE: that runs the statement."""
    if kws[1:] == ("ANALYZE",):
        inner = classify(sql[r.after_keywords(sql, 2) :], dialect=r.dialect, no_backslash_escapes=r.nbe)
        return attrs.evolve(inner, kind=Kind.SHOW) if inner.read_only else inner
    read_only, reason, stored = _effects(r.tokens(sql))
    return _READ_ONLY_SHOW if read_only else Statement(Kind.SHOW, session_unrestorable=reason, runs_code=stored)


_READ_ONLY_SHOW = Statement(Kind.SHOW, read_only=True)


def _classify_show(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    read_only, reason, stored = _effects(r.tokens(sql))  # SHOW ... WHERE f(x) calls f
    return _READ_ONLY_SHOW if read_only else Statement(Kind.SHOW, session_unrestorable=reason, runs_code=stored)


def _classify_use(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    tokens = r.tokens(sql)
    if len(tokens) != 2 or tokens[1].kind not in NAME_KINDS:
        return Statement(Kind.OTHER, unknown="USE without one database name")
    return Statement(Kind.USE, session_only=True, target=tk.name(tokens[1]))


def _classify_help(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    return _READ_ONLY_OTHER


_READ_ONLY_OTHER = Statement(Kind.OTHER, read_only=True)


# --- Transaction control -------------------------------------------------------------------------


# START TRANSACTION characteristics; TiDB adds BEGIN PESSIMISTIC / OPTIMISTIC.
def _classify_begin(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    tokens = r.tokens(sql)
    words = [tk.word(tokens, i) for i in range(len(tokens))]
    if words[0] == "BEGIN":
        if words[1:] in ([], ["WORK"], ["PESSIMISTIC"], ["OPTIMISTIC"]):
            return _BEGIN
        if words[1:3] == ["NOT", "ATOMIC"] or (len(words) > 1 and words[1] is None and tokens[1].text == ":"):
            return Statement(Kind.OTHER, runs_code=True)  # MariaDB compound statement
        return Statement(Kind.OTHER, unknown="BEGIN followed by something the proxy does not know")
    if words[1:2] != ["TRANSACTION"]:
        if words[1:2] in (["SLAVE"], ["REPLICA"], ["ALL"], ["GROUP_REPLICATION"]):
            return _OTHER_COMMIT
        return Statement(Kind.OTHER, unknown=f"START {(words[1:2] or [None])[0] or ''} is not known to the proxy")
    read_only = snapshot = False
    for item in tk.split_top_level(tokens[2:]):
        item_words = [tk.word(item, i) for i in range(len(item))]
        if item_words == ["WITH", "CONSISTENT", "SNAPSHOT"]:
            snapshot = True
        elif item_words == ["READ", "WRITE"]:
            read_only = False
        elif item_words[:2] == ["READ", "ONLY"]:
            read_only = True  # TiDB: READ ONLY AS OF TIMESTAMP ...
            if len(item) > 2 and item_words[2:4] != ["AS", "OF"]:
                return Statement(Kind.OTHER, unknown="START TRANSACTION READ ONLY followed by something unknown")
        elif item:
            return Statement(Kind.OTHER, unknown="START TRANSACTION with an unknown characteristic")
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


def _classify_commit(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    """COMMIT|ROLLBACK [WORK] [AND [NO] CHAIN] [[NO] RELEASE]; ROLLBACK [WORK] TO [SAVEPOINT] x."""
    tokens = r.tokens(sql)
    kind = Kind[kws[0]]
    i = 2 if tk.word(tokens, 1) == "WORK" else 1
    if kind is Kind.ROLLBACK and tk.word(tokens, i) == "TO":
        i += 2 if tk.word(tokens, i + 1) == "SAVEPOINT" else 1
        return _savepoint_statement(Kind.ROLLBACK_TO_SAVEPOINT, tokens, i)
    options = _completion_options([tk.word(tokens, j) for j in range(i, len(tokens))])
    if options is None:
        return Statement(Kind.OTHER, unknown=f"{kws[0]} followed by something the proxy does not know")
    chain, release = options
    return Statement(kind, chain=chain, release=release) if chain or release else _PLAIN[kind]


def _savepoint_statement(kind: Kind, tokens: list[Token], i: int) -> Statement:
    if i != len(tokens) - 1 or tokens[i].kind not in NAME_KINDS:
        return Statement(Kind.OTHER, unknown=f"{kind.value} without one savepoint name")
    return Statement(kind, target=tk.name(tokens[i]))


def _classify_savepoint(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    return _savepoint_statement(Kind.SAVEPOINT, r.tokens(sql), 1)


def _classify_release(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    if kws[1:] != ("SAVEPOINT",):
        return Statement(Kind.OTHER, unknown="RELEASE without SAVEPOINT")
    return _savepoint_statement(Kind.RELEASE_SAVEPOINT, r.tokens(sql), 2)


_XA_VERBS = frozenset({"START", "BEGIN", "END", "PREPARE", "COMMIT", "ROLLBACK", "RECOVER"})


def _classify_xa(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    r.tokens(sql)
    verb = kws[1] if len(kws) > 1 else None
    if verb not in _XA_VERBS:
        return Statement(Kind.XA, unknown=f"XA {verb or ''} is not known to the proxy")
    if verb == "RECOVER":
        return Statement(Kind.XA, read_only=True, xa=verb)
    return Statement(Kind.XA, xa="START" if verb == "BEGIN" else verb)


# --- SET -------------------------------------------------------------------------------------------

_AUTOCOMMIT_VALUES = {"1": True, "ON": True, "TRUE": True, "'ON'": True, "'1'": True,
                      "0": False, "OFF": False, "FALSE": False, "'OFF'": False, "'0'": False}  # fmt: skip
_SESSION_SCOPES = frozenset({SetScope.SESSION, SetScope.USER, SetScope.NAMES, SetScope.CHARSET,
                             SetScope.TRANSACTION, SetScope.NEXT_TRANSACTION})  # fmt: skip


def _classify_set(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    second = kws[1] if len(kws) > 1 else None
    if second == "STATEMENT":  # SET STATEMENT var=value[, ...] FOR <statement>: that statement
        return classify(sql[_set_statement_body(sql, r) :], dialect=r.dialect, no_backslash_escapes=r.nbe)
    kws = r.keywords(sql, 3)
    if is_set_not_assignment(kws):
        if second == "PASSWORD":
            return _OTHER_COMMIT
        if second == "ROLE":
            return Statement(Kind.SET, session_only=True, session_unrestorable="SET ROLE changes the active roles, which are not restored")
        return Statement(Kind.OTHER, unknown=f"SET {' '.join(kws[1:])} is not known to the proxy")
    try:
        assignments = parse_set(sql, dialect=r.dialect, no_backslash_escapes=r.nbe) or []
    except SqlParseError as exc:
        return Statement(Kind.SET, unknown=f"SET statement not understood: {exc}")
    session_only = all(a.scope in _SESSION_SCOPES for a in assignments)
    if is_set_transaction(kws):
        return Statement(Kind.SET_TRANSACTION, session_only=session_only)
    calls = _calls(r.tokens(sql))
    session_only = session_only and calls.first is None  # a stored function in a value may write
    reason = _GET_LOCK_REASON if calls.get_lock else None
    if calls.stored:
        return Statement(Kind.SET, runs_code=True, session_unrestorable=reason)
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
    if session_only and not (reason or needs_capture or implicit_commit or autocommit is not None):
        return _SESSION_SET
    return Statement(Kind.SET, session_only=session_only, implicit_commit=implicit_commit, session_unrestorable=reason,
                     needs_capture=needs_capture, autocommit=autocommit)  # fmt: skip


_SESSION_SET = Statement(Kind.SET, session_only=True)


def _set_statement_body(sql: str, r: _Reading) -> int:
    """Offset of the statement after ``SET STATEMENT ... FOR``."""
    depth = 0
    for tok in r.tokens(sql):
        if tok.kind is TokenKind.PUNCT:
            depth += tok.text == "("
            depth -= tok.text == ")"
        elif depth == 0 and tok.kind is TokenKind.WORD and tok.text.upper() == "FOR":
            return tok.end
    raise SqlParseError("SET STATEMENT without FOR")


# --- DDL, locks, prepared statements, administration -------------------------------------------


def _classify_create(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    words = r.keywords(sql, 4)
    if words[1:3] == ("OR", "REPLACE"):
        words = words[:1] + words[3:]
    if words[1:2] == ("TEMPORARY",):  # no implicit commit, but the table lives in the session
        return Statement(Kind.DDL, session_unrestorable="CREATE TEMPORARY TABLE: temporary tables live only in the session")
    _read_only, reason, stored = _effects(r.tokens(sql))
    return _DDL_COMMIT if reason is None and not stored else attrs.evolve(_DDL_COMMIT, session_unrestorable=reason, runs_code=stored)


def _classify_drop(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    if kws[1:] == ("PREPARE",):
        return _classify_deallocate(sql, kws, r)
    r.tokens(sql)
    if kws[1:] == ("TEMPORARY",):
        return _PLAIN[Kind.DDL]
    return _DDL_COMMIT


def _classify_ddl(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    r.tokens(sql)
    return _DDL_COMMIT


def _classify_lock(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    if kws[1:] in (("TABLES",), ("TABLE",)):
        return Statement(Kind.LOCK_TABLES, implicit_commit=True, session_unrestorable="LOCK TABLES holds table locks that belong to the session")
    if kws[1:] == ("INSTANCE",):
        return Statement(Kind.OTHER, session_unrestorable="LOCK INSTANCE FOR BACKUP holds a lock that belongs to the session")
    return Statement(Kind.OTHER, unknown=f"LOCK {' '.join(kws[1:])} is not known to the proxy")


def _classify_unlock(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    if kws[1:] in (("TABLES",), ("TABLE",)):
        return _UNLOCK_TABLES
    return Statement(Kind.OTHER, unknown=f"UNLOCK {' '.join(kws[1:])} is not known to the proxy")


_UNLOCK_TABLES = Statement(Kind.UNLOCK_TABLES, implicit_commit=True)


def _classify_prepare(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    tokens = r.tokens(sql)
    if len(tokens) < 4 or tokens[1].kind not in NAME_KINDS or tk.word(tokens, 2) != "FROM":
        return Statement(Kind.OTHER, unknown="PREPARE not understood")
    name = tk.name(tokens[1])
    return Statement(Kind.PREPARE_SQL, session_only=True, target=name,
                     session_unrestorable=f"PREPARE {name}: SQL-level prepared statements live only in the session")  # fmt: skip


def _classify_execute(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    tokens = r.tokens(sql)
    if kws[1:] == ("IMMEDIATE",):  # MariaDB EXECUTE IMMEDIATE 'sql'
        return Statement(Kind.EXECUTE_SQL, runs_code=True)
    if len(tokens) < 2 or tokens[1].kind not in NAME_KINDS:
        return Statement(Kind.OTHER, unknown="EXECUTE not understood")
    return Statement(Kind.EXECUTE_SQL, runs_code=True, target=tk.name(tokens[1]))


def _classify_deallocate(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    """DEALLOCATE PREPARE name / DROP PREPARE name."""
    tokens = r.tokens(sql)
    if len(tokens) != 3 or tk.word(tokens, 1) != "PREPARE" or tokens[2].kind not in NAME_KINDS:
        return Statement(Kind.OTHER, unknown="DEALLOCATE not understood")
    return Statement(Kind.DEALLOCATE_SQL, session_only=True, target=tk.name(tokens[2]))


def _classify_analyze(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    """ANALYZE TABLE commits; MariaDB's ANALYZE <statement> runs the statement."""
    if kws[1:] in (("SELECT",), ("UPDATE",), ("DELETE",), ("INSERT",), ("REPLACE",)):
        inner = classify(sql[r.after_keywords(sql, 1) :], dialect=r.dialect, no_backslash_escapes=r.nbe)
        return attrs.evolve(inner, kind=Kind.SHOW) if inner.read_only else inner
    r.tokens(sql)
    return _OTHER_COMMIT


def _classify_flush(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    tokens = r.tokens(sql)
    words = [tk.word(tokens, i) for i in range(len(tokens))]
    for i in range(len(words) - 1):
        if (words[i], words[i + 1]) in (("READ", "LOCK"), ("FOR", "EXPORT")):
            return Statement(Kind.OTHER, implicit_commit=True,
                             session_unrestorable="FLUSH TABLES ... WITH READ LOCK / FOR EXPORT holds locks that belong to the session")  # fmt: skip
    return _OTHER_COMMIT


def _classify_handler(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    tokens = r.tokens(sql)
    if any(tk.word(tokens, i) == "OPEN" for i in range(len(tokens))):
        return Statement(Kind.OTHER, read_only=True, session_unrestorable="HANDLER ... OPEN keeps a table handler open in the session")
    return Statement(Kind.OTHER, read_only=True)


def _classify_backup(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    return Statement(Kind.OTHER, session_unrestorable="MariaDB BACKUP STAGE / BACKUP LOCK holds locks that belong to the session")


def _classify_other_commit(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    r.tokens(sql)
    return _OTHER_COMMIT


def _classify_stop(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    if kws[1:] in (("SLAVE",), ("REPLICA",), ("GROUP_REPLICATION",), ("ALL",)):
        return _OTHER_COMMIT
    return Statement(Kind.OTHER, unknown=f"STOP {' '.join(kws[1:])} is not known to the proxy")


def _classify_change(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    if kws[1:] in (("MASTER",), ("REPLICATION",)):
        return _OTHER_COMMIT
    return Statement(Kind.OTHER, unknown=f"CHANGE {' '.join(kws[1:])} is not known to the proxy")


def _classify_check(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    if kws[1:] in (("TABLE",), ("TABLES",)):
        return _OTHER_COMMIT
    return Statement(Kind.OTHER, unknown=f"CHECK {' '.join(kws[1:])} is not known to the proxy")


def _classify_kill(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    r.tokens(sql)
    return _PLAIN[Kind.OTHER]  # acts on another session: may "write", no transaction effect


def _classify_signal(sql: str, kws: tuple[str, ...], r: _Reading) -> Statement:
    r.tokens(sql)
    return _READ_ONLY_OTHER  # raises the given condition, changes nothing


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
    "KILL": _classify_kill, "SIGNAL": _classify_signal, "RESIGNAL": _classify_signal,
}  # fmt: skip
