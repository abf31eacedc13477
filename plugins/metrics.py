"""metrics: per-statement Prometheus metrics, in the proxy's ``/metrics`` on the admin endpoint.

The proxy itself exports sessions, recoveries, held time, backends, reloads and ``process_*``
(``proxy.stats``); this plugin adds what only it measures, per command, so the two never
export the same family (a scrape has one family per name).

Options (``[plugins.metrics]``):

- ``statement_kinds`` (default true): label statements with their kind (insert, select,
  commit, ... from ``proxy.sqltext``); false labels by command only, which skips
  classifying each statement's text.
- ``latency_buckets``: histogram buckets in seconds for the statement latency (default from
  0.5 ms to 60 s).
- ``process_metrics``: obsolete, accepted so older configs still load; the proxy exports the
  process's CPU, memory and open files itself (``false`` is logged as having no effect).

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
- ``replay_proxy_backend_lost_total``: backend connections lost under a session.
- ``replay_proxy_replays_total``: recoveries that replayed statements on the new connection
  (the statements themselves: the proxy's ``replay_proxy_replayed_statements_total``).
- ``replay_proxy_oversized_packets_total``: commands refused with 1153.

Cheap per statement: the hot path is one dict lookup and a few integer additions on plain
Python objects (one per command/kind pair, made on first sight); the Prometheus metric families
are built from them only when /metrics is scraped: the plugin is a prometheus_client collector
(``collect()``), and the proxy gathers its families into the target's one registry (each
plugin instance has its own counters: several targets or tests never share them). The proxy is
single-threaded (trio), so no locks are needed on the hot path.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from typing import Annotated, Any

import attrs
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from proxy.hooks import CommandInfo, ResultInfo, SessionInfo
from proxy.plugin_loader import Check, PluginContext

__all__ = ["Plugin"]

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


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
        process_metrics: bool | None = None  # obsolete: the proxy exports process_* itself

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
        self.backend_lost_count = 0
        self.replays = 0
        self.oversized = 0
        if options.process_metrics is False:
            context.log.warning("[plugins.metrics] process_metrics = false has no effect: the proxy exports process_* "
                                "itself; remove the option")  # fmt: skip

    # --- hooks ----------------------------------------------------------------------------------

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
        if info.get("replayed"):
            self.replays += 1

    def oversized_packet(self, session: SessionInfo, size: int, limit: int) -> None:
        self.oversized += 1

    # --- /metrics -------------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        """The Prometheus view of the counters, built at scrape time (``proxy.stats`` gathers
        it into the target's /metrics)."""
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
        yield counter("backend_lost", "Backend connections lost under a session", value=self.backend_lost_count)
        yield counter("replays", "Recoveries that replayed statements on the new backend connection", value=self.replays)
        yield counter("oversized_packets", "Commands refused for exceeding max_allowed_packet", value=self.oversized)
