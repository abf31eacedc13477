"""Loading chains: built-in names, "module:Class", strict options with path-named errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from proxy import plugintest as pt
from proxy.config import ConfigError, load_config, parse_config
from proxy.plugin_loader import load_chain

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def config(plugins: dict):
    return parse_config(
        {"name": "t", "backend": {"addresses": ["127.0.0.1:3306"]}, "users": [{"name": "app", "password": "apppw"}], "plugins": plugins}
    )


def test_builtin_names_and_order():
    hooks = load_chain(config({"chain": ["metrics", "firewall"], "firewall": {"deny": ["DROP"]}}))
    assert [name for name, _ in hooks.plugins] == ["metrics", "firewall"]
    assert type(hooks.plugins[0][1]).__module__ == "plugins.metrics"


async def test_module_class_path_with_options_and_context():
    h = pt.harness("tests.plugins.sample_plugin:AuditPlugin", tag="audit", target="orders")
    assert h.plugin.tag == "audit" and h.plugin.target == "orders"
    await h.roundtrip("INSERT INTO t VALUES (1)", pt.error(1062, "Duplicate entry"))
    assert h.plugin.seen == [("COM_QUERY", "INSERT INTO t VALUES (1)", 1062)]


def test_plugin_without_options_or_context():
    h = pt.harness("tests.plugins.sample_plugin:NoOptions")
    assert h.hooks.session_opened and not h.hooks.command_received


@pytest.mark.parametrize(
    "chain, options, error",
    [
        (["nosuch"], {}, r"\$\.plugins\.chain: no plugin 'nosuch' \(module plugins\.nosuch not found\)"),
        (["tests.plugins.nosuch:X"], {}, r"no plugin 'tests\.plugins\.nosuch:X'"),
        (["tests.plugins.sample_plugin:Missing"], {}, r"has no plugin class 'Missing'"),
        (["tests.plugins.sample_plugin:NotAPlugin"], {}, r"implements none of the hooks"),
        (["tests.plugins.sample_plugin:AsyncPolicy"], {}, r"is_idempotent must be a plain method"),
        (["drop table"], {}, r"neither a built-in plugin name nor 'module:Class'"),
        (["metrics", "metrics"], {}, r"'metrics' listed twice"),
        (["firewall"], {"metrics": {}}, r"\$\.plugins: option table\(s\) for plugin\(s\) not in the chain: metrics"),
        (
            ["tests.plugins.sample_plugin:AuditPlugin"],
            {},
            r"\$\.plugins\.tests\.plugins\.sample_plugin:AuditPlugin\.tag: required key missing",
        ),
        (["tests.plugins.sample_plugin:NoOptions"], {"tests.plugins.sample_plugin:NoOptions": {"x": 1}}, r"takes no options \(got x\)"),
    ],
)
def test_chain_errors(chain, options, error):
    with pytest.raises(ConfigError, match=error):
        load_chain(config({"chain": chain, **options}))


@pytest.mark.parametrize(
    "options, error",
    [
        ({"deny": "DROP"}, r"^\$\.plugins\.firewall\.deny: expected a list, got 'DROP'$"),
        ({"deny": ["DROP", "DORP"]}, r"^\$\.plugins\.firewall\.deny\[1\]: expected a statement class"),
        ({"deny": ["DROP"], "dney": ["X"]}, r"^\$\.plugins\.firewall: unknown key\(s\) dney \(did you mean deny\?\)$"),
        ({"deny_patterns": ["(unclosed"]}, r"^\$\.plugins\.firewall\.deny_patterns\[0\]: invalid regular expression"),
        ({"allow": [1]}, r"^\$\.plugins\.firewall\.allow\[0\]: expected a string, got 1$"),
    ],
)
def test_option_errors_name_the_key(options, error):
    with pytest.raises(ConfigError, match=error):
        pt.harness("firewall", options)


def test_every_error_is_listed():
    with pytest.raises(ConfigError) as info:
        pt.harness("throttle", rate=0, max_queue=True, max_wait="soon")
    lines = str(info.value).splitlines()
    assert sorted(line.split(":")[0] for line in lines) == [
        "$.plugins.throttle.max_queue", "$.plugins.throttle.max_wait", "$.plugins.throttle.rate",
    ]  # fmt: skip


def test_two_plugins_serving_one_path_is_a_config_error():
    class Other:
        def http_routes(self):
            return {"/report": lambda: (200, "text/plain", b"")}

    class Another(Other):
        pass

    import tests.plugins.sample_plugin as mod

    mod.Other, mod.Another = Other, Another
    try:
        with pytest.raises(
            ConfigError, match=r"'tests\.plugins\.sample_plugin:Another' serves /report, which 'tests\.plugins\.sample_plugin:Other'"
        ):
            load_chain(config({"chain": ["tests.plugins.sample_plugin:Other", "tests.plugins.sample_plugin:Another"]}))
    finally:
        del mod.Other, mod.Another


def test_unopenable_log_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"^\$\.plugins\.query_log: \[Errno 2\] No such file or directory"):
        pt.harness("query_log", path=str(tmp_path / "missing" / "q.jsonl"))


@pytest.mark.parametrize("name", ["plugins.toml", "three-plugins.toml"])
def test_example_configs_load(name, monkeypatch):
    monkeypatch.setenv("APP_PASSWORD", "x")
    cfg = load_config(CONFIGS / name)
    hooks = load_chain(cfg)
    assert [n for n, _ in hooks.plugins] == cfg.plugins.chain
    assert len(cfg.plugins.chain) >= 3


# Every shipped config passes --check, demo.toml too (bench.demo replaces its addresses and users).
@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_config_is_valid(path, monkeypatch):
    for variable in re.findall(r'^\s*\w+_env\s*=\s*"(\w+)"', path.read_text(), re.MULTILINE):
        monkeypatch.setenv(variable, "x")
    cfg = load_config(path)
    assert [n for n, _ in load_chain(cfg).plugins] == cfg.plugins.chain
