"""Which server reads the text: executable comments run or not by the server's flavor and
version, so the proxy must judge a statement the way the connected server will.

Measured on MariaDB 10.11.19 (tests/unit/test_lexer.py has the cases):

- ``/*! ... */`` runs. ``/*!NNNNN`` (5 digits) and ``/*!NNNNNN`` (6 digits) run when the
  number is at most the server's version id and not a MySQL 5.7+ version (50700-99999);
  with fewer than 5 digits there is no version and the digits are code.
- ``/*M! ... */`` and ``/*M!NNNNN[N]`` are MariaDB's: they run up to the server's version.
- ``/*T![feature] ... */`` is a plain comment on MariaDB.

TiDB 8.5 (pkg/parser/lexer.go ``startWithSlash``, pkg/parser/tidb/features.go) reads ``/*!``
content as code whatever the version number, taking exactly 5 digits as the version (a sixth is
code, fewer are code); ``/*M!`` is a plain comment; ``/*T![f1,f2] ... */`` runs when TiDB knows
every feature named (``/*T!`` without a well-formed list runs, the list's text included). The
feature list is TiDB 8.5's: an older TiDB that lacks one reads a comment where the proxy reads
code, so the proxy sees more code than runs, never less code for the features it knows.
MariaDB and MySQL read ``/*T!`` as a plain comment.
"""

from __future__ import annotations

import re

import attrs

__all__ = ["Dialect", "MARIADB", "TIDB", "UNKNOWN", "TIDB_FEATURES"]

TIDB_FEATURES = frozenset({"auto_rand", "auto_id_cache", "auto_rand_base", "clustered_index", "force_inc",
                           "placement", "ttl", "global_index"})  # fmt: skip

_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")


@attrs.frozen
class Dialect:
    flavor: str  # "mariadb", "tidb", "mysql" or "unknown"
    version: int = 0  # version id: 10.11.19 -> 101119, 8.0.11 -> 80011

    @classmethod
    def from_server_version(cls, text: str) -> Dialect:
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
        if self.flavor == "tidb":
            return not mariadb_only
        if self.flavor == "mysql" and not mariadb_only and len(digits) != 6:
            return not digits or int(digits) <= self.version
        return None

    def comment_opener(self, opener: str) -> str:
        """The part of a matched ``/*!NNNNN[N]`` opener this server reads as the opener: TiDB
        takes 5 version digits, so ``/*!123456`` is ``/*!12345`` and then the code ``6``."""
        if self.flavor == "tidb" and not opener.startswith("/*M!") and len(opener) == 9:
            return opener[:8]
        return opener

    def runs_tidb_comment(self, features: list[str] | None) -> bool | None:
        """Does ``/*T![features] ... */`` run (``features`` None: no well-formed list)?"""
        if self.flavor == "tidb":
            return features is None or all(f in TIDB_FEATURES for f in features)
        if self.flavor in ("mariadb", "mysql"):
            return False
        return None


MARIADB = Dialect("mariadb", 101119)
TIDB = Dialect("tidb", 80011)  # TiDB's greeting says 8.0.11-TiDB-v8.5.x  # the lab's server; tests default to it
UNKNOWN = Dialect("unknown")
