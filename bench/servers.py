"""The database the benchmarks measure against: a throwaway MariaDB (tests/lab/mariadb.py) or a
tidb-server on unistore (tests/lab/tidb.py), with the benchmarks' user and databases."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from tests.lab.mariadb import MariaDB
from tests.lab.tidb import TiDB, tidb_unavailable_reason

APP_USER = "app"
APP_PASSWORD = "apppw"
DATABASES = ("test", "sbtest", "bench")

# The 200 MB table and the sysbench tables stay in memory: the benchmark measures the hop to the
# server, not the disk.
TUNED_MARIADB_ARGS = ["--innodb-buffer-pool-size=768M", "--innodb-log-file-size=256M"]


def new_database(workdir: Path, backend: str = "mariadb", *, tuned: bool = True, mariadb_args: list[str] | None = None) -> MariaDB | TiDB:
    """The server for ``backend`` ("mariadb" or "tidb") in ``workdir``, not started yet.
    SystemExit if tidb-server is asked for and not there."""
    if backend == "tidb":
        reason = tidb_unavailable_reason()
        if reason:
            raise SystemExit(f"bench: --backend tidb: {reason}")
        return TiDB(workdir / "tidb", max_allowed_packet="128M")
    args = (list(TUNED_MARIADB_ARGS) if tuned else []) + list(mariadb_args or [])
    return MariaDB(workdir / "mariadb", max_allowed_packet="128M", extra_args=args)


def start_database(db: MariaDB | TiDB, log: Callable[[str], None]) -> None:
    """Start ``db`` and create the benchmarks' user and databases."""
    if isinstance(db, TiDB):
        db.start()
    else:
        for attempt in range(3):
            try:
                db.start()
                break
            except Exception as exc:  # mariadb-install-db is occasionally flaky on a busy /tmp
                if attempt == 2:
                    raise
                log(f"MariaDB start failed ({str(exc).splitlines()[0]}); retrying")
                shutil.rmtree(db.datadir, ignore_errors=True)
                time.sleep(1)
    db.create_user(APP_USER, APP_PASSWORD)
    for name in DATABASES:
        db.create_database(name)
    if isinstance(db, TiDB):
        log(f"tidb-server (unistore) on 127.0.0.1:{db.port} (pid {db.pid}), data in {db.store}")
    else:
        log(f"MariaDB on 127.0.0.1:{db.port} (pid {db.pid}), data in {db.datadir}")
