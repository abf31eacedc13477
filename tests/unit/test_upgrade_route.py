"""POST /upgrade on the admin endpoint (proxy.admin.upgrade_route): the method each route
takes, the answers for a done, failed and busy upgrade, the token, and the time the route
gets (a new process's start, not the 5 s of the other routes)."""

from __future__ import annotations

import json

import trio

from proxy.admin import _answer, json_answer, upgrade_route
from proxy.handover.upgrade import START_TIMEOUT, Outcome, UpgradeFailed


class FakeUpgrader:
    def __init__(self, result: Outcome | UpgradeFailed) -> None:
        self.result = result
        self.asked: list[str] = []

    async def upgrade(self, why: str) -> Outcome:
        self.asked.append(why)
        if isinstance(self.result, UpgradeFailed):
            raise self.result
        return self.result


def table(upgrader: FakeUpgrader) -> dict:
    return {"/status": lambda: json_answer(200, {"ok": True}), "/upgrade": upgrade_route(upgrader)}


def no_token() -> None:
    return None


async def test_each_route_takes_its_own_method():
    upgrader = FakeUpgrader(UpgradeFailed("unused"))
    assert (await _answer(b"POST /status HTTP/1.0\r\n\r\n", table(upgrader), no_token))[::2] == (405, b"GET only\n")
    assert (await _answer(b"GET /upgrade HTTP/1.0\r\n\r\n", table(upgrader), no_token))[::2] == (405, b"POST only\n")
    assert (await _answer(b"POST /nothing HTTP/1.0\r\n\r\n", table(upgrader), no_token))[0] == 405  # as before: GET only
    assert (await _answer(b"GET /nothing HTTP/1.0\r\n\r\n", table(upgrader), no_token))[0] == 404
    assert upgrader.asked == []


async def test_the_answers_of_a_done_failed_and_busy_upgrade():
    done = FakeUpgrader(Outcome(10, 11, ["client 127.0.0.1:4000", "admin 127.0.0.1:14000"], 3, 1.25))
    status, _, body = await _answer(b"POST /upgrade HTTP/1.0\r\nContent-Length: 0\r\n\r\n", table(done), no_token)
    assert status == 200 and done.asked == ["admin request"]
    assert json.loads(body) == {"upgraded": True, "old_pid": 10, "new_pid": 11, "listeners": ["client 127.0.0.1:4000",
                                "admin 127.0.0.1:14000"], "sessions_left_to_drain": 3, "seconds": 1.25}  # fmt: skip
    status, _, body = await _answer(b"POST /upgrade HTTP/1.0\r\n\r\n", table(FakeUpgrader(UpgradeFailed("bad config"))), no_token)
    assert status == 500 and json.loads(body)["error"] == "bad config" and json.loads(body)["upgraded"] is False
    busy = FakeUpgrader(UpgradeFailed("an upgrade is already under way", busy=True))
    assert (await _answer(b"POST /upgrade HTTP/1.0\r\n\r\n", table(busy), no_token))[0] == 409


async def test_the_token_guards_the_upgrade():
    upgrader = FakeUpgrader(UpgradeFailed("unused"))
    assert (await _answer(b"POST /upgrade HTTP/1.0\r\n\r\n", table(upgrader), lambda: "s3cret"))[0] == 401
    request = b"POST /upgrade HTTP/1.0\r\nAuthorization: Bearer s3cret\r\n\r\n"
    assert (await _answer(request, table(upgrader), lambda: "s3cret"))[0] == 500 and upgrader.asked == ["admin request"]


async def test_the_upgrade_gets_the_time_of_a_start():
    upgrader = FakeUpgrader(UpgradeFailed("x"))
    with trio.move_on_after(5) as deadline:
        await _answer(b"GET /status HTTP/1.0\r\n\r\n", table(upgrader), no_token, deadline)
        assert deadline.deadline <= trio.current_time() + 5
        await _answer(b"POST /upgrade HTTP/1.0\r\n\r\n", table(upgrader), no_token, deadline)
        assert deadline.deadline >= trio.current_time() + START_TIMEOUT
