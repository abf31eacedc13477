"""Health of every backend address, checked in the background.

Each ``backend.health_interval`` every address gets a SQL check (connect, log in as the first
configured user, COM_PING) and, when a status URL is known (``backend.status_port`` for TiDB's
status port, or ``backend.status_urls`` per address), an HTTP GET of it. TiDB answers 500 on
``/status`` from the moment it starts shutting down, for ``graceful-wait-before-shutdown``
seconds before it closes anything: that address is then *draining*. New sessions and
recoveries avoid draining and down addresses (while any other is usable), and the idle
sessions on a draining address move to a fresh connection between transactions, before the
server drops them (``relay.reconnect.migrate``): a planned restart costs no held request and
no replay. A crash is still handled by recovery.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import attrs
import trio

from proxy.backend import BackendError, connect_backend
from proxy.config import Address
from proxy.protocol.framing import encode_packet
from proxy.protocol.response import Expect

if TYPE_CHECKING:
    from proxy.target import Target

__all__ = ["AddressHealth", "HealthChecker", "http_status"]

log = logging.getLogger("replay_proxy.health")

UP, DRAINING, DOWN, UNKNOWN = "up", "draining", "down", "unknown"


@attrs.define
class AddressHealth:
    address: Address
    status_url: str | None = None
    state: str = UNKNOWN
    since: float = 0.0  # when the state last changed (trio clock)
    checked_at: float | None = None
    error: str | None = None  # why it is not up

    @property
    def usable(self) -> bool:
        """May new connections go there? (Unknown: not checked yet, so yes.)"""
        return self.state in (UP, UNKNOWN)

    def describe(self) -> dict[str, Any]:
        return {
            "address": str(self.address),
            "state": self.state,
            "since_s": round(trio.current_time() - self.since, 1),
            "status_url": self.status_url,
            "error": self.error,
        }


async def http_status(url: str, timeout: float) -> int:
    """The status code of ``GET url`` (http only: the TiDB status port). Raises OSError /
    trio.TooSlowError / ValueError when there is no proper answer."""
    if not url.startswith("http://"):
        raise ValueError(f"only http:// status URLs are supported, not {url!r}")
    rest = url[len("http://") :]
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.rpartition(":")
    host = host.strip("[]") or hostport
    port_no = int(port) if port.isdigit() else 80
    with trio.fail_after(timeout):
        stream = await trio.open_tcp_stream(host, port_no)
        async with stream:
            try:
                await stream.send_all(f"GET /{path} HTTP/1.0\r\nHost: {hostport}\r\n\r\n".encode())
                head = b""
                while b"\r\n" not in head and len(head) < 4096:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        break
                    head += chunk
            except trio.BrokenResourceError as exc:  # reset: a TiDB closing its status port
                raise OSError(f"{url}: {exc}") from exc
    parts = head.split(b"\r\n", 1)[0].split()
    if len(parts) < 2 or not parts[1].isdigit():
        raise ValueError(f"no HTTP status line from {url}")
    return int(parts[1])


class HealthChecker:
    def __init__(self, target: Target) -> None:
        self.target = target

    def status_url(self, address: Address) -> str | None:
        backend = self.target.config.backend
        url = backend.status_urls.get(str(address))
        if url is None and backend.status_port:
            host = f"[{address.host}]" if ":" in address.host else address.host
            url = f"http://{host}:{backend.status_port}{backend.status_path}"
        return url

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            interval = self.target.config.backend.health_interval
            if interval <= 0:
                await trio.sleep(1)  # off (a reload may turn it on)
                continue
            async with trio.open_nursery() as nursery:
                for address in self.target.addresses:
                    nursery.start_soon(self.check, address)
            await trio.sleep(interval)

    async def check(self, address: Address) -> None:
        health = self.target.health_of(address)
        health.status_url = self.status_url(address)
        state, error = await self._probe(address, health.status_url)
        health.checked_at = trio.current_time()
        health.error = error
        if state != health.state:
            previous, health.state, health.since = health.state, state, trio.current_time()
            if previous != UNKNOWN or state != UP:
                log.warning("backend %s is %s (was %s)%s", address, state, previous, f": {error}" if error else "")
            if state in (DRAINING, DOWN):
                self.target.backend_unusable(address, state)

    async def _probe(self, address: Address, status_url: str | None) -> tuple[str, str | None]:
        config = self.target.config.backend
        timeout = min(config.connect_timeout, max(config.health_interval, 0.5))
        if status_url is not None:
            try:
                code = await http_status(status_url, timeout)
            except (OSError, trio.TooSlowError, ValueError) as exc:
                code, status_error = None, f"status {status_url}: {exc or 'no answer'}"
            else:
                status_error = None
            if code is not None and code != 200:
                return DRAINING, f"status {status_url} answers {code}"
        else:
            status_error = None
        login = self.target.health_login()
        if login is None:
            return UP, status_error  # no user to log in with: the status port alone
        try:
            backend = await connect_backend(address, login, connect_timeout=timeout, io_timeout=timeout, opener=self.target.opener)
        except BackendError as exc:
            return DOWN, str(exc)
        try:
            with trio.fail_after(timeout):
                tracker = await backend.exchange(encode_packet(b"\x0e", 0)[0], Expect.SINGLE)
            if tracker.error is not None:
                return DOWN, f"COM_PING: {tracker.error}"
        except Exception as exc:  # noqa: BLE001 - any failure of the probe means "not up"
            return DOWN, f"COM_PING: {type(exc).__name__}: {exc}"
        finally:
            backend.channel.send_nowait(encode_packet(b"\x01", 0)[0])
            backend.close()
        return UP, status_error
