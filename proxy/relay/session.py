"""One client session: what it is made of, its two tasks, and what the rest of the proxy asks
of it (stop, move, cut, describe).

- the client task (``commands``) reads a command, lets the plugins look at it, and sends it;
- the backend task (``responses``) reads the backend socket, streams each response to the
  client and hands a loss to recovery (``parts.recovery``);
- in steady state neither runs: the fast lane (``fastlane``) carries each command and its
  answer from the event loop's callbacks, and wakes a task for whatever must wait.

The command's life is the cycle's (``proxy.cycle.CommandCycle``); the server's side of the
session is the tracker's (``proxy.session.tracker``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import trio

from proxy.cycle.cycle import CommandCycle, Phase
from proxy.cycle.inflight import NOT_SENT, SessionClosed
from proxy.hooks import SessionInfo
from proxy.netio import Channel
from proxy.protocol.constants import Capabilities
from proxy.relay import fastlane, login
from proxy.relay.backendtask import BackendTask
from proxy.relay.commands import answer_error, answer_inflight, client_task, follow_state, run_internal, send_client, send_inflight
from proxy.relay.link import BackendLink
from proxy.relay.parts import Recovery, SessionParts
from proxy.relay.record import NO_RECORD, SessionRecord
from proxy.session.longdata import LongDataSpool
from proxy.session.tracker import SessionTracker
from proxy.target import Target

__all__ = ["Session", "SessionClosed"]

log = logging.getLogger("replay_proxy.session")


class Session:
    """One client's relay (``relay.relay.Relay``, as the relay's modules take it). What does
    not change while it lives is in ``parts``, built once."""

    def __init__(self, target: Target, client: Channel, client_address: str, session_id: int, recovery: Recovery) -> None:
        config, hooks, rec, limits = target.config, target.hooks, target.config.recovery, target.config.limits
        info = SessionInfo(session_id, target.name, "", client_address, opened_at=trio.current_time())
        self.log = info.logger(log)  # every line about the session carries its fields
        self.tracking = SessionTracker(info, rec.journal_max_bytes, rec.journal_max_statements, rec.idempotent == "safe-mode",
                                       LongDataSpool(limits.spool_threshold, limits.long_data_spool))  # fmt: skip
        self.link = BackendLink(self.tracking, limits.max_allowed_packet)  # the backend connection's life
        # trio.current_time() without its two wrappers (read twice per statement): the run's clock.
        clock = trio.lowlevel.current_clock()
        self.now = clock.current_time
        markers = recovery.markers_for(target, session_id) if rec.commit_marker and rec.enabled else None
        self.cycle = CommandCycle(self.tracking, self.link, self.now, markers, _system_clock_offset(clock))
        self.parts = SessionParts(self.log, client_address, config, self.link, self.tracking, target, hooks, info, markers, recovery,
                                  self.cycle)  # fmt: skip
        self.id = session_id
        # Resolved once: with no plugin implementing them, these hooks cost one attribute test.
        self.command_hooks = bool(hooks.command_received)
        self.result_hooks = bool(hooks.result_received)
        self.client = client
        self.client_caps = 0
        self.deprecate_eof = False
        self.scramble = b""
        self.backend_task = BackendTask(self)
        self.record: SessionRecord = NO_RECORD
        self.lane = fastlane.lane_for(self)  # None: the trio tasks carry everything (tests' streams, TLS, no host loop)
        self._nursery: trio.Nursery | None = None  # while it runs
        self.mover: object | None = None  # an upgrade's SessionMover (proxy.handover.sessions) waiting for the next boundary
        self.exchanging = False  # in COM_CHANGE_USER's exchange with the client
        self.close_reason = ""
        self.login_refused = False  # wrong credentials (counted against the client's host)
        # Why its link is LOST without a backend connection (recovery's first line): the server
        # closed it for idling (here, or before an upgrade moved the session), or it died with
        # the worker this session was taken over from.
        self.unconnected_reason = "the backend connection was closed for idling; a new one for the next command"

    async def handshake(self) -> bool:
        return await login.handshake(self)

    def greeted(self, client: Channel, caps: int, scramble: bytes) -> None:
        """The client's side as its login (or the process it came from) set it."""
        self.client = client
        self.client_caps = caps
        self.deprecate_eof = bool(caps & Capabilities.CLIENT_DEPRECATE_EOF)
        self.scramble = scramble
        if type(client) is not Channel:  # TLS: its records are not the socket's bytes
            self.lane = None

    def ends(self, reason: str) -> None:
        """Why the session ends: the first reason given stays."""
        self.close_reason = self.close_reason or reason

    def closed_by(self, reason: str) -> None:
        """What ended the session (the frontend's word on how its run ended): this reason."""
        self.close_reason = reason

    def refused(self, reason: str) -> None:
        """The client's credentials were wrong (counted against its host)."""
        self.login_refused = True
        self.ends(reason)

    def without_connection(self, why: str) -> None:
        """Its link is LOST with no backend connection, because ``why`` (recovery's first line)."""
        self.unconnected_reason = why

    @contextlib.contextmanager
    def exchange(self) -> Iterator[None]:
        """COM_CHANGE_USER's exchange with the client: what goes out meanwhile is not the end of
        an answer (the record follows it whole, ``SessionRecord.rebase``, after)."""
        self.exchanging = True
        try:
            yield
        finally:
            self.exchanging = False

    def kept_by(self, record: SessionRecord) -> None:
        """Where the session's command stands is kept in ``record`` from now on (before it runs:
        a kept session is the slow lane's, whose every step the record follows)."""
        self.record = record
        self.lane = None

    def hand_over_to(self, mover: object | None) -> None:
        """An upgrade's SessionMover waits for the next command boundary (None: no more)."""
        self.mover = mover

    # ------------------------------------------------------------------ life

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self.backend_task.start(nursery)
                # A task of its own, not this one's body: each wake for a command resumes its
                # few frames, not also those of the accept loop's task that runs the session.
                nursery.start_soon(client_task, self, nursery.cancel_scope)
        except BaseExceptionGroup as group:
            # Either task's failure ends the session; surface the cause itself.
            cause = _first_cause(group)
            if not isinstance(cause, SessionClosed):
                raise cause from None
            self.close_reason = str(cause)
        except SessionClosed as exc:
            self.close_reason = str(exc)
        finally:
            if self.lane is not None:
                self.lane.stop()

    def end(self, reason: str) -> None:
        """Stop the session from outside (proxy shutdown)."""
        if self._nursery is not None and not self._nursery.cancel_scope.cancel_called:
            self.close_reason = reason
            self._nursery.cancel_scope.cancel()

    def idle(self) -> bool:
        """Between transactions with nothing in flight: it can be closed or moved now."""
        return self.cycle.idle()

    @property
    def commands(self) -> int:
        return self.cycle.commands

    @property
    def recoveries(self) -> int:
        return self.link.recoveries

    @property
    def in_transaction(self) -> bool:  # stats.SessionFacts
        return self.tracking.tx.active

    @property
    def backend_address(self) -> str | None:  # stats.SessionFacts: while its backend connection is open
        backend = self.link.backend
        return str(backend.address) if backend is not None and not backend.channel.closed else None

    @property
    def waits_to_reconnect(self) -> bool:
        """Idle without a backend connection (the server closed it for idling): a new one opens
        at the next command (the backend task waits for it, or was stopped for an upgrade)."""
        return self.backend_task.unconnected and self.cycle.inflight is None

    def request_move(self) -> None:
        """Its backend address is draining: move to another connection as soon as it is idle."""
        self.link.want_move()
        if self.idle() and self.link.up:
            self.start_move()

    def cut_backend(self, address, since: float, reason: str) -> bool:
        """Its backend connection is to ``address``, opened by ``since``, and that server
        answers no one: cut it (``BackendLink.cut``); the backend task's recovery follows."""
        backend = self.link.backend
        if not self.link.up or backend is None or backend.address != address or backend.connected_at > since:
            return False
        self.log.warning("cutting backend connection %d: %s", backend.connection_id, reason)
        self.link.cut(reason)
        return True

    def start_move(self) -> None:
        self.parts.target.spawn(self._move)

    async def _move(self) -> None:
        """Move an idle session off its draining backend (``Recovery.move``), then send a
        command that arrived meanwhile."""
        link, state = self.link, self.tracking.state
        if not link.move_requested or not link.up or not self.idle() or state is None:
            return
        if state.unrestorable is not None:
            self.log.warning("cannot move off a draining backend: %s", state.unrestorable)
            link.drop_move()
            return
        try:
            await self.parts.recovery.move(self)
        except Exception:  # a bug must cost this session's move, not the proxy
            self.log.exception("internal error while moving off a draining backend")
            return
        waiting = self.cycle.inflight
        if waiting is not None and waiting.state == NOT_SENT:
            await self.send_inflight(waiting)

    def describe(self) -> dict:
        """For /status: who, where, what state (no statement text)."""
        info = self.parts.info
        return {
            "id": self.id,
            "user": info.user,
            "client": self.parts.client_address,
            "backend": info.backend_address,
            "backend_connection": self.link.connection_id,
            "in_transaction": self.tracking.tx.active,
            "command_in_flight": self.cycle.inflight is not None,
            "waits": self.waits(),
            "commands": self.cycle.commands,
            "recoveries": self.link.recoveries,
            "opened_s_ago": round(trio.current_time() - info.opened_at, 1),
            "restorable": self.tracking.state is None or self.tracking.state.unrestorable is None,
        }

    def waits(self) -> dict:
        """Where the session stands and what each of its tasks waits for: for /status, when a
        client says it hangs."""
        cycle, inflight, lane, task = self.cycle, self.cycle.inflight, self.lane, self.backend_task
        in_flight = None
        if inflight is not None:
            in_flight = {"state": inflight.state.value, "forwarded": inflight.forwarded, "waited_for": inflight.waiter is not None}
        return {
            "phase": Phase.NAMES[cycle.phase],
            "link": self.link.state.value,
            "in_flight": in_flight,
            "client_task": "parked in the fast lane" if lane is not None and lane.client_waits is not None else "running or waiting",
            "backend_task": "parked" if task.parked else ("waiting for a command" if task.unconnected else "running or waiting"),
            "fast_lane": None if lane is None else lane.describe(),
        }

    def close(self) -> None:
        if self.lane is not None:
            self.lane.stop()
        self.link.close()  # after a move the link is closed already (detach): no COM_QUIT
        self.record.ends(self.client)
        self.client.close()
        self.tracking.close()

    # ------------------------------------------------------------------ the relay's verbs (``commands``)

    send_client = send_client
    answer_error = answer_error
    answer_inflight = answer_inflight
    send_inflight = send_inflight
    run_internal = run_internal
    follow_state = follow_state


def _system_clock_offset(clock: trio.abc.Clock) -> float | None:
    """trio's own clock is time.perf_counter() plus an offset of its own: the offset, for a
    cycle that reads that clock without calling it (None: another clock, as the tests' mock)."""
    offset = getattr(clock, "offset", None)
    return offset if type(clock).__name__ == "SystemClock" and isinstance(offset, float) else None


def _first_cause(group: BaseExceptionGroup) -> BaseException:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            exc = _first_cause(exc)
        if not isinstance(exc, trio.Cancelled):
            return exc
    return group.exceptions[0]
