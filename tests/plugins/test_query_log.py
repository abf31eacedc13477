"""query_log: JSON lines, redaction, sampling, slow and failed statements, cut long text."""

from __future__ import annotations

import json
import logging

import pytest

from plugins.query_log import redact
from proxy import plugintest as pt
from proxy.sqltext import MARIADB


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def log_path(tmp_path):
    return tmp_path / "queries.jsonl"


@pytest.fixture
def logger(log_path):
    """query_log harnesses writing to log_path; their files are closed at the end."""
    made: list[pt.Harness] = []

    def make(**options) -> pt.Harness:
        made.append(pt.harness("query_log", path=str(log_path), **options))
        return made[-1]

    yield make
    for h in made:
        h.shutdown()


async def test_line_fields(log_path):
    with pt.harness("query_log", path=str(log_path), target="orders") as h:  # closes the file at the end
        session = h.new_session("dm", database="shop", id=7)
        await h.roundtrip("INSERT INTO t VALUES (1, 'secret')", pt.result(affected_rows=1, latency=0.0012345), session)
        await h.roundtrip("SELECT * FROM t WHERE k = 0x1f", pt.error(1146, "no such table", latency=0.5), session)
    first, second = lines(log_path)
    assert first.pop("ts").endswith("Z")
    assert first == {
        "target": "orders", "session": 7, "user": "dm", "db": "shop", "command": "COM_QUERY",
        "sql": "INSERT INTO t VALUES (?, ?)", "latency_ms": 1.234, "rows": 0, "affected_rows": 1,
        "error": None, "slow": False,
    }  # fmt: skip
    assert second["sql"] == "SELECT * FROM t WHERE k = ?" and second["error"] == 1146


async def test_unredacted(log_path, logger):
    h = logger(redact=False)
    await h.roundtrip("UPDATE t SET a = 'x' WHERE k = 5")
    assert lines(log_path)[0]["sql"] == "UPDATE t SET a = 'x' WHERE k = 5"


async def test_sampling_slow_and_errors(log_path, logger):
    h = logger(sample=0, slow_ms=100)
    await h.roundtrip("SELECT 'fast'", pt.result(latency=0.099))
    await h.roundtrip("SELECT 'slow'", pt.result(latency=0.1))
    await h.roundtrip("SELECT 'failed'", pt.error(1064, "syntax"))
    logged = lines(log_path)
    assert [(r["latency_ms"], r["slow"], r["error"]) for r in logged] == [(100.0, True, None), (0.001 * 1000, False, 1064)]


async def test_errors_can_follow_the_sample(log_path, logger):
    h = logger(sample=0, errors=False)
    await h.roundtrip("SELECT 1", pt.error(1064, "syntax"))
    assert not log_path.read_text()


async def test_sample_fraction_and_no_text_work_when_not_logged(log_path, logger, monkeypatch):
    h = logger(sample=0.25)
    draws = iter([0.1, 0.3, 0.2, 0.9])
    h.plugin.random = lambda: next(draws)
    redacted = []
    monkeypatch.setattr("plugins.query_log.redact", lambda text, *reading: redacted.append(text) or text)
    for i in range(4):
        await h.roundtrip(f"SELECT {i}")
    assert [r["sql"] for r in lines(log_path)] == ["SELECT 0", "SELECT 2"]
    assert redacted == ["SELECT 0", "SELECT 2"]  # statements not logged are never redacted


async def test_commands_logged(log_path, logger):
    h = logger()
    await h.roundtrip(pt.ping())
    await h.roundtrip(pt.prepare("SELECT ? FROM t"))
    await h.roundtrip(pt.execute(3))
    assert [(r["command"], r["sql"]) for r in lines(log_path)] == [
        ("COM_STMT_PREPARE", "SELECT ? FROM t"), ("COM_STMT_EXECUTE", None),
    ]  # fmt: skip
    everything = logger(all_commands=True)
    await everything.roundtrip(pt.ping())
    assert lines(log_path)[-1]["command"] == "COM_PING"


async def test_long_statements_are_cut_before_redaction(log_path, logger):
    h = logger(max_sql_length=40)
    values = ", ".join(f"({i}, 'row {i}')" for i in range(10000))
    await h.roundtrip(f"INSERT INTO t VALUES {values}")
    await h.roundtrip("SELECT 'a string that is cut in the mid', 2")
    big, cut = (r["sql"] for r in lines(log_path))
    assert big == "INSERT INTO t VALUES (?, ?), (?, ?..."  # cut inside 'row 1': that literal is redacted too
    assert cut == "SELECT ?..."


async def test_plugin_answers_are_logged(log_path):
    with pt.chain(["firewall", "query_log"], {"firewall": {"deny": ["DROP"]}, "query_log": {"path": str(log_path)}}) as h:
        await h.roundtrip("DROP TABLE customers")
    (record,) = lines(log_path)
    assert record["error"] == 1142 and record["answered_by"] == "firewall" and record["sql"] == "DROP TABLE customers"


async def test_default_goes_to_the_query_logger(caplog):
    h = pt.harness("query_log")
    with caplog.at_level(logging.INFO, "replay_proxy.query"):
        await h.roundtrip("SELECT 1")
    (record,) = [r for r in caplog.records if r.name == "replay_proxy.query"]
    assert json.loads(record.getMessage())["sql"] == "SELECT ?"


@pytest.mark.parametrize(
    "sql, expected",
    [
        ("INSERT INTO t VALUES (1, 'a''b', -2.5e3, 0x1F, X'ab', b'01', NULL, ?)", "INSERT INTO t VALUES (?, ?, -?, ?, ?, ?, NULL, ?)"),
        ("SELECT _utf8mb4'x', _binary 0xff, N'n', \"dq\"", "SELECT ?, ?, ?, ?"),
        ("SELECT `col1`, t.1e5 FROM t1 WHERE c IN (1,2)", "SELECT `col1`, t.1e5 FROM t1 WHERE c IN (?,?)"),
        ("/*!40101 SET @x = 5 */", "/*!40101 SET @x = ? */"),
        ("SELECT * FROM t WHERE a = 'unterminated", "SELECT * FROM t WHERE a = ?"),
        ("SELECT @@max_allowed_packet, _latin1", "SELECT @@max_allowed_packet, _latin1"),
    ],
)
def test_redact(sql, expected):
    assert redact(sql, MARIADB) == expected


def test_bad_options():
    from proxy.config import ConfigError

    with pytest.raises(ConfigError, match=r"\$\.plugins\.query_log\.sample: expected a number from 0 to 1, got 1\.5"):
        pt.harness("query_log", sample=1.5)
    with pytest.raises(ConfigError, match=r"\$\.plugins\.query_log\.slow_ms: expected a number, got '1s'"):
        pt.harness("query_log", slow_ms="1s")
