"""proxy.netio.Channel over a real socket pair: the wait before a command (interrupted on
purpose, or ended by a close) and the hot path's send (``try_send``, then ``send`` for the rest)."""

from __future__ import annotations

import socket

import pytest
import trio
import trio.testing

from proxy.netio import Channel, PeerClosed, StreamChannel, WaitInterrupted


@pytest.fixture
async def pair():  # async: closing a channel tells trio (notify_closing), in the run only
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    channel = Channel(ours, "client")
    yield channel, theirs
    channel.close()
    theirs.close()


async def _wait_ended_by(channel: Channel, end) -> BaseException:
    """What a task parked in the wait before a command gets when ``end(channel)`` runs."""
    ended: list[BaseException] = []

    async def wait() -> None:
        try:
            await channel.recv(wait_first=True)
        except (WaitInterrupted, PeerClosed) as exc:
            ended.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        with trio.fail_after(5):
            while not channel.between_commands:
                await trio.sleep(0.001)
        end(channel)
    assert len(ended) == 1
    return ended[0]


async def test_an_interrupted_wait_raises_and_leaves_the_socket_usable(pair):
    channel, peer = pair

    def interrupt(ch: Channel) -> None:
        assert ch.interrupt_wait()  # a task waits there: the interrupt is taken

    assert isinstance(await _wait_ended_by(channel, interrupt), WaitInterrupted)
    assert not channel.between_commands and not channel.closed
    assert not channel.interrupt_wait()  # nobody waits now
    peer.send(b"next")
    with trio.fail_after(5):
        assert await channel.recv(wait_first=True) == b"next"


async def test_a_close_during_the_wait_is_the_peer_gone(pair):
    channel, _ = pair
    assert isinstance(await _wait_ended_by(channel, Channel.close), PeerClosed)
    with pytest.raises(PeerClosed):
        await channel.recv(wait_first=True)  # closed before the wait: no descriptor to wait on


async def test_try_send_takes_what_the_socket_takes_and_send_delivers_the_rest_in_order(pair):
    channel, peer = pair
    data = bytes(range(256)) * 16384  # 4 MiB: more than the socket pair's buffers hold
    sent = channel.try_send(data)
    assert 0 < sent < len(data)
    assert channel.try_send(data[sent:]) == 0  # full: nothing more until the peer reads
    received = bytearray()

    async def read_slowly() -> None:
        while len(received) < len(data):
            await trio.lowlevel.wait_readable(peer)
            received.extend(peer.recv(65536))
            await trio.sleep(0)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_slowly)
            await channel.send(data[sent:])
    assert received == data


async def test_try_send_to_a_gone_peer_is_peer_closed(pair):
    channel, peer = pair
    peer.close()
    with pytest.raises(PeerClosed):
        for _ in range(3):  # the first send may still be taken by the kernel
            channel.try_send(b"x" * 65536)


async def test_a_stream_sends_only_in_send():
    ours, theirs = trio.testing.memory_stream_pair()
    channel = StreamChannel(ours, "client")
    assert channel.try_send(b"hello") == 0
    await channel.send(b"hello")
    assert await theirs.receive_some(5) == b"hello"
