"""The proxy across its own upgrades, for what upgrades it (test_upgrade, test_dm, bench.dm_e2e
--chaos): after the first upgrade the serving process is no test's child -- each is started by
the one before -- so it is followed by its pid, from the log line of each hand-over."""

from __future__ import annotations

import os
import re
import signal

from tests.lab.procs import alive, wait_for
from tests.lab.proxy import ProxyProcess

__all__ = ["SERVES_NOW", "Upgraded"]

SERVES_NOW = re.compile(r"upgrade: pid (\d+) serves now .* after ([0-9.]+)s; pid (\d+) stops accepting and drains (\d+) session")


class Upgraded:
    """The proxy across its upgrades: ``pid`` is the process serving now (after the first
    upgrade none is this test's child: each is started by the one before)."""

    def __init__(self, proxy: ProxyProcess) -> None:
        self.proxy = proxy
        self.pid = proxy.proc.pid
        self.handovers: list[float] = []  # seconds each took, as the old process logged it

    def handed_over(self) -> list[tuple[int, float, int, int]]:
        return [(int(n), float(s), int(o), int(d)) for n, s, o, d in SERVES_NOW.findall(self.proxy.log_text())]

    def signal_upgrade(self) -> int:
        """SIGUSR2; once the new process serves and the old one is gone, the new pid."""
        before = len(self.handed_over())
        os.kill(self.pid, signal.SIGUSR2)
        wait_for(lambda: len(self.handed_over()) > before, what=f"a hand-over after SIGUSR2 to pid {self.pid}")
        return self._moved(self.handed_over()[-1])

    def _moved(self, line: tuple[int, float, int, int]) -> int:
        new, seconds, old, _ = line
        assert old == self.pid
        wait_for(lambda: not alive(old), what=f"the old pid {old} to exit")
        if old == self.proxy.proc.pid:
            assert self.proxy.proc.wait(5) == 0
        self.pid = new
        self.handovers.append(seconds)
        return new

    def stop(self) -> str:
        if alive(self.pid):
            os.kill(self.pid, signal.SIGTERM)
            wait_for(lambda: not alive(self.pid), f"pid {self.pid} to stop", timeout=30)
        text = self.proxy.log_text()
        assert "Traceback" not in text, text[-5000:]
        return text
