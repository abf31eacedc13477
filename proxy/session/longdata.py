"""A session's long data (COM_STMT_SEND_LONG_DATA), kept to be sent again.

A prepared statement's long data must reach the server again when the statement is prepared
again on a new connection before its execute, and when a transaction whose executes used it
is replayed. The spool keeps each such command's frames exactly as the client sent them: in
memory while the session's long data stays within ``memory_budget`` (limits.spool_threshold),
beyond that in one temporary file of the session's; at most ``max_bytes`` in all
(limits.long_data_spool). A piece lives until its statement is executed outside a
transaction, reset or closed, its transaction ends, or the session ends; the file is emptied
whenever nothing in it is live. Sans-IO apart from that file: no trio.
"""

from __future__ import annotations

import tempfile
import typing
from collections.abc import Iterable, Iterator

import attrs

from proxy.protocol.framing import with_statement_id

__all__ = ["Piece", "LongDataSpool"]

_CHUNK = 1 << 20


@attrs.define(eq=False, slots=True)
class Piece:
    """One COM_STMT_SEND_LONG_DATA command's frames: in memory (``data``) or in the spool file."""

    size: int  # bytes of frames
    data: bytes | None = None
    offset: int = 0  # where in the spool file, when not in memory
    live: bool = True  # not released yet (a piece may be dropped by more than one owner)
    # The backend connection (SessionTracker.generation) it last went to: a restore that sent it
    # already makes resending the command itself, lost in flight, a second copy.
    sent_on: int = -1


class LongDataSpool:
    def __init__(self, memory_budget: int, max_bytes: int) -> None:
        self.memory_budget = memory_budget
        self.max_bytes = max_bytes
        self.in_memory = 0  # bytes of the pieces kept in memory
        self.in_file = 0  # bytes of the live pieces in the file
        self._file: typing.BinaryIO | None = None
        self._end = 0  # where the next piece goes in the file

    @property
    def held(self) -> int:
        return self.in_memory + self.in_file

    def keep(self, frames: Iterable[bytes], size: int, whole: bytes | None = None) -> Piece | None:
        """Keep a command of ``size`` bytes of frames (``whole``: all of them in one bytes
        object, when the client's command is in memory). None: the session's spool is full."""
        if self.held + size > self.max_bytes:
            return None
        if whole is not None and self.in_memory + size <= self.memory_budget:
            self.in_memory += size
            return Piece(size, whole)
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="replay-proxy-longdata-")
        offset = self._end
        self._file.seek(offset)
        for chunk in frames:
            self._file.write(chunk)
        self._end += size
        self.in_file += size
        return Piece(size, None, offset)

    def frames(self, piece: Piece, stmt_id: bytes | None = None) -> Iterator[bytes]:
        """The piece's frames in chunks of at most 1 MiB; ``stmt_id`` (4 bytes) replaces the
        statement id of its first frame (a statement prepared again got another id)."""
        chunks = self._chunks(piece)
        return chunks if stmt_id is None else with_statement_id(chunks, stmt_id)

    def _chunks(self, piece: Piece) -> Iterator[bytes]:
        if piece.data is not None:
            yield from (piece.data[i : i + _CHUNK] for i in range(0, piece.size, _CHUNK))
            return
        assert self._file is not None
        done = 0
        while done < piece.size:
            self._file.seek(piece.offset + done)
            chunk = self._file.read(min(_CHUNK, piece.size - done))
            if not chunk:
                raise OSError(f"long data spool truncated at {piece.offset + done}")
            done += len(chunk)
            yield chunk

    def release(self, pieces: Iterable[Piece]) -> None:
        for piece in pieces:
            if not piece.live:
                continue
            piece.live = False
            if piece.data is not None:
                self.in_memory -= piece.size
            else:
                self.in_file -= piece.size
        if self.in_file == 0 and self._file is not None and self._end:
            self._file.seek(0)
            self._file.truncate()
            self._end = 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self.in_memory = self.in_file = self._end = 0
