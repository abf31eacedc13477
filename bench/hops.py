"""Where a statement's round trip goes through a middle: packets captured on the loopback
interface with the kernel's timestamps, then paired.

A round trip on a connection is a request (the client's first packet with payload after the
last answer) and the server's first packet back. Through a middle there are two for each
statement: the client's to the middle (``front``) and the middle's to the server (``back``).
They pair by the request's length and first bytes (the middle forwards a plain command as it
is), the back one the first unpaired after the front one. Then:

- inbound hop: the middle read the request until it wrote it to the server;
- the server's round trip, as its socket sees it;
- outbound hop: the server's first answer packet until the middle's to the client.

The kernel stamps each packet as the loopback device hands it over, so the capture's own
delays do not skew the times (they cost CPU, though: compare runs that all capture). Capturing
needs CAP_NET_RAW (root in the lab).
"""

from __future__ import annotations

import bisect
import socket
import statistics
import struct
import threading
import time
from collections import defaultdict

SO_TIMESTAMPNS = 35
ETH_P_ALL = 0x0003
PACKET_HOST = 0  # lo shows each packet twice, outgoing then host: keep one
HEAD = 16  # payload bytes kept to pair a forwarded request with its original

Packet = tuple[float, int, int, int, bytes]  # (time, source port, destination port, payload length, head)
Trip = tuple[float, float, int, bytes, int]  # (request time, answer time, length, head, client port)


def parse_frame(frame: bytes, stamp: float) -> Packet | None:
    """One Ethernet frame of lo: its TCP ports, payload length and head, or None (no IPv4 TCP
    payload: a pure ACK, ARP, IPv6)."""
    if len(frame) < 34 or frame[12:14] != b"\x08\x00" or frame[23] != socket.IPPROTO_TCP:
        return None
    ihl = (frame[14] & 15) * 4
    (total,) = struct.unpack_from("!H", frame, 16)
    tcp = 14 + ihl
    source, dest = struct.unpack_from("!HH", frame, tcp)
    offset = (frame[tcp + 12] >> 4) * 4
    length = total - ihl - offset
    if length <= 0:
        return None
    return stamp, source, dest, length, bytes(frame[tcp + offset : tcp + offset + HEAD])


class LoCapture(threading.Thread):
    """Capture lo's TCP packets with payload for ``seconds``, ``delay`` seconds after start()
    (``packets`` after join()); ``error`` says why not, such as a missing CAP_NET_RAW."""

    def __init__(self, seconds: float, delay: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.seconds, self.delay = seconds, delay
        self.packets: list[Packet] = []
        self.error: str | None = None

    def run(self) -> None:
        try:
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        except OSError as exc:
            self.error = f"no packet capture: {exc} (needs CAP_NET_RAW)"
            return
        with sock:
            time.sleep(self.delay)
            sock.bind(("lo", 0))
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            sock.settimeout(0.2)
            end = time.time() + self.seconds
            while time.time() < end:
                try:
                    frame, ancillary, _flags, address = sock.recvmsg(14 + 60 + 60 + HEAD, 64)
                except TimeoutError:
                    continue
                stamps = [data for level, kind, data in ancillary if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS]
                if address[2] != PACKET_HOST or not stamps:
                    continue
                seconds, nanoseconds = struct.unpack("qq", stamps[0][:16])
                packet = parse_frame(frame, seconds + nanoseconds / 1e9)
                if packet is not None:
                    self.packets.append(packet)


def round_trips(packets: list[Packet], server_port: int) -> list[Trip]:
    """Every request and first answer on connections to ``server_port``, by request time."""
    by_client: dict[int, list[tuple[float, bool, int, bytes]]] = defaultdict(list)
    for t, source, dest, length, head in packets:
        if dest == server_port:
            by_client[source].append((t, True, length, head))
        elif source == server_port:
            by_client[dest].append((t, False, length, head))
    trips: list[Trip] = []
    for client, events in by_client.items():
        request: tuple[float, int, bytes] | None = None
        for t, is_request, length, head in sorted(events):
            if is_request and request is None:
                request = (t, length, head)
            elif not is_request and request is not None:
                trips.append((request[0], t, request[1], request[2], client))
                request = None
    return sorted(trips)


def hops(packets: list[Packet], front_port: int, back_port: int, window: float = 0.05) -> dict[str, list[float]]:
    """Each client round trip through the middle listening on ``front_port`` paired with the
    middle's own to ``back_port`` (within ``window`` seconds): seconds of the client's round
    trip, the inbound hop, the server's round trip and the outbound hop, pair by pair."""
    back_by_key: dict[tuple[int, bytes], list[Trip]] = defaultdict(list)
    for trip in round_trips(packets, back_port):
        back_by_key[trip[2], trip[3]].append(trip)
    taken: set[Trip] = set()
    out: dict[str, list[float]] = {"client": [], "inbound": [], "server": [], "outbound": []}
    for t0, t3, length, head, _client in round_trips(packets, front_port):
        candidates = back_by_key.get((length, head), [])
        i = bisect.bisect_left(candidates, (t0,))
        while i < len(candidates) and candidates[i] in taken:
            i += 1
        if i == len(candidates) or candidates[i][0] - t0 > window or candidates[i][1] > t3:
            continue
        t1, t2 = candidates[i][0], candidates[i][1]
        taken.add(candidates[i])
        out["client"].append(t3 - t0)
        out["inbound"].append(t1 - t0)
        out["server"].append(t2 - t1)
        out["outbound"].append(t3 - t2)
    return out


def summary(seconds: list[float]) -> dict[str, float] | None:
    """count, mean, p50, p90, p99 in milliseconds (None for fewer than 2 values)."""
    if len(seconds) < 2:
        return None
    q = statistics.quantiles(seconds, n=100, method="inclusive")
    return {"count": len(seconds), "mean": 1e3 * statistics.fmean(seconds), "p50": 1e3 * q[49], "p90": 1e3 * q[89], "p99": 1e3 * q[98]}
