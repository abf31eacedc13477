"""Reading client commands: whole packets, the size limit, and spooling of large ones.

Small commands (the hot path) come out of one read whole (``whole_command``), or else out of the
packet decoder. A command whose first frame is large or continued (16 MiB frames), or a large
COM_STMT_SEND_LONG_DATA, takes the slow path: its frames are copied into a spool (memory up to
``spool_threshold``, then a temporary file), so memory stays bounded and a command is forwarded
only once it is known to be complete and within the limit. A command over the limit is read to
its end and dropped, never sent to the backend, not even in part.
"""

from __future__ import annotations

import tempfile
import typing

import attrs
import trio

from proxy.netio import Channel
from proxy.protocol.constants import MAX_FRAME

__all__ = ["Command", "Oversized", "read_command", "whole_command", "HEAD_SIZE"]

HEAD_SIZE = 64 * 1024  # what classification and plugins see of a spooled command
# A COM_STMT_SEND_LONG_DATA this large goes to a file from its first bytes: the proxy reads
# only its first 7, and keeps it to send again (proxy.session.longdata); whole in memory it would be
# held three times over (the decoder's buffer, its frames, its payload).
LONG_DATA_SPOOL = 256 * 1024
COM_STMT_SEND_LONG_DATA = 0x18
_COPY_CHUNK = 1 << 20
T = typing.TypeVar("T")


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
        """The whole payload, read back from the spool if need be (a split, ``judged_whole``)."""
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

    async def judged_whole(self, judge: typing.Callable[[bytes], T]) -> T:
        """``judge(payload)`` of the whole command: at once when it is in memory, in a thread
        when it is spooled (reading megabytes back and judging them takes seconds)."""
        if self.spool is None:
            return judge(self.payload)
        return await trio.to_thread.run_sync(lambda: judge(self.full_payload()))

    def frames(self):
        """Yield the command's frames in chunks (from memory or the spool)."""
        if self.spool is None:
            yield self.raw
            return
        self.spool.seek(0)
        while chunk := self.spool.read(_COPY_CHUNK):
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


async def _pull(channel: Channel, n: int) -> bytes:
    """Up to n bytes: what the decoder already holds, else one read (surplus goes back)."""
    decoder = channel.decoder
    if decoder.buffered():
        return decoder.take_raw(n)
    data = await channel.recv()
    if len(data) > n:
        decoder.feed(data[n:])
        return data[:n]
    return data


async def _pull_exact(channel: Channel, n: int) -> bytes:
    out = b""
    while len(out) < n:
        out += await _pull(channel, n - len(out))
    return out


def whole_command(data: bytes, max_size: int, spool_threshold: int) -> Command | None:
    """The common case, without the decoder: ``data``, one read with nothing buffered before
    it, is exactly one small command. None: anything else (the decoder's way, read_command)."""
    n = len(data)
    if n >= 5:
        length = data[0] | data[1] << 8 | data[2] << 16
        if n == length + 4 and length < spool_threshold and length <= max_size and length < MAX_FRAME:
            return Command(data[4:], data, data[3], length)
    return None


async def read_command(channel: Channel, max_size: int, spool_threshold: int, keep_up_to: int) -> Command | Oversized:
    """Next command from the client. ``max_size``: the largest payload allowed through;
    ``keep_up_to`` (>= max_size) is how big a command may be and still be kept whole (split mode
    keeps oversized INSERTs to split them); anything bigger is Oversized. Raises PeerClosed when
    the client goes away. The decoder's way, from what is buffered on: a read that holds
    exactly one small command is taken by ``whole_command`` first (``Session._read_command``)."""
    decoder = channel.decoder
    while True:
        header = decoder.peek_header()
        if header is not None:
            length = header[0]
            if length >= LONG_DATA_SPOOL:
                command = decoder.peek_byte(4)
                if command is None:
                    decoder.feed(await channel.recv())
                    continue
                if command == COM_STMT_SEND_LONG_DATA:
                    return await _read_large(channel, LONG_DATA_SPOOL, keep_up_to)
            if length >= spool_threshold or length == MAX_FRAME or length > max_size:
                return await _read_large(channel, spool_threshold, keep_up_to)
            packet = decoder.next_packet()
            if packet is not None:
                return Command(packet.payload, packet.raw, packet.last_seq, len(packet.payload))
        decoder.feed(await channel.recv())


async def _read_large(channel: Channel, spool_threshold: int, keep_up_to: int) -> Command | Oversized:
    """Read one large or continued command frame by frame, keeping it (in memory up to
    ``spool_threshold``, then in a temporary file) while it stays within ``keep_up_to``."""
    kept: bytearray | None = bytearray()  # the raw frames while they fit in memory
    spill = None  # the temporary file once they don't
    dropping = False
    head = bytearray()
    total = 0
    code = -1

    def keep(data: bytes) -> None:
        nonlocal kept, spill
        if spill is not None:
            spill.write(data)
            return
        kept += data
        if len(kept) > spool_threshold:
            spill = tempfile.TemporaryFile()
            spill.write(kept)
            kept = None

    while True:
        header = await _pull_exact(channel, 4)
        length = header[0] | header[1] << 8 | header[2] << 16
        seq = header[3]
        total += length
        if not dropping and total > keep_up_to:
            dropping = True  # over the limit: read the rest and drop it
            if spill is not None:
                spill.close()
            kept = spill = None
        if not dropping:
            keep(header)
        remaining = length
        while remaining:
            chunk = await _pull(channel, min(remaining, _COPY_CHUNK))
            remaining -= len(chunk)
            if code < 0 and chunk:
                code = chunk[0]
            if len(head) < HEAD_SIZE:
                head += chunk[: HEAD_SIZE - len(head)]
            if not dropping:
                keep(chunk)
        if length < MAX_FRAME:
            break
    if dropping:
        return Oversized(total, seq, code)
    if spill is None:
        raw = bytes(kept)
        return Command(_payload_of(raw), raw, seq, total)
    return Command(bytes(head), None, seq, total, spill)


def _payload_of(raw: bytes) -> bytes:
    parts = []
    pos = 0
    while pos < len(raw):
        length = raw[pos] | raw[pos + 1] << 8 | raw[pos + 2] << 16
        parts.append(raw[pos + 4 : pos + 4 + length])
        pos += 4 + length
    return b"".join(parts)
