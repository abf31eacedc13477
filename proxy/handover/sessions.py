"""Live sessions moved to the new process of an upgrade, each with its two connections.

After the listeners (``upgrade``), the old process hands over every session that reaches a
command boundary in time: its client connection and its backend connection (the descriptors,
over the same channel, SCM_RIGHTS) and what the proxy knows of it (the tracker's session
state, its prepared statements, the login, the backend connection's greeting and server
instance, the commit-marker slot). The backend connection itself moves, so the server keeps the session as it was --
temporary tables, session variables, LAST_INSERT_ID() -- and never notices.

A session moves when its client task is about to wait for the next command, or is waiting
for it with nothing of it read yet (``Channel.between_commands``), with no command in flight,
no long data held, no XA or undecided ERR, no TLS on either side (Python cannot pass a TLS
state) and its backend connection up. One in a transaction moves in it: the server's
transaction lives on the connection, which moves; its journal goes along (``Transaction.export``),
so a loss later in the new process is recovered from it as in the old. The old process interrupts that wait
(``Channel.interrupt_wait``) of an idle one; the client task then stops the backend task (so that no byte of
the connection is read in the old process once the new one may use it), sends the session, and
waits for the answer. Adopted: the old process closes its descriptors without a word (no
COM_QUIT, no FIN: the new process holds the connections). Refused: the session goes on here
and is drained later, as on SIGTERM.

The conversation, after the listeners' ``handed_over`` (``upgrade``):

    old -> new   session   {"format", "id", ...} + [client socket, backend socket]
    new -> old   adopted   {"id"}  or  refused {"id", "reason"}
    old -> new   done      {"moved", "left"}   (then the channel closes)
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import cattrs
import trio

from proxy.backend import Backend, Instance
from proxy.config import Address
from proxy.cycle.inflight import SessionClosed
from proxy.handover.fdpass import HandoverChannel
from proxy.handover.movable import why_not_movable
from proxy.handover.protocol import HandoverError, Message
from proxy.netio import Channel
from proxy.protocol.packets import ServerHandshake
from proxy.relay.link import LinkState
from proxy.session.state import SessionState
from proxy.session.tracker import Orphaned
from proxy.sqltext import ServerReading

if TYPE_CHECKING:
    from proxy.config import Config
    from proxy.relay.parts import Recovery
    from proxy.relay.session import Session
    from proxy.target import Target


class Proxy(Protocol):
    """What the hand-over takes of the running proxy (``proxy.frontend.Proxy``, which sits
    above it: its import would go upwards)."""

    config: Config
    target: Target
    recovery: Recovery

    def adopt(self, session: Session, old_pid: int, age: float, taken_over: bool = False) -> None: ...


__all__ = ["FORMAT", "SessionMover", "adopt_sessions", "move_sessions", "take_over", "session_fields", "thaw_session", "thaw_backend"]

log = logging.getLogger("replay_proxy.handover")

# Of a session message; a new process refuses another. 2: the open transaction moves too; 3: a
# session the server closed for idling moves without a backend connection ("backend": null).
FORMAT = 3
ANSWER_TIMEOUT = 10.0  # the new process builds a session from a message: milliseconds
POLL = 0.02  # how often the old process looks for sessions at a boundary


def session_fields(s: Session, backend: Backend | None, transaction: bool = True) -> dict[str, Any]:
    """What another process needs to run the session on (on ``backend``, or without one), as
    JSON; ``transaction``: with the open transaction's journal (an upgrade moves it; the
    supervisor's copy for a crash has none: ``proxy.handover.mirror``)."""
    assert s.tracking.state is not None and s.link.login is not None
    now = trio.current_time()
    markers = s.parts.markers
    return {
        "format": FORMAT,
        "id": s.id,
        "client_address": s.parts.client_address,
        "age": now - s.parts.info.opened_at,
        "commands": s.cycle.commands,
        "settled": s.cycle.settled,
        "client_caps": s.client_caps,
        "deprecate_eof": s.deprecate_eof,
        "scramble": s.scramble.hex(),
        "autocommit": s.tracking.autocommit,
        "reading": cattrs.unstructure(s.tracking.reading),
        "state": cattrs.unstructure(s.tracking.state),
        "prepared": s.tracking.statements.export(),
        "transaction": s.tracking.tx.export(s.tracking.prepared) if transaction else None,
        "login": {"collation": s.link.login.collation, "connect_attrs": s.link.login.connect_attrs},
        "owes_results": s.link.owes_results,
        "recoveries": s.link.recoveries,
        "backend": _backend_fields(backend, now) if backend is not None else None,
        "marker": {"slot": markers.slot, "written": markers.written, "table_ready": markers.table.ready} if markers else None,
    }


def _backend_fields(backend: Backend, now: float) -> dict[str, Any]:
    hs = backend.handshake
    return {
        "address": str(backend.address),
        "handshake": {**cattrs.unstructure(hs), "scramble": hs.scramble.hex()},
        "capabilities": backend.capabilities,
        "status": backend.status,
        "age": now - backend.connected_at,
        "max_allowed_packet": backend.max_allowed_packet,
        "instance": cattrs.unstructure(backend.instance) if backend.instance is not None else None,
        "wait_timeout": backend.wait_timeout,
    }


class SessionMover:
    """The old process's side: moves sessions over ``channel`` (the upgrade's, still open)
    until ``deadline``; one message and its answer at a time."""

    def __init__(self, channel: HandoverChannel, new_pid: int) -> None:
        self.channel = channel
        self.new_pid = new_pid
        self._lock = trio.Lock()
        self.moved = 0
        self.refused: dict[int, str] = {}  # session id -> why the new process would not take it
        self.broken: str | None = None  # the channel failed: nothing more moves
        self._over = False  # ``done`` is sent: a session that comes now stays

    async def run(self, proxy: Proxy, deadline: float) -> list[Session]:
        """Interrupt each session's wait for its next command once it can move, until all
        moved or ``deadline`` (trio clock); the sessions left, to be drained."""
        sessions = proxy.target.sessions
        asked: set[int] = set()
        while trio.current_time() < deadline and self.broken is None:
            waiting = [s for s in sessions if s.id not in self.refused]
            if not waiting:
                break
            for s in waiting:
                if s.id not in asked:  # it hands itself over at its next boundary (relay.commands)
                    asked.add(s.id)
                    s.hand_over_to(self)
                if s.mover is self and why_not_movable(s) is None:
                    s.client.interrupt_wait()  # one idle in its wait for the next command goes now
            await trio.sleep(POLL)
        for s in sessions:
            s.hand_over_to(None)
        async with self._lock:  # after a move under way; one that comes later stays (``_over``)
            self._over = True
            left = [s for s in sessions if s.link.state is not LinkState.CLOSED]  # a moved one's link is detached
            try:
                await self.channel.send(Message("done", {"moved": self.moved, "left": len(left)}), timeout=ANSWER_TIMEOUT)
            except HandoverError:
                pass
            self.channel.close()
        return left

    async def move(self, s: Session) -> bool:
        """Called by ``s``'s client task, at a command boundary: True once the new process has
        the session (its backend connection is let go here; the caller ends the session)."""
        if why_not_movable(s) is not None:
            return False  # still asked: it tries again at its next boundary
        s.hand_over_to(None)
        if self.broken is not None or self._over:
            return False
        if not await s.backend_task.stop():
            return False  # the backend task is busy (a loss it just saw): at the next boundary
        if why_not_movable(s) is not None:  # the backend task may have seen the connection go
            s.backend_task.start()
            return False
        backend = None if s.waits_to_reconnect else s.link.backend
        fields = session_fields(s, backend)
        fds = [s.client.sock.fileno()] + ([backend.channel.sock.fileno()] if backend is not None else [])
        try:
            async with self._lock:
                if self._over:  # the deadline passed while it waited for the channel
                    s.backend_task.start()
                    return False
                await self.channel.send(Message("session", fields, fds), timeout=ANSWER_TIMEOUT)
                answer = await self.channel.receive(timeout=ANSWER_TIMEOUT, expecting=f"an answer about session {s.id}")
        except HandoverError as exc:
            # The new process may have the connections now, or not: both serving them would mix
            # two sessions' bytes. This process lets go of them (no COM_QUIT) and the session ends.
            self.broken = str(exc)
            s.link.detach()
            s.log.error("hand-over to pid %d failed midway (%s): the session is closed here", self.new_pid, exc,
                        extra={"event": "session_move_failed"})  # fmt: skip
            raise SessionClosed(f"hand-over to pid {self.new_pid} failed midway: {exc}") from None
        if answer.type != "adopted":
            self.refused[s.id] = str(answer.fields.get("reason") or answer.type)
            s.log.warning("pid %d refused the session (%s): it stays here and drains", self.new_pid, self.refused[s.id])
            s.backend_task.start()
            return False
        self.moved += 1
        s.record.moved_on()
        s.link.detach()  # the connections live on in the new process: this one lets go, without a word
        if backend is not None:
            s.log.info("moved to pid %d with its client and backend connections (backend connection %d)", self.new_pid,
                       backend.connection_id, extra={"event": "session_moved"})  # fmt: skip
        else:
            s.log.info("moved to pid %d with its client connection (its backend connection was closed for idling: a new one "
                       "at its next command)", self.new_pid, extra={"event": "session_moved"})  # fmt: skip
        return True


async def move_sessions(proxy: Proxy, upgrader) -> None:
    """The old process of an upgrade (``upgrade.Upgrader``, handed over): move each session to
    the new one at its next command boundary, within listen.handover_timeout; log why each one
    left could not move."""
    if upgrader.session_channel is None:
        return
    mover = SessionMover(upgrader.session_channel, upgrader.outcome.new_pid)
    timeout = proxy.config.listen.handover_timeout
    left = await mover.run(proxy, trio.current_time() + timeout)
    for session in left:
        reason = mover.refused.get(session.id) or mover.broken or why_not_movable(session) or "no command boundary was seen"
        session.log.info("not moved to pid %d within %gs (listen.handover_timeout): %s; it drains here",
                         mover.new_pid, timeout, reason, extra={"event": "session_not_moved"})  # fmt: skip
    log.info("upgrade: %d session(s) moved to pid %d, %d left to drain", mover.moved, mover.new_pid, len(left),
             extra={"event": "sessions_moved"})  # fmt: skip


async def take_over(successor, inherited, bound: list[str], closed: list[str], proxy: Proxy) -> None:
    """The new process of an upgrade (``upgrade.Successor``): say it serves, then take the old
    one's sessions."""
    if await successor.serving(inherited, bound, closed):
        await adopt_sessions(successor.channel, proxy, inherited.old_pid, proxy.config.listen.handover_timeout)


async def adopt_sessions(channel: HandoverChannel, proxy: Proxy, old_pid: int, wait: float) -> None:
    """The new process's side: take every session the old process sends until it is done
    (``wait``: the longest gap between two of its messages, listen.handover_timeout)."""
    adopted = refused = 0
    try:
        while True:
            message = await channel.receive(timeout=wait + ANSWER_TIMEOUT, expecting="a session or the end of the hand-over")
            if message.type == "done":
                proxy.target.stats.upgrade_sessions["drained"] += int(message.fields.get("left") or 0)
                break
            if message.type != "session":
                _close_fds(message.fds)
                raise HandoverError(f"expected 'session' or 'done', got {message.type!r}")
            session_id = message.fields.get("id")
            wanted = 1 if message.fields.get("backend", {}) is None else 2
            if len(message.fds) != wanted:
                _close_fds(message.fds)
                raise HandoverError(f"session {session_id} came with {len(message.fds)} descriptors, not {wanted} (client, backend)")
            sockets = [socket.socket(fileno=fd) for fd in message.fds]  # ours from here: closed unless adopted
            try:
                session = _thaw(proxy, message.fields, *sockets)
            except Exception as exc:  # noqa: BLE001 -- any reason is the old process's to log; it keeps the session
                for sock in sockets:
                    sock.close()
                refused += 1
                proxy.target.stats.upgrade_sessions["refused"] += 1
                log.warning("refused session %s from pid %d: %s", session_id, old_pid, exc)
                await channel.send(Message("refused", {"id": session_id, "reason": str(exc)}), timeout=ANSWER_TIMEOUT)
                continue
            await channel.send(Message("adopted", {"id": session_id}), timeout=ANSWER_TIMEOUT)
            adopted += 1
            proxy.target.stats.upgrade_sessions["moved"] += 1
            proxy.adopt(session, old_pid, message.fields.get("age", 0.0))
    except HandoverError as exc:
        log.warning("hand-over of sessions from pid %d ended early: %s", old_pid, exc)
    finally:
        channel.close()
    log.info("took over %d session(s) from pid %d (%d refused)", adopted, old_pid, refused, extra={"event": "sessions_adopted"})


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _thaw(proxy: Proxy, f: dict[str, Any], client_sock: socket.socket, backend_sock: socket.socket | None = None) -> Session:
    """The session of a message's fields on its two connections, or on its client's alone
    (``"backend": null``); the caller closes them if this raises."""
    b = f.get("backend")
    if (b is None) != (backend_sock is None):
        raise ValueError("a backend connection without its fields, or fields without it")

    def attach(s: Session) -> None:
        if b is not None:
            s.link.replace(thaw_backend(proxy, b, Channel(backend_sock, f"backend {b['address']}")))
            s.link.adopted(bool(f["owes_results"]), int(f["recoveries"]))
        else:
            s.link.adopted_lost(int(f["recoveries"]))

    return thaw_session(proxy, f, client_sock, attach)


def thaw_session(proxy: Proxy, f: dict[str, Any], client_sock: socket.socket, attach: Callable[[Session], None],
                 orphaned: Orphaned | None = None) -> Session:  # fmt: skip
    """The session of ``session_fields`` on its client connection: who is logged in, the session
    state, prepared statements (valid on the backend connection ``attach`` gives the link, or
    to prepare again), the open transaction if it moves, how the server reads its text, the
    commit-marker slot; ``orphaned``: what a takeover knows besides. Raises ValueError when
    this process cannot run it."""
    from proxy.relay.login import login_for
    from proxy.relay.session import Session

    if f.get("format") != FORMAT:
        raise ValueError(f"session format {f.get('format')!r}, this version reads {FORMAT}")
    target = proxy.target
    state = cattrs.structure(f["state"], SessionState)
    if proxy.config.user(state.username) is None:
        raise ValueError(f"user {state.username!r} is not in this config")
    now = trio.current_time()
    s = Session(target, Channel(client_sock, f"client {f['client_address']}"), f["client_address"], int(f["id"]), proxy.recovery)
    s.parts.info.opened_at = now - float(f["age"])
    s.greeted(s.client, int(f["client_caps"]), bytes.fromhex(f["scramble"]))
    s.cycle.adopt(int(f["commands"]), int(f.get("settled", 0)), None)
    login = f["login"]
    s.link.set_login(login_for(s, state.username, state.database, int(login["collation"]), dict(login["connect_attrs"])))
    attach(s)
    reading = cattrs.structure(f["reading"], ServerReading)
    s.tracking.restore(state, bool(f["autocommit"]), reading, f["prepared"], f["transaction"], orphaned)
    marker = f.get("marker")
    if marker is not None and s.parts.markers is not None:
        s.parts.markers.slot, s.parts.markers.written = str(marker["slot"]), int(marker["written"])
        if marker["table_ready"]:
            target.markers.known_ready()
    return s


def thaw_backend(proxy: Proxy, b: dict[str, Any], channel: Channel) -> Backend:
    """The backend connection of ``session_fields``' "backend" on ``channel``."""
    address = Address.parse(b["address"])
    # (With discovery the servers come from DNS or PD: this process may not have found them yet.)
    if proxy.config.backend.discovery == "static" and address not in proxy.config.backend.addresses:
        raise ValueError(f"backend {address} is not in this config")
    hs = ServerHandshake(**{**b["handshake"], "scramble": bytes.fromhex(b["handshake"]["scramble"])})
    return Backend(channel, address, hs, int(b["capabilities"]), int(b["status"]),
                   trio.current_time() - float(b["age"]), b["max_allowed_packet"],
                   cattrs.structure(b["instance"], Instance) if b["instance"] is not None else None,
                   b["wait_timeout"])  # fmt: skip
