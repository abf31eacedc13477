"""proxy.recovery.plan.plan_recovery as a table: what was happening -> what the proxy does."""

from __future__ import annotations

import pytest

from proxy.recovery.plan import Outcome, Sent, StatementFacts, marker_plan, plan_recovery

R, RESOLVE, RETRY, FAIL = Outcome.RESUME, Outcome.RESOLVE, Outcome.FAIL_RETRYABLE, Outcome.FAIL_CONNECTION
RESOLVE_DDL = Outcome.RESOLVE_DDL
MAYBE, NOT, PARTIAL = Sent.MAYBE_EXECUTED, Sent.NOT_EXECUTED, Sent.PARTIAL_RESPONSE

READ = StatementFacts(writes=False)
WRITE = StatementFacts()
IDEMPOTENT_WRITE = StatementFacts(idempotent=True)
SESSION = StatementFacts(writes=False, idempotent=True, session_only=True)
COMMIT = StatementFacts(commits=True, writes=False, idempotent=True)
ROLLBACK = StatementFacts(rollback=True, writes=False, idempotent=True)
DDL = StatementFacts(commits=True)
DDL_JOB = StatementFacts(commits=True, ddl_job=True)  # one DDL that TiDB runs as a job
IDEMPOTENT_DDL_JOB = StatementFacts(commits=True, ddl_job=True, idempotent=True)  # ALTER TABLE t AUTO_INCREMENT = 5
UNKNOWN = StatementFacts(commits=True, unknown="not understood")

# (what, overrides, outcome, replay, resend)
TABLE = [
    ("idle, no transaction", dict(), R, False, False),
    ("read in flight", dict(sent=MAYBE, inflight=READ), R, False, True),
    ("SET in flight", dict(sent=MAYBE, inflight=SESSION), R, False, True),
    ("autocommit write in flight", dict(sent=MAYBE, inflight=WRITE), FAIL, False, False),
    ("autocommit write not sent", dict(sent=NOT, inflight=WRITE), R, False, True),
    ("autocommit write in flight, safe mode, idempotent", dict(sent=MAYBE, inflight=IDEMPOTENT_WRITE, safe_mode=True), R, False, True),
    ("write in flight, autocommit off: only opened a transaction", dict(sent=MAYBE, inflight=WRITE, autocommit=False), R, False, True),
    ("DDL in flight, autocommit off", dict(sent=MAYBE, inflight=DDL, autocommit=False), FAIL, False, False),
    ("unknown text in flight", dict(sent=MAYBE, inflight=UNKNOWN), FAIL, False, False),
    ("unknown text never sent", dict(sent=NOT, inflight=UNKNOWN), R, False, True),
    ("part of a result relayed", dict(sent=PARTIAL, inflight=READ), FAIL, False, False),
    ("session not restorable", dict(unrestorable="GET_LOCK"), FAIL, False, False),
    ("in a transaction, idle", dict(in_transaction=True, journal=[WRITE]), R, True, False),
    ("in a transaction, write in flight", dict(in_transaction=True, journal=[WRITE], sent=MAYBE, inflight=WRITE), R, True, True),
    ("in a transaction, not replayable", dict(in_transaction=True, not_replayable="journal full"), RETRY, False, False),
    ("in a transaction, in doubt", dict(in_transaction=True, journal=[WRITE], in_doubt="CALL p()"), FAIL, False, False),
    ("idle, in doubt", dict(in_doubt="XA PREPARE"), FAIL, False, False),
    ("ROLLBACK in flight", dict(in_transaction=True, journal=[WRITE], sent=MAYBE, inflight=ROLLBACK), R, False, True),
    ("COMMIT in flight", dict(in_transaction=True, journal=[WRITE], sent=MAYBE, inflight=COMMIT), FAIL, False, False),
    ("COMMIT in flight, nothing written", dict(in_transaction=True, journal=[READ], sent=MAYBE, inflight=COMMIT), R, True, True),
    (
        "COMMIT in flight, safe mode, idempotent",
        dict(in_transaction=True, journal=[IDEMPOTENT_WRITE], sent=MAYBE, inflight=COMMIT, safe_mode=True),
        R,
        True,
        True,
    ),
    (
        "COMMIT in flight, safe mode, one write not idempotent",
        dict(in_transaction=True, journal=[IDEMPOTENT_WRITE, WRITE], sent=MAYBE, inflight=COMMIT, safe_mode=True),
        FAIL,
        False,
        False,
    ),
    (
        "COMMIT in flight, commit marker",
        dict(in_transaction=True, journal=[WRITE], sent=MAYBE, inflight=COMMIT, commit_marker=True),
        RESOLVE,
        True,
        True,
    ),
    (
        "COMMIT in flight, marker, not replayable",
        dict(in_transaction=True, not_replayable="cursor", sent=MAYBE, inflight=COMMIT, commit_marker=True),
        RESOLVE,
        False,
        True,
    ),
    (
        "COMMIT in flight, marker, in doubt",
        dict(in_transaction=True, in_doubt="CALL", sent=MAYBE, inflight=COMMIT, commit_marker=True),
        FAIL,
        False,
        False,
    ),
    ("COMMIT not sent", dict(in_transaction=True, journal=[WRITE], sent=NOT, inflight=COMMIT), R, True, True),
    # A DDL in doubt: TiDB's job list tells (ddl_jobs), else what any write in doubt gets.
    ("DDL in flight, no job list (MariaDB)", dict(sent=MAYBE, inflight=DDL_JOB), FAIL, False, False),
    ("DDL in flight, job list", dict(sent=MAYBE, inflight=DDL_JOB, ddl_jobs=True), RESOLVE_DDL, False, True),
    ("DDL never sent, job list", dict(sent=NOT, inflight=DDL_JOB, ddl_jobs=True), R, False, True),
    ("DDL not one job in flight (CREATE USER), job list", dict(sent=MAYBE, inflight=DDL, ddl_jobs=True), FAIL, False, False),
    (
        "DDL in flight, job list, safe mode, idempotent",
        dict(sent=MAYBE, inflight=IDEMPOTENT_DDL_JOB, safe_mode=True, ddl_jobs=True),
        RESOLVE_DDL,
        False,
        True,
    ),
    ("DDL in flight, no job list, safe mode, idempotent", dict(sent=MAYBE, inflight=IDEMPOTENT_DDL_JOB, safe_mode=True), R, False, True),
    (
        "DM's BEGIN + DDL in flight, job list",
        dict(in_transaction=True, journal=[READ], sent=MAYBE, inflight=DDL_JOB, ddl_jobs=True),
        RESOLVE_DDL,
        True,
        True,
    ),
    (
        "DDL in flight after a write, job list: its implicit commit may have committed it",
        dict(in_transaction=True, journal=[WRITE], sent=MAYBE, inflight=DDL_JOB, ddl_jobs=True),
        FAIL,
        False,
        False,
    ),
    (
        "DDL in flight, transaction not replayable, job list",
        dict(in_transaction=True, not_replayable="cursor", sent=MAYBE, inflight=DDL_JOB, ddl_jobs=True),
        FAIL,
        False,
        False,
    ),
    (
        # A worker's crash took the journal, and the tracker knows the transaction wrote nothing
        # (DM's BEGIN + DDL): its implicit commit commits nothing.
        "DDL in flight, transaction not replayable but known to have written nothing, job list",
        dict(in_transaction=True, not_replayable="the worker died", wrote=False, sent=MAYBE, inflight=DDL_JOB, ddl_jobs=True),
        RESOLVE_DDL,
        False,
        True,
    ),
    (
        "DDL in flight, transaction not replayable and known to have written, job list",
        dict(in_transaction=True, not_replayable="the worker died", wrote=True, sent=MAYBE, inflight=DDL_JOB, ddl_jobs=True),
        FAIL,
        False,
        False,
    ),
    (
        "DDL in flight, session not restorable, job list",
        dict(sent=MAYBE, inflight=DDL_JOB, ddl_jobs=True, unrestorable="GET_LOCK"),
        FAIL,
        False,
        False,
    ),
    ("DDL in flight, partly answered, job list", dict(sent=PARTIAL, inflight=DDL_JOB, ddl_jobs=True), FAIL, False, False),
    ("maybe rolled back, idle", dict(in_transaction=True, journal=[WRITE], maybe_rolled_back="error 1205"), RETRY, False, False),
    (
        "maybe rolled back, read in flight",
        dict(in_transaction=True, journal=[WRITE], maybe_rolled_back="error 1205", sent=MAYBE, inflight=READ),
        RETRY,
        False,
        False,
    ),
    (
        "maybe rolled back, write in flight",
        dict(in_transaction=True, journal=[WRITE], maybe_rolled_back="error 1205", sent=MAYBE, inflight=WRITE),
        FAIL,
        False,
        False,
    ),
]


@pytest.mark.parametrize("what, overrides, outcome, replay, resend", TABLE, ids=[row[0] for row in TABLE])
def test_plan(what, overrides, outcome, replay, resend):
    args = dict(sent=None, inflight=None, in_transaction=False, journal=[], not_replayable=None, unrestorable=None,
                autocommit=True, safe_mode=False)  # fmt: skip
    args.update(overrides)
    plan = plan_recovery(**args)
    assert (plan.outcome, plan.replay, plan.resend) == (outcome, replay, resend), plan.reason
    if plan.outcome is R and plan.replay and (overrides.get("safe_mode") and overrides.get("inflight") is COMMIT):
        assert not plan.verify  # an idempotent replay after a possible commit legitimately differs


@pytest.mark.parametrize("commit_marker", [True, False])
def test_a_safe_mode_commit_plan_falls_back_to_the_marker_only_with_one(commit_marker):
    """Safe mode goes first (it needs no word about the old connection); a marker, when the
    COMMIT has one, is what its failed proof falls back to."""
    plan = plan_recovery(sent=MAYBE, inflight=COMMIT, in_transaction=True, journal=[IDEMPOTENT_WRITE], not_replayable=None,
                         unrestorable=None, autocommit=True, safe_mode=True, commit_marker=commit_marker)  # fmt: skip
    assert (plan.outcome, plan.proof, plan.marker_fallback) == (R, True, commit_marker)
    fallback = marker_plan()
    assert (fallback.outcome, fallback.replay, fallback.verify, fallback.resend, fallback.proof) == (RESOLVE, True, True, True, False)
