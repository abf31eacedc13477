"""bench.dm_e2e's accounting of dm-worker's log: failed transactions as DM sees them per phase
(full load / sync) apart from the raw ERROR lines, restarts per phase, query-status units, and
a table with a column of its own per run."""

from __future__ import annotations

from bench.dm_e2e import dm_events, phase_at, render, subtask_units
from tests.lab.dm import parse_log

T0 = 1_764_000_000  # 2025-11-24 16:00:00 UTC


def _line(at: float, level: str, message: str, fields: str = "") -> str:
    import time

    stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.gmtime(at)) + f".{int(at * 1000) % 1000:03d}"
    return f'[{stamp} +00:00] [{level}] [x.go:1] ["{message}"]{fields}'


class FakeDM:
    def __init__(self, lines: list[str]) -> None:
        self.text = "\n".join(lines) + "\n"

    def worker_log_text(self) -> str:
        return self.text

    def events(self, *messages: str):
        return parse_log(self.text, messages)

    def pauses(self):
        return self.events("paused")


LOG = [
    _line(T0 + 5, "ERROR", "execute statement failed", " [stmt=REPLACE]"),  # full load: a chunk's statement
    _line(T0 + 5.5, "ERROR", "execute statement failed", " [stmt=REPLACE]"),
    _line(T0 + 6, "ERROR", "unit process error", ' [unit=Load] [error="Message:\\"invalid connection\\""]'),
    _line(T0 + 6, "INFO", "paused", " [task=shop] [unit=Load]"),
    _line(T0 + 8, "INFO", "dispatch auto resume task"),
    _line(T0 + 20, "INFO", "switching to next unit", " [subtask=shop] [unit=Load]"),
    # sync: a retryable error logs two WARN lines for one try, a connection error one
    _line(T0 + 30, "WARN", "execute statements", " [retry=0]"),
    _line(T0 + 30, "WARN", "execute sql failed by retryable error", " [retry=0]"),
    _line(T0 + 31, "WARN", "execute sql failed by connection error", " [retry=0]"),
    _line(T0 + 32, "ERROR", "execute statement failed", " [query=UPDATE]"),
    _line(T0 + 32, "ERROR", "execute statements failed after retry"),
    _line(T0 + 32, "INFO", "paused", " [task=shop] [unit=Sync]"),
]


def test_failed_transactions_per_phase_apart_from_error_lines():
    ev = dm_events(FakeDM(LOG), started=T0, now=T0 + 40)
    assert ev["sync_started"] == T0 + 20
    load, sync = ev["by_phase"]["load"], ev["by_phase"]["sync"]
    assert (load["failed_txns"], load["failed_statements"], load["pauses"], load["unit_errors"]) == (2, 2, 1, 1)
    assert round(load["paused_s"]) == 2
    # one retried try per line of its own (not two for the retryable one), one given up
    assert (sync["retried_in_place"], sync["gave_up"], sync["failed_txns"], sync["pauses"]) == (2, 1, 3, 1)
    assert round(sync["paused_s"]) == 8 and ev["never_resumed"] == 1
    assert ev["failed_txns"] == 5 and ev["retried_in_place"] == 2
    assert ev["error_lines"] == 5  # the raw count: every ERROR line, whatever it says


def test_query_status_can_start_the_sync_phase_first():
    ev = dm_events(FakeDM(LOG), started=T0, now=T0 + 40, sync_running_at=T0 + 4)
    assert ev["sync_started"] == T0 + 4  # the earlier of the log's switch and query-status
    assert ev["by_phase"]["load"]["failed_txns"] == 0
    assert phase_at(T0 + 3, T0 + 4) == "load" and phase_at(T0 + 4, T0 + 4) == "sync" and phase_at(T0, None) == "load"


def test_subtask_units_reads_query_status():
    answer = {
        "result": True,
        "sources": [
            {"result": True, "sourceStatus": {"source": "s"}, "subTaskStatus": [{"name": "shop", "stage": "Running", "unit": "Sync"}]},
            {"subTaskStatus": [{"name": "shop", "stage": "Paused", "unit": "Load"}]},
        ],
    }
    assert subtask_units(answer) == [("Running", "Sync"), ("Paused", "Load")]
    assert subtask_units({"result": False, "msg": "task not found"}) == []


def test_table_has_restarts_per_phase_and_rows_per_run():
    def run(target: str, rows: int, restarts: list[tuple[float, str]]) -> dict:
        ev = dm_events(FakeDM(LOG), started=T0, now=T0 + 40)
        return {
            "target": target, "started": T0, "ended": T0 + 40, "chaos_from": "sync", "caught_up_after": 3.0,
            "restarts": [{"stop": T0 + t, "up": T0 + t + 2, "graceful_wait": 0, "phase": p} for t, p in restarts],
            "load": {"transactions": 10}, "lag": [(T0, 0.5)], "dm": ev, "proxy": None, "identical": True,
            "tables": {"orders": {"upstream": (rows, 1), "downstream": (rows, 1)}},
        }  # fmt: skip

    table = render({"runs": [run("direct", 7, [(25, "sync"), (33, "sync")]), run("proxy", 9, [(10, "load"), (25, "sync")])]})
    lines = {line[:48].strip(): line[48:].split() for line in table.splitlines()}
    assert lines["restarts during the full load (dump + load)"] == ["0", "1"]
    assert lines["restarts during the sync"] == ["2", "1"]
    assert lines["rows compared (this run, upstream)"] == ["7", "9"]
    assert lines["sync: failed transactions as DM sees them*"] == ["3", "3"]
    assert lines["ERROR lines in dm-worker's log (raw)"] == ["5", "5"]
