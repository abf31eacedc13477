"""long_data_flood: one session prepares 12 statements and sends each 12 MiB of long data
(COM_STMT_SEND_LONG_DATA, every piece under max_allowed_packet: one piece of 12 MiB for half
of them, four of 3 MiB -- under limits.spool_threshold -- for the other half), then executes them.

The proxy keeps long data to send it again after a reconnect: past limits.spool_threshold it
goes to the session's spool file, so the process's memory should not follow what the client
sends. Reported for the intermediary: peak RSS over the flood minus RSS before it, and RSS
after the session closed minus RSS before (what stays), with the values checked on the server.
"""

from __future__ import annotations

import hashlib
import time
from typing import TYPE_CHECKING

import pymysql

from bench.procstat import PeakRss, rss_kib
from bench.workloads import Metric, Settings, Workload, WorkloadError
from tests.lab import rawps

if TYPE_CHECKING:
    from bench.env import BenchEnv
    from bench.stack import Target

MiB = 1 << 20
STATEMENTS = 12
PIECE = 12 * MiB


def _value(i: int) -> bytes:
    block = hashlib.sha512(b"%d" % i).digest()
    return (block * (PIECE // len(block) + 1))[:PIECE]


class LongDataFlood(Workload):
    def __init__(self) -> None:
        super().__init__(
            name="long_data_flood",
            title=f"long data flood: {STATEMENTS} statements x {PIECE // MiB} MiB of COM_STMT_SEND_LONG_DATA in one session",
            metrics=[
                Metric("rss_growth_mb", "peak RSS - RSS before", "MB", "lower", intermediary_only=True),
                Metric("rss_kept_mb", "RSS after the session - before", "MB", "lower", intermediary_only=True),
                Metric("seconds", "time", "s", "lower", digits=1),
            ],
            targets=("direct", "proxy"),
            fresh_stack=True,
        )

    def setup(self, env: BenchEnv, settings: Settings) -> None:
        assert env.db is not None
        env.db.query("CREATE TABLE IF NOT EXISTS bench.long_data (id INT PRIMARY KEY, data LONGBLOB)")
        self.info.update(statements=STATEMENTS, piece_bytes=PIECE)

    def run(self, env: BenchEnv, target: Target, settings: Settings) -> dict[str, float | None]:
        env.db.query("DELETE FROM bench.long_data")
        values = [_value(i) for i in range(STATEMENTS)]
        try:
            conn = rawps.connect(target.port, database="bench", max_allowed_packet=64 * MiB)
        except pymysql.err.Error as e:
            raise WorkloadError(f"cannot connect through {target.name}: {e!r}") from None
        started = time.monotonic()
        with PeakRss(target.pid) as peak:
            try:
                statements = [rawps.prepare(conn, "INSERT INTO long_data (id, data) VALUES (?, ?)") for _ in values]
                for i, (stmt, value) in enumerate(zip(statements, values)):
                    step = PIECE if i % 2 == 0 else PIECE // 4
                    for at in range(0, PIECE, step):
                        rawps.send_long_data(conn, stmt, 1, value[at : at + step])
                for i, stmt in enumerate(statements):
                    rawps.execute(conn, stmt, [i, rawps.LONG_DATA])
            except pymysql.err.Error as e:
                raise WorkloadError(f"long data through {target.name}: {e!r}") from None
            finally:
                conn.close()
        elapsed = time.monotonic() - started
        time.sleep(0.5)  # the session's end reaches the proxy
        kept = (rss_kib(target.pid) - peak.start_kib) * 1024 / 1e6 if target.pid else None
        rows = env.db.query("SELECT id, SHA1(data) FROM bench.long_data ORDER BY id")
        expected = [(i, hashlib.sha1(v).hexdigest()) for i, v in enumerate(values)]
        if [(int(r[0]), r[1]) for r in rows] != expected:
            raise WorkloadError(f"long data through {target.name}: the server holds other values than were sent")
        return {
            "rss_growth_mb": (peak.peak_kib - peak.start_kib) * 1024 / 1e6 if peak.peak_kib is not None else None,
            "rss_kept_mb": kept,
            "seconds": elapsed,
        }

    def teardown(self, env: BenchEnv, settings: Settings) -> None:
        if env.db is not None and env.db.is_running():
            env.db.query("DROP TABLE IF EXISTS bench.long_data")
