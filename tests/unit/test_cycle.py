"""proxy.cycle.CommandCycle, sans-IO: scripted exchanges -- a command's bytes in, the server's
bytes in, what the cycle makes of them -- the way the fast lane drives it, no sockets; its phases
as a table; what it leaves to the slow lane."""

from __future__ import annotations

import struct

import pytest

from proxy.cycle.answers import Failed, LostTransaction
from proxy.cycle.cycle import TRANSITIONS, CommandCycle, CycleError, Phase
from proxy.cycle.inflight import MARKER_DUE, NOT_SENT, SENT
from proxy.protocol.framing import encode_packet
from proxy.protocol.packets import make_err
from proxy.protocol.resultset import build_text_result
from proxy.session.info import SessionInfo
from proxy.session.intake import Command, whole_command
from proxy.session.tracker import AUTOCOMMIT, SessionTracker
from proxy.sqltext import ServerReading

P = Phase
NAMES = {value: name for name, value in vars(Phase).items() if name.isupper() and isinstance(value, int)}

# The server's answers, as they come off the wire (golden bytes: length, sequence id, payload).
OK_IN_TX = bytes.fromhex("0700000100010003000000")  # OK, 1 row, IN_TRANS|AUTOCOMMIT
OK_BEGIN = bytes.fromhex("0700000100000003000000")  # OK, 0 rows, IN_TRANS|AUTOCOMMIT
OK_COMMIT = bytes.fromhex("0700000100000002000000")  # OK, 0 rows, AUTOCOMMIT
# SELECT 1: column count, one column definition, EOF, one row, EOF.
COLUMN = b"\x03def\x00\x00\x00\x011\x00\x0c\x3f\x00\x01\x00\x00\x00\x08\x81\x00\x00\x00\x00"
RESULT = build_text_result([COLUMN], [[b"1"]], AUTOCOMMIT, False, 1)


class Link:
    """What the cycle reads of the backend link."""

    def __init__(self, up: bool = True) -> None:
        self.up = up


class Markers:
    def __init__(self, on: bool) -> None:
        self.on = on


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def tracker() -> SessionTracker:
    t = SessionTracker(SessionInfo(1, "test", "app", "127.0.0.1:1", reading=ServerReading(multi=False)), 1 << 20, 1000)
    t.logged_in("app", "test", 45, AUTOCOMMIT)
    t.backend_changed("127.0.0.1:3306", "5.5.5-10.11.19-MariaDB")
    return t


def cycle(markers: bool | None = None, up: bool = True) -> CommandCycle:
    return CommandCycle(tracker(), Link(up), Clock(), Markers(markers) if markers is not None else None)


def query(sql: str) -> Command:
    """The client's frames for a COM_QUERY, read whole the way the fast lane reads them."""
    payload = b"\x03" + sql.encode()
    cmd = whole_command(encode_packet(payload, 0)[0], 1 << 24, 4 << 20)
    assert cmd is not None
    return cmd


def run(c: CommandCycle, cmd: Command, answer: bytes) -> list[str]:
    """One command through the cycle as the fast lane carries it: taken, sent, answered."""
    inflight = c.fast_command(cmd, False)
    assert inflight is not None, "the fast lane takes it"
    c.take(inflight)
    assert c.phase == P.SENT and c.inflight is inflight
    c.sent(inflight)
    assert inflight.tracker.feed(answer) == len(answer)
    captures = c.finish(inflight)
    c.done(inflight)
    assert c.phase == P.IDLE and c.inflight is None
    return captures


def test_the_table_has_a_row_for_every_phase_and_names_each_next_phase():
    assert len(TRANSITIONS) == len(NAMES) == len(P.NAMES)
    assert all(NAMES[i] == P.NAMES[i] for i in NAMES)
    assert all(after in NAMES for moves in TRANSITIONS for after in moves.values())


@pytest.mark.parametrize("phase", sorted(NAMES))
def test_an_event_the_table_refuses_raises_and_changes_nothing(phase):
    c = cycle()
    c.phase = phase  # (the cycle's own writer is _go; the test stands it anywhere)
    for event in ("send", "forward", "complete", "answer", "park", "lose", "resume", "hand_over", "stay", "close"):
        if event in TRANSITIONS[phase]:
            continue
        with pytest.raises(CycleError, match=f"{event} is not allowed while {P.NAMES[phase]}"):
            c._go(event)
        assert c.phase == phase


def test_a_transaction_goes_through_idle_sent_idle_and_is_journaled():
    c = cycle()
    clock = c.now
    run(c, query("START TRANSACTION"), OK_BEGIN)
    clock.now = 101.5
    replace = query("REPLACE INTO t (id, v) VALUES (1, 'a')")
    inflight = c.fast_command(replace, False)
    assert inflight is not None and inflight.verb == b"REPLACE" and inflight.state is NOT_SENT
    assert (c.phase, c.commands, c.inflight) == (P.IDLE, 1, None)  # nothing changes before take
    c.take(inflight)
    c.sent(inflight)
    assert inflight.state is SENT and c.commands == 2
    assert inflight.tracker.feed(OK_IN_TX) == len(OK_IN_TX)
    assert c.finish(inflight) == [] and c.last_activity == 101.5
    c.done(inflight)
    tx = c.tracking.tx
    assert tx.active and tx.writes and [e.payload for e in tx.entries] == [b"\x03START TRANSACTION", replace.payload]
    commit = c.fast_command(query("COMMIT"), False)
    assert commit is not None and commit.look_first  # a COMMIT of writes: its connection is looked at first
    c.take(commit)
    c.sent(commit)
    commit.tracker.feed(OK_COMMIT)
    c.finish(commit)
    c.done(commit)
    assert not tx.active and c.phase == P.IDLE and c.commands == 3


def test_an_answer_in_pieces_is_forwarded_then_completed():
    c = cycle()
    inflight = c.fast_command(query("SELECT 1"), False)
    assert inflight is not None and not inflight.look_first
    c.take(inflight)
    c.sent(inflight)
    for piece in (RESULT[:9], RESULT[9:30]):  # the column count, then part of its definition
        assert inflight.tracker.feed(piece) == -1
        c.forward(inflight)
        assert c.phase == P.STREAMING and inflight.forwarded
    assert inflight.tracker.feed(RESULT[30:]) == len(RESULT) - 30
    c.finish(inflight)
    c.done(inflight)
    assert c.phase == P.IDLE and inflight.tracker.rows == 1


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        ("KILL 1000000007", "a KILL names the proxy's connection id: the slow lane translates it"),
        ("SELECT @@max_allowed_packet", "go-sql-driver's question: the slow lane may answer the proxy's limit"),
        ("SELECT " + "x" * (256 << 10), "a text this long is judged in a thread"),
    ],
)
def test_what_the_fast_lane_leaves_to_the_slow_lane(sql, why):
    c = cycle()
    cmd = query(sql)
    assert c.fast_command(cmd, False) is None, why
    assert (c.phase, c.commands, c.inflight) == (P.IDLE, 0, None)


def test_other_commands_and_unknown_statements_are_the_slow_lanes():
    c = cycle()
    ping = Command(b"\x0e", encode_packet(b"\x0e", 0)[0], 0, 1)
    execute = b"\x17" + struct.pack("<IBI", 7, 0, 1)  # statement 7: never prepared here
    assert c.fast_command(ping, False) is None
    assert c.fast_command(Command(execute, encode_packet(execute, 0)[0], 0, len(execute)), False) is None


def test_a_commit_of_writes_says_its_marker_is_due_when_commit_markers_are_on():
    on, off = cycle(markers=True), cycle(markers=False)
    for c in (on, off):
        run(c, query("BEGIN"), OK_BEGIN)
        run(c, query("INSERT INTO t VALUES (1)"), OK_IN_TX)
    commit = on.fast_command(query("COMMIT"), False)
    assert commit is not None and commit.marker == MARKER_DUE  # its marker is written first
    assert on.inflight is None and on.phase == P.IDLE  # nothing changed yet
    commit = off.fast_command(query("COMMIT"), False)
    assert commit is not None and commit.marker == 0
    read_only = cycle(markers=True)
    run(read_only, query("BEGIN"), OK_BEGIN)
    run(read_only, query("SELECT 1"), OK_IN_TX)
    commit = read_only.fast_command(query("COMMIT"), False)
    assert commit is not None and commit.marker == 0  # nothing written: no marker


def test_a_command_waits_while_the_link_is_down_and_goes_when_recovery_is_over():
    c = cycle(up=False)
    inflight = c.start(query("SELECT 1"), None, b"SELECT", None, False, False)
    assert c.dispatch(inflight) is False and c.phase == P.PARKED  # recovery, a move or a new connection sends it
    c.lose()
    assert c.phase == P.RECOVERING
    c.resume()  # recovery is over, the command still waits: parked again until it goes
    assert c.phase == P.PARKED and c.inflight is inflight
    c.resend(inflight)
    assert c.phase == P.SENT


def test_recovery_answers_the_command_in_flight_and_goes_on():
    c = cycle()
    inflight = c.fast_command(query("UPDATE t SET v = 1 WHERE id = 1"), False)
    c.take(inflight)
    c.sent(inflight)
    c.lose()
    assert c.count_loss() == 1 and c.count_loss() == 2
    c.answered(inflight)
    assert inflight.answered and c.inflight is None and c.phase == P.RECOVERING  # recovery goes on
    c.resume()
    assert c.phase == P.IDLE
    run(c, query("SELECT 1"), RESULT)
    assert c.losses_in_a_row == 0  # a command completed: the losses are no longer in a row


def test_idled_out_counts_the_sessions_own_wait_timeout_before_the_servers():
    c = cycle()
    c.last_activity = 100.0
    assert c.idled_out(28800.0, 105.0) is None
    assert c.idled_out(5.0, 104.5) == 5.0  # idle for about the server's wait_timeout
    run(c, query("SET SESSION wait_timeout = 60"), bytes.fromhex("0700000100000002000000"))
    assert c.tracking.session_wait == 60.0
    assert c.idled_out(5.0, c.last_activity + 30) is None and c.idled_out(5.0, c.last_activity + 59) == 60.0


def test_the_clock_is_trios_own_without_a_call_when_its_offset_is_known():
    c = CommandCycle(tracker(), Link(), lambda: pytest.fail("not called"), None, clock_offset=1000.0)
    import time

    before = time.perf_counter() + 1000.0
    assert before <= c.time() <= time.perf_counter() + 1000.0


def test_the_first_answers_owed_to_the_next_command():
    c = cycle()
    lost = make_err(1213, "40001", "Deadlock found when trying to get lock; try restarting transaction")
    c.owe(LostTransaction(lost))
    rollback = c.owed_reply(query("ROLLBACK"), False)
    assert rollback is not None and rollback.frames == bytes.fromhex("0700000100000002000000") and rollback.close is None
    assert c.first_answer is None  # taken
    c.owe(LostTransaction(lost))
    other = c.owed_reply(query("INSERT INTO t VALUES (1)"), False)
    assert other is not None and other.frames == encode_packet(lost, 1)[0]
    c.owe(Failed(make_err(1158, "08S01", "Lost connection to backend")))
    failed = c.owed_reply(query("SELECT 1"), False)
    assert failed is not None and failed.close == "Lost connection to backend"
    assert c.owed_reply(query("SELECT 1"), False) is None  # nothing owed any more
