"""The session's prepared statements, and how their ids map to the backend connection's.

``PreparedStatements`` (``SessionTracker.statements``; the tracker is its only owner) keeps

- every statement the client prepared (``prepared``: ``PreparedStatement`` by the client's id),
- which backend connection is in use (``generation``, bumped for each new one: a statement whose
  own ``generation`` differs must be prepared again on it),
- whether the proxy numbers the statements itself (``remap_ids``: once a reconnect gave one a
  new id, ids the server hands out may clash with the client's) and the next number it gives,
- each statement's long data (COM_STMT_SEND_LONG_DATA) until its execute, in the session's spool.

It rewrites a command for the current backend connection (``backend_bytes``, ``backend_frames``):
statement ids renumbered, parameter types bound again after a re-prepare. Sans-IO.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from proxy.protocol.constants import Commands
from proxy.protocol.framing import encode_packet, with_statement_id
from proxy.session.longdata import LongDataSpool, Piece
from proxy.session.state import PreparedStatement

if TYPE_CHECKING:
    from proxy.protocol.packets import PrepareOk
    from proxy.session.intake import Command
    from proxy.sqltext import Analysis

__all__ = ["PreparedStatements", "BackendIds"]

COM_STMT_EXECUTE = Commands.COM_STMT_EXECUTE

# What ties the statements to one backend connection: its generation, and each statement's
# (backend id, generation, types bound) on it.
BackendIds = tuple[int, dict[PreparedStatement, tuple[int, int, bool]]]


def _nothing() -> None:
    pass


class PreparedStatements:
    def __init__(self, long_data: LongDataSpool) -> None:
        self.long_data = long_data  # the session's spool (shared with the journal)
        self.prepared: dict[int, PreparedStatement] = {}  # never rebound: cleared in place
        self.remap_ids = False
        self.next_id = 1
        self.generation = 0
        self.on_change = _nothing  # a statement's kept parameter types changed (the tracker's ``changed``)

    def statement_of(self, payload: bytes) -> PreparedStatement | None:
        """The prepared statement a COM_STMT_* payload names (by the client's id)."""
        return self.prepared.get(int.from_bytes(payload[1:5], "little")) if len(payload) >= 5 else None

    # ------------------------------------------------------------------ the client's commands

    def prepare_ok(self, payload: bytes, prep: PrepareOk, analysis: Analysis) -> PreparedStatement:
        """A COM_STMT_PREPARE the server answered with ``prep``: the statement the client now has."""
        client_id = prep.statement_id
        if self.remap_ids:
            client_id = self.next_id
        self.next_id = max(self.next_id, client_id) + 1
        stmt = PreparedStatement(client_id, payload, prep.num_params, prep.num_columns, prep.statement_id)
        stmt.generation = self.generation
        stmt.analysis = analysis
        self.prepared[client_id] = stmt
        return stmt

    def executed(self, stmt: PreparedStatement) -> list[Piece]:
        """``stmt`` was executed: the long data it used, which now belongs to the journal (or to
        no one: the caller releases it)."""
        long_data = stmt.long_data
        stmt.long_data, stmt.long_data_bytes = [], 0
        return long_data

    def closed(self, stmt: PreparedStatement) -> None:
        self.prepared.pop(stmt.client_id, None)
        self.long_data_dropped(stmt)

    def forget(self) -> None:
        """A new login or COM_RESET_CONNECTION: the server has no statements any more."""
        for stmt in self.prepared.values():
            self.long_data.release(stmt.long_data)
        self.prepared.clear()

    def long_data_received(self, stmt: PreparedStatement, cmd: Command, limit: int) -> Piece | None:
        """A COM_STMT_SEND_LONG_DATA of ``stmt``, kept in the session's spool to be sent again
        after a reconnect. False: held back from the server, and the execute that would use it
        gets 1153 (``stmt.long_data_refused`` says why): over ``limit`` (max_allowed_packet, as
        the server counts a statement's long data), or the spool is full. Returns what was kept
        (None: held back)."""
        if stmt.long_data_refused is not None:
            return None
        stmt.long_data_bytes += cmd.size - 7
        if stmt.long_data_bytes >= limit:
            stmt.long_data_refused = f"{stmt.long_data_bytes}+ bytes of parameter data sent with COM_STMT_SEND_LONG_DATA"
            return None
        piece = self.long_data.keep(cmd.frames(), cmd.wire_size, cmd.raw)
        if piece is None:
            spool = self.long_data
            stmt.long_data_refused = (f"the session's long data would exceed limits.long_data_spool = {spool.max_bytes} bytes "
                                      f"({spool.held} kept to be sent again after a reconnect)")  # fmt: skip
            return None
        stmt.long_data.append(piece)
        return piece

    def long_data_dropped(self, stmt: PreparedStatement) -> None:
        """``stmt``'s long data is gone (reset, closed, or its execute refused)."""
        self.long_data.release(stmt.long_data)
        stmt.long_data, stmt.long_data_bytes, stmt.long_data_refused = [], 0, None

    # ------------------------------------------------------------------ the backend connection

    def new_backend(self) -> None:
        self.generation += 1

    def long_data_frames(self, piece: Piece, stmt: PreparedStatement):
        """A kept COM_STMT_SEND_LONG_DATA as the current backend connection must see it (noted
        as sent on it)."""
        piece.sent_on = self.generation
        return self.long_data.frames(piece, struct.pack("<I", stmt.backend_id) if stmt.backend_id != stmt.client_id else None)

    def backend_bytes(self, payload: bytes, raw: bytes | None, stmt: PreparedStatement | None) -> bytes:
        """A command as the current backend connection must see it: statement ids renumbered,
        parameter types bound again for a statement that was re-prepared (a client sends them
        only when they change). ``raw``: the client's frames, returned when nothing changes."""
        if stmt is None:
            return raw if raw is not None else encode_packet(payload, 0)[0]
        new = payload
        if payload[0] == COM_STMT_EXECUTE and stmt.num_params:
            flag_pos = 10 + (stmt.num_params + 7) // 8
            if len(payload) > flag_pos:
                if payload[flag_pos]:
                    types = payload[flag_pos + 1 : flag_pos + 1 + 2 * stmt.num_params]
                    if types != stmt.param_types:
                        stmt.param_types = types
                        self.on_change()
                    stmt.types_bound_on_backend = True
                elif not stmt.types_bound_on_backend and stmt.param_types is not None:
                    new = payload[:flag_pos] + b"\x01" + stmt.param_types + payload[flag_pos + 1 :]
                    stmt.types_bound_on_backend = True
        if stmt.backend_id != stmt.client_id:
            new = new[:1] + struct.pack("<I", stmt.backend_id) + new[5:]
        if new is payload and raw is not None:
            return raw
        return encode_packet(new, 0)[0]

    def backend_frames(self, cmd: Command, stmt: PreparedStatement | None):
        """A spooled command's frames as the current backend connection must see them, in
        chunks: streamed from its file, the statement id of its first frame renumbered. (An
        execute whose parameter types must be bound again is rebuilt whole: its layout changes.)"""
        if stmt is None:
            return cmd.frames()
        payload = cmd.payload  # the head: enough for the id and the types' flag
        if payload[0] == COM_STMT_EXECUTE and stmt.num_params and not stmt.types_bound_on_backend:
            return iter([self.backend_bytes(cmd.full_payload(), None, stmt)])
        if stmt.backend_id == stmt.client_id:
            return cmd.frames()
        new_id = struct.pack("<I", stmt.backend_id)
        return with_statement_id(cmd.frames(), new_id)

    def reprepared(self, stmt: PreparedStatement, backend_id: int) -> None:
        """``stmt`` was prepared again on the current backend connection as ``backend_id``."""
        stmt.backend_id = backend_id
        stmt.generation = self.generation
        stmt.types_bound_on_backend = False
        if backend_id != stmt.client_id:
            self.remap_ids = True

    # ------------------------------------------------------------------ an upgrade's hand-over

    def export(self) -> dict:
        """The statements as JSON, for the new process of an upgrade: the backend connection
        moves with them, so their backend ids stay valid there (no long data: ``movable``)."""
        return {
            "remap_ids": self.remap_ids,
            "next_id": self.next_id,
            "statements": [
                {"client_id": st.client_id, "prepare": st.prepare_payload.hex(), "num_params": st.num_params,
                 "num_columns": st.num_columns, "backend_id": st.backend_id,
                 "param_types": st.param_types.hex() if st.param_types is not None else None,
                 "types_bound": st.types_bound_on_backend and st.generation == self.generation}
                for st in self.prepared.values()
            ],
        }  # fmt: skip

    def adopt(self, exported: dict, analyze) -> None:
        """The statements ``export`` gave, on the backend connection in use now (``analyze``:
        how the tracker judges a PREPARE's text, as at its PREPARE)."""
        self.remap_ids, self.next_id = bool(exported["remap_ids"]), int(exported["next_id"])
        for e in exported["statements"]:
            payload = bytes.fromhex(e["prepare"])
            stmt = PreparedStatement(int(e["client_id"]), payload, int(e["num_params"]), int(e["num_columns"]), int(e["backend_id"]))
            stmt.param_types = bytes.fromhex(e["param_types"]) if e["param_types"] is not None else None
            stmt.types_bound_on_backend = bool(e["types_bound"])
            stmt.generation = self.generation
            stmt.analysis = analyze(payload)
            self.prepared[stmt.client_id] = stmt

    def backend_ids(self) -> BackendIds:
        """What ties the prepared statements to the current backend connection (a move that
        fails goes back to it: ``restore_backend_ids``)."""
        return self.generation, {st: (st.backend_id, st.generation, st.types_bound_on_backend) for st in self.prepared.values()}

    def restore_backend_ids(self, ids: BackendIds) -> None:
        self.generation, by_statement = ids
        for st, (backend_id, generation, bound) in by_statement.items():
            st.backend_id, st.generation, st.types_bound_on_backend = backend_id, generation, bound
