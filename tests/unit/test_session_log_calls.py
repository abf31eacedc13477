"""Every log line about a session goes through its ``SessionLog`` (``proxy.sessionlog``), so
that it carries the session's id, target, client, user and backend as fields: a call that
writes ``"session %d: ..."`` by hand on a plain logger would give JSON logs a line without
them. Read from the source, the way a reviewer would grep it."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

from proxy.session.info import SessionInfo
from proxy.sessionlog import SessionLog, outcome

REPO = Path(__file__).resolve().parents[2]
LEVELS = {"debug", "info", "warning", "error", "exception", "critical", "log"}


def _hand_made_session_lines(root: Path = REPO, folders: tuple[str, ...] = ("proxy", "plugins")) -> list[str]:
    found = []
    for path in sorted(p for folder in folders for p in (root / folder).glob("**/*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in LEVELS):
                continue
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                if node.args[0].value.lower().startswith("session %"):
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {node.args[0].value[:60]!r}")
    return found


def test_no_line_about_a_session_bypasses_its_session_log():
    assert _hand_made_session_lines() == []


def test_the_check_sees_a_hand_made_line(tmp_path):
    """The scan above finds a line written the old way (so it can fail)."""
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "old.py").write_text('import logging\nlogging.getLogger("x").warning("session %d: lost", 7)\n')
    assert _hand_made_session_lines(tmp_path, ("plugins",)) == ["plugins/old.py:2: 'session %d: lost'"]


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_session_line_carries_its_fields_and_the_backend_it_is_on_now():
    base = logging.getLogger("replay_proxy.test_sessionlog")
    capture = _Capture()
    base.addHandler(capture)
    base.setLevel(logging.DEBUG)
    try:
        info = SessionInfo(41, "tidb-prod", "dm", "10.0.0.5:51234", backend_address="127.0.0.1:4000")
        slog = info.logger(base)
        assert isinstance(slog, SessionLog)
        slog.warning("recovered on %s", "127.0.0.1:4001", **outcome("resumed", waited_ms=12))
        info._backend_address = "127.0.0.1:4001"  # the tracker's write when the session moves
        slog.error("gave up", **outcome("aborted_1158", 1158))
    finally:
        base.removeHandler(capture)
    first, second = capture.records
    assert first.getMessage() == "session 41: recovered on 127.0.0.1:4001"
    assert (first.session, first.target, first.client, first.user, first.backend) == (
        41,
        "tidb-prod",
        "10.0.0.5:51234",
        "dm",
        "127.0.0.1:4000",
    )
    assert (first.outcome, first.waited_ms) == ("resumed", 12)
    assert not hasattr(first, "code")
    assert (second.backend, second.outcome, second.code) == ("127.0.0.1:4001", "aborted_1158", 1158)
