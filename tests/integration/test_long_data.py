"""COM_STMT_SEND_LONG_DATA through the proxy, on MariaDB and TiDB: what the server gets is
exactly what the client sent, also when a transaction is replayed on a new connection after
the old one was lost; pieces past limits.spool_threshold live in the session's spool file,
within a per-session limit (limits.long_data_spool) that ends in a clear 1153."""

from __future__ import annotations

import hashlib
import re

import pymysql
import pytest

from tests.lab import rawps
from tests.lab.faultshim import FaultShim

pytestmark = pytest.mark.integration

MiB = 1 << 20


def value(n: int, seed: int) -> bytes:
    """``n`` bytes no compression or run-length trick would make small."""
    block = hashlib.sha512(str(seed).encode()).digest()
    return (block * (n // len(block) + 1))[:n]


def stored(port: int, row: int) -> tuple[int, str] | None:
    conn = pymysql.connect(host="127.0.0.1", port=port, user="root", password="", database="test", read_timeout=60)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT LENGTH(data), SHA1(data) FROM long_data WHERE id = %s", (row,))
            found = cur.fetchone()
            return (int(found[0]), found[1]) if found else None
    finally:
        conn.close()


@pytest.fixture
def table(db):
    conn = pymysql.connect(host="127.0.0.1", port=db.port, user="root", password="", database="test")
    with conn.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS long_data")
        cur.execute("CREATE TABLE long_data (id BIGINT PRIMARY KEY, data LONGBLOB)")
    conn.close()
    return db


def pieces_for(db) -> list[bytes]:
    # One piece past the spool threshold (4 MiB), one under it; TiDB keeps a row under 6 MiB.
    big = 5 * MiB if db.flavor == "mariadb" else 4 * MiB + 512 * 1024
    return [value(big, 1), value(MiB // 2, 2)]


def test_long_data_reaches_the_server_exactly(table, proxy_factory):
    proxy = proxy_factory(table.port)
    conn = rawps.connect(proxy.port)
    stmt = rawps.prepare(conn, "INSERT INTO long_data (id, data) VALUES (?, ?)")
    pieces = pieces_for(table)
    for piece in pieces:
        rawps.send_long_data(conn, stmt, 1, piece)
    rawps.execute(conn, stmt, [1, rawps.LONG_DATA])
    whole = b"".join(pieces)
    assert stored(table.port, 1) == (len(whole), hashlib.sha1(whole).hexdigest())
    conn.close()


def test_long_data_is_sent_again_exactly_when_a_transaction_is_replayed(table, proxy_factory):
    """The connection is lost inside the transaction, after the execute: the proxy replays the
    journal on a new connection -- long data included, all of it -- and COMMIT goes through."""
    with FaultShim(table.port) as shim:
        proxy = proxy_factory(shim.port)
        conn = rawps.connect(proxy.port)
        stmt = rawps.prepare(conn, "INSERT INTO long_data (id, data) VALUES (?, ?)")
        with conn.cursor() as cur:
            cur.execute("BEGIN")
        pieces = pieces_for(table)
        for piece in pieces:
            rawps.send_long_data(conn, stmt, 1, piece)
        rawps.execute(conn, stmt, [2, rawps.LONG_DATA])
        assert shim.close_idle_connections()  # the server's connection is gone, the transaction with it
        with conn.cursor() as cur:
            cur.execute("COMMIT")
        whole = b"".join(pieces)
        assert stored(table.port, 2) == (len(whole), hashlib.sha1(whole).hexdigest())
        assert re.search(r"replayed [1-9]\d* statement", proxy.log_text())  # the journal ran again
        conn.close()


def test_the_long_data_spool_has_a_limit_per_session(table, proxy_factory):
    proxy = proxy_factory(table.port, limits={"long_data_spool": "8MiB"})
    conn = rawps.connect(proxy.port)
    stmt = rawps.prepare(conn, "INSERT INTO long_data (id, data) VALUES (?, ?)")
    other = rawps.prepare(conn, "INSERT INTO long_data (id, data) VALUES (?, ?)")
    rawps.send_long_data(conn, stmt, 1, value(5 * MiB, 3))
    rawps.send_long_data(conn, other, 1, value(4 * MiB, 4))  # the session's spool is now over 8 MiB
    with pytest.raises(pymysql.err.MySQLError) as refused:
        rawps.execute(conn, other, [3, rawps.LONG_DATA])
    assert refused.value.args[0] == 1153 and "limits.long_data_spool" in refused.value.args[1]
    rawps.execute(conn, stmt, [4, rawps.LONG_DATA])  # the statement within the limit still runs
    assert stored(table.port, 4)[0] == 5 * MiB
    conn.close()


@pytest.mark.parametrize("when", ["idle", "in flight"])
def test_pending_long_data_is_sent_again_when_the_statement_is_prepared_again(table, proxy_factory, when):
    """The connection is lost between the long data and its execute (``idle``: once the server
    has it all; ``in flight``: while the proxy still forwards it): the proxy prepares the
    statement again on a new connection and sends the long data again, once, before the execute."""
    with FaultShim(table.port) as shim:
        proxy = proxy_factory(shim.port)
        conn = rawps.connect(proxy.port)
        stmt = rawps.prepare(conn, "INSERT INTO long_data (id, data) VALUES (?, ?)")
        pieces = pieces_for(table)
        for piece in pieces:
            rawps.send_long_data(conn, stmt, 1, piece)
        if when == "idle":
            assert shim.wait_for(lambda: shim.count(lambda c: c.name == "COM_STMT_SEND_LONG_DATA") == len(pieces))
        assert shim.close_idle_connections()
        rawps.execute(conn, stmt, [5, rawps.LONG_DATA])
        whole = b"".join(pieces)
        assert stored(table.port, 5) == (len(whole), hashlib.sha1(whole).hexdigest())  # neither lost nor doubled
        conn.close()
