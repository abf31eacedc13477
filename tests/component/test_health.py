"""proxy.health against a status port that misbehaves the way a stopping TiDB's does."""

from __future__ import annotations

import socket
import struct

import pytest
import trio

from proxy.health import http_status


async def test_a_status_port_that_resets_the_connection_is_no_answer_not_a_crash():
    """A TiDB shutting down resets the health check's connection to its status port. http_status
    raised trio.BrokenResourceError, which the health check did not expect: it ended the proxy
    (a traceback, every session gone; seen in bench.chaos_matrix --server tidb). No answer is
    an OSError, as for a refused connection."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    async def reset_after_the_request(stream: trio.SocketStream) -> None:
        await stream.receive_some(4096)
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, reset_after_the_request, listeners)
        with pytest.raises(OSError):
            await http_status(f"http://127.0.0.1:{port}/status", 5)
        nursery.cancel_scope.cancel()
