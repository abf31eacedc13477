"""Recovery's driver without sockets: what it does after each step, as tables
(proxy.recovery.moves, pure), and the facts it reads, computed once (proxy.recovery.facts)."""

from __future__ import annotations

import logging
import types

import pytest
import trio

from proxy.cycle.cycle import CommandCycle
from proxy.cycle.inflight import ConnectionFailed
from proxy.hooks import Hooks
from proxy.protocol.response import Expect
from proxy.recovery import moves
from proxy.recovery.ddljobs import JobState
from proxy.recovery.driver import judge
from proxy.recovery.facts import PluginAnswers, facts_of
from proxy.recovery.loss import Loss
from proxy.recovery.moves import GiveUp, Move, Then
from proxy.recovery.plan import Outcome, Plan, Sent
from proxy.recovery.proofs import unproven
from proxy.recovery.relayside import RECOVERY
from proxy.relay.link import BackendLink
from proxy.relay.parts import SessionParts
from proxy.session.transaction import JournalEntry
from tests.unit.test_link import CONFIG, FakeBackend, in_flight, tracker

R, RESOLVE, RETRY, FAIL = Outcome.RESUME, Outcome.RESOLVE, Outcome.FAIL_RETRYABLE, Outcome.FAIL_CONNECTION
MAYBE, NOT, PARTIAL = Sent.MAYBE_EXECUTED, Sent.NOT_EXECUTED, Sent.PARTIAL_RESPONSE


# --- how far the command in flight got ---------------------------------------------------------

# (what, unsent, forwarded, rejected, commits, sent)
HOW_FAR = [
    ("part of its answer relayed", False, True, False, False, PARTIAL),
    ("relayed, then refused: still partial", False, True, True, False, PARTIAL),
    ("never (fully) sent", True, False, False, False, NOT),
    ("sent, no answer", False, False, False, False, MAYBE),
    ("refused with 1053/1927: did not run", False, False, True, False, NOT),
    ("a refused COMMIT: unknown", False, False, True, True, MAYBE),
]


@pytest.mark.parametrize("what, unsent, forwarded, rejected, commits, sent", HOW_FAR, ids=[row[0] for row in HOW_FAR])
def test_how_far(what, unsent, forwarded, rejected, commits, sent):
    assert moves.how_far(unsent, forwarded, rejected, commits) is sent


# --- lost again before anything succeeded --------------------------------------------------------


@pytest.mark.parametrize("losses, delay", [(1, None), (2, 0.1), (3, 0.2), (4, 0.4), (10, 1.0)])
def test_backoff_delay_doubles_up_to_its_maximum(losses, delay):
    assert moves.backoff_delay(losses, 0.1, 1.0) == delay


RESUME = Plan(R, "transaction replay", replay=True, resend=True)
# (what, sent, waited, expected: an Outcome, the given plan (None), or GiveUp)
AFTER_BACKOFF = [
    ("nothing in flight", None, None, None),
    ("in flight, within its window", MAYBE, 4.9, None),
    ("not sent, window passed: 1213", NOT, 5.0, RETRY),
    ("may have run, window passed: connection error", MAYBE, 5.0, GiveUp),
    ("partly answered, window passed: connection error", PARTIAL, 6.0, GiveUp),
]


@pytest.mark.parametrize("what, sent, waited, expected", AFTER_BACKOFF, ids=[row[0] for row in AFTER_BACKOFF])
def test_after_backoff(what, sent, waited, expected):
    got = moves.after_backoff(RESUME, sent, waited, 5.0)
    if expected is None:
        assert got is RESUME
    elif expected is GiveUp:
        assert isinstance(got, GiveUp) and "kept failing for 5s" in got.reason
    else:
        assert got.outcome is expected and "kept failing for 5s" in got.reason


# --- the plugins' veto ---------------------------------------------------------------------------

# (what, plan, veto, in_transaction, asked, outcome)
VETO = [
    ("a replay, no veto", RESUME, None, True, True, R),
    ("a replay vetoed: known not committed, 1213", RESUME, "no", True, True, RETRY),
    ("a resend vetoed outside a transaction", Plan(R, "x", resend=True), "no", False, True, FAIL),
    ("COMMIT in flight vetoed (no verify): connection error", Plan(R, "x", replay=True, verify=False, resend=True), "no", True, True, FAIL),
    ("idle, nothing runs again: not asked", Plan(R, "idle"), None, False, False, R),
    ("a connection error: not asked", Plan(FAIL, "x"), None, False, False, FAIL),
    ("a RESOLVE: not asked", Plan(RESOLVE, "x", replay=True, resend=True), None, True, False, RESOLVE),
]


@pytest.mark.parametrize("what, plan, veto, in_transaction, asked, outcome", VETO, ids=[row[0] for row in VETO])
def test_veto(what, plan, veto, in_transaction, asked, outcome):
    assert moves.asks_veto(plan) is asked
    got = moves.vetoed(plan, veto, in_transaction)
    assert got.outcome is outcome
    assert (got is plan) is (veto is None)
    if veto is not None:
        assert "replay vetoed by a plugin: no" in got.reason


# --- what follows each step ----------------------------------------------------------------------

# (what, step, arguments, move)
NEXT = [
    ("plan: connection error", moves.opening, (FAIL, True), Move.FAIL),
    ("plan: 1213, a command in flight: it gets it now", moves.opening, (RETRY, True), Move.ANSWER_1213),
    ("plan: 1213, idle: the next command gets it", moves.opening, (RETRY, False), Move.OWE_1213),
    ("plan: resume", moves.opening, (R, True), Move.RECONNECT),
    ("plan: resolve", moves.opening, (RESOLVE, True), Move.RECONNECT),
    ("window passed: the lost command, may have run", moves.after_wait, (True, True), Move.FAIL),
    ("window passed: the lost command, did not run", moves.after_wait, (True, False), Move.ANSWER_1213),
    ("window passed: a command sent meanwhile", moves.after_wait, (False, True), Move.ANSWER_1213),
    ("restored, COMMIT in doubt", moves.after_restore, (RESOLVE, False), Move.RESOLVE),
    ("restored again, the marker asked already", moves.after_restore, (RESOLVE, True), Move.REPLAY),
    ("restored, resume", moves.after_restore, (R, False), Move.REPLAY),
    ("the marker: committed", moves.after_marker, (True, True), Move.ANSWER_OK),
    ("the marker: not committed, replayable", moves.after_marker, (False, True), Move.REPLAY),
    ("the marker: not committed, not replayable", moves.after_marker, (False, False), Move.OWE_1213),
    ("restored, DDL in doubt", moves.after_restore, (Outcome.RESOLVE_DDL, False), Move.RESOLVE),
    ("restored again, DDL in doubt: its job list is read again", moves.after_restore, (Outcome.RESOLVE_DDL, True), Move.RESOLVE),
    ("the DDL's job: done", moves.after_ddl_job, (JobState.DONE,), Move.ANSWER_OK),
    ("the DDL's job: failed", moves.after_ddl_job, (JobState.FAILED,), Move.ANSWER_ERR),
    ("the DDL: never queued, cannot be now", moves.after_ddl_job, (None,), Move.REPLAY),
    ("replayed as the client saw it", moves.after_replay, (False,), Move.FINISH),
    ("replay differed: 1213 owed", moves.after_replay, (True,), Move.OWE_1213),
]


@pytest.mark.parametrize("what, step, arguments, move", NEXT, ids=[row[0] for row in NEXT])
def test_what_follows_each_step(what, step, arguments, move):
    assert step(*arguments) is move


# (what, waiting_unsent, owed, piece_sent_here, then)
THEN = [
    ("nothing waits", False, False, False, Then.NOTHING),
    ("nothing waits, 1213 owed: the next command hears it", False, True, False, Then.NOTHING),
    ("a command waits: it goes out", True, False, False, Then.SEND),
    ("a command waits, 1213 owed: it gets it", True, True, False, Then.ANSWER_OWED),
    ("long data the restore sent already", True, False, True, Then.COMPLETE),
    ("long data sent already, 1213 owed", True, True, True, Then.ANSWER_OWED),
]


@pytest.mark.parametrize("what, waiting_unsent, owed, piece_sent_here, then", THEN, ids=[row[0] for row in THEN])
def test_what_the_waiting_command_gets(what, waiting_unsent, owed, piece_sent_here, then):
    assert moves.then(waiting_unsent, owed, piece_sent_here) is then


# --- facts, once ---------------------------------------------------------------------------------


class Idempotent:
    """A plugin that vouches for every statement, and counts what it was asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def is_idempotent(self, session, sql):
        self.asked.append(sql)
        return True


UPDATES = ["UPDATE t SET a = 1 WHERE id = 1", "UPDATE t SET a = 2 WHERE id = 2"]


def safe_mode_loss(hooks: Hooks, sql_in_flight: str | None = None, journal: list[str] = UPDATES) -> Loss:
    """A loss in safe mode, with a transaction of ``journal`` open (if any)."""
    t = tracker()
    t.safe_mode = True
    link = BackendLink(t, 64 << 20)
    link.replace(FakeBackend())
    link.ready()
    stats = types.SimpleNamespace(recovered=lambda *a: None)
    parts = SessionParts(t.info.logger(logging.getLogger("test")), "127.0.0.1:1", CONFIG, link, t, types.SimpleNamespace(stats=stats),
                         hooks, t.info, None, RECOVERY, CommandCycle(t, link, trio.current_time))  # fmt: skip
    if journal:
        t.tx.start(None)
    for sql in journal:
        t.tx.record(JournalEntry(b"\x03" + sql.encode(), Expect.QUERY, None, reading=t.reading))
    lost = Loss(parts, "test", in_flight(t, sql_in_flight) if sql_in_flight else None, False)
    lost.old = link.lost()
    return lost


async def test_facts_are_computed_once_and_kept_with_the_command():
    plugin = Idempotent()
    hooks = Hooks([("idem", plugin)])
    lost = safe_mode_loss(hooks)
    entry = lost.parts.tracking.tx.entries[0]
    assert entry.facts is None  # the hot path computed nothing
    facts = await facts_of(entry, True, lost.answers)
    assert facts.idempotent and entry.facts is facts
    assert await facts_of(entry, True, PluginAnswers(hooks, lost.parts.info)) is facts  # another loss reads them again
    assert plugin.asked == UPDATES[:1]


async def test_the_plugins_are_asked_once_per_statement_per_loss():
    plugin = Idempotent()
    hooks = Hooks([("idem", plugin)])
    lost = safe_mode_loss(hooks, "COMMIT")
    plan = await judge(lost)
    assert plan.outcome is R and plan.proof  # COMMIT in flight, the transaction idempotent (safe mode)
    commands = [*lost.parts.tracking.tx.entries, lost.inflight]
    # The proof asks of the same texts: the loss's answers hold them already (no backend needed).
    assert await unproven(None, commands, lost.parts.tracking, None, lost.answers) is None
    assert sorted(plugin.asked) == ["COMMIT", *UPDATES]
    # A loss after the loss: the facts are kept; only the proof asks, once per text.
    again = Loss(lost.parts, "again", lost.inflight, False)
    again.old = lost.old
    plugin.asked.clear()
    assert (await judge(again)).proof
    assert await unproven(None, commands, again.parts.tracking, None, again.answers) is None
    assert sorted(plugin.asked) == UPDATES


async def test_judging_a_loss_in_a_row_backs_off_before_it_gives_up(autojump_clock):
    lost = safe_mode_loss(Hooks([]), UPDATES[0], journal=[])  # an autocommit write, sent: it may have run
    lost.parts.cycle.losses_in_a_row = 2
    await trio.sleep(CONFIG.recovery.buffer_window)
    with pytest.raises(ConnectionFailed, match="kept failing"):
        await judge(lost)
    assert trio.current_time() > CONFIG.recovery.buffer_window and lost.parts.link.recoveries == 0  # not counted


async def test_a_ddl_in_doubt_on_tidb_is_waited_for_past_the_buffer_window(autojump_clock):
    """Its job may run meanwhile whatever happens to connections (servers SIGKILLed one after
    the other while the DDL owner finishes it): judged again until recovery.ddl_job_wait."""
    lost = safe_mode_loss(Hooks([]), "ALTER TABLE t ADD COLUMN c INT", journal=[])
    link = lost.parts.link
    link.replace(FakeBackend(version="8.0.11-TiDB-v8.5.3"))  # the session is on TiDB
    link.ready()
    lost.old = link.lost()
    lost.parts.cycle.losses_in_a_row = 2
    await trio.sleep(CONFIG.recovery.buffer_window)
    assert (await judge(lost)).outcome is Outcome.RESOLVE_DDL
    await trio.sleep(CONFIG.recovery.ddl_job_wait)
    with pytest.raises(ConnectionFailed, match="kept failing for 600s"):
        await judge(lost)
