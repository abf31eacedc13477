"""Server-side prepared statements with long data, over PyMySQL's socket (PyMySQL itself has
no prepared statements): COM_STMT_PREPARE, COM_STMT_SEND_LONG_DATA, COM_STMT_EXECUTE,
COM_STMT_RESET and COM_STMT_CLOSE, byte for byte as the protocol has them.

    conn = rawps.connect(port)
    stmt = rawps.prepare(conn, "INSERT INTO t (id, data) VALUES (?, ?)")
    rawps.send_long_data(conn, stmt, 1, b"x" * (5 << 20))    # parameter 1, no answer
    rawps.execute(conn, stmt, [1, rawps.LONG_DATA])            # OK packet (or raises)
"""

from __future__ import annotations

import struct

import pymysql
from pymysql.constants import COMMAND

__all__ = ["connect", "prepare", "send_long_data", "execute", "reset", "close", "LONG_DATA", "Prepared"]

LONG_DATA = object()  # a parameter whose value went by COM_STMT_SEND_LONG_DATA
_LONGLONG, _BLOB, _NULL = 8, 252, 6


class Prepared:
    def __init__(self, stmt_id: int, params: int, columns: int) -> None:
        self.id, self.params, self.columns = stmt_id, params, columns


def connect(port: int, user: str = "app", password: str = "apppw", database: str = "test", **kw) -> pymysql.Connection:
    return pymysql.connect(host="127.0.0.1", port=port, user=user, password=password, database=database, autocommit=True,
                           connect_timeout=10, read_timeout=120, write_timeout=120, **kw)  # fmt: skip


def _definitions(conn: pymysql.Connection, n: int) -> None:
    """Skip ``n`` column definitions and their EOF (no CLIENT_DEPRECATE_EOF here)."""
    if n:
        for _ in range(n):
            conn._read_packet()
        conn._read_packet()


def prepare(conn: pymysql.Connection, sql: str) -> Prepared:
    conn._execute_command(COMMAND.COM_STMT_PREPARE, sql.encode())
    packet = conn._read_packet()  # raises on an ERR
    data = packet.get_all_data()
    stmt_id, columns, params = struct.unpack_from("<IHH", data, 1)
    _definitions(conn, params)
    _definitions(conn, columns)
    return Prepared(stmt_id, params, columns)


def send_long_data(conn: pymysql.Connection, stmt: Prepared, param: int, data: bytes) -> None:
    """One COM_STMT_SEND_LONG_DATA (the server never answers it)."""
    conn._execute_command(COMMAND.COM_STMT_SEND_LONG_DATA, struct.pack("<IH", stmt.id, param) + data)


def execute(conn: pymysql.Connection, stmt: Prepared, values: list) -> pymysql.connections.MysqlPacket:
    """Execute with ``values`` (int, bytes, None or LONG_DATA); types bound every time. Returns
    the OK packet; an ERR raises; a result set is read and dropped."""
    bitmap = bytearray((len(values) + 7) // 8)
    types, body = b"", b""
    for i, value in enumerate(values):
        if value is None:
            bitmap[i // 8] |= 1 << (i % 8)
            types += struct.pack("<H", _NULL)
        elif value is LONG_DATA:
            types += struct.pack("<H", _BLOB)
        elif isinstance(value, int):
            types += struct.pack("<H", _LONGLONG)
            body += struct.pack("<q", value)
        else:
            types += struct.pack("<H", _BLOB)
            body += _lenenc(len(value)) + value
    payload = struct.pack("<IBI", stmt.id, 0, 1) + bytes(bitmap) + b"\x01" + types + body
    conn._execute_command(COMMAND.COM_STMT_EXECUTE, payload)
    packet = conn._read_packet()
    if packet.is_ok_packet():
        return packet
    columns = packet.read_length_encoded_integer()
    _definitions(conn, columns)
    while not conn._read_packet().is_eof_packet():
        pass
    return packet


def reset(conn: pymysql.Connection, stmt: Prepared) -> None:
    conn._execute_command(COMMAND.COM_STMT_RESET, struct.pack("<I", stmt.id))
    conn._read_packet()


def close(conn: pymysql.Connection, stmt: Prepared) -> None:
    conn._execute_command(COMMAND.COM_STMT_CLOSE, struct.pack("<I", stmt.id))  # no answer


def _lenenc(n: int) -> bytes:
    if n < 251:
        return bytes((n,))
    if n < 1 << 16:
        return b"\xfc" + struct.pack("<H", n)
    if n < 1 << 24:
        return b"\xfd" + struct.pack("<I", n)[:3]
    return b"\xfe" + struct.pack("<Q", n)
