"""The command in flight's send state (proxy.cycle.inflight.SendState)."""

from __future__ import annotations

from proxy.cycle import inflight
from proxy.cycle.inflight import Inflight, SendState
from proxy.protocol.framing import encode_packet
from proxy.protocol.response import ResponseTracker, expect_for
from proxy.session.intake import Command


def test_send_states_are_an_enum_under_their_old_names():
    assert [inflight.NOT_SENT, inflight.SENDING, inflight.SENT, inflight.SEND_FAILED] == list(SendState)


def test_a_log_line_names_the_send_state_and_a_restart_forgets_it():
    payload = b"\x03SELECT 1"
    command = Command(payload, encode_packet(payload, 0)[0], 0, len(payload))
    sent = Inflight(command, ResponseTracker(expect_for(0x03), True), None, 0.0, verb=b"SELECT")
    assert sent.state is SendState.NOT_SENT
    sent.state = SendState.SEND_FAILED
    assert sent.describe("COM_QUERY") == "COM_QUERY SELECT (send failed)"
    sent.restart(True)
    assert sent.state is SendState.NOT_SENT and sent.describe("COM_QUERY") == "COM_QUERY SELECT (not sent)"
