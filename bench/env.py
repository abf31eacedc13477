"""The benchmark environment: one database, and a set of "targets" in front of it.

``BenchEnv`` is what the workloads are given: the database (``db``), the running targets
(``targets``, ``proxies``, ``unavailable``), the problems seen along the way (``problems``) and a
log line (``log``). It owns the work dir and puts together one module per concern:

- bench/servers.py: the database (a tuned MariaDB or a tidb-server), its user and databases;
- bench/stack.py: the targets and the intermediaries behind them (HAProxy, the pumps, proxies),
  started in parallel, checked, restarted when they die, stopped;
- bench/benchproxy.py: the proxy as a subprocess (``--workers``, instrumented) and its cleanup;
- bench/plugin_variants.py: the plugin chain of ``proxy+plugins``;
- bench/runinfo.py: the tools a run needs, their versions, the results header;
- bench/hygiene.py: SIGTERM as Ctrl-C, the file-descriptor limit.

Intermediaries are shared by consecutive workloads that only count CPU and throughput, and
started afresh for workloads that measure memory (``Workload.fresh_stack``), so earlier
workloads' heap growth does not blur "RSS per connection" or "peak RSS". Every process started
here is stopped by ``close()`` and, as a last resort, at interpreter exit.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import REPO
from bench.plugin_variants import PluginVariant
from bench.servers import new_database, start_database
from bench.stack import Stack, Target
from tests.lab.mariadb import MariaDB
from tests.lab.proxy import ProxyProcess
from tests.lab.tidb import TiDB


class BenchEnv:
    """Owns the database and the intermediaries; records problems seen along the way."""

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
        proxy_source: Path | None = None,
    ) -> None:
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="replay-bench-")).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self.mariadb_args = mariadb_args or []
        self.verbose = verbose
        self.perf = perf  # perf stat of the middle process over every run (bench/middle.py)
        self.db: MariaDB | TiDB | None = None
        self.problems: list[str] = []
        self.stack = Stack(
            self.workdir,
            plugins=plugins or PluginVariant(),
            proxy_overrides=proxy_overrides or {},
            haproxy_threads=haproxy_threads,
            workers=workers or os.cpu_count() or 1,
            instrument=instrument,
            problems=self.problems,
            log=self.log,
            proxy_source=proxy_source or REPO,
        )

    def log(self, msg: str) -> None:
        if self.verbose:
            print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    # -- the database -------------------------------------------------------------------------

    def start_db(self, tuned: bool = True, backend: str = "mariadb") -> MariaDB | TiDB:
        self.db = new_database(self.workdir, backend, tuned=tuned, mariadb_args=self.mariadb_args)
        start_database(self.db, self.log)
        return self.db

    # -- the targets in front of it -----------------------------------------------------------

    @property
    def targets(self) -> dict[str, Target]:
        return self.stack.targets

    @property
    def proxies(self) -> dict[str, ProxyProcess]:
        return self.stack.proxies

    @property
    def unavailable(self) -> dict[str, str]:
        """Target -> why it is skipped."""
        return self.stack.unavailable

    def start_stack(self, names: list[str]) -> dict[str, Target]:
        """Start fresh intermediaries for ``names`` (in parallel); return the targets that run.

        A target that cannot start is left out and its reason kept in ``self.unavailable``.
        """
        assert self.db is not None
        return self.stack.start(self.db.port, names)

    def check_alive(self, name: str) -> str | None:
        """None if the target's process still runs; otherwise a description (and it is restarted)."""
        return self.stack.check_alive(name)

    def has_stack(self, names: list[str]) -> bool:
        """True if the running stack was started for exactly these targets."""
        return self.stack.runs(names)

    def mark_logs(self) -> dict[str, tuple[int, int]]:
        """Where each proxy's log ends now (see proxy_log_findings)."""
        return self.stack.mark_logs()

    def proxy_log_findings(self, name: str, mark: dict[str, tuple[int, int]] | None = None) -> list[str]:
        """Lines the proxy logged since ``mark`` (any line: benchmarks log at 'warning')."""
        return self.stack.proxy_log_findings(name, mark)

    def stop_stack(self) -> None:
        self.stack.stop()

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

    def __enter__(self) -> BenchEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
