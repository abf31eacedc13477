"""The DM-like Go workload through the proxy while the servers behind a name (dns) or in PD (pd)
come and go: shared by tests/integration/test_discovery_dns.py, tests/chaos/test_discovery_cluster.py
and bench/discovery.py.

A run is a list of steps (``Step``: a label and what the lab does, blocking), each followed by
a look at where the proxy's sessions are (its admin /status) once the proxy has had ``settle``
seconds to act; then every row is verified directly on the server.
"""

from __future__ import annotations

import functools
import json
import re
import signal
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from tests.lab.chaos import CHAOS_GRACE_S, TIDB_SESSION
from tests.lab.goclient import run_goclient, run_goclient_async
from tests.lab.proxy import ProxyProcess


@attrs.frozen
class Step:
    label: str
    act: Callable[[], Any]  # blocking: runs in a thread


@attrs.define
class DiscoveryRun:
    label: str
    workload: dict
    verify: dict
    steps: list[dict]  # per step: label, seconds it took, where the sessions were after it
    late: float = 0.0  # seconds the steps went on after the workload ended (0: all under load)
    proxy_log: str = ""

    @property
    def client_errors(self) -> int:
        return int(self.workload.get("error_count", 0))

    @property
    def moved(self) -> list[tuple[str, str]]:
        """(from, to) of every session moved between transactions."""
        return re.findall(r" moved from (\S+) to (\S+) \(connection", self.proxy_log)

    @property
    def recovered(self) -> int:
        return sum(1 for line in self.proxy_log.splitlines() if " recovered on " in line)

    def summary(self) -> dict[str, Any]:
        w = self.workload
        return {
            "label": self.label,
            "client_errors": self.client_errors,
            "errors": w.get("errors", {}),
            "failed_txns": w.get("failed_txns"),
            "stuck_workers": w.get("stuck_workers"),
            "committed_txns": w.get("committed_txns"),
            "longest_stall_ms": w.get("longest_stall_ms"),
            "rows_verified": self.verify.get("checked_rows"),
            "row_check": "ok" if self.verify.get("ok") else f"{self.verify.get('problem_count')} problems",
            "sessions_moved": len(self.moved),
            "moved": dict(Counter(f"{a} -> {b}" for a, b in self.moved)),
            "sessions_recovered": self.recovered,
            "found": self.proxy_log.count(" found ("),
            "gone": self.proxy_log.count(" gone ("),
            "steps": self.steps,
            "steps_after_the_workload_s": self.late,
        }

    def problems(self, min_txns: int = 50) -> list[str]:
        out = []
        w = self.workload
        if self.client_errors or w.get("stuck_workers") or not w.get("ok"):
            out.append(f"client errors {self.client_errors} {w.get('errors')}, stuck {w.get('stuck_workers')}, ok {w.get('ok')}")
        if not self.verify.get("ok"):
            out.append(f"rows did not verify: {self.verify.get('problems', [])[:5]}")
        elif int(self.verify.get("checked_rows") or 0) < int(w.get("committed_rows") or 1):
            out.append(f"{self.verify.get('checked_rows')} rows verified of {w.get('committed_rows')} committed")
        if int(w.get("committed_txns") or 0) < min_txns:
            out.append(f"{w.get('committed_txns')} transactions committed (want >= {min_txns})")
        if self.late > 0:
            out.append(f"the steps went on {self.late}s after the workload ended: not all under load (raise step_time)")
        if "Traceback" in self.proxy_log:
            out.append("the proxy logged a traceback")
        if "the client gets 1158" in self.proxy_log:
            out.append("a session got 1158")
        return out


def proxy_status(proxy: ProxyProcess) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{proxy.admin_port}/status", timeout=5) as response:
        return json.load(response)


def placement(proxy: ProxyProcess) -> dict[str, int]:
    """How many of the proxy's sessions each backend address carries now."""
    return dict(Counter(s.get("backend") or "-" for s in proxy_status(proxy)["sessions"]))


def discovery_backend(mode: str, **keys: Any) -> dict[str, Any]:
    """``[backend]`` for a discovery run: short intervals, so a lab run sees each change within a second."""
    return {"discovery": mode, "discovery_interval": "0.5s", "health_interval": "0.5s", "connect_timeout": "2s", **keys}


async def run_with_steps(label: str, server: Any, proxy: ProxyProcess, workdir: Path, steps: list[Step], *,
                         sql: str = "safe", conns: int = 8, batch: int = 10, lead: float = 3.0, settle: float = 3.0,
                         tail: float = 2.0, tidb: bool = False, step_time: float = 0.5) -> DiscoveryRun:  # fmt: skip
    """The workload through ``proxy`` while ``steps`` run one after the other (the first after
    ``lead`` seconds, each followed by ``settle`` seconds and a look at /status), ``tail``
    seconds more, then every row verified on ``server`` (at its ``host`` then). The workload runs for
    the time the steps should take (``step_time`` each, a guess); a run whose steps outlast it
    is a problem (``late``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    creds = dict(user="app", password="apppw", db="test")
    table, counters = f"t_{label}", f"c_{label}"
    run_goclient("setup", port=server.port, host=server.host, conns=conns, table=table, counters_table=counters, **creds)
    expect = workdir / f"{label}-workload.json"
    done: list[dict] = []
    extra: dict[str, Any] = {"session": TIDB_SESSION} if tidb else {}
    duration = lead + len(steps) * (settle + step_time) + tail
    finished = trio.Event()

    async def drive() -> None:
        await trio.sleep(lead)
        for step in steps:
            began = time.monotonic()
            what = await trio.to_thread.run_sync(step.act)
            took = time.monotonic() - began
            await trio.sleep(settle)
            where = await trio.to_thread.run_sync(placement, proxy)
            done.append({"step": step.label, "what": what, "took_s": round(took, 1), "sessions": where})
        finished.set()

    started = time.monotonic()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(drive)
        workload = await run_goclient_async(
            "workload", port=proxy.port, conns=conns, duration=duration, batch=batch, sql=sql, table=table, counters_table=counters,
            out=str(expect), grace=f"{CHAOS_GRACE_S:g}s", check=False, timeout=600, **creds, **extra,
        )  # fmt: skip
        ended = time.monotonic() - started
        with trio.fail_after(600):
            await finished.wait()
        late = time.monotonic() - started - ended
    verify = run_goclient("verify", port=server.port, host=server.host, expect=str(expect), table=table, counters_table=counters, check=False,
                          **creds)  # fmt: skip
    return DiscoveryRun(label, workload, verify, done, late=max(0.0, round(late, 1)))


def discovery_keys(mode: str, cluster: Any, dns: Any = None, name: str = "") -> dict[str, Any]:
    """``[backend]``'s keys that say where ``cluster``'s servers are found: ``dns``, the name
    ``name`` (at the servers' shared port) served by the lab's ``dns`` and each server's status
    on the shared status port; ``pd``, the cluster's PD (the status ports: as registered)."""
    if mode == "dns":
        return {"addresses": [f"{name}:{cluster.shared_port}"], "dns": {"nameservers": [dns.nameserver]},
                "status_port": cluster.shared_status_port}  # fmt: skip
    return {"pd": {"endpoints": [cluster.pd.address]}}


class Endpoints:
    """What TiDB Operator does to ``cluster``'s tidb-servers (tests/lab/cluster.py with
    ``hosts``), told to DNS as a headless Service tells it (``dns``, ``name``: its endpoints
    lose a pod as it starts terminating and list its replacement once it serves) or left to PD
    (``dns`` None: each server registers itself)."""

    def __init__(self, cluster: Any, dns: Any = None, name: str = "") -> None:
        self.cluster, self.dns, self.name = cluster, dns, name

    def publish(self, leaving: Any = None) -> None:
        """The name answers every running server but ``leaving``."""
        if self.dns is not None:
            self.dns.set(self.name, [s.host for s in self.cluster.servers if s is not leaving and s.is_running()])

    def move(self, i: int, sig: int = signal.SIGTERM, between: Callable[[], Any] | None = None) -> str:
        """Server ``i`` stopped (``sig``) and back on a new address (``Cluster.move_server``;
        ``between()`` while it is down), serving and published before this returns."""
        self.publish(leaving=self.cluster.servers[i])
        what = self.cluster.move_server(i, sig=sig, between=between)
        self.publish()
        return what

    def scale_out(self) -> str:
        server = self.cluster.add_server()
        self.publish()
        return server.host

    def scale_in(self) -> str:
        server = self.cluster.servers[-1]
        self.publish(leaving=server)
        self.cluster.remove_server(len(self.cluster.servers) - 1)
        return server.host


def cluster_steps(cluster: Any, dns: Any = None, name: str = "", moves: int | None = None, scale: bool = True) -> list[Step]:
    """``Endpoints``' changes as steps: a scale out (a server added), a rolling restart where
    each of the first ``moves`` servers (default: all) comes back on a new address, and a scale
    in (the last server removed)."""
    endpoints = Endpoints(cluster, dns, name)
    steps = [Step("scale out", endpoints.scale_out)] if scale else []
    count = len(cluster.servers) + (1 if scale else 0) if moves is None else moves
    steps += [Step(f"server {i} back on a new address", functools.partial(endpoints.move, i)) for i in range(count)]
    if scale:
        steps.append(Step("scale in", endpoints.scale_in))
    return steps
