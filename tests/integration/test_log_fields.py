"""What an operator reads at 3 a.m.: with ``log.format = "json"`` every line about a session
carries its id, target, client and backend address as fields, and a line about an outcome
its outcome and the MySQL error code the client got. Shown with a real client through the
real proxy, against a real MariaDB restarted under it (a recovery), a statement over the
packet limit (1153) and a wrong password (1045)."""

from __future__ import annotations

import json

import pymysql
import pytest

from tests.integration.conftest import start_proxy
from tests.lab.fixtures import APP_PASSWORD, APP_USER

pytestmark = pytest.mark.integration

SESSION_FIELDS = ("session", "target", "client", "backend")


def _lines(text: str) -> list[dict]:
    out = []
    for raw in text.splitlines():
        if raw.strip():
            out.append(json.loads(raw))  # every line is one JSON object: no stray text
    return out


def test_json_lines_about_sessions_carry_their_fields(mariadb_factory, tmp_path):
    server = mariadb_factory()
    proxy = start_proxy(tmp_path / "proxy", server.port, log={"format": "json", "level": "info"}, limits={"max_allowed_packet": 65536})
    try:
        conn = pymysql.connect(host="127.0.0.1", port=proxy.port, user=APP_USER, password=APP_PASSWORD, database="test", autocommit=True)
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
            server.restart()  # the session's backend connection is lost; the next command recovers it
            cur.execute("SELECT 2")
            assert cur.fetchone() == (2,)
            with pytest.raises(pymysql.err.OperationalError) as too_large:
                cur.execute("SELECT '" + "x" * 70000 + "'")
            assert too_large.value.args[0] == 1153
        conn.close()
        with pytest.raises(pymysql.err.OperationalError) as denied:
            pymysql.connect(host="127.0.0.1", port=proxy.port, user=APP_USER, password="wrong", database="test")
        assert denied.value.args[0] == 1045
    finally:
        text = proxy.stop()
    lines = _lines(text)
    about_sessions = [line for line in lines if line["msg"].startswith("session ")]
    assert len(about_sessions) >= 4, text[-3000:]
    for line in about_sessions:
        missing = [f for f in SESSION_FIELDS if f not in line]
        assert not missing, f"{line} lacks {missing}"
        assert line["msg"].startswith(f"session {line['session']}: ")
        assert line["target"] == "test"
    backend = f"127.0.0.1:{server.port}"

    def one(predicate, what):
        found = [line for line in about_sessions if predicate(line)]
        assert found, f"no line {what} in:\n" + "\n".join(map(str, about_sessions))
        return found[0]

    recovered = one(lambda line: "recovered on" in line["msg"], "about the recovery")
    assert (recovered["outcome"], recovered["backend"]) == ("resumed", backend)
    assert recovered["waited_ms"] >= 0
    lost = one(lambda line: " lost (user " in line["msg"], "about the loss")
    assert lost["user"] == APP_USER and lost["backend"] == backend
    refused = one(lambda line: "refused COM_QUERY" in line["msg"], "about the 1153")
    assert (refused["outcome"], refused["code"]) == ("refused", 1153)
    login = one(lambda line: "login refused" in line["msg"], "about the wrong password")
    assert (login["outcome"], login["code"]) == ("login_refused", 1045)
    assert "wrong" not in text  # the password tried is never logged
