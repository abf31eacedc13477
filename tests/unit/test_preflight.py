"""proxy.preflight's pure parts: the commit-marker privileges read from SHOW GRANTS lines as
MariaDB 10.11 and TiDB v8.5 print them, the verdicts on max_allowed_packet, wait_timeout and
sql_mode, and the report's exit status."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from proxy.config import parse_config
from proxy.preflight import PROBLEM, WARN, Line, _packet_line, _sql_mode_line, _wait_timeout_line, missing_marker_privileges, report

SCHEMA, TABLE = "replay_proxy", "commit_markers"
ALL = ["CREATE", "SELECT", "INSERT", "UPDATE", "DELETE"]


def missing(*lines: str, fold: bool = False) -> list[str]:
    return missing_marker_privileges(list(lines), SCHEMA, TABLE, fold_case=fold)


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        # MariaDB 10.11 (measured: SHOW GRANTS as the user, a password hash on the USAGE line)
        (["GRANT ALL PRIVILEGES ON *.* TO `app`@`%` IDENTIFIED BY PASSWORD '*DB14CBAE92D7CB2F84BD3AA7222415B564A4054A'"], []),
        (["GRANT USAGE ON *.* TO `dm`@`%` IDENTIFIED BY PASSWORD '*4C67'", "GRANT SELECT, INSERT, UPDATE, DELETE ON *.* TO `dm`@`%`"],
         ["CREATE"]),
        (["GRANT USAGE ON *.* TO `dm`@`%`", "GRANT SELECT, INSERT, UPDATE, DELETE ON `replay_proxy`.`commit_markers` TO `dm`@`%`"],
         ["CREATE"]),
        # CREATE on the table is not CREATE on the database (CREATE DATABASE IF NOT EXISTS needs that)
        (["GRANT CREATE, SELECT, INSERT, UPDATE, DELETE ON `replay_proxy`.`commit_markers` TO `dm`@`%`"], ["CREATE"]),
        (["GRANT CREATE ON `replay_proxy`.* TO `dm`@`%`", "GRANT SELECT, INSERT, UPDATE, DELETE ON `replay_proxy`.`commit_markers` TO `dm`@`%`"], []),
        (["GRANT ALL PRIVILEGES ON `replay_proxy`.* TO `dm`@`%`"], []),
        # a database-level grant's name is a LIKE pattern; escaped, it is literal
        (["GRANT ALL ON `replay\\_%`.* TO `r1`"], []),
        (["GRANT ALL ON `replay\\_x`.* TO `r1`"], ALL),
        (["GRANT ALL ON `other`.* TO `dm`@`%`", "GRANT SELECT ON `replay_proxy`.`other` TO `dm`@`%`"], ALL),
        # column privileges are not the table's
        (["GRANT CREATE ON `replay_proxy`.* TO `dm`@`%`", "GRANT SELECT (`slot`, `txn`), INSERT, UPDATE, DELETE ON `replay_proxy`.`commit_markers` TO `dm`@`%`"],
         ["SELECT"]),
        # a role grant alone gives nothing; an active role's own lines do
        (["GRANT `r1` TO `dm`@`%`", "GRANT USAGE ON *.* TO `dm`@`%`"], ALL),
        (["GRANT `r1` TO `dm`@`%`", "GRANT USAGE ON *.* TO `r1`", "GRANT ALL PRIVILEGES ON `replay_proxy`.* TO `r1`", "SET DEFAULT ROLE `r1` FOR `dm`@`%`"], []),
        (["GRANT PROXY ON ``@`%` TO `root`@`localhost` WITH GRANT OPTION", "GRANT EXECUTE ON PROCEDURE `replay_proxy`.`p` TO `dm`@`%`"], ALL),
        # TiDB v8.5 (unquoted names, no spaces after commas)
        (["GRANT USAGE ON *.* TO 'dm'@'%'", "GRANT CREATE,SELECT,INSERT,UPDATE,DELETE ON replay_proxy.* TO 'dm'@'%'"], []),
        (["GRANT USAGE ON *.* TO 'dm'@'%'", "GRANT Select,Insert,Update,Delete ON replay_proxy.commit_markers TO 'dm'@'%'"], ["CREATE"]),
        (["GRANT ALL PRIVILEGES ON *.* TO 'root'@'%' WITH GRANT OPTION"], []),
        (["GRANT 'r1'@'%' TO 'dm'@'%'", "GRANT USAGE ON *.* TO 'dm'@'%'"], ALL),
    ],
)  # fmt: skip
def test_missing_marker_privileges(lines, expected):
    assert missing(*lines) == expected


def test_names_are_case_sensitive_unless_the_server_folds_them():
    line = "GRANT ALL ON `Replay_Proxy`.* TO `dm`@`%`"
    assert missing(line) == ALL
    assert missing(line, fold=True) == []


def test_report_exits_1_on_a_problem_and_0_on_warnings(capsys):
    assert report([Line("ok", "a:1", "x", "fine"), Line("warn", "a:1", "y", "read it: do this")]) == 0
    assert capsys.readouterr().out.endswith("result: ok, 1 warning(s): read the warn lines\n")
    assert report([Line(PROBLEM, "a:1", "z", "broken: fix it")]) == 1
    out = capsys.readouterr().out
    assert out.startswith("PROBLEM  a:1                    z: broken: fix it\n") and "result: 1 problem(s)" in out


def config(**overrides):
    data = {"backend": {"addresses": ["127.0.0.1:3306"]}, "users": [{"name": "dm", "password": "x"}], **overrides}
    return parse_config(data)


def backend(max_allowed_packet=64 << 20, wait_timeout=28800.0):
    return SimpleNamespace(max_allowed_packet=max_allowed_packet, wait_timeout=wait_timeout)


@pytest.mark.parametrize(
    ("server", "limit", "level", "says"),
    [
        (64 << 20, "64MiB", "ok", "sessions get 64 MiB"),
        (1 << 30, "64MiB", "ok", "sessions get 64 MiB"),
        (16 << 20, "64MiB", PROBLEM, "the server's max_allowed_packet is 16 MiB, below limits.max_allowed_packet (64 MiB)"),
        (16 << 20, "16MiB", "ok", "sessions get 16 MiB"),
        (64 << 20, "64KiB", PROBLEM, "with a limit of 64 KiB they are refused"),  # the proxy's own limit too small for DM
        (96 * 1024, "96KiB", WARN, "plus up to one row"),  # a full-load batch is cut once it passes 96 KiB
        (512 * 1024, "64MiB", PROBLEM, "SET GLOBAL max_allowed_packet = 67108864"),
        (
            512 * 1024,
            "512KiB",
            WARN,
            "SET GLOBAL max_allowed_packet = 67108864 and the same in its config file; raise limits.max_allowed_packet",
        ),
        (64 << 20, "512KiB", WARN, 'fit: raise limits.max_allowed_packet (default "64MiB") (1 MiB at least)'),
    ],
)
def test_max_allowed_packet(server, limit, level, says):
    line = _packet_line(config(limits={"max_allowed_packet": limit}), backend(max_allowed_packet=server), "a:1")
    assert line.level == level and says in line.text, line


@pytest.mark.parametrize(
    ("wait", "idle", "level", "says"),
    [
        (28800, 0, "ok", "28800 s: idle sessions stay"),
        (0, 0, "ok", "never closes an idle session"),
        (20, 0, PROBLEM, "SET GLOBAL wait_timeout = 28800"),
        (600, 0, WARN, "closed by the server every 600 s"),
        (3600, 7200, PROBLEM, "before listen.idle_timeout (7200 s)"),
        (7200, 3600, "ok", "the proxy closes them after 3600 s"),
    ],
)
def test_wait_timeout(wait, idle, level, says):
    line = _wait_timeout_line(config(listen={"idle_timeout": idle}), backend(wait_timeout=float(wait)), "a:1")
    assert line.level == level and says in line.text, line


@pytest.mark.parametrize(
    ("sql_mode", "level", "says"),
    [
        ("STRICT_TRANS_TABLES,NO_ENGINE_SUBSTITUTION", "ok", "global STRICT_TRANS_TABLES,NO_ENGINE_SUBSTITUTION"),
        ("", "ok", "global (empty)"),
        ("NO_BACKSLASH_ESCAPES", "ok", "NO_BACKSLASH_ESCAPES is followed per session"),
        ("ANSI_QUOTES,STRICT_ALL_TABLES", WARN, "remove ANSI_QUOTES"),
        ("PIPES_AS_CONCAT,ANSI_QUOTES,IGNORE_SPACE,ANSI", WARN, "remove ANSI_QUOTES"),
        ("oracle", WARN, "ORACLE changes the SQL syntax"),
    ],
)
def test_sql_mode(sql_mode, level, says):
    line = _sql_mode_line(sql_mode, "a:1")
    assert line.level == level and says in line.text, line
