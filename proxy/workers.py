"""``--workers N``: N processes share the listen port (SO_REUSEPORT), each an independent trio
loop with its own sessions, so the proxy uses every core.

The supervisor (the process started by the operator) does not serve clients. It starts the
workers (``python -m proxy --config ... --worker i/N``), restarts one that dies (and logs it),
forwards SIGTERM/SIGINT/SIGHUP to all of them, and serves the one admin endpoint: /metrics
and /status gather every worker's (each worker serves its own on a private loopback port,
``WorkerInfo.admin_ports``), /readyz is ready when any worker is.

Session ids stay unique: worker ``i`` numbers its sessions from 1,000,000,001 + i * 5 * 10^7
(``WorkerInfo.first_session_id``; 64 workers at most, so every id fits the greeting's 4 bytes);
a ``KILL <id>`` of another worker's session is translated
by asking that worker (``/session?id=``). Commit-marker slots are random per session.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import trio

from proxy.config import Config, ConfigError, load_config
from proxy.handover import sdnotify
from proxy.worker_identity import MAX_WORKERS, SESSION_ID_BASE, SESSION_ID_SPAN, WorkerInfo

__all__ = ["WorkerInfo", "supervise", "SESSION_ID_BASE", "SESSION_ID_SPAN", "MAX_WORKERS"]

log = logging.getLogger("replay_proxy.workers")


def _free_loopback_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _die_with_supervisor() -> None:
    """In a new worker, before it execs: SIGTERM (its drain) when the supervisor dies, even by
    SIGKILL. A worker left behind would go on serving the shared port (SO_REUSEPORT) beside the
    next supervisor's, under a config nobody reloads."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:  # the supervisor died before the line above
        os.kill(os.getpid(), signal.SIGTERM)


_PR_SET_PDEATHSIG = 1


class Supervisor:
    def __init__(self, config: Config, path: str, count: int) -> None:
        self.config = config
        self.path = path
        self.count = count
        self.ports = _free_loopback_ports(count)
        self.procs: list[subprocess.Popen | None] = [None] * count
        self.stopping = False
        self.restarts = 0

    def _spawn(self, index: int) -> None:
        args = [sys.executable, "-m", "proxy", "--config", self.path, "--worker", f"{index}/{self.count}",
                "--worker-admin", ",".join(map(str, self.ports))]  # fmt: skip
        self.procs[index] = subprocess.Popen(args, stdin=subprocess.DEVNULL, preexec_fn=_die_with_supervisor)
        log.info("worker %d/%d started (pid %d)", index, self.count, self.procs[index].pid)

    def signal_all(self, signum: int) -> None:
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signum)

    async def watch(self) -> None:
        """Restart a worker that dies while the proxy is not stopping."""
        failures: dict[int, list[float]] = {}
        while True:
            await trio.sleep(0.5)
            for i, proc in enumerate(self.procs):
                if proc is None or proc.poll() is None or self.stopping:
                    continue
                recent = [t for t in failures.get(i, []) if trio.current_time() - t < 60] + [trio.current_time()]
                failures[i] = recent
                delay = min(30.0, 0.5 * 2 ** (len(recent) - 1))
                log.error("worker %d (pid %d) exited with code %s; restarting it in %.1fs", i, proc.pid, proc.returncode, delay)
                self.procs[i] = None
                self.restarts += 1
                await trio.sleep(delay)
                if not self.stopping:
                    self._spawn(i)

    async def run(self) -> None:
        for i in range(self.count):
            self._spawn(i)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.watch)
            if self.config.admin.enabled:
                await nursery.start(serve_gathering_admin, self)
            sdnotify.notify("READY=1")  # a Type=notify unit: the supervisor is up, its workers starting
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2) as signals:
                async for signum in signals:
                    if signum == signal.SIGUSR2:
                        log.warning("SIGUSR2 ignored: upgrading with --workers %d is not supported yet; nothing changed "
                                    "(restart the proxy to run the new code)", self.count)  # fmt: skip
                        continue
                    if signum == signal.SIGHUP:
                        log.info("SIGHUP: reloading every worker's config")
                        self.reload()
                        self.signal_all(signal.SIGHUP)
                        continue
                    log.info("received %s: stopping %d workers", signal.Signals(signum).name, self.count)
                    self.stopping = True
                    self.signal_all(signal.SIGTERM)
                    await self._wait_all(self.config.listen.drain_timeout + 10)
                    nursery.cancel_scope.cancel()
                    break

    def reload(self) -> None:
        """The supervisor's own part of a SIGHUP: the admin token it checks (the workers reload
        the rest). An invalid file keeps the running config, as the workers do."""
        try:
            self.config = load_config(self.path)
        except ConfigError as exc:
            log.error("SIGHUP: the supervisor keeps its config: %s", str(exc).replace("\n", "; "))

    async def _wait_all(self, timeout: float) -> None:
        with trio.move_on_after(timeout):
            while any(p is not None and p.poll() is None for p in self.procs):
                await trio.sleep(0.1)
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                log.error("worker pid %d did not stop in %.0fs: killed", proc.pid, timeout)
                proc.kill()

    # -------------------------------------------------------------- the gathering admin endpoint

    def gather(self, path: str) -> list[tuple[int, int, bytes]]:
        """(worker, status, body) of ``path`` on every live worker."""
        out = []
        for i, port in enumerate(self.ports):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as response:
                    out.append((i, response.status, response.read()))
            except urllib.error.HTTPError as exc:
                out.append((i, exc.code, exc.read()))
            except OSError:
                continue  # starting or restarting
        return out


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?( .*)$")


def merge_metrics(parts: list[tuple[int, bytes]]) -> bytes:
    """Prometheus text of every worker as one: samples labelled worker="i", HELP/TYPE once."""
    seen: set[str] = set()
    families: dict[str, list[str]] = {}
    order: list[str] = []
    for worker, body in parts:
        family = ""
        for line in body.decode().splitlines():
            if line.startswith("# "):
                words = line.split(" ", 3)
                family = words[2] if len(words) > 2 else ""
                if family not in families:
                    families[family] = []
                    order.append(family)
                if line not in seen:
                    seen.add(line)
                    families[family].append(line)
                continue
            m = _SAMPLE.match(line)
            if m is None:
                continue
            labels = f'worker="{worker}"' + (f",{m.group(3)}" if m.group(3) else "")
            families.setdefault(family, []).append(f"{m.group(1)}{{{labels}}}{m.group(4)}")
    return ("\n".join(line for f in order for line in families[f]) + "\n").encode()


def merge_status(parts: list[tuple[int, dict]]) -> dict:
    merged: dict = {"target": None, "ready": False, "workers": [], "backends": [], "sessions": [], "totals": {}}
    for worker, data in parts:
        merged["target"] = data["target"]
        merged["ready"] = merged["ready"] or data["ready"]
        merged["workers"].append({"worker": worker, "ready": data["ready"], "sessions": len(data["sessions"])})
        merged["backends"] = merged["backends"] or data["backends"]
        merged["sessions"] += [{**s, "worker": worker} for s in data["sessions"]]
        for key, value in data["totals"].items():
            if isinstance(value, dict):
                into = merged["totals"].setdefault(key, {})
                for k, v in value.items():
                    into[k] = into.get(k, 0) + v
            else:
                merged["totals"][key] = merged["totals"].get(key, 0) + value
    return merged


async def serve_gathering_admin(sup: Supervisor, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    from proxy import admin

    async def gather(path: str) -> list[tuple[int, int, bytes]]:
        return await trio.to_thread.run_sync(sup.gather, path)

    def healthz():
        alive = [i for i, p in enumerate(sup.procs) if p is not None and p.poll() is None]
        return admin.json_answer(200, {"status": "alive", "workers_alive": alive, "workers": sup.count, "restarts": sup.restarts})

    async def readyz():
        ready = any(status == 200 for _w, status, _b in await gather("/readyz"))
        return admin.json_answer(200 if ready else 503, {"ready": ready})

    async def metrics():
        return 200, admin.CONTENT_TYPE, merge_metrics([(w, b) for w, s, b in await gather("/metrics") if s == 200])

    async def status():
        return admin.json_answer(200, merge_status([(w, json.loads(b)) for w, s, b in await gather("/status") if s == 200]))

    table = {"/healthz": healthz, "/health": healthz, "/readyz": readyz, "/metrics": metrics, "/status": status}
    await admin.serve_routes(sup.config, sup.config.admin_address, lambda: table, task_status=task_status,
                             current_config=lambda: sup.config)  # fmt: skip


def supervise(config: Config, path: str, count: int) -> int:
    sup = Supervisor(config, path, count)
    log.info("target %s: %d worker processes sharing %s", config.name, count, config.listen.address)
    try:
        trio.run(sup.run)
    except KeyboardInterrupt:
        sup.signal_all(signal.SIGTERM)
    return 0
