"""Recovery decisions: after the backend connection is lost, what may the proxy do?

``plan_recovery`` is a pure function of what was in flight, the open transaction and the
configuration; it encodes GUIDE §4:

1. Never acknowledge a COMMIT that did not happen; never run a non-idempotent statement twice.
2. Lost before COMMIT was sent: the transaction did not commit. Replay it and check every
   result against what the client saw.
3. Lost while COMMIT (or an autocommit write) was in flight: outcome unknown. Replay only when
   everything is idempotent (safe mode, opt-in) or nothing was written; otherwise a connection
   error.
4. What cannot be replayed becomes 1213 only when the transaction is known not to have
   committed; otherwise a connection error.
5. What the proxy cannot judge (a statement it does not understand, a stored routine, a
   transaction part of which may have committed) is never replayed or resent.
"""

from __future__ import annotations

import enum

import attrs

__all__ = ["Sent", "Outcome", "Plan", "StatementFacts", "plan_recovery", "marker_plan"]


class Sent(enum.Enum):
    """How far the in-flight command got."""

    NOT_EXECUTED = "not executed"  # never (fully) sent, or the server refused it (1053 / 1927)
    MAYBE_EXECUTED = "maybe executed"  # fully sent, no response yet: the server may have run it
    PARTIAL_RESPONSE = "partially answered"  # the client already saw part of the response


class Outcome(enum.Enum):
    RESUME = "resume"  # reconnect, restore, replay the journal (if any), resend the command
    RESOLVE = "resolve"  # COMMIT in doubt: look up its commit marker; committed → OK, else replay
    RESOLVE_DDL = "resolve-ddl"  # DDL in doubt: find its job in TiDB's list; done → OK, never queued → resend
    FAIL_RETRYABLE = "fail-retryable"  # 1213: known not committed, cannot be made transparent
    FAIL_CONNECTION = "fail-connection"  # 1158 and close: outcome unknown or state unrecoverable


@attrs.frozen
class StatementFacts:
    """What recovery needs to know about one statement."""

    commits: bool = False  # COMMIT, or commits implicitly (DDL, BEGIN inside a transaction, ...)
    rollback: bool = False  # plain ROLLBACK (not to a savepoint)
    writes: bool = True  # may change data (anything not known to be read-only)
    idempotent: bool = False  # safe to apply again after it may have been applied (safe mode)
    session_only: bool = False  # changes only session state (SET, USE, PREPARE, PING, ...)
    unknown: str | None = None  # why the proxy cannot judge it (then it may commit and write)
    ddl_job: bool = False  # one DDL statement that TiDB runs as a job (its outcome is in the job list)


@attrs.frozen
class Plan:
    outcome: Outcome
    reason: str
    replay: bool = False  # replay the journal of the open transaction
    verify: bool = True  # compare replayed results with what the client saw
    resend: bool = False  # send the in-flight command again on the new connection
    proof: bool = False  # safe mode: the tables' keys must prove idempotence before anything runs
    # A proof that fails asks the COMMIT's commit marker instead (``marker_plan``) of failing.
    marker_fallback: bool = False


def plan_recovery(
    *,
    sent: Sent | None,
    inflight: StatementFacts | None,
    in_transaction: bool,
    journal: list[StatementFacts],
    not_replayable: str | None,
    unrestorable: str | None,
    autocommit: bool,
    safe_mode: bool,
    commit_marker: bool = False,
    in_doubt: str | None = None,
    maybe_rolled_back: str | None = None,
    ddl_jobs: bool = False,
    wrote: bool | None = None,
) -> Plan:
    """Decide what happens to the session. ``sent``/``inflight`` are None when the client was
    idle; ``journal`` describes the statements of the open transaction; ``commit_marker``: the
    in-flight COMMIT wrote a marker row that tells afterwards whether it committed.
    ``in_doubt``: part of the open transaction may have committed already. ``maybe_rolled_back``:
    an error may have rolled the transaction back (no status word said yet). ``ddl_jobs``: the
    server keeps a DDL job list to read a DDL's outcome from (TiDB). ``wrote``: whether a command of the
    open transaction may have written (the tracker knows it even when the journal is gone;
    None: not known beyond the journal)."""
    if sent is Sent.PARTIAL_RESPONSE:
        return Plan(Outcome.FAIL_CONNECTION, "connection lost while the response was being relayed")
    if unrestorable is not None:
        return Plan(Outcome.FAIL_CONNECTION, f"session cannot be restored on a new connection: {unrestorable}")
    if in_doubt is not None:
        return Plan(Outcome.FAIL_CONNECTION, f"part of the transaction may have committed: {in_doubt}")
    doubtful = next((s.unknown for s in journal if s.unknown is not None), None)
    if in_transaction and doubtful is not None:
        return Plan(Outcome.FAIL_CONNECTION, f"a statement of the transaction cannot be judged: {doubtful}")
    resend = sent is not None
    maybe_ran = sent is Sent.MAYBE_EXECUTED
    if maybe_ran and inflight is not None and inflight.unknown is not None:
        return Plan(Outcome.FAIL_CONNECTION, f"the command in flight cannot be judged ({inflight.unknown}); its outcome is unknown")
    if maybe_rolled_back is not None:
        # The transaction is over either way; a write in flight may have run in autocommit.
        if maybe_ran and inflight is not None and inflight.writes:
            return Plan(Outcome.FAIL_CONNECTION, f"a write was in flight after {maybe_rolled_back}; its outcome is unknown")
        return Plan(Outcome.FAIL_RETRYABLE, f"transaction rolled back or about to be: {maybe_rolled_back}")

    if maybe_ran and ddl_jobs and inflight is not None and inflight.ddl_job:
        # Outside a transaction, or in one that wrote nothing (DM sends BEGIN, the DDL, COMMIT):
        # the job list says whether it ran, and its implicit commit ended nothing that matters.
        if not in_transaction:
            return Plan(Outcome.RESOLVE_DDL, "DDL in flight; TiDB's DDL job list will tell", resend=True)
        wrote_nothing = not any(s.writes for s in journal) and (not wrote if wrote is not None else not_replayable is None)
        if wrote_nothing:
            # Its implicit commit ends a transaction with nothing to commit: what ran before it
            # is replayed if the journal has it, and matters to nobody if it does not.
            return Plan(Outcome.RESOLVE_DDL, "DDL in flight in a transaction that wrote nothing; TiDB's DDL job list will tell",
                        replay=not_replayable is None, resend=True)  # fmt: skip

    if not in_transaction:
        if not maybe_ran or inflight is None:
            return Plan(Outcome.RESUME, "idle" if sent is None else "command had not run", resend=resend)
        if not inflight.writes or inflight.session_only or (not autocommit and not inflight.commits):
            # Reads and session changes may run twice; with autocommit off a write (not DDL) only
            # opened a transaction that died with the old connection.
            return Plan(Outcome.RESUME, "in-flight command is safe to repeat", resend=True)
        if safe_mode and inflight.idempotent:
            return Plan(Outcome.RESUME, "in-flight autocommit write is idempotent (safe mode)", resend=True, proof=True)
        return Plan(Outcome.FAIL_CONNECTION, "an autocommit write was in flight; its outcome is unknown")

    if maybe_ran and inflight is not None and inflight.rollback:
        # The old transaction rolled back with its connection; a ROLLBACK on a fresh one is a no-op.
        return Plan(Outcome.RESUME, "ROLLBACK was in flight", resend=True)

    if maybe_ran and inflight is not None and inflight.commits:
        if not_replayable is not None:
            if commit_marker:  # committed → OK; not committed → 1213
                return Plan(Outcome.RESOLVE, "COMMIT in flight; its commit marker will tell", replay=False, resend=True)
            return Plan(Outcome.FAIL_CONNECTION, f"COMMIT in flight and the transaction is not replayable: {not_replayable}")
        if not any(s.writes for s in journal) and not inflight.writes:
            return Plan(Outcome.RESUME, "COMMIT in flight for a transaction that wrote nothing", replay=True, resend=True)
        if safe_mode and inflight.idempotent and all(s.idempotent for s in journal):
            # It may have committed already; applying it again leaves the same rows. Results of
            # the replay legitimately differ (e.g. REPLACE counts 2 rows), so don't compare them.
            # Safe mode first: it needs no answer about the old connection, which a marker does.
            return Plan(Outcome.RESUME, "COMMIT in flight, transaction idempotent (safe mode)", replay=True, verify=False,
                        resend=True, proof=True, marker_fallback=commit_marker)  # fmt: skip
        if commit_marker:
            return marker_plan()
        why = "not all statements are idempotent" if safe_mode else "recovery.idempotent is not safe-mode"
        return Plan(Outcome.FAIL_CONNECTION, f"COMMIT was in flight; its outcome is unknown ({why})")

    # COMMIT was not sent: the transaction did not commit.
    if not_replayable is not None:
        return Plan(Outcome.FAIL_RETRYABLE, f"transaction rolled back and cannot be replayed: {not_replayable}")
    return Plan(Outcome.RESUME, "transaction replay", replay=True, resend=resend)


def marker_plan(reason: str = "COMMIT in flight; its commit marker will tell") -> Plan:
    """A COMMIT in doubt of a replayable transaction with a commit marker: committed → OK,
    not committed → the journal replayed and checked (rule 2)."""
    return Plan(Outcome.RESOLVE, reason, replay=True, resend=True)
