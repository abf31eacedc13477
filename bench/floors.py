"""The event loops' floors: two bare byte pumps run as intermediaries, like HAProxy.

- ``trio``: trio, two tasks per connection, ``trio.SocketStream`` receive_some / send_all: what
  any trio relay costs before it looks at a single byte;
- ``uvloop``: an asyncio ``Protocol`` pair on uvloop: callbacks, no tasks, libuv's loop in C;
- ``netio``: trio, two tasks per connection, over the proxy's own socket layer
  (``proxy.netio.Channel``: raw non-blocking sockets, parking in trio only on "would block"):
  the proxy's relay with every decision taken out, so the proxy minus it is what its session
  tracking, journal and recovery bookkeeping cost.

They parse nothing: a MySQL session passes through unchanged. The proxy's CPU per statement is
compared with the trio pump's (bench/report.py): what the proxy's own work costs on top of its
event loop.

Run one: ``python -m bench.floors trio --port P --backend-port B [--counts FILE]`` (``--counts``:
count trio's scheduler steps and I/O waits, bench/instrument.py). ``Floor`` starts one as a
subprocess, waits until it listens and stops it (also at interpreter exit), as bench/haproxy.py
does for HAProxy.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from bench import REPO
from tests.lab.procs import ListeningChild

if TYPE_CHECKING:
    from bench.callgrind import Wrap

KINDS = ("trio", "uvloop", "netio")
BUFSIZE = 256 * 1024


# -- the pumps (the child process) ---------------------------------------------------------------


async def _serve_until_sigterm(handle, port: int) -> None:
    """Serve ``handle`` on 127.0.0.1:``port`` until SIGTERM."""
    import trio

    async with trio.open_nursery() as nursery:
        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            await nursery.start(partial(trio.serve_tcp, handle, port, host="127.0.0.1", backlog=4096))
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


async def trio_pump(port: int, backend_port: int) -> None:
    import trio

    async def pipe(src: trio.SocketStream, dst: trio.SocketStream, done: trio.CancelScope) -> None:
        try:
            while data := await src.receive_some(BUFSIZE):
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        done.cancel()  # either side gone: the connection is over

    async def handle(client: trio.SocketStream) -> None:
        try:
            server = await trio.open_tcp_stream("127.0.0.1", backend_port)
        except OSError:
            await client.aclose()
            return
        async with client, server, trio.open_nursery() as nursery:
            nursery.start_soon(pipe, client, server, nursery.cancel_scope)
            nursery.start_soon(pipe, server, client, nursery.cancel_scope)

    await _serve_until_sigterm(handle, port)


async def netio_pump(port: int, backend_port: int) -> None:
    import socket

    import trio

    from proxy.netio import Channel, PeerClosed, open_tcp

    async def pipe(src: Channel, dst: Channel, done: trio.CancelScope) -> None:
        try:
            while True:  # request and answer: the other side is busy with what was just sent
                await dst.send(await src.recv(wait_first=True))
        except PeerClosed:
            pass
        done.cancel()

    async def handle(stream: trio.SocketStream) -> None:
        client = Channel(socket.socket(fileno=stream.socket.detach()), "client")
        try:
            server = await open_tcp("127.0.0.1", backend_port, "server")
        except OSError:
            client.close()
            return
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pipe, client, server, nursery.cancel_scope)
                nursery.start_soon(pipe, server, client, nursery.cancel_scope)
        finally:
            client.close()
            server.close()

    await _serve_until_sigterm(handle, port)


def uvloop_pump(port: int, backend_port: int) -> None:
    import asyncio

    import uvloop

    class Side(asyncio.Protocol):
        """One socket; ``peer`` is the other side. A peer that cannot write pauses our reads."""

        def __init__(self, peer: Side | None = None) -> None:
            self.peer, self.transport = peer, None

        def connection_made(self, transport: asyncio.Transport) -> None:
            self.transport = transport
            if self.peer is not None:  # the server side: the client side may read now
                self.peer.peer = self
                self.peer.transport.resume_reading()
            else:  # a client: connect to the server before reading anything
                transport.pause_reading()
                asyncio.get_running_loop().create_task(self.connect())

        async def connect(self) -> None:
            try:
                await asyncio.get_running_loop().create_connection(lambda: Side(self), "127.0.0.1", backend_port)
            except OSError:
                self.transport.close()
                return
            if self.transport.is_closing():
                self.peer.transport.close()

        def data_received(self, data: bytes) -> None:
            self.peer.transport.write(data)

        def connection_lost(self, exc: Exception | None) -> None:
            if self.peer is not None and self.peer.transport is not None:
                self.peer.transport.close()

        def pause_writing(self) -> None:
            self.peer.transport.pause_reading()

        def resume_writing(self) -> None:
            self.peer.transport.resume_reading()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Side, "127.0.0.1", port, backlog=4096)
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        async with server:
            await stop.wait()

    uvloop.run(main())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.floors", description=__doc__.split("\n\n")[0])
    p.add_argument("kind", choices=KINDS)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--backend-port", type=int, required=True)
    p.add_argument("--counts", type=Path, help="trio and netio: write scheduler counts here on SIGUSR1 and at exit")
    args = p.parse_args(argv)
    if args.kind == "uvloop":
        uvloop_pump(args.port, args.backend_port)
        return 0
    import trio

    instruments = []
    if args.counts:
        from bench.instrument import LoopCounter, dump_on_signal

        counter = LoopCounter()
        dump_on_signal(counter, args.counts)
        instruments.append(counter)
    try:
        trio.run(netio_pump if args.kind == "netio" else trio_pump, args.port, args.backend_port, instruments=instruments)
    except KeyboardInterrupt:
        pass
    finally:
        if args.counts:
            counter.dump(args.counts, final=True)
    return 0


# -- the parent side: a Floor is started and stopped like bench.haproxy.HAProxy ------------------


def floor_unavailable_reason(kind: str) -> str | None:
    if kind == "uvloop" and importlib.util.find_spec("uvloop") is None:
        return "uvloop is not installed (pip install uvloop, or pip install -e '.[bench]')"
    return None


class Floor(ListeningChild):
    """A floor pump as a child process of the benchmark."""

    def __init__(self, kind: str, workdir: Path, backend_port: int, counts: bool = False) -> None:
        from tests.lab.mariadb import free_port

        self.kind = kind
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.backend_port = backend_port
        self.log_path = self.workdir / f"{kind}_pump.log"
        self.counts_path = self.workdir / "loop-counts.json" if counts and kind != "uvloop" else None
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 20, wrap: Wrap | None = None) -> Floor:
        """``wrap``: run the pump under this command prefix and environment (bench/callgrind.py)."""
        reason = floor_unavailable_reason(self.kind)
        if reason:
            raise RuntimeError(reason)
        cmd = [sys.executable, "-m", "bench.floors", self.kind, "--port", str(self.port), "--backend-port", str(self.backend_port)]
        if self.counts_path is not None:
            cmd += ["--counts", str(self.counts_path)]
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        if wrap is not None:
            cmd, env = wrap.command(cmd), wrap.environment(env)
        self.launch(cmd, timeout, f"{self.kind} pump", cwd=REPO, env=env)
        return self


if __name__ == "__main__":
    sys.exit(main())
