"""Following LAST_INSERT_ID() through the commands that complete, so that a new backend
connection can be given it again.

``SessionState`` keeps the last value known for sure and the INSERTs since whose OK carried an
id (``recovery.proofs.last_insert_id`` decides at restore which of them the server generated);
``follow_insert_id`` tells it what one completed command did to it.
"""

from __future__ import annotations

import re
from typing import Final

from proxy.protocol.constants import Commands as C
from proxy.session.completed import FAST_STATEMENTS, Completed
from proxy.session.state import SessionState
from proxy.sqltext import Analysis, Kind

__all__ = ["follow_insert_id"]

_SETS_INSERT_ID: Final = re.compile(rb"LAST_INSERT_ID\s*\(\s*(?!\))", re.I)  # LAST_INSERT_ID(expr)
_DO_INSERT_ID: Final = re.compile(rb"\s*(?:DO|SELECT)\s+LAST_INSERT_ID\s*\(\s*(\d+)\s*\)\s*;?\s*", re.I)
_INSERT_TEXT: Final = 64 * 1024  # an INSERT whose OK carried an id is kept up to this size, to tell "generated" later


def follow_insert_id(state: SessionState, done: Completed) -> bool:
    """A COM_QUERY or COM_STMT_EXECUTE that succeeded: what it did to LAST_INSERT_ID(). True
    when it may have changed what is known of it."""
    ok = done.tracker.ok
    value = ok.last_insert_id if ok is not None else 0
    verb = done.verb
    if not value and verb is not None and verb != b"SELECT":
        return False  # the fast path's INSERT, REPLACE, UPDATE or DELETE, and no id: nothing moved
    if value:
        state.forced_insert_id_used(value)
    cmd = done.command
    a: Analysis | None
    if done.verb is not None and done.analysis is None:
        kind: Kind | None = FAST_STATEMENTS[done.verb].kind
    else:
        a = done.analysis if done.analysis is not None else done.statement.analysis if done.statement is not None else None
        kind = a.first.kind if a is not None and a.single and a.unknown is None else None
    if kind is Kind.INSERT or kind is Kind.REPLACE:
        if value:
            text = cmd.text() if cmd.code == C.COM_QUERY and cmd.complete and cmd.size <= _INSERT_TEXT else None
            state.insert_id(value, text, done.reading)
        return bool(value)
    if value:  # UPDATE ... SET id = LAST_INSERT_ID(expr): the OK carries the new value
        state.known_insert_id(value)
        return True
    if kind is Kind.SELECT and done.verb is not None:
        return False  # the fast path's SELECT calls nothing: no "(" in it (sqltext.triage)
    if kind is Kind.SELECT or done.analysis is not None:
        m = _SETS_INSERT_ID.search(cmd.payload, 1)
        if m is not None:
            constant = _DO_INSERT_ID.fullmatch(cmd.payload, 1)
            if constant is not None:
                state.known_insert_id(int(constant.group(1)))
            else:
                state.insert_id_lost()
            return True
    return False
