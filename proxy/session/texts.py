"""The SQL text a command runs, and what the first command on a new backend connection must not
read (the previous statement's results stayed on the old one)."""

from __future__ import annotations

from proxy.protocol.constants import Commands as C
from proxy.session.state import PreparedStatement
from proxy.sqltext import ServerReading
from proxy.sqltext.expressions import reads_last_results

__all__ = ["text_of", "needs_last_results"]


def text_of(payload: bytes, stmt: PreparedStatement | None) -> str | None:
    """The SQL text a COM_QUERY runs, or a COM_STMT_EXECUTE (of ``stmt``); else None."""
    code = payload[0]
    if code == C.COM_QUERY:
        return payload[1:].decode("utf-8", "surrogateescape")
    if code == C.COM_STMT_EXECUTE and stmt is not None:
        return stmt.prepare_payload[1:].decode("utf-8", "surrogateescape")
    return None


def needs_last_results(reading: ServerReading, payload: bytes, stmt: PreparedStatement | None) -> bool:
    """Does this command read what the session's previous statement left (FOUND_ROWS(),
    warnings, ...)? Asked only of the first command on a new backend connection, read as the
    session's server reads text now. The whole payload: a spooled command's head ends in the
    middle of a token, which the lexer cannot tell (``proxy.relay.reading.judged_whole``)."""
    text = text_of(payload, stmt)
    return text is not None and reads_last_results(text, reading.dialect, reading.nbe)
