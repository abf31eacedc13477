"""Decoding and building small text result sets (the proxy's own queries and answers).

The relay never decodes rows of clients' results; this is for the few result sets the proxy
reads or writes itself (SELECT @@var, SHOW WARNINGS merged after a split statement).
"""

from __future__ import annotations

import attrs

from proxy.protocol.constants import MAX_FRAME
from proxy.protocol.framing import PacketDecoder, encode_packet
from proxy.protocol.packets import ERR_HEADER, ProtocolError, Reader, lenenc_int, lenenc_str, make_eof, make_ok, parse_err

__all__ = ["Column", "decode_text_row", "read_text_result", "build_text_result"]

NULL = 0xFB


@attrs.frozen
class Column:
    """What a column definition (Protocol::ColumnDefinition41) says of a value's type."""

    type: int  # MYSQL_TYPE_*
    unsigned: bool
    decimals: int

    @classmethod
    def parse(cls, coldef: bytes) -> Column:
        r = Reader(coldef)
        for _ in range(6):  # catalog, schema, table, org_table, name, org_name
            r.lenenc_str()
        r.lenenc()  # length of the fixed fields (0x0c)
        r.u16()  # character set
        r.u32()  # column length
        type_, flags, decimals = r.u8(), r.u16(), r.u8()
        return cls(type_, bool(flags & 0x20), decimals)  # 0x20: UNSIGNED_FLAG


def decode_text_row(payload: bytes, ncols: int) -> list[bytes | None]:
    r = Reader(payload)
    row: list[bytes | None] = []
    for _ in range(ncols):
        if r.pos >= len(payload):
            raise ProtocolError(f"row of {len(row)} columns where {ncols} are expected")
        if payload[r.pos] == NULL:
            r.pos += 1
            row.append(None)
        else:
            row.append(r.lenenc_str())
    return row


def read_text_result(frames: bytes, deprecate_eof: bool) -> tuple[list[bytes], list[list[bytes | None]]]:
    """(column definition payloads, rows) of one complete text result set."""
    decoder = PacketDecoder()
    decoder.feed(frames)

    def next_payload() -> bytes:
        packet = decoder.next_packet()
        if packet is None:
            raise ProtocolError("result set truncated")
        return packet.payload

    first = next_payload()
    if first[:1] == bytes([ERR_HEADER]):
        raise ProtocolError(f"query failed: {parse_err(first)}")
    ncols = Reader(first).lenenc()
    coldefs = [next_payload() for _ in range(ncols)]
    if not deprecate_eof:
        next_payload()  # the EOF after the column definitions
    rows: list[list[bytes | None]] = []
    while True:
        payload = next_payload()
        if payload[:1] == b"\xfe" and len(payload) < MAX_FRAME:
            return coldefs, rows
        rows.append(decode_text_row(payload, ncols))


def build_text_result(coldefs: list[bytes], rows: list[list[bytes | None]], status: int, deprecate_eof: bool, seq: int = 1) -> bytes:
    """Frames of a text result set, sequence ids from ``seq``."""
    payloads = [lenenc_int(len(coldefs)), *coldefs]
    if not deprecate_eof:
        payloads.append(make_eof(status))
    for row in rows:
        payloads.append(b"".join(b"\xfb" if v is None else lenenc_str(v) for v in row))
    payloads.append(make_ok(status, header=0xFE) if deprecate_eof else make_eof(status))
    out = []
    for payload in payloads:
        frames, seq = encode_packet(payload, seq)
        out.append(frames)
    return b"".join(out)
