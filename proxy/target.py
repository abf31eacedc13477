"""A target database: its config, backend addresses, and what the proxy learned about the server."""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any

import attrs
import trio

from proxy.backend import Backend, BackendError, Login, connect_backend, open_backend_socket, read_greeting
from proxy.config import Address, Config
from proxy.health import AddressHealth, status_url
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


def _rank(health: AddressHealth, balancing: bool = False) -> int:
    """Where an address goes in the order new connections try: usable, suspect, then the rest
    (draining, down). Balancing (servers found by discovery), one not checked yet comes after
    those that are up: a server registered in PD before it listens is not tried first."""
    return 3 if not health.usable else 2 if health.suspect else 1 if balancing and health.state == "unknown" else 0


@attrs.define
class Origin:
    """Where an address of the live set came from (``backend.discovery``), and since when."""

    source: str  # "static", "dns NAME:PORT", "pd"
    found_at: float  # unix time
    status_port: int | None = None  # the status port the server registered (pd)


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
        self._preferred: Address | None = None  # the address that worked last
        # The live set of backend addresses: backend.addresses with discovery = "static"; what
        # proxy.discovery found last otherwise (empty until its first lookup answers).
        self._addresses: list[Address] = []
        self.origins: dict[Address, Origin] = {}
        self._opened: dict[Address, weakref.WeakSet[Backend]] = {}  # connections connect() opened, by address
        self.markers = markers  # recovery.markers.MarkerTable
        self.keys = keys  # recovery.tablekeys.KeyCache: safe mode's table keys
        self.sessions: set = set()  # logged-in sessions (relay.session.Session: stats.SessionFacts and more)
        self.health: dict[Address, AddressHealth] = {}
        self._connecting: dict[Address, int] = {}  # logins under way, by address (balance by connections)
        # What /metrics and /status read, handed over explicitly (read at each scrape: a reload changes some).
        self.stats = Stats(self.name, chain=lambda: self.hooks, sessions=lambda: self.sessions, addresses=lambda: self.addresses,
                           health=self.health, ready=self.ready)  # fmt: skip
        self.nursery: trio.Nursery | None = None  # for background work (session moves); set by Proxy.serve
        self.worker = None  # workers.WorkerInfo when this process is one of several
        if config.backend.discovery == "static":
            self._set_static(config)

    def spawn(self, fn, *args) -> None:
        """Run ``fn(*args)`` in the background (no-op when the proxy is not serving)."""
        if self.nursery is not None:
            self.nursery.start_soon(fn, *args)

    # -- the live set of addresses ------------------------------------------------------------

    def _set_static(self, config: Config) -> None:
        self.update_addresses({a: "static" for a in config.backend.addresses}, "static", quiet=True)

    def update_addresses(self, servers: dict[Address, Any], source: str, quiet: bool = False) -> list[Address]:
        """The addresses are now ``servers`` (each with what found it: ``discovery.Found``, or
        a string). An address that appeared is checked (by the caller) and gets new sessions;
        one that disappeared gets none and is drained like a draining one: its sessions move
        between transactions. Returns the addresses that appeared."""
        old = self._addresses
        added = [a for a in servers if a not in self.origins]
        removed = [a for a in old if a not in servers]
        now = time.time()
        for address, found in servers.items():
            origin_source = getattr(found, "origin", found if isinstance(found, str) else source)
            port = getattr(found, "status_port", None)
            known = self.origins.get(address)
            if known is None:
                self.origins[address] = Origin(origin_source, now, port)
            else:
                known.source, known.status_port = origin_source, port
        self._addresses = list(servers)
        for address in removed:
            self.origins.pop(address, None)
            self.health.pop(address, None)
        if added or removed:
            self.stats.discovery_changed(len(added), len(removed))
        if quiet:
            return added
        names = ", ".join(str(a) for a in self._addresses)
        for address in added:
            log.warning("target %s: backend %s found (%s): %d address(es) now: %s", self.name, address,
                        self.origins[address].source, len(self._addresses), names,
                        extra={"target": self.name, "backend": str(address), "event": "backend_found"})  # fmt: skip
        for address in removed:
            log.warning("target %s: backend %s gone (%s): %d address(es) now: %s", self.name, address, source,
                        len(self._addresses), names or "none",
                        extra={"target": self.name, "backend": str(address), "event": "backend_gone"})  # fmt: skip
            self.backend_unusable(address, "gone")
        return added

    def status_url(self, address: Address) -> str | None:
        """The status URL the health check GETs for ``address``: configured (status_urls,
        status_port), else the status port the server registered in PD."""
        origin = self.origins.get(address)
        return status_url(self.config.backend, address, origin.status_port if origin is not None else None)

    def connections(self, address: Address) -> int:
        """This proxy's open backend connections to ``address`` (opened by ``connect``)."""
        opened = self._opened.get(address)
        return self._connecting.get(address, 0) + (sum(1 for b in opened if not b.channel.closed) if opened else 0)

    def health_of(self, address: Address) -> AddressHealth:
        """Its record (kept for the addresses of the live set; one that left gets a record of
        its own, which nothing keeps)."""
        health = self.health.get(address)
        if health is None:
            health = AddressHealth(address, since=trio.current_time())
            if address in self.origins:
                self.health[address] = health
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

    def backend_usable(self, address: Address) -> None:
        """``address`` is up (again, or for the first time: a server that joined)."""
        self.rebalance()

    def rebalance(self) -> None:
        """With ``backend.balance`` by connections: while one up address carries two sessions
        more than another, move sessions from the fullest to the emptiest between transactions
        (the idle ones first), so a server that joins (a scale out), or is back from a restart,
        gets its share of the sessions opened before. Called when an address comes up and
        after every round of health checks; nothing is done while moves are under way (a
        drain), the next round looks again."""
        if not self.config.backend.balancing:
            return
        up = [a for a in self._addresses if self.health_of(a).state == "up" and not self.health_of(a).suspect]
        if len(up) < 2:
            return
        on: dict[Address, list] = {a: [] for a in up}
        for session in self.sessions:
            if session.link.move_requested:
                return
            backend = session.link.backend
            if backend is not None and backend.address in on:
                on[backend.address].append(session)
        counts = {a: len(v) for a, v in on.items()}
        chosen: dict[Address, list] = {}
        while True:
            donor = max(up, key=lambda a: counts[a])
            receiver = min(up, key=lambda a: counts[a])
            if counts[donor] - counts[receiver] < 2:
                break
            counts[donor] -= 1
            counts[receiver] += 1
            candidates = on[donor]
            candidates.sort(key=lambda s: not s.idle())  # the idle ones first: they move at once
            chosen.setdefault(receiver, []).append(candidates.pop(0))
        for receiver, sessions in chosen.items():
            sources = ", ".join(sorted({str(s.link.backend.address) for s in sessions}))
            log.warning("target %s: balancing by connections: moving %d session(s) from %s to %s between transactions", self.name,
                        len(sessions), sources, receiver, extra={"target": self.name, "backend": str(receiver)})  # fmt: skip
            for session in sessions:
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
        if config.backend.discovery == "static":  # (dns, pd: the discovery's next lookup, with the new settings)
            self.update_addresses({a: "static" for a in config.backend.addresses}, "config reload")

    def session_by_id(self, session_id: int):
        for session in self.sessions:
            if session.id == session_id:
                return session
        return None

    @property
    def addresses(self) -> list[Address]:
        """The live set (``update_addresses``), in order."""
        return self._addresses

    def suspect(self, address: Address) -> None:
        """The server at ``address`` just dropped a session's connection, or refused a login:
        for a while new connections try the other addresses first (``AddressHealth.suspect``)."""
        if len(self.addresses) > 1:
            health = self.health_of(address)
            health.suspect_until = trio.current_time() + max(2.0, 2 * self.config.backend.health_interval)

    def _rotation(self, away_from: Address | None = None) -> list[Address]:
        """Addresses to try, the last that worked first; suspect ones after those (a session's
        connection there just dropped), draining and down ones last (they are still tried when
        nothing else answers). ``away_from`` (a move's old address) after the others as good."""
        addrs = self.addresses
        if self.config.backend.balancing:  # the fewest of this proxy's connections first
            return sorted(addrs, key=lambda a: (_rank(self.health_of(a), True), a == away_from, self.connections(a)))
        preferred = addrs.index(self._preferred) if self._preferred in addrs else 0
        order = addrs[preferred:] + addrs[:preferred]
        return sorted(order, key=lambda a: (_rank(self.health_of(a)), a == away_from))  # stable: the last that worked stays first

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

    async def connect(self, login: Login, away_from: Address | None = None) -> Backend:
        """One login attempt per address, starting with the last one that worked. While another
        address is left to try, a login gets ``connect_timeout``, not ``io_timeout``: a server
        shutting down may accept a connection and answer it only when it exits (measured on a
        TiDB cluster: seconds), and the next server is ready now. ``away_from``: a move's old
        address, tried after the others as good (a move balancing by connections went back to
        where it was when the counts changed meanwhile)."""
        errors: list[BackendError] = []
        rotation = self._rotation(away_from)
        backend_config = self.config.backend
        if not rotation:
            raise BackendError(f"no backend address known yet: discovery ({backend_config.discovery}) has found none so far",
                               retryable=True)  # fmt: skip
        for i, address in enumerate(rotation):
            last = i == len(rotation) - 1
            self._connecting[address] = self._connecting.get(address, 0) + 1
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
            finally:
                left = self._connecting.get(address, 1) - 1
                if left > 0:
                    self._connecting[address] = left
                else:
                    self._connecting.pop(address, None)
            self._preferred = address
            self._opened.setdefault(address, weakref.WeakSet()).add(backend)
            # It answered a login: a silence its health checks saw (a slow check on a loaded
            # machine) is over, and a new one counts from now (it may cut this connection).
            self.health_of(address).answered()
            hs = backend.handshake
            self._remember(hs.server_version, hs.capabilities, hs.charset)
            return backend
        if len(errors) == 1:
            raise errors[0]
        raise BackendError("; ".join(str(e) for e in errors), retryable=True)
