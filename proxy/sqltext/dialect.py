"""Which server reads the text: executable comments run or not by the server's flavor and
version, so the proxy must judge a statement the way the connected server will.

Measured on MariaDB 10.11.19 (tests/unit/test_lexer.py has the cases):

- ``/*! ... */`` runs. ``/*!NNNNN`` (5 digits) and ``/*!NNNNNN`` (6 digits) run when the
  number is at most the server's version id and not a MySQL 5.7+ version (50700-99999);
  with fewer than 5 digits there is no version and the digits are code.
- ``/*M! ... */`` and ``/*M!NNNNN[N]`` are MariaDB's: they run up to the server's version.
- ``/*T![feature] ... */`` is a plain comment on MariaDB.

TiDB reads ``/*!`` content as code whatever the version number; ``/*M!`` and ``/*T!`` depend
on TiDB's own rules, which the proxy does not guess: such text is "unknown" on TiDB.
"""

from __future__ import annotations

import re

import attrs

__all__ = ["Dialect", "MARIADB", "UNKNOWN"]

_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")


@attrs.frozen
class Dialect:
    flavor: str  # "mariadb", "tidb", "mysql" or "unknown"
    version: int = 0  # version id: 10.11.19 -> 101119, 8.0.11 -> 80011

    @classmethod
    def from_server_version(cls, text: str) -> "Dialect":
        """From the greeting's server version: '5.5.5-10.11.19-MariaDB-0+deb12u1',
        '10.11.19-MariaDB', '8.0.11-TiDB-v8.5.1', '8.0.36'."""
        if "TiDB" in text:
            flavor = "tidb"
        elif "MariaDB" in text:
            flavor = "mariadb"
            text = text.removeprefix("5.5.5-")  # the replication-compatibility prefix
        else:
            flavor = "mysql"
        m = _VERSION.search(text)
        if m is None:
            return UNKNOWN
        major, minor, patch = (int(g) for g in m.groups())
        return cls(flavor, major * 10000 + minor * 100 + patch)

    def runs(self, opener: str) -> bool | None:
        """Does the executable comment opened by ``opener`` ("/*!", "/*!50001", "/*M!100100")
        run on this server? None: the proxy cannot tell."""
        mariadb_only = opener.startswith("/*M!")
        digits = opener[4:] if mariadb_only else opener[3:]
        if self.flavor == "mariadb":
            if not digits:
                return True
            version = int(digits)
            if version > self.version:
                return False
            return mariadb_only or version < 50700 or version > 99999
        if self.flavor == "tidb" and not mariadb_only:
            return True
        if self.flavor == "mysql" and not mariadb_only and len(digits) != 6:
            return not digits or int(digits) <= self.version
        return None


MARIADB = Dialect("mariadb", 101119)  # the lab's server; tests default to it
UNKNOWN = Dialect("unknown")
