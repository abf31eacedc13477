"""Who closed the backend connection: an operator's KILL (the client is told, the session ends,
nothing is run again) or a server going away (recovery)? And the proxy's own KILL of a lost
session's old connection, so that its locks go away before a replay."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from proxy.backend import Backend, BackendError, kill_own, restarted_since, server_status
from proxy.cycle.inflight import ConnectionFailed
from proxy.netio import PeerClosed
from proxy.protocol.packets import ProtocolError, make_err
from proxy.sessionlog import outcome
from proxy.sqltext import Dialect

if TYPE_CHECKING:
    from proxy.relay.link import BackendLink
    from proxy.sessionlog import SessionLog
    from proxy.stats import Stats
    from proxy.target import Target

__all__ = ["killed_by_operator", "killed", "kill_if_alive", "old_session_gone"]


async def killed_by_operator(link: BackendLink, target: Target, io_timeout: float, slog: SessionLog, last_activity: float) -> bool:
    """The backend connection ended (a clean close, or ER_CONNECTION_KILLED): an operator's
    KILL, or a server going away (a shutdown kills every session; another server may answer
    behind the same address), or a load balancer dropping it? It is a KILL only when a new
    connection reaches the very same server process, still up, and that server ran a KILL
    since this connection opened (Com_kill went up by more than the KILLs this proxy process sent
    itself, for other sessions' recoveries), or, where the server counts no KILLs (TiDB), another
    session relayed a KILL of this very connection moments ago; a closed door, a restarted or
    another server, an idle session dropped after its wait_timeout, a close without any KILL:
    recovery. ``last_activity``: when the session's last command completed."""
    old = link.backend
    if old is None or link.login is None or old.instance is None:
        return False
    state = link.tracking.state
    wait = state.wait_timeout(old.wait_timeout) if state is not None else old.wait_timeout
    if wait and trio.current_time() - last_activity >= wait - 1:
        return False
    try:
        with trio.fail_after(io_timeout):
            probe = await target.connect(link.login)
    except (BackendError, trio.TooSlowError):
        return False  # not accepting connections: going down
    kills, same = None, False
    try:
        with trio.fail_after(io_timeout):
            same = await restarted_since(probe, old) is False
            if same and old.instance.kills is not None:
                kills = int((await server_status(probe)).get("com_kill", -1))
    except (trio.TooSlowError, PeerClosed, ProtocolError, BackendError, ValueError):
        kills = None
    finally:
        probe.close()
    # The same process, still up, and a KILL was run since this connection opened. (Without a
    # KILL, a clean close with the server up is a load balancer or a network: recover.)
    if kills is not None and old.instance.operator_kills_since(kills) > 0:
        slog.warning(
            "backend connection %d closed by %s, which is still up and ran a KILL since: an operator's KILL; the client is told, the session ends",
            old.connection_id,
            old.instance.hostname,
            **outcome("killed_1927", 1927),
        )
        return True
    relayed = link.kill_relayed  # (connection id, when): a refused KILL must not count later
    if same and relayed is not None and relayed[0] == old.connection_id and trio.current_time() - relayed[1] < io_timeout:
        slog.warning(
            "backend connection %d closed by %s, which is still up, right after another session's KILL of it; the client is told, the session ends",
            old.connection_id,
            old.instance.hostname,
            **outcome("killed_1927", 1927),
        )
        return True
    return False


def killed(stats: Stats, reason: str) -> ConnectionFailed:
    """What the client gets after an operator's KILL: the server's error, then the end."""
    msg = f"Connection was killed (replay-proxy: {reason})"
    stats.recovered("killed_1927", 0.0)
    return ConnectionFailed(make_err(1927, "70100", msg), msg)


async def kill_if_alive(backend: Backend, old: Backend, slog: SessionLog) -> None:
    """KILL the old connection id, but only on the same server instance: after a restart
    the id may belong to someone else."""
    if await restarted_since(backend, old) is False:
        try:
            if await _kill_safely(backend, old.connection_id, slog) is True:
                slog.info("killed old backend connection %d", old.connection_id)
        except BackendError:
            pass  # already gone


async def _kill_safely(backend: Backend, conn_id: int, slog: SessionLog | None) -> bool | None:
    """KILL ``conn_id``, except on TiDB while it has a transaction open: there a KILL makes the
    whole tidb-server panic as the killed session rolls back (pingcap/tidb#63956, fixed by
    #63992 / #64001; reproduced on the release-8.5 build of 10 Nov 2025, and seen in the soak
    at the heal of long partitions). Such a connection is left to end on its own; what needed
    it gone cannot count on it (a marker is fenced instead). True: killed; None: gone
    already; False: left alive."""
    if Dialect.from_server_version(backend.handshake.server_version).flavor == "tidb":
        rows = await backend.query(f"SELECT TxnStart FROM information_schema.PROCESSLIST WHERE ID = {int(conn_id)}")
        if not rows:
            return None
        if rows[0][0]:
            if slog is not None:
                slog.warning("not killing old backend connection %d: it has a transaction open, and a KILL of such a "
                             "connection crashes tidb-server versions without pingcap/tidb#63992", conn_id)  # fmt: skip
            return False
    await kill_own(backend, conn_id)
    return True


async def old_session_gone(backend: Backend, old: Backend, io_timeout: float, slog: SessionLog | None = None) -> bool:
    """Is the old connection certainly dead, so that what it ran cannot still land (a COMMIT,
    a DDL job)? Only on the same server: a restarted process, or a KILL and its absence from
    PROCESSLIST."""
    if backend.address != old.address:
        return False  # another server: nothing here can prove it
    restarted = await restarted_since(backend, old)
    if restarted:
        return True  # a new process: the old one and its sessions are gone
    if restarted is None:
        return False  # another server behind the address, or no way to tell: nothing proves it
    conn_id = int(old.connection_id)  # the same server process: the id is still ours to KILL
    try:
        killed_now = await _kill_safely(backend, conn_id, slog)
        if killed_now is None:
            return True  # not in PROCESSLIST any more
        if killed_now is False:
            return False  # alive, and not to be killed: nothing proves it will not land
    except BackendError:
        pass  # unknown thread: gone already
    deadline = trio.current_time() + io_timeout
    while True:
        rows = await backend.query(f"SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = {conn_id}")
        if rows and rows[0][0] == b"0":
            return True
        if trio.current_time() >= deadline:
            return False
        await trio.sleep(0.1)
