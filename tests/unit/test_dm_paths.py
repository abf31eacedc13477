"""bench/dm_paths.py's pieces without a lab: one task in several of DM's modes at once, DM's
statements of several runs merged into one corpus (a shape per line, lists cut to a few
items), and the validator's counts read from ``query-status``."""

from __future__ import annotations

import json

from bench.dm_e2e import statement_shape
from bench.dm_paths import ONLINE_CHANGES, PATHS, merged_corpus, path_setup
from bench.dm_shards import SHARD_DDL, Setup, _counts, render, validation_of


def test_modes_at_once_merge_their_settings_and_statements():
    assert path_setup(Setup(), "online-ddl").statements == [*SHARD_DDL, *ONLINE_CHANGES]
    setup = path_setup(Setup(faults="kill", target="proxy"), "online-ddl", "validator", "relay", "compact")
    assert (setup.shards, setup.shard_mode) == (1, None)
    assert setup.task == {"online-ddl": True, "validators": {"global": {"mode": "full"}}}
    assert setup.instance == {"validator-config-name": "global"}
    assert setup.source == {"enable-relay": True}
    assert setup.syncer == {"compact": True, "multiple-rows": True}
    # With the validator, no ADD COLUMN (DM's validator cannot check rows from both sides of one).
    assert [str(what) for _, what in setup.statements] == [
        "ALTER TABLE orders ADD INDEX idx_state (state)",
        "ALTER TABLE order_items MODIFY COLUMN qty BIGINT NOT NULL",
        "pt-online-schema-change --alter 'ADD INDEX idx_created (created)' t=orders",
        "pt-online-schema-change --alter 'MODIFY COLUMN price DECIMAL(12,2) NOT NULL' t=order_items",
    ]
    assert setup.label == "online-ddl+validator+relay+compact kill proxy"
    assert str(ONLINE_CHANGES[0][1]) == "pt-online-schema-change --alter 'ADD COLUMN gift_wrap TINYINT NOT NULL DEFAULT 0' t=orders"


def test_a_shape_ignores_the_literals_and_how_many_rows_or_keys():
    assert statement_shape("DELETE FROM `t` WHERE (`a`) IN ((1),(2),(3),(4))") == (
        "DELETE FROM `T` WHERE ( `A` ) IN (...)",
        "DELETE FROM `t` WHERE (`a`) IN ((1),(2),(3))",
    )
    assert statement_shape("SELECT a FROM t WHERE id IN ('1','2')")[0] == statement_shape("SELECT a FROM t WHERE id IN ('7')")[0]
    # A subquery is no list of keys.
    assert statement_shape("SELECT a FROM t WHERE id IN (SELECT id FROM u)")[0] == "SELECT A FROM T WHERE ID IN ( SELECT ID FROM U )"
    # The rows are cut, what follows them is kept.
    shape, example = statement_shape("INSERT INTO t (a) VALUES (1),(2),(3),(4) ON DUPLICATE KEY UPDATE a=VALUES(a)")
    assert example == "INSERT INTO t (a) VALUES (1),(2),(3) ON DUPLICATE KEY UPDATE a=VALUES(a)"
    assert shape == statement_shape("INSERT INTO t (a) VALUES (9) ON DUPLICATE KEY UPDATE a=VALUES(a)")[0]
    # VALUES(c) of an ON DUPLICATE KEY UPDATE is no row (DM's checkpoint upsert was cut there).
    checkpoint = "INSERT INTO cp (id, a, b, c) VALUES (1, 2, 3, 4) ON DUPLICATE KEY UPDATE a = VALUES(a), b = VALUES(b), c = VALUES(c)"
    assert statement_shape(checkpoint)[1] == checkpoint


def test_the_corpus_merges_the_direct_runs_by_shape(tmp_path):
    def write(name, entries):
        (tmp_path / name).write_text("".join(json.dumps(e) + "\n" for e in entries))

    write(
        "dm_statements-online-ddl-rolling-direct.jsonl",
        [{"sql": "COMMIT", "count": 5}, {"sql": "SELECT x FROM t WHERE id IN (1,2,3,4)", "count": 1}],
    )
    write("dm_statements-loader-replace-rolling-direct.jsonl", [{"sql": "COMMIT", "count": 2}])
    write("dm_statements-validator-rolling-direct.jsonl", [{"sql": "SELECT x FROM t WHERE id IN (5)", "count": 3}])
    write("dm_statements-relay-rolling-proxy.jsonl", [{"sql": "SELECT 'proxy runs are left out'", "count": 1}])
    corpus = merged_corpus([tmp_path])
    assert corpus == [
        {"sql": "COMMIT", "count": 7, "paths": ["loader-replace", "online-ddl"]},
        {"sql": "SELECT x FROM t WHERE id IN (1,2,3)", "count": 4, "paths": ["online-ddl", "validator"]},
    ]
    assert set(PATHS) >= {p for e in corpus for p in e["paths"]}


STATUS = {"sources": [{"subTaskStatus": [{"name": "shop", "stage": "Running", "validation": {
    "processedRowsStatus": "insert/update/delete: 14230/6652/2509", "pendingRowsStatus": "insert/update/delete: 0/0/0",
    "errorRowsStatus": "new/ignored/resolved: 0/0/0"}}]}]}  # fmt: skip


def test_the_validators_counts():
    assert validation_of(STATUS) == "errors 0/0/0, processed 14230/6652/2509, pending 0/0/0"
    assert validation_of({"sources": [{"subTaskStatus": [{"validation": None}]}]}) is None
    assert validation_of(None) is None
    assert _counts("insert/update/delete: 497/91/0") == [497, 91, 0]
    assert _counts("") is None


def test_the_table_has_the_validators_rows_when_a_run_had_one():
    run = {
        "label": "validator rolling proxy", "shard_mode": None, "faults": "rolling", "restarts": [{}] * 3, "ended": 10.0,
        "lag": [(1.0, 0.5)], "caught_up_after": 0.0, "identical": True, "proxies": [], "ddl": [],
        "dm": {"by_phase": {}, "sync_started": 0.0, "pauses": 0, "paused_s": 0.0, "failed": {}},
        "locks": {"resolved": 0, "left": []}, "status_at_end": STATUS,
    }  # fmt: skip
    table = render([run])
    assert "validator's rows in error (new/ignored/resolved)" in table and "14230/6652/2509" in table
    assert "validator's rows" not in render([{**run, "status_at_end": None}])


def test_the_lag_is_read_on_the_first_server_that_answers(monkeypatch):
    # (It read nothing once bench.dm_e2e's Sampler took the servers instead of their ports.)
    from types import SimpleNamespace

    import bench.dm_shards as shards

    asked = []

    def lag(port, host="127.0.0.1"):
        asked.append((host, port))
        return None if port == 1 else 2.5

    monkeypatch.setattr(shards, "merged_lag", lag)
    sampler = shards.ShardSampler([SimpleNamespace(host="h1", port=1), SimpleNamespace(host="h2", port=2)], dm=None)
    assert sampler.read_lag() == 2.5 and sampler.read_lag() == 2.5
    assert asked == [("h1", 1), ("h2", 2), ("h2", 2)]  # the one that answered is asked first
