"""Backend connections: connect, log in, and the proxy's own small exchanges with the server."""

from __future__ import annotations

import logging
import math
import socket
import struct

import attrs
import trio

from proxy.config import Address
from proxy.netio import Channel, PeerClosed, open_tcp
from proxy.protocol.auth import ClientAuth
from proxy.protocol.constants import REQUIRED_BACKEND_CAPABILITIES, Capabilities
from proxy.protocol.framing import encode_packet
from proxy.protocol.packets import (
    ERR_HEADER,
    ErrPacket,
    HandshakeResponse,
    ProtocolError,
    Reader,
    ServerHandshake,
    make_handshake_response,
    parse_err,
    parse_ok,
    parse_server_handshake,
)
from proxy.protocol.response import Expect, ResponseTracker
from proxy.protocol.resultset import Column, decode_text_row
from proxy.sqltext.redact import redact
from proxy.tls import BackendTLS, TLSError, describe, start_tls

__all__ = ["Backend", "BackendError", "Instance", "Login", "connect_backend", "restarted_since", "kill_own", "RETRYABLE_LOGIN_ERRORS"]

log = logging.getLogger("replay_proxy.backend")

# Login errors that mean "try again shortly": too many connections (1040, 1203), shutdown in
# progress (1053), connection killed (1927), TiDB's PD / TiKV not reachable yet (9001, 9002).
RETRYABLE_LOGIN_ERRORS = frozenset({1040, 1053, 1203, 1927, 9001, 9002})

MAX_PACKET = 1 << 30  # what the proxy announces as its own receive limit to the backend


class BackendError(Exception):
    """Could not get a working backend connection."""

    def __init__(self, message: str, *, retryable: bool, err: ErrPacket | None = None, silent: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.err = err
        # No answer at all within the timeout (no SYN-ACK, no greeting, a login that stalls):
        # what a partition or a hung server looks like. A refusal or an ERR is an answer.
        self.silent = silent


@attrs.frozen
class Login:
    user: str
    password: str = attrs.field(repr=False)
    database: str | None
    collation: int
    capabilities: int  # what the client negotiated with the proxy
    connect_attrs: dict[str, str] = attrs.Factory(dict)
    tls: BackendTLS | None = None  # [backend.tls]; None: plain


@attrs.frozen
class Instance:
    """Which server process a connection reached: behind one address (a load balancer, a
    restart) there may be several. ``started``: the server's start, in Unix seconds."""

    hostname: str
    port: int
    started: float
    kills: int | None = None  # the server's KILL statements so far (Com_kill), when known
    own_kills: int = 0  # how many of them this process had sent (``kill_own``)

    def operator_kills_since(self, kills_now: int) -> int:
        """KILLs the server ran since this snapshot that did not come from this process's
        recoveries (which KILL the old connections of other sessions)."""
        assert self.kills is not None
        return (kills_now - self.kills) - (_own_kills.get((self.hostname, self.port), 0) - self.own_kills)

    def same_as(self, other: Instance) -> bool:
        # Start times come from whole seconds (UNIX_TIMESTAMP() - Uptime): off by one at most.
        return (self.hostname, self.port) == (other.hostname, other.port) and abs(self.started - other.started) <= 1


@attrs.define(eq=False)
class Backend:
    channel: Channel
    address: Address
    handshake: ServerHandshake
    capabilities: int  # negotiated between proxy and server
    status: int
    connected_at: float
    max_allowed_packet: int | None = None
    instance: Instance | None = None  # None: the server would not say
    wait_timeout: float | None = None  # the server closes the session after this long idle

    @property
    def connection_id(self) -> int:
        return self.handshake.connection_id

    @property
    def deprecate_eof(self) -> bool:
        return bool(self.capabilities & Capabilities.CLIENT_DEPRECATE_EOF)

    def close(self) -> None:
        self.channel.close()

    async def exchange(self, frames: bytes, expect: Expect, fingerprint: bool = False) -> ResponseTracker:
        """Send one framed command and read its whole response without forwarding it anywhere."""
        tracker = ResponseTracker(expect, self.deprecate_eof, fingerprint)
        await self.channel.send(frames)
        if tracker.done:
            return tracker
        while True:
            data = await self.channel.recv()
            end = tracker.feed(data)
            if end >= 0:
                if end != len(data):
                    raise ProtocolError(f"{len(data) - end} unexpected bytes after a response from {self.address}")
                return tracker

    async def query(self, sql: str, columns: list[Column] | None = None) -> list[list[bytes | None]]:
        """Run a statement of the proxy's own; returns text rows (empty for OK), and appends the
        columns' types to ``columns`` if given. Raises BackendError on ERR."""
        await self.channel.send(encode_packet(b"\x03" + sql.encode("utf-8"), 0)[0])
        first = (await self.channel.read_packet()).payload
        if not first:
            raise ProtocolError(f"{self.address}: an empty packet in answer to {redact(sql)[:80]!r}")
        if first[0] == ERR_HEADER:
            err = parse_err(first)
            raise BackendError(f"{self.address}: {redact(sql)[:80]!r} failed: {err}", retryable=False, err=err)
        if first[0] == 0x00:
            ok = parse_ok(first, self.capabilities)
            self.status = ok.status
            return []
        ncols = Reader(first).lenenc()
        for _ in range(ncols):
            coldef = (await self.channel.read_packet()).payload
            if columns is not None:
                columns.append(Column.parse(coldef))
        if not self.deprecate_eof:
            await self.channel.read_packet()
        rows = []
        while True:
            payload = (await self.channel.read_packet()).payload
            if not payload:
                raise ProtocolError(f"{self.address}: an empty row in answer to {redact(sql)[:80]!r}")
            if payload[0] == ERR_HEADER:
                err = parse_err(payload)
                raise BackendError(f"{self.address}: {redact(sql)[:80]!r} failed: {err}", retryable=False, err=err)
            if payload[0] == 0xFE and len(payload) < 0xFFFFFF:
                return rows
            rows.append(decode_text_row(payload, ncols))


def _set_keepalive(sock: socket.socket) -> None:
    """Notice a silently dead server (network loss, frozen host) in ~25 s instead of hours:
    keepalive probes while nothing is unacknowledged, TCP_USER_TIMEOUT while something is."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 5)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 30_000)  # ms
    except (OSError, AttributeError):
        pass


async def open_backend_socket(address: Address) -> Channel:
    channel = await open_tcp(address.host, address.port, f"backend {address}")
    _set_keepalive(channel.sock)
    return channel


async def read_greeting(address: Address, connect_timeout: float, opener=open_backend_socket) -> tuple[Channel, ServerHandshake]:
    """Connect (``opener`` makes the Channel; tests pass one over memory streams) and read the
    server's greeting."""
    try:
        with trio.fail_after(connect_timeout):
            channel = await opener(address)
            try:
                packet = await channel.read_packet()
                if packet.payload[:1] == bytes([ERR_HEADER]):
                    err = parse_err(packet.payload)
                    raise BackendError(
                        f"backend {address} refused the connection: {err}",
                        retryable=err.code in RETRYABLE_LOGIN_ERRORS,
                        err=err,
                    )
                return channel, parse_server_handshake(packet.payload)
            except BaseException:
                channel.close()
                raise
    except trio.TooSlowError:
        raise BackendError(f"backend {address}: no greeting within {connect_timeout:g}s", retryable=True, silent=True) from None
    except (OSError, PeerClosed) as exc:
        raise BackendError(f"backend {address}: {getattr(exc, 'strerror', None) or exc}", retryable=True) from None
    except ProtocolError as exc:
        raise BackendError(f"backend {address}: bad greeting: {exc}", retryable=True) from None


async def connect_backend(
    address: Address,
    login: Login,
    *,
    connect_timeout: float,
    io_timeout: float,
    opener=open_backend_socket,
) -> Backend:
    """Open and authenticate a backend connection, and learn about the server (``_learn_server``)."""
    channel, hs = await read_greeting(address, connect_timeout, opener)
    try:
        with trio.fail_after(io_timeout):
            secure = False
            if login.tls is not None:  # from here on ``channel`` is the TLS one (closed below on failure)
                channel, secure = await _start_tls(channel, hs, address, login, login.tls)
            return await _login(channel, hs, address, login, secure)
    except trio.TooSlowError:
        channel.close()
        raise BackendError(f"backend {address}: login took longer than {io_timeout:g}s", retryable=True, silent=True) from None
    except TLSError as exc:  # an alert after the handshake (TLS 1.3: a client certificate refused)
        channel.close()
        raise BackendError(f"backend {address}: TLS error during login: {exc}", retryable=False) from None
    except (PeerClosed, OSError) as exc:
        channel.close()
        raise BackendError(f"backend {address}: connection lost during login: {exc}", retryable=True) from None
    except ProtocolError as exc:
        channel.close()
        raise BackendError(f"backend {address}: protocol error during login: {exc}", retryable=False) from None
    except BaseException:
        channel.close()
        raise


def _client_caps(hs: ServerHandshake, address: Address, login: Login, secure: bool) -> int:
    """The capabilities of the proxy's handshake response (and of its SSLRequest)."""
    missing = REQUIRED_BACKEND_CAPABILITIES & ~hs.capabilities
    if missing:
        raise BackendError(f"backend {address} lacks capabilities {Capabilities(missing)!r}", retryable=False)
    caps = (login.capabilities & hs.capabilities) | REQUIRED_BACKEND_CAPABILITIES
    caps |= Capabilities.CLIENT_PLUGIN_AUTH & hs.capabilities
    caps &= ~(Capabilities.CLIENT_SSL | Capabilities.CLIENT_COMPRESS | Capabilities.CLIENT_LOCAL_FILES)
    if secure:
        caps |= Capabilities.CLIENT_SSL
    if login.database:
        caps |= Capabilities.CLIENT_CONNECT_WITH_DB
    else:
        caps &= ~Capabilities.CLIENT_CONNECT_WITH_DB
    if hs.capabilities & Capabilities.CLIENT_CONNECT_ATTRS:
        caps |= Capabilities.CLIENT_CONNECT_ATTRS
    return caps


async def _start_tls(channel: Channel, hs: ServerHandshake, address: Address, login: Login, tls: BackendTLS) -> tuple[Channel, bool]:
    """SSLRequest, then the TLS handshake: (the channel to log in on, whether it is TLS).
    A server that does not offer TLS is logged into in the clear only in mode "preferred"."""
    if not hs.capabilities & Capabilities.CLIENT_SSL:
        if tls.required:
            raise BackendError(f"backend {address} does not offer TLS (backend.tls.mode = {tls.mode!r} requires it)", retryable=False)
        return channel, False
    caps = _client_caps(hs, address, login, True)
    ssl_request = struct.pack("<IIB", caps, MAX_PACKET, login.collation & 0xFF) + bytes(23)
    await channel.send(encode_packet(ssl_request, 1)[0])
    try:
        secure = await start_tls(channel, tls.context, server_side=False, server_hostname=tls.hostname_for(address.host))
    except TLSError as exc:
        # An untrusted certificate, a name mismatch, no common protocol: configuration, not
        # something a retry fixes. (A connection lost meanwhile is a PeerClosed: retried.)
        raise BackendError(f"backend {address}: TLS (backend.tls.mode = {tls.mode!r}) failed: {exc}", retryable=False) from None
    log.debug("backend %s: %s", address, describe(secure))
    return secure, True


async def _login(channel: Channel, hs: ServerHandshake, address: Address, login: Login, secure: bool = False) -> Backend:
    caps = _client_caps(hs, address, login, secure)
    auth = ClientAuth(login.user, login.password, hs.scramble, hs.auth_plugin)
    attrs_ = dict(login.connect_attrs)
    attrs_["_proxy"] = "replay-proxy"
    response = HandshakeResponse(
        capabilities=caps,
        max_packet=MAX_PACKET,
        charset=login.collation & 0xFF,
        username=login.user,
        auth_response=auth.first_response(),
        database=login.database,
        auth_plugin=auth.plugin,
        connect_attrs=attrs_,
    )
    seq = 2 if secure else 1  # after an SSLRequest (seq 1)
    await channel.send(encode_packet(make_handshake_response(response), seq)[0])
    while True:
        packet = await channel.read_packet()
        action, value = auth.on_packet(packet.payload)
        if action == "ok":
            ok = parse_ok(packet.payload, caps)
            break
        if action == "error":
            assert isinstance(value, ErrPacket)
            raise BackendError(
                f"backend {address} refused login for user {login.user!r}: {value}",
                retryable=value.code in RETRYABLE_LOGIN_ERRORS,
                err=value,
            )
        if action == "send":
            assert isinstance(value, bytes)
            await channel.send(encode_packet(value, packet.seq + 1)[0])
    backend = Backend(channel, address, hs, caps, ok.status, trio.current_time())
    await _learn_server(backend)
    return backend


async def _learn_server(backend: Backend) -> None:
    """@@max_allowed_packet, @@wait_timeout and which server instance this is (two short
    queries per connection: recovery compares instances to tell a restart, another server
    behind the same address, and an operator's KILL apart)."""
    try:
        rows = await backend.query("SELECT @@max_allowed_packet, @@wait_timeout, @@hostname, @@port, UNIX_TIMESTAMP()")
    except BackendError:  # a server without some of these: the essential part alone
        rows = await backend.query("SELECT @@max_allowed_packet")
    row = rows[0] if rows else []
    if row and row[0] is not None:
        try:
            backend.max_allowed_packet = int(row[0])
        except ValueError:
            raise BackendError(f"{backend.address}: @@max_allowed_packet is {row[0][:40]!r}, not a number", retryable=False) from None
    if len(row) != 5:
        return
    try:
        _max, wait_timeout, hostname, port, now = row
        backend.wait_timeout = float(wait_timeout) if wait_timeout is not None else None
        status = await server_status(backend)
        started = float(now) - float(status["uptime"])
        kills = int(status["com_kill"]) if "com_kill" in status else None
        host = (hostname or b"").decode("utf-8", "replace")
        backend.instance = Instance(host, int(port or 0), started, kills, _own_kills.get((host, int(port or 0)), 0))
    except (BackendError, ValueError, IndexError, TypeError, KeyError):
        backend.instance = None  # recovery then cannot tell instances apart, and says so


# The proxy's own KILLs (of a lost session's old connection), per server (hostname, port), in
# this process: an operator's KILL is told apart by Com_kill rising by more than these.
_own_kills: dict[tuple[str, int], int] = {}


async def kill_own(backend: Backend, connection_id: int) -> None:
    """KILL a connection the proxy itself left behind. Raises BackendError (unknown thread)."""
    instance = backend.instance
    if instance is not None:
        key = (instance.hostname, instance.port)
        _own_kills[key] = _own_kills.get(key, 0) + 1
    await backend.query(f"KILL {int(connection_id)}")


async def server_status(backend: Backend) -> dict[str, bytes]:
    """Uptime and, where the server counts them, KILL statements (Com_kill), lower-cased names."""
    try:
        rows = await backend.query("SHOW GLOBAL STATUS WHERE Variable_name IN ('Uptime', 'Com_kill')")
    except BackendError:  # no WHERE on SHOW STATUS here: the uptime alone
        rows = await backend.query("SHOW GLOBAL STATUS LIKE 'Uptime'")
    return {row[0].decode().lower(): row[1] for row in rows if row[0] is not None and row[1] is not None}


async def restarted_since(backend: Backend, old: Backend) -> bool | None:
    """Has the server behind ``old`` restarted (``backend`` is a newer connection)? True: a
    new process at the same host and port; False: the same process; None: the proxy cannot
    tell (another server behind the address, or no identity)."""
    if backend.instance is not None and old.instance is not None:
        if backend.instance.same_as(old.instance) and backend.connection_id > old.connection_id:
            return False  # the same start time, and connection ids still counting up
        if (backend.instance.hostname, backend.instance.port) == (old.instance.hostname, old.instance.port):
            return True
        return None
    if backend.address != old.address:
        return None
    try:
        rows = await backend.query("SHOW GLOBAL STATUS LIKE 'Uptime'")
        uptime = float(rows[0][1])
    except (BackendError, ValueError, IndexError, TypeError):
        return None
    age = trio.current_time() - old.connected_at
    if uptime < age - 2:
        return True
    if uptime > age + 2:
        return False
    return None


def backoff_delays(initial: float, maximum: float):
    """initial, 2*initial, ... capped at maximum, forever."""
    delay = initial
    while True:
        yield delay
        delay = min(maximum, delay * 2) if not math.isinf(delay) else maximum
