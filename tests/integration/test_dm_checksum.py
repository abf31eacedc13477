"""bench.dm_load's table checksum, the one bench.dm_e2e compares upstream and downstream by, on a
real server: it must see what DM could get wrong -- a NULL that became '' (orders.note is NULL
in the preload, '' under load), a value moved to the next column, a comma inside a value, a
DECIMAL's or a DATETIME(6)'s last digit -- and give the same answer for the same rows on MariaDB
and on TiDB (the same SQL runs on both ends)."""

from __future__ import annotations

import pymysql
import pytest

from bench.dm_load import checksums

pytestmark = pytest.mark.integration

COLUMNS = "id INT PRIMARY KEY, a VARCHAR(32) NULL, b VARCHAR(32) NULL, d DECIMAL(10,2) NULL, at DATETIME(6) NULL"
BASE = [
    (1, "x", None, "1.50", "2024-01-02 03:04:05.000006"),
    (2, "", None, None, None),
    (3, "p,q", "r", "0.00", "2024-01-02 00:00:00"),
    (4, "p|q", "r", "0.00", None),
]
# Each a change DM might make to one row; the CONCAT_WS('|', ...) checksum this one replaced
# misses some of them (the test says which).
CHANGES = {
    "NULL became ''": (1, "x", "", "1.50", "2024-01-02 03:04:05.000006"),
    "'' became NULL": (2, None, None, None, None),
    "NULL and '' swapped": (2, None, "", None, None),
    "value moved to the next column": (1, None, "x", "1.50", "2024-01-02 03:04:05.000006"),
    "',' moved across columns": (3, "p", "q,r", "0.00", "2024-01-02 00:00:00"),
    "'|' moved across columns": (4, "p", "q|r", "0.00", None),
    "NULL DECIMAL became 0": (2, "", None, "0.00", None),
    "DECIMAL's last digit": (1, "x", None, "1.51", "2024-01-02 03:04:05.000006"),
    "DATETIME's microsecond": (1, "x", None, "1.50", "2024-01-02 03:04:05.000007"),
}
OLD_CHECKSUM = "SELECT COUNT(*), COALESCE(SUM(CRC32(CONCAT_WS('|', `id`, `a`, `b`, `d`, `at`))), 0) FROM `t`"


def _connect(server):
    return pymysql.connect(host="127.0.0.1", port=server.port, user="root", password="", autocommit=True, charset="utf8mb4")


def _schema(server, name: str, rows: list[tuple]) -> None:
    conn = _connect(server)
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {name}")
            cur.execute(f"CREATE DATABASE {name}")
            cur.execute(f"CREATE TABLE {name}.t ({COLUMNS})")
            cur.executemany(f"INSERT INTO {name}.t VALUES (%s, %s, %s, %s, %s)", rows)
    finally:
        conn.close()


def _old(server, name: str) -> tuple:
    conn = _connect(server)
    try:
        with conn.cursor() as cur:
            cur.execute(f"USE {name}")
            cur.execute(OLD_CHECKSUM)
            return tuple(int(v) for v in cur.fetchone())
    finally:
        conn.close()


def _changed(change: tuple) -> list[tuple]:
    return [change if row[0] == change[0] else row for row in BASE]


def test_checksum_sees_nulls_and_moved_values(db):
    _schema(db, "cks_base", BASE)
    _schema(db, "cks_same", list(reversed(BASE)))  # insertion order does not matter
    base = checksums(db.port, schema="cks_base")
    assert base["t"][0] == len(BASE)
    assert checksums(db.port, schema="cks_same") == base
    old_missed = []
    for n, (what, change) in enumerate(CHANGES.items()):
        name = f"cks_change{n}"
        _schema(db, name, _changed(change))
        assert checksums(db.port, schema=name) != base, f"{what}: not seen"
        if _old(db, name) == _old(db, "cks_base"):
            old_missed.append(what)
    # The test is worth something: the CONCAT_WS checksum it replaces misses these.
    assert set(old_missed) == {"NULL and '' swapped", "value moved to the next column", "'|' moved across columns"}


def test_checksum_sql_is_the_same_on_both_ends(mariadb, tidb):
    """The same rows give the same checksum on MariaDB (upstream) and TiDB (downstream)."""
    rows = [(i, *row[1:]) for i, row in enumerate([*BASE, *CHANGES.values()], 1)]  # NULLs, '', commas, decimals, datetimes
    for server in (mariadb, tidb):
        _schema(server, "cks_both", rows)
    assert checksums(mariadb.port, schema="cks_both") == checksums(tidb.port, schema="cks_both")
