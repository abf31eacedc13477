"""What stands between DM and TiDB in bench.dm_e2e, and what each one says happened.

- ``direct``: DM writes to a tidb-server itself (of a cluster: the first one);
- ``proxy``: replay-proxy as configs/dm-sidecar.toml configures it (safe mode, commit markers,
  a 30 s buffer window), in front of every tidb-server, each one's status port watched every 2 s;
- ``haproxy``: HAProxy in TCP mode as PingCAP's docs deploy it (bench/haproxy.py: ``option
  httpchk GET /status`` on each status port, ``inter 2000 rise 2 fall 3``, leastconn);
- ``tiproxy``: TiProxy (tests/lab/tiproxy.py), which finds the tidb-servers through PD and
  migrates sessions off one whose /status answers 500 (cluster only: it needs PD).

Their numbers after a run: the proxy's recoveries by outcome (/metrics) and the sessions it
moved between transactions (its log: a move is no recovery, /metrics has no counter of them);
TiProxy's session migrations by result and reason (``tiproxy_balance_migrate_total``) and its
disconnections by side (``tiproxy_server_disconnection_total``), plus its log's lines that
speak of a migration or a redirect; HAProxy's server state changes (its log: ``is DOWN``,
``is UP``).
"""

from __future__ import annotations

import re
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from bench.haproxy import HAProxy
from tests.lab.proxy import ProxyProcess
from tests.lab.tidb import TiDB
from tests.lab.tiproxy import TiProxy

MIDDLES = ("direct", "haproxy", "tiproxy", "proxy")
LABELS = {"direct": "directly", "haproxy": "HAProxy", "tiproxy": "TiProxy", "proxy": "through proxy"}


def sidecar_overrides(servers: list[TiDB], user: str, password: str, buffer_window: float = 30.0,
                      discovery: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """configs/dm-sidecar.toml's settings on the lab's ports: one server's status port watched,
    or, in front of a cluster, every server's (``[backend] status_urls``), the sessions balanced
    by connections over them, or with ``discovery`` (``[backend]`` keys: bench/dm_discovery.py)
    the servers it finds; ``buffer_window``: the sidecar's 30 s, or another."""
    if discovery is not None:
        backend: dict[str, Any] = {**discovery, "health_interval": "2s"}
    elif len(servers) == 1:
        backend = {"status_port": servers[0].status_port, "health_interval": "2s"}
    else:
        addresses = [f"{s.host}:{s.port}" for s in servers]
        backend = {
            "addresses": addresses,
            "status_urls": {a: f"http://{s.host}:{s.status_port}/status" for a, s in zip(addresses, servers)},
            "health_interval": "2s",
            # The sidecar config finds the servers by DNS, which balances by connections: so
            # here, as HAProxy and TiProxy spread the sessions over the servers too.
            "balance": "connections",
        }
    return {
        "name": "dm-e2e",
        "listen": {"max_connections": 256, "drain_timeout": "20s"},
        "backend": backend,
        "users": [{"name": user, "password": password}],
        "recovery": {"buffer_window": f"{buffer_window:g}s", "idempotent": "safe-mode", "commit_marker": True},
        "log": {"level": "info"},
    }


def start_middle(target: str, workdir: Path, servers: list[TiDB], pd_address: str | None, user: str, password: str,
                 buffer_window: float = 30.0, workers: int = 1, discovery: dict[str, Any] | None = None):  # fmt: skip
    """Start ``target`` in front of ``servers``; (the port DM writes to, the middle or None).
    ``buffer_window``, ``workers``, ``discovery``: the proxy's (``recovery.buffer_window``,
    ``listen.workers``, ``[backend]``'s discovery keys)."""
    if target == "direct":
        return servers[0].port, None
    if target == "proxy":
        overrides = sidecar_overrides(servers, user, password, buffer_window, discovery)
        overrides["listen"]["workers"] = workers
        proxy = ProxyProcess(workdir / "proxy", [] if discovery else [s.port for s in servers], **overrides)
        return proxy.start().port, proxy
    if target == "haproxy":
        haproxy = HAProxy(workdir / "haproxy", [s.port for s in servers], status_ports=[s.status_port for s in servers])
        return haproxy.start().port, haproxy
    if target == "tiproxy":
        if pd_address is None:
            raise ValueError("tiproxy needs a cluster (--cluster): it finds the tidb-servers through PD")
        tiproxy = TiProxy(workdir / "tiproxy", pd_address)
        return tiproxy.start().port, tiproxy
    raise ValueError(f"unknown target {target!r} (one of {', '.join(MIDDLES)})")


def middle_numbers(middle: Any) -> dict[str, Any] | None:
    """What the middle says happened (read before it stops), by kind."""
    if isinstance(middle, ProxyProcess):
        return {"proxy": proxy_numbers(middle)}
    if isinstance(middle, TiProxy):
        return {"tiproxy": tiproxy_numbers(middle.metrics_text(), middle.log_text())}
    if isinstance(middle, HAProxy):
        return {"haproxy": haproxy_numbers(middle.log_text())}
    return None


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def proxy_numbers(proxy: ProxyProcess) -> dict[str, Any]:
    """Recoveries by outcome and replayed statements from the proxy's /metrics; moves (between
    transactions, off a draining server) and recoveries from its log."""
    return proxy_numbers_from(_scrape(f"http://127.0.0.1:{proxy.admin_port}/metrics"), proxy.log_text())


def proxy_numbers_from(metrics: str, log_text: str) -> dict[str, Any]:
    outcomes: dict[str, float] = {}
    for m in re.finditer(r'^replay_proxy_recoveries_total\{[^}]*outcome="([^"]+)"[^}]*\} ([0-9.e+]+)$', metrics, re.M):
        outcomes[m.group(1)] = outcomes.get(m.group(1), 0) + float(m.group(2))
    replayed = sum(
        float(m.group(1)) for m in re.finditer(r"^replay_proxy_replayed_statements_total(?:\{[^}]*\})? ([0-9.e+]+)$", metrics, re.M)
    )
    lines = log_text.splitlines()
    return {"recoveries": outcomes, "replayed_statements": replayed,
            "refused_1158": outcomes.get("aborted_1158", 0),
            "moved": sum(1 for line in lines if " moved from " in line),
            "move_failed": sum(1 for line in lines if "could not move off draining backend" in line),
            "recovered_lines": sum(1 for line in lines if "recovered on" in line),
            "servers_found": sum(1 for line in lines if " found (" in line),
            "servers_gone": sum(1 for line in lines if " gone (" in line),
            "refused_by_reason": refusals_by_reason(lines),
            "tracebacks": log_text.count("Traceback")}  # fmt: skip


def refusals_by_reason(log_lines: list[str]) -> dict[str, int]:
    """The proxy's 1158 answers by reason, from its log lines ("the client gets 1158 ...: why"),
    the addresses, numbers and server messages left out so that alike reasons count together."""
    reasons: Counter[str] = Counter()
    for line in log_lines:
        if "the client gets 1158" not in line:
            continue
        why = line.split("replay-proxy: ", 1)[1] if "replay-proxy: " in line else line.split("the client gets 1158", 1)[1]
        why = re.sub(r"\(last error:.*", "", why)
        why = re.sub(r"[0-9.]+(:[0-9]+)?", "N", why).strip(" )")
        reasons[why[:90]] += 1
    return dict(reasons.most_common())


_LABELS = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _samples(metrics: str, name: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for m in re.finditer(rf"^{name}(?:\{{([^}}]*)\}})? ([0-9.e+-]+|NaN)$", metrics, re.M):
        labels = dict(_LABELS.findall(m.group(1) or ""))
        out.append((labels, float(m.group(2))))
    return out


# TiProxy's disconnections (pkg/proxy/backend/error.go) that end a session the client did not end:
# its backend connection broke, or no backend could be had.
TIPROXY_LOST = ("backend network break", "backend handshake fail", "get backend fail", "proxy error")


def tiproxy_numbers(metrics: str, log_text: str) -> dict[str, Any]:
    """TiProxy's session migrations by result (``succeed`` / ``fail``) and by reason (``status``:
    the server's health; ``conn``, ``cpu``, ``memory``, ...: rebalancing), its disconnections by
    kind (``lost``: those of ``TIPROXY_LOST``, the client's session ended under it), and how many
    lines of its log speak of a migration or a redirect (at info level only a failed redirect)."""
    by_result: dict[str, float] = {}
    by_reason: dict[str, float] = {}
    for labels, value in _samples(metrics, "tiproxy_balance_migrate_total"):
        by_result[labels.get("migrate_res", "?")] = by_result.get(labels.get("migrate_res", "?"), 0) + value
        if labels.get("migrate_res") == "succeed":
            by_reason[labels.get("reason", "?")] = by_reason.get(labels.get("reason", "?"), 0) + value
    disconnections = {labels.get("type", "?"): value for labels, value in _samples(metrics, "tiproxy_server_disconnection_total")}
    lost = sum(v for kind, v in disconnections.items() if kind in TIPROXY_LOST)
    created = sum(v for _, v in _samples(metrics, "tiproxy_server_create_connection_total"))
    lines = log_text.splitlines()
    return {
        "migrated": by_result.get("succeed", 0), "migrate_failed": by_result.get("fail", 0), "migrated_by_reason": by_reason,
        "connections_created": created, "disconnections": disconnections, "lost": lost,
        "log_migration_lines": sum(1 for line in lines if re.search(r"migrat|redirect", line, re.I)),
        "log_redirect_failed": sum(1 for line in lines if "redirect connection failed" in line),
        "log_closed_with_backend": sum(1 for line in lines if "backend connection is closed, close client connection" in line),
        "log_warn_error_lines": sum(1 for line in lines if "[WARN]" in line or "[ERROR]" in line),
    }  # fmt: skip


def haproxy_numbers(log_text: str) -> dict[str, Any]:
    """HAProxy's health checks' verdicts: a server marked DOWN (3 failed checks, 2 s apart), or
    UP again (2 good ones)."""
    lines = log_text.splitlines()
    return {"marked_down": sum(1 for line in lines if " is DOWN" in line), "marked_up": sum(1 for line in lines if " is UP" in line)}
