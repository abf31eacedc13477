"""Authentication exchanges, both sides, as sans-IO state machines.

``ServerAuth``: the proxy authenticates a client (mysql_native_password, and the
caching_sha2_password fast path, which works because the proxy knows the password).
``ClientAuth``: the proxy logs into the backend (mysql_native_password, caching_sha2_password
including full authentication with the server's RSA key, and auth switches between them).
"""

from __future__ import annotations

import hmac
import os

import attrs

from proxy.protocol import scramble as _scramble
from proxy.protocol.constants import Err
from proxy.protocol.packets import (
    AUTH_MORE_DATA,
    AUTH_SWITCH,
    ERR_HEADER,
    OK_HEADER,
    ErrPacket,
    HandshakeResponse,
    ProtocolError,
    make_auth_switch,
    make_err,
    parse_auth_switch,
    parse_err,
)

__all__ = ["NATIVE", "CACHING_SHA2", "new_scramble", "native_scramble", "ServerAuth", "ClientAuth", "AuthResult"]

NATIVE = "mysql_native_password"
CACHING_SHA2 = "caching_sha2_password"
SHA256 = "sha256_password"

FAST_AUTH_SUCCESS = b"\x01\x03"
_PERFORM_FULL_AUTH = 0x04
_REQUEST_PUBLIC_KEY = b"\x02"


def new_scramble() -> bytes:
    """20 random bytes without NUL or '$' (clients treat the scramble as a C string)."""
    out = bytearray()
    while len(out) < 20:
        out.extend(b for b in os.urandom(32) if b not in (0, ord("$")) and b < 0x80)
    return bytes(out[:20])


def native_scramble(password: str, scramble: bytes) -> bytes:
    return _scramble.native(password.encode("utf-8"), scramble[:20]) if password else b""


def sha2_scramble(password: str, scramble: bytes) -> bytes:
    return _scramble.caching_sha2(password.encode("utf-8"), scramble[:20]) if password else b""


@attrs.frozen
class AuthResult:
    """What the authenticating side decided: send ``packets`` (payloads, in order), then stop if ``done``."""

    packets: list[bytes]
    done: bool = False
    user: str | None = None  # set when authentication succeeded
    error: bytes | None = None  # ERR payload when it failed


class ServerAuth:
    """The proxy's side of a client login."""

    def __init__(self, scramble: bytes, passwords: dict[str, str], client_host: str) -> None:
        self.scramble = scramble
        self._passwords = passwords
        self._host = client_host
        self._user = ""
        self._sent_password = False
        self._switched = False

    def start(self, resp: HandshakeResponse) -> AuthResult:
        self._user = resp.username
        self._sent_password = bool(resp.auth_response)
        plugin = resp.auth_plugin or NATIVE
        if plugin == NATIVE:
            return self._verify(resp.auth_response, native_scramble)
        if plugin == CACHING_SHA2 and resp.auth_response:
            result = self._verify(resp.auth_response, sha2_scramble)
            if result.user is not None:  # a caching_sha2 client expects this marker before the OK
                return AuthResult([FAST_AUTH_SUCCESS], done=True, user=result.user)
            return result
        # Any other plugin (or caching_sha2 without a scramble, as libmysqlclient sends in
        # COM_CHANGE_USER): ask the client to answer our native scramble instead.
        self._switched = True
        return AuthResult([make_auth_switch(NATIVE, self.scramble)])

    def on_packet(self, payload: bytes) -> AuthResult:
        if not self._switched:
            raise ProtocolError("unexpected packet during authentication")
        self._switched = False
        self._sent_password = bool(payload)
        return self._verify(payload, native_scramble)

    def _verify(self, response: bytes, scramble_fn) -> AuthResult:
        password = self._passwords.get(self._user)
        expected = scramble_fn(password, self.scramble) if password is not None else os.urandom(20)
        if password is not None and hmac.compare_digest(expected, response):
            return AuthResult([], done=True, user=self._user)
        return AuthResult([], done=True, error=self.denied())

    def denied(self) -> bytes:
        using = "YES" if self._sent_password else "NO"
        return make_err(*Err.ACCESS_DENIED, f"Access denied for user '{self._user}'@'{self._host}' (using password: {using})")


class ClientAuth:
    """The proxy's side of a backend login."""

    def __init__(self, user: str, password: str, scramble: bytes, plugin: str) -> None:
        self.user = user
        self._password = password
        self.scramble = scramble
        self.plugin = plugin if plugin in (NATIVE, CACHING_SHA2, SHA256) else NATIVE
        self._awaiting_key = False

    def first_response(self) -> bytes:
        return self._scramble_for(self.plugin)

    def _scramble_for(self, plugin: str) -> bytes:
        if plugin == CACHING_SHA2:
            return sha2_scramble(self._password, self.scramble)
        if plugin == SHA256:
            # Without TLS, sha256_password needs the server's RSA key first.
            self._awaiting_key = True
            return b"\x01" if self._password else b""
        return native_scramble(self._password, self.scramble)

    def on_packet(self, payload: bytes) -> tuple[str, bytes | ErrPacket | None]:
        """Returns ("send", payload) | ("ok", None) | ("error", ErrPacket)."""
        if not payload:
            raise ProtocolError("empty packet during backend authentication")
        head = payload[0]
        if head == OK_HEADER:
            return "ok", None
        if head == ERR_HEADER:
            return "error", parse_err(payload)
        if head == AUTH_SWITCH:
            switch = parse_auth_switch(payload)
            if switch.plugin not in (NATIVE, CACHING_SHA2, SHA256):
                return "error", ErrPacket(Err.NOT_SUPPORTED_YET[0], "HY000", f"backend asked for unsupported auth plugin {switch.plugin!r}")
            self.plugin = switch.plugin
            self.scramble = switch.data[:20]
            return "send", self._scramble_for(switch.plugin)
        if head == AUTH_MORE_DATA:
            data = payload[1:]
            if self._awaiting_key:
                self._awaiting_key = False
                try:
                    encrypted = _scramble.rsa_encrypt(self._password.encode("utf-8"), self.scramble, data)
                except Exception as exc:  # not a PEM, not an RSA key, a key too small for OAEP...
                    raise ProtocolError(f"backend sent an unusable RSA public key: {type(exc).__name__}: {exc}") from None
                return "send", encrypted
            if self.plugin == CACHING_SHA2 and data[:1] == b"\x03":
                return "wait", None  # fast auth succeeded; the OK follows
            if self.plugin == CACHING_SHA2 and data[:1] == bytes([_PERFORM_FULL_AUTH]):
                self._awaiting_key = True
                return "send", _REQUEST_PUBLIC_KEY
        raise ProtocolError(f"unexpected packet 0x{head:02x} during backend authentication")
