"""Packet-size limits through the proxy: ``[limits] max_allowed_packet`` and ``oversized``.

The effective limit of a session is min(config, the backend's @@max_allowed_packet). Two
set-ups give an effective limit of 1 MiB, each on MariaDB and on TiDB (``db``; TiDB's
max_allowed_packet is a global variable, set when its server starts):

- "server-1M": a server started with max_allowed_packet=1M behind a proxy with the default
  config (the limit comes from the backend);
- "proxy-1MiB": the shared 64M server behind a proxy configured with
  ``max_allowed_packet = "1MiB"`` (the limit comes from the proxy; the server would take more).

Reject mode: a command over the limit gets ERR 1153 / 08S01 from the proxy, which names the size
and the limit; it never reaches the server, and the session (and its open transaction) goes on.
Split mode: an oversized multi-row INSERT / REPLACE / INSERT ... ON DUPLICATE KEY UPDATE runs as
several statements under the limit, atomically, answered with one OK; the tests compare the
table contents byte for byte with what was sent, and the OK with what the server answers to
the same statement unsplit (on the shared 64M server).

Memory: a 200 MB result and a 60 MB statement go through the proxy while its RSS is sampled;
the numbers are printed (pytest -s) and written to rss.json in the test's tmp dir.
"""

from __future__ import annotations

import io
import json
import random
import re
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pymysql
import pymysql.cursors
import pytest

from tests.integration.clients import ALL_BYTES, CLIENTS, ClientUnavailable, run_many
from tests.integration.conftest import IN_TRANSACTION, MiB, running_proxy, seq_table
from tests.lab.fixtures import require
from tests.lab.goclient import run_goclient

pytestmark = pytest.mark.integration

LIMIT = 1 * MiB


# ---------------------------------------------------------------------------- set-ups


@pytest.fixture(scope="module")
def split_proxy(db, tmp_path_factory):
    """Split mode on the shared 64M server with a 1 MiB proxy limit."""
    with running_proxy(
        tmp_path_factory.mktemp("proxy-split"), db.port, limits={"max_allowed_packet": "1MiB", "oversized": "split"}
    ) as proc:
        yield proc


@pytest.fixture(scope="module")
def small_split_proxy(small_packet_server, tmp_path_factory):
    """Split mode in front of the 1M server (the limit comes from the backend)."""
    with running_proxy(tmp_path_factory.mktemp("proxy-split-1m"), small_packet_server.db.port, limits={"oversized": "split"}) as proc:
        yield proc


@pytest.fixture(params=["server-1M", "proxy-1MiB"])
def limited(request, db) -> SimpleNamespace:
    """A reject-mode set-up whose effective limit is 1 MiB: ``.proxy``, ``.db`` (the server)."""
    if request.param == "server-1M":
        small = request.getfixturevalue("small_packet_server")
        return SimpleNamespace(name=request.param, proxy=small.proxy, db=small.db)
    return SimpleNamespace(name=request.param, proxy=request.getfixturevalue("limited_proxy"), db=request.getfixturevalue("db"))


@pytest.fixture(params=["server-1M", "proxy-1MiB"])
def splitting(request, db) -> SimpleNamespace:
    if request.param == "server-1M":
        small = request.getfixturevalue("small_packet_server")
        return SimpleNamespace(name=request.param, proxy=request.getfixturevalue("small_split_proxy"), db=small.db)
    return SimpleNamespace(name=request.param, proxy=request.getfixturevalue("split_proxy"), db=request.getfixturevalue("db"))


def connect(port: int, database: str = "test", **kwargs) -> pymysql.connections.Connection:
    params = dict(
        host="127.0.0.1",
        port=port,
        user="app",
        password="apppw",
        database=database,
        charset="utf8mb4",
        autocommit=True,
        max_allowed_packet=256 * MiB,
        connect_timeout=10,
        read_timeout=300,
        write_timeout=300,
    )
    params.update(kwargs)
    return pymysql.connect(**params)


def query(conn, sql: str | bytes, args=None) -> list[tuple]:
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return list(cur.fetchall())


def execute(conn, sql: str | bytes) -> tuple[int, int]:
    """Run a statement: (affected rows, warning count) of its OK."""
    with conn.cursor() as cur:
        affected = cur.execute(sql)
    return affected, conn._result.warning_count


def expect_1153(exc: BaseException, size: int, limit: int = LIMIT) -> str:
    assert exc.args[0] == 1153, exc
    message = exc.args[1]
    assert f"{size} bytes" in message and str(limit) in message, message
    assert "max_allowed_packet" in message, message
    return message


def oversized_insert(table: str, size: int, row_id: int = 99) -> bytes:
    """A single-row INSERT whose COM_QUERY payload is exactly ``size`` bytes."""
    head = f"INSERT INTO {table} VALUES ({row_id}, '".encode()
    tail = b"')"
    filler = size - 1 - len(head) - len(tail)
    return head + b"y" * filler + tail


# ---------------------------------------------------------------------------- reject mode


def reject_ops(size: int, flavor: str) -> list[tuple]:
    return [
        ("connect", "c", {}),
        ("sql", "c", "DROP TABLE IF EXISTS lim_t"),
        ("sql", "c", "CREATE TABLE lim_t (id INT PRIMARY KEY, v LONGTEXT)"),
        ("sql", "c", "BEGIN"),
        ("sql", "c", "INSERT INTO lim_t VALUES (1, 'before')"),
        ("sql", "c", oversized_insert("lim_t", size).decode()),  # 5: 1153
        ("sql", "c", f"SELECT {IN_TRANSACTION[flavor]}"),  # 6: still in the transaction
        ("sql", "c", "INSERT INTO lim_t VALUES (2, 'after')"),
        ("sql", "c", "COMMIT"),
        ("sql", "c", "SELECT id, v FROM lim_t ORDER BY id"),  # 9
        ("ping", "c"),
        ("connect", "other", {}),
        ("sql", "other", "SELECT id FROM lim_t ORDER BY id"),  # 12: committed for everyone
    ]


@pytest.mark.parametrize("client", CLIENTS)
def test_reject_keeps_session_and_transaction(client, limited):
    size = 2 * MiB + 17
    try:
        [out] = run_many(client, [(limited.proxy.port, reject_ops(size, limited.db.flavor))])
    except ClientUnavailable as exc:
        require(str(exc))
        raise
    kind, errno, sqlstate, message = out[5]
    assert (kind, errno) == ("error", 1153), out[5]
    assert f"{size} bytes" in message and "1048576" in message, message
    if client != "mysqlclient":  # MySQLdb exceptions carry no SQLSTATE
        assert sqlstate == "08S01"
    assert out[6][2] == [(1,)], out[6]
    assert out[9][2] == [(1, "before"), (2, "after")], out[9]
    assert out[10] == ("pong",)
    assert out[12][2] == [(1,), (2,)]


def test_reject_message_names_size_and_limit(limited):
    conn = connect(limited.proxy.port)
    try:
        query(conn, "CREATE TABLE IF NOT EXISTS lim_m (id INT PRIMARY KEY, v LONGTEXT)")
        size = LIMIT + 1
        with pytest.raises(pymysql.err.OperationalError) as info:
            execute(conn, oversized_insert("lim_m", size))
        message = expect_1153(info.value, size)
        assert info.value.sqlstate == "08S01"
        assert "not sent to the backend" in message
        if limited.name == "server-1M":
            assert "backend" in message
        assert query(conn, "SELECT 1") == [(1,)]
        assert query(conn, "SELECT COUNT(*) FROM lim_m WHERE id = 99") == [(0,)]
    finally:
        conn.close()


def dedicated_proxy(request, setup: str, proxy_factory, **limits):
    """A proxy of its own for a test that may wedge a session (it dies with the proxy)."""
    if setup == "server-1M":
        backend = request.getfixturevalue("small_packet_server").db
        return proxy_factory(backend.port, limits=dict(limits))
    backend = request.getfixturevalue("db")
    return proxy_factory(backend.port, limits={"max_allowed_packet": "1MiB", **limits})


def largest_command(db) -> int:
    """The largest COM_QUERY payload the server takes: MariaDB's must be smaller than
    max_allowed_packet, TiDB takes one of exactly that size (measured; 1153 above it)."""
    return LIMIT if db.flavor == "tidb" else LIMIT - 1


@pytest.mark.parametrize("size", [LIMIT - 1, LIMIT, LIMIT + 1])
@pytest.mark.parametrize("setup", ["server-1M", "proxy-1MiB"])
def test_command_at_the_limit(request, db, proxy_factory, setup, size):
    """The server's largest command goes through, one byte more gets 1153 (from the proxy: the
    session and its transaction go on), whichever side sets the limit: on MariaDB limit-1
    bytes, on TiDB limit bytes (the proxy refused those with 1153 on TiDB too). (When the
    proxy forwarded a command of exactly MariaDB's limit, the server answered 1153 and closed
    the connection, and the proxy replayed the transaction with that command again, forever:
    hence a proxy of its own and a short client timeout.)"""
    proxy = dedicated_proxy(request, setup, proxy_factory)
    conn = connect(proxy.port, read_timeout=20)
    taken = size <= largest_command(db)
    try:
        query(conn, "CREATE TABLE IF NOT EXISTS lim_b (id INT PRIMARY KEY, v LONGTEXT)")
        query(conn, "DELETE FROM lim_b")
        query(conn, "BEGIN")
        query(conn, "INSERT INTO lim_b VALUES (1, 'x')")
        statement = oversized_insert("lim_b", size, row_id=2)
        if taken:
            assert execute(conn, statement)[0] == 1
        else:
            with pytest.raises(pymysql.err.OperationalError) as info:
                execute(conn, statement)
            assert "not sent to the backend" in expect_1153(info.value, size)
        assert query(conn, f"SELECT {IN_TRANSACTION[db.flavor]}") == [(1,)]
        query(conn, "COMMIT")
        expected = [(1,), (2,)] if taken else [(1,)]
        assert query(conn, "SELECT id FROM lim_b ORDER BY id") == expected
    finally:
        conn.close()


def server_bytes(db, direction: str) -> int:
    """Protocol bytes the server has ``"received"`` or ``"sent"`` so far: MariaDB's
    Bytes_received / Bytes_sent; TiDB's status port counts them (tidb_server_packet_io_bytes
    In / Out; its SHOW GLOBAL STATUS has neither)."""
    if db.flavor == "tidb":
        text = urllib.request.urlopen(f"http://127.0.0.1:{db.status_port}/metrics", timeout=5).read().decode()
        kind = {"received": "In", "sent": "Out"}[direction]
        return int(float(re.search(rf'^tidb_server_packet_io_bytes{{type="{kind}"}} (\S+)$', text, re.M).group(1)))
    return int(db.query(f"SHOW GLOBAL STATUS LIKE 'Bytes_{direction}'")[0][1])


@pytest.mark.parametrize("size", [0xFFFFFF, 0xFFFFFF + 1, 17 * MiB + 5])
def test_reject_multi_packet_statement(limited_proxy, db, size):
    """16 MiB and more (continuation frames) against the 64M server with a 1 MiB proxy limit:
    refused by the proxy, never sent (the server's Bytes_received hardly moves)."""
    conn = connect(limited_proxy.port)
    try:
        query(conn, "CREATE TABLE IF NOT EXISTS lim_big (id INT PRIMARY KEY, v LONGTEXT)")
        query(conn, "BEGIN")
        query(conn, "INSERT INTO lim_big VALUES (1, 'x') ON DUPLICATE KEY UPDATE v = 'x'")
        before = server_bytes(db, "received")
        with pytest.raises(pymysql.err.OperationalError) as info:
            execute(conn, oversized_insert("lim_big", size, row_id=2))
        expect_1153(info.value, size)
        grown = server_bytes(db, "received") - before
        assert grown < 64 * 1024, f"the server received {grown} bytes while the proxy refused the statement"
        assert query(conn, f"SELECT {IN_TRANSACTION[db.flavor]}") == [(1,)]
        query(conn, "COMMIT")
        assert query(conn, "SELECT id FROM lim_big ORDER BY id") == [(1,)]
        assert query(conn, "SELECT 'usable'") == [("usable",)]
    finally:
        conn.close()


def test_select_max_allowed_packet_answers_the_effective_limit(limited_proxy, small_packet_server, db):
    conn = connect(limited_proxy.port)
    try:
        for q in (
            "SELECT @@max_allowed_packet",
            "select @@max_allowed_packet;",
            "SELECT @@session.max_allowed_packet",
            "  SELECT  @@MAX_ALLOWED_PACKET  ",
        ):
            assert query(conn, q) == [(LIMIT,)], q
    finally:
        conn.close()
    direct = connect(db.port)
    try:
        assert query(direct, "SELECT @@max_allowed_packet") == [(64 * MiB,)]
    finally:
        direct.close()
    conn = connect(small_packet_server.proxy.port)
    try:
        assert query(conn, "SELECT @@max_allowed_packet") == [(LIMIT,)]  # the server's own answer
    finally:
        conn.close()


def test_long_data_over_the_limit(limited_proxy):
    """COM_STMT_SEND_LONG_DATA adding up to more than the limit: the execute gets 1153."""
    import mysql.connector

    conn = mysql.connector.connect(
        host="127.0.0.1", port=limited_proxy.port, user="app", password="apppw", database="test", use_pure=True, autocommit=True
    )
    try:
        cur = conn.cursor()
        cur.execute("CREATE TABLE IF NOT EXISTS lim_ld (id INT PRIMARY KEY, b LONGBLOB)")
        cur.execute("DELETE FROM lim_ld")
        ps = conn.cursor(prepared=True)
        small = bytes(range(256)) * 1024  # 256 KiB, streamed as long data (a file-like parameter)
        ps.execute("INSERT INTO lim_ld VALUES (%s, %s)", (1, io.BytesIO(small)))
        with pytest.raises(mysql.connector.Error) as info:
            ps.execute("INSERT INTO lim_ld VALUES (%s, %s)", (2, io.BytesIO(b"z" * (2 * MiB))))
        assert info.value.errno == 1153 and info.value.sqlstate == "08S01", info.value
        assert "COM_STMT_SEND_LONG_DATA" in info.value.msg
        ps.execute("INSERT INTO lim_ld VALUES (%s, %s)", (3, io.BytesIO(small)))  # the statement still works
        cur.execute("SELECT id, LENGTH(b), b = %s FROM lim_ld ORDER BY id", (small,))
        assert cur.fetchall() == [(1, len(small), 1), (3, len(small), 1)]
    finally:
        conn.close()


@pytest.mark.parametrize("setup", ["server-1M", "proxy-1MiB"])
def test_go_driver_learns_the_limit(setup, request, db, goclient):
    """go-sql-driver with maxAllowedPacket=0 asks SELECT @@max_allowed_packet, gets 1 MiB, and
    then stays under it: long data for big parameters, prepared fallback when an interpolated
    statement would be too big."""
    port = (
        request.getfixturevalue("small_packet_server").proxy.port if setup == "server-1M" else request.getfixturevalue("limited_proxy").port
    )
    out = run_goclient("smoke", port=port, big_size=256 * 1024, timeout=180)
    assert out["ok"], out
    assert out["info"]["max_allowed_packet"] == LIMIT
    assert out["checks"]["long_data_prepared"] == "ok" and out["checks"]["interpolate_fallback"] == "ok"


def test_go_driver_oversized_statement_gets_1153(limited, goclient):
    """A driver told a larger limit (maxAllowedPacket in the DSN) sends 2 MiB: 1153, and the
    pinned connection goes on."""
    out = run_goclient(
        "smoke",
        port=limited.proxy.port,
        big_size=2 * MiB,
        long_data=False,
        extra_dsn=f"maxAllowedPacket={16 * MiB}",
        timeout=180,
        check=False,
    )
    checks = out["checks"]
    assert "1153" in checks["big_string"] and "max_allowed_packet" in checks["big_string"], checks
    others = {k: v for k, v in checks.items() if k != "big_string"}
    assert set(others.values()) == {"ok"}, others
    assert {"ping", "drop_tables"} <= set(others)


# ---------------------------------------------------------------------------- split mode


@dataclass
class Row:
    id: int
    b: bytes | None
    t: str | None
    n: int | None


TEXT_ALPHABET = "abcxyz 0123 ' \" \\ \n \r \t \x1a ( ) , ; ` -- # /* */ é 😀 漢"


def make_rows(first_id: int, target_bytes: int, seed: int, max_row: int = 40_000) -> list[Row]:
    """Rows adding up to about ``target_bytes`` of values, with every byte value, quotes,
    backslashes, parentheses, comment markers and NULLs inside."""
    rng = random.Random(seed)
    rows: list[Row] = []
    total = 0
    i = first_id
    while total < target_bytes:
        k = len(rows)
        size = rng.choice([0, 1, 255, 1000, rng.randrange(max_row // 4, max_row), rng.randrange(256, max_row)])
        b = None if k % 7 == 3 else (ALL_BYTES + rng.randbytes(size))[: max(size, 256 if k % 2 else 0)]
        t = None if k % 11 == 5 else "".join(rng.choice(TEXT_ALPHABET) for _ in range(rng.randrange(0, max_row // 8)))
        n = None if k % 5 == 2 else rng.randrange(-(2**31), 2**31)
        rows.append(Row(i, b, t, n))
        total += len(b or b"") + len((t or "").encode()) + 20
        i += 1
    return rows


def _escape_backslash(data: bytes) -> bytes:
    return (
        data.replace(b"\\", b"\\\\")
        .replace(b"'", b"\\'")
        .replace(b"\x00", b"\\0")
        .replace(b"\n", b"\\n")
        .replace(b"\r", b"\\r")
        .replace(b"\x1a", b"\\Z")
    )


def bin_literal(b: bytes | None, style: int) -> bytes:
    if b is None:
        return b"NULL"
    if style == 0 or not b:
        return b"X'" + b.hex().encode() + b"'"
    if style == 1:
        return b"_binary'" + _escape_backslash(b) + b"'"
    return b"0x" + b.hex().encode()


def text_literal(t: str | None, style: int) -> bytes:
    if t is None:
        return b"NULL"
    data = t.encode()
    if style == 0:
        return b"'" + _escape_backslash(data) + b"'"
    if style == 1:  # quotes doubled, backslashes escaped
        return b"'" + data.replace(b"\\", b"\\\\").replace(b"'", b"''") + b"'"
    return b'"' + data.replace(b"\\", b"\\\\").replace(b'"', b'""') + b'"'


def row_literal(row: Row) -> bytes:
    n = b"NULL" if row.n is None else str(row.n).encode()
    return b"(%d, %s, %s, %s)" % (row.id, bin_literal(row.b, row.id % 3), text_literal(row.t, row.id // 3 % 3), n)


def values_statement(verb: str, table: str, rows: list[Row], suffix: str = "") -> bytes:
    parts = []
    for k, row in enumerate(rows):
        sep = b", " if k % 13 else b" /* a comment, with (parens) and 'quotes' */ ,\n"
        if k % 17 == 16:
            sep = b" -- comment, ( ' \n, "
        parts.append((sep if k else b"") + row_literal(row))
    return f"{verb} INTO {table} (id, b, t, n) VALUES ".encode() + b"".join(parts) + suffix.encode()


SPLIT_DDL = "(id INT PRIMARY KEY, b LONGBLOB NULL, t LONGTEXT CHARACTER SET utf8mb4 NULL, n INT NULL, c INT NOT NULL DEFAULT 0)"


def fresh_table(conn, table: str, setup: list[bytes | str] = ()) -> None:
    """Recreate ``table`` empty, then run the ``setup`` statements."""
    query(conn, f"DROP TABLE IF EXISTS {table}")
    query(conn, f"CREATE TABLE {table} {SPLIT_DDL}")
    for s in setup:
        query(conn, s)


def insert_batches(table: str, rows: list) -> list[bytes]:
    """INSERTs of 20 rows each (small enough for any limit): setup for the split tests."""
    return [values_statement("INSERT", table, rows[i : i + 20]) for i in range(0, len(rows), 20)]


def table_rows(conn, table: str) -> list[tuple]:
    return query(conn, f"SELECT id, b, t, n, c FROM {table} ORDER BY id")


def expected_rows(rows: list[Row], c: int = 0) -> list[tuple]:
    return [(r.id, r.b, r.t, r.n, c) for r in sorted(rows, key=lambda r: r.id)]


def assert_same_rows(got: list[tuple], want: list[tuple]) -> None:
    assert len(got) == len(want), f"{len(got)} rows, expected {len(want)}"
    for g, w in zip(got, want):
        assert g == w, f"row {w[0]} differs: got {str(g)[:300]}, sent {str(w)[:300]}"


def run_direct(db, table: str, setup: list[bytes | str], statement: bytes) -> tuple[int, int]:
    """The statement unsplit, straight on the shared 64M server (after the same setup). Runs
    before the proxy's turn, which recreates the table."""
    conn = connect(db.port)
    try:
        fresh_table(conn, table, setup)
        return execute(conn, statement)
    finally:
        conn.close()


@pytest.mark.parametrize(
    "splitting, times",
    [
        ("server-1M", 2),
        ("server-1M", 10),
        ("proxy-1MiB", 2),
        ("proxy-1MiB", 10),
        ("proxy-1MiB", 50),
    ],
    indirect=["splitting"],
)
def test_split_insert(splitting, db, times):
    rows = make_rows(1, times * LIMIT, seed=times)
    statement = values_statement("INSERT", "split_ins", rows)
    assert len(statement) > times * LIMIT
    # Unsplit straight on the 64M server when it fits there (the 50x statement does not).
    direct = run_direct(db, "split_ins", [], statement) if len(statement) < 60 * MiB else (len(rows), 0)
    conn = connect(splitting.proxy.port)
    try:
        fresh_table(conn, "split_ins")
        affected, warnings = execute(conn, statement)
        assert (affected, warnings) == direct == (len(rows), 0)
        assert query(conn, f"SELECT {IN_TRANSACTION[db.flavor]}, @@autocommit") == [(0, 1)]
        assert_same_rows(table_rows(conn, "split_ins"), expected_rows(rows))
    finally:
        conn.close()


def test_split_replace(splitting, db):
    old = make_rows(1, 3 * LIMIT, seed=11)
    new = make_rows(len(old) // 2, 3 * LIMIT, seed=12)  # overlaps the second half of the old ids
    setup = insert_batches("split_rep", old)
    statement = values_statement("REPLACE", "split_rep", new)
    direct = run_direct(db, "split_rep", setup, statement)
    conn = connect(splitting.proxy.port)
    try:
        fresh_table(conn, "split_rep", setup)
        affected, warnings = execute(conn, statement)
        overlap = len({r.id for r in old} & {r.id for r in new})
        assert affected == len(new) + overlap
        assert (affected, warnings) == direct
        merged = {r.id: r for r in old} | {r.id: r for r in new}
        assert_same_rows(table_rows(conn, "split_rep"), expected_rows(list(merged.values())))
    finally:
        conn.close()


def test_split_insert_on_duplicate_key_update(splitting, db):
    old = make_rows(1, 2 * LIMIT, seed=21)
    new = make_rows(len(old) - len(old) // 3, 3 * LIMIT, seed=22)
    setup = insert_batches("split_odku", old)
    statement = values_statement(
        "INSERT", "split_odku", new, " ON DUPLICATE KEY UPDATE b = VALUES(b), t = VALUES(t), n = VALUES(n), c = c + 1"
    )
    direct = run_direct(db, "split_odku", setup, statement)
    conn = connect(splitting.proxy.port)
    try:
        fresh_table(conn, "split_odku", setup)
        affected, warnings = execute(conn, statement)
        overlap = {r.id for r in old} & {r.id for r in new}
        assert affected == len(new) + len(overlap)  # 1 per new row, 2 per updated row
        assert (affected, warnings) == direct
        got = table_rows(conn, "split_odku")
        want = {r.id: (r.id, r.b, r.t, r.n, 0) for r in old}
        want.update({r.id: (r.id, r.b, r.t, r.n, 1 if r.id in overlap else 0) for r in new})
        assert_same_rows(got, [want[k] for k in sorted(want)])
    finally:
        conn.close()


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_split_is_atomic_in_autocommit(splitting, db, where):
    rows = make_rows(1000, 10 * LIMIT, seed=31)
    dup = {"first": rows[0], "middle": rows[len(rows) // 2], "last": rows[-1]}[where]
    statement = values_statement("INSERT", "split_atom", rows)
    with pytest.raises(pymysql.err.IntegrityError) as direct_info:
        run_direct(db, "split_atom", [f"INSERT INTO split_atom (id, t) VALUES ({dup.id}, 'already here')"], statement)
    conn = connect(splitting.proxy.port)
    try:
        fresh_table(conn, "split_atom")
        query(conn, f"INSERT INTO split_atom (id, t) VALUES ({dup.id}, 'already here')")
        with pytest.raises(pymysql.err.IntegrityError) as info:
            execute(conn, statement)
        assert info.value.args[0] == 1062
        assert info.value.args == direct_info.value.args
        assert query(conn, "SELECT id, t FROM split_atom") == [(dup.id, "already here")]
        assert query(conn, f"SELECT {IN_TRANSACTION[db.flavor]}, @@autocommit") == [(0, 1)]
        assert query(conn, "SELECT 'usable'") == [("usable",)]
    finally:
        conn.close()


@pytest.mark.parametrize("where", ["first", "last"])
def test_split_is_atomic_inside_a_transaction(splitting, db, where):
    rows = make_rows(1000, 10 * LIMIT, seed=41)
    dup = rows[0] if where == "first" else rows[-1]
    statement = values_statement("INSERT", "split_tx", rows)
    conn = connect(splitting.proxy.port)
    try:
        fresh_table(conn, "split_tx")
        query(conn, f"INSERT INTO split_tx (id, t) VALUES ({dup.id}, 'already here')")
        query(conn, "BEGIN")
        query(conn, "INSERT INTO split_tx (id, t) VALUES (1, 'early')")
        with pytest.raises(pymysql.err.IntegrityError) as info:
            execute(conn, statement)
        assert info.value.args[0] == 1062
        assert query(conn, f"SELECT {IN_TRANSACTION[db.flavor]}") == [(1,)]
        query(conn, "INSERT INTO split_tx (id, t) VALUES (2, 'late')")
        # A split statement that succeeds inside the transaction, then the commit.
        more = make_rows(100_000, 3 * LIMIT, seed=42)
        assert execute(conn, values_statement("INSERT", "split_tx", more))[0] == len(more)
        query(conn, "COMMIT")
        got = query(conn, "SELECT id, t FROM split_tx WHERE id < 1000 OR id = %s ORDER BY id", (dup.id,))
        assert got == [(1, "early"), (2, "late"), (dup.id, "already here")]
        assert query(conn, "SELECT COUNT(*) FROM split_tx WHERE id >= 100000") == [(len(more),)]
        assert query(conn, "SELECT COUNT(*) FROM split_tx") == [(3 + len(more),)]
    finally:
        conn.close()


def test_split_with_autocommit_off(splitting, db):
    """autocommit=0 without BEGIN: the split statement joins the implicit transaction, invisible
    to others until COMMIT; a failing one leaves the transaction's earlier rows alone."""
    rows = make_rows(1, 3 * LIMIT, seed=81)
    conn = connect(splitting.proxy.port)
    other = connect(splitting.db.port)
    try:
        fresh_table(conn, "split_ac")
        query(conn, "SET autocommit = 0")
        query(conn, "INSERT INTO split_ac (id, t) VALUES (100000, 'first')")
        assert execute(conn, values_statement("INSERT", "split_ac", rows))[0] == len(rows)
        assert query(other, "SELECT COUNT(*) FROM split_ac") == [(0,)]
        with pytest.raises(pymysql.err.IntegrityError):  # every row again: 1062 in the first piece
            execute(conn, values_statement("INSERT", "split_ac", rows[::-1]))
        assert query(conn, f"SELECT {IN_TRANSACTION[db.flavor]}, @@autocommit") == [(1, 0)]
        query(conn, "COMMIT")
        assert query(other, "SELECT COUNT(*) FROM split_ac") == [(len(rows) + 1,)]
        query(conn, "SET autocommit = 1")
    finally:
        conn.close()
        other.close()


def test_split_rolled_back_with_the_transaction(splitting):
    rows = make_rows(1, 3 * LIMIT, seed=51)
    conn = connect(splitting.proxy.port)
    try:
        fresh_table(conn, "split_rb")
        query(conn, "BEGIN")
        assert execute(conn, values_statement("INSERT", "split_rb", rows))[0] == len(rows)
        assert query(conn, "SELECT COUNT(*) FROM split_rb") == [(len(rows),)]
        query(conn, "ROLLBACK")
        assert query(conn, "SELECT COUNT(*) FROM split_rb") == [(0,)]
    finally:
        conn.close()


def test_split_single_row_over_the_limit(splitting):
    conn = connect(splitting.proxy.port)
    try:
        fresh_table(conn, "split_one")
        big = Row(2, b"\x00" * (LIMIT + 10), "t", 1)
        rows = [Row(1, b"a", "a", 1), big, Row(3, b"c", "c", 3)]
        statement = values_statement("INSERT", "split_one", rows)
        with pytest.raises(pymysql.err.OperationalError) as info:
            execute(conn, statement)
        message = expect_1153(info.value, len(statement) + 1)
        assert "single row" in message
        assert query(conn, "SELECT COUNT(*) FROM split_one") == [(0,)]
        # Neither an oversized UPDATE nor INSERT ... SELECT can be split.
        for sql in (
            b"UPDATE split_one SET t = '" + b"u" * (2 * LIMIT) + b"'",
            b"INSERT INTO split_one (id, t) SELECT 1, '" + b"s" * (2 * LIMIT) + b"'",
        ):
            with pytest.raises(pymysql.err.OperationalError) as info:
                execute(conn, sql)
            expect_1153(info.value, len(sql) + 1)
        assert query(conn, "SELECT 'usable'") == [("usable",)]
    finally:
        conn.close()


@pytest.mark.parametrize("setup", ["server-1M", "proxy-1MiB"])
def test_split_piece_sizes_at_the_limit(request, db, proxy_factory, setup):
    """Rows sized so that greedy packing would make a first piece of exactly the server's
    largest command, then one byte more (COM_QUERY payload, command byte included). Pieces must
    be commands the server takes (MariaDB: smaller than max_allowed_packet; TiDB: up to it), so
    the first splits into two pieces and the second has a row too large to go alone: 1153."""
    proxy = dedicated_proxy(request, setup, proxy_factory, oversized="split")
    conn = connect(proxy.port, read_timeout=20)
    largest = largest_command(db)
    try:
        fresh_table(conn, "split_edge")
        head = b"INSERT INTO split_edge (id, t) VALUES "
        for payload in (largest, largest + 1):
            query(conn, "DELETE FROM split_edge")
            filler = payload - 1 - len(head) - len(b"(1, '')")
            statement = head + b"(1, '" + b"e" * filler + b"'), (2, 'second')"
            assert len(statement) + 1 > LIMIT
            if payload <= largest:
                assert execute(conn, statement)[0] == 2
                assert query(conn, "SELECT id, LENGTH(t) FROM split_edge ORDER BY id") == [(1, filler), (2, 6)]
            else:
                with pytest.raises(pymysql.err.OperationalError) as info:
                    execute(conn, statement)
                assert "single row" in expect_1153(info.value, len(statement) + 1)
                assert query(conn, "SELECT COUNT(*) FROM split_edge") == [(0,)]
        assert query(conn, "SELECT 'usable'") == [("usable",)]
    finally:
        conn.close()


SPLIT_FORMS = {
    "lowercase": (b"insert into split_f (id, t) values ", b""),
    "leading comment and spaces": (b"  /* DM batch */ INSERT INTO split_f (id, t) VALUES\n", b";"),
    "qualified backticks (DM)": (b"INSERT INTO `test`.`split_f` (`id`,`t`) VALUES ", b""),
    "VALUE keyword": (b"INSERT INTO split_f (id, t) VALUE ", b" ; "),
    "modifiers": (b"INSERT LOW_PRIORITY INTO split_f (id, t) VALUES ", b""),
    "REPLACE lowercase": (b"replace into split_f (id, t) values ", b""),
}


@pytest.mark.parametrize("form", list(SPLIT_FORMS))
def test_split_statement_forms(splitting, form):
    head, tail = SPLIT_FORMS[form]
    rows = [(i, ("r%d-" % i) + "x'y\\z(),;--#/*" * 4000) for i in range(1, 40)]
    body = b", ".join(b"(%d, '%s')" % (i, t.replace("\\", "\\\\").replace("'", "\\'").encode()) for i, t in rows)
    statement = head + body + tail
    assert len(statement) > 2 * LIMIT
    conn = connect(splitting.proxy.port)
    try:
        query(conn, "DROP TABLE IF EXISTS split_f")
        query(conn, "CREATE TABLE split_f (id INT PRIMARY KEY, t TEXT)")
        assert execute(conn, statement)[0] == len(rows)
        assert query(conn, "SELECT id, t FROM split_f ORDER BY id") == rows
    finally:
        conn.close()


def test_split_with_no_backslash_escapes(splitting, db):
    """In NO_BACKSLASH_ESCAPES mode a backslash is an ordinary character: 'a\\' is a whole
    string. The proxy learns the mode from the status flags and splits accordingly."""
    # SQL text of the values: quotes doubled, backslashes as they are.
    rows = [(i, "ends with a backslash \\" if i % 2 else "it''s \\'' tricky " * 2000) for i in range(1, 200)]
    values = b", ".join(b"(%d, '%s')" % (i, t.encode()) for i, t in rows)
    statement = b"INSERT INTO split_nbe (id, t) VALUES " + values
    assert len(statement) > 2 * LIMIT
    results = []
    for port in (db.port, splitting.proxy.port):
        conn = connect(port)
        try:
            query(conn, "SET SESSION sql_mode = 'NO_BACKSLASH_ESCAPES'")
            query(conn, "DROP TABLE IF EXISTS split_nbe")
            query(conn, "CREATE TABLE split_nbe (id INT PRIMARY KEY, t MEDIUMTEXT)")
            affected = execute(conn, statement)
            results.append((affected, query(conn, "SELECT id, t FROM split_nbe ORDER BY id")))
        finally:
            conn.close()
    direct, via = results
    assert direct[0] == (len(rows), 0)
    assert direct[1][0][1].endswith("\\") and "''" not in direct[1][1][1]
    assert via == direct


def test_split_insert_ignore(splitting, db):
    """INSERT IGNORE with duplicates in several pieces: affected rows and warnings add up."""
    rows = make_rows(1, 4 * LIMIT, seed=71)
    existing = rows[::9]
    setup = insert_batches("split_ign", existing)
    statement = values_statement("INSERT IGNORE", "split_ign", rows)
    direct = run_direct(db, "split_ign", setup, statement)
    conn = connect(splitting.proxy.port)
    try:
        fresh_table(conn, "split_ign", setup)
        result = execute(conn, statement)
        assert result == direct == (len(rows) - len(existing), len(existing))
        assert_same_rows(table_rows(conn, "split_ign"), expected_rows(rows))
    finally:
        conn.close()


def truncating_insert(port: int, table: str) -> tuple[tuple[int, int], list[tuple]]:
    """40 rows whose values are each truncated to 3 characters (a warning per row), in one
    statement of about 2.4 MB: the OK's (affected rows, warnings) and then SHOW WARNINGS."""
    rows = [b"(%d, '%s')" % (i, b"w" * 60_000) for i in range(40)]
    conn = connect(port)
    try:
        query(conn, "SET SESSION sql_mode = ''")
        query(conn, f"DROP TABLE IF EXISTS {table}")
        query(conn, f"CREATE TABLE {table} (id INT PRIMARY KEY, t VARCHAR(3))")
        ok = execute(conn, b"INSERT INTO %s VALUES " % table.encode() + b", ".join(rows))
        return ok, query(conn, "SHOW WARNINGS")
    finally:
        conn.close()


def test_split_warnings(splitting, db):
    """Truncation warnings of every piece add up in the OK, as MariaDB counts them unsplit."""
    direct, via = (truncating_insert(port, "split_w")[0] for port in (db.port, splitting.proxy.port))
    assert direct == (40, 40)
    assert via == direct


def test_split_show_warnings(splitting, db):
    """SHOW WARNINGS right after a split statement lists the warnings of all pieces, with "at row N"
    counted over the whole statement, as without the proxy."""
    direct, via = (truncating_insert(port, "split_sw")[1] for port in (db.port, splitting.proxy.port))
    # MariaDB: 1265 "Data truncated for column 't'"; TiDB: 1406 "Data too long for column 't'"
    assert len(direct) == 40 and direct[0][1] == {"mariadb": 1265, "tidb": 1406}[db.flavor], direct[0]
    assert via == direct, f"SHOW WARNINGS: {len(via)} rows through the proxy, {len(direct)} without"


def test_split_last_insert_id(splitting, db):
    """An AUTO_INCREMENT table: the OK's insert id and LAST_INSERT_ID() as without the proxy."""
    rows = [b"('" + bytes([97 + i % 26]) * 50_000 + b"')" for i in range(3 * LIMIT // 50_000)]
    statement = b"INSERT INTO split_ai (t) VALUES " + b", ".join(rows)
    results = []
    for port in (db.port, splitting.proxy.port):
        conn = connect(port)
        try:
            query(conn, "DROP TABLE IF EXISTS split_ai")
            query(conn, "CREATE TABLE split_ai (id INT AUTO_INCREMENT PRIMARY KEY, t LONGTEXT)")
            with conn.cursor() as cur:
                cur.execute(statement)
                results.append((cur.rowcount, cur.lastrowid, query(conn, "SELECT LAST_INSERT_ID()")[0][0]))
        finally:
            conn.close()
    direct, via = results
    assert direct == (len(rows), 1, 1)
    assert via[:2] == direct[:2]
    assert via[2] == direct[2], f"LAST_INSERT_ID() after a split insert: {via[2]}, without the proxy {direct[2]}"


# ---------------------------------------------------------------------------- memory


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


class RssSampler:
    """Samples a process's VmRSS every ``interval`` seconds in a thread; ``peak`` in KiB."""

    def __init__(self, pid: int, interval: float = 0.01) -> None:
        self.pid, self.interval = pid, interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, rss_kib(self.pid))
            except (OSError, RuntimeError):
                return
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self.peak = rss_kib(self.pid)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_kib(self.pid))


def test_memory_stays_bounded(db, proxy_factory, tmp_path):
    proxy = proxy_factory(db.port)
    pid = proxy.proc.pid
    conn = connect(proxy.port)
    report: dict[str, float] = {}
    try:
        query(conn, "DROP TABLE IF EXISTS mem_t")
        query(conn, "CREATE TABLE mem_t (id INT PRIMARY KEY, v LONGTEXT)")
        query(conn, "SELECT REPEAT('w', 1024 * 1024)")  # warm up buffers once
        baseline = rss_kib(pid)
        report["baseline_rss_mib"] = baseline / 1024

        # 200 MiB result set, read row by row (the client does not hold it either).
        start = time.monotonic()
        with RssSampler(pid) as sampler:
            with conn.cursor(pymysql.cursors.SSCursor) as cur:
                cur.execute(f"SELECT seq, REPEAT('m', 4 * 1024 * 1024) FROM {seq_table(db.flavor, 50)}")
                total = sum(len(v) for _, v in cur)
        assert total == 200 * MiB
        report["result_200mib_peak_rss_mib"] = sampler.peak / 1024
        report["result_200mib_seconds"] = time.monotonic() - start

        # A 60 MB statement (the shared server takes up to 64M). TiDB reads it whole, then
        # refuses the row (8025: over txn-entry-size-limit, 6 MiB): the proxy carried it all.
        statement = b"INSERT INTO mem_t VALUES (1, '" + b"s" * 60_000_000 + b"')"
        start = time.monotonic()
        with RssSampler(pid) as sampler:
            if db.flavor == "tidb":
                with pytest.raises(pymysql.err.MySQLError) as refused:
                    execute(conn, statement)
                assert refused.value.args[0] == 8025 and "the size of data is 600000" in refused.value.args[1], refused.value
            else:
                assert execute(conn, statement)[0] == 1
        report["statement_60mb_peak_rss_mib"] = sampler.peak / 1024
        report["statement_60mb_seconds"] = time.monotonic() - start
        if db.flavor != "tidb":
            assert query(conn, "SELECT LENGTH(v) FROM mem_t") == [(60_000_000,)]
        report["hwm_rss_mib"] = rss_kib(pid, "VmHWM") / 1024
        report["final_rss_mib"] = rss_kib(pid) / 1024
    finally:
        conn.close()
    # VmHWM also catches a spike between two samples (and the warm-up: conservative).
    peak = max(report["result_200mib_peak_rss_mib"], report["statement_60mb_peak_rss_mib"], report["hwm_rss_mib"])
    report["growth_mib"] = peak - report["baseline_rss_mib"]
    (tmp_path / "rss.json").write_text(json.dumps(report, indent=2))
    print("\nproxy RSS (MiB):", json.dumps({k: round(v, 1) for k, v in report.items()}))
    assert report["growth_mib"] < 64, report


def test_a_client_that_stops_reading_back_pressures_the_server(db, proxy_factory):
    """A client pauses in the middle of a 400 MiB result: the proxy does not buffer the rest
    (its RSS stays put) and the server stops sending (its Bytes_sent stops growing), then the
    client reads on and gets every byte."""
    proxy = proxy_factory(db.port)
    pid = proxy.proc.pid
    conn = connect(proxy.port)

    def bytes_sent() -> int:
        return server_bytes(db, "sent")

    try:
        query(conn, "SELECT REPEAT('w', 1024 * 1024)")  # warm up buffers once
        baseline = rss_kib(pid)
        with conn.cursor(pymysql.cursors.SSCursor) as cur:
            cur.execute(f"SELECT seq, REPEAT('p', 1024 * 1024) FROM {seq_table(db.flavor, 400)}")
            total = sum(len(cur.fetchone()[1]) for _ in range(5))
            time.sleep(1)  # the pipes fill up
            sent_before, rss_before = bytes_sent(), rss_kib(pid)
            time.sleep(3)  # the client reads nothing
            sent_during = bytes_sent() - sent_before
            rss_paused = rss_kib(pid)
            total += sum(len(v) for _, v in cur)
        print(f"\nslow reader: proxy RSS {baseline / 1024:.1f} -> {rss_paused / 1024:.1f} MiB while paused; "
              f"server sent {sent_during / 1024:.0f} KiB in 3 s of pause")  # fmt: skip
        assert total == 400 * MiB
        assert rss_paused - baseline < 32 * 1024, (baseline, rss_before, rss_paused)
        assert sent_during < 4 * MiB, sent_during  # the server is held back, not draining into the proxy
    finally:
        conn.close()


def test_memory_of_a_split_statement(db, proxy_factory, tmp_path):
    """Informational plus a loose bound: a 50 MiB statement split under a 1 MiB limit is held
    whole by the proxy (it needs the text to cut it), so growth is about its size."""
    proxy = proxy_factory(db.port, limits={"max_allowed_packet": "1MiB", "oversized": "split"})
    pid = proxy.proc.pid
    rows = make_rows(1, 50 * LIMIT, seed=61)
    statement = values_statement("INSERT", "mem_split", rows)
    conn = connect(proxy.port)
    try:
        fresh_table(conn, "mem_split")
        baseline = rss_kib(pid)
        start = time.monotonic()
        with RssSampler(pid) as sampler:
            assert execute(conn, statement)[0] == len(rows)
        report = {
            "statement_mib": len(statement) / MiB,
            "baseline_rss_mib": baseline / 1024,
            "split_peak_rss_mib": sampler.peak / 1024,
            "growth_mib": (sampler.peak - baseline) / 1024,
            "seconds": time.monotonic() - start,
        }
    finally:
        conn.close()
    (tmp_path / "rss_split.json").write_text(json.dumps(report, indent=2))
    print("\nproxy RSS, 50 MiB split statement (MiB):", json.dumps({k: round(v, 1) for k, v in report.items()}))
    assert report["growth_mib"] < 4 * report["statement_mib"] + 64, report
