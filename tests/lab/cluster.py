"""A TiDB cluster as users run it, on free ports of 127.0.0.1: PD, one store process and
several tidb-servers (``-store tikv -path <pd>``) that share all data.

    cluster = Cluster(tmp_path / "cluster", servers=3, graceful_wait=3)
    cluster.start()
    cluster.servers[1].restart()        # one tidb-server, SIGTERM: the others serve meanwhile
    cluster.servers[2].kill(); cluster.servers[2].start()   # a crash: the store keeps the data
    cluster.restart_store()             # the whole database away
    cluster.stop()

As TiDB Operator runs it (``hosts``): every tidb-server on one SQL port and one status port, each
at its own loopback address, like pods behind a headless Service; a pod that comes back on a new
address, a scale out and a scale in:

    cluster = Cluster(tmp_path / "cluster", servers=2, hosts=True)   # 127.0.0.2, 127.0.0.3
    cluster.move_server(0, "127.0.0.9")      # SIGTERM, then the same server on a new address
    cluster.add_server()                     # a third, on the next free address
    cluster.remove_server(1)                 # SIGTERM, gone

The store is TiDB's own unistore served over TiKV's gRPC API in a process of its own
(``unistore-server``, syncing its writes), registered with a real PD: a SIGKILLed tidb-server
loses nothing it acknowledged, so exact data after a crash is provable here, unlike with the
single server's in-process unistore.

The binaries are not built here (nothing fetched is committed, nor a recipe for it): the lab
takes ``pd-server`` and ``unistore-server`` from ``$REPLAY_PROXY_CLUSTER_BIN`` (a folder),
then ``~/.cache/replay-proxy/bin``, then PATH; ``tiproxy`` likewise (tests/lab/tiproxy.py);
tidb-server as tests/lab/tidb.py finds it. Suites that need them skip with one line.
"""

from __future__ import annotations

import json
import signal as _signal
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.lab import binaries
from tests.lab.certs import make_certs
from tests.lab.server import HOST, ServerProcess, free_port
from tests.lab.tidb import TiDB, tidb_unavailable_reason

ENV_BIN = "REPLAY_PROXY_CLUSTER_BIN"
# The loopback addresses the "pods" of a cluster with ``hosts`` take (Linux routes all of
# 127.0.0.0/8 to lo).
LAB_HOSTS = tuple(f"127.0.0.{i}" for i in range(2, 12))
PROGRAMS = ("pd-server", "unistore-server")


def cluster_program(name: str) -> str | None:
    """``name`` from $REPLAY_PROXY_CLUSTER_BIN, else the cache folder, else PATH."""
    return binaries.find(name, ENV_BIN, folder=True)


def cluster_unavailable_reason() -> str | None:
    """None when PD, the store and tidb-server are at hand, else the one line a skip shows."""
    return tidb_unavailable_reason() or binaries.missing_reason(PROGRAMS, ENV_BIN, folder=True)


class ClusterError(RuntimeError):
    pass


class _ClusterProcess(ServerProcess):
    """One of the cluster's own processes (PD, the store): ready once it listens and
    ``ready()`` says so."""

    error = ClusterError
    start_timeout = 120
    probe_interval = 0.2

    def __init__(self, basedir: Path) -> None:
        super().__init__(basedir)
        self.log_path = self.basedir / f"{self.what}.log"
        self.stdout_path = self.basedir / f"{self.what}.out"

    def ready(self) -> bool:
        raise NotImplementedError

    def probe(self) -> None:
        super().probe()
        if not self.ready():
            raise ConnectionError(f"{self.what} listens but is not ready")


class PD(_ClusterProcess):
    what = "pd"

    def __init__(self, basedir: Path) -> None:
        super().__init__(basedir)
        self.peer_port = free_port()

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def prepare(self) -> None:
        # one store: no region waits for replicas
        (self.basedir / "pd.toml").write_text("[replication]\nmax-replicas = 1\n")

    def command(self) -> list[str]:
        program = cluster_program("pd-server")
        if program is None:
            raise ClusterError(cluster_unavailable_reason() or "no pd-server")
        return [
            program, "--name", "pd1", "--data-dir", str(self.basedir / "data"), "--log-file", str(self.log_path),
            "--client-urls", f"http://{self.address}", "--peer-urls", f"http://{HOST}:{self.peer_port}",
            "--config", str(self.basedir / "pd.toml"),
        ]  # fmt: skip

    def api(self, path: str, timeout: float = 3) -> object:
        with urllib.request.urlopen(f"http://{self.address}/pd/api/v1/{path}", timeout=timeout) as resp:
            return json.loads(resp.read())

    def ready(self) -> bool:
        try:
            health = self.api("health")
        except (OSError, ValueError, urllib.error.URLError):
            return False
        return isinstance(health, list) and bool(health) and all(m.get("health") for m in health)

    def stores_up(self) -> int:
        try:
            stores = self.api("stores").get("stores") or []  # type: ignore[union-attr]
        except (OSError, ValueError, urllib.error.URLError):
            return 0
        return sum(1 for s in stores if (s.get("store") or {}).get("state_name") == "Up")


class Store(_ClusterProcess):
    """The store: unistore over TiKV's gRPC API, in its own process, registered with PD."""

    what = "store"

    def __init__(self, basedir: Path, pd: PD) -> None:
        super().__init__(basedir)
        self.pd = pd

    def command(self) -> list[str]:
        program = cluster_program("unistore-server")
        if program is None:
            raise ClusterError(cluster_unavailable_reason() or "no unistore-server")
        return [program, "--pd", self.pd.address, "--addr", f"{HOST}:{self.port}", "--data-dir", str(self.basedir / "data"),
                "--log-file", str(self.log_path)]  # fmt: skip

    def ready(self) -> bool:
        return self.pd.stores_up() >= 1


class Cluster:
    """PD, the store and ``servers`` tidb-servers; ``graceful_wait`` is each server's
    ``graceful-wait-before-shutdown``. Every server has the same session-token signing cert
    and key, as TiProxy needs to move sessions between them."""

    flavor = "tidb"

    def __init__(
        self, basedir: Path, servers: int = 3, graceful_wait: int = 0, max_allowed_packet: str = "64M", hosts: bool = False
    ) -> None:
        self.basedir = Path(basedir).resolve()
        self.basedir.mkdir(parents=True, exist_ok=True)
        self.pd = PD(self.basedir / "pd")
        self.store = Store(self.basedir / "store", self.pd)
        certs = make_certs(self.basedir / "certs")
        security = f'[security]\nsession-token-signing-cert = "{certs.server_cert}"\nsession-token-signing-key = "{certs.server_key}"\n'
        # The cluster's first start: ADD INDEX through TiDB's distributed import would wait for a
        # service the store lacks, for ever; the classic reorganisation works.
        init = self.basedir / "init.sql"
        init.write_text("SET GLOBAL tidb_enable_dist_task = OFF;\nSET GLOBAL tidb_ddl_enable_fast_reorg = OFF;\n")
        self._options = dict(graceful_wait=graceful_wait, max_allowed_packet=max_allowed_packet, pd=self.pd.address, extra_config=security)
        self.hosts = hosts
        self.shared_port = self.shared_status_port = None
        if hosts:  # one SQL port and one status port on every address, as pods have
            self.shared_port, self.shared_status_port = free_port(*LAB_HOSTS), free_port(*LAB_HOSTS)
        self._made = 0
        self.servers = [self._server(init if i == 0 else None) for i in range(servers)]

    def _server(self, init: Path | None = None, host: str | None = None) -> TiDB:
        i, self._made = self._made, self._made + 1
        if host is None:
            host = self.free_host() if self.hosts else HOST
        # ``host`` in PD's topology (TiProxy and the proxy's discovery connect to what a server registers there)
        return TiDB(self.basedir / f"tidb{i}", **self._options, host=host, port=self.shared_port, status_port=self.shared_status_port,
                    extra_args=["-advertise-address", host, *(["-initialize-sql-file", str(init)] if init else [])])  # fmt: skip

    def free_host(self) -> str:
        """A lab address no server of this cluster uses: one never used before while any is
        left, then the one given up longest ago (a pod's new address; Kubernetes hands a freed
        pod IP out again too), so a long rolling restart never runs out."""
        in_use = {s.host for s in getattr(self, "servers", [])}
        given = getattr(self, "_given_hosts", [])  # every address handed out, the latest last
        fresh = [h for h in LAB_HOSTS if h not in given and h not in in_use]
        host = next(iter(fresh or [h for h in given if h not in in_use]), None)
        if host is None:
            raise ClusterError(f"every lab address is taken: {sorted(in_use)}")
        self._given_hosts = [h for h in given if h != host] + [host]
        return host

    def __repr__(self) -> str:
        return f"<Cluster pd {self.pd.address} servers {[s.port for s in self.servers]}>"

    def start(self, timeout: float = 120) -> None:
        """Start every part that is not running (PD, the store, then each tidb-server: the
        first start bootstraps the cluster, the others join it)."""
        for part in [self.pd, self.store, *self.servers]:
            if not part.is_running():
                part.start(timeout)

    def is_running(self) -> bool:
        return all(part.is_running() for part in [self.pd, self.store, *self.servers])

    def stop(self) -> None:
        errors = []
        for part in [*self.servers, self.store, self.pd]:
            try:
                part.stop()
            except Exception as exc:  # noqa: BLE001 - stop the rest, then say what failed
                errors.append(f"{part!r}: {exc}")
        if errors:
            raise ClusterError("; ".join(errors))

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what a client or the proxy needs ---------------------------------------------------

    @property
    def addresses(self) -> list[str]:
        return [f"{s.host}:{s.port}" for s in self.servers]

    @property
    def ports(self) -> list[int]:
        return [s.port for s in self.servers]

    def up(self) -> TiDB:
        """A server that is running (for admin queries while another restarts)."""
        for server in self.servers:
            if server.is_running():
                return server
        raise ClusterError("no tidb-server of the cluster is running")

    @property
    def port(self) -> int:
        return self.up().port

    @property
    def host(self) -> str:
        return self.up().host

    def query(self, sql: str, args=None) -> list[tuple]:
        return self.up().query(sql, args)

    def admin(self, **kwargs):
        return self.up().admin(**kwargs)

    def connect(self, *args, **kwargs):
        return self.up().connect(*args, **kwargs)

    def create_user(self, name: str, password: str, grants: str = "ALL PRIVILEGES ON *.*") -> None:
        self.up().create_user(name, password, grants)

    def create_database(self, name: str) -> None:
        self.up().create_database(name)

    def error_log_text(self) -> str:
        return "\n".join(f"--- {s.basedir.name} ---\n{s.error_log_text()}" for s in self.servers)

    # -- faults -----------------------------------------------------------------------------

    def restart_server(self, i: int, sig: int = _signal.SIGTERM, down_for: float = 0.0) -> str:
        """Server ``i`` (modulo their number) stopped with ``sig`` and started again, serving
        before this returns: one step of a rolling restart as ``tiup cluster reload`` and TiDB
        Operator do it (SIGTERM: its graceful shutdown), or a crash (SIGKILL)."""
        server = self.servers[i % len(self.servers)]
        server.restart(sig, down_for=down_for)
        return f"{server.basedir.name} {_signal.Signals(sig).name}"

    def move_server(self, i: int, host: str | None = None, sig: int = _signal.SIGTERM, between=None) -> str:
        """Server ``i`` stopped with ``sig`` and started again on a new address (``host``, or the
        next free one): a pod that TiDB Operator deletes and whose replacement gets a new IP.
        ``between()`` runs while it is down. Serving before this returns."""
        server = self.servers[i % len(self.servers)]
        old = server.host
        server.stop(sig)
        server.move_to(host or self.free_host())
        if between is not None:
            between()
        server.start()
        return f"{server.basedir.name} {_signal.Signals(sig).name}: {old} -> {server.host}"

    def add_server(self, host: str | None = None) -> TiDB:
        """A new tidb-server joining the cluster (a scale out), serving before this returns."""
        server = self._server(host=host)
        server.start()
        self.servers.append(server)
        return server

    def remove_server(self, i: int, sig: int = _signal.SIGTERM) -> TiDB:
        """Server ``i`` stopped and gone from the cluster (a scale in)."""
        server = self.servers.pop(i % len(self.servers))
        server.stop(sig)
        return server

    def restart_store(self, down_for: float = 0.0) -> None:
        """The whole database away: the store stops (SIGTERM) and comes back on its port. (A
        store that does not answer gRPC's health check is never used again by the tidb-servers:
        9005 "Region is unavailable" until they restart; the lab's store answers it.)"""
        self.store.stop()
        if down_for:
            time.sleep(down_for)
        self.store.start()
