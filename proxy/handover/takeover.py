"""Taking over the sessions of a worker that died (``--workers N``; ``keeper``, ``mirror``).

The supervisor hands the worker that took the dead one's place each of its sessions: the
client socket, the session's record (``slot``) and its last restorable state. The backend
connection died with the worker (the server rolls back what was open on it), so the session
goes on as after any loss of its backend connection (``proxy.recovery``), from where its record
says it stood (``decide``, a pure function):

- idle, or a command read and not sent: the bytes the dead worker read are in the record; they
  are read again here, and the command runs as if it had just arrived. Outside a transaction,
  the client sees only a delay. Inside one, the transaction died with the connection and its
  journal with the worker: the client's next statement gets 1213 (DM retries the batch in
  place), a ROLLBACK gets OK;
- a command sent: it is the command in flight of a lost connection, and recovery judges it as
  ever: a read is sent again; in a transaction, 1213; a COMMIT is settled by its commit marker
  (OK or 1213) or, without one, is a connection error (1158); an autocommit write likewise,
  unless safe mode proves it idempotent;
- an answer begun, bytes the record does not hold, or a record the socket contradicts: the
  client connection is closed (its command never gets a wrong answer).

LAST_INSERT_ID() is restored only if no statement moved it since the supervisor's last copy of
the state (that copy is not updated per INSERT); TLS sessions are not registered at all.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any

import attrs
import trio

from proxy.cycle.inflight import SENT, Inflight, for_payload
from proxy.handover.record import SlotRecord
from proxy.handover.sessions import thaw_backend, thaw_session
from proxy.handover.slot import (
    INSERT_ID_MOVED,
    LONG_DATA_HELD,
    PENDING,
    PENDING_MAY_HAVE_COMMITTED,
    WROTE,
    Phase,
    Record,
    Slot,
    consumed,
    written,
)
from proxy.netio import Channel
from proxy.protocol.constants import Commands
from proxy.protocol.framing import PacketDecoder
from proxy.session.tracker import Orphaned, Pending
from proxy.sessionlog import SessionLog

if TYPE_CHECKING:
    from proxy.handover.mirror import Mirror
    from proxy.relay.session import Session

__all__ = ["decide", "Verdict", "take_over_session"]

log = logging.getLogger("replay_proxy.handover")

C = Commands
# Commands whose loss in flight recovery can judge (what ``Session._submit`` sends); any other
# (COM_CHANGE_USER's exchange, the proxy's refusals) closes the session.
_RECOVERABLE = frozenset({C.COM_QUERY, C.COM_STMT_PREPARE, C.COM_STMT_EXECUTE, C.COM_STMT_RESET, C.COM_STMT_FETCH,
                          C.COM_PING, C.COM_INIT_DB, C.COM_FIELD_LIST, C.COM_STATISTICS, C.COM_RESET_CONNECTION,
                          C.COM_SET_OPTION, C.COM_DEBUG, C.COM_PROCESS_INFO})  # fmt: skip


@attrs.frozen
class Verdict:
    """What to do with a session taken over: ``reread`` the client bytes ``pending`` (the
    command read and not sent, and anything after it), or recover the command ``inflight``
    (its payload) first; or ``close`` it, for ``reason``."""

    close: str | None = None
    pending: bytes = b""
    inflight: bytes | None = None


def decide(record: Record, consumed_now: int | None, written_now: int | None, settled: int) -> Verdict:
    """The fate of a session from its record, the kernel's counts of what was read from its
    client socket and written to it, and the last command whose completion the supervisor's
    copy of its state includes (``settled``)."""
    if consumed_now is None or written_now is None:
        return Verdict("the kernel does not say how much of the client's stream was read and written")
    if record.phase == Phase.ANSWERING:
        if not record.answer_end or written_now != record.answer_end:
            return Verdict("the worker died while it wrote an answer to the client")
        # The whole answer left (only the record's last word was missing): idle after it.
        record = attrs.evolve(record, phase=Phase.IDLE, start=record.start + record.wire, wire=0)
    if record.phase in (Phase.READ, Phase.SENT) and record.retried == record.start + 1:
        return Verdict("its command was in flight when the worker died, and again when the worker that ran it again died: "
                       "it is not run a third time")  # fmt: skip
    if consumed_now < record.expected:
        return Verdict(f"the record ({record.expected} bytes) is ahead of the client socket ({consumed_now} bytes read)")
    if record.phase == Phase.IDLE or record.phase == Phase.READ:
        pending = record.take(record.start, consumed_now)
        if pending is None:
            return Verdict("the client's bytes the worker had read are more than its record keeps")
        return Verdict(pending=pending)
    if record.phase != Phase.SENT:
        return Verdict(f"the record's phase {record.phase} is not one this version writes")
    if settled >= record.number:
        return Verdict("the command in flight had completed; its answer was not written to the client")
    if record.flags & LONG_DATA_HELD:
        return Verdict("long data (COM_STMT_SEND_LONG_DATA) for an execute was kept by the worker that died")
    frames = record.take(record.start, record.start + record.wire)
    after = record.take(record.start + record.wire, consumed_now)
    if frames is None or after is None:
        return Verdict("the command in flight is larger than the record keeps")
    decoder = PacketDecoder()
    decoder.feed(frames)
    packet = decoder.next_packet()
    if packet is None or decoder.buffered() or not packet.payload or packet.payload[0] not in _RECOVERABLE:
        return Verdict("the command in flight is not one recovery can judge")
    return Verdict(pending=after, inflight=packet.payload)


async def take_over_session(mirror: Mirror, message: dict[str, Any], fds: list[int]) -> None:
    """One session of a dead worker, as the keeper sent it: run it here, or close it."""
    proxy = mirror.proxy
    sid, dead, fields = int(message["id"]), int(message["pid"]), message["fields"]
    client_fd, slot_fd = fds
    if proxy.target.session_by_id(sid) is not None:  # it moved here already (an upgrade)
        os.close(client_fd)
        os.close(slot_fd)
        return
    sock = socket.socket(fileno=client_fd)
    now, out = consumed(sock), written(sock)
    record = session = None
    try:
        record = Record.from_fd(slot_fd)
        verdict = decide(record, now, out, int(fields.get("settled", 0)))
        peer = _address(sock)
        if verdict.close is None and peer != fields.get("client_address"):
            verdict = Verdict(f"the socket kept for it is connected to {peer}, not to its client {fields.get('client_address')}")
        if verdict.close is None:
            session = _thaw(proxy, fields, sock, dead, record, verdict)
    except Exception as exc:  # noqa: BLE001 -- a record or a state this version cannot read: closed, never guessed
        verdict = Verdict(f"{type(exc).__name__}: {exc}")
    if session is None:
        phase = Phase.NAMES.get(record.phase, "?") if record is not None else "unreadable"
        user = str((fields.get("state") or {}).get("username", ""))
        slog = SessionLog(log, sid, proxy.target.name, str(fields.get("client_address", "")), user=lambda: user)
        slog.warning("closed: worker pid %d, which ran it, died (%s): %s", dead, phase, verdict.close, extra={"event": "takeover_closed"})
        proxy.target.stats.takeover_sessions["closed"] += 1
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()
        os.close(slot_fd)
        return
    slot = Slot(slot_fd)
    slot.retried(record.start if verdict.inflight is not None or verdict.pending else None)
    slot.adopted(now, out)
    session.kept_by(SlotRecord(slot, session.client))
    kind = "in_flight" if verdict.inflight is not None else "in_transaction" if record.in_transaction else "idle"
    proxy.target.stats.takeover_sessions[kind] += 1
    session.log.warning("taken over from worker pid %d, which died (%s)%s", dead, Phase.NAMES[record.phase],
                        "; its transaction died with the backend connection: the next statement gets 1213"
                        if record.in_transaction and verdict.inflight is None else "",
                        extra={"event": "session_taken_over"})  # fmt: skip
    proxy.adopt(session, dead, float(fields.get("age", 0.0)), taken_over=True)


def _thaw(proxy, f: dict, sock: socket.socket, dead: int, record: Record, verdict: Verdict) -> Session:
    """The session of ``f`` on the client socket, as its record says it stood."""
    why = f"worker pid {dead}, which held its backend connection, died"
    b = f.get("backend")

    def attach(s: Session) -> None:
        gone = thaw_backend(proxy, b, Channel(socket.socket(), f"backend {b['address']} (held by worker pid {dead})")) if b else None
        s.link.adopted_lost(int(f["recoveries"]), gone)

    pending = None
    if record.flags & PENDING:
        pending = Pending(bool(record.flags & PENDING_MAY_HAVE_COMMITTED), f"an error left the transaction's fate open; {why}")
    orphaned = Orphaned(why, record.in_transaction, bool(record.flags & WROTE), pending, record.xa, bool(record.flags & INSERT_ID_MOVED),
                        bool(record.flags & LONG_DATA_HELD) and verdict.inflight is None)  # fmt: skip
    s = thaw_session(proxy, f, sock, attach, orphaned)
    s.without_connection(why)
    if s.parts.markers is not None:
        s.parts.markers.written = max(s.parts.markers.written, record.marker)
    if verdict.pending:
        s.client.decoder.feed(verdict.pending)  # read again here: the command the dead worker had read
    if verdict.inflight is not None:
        s.cycle.adopt(s.cycle.commands, s.cycle.settled, _inflight(s, verdict.inflight, record))
    return s


def _inflight(s: Session, payload: bytes, record: Record) -> Inflight:
    """The command that was in flight, as the dead worker had made it (sent)."""
    # It arrived before the dead worker sent it: its waits count from then, and a DDL's job is
    # looked for among those created since (a later time would miss the job and run it again).
    now = trio.current_time()
    arrived = now - max(0.0, time.time() - record.sent_at) if record.sent_at else now
    inflight = for_payload(payload, s.tracking, s.deprecate_eof, arrived, state=SENT)
    inflight.marker = record.marker
    return inflight


def _address(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
    except OSError as exc:
        return f"nothing ({exc.strerror or exc})"
    return f"{host}:{port}"
