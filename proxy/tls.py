"""TLS on both sides: the client's connection to the proxy (``[listen.tls]``) and the proxy's
connection to the backend (``[backend.tls]``, go-sql-driver/mysql's modes).

TLS is layered on the non-blocking channels of ``proxy.netio`` with ``ssl.MemoryBIO``: the
socket I/O stays the plain channel's (one recv / send syscall, parking in trio only on EAGAIN),
and an ``SSLObject`` encrypts and decrypts between the socket and the packet layer. A plain
``Channel`` is not touched by any of this: TLS connections are instances of the subclasses
below, made by ``start_tls`` once the MySQL handshake has agreed on it.

Bytes can sit in two places the socket does not show: decrypted in the SSL object
(``SSLObject.pending()``) and encrypted, not yet decrypted, in the incoming BIO. ``recv``
with ``wait_first`` and ``data_pending()`` look at both before trusting the socket.
"""

from __future__ import annotations

import functools
import re
import ssl
from typing import TYPE_CHECKING

import attrs
import trio

from proxy.config import Config, ConfigError
from proxy.netio import RECV_SIZE, Channel, PeerClosed, PeerFinished, StreamChannel

if TYPE_CHECKING:
    from proxy.config import BackendTLSConfig, ListenTLSConfig

__all__ = [
    "TLSError",
    "TLSChannel",
    "TLSStreamChannel",
    "BackendTLS",
    "start_tls",
    "server_context",
    "backend_tls",
    "check_files",
    "describe",
]

# Plaintext handed to the SSL object at once: bounds the encrypted copy in memory for big sends.
_SEND_CHUNK = 256 * 1024


class TLSError(PeerClosed):
    """A TLS failure: handshake refused, certificate not trusted, a bad record or an alert.
    A PeerClosed (the connection is unusable), told apart where it matters: a backend whose
    certificate does not verify is a configuration error, not something to retry."""

    def __init__(self, message: str, *, verify: bool = False) -> None:
        super().__init__(message)
        self.verify = verify


def _ssl_message(exc: ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {exc.verify_message or exc.reason}"
    text = str(exc.args[1]) if len(exc.args) > 1 else str(exc)
    return re.sub(r"\s*\(_ssl\.c:\d+\)$", "", text) or (exc.reason or type(exc).__name__)


class _TLSLayer:
    """TLS over the raw I/O of the channel class that follows it in the MRO (``super()``).
    Every plain-channel method is replaced; the plain class keeps its own, branch-free."""

    __slots__ = ()

    # set by the concrete classes' __init__
    tls: ssl.SSLObject
    _in: ssl.MemoryBIO
    _out: ssl.MemoryBIO
    _flushing: bool
    _flushed: trio.Event | None
    _ready: bool

    def try_send(self, data: bytes | bytearray | memoryview) -> int:
        return 0  # every byte goes through the TLS object, in send()

    async def handshake(self) -> None:
        tls = self.tls
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._flush()
                self._in.write(await super().recv(RECV_SIZE))  # type: ignore[misc]
            except ssl.SSLError as exc:
                await self._flush_quietly()  # the alert tells the peer why
                raise TLSError(
                    f"{self.name}: TLS handshake failed: {_ssl_message(exc)}",  # type: ignore[attr-defined]
                    verify=isinstance(exc, ssl.SSLCertVerificationError),
                ) from None
        await self._flush()
        self._ready = True

    async def recv(self, size: int = RECV_SIZE, wait_first: bool = False) -> bytes:
        tls = self.tls
        incoming = self._in
        if wait_first and not incoming.pending and not tls.pending():
            # Nothing buffered on this side of the socket: park first, like the plain channel.
            incoming.write(await super().recv(RECV_SIZE, True))  # type: ignore[misc]
        while True:
            try:
                data = tls.read(size)
            except ssl.SSLWantReadError:
                incoming.write(await super().recv(RECV_SIZE))  # type: ignore[misc]
                continue
            except ssl.SSLZeroReturnError:
                data = b""
            except ssl.SSLError as exc:
                raise TLSError(f"{self.name}: TLS error: {_ssl_message(exc)}") from None  # type: ignore[attr-defined]
            if not data:
                raise PeerFinished(f"{self.name}: connection closed by peer (TLS close_notify)")  # type: ignore[attr-defined]
            if incoming.pending and len(data) < size:
                # More whole records already arrived (one record is at most 16 KiB): hand them
                # over in one chunk, as one plain recv would.
                parts = [data]
                n = len(data)
                while n < size:
                    try:
                        more = tls.read(size - n)
                    except ssl.SSLError:
                        break  # a partial record (or a close / error: the next recv reports it)
                    if not more:
                        break
                    parts.append(more)
                    n += len(more)
                data = b"".join(parts)
            if self._out.pending:  # the read produced a protocol answer (a TLS 1.3 KeyUpdate)
                await self._flush()
            return data

    async def send(self, data: bytes | bytearray | memoryview) -> None:
        tls = self.tls
        try:
            if len(data) <= _SEND_CHUNK:
                if data:
                    tls.write(data)
                    await self._flush()
                return
            view = memoryview(data)
            for start in range(0, len(view), _SEND_CHUNK):
                tls.write(view[start : start + _SEND_CHUNK])
                await self._flush()
        except ssl.SSLError as exc:
            raise TLSError(f"{self.name}: TLS error: {_ssl_message(exc)}") from None  # type: ignore[attr-defined]

    async def _flush(self) -> None:
        """Send what the SSL object wrote to the outgoing BIO, in order: one task at a time
        (a read can produce bytes too, while another task is parked mid-send)."""
        out = self._out
        while self._flushing:
            if self._flushed is None:
                self._flushed = trio.Event()
            await self._flushed.wait()
        if not out.pending:
            return
        self._flushing = True
        try:
            while out.pending:
                await super().send(out.read())  # type: ignore[misc]
        finally:
            self._flushing = False
            if self._flushed is not None:
                self._flushed.set()
                self._flushed = None

    async def _flush_quietly(self) -> None:
        try:
            with trio.move_on_after(1):
                await self._flush()
        except PeerClosed:
            pass

    async def wait_data(self) -> None:
        # Decrypted or received bytes already waiting: no need to wait on the socket.
        if not (self.tls.pending() or self._in.pending):
            await super().wait_data()  # type: ignore[misc]

    def data_pending(self) -> bool:
        if self.decoder.buffered() or self.tls.pending() or self._in.pending:  # type: ignore[attr-defined]
            return True
        return super().data_pending()  # type: ignore[misc]

    def send_nowait(self, data: bytes) -> None:
        if self._flushing or not self._ready:
            return  # bytes of another send are on their way: do not cut into them
        try:
            self.tls.write(data)
        except (ssl.SSLError, ValueError):
            return
        super().send_nowait(self._out.read())  # type: ignore[misc]

    def close(self) -> None:
        if not self.closed and self._ready and not self._flushing:  # type: ignore[attr-defined]
            try:
                self.tls.unwrap()  # queues a close_notify, then wants the peer's: not waited for
            except (ssl.SSLError, ValueError, OSError):
                pass
            if self._out.pending:
                super().send_nowait(self._out.read())  # type: ignore[misc]
        super().close()  # type: ignore[misc]

    @property
    def tls_version(self) -> str | None:
        return self.tls.version()

    @property
    def tls_cipher(self) -> str | None:
        cipher = self.tls.cipher()
        return cipher[0] if cipher else None


class TLSChannel(_TLSLayer, Channel):
    """A socket Channel speaking TLS."""

    __slots__ = ("tls", "_in", "_out", "_flushing", "_flushed", "_ready")

    def __init__(self, plain: Channel, tls: ssl.SSLObject, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO) -> None:
        # The plain channel's socket as it is (non-blocking, TCP_NODELAY, keepalive).
        self.sock = plain.sock
        _take_over(self, plain, tls, incoming, outgoing)


class TLSStreamChannel(_TLSLayer, StreamChannel):
    """A StreamChannel (memory streams in component tests) speaking TLS with the same code."""

    __slots__ = ("tls", "_in", "_out", "_flushing", "_flushed", "_ready")

    def __init__(self, plain: StreamChannel, tls: ssl.SSLObject, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO) -> None:
        self.stream = plain.stream
        _take_over(self, plain, tls, incoming, outgoing)


def _take_over(channel, plain: Channel, tls: ssl.SSLObject, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO) -> None:
    """The plain channel's name and decoder (bytes already buffered stay), and a fresh TLS state."""
    channel.name = plain.name
    channel.decoder = plain.decoder
    channel._unyielded = plain._unyielded
    channel.tape = None  # a TLS session is never taken over by another process
    channel._watch = None  # nor carried by the fast lane (its records are not the socket's bytes)
    channel._peek = None
    channel.closed = False
    channel.tls, channel._in, channel._out = tls, incoming, outgoing
    channel._flushing = False
    channel._flushed = None
    channel._ready = False


async def start_tls(channel: Channel, context: ssl.SSLContext, *, server_side: bool, server_hostname: str | None = None) -> Channel:
    """Run the TLS handshake on ``channel`` and return the TLS channel to use from now on.

    ``channel`` is detached (marked closed without closing the connection, which the returned
    channel owns). Bytes the plain channel already read past the SSLRequest (a client that
    sent its ClientHello right behind it) are the start of the handshake. If the handshake
    fails or is cancelled, the connection is closed and TLSError / PeerClosed raised."""
    if isinstance(channel, _TLSLayer):
        raise TLSError(f"{channel.name}: TLS is already on")
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    leftover = channel.decoder.buffered()
    if leftover:
        incoming.write(channel.decoder.take_raw(leftover))
    try:
        tls = context.wrap_bio(incoming, outgoing, server_side=server_side, server_hostname=None if server_side else server_hostname)
    except (ssl.SSLError, ValueError) as exc:
        channel.close()
        raise TLSError(f"{channel.name}: cannot start TLS: {exc}") from None
    cls = TLSStreamChannel if isinstance(channel, StreamChannel) else TLSChannel
    secure = cls(channel, tls, incoming, outgoing)  # type: ignore[arg-type]
    channel.closed = True  # detached: ``secure`` owns the connection now
    try:
        await secure.handshake()
    except BaseException:
        secure.close()
        raise
    return secure


def describe(channel: Channel) -> str:
    """'TLSv1.3 TLS_AES_256_GCM_SHA384' for a TLS channel, 'plain' otherwise (for logs)."""
    if isinstance(channel, _TLSLayer):
        return f"{channel.tls_version} {channel.tls_cipher}"
    return "plain"


# ---------------------------------------------------------------------------- contexts


def _load_chain(ctx: ssl.SSLContext, cert: str, key: str | None, what: str) -> None:
    try:
        ctx.load_cert_chain(cert, key or None)
    except FileNotFoundError as exc:
        raise ValueError(f"{what}: cannot read {exc.filename or cert}: {exc.strerror}") from None
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(f"{what}: cannot load certificate {cert!r} / key {key!r}: {exc}") from None


@functools.cache
def server_context(cfg: ListenTLSConfig) -> ssl.SSLContext:
    """The proxy's server context for ``[listen.tls]`` (built once per config)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(ctx, cfg.cert, cfg.key, "cert/key")
    return ctx


@attrs.frozen
class BackendTLS:
    """What the backend login needs: the mode and the client context."""

    mode: str
    context: ssl.SSLContext = attrs.field(eq=False, repr=False)
    server_name: str | None = None

    @property
    def required(self) -> bool:
        return self.mode != "preferred"

    def hostname_for(self, host: str) -> str:
        return self.server_name or host


@functools.cache
def backend_tls(cfg: BackendTLSConfig) -> BackendTLS | None:
    """The client side for ``[backend.tls]``; None for mode "off" (built once per config).

    go-sql-driver/mysql's meanings: preferred = TLS when the server offers it, unverified;
    required = TLS or fail, unverified; verify-ca = the chain must lead to ``ca`` (or to the
    system's CAs without ``ca``); verify-identity = and the certificate must name the host
    (``server_name``, else the address's host: a name or an IP SAN)."""
    if cfg.mode == "off":
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cfg.mode in ("preferred", "required"):
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.check_hostname = cfg.mode == "verify-identity"
        if cfg.ca:
            try:
                ctx.load_verify_locations(cafile=cfg.ca)
            except FileNotFoundError as exc:
                raise ValueError(f"ca: cannot read {cfg.ca}: {exc.strerror}") from None
            except (ssl.SSLError, OSError) as exc:
                raise ValueError(f"ca: cannot load CA certificates from {cfg.ca!r}: {exc}") from None
        else:
            ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if cfg.cert:
        _load_chain(ctx, cfg.cert, cfg.key, "cert/key")
    return BackendTLS(cfg.mode, ctx, cfg.server_name)


def check_files(config: Config) -> None:
    """The certificate and key files of both sides load (``--check``, start-up, reload):
    ConfigError naming the section otherwise."""
    problems = []
    for path, check in (("$.listen.tls", lambda: config.listen.tls and server_context(config.listen.tls)),
                        ("$.backend.tls", lambda: backend_tls(config.backend.tls))):  # fmt: skip
        try:
            check()
        except ValueError as exc:
            problems.append(f"{path}: {exc}")
    if problems:
        raise ConfigError("\n".join(problems))
