"""The proxy's own numbers, without any plugin: what /metrics and /status show.

Nothing here runs per statement: counts of commands come from the sessions themselves
(``Session.commands``) when a scrape asks, plus what closed sessions left behind; the rest is
counted where it happens (logins, recoveries), which is rare.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, ProcessCollector, exposition
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    from proxy.target import Target

__all__ = ["Stats", "CONTENT_TYPE", "OUTCOMES"]

CONTENT_TYPE = getattr(exposition, "CONTENT_TYPE_PLAIN_0_0_4", exposition.CONTENT_TYPE_LATEST)
# How a recovery ended: resumed transparently; aborted with 1213 (retry) or 1158 (connection
# error); an operator's KILL passed on (1927).
OUTCOMES = ("resumed", "aborted_1213", "aborted_1158", "killed_1927")
HELD_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60)


class Stats:
    def __init__(self, target: Target) -> None:
        self.target = target
        self.sessions_opened = 0
        self.commands_closed = 0  # commands of sessions that have ended
        self.logins_failed = 0
        self.logins_refused = 0  # before login: pending limits, blocked hosts, max_connections
        self.recoveries = dict.fromkeys(OUTCOMES, 0)
        self.replayed = 0
        self.held = [0] * (len(HELD_BUCKETS) + 1)
        self.held_sum = 0.0
        self.registry = CollectorRegistry()
        self.registry.register(self)
        ProcessCollector(registry=self.registry)

    def session_closed(self, commands: int) -> None:
        self.commands_closed += commands

    def recovered(self, outcome: str, held: float, replayed: int = 0) -> None:
        self.recoveries[outcome] += 1
        self.replayed += replayed
        self.held[bisect.bisect_left(HELD_BUCKETS, held)] += 1
        self.held_sum += held

    def commands(self) -> int:
        return self.commands_closed + sum(s.commands for s in self.target.sessions)

    def render(self) -> bytes:
        return exposition.generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        """The Prometheus view, built at scrape time."""
        t = self.target
        name = t.name

        def gauge(metric: str, doc: str, value: float, labels: tuple[str, ...] = (), values: dict | None = None) -> Metric:
            family = GaugeMetricFamily(f"replay_proxy_{metric}", doc, labels=("target", *labels))
            for label_values, v in values.items() if values is not None else [((), value)]:
                family.add_metric((name, *label_values), v)
            return family

        def counter(metric: str, doc: str, value: float, labels: tuple[str, ...] = (), values: dict | None = None) -> Metric:
            family = CounterMetricFamily(f"replay_proxy_{metric}", doc, labels=("target", *labels))
            for label_values, v in values.items() if values is not None else [((), value)]:
                family.add_metric((name, *label_values), v)
            return family

        sessions = list(t.sessions)
        yield gauge("sessions_open", "Logged-in client sessions", len(sessions))
        yield gauge("sessions_in_transaction", "Sessions inside a transaction", sum(s.tracking.tx.active for s in sessions))
        yield counter("sessions_opened", "Client sessions that logged in", self.sessions_opened)
        yield counter("commands", "Client commands received", self.commands())
        yield counter("logins_failed", "Logins refused for wrong credentials", self.logins_failed)
        yield counter("connections_refused", "Connections refused before login (limits, blocked hosts)", self.logins_refused)
        yield counter("recoveries", "Backend losses handled, by outcome", 0, ("outcome",), {(o,): n for o, n in self.recoveries.items()})
        yield counter("replayed_statements", "Statements replayed on a new backend connection", self.replayed)
        held = HistogramMetricFamily("replay_proxy_held_seconds", "Seconds a session waited while its backend was away",
                                     labels=("target",))  # fmt: skip
        cumulative, total = [], 0
        for bound, n in zip((*HELD_BUCKETS, float("inf")), self.held):
            total += n
            cumulative.append((floatToGoString(bound), total))
        held.add_metric((name,), cumulative, self.held_sum)
        yield held
        health = t.health
        yield gauge("backend_up", "Backend address usable (1) or not (0)", 0, ("address",),
                    {(str(a),): float(h.usable) for a, h in health.items()})  # fmt: skip
        yield gauge("backend_draining", "Backend address draining for a planned restart", 0, ("address",),
                    {(str(a),): float(h.state == "draining") for a, h in health.items()})  # fmt: skip

    def status(self) -> dict[str, Any]:
        """What /status shows: backends, sessions, totals (no statement text, no password)."""
        t = self.target
        now_sessions = sorted(t.sessions, key=lambda s: s.id)
        return {
            "target": t.name,
            "ready": t.ready(),
            "backends": [h.describe() for h in t.health.values()],
            "sessions": [s.describe() for s in now_sessions],
            "totals": {
                "sessions_opened": self.sessions_opened,
                "commands": self.commands(),
                "logins_failed": self.logins_failed,
                "connections_refused": self.logins_refused,
                "recoveries": dict(self.recoveries),
                "replayed_statements": self.replayed,
            },
        }
