"""Instructions a middle process executes, counted by callgrind (``valgrind --tool=callgrind``).

Seconds of CPU move by ±15 % between rounds on a shared 2-core machine; the instructions a
process executes for the same input repeat. ``Callgrind`` runs one intermediary under callgrind
with bench/callgrind_marks.c preloaded, compiled here with gcc: ``zero()`` and ``dump()`` signal
the process to reset its counters and to write them out, so a count covers exactly one run of a
workload (not the interpreter's start-up, not the idle time between runs). A dump holds the
instructions of every function (``annotate`` writes callgrind_annotate's profile of it).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Protocol

from tests.lab.procs import alive

MARKS_SOURCE = Path(__file__).with_name("callgrind_marks.c")
ZERO = signal.SIGRTMIN + 5
DUMP = signal.SIGRTMIN + 6
ANSWER_TIMEOUT = 300.0  # a process under callgrind runs ~50x slower; a signal waits for its loop


class Wrap(Protocol):
    """How a bench child is started inside something else (``HAProxy.start(wrap=...)``)."""

    def command(self, cmd: list[str]) -> list[str]: ...

    def environment(self, env: dict[str, str]) -> dict[str, str]: ...


def callgrind_unavailable_reason() -> str | None:
    for tool, package in (("valgrind", "valgrind"), ("callgrind_annotate", "valgrind"), ("gcc", "gcc")):
        if shutil.which(tool) is None:
            return f"{tool} not found (Debian: apt-get install {package})"
    if not Path("/usr/include/valgrind/callgrind.h").exists():
        return "valgrind/callgrind.h not found (Debian's valgrind package ships it)"
    return None


def build_marks(workdir: Path) -> Path:
    """The preload library, compiled into ``workdir``."""
    lib = workdir / "callgrind_marks.so"
    if not lib.exists():
        workdir.mkdir(parents=True, exist_ok=True)
        res = subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(MARKS_SOURCE)], capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"gcc could not build {MARKS_SOURCE.name}:\n{res.stderr[-2000:]}")
    return lib


class CallgrindError(RuntimeError):
    """The counted process did not answer a mark, or its dump could not be read."""


class Callgrind:
    """One process under callgrind: pass it as ``wrap`` to the starter, then ``attach`` its pid."""

    def __init__(self, workdir: Path, name: str) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.lib = build_marks(self.workdir)
        self.out = self.workdir / f"callgrind.{name}.out"
        self.marks = self.workdir / f"callgrind.{name}.marks"
        self.marks.write_bytes(b"")
        self.pid: int | None = None
        self.dumps = 0

    def command(self, cmd: list[str]) -> list[str]:
        # An executable, not a shim script (pyenv's `python3` is bash: callgrind would count bash).
        # sys.executable is the venv's interpreter (a symlink it must be started by, to see the venv).
        program = shutil.which(cmd[0]) or cmd[0]
        return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={self.out}", "--dump-instr=no", "--collect-jumps=no",
                program, *cmd[1:]]  # fmt: skip

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        preload = " ".join(p for p in (env.get("LD_PRELOAD"), str(self.lib)) if p)
        return {**env, "LD_PRELOAD": preload, "RP_CALLGRIND_MARKS": str(self.marks), "PYTHONHASHSEED": "0"}

    def attach(self, pid: int) -> Callgrind:
        self.pid = pid  # valgrind runs the program in its own process: the child's pid is the program's
        return self

    def _signal(self, sig: int, answer: bytes) -> None:
        """Signal the process (it must be past its start: until the library is loaded, the
        signal's default action ends it) and wait for its answer in the marks file."""
        assert self.pid is not None, "attach() the started process first"
        name = f"SIGRTMIN+{sig - signal.SIGRTMIN}"
        before = self.marks.read_bytes().count(answer)
        os.kill(self.pid, sig)
        deadline = time.monotonic() + ANSWER_TIMEOUT
        while self.marks.read_bytes().count(answer) == before:
            if not alive(self.pid):
                raise CallgrindError(f"pid {self.pid} ended instead of answering {name}")
            if time.monotonic() > deadline:
                raise CallgrindError(f"pid {self.pid} did not answer {name} within {ANSWER_TIMEOUT:.0f} s")
            time.sleep(0.05)

    def zero(self) -> None:
        self._signal(ZERO, b"z")

    def dump(self) -> Path:
        """Write the counters since the last zero; the dump's path."""
        self._signal(DUMP, b"d")
        self.dumps += 1
        path = Path(f"{self.out}.{self.dumps}")
        if not path.exists():
            raise CallgrindError(f"callgrind wrote no {path.name} (dumps in {self.workdir}: {sorted(os.listdir(self.workdir))})")
        return path


def instructions(dump: Path) -> int:
    """The instructions (Ir) a dump counts: its ``totals:`` line."""
    m = re.search(r"^totals:\s+(\d+)", dump.read_text(errors="replace"), re.MULTILINE)
    if m is None:
        raise CallgrindError(f"no totals line in {dump}")
    return int(m.group(1))


def annotate(dump: Path, dest: Path) -> Path:
    """callgrind_annotate's profile of a dump (instructions by function, the largest first).
    Its percentages are of the dump's ``summary:``, which counts from the process's start; they
    are made of the dump's own totals (the functions' figures are the dump's either way)."""
    text = dump.read_text(errors="replace")
    own = dump.with_name(dump.name + ".annotated")
    own.write_text(re.sub(r"^summary:\s+\d+$", f"summary: {instructions(dump)}", text, count=1, flags=re.MULTILINE))
    res = subprocess.run(["callgrind_annotate", "--threshold=99", str(own)], capture_output=True, text=True, timeout=300)
    dest.write_text(res.stdout if res.returncode == 0 else f"callgrind_annotate failed ({res.returncode}):\n{res.stderr}")
    return dest
