"""TiProxy in front of a lab cluster (tests/lab/cluster.py): the anchor users run instead.

It finds the tidb-servers through PD, moves sessions off a server whose ``/status`` answers
500 (every server has the same session-token signing cert and key: the lab's ``Cluster``
sets them), and loses them on a crash. The binary is taken from ``$REPLAY_PROXY_TIPROXY``,
then ``~/.cache/replay-proxy/bin/tiproxy``, then PATH (tests/lab/binaries.py); nothing of it
is built here. Its lifecycle is the lab's one (tests/lab/server.py).
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pymysql

from tests.lab import binaries
from tests.lab.procs import read_log
from tests.lab.server import HOST, ServerProcess, free_port

ENV_BINARY = "REPLAY_PROXY_TIPROXY"


def tiproxy_path() -> str | None:
    return binaries.find("tiproxy", ENV_BINARY)


def tiproxy_unavailable_reason() -> str | None:
    return binaries.missing_reason(("tiproxy",), ENV_BINARY)


class TiProxy(ServerProcess):
    """TiProxy v1.3's config (lib/config/proxy.go): ``[proxy] addr``, ``pd-addrs`` (it watches
    PD's topology for tidb-servers and health-checks each one's status port every 3 s),
    ``graceful-wait-before-shutdown`` (its own, on its SIGTERM), ``[api] addr`` (HTTP: /metrics,
    /api/...), ``[log]``. Its migrations are counted in /metrics
    (``tiproxy_balance_migrate_total``); its log says ``redirect connection succeeds`` only at
    ``log_level = "debug"``, a failed one at any level."""

    what = "tiproxy"
    start_timeout = 60
    stop_timeout = 20  # after its graceful wait it gives open sessions up to 15 s (graceful-close-conn-timeout)
    probe_interval = 0.3
    not_serving = (OSError, pymysql.err.Error)

    def __init__(self, workdir: Path, pd_address: str, graceful_wait: int = 0, log_level: str = "info") -> None:
        super().__init__(workdir)  # it runs in there: every path it is given is absolute
        self.graceful_wait = graceful_wait
        self.api_port = free_port()
        self.stdout_path = self.basedir / "tiproxy.out"
        self.log_path = self.basedir / "tiproxy.log"
        self.config_path = self.basedir / "tiproxy.toml"
        self.config_path.write_text(
            f'workdir = "{self.basedir / "work"}"\n'
            f'[proxy]\naddr = "{HOST}:{self.port}"\npd-addrs = "{pd_address}"\n'
            f"graceful-wait-before-shutdown = {graceful_wait}\n"
            f'[api]\naddr = "{HOST}:{self.api_port}"\n'
            f'[log]\nlevel = "{log_level}"\n[log.log-file]\nfilename = "{self.log_path}"\n'
        )

    def command(self) -> list[str]:
        program = tiproxy_path()
        if program is None:
            raise RuntimeError(tiproxy_unavailable_reason())
        return [program, "--config", str(self.config_path)]

    def orphan_marker(self) -> str:
        return str(self.config_path)

    def probe(self) -> None:
        # It serves once it has found a tidb-server through PD: a login through it.
        pymysql.connect(host=HOST, port=self.port, user="root", connect_timeout=2, read_timeout=5).close()

    def start(self, timeout: float | None = None) -> TiProxy:
        super().start(timeout)
        return self

    def log_text(self) -> str:
        """Its log file, then what it wrote to stdout and stderr (startup errors, panics)."""
        return read_log(self.log_path) + read_log(self.stdout_path)

    def metrics_text(self, timeout: float = 5) -> str:
        """Its Prometheus metrics (the API's /metrics)."""
        with urllib.request.urlopen(f"http://{HOST}:{self.api_port}/metrics", timeout=timeout) as resp:
            return resp.read().decode()
