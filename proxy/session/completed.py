"""A command whose response is complete, as the session model is told of it, and what its kind
alone says.

- ``Completed``: what the relay hands ``SessionTracker.completed`` (``cycle.inflight.Inflight``);
- ``FAST_STATEMENTS``: the statement a fast-path verb stands for (``sqltext.triage``: one DML
  or SELECT, judged without analysis);
- ``SESSION_ONLY_COMMANDS``: the commands that change nothing but session-level state.
"""

from __future__ import annotations

from typing import Final

from proxy.protocol.constants import Commands as C
from proxy.protocol.response import ResponseTracker
from proxy.session.intake import Command
from proxy.session.state import PreparedStatement
from proxy.sqltext import Analysis, Kind, ServerReading, Statement
from proxy.sqltext.triage import FAST_VERBS

__all__ = ["Completed", "FAST_STATEMENTS", "SESSION_ONLY_COMMANDS"]


class Completed:
    """A command whose response is complete: what the session model reads of it. The base of
    the command in flight (``cycle.inflight.Inflight``), a class rather than a Protocol so that
    the compiled core reads these as fields, not by name."""

    __slots__ = ("command", "tracker", "statement", "verb", "analysis", "reading")

    def __init__(self, command: Command, tracker: ResponseTracker, statement: PreparedStatement | None, verb: bytes | None,
                 analysis: Analysis | None, reading: ServerReading) -> None:  # fmt: skip
        self.command = command
        self.tracker = tracker
        self.statement = statement
        self.verb = verb  # COM_QUERY on the fast path: its verb (sqltext.triage)
        self.analysis = analysis  # COM_QUERY off the fast path: the text judged
        self.reading = reading  # how the server reads text as it is sent


FAST_STATEMENTS: Final = {verb: Statement(Kind[verb.decode()]) for verb in FAST_VERBS}
FAST_STATEMENTS[b"SELECT"] = Statement(Kind.SELECT, read_only=True)

# Commands that change nothing but session-level state (never data).
SESSION_ONLY_COMMANDS: Final = frozenset(
    {
        C.COM_PING,
        C.COM_INIT_DB,
        C.COM_STMT_PREPARE,
        C.COM_STMT_CLOSE,
        C.COM_STMT_RESET,
        C.COM_STMT_SEND_LONG_DATA,
        C.COM_FIELD_LIST,
        C.COM_STATISTICS,
        C.COM_SET_OPTION,
        C.COM_RESET_CONNECTION,
        C.COM_PROCESS_INFO,
    }
)
