"""One session's big text does not stall the others: judging a statement costs about half a
second of Python per megabyte, and the proxy is one event loop for every session, so texts of
256 KiB and more are judged in a thread (real time here: a thread does not run on trio's clock)."""

from __future__ import annotations

import time

import trio


async def test_a_big_text_is_judged_while_other_sessions_go_on(rig):
    big, small = await rig.client(), await rig.client()
    # 4 MB the fast path cannot take (a call): the whole text is lexed and judged.
    text = "SELECT COUNT(*) FROM t WHERE id IN (" + ",".join(str(i) for i in range(600_000)) + ") AND ABS(1) = 1"
    finished: dict[str, float] = {}
    started = 0.0

    async def send_big() -> None:
        await big.query(text)  # the fake server does not understand it: an ERR, after the judging
        finished["big"] = time.perf_counter()

    async def run_small() -> None:
        nonlocal started
        await trio.sleep(0.2)  # the big one is being judged by now
        started = time.perf_counter()
        for _ in range(5):
            assert (await small.must("SELECT COUNT(*) FROM t")).rows == ["0"]
        finished["small"] = time.perf_counter()
        finished["small_took"] = finished["small"] - started

    async with trio.open_nursery() as both:
        both.start_soon(send_big)
        both.start_soon(run_small)
    print(
        f"\nsmall session: 5 queries in {finished['small_took'] * 1000:.0f} ms; big text answered {finished['big'] - finished['small']:.2f} s after"
    )
    assert finished["small"] < finished["big"], ("the small session waited for the big text's judgement", finished)
