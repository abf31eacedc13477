"""The command in flight: one sent (or waiting to be sent) whose response is not complete.

Also the two ways a session ends badly: ``SessionClosed`` (close now, the client was told
why where possible) and ``ConnectionFailed`` (the backend is lost for good: the client hears
the error now if a command waits, else at its next command).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

import attrs
import trio

from proxy.protocol.response import ResponseTracker
from proxy.session.intake import Command
from proxy.session.longdata import Piece
from proxy.session.state import PreparedStatement
from proxy.session.transaction import judged
from proxy.sqltext import Analysis, ServerReading

if TYPE_CHECKING:
    from proxy.recovery.plan import StatementFacts

__all__ = ["Inflight", "SendState", "NOT_SENT", "SENDING", "SENT", "SEND_FAILED", "SessionClosed", "ConnectionFailed"]


class SendState(enum.Enum):
    """How far the sending of an in-flight command got (recovery judges by it)."""

    NOT_SENT = "not sent"  # waiting to be sent (for a new connection, after a loss)
    SENDING = "sending"  # its bytes are going out
    SENT = "sent"  # all of it went to the server
    SEND_FAILED = "send failed"  # the connection broke on the way: the backend task recovers


# The members by their old module-level names.
NOT_SENT, SENDING, SENT, SEND_FAILED = SendState.NOT_SENT, SendState.SENDING, SendState.SENT, SendState.SEND_FAILED


@attrs.define(slots=True, eq=False)
class Inflight:
    command: Command
    tracker: ResponseTracker
    statement: PreparedStatement | None
    arrived: float
    verb: bytes | None = None  # COM_QUERY on the fast path: its verb (sqltext.triage)
    analysis: Analysis | None = None  # COM_QUERY off the fast path: the text judged
    reading: ServerReading | None = None  # how the server reads text as it is sent
    state: SendState = SendState.NOT_SENT
    forwarded: bool = False  # part of the response already reached the client
    prepare_ok: bytearray | None = None  # a PREPARE's response, held whole: its statement id is rewritten
    captured: bytearray | None = None  # the response to one of the proxy's own commands, kept for it
    refuse_infile: bool = False  # answering the server's LOCAL INFILE request with "no file"
    marker: int = 0  # commit-marker number written just before this COMMIT (0: none)
    # A COMMIT of writes, or a write in autocommit: its loss after sending is a 1158 unless
    # proved otherwise, so the connection is looked at before it goes (``Session.send_inflight``).
    look_first: bool = False
    piece: Piece | None = None  # a COM_STMT_SEND_LONG_DATA: what the session keeps of it
    internal: bool = False  # the proxy's own command (split pieces): response not forwarded
    answered: bool = False  # recovery answered the client with an error instead
    done: trio.Event | None = None
    facts: StatementFacts | None = None  # what recovery needs to know of it: computed at the first loss, then kept

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
        self.state = SendState.NOT_SENT
        self.tracker = ResponseTracker(self.tracker.expect, deprecate_eof, self.tracker.hashing)
        for kept in (self.prepare_ok, self.captured):
            if kept is not None:
                kept.clear()

    def finish(self) -> None:
        """Its response is complete or it was answered otherwise: free it, wake its waiter."""
        self.command.release()
        if self.done is not None:
            self.done.set()

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


class SessionClosed(Exception):
    """End the session (after the client has been told why, where possible)."""


class ConnectionFailed(Exception):
    """The backend connection is lost and the session cannot go on: ``payload`` is the ERR the
    client gets (for the command in flight, or its next one) before the session ends."""

    def __init__(self, payload: bytes, reason: str) -> None:
        super().__init__(reason)
        self.payload = payload
