"""The backend link as a state machine (proxy.relay.link) and recovery's judging step
(proxy.recovery.driver.judge), without sockets: fake connections, a real tracker."""

from __future__ import annotations

import logging
import types

import attrs
import pytest
import trio

from proxy.config import parse_config
from proxy.cycle.cycle import CommandCycle
from proxy.cycle.inflight import NOT_SENT, SENT, Inflight
from proxy.hooks import Hooks, Veto
from proxy.protocol.framing import encode_packet
from proxy.protocol.response import ResponseTracker, expect_for
from proxy.recovery.driver import judge
from proxy.recovery.loss import Loss
from proxy.recovery.plan import Outcome, Sent
from proxy.recovery.relayside import RECOVERY
from proxy.relay.link import BackendLink, LinkState
from proxy.relay.parts import SessionParts
from proxy.session.info import SessionInfo
from proxy.session.intake import Command
from proxy.session.tracker import AUTOCOMMIT, SessionTracker

MARIADB_VERSION = "5.5.5-10.11.19-MariaDB"


class FakeChannel:
    def __init__(self) -> None:
        self.closed = False
        self.sent: list[bytes] = []

    def send_nowait(self, data: bytes) -> None:
        self.sent.append(data)


class FakeBackend:
    def __init__(self, address: str = "127.0.0.1:3306", version: str = MARIADB_VERSION, max_packet: int = 1 << 20) -> None:
        self.address = address
        self.handshake = types.SimpleNamespace(server_version=version)
        self.max_allowed_packet = max_packet
        self.connection_id = 7
        self.channel = FakeChannel()

    def close(self) -> None:
        self.channel.closed = True


def tracker() -> SessionTracker:
    t = SessionTracker(SessionInfo(1, "test", "app", "127.0.0.1:1"), 1 << 20, 1000)
    t.logged_in("app", "test", 45, AUTOCOMMIT)
    return t


async def test_the_link_goes_through_its_states():
    t = tracker()
    link = BackendLink(t, 64 << 20)
    assert link.state is LinkState.DOWN and not link.up
    first = FakeBackend(max_packet=1 << 20)
    link.replace(first)
    assert link.state is LinkState.RESTORING and not link.up  # commands wait for the restore
    assert (link.limit, link.largest) == (1 << 20, (1 << 20) - 1)  # the backend's smaller limit
    link.ready()
    assert link.up and link.replaced.is_set()

    assert link.lost() is first and first.channel.closed
    assert link.state is LinkState.LOST and link.owes_results
    generation = t.generation
    tidb = FakeBackend(version="8.0.11-TiDB-v8.5.3", max_packet=1 << 20)
    link.replace(tidb)
    assert t.generation == generation + 1 and t.dialect.flavor == "tidb"
    assert link.largest == 1 << 20  # TiDB takes a command of exactly max_allowed_packet
    link.ready()

    # A command that runs takes the results debt once; PING does not.
    assert not link.takes_results_debt(0x0E) and link.owes_results
    assert link.takes_results_debt(0x03) and not link.owes_results
    assert not link.takes_results_debt(0x03)


async def test_a_move_keeps_the_old_connection_until_the_new_one_is_ready():
    t = tracker()
    link = BackendLink(t, 64 << 20)
    old = FakeBackend("10.0.0.1:4000")
    link.replace(old)
    link.ready()
    assert link.begin_move() is old and link.state is LinkState.MOVING and not link.replaced.is_set()
    ids = t.backend_ids()
    new = FakeBackend("10.0.0.2:4000")
    link.replace(new)
    assert link.state is LinkState.MOVING and not old.channel.closed  # still open meanwhile
    link.moved(old)
    assert link.up and link.backend is new and old.channel.closed and old.channel.sent  # COM_QUIT
    assert link.replaced.is_set()

    link.begin_move()
    link.replace(FakeBackend("10.0.0.3:4000"))
    link.move_failed(new, ids=ids)  # back to the connection it had, and to its debt (the first move's)
    assert link.up and link.backend is new and t.generation == ids[0] and link.owes_results


async def test_a_change_of_user_closes_the_connection_on_purpose():
    link = BackendLink(tracker(), 64 << 20)
    old = FakeBackend()
    link.replace(old)
    link.ready()
    link.begin_swap()
    assert link.state is LinkState.SWAPPING and link.backend is None and old.channel.closed
    link.replace(FakeBackend())
    link.ready()
    assert link.up


async def test_settled_waits_for_a_send_under_way(autojump_clock):
    link = BackendLink(tracker(), 64 << 20)
    link.sending()
    done = []

    async def wait() -> None:
        await link.settled()
        done.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        await trio.sleep(1)
        assert not done
        link.sent()
    assert done == [1.0]


# --- judge -------------------------------------------------------------------------------------

CONFIG = parse_config({"backend": {"addresses": ["127.0.0.1:3306"]}, "users": [{"name": "app", "password": "pw"}]})


def command(sql: str) -> Command:
    payload = b"\x03" + sql.encode()
    return Command(payload, encode_packet(payload, 0)[0], 0, len(payload))


def loss(t: SessionTracker, inflight: Inflight | None = None, config=CONFIG, hooks: Hooks | None = None, rejected=False) -> Loss:
    link = BackendLink(t, 64 << 20)
    link.replace(FakeBackend())
    link.ready()
    stats = types.SimpleNamespace(recovered=lambda *a: None)
    target = types.SimpleNamespace(stats=stats)
    cycle = CommandCycle(t, link, trio.current_time)
    parts = SessionParts(
        t.info.logger(logging.getLogger("test")), "127.0.0.1:1", config, link, t, target, hooks or Hooks([]), t.info, None, RECOVERY, cycle
    )
    lost = Loss(parts, "test", inflight, False, rejected)
    lost.old = link.lost()
    return lost


def in_flight(t: SessionTracker, sql: str, state: int = SENT) -> Inflight:
    verb, analysis = t.triage(b"\x03" + sql.encode())
    tracker_ = ResponseTracker(expect_for(3), False, True)
    inflight = Inflight(command(sql), tracker_, None, trio.current_time(), verb, analysis, t.reading)
    inflight.state = state
    return inflight


@pytest.mark.parametrize(
    "sql, state, rejected, sent, outcome",
    [
        ("SELECT 1", SENT, False, Sent.MAYBE_EXECUTED, Outcome.RESUME),
        ("UPDATE t SET a = 1 WHERE id = 1", SENT, False, Sent.MAYBE_EXECUTED, Outcome.FAIL_CONNECTION),  # autocommit write
        ("UPDATE t SET a = 1 WHERE id = 1", NOT_SENT, False, Sent.NOT_EXECUTED, Outcome.RESUME),
        ("UPDATE t SET a = 1 WHERE id = 1", SENT, True, Sent.NOT_EXECUTED, Outcome.RESUME),  # refused with 1053: did not run
        ("COMMIT", SENT, True, Sent.MAYBE_EXECUTED, Outcome.RESUME),  # a refused COMMIT: unknown, but no transaction here
    ],
)
async def test_decide_reads_how_far_the_command_got(sql, state, rejected, sent, outcome):
    t = tracker()
    lost = loss(t, in_flight(t, sql, state), rejected=rejected)
    plan = await judge(lost)
    assert (lost.sent, plan.outcome) == (sent, outcome)
    assert lost.parts.link.recoveries == 1 and lost.parts.cycle.losses_in_a_row == 1


async def test_decide_backs_off_and_gives_up_after_the_window_on_losses_in_a_row(autojump_clock):
    t = tracker()
    inflight = in_flight(t, "SELECT 1", NOT_SENT)
    lost = loss(t, inflight)
    lost.parts.cycle.losses_in_a_row = 3  # lost again and again before anything completed
    await trio.sleep(CONFIG.recovery.buffer_window)
    plan = await judge(lost)
    assert plan.outcome is Outcome.FAIL_RETRYABLE and "kept failing" in plan.reason
    assert trio.current_time() > CONFIG.recovery.buffer_window  # it backed off first


async def test_a_plugin_vetoes_a_replay():
    class NoReplay:
        def replay_decided(self, session, plan):
            return Veto("not today")

    t = tracker()
    lost = loss(t, in_flight(t, "SELECT 1"), hooks=Hooks([("noreplay", NoReplay())]))
    plan = await judge(lost)
    assert plan.outcome is Outcome.FAIL_CONNECTION and "not today" in plan.reason


async def test_recovery_disabled_is_a_connection_error():
    t = tracker()
    config = attrs.evolve(CONFIG, recovery=attrs.evolve(CONFIG.recovery, enabled=False))
    plan = await judge(loss(t, None, config=config))
    assert plan.outcome is Outcome.FAIL_CONNECTION
