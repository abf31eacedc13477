"""The component tests' rig: the real ``Proxy`` in front of a fake server (tests/component/fakes.py),
its clients over trio memory streams, every task in the test's nursery. (The lab, tests/lab, is
the real servers; the rig has none.)

A test takes the fixture ``rig`` (the defaults) or ``make_rig`` (``make_rig(config, hooks,
**options)``, as often as it likes); what the suites need differently is an argument:

- ``config`` (default ``make_config()``) and ``hooks`` (the plugin chain, default none);
- ``server``: the fake server (default ``FakeServer``; ``HostileServer``, ``TLSFakeServer``);
- ``stream_pair``: how bytes travel, client ↔ proxy and proxy ↔ server
  (``fakes.trickle_stream_pair``: one byte per read);
- ``peer``: the client address the proxy is told (admission counts per host, errors name it);
- ``client_class``: what ``client()`` builds on the stream (``FakeClient``, or ``TLSClient``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing

from proxy.frontend import Proxy
from proxy.hooks import Hooks
from proxy.netio import StreamChannel
from tests.component.fakes import FakeClient, FakeConnection, FakeServer, make_config

__all__ = ["Rig", "make_rig", "rig"]


class Rig:
    def __init__(
        self,
        nursery: trio.Nursery,
        config=None,
        hooks: Hooks | None = None,
        *,
        server: FakeServer | None = None,
        stream_pair: Callable[[], tuple[trio.StapledStream, trio.StapledStream]] = trio.testing.memory_stream_pair,
        peer: str = "127.0.0.1:5000",
        client_class: Callable[..., FakeClient] = FakeClient,
    ) -> None:
        self.nursery = nursery
        self.stream_pair = stream_pair
        self.server = server if server is not None else FakeServer(nursery, stream_pair=stream_pair)
        self.config = config if config is not None else make_config()
        self.hooks = hooks
        self.proxy = Proxy(self.config, hooks, opener=self.server.opener)
        self.peer = peer
        self.client_class = client_class

    def connect(self, peer: str | None = None) -> trio.StapledStream:
        """A client's end of a new connection, handed to the proxy as coming from ``peer``
        (default ``self.peer``); nothing read or sent on it yet (the greeting is waiting)."""
        client_side, proxy_side = self.stream_pair()
        self.nursery.start_soon(self.proxy.handle_client, StreamChannel(proxy_side, "client"), peer or self.peer)
        return client_side

    async def client(self, peer: str | None = None, *, login: bool = True, password: str = "apppw", **options: Any) -> FakeClient:
        """A ``client_class`` on a new connection (``options``: its own, e.g. ``deprecate_eof``,
        TLSClient's ``tls``), logged in as app with ``password`` unless ``login=False``."""
        client = self.client_class(self.connect(peer), **options)
        if login:
            await client.login(password=password)
        return client

    def backend_of(self, index: int = -1) -> FakeConnection:
        """One of the server's open connections (default: the newest)."""
        return self.server.live()[index]


@pytest.fixture
def make_rig(nursery: trio.Nursery) -> Callable[..., Rig]:
    """``make_rig(config=None, hooks=None, **options)``: a Rig in the test's nursery."""
    return functools.partial(Rig, nursery)


@pytest.fixture
def rig(make_rig: Callable[..., Rig]) -> Rig:
    """A Rig with the defaults: ``make_config()``, no plugins, a ``FakeServer``."""
    return make_rig()
