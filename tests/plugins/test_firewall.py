"""firewall: statement classes, allow lists, patterns, multi-statements, executable comments."""

from __future__ import annotations

import pytest

from proxy import plugintest as pt
from proxy.hooks import Reject


@pytest.fixture
def firewall():
    return pt.harness("firewall", deny=["DROP", "TRUNCATE", "delete"], target="orders")


@pytest.mark.parametrize(
    "sql",
    [
        "DROP TABLE t",
        "drop database shop",
        "  TRUNCATE TABLE t",
        "Delete FROM t WHERE id = 1",
        "/* cleanup */ DROP TABLE t",
        "-- x\nDROP TABLE t",
        "# x\nDROP TABLE t",
        "/*!50001 DROP */ TABLE t",  # executable comment: its content is the statement
        "/*M! TRUNCATE t */",
        "SELECT 1; DROP TABLE t",  # every statement of a multi-statement query
        "SELECT ';'; DROP TABLE t",
        "SELECT 1 /*!; DROP TABLE t */",
        "PREPARE s FROM 'DROP TABLE t'",
        "PREPARE s FROM 'SELECT 1; TRUNCATE t'",
        "DROPPED",  # not a statement the proxy knows: what cannot be judged does not pass
        "PREPARE s FROM @sql",  # dynamic SQL from a variable cannot be seen through
        "EXECUTE IMMEDIATE CONCAT('DROP ', 'TABLE t')",
        "/*!999999 SELECT */ DROP TABLE t",  # MariaDB skips the comment and drops the table
        "EXECUTE IMMEDIATE 'DROP TABLE t'",
    ],
)
async def test_denied(firewall, sql):
    verdict = await firewall.command(sql)
    assert pt.is_reject(verdict, 1142) and verdict.sqlstate == "42000", sql


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1",
        "INSERT INTO drop_log VALUES ('DROP TABLE t')",
        "SELECT 'a; DROP TABLE t'",
        "SELECT 1 -- ; DROP TABLE t",
        "SELECT 1 /* ; DROP TABLE t */",
        "UPDATE t SET note = 'truncate me' WHERE id = 1",
        "SELECT 1;",
        "SELECT 1; ",
    ],
)
async def test_passed(firewall, sql):
    assert await firewall.command(sql) is None, sql


async def test_statements_are_split_as_the_session_reads_them(firewall):
    text = "SELECT '\\'; DROP TABLE t; -- '"
    assert await firewall.command(text) is None  # one string: '\'; DROP TABLE t; -- '
    nbe = firewall.new_session(no_backslash_escapes=True)
    assert pt.is_reject(await firewall.command(text, nbe), 1142)  # '\' ends the string: DROP runs


async def test_without_multi_statements_two_statements_are_not_judged(firewall):
    single = firewall.new_session(multi_statements=False)
    # The server refuses it whole; the proxy does not guess which part would run.
    assert pt.is_reject(await firewall.command("SELECT 1; DROP TABLE t", single), 1142)
    assert pt.is_reject(await firewall.command("DROP TABLE t; SELECT 1", single), 1142)
    assert await firewall.command("SELECT 1;", single) is None


async def test_huge_statements_are_not_copied_per_statement(firewall):
    values = ", ".join(f"({i}, 'a;b''c')" for i in range(20000))  # ';' and '' inside strings
    nbe = firewall.new_session(no_backslash_escapes=True)
    assert await firewall.command(f"INSERT INTO t VALUES {values}", nbe) is None
    padded = "/*" + "x" * 10000 + "*/ DROP DATABASE shop"  # keywords after a comment longer than the window
    assert pt.is_reject(await pt.harness("firewall", deny=["DROP DATABASE"]).command(padded), 1142)


async def test_message_names_class_user_host_and_target(firewall):
    session = firewall.new_session("dm", client_address="10.0.0.7:41000")
    verdict = await firewall.command("drop table t", session)
    assert verdict == Reject(
        1142,
        "DROP command denied to user 'dm'@'10.0.0.7' by replay-proxy firewall (target orders, rule: deny)",
        "42000",
    )


async def test_prepare_is_checked_and_other_commands_pass(firewall):
    assert pt.is_reject(await firewall.command(pt.prepare("DROP TABLE t")), 1142)
    assert await firewall.command(pt.execute(1)) is None
    assert await firewall.command(pt.ping()) is None


async def test_multi_keyword_classes():
    h = pt.harness("firewall", deny=["drop  database", "LOAD DATA"])
    assert pt.is_reject(await h.command("DROP DATABASE shop"))
    assert pt.is_reject(await h.command("load data infile '/x' into table t"))
    assert await h.command("DROP TABLE t") is None
    assert await h.command("LOAD XML INFILE '/x' INTO TABLE t") is None


async def test_allow_list():
    h = pt.harness("firewall", allow=["SELECT", "INSERT", "START TRANSACTION", "COMMIT"], deny=["INSERT IGNORE"])
    for sql in ["SELECT 1", "insert into t values (1)", "START TRANSACTION", "COMMIT"]:
        assert await h.command(sql) is None, sql
    verdict = await h.command("UPDATE t SET a = 1")
    assert pt.is_reject(verdict, 1142) and verdict.message.startswith("UPDATE command denied") and "not in allow" in verdict.message
    assert pt.is_reject(await h.command("START SLAVE"))
    assert pt.is_reject(await h.command("INSERT IGNORE INTO t VALUES (1)"))  # deny wins over allow
    assert pt.is_reject(await h.command("(SELECT 1)"))  # no leading keyword: no class matches
    assert pt.is_reject(await h.command("SELECT 1; UPDATE t SET a = 1"))


async def test_deny_patterns_are_case_insensitive():
    h = pt.harness("firewall", deny_patterns=[r"\bfrom\s+`?mysql`?\s*\.", r"INTO\s+OUTFILE"])
    verdict = await h.command("SELECT * FROM MySQL.user")
    assert pt.is_reject(verdict, 1142) and "rule: deny_patterns[0]" in verdict.message
    assert "SELECT command denied" in verdict.message
    assert pt.is_reject(await h.command("select 1 into outfile '/tmp/x'"))
    assert await h.command("SELECT * FROM shop.user") is None


def test_no_rules_stays_off_the_hot_path():
    assert not pt.harness("firewall").hooks.command_received


@pytest.mark.parametrize("bad", ["", "DROP TABLE t x y z", "DORP", "DROP;", "1DROP"])
def test_bad_classes_are_config_errors(bad):
    from proxy.config import ConfigError

    with pytest.raises(ConfigError, match=r"\$\.plugins\.firewall\.deny\[0\]: expected a statement class"):
        pt.harness("firewall", deny=[bad])
