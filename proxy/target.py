"""A target database: its config, backend addresses, and what the proxy learned about the server."""

from __future__ import annotations

import logging

import attrs
import trio

from proxy.backend import Backend, BackendError, Login, connect_backend, open_backend_socket, read_greeting
from proxy.config import Address, Config
from proxy.relay.markers import MarkerTable
from proxy.relay.proofs import KeyCache

__all__ = ["Target", "BackendProfile"]

log = logging.getLogger("replay_proxy.target")


@attrs.frozen
class BackendProfile:
    """What clients are shown in the proxy's greeting: the real server's version and abilities."""

    server_version: str
    capabilities: int
    collation: int


class Target:
    def __init__(self, config: Config, hooks=None, opener=open_backend_socket) -> None:
        from proxy.hooks import Hooks

        self.config = config
        self.opener = opener  # address -> Channel; component tests connect to fake servers
        self.name = config.name
        self.hooks = hooks if hooks is not None else Hooks([])
        self.passwords = {u.name: u.resolved_password() for u in config.users}
        self._profile: BackendProfile | None = None
        self._profile_lock = trio.Lock()
        self._preferred = 0  # index of the address that worked last
        self._max_packet: dict[Address, int] = {}  # @@max_allowed_packet per address
        self.markers = MarkerTable(config.recovery.marker_table, config.name)
        self.keys = KeyCache()  # safe mode's table keys
        self.sessions: set = set()

    def session_by_id(self, session_id: int):
        for session in self.sessions:
            if session.id == session_id:
                return session
        return None

    @property
    def addresses(self) -> list[Address]:
        return self.config.backend.addresses

    def _rotation(self) -> list[Address]:
        addrs = self.addresses
        return addrs[self._preferred :] + addrs[: self._preferred]

    async def profile(self) -> BackendProfile:
        """The backend's greeting, learned once (a connection opened, greeted and closed)."""
        if self._profile is not None:
            return self._profile
        async with self._profile_lock:
            if self._profile is None:
                errors = []
                for address in self._rotation():
                    try:
                        channel, hs = await read_greeting(address, self.config.backend.connect_timeout, self.opener)
                    except BackendError as exc:
                        errors.append(str(exc))
                        continue
                    channel.close()
                    self._remember(hs.server_version, hs.capabilities, hs.charset)
                    break
                else:
                    raise BackendError("; ".join(errors), retryable=True)
        assert self._profile is not None
        return self._profile

    def _remember(self, version: str, capabilities: int, collation: int) -> None:
        profile = BackendProfile(version, capabilities, collation)
        if self._profile is not None and self._profile != profile:
            log.info("target %s: backend now reports %s (was %s)", self.name, profile, self._profile)
        self._profile = profile

    async def connect(self, login: Login, fresh: bool = False) -> Backend:
        """One login attempt per address, starting with the last one that worked. The server's
        @@max_allowed_packet is asked once per address and again when ``fresh`` (a reconnect
        after a loss: the server may have restarted with another setting)."""
        errors: list[BackendError] = []
        for address in self._rotation():
            try:
                backend = await connect_backend(
                    address,
                    login,
                    connect_timeout=self.config.backend.connect_timeout,
                    io_timeout=self.config.backend.io_timeout,
                    opener=self.opener,
                    known_max_packet=None if fresh else self._max_packet.get(address),
                )
            except BackendError as exc:
                errors.append(exc)
                if not exc.retryable:
                    raise
                continue
            self._preferred = self.addresses.index(address)
            if backend.max_allowed_packet:
                self._max_packet[address] = backend.max_allowed_packet
            hs = backend.handshake
            self._remember(hs.server_version, hs.capabilities, hs.charset)
            return backend
        if len(errors) == 1:
            raise errors[0]
        raise BackendError("; ".join(str(e) for e in errors), retryable=True)
