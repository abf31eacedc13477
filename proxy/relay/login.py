"""Logging a client in: greeting, authentication against the proxy's users, the backend
login; and COM_CHANGE_USER, which does it all again inside a session."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from proxy.admission import MAX_LOGIN_PACKET
from proxy.backend import Backend, BackendError, Login, backoff_delays
from proxy.cycle.inflight import SessionClosed
from proxy.netio import PeerClosed
from proxy.protocol.auth import NATIVE, ServerAuth, new_scramble
from proxy.protocol.constants import PROXY_CAPABILITIES, Capabilities, Err
from proxy.protocol.packets import (
    HandshakeResponse,
    ServerHandshake,
    make_err,
    make_ok,
    make_server_handshake,
    parse_change_user,
    parse_handshake_response,
)
from proxy.session.intake import Command
from proxy.session.tracker import AUTOCOMMIT
from proxy.sessionlog import outcome
from proxy.target import BackendProfile
from proxy.tls import backend_tls, describe, server_context, start_tls

if TYPE_CHECKING:
    from proxy.relay.relay import Relay

__all__ = ["handshake", "change_user", "login_for"]


# What a server with --require-secure-transport answers a client that logs in in the clear.
SECURE_TRANSPORT_REQUIRED = (3159, "HY000")
_INSECURE_MESSAGE = "Connections using insecure transport are prohibited while --require_secure_transport=ON."


async def handshake(s: Relay) -> bool:
    """Authenticate the client and open its backend connection. False: session refused.

    The client's credentials are judged first, whatever the backend's state: a wrong password
    gets 1045 at once. Then the login waits for a backend that is down, as a request does, up
    to recovery.buffer_window (DM gives a new connection 30 s, GetBaseConn's context, so it
    gets its connection when the backend is back within that, and 1105 otherwise).
    listen.handshake_timeout bounds the client's part only."""
    config, target = s.parts.config, s.parts.target
    timeout = config.listen.handshake_timeout
    with trio.move_on_after(timeout) as scope:
        resp, user, seq = await _client_login(s)
    if scope.cancelled_caught:
        s.ends(f"no login within {timeout:g}s")
        return False
    if user is None:
        return False
    if len(target.sessions) >= config.listen.max_connections:
        await s.send_client(make_err(*Err.CON_COUNT, "Too many connections"), seq)
        s.ends(f"{len(target.sessions)} sessions open (listen.max_connections)")
        return False
    s.link.set_login(login_for(s, user, resp.database, resp.charset, resp.connect_attrs))
    started = trio.current_time()
    try:
        backend = await _connect_within_window(s)
    except BackendError as exc:
        await _send_backend_error(s, exc, seq, trio.current_time() - started)
        s.ends(f"backend login failed: {exc}")
        return False
    s.tracking.logged_in(user, resp.database, resp.charset, backend.status)
    s.link.replace(backend)
    s.link.ready()
    if s.parts.markers is not None:
        await target.markers.ensure(backend)  # markers are off for good if it fails (CommitMarkers.on)
    await s.send_client(make_ok(backend.status), seq)
    return True


# Offered in the greeting while the backend's own abilities are not known (it has not been
# reached since the proxy started): nothing that changes the layout of the packets relayed
# later (DEPRECATE_EOF and SESSION_TRACK do), so any MySQL-protocol backend serves the session.
_UNKNOWN_BACKEND_CAPABILITIES = PROXY_CAPABILITIES & ~(Capabilities.CLIENT_DEPRECATE_EOF | Capabilities.CLIENT_SESSION_TRACK)
_UTF8MB4_GENERAL_CI = 45
# How long the first greeting may wait to learn the backend's version and abilities.
_PROFILE_WAIT = 2.0


async def _greeting_profile(s: Relay) -> BackendProfile:
    """The backend's version and abilities for the greeting; while the backend cannot be
    reached, listen.server_version and abilities every backend has. The client is always
    greeted: an ERR in place of the greeting is what the mariadb client, which starts TLS by
    default, reports as "Received error packet before completion of TLS handshake"."""
    config = s.parts.config
    try:
        with trio.move_on_after(min(config.backend.connect_timeout, _PROFILE_WAIT)):
            return await s.parts.target.profile()
    except BackendError as exc:
        s.log.info("backend not reachable for the greeting (%s); greeting as %s", exc, config.listen.server_version)
    return BackendProfile(config.listen.server_version, int(_UNKNOWN_BACKEND_CAPABILITIES), _UTF8MB4_GENERAL_CI)


async def _client_login(s: Relay) -> tuple[HandshakeResponse | None, str | None, int]:
    """Greeting, handshake response, authentication: (response, user or None, next seq)."""
    client = s.client
    profile = await _greeting_profile(s)
    scramble = new_scramble()
    s.greeted(client, 0, scramble)
    offered = (PROXY_CAPABILITIES & profile.capabilities) | (
        Capabilities.CLIENT_PROTOCOL_41 | Capabilities.CLIENT_SECURE_CONNECTION | Capabilities.CLIENT_PLUGIN_AUTH
    )
    tls = s.parts.config.listen.tls
    if tls is not None:
        offered |= Capabilities.CLIENT_SSL
    greeting = ServerHandshake(profile.server_version, s.id, scramble, offered, profile.collation, int(AUTOCOMMIT), NATIVE)
    await s.send_client(make_server_handshake(greeting), 0)
    packet = await client.read_packet(MAX_LOGIN_PACKET)
    resp = parse_handshake_response(packet.payload)
    if resp.ssl_request:
        if tls is None or not resp.capabilities & Capabilities.CLIENT_SSL:
            await s.send_client(
                make_err(*Err.HANDSHAKE, "replay-proxy has no TLS configured ([listen.tls]); connect without TLS"),
                packet.seq + 1,
            )
            s.ends("client asked for TLS, none configured")
            return resp, None, 0
        try:  # the SSLRequest gets no answer: the client starts the TLS handshake right away
            client = await start_tls(client, server_context(tls), server_side=True)
            s.greeted(client, 0, scramble)
        except PeerClosed as exc:
            s.ends(f"TLS handshake with the client failed: {exc}")
            return resp, None, 0
        s.log.debug("client %s: %s", s.parts.client_address, describe(client))
        packet = await client.read_packet(MAX_LOGIN_PACKET)
        resp = parse_handshake_response(packet.payload)
        if resp.ssl_request:
            await s.send_client(make_err(*Err.HANDSHAKE, "Bad handshake: a second SSLRequest"), packet.seq + 1)
            s.ends("client sent a second SSLRequest")
            return resp, None, 0
    elif tls is not None and tls.require:
        await s.send_client(make_err(*SECURE_TRANSPORT_REQUIRED, _INSECURE_MESSAGE), packet.seq + 1)
        s.ends("client logged in without TLS (listen.tls.require)")
        s.log.warning(
            "client %s refused: no TLS (listen.tls.require)",
            s.parts.client_address,
            **outcome("login_refused", SECURE_TRANSPORT_REQUIRED[0]),
        )
        return resp, None, 0
    if resp.capabilities & Capabilities.CLIENT_COMPRESS:
        # Not offered, asked anyway (mysql-connector does): say so instead of a silent hang.
        await s.send_client(
            make_err(*Err.HANDSHAKE, "replay-proxy does not support the compressed protocol; connect without compression"),
            packet.seq + 1,
        )
        s.ends("client asked for compression")
        return resp, None, 0
    s.greeted(client, resp.capabilities & offered, scramble)
    s.tracking.set_multi_statements(bool(s.client_caps & Capabilities.CLIENT_MULTI_STATEMENTS))
    auth = ServerAuth(s.scramble, s.parts.target.passwords, _host(s))
    user, seq = await _authenticate(s, auth, auth.start(resp), packet.seq + 1)
    if user is None:
        s.refused(f"login refused for user {resp.username!r}")
        s.log.warning(
            "login refused for user %r from %s", resp.username, s.parts.client_address, **outcome("login_refused", Err.ACCESS_DENIED[0])
        )
    return resp, user, seq


def _host(s: Relay) -> str:
    return s.parts.client_address.rsplit(":", 1)[0]


def login_for(s: Relay, user: str, database: str | None, collation: int, connect_attrs: dict[str, str]) -> Login:
    cfg = s.parts.config.user(user)
    assert cfg is not None
    return Login(
        user=cfg.resolved_backend_user(),
        password=cfg.resolved_backend_password(),
        database=database,
        collation=collation,
        capabilities=s.client_caps,
        connect_attrs=connect_attrs,
        tls=backend_tls(s.parts.config.backend.tls),
    )


async def _authenticate(s: Relay, auth: ServerAuth, result, seq: int) -> tuple[str | None, int]:
    while True:
        for payload in result.packets:
            await s.send_client(payload, seq)
            seq += 1
        if result.done:
            break
        packet = await s.client.read_packet(MAX_LOGIN_PACKET)
        seq = packet.seq + 1
        result = auth.on_packet(packet.payload)
    if result.error is not None:
        await s.send_client(result.error, seq)
        return None, seq
    return result.user, seq


async def _send_backend_error(s: Relay, exc: BackendError, seq: int, waited: float) -> None:
    if exc.err is not None and not exc.retryable:
        payload = make_err(exc.err.code, exc.err.sqlstate, exc.err.message)
    elif exc.retryable:
        payload = make_err(*Err.BACKEND_UNAVAILABLE, f"Can't connect to backend through replay-proxy (tried for "
                           f"{waited:.0f}s, recovery.buffer_window): {exc}; connect again once the backend is up")  # fmt: skip
    else:
        payload = make_err(*Err.BACKEND_UNAVAILABLE, f"Can't connect to backend through replay-proxy: {exc}; "
                           "see the proxy's log and the backend's")  # fmt: skip
    await s.send_client(payload, seq)


async def _connect_within_window(s: Relay) -> Backend:
    """Log into the backend, retrying retryable failures for up to recovery.buffer_window."""
    rec = s.parts.config.recovery
    deadline = trio.current_time() + rec.buffer_window
    delays = backoff_delays(rec.backoff_initial, rec.backoff_max)
    while True:
        try:
            return await s.parts.target.connect(s.link.login)
        except BackendError as exc:
            if not exc.retryable or trio.current_time() + rec.backoff_initial >= deadline:
                raise
            await trio.sleep(min(next(delays), max(0.0, deadline - trio.current_time())))


async def change_user(s: Relay, cmd: Command) -> None:
    """COM_CHANGE_USER: authenticate the new user against the proxy's users, then give the
    session a fresh backend connection logged in as that user. While a recovery or a move
    replaces the connection, it waits, as a command does (a PING goes first), and gets the
    error the recovery gives instead, if any."""
    if not s.link.up and await s.run_internal(b"\x0e", cmd.seq_end) is None:
        return
    state = s.tracking.state
    change = parse_change_user(cmd.payload, s.client_caps)
    collation = change.charset or state.collation
    auth = ServerAuth(s.scramble, s.parts.target.passwords, _host(s))
    resp = HandshakeResponse(
        s.client_caps, 0, collation, change.username, change.auth_response, change.database, change.auth_plugin, change.connect_attrs
    )
    user, seq = await _authenticate(s, auth, auth.start(resp), cmd.seq_end + 1)
    if user is None:  # like MariaDB: the session goes on as the previous user
        s.log.warning("COM_CHANGE_USER to %r refused", change.username, **outcome("login_refused", Err.ACCESS_DENIED[0]))
        return
    s.link.begin_swap()
    s.link.set_login(login_for(s, user, change.database, collation, change.connect_attrs))
    started = trio.current_time()
    try:
        backend = await _connect_within_window(s)
    except BackendError as exc:
        await _send_backend_error(s, exc, seq, trio.current_time() - started)
        raise SessionClosed(f"backend login after COM_CHANGE_USER failed: {exc}") from None
    s.tracking.logged_in(user, change.database, collation, backend.status)
    s.link.replace(backend)
    s.link.ready()
    s.cycle.settle()
    await s.follow_state()  # the new user is the supervisor's before the client's
    await s.send_client(make_ok(backend.status), seq)
