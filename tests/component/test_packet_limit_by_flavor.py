"""The largest command a server takes: MariaDB refuses a packet of exactly max_allowed_packet
bytes (it must be smaller), TiDB takes it and refuses only a bigger one (measured on v8.5.3,
with max_allowed_packet = 1048576: a COM_QUERY payload of 1048576 bytes ran, 1048577 was 1153).
The proxy refused exactly max_allowed_packet on TiDB too: a 1153 TiDB would not have given
(go-sql-driver sends up to max_allowed_packet bytes)."""

from __future__ import annotations

import pytest

from tests.component.fakes import make_config

LIMIT = 4096


def query_of(size: int) -> str:
    """An INSERT whose COM_QUERY payload (command byte included) is ``size`` bytes."""
    head, tail = "INSERT INTO t VALUES (1, '", "')"
    return head + "x" * (size - 1 - len(head) - len(tail)) + tail


@pytest.mark.parametrize("flavor, largest", [("mariadb", LIMIT - 1), ("tidb", LIMIT)])
async def test_the_largest_command_is_the_servers(make_rig, autojump, flavor, largest):
    rig = make_rig(make_config(limits={"max_allowed_packet": f"{LIMIT}B"}))
    rig.server.flavor = flavor
    c = await rig.client()
    taken = await c.query(query_of(largest))
    assert taken.ok and rig.server.db.rows == {1: "x" * (largest - 29)}, taken
    refused = await c.query(query_of(largest + 1))
    assert refused.code == 1153 and f"{largest + 1} bytes" in refused.message, refused
    assert len(rig.server.queries[-1]) + 1 == largest  # the refused one never reached the server


@pytest.mark.parametrize("flavor, largest", [("mariadb", LIMIT - 1), ("tidb", LIMIT)])
async def test_split_pieces_up_to_the_servers_largest(make_rig, autojump, flavor, largest):
    """Split mode packs pieces up to what the server takes: a two-row INSERT of largest + 1
    bytes whose first row alone is a piece of exactly ``largest`` bytes."""
    rig = make_rig(make_config(limits={"max_allowed_packet": f"{LIMIT}B", "oversized": "split"}))
    rig.server.flavor = flavor
    c = await rig.client()
    first = query_of(largest)  # INSERT INTO t VALUES (1, 'x...x')
    statement = first + ", (2, 'y')"
    assert (await c.query(statement)).ok
    assert rig.server.db.rows[1] == "x" * (largest - 29) and rig.server.db.rows[2] == "y"
    assert first in rig.server.queries
