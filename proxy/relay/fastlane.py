"""The fast lane: a session's commands and answers carried from the host loop's callbacks
(``proxy.hostloop``), with no trio task woken per packet. Compiled with the sans-IO core
(``proxy.corebuild``).

Each of the session's two tasks parks here while it waits (the client task for a command,
``client_data``; the backend task for the server's bytes, ``backend_data``), and while it is
parked, the host loop watches its socket (``Channel.watch``). When bytes come:

- a command the cycle can take as it is (``CommandCycle.fast_command``: one small COM_QUERY or
  COM_STMT_EXECUTE whole in one read, nothing owed, no plugin, the link up) goes to the server
  from the callback, both tasks parked; a COMMIT of writes with commit markers on sends its
  marker first, and the COMMIT itself once the marker's OK comes (``heldcommit``);
- the server's answer to it is streamed to the client and completed (``CommandCycle.finish``)
  from the callback, unless completing it waits for something;
- anything else wakes the task that waits (``run_sync_soon``) with the bytes, as if it had
  read them itself, or with the rest of the work as a ``Job`` (a send the socket did not take
  whole, a going-away server, variables to read back). The slow lane is the trio code that
  was always there; the fast lane only ever does what it would have done, without waiting.
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

import trio

from proxy import hostloop
from proxy.cycle.cycle import CommandCycle, Phase, runs_ddl
from proxy.cycle.inflight import MARKER_DUE, SEND_FAILED, SENT, Inflight
from proxy.netio import RECV_SIZE, Channel, PeerClosed, PeerFinished
from proxy.protocol.packets import ProtocolError
from proxy.relay.heldcommit import NOTHING, HeldCommit, reraise, send_marker_first
from proxy.relay.link import LinkState
from proxy.relay.responses import SERVER_GOING_AWAY, after_feed, complete_after
from proxy.session.intake import whole_command
from proxy.session.tracker import SessionTracker

if TYPE_CHECKING:
    from proxy.relay.relay import Relay

__all__ = ["FastLane", "Job", "lane_for"]

Job = Callable[[], Awaitable[None]]  # the rest of an event's work, for the task it wakes
Got = bytes | BaseException | Job  # what wakes a task parked here
# What the callbacks read of the interpreted relay's modules, read once (the compiled core keeps
# a Final name as a C static, not a lookup per use).
_RECV_SIZE: Final = RECV_SIZE
_UP: Final = LinkState.UP


def lane_for(s: Relay) -> FastLane | None:
    """The session's fast lane while a host loop runs (None: trio alone, or not a plain socket).
    Plugins that look at each command or result leave nothing to carry fast."""
    host = hostloop.current()
    if host is None or type(s.client) is not Channel or s.command_hooks or s.result_hooks:
        return None
    return FastLane(s, host)


class FastLane:
    __slots__ = ("s", "cycle", "tracking", "link", "keys", "poller", "token", "spool_threshold", "deprecate_eof", "client",
                 "backend", "client_waits", "backend_waits", "client_got", "backend_got", "held")  # fmt: skip

    def __init__(self, s: Relay, host: hostloop.Host) -> None:
        self.s = s
        self.cycle: CommandCycle = s.cycle
        self.tracking: SessionTracker = s.tracking
        self.link: Any = s.link  # relay.link.BackendLink
        self.keys: Any = s.parts.target.keys  # safe mode's table keys, read again after a DDL
        self.poller: Any = host.poller
        self.token: Any = host.token
        self.spool_threshold: int = s.parts.config.limits.spool_threshold
        self.deprecate_eof = False  # the client's (its login sets it: read at each park)
        self.client: socket.socket | None = None  # the sockets watched while a task is parked here
        self.backend: Channel | None = None
        self.client_waits: trio.Event | None = None  # set: the client task is parked here
        self.backend_waits: trio.Event | None = None  # set: the backend task is parked here
        self.client_got: Got | None = None  # what wakes the client task
        self.backend_got: Got | None = None
        self.held: HeldCommit | None = None  # a COMMIT waiting for its commit marker's OK

    # ------------------------------------------------------------------ the tasks' side

    async def client_data(self) -> bytes | Job:
        """Park the client task until the lane leaves it something: the client's bytes, or a
        job. Raises PeerClosed (the client went, or its socket was closed) or WaitInterrupted."""
        if self.client_got is None:
            channel = self.s.client
            self.deprecate_eof = self.s.deprecate_eof
            waits = self.client_waits = trio.Event()
            self.client = channel.sock
            channel.watch(self.poller, self._client_readable, self._client_gone)
            try:
                await waits.wait()
            finally:
                self.client_waits = None
                channel.unwatch()
        got, self.client_got = self.client_got, None
        return _taken(got)

    async def backend_data(self) -> bytes | Job:
        """Park the backend task likewise, on the current backend connection."""
        backend = self.link.backend
        channel: Channel = backend.channel
        if type(channel) is not Channel:  # TLS to the server: its records are the task's to read
            return await channel.recv(wait_first=True)
        if self.backend_got is None:
            waits = self.backend_waits = trio.Event()
            self.backend = channel
            channel.watch(self.poller, self._backend_readable, self._backend_gone)
            try:
                await waits.wait()
            finally:
                self.backend_waits = None
                channel.unwatch()
        got, self.backend_got = self.backend_got, None
        return _taken(got)

    def pending(self) -> bool:
        """Something came for the client task that it has not taken yet."""
        return self.client_got is not None

    def describe(self) -> dict[str, Any]:
        """What each task parked here waits for, and what the lane holds for it (/status)."""
        return {
            "client_parked": self.client_waits is not None,
            "backend_parked": self.backend_waits is not None,
            "client_watched": self.s.client.watched(),
            "backend_watched": self.backend is not None and self.backend.watched(),
            "for_client": _kind(self.client_got),
            "for_backend": _kind(self.backend_got),
            "commit_waits_for_its_marker": self.held is not None,
        }

    def stop(self) -> None:
        """The session ends: no callback any more."""
        self.s.client.unwatch()
        if self.backend is not None:
            self.backend.unwatch()

    # ------------------------------------------------------------------ waking a task

    def give_client(self, got: Got) -> None:
        """Wake the client task with ``got`` (no more callbacks meanwhile)."""
        self.s.client.unwatch()
        self._client_gone(got)

    def _client_gone(self, got: Got) -> None:
        """Wake the client task; also ``Channel.watch``'s ``gone``: its socket closed, or the
        wait was interrupted. From here on it counts as awake (the other callback no longer
        takes it for parked), though trio runs it a moment later. A COMMIT waiting for its
        marker is the task's to finish first."""
        held = self.held
        if held is not None:
            self.held = None
            got = functools.partial(held.finish_slowly, got)
        self.client_got = got
        waits, self.client_waits = self.client_waits, None
        if waits is not None:
            self.token.run_sync_soon(waits.set)

    def give_backend(self, got: Got) -> None:
        backend = self.backend
        assert backend is not None
        backend.unwatch()
        self._backend_gone(got)

    def _backend_gone(self, got: Got) -> None:
        if self.held is not None:  # the marker's answer is the backend task's now, the COMMIT the client task's
            self.give_client(NOTHING)
        self.backend_got = got
        waits, self.backend_waits = self.backend_waits, None
        if waits is not None:
            self.token.run_sync_soon(waits.set)

    # ------------------------------------------------------------------ the callbacks

    def _client_readable(self) -> None:
        sock = self.client
        assert sock is not None
        try:
            data = sock.recv(_RECV_SIZE)
        except BlockingIOError:
            return
        except OSError as exc:
            self.give_client(PeerClosed(f"client: {exc.strerror or exc}"))
            return
        if not data:
            self.give_client(PeerFinished("client: connection closed by peer"))
            return
        try:
            if self.backend_waits is not None and self._command(data):
                return
        except Exception as exc:  # a bug: the task raises it, and the session ends as in the slow lane
            self.give_client(functools.partial(reraise, exc))
            return
        self.give_client(data)

    def _command(self, data: bytes) -> bool:
        """Send the client's command from here, if the cycle can take it as it is. False:
        nothing happened (the client task takes it). The send is whole or failed before the
        callback returns, so nobody sees it under way (``BackendLink.sending``) unless the
        socket took part of it: then the client task sends the rest."""
        cycle, link = self.cycle, self.link
        if cycle.phase != Phase.IDLE or cycle.first_answer is not None or link.state is not _UP or link.owes_results or self.s.mover:
            return False
        cmd = whole_command(data, link.largest, self.spool_threshold)
        if cmd is None or cmd.seq_end:
            return False
        inflight = cycle.fast_command(cmd, self.deprecate_eof)
        if inflight is None:
            return False
        backend = link.backend
        channel: Channel = backend.channel
        if inflight.look_first or cycle.idled_out(backend.wait_timeout, inflight.arrived) is not None:
            if channel.data_pending():
                return False  # the server spoke meanwhile: the slow lane lets the backend task read it first
        if inflight.marker == MARKER_DUE:
            send_marker_first(self, inflight, channel)
            return True
        cycle.take(inflight)
        self.send(inflight, channel, None)
        return True

    def send(self, inflight: Inflight, channel: Channel, then: HeldCommit | None) -> None:
        """Send the command in flight from here. The send is whole or failed before the
        callback returns, so nobody sees it under way (``BackendLink.sending``) unless the
        socket took part of it: then the client task sends the rest. ``then``: the COMMIT
        after this marker, the client task's to finish if it wakes for the send."""
        frames = self.tracking.backend_bytes(inflight.command.payload, inflight.command.raw, inflight.statement)
        try:
            sent = channel.sock.send(frames)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            inflight.state = SEND_FAILED  # the backend task recovers: told now, not at the socket's next report
            self.held = then
            self.give_backend(PeerClosed(f"{channel.name}: {exc.strerror or exc}"))
            return
        if sent < len(frames):
            self.cycle.sending(inflight)
            self.link.sending()
            self.give_client(functools.partial(self._send_rest, inflight, channel, memoryview(frames)[sent:], then))
            return
        self.cycle.sent(inflight)
        self.held = then

    async def _send_rest(self, inflight: Inflight, channel: Channel, rest: memoryview, then: HeldCommit | None) -> None:
        """The client task finishes a send the socket did not take whole (and the COMMIT
        after it, if it was a commit marker)."""
        try:
            await channel.send(rest)
            self.cycle.sent(inflight)
        except PeerClosed:
            inflight.state = SEND_FAILED
        finally:
            self.link.sent()
        if then is not None:
            await then.finish_slowly(NOTHING)

    def _backend_readable(self) -> None:
        channel = self.backend
        assert channel is not None
        try:
            data = channel.sock.recv(_RECV_SIZE)
        except BlockingIOError:
            return
        except OSError as exc:
            self.give_backend(PeerClosed(f"{channel.name}: {exc.strerror or exc}"))
            return
        if not data:
            self.give_backend(PeerFinished(f"{channel.name}: connection closed by peer"))
            return
        try:
            if self.client_waits is not None and self._response(data):
                return
        except Exception as exc:  # a bug: as in _client_readable
            self.give_backend(functools.partial(reraise, exc))
            return
        self.give_backend(data)

    def _response(self, data: bytes) -> bool:
        """Stream the server's bytes to the client, and complete the answer, from here when
        nothing about it waits. False: nothing happened (the backend task takes them)."""
        cycle = self.cycle
        inflight = cycle.inflight
        held = self.held
        if held is not None and inflight is held.marker:
            held.answer(data)
            return True
        if (
            inflight is None
            or inflight.state is not SENT
            or inflight.internal
            or inflight.prepare_ok is not None
            or inflight.refuse_infile
            or inflight.waiter is not None
        ):
            return False
        end = self.fed(inflight, data)
        if end is None:
            return True
        if end < 0:
            cycle.forward(inflight)
            self._to_client(data)
            return True
        tracker = inflight.tracker
        error = tracker.error
        if end < len(data) or tracker.local_infile or (error is not None and error.code in SERVER_GOING_AWAY and not inflight.forwarded):
            self.give_backend(functools.partial(after_feed, self.s, inflight, data, end))
            return True
        if inflight.analysis is not None and runs_ddl(inflight.analysis):
            self.keys.clear()  # safe mode reads table keys again
        if self.completed(inflight, data):
            self._to_client(data)
        return True

    def fed(self, inflight: Inflight, data: bytes) -> int | None:
        """The server's bytes fed to ``inflight``'s answer: where it ended in them (-1: more to
        come). None: they broke the protocol (the backend task raises it)."""
        try:
            return inflight.tracker.feed(data)
        except ProtocolError as exc:
            failed = self.s.parts.recovery.connection_error(self.s, f"protocol error in backend response: {exc}")
            self.give_backend(functools.partial(reraise, failed))
            return None

    def completed(self, inflight: Inflight, data: bytes) -> bool:
        """``inflight``'s answer, whole with ``data``, recorded and done. False: completing it
        waits (variables to read back, a move asked): the backend task's."""
        captures = self.cycle.finish(inflight)
        if captures or self.link.move_requested:
            self.give_backend(functools.partial(complete_after, self.s, inflight, data, captures))
            return False
        self.cycle.done(inflight)
        return True

    def _to_client(self, data: bytes) -> None:
        """Bytes of an answer to the client; what its socket does not take now, the backend
        task sends."""
        sock = self.client
        assert sock is not None
        try:
            sent = sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self.give_backend(functools.partial(reraise, PeerClosed(f"client: {exc.strerror or exc}")))
            return
        if sent < len(data):
            self.give_backend(functools.partial(self.s.client.send, memoryview(data)[sent:]))


def _taken(got: Got | None) -> bytes | Job:
    """What wakes a task, for it to take (an exception: raised)."""
    if isinstance(got, BaseException):
        raise got
    assert got is not None
    return got


def _kind(got: Got | None) -> str | None:
    if got is None:
        return None
    return f"{len(got)} bytes" if isinstance(got, bytes) else type(got).__name__
