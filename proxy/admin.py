"""The admin HTTP endpoint: ``/health`` always, plus routes that plugins provide (``/metrics``).

Deliberately tiny (HTTP/1.0, GET only, one request per connection): it serves scrapers and
probes on a local address, nothing else.
"""

from __future__ import annotations

import json
import logging
from typing import Callable

import trio

from proxy.config import Config
from proxy.hooks import Hooks

__all__ = ["serve_admin"]

log = logging.getLogger("replay_proxy.admin")

Route = Callable[[], tuple[int, str, bytes]]
_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 400: "Bad Request", 500: "Internal Server Error"}


def _routes(hooks: Hooks, proxy) -> dict[str, Route]:
    def health() -> tuple[int, str, bytes]:
        body = {"status": "ok", "target": proxy.target.name, "sessions": len(proxy.target.sessions)}
        return 200, "application/json", json.dumps(body).encode()

    routes: dict[str, Route] = {"/health": health}
    for name, plugin in hooks.plugins:
        provider = getattr(plugin, "http_routes", None)
        if provider is not None:
            for path, handler in provider().items():
                if path in routes:
                    raise ValueError(f"plugin {name}: admin path {path} is already served")
                routes[path] = handler
    return routes


async def serve_admin(config: Config, hooks: Hooks, proxy, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    routes = _routes(hooks, proxy)
    address = config.admin.address

    async def handle(stream: trio.SocketStream) -> None:
        try:
            with trio.move_on_after(5):
                request = b""
                while b"\r\n\r\n" not in request and b"\n\n" not in request and len(request) < 8192:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        break
                    request += chunk
                line = request.split(b"\r\n", 1)[0].decode("latin-1").split()
                if len(line) < 2:
                    status, ctype, body = 400, "text/plain", b"bad request\n"
                elif line[0] != "GET":
                    status, ctype, body = 405, "text/plain", b"GET only\n"
                else:
                    handler = routes.get(line[1].split("?", 1)[0])
                    if handler is None:
                        status, ctype, body = 404, "text/plain", b"not found\n"
                    else:
                        try:
                            status, ctype, body = handler()
                        except Exception:
                            log.exception("admin handler for %s failed", line[1])
                            status, ctype, body = 500, "text/plain", b"internal error\n"
                head = (
                    f"HTTP/1.0 {status} {_REASONS.get(status, 'OK')}\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                )
                await stream.send_all(head.encode() + body)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await stream.aclose()

    listeners = await trio.open_tcp_listeners(address.port, host=address.host)
    bound = listeners[0].socket.getsockname()[:2]
    log.info("admin endpoint on http://%s:%d (%s)", bound[0], bound[1], ", ".join(sorted(routes)))
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handle, listeners)
        task_status.started(bound)
