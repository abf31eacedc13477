"""proxy.recovery.replay.resolve_ddl against a scripted TiDB: how long it waits and when it
gives up (the matrix and test_ddl_jobs run it against a real tidb-server)."""

from __future__ import annotations

import time

import pytest
import trio

from proxy.backend import BackendError
from proxy.cycle.inflight import ConnectionFailed
from proxy.hooks import Hooks
from proxy.recovery.facts import facts_of
from proxy.recovery.replay import resolve_ddl
from tests.unit.test_link import CONFIG, FakeBackend
from tests.unit.test_recovery_driver import safe_mode_loss

DDL = "ALTER TABLE t ADD COLUMN note INT"


class ScriptedTiDB(FakeBackend):
    """Answers the job list's queries: ``jobs`` (id, state, database) of the statement's text,
    ``states`` a function of the number of readings so far (a job that ends later); ``owners``
    {job id: the connection that queued it} (TiDB's ``trace_info``; None: the tables that keep
    it cannot be read)."""

    def __init__(self, jobs: list[tuple[int, str, str]], text: str = DDL, address: str = "127.0.0.1:4001",
                 owners: dict[int, int] | None = None) -> None:  # fmt: skip
        super().__init__(address)
        self.jobs, self.text, self.readings, self.owners = jobs, text, 0, owners if owners is not None else {}
        self.unreadable = owners is None

    async def query(self, sql: str, columns=None) -> list[list[bytes | None]]:
        if sql.startswith("ADMIN SHOW DDL JOB QUERIES"):
            self.readings += 1
            return [[str(j).encode(), self.text.encode()] for j, _, _ in self.jobs]
        if sql.startswith("ADMIN SHOW DDL JOBS"):
            created = b"2026-12-02 12:00:00"
            return [[str(j).encode(), db.encode(), b"t", b"add column", b"", b"1", b"2", b"0", created, created, None,
                     (state(self.readings) if callable(state) else state).encode(), b""]
                    for j, state, db in self.jobs]  # fmt: skip
        if sql.startswith("SELECT UNIX_TIMESTAMP("):
            return [[str(time.time()).encode()]]
        if "trace_info" in sql:
            if self.unreadable:
                raise BackendError("SELECT command denied to user 'dm'@'%' for table 'tidb_ddl_history'", retryable=False)
            return [[str(j).encode(), str(self.owners[j]).encode() if j in self.owners else b"null"] for j, _, _ in self.jobs]
        if "tidb_ddl_history WHERE job_id" in sql:  # the failed job's error
            return [[b"1060", b"Duplicate column name 'note'"]]
        raise AssertionError(f"unexpected query {sql!r}")


async def loss_on(backend: ScriptedTiDB, safe_mode: bool = False, sql: str = DDL):
    lost = safe_mode_loss(Hooks([]), sql, journal=[])
    lost.parts.tracking.safe_mode = safe_mode
    lost.old.address = "127.0.0.1:4002"  # the killed server: another one, nothing there proves it dead
    lost.inflight.facts = await facts_of(lost.inflight, safe_mode, lost.answers)
    return lost


async def test_a_running_job_is_waited_for_until_it_ends(autojump_clock):
    backend = ScriptedTiDB([(57, lambda n: "running" if n < 4 else "synced", "test")])
    lost = await loss_on(backend)
    job, error = await resolve_ddl(lost, backend)
    assert (job.id, job.state, error) == (57, "synced", None)
    assert backend.readings == 4 and trio.current_time() >= 1.5  # read every 0.5 s


async def test_a_missing_job_the_old_session_may_still_queue_ends_in_1158_after_the_window(autojump_clock):
    backend = ScriptedTiDB([])
    lost = await loss_on(backend)
    with pytest.raises(ConnectionFailed, match="may still queue it"):
        await resolve_ddl(lost, backend)
    assert trio.current_time() >= CONFIG.recovery.buffer_window


async def test_a_missing_idempotent_ddl_is_sent_again_at_once_in_safe_mode(autojump_clock):
    backend = ScriptedTiDB([], text="ALTER TABLE t AUTO_INCREMENT = 5")
    lost = await loss_on(backend, safe_mode=True, sql="ALTER TABLE t AUTO_INCREMENT = 5")
    assert await resolve_ddl(lost, backend) == (None, None)
    assert backend.readings == 1


OURS = 7  # the lost connection's id (FakeBackend's)


async def test_two_jobs_of_the_text_whose_owners_are_not_known_leave_the_outcome_unknown(autojump_clock):
    backend = ScriptedTiDB([(57, "synced", "test"), (58, "synced", "test")], owners=None)  # trace_info unreadable
    with pytest.raises(ConnectionFailed, match=r"cannot be told apart: 2 DDL jobs of the same text .* \(57, 58\)"):
        await resolve_ddl(await loss_on(backend), backend)
    backend = ScriptedTiDB([(57, "synced", "test"), (58, "synced", "test")], owners={})  # TiDB before 7.4: no trace_info
    with pytest.raises(ConnectionFailed, match="cannot be told apart"):
        await resolve_ddl(await loss_on(backend), backend)


# Two DM workers merging shards send the same ALTER TABLE at once: TiDB queues both jobs, runs
# one, and rolls the other back (1060). Each proxy's session gets its own job's outcome.
@pytest.mark.parametrize(
    "jobs, owners, expected",
    [
        ([(145, "synced", "test"), (146, "rollback done", "test")], {145: OURS, 146: 2097160}, (145, None)),
        (
            [(145, "synced", "test"), (146, "rollback done", "test")],
            {145: 2097160, 146: OURS},
            (146, (1060, "Duplicate column name 'note'")),
        ),
        ([(145, "synced", "test"), (146, "synced", "test")], {145: 2097160, 146: OURS}, (146, None)),  # two done: ours
        ([(145, "synced", "test"), (146, "synced", "test")], {145: 2097160}, (146, None)),  # the other's known, ours without an owner
        ([(145, "synced", "test"), (146, "synced", "test")], {145: OURS | 1 << 40, 146: 2097160}, (145, None)),  # a 64-bit id
    ],
    ids=["ours-done-theirs-rolled-back", "ours-rolled-back-theirs-done", "two-done", "one-owner-unknown", "64-bit-connection-id"],
)
async def test_of_two_jobs_of_the_text_the_one_the_lost_connection_queued_is_the_one(autojump_clock, jobs, owners, expected):
    backend = ScriptedTiDB(jobs, owners=owners)
    job, error = await resolve_ddl(await loss_on(backend), backend)
    assert (job.id, error) == expected


async def test_another_sessions_job_of_the_text_is_not_the_one_in_doubt(autojump_clock):
    """Only another connection's job of the same text: the DDL in doubt was never queued (it
    is looked for until the window ends, its old session's end unprovable here)."""
    backend = ScriptedTiDB([(145, "synced", "test")], owners={145: 2097160})
    with pytest.raises(ConnectionFailed, match="not in TiDB's DDL job list"):
        await resolve_ddl(await loss_on(backend), backend)


async def test_the_same_text_in_another_database_is_not_the_job(autojump_clock):
    backend = ScriptedTiDB([(57, "synced", "other")])
    with pytest.raises(ConnectionFailed, match="not in TiDB's DDL job list"):
        await resolve_ddl(await loss_on(backend), backend)


async def test_a_job_running_past_ddl_job_wait_ends_in_1158(autojump_clock):
    backend = ScriptedTiDB([(57, "running", "test")])
    with pytest.raises(ConnectionFailed, match="still running after 600s"):
        await resolve_ddl(await loss_on(backend), backend)
    assert trio.current_time() >= CONFIG.recovery.ddl_job_wait


async def test_a_job_queued_by_the_old_session_just_before_its_end_is_found(autojump_clock, monkeypatch):
    """The list read, then the old session proven gone: it may have queued the job in between,
    so the list is read once more before the DDL is sent again (a second run: 1060)."""
    backend = ScriptedTiDB([])

    async def gone_after_queueing(*args) -> bool:
        backend.jobs.append((57, "synced", "test"))
        return True

    monkeypatch.setattr("proxy.recovery.replay.old_session_gone", gone_after_queueing)
    job, error = await resolve_ddl(await loss_on(backend), backend)
    assert (job.id, error) == (57, None) and backend.readings == 2
