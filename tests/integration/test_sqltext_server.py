"""The proxy reads SQL text the way the real server does: statement splitting of
multi-statement texts and executable comments, checked against a live MariaDB.

Golden cases were measured on MariaDB 10.11.19 (``/*!NNNNN`` 5 and 6 digits, ``/*M!``, the
50700-99999 MySQL range MariaDB skips, ``--`` followed by any control character) and on TiDB
v8.5.3 (``/*T![feature]``, 5 version digits, ``/*M!`` a comment); the property test sends
generated texts to the server and compares what ran with what ``proxy.sqltext`` says runs.
Every test runs on both servers (``db``).
"""

from __future__ import annotations

import pymysql
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymysql.constants import CLIENT

from proxy import sqltext
from proxy.sqltext import Dialect

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(db):
    conn = pymysql.connect(host="127.0.0.1", port=db.port, user="root", password="", client_flag=CLIENT.MULTI_STATEMENTS)
    cur = conn.cursor()
    cur.execute("SELECT VERSION()")
    dialect = Dialect.from_server_version(cur.fetchone()[0])
    yield conn, dialect
    conn.close()


def run(conn, sql: str) -> list | None:
    """The value of each result set, or None when the server refused the text."""
    cur = conn.cursor()
    try:
        cur.execute(sql)
        out = [cur.fetchall()]
        while cur.nextset():
            out.append(cur.fetchall())
    except pymysql.MySQLError:
        conn.ping(reconnect=True)
        return None
    return [[tuple(row) for row in rows] for rows in out]


GOLDEN = [
    "SELECT 1 /*!99999 +1 */", "SELECT 1 /*!999999 +1 */", "SELECT 1 /*!100000 +1 */", "SELECT 1 /*!50700 +1 */",
    "SELECT 1 /*!50699 +1 */", "SELECT 1 /*!099999 +1 */", "SELECT 1 /*!050000 +1 */", "SELECT 1 /*M!999999 +1 */",
    "SELECT 1 /*M!99999 +1 */", "SELECT 1 /*M! +1 */", "SELECT 1 /*!+1 */", "SELECT 1 /*T![x] +1 */",
    "SELECT 1 /*+ +1 */", "SELECT 1 --\x0c x\n +1", "SELECT 1 --\x01x\n +1", "SELECT 1 # x\n +1",
    "SELECT 1 /*!40000 /* x */ +1 */", "SELECT 1 /*!5000012 +1 */", "SELECT 1; SELECT 2 /*!99999 ; SELECT 3 */",
    "SELECT 1; /*!100000 SELECT 2 */; SELECT 3", "/*!999999 SELECT 5; */ SELECT 6",
    # TiDB's own: features it knows run, others do not; no list at all runs.
    "SELECT 1 /*T![clustered_index] +1 */", "SELECT 1 /*T![auto_rand,ttl] +1 */", "SELECT 1 /*T![resource_group] +1 */",
    "SELECT 1 /*T![nope] +1 */", "SELECT 1 /*T! +1 */", "SELECT 1 /*T!*/ +1", "SELECT 1 /*!12345 +1 */",
    "SELECT 1 +/*!12 */", "SELECT 1 --\x0bx\n +1",
]  # fmt: skip
# Where a server does not run a golden text (measured: MariaDB 10.11.19, TiDB v8.5.3): "refused"
# (a syntax error there: TiDB reads 5 version digits, so /*!999999 leaves "9" as code, and "--"
# before a control character is no comment), or "unknown" (the proxy will not judge it: a ';'
# inside an executable comment). Either way nothing is acted on.
NOT_RUN = {
    "tidb": {
        "SELECT 1 /*!999999 +1 */": "refused", "SELECT 1 /*!100000 +1 */": "refused",
        "SELECT 1 /*!099999 +1 */": "refused", "SELECT 1 /*!050000 +1 */": "refused",
        "SELECT 1 --\x01x\n +1": "refused", "SELECT 1 /*!5000012 +1 */": "refused",
        "SELECT 1; /*!100000 SELECT 2 */; SELECT 3": "refused", "/*!999999 SELECT 5; */ SELECT 6": "refused",
        "SELECT 1; SELECT 2 /*!99999 ; SELECT 3 */": "unknown",
    },
}  # fmt: skip


@pytest.mark.parametrize("sql", GOLDEN)
def test_golden_comments_run_as_on_the_server(server, sql):
    conn, dialect = server
    ran = run(conn, sql)
    expected = NOT_RUN.get(dialect.flavor, {}).get(sql, "runs")
    if expected == "refused":
        assert ran is None, f"{dialect.flavor} now runs {sql!r}"
        return
    assert ran is not None, sql
    if expected == "unknown":
        with pytest.raises(sqltext.SqlUnknown):
            sqltext.split_statements(sql, dialect=dialect)
        return
    assert len(sqltext.split_statements(sql, dialect=dialect)) == len(ran)
    # Each statement, judged and sent alone, gives what it gave inside the text.
    spans = sqltext.split_statements(sql, dialect=dialect)
    assert [alone(conn, sql[a:b], dialect) for a, b in spans] == ran


# Statements whose value tells which one ran; fragments that fool naive splitters.
TRIVIA = [" ", "\n", "\t", "\x0c", "/* ; */", "# ;\n", "-- ;\n", "--\x0c;\n", "/*M!100000 */", "/*+ ; */",
          "/*T![nope] ; */", "/*T![ttl] */"]  # fmt: skip
# Each server's own executable comments that run or not (TiDB reads 5 version digits only).
OWN_TRIVIA = {"mariadb": ["/*!100000 */", "/*!999999 ; SELECT 0 */"], "tidb": ["/*!99999 */", "/*!12345 */"]}
LITERALS = ["';'", "'\\';'", "'a''b;'", '";"', "_utf8mb4';'", "x'3b'"]


@st.composite
def multi_statement(draw, flavor: str):
    trivia = TRIVIA + OWN_TRIVIA[flavor]
    parts = []
    for n in range(draw(st.integers(1, 4))):
        lead = "".join(draw(st.lists(st.sampled_from(trivia), max_size=2)))
        body = f"SELECT {n + 1}" + "".join(f", {lit}" for lit in draw(st.lists(st.sampled_from(LITERALS), max_size=2)))
        tail = "".join(draw(st.lists(st.sampled_from(trivia), max_size=2)))
        parts.append(lead + body + tail)
    return ";".join(parts) + draw(st.sampled_from(["", ";", "; ", ";\n-- end"]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_split_matches_the_server(server, data):
    conn, dialect = server
    sql = data.draw(multi_statement(dialect.flavor))
    ran = run(conn, sql)
    try:
        spans = sqltext.split_statements(sql, dialect=dialect)
    except sqltext.SqlParseError:
        return  # "unknown": never acted on (a ';' inside an executable comment, ...)
    assert ran is not None, sql
    assert ran == [alone(conn, sql[a:b], dialect) for a, b in spans], sql


def alone(conn, statement: str, dialect: Dialect) -> list:
    """What one statement gives when sent by itself (a comment-only one: the empty OK it gets
    inside a multi-statement text)."""
    if sqltext.classify(statement, dialect=dialect).kind is sqltext.Kind.EMPTY:
        return []
    return run(conn, statement)[0]


# --- DDL: a stored function is a call only where the server evaluates it --------------------
#
# ``probe_f`` counts its calls in @probe_calls. Generated CREATE TABLE texts put its name in
# places that are names (an index called probe_f, a key part probe_f(4), a column probe_f, a
# table REFERENCES probe_f (...)) and, sometimes, a call in a place the server evaluates. What
# the server really ran must be judged a call; names alone must not be (precision).

PROBE = "probe_f"
NAME_PLACES = [
    f"KEY {PROBE} (a)", f"UNIQUE KEY {PROBE} (a, b)", f"KEY k ({PROBE}(4))", f"INDEX {PROBE} USING BTREE (b)",
    f"CONSTRAINT {PROBE} CHECK (a >= 0)", f"{PROBE} VARCHAR(8) DEFAULT 'x'", "c DECIMAL(6,2) DEFAULT 1.5",
    "d ENUM('p','q') NOT NULL DEFAULT 'p'", "e TIMESTAMP(6) NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6)",
    "g DOUBLE PRECISION(8,2)", "h INT AS (a + 1) VIRTUAL",
]  # fmt: skip
CALL_PLACES = [
    f"i INT DEFAULT ({PROBE}(1))", f"j INT AS ({PROBE}(a)) VIRTUAL", f"CHECK ({PROBE}(a) > 0)", f"KEY kf (({PROBE}(a)))",
]  # fmt: skip
TAILS = ["", f" SELECT {PROBE}(7) AS a", f" AS SELECT 1 AS a, {PROBE}(2) AS b", " SELECT 3 AS a",
         " PARTITION BY HASH (a) PARTITIONS 2", f" ((SELECT {PROBE}(5) AS a))"]  # fmt: skip


@st.composite
def create_table(draw):
    parts = ["a INT NOT NULL", "b VARCHAR(16) NOT NULL DEFAULT ''"]
    parts += draw(st.lists(st.sampled_from(NAME_PLACES), max_size=4, unique=True))
    calls = draw(st.lists(st.sampled_from(CALL_PLACES), max_size=1))
    tail = draw(st.sampled_from(TAILS))
    body = ", ".join(draw(st.permutations(parts + calls)))
    return f"CREATE TABLE ddl_probe ({body}){tail}", bool(calls) or PROBE in tail


@pytest.fixture(scope="module")
def probe(server):
    conn, dialect = server
    if dialect.flavor != "mariadb":
        pytest.skip("stored functions are MariaDB's (TiDB has none)")
    cur = conn.cursor()
    cur.execute("USE test")
    cur.execute(f"CREATE OR REPLACE FUNCTION {PROBE}(x INT) RETURNS INT NOT DETERMINISTIC "
                f"BEGIN SET @probe_calls = @probe_calls + 1; RETURN x; END")  # fmt: skip
    yield conn, dialect
    cur.execute(f"DROP FUNCTION IF EXISTS {PROBE}")


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=create_table())
def test_ddl_calls_are_judged_as_the_server_runs_them(probe, case):
    conn, dialect = probe
    sql, placed_a_call = case
    cur = conn.cursor()
    cur.execute("DROP TABLE IF EXISTS ddl_probe")
    cur.execute("SET @probe_calls = 0")
    try:
        cur.execute(sql)
    except pymysql.MySQLError:
        pass  # refused (MariaDB allows no stored function in DEFAULT, CHECK, ...): nothing ran
    cur.execute("SELECT @probe_calls")
    ran = cur.fetchone()[0] > 0
    judged = sqltext.classify(sql, dialect=dialect).runs_code
    assert not (ran and not judged), f"the server called {PROBE} but the proxy saw no call: {sql}"
    assert judged is placed_a_call, sql
