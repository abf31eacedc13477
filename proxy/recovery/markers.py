"""Commit markers: resolve a COMMIT whose answer was lost, exactly.

With ``recovery.commit_marker``, each transaction upserts its session's row (``slot``) in the
marker table just before COMMIT, with the transaction's number. The row commits or not with the
transaction. When the COMMIT's answer is lost, the proxy makes sure the COMMIT cannot still
land, then reads the row: number there -> committed.

Two ways to make sure. On the same server process, the old connection is proven dead (a
restarted server, or a KILL and its absence from PROCESSLIST). On TiDB, where the session may
fail over to another tidb-server of the cluster (or another one answers behind the same
address), nothing proves the old server dead: the proxy *fences* the marker row instead
(``_fence``): a pessimistic transaction locks the row, which waits until the old transaction's
lock on it is resolved (committed, or rolled back once its TTL passes if its server died), reads
it, and commits a real write of it. An old transaction that had not yet written the row can
then never commit: its prewrite finds a newer write of the key (a write conflict) and fails.
"""

from __future__ import annotations

import logging
import os

import trio

from proxy.backend import Backend, BackendError
from proxy.recovery.kills import old_session_gone

__all__ = ["MarkerTable", "CommitMarkers"]

log = logging.getLogger("replay_proxy.markers")


class MarkerTable:
    """The target's marker table, created once (and rows of long-gone sessions dropped)."""

    def __init__(self, table: str, target: str) -> None:
        self.table = table
        self.target = target
        self._lock = trio.Lock()
        self._ready: bool | None = None

    @property
    def ready(self) -> bool:
        """Prepared (``ensure``): until then, and after the backend refused, markers are off."""
        return self._ready is True

    def known_ready(self) -> None:
        """The process this one took over from had prepared the table (an upgrade)."""
        if self._ready is None:
            self._ready = True

    async def ensure(self, backend: Backend) -> bool:
        """False when the backend refuses: markers are then off, with an error in the log."""
        async with self._lock:
            if self._ready is None:
                table = self.table
                schema = table.rsplit(".", 1)[0] if "." in table else None
                try:
                    if schema:
                        await backend.query(f"CREATE DATABASE IF NOT EXISTS {schema}")
                    await backend.query(
                        f"CREATE TABLE IF NOT EXISTS {table} (slot BINARY(16) NOT NULL PRIMARY KEY,"
                        " txn BIGINT UNSIGNED NOT NULL,"
                        " updated TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP)"
                    )
                    await backend.query(f"DELETE FROM {table} WHERE updated < NOW() - INTERVAL 7 DAY")
                    self._ready = True
                except BackendError as exc:
                    log.error("target %s: commit markers disabled, cannot prepare %s: %s", self.target, table, exc)
                    self._ready = False
        return self._ready


class CommitMarkers:
    """One session's marker row and transaction numbering."""

    def __init__(self, table: MarkerTable, session_id: int) -> None:
        self.table = table
        self.session_id = session_id
        self.slot = os.urandom(16).hex()
        self.written = 0  # number of the last marker written (committed or not)

    @property
    def on(self) -> bool:
        """Written before a COMMIT: once the table is prepared (at the session's login)."""
        return self.table.ready

    def upsert_sql(self) -> tuple[int, bytes]:
        """(number, COM_QUERY payload) of the marker of the transaction about to commit."""
        number = self.written + 1
        sql = f"INSERT INTO {self.table.table} (slot, txn) VALUES (X'{self.slot}', {number}) ON DUPLICATE KEY UPDATE txn = VALUES(txn)"
        return number, b"\x03" + sql.encode()

    async def committed(self, backend: Backend, old: Backend | None, number: int, io_timeout: float, flavor: str = "") -> bool | None:
        """Did the in-doubt COMMIT (marker ``number``) commit? None when it cannot be known:
        the old connection might still be alive and commit later (and no fence exists)."""
        if old is not None and await old_session_gone(backend, old, io_timeout):
            rows = await backend.query(f"SELECT txn FROM {self.table.table} WHERE slot = X'{self.slot}'")
        elif flavor == "tidb":
            rows = await self._fence(backend)
            if rows is None:
                return None
        else:
            return None
        stored = int(rows[0][0]) if rows and rows[0][0] is not None else 0
        return stored >= number

    async def _fence(self, backend: Backend) -> list | None:
        """TiDB: the marker row as committed once no older transaction can still write it
        (module doc). None when the server refused a step (the transaction is rolled back)."""
        table, slot = self.table.table, f"X'{self.slot}'"
        try:
            await backend.query("BEGIN PESSIMISTIC")
            rows = await backend.query(f"SELECT txn FROM {table} WHERE slot = {slot} FOR UPDATE")
            if rows:  # a Put of the row (an UPDATE that changes nothing writes nothing)
                await backend.query(f"UPDATE {table} SET txn = txn + 1 WHERE slot = {slot}")
                await backend.query(f"UPDATE {table} SET txn = txn - 1 WHERE slot = {slot}")
            else:  # no marker committed yet: 0 says so, and is the write that fences
                await backend.query(f"INSERT INTO {table} (slot, txn) VALUES ({slot}, 0)")
            await backend.query("COMMIT")
        except BackendError as exc:
            log.warning("target %s: commit marker fence failed: %s", self.table.target, exc)
            try:
                await backend.query("ROLLBACK")
            except BackendError:
                pass
            return None
        return rows
