"""bench.dm_e2e on a cluster as TiDB Operator runs it (bench/dm_discovery.py), without starting
anything: which arguments it refuses, that the proxy's config it writes for ``dns`` and ``pd`` is
one the proxy accepts, and that a long rolling restart on new addresses never runs out of lab
addresses (tests/lab/cluster.py ``free_host``)."""

from __future__ import annotations

import pytest

from bench.dm_discovery import LabDiscovery
from bench.dm_e2e import parse_args
from bench.dm_middles import sidecar_overrides
from proxy.config import load_config
from tests.lab.cluster import LAB_HOSTS, Cluster
from tests.lab.proxy import ProxyProcess


@pytest.mark.parametrize(
    ("argv", "refused"),
    [
        (["--faults", "moving"], "need --cluster"),
        (["--cluster", "--faults", "moving", "--targets", "direct"], "target(s) direct"),
        (["--cluster", "--discovery", "pd", "--targets", "haproxy,proxy"], "target(s) haproxy"),
        (["--cluster", "--faults", "moving", "--targets", "proxy"], "--discovery dns or pd"),
    ],
)
def test_refused(argv, refused, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert refused in capsys.readouterr().err


def test_moving_through_the_proxy_and_tiproxy():
    args = parse_args(["--cluster", "--faults", "moving", "--discovery", "pd", "--targets", "tiproxy,proxy", "--restarts", "12"])
    assert (args.faults, args.discovery, args.restarts) == ("moving", "pd", 12)


@pytest.mark.parametrize("mode", ["dns", "pd"])
def test_the_proxy_accepts_the_backend(tmp_path, mode):
    cluster = Cluster(tmp_path / "cluster", servers=3, hosts=True)
    lab = LabDiscovery(mode, cluster, tmp_path)
    overrides = sidecar_overrides(cluster.servers, "dm", "secret", discovery=lab.backend())
    backend = load_config(ProxyProcess(tmp_path / "proxy", [], **overrides).config_path).backend
    assert backend.discovery == mode
    if mode == "dns":
        assert [str(a) for a in backend.addresses] == [f"basic-tidb-peer.lab.test:{cluster.shared_port}"]
        assert backend.status_port == cluster.shared_status_port
    else:
        assert not backend.addresses


def test_a_long_rolling_restart_on_new_addresses(tmp_path):
    cluster = Cluster(tmp_path / "cluster", servers=3, hosts=True)
    given = [s.host for s in cluster.servers]
    for n in range(3 * len(LAB_HOSTS)):
        server = cluster.servers[n % 3]
        host = cluster.free_host()
        assert host != server.host and host not in {s.host for s in cluster.servers}
        server.move_to(host)
        given.append(host)
    assert given[: len(LAB_HOSTS)] == list(LAB_HOSTS)  # each lab address once, then
    assert given[len(LAB_HOSTS)] == LAB_HOSTS[0]  # the one given up longest ago
