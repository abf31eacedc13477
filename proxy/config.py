"""Configuration: one TOML file per target database, loaded into attrs classes.

Unknown keys and bad values are errors that name the path of the offending key
(``$.recovery.buffer_window: ...``), so a typo never silently falls back to a default.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import attrs
import cattrs
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError, IterableValidationNote

__all__ = [
    "Address",
    "ConfigError",
    "Config",
    "load_config",
    "parse_config",
    "parse_duration",
    "parse_size",
]


class ConfigError(Exception):
    """A configuration problem, with every bad key listed by path."""


class Size(int):
    """A byte count; the config accepts 1048576, "1MiB", "64 MiB", "512KiB", "1GiB"."""


class Duration(float):
    """Seconds; the config accepts 2, 0.5, "500ms", "30s", "2m"."""


_SIZE_UNITS = {"": 1, "b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "kb": 1000, "mb": 1000**2, "gb": 1000**3}
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_size(value: Any) -> Size:
    if isinstance(value, bool):
        raise ValueError(f"expected a size like 65536 or '64MiB', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size must not be negative, got {value}")
        return Size(value)
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", value)
        if m and m.group(2).lower() in _SIZE_UNITS:
            return Size(int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]))
    raise ValueError(f"expected a size like 65536 or '64MiB' (units B, KiB, MiB, GiB, KB, MB, GB), got {value!r}")


def parse_duration(value: Any) -> Duration:
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like 30 or '500ms', got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"duration must not be negative, got {value}")
        return Duration(value)
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*", value)
        if m and m.group(2).lower() in _DURATION_UNITS:
            return Duration(float(m.group(1)) * _DURATION_UNITS[m.group(2).lower()])
    raise ValueError(f"expected a duration like 30 (seconds), '500ms', '30s' or '2m', got {value!r}")


@attrs.frozen
class Address:
    host: str
    port: int

    @classmethod
    def parse(cls, value: Any) -> Address:
        if not isinstance(value, str):
            raise ValueError(f"expected 'host:port', got {value!r}")
        host, sep, port = value.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"expected 'host:port' with a port from 1 to 65535, got {value!r}")
        return cls(host, int(port))

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@attrs.frozen
class ListenTLSConfig:
    cert: str  # the proxy's certificate (chain), PEM
    key: str  # its private key, PEM
    # true: a client that logs in without TLS is refused (ERR 3159, as the server's
    # require_secure_transport).
    require: bool = False


@attrs.frozen
class ListenConfig:
    address: Address = Address("127.0.0.1", 4000)
    # A client that has not finished authenticating by then is disconnected.
    handshake_timeout: Duration = Duration(10)
    # Logged-in sessions beyond this are refused with ERR 1040 (too many connections).
    max_connections: int = attrs.field(default=4096, validator=attrs.validators.gt(0))
    # Connections that have not logged in yet, in total and per client host: beyond, refused at
    # once with ERR 1040 (a flood of silent sockets cannot lock logged-in users out).
    max_pending_logins: int = attrs.field(default=256, validator=attrs.validators.gt(0))
    max_pending_per_host: int = attrs.field(default=64, validator=attrs.validators.gt(0))
    # A host with this many failed logins within failed_login_window is refused (ERR 1129) until
    # the oldest of them is that old.
    failed_login_limit: int = attrs.field(default=20, validator=attrs.validators.gt(0))
    failed_login_window: Duration = Duration(60)
    # Version string shown to clients before the backend's own is known.
    server_version: str = "8.0.11-replay-proxy"
    # On SIGTERM: stop accepting, close each session once it is between transactions, and
    # close whatever is left after this long.
    drain_timeout: Duration = Duration(10)
    # On an upgrade (SIGUSR2, replay-proxy upgrade): how long the old process waits for each
    # session to reach a command boundary (in a transaction or not) and move to the new process
    # with its connections; the sessions left then are drained as on SIGTERM.
    handover_timeout: Duration = Duration(30)
    # With workers > 1: the supervisor keeps a copy of every client socket and of each session's
    # state, so that when a worker dies (SIGKILL, OOM, a bug) the one started in its place takes
    # its clients over instead of dropping them. Sessions nobody takes over within
    # takeover_timeout are closed.
    takeover: bool = True
    takeover_timeout: Duration = Duration(60)
    # [listen.tls]: TLS for clients; without it an SSLRequest is refused.
    tls: ListenTLSConfig | None = None
    # Processes sharing the listen port (SO_REUSEPORT), one trio loop each: 1 for a sidecar;
    # up to the cores the proxy may use when it is the bottleneck (see README "Sizing workers").
    workers: int = attrs.field(default=1, validator=attrs.validators.and_(attrs.validators.ge(1), attrs.validators.le(64)))
    # Close a session idle (no command) this long; 0: never (replicators keep idle pinned
    # connections for hours, and the proxy keeps their backend connections alive).
    idle_timeout: Duration = Duration(0)
    # The fast lane: uvloop runs trio as its guest and carries each plain command and its answer
    # from its callbacks (proxy.hostloop). false: trio alone, every packet a task's wake (what
    # a worker whose supervisor keeps its clients always does: its record follows every step).
    fast_lane: bool = True


@attrs.frozen
class BackendTLSConfig:
    # go-sql-driver/mysql's modes: "off"; "preferred" (TLS when the server offers it, not
    # verified); "required" (TLS or fail, not verified); "verify-ca" (the chain must lead to
    # ca, or to the system CAs without ca); "verify-identity" (and name the host).
    mode: Literal["off", "preferred", "required", "verify-ca", "verify-identity"] = "off"
    ca: str | None = None  # PEM file of the CA(s) to trust
    cert: str | None = None  # client certificate (PEM), for servers that ask for one
    key: str | None = None  # its private key (PEM; omit when cert holds both)
    server_name: str | None = None  # SNI and the name verify-identity checks; default: the address's host

    def __attrs_post_init__(self) -> None:
        # The shape only: whether the files load is proxy.tls.check_files's (cli, at --check,
        # start-up and reload), so building a config reads no file.
        if self.mode == "off":
            given = [name for name in ("ca", "cert", "key", "server_name") if getattr(self, name) is not None]
            if given:
                raise ValueError(f"{', '.join(given)} given but mode is 'off' (set mode to use TLS)")
            return
        if self.key is not None and self.cert is None:
            raise ValueError("key given without cert")
        if self.ca is not None and self.mode in ("preferred", "required"):
            raise ValueError(f"ca is only used by mode 'verify-ca' and 'verify-identity', not {self.mode!r}")


@attrs.frozen
class DnsConfig:
    # Where the names are looked up: "host" or "host:port" of DNS servers; empty: the ones of
    # /etc/resolv.conf (its search domains and ndots apply either way, as for any program in
    # the pod).
    nameservers: list[str] = attrs.Factory(list)

    def __attrs_post_init__(self) -> None:
        for entry in self.nameservers:
            nameserver_address(entry)  # raises ValueError with the reason


def nameserver_address(entry: str) -> tuple[str, int]:
    """("host", port) of a ``backend.dns.nameservers`` entry: an IP address, with ":port"
    (IPv6 in brackets for that: "[::1]:53"); port 53 when none is given."""
    import ipaddress

    text = entry.strip()
    host, port = text, 53
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            if not rest.startswith(":") or not rest[1:].isdigit():
                raise ValueError(f"nameserver {entry!r}: expected an IP address, '[IPv6]:port' or 'IPv4:port'")
            port = int(rest[1:])
    elif text.count(":") == 1:
        host, _, p = text.partition(":")
        if not p.isdigit():
            raise ValueError(f"nameserver {entry!r}: expected an IP address, '[IPv6]:port' or 'IPv4:port'")
        port = int(p)
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"nameserver {entry!r}: expected an IP address (a name would need a DNS server of its own)") from None
    if not 0 < port < 65536:
        raise ValueError(f"nameserver {entry!r}: port {port} is outside 1-65535")
    return host, port


@attrs.frozen
class PdConfig:
    # PD's client URLs ("http://pd:2379", "https://basic-pd.tidb-cluster.svc:2379", or
    # "host:port": https when ca is set), tried in turn from the last that answered.
    endpoints: list[str] = attrs.Factory(list)
    # PD's TLS (TiProxy's security.cluster-tls): the CA of the cluster's certificates, and the
    # client certificate and key PD asks for.
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None  # the name PD's certificate is checked against; default: the endpoint's host

    def __attrs_post_init__(self) -> None:
        for url in self.endpoints:
            pd_url(url, self.ca is not None)
        if self.key is not None and self.cert is None:
            raise ValueError("key given without cert")

    def urls(self) -> list[str]:
        return [pd_url(u, self.ca is not None) for u in self.endpoints]


def pd_url(endpoint: str, tls: bool) -> str:
    """The base URL of a PD endpoint: as given when it has a scheme, else https with a CA
    (``backend.pd.ca``) and http without."""
    text = endpoint.strip().rstrip("/")
    if "://" in text:
        scheme, _, rest = text.partition("://")
        if scheme not in ("http", "https") or not rest or "/" in rest:
            raise ValueError(f"PD endpoint {endpoint!r}: expected 'host:port', 'http://host:port' or 'https://host:port'")
        Address.parse(rest)
        return text
    Address.parse(text)
    return f"{'https' if tls else 'http'}://{text}"


@attrs.frozen
class BackendConfig:
    # static: the servers (a name is resolved at each connect). dns: names (host:port) whose A
    # and AAAA records are the servers, each at the name's port. pd: none (PD names them).
    addresses: list[Address] = attrs.Factory(list)
    # Where the servers come from: "static" (addresses as written), "dns" (each name of
    # addresses looked up again every discovery_interval: TiDB Operator's headless Service),
    # "pd" (the tidb-servers registered in PD, as TiProxy finds them). Servers that appear
    # are checked and get new sessions; servers that disappear are drained like a draining
    # one (sessions move between transactions). A failed lookup keeps the last set found.
    discovery: Literal["static", "dns", "pd"] = "static"
    discovery_interval: Duration = Duration(5)
    # Which address a new backend connection (a login, a move, a reconnect) goes to: "order"
    # (the last that worked, then the next: failover), "connections" (the one with the fewest
    # of this proxy's connections, and sessions move between transactions to a server that
    # joins or comes back), "auto": order with static, connections with dns and pd.
    balance: Literal["auto", "order", "connections"] = "auto"
    dns: DnsConfig | None = None
    pd: PdConfig | None = None
    connect_timeout: Duration = Duration(5)
    # Timeout for the proxy's own short exchanges with the backend (login, session restore, replay).
    io_timeout: Duration = Duration(30)
    # [backend.tls]: TLS to the server (TiDB Cloud requires it).
    tls: BackendTLSConfig = BackendTLSConfig()
    # Every address is checked this often (SQL login + ping, and the status URL if known);
    # 0 turns the checks off. Draining or down addresses are avoided; idle sessions on a
    # draining one move elsewhere between transactions.
    health_interval: Duration = Duration(2)
    # An address no health check got any answer from for this long (a partition, a hung
    # server: no SYN-ACK, no greeting, no answer to COM_PING) has its sessions' connections cut
    # now, and recovery takes over, instead of each waiting on a dead socket until TCP gives up
    # (30 s, or never where a hung server's kernel still ACKs). A long statement on a server
    # that answers its checks is never cut. 0: off.
    dead_after: Duration = Duration(10)
    # TiDB's status port (10080) on each address's host: GET status_path answers 500 from the
    # moment TiDB starts a graceful shutdown. Or give a URL per address in status_urls.
    status_port: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.and_(attrs.validators.gt(0), attrs.validators.lt(65536)))
    )
    status_path: str = "/status"
    status_urls: dict[str, str] = attrs.Factory(dict)
    # The scheme of the URLs built from status_port (and, with discovery = "pd", from the
    # status port each server registered): "https" for a cluster with TLS between its
    # components (checked with [backend.tls]).
    status_scheme: Literal["http", "https"] = "http"

    @property
    def balancing(self) -> bool:
        """New connections go to the address with the fewest of this proxy's connections."""
        return self.balance == "connections" or (self.balance == "auto" and self.discovery != "static")


@attrs.frozen
class UserConfig:
    name: str
    password: str | None = attrs.field(default=None, repr=False)
    password_env: str | None = None
    # Credentials for the backend login; by default the client's own name and password.
    backend_user: str | None = None
    backend_password: str | None = attrs.field(default=None, repr=False)
    backend_password_env: str | None = None

    # ``at``: the path of this entry, ``$.users[0]``; parse_config checks every user with it, so
    # later calls (the same environment) cannot fail.
    def resolved_password(self, at: str = "$.users[*]") -> str:
        return _secret(self.password, self.password_env, at, "password", self.name)

    def resolved_backend_user(self) -> str:
        return self.backend_user if self.backend_user is not None else self.name

    def resolved_backend_password(self, at: str = "$.users[*]") -> str:
        if self.backend_password is None and self.backend_password_env is None:
            return self.resolved_password(at)
        return _secret(self.backend_password, self.backend_password_env, at, "backend_password", self.name)


def _secret(value: str | None, env: str | None, at: str, key: str, user: str) -> str:
    if value is not None and env is not None:
        raise ConfigError(f"{at}: user {user!r} has both {key} and {key}_env: keep one of them")
    if env is not None:
        if env not in os.environ:
            raise ConfigError(f"{at}.{key}_env: environment variable {env} is not set (user {user!r}): "
                              f"export it where the proxy starts, or set {key} instead")  # fmt: skip
        return os.environ[env]
    return value if value is not None else ""


@attrs.frozen
class RecoveryConfig:
    enabled: bool = True
    # How long a client's request is held while the backend is unreachable.
    buffer_window: Duration = Duration(30)
    backoff_initial: Duration = Duration(0.05)
    backoff_max: Duration = Duration(1)
    # Above this many bytes (statements plus results' bookkeeping) the open transaction is not replayable.
    journal_max_bytes: Size = Size(4 * 1024 * 1024)
    journal_max_statements: int = 10000
    # "none": replay only what provably did not commit.
    # "safe-mode": also replay an in-flight COMMIT / autocommit write when every statement is idempotent.
    idempotent: Literal["none", "safe-mode"] = "none"
    # After reconnecting to the same server instance, KILL the old connection id so its locks go away.
    kill_old_session: bool = True
    # Before each COMMIT, write a marker row in the same transaction (one row per session,
    # upserted), so a COMMIT whose answer was lost can be resolved exactly after reconnecting:
    # committed → the client gets OK; not committed → the transaction is replayed. Costs one
    # statement per transaction; the backend user needs CREATE and write access to marker_table.
    commit_marker: bool = False
    marker_table: str = attrs.field(
        default="replay_proxy.commit_markers",
        validator=attrs.validators.matches_re(r"[A-Za-z0-9_$]+(\.[A-Za-z0-9_$]+)?"),
    )
    # TiDB: a DDL whose answer was lost is looked up in TiDB's DDL job list (as DM does): done →
    # OK, failed → its error, never queued → sent again; a job still running is waited for this long.
    ddl_jobs: bool = True
    ddl_job_wait: Duration = Duration(600)


@attrs.frozen
class LimitsConfig:
    max_allowed_packet: Size = Size(64 * 1024 * 1024)
    # "reject": a command over the limit gets ERR 1153. "split": a multi-row INSERT/REPLACE over
    # the limit is cut into statements under it and run atomically; anything else gets 1153.
    oversized: Literal["reject", "split"] = "reject"
    # In split mode, statements up to this size are read whole to be split; bigger ones get 1153.
    split_max_statement: Size = Size(1024 * 1024 * 1024)
    # Commands bigger than this are spooled to a temporary file instead of memory while being checked;
    # a session's long data (COM_STMT_SEND_LONG_DATA, kept to be sent again after a reconnect)
    # stays in memory up to this much, the rest goes to the session's spool file.
    spool_threshold: Size = Size(4 * 1024 * 1024)
    # The most long data one session may have kept at once (memory and spool file): past it, the
    # execute that would use it gets ERR 1153 (the proxy cannot promise to send it again).
    long_data_spool: Size = Size(256 * 1024 * 1024)


@attrs.frozen
class AdminConfig:
    # Default: 127.0.0.1 and the listen port + 10000 (listen 4000 -> admin 14000), so two
    # targets on one host never share it.
    address: Address | None = None
    enabled: bool = True
    # Required when the address is not loopback: clients send "Authorization: Bearer <token>".
    token: str | None = attrs.field(default=None, repr=False)
    token_env: str | None = None

    def resolved_token(self) -> str | None:
        if self.token_env:
            value = os.environ.get(self.token_env)
            if not value:
                raise ConfigError(f"$.admin.token_env: environment variable {self.token_env} is not set: "
                                  "export it where the proxy starts, or set admin.token instead")  # fmt: skip
            return value
        return self.token


@attrs.frozen
class LogConfig:
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["text", "json"] = "text"


@attrs.frozen
class PluginsConfig:
    chain: list[str] = attrs.Factory(list)
    # Option tables, one per plugin name: [plugins.<name>]. Checked by each plugin's own options class.
    options: dict[str, dict[str, Any]] = attrs.Factory(dict)


@attrs.frozen
class Config:
    backend: BackendConfig
    users: list[UserConfig] = attrs.field(validator=attrs.validators.min_len(1))
    # Target name used in logs and metrics; defaults to the config file's stem.
    name: str = "default"
    listen: ListenConfig = ListenConfig()
    recovery: RecoveryConfig = RecoveryConfig()
    limits: LimitsConfig = LimitsConfig()
    admin: AdminConfig = AdminConfig()
    log: LogConfig = LogConfig()
    plugins: PluginsConfig = PluginsConfig()

    def user(self, name: str) -> UserConfig | None:
        for user in self.users:
            if user.name == name:
                return user
        return None

    @property
    def admin_address(self) -> Address:
        """The admin endpoint's address: configured, or derived from the listen port."""
        if self.admin.address is not None:
            return self.admin.address
        port = self.listen.address.port
        return Address("127.0.0.1", port + 10000 if port + 10000 < 65536 else port - 10000)


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True)
    conv.register_structure_hook(Size, lambda v, _: parse_size(v))
    conv.register_structure_hook(Duration, lambda v, _: parse_duration(v))
    conv.register_structure_hook(Address, lambda v, _: Address.parse(v))

    def structure_str(value: Any, _: Any) -> str:
        if not isinstance(value, str):
            raise ValueError(f"expected a string, got {value!r}")
        return value

    def structure_int(value: Any, _: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {value!r}")
        return value

    def structure_bool(value: Any, _: Any) -> bool:
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {value!r}")
        return value

    def is_literal(t: Any) -> bool:
        return getattr(t, "__origin__", None) is Literal

    def structure_literal(value: Any, t: Any) -> Any:
        if value not in t.__args__:
            choices = ", ".join(repr(a) for a in t.__args__)
            raise ValueError(f"expected one of {choices}, got {value!r}")
        return value

    def is_list(t: Any) -> bool:
        return get_origin(t) is list

    def list_hook(t: Any, conv: cattrs.Converter):
        # A factory, so a copied converter (plugin options) structures the items with its own hooks.
        (item_type,) = get_args(t) or (Any,)

        def structure_list(value: Any, _: Any) -> list:
            if not isinstance(value, list):  # cattrs alone would turn "DROP" into ['D', 'R', 'O', 'P']
                raise ValueError(f"expected a list, got {value!r}")
            out, errors = [], []
            for i, item in enumerate(value):
                try:
                    out.append(conv.structure(item, item_type))
                except Exception as exc:
                    exc.add_note(IterableValidationNote(f"Structuring {t} @ index {i}", i, item_type))
                    errors.append(exc)
            if errors:
                raise IterableValidationError(f"While structuring {t}", errors, t)
            return out

        return structure_list

    conv.register_structure_hook_factory(is_list, list_hook)
    conv.register_structure_hook_func(is_literal, structure_literal)
    conv.register_structure_hook(str, structure_str)
    conv.register_structure_hook(int, structure_int)
    conv.register_structure_hook(bool, structure_bool)
    return conv


converter = _make_converter()


def structure_checked(data: Any, cls: type, root: str = "$", conv: cattrs.Converter | None = None) -> Any:
    """Structure ``data`` into ``cls``; raise ConfigError listing each bad key by path."""
    try:
        return (conv or converter).structure(data, cls)
    except (ClassValidationError, ForbiddenExtraKeysError, ValueError, TypeError) as exc:
        raise ConfigError("\n".join(_describe(exc, root))) from None


def _describe(exc: BaseException, path: str) -> list[str]:
    if isinstance(exc, ForbiddenExtraKeysError):
        known = [f.name for f in attrs.fields(exc.cl)] if attrs.has(exc.cl) else []
        hints = []
        for key in sorted(exc.extra_fields):
            close = difflib.get_close_matches(key, known, n=1)
            hints.append(f"{key} (did you mean {close[0]}?)" if close else key)
        return [f"{path}: unknown key(s) {', '.join(hints)}"]
    if isinstance(exc, BaseExceptionGroup):
        out: list[str] = []
        for sub in exc.exceptions:
            out.extend(_describe(sub, path + _path_step(sub)))
        return out
    if isinstance(exc, KeyError):
        return [f"{path}: required key missing: add it"]
    return [f"{path}: {exc}"]


def _path_step(exc: BaseException) -> str:
    """cattrs notes each sub-error with the attribute name or list index it came from."""
    for note in getattr(exc, "__notes__", []):
        if getattr(note, "name", None) is not None:
            return f".{note.name}"
        if getattr(note, "index", None) is not None:
            return f"[{note.index!r}]"
    return ""


def parse_config(data: dict[str, Any], default_name: str = "default", secrets: bool = True) -> Config:
    """``secrets=False``: passwords given by environment variable are not looked up
    (``replay-proxy status`` needs only the admin address and token)."""
    data = dict(data)
    data.setdefault("name", default_name)
    plugins = data.get("plugins")
    if isinstance(plugins, dict):
        # [plugins] holds "chain" plus one table per plugin; fold the tables under "options".
        plugins = dict(plugins)
        options = {k: plugins.pop(k) for k in list(plugins) if k != "chain" and isinstance(plugins[k], dict)}
        plugins["options"] = options
        data["plugins"] = plugins
    config = structure_checked(data, Config)
    names = [u.name for u in config.users]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"$.users: duplicate user name(s) {', '.join(dupes)}: give each [[users]] entry its own name")
    for i, user in enumerate(config.users):  # fail at start-up, not at the first login
        if user.password is None and user.password_env is None:
            raise ConfigError(f'$.users[{i}]: user {user.name!r} has no password: set password ("" for none) or password_env')
        if secrets:
            user.resolved_password(f"$.users[{i}]")
            user.resolved_backend_password(f"$.users[{i}]")
    _check_values(config)
    unknown = sorted(set(config.plugins.options) - set(config.plugins.chain))
    if unknown:
        raise ConfigError(
            f"$.plugins: option table(s) for plugin(s) not in the chain: {', '.join(unknown)}: add them to plugins.chain, or remove the tables"
        )
    return config


_KIB, _GIB = 1024, 1024**3
_LOOPBACK = ("127.", "::1", "localhost")


def _check_values(config: Config) -> None:
    """Values that are each fine alone but impossible here, named by path."""
    problems = []
    packet = config.limits.max_allowed_packet
    if not _KIB <= packet <= _GIB:
        problems.append(f"$.limits.max_allowed_packet: {packet} bytes is outside the server's range, 1KiB to 1GiB: set a size in it")
    problems.extend(_check_discovery(config.backend))
    rec = config.recovery
    if rec.backoff_initial > rec.backoff_max:
        problems.append(
            f"$.recovery.backoff_initial: {rec.backoff_initial:g}s is more than backoff_max ({rec.backoff_max:g}s): lower it or raise backoff_max"
        )
    if config.admin.enabled:
        admin = config.admin_address
        if (admin.host, admin.port) == (config.listen.address.host, config.listen.address.port):
            problems.append(f"$.admin.address: {admin} is also listen.address: give the admin endpoint another port")
        if not admin.host.startswith(_LOOPBACK) and config.admin.token is None and config.admin.token_env is None:
            problems.append(f"$.admin.address: {admin} is not loopback: set admin.token (or token_env) so /status and /metrics need it")
        if config.admin.token_env and config.admin.token_env not in os.environ:
            problems.append(f"$.admin.token_env: environment variable {config.admin.token_env} is not set: "
                            "export it where the proxy starts, or set admin.token instead")  # fmt: skip
    if problems:
        raise ConfigError("\n".join(problems))


def _check_discovery(backend: BackendConfig) -> list[str]:
    """backend.addresses, discovery and its tables agree."""
    mode, problems = backend.discovery, []
    if mode in ("static", "dns") and not backend.addresses:
        what = "the servers" if mode == "static" else "the names (host:port) whose A/AAAA records are the servers"
        problems.append(f"$.backend.addresses: required with discovery = {mode!r}: list {what}")
    if mode == "pd":
        if backend.addresses:
            problems.append("$.backend.addresses: with discovery = 'pd' PD names the servers: remove addresses")
        if backend.pd is None or not backend.pd.endpoints:
            problems.append("$.backend.pd.endpoints: required with discovery = 'pd': PD's client URLs, e.g. [\"http://pd:2379\"]")
    if backend.pd is not None and mode != "pd":
        problems.append(f"$.backend.pd: read only with discovery = 'pd' (it is {mode!r}): remove it, or set discovery")
    if backend.dns is not None and mode != "dns":
        problems.append(f"$.backend.dns: read only with discovery = 'dns' (it is {mode!r}): remove it, or set discovery")
    if mode != "static":
        if backend.status_urls:
            problems.append(f"$.backend.status_urls: name fixed addresses, which discovery = {mode!r} does not have: "
                            "use status_port (and status_scheme)")  # fmt: skip
        if backend.tls.mode == "verify-identity" and backend.tls.server_name is None:
            problems.append(f"$.backend.tls.server_name: required with verify-identity and discovery = {mode!r}: the servers "
                            "found are IP addresses; name the one their certificates carry")  # fmt: skip
        if backend.discovery_interval < 0.1:
            problems.append(f"$.backend.discovery_interval: {backend.discovery_interval:g}s is too short: at least 100ms")
    return problems


def load_config(path: str | os.PathLike[str], secrets: bool = True) -> Config:
    """Read and check a config file. Every message is a sentence that names the file and,
    for a bad key, its path (``$.recovery.buffer_window: ...``)."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read the config file {path}: {exc.strerror or exc}; check the path given to --config") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"the config file {path} is not UTF-8 text (byte {exc.start}: {exc.reason}); save it as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"the config file {path} is not valid TOML ({exc}); fix that line") from None
    try:
        return parse_config(data, default_name=path.stem, secrets=secrets)
    except ConfigError as exc:
        raise ConfigError(f"the config file {path} has errors; fix these keys:\n{exc}") from None
