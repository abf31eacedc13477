"""A plugin outside the plugins/ package, loaded by path ("tests.plugins.sample_plugin:AuditPlugin")
in the loader tests: the smallest complete plugin, with options and a context."""

from __future__ import annotations

import attrs

from proxy.hooks import AnswerOk, CommandInfo, ResultInfo, SessionInfo
from proxy.plugin_loader import PluginContext


class AuditPlugin:
    @attrs.frozen
    class Options:
        tag: str
        answer_pings: bool = False

    def __init__(self, options: Options, context: PluginContext) -> None:
        self.tag = options.tag
        self.answer_pings = options.answer_pings
        self.target = context.target
        self.seen: list[tuple[str, str | None, int | None]] = []

    def command_received(self, session: SessionInfo, command: CommandInfo) -> AnswerOk | None:
        if self.answer_pings and command.name == "COM_PING":
            return AnswerOk(info=self.tag)
        return None

    def result_received(self, session: SessionInfo, command: CommandInfo, result: ResultInfo) -> None:
        self.seen.append((command.name, command.sql, result.error_code))


class NoOptions:
    """Takes neither options nor a context."""

    def session_opened(self, session: SessionInfo) -> None:
        self.opened = session.id


class NotAPlugin:
    """Implements no hook: naming it in a chain is a config error."""

    def hello(self) -> None:
        pass


class AsyncPolicy:
    async def is_idempotent(self, session: SessionInfo, sql: str) -> bool:
        return True
