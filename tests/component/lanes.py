"""The component rig with the two lanes on: the real ``Proxy`` run as trio's guest in a uvloop
host loop (``proxy.hostloop``), its clients and the fake server on real socket pairs, so that
each session's sockets are plain ones the fast lane watches (memory streams are the slow lane's
only). A test is a plain function that calls ``hosted(body)``; ``body(rig)`` runs inside.

``Wakes`` counts the steps of the sessions' own tasks (trio's instrument): a command the fast
lane carries wakes neither.
"""

from __future__ import annotations

import socket
import struct
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from proxy import hostloop
from proxy.config import Address
from proxy.netio import Channel
from tests.component.fakes import FakeClient, FakeConnection, FakeServer
from tests.component.rig import Rig

__all__ = ["hosted", "LaneRig", "Wakes"]

_LINGER_RESET = struct.pack("ii", 1, 0)


def hosted(body: Callable[[LaneRig], Awaitable[None]], timeout: float = 30, **rig_options: Any) -> None:
    """Run ``body(rig)`` in a nursery, as trio's guest of a uvloop loop; fail after ``timeout`` s."""

    async def main() -> None:
        assert hostloop.current() is not None
        with trio.fail_after(timeout):
            async with trio.open_nursery() as nursery:
                await body(LaneRig(nursery, **rig_options))
                nursery.cancel_scope.cancel()

    hostloop.run(main)


class _SocketStapled:
    """A FakeConnection's side of a socket pair, as the fakes use a StapledStream: closing a
    half closes the socket, with a reset unless the connection closes cleanly."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
        self.conn: FakeConnection | None = None
        self.send_stream = self.receive_stream = self

    async def receive_some(self, n: int) -> bytes:
        return await self.stream.receive_some(n)

    async def send_all(self, data: bytes) -> None:
        await self.stream.send_all(data)

    def send_then_close(self, data: bytes) -> None:
        """``data`` and the close at once (the socket's buffer takes a small answer whole)."""
        self.sock.send(data)
        self.close()

    def close(self) -> None:
        tsock = self.stream.socket
        if tsock.fileno() < 0:
            return
        if self.conn is not None and self.conn.reset:
            tsock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        tsock.close()


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Two ends of a loopback TCP connection (a reset is a real one: SO_LINGER 0)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        ours = socket.create_connection(listener.getsockname())
        theirs, _ = listener.accept()
    ours.setblocking(False)
    return ours, theirs


class SocketServer(FakeServer):
    """The fake server on socket pairs (``tcp``: loopback TCP connections): the proxy gets plain
    Channels."""

    def __init__(self, nursery: trio.Nursery, tcp: bool = False) -> None:
        super().__init__(nursery)
        self.tcp = tcp

    async def opener(self, address: Address) -> Channel:  # type: ignore[override]
        if not self.up:
            raise ConnectionRefusedError(111, "Connection refused")
        ours, theirs = tcp_pair() if self.tcp else socket.socketpair()
        self.next_id += 1
        stapled = _SocketStapled(theirs)
        conn = FakeConnection(self, stapled, self.next_id)  # type: ignore[arg-type]
        stapled.conn = conn
        self.connections.append(conn)
        self.nursery.start_soon(conn.run)
        return Channel(ours, f"backend {address}")


class LaneRig(Rig):
    def __init__(self, nursery: trio.Nursery, config=None, hooks=None, tcp: bool = False, **options: Any) -> None:
        options.setdefault("server", SocketServer(nursery, tcp))
        super().__init__(nursery, config, hooks, **options)

    def connect(self, peer: str | None = None) -> trio.SocketStream:  # type: ignore[override]
        ours, theirs = socket.socketpair()
        self.nursery.start_soon(self.proxy.handle_client, Channel(theirs, "client"), peer or self.peer)
        return trio.SocketStream(trio.socket.from_stdlib_socket(ours))

    async def client(self, peer: str | None = None, *, login: bool = True, password: str = "apppw", **options: Any) -> FakeClient:
        client = FakeClient(self.connect(peer), **options)  # type: ignore[arg-type]
        if login:
            await client.login(password=password)
        return client

    def session(self):
        [session] = list(self.proxy.target.sessions)
        return session


class Wakes(trio.abc.Instrument):
    """Steps of the sessions' two tasks, by task (client_task, BackendTask._run)."""

    def __init__(self) -> None:
        self.steps: Counter[str] = Counter()

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        name = task.name.rsplit(".", 1)[-1]
        if name in ("client_task", "_run"):
            self.steps[name] += 1

    def __enter__(self) -> Wakes:
        trio.lowlevel.add_instrument(self)
        return self

    def __exit__(self, *exc: object) -> None:
        trio.lowlevel.remove_instrument(self)
