"""Protocol constants: commands, capability sets, status bits, error codes the proxy emits.

The capability and status enums come from mysql-mimic; the command codes are its too, as
plain ints (``Commands``); the sets here say what the proxy itself understands.
"""

from __future__ import annotations

from typing import Final

from mysql_mimic.types import Capabilities, ServerStatus
from mysql_mimic.types import Commands as CommandCodes

__all__ = ["Capabilities", "Commands", "CommandCodes", "ServerStatus", "Err", "PROXY_CAPABILITIES", "MAX_FRAME"]


class Commands:
    """mysql-mimic's command codes (``CommandCodes``, an IntEnum) as plain ints: the relay
    compares a command's first byte with several per statement, and in CPython 3.11 each read
    of an Enum member goes through EnumType's ``__getattr__`` hook (~15x a plain attribute),
    each comparison with one through int's subclass path. Final: compiled (mypyc), a
    comparison with one is a comparison with a constant."""

    COM_SLEEP: Final = 0x00
    COM_QUIT: Final = 0x01
    COM_INIT_DB: Final = 0x02
    COM_QUERY: Final = 0x03
    COM_FIELD_LIST: Final = 0x04
    COM_CREATE_DB: Final = 0x05
    COM_DROP_DB: Final = 0x06
    COM_REFRESH: Final = 0x07
    COM_SHUTDOWN: Final = 0x08
    COM_STATISTICS: Final = 0x09
    COM_PROCESS_INFO: Final = 0x0A
    COM_CONNECT: Final = 0x0B
    COM_PROCESS_KILL: Final = 0x0C
    COM_DEBUG: Final = 0x0D
    COM_PING: Final = 0x0E
    COM_TIME: Final = 0x0F
    COM_DELAYED_INSERT: Final = 0x10
    COM_CHANGE_USER: Final = 0x11
    COM_BINLOG_DUMP: Final = 0x12
    COM_TABLE_DUMP: Final = 0x13
    COM_CONNECT_OUT: Final = 0x14
    COM_REGISTER_SLAVE: Final = 0x15
    COM_STMT_PREPARE: Final = 0x16
    COM_STMT_EXECUTE: Final = 0x17
    COM_STMT_SEND_LONG_DATA: Final = 0x18
    COM_STMT_CLOSE: Final = 0x19
    COM_STMT_RESET: Final = 0x1A
    COM_SET_OPTION: Final = 0x1B
    COM_STMT_FETCH: Final = 0x1C
    COM_DAEMON: Final = 0x1D
    COM_BINLOG_DUMP_GTID: Final = 0x1E
    COM_RESET_CONNECTION: Final = 0x1F


# Largest payload of one frame; a payload of exactly this size is continued by the next frame.
MAX_FRAME: Final = 0xFFFFFF

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

    CON_COUNT: Final = (1040, "08004")  # too many connections
    HANDSHAKE: Final = (1043, "08S01")  # bad handshake
    ACCESS_DENIED: Final = (1045, "28000")
    UNKNOWN_COM: Final = (1047, "08S01")
    SERVER_SHUTDOWN: Final = (1053, "08S01")
    NET_PACKET_TOO_LARGE: Final = (1153, "08S01")
    PACKETS_OUT_OF_ORDER: Final = (1156, "08S01")
    NOT_ALLOWED_COMMAND: Final = (1148, "42000")  # LOAD DATA LOCAL
    LOCK_DEADLOCK: Final = (1213, "40001")  # "transaction rolled back; retry" — DM retries the batch
    QUERY_INTERRUPTED: Final = (1317, "70100")
    UNKNOWN_ERROR: Final = (1105, "HY000")
    NOT_SUPPORTED_YET: Final = (1235, "42000")
    TABLEACCESS_DENIED: Final = (1142, "42000")
    SPECIFIC_ACCESS_DENIED: Final = (1227, "42000")
    # Server-range codes only: libmariadb clients (mariadb CLI, mysqlclient) refuse client-range
    # codes (2003, 2013) in an ERR packet as "2027 Malformed packet" and never show the message.
    BACKEND_UNAVAILABLE: Final = (1105, "HY000")  # can't connect to the backend (DM does not retry it)
    CONNECTION_LOST: Final = (1158, "08S01")  # lost the backend mid-command, outcome unknown: session ends
    CANCELLED_DDL: Final = (8214, "HY000")  # TiDB's "Cancelled DDL job": a DDL in doubt whose job failed
