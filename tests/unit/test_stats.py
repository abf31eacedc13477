"""proxy.stats: one exposition, one family per name; the proxy's own families (build info,
backends, reloads) read from the state they describe; a SIGHUP's outcome counted.

The plugins below are loaded by name (``tests.unit.test_stats:<Class>``), as a config names them."""

from __future__ import annotations

import collections
import logging
import platform
from importlib.metadata import version
from types import SimpleNamespace

import pytest
import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from proxy import cli
from proxy.config import Address, ConfigError, parse_config
from proxy.frontend import Proxy
from proxy.plugin_loader import load_chain
from proxy.target import Target
from tests.lab.proxy import write_config

HERE = "tests.unit.test_stats"


class _Collector:
    """A plugin with one hook and the families ``families()`` yields."""

    closed = 0

    def session_opened(self, session) -> None:
        pass

    def close(self) -> None:
        _Collector.closed += 1

    def collect(self):
        yield from self.families()


class Own(_Collector):
    def families(self):
        family = CounterMetricFamily("replay_proxy_own_things", "Things only this plugin counts", labels=("target",))
        family.add_metric(("t",), 3)
        yield family


class SameAsTheProxy(_Collector):
    def families(self):
        yield GaugeMetricFamily("replay_proxy_sessions_open", "Open sessions, counted again", value=1)


class ClashesWithASuffix(_Collector):
    """A gauge named like the series of the proxy's counter replay_proxy_recoveries."""

    def families(self):
        yield GaugeMetricFamily("replay_proxy_recoveries_total", "Recoveries, as a gauge", value=1)


class SameAsOwn(_Collector):
    def families(self):
        yield GaugeMetricFamily("replay_proxy_own_things", "The same name as Own's", value=1)


class ProcessToo(_Collector):
    def families(self):
        yield GaugeMetricFamily("process_open_fds", "Open files, again", value=1)


class ServesMetrics(_Collector):
    def families(self):
        return iter(())

    def http_routes(self):
        return {"/metrics": lambda: (200, "text/plain", b"mine 1\n")}


class NotFamilies(_Collector):
    def families(self):
        yield "replay_proxy_text 1"


class Late(_Collector):
    """Yields a clashing family only after it was loaded (a family first seen at run time)."""

    late = False

    def families(self):
        yield from Own().families()
        if self.late:
            yield GaugeMetricFamily("replay_proxy_commands_total", "Commands, as a gauge", value=1)


class Broken(_Collector):
    fail = True

    def families(self):
        if self.fail:
            raise RuntimeError("no numbers today")
        yield from Own().families()


def config(chain: list[str], **sections):
    return parse_config({"name": "t", "backend": {"addresses": ["127.0.0.1:3306", "127.0.0.1:3307"]},
                         "users": [{"name": "app", "password": "apppw"}], "admin": {"enabled": False},
                         "plugins": {"chain": chain}, **sections})  # fmt: skip


def target(chain: list[str]) -> Target:
    cfg = config(chain)
    return Target(cfg, load_chain(cfg))


def parse(text: str) -> dict[str, object]:
    """Families by name; fails on a name seen twice."""
    families = list(text_string_to_metric_families(text))
    twice = [n for n, c in collections.Counter(f.name for f in families).items() if c > 1]
    assert not twice, f"families exported twice: {twice}"
    return {f.name: f for f in families}


def value(families: dict, sample: str, **labels: str) -> float:
    family = families[sample.removesuffix("_total")] if sample.removesuffix("_total") in families else families[sample]
    found = [s.value for s in family.samples if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (sample, labels, family.samples)
    return found[0]


# --- one family per name ------------------------------------------------------------------------


async def test_a_plugin_family_of_its_own_joins_the_proxys_exposition():
    families = parse(target([f"{HERE}:Own"]).stats.render().decode())
    assert value(families, "replay_proxy_own_things_total", target="t") == 3
    assert "replay_proxy_sessions_open" in families and "process_cpu_seconds" in families


@pytest.mark.parametrize(
    ("plugin", "message"),
    [
        ("SameAsTheProxy", r"^\$\.plugins\.tests\.unit\.test_stats:SameAsTheProxy: metric replay_proxy_sessions_open "
                           r"clashes with replay_proxy_sessions_open, which the proxy exports"),
        ("ClashesWithASuffix", r"^\$\.plugins\.tests\.unit\.test_stats:ClashesWithASuffix: metric replay_proxy_recoveries_total "
                               r"clashes with replay_proxy_recoveries_total, which the proxy exports"),
        ("ProcessToo", r"ProcessToo: metric process_open_fds clashes with process_open_fds, which the proxy exports"),
        ("ServesMetrics", r"^\$\.plugins\.chain: 'tests\.unit\.test_stats:ServesMetrics' serves /metrics, which the proxy serves"),
        ("Broken", r"Broken: collecting its metrics failed: RuntimeError: no numbers today"),
        ("NotFamilies", r"NotFamilies: collect\(\) must yield prometheus_client metric families, got 'replay_proxy_text 1'"),
    ],
)  # fmt: skip
async def test_a_plugin_that_takes_a_name_of_the_proxy_fails_at_load(plugin, message):
    _Collector.closed = 0
    with pytest.raises(ConfigError, match=message):
        target([f"{HERE}:Own", f"{HERE}:{plugin}"])
    assert _Collector.closed == 2  # the refused chain is closed (its plugins may have opened files)


async def test_two_plugins_with_one_family_name_fail_at_load_naming_both():
    with pytest.raises(ConfigError, match=r"SameAsOwn: metric replay_proxy_own_things clashes with replay_proxy_own_things, "
                                          r"which plugin 'tests\.unit\.test_stats:Own' exports"):  # fmt: skip
        target([f"{HERE}:Own", f"{HERE}:SameAsOwn"])


async def test_a_clash_that_appears_after_the_load_is_left_out_and_logged_once(caplog):
    t = target([f"{HERE}:Late"])
    late = t.hooks.plugins[0][1]
    late.late = True
    with caplog.at_level(logging.ERROR, logger="replay_proxy.stats"):
        first, second = t.stats.render().decode(), t.stats.render().decode()
    families = parse(first)
    assert value(families, "replay_proxy_commands_total", target="t") == 0  # the proxy's counter, not the gauge
    assert value(families, "replay_proxy_own_things_total", target="t") == 3  # the plugin's other family stays
    assert first.count("# TYPE replay_proxy_commands_total") == 1 and second.count("# TYPE replay_proxy_commands_total") == 1
    assert caplog.text.count("metric replay_proxy_commands_total clashes with one already exported") == 1


async def test_a_plugin_that_fails_at_scrape_time_costs_only_its_own_families(caplog):
    Broken.fail = False
    try:
        t = target([f"{HERE}:Broken"])
    finally:
        Broken.fail = True
    with caplog.at_level(logging.ERROR, logger="replay_proxy.stats"):
        families = parse(t.stats.render().decode())
    assert "replay_proxy_own_things" not in families and "replay_proxy_sessions_open" in families
    assert "collecting its metrics failed (left out of this scrape)" in caplog.text


# --- what the proxy's own families say ----------------------------------------------------------


async def test_build_info():
    families = parse(target([]).stats.render().decode())
    (sample,) = families["replay_proxy_build_info"].samples
    assert sample.labels == {"target": "t", "version": version("replay-proxy"), "python": platform.python_version()}
    assert sample.value == 1


class _Session:
    """What the gauges read of a session (stats.SessionFacts): where its open backend connection
    goes, its transaction, its commands."""

    def __init__(self, address: str | None, in_transaction: bool = False, commands: int = 0) -> None:
        self.backend_address = address
        self.in_transaction = in_transaction
        self.commands = commands


async def test_backend_gauges_follow_health_and_sessions():
    t = target([])
    a, b = Address("127.0.0.1", 3306), Address("127.0.0.1", 3307)
    families = parse(t.stats.render().decode())
    assert families["replay_proxy_backend_up"].samples == []  # not checked yet: no claim either way
    assert value(families, "replay_proxy_backend_state", address=str(a), state="unknown") == 1
    assert value(families, "replay_proxy_ready") == 0
    t.health_of(a).state, t.health_of(b).state = "up", "down"
    t.sessions.update([_Session(str(a), in_transaction=True, commands=5), _Session(str(a)), _Session(None, commands=2), _Session(None)])
    families = parse(t.stats.render().decode())
    assert value(families, "replay_proxy_backend_up", address=str(a)) == 1
    assert value(families, "replay_proxy_backend_up", address=str(b)) == 0
    assert [value(families, "replay_proxy_backend_state", address=str(b), state=s) for s in ("up", "draining", "down", "unknown")] \
        == [0, 0, 1, 0]  # fmt: skip
    assert value(families, "replay_proxy_backend_connections", address=str(a)) == 2
    assert value(families, "replay_proxy_backend_connections", address=str(b)) == 0  # no open connection goes there
    assert value(families, "replay_proxy_ready") == 1
    assert value(families, "replay_proxy_sessions_open") == 4
    assert value(families, "replay_proxy_sessions_in_transaction") == 1
    assert value(families, "replay_proxy_commands_total") == 7
    t.health_of(a).state = "draining"
    families = parse(t.stats.render().decode())
    assert value(families, "replay_proxy_backend_up", address=str(a)) == 0
    assert value(families, "replay_proxy_backend_draining", address=str(a)) == 1
    assert value(families, "replay_proxy_ready") == 0


async def test_a_session_gives_its_facts_to_the_gauges():
    """relay.session.Session as stats.SessionFacts: its backend's address only while the connection
    is open (a lost one is not counted), its transaction as the tracker has it."""
    from proxy.recovery.relayside import RECOVERY
    from proxy.relay.session import Session

    t = target([])
    session = Session(t, SimpleNamespace(), "127.0.0.1:50000", 7, RECOVERY)
    assert session.backend_address is None and not session.in_transaction
    channel = SimpleNamespace(closed=False)
    session.link.replace(SimpleNamespace(address=Address("127.0.0.1", 3307), channel=channel, max_allowed_packet=0, connection_id=9,
                                         handshake=SimpleNamespace(server_version="10.11.19-MariaDB")))  # fmt: skip
    assert session.backend_address == "127.0.0.1:3307"
    channel.closed = True
    assert session.backend_address is None
    session.tracking.logged_in("app", None, 45, 0)
    session.tracking.tx.start(None)
    assert session.in_transaction and session.describe()["in_transaction"]


# --- reloads ------------------------------------------------------------------------------------


async def test_reload_outcomes_are_counted_and_a_clashing_chain_is_rejected(tmp_path, caplog):
    sections = {"name": "t", "backend": {"addresses": ["127.0.0.1:3306"]}, "users": [{"name": "app", "password": "apppw"}],
                "admin": {"enabled": False}}  # fmt: skip
    path = write_config(tmp_path / "t.toml", {**sections, "plugins": {"chain": [f"{HERE}:Own"]}})
    cfg = config([f"{HERE}:Own"])
    proxy = Proxy(cfg, load_chain(cfg))
    stats, retired = proxy.target.stats, []

    def reloads() -> tuple[float, float, float, float]:
        f = parse(stats.render().decode())
        return (value(f, "replay_proxy_config_reloads_total", outcome="ok"), value(f, "replay_proxy_config_reloads_total", outcome="rejected"),
                value(f, "replay_proxy_config_last_reload_successful"), value(f, "replay_proxy_config_last_reload_success_timestamp_seconds"))  # fmt: skip

    started = reloads()
    assert started[:3] == (0, 0, 1) and started[3] > 0
    await trio.sleep(0.01)
    assert cli.reload(proxy, str(path), retired)
    ok = reloads()
    assert ok[:3] == (1, 0, 1) and ok[3] > started[3]
    _Collector.closed = 0
    write_config(path, {**sections, "plugins": {"chain": [f"{HERE}:Own", f"{HERE}:SameAsTheProxy"]}})
    with caplog.at_level(logging.ERROR, logger="replay_proxy"):
        assert not cli.reload(proxy, str(path), retired)
    assert "config reload rejected, the running config is kept: $.plugins.tests.unit.test_stats:SameAsTheProxy: metric " \
           "replay_proxy_sessions_open clashes" in caplog.text  # fmt: skip
    assert _Collector.closed == 2  # the refused chain's plugins were closed, the running one kept
    assert [name for name, _ in proxy.target.hooks.plugins] == [f"{HERE}:Own"]
    assert reloads() == (1, 1, 0, ok[3])  # the config in force is still the one loaded at ok[3]
    write_config(path, {**sections, "plugins": {"chain": []}})
    assert cli.reload(proxy, str(path), retired)
    assert reloads()[:3] == (2, 1, 1)
