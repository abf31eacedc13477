"""The hook dispatcher: only implemented hooks are called, chain order, verdicts, failures."""

from __future__ import annotations

import logging

import pytest
import trio

from proxy import plugintest as pt
from proxy.hooks import HOOK_NAMES, AnswerOk, CommandInfo, Hooks, PluginError, Reject, Rewrite


class Recorder:
    """Records which of its hooks were called, in a shared list."""

    def __init__(self, name: str, calls: list[str], verdict=None) -> None:
        self.name, self.calls, self.verdict = name, calls, verdict

    def command_received(self, session, command):
        self.calls.append(f"{self.name}:{command.sql}")
        return self.verdict

    def result_received(self, session, command, result):
        self.calls.append(f"{self.name}:result:{result.error_code}:{result.answered_by}")


class Upper:
    async def command_received(self, session, command):  # async hooks are awaited
        await trio.sleep(0)
        return command.rewrite(command.sql.upper())


def test_empty_chain_has_no_hooks():
    hooks = Hooks([])
    assert not any(getattr(hooks, name) for name in HOOK_NAMES)


def test_only_implemented_hooks_are_bound():
    calls: list[str] = []
    hooks = Hooks([("rec", Recorder("rec", calls))])
    assert hooks.command_received and hooks.result_received
    assert not hooks.session_opened and not hooks.backend_lost and not hooks.is_idempotent


def test_hook_switched_off_by_instance_attribute():
    calls: list[str] = []
    rec = Recorder("rec", calls)
    rec.command_received = None
    assert not Hooks([("rec", rec)]).command_received


async def test_chain_runs_in_order_and_first_verdict_decides():
    calls: list[str] = []
    reject = Reject(1142, "no", "42000")
    hooks = Hooks([("a", Recorder("a", calls)), ("b", Recorder("b", calls, reject)), ("c", Recorder("c", calls))])
    assert await hooks.run_command_chain(pt.session(), pt.query("DROP TABLE t")) is reject
    # c is never asked; every result_received hook hears of b's answer.
    assert calls == ["a:DROP TABLE t", "b:DROP TABLE t", "a:result:1142:b", "b:result:1142:b", "c:result:1142:b"]


async def test_rewrite_is_seen_by_later_plugins():
    calls: list[str] = []
    hooks = Hooks([("upper", Upper()), ("rec", Recorder("rec", calls))])
    verdict = await hooks.run_command_chain(pt.session(), pt.query("select 1"))
    assert pt.rewritten_sql(verdict) == "SELECT 1"
    assert calls == ["rec:SELECT 1"]


async def test_answer_ok_is_reported_with_affected_rows():
    h = pt.harness("tests.plugins.sample_plugin:AuditPlugin", tag="pong", answer_pings=True)
    verdict = await h.command(pt.ping())
    assert verdict == AnswerOk(info="pong")
    assert h.plugin.seen == [("COM_PING", None, None)]


async def test_raising_plugin_becomes_plugin_error_with_location():
    class Broken:
        def command_received(self, session, command):
            raise KeyError("missing")

    calls: list[str] = []
    hooks = Hooks([("broken", Broken()), ("rec", Recorder("rec", calls))])
    with pytest.raises(PluginError) as info:
        await hooks.run_command_chain(pt.session(), pt.query("SELECT 1"))
    message = str(info.value)
    assert message.startswith("plugin 'broken' failed: KeyError: 'missing' (at plugins/test_hooks.py:")
    assert "in command_received" in message and info.value.plugin == "broken"
    assert calls == ["rec:result:1105:broken"]  # observers hear of the ERR 1105 too


async def test_wrong_verdict_type_is_a_plugin_error():
    class Sloppy:
        def command_received(self, session, command):
            return "DROP"

    with pytest.raises(PluginError, match="returned 'DROP', not None/Rewrite/Reject/AnswerOk"):
        await Hooks([("sloppy", Sloppy())]).run_command_chain(pt.session(), pt.query("SELECT 1"))


async def test_incomplete_command_cannot_be_rewritten():
    head = CommandInfo(0x03, b"\x03INSERT INTO t VALUES (1)", complete=False)
    with pytest.raises(PluginError, match="too large to be held in memory"):
        await Hooks([("upper", Upper())]).run_command_chain(pt.session(), head)


async def test_observer_failures_are_logged_and_ignored(caplog):
    class Noisy:
        def result_received(self, session, command, result):
            raise RuntimeError("oops")

    calls: list[str] = []
    hooks = Hooks([("noisy", Noisy()), ("rec", Recorder("rec", calls))])
    with caplog.at_level(logging.ERROR, "replay_proxy.plugins"):
        await hooks.notify(hooks.result_received, pt.session(), pt.query("SELECT 1"), pt.result())
    assert calls == ["rec:result:None:None"]
    assert "plugin noisy: result_received hook failed (ignored)" in caplog.text


def test_command_info_text_is_lossless_and_cached():
    raw = b"\x03SELECT _binary'\xff\xfe' AS x"
    command = CommandInfo(0x03, raw)
    assert command.sql is command.sql  # decoded once
    assert command.rewrite(command.sql).payload == raw  # non-UTF-8 bytes survive a rewrite
    assert Rewrite.query(command.sql).payload == raw
    assert command.kind.value == "select" and command.keywords(1) == ("SELECT",)
    assert pt.execute().sql is None and pt.execute().kind is None and pt.execute().name == "COM_STMT_EXECUTE"


@pytest.mark.parametrize(
    "sql",
    ["INSERT INTO t VALUES (1)", "replace into t values (1)", "  UPDATE t SET a = 1", "/* c */ DELETE FROM t",
     "INSERT$x = 1", "insert_log", "SELECT 1", "COMMIT", "WITH x AS (SELECT 1) DELETE FROM t", "", "(SELECT 1)"],
)  # fmt: skip
def test_command_kind_agrees_with_classify(sql):
    from proxy.sqltext import classify

    assert pt.query(sql).kind is classify(sql).kind


def test_close_calls_each_plugin_once():
    closed: list[str] = []

    class Closing:
        def session_opened(self, session):
            pass

        def close(self):
            closed.append("x")

    Hooks([("a", Closing()), ("b", object())]).close()
    assert closed == ["x"]


def test_session_client_host():
    assert pt.session(client_address="10.1.2.3:5555").client_host == "10.1.2.3"
    assert pt.session(client_address="[::1]:5555").client_host == "::1"
