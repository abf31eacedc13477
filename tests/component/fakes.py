"""A scripted MySQL server and a minimal client, both over trio memory streams.

The fake server keeps "durable" rows shared by all its connections (so a test can check that a
transaction applied exactly once), understands a tiny SQL dialect, and lets a test intercept any
command to simulate what real servers do when they go away:

- ``"drop"``: close the connection without running the command (TiDB shutdown mode);
- ``"run_then_drop"``: run it (and commit, for COMMIT) but close before answering (crash);
- ``"answer_then_drop"``: run it, answer, and close abruptly right behind the answer, in one
  step (a crash after its last bytes: on the lane rig's TCP, a reset that arrives with them);
- ``"error_1053"``: answer ERR 1053 without running it, then close;
- ``"deadlock"``: the command is the deadlock victim: its transaction is rolled back, ERR 1213;
- ``"error_1095"``: a KILL refused (another user's connection): ERR 1095, nothing killed;
- ``None``: normal processing.

Mini dialect: ``INSERT INTO t VALUES (k, 'v')``, ``REPLACE INTO t VALUES (k, 'v')``,
``UPDATE c SET n = n + 1``, ``DELETE FROM t WHERE k = n`` (or ``v = 'v'``), ``SELECT COUNT(*) FROM t``,
``SELECT v FROM t WHERE k = n``, ``SELECT n FROM c``, ``BEGIN``/``START TRANSACTION``,
``COMMIT``, ``ROLLBACK``, ``SET name = value`` (kept per connection), ``SELECT @@name``,
``SELECT GET_LOCK('x', 1)``, ``KILL n``, plus the proxy's own probes and look-ups (commit
markers, information_schema.VIEWS from ``FakeDB.views``).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Awaitable, Callable

import attrs
import trio
import trio.testing

from proxy.config import Address, parse_config
from proxy.netio import PeerClosed, PeerFinished, StreamChannel
from proxy.protocol.auth import native_scramble, new_scramble
from proxy.protocol.constants import PROXY_CAPABILITIES, Capabilities, ServerStatus
from proxy.protocol.framing import PacketDecoder, encode_packet
from proxy.protocol.packets import (
    HandshakeResponse,
    ServerHandshake,
    lenenc_str,
    make_eof,
    make_err,
    make_handshake_response,
    make_ok,
    make_server_handshake,
    parse_err,
    parse_handshake_response,
    parse_ok,
    parse_server_handshake,
)
from proxy.protocol.response import Expect, ResponseTracker
from proxy.protocol.resultset import decode_text_row

IN_TRANS = int(ServerStatus.SERVER_STATUS_IN_TRANS)
AUTOCOMMIT = int(ServerStatus.SERVER_STATUS_AUTOCOMMIT)

Intercept = Callable[["FakeConnection", bytes], Awaitable[str | None]]


@attrs.define
class FakeDB:
    rows: dict[int, str] = attrs.Factory(dict)
    counter: int = 0
    commits: int = 0  # transactions (and autocommit writes) that changed durable state
    started_at: float = 0.0
    locks: dict[str, int] = attrs.Factory(dict)  # GET_LOCK name -> connection id
    markers: dict[str, int] = attrs.Factory(dict)  # commit-marker table: slot -> txn
    kills: int = 0  # KILL statements run (Com_kill)
    views: dict[str, str] = attrs.Factory(dict)  # view name -> its definition (information_schema.VIEWS)


def trickle_stream_pair() -> tuple[trio.StapledStream, trio.StapledStream]:
    """Like memory_stream_pair, but every receive gets at most one byte: packets arrive split
    at every possible boundary."""

    def one_way():
        send, recv = trio.testing.memory_stream_one_way_pair()

        async def pump_one_byte() -> None:
            trio.testing.memory_stream_pump(send, recv, max_bytes=1)

        send.send_all_hook = pump_one_byte
        recv.receive_some_hook = pump_one_byte
        return send, recv

    a_send, b_recv = one_way()
    b_send, a_recv = one_way()
    return trio.StapledStream(a_send, a_recv), trio.StapledStream(b_send, b_recv)


class FakeServer:
    def __init__(self, nursery: trio.Nursery, password: str = "apppw", stream_pair=trio.testing.memory_stream_pair) -> None:
        self.nursery = nursery
        self.stream_pair = stream_pair
        self.db = FakeDB(started_at=trio.current_time())
        self.password = password
        self.up = True
        self.connections: list[FakeConnection] = []
        self.intercept: Intercept | None = None
        self.next_id = 100
        self.queries: list[str] = []  # every COM_QUERY text received, all connections
        self.wait_timeout = 28800
        # "tidb": as TiDB does, no Com_kill in SHOW GLOBAL STATUS, a KILLed connection gets a
        # FIN without an error packet, and so does a command whose sequence id is not 0
        # (measured on v8.5.3). Its greeting names TiDB.
        self.flavor = "mariadb"

    async def opener(self, address: Address) -> StreamChannel:
        if not self.up:
            raise ConnectionRefusedError(111, "Connection refused")
        proxy_side, server_side = self.stream_pair()
        self.next_id += 1
        conn = FakeConnection(self, server_side, self.next_id)
        self.connections.append(conn)
        self.nursery.start_soon(conn.run)
        return _FakeChannel(conn, proxy_side, f"backend {address}")

    def restart(self) -> None:
        """Every connection dies, uncommitted work is lost, connection ids start over."""
        for conn in list(self.connections):
            conn.close(clean=True)
        self.db.started_at = trio.current_time()
        self.db.locks.clear()
        self.next_id = 100

    def live(self) -> list[FakeConnection]:
        return [c for c in self.connections if not c.closed]


class _FakeChannel(StreamChannel):
    """The proxy's side of a fake connection: a reset looks like one (not a clean close)."""

    __slots__ = ("conn",)

    def __init__(self, conn: FakeConnection, stream, name: str) -> None:
        super().__init__(stream, name)
        self.conn = conn

    def data_pending(self) -> bool:  # as a socket's peek: a close not yet read is pending too
        return self.conn.closed or super().data_pending()

    async def recv(self, size: int = 256 * 1024, wait_first: bool = False) -> bytes:
        try:
            return await super().recv(size, wait_first)
        except PeerFinished:
            if self.conn.reset:
                raise PeerClosed(f"{self.name}: connection reset by peer") from None
            raise


class FakeConnection:
    def __init__(self, server: FakeServer, stream: trio.StapledStream, conn_id: int) -> None:
        self.server = server
        self.stream = stream
        self.id = conn_id
        self.decoder = PacketDecoder()
        self.closed = False
        self.reset = False
        self.in_tx = False
        self.autocommit = True
        self.pending: list[Callable[[], None]] = []  # writes of the open transaction
        self.vars: dict[str, str] = {}
        self.stmts: dict[int, tuple[str, int, bytes | None]] = {}  # id -> (sql, nparams, bound types)
        self.next_stmt = conn_id * 10
        self.deprecate_eof = False
        self.database: str | None = None

    def close(self, clean: bool = False) -> None:
        """Drop the connection: by default abruptly (the proxy sees a reset, as after a crash or
        a network loss); ``clean``: a FIN from a server that stays up, as after a KILL."""
        if not self.closed:
            self.closed = True
            self.reset = not clean
            self.stream.send_stream.close()
            self.stream.receive_stream.close()

    def status(self) -> int:
        return (IN_TRANS if self.in_tx else 0) | (AUTOCOMMIT if self.autocommit else 0)

    async def _read(self) -> tuple[int, bytes] | None:
        while True:
            packet = self.decoder.next_packet()
            if packet is not None:
                return packet.seq, packet.payload
            try:
                data = await self.stream.receive_some(65536)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                return None
            if not data:
                return None
            self.decoder.feed(bytes(data))

    async def _send(self, payloads: list[bytes], seq: int) -> None:
        out = b""
        for p in payloads:
            frames, seq = encode_packet(p, seq)
            out += frames
        try:
            await self.stream.send_all(out)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self.closed = True

    async def run(self) -> None:
        scramble = new_scramble()
        caps = int(PROXY_CAPABILITIES)
        version = "8.0.11-TiDB-v8.5.3-fake" if self.server.flavor == "tidb" else "10.11.0-fake"
        hs = ServerHandshake(version, self.id, scramble, caps, 45, AUTOCOMMIT, "mysql_native_password")
        await self._send([make_server_handshake(hs)], 0)
        got = await self._read()
        if got is None:
            return self.close()
        seq, payload = got
        await self.login_and_serve(parse_handshake_response(payload), seq, scramble)

    async def login_and_serve(self, resp, seq: int, scramble: bytes) -> None:
        """Check the password of a handshake response, then answer commands until closed."""
        self.deprecate_eof = bool(resp.capabilities & Capabilities.CLIENT_DEPRECATE_EOF)
        self.database = resp.database
        if resp.auth_response != native_scramble(self.server.password, scramble):
            await self._send([make_err(1045, "28000", f"Access denied for user '{resp.username}'")], seq + 1)
            return self.close()
        await self._send([make_ok(self.status())], seq + 1)
        while not self.closed:
            got = await self._read()
            if got is None:
                break
            if got[0] != 0 and self.server.flavor == "tidb":  # TiDB: "invalid sequence", a FIN
                self.server.queries.append(f"out of sequence: {got[1][1:].decode(errors='replace')}")
                return self.close(clean=True)
            await self._command(got[1])
        self.close()

    async def _command(self, payload: bytes) -> None:
        code = payload[0]
        if code == 0x01:
            return self.close()
        if code == 0x03:
            self.server.queries.append(payload[1:].decode())
        action = await self.server.intercept(self, payload) if self.server.intercept else None
        if action == "drop":
            return self.close()
        if action == "error_1053":
            await self._send([make_err(1053, "08S01", "Server shutdown in progress")], 1)
            return self.close()
        if action == "deadlock":  # InnoDB rolls back the victim's whole transaction
            self.pending.clear()
            self.in_tx = False
            await self._send([make_err(1213, "40001", "Deadlock found when trying to get lock; try restarting transaction")], 1)
            return None
        if action == "error_1095":  # a KILL refused: the connection is another user's
            await self._send([make_err(1095, "HY000", f"You are not owner of thread {payload[6:].decode()}")], 1)
            return None
        if action == "killed":  # KILL <this connection> while the command ran: not executed
            await self._send([make_err(1927, "70100", "Connection was killed")], 1)
            return self.close()
        answer = self._execute(payload)
        if action == "run_then_drop":
            return self.close()
        if action == "answer_then_drop":
            out = b"".join(encode_packet(p, seq)[0] for seq, p in enumerate(answer or [], 1))
            self.closed = self.reset = True
            return self.stream.send_stream.send_then_close(out)  # no checkpoint between: the proxy reads both at once
        if answer is not None:
            await self._send(answer, 1)

    # ----------------------------------------------------------------- the tiny engine

    def _execute(self, payload: bytes) -> list[bytes] | None:
        code = payload[0]
        if code == 0x0E:
            return [make_ok(self.status())]
        if code == 0x02:
            self.database = payload[1:].decode()
            return [make_ok(self.status())]
        if code == 0x16:
            sql = payload[1:].decode()
            self.next_stmt += 1
            nparams = sql.count("?")
            self.stmts[self.next_stmt] = (sql, nparams, None)
            out = [b"\x00" + struct.pack("<IHHBH", self.next_stmt, 0, nparams, 0, 0)]
            if nparams:
                out += [_coldef("?")] * nparams
                if not self.deprecate_eof:
                    out.append(make_eof(self.status()))
            return out
        if code == 0x19:
            self.stmts.pop(struct.unpack_from("<I", payload, 1)[0], None)
            return None
        if code == 0x17:
            return self._execute_stmt(payload)
        if code == 0x03:
            return self._query(payload[1:].decode())
        return [make_err(1047, "08S01", "Unknown command")]

    def _execute_stmt(self, payload: bytes) -> list[bytes]:
        stmt_id = struct.unpack_from("<I", payload, 1)[0]
        if stmt_id not in self.stmts:
            return [make_err(1243, "HY000", f"Unknown prepared statement handler ({stmt_id}) given to mysqld_stmt_execute")]
        sql, nparams, types = self.stmts[stmt_id]
        pos = 10
        values = []
        if nparams:
            pos += (nparams + 7) // 8
            bound = payload[pos]
            pos += 1
            if bound:
                types = payload[pos : pos + 2 * nparams]
                pos += 2 * nparams
                self.stmts[stmt_id] = (sql, nparams, types)
            if types is None:
                return [make_err(1210, "HY000", "Incorrect arguments to mysqld_stmt_execute (no parameter types)")]
            for _ in range(nparams):  # the tests bind LONGLONG only
                values.append(str(struct.unpack_from("<q", payload, pos)[0]))
                pos += 8
        for v in values:
            sql = sql.replace("?", v, 1)
        return self._query(sql)

    def _result(self, column: str, rows: list[str | None]) -> list[bytes]:
        out = [b"\x01", _coldef(column)]
        if not self.deprecate_eof:
            out.append(make_eof(self.status()))
        out += [b"\xfb" if r is None else lenenc_str(r.encode()) for r in rows]
        out.append(make_ok(self.status(), header=0xFE) if self.deprecate_eof else make_eof(self.status()))
        return out

    def _table(self, columns: list[str], rows: list[list[str]]) -> list[bytes]:
        out = [bytes([len(columns)])] + [_coldef(c) for c in columns]
        if not self.deprecate_eof:
            out.append(make_eof(self.status()))
        out += [b"".join(lenenc_str(v.encode()) for v in row) for row in rows]
        out.append(make_ok(self.status(), header=0xFE) if self.deprecate_eof else make_eof(self.status()))
        return out

    def _write(self, apply: Callable[[], None]) -> None:
        if self.in_tx or not self.autocommit:
            self.in_tx = True
            self.pending.append(apply)
        else:
            apply()
            self.server.db.commits += 1

    def _query(self, sql: str) -> list[bytes]:
        db = self.server.db
        s = sql.strip().rstrip(";")
        up = s.upper()
        if up in ("BEGIN", "START TRANSACTION"):
            self._commit()
            self.in_tx = True
            return [make_ok(self.status())]
        if up == "COMMIT":
            self._commit()
            return [make_ok(self.status())]
        if up == "ROLLBACK":
            self.pending.clear()
            self.in_tx = False
            return [make_ok(self.status())]
        if s.startswith(
            "SELECT TABLE_SCHEMA, TABLE_NAME, VIEW_DEFINITION FROM information_schema.VIEWS WHERE (TABLE_SCHEMA, TABLE_NAME) IN ("
        ):
            asked = set(re.findall(r"\('([^']*)', '([^']*)'\)", s))  # every view lives in database "test"
            return self._table(
                ["TABLE_SCHEMA", "TABLE_NAME", "VIEW_DEFINITION"],
                [["test", name, body] for name, body in db.views.items() if ("test", name) in asked],
            )
        if up == "SELECT @@MAX_ALLOWED_PACKET":
            return self._result("@@max_allowed_packet", [str(64 << 20)])
        if up == "SELECT @@MAX_ALLOWED_PACKET, @@WAIT_TIMEOUT, @@HOSTNAME, @@PORT, UNIX_TIMESTAMP()":
            # Who this server is: the proxy compares it across connections (restart or KILL?).
            row = [str(64 << 20), str(self.server.wait_timeout), "fake", "4000", str(int(trio.current_time()))]
            return self._table(["@@max_allowed_packet", "@@wait_timeout", "@@hostname", "@@port", "UNIX_TIMESTAMP()"], [row])
        if up == "SHOW GLOBAL STATUS WHERE VARIABLE_NAME IN ('UPTIME', 'COM_KILL')":
            uptime = str(int(trio.current_time() - db.started_at))
            kills = [["Com_kill", str(db.kills)]] if self.server.flavor == "mariadb" else []
            return self._table(["Variable_name", "Value"], [["Uptime", uptime], *kills])
        if up == "SHOW GLOBAL STATUS LIKE 'UPTIME'":
            out = [b"\x02", _coldef("Variable_name"), _coldef("Value")]
            if not self.deprecate_eof:
                out.append(make_eof(self.status()))
            out.append(lenenc_str(b"Uptime") + lenenc_str(str(int(trio.current_time() - db.started_at)).encode()))
            out.append(make_ok(self.status(), header=0xFE) if self.deprecate_eof else make_eof(self.status()))
            return out
        if m := re.fullmatch(r"KILL (\d+|CONNECTION_ID\(\))", up):
            db.kills += 1
            victim = self.id if m.group(1) == "CONNECTION_ID()" else int(m.group(1))
            for conn in self.server.connections:
                if conn.id == victim:
                    conn.close(clean=self.server.flavor == "tidb")
            return None if victim == self.id else [make_ok(self.status())]
        if m := re.fullmatch(r"INSERT INTO T VALUES \((-?\d+), '([^']*)'\)", s, re.I):
            k, v = int(m.group(1)), m.group(2)
            if k in db.rows or any(getattr(a, "key", None) == k for a in self.pending):
                return [make_err(1062, "23000", f"Duplicate entry '{k}' for key 'PRIMARY'")]
            write = _keyed(k, lambda: db.rows.__setitem__(k, v))
            self._write(write)
            return [make_ok(self.status(), affected_rows=1)]
        if m := re.fullmatch(r"REPLACE INTO T VALUES \((-?\d+), '([^']*)'\)", s, re.I):
            k, v = int(m.group(1)), m.group(2)
            affected = 2 if k in db.rows else 1
            self._write(lambda: db.rows.__setitem__(k, v))
            return [make_ok(self.status(), affected_rows=affected)]
        if m := re.fullmatch(r"DELETE FROM T WHERE K = (-?\d+)", s, re.I):
            k = int(m.group(1))
            affected = 1 if k in db.rows else 0
            self._write(lambda: db.rows.pop(k, None))
            return [make_ok(self.status(), affected_rows=affected)]
        if m := re.fullmatch(r"DELETE FROM T WHERE V = '([^']*)'", s, re.I):  # keyless: safe mode cannot prove it
            gone = [k for k, v in db.rows.items() if v == m.group(1)]
            self._write(lambda: [db.rows.pop(k, None) for k in gone])
            return [make_ok(self.status(), affected_rows=len(gone))]
        if re.fullmatch(r"UPDATE C SET N = N \+ 1", s, re.I):
            self._write(lambda: setattr(db, "counter", db.counter + 1))
            return [make_ok(self.status(), affected_rows=1)]
        if re.match(r"CREATE (DATABASE|TABLE) IF NOT EXISTS", up) or re.match(r"DELETE FROM \S*COMMIT_MARKERS WHERE UPDATED", up):
            return [make_ok(self.status())]
        if m := re.fullmatch(
            r"INSERT INTO \S*commit_markers \(slot, txn\) VALUES \(X'(\w+)', (\d+)\) ON DUPLICATE KEY UPDATE txn = VALUES\(txn\)", s
        ):
            slot, txn = m.group(1), int(m.group(2))
            self._write(lambda: db.markers.__setitem__(slot, txn))
            return [make_ok(self.status(), affected_rows=1)]
        if m := re.fullmatch(r"SELECT txn FROM \S*commit_markers WHERE slot = X'(\w+)'", s):
            txn = db.markers.get(m.group(1))
            return self._result("txn", [str(txn)] if txn is not None else [])
        if m := re.fullmatch(r"SELECT COUNT\(\*\) FROM INFORMATION_SCHEMA.PROCESSLIST WHERE ID = (\d+)", up):
            alive = sum(1 for c in self.server.connections if c.id == int(m.group(1)) and not c.closed)
            return self._result("COUNT(*)", [str(alive)])
        # information_schema as safe mode reads it: t (k PRIMARY KEY, v), no triggers, no FKs.
        if "FROM INFORMATION_SCHEMA.COLUMNS" in up and "TABLE_NAME = 'T'" in up:
            return self._table(["COLUMN_NAME", "IS_NULLABLE", "EXTRA", "TABLE_SCHEMA", "TABLE_NAME"],
                               [["k", "NO", "", "test", "t"], ["v", "YES", "", "test", "t"]])  # fmt: skip
        if "FROM INFORMATION_SCHEMA.STATISTICS" in up and "TABLE_NAME = 'T'" in up:
            return self._table(["INDEX_NAME", "COLUMN_NAME"], [["PRIMARY", "k"]])
        if "FROM INFORMATION_SCHEMA.TRIGGERS" in up or "FROM INFORMATION_SCHEMA.REFERENTIAL_CONSTRAINTS" in up:
            return self._result("COUNT(*)", ["0"])
        if up == "SELECT COUNT(*) FROM T":
            self._touch()
            return self._result("COUNT(*)", [str(len(db.rows))])
        if up == "SELECT N FROM C":
            self._touch()
            return self._result("n", [str(db.counter)])
        if m := re.fullmatch(r"SELECT V FROM T WHERE K = (-?\d+)", s, re.I):
            self._touch()
            v = db.rows.get(int(m.group(1)))
            return self._result("v", [v] if v is not None else [])
        if m := re.fullmatch(r"SELECT GET_LOCK\('(\w+)', \d+\)", s, re.I):
            owner = db.locks.setdefault(m.group(1), self.id)
            return self._result("GET_LOCK", ["1" if owner == self.id else "0"])
        if m := re.fullmatch(r"SELECT @@(?:SESSION\.)?(\w+)", s, re.I):
            return self._result(m.group(0), [self.vars.get(m.group(1).lower())])
        if up.startswith("SET "):
            for part in _split_commas(s[4:]):
                name, _, value = part.partition("=")
                name = re.sub(r"^@@(session\.)?", "", name.strip(), flags=re.I).lower()
                if name.upper().startswith("NAMES "):
                    self.vars["names"] = name[6:].strip()
                    continue
                value = value.strip()
                if value.upper().startswith("CONCAT("):  # the one expression the tests use
                    value = "".join(re.findall(r"'([^']*)'", value))
                else:
                    value = value.strip("'")
                self.vars[name] = value
                if name == "autocommit":
                    self.autocommit = value in ("1", "ON", "on")
                    if self.autocommit:
                        self._commit()
            return [make_ok(self.status())]
        return [make_err(1064, "42000", f"fake server does not understand: {sql[:80]}")]

    def _touch(self) -> None:
        if not self.autocommit:
            self.in_tx = True

    def _commit(self) -> None:
        if self.pending:
            for apply in self.pending:
                apply()
            self.server.db.commits += 1
        self.pending.clear()
        self.in_tx = False


def _keyed(key: int, fn: Callable[[], None]) -> Callable[[], None]:
    fn.key = key  # type: ignore[attr-defined]  # lets a pending INSERT count as a duplicate
    return fn


def _split_commas(text: str) -> list[str]:
    parts, depth, quote, cur = [], 0, None, ""
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    return parts + [cur] if cur.strip() else parts


def _coldef(name: str) -> bytes:
    return (
        lenenc_str(b"def")
        + lenenc_str(b"")
        + lenenc_str(b"")
        + lenenc_str(b"")
        + lenenc_str(name.encode())
        + lenenc_str(b"")
        + b"\x0c"
        + struct.pack("<HIBHB", 45, 255, 0xFD, 0, 0)
        + b"\x00\x00"
    )


# --------------------------------------------------------------------------- client


@attrs.frozen
class Result:
    ok: bool
    code: int = 0
    message: str = ""
    affected_rows: int = 0
    rows: list[str | None] = attrs.Factory(list)
    status: int = 0


class MySQLError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"({code}) {message}")
        self.code = code
        self.message = message


class FakeClient:
    """Speaks just enough client protocol to drive the proxy: login, COM_QUERY, prepared statements."""

    def __init__(self, stream: trio.StapledStream, deprecate_eof: bool = False) -> None:
        self.stream = stream
        self.decoder = PacketDecoder()
        self.deprecate_eof = deprecate_eof
        self.closed = False

    async def _read_packet(self) -> bytes:
        while True:
            packet = self.decoder.next_packet()
            if packet is not None:
                return packet.payload
            data = await self.stream.receive_some(65536)
            if not data:
                self.closed = True
                raise EOFError("proxy closed the connection")
            self.decoder.feed(bytes(data))

    async def login(self, user: str = "app", password: str = "apppw", database: str | None = "test") -> None:
        hs = parse_server_handshake(await self._read_packet())
        self.connection_id = hs.connection_id  # the proxy's session id
        caps = int(PROXY_CAPABILITIES) & hs.capabilities
        if not self.deprecate_eof:
            caps &= ~int(Capabilities.CLIENT_DEPRECATE_EOF)
        if database:
            caps |= int(Capabilities.CLIENT_CONNECT_WITH_DB)
        resp = HandshakeResponse(caps, 1 << 24, 45, user, native_scramble(password, hs.scramble), database, "mysql_native_password")
        await self.stream.send_all(encode_packet(make_handshake_response(resp), 1)[0])
        answer = await self._read_packet()
        if answer[0] == 0xFF:
            err = parse_err(answer)
            raise MySQLError(err.code, err.message)

    async def command(self, payload: bytes, expect: Expect = Expect.QUERY) -> Result:
        try:
            await self.stream.send_all(encode_packet(payload, 0)[0])
        except trio.BrokenResourceError:
            self.closed = True
            raise EOFError("proxy closed the connection") from None
        if expect == Expect.NONE:
            return Result(True)
        return await self.read_result(expect)

    async def read_result(self, expect: Expect = Expect.QUERY) -> Result:
        """The answer to a command sent already (pipelined commands: one answer each)."""
        tracker = ResponseTracker(expect, self.deprecate_eof)
        packets = []
        while not tracker.done:
            payload_ = await self._read_packet()
            packets.append(payload_)
            tracker.feed(encode_packet(payload_, 0)[0])
        if tracker.error is not None:
            return Result(False, tracker.error.code, tracker.error.message)
        if expect == Expect.PREPARE:
            return Result(True, rows=[str(tracker.prepare_ok.statement_id)])
        first = packets[0]
        if first[0] == 0x00:
            ok = parse_ok(first)
            return Result(True, affected_rows=ok.affected_rows, status=ok.status)
        data_rows = packets[2 if self.deprecate_eof else 3 : -1]
        rows = [None if value is None else value.decode() for r in data_rows for value in decode_text_row(r, 1)[:1]]
        return Result(True, rows=rows, status=tracker.status)

    async def query(self, sql: str) -> Result:
        return await self.command(b"\x03" + sql.encode())

    async def must(self, sql: str) -> Result:
        result = await self.query(sql)
        if not result.ok:
            raise MySQLError(result.code, result.message)
        return result

    async def prepare(self, sql: str) -> int:
        result = await self.command(b"\x16" + sql.encode(), Expect.PREPARE)
        if not result.ok:
            raise MySQLError(result.code, result.message)
        return int(result.rows[0])

    async def execute(self, stmt_id: int, *params: int, bind: bool = True) -> Result:
        n = len(params)
        payload = b"\x17" + struct.pack("<IBI", stmt_id, 0, 1)
        if n:
            payload += bytes((n + 7) // 8) + (b"\x01" + b"\x08\x00" * n if bind else b"\x00")
            payload += b"".join(struct.pack("<q", p) for p in params)
        return await self.command(payload, Expect.EXECUTE)


def make_config(**overrides):
    data = {
        "name": "fake",
        "listen": {"address": "127.0.0.1:1"},
        "backend": {"addresses": ["10.0.0.1:4000"]},
        "users": [{"name": "app", "password": "apppw"}],
        "admin": {"enabled": False},
    }
    for key, value in overrides.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return parse_config(data)
