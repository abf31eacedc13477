"""The plugin hook API.

A plugin is a plain class. It may define any of the hook methods below, each plain or
``async``; hooks it does not define cost nothing, because the chain is resolved into per-hook
lists once, at start-up (an instance attribute set to None also switches a hook off). Plugins
run in the order of the target's ``[plugins] chain``. See the README ("Writing a plugin") and plugins/README.md.

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
  resend (``plan`` is a ``proxy.recovery.Plan``); return ``Veto(reason)`` to forbid it (the
  client then gets 1213 or 2013 instead).
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
import re
import traceback
from typing import Any, Callable

import attrs
import trio

from proxy.protocol import sql as sqltext
from proxy.protocol.constants import Commands

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

COM_QUERY = 0x03
COM_STMT_PREPARE = 0x16
_TEXT_COMMANDS = frozenset({COM_QUERY, COM_STMT_PREPARE})
# Names by command byte, computed once: plugins label metrics and log lines with them.
_COMMAND_NAMES = {c.value: c.name for c in Commands}
_CLASSIFY_HEAD = 4096
_DML_KINDS = {k.name: k for k in (sqltext.Kind.INSERT, sqltext.Kind.REPLACE, sqltext.Kind.UPDATE, sqltext.Kind.DELETE)}
_DML_AT_START = re.compile(r"(?i:INSERT|REPLACE|UPDATE|DELETE)(?![0-9A-Za-z_$\x80-\U0010ffff])")


@attrs.frozen
class Rewrite:
    """Replace the command. ``payload`` is the whole command payload (command byte first)."""

    payload: bytes

    @classmethod
    def query(cls, sql: str) -> "Rewrite":
        # surrogateescape: text taken from CommandInfo.sql goes back to the exact original bytes.
        return cls(b"\x03" + sql.encode("utf-8", "surrogateescape"))


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
    # How the server reads this session's statements: NO_BACKSLASH_ESCAPES (from the status
    # flags) and whether one COM_QUERY may hold several statements (CLIENT_MULTI_STATEMENTS or
    # COM_SET_OPTION). The defaults are the cautious reading for a plugin that inspects text.
    no_backslash_escapes: bool = False
    multi_statements: bool = True

    @property
    def client_host(self) -> str:
        """The client's address without the port (what MySQL error messages call the host)."""
        host, sep, _port = self.client_address.rpartition(":")
        return host.strip("[]") if sep else self.client_address


@attrs.define(slots=True, eq=False)
class CommandInfo:
    """One client command. Text and classification are computed on first use and cached, so
    plugins of one chain share the work."""

    code: int  # COM_* byte
    payload: bytes  # command byte first; only the first 64 KiB when ``complete`` is False
    # False for a command too big to keep in memory (spooled): ``payload`` is its head only, and
    # it cannot be rewritten.
    complete: bool = True
    _sql: str | None = attrs.field(default=None, init=False, repr=False)
    _kind: Any = attrs.field(default=None, init=False, repr=False)

    @property
    def sql(self) -> str | None:
        """Statement text of COM_QUERY / COM_STMT_PREPARE, else None. Lossless: bytes that are
        not UTF-8 appear as lone surrogates and ``rewrite`` turns them back into the same bytes."""
        if self._sql is None and self.code in _TEXT_COMMANDS:
            self._sql = self.payload[1:].decode("utf-8", "surrogateescape")
        return self._sql

    @property
    def kind(self) -> sqltext.Kind | None:
        """``proxy.protocol.sql.Kind`` of the statement (COM_QUERY / COM_STMT_PREPARE), else None.
        Judged from the first 4 KiB of the text, which is enough for the kind and keeps a 50 MB
        INSERT as cheap as a short one."""
        if self._kind is None and self.code in _TEXT_COMMANDS:
            if self._sql is not None:
                head = self._sql[:_CLASSIFY_HEAD]
            else:
                head = self.payload[1 : 1 + _CLASSIFY_HEAD].decode("utf-8", "surrogateescape")
            # A DML statement (most of a replicator's traffic) is of the kind of its first keyword,
            # as classify() says too; skipping classify() spares its lock-function scan, which
            # only matters for its flags. DM's statements start right with the verb.
            m = _DML_AT_START.match(head)
            self._kind = _DML_KINDS[m.group().upper()] if m else sqltext.classify(head).kind
        return self._kind

    def keywords(self, n: int = 2) -> tuple[str, ...]:
        """The first ``n`` keywords, upper-cased, skipping comments and reading inside ``/*! */``
        (``proxy.protocol.sql.leading_keywords``); () for commands without text."""
        text = self.sql
        return sqltext.leading_keywords(text, n) if text is not None else ()

    def rewrite(self, sql: str) -> Rewrite:
        """A Rewrite of this command (same command byte) to ``sql``."""
        return Rewrite(bytes((self.code,)) + sql.encode("utf-8", "surrogateescape"))

    @property
    def name(self) -> str:
        name = _COMMAND_NAMES.get(self.code)
        return name if name is not None else f"COM_0x{self.code:02x}"


@attrs.frozen
class ResultInfo:
    ok: bool
    error_code: int | None
    error_message: str | None
    affected_rows: int
    rows: int
    bytes: int  # response bytes sent to the client
    latency: float  # seconds from command received to response complete
    in_transaction: bool
    # The plugin that answered the command itself (Reject / AnswerOk / its failure); None when
    # the server answered.
    answered_by: str | None = None


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
                command = CommandInfo(verdict.payload[0], verdict.payload)
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

    async def _failed(
        self, session: SessionInfo, command: CommandInfo, started: float, plugin: str, exc: Exception
    ) -> PluginError:
        error = PluginError(plugin, exc)
        if self.result_received:
            await self._answered(session, command, started, plugin, 1105, str(error))
        return error

    async def _answered(
        self, session: SessionInfo, command: CommandInfo, started: float, plugin: str,
        code: int | None, message: str | None, affected_rows: int = 0,
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
