"""proxy.session.longdata: a session's long data kept to be sent again, bounded in memory."""

from __future__ import annotations

from proxy.protocol.framing import encode_packet
from proxy.session.longdata import LongDataSpool


def frames_of(stmt_id: int, data: bytes) -> bytes:
    return encode_packet(b"\x18" + stmt_id.to_bytes(4, "little") + b"\x01\x00" + data, 0)[0]


def test_memory_up_to_the_budget_then_the_file_and_back_to_nothing():
    spool = LongDataSpool(memory_budget=10_000, max_bytes=40 << 20)
    small = frames_of(1, b"a" * 5000)
    big = frames_of(1, bytes(range(256)) * 70_000)  # 17.9 MB: two frames
    kept_small = spool.keep([small], len(small), small)
    kept_big = spool.keep([big[i : i + 4096] for i in range(0, len(big), 4096)], len(big))
    assert kept_small.data is small and kept_big.data is None
    assert (spool.in_memory, spool.in_file) == (len(small), len(big))
    assert b"".join(spool.frames(kept_big)) == big  # exactly as the client sent it
    renumbered = b"".join(spool.frames(kept_big, (9).to_bytes(4, "little")))
    assert renumbered[5:9] == (9).to_bytes(4, "little") and renumbered[9:] == big[9:] and renumbered[:5] == big[:5]
    assert max(len(c) for c in spool.frames(kept_big)) <= 1 << 20  # read back in chunks
    spool.release([kept_big, kept_big])  # a second owner's release counts once
    assert spool.in_file == 0 and spool._file.seek(0, 2) == 0  # the file is emptied
    spool.release([kept_small])
    assert spool.held == 0
    spool.close()


def test_the_spool_refuses_past_its_limit():
    spool = LongDataSpool(memory_budget=0, max_bytes=100)
    piece = frames_of(1, b"x" * 60)
    assert spool.keep([piece], len(piece)) is not None
    assert spool.keep([piece], len(piece)) is None  # 2 x 71 > 100
    spool.close()


async def test_a_large_send_long_data_is_spooled_from_its_first_bytes():
    """Whole in memory, a 300 KiB COM_STMT_SEND_LONG_DATA would be held three times over; it
    goes to a file instead (only its head stays in memory), and comes back exactly. A COM_QUERY
    of the same size stays in memory (below spool_threshold)."""
    import trio

    from proxy.netio import StreamChannel
    from proxy.relay.reading import read_command
    from proxy.session.intake import HEAD_SIZE

    client, server = trio.testing.memory_stream_pair()
    channel = StreamChannel(server, "client")
    long_data = frames_of(1, b"y" * 300_000)
    query = encode_packet(b"\x03SELECT '" + b"z" * 300_000 + b"'", 0)[0]
    await client.send_all(long_data + query)
    cmd = await read_command(channel, 64 << 20, 4 << 20, 64 << 20)
    assert not cmd.complete and len(cmd.payload) == HEAD_SIZE and b"".join(cmd.frames()) == long_data
    assert cmd.wire_size == len(long_data)
    cmd.release()
    cmd = await read_command(channel, 64 << 20, 4 << 20, 64 << 20)
    assert cmd.complete and cmd.raw == query
