"""throttle: token bucket per target, FIFO queue with bounds, ERR 1226 beyond (autojump clock)."""

from __future__ import annotations

import pytest
import trio

from proxy import plugintest as pt
from proxy.config import ConfigError


async def test_burst_then_rate(autojump):
    h = pt.harness("throttle", rate=10, burst=5)
    start = trio.current_time()
    for _ in range(5):
        assert await h.command("SELECT 1") is None
    assert trio.current_time() == start  # the burst goes at once
    for _ in range(10):
        assert await h.command("SELECT 1") is None
    assert trio.current_time() - start == pytest.approx(1.0)  # then 10 per second


async def test_waiters_go_in_arrival_order(autojump):
    h = pt.harness("throttle", rate=2, burst=1)
    finished: list[tuple[int, float]] = []

    async def client(i: int) -> None:
        assert await h.command(f"SELECT {i}") is None
        finished.append((i, trio.current_time()))

    async with trio.open_nursery() as nursery:
        for i in range(4):
            nursery.start_soon(client, i)
            await trio.sleep(0)  # let each one queue before the next arrives
    assert [i for i, _ in finished] == [0, 1, 2, 3]
    assert [t for _, t in finished] == pytest.approx([0, 0.5, 1.0, 1.5])


async def test_full_queue_is_refused(autojump):
    h = pt.harness("throttle", rate=1, burst=1, max_queue=2, max_wait=10, target="orders")
    verdicts: list = []

    async def client() -> None:
        verdicts.append(await h.command("SELECT 1"))

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(client)
            await trio.sleep(0)
    # one passes at once, two wait, the fourth finds the queue full
    refused = [v for v in verdicts if v is not None]
    assert len(refused) == 1 and pt.is_reject(refused[0], 1226) and refused[0].sqlstate == "42000"
    assert refused[0].message == (
        "User 'app' has exceeded the 'statements per second' resource "
        "(target orders: rate 1/s, 2 waiting, max_wait 10s; replay-proxy throttle)"
    )


async def test_wait_over_max_wait_is_refused_at_once(autojump):
    h = pt.harness("throttle", rate=1, burst=1, max_wait="1500ms", max_queue=10)
    results: list = []

    async def client() -> None:
        results.append((await h.command("SELECT 1"), trio.current_time()))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(client)
            await trio.sleep(0)
    # turns at 0 s and 1 s; the third would wait 2 s > 1.5 s: refused at once
    assert [(v is None, t) for v, t in sorted(results, key=lambda r: r[1])] == [(True, 0), (False, 0), (True, 1)]
    assert h.plugin.rejected == 1


async def test_cancelled_waiter_gives_its_turn_back(autojump):
    h = pt.harness("throttle", rate=1, burst=1)
    assert await h.command("SELECT 1") is None
    with trio.move_on_after(0.2):
        await h.command("SELECT 2")  # the client went away while waiting
    assert h.plugin.waiting == 0
    start = trio.current_time()
    assert await h.command("SELECT 3") is None
    assert trio.current_time() - start == pytest.approx(0.8)  # the turn at 1 s, not 2 s


async def test_only_statements_are_counted(autojump):
    h = pt.harness("throttle", rate=1, burst=1, max_wait=0)
    assert await h.command(pt.execute()) is None
    for other in (pt.ping(), pt.prepare("SELECT ?"), pt.command(0x19, b"\x01\x00\x00\x00")):
        assert await h.command(other) is None
    assert pt.is_reject(await h.command("SELECT 1"), 1226)


def test_runs_from_a_plain_test_under_the_harness():
    h = pt.harness("throttle", rate=100)
    assert h.plugin.burst == 100

    async def thousand() -> float:
        for _ in range(1000):
            assert await h.command("SELECT 1") is None
        return trio.current_time()

    assert pt.run(thousand) == pytest.approx(9.0)  # 100 at once, then 900 at 100/s


@pytest.mark.parametrize(
    "options, error",
    [
        ({}, r"\$\.plugins\.throttle\.rate: required key missing"),
        ({"rate": 0}, r"\$\.plugins\.throttle\.rate: expected a number greater than 0, got 0"),
        ({"rate": 5, "burst": 0}, r"\$\.plugins\.throttle\.burst: expected a number of at least 1, got 0"),
        ({"rate": 5, "max_wait": "forever"}, r"\$\.plugins\.throttle\.max_wait: expected a duration"),
    ],
)
def test_bad_options(options, error):
    with pytest.raises(ConfigError, match=error):
        pt.harness("throttle", options)
