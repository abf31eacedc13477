"""Protocol constants: commands, capability sets, status bits, error codes the proxy emits.

The capability and status enums come from mysql-mimic; the command codes are its too, as
plain ints (``Commands``); the sets here say what the proxy itself understands.
"""

from __future__ import annotations

from mysql_mimic.types import Capabilities, ServerStatus
from mysql_mimic.types import Commands as CommandCodes

__all__ = ["Capabilities", "Commands", "CommandCodes", "ServerStatus", "Err", "PROXY_CAPABILITIES", "MAX_FRAME"]


class Commands:
    """mysql-mimic's command codes (``CommandCodes``, an IntEnum) as plain ints: the relay
    compares a command's first byte with several per statement, and in CPython 3.11 each read
    of an Enum member goes through EnumType's ``__getattr__`` hook (~15x a plain attribute),
    each comparison with one through int's subclass path."""

    COM_SLEEP = 0x00
    COM_QUIT = 0x01
    COM_INIT_DB = 0x02
    COM_QUERY = 0x03
    COM_FIELD_LIST = 0x04
    COM_CREATE_DB = 0x05
    COM_DROP_DB = 0x06
    COM_REFRESH = 0x07
    COM_SHUTDOWN = 0x08
    COM_STATISTICS = 0x09
    COM_PROCESS_INFO = 0x0A
    COM_CONNECT = 0x0B
    COM_PROCESS_KILL = 0x0C
    COM_DEBUG = 0x0D
    COM_PING = 0x0E
    COM_TIME = 0x0F
    COM_DELAYED_INSERT = 0x10
    COM_CHANGE_USER = 0x11
    COM_BINLOG_DUMP = 0x12
    COM_TABLE_DUMP = 0x13
    COM_CONNECT_OUT = 0x14
    COM_REGISTER_SLAVE = 0x15
    COM_STMT_PREPARE = 0x16
    COM_STMT_EXECUTE = 0x17
    COM_STMT_SEND_LONG_DATA = 0x18
    COM_STMT_CLOSE = 0x19
    COM_STMT_RESET = 0x1A
    COM_SET_OPTION = 0x1B
    COM_STMT_FETCH = 0x1C
    COM_DAEMON = 0x1D
    COM_BINLOG_DUMP_GTID = 0x1E
    COM_RESET_CONNECTION = 0x1F


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
