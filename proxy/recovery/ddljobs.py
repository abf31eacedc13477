"""A DDL whose answer was lost, settled from TiDB's DDL job list, as DM itself does after an
``invalid connection`` (``getDDLStatusFromTiDB``, dm/syncer/util.go).

TiDB runs a schema change as a job queued in its storage; once queued, the job runs to its end
whatever becomes of the connection and of the tidb-server that sent it. So after a loss with a
DDL in flight, the proxy reads the list on its new connection (``ADMIN SHOW DDL JOB QUERIES``
for the jobs' texts, ``ADMIN SHOW DDL JOBS`` for their states and creation times) and finds the
job by its text and database, created no earlier than the command reached the proxy, and
queued by the lost connection (the connection id TiDB 7.4 and later keep with each job,
``trace_info``): another session's job of the same text (two DM workers merging shards send
the same ALTER TABLE at once, and TiDB runs both jobs: one done, the other cancelled) is not
the one in doubt:

- done (``done`` / ``synced``): the client gets OK;
- still running: recovery waits for it, polling, up to ``recovery.ddl_job_wait`` from the
  command's arrival;
- failed or cancelled (``rollback done`` / ``cancelled``): the client gets TiDB's error for it;
- not there: it never was queued, if the old session cannot queue it any more (its server
  restarted, or it is KILLed and gone from PROCESSLIST): the DDL runs again; if nothing proves
  that, the list is read again until the window ends, then a connection error.

Only statements TiDB runs as one job are settled so (``job_text``); two jobs of the same text
since the command arrived that the job list cannot tell apart (no owner kept: TiDB before 7.4,
``mysql.tidb_ddl_*`` unreadable, an old connection unknown) leave the outcome unknown (a
connection error).
"""

from __future__ import annotations

import enum
import re
from typing import TYPE_CHECKING

import attrs

from proxy.sqltext import Kind
from proxy.sqltext.lexer import TokenKind
from proxy.sqltext.tokens import name, statement_tokens

if TYPE_CHECKING:
    from proxy.backend import Backend
    from proxy.sqltext import Analysis

__all__ = ["JobState", "Job", "job_text", "same_text", "state_of", "schemas_of", "pick", "find_job", "owners_query", "owners_of",
           "error_query", "error_of"]  # fmt: skip

# CREATE / ALTER / DROP of these are jobs (not CREATE USER, BINDING, STATISTICS, routines...).
_JOB_OBJECTS = re.compile(
    r"(?:CREATE|ALTER|DROP)\s+(?:OR\s+REPLACE\s+)?(?:(?:UNIQUE|FULLTEXT|SPATIAL|VECTOR|COLUMNAR)\s+)?"
    r"(?:(?:ALGORITHM\s*=\s*\w+|DEFINER\s*=\s*\S+|SQL\s+SECURITY\s+\w+)\s+)*"
    r"(?:TABLE|DATABASE|SCHEMA|INDEX|VIEW|SEQUENCE|PLACEMENT\s+POLICY|RESOURCE\s+GROUP)\b"
    r"|RENAME\s+TABLES?\b|TRUNCATE\b",
    re.IGNORECASE,
)
_SEARCHED = 30  # the newest jobs read: the one in doubt was queued moments ago
# ADMIN SHOW DDL JOBS: JOB_ID, DB_NAME, TABLE_NAME, JOB_TYPE, SCHEMA_STATE, SCHEMA_ID, TABLE_ID,
# ROW_COUNT, CREATE_TIME, START_TIME, END_TIME, STATE, ... (the same from TiDB 4 to 8.5.3)
_JOB_ID, _DB_NAME, _CREATE_TIME, _STATE = 0, 1, 8, 11
_DATETIME = re.compile(r"[0-9: .-]+")
_SKEW = 2  # seconds: the proxy's clock against the one TiDB stamps jobs with (PD's)


class JobState(enum.Enum):
    DONE = "done"
    RUNNING = "running"
    FAILED = "failed"


# TiDB's job states (pkg/meta/model JobState.String), by what they mean for the client.
_STATES = {
    "done": JobState.DONE,
    "synced": JobState.DONE,
    "rollback done": JobState.FAILED,
    "cancelled": JobState.FAILED,
}


@attrs.frozen
class Job:
    id: int
    state: str  # as TiDB says it
    created: float  # seconds since the epoch
    schema: str = ""  # DB_NAME: the database of what it changed
    connection: int | None = None  # the id of the connection that queued it (None: not known)

    @property
    def ended(self) -> JobState:
        """What its state means for the client (``state_of``)."""
        return state_of(self.state)


def job_text(analysis: Analysis | None) -> str | None:
    """The text TiDB keeps of the job this statement is, for matching; None when it is not one
    DDL job (several statements, CREATE USER, a temporary table, ...)."""
    if analysis is None or not analysis.single or analysis.first.kind is not Kind.DDL:
        return None
    if analysis.first.session_unrestorable is not None:  # CREATE TEMPORARY TABLE: no job
        return None
    a, b = analysis.spans[0]
    text = _bare(analysis.text[a:b])
    return text if _JOB_OBJECTS.match(text) else None


def same_text(ours: str, kept: str | None) -> bool:
    """Is ``kept`` (a job's QUERY) the statement ``ours``? TiDB keeps the statement's own text."""
    return kept is not None and _bare(kept) == ours


def _bare(text: str) -> str:
    """A statement's text without the blanks around it and a closing ';'."""
    return text.strip().rstrip(";").strip()


def state_of(state: str) -> JobState:
    """What a job's state means for the client: queueing, running, rolling back, paused,
    cancelling... are still running."""
    return _STATES.get(state.strip().lower(), JobState.RUNNING)


def schemas_of(text: str, database: str | None) -> frozenset[str]:
    """The databases a job of this statement can be in (lowercased): the session's, and every
    name the statement spells (``db.t``, ``CREATE DATABASE db``...): the same text run in
    another database at the same moment is another job."""
    names = {name(t).lower() for t in statement_tokens(text, False) if t.kind in (TokenKind.WORD, TokenKind.QUOTED_IDENT)}
    return frozenset(names | ({database.lower()} if database else set()))


def pick(
    jobs: list[Job], since: float, schemas: frozenset[str], idempotent: bool = False, connection: int | None = None
) -> Job | None | str:
    """The job of the statement: one in one of ``schemas``, created no earlier than ``since``
    (minus the clocks' skew), and, with the ``connection`` that sent it, one that connection
    queued (``ours``); None when there is none; a reason when there are several. An
    ``idempotent`` one may have been sent again (safe mode): of several, one still running,
    else the newest."""
    mine = sorted((j for j in jobs if j.created >= int(since) - _SKEW and j.schema.lower() in schemas), key=lambda j: j.id)
    if connection is not None:
        mine = ours(mine, connection)
    if len(mine) > 1 and idempotent:
        return next((j for j in mine if j.ended is JobState.RUNNING), mine[-1])
    if len(mine) > 1:
        return f"{len(mine)} DDL jobs of the same text since the command arrived ({', '.join(str(j.id) for j in mine)})"
    return mine[0] if mine else None


def ours(jobs: list[Job], connection: int) -> list[Job]:
    """Of ``jobs``, the one ``connection`` queued if it is there; else those whose owner is not
    known (another connection's job is not the one in doubt). The handshake carries a
    connection id's low 32 bits; TiDB keeps the whole id."""
    queued = [j for j in jobs if j.connection is not None and j.connection & 0xFFFFFFFF == connection]
    return queued or [j for j in jobs if j.connection is None]


async def find_job(backend: Backend, text: str, since: float, database: str | None, idempotent: bool = False,
                   connection: int | None = None) -> Job | None | str:  # fmt: skip
    """Read the newest jobs' texts, then the states, databases and creation times of those
    whose text is ``text``, and who queued them; ``pick`` the statement's (``database``: the
    session's; ``connection``: the id of the connection that sent it, if known)."""
    rows = await backend.query(f"ADMIN SHOW DDL JOB QUERIES LIMIT {_SEARCHED}")
    ids = [int(r[0]) for r in rows if r[0] is not None and same_text(text, _str(r[1]))]
    if not ids:
        return None
    listed = await backend.query(f"ADMIN SHOW DDL JOBS {_SEARCHED} WHERE JOB_ID IN ({', '.join(map(str, ids))})")
    owners = await _owners(backend, ids) if connection is not None else {}
    jobs = [Job(int(r[_JOB_ID]), _str(r[_STATE]) or "", await _epoch(backend, _str(r[_CREATE_TIME])), _str(r[_DB_NAME]) or "",
                owners.get(int(r[_JOB_ID])))
            for r in listed]  # fmt: skip
    return pick(jobs, since, schemas_of(text, database), idempotent, connection)


def owners_query(job_ids: list[int]) -> str:
    """What reads the connection that queued each job (``trace_info`` in the job's JSON, TiDB
    7.4 on): of a job that ended, from its history row; of one queued or running, from the
    queue's. One statement reads both at one snapshot: a job moving to the history meanwhile is
    in exactly one of them."""
    ids = ", ".join(str(int(i)) for i in job_ids)
    owner = "JSON_EXTRACT(CONVERT(job_meta USING utf8mb4), '$.trace_info.connection_id')"
    return (
        f"SELECT job_id, {owner} FROM mysql.tidb_ddl_history WHERE job_id IN ({ids})"
        f" UNION ALL SELECT job_id, {owner} FROM mysql.tidb_ddl_job WHERE job_id IN ({ids})"
    )


def owners_of(rows: list[list[bytes | None]]) -> dict[int, int]:
    """{job id: id of the connection that queued it} of what ``owners_query`` read (a job
    without ``trace_info`` is left out: its owner is not known)."""
    return {int(r[0]): int(r[1]) for r in rows if r[0] is not None and r[1] is not None and r[1].isdigit()}


async def _owners(backend: Backend, job_ids: list[int]) -> dict[int, int]:
    """``owners_of`` the jobs, or nothing when the tables cannot be read (no privilege on
    ``mysql``, a TiDB without them)."""
    from proxy.backend import BackendError  # here: the judgements above stay sans-IO (recovery's facts import them)

    try:
        return owners_of(await backend.query(owners_query(job_ids)))
    except BackendError:
        return {}


def error_query(job_id: int) -> str:
    """What reads TiDB's error for a failed job from its history row (the job as JSON in a
    BLOB, which JSON functions take only once converted to text)."""
    return (
        "SELECT JSON_EXTRACT(j, '$.err.code'), JSON_UNQUOTE(JSON_EXTRACT(j, '$.err.message')) FROM"
        f" (SELECT CONVERT(job_meta USING utf8mb4) AS j FROM mysql.tidb_ddl_history WHERE job_id = {int(job_id)}) AS h"
    )


def error_of(rows: list[list[bytes | None]]) -> tuple[int, str] | None:
    """The (code, message) ``error_query`` read, or None (no row, no error in it)."""
    if not rows or rows[0][0] in (None, b"null") or not rows[0][0].isdigit():
        return None
    return int(rows[0][0]), _str(rows[0][1]) or ""


async def _epoch(backend: Backend, created: str | None) -> float:
    """A CREATE_TIME (a DATETIME in the session's time zone) in seconds since the epoch,
    converted by the server in that same time zone."""
    if not created or not _DATETIME.fullmatch(created):
        return 0.0
    rows = await backend.query(f"SELECT UNIX_TIMESTAMP('{created}')")
    return float(rows[0][0]) if rows and rows[0][0] is not None else 0.0


def _str(value: bytes | None) -> str | None:
    return value.decode("utf-8", "surrogateescape") if value is not None else None
