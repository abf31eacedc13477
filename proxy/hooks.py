"""The plugin hook API.

A plugin is a plain class. It may define any of the hook methods below, each plain or
``async``; hooks it does not define cost nothing, because the chain is resolved into per-hook
lists once, at start-up (an instance attribute set to None also switches a hook off). Plugins
run in the order of the target's ``[plugins] chain``. See docs/plugins.md ("Writing a plugin") and plugins/README.md.

Hooks (``session`` is a ``SessionInfo``, ``command`` a ``CommandInfo``):

- ``session_opened(session)`` / ``session_closed(session)``: observe; after login / at the end.
- ``command_received(session, command)``: return None to pass the command on, or one of
  ``Rewrite``, ``Reject``, ``AnswerOk``. The first plugin that returns a verdict other than a
  Rewrite decides and the plugins after it are not asked; a Rewrite replaces the command for the
  plugins after it and for the server. May be async (e.g. to wait, as the throttle plugin does).
- ``result_received(session, command, result)``: observe a command's answer (``ResultInfo``).
  Called for every answered command, also for those a plugin answered itself (Reject, AnswerOk,
  or ERR 1105 after a plugin failure): then ``result.answered_by`` names that plugin.
- ``backend_lost(session, reason)``: observe; the backend connection went away.
- ``replay_decided(session, plan)``: the proxy is about to restore the session and replay or
  resend (``plan`` is a ``proxy.recovery.plan.Plan``); return ``Veto(reason)`` to forbid it (the
  client then gets 1213 or 1158 instead).
- ``backend_recovered(session, info)``: observe; ``info`` is a dict with ``reason`` (why it was
  lost), ``plan`` (the outcome: "resume", "fail-retryable", "fail-connection"), ``replayed``
  (statements replayed) and ``waited`` (seconds the client was held).
- ``oversized_packet(session, size, limit)``: observe; a command over max_allowed_packet was
  refused with ERR 1153.
- ``is_idempotent(session, sql) -> bool | None``: the safe-mode replay policy; the first
  non-None answer counts, None defers to the built-in rules. Must be a plain (not async) method.

Besides hooks, a plugin may define ``http_routes() -> {path: handler}`` (served on the admin
endpoint; a handler returns ``(status, content_type, body)``) and ``close()`` (called once at
shutdown).

A ``command_received`` hook that raises fails the current command with ERR 1105 naming the
plugin, the exception and where it was raised, and one log line; the session and the proxy
carry on. An observing hook that raises is logged and ignored.
"""

from __future__ import annotations

import inspect
import logging
import os
import traceback
from collections.abc import Callable
from typing import Any

import attrs
import trio

from proxy.session.info import COM_QUERY, COM_STMT_PREPARE, CommandInfo, ResultInfo, Rewrite, SessionInfo

__all__ = [
    "HOOK_NAMES",
    "Hooks",
    "SessionInfo",
    "CommandInfo",
    "ResultInfo",
    "Rewrite",
    "Reject",
    "AnswerOk",
    "Veto",
    "PluginError",
    "COM_QUERY",
    "COM_STMT_PREPARE",
]

log = logging.getLogger("replay_proxy.plugins")

HOOK_NAMES = (
    "session_opened",
    "session_closed",
    "command_received",
    "result_received",
    "backend_lost",
    "backend_recovered",
    "replay_decided",
    "oversized_packet",
    "is_idempotent",
)


@attrs.frozen
class Reject:
    """Answer the command with an ERR packet; the session stays usable."""

    code: int
    message: str
    sqlstate: str = "HY000"


@attrs.frozen
class AnswerOk:
    """Answer the command with an OK packet without sending it to the server."""

    affected_rows: int = 0
    last_insert_id: int = 0
    warnings: int = 0
    info: str = ""


@attrs.frozen
class Veto:
    reason: str


class PluginError(Exception):
    """A plugin failed; carries the plugin's name for the ERR message and the log."""

    def __init__(self, plugin: str, exc: BaseException) -> None:
        super().__init__(f"plugin {plugin!r} failed: {type(exc).__name__}: {exc}{_where(exc)}")
        self.plugin = plugin


def _where(exc: BaseException) -> str:
    """' (at plugins/x.py:42 in command_received)': one log line is enough to find the bug."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    frame = frames[-1]
    path = os.path.join(*frame.filename.split(os.sep)[-2:])
    return f" (at {path}:{frame.lineno} in {frame.name})"


class _Hook:
    """One hook name bound to the plugins that implement it."""

    __slots__ = ("name", "impls")

    def __init__(self, name: str, plugins: list[tuple[str, Any]]) -> None:
        self.name = name
        self.impls: list[tuple[str, Callable, bool]] = []
        for pname, plugin in plugins:
            fn = getattr(plugin, name, None)
            if fn is not None:
                self.impls.append((pname, fn, inspect.iscoroutinefunction(fn)))

    def __bool__(self) -> bool:
        return bool(self.impls)


class Hooks:
    """The resolved chain: for each hook, the plugins implementing it, in order."""

    def __init__(self, plugins: list[tuple[str, Any]]) -> None:
        self.plugins = plugins
        self.session_opened = _Hook("session_opened", plugins)
        self.session_closed = _Hook("session_closed", plugins)
        self.command_received = _Hook("command_received", plugins)
        self.result_received = _Hook("result_received", plugins)
        self.backend_lost = _Hook("backend_lost", plugins)
        self.backend_recovered = _Hook("backend_recovered", plugins)
        self.replay_decided = _Hook("replay_decided", plugins)
        self.oversized_packet = _Hook("oversized_packet", plugins)
        self.is_idempotent = _Hook("is_idempotent", plugins)

    async def notify(self, hook: _Hook, *args: Any) -> None:
        """Call an observe-only hook on every plugin; failures are logged, never raised."""
        for pname, fn, is_async in hook.impls:
            try:
                if is_async:
                    await fn(*args)
                else:
                    fn(*args)
            except Exception:
                log.exception("plugin %s: %s hook failed (ignored)", pname, hook.name)

    @staticmethod
    async def first_answer(hook: _Hook, *args: Any, on_error: Callable[[str, Exception], Any]) -> Any:
        """Ask a deciding hook (``replay_decided``, ``is_idempotent``): the first non-None answer
        in chain order, or None. A plugin that raises answers ``on_error(plugin, exception)``
        instead (logged here), so one broken plugin cannot make the proxy guess."""
        for pname, fn, is_async in hook.impls:
            try:
                answer = (await fn(*args)) if is_async else fn(*args)
            except Exception as exc:
                log.exception("plugin %s: %s hook failed", pname, hook.name)
                answer = on_error(pname, exc)
            if answer is not None:
                return answer
        return None

    async def replay_veto(self, session: SessionInfo, plan: Any) -> Veto | None:
        """The chain's verdict on a replay: the first Veto, or None. A failing plugin vetoes."""
        answer = await self.first_answer(
            self.replay_decided, session, plan, on_error=lambda name, exc: Veto(f"plugin {name} failed: {type(exc).__name__}: {exc}")
        )
        return answer if isinstance(answer, Veto) else None

    async def idempotent(self, session: SessionInfo, sql: str) -> bool | None:
        """The chain's answer to the safe-mode question (None: the built-in rules decide). A
        failing plugin answers "not idempotent"."""
        answer = await self.first_answer(self.is_idempotent, session, sql, on_error=lambda name, exc: False)
        return None if answer is None else bool(answer)

    async def run_command_chain(self, session: SessionInfo, command: CommandInfo) -> Any:
        """Run the command chain. Returns None (pass), a Rewrite (possibly chained), Reject or
        AnswerOk; raises PluginError when a plugin fails. When a plugin answers (or fails), the
        result_received hooks are told here, since the command never reaches the server."""
        observed = bool(self.result_received)
        started = trio.current_time() if observed else 0.0
        rewritten = None
        for pname, fn, is_async in self.command_received.impls:
            try:
                verdict = (await fn(session, command)) if is_async else fn(session, command)
            except Exception as exc:
                raise await self._failed(session, command, started, pname, exc) from exc
            if verdict is None:
                continue
            if isinstance(verdict, Rewrite):
                if not command.complete:
                    problem = ValueError(f"cannot rewrite {command.name}: it is too large to be held in memory")
                    raise await self._failed(session, command, started, pname, problem)
                rewritten = verdict
                command = CommandInfo.for_session(session, verdict.payload[0], verdict.payload)
                continue
            if isinstance(verdict, Reject):
                if observed:
                    await self._answered(session, command, started, pname, verdict.code, verdict.message)
            elif isinstance(verdict, AnswerOk):
                if observed:
                    await self._answered(session, command, started, pname, None, None, verdict.affected_rows)
            else:
                problem = TypeError(f"command_received returned {verdict!r}, not None/Rewrite/Reject/AnswerOk")
                raise await self._failed(session, command, started, pname, problem)
            return verdict
        return rewritten

    async def _failed(self, session: SessionInfo, command: CommandInfo, started: float, plugin: str, exc: Exception) -> PluginError:
        error = PluginError(plugin, exc)
        if self.result_received:
            await self._answered(session, command, started, plugin, 1105, str(error))
        return error

    async def _answered(
        self,
        session: SessionInfo,
        command: CommandInfo,
        started: float,
        plugin: str,
        code: int | None,
        message: str | None,
        affected_rows: int = 0,
    ) -> None:
        result = ResultInfo(
            ok=code is None, error_code=code, error_message=message, affected_rows=affected_rows, rows=0,
            bytes=0, latency=trio.current_time() - started, in_transaction=session.in_transaction, answered_by=plugin,
        )  # fmt: skip
        await self.notify(self.result_received, session, command, result)

    def close(self) -> None:
        """Call each plugin's ``close()`` (flush files, ...) once, at shutdown."""
        for pname, plugin in self.plugins:
            close = getattr(plugin, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:
                    log.exception("plugin %s: close failed (ignored)", pname)
