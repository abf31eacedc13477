"""The hand-over channel's frames, sans-IO: what goes on the wire and how it is read back.

A frame is a 14-byte prefix, a JSON header and an optional binary payload::

    offset  size  field
    0       4     magic, b"RPHO"
    4       1     protocol version (VERSION)
    5       1     number of file descriptors that travel with the frame (SCM_RIGHTS)
    6       4     length of the JSON header, big-endian
    10      4     length of the payload, big-endian
    14      ...   the JSON header: an object with "type" (the message's kind) and its fields
    ...     ...   the payload (bytes that would be wasteful as JSON)

The descriptors are sent with the frame's first byte (``fdpass``), so by the time a frame is
complete its descriptors have arrived: the decoder hands them out in arrival order, as many as
the prefix announces. The version is the frame's: a process that reads a frame of another
version refuses it with a message that names both.
"""

from __future__ import annotations

import json
import os
import struct
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MAGIC",
    "VERSION",
    "PREFIX",
    "MAX_FDS",
    "MAX_HEADER",
    "MAX_PAYLOAD",
    "Message",
    "encode",
    "Decoder",
    "HandoverError",
    "ProtocolError",
    "ChannelClosed",
    "HandoverTimeout",
]

MAGIC = b"RPHO"
VERSION = 1
PREFIX = struct.Struct(">4sBBII")
MAX_FDS = 200  # below the kernel's SCM_MAX_FD (253) for one sendmsg
MAX_HEADER = 1 << 20
MAX_PAYLOAD = 1 << 30


class HandoverError(Exception):
    """The hand-over failed; the text is the reason, as a sentence for the log."""


class ProtocolError(HandoverError):
    """The other side sent something that is not a frame of this protocol."""


class ChannelClosed(HandoverError):
    """The other process closed the channel (it exited, or gave up)."""


class HandoverTimeout(HandoverError):
    """The other process did not answer in time."""


@dataclass
class Message:
    """One frame: ``type`` and ``fields`` make the JSON header; ``fds`` are raw descriptors
    (the receiver owns those it got, and closes them when it does not adopt them)."""

    type: str
    fields: dict[str, Any] = field(default_factory=dict)
    fds: list[int] = field(default_factory=list)
    payload: bytes = b""


def encode(message: Message) -> bytes:
    """The frame's bytes (its descriptors travel beside them)."""
    if "type" in message.fields:
        raise ProtocolError("a message's fields cannot hold 'type': it is the message's kind")
    header = json.dumps({"type": message.type, **message.fields}, separators=(",", ":"), sort_keys=True).encode()
    if len(header) > MAX_HEADER:
        raise ProtocolError(f"message {message.type}: header of {len(header)} bytes, more than {MAX_HEADER}")
    if len(message.payload) > MAX_PAYLOAD:
        raise ProtocolError(f"message {message.type}: payload of {len(message.payload)} bytes, more than {MAX_PAYLOAD}")
    if len(message.fds) > MAX_FDS:
        raise ProtocolError(f"message {message.type}: {len(message.fds)} descriptors, more than {MAX_FDS} in one frame")
    return PREFIX.pack(MAGIC, VERSION, len(message.fds), len(header), len(message.payload)) + header + message.payload


class Decoder:
    """Bytes and descriptors in, messages out. After a ProtocolError the stream is lost:
    close the channel (``close_fds`` closes the descriptors no message took)."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._fds: deque[int] = deque()

    def feed(self, data: bytes, fds: Iterable[int] = ()) -> None:
        self._buffer += data
        self._fds.extend(fds)

    def buffered(self) -> int:
        """Bytes of a frame not complete yet."""
        return len(self._buffer)

    def next_message(self) -> Message | None:
        """The next complete message, or None until more bytes arrive."""
        if len(self._buffer) < PREFIX.size:
            if not MAGIC.startswith(bytes(self._buffer[: len(MAGIC)])):
                raise ProtocolError(f"not a hand-over frame: it starts with {bytes(self._buffer[:4])!r}, not {MAGIC!r}")
            return None
        magic, version, nfds, header_len, payload_len = PREFIX.unpack_from(self._buffer)
        if magic != MAGIC:
            raise ProtocolError(f"not a hand-over frame: it starts with {magic!r}, not {MAGIC!r}")
        if version != VERSION:
            raise ProtocolError(f"the other process speaks hand-over protocol version {version}, this one version {VERSION}")
        if nfds > MAX_FDS or header_len > MAX_HEADER or payload_len > MAX_PAYLOAD:
            raise ProtocolError(f"frame out of bounds: {nfds} descriptors, header {header_len} bytes, payload {payload_len} bytes")
        end = PREFIX.size + header_len + payload_len
        if len(self._buffer) < end:
            return None
        try:
            header = json.loads(bytes(self._buffer[PREFIX.size : PREFIX.size + header_len]))
        except (UnicodeDecodeError, ValueError) as exc:
            raise ProtocolError(f"frame header is not JSON: {exc}") from None
        if not isinstance(header, dict) or not isinstance(header.get("type"), str):
            raise ProtocolError(f"frame header is not an object with a 'type': {str(header)[:200]}")
        if len(self._fds) < nfds:
            raise ProtocolError(f"message {header['type']} announces {nfds} descriptor(s), {len(self._fds)} arrived")
        payload = bytes(self._buffer[PREFIX.size + header_len : end])
        del self._buffer[:end]
        kind = header.pop("type")
        return Message(kind, header, [self._fds.popleft() for _ in range(nfds)], payload)

    def close_fds(self) -> None:
        while self._fds:
            os.close(self._fds.popleft())
