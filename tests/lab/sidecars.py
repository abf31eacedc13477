"""A proxy per dm-worker, as Kubernetes deploys them (configs/deploy/kubernetes): each worker
dials the same host and port and reaches its own proxy there. In the lab every worker sees
``tests.lab.dm.SIDECAR_HOST`` at a loopback address of its own (``DMCluster(sidecars=...)``),
and each ``Sidecar`` listens on its address, all on one port.

    port = free_port()
    sidecars = [Sidecar(tmp / f"proxy{i}", cluster.ports, sidecar_address(i), port, **overrides).start() for i in range(2)]
    dm = DMCluster(tmp / "dm", workers=2, sidecars=[s.host for s in sidecars])
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from tests.lab.proxy import ProxyProcess

__all__ = ["Sidecar", "sidecar_address"]


def sidecar_address(i: int) -> str:
    """The loopback address of worker ``i``'s sidecar (127.0.0.11, 127.0.0.12, ...)."""
    return f"127.0.0.{11 + i}"


class Sidecar(ProxyProcess):
    """A proxy listening on ``host``:``port`` (its admin endpoint on 127.0.0.1, as usual)."""

    def __init__(self, workdir: Path, backend_ports: list[int], host: str, port: int, **overrides: Any) -> None:
        listen = {**overrides.pop("listen", {}), "address": f"{host}:{port}"}
        super().__init__(workdir, backend_ports, listen=listen, **overrides)
        self.host, self.port = host, port

    def start(self, timeout: float = 20) -> Sidecar:
        # ProxyProcess.start waits until 127.0.0.1:<port> answers: here that is the admin
        # endpoint, which the proxy starts beside its listener.
        port, self.port = self.port, self.admin_port
        try:
            super().start(timeout)
        finally:
            self.port = port
        socket.create_connection((self.host, self.port), timeout=5).close()
        return self
