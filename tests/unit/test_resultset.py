"""Text result sets the proxy reads and writes itself; row counting of split pieces."""

from __future__ import annotations

import pytest

from proxy.protocol.resultset import build_text_result, read_text_result
from proxy.sqltext.split import count_rows, split_values_statement
from tests.unit.golden_mariadb import RESPONSES


@pytest.mark.parametrize("deprecate_eof", [False, True])
def test_read_golden_result_and_build_it_back(deprecate_eof):
    frames = RESPONSES[(b"\x03SELECT NULL AS n, 'a' AS s", deprecate_eof)]
    coldefs, rows = read_text_result(frames, deprecate_eof)
    assert len(coldefs) == 2 and rows == [[None, b"a"]]
    assert build_text_result(coldefs, rows, 0x0002, deprecate_eof) == frames


def test_count_rows_of_split_pieces():
    rows = [b"(%d, 'x''),(;', -- a comment\n NULL)" % i for i in range(50)]
    statement = b"INSERT INTO t VALUES " + b", ".join(rows)
    pieces = split_values_statement(statement, 300)
    assert len(pieces) > 3
    assert sum(count_rows(p) for p in pieces) == 50
    assert count_rows(b"INSERT INTO t (a) VALUES (1) ON DUPLICATE KEY UPDATE a = VALUES(a)") == 1
