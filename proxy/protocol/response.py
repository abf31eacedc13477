"""Where does a response end? A streaming tracker that reads frame headers and the first bytes
of packets, never row contents, so the proxy can pass a response through chunk by chunk.

Rules (MySQL client/server protocol, 4.1):
- A result set is: column count, that many column definitions, EOF (absent with
  CLIENT_DEPRECATE_EOF), rows, then EOF / OK-with-0xFE-header, or ERR.
- A packet starting with 0xFE whose first frame is shorter than 0xFFFFFF is a terminator; a row
  can only start with 0xFE when its first column is >= 16 MiB, which makes the frame full-size.
- SERVER_MORE_RESULTS_EXISTS in a terminator's status means another result follows.
- COM_STMT_PREPARE: PREPARE_OK, then parameter and column definitions, each block followed by EOF
  (unless DEPRECATE_EOF) when not empty.
- A cursor-opening COM_STMT_EXECUTE ends after the column definitions (status CURSOR_EXISTS).
"""

from __future__ import annotations

import enum
import struct
import zlib
from typing import Final

from proxy.protocol.constants import MAX_FRAME, Commands, ServerStatus
from proxy.protocol.packets import (
    EOF_HEADER,
    ERR_HEADER,
    LOCAL_INFILE_HEADER,
    OK_HEADER,
    ErrPacket,
    OkPacket,
    PrepareOk,
    ProtocolError,
    Reader,
    parse_err,
    parse_ok,
    parse_prepare_ok,
)

__all__ = ["Expect", "expect_for", "ResponseTracker"]


class Expect(enum.IntEnum):
    NONE = 0  # COM_STMT_CLOSE, COM_STMT_SEND_LONG_DATA, COM_QUIT: no response at all
    SINGLE = 1  # one packet: OK / ERR / EOF (COM_PING, COM_INIT_DB, COM_SET_OPTION, ...)
    QUERY = 2  # COM_QUERY: OK | ERR | LOCAL INFILE request | text result sets
    EXECUTE = 3  # COM_STMT_EXECUTE: OK | ERR | binary result sets
    PREPARE = 4
    FETCH = 5  # rows then EOF
    FIELD_LIST = 6  # column definitions then EOF
    STRING = 7  # COM_STATISTICS: one human-readable string packet


_EXPECT = {
    Commands.COM_QUERY: Expect.QUERY,
    Commands.COM_STMT_EXECUTE: Expect.EXECUTE,
    Commands.COM_STMT_PREPARE: Expect.PREPARE,
    Commands.COM_STMT_FETCH: Expect.FETCH,
    Commands.COM_FIELD_LIST: Expect.FIELD_LIST,
    Commands.COM_STATISTICS: Expect.STRING,
    Commands.COM_STMT_CLOSE: Expect.NONE,
    Commands.COM_STMT_SEND_LONG_DATA: Expect.NONE,
    Commands.COM_QUIT: Expect.NONE,
}


def expect_for(command: int) -> Expect:
    return _EXPECT.get(command, Expect.SINGLE)


# Tracker states (plain ints: this runs once per packet).
_FIRST: Final = 0
_COLDEFS: Final = 1
_COLDEFS_EOF: Final = 2
_ROWS: Final = 3
_P_PARAMS: Final = 4
_P_PARAMS_EOF: Final = 5
_P_COLS: Final = 6
_P_COLS_EOF: Final = 7
_SINGLE: Final = 8
_DONE: Final = 9
# Modes within a frame.
_HEADER: Final = 0
_SKIP: Final = 1
_PEEK: Final = 2
_COLLECT: Final = 3

# Plain ints: IntFlag arithmetic is a Python-level call, and this runs per response.
_MORE: Final = int(ServerStatus.SERVER_MORE_RESULTS_EXISTS)
_CURSOR: Final = int(ServerStatus.SERVER_STATUS_CURSOR_EXISTS)
_SUMMARY: Final = struct.Struct("<4Q")
_CONTROL_MAX: Final = 1 << 20  # OK/ERR/EOF/column-count packets are small; bigger means a confused stream


class ResponseTracker:
    """Feed response bytes; learn where the response ends and what it said.

    ``feed`` returns -1 while the response continues past the given bytes, else the number of
    bytes of ``data`` that belong to the response (the rest, if any, is not part of it).
    With ``fingerprint=True`` it also computes a checksum of what the client saw (rows, column
    definitions, affected rows, insert ids, warnings, errors) for replay verification.
    """

    # Slots, every one set in __init__: a tracker is made per command. Defaults on the class
    # (set in the instance only when they change) made every read of an unchanged one CPython's
    # generic lookup, and the instance's inline values shared with all trackers the attribute
    # names the first ~30 trackers had set: a later kind of response (OKs after result sets)
    # then gave each tracker a dict of its own (callgrind: write_only counted after
    # point_select cost 8 % more than alone).
    __slots__ = ("expect", "deprecate_eof", "hashing", "_state", "done", "status", "saw_status", "ok", "error", "prepare_ok",
                 "local_infile", "rows", "results", "last_seq", "nbytes", "fingerprint", "_mode", "_count", "_skip", "_plen",
                 "_pkt", "_hdr", "_cont", "_done_after_skip")  # fmt: skip

    def __init__(self, expect: Expect, deprecate_eof: bool = False, fingerprint: bool = False) -> None:
        self.expect = expect
        self.deprecate_eof = deprecate_eof
        self.hashing = fingerprint
        self.done = False
        if expect is Expect.QUERY or expect is Expect.EXECUTE or expect is Expect.PREPARE:
            self._state = _FIRST
        elif expect is Expect.SINGLE or expect is Expect.STRING:
            self._state = _SINGLE
        elif expect is Expect.NONE:
            self._state = _DONE
            self.done = True
        else:  # FETCH: rows then EOF; FIELD_LIST: definitions until a terminator, like rows
            self._state = _ROWS
        self.status = 0  # status word of the last OK/EOF seen
        self.saw_status = False  # False when the response had no status word (ERR only, no response)
        self.ok: OkPacket | None = None  # last OK packet (statement results)
        self.error: ErrPacket | None = None
        self.prepare_ok: PrepareOk | None = None
        self.local_infile = False
        self.rows = self.results = self.last_seq = self.nbytes = self.fingerprint = 0
        self._mode = _HEADER
        self._count = self._skip = self._plen = 0
        self._pkt: bytearray | None = None
        self._hdr = b""
        self._cont = self._done_after_skip = False

    def feed(self, data: bytes) -> int:
        if self.done:
            return 0
        pos = 0
        if self._mode == _HEADER and not self._hdr and not self._cont:
            n = len(data)
            if (
                self._state == _FIRST
                and n >= 11
                and data[4] == OK_HEADER
                and self.expect is not Expect.PREPARE
                and n - 4 == (data[0] | data[1] << 8 | data[2] << 16) != MAX_FRAME  # the OK, whole and alone
            ):
                return self._one_ok(data)
            pos = self._whole_packets(data)
            if self.done:
                return pos
        return self._feed_from(data, pos)

    def _one_ok(self, data: bytes) -> int:
        """The commonest response, one OK that came whole and alone in one read (a write's, a
        BEGIN's, a COMMIT's): the walk below, without its loop and state."""
        ok = self.ok = parse_ok(data, at=4)  # past the frame's header, without copying the OK out
        self.status = ok.status
        self.saw_status = True
        self.results += 1
        self.last_seq = data[3]
        if self.hashing:
            self._summarize(0, ok.affected_rows, ok.last_insert_id, ok.warnings)
        if ok.status & _MORE:  # another result follows
            self.nbytes += len(data)
            return -1
        return self._finish(len(data))

    def _whole_packets(self, data: bytes) -> int:
        """Fast path for the usual case: walk the complete packets at the start of ``data``
        with local variables only; returns where the general state machine must take over."""
        pos = 0
        n = len(data)
        state = self._state
        rows = 0
        last = -1  # offset of the last header seen
        try:
            while n - pos >= 4:
                length = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
                end = pos + 4 + length
                if end > n or length == MAX_FRAME:
                    break  # incomplete, or continued over several frames: the general path
                last = pos
                if state == _ROWS:
                    first = data[pos + 4] if length else 0
                    if first != EOF_HEADER and first != ERR_HEADER:
                        rows += 1
                        if self.hashing:
                            self.fingerprint = zlib.crc32(memoryview(data)[pos + 4 : end], self.fingerprint)
                        pos = end
                        continue
                elif state == _COLDEFS or state == _P_PARAMS or state == _P_COLS:
                    if self.hashing:
                        self.fingerprint = zlib.crc32(memoryview(data)[pos + 4 : end], self.fingerprint)
                    pos = end
                    self._count -= 1
                    if not self._count:
                        self._state = state
                        self._definitions_done()
                        state = self._state
                        if self._done_after_skip:
                            return self._finish(pos)
                    continue
                pos = end
                self._state = state
                self.rows += rows
                rows = 0
                if self._control(data[last + 4 : end]):
                    return self._finish(pos)
                state = self._state
            return pos
        finally:
            if not self.done:
                self._state = state
                self.rows += rows
                self.nbytes += pos
            if last >= 0:
                self.last_seq = data[last + 3]

    def _feed_from(self, data: bytes, pos: int) -> int:
        n = len(data)
        if pos >= n:
            return -1
        self.nbytes -= pos  # counted by _whole_packets already; the totals below add all of data
        while pos < n:
            mode = self._mode
            if mode == _SKIP:
                take = self._skip if self._skip <= n - pos else n - pos
                if self.hashing:
                    self.fingerprint = zlib.crc32(memoryview(data)[pos : pos + take], self.fingerprint)
                pos += take
                self._skip -= take
                if self._skip:
                    break
                self._mode = _HEADER
                if self._done_after_skip and not self._cont:
                    return self._finish(pos)
                continue
            if mode == _HEADER:
                if self._hdr or n - pos < 4:
                    need = 4 - len(self._hdr)
                    self._hdr += bytes(data[pos : pos + need])
                    pos += min(need, n - pos)
                    if len(self._hdr) < 4:
                        break
                    h = self._hdr
                    self._hdr = b""
                    length = h[0] | h[1] << 8 | h[2] << 16
                    self.last_seq = h[3]
                else:
                    length = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
                    self.last_seq = data[pos + 3]
                    pos += 4
                continued = self._cont  # continuation of a large row or definition: pure data
                self._cont = length == MAX_FRAME
                state = self._state
                if continued or state == _COLDEFS or state == _P_PARAMS or state == _P_COLS:
                    if not continued:  # a definition: counted, not decoded
                        self._count -= 1
                        if not self._count:
                            self._definitions_done()
                    self._skip = length
                    self._mode = _SKIP
                    if not length and not self._cont:
                        self._mode = _HEADER
                        if self._done_after_skip:
                            return self._finish(pos)
                    continue
                if length == 0:
                    # Complete with its header: act on it now, not when more bytes arrive
                    # (the response may end here).
                    if state == _ROWS:  # an empty row packet cannot be a terminator
                        self.rows += 1
                    elif self._control(b""):
                        return self._finish(pos)
                    continue
                self._plen = length
                self._mode = _PEEK if state == _ROWS else _COLLECT
                continue
            if mode == _PEEK:
                first = data[pos]
                if (first == EOF_HEADER and self._plen < MAX_FRAME) or first == ERR_HEADER:
                    self._mode = _COLLECT
                else:
                    self.rows += 1
                    self._skip = self._plen
                    self._mode = _SKIP
                continue
            # _COLLECT: gather a whole control packet, then act on it
            if self._cont or self._plen > _CONTROL_MAX:
                raise ProtocolError(f"control packet of {self._plen} bytes in a response; stream is out of sync")
            if self._pkt is None:
                self._pkt = bytearray()
            want = self._plen - len(self._pkt)
            if not self._pkt and n - pos >= want:
                pkt = bytes(data[pos : pos + want])
                pos += want
            else:
                self._pkt += data[pos : pos + want]
                pos += min(want, n - pos)
                if len(self._pkt) < self._plen:
                    break
                pkt = bytes(self._pkt)
                self._pkt.clear()
            self._mode = _HEADER
            if self._control(pkt):
                return self._finish(pos)
        self.nbytes += n
        return -1

    def _finish(self, pos: int) -> int:
        self.done = True
        self._state = _DONE
        self.nbytes += pos
        return pos

    def _definitions_done(self) -> None:
        """The last definition of a block arrived; what comes next?"""
        state = self._state
        if state == _COLDEFS:
            self._state = _ROWS if self.deprecate_eof else _COLDEFS_EOF
        elif state == _P_PARAMS:
            if not self.deprecate_eof:
                self._state = _P_PARAMS_EOF
            else:
                self._after_prepare_params()
        else:  # _P_COLS
            if self.deprecate_eof:
                self._done_after_skip = True
            else:
                self._state = _P_COLS_EOF

    def _after_prepare_params(self) -> None:
        assert self.prepare_ok is not None
        if self.prepare_ok.num_columns:
            self._state = _P_COLS
            self._count = self.prepare_ok.num_columns
        else:
            self._done_after_skip = True

    def _summarize(self, kind: int, a: int, b: int = 0, c: int = 0) -> None:
        self.fingerprint = zlib.crc32(_SUMMARY.pack(kind, a, b, c), self.fingerprint)

    def _control(self, pkt: bytes) -> bool:
        """Act on a complete control packet; True when the response is complete."""
        state = self._state
        first = pkt[0] if pkt else -1
        if first == ERR_HEADER:
            self.error = parse_err(pkt)
            if self.hashing:
                self._summarize(0xFF, self.error.code)
                self.fingerprint = zlib.crc32(pkt, self.fingerprint)
            return True
        if state == _FIRST:
            if first == OK_HEADER:
                if self.expect is Expect.PREPARE:
                    return self._prepare_ok(pkt)
                self.ok = parse_ok(pkt)
                self.status = self.ok.status
                self.saw_status = True
                self.results += 1
                if self.hashing:
                    self._summarize(0, self.ok.affected_rows, self.ok.last_insert_id, self.ok.warnings)
                return not self.status & _MORE
            if first == LOCAL_INFILE_HEADER and self.expect is Expect.QUERY:
                self.local_infile = True
                return True
            ncols = Reader(pkt).lenenc()
            if ncols == 0:
                raise ProtocolError("result set with zero columns")
            self._count = ncols
            self._state = _COLDEFS
            if self.hashing:
                self._summarize(1, ncols)
            return False
        if state == _ROWS:  # 0xFE terminator: EOF, or OK under DEPRECATE_EOF
            if len(pkt) >= 7:  # an OK packet standing in for EOF (DEPRECATE_EOF); an EOF is 5 bytes
                ok = parse_ok(pkt)
                self.status, warnings = ok.status, ok.warnings
                self.saw_status = True
            else:
                warnings, self.status = _eof_fields(pkt)
                self.saw_status = True
            self.results += 1
            if self.hashing:
                self._summarize(2, self.rows, warnings)
            if self.status & _MORE and (self.expect is Expect.QUERY or self.expect is Expect.EXECUTE):
                self._state = _FIRST
                self.rows = 0
                return False
            return True
        if state == _COLDEFS_EOF:
            _warnings, self.status = _eof_fields(pkt)
            self.saw_status = True
            if self.expect is Expect.EXECUTE and self.status & _CURSOR:
                self.results += 1
                return True  # rows come later through COM_STMT_FETCH
            self._state = _ROWS
            return False
        if state == _P_PARAMS_EOF:
            self._after_prepare_params()
            return self._done_after_skip
        if state == _P_COLS_EOF:
            return True
        if state == _SINGLE:
            if first == OK_HEADER:
                self.ok = parse_ok(pkt)
                self.status = self.ok.status
                self.saw_status = True
            elif first == EOF_HEADER and len(pkt) < 9:
                _warnings, self.status = _eof_fields(pkt)
                self.saw_status = True
            return True
        raise ProtocolError(f"unexpected packet 0x{first:02x} in response state {state}")

    def _prepare_ok(self, pkt: bytes) -> bool:
        self.prepare_ok = p = parse_prepare_ok(pkt)
        if self.hashing:
            self._summarize(4, p.num_columns, p.num_params, p.warnings)
        if p.num_params:
            self._state = _P_PARAMS
            self._count = p.num_params
            return False
        if p.num_columns:
            self._state = _P_COLS
            self._count = p.num_columns
            return False
        return True


def _eof_fields(pkt: bytes) -> tuple[int, int]:
    """(warnings, status) of an EOF packet; a bare 0xFE (pre-4.1) has neither."""
    if len(pkt) >= 5:
        return pkt[1] | pkt[2] << 8, pkt[3] | pkt[4] << 8
    return 0, 0
