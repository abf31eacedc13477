"""The hand-over channel's frames (proxy.handover.protocol): golden bytes both ways, frames
split and merged as a stream socket delivers them, descriptors handed out in order, and every
malformed frame refused with a reason."""

from __future__ import annotations

import os

import pytest

from proxy.handover.protocol import MAX_FDS, VERSION, Decoder, Message, ProtocolError, encode

# 14-byte prefix: magic, version 1, descriptor count, header length, payload length (big-endian)
OFFER = b'RPHO\x01\x00\x00\x00\x00\x18\x00\x00\x00\x00{"pid":7,"type":"offer"}'
STATE = b'RPHO\x01\x02\x00\x00\x00\x1c\x00\x00\x00\x02{"n":[1,"a"],"type":"state"}\x00\xff'


def test_golden_bytes_of_a_header_only_frame():
    assert encode(Message("offer", {"pid": 7})) == OFFER


def test_golden_bytes_of_a_frame_with_descriptors_and_a_payload():
    # the descriptors themselves travel beside the bytes: the frame holds their count only
    assert encode(Message("state", {"n": [1, "a"]}, [30, 31], b"\x00\xff")) == STATE


def test_golden_bytes_decode():
    decoder = Decoder()
    decoder.feed(OFFER + STATE, [30, 31])
    assert decoder.next_message() == Message("offer", {"pid": 7})
    assert decoder.next_message() == Message("state", {"n": [1, "a"]}, [30, 31], b"\x00\xff")
    assert decoder.next_message() is None
    assert decoder.buffered() == 0


def test_a_frame_fed_byte_by_byte_comes_out_once_complete():
    decoder = Decoder()
    frame = encode(Message("serving", {"adopted": ["client 127.0.0.1:4000"], "pid": 12}))
    for i, byte in enumerate(frame):
        assert decoder.next_message() is None
        decoder.feed(bytes([byte]), [40] if i == 0 else [])  # the descriptor arrives with the first byte
    assert decoder.next_message() == Message("serving", {"adopted": ["client 127.0.0.1:4000"], "pid": 12})


def test_descriptors_go_to_the_frames_that_announce_them():
    decoder = Decoder()
    decoder.feed(encode(Message("a", {}, [1])) + encode(Message("b")) + encode(Message("c", {}, [2, 3])), [10, 11, 12])
    assert [(m.type, m.fds) for m in iter(decoder.next_message, None)] == [("a", [10]), ("b", []), ("c", [11, 12])]


def test_round_trip_of_a_large_payload():
    payload = os.urandom(3 * 65536 + 5)
    decoder = Decoder()
    decoder.feed(encode(Message("journal", {"session": 1000000001}, [], payload)))
    assert decoder.next_message().payload == payload


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"GET / HTTP/1.0\r\n", "not a hand-over frame"),
        (b"RPX", "not a hand-over frame"),  # refused before the prefix is complete
        (b"RPHO\x02" + OFFER[5:], f"version 2, this one version {VERSION}"),
        (b"RPHO\x01\xff" + OFFER[6:], "out of bounds"),
        (b"RPHO\x01\x00\xff\xff\xff\xff\x00\x00\x00\x00", "out of bounds"),
        (b"RPHO\x01\x00\x00\x00\x00\x03\x00\x00\x00\x00{x}", "not JSON"),
        (b"RPHO\x01\x00\x00\x00\x00\x02\x00\x00\x00\x00[]", "not an object with a 'type'"),
        (b'RPHO\x01\x00\x00\x00\x00\x0a\x00\x00\x00\x00{"type":1}', "not an object with a 'type'"),
        (b"RPHO\x01\x01" + OFFER[6:], "announces 1 descriptor(s), 0 arrived"),
    ],
)
def test_malformed_frames_are_refused_with_the_reason(data, reason):
    decoder = Decoder()
    decoder.feed(data)
    with pytest.raises(ProtocolError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        decoder.next_message()


def test_what_cannot_be_encoded_is_refused():
    with pytest.raises(ProtocolError, match="cannot hold 'type'"):
        encode(Message("offer", {"type": "x"}))
    with pytest.raises(ProtocolError, match="descriptors"):
        encode(Message("offer", {}, list(range(MAX_FDS + 1))))


def test_close_fds_closes_descriptors_no_frame_took():
    r, w = os.pipe()
    decoder = Decoder()
    decoder.feed(OFFER[:5], [r, w])
    decoder.close_fds()
    for fd in (r, w):
        with pytest.raises(OSError):
            os.fstat(fd)
