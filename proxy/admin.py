"""The admin HTTP endpoint, for probes, scrapers and operators:

- ``/healthz``: 200 while the process runs (liveness); ``/health`` is the same;
- ``/readyz``: 200 when a backend address is usable, else 503 (readiness: take the pod out of
  a Service while its database is down);
- ``/metrics``: Prometheus metrics, one family per name: the proxy's own (build info,
  readiness, sessions, commands, recoveries by outcome, held time, backend health and
  connections, refused logins, config reloads, process) and those of plugins that collect
  their own, such as the metrics plugin (``proxy.stats``);
- ``/status``: JSON, the backends and their health, the sessions (user, client, backend,
  transaction state, recoveries); ``replay-proxy status`` prints it as a table;
- ``POST /upgrade``: start the code and config now on disk as a new process and hand it the
  listeners (``proxy.handover.upgrade``); the answer says when it serves, or why it could not
  (this process then keeps serving); ``replay-proxy upgrade`` asks it.

Deliberately tiny (HTTP/1.0, GET only but for /upgrade, one request per connection). It binds
loopback by default; bound elsewhere it requires ``Authorization: Bearer <admin.token>`` for
everything but /healthz and /readyz (probes carry no secrets). The token is the one of the config in
force at each request: a SIGHUP that changes ``admin.token`` (or ``token_env``) applies to the
next request.
"""

from __future__ import annotations

import functools
import hmac
import inspect
import json
import logging
import os
import socket
import urllib.parse
from collections.abc import Callable

import trio

from proxy.config import Config, ConfigError
from proxy.hooks import Hooks
from proxy.stats import CONTENT_TYPE

__all__ = ["serve_admin"]

log = logging.getLogger("replay_proxy.admin")

Route = Callable[[], tuple[int, str, bytes]]
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            409: "Conflict", 500: "Internal Server Error", 503: "Service Unavailable"}  # fmt: skip
_OPEN = frozenset({"/healthz", "/health", "/readyz"})  # probes: no token needed


def json_answer(status: int, body: object) -> tuple[int, str, bytes]:
    return status, "application/json", (json.dumps(body, indent=1) + "\n").encode()


def routes(proxy, upgrader=None) -> dict[str, Route]:
    """The proxy's routes and those plugins provide (read at each request: a SIGHUP may have
    changed the chain). ``upgrader``: a ``proxy.handover.upgrade.Upgrader`` for /upgrade."""
    target = proxy.target

    def healthz() -> tuple[int, str, bytes]:
        return json_answer(200, {"status": "alive", "target": target.name, "pid": os.getpid(), "sessions": len(target.sessions)})

    def readyz() -> tuple[int, str, bytes]:
        ready = target.ready()
        body = {"ready": ready, "target": target.name, "backends": [h.describe() for h in target.health.values()]}
        return json_answer(200 if ready else 503, body)

    def status() -> tuple[int, str, bytes]:
        return json_answer(200, target.stats.status())

    def metrics() -> tuple[int, str, bytes]:
        return 200, CONTENT_TYPE, target.stats.render()  # plugins' families included (Stats.collect)

    def session(query: dict[str, str]) -> tuple[int, str, bytes]:
        """A session's backend connection, for another worker translating ``KILL <id>``
        (``kill=1``: that KILL is about to be sent, as ``BackendLink.kill_relayed_now`` notes)."""
        found = target.session_by_id(int(query.get("id", "0") or 0)) if query.get("id", "").isdigit() else None
        backend = found.link.backend if found is not None else None
        if backend is None:
            return json_answer(404, {"error": "no such session"})
        if query.get("kill") == "1":
            found.link.kill_relayed_now(backend.connection_id)
        return json_answer(200, {"backend": str(backend.address), "backend_connection": backend.connection_id})

    session.wants_query = True  # type: ignore[attr-defined]
    table: dict[str, Route] = {"/healthz": healthz, "/health": healthz, "/readyz": readyz, "/status": status,
                               "/metrics": metrics}  # fmt: skip
    if proxy.worker is not None:  # between workers only, on their private ports (a KILL of another's session)
        table["/session"] = session
    if upgrader is not None:
        table["/upgrade"] = upgrade_route(upgrader)
    for path, handler in _plugin_routes(target.hooks).items():
        table.setdefault(path, handler)
    return table


def upgrade_route(upgrader, processes: int = 1) -> Route:
    """POST /upgrade: 200 once the new process serves (pids, listeners, sessions left to drain
    here, seconds), 500 with the reason when it could not start, 409 when one is under way.
    ``processes``: how many start one after the other (a supervisor's workers)."""
    from proxy.handover.upgrade import START_TIMEOUT, UpgradeFailed

    async def upgrade() -> tuple[int, str, bytes]:
        try:
            outcome = await upgrader.upgrade("admin request")
        except UpgradeFailed as exc:
            return json_answer(409 if exc.busy else 500, {"upgraded": False, "pid": os.getpid(), "error": str(exc)})
        return json_answer(200, {"upgraded": True, **vars(outcome)})

    upgrade.method = "POST"  # type: ignore[attr-defined]
    upgrade.seconds = (START_TIMEOUT + 20) * processes  # type: ignore[attr-defined]  # the new processes' start, not 5 s
    return upgrade


def _plugin_routes(hooks: Hooks) -> dict[str, Route]:
    out: dict[str, Route] = {}
    for name, plugin in hooks.plugins:
        provider = getattr(plugin, "http_routes", None)
        if provider is not None:
            for path, handler in provider().items():
                if path in out:
                    raise ValueError(f"plugin {name}: admin path {path} is already served")
                out[path] = handler
    return out


async def serve_admin(config: Config, hooks: Hooks, proxy, address=None, *, listeners=None, stop: trio.Event | None = None,
                      upgrader=None, task_status=trio.TASK_STATUS_IGNORED) -> None:  # fmt: skip
    """The proxy's admin endpoint (``address``: a worker's private one; default: the config's).
    The token is read from ``proxy.config`` at each request: the config a reload put in force.
    ``listeners``, ``stop``: as serve_routes; ``upgrader``: serve POST /upgrade."""
    await serve_routes(config, address or config.admin_address, lambda: routes(proxy, upgrader), task_status=task_status,
                       current_config=lambda: proxy.config, listeners=listeners, stop=stop)  # fmt: skip


async def open_listeners(config: Config, address, sockets: list[socket.socket] | None = None) -> list[trio.SocketListener]:
    """The admin endpoint's listeners: ``sockets`` handed over by the old process, or bound."""
    if sockets is not None:
        return [trio.SocketListener(trio.socket.from_stdlib_socket(sock)) for sock in sockets]
    try:
        return await trio.open_tcp_listeners(address.port, host=address.host)
    except OSError as exc:
        raise OSError(exc.errno, f"admin address {address} of target {config.name}: {exc.strerror} "
                                 "(set [admin] address, or enabled = false)") from None  # fmt: skip


async def serve_routes(config: Config, address, table_fn, *, task_status=trio.TASK_STATUS_IGNORED,
                       current_config: Callable[[], Config] | None = None, listeners: list[trio.SocketListener] | None = None,
                       stop: trio.Event | None = None) -> None:  # fmt: skip
    """Serve the routes ``table_fn()`` gives (sync or async handlers) on ``address``. On the
    config's admin address every path but the probes needs the bearer token of
    ``current_config()`` (default: ``config``), read at each request. ``listeners``: already
    open (open_listeners); ``stop``: once set, accept no more (the requests under way finish)."""
    guarded = address == config.admin_address  # a worker's private port: loopback, for the supervisor only

    def token() -> str | None:
        return (current_config or (lambda: config))().admin.resolved_token() if guarded else None

    async def handle(stream: trio.SocketStream) -> None:
        try:
            with trio.move_on_after(5) as deadline:
                request = b""
                while b"\r\n\r\n" not in request and b"\n\n" not in request and len(request) < 8192:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        break
                    request += chunk
                status, ctype, body = await _answer(request, table_fn(), token, deadline)
                head = (
                    f"HTTP/1.0 {status} {_REASONS.get(status, 'OK')}\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                )
                await stream.send_all(head.encode() + body)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await stream.aclose()

    if listeners is None:
        listeners = await open_listeners(config, address)
    bound = listeners[0].socket.getsockname()[:2]
    which = "admin endpoint" if address == config.admin_address else "worker's private admin endpoint (for the supervisor)"
    log.info("%s on http://%s:%d (%s)%s", which, bound[0], bound[1], ", ".join(sorted(table_fn())),
             "; a bearer token is required" if token() else "")  # fmt: skip
    async with trio.open_nursery() as handlers:
        async with trio.open_nursery() as accepting:
            await accepting.start(functools.partial(trio.serve_listeners, handle, listeners, handler_nursery=handlers))
            task_status.started(bound)
            if stop is not None:
                await stop.wait()
                accepting.cancel_scope.cancel()


async def _answer(request: bytes, table: dict[str, Route], token: Callable[[], str | None],
                  deadline: trio.CancelScope | None = None) -> tuple[int, str, bytes]:  # fmt: skip
    lines = request.split(b"\r\n")
    line = lines[0].decode("latin-1").split()
    if len(line) < 2:
        return 400, "text/plain", b"bad request\n"
    path, _, query = line[1].partition("?")
    handler = table.get(path)
    method = getattr(handler, "method", "GET")
    if line[0] != method:
        return 405, "text/plain", (b"GET only\n" if method == "GET" else f"{method} only\n".encode())
    if handler is None:
        return 404, "text/plain", b"not found\n"
    if path not in _OPEN:
        try:
            required = token()  # the config in force now: a reload may have changed it
        except ConfigError as exc:  # token_env unset: refuse rather than serve without the token
            log.error("admin request for %s refused: %s", path, exc)
            return 503, "text/plain", b"the admin token is not available (see the proxy's log)\n"
        if required is not None:
            given = next((h.split(b":", 1)[1].strip() for h in lines[1:] if h.lower().startswith(b"authorization:")), b"")
            if not hmac.compare_digest(given, b"Bearer " + required.encode()):
                return 401, "text/plain", b"a bearer token is required\n"
    if deadline is not None and hasattr(handler, "seconds"):  # a slow route (/upgrade) gets its own time
        deadline.deadline = max(deadline.deadline, trio.current_time() + handler.seconds)
    try:
        answer = handler(dict(urllib.parse.parse_qsl(query))) if getattr(handler, "wants_query", False) else handler()
        return await answer if inspect.isawaitable(answer) else answer
    except Exception:
        log.exception("admin handler for %s failed", path)
        return 500, "text/plain", b"internal error\n"
