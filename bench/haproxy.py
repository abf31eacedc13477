"""HAProxy (Debian ``haproxy``) in TCP mode in front of one MariaDB: the "plain TCP hop" reference.

maxconn 4096 covers the 2,000-connection workload; HAProxy needs about two file descriptors per
connection and refuses to start when RLIMIT_NOFILE cannot cover maxconn.

Runs in the foreground (``-db``) as a child process; ``stop()`` (and interpreter exit) ends it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.lab.mariadb import free_port
from tests.lab.procs import kill_at_exit, read_log, terminate, wait_listening

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


class HAProxy:
    def __init__(self, workdir: Path, backend_port: int, maxconn: int = 4096, nbthread: int = 1) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.backend_port = backend_port
        self.config_path = self.workdir / "haproxy.cfg"
        self.config_path.write_text(
            CONFIG_TEMPLATE.format(port=self.port, backend_port=backend_port, maxconn=maxconn, nbthread=nbthread)
        )
        self.log_path = self.workdir / "haproxy.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 10) -> "HAProxy":
        reason = haproxy_unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        check = subprocess.run(
            ["haproxy", "-c", "-f", str(self.config_path)], capture_output=True, text=True, timeout=30
        )
        if check.returncode != 0:
            raise RuntimeError(f"haproxy rejected {self.config_path}:\n{check.stdout}{check.stderr}")
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            ["haproxy", "-db", "-f", str(self.config_path)],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        kill_at_exit(self.proc)
        try:
            wait_listening(self.proc, self.port, timeout, "haproxy", self.log_text)
        except RuntimeError:
            self.stop()
            raise
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def log_text(self) -> str:
        return read_log(self.log_path)

    def stop(self, timeout: float = 10) -> None:
        if self.proc is None:
            return
        # SIGUSR1 is HAProxy's soft stop; with client timeouts of 1 h it could wait for idle
        # connections, so SIGTERM (hard stop) and then SIGKILL.
        terminate(self.proc, timeout)
        self._log.close()
