"""proxy.session.tracker.SessionTracker, sans-IO: commands completed with real response bytes, and
what the tracker then believes about the transaction, the session and recovery's questions."""

from __future__ import annotations

import struct

import pytest

from proxy.protocol.framing import encode_packet
from proxy.protocol.packets import make_err, make_ok
from proxy.protocol.response import ResponseTracker, expect_for
from proxy.protocol.resultset import Column
from proxy.recovery.facts import statement_facts
from proxy.session.completed import Completed
from proxy.session.info import SessionInfo
from proxy.session.intake import Command
from proxy.session.state import user_variable_literal
from proxy.session.tracker import AUTOCOMMIT, IN_TRANS, SessionTracker
from proxy.sqltext import ServerReading

MARIADB_VERSION = "10.11.19-MariaDB-0+deb12u1"
OK = "ok"


def tracker(autocommit: bool = True, multi: bool = True, safe_mode: bool = False) -> SessionTracker:
    t = SessionTracker(SessionInfo(1, "test", "app", "127.0.0.1:1", reading=ServerReading(multi=multi)), 1 << 20, 1000, safe_mode)
    t.logged_in("app", "test", 45, AUTOCOMMIT if autocommit else 0)
    t.backend_changed("127.0.0.1:3306", MARIADB_VERSION)
    return t


def run(t: SessionTracker, sql: str, *answers, in_trans: bool | None = None, insert_id: int = 0) -> list[str]:
    """Complete ``sql`` with ``answers`` ("ok" or an error code per statement, in order); the
    status word of OKs: IN_TRANS as given (default: what the tracker believes), autocommit as
    the tracker believes; ``insert_id`` in every OK. Returns what the tracker asked to read back."""
    payload = b"\x03" + sql.encode()
    verb, analysis = t.triage(payload)
    in_trans = t.tx.active if in_trans is None else in_trans
    status = (IN_TRANS if in_trans else 0) | (AUTOCOMMIT if t.autocommit else 0)
    answers = answers or (OK,)
    raw = b""
    for i, answer in enumerate(answers):
        more = 0x0008 if i < len(answers) - 1 and answer == OK else 0
        payload_ = make_ok(status | more, 0, insert_id) if answer == OK else make_err(answer, "HY000", "error")
        raw += encode_packet(payload_, 1)[0]
    rt = ResponseTracker(expect_for(3), False, t.wants_fingerprint(analysis))
    assert rt.feed(raw) == len(raw)
    return t.completed(Completed(Command(payload, encode_packet(payload, 0)[0], 0, len(payload)), rt, None, verb, analysis, t.reading))


def test_in_transaction_is_what_plugins_see_after_every_command():
    t = tracker()
    run(t, "BEGIN", in_trans=True)
    run(t, "INSERT INTO t VALUES (1)", in_trans=True)
    assert t.info.in_transaction
    run(t, "COMMIT", in_trans=False)
    assert not t.info.in_transaction  # was left True before: plugins saw autocommit statements "in a transaction"
    run(t, "INSERT INTO t VALUES (2)", in_trans=False)
    assert not t.info.in_transaction and not t.tx.active


def test_journal_of_a_transaction():
    t = tracker()
    run(t, "BEGIN", in_trans=True)
    run(t, "INSERT INTO t VALUES (1)")
    run(t, "UPDATE t SET v = 2 WHERE id = 1")
    assert [e.payload[1:7] for e in t.tx.entries] == [b"BEGIN", b"INSERT", b"UPDATE"]
    run(t, "COMMIT", in_trans=False)
    assert not t.tx.active and not t.tx.entries


@pytest.mark.parametrize("begin", ["/*Mx*/ BEGIN", "--\f x\nBEGIN", "/*!100000 BEGIN */", "begin work", "START TRANSACTION READ WRITE"])
def test_every_spelling_of_begin_ends_the_open_transaction(begin):
    t = tracker()
    run(t, "BEGIN", in_trans=True)
    run(t, "INSERT INTO t VALUES (1)")
    run(t, begin, in_trans=True)  # implicit commit of the first transaction, a new one
    assert len(t.tx.entries) == 1 and t.tx.not_replayable is None


def test_a_skipped_executable_comment_is_no_statement():
    t = tracker()
    run(t, "BEGIN", in_trans=True)
    run(t, "INSERT INTO t VALUES (1)")
    run(t, "/*!999999 COMMIT */ INSERT INTO t VALUES (2)")  # MariaDB skips the comment
    assert len(t.tx.entries) == 3


def test_commit_inside_a_multi_statement_query():
    t = tracker()
    run(t, "BEGIN", in_trans=True)
    run(t, "UPDATE t SET v = 1; COMMIT", OK, OK, in_trans=False)
    assert not t.tx.active
    t = tracker(autocommit=False)
    run(t, "INSERT INTO t VALUES (1)", in_trans=True)
    run(t, "COMMIT; UPDATE t SET v = 1", OK, OK, in_trans=True)
    assert t.tx.active and t.tx.not_replayable == "a transaction began inside a multi-statement query"
    assert t.tx.in_doubt is None  # the part that committed was acknowledged to the client


def test_a_ddl_that_fails_after_its_implicit_commit_leaves_the_transaction_pending():
    t = tracker()
    run(t, "BEGIN", in_trans=True)
    run(t, "INSERT INTO t VALUES (1)")
    run(t, "CREATE TABLE t (a INT)", 1050)  # MariaDB committed the INSERT, then refused the table
    assert t.pending is not None and t.pending.may_have_committed
    run(t, "INSERT INTO t VALUES (2)", in_trans=False)  # the status word settles it
    assert t.pending is None and not t.tx.active


def test_a_ddl_refused_before_its_commit_keeps_the_journal():
    t = tracker()
    run(t, "BEGIN", in_trans=True)
    run(t, "INSERT INTO t VALUES (1)")
    run(t, "CREATE TABLE t (a INT", 1064)  # a parse error: nothing ran
    assert t.pending is None
    run(t, "DROP TABLE x", 1146)  # no commit?  MariaDB commits before checking the table
    assert t.pending is not None
    run(t, "INSERT INTO t VALUES (2)", in_trans=True)  # autocommit on: still the same transaction
    assert t.pending is None and t.tx.in_doubt is None
    assert [e.payload[1:7] for e in t.tx.entries] == [b"BEGIN", b"INSERT", b"INSERT"]  # not the failed DROP


def test_with_autocommit_off_a_failed_ddl_leaves_the_transaction_in_doubt():
    t = tracker(autocommit=False)
    run(t, "INSERT INTO t VALUES (1)", in_trans=True)
    run(t, "CREATE TABLE t (a INT)", 1050)
    run(t, "INSERT INTO t VALUES (2)", in_trans=True)  # a new transaction, or the old one?
    assert t.tx.in_doubt == "ddl failed with error 1050"


def test_statement_errors_leave_the_transaction_alone():
    t = tracker()
    run(t, "BEGIN", in_trans=True)
    run(t, "INSERT INTO t VALUES (1)", 1062)
    assert t.pending is None and t.tx.active and len(t.tx.entries) == 2
    run(t, "INSERT INTO t VALUES (1)", 1213)
    assert not t.tx.active  # a deadlock rolled it back
    run(t, "BEGIN", in_trans=True)
    run(t, "UPDATE t SET v = 1", 1205)  # lock wait timeout: rolled back or not, by server setting
    assert t.pending is not None and not t.pending.may_have_committed


@pytest.mark.parametrize("sql", ["CALL p()", "EXECUTE IMMEDIATE 'COMMIT'", "EXECUTE s"])
def test_stored_code_in_a_transaction_puts_it_in_doubt(sql):
    t = tracker()
    run(t, "BEGIN", in_trans=True)
    run(t, "INSERT INTO t VALUES (1)")
    run(t, sql)
    assert t.tx.in_doubt and t.state.unrestorable


def test_xa_states():
    t = tracker()
    run(t, "XA START 'x'", in_trans=True)
    assert t.xa == "ACTIVE" and t.tx.not_replayable
    run(t, "XA END 'x'")
    run(t, "XA PREPARE 'x'")
    assert t.xa == "PREPARED" and t.tx.in_doubt
    run(t, "XA COMMIT 'x'", in_trans=False)
    assert t.xa is None and not t.tx.active


def test_unknown_text_makes_the_session_unrestorable_and_the_transaction_doubtful():
    t = tracker()
    run(t, "BEGIN", in_trans=True)
    run(t, "FROBNICATE t")
    assert t.tx.in_doubt and t.state.unrestorable
    t = tracker()
    run(t, "SELEC 1", 1064)  # refused at parse time: no effect
    assert t.state.unrestorable is None


def test_session_changes_of_every_statement_that_ran():
    t = tracker()
    run(t, "SET @a = 1; USE shop; SET sql_mode = ''", OK, OK, OK)
    assert t.state.user_variables == {"a": "1"} and t.state.database == "shop" and t.info.database == "shop"
    assert t.state.variables == {"sql_mode": "''"}
    run(t, "SET @b = 2; SET @c = (", OK, 1064)  # the second failed: only the first counts
    assert t.state.user_variables == {"a": "1", "b": "2"}


FACTS = [
    # (sql, commits, writes, rollback, session_only, unknown)
    ("UPDATE t SET a = 1; COMMIT", True, True, False, False, False),
    ("ROLLBACK; INSERT INTO t VALUES (1)", True, True, False, False, False),  # the INSERT autocommits
    ("SET @x = 1; INSERT INTO t VALUES (1)", False, True, False, False, False),
    ("SET autocommit = 0; UPDATE t SET a = 1", False, True, False, False, False),
    ("SELECT f()", True, True, False, False, True),  # a stored function: user code, never resent
    ("DO f()", True, True, False, False, True),
    ("SET @x = f()", True, True, False, False, True),
    ("SELECT NOW(), COUNT(*) FROM t", False, False, False, False, False),
    ("SELECT 1", False, False, False, False, False),
    ("SET @x = 1", False, False, False, True, False),
    ("ROLLBACK", False, False, True, False, False),
    ("CALL p()", True, True, False, False, True),
    ("XA COMMIT 'x'", True, True, False, False, False),
    ("/*!999999 SHOW */ INSERT INTO t VALUES (1)", False, True, False, False, False),
    ("FROBNICATE", True, True, False, False, True),
]


def facts_of(t: SessionTracker, sql: str):
    """The facts of ``sql`` as recovery reads them: judged with the session's reading."""
    return statement_facts(0x03, t.reading.analyze(sql), safe_mode=t.safe_mode)


@pytest.mark.parametrize("sql, commits, writes, rollback, session_only, unknown", FACTS)
def test_facts_judge_the_whole_text(sql, commits, writes, rollback, session_only, unknown):
    f = facts_of(tracker(), sql)
    assert (f.commits, f.writes, f.rollback, f.session_only, f.unknown is not None) == (commits, writes, rollback, session_only, unknown)


def test_without_multi_statements_two_statements_are_unknown():
    f = facts_of(tracker(multi=False), "UPDATE t SET a = 1; COMMIT")
    assert f.unknown is not None


def test_insert_ids_kept_are_bounded_in_count_and_text():
    """The INSERTs remembered for LAST_INSERT_ID() stay within 64 and 256 KiB of text (the
    running total matches what is kept); dropping one makes the value unknown."""
    from proxy.session.state import SessionState

    state = SessionState("app", "test", 45)
    for i in range(1, 11):
        state.insert_id(i, "INSERT INTO t VALUES (NULL)" + " " * 30_000, ServerReading())
    assert state.insert_text_bytes == sum(len(t or "") for _, t, _reading in state.insert_ids) <= 256 * 1024
    assert len(state.insert_ids) == 8 and state.insert_id_unknown  # the text bound dropped two
    state.known_insert_id(7)
    assert (state.insert_ids, state.insert_text_bytes, state.insert_id_unknown) == ([], 0, False)
    for i in range(100):
        state.insert_id(i + 1, None, ServerReading())
    assert len(state.insert_ids) == 64 and state.insert_text_bytes == 0 and state.insert_id_unknown


def test_a_statement_judged_to_commit_that_leaves_the_transaction_open_puts_it_in_doubt():
    """If the judge says "this ends the transaction" and the server's status word still says a
    transaction is open, the judge was wrong (or the server differs): the statements before it
    are no longer in the journal but did not commit, so the transaction may not be replayed."""
    t = tracker()
    run(t, "BEGIN", in_trans=True)
    run(t, "INSERT INTO t VALUES (1)")
    run(t, "FLUSH TABLES", in_trans=True)  # judged an implicit commit; pretend the server disagrees
    assert t.tx.active and t.tx.in_doubt is not None
    run(t, "COMMIT AND CHAIN", in_trans=True)  # a chain really opens a new, empty transaction
    assert t.tx.active and t.tx.in_doubt is None and not t.tx.entries


def test_analyze_of_a_statement_is_not_analyze_table():
    assert facts_of(tracker(), "ANALYZE FORMAT=JSON DELETE FROM t").unknown is not None
    t = tracker()
    run(t, "BEGIN", in_trans=True)
    run(t, "ANALYZE TABLE t", in_trans=False)  # ANALYZE TABLE does commit
    assert not t.tx.active


def test_set_insert_id_is_restored_until_an_insert_uses_it():
    """MariaDB keeps SET INSERT_ID = N through SELECTs, SETs and UPDATEs until an INSERT
    generates an id (measured); set again after that, it would force N on a later INSERT."""
    t = tracker()
    run(t, "SET INSERT_ID = 100")
    run(t, "SELECT 1")
    assert "insert_id = 100" in " ".join(t.state.restore_statements())
    run(t, "INSERT INTO a (v) VALUES (1)", insert_id=100)
    assert "insert_id" not in " ".join(t.state.restore_statements())


@pytest.mark.parametrize("name", ["rand_seed1", "gtid_seq_no"])
def test_variables_used_up_by_what_runs_next_make_the_session_unrestorable(name):
    t = tracker()
    run(t, f"SET {name} = 7")
    assert t.state.unrestorable and name in t.state.unrestorable


@pytest.mark.parametrize("code", [9007, 1062, 8028])
def test_a_failed_commit_ends_the_transaction_on_tidb(code):
    """TiDB's COMMIT that answers an error (a write conflict or a duplicate key in optimistic
    mode, a schema change) rolled the transaction back and left none open: a loss before the
    client's next transaction is a plain reconnect. Seen as a 1158 ("part of the transaction may
    have committed") on DM's retry BEGIN when TiDB restarted in between (recovery matrix on TiDB)."""
    t = tracker()
    t.backend_changed("127.0.0.1:4000", "8.0.11-TiDB-v8.5.3")
    run(t, "BEGIN", in_trans=True)
    run(t, "UPDATE t SET v = 1 WHERE id = 1")
    run(t, "COMMIT", code)
    assert t.pending is None and not t.tx.active and not t.tx.entries
    # MariaDB: an error to COMMIT is settled by the next status word (an XA branch stays ACTIVE).
    m = tracker()
    run(m, "BEGIN", in_trans=True)
    run(m, "UPDATE t SET v = 1 WHERE id = 1")
    run(m, "COMMIT", 1180)
    assert m.pending is not None


def test_a_journal_entry_is_judged_as_the_server_read_it_when_it_ran():
    """The hot path judges nothing; recovery judges an entry later, with the reading in force
    when it ran -- not the session's reading of now (here NO_BACKSLASH_ESCAPES turned on
    after it: the same bytes then read as a call of f)."""
    t = tracker()
    run(t, "BEGIN", in_trans=True)
    sql = "INSERT INTO t VALUES ('a\\', f(1), 'b')"
    run(t, sql, in_trans=True)
    entry = t.tx.entries[-1]
    t._read(nbe=True)  # as a status word with NO_BACKSLASH_ESCAPES would
    assert t.reading.analyze(sql).first.runs_code  # read now, it calls f
    judged = entry.judged()
    assert judged.nbe is False and judged.unknown is not None  # read then, the quote never closes
    assert "stored code" in facts_of(t, sql).unknown  # what judging it again now would say
    assert "not understood" in statement_facts(0x03, judged).unknown  # what recovery says: the reading of then


def test_prepared_statements_change_only_through_the_tracker():
    """Long data kept for replay within the limit (per statement and per session), parameter
    types bound again after a re-prepare, ids renumbered, and a failed move's ids put back."""
    from proxy.session.longdata import LongDataSpool
    from proxy.session.state import PreparedStatement

    t = SessionTracker(SessionInfo(1, "test", "app", "127.0.0.1:1"), 1 << 20, 1000, long_data=LongDataSpool(1000, 1300))
    t.logged_in("app", "test", 45, AUTOCOMMIT)
    a = t.prepared[1] = PreparedStatement(1, b"\x16SELECT ?", 1, 1, 1)
    b = t.prepared[2] = PreparedStatement(2, b"\x16SELECT ?", 1, 1, 2)
    payload = b"\x18" + (1).to_bytes(4, "little") + b"\x00\x00" + b"x" * 600
    piece = Command(payload, encode_packet(payload, 0)[0], 0, len(payload))
    assert t.long_data_received(a, piece, limit=10_000) and a.long_data[0].data == piece.raw  # in memory
    assert t.long_data_received(b, piece, limit=10_000) and b.long_data[0].data is None  # past the memory budget: the file
    assert not t.long_data_received(b, piece, limit=10_000)  # the spool's 1300 bytes: full
    assert "limits.long_data_spool" in b.long_data_refused  # its execute will get 1153
    assert not t.long_data_received(a, piece, limit=1000)  # over max_allowed_packet for one statement
    t.long_data_dropped(b)
    assert (b.long_data, b.long_data_bytes, b.long_data_refused) == ([], 0, None)
    assert t.long_data.in_file == 0 and t.long_data.in_memory == len(piece.raw)

    execute = b"\x17" + (1).to_bytes(4, "little") + b"\x00" + (1).to_bytes(4, "little") + b"\x00" + b"\x01" + b"\x08\x00" + b"\x05" * 8
    assert t.backend_bytes(execute, b"raw", a) == b"raw"  # types bound now, nothing to change
    ids = t.backend_ids()
    t.backend_changed("127.0.0.1:3306", "10.11.19-MariaDB")
    t.reprepared(a, 7)
    again = execute[:11] + b"\x00" + b"\x05" * 8  # a later execute: types not sent again
    sent = t.backend_bytes(again, None, a)
    assert sent[4] == 0x17 and int.from_bytes(sent[5:9], "little") == 7  # renumbered
    assert sent[4 + 11] == 1 and sent[4 + 12 : 4 + 14] == b"\x08\x00"  # types bound again
    t.restore_backend_ids(ids)
    assert (a.backend_id, t.generation) == (1, ids[0])


def complete(t: SessionTracker, payload: bytes, answer: bytes | None, statement=None) -> Completed:
    """Complete a command of ``payload`` with the one packet ``answer`` (None: no response)."""
    rt = ResponseTracker(expect_for(payload[0]), False, False)
    if answer is not None:
        raw = encode_packet(answer, 1)[0]
        assert rt.feed(raw) == len(raw)
    done = Completed(Command(payload, encode_packet(payload, 0)[0], 0, len(payload)), rt, statement, None, None, t.reading)
    t.completed(done)
    return done


def prepare_ok(server_id: int) -> bytes:
    return b"\x00" + struct.pack("<IHHBH", server_id, 0, 0, 0, 0)


def test_prepared_statements_are_numbered_by_the_proxy_once_a_reconnect_renumbered_one():
    """The client's ids are the server's until a re-prepare on a new connection got another id;
    from then on the proxy numbers new statements itself (the server's ids may clash). Closed
    statements go; a reset connection or a new login forgets them all."""
    t = tracker()
    first = complete(t, b"\x16SELECT 1", prepare_ok(5)).statement
    assert t.statement_of(b"\x17" + (5).to_bytes(4, "little")) is first and t.prepared == {5: first}
    assert (first.client_id, first.backend_id, first.generation) == (5, 5, t.generation)
    assert first.analysis is not None and first.analysis.first.read_only

    t.backend_changed("127.0.0.1:3307", MARIADB_VERSION)
    assert t.generation == first.generation + 1  # first must be prepared again on the new connection
    t.reprepared(first, 1)
    second = complete(t, b"\x16SELECT 2", prepare_ok(2)).statement
    assert (second.client_id, second.backend_id) == (6, 2)  # the proxy's number, not the server's 2
    assert t.backend_bytes(b"\x19" + (6).to_bytes(4, "little"), None, second)[5:9] == (2).to_bytes(4, "little")

    complete(t, b"\x19" + (6).to_bytes(4, "little"), None, second)  # COM_STMT_CLOSE
    assert t.prepared == {5: first}
    complete(t, b"\x1f", make_ok(AUTOCOMMIT, 0, 0))  # COM_RESET_CONNECTION
    assert t.prepared == {} and t.statement_of(b"\x17" + (5).to_bytes(4, "little")) is None


def test_a_statement_the_server_does_not_support_leaves_the_transaction_as_it_was():
    """1235 (TiDB: SQL_CALC_FOUND_ROWS, READ ONLY...) fails the statement only: the transaction
    stays replayable (a loss after it was a cautious 1213)."""
    t = tracker()
    run(t, "BEGIN", in_trans=True)
    run(t, "INSERT INTO t VALUES (1)", in_trans=True)
    run(t, "SELECT SQL_CALC_FOUND_ROWS * FROM t", 1235)
    assert t.tx.active and t.pending is None and t.tx.not_replayable is None and t.tx.in_doubt is None


def test_a_user_variable_set_from_an_expression_is_read_back_and_restored_as_a_constant():
    t = tracker()
    captures = run(t, "SET @a = 1, @n = NOW(), @@session.sql_mode = CONCAT(@@sql_mode, ',ANSI')")
    assert captures == ["@n", "sql_mode"]
    t.captured_user(
        "n", Column(253, False, 0), b"2026-12-01 10:00:00", b"323032362D31322D30312031303A30303A3030", "latin1", "latin1_swedish_ci"
    )
    assert t.state.restore_statements()[-1].startswith(
        "SET @a = 1, @n = CONVERT(X'323032362D31322D30312031303A30303A3030' USING latin1) COLLATE latin1_swedish_ci"
    )
    assert t.state.unrestorable is None
    t.captured_user("g", Column(255, False, 0), b"\x00\x01", b"0001", "binary", "binary")  # a GEOMETRY
    assert "@g" in t.state.unrestorable


@pytest.mark.parametrize(
    "column, value, hexed, charset, collation, literal",
    [
        (Column(8, False, 0), b"-42", b"FFFFFFFFFFFFFFD6", "binary", "binary", "-42"),
        (Column(8, True, 0), b"7", b"7", "binary", "binary", "CAST(7 AS UNSIGNED)"),  # @u - 8 stays an error
        (Column(246, False, 2), b"3.00", b"3", "binary", "binary", "3.00"),
        (Column(5, False, 31), b"0.3333333333333333", b"0", "binary", "binary", "0.3333333333333333E0"),
        (Column(5, False, 31), b"1.7976931348623157e308", b"", "binary", "binary", "1.7976931348623157e308"),
        (Column(251, False, 39), b"\x00'\\", b"00275C", "binary", "binary", "CAST(X'00275C' AS BINARY)"),
        # the text came converted to utf8mb4; the variable's own bytes are latin1
        (Column(251, False, 39), "é".encode(), b"E9", "latin1", "latin1_bin", "CONVERT(X'E9' USING latin1) COLLATE latin1_bin"),
        (Column(12, False, 6), b"2026-12-01 12:54:57.598506", b"", "binary", "binary", "CAST('2026-12-01 12:54:57.598506' AS DATETIME(6))"),
        (Column(10, False, 0), b"2026-12-01", b"", "binary", "binary", "CAST('2026-12-01' AS DATE)"),
        (Column(8, False, 0), None, None, "binary", "binary", "CAST(NULL AS SIGNED)"),
        (Column(5, False, 31), None, None, "binary", "binary", "CAST(NULL AS DOUBLE)"),
        (Column(251, False, 39), None, None, "binary", "binary", "NULL"),
        # what the proxy cannot write back exactly
        (Column(8, False, 0), b"1; DROP TABLE t", b"", "binary", "binary", None),
        (Column(251, False, 39), b"x", b"7", "utf8mb4", "utf8mb4_bin", None),  # odd hex
        (Column(251, False, 39), b"x", b"78", "utf8mb4' OR 1", "utf8mb4_bin", None),
        (Column(12, False, 6), b"0000-00-00 00:00:00' OR 1", b"", "binary", "binary", None),
        (Column(7, False, 0), b"2026-12-01 10:00:00", b"", "binary", "binary", None),  # TIMESTAMP: no literal of the type
        (Column(245, False, 0), b"{}", b"7B7D", "utf8mb4", "utf8mb4_bin", None),  # JSON
    ],
)
def test_user_variable_literals(column, value, hexed, charset, collation, literal):
    assert user_variable_literal(column, value, hexed, charset, collation) == literal
