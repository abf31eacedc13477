"""throttle: cap the statements per second sent to the target.

Options (``[plugins.throttle]``):

- ``rate``: statements per second for the whole target (all sessions together), > 0.
- ``burst``: statements that may go at once after a quiet period (the token bucket's size);
  default: ``rate`` rounded up.
- ``max_queue`` (default 100): statements that may wait for their turn at the same time.
- ``max_wait`` (default ``"5s"``): the longest a statement may be held.

Counted: COM_QUERY and COM_STMT_EXECUTE (what runs statements); pings, prepares and the like
pass freely. A statement over the rate waits its turn (first come, first served). When the queue
is full, or its turn would come later than ``max_wait``, it is answered at once with ERR 1226
(SQLSTATE 42000, the server's "user has exceeded the resource" error), for example ``User 'app'
has exceeded the 'statements per second' resource (target orders: rate 100/s, 100 waiting,
max_wait 5s; replay-proxy throttle)``. The statement did not run; the session and an open
transaction stay as they were. Time is trio's clock, so tests run it on the autojump clock.
"""

from __future__ import annotations

import math
from typing import Annotated

import attrs
import trio

from proxy.config import Duration
from proxy.hooks import CommandInfo, Reject, SessionInfo
from proxy.plugin_loader import PluginContext, at_least, greater_than

__all__ = ["Plugin"]

_COUNTED = frozenset({0x03, 0x17})  # COM_QUERY, COM_STMT_EXECUTE


class Plugin:
    @attrs.frozen
    class Options:
        rate: Annotated[float, greater_than(0)]
        burst: Annotated[int, at_least(1)] | None = None
        max_queue: Annotated[int, at_least(0)] = 100
        max_wait: Duration = Duration(5)

    def __init__(self, options: Options, context: PluginContext) -> None:
        self.target = context.target
        self.log = context.log
        self.rate = options.rate
        self.burst = options.burst if options.burst is not None else max(1, math.ceil(options.rate))
        self.max_queue = options.max_queue
        self.max_wait = float(options.max_wait)
        # Token bucket with reservations: a waiting statement takes its token in advance, so
        # ``tokens`` goes negative and each newcomer's turn comes after those already waiting.
        self.tokens = float(self.burst)
        self.updated: float | None = None
        self.waiting = 0
        self.rejected = 0  # statements refused so far (also for tests and curious operators)

    def _refill(self, now: float) -> None:
        if self.updated is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now

    async def command_received(self, session: SessionInfo, command: CommandInfo) -> Reject | None:
        if command.code not in _COUNTED:
            return None
        self._refill(trio.current_time())
        self.tokens -= 1
        if self.tokens >= 0:
            return None  # the common case: under the rate, no waiting
        wait = -self.tokens / self.rate
        if self.waiting >= self.max_queue or wait > self.max_wait:
            self.tokens += 1  # not going: give the reservation back
            return self._reject(session)
        self.waiting += 1
        try:
            await trio.sleep(wait)
        except BaseException:  # cancelled (client gone, shutdown): free the reserved turn
            self.tokens += 1
            raise
        finally:
            self.waiting -= 1
        return None

    def _reject(self, session: SessionInfo) -> Reject:
        self.rejected += 1
        if self.rejected == 1 or self.rejected % 1000 == 0:  # one line per burst of refusals, not per statement
            self.log.warning("target %s: throttle refused %d statement(s) so far (rate %g/s)", self.target, self.rejected, self.rate)
        message = (
            f"User '{session.user}' has exceeded the 'statements per second' resource (target {self.target}: "
            f"rate {self.rate:g}/s, {self.waiting} waiting, max_wait {self.max_wait:g}s; replay-proxy throttle)"
        )
        return Reject(1226, message, "42000")
