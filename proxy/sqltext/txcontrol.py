"""Classifying transaction control: BEGIN / START TRANSACTION (TiDB's PESSIMISTIC and
OPTIMISTIC, MariaDB's compound BEGIN NOT ATOMIC), COMMIT / ROLLBACK with their completion
options, savepoints, XA."""

from __future__ import annotations

import proxy.sqltext.tokens as tk
from proxy.sqltext.lexer import NAME_KINDS, Token
from proxy.sqltext.statement import OTHER_COMMIT, PLAIN, Kind, Statement

__all__ = ["classify_begin", "classify_commit", "classify_savepoint", "classify_release", "classify_xa"]


# START TRANSACTION characteristics; TiDB adds BEGIN PESSIMISTIC / OPTIMISTIC.
def classify_begin(sql: str, kws: tuple[str, ...], r: tk.Reading) -> Statement:
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
            return OTHER_COMMIT
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


def classify_commit(sql: str, kws: tuple[str, ...], r: tk.Reading) -> Statement:
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
    return Statement(kind, chain=chain, release=release) if chain or release else PLAIN[kind]


def _savepoint_statement(kind: Kind, tokens: list[Token], i: int) -> Statement:
    if i != len(tokens) - 1 or tokens[i].kind not in NAME_KINDS:
        return Statement(Kind.OTHER, unknown=f"{kind.value} without one savepoint name")
    return Statement(kind, target=tk.name(tokens[i]))


def classify_savepoint(sql: str, kws: tuple[str, ...], r: tk.Reading) -> Statement:
    return _savepoint_statement(Kind.SAVEPOINT, r.tokens(sql), 1)


def classify_release(sql: str, kws: tuple[str, ...], r: tk.Reading) -> Statement:
    if kws[1:] != ("SAVEPOINT",):
        return Statement(Kind.OTHER, unknown="RELEASE without SAVEPOINT")
    return _savepoint_statement(Kind.RELEASE_SAVEPOINT, r.tokens(sql), 2)


_XA_VERBS = frozenset({"START", "BEGIN", "END", "PREPARE", "COMMIT", "ROLLBACK", "RECOVER"})


def classify_xa(sql: str, kws: tuple[str, ...], r: tk.Reading) -> Statement:
    r.tokens(sql)
    verb = kws[1] if len(kws) > 1 else None
    if verb not in _XA_VERBS:
        return Statement(Kind.XA, unknown=f"XA {verb or ''} is not known to the proxy")
    if verb == "RECOVER":
        return Statement(Kind.XA, read_only=True, xa=verb)
    return Statement(Kind.XA, xa="START" if verb == "BEGIN" else verb)
