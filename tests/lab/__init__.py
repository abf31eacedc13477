"""The lab: the real processes the integration, recovery and chaos suites run, each in a folder
of its own on free ports of 127.0.0.1 (the component suites' in-memory stand-in is the rig,
tests/component/rig.py). The servers (MariaDB, tidb-server, a TiDB cluster's PD and store,
TiProxy) share one lifecycle, tests/lab/server.py; beside them the proxy (proxy.py), the fault
shim (faultshim.py), DM (dm.py) and the Go (DM-like) client (goclient.py).

Plain synchronous helpers; trio tests call the blocking parts through
``trio.to_thread.run_sync``.
"""

from tests.lab.goclient import (
    GoClientError,
    build_goclient,
    go_unavailable_reason,
    goclient_command,
    parse_goclient_output,
    run_goclient,
    run_goclient_async,
)
from tests.lab.mariadb import (
    MariaDB,
    MariaDBError,
    free_port,
    mariadb_unavailable_reason,
)

__all__ = [
    "GoClientError",
    "MariaDB",
    "MariaDBError",
    "build_goclient",
    "free_port",
    "go_unavailable_reason",
    "goclient_command",
    "mariadb_unavailable_reason",
    "parse_goclient_output",
    "run_goclient",
    "run_goclient_async",
]
