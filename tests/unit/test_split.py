"""proxy.protocol.split: splitting oversized multi-row INSERT/REPLACE statements."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from proxy.sqltext import tokenize
from proxy.sqltext.split import MAX_NESTING, CannotSplit, split_values_statement

# --- Statement generation ---------------------------------------------------------------------

# Text inside string literals: everything that could confuse a naive splitter.
FRAGMENTS = ["'", '"', "\\", "''", "),(", ")", "(", ",", ";", "--", "-- ", "/*", "*/", "#", "\n", "\x00", "`",
             ") ON DUPLICATE KEY UPDATE a=1", ") AS x", "VALUES", "é", "\u2603"]  # fmt: skip
string_text = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=5)), max_size=8).map("".join)


def quote(data: bytes, quote_char: bytes, nbe: bool, doubled: bool) -> bytes:
    """A string literal for ``data`` the way a client escapes it."""
    if nbe:  # only the quote can be escaped, by doubling it; backslashes are ordinary
        return quote_char + data.replace(quote_char, quote_char * 2) + quote_char
    data = data.replace(b"\\", b"\\\\")
    escaped = quote_char * 2 if doubled else b"\\" + quote_char
    return quote_char + data.replace(quote_char, escaped) + quote_char


def values(nbe: bool) -> st.SearchStrategy[bytes]:
    """One value of a row, as a client (or mysqldump) would write it."""
    quoted = st.tuples(string_text, st.booleans())
    return st.one_of(
        st.integers(-(2**63), 2**64).map(lambda i: b"%d" % i),
        st.floats(allow_nan=False, allow_infinity=False).map(lambda f: repr(f).encode()),
        st.sampled_from([b"NULL", b"TRUE", b"false", b"DEFAULT", b"?", b"-5", b"- 5", b"(7--1)", b"1e+100"]),
        quoted.map(lambda q: quote(q[0].encode(), b"'", nbe, q[1])),
        quoted.map(lambda q: quote(q[0].encode(), b'"', nbe, q[1])),
        quoted.map(lambda q: b"N" + quote(q[0].encode(), b"'", nbe, q[1])),
        # arbitrary bytes, invalid UTF-8 included
        st.tuples(st.binary(max_size=30), st.booleans()).map(lambda q: b"_binary" + quote(q[0], b"'", nbe, q[1])),
        st.binary(max_size=8).map(lambda d: b"X'" + d.hex().encode() + b"'"),
        st.binary(min_size=1, max_size=8).map(lambda d: b"0x" + d.hex().encode()),
        st.text("01", min_size=1, max_size=16).map(lambda bits: b"b'" + bits.encode() + b"'"),
        st.text("01", min_size=1, max_size=16).map(lambda bits: b"0b" + bits.encode()),
        # expressions with parentheses, some of them inside strings
        st.sampled_from([b"CONCAT('a', ')')", b"((1+2)*(3-(4)))", b"COALESCE(NULL, (SELECT 1))"]),
        string_text.map(lambda t: b"CONCAT(" + quote(t.encode(), b"'", nbe, True) + b", ')(')"),
        # comments inside a row are legal
        st.sampled_from([b"/* ) */ 1", b"1 -- ),(\n", b"2 # '\n", b"/*+ hint */ 3", b"`col``)`"]),
    )


VALUES = {nbe: values(nbe) for nbe in (False, True)}
ROWS = {nbe: st.lists(VALUES[nbe], min_size=1, max_size=6).map(lambda vs: b"(" + b", ".join(vs) + b")") for nbe in (False, True)}


SEPARATORS = [b",", b", ", b",\n", b" , ", b",/* ( */", b"\t,\r\n", b", -- x\n", b", # y\n"]
HEADS = [
    b"INSERT INTO t VALUES ",
    b"INSERT IGNORE INTO `db`.`t` (`a`,`b`) VALUES",
    b"/* leading */ -- c\n REPLACE INTO t (a) VALUE ",
    b"insert into t values\n",
    b"INSERT /*+ SET_VAR(x=1) */ INTO t PARTITION (p0) (a, b) VALUES  ",
]
SUFFIXES = [
    b"",
    b";",
    b" ;  \n",
    b" ON DUPLICATE KEY UPDATE b=VALUES(b), c = CONCAT(c, ')')",
    b" AS new ON DUPLICATE KEY UPDATE b = new.b;",
    b" AS new(x, y)",
    b"\n-- trailing comment",
]


@st.composite
def statements(draw, nbe: bool):
    """(statement, head, suffix, [(row_start, row_end), ...])"""
    head = draw(st.sampled_from(HEADS))
    suffix = draw(st.sampled_from(SUFFIXES))
    rows = draw(st.lists(ROWS[nbe], min_size=1, max_size=20))
    parts, spans, pos = [head], [], len(head)
    for i, row in enumerate(rows):
        if i:
            sep = draw(st.sampled_from(SEPARATORS))
            parts.append(sep)
            pos += len(sep)
        parts.append(row)
        spans.append((pos, pos + len(row)))
        pos += len(row)
    parts.append(suffix)
    return b"".join(parts), head, suffix, spans


def check_pieces(sql: bytes, head: bytes, suffix: bytes, spans, pieces: list[bytes], limit: int, nbe: bool) -> None:
    """Every piece fits, has the head and suffix, lexes cleanly, and the rows of all pieces are
    exactly the original rows in order, packed greedily."""
    if len(sql) + 1 <= limit:
        assert pieces == [sql]
        return
    kept_suffix = suffix.rstrip(b" \t\n\r;")
    first = 0
    for piece in pieces:
        assert len(piece) + 1 <= limit
        assert piece.startswith(head) and piece.endswith(kept_suffix)
        tokenize(piece.decode("latin-1"), no_backslash_escapes=nbe)  # raises on broken literals
        middle = piece[len(head) : len(piece) - len(kept_suffix)]
        start = spans[first][0]
        last = next(i for i in range(first, len(spans)) if spans[i][1] - start == len(middle))
        assert middle == sql[start : spans[last][1]]
        if last + 1 < len(spans):  # greedy: the next row (with its separator) would not have fit
            assert len(piece) + spans[last + 1][1] - spans[last][1] + 1 > limit
        first = last + 1
    assert first == len(spans)


# --- Properties -------------------------------------------------------------------------------


def smallest_limit(head: bytes, suffix: bytes, spans: list[tuple[int, int]]) -> int:
    """The smallest limit under which the largest row still fits in a piece of its own."""
    largest_row = max(end - start for start, end in spans)
    return len(head) + largest_row + len(suffix.rstrip(b" \t\n\r;")) + 1


@settings(max_examples=200, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize("nbe", [False, True])
def test_split_preserves_rows(nbe, data):
    sql, head, suffix, spans = data.draw(statements(nbe))
    limit = data.draw(st.integers(smallest_limit(head, suffix, spans), len(sql) + 20))
    pieces = split_values_statement(sql, limit, no_backslash_escapes=nbe)
    check_pieces(sql, head, suffix, spans, pieces, limit, nbe)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize("nbe", [False, True])
def test_row_larger_than_limit_cannot_split(nbe, data):
    sql, head, suffix, spans = data.draw(statements(nbe))
    limit = smallest_limit(head, suffix, spans) - 1  # one byte short for the largest row
    assume(len(sql) + 1 > limit)
    with pytest.raises(CannotSplit, match="single row is larger than the limit"):
        split_values_statement(sql, limit, no_backslash_escapes=nbe)


@settings(max_examples=200, deadline=5000)
@given(st.binary(max_size=300), st.integers(1, 400), st.booleans())
@example(b"INSERT INTO t VALUES (1),(", 10, False)
def test_split_never_crashes_on_garbage(tail, limit, nbe):
    sql = b"INSERT INTO t VALUES " + tail
    try:
        pieces = split_values_statement(sql, limit, no_backslash_escapes=nbe)
    except CannotSplit:
        return
    for piece in pieces:
        assert len(piece) + 1 <= limit or pieces == [sql]
        tokenize(piece.decode("latin-1"), no_backslash_escapes=nbe)


# --- Explicit cases ---------------------------------------------------------------------------


def test_greedy_packing_and_exact_bytes():
    sql = b"INSERT INTO t (a, b) VALUES (1,'x'),(2,'y'), (3,'z'),(4,'w')"
    head = b"INSERT INTO t (a, b) VALUES "
    pieces = split_values_statement(sql, len(head) + len(b"(1,'x'),(2,'y')") + 1)
    assert pieces == [head + b"(1,'x'),(2,'y')", head + b"(3,'z'),(4,'w')"]
    assert split_values_statement(sql, len(head) + 8) == [head + b"(1,'x')", head + b"(2,'y')", head + b"(3,'z')", head + b"(4,'w')"]


def test_statement_that_fits_is_returned_unchanged():
    sql = b"REPLACE INTO t VALUES (1);  "
    assert split_values_statement(sql, len(sql) + 1) == [sql]
    assert split_values_statement(sql, len(sql)) == [b"REPLACE INTO t VALUES (1)"]


def test_suffix_is_repeated_and_semicolon_dropped():
    sql = b"INSERT INTO t (a) VALUES (1),(2) ON DUPLICATE KEY UPDATE a=VALUES(a) ; \n"
    expected = [
        b"INSERT INTO t (a) VALUES (1) ON DUPLICATE KEY UPDATE a=VALUES(a)",
        b"INSERT INTO t (a) VALUES (2) ON DUPLICATE KEY UPDATE a=VALUES(a)",
    ]
    assert split_values_statement(sql, len(expected[0]) + 1) == expected
    sql = b"INSERT INTO t (a) VALUES (1),(2) AS new(x) ON DUPLICATE KEY UPDATE a = x"
    expected = [
        b"INSERT INTO t (a) VALUES (1) AS new(x) ON DUPLICATE KEY UPDATE a = x",
        b"INSERT INTO t (a) VALUES (2) AS new(x) ON DUPLICATE KEY UPDATE a = x",
    ]
    assert split_values_statement(sql, len(expected[0]) + 1) == expected


@pytest.mark.parametrize(
    "rows, suffix",
    [
        (b"(1),('x) AS y'),(2)", b" ON DUPLICATE KEY UPDATE a=2"),  # string looks like "AS alias"
        (b"(1),('x) ON DUPLICATE KEY UPDATE a=1 '),(2)", b""),  # string looks like the suffix
        (b"(1),('x)'),(2)", b" ON DUPLICATE KEY UPDATE a=CONCAT(a, ')')"),  # suffix ends with ")"
        (b"(1),('x) AS y'),(2)", b" AS new ON DUPLICATE KEY UPDATE a=new.a;"),
    ],
)
def test_rows_that_look_like_the_suffix(rows, suffix):
    # Strings near the end that look like the start of the suffix must not confuse the split.
    sql = b"INSERT INTO t VALUES " + rows + suffix
    kept = suffix.rstrip(b";")
    expected = [b"INSERT INTO t VALUES " + row + kept for row in rows.split(b",")]
    assert split_values_statement(sql, max(map(len, expected)) + 1) == expected


def test_binary_bytes_survive():
    row = b"(1,_binary'\xff\xfe\x00\\'\x80\\\\')"
    sql = b"INSERT INTO t VALUES " + row + b"," + row
    pieces = split_values_statement(sql, len(sql) - 5)
    assert pieces == [b"INSERT INTO t VALUES " + row] * 2


def test_no_backslash_escapes():
    sql = b"INSERT INTO t VALUES ('a\\'),('b')"  # with NO_BACKSLASH_ESCAPES: two rows
    assert split_values_statement(sql, 30, no_backslash_escapes=True) == [b"INSERT INTO t VALUES ('a\\')", b"INSERT INTO t VALUES ('b')"]
    with pytest.raises(CannotSplit, match="unterminated string"):
        split_values_statement(sql, 30)  # with backslash escapes the first string never ends
    sql = rb"INSERT INTO t VALUES ('a''),(''b'),('\\')"  # doubled quotes work in both modes
    for nbe in (False, True):
        assert split_values_statement(sql, 36, no_backslash_escapes=nbe) == [
            rb"INSERT INTO t VALUES ('a''),(''b')",
            rb"INSERT INTO t VALUES ('\\')",
        ]


def test_comments_between_rows_are_kept():
    sql = b"INSERT INTO t VALUES (1) /* one */, -- two\n (2)"
    assert split_values_statement(sql, 30) == [b"INSERT INTO t VALUES (1)", b"INSERT INTO t VALUES (2)"]
    assert split_values_statement(sql, 50) == [b"INSERT INTO t VALUES (1) /* one */, -- two\n (2)"]


def test_single_row_larger_than_limit():
    sql = b"INSERT INTO t VALUES (1),('" + b"x" * 100 + b"'),(3)"
    with pytest.raises(CannotSplit, match="single row is larger than the limit"):
        split_values_statement(sql, 60)


def test_deep_nesting():
    deep = b"(" * MAX_NESTING + b"1" + b")" * MAX_NESTING
    sql = b"INSERT INTO t VALUES " + deep + b"," + deep
    assert split_values_statement(sql, len(sql) - 1) == [b"INSERT INTO t VALUES " + deep] * 2
    too_deep = b"(" + deep + b")"
    with pytest.raises(CannotSplit, match="deeper than"):
        split_values_statement(b"INSERT INTO t VALUES " + too_deep, 20)


@pytest.mark.parametrize(
    "sql, reason",
    [
        (b"INSERT INTO t SELECT * FROM s", "SELECT"),
        (b"INSERT INTO t (a) SELECT 1", "SELECT"),
        (b"INSERT INTO t SET a = 1", "SET"),
        (b"INSERT INTO t VALUES ROW(1), ROW(2)", "ROW"),
        (b"UPDATE t SET a = 1", "not an INSERT"),
        (b"SELECT 1", "not an INSERT"),
        (b"INSERT INTO t VALUES (1); INSERT INTO t VALUES (2)", "more than one statement"),
        (b"INSERT INTO t VALUES (1),(2", "never closed"),
        (b"INSERT INTO t VALUES (1),(2))", "unexpected"),
        (b"INSERT INTO t VALUES (1),('2)", "unterminated string"),
        (b"INSERT INTO t VALUES (1),(2 /* x)", "unterminated comment"),
        (b"INSERT INTO t VALUES (1),(`2)", "unterminated quoted identifier"),
        (b"INSERT INTO t VALUES (1), 2", "expected '('"),
        (b"INSERT INTO t VALUES (1),", "expected a row"),
        (b"INSERT INTO t VALUES (1), (/*!50000 2 */)", "executable comment"),
        (b"INSERT INTO t VALUES (1) /*! , (2) */", "executable comment"),
        (b"/*!40000 INSERT INTO t VALUES (1), (2) */", "executable comment"),
        (b"INSERT INTO t VALUES (1) RETURNING id", "RETURNING"),
        (b"INSERT INTO t VALUES (1) ON DUPLICATE KEY UPDATE a = 1 RETURNING id", "RETURNING"),
        (b"INSERT INTO t VALUES (1) garbage", "unexpected"),
        (b"INSERT INTO t VALUES", "expected '('"),
        (b"INSERT 'x", "unterminated string"),
    ],
)
def test_cannot_split(sql, reason):
    with pytest.raises(CannotSplit, match=re.escape(reason)):
        split_values_statement(sql, 12)


def test_limit_counts_the_command_byte():
    sql = b"INSERT INTO t VALUES (1),(2)"
    one_row = len(b"INSERT INTO t VALUES (1)")
    assert split_values_statement(sql, one_row + 1) == [b"INSERT INTO t VALUES (1)", b"INSERT INTO t VALUES (2)"]
    with pytest.raises(CannotSplit):
        split_values_statement(sql, one_row)


def test_split_is_linear_on_a_large_statement():
    rows = [b"(%d,'row %d it''s \\'q\\' (x)',_binary'\\0\xff',NULL,%d.5)" % (i, i, -i) for i in range(100_000)]
    sql = b"INSERT INTO `db`.`t` VALUES " + b",".join(rows) + b" ON DUPLICATE KEY UPDATE `b`=VALUES(`b`)"
    started = time.perf_counter()
    pieces = split_values_statement(sql, 64 * 1024)
    assert time.perf_counter() - started < 10  # seconds; measured ~80 MB/s
    assert b"".join(p[len(b"INSERT INTO `db`.`t` VALUES ") : -len(b" ON DUPLICATE KEY UPDATE `b`=VALUES(`b`)")] + b"," for p in pieces)[
        :-1
    ] == b",".join(rows)
