"""A session's backend task: it reads the backend connection all the time (from the fast lane
while that carries the session, else from the socket), hands each piece of an answer to
``responses``, and a lost connection to recovery (``parts.recovery.on_lost``): a server closing
it while the client is idle (FIN, reset, an unsolicited ERR) is replaced before the client's next
command. ``BackendTask`` is the task and how others start and stop it: an upgrade hands its
connection over between two commands.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from proxy.cycle.answers import Failed
from proxy.cycle.inflight import NOT_SENT, ConnectionFailed, SessionClosed
from proxy.netio import PeerClosed, PeerFinished, WaitInterrupted
from proxy.protocol.packets import make_err
from proxy.relay.link import LinkState
from proxy.relay.responses import KILLED, closed_for_idling, describe_unsolicited, kills, on_response_data, unsolicited_err

if TYPE_CHECKING:
    from proxy.relay.fastlane import Job
    from proxy.relay.relay import Relay

__all__ = ["BackendTask"]


class BackendTask:
    """A session's backend task: started with the session, stopped and started again around
    an upgrade's hand-over, waiting for a command while the link has no connection."""

    __slots__ = ("s", "nursery", "done", "parked", "_unparked", "_stopped_parked", "_queued", "_stop_waiting", "unconnected")

    def __init__(self, s: Relay) -> None:
        self.s = s
        self.nursery: trio.Nursery | None = None
        self.done: trio.Event | None = None  # set when the task returns
        self.parked = False  # it waits for the server's next bytes (an upgrade may stop it there, between responses)
        self._unparked: trio.Event | None = None  # set when that wait ends (``stop``)
        self._stopped_parked = False  # and it ended by ``stop``'s interrupt
        self._queued: trio.Event | None = None  # set by the next command while the task waits for one
        self._stop_waiting = False  # ``stop`` ended that wait (an upgrade takes the session)
        self.unconnected = False  # idle with no backend connection (closed for idling) until a command comes

    def start(self, nursery: trio.Nursery | None = None) -> None:
        if nursery is not None:
            self.nursery = nursery
        assert self.nursery is not None
        self.done = trio.Event()
        self.nursery.start_soon(self._run, self.done)

    async def stop(self) -> bool:
        """Stop reading the backend connection where the task waits between responses (an
        upgrade is about to hand it over). False: it is busy -- a response, or recovery after a
        loss it saw the moment before -- and goes on; stopping it there would leave the session
        half recovered. The wait is ended by the channel's interrupt, which costs the wait
        nothing (a cancel scope per response did: callgrind)."""
        s, done = self.s, self.done
        if done is None:
            return False
        if self._queued is not None and s.cycle.inflight is None:  # no connection: it waits for a command
            self._stop_waiting = True
            self._queued.set()
            await done.wait()
            self._stop_waiting = False
            return True
        backend = s.link.backend
        if not self.parked or backend is None or s.cycle.inflight is not None:
            return False
        self._unparked = trio.Event()
        if not backend.channel.interrupt_wait():
            self._unparked = None
            return False
        await self._unparked.wait()  # the wait ended: interrupted, or with what had arrived
        self._unparked = None
        if not self._stopped_parked:
            return False
        await done.wait()
        return True

    def command_waits(self) -> None:
        """A command waits to be sent (the link is not up): wake the task if it waits for one."""
        if self._queued is not None:
            self._queued.set()

    async def _command_queued(self) -> bool:
        """Wait until a command waits to be sent (the link is LOST: nothing sends it but
        recovery). False: ``stop`` ended the wait instead."""
        self.unconnected = True
        if self.s.cycle.inflight is None:
            self._queued = trio.Event()
            try:
                await self._queued.wait()
            finally:
                self._queued = None
        if self._stop_waiting:
            return False
        self.unconnected = False
        return True

    async def _next(self, backend) -> bytes | Job:
        """The server's next bytes: from the fast lane, or the socket. Nothing arrives between
        responses, nor before the server has worked on a command: wait for readability first,
        except mid-response."""
        s = self.s
        inflight = s.cycle.inflight
        if inflight is not None and s.lane is None:
            return await backend.channel.recv(wait_first=inflight.tracker.nbytes == 0)
        self.parked = True  # an upgrade may stop the task here, and only here
        interrupted = False
        try:
            return await (s.lane.backend_data() if s.lane is not None else backend.channel.recv(wait_first=True))
        except WaitInterrupted:
            interrupted = True
            raise
        finally:
            self.parked = False
            self._stopped_parked = interrupted
            if self._unparked is not None:
                self._unparked.set()

    async def _run(self, done: trio.Event) -> None:
        s = self.s
        link, cycle = s.link, s.cycle
        recovery = s.parts.recovery
        try:
            if link.state is LinkState.LOST:
                # No connection to read: the server closed it for idling (in this process, or in the
                # old one of an upgrade, which moved the session without it). One at the next command.
                if not await self._command_queued():
                    return  # stopped again: an upgrade takes the session
                await recovery.on_lost(s, s.unconnected_reason)
            while True:
                backend = link.backend
                assert backend is not None
                try:
                    data = await self._next(backend)
                except WaitInterrupted:
                    return
                except PeerClosed as exc:
                    if link.backend is not backend or link.state is LinkState.MOVING:  # replaced on purpose (COM_CHANGE_USER, a move)
                        await link.replaced.wait()
                        continue
                    inflight = cycle.inflight
                    if isinstance(exc, PeerFinished) and kills(inflight) and inflight.state != NOT_SENT:
                        # The client's KILL closed its own connection, and TiDB sends nothing
                        # before the FIN: close the client's too, as the server did; the KILL is
                        # never sent again (a replay used to send it again and again).
                        raise SessionClosed("the client killed its own backend connection") from None
                    cut = link.take_cut_reason()
                    idled = None if cut is not None else closed_for_idling(s, backend)
                    if idled is not None:
                        # Reconnecting now would be closed again after as long, for as long as the
                        # client stays away: a new connection at its next command instead.
                        link.lost()
                        s.log.info("backend connection %d closed after %.0fs idle (the server's wait_timeout %gs): "
                                   "a new one at the next command", backend.connection_id, trio.current_time() - cycle.last_activity,
                                   idled)  # fmt: skip
                        if not await self._command_queued():
                            return  # an upgrade takes the session, without a connection
                    await recovery.on_lost(s, cut or str(exc), clean=cut is None and isinstance(exc, PeerFinished))
                    continue
                if type(data) is not bytes:  # the fast lane's answer goes on here: it waits (a send, recovery)
                    await data()
                    continue
                inflight = cycle.inflight
                if inflight is None or inflight.state == NOT_SENT:
                    if link.state is LinkState.MOVING:  # the old connection's last words: the move goes on
                        await link.replaced.wait()
                        continue
                    err = unsolicited_err(data)
                    if err is not None and err.code == KILLED and await recovery.killed_by_operator(s):
                        # An operator killed this session's connection: the client hears the
                        # server's error at its next command, and the session ends, as direct.
                        s.parts.target.stats.recovered("killed_1927", 0.0)
                        cycle.owe(Failed(make_err(err.code, err.sqlstate, err.message)))
                        return
                    await recovery.on_lost(s, f"backend sent {describe_unsolicited(data)} while idle")
                    continue
                await on_response_data(s, inflight, data)
        except ConnectionFailed as failed:
            inflight = cycle.inflight
            if inflight is not None and inflight.forwarded:
                # Part of the answer reached the client, maybe part of a packet: an ERR now
                # would be read as the rest of a row. Closing is the only clear signal.
                raise SessionClosed(f"{failed} (client connection closed mid-response)") from None
            if inflight is not None:
                await s.answer_inflight(failed.payload)
                raise SessionClosed(str(failed)) from None
            cycle.owe(Failed(failed.payload))  # an idle client hears it at its next command
        finally:
            done.set()
