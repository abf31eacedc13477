"""README's two commands on a fresh Debian 12, for real: debootstrap makes a minimal bookworm
root in the test's own folder (Python 3.11 from Debian added, Go 1.26 bind-mounted read-only
from /usr/local/go, this machine's DNS, CA bundle and pip.conf copied in), the checkout's
tracked files are copied there, and then, as a fresh machine's user would:

- a user who is not root runs scripts/setup test: it names the missing packages and the exact
  apt-get lines, and stops;
- root runs command 1 (scripts/setup demo, then the demo's first seconds) and the set-up again
  (nothing to do), then scripts/setup test (mysqlclient builds from source).

About 6 minutes, root only: off unless REPLAY_PROXY_DEBOOTSTRAP=1.

    REPLAY_PROXY_DEBOOTSTRAP=1 .venv/bin/python -m pytest -q -p no:cacheprovider tests/setup/test_fresh_debian.py
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.setup.test_setup import readme_commands

REPO = Path(__file__).resolve().parents[2]
MIRROR = "http://deb.debian.org/debian"
CLEAN_ENV = ["env", "-i", "HOME=/root", "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"]

pytestmark = pytest.mark.skipif(
    os.environ.get("REPLAY_PROXY_DEBOOTSTRAP") != "1",
    reason="set REPLAY_PROXY_DEBOOTSTRAP=1 to run README's commands in a fresh debootstrap root (about 6 min, as root)",
)


def run(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kw)


class FreshDebian:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.mounts: list[Path] = []

    def make(self) -> None:
        made = run(["debootstrap", "--variant=minbase", "bookworm", str(self.root), MIRROR], 900)
        assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
        for name in ("etc/resolv.conf", "etc/pip.conf"):  # this machine's network settings
            if (Path("/") / name).exists():
                shutil.copy(Path("/") / name, self.root / name)
        # Services never start inside a chroot (mariadb-server's postinst would try).
        policy = self.root / "usr/sbin/policy-rc.d"
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
        self.mount(["-t", "proc", "proc"], self.root / "proc")
        go = self.root / "usr/local/go"
        go.mkdir(parents=True)
        self.mount(["--bind", "/usr/local/go"], go)
        assert run(["mount", "-o", "remount,bind,ro", str(go)], 30).returncode == 0
        # The machine's Python (Debian's python3 3.11) and its CA bundle: what README assumes.
        base = self.chroot(["sh", "-c", "apt-get update -qq && DEBIAN_FRONTEND=noninteractive "
                            "apt-get install -y -qq python3 ca-certificates"], 600)  # fmt: skip
        assert base.returncode == 0, base.stdout[-3000:] + base.stderr[-3000:]
        shutil.copy("/etc/ssl/certs/ca-certificates.crt", self.root / "etc/ssl/certs/ca-certificates.crt")
        files = run(["git", "ls-files", "-z"], 60, cwd=REPO).stdout.split("\0")
        for name in filter(None, files):
            source = REPO / name
            if source.is_file():
                target = self.root / "src" / name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
        assert self.chroot(["/usr/sbin/useradd", "-m", "newuser"], 60).returncode == 0

    def mount(self, args: list[str], where: Path) -> None:
        done = run(["mount", *args, str(where)], 30)
        assert done.returncode == 0, done.stderr
        self.mounts.append(where)

    def chroot(self, cmd: list[str], timeout: float, user: str | None = None) -> subprocess.CompletedProcess:
        spec = [f"--userspec={user}:{user}"] if user else []
        env = CLEAN_ENV if user is None else [*CLEAN_ENV[:2], f"HOME=/home/{user}", *CLEAN_ENV[3:]]
        return run(["chroot", *spec, str(self.root), *env, *cmd], timeout)

    def sh(self, script: str, timeout: float, user: str | None = None) -> subprocess.CompletedProcess:
        return self.chroot(["sh", "-c", f"cd /src && {script}"], timeout, user)

    def remove(self) -> None:
        for where in reversed(self.mounts):
            run(["umount", "-l", str(where)], 60)
        if all(not os.path.ismount(m) for m in self.mounts):
            shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def fresh_debian(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("REPLAY_PROXY_DEBOOTSTRAP=1 needs root (debootstrap, chroot, mount): run it as root")
    if shutil.which("debootstrap") is None:
        installed = run(["apt-get", "install", "-y", "debootstrap"], 600)
        assert installed.returncode == 0, f"apt-get install -y debootstrap failed: {installed.stderr[-2000:]}"
    debian = FreshDebian(tmp_path / "root")
    try:
        debian.make()
        yield debian
    finally:
        debian.remove()


def test_readmes_commands_on_a_fresh_debian(fresh_debian):
    commands = readme_commands()
    demo_setup, demo_run = commands["1"].split(" && ")
    test_setup = commands["2"].split(" && ")[0]

    as_user = fresh_debian.sh(test_setup, 120, user="newuser")
    assert as_user.returncode == 1, as_user
    line = re.search(r"^    sudo apt-get install -y (.+)$", as_user.stderr, re.MULTILINE)
    assert line and {"mariadb-server", "libmariadb-dev", "python3-venv", "python3-dev"} <= set(line.group(1).split()), as_user.stderr
    assert "    sudo apt-get update\n" in as_user.stderr

    setup = fresh_debian.sh(demo_setup, 900)
    assert setup.returncode == 0, setup.stdout[-4000:] + setup.stderr[-4000:]
    assert "installing the missing Debian packages" in setup.stdout and "-m venv" in setup.stdout
    demo = fresh_debian.sh(f"{demo_run} --duration 4 --interval 1.5", 900)
    assert demo.returncode == 0 and "result: OK" in demo.stdout, demo.stdout[-4000:] + demo.stderr[-4000:]
    assert re.search(r"^row check \(lost/doubled\)\s+ok\s+ok$", demo.stdout, re.MULTILINE), demo.stdout

    again = fresh_debian.sh(demo_setup, 120)
    assert again.returncode == 0 and "Debian packages: all there" in again.stdout, again
    assert "(there already)" in again.stdout and "up to date" in again.stdout, again.stdout

    tests = fresh_debian.sh(test_setup, 1200)
    assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr[-4000:]
    built = fresh_debian.sh(".venv/bin/python -c 'import MySQLdb, pytest, mysql.connector'", 60)
    assert built.returncode == 0, built.stderr
