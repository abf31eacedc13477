"""A test harness for plugins (in the spirit of mitmproxy's ``taddons``).

It builds plugins through the same path as the proxy (config parsing, ``[plugins.<name>]``
option tables checked into the plugin's ``Options`` class, the ``Hooks`` dispatcher), gives fake
sessions, commands and results, and calls hooks the way the proxy does::

    from proxy import plugintest as pt

    async def test_denies_drop():                  # pytest-trio test (trio_mode = true)
        h = pt.harness("firewall", deny=["DROP"])
        assert pt.is_reject(await h.command("DROP TABLE t"), 1142)
        assert await h.command("SELECT 1") is None

    def test_bad_option():
        with pytest.raises(ConfigError, match=r"\\$\\.plugins\\.firewall\\.deny"):
            pt.harness("firewall", deny="DROP")

``harness()`` takes a chain name (``"firewall"``, ``"mycompany.audit:AuditPlugin"``) or a plugin
class; ``chain()`` builds several plugins in order. ``Harness.command`` runs the command chain
(a failing plugin raises ``PluginError``, which the proxy turns into ERR 1105);
``Harness.roundtrip`` also reports a result to ``result_received`` as if the server had
answered. ``with pt.harness(...) as h:`` calls the plugins' ``close()`` at the end (files...). Hooks may be plain or async: harness methods are async and await what needs it; from
a plain test, ``run(h.command, "SELECT 1")`` runs one under ``trio.run`` (on an autojump clock
by default, so sleeping plugins take no time).
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import trio
import trio.testing

from proxy.config import Config, parse_config
from proxy.hooks import AnswerOk, CommandInfo, Hooks, Reject, ResultInfo, Rewrite, SessionInfo, Veto
from proxy.plugin_loader import PluginContext, instantiate, load_chain
from proxy.recovery.plan import Outcome, Plan
from proxy.sqltext import MARIADB, Dialect, ServerReading

__all__ = [
    "Harness",
    "harness",
    "chain",
    "session",
    "query",
    "prepare",
    "execute",
    "ping",
    "command",
    "result",
    "error",
    "replay_plan",
    "is_reject",
    "rewritten_sql",
    "call_hook",
    "run",
]

_session_ids = itertools.count(1)

# --- Builders ---------------------------------------------------------------------------------


def session(
    user: str = "app", *, target: str = "test", client_address: str = "127.0.0.1:50000", database: str | None = "test",
    in_transaction: bool = False, id: int | None = None, backend_address: str = "127.0.0.1:3306",
    no_backslash_escapes: bool = False, multi_statements: bool = True, dialect: Dialect = MARIADB,
) -> SessionInfo:  # fmt: skip
    """A fake session as plugins see it (its backend: the lab's MariaDB, by default)."""
    return SessionInfo(
        next(_session_ids) if id is None else id, target, user, client_address, backend_address, database,
        in_transaction, reading=ServerReading(dialect, no_backslash_escapes, multi_statements),
    )  # fmt: skip


# How query() and prepare() read text without a session: as the lab's MariaDB does.
_DEFAULT_READER = SessionInfo(0, "test", "app", "127.0.0.1:50000", reading=ServerReading(MARIADB))


def command(code: int, payload: bytes = b"") -> CommandInfo:
    """Any command: ``command(0x0e)`` is a COM_PING; ``payload`` is what follows the command byte."""
    return CommandInfo(code, bytes((code,)) + payload)


def query(sql: str, session: SessionInfo | None = None) -> CommandInfo:
    """COM_QUERY with ``sql``, read as ``session``'s server reads it (default: the lab's
    MariaDB, backslash escapes, multi-statements allowed)."""
    return CommandInfo.for_session(session or _DEFAULT_READER, 0x03, b"\x03" + sql.encode("utf-8", "surrogateescape"))


def prepare(sql: str, session: SessionInfo | None = None) -> CommandInfo:
    """COM_STMT_PREPARE of ``sql`` (read as for ``query``)."""
    return CommandInfo.for_session(session or _DEFAULT_READER, 0x16, b"\x16" + sql.encode("utf-8", "surrogateescape"))


def execute(statement_id: int = 1) -> CommandInfo:
    """COM_STMT_EXECUTE of a statement without parameters."""
    return CommandInfo(0x17, b"\x17" + struct.pack("<IBI", statement_id, 0, 1))


def ping() -> CommandInfo:
    return command(0x0E)


def result(
    *, ok: bool = True, error_code: int | None = None, error_message: str | None = None, affected_rows: int = 0,
    rows: int = 0, bytes: int = 11, latency: float = 0.001, in_transaction: bool = False, answered_by: str | None = None,
) -> ResultInfo:  # fmt: skip
    """A result; defaults describe a quick OK."""
    if error_code is not None:
        ok = False
    return ResultInfo(ok, error_code, error_message, affected_rows, rows, bytes, latency, in_transaction, answered_by)


def error(code: int, message: str = "error", **fields: Any) -> ResultInfo:
    """A failed result (ERR ``code``)."""
    return result(error_code=code, error_message=message, **fields)


def replay_plan(replay: bool = True, *, verify: bool = True, resend: bool = False, reason: str = "test") -> Plan:
    """What ``replay_decided`` receives: the proxy is about to replay (and/or resend)."""
    return Plan(Outcome.RESUME, reason, replay=replay, verify=verify, resend=resend)


# --- Verdict helpers --------------------------------------------------------------------------


def is_reject(verdict: Any, code: int | None = None) -> bool:
    """Is ``verdict`` a Reject (with error ``code``, if given)?"""
    return isinstance(verdict, Reject) and (code is None or verdict.code == code)


def rewritten_sql(verdict: Any) -> str | None:
    """The statement text of a Rewrite verdict, None for any other verdict."""
    if not isinstance(verdict, Rewrite):
        return None
    return verdict.payload[1:].decode("utf-8", "surrogateescape")


async def call_hook(fn: Callable[..., Any], *args: Any) -> Any:
    """Call one hook method, plain or async, and return its answer."""
    answer = fn(*args)
    return (await answer) if inspect.isawaitable(answer) else answer


def run(fn: Callable[..., Awaitable[Any]], *args: Any, autojump: bool = True) -> Any:
    """Run an async harness method or hook from a plain (non-trio) test."""
    clock = trio.testing.MockClock(autojump_threshold=0) if autojump else None
    return trio.run(fn, *args, clock=clock)


# --- Harness ----------------------------------------------------------------------------------


def _base_config(target: str, plugins: dict[str, Any]) -> Config:
    return parse_config(
        {
            "name": target,
            "backend": {"addresses": ["127.0.0.1:3306"]},
            "users": [{"name": "app", "password": "apppw"}],
            "admin": {"enabled": False},
            "plugins": plugins,
        }
    )


def _chain_name(cls: type) -> str | None:
    """``module:Class`` if the class can be loaded by that name (not a class defined in a test
    function)."""
    try:
        found = getattr(importlib.import_module(cls.__module__), cls.__qualname__, None)
    except ImportError:
        return None
    return f"{cls.__module__}:{cls.__qualname__}" if found is cls else None


def harness(plugin: str | type, options: dict[str, Any] | None = None, /, *, target: str = "test", **kwargs: Any) -> Harness:
    """One plugin, built as the proxy builds it. Options as a dict (the ``[plugins.<name>]``
    table) or as keyword arguments. Bad options raise ``ConfigError`` naming the key's path."""
    opts = {**(options or {}), **kwargs}
    if isinstance(plugin, str):
        return chain([plugin], {plugin: opts} if opts else {}, target=target)
    name = _chain_name(plugin)
    if name is not None:
        return chain([name], {name: opts} if opts else {}, target=target)
    # A class only reachable as an object: same option checks, without the import by name.
    config = _base_config(target, {})
    label = plugin.__name__.lower()
    instance = instantiate(plugin, opts, PluginContext(target, config, label), f"$.plugins.{label}")
    return Harness(Hooks([(label, instance)]), config)


def chain(names: list[str], options: dict[str, dict[str, Any]] | None = None, *, target: str = "test") -> Harness:
    """Several plugins in chain order, e.g. ``chain(["firewall", "metrics"], {"firewall": {...}})``."""
    config = _base_config(target, {"chain": list(names), **(options or {})})
    return Harness(load_chain(config), config)


class Harness:
    """A loaded chain plus a default session; async methods call hooks as the proxy does."""

    def __init__(self, hooks: Hooks, config: Config) -> None:
        self.hooks = hooks
        self.config = config
        self.plugins = dict(hooks.plugins)
        self.session = session(target=config.name)

    @property
    def plugin(self) -> Any:
        """The first (usually the only) plugin of the chain."""
        return self.hooks.plugins[0][1]

    def new_session(self, user: str = "app", **kwargs: Any) -> SessionInfo:
        return session(user, target=self.config.name, **kwargs)

    @staticmethod
    def _command(cmd: str | CommandInfo, session: SessionInfo) -> CommandInfo:
        return query(cmd, session) if isinstance(cmd, str) else cmd

    async def command(self, cmd: str | CommandInfo, session: SessionInfo | None = None) -> Any:
        """Run ``command_received`` along the chain: None (pass), Rewrite, Reject or AnswerOk.
        A plugin that raises gives ``PluginError``."""
        sess = session or self.session
        return await self.hooks.run_command_chain(sess, self._command(cmd, sess))

    async def result(self, cmd: str | CommandInfo, res: ResultInfo | None = None, session: SessionInfo | None = None) -> None:
        """Report a command's result to ``result_received``."""
        sess = session or self.session
        await self.hooks.notify(self.hooks.result_received, sess, self._command(cmd, sess), res or result())

    async def roundtrip(self, cmd: str | CommandInfo, res: ResultInfo | None = None, session: SessionInfo | None = None) -> Any:
        """A command through the chain and, unless a plugin answered it, its result (``res``,
        default a quick OK) reported as the server's answer to the command as sent. Returns the
        chain's verdict."""
        sess = session or self.session
        sent = self._command(cmd, sess)
        verdict = await self.hooks.run_command_chain(sess, sent)
        if isinstance(verdict, (Reject, AnswerOk)):
            return verdict  # the chain already reported the plugin's answer
        if isinstance(verdict, Rewrite):
            sent = CommandInfo.for_session(sess, verdict.payload[0], verdict.payload)
        await self.hooks.notify(self.hooks.result_received, sess, sent, res or result())
        return verdict

    async def open(self, session: SessionInfo | None = None) -> SessionInfo:
        sess = session or self.session
        await self.hooks.notify(self.hooks.session_opened, sess)
        return sess

    async def close(self, session: SessionInfo | None = None) -> None:
        await self.hooks.notify(self.hooks.session_closed, session or self.session)

    async def backend_lost(self, reason: str = "connection reset", session: SessionInfo | None = None) -> None:
        await self.hooks.notify(self.hooks.backend_lost, session or self.session, reason)

    async def backend_recovered(
        self, plan: str = "resume", *, replayed: int = 0, waited: float = 0.0, reason: str = "connection reset",
        session: SessionInfo | None = None,
    ) -> None:  # fmt: skip
        info = {"reason": reason, "plan": plan, "replayed": replayed, "waited": waited}
        await self.hooks.notify(self.hooks.backend_recovered, session or self.session, info)

    async def replay_decided(self, plan: Plan | None = None, session: SessionInfo | None = None) -> Veto | None:
        """The chain's Veto, asked exactly as the proxy asks it (a failing plugin vetoes), or None."""
        return await self.hooks.replay_veto(session or self.session, plan or replay_plan())

    async def oversized(self, size: int, limit: int, session: SessionInfo | None = None) -> None:
        await self.hooks.notify(self.hooks.oversized_packet, session or self.session, size, limit)

    async def is_idempotent(self, sql: str, session: SessionInfo | None = None) -> bool | None:
        """The chain's answer to the replay policy question, asked exactly as the proxy asks it
        (None: built-in rules decide; a failing plugin answers False)."""
        return await self.hooks.idempotent(session or self.session, sql)

    def get(self, path: str) -> tuple[int, str, bytes]:
        """GET an admin path a plugin serves: (status, content type, body)."""
        for _name, plugin in self.hooks.plugins:
            provider = getattr(plugin, "http_routes", None)
            handler = provider().get(path) if provider is not None else None
            if handler is not None:
                return handler()
        return 404, "text/plain", b"not found\n"

    def shutdown(self) -> None:
        """What the proxy does at exit: each plugin's ``close()``."""
        self.hooks.close()

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
