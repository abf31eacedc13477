"""The build: the package as pyproject.toml says, and its sans-IO core compiled with mypyc.

The modules of ``proxy.corebuild.COMPILED`` (protocol, SQL text, session model, command cycle:
no I/O, type-checked) are compiled to C extensions when mypyc (the build requirement in
pyproject.toml) and a C compiler are at hand; an extension is imported instead of the module's
source, which stays the interpreted fallback. A failed compile is no failed install: the build
says why and the package runs interpreted. ``REPLAY_PROXY_COMPILE=0`` skips the compile. The
build leaves a manifest of the sources it compiled (``proxy/.compiled``): at import,
``proxy.corebuild`` uses the extensions only while every source still matches it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "proxy"))
from corebuild import COMPILED, MANIFEST, source_of  # noqa: E402  (proxy/corebuild.py, without importing proxy)

sys.path.pop(0)


def _compiled_extensions() -> list:
    if os.environ.get("REPLAY_PROXY_COMPILE", "1") == "0":
        print("replay-proxy: REPLAY_PROXY_COMPILE=0: the sans-IO core stays interpreted", file=sys.stderr)
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as exc:
        print(f"replay-proxy: mypyc is not available ({exc}): the sans-IO core stays interpreted", file=sys.stderr)
        return []
    os.chdir(HERE)  # mypycify takes the sources' paths relative to the project
    try:
        return mypycify([str(source_of(name)) for name in COMPILED], opt_level="3", multi_file=True)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 -- mypy's errors end in SystemExit; printed above
        print(f"replay-proxy: mypyc cannot compile the sans-IO core ({exc}): it stays interpreted", file=sys.stderr)
        return []


class _OptionalBuildExt(build_ext):
    """All or nothing: if any extension fails to build, none is installed (the core runs
    interpreted) and the install goes on."""

    def run(self) -> None:
        manifest = (HERE if self.inplace else Path(self.build_lib)) / MANIFEST
        manifest.unlink(missing_ok=True)
        if self.inplace:  # an earlier build's extensions go: a module compiled then may not be now
            for stale in [*HERE.glob("*__mypyc*.so"), *(HERE / "proxy").rglob("*.so")]:
                stale.unlink()
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 -- a compiler error of any kind: interpreted instead
            print(f"replay-proxy: compiling the sans-IO core failed ({exc}): it runs interpreted", file=sys.stderr)
            for output in self.get_outputs():
                Path(output).unlink(missing_ok=True)
            return
        digests = {name: hashlib.sha256((HERE / source_of(name)).read_bytes()).hexdigest() for name in COMPILED}
        manifest.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")


setup(ext_modules=_compiled_extensions(), cmdclass={"build_ext": _OptionalBuildExt})
