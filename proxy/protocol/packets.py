"""Parsing and building of individual MySQL packets (payloads, without the 4-byte frame header).

Everything that parses untrusted bytes goes through ``Reader``, which raises ProtocolError on
truncation instead of returning short data.
"""

from __future__ import annotations

import struct
from typing import Final

import attrs
from mysql_mimic.types import uint_len

from proxy.protocol.constants import Capabilities, ServerStatus

__all__ = [
    "ProtocolError",
    "Reader",
    "lenenc_int",
    "lenenc_str",
    "OkPacket",
    "ErrPacket",
    "parse_ok",
    "parse_err",
    "parse_eof",
    "make_ok",
    "make_err",
    "make_eof",
    "ServerHandshake",
    "parse_server_handshake",
    "make_server_handshake",
    "HandshakeResponse",
    "parse_handshake_response",
    "make_handshake_response",
    "AuthSwitch",
    "parse_auth_switch",
    "make_auth_switch",
    "ChangeUser",
    "parse_change_user",
    "PrepareOk",
    "parse_prepare_ok",
]

OK_HEADER: Final = 0x00
EOF_HEADER: Final = 0xFE
ERR_HEADER: Final = 0xFF
LOCAL_INFILE_HEADER: Final = 0xFB
AUTH_MORE_DATA = 0x01
AUTH_SWITCH = 0xFE


class ProtocolError(Exception):
    """The peer sent bytes that are not a valid packet here."""


class Reader:
    """Bounds-checked reader over one payload."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def _take(self, n: int) -> bytes:
        end = self.pos + n
        if n < 0 or end > len(self.data):
            raise ProtocolError(f"packet truncated: wanted {n} bytes at offset {self.pos}, have {self.remaining()}")
        out = bytes(self.data[self.pos : end])
        self.pos = end
        return out

    def u8(self) -> int:
        if self.pos >= len(self.data):
            raise ProtocolError(f"packet truncated at offset {self.pos}")
        self.pos += 1
        return self.data[self.pos - 1]

    def u16(self) -> int:
        return int.from_bytes(self._take(2), "little")

    def u24(self) -> int:
        return int.from_bytes(self._take(3), "little")

    def u32(self) -> int:
        return int.from_bytes(self._take(4), "little")

    def fixed(self, n: int) -> bytes:
        return self._take(n)

    def rest(self) -> bytes:
        return self._take(self.remaining())

    def lenenc(self) -> int:
        first = self.u8()
        if first < 0xFB:
            return first
        if first == 0xFC:
            return int.from_bytes(self._take(2), "little")
        if first == 0xFD:
            return int.from_bytes(self._take(3), "little")
        if first == 0xFE:
            return int.from_bytes(self._take(8), "little")
        raise ProtocolError(f"invalid length-encoded integer prefix 0x{first:02x}")

    def lenenc_str(self) -> bytes:
        return self._take(self.lenenc())

    def null_str(self) -> bytes:
        end = self.data.find(b"\x00", self.pos)
        if end < 0:
            raise ProtocolError(f"unterminated string at offset {self.pos}")
        out = bytes(self.data[self.pos : end])
        self.pos = end + 1
        return out

    def null_str_or_rest(self) -> bytes:
        """A NUL-terminated string that some peers send without the terminator at packet end."""
        end = self.data.find(b"\x00", self.pos)
        if end < 0:
            return self.rest()
        out = bytes(self.data[self.pos : end])
        self.pos = end + 1
        return out


def lenenc_int(n: int) -> bytes:
    return uint_len(n)


def lenenc_str(s: bytes) -> bytes:
    return uint_len(len(s)) + s


# ---------------------------------------------------------------------------- OK / ERR / EOF


class OkPacket:
    """A plain class, not attrs nor a NamedTuple: one is made per statement. Compiled, it is a
    native class built by a C call (callgrind: a frozen attrs instance costs a Python-level
    ``object.__setattr__`` per field; a NamedTuple built from ``struct`` ~3k instructions)."""

    __slots__ = ("affected_rows", "last_insert_id", "status", "warnings", "info")

    def __init__(self, affected_rows: int, last_insert_id: int, status: int, warnings: int, info: bytes = b"") -> None:
        self.affected_rows = affected_rows
        self.last_insert_id = last_insert_id
        self.status = status
        self.warnings = warnings
        self.info = info

    def _fields(self) -> tuple[int, int, int, int, bytes]:
        return self.affected_rows, self.last_insert_id, self.status, self.warnings, self.info

    def __eq__(self, other: object) -> bool:
        return self._fields() == other._fields() if isinstance(other, OkPacket) else NotImplemented

    def __repr__(self) -> str:
        return (f"OkPacket(affected_rows={self.affected_rows}, last_insert_id={self.last_insert_id}, "
                f"status={self.status}, warnings={self.warnings}, info={self.info!r})")  # fmt: skip


@attrs.frozen
class ErrPacket:
    code: int
    sqlstate: str
    message: str

    def __str__(self) -> str:
        return f"ERROR {self.code} ({self.sqlstate}): {self.message}"


_PROTOCOL_41: Final = int(Capabilities.CLIENT_PROTOCOL_41)
_TRANSACTIONS: Final = int(Capabilities.CLIENT_TRANSACTIONS)
_SESSION_TRACK: Final = int(Capabilities.CLIENT_SESSION_TRACK)


def parse_ok(payload: bytes, capabilities: int = _PROTOCOL_41, at: int = 0) -> OkPacket:
    """An OK packet (header 0x00, or 0xFE when it stands in for EOF under DEPRECATE_EOF), from
    ``payload[at]`` on (``at`` = 4: a frame read whole, its header first, parsed without a copy)."""
    if len(payload) - at >= 7 and payload[at + 1] < 0xFB and payload[at + 2] < 0xFB and capabilities & _PROTOCOL_41:
        # The common OK: one-byte counts (hot path: skips the Reader). Header, affected rows,
        # insert id, then status and warnings (two bytes each, little-endian).
        info = payload[at + 7 :]
        if info and capabilities & _SESSION_TRACK:
            info = Reader(info).lenenc_str()
        p = payload
        return OkPacket(p[at + 1], p[at + 2], p[at + 3] | p[at + 4] << 8, p[at + 5] | p[at + 6] << 8, info)
    r = Reader(payload[at:] if at else payload)
    header = r.u8()
    if header not in (OK_HEADER, EOF_HEADER):
        raise ProtocolError(f"not an OK packet: header 0x{header:02x}")
    affected = r.lenenc()
    insert_id = r.lenenc()
    status = warnings = 0
    if capabilities & _PROTOCOL_41:
        status = r.u16()
        warnings = r.u16()
    elif capabilities & _TRANSACTIONS:
        status = r.u16()
    info = b""
    if r.remaining():
        if capabilities & _SESSION_TRACK:
            info = r.lenenc_str()
        else:
            info = r.rest()
    return OkPacket(affected, insert_id, status, warnings, info)


def parse_err(payload: bytes) -> ErrPacket:
    r = Reader(payload)
    if r.u8() != ERR_HEADER:
        raise ProtocolError("not an ERR packet")
    code = r.u16()
    sqlstate = "HY000"
    if r.remaining() >= 6 and payload[r.pos] == 0x23:  # '#' marks the 4.1 SQLSTATE
        r.u8()
        sqlstate = r.fixed(5).decode("ascii", "replace")
    return ErrPacket(code, sqlstate, r.rest().decode("utf-8", "replace"))


def parse_eof(payload: bytes) -> tuple[int, int]:
    """(warnings, status) of a 4.1 EOF packet."""
    if len(payload) < 5 or payload[0] != EOF_HEADER:
        raise ProtocolError("not an EOF packet")
    return payload[1] | payload[2] << 8, payload[3] | payload[4] << 8


def make_ok(
    status: int,
    affected_rows: int = 0,
    last_insert_id: int = 0,
    warnings: int = 0,
    info: bytes = b"",
    header: int = OK_HEADER,
) -> bytes:
    out = bytes([header]) + uint_len(affected_rows) + uint_len(last_insert_id) + struct.pack("<HH", status, warnings)
    return out + info


def make_err(code: int, sqlstate: str, message: str) -> bytes:
    return struct.pack("<BH", ERR_HEADER, code) + b"#" + sqlstate.encode("ascii")[:5] + message.encode("utf-8")


def make_eof(status: int, warnings: int = 0) -> bytes:
    return struct.pack("<BHH", EOF_HEADER, warnings, status)


# ---------------------------------------------------------------------------- handshake


@attrs.frozen
class ServerHandshake:
    """Initial handshake packet (protocol v10) as the server sends it."""

    server_version: str
    connection_id: int
    scramble: bytes
    capabilities: int
    charset: int
    status: int
    auth_plugin: str


def parse_server_handshake(payload: bytes) -> ServerHandshake:
    r = Reader(payload)
    protocol = r.u8()
    if protocol == ERR_HEADER:
        raise ProtocolError(f"server refused the connection: {parse_err(payload)}")
    if protocol != 10:
        raise ProtocolError(f"unsupported handshake protocol version {protocol}")
    version = r.null_str().decode("utf-8", "replace")
    conn_id = r.u32()
    scramble = r.fixed(8)
    r.u8()  # filler
    caps = r.u16()
    charset = status = 0
    plugin = ""
    if r.remaining():
        charset = r.u8()
        status = r.u16()
        caps |= r.u16() << 16
        auth_len = r.u8()
        r.fixed(10)  # reserved (MariaDB keeps extended capabilities in the last 4)
        if caps & Capabilities.CLIENT_SECURE_CONNECTION:
            part2 = max(13, auth_len - 8)
            scramble += r.fixed(part2).rstrip(b"\x00")
        if caps & Capabilities.CLIENT_PLUGIN_AUTH:
            plugin = r.null_str_or_rest().decode("ascii", "replace")
    return ServerHandshake(version, conn_id, scramble, caps, charset, status, plugin)


def make_server_handshake(hs: ServerHandshake) -> bytes:
    scramble = hs.scramble
    caps = hs.capabilities
    out = [
        b"\x0a",
        hs.server_version.encode("utf-8") + b"\x00",
        struct.pack("<I", hs.connection_id),
        scramble[:8],
        b"\x00",
        struct.pack("<HBHH", caps & 0xFFFF, hs.charset, hs.status, caps >> 16),
        bytes([len(scramble) + 1 if caps & Capabilities.CLIENT_PLUGIN_AUTH else 0]),
        bytes(10),
    ]
    if caps & Capabilities.CLIENT_SECURE_CONNECTION:
        out.append(scramble[8:] + b"\x00")
    if caps & Capabilities.CLIENT_PLUGIN_AUTH:
        out.append(hs.auth_plugin.encode("ascii") + b"\x00")
    return b"".join(out)


@attrs.frozen
class HandshakeResponse:
    """HandshakeResponse41 as the client sends it."""

    capabilities: int
    max_packet: int
    charset: int
    username: str
    auth_response: bytes
    database: str | None = None
    auth_plugin: str | None = None
    connect_attrs: dict[str, str] = attrs.Factory(dict)
    ssl_request: bool = False


def parse_handshake_response(payload: bytes) -> HandshakeResponse:
    r = Reader(payload)
    caps = r.u32()
    if not caps & Capabilities.CLIENT_PROTOCOL_41:
        raise ProtocolError("client does not speak protocol 4.1 (CLIENT_PROTOCOL_41 not set)")
    max_packet = r.u32()
    charset = r.u8()
    r.fixed(23)  # filler (MariaDB extended capabilities in the last 4 bytes; we don't offer them)
    if not r.remaining():
        return HandshakeResponse(caps, max_packet, charset, "", b"", ssl_request=True)
    username = r.null_str().decode("utf-8", "replace")
    if caps & Capabilities.CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA:
        auth = r.lenenc_str()
    elif caps & Capabilities.CLIENT_SECURE_CONNECTION:
        auth = r.fixed(r.u8())
    else:
        auth = r.null_str()
    database = None
    if caps & Capabilities.CLIENT_CONNECT_WITH_DB and r.remaining():
        database = r.null_str_or_rest().decode("utf-8", "replace") or None
    plugin = None
    if caps & Capabilities.CLIENT_PLUGIN_AUTH and r.remaining():
        plugin = r.null_str_or_rest().decode("ascii", "replace")
    attrs_ = _read_attrs(r) if caps & Capabilities.CLIENT_CONNECT_ATTRS and r.remaining() else {}
    return HandshakeResponse(caps, max_packet, charset, username, auth, database, plugin, attrs_)


def make_handshake_response(resp: HandshakeResponse) -> bytes:
    caps = resp.capabilities
    out = [struct.pack("<IIB", caps, resp.max_packet, resp.charset), bytes(23), resp.username.encode("utf-8") + b"\x00"]
    if caps & Capabilities.CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA:
        out.append(lenenc_str(resp.auth_response))
    else:
        out.append(bytes([len(resp.auth_response)]) + resp.auth_response)
    if caps & Capabilities.CLIENT_CONNECT_WITH_DB:
        out.append((resp.database or "").encode("utf-8") + b"\x00")
    if caps & Capabilities.CLIENT_PLUGIN_AUTH:
        out.append((resp.auth_plugin or "").encode("ascii") + b"\x00")
    if caps & Capabilities.CLIENT_CONNECT_ATTRS:
        out.append(_attrs_block(resp.connect_attrs))
    return b"".join(out)


def _read_attrs(r: Reader) -> dict[str, str]:
    """Connection attributes: a length-prefixed block of key/value length-prefixed strings."""
    block = Reader(r.lenenc_str())
    out: dict[str, str] = {}
    while block.remaining():
        key = block.lenenc_str().decode("utf-8", "replace")
        out[key] = block.lenenc_str().decode("utf-8", "replace")
    return out


def _attrs_block(attrs_: dict[str, str]) -> bytes:
    return lenenc_str(b"".join(lenenc_str(k.encode()) + lenenc_str(v.encode()) for k, v in attrs_.items()))


@attrs.frozen
class AuthSwitch:
    plugin: str
    data: bytes


def parse_auth_switch(payload: bytes) -> AuthSwitch:
    r = Reader(payload)
    if r.u8() != AUTH_SWITCH:
        raise ProtocolError("not an auth switch request")
    if not r.remaining():  # old-style "use old password" request
        return AuthSwitch("mysql_old_password", b"")
    plugin = r.null_str().decode("ascii", "replace")
    return AuthSwitch(plugin, r.rest().rstrip(b"\x00"))


def make_auth_switch(plugin: str, data: bytes) -> bytes:
    return b"\xfe" + plugin.encode("ascii") + b"\x00" + data + b"\x00"


@attrs.frozen
class ChangeUser:
    username: str
    auth_response: bytes
    database: str | None
    charset: int | None
    auth_plugin: str | None
    connect_attrs: dict[str, str]


def parse_change_user(payload: bytes, capabilities: int) -> ChangeUser:
    """COM_CHANGE_USER, including the leading command byte."""
    r = Reader(payload, 1)
    username = r.null_str().decode("utf-8", "replace")
    if capabilities & Capabilities.CLIENT_SECURE_CONNECTION:
        auth = r.fixed(r.u8())
    else:
        auth = r.null_str()
    database = r.null_str_or_rest().decode("utf-8", "replace") or None
    charset = plugin = None
    if r.remaining() >= 2:
        charset = r.u16()
    if capabilities & Capabilities.CLIENT_PLUGIN_AUTH and r.remaining():
        plugin = r.null_str_or_rest().decode("ascii", "replace")
    attrs_ = _read_attrs(r) if capabilities & Capabilities.CLIENT_CONNECT_ATTRS and r.remaining() else {}
    return ChangeUser(username, auth, database, charset, plugin, attrs_)


def make_change_user(
    username: str, auth_response: bytes, database: str | None, charset: int, plugin: str, attrs_: dict[str, str], capabilities: int
) -> bytes:
    out = [b"\x11", username.encode("utf-8") + b"\x00", bytes([len(auth_response)]) + auth_response]
    out.append((database or "").encode("utf-8") + b"\x00")
    out.append(struct.pack("<H", charset))
    if capabilities & Capabilities.CLIENT_PLUGIN_AUTH:
        out.append(plugin.encode("ascii") + b"\x00")
    if capabilities & Capabilities.CLIENT_CONNECT_ATTRS:
        out.append(_attrs_block(attrs_))
    return b"".join(out)


# ---------------------------------------------------------------------------- prepared statements


@attrs.frozen
class PrepareOk:
    statement_id: int
    num_columns: int
    num_params: int
    warnings: int


def parse_prepare_ok(payload: bytes) -> PrepareOk:
    if len(payload) < 12 or payload[0] != OK_HEADER:
        raise ProtocolError("not a COM_STMT_PREPARE OK packet")
    stmt_id, ncols, nparams, _filler, warnings = struct.unpack_from("<IHHBH", payload, 1)
    return PrepareOk(stmt_id, ncols, nparams, warnings)


def status_in_transaction(status: int) -> bool:
    return bool(status & ServerStatus.SERVER_STATUS_IN_TRANS)
