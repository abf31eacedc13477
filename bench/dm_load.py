"""The upstream side of bench.dm_e2e: a shop's schema, its preloaded data, a writing load, a
heartbeat, and the table checksums both ends are compared by.

The load runs against the upstream MariaDB directly (DM reads its binlog): several tables,
transactions of several statements (new order: an INSERT with AUTO_INCREMENT, its lines, stock
and balance UPDATEs, an event), single-statement updates that change a unique key, deletes by
key and by range, and every ``ddl_interval`` seconds a DDL as users write them (a new table with
UNIQUE and prefix KEYs and DEFAULT expressions, ALTER TABLE ADD COLUMN / ADD KEY, CREATE INDEX)
that DM replicates wrapped in SET TIMESTAMP. A heartbeat row is set to the upstream clock (UTC) every 250 ms: read on
TiDB, it says how far behind DM is, whatever DM itself reports.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

import pymysql

SCHEMA = "shop"
TABLES = {
    "customers": "id BIGINT PRIMARY KEY, name VARCHAR(64) NOT NULL, email VARCHAR(128) NOT NULL, "
    "balance DECIMAL(14,2) NOT NULL DEFAULT 0, updated DATETIME(6) NOT NULL, "
    "UNIQUE KEY uk_email (email), KEY idx_name (name(16))",
    "products": "sku VARCHAR(32) PRIMARY KEY, title VARCHAR(128) NOT NULL, price DECIMAL(10,2) NOT NULL, "
    "stock INT NOT NULL, KEY idx_title (title)",
    "orders": "id BIGINT AUTO_INCREMENT PRIMARY KEY, customer_id BIGINT NOT NULL, "
    "state ENUM('new','paid','shipped','cancelled') NOT NULL DEFAULT 'new', total DECIMAL(14,2) NOT NULL, "
    "created DATETIME(6) NOT NULL, note VARCHAR(255), KEY idx_customer (customer_id, created)",
    "order_items": "order_id BIGINT NOT NULL, line INT NOT NULL, sku VARCHAR(32) NOT NULL, qty INT NOT NULL, "
    "price DECIMAL(10,2) NOT NULL, PRIMARY KEY (order_id, line)",
    "events": "id BIGINT AUTO_INCREMENT PRIMARY KEY, kind VARCHAR(16) NOT NULL, ref BIGINT, payload TEXT, "
    "at DATETIME(6) NOT NULL, KEY idx_kind (kind, at)",
    "heartbeat": "id INT PRIMARY KEY, ts DATETIME(6) NOT NULL",
}
COLUMNS = {
    "customers": "id, name, email, balance, updated",
    "products": "sku, title, price, stock",
    "orders": "id, customer_id, state, total, created, note",
    "order_items": "order_id, line, sku, qty, price",
    "events": "id, kind, ref, payload, at",
    "heartbeat": "id, ts",
}


def connect(port: int, database: str | None = SCHEMA, **kw) -> pymysql.Connection:
    conn = pymysql.connect(host="127.0.0.1", port=port, user="root", password="", database=database, autocommit=True,
                           charset="utf8mb4", connect_timeout=10, read_timeout=60, **kw)  # fmt: skip
    with conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
    return conn


def create_and_preload(port: int, scale: int, seed: int = 7) -> dict[str, int]:
    """Create the schema upstream and fill it: ``scale`` orders (3 lines each on average), a
    customer per 5 orders, an event per order. Returns the row count per table."""
    rng = random.Random(seed)
    conn = connect(port, database=None)
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {SCHEMA} CHARACTER SET utf8mb4")
        cur.execute(f"USE {SCHEMA}")
        for name, columns in TABLES.items():
            cur.execute(f"CREATE TABLE {name} ({columns}) ENGINE=InnoDB")
        customers, products = max(scale // 5, 10), max(scale // 50, 20)
        _insert_many(cur, "customers", [(i, f"name {i}", f"c{i}@shop.example", "100.00", _stamp(rng)) for i in range(1, customers + 1)])
        _insert_many(cur, "products", [(f"sku-{i}", f"product {i} " + "x" * rng.randint(0, 60), f"{rng.randint(100, 99999) / 100:.2f}",
                                        10**6) for i in range(1, products + 1)])  # fmt: skip
        orders, items, events = [], [], []
        for o in range(1, scale + 1):
            lines = rng.randint(1, 5)
            orders.append((o, rng.randint(1, customers), rng.choice(["new", "paid", "shipped"]), f"{lines * 9.5:.2f}",
                           _stamp(rng), None if o % 3 else "gift " * rng.randint(1, 20)))  # fmt: skip
            items += [(o, line, f"sku-{rng.randint(1, products)}", rng.randint(1, 4), "9.50") for line in range(1, lines + 1)]
            events.append((o, "order", o, "p" * rng.randint(50, 400), _stamp(rng)))
        _insert_many(cur, "orders", orders)
        _insert_many(cur, "order_items", items)
        _insert_many(cur, "events", events)
        cur.execute("INSERT INTO heartbeat VALUES (1, UTC_TIMESTAMP(6))")
    conn.close()
    return {"customers": customers, "products": products, "orders": scale, "order_items": len(items), "events": scale}


def _stamp(rng: random.Random) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(1_700_000_000 + rng.randint(0, 30_000_000))) + f".{rng.randint(0, 999999):06d}"


def _insert_many(cur, table: str, rows: list[tuple], chunk: int = 2000) -> None:
    if not rows:
        return
    marks = "(" + ", ".join(["%s"] * len(rows[0])) + ")"
    for i in range(0, len(rows), chunk):
        cur.executemany(f"INSERT INTO {table} ({COLUMNS[table]}) VALUES {marks}", rows[i : i + chunk])


@dataclass
class LoadStats:
    transactions: int = 0
    statements: int = 0
    errors: list[str] = field(default_factory=list)


class ShopLoad:
    """``threads`` writers at ``rate`` transactions per second in all, and the heartbeat."""

    def __init__(self, port: int, rate: float, threads: int = 4, seed: int = 11, ddl_interval: float = 20) -> None:
        self.port, self.rate, self.threads, self.ddl_interval = port, rate, threads, ddl_interval
        self.stats = LoadStats()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._seed = seed
        self._workers: list[threading.Thread] = []

    def start(self) -> None:
        conn = connect(self.port)
        with conn.cursor() as cur:
            cur.execute("SELECT MAX(id) FROM customers")
            self._customers = cur.fetchone()[0]
            cur.execute("SELECT COUNT(*) FROM products")
            self._products = cur.fetchone()[0]
        conn.close()
        self._next_customer = self._customers + 1
        for i in range(self.threads):
            self._workers.append(threading.Thread(target=self._writer, args=(i,), daemon=True, name=f"shop-{i}"))
        self._workers.append(threading.Thread(target=self._heartbeat, daemon=True, name="heartbeat"))
        if self.ddl_interval > 0:
            self._workers.append(threading.Thread(target=self._ddl, daemon=True, name="ddl"))
        for t in self._workers:
            t.start()

    def stop(self) -> LoadStats:
        self._stop.set()
        for t in self._workers:
            t.join(30)
        return self.stats

    def _heartbeat(self) -> None:
        conn = connect(self.port)
        while not self._stop.wait(0.25):
            with conn.cursor() as cur:
                cur.execute("UPDATE heartbeat SET ts = UTC_TIMESTAMP(6) WHERE id = 1")
        with conn.cursor() as cur:  # the last word: the catch-up wait looks for it downstream
            cur.execute("UPDATE heartbeat SET ts = UTC_TIMESTAMP(6) WHERE id = 1")
        conn.close()

    def _ddl(self) -> None:
        """A new audit table, then changes to it, one DDL every ``ddl_interval`` seconds; the
        tables get a few rows so their columns are compared too."""
        conn = connect(self.port)
        steps = [
            "CREATE TABLE IF NOT EXISTS audit_{n} (id BIGINT AUTO_INCREMENT PRIMARY KEY, ref BIGINT NOT NULL, "
            "note VARCHAR(64) NOT NULL DEFAULT 'x', at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), "
            "UNIQUE KEY uk_ref (ref), KEY idx_note (note(8)))",
            "ALTER TABLE audit_{n} ADD COLUMN extra INT NOT NULL DEFAULT 0, ADD KEY idx_extra (extra)",
            "CREATE INDEX idx_ref_at ON audit_{n} (ref, at)",
            "ALTER TABLE audit_{n} MODIFY COLUMN note VARCHAR(128) NOT NULL DEFAULT 'y'",
        ]
        n = 0
        while not self._stop.wait(self.ddl_interval):
            table = n // len(steps)
            try:
                with conn.cursor() as cur:
                    cur.execute(steps[n % len(steps)].format(n=table))
                    cur.execute(f"INSERT INTO audit_{table} (ref, note) VALUES (%s, %s)", (n, f"ddl step {n}"))
                with self._lock:
                    self.stats.statements += 2
            except pymysql.MySQLError as exc:
                with self._lock:
                    self.stats.errors.append(str(exc)[:200])
            n += 1
        conn.close()

    def _writer(self, index: int) -> None:
        rng = random.Random(self._seed * 1000 + index)
        conn = connect(self.port)
        interval = self.threads / self.rate
        due = time.monotonic()
        while not self._stop.is_set():
            due += interval
            try:
                n = self._transaction(conn, rng)
                with self._lock:
                    self.stats.transactions += 1
                    self.stats.statements += n
            except pymysql.MySQLError as exc:  # deadlocks between writers happen: count them
                with self._lock:
                    self.stats.errors.append(str(exc)[:200])
                conn.rollback()
            pause = due - time.monotonic()
            if pause > 0:
                self._stop.wait(pause)
        conn.close()

    def _transaction(self, conn: pymysql.Connection, rng: random.Random) -> int:
        roll = rng.random()
        with conn.cursor() as cur:
            if roll < 0.40:
                return self._new_order(cur, rng)
            if roll < 0.65:  # pay or ship an order
                cur.execute("UPDATE orders SET state = %s WHERE id = %s", (rng.choice(["paid", "shipped"]), self._some_order(cur, rng)))
                return 1
            if roll < 0.75:
                return self._cancel(cur, rng)
            if roll < 0.88:  # a customer changes name and email (a unique key)
                cid = rng.randint(1, self._customers)
                cur.execute("UPDATE customers SET name = %s, email = %s, updated = UTC_TIMESTAMP(6) WHERE id = %s",
                            (f"renamed {rng.random():.6f}", f"c{cid}-{rng.getrandbits(40)}@shop.example", cid))  # fmt: skip
                return 1
            if roll < 0.94:
                with self._lock:
                    cid = self._next_customer
                    self._next_customer += 1
                cur.execute("INSERT INTO customers (id, name, email, balance, updated) VALUES (%s, %s, %s, 0, UTC_TIMESTAMP(6))",
                            (cid, f"new {cid}", f"n{cid}@shop.example"))  # fmt: skip
                return 1
            cur.execute("DELETE FROM events WHERE kind = 'order' AND id < %s ORDER BY id LIMIT 20", (rng.randint(1, 10**6),))
            return 1

    def _some_order(self, cur, rng: random.Random) -> int:
        cur.execute("SELECT MAX(id) FROM orders")
        return rng.randint(1, cur.fetchone()[0] or 1)

    def _new_order(self, cur, rng: random.Random) -> int:
        cur.execute("BEGIN")
        customer = rng.randint(1, self._customers)
        lines = [(f"sku-{rng.randint(1, self._products)}", rng.randint(1, 3)) for _ in range(rng.randint(1, 4))]
        total = sum(q for _, q in lines) * 9.5
        cur.execute("INSERT INTO orders (customer_id, total, created, note) VALUES (%s, %s, UTC_TIMESTAMP(6), %s)",
                    (customer, f"{total:.2f}", "n" * rng.randint(0, 80)))  # fmt: skip
        order = cur.lastrowid
        for line, (sku, qty) in enumerate(lines, 1):
            cur.execute("INSERT INTO order_items VALUES (%s, %s, %s, %s, '9.50')", (order, line, sku, qty))
            cur.execute("UPDATE products SET stock = stock - %s WHERE sku = %s", (qty, sku))
        cur.execute("UPDATE customers SET balance = balance - %s, updated = UTC_TIMESTAMP(6) WHERE id = %s", (f"{total:.2f}", customer))
        cur.execute(
            "INSERT INTO events (kind, ref, payload, at) VALUES ('order', %s, %s, UTC_TIMESTAMP(6))", (order, "e" * rng.randint(20, 300))
        )
        cur.execute("COMMIT")
        return 2 * len(lines) + 5

    def _cancel(self, cur, rng: random.Random) -> int:
        order = self._some_order(cur, rng)
        cur.execute("BEGIN")
        cur.execute("SELECT sku, qty FROM order_items WHERE order_id = %s FOR UPDATE", (order,))
        lines = cur.fetchall()
        for sku, qty in lines:
            cur.execute("UPDATE products SET stock = stock + %s WHERE sku = %s", (qty, sku))
        cur.execute("DELETE FROM order_items WHERE order_id = %s", (order,))
        cur.execute("DELETE FROM orders WHERE id = %s", (order,))
        cur.execute("COMMIT")
        return len(lines) + 5


def row_digest_sql(columns: list[str]) -> str:
    """SQL for one row's digest over ``columns``, the same text on MariaDB and TiDB: every value
    as the hex of its text (``CAST(... AS CHAR)``: a DECIMAL keeps its scale, a DATETIME(6) its
    microseconds), NULL as ``N``, joined with commas. Hex has no comma and no N, so the joined
    text says exactly which value each column held: NULL and '' differ, and so does a value
    moved to the next column (``CONCAT_WS`` over the raw values skips NULLs and lets a comma
    inside a value pass for a separator)."""
    parts = ", ".join(f"COALESCE(HEX(CAST(`{c}` AS CHAR)), 'N')" for c in columns)
    return f"MD5(CONCAT_WS(',', {parts}))"


def table_checksum_sql(table: str, columns: list[str]) -> str:
    """(row count, sum of the rows' digests' first 60 bits): order-free, exact (DECIMAL sum)."""
    digest = f"CAST(CONV(SUBSTRING({row_digest_sql(columns)}, 1, 15), 16, 10) AS UNSIGNED)"
    return f"SELECT COUNT(*), COALESCE(SUM({digest}), 0) FROM `{table}`"


def checksums(
    port: int, user: str = "root", password: str = "", schema: str = SCHEMA, host: str = "127.0.0.1"
) -> dict[str, tuple[int, int]]:
    """(row count, checksum of every row over every column, ``table_checksum_sql``) per table of
    ``schema`` but the heartbeat, computed by the same SQL on MariaDB and TiDB."""
    conn = pymysql.connect(host=host, port=port, user=user, password=password, database=schema, charset="utf8mb4",
                           connect_timeout=10, read_timeout=300)  # fmt: skip
    out = {}
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = %s "
                        "AND table_name <> 'heartbeat' ORDER BY table_name, ordinal_position", (schema,))  # fmt: skip
            columns: dict[str, list[str]] = {}
            for table, column in cur.fetchall():
                columns.setdefault(table, []).append(column)
            for table in sorted(columns):
                cur.execute(table_checksum_sql(table, columns[table]))
                count, digest = cur.fetchone()
                out[table] = (int(count), int(digest))
    finally:
        conn.close()
    return out


def heartbeat_lag(port: int, host: str = "127.0.0.1") -> float | None:
    """Seconds between now (UTC) and the heartbeat row as TiDB holds it; None if unreadable."""
    try:
        conn = pymysql.connect(host=host, port=port, user="root", password="", database=SCHEMA,
                               connect_timeout=1, read_timeout=2)  # fmt: skip
    except pymysql.MySQLError:
        return None
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT ts FROM heartbeat WHERE id = 1")
            row = cur.fetchone()
    except pymysql.MySQLError:
        return None
    finally:
        conn.close()
    if row is None:
        return None
    import calendar

    return time.time() - (calendar.timegm(row[0].timetuple()) + row[0].microsecond / 1e6)
