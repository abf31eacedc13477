"""The recovery matrix: statement pattern x fault x recovery mode.

Every case runs a client script through the proxy (one fault armed on one statement, see
``tests/recovery/harness.py``) and checks

1. exactly what the client saw for every statement (a result, or an error code), and
2. the exact data afterwards, read on a direct connection (no row lost, none written twice,
   no OK for a write that did not happen).

Expectations follow the product's promise (GUIDE §4, README "How it stays safe"):

- idle, nothing in flight, the server closes the connection: the next statement just works,
  session state unchanged;
- a transaction whose COMMIT was not sent: replayed transparently when every replayed result
  equals what the client saw, else 1213 and the whole transaction rolled back;
- COMMIT (or an autocommit write) in flight, answer lost: default -> connection error, data is
  what the server did; commit_marker -> resolved exactly (OK, data present once); safe_mode ->
  replayed only when every statement is provably idempotent by the table's keys, else
  connection error;
- reads and session-only statements in flight: resent;
- what the proxy cannot judge (stored routines, EXECUTE IMMEDIATE, XA, multi-statement texts
  with transaction control, unknown statements, version comments) is never replayed or resent;
- a partly relayed result closes the client's connection (never an ERR inside a row);
- an operator's KILL reaches the client as an error, never undone by a replay.

Every case runs on MariaDB and on tidb-server (``recovery_harness`` per flavor; TiDB's skip with one
line without the binary), except those that need what TiDB lacks (``MARIADB_ONLY`` and stored
routines, triggers, XA: each says why); where TiDB answers otherwise (5-digit version comments,
COMMIT AND CHAIN without a chain, a failed ALTER that commits nothing) the case says what it
expects there (``_tidb_alts``, measured). Section 11 is TiDB's own: optimistic transactions
(1062 and 9007 at COMMIT), commit markers with them, and DM's safe-mode batch.

The fault shim cannot tell the proxy apart from "the server never got it" (close_before) and
"the server ran it, the answer was lost" (drop_answer): the proxy sees the same thing (command
sent, then EOF). That is why close_before on a COMMIT or an autocommit write expects a
connection error in default mode: the proxy cannot know, so it must not guess.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Sequence
from typing import Any

import pytest

from proxy import sqltext
from tests.lab.netfault import partition_unavailable_reason
from tests.recovery.harness import (  # noqa: F401 (fixture)
    DRIVER_CRASH,
    FLAVORS,
    CaseResult,
    Fault,
    Outcome,
    Prepared,
    RecoveryHarness,
    recovery_harness,
)

pytestmark = pytest.mark.integration

MODES = ("default", "commit_marker", "safe_mode")

# ---------------------------------------------------------------------------------------------
# What the client may see for one statement


class Exp:
    def match(self, o: Outcome) -> bool:
        raise NotImplementedError


_ANY = object()


@dataclasses.dataclass(frozen=True)
class OK(Exp):
    """A successful answer; optionally its first result set's rows / every result set's rows /
    the affected-row count of its first result."""

    rows: Any = _ANY
    results: Any = _ANY
    affected: Any = _ANY

    def match(self, o: Outcome) -> bool:
        if not o.ok:
            return False
        if self.rows is not _ANY and o.rows != self.rows:
            return False
        if self.results is not _ANY and list(o.results) != list(self.results):
            return False
        if self.affected is not _ANY and (not o.affected or o.affected[0] != self.affected):
            return False
        return True

    def __str__(self) -> str:
        parts = [f"{k}={v!r}" for k, v in (("rows", self.rows), ("results", self.results), ("affected", self.affected)) if v is not _ANY]
        return "OK" + (f"({', '.join(parts)})" if parts else "")


@dataclasses.dataclass(frozen=True)
class Err(Exp):
    name: str
    codes: frozenset[int]

    def match(self, o: Outcome) -> bool:
        return not o.skipped and o.code in self.codes and o.code not in (0, DRIVER_CRASH)

    def __str__(self) -> str:
        return f"{self.name}{sorted(self.codes)}"


@dataclasses.dataclass(frozen=True)
class _Skip(Exp):
    def match(self, o: Outcome) -> bool:
        return o.skipped

    def __str__(self) -> str:
        return "skipped"


@dataclasses.dataclass(frozen=True)
class _Any(Exp):
    def match(self, o: Outcome) -> bool:
        return o.code not in (0, DRIVER_CRASH)

    def __str__(self) -> str:
        return "any"


@dataclasses.dataclass(frozen=True)
class Either(Exp):
    options: tuple[Exp, ...]

    def match(self, o: Outcome) -> bool:
        return any(e.match(o) for e in self.options)

    def __str__(self) -> str:
        return " | ".join(str(e) for e in self.options)


def either(*options: Exp) -> Either:
    return Either(tuple(options))


# The proxy's connection error (1158, formerly 2013) or the driver's own lost connection
# (PyMySQL 2006/2013, mysql-connector 2013/2055).
CONN = Err("conn", frozenset({1158, 2013, 2006, 2055}))
RETRY = Err("retry", frozenset({1213}))
KILLED = Err("killed", frozenset({1927, 1158, 2013, 2006, 2055}))
SKIP = _Skip()
ANY = _Any()
ONE = OK(rows=((1,),))
AFTER_ERROR = either(SKIP, OK())  # after a KILL error: the connection is gone, or still usable


def err(code: int) -> Err:
    return Err(f"err{code}", frozenset({code}))


# ---------------------------------------------------------------------------------------------
# Cases


@dataclasses.dataclass
class Alt:
    """One acceptable ending: what the client saw, and the data (query -> rows)."""

    outcomes: list[Exp]
    data: dict[str, list[tuple]]


@dataclasses.dataclass
class Case:
    id: str
    script: list[str | Prepared]
    fault: Fault | None
    mode: str
    setup: list[str]
    alts: list[Alt]
    multi: bool = False
    driver: str = "pymysql"
    before: dict[int, list[str]] = dataclasses.field(default_factory=dict)
    sent_max: dict[str, int] = dataclasses.field(default_factory=dict)  # SQL prefix -> forwarded at most
    xa: bool = False  # roll back this case's prepared XA branches afterwards
    flavors: tuple[str, ...] = FLAVORS  # the servers it runs on
    mariadb_only: str | None = None  # why it does not run on TiDB
    tidb_alts: list[Alt] | None = None  # what TiDB does instead, where it differs from MariaDB (measured)
    tidb_bug: str | None = None  # a known failure of the proxy on TiDB (a strict xfail there)
    log_has: str | None = None  # what the proxy's log must say about the case

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        for alt in self.alts + (self.tidb_alts or []):
            assert len(alt.outcomes) == len(self.script), f"{self.id}: {len(alt.outcomes)} expectations"
        queries = [tuple(a.data) for a in self.alts + (self.tidb_alts or [])]
        assert all(q == queries[0] for q in queries), f"{self.id}: alternatives check different queries"

    def alts_on(self, flavor: str) -> list[Alt]:
        return self.tidb_alts if flavor == "tidb" and self.tidb_alts is not None else self.alts


CASES: list[Case] = []
_n = itertools.count()


def _fault_label(fault: Fault | None, script: Sequence[Any]) -> str:
    if fault is None:
        return "none"
    target = script[fault.on]
    what = target.sql if isinstance(target, Prepared) else target
    what = " ".join(str(what).split())[:24]
    extra = ""
    if fault.kind == "cut_result":
        extra = f"[at={fault.params['at']}]"
    if fault.kind == "kill":
        extra = "[running]" if fault.params.get("running") else "[idle]"
    return f"{fault.kind}{extra}@{what}"


def add(pattern: str, mode: str, script: list, fault: Fault | None, setup: list[str], alts: list[Alt], **kw: Any) -> None:
    CASES.append(Case(f"{pattern}/{_fault_label(fault, script)}/{mode}", list(script), fault, mode, list(setup), alts, **kw))


def fault(kind: str, on: int, **params: Any) -> Fault:
    match = params.pop("match", None)
    return Fault(kind, on, params, match)


DROP, CLOSE, IDLE, STALL, CUT, KILL = "drop_answer", "close_before", "close_idle_connections", "stall", "cut_result", "kill"
WT = "wait_timeout"
STALL_SECONDS = 1.0


def oks(n: int) -> list[Exp]:
    return [OK()] * n


def ended(pre: list[Exp], at: Exp, post: int) -> list[Exp]:
    """``pre``, then ``at`` for the faulted statement, then the rest skipped (connection gone)."""
    return [*pre, at, *[SKIP] * post]


def inflight(
    pattern: str,
    script: list,
    idx: int,
    *,
    setup: list[str],
    before: dict,
    after: dict,
    idem: bool,
    replayable: bool = True,
    faults: Sequence[str] = (DROP, CLOSE),
    modes: Sequence[str] = MODES,
    pre: list[Exp] | None = None,
    post: list[Exp] | None = None,
    marker: str = "resolve",
    fault_params: dict[str, Any] | None = None,
    **kw: Any,
) -> None:
    """A COMMIT or an autocommit write (statement ``idx``) in flight, its answer lost.

    ``before``: the data if it did not commit; ``after``: if it did. ``idem``: safe mode may
    replay it. ``replayable``: the transaction can be replayed (else a marker that says "not
    committed" gives 1213). ``marker``: ``"resolve"`` -- commit_marker mode resolves it exactly;
    ``"conn"`` -- it cannot (unjudgeable: a connection error in every mode)."""
    pre = pre if pre is not None else oks(idx)
    post = post if post is not None else oks(len(script) - idx - 1)
    assert len(pre) == idx and len(post) == len(script) - idx - 1
    marked = _is_commit(script[idx])  # commit markers protect a transaction's COMMIT, not an autocommit write
    ok = [*pre, OK(), *post]
    conn = ended(pre, CONN, len(post))
    retry = [*pre, RETRY, *oks(len(post))]
    for kind in faults:
        for mode in modes:
            server_ran = kind == DROP
            done = after if server_ran else before
            if marker == "conn":
                alts = [Alt(conn, done)]
            elif mode == "default":
                alts = [Alt(conn, done)]
            elif mode == "commit_marker" or (mode == "safe_mode_marker" and not idem):  # the marker tells
                if not marked:
                    alts = [Alt(conn, done)]
                elif server_ran or replayable:
                    alts = [Alt(ok, after)]
                else:
                    alts = [Alt(retry, before)]
            else:  # safe_mode
                alts = [Alt(ok, after)] if idem else [Alt(conn, done)]
            add(pattern, mode, script, fault(kind, idx, **(fault_params or {})), setup, alts, **kw)


def _is_commit(step: Any) -> bool:
    return isinstance(step, str) and sqltext.classify(step, dialect=sqltext.MARIADB).kind is sqltext.Kind.COMMIT


def unjudgeable(
    pattern: str,
    script: list,
    idx: int,
    *,
    setup: list[str],
    before: dict,
    after: dict,
    faults: Sequence[str] = (DROP,),
    modes: Sequence[str] = MODES,
    **kw: Any,
) -> None:
    """Statement ``idx`` cannot be judged: never replayed or resent, whatever the mode."""
    inflight(pattern, script, idx, setup=setup, before=before, after=after, idem=False, faults=faults, modes=modes, marker="conn", **kw)


def same_everywhere(
    pattern: str, script: list, flt: Fault, *, setup: list[str], alts: list[Alt], modes: Sequence[str] = MODES, **kw: Any
) -> None:
    for mode in modes:
        add(pattern, mode, script, flt, setup, alts, **kw)


# ---------------------------------------------------------------------------------------------
# Schema pieces

T = "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(32))"
T_ROWS = "INSERT INTO t VALUES (3, 'c'), (4, 'd')"
D = "CREATE TABLE d (v VARCHAR(32))"  # no key: a second write shows as a second row
A = "CREATE TABLE a (id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(32)) AUTO_INCREMENT=41"
U = "CREATE TABLE u (id INT AUTO_INCREMENT PRIMARY KEY, k INT NOT NULL, v VARCHAR(32), UNIQUE KEY (k))"
N = ["CREATE TABLE n (id INT PRIMARY KEY, k INT, v INT)", "INSERT INTO n VALUES (1, 1, 10), (2, 1, 20), (3, 2, 30)"]
S = ["CREATE TABLE s (id INT PRIMARY KEY, v VARCHAR(32))", "INSERT INTO s VALUES (1, 'orig')"]
MLOG = "CREATE TABLE mlog (id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(32)) ENGINE=MyISAM"  # survives rollback
F = "CREATE FUNCTION f() RETURNS INT MODIFIES SQL DATA BEGIN INSERT INTO mlog (v) VALUES ('f'); RETURN 1; END"
ROUTINES = [
    T,
    D,
    MLOG,
    F,
    "CREATE PROCEDURE p() BEGIN INSERT INTO t VALUES (7, 'p'); COMMIT; END",
    "CREATE PROCEDURE pq() BEGIN INSERT INTO d VALUES ('pq'); END",
]
NO_ROUTINES = [T, D, MLOG]  # the tables of ROUTINES without the routines (TiDB has none)
TRIGGER = [
    "CREATE TABLE tt (id INT PRIMARY KEY, v VARCHAR(32))",
    "CREATE TABLE tlog (id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(32))",
    "CREATE TRIGGER trg AFTER INSERT ON tt FOR EACH ROW INSERT INTO tlog (v) VALUES (NEW.v)",
]
SEQ = "CREATE SEQUENCE sq START WITH 1 INCREMENT BY 1 NOCACHE"

QT = "SELECT id, v FROM t ORDER BY id"
QD = "SELECT v FROM d ORDER BY v"
QA = "SELECT id, v FROM a ORDER BY id"
QN = "SELECT id, k, v FROM n ORDER BY id"
QM = "SELECT COUNT(*) FROM mlog"
XA_PREPARED = "XA RECOVER"  # special: the case's own prepared branches
N0 = [(1, 1, 10), (2, 1, 20), (3, 2, 30)]
BIG = [f"({i}, 'row-{i:04d}-{'x' * 20}')" for i in range(1, 201)]
BIG_ROWS = tuple((i, f"row-{i:04d}-{'x' * 20}") for i in range(1, 201))
BIG_SETUP = [T, "INSERT INTO t VALUES " + ", ".join(BIG)]


# =============================================================================================
# 1. COMMIT / autocommit write in flight, answer lost (outcome unknown)

inflight(
    "tx-insert",
    ["BEGIN", "INSERT INTO t VALUES (1, 'a')", "INSERT INTO t VALUES (2, 'b')", "COMMIT", "SELECT 1"],
    3,
    setup=[T],
    before={QT: []},
    after={QT: [(1, "a"), (2, "b")]},
    idem=False,
)
inflight(
    "tx-keyed-idempotent",
    ["BEGIN", "REPLACE INTO t VALUES (1, 'a')", "UPDATE t SET v = 'u' WHERE id = 3", "DELETE FROM t WHERE id = 4", "COMMIT", "SELECT 1"],
    4,
    setup=[T, T_ROWS],
    before={QT: [(3, "c"), (4, "d")]},
    after={QT: [(1, "a"), (3, "u")]},
    idem=True,
)
inflight(
    "tx-idempotent-plus-insert",
    ["BEGIN", "REPLACE INTO t VALUES (1, 'a')", "INSERT INTO t VALUES (2, 'b')", "COMMIT"],
    3,
    setup=[T],
    before={QT: []},
    after={QT: [(1, "a"), (2, "b")]},
    idem=False,
)
inflight(
    "tx-read-set-replace",
    ["BEGIN", "SELECT COUNT(*) FROM t", "SET @x = 1", "REPLACE INTO t VALUES (1, 'a')", "COMMIT"],
    4,
    setup=[T],
    before={QT: []},
    after={QT: [(1, "a")]},
    idem=True,
    faults=(DROP,),
)
inflight(
    "autocommit-insert", ["INSERT INTO t VALUES (1, 'a')", "SELECT 1"], 0, setup=[T], before={QT: []}, after={QT: [(1, "a")]}, idem=False
)
inflight(
    "autocommit-insert-nokey",
    ["INSERT INTO d VALUES ('x')", "SELECT 1"],
    0,
    setup=[D],
    before={QD: []},
    after={QD: [("x",)]},
    idem=False,
    faults=(DROP,),
)
inflight(
    "autocommit-replace-pk",
    ["REPLACE INTO t VALUES (1, 'a')", "SELECT 1"],
    0,
    setup=[T],
    before={QT: []},
    after={QT: [(1, "a")]},
    idem=True,
)
inflight(
    "autocommit-replace-multirow",
    ["REPLACE INTO t (v, id) VALUES ('a', 1), ('b', 2)", "SELECT 1"],
    0,
    setup=[T],
    before={QT: []},
    after={QT: [(1, "a"), (2, "b")]},
    idem=True,
    faults=(DROP,),
)
inflight(
    "autocommit-odku-const",
    ["INSERT INTO t VALUES (3, 'z') ON DUPLICATE KEY UPDATE v = 'z'", "SELECT 1"],
    0,
    setup=[T, T_ROWS],
    before={QT: [(3, "c"), (4, "d")]},
    after={QT: [(3, "z"), (4, "d")]},
    idem=True,
    faults=(DROP,),
)
inflight(
    # lower_case_table_names = 0: `ct` has a key, `CT` none; information_schema matched both, and
    # the key of one proved a REPLACE into the other, which then added a row each run.
    "autocommit-replace-table-names-differ-in-case",
    ["REPLACE INTO CT (id, v) VALUES (1, 'a')", "SELECT 1"],
    0,
    setup=["CREATE TABLE ct (id INT PRIMARY KEY, v VARCHAR(32))", "CREATE TABLE CT (id INT NOT NULL, v VARCHAR(32))"],
    before={"SELECT id, v FROM CT ORDER BY id": []},
    after={"SELECT id, v FROM CT ORDER BY id": [(1, "a")]},
    idem=False,
    faults=(DROP,),
)
inflight(
    # Without a column list the values fill the visible columns: NULL is the AUTO_INCREMENT id,
    # not the invisible h, so each run adds a row (the keys read once took 5 for the id).
    "autocommit-replace-invisible-column",
    ["REPLACE INTO inv VALUES (NULL, 5)", "SELECT 1"],
    0,
    setup=["CREATE TABLE inv (h INT INVISIBLE DEFAULT 7, id INT AUTO_INCREMENT PRIMARY KEY, v INT)"],
    before={"SELECT id, v FROM inv ORDER BY id": []},
    after={"SELECT id, v FROM inv ORDER BY id": [(1, 5)]},
    idem=False,
    faults=(DROP,),
)
inflight(
    # 0 for the AUTO_INCREMENT id generates one (sql_mode without NO_AUTO_VALUE_ON_ZERO): a
    # second run would add row 42 (safe mode once claimed the 0 pinned the key).
    "autocommit-replace-zero-id",
    ["REPLACE INTO a (id, v) VALUES (0, 'z')", "SELECT 1"],
    0,
    setup=[A],
    before={QA: []},
    after={QA: [(41, "z")]},
    idem=False,
    faults=(DROP,),
)
inflight(
    # TiDB's AUTO_RANDOM key makes its value for 0 as AUTO_INCREMENT does, though
    # information_schema.COLUMNS does not call it auto_increment: a second run adds a row.
    "autocommit-replace-zero-auto-random",
    ["REPLACE INTO ar (id, v) VALUES (0, 'z')", "SELECT 1"],
    0,
    setup=["CREATE TABLE ar (id BIGINT AUTO_RANDOM PRIMARY KEY, v VARCHAR(8))"],
    before={"SELECT COUNT(*), MIN(v) FROM ar": [(0, None)]},
    after={"SELECT COUNT(*), MIN(v) FROM ar": [(1, "z")]},
    idem=False,
    faults=(DROP,),
    flavors=("tidb",),
)
inflight(
    # With NO_AUTO_VALUE_ON_ZERO (as DM sets it) the 0 is the row's id: replayed, still one row.
    "autocommit-replace-zero-id-no-auto-value",
    ["SET SESSION sql_mode = 'NO_AUTO_VALUE_ON_ZERO'", "REPLACE INTO a (id, v) VALUES (0, 'z')", "SELECT 1"],
    1,
    setup=[A],
    before={QA: []},
    after={QA: [(0, "z")]},
    idem=True,
    faults=(DROP,),
)
inflight(
    # c = a constant other than the one inserted: the first run inserts row 5 with 'new', a
    # second would find it and make it 'dup' (safe mode claimed it idempotent: the row ended 'dup').
    "autocommit-odku-const-other",
    ["INSERT INTO t VALUES (5, 'new') ON DUPLICATE KEY UPDATE v = 'dup'", "SELECT 1"],
    0,
    setup=[T, T_ROWS],
    before={QT: [(3, "c"), (4, "d")]},
    after={QT: [(3, "c"), (4, "d"), (5, "new")]},
    idem=False,
    faults=(DROP,),
)
inflight(
    "autocommit-odku-concat",
    ["INSERT INTO t VALUES (3, 'z') ON DUPLICATE KEY UPDATE v = CONCAT(v, '!')", "SELECT 1"],
    0,
    setup=[T, T_ROWS],
    before={QT: [(3, "c"), (4, "d")]},
    after={QT: [(3, "c!"), (4, "d")]},
    idem=False,
    faults=(DROP,),
)
inflight(
    "autocommit-update-pk",
    ["UPDATE t SET v = 'z' WHERE id = 3", "SELECT 1"],
    0,
    setup=[T, T_ROWS],
    before={QT: [(3, "c"), (4, "d")]},
    after={QT: [(3, "z"), (4, "d")]},
    idem=True,
    faults=(DROP,),
)
inflight(
    "autocommit-update-concat",
    ["UPDATE t SET v = CONCAT(v, 'x') WHERE id = 3", "SELECT 1"],
    0,
    setup=[T, T_ROWS],
    before={QT: [(3, "c"), (4, "d")]},
    after={QT: [(3, "cx"), (4, "d")]},
    idem=False,
    faults=(DROP,),
)
inflight(
    "autocommit-delete-pk",
    ["DELETE FROM t WHERE id = 3", "SELECT 1"],
    0,
    setup=[T, T_ROWS],
    before={QT: [(3, "c"), (4, "d")]},
    after={QT: [(4, "d")]},
    idem=True,
    faults=(DROP,),
)
inflight(
    "safe-delete-nonkey-limit",
    ["DELETE FROM n WHERE k = 1 LIMIT 1", "SELECT 1"],
    0,
    setup=N,
    before={QN: N0},
    after={QN: N0[1:]},
    idem=False,
    faults=(DROP,),
)
inflight(
    "safe-update-nonconst-key",
    ["UPDATE n SET v = v + 1 WHERE id = 1", "SELECT 1"],
    0,
    setup=N,
    before={QN: N0},
    after={QN: [(1, 1, 11), *N0[1:]]},
    idem=False,
    faults=(DROP,),
)
inflight(
    "safe-replace-autoinc-no-id",
    ["REPLACE INTO a (v) VALUES ('x')", "SELECT 1"],
    0,
    setup=[A],
    before={QA: []},
    after={QA: [(41, "x")]},
    idem=False,
)
inflight(
    "safe-replace-unique-autoinc-pk",
    ["REPLACE INTO u (k, v) VALUES (5, 'x')", "SELECT 1"],
    0,
    setup=[U, "INSERT INTO u (id, k, v) VALUES (1, 5, 'old')"],
    before={"SELECT id, k, v FROM u": [(1, 5, "old")]},
    after={"SELECT id, k, v FROM u": [(2, 5, "x")]},
    idem=False,
    faults=(DROP,),
)
inflight(
    # Upserts on a table with two unique indexes: each row updates the first row it conflicts
    # with (by id, else by u), which depends on the rows before it. Run again from its own end,
    # this transaction leaves row 1 with v = 1, not 2 (found by brute force; safe mode once
    # replayed it).
    "safe-odku-two-unique-keys",
    [
        "BEGIN",
        *(f"INSERT INTO k2 VALUES ({row}) ON DUPLICATE KEY UPDATE v = VALUES(v)" for row in ("1, 1, 1", "4, 1, 1", "2, 1, 2", "2, 4, 2")),
        "COMMIT",
        "SELECT 1",
    ],
    5,
    setup=["CREATE TABLE k2 (id INT PRIMARY KEY, u INT NOT NULL, v INT, UNIQUE KEY (u))"],
    before={"SELECT id, u, v FROM k2 ORDER BY id": []},
    after={"SELECT id, u, v FROM k2 ORDER BY id": [(1, 1, 2), (2, 4, 2)]},
    idem=False,
    faults=(DROP,),
)
# A DELETE that selects by a non-key column the transaction then sets: run again from its own
# end, the DELETE finds v = 'x' and removes the row the first run kept. On TiDB also with the
# table named `D2` once: names are without case there.
for suffix, name, flavors in (("", "d2", FLAVORS), ("-other-case", "D2", ("tidb",))):
    inflight(
        f"safe-delete-by-a-column-the-transaction-sets{suffix}",
        ["BEGIN", f"DELETE FROM {name} WHERE id = 1 AND v = 'x'", "UPDATE d2 SET v = 'x' WHERE id = 1", "COMMIT", "SELECT 1"],
        3,
        setup=["CREATE TABLE d2 (id INT PRIMARY KEY, v VARCHAR(8))", "INSERT INTO d2 VALUES (1, 'y')"],
        before={"SELECT id, v FROM d2": [(1, "y")]},
        after={"SELECT id, v FROM d2": [(1, "x")]},
        idem=False,
        faults=(DROP,),
        flavors=flavors,
    )
inflight(
    # An upsert that inserts u without updating it, after an UPDATE of u: the first run inserts
    # (1, 2, 0); a second finds the row, the UPDATE makes u 1, and the upsert keeps it.
    "safe-upsert-keeps-a-column-the-transaction-sets",
    [
        "BEGIN",
        "UPDATE d3 SET u = 1 WHERE id = 1",
        "INSERT INTO d3 (id, u, v) VALUES (1, 2, 0) ON DUPLICATE KEY UPDATE v = VALUES(v)",
        "COMMIT",
        "SELECT 1",
    ],
    3,
    setup=["CREATE TABLE d3 (id INT PRIMARY KEY, u INT, v INT)"],
    before={"SELECT id, u, v FROM d3": []},
    after={"SELECT id, u, v FROM d3": [(1, 2, 0)]},
    idem=False,
    faults=(DROP,),
)
inflight(
    "safe-replace-null-autoinc",
    ["REPLACE INTO a (id, v) VALUES (NULL, 'x')", "SELECT 1"],
    0,
    setup=[A],
    before={QA: []},
    after={QA: [(41, "x")]},
    idem=False,
    faults=(DROP,),
)
inflight(
    "safe-replace-trigger",
    ["REPLACE INTO tt VALUES (1, 'a')", "SELECT 1"],
    0,
    setup=TRIGGER,
    before={"SELECT * FROM tt": [], "SELECT v FROM tlog": []},
    after={"SELECT * FROM tt": [(1, "a")], "SELECT v FROM tlog": [("a",)]},
    idem=False,
)
inflight(
    "safe-replace-nonconst",
    ["REPLACE INTO d2 VALUES (1, UUID())", "SELECT 1"],
    0,
    setup=["CREATE TABLE d2 (id INT PRIMARY KEY, v CHAR(36))"],
    before={"SELECT COUNT(*) FROM d2": [(0,)]},
    after={"SELECT COUNT(*) FROM d2": [(1,)]},
    idem=False,
    faults=(DROP,),
)
inflight(
    "safe-insert-select",
    ["INSERT INTO d SELECT v FROM t", "SELECT 1"],
    0,
    setup=[T, T_ROWS, D],
    before={QD: []},
    after={QD: [("c",), ("d",)]},
    idem=False,
    faults=(DROP,),
)
inflight(
    "analyze-update",
    ["ANALYZE UPDATE n SET v = v + 1 WHERE id = 1", "SELECT 1"],
    0,
    setup=N,
    before={QN: N0},
    after={QN: [(1, 1, 11), *N0[1:]]},
    idem=False,
    faults=(DROP,),
)
inflight(
    "set-statement-for-insert",
    ["SET STATEMENT max_statement_time = 10 FOR INSERT INTO d VALUES ('s')", "SELECT 1"],
    0,
    setup=[D],
    before={QD: []},
    after={QD: [("s",)]},
    idem=False,
    faults=(DROP,),
)
inflight(
    "comment-999999-show-then-insert",
    ["/*!999999 SHOW */ INSERT INTO d VALUES ('s9')", "SELECT 1"],
    0,
    setup=[D],
    before={QD: []},
    after={QD: [("s9",)]},
    idem=False,
)
inflight(
    "comment-100000-insert",
    ["/*!100000 INSERT INTO d VALUES ('c1') */", "SELECT 1"],
    0,
    setup=[D],
    before={QD: []},
    after={QD: [("c1",)]},
    idem=False,
    faults=(DROP,),
)
inflight(
    "comment-M100000-insert",
    ["/*M!100000 INSERT INTO d VALUES ('m1') */", "SELECT 1"],
    0,
    setup=[D],
    before={QD: []},
    after={QD: [("m1",)]},
    idem=False,
    faults=(DROP,),
)
inflight(
    "comment-hash-commit",
    ["BEGIN", "INSERT INTO t VALUES (1, 'a')", "# x\nCOMMIT", "SELECT 1"],
    2,
    setup=[T],
    before={QT: []},
    after={QT: [(1, "a")]},
    idem=False,
)
inflight(
    "comment-100000-commit",
    ["BEGIN", "INSERT INTO t VALUES (1, 'a')", "/*!100000 COMMIT */", "SELECT 1"],
    2,
    setup=[T],
    before={QT: []},
    after={QT: [(1, "a")]},
    idem=False,
)
inflight(
    "comment-Mx-commit-chain",
    ["BEGIN", "INSERT INTO t VALUES (1, 'a')", "/*Mx*/ COMMIT AND CHAIN", "INSERT INTO t VALUES (2, 'b')", "ROLLBACK", "SELECT 1"],
    2,
    setup=[T],
    before={QT: []},
    after={QT: [(1, "a")]},
    idem=False,
)
inflight(
    "commit-chain",
    ["BEGIN", "INSERT INTO t VALUES (1, 'a')", "COMMIT AND CHAIN", "INSERT INTO t VALUES (2, 'b')", "ROLLBACK", "SELECT 1"],
    2,
    setup=[T],
    before={QT: []},
    after={QT: [(1, "a")]},
    idem=False,
)
inflight(
    "commit-chain-idempotent",
    ["BEGIN", "REPLACE INTO t VALUES (1, 'a')", "COMMIT AND CHAIN", "REPLACE INTO t VALUES (2, 'b')", "COMMIT", "SELECT 1"],
    2,
    setup=[T],
    before={QT: []},
    after={QT: [(1, "a"), (2, "b")]},
    idem=True,
    faults=(DROP,),
    modes=("safe_mode",),
)
inflight(
    "multi-set-insert",
    ["SET @x = 1; INSERT INTO d VALUES ('x')", "SELECT @x"],
    0,
    setup=[D],
    before={QD: []},
    after={QD: [("x",)]},
    idem=False,
    multi=True,
    post=[OK(rows=((1,),))],
)
inflight(
    "multi-set-replace",
    ["SET @x = 1; REPLACE INTO t VALUES (1, 'a')", "SELECT @x"],
    0,
    setup=[T],
    before={QT: []},
    after={QT: [(1, "a")]},
    idem=True,
    multi=True,
    faults=(DROP,),
    post=[OK(rows=((1,),))],
)
inflight(
    "tx-function-then-commit",
    ["BEGIN", "INSERT INTO t VALUES (1, 'a')", "SELECT f()", "COMMIT", "SELECT 1"],
    3,
    setup=ROUTINES,
    before={QT: [], QM: [(1,)]},
    after={QT: [(1, "a")], QM: [(1,)]},
    idem=False,
    replayable=False,
    marker="conn",
)  # f() wrote a table that does not roll back: the transaction is in doubt, never "retry"
for m in MODES:  # a transaction that wrote nothing: its COMMIT may simply be resent
    add(
        "tx-readonly-commit-any-mode",
        m,
        ["START TRANSACTION READ ONLY", "SELECT v FROM t WHERE id = 3", "COMMIT", "SELECT 1"],
        fault(DROP, 2),
        [T, T_ROWS],
        [Alt([OK(), OK(rows=(("c",),)), OK(), ONE], {QT: [(3, "c"), (4, "d")]})],
    )

for m in MODES:  # the same without READ ONLY (a no-op that errs on TiDB)
    add(
        "tx-select-only-commit-any-mode",
        m,
        ["BEGIN", "SELECT v FROM t WHERE id = 3", "COMMIT", "SELECT 1"],
        fault(DROP, 2),
        [T, T_ROWS],
        [Alt([OK(), OK(rows=(("c",),)), OK(), ONE], {QT: [(3, "c"), (4, "d")]})],
    )
inflight(
    "comment-50000-insert",
    ["/*!50000 INSERT INTO d VALUES ('c5') */", "SELECT 1"],
    0,  # runs on both servers
    setup=[D],
    before={QD: []},
    after={QD: [("c5",)]},
    idem=False,
    faults=(DROP,),
    modes=("default",),
)

# Prepared statements (mysql-connector-python, prepared=True)
INS = "INSERT INTO t VALUES (?, ?)"
inflight(
    "prepared-autocommit-insert",
    [Prepared(INS, (1, "a")), "SELECT 1"],
    0,
    setup=[T],
    before={QT: []},
    after={QT: [(1, "a")]},
    idem=False,
    driver="connector",
)
inflight(
    "prepared-autocommit-replace",
    [Prepared("REPLACE INTO t VALUES (?, ?)", (1, "a")), "SELECT 1"],
    0,
    setup=[T],
    before={QT: []},
    after={QT: [(1, "a")]},
    idem=True,
    faults=(DROP,),
    driver="connector",
)
inflight(
    "prepared-tx-commit",
    ["BEGIN", Prepared(INS, (1, "a")), Prepared(INS, (2, "b")), "COMMIT", "SELECT 1"],
    3,
    setup=[T],
    before={QT: []},
    after={QT: [(1, "a"), (2, "b")]},
    idem=False,
    driver="connector",
)

# The commit marker's own upsert lost (the fast lane sends it from the callback that read the
# COMMIT): the COMMIT waits for the marker's OK, so it never reached the server and nothing
# committed. The transaction is replayed on a new connection, marked again and committed once.
MARKER_UPSERT = "INSERT INTO replay_proxy.commit_markers"


def marker_lost(pattern: str, script: list, commit: int, done: dict, **kw: Any) -> None:
    for kind in (DROP, CLOSE):
        seen = [*oks(len(script) - 1), ONE]  # every statement OK, as if nothing was lost
        lost = fault(kind, commit, match=MARKER_UPSERT)
        add(pattern, "commit_marker", script, lost, [T], [Alt(seen, done)], sent_max={"COMMIT": 1}, **kw)


marker_lost("tx-insert-marker-lost", ["BEGIN", "INSERT INTO t VALUES (1, 'a')", "INSERT INTO t VALUES (2, 'b')", "COMMIT", "SELECT 1"], 3,
            {QT: [(1, "a"), (2, "b")]})  # fmt: skip

# =============================================================================================
# 2. Connection lost inside a transaction before COMMIT: replayed transparently

TX = ["BEGIN", "INSERT INTO t VALUES (1, 'a')", "INSERT INTO t VALUES (2, 'b')", "COMMIT", "SELECT 1"]
TX_DONE = {QT: [(1, "a"), (2, "b")]}
for flt in (
    fault(CLOSE, 2),
    fault(DROP, 2),
    fault(IDLE, 2),
    fault(STALL, 2, seconds=STALL_SECONDS),
    fault(DROP, 1),
    fault(DROP, 0),
    fault(IDLE, 3),
    fault(STALL, 3, seconds=STALL_SECONDS),
):
    same_everywhere("tx-insert", TX, flt, setup=[T], alts=[Alt([OK(), OK(affected=1), OK(affected=1), OK(), ONE], TX_DONE)])

for begin in ("/*Mx*/ BEGIN", "--\f x\nBEGIN", "# x\nBEGIN", "/*!100000 BEGIN */", "START TRANSACTION"):
    label = {
        "/*Mx*/ BEGIN": "comment-Mx-begin",
        "--\f x\nBEGIN": "comment-dash-formfeed-begin",
        "# x\nBEGIN": "comment-hash-begin",
        "/*!100000 BEGIN */": "comment-100000-begin",
        "START TRANSACTION": "start-transaction",
    }[begin]
    same_everywhere(
        label,
        [begin, "INSERT INTO d VALUES ('x1')", "INSERT INTO d VALUES ('x2')", "COMMIT", "SELECT 1"],
        fault(CLOSE, 2),
        setup=[D],
        modes=MODES if begin.startswith("/*Mx") else ("default",),
        alts=[Alt(oks(4) + [ONE], {QD: [("x1",), ("x2",)]})],
    )

# A COMMIT AND CHAIN committed the first part: a later loss replays only the chained part.
for commit in ("/*Mx*/ COMMIT AND CHAIN", "COMMIT AND CHAIN", "COMMIT WORK AND CHAIN NO RELEASE"):
    label = {
        "/*Mx*/ COMMIT AND CHAIN": "comment-Mx-chain",
        "COMMIT AND CHAIN": "chain",
        "COMMIT WORK AND CHAIN NO RELEASE": "chain-work-norelease",
    }[commit]
    script = [
        "BEGIN",
        "INSERT INTO d VALUES ('x1')",
        commit,
        "INSERT INTO d VALUES ('x2')",
        "INSERT INTO d VALUES ('x3')",
        "COMMIT",
        "SELECT 1",
    ]
    for flt in (fault(CLOSE, 4), fault(IDLE, 4)):
        same_everywhere(
            f"{label}-then-loss",
            script,
            flt,
            setup=[D],
            modes=MODES if flt.kind == CLOSE else ("default",),
            alts=[Alt(oks(6) + [ONE], {QD: [("x1",), ("x2",), ("x3",)]})],
        )

# A version comment the server skips is a no-op, not a COMMIT
same_everywhere(
    "comment-999999-commit-is-noop",
    ["BEGIN", "INSERT INTO d VALUES ('x1')", "/*!999999 COMMIT */", "INSERT INTO d VALUES ('x2')", "ROLLBACK", "SELECT 1"],
    fault(DROP, 2),
    setup=[D],
    alts=[Alt(oks(5) + [ONE], {QD: []})],
)
same_everywhere(
    "comment-999999-commit-then-loss",
    ["BEGIN", "INSERT INTO d VALUES ('x1')", "/*!999999 COMMIT */", "INSERT INTO d VALUES ('x2')", "COMMIT", "SELECT 1"],
    fault(CLOSE, 3),
    setup=[D],
    modes=("default",),
    alts=[Alt(oks(5) + [ONE], {QD: [("x1",), ("x2",)]})],
)

same_everywhere(
    "savepoint",
    [
        "BEGIN",
        "INSERT INTO t VALUES (1, 'a')",
        "SAVEPOINT s1",
        "INSERT INTO t VALUES (2, 'b')",
        "ROLLBACK TO SAVEPOINT s1",
        "INSERT INTO t VALUES (3, 'c')",
        "COMMIT",
        "SELECT 1",
    ],
    fault(CLOSE, 5),
    setup=[T],
    alts=[Alt(oks(7) + [ONE], {QT: [(1, "a"), (3, "c")]})],
)
same_everywhere(
    "tx-select-inflight",
    ["BEGIN", "INSERT INTO t VALUES (1, 'a')", "SELECT COUNT(*) FROM t", "INSERT INTO t VALUES (2, 'b')", "COMMIT"],
    fault(DROP, 2),
    setup=[T],
    alts=[Alt([OK(), OK(), OK(rows=((1,),)), OK(), OK()], TX_DONE)],
)
same_everywhere(
    "tx-select-for-update-inflight",
    ["BEGIN", "SELECT v FROM t WHERE id = 3 FOR UPDATE", "UPDATE t SET v = 'z' WHERE id = 3", "COMMIT"],
    fault(DROP, 1),
    setup=[T, T_ROWS],
    modes=("default",),
    alts=[Alt([OK(), OK(rows=(("c",),)), OK(), OK()], {QT: [(3, "z"), (4, "d")]})],
)
same_everywhere(
    "tx-dup-error-then-loss",
    ["BEGIN", "INSERT INTO t VALUES (1, 'a')", "INSERT INTO t VALUES (1, 'a')", "INSERT INTO t VALUES (2, 'b')", "COMMIT"],
    fault(CLOSE, 3),
    setup=[T],
    modes=("default", "safe_mode"),
    alts=[Alt([OK(), OK(), err(1062), OK(), OK()], TX_DONE)],
)
same_everywhere(
    "tx-multi-inserts",
    ["BEGIN", "INSERT INTO d VALUES ('x1'); INSERT INTO d VALUES ('x2')", "INSERT INTO d VALUES ('x3')", "COMMIT"],
    fault(DROP, 1),
    setup=[D],
    multi=True,
    alts=[Alt(oks(4), {QD: [("x1",), ("x2",), ("x3",)]})],
)
same_everywhere(
    "tx-multi-inserts",
    ["BEGIN", "INSERT INTO d VALUES ('x1'); INSERT INTO d VALUES ('x2')", "INSERT INTO d VALUES ('x3')", "COMMIT"],
    fault(CLOSE, 2),
    setup=[D],
    multi=True,
    modes=("default",),
    alts=[Alt(oks(4), {QD: [("x1",), ("x2",), ("x3",)]})],
)
same_everywhere(
    "tx-multi-partial-error",
    ["BEGIN", "INSERT INTO t VALUES (1, 'a'); INSERT INTO t VALUES (1, 'b')", "INSERT INTO t VALUES (2, 'b')", "COMMIT"],
    fault(IDLE, 2),
    setup=[T],
    multi=True,
    alts=[Alt([OK(), err(1062), OK(), OK()], TX_DONE)],
)
same_everywhere(
    "autocommit-off-tx",
    ["SET autocommit = 0", "INSERT INTO t VALUES (1, 'a')", "INSERT INTO t VALUES (2, 'b')", "COMMIT", "SELECT 1"],
    fault(IDLE, 2),
    setup=[T],
    alts=[Alt(oks(4) + [ONE], TX_DONE)],
)
same_everywhere(
    "rollback-inflight",
    ["BEGIN", "INSERT INTO t VALUES (1, 'a')", "ROLLBACK", "INSERT INTO t VALUES (2, 'b')"],
    fault(DROP, 2),
    setup=[T],
    alts=[Alt(oks(4), {QT: [(2, "b")]})],
)

# Replay gives a different result than the client saw: 1213, the transaction rolled back.
same_everywhere(
    "replay-mismatch-read",
    ["BEGIN", "SELECT v FROM s WHERE id = 1", "INSERT INTO t VALUES (1, 'a')", "INSERT INTO t VALUES (2, 'b')", "COMMIT", "SELECT 1"],
    fault(IDLE, 3),
    setup=[T, *S],
    before={3: ["UPDATE s SET v = 'changed' WHERE id = 1"]},
    alts=[Alt([OK(), OK(rows=(("orig",),)), OK(), RETRY, OK(), ONE], {QT: [], "SELECT v FROM s": [("changed",)]})],
)
same_everywhere(
    "replay-mismatch-insert-id",
    ["BEGIN", "INSERT INTO a (v) VALUES ('x')", "SELECT LAST_INSERT_ID()", "COMMIT", "SELECT 1"],
    fault(IDLE, 2),
    setup=[A],
    alts=[
        Alt([OK(), OK(), RETRY, OK(), ONE], {QA: []}),  # auto-increment values are not given back
        Alt([OK(), OK(), OK(rows=((41,),)), OK(), ONE], {QA: [(41, "x")]}),
    ],
)  # the proxy pinned insert_id
same_everywhere(
    "replay-mismatch-count",
    ["BEGIN", "SELECT COUNT(*) FROM s", "INSERT INTO t VALUES (1, 'a')", "COMMIT"],
    fault(CLOSE, 2),
    setup=[T, *S],
    before={2: ["INSERT INTO s VALUES (2, 'other')"]},
    modes=("default",),
    alts=[Alt([OK(), OK(rows=((1,),)), RETRY, OK()], {QT: []})],
)

# Prepared statements in a transaction
PTX = ["BEGIN", Prepared(INS, (1, "a")), Prepared(INS, (2, "b")), "COMMIT", Prepared("SELECT v FROM t WHERE id = ?", (2,))]
for flt in (fault(DROP, 2), fault(CLOSE, 2), fault(IDLE, 2), fault(STALL, 2, seconds=STALL_SECONDS)):
    same_everywhere(
        "prepared-tx",
        PTX,
        flt,
        setup=[T],
        driver="connector",
        modes=MODES if flt.kind == DROP else ("default",),
        alts=[Alt([OK(), OK(), OK(), OK(), OK(rows=(("b",),))], TX_DONE)],
    )
same_everywhere(
    "prepared-reused-after-idle-close",
    [Prepared(INS, (1, "a")), Prepared(INS, (2, "b")), Prepared("SELECT COUNT(*) FROM t WHERE id > ?", (0,))],
    fault(IDLE, 1),
    setup=[T],
    driver="connector",
    modes=("default",),
    alts=[Alt([OK(), OK(), OK(rows=((2,),))], TX_DONE)],
)

# =============================================================================================
# 3. Reads and session-only statements in flight: resent

for m in MODES:
    add(
        "autocommit-select",
        m,
        ["SELECT id FROM t ORDER BY id", "SELECT 1"],
        fault(DROP, 0),
        [T, T_ROWS],
        [Alt([OK(rows=((3,), (4,))), ONE], {QT: [(3, "c"), (4, "d")]})],
    )
    add("set-user-var", m, ["SET @x = 5", "SELECT @x"], fault(DROP, 0), [], [Alt([OK(), OK(rows=((5,),))], {})])
RESENT = [
    ("use-db", ["USE test", "SELECT DATABASE()"], [OK(), OK(rows=(("test",),))], NO_ROUTINES),
    (
        "set-sql-mode",
        ["SET SESSION sql_mode = 'ANSI_QUOTES'", "SELECT @@SESSION.sql_mode"],
        [OK(), OK(rows=(("ANSI_QUOTES",),))],
        NO_ROUTINES,
    ),
    ("set-statement-for-select", ["SET STATEMENT max_statement_time = 10 FOR SELECT 1", "SELECT 2"], [ONE, OK(rows=((2,),))], ROUTINES),
    ("comment-999999-function-skipped", ["SELECT 1 /*!999999 + f() */", "SELECT 2"], [ONE, OK(rows=((2,),))], ROUTINES),
    (
        "comment-M999999-insert-skipped",
        ["/*M!999999 INSERT INTO d VALUES ('m9') */ SELECT 2", "SELECT 1"],
        [OK(rows=((2,),)), ONE],
        NO_ROUTINES,
    ),
    ("show", ["SHOW TABLES LIKE 'd'", "SELECT 1"], [OK(rows=(("d",),)), ONE], NO_ROUTINES),
]
for label, script, exp, tables in RESENT:
    add(label, "default", script, fault(DROP, 0), tables, [Alt(exp, {QD: [], QM: [(0,)]})])
add(
    "multi-selects",
    "default",
    ["SELECT 1; SELECT 2", "SELECT 3"],
    fault(DROP, 0),
    [],
    [Alt([OK(results=[((1,),), ((2,),)]), OK(rows=((3,),))], {})],
    multi=True,
)
add(
    "multi-set-vars",
    "default",
    ["SET @a = 1; SET @b = 2", "SELECT @a, @b"],
    fault(DROP, 0),
    [],
    [Alt([OK(), OK(rows=((1, 2),))], {})],
    multi=True,
)

# What the previous statement left (FOUND_ROWS(), warnings) stays on the lost connection: a read
# of it on the new one is a 1158, never the restore statements' numbers; a replayed transaction
# or a multi-statement text that makes them again is fine.
CALC = "SELECT SQL_CALC_FOUND_ROWS id FROM t ORDER BY id LIMIT 1"
for label, script, flt, exp, kw in (
    ("found-rows-after-idle-loss", [CALC, "SELECT FOUND_ROWS()"], fault(IDLE, 1), [OK(rows=((3,),)), CONN], {}),
    ("warnings-after-idle-loss", ["SELECT CAST('1x' AS SIGNED)", "SHOW WARNINGS"], fault(IDLE, 1), [OK(), CONN], {}),
    (
        "found-rows-plain-after-idle-loss",
        ["SELECT id FROM t ORDER BY id", "SELECT FOUND_ROWS()"],
        fault(IDLE, 1),
        [OK(rows=((3,), (4,))), CONN],
        {},
    ),
    ("found-rows-inflight", [CALC, "SELECT FOUND_ROWS()"], fault(DROP, 1), [OK(rows=((3,),)), CONN], {}),
    (
        "found-rows-in-tx-replayed",
        ["BEGIN", CALC, "SELECT FOUND_ROWS()", "COMMIT"],
        fault(IDLE, 2),
        [OK(), OK(rows=((3,),)), OK(rows=((2,),)), OK()],
        {},
    ),
    (
        "found-rows-multi-resent",
        [f"{CALC}; SELECT FOUND_ROWS()", "SELECT 1"],
        fault(DROP, 0),
        [OK(results=[((3,),), ((2,),)]), ONE],
        {"multi": True},
    ),
):
    add(label, "default", script, flt, [T, T_ROWS], [Alt(exp, {QT: [(3, "c"), (4, "d")]})], **kw)

# SET INSERT_ID holds until an INSERT uses it: set again after that, it would force the same id twice.
add(
    "set-insert-id-used-then-idle-loss",
    "default",
    ["SET INSERT_ID = 100", "INSERT INTO a (v) VALUES ('x')", "SELECT 1", "INSERT INTO a (v) VALUES ('y')"],
    fault(IDLE, 3),
    [A],
    [Alt([OK(), OK(), ONE, OK()], {QA: [(100, "x"), (101, "y")]})],
)
add(
    "set-insert-id-pending-then-idle-loss",
    "default",
    ["SET INSERT_ID = 100", "SELECT 1", "INSERT INTO a (v) VALUES ('x')"],
    fault(IDLE, 2),
    [A],
    [Alt([OK(), ONE, OK()], {QA: [(100, "x")]})],
)

# rand_seed1/2 are used up by the next RAND(): set again later they would seed another one.
add(
    "set-rand-seed-then-idle-loss",
    "default",
    ["SET rand_seed1 = 5, rand_seed2 = 7", "SELECT 1"],
    fault(IDLE, 1),
    [],
    [Alt([OK(), CONN], {})],
)

# =============================================================================================
# 4. What the proxy cannot judge: never replayed, never resent

R = {QT: [], QD: [], QM: [(0,)]}
unjudgeable("call-proc-commits", ["CALL p()", "SELECT 1"], 0, setup=ROUTINES, before=R, after={**R, QT: [(7, "p")]}, faults=(DROP, CLOSE))
unjudgeable(
    "select-function-writes", ["SELECT f()", "SELECT 1"], 0, setup=ROUTINES, before=R, after={**R, QM: [(1,)]}, faults=(DROP, CLOSE)
)
# A view hides the stored function it calls: the text is a plain SELECT, the server runs f().
VIEWS = [*ROUTINES, "CREATE VIEW vf AS SELECT f() AS x", "CREATE VIEW `v v` AS SELECT x FROM vf"]
unjudgeable(
    "select-view-function", ["SELECT x FROM vf", "SELECT 1"], 0, setup=VIEWS, before=R, after={**R, QM: [(1,)]}, faults=(DROP, CLOSE)
)
unjudgeable(
    "select-nested-view-function",
    ["SELECT * FROM `v v` WHERE x > 0", "SELECT 1"],
    0,
    setup=VIEWS,
    before=R,
    after={**R, QM: [(1,)]},
    modes=("default",),
)
unjudgeable(
    "prepared-select-view-function",
    [Prepared("SELECT x FROM vf WHERE x > ?", (0,)), "SELECT 1"],
    0,
    setup=VIEWS,
    before=R,
    after={**R, QM: [(1,)]},
    modes=("default",),
    driver="connector",
)
add(
    "select-plain-view",
    "default",
    ["SELECT id FROM vt ORDER BY id", "SELECT 1"],
    fault(DROP, 0),
    [T, T_ROWS, "CREATE VIEW vt AS SELECT id, UPPER(v) AS v FROM t"],
    [Alt([OK(rows=((3,), (4,))), ONE], {QT: [(3, "c"), (4, "d")]})],
)
for m in MODES:
    add(
        "tx-view-function-then-loss",
        m,
        ["BEGIN", "INSERT INTO t VALUES (1, 'a')", "SELECT x FROM vf", "INSERT INTO t VALUES (2, 'b')", "COMMIT", "SELECT 1"],
        fault(IDLE, 3),
        VIEWS,
        [Alt(ended(oks(3), CONN, 2), {QT: [], QM: [(1,)]})],
    )
for label, sql in (
    ("do-function", "DO f()"),
    ("set-var-function", "SET @x = f()"),
    ("select-quoted-function", "SELECT `f`()"),
    ("select-comment-100000-function", "SELECT 1 /*!100000 + f() */"),
    ("select-comment-M100000-function", "SELECT 1 /*M!100000 + f() */"),
):
    unjudgeable(
        label,
        [sql, "SELECT 1"],
        0,
        setup=ROUTINES,
        before=R,
        after={**R, QM: [(1,)]},
        modes=MODES if label == "do-function" else ("default",),
    )
unjudgeable(
    "execute-immediate-insert",
    ["EXECUTE IMMEDIATE 'INSERT INTO d VALUES (''e'')'", "SELECT 1"],
    0,
    setup=ROUTINES,
    before=R,
    after={**R, QD: [("e",)]},
)
unjudgeable(
    "execute-immediate-select", ["EXECUTE IMMEDIATE 'SELECT 1'", "SELECT 1"], 0, setup=ROUTINES, before=R, after=R, modes=("default",)
)
unjudgeable(
    "compound-statement",
    ["BEGIN NOT ATOMIC INSERT INTO d VALUES ('b'); END", "SELECT 1"],
    0,
    setup=ROUTINES,
    before=R,
    after={**R, QD: [("b",)]},
    modes=("default", "safe_mode"),
)
unjudgeable(
    "sql-prepare-execute",
    ["PREPARE st FROM 'INSERT INTO d VALUES (''p'')'", "EXECUTE st", "SELECT 1"],
    1,
    setup=NO_ROUTINES,
    before=R,
    after={**R, QD: [("p",)]},
    modes=("default", "safe_mode"),
)
unjudgeable(
    "sequence-nextval",
    ["SELECT NEXT VALUE FOR sq", "SELECT 1"],
    0,
    setup=[SEQ],
    before={"SELECT NEXT VALUE FOR sq": [(1,)]},
    after={"SELECT NEXT VALUE FOR sq": [(2,)]},
)  # read once, last
unjudgeable(
    "spooled-select-function",
    ["SELECT 1" + " " * (5 << 20) + ", f()", "SELECT 1"],
    0,
    setup=ROUTINES,
    before=R,
    after={**R, QM: [(1,)]},
    modes=("default",),
)  # over spool_threshold: only the head is judged
unjudgeable("unknown-statement", ["CHECKSUM TABLE t", "SELECT 1"], 0, setup=[T], before={QT: []}, after={QT: []}, modes=("default",))

# Routines inside a transaction: the transaction may have committed (CALL) or left effects
# outside it (a function writing a non-transactional table): never replayed.
for m in MODES:
    add(
        "tx-call-proc-commits-then-loss",
        m,
        ["BEGIN", "INSERT INTO t VALUES (1, 'a')", "CALL p()", "INSERT INTO t VALUES (2, 'b')", "COMMIT"],
        fault(CLOSE, 3),
        ROUTINES,
        [Alt(ended(oks(3), CONN, 1), {QT: [(1, "a"), (7, "p")]})],
        sent_max={"INSERT INTO t VALUES (1": 1},
    )
    add(
        "tx-function-nontx-then-loss",
        m,
        ["BEGIN", "INSERT INTO t VALUES (1, 'a')", "SELECT f()", "INSERT INTO t VALUES (2, 'b')", "COMMIT", "SELECT 1"],
        fault(IDLE, 3),
        ROUTINES,
        [Alt(ended(oks(3), CONN, 2), {QT: [], QM: [(1,)]}), Alt([*oks(3), RETRY, OK(), ONE], {QT: [], QM: [(1,)]})],
    )
    add(
        "tx-execute-immediate-commit-then-loss",
        m,
        ["BEGIN", "INSERT INTO d VALUES ('x1')", "EXECUTE IMMEDIATE 'COMMIT'", "INSERT INTO d VALUES ('x2')", "COMMIT"],
        fault(CLOSE, 3),
        ROUTINES,
        [Alt(ended(oks(3), CONN, 1), {QD: [("x1",)]})],
    )
add(
    "tx-call-proc-nocommit-then-loss",
    "default",
    ["BEGIN", "INSERT INTO t VALUES (1, 'a')", "CALL pq()", "INSERT INTO t VALUES (2, 'b')", "COMMIT"],
    fault(IDLE, 3),
    ROUTINES,
    [Alt(ended(oks(3), CONN, 1), {QT: [], QD: []})],
)
add(
    "tx-execute-immediate-commit",
    "default",
    ["BEGIN", "INSERT INTO d VALUES ('x1')", "EXECUTE IMMEDIATE 'COMMIT'", "SELECT 1"],
    fault(DROP, 2),
    ROUTINES,
    [Alt(ended(oks(2), CONN, 1), {QD: [("x1",)]})],
)
add(
    "tx-call-proc-inflight",
    "commit_marker",
    ["BEGIN", "INSERT INTO d VALUES ('x1')", "CALL p()", "SELECT 1"],
    fault(DROP, 2),
    ROUTINES,
    [Alt(ended(oks(2), CONN, 1), {QD: [("x1",)], QT: [(7, "p")]})],
)

# MariaDB's ANALYZE <statement> runs inside the transaction (ANALYZE TABLE would commit it): a
# judge that took one for the other lost the INSERT from the journal and committed without it.
for m in MODES:
    add(
        "tx-analyze-format-json",
        m,
        ["BEGIN", "INSERT INTO t VALUES (1, 'a')", "ANALYZE FORMAT=JSON SELECT * FROM t", "INSERT INTO t VALUES (2, 'b')", "COMMIT"],
        fault(CLOSE, 3),
        [T],
        [Alt(ended(oks(3), CONN, 1), {QT: []})],
    )

# Multi-statement texts with transaction control
for m in MODES:
    for kind, data in ((DROP, {QT: [(1, "b"), (2, "x")]}), (CLOSE, {QT: [(1, "a")]})):
        add(
            "multi-update-commit",
            m,
            ["BEGIN", "INSERT INTO t VALUES (2, 'x')", "UPDATE t SET v = 'b' WHERE id = 1; COMMIT", "SELECT 1"],
            fault(kind, 2),
            [T, "INSERT INTO t VALUES (1, 'a')"],
            [Alt(ended(oks(2), CONN, 1), data)],
            multi=True,
        )
    add(
        "multi-rollback-insert",
        m,
        ["BEGIN", "INSERT INTO d VALUES ('r5')", "ROLLBACK; INSERT INTO d VALUES ('x')", "SELECT 1"],
        fault(DROP, 2),
        [D],
        [Alt(ended(oks(2), CONN, 1), {QD: [("x",)]})],
        multi=True,
    )
    add(
        "multi-autocommit0-update",
        m,
        ["SET autocommit = 0; UPDATE t SET v = 'b' WHERE id = 1", "COMMIT", "SELECT 1"],
        fault(DROP, 0),
        [T, "INSERT INTO t VALUES (1, 'a')"],
        [
            Alt(ended([], CONN, 2), {QT: [(1, "a")]}),  # the UPDATE died uncommitted with the connection
            Alt([OK(), OK(), ONE], {QT: [(1, "b")]}),
        ],
        multi=True,
    )  # or resent, then committed by the client
    add(
        "multi-begin-insert",
        m,
        ["BEGIN; INSERT INTO d VALUES ('x')", "COMMIT", "SELECT 1"],
        fault(DROP, 0),
        [D],
        [Alt(ended([], CONN, 2), {QD: []}), Alt([RETRY, OK(), ONE], {QD: []})],
        multi=True,
    )
add(
    "multi-begin-insert-in-tx",
    "default",
    ["BEGIN", "INSERT INTO d VALUES ('x')", "BEGIN; INSERT INTO d VALUES ('y')", "SELECT 1"],
    fault(DROP, 2),
    [D],
    [Alt(ended(oks(2), CONN, 1), {QD: [("x",)]})],
    multi=True,
)
add(
    "multi-begin-insert-in-tx",
    "commit_marker",
    ["BEGIN", "INSERT INTO d VALUES ('x')", "BEGIN; INSERT INTO d VALUES ('y')", "SELECT 1"],
    fault(CLOSE, 2),
    [D],
    [Alt(ended(oks(2), CONN, 1), {QD: []})],
    multi=True,
)
add(
    "multi-insert-commit-autocommit",
    "default",
    ["INSERT INTO d VALUES ('x'); COMMIT", "SELECT 1"],
    fault(DROP, 0),
    [D],
    [Alt(ended([], CONN, 1), {QD: [("x",)]})],
    multi=True,
)
add(
    "multi-autocommit1-insert",
    "safe_mode",
    ["SET autocommit = 0", "REPLACE INTO t VALUES (1, 'a')", "SET autocommit = 1; REPLACE INTO t VALUES (2, 'b')", "SELECT 1"],
    fault(DROP, 2),
    [T],
    [Alt(ended(oks(2), CONN, 1), {QT: [(1, "a"), (2, "b")]}), Alt(oks(3) + [ONE], {QT: [(1, "a"), (2, "b")]})],
    multi=True,
)
add(
    "multi-call-select",
    "default",
    ["CALL pq(); SELECT 1", "SELECT 2"],
    fault(DROP, 0),
    ROUTINES,
    [Alt(ended([], CONN, 1), {QD: [("pq",)]})],
    multi=True,
)

# DM's full load ends each table with ALTER TABLE ... AUTO_INCREMENT=N (Lightning's logical
# import). Its answer lost to a crash stopped the task through every middle (issue 27's SIGKILL
# run: ErrRestoreTable). Setting AUTO_INCREMENT to a number twice leaves what once does: safe
# mode sends it again; the other modes cannot tell whether it ran.
inflight("ddl-set-auto-increment", ["ALTER TABLE a AUTO_INCREMENT = 100", "SELECT 1"], 0, setup=[A],
         before={"SELECT COUNT(*) FROM a": [(0,)]}, after={"SELECT COUNT(*) FROM a": [(0,)]}, idem=True,
         modes=("default", "safe_mode"))  # fmt: skip

# =============================================================================================
# 5. Implicit commits that fail: an ERR has no status word

for label, ddl, code in (
    ("create-existing", "CREATE TABLE d (v INT)", 1050),
    ("drop-missing", "DROP TABLE nosuch", 1051),
    ("alter-missing", "ALTER TABLE nosuch ADD c INT", 1146),
):
    script = ["BEGIN", "INSERT INTO d VALUES ('x1')", ddl, "INSERT INTO d VALUES ('x2')", "SELECT 1"]
    pre = [OK(), OK(), err(code)]
    for m in MODES if label == "create-existing" else ("default", "commit_marker"):
        # The failed DDL committed x1; x2 runs in autocommit mode.
        closed = [Alt(ended(pre, CONN, 1), {QD: [("x1",)]})]
        dropped = [Alt(ended(pre, CONN, 1), {QD: [("x1",), ("x2",)]})]
        if m == "commit_marker":  # resolved exactly, or a connection error if the proxy is not sure it was autocommit
            closed.append(Alt([*pre, OK(), ONE], {QD: [("x1",), ("x2",)]}))
            dropped.append(Alt([*pre, OK(), ONE], {QD: [("x1",), ("x2",)]}))
        add(f"tx-failed-ddl-{label}", m, script, fault(CLOSE, 3), [D], closed, sent_max={"INSERT INTO d VALUES ('x1')": 1})
        if label == "create-existing":
            add(f"tx-failed-ddl-{label}", m, script, fault(DROP, 3), [D], dropped, sent_max={"INSERT INTO d VALUES ('x1')": 1})
            add(
                f"tx-failed-ddl-{label}",
                m,
                script,
                fault(IDLE, 3),
                [D],
                [Alt(ended(pre, CONN, 1), {QD: [("x1",)]}), Alt([*pre, OK(), ONE], {QD: [("x1",), ("x2",)]})],
                sent_max={"INSERT INTO d VALUES ('x1')": 1},
            )
add(
    "tx-failed-ddl-then-commit",
    "default",
    ["BEGIN", "INSERT INTO d VALUES ('x1')", "CREATE TABLE d (v INT)", "COMMIT", "SELECT 1"],
    fault(DROP, 3),
    [D],
    [Alt(ended([OK(), OK(), err(1050)], CONN, 1), {QD: [("x1",)]}), Alt([OK(), OK(), err(1050), OK(), ONE], {QD: [("x1",)]})],
    sent_max={"INSERT INTO d VALUES ('x1')": 1},
)

# =============================================================================================
# 6. XA: a prepared branch survives its connection; XA PREPARE / COMMIT in flight -> connection error

XA_SCRIPT = ["XA START {xid}", "INSERT INTO t VALUES (1, 'a')", "XA END {xid}", "XA PREPARE {xid}", "XA COMMIT {xid}", "SELECT 1"]
for m in MODES:
    add("xa-prepare", m, XA_SCRIPT, fault(DROP, 3), [T], [Alt(ended(oks(3), CONN, 2), {QT: [], XA_PREPARED: [("{xid}",)]})], xa=True)
    add("xa-commit", m, XA_SCRIPT, fault(DROP, 4), [T], [Alt(ended(oks(4), CONN, 1), {QT: [(1, "a")], XA_PREPARED: []})], xa=True)
add("xa-prepare", "default", XA_SCRIPT, fault(CLOSE, 3), [T], [Alt(ended(oks(3), CONN, 2), {QT: [], XA_PREPARED: []})], xa=True)
add("xa-commit", "default", XA_SCRIPT, fault(CLOSE, 4), [T], [Alt(ended(oks(4), CONN, 1), {QT: [], XA_PREPARED: [("{xid}",)]})], xa=True)
add(
    "xa-prepare",
    "default",
    XA_SCRIPT,
    fault(STALL, 3, seconds=STALL_SECONDS),
    [T],
    [Alt(oks(5) + [ONE], {QT: [(1, "a")], XA_PREPARED: []})],
    xa=True,
)
add(
    "xa-commit-one-phase",
    "default",
    ["XA START {xid}", "INSERT INTO t VALUES (1, 'a')", "XA END {xid}", "XA COMMIT {xid} ONE PHASE", "SELECT 1"],
    fault(DROP, 3),
    [T],
    [Alt(ended(oks(3), CONN, 1), {QT: [(1, "a")], XA_PREPARED: []})],
    xa=True,
)
for m in ("default", "commit_marker"):
    add(
        "xa-active-insert",
        m,
        XA_SCRIPT,
        fault(CLOSE, 1),
        [T],
        [Alt(ended(oks(1), CONN, 4), {QT: [], XA_PREPARED: []}), Alt([OK(), RETRY, *[ANY] * 4], {QT: [], XA_PREPARED: []})],
        xa=True,
    )
add(
    "xa-end",
    "default",
    XA_SCRIPT,
    fault(DROP, 2),
    [T],
    [Alt(ended(oks(2), CONN, 3), {QT: [], XA_PREPARED: []}), Alt([OK(), OK(), RETRY, *[ANY] * 3], {QT: [], XA_PREPARED: []})],
    xa=True,
)

# =============================================================================================
# 7. Idle, the server closes the connection: the next statement just works, session unchanged

for m in MODES:
    add(
        "last-insert-id-after-idle-close",
        m,
        ["INSERT INTO a (v) VALUES ('x')", "SELECT LAST_INSERT_ID()", "SELECT 1"],
        fault(IDLE, 1),
        [A],
        [Alt([OK(), OK(rows=((41,),)), ONE], {QA: [(41, "x")]})],
    )
    add(
        # '0' generates an id as 0 does: LAST_INSERT_ID() is 41, not what came before (the
        # proxy once took the quoted 0 for an id the statement gave).
        "last-insert-id-quoted-zero-after-idle-close",
        m,
        ["INSERT INTO a (id, v) VALUES (7, 'p')", "INSERT INTO a (id, v) VALUES ('0', 'x')", "SELECT LAST_INSERT_ID()", "SELECT 1"],
        fault(IDLE, 2),
        [A],
        [Alt([OK(), OK(), OK(rows=((41,),)), ONE], {QA: [(7, "p"), (41, "x")]})],
    )
    add(
        "autocommit-off-restored",
        m,
        ["SET autocommit = 0", "INSERT INTO t VALUES (1, 'a')", "COMMIT", "INSERT INTO t VALUES (2, 'b')", "ROLLBACK", "SELECT 1"],
        fault(IDLE, 3),
        [T],
        [Alt(oks(5) + [ONE], {QT: [(1, "a")]})],
    )
SESSION = [
    ("user-var", ["SET @x = 'hello'", "SELECT @x"], OK(rows=(("hello",),))),
    ("sql-mode", ["SET SESSION sql_mode = 'ANSI_QUOTES'", "SELECT @@SESSION.sql_mode"], OK(rows=(("ANSI_QUOTES",),))),
    (
        "sql-mode-expression",
        ["SET SESSION sql_mode = CONCAT('ANSI_', 'QUOTES')", "SELECT @@SESSION.sql_mode"],
        OK(rows=(("ANSI_QUOTES",),)),
    ),
    ("time-zone", ["SET time_zone = '+05:00'", "SELECT @@time_zone"], OK(rows=(("+05:00",),))),
    ("use-db", ["USE test", "SELECT DATABASE()"], OK(rows=(("test",),))),
    ("set-names", ["SET NAMES latin1", "SELECT @@character_set_client"], OK(rows=(("latin1",),))),
    ("insert-id-set", ["SELECT LAST_INSERT_ID(77)", "SELECT LAST_INSERT_ID()"], OK(rows=((77,),))),
]
for label, script, exp in SESSION:
    add(f"session-{label}-after-idle-close", "default", script, fault(IDLE, 1), [], [Alt([OK(), exp], {})])
add(
    "session-user-var-expression-after-idle-close",
    "default",
    ["SET @x = 5", "SET @y = @x + 1", "SELECT @y"],
    fault(IDLE, 2),
    [],
    [Alt([OK(), OK(), OK(rows=((6,),))], {}), Alt([OK(), OK(), CONN], {})],
)
for label, first in (
    ("temporary-table", "CREATE TEMPORARY TABLE tmp (i INT)"),
    ("get-lock", "SELECT GET_LOCK('rc_lock', 0)"),
    ("lock-tables", "LOCK TABLES t WRITE"),
):
    add(
        f"unrestorable-{label}-after-idle-close",
        "default",
        [first, "SELECT 1", "SELECT 2"],
        fault(IDLE, 1),
        [T],
        [Alt(ended([OK()], CONN, 1), {})],
    )
add(
    "call-then-idle-close",
    "default",
    ["CALL pq()", "SELECT 1"],
    fault(IDLE, 1),
    ROUTINES,
    [Alt([OK(), ONE], {QD: [("pq",)]}), Alt([OK(), CONN], {QD: [("pq",)]})],
)

# =============================================================================================
# 8. A result partly relayed: the client's connection closes, never garbage

SEL = "SELECT id, v FROM t ORDER BY id"
for at in (3, 80, 700, 5000):
    add(
        "select-big",
        "default",
        [SEL, "SELECT 1"],
        fault(CUT, 0, at=at),
        BIG_SETUP,
        [Alt([either(OK(rows=BIG_ROWS), CONN), ANY], {"SELECT COUNT(*) FROM t": [(200,)]})],
    )
for m in ("commit_marker", "safe_mode"):
    add(
        "select-big",
        m,
        [SEL, "SELECT 1"],
        fault(CUT, 0, at=700),
        BIG_SETUP,
        [Alt([either(OK(rows=BIG_ROWS), CONN), ANY], {"SELECT COUNT(*) FROM t": [(200,)]})],
    )
for m in MODES:
    script = ["BEGIN", "INSERT INTO d VALUES ('x')", SEL, "INSERT INTO d VALUES ('y')", "COMMIT"]
    add(
        "tx-select-big",
        m,
        script,
        fault(CUT, 2, at=700),
        [*BIG_SETUP, D],
        [Alt(ended(oks(2), CONN, 2), {QD: []}), Alt([OK(), OK(), OK(rows=BIG_ROWS), OK(), OK()], {QD: [("x",), ("y",)]})],
    )
add(
    "multi-select-big-second",
    "default",
    ["SELECT 1; " + SEL, "SELECT 1"],
    fault(CUT, 0, at=900),
    BIG_SETUP,
    [Alt([either(OK(results=[((1,),), BIG_ROWS]), CONN), ANY], {})],
    multi=True,
)
add(
    "prepared-select-big",
    "default",
    [Prepared("SELECT id, v FROM t WHERE id > ? ORDER BY id", (0,)), "SELECT 1"],
    fault(CUT, 0, at=700),
    BIG_SETUP,
    [Alt([either(OK(rows=BIG_ROWS), CONN), ANY], {})],
    driver="connector",
)
for m in MODES:  # the OK was relayed whole, then the connection closed: the next statement replays
    add(
        "tx-ok-relayed-then-closed",
        m,
        ["BEGIN", "INSERT INTO t VALUES (1, 'a')", "INSERT INTO t VALUES (2, 'b')", "COMMIT"],
        fault(CUT, 1, at=1000),
        [T],
        [Alt(oks(4), TX_DONE)],
    )

# =============================================================================================
# 9. An answer that comes late but comes: nothing happens

add(
    "autocommit-insert",
    "default",
    ["INSERT INTO t VALUES (1, 'a')", "SELECT 1"],
    fault(STALL, 0, seconds=STALL_SECONDS),
    [T],
    [Alt([OK(affected=1), ONE], {QT: [(1, "a")]})],
)
add(
    "autocommit-select",
    "safe_mode",
    [SEL, "SELECT 1"],
    fault(STALL, 0, seconds=STALL_SECONDS),
    BIG_SETUP,
    [Alt([OK(rows=BIG_ROWS), ONE], {})],
)
add(
    "call-proc",
    "commit_marker",
    ["CALL p()", "SELECT 1"],
    fault(STALL, 0, seconds=STALL_SECONDS),
    ROUTINES,
    [Alt([OK(), ONE], {QT: [(7, "p")]})],
)

# =============================================================================================
# 10. An operator's KILL of the proxy's backend connection: an error, never undone by a replay

for m in MODES:
    add(
        "kill-select-sleep",
        m,
        ["SELECT SLEEP(5)", "SELECT 1"],
        fault(KILL, 0, running=True),
        [],
        [Alt([KILLED, AFTER_ERROR], {})],
        sent_max={"SELECT SLEEP": 1},
    )
    add(
        "kill-tx-select-sleep",
        m,
        ["BEGIN", "INSERT INTO d VALUES ('k')", "SELECT SLEEP(5)", "COMMIT", "SELECT 1"],
        fault(KILL, 2, running=True),
        [D],
        [Alt([OK(), OK(), KILLED, AFTER_ERROR, AFTER_ERROR], {QD: []})],
        sent_max={"SELECT SLEEP": 1, "INSERT INTO d": 1},
    )
    add("kill-idle", m, ["SET @x = 5", "SELECT @x", "SELECT 1"], fault(KILL, 1), [], [Alt([OK(), KILLED, AFTER_ERROR], {})])
    add(
        "kill-idle-in-tx",
        m,
        ["BEGIN", "INSERT INTO d VALUES ('k')", "INSERT INTO d VALUES ('l')", "COMMIT", "SELECT 1"],
        fault(KILL, 2),
        [D],
        [Alt([OK(), OK(), KILLED, AFTER_ERROR, AFTER_ERROR], {QD: []})],
        sent_max={"INSERT INTO d VALUES ('k')": 1},
    )
add(
    "kill-update-running",
    "safe_mode",
    ["UPDATE n SET v = v + 1 + SLEEP(5) WHERE id = 1", "SELECT 1"],
    fault(KILL, 0, running=True),
    N,
    [Alt([KILLED, AFTER_ERROR], {QN: N0})],
    sent_max={"UPDATE n": 1},
)

# =============================================================================================
# 11. TiDB only: optimistic transactions (DM's tidb_txn_mode), the commit-marker table, DM's safe mode

OPTIMISTIC = "SET tidb_txn_mode = 'optimistic'"
TIDB = ("tidb",)
T1 = [T, "INSERT INTO t VALUES (1, 'orig')"]

# An in-doubt COMMIT of an optimistic transaction: the marker row commits with it, or not at all.
inflight(
    "tidb-optimistic-tx",
    [OPTIMISTIC, "BEGIN", "INSERT INTO t VALUES (1, 'a')", "INSERT INTO t VALUES (2, 'b')", "COMMIT", "SELECT @@tidb_txn_mode"],
    4,
    setup=[T],
    before={QT: []},
    after={QT: [(1, "a"), (2, "b")]},
    idem=False,
    flavors=TIDB,
)
# ... and its marker's upsert lost: replayed in optimistic mode (the session's), marked, committed once.
marker_lost("tidb-optimistic-tx-marker-lost", [OPTIMISTIC, "BEGIN", "INSERT INTO t VALUES (1, 'a')", "COMMIT", "SELECT 1"], 3,
            {QT: [(1, "a")]}, flavors=TIDB)  # fmt: skip
# Optimistic mode checks keys at COMMIT: 1062 there, the transaction is over; then the connection
# is lost before the next one (DM sleeps between retries) or inside it.
DUP = [
    OPTIMISTIC,
    "BEGIN",
    "INSERT INTO t VALUES (1, 'dup')",
    "COMMIT",
    "BEGIN",
    "INSERT INTO t VALUES (2, 'b')",
    "COMMIT",
    "SELECT @@tidb_txn_mode",
]
DUP_SEEN = [OK(), OK(), OK(), err(1062), OK(), OK(), OK(), OK(rows=(("optimistic",),))]
DUP_DONE = {QT: [(1, "orig"), (2, "b")]}
for flt in (fault(IDLE, 4), fault(CLOSE, 5), fault(DROP, 6)):
    for m in MODES:
        seen = DUP_SEEN
        if flt.kind == DROP and m != "commit_marker":  # the second COMMIT in doubt, no marker to say
            seen = ended(DUP_SEEN[:6], CONN, 1)
        add("tidb-optimistic-dup-at-commit-then-loss", m, DUP, flt, T1, [Alt(seen, DUP_DONE)], flavors=TIDB)
# A write conflict: 9007 at COMMIT (DM retries it), then a loss before the retry.
THEIRS = {3: ["UPDATE t SET v = 'theirs' WHERE id = 1"]}
CONFLICT = [
    OPTIMISTIC,
    "BEGIN",
    "UPDATE t SET v = 'mine' WHERE id = 1",
    "COMMIT",
    "BEGIN",
    "UPDATE t SET v = 'mine' WHERE id = 1",
    "COMMIT",
    "SELECT v FROM t WHERE id = 1",
]
same_everywhere(
    "tidb-optimistic-conflict-then-loss",
    CONFLICT,
    fault(IDLE, 4),
    setup=T1,
    before=THEIRS,
    flavors=TIDB,
    alts=[Alt([OK(), OK(), OK(affected=1), err(9007), OK(), OK(affected=1), OK(), OK(rows=(("mine",),))], {QT: [(1, "mine")]})],
)
# ... and the 9007 itself lost: the transaction did not commit, so a marker says replay; safe mode
# replays the keyed constant UPDATE; either way it then applies after theirs.
for m in MODES:
    done = [Alt(ended(oks(3), CONN, 0), {QT: [(1, "theirs")]})] if m == "default" else [Alt(oks(4), {QT: [(1, "mine")]})]
    add("tidb-optimistic-conflict-inflight", m, CONFLICT[:4], fault(DROP, 3), T1, done, before=THEIRS, flavors=TIDB)
# DM's safe mode (dm/syncer, pkg/sqlmodel): its session, then a batch of REPLACE, DELETE ... LIMIT 1,
# UPDATE as DELETE + REPLACE, a multi-row upsert; the COMMIT in doubt.
DM_SESSION = (
    "SET sql_mode = 'ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,"
    "NO_AUTO_CREATE_USER,NO_ENGINE_SUBSTITUTION', time_zone = '+00:00', tidb_txn_mode = 'optimistic', "
    "foreign_key_checks = 0"
)
inflight(
    "tidb-dm-safe-mode-batch",
    [
        DM_SESSION,
        "START TRANSACTION",
        "REPLACE INTO t (id, v) VALUES (1, 'a')",
        "REPLACE INTO t (id, v) VALUES (2, 'b')",
        "DELETE FROM t WHERE id = 3 LIMIT 1",
        "DELETE FROM t WHERE id = 4 LIMIT 1",
        "REPLACE INTO t (id, v) VALUES (4, 'D')",
        "INSERT INTO t (id, v) VALUES (5, 'e'), (2, 'B') ON DUPLICATE KEY UPDATE v = VALUES(v)",
        "COMMIT",
        "SELECT @@tidb_txn_mode, @@time_zone, @@foreign_key_checks",
    ],
    8,
    setup=[T, T_ROWS],
    before={QT: [(3, "c"), (4, "d")]},
    after={QT: [(1, "a"), (2, "B"), (4, "D"), (5, "e")]},
    idem=True,
    post=[OK(rows=(("optimistic", "+00:00", 0),))],
    flavors=TIDB,
)
# DM outside safe mode (dm/syncer/dml_worker.go genSQLs) updates a row as UPDATE ... SET every
# column ... WHERE the key; with a unique key among the columns, the keys do not prove a second
# run harmless: here the first UPDATE run again would take 'e' from row 2 (1062). The sidecar's
# pair of modes settles it by its marker instead of a 1158 (the soak's one safe-mode refusal).
U = "CREATE TABLE u (id INT PRIMARY KEY, email VARCHAR(64) NOT NULL, UNIQUE KEY uk_email (email))"
QU = "SELECT id, email FROM u ORDER BY id"
inflight(
    "dm-update-unique-key",
    [
        "START TRANSACTION",
        "UPDATE u SET id = 1, email = 'e' WHERE id = 1 LIMIT 1",
        "UPDATE u SET id = 1, email = 'e2' WHERE id = 1 LIMIT 1",
        "UPDATE u SET id = 2, email = 'e' WHERE id = 2 LIMIT 1",
        "COMMIT",
        "SELECT 1",
    ],
    4,
    setup=[U, "INSERT INTO u VALUES (1, 'p'), (2, 'q')"],
    before={QU: [(1, "p"), (2, "q")]},
    after={QU: [(1, "e2"), (2, "e")]},
    idem=False,
    modes=("safe_mode", "safe_mode_marker"),
)

# DM's DDL-status read (dm/syncer/util.go, after a DDL lost its connection) is a read that ends
# nothing: its answer lost inside a transaction, the transaction is replayed and it is sent
# again (as an unknown statement it made the session unrestorable: 1158).
for m in MODES:
    add(
        "tidb-admin-show-ddl-jobs-in-tx",
        m,
        ["BEGIN", "INSERT INTO t VALUES (5, 'e')", "ADMIN SHOW DDL JOBS 10", "COMMIT", "SELECT 1"],
        fault(DROP, 2),
        [T, T_ROWS],
        [Alt([OK(), OK(), OK(), OK(), ONE], {QT: [(3, "c"), (4, "d"), (5, "e")]})],
        flavors=TIDB,
    )

# A DDL whose answer was lost, settled by TiDB's DDL job list (proxy.recovery.ddljobs, as DM
# does): the server ran it (drop) -> its job is done -> OK; the server never got it (close) ->
# no job, the old session gone -> sent again; the job failed -> TiDB's error. In every mode, and
# the job ran once (one job of its text, the table's column or index once).
JOB = "SELECT QUERY FROM information_schema.DDL_JOBS WHERE DB_NAME = DATABASE() AND QUERY LIKE '{} %'"
for m in MODES:
    for kind in (DROP, CLOSE):
        add(
            "tidb-ddl-create-lost",
            m,
            ["CREATE TABLE c (id INT PRIMARY KEY)", "INSERT INTO c VALUES (1)", "SELECT 1"],
            fault(kind, 0),
            [],
            [Alt([OK(), OK(), ONE], {"SELECT id FROM c": [(1,)], JOB.format("CREATE TABLE"): [("CREATE TABLE c (id INT PRIMARY KEY)",)]})],
            flavors=TIDB,
        )
        # DM's shape: BEGIN, the DDL, COMMIT (dm/pkg/conn: ExecuteSQLWithIgnoreError).
        add(
            "tidb-ddl-dm-tx",
            m,
            ["BEGIN", "ALTER TABLE t ADD COLUMN note VARCHAR(8)", "COMMIT", "INSERT INTO t (id, v, note) VALUES (9, 'i', 'n')", "SELECT 1"],
            fault(kind, 1),
            [T],
            [Alt([*oks(4), ONE], {"SELECT id, v, note FROM t": [(9, "i", "n")],
                                  JOB.format("ALTER TABLE"): [("ALTER TABLE t ADD COLUMN note VARCHAR(8)",)]})],
            flavors=TIDB,
        )  # fmt: skip
    add(
        "tidb-ddl-failed-lost",
        m,
        ["ALTER TABLE d ADD UNIQUE INDEX uv (v)", "SELECT 1"],
        fault(DROP, 0),
        [D, "INSERT INTO d VALUES ('x'), ('x')"],
        [
            Alt(
                [err(1062), ONE],
                {"SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'd'": [(0,)]},
            )
        ],
        flavors=TIDB,
    )

# =============================================================================================
# 12. The backend unreachable (a real partition: netfilter drops every packet to and from the
# address, health checks included) and the server's wait_timeout

# The proxy finds the address dead (backend.dead_after, 3 s here) and cuts the connection with a
# reset, so nothing it sent is delivered when the partition heals: what is in flight is judged
# as any lost command (a read resent, a write unknown: a connection error, a COMMIT settled by
# its marker), and recovery waits for the server within the buffer window.
PARTITION_SECONDS = 9.0
PART_FAULT = "partition"
for m in MODES:
    add("partition-read", m, [T_ROWS, "SELECT COUNT(*) FROM t"], fault(PART_FAULT, 1, seconds=PARTITION_SECONDS), [T],
        [Alt([OK(), OK(rows=((2,),))], {QT: [(3, "c"), (4, "d")]})])  # fmt: skip
PART_TX = ["BEGIN", "INSERT INTO t VALUES (1, 'a')", "INSERT INTO t VALUES (2, 'b')", "COMMIT"]
PART_TX_DONE = [Alt(oks(4), {QT: [(1, "a"), (2, "b")]})]
add("partition-in-transaction", "default", PART_TX, fault(PART_FAULT, 2, seconds=PARTITION_SECONDS), [T], PART_TX_DONE)
# On TiDB the old connection outlives the partition with its transaction open (the proxy's reset
# was dropped; something on TiDB's side, presumably its TCP keepalive, ends it seconds later),
# and a KILL of it would crash tidb-server builds without pingcap/tidb#63992: the proxy leaves it
# alone, says so, and replays the journal, whose INSERTs wait for the old transaction's locks to
# go with it.
add("partition-in-transaction-old-connection-left", "default", PART_TX, fault(PART_FAULT, 2, seconds=PARTITION_SECONDS), [T],
    PART_TX_DONE, flavors=TIDB, log_has="not killing old backend connection")  # fmt: skip
inflight(
    "partition-autocommit-insert",
    ["INSERT INTO t VALUES (1, 'a')", "SELECT 1"],
    0,
    setup=[T],
    before={QT: []},
    after={QT: [(1, "a")]},
    idem=False,
    faults=(PART_FAULT,),
    fault_params={"seconds": PARTITION_SECONDS},
)
inflight(
    "partition-commit",
    ["BEGIN", "INSERT INTO t VALUES (1, 'a')", "COMMIT", "SELECT 1"],
    2,
    setup=[T],
    before={QT: []},
    after={QT: [(1, "a")]},
    idem=False,
    faults=(PART_FAULT,),
    fault_params={"seconds": PARTITION_SECONDS},
)

# The server closes a connection idle past its wait_timeout (the session's own, set here): the
# proxy opens a new one at the next command, not at once (``log_has``), with the session's
# state; in a transaction the server rolled it back, so the journal is replayed.
WAIT_TIMEOUT = "SET SESSION wait_timeout = 2"
LAZY = "a new one at the next command"
add("wait-timeout-idle", "default", [WAIT_TIMEOUT, "SET @v = 5", "SELECT @v, @@SESSION.wait_timeout"], fault(WT, 2, seconds=2), [],
    [Alt([OK(), OK(), OK(rows=((5, 2),))], {})], log_has=LAZY)  # fmt: skip
add(
    "wait-timeout-in-transaction",
    "default",
    [WAIT_TIMEOUT, "BEGIN", "INSERT INTO t VALUES (1, 'a')", "INSERT INTO t VALUES (2, 'b')", "COMMIT"],
    fault(WT, 3, seconds=2),
    [T],
    [Alt(oks(5), {QT: [(1, "a"), (2, "b")]})],
)

# =============================================================================================


def _ids_unique() -> None:
    seen: dict[str, int] = {}
    for case in CASES:
        if case.id in seen:
            seen[case.id] += 1
            case.id = f"{case.id}#{seen[case.id]}"
        else:
            seen[case.id] = 1


_ids_unique()

# ---------------------------------------------------------------------------------------------
# On TiDB (tidb-server v8.5.3): what it lacks, and where it does something else (measured)

_NOT_ON_TIDB = {
    "stored functions and procedures (TiDB has none)": ("CREATE FUNCTION", "CREATE PROCEDURE"),
    "triggers (TiDB has none)": ("CREATE TRIGGER",),
}
MARIADB_ONLY = {
    **dict.fromkeys(("analyze-update", "tx-analyze-format-json"), "ANALYZE <statement> is MariaDB's (TiDB: a syntax error)"),
    **dict.fromkeys(("set-statement-for-insert", "set-statement-for-select"), "SET STATEMENT ... FOR is MariaDB's"),
    **dict.fromkeys(
        ("execute-immediate-insert", "execute-immediate-select", "tx-execute-immediate-commit", "tx-execute-immediate-commit-then-loss"),
        "EXECUTE IMMEDIATE is MariaDB's",
    ),
    "compound-statement": "BEGIN NOT ATOMIC is MariaDB's",
    **dict.fromkeys(
        ("set-insert-id-used-then-idle-loss", "set-insert-id-pending-then-idle-loss"),
        "TiDB accepts SET INSERT_ID and ignores it: the INSERT takes the next AUTO_INCREMENT value",
    ),
    **dict.fromkeys(
        ("found-rows-after-idle-loss", "found-rows-inflight", "found-rows-in-tx-replayed", "found-rows-multi-resent"),
        "SQL_CALC_FOUND_ROWS is a no-op on TiDB (1235 without tidb_enable_noop_functions)",
    ),
    "tx-readonly-commit-any-mode": "START TRANSACTION READ ONLY is a no-op on TiDB (1235 without tidb_enable_noop_functions)",
    "autocommit-replace-invisible-column": "INVISIBLE columns are MariaDB's",
    "autocommit-replace-table-names-differ-in-case": "TiDB compares table names without case (lower_case_table_names = 2)",
}


def _tidb_alts(case: Case) -> list[Alt] | None:
    """What TiDB does where it differs from MariaDB; None: the same."""
    pattern, kind, mode = case.id.split("/")[0], case.fault.kind if case.fault else None, case.mode
    # A DDL in doubt is found in TiDB's DDL job list (section 11): it ran once, the client gets OK.
    if pattern == "ddl-set-auto-increment":
        return [Alt([OK(), ONE], {"SELECT COUNT(*) FROM a": [(0,)]})]
    # TiDB reads 5 version digits: /*!999999 ... */ is /*!99999 and then the code "9 ...", a syntax error
    # (so is /*!100000 ...); the proxy judges such a text as TiDB does: unknown, never resent.
    if pattern in ("comment-999999-show-then-insert", "comment-100000-insert"):
        return [Alt(ended([], CONN, 1), {QD: []})]
    if pattern == "comment-100000-commit":
        return [Alt(ended(oks(2), CONN, 1), {QT: []})]
    if pattern == "comment-999999-commit-is-noop":
        return [Alt(ended(oks(2), CONN, 3), {QD: []})]
    if pattern == "comment-999999-commit-then-loss":  # the syntax error leaves the transaction open
        return [Alt([OK(), OK(), err(1064), OK(), OK(), ONE], {QD: [("x1",), ("x2",)]})]
    if pattern == "comment-100000-begin":  # no transaction: x2 is an autocommit write in flight
        return [Alt([err(1064), OK(), CONN, SKIP, SKIP], {QD: [("x1",)]})]
    if pattern == "comment-M100000-insert":  # /*M! is a comment on TiDB: an empty statement, resent
        return [Alt([OK(), ONE], {QD: []})]
    # TiDB accepts COMMIT AND CHAIN and opens no new transaction: what follows runs in autocommit.
    if pattern in ("chain-then-loss", "comment-Mx-chain-then-loss") and kind == CLOSE:
        return [Alt(ended(oks(4), CONN, 2), {QD: [("x1",), ("x2",)]})]
    if pattern == "chain-work-norelease-then-loss":  # COMMIT WORK ... NO RELEASE: a syntax error on TiDB
        return [Alt([OK(), OK(), err(1064), OK(), OK(), OK(), ONE], {QD: [("x1",), ("x2",), ("x3",)]})]
    if pattern in ("commit-chain", "comment-Mx-commit-chain") and mode == "commit_marker":
        return [Alt(oks(5) + [ONE], {QT: [(1, "a"), (2, "b")]})]  # the ROLLBACK has nothing to roll back
    # A failed ALTER of a missing table does not commit the open transaction on TiDB (MariaDB's
    # does): the proxy cannot tell, so the loss after it is a connection error, and x1 is gone.
    if pattern == "tx-failed-ddl-alter-missing":
        return [Alt(ended([OK(), OK(), err(1146)], CONN, 1), {QD: []})]
    return None


def _flavors() -> None:
    for case in CASES:
        pattern = case.id.split("/")[0]
        setup = " ".join(case.setup)
        reason = MARIADB_ONLY.get(pattern) or ("XA transactions (TiDB has none)" if case.xa else None)
        reason = reason or next((why for why, needles in _NOT_ON_TIDB.items() if any(n in setup for n in needles)), None)
        if reason is not None:
            assert "tidb" not in case.flavors or case.flavors == FLAVORS, case.id
            case.flavors, case.mariadb_only = ("mariadb",), reason
        elif "tidb" in case.flavors:
            case.tidb_alts = _tidb_alts(case)
            case.check()
            if pattern in ("kill-idle", "kill-idle-in-tx", "kill-tx-select-sleep"):
                case.tidb_bug = TIDB_KILL  # (kill-select-sleep: an in-flight SLEEP is never resent anyway)


# Open: an operator's KILL on TiDB is recovered like a dropped connection. TiDB has no Com_kill
# (only tidb_server_event_total{type="kill"} on its status port's /metrics) and closes a killed
# session's socket without an error packet, so the proxy cannot tell it from a drop: it replays
# the killed transaction (the client's COMMIT then commits it) and resends a killed statement.
TIDB_KILL = "an operator's KILL on TiDB is recovered like a drop (TiDB counts no KILLs in SHOW STATUS)"


_flavors()


def _subst(text: str, xid: str) -> str:
    return text.replace("{xid}", xid)


def _read_data(res: CaseResult, queries: Sequence[str], xid: str) -> dict[str, list[tuple]]:
    data: dict[str, list[tuple]] = {}
    for q in queries:
        if q == XA_PREPARED:
            rows = res.harness.query("XA RECOVER")
            data[q] = [
                (r[3].decode() if isinstance(r[3], bytes) else r[3],)
                for r in rows
                if (r[3].decode() if isinstance(r[3], bytes) else r[3]) == xid
            ]
        else:
            data[q] = [tuple(r) for r in res.query(q)]
    return data


def _xa_cleanup(res: CaseResult, xid: str) -> None:
    for r in res.harness.query("XA RECOVER"):
        name = r[3].decode() if isinstance(r[3], bytes) else r[3]
        if name == xid:
            res.harness.query(f"XA ROLLBACK '{xid}'")


def _explain(case: Case, res: CaseResult, data: dict[str, list[tuple]]) -> str:
    lines = [f"case {case.id}", "expected one of:"]
    for i, alt in enumerate(case.alts_on(res.harness.flavor)):
        lines.append(f"  ({i + 1}) client: " + " ; ".join(f"[{j}] {e}" for j, e in enumerate(alt.outcomes)))
        if alt.data:
            lines.append(f"      data: {alt.data}")
    lines.append(f"data was: {data}")
    lines.append(res.describe())
    return "\n".join(lines)


PARAMS = [
    pytest.param(
        flavor,
        case,
        id=f"{flavor}:{case.id}",
        marks=[pytest.mark.xfail(strict=True, reason=case.tidb_bug)] if flavor == "tidb" and case.tidb_bug else [],
    )
    for flavor in FLAVORS
    for case in CASES
    if flavor in case.flavors
]


@pytest.mark.parametrize("recovery_harness, case", PARAMS, indirect=["recovery_harness"], scope="module")
def test_matrix(recovery_harness: RecoveryHarness, case: Case) -> None:
    if case.fault is not None and case.fault.kind == PART_FAULT and (reason := partition_unavailable_reason()):
        pytest.skip(f"partition cases skipped: {reason}")
    n = next(_n)
    database = f"mx{n}"
    xid = f"xa_{database}"
    quoted = f"'{xid}'"
    script = [_subst(s, quoted) if isinstance(s, str) else s for s in case.script]
    res = recovery_harness.run(
        script,
        fault=case.fault,
        mode=case.mode,
        multi_statements=case.multi,
        setup=case.setup,
        before=case.before,
        driver=case.driver,
        database=database,
        fault_timeout=3,
    )
    queries = list(case.alts[0].data)
    try:
        data = _read_data(res, queries, xid)
    finally:
        if case.xa:
            _xa_cleanup(res, xid)
    if os.environ.get("RC_MATRIX_VERBOSE"):
        print(f"\n{case.id}: applied={res.fault_applied}\n" + "\n".join(f"  [{i}] {o}" for i, o in enumerate(res.outcomes)))
    for alt in case.alts_on(recovery_harness.flavor):
        want = {q: [tuple(_subst(v, xid) if isinstance(v, str) else v for v in row) for row in rows] for q, rows in alt.data.items()}
        if all(e.match(o) for e, o in zip(alt.outcomes, res.outcomes)) and data == want:
            break
    else:
        pytest.fail(_explain(case, res, data), pytrace=False)
    assert res.fault_applied, f"the fault did not fire (the case proves nothing)\n{_explain(case, res, data)}"
    if case.log_has is not None:
        assert case.log_has in res.proxy_log, f"the proxy's log does not say {case.log_has!r}\n{_explain(case, res, data)}"
    for prefix, most in case.sent_max.items():
        sent = res.sent(prefix)
        assert sent <= most, f"{prefix!r} reached the server {sent} times (at most {most})\n{_explain(case, res, data)}"
