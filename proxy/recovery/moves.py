"""What recovery does next, given what its steps found: pure functions, each a table
(tests/unit/test_recovery_driver.py), as ``plan.plan_recovery`` is the plan's.

The driver (``driver.recover``) runs a step, asks one of these what follows, and does it:

- ``how_far``: how far the command in flight got;
- ``backoff_delay``, ``after_backoff``: lost again before anything succeeded: wait, and give up
  once the command's buffer window has passed;
- ``asks_veto``, ``vetoed``: whether the plugins may veto the plan, and the plan after a veto;
- ``opening``: the plan's first move (a connection error, a 1213 now or for the next command,
  or reconnect);
- ``after_wait``: a waiting command's buffer window passed while the backend stayed away;
- ``after_restore``, ``after_marker``, ``after_ddl_job``, ``after_replay``: the steps on the new
  connection;
- ``then``: what the waiting command gets once the new connection serves the session.
"""

from __future__ import annotations

import enum

import attrs

from proxy.recovery.ddljobs import JobState
from proxy.recovery.plan import Outcome, Plan, Sent

__all__ = ["Move", "Then", "GiveUp", "how_far", "backoff_delay", "after_backoff", "asks_veto", "vetoed", "opening",
           "after_wait", "after_restore", "after_marker", "after_ddl_job", "after_replay", "then"]  # fmt: skip


class Move(enum.Enum):
    FAIL = "fail"  # a connection error: the session ends
    ANSWER_1213 = "answer 1213"  # the command waiting gets a 1213 now; recovery goes on
    OWE_1213 = "owe 1213"  # the client's next command gets a 1213; recovery goes on
    RECONNECT = "reconnect"  # a new connection, the session restored on it
    RESOLVE = "resolve"  # ask the COMMIT's marker whether it committed
    ANSWER_OK = "answer OK"  # the COMMIT did commit (the DDL ran): it gets OK, recovery is over
    ANSWER_ERR = "answer error"  # the DDL's job failed: it gets TiDB's error, recovery is over
    REPLAY = "replay"  # prove what runs again, replay the journal
    FINISH = "finish"  # the new connection serves the session


class Then(enum.Enum):
    """What the command waiting gets once the new connection serves the session."""

    NOTHING = "nothing"  # none waits to be sent
    SEND = "send"  # it goes out on the new connection
    COMPLETE = "complete"  # long data the restore sent already: it has no answer, it is complete
    ANSWER_OWED = "answer owed"  # the 1213 the client is owed


@attrs.frozen
class GiveUp:
    """The backend kept failing for the command's whole buffer window, and it may have run:
    a connection error, before recovery counts or tells anyone."""

    reason: str


def how_far(state_unsent: bool, forwarded: bool, rejected: bool, commits: bool) -> Sent:
    """How far the command in flight got. ``state_unsent``: it was not (fully) sent;
    ``forwarded``: part of its answer reached the client; ``rejected``: the server answered it
    with a going-away error; ``commits``: it is a COMMIT (or commits implicitly)."""
    if forwarded:
        return Sent.PARTIAL_RESPONSE
    if state_unsent:
        return Sent.NOT_EXECUTED
    if rejected and not commits:
        return Sent.NOT_EXECUTED  # a statement refused with 1053/1927 did not run (a COMMIT: unknown)
    return Sent.MAYBE_EXECUTED


def backoff_delay(losses_in_a_row: int, initial: float, maximum: float) -> float | None:
    """How long to wait before reconnecting: None the first time; after a loss in a row (a
    server that accepts connections but refuses every command while it drains), longer each
    time instead of spinning."""
    if losses_in_a_row <= 1:
        return None
    return min(maximum, initial * 2 ** (losses_in_a_row - 2))


def after_backoff(plan: Plan, sent: Sent | None, waited: float | None, window: float) -> Plan | GiveUp:
    """The plan once the backoff is over. ``waited``: how long the command in flight has waited
    (None: nothing in flight); past its buffer window it is given up."""
    if waited is None or waited < window:
        return plan
    why = f"backend kept failing for {window:g}s"
    if sent is Sent.MAYBE_EXECUTED or sent is Sent.PARTIAL_RESPONSE:
        return GiveUp(why)
    return Plan(Outcome.FAIL_RETRYABLE, why)


def asks_veto(plan: Plan) -> bool:
    """Do the plugins get to veto this plan (it runs something again)?"""
    return plan.outcome is Outcome.RESUME and (plan.replay or plan.resend)


def vetoed(plan: Plan, veto: str | None, in_transaction: bool) -> Plan:
    """The plan after the plugins' verdict (``veto``: its reason, None: no veto)."""
    if veto is None:
        return plan
    if plan.verify and in_transaction:  # COMMIT was not in flight: known not committed
        return Plan(Outcome.FAIL_RETRYABLE, f"replay vetoed by a plugin: {veto}")
    return Plan(Outcome.FAIL_CONNECTION, f"replay vetoed by a plugin: {veto}")


def opening(outcome: Outcome, in_flight: bool) -> Move:
    """The plan's first move. A transaction known lost is a 1213 at once, for the command in
    flight or the client's next one: nothing will bring it back; the session reconnects all
    the same."""
    if outcome is Outcome.FAIL_CONNECTION:
        return Move.FAIL
    if outcome is Outcome.FAIL_RETRYABLE:
        return Move.ANSWER_1213 if in_flight else Move.OWE_1213
    return Move.RECONNECT


def after_wait(lost_command: bool, may_have_run: bool) -> Move:
    """A waiting command's buffer window passed while the backend stayed away. It is
    ``lost_command``, the one in flight at the loss (else one the client sent meanwhile), and
    ``may_have_run``: it may have run, and the plan would run it again."""
    if lost_command and may_have_run:
        return Move.FAIL
    return Move.ANSWER_1213  # then the session reconnects still


def after_restore(outcome: Outcome, resolved: bool) -> Move:
    """The session is restored on a new connection. ``resolved``: its marker was asked already
    (on a connection that failed since: it is not asked again; a DDL's job list is read again)."""
    if outcome is Outcome.RESOLVE_DDL:
        return Move.RESOLVE
    return Move.RESOLVE if outcome is Outcome.RESOLVE and not resolved else Move.REPLAY


def after_marker(committed: bool, replay: bool) -> Move:
    """The COMMIT's marker said whether it committed; ``replay``: the plan can replay its
    transaction (else a 1213 for it)."""
    if committed:
        return Move.ANSWER_OK
    return Move.REPLAY if replay else Move.OWE_1213


def after_ddl_job(ended: JobState | None) -> Move:
    """The DDL in doubt's job ``ended`` so (None: it never was queued, and cannot be any more)."""
    if ended is JobState.DONE:
        return Move.ANSWER_OK
    if ended is JobState.FAILED:
        return Move.ANSWER_ERR
    return Move.REPLAY  # then it is sent again


def after_replay(owed: bool) -> Move:
    """The journal replayed; ``owed``: it did not reproduce what the client saw (the client is
    owed a 1213)."""
    return Move.OWE_1213 if owed else Move.FINISH


def then(waiting_unsent: bool, owed: bool, piece_sent_here: bool) -> Then:
    """What the command waiting gets once the new connection serves the session.
    ``waiting_unsent``: a command waits to be sent; ``owed``: the client is owed a 1213;
    ``piece_sent_here``: it is long data the restore sent on this connection already."""
    if not waiting_unsent:
        return Then.NOTHING
    if owed:
        return Then.ANSWER_OWED
    if piece_sent_here:
        return Then.COMPLETE
    return Then.SEND
