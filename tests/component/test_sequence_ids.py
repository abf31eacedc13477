"""A command must start at sequence id 0. MariaDB answers one that does not with 1156 "Got
packets out of order"; TiDB closes the connection without a word (measured on v8.5.3), which
the proxy took for a server gone away: it reconnected and sent the same command again, for the
whole buffer window, then answered 1158. The proxy refuses it itself now, as MariaDB does, and
the server never sees it."""

from __future__ import annotations

import pytest
import trio

from proxy.protocol.framing import encode_packet
from proxy.protocol.packets import parse_err


@pytest.mark.parametrize("seq", [1, 7])
async def test_a_command_out_of_sequence_is_refused_not_resent(rig, autojump, seq):
    rig.server.flavor = "tidb"
    c = await rig.client()
    started = trio.current_time()
    await c.stream.send_all(encode_packet(b"\x03SELECT 1", seq)[0])
    err = parse_err(await c._read_packet())
    assert (err.code, err.sqlstate, err.message) == (1156, "08S01", "Got packets out of order")
    assert trio.current_time() - started < 1  # at once, not after the buffer window
    with pytest.raises(EOFError):
        await c.query("SELECT 1")
    assert not any(q == "SELECT 1" or q.startswith("out of sequence") for q in rig.server.queries)
