"""What a new user reads from the command line (issue 22): each message one sentence that names
the thing and the next step; no raw library errors, no reST markup; key paths in one style; the
admin start-up line and README's endpoint table agree; every shipped config passes --check."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lab.mariadb import free_port
from tests.lab.proxy import ProxyProcess, write_config

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "proxy", *args], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})  # fmt: skip


def test_a_missing_config_file_is_one_sentence(tmp_path):
    missing = tmp_path / "nonexistent.toml"
    out = cli("--config", str(missing), "--check")
    assert out.returncode == 2
    assert (
        out.stderr == f"replay-proxy: cannot read the config file {missing}: No such file or directory; check the path given to --config\n"
    )


def without(name: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != name}


def test_key_paths_are_written_one_way(tmp_path):
    users = [{"name": "app", "password": "x"}, {"name": "dm", "password_env": "REPLAY_PROXY_TEST_UNSET"}]
    bad_value = write_config(tmp_path / "a.toml", {"backend": {"addresses": ["127.0.0.1:3306"]}, "users": users,
                                                   "recovery": {"buffer_window": "30 parsecs"}})  # fmt: skip
    unset = write_config(tmp_path / "b.toml", {"backend": {"addresses": ["127.0.0.1:3306"]}, "users": users})
    env = without("REPLAY_PROXY_TEST_UNSET")
    first = subprocess.run([sys.executable, "-m", "proxy", "--config", str(bad_value), "--check"], cwd=REPO,
                           capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert first.returncode == 2
    assert first.stderr.startswith(f"replay-proxy: the config file {bad_value} has errors; fix these keys:\n"
                                   "$.recovery.buffer_window: expected a duration"), first.stderr  # fmt: skip
    second = subprocess.run([sys.executable, "-m", "proxy", "--config", str(unset), "--check"], cwd=REPO,
                            capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert second.returncode == 2
    assert second.stderr.endswith("\n$.users[1].password_env: environment variable REPLAY_PROXY_TEST_UNSET is not set "
                                  "(user 'dm'): export it where the proxy starts, or set password instead\n"), second.stderr  # fmt: skip
    # every path the config code writes starts at $ (users[dm].password stood beside $.recovery.x)
    source = (REPO / "proxy" / "config.py").read_text() + (REPO / "proxy" / "plugin_loader.py").read_text()
    assert not re.search(r"""f?["'](users|recovery|listen|backend|admin|limits|plugins)\[""", source)


def test_status_of_a_proxy_that_is_not_running_says_what_to_do(tmp_path):
    config = write_config(tmp_path / "t.toml", {
        "listen": {"address": f"127.0.0.1:{free_port()}"}, "backend": {"addresses": ["127.0.0.1:3306"]},
        "users": [{"name": "dm", "password_env": "REPLAY_PROXY_TEST_UNSET"}],  # status needs no user password
    })  # fmt: skip
    env = without("REPLAY_PROXY_TEST_UNSET")
    out = subprocess.run([sys.executable, "-m", "proxy", "status", "--config", str(config)], cwd=REPO,
                         capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert out.returncode == 1
    assert re.fullmatch(
        r"replay-proxy: nothing answers at http://127\.0\.0\.1:\d+/status \(the admin endpoint of target t\): connection "
        r"refused\. The proxy is not running, or runs with another \[admin\] address: start it with replay-proxy "
        rf"--config {re.escape(str(config))}, or give status the file it runs with\n", out.stderr), out.stderr  # fmt: skip


def test_help_is_plain_text():
    out = cli("--help")
    assert out.returncode == 0 and "``" not in out.stdout and "replay-proxy --config configs/<target>.toml" in out.stdout


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_config_passes_check(path):
    env = {name: "x" for name in re.findall(r'^\s*\w+_env\s*=\s*"(\w+)"', path.read_text(), re.MULTILINE)}
    out = cli("--config", str(path), "--check", env=env)
    assert out.returncode == 0 and out.stdout.endswith(": ok (target " + out.stdout.split("(target ")[-1]), out.stderr


def readme_admin_paths() -> set[str]:
    section = (REPO / "README.md").read_text().split("### Admin endpoint", 1)[1].split("\n\n`replay-proxy status", 1)[0]
    return {p for row in re.findall(r"^\| (`/[^|]*)\|", section, re.MULTILINE) for p in re.findall(r"`(/\w+)`", row)}


def test_the_admin_start_up_line_lists_readmes_endpoints(tmp_path):
    proxy = ProxyProcess(tmp_path / "proxy", free_port()).start()  # no backend: the admin endpoint starts anyway
    log = proxy.stop()
    line = re.search(r"admin endpoint on http://\S+ \(([^)]*)\)", log)
    assert line, log
    assert set(line.group(1).split(", ")) == readme_admin_paths() == {"/healthz", "/health", "/readyz", "/metrics", "/status", "/upgrade"}
