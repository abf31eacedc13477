"""The hand-over channel (proxy.handover.fdpass): frames and descriptors over a socketpair,
the timeouts and closings as errors that say what was awaited, and real sockets passed to
another process that serves them after this one closed its copies."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio

from proxy.handover.fdpass import HandoverChannel
from proxy.handover.protocol import ChannelClosed, HandoverTimeout, Message, ProtocolError

REPO = Path(__file__).resolve().parents[2]


def channels() -> tuple[HandoverChannel, HandoverChannel]:
    ours, theirs = HandoverChannel.pair()
    return ours, HandoverChannel(theirs, "the old process")


async def test_a_message_and_its_descriptors_cross_the_channel():
    old, new = channels()
    r, w = os.pipe()
    await old.send(Message("offer", {"pid": 1}, [w], b"payload"), timeout=5)
    os.close(w)  # the receiver's copy keeps the pipe open
    got = await new.receive(timeout=5)
    assert (got.type, got.fields, got.payload, len(got.fds)) == ("offer", {"pid": 1}, b"payload", 1)
    assert not os.get_inheritable(got.fds[0])  # close-on-exec: it leaks into no child this process starts
    os.write(got.fds[0], b"through the passed descriptor")
    os.close(got.fds[0])
    assert os.read(r, 100) == b"through the passed descriptor"
    os.close(r)


async def test_a_frame_larger_than_the_socket_buffer_waits_for_the_reader():
    old, new = channels()
    payload = os.urandom(8 << 20)
    got = []

    async def read():
        got.append(await new.receive(timeout=10))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await old.send(Message("journal", {}, [], payload), timeout=10)
    assert got[0].payload == payload


async def test_silence_is_a_timeout_that_names_what_was_awaited():
    old, new = channels()
    with pytest.raises(HandoverTimeout, match="the old process sent no offer of its listeners within 0.2 s"):
        await new.receive(timeout=0.2, expecting="offer of its listeners")
    old.close()


async def test_a_full_channel_is_a_send_timeout():
    old, new = channels()
    with pytest.raises(HandoverTimeout, match="the new process did not take journal within 0.3 s"):
        await old.send(Message("journal", {}, [], b"x" * (32 << 20)), timeout=0.3)
    new.close()


async def test_the_other_side_closing_is_channel_closed():
    old, new = channels()
    old.close()
    with pytest.raises(ChannelClosed, match=r"the old process closed the hand-over channel \(expected word that it serves\)"):
        await new.receive(timeout=5, expecting="word that it serves")
    with pytest.raises(ChannelClosed, match="before taking serving"):
        await new.send(Message("serving"), timeout=5)


async def test_closing_in_the_middle_of_a_frame_says_so():
    ours, theirs = socket.socketpair()
    new = HandoverChannel(ours, "the old process")
    theirs.sendall(b"RPHO\x01\x00\x00\x00\x00\x18")
    theirs.close()
    with pytest.raises(ChannelClosed, match="in the middle of a message"):
        await new.receive(timeout=5)


async def test_garbage_is_a_protocol_error_and_its_descriptors_are_closed():
    ours, theirs = socket.socketpair()
    new = HandoverChannel(ours, "the old process")
    r, w = os.pipe()
    socket.send_fds(theirs, [b"HTTP/1.0 200 OK\r\n"], [w])
    os.close(w)
    with pytest.raises(ProtocolError, match="not a hand-over frame"):
        await new.receive(timeout=5)
    assert os.read(r, 10) == b""  # the only writer left, the passed copy, was closed
    theirs.close()


def test_send_blocking_outside_trio():
    old, new = channels()
    new.send_blocking(Message("failed", {"reason": "bad config"}), timeout=5)
    got = trio.run(lambda: old.receive(timeout=5))
    assert (got.type, got.fields) == ("failed", {"reason": "bad config"})


def test_only_a_unix_stream_socket_carries_it():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp, pytest.raises(ValueError, match="Unix stream socket"):
        HandoverChannel(tcp)


# The other process: it takes a listening socket and a connected one, accepts a connection on
# the first and answers on the second, after the parent closed its own copies of both.
CHILD = textwrap.dedent(
    """
    import os, socket, sys, trio
    from proxy.handover.fdpass import HandoverChannel
    from proxy.handover.protocol import Message

    async def main():
        channel = HandoverChannel.from_fd(int(sys.argv[1]))
        offer = await channel.receive(timeout=20, expecting="the sockets")
        listener, connected = (socket.socket(fileno=fd) for fd in offer.fds)
        await channel.send(Message("took", {"pid": os.getpid()}), timeout=20)
        conn, _ = listener.accept()
        conn.sendall(f"accepted by {os.getpid()}".encode())
        conn.close()
        assert connected.recv(4) == b"ping"
        connected.sendall(f"pong from {os.getpid()}".encode())
        connected.close()
        await channel.receive(timeout=20, expecting="goodbye")

    trio.run(main)
    """
)


async def test_a_listening_and_a_connected_tcp_socket_work_in_another_process():
    listener = socket.create_server(("127.0.0.1", 0))
    server_side = socket.create_server(("127.0.0.1", 0))
    client_end = socket.create_connection(server_side.getsockname())
    connected, _ = server_side.accept()
    server_side.close()
    channel, theirs = HandoverChannel.pair()
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(theirs.fileno())], pass_fds=[theirs.fileno()], cwd=REPO)
    theirs.close()
    try:
        await channel.send(Message("sockets", {}, [listener.fileno(), connected.fileno()]), timeout=20)
        address = listener.getsockname()
        listener.close()  # from here on only the other process holds them
        connected.close()
        took = await channel.receive(timeout=30, expecting="word that it took the sockets")
        pid = took.fields["pid"]
        assert pid == child.pid != os.getpid()
        with socket.create_connection(address, timeout=20) as conn:
            assert conn.recv(100) == f"accepted by {pid}".encode()
        client_end.settimeout(20)
        client_end.sendall(b"ping")
        assert client_end.recv(100) == f"pong from {pid}".encode()
        await channel.send(Message("goodbye"), timeout=20)
        assert await trio.to_thread.run_sync(child.wait, 30) == 0
    finally:
        client_end.close()
        channel.close()
        if child.poll() is None:
            child.kill()
            child.wait()
