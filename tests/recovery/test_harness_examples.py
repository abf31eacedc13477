"""Three example cases proving the recovery harness (client -> proxy -> fault shim -> MariaDB)."""

from __future__ import annotations

import pytest

from tests.recovery.harness import Fault, RecoveryHarness, recovery_harness  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration

TABLE = "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(32))"


def test_autocommit_insert_answer_lost_is_a_connection_error(recovery_harness: RecoveryHarness) -> None:
    """The server ran the INSERT but its answer was lost: the proxy cannot know whether it
    committed, so the client gets 1158 and the row exists exactly once."""
    res = recovery_harness.run(["INSERT INTO t VALUES (1, 'a')"], fault=Fault("drop_answer", on=0), setup=[TABLE])
    assert res.fault_applied, res.describe()
    assert res.outcomes[0].code == 1158, res.describe()
    assert res.query("SELECT id, v FROM t") == [(1, "a")], res.describe()
    assert res.sent("INSERT") == 1, res.describe()


def test_transaction_connection_lost_before_statement_is_replayed(recovery_harness: RecoveryHarness) -> None:
    """The connection closes before the second INSERT reaches the server: the proxy replays BEGIN
    and the first INSERT on a new connection, sends the second; the client sees no error."""
    script = ["BEGIN", "INSERT INTO t VALUES (1, 'a')", "INSERT INTO t VALUES (2, 'b')", "COMMIT"]
    res = recovery_harness.run(script, fault=Fault("close_before", on=2), setup=[TABLE])
    assert res.fault_applied, res.describe()
    assert res.errors == [], res.describe()
    assert [o.affected for o in res.outcomes[1:3]] == [[1], [1]], res.describe()
    assert res.query("SELECT id, v FROM t ORDER BY id") == [(1, "a"), (2, "b")], res.describe()
    assert res.sent("INSERT INTO t VALUES (1") == 2, res.describe()  # original + replay
    assert res.sent("INSERT INTO t VALUES (2") == 1, res.describe()


def test_select_answer_lost_is_resent(recovery_harness: RecoveryHarness) -> None:
    """A read whose answer was lost is resent on a new connection: the client gets its row."""
    res = recovery_harness.run(["SELECT 1"], fault=Fault("drop_answer", on=0))
    assert res.fault_applied, res.describe()
    assert res.outcomes[0].ok and res.outcomes[0].rows == ((1,),), res.describe()
    assert res.sent("SELECT 1") == 2, res.describe()
