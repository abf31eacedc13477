"""Who may talk to the proxy before logging in, and how much.

An unauthenticated socket costs a task and buffers; a flood of them must not lock real users
out or grow memory. So: a handshake packet is capped (``MAX_LOGIN_PACKET``); connections that
have not logged in yet are limited in total and per client host, apart from
``max_connections`` (which counts logged-in sessions only); a host whose logins keep failing
is refused for a while (ERR 1129, as the server's max_connect_errors does).
"""

from __future__ import annotations

import collections

import trio

from proxy.config import ListenConfig

__all__ = ["Admission", "MAX_LOGIN_PACKET"]

# A handshake response is a few hundred bytes plus connection attributes (at most 64 KiB on
# the server side); the auth-switch answers are smaller still.
MAX_LOGIN_PACKET = 80 * 1024
_MAX_HOSTS = 10_000  # hosts with failed logins remembered at once (oldest forgotten)


class Admission:
    def __init__(self, listen: ListenConfig) -> None:
        self.listen = listen
        self.pending = 0
        self._pending_by_host: collections.Counter[str] = collections.Counter()
        self._failures: collections.OrderedDict[str, collections.deque[float]] = collections.OrderedDict()

    def refusal(self, host: str) -> tuple[int, str, str] | None:
        """(code, sqlstate, message) refusing a new connection from ``host``, or None."""
        blocked = self._blocked_for(host)
        if blocked:
            return (
                1129,
                "HY000",
                f"Host '{host}' is blocked for {blocked:.0f}s after {self.listen.failed_login_limit} failed logins (replay-proxy)",
            )
        if self.pending >= self.listen.max_pending_logins:
            return (1040, "08004", "Too many connections waiting to log in (replay-proxy listen.max_pending_logins)")
        if self._pending_by_host[host] >= self.listen.max_pending_per_host:
            return (1040, "08004", f"Too many connections from '{host}' waiting to log in (replay-proxy listen.max_pending_per_host)")
        return None

    def enter(self, host: str) -> None:
        self.pending += 1
        self._pending_by_host[host] += 1

    def leave(self, host: str) -> None:
        self.pending -= 1
        self._pending_by_host[host] -= 1
        if self._pending_by_host[host] <= 0:
            del self._pending_by_host[host]

    def failed_login(self, host: str) -> None:
        times = self._failures.pop(host, None) or collections.deque(maxlen=self.listen.failed_login_limit)
        times.append(trio.current_time())
        self._failures[host] = times
        while len(self._failures) > _MAX_HOSTS:
            self._failures.popitem(last=False)

    def _blocked_for(self, host: str) -> float:
        """Seconds ``host`` stays blocked (0: not blocked)."""
        times = self._failures.get(host)
        if times is None or len(times) < self.listen.failed_login_limit:
            return 0.0
        left = times[0] + self.listen.failed_login_window - trio.current_time()
        if left <= 0:
            del self._failures[host]
            return 0.0
        return left
