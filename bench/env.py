"""The benchmark environment: one MariaDB, and a set of "targets" in front of it.

A target is a way for a client to reach the database:

- ``direct``: MariaDB's own port;
- ``haproxy``: HAProxy in TCP mode (bench/haproxy.py);
- ``trio_pump``, ``uvloop_pump``: bare byte pumps on trio and on uvloop (bench/floors.py), the
  event loops' floors;
- ``proxy``: replay-proxy with an empty plugin chain (``python -m proxy``, via tests/lab/proxy.py);
- ``proxy_workers``: the same with ``--workers N`` (N = cores by default); skipped while
  ``python -m proxy --help`` does not list ``--workers``;
- ``proxy+plugins``: replay-proxy with a chain of plugins (default firewall, query_log, metrics).

With ``instrument=True`` the single-process proxies run through bench/instrumented_proxy.py and
the trio pump with ``--counts``: both count trio's task steps and I/O waits (bench/instrument.py).

Intermediaries (everything but ``direct``) have a pid, so workloads can read their CPU and memory.
They are shared by consecutive workloads that only count CPU and throughput, and started afresh
for workloads that measure memory (``Workload.fresh_stack``), so earlier workloads' heap growth
does not blur "RSS per connection" or "peak RSS".
Every process started here is stopped by ``close()`` and, as a last resort, at interpreter exit.
"""

from __future__ import annotations

import atexit
import datetime as _dt
import importlib.util
import os
import platform
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import REPO
from bench.floors import Floor, floor_unavailable_reason
from bench.haproxy import HAProxy, haproxy_unavailable_reason
from bench.procstat import process_tree
from tests.lab.mariadb import MariaDB, mariadb_unavailable_reason
from tests.lab.proxy import ProxyProcess, toml_key, toml_value
from tests.lab.tidb import TiDB, tidb_unavailable_reason

APP_USER = "app"
APP_PASSWORD = "apppw"
DATABASES = ("test", "sbtest", "bench")

ALL_TARGETS = ("direct", "haproxy", "trio_pump", "uvloop_pump", "proxy", "proxy_workers", "proxy+plugins")
INTERMEDIARIES = ALL_TARGETS[1:]
FLOORS = {"trio_pump": "trio", "uvloop_pump": "uvloop"}


class TargetUnavailable(RuntimeError):
    """The target cannot run here (a missing module or flag): skipped with this note, not a problem."""

# "a|b": the first of a, b that is installed (plugins are being written alongside the bench).
DEFAULT_PLUGIN_CHAIN = ("firewall", "query_log|rewrite", "metrics")

# Options that make each plugin do real work on every statement without changing the workload:
# rules are checked on every statement and never match what the benchmarks send.
DEFAULT_PLUGIN_OPTIONS: dict[str, dict[str, Any]] = {
    "firewall": {
        "deny": ["DROP DATABASE", "TRUNCATE"],
        "deny_patterns": ["(?i)\\bFROM\\s+`?mysql`?\\."],
    },
    # Production-like: slow statements, failed ones and a 1 % sample go to a file.
    "query_log": {"path": "{workdir}/query.log", "slow_ms": 100, "sample": 0.01},
    "metrics": {"statement_kinds": True},
    "rewrite": {
        "rules": [{"pattern": "(?i)^\\s*INSERT\\s+INTO\\s+`?bench_no_such_table`?", "replace": "REPLACE INTO bench_no_such_table"}],
    },
}

def raise_nofile(wanted: int = 16384) -> int:
    """Raise RLIMIT_NOFILE (soft) towards ``wanted``; children inherit it. Returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def sigterm_as_interrupt() -> None:
    """SIGTERM unwinds like Ctrl-C, so finally blocks stop every process we started."""
    if threading.current_thread() is threading.main_thread():

        def _interrupt(signum: int, frame: object) -> None:
            raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

        signal.signal(signal.SIGTERM, _interrupt)


def missing_tools() -> list[str]:
    reasons = []
    for reason in (mariadb_unavailable_reason(), haproxy_unavailable_reason()):
        if reason:
            reasons.append(reason)
    for tool, pkg in (("sysbench", "sysbench"), ("mariadb", "mariadb-client")):
        if shutil.which(tool) is None:
            reasons.append(f"{tool} not found on PATH (Debian: apt-get install {pkg})")
    return reasons


@dataclass
class Target:
    name: str
    port: int
    pid: int | None = None  # the intermediary process (None for direct); CPU counts its descendants too
    counts_path: Path | None = None  # trio loop counts (instrumented processes, bench/instrument.py)

    @property
    def is_intermediary(self) -> bool:
        return self.pid is not None


_WORKERS_FLAG: bool | None = None


def proxy_has_workers_flag() -> bool:
    """True once ``python -m proxy --help`` lists ``--workers`` (being implemented alongside)."""
    global _WORKERS_FLAG
    if _WORKERS_FLAG is None:
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        try:
            res = subprocess.run([sys.executable, "-m", "proxy", "--help"], cwd=REPO, env=env, capture_output=True,
                                 text=True, timeout=60)
            _WORKERS_FLAG = "--workers" in res.stdout
        except (OSError, subprocess.TimeoutExpired):
            _WORKERS_FLAG = False
    return _WORKERS_FLAG


class BenchProxy(ProxyProcess):
    """tests.lab.proxy.ProxyProcess with extra command-line arguments (``--workers N``) or started
    through bench/instrumented_proxy.py (``counts``); stop() also ends worker processes the
    supervisor left behind."""

    def __init__(self, workdir: Path, backend_port: int, *, args: list[str] | None = None, counts: bool = False,
                 **overrides: Any) -> None:
        super().__init__(workdir, backend_port, **overrides)
        self.args = list(args or [])
        self.counts_path = self.workdir / "loop-counts.json" if counts else None
        self.tree: list[int] = []

    def start(self, timeout: float = 20) -> "BenchProxy":
        from tests.lab.procs import kill_at_exit, wait_listening

        self._log = open(self.log_path, "ab")
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        if self.counts_path is not None:
            cmd = [sys.executable, "-m", "bench.instrumented_proxy", "--config", str(self.config_path),
                   "--counts", str(self.counts_path)]
        else:
            cmd = [sys.executable, "-m", "proxy", "--config", str(self.config_path), *self.args]
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT, env=env)
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


@atexit.register
def _kill_proxy_trees() -> None:
    """At exit, before tests.lab.procs kills the supervisors, kill the workers under them too."""
    for proxy in list(_LIVE_PROXIES):
        if proxy.proc is not None and proxy.proc.poll() is None:
            proxy.tree = process_tree(proxy.proc.pid)
            proxy.proc.kill()
            proxy.kill_leftovers()


def _plugin_module(name: str) -> str:
    return name.partition(":")[0] if ":" in name else f"plugins.{name}"


def _plugin_installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(_plugin_module(name)) is not None
    except (ImportError, ValueError):
        return False


def _subst(value: Any, workdir: Path | None) -> Any:
    if isinstance(value, str) and workdir is not None:
        return value.replace("{workdir}", str(workdir))
    if isinstance(value, list):
        return [_subst(v, workdir) for v in value]
    if isinstance(value, dict):
        return {k: _subst(v, workdir) for k, v in value.items()}
    return value


@dataclass
class PluginVariant:
    """The chain of the proxy+plugins target. Entries "a|b" take the first installed plugin."""

    chain: tuple[str, ...] = DEFAULT_PLUGIN_CHAIN
    options: dict[str, dict[str, Any]] | None = None  # None: DEFAULT_PLUGIN_OPTIONS

    def resolved_chain(self) -> tuple[list[str], list[str]]:
        """(chain with alternatives resolved, entries with no installed plugin)."""
        chain, missing = [], []
        for entry in self.chain:
            choices = [c.strip() for c in entry.split("|") if c.strip()]
            found = next((c for c in choices if _plugin_installed(c)), None)
            if found is None:
                missing.append(" or ".join(f"{c} ({_plugin_module(c)})" for c in choices))
            else:
                chain.append(found)
        return chain, missing

    def missing_modules(self) -> list[str]:
        return self.resolved_chain()[1]

    def toml(self, workdir: Path | None = None) -> str:
        """The [plugins] section; "{workdir}" in a string option becomes the proxy's work dir."""
        chain, _ = self.resolved_chain()
        options = DEFAULT_PLUGIN_OPTIONS if self.options is None else self.options
        lines = ["[plugins]", f"chain = {toml_value(chain)}"]
        for name in chain:
            opts = options.get(name)
            if opts:
                lines.append(f"[plugins.{toml_key(name)}]")
                lines.extend(f"{toml_key(k)} = {toml_value(_subst(v, workdir))}" for k, v in opts.items())
        return "\n".join(lines) + "\n"

    def describe(self) -> dict[str, Any]:
        chain, missing = self.resolved_chain()
        options = DEFAULT_PLUGIN_OPTIONS if self.options is None else self.options
        return {"requested": list(self.chain), "chain": chain, "missing": missing,
                "options": {n: options[n] for n in chain if n in options}}


class BenchEnv:
    """Owns the MariaDB server and the intermediaries; records problems seen along the way."""

    def __init__(
        self,
        workdir: Path | None = None,
        *,
        keep: bool = False,
        plugins: PluginVariant | None = None,
        proxy_overrides: dict[str, Any] | None = None,
        haproxy_threads: int = 1,
        mariadb_args: list[str] | None = None,
        verbose: bool = True,
        workers: int | None = None,
        instrument: bool = False,
        perf: bool = False,
    ) -> None:
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="replay-bench-")).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self.plugins = plugins or PluginVariant()
        self.proxy_overrides = proxy_overrides or {}
        self.haproxy_threads = haproxy_threads
        self.mariadb_args = mariadb_args or []
        self.verbose = verbose
        self.workers = workers or os.cpu_count() or 1
        self.instrument = instrument  # trio loop counts of the proxy and the trio pump
        self.perf = perf  # perf stat of the middle process over every run (bench/middle.py)
        self.db: MariaDB | TiDB | None = None
        self.haproxy: HAProxy | None = None
        self.floors: dict[str, Floor] = {}
        self.proxies: dict[str, ProxyProcess] = {}
        self.targets: dict[str, Target] = {}
        self.unavailable: dict[str, str] = {}  # target -> why it is skipped
        self.problems: list[str] = []
        self._stack_no = 0
        self._stack_names: list[str] | None = None

    def log(self, msg: str) -> None:
        if self.verbose:
            print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    # -- MariaDB ------------------------------------------------------------------------------

    def start_db(self, tuned: bool = True, backend: str = "mariadb") -> MariaDB | TiDB:
        if backend == "tidb":
            return self._start_tidb()
        args = [
            # The 200 MB table and the sysbench tables stay in memory: the benchmark measures the
            # hop to the server, not the disk.
            "--innodb-buffer-pool-size=768M",
            "--innodb-log-file-size=256M",
        ] if tuned else []
        args += self.mariadb_args
        self.db = MariaDB(self.workdir / "mariadb", max_allowed_packet="128M", extra_args=args)
        for attempt in range(3):
            try:
                self.db.start()
                break
            except Exception as exc:  # mariadb-install-db is occasionally flaky on a busy /tmp
                if attempt == 2:
                    raise
                self.log(f"MariaDB start failed ({str(exc).splitlines()[0]}); retrying")
                shutil.rmtree(self.workdir / "mariadb" / "data", ignore_errors=True)
                time.sleep(1)
        self.db.create_user(APP_USER, APP_PASSWORD)
        for name in DATABASES:
            self.db.create_database(name)
        self.log(f"MariaDB on 127.0.0.1:{self.db.port} (pid {self.db.pid}), data in {self.db.datadir}")
        return self.db

    def _start_tidb(self) -> TiDB:
        reason = tidb_unavailable_reason()
        if reason:
            raise SystemExit(f"bench: --backend tidb: {reason}")
        self.db = TiDB(self.workdir / "tidb", max_allowed_packet="128M")
        self.db.start()
        self.db.create_user(APP_USER, APP_PASSWORD)
        for name in DATABASES:
            self.db.create_database(name)
        self.log(f"tidb-server (unistore) on 127.0.0.1:{self.db.port} (pid {self.db.pid}), data in {self.db.store}")
        return self.db

    # -- intermediaries -----------------------------------------------------------------------

    def _proxy_config(self, with_plugins: bool) -> dict[str, Any]:
        overrides: dict[str, Any] = {"log": {"level": "warning"}}
        for key, value in self.proxy_overrides.items():
            if isinstance(value, dict) and isinstance(overrides.get(key), dict):
                overrides[key] = {**overrides[key], **value}
            else:
                overrides[key] = value
        return overrides

    def _start_proxy(self, name: str) -> None:
        assert self.db is not None
        with_plugins = name == "proxy+plugins"
        if with_plugins:
            missing = self.plugins.missing_modules()
            if missing:
                raise TargetUnavailable(
                    f"plugin(s) not available yet: {', '.join(missing)}; chain {list(self.plugins.chain)}"
                )
        args: list[str] = []
        if name == "proxy_workers":
            if not proxy_has_workers_flag():
                raise TargetUnavailable(
                    "replay-proxy has no --workers option yet (`python -m proxy --help` does not list it)")
            args = ["--workers", str(self.workers)]
        workdir = self.workdir / f"stack{self._stack_no}" / name.replace("+", "_")
        proxy = BenchProxy(workdir, self.db.port, args=args, counts=self.instrument and name != "proxy_workers",
                           **self._proxy_config(with_plugins))
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
        assert self.db is not None
        reason = floor_unavailable_reason(FLOORS[name])
        if reason:
            raise TargetUnavailable(reason)
        workdir = self.workdir / f"stack{self._stack_no}" / name
        floor = Floor(FLOORS[name], workdir, self.db.port, counts=self.instrument).start()
        self.floors[name] = floor
        self.targets[name] = Target(name, floor.port, floor.pid, floor.counts_path)

    def _start_haproxy(self) -> None:
        assert self.db is not None
        workdir = self.workdir / f"stack{self._stack_no}" / "haproxy"
        self.haproxy = HAProxy(workdir, self.db.port, nbthread=self.haproxy_threads).start()
        self.targets["haproxy"] = Target("haproxy", self.haproxy.port, self.haproxy.pid)

    def start_stack(self, names: list[str]) -> dict[str, Target]:
        """Start fresh intermediaries for ``names`` (in parallel); return the targets that run.

        A target that cannot start is left out and its reason kept in ``self.unavailable``.
        """
        assert self.db is not None
        self.stop_stack()
        self._stack_no += 1
        self._stack_names = list(names)
        self.targets = {}
        self.unavailable = {}
        if "direct" in names:
            self.targets["direct"] = Target("direct", self.db.port, None)
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

    def has_stack(self, names: list[str]) -> bool:
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
            text = text[mark[name][1]:]
        return [line for line in text.splitlines() if line.strip()]

    def stop_stack(self) -> None:
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

    def close(self) -> None:
        try:
            self.stop_stack()
        finally:
            if self.db is not None:
                try:
                    self.db.stop()
                except Exception as exc:
                    self.problems.append(f"MariaDB did not stop cleanly: {exc}")
            if self._own_workdir and not self.keep:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "BenchEnv":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_meta(now: _dt.datetime, module: str, argv: list[str] | None, **extra: Any) -> dict[str, Any]:
    """The results header every benchmark writes: when, where, with what, and the command line."""
    return {
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "host": socket.gethostname(),
        "cores": os.cpu_count(),
        "kernel": f"{platform.system()} {platform.release()}",
        "loadavg_start": os.getloadavg(),
        "versions": versions(),
        **extra,
        "command": " ".join([sys.executable, "-m", module, *(argv if argv is not None else sys.argv[1:])]),
    }


def versions() -> dict[str, str]:
    """Versions of the tools in play, for the results header."""
    out: dict[str, str] = {"python": sys.version.split()[0]}
    for name, cmd in (
        ("mariadbd", ["mariadbd", "--version"]),
        ("haproxy", ["haproxy", "-v"]),
        ("sysbench", ["sysbench", "--version"]),
        ("go", ["go", "version"]),
    ):
        exe = shutil.which(cmd[0]) or (f"/usr/sbin/{cmd[0]}" if os.path.exists(f"/usr/sbin/{cmd[0]}") else None)
        if exe is None:
            continue
        try:
            res = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, timeout=10)
            out[name] = (res.stdout or res.stderr).strip().splitlines()[0]
        except (OSError, subprocess.TimeoutExpired, IndexError):
            pass
    try:
        out["git_commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "proxy", "plugins"], cwd=REPO, capture_output=True,
            text=True, timeout=10,
        ).stdout.strip()
        if dirty:
            out["git_commit"] += " (+ uncommitted changes in proxy/ or plugins/)"
    except (OSError, subprocess.TimeoutExpired):
        pass
    return out
