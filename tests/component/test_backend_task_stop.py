"""An upgrade stops a session's backend task before it hands the backend connection over
(``BackendTask.stop``), only where the task waits between responses: stopped in the
middle of recovery after a loss it had just seen, the session was left half recovered, and
the task started again read a closed socket (seen once in 37 upgrades beside TiDB restarts:
``ValueError: file descriptor cannot be a negative integer``). Busy, it says so and goes on."""

from __future__ import annotations

import trio

from tests.component.fakes import make_config
from tests.component.rig import Rig


def config():
    return make_config(backend={"health_interval": 0}, recovery={"buffer_window": 60, "backoff_initial": 0.5, "backoff_max": 1})


async def test_an_idle_backend_task_stops_where_it_waits(nursery, autojump):
    rig = Rig(nursery, config())
    c = await rig.client()
    await c.must("SET sql_mode = ANSI")
    [session] = rig.proxy.target.sessions
    await trio.sleep(0.1)
    assert await session.backend_task.stop() is True
    session.backend_task.start()  # an upgrade that did not take it: the session goes on
    assert (await c.must("SELECT @@sql_mode")).rows == ["ANSI"]


async def test_a_backend_task_in_recovery_is_not_stopped(nursery, autojump):
    rig = Rig(nursery, config())
    c = await rig.client()
    await c.must("SET sql_mode = ANSI")
    [session] = rig.proxy.target.sessions
    rig.server.up = False
    rig.backend_of().close()  # the server went away: the backend task recovers (reconnects, with backoff)
    await trio.sleep(0.2)
    assert await session.backend_task.stop() is False
    rig.server.up = True
    with trio.fail_after(30):
        assert (await c.must("SELECT @@sql_mode")).rows == ["ANSI"]  # recovered, as if no upgrade had asked
    assert session.link.up
