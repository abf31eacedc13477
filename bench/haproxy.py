"""HAProxy (Debian ``haproxy``) in TCP mode: in front of one MariaDB, the "plain TCP hop"
reference; in front of a TiDB cluster (``status_ports``), as PingCAP's docs deploy it: each
tidb-server health-checked on its status port (``option httpchk GET /status``: 500 while it
drains; PingCAP's values: inter 2000 rise 2 fall 3), balanced by least connections.

maxconn 4096 covers the 2,000-connection workload; HAProxy needs about two file descriptors per
connection and refuses to start when RLIMIT_NOFILE cannot cover maxconn.

Runs in the foreground (``-db``) as a child process; ``stop()`` (and interpreter exit) ends it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from tests.lab.mariadb import free_port
from tests.lab.procs import ListeningChild

if TYPE_CHECKING:
    from bench.callgrind import Wrap


def haproxy_unavailable_reason() -> str | None:
    if shutil.which("haproxy") is None:
        return "haproxy not found on PATH (Debian: apt-get install haproxy)"
    return None


CONFIG_TEMPLATE = """\
# Written by bench/haproxy.py: TCP passthrough to one MariaDB, no health checks.
global
    maxconn {maxconn}
    nbthread {nbthread}

defaults
    mode tcp
    timeout connect 5s
    timeout client 1h
    timeout server 1h
    maxconn {maxconn}

frontend mysql_in
    bind 127.0.0.1:{port}
    default_backend mysql_out

backend mysql_out
    server db 127.0.0.1:{backend_port} maxconn {maxconn}
"""


CLUSTER_TEMPLATE = """\
# Written by bench/haproxy.py: TCP to a TiDB cluster, health checks on each status port.
global
    maxconn {maxconn}
    nbthread {nbthread}

defaults
    mode tcp
    timeout connect 5s
    timeout client 1h
    timeout server 1h
    maxconn {maxconn}

frontend mysql_in
    bind 127.0.0.1:{port}
    default_backend tidb

backend tidb
    balance leastconn
    option httpchk GET /status
{servers}
"""


class HAProxy(ListeningChild):
    def __init__(self, workdir: Path, backend_port: int | list[int], maxconn: int = 4096, nbthread: int = 1,
                 status_ports: list[int] | None = None) -> None:  # fmt: skip
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.backend_port = backend_port
        self.config_path = self.workdir / "haproxy.cfg"
        if status_ports is None:
            assert isinstance(backend_port, int), "several backends need their status ports"
            text = CONFIG_TEMPLATE.format(port=self.port, backend_port=backend_port, maxconn=maxconn, nbthread=nbthread)
        else:
            ports = backend_port if isinstance(backend_port, list) else [backend_port]
            servers = "\n".join(
                f"    server tidb{i} 127.0.0.1:{p} check port {s} inter 2000 rise 2 fall 3"
                for i, (p, s) in enumerate(zip(ports, status_ports))
            )
            text = CLUSTER_TEMPLATE.format(port=self.port, servers=servers, maxconn=maxconn, nbthread=nbthread)
        self.config_path.write_text(text)
        self.log_path = self.workdir / "haproxy.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 10, wrap: Wrap | None = None) -> HAProxy:
        """``wrap``: run HAProxy under this command prefix and environment (bench/callgrind.py)."""
        reason = haproxy_unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        check = subprocess.run(["haproxy", "-c", "-f", str(self.config_path)], capture_output=True, text=True, timeout=30)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy rejected {self.config_path}:\n{check.stdout}{check.stderr}")
        # Stopped with SIGTERM (hard stop), then SIGKILL: SIGUSR1, HAProxy's soft stop, could wait
        # for idle connections with client timeouts of 1 h.
        cmd = ["haproxy", "-db", "-f", str(self.config_path)]
        if wrap is None:
            self.launch(cmd, timeout, "haproxy")
        else:
            self.launch(wrap.command(cmd), timeout, "haproxy", env=wrap.environment(dict(os.environ)))
        return self
