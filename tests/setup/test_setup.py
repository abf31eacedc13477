"""The way in (issue 22): README's two commands, .ci/run and scripts/setup name the same path,
the set-up installs what each mode needs and nothing else, stops with the exact apt-get lines
when it cannot install, and a second run changes nothing.

The Debian part runs against stand-ins for id, dpkg-query and apt-get (a PATH of the test's
own), so it is checked as root and as a user without touching the machine. The virtualenv part
is real: a throwaway venv, set up twice, then the demo's first seconds from it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from tests.lab.fixtures import require

REPO = Path(__file__).resolve().parents[2]
SETUP = REPO / "scripts" / "setup"
CI = REPO / ".ci" / "run"
README = REPO / "README.md"


def readme_commands() -> dict[str, str]:
    """{"1": ..., "2": ...}: the command lines under "# 1." and "# 2." in README's block."""
    section = README.read_text().split("## The two commands", 1)[1]
    block = section.split("```sh", 1)[1].split("```", 1)[0]
    commands: dict[str, str] = {}
    number = None
    for line in block.splitlines():
        heading = re.match(r"# (\d)\. ", line)
        if heading:
            number = heading.group(1)
        elif line.strip() and not line.startswith("#") and number is not None:
            commands[number] = line.strip()
            number = None
    return commands


def script_lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.strip().startswith("#")]


def packages(mode: str, **env: str) -> list[str]:
    out = subprocess.run([str(SETUP), "--packages", mode], capture_output=True, text=True, timeout=30,
                         env={**os.environ, **env}, check=True)  # fmt: skip
    return out.stdout.split()


def test_readme_names_two_commands_that_run_scripts_setup():
    commands = readme_commands()
    assert commands == {
        "1": "scripts/setup demo && .venv/bin/python -m bench.demo",
        "2": "scripts/setup test && .venv/bin/python -m pytest -q -p no:cacheprovider tests",
    }, commands


def test_ci_runs_readmes_test_command_and_fails_loudly():
    setup, run = readme_commands()["2"].split(" && ")
    lines = script_lines(CI)

    def position(command: str) -> int:
        found = [i for i, line in enumerate(lines) if line == command or line.startswith(command + " ")]
        assert len(found) == 1, f".ci/run should run {command!r} once, found {found}"
        return found[0]

    assert position(setup) < position(run)
    assert "|| die" in lines[position(setup)]  # a failed set-up stops CI with a message
    assert "set -euo pipefail" in lines
    assert any(line.startswith("5)") and "die" in line for line in lines)  # pytest's "no tests" is a failure
    assert not any(re.search(r"\bpip install\b|\bapt-get\b", line) for line in lines)  # all of it in scripts/setup


def test_ci_lints_and_checks_the_format_with_ruff_after_the_set_up_and_before_the_tests():
    setup, run = readme_commands()["2"].split(" && ")
    lines = script_lines(CI)
    [after] = [i for i, line in enumerate(lines) if line.startswith(setup + " ")]
    [before] = [i for i, line in enumerate(lines) if line.startswith(run + " ")]
    for check in (".venv/bin/python -m ruff check . ", ".venv/bin/python -m ruff format --check . "):
        [at] = [i for i, line in enumerate(lines) if line.startswith(check)]
        assert after < at < before, check
        assert "|| die" in lines[at]  # findings stop CI with a message
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(r.startswith("ruff==") for r in extras["test"])  # scripts/setup test installs it


def test_setup_tells_the_same_next_step_as_readme():
    script = SETUP.read_text()
    for number, mode in (("1", "demo"), ("2", "test")):
        then = readme_commands()[number].split(" && ")[1]
        assert re.search(rf'^\s*{mode}\) next="{re.escape(then)}" ;;$', script, re.MULTILINE), (mode, then)


def test_the_demo_needs_no_mysqlclient_and_fewer_packages_than_the_tests():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert not any(r.lower().startswith("mysqlclient") for r in extras["demo"])
    assert any(r.lower().startswith("mysqlclient") for r in extras["test"])
    demo, test = packages("demo", PYTHON=sys.executable), packages("test", PYTHON=sys.executable)
    assert "mariadb-server" in demo and not {"libmariadb-dev", "pkg-config", "gcc", "python3-dev"} & set(demo)
    assert set(demo) <= set(test)
    assert {"mariadb-client", "sysbench", "haproxy", "libmariadb-dev", "pkg-config", "gcc"} <= set(test)
    # Debian's own python3 needs its venv module and, to build mysqlclient, its headers
    if os.path.exists("/usr/bin/python3"):
        assert "python3-venv" in packages("demo", PYTHON="/usr/bin/python3")
        assert {"python3-venv", "python3-dev"} <= set(packages("test", PYTHON="/usr/bin/python3"))


def test_what_the_tests_need_is_installed():
    """The test mode's list covers what the suite runs: after scripts/setup test (CI runs it
    first) every package is installed and every program it provides is found."""
    require(None if subprocess.run(["sh", "-c", "command -v dpkg-query"], capture_output=True).returncode == 0
            else "not a Debian system (no dpkg-query)")  # fmt: skip
    for name in packages("test", PYTHON=sys.executable):
        state = subprocess.run(["dpkg-query", "-W", "-f=${db:Status-Status}", name], capture_output=True, text=True)
        assert state.stdout == "installed", f"{name}: {state.stdout or state.stderr}: run scripts/setup test"
    path = os.environ["PATH"] + ":/usr/local/sbin:/usr/sbin:/sbin"
    for program in ("mariadbd", "mariadb-install-db", "mariadb", "sysbench", "haproxy", "pkg-config", "cc"):
        found = subprocess.run(["sh", "-c", f"command -v {program}"], env={**os.environ, "PATH": path}, capture_output=True)
        assert found.returncode == 0, f"{program} is not on PATH"


# --------------------------------------------------------------------- Debian packages, stand-ins

FAKE_ID = """#!/bin/sh
[ "$1" = -u ] && { echo "$FAKE_UID"; exit 0; }
exec /usr/bin/id "$@"
"""
# Installed unless named in $FAKE_STATE (a file of missing package names).
FAKE_DPKG_QUERY = """#!/bin/sh
for last; do :; done
if grep -qx "$last" "$FAKE_STATE"; then echo "dpkg-query: no packages found matching $last" >&2; exit 1; fi
printf installed
"""
# Records its arguments and "installs" what it is asked to.
FAKE_APT_GET = """#!/bin/sh
echo "$*" >> "$FAKE_APT_LOG"
if [ "$1" = install ]; then
    shift 2
    for p; do grep -vx "$p" "$FAKE_STATE" > "$FAKE_STATE.new"; mv "$FAKE_STATE.new" "$FAKE_STATE"; done
fi
"""


def fake_debian(tmp_path: Path, uid: int, missing: list[str]) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("id", FAKE_ID), ("dpkg-query", FAKE_DPKG_QUERY), ("apt-get", FAKE_APT_GET)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    state = tmp_path / "missing"
    state.write_text("".join(f"{p}\n" for p in missing))
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_UID": str(uid), "FAKE_STATE": str(state),
            "FAKE_APT_LOG": str(tmp_path / "apt.log"), "PYTHON": sys.executable}  # fmt: skip


def run_setup(mode: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(SETUP), mode], capture_output=True, text=True, env=env, timeout=timeout, stdin=subprocess.DEVNULL)


def test_as_a_user_it_prints_the_apt_get_lines_and_stops(tmp_path):
    env = fake_debian(tmp_path, 1000, ["libmariadb-dev", "sysbench"])
    env["VENV"] = str(tmp_path / "venv")
    out = run_setup("test", env)
    assert out.returncode == 1, out
    assert "these Debian packages are missing: sysbench libmariadb-dev." in out.stderr, out.stderr
    assert "    sudo apt-get update\n    sudo apt-get install -y sysbench libmariadb-dev\n" in out.stderr, out.stderr
    assert "run scripts/setup test again" in out.stderr
    assert not (tmp_path / "apt.log").exists() and not (tmp_path / "venv").exists()  # stopped before doing anything


def test_as_root_it_installs_exactly_what_is_missing_and_nothing_the_second_time(tmp_path):
    env = fake_debian(tmp_path, 0, ["haproxy", "libmariadb-dev"])
    not_a_venv = tmp_path / "not-a-venv"
    not_a_venv.mkdir()
    env["VENV"] = str(not_a_venv)  # stops the run right after the Debian step
    first = run_setup("test", env)
    assert (tmp_path / "apt.log").read_text().splitlines() == ["update", "install -y haproxy libmariadb-dev"], first
    assert first.returncode == 1 and "is not a virtualenv: move it away or set VENV=" in first.stderr, first.stderr
    second = run_setup("test", env)
    assert "Debian packages: all there" in second.stdout, second
    assert len((tmp_path / "apt.log").read_text().splitlines()) == 2  # no apt-get at all


def test_the_demo_mode_leaves_the_test_packages_alone(tmp_path):
    env = fake_debian(tmp_path, 0, ["libmariadb-dev", "sysbench", "mariadb-server"])
    env["VENV"] = str(tmp_path)  # not a virtualenv: stops after the Debian step
    run_setup("demo", env)
    assert (tmp_path / "apt.log").read_text().splitlines() == ["update", "install -y mariadb-server"]


def test_a_wrong_mode_says_what_the_modes_are():
    out = subprocess.run([str(SETUP), "tests"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "unknown mode tests: it is demo or test." in out.stderr, out.stderr


# --------------------------------------------------------------------- a real throwaway virtualenv


def tree(venv: Path) -> dict[str, float]:
    return {str(p.relative_to(venv)): p.stat().st_mtime for p in venv.rglob("*") if "__pycache__" not in p.parts}


@pytest.mark.integration
def test_demo_setup_in_a_clean_venv_twice_then_the_demos_first_seconds(tmp_path):
    """The first run makes the venv and installs '.[demo]' (no mysqlclient: nothing compiled);
    the second finds everything done, changes no file and takes about a second; then the demo
    runs from that venv with one MariaDB restart per half and verifies its rows."""
    venv = tmp_path / "venv"
    # This venv imports this checkout, whose compiled core the rest of the suite runs on: an
    # editable install compiles in place, so it leaves that build alone (REPLAY_PROXY_COMPILE=0).
    env = {**os.environ, "VENV": str(venv), "PYTHON": getattr(sys, "_base_executable", sys.executable), "REPLAY_PROXY_COMPILE": "0"}
    first = run_setup("demo", env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "virtualenv: " in first.stdout and "-m venv" in first.stdout
    assert f"next: {venv}/bin/python -m bench.demo" in first.stdout
    python = str(venv / "bin" / "python")
    check = subprocess.run([python, "-c", "import proxy, trio, pymysql; print(proxy.__file__)"], capture_output=True, text=True)
    assert check.returncode == 0 and check.stdout.startswith(str(REPO / "proxy")), check
    for absent in ("MySQLdb", "pytest"):  # the test extras are not the demo's
        assert subprocess.run([python, "-c", f"import {absent}"], capture_output=True).returncode != 0, absent
    before = tree(venv)
    started = time.monotonic()
    second = run_setup("demo", env)
    took = time.monotonic() - started
    assert second.returncode == 0, second.stdout + second.stderr
    assert "(there already)" in second.stdout and "replay-proxy[demo] up to date" in second.stdout, second.stdout
    assert "pip install" not in second.stdout and "apt-get" not in second.stdout
    assert tree(venv) == before  # nothing changed
    assert took < 15, took
    demo = subprocess.run([python, "-m", "bench.demo", "--duration", "4", "--interval", "1.5"], cwd=REPO,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)  # fmt: skip
    assert demo.returncode == 0 and "result: OK" in demo.stdout, demo.stdout + demo.stderr
    restarts = re.search(r"^restarts\s+(\d+)\s+(\d+)$", demo.stdout, re.MULTILINE)
    assert restarts and int(restarts.group(2)) >= 1, demo.stdout
    assert re.search(r"^row check \(lost/doubled\)\s+ok\s+ok$", demo.stdout, re.MULTILINE), demo.stdout
