"""Dependencies pinned: every runtime dependency has an upper bound (the next major version),
constraints.txt pins the exact versions the tests run with, those pins satisfy pyproject.toml,
and both ways of installing (scripts/setup, the Dockerfile) use it."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def pins() -> dict[str, str]:
    out = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
        assert m, f"constraints.txt: {line!r} is not name==version"
        out[canonicalize_name(m.group(1))] = m.group(2)
    return out


def test_every_runtime_dependency_has_an_upper_bound():
    for text in PROJECT["dependencies"]:
        req = Requirement(text)
        uppers = [s for s in req.specifier if s.operator in ("<", "<=", "==", "~=")]
        assert uppers, f"{text}: no upper bound: add <NEXT_MAJOR"
        assert any(s.operator == ">=" for s in req.specifier), f"{text}: no lower bound"


def test_constraints_pin_every_dependency_within_pyprojects_ranges():
    pinned = pins()
    wanted = PROJECT["dependencies"] + PROJECT["optional-dependencies"]["test"] + PROJECT["optional-dependencies"]["demo"]
    for text in wanted:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req.name} is not in constraints.txt: regenerate it (pip freeze --exclude-editable)"
        assert req.specifier.contains(pinned[name], prereleases=True), f"constraints.txt pins {req.name}=={pinned[name]}, outside {text!r}"
    assert "replay-proxy" not in pinned  # the package itself is installed from the checkout


def test_this_environment_runs_the_pinned_versions():
    """The tests run with what constraints.txt says (scripts/setup installs it): a package
    upgraded by hand shows here, before it shows as a different failure elsewhere."""
    different = {}
    for name, pinned in pins().items():
        try:
            installed = version(name)
        except PackageNotFoundError:
            continue  # a test-only package of another platform
        if installed != pinned:
            different[name] = (installed, pinned)
    assert not different, (
        f"installed vs constraints.txt: {different}: run scripts/setup test (or pip install -c constraints.txt -e '.[test]')"
    )


def test_scripts_setup_and_the_dockerfile_install_with_the_constraints():
    setup = (REPO / "scripts" / "setup").read_text()
    [pip] = [line for line in setup.splitlines() if re.search(r"-m pip install ", line)]
    assert "-c constraints.txt" in pip and '-e ".[$extra]"' in pip, pip
    assert re.search(r'^inputs="\$\(cat pyproject.toml constraints.txt [^|]*\| sha256sum', setup, re.MULTILINE)  # a new pin reinstalls
    docker = (REPO / "Dockerfile").read_text()
    assert re.search(r"pip wheel --no-cache-dir --no-deps -c /src/constraints.txt /src\b", docker), "the image's wheel is built pinned"
    assert re.search(r"pip install --no-cache-dir -c /src/constraints.txt /wheels/\*\.whl", docker), "it installs the pinned versions"


def test_pymysql_is_no_runtime_dependency():
    """proxy.protocol.scramble owns the scrambles; PyMySQL is the demo's and the tests' client."""
    names = {canonicalize_name(Requirement(t).name) for t in PROJECT["dependencies"]}
    assert "pymysql" not in names
    importing = [p.name for p in (REPO / "proxy").rglob("*.py") if re.search(r"^\s*(import|from)\s+pymysql\b", p.read_text(), re.MULTILINE)]
    assert not importing, importing
