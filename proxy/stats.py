"""The proxy's own numbers: what /metrics and /status show.

Nothing here runs per statement: counts of commands come from the sessions themselves
(``Session.commands``) when a scrape asks, plus what closed sessions left behind; the rest is
counted where it happens (logins, recoveries, reloads), which is rare. ``Stats`` is given what
it reads (the target builds it): the sessions, as ``SessionFacts``; the backend addresses and
their health; readiness; the plugin chain in force.

/metrics is one exposition with one family per name. The proxy owns ``process_*``, build info,
sessions, recoveries, held time, backends and reloads; a plugin adds families of its own by
being a prometheus_client collector (a ``collect()`` method yielding metric families, as
plugins/metrics.py does), gathered into the same scrape. A plugin family whose name the proxy
or an earlier plugin already exports is a config error naming the plugin, found when the chain
is loaded (at start and at each SIGHUP: ``Stats.check_chain``), and a plugin that serves
``/metrics`` itself is refused the same way.
"""

from __future__ import annotations

import bisect
import logging
import platform
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, ProcessCollector, exposition
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from proxy.config import Address, ConfigError

if TYPE_CHECKING:
    from proxy.health import AddressHealth
    from proxy.hooks import Hooks

__all__ = ["Stats", "SessionFacts", "CONTENT_TYPE", "OUTCOMES", "family_names"]

log = logging.getLogger("replay_proxy.stats")

# The classic text format every Prometheus (and most scrapers) reads; newer clients default to 1.0.0.
CONTENT_TYPE = getattr(exposition, "CONTENT_TYPE_PLAIN_0_0_4", exposition.CONTENT_TYPE_LATEST)
# How a recovery ended: resumed transparently; aborted with 1213 (retry) or 1158 (connection
# error); an operator's KILL passed on (1927).
OUTCOMES = ("resumed", "aborted_1213", "aborted_1158", "killed_1927")
HELD_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60)
BACKEND_STATES = ("up", "draining", "down", "unknown")  # proxy.health's states
# The series names a family takes in the text format, by type (prometheus_client's own rule).
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "summary": ("_sum", "_count", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "info": ("_info",),
}


def family_names(family: Metric) -> set[str]:
    """Every name ``family`` occupies in an exposition: its own and its series' (a counter
    ``x`` is written as ``x_total``, so a gauge ``x_total`` beside it would clash)."""
    return {family.name, *(family.name + s for s in _SUFFIXES.get(family.type, ())), *(s.name for s in family.samples)}


def _package_version() -> str:
    try:
        return version("replay-proxy")
    except PackageNotFoundError:
        return "unknown"


class SessionFacts(Protocol):
    """What /metrics and /status read of a logged-in session (``relay.session.Session``)."""

    id: int
    commands: int  # client commands received

    @property
    def in_transaction(self) -> bool: ...

    @property
    def backend_address(self) -> str | None:
        """Where its backend connection goes, while one is open."""

    def describe(self) -> dict[str, Any]:
        """Its line in /status."""


class Stats:
    def __init__(self, name: str, *, chain: Callable[[], Hooks], sessions: Callable[[], Collection[SessionFacts]],
                 addresses: Callable[[], list[Address]], health: Mapping[Address, AddressHealth], ready: Callable[[], bool]) -> None:  # fmt: skip
        self.name = name  # the target's
        self.chain = chain  # the plugin chain in force (a SIGHUP loads another)
        self.sessions = sessions  # the logged-in sessions
        self.addresses = addresses  # the configured backend addresses
        self.health = health  # every address checked, by address
        self.ready = ready  # what /readyz answers
        self.sessions_opened = 0
        self.commands_closed = 0  # commands of sessions that have ended
        self.logins_failed = 0
        self.logins_refused = 0  # before login: pending limits, blocked hosts, max_connections
        self.recoveries = dict.fromkeys(OUTCOMES, 0)
        self.replayed = 0
        self.held = [0] * (len(HELD_BUCKETS) + 1)
        self.held_sum = 0.0
        self.reloads = {"ok": 0, "rejected": 0}  # SIGHUPs, by outcome
        # Sessions this process took over from the old one of an upgrade (``proxy.handover``):
        # moved with their connections, refused by this process, or left to drain there.
        self.upgrade_sessions = {"moved": 0, "refused": 0, "drained": 0}
        self.upgrades_failed = 0  # upgrades of this process that failed (it serves on)
        # Sessions of a worker that died, taken over by this one (``proxy.handover.takeover``), by
        # where they stood: idle, in a transaction (lost: 1213 next), a command in flight
        # (recovered), or closed (an answer begun, or a record that cannot be trusted).
        self.takeover_sessions = {"idle": 0, "in_transaction": 0, "in_flight": 0, "closed": 0}
        self.last_reload_ok = True
        # backend.discovery: lookups by mode and outcome, when the last one answered (unix time),
        # addresses that appeared and disappeared.
        self.discovery_lookups: dict[tuple[str, str], int] = {}
        self.discovery_last_ok: float | None = None
        self.discovery_seconds = 0.0
        self.discovery_changes = {"added": 0, "removed": 0}
        self.config_loaded_at = time.time()  # unix time the config in force was loaded (start or reload)
        self.build = {"version": _package_version(), "python": platform.python_version()}
        self.process = ProcessCollector(registry=None)
        self._dropped: set[tuple[str, str]] = set()  # (plugin, family) clashes already logged
        self.registry = CollectorRegistry()
        self.registry.register(self)
        self.check_chain(chain())

    def session_closed(self, commands: int) -> None:
        self.commands_closed += commands

    def recovered(self, outcome: str, held: float, replayed: int = 0) -> None:
        self.recoveries[outcome] += 1
        self.replayed += replayed
        self.held[bisect.bisect_left(HELD_BUCKETS, held)] += 1
        self.held_sum += held

    def discovery_lookup(self, mode: str, ok: bool, seconds: float) -> None:
        key = (mode, "ok" if ok else "failed")
        self.discovery_lookups[key] = self.discovery_lookups.get(key, 0) + 1
        self.discovery_seconds = seconds
        if ok:
            self.discovery_last_ok = time.time()

    def discovery_changed(self, added: int, removed: int) -> None:
        self.discovery_changes["added"] += added
        self.discovery_changes["removed"] += removed

    def upgrade_failed(self) -> None:
        self.upgrades_failed += 1

    def reloaded(self, ok: bool) -> None:
        """A SIGHUP's outcome: the new config is in force (``ok``), or it was rejected and the
        running one kept."""
        self.reloads["ok" if ok else "rejected"] += 1
        self.last_reload_ok = ok
        if ok:
            self.config_loaded_at = time.time()

    def commands(self) -> int:
        return self.commands_closed + sum(s.commands for s in self.sessions())

    def render(self) -> bytes:
        return exposition.generate_latest(self.registry)

    # --- one family per name ------------------------------------------------------------------

    def check_chain(self, hooks) -> None:
        """Refuse a plugin chain whose metrics would clash with the proxy's or each other's:
        ConfigError naming the plugin and the family. The chain is closed first when refused
        (its plugins may have opened files); called for the chain a target starts with and for
        the one a SIGHUP loads, before it is used."""
        owners = dict.fromkeys((n for f in self.describe() for n in family_names(f)), "the proxy")
        try:
            for name, plugin in hooks.plugins:
                routes = getattr(plugin, "http_routes", None)
                if routes is not None and "/metrics" in routes():
                    raise ConfigError(f"$.plugins.chain: {name!r} serves /metrics, which the proxy serves: a plugin's "
                                      "metrics are the families its collect() yields, in the proxy's /metrics")  # fmt: skip
                for family in self._families_of(name, plugin, strict=True):
                    clash = sorted(family_names(family) & owners.keys())
                    if clash:
                        raise ConfigError(f"$.plugins.{name}: metric {family.name} clashes with {clash[0]}, which "
                                          f"{owners[clash[0]]} exports: a plugin exports only metrics of its own")  # fmt: skip
                    owners.update(dict.fromkeys(family_names(family), f"plugin {name!r}"))
        except ConfigError:
            hooks.close()
            raise

    @staticmethod
    def _families_of(name: str, plugin: Any, strict: bool = False) -> list[Metric]:
        collect = getattr(plugin, "collect", None)
        if not callable(collect):
            return []
        try:
            families = list(collect())
        except Exception as exc:
            if strict:
                raise ConfigError(f"$.plugins.{name}: collecting its metrics failed: {type(exc).__name__}: {exc}") from None
            log.exception("plugin %s: collecting its metrics failed (left out of this scrape)", name)
            return []
        bad = next((f for f in families if not isinstance(f, Metric)), None)
        if bad is not None:
            if strict:
                raise ConfigError(f"$.plugins.{name}: collect() must yield prometheus_client metric families, got {bad!r}")
            log.error("plugin %s: collect() yielded %r, not a metric family (its metrics left out of this scrape)", name, bad)
            return []
        return families

    def collect(self) -> Iterator[Metric]:
        """The Prometheus view, built at scrape time: the proxy's families, then each plugin's
        (a family whose name is taken is left out and logged once; check_chain refuses the
        clashes it can see at load, this catches a family a plugin only yields later)."""
        taken: set[str] = set()
        for family in self._core():
            taken |= family_names(family)
            yield family
        for name, plugin in self.chain().plugins:
            for family in self._families_of(name, plugin):
                names = family_names(family)
                if names & taken:
                    if (name, family.name) not in self._dropped:
                        self._dropped.add((name, family.name))
                        log.error("plugin %s: metric %s clashes with one already exported; left out of /metrics", name, family.name)
                    continue
                taken |= names
                yield family

    def describe(self) -> list[Metric]:
        """The proxy's own families (values aside): the names no plugin may take."""
        return list(self._core(describe=True))

    def _core(self, describe: bool = False) -> Iterable[Metric]:
        name = self.name

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

        yield from self.process.collect()
        yield gauge("build_info", "Always 1: the proxy's version and Python's", 1, ("version", "python"),
                    {(self.build["version"], self.build["python"]): 1})  # fmt: skip
        yield gauge(
            "ready", "1 while a backend address is usable (what /readyz answers 200 for), else 0", 0 if describe else float(self.ready())
        )
        sessions = list(self.sessions())
        yield gauge("sessions_open", "Logged-in client sessions", len(sessions))
        yield gauge("sessions_in_transaction", "Sessions inside a transaction", sum(s.in_transaction for s in sessions))
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
        health = self.health
        addresses = {str(a): None for a in (*self.addresses(), *health)}  # configured ones, and any still checked
        states = {str(a): h.state for a, h in health.items()}
        yield gauge("backend_up", "Backend address up (1) or draining or down (0) at its last health check; absent "
                    "until checked", 0, ("address",), {(a,): float(s == "up") for a, s in states.items() if s != "unknown"})  # fmt: skip
        yield gauge("backend_draining", "Backend address draining for a planned restart", 0, ("address",),
                    {(a,): float(s == "draining") for a, s in states.items()})  # fmt: skip
        yield gauge("backend_state", "Backend address health state (1 for the current one): up, draining, down, or "
                    "unknown (not checked yet, or checks off)", 0, ("address", "state"),
                    {(a, st): float(states.get(a, "unknown") == st) for a in addresses for st in BACKEND_STATES})  # fmt: skip
        connections = dict.fromkeys(addresses, 0)
        for s in sessions:
            key = s.backend_address
            if key is not None:
                connections[key] = connections.get(key, 0) + 1
        yield gauge("backend_connections", "Open backend connections of logged-in sessions, by address", 0, ("address",),
                    {(a,): n for a, n in connections.items()})  # fmt: skip
        yield gauge("backend_addresses", "Backend addresses in the live set (backend.addresses, or what backend.discovery found last)",
                    len(self.addresses()))  # fmt: skip
        yield counter("discovery_changes", "Backend addresses that appeared (added) in or disappeared (removed) from the live set",
                      0, ("change",), {(k,): n for k, n in self.discovery_changes.items()})  # fmt: skip
        yield counter("discovery_lookups", "Lookups of backend.discovery (dns, pd) by outcome: ok, or failed (the last set found kept)",
                      0, ("mode", "outcome"), {k: n for k, n in self.discovery_lookups.items()})  # fmt: skip
        if describe or self.discovery_last_ok is not None:
            yield gauge("discovery_last_success_timestamp_seconds", "Unix time of the last lookup of backend.discovery that answered",
                        self.discovery_last_ok or 0)  # fmt: skip
        yield counter("config_reloads", "Config reloads (SIGHUP) by outcome: ok, or rejected (the running config kept)", 0,
                      ("outcome",), {(o,): n for o, n in self.reloads.items()})  # fmt: skip
        yield counter("upgrade_sessions", "Sessions of the process this one took over from (an upgrade), by outcome: moved here with "
                      "their connections, refused here, or drained there", 0, ("outcome",),
                      {(o,): n for o, n in self.upgrade_sessions.items()})  # fmt: skip
        yield counter("takeover_sessions", "Sessions of a worker that died, taken over by this one (--workers N), by where they "
                      "stood: idle, in_transaction (its next statement gets 1213), in_flight (recovered), or closed", 0,
                      ("state",), {(k,): n for k, n in self.takeover_sessions.items()})  # fmt: skip
        yield counter("upgrades_failed", "Upgrades (SIGUSR2, replay-proxy upgrade) whose new process did not take over; this one serves on",
                      self.upgrades_failed)  # fmt: skip
        yield gauge("config_last_reload_successful", "1 unless the last reload (SIGHUP) was rejected", float(self.last_reload_ok))
        yield gauge("config_last_reload_success_timestamp_seconds",
                    "Unix time the config in force was loaded (at start, or by the last accepted reload)", self.config_loaded_at)  # fmt: skip

    def status(self) -> dict[str, Any]:
        """What /status shows: backends, sessions, totals (no statement text, no password)."""
        now_sessions = sorted(self.sessions(), key=lambda s: s.id)
        return {
            "target": self.name,
            "ready": self.ready(),
            "backends": [h.describe() for h in self.health.values()],
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
