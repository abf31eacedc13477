"""``replay-proxy check --config F`` run the way a user runs it (the installed console script,
a subprocess) against real servers, and ``replay-proxy status``'s exit status.

Each check case runs on MariaDB and on TiDB (``db_factory``; TiDB skips without a tidb-server).
Where the check says something would bite, the test makes it bite (the marker table cannot be
prepared as that user, DM's 96 KiB statement is refused); where it says fine, the same
statements work.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pymysql
import pytest
import trio

from tests.lab.certs import make_certs
from tests.lab.mariadb import free_port
from tests.lab.proxy import REPO, ProxyProcess, write_config

pytestmark = pytest.mark.integration

PASSWORD = "Pre-flight-s3cret"  # never in the check's output
MARKERS = "replay_proxy.commit_markers"


def cli() -> list[str]:
    """The console script pip installed beside this interpreter (what a user types), else python -m proxy."""
    script = Path(sys.executable).parent / "replay-proxy"
    return [str(script)] if script.exists() else [sys.executable, "-m", "proxy"]


async def run_check(config: Path) -> subprocess.CompletedProcess:
    with trio.fail_after(120):
        return await trio.run_process([*cli(), "check", "--config", str(config)], cwd=REPO, check=False,
                                      capture_stdout=True, capture_stderr=True)  # fmt: skip


def lines_of(result: subprocess.CompletedProcess, level: str, topic: str) -> list[str]:
    """The check's lines about a backend address (not the config's) at ``level`` on ``topic`` ("": any)."""
    out = result.stdout.decode()
    return [line for line in out.splitlines()
            if line.startswith(f"{level} ") and line.split()[1] != "config" and (not topic or f" {topic}: " in line)]  # fmt: skip


class StatusPort:
    """A tiny HTTP server on 127.0.0.1 answering ``code`` to every request (a TiDB status port)."""

    def __init__(self, code: int) -> None:
        self.code = code
        self.requests = 0
        self.port = 0

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        await trio.serve_listeners(self._handle, listeners, task_status=task_status)

    async def _handle(self, stream: trio.SocketStream) -> None:
        head = b""
        with trio.move_on_after(10):
            while b"\r\n\r\n" not in head:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    return
                head += chunk
            self.requests += 1
            await stream.send_all(f"HTTP/1.1 {self.code} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
        await stream.aclose()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/status"


def config_file(path: Path, server, status_url: str | None, **sections) -> Path:
    address = f"127.0.0.1:{server.port}"
    backend = {"addresses": [address], **({"status_urls": {address: status_url}} if status_url else {})}
    return write_config(path, {"name": "preflight", "listen": {"address": f"127.0.0.1:{free_port()}"},
                               "backend": {**backend, **sections.pop("backend", {})},
                               "users": [{"name": "dm", "password": PASSWORD}],
                               "recovery": {"commit_marker": True}, "admin": {"enabled": False}, **sections})  # fmt: skip


def connect_as_dm(server, **kwargs) -> pymysql.connections.Connection:
    return pymysql.connect(host="127.0.0.1", port=server.port, user="dm", password=PASSWORD, connect_timeout=10,
                           read_timeout=30, write_timeout=30, autocommit=True, **kwargs)  # fmt: skip


def prepare_markers_as_dm(server) -> None:
    """What the proxy runs at the first login with commit markers (proxy.recovery.markers), then an
    upsert, a look-up and the clean-up, as the user dm."""
    conn = connect_as_dm(server)
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE IF NOT EXISTS replay_proxy")
            cur.execute(f"CREATE TABLE IF NOT EXISTS {MARKERS} (slot BINARY(16) NOT NULL PRIMARY KEY, txn BIGINT UNSIGNED NOT NULL,"
                        " updated TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP)")  # fmt: skip
            cur.execute(
                f"INSERT INTO {MARKERS} (slot, txn) VALUES (X'00112233445566778899aabbccddeeff', 1) ON DUPLICATE KEY UPDATE txn = VALUES(txn)"
            )
            cur.execute(f"SELECT txn FROM {MARKERS} WHERE slot = X'00112233445566778899aabbccddeeff'")
            assert cur.fetchall() == ((1,),)
            cur.execute(f"DELETE FROM {MARKERS} WHERE updated < NOW() - INTERVAL 7 DAY")
    finally:
        conn.close()


async def test_a_user_without_create_a_small_packet_and_a_draining_status_port(db_factory, tmp_path):
    server = db_factory()
    server.create_user("dm", PASSWORD, grants="SELECT, INSERT, UPDATE, DELETE ON *.*")
    server.query("SET GLOBAL max_allowed_packet = 65536")  # 64 KiB: new connections get it
    status = StatusPort(500)  # TiDB's answer from the start of a graceful shutdown
    async with trio.open_nursery() as nursery:
        await nursery.start(status.serve)
        result = await run_check(config_file(tmp_path / "bad.toml", server, status.url))
        nursery.cancel_scope.cancel()
    out, err = result.stdout.decode(), result.stderr.decode()
    assert result.returncode == 1, out + err
    [packet] = lines_of(result, "PROBLEM", "max_allowed_packet")
    assert "the server's max_allowed_packet is 64 KiB, below limits.max_allowed_packet (64 MiB)" in packet, packet
    assert "REPLACE statements of about 96 KiB" in packet and "SET GLOBAL max_allowed_packet = 67108864" in packet, packet
    [markers] = lines_of(result, "PROBLEM", "commit markers")
    assert "users[0] 'dm' (dm@%) lacks CREATE on replay_proxy.*:" in markers, markers
    assert markers.endswith("run GRANT CREATE ON `replay_proxy`.* TO 'dm'@'%'"), markers
    [draining] = lines_of(result, "PROBLEM", "status port")
    assert f"{status.url} answers 500: the server is draining" in draining and status.requests == 1, draining
    assert len(lines_of(result, "PROBLEM", "")) == 3, out  # nothing else is wrong
    assert lines_of(result, "ok", "login") and lines_of(result, "ok", "server")
    assert out.rstrip().endswith("result: 3 problem(s), 0 warning(s): fix the PROBLEM lines, then run the check again"), out
    assert PASSWORD not in out + err
    # What the check says would bite does: the marker table cannot be prepared as dm...
    with pytest.raises(pymysql.err.OperationalError) as refused:
        prepare_markers_as_dm(server)
    assert refused.value.args[0] in (1044, 1142), refused.value  # access denied to the database / CREATE denied
    # ...and DM's full-load statement is refused.
    conn = connect_as_dm(server)
    try:
        with pytest.raises(pymysql.err.OperationalError):
            with conn.cursor() as cur:
                cur.execute("SELECT '" + "x" * (96 * 1024) + "'")
    finally:
        conn.close()


async def test_a_fine_setup_exits_0(db_factory, tmp_path):
    server = db_factory()
    server.create_user("dm", PASSWORD, grants="CREATE, SELECT, INSERT, UPDATE, DELETE ON replay_proxy.*")
    async with trio.open_nursery() as nursery:
        if server.flavor == "tidb":  # TiDB's own status port
            url = f"http://127.0.0.1:{server.status_port}/status"
        else:
            status = StatusPort(200)
            await nursery.start(status.serve)
            url = status.url
        result = await run_check(config_file(tmp_path / "fine.toml", server, url))
        nursery.cancel_scope.cancel()
    out = result.stdout.decode()
    assert result.returncode == 0, out + result.stderr.decode()
    assert not lines_of(result, "PROBLEM", ""), out
    flavor = {"mariadb": "MariaDB", "tidb": "TiDB"}[server.flavor]
    [version] = lines_of(result, "ok", "server")
    assert f"SQL read as {flavor}" in version, version
    [markers] = lines_of(result, "ok", "commit markers")
    assert "users[0] 'dm' (dm@%) may CREATE in replay_proxy and SELECT, INSERT, UPDATE, DELETE replay_proxy.commit_markers" in markers
    assert lines_of(result, "ok", "max_allowed_packet") and lines_of(result, "ok", "wait_timeout") and lines_of(result, "ok", "sql_mode")
    assert lines_of(result, "ok", "status port") == [f"ok       127.0.0.1:{server.port:<12} status port: {url} answers 200: up"]
    assert out.rstrip().splitlines()[-1].startswith("result: ok"), out
    assert PASSWORD not in out
    prepare_markers_as_dm(server)  # the grants the check found are enough


async def test_a_small_wait_timeout_and_a_wrong_password(mariadb_factory, tmp_path):
    server = mariadb_factory()
    server.create_user("dm", PASSWORD)
    server.query("SET GLOBAL wait_timeout = 20")
    config = config_file(tmp_path / "wait.toml", server, None, recovery={"commit_marker": False},
                         users=[{"name": "dm", "password": PASSWORD}, {"name": "nobody", "password": "wrong-" + PASSWORD}])  # fmt: skip
    result = await run_check(config)
    out = result.stdout.decode()
    assert result.returncode == 1, out
    [wait] = lines_of(result, "PROBLEM", "wait_timeout")
    assert (
        wait.split("wait_timeout: ")[1].startswith("20 s: the server closes DM's connections") and "SET GLOBAL wait_timeout = 28800" in wait
    )
    [login] = lines_of(result, "PROBLEM", "login")
    assert "users[1] 'nobody'" in login and "1045" in login and "check [[users]] name / password" in login, login
    assert PASSWORD not in out


async def test_tls_as_configured_and_a_wrong_ca(mariadb_factory, tmp_path):
    certs = make_certs(tmp_path / "tls")
    server = mariadb_factory(tls=certs.server, require_secure_transport=True)
    server.create_user("dm", PASSWORD)
    tls = {"mode": "verify-identity", "ca": str(certs.ca), "server_name": "localhost"}
    result = await run_check(config_file(tmp_path / "tls.toml", server, None, recovery={"commit_marker": False}, backend={"tls": tls}))
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    [line] = lines_of(result, "ok", "TLS")
    assert "TLSv1." in line and "the certificate chain and the server's name are verified" in line, line
    plain = await run_check(config_file(tmp_path / "plain.toml", server, None, recovery={"commit_marker": False}))
    [refused] = lines_of(plain, "PROBLEM", "login")  # MariaDB 10.11 under require_secure_transport: a plain 1045
    assert plain.returncode == 1 and "1045" in refused, refused
    assert "require_secure_transport" in refused and "set [backend.tls] mode" in refused, refused
    wrong = await run_check(config_file(tmp_path / "wrong.toml", server, None, recovery={"commit_marker": False},
                                        backend={"tls": {**tls, "ca": str(certs.other_ca)}}))  # fmt: skip
    [failed] = lines_of(wrong, "PROBLEM", "login")
    assert wrong.returncode == 1 and "certificate verify failed" in failed and "check [backend.tls]" in failed, failed


# ------------------------------------------------------------------------------ replay-proxy status


def run_status(config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*cli(), "status", "--config", str(config)], cwd=REPO, capture_output=True, text=True, timeout=60)


def test_status_exits_1_when_the_proxy_is_not_ready(tmp_path):
    dead = free_port()  # nothing listens there: every health check fails
    with ProxyProcess(tmp_path, dead, backend={"health_interval": "0.2s", "connect_timeout": "0.5s"}) as proc:
        result = run_status(proc.config_path)
        assert result.returncode == 1, result
        assert result.stdout.startswith("target test: NOT READY\n"), result.stdout
        assert "is not ready: no backend address is up" in result.stderr, result.stderr


def test_status_exits_0_when_the_proxy_is_ready(mariadb, tmp_path):
    with ProxyProcess(tmp_path, mariadb.port, backend={"health_interval": "0.2s"}) as proc:
        for _ in range(100):  # the first health check runs within a moment of the start
            result = run_status(proc.config_path)
            if result.returncode == 0:
                break
            assert "NOT READY" in result.stdout, result
            time.sleep(0.1)
        assert result.returncode == 0 and result.stdout.startswith("target test: ready\n"), result
