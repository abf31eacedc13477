"""The command in flight: one sent (or waiting to be sent) whose response is not complete, and
the one way one is made (``start``, ``for_payload``).

Also the two ways a session ends badly: ``SessionClosed`` (close now, the client was told
why where possible) and ``ConnectionFailed`` (the backend is lost for good: the client hears
the error now if a command waits, else at its next command). Sans-IO: the relay, recovery and
the hand-over all take these from here.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from proxy.protocol.constants import Commands as C
from proxy.protocol.framing import encode_packet
from proxy.protocol.response import ResponseTracker, expect_for
from proxy.session.completed import Completed
from proxy.session.intake import Command
from proxy.session.longdata import Piece
from proxy.session.state import PreparedStatement
from proxy.session.transaction import judged
from proxy.sqltext import Analysis, ServerReading

if TYPE_CHECKING:
    from proxy.session.tracker import SessionTracker

__all__ = [
    "Inflight", "SendState", "NOT_SENT", "SENDING", "SENT", "SEND_FAILED", "SessionClosed", "ConnectionFailed",
    "STATEMENT_COMMANDS", "MARKER_DUE", "start", "for_payload",
]  # fmt: skip

# Commands that name a prepared statement by its id (the client's, mapped to the backend's).
STATEMENT_COMMANDS: Final = frozenset({C.COM_STMT_EXECUTE, C.COM_STMT_SEND_LONG_DATA, C.COM_STMT_CLOSE, C.COM_STMT_RESET, C.COM_STMT_FETCH})


class SendState(enum.Enum):
    """How far the sending of an in-flight command got (recovery judges by it)."""

    NOT_SENT = "not sent"  # waiting to be sent (for a new connection, after a loss)
    SENDING = "sending"  # its bytes are going out
    SENT = "sent"  # all of it went to the server
    SEND_FAILED = "send failed"  # the connection broke on the way: the backend task recovers


NOT_SENT: Final = SendState.NOT_SENT
SENDING: Final = SendState.SENDING
SENT: Final = SendState.SENT
SEND_FAILED: Final = SendState.SEND_FAILED
MARKER_DUE: Final = -1  # a COMMIT's ``marker`` until its commit marker is written (the fast lane writes it first)
_PLAIN_READING = ServerReading()  # (commands built by hand in tests; the relay's always say how the server reads them)


class Inflight(Completed):
    """A plain slotted class: one is made per statement."""

    __slots__ = ("arrived", "state", "forwarded", "prepare_ok", "captured", "refuse_infile", "marker", "look_first", "piece", "internal",
                 "answered", "waiter", "facts")  # fmt: skip

    def __init__(self, command: Command, tracker: ResponseTracker, statement: PreparedStatement | None, arrived: float,
                 verb: bytes | None = None, analysis: Analysis | None = None, reading: ServerReading = _PLAIN_READING,
                 state: SendState = NOT_SENT, internal: bool = False) -> None:  # fmt: skip
        super().__init__(command, tracker, statement, verb, analysis, reading)
        self.arrived = arrived
        self.state = state
        self.forwarded = False  # part of the response already reached the client
        self.prepare_ok: bytearray | None = None  # a PREPARE's response, held whole: its statement id is rewritten
        self.captured: bytearray | None = None  # the response to one of the proxy's own commands, kept for it
        self.refuse_infile = False  # answering the server's LOCAL INFILE request with "no file"
        self.marker = 0  # commit-marker number written just before this COMMIT (0: none; MARKER_DUE: not yet)
        # A COMMIT of writes, or a write in autocommit: its loss after sending is a 1158 unless
        # proved otherwise, so the connection is looked at before it goes.
        self.look_first = False
        self.piece: Piece | None = None  # a COM_STMT_SEND_LONG_DATA: what the session keeps of it
        self.internal = internal  # the proxy's own command (split pieces, markers): response not forwarded
        self.answered = False  # recovery answered the client with an error instead
        # Called once its response is complete or it was answered otherwise: whoever waits for
        # it (a pipelined command, the proxy's own command); None: nobody.
        self.waiter: Callable[[], None] | None = None
        # What recovery needs to know of it (its StatementFacts, ``proxy.recovery.facts``):
        # computed at the first loss, then kept here.
        self.facts: Any = None

    @property
    def payload(self) -> bytes:
        return self.command.payload

    def judged(self) -> Analysis | None:
        """Its text as the server reads it (None for a spooled statement: only its head is here)."""
        if not self.command.complete:
            return None
        return judged(self.command.payload, self.statement, self.analysis, self.reading)

    def restart(self, deprecate_eof: bool) -> None:
        """Make it ready to be sent again on a new connection, from a clean slate."""
        self.state = NOT_SENT
        self.tracker = ResponseTracker(self.tracker.expect, deprecate_eof, self.tracker.hashing)
        for kept in (self.prepare_ok, self.captured):
            if kept is not None:
                kept.clear()

    def finish(self) -> None:
        """Its response is complete or it was answered otherwise: free it, wake its waiter."""
        self.command.release()
        self.wake()

    def wake(self) -> None:
        """Whoever waits for it goes on (once)."""
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            waiter()

    def answer_seq(self) -> int:
        """Sequence id of an ERR/OK that answers it now (after what the client already got)."""
        return (self.tracker.last_seq if self.forwarded else self.command.seq_end) + 1

    def describe(self, name: str) -> str:
        """For log lines: ``COM_QUERY UPDATE (sent, partly answered)`` -- the statement's kind,
        never its text (it may hold secrets)."""
        what = name
        if self.verb is not None:
            what += " " + self.verb.decode()
        elif self.analysis is not None:
            what += " " + " ".join(st.kind.value.upper() for st in self.analysis.statements[:5])
        return f"{what} ({self.state.value}{', partly answered' if self.forwarded else ''})"


def start(command: Command, tracking: SessionTracker, deprecate_eof: bool, arrived: float, statement: PreparedStatement | None,
          verb: bytes | None, analysis: Analysis | None, state: SendState = NOT_SENT, internal: bool = False) -> Inflight:  # fmt: skip
    """The in-flight command for ``command``, judged already (``statement``, ``verb``,
    ``analysis``): its response tracker fingerprints what a replay must see again."""
    tracker = ResponseTracker(expect_for(command.code), deprecate_eof, tracking.wants_fingerprint(analysis))
    return Inflight(command, tracker, statement, arrived, verb, analysis, tracking.reading, state, internal)


def for_payload(payload: bytes, tracking: SessionTracker, deprecate_eof: bool, arrived: float, seq_end: int = 0,
                state: SendState = NOT_SENT, internal: bool = False) -> Inflight:  # fmt: skip
    """The in-flight command for a whole payload judged here: the proxy's own commands, and the
    command a worker that died had in flight (``proxy.handover.takeover``)."""
    code = payload[0]
    statement = tracking.statement_of(payload) if code in STATEMENT_COMMANDS else None
    verb, analysis = tracking.triage(payload) if code == C.COM_QUERY else (None, None)
    command = Command(payload, encode_packet(payload, 0)[0], seq_end, len(payload))
    return start(command, tracking, deprecate_eof, arrived, statement, verb, analysis, state, internal)


class SessionClosed(Exception):
    """End the session (after the client has been told why, where possible)."""


class ConnectionFailed(Exception):
    """The backend connection is lost and the session cannot go on: ``payload`` is the ERR the
    client gets (for the command in flight, or its next one) before the session ends."""

    def __init__(self, payload: bytes, reason: str) -> None:
        super().__init__(reason)
        self.payload = payload
