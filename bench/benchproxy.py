"""The proxy as the benchmarks run it: ``python -m proxy`` (or bench/instrumented_proxy.py, which
counts trio's task steps) as a subprocess, on tests/lab/proxy.py's ``ProxyProcess``; stopping it
also ends the worker processes a ``--workers`` supervisor left behind, and at interpreter exit
every proxy still running is killed with its whole process tree."""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import REPO
from bench.procstat import process_tree
from tests.lab.procs import kill_at_exit, wait_listening
from tests.lab.proxy import ProxyProcess

if TYPE_CHECKING:
    from bench.callgrind import Wrap

_WORKERS_FLAG: bool | None = None


def proxy_has_workers_flag() -> bool:
    """True once ``python -m proxy --help`` lists ``--workers`` (being implemented alongside)."""
    global _WORKERS_FLAG
    if _WORKERS_FLAG is None:
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        try:
            res = subprocess.run([sys.executable, "-m", "proxy", "--help"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
            _WORKERS_FLAG = "--workers" in res.stdout
        except (OSError, subprocess.TimeoutExpired):
            _WORKERS_FLAG = False
    return _WORKERS_FLAG


# The proxy's lanes and builds, as targets: (config overrides, environment) beside its default,
# the fast lane on the compiled core (proxy.hostloop, proxy.corebuild).
_TRIO_ALONE = {"listen": {"fast_lane": False}}
_INTERPRETED = {"REPLAY_PROXY_INTERPRETED": "1"}
VARIANTS: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "proxy_interpreted": ({}, _INTERPRETED),
    "proxy_trio": (_TRIO_ALONE, {}),
    "proxy_trio_interpreted": (_TRIO_ALONE, _INTERPRETED),
}


def variant_of(name: str, config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The config and environment of proxy target ``name`` (``config``: the run's overrides)."""
    overrides, env = VARIANTS.get(name, ({}, {}))
    merged = dict(config)
    for key, value in overrides.items():
        merged[key] = {**merged.get(key, {}), **value}
    return merged, env


class BenchProxy(ProxyProcess):
    """tests.lab.proxy.ProxyProcess with extra command-line arguments (``--workers N``) or started
    through bench/instrumented_proxy.py (``counts``); stop() also ends worker processes the
    supervisor left behind."""

    def __init__(self, workdir: Path, backend_port: int, *, args: list[str] | None = None, counts: bool = False,
                 source: Path = REPO, env: dict[str, str] | None = None, **overrides: Any) -> None:  # fmt: skip
        """``source``: the checkout whose ``proxy`` package runs (another commit's, for before and
        after); ``env``: variables its process gets besides (``VARIANTS``)."""
        super().__init__(workdir, backend_port, **overrides)
        self.extra_env = dict(env or {})
        self.source = Path(source)
        self.args = list(args or [])
        self.counts_path = self.workdir / "loop-counts.json" if counts else None
        self.tree: list[int] = []

    def start(self, timeout: float = 20, wrap: Wrap | None = None) -> BenchProxy:
        """``wrap``: run the proxy under this command prefix and environment (bench/callgrind.py)."""
        self._log = open(self.log_path, "ab")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(dict.fromkeys([str(self.source), str(REPO), os.environ.get("PYTHONPATH", "")])),
                   **self.extra_env)  # fmt: skip
        if self.counts_path is not None:
            cmd = [sys.executable, "-m", "bench.instrumented_proxy", "--config", str(self.config_path), "--counts", str(self.counts_path)]
        else:
            cmd = [sys.executable, "-m", "proxy", "--config", str(self.config_path), *self.args]
        if wrap is not None:
            cmd, env = wrap.command(cmd), wrap.environment(env)
        self.proc = subprocess.Popen(cmd, cwd=self.source, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        kill_at_exit(self.proc)
        _LIVE_PROXIES.add(self)
        wait_listening(self.proc, self.port, timeout, "proxy", self.log_text)
        return self

    def stop(self, timeout: float = 10) -> str:
        if self.proc is not None and self.proc.poll() is None:
            self.tree = process_tree(self.proc.pid)
        try:
            return super().stop(timeout)
        finally:
            _LIVE_PROXIES.discard(self)
            self.kill_leftovers()

    def kill_leftovers(self) -> None:
        """SIGKILL the descendants seen at stop() that still run (a supervisor that died first)."""
        own = self.proc.pid if self.proc is not None else None
        for pid in self.tree:
            if pid == own:
                continue
            try:
                if "proxy" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                    os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass


_LIVE_PROXIES: set[BenchProxy] = set()


class BenchKeeper:
    """The supervisor's session keeper (``proxy.handover.keeper``) run by the benchmark itself,
    in a thread: a proxy started with ``worker_args`` runs as the one worker of a supervisor
    that keeps its clients (``listen.takeover``), so its hot path writes every session's record,
    and callgrind counts that one process. One per benchmark process (its address is the pid's)."""

    _running: BenchKeeper | None = None

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-keeper", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the benchmark's session keeper did not start")

    @classmethod
    def running(cls) -> BenchKeeper:
        if cls._running is None:
            cls._running = cls()
        return cls._running

    def _run(self) -> None:
        import trio

        from proxy.handover.keeper import SessionKeeper

        async def main() -> None:
            keeper = SessionKeeper(os.getpid(), timeout=60)
            async with trio.open_nursery() as nursery:
                await nursery.start(keeper.serve)
                self._ready.set()

        trio.run(main)

    @staticmethod
    def worker_args(admin_port: int) -> list[str]:
        """The arguments that make ``python -m proxy`` this keeper's worker 0 (its private admin
        endpoint on ``admin_port``)."""
        return ["--worker", "0/1", "--worker-admin", str(admin_port), "--supervisor-pid", str(os.getpid())]


def mirrored_proxy(workdir: Path, backend_port: int, **kwargs: Any) -> BenchProxy:
    """A BenchProxy that runs as the one worker of the benchmark's ``BenchKeeper``."""
    BenchKeeper.running()
    proxy = BenchProxy(workdir, backend_port, **kwargs)
    proxy.args = BenchKeeper.worker_args(proxy.admin_port)
    return proxy


@atexit.register
def _kill_proxy_trees() -> None:
    """At exit, before tests.lab.procs kills the supervisors, kill the workers under them too."""
    for proxy in list(_LIVE_PROXIES):
        if proxy.proc is not None and proxy.proc.poll() is None:
            proxy.tree = process_tree(proxy.proc.pid)
            proxy.proc.kill()
            proxy.kill_leftovers()
