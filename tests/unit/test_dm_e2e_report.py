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


# --- the cluster's accounting: the middles' numbers, the restart log, --no-faults' rates ---------

TIPROXY_METRICS = """\
# HELP tiproxy_balance_migrate_total Number and result of session migration.
# TYPE tiproxy_balance_migrate_total counter
tiproxy_balance_migrate_total{from="127.0.0.1:4001",migrate_res="succeed",reason="status",to="127.0.0.1:4002"} 14
tiproxy_balance_migrate_total{from="127.0.0.1:4001",migrate_res="fail",reason="status",to="127.0.0.1:4003"} 2
tiproxy_balance_migrate_total{from="127.0.0.1:4002",migrate_res="succeed",reason="conn",to="127.0.0.1:4001"} 5
tiproxy_server_create_connection_total 40
tiproxy_server_disconnection_total{type="success"} 3
tiproxy_server_disconnection_total{type="client network break"} 1
tiproxy_server_disconnection_total{type="backend network break"} 6
tiproxy_server_disconnection_total{type="get backend fail"} 2
"""
TIPROXY_LOG = """\
[2025/11/24 16:00:01.000 +00:00] [WARN] [backend/backend_conn_mgr.go:642] [redirect connection failed] [from=127.0.0.1:4001]
[2025/11/24 16:00:02.000 +00:00] [INFO] [backend/backend_conn_mgr.go:686] [backend connection is closed, close client connection]
[2025/11/24 16:00:03.000 +00:00] [INFO] [server/server.go:1] [health check] [addr=127.0.0.1:4001]
"""


def test_tiproxy_numbers_from_its_metrics_and_log():
    from bench.dm_middles import tiproxy_numbers

    t = tiproxy_numbers(TIPROXY_METRICS, TIPROXY_LOG)
    assert (t["migrated"], t["migrate_failed"]) == (19, 2)
    assert t["migrated_by_reason"] == {"status": 14, "conn": 5}  # successful ones only
    assert t["disconnections"]["backend network break"] == 6 and t["connections_created"] == 40
    assert t["lost"] == 8  # backend network break + get backend fail, not the client's own ends
    assert (t["log_migration_lines"], t["log_redirect_failed"], t["log_closed_with_backend"]) == (1, 1, 1)


def test_proxy_numbers_count_moves_from_the_log_and_outcomes_from_metrics():
    from bench.dm_middles import haproxy_numbers, proxy_numbers_from

    metrics = (
        'replay_proxy_recoveries_total{target="dm-e2e",outcome="resumed"} 7.0\n'
        'replay_proxy_recoveries_total{target="dm-e2e",outcome="aborted_1158"} 1.0\n'
        'replay_proxy_replayed_statements_total{target="dm-e2e"} 30.0\n'
    )
    log = "\n".join(
        ["session 3: moved from 127.0.0.1:4001 to 127.0.0.1:4002 (connection 9) in 4 ms, between transactions"] * 4
        + ["session 4: could not move off draining backend 127.0.0.1:4001: refused", "session 5: recovered on 127.0.0.1:4003"]
    )
    n = proxy_numbers_from(metrics, log)
    assert n["recoveries"] == {"resumed": 7, "aborted_1158": 1} and n["refused_1158"] == 1 and n["replayed_statements"] == 30
    assert (n["moved"], n["move_failed"], n["recovered_lines"], n["tracebacks"]) == (4, 1, 1, 0)
    hap = "[WARNING]  (1) : Server tidb/tidb0 is DOWN, reason: Layer4\n[WARNING]  (1) : Server tidb/tidb0 is UP, reason: Layer7\n"
    assert haproxy_numbers(hap) == {"marked_down": 1, "marked_up": 1}


def test_the_bench_own_pause_is_not_dms_and_the_load_unit_is_timed():
    lines = [
        _line(T0 + 2, "INFO", "switching to next unit", " [subtask=shop] [unit=Dump]"),
        *LOG,
        _line(T0 + 50, "ERROR", "unit process error", ' [unit=Sync] [error="context canceled"]'),
        _line(T0 + 50, "INFO", "paused", " [task=shop] [unit=Sync]"),  # pause-task at T0 + 50 .. resume-task at T0 + 60
    ]
    with_it = dm_events(FakeDM(lines), started=T0, now=T0 + 70)
    ev = dm_events(FakeDM(lines), started=T0, now=T0 + 70, manual=[(T0 + 50, T0 + 60)])
    assert with_it["pauses"] == 3 and with_it["failed_total"] == 2
    assert ev["pauses"] == 2 and ev["manual_pauses"] == 1 and ev["failed_total"] == 1
    assert ev["load_unit_s"] == 18  # Dump done at +2, Load done at +20


def test_replication_rates_from_row_counts_and_the_backlog():
    from bench.dm_e2e import applied, replication_rates

    rows = [(T0 + 1, 0), (T0 + 4, 3000), (T0 + 7, 9000), (T0 + 10, 15000), (T0 + 25, 15100)]
    # the load: 100 txn/s (5 statements each) from T0 on; the task paused at +40, resumed at +100
    progress = [(T0 + t, 100 * t, 500 * t) for t in range(0, 201)]
    # after the resume DM applies 3 upstream seconds of load per second (300 txn/s):
    # the heartbeat it has applied is 40 + 3 * (t - 100) upstream, until it catches up at +130
    lag = [(T0 + t, None if t == 104 else (t - (40 + 3 * (t - 100)) if t < 130 else 0.0)) for t in range(100, 141)]
    series = applied(lag, progress)
    assert series[0] == (T0 + 100, 4000, 20000)  # applied at the resume: what was written by +40
    assert (T0 + 104) not in [x[0] for x in series]  # an unreadable lag sample is no point
    backlog = {"paused_at": T0 + 40, "resumed_at": T0 + 100, "behind_txns": 6000, "caught_up_at": T0 + 130}
    rates = replication_rates(rows, {"sync_started": T0 + 12, "load_unit_s": 9.5}, backlog, lag, progress)
    assert rates["load_rows"] == 12000 and rates["load_rows_per_s"] == 2000  # +4 .. +10; the sync's rows left out
    assert rates["load_s"] == 9.5 and rates["backlog"] is backlog and rates["catch_up_s"] == 30
    assert round(rates["txn_per_s"]) == 300 and round(rates["statements_per_s"]) == 1500  # +105 .. +130
    # not drained while the load ran: the run's final catch-up ends the window
    backlog = dict(backlog, caught_up_at=None)
    late = replication_rates(rows, {"sync_started": T0 + 12}, backlog, lag, progress, drained_at=T0 + 120)
    assert late["catch_up_s"] == 20 and round(late["txn_per_s"]) == 300
    assert "txn_per_s" not in replication_rates(rows, {}, backlog, lag, progress)  # no end: no rate
    assert replication_rates([(T0, 5)], {"sync_started": None}, None)["load_rows_per_s"] is None


def _cluster_run(target: str, signal: str, extra: dict) -> dict:
    ev = dm_events(FakeDM(LOG), started=T0, now=T0 + 40)
    restarts = [
        {"server": f"tidb{i % 3}", "index": i % 3, "signal": signal, "stop": T0 + 10 * i, "down": T0 + 10 * i + 3,
         "up": T0 + 10 * i + 5, "graceful_wait": 3 if signal == "SIGTERM" else 0, "phase": "sync"}
        for i in range(1, 4)
    ]  # fmt: skip
    return {
        "target": target, "downstream": "cluster of 3 tidb-servers", "started": T0, "ended": T0 + 40, "caught_up_after": 3.0,
        "restarts": restarts, "load": {"transactions": 10}, "lag": [(T0, 0.5)], "dm": ev, "identical": True,
        "tables": {"orders": {"upstream": (5, 1), "downstream": (5, 1)}}, "proxy": None, "tiproxy": None, "haproxy": None,
        **extra,
    }  # fmt: skip


def test_cluster_table_has_a_column_per_middle_and_their_numbers():
    from bench.dm_middles import tiproxy_numbers

    proxy = {"recoveries": {"resumed": 2}, "replayed_statements": 3, "refused_1158": 0, "moved": 11}
    runs = [
        _cluster_run("direct", "SIGTERM", {}),
        _cluster_run("haproxy", "SIGTERM", {"haproxy": {"marked_down": 0, "marked_up": 0}}),
        _cluster_run("tiproxy", "SIGTERM", {"tiproxy": tiproxy_numbers(TIPROXY_METRICS, TIPROXY_LOG)}),
        _cluster_run("proxy", "SIGKILL", {"proxy": proxy}),
    ]
    table = render({"runs": runs})
    assert table.splitlines()[0].split() == ["DM"] * 4  # the DM build of each run: none recorded here
    assert table.splitlines()[1].split() == ["one", "server", "HAProxy", "TiProxy", "through", "proxy"]
    lines = {line[:48].strip(): line[48:].split() for line in table.splitlines()}
    assert lines["downstream"] == ["cluster"] * 4
    assert lines["signal"] == ["SIGTERM", "SIGTERM", "SIGTERM", "SIGKILL"]
    assert lines["server down after the signal, median (s)"] == ["3.0"] * 4
    assert lines["serving again after that, median (s)"] == ["2.0"] * 4
    assert lines["TiProxy: sessions migrated (ok / failed)"] == ["-", "-", "19", "/", "2", "-"]
    assert lines["migrated for health (draining server)"] == ["-", "-", "14", "-"]
    assert lines["migrated to rebalance"] == ["-", "-", "5", "-"]
    assert lines["TiProxy: sessions lost (no backend)"] == ["-", "-", "8", "-"]
    assert lines["HAProxy: servers marked down / up"] == ["-", "0", "/", "0", "-", "-"]
    assert lines["proxy: sessions moved off a draining server"] == ["-", "-", "-", "11"]
    assert lines["proxy recoveries: resumed"] == ["-", "-", "-", "2"]
    assert "full load: rows/s (row counts downstream)" not in lines  # only with --no-faults
    # the lag: max while the load ran, and in the sync alone (the full load's lag, and the
    # heartbeat's standstill after the load, left out)
    runs[0]["lag"] = [(T0 + 5, 30.0), (T0 + 21, 9.0), (T0 + 30, 1.0), (T0 + 35, 2.0), (T0 + 60, 80.0)]
    lines = {line[:48].strip(): line[48:].split() for line in render({"runs": runs}).splitlines()}
    assert lines["max lag while the load ran (s, heartbeat)"][0] == "30.0"
    assert lines["in the sync: max / median (s)"][:3] == ["9.0", "/", "2.0"]


def test_rolling_restarts_go_round_the_servers_start_to_start():
    """Event n restarts server (n - 1) mod N; with start_to_start an event that overruns the
    interval delays the next, the others keep the interval from start to start."""
    import threading
    import time as _time

    from bench.dm_e2e import Restarter, cluster_event

    class Server:
        def __init__(self, i: int) -> None:
            from pathlib import Path

            self.basedir, self.graceful_wait, self.running, self.calls = Path(f"/x/tidb{i}"), 3, True, []

        def stop(self, sig):
            self.calls.append(("stop", sig))
            self.running = False

        def start(self):
            self.calls.append(("start",))
            self.running = True

        def is_running(self):
            return self.running

    class FakeCluster:
        servers = [Server(0), Server(1), Server(2)]

    import signal

    record = cluster_event(FakeCluster, signal.SIGKILL)(5)
    assert (record["server"], record["index"], record["signal"], record["graceful_wait"]) == ("tidb1", 1, "SIGKILL", 0)
    assert FakeCluster.servers[1].calls == [("stop", signal.SIGKILL), ("start",)]
    assert record["stop"] <= record["down"] <= record["up"] and "error" not in record

    starts: list[float] = []
    lock = threading.Lock()

    def event(n: int) -> dict:
        with lock:
            starts.append(_time.monotonic())
        _time.sleep(0.35 if n == 2 else 0.05)  # the second overruns the 0.2 s interval
        now = _time.time()
        return {"server": f"tidb{(n - 1) % 3}", "signal": "SIGTERM", "graceful_wait": 0, "stop": now, "down": now, "up": now}

    r = Restarter(event, 0.2, lambda _msg: None, 4, start_to_start=True)
    r.start()
    r.join(10)
    assert len(r.restarts) == 4 and [x["server"] for x in r.restarts] == ["tidb0", "tidb1", "tidb2", "tidb0"]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert 0.17 < gaps[0] < 0.3 and gaps[1] >= 0.34 and 0.17 < gaps[2] < 0.3, gaps


def test_a_server_that_does_not_come_back_ends_the_schedule():
    import signal

    from bench.dm_e2e import Restarter, cluster_event

    class Broken:
        from pathlib import Path

        basedir, graceful_wait = Path("/x/tidb0"), 0

        def stop(self, sig):
            pass

        def start(self):
            raise RuntimeError("tidb-server exited with status 1 during startup")

        def is_running(self):
            return False

    class FakeCluster:
        servers = [Broken()]

    r = Restarter(cluster_event(FakeCluster, signal.SIGTERM), 0.01, lambda _msg: None, 3, start_to_start=True)
    r.start()
    r.join(10)
    assert len(r.restarts) == 1 and r.restarts[0]["up"] is None and "exited with status 1" in r.restarts[0]["error"]


def test_the_results_folder_keeps_the_logs_not_the_data(tmp_path):
    from bench.dm_e2e import DATA_DIRS, drop_data

    for name in (*DATA_DIRS, "dm", "cluster/tidb0"):
        (tmp_path / name).mkdir(parents=True, exist_ok=True)
        (tmp_path / name / "f").write_text("x")
    (tmp_path / "dm" / "dm-worker.log").write_text("log")
    drop_data(tmp_path)
    assert not any((tmp_path / name).exists() for name in DATA_DIRS)
    assert (tmp_path / "dm" / "dm-worker.log").read_text() == "log" and (tmp_path / "cluster" / "tidb0" / "f").exists()
