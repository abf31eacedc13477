"""The listening side: accept clients, run one Session per connection, log its life."""

from __future__ import annotations

import functools
import logging
import socket

import trio

from proxy import corebuild, hostloop
from proxy.admission import Admission
from proxy.config import Config
from proxy.cycle.inflight import SessionClosed
from proxy.discovery import Discovery
from proxy.health import HealthChecker
from proxy.hooks import Hooks
from proxy.netio import Channel, PeerClosed
from proxy.protocol.framing import encode_packet
from proxy.protocol.packets import ProtocolError, make_err
from proxy.recovery.markers import MarkerTable
from proxy.recovery.relayside import RECOVERY
from proxy.recovery.tablekeys import KeyCache
from proxy.relay.session import Session
from proxy.target import Target
from proxy.worker_identity import SESSION_ID_BASE, SESSION_ID_SPAN, WorkerInfo

__all__ = ["serve", "Proxy"]

log = logging.getLogger("replay_proxy.frontend")


class Proxy:
    """A running proxy for one target: listeners plus the sessions they accepted."""

    def __init__(self, config: Config, hooks: Hooks | None = None, opener=None, worker: WorkerInfo | None = None) -> None:
        self.config = config
        markers, keys = MarkerTable(config.recovery.marker_table, config.name), KeyCache()
        self.target = Target(config, hooks, markers=markers, keys=keys) if opener is None else Target(config, hooks, opener, markers, keys)
        # Session ids double as the connection id of the greeting. Starting high keeps them apart
        # from the server's own connection ids, so a KILL can tell which one it was given.
        self.worker = self.target.worker = worker
        self._first_id = worker.first_session_id if worker is not None else SESSION_ID_BASE
        self._next_id = self._first_id
        self._ids_wrapped = False
        self.admission = Admission(config.listen)
        self.addresses: list[tuple[str, int]] = []
        self.listeners: list[trio.SocketListener] = []  # what serve() accepts on (an upgrade hands them over)
        self.listen_address = config.listen.address  # the address they are bound to (a reload cannot move it)
        self._accepting: trio.CancelScope | None = None
        self.mirror = None  # --workers N: the link to the supervisor that keeps the clients (proxy.handover.mirror)
        self.recovery = RECOVERY  # what each session's relay asks of recovery (recovery sits above the relay)
        self.stopping = False  # drain() began: a session cancelled from now on is ended on purpose
        self.discovery: Discovery | None = None  # the task that keeps the backend addresses (serve)

    async def drain(self) -> None:
        """Stop accepting; close each session when it is idle between transactions; after
        listen.drain_timeout close the rest."""
        self.stopping = True
        if self._accepting is not None:
            self._accepting.cancel()
        sessions = self.target.sessions
        log.info("target %s: draining %d session(s)", self.target.name, len(sessions))
        with trio.move_on_after(self.config.listen.drain_timeout):
            while sessions:
                for session in list(sessions):
                    if session.idle():
                        session.end("proxy shutting down")
                await trio.sleep(0.05)
        for session in list(sessions):
            session.end("proxy shut down (drain timeout)")

    def reload(self, config: Config, hooks: Hooks) -> None:
        """SIGHUP: the new config for everything that starts from now on."""
        self.config = config
        self.admission.listen = config.listen
        self.target.reload(config, hooks)
        if self.discovery is not None:
            self.discovery.wake()

    async def listen(self, sockets: list[socket.socket] | None = None) -> None:
        """Open the listening sockets serve() accepts on; ``sockets``: listening sockets handed
        over by the process this one replaces (``proxy.handover``), adopted instead of binding."""
        listen = self.listen_address = self.config.listen.address
        try:
            if sockets is not None:
                listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(sock)) for sock in sockets]
            elif self.worker is not None:  # several processes share the port
                listeners = [_reuse_port_listener(listen.host, listen.port)]
            else:
                listeners = await trio.open_tcp_listeners(listen.port, host=listen.host, backlog=1024)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen on {listen} (target {self.target.name}): {exc.strerror}") from None
        self.listeners = listeners

    async def serve(self, *, sockets: list[socket.socket] | None = None, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Accept clients until drain(), on the listeners of listen() (opened here if it was
        not called: ``sockets`` as listen's)."""
        if not self.listeners:
            await self.listen(sockets)
        listeners = self.listeners
        self.addresses = [lst.socket.getsockname()[:2] for lst in listeners]
        backend = self.config.backend
        if backend.discovery == "static":
            where = ", ".join(str(a) for a in backend.addresses)
        elif backend.discovery == "dns":
            where = (
                "the A/AAAA records of "
                + ", ".join(str(a) for a in backend.addresses)
                + f" (discovery dns, every {backend.discovery_interval:g}s)"
            )
        else:
            where = f"the tidb-servers registered in PD at {', '.join(backend.pd.urls() if backend.pd else [])} (discovery pd, every {backend.discovery_interval:g}s)"
        log.info("target %s: listening on %s, backend %s", self.target.name, ", ".join(f"{h}:{p}" for h, p in self.addresses), where)
        lanes = "uvloop's callbacks and trio's tasks" if hostloop.current() is not None else "trio's tasks alone"
        log.info("sessions run on %s; sans-IO core %s", lanes, corebuild.mode())
        async with trio.open_nursery() as nursery:
            self.target.nursery = nursery
            checker = HealthChecker(self.target)
            await nursery.start(checker.run)
            self.discovery = Discovery(self.target, checker)
            await nursery.start(self.discovery.run)
            with trio.CancelScope() as self._accepting:
                async with trio.open_nursery() as accepting:
                    for listener in listeners:
                        accepting.start_soon(self._accept_loop, listener, nursery)
                    task_status.started(self.addresses)
            for listener in listeners:
                await listener.aclose()

    async def _accept_loop(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        tsock = listener.socket
        while True:
            try:
                conn, addr = await tsock.accept()
            except OSError as exc:  # EMFILE and friends: back off instead of spinning
                log.error("accept failed: %s", exc)
                await trio.sleep(0.1)
                continue
            sock = socket.socket(conn.family, conn.type, conn.proto, fileno=conn.detach())
            nursery.start_soon(self._handle, sock, addr)

    async def _handle(self, sock: socket.socket, addr) -> None:
        client_address = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)
        await self.handle_client(Channel(sock, f"client {client_address}"), client_address)

    def _new_session_id(self) -> int:
        """The next id of this worker's range; once the range is used up it starts over,
        skipping the ids of sessions still open (an id must fit the greeting's 4 bytes)."""
        while True:
            session_id = self._next_id
            self._next_id += 1
            if session_id >= self._first_id + SESSION_ID_SPAN:
                self._next_id, self._ids_wrapped = self._first_id, True
                continue
            if not self._ids_wrapped or self.target.session_by_id(session_id) is None:
                return session_id

    async def handle_client(self, channel: Channel, client_address: str) -> None:
        """Run one client connection to its end (component tests call this with memory streams)."""
        session_id = self._new_session_id()
        target = self.target
        host = client_address.rsplit(":", 1)[0]
        refusal = self.admission.refusal(host)
        if refusal is not None:
            target.stats.logins_refused += 1
            await _refuse(channel, *refusal)
            log.warning(
                "refused client %s: %s",
                client_address,
                refusal[2],
                extra={"client": client_address, "target": target.name, "outcome": "refused", "code": refusal[0]},
            )
            return
        await self._run(Session(target, channel, client_address, session_id, self.recovery))

    def adopt(self, session: Session, old_pid: int, age: float, taken_over: bool = False) -> None:
        """A session an upgrade's old process handed over (``proxy.handover.sessions``), or, with
        ``taken_over``, one of a worker that died (``proxy.handover.takeover``): it runs here from
        its next command on."""
        self.ids_above(session.id)
        assert self.target.nursery is not None
        self.target.nursery.start_soon(functools.partial(self._run, session, moved_from=(old_pid, age), taken_over=taken_over))

    def next_session_id(self) -> int:
        return self._next_id

    def ids_above(self, session_id: int) -> None:
        """New sessions get ids above ``session_id`` (the old process of an upgrade gave it)."""
        self._next_id = max(self._next_id, session_id + 1)

    async def _login(self, session: Session) -> bool:
        host = session.parts.client_address.rsplit(":", 1)[0]
        self.admission.enter(host)
        try:
            opened = await session.handshake()
        finally:
            self.admission.leave(host)
        if not opened and session.login_refused:
            self.admission.failed_login(host)
            self.target.stats.logins_failed += 1
        return opened

    async def _run(self, session: Session, moved_from: tuple[int, float] | None = None, taken_over: bool = False) -> None:
        """A session from its login (or, ``moved_from`` (pid, age), its arrival from another
        process: the old one of an upgrade, or a worker that died) to its end, and the log lines
        of both. With --workers N, the supervisor keeps a copy of it meanwhile (``mirror``)."""
        target = self.target
        client_address = session.parts.client_address
        channel = session.client
        started = trio.current_time() - (moved_from[1] if moved_from else 0.0)
        opened = False
        try:
            opened = moved_from is not None or await self._login(session)
            if opened:
                target.sessions.add(session)
                target.stats.sessions_opened += 1
                if self.mirror is not None:
                    await self.mirror.opened(session)
                moved = ""
                if moved_from:
                    moved = (
                        f" (taken over from worker pid {moved_from[0]}, which died)"
                        if taken_over
                        else f" (moved from pid {moved_from[0]} by an upgrade)"
                    )
                session.log.info(
                    "open: user=%s client=%s backend=%s backend_conn=%d%s",
                    session.parts.info.user,
                    client_address,
                    session.parts.info.backend_address,
                    session.link.connection_id if session.link.backend else -1,
                    moved,
                    extra={"event": "session_moved_in" if moved_from else "session_opened"},
                )
                if target.hooks.session_opened:
                    await target.hooks.notify(target.hooks.session_opened, session.parts.info)
                await session.run()
        except SessionClosed as exc:
            session.closed_by(str(exc))
        except (PeerClosed, ProtocolError) as exc:
            session.closed_by(f"{type(exc).__name__}: {exc}")
            if not opened and not channel.decoder.buffered() and isinstance(exc, PeerClosed):
                session.closed_by("")  # a TCP probe (load balancer, kubelet) that never spoke
        except Exception as exc:  # a bug must cost one session, not the proxy
            session.closed_by(f"internal error: {type(exc).__name__}: {exc}")
            session.log.exception("internal error")
        except trio.Cancelled:
            # Cancelled without a drain: the worker unwinds from a bug in one of its own tasks.
            # A session the supervisor keeps is left to it, as after a SIGKILL: the worker
            # started in this one's place takes the client over.
            if session.record.kept and not self.stopping:
                session.record.left_behind()
                session.closed_by("left to the supervisor: this worker is going down")
            raise
        finally:
            session.close()
            with trio.CancelScope(shield=True):
                await session.record.closed(session)
            if session in target.sessions:
                target.sessions.discard(session)
                target.stats.session_closed(session.commands)
            if opened:
                session.log.info(
                    "closed: user=%s client=%s backend=%s duration=%.3fs commands=%d recoveries=%d reason=%s",
                    session.parts.info.user,
                    client_address,
                    session.parts.info.backend_address,
                    trio.current_time() - started,
                    session.commands,
                    session.recoveries,
                    session.close_reason,
                    extra={"event": "session_closed"},
                )
                if target.hooks.session_closed:
                    with trio.CancelScope(shield=True):
                        await target.hooks.notify(target.hooks.session_closed, session.parts.info)
            elif session.close_reason:
                session.log.info("not admitted: %s", session.close_reason, extra={"event": "not_admitted"})
            else:
                log.debug("client %s disconnected before logging in", client_address)


def _reuse_port_listener(host: str, port: int) -> trio.SocketListener:
    """A listening socket with SO_REUSEPORT: the kernel spreads connections over the workers."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(1024)
    return trio.SocketListener(trio.socket.from_stdlib_socket(sock))


async def _refuse(channel: Channel, code: int, sqlstate: str, message: str) -> None:
    try:
        with trio.move_on_after(1):
            await channel.send(encode_packet(make_err(code, sqlstate, message), 0)[0])
    except PeerClosed:
        pass
    channel.close()


async def serve(config: Config, hooks: Hooks | None = None, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    await Proxy(config, hooks).serve(task_status=task_status)
