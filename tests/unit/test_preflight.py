"""proxy.preflight's pure parts: the commit-marker privileges read from SHOW GRANTS lines as
MariaDB 10.11 and TiDB v8.5 print them, and the lines' wording rules."""

from __future__ import annotations

import pytest

from proxy.preflight import PROBLEM, Line, missing_marker_privileges, report

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
