"""A target database: its config, backend addresses, and what the proxy learned about the server."""

from __future__ import annotations

import logging

import attrs
import trio

from proxy.backend import Backend, BackendError, Login, connect_backend, open_backend_socket, read_greeting
from proxy.config import Address, Config
from proxy.health import AddressHealth
from proxy.stats import Stats
from proxy.tls import backend_tls

__all__ = ["Target", "BackendProfile"]

log = logging.getLogger("replay_proxy.target")


@attrs.frozen
class BackendProfile:
    """What clients are shown in the proxy's greeting: the real server's version and abilities."""

    server_version: str
    capabilities: int
    collation: int


def _rank(health: AddressHealth) -> int:
    """Where an address goes in the order new connections try: usable, suspect, then the rest."""
    return 2 if not health.usable else 1 if health.suspect else 0


class Target:
    """``markers`` and ``keys``: recovery's commit-marker table and safe mode's table keys, one
    per target, handed in by the frontend (recovery sits above the relay, which reads a target)."""

    def __init__(self, config: Config, hooks=None, opener=open_backend_socket, markers=None, keys=None) -> None:
        from proxy.hooks import Hooks

        self.config = config
        self.opener = opener  # address -> Channel; component tests connect to fake servers
        self.name = config.name
        self.hooks = hooks if hooks is not None else Hooks([])
        self.passwords = {u.name: u.resolved_password() for u in config.users}
        self._profile: BackendProfile | None = None
        self._profile_lock = trio.Lock()
        self._preferred = 0  # index of the address that worked last
        self.markers = markers  # recovery.markers.MarkerTable
        self.keys = keys  # recovery.tablekeys.KeyCache: safe mode's table keys
        self.sessions: set = set()  # logged-in sessions (relay.session.Session: stats.SessionFacts and more)
        self.health: dict[Address, AddressHealth] = {}
        # What /metrics and /status read, handed over explicitly (read at each scrape: a reload changes some).
        self.stats = Stats(self.name, chain=lambda: self.hooks, sessions=lambda: self.sessions, addresses=lambda: self.addresses,
                           health=self.health, ready=self.ready)  # fmt: skip
        self.nursery: trio.Nursery | None = None  # for background work (session moves); set by Proxy.serve
        self.worker = None  # workers.WorkerInfo when this process is one of several

    def spawn(self, fn, *args) -> None:
        """Run ``fn(*args)`` in the background (no-op when the proxy is not serving)."""
        if self.nursery is not None:
            self.nursery.start_soon(fn, *args)

    def health_of(self, address: Address) -> AddressHealth:
        health = self.health.get(address)
        if health is None:
            health = self.health[address] = AddressHealth(address, since=trio.current_time())
        return health

    def ready(self) -> bool:
        """Is any backend address usable (for /readyz)? Before the first check: not yet,
        unless checks are off."""
        if self.config.backend.health_interval <= 0:
            return True
        return any(self.health_of(a).state == "up" for a in self.addresses)

    def health_login(self) -> Login | None:
        """How the health check logs in: as the first configured user."""
        if not self.config.users:
            return None
        user = self.config.users[0]
        # Over TLS when sessions use it: a server that requires TLS refuses a plain check.
        return Login(user.resolved_backend_user(), user.resolved_backend_password(), None, 45, 0,
                     tls=backend_tls(self.config.backend.tls))  # fmt: skip

    def backend_unusable(self, address: Address, state: str) -> None:
        """An address started draining (or went down): its idle sessions move elsewhere now,
        the others when their transaction ends. With no other usable address there is nowhere
        to move to: a new connection would reach the same server (and a draining one closes
        it again moments later), so they stay, and recovery takes over when it closes them."""
        moving = [s for s in self.sessions if s.link.backend is not None and s.link.backend.address == address]
        if moving and not any(self.health_of(a).usable for a in self.addresses if a != address):
            log.warning("target %s: backend %s is %s, and no other address is usable: %d session(s) stay on it until "
                        "it closes them (recovery)", self.name, address, state, len(moving),
                        extra={"target": self.name, "backend": str(address)})  # fmt: skip
            return
        if moving:
            log.warning("target %s: backend %s is %s: moving %d session(s) between transactions", self.name, address, state, len(moving),
                        extra={"target": self.name, "backend": str(address)})  # fmt: skip
        for session in moving:
            session.request_move()

    def backend_unreachable(self, address: Address, since: float, why: str) -> None:
        """No health check of ``address`` got an answer since ``since`` (``backend.dead_after``
        ago or more): cut the connections its sessions opened before then. Each is then a loss
        like any other (recovery: a command in flight is judged, a transaction replayed only
        if its journal proves it, an idle session reconnects), instead of waiting on a dead
        socket. A connection opened since reached the server: it is not cut."""
        silent = trio.current_time() - since
        reason = f"backend {address} unreachable: no answer to any health check for {silent:.0f}s ({why})"
        cut = sum(session.cut_backend(address, since, reason) for session in list(self.sessions))
        if cut:
            log.warning("target %s: %s: cut %d session connection(s); recovery takes them over", self.name, reason, cut,
                        extra={"target": self.name, "backend": str(address)})  # fmt: skip

    def reload(self, config: Config, hooks) -> None:
        """SIGHUP: users, plugins, limits, recovery and backends apply to new sessions and new
        backend connections; sessions already open keep the settings they started with."""
        self.config = config
        self.hooks = hooks
        self.passwords = {u.name: u.resolved_password() for u in config.users}

    def session_by_id(self, session_id: int):
        for session in self.sessions:
            if session.id == session_id:
                return session
        return None

    @property
    def addresses(self) -> list[Address]:
        return self.config.backend.addresses

    def suspect(self, address: Address) -> None:
        """The server at ``address`` just dropped a session's connection, or refused a login:
        for a while new connections try the other addresses first (``AddressHealth.suspect``)."""
        if len(self.addresses) > 1:
            health = self.health_of(address)
            health.suspect_until = trio.current_time() + max(2.0, 2 * self.config.backend.health_interval)

    def _rotation(self) -> list[Address]:
        """Addresses to try, the last that worked first; suspect ones after those (a session's
        connection there just dropped), draining and down ones last (they are still tried when
        nothing else answers)."""
        addrs = self.addresses
        preferred = self._preferred if self._preferred < len(addrs) else 0
        order = addrs[preferred:] + addrs[:preferred]
        return sorted(order, key=lambda a: _rank(self.health_of(a)))  # stable: the last that worked stays first

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

    async def connect(self, login: Login) -> Backend:
        """One login attempt per address, starting with the last one that worked. While another
        address is left to try, a login gets ``connect_timeout``, not ``io_timeout``: a server
        shutting down may accept a connection and answer it only when it exits (measured on a
        TiDB cluster: seconds), and the next server is ready now."""
        errors: list[BackendError] = []
        rotation = self._rotation()
        backend_config = self.config.backend
        for i, address in enumerate(rotation):
            last = i == len(rotation) - 1
            try:
                backend = await connect_backend(
                    address,
                    login,
                    connect_timeout=backend_config.connect_timeout,
                    io_timeout=backend_config.io_timeout if last else min(backend_config.io_timeout, backend_config.connect_timeout),
                    opener=self.opener,
                )
            except BackendError as exc:
                errors.append(exc)
                if not exc.retryable:
                    raise
                self.suspect(address)
                log.info(
                    "target %s: backend %s refused a connection: %s",
                    self.name,
                    address,
                    exc,
                    extra={"target": self.name, "backend": str(address)},
                )
                continue
            self._preferred = self.addresses.index(address) if address in self.addresses else 0
            # It answered a login: a silence its health checks saw (a slow check on a loaded
            # machine) is over, and a new one counts from now (it may cut this connection).
            self.health_of(address).answered()
            hs = backend.handshake
            self._remember(hs.server_version, hs.capabilities, hs.charset)
            return backend
        if len(errors) == 1:
            raise errors[0]
        raise BackendError("; ".join(str(e) for e in errors), retryable=True)
