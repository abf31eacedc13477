"""The targets: the ways a client reaches the database, and the intermediaries behind them.

- ``direct``: the database's own port;
- ``haproxy``: HAProxy in TCP mode (bench/haproxy.py);
- ``trio_pump``, ``uvloop_pump``, ``netio_pump``: bare byte pumps on trio, on uvloop and on the
  proxy's own socket layer (bench/floors.py), the event loops' floors;
- ``proxy``: replay-proxy with an empty plugin chain (bench/benchproxy.py): the fast lane on the
  compiled core; ``proxy_interpreted`` (the interpreted core), ``proxy_trio`` (trio alone:
  ``listen.fast_lane = false``), ``proxy_trio_interpreted`` (both): each lane and build apart;
- ``proxy_workers``: the same with ``--workers N``; skipped while ``python -m proxy --help`` does
  not list ``--workers``;
- ``proxy_mirrored``: replay-proxy as the one worker of a supervisor that keeps its clients
  (``listen.takeover``; the benchmark plays the supervisor's keeper, bench/benchproxy.py): the
  proxy beside it is the same code without the records a worker's crash is survived by;
- ``proxy+plugins``: replay-proxy with a chain of plugins (bench/plugin_variants.py).

A ``Stack`` starts the intermediaries for a list of targets in parallel, in front of one database
port, each in its own folder under the work dir (``stack<N>/<target>``); a target that cannot run
here is left out with its reason (``unavailable``), one that fails to start or dies is reported in
``problems``. Intermediaries have a pid, so workloads can read their CPU and memory.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import REPO
from bench.benchproxy import BenchProxy, mirrored_proxy, proxy_has_workers_flag, variant_of
from bench.floors import Floor, floor_unavailable_reason
from bench.haproxy import HAProxy
from bench.plugin_variants import PluginVariant
from tests.lab.proxy import ProxyProcess

ALL_TARGETS = ("direct", "haproxy", "trio_pump", "uvloop_pump", "netio_pump", "proxy", "proxy_interpreted", "proxy_trio",
               "proxy_trio_interpreted", "proxy_mirrored", "proxy_workers", "proxy+plugins")  # fmt: skip
INTERMEDIARIES = ALL_TARGETS[1:]
# What a run measures unless --targets says: not the proxy's lanes and builds apart (ask for those).
DEFAULT_TARGETS = tuple(t for t in ALL_TARGETS if t not in ("proxy_interpreted", "proxy_trio", "proxy_trio_interpreted"))
FLOORS = {"trio_pump": "trio", "uvloop_pump": "uvloop", "netio_pump": "netio"}


class TargetUnavailable(RuntimeError):
    """The target cannot run here (a missing module or flag): skipped with this note, not a problem."""


@dataclass
class Target:
    name: str
    port: int
    pid: int | None = None  # the intermediary process (None for direct); CPU counts its descendants too
    counts_path: Path | None = None  # trio loop counts (instrumented processes, bench/instrument.py)

    @property
    def is_intermediary(self) -> bool:
        return self.pid is not None


class Stack:
    """The intermediaries in front of the database at ``db_port``; ``problems`` is the run's list,
    shared with its owner (BenchEnv)."""

    def __init__(
        self,
        workdir: Path,
        *,
        plugins: PluginVariant,
        proxy_overrides: dict[str, Any],
        haproxy_threads: int,
        workers: int,
        instrument: bool,
        problems: list[str],
        log: Callable[[str], None],
        proxy_source: Path = REPO,
    ) -> None:
        self.workdir = workdir
        self.plugins = plugins
        self.proxy_overrides = proxy_overrides
        self.haproxy_threads = haproxy_threads
        self.workers = workers
        self.instrument = instrument  # trio loop counts of the proxy and the trio pump
        self.proxy_source = proxy_source  # the checkout whose proxy package the proxy targets run
        self.problems = problems
        self.log = log
        self.db_port: int | None = None
        self.haproxy: HAProxy | None = None
        self.floors: dict[str, Floor] = {}
        self.proxies: dict[str, ProxyProcess] = {}
        self.targets: dict[str, Target] = {}
        self.unavailable: dict[str, str] = {}  # target -> why it is skipped
        self._stack_no = 0
        self._stack_names: list[str] | None = None

    def proxy_config(self, with_plugins: bool) -> dict[str, Any]:
        overrides: dict[str, Any] = {"log": {"level": "warning"}}
        for key, value in self.proxy_overrides.items():
            if isinstance(value, dict) and isinstance(overrides.get(key), dict):
                overrides[key] = {**overrides[key], **value}
            else:
                overrides[key] = value
        return overrides

    def _start_proxy(self, name: str) -> None:
        assert self.db_port is not None
        with_plugins = name == "proxy+plugins"
        if with_plugins:
            missing = self.plugins.missing_modules()
            if missing:
                raise TargetUnavailable(f"plugin(s) not available yet: {', '.join(missing)}; chain {list(self.plugins.chain)}")
        args: list[str] = []
        if name == "proxy_workers":
            if not proxy_has_workers_flag():
                raise TargetUnavailable("replay-proxy has no --workers option yet (`python -m proxy --help` does not list it)")
            args = ["--workers", str(self.workers)]
        workdir = self.workdir / f"stack{self._stack_no}" / name.replace("+", "_")
        make = mirrored_proxy if name == "proxy_mirrored" else BenchProxy
        config, env = variant_of(name, self.proxy_config(with_plugins))
        proxy = make(
            workdir,
            self.db_port,
            args=args,
            counts=self.instrument and name not in ("proxy_workers", "proxy_mirrored"),
            source=self.proxy_source,
            env=env,
            **config,
        )
        if with_plugins:
            with proxy.config_path.open("a") as f:
                f.write(self.plugins.toml(workdir))
        try:
            proxy.start(timeout=60)
        except Exception:
            if proxy.proc is not None:
                if proxy.proc.poll() is None:
                    proxy.proc.kill()
                    proxy.proc.wait(5)
            raise
        assert proxy.proc is not None
        self.proxies[name] = proxy
        self.targets[name] = Target(name, proxy.port, proxy.proc.pid, proxy.counts_path)

    def _start_floor(self, name: str) -> None:
        assert self.db_port is not None
        reason = floor_unavailable_reason(FLOORS[name])
        if reason:
            raise TargetUnavailable(reason)
        workdir = self.workdir / f"stack{self._stack_no}" / name
        floor = Floor(FLOORS[name], workdir, self.db_port, counts=self.instrument).start()
        self.floors[name] = floor
        self.targets[name] = Target(name, floor.port, floor.pid, floor.counts_path)

    def _start_haproxy(self) -> None:
        assert self.db_port is not None
        workdir = self.workdir / f"stack{self._stack_no}" / "haproxy"
        self.haproxy = HAProxy(workdir, self.db_port, nbthread=self.haproxy_threads).start()
        self.targets["haproxy"] = Target("haproxy", self.haproxy.port, self.haproxy.pid)

    def start(self, db_port: int, names: list[str]) -> dict[str, Target]:
        """Start fresh intermediaries for ``names`` (in parallel); return the targets that run.

        A target that cannot start is left out and its reason kept in ``self.unavailable``.
        """
        self.stop()
        self.db_port = db_port
        self._stack_no += 1
        self._stack_names = list(names)
        self.targets = {}
        self.unavailable = {}
        if "direct" in names:
            self.targets["direct"] = Target("direct", db_port, None)
        errors: dict[str, str] = {}
        skipped: set[str] = set()

        def start(name: str) -> None:
            try:
                if name == "haproxy":
                    self._start_haproxy()
                elif name in FLOORS:
                    self._start_floor(name)
                else:
                    self._start_proxy(name)
            except TargetUnavailable as exc:
                errors[name] = str(exc).strip()
                skipped.add(name)
            except Exception as exc:  # reported, the others still run
                errors[name] = str(exc).strip()

        threads = [threading.Thread(target=start, args=(n,)) for n in names if n != "direct"]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        for name, err in errors.items():
            self.unavailable[name] = err
            if name in skipped:
                self.log(f"SKIP {name}: {err.splitlines()[0]}")
            else:
                self.problems.append(f"{name} failed to start: {err[:2000]}")
                self.log(f"{name} failed to start: {err.splitlines()[0] if err else '?'}")
        return {n: self.targets[n] for n in names if n in self.targets}

    def check_alive(self, name: str) -> str | None:
        """None if the target's process still runs; otherwise a description (and it is restarted)."""
        if name == "direct":
            return None
        if name == "haproxy":
            if self.haproxy is not None and self.haproxy.pid is not None:
                return None
            what = f"haproxy died (exit {self.haproxy.proc.returncode if self.haproxy else '?'})"
            self.problems.append(what)
            self._start_haproxy()
            return what
        if name in FLOORS:
            floor = self.floors.get(name)
            if floor is None or floor.pid is not None:
                return None
            what = f"{name} died (exit {floor.proc.returncode if floor.proc else '?'}):\n{floor.log_text()[-2000:]}"
            self.problems.append(what)
            self._start_floor(name)
            return what
        proxy = self.proxies.get(name)
        if proxy is None or proxy.proc is None or proxy.proc.poll() is None:
            return None
        what = (
            f"{name} process exited with status {proxy.proc.returncode} during the benchmark; "
            f"log {proxy.log_path} ends with:\n{proxy.log_text()[-3000:]}"
        )
        self.problems.append(what)
        self.log(f"{name} DIED (exit {proxy.proc.returncode}); restarting it. Log: {proxy.log_path}")
        try:
            self._start_proxy(name)
        except Exception as exc:
            self.unavailable[name] = f"could not restart after a crash: {exc}"
        return what

    def runs(self, names: list[str]) -> bool:
        """True if the running stack was started for exactly these targets."""
        return self._stack_names == list(names)

    def mark_logs(self) -> dict[str, tuple[int, int]]:
        """Where each proxy's log ends now (see proxy_log_findings)."""
        return {n: (id(p), len(p.log_text())) for n, p in self.proxies.items()}

    def proxy_log_findings(self, name: str, mark: dict[str, tuple[int, int]] | None = None) -> list[str]:
        """Lines the proxy logged since ``mark`` (log level is 'warning' in benchmarks, so any line
        is a warning or an error)."""
        proxy = self.proxies.get(name)
        if proxy is None:
            return []
        text = proxy.log_text()
        if mark and name in mark and mark[name][0] == id(proxy):
            text = text[mark[name][1] :]
        return [line for line in text.splitlines() if line.strip()]

    def stop(self) -> None:
        for name, proxy in list(self.proxies.items()):
            try:
                proxy.stop()
            except Exception as exc:
                self.problems.append(f"{name} did not stop cleanly: {str(exc)[:3000]}")
                self.log(f"{name} did not stop cleanly (see results JSON 'problems')")
            finally:
                if proxy.proc is not None:
                    if proxy.proc.poll() is None:
                        proxy.proc.kill()
                        proxy.proc.wait(5)
                    self.proxies = {}
        if self.haproxy is not None:
            try:
                self.haproxy.stop()
            except Exception as exc:
                self.problems.append(f"haproxy did not stop cleanly: {exc}")
            self.haproxy = None
        for name, floor in list(self.floors.items()):
            try:
                floor.stop()
            except Exception as exc:
                self.problems.append(f"{name} did not stop cleanly: {exc}")
        self.floors = {}
        self.targets = {n: t for n, t in self.targets.items() if n == "direct"}
        self._stack_names = None
