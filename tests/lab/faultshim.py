"""A fault-injection man-in-the-middle between a MySQL client (the proxy) and a real server.

    with FaultShim(db.port) as shim:                  # listens on shim.port
        rule = shim.drop_answer(match="COMMIT")        # the server runs it, the client never hears
        ... client connects to 127.0.0.1:shim.port ...
        assert shim.wait_applied(rule, 5)
        assert shim.count("COMMIT") == 1               # forwarded to the server exactly once
        assert not shim.errors

One background thread runs a ``selectors`` loop over non-blocking sockets. Every accepted
client connection gets its own connection to the server (also while faults are armed: a
reconnecting proxy goes through the shim again). Both directions are parsed into MySQL frames
(3-byte little-endian length, sequence id; a payload of exactly 0xFFFFFF bytes continues in the
next frame):

- client -> server: after the handshake, a frame with sequence id 0 starts a command; the whole
  command (continuation frames included) is read before anything of it is forwarded, so a rule
  can decide on it. Frames with another sequence id (LOAD DATA LOCAL file contents, auth data
  of COM_CHANGE_USER) are passed through.
- server -> client: a ``ResponseTracker`` per command in flight follows the response packet by
  packet (only the first bytes of each packet are looked at) and knows where it ends: OK / ERR,
  result sets (column count, column definitions, EOF unless CLIENT_DEPRECATE_EOF, rows, then
  EOF or the 0xFE-OK terminator), SERVER_MORE_RESULTS_EXISTS for multi-results, PREPARE_OK with
  its definition blocks, COM_CHANGE_USER's auth exchange, MariaDB's progress packets and
  metadata-skipping (MARIADB_CLIENT_CACHE_METADATA). Commands the tracker does not know end
  when the server has sent something and then stays quiet for ``QUIET`` seconds.

Faults (rules) are armed for the next ``times`` matching commands on any connection, or only on
connections logged in as ``user``; ``match`` is a predicate on ``Command`` or a string (a
case-insensitive prefix of the SQL text). See ``FaultShim`` for the list. Everything that
happens is appended to ``shim.log``; exceptions inside the shim never stop it silently: they go
to ``shim.errors`` (and the connection concerned is closed).
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import selectors
import socket
import struct
import threading
import time
import traceback
from typing import Any, Callable, Iterable

from tests.lab.mariadb import HOST, free_port

__all__ = ["Command", "Event", "FaultShim", "Rule", "ResponseTracker", "COMMAND_NAMES", "matcher"]

MAX_FRAME = 0xFFFFFF
QUIET = 0.2  # seconds of silence that end the response of a command the tracker does not know
CLOSE_FLUSH_TIMEOUT = 5.0  # how long a closing connection may take to hand its last bytes to the client
KEEPALIVE_S = 15  # TCP keepalive idle and interval on the accepted side, as Go sets for tidb-server
CONNECT_TIMEOUT = 5.0
BACKPRESSURE = 16 * 1024 * 1024  # stop reading a side while this much waits to be written to the other
RECV_SIZE = 1 << 20
HEAD_KEEP = 512  # bytes kept of each server packet (enough for every header the tracker reads)

# Capability flags
CLIENT_MYSQL = 1
CLIENT_PROTOCOL_41 = 0x200
CLIENT_SSL = 0x800
CLIENT_DEPRECATE_EOF = 1 << 24
MARIADB_CLIENT_CACHE_METADATA = 1 << 36  # extended (MariaDB) capabilities live in bits 32..63

# Status flags
SERVER_MORE_RESULTS_EXISTS = 0x0008
SERVER_STATUS_CURSOR_EXISTS = 0x0040

COMMAND_NAMES = {
    0x00: "COM_SLEEP",
    0x01: "COM_QUIT",
    0x02: "COM_INIT_DB",
    0x03: "COM_QUERY",
    0x04: "COM_FIELD_LIST",
    0x05: "COM_CREATE_DB",
    0x06: "COM_DROP_DB",
    0x07: "COM_REFRESH",
    0x08: "COM_SHUTDOWN",
    0x09: "COM_STATISTICS",
    0x0A: "COM_PROCESS_INFO",
    0x0B: "COM_CONNECT",
    0x0C: "COM_PROCESS_KILL",
    0x0D: "COM_DEBUG",
    0x0E: "COM_PING",
    0x0F: "COM_TIME",
    0x10: "COM_DELAYED_INSERT",
    0x11: "COM_CHANGE_USER",
    0x12: "COM_BINLOG_DUMP",
    0x13: "COM_TABLE_DUMP",
    0x14: "COM_CONNECT_OUT",
    0x15: "COM_REGISTER_SLAVE",
    0x16: "COM_STMT_PREPARE",
    0x17: "COM_STMT_EXECUTE",
    0x18: "COM_STMT_SEND_LONG_DATA",
    0x19: "COM_STMT_CLOSE",
    0x1A: "COM_STMT_RESET",
    0x1B: "COM_SET_OPTION",
    0x1C: "COM_STMT_FETCH",
    0x1D: "COM_DAEMON",
    0x1E: "COM_BINLOG_DUMP_GTID",
    0x1F: "COM_RESET_CONNECTION",
    0xFA: "COM_STMT_BULK_EXECUTE",
    0xFE: "COM_MULTI",
}

# What kind of response a command gets.
_NONE, _SINGLE, _QUERY, _EXECUTE, _PREPARE, _FETCH, _FIELD_LIST, _AUTH, _STREAM, _UNKNOWN = range(10)
_EXPECT = {
    0x01: _NONE,
    0x18: _NONE,
    0x19: _NONE,
    0x03: _QUERY,
    0x0A: _QUERY,
    0x17: _EXECUTE,
    0xFA: _EXECUTE,
    0x16: _PREPARE,
    0x1C: _FETCH,
    0x04: _FIELD_LIST,
    0x11: _AUTH,
    0x12: _STREAM,
    0x1E: _STREAM,
    0x02: _SINGLE,
    0x05: _SINGLE,
    0x06: _SINGLE,
    0x07: _SINGLE,
    0x08: _SINGLE,
    0x09: _SINGLE,
    0x0C: _SINGLE,
    0x0D: _SINGLE,
    0x0E: _SINGLE,
    0x15: _SINGLE,
    0x1A: _SINGLE,
    0x1B: _SINGLE,
    0x1F: _SINGLE,
}


class ShimProtocolError(Exception):
    """The server sent something the response tracker cannot follow."""


# ---------------------------------------------------------------------------------------------
# Pieces of the protocol


def _lenenc(buf: bytes, pos: int) -> tuple[int, int]:
    """(value, next position) of a length-encoded integer at ``pos``."""
    if pos >= len(buf):
        raise ShimProtocolError("length-encoded integer past the end of the packet head")
    first = buf[pos]
    if first < 0xFB:
        return first, pos + 1
    size = {0xFC: 2, 0xFD: 3, 0xFE: 8}.get(first)
    if size is None or pos + 1 + size > len(buf):
        raise ShimProtocolError(f"bad length-encoded integer prefix 0x{first:02x}")
    return int.from_bytes(buf[pos + 1 : pos + 1 + size], "little"), pos + 1 + size


def _ok_status(head: bytes) -> int:
    """Status word of an OK packet (header 0x00, or 0xFE standing in for EOF)."""
    _, pos = _lenenc(head, 1)
    _, pos = _lenenc(head, pos)
    if pos + 2 > len(head):
        return 0  # pre-4.1 OK: no status
    return head[pos] | head[pos + 1] << 8


def _terminator_status(head: bytes) -> int:
    """Status word of an EOF packet (5 bytes) or of an OK packet with the 0xFE header."""
    if len(head) == 5:
        return head[3] | head[4] << 8
    if len(head) < 5:
        return 0
    return _ok_status(head)


def _err_code(head: bytes) -> int:
    return head[1] | head[2] << 8 if len(head) >= 3 else 0


@dataclasses.dataclass(frozen=True)
class Command:
    """One command the client sent (all continuation frames joined).

    ``payload`` is what follows the command byte; ``sql`` the decoded text of COM_QUERY and
    COM_STMT_PREPARE (else None)."""

    conn: int
    code: int
    payload: bytes
    user: str | None = None

    @property
    def name(self) -> str:
        return COMMAND_NAMES.get(self.code, f"COM_0x{self.code:02x}")

    @property
    def sql(self) -> str | None:
        if self.code in (0x03, 0x16):
            return self.payload.decode("utf-8", errors="replace")
        return None

    @property
    def stmt_id(self) -> int | None:
        """Statement id of COM_STMT_EXECUTE / SEND_LONG_DATA / CLOSE / RESET / FETCH."""
        if self.code in (0x17, 0x18, 0x19, 0x1A, 0x1C, 0xFA) and len(self.payload) >= 4:
            return struct.unpack_from("<I", self.payload)[0]
        return None

    def __repr__(self) -> str:
        text = self.sql
        if text is not None and len(text) > 120:
            text = text[:117] + "..."
        what = repr(text) if text is not None else f"{len(self.payload)} bytes"
        return f"<Command #{self.conn} {self.name} {what}>"


@dataclasses.dataclass(frozen=True)
class Event:
    """One line of ``FaultShim.log``.

    kind: ``open`` (client accepted), ``connected`` (server connection up), ``connect_failed``,
    ``login`` (handshake done, detail = user), ``login_failed``, ``command`` (``command`` set,
    ``forwarded`` False when a fault kept it from the server), ``response`` (detail: ``ok``,
    ``err <code>``, ``<n> result(s)``, ...), ``fault`` (``rule`` set, detail says what was done),
    ``unsolicited`` (server data while no command was in flight), ``close`` (detail: reason),
    ``crash`` (``crash()`` closed the listening port; conn -1)."""

    seq: int
    time: float
    kind: str
    conn: int
    detail: str = ""
    command: Command | None = None
    forwarded: bool | None = None
    rule: "Rule | None" = None

    @property
    def sql(self) -> str | None:
        return self.command.sql if self.command is not None else None

    def __repr__(self) -> str:
        parts = [f"#{self.conn}", self.kind]
        if self.command is not None:
            parts.append(repr(self.command))
        if self.forwarded is False:
            parts.append("(not forwarded)")
        if self.detail:
            parts.append(self.detail)
        return f"<Event {self.seq} {' '.join(parts)}>"


Matcher = Callable[[Command], bool]


def matcher(match: Matcher | str) -> Matcher:
    """A predicate on Command from a predicate or a string (case-insensitive SQL prefix)."""
    if isinstance(match, str):
        prefix = match.strip().upper()

        def by_prefix(cmd: Command) -> bool:
            sql = cmd.sql
            return sql is not None and sql.lstrip().upper().startswith(prefix)

        by_prefix.__qualname__ = f"sql startswith {match!r}"
        return by_prefix
    if not callable(match):
        raise TypeError(f"match must be a callable or a string, got {match!r}")
    return match


class Rule:
    """An armed fault. ``applied`` counts how often it fired (its action completed)."""

    FAULTS = ("drop_answer", "close_before", "cut_result", "stall")

    def __init__(
        self,
        fault: str,
        match: Matcher | str,
        times: int = 1,
        user: str | None = None,
        reset: bool = False,
        at: int | None = None,
        seconds: float | None = None,
        then_close: bool = False,
    ) -> None:
        if fault not in self.FAULTS:
            raise ValueError(f"unknown fault {fault!r} (one of {', '.join(self.FAULTS)})")
        if times < 1:
            raise ValueError("times must be >= 1")
        if fault == "cut_result" and (at is None or at < 0):
            raise ValueError("cut_result needs at >= 0")
        self.fault = fault
        self.match = matcher(match)
        self.match_text = match if isinstance(match, str) else getattr(match, "__qualname__", repr(match))
        self.times = times
        self.remaining = times
        self.user = user
        self.reset = reset
        self.at = at
        self.seconds = seconds
        self.then_close = then_close
        self.matched: list[Command] = []
        self.applied = 0

    @property
    def spent(self) -> bool:
        return self.remaining <= 0

    def __repr__(self) -> str:
        extra = []
        if self.at is not None:
            extra.append(f"at={self.at}")
        if self.fault == "stall":
            extra.append(f"seconds={self.seconds}")
            if self.then_close:
                extra.append("then_close")
        if self.reset:
            extra.append("reset")
        if self.user:
            extra.append(f"user={self.user!r}")
        extra.append(f"applied={self.applied}/{self.times}")
        return f"<Rule {self.fault} match={self.match_text!r} {' '.join(extra)}>"


# ---------------------------------------------------------------------------------------------
# Where does a response end?

(
    _FIRST,
    _COLDEFS,
    _COLDEFS_EOF,
    _ROWS,
    _P_PARAMS,
    _P_PARAMS_EOF,
    _P_COLS,
    _P_COLS_EOF,
    _FIELDS,
    _S_AUTH,
    _S_SINGLE,
    _S_STREAM,
    _S_UNKNOWN,
    _DONE,
) = range(14)


class ResponseTracker:
    """Follows one command's response packet by packet; ``packet()`` returns True at its end.

    ``packet(head, length)`` takes the first bytes of a packet (at least ``HEAD_KEEP`` or the
    whole packet) and the packet's full length (continuation frames joined)."""

    def __init__(self, code: int, deprecate_eof: bool = False, cache_metadata: bool = False) -> None:
        self.code = code
        self.kind = _EXPECT.get(code, _UNKNOWN)
        self.deprecate_eof = deprecate_eof
        self.cache_metadata = cache_metadata
        self.state = {
            _NONE: _DONE,
            _SINGLE: _S_SINGLE,
            _QUERY: _FIRST,
            _EXECUTE: _FIRST,
            _PREPARE: _FIRST,
            _FETCH: _ROWS,
            _FIELD_LIST: _FIELDS,
            _AUTH: _S_AUTH,
            _STREAM: _S_STREAM,
            _UNKNOWN: _S_UNKNOWN,
        }[self.kind]
        self.count = 0
        self.num_columns = 0
        self.results = 0
        self.rows = 0
        self.packets = 0
        self.error: int | None = None
        self.infile = False
        self.last_status: int | None = None

    @property
    def done(self) -> bool:
        return self.state == _DONE

    @property
    def expects_response(self) -> bool:
        return self.kind != _NONE

    @property
    def heuristic(self) -> bool:
        """True when the end can only be guessed (quiet period)."""
        return self.state == _S_UNKNOWN

    def summary(self) -> str:
        if self.error is not None:
            prefix = f"{self.results} result(s) then " if self.results else ""
            return f"{prefix}err {self.error}"
        if self.kind == _PREPARE:
            return "prepare ok"
        if (
            self.results == 1
            and self.rows == 0
            and self.kind in (_QUERY, _EXECUTE)
            and self.last_status is not None
            and self.num_columns == 0
        ):
            return "ok"
        return f"{self.results} result(s), {self.rows} row(s)"

    def _is_terminator(self, head: bytes, length: int) -> bool:
        if not head or head[0] != 0xFE:
            return False
        return length < MAX_FRAME if self.deprecate_eof else length < 9

    def _end_of_result(self, status: int) -> None:
        self.results += 1
        self.last_status = status
        if status & SERVER_MORE_RESULTS_EXISTS and self.kind in (_QUERY, _EXECUTE):
            self.state = _FIRST
        else:
            self.state = _DONE

    def packet(self, head: bytes, length: int) -> bool:
        self.packets += 1
        state = self.state
        if state in (_DONE, _S_STREAM, _S_UNKNOWN):
            return state == _DONE
        if state == _S_SINGLE:
            if head[:1] == b"\xff":
                self.error = _err_code(head)
            self.state = _DONE
            return True
        first = head[0] if head else -1
        if first == 0xFF:
            code = _err_code(head)
            if code == 0xFFFF and state != _S_AUTH:
                return False  # MariaDB progress report, not the end
            self.error = code
            self.state = _DONE
            return True
        if state == _S_AUTH:  # COM_CHANGE_USER: auth switch (0xFE) / more data (0x01) until OK
            if first == 0x00:
                self.state = _DONE
                return True
            return False
        if state == _FIRST:
            if first == 0x00:
                if self.kind == _PREPARE:
                    if len(head) < 9:
                        raise ShimProtocolError("short PREPARE_OK")
                    self.num_columns, num_params = struct.unpack_from("<HH", head, 5)
                    if num_params:
                        self.state, self.count = _P_PARAMS, num_params
                    else:
                        self._after_params()
                    return self.done
                self._end_of_result(_ok_status(head))
                return self.done
            if first == 0xFB and self.kind == _QUERY:
                self.infile = True  # the client sends the file, then the server answers OK/ERR
                return False
            if first == 0xFE:  # not a column count anyone sends: take it as an end
                self._end_of_result(_terminator_status(head))
                return self.done
            ncols, pos = _lenenc(head, 0)
            if ncols == 0:
                raise ShimProtocolError("result set with zero columns")
            self.num_columns = ncols
            metadata = True
            if self.cache_metadata and pos < len(head):
                metadata = head[pos] == 1
            if metadata:
                self.state, self.count = _COLDEFS, ncols
            else:
                self.state = _ROWS if self.deprecate_eof else _COLDEFS_EOF
            return False
        if state == _COLDEFS:
            self.count -= 1
            if self.count == 0:
                self.state = _ROWS if self.deprecate_eof else _COLDEFS_EOF
            return False
        if state == _COLDEFS_EOF:
            if first != 0xFE:
                raise ShimProtocolError(f"expected EOF after column definitions, got 0x{first:02x}")
            status = _terminator_status(head)
            if self.kind == _EXECUTE and status & SERVER_STATUS_CURSOR_EXISTS:
                self.results += 1  # rows come later through COM_STMT_FETCH
                self.last_status = status
                self.state = _DONE
                return True
            self.state = _ROWS
            return False
        if state == _ROWS:
            if self._is_terminator(head, length):
                if self.kind == _FETCH:
                    self.results += 1
                    self.last_status = _terminator_status(head)
                    self.state = _DONE
                    return True
                self._end_of_result(_terminator_status(head))
                return self.done
            self.rows += 1
            return False
        if state == _FIELDS:
            if self._is_terminator(head, length):
                self.state = _DONE
                return True
            return False
        if state == _P_PARAMS:
            self.count -= 1
            if self.count == 0:
                if self.deprecate_eof:
                    self._after_params()
                else:
                    self.state = _P_PARAMS_EOF
            return self.done
        if state == _P_PARAMS_EOF:
            self._after_params()
            return self.done
        if state == _P_COLS:
            self.count -= 1
            if self.count == 0:
                self.state = _DONE if self.deprecate_eof else _P_COLS_EOF
            return self.done
        if state == _P_COLS_EOF:
            self.state = _DONE
            return True
        raise ShimProtocolError(f"response tracker in unknown state {state}")

    def _after_params(self) -> None:
        if self.num_columns:
            self.state, self.count = _P_COLS, self.num_columns
        else:
            self.state = _DONE


# ---------------------------------------------------------------------------------------------
# Buffers and per-connection state


class _OutBuf:
    """Bytes waiting to be written to a non-blocking socket."""

    def __init__(self) -> None:
        self.chunks: collections.deque[memoryview] = collections.deque()
        self.size = 0

    def append(self, data: bytes | bytearray | memoryview) -> None:
        if data:
            self.chunks.append(memoryview(bytes(data)))
            self.size += len(data)

    def clear(self) -> None:
        self.chunks.clear()
        self.size = 0

    def send(self, sock: socket.socket) -> None:
        """Write as much as the socket takes; OSError (EPIPE, ECONNRESET) propagates."""
        while self.chunks:
            chunk = self.chunks[0]
            try:
                n = sock.send(chunk[: 1 << 20])
            except (BlockingIOError, InterruptedError):
                return
            self.size -= n
            if n == len(chunk):
                self.chunks.popleft()
            else:
                self.chunks[0] = chunk[n:]


class _Framer:
    """Splits a byte stream into frames: (seq, payload, raw bytes)."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> None:
        self.buf += data

    def frames(self) -> Iterable[tuple[int, bytes, bytes]]:
        while len(self.buf) >= 4:
            length = self.buf[0] | self.buf[1] << 8 | self.buf[2] << 16
            if len(self.buf) < 4 + length:
                return
            raw = bytes(self.buf[: 4 + length])
            del self.buf[: 4 + length]
            yield raw[3], raw[4:], raw

    @property
    def partial(self) -> bool:
        return bool(self.buf)


class _Inflight:
    """A forwarded command waiting for (the end of) its response."""

    def __init__(self, command: Command, tracker: ResponseTracker, rule: Rule | None) -> None:
        self.command = command
        self.tracker = tracker
        self.rule = rule
        self.relayed = 0  # bytes of this response relayed to the client (cut_result)
        self.received = 0
        self.last_byte = 0.0


class _Conn:
    def __init__(self, index: int, client: socket.socket, addr: Any) -> None:
        self.index = index
        self.client: socket.socket | None = client
        self.server: socket.socket | None = None
        self.addr = addr
        self.state = "connecting"  # connecting -> handshake -> ready -> closing -> closed
        self.connect_deadline = time.monotonic() + CONNECT_TIMEOUT
        self.from_client = _Framer()
        self.from_server = _Framer()
        self.to_client = _OutBuf()
        self.to_server = _OutBuf()
        self.opaque = False  # TLS or something unparsable: pass bytes through untouched
        self.user: str | None = None
        self.pending_user: str | None = None
        self.server_caps = 0
        self.client_caps = 0
        self.server_thread_id: int | None = None
        self.greeting_seen = False
        # client -> server command being assembled
        self.cmd_raw: list[bytes] = []
        self.cmd_payload = bytearray()
        self.cmd_continues = False
        # server -> client packet being assembled
        self.pkt_head = bytearray()
        self.pkt_len = 0
        self.pkt_continues = False
        self.inflight: collections.deque[_Inflight] = collections.deque()
        # stall
        self.hold: _OutBuf | None = None
        self.hold_rule: Rule | None = None
        self.hold_until: float | None = None
        # closing
        self.close_deadline = 0.0
        self.close_reset = False
        self.close_reason = "closed"
        self.registered: dict[int, int] = {}

    @property
    def caps(self) -> int:
        return self.client_caps & self.server_caps

    @property
    def busy(self) -> bool:
        """A command in flight, half received, or a held (stalled) response."""
        return bool(self.inflight) or self.cmd_continues or self.from_client.partial or self.hold is not None

    def sockets(self) -> list[tuple[str, socket.socket]]:
        return [(side, s) for side, s in (("client", self.client), ("server", self.server)) if s is not None]


def _close_socket(sock: socket.socket | None, reset: bool) -> None:
    if sock is None:
        return
    try:
        if reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


# ---------------------------------------------------------------------------------------------
# The shim


class FaultShim:
    """A TCP man-in-the-middle that injects faults into MySQL sessions (see the module doc).

    Faults, each armed for the next ``times`` matching commands (``user=`` restricts a rule to
    connections logged in as that user):

    - ``drop_answer(match=...)``: forward the command, let the server answer completely, discard
      the answer, close both sockets (``reset=True``: RST instead of FIN).
    - ``close_before(match=...)``: close both sockets; the server never sees the command.
    - ``cut_result(at, match=...)``: forward, relay the first ``at`` bytes of the response,
      close both sockets (at the end of the response if it is shorter).
    - ``stall(seconds, match=...)``: forward, hold the whole response for ``seconds`` (None:
      until ``release()``), then relay it (``then_close=True``: close instead).

    Immediate actions: ``close_idle_connections()``, ``close_all()``, ``release()``, ``crash(down)``
    (every connection cut and the port closed for ``down`` seconds: a server process that died
    and restarts, while the server behind the shim -- and its storage -- stays up).
    Observation: ``log``, ``commands()``, ``count()``, ``wait_applied()``, ``wait_command()``,
    ``errors``, ``mark()``.
    """

    def __init__(self, server_port: int, server_host: str = HOST, host: str = HOST, port: int | None = None) -> None:
        self.server_host = server_host
        self.server_port = server_port
        self.host = host
        self._requested_port = port
        self.port: int | None = None
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._log: list[Event] = []
        self._errors: list[tuple[str, BaseException, str]] = []
        self._rules: list[Rule] = []
        self._conns: dict[int, _Conn] = {}
        self._next_index = 0
        self._calls: collections.deque[tuple[Callable[[], Any], list[Any], threading.Event]] = collections.deque()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._sel: selectors.DefaultSelector | None = None
        self._listener: socket.socket | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> "FaultShim":
        if self._thread is not None:
            raise RuntimeError("FaultShim already started")
        self.port = self._requested_port or free_port(self.host)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._open_listener()
        self._sel.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"faultshim:{self.port}->{self.server_port}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10) -> None:
        """Close every connection and the listener, and end the thread."""
        if self._thread is None:
            return
        self._stopping = True
        self._wake()
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._record("stop", RuntimeError(f"shim thread did not end within {timeout} s"))
        else:
            self._thread = None
        for conn in list(self._conns.values()):
            for _, sock in conn.sockets():
                _close_socket(sock, False)
        self._conns.clear()
        for s in (self._listener, self._wake_r, self._wake_w):
            if s is not None:
                s.close()
        if self._sel is not None:
            self._sel.close()
        self._listener = self._wake_r = self._wake_w = None
        self._sel = None

    def __enter__(self) -> "FaultShim":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<FaultShim {self.host}:{self.port} -> {self.server_host}:{self.server_port}>"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- arming faults -----------------------------------------------------------------------

    def arm(self, fault: str, match: Matcher | str, **params: Any) -> Rule:
        """Arm a fault by name: ``arm("cut_result", "SELECT", at=10)``."""
        rule = Rule(fault, match, **params)
        with self._cond:
            self._rules.append(rule)
        return rule

    def drop_answer(self, *, match: Matcher | str, times: int = 1, user: str | None = None, reset: bool = False) -> Rule:
        return self.arm("drop_answer", match, times=times, user=user, reset=reset)

    def close_before(self, *, match: Matcher | str, times: int = 1, user: str | None = None, reset: bool = False) -> Rule:
        return self.arm("close_before", match, times=times, user=user, reset=reset)

    def cut_result(self, at: int, *, match: Matcher | str, times: int = 1, user: str | None = None, reset: bool = False) -> Rule:
        return self.arm("cut_result", match, at=at, times=times, user=user, reset=reset)

    def stall(
        self,
        seconds: float | None = None,
        *,
        match: Matcher | str,
        then_close: bool = False,
        times: int = 1,
        user: str | None = None,
        reset: bool = False,
    ) -> Rule:
        return self.arm("stall", match, seconds=seconds, then_close=then_close, times=times, user=user, reset=reset)

    def disarm(self, rule: Rule | None = None) -> None:
        """Remove one rule (or all) so it fires no more; faults already under way finish."""
        with self._cond:
            if rule is None:
                self._rules.clear()
            elif rule in self._rules:
                self._rules.remove(rule)

    @property
    def rules(self) -> list[Rule]:
        with self._cond:
            return list(self._rules)

    # -- immediate actions -------------------------------------------------------------------

    def release(self) -> int:
        """Relay (or close, for then_close) every stalled response now; returns how many."""
        return self._call(self._do_release)

    def close_idle_connections(self, reset: bool = False) -> list[int]:
        """Close every logged-in connection with nothing in flight, both sides, as a restarting
        server closes idle sessions. Returns the indexes of the closed connections."""
        return self._call(lambda: self._do_close_where(lambda c: c.state == "ready" and not c.busy, "close_idle_connections", reset))

    def close_all(self, reset: bool = False) -> list[int]:
        """Close every connection now (both sides)."""
        return self._call(lambda: self._do_close_where(lambda c: c.state != "closed", "close_all", reset))

    def crash(self, down: float = 0.0, reset: bool = False) -> list[int]:
        """As a server that crashed and restarts: close every connection now and the listening
        port too (connects are refused, ECONNREFUSED), open it again after ``down`` seconds
        (blocks that long). Returns the indexes of the closed connections."""
        closed = self._call(lambda: self._do_crash(reset))
        if down > 0:
            time.sleep(down)
        self._call(self._open_listener)
        return closed

    def close_connection(self, index: int, reset: bool = False) -> bool:
        """Close one connection (both sides) now."""
        return bool(self._call(lambda: self._do_close_where(lambda c: c.index == index, "close_connection", reset)))

    # -- observation -------------------------------------------------------------------------

    @property
    def log(self) -> list[Event]:
        with self._cond:
            return list(self._log)

    @property
    def errors(self) -> list[tuple[str, BaseException, str]]:
        """(where, exception, formatted traceback) of every exception caught inside the shim."""
        with self._cond:
            return list(self._errors)

    def check(self) -> None:
        """Raise AssertionError if the shim recorded any error."""
        errors = self.errors
        if errors:
            text = "\n".join(f"[{where}] {tb}" for where, _, tb in errors)
            raise AssertionError(f"fault shim recorded {len(errors)} error(s):\n{text}")

    def mark(self) -> int:
        """A position in the log, for ``since=``."""
        with self._cond:
            return len(self._log)

    def events(self, kind: str | None = None, since: int = 0, conn: int | None = None) -> list[Event]:
        with self._cond:
            return [e for e in self._log[since:] if (kind is None or e.kind == kind) and (conn is None or e.conn == conn)]

    def commands(
        self, match: Matcher | str | None = None, *, since: int = 0, forwarded: bool | None = None, conn: int | None = None
    ) -> list[Command]:
        """Commands seen (optionally only those forwarded to / kept from the server)."""
        pred = matcher(match) if match is not None else None
        out = []
        for e in self.events("command", since, conn):
            if forwarded is not None and e.forwarded != forwarded:
                continue
            if pred is None or pred(e.command):
                out.append(e.command)
        return out

    def count(self, match: Matcher | str, *, since: int = 0, forwarded: bool | None = True) -> int:
        """How many matching commands reached the server (``forwarded=None``: were seen)."""
        return len(self.commands(match, since=since, forwarded=forwarded))

    def wait_applied(self, rule: Rule, timeout: float = 10, count: int = 1) -> bool:
        """True once ``rule`` has fired ``count`` times (its action completed)."""
        with self._cond:
            return self._cond.wait_for(lambda: rule.applied >= count, timeout)

    def wait_command(self, match: Matcher | str, timeout: float = 10, since: int = 0) -> Command | None:
        """The first matching command seen after log position ``since``, waiting up to ``timeout``."""
        pred = matcher(match)
        found: list[Command] = []

        def look() -> bool:
            for e in self._log[since:]:
                if e.kind == "command" and pred(e.command):
                    found.append(e.command)
                    return True
            return False

        with self._cond:
            self._cond.wait_for(look, timeout)
        return found[0] if found else None

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10) -> bool:
        """Wait until ``predicate()`` (called under the shim's lock after each log event) is true."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout)

    def connections(self) -> list[dict[str, Any]]:
        """A snapshot of the live connections."""

        def info(c: _Conn) -> dict[str, Any]:
            return {
                "index": c.index,
                "state": c.state,
                "user": c.user,
                "busy": c.busy,
                "server_thread_id": c.server_thread_id,
                "inflight": [i.command for i in c.inflight],
            }

        return self._call(lambda: [info(c) for c in self._conns.values()])

    def format_log(self, since: int = 0) -> str:
        return "\n".join(repr(e) for e in self.log[since:])

    # -- internals: bookkeeping --------------------------------------------------------------

    def _event(self, kind: str, conn: int, detail: str = "", **kw: Any) -> None:
        with self._cond:
            self._log.append(Event(len(self._log), time.monotonic(), kind, conn, detail, **kw))
            self._cond.notify_all()

    def _record(self, where: str, exc: BaseException) -> None:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        with self._cond:
            self._errors.append((where, exc, tb))
            self._cond.notify_all()

    def _wake(self) -> None:
        w = self._wake_w
        if w is not None:
            try:
                w.send(b"x")
            except OSError:
                pass  # buffer full: the loop is awake anyway

    def _call(self, fn: Callable[[], Any], timeout: float = 10) -> Any:
        """Run ``fn`` on the shim thread and return its result."""
        if threading.current_thread() is self._thread:
            return fn()
        if not self.running:
            raise RuntimeError(f"{self!r} is not running (errors: {[repr(e) for _, e, _ in self.errors]})")
        box: list[Any] = []
        done = threading.Event()
        with self._cond:
            self._calls.append((fn, box, done))
        self._wake()
        if not done.wait(timeout):
            raise RuntimeError(f"{self!r}: shim thread did not run the request within {timeout} s")
        if box and isinstance(box[0], BaseException):
            raise box[0]
        return box[0] if box else None

    # -- internals: the loop -----------------------------------------------------------------

    def _run(self) -> None:
        consecutive = 0
        while not self._stopping:
            try:
                self._iteration()
                consecutive = 0
            except Exception as exc:  # never die silently
                self._record("loop", exc)
                consecutive += 1
                if consecutive >= 50:
                    self._record("loop", RuntimeError("50 consecutive loop errors: the shim stops"))
                    break
                time.sleep(0.01)
        # answer callers still waiting
        with self._cond:
            calls = list(self._calls)
            self._calls.clear()
        for _, box, done in calls:
            box.append(RuntimeError("shim stopped"))
            done.set()

    def _iteration(self) -> None:
        sel = self._sel
        assert sel is not None
        timeout = self._next_timeout()
        for key, mask in sel.select(timeout):
            what, conn = key.data
            if what == "listener":
                self._accept()
            elif what == "wake":
                try:
                    while self._wake_r.recv(4096):
                        pass
                except (BlockingIOError, InterruptedError):
                    pass
            else:
                if conn.state == "closed":
                    continue
                try:
                    if what == "client":
                        self._on_client_event(conn, mask)
                    else:
                        self._on_server_event(conn, mask)
                except Exception as exc:
                    self._record(f"connection #{conn.index} ({what} side)", exc)
                    self._close(conn, f"shim error: {type(exc).__name__}: {exc}", flush=False)
            if conn is not None and conn.state != "closed":
                self._update_interest(conn)
        self._run_calls()
        self._check_deadlines()

    def _run_calls(self) -> None:
        while True:
            with self._cond:
                if not self._calls:
                    return
                fn, box, done = self._calls.popleft()
            try:
                box.append(fn())
            except Exception as exc:
                self._record("control call", exc)
                box.append(exc)
            finally:
                done.set()

    def _next_timeout(self) -> float:
        now = time.monotonic()
        deadline = now + 1.0
        for conn in self._conns.values():
            if conn.state == "connecting":
                deadline = min(deadline, conn.connect_deadline)
            if conn.state == "closing":
                deadline = min(deadline, conn.close_deadline)
            if conn.hold_until is not None:
                deadline = min(deadline, conn.hold_until)
            if conn.inflight and conn.inflight[0].tracker.heuristic and conn.inflight[0].received:
                deadline = min(deadline, conn.inflight[0].last_byte + QUIET)
        return max(0.0, deadline - now)

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for conn in list(self._conns.values()):
            try:
                if conn.state == "connecting" and now >= conn.connect_deadline:
                    self._event("connect_failed", conn.index, "timeout")
                    self._close(conn, "connect to server timed out", flush=False)
                    continue
                if conn.state == "closing" and now >= conn.close_deadline:
                    self._finish_close(conn, "flush to client timed out")
                    continue
                if conn.hold_until is not None and now >= conn.hold_until:
                    self._end_stall(conn, "timer")
                if conn.state in ("ready", "handshake") and conn.inflight:
                    head = conn.inflight[0]
                    if head.tracker.heuristic and head.received and now >= head.last_byte + QUIET:
                        self._response_done(conn, head, "quiet period")
                if conn.state != "closed":
                    self._update_interest(conn)
            except Exception as exc:
                self._record(f"connection #{conn.index} (deadline)", exc)
                self._close(conn, f"shim error: {type(exc).__name__}: {exc}", flush=False)

    # -- internals: sockets ------------------------------------------------------------------

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                client, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._record("accept", exc)
                return
            try:
                client.setblocking(False)
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                # The keepalive of the server the shim stands in for (Go's for an accepted
                # connection, as tidb-server's: probes after 15 s idle, every 15 s): a client
                # whose reset a partition dropped is found gone once a probe gets through, and
                # the server's session -- its transaction, its locks -- ends with it. Without
                # it the session lived on with the shim and a replay waited for its locks.
                client.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_S)
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_S)
            except OSError:
                pass  # a client that reset at once: its first recv tells
            with self._cond:
                index = self._next_index
                self._next_index += 1
            conn = _Conn(index, client, addr)
            self._conns[index] = conn
            self._event("open", index, f"client {addr[0]}:{addr[1]}")
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.setblocking(False)
            server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.server = server
            err = server.connect_ex((self.server_host, self.server_port))
            if err not in (0, errno.EINPROGRESS, errno.EAGAIN, errno.EWOULDBLOCK):
                self._event("connect_failed", index, errno.errorcode.get(err, str(err)))
                self._close(conn, f"connect to server failed: {errno.errorcode.get(err, err)}", flush=False)
                continue
            self._update_interest(conn)

    def _update_interest(self, conn: _Conn) -> None:
        sel = self._sel
        assert sel is not None
        for side, sock in conn.sockets():
            events = 0
            if side == "client":
                if conn.state in ("connecting", "handshake", "ready") and conn.to_server.size < BACKPRESSURE:
                    events |= selectors.EVENT_READ
                if conn.to_client.size:
                    events |= selectors.EVENT_WRITE
            else:
                if conn.state == "connecting":
                    events |= selectors.EVENT_WRITE
                else:
                    if conn.state in ("handshake", "ready") and conn.to_client.size < BACKPRESSURE:
                        events |= selectors.EVENT_READ
                    if conn.to_server.size:
                        events |= selectors.EVENT_WRITE
            fd = sock.fileno()
            old = conn.registered.get(fd)
            if old == events:
                continue
            if old is None:
                if events:
                    sel.register(sock, events, (side, conn))
                    conn.registered[fd] = events
            elif events:
                sel.modify(sock, events, (side, conn))
                conn.registered[fd] = events
            else:
                sel.unregister(sock)
                del conn.registered[fd]

    def _unregister(self, conn: _Conn, sock: socket.socket | None) -> None:
        if sock is None or self._sel is None:
            return
        try:
            fd = sock.fileno()
        except OSError:
            return
        if fd in conn.registered:
            try:
                self._sel.unregister(sock)
            except (KeyError, ValueError, OSError):
                pass
            del conn.registered[fd]

    def _recv(self, sock: socket.socket) -> bytes | None:
        """Data, b'' at EOF/reset, None when nothing is there."""
        try:
            return sock.recv(RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return None
        except (ConnectionResetError, ConnectionAbortedError, BrokenPipeError, TimeoutError):
            return b""

    def _on_client_event(self, conn: _Conn, mask: int) -> None:
        if mask & selectors.EVENT_WRITE and conn.client is not None:
            try:
                conn.to_client.send(conn.client)
            except OSError as exc:
                self._close(conn, f"client gone while writing ({exc.__class__.__name__})", flush=False)
                return
            if conn.state == "closing" and not conn.to_client.size:
                self._finish_close(conn, None)
                return
        if mask & selectors.EVENT_READ and conn.state in ("connecting", "handshake", "ready"):
            data = self._recv(conn.client)
            if data is None:
                return
            if not data:
                self._close(conn, "client closed", flush=False, flush_server=True)
                return
            conn.from_client.feed(data)
            self._client_data(conn)

    def _on_server_event(self, conn: _Conn, mask: int) -> None:
        if conn.state == "connecting":
            if mask & (selectors.EVENT_WRITE | selectors.EVENT_READ):
                err = conn.server.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    self._event("connect_failed", conn.index, errno.errorcode.get(err, str(err)))
                    self._close(conn, f"connect to server failed: {errno.errorcode.get(err, err)}", flush=False)
                    return
                conn.state = "handshake"
                self._event("connected", conn.index)
            return
        if mask & selectors.EVENT_WRITE and conn.server is not None:
            try:
                conn.to_server.send(conn.server)
            except OSError as exc:
                self._close(conn, f"server gone while writing ({exc.__class__.__name__})")
                return
        if mask & selectors.EVENT_READ and conn.state in ("handshake", "ready"):
            data = self._recv(conn.server)
            if data is None:
                return
            if not data:
                self._server_closed(conn)
                return
            self._server_data(conn, data)

    # -- internals: client -> server ---------------------------------------------------------

    def _client_data(self, conn: _Conn) -> None:
        if conn.opaque:
            conn.to_server.append(bytes(conn.from_client.buf))
            conn.from_client.buf.clear()
            return
        for seq, payload, raw in conn.from_client.frames():
            if conn.state != "ready":
                self._client_handshake_frame(conn, seq, payload, raw)
                if conn.opaque:
                    conn.to_server.append(bytes(conn.from_client.buf))
                    conn.from_client.buf.clear()
                    return
                continue
            if conn.cmd_continues:
                conn.cmd_raw.append(raw)
                conn.cmd_payload += payload
                conn.cmd_continues = len(payload) == MAX_FRAME
            elif seq == 0:
                conn.cmd_raw = [raw]
                conn.cmd_payload = bytearray(payload)
                conn.cmd_continues = len(payload) == MAX_FRAME
            else:
                # Not a command: LOAD DATA LOCAL contents, COM_CHANGE_USER auth data, ...
                conn.to_server.append(raw)
                continue
            if not conn.cmd_continues:
                raw_frames, full = conn.cmd_raw, bytes(conn.cmd_payload)
                conn.cmd_raw, conn.cmd_payload = [], bytearray()
                self._on_command(conn, full, raw_frames)
                if conn.state != "ready":
                    return  # a fault closed it

    def _client_handshake_frame(self, conn: _Conn, seq: int, payload: bytes, raw: bytes) -> None:
        conn.to_server.append(raw)
        if seq != 1 or conn.client_caps:
            return
        # The handshake response (or an SSL request).
        if len(payload) < 4:
            return
        caps = struct.unpack_from("<I", payload)[0]
        if caps & CLIENT_PROTOCOL_41 and len(payload) >= 32:
            ext = struct.unpack_from("<I", payload, 28)[0] if not caps & CLIENT_MYSQL else 0
            conn.client_caps = caps | ext << 32
            if caps & CLIENT_SSL and len(payload) == 32:
                conn.opaque = True
                self._event("login", conn.index, "TLS: passed through without parsing")
                return
            end = payload.find(b"\0", 32)
            conn.user = payload[32 : end if end >= 0 else None].decode("utf-8", errors="replace")
        else:
            conn.client_caps = caps & 0xFFFF
            end = payload.find(b"\0", 5)
            conn.user = payload[5 : end if end >= 0 else None].decode("utf-8", errors="replace")

    def _find_rule(self, conn: _Conn, cmd: Command) -> Rule | None:
        with self._cond:
            for rule in self._rules:
                if rule.spent or (rule.user is not None and rule.user != conn.user):
                    continue
                try:
                    hit = bool(rule.match(cmd))
                except Exception as exc:
                    self._record(f"match of {rule!r} on {cmd!r}", exc)
                    continue
                if hit:
                    rule.remaining -= 1
                    rule.matched.append(cmd)
                    if rule.spent:
                        self._rules.remove(rule)
                    return rule
        return None

    def _applied(self, conn: _Conn, rule: Rule, detail: str) -> None:
        with self._cond:
            rule.applied += 1
            self._log.append(Event(len(self._log), time.monotonic(), "fault", conn.index, f"{rule.fault}: {detail}", rule=rule))
            self._cond.notify_all()

    def _on_command(self, conn: _Conn, payload: bytes, raw_frames: list[bytes]) -> None:
        if not payload:
            conn.to_server.append(b"".join(raw_frames))
            return
        cmd = Command(conn.index, payload[0], payload[1:], conn.user)
        rule = self._find_rule(conn, cmd)
        if rule is not None and rule.fault == "close_before":
            self._event("command", conn.index, command=cmd, forwarded=False, rule=rule)
            self._close(conn, "fault close_before", reset=rule.reset, flush=True)
            self._applied(conn, rule, f"closed before forwarding {cmd!r}")
            return
        self._event("command", conn.index, command=cmd, forwarded=True, rule=rule)
        conn.to_server.append(b"".join(raw_frames))
        if cmd.code == 0x11:  # COM_CHANGE_USER: the user once the server accepts it
            end = cmd.payload.find(b"\0")
            conn.pending_user = cmd.payload[: end if end >= 0 else None].decode("utf-8", errors="replace")
        tracker = ResponseTracker(cmd.code, bool(conn.caps & CLIENT_DEPRECATE_EOF), bool(conn.caps & MARIADB_CLIENT_CACHE_METADATA))
        item = _Inflight(cmd, tracker, rule)
        if rule is not None and rule.fault == "stall":
            conn.hold = _OutBuf()
            conn.hold_rule = rule
            conn.hold_until = None if rule.seconds is None else time.monotonic() + rule.seconds
            self._event("fault", conn.index, f"stall: holding the response to {cmd!r}", rule=rule)
        if not tracker.expects_response:
            if rule is not None and rule.fault in ("drop_answer", "cut_result"):
                self._close(conn, f"fault {rule.fault}", reset=rule.reset, flush=True, flush_server=True)
                self._applied(conn, rule, f"{cmd!r} has no response: closed after forwarding it")
            return
        conn.inflight.append(item)

    # -- internals: server -> client ---------------------------------------------------------

    def _server_data(self, conn: _Conn, data: bytes) -> None:
        if conn.opaque:
            self._to_client(conn, data)
            return
        conn.from_server.feed(data)
        for seq, payload, raw in conn.from_server.frames():
            if conn.state == "handshake":
                self._server_handshake_frame(conn, seq, payload)
                self._to_client(conn, raw)
                if conn.opaque:
                    self._to_client(conn, bytes(conn.from_server.buf))
                    conn.from_server.buf.clear()
                    return
                continue
            if conn.state != "ready":
                return
            if not conn.inflight:
                if not conn.pkt_continues:
                    self._event("unsolicited", conn.index, _describe_packet(payload))
                self._to_client(conn, raw)
                self._packet_part(conn, payload)  # keep framing in step
                continue
            head = conn.inflight[0]
            head.received += len(raw)
            head.last_byte = time.monotonic()
            rule = head.rule
            if rule is not None and rule.fault == "drop_answer":
                pass  # discarded
            elif rule is not None and rule.fault == "cut_result":
                room = rule.at - head.relayed
                if len(raw) >= room:
                    self._to_client(conn, raw[:room])
                    head.relayed += room
                    self._close(conn, "fault cut_result", reset=rule.reset, flush=True)
                    self._applied(conn, rule, f"relayed {head.relayed} byte(s) of the response to {head.command!r}")
                    return
                self._to_client(conn, raw)
                head.relayed += len(raw)
            else:
                self._to_client(conn, raw)
            packet = self._packet_part(conn, payload)
            if packet is None:
                continue
            pkt_head, length = packet
            if head.tracker.packet(pkt_head, length):
                self._response_done(conn, head, None)
                if conn.state != "ready":
                    return

    def _packet_part(self, conn: _Conn, payload: bytes) -> tuple[bytes, int] | None:
        """Join frames into packets; (head, length) when one is complete."""
        if len(conn.pkt_head) < HEAD_KEEP:
            conn.pkt_head += payload[: HEAD_KEEP - len(conn.pkt_head)]
        conn.pkt_len += len(payload)
        if len(payload) == MAX_FRAME:
            conn.pkt_continues = True
            return None
        conn.pkt_continues = False
        out = bytes(conn.pkt_head), conn.pkt_len
        conn.pkt_head = bytearray()
        conn.pkt_len = 0
        return out

    def _response_done(self, conn: _Conn, item: _Inflight, how: str | None) -> None:
        if conn.inflight and conn.inflight[0] is item:
            conn.inflight.popleft()
        detail = item.tracker.summary() if how is None else f"ended by {how} ({item.received} bytes)"
        self._event("response", conn.index, detail, command=item.command)
        if item.command.code == 0x11 and conn.pending_user is not None:
            if item.tracker.error is None:
                conn.user = conn.pending_user
            conn.pending_user = None
        rule = item.rule
        if rule is None:
            return
        if rule.fault == "drop_answer":
            self._close(conn, "fault drop_answer", reset=rule.reset, flush=True)
            self._applied(conn, rule, f"server answered {item.command!r} ({detail}, {item.received} bytes): discarded, closed")
        elif rule.fault == "cut_result":
            self._close(conn, "fault cut_result", reset=rule.reset, flush=True)
            self._applied(
                conn, rule, f"response to {item.command!r} ended after {item.relayed} byte(s) (< at={rule.at}): relayed all, closed"
            )

    def _to_client(self, conn: _Conn, data: bytes) -> None:
        if conn.hold is not None:
            conn.hold.append(data)
        else:
            conn.to_client.append(data)

    def _server_handshake_frame(self, conn: _Conn, seq: int, payload: bytes) -> None:
        if not payload:
            return
        if not conn.greeting_seen:
            conn.greeting_seen = True
            if payload[0] == 0xFF:
                self._event("login_failed", conn.index, f"server refused: err {_err_code(payload)}")
                return
            self._parse_greeting(conn, payload)
            return
        first = payload[0]
        if first == 0x00:
            conn.state = "ready"
            self._event("login", conn.index, conn.user or "")
        elif first == 0xFF:
            self._event("login_failed", conn.index, f"err {_err_code(payload)}")

    def _parse_greeting(self, conn: _Conn, p: bytes) -> None:
        try:
            if p[0] != 10:
                return
            pos = p.index(b"\0", 1) + 1
            conn.server_thread_id = struct.unpack_from("<I", p, pos)[0]
            pos += 4 + 8 + 1
            caps = struct.unpack_from("<H", p, pos)[0]
            pos += 2
            if len(p) >= pos + 5:
                caps |= struct.unpack_from("<H", p, pos + 3)[0] << 16
                pos += 5 + 1  # charset, status, upper caps, auth data length
                if not caps & CLIENT_MYSQL and len(p) >= pos + 10:
                    caps |= struct.unpack_from("<I", p, pos + 6)[0] << 32
            conn.server_caps = caps
        except (ValueError, struct.error) as exc:
            raise ShimProtocolError(f"cannot parse the server greeting: {exc}") from exc

    def _server_closed(self, conn: _Conn) -> None:
        if conn.inflight:
            head = conn.inflight[0]
            if head.tracker.heuristic and head.received:
                self._response_done(conn, head, "server close")
        for item in list(conn.inflight):
            rule = item.rule
            if rule is not None and rule.fault in ("drop_answer", "cut_result"):
                self._applied(conn, rule, f"server closed before the response to {item.command!r} ended")
        if conn.hold is not None:
            self._end_stall(conn, "server closed")
        self._close(conn, "server closed", flush=True)

    # -- internals: stall and close ----------------------------------------------------------

    def _end_stall(self, conn: _Conn, why: str) -> None:
        hold, rule = conn.hold, conn.hold_rule
        conn.hold = conn.hold_rule = conn.hold_until = None
        if hold is None or rule is None:
            return
        if rule.then_close:
            self._close(conn, "fault stall then_close", reset=rule.reset, flush=True)
            self._applied(conn, rule, f"held {hold.size} byte(s), then closed ({why})")
        else:
            for chunk in hold.chunks:
                conn.to_client.append(chunk)
            self._applied(conn, rule, f"held {hold.size} byte(s), then relayed them ({why})")

    def _do_release(self) -> int:
        n = 0
        for conn in list(self._conns.values()):
            if conn.hold is not None:
                self._end_stall(conn, "release()")
                n += 1
                if conn.state != "closed":
                    self._update_interest(conn)
        return n

    def _open_listener(self) -> None:
        assert self._sel is not None and self.port is not None
        if self._listener is not None:
            return
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))
        listener.listen(128)
        listener.setblocking(False)
        self._listener = listener
        self._sel.register(listener, selectors.EVENT_READ, ("listener", None))

    def _do_crash(self, reset: bool) -> list[int]:
        if self._listener is not None:
            assert self._sel is not None
            self._sel.unregister(self._listener)
            self._listener.close()
            self._listener = None
            self._event("crash", -1, "listener closed")
        return self._do_close_where(lambda c: c.state != "closed", "crash", reset)

    def _do_close_where(self, pred: Callable[[_Conn], bool], why: str, reset: bool) -> list[int]:
        closed = []
        for conn in list(self._conns.values()):
            if conn.state in ("closed", "closing") or not pred(conn):
                continue
            self._event("fault", conn.index, f"{why}: closing")
            self._close(conn, why, reset=reset, flush=False)
            closed.append(conn.index)
        return closed

    def _close(self, conn: _Conn, reason: str, reset: bool = False, flush: bool = True, flush_server: bool = False) -> None:
        """Close the server side now and the client side once what is queued for it is written
        (``flush``; never longer than CLOSE_FLUSH_TIMEOUT)."""
        if conn.state == "closed":
            return
        conn.close_reset = reset
        if conn.server is not None:
            if flush_server and conn.to_server.size and conn.state != "connecting":
                try:
                    conn.server.setblocking(True)
                    conn.server.settimeout(1.0)
                    for chunk in conn.to_server.chunks:
                        conn.server.sendall(chunk)
                except OSError:
                    pass
            conn.to_server.clear()
            self._unregister(conn, conn.server)
            _close_socket(conn.server, reset)
            conn.server = None
        conn.inflight.clear()
        conn.hold = conn.hold_rule = conn.hold_until = None
        if flush and conn.to_client.size and conn.client is not None:
            if conn.state != "closing":
                conn.state = "closing"
                conn.close_deadline = time.monotonic() + CLOSE_FLUSH_TIMEOUT
                conn.close_reason = reason
                self._update_interest(conn)
            return
        self._finish_close(conn, reason)

    def _finish_close(self, conn: _Conn, reason: str | None) -> None:
        if reason is None:
            reason = conn.close_reason
        self._unregister(conn, conn.client)
        self._unregister(conn, conn.server)
        _close_socket(conn.client, conn.close_reset)
        _close_socket(conn.server, conn.close_reset)
        conn.client = conn.server = None
        conn.state = "closed"
        self._conns.pop(conn.index, None)
        self._event("close", conn.index, reason)


def _describe_packet(payload: bytes) -> str:
    if not payload:
        return "empty packet"
    if payload[0] == 0xFF:
        msg = payload[9:] if len(payload) > 9 and payload[3:4] == b"#" else payload[3:]
        return f"err {_err_code(payload)}: {msg[:200].decode('utf-8', errors='replace')}"
    return f"packet 0x{payload[0]:02x}, {len(payload)} bytes"
