"""A DNS server the test starts and whose answers it changes: Debian's dnsmasq (package
``dnsmasq-base``: the binary alone, no service), on a free port of 127.0.0.1, answering from a
hosts file it reads again on SIGHUP -- a headless Service's name whose records are its pods.

    dns = DNSServer(tmp_path / "dns")
    dns.start()
    dns.set("tidb-peer.lab.test", ["127.0.0.2", "127.0.0.3"])   # answered from now on
    dns.nameserver                                             # "127.0.0.1:<port>"
    dns.stop()

It serves only the names it is given (``--no-resolv``: nothing is forwarded anywhere), with a
TTL of 0; a name of the lab's domain it does not know is NXDOMAIN. Stopping it is a DNS that
does not answer (the proxy's lookups time out).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import time
from pathlib import Path

from tests.lab.server import HOST, ServerProcess

DOMAIN = "lab.test"


def dnsmasq_path() -> str | None:
    return shutil.which("dnsmasq") or next((p for p in ("/usr/sbin/dnsmasq", "/sbin/dnsmasq") if os.access(p, os.X_OK)), None)


def dns_unavailable_reason() -> str | None:
    if dnsmasq_path() is None:
        return "no dnsmasq on PATH or in /usr/sbin (Debian: apt-get install dnsmasq-base; scripts/setup test installs it)"
    return None


class DNSServer(ServerProcess):
    what = "dnsmasq"
    start_timeout = 10
    stop_timeout = 10

    def __init__(self, basedir: Path) -> None:
        super().__init__(basedir)
        self.hosts_path = self.basedir / "hosts"
        self.log_path = self.basedir / "dnsmasq.log"
        self.stdout_path = self.basedir / "dnsmasq.out"
        self.records: dict[str, list[str]] = {}

    @property
    def nameserver(self) -> str:
        return f"{HOST}:{self.port}"

    def prepare(self) -> None:
        self._write()

    def command(self) -> list[str]:
        program = dnsmasq_path()
        if program is None:
            raise RuntimeError(dns_unavailable_reason())
        return [
            program, "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts", "--no-poll",
            f"--addn-hosts={self.hosts_path}", f"--listen-address={HOST}", "--bind-interfaces", f"--port={self.port}",
            "--local-ttl=0", "--neg-ttl=0", f"--local=/{DOMAIN}/", "--pid-file=", f"--user={pwd.getpwuid(os.getuid()).pw_name}",
            "--log-queries", f"--log-facility={self.log_path}",
        ]  # fmt: skip

    def probe(self) -> None:
        """It answers a query (a hand-made one: the lab needs no DNS library for this)."""
        query = (
            b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
            + b"".join(bytes([len(p)]) + p.encode() for p in f"probe.{DOMAIN}".split("."))
            + b"\x00\x00\x01\x00\x01"
        )
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(0.5)
            s.sendto(query, (HOST, self.port))
            s.recvfrom(512)

    def set(self, name: str, addresses: list[str]) -> None:
        """``name`` answers ``addresses`` from now on (none: NXDOMAIN)."""
        self.records[name] = list(addresses)
        self._write()
        if self.is_running():
            assert self.pid is not None
            os.kill(self.pid, signal.SIGHUP)
            time.sleep(0.05)  # dnsmasq rereads the file between queries

    def _write(self) -> None:
        lines = [f"{address} {name}" for name, addresses in self.records.items() for address in addresses]
        tmp = self.hosts_path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in lines))
        os.replace(tmp, self.hosts_path)
