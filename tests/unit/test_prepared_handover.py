"""A session's prepared statements, exported for the new process of an upgrade and adopted
there (``PreparedStatements.export`` / ``adopt``): the client's ids, the backend's ids (which
stay valid: the backend connection moves too), the parameter types a client sends only once,
and the renumbering of a statement whose ids differ, all the same after a JSON round trip."""

from __future__ import annotations

import json
import struct

from proxy.protocol.packets import PrepareOk
from proxy.session.longdata import LongDataSpool
from proxy.session.prepared import PreparedStatements
from proxy.sqltext import ServerReading

READING = ServerReading()


def analyze(payload: bytes):
    return READING.analyze(payload[1:].decode())


def execute(stmt_id: int, value: int, bind: bool) -> bytes:
    payload = b"\x17" + struct.pack("<IBI", stmt_id, 0, 1) + b"\x00" + (b"\x01\x08\x00" if bind else b"\x00")
    return payload + struct.pack("<q", value)


def test_statements_survive_the_round_trip_with_their_ids_and_types():
    old = PreparedStatements(LongDataSpool(1 << 20, 1 << 22))
    first = old.prepare_ok(b"\x16SELECT ?", PrepareOk(7, 1, 1, 0), analyze(b"\x16SELECT ?"))
    old.reprepared(first, 9)  # after a reconnect the server gave it another id: the client's stays 7
    old.backend_bytes(execute(7, 1, bind=True), None, first)  # types bound on the backend
    second = old.prepare_ok(b"\x16UPDATE t SET v = ?", PrepareOk(3, 0, 1, 0), analyze(b"\x16UPDATE t SET v = ?"))

    new = PreparedStatements(LongDataSpool(1 << 20, 1 << 22))
    new.new_backend()  # the moved connection, as the new process's link takes it
    new.adopt(json.loads(json.dumps(old.export())), analyze)

    assert sorted(new.prepared) == sorted(old.prepared)
    moved = new.statement_of(execute(7, 1, bind=False))
    assert moved is not None and moved.backend_id == 9 and moved.num_params == 1 and moved.param_types == first.param_types
    assert moved.analysis is not None and moved.analysis.first.kind.name == "SELECT"
    # the same bytes reach the backend as they would have from the old process
    assert new.backend_bytes(execute(7, 2, bind=False), None, moved) == old.backend_bytes(execute(7, 2, bind=False), None, first)
    assert new.next_id == old.next_id and new.remap_ids == old.remap_ids
    assert new.statement_of(execute(second.client_id, 1, bind=True)).prepare_payload == second.prepare_payload
