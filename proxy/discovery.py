"""Where the tidb-servers are (``backend.discovery``), looked up again and again.

- ``static``: ``backend.addresses`` as written (a name there is resolved at each connect).
- ``dns``: each entry of ``backend.addresses`` is a name (``host:port``) whose A and AAAA
  records are the servers, each at the name's port: TiDB Operator's headless Service
  (``basic-tidb-peer.tidb-cluster.svc:4000``), or one pod's name
  (``basic-tidb-0.basic-tidb-peer.tidb-cluster.svc:4000``), whose address changes when the pod
  comes back. Looked up through the DNS servers of /etc/resolv.conf (its search domains and
  ndots too), or ``backend.dns.nameservers``.
- ``pd``: the tidb-servers registered in PD, read as TiProxy reads them: every tidb-server
  writes ``/topology/tidb/<ip:port>/info`` (its version and status port) and
  ``/topology/tidb/<ip:port>/ttl`` (refreshed every 30 s under a 45 s lease) into PD's etcd;
  a server whose ``ttl`` key is gone is gone. PD's client port serves etcd's JSON gateway,
  so the keys are one ``POST /v3/kv/range`` away (with PD's TLS: ``[backend.pd]``); PD's own
  ``/pd/api/v1`` has no list of tidb-servers.

``Discovery.run`` asks every ``backend.discovery_interval`` and tells the target what changed
(``Target.update_addresses``): a server that appears is health-checked at once and gets new
sessions; one that disappears is drained like one whose status port answers 500 (its
sessions move between transactions). A lookup that fails, or finds nothing, changes nothing:
the last set found stays, the failure is logged (the first, then every 10th, then the
recovery) and counted, and the next round asks again.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import httpx
import trio

from proxy.config import Address, BackendConfig, nameserver_address

__all__ = ["Found", "Lookup", "DiscoveryError", "DnsSource", "PdSource", "Discovery", "parse_topology", "TOPOLOGY_PREFIX"]

log = logging.getLogger("replay_proxy.discovery")

TOPOLOGY_PREFIX = "/topology/tidb/"


class DiscoveryError(Exception):
    """A lookup that found nothing to go by: the last set found stays."""


@attrs.frozen
class Found:
    """One server a lookup found."""

    address: Address
    origin: str  # what found it: "dns NAME", "pd"
    status_port: int | None = None  # the status port it registered (pd)


@attrs.frozen
class Lookup:
    servers: dict[Address, Found]  # in a stable order
    problems: tuple[str, ...] = ()  # parts that failed and were answered from the last good lookup


# -- dns ------------------------------------------------------------------------------------

# resolve(name, rdtype) -> the addresses of that type; raises NoRecords (the name has none of
# that type, or does not exist) or anything else for a failure (no answer, SERVFAIL...).
Resolve = Callable[[str, str], Awaitable[list[str]]]


class NoRecords(Exception):
    """The DNS answered: the name does not exist (NXDOMAIN), or has no record of that type."""


def _ip_sort_key(address: Address) -> tuple[int, int]:
    ip = ipaddress.ip_address(address.host)
    return (ip.version, int(ip))


def addresses_of(answer: Any) -> list[str]:
    """The addresses of a dnspython answer to an A or AAAA question (CNAMEs followed: the
    answer's rrset is the last name's)."""
    rrset = getattr(answer, "rrset", None)
    return [rdata.address for rdata in rrset] if rrset is not None else []


class DnsResolver:
    """A and AAAA lookups with dnspython on trio: /etc/resolv.conf's servers, search domains
    and ndots (or ``nameservers``), ``timeout`` for each lookup, retried by dnspython on the
    next server within it."""

    def __init__(self, nameservers: list[str], timeout: float, resolv_conf: str = "/etc/resolv.conf") -> None:
        import dns.asyncresolver
        import dns.nameserver

        resolver = dns.asyncresolver.Resolver(configure=False)
        try:
            resolver.read_resolv_conf(resolv_conf)
        except Exception as exc:  # noqa: BLE001 - no file, or nothing usable in it
            if not nameservers:
                raise DiscoveryError(f"no DNS server: {resolv_conf}: {exc}; set backend.dns.nameservers") from None
        if nameservers:
            resolver.nameservers = [dns.nameserver.Do53Nameserver(*nameserver_address(n)) for n in nameservers]
        resolver.lifetime = timeout
        resolver.timeout = max(0.2, timeout / 2)  # one server's share: the next one gets its turn
        resolver.cache = None
        self.resolver = resolver

    async def __call__(self, name: str, rdtype: str) -> list[str]:
        import dns.exception
        import dns.resolver

        try:
            answer = await self.resolver.resolve(name, rdtype, search=True, raise_on_no_answer=False)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            raise NoRecords(f"{name}: no such name") from None
        except dns.resolver.LifetimeTimeout:
            raise DiscoveryError(f"{name} {rdtype}: no answer within {self.resolver.lifetime:g}s") from None
        except dns.resolver.NoNameservers as exc:
            raise DiscoveryError(f"{name} {rdtype}: {_first_line(exc)}") from None
        except dns.exception.DNSException as exc:
            raise DiscoveryError(f"{name} {rdtype}: {type(exc).__name__}: {_first_line(exc)}") from None
        found = addresses_of(answer)
        if not found:
            raise NoRecords(f"{name}: no {rdtype} record")
        return found


def _first_line(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__).splitlines()[0]


class DnsSource:
    """``discovery = "dns"``: the A and AAAA records of every name of ``backend.addresses``.
    A name whose lookup fails (no answer, SERVFAIL, NXDOMAIN, no record at all) keeps the
    addresses it had; only when no name has any is the lookup a failure."""

    mode = "dns"

    def __init__(self, backend: BackendConfig, resolve: Resolve | None = None) -> None:
        self.names = list(backend.addresses)
        nameservers = backend.dns.nameservers if backend.dns is not None else []
        self.resolve = resolve if resolve is not None else DnsResolver(nameservers, backend.connect_timeout)
        self.last: dict[Address, list[Found]] = {}  # by name: the last addresses it had

    def describe(self) -> str:
        return "dns " + ", ".join(str(n) for n in self.names)

    async def lookup(self) -> Lookup:
        problems: list[str] = []
        servers: dict[Address, Found] = {}
        results: dict[Address, list[Found] | str] = {}

        async def one(name: Address) -> None:
            results[name] = await self._name(name)

        async with trio.open_nursery() as nursery:
            for name in self.names:
                nursery.start_soon(one, name)
        for name in self.names:
            result = results[name]
            if isinstance(result, str):
                kept = self.last.get(name, [])
                problems.append(f"{result}; kept its {len(kept)} address(es) of the last lookup" if kept else result)
                result = kept
            else:
                self.last[name] = result
            for found in result:
                servers.setdefault(found.address, found)
        if not servers:
            raise DiscoveryError("; ".join(problems) or "no name to look up")
        return Lookup(servers, tuple(problems))

    async def _name(self, name: Address) -> list[Found] | str:
        """The servers under ``name``, or why there are none now."""
        origin = f"dns {name}"
        try:
            ipaddress.ip_address(name.host)
        except ValueError:
            pass
        else:
            return [Found(name, origin)]  # an address, not a name
        answers: dict[str, list[str] | BaseException] = {}

        async def ask(rdtype: str) -> None:
            try:
                answers[rdtype] = await self.resolve(name.host, rdtype)
            except Exception as exc:  # noqa: BLE001 - what went wrong is the answer
                answers[rdtype] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "A")
            nursery.start_soon(ask, "AAAA")
        failed = [a for a in answers.values() if isinstance(a, BaseException) and not isinstance(a, NoRecords)]
        if failed:  # one family unanswered: the name's set is not known
            return f"{name.host}: " + "; ".join(_first_line(f) for f in failed)
        addresses = []
        for rdtype in ("A", "AAAA"):
            answer = answers[rdtype]
            if isinstance(answer, list):
                for host in answer:
                    try:
                        addresses.append(Address(str(ipaddress.ip_address(host)), name.port))
                    except ValueError:
                        continue
        if not addresses:
            return f"{name.host}: no A or AAAA record (no such name, or no server ready)"
        return [Found(a, origin) for a in sorted(set(addresses), key=_ip_sort_key)]

    async def aclose(self) -> None:
        pass


# -- pd -------------------------------------------------------------------------------------


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _prefix_end(prefix: str) -> str:
    """etcd's range end for every key under ``prefix``: its last byte plus one."""
    raw = prefix.encode()
    return base64.b64encode(raw[:-1] + bytes([raw[-1] + 1])).decode()


def parse_topology(answer: Any) -> tuple[dict[Address, Found], list[str]]:
    """The tidb-servers of etcd's answer to a range read of ``/topology/tidb/`` (its JSON
    gateway's: base64 keys and values), and what was wrong in it. A server counts when it has
    both its ``info`` key (JSON: its ``status_port``) and its ``ttl`` key (under a lease the
    server refreshes: gone when the server is)."""
    if not isinstance(answer, dict):
        raise DiscoveryError(f"PD answered {type(answer).__name__}, not an etcd range answer")
    if "kvs" not in answer and ("error" in answer or "message" in answer):
        raise DiscoveryError(f"PD answered an error: {answer.get('error') or answer.get('message')}")
    if "header" not in answer and "kvs" not in answer:
        raise DiscoveryError("PD's answer has no 'kvs': not an etcd range answer")
    kvs = answer.get("kvs") or []
    if not isinstance(kvs, list):
        raise DiscoveryError("PD's answer has 'kvs' that is not a list")
    infos: dict[str, dict] = {}
    alive: set[str] = set()
    problems: list[str] = []
    for kv in kvs:
        try:
            key = base64.b64decode(kv["key"]).decode()
        except (KeyError, TypeError, ValueError) as exc:
            problems.append(f"an unreadable key ({type(exc).__name__})")
            continue
        if not key.startswith(TOPOLOGY_PREFIX):
            continue
        addr, _, leaf = key[len(TOPOLOGY_PREFIX) :].rpartition("/")
        if leaf == "ttl":
            alive.add(addr)
        elif leaf == "info":
            try:
                info = json.loads(base64.b64decode(kv.get("value") or ""))
                if not isinstance(info, dict):
                    raise ValueError("not a JSON object")
            except (TypeError, ValueError) as exc:
                problems.append(f"{key}: unreadable info ({exc})")
                continue
            infos[addr] = info
    servers: dict[Address, Found] = {}
    for addr in sorted(infos):
        if addr not in alive:
            continue  # its lease expired: the server is gone (its info key stays behind)
        try:
            address = Address.parse(addr)
        except ValueError as exc:
            problems.append(f"{TOPOLOGY_PREFIX}{addr}: {exc}")
            continue
        port = infos[addr].get("status_port")
        status_port = port if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536 else None
        servers[address] = Found(address, "pd", status_port)
    return servers, problems


class PdSource:
    """``discovery = "pd"``: the tidb-servers registered in PD (``parse_topology``), read from
    the endpoints in turn, the last that answered first."""

    mode = "pd"

    def __init__(self, backend: BackendConfig, transport: httpx.AsyncBaseTransport | None = None) -> None:
        pd = backend.pd
        if pd is None or not pd.endpoints:
            raise DiscoveryError("discovery = 'pd' needs backend.pd.endpoints")
        self.urls = pd.urls()
        self.timeout = backend.connect_timeout
        self.server_name = pd.server_name
        verify: ssl.SSLContext | bool = True
        if any(u.startswith("https://") for u in self.urls):
            verify = ssl.create_default_context(cafile=pd.ca) if pd.ca else ssl.create_default_context()
            if pd.cert:
                verify.load_cert_chain(pd.cert, pd.key)
        # trust_env off: no HTTP(S)_PROXY between the proxy and its cluster's PD.
        self.client = httpx.AsyncClient(verify=verify, trust_env=False, follow_redirects=False, transport=transport)
        self.preferred = 0

    def describe(self) -> str:
        return "pd " + ", ".join(self.urls)

    async def lookup(self) -> Lookup:
        errors = []
        for i in range(len(self.urls)):
            index = (self.preferred + i) % len(self.urls)
            url = self.urls[index]
            try:
                answer = await self._range(url)
                servers, problems = parse_topology(answer)
            except DiscoveryError as exc:
                errors.append(f"{url}: {exc}")
                continue
            self.preferred = index
            if not servers:  # (every PD member reads the same keys: no use asking the next)
                errors.append(f"{url}: no tidb-server registered (no {TOPOLOGY_PREFIX}<address>/ttl key)")
                break
            return Lookup(servers, tuple(problems))
        raise DiscoveryError("; ".join(errors))

    async def _range(self, url: str) -> Any:
        body = {"key": _b64(TOPOLOGY_PREFIX), "range_end": _prefix_end(TOPOLOGY_PREFIX)}
        extensions = {"sni_hostname": self.server_name} if self.server_name and url.startswith("https://") else None
        with trio.move_on_after(self.timeout) as scope:
            try:
                response = await self.client.post(f"{url}/v3/kv/range", json=body, timeout=self.timeout, extensions=extensions)
            except httpx.TimeoutException:
                raise DiscoveryError(f"no answer within {self.timeout:g}s") from None
            except httpx.HTTPError as exc:
                raise DiscoveryError(_http_reason(exc)) from None
        if scope.cancelled_caught:
            raise DiscoveryError(f"no answer within {self.timeout:g}s")
        if response.status_code != 200:
            raise DiscoveryError(f"POST /v3/kv/range answered {response.status_code}: {response.text[:200]!r}")
        try:
            return response.json()
        except ValueError:
            raise DiscoveryError("POST /v3/kv/range answered something that is not JSON") from None

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await self.client.aclose()


def _http_reason(exc: BaseException) -> str:
    from proxy.health import _reason

    return _reason(exc)


# -- the task -------------------------------------------------------------------------------


def make_source(backend: BackendConfig) -> DnsSource | PdSource | None:
    """The source of ``backend.discovery`` (None: static)."""
    if backend.discovery == "dns":
        return DnsSource(backend)
    if backend.discovery == "pd":
        return PdSource(backend)
    return None


class Discovery:
    """The trio task that keeps ``target``'s addresses: one lookup every
    ``backend.discovery_interval``, the difference handed to ``target.update_addresses``, and
    every address that appeared checked at once (``checker.check``). A reload may change the
    mode or its settings: the next round uses the config in force."""

    def __init__(self, target: Any, checker: Any = None, make: Callable[[BackendConfig], Any] = make_source) -> None:
        self.target = target
        self.checker = checker
        self.make = make
        self.source: Any = None
        self.failures = 0  # lookups failed in a row
        self.failing_since: float | None = None
        self.woken = trio.Event()

    def wake(self) -> None:
        """Look up now (a reload changed the settings)."""
        self.woken.set()

    async def _source(self, backend: BackendConfig) -> Any:
        key = (backend.discovery, backend.addresses, backend.dns, backend.pd, backend.connect_timeout)
        if self.source is not None and getattr(self.source, "config_key", None) == key:
            return self.source
        if self.source is not None:
            await self.source.aclose()
            self.source = None
        if backend.discovery == "static":
            return None
        source = self.make(backend)
        source.config_key = key
        self.source = source
        log.info("target %s: discovery %s, every %gs", self.target.name, source.describe(), backend.discovery_interval)
        return source

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            async with trio.open_nursery() as checks:
                while True:
                    backend = self.target.config.backend
                    try:
                        source = await self._source(backend)
                    except (DiscoveryError, OSError, ValueError) as exc:
                        source = None
                        self._failed(backend, f"cannot set up: {exc}")
                    if source is not None:
                        await self.round(source, checks)
                    self.woken = trio.Event()
                    with trio.move_on_after(backend.discovery_interval if backend.discovery != "static" else 1.0):
                        await self.woken.wait()
        finally:
            if self.source is not None:
                await self.source.aclose()

    async def round(self, source: Any, checks: trio.Nursery | None = None) -> None:
        """One lookup; its outcome given to the target."""
        backend = self.target.config.backend
        stats = self.target.stats
        started = trio.current_time()
        try:
            # Every wait inside has its own timeout; this one bounds the whole (several names,
            # several PD endpoints).
            with trio.fail_after(max(1.0, backend.connect_timeout) * (len(getattr(source, "urls", ())) + 2)):
                found = await source.lookup()
        except (DiscoveryError, trio.TooSlowError, OSError) as exc:
            stats.discovery_lookup(source.mode, ok=False, seconds=trio.current_time() - started)
            self._failed(backend, str(exc) or "no answer in time")
            return
        stats.discovery_lookup(source.mode, ok=True, seconds=trio.current_time() - started)
        if self.failures:
            log.warning("target %s: discovery (%s) answers again after %d failed lookup(s) in %.0fs", self.target.name,
                        source.describe(), self.failures, trio.current_time() - (self.failing_since or started))  # fmt: skip
        self.failures, self.failing_since = 0, None
        for problem in found.problems:
            log.warning("target %s: discovery (%s): %s", self.target.name, source.describe(), problem)
        added = self.target.update_addresses(found.servers, source.describe())
        if self.checker is not None and checks is not None:
            for address in added:
                checks.start_soon(self.checker.check, address)

    def _failed(self, backend: BackendConfig, why: str) -> None:
        self.failures += 1
        if self.failing_since is None:
            self.failing_since = trio.current_time()
        if self.failures == 1 or self.failures % 10 == 0:
            known = self.target.addresses
            log.warning("target %s: discovery (%s) failed%s: %s; keeping the %d known address(es)%s; asking again every %gs",
                        self.target.name, backend.discovery, f" {self.failures} times in a row" if self.failures > 1 else "", why,
                        len(known), f" ({', '.join(str(a) for a in known)})" if known else "", backend.discovery_interval)  # fmt: skip
