"""The fast lane (proxy.relay.fastlane) in the real proxy, run as trio's guest in uvloop, over
socket pairs (tests/component/lanes.py): what it carries without waking a task, and each way a
session passes to the slow lane and back."""

from __future__ import annotations

import pytest
import trio

from proxy.relay.fastlane import FastLane
from tests.component.fakes import make_config
from tests.component.lanes import LaneRig, Wakes, hosted


def test_a_session_with_a_host_loop_has_a_fast_lane():
    async def body(rig: LaneRig) -> None:
        await rig.client()
        assert isinstance(rig.session().lane, FastLane)

    hosted(body)


def test_commands_and_their_answers_wake_no_task():
    """Autocommit writes, transactions, reads: carried from the host loop's callbacks."""

    async def body(rig: LaneRig) -> None:
        c = await rig.client()
        await c.must("SELECT COUNT(*) FROM t")  # the tasks park in the lane
        with Wakes() as wakes:
            for i in range(50):
                await c.must(f"INSERT INTO t VALUES ({i}, 'v{i}')")
            for _ in range(10):
                await c.must("START TRANSACTION")
                await c.must("UPDATE c SET n = n + 1")
                await c.must("COMMIT")
            assert (await c.must("SELECT n FROM c")).rows == ["10"]
            assert (await c.must("SELECT v FROM t WHERE k = 7")).rows == ["v7"]
        assert sum(wakes.steps.values()) == 0, wakes.steps
        assert rig.session().cycle.commands == 83

    hosted(body)


MARKERS = make_config(recovery={"commit_marker": True})


def intercept_once(match: bytes, action: str):
    """The fake server's intercept: the first command holding ``match`` gets ``action``."""
    fired: list[bytes] = []

    async def intercept(conn, payload: bytes) -> str | None:
        if not fired and match in payload:
            fired.append(payload)
            return action
        return None

    return intercept, fired


def test_a_commit_marker_and_its_commit_wake_no_task():
    """A COMMIT of writes with commit markers on: the lane writes the marker, and sends the
    COMMIT when the marker's OK comes, from the callbacks."""

    async def body(rig: LaneRig) -> None:
        c = await rig.client()
        await c.must("SELECT COUNT(*) FROM t")
        with Wakes() as wakes:
            for i in range(3):
                await c.must("START TRANSACTION")
                await c.must(f"INSERT INTO t VALUES ({i}, 'a')")
                await c.must("COMMIT")
        assert sum(wakes.steps.values()) == 0, wakes.steps
        db = rig.server.db
        assert db.rows == {0: "a", 1: "a", 2: "a"} and db.commits == 3 and list(db.markers.values()) == [3]
        assert rig.session().cycle.commands == 10  # the COMMITs counted once each, the markers not

    hosted(body, config=MARKERS)


def test_a_command_that_waits_goes_to_the_slow_lane_and_the_next_ones_come_back():
    """A statement the slow lane rewrites (KILL, here refused by the server) wakes the client
    task; the statements after it are the fast lane's again."""

    async def body(rig: LaneRig) -> None:
        c = await rig.client()
        await c.must("SELECT COUNT(*) FROM t")
        rig.server.intercept, _ = intercept_once(b"KILL", "error_1095")
        with Wakes() as wakes:
            assert (await c.query("KILL 12345")).code == 1095
        assert wakes.steps["client_task"] > 0, wakes.steps
        with Wakes() as wakes:
            for i in range(2, 12):
                await c.must(f"INSERT INTO t VALUES ({i}, 'v')")
        assert sum(wakes.steps.values()) == 0, wakes.steps

    hosted(body)


def test_a_commit_marker_refused_is_the_commits_answer():
    """The marker is the deadlock victim: the client's COMMIT gets the 1213 and is never sent,
    as in the slow lane; the session goes on."""

    async def body(rig: LaneRig) -> None:
        c = await rig.client()
        await c.must("START TRANSACTION")
        await c.must("INSERT INTO t VALUES (1, 'a')")
        rig.server.intercept, fired = intercept_once(b"commit_markers (slot, txn)", "deadlock")
        result = await c.query("COMMIT")
        assert fired and result.code == 1213 and "Deadlock" in result.message
        db = rig.server.db
        assert "COMMIT" not in rig.server.queries and db.rows == {} and db.commits == 0
        await c.must("START TRANSACTION")
        await c.must("INSERT INTO t VALUES (1, 'a')")
        await c.must("COMMIT")
        assert db.rows == {1: "a"} and db.commits == 1

    hosted(body, config=MARKERS)


@pytest.mark.parametrize("action", ["drop", "run_then_drop"])
def test_a_connection_lost_under_a_commit_marker_is_recovered_and_the_commit_goes_once(action):
    """The server goes away before or after running the marker, its answer unsent: recovery
    brings the transaction back (the client task finishes the COMMIT), applied exactly once."""

    async def body(rig: LaneRig) -> None:
        c = await rig.client()
        await c.must("START TRANSACTION")
        await c.must("INSERT INTO t VALUES (1, 'a')")
        await c.must("UPDATE c SET n = n + 1")
        rig.server.intercept, fired = intercept_once(b"commit_markers (slot, txn)", action)
        assert (await c.query("COMMIT")).ok
        db = rig.server.db
        assert fired and rig.session().recoveries == 1
        assert db.rows == {1: "a"} and db.counter == 1 and db.commits == 1

    hosted(body, config=MARKERS)


def test_a_commit_answer_lost_after_its_marker_is_settled_by_the_marker():
    async def body(rig: LaneRig) -> None:
        await trio.sleep(1)  # the server up before the session: its old connection is KILLed
        c = await rig.client()
        await c.must("START TRANSACTION")
        await c.must("INSERT INTO t VALUES (1, 'a')")
        rig.server.intercept, fired = intercept_once(b"COMMIT", "run_then_drop")
        assert (await c.query("COMMIT")).ok  # no 1158: the marker says it committed
        db = rig.server.db
        assert fired and db.rows == {1: "a"} and db.commits == 1

    hosted(body, config=MARKERS)


def test_a_command_pipelined_behind_a_commit_goes_after_it():
    """The client's next command arrives while the COMMIT waits for its marker: the client
    task sends the COMMIT first, then the command."""

    async def body(rig: LaneRig) -> None:
        c = await rig.client()
        await c.must("START TRANSACTION")
        await c.must("INSERT INTO t VALUES (1, 'a')")
        frames = b""
        for payload in (b"\x03COMMIT", b"\x03SELECT COUNT(*) FROM t"):
            frames += bytes([len(payload), 0, 0, 0]) + payload
        await c.stream.send_all(frames)
        assert (await c.read_result()).ok
        assert (await c.read_result()).rows == ["1"]
        assert rig.server.db.commits == 1

    hosted(body, config=MARKERS)


def test_a_commit_sent_as_the_client_closes_still_commits():
    """A client that sends COMMIT and closes at once: the COMMIT goes after its marker, as it
    would reach a server directly."""

    async def body(rig: LaneRig) -> None:
        c = await rig.client()
        await c.must("START TRANSACTION")
        await c.must("INSERT INTO t VALUES (1, 'a')")
        await c.stream.send_all(b"\x07\x00\x00\x00\x03COMMIT")
        await c.stream.aclose()
        for _ in range(200):
            if rig.server.db.commits:
                break
            await trio.sleep(0.01)
        assert rig.server.db.rows == {1: "a"} and rig.server.db.commits == 1

    hosted(body, config=MARKERS)


def test_a_command_and_an_answer_bigger_than_the_sockets_buffers_are_finished_by_the_tasks():
    """What a socket does not take at once, the task that waits sends: the client task the rest
    of a command, the backend task the rest of an answer. Every byte arrives, in order."""

    async def body(rig: LaneRig) -> None:
        c = await rig.client()
        value = "".join(chr(ord("a") + i % 26) for i in range(3_000_000))
        await c.must(f"INSERT INTO t VALUES (1, '{value}')")
        assert rig.server.db.rows[1] == value
        assert (await c.must("SELECT v FROM t WHERE k = 1")).rows == [value]
        assert (await c.must("SELECT COUNT(*) FROM t")).rows == ["1"]

    hosted(body, config=make_config(limits={"spool_threshold": 8 << 20}))


def test_a_server_that_closes_while_the_lane_waits_is_recovered_before_the_next_command():
    async def body(rig: LaneRig) -> None:
        c = await rig.client()
        await c.must("INSERT INTO t VALUES (1, 'a')")
        first = rig.backend_of()
        first.close()  # a reset, as after a crash: the callback reads it, the backend task recovers
        assert (await c.must("SELECT COUNT(*) FROM t")).rows == ["1"]
        assert rig.backend_of() is not first and rig.session().recoveries == 1
        with Wakes() as wakes:  # back in the fast lane on the new connection
            await c.must("INSERT INTO t VALUES (2, 'b')")
        assert sum(wakes.steps.values()) == 0, wakes.steps

    hosted(body)


def test_a_reset_right_behind_an_answer_is_seen_while_the_lane_waits():
    """A server that answers and resets at once (a crash right behind its last bytes, on TCP):
    the backend task hears of the reset while it waits in the lane, and the next command goes
    to a new connection. (libuv's own watch of the socket ended at the reset without a call,
    and the next command was sent into the dead connection and waited forever: the chaos
    tests' stuck sessions.)"""

    async def body(rig: LaneRig) -> None:
        c = await rig.client()
        await c.must("SELECT COUNT(*) FROM t")

        async def answer_then_drop(conn, payload: bytes) -> str | None:
            return "answer_then_drop" if payload.endswith(b"(1, 'a')") else None

        rig.server.intercept = answer_then_drop
        await c.must("INSERT INTO t VALUES (1, 'a')")
        for _ in range(100):  # the backend task recovers while the client is idle
            if rig.session().recoveries:
                break
            await trio.sleep(0.01)
        assert rig.session().recoveries == 1
        await c.must("INSERT INTO t VALUES (2, 'b')")
        assert rig.server.db.rows == {1: "a", 2: "b"}

    hosted(body, timeout=10, tcp=True)


def test_a_read_lost_with_its_connection_is_sent_again():
    async def body(rig: LaneRig) -> None:
        c = await rig.client()
        await c.must("INSERT INTO t VALUES (42, 'x')")
        dropped: list[int] = []

        async def drop_once(conn, payload: bytes) -> str | None:
            if payload.endswith(b"WHERE k = 42") and not dropped:
                dropped.append(conn.id)
                return "drop"
            return None

        rig.server.intercept = drop_once
        assert (await c.must("SELECT v FROM t WHERE k = 42")).rows == ["x"]
        assert dropped and rig.session().recoveries == 1

    hosted(body)


def test_a_command_trickling_in_is_read_by_the_client_task_and_answered():
    async def body(rig: LaneRig) -> None:
        c = await rig.client()
        await c.must("INSERT INTO t VALUES (7, 'seven')")
        payload = b"\x03SELECT v FROM t WHERE k = 7"
        for byte in bytes([len(payload), 0, 0, 0]) + payload:  # one byte per read: no read holds it whole
            await c.stream.send_all(bytes([byte]))
            await trio.sleep(0.001)
        assert (await c.read_result()).rows == ["seven"]
        assert (await c.must("SELECT COUNT(*) FROM t")).rows == ["1"]

    hosted(body)


def test_pipelined_commands_are_answered_in_order():
    async def body(rig: LaneRig) -> None:
        c = await rig.client()
        for i in range(10):
            await c.must(f"INSERT INTO t VALUES ({i}, 'v{i}')")
        frames = b""
        for i in range(10):
            payload = b"\x03SELECT v FROM t WHERE k = %d" % i
            frames += bytes([len(payload), 0, 0, 0]) + payload
        await c.stream.send_all(frames)
        for i in range(10):
            assert (await c.read_result()).rows == [f"v{i}"]

    hosted(body)


def test_an_upgrade_stops_the_backend_task_where_it_waits_in_the_lane():
    """``BackendTask.stop`` (an upgrade's SessionMover) ends the wait of a task parked in the
    lane between two commands (``Channel.interrupt_wait``); started again, it goes on."""

    async def body(rig: LaneRig) -> None:
        c = await rig.client()
        await c.must("SELECT COUNT(*) FROM t")
        session = rig.session()
        while not session.backend_task.parked:
            await trio.sleep(0.01)
        assert await session.backend_task.stop() is True
        session.backend_task.start()
        assert (await c.must("SELECT COUNT(*) FROM t")).rows == ["0"]

    hosted(body)
