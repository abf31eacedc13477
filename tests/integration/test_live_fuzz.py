"""Live fuzzing (issue "hostile peers"): a real MariaDB, the proxy as a subprocess, fuzzing
clients attacking every handshake and command phase while an honest PyMySQL client runs
queries alongside.

The honest client must see 0 errors; the proxy must not crash or log a traceback
(ProxyProcess.stop() checks); its RSS must come back near its baseline once the fuzzing is
over. Prints the number of fuzz sessions (per kind), the honest client's error count and RSS
before / after (pytest -s).

Attacks: truncated packets, oversized lengths (16 MiB with no body), out-of-sequence ids,
random bytes, half-open sockets, a handshake response then garbage, COM_STMT_EXECUTE with
wrong ids / parameter counts, COM_CHANGE_USER garbage, random command codes, mutated SQL
text (never anything that could write outside the fuzz's own reach: see ``_SAFE``).

On MariaDB and on TiDB (``db``). On TiDB it found that a command out of sequence (TiDB closes
the connection without a word) was sent again and again for the buffer window; the proxy was
still busy with those sessions at SIGTERM (tests/component/test_sequence_ids.py).
"""

from __future__ import annotations

import os
import random
import re
import socket
import struct
import threading
import time
from collections import Counter

import pymysql
import pytest

from proxy.protocol.auth import native_scramble
from proxy.protocol.constants import PROXY_CAPABILITIES, Capabilities
from proxy.protocol.framing import PacketDecoder, encode_packet
from proxy.protocol.packets import HandshakeResponse, make_handshake_response, parse_server_handshake
from tests.fuzz.mutate import Mutator
from tests.fuzz.targets import s_sql
from tests.integration.conftest import running_proxy

pytestmark = pytest.mark.integration

FUZZ_SECONDS = float(os.environ.get("LIVE_FUZZ_SECONDS", "45"))
FUZZ_THREADS = 6
RSS_SLACK_MIB = 10
C = Capabilities
CAPS = int(PROXY_CAPABILITIES) & ~int(C.CLIENT_DEPRECATE_EOF)


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


# ---------------------------------------------------------------------------- the fuzzing client


class Wire:
    """A raw client socket with just enough protocol to reach each phase."""

    def __init__(self, port: int, timeout: float = 3.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.decoder = PacketDecoder()

    def packet(self):
        while (p := self.decoder.next_packet()) is None:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError
            self.decoder.feed(data)
        return p

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def drain(self, limit: float = 1.0, quiet: float = 0.25) -> None:
        """Read whatever the proxy answers until it closes, goes quiet, or ``limit`` passes."""
        deadline = time.monotonic() + limit
        self.sock.settimeout(quiet)
        try:
            while time.monotonic() < deadline:
                if not self.sock.recv(65536):
                    return
        except OSError:
            return
        finally:
            self.sock.settimeout(3.0)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def response(self, user="app", password="apppw", seq=1, caps=CAPS, database="test") -> bytes:
        hs = parse_server_handshake(self.packet().payload)
        resp = HandshakeResponse(caps | int(C.CLIENT_CONNECT_WITH_DB), 1 << 24, 45, user,
                                 native_scramble(password, hs.scramble), database, "mysql_native_password", {"fuzz": "1"})  # fmt: skip
        return encode_packet(make_handshake_response(resp), seq)[0]

    def login(self) -> None:
        self.send(self.response())
        answer = self.packet().payload
        if answer[:1] != b"\x00":
            raise RuntimeError(f"fuzz login refused: {answer!r}")

    def command(self, payload: bytes, seq: int = 0) -> None:
        self.send(encode_packet(payload, seq)[0])


def _rand(rng: random.Random, n: int) -> bytes:
    return bytes(rng.getrandbits(8) for _ in range(n))


_SAFE = re.compile(rb"(?i)drop|create|alter|rename|truncate|delete|update|insert|replace|load|grant|revoke|shutdown|kill"
                   rb"|global|flush|reset|install|purge|change|stop|slave|replica|lock|handler|outfile|dumpfile|password|user|xa")  # fmt: skip


def _sql(rng: random.Random, mutator: Mutator) -> bytes:
    for _ in range(20):
        text = mutator.next()[1:]
        if not _SAFE.search(text):
            return text
    return b"SELECT 1"


def _pre_login(w: Wire, rng: random.Random, kind: str) -> None:
    if kind == "half_open":  # connect, say nothing, half-close
        w.sock.shutdown(socket.SHUT_WR)
    elif kind == "truncated_response":
        resp = w.response()
        w.send(resp[: rng.randint(1, len(resp) - 1)])
        w.sock.shutdown(socket.SHUT_WR)
    elif kind == "oversized_response":
        w.packet()
        w.send(b"\xff\xff\xff\x01" + _rand(rng, rng.randint(0, 300)))
        w.sock.shutdown(socket.SHUT_WR)
    elif kind == "wrong_seq_response":
        w.send(w.response(seq=rng.choice([0, 2, 5, 255])))
    elif kind == "random_after_greeting":
        w.packet()
        w.send(_rand(rng, rng.randint(1, 400)))
    elif kind == "mutated_response":
        resp = bytearray(w.response())
        for _ in range(rng.randint(1, 6)):
            resp[rng.randrange(4, len(resp))] = rng.getrandbits(8)
        w.send(bytes(resp))
    elif kind == "wrong_password":
        w.send(w.response(password="nope"))
    w.drain()


def _post_login(w: Wire, rng: random.Random, kind: str, mutator: Mutator) -> None:
    if kind == "garbage_after_login":
        w.send(_rand(rng, rng.randint(1, 600)))
    elif kind == "truncated_command":
        frame = encode_packet(b"\x03SELECT " + b"1," * rng.randint(1, 200) + b"1", 0)[0]
        w.send(frame[: rng.randint(1, len(frame) - 1)])
        w.sock.shutdown(socket.SHUT_WR)
    elif kind == "oversized_command":
        w.send(b"\xff\xff\xff\x00\x03SELECT " + _rand(rng, rng.randint(0, 2000)))
        w.sock.shutdown(socket.SHUT_WR)
    elif kind == "wrong_seq_command":
        w.command(b"\x03SELECT 1", seq=rng.choice([1, 7, 200]))
        w.command(b"\x0e", seq=rng.choice([3, 9]))
    elif kind == "stmt_garbage":
        w.command(b"\x16SELECT ?, ?")  # prepare: 2 parameters
        w.drain(0.3)
        for _ in range(rng.randint(1, 6)):
            stmt_id = rng.choice([0, 1, 2, 1 << 31, 0xFFFFFFFF, rng.getrandbits(32)])
            nparams = rng.randint(0, 5)
            body = struct.pack("<IBI", stmt_id, rng.choice([0, 1, 4, 0xFF]), 1)
            body += bytes((nparams + 7) // 8) + bytes([rng.getrandbits(1)]) + _rand(rng, rng.randint(0, 40))
            code = rng.choice([0x17, 0x17, 0x17, 0x18, 0x19, 0x1A, 0x1C])
            w.command(bytes([code]) + body[: rng.randint(0, len(body))])
            w.drain(0.2)
    elif kind == "change_user_garbage":
        payload = (
            b"\x11" + rng.choice([b"", b"app\x00", b"app\x00\x14", b"root\x00\xff", b"app2\x00\x00\x00"]) + _rand(rng, rng.randint(0, 200))
        )
        w.command(payload)
    elif kind == "random_commands":
        for _ in range(rng.randint(1, 8)):
            code = rng.choice([0x00, 0x02, 0x04, 0x09, 0x0A, 0x0D, 0x0F, 0x10, 0x12, 0x13, 0x14, 0x15, 0x1D, 0x1E,
                               0x1F, 0x20, 0xFE, 0xFF, rng.getrandbits(8)])  # fmt: skip
            if code in (0x01, 0x05, 0x06, 0x07, 0x08, 0x0C, 0x1B):
                # quit / create db / drop db / refresh / shutdown / process kill / set option: the
                # shared server must survive the test; these go as COM_STATISTICS instead
                code = 0x09
            w.command(bytes([code]) + _rand(rng, rng.randint(0, 100)))
            w.drain(0.2)
    elif kind == "mutated_sql":
        for _ in range(rng.randint(1, 5)):
            w.command(b"\x03" + _sql(rng, mutator))
            w.drain(0.2)
    elif kind == "half_open_after_login":
        w.command(b"\x03SELECT SLEEP(0.2)")
        w.sock.shutdown(socket.SHUT_WR)
    elif kind == "empty_packet":
        w.send(b"\x00\x00\x00\x00")
    w.drain()


PRE_LOGIN = ["half_open", "truncated_response", "oversized_response", "wrong_seq_response", "random_after_greeting",
             "mutated_response", "wrong_password"]  # fmt: skip
POST_LOGIN = ["garbage_after_login", "truncated_command", "oversized_command", "wrong_seq_command", "stmt_garbage",
              "change_user_garbage", "random_commands", "mutated_sql", "half_open_after_login", "empty_packet"]  # fmt: skip


def fuzzer(port: int, seed: int, stop: threading.Event, sessions: Counter, failures: list) -> None:
    rng = random.Random(seed)
    mutator = Mutator(s_sql(), seed)
    while not stop.is_set():
        kind = rng.choice(PRE_LOGIN + POST_LOGIN)
        try:
            w = Wire(port)
        except OSError as exc:
            failures.append(f"connect: {exc}")
            time.sleep(0.1)
            continue
        try:
            if kind in PRE_LOGIN:
                _pre_login(w, rng, kind)
            else:
                w.login()
                _post_login(w, rng, kind, mutator)
        except (OSError, EOFError):
            pass  # the proxy closing on us is a fine answer
        except Exception as exc:  # noqa: BLE001 - the fuzz client's own trouble, not the proxy's
            failures.append(f"{kind}: {type(exc).__name__}: {exc}")
        finally:
            w.close()
        sessions[kind] += 1


# ---------------------------------------------------------------------------- the honest client


def honest(port: int, stop: threading.Event, stats: dict) -> None:
    conn = pymysql.connect(host="127.0.0.1", port=port, user="app", password="apppw", database="test",
                           autocommit=True, read_timeout=30, write_timeout=30)  # fmt: skip
    n = 0
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE IF NOT EXISTS live_fuzz (k INT PRIMARY KEY, v VARCHAR(64))")
            cur.execute("DELETE FROM live_fuzz")
            while not stop.is_set():
                try:
                    cur.execute("BEGIN")
                    cur.execute("INSERT INTO live_fuzz VALUES (%s, %s)", (n, f"row {n}"))
                    cur.execute("SELECT v FROM live_fuzz WHERE k = %s", (n,))
                    assert cur.fetchone() == (f"row {n}",)
                    cur.execute("COMMIT")
                    cur.execute("SELECT COUNT(*) FROM live_fuzz")
                    assert cur.fetchone() == (n + 1,)
                    stats["ok"] += 1
                except Exception as exc:  # noqa: BLE001 - counted, reported
                    stats["errors"] += 1
                    stats["last_error"] = f"{type(exc).__name__}: {exc}"
                    if stats["errors"] > 20:
                        return
                n += 1
    finally:
        conn.close()


def test_live_fuzz(db, tmp_path):
    overrides = {"listen": {"handshake_timeout": "2s", "failed_login_limit": 1_000_000, "max_pending_per_host": 256}}
    with running_proxy(tmp_path / "proxy", db.port, **overrides) as proxy:
        pid = proxy.proc.pid
        stop_honest = threading.Event()
        stats = {"ok": 0, "errors": 0, "last_error": ""}
        honest_thread = threading.Thread(target=honest, args=(proxy.port, stop_honest, stats))
        honest_thread.start()
        time.sleep(3)  # warm-up: the honest session and the code paths it uses
        # A first burst warms the fuzzed paths too (first imports, caches); RSS is measured after it.
        stop_fuzz = threading.Event()
        sessions: Counter = Counter()
        failures: list[str] = []
        warm = [threading.Thread(target=fuzzer, args=(proxy.port, 1000 + i, stop_fuzz, Counter(), [])) for i in range(2)]
        for t in warm:
            t.start()
        time.sleep(3)
        stop_fuzz.set()
        for t in warm:
            t.join()
        time.sleep(3)  # handshake_timeout: the warm-up's half-open sessions end
        baseline = rss_kib(pid)
        stop_fuzz = threading.Event()
        threads = [threading.Thread(target=fuzzer, args=(proxy.port, i, stop_fuzz, sessions, failures)) for i in range(FUZZ_THREADS)]
        for t in threads:
            t.start()
        peak = baseline
        deadline = time.monotonic() + FUZZ_SECONDS
        while time.monotonic() < deadline:
            time.sleep(1)
            peak = max(peak, rss_kib(pid))
            assert proxy.proc.poll() is None, "the proxy died"
        stop_fuzz.set()
        for t in threads:
            t.join()
        time.sleep(5)  # every fuzz session ended (handshake_timeout 2 s, drains of 3 s)
        stop_honest.set()
        honest_thread.join()
        after = rss_kib(pid)
        total = sum(sessions.values())
        print(f"\nlive fuzz: {total} fuzz sessions in {FUZZ_SECONDS:g} s ({dict(sorted(sessions.items()))})")
        print(f"honest client: {stats['ok']} transactions, {stats['errors']} errors {stats['last_error']}")
        print(f"proxy RSS: baseline {baseline / 1024:.1f} MiB, peak {peak / 1024:.1f} MiB, after {after / 1024:.1f} MiB")
        if failures:
            print(f"fuzz client trouble ({len(failures)}): {failures[:5]}")
        assert proxy.proc.poll() is None, "the proxy died"
        assert stats["errors"] == 0, stats["last_error"]
        assert stats["ok"] > 0
        assert total >= 100, sessions
        assert after - baseline <= RSS_SLACK_MIB * 1024, f"RSS grew by {(after - baseline) / 1024:.1f} MiB"
    # leaving the with-block ran ProxyProcess.stop(): no crash, no traceback in the log
