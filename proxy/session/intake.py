"""A client's command (``Command``) and the hot path's way to read one: a read that holds
exactly one small command, whole (``whole_command``). Everything else -- a command split over
reads, a large or continued one (16 MiB frames), a large COM_STMT_SEND_LONG_DATA, one over the
limit -- is read by ``proxy.relay.reading`` (spooled, or read to its end and dropped).
"""

from __future__ import annotations

import typing

import attrs

from proxy.protocol.constants import MAX_FRAME

__all__ = ["Command", "Oversized", "whole_command", "payload_of", "HEAD_SIZE", "LONG_DATA_SPOOL", "COPY_CHUNK"]

HEAD_SIZE = 64 * 1024  # what classification and plugins see of a spooled command
# A COM_STMT_SEND_LONG_DATA this large goes to a file from its first bytes: the proxy reads
# only its first 7, and keeps it to send again (proxy.session.longdata); whole in memory it would be
# held three times over (the decoder's buffer, its frames, its payload).
LONG_DATA_SPOOL = 256 * 1024
COM_STMT_SEND_LONG_DATA = 0x18
COPY_CHUNK: typing.Final = 1 << 20


class Command:
    """A command read from the client. A plain class: one is made per statement, and its
    ``code`` and ``complete`` are read several times per statement (properties were a Python
    call each)."""

    __slots__ = ("payload", "raw", "seq_end", "size", "spool", "code", "complete")

    def __init__(self, payload: bytes, raw: bytes | None, seq_end: int, size: int = 0, spool: typing.BinaryIO | None = None) -> None:
        self.payload = payload  # command byte + arguments; only the first HEAD_SIZE bytes when spooled
        self.raw = raw  # the frames as the client sent them; None when spooled
        self.seq_end = seq_end  # sequence id of the client's last frame; the response continues from it
        self.size = size  # payload size in bytes
        self.spool = spool  # the frames of a command too large to keep in memory
        self.code = payload[0] if payload else -1  # the command byte (-1: an empty packet, refused)
        self.complete = spool is None  # is ``payload`` the whole command (not just a spooled one's head)?

    @property
    def wire_size(self) -> int:
        """Bytes of the command's frames (headers included)."""
        if self.spool is None:
            return len(self.raw) if self.raw is not None else len(self.payload) + 4
        self.spool.seek(0, 2)
        return self.spool.tell()

    def text(self) -> str:
        return self.payload[1:].decode("utf-8", "surrogateescape")

    def full_payload(self) -> bytes:
        """The whole payload, read back from the spool if need be (a split, ``proxy.relay.reading.judged_whole``)."""
        if self.spool is None:
            return self.payload
        self.spool.seek(0)
        out = bytearray()
        while True:
            header = self.spool.read(4)
            if len(header) < 4:
                return bytes(out)
            length = header[0] | header[1] << 8 | header[2] << 16
            out += self.spool.read(length)

    def frames(self):
        """Yield the command's frames in chunks (from memory or the spool)."""
        if self.spool is None:
            yield self.raw
            return
        self.spool.seek(0)
        while chunk := self.spool.read(COPY_CHUNK):
            yield chunk

    def release(self) -> None:
        if self.spool is not None:
            self.spool.close()


@attrs.frozen
class Oversized:
    """A command larger than the limit: read to its end and dropped."""

    size: int
    seq_end: int
    code: int


def whole_command(data: bytes, max_size: int, spool_threshold: int) -> Command | None:
    """The common case, without the decoder: ``data``, one read with nothing buffered before
    it, is exactly one small command. None: anything else (the decoder's way, read_command)."""
    n = len(data)
    if n >= 5:
        length = data[0] | data[1] << 8 | data[2] << 16
        if n == length + 4 and length < spool_threshold and length <= max_size and length < MAX_FRAME:
            return Command(data[4:], data, data[3], length)
    return None


def payload_of(raw: bytes) -> bytes:
    parts = []
    pos = 0
    while pos < len(raw):
        length = raw[pos] | raw[pos + 1] << 8 | raw[pos + 2] << 16
        parts.append(raw[pos + 4 : pos + 4 + length])
        pos += 4 + length
    return b"".join(parts)
