"""The fast lane: a session's commands and answers carried from the host loop's callbacks
(``proxy.hostloop``), with no trio task woken per packet.

Each of the session's two tasks parks here while it waits (the client task for a command,
``client_data``; the backend task for the server's bytes, ``backend_data``), and while it is
parked, the host loop watches its socket (``Channel.watch``). When bytes come:

- a command the cycle can take as it is (``CommandCycle.fast_command``: one small COM_QUERY or
  COM_STMT_EXECUTE whole in one read, nothing owed, no plugin, no commit marker to write, the
  link up) goes to the server from the callback, both tasks parked;
- the server's answer to it is streamed to the client and completed (``CommandCycle.finish``)
  from the callback, unless completing it waits for something;
- anything else wakes the task that waits (``run_sync_soon``) with the bytes, as if it had
  read them itself, or with the rest of the work as a ``Job`` (a send the socket did not take
  whole, a going-away server, variables to read back). The slow lane is the trio code that
  was always there; the fast lane only ever does what it would have done, without waiting.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from proxy import hostloop
from proxy.cycle.cycle import Phase, runs_ddl
from proxy.cycle.inflight import SEND_FAILED, SENT, Inflight
from proxy.netio import RECV_SIZE, Channel, PeerClosed, PeerFinished
from proxy.protocol.packets import ProtocolError
from proxy.relay.link import LinkState
from proxy.relay.responses import SERVER_GOING_AWAY, after_feed, complete_after, idled_out
from proxy.session.intake import whole_command

if TYPE_CHECKING:
    from proxy.relay.relay import Relay

__all__ = ["FastLane", "Job", "lane_for"]

log = logging.getLogger("replay_proxy.session")

Job = Callable[[], Awaitable[None]]  # the rest of an event's work, for the task it wakes
_IDLE = Phase.IDLE
_UP = LinkState.UP


def lane_for(s: Relay) -> FastLane | None:
    """The session's fast lane while a host loop runs (None: trio alone, or not plain sockets)."""
    host = hostloop.current()
    if host is None or type(s.client) is not Channel:
        return None
    return FastLane(s, host)


class FastLane:
    __slots__ = ("s", "loop", "token", "client_waits", "backend_waits", "client_got", "backend_got", "spool_threshold")

    def __init__(self, s: Relay, host: hostloop.Host) -> None:
        self.s = s
        self.loop = host.loop
        self.token = host.token
        self.client_waits: trio.Event | None = None  # set: the client task is parked here
        self.backend_waits: trio.Event | None = None  # set: the backend task is parked here
        self.client_got: bytes | BaseException | Job | None = None  # what wakes the client task
        self.backend_got: bytes | BaseException | Job | None = None
        self.spool_threshold = s.parts.config.limits.spool_threshold

    # ------------------------------------------------------------------ the tasks' side

    async def client_data(self) -> bytes | Job:
        """Park the client task until the lane leaves it something: the client's bytes, or a
        job. Raises PeerClosed (the client went, or its socket was closed) or WaitInterrupted."""
        if self.client_got is None:
            client = self.s.client
            waits = self.client_waits = trio.Event()
            client.watch(self.loop, self._client_readable, self._client_gone)
            try:
                await waits.wait()
            finally:
                self.client_waits = None
                client.unwatch()
        got, self.client_got = self.client_got, None
        if isinstance(got, BaseException):
            raise got
        assert got is not None
        return got

    async def backend_data(self) -> bytes | Job:
        """Park the backend task likewise, on the current backend connection."""
        backend = self.s.link.backend
        assert backend is not None
        channel = backend.channel
        if type(channel) is not Channel:  # TLS to the server: its records are the task's to read
            return await channel.recv(wait_first=True)
        if self.backend_got is None:
            waits = self.backend_waits = trio.Event()
            channel.watch(self.loop, functools.partial(self._backend_readable, channel), self._backend_gone)
            try:
                await waits.wait()
            finally:
                self.backend_waits = None
                channel.unwatch()
        got, self.backend_got = self.backend_got, None
        if isinstance(got, BaseException):
            raise got
        assert got is not None
        return got

    def pending(self) -> bool:
        """Something came for the client task that it has not taken yet."""
        return self.client_got is not None

    def stop(self) -> None:
        """The session ends: no callback any more."""
        self.s.client.unwatch()
        backend = self.s.link.backend
        if backend is not None:
            backend.channel.unwatch()

    # ------------------------------------------------------------------ waking a task

    def _give_client(self, got: bytes | BaseException | Job) -> None:
        self.s.client.unwatch()
        self.client_got = got
        waits = self.client_waits
        if waits is not None:
            self.token.run_sync_soon(waits.set)

    def _client_gone(self, exc: BaseException) -> None:
        """The client's socket closed, or the wait interrupted (``Channel.watch``)."""
        self.client_got = exc
        waits = self.client_waits
        if waits is not None:
            self.token.run_sync_soon(waits.set)

    def _give_backend(self, channel: Channel, got: bytes | BaseException | Job) -> None:
        channel.unwatch()
        self.backend_got = got
        waits = self.backend_waits
        if waits is not None:
            self.token.run_sync_soon(waits.set)

    def _backend_gone(self, exc: BaseException) -> None:
        self.backend_got = exc
        waits = self.backend_waits
        if waits is not None:
            self.token.run_sync_soon(waits.set)

    # ------------------------------------------------------------------ the callbacks

    def _client_readable(self) -> None:
        client = self.s.client
        try:
            data = client.sock.recv(RECV_SIZE)
        except BlockingIOError:
            return
        except OSError as exc:
            self._give_client(PeerClosed(f"{client.name}: {exc.strerror or exc}"))
            return
        if not data:
            self._give_client(PeerFinished(f"{client.name}: connection closed by peer"))
            return
        try:
            if self.backend_waits is not None and self._command(data):
                return
        except Exception as exc:  # a bug: the task raises it, and the session ends as in the slow lane
            self._give_client(functools.partial(_reraise, exc))
            return
        self._give_client(data)

    def _command(self, data: bytes) -> bool:
        """Send the client's command from here, if the cycle can take it as it is. False:
        nothing happened (the client task takes it)."""
        s = self.s
        cycle, link = s.cycle, s.link
        if (
            cycle.phase is not _IDLE
            or cycle.first_answer is not None
            or link.state is not _UP
            or link.owes_results
            or s.command_hooks
            or s.mover is not None
            or s.client.decoder.buffered()
        ):
            return False
        cmd = whole_command(data, link.largest, self.spool_threshold)
        if cmd is None or cmd.seq_end:
            return False
        inflight = cycle.fast_command(cmd, s.deprecate_eof)
        if inflight is None:
            return False
        backend = link.backend
        assert backend is not None
        channel = backend.channel
        if (inflight.look_first or idled_out(s, backend, inflight.arrived) is not None) and channel.data_pending():
            return False  # the server spoke meanwhile: the slow lane lets the backend task read it first
        cycle.take(inflight)
        frames = s.tracking.backend_bytes(cmd.payload, cmd.raw, inflight.statement)
        cycle.sending(inflight)
        link.sending()
        try:
            sent = channel.try_send(frames)
        except PeerClosed:
            inflight.state = SEND_FAILED  # the backend task, woken by the close, recovers
            link.sent()
            return True
        if sent < len(frames):
            self._give_client(functools.partial(self._send_rest, inflight, channel, memoryview(frames)[sent:]))
            return True
        cycle.sent(inflight)
        link.sent()
        return True

    async def _send_rest(self, inflight: Inflight, channel: Channel, rest: memoryview) -> None:
        """The client task finishes a send the socket did not take whole."""
        try:
            await channel.send(rest)
            self.s.cycle.sent(inflight)
        except PeerClosed:
            inflight.state = SEND_FAILED
        finally:
            self.s.link.sent()

    def _backend_readable(self, channel: Channel) -> None:
        try:
            data = channel.sock.recv(RECV_SIZE)
        except BlockingIOError:
            return
        except OSError as exc:
            self._give_backend(channel, PeerClosed(f"{channel.name}: {exc.strerror or exc}"))
            return
        if not data:
            self._give_backend(channel, PeerFinished(f"{channel.name}: connection closed by peer"))
            return
        try:
            if self.client_waits is not None and self._response(channel, data):
                return
        except Exception as exc:  # a bug: as in _client_readable
            self._give_backend(channel, functools.partial(_reraise, exc))
            return
        self._give_backend(channel, data)

    def _response(self, channel: Channel, data: bytes) -> bool:
        """Stream the server's bytes to the client, and complete the answer, from here when
        nothing about it waits. False: nothing happened (the backend task takes them)."""
        s = self.s
        cycle = s.cycle
        inflight = cycle.inflight
        if (
            inflight is None
            or inflight.state is not SENT
            or inflight.internal
            or inflight.prepare_ok is not None
            or inflight.refuse_infile
            or inflight.waiter is not None
            or s.result_hooks
        ):
            return False
        tracker = inflight.tracker
        try:
            end = tracker.feed(data)
        except ProtocolError as exc:
            failed = s.parts.recovery.connection_error(s, f"protocol error in backend response: {exc}")
            self._give_backend(channel, functools.partial(_reraise, failed))
            return True
        if end < 0:
            cycle.forward(inflight)
            self._to_client(channel, data)
            return True
        error = tracker.error
        if end < len(data) or tracker.local_infile or (error is not None and error.code in SERVER_GOING_AWAY and not inflight.forwarded):
            self._give_backend(channel, functools.partial(after_feed, s, inflight, data, end))
            return True
        captures = cycle.finish(inflight)
        if inflight.analysis is not None and runs_ddl(inflight.analysis):
            s.parts.target.keys.clear()  # safe mode reads table keys again
        if captures or s.link.move_requested:
            self._give_backend(channel, functools.partial(complete_after, s, inflight, data, captures))
            return True
        cycle.done(inflight)
        self._to_client(channel, data)
        return True

    def _to_client(self, channel: Channel, data: bytes) -> None:
        """Bytes of an answer to the client; what its socket does not take now, the backend
        task sends."""
        client = self.s.client
        try:
            sent = client.try_send(data)
        except PeerClosed as exc:
            self._give_backend(channel, functools.partial(_reraise, exc))
            return
        if sent < len(data):
            self._give_backend(channel, functools.partial(client.send, memoryview(data)[sent:]))


async def _reraise(exc: BaseException) -> None:
    raise exc
