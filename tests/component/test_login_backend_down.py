"""Logging in while the backend is down (issue 22): the client is greeted and its credentials
judged by the proxy first, whatever the backend's state; then the login waits for the backend
up to recovery.buffer_window, as a request does. Memory streams, autojump clock."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio

from proxy.protocol.constants import Capabilities
from proxy.protocol.packets import parse_server_handshake
from tests.component.fakes import FakeClient, MySQLError, make_config
from tests.component.rig import Rig


@pytest.fixture
def rig(make_rig: Callable[..., Rig]) -> Rig:
    """A backend that is down from the start: the proxy has never seen it."""
    rig = make_rig(make_config(recovery={"buffer_window": "10s"}), peer="10.0.0.1:5000")
    rig.server.up = False
    return rig


async def timed_login(rig: Rig, password: str = "apppw") -> tuple[FakeClient | MySQLError, float]:
    """(the logged-in client or the error it got, how long the login took)."""
    client = await rig.client(login=False)
    started = trio.current_time()
    try:
        await client.login(password=password)
    except MySQLError as exc:
        return exc, trio.current_time() - started
    return client, trio.current_time() - started


async def test_a_wrong_password_gets_1045_at_once_while_the_backend_is_down(rig, autojump):
    err, took = await timed_login(rig, password="wrong")
    assert isinstance(err, MySQLError) and err.code == 1045, err
    assert took < 0.5  # not after a wait for the backend
    assert rig.server.connections == []  # the backend was never logged into


async def test_the_greeting_comes_first_and_offers_no_tls_without_listen_tls(rig, autojump):
    """An ERR in place of the greeting is what the mariadb 10.11 client (ssl on by default)
    reports as "Received error packet before completion of TLS handshake"."""
    client = await rig.client(login=False)
    hs = parse_server_handshake(await client._read_packet())
    assert hs.server_version == "8.0.11-replay-proxy"  # listen.server_version: the backend is not known yet
    assert not hs.capabilities & Capabilities.CLIENT_SSL
    # nothing that changes the layout of relayed packets before the backend says it has it
    assert not hs.capabilities & (Capabilities.CLIENT_DEPRECATE_EOF | Capabilities.CLIENT_SESSION_TRACK)


async def test_a_login_waits_for_a_backend_that_comes_back_within_the_window(nursery, rig, autojump):

    async def come_back() -> None:
        await trio.sleep(4)
        rig.server.up = True

    nursery.start_soon(come_back)
    client, took = await timed_login(rig)
    assert isinstance(client, FakeClient), client
    assert 4 <= took < 6
    await client.must("INSERT INTO t VALUES (1, 'a')")
    assert rig.server.db.rows == {1: "a"}
    # the backend is known now: the next greeting is its own
    later = await rig.client(login=False)
    assert parse_server_handshake(await later._read_packet()).server_version == "10.11.0-fake"


async def test_a_login_gets_1105_once_the_window_is_over(rig, autojump):
    err, took = await timed_login(rig)
    assert isinstance(err, MySQLError) and err.code == 1105, err
    assert 9.5 <= took <= 11
    assert "tried for 10s, recovery.buffer_window" in err.message and "connect again once the backend is up" in err.message
