"""Log lines about one session, each carrying the session's fields.

Every line the proxy writes about a session goes through its ``SessionLog``: the text starts
``session <id>:`` (as an operator greps it), and the record carries ``session``, ``target``,
``client``, ``user`` and the ``backend`` address the session is on at that moment, which JSON
logs (``log.format = "json"``) show as fields of their own. A line about an outcome passes
``outcome`` and the MySQL error ``code`` the client got, with ``extra=``.

Nothing in this module reads a password or a statement's text: the fields are addresses,
names and numbers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, MutableMapping
from typing import Any

__all__ = ["SessionLog", "FIELDS", "outcome"]

# The fields a record may carry that JSON logs show on their own (proxy.cli's formatter).
FIELDS = ("event", "session", "user", "client", "backend", "target", "outcome", "code", "waited_ms")


def outcome(name: str, code: int | None = None, **more: Any) -> dict[str, Any]:
    """``extra=`` for a line that reports an outcome (and the error code the client got)."""
    fields: dict[str, Any] = {"outcome": name, **more}
    if code is not None:
        fields["code"] = code
    return {"extra": fields}


class SessionLog(logging.LoggerAdapter):
    """A logger for one session. ``backend`` and ``user`` are read at each line: a session
    moves between backends and logs in after it was created."""

    def __init__(
        self,
        logger: logging.Logger,
        session_id: int,
        target: str,
        client: str,
        backend: Callable[[], str | None] = lambda: None,
        user: Callable[[], str] = lambda: "",
    ) -> None:
        super().__init__(logger, {})
        self.session_id = session_id
        self.target = target
        self.client = client
        self._backend = backend
        self._user = user

    def fields(self) -> dict[str, Any]:
        return {
            "session": self.session_id,
            "target": self.target,
            "client": self.client,
            "backend": self._backend() or "-",
            "user": self._user() or None,
        }

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**self.fields(), **(kwargs.get("extra") or {})}
        return f"session {self.session_id}: {msg}", kwargs

    def child(self, logger: logging.Logger) -> SessionLog:
        """The same session's fields on another logger (a plugin's)."""
        return SessionLog(logger, self.session_id, self.target, self.client, self._backend, self._user)
