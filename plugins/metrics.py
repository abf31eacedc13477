"""metrics: Prometheus metrics, served at ``/metrics`` on the admin endpoint.

Options (``[plugins.metrics]``):

- ``statement_kinds`` (default true): label statements with their kind (insert, select,
  commit, ... from ``proxy.sqltext``); false labels by command only, which skips
  classifying each statement's text.
- ``latency_buckets``: histogram buckets in seconds for the statement latency (default from
  0.5 ms to 60 s).
- ``process_metrics`` (default true): also export the process's CPU, memory and open files.

Metrics, each with a ``target`` label:

- ``replay_proxy_statements_total{command, kind}``: answered commands (``kind`` is empty for
  commands without statement text, such as COM_STMT_EXECUTE or COM_PING).
- ``replay_proxy_statement_latency_seconds{command, kind}``: histogram, from the command's
  arrival to the end of its response.
- ``replay_proxy_errors_total{code}``: ERR answers by MySQL error code (the server's, and the
  proxy's own such as 1142 from the firewall or 1226 from the throttle).
- ``replay_proxy_plugin_answers_total{plugin}``: commands a plugin answered instead of the server.
- ``replay_proxy_bytes_total{direction}``: ``request`` (command payloads) and ``response``
  (bytes sent to clients).
- ``replay_proxy_sessions``: open client sessions.
- ``replay_proxy_backend_lost_total``: backend connections lost under a session.
- ``replay_proxy_recoveries_total{plan}``: recoveries by outcome (resume, fail-retryable,
  fail-connection).
- ``replay_proxy_replays_total`` / ``replay_proxy_replayed_statements_total``: recoveries that
  replayed a transaction, and the statements replayed.
- ``replay_proxy_buffered_wait_seconds``: histogram of how long clients were held while the
  backend was away.
- ``replay_proxy_oversized_packets_total``: commands refused with 1153.

Cheap per statement: the hot path is one dict lookup and a few integer additions on plain
Python objects (one per command/kind pair, made on first sight); the Prometheus metric families
are built from them only when /metrics is scraped, through a collector in the plugin's own
registry (several targets or tests never share counters). The proxy is single-threaded (trio),
so no locks are needed on the hot path.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import attrs
from prometheus_client import CollectorRegistry, ProcessCollector, exposition
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from proxy.hooks import CommandInfo, ResultInfo, SessionInfo
from proxy.plugin_loader import Check, PluginContext

__all__ = ["Plugin"]

# The classic text format every Prometheus (and most scrapers) reads; newer clients default to 1.0.0.
CONTENT_TYPE = getattr(exposition, "CONTENT_TYPE_PLAIN_0_0_4", exposition.CONTENT_TYPE_LATEST)
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60)
PLANS = ("resume", "fail-retryable", "fail-connection")


def _increasing(value: list[float]) -> bool:
    return bool(value) and value[0] > 0 and all(a < b for a, b in zip(value, value[1:]))


Buckets = Annotated[list[float], Check(_increasing, "expected increasing positive numbers (seconds)")]


class Histogram:
    """Counts per bucket (not cumulative; the last one is +Inf) and the sum of observations."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # bucket "le" = first bound >= value
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        out, total = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts):
            total += n
            out.append((floatToGoString(bound), total))
        return out


class Plugin:
    @attrs.frozen
    class Options:
        statement_kinds: bool = True
        latency_buckets: Buckets | None = None
        process_metrics: bool = True

    def __init__(self, options: Options, context: PluginContext) -> None:
        self.target = context.target
        self.by_kind = options.statement_kinds
        self.latency_buckets = tuple(options.latency_buckets) if options.latency_buckets else LATENCY_BUCKETS
        # (command code, Kind or None) -> (command name, kind label, latency histogram)
        self.statements: dict[tuple[int, Any], tuple[str, str, Histogram]] = {}
        self.errors: dict[int, int] = {}
        self.answers: dict[str, int] = {}
        self.request_bytes = 0
        self.response_bytes = 0
        self.sessions = 0
        self.backend_lost_count = 0
        self.recoveries = dict.fromkeys(PLANS, 0)
        self.replays = 0
        self.replayed = 0
        self.waited = Histogram(WAIT_BUCKETS)
        self.oversized = 0
        self.registry = CollectorRegistry()
        self.registry.register(self)
        if options.process_metrics:
            ProcessCollector(registry=self.registry)

    # --- hooks ----------------------------------------------------------------------------------

    def session_opened(self, session: SessionInfo) -> None:
        self.sessions += 1

    def session_closed(self, session: SessionInfo) -> None:
        self.sessions -= 1

    def result_received(self, session: SessionInfo, command: CommandInfo, result: ResultInfo) -> None:
        key = (command.code, command.kind if self.by_kind else None)
        entry = self.statements.get(key)
        if entry is None:
            kind = key[1].value if key[1] is not None else ""
            entry = self.statements[key] = (command.name, kind, Histogram(self.latency_buckets))
        entry[2].observe(result.latency)
        self.request_bytes += len(command.payload)
        self.response_bytes += result.bytes
        if result.error_code is not None:
            self.errors[result.error_code] = self.errors.get(result.error_code, 0) + 1
        if result.answered_by is not None:
            self.answers[result.answered_by] = self.answers.get(result.answered_by, 0) + 1

    def backend_lost(self, session: SessionInfo, reason: str) -> None:
        self.backend_lost_count += 1

    def backend_recovered(self, session: SessionInfo, info: dict[str, Any]) -> None:
        plan = str(info.get("plan", ""))
        self.recoveries[plan] = self.recoveries.get(plan, 0) + 1  # an outcome added later still counts
        replayed = info.get("replayed") or 0
        if replayed:
            self.replays += 1
            self.replayed += replayed
        waited = info.get("waited")
        if waited is not None:
            self.waited.observe(waited)

    def oversized_packet(self, session: SessionInfo, size: int, limit: int) -> None:
        self.oversized += 1

    # --- admin endpoint -------------------------------------------------------------------------

    def http_routes(self) -> dict[str, Callable[[], tuple[int, str, bytes]]]:
        return {"/metrics": self.render}

    def render(self) -> tuple[int, str, bytes]:
        return 200, CONTENT_TYPE, exposition.generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        """The Prometheus view of the counters, built at scrape time (the registry calls this)."""
        t = self.target

        def counter(name: str, doc: str, labels: tuple[str, ...] = (), values: dict | None = None, value: float = 0):
            family = CounterMetricFamily(f"replay_proxy_{name}", doc, labels=("target", *labels))
            for label_values, v in values.items() if values is not None else [((), value)]:
                family.add_metric((t, *label_values), v)
            return family

        statements = {(name, kind): h for name, kind, h in self.statements.values()}
        yield counter("statements", "Commands answered, by command and statement kind", ("command", "kind"),
                      {labels: h.count for labels, h in statements.items()})  # fmt: skip
        latency = HistogramMetricFamily(
            "replay_proxy_statement_latency_seconds", "Seconds from a command's arrival to the end of its response",
            labels=("target", "command", "kind"),
        )  # fmt: skip
        for (name, kind), h in statements.items():
            latency.add_metric((t, name, kind), h.cumulative(), h.sum)
        yield latency
        yield counter("errors", "ERR answers by MySQL error code", ("code",), {(str(c),): n for c, n in self.errors.items()})
        yield counter("plugin_answers", "Commands answered by a plugin instead of the server", ("plugin",),
                      {(p,): n for p, n in self.answers.items()})  # fmt: skip
        yield counter("bytes", "Bytes of commands (request) and of responses sent to clients (response)", ("direction",),
                      {("request",): self.request_bytes, ("response",): self.response_bytes})  # fmt: skip
        sessions = GaugeMetricFamily("replay_proxy_sessions", "Open client sessions", labels=("target",))
        sessions.add_metric((t,), self.sessions)
        yield sessions
        yield counter("backend_lost", "Backend connections lost under a session", value=self.backend_lost_count)
        yield counter("recoveries", "Backend losses handled, by outcome", ("plan",), {(p,): n for p, n in self.recoveries.items()})
        yield counter("replays", "Recoveries that replayed an open transaction", value=self.replays)
        yield counter("replayed_statements", "Statements replayed on a new backend connection", value=self.replayed)
        wait = HistogramMetricFamily(
            "replay_proxy_buffered_wait_seconds", "Seconds a client was held while the backend was away", labels=("target",)
        )
        wait.add_metric((t,), self.waited.cumulative(), self.waited.sum)
        yield wait
        yield counter("oversized_packets", "Commands refused for exceeding max_allowed_packet", value=self.oversized)
