"""The hand-over channel: frames (``protocol``) over a Unix stream socket, file descriptors
passed by SCM_RIGHTS with each frame's first byte.

The socket is one end of a ``socketpair``; the other end is inherited by the new process
(``pair``, then ``from_fd`` in the child), so nothing is bound on the filesystem and no
other process can connect. Every wait is a trio wait on the raw socket with a timeout: a
process that stops answering is a ``HandoverTimeout``, one that exits a ``ChannelClosed``,
each with a sentence that says what was awaited.
"""

from __future__ import annotations

import array
import os
import socket

import trio

from proxy.handover.protocol import MAX_FDS, ChannelClosed, Decoder, HandoverTimeout, Message, ProtocolError, encode

__all__ = ["HandoverChannel"]

_RECEIVE_SIZE = 1 << 16


class HandoverChannel:
    """One end of the hand-over socket. ``peer`` names the other side in errors."""

    def __init__(self, sock: socket.socket, peer: str = "the other process") -> None:
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
            raise ValueError(f"the hand-over channel needs a Unix stream socket, got {sock.family!r} {sock.type!r}")
        sock.setblocking(False)
        self.sock = sock
        self.peer = peer
        self._decoder = Decoder()

    @classmethod
    def pair(cls, peer: str = "the new process") -> tuple[HandoverChannel, socket.socket]:
        """Our end, and the end to give a child process (``pass_fds``): close that one in this
        process once the child is started, so the child's exit reads as the channel closing."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        return cls(ours, peer), theirs

    @classmethod
    def from_fd(cls, fd: int, peer: str = "the old process") -> HandoverChannel:
        """The end this process inherited (``--handover-fd``)."""
        try:
            sock = socket.socket(fileno=fd)
        except OSError as exc:
            raise ChannelClosed(f"hand-over descriptor {fd} is not usable: {exc.strerror or exc}") from None
        os.set_inheritable(sock.fileno(), False)  # not for the processes this one starts
        return cls(sock, peer)

    async def send(self, message: Message, *, timeout: float) -> None:
        """Send one frame and its descriptors (they stay open here: close them when done)."""
        data = memoryview(encode(message))
        fds = list(message.fds)
        with trio.move_on_after(timeout):
            while data:
                try:
                    sent = socket.send_fds(self.sock, [data], fds) if fds else self.sock.send(data)
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(self.sock)
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    raise ChannelClosed(f"{self.peer} closed the hand-over channel before taking {message.type}") from None
                data, fds = data[sent:], []  # the descriptors went with the first byte
            await trio.lowlevel.checkpoint()
            return
        raise HandoverTimeout(f"{self.peer} did not take {message.type} within {timeout:g} s")

    async def receive(self, *, timeout: float, expecting: str = "a message") -> Message:
        """The next message; its descriptors are this process's to adopt or close."""
        with trio.move_on_after(timeout):
            while True:
                message = self._next()
                if message is not None:
                    await trio.lowlevel.checkpoint()
                    return message
                try:
                    data, fds, flags = _recv_fds(self.sock)
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(self.sock)
                    continue
                except ConnectionResetError:
                    data, fds, flags = b"", [], 0
                if flags & socket.MSG_CTRUNC:
                    _close_all(fds)
                    raise ProtocolError(
                        "descriptors were lost in transit (MSG_CTRUNC): is this process out of file descriptors (ulimit -n)?"
                    )
                if not data:
                    _close_all(fds)
                    where = " in the middle of a message" if self._decoder.buffered() else ""
                    raise ChannelClosed(f"{self.peer} closed the hand-over channel{where} (expected {expecting})")
                self._decoder.feed(data, fds)
        raise HandoverTimeout(f"{self.peer} sent no {expecting} within {timeout:g} s")

    def _next(self) -> Message | None:
        try:
            return self._decoder.next_message()
        except ProtocolError:
            self._decoder.close_fds()
            raise

    def send_blocking(self, message: Message, *, timeout: float) -> None:
        """Send a frame without descriptors outside trio (a start that failed, after trio.run)."""
        if message.fds:
            raise ValueError("send_blocking sends no descriptors")
        self.sock.settimeout(timeout)
        try:
            self.sock.sendall(encode(message))
        except TimeoutError:
            raise HandoverTimeout(f"{self.peer} did not take {message.type} within {timeout:g} s") from None
        except (BrokenPipeError, ConnectionResetError):
            raise ChannelClosed(f"{self.peer} closed the hand-over channel before taking {message.type}") from None
        finally:
            self.sock.setblocking(False)

    def close(self) -> None:
        self._decoder.close_fds()
        self.sock.close()


def _recv_fds(sock: socket.socket) -> tuple[bytes, list[int], int]:
    """socket.recv_fds, but the descriptors close-on-exec (Python 3.11's drops its flags)."""
    fds = array.array("i")
    data, ancillary, flags, _ = sock.recvmsg(_RECEIVE_SIZE, socket.CMSG_SPACE(MAX_FDS * fds.itemsize), socket.MSG_CMSG_CLOEXEC)
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return data, list(fds), flags


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
