"""A minimal streaming reader for big result sets: the client's own cost stays far below the hop's.

PyMySQL logs in (handshake, authentication); then the query is sent as COM_QUERY and the reply
is read straight from the socket in 1 MiB chunks, walking the packet headers without decoding
rows. Only the framing is checked: column count, column definitions, EOF, rows, final EOF (or
ERR). The mariadb CLI, by comparison, formats every row and tops out near 70-100 MB/s here.
"""

from __future__ import annotations

import socket
import time

import pymysql
from pymysql.constants import CLIENT, COMMAND


class RawQueryError(RuntimeError):
    pass


def connect(port: int, **kwargs) -> pymysql.connections.Connection:
    params = dict(
        host="127.0.0.1",
        port=port,
        user="app",
        password="apppw",
        autocommit=None,
        ssl_disabled=True,
        connect_timeout=10,
        read_timeout=300,
        write_timeout=300,
    )
    params.update(kwargs)
    return pymysql.connect(**params)


def stream_query(conn: pymysql.connections.Connection, sql: bytes, timeout: float = 300) -> tuple[int, int]:
    """Run ``sql``, read the whole result; return (rows, bytes received)."""
    if conn.server_capabilities & CLIENT.DEPRECATE_EOF and conn.client_flag & CLIENT.DEPRECATE_EOF:
        raise RawQueryError("CLIENT_DEPRECATE_EOF negotiated: this reader expects EOF packets")
    conn._execute_command(COMMAND.COM_QUERY, sql)
    sock: socket.socket = conn._sock
    deadline = time.monotonic() + timeout
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    pending = b""  # bytes of an incomplete packet carried over to the next read
    total = 0
    rows = 0
    # States: 0 = expect column count, 1 = column definitions until EOF, 2 = rows until EOF.
    state = 0
    columns_left = 0
    while True:
        if time.monotonic() > deadline:
            raise RawQueryError(f"result not complete after {timeout} s ({rows} rows, {total} bytes)")
        n = sock.recv_into(buf)
        if n == 0:
            raise RawQueryError(f"connection closed mid-result after {rows} rows, {total} bytes")
        total += n
        data = pending + bytes(view[:n]) if pending else view[:n]
        pos = 0
        end = len(data)
        while pos + 4 <= end:
            length = data[pos] | (data[pos + 1] << 8) | (data[pos + 2] << 16)
            if pos + 4 + length > end:
                break
            first = data[pos + 4] if length else -1
            if state == 2:
                if first == 0xFE and length < 9:
                    if pos + 4 + length != end:
                        raise RawQueryError("bytes after the final EOF")
                    return rows, total
                if first == 0xFF:
                    raise RawQueryError(f"ERR after {rows} rows: {bytes(data[pos + 4 : pos + 4 + length])[3:]!r}")
                rows += 1
            elif state == 0:
                if first == 0xFF:
                    raise RawQueryError(f"ERR: {bytes(data[pos + 4 : pos + 4 + length])[3:]!r}")
                if first == 0x00:
                    raise RawQueryError("OK instead of a result set")
                columns_left = first
                state = 1
            else:
                if first == 0xFE and length < 9:
                    if columns_left != 0:
                        raise RawQueryError("EOF before all column definitions")
                    state = 2
                else:
                    columns_left -= 1
            pos += 4 + length
        pending = bytes(data[pos:end])
