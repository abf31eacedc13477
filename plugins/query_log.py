"""query_log: one JSON object per line for each (sampled or slow) statement.

Options (``[plugins.query_log]``):

- ``path``: file to append to (opened at start-up, line-buffered). Default: the
  ``replay_proxy.query`` logger at INFO, i.e. the proxy's own log.
- ``sample`` (default 1.0): fraction of statements logged, from 0 to 1.
- ``slow_ms``: statements that took at least this many milliseconds are always logged.
- ``errors`` (default true): statements that failed (ERR) are always logged.
- ``redact`` (default true): string, number, hex and bit literals become ``?``.
- ``max_sql_length`` (default 2048): longer statement text is cut (before redaction, so a huge
  INSERT costs no more than a short one), marked with a trailing ``...``.
- ``all_commands`` (default false): also log pings, COM_INIT_DB and the like; by default only
  COM_QUERY, COM_STMT_PREPARE and COM_STMT_EXECUTE.

A line: ``{"ts": "2024-05-01T12:00:00.123Z", "target": "orders", "session": 7, "user": "app",
"db": "shop", "command": "COM_QUERY", "sql": "INSERT INTO t VALUES (?, ?)", "latency_ms": 1.234,
"rows": 0, "affected_rows": 1, "error": null, "slow": false}``. ``sql`` is null for
COM_STMT_EXECUTE (the text was logged at its prepare); ``error`` is the MySQL error code;
``answered_by`` appears when a plugin (firewall, throttle) answered instead of the server.

Cheap per statement: whether to log is decided first (slow? failed? sampled?), and the text is
decoded, cut and redacted only for statements that are logged.
"""

from __future__ import annotations

import json
import logging
import random
import time
from typing import Annotated, Any

import attrs

from proxy.hooks import CommandInfo, ResultInfo, SessionInfo
from proxy.plugin_loader import PluginContext, at_least, between
from proxy.sqltext.redact import redact

__all__ = ["Plugin", "redact"]  # redact: re-exported from proxy.sqltext.redact

_STATEMENT_COMMANDS = frozenset({0x03, 0x16, 0x17})  # COM_QUERY, COM_STMT_PREPARE, COM_STMT_EXECUTE


class Plugin:
    @attrs.frozen
    class Options:
        path: str | None = None
        sample: Annotated[float, between(0, 1)] = 1.0
        slow_ms: Annotated[float, at_least(0)] | None = None
        errors: bool = True
        redact: bool = True
        max_sql_length: Annotated[int, at_least(16)] = 2048
        all_commands: bool = False

    def __init__(self, options: Options, context: PluginContext) -> None:
        self.target = context.target
        self.sample = options.sample
        self.slow = options.slow_ms / 1000 if options.slow_ms is not None else None
        self.errors = options.errors
        self.redact = options.redact
        self.max_length = options.max_sql_length
        self.commands = None if options.all_commands else _STATEMENT_COMMANDS
        self.random = random.random  # replaceable in tests
        self.file = open(options.path, "a", buffering=1, encoding="utf-8") if options.path else None
        self.logger = logging.getLogger("replay_proxy.query")

    def result_received(self, session: SessionInfo, command: CommandInfo, result: ResultInfo) -> None:
        if self.commands is not None and command.code not in self.commands:
            return
        slow = self.slow is not None and result.latency >= self.slow
        if not (slow or (self.errors and not result.ok) or self.sample >= 1.0 or self.random() < self.sample):
            return
        line = json.dumps(self._record(session, command, result, slow))
        if self.file is not None:
            self.file.write(line + "\n")
        else:
            self.logger.info("%s", line)

    def _record(self, session: SessionInfo, command: CommandInfo, result: ResultInfo, slow: bool) -> dict[str, Any]:
        now = time.time()
        record: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z",
            "target": self.target,
            "session": session.id,
            "user": session.user,
            "db": session.database,
            "command": command.name,
            "sql": self._text(command),
            "latency_ms": round(result.latency * 1000, 3),
            "rows": result.rows,
            "affected_rows": result.affected_rows,
            "error": result.error_code,
            "slow": slow,
        }
        if result.answered_by is not None:
            record["answered_by"] = result.answered_by
        return record

    def _text(self, command: CommandInfo) -> str | None:
        if command.code not in (0x03, 0x16):
            return None
        # Decode only what will be shown: a 50 MB statement is not decoded whole.
        head = command.payload[1 : 1 + self.max_length].decode("utf-8", "replace")
        cut = len(command.payload) - 1 > self.max_length or not command.complete
        text = redact(head, command.dialect, command.no_backslash_escapes) if self.redact else head
        return text + "..." if cut else text

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
