"""Health of every backend address, checked in the background.

Each ``backend.health_interval`` every address gets a SQL check (connect, log in as the first
configured user, COM_PING) and, when a status URL is known (``backend.status_port`` for TiDB's
status port, or ``backend.status_urls`` per address), an HTTP GET of it (``https://`` with
``[backend.tls]``'s CA and client certificate, ``StatusProbe``). TiDB answers 500 on
``/status`` from the moment it starts shutting down, for ``graceful-wait-before-shutdown``
seconds before it closes anything: that address is then *draining*. New sessions and
recoveries avoid draining and down addresses (while any other is usable), and the idle
sessions on a draining address move to a fresh connection between transactions, before the
server drops them (``relay.reconnect.migrate``): a planned restart costs no held request and
no replay. A crash is still handled by recovery.

A check that gets no answer at all (no SYN-ACK, no greeting, no answer to COM_PING within its
timeout) is *silent*: a partition, or a hung server whose kernel still ACKs. An address silent
for ``backend.dead_after`` has the connections opened there before cut
(``Target.backend_unreachable``): its sessions would otherwise wait for TCP to give up, or for
ever. A refusal or an ERR is an answer, and a long statement runs on a server that answers its
checks: neither cuts anything.
"""

from __future__ import annotations

import logging
import re
import ssl
from collections.abc import Callable
from typing import Any, Protocol

import attrs
import httpx
import trio

from proxy.backend import BackendError, Login, connect_backend
from proxy.config import Address, BackendConfig, BackendTLSConfig, Config
from proxy.protocol.framing import encode_packet
from proxy.protocol.response import Expect
from proxy.tls import backend_tls

__all__ = ["AddressHealth", "HealthChecker", "CheckedTarget", "StatusProbe", "status_url"]

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
    # A session's connection there was just dropped by the server, or a login failed: new
    # connections try the other addresses first until then (trio clock), without waiting for
    # the next check. A server going down drops every session at once; each reconnecting to
    # it while it still accepts would wait for its exit.
    suspect_until: float = 0.0
    # Since when every check got no answer at all (a partition, a hung server: no SYN-ACK, no
    # greeting, no answer to COM_PING); None once anything answers, even with an error.
    silent_since: float | None = None
    # When a session's login there last succeeded: an answer too, so a silence counts from
    # then at the earliest (a check begun before it and ended silent after it says nothing of
    # the connection that login opened).
    answered_at: float = float("-inf")

    def answered(self) -> None:
        """A session's login succeeded here (see ``answered_at``)."""
        self.answered_at = trio.current_time()
        self.silent_since = None

    @property
    def usable(self) -> bool:
        """May new connections go there? (Unknown: not checked yet, so yes.)"""
        return self.state in (UP, UNKNOWN)

    @property
    def suspect(self) -> bool:
        return trio.current_time() < self.suspect_until

    def describe(self) -> dict[str, Any]:
        return {
            "address": str(self.address),
            "state": self.state,
            "since_s": round(trio.current_time() - self.since, 1),
            "status_url": self.status_url,
            "error": self.error,
            "silent_s": None if self.silent_since is None else round(trio.current_time() - self.silent_since, 1),
        }


def status_url(backend: BackendConfig, address: Address, registered_port: int | None = None) -> str | None:
    """The status URL of ``address``: its ``status_urls`` entry, else ``status_port`` on its
    host, else the status port the server registered (``discovery = "pd"``), with
    ``status_scheme``."""
    url = backend.status_urls.get(str(address))
    port = backend.status_port or registered_port
    if url is None and port:
        host = f"[{address.host}]" if ":" in address.host else address.host
        url = f"{backend.status_scheme}://{host}:{port}{backend.status_path}"
    return url


class StatusProbe:
    """GETs of status URLs (TiDB's status port) through one ``httpx.AsyncClient``, which is
    costly to make (its pool, its TLS context): one per checker, closed by ``aclose``.

    ``https://`` URLs use ``[backend.tls]``: a cluster with TLS between its components serves
    the status port over HTTPS and asks for a client certificate (TiDB's cluster-ssl-*), so
    the CA, the client certificate and key, the mode (unverified for "preferred" /
    "required", the chain for "verify-ca", and the name for "verify-identity") and
    ``server_name`` are the SQL login's. With mode "off" an https URL is verified against
    the system's CAs."""

    def __init__(self, tls: BackendTLSConfig) -> None:
        self.tls = tls
        backend = backend_tls(tls)
        context = backend.context if backend is not None else ssl.create_default_context()
        self._sni = tls.server_name
        # trust_env off: no HTTP(S)_PROXY or SSL_CERT_FILE from the environment between the
        # proxy and its own backend's status port.
        self._client = httpx.AsyncClient(verify=context, trust_env=False, follow_redirects=False)

    async def status(self, url: str, timeout: float) -> int:
        """The status code of ``GET url``. Raises OSError (refused, reset, closed, TLS refused,
        not HTTP), trio.TooSlowError (no answer within ``timeout``) or ValueError (not an
        http(s) URL)."""
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"a status URL is http:// or https://, not {url!r}")
        extensions = {"sni_hostname": self._sni} if self._sni and url.startswith("https://") else None
        with trio.fail_after(timeout):
            try:
                response = await self._client.get(url, timeout=timeout, extensions=extensions)
            except httpx.TimeoutException:
                raise trio.TooSlowError from None
            except httpx.HTTPError as exc:  # refused, reset (a TiDB closing its status port), TLS, garbage
                hint = ""
                if url.startswith("https://") and isinstance(exc, httpx.RemoteProtocolError):
                    # TLS 1.3: the server checks the client certificate after the handshake
                    hint = "; over TLS this is also how a status port refuses the client certificate: check backend.tls cert and key"
                raise OSError(f"{url}: {_reason(exc).rstrip('.')}{hint}") from None
        return response.status_code

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await self._client.aclose()


_SSL_SUFFIX = re.compile(r"\s*\(_ssl\.c:\d+\)$")


def _reason(exc: BaseException) -> str:
    """The innermost cause of an httpx error, as one line ("TLS: certificate verify failed:
    self-signed certificate in certificate chain", "Connection refused"): httpx and httpcore
    wrap it in errors of their own, often without a message."""
    chain: list[BaseException] = []
    at: BaseException | None = exc
    while at is not None and at not in chain and len(chain) < 20:
        chain.append(at)
        if isinstance(at, BaseExceptionGroup) and at.exceptions:
            at = at.exceptions[0]  # trio's "all attempts to connect failed": the first attempt's
        else:
            at = at.__cause__ or at.__context__
    found = [e for e in chain if isinstance(e, ssl.SSLError)] or [e for e in chain if str(e)] or chain
    inner = found[-1]
    if isinstance(inner, ssl.SSLCertVerificationError):
        return f"TLS: certificate verify failed: {inner.verify_message or inner.reason}"
    if isinstance(inner, ssl.SSLError):
        return "TLS: " + _SSL_SUFFIX.sub("", str(inner))
    if isinstance(inner, OSError) and inner.strerror:
        return inner.strerror
    return f"{type(inner).__name__}: {inner}" if str(inner) else type(inner).__name__


class CheckedTarget(Protocol):
    """What the checker uses of the target whose addresses it checks (``proxy.target.Target``)."""

    config: Config  # the one in force: a SIGHUP may change the addresses, the interval, [backend.tls]
    opener: Callable  # address -> Channel

    @property
    def addresses(self) -> list[Address]: ...

    def health_of(self, address: Address) -> AddressHealth:
        """The address's record, which the checker updates."""

    def health_login(self) -> Login | None:
        """How a check logs in (None: no user to log in as)."""

    def backend_unusable(self, address: Address, state: str) -> None:
        """``address`` became draining or down: its sessions move."""

    def backend_usable(self, address: Address) -> None:
        """``address`` became up: sessions may move to it (balance by connections)."""

    def rebalance(self) -> None:
        """After each round of checks: even out the sessions over the addresses that are up
        (balance by connections)."""

    def status_url(self, address: Address) -> str | None:
        """The status URL to GET for ``address`` (None: none known)."""

    def backend_unreachable(self, address: Address, since: float, why: str) -> None:
        """No check of ``address`` got an answer since ``since``, for ``backend.dead_after``:
        its sessions' connections are cut (recovery)."""


class HealthChecker:
    def __init__(self, target: CheckedTarget) -> None:
        self.target = target
        self._status: StatusProbe | None = None  # made at the first status URL; closed by aclose

    async def status_probe(self) -> StatusProbe:
        """The checker's one HTTP client, made again only when a reload changed [backend.tls]."""
        tls = self.target.config.backend.tls
        probe = self._status
        if probe is not None and probe.tls == tls:
            return probe
        new = self._status = StatusProbe(tls)  # before any await: concurrent checks share the new one
        if probe is not None:
            await probe.aclose()
        return new

    async def aclose(self) -> None:
        if self._status is not None:
            probe, self._status = self._status, None
            await probe.aclose()

    def status_url(self, address: Address) -> str | None:
        return self.target.status_url(address)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                interval = self.target.config.backend.health_interval
                if interval <= 0:
                    await trio.sleep(1)  # off (a reload may turn it on)
                    continue
                async with trio.open_nursery() as nursery:
                    for address in self.target.addresses:
                        nursery.start_soon(self.check, address)
                self.target.rebalance()
                await trio.sleep(interval)
        finally:
            await self.aclose()

    async def check(self, address: Address) -> None:
        health = self.target.health_of(address)
        health.status_url = self.status_url(address)
        began = trio.current_time()
        state, error, silent = await self._probe(address, health.status_url)
        health.checked_at = trio.current_time()
        health.error = error
        if not silent:
            health.silent_since = None
        elif health.silent_since is None:
            health.silent_since = max(began, health.answered_at)
        if state != health.state:
            previous, health.state, health.since = health.state, state, trio.current_time()
            if previous != UNKNOWN or state != UP:
                log.warning("backend %s is %s (was %s)%s", address, state, previous, f": {error}" if error else "")
            if state in (DRAINING, DOWN):
                self.target.backend_unusable(address, state)
            elif state == UP:
                self.target.backend_usable(address)
        dead_after = self.target.config.backend.dead_after
        if health.silent_since is not None and dead_after > 0 and health.checked_at - health.silent_since >= dead_after:
            # Not a long statement: the server answers no one. Waiting on would last until
            # TCP gives up (TCP_USER_TIMEOUT), or forever where its kernel still ACKs.
            self.target.backend_unreachable(address, health.silent_since, error or "no answer")

    async def _probe(self, address: Address, status_url: str | None) -> tuple[str, str | None, bool]:
        """(state, why not up, silent: the SQL check got no answer at all within its timeout)."""
        config = self.target.config.backend
        timeout = min(config.connect_timeout, max(config.health_interval, 0.5))
        if status_url is not None:
            try:
                code = await (await self.status_probe()).status(status_url, timeout)
            except (OSError, trio.TooSlowError, ValueError) as exc:
                code, status_error = None, f"status {status_url}: {exc or 'no answer'}"
            else:
                status_error = None
            if code is not None and code != 200:
                return DRAINING, f"status {status_url} answers {code}", False
        else:
            status_error = None
        login = self.target.health_login()
        if login is None:
            return UP, status_error, False  # no user to log in with: the status port alone
        try:
            backend = await connect_backend(address, login, connect_timeout=timeout, io_timeout=timeout, opener=self.target.opener)
        except BackendError as exc:
            return DOWN, str(exc), exc.silent
        try:
            with trio.fail_after(timeout):
                tracker = await backend.exchange(encode_packet(b"\x0e", 0)[0], Expect.SINGLE)
            if tracker.error is not None:
                return DOWN, f"COM_PING: {tracker.error}", False
        except trio.TooSlowError:
            return DOWN, f"COM_PING: no answer within {timeout:g}s", True
        except Exception as exc:  # noqa: BLE001 - any failure of the probe means "not up"
            return DOWN, f"COM_PING: {type(exc).__name__}: {exc}", False
        finally:
            backend.channel.send_nowait(encode_packet(b"\x01", 0)[0])
            backend.close()
        return UP, status_error, False
