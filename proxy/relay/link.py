"""A session's backend connection and its life, with one owner (as wsproto's connection
states and TiProxy's ``BackendConnManager``).

``BackendLink`` holds the connection, how the session logs in to it, the packet limit it
sets, and what a new connection still owes the client. Its state says what the relay may do:

    DOWN --replace--> RESTORING --ready--> UP --lost--> LOST --replace--> RESTORING ...
                                           UP --begin_move--> MOVING --replace, moved--> UP
                                           UP --begin_swap--> SWAPPING --replace--> RESTORING ...

Commands go out only while UP. While MOVING or SWAPPING the old connection's end is on
purpose, and the backend task waits for ``replaced``. ``replace(new)`` is the one way a new
connection comes in (the login, COM_CHANGE_USER, recovery, a move off a draining backend); a
restore then runs on it before ``ready()``.
"""

from __future__ import annotations

import enum

import trio

from proxy.backend import Backend, Login
from proxy.protocol.framing import encode_packet

__all__ = ["BackendLink", "LinkState", "effective_limit"]


class LinkState(enum.Enum):
    DOWN = "down"  # no connection yet (before the login), or closed for good
    RESTORING = "restoring"  # a new connection, made to look like the session before use
    UP = "up"  # commands go to it
    LOST = "lost"  # it went away: recovery replaces it
    MOVING = "moving"  # its address is draining: a replacement opens between transactions
    SWAPPING = "swapping"  # COM_CHANGE_USER: closed on purpose, a new login under way


def effective_limit(configured: int, backend: Backend | None) -> int:
    """The session's max_allowed_packet: the config's, or the backend's if smaller."""
    if backend is not None and backend.max_allowed_packet:
        return min(configured, backend.max_allowed_packet)
    return configured


class BackendLink:
    def __init__(self, tracking, configured_limit: int) -> None:
        self.tracking = tracking  # proxy.session.tracker.SessionTracker: told of every new connection
        self.state = LinkState.DOWN
        self.backend: Backend | None = None
        self.login: Login | None = None  # how the session logs in (set at the client's login)
        self.configured_limit = configured_limit
        self.limit = configured_limit  # effective max_allowed_packet
        self.largest = configured_limit - 1  # the largest command payload the server takes
        # On a new connection, before the client's first command ran there: the previous
        # statement's results (FOUND_ROWS(), warnings...) stayed on the old one.
        self.owes_results = False
        self.lost_at = 0.0  # when the connection was last lost
        self.losses_in_a_row = 0  # losses since a command last completed
        self.recoveries = 0
        self.move_requested = False  # its address is draining: move between transactions
        # (connection id, when): another session's KILL of this connection went through the
        # proxy; a server that counts no KILLs (TiDB) closes it without a word.
        self.kill_relayed: tuple[int, float] | None = None
        self.replaced = trio.Event()  # set when a move or a COM_CHANGE_USER has its new connection
        self._sends = 0  # sends of the in-flight command under way
        self._settled: trio.Event | None = None

    @property
    def up(self) -> bool:
        return self.state is LinkState.UP

    @property
    def connection_id(self) -> int | None:
        return self.backend.connection_id if self.backend is not None else None

    # ------------------------------------------------------------------ transitions

    def replace(self, new: Backend) -> None:
        """``new`` is the session's connection from now on; it is restored, then ``ready()``.
        (A move stays MOVING meanwhile: its old connection is open until the new one is ready.)"""
        self.backend = new
        self.limit = effective_limit(self.configured_limit, new)
        self.tracking.backend_changed(str(new.address), new.handshake.server_version)
        # MariaDB takes a command smaller than max_allowed_packet, TiDB one of that size too.
        self.largest = self.limit if self.tracking.dialect.flavor == "tidb" else self.limit - 1
        if self.state is not LinkState.MOVING:
            self.state = LinkState.RESTORING

    def ready(self) -> None:
        """The connection serves the session's commands."""
        self.state = LinkState.UP
        self.replaced.set()

    def lost(self) -> Backend | None:
        """The connection went away (or is going): close it; recovery replaces it. Returns it."""
        old = self.backend
        self.state = LinkState.LOST
        self.owes_results = True
        self.lost_at = trio.current_time()
        if old is not None:
            old.close()
        return old

    def begin_move(self) -> Backend | None:
        """Replace a draining connection between transactions; the old one stays open until the
        new one is ready (``moved``), or is taken back (``move_failed``)."""
        self.state = LinkState.MOVING
        self.replaced = trio.Event()
        return self.backend

    def moved(self, old: Backend | None) -> None:
        self.move_requested = False
        if old is not None:
            old.channel.send_nowait(encode_packet(b"\x01", 0)[0])  # COM_QUIT
            old.close()
        self.ready()

    def move_failed(self, old: Backend | None, owed: bool, ids) -> None:
        """Back to the old connection (``ids``: the tracker's prepared ids on it)."""
        if old is not None:
            self.replace(old)
        self.tracking.restore_backend_ids(ids)
        self.owes_results = owed
        self.ready()

    def begin_swap(self) -> None:
        """COM_CHANGE_USER: the connection is closed on purpose; a new login follows."""
        old = self.backend
        self.state = LinkState.SWAPPING
        self.replaced = trio.Event()
        self.backend = None
        if old is not None:
            old.close()

    def close(self) -> None:
        """The session ends: a polite COM_QUIT spares the server an "aborted connection" warning."""
        backend = self.backend
        if backend is not None:
            if self.up and not backend.channel.closed:
                backend.channel.send_nowait(encode_packet(b"\x01", 0)[0])
            backend.close()
        self.state = LinkState.DOWN

    # ------------------------------------------------------------------ sends under way

    def sending(self) -> None:
        self._sends += 1

    def sent(self) -> None:
        self._sends -= 1
        if self._sends == 0 and self._settled is not None:
            self._settled.set()

    async def settled(self) -> None:
        """Wait until no send of the in-flight command is under way (recovery must know how far
        it got before deciding)."""
        while self._sends:
            self._settled = trio.Event()
            await self._settled.wait()
        self._settled = None

    # ------------------------------------------------------------------ results owed

    def takes_results_debt(self, code: int) -> bool:
        """The first command on a new connection that runs a statement: True once, for it (it
        must not read the previous statement's results, which stayed on the old connection);
        PING and the like leave the debt as it is."""
        if not self.owes_results or code not in (0x03, 0x17):  # COM_QUERY, COM_STMT_EXECUTE
            return False
        self.owes_results = False
        return True
