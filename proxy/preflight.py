"""``replay-proxy check --config F``: a preflight that logs in.

``--check`` reads the file; ``check`` also logs in to every backend address as every configured
user, through the proxy's own connect and login code (``proxy.backend.connect_backend``: the
same TLS, the same authentication, the same questions the proxy asks at run time), and reports
one line for each thing that would bite later:

- the server's version and flavor (MariaDB, TiDB: how the proxy reads its SQL);
- TLS, as configured, and what the connection got;
- ``max_allowed_packet`` against ``limits.max_allowed_packet`` and DM's full-load statements;
- ``sql_mode`` (what changes how the proxy lexes statements);
- ``wait_timeout`` against the way the proxy keeps idle sessions;
- the privileges the commit-marker table needs, when ``recovery.commit_marker`` is on, read
  from ``SHOW GRANTS`` (nothing is created or written);
- the status port's answer, when one is configured (200 up, 500 draining).

Every line is ``ok``, ``warn`` (works, but read it) or ``PROBLEM`` (will bite: the line says
what to do); the exit status is 1 when any line is a PROBLEM, else 0. No password is printed:
the login errors are the server's, and ``SHOW GRANTS`` lines are read for privilege names only.
"""

from __future__ import annotations

import re
import sys
import time
from typing import TextIO

import attrs
import trio

from proxy.backend import Backend, BackendError, Login, connect_backend, open_backend_socket
from proxy.config import Address, Config
from proxy.grants import grants_roles, missing_marker_privileges
from proxy.health import StatusProbe, status_url
from proxy.netio import PeerClosed
from proxy.protocol.constants import Capabilities
from proxy.protocol.framing import encode_packet
from proxy.protocol.packets import ProtocolError
from proxy.sqltext.dialect import Dialect
from proxy.tls import backend_tls, describe

__all__ = ["Line", "OK", "WARN", "PROBLEM", "preflight", "report", "run", "missing_marker_privileges"]

OK, WARN, PROBLEM = "ok", "warn", "PROBLEM"

# DM's full load (Lightning's TiDB backend) sends REPLACE statements of about 96 KiB; the driver
# refuses a statement over the server's max_allowed_packet, which DM asks for (through the proxy,
# the effective limit). Below this, the full load fails.
DM_FULL_LOAD_STATEMENT = 96 * 1024
# DM flushes its checkpoints every 30 s on a connection of its own, and its DML workers sit
# idle between bursts for as long as the source is quiet.
# A full-load batch is cut once it passes DM_FULL_LOAD_STATEMENT: a statement is that plus a row.
_DM_COMFORT = 1 << 20
_WAIT_TIMEOUT_PROBLEM = 60.0
_WAIT_TIMEOUT_WARN = 3600.0
_COLLATION = 45  # utf8mb4_general_ci, as the health check logs in


@attrs.frozen
class Line:
    level: str  # OK, WARN or PROBLEM
    where: str  # a backend address, or "config"
    topic: str
    text: str  # the fact, then (WARN, PROBLEM) what to do

    def __str__(self) -> str:
        return f"{self.level:<8} {self.where:<22} {self.topic}: {self.text}"


def _size(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes" if n < 1024 else f"{n / 1024:.1f} KiB"


def _seconds(s: float) -> str:
    return f"{s:g} s"


# ------------------------------------------------------------------------------ the checks


async def preflight(config: Config, *, opener=open_backend_socket) -> list[Line]:
    """Every line of the check, per backend address in the config's order."""
    lines = _config_lines(config)
    addresses, ports = list(config.backend.addresses), {}
    if config.backend.discovery != "static":
        found, line = await _discover(config)
        lines.append(line)
        addresses = list(found)
        ports = {a: f.status_port for a, f in found.items()}
    probe: StatusProbe | None = None
    try:
        for address in addresses:
            url = status_url(config.backend, address, ports.get(address))
            if url is not None and probe is None:
                probe = StatusProbe(config.backend.tls)
            lines += await _check_address(config, address, url, probe, opener)
    finally:
        if probe is not None:
            await probe.aclose()
    return lines


async def _discover(config: Config) -> tuple[dict, Line]:
    """One lookup of ``backend.discovery`` (dns, pd): the servers it finds are the ones checked."""
    from proxy.discovery import DiscoveryError, make_source

    mode = config.backend.discovery
    source = None
    try:
        source = make_source(config.backend)
        found = await source.lookup()
    except (DiscoveryError, OSError, ValueError) as exc:
        return {}, Line(
            PROBLEM, "discovery", mode, f"found no server: {exc}; check backend.{'addresses and backend.dns' if mode == 'dns' else 'pd'}"
        )
    finally:
        if source is not None:
            await source.aclose()
    text = f"{source.describe()}: found {len(found.servers)}: {', '.join(str(a) for a in found.servers)}"
    if found.problems:
        return found.servers, Line(WARN, "discovery", mode, text + "; but " + "; ".join(found.problems))
    return found.servers, Line(OK, "discovery", mode, text)


def _config_lines(config: Config) -> list[Line]:
    rec = config.recovery
    if rec.commit_marker and not rec.enabled:
        return [Line(WARN, "config", "commit markers", "recovery.commit_marker = true does nothing while recovery.enabled = false: "
                     "set one of them to what you mean")]  # fmt: skip
    if rec.commit_marker:
        text = (
            f"on (recovery.commit_marker): every user needs CREATE on its database and SELECT, INSERT, UPDATE, DELETE on {rec.marker_table}"
        )
    else:
        text = (
            "off (recovery.commit_marker = false): an in-doubt COMMIT is replayed only when its transaction wrote nothing or "
            "safe mode (recovery.idempotent) proves it idempotent, else the client gets 1158"
        )
    return [Line(OK, "config", "commit markers", text)]


def _logins(config: Config) -> list[tuple[str, Login]]:
    """(the [[users]] entry it stands for, the backend login) once per distinct backend login."""
    tls = backend_tls(config.backend.tls)
    seen: dict[tuple[str, str], str] = {}
    out = []
    for i, user in enumerate(config.users):
        name, password = user.resolved_backend_user(), user.resolved_backend_password(f"$.users[{i}]")
        if (name, password) in seen:
            continue
        seen[(name, password)] = user.name
        label = f"users[{i}] {user.name!r}" + (f" (backend_user {name!r})" if name != user.name else "")
        out.append((label, Login(name, password, None, _COLLATION, 0, tls=tls)))
    return out


async def _check_address(config: Config, address: Address, url: str | None, probe: StatusProbe | None, opener) -> list[Line]:
    where = str(address)
    lines: list[Line] = []
    backend_cfg = config.backend
    flavor: str | None = None
    for label, login in _logins(config):
        started = time.monotonic()
        try:
            backend = await connect_backend(
                address, login, connect_timeout=backend_cfg.connect_timeout, io_timeout=backend_cfg.io_timeout, opener=opener
            )
        except BackendError as exc:
            lines.append(Line(PROBLEM, where, "login", f"{label}: {exc}: {_login_advice(exc, config)}"))
            continue
        took = (time.monotonic() - started) * 1000
        try:
            with trio.fail_after(backend_cfg.io_timeout):
                lines.append(Line(OK, where, "login", f"{label} logged in ({took:.0f} ms)"))
                if flavor is None:  # the server's facts once, from the first login that works
                    flavor = Dialect.from_server_version(backend.handshake.server_version).flavor
                    lines += await _server_lines(config, backend, where)
                if config.recovery.commit_marker and config.recovery.enabled:
                    try:
                        lines.append(await _marker_line(config, backend, where, label, login, flavor))
                    except BackendError as exc:
                        if exc.err is None:
                            raise
                        lines.append(Line(WARN, where, "commit markers", f"{label}: cannot read its grants ({exc}): check by hand that "
                                          f"it has CREATE on the database and SELECT, INSERT, UPDATE, DELETE on {config.recovery.marker_table}"))  # fmt: skip
        except BackendError as exc:
            what = "a question of the check was refused" if exc.err is not None else "the connection failed after the login"
            lines.append(Line(PROBLEM, where, "server", f"{label}: {what}: {exc}: check the server's log"))
        except (PeerClosed, ProtocolError, OSError) as exc:
            lines.append(Line(PROBLEM, where, "server", f"{label}: the connection failed after the login: {exc}: check the server's log"))
        except trio.TooSlowError:
            lines.append(Line(PROBLEM, where, "server", f"{label}: no answer within backend.io_timeout ({_seconds(backend_cfg.io_timeout)}) "
                              "after the login: the server is overloaded or stuck; check it, then run the check again"))  # fmt: skip
        finally:
            backend.channel.send_nowait(encode_packet(b"\x01", 0)[0])  # COM_QUIT
            backend.close()
    if url is not None:
        assert probe is not None
        lines.append(await _status_line(config, url, probe, where))
    elif flavor == "tidb":
        lines.append(Line(WARN, where, "status port", "none configured: a planned TiDB restart is noticed only when TiDB closes the "
                          "connections; set backend.status_port = 10080 (TiDB's [status] status-port) so idle sessions move before"))  # fmt: skip
    return lines


def _login_advice(exc: BackendError, config: Config) -> str:
    code = exc.err.code if exc.err is not None else None
    text = str(exc)
    if code == 1045:
        advice = "the user or its password is wrong on this server: check [[users]] name / password (or backend_user / backend_password) and the server's account"
        if config.backend.tls.mode == "off":
            advice += (
                "; a MariaDB that requires TLS (require_secure_transport) answers a plain login with 1045 too: then set [backend.tls] mode"
            )
        return advice
    if code == 3159 or "does not offer TLS" in text:
        return "set [backend.tls] mode (and ca) to what the server expects"
    if code in (1040, 1203):
        return "the server has too many connections: raise its max_connections or close some"
    if code == 1129:
        return "the server blocks this host after failed connects: FLUSH HOSTS on it"
    if "TLS" in text:
        return "check [backend.tls]: ca must be the CA that signed the server's certificate, server_name a name in it"
    if "refused" in text.lower():
        return "nothing listens there: check backend.addresses and that the server is up"
    if "no greeting" in text or "took longer" in text:
        return f"no answer within backend.connect_timeout ({_seconds(config.backend.connect_timeout)}): check the address, the network and the server"
    return "check backend.addresses, the server and the network"


async def _server_lines(config: Config, backend: Backend, where: str) -> list[Line]:
    lines = [_version_line(backend, where), _tls_line(config, backend, where), _packet_line(config, backend, where)]
    rows = await backend.query("SELECT @@GLOBAL.sql_mode")
    lines.append(_sql_mode_line(rows[0][0].decode("utf-8", "replace") if rows and rows[0][0] is not None else "", where))
    lines.append(_wait_timeout_line(config, backend, where))
    return lines


_FLAVORS = {"mariadb": "MariaDB", "tidb": "TiDB", "mysql": "MySQL"}


def _version_line(backend: Backend, where: str) -> Line:
    version = backend.handshake.server_version
    dialect = Dialect.from_server_version(version)
    if dialect.flavor == "unknown":
        return Line(WARN, where, "server", f"{version!r}: the proxy cannot tell which server this is, so statements with executable "
                    "comments (/*! */) are never judged, replayed or resent; nothing to set, but expect more 1158s after a loss")  # fmt: skip
    name = _FLAVORS[dialect.flavor]
    if dialect.flavor == "tidb":
        m = re.search(r"TiDB-(v[0-9][\w.\-]*)", version)
        about = f"TiDB {m.group(1) if m else '(version not in the greeting)'}"
    else:
        about = f"{name} {dialect.version // 10000}.{dialect.version // 100 % 100}.{dialect.version % 100}"
    identity = backend.instance
    if identity is None:
        return Line(WARN, where, "server", f"{version} ({about}); it does not tell its hostname, port and uptime, so recovery cannot "
                    "tell a restart from another server behind the address (in-doubt COMMITs are then 1158): nothing to set")  # fmt: skip
    up = time.time() - identity.started
    return Line(OK, where, "server", f"{version} ({about}, SQL read as {name}); {identity.hostname}:{identity.port}, up {_duration(up)}")


def _duration(s: float) -> str:
    s = max(0, int(s))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    if s < 172800:
        return f"{s // 3600} h"
    return f"{s // 86400} days"


def _tls_line(config: Config, backend: Backend, where: str) -> Line:
    mode = config.backend.tls.mode
    got = describe(backend.channel)
    offers = bool(backend.handshake.capabilities & Capabilities.CLIENT_SSL)
    if mode == "off":
        more = ("; the server offers TLS: set backend.tls.mode = \"verify-ca\" (with ca) to use it" if offers
                else "; the server does not offer TLS")  # fmt: skip
        return Line(OK, where, "TLS", f'off (backend.tls.mode = "off"): logins and data in plain text{more}')
    if got == "plain":  # only "preferred" logs in without TLS
        return Line(WARN, where, "TLS", "the server does not offer TLS, so backend.tls.mode = \"preferred\" logs in in plain text: "
                    "enable TLS on the server, or set mode = \"off\" to say what happens")  # fmt: skip
    checked = {
        "preferred": 'the server\'s certificate is not verified: set mode = "verify-ca" and ca to check it',
        "required": 'the server\'s certificate is not verified: set mode = "verify-ca" and ca to check it',
        "verify-ca": "the certificate chain is verified",
        "verify-identity": "the certificate chain and the server's name are verified",
    }[mode]
    client = "; with a client certificate" if config.backend.tls.cert else ""
    return Line(OK, where, "TLS", f"{got} (backend.tls.mode = {mode!r}: {checked}{client})")


def _packet_line(config: Config, backend: Backend, where: str) -> Line:
    server = backend.max_allowed_packet
    limit = config.limits.max_allowed_packet
    if server is None:
        return Line(
            WARN, where, "max_allowed_packet", f"the server did not say; the proxy's limit is {_size(limit)} (limits.max_allowed_packet)"
        )
    effective = min(server, limit)
    problems, fixes = [], []
    if server < limit:
        problems.append(f"the server's max_allowed_packet is {_size(server)}, below limits.max_allowed_packet ({_size(limit)}): "
                        f"sessions get {_size(server)}, not the configured {_size(limit)}")  # fmt: skip
        fixes.append(f"raise the server's: SET GLOBAL max_allowed_packet = {max(limit, 64 << 20)} and the same in its config file"
                     + (f" (or set limits.max_allowed_packet = \"{_size(server).replace(' ', '')}\" to say what sessions get)"
                        if server >= _DM_COMFORT else ""))  # fmt: skip
    elif server < _DM_COMFORT:
        fixes.append(f"raise the server's: SET GLOBAL max_allowed_packet = {64 << 20} and the same in its config file")
    if limit < _DM_COMFORT:
        fixes.append('raise limits.max_allowed_packet (default "64MiB")')
    if effective < DM_FULL_LOAD_STATEMENT:
        problems.append(f"DM's full load sends REPLACE statements of about {_size(DM_FULL_LOAD_STATEMENT)}: with a limit of "
                        f"{_size(effective)} they are refused and the task stops")  # fmt: skip
    if problems:
        return Line(PROBLEM, where, "max_allowed_packet", "; ".join(problems) + f": {'; '.join(fixes)}")
    if effective < _DM_COMFORT:
        return Line(WARN, where, "max_allowed_packet", f"sessions get {_size(effective)} (server {_size(server)}, proxy {_size(limit)}): "
                    f"DM's full load cuts a batch once it passes about {_size(DM_FULL_LOAD_STATEMENT)}, so a statement is that plus up "
                    f"to one row, and wide rows do not fit: {'; '.join(fixes)} (1 MiB at least)")  # fmt: skip
    return Line(OK, where, "max_allowed_packet", f"server {_size(server)}, proxy {_size(limit)}: sessions get {_size(effective)}, "
                f"DM's ~{_size(DM_FULL_LOAD_STATEMENT)} full-load statements fit")  # fmt: skip


def _sql_mode_line(sql_mode: str, where: str) -> Line:
    modes = {m.strip().upper() for m in sql_mode.split(",") if m.strip()}
    shown = sql_mode or "(empty)"
    notes = []
    if modes & {"ANSI_QUOTES", "ANSI"}:
        notes.append("ANSI_QUOTES makes \"...\" a name, which the proxy's lexer reads as a string (not supported, "
                     "proxy/sqltext/lexer.py); DM quotes names with backticks, so its statements read the same either way: "
                     "remove ANSI_QUOTES from the global sql_mode unless a client needs it")  # fmt: skip
    syntax = modes & {"ORACLE", "MSSQL", "DB2", "POSTGRESQL", "MAXDB"}
    if syntax:
        notes.append(f"{', '.join(sorted(syntax))} changes the SQL syntax the proxy lexes: remove it from the global sql_mode")
    if notes:
        return Line(WARN, where, "sql_mode", f"global {shown}: " + "; ".join(notes))
    follows = "; NO_BACKSLASH_ESCAPES is followed per session (the server's status flag)" if "NO_BACKSLASH_ESCAPES" in modes else ""
    return Line(OK, where, "sql_mode", f"global {shown} (DM sets its own per session, from the source's){follows}")


def _wait_timeout_line(config: Config, backend: Backend, where: str) -> Line:
    wait = backend.wait_timeout
    if wait is None:
        return Line(WARN, where, "wait_timeout", "the server did not say: nothing to set")
    if wait <= 0:
        return Line(OK, where, "wait_timeout", "0: the server never closes an idle session")
    idle = config.listen.idle_timeout
    cost = ("the proxy then reconnects and restores the session behind the client, a login each time, and a session it cannot "
            "restore (temporary tables, GET_LOCK) gets 1158 at its next command")  # fmt: skip
    fix = f"SET GLOBAL wait_timeout = {max(28800, int(idle) + 60)} (and in the server's config file)"
    if idle and wait < idle:
        return Line(PROBLEM, where, "wait_timeout", f"{_seconds(wait)}: the server closes idle sessions before listen.idle_timeout "
                    f"({_seconds(idle)}) would; {cost}: {fix}, or lower listen.idle_timeout below it")  # fmt: skip
    if wait < _WAIT_TIMEOUT_PROBLEM:
        return Line(PROBLEM, where, "wait_timeout", f"{_seconds(wait)}: the server closes DM's connections between nearly every "
                    f"batch and checkpoint (DM flushes every 30 s); {cost}: {fix}")  # fmt: skip
    if wait < _WAIT_TIMEOUT_WARN:
        return Line(WARN, where, "wait_timeout", f"{_seconds(wait)}: DM's idle connections are closed by the server every "
                    f"{_seconds(wait)} and reconnected by the proxy ({cost}): {fix} avoids it")  # fmt: skip
    return Line(OK, where, "wait_timeout", f"{_seconds(wait)}: idle sessions stay; "
                + ("the proxy never closes them itself (listen.idle_timeout = 0)" if not idle else f"the proxy closes them after {_seconds(idle)}"))  # fmt: skip


# ------------------------------------------------------------------------------ marker grants


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


async def _marker_line(config: Config, backend: Backend, where: str, label: str, login: Login, flavor: str | None) -> Line:
    table = config.recovery.marker_table
    if "." not in table:
        return Line(WARN, where, "commit markers", f"{label}: recovery.marker_table = {table!r} names no database, so the table "
                    "is made in the database of the first session that logs in: name it as database.table")  # fmt: skip
    schema, name = table.rsplit(".", 1)
    rows = await backend.query("SHOW GRANTS")
    grants = [r[0].decode("utf-8", "replace") for r in rows if r and r[0] is not None]
    account = await backend.query("SELECT CURRENT_USER()")
    who = account[0][0].decode("utf-8", "replace") if account and account[0][0] is not None else login.user
    missing = missing_marker_privileges(grants, schema, name, fold_case=flavor == "tidb")
    if not missing:
        return Line(OK, where, "commit markers", f"{label} ({who}) may CREATE in {schema} and SELECT, INSERT, UPDATE, DELETE {table}")
    user, _, host = who.rpartition("@")
    grantee = f"'{user}'@'{host}'" if user else f"'{who}'"
    on_db = [p for p in missing if p == "CREATE"]
    on_table = [p for p in missing if p != "CREATE"]
    fixes = []
    if on_db:
        fixes.append(f"GRANT CREATE ON {_quote(schema)}.* TO {grantee}")
    if on_table:
        fixes.append(f"GRANT {', '.join(on_table)} ON {_quote(schema)}.{_quote(name)} TO {grantee}")
    has_roles = grants_roles(grants)
    role_note = " (the user has roles: a role counts only when it is active at login, a default role)" if has_roles else ""
    lacks = ([f"CREATE on {schema}.*"] if on_db else []) + ([f"{', '.join(on_table)} on {table}"] if on_table else [])
    bites = []
    if set(missing) & {"INSERT", "UPDATE"}:
        bites.append(
            "every COMMIT of a transaction that wrote fails with the marker upsert's error (the row is written just before COMMIT)"
        )
    if set(missing) & {"CREATE", "DELETE"}:
        bites.append("when its session is the first to log in after a start, preparing the table fails and commit markers are off "
                     "for every session (an in-doubt COMMIT then becomes 1158)")  # fmt: skip
    if "SELECT" in missing:
        bites.append("an in-doubt COMMIT of its sessions cannot be looked up (1158)")
    return Line(PROBLEM, where, "commit markers", f"{label} ({who}) lacks {' and '.join(lacks)}: {'; '.join(bites)}{role_note}: "
                f"run {'; '.join(fixes)}")  # fmt: skip


# ------------------------------------------------------------------------------ status port


async def _status_line(config: Config, url: str, probe: StatusProbe, where: str) -> Line:
    timeout = config.backend.connect_timeout
    try:
        code = await probe.status(url, timeout)
    except trio.TooSlowError:
        return Line(PROBLEM, where, "status port", f"{url} did not answer within {_seconds(timeout)}: check backend.status_port / "
                    "status_urls (TiDB's [status] status-port, 10080) and that nothing blocks it")  # fmt: skip
    except (OSError, ValueError) as exc:
        return Line(PROBLEM, where, "status port", f"{exc}: check backend.status_port / status_urls (TiDB's [status] status-port, "
                    "10080) and, for https, [backend.tls]")  # fmt: skip
    if code == 200:
        return Line(OK, where, "status port", f"{url} answers 200: up")
    if code == 500:
        return Line(PROBLEM, where, "status port", f"{url} answers 500: the server is draining (TiDB answers 500 from the start of a "
                    "graceful shutdown), so new sessions avoid it: wait until it is back, or check that the status port is this server's")  # fmt: skip
    return Line(PROBLEM, where, "status port", f"{url} answers {code}, not 200: the proxy treats it as draining; check "
                "backend.status_path and that the port is TiDB's status port")  # fmt: skip


# ------------------------------------------------------------------------------ the command


def report(lines: list[Line], out: TextIO | None = None) -> int:
    """Print the lines and a verdict; 1 when any line is a PROBLEM, else 0."""
    out = out or sys.stdout
    for line in lines:
        print(line, file=out)
    problems = sum(line.level == PROBLEM for line in lines)
    warnings = sum(line.level == WARN for line in lines)
    if problems:
        print(f"result: {problems} problem(s), {warnings} warning(s): fix the PROBLEM lines, then run the check again", file=out)
        return 1
    print(f"result: ok, {warnings} warning(s)" + (": read the warn lines" if warnings else ""), file=out)
    return 0


async def run(config: Config, path: str, out: TextIO | None = None) -> int:
    """``replay-proxy check``: the lines of ``preflight`` for the target of ``path``; the exit status."""
    out = out or sys.stdout
    n, users = len(config.backend.addresses), len(config.users)
    where = f"{n} backend address(es)" if config.backend.discovery == "static" else f"backend discovery {config.backend.discovery}"
    print(f"replay-proxy check: target {config.name} ({path}): {where}, {users} user(s)", file=out)
    return report(await preflight(config), out)
