"""Reading client commands off the socket, in the slow lane: whole packets through the packet
decoder, the size limit, and spooling of large ones.

A command whose first frame is large or continued (16 MiB frames), or a large
COM_STMT_SEND_LONG_DATA, is copied frame by frame into a spool (memory up to
``spool_threshold``, then a temporary file), so memory stays bounded and a command is forwarded
only once it is known to be complete and within the limit. A command over the limit is read to
its end and dropped, never sent to the backend, not even in part. (A read that holds exactly one
small command is the hot path's: ``proxy.session.intake.whole_command``.)
"""

from __future__ import annotations

import tempfile
import typing

import trio

from proxy.netio import Channel
from proxy.protocol.constants import MAX_FRAME
from proxy.session.intake import COM_STMT_SEND_LONG_DATA, COPY_CHUNK, HEAD_SIZE, LONG_DATA_SPOOL, Command, Oversized, payload_of

__all__ = ["read_command", "judged_whole"]

T = typing.TypeVar("T")


async def judged_whole(cmd: Command, judge: typing.Callable[[bytes], T]) -> T:
    """``judge(payload)`` of the whole command: at once when it is in memory, in a thread
    when it is spooled (reading megabytes back and judging them takes seconds)."""
    if cmd.spool is None:
        return judge(cmd.payload)
    return await trio.to_thread.run_sync(lambda: judge(cmd.full_payload()))


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


async def read_command(channel: Channel, max_size: int, spool_threshold: int, keep_up_to: int) -> Command | Oversized:
    """Next command from the client. ``max_size``: the largest payload allowed through;
    ``keep_up_to`` (>= max_size) is how big a command may be and still be kept whole (split mode
    keeps oversized INSERTs to split them); anything bigger is Oversized. Raises PeerClosed when
    the client goes away. The decoder's way, from what is buffered on: a read that holds
    exactly one small command is taken by ``whole_command`` first (``proxy.relay.commands``)."""
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
            chunk = await _pull(channel, min(remaining, COPY_CHUNK))
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
        return Command(payload_of(raw), raw, seq, total)
    return Command(bytes(head), None, seq, total, spill)
