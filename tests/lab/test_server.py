"""The lab's one server lifecycle (tests/lab/server.py), on a small Python TCP server: no
database needed, so every path is exercised in a second or two (MariaDB and TiDB on it:
test_lab.py, the recovery and chaos suites)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.lab import server as lab_server
from tests.lab.server import ServerProcess

REPO = Path(__file__).resolve().parents[2]

# argv: port, log, data file, mode. It counts its starts in the data file (kept across
# restarts), logs, and listens after a moment (the lab must wait for it). Modes: "ignore-term"
# (SIGTERM does nothing), "exit" (fails at start), "never-listen".
_SERVER = textwrap.dedent(
    """
    import signal, socket, sys, time
    port, log, data, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    with open(data, "a") as f:
        f.write("start\\n")
    with open(log, "a") as f:
        f.write(f"starting in mode {mode}\\n")
    if mode == "exit":
        sys.exit(3)
    if mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(0.3)
    if mode == "never-listen":
        time.sleep(3600)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    while True:
        s.accept()[0].close()
    """
)


class TinyServer(ServerProcess):
    what = "tiny server"
    start_timeout = 10
    stop_timeout = 5

    def __init__(self, basedir: Path, mode: str = "serve") -> None:
        super().__init__(basedir)
        self.mode = mode
        self.log_path = self.basedir / "tiny.log"
        self.stdout_path = self.basedir / "tiny.out"
        self.data = self.basedir / "starts"

    def command(self) -> list[str]:
        return [sys.executable, "-c", _SERVER, str(self.port), str(self.log_path), str(self.data), self.mode]

    def starts(self) -> int:
        return self.data.read_text().count("start")


def _serves(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_start_waits_until_it_serves_and_restarts_keep_port_and_data(tmp_path):
    server = TinyServer(tmp_path / "s")
    server.start()
    try:
        assert _serves(server.port) and server.is_running()
        port, first = server.port, server.pid
        server.restart(signal.SIGTERM)
        assert server.port == port and server.pid not in (None, first) and not _alive(first)
        second = server.pid
        server.restart(signal.SIGKILL, down_for=0.2)
        assert _serves(port) and not _alive(second)
        assert server.starts() == 3  # its data folder is kept across restarts
        server.pause()
        server.stop()  # a paused server is woken so that SIGTERM takes effect
        assert not server.is_running() and server.pid is None and not _serves(port)
        server.stop()  # stopping a stopped server does nothing
    finally:
        server.kill()


def test_a_server_that_ignores_sigterm_is_killed_and_the_stop_fails(tmp_path):
    server = TinyServer(tmp_path / "s", mode="ignore-term")
    server.start()
    pid = server.pid
    with pytest.raises(RuntimeError, match=r"did not exit within 1 s of signal SIGTERM; killed it"):
        server.stop(timeout=1)
    assert not server.is_running() and not _alive(pid)


@pytest.mark.parametrize("mode, message", [("exit", "exited with status 3 during startup"), ("never-listen", "not ready after 1 s")])
def test_a_failed_start_says_why_with_the_log_and_leaves_nothing_running(tmp_path, mode, message):
    server = TinyServer(tmp_path / "s", mode=mode)
    with pytest.raises(RuntimeError, match=message) as failed:
        server.start(timeout=1)
    assert f"starting in mode {mode}" in str(failed.value)  # the tail of its log
    assert not server.is_running() and not (lab_server._REGISTRY / f"{server._holder[0].pid}.json").exists()


def test_servers_of_a_run_that_died_are_killed_by_the_next_start(tmp_path):
    """A test process killed without its atexit: the registry names its servers, and the next
    start (reap_orphans) kills them, but only those whose owner is gone and whose command line
    is still the server's."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import os, sys; from tests.lab.test_server import TinyServer; s = TinyServer(sys.argv[1]); "
         "s.start(); print(s.pid, flush=True); os._exit(0)", str(tmp_path / "orphan")],
        cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 0, out
    orphan, child_pid = int(out.split()[0]), child.pid
    # A pid of the dead run's that is now another process (its command line lacks the marker).
    stranger = subprocess.Popen(["sleep", "60"])
    entry = lab_server._REGISTRY / f"{stranger.pid}.json"
    entry.write_text(json.dumps({"owner": child_pid, "program": "sleep", "marker": str(tmp_path / "gone.log")}))
    mine = TinyServer(tmp_path / "mine")  # a server whose owner (this process) lives
    try:
        assert _alive(orphan) and (lab_server._REGISTRY / f"{orphan}.json").exists()
        mine.start()
        deadline = time.monotonic() + 5
        while _alive(orphan) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(orphan) and not (lab_server._REGISTRY / f"{orphan}.json").exists()
        assert stranger.poll() is None and not entry.exists()
        lab_server.reap_orphans()  # a live owner's servers are left alone
        assert mine.is_running() and (lab_server._REGISTRY / f"{mine.pid}.json").exists()
    finally:
        mine.stop()
        stranger.kill()
        stranger.wait()
        if _alive(orphan):
            os.kill(orphan, signal.SIGKILL)
