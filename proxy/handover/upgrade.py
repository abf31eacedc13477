"""An upgrade, both sides: the running proxy starts ``python -m proxy --config F`` (the code and
the config now on disk) and hands it its listening sockets; the new process adopts them
instead of binding, so no connection is refused at any moment, and says when it serves; the
old one then stops accepting and drains its sessions as SIGTERM does.

The conversation on the hand-over channel (``fdpass``), version 1::

    old -> new   offer        {"pid", "listeners": [{"role", "address", "count"}], "next_session_id"} + the sockets
    new -> old   serving      {"pid", "adopted": [...], "bound": [...], "closed": [...], "sessions"}
             or  failed       {"pid", "reason"}            (then the new process exits non-zero)
    old -> new   handed_over  {"pid", "mainpid_notified"}  (then the new one tells systemd)

``sessions`` is the session format the new process reads (``sessions.FORMAT``): when it is
this process's, the channel stays open and the live sessions follow (``sessions``); otherwise
(or with none) they are drained here. ``next_session_id``: the new process numbers its own
sessions from there, so that none takes the id of one that moves.

A listener is adopted when the new config names the same address for the same role
("client": listen.address, "admin": the admin address); one whose address changed is closed
in the new process and bound afresh there. A new process that dies, answers ``failed`` or
stays silent past ``START_TIMEOUT`` leaves the old one serving, and the reason is logged and
given to whoever asked (SIGUSR2: the log; ``replay-proxy upgrade``: its output).

"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from proxy.handover import sdnotify
from proxy.handover.fdpass import HandoverChannel
from proxy.handover.protocol import ChannelClosed, HandoverError, Message, ProtocolError
from proxy.handover.sessions import FORMAT as SESSION_FORMAT

__all__ = ["START_TIMEOUT", "STEP_TIMEOUT", "describe", "Listening", "Outcome", "WorkersOutcome", "UpgradeFailed", "Upgrader",
           "upgrade_logged", "Inherited", "Successor"]  # fmt: skip

log = logging.getLogger("replay_proxy.handover")

START_TIMEOUT = 60.0  # the new process: interpreter, imports, config check, plugins, adopt, serve
STEP_TIMEOUT = 10.0  # one message the other side is already waiting for
EXIT_WAIT = 5.0  # a new process that failed: time to exit on its own before it is killed


@dataclass
class Listening:
    """Listening sockets of one configured address: ``role`` "client" or "admin"."""

    role: str
    address: str
    fds: list[int]


@dataclass
class Outcome:
    """A finished hand-over, as the admin endpoint answers it."""

    old_pid: int
    new_pid: int
    listeners: list[str]
    sessions_left_to_drain: int
    seconds: float


@dataclass
class WorkersOutcome(Outcome):
    """A supervisor's upgrade (``--workers N``): its own pid stays; ``workers`` holds each
    worker's answer (an ``Outcome``'s fields) with its index."""

    workers: list[dict] = field(default_factory=list)


class UpgradeFailed(HandoverError):
    """The upgrade did not happen; this process keeps serving. ``busy``: another is under way."""

    def __init__(self, reason: str, busy: bool = False) -> None:
        super().__init__(reason)
        self.busy = busy


def describe(listening: list[Listening]) -> list[str]:
    return [f"{entry.role} {entry.address}" + (f" ({len(entry.fds)} sockets)" if len(entry.fds) != 1 else "") for entry in listening]


@dataclass
class Upgrader:
    """The old process's side. ``listening()``: what it serves now; ``sessions()``: how many
    sessions it has; ``extra_args``: arguments the new process needs beside ``--config``."""

    path: str | None
    listening: Callable[[], list[Listening]]
    sessions: Callable[[], int]
    next_session_id: Callable[[], int]
    extra_args: list[str] = field(default_factory=list)
    on_failure: Callable[[], None] = lambda: None  # counted (replay_proxy_upgrades_failed_total)
    # Open after the hand-over when the new process takes sessions (``sessions.SessionMover``).
    session_channel: HandoverChannel | None = None
    handed_over: trio.Event = field(default_factory=trio.Event)
    outcome: Outcome | None = None
    _process: trio.Process | None = None

    async def upgrade(self, why: str) -> Outcome:
        """Start the new process and hand it the listeners; UpgradeFailed says why not."""
        pid = os.getpid()
        if self.outcome is not None:
            raise UpgradeFailed(f"pid {pid} has already handed over to pid {self.outcome.new_pid} and is draining", busy=True)
        if self._process is not None:
            raise UpgradeFailed(f"an upgrade is already under way (new process pid {self._process.pid})", busy=True)
        if self.path is None:
            raise UpgradeFailed("no config file to start the new process with")
        started = trio.current_time()
        channel, theirs = HandoverChannel.pair()
        args = [sys.executable, "-m", "proxy", "--config", self.path, *self.extra_args, "--handover-fd", str(theirs.fileno())]
        try:
            self._process = await trio.lowlevel.open_process(args, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        except OSError as exc:
            channel.close()
            raise self._failed(f"cannot start {sys.executable}: {exc}") from None
        finally:
            theirs.close()  # the child's copy is its own: its exit now reads as the channel closing
        process = self._process
        log.info("upgrade (%s): pid %d started pid %d (%s) to take over", why, pid, process.pid, " ".join(args[1:-2]))
        try:
            listening = self.listening()
            offer = Message(
                "offer",
                {
                    "pid": pid,
                    "listeners": [{"role": e.role, "address": e.address, "count": len(e.fds)} for e in listening],
                    "next_session_id": self.next_session_id(),
                },  # fmt: skip
                [fd for entry in listening for fd in entry.fds],
            )
            await channel.send(offer, timeout=STEP_TIMEOUT)
            answer = await channel.receive(timeout=START_TIMEOUT, expecting="word that it serves")
            if answer.type == "failed":
                raise UpgradeFailed(str(answer.fields.get("reason") or "no reason given"))
            if answer.type != "serving":
                raise ProtocolError(f"expected 'serving' or 'failed', got {answer.type!r}")
        except HandoverError as exc:
            channel.close()
            reason = await self._stop_failed(process, exc)
            self._process = None
            raise self._failed(reason) from None
        except BaseException:  # cancelled (a SIGTERM while upgrading): the half-started process goes too
            channel.close()
            self.abandon()
            raise
        mainpid_notified = sdnotify.notify(f"MAINPID={process.pid}")  # under NotifyAccess=main only this process may say it
        try:
            await channel.send(Message("handed_over", {"pid": pid, "mainpid_notified": mainpid_notified}), timeout=STEP_TIMEOUT)
        except HandoverError as exc:  # it serves already; its systemd notice waits for this, with its own timeout
            log.warning("upgrade: pid %d serves, but did not take the last word: %s", process.pid, exc)
            channel.close()
        else:
            if answer.fields.get("sessions") == SESSION_FORMAT:
                self.session_channel = channel
            else:
                log.warning("upgrade: pid %d does not read this version's sessions (format %s, here %d): they are drained here",
                            process.pid, answer.fields.get("sessions"), SESSION_FORMAT)  # fmt: skip
                channel.close()
        self.outcome = Outcome(pid, process.pid, describe(listening), self.sessions(), round(trio.current_time() - started, 3))
        log.info(
            "upgrade: pid %d serves now (listeners handed over: %s; it adopted %s, bound %s) after %.3fs; pid %d stops "
            "accepting and drains %d session(s)",
            process.pid,
            ", ".join(self.outcome.listeners) or "none",
            ", ".join(answer.fields.get("adopted") or []) or "none",
            ", ".join(answer.fields.get("bound") or []) or "none",
            self.outcome.seconds,
            pid,
            self.outcome.sessions_left_to_drain,
            extra={"event": "upgrade_handed_over"},
        )
        self.handed_over.set()
        return self.outcome

    def _failed(self, reason: str) -> UpgradeFailed:
        self.on_failure()
        log.error("upgrade failed, pid %d keeps serving: %s", os.getpid(), reason, extra={"event": "upgrade_failed"})
        return UpgradeFailed(reason)

    async def _stop_failed(self, process: trio.Process, exc: HandoverError) -> str:
        """Reap (or kill) a new process that will not take over; the reason, as a sentence."""
        with trio.move_on_after(EXIT_WAIT):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()
            return f"{exc}; the new process (pid {process.pid}) was killed"
        if isinstance(exc, UpgradeFailed):
            return f"the new process (pid {process.pid}) could not start: {exc}"
        if isinstance(exc, ChannelClosed):
            return (f"the new process (pid {process.pid}) exited with code {process.returncode} before it served "
                    "(its own lines above in the log say why)")  # fmt: skip
        return f"{exc}; the new process (pid {process.pid}) exited with code {process.returncode}"

    def abandon(self) -> None:
        """The old process stops (SIGTERM) while a new one starts: that one must not outlive it."""
        if self._process is not None and self.outcome is None and self._process.returncode is None:
            log.warning("upgrade abandoned: pid %d stops, so the new process (pid %d) is killed", os.getpid(), self._process.pid)
            self._process.kill()


async def upgrade_logged(upgrader, why: str) -> None:
    """SIGUSR2 to an ``Upgrader`` or a supervisor: nobody waits for the answer but the log."""
    try:
        await upgrader.upgrade(why)
    except UpgradeFailed as exc:
        if exc.busy:
            log.warning("upgrade (%s) ignored: %s", why, exc)


class Inherited:
    """The listening sockets the old process offered, by (role, address)."""

    def __init__(self, old_pid: int, sockets: dict[tuple[str, str], list[socket.socket]], next_session_id: int = 0) -> None:
        self.old_pid = old_pid
        self.next_session_id = next_session_id
        self._sockets = sockets
        self.adopted: list[str] = []

    def take(self, role: str, address: str) -> list[socket.socket] | None:
        """The sockets of ``role`` at ``address``, or None: bind them afresh."""
        found = self._sockets.pop((role, address), None)
        if found is not None:
            self.adopted.append(f"{role} {address}")
        return found

    def close_rest(self) -> list[str]:
        """Close what no config key asked for (an address that changed); what they were."""
        closed = [f"{role} {address}" for role, address in self._sockets]
        for sockets in self._sockets.values():
            for sock in sockets:
                sock.close()
        self._sockets.clear()
        return closed


class Successor:
    """The new process's side of the channel it inherited (``--handover-fd``)."""

    def __init__(self, channel: HandoverChannel) -> None:
        self.channel = channel
        self.old_pid: int | None = None

    @classmethod
    def from_fd(cls, fd: int) -> Successor:
        return cls(HandoverChannel.from_fd(fd, "the old process"))

    async def take_listeners(self) -> Inherited:
        offer = await self.channel.receive(timeout=STEP_TIMEOUT, expecting="offer of its listeners")
        sockets = _listening_sockets(offer.fds)  # ours now: each closed unless adopted
        if offer.type != "offer":
            _close_all(sockets)
            raise ProtocolError(f"expected 'offer', got {offer.type!r}")
        entries = offer.fields.get("listeners") or []
        if sum(int(e.get("count", 0)) for e in entries) != len(sockets):
            _close_all(sockets)
            raise ProtocolError(f"the offer lists {sum(int(e.get('count', 0)) for e in entries)} sockets and carries {len(sockets)}")
        self.old_pid = int(offer.fields["pid"])
        by_address: dict[tuple[str, str], list[socket.socket]] = {}
        position = 0
        for entry in entries:
            count = int(entry["count"])
            by_address[(str(entry["role"]), str(entry["address"]))] = sockets[position : position + count]
            position += count
        return Inherited(self.old_pid, by_address, int(offer.fields.get("next_session_id") or 0))

    async def serving(self, inherited: Inherited, bound: list[str], closed: list[str]) -> bool:
        """Tell the old process this one serves; once it confirms, tell systemd (if under it).
        True: the channel stays open for the old process's sessions (``sessions``)."""
        pid = os.getpid()
        fields = {"pid": pid, "adopted": inherited.adopted, "bound": bound, "closed": closed, "sessions": SESSION_FORMAT}
        confirmed = False
        try:
            await self.channel.send(Message("serving", fields), timeout=STEP_TIMEOUT)
            await self.channel.receive(timeout=STEP_TIMEOUT, expecting="confirmation of the hand-over")
            confirmed = True
        except HandoverError as exc:
            log.warning("took over from pid %s without its confirmation: %s; serving on", inherited.old_pid, exc)
            self.channel.close()
        sdnotify.notify(f"MAINPID={pid}", "READY=1")
        return confirmed

    def failed(self, reason: str) -> None:
        """The start failed (config, plugins, a port): tell the old process why, if it listens."""
        if self.channel.sock.fileno() < 0:  # the hand-over is over: this is a later failure
            return
        try:
            self.channel.send_blocking(Message("failed", {"pid": os.getpid(), "reason": reason}), timeout=STEP_TIMEOUT)
        except (HandoverError, OSError) as exc:
            log.warning("could not tell the old process why this start failed: %s", exc)
        self.channel.close()


def _listening_sockets(fds: list[int]) -> list[socket.socket]:
    sockets: list[socket.socket] = []
    for position, fd in enumerate(fds):
        try:
            sock = socket.socket(fileno=fd)
            listening = sock.type == socket.SOCK_STREAM and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        except OSError:
            sock, listening = None, False
        if not listening:
            _close_all(sockets + ([sock] if sock is not None else []))
            for rest in fds[position + (1 if sock is not None else 0) :]:
                os.close(rest)
            raise ProtocolError(f"descriptor {fd} from the old process is not a listening socket")
        sockets.append(sock)
    return sockets


def _close_all(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        sock.close()
