"""Safe mode's proofs against a model of the server: whatever ``proves`` and ``proves_together``
accept must leave the same rows when the whole sequence runs a second time from its own end.

The model runs the statements the proofs know (REPLACE, INSERT ... ON DUPLICATE KEY UPDATE,
DELETE and UPDATE by key) as MySQL, MariaDB and TiDB do on a table ``t (id, u, v)``: ``id`` the
primary key, AUTO_INCREMENT in some tables (0 generates an id unless NO_AUTO_VALUE_ON_ZERO);
``u`` a second UNIQUE NOT NULL key in some tables, a plain column in others. An upsert updates
the first row it conflicts with, by the primary key first; a change that would duplicate a key
fails the statement (1062), and a sequence that fails the first time is not checked. Random
start states and random sequences of up to four statements, from a fixed seed.
"""

from __future__ import annotations

import random

import pytest

from proxy.sqltext import MARIADB
from proxy.sqltext.claims import claim
from proxy.sqltext.idempotence import TableKeys, proves, proves_together

Row = dict[str, int]


class Duplicate(Exception):
    """The statement would duplicate a unique key (1062)."""


class Table:
    def __init__(self, rows: list[Row], unique: tuple[str, ...], auto_increment: bool, zero_is_value: bool) -> None:
        self.rows = [dict(r) for r in rows]
        self.unique, self.auto_increment, self.zero_is_value = unique, auto_increment, zero_is_value
        self.next_id = max([r["id"] for r in rows] + [0]) + 1

    def _id(self, row: Row) -> Row:
        """The row as stored (a copy: the statement's own values stay as written)."""
        row = dict(row)
        if self.auto_increment and row["id"] == 0 and not self.zero_is_value:
            row["id"] = self.next_id
        self.next_id = max(self.next_id, row["id"] + 1)
        return row

    def _conflicts(self, row: Row) -> list[int]:
        return [i for key in self.unique for i, r in enumerate(self.rows) if r[key] == row[key]]

    def _check(self) -> None:
        for key in self.unique:
            if len({r[key] for r in self.rows}) < len(self.rows):
                raise Duplicate(key)

    def replace(self, row: Row) -> None:
        row = self._id(row)
        self.rows = [r for r in self.rows if not any(r[k] == row[k] for k in self.unique)] + [row]

    def upsert(self, row: Row, updates: dict[str, int | str]) -> None:
        row = self._id(row)
        conflicts = self._conflicts(row)
        if not conflicts:
            self.rows.append(row)
            return
        target = self.rows[conflicts[0]]  # the first key that conflicts: the primary key first
        target.update({c: row[c] if v == "new" else v for c, v in updates.items()})
        self._check()

    def delete(self, where: Row) -> None:
        self.rows = [r for r in self.rows if not all(r[c] == x for c, x in where.items())]

    def update(self, values: Row, where: Row) -> None:
        for r in self.rows:
            if all(r[c] == x for c, x in where.items()):
                r.update(values)
        self._check()

    def canon(self) -> list[tuple[int, int, int]]:
        return sorted((r["id"], r["u"], r["v"]) for r in self.rows)


def _row(rng: random.Random) -> Row:
    return {"id": rng.randint(0, 3), "u": rng.randint(1, 3), "v": rng.randint(0, 1)}


def _where(rng: random.Random) -> Row:
    where = {rng.choice(("id", "u")): rng.randint(1, 3)}
    if rng.random() < 0.4:
        where[rng.choice(("u", "v"))] = rng.randint(0, 3)
    return where


def _sql(where: Row) -> str:
    return " AND ".join(f"{c} = {x}" for c, x in where.items())


def _statement(rng: random.Random):
    """(SQL, what the model runs)."""
    kind = rng.choice(("replace", "upsert", "delete", "update"))
    if kind in ("replace", "upsert"):
        rows = [_row(rng) for _ in range(rng.randint(1, 2))]
        values = ", ".join(f"({r['id']}, {r['u']}, {r['v']})" for r in rows)
        if kind == "replace":
            return f"REPLACE INTO t (id, u, v) VALUES {values}", [("replace", r) for r in rows]
        updates: dict[str, int | str] = rng.choice([{"v": "new"}, {"u": "new", "v": "new"}, {"id": "new", "u": "new", "v": "new"},
                                                    {"v": rows[0]["v"]}])  # fmt: skip
        sets = ", ".join(f"{c} = VALUES({c})" if v == "new" else f"{c} = {v}" for c, v in updates.items())
        return f"INSERT INTO t (id, u, v) VALUES {values} ON DUPLICATE KEY UPDATE {sets}", [("upsert", r, updates) for r in rows]
    where = _where(rng)
    if kind == "delete" and rng.random() < 0.3:  # several keys: an IN list, or ORed conjunctions
        if rng.random() < 0.5:
            key, values = rng.choice(("id", "u")), rng.sample(range(1, 4), 2)
            return f"DELETE FROM t WHERE {key} IN ({values[0]}, {values[1]})", [("delete", {key: x}) for x in values]
        alternatives = [where, _where(rng)]
        return "DELETE FROM t WHERE " + " OR ".join(f"({_sql(a)})" for a in alternatives), [("delete", a) for a in alternatives]
    if kind == "delete":
        return f"DELETE FROM t WHERE {_sql(where)}", [("delete", where)]
    values = {"v": rng.randint(0, 1)} if rng.random() < 0.8 else {"u": rng.randint(1, 3)}
    return f"UPDATE t SET {_sql(values).replace(' AND ', ', ')} WHERE {_sql(where)}", [("update", values, where)]


def _run(table: Table, steps) -> None:
    for step in steps:
        getattr(table, step[0])(*step[1:])


@pytest.mark.parametrize("two_keys", [False, True], ids=["one unique key", "two unique keys"])
@pytest.mark.parametrize("auto_increment, zero_is_value", [(False, False), (True, False), (True, True)],
                         ids=["plain id", "AUTO_INCREMENT id", "AUTO_INCREMENT id, NO_AUTO_VALUE_ON_ZERO"])  # fmt: skip
def test_what_is_proven_is_idempotent_in_the_model(two_keys, auto_increment, zero_is_value):
    unique = ("id", "u") if two_keys else ("id",)
    keys = TableKeys(unique_keys=tuple(frozenset({k}) for k in unique), key_columns=frozenset(unique), columns=("id", "u", "v"),
                     auto_increment="id" if auto_increment else None)  # fmt: skip
    rng = random.Random(f"{two_keys}{auto_increment}{zero_is_value}")
    checked = 0
    for _ in range(4000):
        n = rng.randint(0, 3)
        ids, us = rng.sample(range(1, 4), n), rng.sample(range(1, 4), n)
        start = [{"id": i, "u": u, "v": rng.randint(0, 1)} for i, u in zip(ids, us)]
        statements = [_statement(rng) for _ in range(rng.randint(1, 4))]
        claims = [claim(sql, MARIADB) for sql, _steps in statements]
        if not all(c is not None and proves(c, keys, zero_is_value=zero_is_value) for c in claims):
            continue
        if proves_together([(c.table[1], c, keys) for c in claims if c is not None]) is not None:
            continue
        table = Table(start, unique, auto_increment, zero_is_value)
        try:
            for _sql_text, steps in statements:
                _run(table, steps)
        except Duplicate:
            continue  # failed the first time: nothing to replay
        once = table.canon()
        try:
            for _sql_text, steps in statements:
                _run(table, steps)
        except Duplicate:
            pytest.fail(f"proven, yet a second run fails: {[s for s, _ in statements]} from {start}")
        assert table.canon() == once, f"proven, yet a second run changes the rows: {[s for s, _ in statements]} from {start}"
        checked += 1
    assert checked > 300  # the proofs accept enough of the random sequences for this to mean something
