"""Self-test of the fault-injection shim (tests/lab/faultshim.py), driven by real clients
(PyMySQL, mysql-connector-python, a raw-protocol client for CLIENT_DEPRECATE_EOF) straight
against the shared lab MariaDB: no proxy involved."""

from __future__ import annotations

import itertools
import socket
import struct
import threading
import time
from typing import Any, Iterator

import pymysql
import pytest
from pymysql.constants import CLIENT

from tests.lab.faultshim import (
    CLIENT_DEPRECATE_EOF,
    MAX_FRAME,
    Command,
    FaultShim,
    ResponseTracker,
)
from tests.lab.fixtures import APP_PASSWORD, APP_USER
from tests.lab.mariadb import HOST, MariaDB

LOST = (2013, 2006, 2055)  # PyMySQL's "connection lost" error codes
MiB = 1024 * 1024
_names = itertools.count()


@pytest.fixture
def shim(mariadb: MariaDB) -> Iterator[FaultShim]:
    with FaultShim(mariadb.port) as s:
        yield s
        assert s.running, "the shim thread died"
    s.check()


@pytest.fixture
def table(mariadb: MariaDB) -> str:
    name = f"test.fs_{next(_names)}_{int(time.time() * 1000) % 100000}"
    mariadb.query(f"DROP TABLE IF EXISTS {name}")
    mariadb.query(f"CREATE TABLE {name} (id INT PRIMARY KEY, v VARCHAR(64))")
    return name


def connect(shim: FaultShim, **kwargs: Any) -> pymysql.connections.Connection:
    args = {
        "host": HOST,
        "port": shim.port,
        "user": APP_USER,
        "password": APP_PASSWORD,
        "database": "test",
        "autocommit": True,
        "connect_timeout": 5,
        "read_timeout": 20,
        "write_timeout": 20,
        **kwargs,
    }
    return pymysql.connect(**args)


def query(conn: pymysql.connections.Connection, sql: str) -> list[tuple]:
    with conn.cursor() as cur:
        cur.execute(sql)
        return list(cur.fetchall())


def lost(exc_info: pytest.ExceptionInfo) -> bool:
    return exc_info.value.args[0] in LOST


def rows(mariadb: MariaDB, table: str) -> list[tuple]:
    return mariadb.query(f"SELECT id, v FROM {table} ORDER BY id")


def summaries(shim: FaultShim, sql_prefix: str) -> list[str]:
    return [e.detail for e in shim.events("response") if (e.sql or "").startswith(sql_prefix)]


pytestmark = pytest.mark.integration


# -- pass-through and observability ---------------------------------------------------------------


def test_passthrough_multi_results_and_log(shim: FaultShim) -> None:
    conn = connect(shim, client_flag=CLIENT.MULTI_STATEMENTS)
    with conn.cursor() as cur:
        cur.execute("SELECT 1; SELECT 2, 3 UNION SELECT 4, 5; DO 1; SELECT 'x'")
        sets = [tuple(cur.fetchall())]
        while cur.nextset():
            sets.append(tuple(cur.fetchall()))
    assert sets == [((1,),), ((2, 3), (4, 5)), (), (("x",),)]
    assert summaries(shim, "SELECT 1; SELECT 2") == ["4 result(s), 4 row(s)"]
    assert query(conn, "SELECT 7") == [(7,)]
    # The responses were tracked to their end: the connection counts as idle.
    (idx,) = [e.conn for e in shim.events("login")]
    assert shim.close_idle_connections() == [idx]
    with pytest.raises(pymysql.err.OperationalError) as exc:
        query(conn, "SELECT 8")
    assert lost(exc)
    assert shim.commands("SELECT 8", forwarded=None) == []  # the shim had closed the socket


def test_user_filter_and_error_response(shim: FaultShim, table: str) -> None:
    rule = shim.close_before(match="INSERT", user="someone-else")
    conn = connect(shim)
    query(conn, f"INSERT INTO {table} VALUES (1, 'a')")
    with pytest.raises(pymysql.err.IntegrityError):
        query(conn, f"INSERT INTO {table} VALUES (1, 'b')")
    assert summaries(shim, "INSERT")[-1] == "err 1062"
    assert rule.applied == 0 and shim.count("INSERT") == 2
    assert query(conn, "SELECT 1") == [(1,)]


# -- faults --------------------------------------------------------------------------------------


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
def test_drop_answer_runs_on_server_client_gets_connection_error(shim: FaultShim, mariadb: MariaDB, table: str, reset: bool) -> None:
    conn = connect(shim)
    rule = shim.drop_answer(match=lambda c: c.sql is not None and c.sql.startswith("INSERT"), reset=reset)
    with pytest.raises(pymysql.err.OperationalError) as exc:
        query(conn, f"INSERT INTO {table} VALUES (1, 'dropped')")
    assert lost(exc)
    assert shim.wait_applied(rule, 5)
    assert rows(mariadb, table) == [(1, "dropped")]
    assert shim.count("INSERT") == 1
    assert rule.matched[0].sql.startswith("INSERT") and rule.applied == 1
    # A new connection through the shim works, and the spent rule no longer fires.
    conn2 = connect(shim)
    query(conn2, f"INSERT INTO {table} VALUES (2, 'after')")
    assert rows(mariadb, table) == [(1, "dropped"), (2, "after")]


def test_drop_answer_waits_for_the_whole_multi_result(shim: FaultShim, mariadb: MariaDB, table: str) -> None:
    conn = connect(shim, client_flag=CLIENT.MULTI_STATEMENTS)
    rule = shim.drop_answer(match="INSERT")
    start = time.monotonic()
    with pytest.raises(pymysql.err.OperationalError) as exc:
        with conn.cursor() as cur:
            cur.execute(f"INSERT INTO {table} VALUES (1, 'a'); SELECT SLEEP(0.3); INSERT INTO {table} VALUES (2, 'b')")
            while cur.nextset():
                pass
    assert lost(exc)
    assert time.monotonic() - start >= 0.3
    assert shim.wait_applied(rule, 5)
    assert rows(mariadb, table) == [(1, "a"), (2, "b")]
    fault = [e for e in shim.events("fault") if e.rule is rule][0]
    assert "3 result(s)" in fault.detail


def test_close_before_never_reaches_server(shim: FaultShim, mariadb: MariaDB, table: str) -> None:
    conn = connect(shim)
    rule = shim.close_before(match="INSERT")
    with pytest.raises(pymysql.err.OperationalError) as exc:
        query(conn, f"INSERT INTO {table} VALUES (1, 'never')")
    assert lost(exc)
    assert shim.wait_applied(rule, 5)
    assert rows(mariadb, table) == []
    assert shim.count("INSERT") == 0
    assert shim.count("INSERT", forwarded=False) == 1


def test_close_before_in_transaction_rolls_back(shim: FaultShim, mariadb: MariaDB, table: str) -> None:
    conn = connect(shim)
    query(conn, "BEGIN")
    query(conn, f"INSERT INTO {table} VALUES (1, 'uncommitted')")
    rule = shim.close_before(match="COMMIT")
    with pytest.raises(pymysql.err.OperationalError):
        query(conn, "COMMIT")
    assert shim.wait_applied(rule, 5)
    assert shim.count("COMMIT") == 0
    assert rows(mariadb, table) == []


def test_cut_result_relays_partial_data(shim: FaultShim) -> None:
    conn = connect(shim)
    rule = shim.cut_result(30, match="SELECT REPEAT")
    with pytest.raises(pymysql.err.OperationalError) as exc:
        query(conn, "SELECT REPEAT('a', 5000) AS big")
    assert lost(exc)
    assert shim.wait_applied(rule, 5)
    fault = [e for e in shim.events("fault") if e.rule is rule][0]
    assert "relayed 30 byte(s)" in fault.detail


def test_cut_result_beyond_the_end_relays_all_then_closes(shim: FaultShim) -> None:
    conn = connect(shim)
    rule = shim.cut_result(10 * MiB, match="SELECT 5")
    assert query(conn, "SELECT 5") == [(5,)]
    assert shim.wait_applied(rule, 5)
    with pytest.raises(pymysql.err.OperationalError):
        query(conn, "SELECT 6")


def test_stall_delays_the_answer(shim: FaultShim) -> None:
    conn = connect(shim)
    rule = shim.stall(0.5, match="SELECT 42")
    start = time.monotonic()
    assert query(conn, "SELECT 42") == [(42,)]
    assert time.monotonic() - start >= 0.5
    assert shim.wait_applied(rule, 1)
    assert query(conn, "SELECT 43") == [(43,)]


def test_stall_until_release_and_then_close(shim: FaultShim) -> None:
    conn = connect(shim)
    rule = shim.stall(match="SELECT 'held'")
    result: list[Any] = []
    worker = threading.Thread(target=lambda: result.append(query(conn, "SELECT 'held'")))
    worker.start()
    assert shim.wait_command("SELECT 'held'", 5)
    time.sleep(0.3)
    assert not result and rule.applied == 0
    assert shim.release() == 1
    worker.join(5)
    assert result == [[("held",)]] and rule.applied == 1

    closing = shim.stall(0.2, match="SELECT 'closed'", then_close=True)
    with pytest.raises(pymysql.err.OperationalError) as exc:
        query(conn, "SELECT 'closed'")
    assert lost(exc) and shim.wait_applied(closing, 5)  # counted after the close the client saw


def test_close_idle_connections_spares_busy_ones(shim: FaultShim) -> None:
    idle = connect(shim)
    busy = connect(shim)
    query(idle, "SELECT 1")
    result: list[Any] = []
    worker = threading.Thread(target=lambda: result.append(query(busy, "SELECT SLEEP(1), 'done'")))
    worker.start()
    assert shim.wait_command("SELECT SLEEP(1)", 5)
    closed = shim.close_idle_connections()
    worker.join(10)
    assert result == [[(0, "done")]]
    assert len(closed) == 1
    with pytest.raises(pymysql.err.OperationalError) as exc:
        query(idle, "SELECT 2")
    assert lost(exc)
    assert query(busy, "SELECT 3") == [(3,)]
    shim.close_all()
    with pytest.raises(pymysql.err.OperationalError):
        query(busy, "SELECT 4")


def test_crash_cuts_every_connection_and_refuses_connects_while_down(shim: FaultShim) -> None:
    idle, busy = connect(shim), connect(shim)
    worker = threading.Thread(target=lambda: shim.crash(down=1.0))
    result: list[Any] = []
    sleeper = threading.Thread(target=lambda: result.append(_lost_or_rows(busy, "SELECT SLEEP(3)")))
    sleeper.start()
    assert shim.wait_command("SELECT SLEEP(3)", 5)
    started = time.monotonic()
    worker.start()
    sleeper.join(10)
    assert result == ["lost"]  # the running query's connection was cut too
    with pytest.raises(pymysql.err.OperationalError) as exc:
        query(idle, "SELECT 1")
    assert lost(exc)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((HOST, shim.port), timeout=2).close()
    worker.join(10)
    assert time.monotonic() - started >= 1.0
    assert query(connect(shim), "SELECT 2") == [(2,)]  # the port is back
    assert [e.kind for e in shim.log if e.kind == "crash"] == ["crash"]


def _lost_or_rows(conn: pymysql.connections.Connection, sql: str) -> Any:
    try:
        return query(conn, sql)
    except Exception as exc:
        return "lost" if isinstance(exc, pymysql.err.OperationalError) and exc.args[0] in LOST else repr(exc)


# -- big results: 16 MiB continuation frames -------------------------------------------------------


def test_results_over_16_mib(shim: FaultShim) -> None:
    conn = connect(shim, read_timeout=60)
    # One row of 17 MiB: continuation frames, and a row whose first byte is 0xFE (8-byte length).
    ((value,),) = query(conn, f"SELECT REPEAT('x', {17 * MiB})")
    assert len(value) == 17 * MiB and value == "x" * (17 * MiB)
    # 20 MB of small rows.
    got = query(conn, "SELECT seq, REPEAT('y', 4000) FROM seq_1_to_5000")
    assert len(got) == 5000 and got[-1] == (5000, "y" * 4000)
    assert summaries(shim, "SELECT seq") == ["1 result(s), 5000 row(s)"]
    # Held and relayed intact.
    shim.stall(0.2, match="SELECT REPEAT")
    ((value,),) = query(conn, f"SELECT REPEAT('z', {16 * MiB + 10})")
    assert value == "z" * (16 * MiB + 10)
    # Dropped only once the whole 17 MiB answer is in.
    rule = shim.drop_answer(match="SELECT REPEAT")
    with pytest.raises(pymysql.err.OperationalError):
        query(conn, f"SELECT REPEAT('w', {17 * MiB})")
    assert shim.wait_applied(rule, 10)
    fault = [e for e in shim.events("fault") if e.rule is rule][0]
    assert "1 result(s), 1 row(s)" in fault.detail


def test_command_over_16_mib(shim: FaultShim, mariadb: MariaDB, table: str) -> None:
    mariadb.query(f"ALTER TABLE {table} MODIFY v LONGTEXT")
    conn = connect(shim, max_allowed_packet=64 * MiB)
    big = "q" * (17 * MiB)
    with conn.cursor() as cur:
        cur.execute(f"INSERT INTO {table} VALUES (1, %s)", (big,))
    cmd = shim.commands("INSERT")[0]
    assert len(cmd.payload) > MAX_FRAME and cmd.sql.endswith("')")
    assert mariadb.query(f"SELECT LENGTH(v) FROM {table}") == [(17 * MiB,)]


# -- prepared statements (mysql-connector-python) ------------------------------------------------


def test_prepared_statements(shim: FaultShim, mariadb: MariaDB, table: str) -> None:
    connector = pytest.importorskip("mysql.connector")

    def connect():
        return connector.connect(host=HOST, port=shim.port, user=APP_USER, password=APP_PASSWORD, database="test",
                                 autocommit=True, use_pure=True, ssl_disabled=True, connection_timeout=10)  # fmt: skip

    conn = connect()
    try:
        cur = conn.cursor(prepared=True)
        cur.execute(f"INSERT INTO {table} VALUES (?, ?)", (1, "one"))
        cur.execute(f"SELECT id, v FROM {table} WHERE id >= ?", (0,))
        assert cur.fetchall() == [(1, "one")]
        prepared = shim.commands(lambda c: c.code == 0x16)
        assert any(c.sql.startswith("SELECT id, v") for c in prepared)
        assert shim.commands(lambda c: c.code == 0x17)
        # The binary result set was tracked to its end: the connection is idle.
        assert shim.close_idle_connections() and shim.events("close")
    finally:
        try:
            conn.close()
        except Exception:
            pass

    conn = connect()
    try:
        cur = conn.cursor(prepared=True)
        rule = shim.drop_answer(match=lambda c: c.code == 0x17)  # COM_STMT_EXECUTE
        with pytest.raises(connector.Error) as exc:
            cur.execute(f"INSERT INTO {table} VALUES (?, ?)", (2, "two"))
        assert exc.value.errno in LOST
        assert shim.wait_applied(rule, 5)
        assert rows(mariadb, table) == [(1, "one"), (2, "two")]
    finally:
        try:
            conn.close()
        except Exception:
            pass


# -- CLIENT_DEPRECATE_EOF with a raw-protocol client ----------------------------------------------


def _frame(seq: int, payload: bytes) -> bytes:
    return struct.pack("<I", len(payload))[:3] + bytes([seq]) + payload


def _read_packet(sock: socket.socket) -> bytes:
    head = _recv_exact(sock, 4)
    return _recv_exact(sock, int.from_bytes(head[:3], "little"))


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def test_deprecate_eof_raw_client(shim: FaultShim) -> None:
    """PyMySQL never negotiates CLIENT_DEPRECATE_EOF (the proxy passes through what its client
    asks for); a raw client does, as root with an empty password."""
    caps = 0x200 | 0x8000 | 0x80000 | 0x10000 | 0x20000 | 0x2000 | CLIENT_DEPRECATE_EOF
    sock = socket.create_connection((HOST, shim.port), timeout=5)
    try:
        greeting = _read_packet(sock)
        server_caps = struct.unpack_from("<H", greeting, greeting.index(b"\0", 1) + 1 + 4 + 8 + 1)[0]
        assert greeting[0] == 10 and server_caps
        response = struct.pack("<IIB23x", caps, 16 * MiB, 45) + b"root\0" + b"\0" + b"mysql_native_password\0"
        sock.sendall(_frame(1, response))
        assert _read_packet(sock)[0] == 0x00
        sock.sendall(_frame(0, b"\x03SELECT 1 UNION SELECT 2; SELECT 'a', 'b' FROM test.seq_1_to_3; DO 1"))
        data = b""
        sock.settimeout(0.5)
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except socket.timeout:
            pass
        assert data
        assert shim.wait_for(lambda: bool(summaries(shim, "SELECT 1 UNION")), 5)
        assert summaries(shim, "SELECT 1 UNION") == ["3 result(s), 5 row(s)"]
        assert len(shim.close_idle_connections()) == 1
    finally:
        sock.close()


# -- the tracker on synthetic packets --------------------------------------------------------------


def _feed(tracker: ResponseTracker, packets: list[bytes]) -> list[bool]:
    return [tracker.packet(p[:512], len(p)) for p in packets]


def test_tracker_synthetic() -> None:
    eof_more = b"\xfe\x00\x00\x0a\x00"  # status AUTOCOMMIT | MORE_RESULTS
    eof = b"\xfe\x00\x00\x02\x00"
    coldef = b"\x03def" + b"\x00" * 20
    # A text result set, then an OK, classic EOFs, with a MariaDB progress report in between.
    t = ResponseTracker(0x03)
    progress = b"\xff\xff\xff\x01\x01\x00\x00\x00"
    assert _feed(t, [b"\x01", coldef, eof, progress, b"\x011", eof_more, b"\x00\x01\x00\x02\x00\x00\x00"]) == [False] * 6 + [True]
    # DEPRECATE_EOF: no EOF after the definitions; a 16 MiB row starting with 0xFE is a row.
    t = ResponseTracker(0x03, deprecate_eof=True)
    big_row = b"\xfe" + (17 * MiB).to_bytes(8, "little") + b"x" * 100
    assert _feed(t, [b"\x01", coldef, b"\x011"]) == [False] * 3
    assert t.packet(big_row, 17 * MiB + 9) is False
    assert t.packet(b"\xfe\x00\x00\x02\x00\x00\x00", 7) is True
    assert t.rows == 2
    # PREPARE_OK with 2 params and 1 column, classic EOFs.
    t = ResponseTracker(0x16)
    prep = b"\x00" + struct.pack("<IHHxH", 1, 1, 2, 0)
    assert _feed(t, [prep, coldef, coldef, eof, coldef, eof]) == [False] * 5 + [True]
    # COM_STMT_EXECUTE opening a cursor: ends after the definitions.
    t = ResponseTracker(0x17)
    assert _feed(t, [b"\x01", coldef, b"\xfe\x00\x00\x42\x00"]) == [False, False, True]
    # COM_STMT_CLOSE has no response; COM_CHANGE_USER ends at OK after an auth switch.
    assert ResponseTracker(0x19).done
    t = ResponseTracker(0x11)
    assert _feed(t, [b"\xfemysql_native_password\x00" + b"s" * 20, b"\x00\x00\x00\x02\x00\x00\x00"]) == [False, True]
    assert Command(0, 0x03, b"SELECT 1").sql == "SELECT 1" and Command(0, 0x17, b"\x05\x00\x00\x00").stmt_id == 5
