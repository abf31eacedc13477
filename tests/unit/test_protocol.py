"""Sans-IO codec: golden bytes, every split point, 16 MiB continuation frames."""

from __future__ import annotations

import ast
import pathlib
import struct
import subprocess
import sys

import pytest

from proxy.protocol.auth import CACHING_SHA2, NATIVE, ClientAuth, ServerAuth, native_scramble, new_scramble, sha2_scramble
from proxy.protocol.constants import MAX_FRAME, PROXY_CAPABILITIES, Capabilities
from proxy.protocol.framing import PacketDecoder, encode_packet, frame_header, with_statement_id
from proxy.protocol.packets import (
    HandshakeResponse,
    ProtocolError,
    ServerHandshake,
    lenenc_int,
    make_eof,
    make_err,
    make_handshake_response,
    make_ok,
    make_server_handshake,
    parse_auth_switch,
    parse_err,
    parse_handshake_response,
    parse_ok,
    parse_server_handshake,
)
from proxy.protocol.response import Expect, ResponseTracker
from tests.unit.golden_mariadb import RESPONSES

C = Capabilities


# ---------------------------------------------------------------- sans-IO guarantee


SANS_IO = [
    "proxy.protocol",
    "proxy.sqltext",
    "proxy.session.tracker",
    "proxy.recovery.facts",
    "proxy.recovery.plan",
    "proxy.session.state",
    "proxy.session.transaction",
    "proxy.session.info",
]


def test_sans_io_modules_never_import_trio():
    """The codec, the SQL text package and the trackers are sans-IO: importing them and all
    they import loads no trio, and none of them imports trio, socket or asyncio itself
    (mysql-mimic, a dependency, imports asyncio for its own server half)."""
    root = pathlib.Path(__file__).resolve().parents[2]
    modules = list(SANS_IO)
    for package in ("protocol", "sqltext"):
        modules += [f"proxy.{package}.{p.stem}" for p in (root / "proxy" / package).glob("*.py") if p.stem != "__init__"]
    probe = f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\nprint('trio' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", "a sans-IO module pulls in trio"
    for module in modules:
        path = root / (module.replace(".", "/") + ".py")
        if not path.exists():
            path = root / module.replace(".", "/") / "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in ("trio", "socket", "asyncio"), f"{path.name} imports {name}"


# ---------------------------------------------------------------- framing


def test_frame_header_golden():
    assert frame_header(1, 0) == b"\x01\x00\x00\x00"
    assert frame_header(0xFFFFFF, 7) == b"\xff\xff\xff\x07"
    assert encode_packet(b"\x0e", 0) == (b"\x01\x00\x00\x00\x0e", 1)
    assert encode_packet(b"", 255) == (b"\x00\x00\x00\xff", 0)


@pytest.mark.parametrize("size", [MAX_FRAME - 1, MAX_FRAME, MAX_FRAME + 1, 2 * MAX_FRAME, 2 * MAX_FRAME + 5])
def test_continuation_frames_round_trip(size):
    payload = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    frames, next_seq = encode_packet(payload, 3)
    nframes = size // MAX_FRAME + 1  # a payload that is a multiple of 0xFFFFFF ends with an empty frame
    assert len(frames) == size + 4 * nframes
    assert next_seq == 3 + nframes
    headers = []
    pos = 0
    for _ in range(nframes):
        length = frames[pos] | frames[pos + 1] << 8 | frames[pos + 2] << 16
        headers.append((length, frames[pos + 3]))
        pos += 4 + length
    assert headers[-1][0] < MAX_FRAME and all(h[0] == MAX_FRAME for h in headers[:-1])
    assert [h[1] for h in headers] == list(range(3, 3 + nframes))
    dec = PacketDecoder()
    step = 1 << 20
    for i in range(0, len(frames), step):
        dec.feed(frames[i : i + step])
    packet = dec.next_packet()
    assert packet.payload == payload and packet.raw == frames
    assert (packet.seq, packet.last_seq) == (3, 3 + nframes - 1)
    assert dec.next_packet() is None and dec.buffered() == 0


def test_decoder_every_split_point():
    stream = encode_packet(b"\x03SELECT 1", 0)[0] + encode_packet(b"", 4)[0] + encode_packet(b"\x0e", 0)[0]
    for cut in range(len(stream) + 1):
        dec = PacketDecoder()
        out = []
        for part in (stream[:cut], stream[cut:]):
            dec.feed(part)
            while (p := dec.next_packet()) is not None:
                out.append((p.seq, p.payload))
        assert out == [(0, b"\x03SELECT 1"), (4, b""), (0, b"\x0e")], cut


def test_decoder_one_byte_trickle_and_max_payload():
    stream = encode_packet(b"a" * 300, 1)[0]
    dec = PacketDecoder()
    for i in range(len(stream) - 1):
        dec.feed(stream[i : i + 1])
        assert dec.next_packet() is None
    dec.feed(stream[-1:])
    assert dec.next_packet().payload == b"a" * 300
    dec = PacketDecoder(max_payload=10)
    dec.feed(frame_header(11, 0))
    with pytest.raises(ProtocolError):
        dec.next_packet()


# ---------------------------------------------------------------- OK / ERR / EOF


def test_ok_packet_golden_from_mariadb():
    frames = RESPONSES[(b"\x03INSERT INTO cap (v) VALUES ('x'),('y')", False)]
    ok = parse_ok(frames[4:], C.CLIENT_PROTOCOL_41)
    assert (ok.affected_rows, ok.last_insert_id, ok.status, ok.warnings) == (2, 5, 2, 0)
    assert ok.info.endswith(b"Records: 2  Duplicates: 0  Warnings: 0")


def test_make_ok_err_eof_golden():
    assert make_ok(0x0002) == bytes.fromhex("00000002000000")
    assert make_ok(0x0003, affected_rows=300, last_insert_id=1) == bytes.fromhex("00fc2c010103000000")
    assert make_eof(0x0002) == bytes.fromhex("fe00000200")
    assert make_err(1045, "28000", "no") == bytes.fromhex("ff1504") + b"#28000no"
    err = parse_err(RESPONSES[(b"\x03SELEC 1", False)][4:])
    assert (err.code, err.sqlstate) == (1064, "42000") and "SELEC 1" in err.message
    with pytest.raises(ProtocolError):
        parse_ok(b"\x00\xfc\x01")  # truncated length-encoded integer


# ---------------------------------------------------------------- handshake


def test_server_handshake_round_trip():
    hs = ServerHandshake("10.11.19-MariaDB", 42, bytes(range(1, 21)), int(PROXY_CAPABILITIES), 45, 2, NATIVE)
    payload = make_server_handshake(hs)
    assert payload[0] == 10 and payload[1:18] == b"10.11.19-MariaDB\x00"
    assert parse_server_handshake(payload) == hs


def test_handshake_response_round_trip_and_truncation():
    resp = HandshakeResponse(
        int(PROXY_CAPABILITIES | C.CLIENT_CONNECT_WITH_DB), 1 << 24, 45, "app", b"\x01" * 20, "db1", NATIVE, {"_client_name": "x"}
    )
    payload = make_handshake_response(resp)
    assert parse_handshake_response(payload) == resp
    for cut in (5, 31, 35, 50):  # 32 bytes exactly is an SSL request; trailing fields are optional
        with pytest.raises(ProtocolError):
            parse_handshake_response(payload[:cut])


def test_ssl_request_is_recognised():
    payload = struct.pack("<IIB", int(C.CLIENT_PROTOCOL_41 | C.CLIENT_SSL), 1 << 24, 45) + bytes(23)
    assert parse_handshake_response(payload).ssl_request


# ---------------------------------------------------------------- authentication


def test_native_scramble_matches_the_definition():
    # mysql_native_password: SHA1(pw) XOR SHA1(scramble + SHA1(SHA1(pw))).
    import hashlib

    scramble = b"abcdefghijklmnopqrst"
    h1 = hashlib.sha1(b"secret").digest()
    expected = bytes(a ^ b for a, b in zip(h1, hashlib.sha1(scramble + hashlib.sha1(h1).digest()).digest()))
    assert native_scramble("secret", scramble) == expected
    assert native_scramble("", scramble) == b""


def _client_response(user: str, password: str, scramble: bytes, plugin: str) -> HandshakeResponse:
    fn = sha2_scramble if plugin == CACHING_SHA2 else native_scramble
    return HandshakeResponse(int(PROXY_CAPABILITIES), 0, 45, user, fn(password, scramble), None, plugin)


@pytest.mark.parametrize("plugin", [NATIVE, CACHING_SHA2])
def test_server_auth_accepts_right_password(plugin):
    scramble = new_scramble()
    auth = ServerAuth(scramble, {"app": "apppw"}, "127.0.0.1")
    result = auth.start(_client_response("app", "apppw", scramble, plugin))
    assert result.done and result.user == "app" and result.error is None
    assert result.packets == ([b"\x01\x03"] if plugin == CACHING_SHA2 else [])


@pytest.mark.parametrize("user,password", [("app", "wrong"), ("nobody", "apppw"), ("app", "")])
def test_server_auth_refuses_with_1045(user, password):
    scramble = new_scramble()
    auth = ServerAuth(scramble, {"app": "apppw"}, "10.0.0.1")
    result = auth.start(_client_response(user, password, scramble, NATIVE))
    err = parse_err(result.error)
    assert err.code == 1045 and err.sqlstate == "28000"
    using = "YES" if password else "NO"
    assert err.message == f"Access denied for user '{user}'@'10.0.0.1' (using password: {using})"


def test_server_auth_switches_unknown_plugins_to_native():
    scramble = new_scramble()
    auth = ServerAuth(scramble, {"app": "apppw"}, "h")
    result = auth.start(HandshakeResponse(int(PROXY_CAPABILITIES), 0, 45, "app", b"x", None, "client_ed25519"))
    switch = parse_auth_switch(result.packets[0])
    assert not result.done and switch.plugin == NATIVE and switch.data == scramble
    assert auth.on_packet(native_scramble("apppw", scramble)).user == "app"


def test_new_scramble_has_no_nul_or_dollar():
    for _ in range(50):
        s = new_scramble()
        assert len(s) == 20 and 0 not in s and ord("$") not in s


def test_client_auth_caching_sha2_fast_path_and_switch():
    auth = ClientAuth("u", "pw", b"s" * 20, CACHING_SHA2)
    assert auth.first_response() == sha2_scramble("pw", b"s" * 20)
    assert auth.on_packet(b"\x01\x03") == ("wait", None)
    assert auth.on_packet(make_ok(2))[0] == "ok"
    auth = ClientAuth("u", "pw", b"s" * 20, CACHING_SHA2)
    action, data = auth.on_packet(b"\xfe" + NATIVE.encode() + b"\x00" + b"n" * 20 + b"\x00")
    assert action == "send" and data == native_scramble("pw", b"n" * 20)
    action, data = ClientAuth("u", "pw", b"s" * 20, CACHING_SHA2).on_packet(b"\x01\x04")
    assert (action, data) == ("send", b"\x02")  # full auth without TLS: ask for the RSA key


# ---------------------------------------------------------------- response tracking


def _expect_of(payload: bytes) -> Expect:
    return {0x03: Expect.QUERY, 0x16: Expect.PREPARE, 0x0E: Expect.SINGLE}[payload[0]]


def _feed_all(tracker: ResponseTracker, chunks: list[bytes]) -> int:
    consumed = 0
    for chunk in chunks:
        end = tracker.feed(chunk)
        if end >= 0:
            return consumed + end
        consumed += len(chunk)
    return -1


@pytest.mark.parametrize("key", list(RESPONSES), ids=lambda k: f"{k[0][:20]!r}-deprecate_eof={k[1]}")
def test_tracker_finds_end_of_golden_responses_at_every_split(key):
    payload, deprecate = key
    data = RESPONSES[key]
    for cut in range(len(data) + 1):
        tracker = ResponseTracker(_expect_of(payload), deprecate)
        assert _feed_all(tracker, [data[:cut], data[cut:]]) == len(data), cut
        assert tracker.done
    tracker = ResponseTracker(_expect_of(payload), deprecate)
    assert _feed_all(tracker, [data[i : i + 1] for i in range(len(data))]) == len(data)


def test_tracker_reports_what_the_response_said():
    t = ResponseTracker(Expect.QUERY, False)
    assert t.feed(RESPONSES[(b"\x03SELECT NULL AS n, 'a' AS s", False)]) > 0
    assert t.rows == 1 and t.status == 2 and t.error is None and t.results == 1
    t = ResponseTracker(Expect.QUERY, True)
    t.feed(RESPONSES[(b"\x03SELECT 1; SELECT 2", True)])
    assert t.results == 2 and t.done
    t = ResponseTracker(Expect.QUERY, False)
    t.feed(RESPONSES[(b"\x03SELEC 1", False)])
    assert t.error.code == 1064 and not t.saw_status
    t = ResponseTracker(Expect.QUERY, False)
    t.feed(RESPONSES[(b"\x03BEGIN", False)])
    assert t.status & 1 and t.saw_status
    t = ResponseTracker(Expect.PREPARE, True)
    t.feed(RESPONSES[(b"\x16SELECT ?, v FROM cap WHERE id = ?", True)])
    assert (t.prepare_ok.num_params, t.prepare_ok.num_columns) == (2, 2)


def _ok_frames(affected: int, insert_id: int, status: int, seq: int = 1, info: bytes = b"") -> bytes:
    return encode_packet(b"\x00" + lenenc_int(affected) + lenenc_int(insert_id) + struct.pack("<HH", status, 3) + info, seq)[0]


def _tracked(chunks: list[bytes]) -> tuple:
    t = ResponseTracker(Expect.QUERY, False, fingerprint=True)
    ends = [t.feed(c) for c in chunks]
    return ends, t.done, t.ok, t.status, t.saw_status, t.results, t.last_seq, t.nbytes, t.fingerprint


@pytest.mark.parametrize(
    "chunks",
    [
        [_ok_frames(1, 0, 0x0003)],  # one-byte counts: built in place
        [_ok_frames(1, 0, 0x0002, info=b"Rows matched: 1  Changed: 1  Warnings: 0")],
        [_ok_frames(300, 70000, 0x0002)],  # lenenc counts: parse_ok
        [_ok_frames(2, 0, 0x000A), _ok_frames(1, 0, 0x0002, seq=2)],  # MORE_RESULTS, each OK alone
        [_ok_frames(1, 0, 0x0002) + b"\x07\x00\x00\x00"],  # bytes after it: the general walk
    ],
    ids=["small", "info", "lenenc", "more-results", "trailing"],
)
def test_one_ok_alone_in_a_read_says_what_the_packet_walk_says(chunks):
    """``feed``'s fast path for one whole OK per read against the general walk, which a split
    before the header's end forces: the same ends, status, OK, counts and fingerprint."""
    split = [piece for c in chunks for piece in (c[:3], c[3:])]
    fast, walked = _tracked(chunks), _tracked(split)
    assert fast[1:] == walked[1:]
    assert [e - 3 for e in fast[0] if e != -1] == [e for e in walked[0] if e != -1]  # the split's tail starts 3 in


def test_tracker_stops_at_end_and_leaves_following_bytes():
    data = RESPONSES[(b"\x0e", False)]
    t = ResponseTracker(Expect.SINGLE, False)
    assert t.feed(data + b"\x07\x00\x00\x00") == len(data)


def _text_result(rows: list[bytes], deprecate_eof: bool, status: int = 2, seq: int = 1) -> bytes:
    out, seq = encode_packet(b"\x01", seq)
    coldef = b"\x03def\x00\x00\x00\x01c\x00\x0c\x3f\x00\xff\xff\xff\xff\xfc\x90\x00\x00\x00\x00"
    frames, seq = encode_packet(coldef, seq)
    out += frames
    if not deprecate_eof:
        frames, seq = encode_packet(make_eof(status), seq)
        out += frames
    for row in rows:
        frames, seq = encode_packet(row, seq)
        out += frames
    end = make_ok(status, header=0xFE) if deprecate_eof else make_eof(status)
    return out + encode_packet(end, seq)[0]


@pytest.mark.parametrize("deprecate_eof", [False, True])
def test_tracker_rows_over_16mib_that_start_with_0xfe(deprecate_eof):
    # A row whose first column is >= 16 MiB starts with 0xFE (8-byte length) and spans frames.
    big = b"z" * (MAX_FRAME + 10)
    row = b"\xfe" + struct.pack("<Q", len(big)) + big
    data = _text_result([b"\x01a", row, b"\x01b"], deprecate_eof)
    tracker = ResponseTracker(Expect.QUERY, deprecate_eof, fingerprint=True)
    step = 65536
    assert _feed_all(tracker, [data[i : i + step] for i in range(0, len(data), step)]) == len(data)
    assert tracker.rows == 3


def test_tracker_fingerprint_depends_on_rows_not_status_bits():
    a = _text_result([b"\x01a", b"\x01b"], False, status=0x0003)
    b = _text_result([b"\x01a", b"\x01b"], False, status=0x0803)  # SERVER_QUERY_WAS_SLOW differs
    c = _text_result([b"\x01a", b"\x01c"], False, status=0x0003)
    prints = []
    for data in (a, b, c):
        t = ResponseTracker(Expect.QUERY, False, fingerprint=True)
        t.feed(data)
        prints.append(t.fingerprint)
    assert prints[0] == prints[1] != prints[2]


def test_tracker_multi_result_with_error_in_the_middle():
    first = _text_result([b"\x01a"], False, status=0x000A)  # MORE_RESULTS_EXISTS
    last_seq = first[-(4 + 5) + 3]
    err = encode_packet(make_err(1146, "42S02", "Table 'x' doesn't exist"), last_seq + 1)[0]
    t = ResponseTracker(Expect.QUERY, False)
    assert t.feed(first + err) == len(first + err)
    assert t.error.code == 1146 and t.results == 1


def test_tracker_local_infile_request_and_cursor():
    t = ResponseTracker(Expect.QUERY, False)
    data = encode_packet(b"\xfbfile.csv", 1)[0]
    assert t.feed(data) == len(data) and t.local_infile
    # A cursor-opening execute ends after the column definitions.
    cols = encode_packet(b"\x01", 1)[0] + encode_packet(b"\x03def" + bytes(20), 2)[0] + encode_packet(make_eof(0x0042), 3)[0]
    t = ResponseTracker(Expect.EXECUTE, False)
    assert t.feed(cols) == len(cols)


def test_tracker_prepare_without_params_or_columns():
    data = encode_packet(b"\x00" + struct.pack("<IHHBH", 7, 0, 0, 0, 0), 1)[0]
    t = ResponseTracker(Expect.PREPARE, False)
    assert t.feed(data) == len(data) and t.prepare_ok.statement_id == 7


@pytest.mark.parametrize("key", list(RESPONSES), ids=lambda k: f"{k[0][:20]!r}-deprecate_eof={k[1]}")
def test_fingerprint_does_not_depend_on_how_the_bytes_arrive(key):
    # Replay compares fingerprints of responses that arrive chunked differently.
    payload, deprecate = key
    data = RESPONSES[key]
    whole = ResponseTracker(_expect_of(payload), deprecate, fingerprint=True)
    whole.feed(data)
    for cut in range(len(data) + 1):
        split = ResponseTracker(_expect_of(payload), deprecate, fingerprint=True)
        _feed_all(split, [data[:cut], data[cut:]])
        assert split.fingerprint == whole.fingerprint, cut
    trickle = ResponseTracker(_expect_of(payload), deprecate, fingerprint=True)
    _feed_all(trickle, [data[i : i + 1] for i in range(len(data))])
    assert trickle.fingerprint == whole.fingerprint


def test_with_statement_id_patches_only_the_first_frame():
    # COM_STMT_SEND_LONG_DATA of statement 1, cut in 3-byte and longer chunks as a spool yields them.
    frames = encode_packet(b"\x18\x01\x00\x00\x00\x00\x00abcdef", 0)[0]
    chunks = [frames[:11], frames[11:14], frames[14:]]
    out = list(with_statement_id(chunks, b"\x07\x00\x00\x00"))
    assert [len(c) for c in out] == [11, 3, len(frames) - 14]
    assert b"".join(out) == frames[:5] + b"\x07\x00\x00\x00" + frames[9:]
