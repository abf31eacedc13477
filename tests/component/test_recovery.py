"""Recovery decisions end to end over memory streams: client → proxy → scripted fake server.

Every test runs on trio's autojump clock, so backoff, buffer windows and timeouts take no time.
"""

from __future__ import annotations

import logging
import struct

import pytest
import trio

from proxy.hooks import Hooks, Veto
from proxy.protocol.framing import encode_packet
from proxy.protocol.packets import make_err, make_ok
from proxy.protocol.response import Expect
from tests.component.fakes import make_config, trickle_stream_pair


def drop_once(match: str, action: str = "drop"):
    """Intercept: the first command whose text contains ``match`` gets ``action``."""
    fired = []

    async def intercept(conn, payload: bytes):
        if not fired and match.encode() in payload:
            fired.append(payload)
            return action
        return None

    intercept.fired = fired
    return intercept


async def test_idle_backend_loss_is_invisible(rig, autojump):
    c = await rig.client()
    await c.must("INSERT INTO t VALUES (1, 'a')")
    rig.backend_of().close()  # the server closes the idle connection (FIN)
    await trio.sleep(0.01)
    assert len(rig.server.live()) == 1  # replaced before the client's next command
    assert (await c.must("SELECT COUNT(*) FROM t")).rows == ["1"]


@pytest.mark.parametrize("first", ["SELECT FOUND_ROWS()", "SHOW WARNINGS", "SELECT @@warning_count"])
async def test_the_previous_statements_results_stay_on_the_lost_connection(rig, autojump, first):
    """After an idle reconnect, a read of what the previous statement left (FOUND_ROWS(),
    warnings) would be answered by the proxy's restore statements: 1158 instead of a wrong answer."""
    c = await rig.client()
    await c.must("SELECT COUNT(*) FROM t")
    rig.backend_of().close()
    await trio.sleep(0.01)
    result = await c.query(first)
    assert result.code == 1158 and "FOUND_ROWS()" in result.message
    assert first not in rig.server.queries


@pytest.mark.parametrize("reads_results", [False, True])
async def test_a_spooled_first_command_is_judged_by_its_whole_text(make_rig, autojump, reads_results):
    """The first command on a new connection, over spool_threshold: its head ends inside a
    string literal (the lexer cannot tell), so the whole text is read. A long INSERT runs (it
    was 1158 "reads the previous statement's results" before); FOUND_ROWS() after the head
    still gets 1158."""
    rig = make_rig(make_config(limits={"spool_threshold": "1KiB"}))
    c = await rig.client()
    await c.must("SELECT COUNT(*) FROM t")
    rig.backend_of().close()
    await trio.sleep(0.01)
    long_text = "x" * (80 * 1024)  # past the 64 KiB head
    sql = f"SELECT '{long_text}', FOUND_ROWS()" if reads_results else f"INSERT INTO t VALUES (1, '{long_text}')"
    result = await c.query(sql)
    if reads_results:
        assert result.code == 1158 and "FOUND_ROWS()" in result.message and sql not in rig.server.queries
    else:
        assert result.ok and rig.server.db.rows == {1: long_text}


async def test_results_are_the_new_connections_after_the_clients_next_statement(rig, autojump):
    c = await rig.client()
    rig.backend_of().close()
    await trio.sleep(0.01)
    await c.must("SELECT COUNT(*) FROM t")  # PING would not do: it leaves the results as they are
    result = await c.query("SELECT FOUND_ROWS()")
    assert result.code != 1158 and "SELECT FOUND_ROWS()" in rig.server.queries


async def test_a_lost_read_of_the_previous_results_is_not_resent(rig, autojump):
    c = await rig.client()
    await c.must("SELECT COUNT(*) FROM t")
    rig.server.intercept = drop_once("FOUND_ROWS")
    result = await c.query("SELECT FOUND_ROWS()")
    assert result.code == 1158 and rig.server.queries.count("SELECT FOUND_ROWS()") == 1


@pytest.mark.parametrize(
    "definition, resent",
    [
        ("select `test`.`x`.`a` AS `a` from `test`.`x`", True),  # built-ins only: safe to read again
        ("select `test`.`f`() AS `x`", False),  # a stored function: it may write
        ("select `a` AS `a` from `test`.`inner`", False),  # a view of a view that calls f()
        ("", False),  # no SHOW VIEW privilege: the definition cannot be read
    ],
)
async def test_a_read_through_a_view_that_calls_stored_code_is_not_resent(rig, autojump, definition, resent):
    rig.server.db.views.update({"t": definition, "inner": "select `test`.`f`() AS `a`"})
    c = await rig.client()
    await c.must("INSERT INTO t VALUES (1, 'a')")
    rig.server.intercept = drop_once("SELECT COUNT", "run_then_drop")
    result = await c.query("SELECT COUNT(*) FROM t")
    runs = rig.server.queries.count("SELECT COUNT(*) FROM t")
    if resent:
        assert result.rows == ["1"] and runs == 2
    else:
        assert result.code == 1158 and "view" in result.message and runs == 1


async def test_no_log_line_shows_a_secret_from_the_command_in_flight(make_rig, autojump, caplog):
    caplog.set_level(logging.DEBUG)  # not at any level
    rig = make_rig()
    c = await rig.client()
    rig.server.intercept = drop_once("ALTER USER", "run_then_drop")
    result = await c.query("ALTER USER app IDENTIFIED BY 'sekrit-pw'")
    assert result.code == 1158  # a DDL in flight: the outcome is unknown
    assert "in flight: COM_QUERY DDL (sent)" in caplog.text and "sekrit" not in caplog.text


async def test_a_spooled_statement_is_not_judged_by_its_head(make_rig, autojump):
    """Over spool_threshold only the head of a command is in memory: a head that reads like a
    SELECT says nothing of what follows (``, f()``, ``; INSERT ...``): never resent."""
    rig = make_rig(make_config(limits={"spool_threshold": "1KiB"}))
    c = await rig.client()
    big = "SELECT COUNT(*) FROM t" + " " * 4096
    rig.server.intercept = drop_once("SELECT COUNT", "run_then_drop")
    result = await c.query(big)
    assert result.code == 1158 and "head" in result.message
    assert rig.server.queries.count(big) == 1


async def test_a_going_away_error_after_the_first_result_is_no_rejection(rig, autojump):
    """INSERT ...; SELECT SLEEP(5): the INSERT ran (OK, more results), then the shutdown stopped
    the SLEEP (1053). Not "refused, nothing ran": running the text again would apply the INSERT twice."""
    c = await rig.client()
    text = "INSERT INTO t VALUES (1, 'a'); SELECT SLEEP(5)"

    async def shutdown_mid_text(conn, payload):
        if payload[1:] == text.encode():
            conn._execute(b"\x03INSERT INTO t VALUES (1, 'a')")
            first = encode_packet(make_ok(conn.status() | 0x0008, 1), 1)[0]  # SERVER_MORE_RESULTS_EXISTS
            await conn.stream.send_all(first + encode_packet(make_err(1053, "08S01", "Server shutdown in progress"), 2)[0])
            return "drop"
        return None

    rig.server.intercept = shutdown_mid_text
    result = await c.query(text)
    assert result.code == 1158
    assert rig.server.db.rows == {1: "a"} and rig.server.queries.count(text) == 1


async def test_begin_dropped_without_reply_is_resent(rig, autojump):
    c = await rig.client()
    rig.server.intercept = drop_once("BEGIN")
    await c.must("BEGIN")
    await c.must("INSERT INTO t VALUES (1, 'a')")
    await c.must("COMMIT")
    assert rig.server.db.rows == {1: "a"} and rig.server.db.commits == 1


@pytest.mark.parametrize("deprecate_eof", [False, True])
async def test_statement_in_transaction_lost_replays_journal(rig, autojump, deprecate_eof):
    c = await rig.client(deprecate_eof=deprecate_eof)
    await c.must("BEGIN")
    await c.must("INSERT INTO t VALUES (1, 'a')")
    assert (await c.must("SELECT COUNT(*) FROM t")).rows == ["0"]  # uncommitted: not durable yet
    await c.must("UPDATE c SET n = n + 1")
    rig.server.intercept = drop_once("INSERT INTO t VALUES (2", "run_then_drop")
    await c.must("INSERT INTO t VALUES (2, 'b')")
    await c.must("COMMIT")
    db = rig.server.db
    assert db.rows == {1: "a", 2: "b"} and db.counter == 1 and db.commits == 1


async def test_idle_in_transaction_loss_replays_before_next_statement(rig, autojump):
    c = await rig.client()
    await c.must("BEGIN")
    await c.must("INSERT INTO t VALUES (1, 'a')")
    rig.backend_of().close()
    await trio.sleep(0.01)
    replayed = rig.server.queries[-2:]
    assert replayed == ["START TRANSACTION", "INSERT INTO t VALUES (1, 'a')"] or replayed == ["BEGIN", "INSERT INTO t VALUES (1, 'a')"]
    await c.must("INSERT INTO t VALUES (2, 'b')")
    await c.must("COMMIT")
    assert rig.server.db.rows == {1: "a", 2: "b"} and rig.server.db.commits == 1


async def test_replay_with_different_result_aborts_with_1213(rig, autojump):
    c = await rig.client()
    await c.must("BEGIN")
    assert (await c.must("SELECT COUNT(*) FROM t")).rows == ["0"]
    await c.must("INSERT INTO t VALUES (1, 'a')")
    other = await rig.client()
    await other.must("INSERT INTO t VALUES (9, 'z')")  # the world changed meanwhile
    rig.server.intercept = drop_once("INSERT INTO t VALUES (2", "drop")
    result = await c.query("INSERT INTO t VALUES (2, 'b')")
    assert not result.ok and result.code == 1213 and "replay-proxy" in result.message
    assert (await c.must("ROLLBACK")).ok
    assert rig.server.db.rows == {9: "z"}  # nothing of the aborted transaction applied
    await c.must("INSERT INTO t VALUES (3, 'c')")  # and the session works on
    assert rig.server.db.rows == {9: "z", 3: "c"}


async def test_idle_mismatch_reports_1213_at_next_command_and_rollback_is_ok(rig, autojump):
    c = await rig.client()
    backend = rig.backend_of()
    await c.must("BEGIN")
    assert (await c.must("SELECT COUNT(*) FROM t")).rows == ["0"]
    other = await rig.client()
    await other.must("INSERT INTO t VALUES (9, 'z')")
    backend.close()  # the first client's backend, idle in its transaction
    await trio.sleep(0.01)
    result = await c.query("COMMIT")
    assert result.code == 1213  # never acknowledge a commit of a transaction that is gone
    assert (await c.must("SELECT COUNT(*) FROM t")).rows == ["1"]


async def test_commit_in_flight_without_safe_mode_is_a_connection_error(rig, autojump):
    c = await rig.client()
    await c.must("BEGIN")
    await c.must("INSERT INTO t VALUES (1, 'a')")
    rig.server.intercept = drop_once("COMMIT", "run_then_drop")  # committed, answer lost
    result = await c.query("COMMIT")
    assert result.code == 1158 and "outcome is unknown" in result.message
    with pytest.raises(EOFError):
        await c.query("SELECT 1")
    assert rig.server.db.rows == {1: "a"} and rig.server.db.commits == 1  # applied once, not twice


@pytest.mark.parametrize("committed", [True, False])
async def test_commit_in_flight_safe_mode_replays_idempotent_transaction(make_rig, autojump, committed):
    rig = make_rig(make_config(recovery={"idempotent": "safe-mode"}))
    c = await rig.client()
    await c.must("BEGIN")
    await c.must("REPLACE INTO t VALUES (1, 'a')")
    await c.must("DELETE FROM t WHERE k = 5")
    rig.server.intercept = drop_once("COMMIT", "run_then_drop" if committed else "drop")
    assert (await c.query("COMMIT")).ok
    assert rig.server.db.rows == {1: "a"}
    assert rig.server.db.commits == (2 if committed else 1)  # applied again: same rows


async def test_commit_in_flight_safe_mode_refuses_non_idempotent(make_rig, autojump):
    rig = make_rig(make_config(recovery={"idempotent": "safe-mode"}))
    c = await rig.client()
    await c.must("BEGIN")
    await c.must("REPLACE INTO t VALUES (1, 'a')")
    await c.must("UPDATE c SET n = n + 1")
    rig.server.intercept = drop_once("COMMIT", "run_then_drop")
    assert (await c.query("COMMIT")).code == 1158
    assert rig.server.db.counter == 1


async def _open_an_unprovable_transaction(c) -> None:
    """Row 1 'a', then a transaction whose statements read as idempotent but which the keys do
    not prove (a DELETE by a column that is no key): run twice, it would delete row 2."""
    await c.must("REPLACE INTO t VALUES (1, 'a')")
    await c.must("BEGIN")
    await c.must("DELETE FROM t WHERE v = 'a'")
    await c.must("REPLACE INTO t VALUES (2, 'a')")


@pytest.mark.parametrize("committed", [True, False])
async def test_what_safe_mode_cannot_prove_a_commit_marker_settles(make_rig, autojump, committed, caplog):
    """DM's sidecar config has both: a transaction whose statements read as idempotent but
    which the table's keys do not prove (a DELETE by a column that is no key) is settled by
    its marker instead of a 1158, and applied exactly once."""
    rig = make_rig(make_config(recovery={"idempotent": "safe-mode", "commit_marker": True}))
    await trio.sleep(10)  # server up well before the connection: the old session gets KILLed
    c = await rig.client()
    await _open_an_unprovable_transaction(c)
    rig.server.intercept = drop_once("COMMIT", "run_then_drop" if committed else "drop")
    assert (await c.query("COMMIT")).ok
    db = rig.server.db
    assert db.rows == {2: "a"} and db.commits == 2 and len(db.markers) == 1  # once: a second run would delete row 2
    assert "safe mode cannot prove the replay idempotent" in caplog.text and "asking the commit marker" in caplog.text


async def test_safe_mode_without_a_marker_refuses_what_it_cannot_prove(make_rig, autojump):
    rig = make_rig(make_config(recovery={"idempotent": "safe-mode"}))
    c = await rig.client()
    await _open_an_unprovable_transaction(c)
    rig.server.intercept = drop_once("COMMIT", "run_then_drop")
    result = await c.query("COMMIT")
    assert result.code == 1158 and "cannot prove the replay idempotent" in result.message
    assert rig.server.db.rows == {2: "a"}


async def test_read_only_transaction_commit_in_flight_is_transparent(rig, autojump):
    c = await rig.client()
    await c.must("BEGIN")
    await c.must("SELECT COUNT(*) FROM t")
    rig.server.intercept = drop_once("COMMIT", "run_then_drop")
    assert (await c.query("COMMIT")).ok


async def test_autocommit_write_in_flight(rig, make_rig, autojump):
    c = await rig.client()
    rig.server.intercept = drop_once("INSERT", "run_then_drop")
    assert (await c.query("INSERT INTO t VALUES (1, 'a')")).code == 1158
    rig = make_rig(make_config(recovery={"idempotent": "safe-mode"}))
    c = await rig.client()
    rig.server.intercept = drop_once("REPLACE", "run_then_drop")
    result = await c.query("REPLACE INTO t VALUES (1, 'a')")
    assert result.ok and result.affected_rows == 2  # the repeat found the row already there
    assert rig.server.db.rows == {1: "a"}


async def test_reads_and_session_commands_in_flight_are_resent(rig, autojump):
    c = await rig.client()
    await c.must("INSERT INTO t VALUES (1, 'a')")
    rig.server.intercept = drop_once("SELECT V", "run_then_drop")
    assert (await c.must("SELECT v FROM t WHERE k = 1")).rows == ["a"]
    rig.server.intercept = drop_once("SET", "run_then_drop")
    await c.must("SET sql_mode = 'ANSI'")
    assert (await c.must("SELECT @@sql_mode")).rows == ["ANSI"]


async def test_server_going_away_error_is_hidden_and_statement_resent(rig, autojump):
    c = await rig.client()
    await c.must("BEGIN")
    await c.must("INSERT INTO t VALUES (1, 'a')")
    rig.server.intercept = drop_once("INSERT INTO t VALUES (2", "error_1053")
    await c.must("INSERT INTO t VALUES (2, 'b')")
    await c.must("COMMIT")
    assert rig.server.db.rows == {1: "a", 2: "b"}


KILLED = b"\xff\x87\x07#70100Connection was killed"


async def test_unsolicited_kill_from_a_restarting_server_triggers_recovery(rig, autojump):
    c = await rig.client()
    await trio.sleep(10)
    conn = rig.backend_of()
    rig.server.restart()  # the kill is part of a shutdown: the new instance's uptime tells
    await conn._send([KILLED], 0)
    await trio.sleep(0.01)
    assert conn.closed or len(rig.server.connections) == 2
    assert (await c.must("SELECT COUNT(*) FROM t")).rows == ["0"]


async def test_an_operators_kill_of_an_idle_session_reaches_the_client(rig, autojump):
    c = await rig.client()
    await trio.sleep(10)  # the server has been up long before this session: the same instance
    rig.server.db.kills += 1  # an operator ran KILL <id> (the server counts it: Com_kill)
    await rig.backend_of()._send([KILLED], 0)
    await trio.sleep(0.01)
    result = await c.query("SELECT COUNT(*) FROM t")
    assert result.code == 1927  # not undone by a reconnect: the session ends, as direct
    with pytest.raises(EOFError):
        await c.query("SELECT 1")


async def test_a_clean_close_without_any_kill_is_recovered(rig, autojump):
    c = await rig.client()
    await trio.sleep(10)
    rig.backend_of().close(clean=True)  # a FIN, the server up, no KILL run: a load balancer, say
    await trio.sleep(0.01)
    assert (await c.must("SELECT COUNT(*) FROM t")).rows == ["0"]


async def test_the_proxys_own_kills_are_not_an_operators(rig, autojump):
    """A load balancer drops two sessions' connections (FIN, the server up). The first one's
    recovery KILLs its old connection id on the server, which raises Com_kill: the second must
    not read that as an operator's KILL (1927), only KILLs beyond the proxy's own count."""
    a, b = await rig.client(), await rig.client()
    await trio.sleep(10)
    first, second = rig.server.live()
    first.close(clean=True)
    await trio.sleep(1)
    assert rig.server.db.kills == 1  # the proxy's own KILL of a's old connection id
    second.close(clean=True)
    await trio.sleep(1)
    assert (await a.must("SELECT COUNT(*) FROM t")).rows == ["0"]
    assert (await b.must("SELECT COUNT(*) FROM t")).rows == ["0"]


async def test_an_operators_kill_of_a_running_statement_is_not_undone(rig, autojump):
    c = await rig.client()
    await trio.sleep(10)
    rig.server.db.kills += 1
    rig.server.intercept = drop_once("INSERT", "killed")
    result = await c.query("INSERT INTO t VALUES (1, 'a')")
    assert result.code == 1927
    with pytest.raises(EOFError):
        await c.query("SELECT 1")
    assert rig.server.db.rows == {}  # never run again


async def test_backend_down_longer_than_buffer_window(make_rig, autojump):
    rig = make_rig(make_config(recovery={"buffer_window": "30s"}))
    c = await rig.client()
    await c.must("BEGIN")
    await c.must("INSERT INTO t VALUES (1, 'a')")
    rig.server.up = False
    rig.server.restart()
    start = trio.current_time()
    result = await c.query("INSERT INTO t VALUES (2, 'b')")
    waited = trio.current_time() - start
    assert result.code == 1213 and "unavailable for 30s" in result.message
    assert 29 <= waited <= 32
    rig.server.up = True
    await trio.sleep(2)
    await c.must("ROLLBACK")
    await c.must("INSERT INTO t VALUES (3, 'c')")
    assert rig.server.db.rows == {3: "c"}


async def test_backend_back_within_buffer_window_is_invisible(nursery, rig, autojump):
    c = await rig.client()
    await c.must("BEGIN")
    await c.must("INSERT INTO t VALUES (1, 'a')")
    rig.server.up = False
    rig.server.restart()

    async def come_back():
        await trio.sleep(12)
        rig.server.up = True

    nursery.start_soon(come_back)
    start = trio.current_time()
    await c.must("INSERT INTO t VALUES (2, 'b')")
    assert 12 <= trio.current_time() - start < 14
    await c.must("COMMIT")
    assert rig.server.db.rows == {1: "a", 2: "b"}


async def test_unrestorable_session_fails_at_next_command(rig, autojump):
    c = await rig.client()
    assert (await c.must("SELECT GET_LOCK('x', 1)")).rows == ["1"]
    rig.server.restart()
    await trio.sleep(0.01)
    result = await c.query("SELECT COUNT(*) FROM t")
    assert result.code == 1158 and "GET_LOCK" in result.message
    with pytest.raises(EOFError):
        await c.query("SELECT 1")


async def test_journal_overflow_gives_1213(make_rig, autojump):
    rig = make_rig(make_config(recovery={"journal_max_statements": 3}))
    c = await rig.client()
    await c.must("BEGIN")
    for k in range(5):
        await c.must(f"INSERT INTO t VALUES ({k}, 'v')")
    rig.server.intercept = drop_once("INSERT INTO t VALUES (9", "drop")
    result = await c.query("INSERT INTO t VALUES (9, 'v')")
    assert result.code == 1213 and "journal over its limit" in result.message
    assert rig.server.db.rows == {}


async def test_session_variables_are_restored(rig, autojump):
    c = await rig.client()
    await c.must("SET NAMES utf8mb4")
    await c.must("SET sql_mode = 'STRICT_ALL_TABLES', time_zone = '+00:00'")
    await c.must("SET @@session.wait_timeout = CONCAT('28', '800')")  # captured from the server
    rig.server.restart()
    await trio.sleep(0.01)
    assert (await c.must("SELECT @@sql_mode")).rows == ["STRICT_ALL_TABLES"]
    assert (await c.must("SELECT @@time_zone")).rows == ["+00:00"]
    assert (await c.must("SELECT @@wait_timeout")).rows == ["28800"]


async def test_prepared_statements_survive_with_their_ids_and_types(rig, autojump):
    c = await rig.client()
    stmt = await c.prepare("INSERT INTO t VALUES (?, 'p')")
    assert (await c.execute(stmt, 1)).ok
    rig.server.restart()  # new connection: the server numbers statements differently
    await trio.sleep(0.01)
    # The client omits parameter types (already bound); the proxy binds them again.
    assert (await c.execute(stmt, 2, bind=False)).ok
    other = await c.prepare("SELECT v FROM t WHERE k = ?")
    assert other != stmt
    assert (await c.execute(other, 2)).rows == ["p"]
    assert rig.server.db.rows == {1: "p", 2: "p"}


async def test_old_session_is_killed_when_server_did_not_restart(rig, autojump):
    await trio.sleep(10)  # the server has been up longer than the connection will be old
    c = await rig.client()
    await c.must("BEGIN")
    await c.must("INSERT INTO t VALUES (1, 'a')")
    old = rig.backend_of()
    rig.server.intercept = drop_once("INSERT INTO t VALUES (2", "drop")
    await c.must("INSERT INTO t VALUES (2, 'b')")
    assert any(q == f"KILL {old.id}" for q in rig.server.queries)


async def test_plugin_veto_turns_replay_into_1213(make_rig, autojump):
    class NoReplay:
        def replay_decided(self, session, plan):
            return Veto("replays are disabled here")

    rig = make_rig(hooks=Hooks([("noreplay", NoReplay())]))
    c = await rig.client()
    await c.must("BEGIN")
    await c.must("INSERT INTO t VALUES (1, 'a')")
    rig.server.intercept = drop_once("INSERT INTO t VALUES (2", "drop")
    result = await c.query("INSERT INTO t VALUES (2, 'b')")
    assert result.code == 1213 and "replays are disabled here" in result.message
    assert rig.server.db.rows == {}


@pytest.mark.parametrize("committed", [True, False])
async def test_commit_marker_resolves_an_in_doubt_commit_exactly(make_rig, autojump, committed):
    rig = make_rig(make_config(recovery={"commit_marker": True}))
    await trio.sleep(10)  # server up well before the connection: the old session gets KILLed
    c = await rig.client()
    await c.must("BEGIN")
    await c.must("INSERT INTO t VALUES (1, 'a')")
    await c.must("UPDATE c SET n = n + 1")
    rig.server.intercept = drop_once("COMMIT", "run_then_drop" if committed else "drop")
    assert (await c.query("COMMIT")).ok  # no 1158: the marker says what happened
    db = rig.server.db
    assert db.rows == {1: "a"} and db.counter == 1 and db.commits == 1  # applied exactly once
    await c.must("BEGIN")
    await c.must("INSERT INTO t VALUES (2, 'b')")
    await c.must("COMMIT")
    assert db.rows == {1: "a", 2: "b"} and len(db.markers) == 1


@pytest.mark.parametrize("committed", [True, False])
async def test_a_prepared_commit_in_doubt_is_resolved_by_its_marker(make_rig, autojump, committed):
    """mysql-connector's prepared cursor sends COMMIT as COM_STMT_EXECUTE: it gets its marker
    as a COM_QUERY COMMIT does, so a lost answer is resolved exactly instead of a 1158."""
    rig = make_rig(make_config(recovery={"commit_marker": True}))
    await trio.sleep(10)  # server up well before the connection: the old session gets KILLed
    c = await rig.client()
    commit = await c.prepare("COMMIT")
    await c.must("BEGIN")
    await c.must("INSERT INTO t VALUES (1, 'a')")
    fired = []

    async def lose_the_commits_answer(conn, payload):
        if not fired and payload[0] == 0x17 and conn.stmts[struct.unpack_from("<I", payload, 1)[0]][0] == "COMMIT":
            fired.append(payload)
            return "run_then_drop" if committed else "drop"
        return None

    rig.server.intercept = lose_the_commits_answer
    assert (await c.execute(commit)).ok
    assert fired
    db = rig.server.db
    assert db.rows == {1: "a"} and db.commits == 1 and len(db.markers) == 1


async def test_a_commit_marker_that_fails_is_the_commits_answer(make_rig, autojump):
    """The marker upsert is the deadlock victim: the server rolled the transaction back, so the
    client's COMMIT gets the 1213 and is never sent (an OK from it would be a lie: nothing committed)."""
    rig = make_rig(make_config(recovery={"commit_marker": True}))
    c = await rig.client()
    await c.must("BEGIN")
    await c.must("INSERT INTO t VALUES (1, 'a')")
    rig.server.intercept = drop_once("commit_markers (slot, txn)", "deadlock")
    result = await c.query("COMMIT")
    assert result.code == 1213 and "Deadlock" in result.message
    assert "COMMIT" not in rig.server.queries
    db = rig.server.db
    assert db.rows == {} and db.commits == 0 and db.markers == {}
    await c.must("BEGIN")  # the session goes on: DM retries the batch
    await c.must("INSERT INTO t VALUES (1, 'a')")
    await c.must("COMMIT")
    assert db.rows == {1: "a"} and db.commits == 1


async def test_commit_marker_after_server_restart(make_rig, autojump):
    rig = make_rig(make_config(recovery={"commit_marker": True}))
    c = await rig.client()
    await c.must("BEGIN")
    await c.must("INSERT INTO t VALUES (1, 'a')")

    async def crash_after_commit(conn, payload):
        if payload.endswith(b"COMMIT"):
            conn._execute(payload)  # durable, then the whole server goes down before answering
            rig.server.restart()
            return "drop"
        return None

    rig.server.intercept = crash_after_commit
    assert (await c.query("COMMIT")).ok
    assert rig.server.db.rows == {1: "a"} and rig.server.db.commits == 1


@pytest.mark.parametrize("deprecate_eof", [False, True])
async def test_one_byte_trickle_both_sides(make_rig, autojump, deprecate_eof):
    """Every read on both sides of the proxy returns a single byte."""
    rig = make_rig(stream_pair=trickle_stream_pair)
    c = await rig.client(deprecate_eof=deprecate_eof)
    await c.must("BEGIN")
    await c.must("INSERT INTO t VALUES (1, 'a')")
    stmt = await c.prepare("INSERT INTO t VALUES (?, 'p')")
    assert (await c.execute(stmt, 2)).ok
    await c.must("COMMIT")
    assert (await c.must("SELECT COUNT(*) FROM t")).rows == ["2"]
    assert (await c.must("SELECT v FROM t WHERE k = 2")).rows == ["p"]
    rig.server.intercept = drop_once("INSERT INTO t VALUES (3", "drop")
    await c.must("BEGIN")
    await c.must("INSERT INTO t VALUES (3, 'c')")  # recovered mid-trickle
    await c.must("COMMIT")
    assert rig.server.db.rows == {1: "a", 2: "p", 3: "c"}


async def test_ping_answered_1053_by_a_draining_server_is_transparent(rig, autojump):
    """TiDB answers COM_PING with 1053 once graceful shutdown has begun."""
    c = await rig.client()

    async def shutting_down(conn, payload):
        if payload == b"\x0e" and not shutting_down.done:
            shutting_down.done = True  # this server is going; the next connection is healthy
            return "error_1053"
        return None

    shutting_down.done = False
    rig.server.intercept = shutting_down
    first = rig.backend_of()
    result = await c.command(b"\x0e", expect=Expect.SINGLE)
    assert result.ok and first.closed


async def test_pipelined_commands_are_answered_in_order(rig, autojump):
    c = await rig.client()
    await c.stream.send_all(b"".join(encode_packet(b"\x03" + f"INSERT INTO t VALUES ({k}, 'x')".encode(), 0)[0] for k in range(5)))
    for _ in range(5):
        payload = await c._read_packet()
        assert payload[0] == 0x00
    assert (await c.must("SELECT COUNT(*) FROM t")).rows == ["5"]


async def test_server_that_refuses_every_command_is_given_up_after_the_buffer_window(make_rig, autojump):
    rig = make_rig(make_config(recovery={"buffer_window": "10s"}))
    c = await rig.client()

    async def draining(conn, payload):
        return "error_1053" if payload.startswith(b"\x03INSERT") else None

    rig.server.intercept = draining
    start = trio.current_time()
    result = await c.query("INSERT INTO t VALUES (1, 'a')")
    assert result.code == 1213 and "kept failing" in result.message
    assert 10 <= trio.current_time() - start < 13
    assert len(rig.server.connections) < 40  # backed off, did not spin
    rig.server.intercept = None
    await c.must("INSERT INTO t VALUES (1, 'a')")
