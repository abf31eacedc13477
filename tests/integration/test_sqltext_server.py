"""The proxy reads SQL text the way the real server does: statement splitting of
multi-statement texts and executable comments, checked against a live MariaDB.

Golden cases were measured on MariaDB 10.11.19 (``/*!NNNNN`` 5 and 6 digits, ``/*M!``, the
50700-99999 MySQL range MariaDB skips, ``--`` followed by any control character); the
property test sends generated texts to the server and compares what ran with what
``proxy.sqltext`` says runs.
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
def server(mariadb):
    conn = pymysql.connect(host="127.0.0.1", port=mariadb.port, user="root", password="", client_flag=CLIENT.MULTI_STATEMENTS)
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
]  # fmt: skip


@pytest.mark.parametrize("sql", GOLDEN)
def test_golden_comments_run_as_on_the_server(server, sql):
    conn, dialect = server
    ran = run(conn, sql)
    assert ran is not None, sql
    assert len(sqltext.split_statements(sql, dialect=dialect)) == len(ran)
    # Each statement, judged and sent alone, gives what it gave inside the text.
    spans = sqltext.split_statements(sql, dialect=dialect)
    assert [alone(conn, sql[a:b], dialect) for a, b in spans] == ran


# Statements whose value tells which one ran; fragments that fool naive splitters.
TRIVIA = [" ", "\n", "\t", "\x0c", "/* ; */", "/*!100000 */", "/*!999999 ; SELECT 0 */", "# ;\n", "-- ;\n",
          "--\x0c;\n", "/*M!100000 */", "/*+ ; */"]  # fmt: skip
LITERALS = ["';'", "'\\';'", "'a''b;'", '";"', "_utf8mb4';'", "x'3b'"]


@st.composite
def multi_statement(draw):
    parts = []
    for n in range(draw(st.integers(1, 4))):
        lead = "".join(draw(st.lists(st.sampled_from(TRIVIA), max_size=2)))
        body = f"SELECT {n + 1}" + "".join(f", {lit}" for lit in draw(st.lists(st.sampled_from(LITERALS), max_size=2)))
        tail = "".join(draw(st.lists(st.sampled_from(TRIVIA), max_size=2)))
        parts.append(lead + body + tail)
    return ";".join(parts) + draw(st.sampled_from(["", ";", "; ", ";\n-- end"]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sql=multi_statement())
def test_split_matches_the_server(server, sql):
    conn, dialect = server
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
