"""Which worker of ``--workers N`` this process is: its session id range, its peers' admin
ports, and how to ask a peer about one of its sessions (a ``KILL <id>`` of another worker's
session). Below the relay, which asks; the supervisor (``proxy.workers``) starts the workers.
"""

from __future__ import annotations

import json
import urllib.request

import attrs
import trio

__all__ = ["WorkerInfo", "backend_connection_of", "get_json", "SESSION_ID_BASE", "SESSION_ID_SPAN", "MAX_WORKERS"]

SESSION_ID_BASE = 1_000_000_001
SESSION_ID_SPAN = 50_000_000  # ids per worker: 64 spans end below 2**32
MAX_WORKERS = 64


@attrs.frozen
class WorkerInfo:
    index: int
    count: int
    admin_ports: tuple[int, ...]  # every worker's private admin port, by index
    supervisor_pid: int = 0  # 0: the parent (a worker the supervisor started itself)

    @classmethod
    def parse(cls, spec: str, ports: str, supervisor_pid: int | None = None) -> WorkerInfo:
        index, _, count = spec.partition("/")
        return cls(int(index), int(count), tuple(int(p) for p in ports.split(",")), supervisor_pid or 0)

    def arguments(self, supervisor_pid: int) -> list[str]:
        """The command-line arguments of this worker, for the process that takes its place in an
        upgrade (started by this worker, not by the supervisor: ``supervisor_pid`` says whose)."""
        return ["--worker", f"{self.index}/{self.count}", "--worker-admin", ",".join(map(str, self.admin_ports)),
                "--supervisor-pid", str(supervisor_pid)]  # fmt: skip

    @property
    def first_session_id(self) -> int:
        return SESSION_ID_BASE + self.index * SESSION_ID_SPAN

    def owner_of(self, session_id: int) -> int | None:
        """The worker whose sessions are numbered like ``session_id``."""
        index = (session_id - SESSION_ID_BASE) // SESSION_ID_SPAN
        return index if 0 <= index < self.count else None

    def peer_admin(self, index: int) -> str:
        return f"http://127.0.0.1:{self.admin_ports[index]}"


async def backend_connection_of(worker: WorkerInfo, session_id: int, killing: bool = False) -> tuple[str, int] | None:
    """(backend address, backend connection id) of another worker's session, or None.
    ``killing``: a KILL of that connection is about to be sent (its worker notes it)."""
    owner = worker.owner_of(session_id)
    if owner is None or owner == worker.index:
        return None
    url = f"{worker.peer_admin(owner)}/session?id={session_id}" + ("&kill=1" if killing else "")
    try:
        data = await trio.to_thread.run_sync(get_json, url)
    except (OSError, ValueError):
        return None
    if not data or data.get("backend_connection") is None:
        return None
    return data["backend"], int(data["backend_connection"])


def get_json(url: str, timeout: float = 2) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)
