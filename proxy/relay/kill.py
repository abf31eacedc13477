"""A client's KILL of a proxy session: clients KILL by the connection id of the proxy's
greeting, which the server does not know; it is sent as the backend connection's id instead."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from proxy.protocol.framing import encode_packet
from proxy.session.intake import Command
from proxy.worker_identity import backend_connection_of

if TYPE_CHECKING:
    from proxy.relay.relay import Relay

__all__ = ["translate_kill"]

_KILL = re.compile(rb"\s*KILL\s+((?:CONNECTION\s+|QUERY\s+)?)(\d+)\s*;?\s*$", re.I)


async def translate_kill(s: Relay, cmd: Command) -> Command:
    """Clients KILL by the connection id of the proxy's greeting (the mariadb CLI on Ctrl-C:
    KILL QUERY <id>). Those ids are the proxy's own session numbers; the server knows the
    session's current backend connection instead (another worker's session: ask it)."""
    m = _KILL.match(cmd.payload, 1)
    if m is None:
        return cmd
    session_id = int(m.group(2))
    target = s.parts.target
    session = target.session_by_id(session_id)
    killing = not m.group(1).upper().startswith(b"QUERY")
    victim = session.link.backend if session is not None else None
    if victim is not None:
        address, connection_id = str(victim.address), victim.connection_id
        if killing:  # the server may not count KILLs (TiDB): tell the victim's recovery
            session.link.kill_relayed_now(connection_id)
    else:
        worker = target.worker
        found = await backend_connection_of(worker, session_id, killing) if worker is not None else None
        if found is None:
            return cmd  # not a proxy session: the server will judge the id
        address, connection_id = found
    backend = s.link.backend
    if backend is None or address != str(backend.address):
        s.log.info("KILL of proxy session %d, which is on backend %s, not this session's", session_id, address)
    payload = b"\x03KILL %s%d" % (m.group(1), connection_id)
    s.log.info("%s of proxy session %d sent as backend connection %d", payload[1:].decode(errors="replace"), session_id, connection_id)
    return Command(payload, encode_packet(payload, 0)[0], cmd.seq_end, len(payload))
