"""systemd's readiness protocol (sd_notify), without a dependency: one datagram of
``KEY=value`` lines to the socket named by ``NOTIFY_SOCKET`` (set by systemd for a unit with
``Type=notify`` or ``NotifyAccess=``; unset otherwise, and then nothing is sent).

An upgrade moves the unit's main PID: the old process (the main one, the only one systemd
listens to under ``NotifyAccess=main``) sends ``MAINPID=<new>``, then the new process sends
``MAINPID=<its pid>`` and ``READY=1`` (enough alone under ``NotifyAccess=all``).
"""

from __future__ import annotations

import logging
import os
import socket

__all__ = ["notify"]

log = logging.getLogger("replay_proxy.handover")


def notify(*lines: str) -> bool:
    """Send ``lines`` (``"READY=1"``, ``"MAINPID=123"``) to systemd; False when not under a
    notify unit or the datagram could not be sent (logged: the proxy serves on regardless)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall("\n".join(lines).encode())
    except OSError as exc:
        log.warning("could not tell systemd %s through NOTIFY_SOCKET %s: %s", ", ".join(lines), address.lstrip("\0"), exc)
        return False
    log.debug("told systemd: %s", ", ".join(lines))
    return True
