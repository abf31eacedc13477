"""Commands over the session's max_allowed_packet: refuse them with 1153, or (split mode) run
an oversized multi-row INSERT/REPLACE as several statements and answer as if it were one."""

from __future__ import annotations

import re
import struct
from typing import TYPE_CHECKING

from proxy.backend import Backend
from proxy.cycle.answers import Reply
from proxy.hooks import CommandInfo
from proxy.protocol.constants import Commands, Err
from proxy.protocol.framing import encode_packet
from proxy.protocol.packets import make_err, make_ok
from proxy.protocol.resultset import build_text_result, read_text_result
from proxy.session.intake import Command
from proxy.session.state import PreparedStatement
from proxy.sessionlog import outcome
from proxy.sqltext.split import CannotSplit, count_rows, split_values_statement

if TYPE_CHECKING:
    from proxy.relay.relay import Relay
    from proxy.session.tracker import SessionTracker

__all__ = ["refuse", "refuse_long_data", "split", "MergedWarnings", "SplitWarnings", "tell_effective_limit"]


C = Commands
_SHOW_WARNINGS = re.compile(rb"\s*SHOW\s+WARNINGS\s*;?\s*$", re.I)
_AT_ROW = re.compile(rb"(at row )(\d+)")
_MAX_ERROR_COUNT = 64  # the server keeps at most @@max_error_count (default 64) warnings


def tell_effective_limit(cmd: Command, limit: int, backend: Backend | None) -> Command:
    """go-sql-driver (maxAllowedPacket=0) asks SELECT @@max_allowed_packet and then keeps its
    packets under the answer: when the proxy's limit is the smaller one, answer with that."""
    if not backend or not backend.max_allowed_packet or limit >= backend.max_allowed_packet:
        return cmd
    payload = b"\x03SELECT %d AS `@@max_allowed_packet`" % limit
    return Command(payload, encode_packet(payload, 0)[0], cmd.seq_end, len(payload))


async def refuse(s: Relay, size: int, seq_end: int, code: int, why: str = "") -> None:
    """ERR 1153 naming the size, the limit and where the limit comes from."""
    limit = s.link.limit
    configured = s.parts.config.limits.max_allowed_packet
    backend = s.link.backend.max_allowed_packet if s.link.backend is not None else None
    origin = f"[limits] max_allowed_packet = {configured}"
    if backend and backend < configured:
        origin = f"the backend's @@max_allowed_packet = {backend}"
    msg = (
        f"Got a packet bigger than 'max_allowed_packet' bytes: {size} bytes, max_allowed_packet {limit} "
        f"(target {s.parts.target.name}, limit from {origin}); not sent to the backend{why}"
    )
    s.log.warning(
        "refused %s of %d bytes (limit %d)%s",
        CommandInfo(code, b"").name,
        size,
        limit,
        why,
        **outcome("refused", Err.NET_PACKET_TOO_LARGE[0]),
    )
    hooks = s.parts.hooks
    if hooks.oversized_packet:
        await hooks.notify(hooks.oversized_packet, s.parts.info, size, limit)
    await s.send_client(make_err(*Err.NET_PACKET_TOO_LARGE, msg), seq_end + 1)


async def refuse_long_data(s: Relay, cmd: Command, stmt: PreparedStatement) -> None:
    """Long data of ``stmt`` was held back from the server (over the limit, or the session's
    spool full): refuse the execute that would use it, and clear what the server got of it."""
    why = stmt.long_data_refused
    size = stmt.long_data_bytes
    await s.run_internal(b"\x1a" + struct.pack("<I", stmt.client_id), cmd.seq_end)
    s.tracking.long_data_dropped(stmt)
    if why is not None and why.startswith("the session's"):
        msg = (f"Got a packet bigger than 'max_allowed_packet' bytes: {why} (target {s.parts.target.name}); the statement's "
               "long data was not sent to the backend: send less long data at once, or raise limits.long_data_spool")  # fmt: skip
        s.log.warning("refused COM_STMT_EXECUTE: %s", why, **outcome("refused", Err.NET_PACKET_TOO_LARGE[0]))
        await s.send_client(make_err(*Err.NET_PACKET_TOO_LARGE, msg), cmd.seq_end + 1)
        return
    await refuse(s, size, cmd.seq_end, cmd.code, " (parameter data sent with COM_STMT_SEND_LONG_DATA)")


async def split(s: Relay, cmd: Command) -> None:
    """Split mode: run an oversized multi-row INSERT/REPLACE as several statements under the
    limit, atomically, and answer with one OK that adds up their results."""
    limit = s.link.limit
    nbe = s.tracking.nbe
    if cmd.code != C.COM_QUERY:
        await refuse(s, cmd.size, cmd.seq_end, cmd.code)
        return
    try:
        # Each piece (command byte included) must be a command the server takes.
        pieces = split_values_statement(cmd.full_payload()[1:], s.link.largest, no_backslash_escapes=nbe)
    except CannotSplit as exc:
        cmd.release()
        await refuse(s, cmd.size, cmd.seq_end, cmd.code, f"; split mode could not split it: {exc}")
        return
    cmd.release()
    own_transaction = not s.tracking.tx.active and s.tracking.autocommit
    begin, commit, undo = (
        ("START TRANSACTION", "COMMIT", "ROLLBACK")
        if own_transaction
        else ("SAVEPOINT replay_proxy_split", "RELEASE SAVEPOINT replay_proxy_split", "ROLLBACK TO SAVEPOINT replay_proxy_split")
    )
    s.log.info("splitting a %d-byte statement into %d pieces (limit %d)", cmd.size, len(pieces), limit)
    if await s.run_internal(b"\x03" + begin.encode(), cmd.seq_end) is None:
        return
    affected = warnings = 0
    insert_id = None
    merged = MergedWarnings()
    for piece in pieces:
        tracker = await s.run_internal(b"\x03" + piece, cmd.seq_end)
        if tracker is None:
            return
        if tracker.error is not None:
            if tracker.error.code != 1213:  # after a deadlock the server already rolled back
                await s.run_internal(b"\x03" + undo.encode(), cmd.seq_end)
            err = tracker.error
            await s.send_client(make_err(err.code, err.sqlstate, err.message), cmd.seq_end + 1)
            return
        if tracker.ok is not None:
            affected += tracker.ok.affected_rows
            warnings += tracker.ok.warnings
            if insert_id is None:
                insert_id = tracker.ok.last_insert_id  # LAST_INSERT_ID of a multi-row insert: its first row
            if tracker.ok.warnings and not await _collect_warnings(s, merged, cmd.seq_end):
                return
        merged.rows_before += count_rows(piece, no_backslash_escapes=nbe)
    if insert_id:
        # The session's LAST_INSERT_ID() must be the statement's first id, as unsplit.
        if await s.run_internal(b"\x03DO LAST_INSERT_ID(%d)" % insert_id, cmd.seq_end) is None:
            return
    done = await s.run_internal(b"\x03" + commit.encode(), cmd.seq_end)
    if done is None:
        return
    if done.error is not None:
        err = done.error
        await s.send_client(make_err(err.code, err.sqlstate, err.message), cmd.seq_end + 1)
        return
    await s.send_client(make_ok(done.status, affected, insert_id or 0, warnings), cmd.seq_end + 1)
    if merged.rows:
        s.cycle.owe(SplitWarnings(merged))  # SHOW WARNINGS right after this gets all pieces' warnings


async def _collect_warnings(s: Relay, merged: MergedWarnings, seq_end: int) -> bool:
    """SHOW WARNINGS after one piece of a split statement, renumbered to the whole statement.
    False: the client was already answered (recovery)."""
    frames = bytearray()
    tracker = await s.run_internal(b"\x03SHOW WARNINGS", seq_end, capture=frames)
    if tracker is None:
        return False
    if tracker.error is None:
        merged.add(*read_text_result(bytes(frames), s.deprecate_eof))
    return True


class SplitWarnings:
    """The first answer after a split statement: only the command right after it may ask for
    its merged warnings (SHOW WARNINGS); any other command goes on as usual."""

    def __init__(self, merged: MergedWarnings) -> None:
        self.merged = merged

    def reply(self, cmd: Command, tracking: SessionTracker, deprecate_eof: bool) -> Reply | None:
        if cmd.code != C.COM_QUERY or not _SHOW_WARNINGS.match(cmd.payload, 1):
            return None
        merged = self.merged
        return Reply(build_text_result(merged.coldefs, merged.rows, tracking.status_word(), deprecate_eof, cmd.seq_end + 1))


class MergedWarnings:
    """SHOW WARNINGS rows of all pieces of a split statement, numbered as in the whole one."""

    def __init__(self) -> None:
        self.coldefs: list[bytes] = []
        self.rows: list[list[bytes | None]] = []
        self.rows_before = 0  # rows of the statement in earlier pieces

    def add(self, coldefs: list[bytes], rows: list[list[bytes | None]]) -> None:
        self.coldefs = self.coldefs or coldefs
        offset = self.rows_before
        for level, code, message in rows:
            if message is not None and offset:
                message = _AT_ROW.sub(lambda m: m.group(1) + str(int(m.group(2)) + offset).encode(), message)
            if len(self.rows) < _MAX_ERROR_COUNT:
                self.rows.append([level, code, message])
