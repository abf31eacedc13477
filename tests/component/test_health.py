"""proxy.health against a status port that misbehaves the way a stopping TiDB's does, and
against one served over HTTPS with client certificates (TiDB with cluster-ssl-*), checked
with [backend.tls]'s CA, client certificate and key."""

from __future__ import annotations

import socket
import ssl
import struct

import pytest
import trio

from proxy.config import Address
from proxy.health import DRAINING, UP, HealthChecker, StatusProbe
from proxy.target import Target
from tests.component.fakes import make_config
from tests.component.test_tls import TLSFakeServer, certs  # noqa: F401 - certs: the module's fixture
from tests.lab.certs import make_certs

ADDRESS = "10.0.0.1:4000"


async def test_a_status_port_that_resets_the_connection_is_no_answer_not_a_crash():
    """A TiDB shutting down resets the health check's connection to its status port. The old
    http_status raised trio.BrokenResourceError, which the health check did not expect: it
    ended the proxy (a traceback, every session gone; seen in bench.chaos_matrix --server
    tidb). No answer is an OSError, as for a refused connection."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    async def reset_after_the_request(stream: trio.SocketStream) -> None:
        await stream.receive_some(4096)
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        await stream.aclose()

    probe = StatusProbe(make_config().backend.tls)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, reset_after_the_request, listeners)
            with pytest.raises(OSError):
                await probe.status(f"http://127.0.0.1:{port}/status", 5)
            nursery.cancel_scope.cancel()
    finally:
        await probe.aclose()


async def test_a_refused_status_port_and_a_silent_one():
    probe = StatusProbe(make_config().backend.tls)
    try:
        with socket.socket() as s:  # bound, not listening: refused
            s.bind(("127.0.0.1", 0))
            with pytest.raises(OSError, match="refused"):
                await probe.status(f"http://127.0.0.1:{s.getsockname()[1]}/status", 5)
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")  # accepts, never answers
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, lambda stream: trio.sleep_forever(), listeners)
            started = trio.current_time()
            with pytest.raises(trio.TooSlowError):
                await probe.status(f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}/status", 0.5)
            assert trio.current_time() - started < 2  # the timeout holds
            nursery.cancel_scope.cancel()
        with pytest.raises(ValueError, match="http:// or https://"):
            await probe.status("ftp://127.0.0.1/status", 1)
    finally:
        await probe.aclose()


class HttpsStatus:
    """A status port over HTTPS that requires a client certificate signed by ``certs.ca``;
    answers ``code`` to every GET and counts the requests it answered."""

    def __init__(self, certs) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(certs.server_cert, certs.server_key)
        self.context.verify_mode = ssl.CERT_REQUIRED
        self.context.load_verify_locations(cafile=str(certs.ca))
        self.code = 200
        self.answered = 0
        self.refused = 0  # TLS handshakes that failed (no or a wrong client certificate)
        self.port = 0

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_ssl_over_tcp_listeners(0, self.context, host="127.0.0.1", https_compatible=True)
        self.port = listeners[0].transport_listener.socket.getsockname()[1]
        await trio.serve_listeners(self._handle, listeners, task_status=task_status)

    async def _handle(self, stream: trio.SSLStream) -> None:
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    return
                head += chunk
            reason = {200: "OK", 500: "Internal Server Error"}.get(self.code, "X")
            await stream.send_all(f"HTTP/1.1 {self.code} {reason}\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok".encode())
            self.answered += 1
            await stream.aclose()
        except trio.BrokenResourceError:
            self.refused += 1

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/status"


def tls_config(certs, status_url: str, backend: dict | None = None, **tls):
    """verify-identity with the lab's CA and client certificate (``tls`` overrides keys)."""
    backend_tls = {"mode": "verify-identity", "ca": str(certs.ca), "cert": str(certs.client_cert),
                   "key": str(certs.client_key), "server_name": "localhost", **tls}  # fmt: skip
    return make_config(backend={"addresses": [ADDRESS], "tls": backend_tls, "status_urls": {ADDRESS: status_url}, **(backend or {})})


async def test_the_checker_sees_200_and_500_through_https_with_a_client_certificate(nursery, certs):
    status = HttpsStatus(certs)
    await nursery.start(status.serve)
    config = tls_config(certs, status.url)
    server = TLSFakeServer(nursery, certs)  # the SQL side over TLS too, with the same [backend.tls]
    target = Target(config, opener=server.opener)
    checker = HealthChecker(target)
    address = Address.parse(ADDRESS)
    try:
        await checker.check(address)
        health = target.health_of(address)
        assert (health.state, health.error) == (UP, None), health
        assert status.answered == 1 and status.refused == 0
        assert any(conn.secure for conn in server.connections)
        probe = checker._status
        status.code = 500  # TiDB's graceful shutdown has begun
        await checker.check(address)
        assert health.state == DRAINING and health.error == f"status {status.url} answers 500", health
        status.code = 200
        await checker.check(address)
        assert health.state == UP
        assert checker._status is probe and status.answered == 3  # one client for every check
    finally:
        await checker.aclose()
    assert probe is not None and probe._client.is_closed


async def test_the_checker_closes_its_client_when_it_stops(nursery, certs):
    status = HttpsStatus(certs)
    await nursery.start(status.serve)
    server = TLSFakeServer(nursery, certs)
    target = Target(tls_config(certs, status.url, {"health_interval": "50ms"}), opener=server.opener)
    checker = HealthChecker(target)
    async with trio.open_nursery() as own:
        own.start_soon(checker.run)
        with trio.fail_after(5):
            while status.answered < 3:
                await trio.sleep(0.02)
        probe = checker._status
        own.cancel_scope.cancel()
    assert probe is not None and probe._client.is_closed and checker._status is None
    assert status.answered >= 3 and target.health_of(Address.parse(ADDRESS)).state == UP


async def test_a_wrong_ca_fails_clearly(nursery, certs):
    status = HttpsStatus(certs)
    await nursery.start(status.serve)
    probe = StatusProbe(tls_config(certs, status.url, ca=str(certs.other_ca)).backend.tls)
    try:
        with pytest.raises(
            OSError,
            match=r"^https://127\.0\.0\.1:\d+/status: TLS: certificate verify failed: self-signed certificate in certificate chain$",
        ):
            await probe.status(status.url, 5)
    finally:
        await probe.aclose()
    assert status.answered == 0


async def test_a_status_port_refuses_a_client_without_a_certificate(nursery, certs):
    status = HttpsStatus(certs)
    await nursery.start(status.serve)
    config = make_config(
        backend={"addresses": [ADDRESS], "tls": {"mode": "verify-identity", "ca": str(certs.ca), "server_name": "localhost"}}
    )
    probe = StatusProbe(config.backend.tls)
    try:
        with pytest.raises(
            OSError,
            match=r"Server disconnected without sending a response; over TLS this is also how a status port refuses the client certificate: check backend.tls cert and key$",
        ):
            await probe.status(status.url, 5)
    finally:
        await probe.aclose()
    assert status.answered == 0


async def test_a_client_certificate_of_another_ca_is_refused(nursery, certs, tmp_path):
    stranger = make_certs(tmp_path / "other")  # a client certificate the status port's CA did not sign
    status = HttpsStatus(certs)
    await nursery.start(status.serve)
    probe = StatusProbe(tls_config(certs, status.url, cert=str(stranger.client_cert), key=str(stranger.client_key)).backend.tls)
    try:
        with pytest.raises(OSError, match=r"disconnected without sending a response; over TLS .*: check backend.tls cert and key$"):
            await probe.status(status.url, 5)
    finally:
        await probe.aclose()
    assert status.answered == 0


async def test_a_reload_that_changes_backend_tls_makes_a_new_client_and_closes_the_old(nursery, certs):
    status = HttpsStatus(certs)
    await nursery.start(status.serve)
    server = TLSFakeServer(nursery, certs)
    target = Target(tls_config(certs, status.url), opener=server.opener)
    checker = HealthChecker(target)
    try:
        first = await checker.status_probe()
        assert await checker.status_probe() is first
        target.config = tls_config(certs, status.url, ca=str(certs.other_ca))
        second = await checker.status_probe()
        assert second is not first and first._client.is_closed and not second._client.is_closed
    finally:
        await checker.aclose()
