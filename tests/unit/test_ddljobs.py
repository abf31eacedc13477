"""proxy.recovery.ddljobs' judgements: which statements are one TiDB DDL job (and the text it
keeps), how a job's state reads, and which job is the one in doubt."""

from __future__ import annotations

import attrs
import pytest

from proxy.recovery.ddljobs import Job, JobState, job_text, owners_of, owners_query, pick, same_text, schemas_of, state_of
from proxy.sqltext import analyze
from proxy.sqltext.dialect import TIDB

JOBS = [
    ("CREATE TABLE t (id INT PRIMARY KEY)", "CREATE TABLE t (id INT PRIMARY KEY)"),
    ("  create table if not exists db.t (id int);  ", "create table if not exists db.t (id int)"),
    ("ALTER TABLE `shop`.`orders` ADD COLUMN note VARCHAR(20)", "ALTER TABLE `shop`.`orders` ADD COLUMN note VARCHAR(20)"),
    ("ALTER TABLE a AUTO_INCREMENT = 100", "ALTER TABLE a AUTO_INCREMENT = 100"),
    ("DROP TABLE IF EXISTS t", "DROP TABLE IF EXISTS t"),
    ("CREATE DATABASE IF NOT EXISTS shop", "CREATE DATABASE IF NOT EXISTS shop"),
    ("DROP SCHEMA shop", "DROP SCHEMA shop"),
    ("CREATE UNIQUE INDEX uk ON t (v)", "CREATE UNIQUE INDEX uk ON t (v)"),
    ("DROP INDEX uk ON t", "DROP INDEX uk ON t"),
    ("CREATE OR REPLACE VIEW v AS SELECT 1", "CREATE OR REPLACE VIEW v AS SELECT 1"),
    ("CREATE ALGORITHM = MERGE DEFINER = CURRENT_USER SQL SECURITY INVOKER VIEW v AS SELECT 1", None),  # judged below
    ("RENAME TABLE a TO b, c TO d", "RENAME TABLE a TO b, c TO d"),
    ("TRUNCATE TABLE t", "TRUNCATE TABLE t"),
    ("TRUNCATE t", "TRUNCATE t"),
    ("CREATE SEQUENCE s", "CREATE SEQUENCE s"),
    ("CREATE PLACEMENT POLICY p PRIMARY_REGION='r1' REGIONS='r1'", "CREATE PLACEMENT POLICY p PRIMARY_REGION='r1' REGIONS='r1'"),
]
NOT_JOBS = [
    ("CREATE USER u IDENTIFIED BY 'x'", "an account: no job"),
    ("DROP USER u", "an account: no job"),
    ("CREATE TEMPORARY TABLE tt (id INT)", "a local temporary table: no job"),
    ("CREATE BINDING FOR SELECT 1 USING SELECT 1", "a plan binding: no job"),
    ("CREATE TABLE a (id INT); CREATE TABLE b (id INT)", "two statements"),
    ("INSERT INTO t VALUES (1)", "no DDL"),
    ("SELECT 1", "no DDL"),
]


@pytest.mark.parametrize("sql, kept", JOBS, ids=[j[0][:40] for j in JOBS])
def test_a_ddl_job_and_the_text_it_keeps(sql: str, kept: str | None) -> None:
    text = job_text(analyze(sql, dialect=TIDB))
    assert text == (kept if kept is not None else sql)


@pytest.mark.parametrize("sql, why", NOT_JOBS, ids=[j[0][:40] for j in NOT_JOBS])
def test_not_one_ddl_job(sql: str, why: str) -> None:
    assert job_text(analyze(sql, dialect=TIDB)) is None, why


def test_same_text_is_the_statement_as_sent() -> None:
    assert same_text("ALTER TABLE t ADD c INT", "ALTER TABLE t ADD c INT")
    assert same_text("ALTER TABLE t ADD c INT", "ALTER TABLE t ADD c INT;")
    assert not same_text("ALTER TABLE t ADD c INT", "ALTER TABLE t ADD d INT")
    assert not same_text("ALTER TABLE t ADD c INT", "alter table t add c int")  # another text: another statement
    assert not same_text("ALTER TABLE t ADD c INT", None)


@pytest.mark.parametrize(
    "state, means",
    [
        ("synced", JobState.DONE),
        ("done", JobState.DONE),
        ("rollback done", JobState.FAILED),
        ("cancelled", JobState.FAILED),
        ("running", JobState.RUNNING),
        ("queueing", JobState.RUNNING),
        ("none", JobState.RUNNING),
        ("rollingback", JobState.RUNNING),
        ("cancelling", JobState.RUNNING),
        ("paused", JobState.RUNNING),
        ("a state of a later TiDB", JobState.RUNNING),  # unknown: not ended, so waited for
    ],
)
def test_what_a_job_state_means(state: str, means: JobState) -> None:
    assert state_of(state) is means


SHOP = frozenset({"shop"})


def test_the_job_in_doubt_is_the_one_created_since_the_command_arrived() -> None:
    arrived = 1_800_000_000.7
    older = Job(41, "synced", arrived - 60, "shop")  # the same text run a minute before: not this one
    mine = Job(57, "running", arrived - 1, "shop")  # TiDB's clock a second behind, within the skew
    assert pick([older], arrived, SHOP) is None
    assert pick([older, mine], arrived, SHOP) == mine
    assert pick([], arrived, SHOP) is None
    two = pick([mine, Job(58, "synced", arrived + 1, "Shop")], arrived, SHOP)
    assert isinstance(two, str) and "57, 58" in two


def test_the_same_text_in_another_database_is_another_job() -> None:
    arrived = 1_800_000_000.0
    theirs = Job(60, "synced", arrived + 0.5, "other")  # another session's CREATE TABLE c, in its database
    assert pick([theirs], arrived, schemas_of("CREATE TABLE c (id INT)", "shop")) is None
    assert pick([theirs], arrived, schemas_of("CREATE TABLE other.c (id INT)", "shop")) == theirs
    assert pick([theirs], arrived, schemas_of("CREATE DATABASE `Other`", None)) == theirs
    assert pick([theirs], arrived, schemas_of("CREATE TABLE c (id INT)", None)) is None


def test_of_an_idempotent_ddl_sent_again_the_running_job_else_the_newest() -> None:
    arrived = 1_800_000_000.0
    first, again = Job(57, "synced", arrived, "shop"), Job(58, "running", arrived + 3, "shop")
    assert pick([first, again], arrived, SHOP, idempotent=True) == again
    assert pick([first, attrs.evolve(again, state="synced")], arrived, SHOP, idempotent=True).id == 58
    assert pick([attrs.evolve(first, state="queueing"), attrs.evolve(again, state="synced")], arrived, SHOP, idempotent=True).id == 57


def test_the_job_in_doubt_is_the_one_its_connection_queued() -> None:
    arrived = 1_800_000_000.0
    theirs, mine = Job(145, "synced", arrived, "shop", 2097160), Job(146, "rollback done", arrived, "shop", 2097158)
    assert pick([theirs, mine], arrived, SHOP, connection=2097158) == mine
    assert pick([theirs, mine], arrived, SHOP, connection=2097160) == theirs
    assert pick([theirs], arrived, SHOP, connection=2097158) is None  # another connection's: not the one in doubt
    unknown = attrs.evolve(mine, connection=None)
    assert pick([theirs, unknown], arrived, SHOP, connection=2097158) == unknown  # its owner not kept: it may be
    two = pick([attrs.evolve(theirs, connection=None), unknown], arrived, SHOP, connection=2097158)
    assert isinstance(two, str) and "145, 146" in two  # nothing tells them apart
    internal = attrs.evolve(theirs, connection=0)  # TiDB's own sessions queue with connection id 0
    assert pick([internal, mine], arrived, SHOP, connection=2097158) == mine
    assert pick([theirs, mine], arrived, SHOP) == "2 DDL jobs of the same text since the command arrived (145, 146)"
    wide = attrs.evolve(mine, connection=2097158 | 7 << 40)  # a 64-bit id: the handshake carries its low 32 bits
    assert pick([theirs, wide], arrived, SHOP, connection=2097158) == wide


def test_the_owners_are_read_from_both_job_tables_at_once() -> None:
    sql = owners_query([145, 146])
    assert sql.count("WHERE job_id IN (145, 146)") == 2 and "mysql.tidb_ddl_history" in sql and "mysql.tidb_ddl_job" in sql
    assert " UNION ALL " in sql and "'$.trace_info.connection_id'" in sql
    assert owners_of([[b"145", b"2097160"], [b"146", b"null"], [b"147", None]]) == {145: 2097160}
