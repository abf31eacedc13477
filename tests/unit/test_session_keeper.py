"""The supervisor's session keeper (``proxy.handover.keeper``) over its real abstract Unix
socket: what a worker registers is held, and handed to the next worker of the same index when
the first one's connection ends with sessions still registered (it died); an upgrade's
successor already serving gets them at once; what nobody takes in time is closed (the client
sees its connection end); a process of another user is refused."""

from __future__ import annotations

import os
import socket

import pytest
import trio

from proxy.handover.fdpass import HandoverChannel
from proxy.handover.keeper import SessionKeeper
from proxy.handover.protocol import Message


class FakeWorker:
    """A worker's end of the keeper's socket (speaks for ``pid``: the real one, as SO_PEERCRED says)."""

    def __init__(self, keeper: SessionKeeper, index: int) -> None:
        self.keeper, self.index = keeper, index
        self.channel: HandoverChannel | None = None

    async def connect(self) -> FakeWorker:
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.connect(self.keeper.address)
        self.channel = HandoverChannel(socket.socket(fileno=sock.detach()), "the keeper")
        await self.channel.send(Message("hello", {"index": self.index, "pid": os.getpid()}), timeout=5)
        return self

    async def open(self, session_id: int, client: socket.socket, fields: dict) -> None:
        slot = os.memfd_create("test-slot")
        try:
            await self.channel.send(Message("open", {"id": session_id, "fields": fields}, [client.fileno(), slot]), timeout=5)
        finally:
            os.close(slot)

    def die(self) -> None:
        self.channel.close()


@pytest.fixture
async def keeper(nursery):
    keeper = SessionKeeper(os.getpid() + 10_000_000 + id(nursery) % 1000, timeout=20)  # an address of its own
    await nursery.start(keeper.serve)
    return keeper


def _client_pair() -> tuple[socket.socket, socket.socket]:
    """(the proxy's side, the client's side) of a real TCP connection."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    client = socket.create_connection(server.getsockname())
    ours, _ = server.accept()
    server.close()
    return ours, client


async def _until(predicate, timeout: float = 5) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


async def test_the_sessions_of_a_dead_worker_go_to_the_next_worker_of_its_index(keeper):
    first = await FakeWorker(keeper, 0).connect()
    ours, client = _client_pair()
    await first.open(7, ours, {"id": 7, "state": {"username": "app"}})
    ours.close()  # the worker's own copy: the keeper's keeps the connection open
    await _until(lambda: keeper.sessions == 1)
    first.die()
    await _until(lambda: keeper.orphans.get(0))
    other = await FakeWorker(keeper, 1).connect()  # another index takes nothing
    nextone = await FakeWorker(keeper, 0).connect()
    with trio.fail_after(5):
        message = await nextone.channel.receive(timeout=5)
    assert message.type == "takeover" and message.fields["id"] == 7 and message.fields["pid"] == os.getpid()
    assert message.fields["fields"]["state"] == {"username": "app"}
    taken = socket.socket(fileno=message.fds[0])
    os.close(message.fds[1])
    client.sendall(b"ping")
    assert taken.recv(4) == b"ping"  # the very client connection
    assert keeper.taken_over == 1 and not keeper.orphans.get(0)
    taken.close()
    client.close()
    other.die()
    nextone.die()


async def test_a_successor_already_serving_gets_them_at_once(keeper):
    old = await FakeWorker(keeper, 0).connect()
    successor = await FakeWorker(keeper, 0).connect()  # an upgrade's: the same index, serving beside it
    ours, client = _client_pair()
    await old.open(8, ours, {"id": 8})
    ours.close()
    await _until(lambda: keeper.sessions == 1)
    old.die()
    message = await successor.channel.receive(timeout=5)
    assert message.type == "takeover" and message.fields["id"] == 8
    for fd in message.fds:
        os.close(fd)
    client.close()
    successor.die()


async def test_a_session_that_moved_before_its_old_worker_died_is_not_sent_again(keeper):
    old = await FakeWorker(keeper, 0).connect()
    successor = await FakeWorker(keeper, 0).connect()
    ours, client = _client_pair()
    await old.open(9, ours, {"id": 9})
    await successor.open(9, ours, {"id": 9})  # moved by the upgrade, registered by its new worker
    ours.close()
    await _until(lambda: keeper.sessions == 2)
    old.die()
    await _until(lambda: keeper.sessions == 1 and not keeper.orphans.get(0))
    with trio.move_on_after(0.5):
        await successor.channel.receive(timeout=1)
        pytest.fail("the successor was sent a session it already has")
    client.close()
    successor.die()


async def test_orphans_nobody_takes_are_closed_in_time(nursery, autojump_clock):
    keeper = SessionKeeper(os.getpid() + 20_000_000, timeout=30)
    await nursery.start(keeper.serve)
    worker = await FakeWorker(keeper, 0).connect()
    ours, client = _client_pair()
    await worker.open(10, ours, {"id": 10})
    ours.close()
    await _until(lambda: keeper.sessions == 1)
    worker.die()
    await _until(lambda: keeper.orphans.get(0))
    await trio.sleep(29)
    assert keeper.lost == 0
    await trio.sleep(3)
    assert keeper.lost == 1 and not keeper.orphans.get(0)
    client.settimeout(5)
    assert client.recv(1) == b""  # the client sees its connection end, not a hang
    client.close()


async def test_a_process_of_another_user_is_refused(keeper):
    """SO_PEERCRED: only this user's processes may talk to the keeper (a forked child that
    becomes nobody is turned away)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to become another user")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: another user, knocking
        try:
            os.setuid(65534)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(keeper.address)
            sock.settimeout(5)
            os.write(w, b"closed" if sock.recv(1) == b"" else b"open")
        except Exception as exc:  # noqa: BLE001 -- reported to the parent
            os.write(w, repr(exc).encode())
        finally:
            os._exit(0)
    os.close(w)
    said = await trio.to_thread.run_sync(lambda: os.read(r, 100))
    os.close(r)
    os.waitpid(pid, 0)
    assert said == b"closed"


async def test_a_worker_whose_keeper_goes_away_while_it_registers_its_sessions_serves_on(monkeypatch):
    """The supervisor re-executes itself (an upgrade) while a worker registers its sessions on
    the keeper's new connection: the first send fails, the rest are skipped, and the worker
    connects again later (seen under bench.dm_e2e --chaos proxy-upgrade --proxy-workers 2:
    the next session's send met no connection and the worker died of an AttributeError)."""
    from types import SimpleNamespace

    from proxy.handover import mirror as mirror_module

    monkeypatch.setattr(mirror_module, "session_fields", lambda *args, **kwargs: {})
    registered = []
    sessions = []
    for number in range(3):
        ours, client = _client_pair()
        fd = os.memfd_create("test-slot")
        sessions.append(SimpleNamespace(id=number, record=SimpleNamespace(kept=True, slot=SimpleNamespace(fd=fd)), client=SimpleNamespace(sock=ours), link=SimpleNamespace(backend=None),
                                        tracking=SimpleNamespace(mirrored=lambda number=number: registered.append(number)), peer=client))  # fmt: skip
    mirror = mirror_module.Mirror(SimpleNamespace(target=SimpleNamespace(sessions=sessions)), os.getpid(), 0)
    channel, keeper_end = HandoverChannel.pair("the supervisor's session keeper")
    keeper_end.close()  # gone before the first session's message
    await mirror._register_all(channel)
    assert registered == [0] and mirror.channel is None
    await mirror.state(sessions[1])  # a session's news meanwhile goes nowhere, and is no error
    channel.close()
    for s in sessions:
        os.close(s.record.slot.fd)
        s.client.sock.close()
        s.peer.close()
