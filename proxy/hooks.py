"""The plugin hook API.

A plugin is a plain class. It may define any of the hook methods below (plain or ``async``);
hooks it does not define cost nothing, because the chain is resolved into per-hook lists once,
at start-up. Plugins run in the order of the target's ``[plugins] chain``.

Hooks (``session`` is a ``SessionInfo``, ``command`` a ``CommandInfo``):

- ``session_opened(session)`` / ``session_closed(session)``: observe.
- ``command_received(session, command)``: return None to pass the command on, or one of
  ``Rewrite``, ``Reject``, ``AnswerOk``. The first plugin that returns a verdict other than a
  Rewrite decides; a Rewrite replaces the command for the plugins after it and for the server.
- ``result_received(session, command, result)``: observe (``result`` is a ``ResultInfo``).
- ``backend_lost(session, reason)``, ``backend_recovered(session, info)``: observe.
- ``replay_decided(session, plan)``: observe; return ``Veto(reason)`` to forbid a replay.
- ``oversized_packet(session, size, limit)``: observe.
- ``is_idempotent(session, sql) -> bool | None``: the replay policy; the first non-None answer
  counts, None defers to the built-in safe-mode rules.

A plugin that raises fails the current command with an ERR (1105) and a log line; the proxy and
the session carry on.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Callable

import attrs

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
class Rewrite:
    """Replace the command. ``payload`` is the whole command payload (command byte first)."""

    payload: bytes

    @classmethod
    def query(cls, sql: str) -> "Rewrite":
        return cls(b"\x03" + sql.encode("utf-8"))


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
        super().__init__(f"plugin {plugin!r} failed: {type(exc).__name__}: {exc}")
        self.plugin = plugin


@attrs.define(slots=True, eq=False)
class SessionInfo:
    """What plugins may see of a session (a live view, updated by the proxy)."""

    id: int
    target: str
    user: str
    client_address: str
    backend_address: str = ""
    database: str | None = None
    in_transaction: bool = False
    opened_at: float = 0.0
    # Free for plugins to keep per-session data, keyed by plugin name.
    data: dict[str, Any] = attrs.Factory(dict)


@attrs.define(slots=True, eq=False)
class CommandInfo:
    code: int  # COM_* byte
    payload: bytes

    @property
    def sql(self) -> str | None:
        """Statement text of COM_QUERY / COM_STMT_PREPARE, else None."""
        if self.code in (0x03, 0x16):
            return self.payload[1:].decode("utf-8", "replace")
        return None

    @property
    def name(self) -> str:
        from proxy.protocol.constants import Commands

        try:
            return Commands(self.code).name
        except ValueError:
            return f"COM_0x{self.code:02x}"


@attrs.frozen
class ResultInfo:
    ok: bool
    error_code: int | None
    error_message: str | None
    affected_rows: int
    rows: int
    bytes: int
    latency: float  # seconds from command received to response complete
    in_transaction: bool


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
        for name in HOOK_NAMES:
            setattr(self, name, _Hook(name, plugins))

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

    def notify_sync(self, hook: _Hook, *args: Any) -> None:
        for pname, fn, is_async in hook.impls:
            if is_async:
                continue
            try:
                fn(*args)
            except Exception:
                log.exception("plugin %s: %s hook failed (ignored)", pname, hook.name)

    async def decide(self, hook: _Hook, *args: Any) -> Any:
        """Call a deciding hook; returns the first non-None answer. Raises PluginError."""
        for pname, fn, is_async in hook.impls:
            try:
                answer = (await fn(*args)) if is_async else fn(*args)
            except Exception as exc:
                raise PluginError(pname, exc) from exc
            if answer is not None:
                return answer
        return None

    async def run_command_chain(self, session: SessionInfo, command: CommandInfo) -> Any:
        """Run the command chain. Returns None (pass), a Rewrite (possibly chained), Reject or AnswerOk."""
        rewritten = None
        for pname, fn, is_async in self.command_received.impls:  # type: ignore[attr-defined]
            try:
                verdict = (await fn(session, command)) if is_async else fn(session, command)
            except Exception as exc:
                raise PluginError(pname, exc) from exc
            if verdict is None:
                continue
            if isinstance(verdict, Rewrite):
                rewritten = verdict
                command = CommandInfo(verdict.payload[0], verdict.payload)
                continue
            if isinstance(verdict, (Reject, AnswerOk)):
                return verdict
            raise PluginError(pname, TypeError(f"command_received returned {verdict!r}"))
        return rewritten
