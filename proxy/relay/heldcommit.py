"""A COMMIT's commit marker in the fast lane (``fastlane``): the marker's upsert goes from the
callback that read the COMMIT (``send_marker_first``), the COMMIT from the callback that reads
the marker's whole OK (``HeldCommit.answer``). Never pipelined: a refused marker must stop the
COMMIT. Whatever else comes meanwhile -- an error, a partial answer, a loss, the client's next
bytes or its close -- hands the COMMIT to the client task, which finishes it as the slow lane
does (``commands.commit_after_marker``) before anything else. Compiled with the fast lane.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import trio

from proxy.cycle.inflight import Inflight, for_payload
from proxy.netio import Channel
from proxy.relay.commands import commit_after_marker
from proxy.relay.responses import after_feed

if TYPE_CHECKING:
    from proxy.relay.fastlane import FastLane, Got, Job

__all__ = ["HeldCommit", "send_marker_first", "reraise", "NOTHING"]


def send_marker_first(lane: FastLane, commit: Inflight, channel: Channel) -> None:
    """A COMMIT of writes with commit markers on: its marker goes now (the slow lane's
    ``commands._write_commit_marker``, without waiting); the COMMIT is held for its OK."""
    s = lane.s
    markers = s.parts.markers
    assert markers is not None
    number, payload = markers.upsert_sql()
    s.record.marker(number)
    marker = for_payload(payload, lane.tracking, lane.deprecate_eof, commit.arrived, commit.command.seq_end, internal=True)
    lane.cycle.arrived()  # the COMMIT counts from now, as in the slow lane; the marker does not
    lane.cycle.dispatch(marker)
    lane.send(marker, channel, HeldCommit(lane, commit, marker, number))


class HeldCommit:
    """A COMMIT whose commit marker the lane sent (``FastLane.held`` once the marker is out)."""

    __slots__ = ("lane", "commit", "marker", "number", "settled")

    def __init__(self, lane: FastLane, commit: Inflight, marker: Inflight, number: int) -> None:
        self.lane = lane
        self.commit = commit
        self.marker = marker
        self.number = number
        self.settled = trio.Event()  # the marker's answer is complete, or recovery answered it
        marker.waiter = self.settled.set

    def answer(self, data: bytes) -> None:
        """The server's bytes while the COMMIT waits for its marker: a whole OK, and the COMMIT
        goes; anything else is the tasks' (the backend task the answer, the client task the
        COMMIT: ``FastLane.give_backend`` hands it over)."""
        lane, marker = self.lane, self.marker
        end = lane.fed(marker, data)
        if end is None:
            return
        if end != len(data) or marker.tracker.error is not None:
            lane.give_backend(functools.partial(after_feed, lane.s, marker, data, end))  # an error, or more to come
            return
        if not lane.completed(marker, data):
            return
        lane.held = None
        channel: Channel = lane.link.backend.channel
        if channel.data_pending():  # the server spoke again: the client task sends the COMMIT when it is heard
            self.settled.set()
            lane.give_client(functools.partial(self.finish_slowly, NOTHING))
            return
        markers = lane.s.parts.markers
        assert markers is not None
        markers.written = self.commit.marker = self.number
        lane.cycle.dispatch(self.commit)
        lane.send(self.commit, channel, None)

    async def finish_slowly(self, then: Got) -> None:
        """The client task finishes the COMMIT once its marker is settled, then takes what woke it."""
        await self.settled.wait()
        s = self.lane.s
        await commit_after_marker(s, self.commit, self.marker, self.number)
        if isinstance(then, bytes):
            s.client.decoder.feed(then)
        elif isinstance(then, BaseException):
            raise then
        else:
            await then()


async def reraise(exc: BaseException) -> None:
    """A job that raises ``exc`` in the task it wakes."""
    raise exc


async def _nothing() -> None:
    pass


NOTHING: Job = _nothing  # a job that only wakes the task (for what comes with it)
