"""One session's command cycle, sans-IO: a command from the client, to the server, its answer
back, and what that leaves behind. ``CommandCycle`` is the only writer of the command in flight
(``inflight``), what the client's next command gets first (``first_answer``), the count of
commands, what the supervisor's copy of the state includes (``settled``) and when the last
command completed (``last_activity``); it moves the ``phase`` through ``TRANSITIONS`` (checked,
as ``proxy.relay.link``'s and h11's states are):

    IDLE --send--> SENT --forward--> STREAMING --complete--> IDLE
    IDLE --park--> PARKED  (the link is not up: recovery, a move or a new connection sends it)
    SENT, STREAMING, PARKED, IDLE --lose--> RECOVERING --resume--> IDLE / SENT
    IDLE --hand_over--> HANDING_OVER --stay--> IDLE
    any --close--> CLOSED

Both lanes drive it (``proxy.relay``): the fast one from the event loop's callbacks, packet by
packet; the slow one from trio tasks, for everything that waits. It does no I/O: its methods
take what arrived and say what happens to it (``fast_command`` for the fast lane's commands,
``start`` and ``dispatch`` for the slow lane's, ``finish`` for a complete answer).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Final, Protocol

from proxy.cycle import inflight as _inflight
from proxy.cycle.answers import FirstAnswer, Reply
from proxy.cycle.inflight import SENDING, SENT, Inflight
from proxy.protocol.constants import Commands as C
from proxy.session.intake import Command
from proxy.session.state import PreparedStatement
from proxy.session.tracker import SessionTracker
from proxy.sqltext import Analysis, Kind

__all__ = [
    "CommandCycle",
    "Phase",
    "TRANSITIONS",
    "CycleError",
    "LinkView",
    "MarkersView",
    "is_commit",
    "runs_ddl",
    "rewritten",
    "asks_max_packet",
    "WRITE_VERBS",
    "JUDGE_ASIDE",
]

# Texts at least this long are judged in a thread (about 0.5 s per MB of Python).
JUDGE_ASIDE: Final = 256 * 1024
_ASKS_MAX_PACKET: Final = re.compile(rb"\s*SELECT\s+@@(?:session\.)?max_allowed_packet\s*;?\s*$", re.I)
WRITE_VERBS: Final = frozenset({b"INSERT", b"REPLACE", b"UPDATE", b"DELETE"})  # of the fast path (sqltext.triage)
_perf_counter: Final = time.perf_counter  # (a C static when compiled: no lookup of time's attribute per read)


class Phase:
    """Where a session's command stands (plain ints: the phase is read and moved per statement)."""

    IDLE: Final = 0  # nothing in flight
    SENT: Final = 1  # the command is the server's (going out, or gone); nothing of its answer forwarded yet
    STREAMING: Final = 2  # part of its answer reached the client
    PARKED: Final = 3  # a command waits for the backend connection (not up: a new one, a move)
    RECOVERING: Final = 4  # the backend connection was lost: recovery runs
    HANDING_OVER: Final = 5  # an upgrade takes the session to another process
    CLOSED: Final = 6

    NAMES: Final = ("IDLE", "SENT", "STREAMING", "PARKED", "RECOVERING", "HANDING_OVER", "CLOSED")


P = Phase
# phase -> {event -> next phase}, by phase; anything else is a bug of the caller's, refused
# before any field changes.
# fmt: off
TRANSITIONS: Final[tuple[dict[str, int], ...]] = (
    # IDLE (complete: a command with no answer completes as it goes)
    {"send": P.SENT, "park": P.PARKED, "lose": P.RECOVERING, "hand_over": P.HANDING_OVER, "close": P.CLOSED, "complete": P.IDLE},
    # SENT
    {"forward": P.STREAMING, "complete": P.IDLE, "answer": P.IDLE, "lose": P.RECOVERING, "close": P.CLOSED},
    # STREAMING
    {"forward": P.STREAMING, "complete": P.IDLE, "answer": P.IDLE, "lose": P.RECOVERING, "close": P.CLOSED},
    # PARKED
    {"send": P.SENT, "answer": P.IDLE, "complete": P.IDLE, "lose": P.RECOVERING, "park": P.PARKED, "close": P.CLOSED},
    # RECOVERING: a command that arrives meanwhile waits (park); an answer may come before its end
    {"send": P.SENT, "park": P.RECOVERING, "answer": P.RECOVERING, "lose": P.RECOVERING, "resume": P.IDLE,
     "complete": P.RECOVERING, "close": P.CLOSED},
    # HANDING_OVER
    {"stay": P.IDLE, "close": P.CLOSED},
    # CLOSED
    {"close": P.CLOSED, "lose": P.CLOSED, "answer": P.CLOSED, "complete": P.CLOSED, "resume": P.CLOSED},
)
# fmt: on


class CycleError(Exception):
    """A move the cycle's phases do not allow (a bug in the caller)."""


class LinkView(Protocol):
    """What the cycle reads of the backend link (``proxy.relay.link.BackendLink``)."""

    @property
    def up(self) -> bool: ...


class MarkersView(Protocol):
    """Whether the session's commit markers are on (``proxy.recovery.markers.CommitMarkers``)."""

    @property
    def on(self) -> bool: ...


class CommandCycle:
    __slots__ = ("tracking", "link", "markers", "now", "clock_offset", "phase", "inflight", "first_answer", "commands", "settled",
                 "last_activity", "losses_in_a_row", "next_marker")  # fmt: skip

    def __init__(self, tracking: SessionTracker, link: LinkView, now: Callable[[], float], markers: MarkersView | None = None,
                 clock_offset: float | None = None) -> None:  # fmt: skip
        self.tracking = tracking
        self.link = link
        self.markers = markers  # the session's commit markers (None: off)
        # The run's clock: ``now()``, or (trio's own clock) time.perf_counter() + ``clock_offset``,
        # which is that clock without a call of Python's per read (read twice per statement).
        self.now = now
        self.clock_offset = clock_offset
        self.phase: int = Phase.IDLE  # written by _go only
        self.inflight: Inflight | None = None  # the command sent (or waiting to be) whose response is not complete
        self.first_answer: FirstAnswer | None = None  # what the next command gets before anything else
        self.commands = 0
        self.settled = 0  # the last command whose completion the supervisor's copy of the state includes
        self.last_activity = self.time()  # when the last command completed (wait_timeout, idle_timeout)
        self.losses_in_a_row = 0  # losses of the backend connection since a command last completed
        self.next_marker = 0  # commit-marker number written for the COMMIT about to be submitted

    def time(self) -> float:
        """The run's clock now."""
        offset = self.clock_offset
        return _perf_counter() + offset if offset is not None else self.now()

    def count_loss(self) -> int:
        """Recovery judged a loss: the losses since a command last completed, this one included."""
        self.losses_in_a_row += 1
        return self.losses_in_a_row

    def _go(self, event: str) -> int:
        allowed = TRANSITIONS[self.phase]
        new = allowed.get(event)
        if new is None:
            raise CycleError(f"command cycle: {event} is not allowed while {Phase.NAMES[self.phase]} (allowed: {', '.join(allowed)})")
        self.phase = new
        return new

    # ------------------------------------------------------------------ the client's command

    def arrived(self) -> None:
        """A command came from the client (counted whatever becomes of it)."""
        self.commands += 1

    def owed_reply(self, cmd: Command, deprecate_eof: bool) -> Reply | None:
        """What ``cmd`` gets first, if the client is owed an answer (it is taken); None: go on."""
        first, self.first_answer = self.first_answer, None
        return first.reply(cmd, self.tracking, deprecate_eof) if first is not None else None

    def owe(self, answer: FirstAnswer | None) -> None:
        """The client's next command gets ``answer`` first (None: nothing is owed any more)."""
        self.first_answer = answer

    def start(self, cmd: Command, statement: PreparedStatement | None, verb: bytes | None, analysis: Analysis | None,
              deprecate_eof: bool, commits_writes: bool) -> Inflight:  # fmt: skip
        """The client's command, judged, as the command in flight (not yet the cycle's: ``dispatch``)."""
        tracking = self.tracking
        inflight = _inflight.start(cmd, tracking, deprecate_eof, self.time(), statement, verb, analysis)
        if tracking.tx.active:
            inflight.look_first = commits_writes
        elif tracking.autocommit:
            ends_with = statement.analysis if cmd.code == C.COM_STMT_EXECUTE and statement is not None else analysis
            inflight.look_first = verb in WRITE_VERBS or (ends_with is not None and ends_with.writes)
        if self.next_marker:
            inflight.marker, self.next_marker = self.next_marker, 0
        return inflight

    def commits_writes(self, cmd: Command, statement: PreparedStatement | None, analysis: Analysis | None) -> bool:
        """Is ``cmd`` the COMMIT of a transaction that wrote (a commit marker is worth it)?"""
        tx = self.tracking.tx
        if not (tx.active and tx.writes):
            return False
        return is_commit(statement.analysis if cmd.code == C.COM_STMT_EXECUTE and statement is not None else analysis)

    def dispatch(self, inflight: Inflight) -> bool:
        """``inflight`` is the command in flight: True when it goes to the server now; while
        the link is not up it waits (recovery, a move or a new connection sends it)."""
        self.inflight = inflight
        if self.link.up:
            self._go("send")
            return True
        self._go("park")
        return False

    def fast_command(self, cmd: Command, deprecate_eof: bool) -> Inflight | None:
        """The fast lane's way: ``cmd`` (one small command, read whole, nothing owed, the link
        up) as the command in flight, when nothing about it needs the slow lane: a COM_QUERY
        or COM_STMT_EXECUTE that asks no rewrite (max_allowed_packet, KILL). A COMMIT whose
        commit marker goes first has ``marker`` MARKER_DUE. None: the slow lane takes it from
        the start. Nothing changes until ``take`` (or the marker's ``dispatch``)."""
        code = cmd.code
        tracking = self.tracking
        if code == C.COM_QUERY:
            if cmd.size >= JUDGE_ASIDE:
                return None  # judged in a thread
            statement = None
            verb, analysis = tracking.triage(cmd.payload)
            if analysis is not None and rewritten(cmd, analysis):
                return None
        elif code == C.COM_STMT_EXECUTE:
            statement = tracking.statement_of(cmd.payload)
            if statement is None or statement.long_data_refused is not None:
                return None
            verb = analysis = None
        else:
            return None
        commits_writes = self.commits_writes(cmd, statement, analysis)
        inflight = self.start(cmd, statement, verb, analysis, deprecate_eof, commits_writes)
        if commits_writes and self.markers_on:
            inflight.marker = _inflight.MARKER_DUE
        return inflight

    def take(self, inflight: Inflight) -> None:
        """The command of ``fast_command`` is in flight: it goes to the server now."""
        self.commands += 1
        self.inflight = inflight
        self._go("send")

    @property
    def markers_on(self) -> bool:
        """Is a commit marker written before the COMMIT of a transaction that wrote?"""
        markers = self.markers
        return markers is not None and markers.on

    def marker_written(self, number: int) -> None:
        """The COMMIT submitted next follows its commit marker ``number``."""
        self.next_marker = number

    # ------------------------------------------------------------------ sending

    def sending(self, inflight: Inflight) -> None:
        inflight.state = SENDING

    def sent(self, inflight: Inflight) -> None:
        inflight.state = SENT
        piece = inflight.piece
        if piece is not None:
            piece.sent_on = self.tracking.generation

    # ------------------------------------------------------------------ the server's answer

    def forward(self, inflight: Inflight) -> None:
        """Part of the answer goes to the client (from here a loss cannot be hidden)."""
        inflight.forwarded = True
        if self.phase != Phase.STREAMING:
            self._go("forward")

    def finish(self, inflight: Inflight) -> list[str]:
        """Its answer is complete: what it did to the session and the transaction is recorded
        (``SessionTracker.completed``). Returns the variables to read back from the server
        before the client hears the end of it."""
        captures = self.tracking.completed(inflight)
        self.losses_in_a_row = 0
        self.last_activity = self.time()
        command = inflight.command
        if command.spool is not None:  # (its release, without the call for the usual command kept in memory)
            command.release()
        return captures

    def done(self, inflight: Inflight) -> None:
        """Its answer is complete (whoever waits for it is woken once the client has it:
        ``Inflight.wake``): nothing is in flight any more."""
        if self.inflight is inflight:
            self.inflight = None
            self._go("complete")

    def answered(self, inflight: Inflight) -> None:
        """Recovery (or the proxy) answered the command in flight in the server's place."""
        inflight.answered = True
        if self.inflight is inflight:
            self.inflight = None
            self._go("answer")

    def settle(self) -> None:
        """The supervisor's copy of the state includes every command so far (``--workers N``)."""
        self.settled = self.commands

    # ------------------------------------------------------------------ the connection, the session

    def lose(self) -> None:
        """The backend connection was lost: recovery runs."""
        self._go("lose")

    def resume(self) -> None:
        """Recovery is over: what waits goes out (``dispatch``'s ``send``), or nothing is in flight."""
        if self.phase == Phase.RECOVERING:
            if self.inflight is not None and self.inflight.state is not _inflight.NOT_SENT:
                self._go("send")
            else:
                self._go("resume")
                if self.inflight is not None:
                    self._go("park")

    def resend(self, inflight: Inflight) -> None:
        """A command that waited goes out now (after recovery or a move)."""
        if self.phase != Phase.SENT and self.phase != Phase.STREAMING:
            self._go("send")

    def hand_over(self) -> None:
        self._go("hand_over")

    def stay(self) -> None:
        """The hand-over did not happen: the session goes on here."""
        self._go("stay")

    def close(self) -> None:
        self._go("close")

    def adopt(self, commands: int, settled: int, inflight: Inflight | None) -> None:
        """A session from another process (an upgrade, a worker's death): its counts, and the
        command it had in flight (sent there: recovery judges it here)."""
        self.commands, self.settled = commands, settled
        if inflight is not None:
            self.inflight = inflight
            self._go("park")

    def idled_out(self, server_wait: float | None, now: float) -> float | None:
        """The session's wait_timeout (seconds) if it has been idle about that long at ``now``
        (the server may have closed its connection for idling), else None. ``server_wait``:
        the server's own, unless the session set one."""
        session_wait = self.tracking.session_wait
        wait = session_wait if session_wait is not None else server_wait
        return wait if wait and now - self.last_activity >= wait - 1 else None

    def idle(self) -> bool:
        """Between transactions with nothing in flight: it can be closed or moved now."""
        return self.inflight is None and not self.tracking.tx.active


def asks_max_packet(cmd: Command) -> bool:
    """``SELECT @@max_allowed_packet`` (go-sql-driver's question; ``proxy.relay.oversize``)."""
    return _ASKS_MAX_PACKET.match(cmd.payload, 1) is not None


def rewritten(cmd: Command, analysis: Analysis) -> bool:
    """Is this judged text one the slow lane rewrites before it goes: a KILL (by the proxy's
    connection id, ``proxy.relay.kill``) or the question for max_allowed_packet?"""
    first = analysis.first
    if first.kind is Kind.OTHER:
        return analysis.keywords(0, 1) == ("KILL",)
    return first.kind is Kind.SELECT and analysis.single and asks_max_packet(cmd)


def is_commit(analysis: Analysis | None) -> bool:
    """One COMMIT [AND CHAIN] (what a commit marker can protect)."""
    return (
        analysis is not None
        and analysis.unknown is None
        and analysis.single
        and analysis.first.kind is Kind.COMMIT
        and not analysis.first.release
    )


def runs_ddl(analysis: Analysis | None) -> bool:
    """Did the text run a DDL (safe mode's cached table keys are stale)?"""
    if analysis is None:
        return False
    statements = analysis.statements
    return statements[0].kind is Kind.DDL if len(statements) == 1 else any(st.kind is Kind.DDL for st in statements)
