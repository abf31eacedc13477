"""Packet framing: 3-byte little-endian length, 1-byte sequence id, payload.

A payload of 16 MiB - 1 bytes (0xFFFFFF) or more is split into frames of exactly 0xFFFFFF bytes
followed by a shorter frame (possibly empty). ``PacketDecoder`` turns received bytes into logical
packets and keeps the raw frames so the proxy can forward a packet exactly as it arrived.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import attrs

from proxy.protocol.constants import MAX_FRAME
from proxy.protocol.packets import ProtocolError

__all__ = ["Packet", "PacketDecoder", "encode_packet", "frame_header", "with_statement_id"]


def frame_header(length: int, seq: int) -> bytes:
    return bytes((length & 0xFF, (length >> 8) & 0xFF, length >> 16, seq & 0xFF))


def encode_packet(payload: bytes, seq: int) -> tuple[bytes, int]:
    """Frame ``payload`` starting at sequence id ``seq``; returns (frames, next sequence id)."""
    n = len(payload)
    if n < MAX_FRAME:
        return frame_header(n, seq) + payload, (seq + 1) & 0xFF
    parts: list[bytes | memoryview] = []
    view = memoryview(payload)
    pos = 0
    while True:
        chunk = view[pos : pos + MAX_FRAME]
        parts.append(frame_header(len(chunk), seq))
        parts.append(chunk)
        seq = (seq + 1) & 0xFF
        pos += len(chunk)
        if len(chunk) < MAX_FRAME:
            return b"".join(parts), seq


@attrs.define(slots=True)
class Packet:
    """One logical packet: payload without headers, and the frames as received."""

    seq: int  # sequence id of the first frame
    last_seq: int  # sequence id of the last frame (equal to seq unless continued)
    payload: bytes
    raw: bytes


class PacketDecoder:
    """Bytes in, logical packets out. No I/O."""

    def __init__(self, max_payload: int | None = None) -> None:
        self._buf: bytes | bytearray = b""
        self._pos = 0
        self.max_payload = max_payload

    def feed(self, data: bytes) -> None:
        if self._pos >= len(self._buf):
            self._buf = data  # common case: nothing pending, keep the caller's bytes without copying
            self._pos = 0
            return
        if not isinstance(self._buf, bytearray) or self._pos:
            self._buf = bytearray(memoryview(self._buf)[self._pos :])
            self._pos = 0
        self._buf += data

    def buffered(self) -> int:
        return len(self._buf) - self._pos

    def peek_header(self) -> tuple[int, int] | None:
        """(length, seq) of the next frame if its header has arrived."""
        buf, p = self._buf, self._pos
        if len(buf) - p < 4:
            return None
        return buf[p] | buf[p + 1] << 8 | buf[p + 2] << 16, buf[p + 3]

    def peek_byte(self, offset: int) -> int | None:
        """The buffered byte ``offset`` bytes ahead (4: the next frame's first payload byte)."""
        p = self._pos + offset
        return self._buf[p] if p < len(self._buf) else None

    def take_raw(self, n: int) -> bytes:
        """Remove and return up to n buffered bytes (for callers that stream a large packet)."""
        out = bytes(self._buf[self._pos : self._pos + n])
        self._pos += len(out)
        return out

    def next_packet(self) -> Packet | None:
        buf, start = self._buf, self._pos
        n = len(buf)
        p = start
        total = 0
        frames: list[tuple[int, int]] = []  # (payload offset, length)
        while True:
            if n - p < 4:
                return None
            length = buf[p] | buf[p + 1] << 8 | buf[p + 2] << 16
            seq = buf[p + 3]
            if not frames:
                first_seq = seq
            total += length
            if self.max_payload is not None and total > self.max_payload:
                raise ProtocolError(f"packet of more than {self.max_payload} bytes")
            if n - p - 4 < length:
                return None
            frames.append((p + 4, length))
            p += 4 + length
            if length < MAX_FRAME:
                break
        if len(frames) == 1:
            payload = bytes(buf[start + 4 : p])
        else:
            payload = b"".join(buf[off : off + size] for off, size in frames)
        raw = buf if (start == 0 and p == n and isinstance(buf, bytes)) else bytes(buf[start:p])
        self._pos = p
        if p == n:
            self._buf, self._pos = b"", 0
        return Packet(first_seq, seq, payload, raw)


def with_statement_id(chunks: Iterable[bytes], stmt_id: bytes) -> Iterator[bytes]:
    """A COM_STMT_* command's frames, in chunks, with the statement id (4 bytes after the frame
    header and the command byte) of its first frame replaced by ``stmt_id``."""
    first = True
    for chunk in chunks:
        if first:
            chunk = chunk[:5] + stmt_id + chunk[9:]
            first = False
        yield chunk
