"""Safe mode's table keys: a table's unique keys, columns, triggers and the foreign keys that
refer to it, read from information_schema (``TableKeys``, which
``proxy.sqltext.idempotence.proves`` judges) and cached per target for a minute."""

from __future__ import annotations

import logging

import trio

from proxy.backend import Backend, BackendError
from proxy.sqltext import Dialect, quote_string
from proxy.sqltext.idempotence import TableKeys

__all__ = ["KeyCache", "lower_text"]

log = logging.getLogger("replay_proxy.session")

_TTL = 60.0


class KeyCache:
    """TableKeys per (database, table) of one target, for ``_TTL`` seconds."""

    def __init__(self) -> None:
        self._keys: dict[tuple[str, str], tuple[float, TableKeys | None]] = {}

    def clear(self) -> None:
        self._keys.clear()

    async def get(self, backend: Backend, database: str, table: str) -> TableKeys | None:
        key = (database, table)
        hit = self._keys.get(key)
        if hit is not None and trio.current_time() - hit[0] < _TTL:
            return hit[1]
        keys = await _read_keys(backend, database, table)
        self._keys[key] = (trio.current_time(), keys)
        return keys


async def _read_keys(backend: Backend, database: str, table: str) -> TableKeys | None:
    """The table's unique keys, columns, triggers and referencing foreign keys (None: no such
    table, or information_schema would not say)."""
    where = f"TABLE_SCHEMA = {quote_string(database)} AND TABLE_NAME = {quote_string(table)}"
    try:
        columns = await backend.query(
            f"SELECT COLUMN_NAME, IS_NULLABLE, EXTRA, TABLE_SCHEMA, TABLE_NAME FROM information_schema.COLUMNS WHERE {where} "
            "ORDER BY ORDINAL_POSITION"
        )
        if not columns:
            return None
        if len({(row[3], row[4]) for row in columns}) > 1:
            # information_schema compares names without case: with lower_case_table_names = 0
            # `t` and `T` are two tables, and which one a statement meant is not known here.
            log.warning("safe mode: %s.%s names more than one table when case is ignored", database, table)
            return None
        index_rows = await backend.query(
            f"SELECT INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS WHERE {where} AND NON_UNIQUE = 0 ORDER BY INDEX_NAME, SEQ_IN_INDEX"
        )
        triggers = await backend.query(
            "SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE EVENT_OBJECT_SCHEMA = "
            f"{quote_string(database)} AND EVENT_OBJECT_TABLE = {quote_string(table)}"
        )
        referenced = await backend.query(
            "SELECT COUNT(*) FROM information_schema.REFERENTIAL_CONSTRAINTS WHERE UNIQUE_CONSTRAINT_SCHEMA = "
            f"{quote_string(database)} AND REFERENCED_TABLE_NAME = {quote_string(table)}"
        )
        # TiDB's AUTO_RANDOM primary key generates its value as AUTO_INCREMENT does (for NULL,
        # and for 0 without NO_AUTO_VALUE_ON_ZERO), yet COLUMNS.EXTRA does not say so.
        sharding = []
        if Dialect.from_server_version(backend.handshake.server_version).flavor == "tidb":
            sharding = await backend.query(f"SELECT TIDB_ROW_ID_SHARDING_INFO FROM information_schema.TABLES WHERE {where}")
    except BackendError as exc:
        log.warning("safe mode: cannot read the keys of %s.%s: %s", database, table, exc)
        return None
    # An INSERT without a column list fills the visible columns only (MariaDB's INVISIBLE):
    # its values are matched to those, in order.
    visible = tuple(lower_text(row[0]) for row in columns if "invisible" not in lower_text(row[2]))
    nullable = {lower_text(row[0]) for row in columns if lower_text(row[1]).upper() == "YES"}
    indexes: dict[str, list[str]] = {}
    for index, column in index_rows:
        indexes.setdefault(lower_text(index), []).append(lower_text(column))
    unique = tuple(frozenset(cols) for cols in indexes.values() if not set(cols) & nullable)
    auto_increment = next((lower_text(row[0]) for row in columns if "auto_increment" in lower_text(row[2])), None)
    primary = indexes.get("primary", [])
    if sharding and lower_text(sharding[0][0]).startswith("pk_auto_random_bits") and len(primary) == 1:
        auto_increment = primary[0]
    return TableKeys(
        unique_keys=unique,
        key_columns=frozenset(c for cols in indexes.values() for c in cols),
        columns=visible,
        has_triggers=_count(triggers) > 0,
        referenced=_count(referenced) > 0,
        auto_increment=auto_increment,
    )


def lower_text(value: bytes | None) -> str:
    return "" if value is None else value.decode("utf-8", "surrogateescape").lower()


def _count(rows: list) -> int:
    return int(rows[0][0]) if rows and rows[0][0] is not None else 0
