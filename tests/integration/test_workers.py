"""``--workers N``: processes sharing the listen port, one admin endpoint over all of them,
unique session ids, KILL across workers, a dead worker restarted, SIGTERM to every worker.
On MariaDB and on TiDB (``db``): TiDB counts no KILLs, so the worker that relays a KILL tells
the victim's worker (/session?kill=1); without that the victim was reconnected and went on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pymysql
import pytest

from tests.lab.fixtures import APP_PASSWORD, APP_USER, prepare_server
from tests.lab.mariadb import free_port
from tests.lab.procs import kill_at_exit, wait_listening
from tests.lab.proxy import REPO, write_config

pytestmark = pytest.mark.integration


def get_json(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return json.load(response)


def test_workers_share_the_port_and_one_admin_endpoint(db, tmp_path):
    prepare_server(db)
    port, admin = free_port(), free_port()
    config = write_config(tmp_path / "proxy.toml", {
        "name": "w", "listen": {"address": f"127.0.0.1:{port}", "workers": 2},
        "backend": {"addresses": [f"127.0.0.1:{db.port}"]},
        "users": [{"name": APP_USER, "password": APP_PASSWORD}], "admin": {"address": f"127.0.0.1:{admin}"},
    })  # fmt: skip
    log = open(tmp_path / "proxy.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "proxy", "--config", str(config)], cwd=REPO, stdout=log, stderr=log)
    kill_at_exit(proc)
    try:
        wait_listening(proc, port, 30, "proxy", lambda: (tmp_path / "proxy.log").read_text())
        time.sleep(1)  # both workers listening
        conns = [pymysql.connect(host="127.0.0.1", port=port, user=APP_USER, password=APP_PASSWORD, database="test")
                 for _ in range(12)]  # fmt: skip
        status = get_json(admin, "/status")
        by_worker = {s["id"]: s["worker"] for s in status["sessions"]}
        assert sorted(by_worker) == sorted(c.thread_id() for c in conns)  # greeting ids = session ids, unique
        assert set(by_worker.values()) == {0, 1}, "the kernel spread connections over both workers"
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics").read().decode()
        assert 'replay_proxy_sessions_open{worker="0",target="w"}' in metrics and 'worker="1"' in metrics
        # KILL of a session that lives in the other worker
        killer = next(c for c in conns if by_worker[c.thread_id()] == 0)
        victim = next(c for c in conns if by_worker[c.thread_id()] == 1)
        with killer.cursor() as cur:
            cur.execute(f"KILL {victim.thread_id()}")
        with pytest.raises(pymysql.err.OperationalError):
            with victim.cursor() as cur:
                cur.execute("SELECT 1")
        # A worker that dies is restarted; the other keeps its sessions.
        children = [int(p) for p in subprocess.check_output(["pgrep", "-P", str(proc.pid)]).split()]
        os.kill(children[0], signal.SIGKILL)
        deadline = time.monotonic() + 20
        while get_json(admin, "/healthz")["restarts"] < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert get_json(admin, "/healthz")["restarts"] == 1
        # The restarted worker serves once it says so (a fixed wait was short on a loaded machine).
        deadline = time.monotonic() + 30
        while (tmp_path / "proxy.log").read_text().count("target w: listening on") < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        fresh = pymysql.connect(host="127.0.0.1", port=port, user=APP_USER, password=APP_PASSWORD, database="test")
        with fresh.cursor() as cur:
            cur.execute("SELECT 1")
            assert cur.fetchone() == (1,)
        fresh.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(40) == 0
        log.close()
    text = (tmp_path / "proxy.log").read_text()
    assert "exited with code -9; restarting it" in text
    assert "stopping 2 workers" in text and text.count("replay_proxy: received SIGTERM") == 2  # forwarded to each
    assert "Traceback" not in text


def test_workers_do_not_outlive_a_killed_supervisor(mariadb, tmp_path):
    """SIGKILL of the supervisor: its workers drain and exit instead of serving on (each was left
    behind before, listening on the shared port)."""
    port = free_port()
    config = write_config(tmp_path / "proxy.toml", {
        "name": "w", "listen": {"address": f"127.0.0.1:{port}", "workers": 2, "drain_timeout": "2s"},
        "backend": {"addresses": [f"127.0.0.1:{mariadb.port}"]},
        "users": [{"name": APP_USER, "password": APP_PASSWORD}], "admin": {"enabled": False},
    })  # fmt: skip
    log = open(tmp_path / "proxy.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "proxy", "--config", str(config)], cwd=REPO, stdout=log, stderr=log)
    kill_at_exit(proc)
    try:
        wait_listening(proc, port, 30, "proxy", lambda: (tmp_path / "proxy.log").read_text())
        deadline = time.monotonic() + 30
        while (tmp_path / "proxy.log").read_text().count("target w: listening on") < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        workers = [int(p) for p in subprocess.check_output(["pgrep", "-P", str(proc.pid)]).split()]
        assert len(workers) == 2
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 20
        while any(os.path.exists(f"/proc/{pid}") and b"(python" in open(f"/proc/{pid}/stat", "rb").read() for pid in workers):
            assert time.monotonic() < deadline, "a worker outlived its supervisor"
            time.sleep(0.2)
    finally:
        for pid in [int(p) for p in subprocess.run(["pgrep", "-f", str(config)], capture_output=True).stdout.split()]:
            os.kill(pid, signal.SIGKILL)
        log.close()
    assert (tmp_path / "proxy.log").read_text().count("received SIGTERM") == 2  # each drained
