"""A session's backend connection and its life, with one owner (as wsproto's connection
states and TiProxy's ``BackendConnManager``).

``BackendLink`` holds the connection, how the session logs in to it, the packet limit it
sets, and what a new connection still owes the client. Its state says what the relay may do;
every change of state goes through ``_go``, which checks it against ``TRANSITIONS`` (as h11's
``_state.py``) and raises ``LinkStateError`` on any other:

    DOWN --replace--> RESTORING --ready--> UP --lost--> LOST --replace--> RESTORING ...
    DOWN --adopt_lost--> LOST  (moved by an upgrade after the server closed it for idling; taken
                               over from a worker that died)
                                           UP --begin_move--> MOVING --replace, moved--> UP
                                           UP --begin_swap--> SWAPPING --replace--> RESTORING ...
    any --close--> CLOSED

Commands go out only while UP (a COM_CHANGE_USER, too, waits for UP). While MOVING or
SWAPPING the old connection's end (or its server's last words) is on purpose, and the backend
task waits for ``replaced``. ``replace(new)`` is the one way a new
connection comes in (the login, COM_CHANGE_USER, recovery, a move off a draining backend); a
restore then runs on it before ``ready()`` (at a login, ``ready()`` follows at once).
"""

from __future__ import annotations

import enum

import trio

from proxy.backend import Backend, Login
from proxy.config import Address
from proxy.protocol.framing import encode_packet

__all__ = ["BackendLink", "LinkState", "LinkStateError", "TRANSITIONS", "effective_limit"]


class LinkState(enum.Enum):
    DOWN = "down"  # no connection yet (before the login)
    RESTORING = "restoring"  # a new connection, made to look like the session before use
    UP = "up"  # commands go to it
    LOST = "lost"  # it went away: recovery replaces it
    MOVING = "moving"  # its address is draining: a replacement opens between transactions
    SWAPPING = "swapping"  # COM_CHANGE_USER: closed on purpose, a new login under way
    CLOSED = "closed"  # the session ended: closed for good


S = LinkState

# The allowed moves: state -> {event (the method) -> next state}. Anything else is a bug of the
# caller's, refused before any field changes.
TRANSITIONS: dict[LinkState, dict[str, LinkState]] = {
    S.DOWN: {"replace": S.RESTORING, "adopt_lost": S.LOST, "close": S.CLOSED},  # the client's login
    S.RESTORING: {
        "replace": S.RESTORING,  # the restore failed on it: recovery tries another
        "ready": S.UP,
        "close": S.CLOSED,
    },
    S.UP: {"lost": S.LOST, "begin_move": S.MOVING, "begin_swap": S.SWAPPING, "close": S.CLOSED},
    # Lost again: recovery's first step after the backend task put the link aside itself (a
    # session closed for idling reconnects at its next command, ``responses``).
    S.LOST: {"lost": S.LOST, "replace": S.RESTORING, "close": S.CLOSED},
    # The old connection stays open (and the state MOVING) until the new one is ready.
    S.MOVING: {"replace": S.MOVING, "moved": S.UP, "move_failed": S.UP, "close": S.CLOSED},
    S.SWAPPING: {"replace": S.RESTORING, "close": S.CLOSED},
    # A move runs beside the session's tasks and may end after the session did: its new
    # connection is closed then (``replace``, ``moved``, ``move_failed`` close what they get).
    S.CLOSED: {"replace": S.CLOSED, "moved": S.CLOSED, "move_failed": S.CLOSED, "close": S.CLOSED},
}


class LinkStateError(Exception):
    """A move the link's state machine does not allow (a bug in the caller)."""


def effective_limit(configured: int, backend: Backend | None) -> int:
    """The session's max_allowed_packet: the config's, or the backend's if smaller."""
    if backend is not None and backend.max_allowed_packet:
        return min(configured, backend.max_allowed_packet)
    return configured


class BackendLink:
    def __init__(self, tracking, configured_limit: int) -> None:
        self.tracking = tracking  # proxy.session.tracker.SessionTracker: told of every new connection
        self.state = LinkState.DOWN  # written by _go only
        self.backend: Backend | None = None
        self.login: Login | None = None  # how the session logs in (set_login)
        self.configured_limit = configured_limit
        self.limit = configured_limit  # effective max_allowed_packet
        self.largest = configured_limit - 1  # the largest command payload the server takes
        # On a new connection, before the client's first command ran there: the previous
        # statement's results (FOUND_ROWS(), warnings...) stayed on the old one.
        self.owes_results = False
        self.lost_at = 0.0  # when the connection was last lost
        self.recoveries = 0  # count_recovery
        self.move_requested = False  # its address is draining: move between transactions (want_move)
        self.move_from: Address | None = None  # the address it was asked to move off
        # (connection id, when): another session's KILL of this connection went through the
        # proxy; a server that counts no KILLs (TiDB) closes it without a word (kill_relayed_now).
        self.kill_relayed: tuple[int, float] | None = None
        self.replaced = trio.Event()  # set when a move or a COM_CHANGE_USER has its new connection
        self._owed_before_move = False  # owes_results when the move began
        self.cut_reason: str | None = None  # ``cut``: why the connection was cut, for the loss
        self._sends = 0  # sends of the in-flight command under way
        self._settled: trio.Event | None = None

    @property
    def up(self) -> bool:
        return self.state is LinkState.UP

    @property
    def up_or_moving(self) -> bool:
        """Commands reach a connection of the session's own (the old one of a move, or its new one)."""
        return self.state is LinkState.UP or self.state is LinkState.MOVING

    @property
    def connection_id(self) -> int | None:
        return self.backend.connection_id if self.backend is not None else None

    def _go(self, event: str) -> LinkState:
        """The one writer of ``state``: the move ``event`` makes from here, if allowed."""
        allowed = TRANSITIONS[self.state]
        new = allowed.get(event)
        if new is None:
            raise LinkStateError(
                f"backend link: {event} is not allowed while {self.state.name} (allowed: {', '.join(allowed) or 'nothing'})"
            )
        self.state = new
        return new

    # ------------------------------------------------------------------ transitions

    def replace(self, new: Backend) -> None:
        """``new`` is the session's connection from now on; it is restored, then ``ready()``.
        (A move stays MOVING meanwhile: its old connection is open until the new one is ready.)"""
        if self._go("replace") is LinkState.CLOSED:
            new.close()  # a move that ended after the session
            return
        self._take(new)

    def _take(self, new: Backend) -> None:
        self.backend = new
        self.limit = effective_limit(self.configured_limit, new)
        self.tracking.backend_changed(str(new.address), new.handshake.server_version)
        # MariaDB takes a command smaller than max_allowed_packet, TiDB one of that size too.
        self.largest = self.limit if self.tracking.dialect.flavor == "tidb" else self.limit - 1

    def ready(self) -> None:
        """The connection serves the session's commands. One that recovery opened elsewhere
        than the address the session was asked to move off is the move done."""
        self._go("ready")
        if self.move_requested and self.backend is not None and self.backend.address != self.move_from:
            self.move_requested = False
        self.replaced.set()

    def lost(self) -> Backend | None:
        """The connection went away (or is going): close it; recovery replaces it. Returns it."""
        self._go("lost")
        old = self.backend
        self.owes_results = True
        self.lost_at = trio.current_time()
        if old is not None:
            old.close()
        return old

    def cut(self, reason: str) -> None:
        """The server answers no one (``Target.backend_unreachable``): reset the connection, so
        that the backend task's wait ends (PeerClosed) and recovery runs with ``reason``. The
        state stays UP until the backend task calls ``lost``, as for any loss."""
        self.cut_reason = reason
        if self.backend is not None:
            self.backend.channel.abort()

    def take_cut_reason(self) -> str | None:
        reason, self.cut_reason = self.cut_reason, None
        return reason

    def begin_move(self) -> Backend | None:
        """Replace a draining connection between transactions; the old one stays open until the
        new one is ready (``moved``), or is taken back (``move_failed``)."""
        self._go("begin_move")
        self.replaced = trio.Event()
        # A command arriving meanwhile runs on the new connection; the old one's debt is back
        # if the move fails.
        self._owed_before_move, self.owes_results = self.owes_results, True
        return self.backend

    def moved(self, old: Backend | None) -> None:
        closed = self._go("moved") is LinkState.CLOSED
        self.move_requested = False
        if old is not None:
            old.channel.send_nowait(encode_packet(b"\x01", 0)[0])  # COM_QUIT
            old.close()
        if not closed:
            self.replaced.set()

    def move_failed(self, old: Backend | None, ids) -> None:
        """Back to the old connection (``ids``: the tracker's prepared ids on it)."""
        if self._go("move_failed") is LinkState.CLOSED:
            if old is not None:
                old.close()
            return
        if old is not None:
            self._take(old)
        self.tracking.restore_backend_ids(ids)
        self.owes_results = self._owed_before_move
        self.replaced.set()

    def begin_swap(self) -> None:
        """COM_CHANGE_USER: the connection is closed on purpose; a new login follows."""
        self._go("begin_swap")
        old = self.backend
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
        self._go("close")

    def detach(self) -> None:
        """The session moved to another process with this connection (an upgrade): close this
        process's descriptor only -- the connection lives on there."""
        if self.backend is not None:
            self.backend.close()
        self._go("close")

    def adopted(self, owes_results: bool, recoveries: int) -> None:
        """The connection came from the old process of an upgrade, in use as it was there."""
        self.owes_results = owes_results
        self.recoveries = recoveries
        self.ready()

    def adopted_lost(self, recoveries: int, dead: Backend | None = None) -> None:
        """The session came from another process without a connection: the server had closed
        it for idling there (an upgrade), or ``dead``, the connection that process held, died
        with it (a worker's crash; recovery reads which server and connection it was). A new
        one opens at the next command."""
        self._go("adopt_lost")
        if dead is not None:
            self._take(dead)
        self.owes_results = True
        self.recoveries = recoveries

    # ------------------------------------------------------------------ other fields

    def want_move(self) -> None:
        """Its address is draining: move off it as soon as the session is idle."""
        self.move_requested = True
        self.move_from = self.backend.address if self.backend is not None else None

    def drop_move(self) -> None:
        """The session cannot be moved (its state cannot be restored): it stays where it is."""
        self.move_requested = False

    def count_recovery(self) -> None:
        """Recovery goes ahead with a plan (after any backoff)."""
        self.recoveries += 1

    def results_replayed(self) -> None:
        """The journal replayed on the new connection left the results the client's statements
        left: a command may read them again."""
        self.owes_results = False

    def set_login(self, login: Login) -> None:
        """How the session logs in from now on: at the client's login, and at COM_CHANGE_USER
        once the old connection is closed."""
        if self.state not in (LinkState.DOWN, LinkState.SWAPPING):
            raise LinkStateError(f"backend link: the login changes only while DOWN or SWAPPING, not {self.state.name}")
        self.login = login

    def kill_relayed_now(self, connection_id: int) -> None:
        """Another session's KILL of connection ``connection_id`` is about to go through the
        proxy (a server that counts no KILLs, TiDB, closes it without a word)."""
        self.kill_relayed = (connection_id, trio.current_time())

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
