"""docs/plugins.md's "Writing a plugin" example runs as written: its
module, its TOML chain and its tests."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest

from proxy import plugintest as pt
from proxy.config import parse_config
from proxy.plugin_loader import load_chain

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


def example_blocks() -> dict[str, list[str]]:
    section = DOC.read_text().split("## Writing a plugin", 1)[1].split("\n## ", 1)[0]
    blocks: dict[str, list[str]] = {}
    for lang, body in re.findall(r"```(\w+)\n(.*?)```", section, re.S):
        blocks.setdefault(lang, []).append(body)
    return blocks


@pytest.fixture
def example_package(tmp_path, monkeypatch):
    module, _test = example_blocks()["python"]
    package = tmp_path / "mycompany"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "readonly.py").write_text(module)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("mycompany.readonly", "mycompany"):
        sys.modules.pop(name, None)


def test_example_config_builds_the_chain(example_package):
    (toml,) = example_blocks()["toml"]
    data = {"backend": {"addresses": ["127.0.0.1:3306"]}, "users": [{"name": "app", "password": "apppw"}], **tomllib.loads(toml)}
    hooks = load_chain(parse_config(data))
    assert [name for name, _ in hooks.plugins] == ["mycompany.readonly:ReadOnly", "metrics"]


def test_example_tests_pass(example_package):
    _module, tests = example_blocks()["python"]
    namespace: dict = {}
    exec(compile(tests, str(DOC), "exec"), namespace)
    pt.run(namespace["test_refuses_writes_only"])
    namespace["test_unknown_option"]()
