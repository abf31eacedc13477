"""The backend link's state machine (proxy.relay.link.TRANSITIONS) as a table: every event in
every state, the allowed ones reach their next state, the others raise LinkStateError and
change nothing."""

from __future__ import annotations

import pytest
import trio

from proxy.relay.link import TRANSITIONS, BackendLink, LinkState, LinkStateError
from tests.unit.test_link import FakeBackend, tracker

S = LinkState


def new_link() -> BackendLink:
    return BackendLink(tracker(), 64 << 20)


def link_in(state: LinkState) -> BackendLink:
    """A link brought to ``state`` the way the relay brings it there."""
    link = new_link()
    if state is S.DOWN:
        return link
    if state is S.CLOSED:
        link.close()
        return link
    link.replace(FakeBackend())
    if state is not S.RESTORING:
        link.ready()
    if state is S.LOST:
        link.lost()
    elif state is S.MOVING:
        link.begin_move()
    elif state is S.SWAPPING:
        link.begin_swap()
    assert link.state is state
    return link


EVENTS = {
    "replace": lambda link: link.replace(FakeBackend("10.0.0.2:3306")),
    "ready": lambda link: link.ready(),
    "lost": lambda link: link.lost(),
    "begin_move": lambda link: link.begin_move(),
    "moved": lambda link: link.moved(link.backend),
    "move_failed": lambda link: link.move_failed(link.backend, link.tracking.backend_ids()),
    "begin_swap": lambda link: link.begin_swap(),
    "adopt_lost": lambda link: link.adopted_lost(0),
    "close": lambda link: link.close(),
}

ALLOWED = [(state, event, after) for state, moves in TRANSITIONS.items() for event, after in moves.items()]
REFUSED = [(state, event) for state in S for event in EVENTS if event not in TRANSITIONS[state]]


def test_the_table_knows_every_state_and_only_the_links_events():
    assert set(TRANSITIONS) == set(S)
    assert {event for moves in TRANSITIONS.values() for event in moves} == set(EVENTS)
    assert len(ALLOWED) + len(REFUSED) == len(S) * len(EVENTS)


@pytest.mark.parametrize(("state", "event", "after"), ALLOWED, ids=[f"{s.name}-{e}-{a.name}" for s, e, a in ALLOWED])
async def test_an_allowed_move(state, event, after):
    link = link_in(state)
    EVENTS[event](link)
    assert link.state is after
    assert link.up is (after is S.UP)


@pytest.mark.parametrize(("state", "event"), REFUSED, ids=[f"{s.name}-{e}" for s, e in REFUSED])
async def test_a_refused_move_raises_and_changes_nothing(state, event):
    link = link_in(state)
    before = (link.backend, link.owes_results, link.lost_at, link.replaced, link.limit, link.tracking.generation)
    with pytest.raises(LinkStateError, match=f"{event} is not allowed while {state.name}"):
        EVENTS[event](link)
    assert link.state is state
    assert (link.backend, link.owes_results, link.lost_at, link.replaced, link.limit, link.tracking.generation) == before


async def test_a_move_that_ends_after_the_session_closes_its_connections():
    """A move runs beside the session's tasks (Target.spawn): the session may end meanwhile."""
    link = link_in(S.UP)
    old = link.begin_move()
    link.close()  # the client went away: the old connection is closed with the session
    assert link.state is S.CLOSED and old.channel.closed
    new = FakeBackend("10.0.0.2:3306")
    link.replace(new)  # the move's connection, too late
    assert new.channel.closed and link.backend is old and link.state is S.CLOSED
    link.moved(old)
    assert link.state is S.CLOSED and not link.replaced.is_set()

    link = link_in(S.UP)
    old = link.begin_move()
    new = FakeBackend("10.0.0.2:3306")
    link.replace(new)
    link.close()  # after the move's connection came in: that one is the session's, and closed
    assert new.channel.closed and not old.channel.closed
    link.move_failed(old, link.tracking.backend_ids())
    assert old.channel.closed and link.state is S.CLOSED and link.backend is new


@pytest.mark.parametrize("state", list(S), ids=[s.name for s in S])
async def test_the_login_changes_only_before_a_connection(state):
    link = link_in(state)
    login = object()
    if state in (S.DOWN, S.SWAPPING):
        link.set_login(login)
        assert link.login is login
    else:
        with pytest.raises(LinkStateError, match="login changes only while DOWN or SWAPPING"):
            link.set_login(login)
        assert link.login is None


async def test_a_relayed_kill_is_noted_with_its_time(autojump_clock):
    link = link_in(S.UP)
    await trio.sleep(5)
    link.kill_relayed_now(42)
    assert link.kill_relayed == (42, 5.0)


async def test_a_failed_move_gives_back_the_debt_the_link_had():
    for owed in (False, True):
        link = link_in(S.UP)
        link.owes_results = owed
        old = link.begin_move()
        assert link.owes_results  # a command arriving meanwhile runs on the new connection
        link.move_failed(old, link.tracking.backend_ids())
        assert link.up and link.owes_results is owed


async def test_the_counters_other_modules_keep_through_methods():
    link = link_in(S.UP)
    link.count_recovery()
    assert link.recoveries == 1
    link.want_move()
    assert link.move_requested
    link.drop_move()
    assert not link.move_requested
    link.owes_results = True
    link.results_replayed()
    assert not link.owes_results
