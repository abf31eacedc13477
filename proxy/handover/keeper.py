"""The supervisor's keeper of its workers' clients (``--workers N``): a worker's crash loses none.

Each worker (``proxy.handover.mirror``) registers every session it serves: a duplicate of the
client socket and the session's memory file (``slot``), passed over a Unix socket
(SCM_RIGHTS), and the session's restorable state (user, database, variables, prepared
statements, its backend connection), sent again whenever it changes. The keeper holds them
and does nothing with them while the worker lives. When the worker's connection ends with
sessions still registered -- it died: SIGKILL, OOM, a bug -- they are orphans, and the next
worker of the same index (the one the supervisor starts in its place, or the successor of an
upgrade already serving) receives them and takes them over (``proxy.handover.takeover``).
Orphans nobody takes within ``timeout`` are closed: their clients see the connection end.

The keeper listens on an abstract Unix socket named after the supervisor's pid (no file to
clean up; a re-executed supervisor binds it again, and its workers reconnect and register
again). Only a process of the same user may talk to it (SO_PEERCRED).

The conversation, in the hand-over channel's frames (``protocol``)::

    worker -> keeper   hello     {"index", "pid"}
    worker -> keeper   open      {"id", "fields"} + [client socket, memory file]
    worker -> keeper   state     {"id", "fields"}
    worker -> keeper   close     {"id"}
    keeper -> worker   takeover  {"id", "fields", "pid"} + [client socket, memory file]
"""

from __future__ import annotations

import logging
import math
import os
import socket
import struct

import attrs
import trio

from proxy.handover.fdpass import HandoverChannel
from proxy.handover.protocol import HandoverError, Message

__all__ = ["SessionKeeper", "keeper_address", "STEP_TIMEOUT"]

log = logging.getLogger("replay_proxy.workers")

STEP_TIMEOUT = 10.0  # one message the other side is waiting for


def keeper_address(supervisor_pid: int) -> bytes:
    """The abstract Unix socket address of the keeper of ``supervisor_pid``."""
    return b"\0replay-proxy-keeper-%d" % supervisor_pid


def _close_fd(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


@attrs.define(eq=False)
class Kept:
    """One session as its worker registered it."""

    id: int
    client_fd: int
    slot_fd: int
    fields: dict
    pid: int  # the worker that registered it
    orphaned_at: float = 0.0

    def close(self, shutdown: bool = False) -> None:
        """Let go of the descriptors; ``shutdown``: end the client's connection too (nobody
        holds it but this process)."""
        if shutdown:
            sock = socket.socket(fileno=os.dup(self.client_fd))
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            finally:
                sock.close()
        _close_fd(self.client_fd)
        _close_fd(self.slot_fd)


@attrs.define(eq=False)
class WorkerLink:
    """One worker's connection, and the sessions it registered on it."""

    index: int
    pid: int
    channel: HandoverChannel
    sessions: dict[int, Kept] = attrs.Factory(dict)
    lock: trio.Lock = attrs.Factory(trio.Lock)  # one takeover message at a time


class SessionKeeper:
    """Run by the supervisor (``serve``); ``timeout``: how long orphans wait for a worker."""

    def __init__(self, supervisor_pid: int, timeout: float) -> None:
        self.address = keeper_address(supervisor_pid)
        self.timeout = timeout
        self.links: set[WorkerLink] = set()  # the workers connected now
        self.orphans: dict[int, list[Kept]] = {}  # by worker index
        self.stopping = False
        self.taken_over = 0  # orphans handed to a worker
        self.lost = 0  # orphans closed: nobody took them in time
        self._nursery: trio.Nursery | None = None

    @property
    def sessions(self) -> int:
        return sum(len(link.sessions) for link in self.links)

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            await sock.bind(self.address)
            sock.listen(128)
        except OSError as exc:
            sock.close()
            log.error("session keeper: cannot listen on @%s (%s): a worker's crash loses its clients", self.address[1:].decode(), exc)
            task_status.started()
            return
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._expire)
                task_status.started()
                while True:
                    conn, _ = await sock.accept()
                    nursery.start_soon(self._worker, conn)
        finally:
            sock.close()
            self.stop()

    def stop(self) -> None:
        """The proxy stops: nothing is taken over any more (the workers drain their sessions)."""
        self.stopping = True
        for orphans in self.orphans.values():
            for kept in orphans:
                kept.close(shutdown=True)
        self.orphans.clear()

    # ------------------------------------------------------------------ one worker

    async def _worker(self, conn: trio.socket.SocketType) -> None:
        raw = socket.socket(fileno=conn.detach())
        pid, uid, _gid = struct.unpack("3i", raw.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if uid != os.geteuid():
            log.warning("session keeper: refused pid %d of uid %d (not this proxy's user)", pid, uid)
            raw.close()
            return
        channel = HandoverChannel(raw, f"worker pid {pid}")
        try:
            hello = await channel.receive(timeout=STEP_TIMEOUT, expecting="hello")
        except HandoverError as exc:
            log.warning("session keeper: pid %d said no hello: %s", pid, exc)
            channel.close()
            return
        if hello.type != "hello" or hello.fds or int(hello.fields.get("pid", 0)) != pid:
            log.warning("session keeper: pid %d sent %r, not its hello", pid, hello.type)
            for fd in hello.fds:
                _close_fd(fd)
            channel.close()
            return
        link = WorkerLink(int(hello.fields["index"]), pid, channel)
        self.links.add(link)
        try:
            await self._deliver(link)
            await self._listen(link)
        finally:
            self.links.discard(link)
            channel.close()
            self._orphan(link)

    async def _listen(self, link: WorkerLink) -> None:
        while True:
            try:
                message = await link.channel.receive(timeout=math.inf, expecting="news of a session")
            except HandoverError:
                return  # the worker exited, or died
            sid = int(message.fields.get("id", 0))
            if message.type == "open" and len(message.fds) == 2:
                old = link.sessions.get(sid)
                link.sessions[sid] = Kept(sid, message.fds[0], message.fds[1], dict(message.fields.get("fields") or {}), link.pid)
                if old is not None:
                    old.close()
            elif message.type == "state" and sid in link.sessions and not message.fds:
                link.sessions[sid].fields = dict(message.fields.get("fields") or {})
            elif message.type == "close" and not message.fds:
                kept = link.sessions.pop(sid, None)
                if kept is not None:
                    kept.close()
            else:
                for fd in message.fds:
                    _close_fd(fd)
                log.warning(
                    "session keeper: worker pid %d sent %r about session %d, which makes no sense here", link.pid, message.type, sid
                )

    def _orphan(self, link: WorkerLink) -> None:
        """The worker's connection ended with sessions still its own: it died."""
        if not link.sessions:
            return
        left, link.sessions = list(link.sessions.values()), {}
        if self.stopping:
            for kept in left:
                kept.close()
            return
        now = trio.current_time()
        for kept in left:
            kept.orphaned_at = now
        self.orphans.setdefault(link.index, []).extend(left)
        log.warning("session keeper: worker %d (pid %d) left %d session(s) behind: worker %d takes them over", link.index, link.pid,
                    len(left), link.index, extra={"event": "worker_sessions_orphaned"})  # fmt: skip
        for other in self.links:
            if other.index == link.index and self._nursery is not None:  # an upgrade's successor serves already
                self._nursery.start_soon(self._deliver, other)
                break

    async def _deliver(self, link: WorkerLink) -> None:
        """Hand ``link``'s worker the orphans of its index."""
        async with link.lock:
            orphans = self.orphans.pop(link.index, [])
            for position, kept in enumerate(orphans):
                if kept.id in link.sessions:  # it moved there already (an upgrade), before its old worker died
                    kept.close()
                    continue
                fields = {"id": kept.id, "fields": kept.fields, "pid": kept.pid}
                try:
                    await link.channel.send(Message("takeover", fields, [kept.client_fd, kept.slot_fd]), timeout=STEP_TIMEOUT)
                except HandoverError as exc:
                    log.warning("session keeper: worker pid %d did not take session %d: %s", link.pid, kept.id, exc)
                    self.orphans.setdefault(link.index, []).extend(orphans[position:])
                    return
                link.sessions[kept.id] = kept  # until it registers the session itself
                self.taken_over += 1

    async def _expire(self) -> None:
        """Close orphans nobody took in time: their clients see their connection end."""
        while True:
            await trio.sleep(1)
            now = trio.current_time()
            for index, orphans in list(self.orphans.items()):
                old = [k for k in orphans if now - k.orphaned_at >= self.timeout]
                if not old:
                    continue
                self.orphans[index] = [k for k in orphans if k not in old]
                for kept in old:
                    kept.close(shutdown=True)
                self.lost += len(old)
                log.error("session keeper: no worker %d took %d orphaned session(s) within %gs: their clients are disconnected",
                          index, len(old), self.timeout, extra={"event": "worker_sessions_lost"})  # fmt: skip
