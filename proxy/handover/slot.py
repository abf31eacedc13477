"""A session's record in shared memory, so that a worker's crash loses no client (``--workers N``).

Each session of a worker writes where it stands into a small memory file of its own (a memfd,
``Slot``), which the supervisor holds beside a duplicate of the client socket
(``proxy.handover.keeper``). The memory outlives the worker: when it dies, the worker that
takes its place reads the record (``Record``) and knows what the client waits for.

The client's bytes are read straight into the record (``receive``: the kernel writes them
there), so no byte the dead worker took from the socket is lost with it: the record holds the
client's stream from ``area_start`` on, and the kernel's own count of what was read from the
socket (``consumed``) says how far. On top, the session writes where each command stands:

- ``read(wire)``: a command was taken from the stream, nothing of it reached the server;
- ``sent()``: it goes to the server (it may run from here on);
- ``answering(n)``: ``n`` bytes of an answer go to the client (a response begun cannot be
  finished by another process); ``answering(n, flags)``: the last ``n`` bytes of it, and the
  transaction's state after it: if the kernel says they all left (``written``), the answer is
  whole and the session idle;
- ``idle(flags)``: the answer is complete; ``flags``: the transaction's state after it.

Each of these is one aligned 8-byte store (the word: the stream offset where the current or
next command starts, the phase, the flags), so a worker killed at any instruction leaves one
state or the next, never half of each. What the worker read beyond the word's offset, it had
not recorded yet: a command that never reached the server, whose bytes are in the record.

Layout (native byte order, 72 bytes, then the client's bytes)::

    0   u64  word: bits 0-47 the stream offset where the current (or next) command starts,
                   48-55 phase, 56-63 flags
    8   u32  format (FORMAT)
    16  u64  area_start: the stream offset of the area's first byte (NO_AREA: nothing usable)
    24  u64  the current command's bytes on the wire (its frames, headers included)
    32  u64  commit-marker number written for it (a COMMIT; 0: none)
    40  u64  the session's command number
    48  u64  the client's outgoing stream offset where the answer being written ends (0: not known)
    56  u64  1 + the stream offset of the command a takeover ran again (0: none): one that was
             in flight at two worker deaths in a row is not run a third time
    64  u64  when the current command was sent, in milliseconds of the wall clock (0: not yet):
             a DDL in flight is looked for among the jobs TiDB created since
    72  ...  the area: the client's bytes from area_start on (CAPACITY at most)
"""

from __future__ import annotations

import array
import fcntl
import mmap
import os
import socket
import struct
import termios
import time

import attrs

__all__ = ["Slot", "Record", "Phase", "CAPACITY", "FORMAT", "consumed", "written", "flags_of", "IN_TRANSACTION", "INSERT_ID_MOVED"]

FORMAT = 2
HEADER = 72
CAPACITY = 256 * 1024  # client bytes kept since the last idle point; beyond, a crash there is a connection error
SIZE = HEADER + CAPACITY  # sparse: only the pages written take memory
NO_AREA = (1 << 64) - 1
_OFFSET_BITS = (1 << 48) - 1
_MIN_ROOM = 4096  # less room left in the area than this: read past it, and say the area is spent

# Indexes of the u64 fields (the map seen as an array of u64).
_WORD, _FORMAT, _AREA_START, _WIRE, _MARKER, _NUMBER, _ANSWER_END, _RETRIED, _SENT_AT = 0, 1, 2, 3, 4, 5, 6, 7, 8


class Phase:
    """Where the session stands (plain ints: written per statement)."""

    IDLE = 0  # nothing owed to the client
    READ = 1  # a command read, nothing of it sent to the server
    SENT = 2  # the command went (or is going) to the server, no answer written yet
    ANSWERING = 3  # bytes of the answer went to the client

    NAMES = {IDLE: "idle", READ: "read", SENT: "sent", ANSWERING: "answering"}


# Flags: the transaction's state when the session was last idle.
IN_TRANSACTION = 1
WROTE = 2  # the open transaction wrote
PENDING = 4  # an ERR left the transaction's fate open
PENDING_MAY_HAVE_COMMITTED = 8
LONG_DATA_HELD = 16  # COM_STMT_SEND_LONG_DATA kept for an execute to come (spooled by the worker: lost with it)
XA_SHIFT = 5  # two bits: 0 none, 1 ACTIVE, 2 IDLE, 3 PREPARED
XA_STATES = ("", "ACTIVE", "IDLE", "PREPARED")
INSERT_ID_MOVED = 128  # LAST_INSERT_ID() moved since the supervisor's copy of the state


def flags_of(tracking) -> int:
    """The flags of a ``SessionTracker`` now."""
    tx = tracking.tx
    if not tx.active and tracking.pending is None and tracking.xa is None and not tracking.long_data.held:
        return INSERT_ID_MOVED if tracking.insert_id_moved else 0  # the common case: between transactions, nothing left open
    flags = (IN_TRANSACTION if tx.active else 0) | (WROTE if tx.writes else 0) | (INSERT_ID_MOVED if tracking.insert_id_moved else 0)
    pending = tracking.pending
    if pending is not None:
        flags |= PENDING | (PENDING_MAY_HAVE_COMMITTED if pending.may_have_committed else 0)
    if tracking.long_data.held:
        flags |= LONG_DATA_HELD
    if tracking.xa is not None:
        flags |= XA_STATES.index(tracking.xa) << XA_SHIFT
    return flags


class Slot:
    """The writing side, in the worker that runs the session. ``fd``: the memory file (the
    supervisor gets a copy; this one stays open to send again if the supervisor asks anew)."""

    __slots__ = ("fd", "_map", "_u64", "_area", "start", "wire", "flags", "phase", "area_start", "fill", "out")

    def __init__(self, fd: int) -> None:
        """The slot in memory file ``fd``, as its record says (a new one: all zero)."""
        self.fd = fd
        self._map = mmap.mmap(fd, SIZE)
        self._u64 = memoryview(self._map).cast("Q")  # one aligned store per field
        self._area = memoryview(self._map)[HEADER:]
        word = self._u64[_WORD]
        self.start = word & _OFFSET_BITS
        self.phase = (word >> 48) & 0xFF
        self.flags = word >> 56
        self.wire = self._u64[_WIRE]
        self.area_start = self._u64[_AREA_START]
        self.fill = 0
        self.out = 0  # bytes written to the client (the kernel's count, followed here)

    @classmethod
    def create(cls, session_id: int, start: int, out: int) -> Slot:
        """A new record for a session whose client stream was read up to ``start`` and written
        up to ``out`` (its login)."""
        fd = os.memfd_create(f"replay-proxy-session-{session_id}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, SIZE)
            slot = cls(fd)
        except BaseException:
            os.close(fd)
            raise
        slot._u64[_FORMAT] = FORMAT
        slot.out = out
        slot.rebase(start)
        return slot

    def _store(self, phase: int) -> None:
        self.phase = phase
        self._u64[_WORD] = self.flags << 56 | phase << 48 | self.start

    def rebase(self, start: int) -> None:
        """Idle, the client's stream read up to ``start`` and nothing kept before it (a login, a
        COM_CHANGE_USER, a command refused for its size)."""
        self.start, self.wire = start, 0
        self.area_start, self.fill = start, 0
        self._u64[_AREA_START] = start
        self._store(Phase.IDLE)

    def retried(self, command_start: int | None) -> None:
        """A takeover runs the command at stream offset ``command_start`` again (None: nothing)."""
        self._u64[_RETRIED] = 0 if command_start is None else command_start + 1

    def adopted(self, consumed_now: int, written_now: int) -> None:
        """In the worker that took the slot over, whose client stream was read up to
        ``consumed_now`` and written up to ``written_now``: the area holds what the dead worker
        read (kept while a command in it is not answered); a command read and not sent is read
        again here (idle before it); one whose whole answer left is done (idle after it)."""
        self.out = written_now
        if self.area_start != NO_AREA:
            self.fill = consumed_now - self.area_start
        if self.phase == Phase.READ:
            self.wire = 0
            self._store(Phase.IDLE)
        elif self.phase == Phase.ANSWERING:  # ``decide`` let it through: answered whole
            self.idle(self.flags)

    # ------------------------------------------------------------------ the client's stream

    def receive(self, sock: socket.socket, size: int, buffered: int) -> bytes:
        """``sock.recv(size)``, the bytes landing in the area first. ``buffered``: bytes of the
        stream already read and not yet a command (then the area goes on after them)."""
        if not buffered and self.phase == Phase.IDLE:
            # Nothing read is pending: the area starts over at the stream's position.
            self.area_start, self.fill = self.start, 0
            self._u64[_AREA_START] = self.start
        room = CAPACITY - self.fill
        if room < _MIN_ROOM or self.area_start == NO_AREA:
            self.area_start = NO_AREA  # spent until the next idle point: a crash before it is a connection error
            self._u64[_AREA_START] = NO_AREA
            return sock.recv(size)
        n = sock.recv_into(self._area[self.fill :], min(size, room))
        data = bytes(self._area[self.fill : self.fill + n])
        self.fill += n
        return data

    # ------------------------------------------------------------------ the phases

    def read(self, wire: int, number: int) -> None:
        self.wire = wire
        u64 = self._u64
        u64[_WIRE] = wire
        u64[_MARKER] = 0
        u64[_NUMBER] = number
        self._store(Phase.READ)

    def marker(self, number: int) -> None:
        """The commit marker written for the COMMIT just read (before it is sent)."""
        self._u64[_MARKER] = number

    def sent(self) -> None:
        self._u64[_SENT_AT] = time.time_ns() // 1_000_000
        self._store(Phase.SENT)

    def answering(self, n: int, flags: int | None = None) -> None:
        """``n`` bytes of the answer are about to be written; with ``flags`` (the transaction's
        state after the command), they are its last."""
        self.out += n
        if flags is None:
            self._u64[_ANSWER_END] = 0
        else:
            self._u64[_ANSWER_END] = self.out
            self.flags = flags
        self._store(Phase.ANSWERING)

    def idle(self, flags: int) -> None:
        self.flags = flags
        self.start += self.wire
        self.wire = 0
        self._store(Phase.IDLE)

    def record(self) -> Record:
        return Record.parse(self._map)

    def close(self) -> None:
        self._u64.release()
        self._area.release()
        self._map.close()
        os.close(self.fd)


@attrs.frozen
class Record:
    """What a slot says (read by the worker that takes a dead one's sessions over)."""

    phase: int
    flags: int
    start: int
    area_start: int
    wire: int
    marker: int
    number: int
    area: bytes  # the client's bytes from area_start on, as many as are there (``take``)
    answer_end: int = 0
    retried: int = 0  # 1 + the stream offset of the command the last takeover ran again (0: none)
    sent_at: float = 0.0  # when the current command was sent, seconds since the epoch (0: not yet)

    @classmethod
    def parse(cls, data) -> Record:
        word, fmt, area_start, wire, marker, number, answer_end, retried, sent_at = struct.unpack_from("=9Q", data, 0)
        if fmt != FORMAT:
            raise ValueError(f"session record format {fmt}, this version reads {FORMAT}")
        return cls((word >> 48) & 0xFF, word >> 56, word & _OFFSET_BITS, area_start, wire, marker, number, bytes(data[HEADER:SIZE]),
                   answer_end, retried, sent_at / 1000)  # fmt: skip

    @classmethod
    def from_fd(cls, fd: int) -> Record:
        with mmap.mmap(fd, SIZE, access=mmap.ACCESS_READ) as m:
            return cls.parse(m)

    @property
    def expected(self) -> int:
        """Where the stream stands by the record: its command included, unless idle."""
        return self.start + (self.wire if self.phase != Phase.IDLE else 0)

    def take(self, begin: int, end: int) -> bytes | None:
        """The client's bytes from stream offset ``begin`` to ``end``, or None when the area does
        not hold them all."""
        if begin == end:
            return b""
        if self.area_start == NO_AREA or begin < self.area_start or end - self.area_start > CAPACITY or begin > end:
            return None
        return self.area[begin - self.area_start : end - self.area_start]

    @property
    def in_transaction(self) -> bool:
        return bool(self.flags & IN_TRANSACTION)

    @property
    def xa(self) -> str | None:
        return XA_STATES[(self.flags >> XA_SHIFT) & 3] or None


# --- the kernel's count of what was read from a TCP socket --------------------------------------

_TCP_INFO_SIZE = 256
_BYTES_ACKED = 120  # struct tcp_info: tcpi_bytes_acked (Linux 4.1+)
_BYTES_RECEIVED = 128  # tcpi_bytes_received
# TCP states after the peer's FIN (it takes a sequence number of its own).
_FIN_RECEIVED = frozenset({6, 7, 8, 9, 11})  # TIME_WAIT, CLOSE, CLOSE_WAIT, LAST_ACK, CLOSING


def consumed(sock: socket.socket) -> int | None:
    """Bytes the processes holding this socket have read from it so far: the kernel's count of
    bytes received, less what waits unread. None when the kernel does not say."""
    return _counted(sock, _BYTES_RECEIVED, termios.FIONREAD, -1)


def written(sock: socket.socket) -> int | None:
    """Bytes the processes holding this socket have written to it so far (acknowledged by the
    peer, and still queued); None when the kernel does not say."""
    return _counted(sock, _BYTES_ACKED, termios.TIOCOUTQ, 1)


def _counted(sock: socket.socket, offset: int, queue_ioctl: int, sign: int) -> int | None:
    """The tcp_info counter at ``offset`` plus (``sign``) the queue ``queue_ioctl`` says: two
    reads that bytes arriving (or acknowledged) between them would put out of step, so they are
    read again until the counter held still around the queue's reading."""
    for _ in range(100):
        try:
            before = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_SIZE)
            queued = array.array("i", [0])
            fcntl.ioctl(sock.fileno(), queue_ioctl, queued)
            after = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_SIZE)
        except OSError:
            return None
        if len(after) < offset + 8:
            return None
        if before[0] == after[0] and before[offset : offset + 8] == after[offset : offset + 8]:
            (count,) = struct.unpack_from("=Q", after, offset)
            if offset == _BYTES_RECEIVED and after[0] in _FIN_RECEIVED:
                count -= 1  # the FIN takes a sequence number, not a byte
            return count + sign * queued[0]
    return None  # never still: a stream too busy to count (not a client waiting for its answer)
