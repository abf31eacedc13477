"""Protocol constants: commands, capability sets, status bits, error codes the proxy emits.

Enums come from mysql-mimic; the sets here say what the proxy itself understands.
"""

from __future__ import annotations

from mysql_mimic.types import Capabilities, Commands, ServerStatus

__all__ = ["Capabilities", "Commands", "ServerStatus", "Err", "PROXY_CAPABILITIES", "MAX_FRAME"]

# Largest payload of one frame; a payload of exactly this size is continued by the next frame.
MAX_FRAME = 0xFFFFFF

C = Capabilities

# What the proxy can relay without translating. Not here, on purpose:
# COMPRESS and SSL (not implemented), LOCAL_FILES (LOAD DATA LOCAL is refused),
# OPTIONAL_RESULTSET_METADATA and QUERY_ATTRIBUTES (would change packet layouts the
# proxy parses), ZSTD, MULTI_FACTOR_AUTHENTICATION, and the high "extension" bits.
PROXY_CAPABILITIES = (
    C.CLIENT_LONG_PASSWORD
    | C.CLIENT_FOUND_ROWS
    | C.CLIENT_LONG_FLAG
    | C.CLIENT_CONNECT_WITH_DB
    | C.CLIENT_NO_SCHEMA
    | C.CLIENT_ODBC
    | C.CLIENT_IGNORE_SPACE
    | C.CLIENT_PROTOCOL_41
    | C.CLIENT_INTERACTIVE
    | C.CLIENT_IGNORE_SIGPIPE
    | C.CLIENT_TRANSACTIONS
    | C.CLIENT_SECURE_CONNECTION
    | C.CLIENT_MULTI_STATEMENTS
    | C.CLIENT_MULTI_RESULTS
    | C.CLIENT_PS_MULTI_RESULTS
    | C.CLIENT_PLUGIN_AUTH
    | C.CLIENT_CONNECT_ATTRS
    | C.CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA
    | C.CLIENT_CAN_HANDLE_EXPIRED_PASSWORDS
    | C.CLIENT_SESSION_TRACK
    | C.CLIENT_DEPRECATE_EOF
)

# The proxy needs these from every backend: 4.1 packets, status words, plugin auth.
REQUIRED_BACKEND_CAPABILITIES = C.CLIENT_PROTOCOL_41 | C.CLIENT_TRANSACTIONS | C.CLIENT_SECURE_CONNECTION


class Err:
    """MySQL error codes the proxy sends itself, with their SQLSTATE."""

    CON_COUNT = (1040, "08004")  # too many connections
    HANDSHAKE = (1043, "08S01")  # bad handshake
    ACCESS_DENIED = (1045, "28000")
    UNKNOWN_COM = (1047, "08S01")
    SERVER_SHUTDOWN = (1053, "08S01")
    NET_PACKET_TOO_LARGE = (1153, "08S01")
    PACKETS_OUT_OF_ORDER = (1156, "08S01")
    NOT_ALLOWED_COMMAND = (1148, "42000")  # LOAD DATA LOCAL
    LOCK_DEADLOCK = (1213, "40001")  # "transaction rolled back; retry" — DM retries the batch
    QUERY_INTERRUPTED = (1317, "70100")
    UNKNOWN_ERROR = (1105, "HY000")
    NOT_SUPPORTED_YET = (1235, "42000")
    TABLEACCESS_DENIED = (1142, "42000")
    SPECIFIC_ACCESS_DENIED = (1227, "42000")
    # Server-range codes only: libmariadb clients (mariadb CLI, mysqlclient) refuse client-range
    # codes (2003, 2013) in an ERR packet as "2027 Malformed packet" and never show the message.
    BACKEND_UNAVAILABLE = (1105, "HY000")  # can't connect to the backend (DM does not retry it)
    CONNECTION_LOST = (1158, "08S01")  # lost the backend mid-command, outcome unknown: session ends
    CANCELLED_DDL = (8214, "HY000")  # TiDB's "Cancelled DDL job": a DDL in doubt whose job failed
