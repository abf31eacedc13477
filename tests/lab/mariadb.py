"""Throwaway MariaDB servers for tests.

``MariaDB(basedir)`` owns one ``mariadbd`` process and its data directory:

    db = MariaDB(tmp_path / "db", max_allowed_packet="1M")
    db.start()
    db.create_user("app", "apppw")
    db.restart(signal.SIGKILL)        # crash; InnoDB recovers on start
    db.stop()

The server listens on 127.0.0.1 only, on a port that stays the same across restarts, with
durable commits (``innodb_flush_log_at_trx_commit=1``), so chaos tests can SIGKILL it and check
committed rows. Its lifecycle (and the reaping of servers a killed run left behind) is the
lab's one, tests/lab/server.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tests.lab.server import HOST, SQLServer, free_port, select_1  # noqa: F401 (bench imports free_port from here)

_SEARCH_DIRS = ("/usr/sbin", "/usr/local/sbin", "/usr/bin", "/usr/local/bin")


class MariaDBError(RuntimeError):
    """The lab could not start, stop or talk to a MariaDB server."""


# Environment overrides, e.g. LAB_MARIADBD=/opt/mariadb/bin/mariadbd.
_OVERRIDES = {"mariadbd": "LAB_MARIADBD", "mariadb-install-db": "LAB_MARIADB_INSTALL_DB"}


def find_program(name: str) -> str | None:
    """Locate a program: its LAB_* override, PATH, then sbin dirs (mariadbd
    lives in /usr/sbin, which is not on PATH for every user)."""
    env = _OVERRIDES.get(name)
    if env and os.environ.get(env):
        path = os.environ[env]
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    found = shutil.which(name)
    if found:
        return found
    for d in _SEARCH_DIRS:
        candidate = Path(d) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def mariadb_unavailable_reason() -> str | None:
    """None if the MariaDB server binaries are installed, else why not."""
    missing = []
    for program in ("mariadbd", "mariadb-install-db"):
        if find_program(program) is None:
            env = _OVERRIDES[program]
            where = f"${env}={os.environ[env]}" if os.environ.get(env) else "PATH or /usr/sbin"
            missing.append(f"{program} not found in {where}")
    if missing:
        return "; ".join(missing) + " (Debian: apt-get install mariadb-server)"
    return None


class MariaDB(SQLServer):
    """One throwaway mariadbd, listening on 127.0.0.1:port and a unix socket."""

    what = "mariadbd"
    flavor = "mariadb"
    error = MariaDBError

    def __init__(
        self,
        basedir: Path,
        port: int | None = None,
        max_allowed_packet: str = "64M",
        extra_args: Sequence[str] = (),
        tls: tuple[str, str, str] | None = None,
        require_secure_transport: bool = False,
    ) -> None:
        """``tls=(ca, cert, key)``: PEM files for --ssl-ca/--ssl-cert/--ssl-key (the lab's own
        TCP connections then use TLS, verifying ``ca``); ``require_secure_transport``: refuse
        plain TCP logins (the unix socket, which admin() uses, stays allowed)."""
        if require_secure_transport and tls is None:
            raise ValueError("require_secure_transport needs tls=(ca, cert, key)")
        super().__init__(basedir, port)
        self.tls = tuple(str(f) for f in tls) if tls is not None else None
        self.require_secure_transport = require_secure_transport
        self.max_allowed_packet = max_allowed_packet
        self.extra_args = list(extra_args)
        self.datadir = self.basedir / "data"
        self.pid_file = self.basedir / "mariadbd.pid"
        self.log_path = self.basedir / "error.log"
        self.stdout_path = self.basedir / "mariadbd.out"
        sock = self.basedir / "mariadbd.sock"
        if len(str(sock).encode()) > 100:
            # AF_UNIX paths are limited to 107 bytes.
            sock = Path(tempfile.mkdtemp(prefix="mdb-")) / "mariadbd.sock"
        self.socket_path = sock

    def command(self) -> list[str]:
        """The mariadbd command line."""
        cmd = [
            find_program("mariadbd") or "mariadbd",
            "--no-defaults",  # must come first
            f"--datadir={self.datadir}",
            f"--port={self.port}",
            f"--socket={self.socket_path}",
            f"--pid-file={self.pid_file}",
            f"--log-error={self.log_path}",
            f"--bind-address={HOST}",
            "--skip-name-resolve",
            "--innodb-buffer-pool-size=128M",
            "--max-connections=3000",
            f"--max-allowed-packet={self.max_allowed_packet}",
            # Durable commits: chaos tests count rows after SIGKILL.
            "--innodb-flush-log-at-trx-commit=1",
        ]
        if os.geteuid() == 0:
            cmd.insert(2, "--user=root")
        if self.tls is not None:
            ca, cert, key = self.tls
            cmd += [f"--ssl-ca={ca}", f"--ssl-cert={cert}", f"--ssl-key={key}"]
            if self.require_secure_transport:
                cmd.append("--require-secure-transport=ON")
        return cmd + self.extra_args

    def orphan_marker(self) -> str:
        return f"--datadir={self.datadir}"

    def prepare(self) -> None:
        """The data folder, initialised once (mariadb-install-db)."""
        if (self.datadir / "mysql").is_dir():
            return
        install = find_program("mariadb-install-db")
        if install is None:
            raise MariaDBError(mariadb_unavailable_reason() or "mariadb-install-db not found")
        # Initialise into a scratch dir and rename, so an interrupted run
        # never leaves a half-initialised datadir that looks complete.
        tmp = self.basedir / "data.init"
        shutil.rmtree(tmp, ignore_errors=True)
        cmd = [
            install,
            "--no-defaults",
            f"--datadir={tmp}",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
        ]
        if os.geteuid() == 0:
            cmd.append("--user=root")
        try:
            res = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=120,
                cwd=self.basedir,
            )
        except subprocess.TimeoutExpired as e:
            raise MariaDBError(f"mariadb-install-db did not finish in 120 s: {' '.join(cmd)}") from e
        if res.returncode != 0:
            out = res.stdout.decode(errors="replace")[-4000:]
            raise MariaDBError(f"mariadb-install-db failed with exit status {res.returncode}: {' '.join(cmd)}\n{out}")
        shutil.rmtree(self.datadir, ignore_errors=True)
        tmp.rename(self.datadir)

    def probe(self) -> None:
        # TCP is what clients and the proxy use; the socket is what admin() uses.
        super().probe()
        select_1(unix_socket=str(self.socket_path))

    def create_user(self, name: str, password: str, grants: str = "ALL PRIVILEGES ON *.*") -> None:
        """Create (or replace) name@'%' and name@'localhost' with
        mysql_native_password (what DM's driver and the proxy speak)."""
        conn = self.admin()
        try:
            with conn.cursor() as cur:
                for host in ("%", "localhost"):
                    account = f"{conn.escape(name)}@{conn.escape(host)}"
                    cur.execute(
                        f"CREATE OR REPLACE USER {account} IDENTIFIED VIA mysql_native_password USING PASSWORD({conn.escape(password)})"
                    )
                    cur.execute(f"GRANT {grants} TO {account}")
        finally:
            conn.close()
