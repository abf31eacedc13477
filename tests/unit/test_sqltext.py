"""proxy.sqltext: lexer, leading_keywords, classify, parse_set/render_set, is_idempotent."""

from __future__ import annotations

import functools
import re
import time

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import sqltext
from proxy.sqltext import (
    MARIADB,
    Kind,
    SetAssignment,
    SetScope,
    SqlLexError,
    SqlParseError,
    TokenKind,
    classify,
    is_idempotent,
    iter_tokens,
    leading_keywords,
    parse_insert_head,
    parse_set,
    quote_string,
    render_set,
    tokenize,
)
from proxy.sqltext.classify import analyze
from proxy.sqltext.dialect import TIDB
from proxy.sqltext.expressions import reads_last_results
from proxy.sqltext.idempotence import changes_no_rows
from proxy.sqltext.tokens import unquote

# The lab's server reads these texts: executable comments run as on MariaDB 10.11.
classify = functools.partial(classify, dialect=MARIADB)
is_idempotent = functools.partial(is_idempotent, dialect=MARIADB)
iter_tokens = functools.partial(iter_tokens, dialect=MARIADB)
leading_keywords = functools.partial(leading_keywords, dialect=MARIADB)
parse_insert_head = functools.partial(parse_insert_head, dialect=MARIADB)
parse_set = functools.partial(parse_set, dialect=MARIADB)
tokenize = functools.partial(tokenize, dialect=MARIADB)

K = TokenKind


def kinds(sql: str, **kw) -> list[tuple[TokenKind, str]]:
    return [(t.kind, t.text) for t in tokenize(sql, **kw)]


# --- Lexer ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql, expected",
    [
        ("SELECT 1", [(K.WORD, "SELECT"), (K.NUMBER, "1")]),
        ("1--1", [(K.NUMBER, "1"), (K.PUNCT, "-"), (K.PUNCT, "-"), (K.NUMBER, "1")]),  # 1 - -1
        ("1 -- c\n2", [(K.NUMBER, "1"), (K.NUMBER, "2")]),
        ("1 --\t c\n2", [(K.NUMBER, "1"), (K.NUMBER, "2")]),
        ("1 --\x01c\n2", [(K.NUMBER, "1"), (K.NUMBER, "2")]),  # any control character
        ("1 --", [(K.NUMBER, "1")]),  # "--" at the very end
        ("1 # c ' \n2", [(K.NUMBER, "1"), (K.NUMBER, "2")]),
        ("1 /* ' */ 2", [(K.NUMBER, "1"), (K.NUMBER, "2")]),
        ("1 /*+ hint */ 2", [(K.NUMBER, "1"), (K.NUMBER, "2")]),
        ("/**/1/***/", [(K.NUMBER, "1")]),
        ("/*! SELECT */ 1", [(K.WORD, "SELECT"), (K.NUMBER, "1")]),
        ("/*!50001 CREATE */", [(K.WORD, "CREATE")]),
        ("/*!100101 x*/", [(K.WORD, "x")]),
        ("/*M!100101 x */", [(K.WORD, "x")]),
        ("/*M! x */", [(K.WORD, "x")]),
        ("/*!50000 1 /* inner */ + 1 */", [(K.NUMBER, "1"), (K.PUNCT, "+"), (K.NUMBER, "1")]),
        ("2 */* c */ 3", [(K.NUMBER, "2"), (K.PUNCT, "*"), (K.NUMBER, "3")]),  # stray */
        ("'it''s'", [(K.STRING, "'it''s'")]),
        (r"'it\'s'", [(K.STRING, r"'it\'s'")]),
        (r"'a\\' 'b'", [(K.STRING, r"'a\\'"), (K.STRING, "'b'")]),
        ('"x""y\\"z"', [(K.STRING, '"x""y\\"z"')]),
        ("N'abc' n'd'", [(K.STRING, "N'abc'"), (K.STRING, "n'd'")]),
        ("_utf8mb4'x' _binary 'y'", [(K.WORD, "_utf8mb4"), (K.STRING, "'x'"), (K.WORD, "_binary"), (K.STRING, "'y'")]),
        ("X'0aFF' x'' 0x1F 0xg", [(K.HEX, "X'0aFF'"), (K.HEX, "x''"), (K.HEX, "0x1F"), (K.WORD, "0xg")]),
        ("b'0101' B'1' 0b11 0b12", [(K.BIT, "b'0101'"), (K.BIT, "B'1'"), (K.BIT, "0b11"), (K.WORD, "0b12")]),
        ("1 1.5 .5 1e10 1.5E-3 1e+5 2.", [(K.NUMBER, n) for n in ["1", "1.5", ".5", "1e10", "1.5E-3", "1e+5", "2."]]),
        ("1abc 12e5x", [(K.WORD, "1abc"), (K.WORD, "12e5x")]),  # identifiers may start with digits
        (
            "t.1e5 `a`.`b`",
            [(K.WORD, "t"), (K.PUNCT, "."), (K.WORD, "1e5"), (K.QUOTED_IDENT, "`a`"), (K.PUNCT, "."), (K.QUOTED_IDENT, "`b`")],
        ),
        ("`a``b` `'`", [(K.QUOTED_IDENT, "`a``b`"), (K.QUOTED_IDENT, "`'`")]),
        ("@a @a.b$ @'x y' @\"q\" @`z`", [(K.USER_VAR, v) for v in ["@a", "@a.b$", "@'x y'", '@"q"', "@`z`"]]),
        ("@@x @@session.sql_mode @@GLOBAL.`y`", [(K.SYS_VAR, v) for v in ["@@x", "@@session.sql_mode", "@@GLOBAL.`y`"]]),
        ("? ?", [(K.PLACEHOLDER, "?"), (K.PLACEHOLDER, "?")]),
        ("a:=b<=>c<=d>=e<>f!=g->>h->i&&j||k<<l>>m", None),
        ("café ñ", [(K.WORD, "café"), (K.WORD, "ñ")]),
    ],
)
def test_lexer_tokens(sql, expected):
    if expected is None:
        puncts = [t.text for t in tokenize(sql) if t.kind is K.PUNCT]
        assert puncts == [":=", "<=>", "<=", ">=", "<>", "!=", "->>", "->", "&&", "||", "<<", ">>"]
    else:
        assert kinds(sql) == expected


def test_no_backslash_escapes_changes_string_extent():
    sql = r"'a\' , 'b'"
    # With backslash escapes \' does not close the string: "a' , " is followed by b and an open quote.
    with pytest.raises(SqlLexError):
        tokenize(sql)
    assert kinds(sql, no_backslash_escapes=True) == [(K.STRING, r"'a\'"), (K.PUNCT, ","), (K.STRING, "'b'")]
    assert kinds(r"'a\\'") == [(K.STRING, r"'a\\'")]


@pytest.mark.parametrize(
    "sql, what",
    [
        ("SELECT 'abc", "string"),
        ('SELECT "abc', "string"),
        (r"SELECT 'abc\'", "string"),
        ("SELECT `abc", "quoted identifier"),
        ("SELECT 1 /* abc", "comment"),
        ("SELECT 1 /* abc *", "comment"),
        ("/*!50001 SELECT 1", "executable comment"),
        ("SELECT X'ab", "string"),
        ("SELECT @'ab", "string"),
        ("/*! SELECT /*! 1 */ */", "nested executable comment"),
    ],
)
def test_lexer_rejects_unterminated(sql, what):
    with pytest.raises(SqlLexError, match=what) as info:
        tokenize(sql)
    assert info.value.offset is not None


def test_trivia_tokens_rebuild_the_text():
    sql = "/* a */ SELECT /*!50001 1, */ 'x' -- c\n # d\n FROM t"
    assert "".join(t.text for t in tokenize(sql, trivia=True)) == sql
    assert [t.kind for t in tokenize(sql, trivia=True) if t.kind in (K.EXEC_OPEN, K.EXEC_CLOSE)] == [K.EXEC_OPEN, K.EXEC_CLOSE]


def test_iter_tokens_is_lazy():
    # A broken tail is not reached when the caller stops early.
    tokens = iter_tokens("INSERT INTO t VALUES ('never closed")
    assert next(tokens).text == "INSERT"


sql_alphabet = st.sampled_from(
    list("'\"`\\/*-#!M@?()., \n\t\x00;:=<>|&xN_0123456789abcé") + ["/*!", "*/", "-- ", "/*M!", "0x", "0b", "X'", "''"]
)


@settings(max_examples=400, deadline=5000)
@given(st.one_of(st.text(max_size=200), st.lists(sql_alphabet, max_size=80).map("".join)))
@pytest.mark.parametrize("nbe", [False, True])
def test_lexer_fuzz_never_crashes(nbe, sql):
    # The classification entry points never raise: what they cannot read is "unknown".
    classify(sql, no_backslash_escapes=nbe)
    is_idempotent(sql, no_backslash_escapes=nbe)
    sqltext.analyze(sql, dialect=MARIADB, no_backslash_escapes=nbe)
    try:
        tokens = tokenize(sql, no_backslash_escapes=nbe, trivia=True)
    except SqlParseError:
        return
    assert "".join(t.text for t in tokens) == sql
    assert all(t.text for t in tokens)
    leading_keywords(sql, 3, nbe=nbe)


@settings(max_examples=300, deadline=5000)
@given(st.text(), st.booleans())
def test_quote_string_round_trips_through_the_lexer(value, nbe):
    literal = quote_string(value, no_backslash_escapes=nbe)
    tokens = tokenize(f"SELECT {literal}", no_backslash_escapes=nbe)
    assert [t.kind for t in tokens] == [K.WORD, K.STRING]
    assert unquote(tokens[1].text, nbe) == value


def test_lexer_is_linear_on_large_text():
    sql = "SELECT " + ", ".join(f"'v{i}'" for i in range(200_000))
    started = time.perf_counter()
    assert len(tokenize(sql)) == 400_000
    assert time.perf_counter() - started < 10  # seconds; quadratic behaviour would take minutes


# Statements a hostile client can send to stall the proxy's one event loop: the judge must take
# time linear in the text and never recurse with it (the first two took minutes and raised
# RecursionError before).
HOSTILE = {
    "nested calls": lambda n: "SELECT " + "ABS(" * n + "1" + ")" * n,
    "nested wrappers": lambda n: "SET STATEMENT max_statement_time=1 FOR " * n + "SELECT 1",
    "explain analyze": lambda n: "EXPLAIN ANALYZE " * n + "SELECT 1",
    "nested keyed delete": lambda n: "DELETE FROM t WHERE " + "(" * n + "id = 1" + ")" * n,
    "nested keyed update": lambda n: "UPDATE t SET a = 1 WHERE " + "(" * n + "id = 1" + ")" * n,
    "nested subqueries": lambda n: "SELECT " + "(SELECT " * n + "1" + ")" * n,
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_the_judge_is_linear_on_hostile_nesting(name):
    def judge(n: int) -> float:
        sql = HOSTILE[name](n)
        # This process's CPU time, the best of three: other processes on a busy CI machine
        # (the wall clock) made the ratio fail with linear code.
        best = float("inf")
        for _ in range(3):
            started = time.process_time()
            analysis = analyze(sql, dialect=MARIADB)
            claim(sql, MARIADB, False)
            changes_no_rows(sql, MARIADB, False)
            reads_last_results(sql, MARIADB, False)
            best = min(best, time.process_time() - started)
        assert analysis.unknown is not None or analysis.statements
        return best

    judge(500)  # warm up
    small, large = judge(2_000), judge(16_000)
    # 8x the text: linear ~8x the time, quadratic ~64x (before the fixes: minutes, or RecursionError)
    assert large < 24 * max(small, 0.005), (small, large)


# --- leading_keywords -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql, n, expected",
    [
        ("INSERT INTO t VALUES (1)", 2, ("INSERT", "INTO")),
        ("  select\n1", 2, ("SELECT",)),
        ("/* c */ -- x\n # y\n Start Transaction", 2, ("START", "TRANSACTION")),
        ("/*!40101 SET */ NAMES utf8mb4", 3, ("SET", "NAMES", "UTF8MB4")),
        ("/*!50001 CREATE ALGORITHM=UNDEFINED */", 2, ("CREATE", "ALGORITHM")),
        ("/*M!100100 BEGIN */", 2, ("BEGIN",)),
        ("SET @a = 1", 3, ("SET",)),  # stops at the first non-word token
        ("(SELECT 1)", 2, ()),
        ("", 2, ()),
        ("COMMIT WORK AND NO CHAIN", 5, ("COMMIT", "WORK", "AND", "NO", "CHAIN")),
        ("SELECT", 1, ("SELECT",)),
        ("a b c d e f g h i j", 10, tuple("ABCDEFGHIJ")),
    ],
)
def test_leading_keywords(sql, n, expected):
    assert leading_keywords(sql, n) == expected


# --- classify ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql, kind",
    [
        ("BEGIN", Kind.BEGIN),
        ("begin work", Kind.BEGIN),
        ("START TRANSACTION", Kind.BEGIN),
        ("COMMIT", Kind.COMMIT),
        ("commit work", Kind.COMMIT),
        ("COMMIT AND NO CHAIN", Kind.COMMIT),
        ("ROLLBACK", Kind.ROLLBACK),
        ("ROLLBACK WORK", Kind.ROLLBACK),
        ("SAVEPOINT sp1", Kind.SAVEPOINT),
        ("ROLLBACK TO sp1", Kind.ROLLBACK_TO_SAVEPOINT),
        ("ROLLBACK WORK TO SAVEPOINT sp1", Kind.ROLLBACK_TO_SAVEPOINT),
        ("RELEASE SAVEPOINT sp1", Kind.RELEASE_SAVEPOINT),
        ("SET NAMES utf8mb4", Kind.SET),
        ("SET @a = 1", Kind.SET),
        ("SET TRANSACTION ISOLATION LEVEL READ COMMITTED", Kind.SET_TRANSACTION),
        ("SET SESSION TRANSACTION READ ONLY", Kind.SET_TRANSACTION),
        ("SET GLOBAL TRANSACTION ISOLATION LEVEL SERIALIZABLE", Kind.SET_TRANSACTION),
        ("USE db", Kind.USE),
        ("SELECT 1", Kind.SELECT),
        ("select * from t", Kind.SELECT),
        ("WITH c AS (SELECT 1) SELECT * FROM c", Kind.SELECT),
        ("(SELECT 1) UNION (SELECT 2)", Kind.SELECT),
        ("TABLE t", Kind.SELECT),
        ("VALUES ROW(1, 2)", Kind.SELECT),
        ("INSERT INTO t VALUES (1)", Kind.INSERT),
        ("insert ignore into t values (1)", Kind.INSERT),
        ("REPLACE INTO t VALUES (1)", Kind.REPLACE),
        ("UPDATE t SET a = 1", Kind.UPDATE),
        ("DELETE FROM t", Kind.DELETE),
        ("WITH c AS (SELECT 1) DELETE FROM t WHERE id IN (SELECT * FROM c)", Kind.DELETE),
        ("LOAD DATA LOCAL INFILE 'x' INTO TABLE t", Kind.LOAD_DATA),
        ("LOAD XML INFILE 'x' INTO TABLE t", Kind.LOAD_DATA),
        ("CALL p(1)", Kind.CALL),
        ("CREATE TABLE t (a INT)", Kind.DDL),
        ("ALTER TABLE t ADD b INT", Kind.DDL),
        ("DROP TABLE t", Kind.DDL),
        ("RENAME TABLE a TO b", Kind.DDL),
        ("TRUNCATE TABLE t", Kind.DDL),
        ("CREATE USER u", Kind.DDL),
        ("LOCK TABLES t WRITE", Kind.LOCK_TABLES),
        ("LOCK TABLE t READ", Kind.LOCK_TABLES),
        ("UNLOCK TABLES", Kind.UNLOCK_TABLES),
        ("SHOW TABLES", Kind.SHOW),
        ("DESCRIBE t", Kind.SHOW),
        ("DESC t", Kind.SHOW),
        ("EXPLAIN SELECT 1", Kind.SHOW),
        ("PREPARE s FROM 'SELECT 1'", Kind.PREPARE_SQL),
        ("EXECUTE s USING @a", Kind.EXECUTE_SQL),
        ("EXECUTE IMMEDIATE 'SELECT 1'", Kind.EXECUTE_SQL),
        ("DEALLOCATE PREPARE s", Kind.DEALLOCATE_SQL),
        ("DROP PREPARE s", Kind.DEALLOCATE_SQL),
        ("DO 1", Kind.DO),
        ("XA START 'x'", Kind.XA),
        ("XA COMMIT 'x'", Kind.XA),
        ("GRANT ALL ON *.* TO u", Kind.OTHER),
        ("KILL 5", Kind.OTHER),
        ("BEGIN NOT ATOMIC SELECT 1; END", Kind.OTHER),  # MariaDB compound statement
        ("", Kind.EMPTY),
        ("  /* only a comment */ ", Kind.EMPTY),
        (";", Kind.EMPTY),
        ("-- c\n", Kind.EMPTY),
    ],
)
def test_classify_kinds(sql, kind):
    assert classify(sql).kind is kind


@pytest.mark.parametrize(
    "sql",
    [
        "/* leading */ COMMIT",
        "-- x\nCOMMIT",
        "# x\nCOMMIT",
        "/*!COMMIT*/",
        "/*!50000 COMMIT */",
        "/*M!100000 COMMIT*/",
        "  commit  ;  ",
        "CoMmIt",
    ],
)
def test_classify_sees_through_comments_and_case(sql):
    assert classify(sql).kind is Kind.COMMIT


def test_classify_comments_do_not_fool_it():
    assert classify("/* COMMIT */ SELECT 1").kind is Kind.SELECT
    assert classify("-- DROP TABLE t\nSELECT 1").kind is Kind.SELECT
    assert classify("SELECT '; COMMIT'").kind is Kind.SELECT


@pytest.mark.parametrize(
    "sql",
    [
        "CREATE TABLE t (a INT)", "CREATE DATABASE d", "ALTER TABLE t ADD b INT", "DROP TABLE t", "RENAME TABLE a TO b",
        "TRUNCATE t", "LOCK TABLES t WRITE", "UNLOCK TABLES", "GRANT SELECT ON t TO u", "REVOKE SELECT ON t FROM u",
        "CREATE USER u", "ANALYZE TABLE t", "OPTIMIZE TABLE t", "REPAIR TABLE t", "CHECK TABLE t", "LOAD INDEX INTO CACHE t",
        "FLUSH PRIVILEGES", "BEGIN", "START TRANSACTION", "SET autocommit = 1", "SET autocommit=ON", "SET PASSWORD = 'x'",
        "CACHE INDEX t IN c", "INSTALL PLUGIN p SONAME 'p.so'", "START SLAVE", "STOP REPLICA", "CHANGE MASTER TO MASTER_HOST='h'",
    ],
)  # fmt: skip
def test_implicit_commit(sql):
    assert classify(sql).implicit_commit


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1", "INSERT INTO t VALUES (1)", "COMMIT", "ROLLBACK", "SET autocommit = 0", "SET @a = 1",
        "CREATE TEMPORARY TABLE t (a INT)", "DROP TEMPORARY TABLE t", "SAVEPOINT a", "XA START 'x'",
    ],
)  # fmt: skip
def test_no_implicit_commit(sql):
    assert not classify(sql).implicit_commit


def test_set_autocommit_value():
    assert classify("SET autocommit = 0").autocommit is False
    assert classify("SET @@session.autocommit = ON").autocommit is True
    assert classify("SET SESSION sql_mode = ''").autocommit is None


@pytest.mark.parametrize(
    "sql, read_only",
    [
        ("SELECT 1", True),
        ("SELECT * FROM t WHERE id = 1", True),
        ("SELECT a FROM t LIMIT 1", True),
        ("SELECT * FROM t FOR UPDATE", False),
        ("SELECT * FROM t FOR SHARE", False),
        ("SELECT * FROM t LOCK IN SHARE MODE", False),
        ("SELECT a INTO @x FROM t", False),
        ("SELECT * INTO OUTFILE '/tmp/x' FROM t", False),
        ("SELECT GET_LOCK('a', 1)", False),
        ("SELECT release_lock('a')", False),
        ("SELECT SLEEP(1)", False),
        ("SELECT NEXTVAL(s)", False),
        ("SELECT NEXT VALUE FOR s", False),
        ("SELECT s.nextval", False),  # MariaDB, sql_mode=ORACLE
        ("SELECT db.s.NEXTVAL FROM dual", False),
        ("SELECT nextval FROM t", True),  # a column
        ("SELECT SETVAL(s, 5)", False),
        ("SELECT LAST_INSERT_ID()", True),
        ("SELECT LAST_INSERT_ID(5)", False),
        ("SELECT @a := 1", False),
        ("SELECT 'GET_LOCK(' , 'x INTO @y'", True),
        ("SHOW TABLES", True),
        ("DESCRIBE t", True),
        ("EXPLAIN SELECT * FROM t", True),
        ("EXPLAIN ANALYZE SELECT * FROM t", True),
        ("USE db", False),  # session_only, below
        ("DO 1", True),
        ("DO SLEEP(1)", False),
        ("INSERT INTO t VALUES (1)", False),
        ("SET @a = 1", False),
        ("BEGIN", False),
    ],
)
def test_read_only(sql, read_only):
    assert classify(sql).read_only is read_only


def test_transaction_flags():
    st_ = classify("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ WRITE")
    assert (st_.kind, st_.consistent_snapshot, st_.begin_read_only, st_.implicit_commit) == (Kind.BEGIN, True, False, True)
    st_ = classify("START TRANSACTION READ ONLY")
    assert st_.begin_read_only and not st_.consistent_snapshot
    assert classify("START TRANSACTION READ ONLY, WITH CONSISTENT SNAPSHOT").consistent_snapshot
    assert classify("COMMIT WORK AND CHAIN").chain
    assert not classify("COMMIT AND NO CHAIN").chain
    assert classify("ROLLBACK AND CHAIN").chain
    assert classify("COMMIT RELEASE").release
    assert not classify("COMMIT NO RELEASE").release
    assert classify("ROLLBACK TO SAVEPOINT `my sp`").target == "my sp"
    assert classify("SAVEPOINT sp1").target == "sp1"
    assert classify("RELEASE SAVEPOINT sp1").target == "sp1"
    assert classify("COMMIT garbage").kind is Kind.OTHER
    assert classify("START TRANSACTION garbage").kind is Kind.OTHER


@pytest.mark.parametrize(
    "sql, fragment",
    [
        ("CREATE TEMPORARY TABLE t (a INT)", "TEMPORARY"),
        ("CREATE OR REPLACE TEMPORARY TABLE t (a INT)", "TEMPORARY"),
        ("SELECT GET_LOCK('lock', 10)", "GET_LOCK"),
        ("DO get_lock('lock', 10)", "GET_LOCK"),
        ("SET @x = GET_LOCK('lock', 10)", "GET_LOCK"),
        ("INSERT INTO t VALUES ('a', GET_LOCK('l', 1))", "GET_LOCK"),
        ("INSERT INTO t VALUES ('get_lock(', 1), (Get_Lock ('l', 1))", "GET_LOCK"),
        ("LOCK TABLES t WRITE", "LOCK TABLES"),
        ("SELECT a INTO @v FROM t", "INTO @variable"),
        ("SET @v := (SELECT @w := 1)", "@v := ..."),  # @w: assigned where no read-back sees it
        ("SET @@session.sql_mode = (SELECT @w := 'ANSI')", "@v := ..."),
        ("PREPARE stmt FROM 'SELECT 1'", "PREPARE"),
        ("HANDLER t OPEN", "HANDLER"),
        ("FLUSH TABLES WITH READ LOCK", "READ LOCK"),
        ("SET ROLE r", "ROLE"),
    ],
)
def test_session_unrestorable(sql, fragment):
    reason = classify(sql).session_unrestorable
    assert reason and fragment in reason


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 'GET_LOCK(x)'",
        "INSERT INTO t VALUES ('get_lock(', 1)",
        "INSERT INTO t VALUES (1) -- get_lock(",
        "INSERT INTO t VALUES (1) /* get_lock( */",
        "INSERT INTO t VALUES ('it''s', 'get_lock(')",
        "SELECT my_get_lock(1)",
        "SET @v = 1, @w = 'x', @n = NULL",
        "SET sql_mode = CONCAT(@@sql_mode, ',ANSI')",
        "CREATE TABLE t (a INT)",
        "SELECT a FROM t",
        "EXECUTE s",
    ],
)
def test_session_restorable(sql):
    assert classify(sql).session_unrestorable is None


@pytest.mark.parametrize(
    "sql",
    [
        # What DM v8.5.5 asks TiDB after a DDL lost its connection (dm/syncer/util.go).
        "ADMIN SHOW DDL JOBS 10",
        "ADMIN SHOW DDL JOB QUERIES LIMIT 10 OFFSET 20",
        "admin show ddl jobs 5 where state = 'synced'",
        "ADMIN CHECK TABLE t",
        "ADMIN CHECKSUM TABLE t",
        "ADMIN SHOW t NEXT_ROW_ID",
    ],
)
def test_tidb_admin_reads_are_known_reads(sql):
    st = classify(sql, dialect=TIDB)
    assert (st.read_only, st.implicit_commit, st.unknown, st.session_unrestorable, st.runs_code) == (True, False, None, None, False)


def test_tidb_admin_is_judged_like_any_statement():
    assert classify("ADMIN SHOW DDL JOBS 1 WHERE f(1)", dialect=TIDB).runs_code
    assert classify("ADMIN SHOW DDL JOBS 1 WHERE GET_LOCK('a', 1)", dialect=TIDB).session_unrestorable
    assert not classify("ADMIN SHOW DDL JOBS 1 WHERE JOB_ID = LAST_INSERT_ID(7)", dialect=TIDB).read_only
    # CANCEL, RECOVER, RELOAD act on the cluster outside any transaction: a replay would repeat them.
    for sql in ("ADMIN CANCEL DDL JOBS 1", "ADMIN RECOVER INDEX t i", "ADMIN RELOAD BINDINGS"):
        assert classify(sql, dialect=TIDB).unknown


def test_needs_capture():
    assert classify("SET sql_mode = CONCAT(@@sql_mode, ',ANSI')").needs_capture
    assert classify("SET @@session.time_zone = @@global.time_zone").needs_capture
    assert not classify("SET time_zone = '+00:00'").needs_capture
    assert not classify("SET GLOBAL time_zone = @@session.time_zone").needs_capture
    # A user variable set from an expression is read back too (it was once unrestorable).
    for text in ("SET @v = (SELECT MAX(id) FROM t)", "SET @v = NOW()", "SET @v = @@session.sql_mode", "SET @a := @a + 1", "SET @w = ?"):
        st = classify(text)
        assert st.needs_capture and st.session_unrestorable is None, text
    assert not classify("SET @v = 1, @w = 'x'").needs_capture


def test_classify_targets():
    assert classify("USE `my db`").target == "my db"
    assert classify("PREPARE s1 FROM 'x'").target == "s1"
    assert classify("EXECUTE s1").target == "s1"
    assert classify("DEALLOCATE PREPARE s1").target == "s1"


def test_classify_inner_statements():
    assert classify("SET STATEMENT max_statement_time = 1 FOR DELETE FROM t").kind is Kind.DELETE
    assert classify("SET STATEMENT a = (1), b = 2 FOR SELECT 1").read_only
    assert classify("ANALYZE SELECT * FROM t").read_only
    assert classify("ANALYZE DELETE FROM t").kind is Kind.DELETE
    assert classify("ANALYZE TABLE t").implicit_commit


def test_leading_keywords_raise_on_unterminated_text():
    with pytest.raises(SqlLexError):
        leading_keywords("/* unterminated", 2)


def test_classify_never_raises_on_broken_text():
    for sql in ("SELECT 'unterminated", "COMMIT 'x", "SET @a = 'x", "/* never closed", "SELECT 1; DROP TABLE t"):
        st_ = classify(sql)
        assert st_.unknown is not None and st_.writes and st_.may_commit and not st_.read_only, sql
    analysis = sqltext.analyze("SELECT 1; DROP TABLE t", dialect=MARIADB)
    assert [s.kind for s in analysis.statements] == [Kind.SELECT, Kind.DDL] and analysis.may_commit


def test_session_only():
    assert classify("USE db").session_only and not classify("USE db").writes
    assert classify("SET @a = 1, sql_mode = ''").session_only
    assert not classify("SET GLOBAL max_connections = 10").session_only
    assert not classify("SET @a = f(1)").session_only  # a stored function may write


# --- parse_set / render_set -------------------------------------------------------------------

S = SetScope


def a(scope, name, value, const=True, collation=None):
    return SetAssignment(scope, name, value, const, collation)


@pytest.mark.parametrize(
    "sql, expected",
    [
        ("SET NAMES utf8mb4", [a(S.NAMES, "utf8mb4", "utf8mb4")]),
        ("SET NAMES 'utf8mb4' COLLATE 'utf8mb4_bin'", [a(S.NAMES, "utf8mb4", "'utf8mb4'", collation="utf8mb4_bin")]),
        ("set names UTF8MB4 collate utf8mb4_0900_ai_ci", [a(S.NAMES, "utf8mb4", "UTF8MB4", collation="utf8mb4_0900_ai_ci")]),
        ("SET NAMES DEFAULT", [a(S.NAMES, "default", "DEFAULT")]),
        ("SET CHARACTER SET latin1", [a(S.CHARSET, "latin1", "latin1")]),
        ("SET CHARSET 'utf8'", [a(S.CHARSET, "utf8", "'utf8'")]),
        ("SET CHARSET DEFAULT", [a(S.CHARSET, "default", "DEFAULT")]),
        ("SET sql_mode = 'ANSI'", [a(S.SESSION, "sql_mode", "'ANSI'")]),
        ("SET SESSION sql_mode = 'ANSI'", [a(S.SESSION, "sql_mode", "'ANSI'")]),
        ("SET LOCAL sql_mode = 'ANSI'", [a(S.SESSION, "sql_mode", "'ANSI'")]),
        ("SET GLOBAL max_connections = 10", [a(S.GLOBAL, "max_connections", "10")]),
        ("SET PERSIST max_connections = 10", [a(S.GLOBAL, "max_connections", "10")]),
        ("SET PERSIST_ONLY max_connections = 10", [a(S.GLOBAL, "max_connections", "10")]),
        ("SET @@sql_mode = ''", [a(S.SESSION, "sql_mode", "''")]),
        ("SET @@session.SQL_MODE = ''", [a(S.SESSION, "sql_mode", "''")]),
        ("SET @@local.x = 1", [a(S.SESSION, "x", "1")]),
        ("SET @@GLOBAL.x = 1", [a(S.GLOBAL, "x", "1")]),
        ("SET @User_Var = 5", [a(S.USER, "user_var", "5")]),
        ("SET @`odd name` := 'v'", [a(S.USER, "odd name", "'v'")]),
        ("SET @'q' = -1.5", [a(S.USER, "q", "-1.5")]),
        ("SET @a = (SELECT 1)", [a(S.USER, "a", "(SELECT 1)", False)]),
        ("SET x = @@global.x", [a(S.SESSION, "x", "@@global.x", False)]),
        ("SET x = 1 + 1", [a(S.SESSION, "x", "1 + 1", False)]),
        ("SET x = NOW()", [a(S.SESSION, "x", "NOW()", False)]),
        ("SET x = CURRENT_TIMESTAMP", [a(S.SESSION, "x", "CURRENT_TIMESTAMP", False)]),
        ("SET default.key_buffer_size = 1", [a(S.SESSION, "default.key_buffer_size", "1")]),
        ("SET sql_mode = /* keep */ 'ANSI' ;", [a(S.SESSION, "sql_mode", "'ANSI'")]),
        ("/*!40101 SET @OLD_X=@@X */;", [a(S.USER, "old_x", "@@X", False)]),
        (
            "SET a=1, @@b='x', @c=3, SESSION d=DEFAULT, NAMES utf8mb4",
            [a(S.SESSION, "a", "1"), a(S.SESSION, "b", "'x'"), a(S.USER, "c", "3"), a(S.SESSION, "d", "DEFAULT"), a(S.NAMES, "utf8mb4", "utf8mb4")],
        ),
        (
            # A bare scope keyword applies to the following assignments; @@x is always the session.
            "SET GLOBAL a = 1, b = 2, @@c = 3, SESSION d = 4, e = 5, @@global.f = 6, g = 7",
            [a(S.GLOBAL, "a", "1"), a(S.GLOBAL, "b", "2"), a(S.SESSION, "c", "3"), a(S.SESSION, "d", "4"),
             a(S.SESSION, "e", "5"), a(S.GLOBAL, "f", "6"), a(S.SESSION, "g", "7")],
        ),
        (
            # go-sql-driver: one SET from the DSN params, values quoted, commas inside quotes.
            "SET sql_mode='STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO',time_zone='+00:00',foreign_key_checks=0",
            [a(S.SESSION, "sql_mode", "'STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO'"),
             a(S.SESSION, "time_zone", "'+00:00'"), a(S.SESSION, "foreign_key_checks", "0")],
        ),
        (
            "SET tidb_txn_mode = 'optimistic', time_zone = '+08:00', sql_mode = 'ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES'",
            [a(S.SESSION, "tidb_txn_mode", "'optimistic'"), a(S.SESSION, "time_zone", "'+08:00'"),
             a(S.SESSION, "sql_mode", "'ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES'")],
        ),
        ("SET @x = CONCAT('a,b', 'c'), y = -1", [a(S.USER, "x", "CONCAT('a,b', 'c')", False), a(S.SESSION, "y", "-1")]),
        ("SET @s = 'it''s, ok', @t = \"x,y\"", [a(S.USER, "s", "'it''s, ok'"), a(S.USER, "t", '"x,y"')]),
        ("SET autocommit = ON, unique_checks = OFF, x = TRUE, y = NULL", [a(S.SESSION, "autocommit", "ON"), a(S.SESSION, "unique_checks", "OFF"), a(S.SESSION, "x", "TRUE"), a(S.SESSION, "y", "NULL")]),
        ("SET @h = 0xFF, @b = b'01', @i = _utf8mb4'x' COLLATE utf8mb4_bin, @d = DATE '2020-01-01', @n = N'z'",
         [a(S.USER, "h", "0xFF"), a(S.USER, "b", "b'01'"), a(S.USER, "i", "_utf8mb4'x' COLLATE utf8mb4_bin"), a(S.USER, "d", "DATE '2020-01-01'"), a(S.USER, "n", "N'z'")]),
        ("SET TRANSACTION ISOLATION LEVEL READ COMMITTED", [a(S.NEXT_TRANSACTION, "transaction_isolation", "ISOLATION LEVEL READ COMMITTED")]),
        ("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY",
         [a(S.TRANSACTION, "transaction_isolation", "ISOLATION LEVEL REPEATABLE READ"), a(S.TRANSACTION, "transaction_read_only", "READ ONLY")]),
        ("SET LOCAL TRANSACTION READ WRITE", [a(S.TRANSACTION, "transaction_read_only", "READ WRITE")]),
        ("SET GLOBAL TRANSACTION ISOLATION LEVEL SERIALIZABLE", [a(S.GLOBAL, "transaction_isolation", "ISOLATION LEVEL SERIALIZABLE")]),
        ("SET STATEMENT max_statement_time = 1 FOR SELECT 1", []),
    ],
)  # fmt: skip
def test_parse_set(sql, expected):
    assert parse_set(sql) == expected


@pytest.mark.parametrize("sql", ["SELECT 1", "INSERT INTO t SET a = 1", "SET PASSWORD = 'x'", "SET ROLE r", "SET DEFAULT ROLE r TO u", ""])
def test_parse_set_not_a_variable_set(sql):
    assert parse_set(sql) is None


@pytest.mark.parametrize(
    "sql", ["SET", "SET x", "SET x =", "SET = 1", "SET TRANSACTION FOO", "SET a = 1, , b = 2", "SET a = 1; SET b = 2", "SET NAMES"]
)
def test_parse_set_rejects_malformed(sql):
    with pytest.raises(SqlParseError):
        parse_set(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "SET NAMES utf8mb4",
        "SET NAMES 'utf8mb4' COLLATE 'utf8mb4_bin'",
        "SET NAMES utf8mb4 COLLATE DEFAULT",
        "SET CHARACTER SET latin1",
        "SET sql_mode='STRICT_TRANS_TABLES,NO_ZERO_DATE',time_zone='+00:00',foreign_key_checks=0",
        "SET a=1, @@b='x', @c=3, SESSION d=DEFAULT, NAMES utf8mb4",
        "SET @`odd ``name` = 1, @x = _binary'\\0\\''",
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED, READ ONLY",
        "SET TRANSACTION READ WRITE",
    ],
)
def test_render_set_round_trip(sql):
    assignments = parse_set(sql)
    rendered = render_set(assignments)
    assert parse_set(rendered) == assignments
    assert rendered.startswith("SET ")


def test_render_set_shapes():
    assert render_set(parse_set("SET names utf8mb4 collate utf8mb4_bin")) == "SET NAMES utf8mb4 COLLATE utf8mb4_bin"
    assert render_set(parse_set("SET @@local.sql_mode = ''")) == "SET @@SESSION.sql_mode = ''"
    assert render_set([a(S.USER, "x y", "1")]) == "SET @`x y` = 1"
    assert render_set(parse_set("SET SESSION TRANSACTION READ ONLY")) == "SET SESSION TRANSACTION READ ONLY"
    with pytest.raises(ValueError):
        render_set(parse_set("SET GLOBAL x = 1"))
    with pytest.raises(ValueError):
        render_set(parse_set("SET SESSION TRANSACTION READ ONLY") + parse_set("SET x = 1"))
    with pytest.raises(ValueError):
        render_set([])


# --- INSERT heads -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql, verb, modifiers",
    [
        ("INSERT INTO t VALUES (1)", "INSERT", set()),
        ("insert low_priority ignore into `db`.`t` (`a`,`b`) values(1,2)", "INSERT", {"LOW_PRIORITY", "IGNORE"}),
        ("REPLACE t VALUE (1)", "REPLACE", set()),
        ("/* c */ INSERT /* d */ INTO t PARTITION (p0, p1) (a) VALUES (1)", "INSERT", set()),
        ("INSERT INTO db . t (a) VALUES (1)", "INSERT", set()),
        ("/*!40000 INSERT */ INTO t VALUES (1)", "INSERT", set()),
    ],
)
def test_parse_insert_head(sql, verb, modifiers):
    head = parse_insert_head(sql)
    assert head is not None and (head.verb, set(head.modifiers)) == (verb, modifiers)
    assert sql[head.rows_start] == "("


@pytest.mark.parametrize(
    "sql",
    ["INSERT INTO t SELECT 1", "INSERT INTO t (a) SELECT 1", "INSERT INTO t SET a = 1", "INSERT INTO t VALUES ROW(1)",
     "INSERT INTO t (SELECT 1)", "UPDATE t SET a = 1", "INSERT INTO VALUES (1)", "INSERT INTO t VALUES /*! (1) */"],
)  # fmt: skip
def test_parse_insert_head_rejects(sql):
    assert parse_insert_head(sql) is None


# --- is_idempotent ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "REPLACE INTO t VALUES (1,'x')",
        "REPLACE INTO `db`.`t` (`a`,`b`) VALUES (1,'x'),(2,NULL), (3, -4.5e-3)",
        "replace into t (a, b, c, d) values (_binary'\\0\\'', X'0A', 0x1F, b'01')",
        "REPLACE INTO `db`.`t` (`c`,`c2`) VALUES (?,?),(?,?)",
        "/* dm */ REPLACE INTO t VALUES (1) ;",
        "INSERT INTO `db`.`tb` (`c`,`c2`) VALUES (1,2),(3,4) ON DUPLICATE KEY UPDATE `c`=VALUES(`c`),`c2`=VALUES(`c2`)",
        "INSERT INTO t (a, b) VALUES (1, 2) AS new ON DUPLICATE KEY UPDATE b = new.b",
        "INSERT INTO t (a, b) VALUES (1, 2) AS new (x, y) ON DUPLICATE KEY UPDATE b = y, a = new.x",
        "INSERT INTO t (a, b) VALUES (1, 2) ON DUPLICATE KEY UPDATE b = 5, a = 'x'",
        "DELETE FROM t WHERE id = 1 LIMIT 1",
        "DELETE FROM `db`.`tb2` WHERE `c` = 1 AND `c2` IS NULL LIMIT 1",
        "DELETE FROM `db`.`tb2` WHERE `c` = ? AND `c2` IS ? LIMIT 1",
        "DELETE FROM t WHERE id = 'x'",
        "DELETE FROM t WHERE (a, b) = (1, 2)",
        "DELETE FROM t WHERE (a = 1 AND b = 2)",
        "DELETE FROM `db`.`tb` WHERE (`c` = 1) OR (`c` = 3)",
        "DELETE FROM t WHERE (a = 1 AND b = 2) OR (a = 3 AND b = 4)",
        "DELETE FROM t WHERE id IN (1, 2, 3)",
        "DELETE FROM t WHERE (a, b) IN ((1, 2), (3, 4))",
        "UPDATE t SET a = 1, b = 'x' WHERE id = 1",
        "UPDATE `db`.`tb2` SET `id` = 1, `name` = 4 WHERE `id` = 1 LIMIT 1",  # key "assigned" its own value
        "UPDATE t SET a = NULL WHERE k1 = 1 AND k2 = 'b' LIMIT 1",
        "UPDATE t SET a = ? WHERE id = ?",
        "SET NAMES utf8mb4",
        "SET sql_mode='STRICT_TRANS_TABLES,NO_ZERO_DATE',time_zone='+00:00',foreign_key_checks=0",
        "SET @a = 1",
        "SET SESSION TRANSACTION READ ONLY",
        "BEGIN",
        "START TRANSACTION",
        "COMMIT",
        "ROLLBACK",
        "SAVEPOINT a",
        "SELECT * FROM t WHERE id = 1",
        "SHOW VARIABLES",
        "USE db",
        # DM's full load ends each table with one (a lost answer stopped its task: issue 27)
        "ALTER TABLE `shop`.`orders`  AUTO_INCREMENT=1",
        "alter table t auto_increment 5;",
        "ALTER TABLE db.t AUTO_INCREMENT = 100 /* c */",
    ],
)
def test_idempotent(sql):
    assert is_idempotent(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO t VALUES (1)",
        "INSERT IGNORE INTO t VALUES (1)",
        "INSERT IGNORE INTO t (a) VALUES (1) ON DUPLICATE KEY UPDATE a = VALUES(a)",
        "INSERT INTO t (a) VALUES (1) ON DUPLICATE KEY UPDATE a = a + 1",
        "INSERT INTO t (a) VALUES (1) ON DUPLICATE KEY UPDATE a = VALUES(a) + 1",
        "INSERT INTO t (a) VALUES (1) ON DUPLICATE KEY UPDATE a = b",
        # b gets 2 when the row is inserted, then a's 1 when a second run finds it
        "INSERT INTO t (a, b) VALUES (1, 2) ON DUPLICATE KEY UPDATE t.b = VALUES(a)",
        "INSERT INTO t (a, b) VALUES (1, ?) ON DUPLICATE KEY UPDATE b = ?",  # two values bound apart
        "INSERT INTO t (a) VALUES (1) AS new ON DUPLICATE KEY UPDATE a = old.a",
        "INSERT INTO t (a) SELECT a FROM s",
        "INSERT INTO t SET a = 1",
        "REPLACE INTO t SELECT * FROM s",
        "REPLACE INTO t SET a = 1",
        "REPLACE INTO t VALUES (1, NOW())",
        "REPLACE INTO t VALUES (1, RAND())",
        "REPLACE INTO t VALUES (1, DEFAULT)",
        "REPLACE INTO t VALUES ()",
        "REPLACE INTO t VALUES (1, a)",
        "REPLACE INTO t VALUES (1), (2 + 3)",
        "REPLACE INTO t VALUES (1); DELETE FROM t",
        "REPLACE INTO t VALUES (1) ON DUPLICATE KEY UPDATE a = 1",
        "UPDATE t SET n = n + 1 WHERE id = 1",
        "UPDATE t SET a = 1 WHERE a = 0",
        "DELETE FROM t WHERE a <=> NULL",  # NULL-safe equality with NULL matches any number of rows
        "UPDATE t SET id = ? WHERE id = ?",
        "UPDATE t SET a = 1",
        "UPDATE t SET a = NOW() WHERE id = 1",
        "UPDATE t SET a = DEFAULT WHERE id = 1",
        "UPDATE t SET a = 1 WHERE id > 1",
        "UPDATE t SET a = 1 WHERE id = 1 OR id = 2",
        "UPDATE t SET a = 1 WHERE id = 1 ORDER BY id LIMIT 1",
        "UPDATE t, s SET t.a = 1 WHERE t.id = 1",
        "UPDATE IGNORE t SET a = 1 WHERE id = 1",
        "UPDATE t SET `db`.`tb`.`a` = CASE WHEN `c` = 1 THEN 2 END WHERE (`c` = 1)",
        "DELETE FROM t",
        "DELETE FROM t WHERE id > 1",
        "DELETE FROM t WHERE id = 1 OR name = 'x'",
        "DELETE FROM t WHERE id IN (1, 2) LIMIT 1",
        "DELETE FROM t WHERE id IN (SELECT id FROM s)",
        "DELETE FROM t WHERE id = (SELECT 1)",
        "DELETE FROM t WHERE id IS NOT NULL",
        "DELETE FROM t WHERE id = 1 LIMIT 2",
        "DELETE t FROM t JOIN s ON t.id = s.id WHERE s.x = 1",
        "DELETE FROM t USING t JOIN s WHERE t.id = 1",
        "DELETE IGNORE FROM t WHERE id = 1",
        "LOAD DATA INFILE 'x' INTO TABLE t",
        "CALL p()",
        "CREATE TABLE t (a INT)",
        "DROP TABLE t",
        "TRUNCATE t",
        "SET GLOBAL x = 1",
        "SET @a = NOW()",
        "SET sql_mode = CONCAT(@@sql_mode, ',ANSI')",
        "SET STATEMENT max_statement_time = 1 FOR DELETE FROM t",
        "SELECT * FROM t FOR UPDATE",
        "SELECT GET_LOCK('a', 1)",
        "SELECT a INTO @x FROM t",
        "DO 1",
        "XA START 'x'",
        "",
        "ALTER TABLE t AUTO_INCREMENT=1, ADD c INT",
        "ALTER TABLE t ADD c INT",
        "ALTER TABLE t AUTO_INCREMENT=@x",
        "ALTER TABLE t AUTO_INCREMENT=1.5",
        "ALTER TABLE t /*!50000 ADD c INT */ AUTO_INCREMENT=1",
        "ALTER TABLE t AUTO_INCREMENT",
    ],
)
def test_not_idempotent(sql):
    assert not is_idempotent(sql)


def test_idempotent_with_no_backslash_escapes():
    sql = r"REPLACE INTO t VALUES ('a\', 'b')"  # two values when backslash is literal
    assert is_idempotent(sql, no_backslash_escapes=True)
    assert not is_idempotent(sql)  # with escapes the string swallows the comma and never ends


def test_is_idempotent_is_linear_on_a_huge_replace():
    """4x the rows takes about 4x the CPU time, not 16x (the ratio holds on a loaded machine,
    where a fixed time limit would not)."""

    def cpu_seconds(n: int) -> float:
        rows = ",".join(f"({i},'row {i} with ''quotes'' and \\\\ backslash',NULL,-{i}.5)" for i in range(n))
        sql = f"REPLACE INTO `db`.`t` (`a`,`b`,`c`,`d`) VALUES {rows}"
        started = time.process_time()
        assert is_idempotent(sql)
        assert not is_idempotent(sql + ", (1, NOW(), 2, 3)")
        return time.process_time() - started

    small, large = cpu_seconds(10_000), cpu_seconds(40_000)
    assert large < 8 * small, (small, large)


# --- idempotence: claims and proofs by the table's keys -------------------------------------------

from proxy.sqltext.claims import claim, stored_as_zero  # noqa: E402
from proxy.sqltext.idempotence import TableKeys, proves, proves_together  # noqa: E402

KEYS = TableKeys(unique_keys=(frozenset({"id"}),), key_columns=frozenset({"id"}), columns=("id", "v", "email"),
                 auto_increment="id")  # fmt: skip
# The same table with a UNIQUE index on the nullable email as well.
TWO_KEYS = attrs.evolve(KEYS, key_columns=frozenset({"id", "email"}))


@pytest.mark.parametrize(
    "sql, proven",
    [
        ("REPLACE INTO t (id, v) VALUES (1, 'a'), (2, 'b')", True),
        ("REPLACE INTO t VALUES (1, 'a', 'x@y')", True),  # by position
        ("REPLACE INTO t (v) VALUES ('x')", False),  # the AUTO_INCREMENT id is generated anew
        ("REPLACE INTO t (id, v) VALUES (NULL, 'x')", False),
        # 0 into an AUTO_INCREMENT column generates an id (without NO_AUTO_VALUE_ON_ZERO), and so
        # does anything the server may store as 0: a second run adds a row.
        ("REPLACE INTO t (id, v) VALUES (0, 'x')", False),
        ("REPLACE INTO t VALUES (0, 'a', 'x@y')", False),  # by position
        ("REPLACE INTO t (id, v) VALUES ('0', 'x')", False),
        ("REPLACE INTO t (id, v) VALUES (0.4, 'x')", False),
        ("REPLACE INTO t (id, v) VALUES (FALSE, 'x')", False),
        ("REPLACE INTO t (id, v) VALUES (X'00', 'x')", False),
        ("REPLACE INTO t (id, v) VALUES ('', 'x')", False),
        ("REPLACE INTO t (id, v) VALUES (1, 'a'), (0, 'b')", False),
        ("INSERT INTO t (id, v) VALUES (0, 'a') ON DUPLICATE KEY UPDATE v = VALUES(v)", False),
        ("REPLACE INTO t (id, v) VALUES (-3, 'y')", False),  # 0 in an UNSIGNED column (not strict)
        ("REPLACE INTO t (id, v) VALUES ('7', 'x'), (+3, 'y'), (1e3, 'z'), (TRUE, 'w')", True),
        ("INSERT INTO t (id, v) VALUES (1, 'a') ON DUPLICATE KEY UPDATE v = VALUES(v)", True),
        ("INSERT INTO t (id, v) VALUES (1, 'a') ON DUPLICATE KEY UPDATE id = 7", False),  # changes the key
        # ODKU c = constant: a first run that inserts the row, a second that updates it, must
        # leave it the same: only when every row inserts that constant into c.
        ("INSERT INTO t (id, v) VALUES (1, 'a') ON DUPLICATE KEY UPDATE v = 'a'", True),
        ("INSERT INTO t VALUES (3, 'z', 'e') ON DUPLICATE KEY UPDATE v = 'z'", True),  # by the table's order
        ("INSERT INTO t (id, v) VALUES (1, 'a'), (2, 'a') ON DUPLICATE KEY UPDATE v = 'a'", True),
        ("INSERT INTO t (id, v) VALUES (1, 'a') ON DUPLICATE KEY UPDATE v = 'b'", False),  # 'a', then 'b'
        ("INSERT INTO t (id, v) VALUES (1, 'a'), (2, 'b') ON DUPLICATE KEY UPDATE v = 'a'", False),
        ("INSERT INTO t (id) VALUES (1) ON DUPLICATE KEY UPDATE v = 'a'", False),  # v's default, then 'a'
        ("INSERT INTO t VALUES (3, 'y', 'e') ON DUPLICATE KEY UPDATE v = 'z'", False),
        ("INSERT INTO t (id, v) VALUES (1, 5) ON DUPLICATE KEY UPDATE v = '5'", False),  # another spelling: not compared
        ("DELETE FROM t WHERE id = 1 LIMIT 1", True),
        ("DELETE FROM t WHERE v = 1 LIMIT 1", False),  # not a key: another row each time
        ("DELETE FROM t WHERE id IN (1, 2)", True),
        ("UPDATE t SET v = 'b' WHERE id = 1", True),
        ("UPDATE t SET v = 'b' WHERE v = 'a'", False),
    ],
)
def test_keys_prove_idempotence(sql, proven):
    c = claim(sql, MARIADB)
    assert (c is not None and proves(c, KEYS)) == proven


def test_placeholders_prove_only_when_bound_to_values():
    sql = "REPLACE INTO t (id, v) VALUES (?, ?)"
    assert not proves(claim(sql, MARIADB), KEYS, zero_is_value=True)  # a ? may be NULL
    assert proves(claim(sql, MARIADB, null_params=[False, True]), KEYS, zero_is_value=True)  # id bound, v NULL
    assert not proves(claim(sql, MARIADB, null_params=[False, True]), KEYS)  # id may be bound to 0
    assert not proves(claim(sql, MARIADB, null_params=[True, False]), KEYS, zero_is_value=True)


@pytest.mark.parametrize(
    "sql",
    [
        "REPLACE INTO t (id, v) VALUES (0, 'x')",
        "REPLACE INTO t VALUES ('0', 'a', 'x@y')",
        "INSERT INTO t (id, v) VALUES (0, 'a'), (2, 'b') ON DUPLICATE KEY UPDATE v = VALUES(v)",
    ],
)
def test_zero_is_an_id_with_no_auto_value_on_zero(sql):
    """DM sets sql_mode NO_AUTO_VALUE_ON_ZERO on its connections: there a 0 is the row's id."""
    assert not proves(claim(sql, MARIADB), KEYS)
    assert proves(claim(sql, MARIADB), KEYS, zero_is_value=True)


@pytest.mark.parametrize(
    "literal, zero",
    [("0", True), ("'0'", True), ("0.4", True), ("-0.2", True), ("FALSE", True), ("1", False), ("'12'", False),
     ("1e3", False), ("TRUE", False), ("0.5", None), ("-1", None), ("''", None), ("x'00'", None), ("'1abc'", None),
     ("?", None)],
)  # fmt: skip
def test_stored_as_zero(literal, zero):
    assert stored_as_zero(literal) is zero


def test_zero_id_replace_with_another_unique_key():
    """A 0 id generates one: the row is pinned by the other unique key, but a REPLACE deletes it
    and inserts it with a new id each time."""
    keys = attrs.evolve(KEYS, unique_keys=(frozenset({"id"}), frozenset({"email"})), key_columns=frozenset({"id", "email"}))
    assert proves(claim("REPLACE INTO t VALUES (5, 'a', 'x@y')", MARIADB), keys)
    assert not proves(claim("REPLACE INTO t VALUES (0, 'a', 'x@y')", MARIADB), keys)


@pytest.mark.parametrize(
    "sql, proven",
    [
        # An upsert updates the first row it conflicts with by either index: not "the row with
        # key K" any more (tests/recovery/test_matrix.py, safe-odku-two-unique-keys).
        ("INSERT INTO t (id, v) VALUES (1, 'a') ON DUPLICATE KEY UPDATE v = VALUES(v)", False),
        ("INSERT INTO t VALUES (1, 'a', 'e') ON DUPLICATE KEY UPDATE id = VALUES(id), v = VALUES(v), email = VALUES(email)", False),
        # A REPLACE deletes every row it conflicts with; DELETE and UPDATE select by one key.
        ("REPLACE INTO t VALUES (1, 'a', 'e'), (2, 'b', 'e')", True),
        ("DELETE FROM t WHERE id = 1", True),
        ("UPDATE t SET v = 'b' WHERE id = 1", True),
        ("UPDATE t SET email = 'b' WHERE id = 1", False),  # changes a unique column
    ],
)
def test_two_unique_indexes(sql, proven):
    c = claim(sql, MARIADB)
    assert (c is not None and proves(c, TWO_KEYS)) == proven


@pytest.mark.parametrize(
    "sqls, why",
    [
        (["DELETE FROM t WHERE id = 1 AND v = 'x'", "UPDATE t SET v = 'x' WHERE id = 1"], "depends on v"),
        (
            [
                "UPDATE t SET email = 'e' WHERE id = 1 AND v = 'x'",
                "INSERT INTO t VALUES (1, 'x', 'e') ON DUPLICATE KEY UPDATE v = VALUES(v)",
            ],
            "depends on v",
        ),
        # An upsert inserts v but does not update it: found the second time, the row keeps the
        # UPDATE's v; inserted the first time, it had the upsert's.
        (
            [
                "UPDATE t SET v = 'x' WHERE id = 1",
                "INSERT INTO t (id, v, email) VALUES (1, 'y', 'e') ON DUPLICATE KEY UPDATE email = VALUES(email)",
            ],
            "depends on v",
        ),
        (
            ["INSERT INTO t (id, v) VALUES (1, 'y') ON DUPLICATE KEY UPDATE v = VALUES(v)", "DELETE FROM t WHERE id = 1 AND v = 'y'"],
            "depends on v",
        ),
        (["UPDATE t SET v = 'x' WHERE id = 1", "INSERT INTO t (id, v) VALUES (1, 'y') ON DUPLICATE KEY UPDATE v = VALUES(v)"], None),
        (["DELETE FROM t WHERE id = 1 AND v = 'x'", "REPLACE INTO t VALUES (1, 'x', 'e')"], None),  # made anew each time
        (["DELETE FROM t WHERE id = 1", "UPDATE t SET v = 'x' WHERE id = 1"], None),
        (["DELETE FROM u WHERE id = 1 AND v = 'x'", "UPDATE t SET v = 'x' WHERE id = 1"], None),  # another table
    ],
)
def test_a_sequence_that_selects_by_what_it_changes(sqls, why):
    claims = [claim(sql, MARIADB) for sql in sqls]
    assert all(c is not None and proves(c, KEYS) for c in claims)
    found = proves_together([(c.table[1], c, KEYS) for c in claims])
    assert (found is None) if why is None else (why in found)


def test_triggers_and_foreign_keys_forbid_the_proof():
    c = claim("REPLACE INTO t (id, v) VALUES (1, 'a')", MARIADB)
    assert not proves(c, attrs.evolve(KEYS, has_triggers=True))
    assert not proves(c, attrs.evolve(KEYS, referenced=True))
    assert proves(c, attrs.evolve(KEYS, referenced=True), foreign_key_checks=False)


@pytest.mark.parametrize(
    "sql, runs_code",
    [
        ("CREATE TABLE IF NOT EXISTS t (id INT PRIMARY KEY)", False),
        ("CREATE INDEX i ON t (a)", False),
        ("INSERT INTO db.t (a, b) VALUES (1, 2)", False),
        ("WITH c (a) AS (SELECT 1) SELECT * FROM c", False),
        ("SELECT * FROM a JOIN b ON (a.x = b.x)", False),
        ("SELECT f(1)", True),
        ("SELECT db.f(1)", True),
        ("SELECT `f`(1)", True),
        ("INSERT INTO t VALUES (f(1))", True),
        ("CREATE TABLE t2 SELECT f(1)", True),
        ("SELECT SLEEP(1), GET_LOCK('x', 1)", False),  # built-ins with effects, but no user code
    ],
)
def test_stored_code_is_told_from_table_names(sql, runs_code):
    assert classify(sql).runs_code is runs_code


# ---------------------------------------------------------------------------- the fast path

from proxy.sqltext.triage import fast_verb  # noqa: E402


@pytest.mark.parametrize(
    "sql, verb",
    [
        ("SELECT c FROM sbtest1 WHERE id=5012", b"SELECT"),
        ("select `c` from `db`.`t` where `id` = 'a;b'", None),  # a ";" anywhere: analyzed
        ("SELECT * FROM t WHERE a = 'x' UNION SELECT * FROM u", b"SELECT"),
        ("SELECT f(1)", None),
        ("SELECT * FROM t WHERE a = '('", None),
        ("SELECT @x", None),
        ("SELECT @@max_allowed_packet", None),
        ("SELECT a INTO @x FROM t", None),
        ("SELECT * FROM t FOR UPDATE", None),
        ("SELECT * FROM t LOCK IN SHARE MODE", None),
        ("SELECT NEXT VALUE FOR s", None),
        ("SELECT s.nextval", None),
        ("SELECT 1 /*!99999 , 2 */", None),
        ("SELECT 1 -- x", None),
        ("SELECT 1 # x", None),
        ("SELECT 1; DELETE FROM t", None),
        ("SELECTED", None),
        (" SELECT 1", None),
        ("INSERT INTO t VALUES (1)", b"INSERT"),
        ("INSERT INTO t VALUES (1); COMMIT", None),
        ("insert\tinto t values (1)", b"INSERT"),
        ("Replace\x0binto t values (1)", b"REPLACE"),
        ("UPDATE\x0ct SET a = 1", b"UPDATE"),
        ("DELETE", None),  # no whitespace after the verb
        ("REPLACES INTO t", None),
        ("INSERTS INTO t", None),
        ("UPDATE_ t", None),
        ("DELETE\x00FROM t", None),
        ("İNSERT INTO t VALUES (1)", None),
    ],
)
def test_fast_verb(sql, verb):
    assert fast_verb(b"\x03" + sql.encode(), multi=True) == verb


_VERB_AS_A_REGEX = re.compile(rb"([A-Za-z]{6,7})[ \t\n\r\f\v]")  # fast_verb's verb, as it was first written


@settings(max_examples=3000, deadline=None)
@given(st.text(alphabet="SELECTinsertUPDAERPL_ \t\n\r\x0b\x0c\x00;(1İ", max_size=12), st.booleans())
def test_the_fast_verb_is_the_one_the_regex_reads(text, multi):
    """fast_verb reads the verb byte by byte; the regex says what it must read."""
    payload = b"\x03" + text.encode()
    m = _VERB_AS_A_REGEX.match(payload, 1)
    verb = fast_verb(payload, multi)
    if m is None or m.group(1).upper() not in (b"INSERT", b"REPLACE", b"UPDATE", b"DELETE"):
        assert verb is None or verb == b"SELECT" and m is not None and m.group(1).upper() == b"SELECT", payload
    else:
        assert verb == (None if multi and b";" in payload else m.group(1).upper()), payload


_select_words = st.sampled_from(
    ["SELECT", "a", "t", "FROM", "WHERE", "=", "1", "'s'", "(", ")", "@v", ";", "INTO", "FOR", "UPDATE", "LOCK", "IN",
     "SHARE", "MODE", "NEXT", "VALUE", "s.nextval", "/*!", "*/", "--", "#", ",", "f", "GET_LOCK", "UNION", "`q`", "\\'"]
)  # fmt: skip


@settings(max_examples=3000, deadline=None)
@given(st.lists(_select_words, min_size=1, max_size=12).map(lambda words: "SELECT " + " ".join(words)), st.booleans())
def test_the_fast_path_never_disagrees_with_the_classifier(sql, nbe):
    """Whenever the fast path calls a text a plain SELECT, the whole-text classifier finds one
    read-only SELECT that changes no session state (or text it cannot lex, which the server
    rejects before running anything)."""
    if fast_verb(b"\x03" + sql.encode(), multi=True) != b"SELECT":
        return
    analysis = sqltext.analyze(sql, dialect=sqltext.MARIADB, no_backslash_escapes=nbe)
    if analysis.unknown is not None and "not understood" in analysis.unknown:
        return
    assert analysis.single and analysis.first.kind is sqltext.Kind.SELECT, sql
    assert analysis.first.read_only and analysis.first.session_unrestorable is None and not analysis.first.runs_code, sql


@pytest.mark.parametrize(
    "sql, reads",
    [
        ("SELECT FOUND_ROWS()", True),
        ("select found_rows ( )", True),
        ("SELECT ROW_COUNT()", True),
        ("SHOW WARNINGS", True),
        ("SHOW COUNT(*) ERRORS", True),
        ("SELECT @@session.warning_count", True),
        ("SELECT @@`error_count`", True),
        ("GET DIAGNOSTICS @n = NUMBER", True),
        ("SELECT PREVIOUS VALUE FOR s", True),
        ("SELECT LASTVAL(s)", True),
        ("/*!100000 SELECT FOUND_ROWS() */", True),
        ("SELECT 'open", True),
        ("SELECT 1; SELECT FOUND_ROWS()", False),  # the first statement makes the results the second reads
        ("SELECT found_rows FROM t", False),
        ("SELECT 'FOUND_ROWS()'", False),
        ("/* FOUND_ROWS() */ SELECT 1", False),
        ("SELECT 1 /*!999999 + FOUND_ROWS() */", False),
        ("INSERT INTO t VALUES (1)", False),
        ("SELECT @@gtid_slave_pos", False),
    ],
)
def test_reads_last_results(sql, reads):
    assert reads_last_results(sql, MARIADB, False) is reads


def test_tidb_skips_empty_and_comment_only_pieces():
    # Measured on TiDB v8.5.3: "SELECT 1; /* c */" gives one result, "SELECT 1;; SELECT 2" two.
    tidb = sqltext.Dialect("tidb", 80011)
    assert sqltext.split_statements("SELECT 1; /* c */", dialect=tidb) == [(0, 8)]
    assert len(sqltext.split_statements("SELECT 1;; /* c */ ; SELECT 2", dialect=tidb)) == 2
    assert len(sqltext.split_statements("SELECT 1; /* c */", dialect=MARIADB)) == 2
    with pytest.raises(sqltext.SqlUnknown):
        sqltext.split_statements("SELECT 1;; SELECT 2", dialect=MARIADB)
