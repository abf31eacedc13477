"""A worker's side of the keeper (``proxy.handover.keeper``): its sessions registered with the
supervisor, kept up to date, and the sessions of a worker that died taken over.

Each session gets a record in shared memory (``slot``) when it is registered (after its
login), and the supervisor a duplicate of its client socket and its restorable state
(``sessions.session_fields``, without the transaction's journal). The state is sent again
whenever the tracker says it changed (``SessionTracker.changed``), before the client hears of
the change and before a command runs on a new backend connection: what the supervisor holds
is never behind what the client was told. A message written to the keeper's socket is the
keeper's even if this process dies the moment after, so nothing waits for an answer.

Without the keeper (it restarts with a re-executed supervisor, or a send failed) the sessions
go on unmirrored; each reconnection registers every live session again.
"""

from __future__ import annotations

import logging
import math
import os
import socket
from typing import TYPE_CHECKING

import trio

from proxy.handover.fdpass import HandoverChannel
from proxy.handover.keeper import STEP_TIMEOUT, keeper_address
from proxy.handover.protocol import HandoverError, Message
from proxy.handover.record import SlotRecord
from proxy.handover.sessions import session_fields
from proxy.handover.slot import Slot, consumed, written
from proxy.netio import Channel

if TYPE_CHECKING:
    from proxy.handover.sessions import Proxy
    from proxy.relay.session import Session

__all__ = ["Mirror"]

log = logging.getLogger("replay_proxy.handover")

RECONNECT = 0.5  # seconds between attempts to reach the keeper


class Mirror:
    """One worker's link to its supervisor's keeper (``run`` keeps it up)."""

    def __init__(self, proxy: Proxy, supervisor_pid: int, index: int) -> None:
        self.proxy = proxy
        self.address = keeper_address(supervisor_pid)
        self.index = index
        self.channel: HandoverChannel | None = None
        self._lock = trio.Lock()  # one message at a time on the channel
        self.registered = 0  # sessions registered on the current connection

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Stay connected to the keeper; take over what it sends."""
        from proxy.handover.takeover import take_over_session

        task_status.started()
        said_down = False
        while True:
            try:
                channel = await self._connect()
            except (OSError, HandoverError) as exc:
                if not said_down:
                    log.warning("cannot reach the supervisor's session keeper (%s): a crash of this worker would lose its "
                                "clients; trying again every %gs", exc, RECONNECT)  # fmt: skip
                    said_down = True
                await trio.sleep(RECONNECT)
                continue
            if said_down:
                log.info("reached the supervisor's session keeper again: registering %d session(s)", len(self.proxy.target.sessions))
                said_down = False
            try:
                await self._register_all(channel)
                while True:
                    message = await channel.receive(timeout=math.inf, expecting="a session to take over")
                    if message.type == "takeover" and len(message.fds) == 2:
                        await take_over_session(self, message.fields, message.fds)
                    else:
                        for fd in message.fds:
                            os.close(fd)
            except (HandoverError, OSError, trio.ClosedResourceError) as exc:
                # An upgrade's re-exec of the supervisor does this too: it listens again in a second.
                log.info("the supervisor's session keeper went away (%s): this worker registers its sessions again once it is back",
                         exc or type(exc).__name__)  # fmt: skip
                said_down = True
            except Exception:  # a bug here must not take the worker's sessions down with it
                log.exception("the link to the supervisor's session keeper failed; connecting again")
                said_down = True
                await trio.sleep(RECONNECT)
            finally:
                self.channel = None
                channel.close()

    async def _register_all(self, channel: HandoverChannel) -> None:
        """Every live session registered on a new connection to the keeper; a failed send
        stops it (the connection is dropped: ``run`` connects again and starts over)."""
        async with self._lock:
            self.channel = channel
            for session in list(self.proxy.target.sessions):
                if self.channel is not channel:
                    return
                if session.record.kept:
                    await self._send_open(session)

    async def _connect(self) -> HandoverChannel:
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            await sock.connect(self.address)
        except OSError:
            sock.close()
            raise
        channel = HandoverChannel(socket.socket(fileno=sock.detach()), "the supervisor's session keeper")
        await channel.send(Message("hello", {"index": self.index, "pid": os.getpid()}), timeout=STEP_TIMEOUT)
        return channel

    # ------------------------------------------------------------------ the sessions' news

    async def opened(self, s: Session) -> None:
        """``s`` logged in (or came from another process): give it a record, register it. A TLS
        session is not (its state cannot be taken by another process)."""
        record = s.record
        if not isinstance(record, SlotRecord):
            if type(s.client) is not Channel:
                return
            start, out = consumed(s.client.sock), written(s.client.sock)
            if start is None or out is None:
                return  # the kernel does not say what was read: a takeover could not tell what the client waits for
            record = SlotRecord(Slot.create(s.id, start - s.client.decoder.buffered(), out), s.client)
            s.kept_by(record)
        record.mirror = self
        async with self._lock:
            if self.channel is not None:
                await self._send_open(s)

    async def state(self, s: Session) -> None:
        """``s``'s state changed: the keeper's copy follows before the client is told."""
        async with self._lock:
            s.tracking.mirrored()
            if self.channel is not None:
                await self._send(Message("state", {"id": s.id, "fields": session_fields(s, s.link.backend, transaction=False)}))

    async def closed(self, s: Session, tell_keeper: bool = True) -> None:
        """``s`` ended here (its client socket was shut down first, unless it moved on);
        ``tell_keeper`` False: the keeper keeps it for the next worker (this one is going down)."""
        async with self._lock:
            if self.channel is not None and tell_keeper:
                await self._send(Message("close", {"id": s.id}))

    async def _send_open(self, s: Session) -> None:
        s.tracking.mirrored()
        fields = session_fields(s, s.link.backend, transaction=False)
        await self._send(Message("open", {"id": s.id, "fields": fields}, [s.client.sock.fileno(), s.record.slot.fd]))

    async def _send(self, message: Message) -> None:
        """Send under the lock; a failure drops the connection (``run`` connects again and
        registers every session anew)."""
        channel = self.channel
        if channel is None:
            return  # dropped meanwhile: every session is registered again on the next connection
        try:
            await channel.send(message, timeout=STEP_TIMEOUT)
        except HandoverError as exc:
            log.warning("the supervisor's session keeper did not take %s: %s", message.type, exc)
            self.channel = None
            trio.lowlevel.notify_closing(channel.sock)  # ends run's wait: it connects again
            channel.close()
