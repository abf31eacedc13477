"""What plugins see: a session (``SessionInfo``), a command (``CommandInfo``), a result
(``ResultInfo``), and the ``Rewrite`` verdict a command can build of itself. Sans-IO: the
tracker (``proxy.session.tracker``) keeps ``SessionInfo`` up to date without importing trio.
Re-exported by ``proxy.hooks``, where plugins import them from."""

from __future__ import annotations

import logging
from typing import Any

import attrs

from proxy import sqltext
from proxy.protocol.constants import CommandCodes
from proxy.sessionlog import SessionLog
from proxy.sqltext.triage import fast_verb

__all__ = ["SessionInfo", "CommandInfo", "ResultInfo", "Rewrite", "COM_QUERY", "COM_STMT_PREPARE"]

COM_QUERY = 0x03
COM_STMT_PREPARE = 0x16
_TEXT_COMMANDS = frozenset({COM_QUERY, COM_STMT_PREPARE})
# Names by command byte, computed once: plugins label metrics and log lines with them.
_COMMAND_NAMES = {c.value: c.name for c in CommandCodes}
# A data change that starts right with its verb (the hot path) is judged by the verb alone:
# one statement that writes and cannot commit. (A SELECT needs its calls looked at.)
_DML_ANALYSIS = {
    verb: sqltext.Analysis("", (sqltext.Statement(sqltext.Kind[verb.decode()]),), ((0, 0),))
    for verb in (b"INSERT", b"REPLACE", b"UPDATE", b"DELETE")
}
_KEYWORDS_HEAD = 4096  # leading keywords of a statement judged by its verb: read from its head


@attrs.frozen
class Rewrite:
    """Replace the command. ``payload`` is the whole command payload (command byte first)."""

    payload: bytes

    @classmethod
    def query(cls, sql: str) -> Rewrite:
        # surrogateescape: text taken from CommandInfo.sql goes back to the exact original bytes.
        return cls(b"\x03" + sql.encode("utf-8", "surrogateescape"))


@attrs.define(slots=True, eq=False)
class SessionInfo:
    """What plugins may see of a session: a live view, written by the session's tracker only
    (``proxy.session.tracker``). Its fields are read-only to plugins -- how the proxy reads the
    session's SQL cannot be changed from here -- but ``data``, theirs to keep per-session
    state in, keyed by plugin name."""

    id: int
    target: str
    _user: str = attrs.field(alias="user")
    client_address: str
    _backend_address: str = attrs.field(default="", alias="backend_address")
    _database: str | None = attrs.field(default=None, alias="database")
    _in_transaction: bool = attrs.field(default=False, alias="in_transaction")
    opened_at: float = 0.0
    data: dict[str, Any] = attrs.Factory(dict)
    # How the server reads this session's statements (the tracker's ServerReading): the
    # backend's flavor and version (executable comments run or not by it), NO_BACKSLASH_ESCAPES
    # (from the status flags), and whether one COM_QUERY may hold several statements. The
    # defaults are the cautious reading for a plugin that inspects text.
    _reading: sqltext.ServerReading = attrs.field(default=sqltext.ServerReading(), alias="reading")

    @property
    def user(self) -> str:
        return self._user

    def logger(self, base: logging.Logger) -> SessionLog:
        """``base`` for lines about this session: each carries its id, target, client, user and
        the backend it is on at that moment (JSON logs show them as fields)."""
        return SessionLog(base, self.id, self.target, self.client_address, lambda: self._backend_address, lambda: self._user)

    @property
    def backend_address(self) -> str:
        return self._backend_address

    @property
    def database(self) -> str | None:
        return self._database

    @property
    def in_transaction(self) -> bool:
        return self._in_transaction

    @property
    def reading(self) -> sqltext.ServerReading:
        return self._reading

    @property
    def dialect(self) -> sqltext.Dialect:
        return self._reading.dialect

    @property
    def no_backslash_escapes(self) -> bool:
        return self._reading.nbe

    @property
    def multi_statements(self) -> bool:
        return self._reading.multi

    @property
    def client_host(self) -> str:
        """The client's address without the port (what MySQL error messages call the host)."""
        host, sep, _port = self.client_address.rpartition(":")
        return host.strip("[]") if sep else self.client_address


@attrs.define(slots=True, eq=False)
class CommandInfo:
    """One client command. Text and judgement are computed on first use and cached, so
    plugins of one chain share the work. ``dialect``, ``no_backslash_escapes`` and
    ``multi_statements`` say how the session's server reads the text (``for_session``)."""

    code: int  # COM_* byte
    payload: bytes  # command byte first; only the first 64 KiB when ``complete`` is False
    # False for a command too big to keep in memory (spooled): ``payload`` is its head only, and
    # it cannot be rewritten.
    complete: bool = True
    dialect: sqltext.Dialect = sqltext.UNKNOWN
    no_backslash_escapes: bool = False
    multi_statements: bool = True
    _sql: str | None = attrs.field(default=None, init=False, repr=False)
    _analysis: Any = attrs.field(default=None, init=False, repr=False)

    @classmethod
    def for_session(cls, session: SessionInfo, code: int, payload: bytes, complete: bool = True) -> CommandInfo:
        return cls(code, payload, complete, session.dialect, session.no_backslash_escapes, session.multi_statements)

    @property
    def sql(self) -> str | None:
        """Statement text of COM_QUERY / COM_STMT_PREPARE, else None. Lossless: bytes that are
        not UTF-8 appear as lone surrogates and ``rewrite`` turns them back into the same bytes."""
        if self._sql is None and self.code in _TEXT_COMMANDS:
            self._sql = self.payload[1:].decode("utf-8", "surrogateescape")
        return self._sql

    @property
    def analysis(self) -> sqltext.Analysis | None:
        """Every statement of the text, judged as the server will run it
        (``proxy.sqltext.analyze``); None for commands without text. A statement that starts
        right with INSERT/REPLACE/UPDATE/DELETE and cannot be followed by another is
        judged by its verb alone (the hot path). ``analysis.unknown`` says what could not be
        judged: treat such a command as able to do anything."""
        if self._analysis is None and self.code in _TEXT_COMMANDS:
            multi = self.multi_statements and self.code == COM_QUERY
            verb = fast_verb(self.payload, multi)
            if verb in _DML_ANALYSIS and (self.complete or not multi):
                self._analysis = _DML_ANALYSIS[verb]
            else:
                self._analysis = sqltext.analyze(
                    self.sql or "", dialect=self.dialect, no_backslash_escapes=self.no_backslash_escapes, multi=multi
                )
                if not self.complete and self._analysis.unknown is None:
                    self._analysis = attrs.evolve(self._analysis, unknown="only the head of this large command is known")
        return self._analysis

    @property
    def kind(self) -> sqltext.Kind | None:
        """``proxy.sqltext.Kind`` of the (first) statement (COM_QUERY / COM_STMT_PREPARE), else
        None; OTHER when the text cannot be judged."""
        analysis = self.analysis
        if analysis is None:
            return None
        return analysis.first.kind if analysis.unknown is None else sqltext.Kind.OTHER

    def keywords(self, n: int = 2, statement: int = 0) -> tuple[str, ...]:
        """The first ``n`` keywords of a statement, upper-cased, skipping comments and reading
        inside executable comments that run; () for commands without text."""
        analysis = self.analysis
        if analysis is None:
            return ()
        if analysis.text == "" and analysis in _DML_ANALYSIS.values():  # judged by its verb alone
            head = self.payload[1 : 1 + _KEYWORDS_HEAD].decode("utf-8", "surrogateescape")
            try:
                return sqltext.leading_keywords(head, n, dialect=self.dialect, nbe=self.no_backslash_escapes)
            except sqltext.SqlParseError:
                return ()
        return analysis.keywords(statement, n)

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
