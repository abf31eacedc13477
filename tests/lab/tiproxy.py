"""TiProxy in front of a lab cluster (tests/lab/cluster.py): the anchor users run instead.

It finds the tidb-servers through PD, moves sessions off a server whose ``/status`` answers
500 (every server has the same session-token signing cert and key: the lab's ``Cluster``
sets them), and loses them on a crash. The binary is taken from ``$REPLAY_PROXY_TIPROXY``,
then ``~/.cache/replay-proxy/bin/tiproxy``, then PATH; nothing of it is built here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pymysql

from tests.lab.mariadb import HOST, free_port
from tests.lab.procs import ListeningChild, read_log

ENV_BINARY = "REPLAY_PROXY_TIPROXY"
CACHE_BIN = Path.home() / ".cache" / "replay-proxy" / "bin"


def tiproxy_path() -> str | None:
    env = os.environ.get(ENV_BINARY)
    if env:
        return env if os.path.isfile(env) and os.access(env, os.X_OK) else None
    cached = CACHE_BIN / "tiproxy"
    if cached.is_file() and os.access(cached, os.X_OK):
        return str(cached)
    return shutil.which("tiproxy")


def tiproxy_unavailable_reason() -> str | None:
    if tiproxy_path() is not None:
        return None
    where = f"${ENV_BINARY}={os.environ[ENV_BINARY]}" if os.environ.get(ENV_BINARY) else f"${ENV_BINARY}, {CACHE_BIN} or PATH"
    return f"no tiproxy in {where} (see README, 'Testing on TiDB')"


class TiProxy(ListeningChild):
    """TiProxy v1.3's config (lib/config/proxy.go): ``[proxy] addr``, ``pd-addrs`` (it watches
    PD's topology for tidb-servers and health-checks each one's status port every 3 s),
    ``graceful-wait-before-shutdown`` (its own, on its SIGTERM), ``[api] addr`` (HTTP: /metrics,
    /api/...), ``[log]``. Its migrations are counted in /metrics
    (``tiproxy_balance_migrate_total``); its log says ``redirect connection succeeds`` only at
    ``log_level = "debug"``, a failed one at any level."""

    def __init__(self, workdir: Path, pd_address: str, graceful_wait: int = 0, log_level: str = "info") -> None:
        self.workdir = Path(workdir).resolve()  # it runs in there: every path it is given is absolute
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.api_port = free_port()
        self.log_path = self.workdir / "tiproxy.out"
        self.file_log_path = self.workdir / "tiproxy.log"
        self.config_path = self.workdir / "tiproxy.toml"
        self.config_path.write_text(
            f'workdir = "{self.workdir / "work"}"\n'
            f'[proxy]\naddr = "{HOST}:{self.port}"\npd-addrs = "{pd_address}"\n'
            f"graceful-wait-before-shutdown = {graceful_wait}\n"
            f'[api]\naddr = "{HOST}:{self.api_port}"\n'
            f'[log]\nlevel = "{log_level}"\n[log.log-file]\nfilename = "{self.file_log_path}"\n'
        )
        self.proc: subprocess.Popen | None = None

    def log_text(self) -> str:
        """Its log file, then what it wrote to stdout and stderr (startup errors, panics)."""
        return read_log(self.file_log_path) + read_log(self.log_path)

    def metrics_text(self, timeout: float = 5) -> str:
        """Its Prometheus metrics (the API's /metrics)."""
        with urllib.request.urlopen(f"http://{HOST}:{self.api_port}/metrics", timeout=timeout) as resp:
            return resp.read().decode()

    def start(self, timeout: float = 60) -> TiProxy:
        program = tiproxy_path()
        if program is None:
            raise RuntimeError(tiproxy_unavailable_reason())
        self.launch([program, "--config", str(self.config_path)], timeout, "tiproxy", cwd=self.workdir)
        # It serves once it has found a tidb-server through PD: wait for a login through it.
        deadline = time.monotonic() + timeout
        while True:
            try:
                pymysql.connect(host=HOST, port=self.port, user="root", connect_timeout=2, read_timeout=5).close()
                return self
            except pymysql.err.Error as exc:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"no login through tiproxy within {timeout} s: {exc}\n{self.log_text()[-3000:]}") from None
                time.sleep(0.3)
