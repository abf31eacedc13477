"""Precision on real traffic: every statement shape DM v8.5.5 sent to TiDB, judged as TiDB reads it.

tests/corpus/dm_v855_tidb.jsonl is TiDB's general log of a real run, DM writing directly to
tidb-server (so no statement of the proxy's own is in it), one example per shape with how often
it came: ``python -m bench.dm_e2e --targets direct --duration 90 --scale 10000 --general-log``
(71 shapes, 132,372 statements, TiDB restarted every 8 s, so DM's resume and safe-mode paths are
in it: the checkpoint and meta tables, Lightning's load, safe-mode REPLACE / DELETE ... LIMIT 1,
normal-mode INSERT / UPDATE, replicated DDL between ``SET @@SESSION.TIMESTAMP``s).

tests/corpus/dm_v855_paths.jsonl is the same for DM's other modes (``python -m bench.dm_paths
--targets direct --general-log --duration 60 --load-scale 20000 --catch-up 180``, then
``--corpus``: one run per mode, DM writing directly to a cluster of two tidb-servers restarted
in turn every 8 s, 7 restarts a run; 100 shapes, 189,984 statements): ``online-ddl: true`` with
pt-online-schema-change upstream, the validator in ``full`` mode, the relay log, ``compact``
with ``multiple-rows`` (its safe mode is ``INSERT ... ON DUPLICATE KEY UPDATE``, its deletes
``WHERE (k = ?) OR (k = ?)``), the full load's ``on-duplicate-logical: replace``; each line says
in which modes its shape came. (dm_v855_tidb.jsonl's checkpoint upsert is cut after
``binlog_pos = VALUES(binlog_pos)``: its generator took VALUES(c) for rows then.)

A refusal must be because the proxy truly cannot know: none of these is unknown, none runs
code, none makes the session unrestorable, and safe mode's statements are claimed idempotent.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.sqltext import Kind, analyze, is_idempotent
from proxy.sqltext.dialect import TIDB
from proxy.sqltext.triage import fast_verb


def corpus(name: str) -> list[dict]:
    return [json.loads(line) for line in (Path(__file__).parents[1] / "corpus" / name).open()]


CORPUS = corpus("dm_v855_tidb.jsonl")
PATHS = corpus("dm_v855_paths.jsonl")
EVERY = CORPUS + PATHS


def test_the_corpus_is_the_one_described():
    assert len(CORPUS) == 71
    assert sum(entry["count"] for entry in CORPUS) == 132_372
    kinds = {analyze(e["sql"], dialect=TIDB).first.kind for e in CORPUS}
    assert {Kind.DDL, Kind.REPLACE, Kind.DELETE, Kind.INSERT, Kind.UPDATE, Kind.SET, Kind.BEGIN, Kind.COMMIT} <= kinds


def test_the_paths_corpus_is_the_one_described():
    from bench.dm_paths import PATHS as MODES

    assert (len(PATHS), sum(entry["count"] for entry in PATHS)) == (100, 189_984)
    assert {mode for entry in PATHS for mode in entry["paths"]} == set(MODES)
    texts = [entry["sql"] for entry in PATHS]
    assert any(t.startswith("REPLACE INTO `dm_meta`.`shop_onlineddl`") for t in texts)  # online DDL's ghost table
    assert any(t.startswith("SELECT /*!40001 SQL_NO_CACHE */") for t in texts)  # the validator reads rows back
    assert any(t.startswith("INSERT INTO `shop`") and "ON DUPLICATE KEY UPDATE" in t for t in texts)  # compact's safe mode
    assert any(t.startswith("DELETE FROM `shop`") and ") OR (" in t for t in texts)  # multiple-rows
    assert all("ON DUPLICATE KEY UPDATE" not in t or t.rstrip(" ;").endswith(")") for t in texts)  # none cut short


@pytest.mark.parametrize("entry", EVERY, ids=lambda e: e["sql"][:60])
def test_no_needless_refusal(entry):
    analysis = analyze(entry["sql"], dialect=TIDB, multi=False)  # DM's driver: no multi-statements
    assert analysis.unknown is None
    for statement in analysis.statements:
        assert (statement.unknown, statement.runs_code, statement.session_unrestorable) == (None, False, None)
        assert not statement.needs_capture  # DM sets constants: nothing to read back


@pytest.mark.parametrize("entry", [e for e in EVERY if e["sql"].startswith(("REPLACE", "DELETE"))], ids=lambda e: e["sql"][:60])
def test_safe_mode_statements_are_claimed_idempotent(entry):
    # The claim from the text; recovery then proves it with the table's keys. (DM's validator
    # deletes its own pending rows by revision, a write by no key: not claimed, settled by the
    # commit marker instead.)
    assert is_idempotent(entry["sql"], dialect=TIDB) != (" and revision != " in entry["sql"])


@pytest.mark.parametrize(
    "entry",
    [e for e in EVERY if e["sql"].startswith("INSERT INTO `shop`") and "ON DUPLICATE KEY" not in e["sql"]],
    ids=lambda e: e["sql"][:60],
)
def test_normal_mode_inserts_are_not(entry):
    # (Normal mode's UPDATE sets every column to a constant by key: claimed; the table's keys
    # then refuse the proof, since it sets the key columns too.)
    assert not is_idempotent(entry["sql"], dialect=TIDB)


def test_the_bulk_of_dm_traffic_takes_the_fast_path():
    """The statements DM sends most (its row DML) skip the judge on the hot path."""
    total = sum(e["count"] for e in CORPUS)
    fast = sum(e["count"] for e in CORPUS if fast_verb(b"\x03" + e["sql"].encode(), multi=False) is not None)
    assert fast / total > 0.95, f"{fast} of {total}"
