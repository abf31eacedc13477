"""A command whose response is complete, as the session model is told of it, and what its kind
alone says.

- ``Completed``: what the relay hands ``SessionTracker.completed`` (``cycle.inflight.Inflight``);
- ``FAST_STATEMENTS``: the statement a fast-path verb stands for (``sqltext.triage``: one DML
  or SELECT, judged without analysis);
- ``SESSION_ONLY_COMMANDS``: the commands that change nothing but session-level state.
"""

from __future__ import annotations

from typing import Protocol

from proxy.protocol.constants import Commands
from proxy.protocol.response import ResponseTracker
from proxy.session.intake import Command
from proxy.session.state import PreparedStatement
from proxy.sqltext import Analysis, Kind, ServerReading, Statement
from proxy.sqltext.triage import FAST_VERBS

__all__ = ["Completed", "FAST_STATEMENTS", "SESSION_ONLY_COMMANDS"]

C = Commands


class Completed(Protocol):
    """A command whose response is complete (``cycle.inflight.Inflight``)."""

    command: Command
    tracker: ResponseTracker
    statement: PreparedStatement | None
    verb: bytes | None  # fast-path verb, or None
    analysis: Analysis | None  # the text judged, when the fast path did not apply
    reading: ServerReading  # how the server read it when it was sent


FAST_STATEMENTS = {verb: Statement(Kind[verb.decode()]) for verb in FAST_VERBS}
FAST_STATEMENTS[b"SELECT"] = Statement(Kind.SELECT, read_only=True)

# Commands that change nothing but session-level state (never data).
SESSION_ONLY_COMMANDS = frozenset(
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
