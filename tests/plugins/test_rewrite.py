"""rewrite: ordered regex rules, table filters, first/all modes, start-up checks."""

from __future__ import annotations

import pytest

from plugins.rewrite import statement_table
from proxy import plugintest as pt
from proxy.config import ConfigError
from proxy.hooks import CommandInfo

INSERT_TO_REPLACE = {
    "pattern": r"(?i)^\s*INSERT\s+INTO\b",
    "replace": "REPLACE INTO",
    "unless": r"(?i)\bON\s+DUPLICATE\s+KEY\s+UPDATE\b",
    "tables": ["orders", "shop.items"],
}


@pytest.fixture
def replace_rule():
    return pt.harness("rewrite", rules=[INSERT_TO_REPLACE])


@pytest.mark.parametrize(
    "sql, expected",
    [
        ("INSERT INTO orders VALUES (1, 'a')", "REPLACE INTO orders VALUES (1, 'a')"),
        ("insert into `orders` (id) values (1)", "REPLACE INTO `orders` (id) values (1)"),
        ("INSERT INTO `other`.`orders` VALUES (1)", "REPLACE INTO `other`.`orders` VALUES (1)"),  # "orders": any db
        ("INSERT INTO shop.items VALUES (1)", "REPLACE INTO shop.items VALUES (1)"),
        ("INSERT INTO items VALUES (1)", "REPLACE INTO items VALUES (1)"),  # session database is "shop"
        ("INSERT INTO other.items VALUES (1)", None),  # "shop.items": only in shop
        ("INSERT INTO customers VALUES (1)", None),
        ("INSERT IGNORE INTO orders VALUES (1)", None),
        ("INSERT INTO orders VALUES (1) ON DUPLICATE KEY UPDATE a = VALUES(a)", None),
        ("UPDATE orders SET a = 1", None),
        ("INSERT INTO Orders VALUES (1)", None),  # names compare exactly
    ],
)
async def test_insert_to_replace_for_listed_tables(replace_rule, sql, expected):
    session = replace_rule.new_session(database="shop")
    assert pt.rewritten_sql(await replace_rule.command(sql, session)) == expected


async def test_prepared_statements_are_rewritten_keeping_the_command(replace_rule):
    verdict = await replace_rule.command(pt.prepare("INSERT INTO orders VALUES (?, ?)"))
    assert verdict.payload == b"\x16REPLACE INTO orders VALUES (?, ?)"
    assert await replace_rule.command(pt.execute()) is None


async def test_first_mode_stops_at_the_first_matching_rule():
    rules = [
        {"pattern": "a", "replace": "b"},
        {"pattern": "b", "replace": "c"},
        {"pattern": "zzz", "replace": "y"},
    ]
    first = pt.harness("rewrite", rules=rules)
    every = pt.harness("rewrite", rules=rules, mode="all")
    assert pt.rewritten_sql(await first.command("SELECT 'a'")) == "SELECT 'b'"
    assert pt.rewritten_sql(await every.command("SELECT 'a'")) == "SELECT 'c'"
    assert await first.command("SELECT 'q'") is None


async def test_groups_and_every_occurrence():
    h = pt.harness("rewrite", rules=[{"pattern": r"(?i)\bsleep\((\d+)\)", "replace": r"sleep(0) /* was \1 */"}])
    verdict = await h.command("SELECT SLEEP(5), sleep(7)")
    assert pt.rewritten_sql(verdict) == "SELECT sleep(0) /* was 5 */, sleep(0) /* was 7 */"


async def test_table_is_looked_up_again_after_a_rewrite_in_all_mode():
    rules = [
        {"pattern": "^INSERT INTO staging", "replace": "INSERT INTO orders"},
        {"pattern": "^INSERT INTO", "replace": "REPLACE INTO", "tables": ["orders"]},
    ]
    h = pt.harness("rewrite", rules=rules, mode="all")
    assert pt.rewritten_sql(await h.command("INSERT INTO staging VALUES (1)")) == "REPLACE INTO orders VALUES (1)"


async def test_rewrite_feeds_the_rest_of_the_chain():
    h = pt.chain(
        ["rewrite", "tests.plugins.sample_plugin:AuditPlugin"],
        {"rewrite": {"rules": [INSERT_TO_REPLACE]}, "tests.plugins.sample_plugin:AuditPlugin": {"tag": "x"}},
    )
    await h.roundtrip("INSERT INTO orders VALUES (1)")
    audit = h.plugins["tests.plugins.sample_plugin:AuditPlugin"]
    assert audit.seen == [("COM_QUERY", "REPLACE INTO orders VALUES (1)", None)]


async def test_large_statements_pass_unchanged(caplog):
    h = pt.harness("rewrite", rules=[INSERT_TO_REPLACE], max_statement_size="1KiB")
    small = "INSERT INTO orders VALUES " + ", ".join(f"({i})" for i in range(100))
    large = "INSERT INTO orders VALUES " + ", ".join(f"({i})" for i in range(1000))
    assert pt.rewritten_sql(await h.command(small)).startswith("REPLACE INTO")
    assert await h.command(large) is None
    spooled = CommandInfo(0x03, b"\x03INSERT INTO orders VALUES (1)", complete=False)  # only its head is known
    assert await h.command(spooled) is None
    assert h.plugin.too_large == 2
    assert "over max_statement_size (1024 bytes) passed without rewrite rules (1 so far)" in caplog.text


async def test_unless_is_checked_only_where_the_rule_would_apply(monkeypatch):
    h = pt.harness("rewrite", rules=[INSERT_TO_REPLACE])
    searched = []
    pattern, template, unless, tables = h.plugin.rules[0]

    class Spy:
        def search(self, text):
            searched.append(text)
            return unless.search(text)

    h.plugin.rules[0] = (pattern, template, Spy(), tables)
    await h.command("UPDATE orders SET a = 1")  # pattern does not match
    await h.command("INSERT INTO customers VALUES (1)")  # table not listed
    await h.command("INSERT INTO orders VALUES (1)")
    assert searched == ["INSERT INTO orders VALUES (1)"]


def test_no_rules_stays_off_the_hot_path():
    assert not pt.harness("rewrite").hooks.command_received


@pytest.mark.parametrize(
    "rules, error",
    [
        ([{"pattern": "ok", "replace": "x"}, {"pattern": "(", "replace": "x"}], r"\.rules\[1\]\.pattern: invalid regular expression '\('"),
        ([{"pattern": "(a)", "replace": r"\2"}], r"\.rules\[0\]: replace refers to group 2 but the pattern has 1"),
        ([{"pattern": "a", "replace": r"\g<name>"}], r"\.rules\[0\]: replace refers to group 'name'"),
        ([{"pattern": "a", "replace": "b", "tables": ["a.b.c"]}], r"\.rules\[0\]: tables: expected 'table' or 'db\.table'"),
        ([{"pattern": "a"}], r"\.rules\[0\]\.replace: required key missing"),
        ([{"pattern": "a", "replace": "b", "table": ["t"]}], r"\.rules\[0\]: unknown key\(s\) table"),
        ([{"pattern": "a", "replace": "b", "unless": "[z"}], r"\.rules\[0\]\.unless: invalid regular expression"),
    ],
)
def test_rules_are_checked_at_start_up(rules, error):
    with pytest.raises(ConfigError, match=r"\$\.plugins\.rewrite" + error):
        pt.harness("rewrite", rules=rules)


async def test_escaped_backslash_is_not_a_group_reference():
    r"""``\\1`` in a template is an escaped backslash and the digit 1: accepted at start-up though
    the pattern has no group, and written as the text ``\1``; in ``\\\1`` what follows the escaped
    backslash is group 1."""
    h = pt.harness("rewrite", rules=[{"pattern": "a", "replace": r"\\1"}])
    assert pt.rewritten_sql(await h.command("SELECT 'a'")) == "SELECT '\\1'"
    h = pt.harness("rewrite", rules=[{"pattern": "(a)", "replace": r"\\\1\1"}])
    assert pt.rewritten_sql(await h.command("SELECT 'a'")) == "SELECT '\\aa'"


@pytest.mark.parametrize(
    "sql, table",
    [
        ("INSERT INTO t VALUES (1)", (None, "t")),
        ("INSERT LOW_PRIORITY IGNORE INTO `db`.`t x` VALUES (1)", ("db", "t x")),
        ("insert t values (1)", (None, "t")),
        ("REPLACE INTO db . t VALUES (1)", ("db", "t")),
        ("UPDATE IGNORE t SET a = 1", (None, "t")),
        ("DELETE QUICK FROM d.t WHERE a = 1", ("d", "t")),
        ("/* x */ INSERT INTO t VALUES (1)", (None, "t")),
        ("SELECT * FROM t", None),
        ("INSERT INTO 'oops", None),
    ],
)
def test_statement_table(sql, table):
    assert statement_table(sql) == table
