"""bench.hops: lo's frames parsed, round trips found, a middle's hops paired."""

from __future__ import annotations

import struct

import pytest

from bench.hops import hops, parse_frame, round_trips, summary

COM_QUERY_SELECT_1 = b"\x09\x00\x00\x00\x03SELECT 1"


def frame(source: int, dest: int, payload: bytes, tcp_options: bytes = b"") -> bytes:
    """Ethernet (lo's zero addresses) + IPv4 + TCP + payload."""
    tcp = struct.pack("!HHIIBBHHH", source, dest, 1, 1, (5 + len(tcp_options) // 4) << 4, 0x18, 512, 0, 0) + tcp_options
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp) + len(payload), 0, 0, 64, 6, 0, b"\x7f\0\0\1", b"\x7f\0\0\1")
    return b"\0" * 12 + b"\x08\x00" + ip + tcp + payload


def test_a_frame_gives_its_ports_payload_length_and_head():
    assert parse_frame(frame(40000, 4000, COM_QUERY_SELECT_1), 1.5) == (1.5, 40000, 4000, 13, COM_QUERY_SELECT_1)


def test_tcp_options_are_skipped_and_the_head_is_cut():
    payload = b"\x20\x00\x00\x00\x03" + b"x" * 31
    assert parse_frame(frame(1, 2, payload, tcp_options=b"\x01" * 12), 0.0) == (0.0, 1, 2, 36, payload[:16])


def test_no_payload_or_not_tcp_is_none():
    assert parse_frame(frame(1, 2, b""), 0.0) is None  # a pure ACK
    udp = bytearray(frame(1, 2, b"abc"))
    udp[23] = 17
    assert parse_frame(bytes(udp), 0.0) is None
    assert parse_frame(b"\0" * 12 + b"\x86\xdd" + b"\0" * 60, 0.0) is None  # IPv6


def test_a_round_trip_is_the_first_request_packet_to_the_first_answer():
    packets = [
        (1.0, 50001, 4000, 13, b"q1"),
        (1.1, 50001, 4000, 100, b"q1-more"),  # the same request's second packet
        (1.5, 4000, 50001, 11, b"ok"),
        (1.6, 4000, 50001, 11, b"ok-more"),  # the same answer's second packet
        (2.0, 50001, 4000, 13, b"q2"),
        (2.25, 4000, 50001, 11, b"ok"),
        (3.0, 50002, 4000, 13, b"q3"),  # no answer in the capture
        (0.5, 4000, 50003, 11, b"greeting"),  # an answer with no request: skipped
    ]
    assert round_trips(packets, 4000) == [(1.0, 1.5, 13, b"q1", 50001), (2.0, 2.25, 13, b"q2", 50001)]


def test_hops_pair_each_client_request_with_the_middles_forward_of_it():
    front, back = 6033, 4000
    packets = [
        # client A: a query through the middle
        (10.000, 50001, front, 13, b"select"),
        (10.001, 60001, back, 13, b"select"),
        (10.004, back, 60001, 11, b"ok"),
        (10.006, front, 50001, 11, b"ok"),
        # client B: the same bytes a moment later, on its own backend connection
        (10.0005, 50002, front, 13, b"select"),
        (10.002, 60002, back, 13, b"select"),
        (10.003, back, 60002, 11, b"ok"),
        (10.0035, front, 50002, 11, b"ok"),
        # the middle's own statement (a commit marker): no client request pairs with it
        (11.000, 60001, back, 40, b"marker"),
        (11.001, back, 60001, 11, b"ok"),
    ]
    got = hops(packets, front, back)
    assert got["client"] == pytest.approx([0.006, 0.003])
    assert got["inbound"] == pytest.approx([0.001, 0.0015])
    assert got["server"] == pytest.approx([0.003, 0.001])
    assert got["outbound"] == pytest.approx([0.002, 0.0005])


def test_a_forward_too_late_or_answered_after_the_client_is_not_a_pair():
    front, back = 6033, 4000
    packets = [
        (1.0, 50001, front, 13, b"q"),
        (1.2, 60001, back, 13, b"q"),  # 200 ms later: not this request's forward
        (1.3, back, 60001, 11, b"ok"),
        (1.4, front, 50001, 11, b"ok"),
    ]
    assert hops(packets, front, back)["client"] == []


def test_summary_in_milliseconds():
    s = summary([0.001 * i for i in range(1, 101)])
    assert s is not None
    assert s["count"] == 100 and s["mean"] == pytest.approx(50.5)
    assert s["p50"] == pytest.approx(50.5) and s["p99"] == pytest.approx(99.01)
    assert summary([0.5]) is None
