"""Test lab: throwaway MariaDB servers and the Go (DM-like) client.

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
